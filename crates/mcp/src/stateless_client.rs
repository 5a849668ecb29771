//! MCP 2026-07-28 as a client, beside `rmcp`'s session revisions. A
//! streamable HTTP server is first asked `server/discover` in the
//! stateless revision; one that lists 2026-07-28 among its
//! `supportedVersions` is spoken to statelessly from then on, and one that
//! does not (an older server refuses the method, or wants `initialize`
//! first) gets the handshake of the session revisions through `rmcp`
//! ([`crate::Session::connect`] decides). `rmcp` 3.11 has no client for the
//! stateless revision, so its wire is written here, behind the same
//! [`crate::Session`] methods:
//!
//! - every request is one POST carrying the `MCP-Protocol-Version`,
//!   `Mcp-Method` (and, for a tool call, `Mcp-Name` and the tool's
//!   `Mcp-Param-*`, [`crate::headers`]) headers and, in
//!   `params._meta`, the protocol version, Switchyard's client info and its
//!   capabilities (none: it answers no elicitation, sampling or roots
//!   request, so a server may not ask it for input);
//! - an answer is a JSON body, or an event stream carrying the call's
//!   `notifications/progress` before its response;
//! - a call is cancelled by closing its stream (dropping the future);
//! - tool list changes come on a `subscriptions/listen` stream, opened
//!   when the server says its tool list changes, and opened again (after a
//!   growing pause) when it ends, a change it may have missed assumed;
//! - a server that refuses the version (`-32022`) while listing it as
//!   supported is asked once more (the version is the only one spoken).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::CallToolResult;
use serde_json::{Map, Value, json};
use tokio::sync::{Notify, mpsc};

use crate::headers::{HeaderParam, header_params, param_headers};
use crate::session::{McpError, Progress, ToolDef};
use crate::stateless::REVISION;

/// The most bytes of one answer read: a JSON body, or an event stream up
/// to its response. A server sending more is cut off.
const MAX_ANSWER: usize = 16 << 20;
/// The most bytes one event of a subscription stream may take.
const MAX_EVENT: usize = 1 << 20;
/// The most pages of `tools/list` followed (a server's cursors could
/// otherwise lead on for ever).
const MAX_PAGES: usize = 100;
/// The longest pause before a subscription stream is opened again.
const MAX_LISTEN_PAUSE: Duration = Duration::from_secs(60);

/// A stateless connection: nothing but where the server is and how to
/// reach it; each request stands alone.
pub(crate) struct Client {
    server: String,
    url: String,
    bearer: Option<String>,
    http: reqwest::Client,
    ids: AtomicU64,
    server_version: String,
    lists_changes: bool,
    /// Each listed tool's header parameters, or why it may not be called.
    headers: Mutex<HashMap<String, Result<Vec<HeaderParam>, String>>>,
}

/// What `server/discover` found.
pub(crate) enum Discovered {
    /// The server speaks the stateless revision.
    Stateless(Client),
    /// It does not: the session revisions' handshake is next.
    Older,
}

/// One exchange's answer.
enum Reply {
    Result(Value),
    Error {
        status: u16,
        code: Option<i64>,
        message: String,
        data: Value,
    },
}

impl Client {
    /// Asks the server at `url` what it speaks, within `timeout`.
    pub(crate) async fn discover(
        server: &str,
        url: String,
        bearer: Option<String>,
        http: reqwest::Client,
        timeout: Duration,
    ) -> Result<Discovered, McpError> {
        let mut c = Client {
            server: server.to_owned(),
            url,
            bearer,
            http,
            ids: AtomicU64::new(1),
            server_version: String::new(),
            lists_changes: false,
            headers: Mutex::default(),
        };
        let connect = |message: String| McpError::Connect {
            server: server.to_owned(),
            message,
        };
        let deadline = tokio::time::Instant::now() + timeout;
        for again in [false, true] {
            let asked = c.exchange("server/discover", Map::new(), None, &[]);
            let reply = match tokio::time::timeout_at(deadline, asked).await {
                Err(_) => {
                    return Err(connect(format!(
                        "no answer to server/discover within {} ms",
                        timeout.as_millis()
                    )));
                }
                Ok(Err(e)) => return Err(connect(e.to_string())),
                Ok(Ok(r)) => r,
            };
            match reply {
                Reply::Result(r) => {
                    if !versions(&r["supportedVersions"]).contains(&REVISION) {
                        return Ok(Discovered::Older);
                    }
                    c.server_version = server_info(&r);
                    c.lists_changes =
                        r.pointer("/capabilities/tools/listChanged") == Some(&Value::Bool(true));
                    return Ok(Discovered::Stateless(c));
                }
                Reply::Error {
                    status: status @ (401 | 403),
                    message,
                    ..
                } => {
                    return Err(connect(format!(
                        "the server refused the request (HTTP {status}): {message}; check the server's bearer secret"
                    )));
                }
                Reply::Error {
                    code: Some(-32022),
                    data,
                    ..
                } if !again && versions(&data["supported"]).contains(&REVISION) => {}
                Reply::Error { .. } => return Ok(Discovered::Older),
            }
        }
        Ok(Discovered::Older)
    }

    /// `name version` from the server's discovery.
    pub(crate) fn server_version(&self) -> &str {
        &self.server_version
    }

    /// Every tool the server offers (all pages), within `timeout`.
    pub(crate) async fn list_tools(&self, timeout: Duration) -> Result<Vec<ToolDef>, McpError> {
        let listed = tokio::time::timeout(timeout, self.all_tools()).await;
        listed.unwrap_or_else(|_| {
            Err(McpError::Timeout {
                server: self.server.clone(),
                method: "tools/list",
                ms: timeout.as_millis(),
            })
        })
    }

    async fn all_tools(&self) -> Result<Vec<ToolDef>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = Map::new();
            if let Some(c) = cursor.take() {
                params.insert("cursor".into(), Value::String(c));
            }
            let page = self.complete("tools/list", params, None, &[]).await?;
            let Some(listed) = page["tools"].as_array() else {
                return Err(self.refused("tools/list", "the answer has no tools list"));
            };
            for t in listed {
                tools.push(tool_def(t).map_err(|m| self.refused("tools/list", m))?);
            }
            match page.get("nextCursor") {
                Some(Value::String(c)) => cursor = Some(c.clone()),
                _ => {
                    let known = tools
                        .iter()
                        .map(|t| (t.name.clone(), header_params(&t.input_schema)))
                        .collect();
                    if let Ok(mut h) = self.headers.lock() {
                        *h = known;
                    }
                    return Ok(tools);
                }
            }
        }
        Err(self.refused(
            "tools/list",
            format!("the list goes on past {MAX_PAGES} pages"),
        ))
    }

    /// Calls `tool`; progress notifications go to `progress` as they come.
    /// Dropping the future closes the stream, which cancels the call.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        progress: &mpsc::UnboundedSender<Progress>,
    ) -> Result<CallToolResult, McpError> {
        let declared = self
            .headers
            .lock()
            .ok()
            .and_then(|h| h.get(tool).cloned())
            .unwrap_or(Ok(Vec::new()));
        let headers = match declared {
            Ok(d) => param_headers(&d, &arguments),
            Err(why) => {
                return Err(self.refused(
                    "tools/call",
                    format!("tool {tool:?} may not be called: {why}"),
                ));
            }
        };
        let mut params = Map::new();
        params.insert("name".into(), Value::String(tool.to_owned()));
        params.insert("arguments".into(), Value::Object(arguments));
        let r = self
            .complete("tools/call", params, Some(progress), &headers)
            .await?;
        serde_json::from_value(r).map_err(|e| {
            self.refused(
                "tools/call",
                format!("the answer is not a tool result: {e}"),
            )
        })
    }

    /// Follows the server's tool list changes into `changed`, when it has
    /// any to tell: returns the follower (aborted with the session).
    pub(crate) fn follow(
        self: &Arc<Client>,
        changed: Arc<Notify>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if !self.lists_changes {
            return None;
        }
        let me = self.clone();
        Some(tokio::spawn(async move {
            let mut pause = Duration::from_secs(1);
            loop {
                let opened = tokio::time::Instant::now();
                match me.listen(&changed).await {
                    Listened::Unsupported(why) => {
                        tracing::info!(server = %me.server, why = %why, "the MCP server takes no subscriptions: its tool list is read again at reconnection only");
                        return;
                    }
                    // A stream that lasted starts the pauses over; one the
                    // server ends at once does not (it would have the
                    // tool list read every second).
                    Listened::Acknowledged if opened.elapsed() >= MAX_LISTEN_PAUSE => {
                        pause = Duration::from_secs(1);
                    }
                    Listened::Acknowledged => {}
                    Listened::Failed(why) => {
                        tracing::debug!(server = %me.server, why = %why, "an MCP subscription stream ended");
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_LISTEN_PAUSE);
                // While no stream was open a change could have gone unseen.
                changed.notify_one();
            }
        }))
    }

    /// One `subscriptions/listen` stream, until it ends.
    async fn listen(&self, changed: &Notify) -> Listened {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut params = Map::new();
        params.insert("notifications".into(), json!({"toolsListChanged": true}));
        let resp = match self
            .post(id, "subscriptions/listen", params, None, &[])
            .await
        {
            Ok(r) => r,
            Err(e) => return Listened::Failed(e.to_string()),
        };
        let status = resp.status();
        if !is_event_stream(&resp) {
            let body = switchyard_kit::egress::read_bounded(resp, MAX_EVENT)
                .await
                .unwrap_or_default();
            return Listened::Unsupported(format!("HTTP {status}: {}", short(&body)));
        }
        let mut resp = resp;
        let (mut buf, mut acknowledged) = (Vec::new(), false);
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => buf.extend_from_slice(&c),
                Ok(None) => break,
                Err(e) => return Listened::Failed(e.without_url().to_string()),
            }
            while let Some((_, data)) = switchyard_kit::sse::next_event(&mut buf) {
                let Ok(msg) = serde_json::from_str::<Value>(&data) else {
                    continue;
                };
                match msg["method"].as_str() {
                    Some("notifications/subscriptions/acknowledged") => {
                        let agreed = msg.pointer("/params/notifications/toolsListChanged");
                        if agreed != Some(&Value::Bool(true)) {
                            return Listened::Unsupported(
                                "it acknowledged no tool list changes".into(),
                            );
                        }
                        acknowledged = true;
                    }
                    Some("notifications/tools/list_changed") => changed.notify_one(),
                    _ => {}
                }
            }
            if buf.len() > MAX_EVENT {
                return Listened::Failed(format!("an event longer than {MAX_EVENT} bytes"));
            }
        }
        if acknowledged {
            Listened::Acknowledged
        } else {
            Listened::Failed("the stream ended before it was acknowledged".into())
        }
    }

    /// A request whose answer must be a complete result (`resultType`
    /// absent or `complete`).
    async fn complete(
        &self,
        method: &'static str,
        params: Map<String, Value>,
        progress: Option<&mpsc::UnboundedSender<Progress>>,
        headers: &[(String, String)],
    ) -> Result<Value, McpError> {
        match self.exchange(method, params, progress, headers).await? {
            Reply::Result(r) => match r.get("resultType").and_then(Value::as_str) {
                None | Some("complete") => Ok(r),
                Some("input_required") => Err(self.refused(
                    method,
                    "the server asked for input before it would answer; Switchyard's client \
                     answers no elicitation, sampling or roots request (it declares none)",
                )),
                Some(other) => Err(self.refused(
                    method,
                    format!("the answer's resultType {other:?} is not one this client knows"),
                )),
            },
            Reply::Error { message, .. } => Err(self.refused(method, message)),
        }
    }

    /// One request and its answer; progress notifications on its stream go
    /// to `progress`.
    async fn exchange(
        &self,
        method: &'static str,
        params: Map<String, Value>,
        progress: Option<&mpsc::UnboundedSender<Progress>>,
        headers: &[(String, String)],
    ) -> Result<Reply, McpError> {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let token = progress.map(|_| format!("switchyard-{id}"));
        let resp = self
            .post(id, method, params, token.as_deref(), headers)
            .await?;
        let status = resp.status().as_u16();
        if !is_event_stream(&resp) {
            let body = switchyard_kit::egress::read_bounded(resp, MAX_ANSWER)
                .await
                .map_err(|e| self.closed(&e))?;
            return Ok(reply_of(status, &body));
        }
        let mut resp = resp;
        let (mut buf, mut read_so_far) = (Vec::new(), 0usize);
        loop {
            let chunk = match resp.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => return Err(self.closed("the stream ended without the answer")),
                Err(e) => return Err(self.closed(&e.without_url().to_string())),
            };
            read_so_far += chunk.len();
            if read_so_far > MAX_ANSWER {
                return Err(self.refused(
                    method,
                    format!("the answer is larger than {MAX_ANSWER} bytes"),
                ));
            }
            buf.extend_from_slice(&chunk);
            while let Some((_, data)) = switchyard_kit::sse::next_event(&mut buf) {
                let Ok(msg) = serde_json::from_str::<Value>(&data) else {
                    continue;
                };
                if msg.get("id") == Some(&json!(id))
                    && (msg.get("result").is_some() || msg.get("error").is_some())
                {
                    return Ok(reply_of(status, data.as_bytes()));
                }
                if let (Some(tx), Some(token)) = (progress, &token)
                    && msg["method"] == "notifications/progress"
                    && msg.pointer("/params/progressToken") == Some(&json!(token))
                {
                    let p = &msg["params"];
                    let _ = tx.send(Progress {
                        progress: p["progress"].as_f64().unwrap_or_default(),
                        total: p["total"].as_f64(),
                        message: p["message"].as_str().map(str::to_owned),
                    });
                }
            }
        }
    }

    /// POSTs request `id`, with the revision's headers, `headers` and
    /// `_meta`.
    async fn post(
        &self,
        id: u64,
        method: &'static str,
        mut params: Map<String, Value>,
        progress_token: Option<&str>,
        headers: &[(String, String)],
    ) -> Result<reqwest::Response, McpError> {
        let mut meta = Map::new();
        meta.insert(
            "io.modelcontextprotocol/protocolVersion".into(),
            json!(REVISION),
        );
        meta.insert(
            "io.modelcontextprotocol/clientCapabilities".into(),
            json!({}),
        );
        meta.insert(
            "io.modelcontextprotocol/clientInfo".into(),
            json!({"name": "switchyard", "version": env!("CARGO_PKG_VERSION")}),
        );
        if let Some(t) = progress_token {
            meta.insert("progressToken".into(), json!(t));
        }
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .filter(|_| method == "tools/call")
            .map(str::to_owned);
        params.insert("_meta".into(), Value::Object(meta));
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut req = self
            .http
            .post(&self.url)
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", REVISION)
            .header("mcp-method", method)
            .json(&body);
        if let Some(n) = name {
            req = req.header("mcp-name", n);
        }
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        if let Some(b) = &self.bearer {
            req = req.bearer_auth(b);
        }
        req.send()
            .await
            .map_err(|e| self.closed(&e.without_url().to_string()))
    }

    fn refused(&self, method: &'static str, message: impl Into<String>) -> McpError {
        McpError::Refused {
            server: self.server.clone(),
            method,
            message: message.into(),
        }
    }

    fn closed(&self, why: &str) -> McpError {
        McpError::Closed {
            server: self.server.clone(),
            detail: format!(": {why}"),
        }
    }
}

/// How one subscription stream went.
enum Listened {
    /// It was acknowledged, then ended.
    Acknowledged,
    /// The server takes no subscription for tool list changes.
    Unsupported(String),
    /// It could not be opened or broke before its acknowledgement.
    Failed(String),
}

fn is_event_stream(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// A JSON-RPC response body (or what came instead) as a reply.
fn reply_of(status: u16, body: &[u8]) -> Reply {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    match parsed {
        Some(mut v) if v.get("result").is_some() && (200..300).contains(&status) => {
            Reply::Result(v["result"].take())
        }
        Some(v) if v.get("error").is_some() => Reply::Error {
            status,
            code: v.pointer("/error/code").and_then(Value::as_i64),
            message: v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("an error without a message")
                .to_owned(),
            data: v.pointer("/error/data").cloned().unwrap_or(Value::Null),
        },
        _ => Reply::Error {
            status,
            code: None,
            message: format!("HTTP {status} with no JSON-RPC answer: {}", short(body)),
            data: Value::Null,
        },
    }
}

/// The start of a body, for a message.
fn short(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

fn versions(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `name version` of a discovery result (`_meta` or, as some servers put
/// it, the result itself).
fn server_info(r: &Value) -> String {
    let info = r
        .pointer("/_meta/io.modelcontextprotocol~1serverInfo")
        .or_else(|| r.get("serverInfo"));
    match info {
        Some(i) => format!(
            "{} {}",
            i["name"].as_str().unwrap_or_default(),
            i["version"].as_str().unwrap_or_default()
        )
        .trim()
        .to_owned(),
        None => String::new(),
    }
}

fn tool_def(t: &Value) -> Result<ToolDef, String> {
    let name = t["name"]
        .as_str()
        .ok_or("a listed tool has no name")?
        .to_owned();
    let input_schema = match t.get("inputSchema") {
        Some(s @ Value::Object(_)) => s.clone(),
        _ => return Err(format!("tool {name:?} has no input schema object")),
    };
    let description = t["description"]
        .as_str()
        .or(t["title"].as_str())
        .unwrap_or_default()
        .to_owned();
    Ok(ToolDef {
        name,
        description,
        input_schema,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_from_either_shape_and_a_non_json_error_says_its_status() {
        let ok = reply_of(200, br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#);
        assert!(matches!(ok, Reply::Result(r) if r == json!({"tools": []})));
        let refused = reply_of(
            400,
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":["2026-07-28"]}}}"#,
        );
        let Reply::Error {
            status,
            code,
            message,
            data,
        } = refused
        else {
            panic!("not an error");
        };
        assert_eq!((status, code), (400, Some(-32022)));
        assert_eq!(message, "Unsupported protocol version");
        assert_eq!(versions(&data["supported"]), [REVISION]);
        let Reply::Error { message, code, .. } = reply_of(404, b"Not Found") else {
            panic!("not an error");
        };
        assert_eq!(code, None);
        assert!(message.contains("HTTP 404") && message.contains("Not Found"));
        // A result on an error status is not taken as an answer.
        assert!(matches!(
            reply_of(500, br#"{"result":{}}"#),
            Reply::Error { .. }
        ));
    }

    #[test]
    fn tools_need_a_name_and_a_schema_object_and_take_a_title_for_a_missing_description() {
        let t =
            tool_def(&json!({"name": "add", "title": "Add", "inputSchema": {"type": "object"}}));
        assert_eq!(t.map(|t| t.description), Ok("Add".to_owned()));
        assert!(tool_def(&json!({"inputSchema": {}})).is_err());
        assert!(tool_def(&json!({"name": "x", "inputSchema": "object"})).is_err());
    }

    #[test]
    fn server_info_is_read_from_meta_or_the_result() {
        let meta =
            json!({"_meta": {"io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1"}}});
        assert_eq!(server_info(&meta), "s 1");
        assert_eq!(
            server_info(&json!({"serverInfo": {"name": "t", "version": "2"}})),
            "t 2"
        );
        assert_eq!(server_info(&json!({})), "");
    }
}
