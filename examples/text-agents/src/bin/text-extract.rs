//! Serves the extraction agent (`text.extract`) and registers it.

use switchyard_example_agents::{Extract, main_with, spec};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let about = "Extracts e-mail addresses, URLs, dates, numbers and the sentences \
                 mentioning input.keywords from input.text. No LLM.";
    main_with(
        Extract,
        spec("text_extract", "Text extraction", about, "text.extract", 20),
    )
    .await
}
