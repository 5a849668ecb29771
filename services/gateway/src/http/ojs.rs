//! The OJS HTTP binding (Open Job Spec 1.0): producers enqueue with
//! `POST /ojs/v1/jobs`, pull workers `POST /ojs/v1/workers/fetch`, then
//! `ack`, `nack` and `heartbeat`.
//!
//! An OJS job is a queue job (the executor's `ojs-queue` format: one queue
//! task on `options.queue`) unless its type is in `gateway.ojs.run_types`;
//! those Switchyard runs itself (format `ojs`: an LLM task with the
//! `ext_agent_*` fields, or an agent call). Either way it is approved and
//! budgeted first: a job that may spend (a declared budget, a model) waits
//! in `pending` for its approval run unless a policy approves it; what is
//! approved at once is `available`.
//!
//! The job's OJS state is its job state; while a queue job is active, its
//! task says more: `available` (offered, no worker holds it), `active`
//! (leased) or `retryable` (backing off). Responses use the OJS media type,
//! `OJS-Version: 1.0`, and the OJS error envelope
//! `{"error": {code, message, retryable, details, request_id, hint?, docs_url?}}`.

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt as _;
use serde_json::{Map, Value, json};
use switchyard_core::Reason;
use switchyard_kit::error::{ApiError, invalid_field};
use switchyard_kit::json::{json_to_value, struct_to_json, value_to_json};
use switchyard_proto::executor::v1::{
    AckRequest, Attempt, FetchRequest, HeartbeatRequest, Job, JobState, ListJobsRequest,
    NackRequest, SubmitJobRequest, TaskRef, TaskState, TaskStatus, WorkerError, WorkerState,
    task_spec::Kind,
};
use tonic::{Code, Status};

use super::Door;
use crate::caller::Caller;

/// The OJS media type.
pub const MEDIA_TYPE: &str = "application/openjobspec+json";
/// The OJS version this binding speaks.
pub const VERSION: &str = "1.0";
/// Where the OJS error codes are explained.
const DOCS_URL: &str = "https://github.com/switchyard-dev/switchyard/blob/main/docs/ojs.md";

/// The OJS routes (their permissions are in the one table).
pub(super) fn routes() -> Router<Arc<Door>> {
    Router::new()
        .route("/ojs/manifest", get(manifest))
        .route("/ojs/v1/health", get(health))
        .route("/ojs/v1/jobs", post(enqueue))
        .route("/ojs/v1/jobs/batch", post(enqueue_batch))
        .route("/ojs/v1/jobs/{id}", get(info).delete(cancel))
        .route("/ojs/v1/jobs/{id}/activate", post(activate))
        .route("/ojs/v1/workers/fetch", post(fetch))
        .route("/ojs/v1/workers/ack", post(ack))
        .route("/ojs/v1/workers/nack", post(nack))
        .route("/ojs/v1/workers/heartbeat", post(heartbeat))
        .route("/ojs/v1/events", get(events))
        .route("/ojs/v1/dead-letter", get(dead_letter))
        .route(
            "/ojs/v1/dead-letter/{id}",
            axum::routing::delete(dead_letter_delete),
        )
        .route("/ojs/v1/dead-letter/{id}/retry", post(dead_letter_retry))
}

/// An error in the OJS envelope.
#[derive(Debug)]
pub(crate) struct OjsFailure(Status);

impl From<Status> for OjsFailure {
    fn from(s: Status) -> Self {
        OjsFailure(s)
    }
}

/// `(HTTP status, body)` of an OJS error from the status a gRPC caller
/// would get: the OJS code, whether retrying may help, Switchyard's reason
/// and field violations in `details`.
pub fn ojs_error(s: &Status, request_id: &str) -> (http::StatusCode, Value) {
    let api = ApiError::from(s.clone());
    let reason = api.reason.clone().unwrap_or_default();
    let is = |r: Reason| reason == r.as_str();
    let mut http = switchyard_kit::error::http_status(s);
    let (code, kind, retryable) = match s.code() {
        // OJS: the dead letter has no such job.
        _ if is(Reason::NotInDeadLetter) => {
            http = http::StatusCode::NOT_FOUND;
            ("not_found", "not_found", false)
        }
        // Too large is the request's fault: retrying it unchanged cannot help.
        _ if is(Reason::MessageTooLarge) => {
            http = http::StatusCode::PAYLOAD_TOO_LARGE;
            ("request_too_large", "validation_error", false)
        }
        Code::InvalidArgument | Code::OutOfRange if is(Reason::MalformedRequest) => {
            ("invalid_payload", "validation_error", false)
        }
        Code::InvalidArgument | Code::OutOfRange => {
            // A retry policy that cannot be followed: well-formed but
            // unprocessable.
            if api
                .violations
                .iter()
                .any(|v| v.field.starts_with("options.retry"))
            {
                http = http::StatusCode::UNPROCESSABLE_ENTITY;
            }
            ("invalid_request", "validation_error", false)
        }
        Code::NotFound => ("not_found", "not_found", false),
        Code::AlreadyExists => ("duplicate", "conflict", false),
        Code::FailedPrecondition | Code::Aborted => ("conflict", "conflict", false),
        Code::Unauthenticated => ("unauthenticated", "auth_error", false),
        Code::PermissionDenied => ("forbidden", "auth_error", false),
        Code::ResourceExhausted => ("rate_limited", "rate_limited", true),
        Code::Unavailable | Code::DeadlineExceeded => ("unavailable", "unavailable", true),
        _ => ("internal_error", "internal_error", true),
    };
    let fields: Vec<Value> = api
        .violations
        .iter()
        .map(|v| json!({"field": v.field, "description": v.description}))
        .collect();
    let mut err = json!({
        "code": code,
        "type": kind,
        "message": api.message,
        "retryable": retryable,
        "details": {"reason": reason, "fields": fields},
        "request_id": request_id,
    });
    if code == "not_found" {
        err["hint"] = json!(
            "check the job id (a UUIDv7 from the enqueue response); jobs of other tenants, and of other submitters for a producer, are not visible"
        );
        err["docs_url"] = json!(format!("{DOCS_URL}#errors"));
    } else if code == "conflict" {
        err["docs_url"] = json!(format!("{DOCS_URL}#states"));
    }
    (http, json!({ "error": err }))
}

impl IntoResponse for OjsFailure {
    fn into_response(self) -> Response {
        let request_id = switchyard_kit::context::current()
            .map(|c| c.correlation_id)
            .unwrap_or_default();
        let (code, body) = ojs_error(&self.0, &request_id);
        let mut resp = ojs(code, body);
        if code == http::StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was never read: the connection cannot
            // carry another request, and the client is told so.
            resp.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        resp
    }
}

/// A response in the OJS media type with its version header.
fn ojs(code: http::StatusCode, body: Value) -> Response {
    (
        code,
        [
            (http::header::CONTENT_TYPE, MEDIA_TYPE),
            (http::HeaderName::from_static("ojs-version"), VERSION),
        ],
        body.to_string(),
    )
        .into_response()
}

fn ok(body: Value) -> Result<Response, OjsFailure> {
    Ok(ojs(http::StatusCode::OK, body))
}

/// The request body as a JSON object (`invalid_payload` otherwise).
async fn body_object(door: &Door, body: Body) -> Result<Map<String, Value>, Status> {
    let bytes = door.read_body(body, "body").await?;
    let malformed = |why: String| super::malformed("body", why);
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(malformed("the body must be a JSON object".into())),
        Err(e) if bytes.is_empty() => Err(malformed(format!(
            "the body is empty; send a JSON object ({e})"
        ))),
        Err(e) => Err(malformed(format!("the body is not valid JSON: {e}"))),
    }
}

fn rfc3339(t: Option<&prost_types::Timestamp>) -> Option<Value> {
    t.map(|t| {
        let ms = switchyard_kit::time::timestamp_ms(t);
        Value::String(switchyard_kit::time::timestamp(ms).to_string())
    })
}

/// The job's one queue task (or first task) and its spec's queue payload.
fn main_task(j: &Job) -> Option<&TaskStatus> {
    j.tasks.first()
}

/// An attempt's error in OJS shape.
fn attempt_error(a: &Attempt) -> Value {
    let code = if a.error_code.is_empty() {
        a.reason.to_ascii_lowercase()
    } else {
        a.error_code.clone()
    };
    let kind = if a.error_type.is_empty() {
        code.clone()
    } else {
        a.error_type.clone()
    };
    let message = if a.worker_message.is_empty() {
        &a.error
    } else {
        &a.worker_message
    };
    let mut e = json!({
        "code": code,
        "type": kind,
        "message": message,
        "attempt": a.number,
        "reason": a.reason,
    });
    if let Some(t) = rfc3339(a.finished_at.as_ref()) {
        e["occurred_at"] = t;
    }
    e
}

/// The OJS state of a job (see the module docs).
pub fn ojs_state(j: &Job) -> &'static str {
    let state = JobState::try_from(j.state).unwrap_or(JobState::Unspecified);
    match state {
        JobState::Active => {
            let Some(t) = main_task(j) else {
                return "active";
            };
            match TaskState::try_from(t.state).unwrap_or(TaskState::Unspecified) {
                TaskState::Retrying | TaskState::Deferred => "retryable",
                TaskState::Running => {
                    let queue = j
                        .spec
                        .as_ref()
                        .and_then(|s| s.tasks.first())
                        .is_some_and(|t| matches!(t.kind, Some(Kind::Queue(_))));
                    let leased = t.attempts.last().is_some_and(|a| a.finished_at.is_none());
                    if queue && !leased {
                        "available"
                    } else {
                        "active"
                    }
                }
                TaskState::Waiting | TaskState::Ready => "available",
                _ => "active",
            }
        }
        JobState::Pending => "pending",
        JobState::Scheduled => "scheduled",
        JobState::Available => "available",
        JobState::Completed => "completed",
        // Seed 000: a job its token budget stopped is `retryable`; here it
        // waits for its extension (ext_agent_state says so).
        JobState::Retryable | JobState::BudgetPaused => "retryable",
        JobState::Cancelled => "cancelled",
        JobState::Discarded => "discarded",
        JobState::Unspecified => "unknown",
    }
}

/// A job in OJS shape: the envelope as submitted (meta, options, `ext_*`,
/// unknown fields) with the server's fields over it.
pub fn ojs_job(j: &Job) -> Value {
    let spec = j.spec.clone().unwrap_or_default();
    let mut o: Map<String, Value> = spec
        .envelope
        .as_ref()
        .map(struct_to_json)
        .and_then(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        })
        .unwrap_or_default();
    let task_spec = spec.tasks.first();
    let (queue, args, retry) = match task_spec.and_then(|t| t.kind.as_ref()) {
        Some(Kind::Queue(q)) => (
            q.queue.clone(),
            q.payload.as_ref().map_or(json!([]), value_to_json),
            task_spec.and_then(|t| t.retry.clone()),
        ),
        _ => (
            if spec.queue.is_empty() {
                "default".into()
            } else {
                spec.queue.clone()
            },
            o.get("args").cloned().unwrap_or(json!([])),
            task_spec.and_then(|t| t.retry.clone()),
        ),
    };
    let state = ojs_state(j);
    let t = main_task(j);
    o.insert("specversion".into(), json!(VERSION));
    o.insert("id".into(), json!(spec.job_id));
    o.insert(
        "type".into(),
        json!(
            spec.labels
                .get("ojs.type")
                .cloned()
                .unwrap_or(spec.plan_id.clone())
        ),
    );
    o.insert("queue".into(), json!(queue));
    o.insert("args".into(), args);
    o.insert("priority".into(), json!(spec.priority));
    o.insert("state".into(), json!(state));
    let attempts: Vec<&Attempt> = t.map(|t| t.attempts.iter().collect()).unwrap_or_default();
    o.insert("attempt".into(), json!(attempts.len()));
    o.insert(
        "max_attempts".into(),
        json!(retry.as_ref().map_or(1, |r| r.max_retries + 1)),
    );
    if let Some(ts) = rfc3339(j.created_at.as_ref()) {
        o.insert("created_at".into(), ts.clone());
        o.insert("enqueued_at".into(), ts);
    }
    if let Some(ts) = rfc3339(spec.scheduled_at.as_ref()) {
        o.insert("scheduled_at".into(), ts);
    }
    if let Some(ts) = rfc3339(t.and_then(|t| t.started_at.as_ref())) {
        o.insert("started_at".into(), ts);
    }
    let finished = rfc3339(j.finished_at.as_ref());
    match state {
        "completed" => {
            o.extend(finished.map(|f| ("completed_at".into(), f)));
        }
        "discarded" => {
            if let Some(f) = finished {
                o.insert("completed_at".into(), f.clone());
                o.insert("discarded_at".into(), f);
            }
        }
        "cancelled" => {
            o.extend(finished.map(|f| ("cancelled_at".into(), f)));
        }
        _ => {}
    }
    if let Some(ts) = rfc3339(t.and_then(|t| t.next_attempt_at.as_ref())) {
        o.insert("next_attempt_at".into(), ts);
    }
    // How long the job waited before this attempt, after the last one failed.
    if let [.., before, last] = attempts.as_slice()
        && let (Some(end), Some(start)) = (before.finished_at.as_ref(), last.started_at.as_ref())
    {
        let waited = switchyard_kit::time::timestamp_ms(start)
            .saturating_sub(switchyard_kit::time::timestamp_ms(end));
        o.insert("retry_delay_ms".into(), json!(waited));
    }
    let errors: Vec<Value> = attempts
        .iter()
        .filter(|a| !a.error.is_empty())
        .map(|a| attempt_error(a))
        .collect();
    if state != "completed"
        && let Some(last) = errors.last()
    {
        o.insert("error".into(), last.clone());
    }
    o.insert("errors".into(), Value::Array(errors));
    if let Some(out) = t.and_then(|t| t.output.as_ref()) {
        o.insert("result".into(), struct_to_json(out));
    }
    if let Some(spec_t) = task_spec
        && spec_t.timeout_secs > 0
    {
        o.insert(
            "timeout_ms".into(),
            json!(u64::from(spec_t.timeout_secs) * 1000),
        );
    }
    // OJS has no state for a job waiting for a person: it stays `active`,
    // and the extension says which steps wait (answered over gRPC, REST,
    // A2A or the console).
    let waiting: Vec<&str> = j
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::InputRequired as i32)
        .map(|t| t.task_id.as_str())
        .collect();
    if !waiting.is_empty() {
        o.insert("ext_agent_state".into(), json!("input_required"));
        o.insert("ext_agent_waiting_for_input".into(), json!(waiting));
    }
    // Paused by its budget (OJS `retryable`): what ran out, and the
    // extension run a person approves for it to go on.
    if j.state == JobState::BudgetPaused as i32
        && let Some(p) = &j.budget_pause
    {
        o.insert("ext_agent_state".into(), json!("budget_paused"));
        o.insert(
            "ext_agent_budget_pause".into(),
            json!({
                "run_id": p.run_id,
                "dimension": p.dimension,
                "message": p.message,
                "tokens": p.tokens,
                "cost_micro_usd": p.cost.map_or(0, |m| m.micro_usd),
                "remaining_tasks": p.remaining_tasks,
            }),
        );
    }
    if o.keys().any(|k| k.starts_with("ext_agent_")) || j.tokens_used > 0 {
        o.insert("ext_agent_tokens_used".into(), json!(j.tokens_used));
    }
    Value::Object(o)
}

// ------------------------------------------------------------- handlers

async fn manifest() -> Response {
    ojs(
        http::StatusCode::OK,
        json!({
            "specversion": VERSION,
            "ojs_version": VERSION,
            "implementation": {
                "name": "switchyard",
                "version": env!("CARGO_PKG_VERSION"),
                "vendor": "Switchyard",
            },
            "conformance_level": 1,
            "protocols": ["http", "grpc"],
            "extensions": ["ext-ai-agents"],
            "backend": "sled",
            "capabilities": {
                "batch_enqueue": true,
                "dead_letter": true,
                "pending_approval": true,
                "heartbeat": true,
            },
        }),
    )
}

async fn health() -> Response {
    ojs(
        http::StatusCode::OK,
        json!({"status": "ok", "version": VERSION, "implementation": "switchyard"}),
    )
}

/// Submits one OJS job object: a queue job, or one Switchyard runs.
async fn submit_one(
    door: &Door,
    caller: &Caller,
    job: &Map<String, Value>,
) -> Result<(Job, bool), Status> {
    let job_type = job.get("type").and_then(Value::as_str).unwrap_or_default();
    let format = if door.ojs.runs(job_type) {
        "ojs"
    } else {
        "ojs-queue"
    };
    let req = SubmitJobRequest {
        document: Value::Object(job.clone()).to_string(),
        format: format.into(),
        ..Default::default()
    };
    let out = door.jobs.submit(caller, req).await?;
    Ok((answered(out.job, "SubmitJob")?, out.created))
}

/// `POST /ojs/v1/jobs`: 201 with the job; 200 for a repeat of an existing
/// job (same id, same content); 409 `duplicate` for another job's id.
async fn enqueue(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<Response, OjsFailure> {
    let o = body_object(&door, body).await?;
    let (job, created) = submit_one(&door, &caller, &o).await?;
    let code = if created {
        http::StatusCode::CREATED
    } else {
        http::StatusCode::OK
    };
    let id = job
        .spec
        .as_ref()
        .map(|s| s.job_id.clone())
        .unwrap_or_default();
    let mut resp = ojs(code, json!({ "job": ojs_job(&job) }));
    if let Ok(v) = http::HeaderValue::from_str(&format!("/ojs/v1/jobs/{id}")) {
        resp.headers_mut().insert(http::header::LOCATION, v);
    }
    Ok(resp)
}

/// `POST /ojs/v1/jobs/batch` `{"jobs": [...]}`: every job is checked
/// first (ValidateJob-equivalent conversion happens in SubmitJob), then
/// submitted in order; the first refusal stops the batch and names its
/// index — jobs before it stay enqueued (each is idempotent by id, so a
/// client retries the batch with ids and loses nothing).
async fn enqueue_batch(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<Response, OjsFailure> {
    let o = body_object(&door, body).await?;
    let Some(Value::Array(jobs)) = o.get("jobs") else {
        return Err(invalid_field("jobs", "a batch is {\"jobs\": [job, ...]}").into());
    };
    if jobs.is_empty() || jobs.len() > 1000 {
        return Err(invalid_field("jobs", "a batch has 1 to 1000 jobs").into());
    }
    let mut out = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        let Value::Object(j) = j else {
            return Err(invalid_field(&format!("jobs[{i}]"), "each job is a JSON object").into());
        };
        match submit_one(&door, &caller, j).await {
            Ok((job, _)) => out.push(ojs_job(&job)),
            Err(s) => {
                let msg = format!(
                    "jobs[{i}]: {} ({} enqueued before it)",
                    s.message(),
                    out.len()
                );
                return Err(
                    Status::with_details(s.code(), msg, s.details().to_vec().into()).into(),
                );
            }
        }
    }
    Ok(ojs(
        http::StatusCode::CREATED,
        json!({"count": out.len(), "jobs": out}),
    ))
}

async fn info(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, OjsFailure> {
    let job = door.jobs.get(&caller, &id).await?;
    ok(json!({ "job": ojs_job(&job) }))
}

async fn cancel(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, OjsFailure> {
    let job = door.jobs.cancel(&caller, &id, "cancelled over OJS").await?;
    ok(json!({ "job": ojs_job(&job) }))
}

/// `POST /ojs/v1/jobs/{id}/activate`: OJS `pending` is the approval gate,
/// so activating is approving the job's run, as the caller — an approver
/// (`run.decide`) other than the submitter (the approval service checks
/// both). Answers once the executor has moved the job on (`available` or
/// `scheduled`), or with it still `pending` when its policy wants a second
/// approver.
async fn activate(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, OjsFailure> {
    let job = door.jobs.get(&caller, &id).await?;
    if job.state != JobState::Pending as i32 {
        let state = ojs_state(&job);
        return Err(switchyard_kit::error::status(
            Code::FailedPrecondition,
            Reason::TransitionNotAllowed,
            format!("job {id} is {state}, not pending: only a pending job is activated"),
        )
        .into());
    }
    if job.run_id.is_empty() {
        return Err(switchyard_kit::error::status(
            Code::Unavailable,
            Reason::DependencyUnavailable,
            format!("job {id} waits for a service before its approval run exists; activate it again shortly"),
        )
        .into());
    }
    door.jobs
        .approve(&caller, &job.run_id, "activated over OJS")
        .await?;
    // The executor follows the run and moves the job: wait for that move
    // (bounded), so the answer shows where the job went.
    if let Ok(mut events) = door.jobs.watch(&caller, &id, job.last_sequence).await {
        let moved = async {
            while let Some(Ok(ev)) = events.next().await {
                if ev.event.is_some_and(|e| e.kind == "job.state") {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(ACTIVATE_WAIT, moved).await;
    }
    let job = door.jobs.get(&caller, &id).await?;
    ok(json!({ "job": ojs_job(&job) }))
}

/// How long activate waits for the executor to move an approved job.
const ACTIVATE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The worker id of a request, or one for the caller when it sent none.
fn worker_of(o: &Map<String, Value>, caller: &Caller) -> String {
    match o.get("worker_id").and_then(Value::as_str) {
        Some(w) if !w.is_empty() => w.to_owned(),
        _ => format!("ojs:{}", caller.principal.subject),
    }
}

fn ms_duration(o: &Map<String, Value>, k: &str) -> Option<prost_types::Duration> {
    o.get(k)
        .and_then(Value::as_u64)
        .map(switchyard_kit::time::duration)
}

async fn fetch(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<Response, OjsFailure> {
    let o = body_object(&door, body).await?;
    let queues = match o.get("queues") {
        Some(Value::Array(a)) if a.iter().all(Value::is_string) && !a.is_empty() => a
            .iter()
            .filter_map(|q| q.as_str().map(str::to_owned))
            .collect(),
        None => vec!["default".to_owned()],
        _ => {
            return Err(
                invalid_field("queues", "queues is a non-empty array of queue names").into(),
            );
        }
    };
    let req = FetchRequest {
        queues,
        count: o.get("count").and_then(Value::as_u64).unwrap_or(1).min(100) as u32,
        worker_id: worker_of(&o, &caller),
        visibility_timeout: ms_duration(&o, "visibility_timeout_ms"),
        wait: Some(switchyard_kit::time::duration(
            o.get("wait_ms")
                .and_then(Value::as_u64)
                .unwrap_or(door.ojs.fetch_wait_ms)
                .min(30_000),
        )),
    };
    let out = door.jobs.fetch(&caller, req).await?;
    let jobs: Vec<Value> = out
        .tasks
        .iter()
        .filter_map(|t| {
            let mut j = ojs_job(t.job.as_ref()?);
            j["lease_expires_at"] = rfc3339(t.lease_expires_at.as_ref()).unwrap_or(Value::Null);
            if !t.budget_id.is_empty() {
                j["ext_agent_budget_id"] = json!(t.budget_id);
                // What the worker passes as `invocation_grant` to spend on it.
                j["ext_agent_grant"] = json!(t.grant);
            }
            Some(j)
        })
        .collect();
    ok(json!({"jobs": jobs, "state": worker_state(out.state)}))
}

fn worker_state(s: i32) -> &'static str {
    match WorkerState::try_from(s).unwrap_or(WorkerState::Running) {
        WorkerState::Quiet => "quiet",
        WorkerState::Terminate => "terminate",
        _ => "running",
    }
}

fn job_ref(o: &Map<String, Value>) -> Result<TaskRef, Status> {
    let id = o
        .get("job_id")
        .or_else(|| o.get("id"))
        .and_then(Value::as_str);
    match id {
        Some(id) if !id.is_empty() => Ok(TaskRef {
            job_id: id.to_owned(),
            task_id: String::new(),
            attempt: o.get("attempt").and_then(Value::as_u64).unwrap_or(0) as u32,
        }),
        _ => Err(invalid_field("job_id", "name the job you fetched: job_id")),
    }
}

/// The artifacts of an ack (a Switchyard extension of the OJS ack body):
/// `"artifacts": [{"name", "kind", "media_type", "content_base64"}]`.
fn ack_artifacts(
    o: &Map<String, Value>,
) -> Result<Vec<switchyard_proto::common::v1::NewArtifact>, Status> {
    use base64::Engine as _;
    let Some(list) = o.get("artifacts").filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let Some(list) = list.as_array() else {
        return Err(invalid_field(
            "artifacts",
            "artifacts is an array of {name, kind, media_type, content_base64}",
        ));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, a) in list.iter().enumerate() {
        let field = |k: &str| format!("artifacts[{i}].{k}");
        let kind = a["kind"].as_str().unwrap_or("file");
        let Some(kind) = switchyard_core::artifact::ArtifactKind::parse(kind) else {
            return Err(invalid_field(
                &field("kind"),
                "kind is one of file, changeset_bundle, draft_pr, issue_comment, test_plan",
            ));
        };
        let content = base64::engine::general_purpose::STANDARD
            .decode(a["content_base64"].as_str().unwrap_or_default())
            .map_err(|e| invalid_field(&field("content_base64"), format!("not base64: {e}")))?;
        out.push(switchyard_proto::common::v1::NewArtifact {
            name: a["name"].as_str().unwrap_or_default().to_owned(),
            kind: switchyard_api::artifacts::proto_kind(kind) as i32,
            media_type: a["media_type"].as_str().unwrap_or_default().to_owned(),
            content,
        });
    }
    Ok(out)
}

/// Text field `k` of `o` (empty when absent or not text).
fn text(o: &Map<String, Value>, k: &str) -> String {
    o.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The job a WorkerService answer carries.
fn answered(job: Option<Job>, rpc: &str) -> Result<Job, Status> {
    job.ok_or_else(|| Status::internal(format!("{rpc} answered without a job")))
}

/// An ack's or nack's answer: the job's id, state, attempt and times at the
/// top (as OJS clients read them), and the whole job.
fn settled(job: &Job, extra: Map<String, Value>) -> Value {
    let view = ojs_job(job);
    let mut o = Map::new();
    for k in [
        "id",
        "state",
        "attempt",
        "max_attempts",
        "completed_at",
        "discarded_at",
        "next_attempt_at",
    ] {
        if let Some(v) = view.get(k) {
            o.insert(k.into(), v.clone());
        }
    }
    o.insert("job_id".into(), view["id"].clone());
    o.extend(extra);
    o.insert("job".into(), view);
    Value::Object(o)
}

async fn ack(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<Response, OjsFailure> {
    let o = body_object(&door, body).await?;
    let req = AckRequest {
        task: Some(job_ref(&o)?),
        worker_id: text(&o, "worker_id"),
        result: o.get("result").map(json_to_value),
        tokens_used: o
            .get("ext_agent_tokens_used")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        artifacts: ack_artifacts(&o)?,
    };
    let job = answered(door.jobs.ack(&caller, req).await?.job, "Ack")?;
    let mut extra = Map::new();
    extra.insert("acknowledged".into(), json!(true));
    ok(settled(&job, extra))
}

async fn nack(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<Response, OjsFailure> {
    let o = body_object(&door, body).await?;
    let e = o
        .get("error")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let error = WorkerError {
        code: text(&e, "code"),
        message: text(&e, "message"),
        retryable: e.get("retryable").and_then(Value::as_bool),
        r#type: text(&e, "type"),
        details: e
            .get("details")
            .and_then(switchyard_kit::json::json_to_struct),
    };
    let req = NackRequest {
        task: Some(job_ref(&o)?),
        worker_id: text(&o, "worker_id"),
        error: Some(error),
        requeue: o.get("requeue").and_then(Value::as_bool).unwrap_or(false),
    };
    let out = door.jobs.nack(&caller, req).await?;
    let job = answered(out.job, "Nack")?;
    let mut extra = Map::new();
    if out.retry_delay_ms > 0 {
        extra.insert("retry_delay_ms".into(), json!(out.retry_delay_ms));
    }
    ok(settled(&job, extra))
}

async fn heartbeat(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    body: Body,
) -> Result<Response, OjsFailure> {
    let o = body_object(&door, body).await?;
    let Some(worker_id) = o
        .get("worker_id")
        .and_then(Value::as_str)
        .filter(|w| !w.is_empty())
    else {
        return Err(invalid_field("worker_id", "name the worker whose leases to extend").into());
    };
    let ids: Vec<String> = o
        .get("active_jobs")
        .or_else(|| o.get("active"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let req = HeartbeatRequest {
        worker_id: worker_id.to_owned(),
        active: ids
            .iter()
            .map(|id| TaskRef {
                job_id: id.clone(),
                ..Default::default()
            })
            .collect(),
        visibility_timeout: ms_duration(&o, "visibility_timeout_ms"),
    };
    let out = door.jobs.heartbeat(&caller, req).await?;
    let state = worker_state(out.state);
    let lost: Vec<&str> = out.lost.iter().map(|r| r.job_id.as_str()).collect();
    ok(json!({
        "state": state,
        "lost_jobs": lost,
        "extended": out.extended,
        "server_time": rfc3339(Some(&switchyard_kit::time::timestamp(switchyard_kit::time::now_ms()))),
    }))
}

/// A query string's `key=value` pairs (a key alone has an empty value).
fn pairs(query: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
}

/// A `limit` query parameter: 1 to 1000.
fn limit_of(v: &str) -> Result<usize, Status> {
    v.parse::<usize>()
        .map(|n| n.clamp(1, 1000))
        .map_err(|_| invalid_field("limit", "limit is a number from 1 to 1000"))
}

/// `GET /ojs/v1/dead-letter?limit=&cursor=`: the caller's dead-lettered
/// jobs (discarded with `on_exhaustion: "dead_letter"`), newest first, each
/// with its `errors`; `next_cursor` pages on.
async fn dead_letter(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> Result<Response, OjsFailure> {
    let mut req = ListJobsRequest {
        dead_letter: true,
        page_size: 100,
        ..Default::default()
    };
    for (k, v) in pairs(query.as_deref()) {
        match k {
            "limit" => req.page_size = limit_of(v)? as u32,
            "cursor" => req.page_token = v.to_owned(),
            _ => {}
        }
    }
    let page = door.jobs.list(&caller, req).await?;
    let jobs: Vec<Value> = page.jobs.iter().map(ojs_job).collect();
    let next = (!page.next_page_token.is_empty()).then_some(page.next_page_token);
    ok(json!({"jobs": jobs, "count": jobs.len(), "next_cursor": next}))
}

/// `POST /ojs/v1/dead-letter/{id}/retry`: the job goes back to work with
/// no attempts, approved and budgeted anew (`available` when a policy
/// approves it at once, else `pending`).
async fn dead_letter_retry(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, OjsFailure> {
    let job = door.jobs.retry_dead_letter(&caller, &id).await?;
    ok(json!({ "job": ojs_job(&job) }))
}

/// `DELETE /ojs/v1/dead-letter/{id}`: the job is removed for good.
async fn dead_letter_delete(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, OjsFailure> {
    door.jobs.delete_dead_letter(&caller, &id).await?;
    ok(json!({"deleted": true, "job_id": id}))
}

/// `GET /ojs/v1/events?types=&queues=&limit=`: the lifecycle events of the
/// caller's recent jobs (`job.enqueued`, `job.started`, `job.completed`,
/// `job.failed`, `job.cancelled`), newest first, read from the jobs'
/// durable records.
async fn events(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> Result<Response, OjsFailure> {
    let mut types: Vec<String> = Vec::new();
    let mut queues: Vec<String> = Vec::new();
    let mut limit = 100usize;
    for (k, v) in pairs(query.as_deref()) {
        let list = || v.split(',').filter(|s| !s.is_empty()).map(str::to_owned);
        match k {
            "types" => types.extend(list()),
            "queues" => queues.extend(list()),
            "limit" => limit = limit_of(v)?,
            _ => {}
        }
    }
    let page = door
        .jobs
        .list(
            &caller,
            ListJobsRequest {
                page_size: 1000,
                ..Default::default()
            },
        )
        .await?;
    let mut events: Vec<(u64, Value)> = Vec::new();
    for j in &page.jobs {
        let view = ojs_job(j);
        let queue = view["queue"].as_str().unwrap_or_default().to_owned();
        if !queues.is_empty() && !queues.contains(&queue) {
            continue;
        }
        let ms = |t: Option<&prost_types::Timestamp>| t.map(switchyard_kit::time::timestamp_ms);
        let created = ms(j.created_at.as_ref());
        let started = ms(j.tasks.first().and_then(|t| t.started_at.as_ref()));
        let finished = ms(j.finished_at.as_ref());
        let data = |extra: Value| {
            let mut d = json!({
                "job_id": view["id"], "job_type": view["type"], "queue": queue,
                "attempt": view["attempt"],
            });
            if let (Value::Object(d), Value::Object(e)) = (&mut d, extra) {
                d.extend(e);
            }
            d
        };
        let mut add = |kind: &str, at: Option<u64>, d: Value| {
            if let Some(at) = at
                && (types.is_empty() || types.iter().any(|t| t == kind))
            {
                let time = switchyard_kit::time::timestamp(at).to_string();
                events.push((
                    at,
                    json!({"specversion": VERSION, "type": kind, "time": time, "subject": view["id"], "data": d}),
                ));
            }
        };
        add("job.enqueued", created, data(json!({})));
        add("job.started", started, data(json!({})));
        let duration = json!({"duration_ms": finished.zip(started.or(created)).map(|(f, s)| f.saturating_sub(s))});
        match view["state"].as_str() {
            Some("completed") => add("job.completed", finished, data(duration)),
            Some("discarded") => add(
                "job.failed",
                finished,
                data(json!({"error": view.get("error")})),
            ),
            Some("cancelled") => add("job.cancelled", finished, data(json!({}))),
            _ => {}
        }
    }
    events.sort_by_key(|e| std::cmp::Reverse(e.0));
    events.truncate(limit);
    let events: Vec<Value> = events.into_iter().map(|(_, e)| e).collect();
    ok(json!({ "events": events }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_waiting_for_a_person_stays_active_and_names_the_steps_that_wait() {
        let task = |id: &str, state: TaskState| TaskStatus {
            task_id: id.into(),
            state: state as i32,
            ..Default::default()
        };
        let mut j = Job {
            state: switchyard_proto::executor::v1::JobState::Active as i32,
            tasks: vec![
                task("ask", TaskState::InputRequired),
                task("deploy", TaskState::Waiting),
            ],
            ..Default::default()
        };
        let view = ojs_job(&j);
        assert_eq!(view["state"], "active", "{view}");
        assert_eq!(view["ext_agent_state"], "input_required");
        assert_eq!(view["ext_agent_waiting_for_input"], json!(["ask"]));
        j.tasks[0].state = TaskState::Succeeded as i32;
        let view = ojs_job(&j);
        assert!(view.get("ext_agent_state").is_none(), "{view}");
    }
}
