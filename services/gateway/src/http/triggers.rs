//! `POST /v1/triggers/{trigger_id}/events`: a webhook that starts a
//! trigger's job from the JSON event in its body (FireTrigger), as the
//! trigger's creator, once per event id.
//!
//! The sender authenticates like every caller of the door (a bearer key of
//! the trigger's creator or of a sender it names). The event id comes from
//! the `Idempotency-Key`, `X-Event-Id` or `ce-id` header, or, for a
//! CloudEvents structured body (it has `specversion`), its `id`.

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use switchyard_proto::executor::v1::FireTriggerRequest;

use super::{Door, Failure};
use crate::caller::Caller;

/// The triggers' route (its permission is in the one table).
pub(super) fn routes() -> Router<Arc<Door>> {
    Router::new().route("/v1/triggers/{trigger_id}/events", post(deliver))
}

/// Headers that may carry an event's id, in the order they are read.
const ID_HEADERS: [&str; 3] = ["idempotency-key", "x-event-id", "ce-id"];

async fn deliver(
    State(door): State<Arc<Door>>,
    Extension(caller): Extension<Caller>,
    Path(trigger_id): Path<String>,
    headers: http::HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let bytes = door.read_body(body, "event").await?;
    let event: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        super::malformed(
            "body",
            format!("the event is not JSON ({e}); send the event as a JSON object"),
        )
    })?;
    if !event.is_object() {
        return Err(super::malformed("body", "the event must be a JSON object (`{...}`)").into());
    }
    let from_header = ID_HEADERS.iter().find_map(|h| {
        headers
            .get(*h)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    });
    let cloud_event_id = event
        .get("specversion")
        .and(event.get("id"))
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    let Some(event_id) = from_header.or(cloud_event_id) else {
        return Err(super::malformed(
            "event_id",
            "the event has no id: send it in the Idempotency-Key (or X-Event-Id, ce-id) header, or as a CloudEvent's `id`, so a repeat starts nothing",
        )
        .into());
    };
    let req = FireTriggerRequest {
        trigger_id,
        event: switchyard_kit::json::json_to_struct(&event),
        event_id: event_id.clone(),
    };
    let out = door.jobs.fire_trigger(&caller, req).await?;
    let job = out.job.unwrap_or_default();
    let body = serde_json::json!({
        "job_id": job.spec.as_ref().map(|s| s.job_id.clone()).unwrap_or_default(),
        "state": switchyard_proto::executor::v1::JobState::try_from(job.state)
            .map(|s| s.as_str_name().trim_start_matches("JOB_STATE_").to_ascii_lowercase())
            .unwrap_or_default(),
        "event_id": event_id,
        "created": out.created,
    });
    let code = if out.created {
        http::StatusCode::CREATED
    } else {
        http::StatusCode::OK
    };
    Ok((code, axum::Json(body)).into_response())
}
