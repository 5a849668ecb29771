//! Tool providers: implement [`ToolProvider`], mount [`ToolServer`], and
//! register each tool with the registry (RegisterTool, with this server's
//! endpoint); callers reach it with [`call`].

use std::sync::Arc;

use serde_json::Value;
use switchyard_api::ToolClient;
use switchyard_kit::json::{json_to_struct, json_to_value, struct_to_json, value_to_json};
use switchyard_proto::agent::v1::tool_service_server::{ToolService, ToolServiceServer};
use switchyard_proto::agent::v1::{CallToolRequest, CallToolResponse};
use switchyard_proto::common::v1::CorrelationContext;
use tonic::{Request, Response, Status};

/// What a tool provider does.
#[tonic::async_trait]
pub trait ToolProvider: Send + Sync + 'static {
    /// Runs tool `name` with arguments already valid against its schema;
    /// an `Err` goes back to the model as the tool's error.
    async fn call(&self, name: &str, args: Value) -> Result<Value, String>;
}

/// Adapts a [`ToolProvider`] to the generated `ToolService`.
pub struct ToolServer<P>(Arc<P>);

impl<P> std::fmt::Debug for ToolServer<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToolServer")
    }
}

impl<P: ToolProvider> ToolServer<P> {
    /// Serves `provider`.
    pub fn new(provider: P) -> Self {
        ToolServer(Arc::new(provider))
    }

    /// The tonic service to mount on a server.
    pub fn into_service(self, max_message_bytes: usize) -> ToolServiceServer<Self> {
        ToolServiceServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

#[tonic::async_trait]
impl<P: ToolProvider> ToolService for ToolServer<P> {
    async fn call_tool(
        &self,
        req: Request<CallToolRequest>,
    ) -> Result<Response<CallToolResponse>, Status> {
        let req = req.into_inner();
        let args = req
            .arguments
            .as_ref()
            .map(struct_to_json)
            .unwrap_or_else(|| serde_json::json!({}));
        let out = match self.0.call(&req.name, args).await {
            Ok(v) => CallToolResponse {
                result: Some(json_to_value(&v)),
                error: String::new(),
            },
            Err(e) => CallToolResponse {
                result: None,
                error: e,
            },
        };
        Ok(Response::new(out))
    }
}

/// Calls tool `name` on the provider at `channel`; the provider's error
/// (or the transport's) as `Err`.
pub async fn call(
    channel: tonic::transport::Channel,
    max_message_bytes: usize,
    name: &str,
    call_id: &str,
    args: &Value,
    correlation: CorrelationContext,
) -> Result<Value, String> {
    // Tool providers are third parties: no credential of this process.
    let client = ToolClient::remote(
        switchyard_kit::client::authed(channel, None),
        max_message_bytes,
    );
    let req = CallToolRequest {
        name: name.into(),
        arguments: json_to_struct(args),
        correlation: Some(correlation),
        call_id: call_id.into(),
    };
    let resp = client
        .call_tool(req)
        .await
        .map_err(|s| format!("tool provider: {}", s.message()))?;
    if !resp.error.is_empty() {
        return Err(resp.error);
    }
    Ok(resp
        .result
        .as_ref()
        .map(value_to_json)
        .unwrap_or(Value::Null))
}

/// A progress update of an MCP tool call.
pub use switchyard_proto::registry::v1::McpProgress;

/// Calls the registered MCP tool `name` through the registry
/// (`CallMcpTool`), handing each progress update to `on_progress` as it
/// comes. The tool's error, or why the call could not run, is the `Err`
/// given back to the model. Dropping the future cancels the call on the
/// MCP server.
pub async fn call_mcp(
    registry: &switchyard_api::RegistryClient,
    name: &str,
    call_id: &str,
    args: &Value,
    correlation: CorrelationContext,
    on_progress: &(dyn Fn(McpProgress) + Send + Sync),
) -> Result<Value, String> {
    use futures_util::StreamExt;
    use switchyard_proto::registry::v1::CallMcpToolRequest;
    use switchyard_proto::registry::v1::call_mcp_tool_response::Event;
    let req = CallMcpToolRequest {
        name: name.into(),
        arguments: json_to_struct(args),
        correlation: Some(correlation),
        call_id: call_id.into(),
    };
    let mut stream = registry
        .call_mcp_tool(req)
        .await
        .map_err(|s| format!("registry: {}", s.message()))?;
    while let Some(msg) = stream.next().await {
        match msg.map_err(|s| format!("registry: {}", s.message()))?.event {
            Some(Event::Progress(p)) => on_progress(p),
            Some(Event::Result(r)) if r.error.is_empty() => {
                return Ok(r.result.as_ref().map(value_to_json).unwrap_or(Value::Null));
            }
            Some(Event::Result(r)) => return Err(r.error),
            None => {}
        }
    }
    Err(format!(
        "registry: the call of MCP tool {name:?} ended without a result"
    ))
}
