//! One live MCP client session: over the pipes of a sandboxed child
//! (stdio) or streamable HTTP. It lists tools, runs calls with their
//! progress notifications, cancels a call whose caller went away, and tells
//! its owner when the server's tool list changed. An HTTP server that
//! speaks the stateless revision 2026-07-28 is spoken to in it
//! ([`crate::stateless_client`]); any other server, and every stdio one,
//! through the official Rust SDK (rmcp) in the session revisions
//! (`initialize`, `notifications/cancelled`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientNotification,
    ClientRequest, Implementation, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    RequestId, ServerResult,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::{Map, Value};
use switchyard_sandbox::Process;
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, mpsc};

/// Bytes of a stdio server's stderr kept to explain why it died.
const STDERR_TAIL: usize = 2048;

/// How to reach the server.
pub enum Transport {
    /// A started, confined child: JSON-RPC lines over its stdin/stdout.
    Stdio(Box<switchyard_sandbox::Service>),
    /// A streamable HTTP endpoint.
    Http {
        /// Its URL.
        url: String,
        /// Bearer token, if any. Never logged or shown.
        bearer: Option<String>,
        /// The HTTP client to use.
        client: reqwest::Client,
    },
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio(s) => f.debug_tuple("Stdio").field(&s.process).finish(),
            Transport::Http { url, bearer, .. } => f
                .debug_struct("Http")
                .field("url", url)
                .field("bearer", &bearer.as_ref().map(|_| "[redacted]"))
                .finish(),
        }
    }
}

/// A progress notification of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Progress so far.
    pub progress: f64,
    /// Total, when known.
    pub total: Option<f64>,
    /// The server's message.
    pub message: Option<String>,
}

/// A tool as the server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    /// Its name on the server.
    pub name: String,
    /// Its description (or title).
    pub description: String,
    /// Its input JSON Schema.
    pub input_schema: Value,
}

/// What went wrong talking to a server. Messages name the server and never
/// carry credentials.
#[derive(Debug, Clone, thiserror::Error)]
pub enum McpError {
    /// The session could not be set up.
    #[error("connecting to MCP server {server:?}: {message}")]
    Connect {
        /// Server name.
        server: String,
        /// Why.
        message: String,
    },
    /// The connection ended (a stdio server exited) before the answer.
    #[error("MCP server {server:?} closed the connection before answering{detail}")]
    Closed {
        /// Server name.
        server: String,
        /// The end of its stderr, when there is one.
        detail: String,
    },
    /// The server answered with a JSON-RPC error.
    #[error("MCP server {server:?} refused {method}: {message}")]
    Refused {
        /// Server name.
        server: String,
        /// The request.
        method: &'static str,
        /// Its error message.
        message: String,
    },
    /// Nothing came back in time.
    #[error("MCP server {server:?} did not answer {method} within {ms} ms")]
    Timeout {
        /// Server name.
        server: String,
        /// The request.
        method: &'static str,
        /// The limit.
        ms: u128,
    },
}

/// What the client handler shares with the session.
struct Shared {
    server: String,
    progress: Mutex<HashMap<ProgressToken, mpsc::UnboundedSender<Progress>>>,
    list_changed: Arc<Notify>,
    stderr: Mutex<VecDeque<u8>>,
}

impl Shared {
    fn closed(&self) -> McpError {
        let tail = self
            .stderr
            .lock()
            .map(|b| String::from_utf8_lossy(&b.iter().copied().collect::<Vec<u8>>()).into_owned())
            .unwrap_or_default();
        let tail = tail.trim();
        McpError::Closed {
            server: self.server.clone(),
            detail: if tail.is_empty() {
                String::new()
            } else {
                format!("; its stderr ends: {tail}")
            },
        }
    }

    fn error(&self, method: &'static str, e: ServiceError) -> McpError {
        match e {
            ServiceError::McpError(d) => McpError::Refused {
                server: self.server.clone(),
                method,
                message: d.message.into_owned(),
            },
            ServiceError::Timeout { timeout } => McpError::Timeout {
                server: self.server.clone(),
                method,
                ms: timeout.as_millis(),
            },
            ServiceError::TransportClosed | ServiceError::Cancelled { .. } => self.closed(),
            other => McpError::Refused {
                server: self.server.clone(),
                method,
                message: other.to_string(),
            },
        }
    }
}

/// The rmcp client handler: routes progress to the call that asked for it
/// and wakes the owner on `notifications/tools/list_changed`.
#[derive(Clone)]
struct Handler(Arc<Shared>);

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        p: ProgressNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        let tx = self
            .0
            .progress
            .lock()
            .ok()
            .and_then(|m| m.get(&p.progress_token).cloned());
        if let Some(tx) = tx {
            let _ = tx.send(Progress {
                progress: p.progress,
                total: p.total,
                message: p.message,
            });
        }
    }

    async fn on_tool_list_changed(&self, _ctx: NotificationContext<RoleClient>) {
        self.0.list_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        // 2025-11-25, the newest version the reference servers and the
        // conformance suite speak: on 2026-07-28 connections list changes
        // arrive only on a `listen` subscription, which this client does
        // not open.
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("switchyard", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }
}

/// How a session talks to its server.
enum Link {
    /// The session revisions, through rmcp.
    Rmcp(RunningService<RoleClient, Handler>),
    /// The stateless revision; its tool list follower, if any, ends with
    /// the session.
    Stateless {
        client: Arc<crate::stateless_client::Client>,
        _follower: Option<AbortOnDrop>,
    },
}

/// A task aborted when its owner goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A live session with one MCP server.
pub struct Session {
    shared: Arc<Shared>,
    link: Link,
    /// The stdio server's process: kept so that dropping the session kills it.
    _process: Option<Process>,
    server_version: String,
    protocol_version: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("server", &self.shared.server)
            .field("server_version", &self.server_version)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Connects to server `name` within `timeout`: over HTTP, the
    /// stateless revision when the server speaks it, else the handshake of
    /// the session revisions. `list_changed` is notified whenever the
    /// server says its tool list changed.
    pub async fn connect(
        name: &str,
        transport: Transport,
        list_changed: Arc<Notify>,
        timeout: Duration,
    ) -> Result<Session, McpError> {
        let started = tokio::time::Instant::now();
        let shared = Arc::new(Shared {
            server: name.to_owned(),
            progress: Mutex::default(),
            list_changed: list_changed.clone(),
            stderr: Mutex::default(),
        });
        let transport = match transport {
            Transport::Http {
                url,
                bearer,
                client,
            } => {
                use crate::stateless_client::{Client, Discovered};
                match Client::discover(name, url.clone(), bearer.clone(), client.clone(), timeout)
                    .await?
                {
                    Discovered::Stateless(c) => {
                        let c = Arc::new(c);
                        let follower = c.follow(list_changed).map(AbortOnDrop);
                        return Ok(Session {
                            server_version: c.server_version().to_owned(),
                            protocol_version: crate::stateless::REVISION.to_owned(),
                            shared,
                            link: Link::Stateless {
                                client: c,
                                _follower: follower,
                            },
                            _process: None,
                        });
                    }
                    Discovered::Older => Transport::Http {
                        url,
                        bearer,
                        client,
                    },
                }
            }
            t => t,
        };
        // What discovery left of the time to connect in.
        let timeout = timeout.saturating_sub(started.elapsed());
        let handler = Handler(shared.clone());
        let connect_err = |message: String| McpError::Connect {
            server: name.to_owned(),
            message,
        };
        let (service, process) = match transport {
            Transport::Stdio(svc) => {
                let svc = *svc;
                tokio::spawn(keep_stderr(svc.stderr, shared.clone()));
                let started = tokio::time::timeout(timeout, handler.serve((svc.stdout, svc.stdin)));
                let service = match started.await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        let closed = shared.closed().to_string();
                        return Err(connect_err(format!("{e} ({closed})")));
                    }
                    Err(_) => return Err(connect_err(timed_out(timeout))),
                };
                (service, Some(svc.process))
            }
            Transport::Http {
                url,
                bearer,
                client,
            } => {
                use rmcp::transport::streamable_http_client::{
                    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
                };
                let mut cfg = StreamableHttpClientTransportConfig::with_uri(url);
                if let Some(b) = bearer {
                    cfg = cfg.auth_header(b);
                }
                let t = StreamableHttpClientTransport::with_client(client, cfg);
                let service = match tokio::time::timeout(timeout, handler.serve(t)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return Err(connect_err(e.to_string())),
                    Err(_) => return Err(connect_err(timed_out(timeout))),
                };
                (service, None)
            }
        };
        let info = service.peer().peer_info();
        let server_version = info
            .as_ref()
            .and_then(|i| i.server_info.as_ref())
            .map(|i| format!("{} {}", i.name, i.version))
            .unwrap_or_default();
        let protocol_version = info
            .as_ref()
            .map(|i| i.protocol_version.to_string())
            .unwrap_or_default();
        Ok(Session {
            shared,
            link: Link::Rmcp(service),
            _process: process,
            server_version,
            protocol_version,
        })
    }

    /// `name version` the server reported.
    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    /// The protocol version agreed.
    pub fn protocol_version(&self) -> &str {
        &self.protocol_version
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        match &self.link {
            Link::Rmcp(service) => service.is_closed(),
            // Each request stands alone: there is no connection to lose.
            Link::Stateless { .. } => false,
        }
    }

    /// Every tool the server offers (all pages), within `timeout`.
    pub async fn list_tools(&self, timeout: Duration) -> Result<Vec<ToolDef>, McpError> {
        let service = match &self.link {
            Link::Rmcp(service) => service,
            Link::Stateless { client, .. } => return client.list_tools(timeout).await,
        };
        let listed = tokio::time::timeout(timeout, service.peer().list_all_tools()).await;
        let tools = match listed {
            Ok(r) => r.map_err(|e| self.shared.error("tools/list", e))?,
            Err(_) => {
                return Err(McpError::Timeout {
                    server: self.shared.server.clone(),
                    method: "tools/list",
                    ms: timeout.as_millis(),
                });
            }
        };
        Ok(tools
            .into_iter()
            .map(|t| ToolDef {
                description: t
                    .description
                    .map(|d| d.into_owned())
                    .or(t.title)
                    .unwrap_or_default(),
                name: t.name.into_owned(),
                input_schema: Value::Object((*t.input_schema).clone()),
            })
            .collect())
    }

    /// Calls `tool`; progress notifications go to `progress` as they come.
    /// Dropping the returned future before it ends cancels the call on the
    /// server. No timeout of its own: the caller bounds it.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        progress: mpsc::UnboundedSender<Progress>,
    ) -> Result<CallToolResult, McpError> {
        let service = match &self.link {
            Link::Rmcp(service) => service,
            Link::Stateless { client, .. } => {
                return client.call(tool, arguments, &progress).await;
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        let req = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let peer = service.peer().clone();
        let handle = peer
            .send_cancellable_request(req, PeerRequestOptions::no_options())
            .await
            .map_err(|e| self.shared.error("tools/call", e))?;
        let token = handle.progress_token.clone();
        if let Ok(mut m) = self.shared.progress.lock() {
            m.insert(token.clone(), progress);
        }
        let mut pending = Pending {
            shared: self.shared.clone(),
            peer,
            id: Some(handle.id.clone()),
            token,
        };
        let answer = handle.await_response().await;
        pending.id = None;
        match answer {
            Ok(ServerResult::CallToolResult(r)) => Ok(r),
            Ok(_) => Err(McpError::Refused {
                server: self.shared.server.clone(),
                method: "tools/call",
                message:
                    "the answer is not a tool result (tasks and input requests are not supported)"
                        .into(),
            }),
            Err(e) => Err(self.shared.error("tools/call", e)),
        }
    }

    /// Ends the session (and kills a stdio server).
    pub async fn close(self) {
        if let Link::Rmcp(mut service) = self.link {
            let _ = service.close_with_timeout(Duration::from_secs(2)).await;
        }
    }
}

/// A call in flight: forgets its progress route when it ends, and tells the
/// server to stop when the caller went away before the answer.
struct Pending {
    shared: Arc<Shared>,
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
    token: ProgressToken,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Ok(mut m) = self.shared.progress.lock() {
            m.remove(&self.token);
        }
        let Some(id) = self.id.take() else { return };
        let peer = self.peer.clone();
        let server = self.shared.server.clone();
        // Drop cannot wait: the notification goes out on the runtime.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let n = CancelledNotification::new(CancelledNotificationParam::new(
                    Some(id),
                    Some("the caller stopped waiting (timeout or cancellation)".into()),
                ));
                let sent = peer
                    .send_notification(ClientNotification::CancelledNotification(n))
                    .await;
                tracing::debug!(server, sent = sent.is_ok(), "cancelled an MCP tool call");
            });
        }
    }
}

fn timed_out(t: Duration) -> String {
    format!("no answer to initialize within {} ms", t.as_millis())
}

/// Drains a stdio server's stderr, keeping its tail for error messages
/// (never logged above debug: a server may print what it was given).
async fn keep_stderr(mut r: tokio::net::unix::pipe::Receiver, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 4096];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                tracing::debug!(server = %shared.server, stderr = %String::from_utf8_lossy(&buf[..n]).trim_end(), "MCP server stderr");
                if let Ok(mut tail) = shared.stderr.lock() {
                    tail.extend(&buf[..n]);
                    let over = tail.len().saturating_sub(STDERR_TAIL);
                    tail.drain(..over);
                }
            }
        }
    }
}

/// What the model is given for a result: the structured content when
/// there is one, else the text of a single text block, else the blocks.
/// `Err` with the text when the tool reported an error (`isError`).
pub fn result_value(r: &CallToolResult) -> Result<Value, String> {
    let texts: Vec<&str> = r
        .content
        .iter()
        .filter_map(|b| b.as_text().map(|t| t.text.as_str()))
        .collect();
    if r.is_error == Some(true) {
        let text = texts.join("\n");
        return Err(if text.is_empty() {
            "the tool reported an error without a message".into()
        } else {
            text
        });
    }
    if let Some(v) = &r.structured_content {
        return Ok(v.clone());
    }
    if r.content.len() == 1 && texts.len() == 1 {
        return Ok(Value::String(texts[0].to_owned()));
    }
    Ok(serde_json::to_value(&r.content).unwrap_or(Value::Null))
}
