//! Switchyard's MCP client ([`switchyard_mcp::Session`], what the registry
//! uses to reach MCP tool servers) as the client under test of the official
//! MCP conformance suite's client scenarios:
//!
//!     conformance client --command "target/debug/examples/conformance-client"
//!
//! The suite appends the URL of its test server and names the scenario in
//! MCP_CONFORMANCE_SCENARIO. The client connects (streamable HTTP, no
//! credentials), lists the tools, and for `tools_call` calls `add_numbers`;
//! it does what the registry does and nothing a scenario would need beyond
//! that (no OAuth, no elicitation).

use std::sync::Arc;
use std::time::Duration;

use switchyard_mcp::{Session, Transport};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let url = std::env::args().next_back().ok_or("no server URL")?;
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    switchyard_kit::tls::install_crypto();
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| e.to_string())?;
    let transport = Transport::Http {
        url,
        bearer: None,
        client,
    };
    let timeout = Duration::from_secs(10);
    let session = Session::connect("conformance", transport, Arc::default(), timeout)
        .await
        .map_err(|e| e.to_string())?;
    let tools = session
        .list_tools(timeout)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!("{scenario}: {} tools", tools.len());
    if tools.iter().any(|t| t.name == "add_numbers") {
        let args = serde_json::json!({"a": 5, "b": 3});
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let r = session
            .call(
                "add_numbers",
                args.as_object().cloned().unwrap_or_default(),
                tx,
            )
            .await
            .map_err(|e| e.to_string())?;
        eprintln!("add_numbers: {:?}", switchyard_mcp::result_value(&r));
    }
    session.close().await;
    Ok(())
}
