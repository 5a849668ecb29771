//! A scripted model server for tests and benchmarks: it answers
//! `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages`
//! (Anthropic) from per-model queues of replies (text, tool calls, usage
//! figures, 429/503 with Retry-After, malformed or schema-violating JSON,
//! delays) and records every request it gets. Replies are written once, in
//! OpenAI's shape; the Messages route answers them in Anthropic's. A
//! request asking for a stream gets the reply as server-sent events in
//! the route's stream shape, a few characters a chunk. `GET /v1/models`
//! lists the models given to [`Script::serve_models`] (404 until then).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    body: String,
    /// Response headers to send (Retry-After, rate-limit headers).
    headers: Vec<(String, String)>,
    delay: Duration,
    chunk_delay: Duration,
    usage_in_stream: bool,
}

impl Reply {
    /// `status` with `body`, at once, streamed with usage when asked.
    fn new(status: u16, body: String) -> Reply {
        Reply {
            status,
            body,
            headers: Vec::new(),
            delay: Duration::ZERO,
            chunk_delay: Duration::ZERO,
            usage_in_stream: true,
        }
    }

    fn completion(message: Value, prompt: u64, completion: u64) -> Reply {
        let finish = if message.get("tool_calls").is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        Reply::new(
            200,
            json!({
                "id": "chatcmpl-scripted", "object": "chat.completion", "model": "scripted",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            })
            .to_string(),
        )
    }

    /// A text answer with these usage figures.
    pub fn text(content: &str, prompt: u64, completion: u64) -> Reply {
        Reply::completion(
            json!({"role": "assistant", "content": content}),
            prompt,
            completion,
        )
    }

    /// An answer asking for tool calls: `(name, arguments)` pairs.
    pub fn tools(calls: &[(&str, Value)], prompt: u64, completion: u64) -> Reply {
        Reply::tools_saying("", calls, prompt, completion)
    }

    /// An answer with text (empty: none) beside its tool calls.
    pub fn tools_saying(
        text: &str,
        calls: &[(&str, Value)],
        prompt: u64,
        completion: u64,
    ) -> Reply {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                json!({"id": format!("call_{i}_{name}"), "type": "function",
                       "function": {"name": name, "arguments": args.to_string()}})
            })
            .collect();
        let content = if text.is_empty() {
            Value::Null
        } else {
            Value::String(text.to_owned())
        };
        Reply::completion(
            json!({"role": "assistant", "content": content, "tool_calls": calls}),
            prompt,
            completion,
        )
    }

    /// An error status with a JSON error body.
    pub fn status(status: u16) -> Reply {
        Reply::new(
            status,
            json!({"error": {"message": format!("scripted status {status}")}}).to_string(),
        )
    }

    /// A 200 whose body is not JSON.
    pub fn malformed() -> Reply {
        Reply::new(200, "{\"choices\": [ this is not json".into())
    }

    /// Adds a Retry-After header.
    pub fn retry_after(self, v: &str) -> Reply {
        self.header("retry-after", v)
    }

    /// Adds header `name: value` (e.g. `x-ratelimit-remaining-requests`).
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Replaces the body.
    pub fn body(mut self, b: &str) -> Reply {
        self.body = b.into();
        self
    }

    /// Waits this long before answering.
    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }

    /// Streamed, waits this long before each chunk.
    pub fn chunk_delay(mut self, d: Duration) -> Reply {
        self.chunk_delay = d;
        self
    }

    /// Streamed, sends no usage (as servers that ignore
    /// `stream_options.include_usage` do).
    pub fn without_stream_usage(mut self) -> Reply {
        self.usage_in_stream = false;
        self
    }

    /// Streamed, ends without a finish reason (then `[DONE]`), as
    /// llama.cpp's server ends a stream a newer request interrupted.
    pub fn cut(mut self) -> Reply {
        if let Ok(mut v) = serde_json::from_str::<Value>(&self.body) {
            v["choices"][0]["finish_reason"] = Value::Null;
            self.body = v.to_string();
        }
        self
    }

    /// With a finish reason other than the one it was made with (e.g.
    /// `length`).
    pub fn finish_reason(mut self, reason: &str) -> Reply {
        if let Ok(mut v) = serde_json::from_str::<Value>(&self.body) {
            v["choices"][0]["finish_reason"] = json!(reason);
            self.body = v.to_string();
        }
        self
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The `model` field.
    pub model: String,
    /// The whole body.
    pub body: Value,
    /// The Authorization header, if any.
    pub authorization: Option<String>,
    /// The x-api-key header (Anthropic's), if any.
    pub api_key: Option<String>,
    /// The anthropic-version header, if any.
    pub anthropic_version: Option<String>,
    /// Which route: `chat/completions` or `messages`.
    pub route: &'static str,
    /// The server's own time on it, from receipt to the reply being ready
    /// (including a scripted delay).
    pub handled: Duration,
    /// When it arrived.
    pub at: std::time::Instant,
}

#[derive(Default)]
struct Inner {
    queues: HashMap<String, VecDeque<Reply>>,
    fallback: Option<Reply>,
    received: Vec<Received>,
    models: Option<Vec<String>>,
    streams_dropped: usize,
    streams_finished: usize,
}

/// The script and the record of requests; clone it freely.
#[derive(Clone, Default)]
pub struct Script {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Script")
    }
}

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Script {
    /// An empty script: every request gets a 500 until replies are queued.
    pub fn new() -> Script {
        Script::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues replies for requests naming `model` (`*`: any model whose
    /// own queue is empty).
    pub fn for_model(&self, model: &str, replies: Vec<Reply>) {
        self.lock()
            .queues
            .entry(model.to_owned())
            .or_default()
            .extend(replies);
    }

    /// The reply when no queue has one left.
    pub fn otherwise(&self, reply: Reply) {
        self.lock().fallback = Some(reply);
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// How many requests arrived.
    pub fn count(&self) -> usize {
        self.lock().received.len()
    }

    /// The model of each request, in order.
    pub fn models_called(&self) -> Vec<String> {
        self.lock()
            .received
            .iter()
            .map(|r| r.model.clone())
            .collect()
    }

    /// The Authorization header of each request that had one.
    pub fn auth_headers(&self) -> Vec<String> {
        self.lock()
            .received
            .iter()
            .filter_map(|r| r.authorization.clone())
            .collect()
    }

    /// Lists these models at `GET /v1/models`.
    pub fn serve_models(&self, models: &[&str]) {
        self.lock().models = Some(models.iter().map(|m| (*m).to_owned()).collect());
    }

    /// Streams whose client went away before their last chunk.
    pub fn streams_dropped(&self) -> usize {
        self.lock().streams_dropped
    }

    /// Streams sent to their last chunk.
    pub fn streams_finished(&self) -> usize {
        self.lock().streams_finished
    }

    /// Forgets the requests received so far.
    pub fn clear_received(&self) {
        self.lock().received.clear();
    }

    /// Serves on an ephemeral loopback port (tests: a failure to bind
    /// loopback is a broken machine, so it panics).
    pub async fn serve(&self) -> Server {
        match self.serve_on("127.0.0.1:0").await {
            Ok(s) => s,
            Err(e) => panic!("scripted LLM server: cannot bind loopback: {e}"),
        }
    }

    /// Serves on `addr`.
    pub async fn serve_on(&self, addr: &str) -> std::io::Result<Server> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(openai))
            .route("/v1/messages", axum::routing::post(anthropic))
            .route("/v1/models", axum::routing::get(models))
            .with_state(self.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Server {
            addr,
            stop: Some(tx),
        })
    }
}

async fn models(State(script): State<Script>) -> Response {
    match script.lock().models.clone() {
        Some(m) => {
            let data: Vec<Value> = m
                .iter()
                .map(|id| json!({"id": id, "object": "model"}))
                .collect();
            axum::Json(json!({"object": "list", "data": data})).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no model list").into_response(),
    }
}

async fn openai(State(script): State<Script>, headers: HeaderMap, body: String) -> Response {
    answer(script, headers, body, "chat/completions").await
}

async fn anthropic(State(script): State<Script>, headers: HeaderMap, body: String) -> Response {
    answer(script, headers, body, "messages").await
}

async fn answer(script: Script, headers: HeaderMap, body: String, route: &'static str) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let started = std::time::Instant::now();
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let stream = body.get("stream") == Some(&json!(true));
    let include_usage = body.pointer("/stream_options/include_usage") == Some(&json!(true));
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let (reply, index) = {
        let mut s = script.lock();
        let index = s.received.len();
        s.received.push(Received {
            model: model.clone(),
            body,
            authorization: header("authorization"),
            api_key: header("x-api-key"),
            anthropic_version: header("anthropic-version"),
            route,
            handled: Duration::ZERO,
            at: std::time::Instant::now(),
        });
        let own = s.queues.get_mut(&model).and_then(VecDeque::pop_front);
        let reply = own
            .or_else(|| s.queues.get_mut("*").and_then(VecDeque::pop_front))
            .or_else(|| s.fallback.clone());
        (reply, index)
    };
    let Some(reply) = reply else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the script has no reply left",
        )
            .into_response();
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    if stream && reply.status == 200 {
        let events = match route {
            "messages" => anthropic_events(&reply.body),
            _ => openai_chunks(&reply.body, include_usage && reply.usage_in_stream),
        };
        if let Some(events) = events {
            if let Some(r) = script.lock().received.get_mut(index) {
                r.handled = started.elapsed();
            }
            return sse(script.clone(), events, reply.chunk_delay);
        }
    }
    let body = match route {
        "messages" if reply.status == 200 => as_message(&reply.body).unwrap_or(reply.body),
        _ => reply.body,
    };
    let mut resp = (
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        body,
    )
        .into_response();
    for (name, value) in &reply.headers {
        if let (Ok(n), Ok(v)) = (
            axum::http::HeaderName::try_from(name.as_str()),
            axum::http::HeaderValue::try_from(value.as_str()),
        ) {
            resp.headers_mut().insert(n, v);
        }
    }
    if let Some(r) = script.lock().received.get_mut(index) {
        r.handled = started.elapsed();
    }
    resp
}

/// A scripted chat completion in Anthropic's Messages shape; `None` for a
/// body that is not one (a malformed reply stays malformed).
fn as_message(completion: &str) -> Option<String> {
    let v: Value = serde_json::from_str(completion).ok()?;
    let message = v.pointer("/choices/0/message")?;
    let mut content = Vec::new();
    if let Some(text) = message.get("content").and_then(Value::as_str) {
        content.push(json!({"type": "text", "text": text}));
    }
    let calls = message.get("tool_calls").and_then(Value::as_array);
    for c in calls.into_iter().flatten() {
        let input: Value =
            serde_json::from_str(c.pointer("/function/arguments")?.as_str()?).ok()?;
        content.push(json!({"type": "tool_use", "id": c["id"], "name": c.pointer("/function/name")?, "input": input}));
    }
    let stop = if calls.is_some_and(|c| !c.is_empty()) {
        "tool_use"
    } else {
        "end_turn"
    };
    Some(
        json!({
            "id": "msg_scripted", "type": "message", "role": "assistant", "model": "scripted",
            "content": content, "stop_reason": stop,
            "usage": {"input_tokens": v.pointer("/usage/prompt_tokens"), "output_tokens": v.pointer("/usage/completion_tokens")},
        })
        .to_string(),
    )
}

/// Pieces of `text`, a few characters each (on character boundaries).
fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(4).map(|c| c.iter().collect()).collect()
}

/// A scripted chat completion as chat-completion chunks (`data:` events),
/// with a usage chunk when asked for, then `[DONE]`.
fn openai_chunks(completion: &str, usage: bool) -> Option<Vec<String>> {
    let v: Value = serde_json::from_str(completion).ok()?;
    let message = v.pointer("/choices/0/message")?;
    let finish = v
        .pointer("/choices/0/finish_reason")
        .cloned()
        .unwrap_or(json!("stop"));
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": "scripted",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    let mut out = vec![chunk(json!({"role": "assistant"}), Value::Null)];
    if let Some(text) = message.get("content").and_then(Value::as_str) {
        for p in pieces(text) {
            out.push(chunk(json!({"content": p}), Value::Null));
        }
    }
    let calls = message.get("tool_calls").and_then(Value::as_array);
    for (i, c) in calls.into_iter().flatten().enumerate() {
        let args = c.pointer("/function/arguments")?.as_str()?;
        out.push(chunk(
            json!({"tool_calls": [{"index": i, "id": c["id"], "type": "function", "function": {"name": c.pointer("/function/name")?, "arguments": ""}}]}),
            Value::Null,
        ));
        for p in pieces(args) {
            out.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}),
                Value::Null,
            ));
        }
    }
    out.push(chunk(json!({}), finish));
    if usage {
        out.push(
            json!({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "choices": [], "usage": v["usage"]})
                .to_string(),
        );
    }
    out.push("[DONE]".into());
    Some(out.into_iter().map(|d| format!("data: {d}\n\n")).collect())
}

/// A scripted chat completion as Anthropic's message stream.
fn anthropic_events(completion: &str) -> Option<Vec<String>> {
    let message: Value = serde_json::from_str(&as_message(completion)?).ok()?;
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut out = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"model": "scripted", "usage": {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 1}}}),
    )];
    for (i, block) in message["content"].as_array()?.iter().enumerate() {
        match block["type"].as_str()? {
            "text" => {
                out.push(event("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})));
                for p in pieces(block["text"].as_str()?) {
                    out.push(event("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": p}})));
                }
            }
            _ => {
                out.push(event("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}})));
                for p in pieces(&block["input"].to_string()) {
                    out.push(event("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": p}})));
                }
            }
        }
        out.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": i}),
        ));
    }
    out.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"]}, "usage": {"output_tokens": message["usage"]["output_tokens"]}}),
    ));
    out.push(event("message_stop", json!({"type": "message_stop"})));
    Some(out)
}

/// Counts a stream whose client left before its end.
struct Dropped {
    script: Script,
    done: bool,
}

impl Drop for Dropped {
    fn drop(&mut self) {
        let mut s = self.script.lock();
        if self.done {
            s.streams_finished += 1;
        } else {
            s.streams_dropped += 1;
        }
    }
}

/// Sends `events` as a server-sent event stream, `delay` before each.
fn sse(script: Script, events: Vec<String>, delay: Duration) -> Response {
    let guard = Dropped {
        script,
        done: false,
    };
    let state = (events.into_iter(), guard);
    let body = futures_util::stream::unfold(state, move |(mut events, mut guard)| async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        match events.next() {
            Some(e) => Some((Ok::<_, std::io::Error>(e), (events, guard))),
            None => {
                guard.done = true;
                drop(guard);
                None
            }
        }
    });
    (
        StatusCode::OK,
        [("content-type", "text/event-stream")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}
