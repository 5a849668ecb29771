//! The Model Context Protocol in Switchyard, on the official Rust SDK
//! (`rmcp` 3.11): client sessions with MCP tool servers — a stdio server
//! started under the command sandbox, or a streamable HTTP endpoint, in
//! the stateless revision 2026-07-28 where it speaks it
//! ([`stateless_client`]) — that list tools, run calls with progress and
//! cancellation, and report tool list changes ([`session`]); how their tools are named here ([`names`]);
//! and Switchyard as an MCP server ([`server`]), served on stdio by
//! `switchyard mcp` and over streamable HTTP by the gateway — in the
//! stateful revisions through `rmcp` and in the stateless 2026-07-28
//! revision through [`stateless`], on one endpoint. The registry
//! holds the client sessions; the executor and agent hosts reach them
//! through `RegistryService.CallMcpTool`.

pub mod headers;
pub mod names;
mod resources;
pub mod server;
pub mod session;
pub mod stateless;
mod stateless_client;

pub use headers::header_params;
pub use session::{McpError, Progress, Session, ToolDef, Transport, result_value};
