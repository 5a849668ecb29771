//! Serves the text-statistics agent (`text.stats`) and registers it.

use switchyard_example_agents::{TextStats, main_with, spec};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let about = "Counts lines, words and characters of input.text and lists its top terms. No LLM.";
    main_with(
        TextStats,
        spec("text_stats", "Text statistics", about, "text.stats", 10),
    )
    .await
}
