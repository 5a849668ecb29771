//! The A2A door (Agent2Agent 1.0, the JSON-RPC and HTTP+JSON bindings):
//! a client that speaks
//! A2A continues work started through Switchyard's other doors. The job is
//! the A2A task (`taskId`, and its `contextId`): a message to a job with a
//! step waiting for input answers it (SendInput); a message to a
//! conversation is said in it (SendMessage), and the reply comes back as
//! the task's status message, the task then `input-required` until the
//! next message. `GetTask` and `CancelTask` read and cancel the job. Every
//! call is made as the authenticated caller, so the executor's checks —
//! who may read, answer or talk — are the ones that apply; nothing here
//! trusts a field of the message to say who is asking. Both bindings run
//! the same three operations; HTTP+JSON answers errors as A2A's
//! `google.rpc.Status` JSON with its `ErrorInfo` reason ([`REST_ERRORS`]).

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use switchyard_proto::executor::v1::{
    Job, JobState, SendInputRequest, SendMessageRequest, TaskState,
};
use tonic::{Code, Status};

use super::Door;
use crate::caller::Caller;

/// The A2A routes (their permissions are in the one table).
pub(super) fn routes() -> Router<Arc<Door>> {
    Router::new()
        .route("/.well-known/agent-card.json", get(card))
        .route("/.well-known/jwks.json", get(jwks))
        .route("/a2a", post(rpc))
        .route("/a2a/message:send", post(rest_send))
        .route("/a2a/tasks/{task_id}", get(rest_get).post(rest_cancel))
}

/// What signs the door's Agent Card: the deployment's key and the public
/// URL the card names (never the request's Host: a signed card saying
/// whatever host a client sent would vouch for that host).
pub struct CardSigner {
    /// The key.
    pub key: switchyard_a2a::signature::SigningKey,
    /// The door's public base URL, without a trailing `/`.
    pub public_url: String,
}

impl std::fmt::Debug for CardSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CardSigner")
            .field("kid", &self.key.kid())
            .field("public_url", &self.public_url)
            .finish()
    }
}

/// `GET /.well-known/jwks.json`: the card's signing key (404 when the card
/// is not signed).
async fn jwks(State(door): State<Arc<Door>>) -> Response {
    match &door.card {
        Some(c) => axum::Json(c.key.jwks()).into_response(),
        None => super::Failure(switchyard_kit::error::status(
            Code::NotFound,
            switchyard_core::Reason::RouteNotFound,
            "the Agent Card is not signed here: set gateway.a2a.public_url and signing_key_file",
        ))
        .into_response(),
    }
}

/// The longest a `SendMessage` to a conversation waits for the reply
/// before answering with the task still `working` (the client then polls
/// `GetTask`).
const REPLY_WAIT: Duration = Duration::from_secs(120);

/// `GET /.well-known/agent-card.json`: what this door offers, where —
/// signed with the deployment's key when it has one.
async fn card(State(door): State<Arc<Door>>, headers: http::HeaderMap) -> Response {
    let base = match &door.card {
        Some(c) => c.public_url.clone(),
        None => format!(
            "http://{}",
            headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("127.0.0.1")
        ),
    };
    let skill = |id: &str, description: &str| {
        json!({"id": id, "name": id, "description": description, "tags": ["switchyard"],
               "inputModes": ["text/plain", "application/json"], "outputModes": ["text/plain"]})
    };
    let card = json!({
        "name": "Switchyard",
        "description": "Continue Switchyard jobs over A2A: talk in a running conversation, or answer a step waiting for input. The task id (and context id) is the job id; send `Authorization: Bearer <api key or token>`.",
        "supportedInterfaces": [
            {"url": format!("{base}/a2a"), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": format!("{base}/a2a"), "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
        ],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": false},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain"],
        "skills": [
            skill("conversation", "Say something in a running conversation (a job with a conversation step): the reply is the task's status message, and the task waits for the next message (input-required) until the conversation ends."),
            skill("input", "Answer a job's step waiting for input: a data part is the answer as JSON, else the text is."),
        ],
    });
    let Some(signer) = &door.card else {
        return axum::Json(card).into_response();
    };
    let jku = format!("{}/.well-known/jwks.json", signer.public_url);
    match signer.key.sign(&card, &jku) {
        Ok(signed) => axum::Json(signed).into_response(),
        Err(e) => super::Failure(switchyard_kit::error::status(
            Code::Internal,
            switchyard_core::Reason::Internal,
            format!("signing the Agent Card failed: {e}"),
        ))
        .into_response(),
    }
}

/// A JSON-RPC failure: its code and message, with Switchyard's reason.
struct RpcError {
    code: i64,
    message: String,
    reason: String,
}

impl RpcError {
    fn params(message: impl Into<String>) -> RpcError {
        RpcError {
            code: -32602,
            message: message.into(),
            reason: "INVALID_ARGUMENT".into(),
        }
    }
}

impl From<Status> for RpcError {
    /// A2A's codes where it has one (task not found, not cancelable,
    /// unsupported), JSON-RPC's otherwise; the reason code beside it.
    fn from(s: Status) -> RpcError {
        let api = switchyard_kit::error::ApiError::from(s.clone());
        let code = match s.code() {
            Code::NotFound => -32001,
            Code::InvalidArgument => -32602,
            Code::FailedPrecondition => -32004,
            _ => -32603,
        };
        RpcError {
            code,
            message: api.message,
            reason: api.reason.unwrap_or_else(|| format!("{:?}", s.code())),
        }
    }
}

/// A request's body as JSON, at most the door's body limit; `None` when
/// it is not JSON (each binding says so its own way).
async fn json_body(door: &Door, body: Body) -> Result<Option<Value>, RpcError> {
    let bytes = axum::body::to_bytes(body, door.max_body)
        .await
        .map_err(|e| RpcError::params(format!("body: {e}")))?;
    Ok(serde_json::from_slice::<Value>(&bytes).ok())
}

/// `POST /a2a`: one JSON-RPC 2.0 request — `SendMessage`, `GetTask` or
/// `CancelTask` (and their A2A 0.3 names `message/send`, `tasks/get`,
/// `tasks/cancel`).
async fn rpc(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Response {
    let parsed = match json_body(&door, body).await {
        Ok(p) => p,
        Err(e) => return answer(Value::Null, Err(e)),
    };
    let Some(req) = parsed else {
        let parse = RpcError {
            code: -32700,
            message: "the body is not JSON: send a JSON-RPC 2.0 request".into(),
            reason: "INVALID_ARGUMENT".into(),
        };
        return answer(Value::Null, Err(parse));
    };
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    let params = req.get("params").cloned().unwrap_or(Value::Null);
    if let Err(refused) = own_tenant(&caller, &params) {
        return answer(id, Err(refused));
    }
    let method = req
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let out = match method {
        "SendMessage" | "message/send" => send(&door, &caller, &params).await,
        "GetTask" | "tasks/get" => match task_id(&params) {
            Ok(t) => get_task(&door, &caller, &t, None).await,
            Err(e) => Err(e),
        },
        "CancelTask" | "tasks/cancel" => match task_id(&params) {
            Ok(t) => cancel(&door, &caller, &t).await,
            Err(e) => Err(e),
        },
        other => Err(RpcError {
            code: -32601,
            message: format!(
                "method {other:?} is not served here: SendMessage, GetTask and CancelTask are (no streaming, no push notifications)"
            ),
            reason: "UNIMPLEMENTED".into(),
        }),
    };
    // A 0.3 client (its method names have a slash) reads 0.3's shapes.
    if method.contains('/') {
        return answer(id, out.map(|r| switchyard_a2a::v03::task(&r)));
    }
    answer(id, out)
}

/// A2A 1.0 multi-tenancy: a request may name its tenant (`tenant`). The
/// tenant is the caller's credential's; a named one must be that, never a
/// way to reach another tenant's tasks.
fn own_tenant(caller: &Caller, params: &Value) -> Result<(), RpcError> {
    match params
        .get("tenant")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        Some(t) if caller.principal.tenant_scope() != Some(t) => Err(RpcError {
            code: -32602,
            message: format!(
                "tenant {t:?} is not your tenant: the tenant is your credential's; name your own or none"
            ),
            reason: "PERMISSION_DENIED".into(),
        }),
        _ => Ok(()),
    }
}

/// `POST /a2a/message:send` (HTTP+JSON): the body is a
/// `SendMessageRequest`, as JSON-RPC's params.
async fn rest_send(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Response {
    let params = match json_body(&door, body).await {
        Err(e) => return rest(Err(e)),
        Ok(Some(v)) if v.is_object() => v,
        Ok(_) => {
            return rest(Err(RpcError::params(
                "the body is not a JSON SendMessageRequest object",
            )));
        }
    };
    if let Err(refused) = own_tenant(&caller, &params) {
        return rest(Err(refused));
    }
    rest(send(&door, &caller, &params).await)
}

/// `GET /a2a/tasks/{id}` (HTTP+JSON): GetTask.
async fn rest_get(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(task_id): Path<String>,
) -> Response {
    rest(get_task(&door, &caller, &task_id, None).await)
}

/// `POST /a2a/tasks/{id}:cancel` (HTTP+JSON): CancelTask. The custom
/// method is part of the last path segment, so it is read here.
async fn rest_cancel(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(segment): Path<String>,
) -> Response {
    match segment.strip_suffix(":cancel").filter(|id| !id.is_empty()) {
        Some(id) => rest(cancel(&door, &caller, id).await),
        None => rest(Err(RpcError {
            code: -32601,
            message: format!(
                "POST /a2a/tasks/{segment} is not served: POST /a2a/tasks/{{id}}:cancel is (and GET /a2a/tasks/{{id}}, POST /a2a/message:send)"
            ),
            reason: "UNIMPLEMENTED".into(),
        })),
    }
}

/// How each JSON-RPC error code is answered over HTTP+JSON: the HTTP
/// status, the `google.rpc.Code` name and A2A's `ErrorInfo` reason (as the
/// A2A 1.0 specification pairs them); anything else is an internal error.
const REST_ERRORS: [(i64, u16, &str, &str); 7] = [
    (-32001, 404, "NOT_FOUND", "TASK_NOT_FOUND"),
    (-32002, 400, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE"),
    (-32004, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION"),
    (-32602, 400, "INVALID_ARGUMENT", "INVALID_PARAMS"),
    (-32600, 400, "INVALID_ARGUMENT", "INVALID_REQUEST"),
    (-32700, 400, "INVALID_ARGUMENT", "INVALID_REQUEST"),
    (-32601, 404, "NOT_FOUND", "METHOD_NOT_FOUND"),
];

/// An HTTP+JSON answer: the result as the body, or the error as
/// `{"error": {code, status, message, details: [ErrorInfo]}}` with
/// Switchyard's reason in the ErrorInfo's metadata. A refusal for want of
/// permission is a 403 whatever its JSON-RPC code.
fn rest(out: Result<Value, RpcError>) -> Response {
    let e = match out {
        Ok(v) => return axum::Json(v).into_response(),
        Err(e) => e,
    };
    let (mut status, mut name, reason) = REST_ERRORS
        .iter()
        .find(|(code, ..)| *code == e.code)
        .map_or((500, "INTERNAL", "INTERNAL_ERROR"), |&(_, s, n, r)| {
            (s, n, r)
        });
    if e.reason == "PERMISSION_DENIED" {
        (status, name) = (403, "PERMISSION_DENIED");
    }
    let body = json!({"error": {"code": status, "status": name, "message": e.message,
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
            "domain": "a2a-protocol.org", "metadata": {"switchyard_reason": e.reason}}]}});
    let code =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    (code, axum::Json(body)).into_response()
}

/// The JSON-RPC response for request `id`.
fn answer(id: Value, out: Result<Value, RpcError>) -> Response {
    let body = match out {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": e.code, "message": e.message, "data": {"reason": e.reason}}}),
    };
    axum::Json(body).into_response()
}

/// `params.id` (A2A 1.0 and 0.3 both name the task so).
fn task_id(params: &Value) -> Result<String, RpcError> {
    match params.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => Ok(id.to_owned()),
        _ => Err(RpcError::params(
            "params.id (the task, that is the job id) is required",
        )),
    }
}

/// `SendMessage`: answers the job's step waiting for input, or says the
/// text in its conversation and waits for the reply.
async fn send(door: &Door, caller: &Caller, params: &Value) -> Result<Value, RpcError> {
    let m = params
        .get("message")
        .ok_or_else(|| RpcError::params("params.message is required"))?;
    let field = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or_default();
    let job_id = [field("taskId"), field("contextId")]
        .into_iter()
        .find(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            RpcError::params(
                "set message.taskId (or contextId) to the job id: this door continues work started through Switchyard's other doors (a conversation: SubmitJob, POST /aitp/tasks or `switchyard chat`)",
            )
        })?;
    let parts = m
        .get("parts")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let text: Vec<&str> = parts
        .iter()
        .filter_map(|p| p.get("text")?.as_str())
        .collect();
    let text = text.join("\n");
    let data = parts.iter().find_map(|p| p.get("data")).cloned();
    // The message id keys the answer or the message: a retried send is
    // taken once.
    let key = field("messageId").chars().take(128).collect::<String>();
    let waiting = door.jobs.input_requests(caller, &job_id).await?;
    let answer = || {
        let a = data.clone().unwrap_or_else(|| Value::String(text.clone()));
        Some(switchyard_kit::json::json_to_value(&a))
    };
    let to_input = |task_id: String| SendInputRequest {
        job_id: job_id.clone(),
        task_id,
        answer: answer(),
        idempotency_key: key.clone(),
    };
    // A step waiting for input takes it; a job that is no conversation
    // gets it as an answer too — the executor then finds the step (or the
    // one this message id already answered: a retry after a crash is
    // taken once) or says why none waits.
    let input = match waiting.requests.first() {
        Some(r) => Some(to_input(r.task_id.clone())),
        None => {
            let probe = switchyard_proto::executor::v1::ListMessagesRequest {
                job_id: job_id.clone(),
                ..Default::default()
            };
            match door.jobs.messages(caller, probe).await {
                Ok(_) => None,
                Err(_) => Some(to_input(String::new())),
            }
        }
    };
    if let Some(req) = input {
        // The answer's own outcome: a named answerer may not read the job.
        let out = door.jobs.send_input(caller, req).await?;
        let task = match out.job {
            Some(job) => task_of(&job, None),
            None => get_task(door, caller, &job_id, None).await?,
        };
        return Ok(json!({"task": task}));
    }
    if text.is_empty() {
        return Err(RpcError::params(
            "the message has no text part: a conversation is sent text",
        ));
    }
    let req = SendMessageRequest {
        job_id: job_id.clone(),
        text,
        idempotency_key: key,
        ..Default::default()
    };
    let sent = door.jobs.send_message(caller, req).await?;
    let reply = reply_to(
        door,
        caller,
        &job_id,
        &sent.task_id,
        sent.seq,
        sent.event_sequence,
    )
    .await;
    let task = get_task(door, caller, &job_id, reply).await?;
    Ok(json!({"task": task}))
}

/// A conversation as an A2A task, from what its participants may read
/// (ListMessages): ended, waiting for the next message, or answering;
/// `said` (else its last reply) as the agent's message.
fn talk_task(
    job_id: &str,
    h: &switchyard_proto::executor::v1::ListMessagesResponse,
    said: Option<String>,
) -> Value {
    let state = match (h.open, h.waiting) {
        (false, _) => "TASK_STATE_COMPLETED",
        (true, true) => "TASK_STATE_INPUT_REQUIRED",
        (true, false) => "TASK_STATE_WORKING",
    };
    let said = said.or_else(|| {
        h.turns
            .iter()
            .rev()
            .find_map(|t| t.reply.as_ref())
            .map(|r| r.text.clone())
    });
    task_json(job_id, state, said, h.turns.len())
}

/// The text of the reply to message `seq` of conversation step `task`,
/// followed on the job's log from `after`, within [`REPLY_WAIT`]; `None`
/// when it does not come in time (the task is then still working).
async fn reply_to(
    door: &Door,
    caller: &Caller,
    job_id: &str,
    task: &str,
    seq: u32,
    after: u64,
) -> Option<String> {
    let wait = async move {
        match door
            .jobs
            .watch(caller, job_id, after.saturating_sub(1))
            .await
        {
            Ok(mut w) => {
                while let Some(Ok(r)) = w.next().await {
                    let Some(e) = r.event else { continue };
                    if e.task_id == task
                        && e.kind == "conversation.replied"
                        && super::aitp::replied_seq(&e) == Some(seq)
                    {
                        let d = e.data.as_ref().map(switchyard_kit::json::struct_to_json)?;
                        return d["text"].as_str().map(str::to_owned);
                    }
                }
                None
            }
            // A participant who may not read the job cannot follow its
            // log: the conversation, which they may read, is asked again.
            Err(_) => loop {
                let req = switchyard_proto::executor::v1::ListMessagesRequest {
                    job_id: job_id.to_owned(),
                    task_id: task.to_owned(),
                    after_seq: seq.saturating_sub(1),
                };
                let h = door.jobs.messages(caller, req).await.ok()?;
                let reply = h
                    .turns
                    .iter()
                    .find(|t| t.seq == seq)
                    .and_then(|t| t.reply.as_ref());
                if let Some(r) = reply {
                    return Some(r.text.clone());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            },
        }
    };
    tokio::select! {
        r = wait => r,
        () = tokio::time::sleep(REPLY_WAIT) => None,
        () = door.shutdown.wait() => None,
    }
}

/// `GetTask`: the job as an A2A task; `said` is the agent's message to
/// carry (a conversation's reply), else what the job waits for or how it
/// ended.
async fn get_task(
    door: &Door,
    caller: &Caller,
    job_id: &str,
    said: Option<String>,
) -> Result<Value, RpcError> {
    let job = match door.jobs.get(caller, job_id).await {
        Ok(job) => job,
        // A conversation's participant or a named answerer need not be
        // able to read the job: what they may read answers for it.
        Err(refused) => {
            let req = switchyard_proto::executor::v1::ListMessagesRequest {
                job_id: job_id.to_owned(),
                ..Default::default()
            };
            if let Ok(h) = door.jobs.messages(caller, req).await {
                return Ok(talk_task(job_id, &h, said));
            }
            return match door.jobs.input_requests(caller, job_id).await {
                Ok(r) if !r.requests.is_empty() => Ok(task_json(
                    job_id,
                    "TASK_STATE_INPUT_REQUIRED",
                    r.requests.into_iter().next().map(|r| r.prompt),
                    0,
                )),
                _ => Err(refused.into()),
            };
        }
    };
    let waits = said.is_none() && job_waits(&job);
    // What it waits for: an input step's prompt, else the conversation's
    // last reply (a client that polls reads it here).
    let asked = if waits {
        door.jobs
            .input_requests(caller, job_id)
            .await
            .ok()
            .and_then(|r| r.requests.into_iter().next())
            .map(|r| r.prompt)
    } else {
        None
    };
    let replied = if waits && asked.is_none() {
        let req = switchyard_proto::executor::v1::ListMessagesRequest {
            job_id: job_id.to_owned(),
            ..Default::default()
        };
        door.jobs
            .messages(caller, req)
            .await
            .ok()
            .and_then(|h| h.turns.into_iter().rev().find_map(|t| t.reply))
            .map(|r| r.text)
    } else {
        None
    };
    Ok(task_of(&job, said.or(asked).or(replied)))
}

/// `CancelTask`: cancels the job.
async fn cancel(door: &Door, caller: &Caller, job_id: &str) -> Result<Value, RpcError> {
    let job = door
        .jobs
        .cancel(caller, job_id, "cancelled over A2A")
        .await?;
    Ok(task_of(&job, None))
}

/// Whether a step of `job` waits for a person (input or the next message).
fn job_waits(job: &Job) -> bool {
    job.tasks
        .iter()
        .any(|t| t.state == TaskState::InputRequired as i32)
}

/// The A2A state of `job`.
fn state_of(job: &Job) -> &'static str {
    match JobState::try_from(job.state).unwrap_or_default() {
        JobState::Completed => "TASK_STATE_COMPLETED",
        JobState::Cancelled => "TASK_STATE_CANCELED",
        JobState::Discarded | JobState::Retryable => "TASK_STATE_FAILED",
        JobState::Active if job_waits(job) => "TASK_STATE_INPUT_REQUIRED",
        JobState::Active => "TASK_STATE_WORKING",
        // Waiting for an approver to extend its budget, not for this
        // client's input: still in hand, it goes on once approved.
        JobState::BudgetPaused => "TASK_STATE_WORKING",
        _ => "TASK_STATE_SUBMITTED",
    }
}

/// `job` as an A2A `Task` (GetTask's and CancelTask's result; SendMessage
/// wraps it as `{"task": …}`), with `text` as the agent's status message
/// when there is one.
fn task_of(job: &Job, text: Option<String>) -> Value {
    let id = job.spec.as_ref().map_or("", |s| s.job_id.as_str());
    let text = text.or_else(|| (!job.error.is_empty()).then(|| job.error.clone()));
    task_json(id, state_of(job), text, job.last_sequence as usize)
}

/// An A2A `Task`: the job `id` (also its context) in `state`, with `text`
/// as the agent's status message (`mark` makes its message id unique).
fn task_json(id: &str, state: &str, text: Option<String>, mark: usize) -> Value {
    let mut status = json!({"state": state});
    if let Some(t) = text.filter(|t| !t.is_empty()) {
        status["message"] = json!({
            "messageId": format!("{id}-{mark}"),
            "contextId": id,
            "taskId": id,
            "role": "ROLE_AGENT",
            "parts": [{"text": t}],
        });
    }
    json!({"id": id, "contextId": id, "status": status})
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::executor::v1::{JobSpec, TaskStatus};

    fn job(state: JobState, task: TaskState) -> Job {
        Job {
            spec: Some(JobSpec {
                job_id: "j1".into(),
                ..Default::default()
            }),
            state: state as i32,
            tasks: vec![TaskStatus {
                state: task as i32,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_0_3_client_reads_the_task_bare_kind_tagged_in_0_3_words() {
        let sent = json!({"task": task_json("j1", "TASK_STATE_INPUT_REQUIRED", Some("Which region?".into()), 3)});
        assert_eq!(
            switchyard_a2a::v03::task(&sent),
            json!({"kind": "task", "id": "j1", "contextId": "j1", "status": {
                "state": "input-required",
                "message": {"kind": "message", "messageId": "j1-3", "contextId": "j1", "taskId": "j1",
                            "role": "agent", "parts": [{"kind": "text", "text": "Which region?"}]}}})
        );
        let got = task_json("j1", "TASK_STATE_CANCELED", None, 0);
        assert_eq!(
            switchyard_a2a::v03::task(&got),
            json!({"kind": "task", "id": "j1", "contextId": "j1", "status": {"state": "canceled"}})
        );
    }

    #[test]
    fn a_job_maps_to_the_a2a_state_a_client_acts_on() {
        let cases = [
            (
                JobState::Pending,
                TaskState::Waiting,
                "TASK_STATE_SUBMITTED",
            ),
            (JobState::Active, TaskState::Running, "TASK_STATE_WORKING"),
            (
                JobState::Active,
                TaskState::InputRequired,
                "TASK_STATE_INPUT_REQUIRED",
            ),
            (
                JobState::Completed,
                TaskState::Succeeded,
                "TASK_STATE_COMPLETED",
            ),
            (JobState::Discarded, TaskState::Failed, "TASK_STATE_FAILED"),
            (
                JobState::Cancelled,
                TaskState::Cancelled,
                "TASK_STATE_CANCELED",
            ),
        ];
        for (j, t, want) in cases {
            assert_eq!(state_of(&job(j, t)), want, "{j:?} {t:?}");
        }
    }

    #[test]
    fn the_task_is_the_job_and_carries_the_agents_words() {
        let t = task_of(
            &job(JobState::Active, TaskState::InputRequired),
            Some("Hello.".into()),
        );
        assert_eq!(t["id"], "j1");
        assert_eq!(t["contextId"], "j1");
        assert_eq!(t["status"]["message"]["role"], "ROLE_AGENT");
        assert_eq!(t["status"]["message"]["parts"][0]["text"], "Hello.");
        let quiet = task_of(&job(JobState::Active, TaskState::Running), None);
        assert!(quiet["status"].get("message").is_none());
    }
}
