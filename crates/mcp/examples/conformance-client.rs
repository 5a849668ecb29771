//! Switchyard's MCP client ([`switchyard_mcp::Session`], what the registry
//! uses to reach MCP tool servers) as the client under test of the official
//! MCP conformance suite's client scenarios:
//!
//!     conformance client --command "target/debug/examples/conformance-client"
//!
//! The suite appends the URL of its test server, names the scenario in
//! MCP_CONFORMANCE_SCENARIO and may say which calls to make in
//! MCP_CONFORMANCE_CONTEXT (`toolCalls`). The client connects (streamable
//! HTTP, no credentials: 2026-07-28 where the server speaks it, else the
//! session handshake), lists the tools, keeps those the registry would
//! register (a tool with a bad `x-mcp-header` is left out, as the registry
//! skips it), and calls them as an agent would: the context's calls when it
//! has any, else each kept tool once — `add_numbers` with 5 and 3,
//! `json_schema_echo` with the schema it was given for
//! `json_schema_2020_12_tool` (what the client kept of it), any other with
//! a value for each required parameter. Nothing a scenario would need
//! beyond what the registry does: no OAuth, no elicitation.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use switchyard_mcp::{Session, ToolDef, Transport};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let url = std::env::args().next_back().ok_or("no server URL")?;
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let context: Value = std::env::var("MCP_CONFORMANCE_CONTEXT")
        .ok()
        .and_then(|c| serde_json::from_str(&c).ok())
        .unwrap_or_default();
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
    eprintln!("{scenario}: {}", session.protocol_version());
    let listed = session
        .list_tools(timeout)
        .await
        .map_err(|e| e.to_string())?;
    let kept: Vec<&ToolDef> = listed
        .iter()
        .filter(|t| match switchyard_mcp::header_params(&t.input_schema) {
            Ok(_) => true,
            Err(e) => {
                eprintln!("left out {}: {e}", t.name);
                false
            }
        })
        .collect();
    let calls: Vec<(String, Value)> = match context["toolCalls"].as_array() {
        Some(asked) => asked
            .iter()
            .map(|c| {
                let name = c["name"].as_str().unwrap_or_default().to_owned();
                (name, c["arguments"].clone())
            })
            .filter(|(name, _)| kept.iter().any(|t| &t.name == name))
            .collect(),
        None => kept
            .iter()
            .map(|t| (t.name.clone(), arguments(t, &listed)))
            .collect(),
    };
    for (name, args) in calls {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let args = args.as_object().cloned().unwrap_or_default();
        match session.call(&name, args, tx).await {
            Ok(r) => eprintln!("{name}: {:?}", switchyard_mcp::result_value(&r)),
            // A refused call is the scenario's to judge.
            Err(e) => eprintln!("{name}: {e}"),
        }
    }
    session.close().await;
    Ok(())
}

/// What an agent would pass `tool`.
fn arguments(tool: &ToolDef, listed: &[ToolDef]) -> Value {
    match tool.name.as_str() {
        "add_numbers" => json!({"a": 5, "b": 3}),
        "json_schema_echo" => {
            let schema = listed
                .iter()
                .find(|t| t.name == "json_schema_2020_12_tool")
                .map(|t| t.input_schema.clone())
                .unwrap_or_default();
            json!({ "schema": schema })
        }
        _ => {
            let mut args = Map::new();
            let props = &tool.input_schema["properties"];
            for r in tool.input_schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                let v = match props[r]["type"].as_str() {
                    Some("integer" | "number") => json!(1),
                    Some("boolean") => json!(true),
                    Some("object") => json!({}),
                    Some("array") => json!([]),
                    _ => json!("x"),
                };
                args.insert(r.to_owned(), v);
            }
            Value::Object(args)
        }
    }
}
