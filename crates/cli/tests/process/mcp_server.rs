//! Switchyard as an MCP server, driven by the Python `mcp` SDK's client
//! (`tests/mcp/client_test.py`) against a real `switchyard dev`: `switchyard
//! mcp` on stdio and the gateway's `/mcp` over streamable HTTP — in both
//! the 2025-11-25 (session) and 2026-07-28 (stateless) revisions, the SDK
//! negotiating — as alice, bob and a viewer. Neither lets an MCP host
//! approve a run.
#![allow(clippy::unwrap_used)]

use crate::support::*;

#[test]
fn the_python_mcp_client_drives_switchyard_over_stdio_and_the_gateway() {
    let python = tool("SWITCHYARD_PYTHON");
    let (dev, data) = Proc::dev(&[]);
    let http = format!("http://{}/mcp", dev.http.as_deref().unwrap());
    let out = std::process::Command::new(python)
        .arg(repo_root().join("tests/mcp/client_test.py"))
        .arg(env!("CARGO_BIN_EXE_switchyard"))
        .arg(dev.url())
        .arg(&http)
        .arg(data.path().join("credentials.json"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("39 passed, 0 failed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(dev.terminate(), Some(0));
}
