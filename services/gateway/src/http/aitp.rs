//! AITP's endpoints (seed 002 §8) and what a REST user expects beside them:
//! submit, status, result, cancel, and the task's events as SSE.

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt as _;
use switchyard_core::Reason;
use switchyard_kit::error::status_with_metadata;
use switchyard_proto::executor::v1::{JobState, SubmitJobRequest};
use tonic::{Code, Status};

use super::shapes;
use super::{Door, Failure};
use crate::caller::{Caller, Jobs};
use switchyard_kit::shutdown::Shutdown;

/// The AITP routes (their permissions are in the one table).
pub(super) fn routes() -> Router<Arc<Door>> {
    Router::new()
        .route("/aitp/tasks", post(submit))
        .route("/aitp/tasks/{task_id}", get(status).delete(cancel))
        .route("/aitp/tasks/{task_id}/result", get(result))
        .route("/aitp/tasks/{task_id}/events", get(events))
        .route(
            "/aitp/tasks/{task_id}/input",
            get(input_requests).post(input),
        )
        .route(
            "/aitp/tasks/{task_id}/messages",
            get(messages).post(message),
        )
}

/// The body of `POST /aitp/tasks/{task_id}/messages`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageBody {
    /// What to say (empty only with `close`).
    #[serde(default)]
    text: String,
    /// End the conversation (after answering `text`, if any).
    #[serde(default)]
    close: bool,
    /// The conversation step (`subtask_id`); empty when the task has one.
    #[serde(default)]
    subtask_id: String,
    /// Makes a retry safe (else the `Idempotency-Key` header).
    #[serde(default)]
    idempotency_key: String,
}

/// `POST /aitp/tasks/{task_id}/messages`: sends a message to a
/// conversation (SendMessage). 202 with its number once it is durable; with
/// `Accept: text/event-stream`, the reply instead, as it is generated:
/// `llm.delta` events, then `conversation.replied`, then the stream ends.
async fn message(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: http::HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let (body, key) = door
        .keyed_json::<MessageBody>(
            body,
            "message",
            "{\"text\": …, \"close\": …, \"subtask_id\": …, \"idempotency_key\": …}",
            &headers,
            |b| b.idempotency_key.clone(),
        )
        .await?;
    // A bare close has no reply to stream.
    let req_closes_only = body.close && body.text.is_empty();
    let req = switchyard_proto::executor::v1::SendMessageRequest {
        job_id: id.clone(),
        task_id: body.subtask_id,
        text: body.text,
        close: body.close,
        idempotency_key: key,
    };
    let out = door.jobs.send_message(&caller, req).await?;
    let streams = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    if streams && !out.replayed && !req_closes_only {
        let watched = door.jobs.watch(&caller, &id, out.event_sequence).await?;
        let (task, seq) = (out.task_id.clone(), out.seq);
        // The task's deltas, then its reply to this message; then the end.
        let reply = futures_util::stream::unfold((watched, false), move |(mut w, done)| {
            let task = task.clone();
            async move {
                if done {
                    return None;
                }
                loop {
                    let e = match w.next().await? {
                        Ok(r) => r.event,
                        Err(_) => return None,
                    };
                    let Some(e) = e.filter(|e| {
                        e.task_id == task
                            && (e.kind == "llm.delta" || e.kind == "conversation.replied")
                    }) else {
                        continue;
                    };
                    let last = e.kind == "conversation.replied" && replied_seq(&e) == Some(seq);
                    let ev = Event::default()
                        .id(e.sequence.to_string())
                        .event(sse_name(&e.kind))
                        .json_data(shapes::event(&e))
                        .unwrap_or_default();
                    return Some((Ok::<_, std::convert::Infallible>(ev), (w, last)));
                }
            }
        })
        .take_until(async move { door.shutdown.wait().await });
        return Ok(Sse::new(reply)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    Ok((
        http::StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({
            "subtask_id": out.task_id,
            "seq": out.seq,
            "replayed": out.replayed,
            "event_sequence": out.event_sequence,
        })),
    )
        .into_response())
}

/// The message number a `conversation.replied` event answers.
pub(super) fn replied_seq(e: &switchyard_proto::common::v1::Event) -> Option<u32> {
    match e.data.as_ref()?.fields.get("seq")?.kind.as_ref()? {
        prost_types::value::Kind::NumberValue(n) => Some(*n as u32),
        _ => None,
    }
}

/// Query of `GET /aitp/tasks/{task_id}/messages`.
#[derive(serde::Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct MessagesQuery {
    /// Only messages numbered above this.
    after_seq: u32,
    /// The conversation step; empty when the task has one.
    subtask_id: String,
}

/// `GET /aitp/tasks/{task_id}/messages`: the conversation so far
/// (ListMessages): each message with its reply.
async fn messages(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    axum::extract::Query(q): axum::extract::Query<MessagesQuery>,
) -> Result<Response, Failure> {
    let req = switchyard_proto::executor::v1::ListMessagesRequest {
        job_id: id.clone(),
        task_id: q.subtask_id,
        after_seq: q.after_seq,
    };
    let out = door.jobs.messages(&caller, req).await?;
    let ms =
        |t: &Option<prost_types::Timestamp>| t.as_ref().map(switchyard_kit::time::timestamp_ms);
    let turns: Vec<serde_json::Value> = out
        .turns
        .iter()
        .map(|t| {
            serde_json::json!({
                "seq": t.seq,
                "text": t.text,
                "by": t.by,
                "close": t.close,
                "sent_at_ms": ms(&t.sent_at),
                "reply": t.reply.as_ref().map(|r| serde_json::json!({
                    "outcome": switchyard_proto::executor::v1::ReplyOutcome::try_from(r.outcome)
                        .map(|o| o.as_str_name().trim_start_matches("REPLY_OUTCOME_").to_ascii_lowercase())
                        .unwrap_or_default(),
                    "text": r.text,
                    "model": r.model,
                    "total_tokens": r.usage.as_ref().map_or(0, |u| u.total_tokens),
                    "reason": r.reason,
                    "replied_at_ms": ms(&r.replied_at),
                    "agent_id": r.agent_id,
                })),
            })
        })
        .collect();
    Ok(axum::Json(serde_json::json!({
        "task_id": id,
        "subtask_id": out.task_id,
        "open": out.open,
        "waiting": out.waiting,
        "active_agent": out.active_agent,
        "spend": out.agents.iter().map(|a| serde_json::json!({
            "agent_id": a.agent_id, "turns": a.turns, "tokens": a.tokens,
            "cost_micro_usd": a.cost_micro_usd,
        })).collect::<Vec<_>>(),
        "messages": turns,
    }))
    .into_response())
}

/// The body of `POST /aitp/tasks/{task_id}/input`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct InputBody {
    /// The answer: any JSON value the step's schema accepts.
    answer: Option<serde_json::Value>,
    /// The waiting step (`subtask_id`); empty when one step waits.
    #[serde(default)]
    subtask_id: String,
    /// Makes a retry safe (else the `Idempotency-Key` header).
    #[serde(default)]
    idempotency_key: String,
}

/// `POST /aitp/tasks/{task_id}/input`: answers a step waiting for input
/// (SendInput): 200 with who answered and the task's status; a retry with
/// the same key answers the first outcome (`replayed`).
async fn input(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: http::HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let (body, key) = door
        .keyed_json::<InputBody>(
            body,
            "answer",
            "{\"answer\": …, \"subtask_id\": …, \"idempotency_key\": …}",
            &headers,
            |b| b.idempotency_key.clone(),
        )
        .await?;
    let req = switchyard_proto::executor::v1::SendInputRequest {
        job_id: id,
        task_id: body.subtask_id,
        answer: body
            .answer
            .as_ref()
            .map(switchyard_kit::json::json_to_value),
        idempotency_key: key,
    };
    let out = door.jobs.send_input(&caller, req).await?;
    let now = switchyard_kit::time::now_ms();
    Ok(axum::Json(serde_json::json!({
        "subtask_id": out.task_id,
        "answered_by": out.answered_by,
        "replayed": out.replayed,
        "status": out.job.as_ref().map(|j| shapes::status(j, now)),
    }))
    .into_response())
}

/// `GET /aitp/tasks/{task_id}/input`: the task's steps waiting for input
/// that the caller may answer (ListInputRequests).
async fn input_requests(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let out = door.jobs.input_requests(&caller, &id).await?;
    let waiting: Vec<serde_json::Value> = out
        .requests
        .iter()
        .map(|r| {
            serde_json::json!({
                "subtask_id": r.task_id,
                "prompt": r.prompt,
                "answer_schema": r.answer_schema.as_ref().map(switchyard_kit::json::struct_to_json),
                "asked_at_ms": r.asked_at.as_ref().map(switchyard_kit::time::timestamp_ms),
                "deadline_ms": r.deadline.as_ref().map(switchyard_kit::time::timestamp_ms),
            })
        })
        .collect();
    Ok(axum::Json(serde_json::json!({ "task_id": id, "waiting": waiting })).into_response())
}

/// Media types a task document may come in (the executor reads JSON or
/// YAML alike); none given is taken as JSON.
fn accepted_media_type(headers: &http::HeaderMap) -> Result<(), Status> {
    let Some(ct) = headers.get(http::header::CONTENT_TYPE) else {
        return Ok(());
    };
    let essence = ct
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/json" | "application/yaml" | "application/x-yaml" | "text/yaml" => Ok(()),
        _ => Err(switchyard_kit::error::status(
            Code::InvalidArgument,
            Reason::UnsupportedMediaType,
            format!(
                "a task document is sent as application/json (or application/yaml), not {:?}",
                switchyard_core::validate::clamp(&essence, 80)
            ),
        )),
    }
}

/// `POST /aitp/tasks`: 201 with the new task's id and status and a
/// `Location`; 200 when a task with this `task_id` and the same document
/// already exists (a retried submission runs once).
async fn submit(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    headers: http::HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    accepted_media_type(&headers)?;
    let bytes = door.read_body(body, "task document").await?;
    let document = String::from_utf8(bytes.to_vec())
        .map_err(|_| super::malformed("document", "the body is not valid UTF-8 text"))?;
    let req = SubmitJobRequest {
        document,
        format: "aitp".into(),
        ..Default::default()
    };
    let out = door.jobs.submit(&caller, req).await?;
    let job = out
        .job
        .ok_or_else(|| Status::internal("SubmitJob answered without a job"))?;
    let id = shapes::job_id(&job).to_owned();
    let code = if out.created {
        http::StatusCode::CREATED
    } else {
        http::StatusCode::OK
    };
    let location = format!("/aitp/tasks/{}", crate::console::encode(&id));
    Ok((
        code,
        [(http::header::LOCATION, location)],
        axum::Json(shapes::submitted(&job)),
    )
        .into_response())
}

/// `GET /aitp/tasks/{task_id}`: status and progress.
async fn status(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let job = door.jobs.get(&caller, &id).await?;
    let now = switchyard_kit::time::now_ms();
    Ok(axum::Json(shapes::status(&job, now)).into_response())
}

/// `GET /aitp/tasks/{task_id}/result`: 409 until the task has finished.
async fn result(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let r = door.jobs.result(&caller, &id).await?;
    let state = JobState::try_from(r.state).unwrap_or(JobState::Unspecified);
    if !shapes::finished(state) {
        return Err(not_finished(&id, state).into());
    }
    Ok(axum::Json(shapes::result(&r)).into_response())
}

/// JOB_NOT_FINISHED, saying how to follow the task instead.
pub(crate) fn not_finished(id: &str, state: JobState) -> Status {
    let name = state
        .as_str_name()
        .trim_start_matches("JOB_STATE_")
        .to_ascii_lowercase();
    status_with_metadata(
        Code::FailedPrecondition,
        Reason::JobNotFinished,
        format!(
            "task {:?} has not finished (it is {name}), so it has no result yet; follow GET /aitp/tasks/{{task_id}}/events, or ask again once it has finished",
            switchyard_core::validate::clamp(id, 100)
        ),
        switchyard_kit::error::metadata([("task_id", id.to_owned()), ("state", name)]),
    )
}

/// `DELETE /aitp/tasks/{task_id}`: cancels; answers the status.
async fn cancel(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let job = door
        .jobs
        .cancel(&caller, &id, "cancelled through the AITP REST door")
        .await?;
    let now = switchyard_kit::time::now_ms();
    Ok(axum::Json(shapes::status(&job, now)).into_response())
}

/// `GET /aitp/tasks/{task_id}/events`: the job's events as Server-Sent
/// Events (`id` = the event's sequence, `event` = its kind), resumable with
/// `Last-Event-ID`; an `end` event with the final status closes the stream.
async fn events(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: http::HeaderMap,
) -> Result<Response, Failure> {
    Ok(event_stream(
        &door.jobs,
        door.shutdown.clone(),
        caller,
        id,
        &headers,
        true,
    )
    .await?)
}

/// Job `id`'s events, as `caller` may see them, as Server-Sent Events: each
/// with `id` = its sequence and its data in [`shapes::event`]'s shape;
/// `named` gives each the event name of its kind (else the default
/// `message`, for a page that follows them all with one handler). Resumes
/// after `Last-Event-ID`; an `end` event with the final status closes the
/// stream (an EventSource would otherwise reconnect), as does `shutdown`.
pub(crate) async fn event_stream(
    jobs: &Jobs,
    shutdown: Shutdown,
    caller: Caller,
    id: String,
    headers: &http::HeaderMap,
    named: bool,
) -> Result<Response, Status> {
    let after = match headers.get("last-event-id") {
        None => 0,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                let mut v = switchyard_core::Violations::new();
                v.add("Last-Event-ID", "must be the sequence number of an event (the `id` of an event this stream sent)");
                switchyard_kit::error::invalid_argument(Reason::InvalidArgument, &v)
            })?,
    };
    let watched = jobs.watch(&caller, &id, after).await?;
    // The last `job.state` seen says how the job ended, so the `end` event
    // needs no further call unless the stream resumed past it.
    let ended: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let seen = ended.clone();
    let events = watched.map(move |item| match item {
        Ok(w) => {
            let e = w.event.unwrap_or_default();
            if e.kind == "job.state"
                && let Some(to) = e.data.as_ref().and_then(|d| d.fields.get("to"))
                && let Some(prost_types::value::Kind::StringValue(to)) = &to.kind
            {
                *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(to.clone());
            }
            let ev = Event::default().id(e.sequence.to_string());
            let ev = if named {
                ev.event(sse_name(&e.kind))
            } else {
                ev
            };
            ev.json_data(shapes::event(&e))
        }
        Err(s) => {
            let request_id = switchyard_kit::context::current()
                .map(|c| c.correlation_id)
                .unwrap_or_default();
            Event::default()
                .event("error")
                .json_data(switchyard_kit::error::http_error(&s, &request_id).1)
        }
    });
    // The final status once the log ends, so a client knows to stop.
    let end_jobs = jobs.clone();
    let end = futures_util::stream::once(async move {
        let state = ended.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let state = state.as_deref().and_then(|s| {
            JobState::from_str_name(&format!("JOB_STATE_{}", s.to_ascii_uppercase()))
        });
        match state {
            Some(state) if shapes::finished(state) => Event::default()
                .event("end")
                .json_data(shapes::ended(&id, state)),
            _ => match end_jobs.get(&caller, &id).await {
                Ok(j) => Event::default()
                    .event("end")
                    .json_data(shapes::submitted(&j)),
                Err(s) => Event::default()
                    .event("error")
                    .json_data(switchyard_kit::error::http_error(&s, "").1),
            },
        }
    });
    let stream = events
        .chain(end)
        .take_until(async move { shutdown.wait().await });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// An event kind as an SSE event name (kinds are dotted words already;
/// anything else is made safe for the `event:` line).
fn sse_name(kind: &str) -> String {
    kind.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect()
}
