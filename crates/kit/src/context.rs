//! The correlation context of the request being served.
//!
//! The server layer reads `x-correlation-id` (or makes a UUIDv7) and the W3C
//! `traceparent` of each request and runs the handler inside a task-local
//! [`RequestContext`]; [`inject`] copies it into every outgoing call, so one id
//! and one trace span a job across all services.

use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Metadata key carrying the correlation id, in requests and responses.
pub const CORRELATION_HEADER: &str = "x-correlation-id";
/// W3C trace-context header.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// Correlation of the request being served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestContext {
    /// The correlation id.
    pub correlation_id: String,
    /// The caller's `traceparent`, when it sent one.
    pub traceparent: Option<String>,
    /// Who is calling, as authenticated by the server layer (or the
    /// in-process client); `None` on open methods and outside requests.
    pub principal: Option<std::sync::Arc<crate::auth::Principal>>,
}

tokio::task_local! {
    static CONTEXT: RequestContext;
}

/// The context of the request being served on this task, if any.
pub fn current() -> Option<RequestContext> {
    CONTEXT.try_with(Clone::clone).ok()
}

/// Runs `fut` with `ctx` as the current context.
pub async fn scope<F: std::future::Future>(ctx: RequestContext, fut: F) -> F::Output {
    CONTEXT.scope(ctx, fut).await
}

tokio::task_local! {
    static DEADLINE: std::time::Instant;
}

/// Runs `fut` with `deadline` as the time by which the request being served
/// must be answered (the server layer sets it from its request limit and
/// the caller's `grpc-timeout`).
pub async fn with_deadline<F: std::future::Future>(
    deadline: std::time::Instant,
    fut: F,
) -> F::Output {
    DEADLINE.scope(deadline, fut).await
}

/// How long a handler may still take before the request being served is cut
/// off; `None` when it has no deadline (in-process calls, background work).
pub fn time_left() -> Option<std::time::Duration> {
    DEADLINE
        .try_with(|d| d.saturating_duration_since(std::time::Instant::now()))
        .ok()
}

/// How long a handler may wait for something before answering: `wanted`,
/// cut to the request's deadline less a margin to answer in (a tenth of
/// what is left, at most 250 ms).
pub fn wait_within_deadline(wanted: std::time::Duration) -> std::time::Duration {
    match time_left() {
        Some(left) => {
            let margin = (left / 10).min(std::time::Duration::from_millis(250));
            wanted.min(left.saturating_sub(margin))
        }
        None => wanted,
    }
}

/// The `grpc-timeout` a caller sent (gRPC over HTTP/2: up to 8 digits and a
/// unit, H M S m u n), when it is well formed.
pub fn grpc_timeout(headers: &http::HeaderMap) -> Option<std::time::Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    use std::time::Duration as D;
    Some(match unit {
        "H" => D::from_secs(n * 3600),
        "M" => D::from_secs(n * 60),
        "S" => D::from_secs(n),
        "m" => D::from_millis(n),
        "u" => D::from_micros(n),
        "n" => D::from_nanos(n),
        _ => return None,
    })
}

/// A new correlation id (UUIDv7: time-ordered).
pub fn new_correlation_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A correlation id a client may choose: 1–128 visible ASCII characters.
pub fn is_valid_correlation_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic())
}

/// What an incoming request says of its correlation: its `x-correlation-id`
/// when valid, else a new one; and its `traceparent`. Every server surface
/// (gRPC ports, the gateway's doors) reads them through this.
pub fn from_headers(headers: &http::HeaderMap) -> (String, Option<String>) {
    let id = headers
        .get(CORRELATION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| is_valid_correlation_id(s))
        .map(str::to_owned)
        .unwrap_or_else(new_correlation_id);
    let traceparent = headers
        .get(TRACEPARENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (id, traceparent)
}

/// The correlation id of a request: from its metadata, else the task's
/// context, else a new one.
pub fn correlation_id<T>(req: &tonic::Request<T>) -> String {
    req.metadata()
        .get(CORRELATION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| is_valid_correlation_id(s))
        .map(str::to_owned)
        .or_else(|| current().map(|c| c.correlation_id))
        .unwrap_or_else(new_correlation_id)
}

/// The `traceparent` for an outgoing call: the current span's when OTLP
/// tracing is on, else the one the current request came with.
pub fn outgoing_traceparent() -> Option<String> {
    if crate::telemetry::otel_enabled() {
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if sc.is_valid() {
            return Some(format!(
                "00-{}-{}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                sc.trace_flags().to_u8()
            ));
        }
    }
    current().and_then(|c| c.traceparent)
}

/// `fut` with this task's request context and span, to run on another
/// task (`tokio::spawn`, a `JoinSet`): the calls it makes carry the same
/// correlation id and join the same trace.
pub fn propagate<F: std::future::Future>(fut: F) -> impl std::future::Future<Output = F::Output> {
    use tracing::Instrument as _;
    let ctx = current();
    let span = tracing::Span::current();
    async move {
        match ctx {
            Some(ctx) => scope(ctx, fut).await,
            None => fut.await,
        }
    }
    .instrument(span)
}

/// Makes `span` a child of the trace in `traceparent` (when OTLP tracing is
/// on), so work resumed later — after a restart, say — joins the trace it
/// started in.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::propagation::TextMapPropagator;
    if traceparent.is_empty() || !crate::telemetry::otel_enabled() {
        return;
    }
    let carrier =
        std::collections::HashMap::from([(TRACEPARENT_HEADER.to_owned(), traceparent.to_owned())]);
    let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(parent);
}

/// The principal an in-process call carries: this process's services acting
/// for whoever the current request or job stands for — what a remote call
/// authenticated by service credential plus on-behalf-of would produce.
pub fn local_principal() -> std::sync::Arc<crate::auth::Principal> {
    static SERVICE: std::sync::LazyLock<std::sync::Arc<crate::auth::Principal>> =
        std::sync::LazyLock::new(|| std::sync::Arc::new(crate::auth::Principal::in_process()));
    match outgoing_on_behalf() {
        Some(user) => std::sync::Arc::new(SERVICE.acting_for(user)),
        None => SERVICE.clone(),
    }
}

/// The user an outgoing call acts for, from the current context.
pub fn outgoing_on_behalf() -> Option<crate::auth::OnBehalf> {
    CONTEXT
        .try_with(|c| c.principal.as_ref().and_then(|p| p.user_for_calls()))
        .ok()
        .flatten()
}

/// Adds the correlation id and trace context to an outgoing request, keeping
/// any the caller already set.
pub fn inject<T>(req: &mut tonic::Request<T>) {
    let md = req.metadata_mut();
    if !md.contains_key(CORRELATION_HEADER) {
        let id = current()
            .map(|c| c.correlation_id)
            .unwrap_or_else(new_correlation_id);
        if let Ok(v) = id.parse() {
            md.insert(CORRELATION_HEADER, v);
        }
    }
    if !md.contains_key(TRACEPARENT_HEADER)
        && let Some(tp) = outgoing_traceparent()
        && let Ok(v) = tp.parse()
    {
        md.insert(TRACEPARENT_HEADER, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correlation_id_validation() {
        assert!(is_valid_correlation_id("job-123"));
        assert!(!is_valid_correlation_id(""));
        assert!(!is_valid_correlation_id("has space"));
        assert!(!is_valid_correlation_id(&"x".repeat(129)));
    }

    #[test]
    fn grpc_timeout_reads_every_unit_and_refuses_malformed_values() {
        let read = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h)
        };
        use std::time::Duration as D;
        assert_eq!(read("2H"), Some(D::from_secs(7200)));
        assert_eq!(read("3M"), Some(D::from_secs(180)));
        assert_eq!(read("5S"), Some(D::from_secs(5)));
        assert_eq!(read("250m"), Some(D::from_millis(250)));
        assert_eq!(read("7u"), Some(D::from_micros(7)));
        assert_eq!(read("9n"), Some(D::from_nanos(9)));
        for bad in ["", "S", "123456789S", "5x", "-5S", "5 S"] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn a_wait_is_cut_to_the_deadline_less_a_margin() {
        use std::time::{Duration as D, Instant};
        assert_eq!(wait_within_deadline(D::from_secs(60)), D::from_secs(60));
        let deadline = Instant::now() + D::from_secs(10);
        with_deadline(deadline, async {
            let w = wait_within_deadline(D::from_secs(60));
            assert!(w <= D::from_millis(9_750) && w > D::from_secs(9), "{w:?}");
            assert_eq!(wait_within_deadline(D::from_secs(1)), D::from_secs(1));
        })
        .await;
        with_deadline(Instant::now(), async {
            assert_eq!(wait_within_deadline(D::from_secs(1)), D::ZERO);
        })
        .await;
    }

    #[tokio::test]
    async fn inject_uses_the_current_context_and_keeps_caller_values() {
        let ctx = RequestContext {
            correlation_id: "corr-1".into(),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            principal: None,
        };
        scope(ctx, async {
            let mut req = tonic::Request::new(());
            inject(&mut req);
            assert_eq!(req.metadata().get(CORRELATION_HEADER).unwrap(), "corr-1");
            assert!(req.metadata().get(TRACEPARENT_HEADER).is_some());
            assert_eq!(correlation_id(&req), "corr-1");

            let mut own = tonic::Request::new(());
            own.metadata_mut()
                .insert(CORRELATION_HEADER, "mine".parse().unwrap());
            inject(&mut own);
            assert_eq!(own.metadata().get(CORRELATION_HEADER).unwrap(), "mine");
        })
        .await;
    }

    #[tokio::test]
    async fn without_context_a_new_uuid_v7_is_made() {
        let mut req = tonic::Request::new(());
        inject(&mut req);
        let id = req
            .metadata()
            .get(CORRELATION_HEADER)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 7);
        assert!(req.metadata().get(TRACEPARENT_HEADER).is_none());
    }
}
