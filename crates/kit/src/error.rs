//! Errors on the wire: a gRPC code, a human message, a `google.rpc.ErrorInfo`
//! whose `reason` comes from [`switchyard_core::Reason`], and for invalid input
//! a `google.rpc.BadRequest` listing every field violation.
//!
//! Services build statuses with [`status`] / [`invalid_argument`] inside one
//! exhaustive `match` per error enum; clients read them back with [`ApiError`].

use std::collections::HashMap;
use std::fmt;

use switchyard_core::reason::DOMAIN;
use switchyard_core::validate::clamp;
use switchyard_core::{FieldViolation, Reason, Violations};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo` metadata from key/value pairs.
pub fn metadata<const N: usize>(pairs: [(&str, String); N]) -> HashMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A status with an `ErrorInfo` reason and optional metadata.
pub fn status(code: Code, reason: Reason, message: impl Into<String>) -> Status {
    status_with_metadata(code, reason, message, HashMap::new())
}

/// A status with an `ErrorInfo` reason and metadata (e.g. the field or id concerned).
pub fn status_with_metadata(
    code: Code,
    reason: Reason,
    message: impl Into<String>,
    metadata: HashMap<String, String>,
) -> Status {
    // Messages and metadata may quote what a client sent: bounded, so an
    // error never echoes unbounded input nor outgrows a client's header
    // limit (grpcio's is 16 KiB).
    let metadata = metadata
        .into_iter()
        .map(|(k, v)| (k, clamp(&v, MAX_METADATA_VALUE)))
        .collect::<HashMap<_, _>>();
    Status::with_error_details(
        code,
        clamp(&message.into(), MAX_MESSAGE),
        ErrorDetails::with_error_info(reason.as_str(), DOMAIN, metadata),
    )
}

/// Longest message a status carries.
const MAX_MESSAGE: usize = 1_000;
/// Longest `ErrorInfo` metadata value.
const MAX_METADATA_VALUE: usize = 200;
/// Most field positions one status carries.
const MAX_POSITIONS: usize = 20;
/// Bytes of field violations one status lists (the rest are counted):
/// with base64 and the message, well under 8 KiB of headers.
const MAX_DETAILS_BYTES: usize = 4_000;

/// INVALID_ARGUMENT with `reason` and a BadRequest carrying every violation.
pub fn invalid_argument(reason: Reason, violations: &Violations) -> Status {
    invalid_argument_at(reason, violations, &std::collections::BTreeMap::new())
}

/// INVALID_ARGUMENT (`INVALID_ARGUMENT`) for one field: `field` and what it
/// must be.
pub fn invalid_field(field: &str, description: impl Into<String>) -> Status {
    let mut v = Violations::new();
    v.add(field, description);
    invalid_argument(Reason::InvalidArgument, &v)
}

/// `ErrorInfo.metadata` key prefix of a field's position in the document
/// the client sent: `at.tasks[1].depends_on` = `line 7, column 5`.
pub const POSITION_KEY: &str = "at.";

/// [`invalid_argument`], with where each field stands in the document
/// (field path → `line L, column C`) as `ErrorInfo` metadata, so the
/// descriptions keep their exact texts.
pub fn invalid_argument_at(
    reason: Reason,
    violations: &Violations,
    positions: &std::collections::BTreeMap<String, String>,
) -> Status {
    let metadata: HashMap<String, String> = violations
        .0
        .iter()
        .take(MAX_POSITIONS)
        .filter_map(|v| {
            let at = positions.get(&v.field)?;
            Some((
                format!(
                    "{POSITION_KEY}{}",
                    clamp(&v.field, switchyard_core::validate::MAX_FIELD)
                ),
                at.clone(),
            ))
        })
        .collect();
    let mut details = ErrorDetails::with_error_info(reason.as_str(), DOMAIN, metadata);
    // Every violation while they fit a byte budget (the details travel
    // base64-encoded in one header); the rest are counted.
    let mut budget = MAX_DETAILS_BYTES;
    let mut listed = 0;
    for v in &violations.0 {
        let field = clamp(&v.field, switchyard_core::validate::MAX_FIELD);
        let description = clamp(&v.description, switchyard_core::validate::MAX_DESCRIPTION);
        let size = field.len() + description.len();
        if size > budget {
            break;
        }
        budget -= size;
        listed += 1;
        details.add_bad_request_violation(field, description);
    }
    if listed < violations.0.len() {
        let more = violations.0.len() - listed;
        details.add_bad_request_violation("", format!("and {more} more problems"));
    }
    Status::with_error_details(
        Code::InvalidArgument,
        clamp(&violations.to_string(), MAX_MESSAGE),
        details,
    )
}

/// An error as a client sees it, rebuilt from a `Status`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// gRPC code.
    pub code: Code,
    /// `ErrorInfo.reason`, when the server sent one.
    pub reason: Option<String>,
    /// Human message.
    pub message: String,
    /// `ErrorInfo.metadata`.
    pub metadata: HashMap<String, String>,
    /// BadRequest field violations.
    pub violations: Vec<FieldViolation>,
    /// The request's correlation id, when the server sent it back
    /// (`x-correlation-id`); empty otherwise.
    pub request_id: String,
}

impl ApiError {
    /// Where `field` stands in the document sent (`line 4, column 5`),
    /// when the server said.
    pub fn position(&self, field: &str) -> Option<&str> {
        self.metadata
            .get(&format!("{POSITION_KEY}{field}"))
            .map(String::as_str)
    }

    /// The catalogued reason, when known to this build.
    pub fn known_reason(&self) -> Option<Reason> {
        self.reason.as_deref().and_then(Reason::parse)
    }
}

/// True when `s` says the service could not be reached or could not answer
/// right now, rather than that it refused the request: UNAVAILABLE (a
/// connection refused or reset, a service starting, storage failing), or a
/// transport-level failure without a server's `ErrorInfo` (a connection
/// that dropped mid-request). A call that failed this way may be repeated;
/// one a server refused with a reason may not.
pub fn is_outage(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable => true,
        Code::Unknown | Code::Cancelled | Code::Internal => {
            s.get_error_details().error_info().is_none()
                && (std::error::Error::source(s).is_some() || {
                    let m = s.message();
                    m.contains("transport error")
                        || m.contains("connection")
                        || m.contains("h2 protocol error")
                        || m.contains("broken pipe")
                })
        }
        _ => false,
    }
}

impl From<Status> for ApiError {
    fn from(s: Status) -> Self {
        let details = s.get_error_details();
        let (reason, metadata) = match details.error_info() {
            Some(info) => (Some(info.reason.clone()), info.metadata.clone()),
            None => (None, HashMap::new()),
        };
        let violations = details
            .bad_request()
            .map(|b| {
                b.field_violations
                    .iter()
                    .map(|v| FieldViolation {
                        field: v.field.clone(),
                        description: v.description.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let request_id = s
            .metadata()
            .get(crate::context::CORRELATION_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        ApiError {
            code: s.code(),
            reason,
            message: s.message().to_owned(),
            metadata,
            violations,
            request_id,
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = self.reason.as_deref().unwrap_or(match self.code {
            Code::Unavailable => "UNAVAILABLE",
            _ => "ERROR",
        });
        if self.violations.is_empty() {
            write!(f, "{reason}: {}", self.message)
        } else {
            write!(f, "{reason}: invalid request")?;
            for v in &self.violations {
                write!(f, "\n  {}: {}", v.field, v.description)?;
                if let Some(at) = self.position(&v.field) {
                    write!(f, " ({at})")?;
                }
            }
            Ok(())
        }
    }
}

impl std::error::Error for ApiError {}

/// The HTTP status answering a gRPC status on an HTTP route: the usual
/// mapping (google.rpc), except that a refused precondition (a job that
/// already finished, a transition the state table refuses) is 409 Conflict,
/// which is what an HTTP client branches on, and an oversized body is 413.
pub fn http_status(s: &Status) -> http::StatusCode {
    let reason = s.get_error_details().error_info().map(|i| i.reason.clone());
    status_for(s.code(), reason.as_deref())
}

/// The HTTP status of gRPC `code` with catalogue `reason` (see
/// [`http_status`]).
fn status_for(code: Code, reason: Option<&str>) -> http::StatusCode {
    use http::StatusCode as H;
    if reason == Some(Reason::MessageTooLarge.as_str()) {
        return H::PAYLOAD_TOO_LARGE;
    }
    if reason == Some(Reason::UnsupportedMediaType.as_str()) {
        return H::UNSUPPORTED_MEDIA_TYPE;
    }
    match code {
        Code::Ok => H::OK,
        Code::InvalidArgument | Code::OutOfRange => H::BAD_REQUEST,
        Code::Unauthenticated => H::UNAUTHORIZED,
        Code::PermissionDenied => H::FORBIDDEN,
        Code::NotFound => H::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted | Code::FailedPrecondition => H::CONFLICT,
        Code::ResourceExhausted => H::TOO_MANY_REQUESTS,
        Code::Cancelled => H::from_u16(499).unwrap_or(H::BAD_REQUEST),
        Code::Unimplemented => H::NOT_IMPLEMENTED,
        Code::Unavailable => H::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => H::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => H::INTERNAL_SERVER_ERROR,
    }
}

/// The one error envelope of every HTTP route (the gateway's doors and
/// `/metrics`), built from the same status a gRPC caller gets:
///
/// ```json
/// {"error": {"code": 400, "status": "INVALID_ARGUMENT", "reason": "INVALID_TASK_NUMBERING",
///            "message": "…", "fields": [{"field": "…", "description": "…", "at": "line 3, column 7"}],
///            "metadata": {…}, "request_id": "…"}}
/// ```
///
/// `reason` is the catalogue's (as `ErrorInfo.reason` over gRPC), `fields`
/// the BadRequest violations, `request_id` the request's correlation id.
pub fn http_error(s: &Status, request_id: &str) -> (http::StatusCode, serde_json::Value) {
    envelope(&ApiError::from(s.clone()), request_id)
}

/// [`http_error`]'s envelope of an error already read from a status: the
/// CLI prints the same one under `-o json` (with an empty `request_id`
/// when the server named none).
pub fn envelope(api: &ApiError, request_id: &str) -> (http::StatusCode, serde_json::Value) {
    let code = status_for(api.code, api.reason.as_deref());
    let fields: Vec<serde_json::Value> = api
        .violations
        .iter()
        .map(|v| {
            let mut f = serde_json::json!({"field": v.field, "description": v.description});
            if let Some(at) = api.position(&v.field) {
                f["at"] = at.into();
            }
            f
        })
        .collect();
    // Positions are in `fields`; the rest of the metadata as sent.
    let metadata: serde_json::Map<String, serde_json::Value> = api
        .metadata
        .iter()
        .filter(|(k, _)| !k.starts_with(POSITION_KEY))
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    let body = serde_json::json!({"error": {
        "code": code.as_u16(),
        "status": code_name(api.code),
        "reason": api.reason.clone().unwrap_or_else(|| code_name(api.code).to_owned()),
        "message": api.message,
        "fields": fields,
        "metadata": metadata,
        "request_id": request_id,
    }});
    (code, body)
}

/// `INVALID_ARGUMENT`, `NOT_FOUND`, …: a gRPC code's canonical name.
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http_envelope_carries_the_grpc_reason_fields_and_positions() {
        let mut v = Violations::new();
        v.add(
            "tasks[1].task_number",
            "Invalid task numbering: gap between task 2 and 4",
        );
        let positions = std::collections::BTreeMap::from([(
            "tasks[1].task_number".to_owned(),
            "line 3, column 7".to_owned(),
        )]);
        let s = invalid_argument_at(Reason::InvalidTaskNumbering, &v, &positions);
        let (code, body) = http_error(&s, "req-1");
        assert_eq!(code, http::StatusCode::BAD_REQUEST);
        let e = &body["error"];
        assert_eq!(e["code"], 400);
        assert_eq!(e["status"], "INVALID_ARGUMENT");
        assert_eq!(e["reason"], "INVALID_TASK_NUMBERING");
        assert_eq!(e["request_id"], "req-1");
        assert_eq!(e["fields"][0]["field"], "tasks[1].task_number");
        assert_eq!(e["fields"][0]["at"], "line 3, column 7");
        assert!(e["metadata"].as_object().unwrap().is_empty(), "{e}");
        for (status, want) in [
            (status(Code::NotFound, Reason::JobNotFound, "x"), 404),
            (
                status(Code::FailedPrecondition, Reason::JobTerminal, "x"),
                409,
            ),
            (
                status(Code::Unauthenticated, Reason::AuthRequired, "x"),
                401,
            ),
            (
                status(Code::PermissionDenied, Reason::PermissionDenied, "x"),
                403,
            ),
            (
                status(Code::ResourceExhausted, Reason::MessageTooLarge, "x"),
                413,
            ),
            (
                status(Code::Unavailable, Reason::DependencyUnavailable, "x"),
                503,
            ),
            (Status::internal("no reason"), 500),
        ] {
            assert_eq!(http_error(&status, "r").0.as_u16(), want, "{status:?}");
        }
        assert_eq!(
            http_error(&Status::internal("x"), "r").1["error"]["reason"],
            "INTERNAL"
        );
    }

    #[test]
    fn errors_quoting_huge_input_stay_far_below_client_header_limits() {
        let huge = "x".repeat(20_000);
        let mut v = Violations::new();
        for i in 0..200 {
            v.add(
                format!("tasks[{i}].{huge}"),
                format!("job_id {huge:?} must match ^[a-z]"),
            );
        }
        let s = invalid_argument(Reason::InvalidArgument, &v);
        let plain = status_with_metadata(
            Code::NotFound,
            Reason::JobNotFound,
            format!("job {huge:?} not found"),
            metadata([("job_id", huge.clone())]),
        );
        for s in [s, plain] {
            let headers = s.into_http::<()>().into_parts().0.headers;
            let size: usize = headers
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len())
                .sum();
            assert!(size < 16 * 1024 / 2, "{size} bytes of headers");
        }
        let back = ApiError::from(invalid_argument(Reason::InvalidArgument, &v));
        let last = back.violations.last().unwrap();
        assert!(back.violations.len() > 2, "{}", back.violations.len());
        assert_eq!(
            last.description,
            format!("and {} more problems", 200 - (back.violations.len() - 1))
        );
    }

    #[test]
    fn status_round_trips_reason_metadata_and_violations() {
        let mut v = Violations::new();
        v.add("agent.id", "agent id is required");
        v.add("agent.trust_score", "must be at most 100");
        let err = ApiError::from(invalid_argument(Reason::InvalidArgument, &v));
        assert_eq!(err.code, Code::InvalidArgument);
        assert_eq!(err.known_reason(), Some(Reason::InvalidArgument));
        assert_eq!(err.violations.len(), 2);
        assert_eq!(err.violations[0].field, "agent.id");
        assert!(
            err.to_string()
                .contains("agent.trust_score: must be at most 100")
        );

        let md = HashMap::from([("agent_id".to_string(), "x".to_string())]);
        let err = ApiError::from(status_with_metadata(
            Code::NotFound,
            Reason::AgentNotFound,
            "no agent x",
            md,
        ));
        assert_eq!(err.reason.as_deref(), Some("AGENT_NOT_FOUND"));
        assert_eq!(err.metadata["agent_id"], "x");
        assert_eq!(err.to_string(), "AGENT_NOT_FOUND: no agent x");
    }

    #[test]
    fn plain_status_has_no_reason() {
        let err = ApiError::from(Status::unavailable("connection refused"));
        assert_eq!(err.reason, None);
        assert_eq!(err.to_string(), "UNAVAILABLE: connection refused");
    }

    #[test]
    fn outages_are_transport_failures_and_unavailable_not_refusals() {
        assert!(is_outage(&Status::unavailable("tcp connect error")));
        assert!(is_outage(&status(
            Code::Unavailable,
            Reason::Starting,
            "replaying"
        )));
        assert!(is_outage(&Status::unknown("transport error")));
        assert!(is_outage(&Status::cancelled(
            "h2 protocol error: connection reset"
        )));
        // A server's refusal carries a reason: never repeated as an outage.
        assert!(!is_outage(&status(
            Code::Internal,
            Reason::Internal,
            "connection pool broke"
        )));
        assert!(!is_outage(&status(
            Code::FailedPrecondition,
            Reason::BudgetExceeded,
            "no"
        )));
        assert!(!is_outage(&Status::unknown("the agent said no")));
        assert!(!is_outage(&Status::deadline_exceeded("slow")));
    }
}
