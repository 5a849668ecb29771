//! MCP 2026-07-28, the stateless revision, beside the stateful ones. A
//! 2026-07-28 request carries everything a session used to: the
//! `MCP-Protocol-Version` header and, in `params._meta`, the protocol
//! version and the client's capabilities (its info optional). There is no
//! `initialize`, no `Mcp-Session-Id` and no SSE resumption; `server/discover`
//! says what the server is. `rmcp` 3.11 speaks the stateful revisions only,
//! so this module answers the stateless wire itself, over the same tools
//! and the same per-request identity ([`SwitchyardMcp`]); a request of an
//! older revision (an `initialize`, or a `MCP-Protocol-Version` it names)
//! goes on to `rmcp`'s streamable HTTP service unchanged.
//!
//! [`layer`] routes one `/mcp` endpoint between the two.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Map, Value, json};

use crate::server::SwitchyardMcp;

/// The stateless revision.
pub const REVISION: &str = "2026-07-28";

/// Revisions of the initialize handshake and sessions, served by `rmcp`.
const STATEFUL: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// `_meta` keys every stateless request must carry.
const REQUIRED_META: [&str; 2] = [
    "io.modelcontextprotocol/protocolVersion",
    "io.modelcontextprotocol/clientCapabilities",
];

/// What [`layer`] needs: the server, the most a body may hold, and the Host
/// names answered (DNS-rebinding protection, as the stateful service's).
#[derive(Debug, Clone)]
pub struct Stateless {
    /// The tools' server.
    pub server: SwitchyardMcp,
    /// The largest request body, bytes.
    pub max_body: usize,
    /// Host header names answered; empty: any.
    pub allowed_hosts: Vec<String>,
}

/// Middleware in front of `rmcp`'s streamable HTTP service at `/mcp`: a
/// POST of the stateless revision (its header, or its `_meta` without the
/// header — refused then, saying so) is answered here; anything else goes
/// on.
pub async fn layer(State(st): State<Arc<Stateless>>, req: Request, next: Next) -> Response {
    if req.method() != http::Method::POST {
        return next.run(req).await;
    }
    let header = req
        .headers()
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if header.as_deref().is_some_and(|v| STATEFUL.contains(&v)) {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, st.max_body).await else {
        let e = error(
            Value::Null,
            -32600,
            "the request is larger than the server accepts",
        );
        return (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(e)).into_response();
    };
    let body: Option<Value> = serde_json::from_slice(&bytes).ok();
    let stateless_meta = body
        .as_ref()
        .and_then(|b| b.pointer("/params/_meta"))
        .and_then(Value::as_object)
        .is_some_and(|m| m.contains_key(REQUIRED_META[0]));
    if header.is_none() && !stateless_meta {
        // An initialize, or a client of an older revision.
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    }
    if !host_allowed(&parts, &st.allowed_hosts) {
        let e = error(
            Value::Null,
            -32600,
            "the Host header is not one this server answers",
        );
        return (StatusCode::FORBIDDEN, axum::Json(e)).into_response();
    }
    match answer(&st.server, &parts, header.as_deref(), body).await {
        (status, Some(v)) => (status, axum::Json(v)).into_response(),
        (status, None) => status.into_response(),
    }
}

fn host_allowed(parts: &http::request::Parts, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let Some(host) = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    // The name without its port (`[::1]:80` → `::1`).
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

fn error(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// One stateless request's HTTP status and JSON-RPC answer (`None`: a
/// notification, answered 202 with no body).
pub async fn answer(
    server: &SwitchyardMcp,
    parts: &http::request::Parts,
    header: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Option<Value>) {
    let bad = |id: Value, code: i64, m: String| (StatusCode::BAD_REQUEST, Some(error(id, code, m)));
    let Some(req) = body.filter(Value::is_object) else {
        return bad(
            Value::Null,
            -32700,
            "the body is not a JSON-RPC request object".into(),
        );
    };
    let Some(method) = req.get("method").and_then(Value::as_str) else {
        let id = req.get("id").cloned().unwrap_or(Value::Null);
        return bad(id, -32600, "a request names its method".into());
    };
    let Some(id) = req.get("id").cloned() else {
        // Notifications (cancellation of a request still running is the
        // closing of its HTTP stream in this revision): nothing to answer.
        return (StatusCode::ACCEPTED, None);
    };
    let Some(header) = header else {
        return bad(id, -32020, "Missing MCP-Protocol-Version header".into());
    };
    let meta = req
        .pointer("/params/_meta")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let missing: Vec<&str> = REQUIRED_META
        .iter()
        .copied()
        .filter(|k| !meta.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return bad(
            id,
            -32602,
            format!("Invalid params: missing _meta keys: {}", missing.join(", ")),
        );
    }
    if meta.get(REQUIRED_META[0]).and_then(Value::as_str) != Some(header) {
        return bad(
            id,
            -32020,
            "MCP-Protocol-Version header does not match _meta.protocolVersion".into(),
        );
    }
    if header != REVISION {
        let e = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32022,
            "message": "Unsupported protocol version",
            "data": {"supported": supported(), "requested": header}}});
        return (StatusCode::BAD_REQUEST, Some(e));
    }
    let params = req.get("params").cloned().unwrap_or(Value::Null);
    if let Err(m) = standard_headers(parts, method, &params) {
        return bad(id, -32020, m);
    }
    let result = match method {
        "server/discover" => Ok(cacheable(json!({
            "supportedVersions": supported(),
            "capabilities": {"tools": {}, "resources": {}},
            "instructions": crate::server::INSTRUCTIONS,
            "_meta": {"io.modelcontextprotocol/serverInfo": server_info()},
        }))),
        "tools/list" => Ok(cacheable(json!({
            "tools": crate::server::tools(),
            "_meta": {"io.modelcontextprotocol/serverInfo": server_info()},
        }))),
        "tools/call" => call(server, parts, &params)
            .await
            .map_err(|(c, m)| (c, m, None)),
        "resources/list" => {
            let cursor = params.get("cursor").and_then(Value::as_str);
            let listed = server.jobs_as_resources(Some(parts), cursor).await;
            listed.map(cacheable).map_err(resource_error)
        }
        "resources/templates/list" => Ok(cacheable(crate::resources::templates())),
        "resources/read" => match params.get("uri").and_then(Value::as_str) {
            Some(uri) => server
                .read_job_resource(Some(parts), uri)
                .await
                .map(cacheable)
                .map_err(resource_error),
            None => Err((-32602, "params.uri: name the resource".to_owned(), None)),
        },
        _ => {
            let e = error(
                id,
                -32601,
                format!(
                    "Method not found: {method} (this server offers server/discover, tools/list, tools/call, resources/list, resources/templates/list and resources/read)"
                ),
            );
            return (StatusCode::NOT_FOUND, Some(e));
        }
    };
    match result {
        Ok(mut r) => {
            if let Some(o) = r.as_object_mut() {
                o.entry("resultType").or_insert(json!("complete"));
            }
            (
                StatusCode::OK,
                Some(json!({"jsonrpc": "2.0", "id": id, "result": r})),
            )
        }
        Err((code, m, data)) => {
            let mut e = error(id, code, m);
            if let Some(d) = data {
                e["error"]["data"] = d;
            }
            (StatusCode::BAD_REQUEST, Some(e))
        }
    }
}

fn resource_error(e: crate::resources::ResourceError) -> (i64, String, Option<Value>) {
    (e.code, e.message, e.data)
}

/// The standard headers a 2026-07-28 request repeats from its body, so
/// that proxies can route on them (SEP-2243): `Mcp-Method`, and `Mcp-Name`
/// for a call naming a tool. Each must be there and say exactly what the
/// body says (surrounding whitespace aside): a request whose headers and
/// body disagree could be routed as one thing and run as another.
fn standard_headers(
    parts: &http::request::Parts,
    method: &str,
    params: &Value,
) -> Result<(), String> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    match header("mcp-method") {
        Some(m) if m == method => {}
        Some(m) => {
            return Err(format!(
                "the Mcp-Method header says {m:?} and the body {method:?}: they must match"
            ));
        }
        None => {
            return Err(format!(
                "Missing Mcp-Method header (the body's method is {method:?})"
            ));
        }
    }
    // What the request names: a tool's name, a resource's URI.
    let named = match method {
        "tools/call" => params.get("name"),
        "resources/read" => params.get("uri"),
        _ => None,
    };
    if let Some(name) = named.and_then(Value::as_str) {
        match header("mcp-name") {
            Some(n) if n == name => {}
            Some(n) => {
                return Err(format!(
                    "the Mcp-Name header says {n:?} and the body {name:?}: they must match"
                ));
            }
            None => return Err(format!("Missing Mcp-Name header (the body names {name:?})")),
        }
    }
    Ok(())
}

/// The revisions this endpoint speaks, newest first.
fn supported() -> Vec<&'static str> {
    let mut v = vec![REVISION];
    v.extend(STATEFUL.iter().rev());
    v
}

fn server_info() -> Value {
    json!({"name": "switchyard", "version": env!("CARGO_PKG_VERSION")})
}

/// A result clients may cache: for no time, and for this caller only (what
/// the tools show depends on who asks).
fn cacheable(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.insert("ttlMs".into(), json!(0));
        o.insert("cacheScope".into(), json!("private"));
    }
    v
}

/// `tools/call`: the tool run as the request's principal.
async fn call(
    server: &SwitchyardMcp,
    parts: &http::request::Parts,
    params: &Value,
) -> Result<Value, (i64, String)> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or((-32602, "params.name: name the tool".to_owned()))?;
    if !crate::server::tools().iter().any(|t| t.name == name) {
        return Err((-32602, format!("no tool {name:?}")));
    }
    let args = match params.get("arguments") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err((-32602, "params.arguments must be an object".to_owned())),
    };
    let elicits = params
        .pointer("/_meta/io.modelcontextprotocol~1clientCapabilities/elicitation")
        .is_some_and(Value::is_object);
    if name == "submit_job" && elicits {
        return gate(server, parts, params, &args).await;
    }
    let result = server.call_as(Some(parts), name, &args).await;
    serde_json::to_value(result).map_err(|e| (-32603, e.to_string()))
}

/// `submit_job` from a client that takes elicitation: a job that waits for
/// a person is answered `input_required` (SEP-2322), asking the client's
/// user to come back once a person has decided, with the job's id as the
/// request state. The retry reads the job again — as the caller, through
/// the executor, so a state naming a job the caller may not see is refused
/// as `get_job` refuses it — and its approval run in Switchyard's approval
/// record, and answers what they are now: still waiting (asked again), or
/// decided (the job, with `approval` saying how, even before the executor
/// has moved it on). Whatever the client answers is never a decision: only
/// a person's, recorded by the approval service, moves the job; declining
/// ends the waiting here (the job stays as it is, to follow with get_job).
async fn gate(
    server: &SwitchyardMcp,
    parts: &http::request::Parts,
    params: &Value,
    args: &Map<String, Value>,
) -> Result<Value, (i64, String)> {
    let retry = params.get("requestState").is_some();
    let outcome = match params.get("requestState") {
        None => server.run("submit_job", args, Some(parts)).await,
        Some(Value::String(job_id)) if !job_id.is_empty() => {
            let read = json!({"job_id": job_id});
            let read = read.as_object().cloned().unwrap_or_default();
            let job = server.run("get_job", &read, Some(parts)).await;
            let action = params
                .pointer("/inputResponses/approval/action")
                .and_then(Value::as_str);
            if matches!(action, Some("decline" | "cancel")) {
                return to_value(crate::server::tool_result(job));
            }
            job
        }
        Some(_) => {
            return Err((
                -32602,
                "params.requestState: send back the string this server sent".to_owned(),
            ));
        }
    };
    match outcome {
        Ok(mut job) if waits_for_a_person(&job) => {
            let run = job["run_id"].as_str().unwrap_or_default().to_owned();
            if retry && job["state"] == "pending" && !run.is_empty() {
                let status = server.run_status(&run, Some(parts)).await.ok();
                if let Some(decided) = status.as_deref().and_then(decision) {
                    job["approval"] = json!(decided);
                    return to_value(crate::server::tool_result(Ok(job)));
                }
            }
            Ok(input_required(&job))
        }
        other => to_value(crate::server::tool_result(other)),
    }
}

fn to_value(r: rmcp::model::CallToolResult) -> Result<Value, (i64, String)> {
    serde_json::to_value(r).map_err(|e| (-32603, e.to_string()))
}

/// What a person decided on a run in `status`, if anything: an approved
/// run may already be running or done by the time it is read.
fn decision(status: &str) -> Option<&'static str> {
    match status {
        "approved" | "running" | "completed" | "failed" => Some("approved"),
        "rejected" => Some("rejected"),
        "cancelled" => Some("cancelled"),
        _ => None,
    }
}

/// Whether a job (as `get_job` shows it) waits for a person's decision.
fn waits_for_a_person(job: &Value) -> bool {
    matches!(job["state"].as_str(), Some("pending" | "budget_paused"))
}

/// The answer that asks the client's user to come back once a person has
/// decided on `job`.
fn input_required(job: &Value) -> Value {
    let id = job["job_id"].as_str().unwrap_or_default();
    let run = job["run_id"].as_str().unwrap_or_default();
    let why = if job["state"] == "budget_paused" {
        "its budget ran out and an extension"
    } else {
        "it"
    };
    let message = format!(
        "Job {id} waits for a person: {why} must be approved (approval run {run}) in the \
         Switchyard console or with `switchyard approval approve {run}`. Approving is not done \
         here. Answer once a person has decided and the job is read again; decline to stop \
         waiting (the job stays as it is)."
    );
    json!({
        "resultType": "input_required",
        "inputRequests": {"approval": {"method": "elicitation/create", "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {"type": "object", "properties": {}},
        }}},
        "requestState": id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(host: &str) -> http::request::Parts {
        let (p, ()) = http::Request::builder()
            .header(http::header::HOST, host)
            .body(())
            .unwrap_or_default()
            .into_parts();
        p
    }

    #[test]
    fn a_run_read_after_its_approval_says_approved_whatever_it_went_on_to() {
        for s in ["approved", "running", "completed", "failed"] {
            assert_eq!(decision(s), Some("approved"), "{s}");
        }
        assert_eq!(decision("rejected"), Some("rejected"));
        assert_eq!(decision("proposed"), None);
        assert_eq!(decision("unknown"), None);
    }

    #[test]
    fn hosts_are_matched_by_name_whatever_the_port() {
        let allowed = vec!["localhost".to_owned(), "::1".to_owned()];
        assert!(host_allowed(&parts("localhost:7680"), &allowed));
        assert!(host_allowed(&parts("[::1]:7680"), &allowed));
        assert!(!host_allowed(&parts("evil.example"), &allowed));
        assert!(host_allowed(&parts("evil.example"), &[]));
    }

    #[test]
    fn the_newest_revision_is_offered_first() {
        assert_eq!(supported()[0], REVISION);
        assert!(supported().contains(&"2025-11-25"));
    }
}
