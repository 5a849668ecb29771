//! The tower layer every Switchyard server runs requests through: correlation
//! id and trace context in, a span per RPC named `<service>.<rpc>`, the id
//! echoed back, authentication and the authorization table (default deny),
//! the request time limit, and the message-size refusal mapped to
//! RESOURCE_EXHAUSTED with a reason.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use switchyard_core::Reason;
use tonic::Code;
use tonic::body::Body;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::auth::authn::{Authenticator, Presented};
use crate::auth::{Access, AuthError, Principal};
use crate::context::{self, CORRELATION_HEADER, RequestContext};
use crate::error;

/// What a request must pass: nothing (open methods, servers without auth)
/// or authentication with `Presented` and the method's access rule.
enum Gate {
    Open,
    Check(Arc<Authenticator>, Access, Presented),
    Fixed(Arc<Principal>),
}

fn gate(cfg: &RpcLayer, path: &str, headers: &HeaderMap) -> Result<Gate, AuthError> {
    let access = crate::auth::access(path);
    if access == Access::Open {
        return Ok(Gate::Open);
    }
    let Some(auth) = &cfg.auth else {
        return Ok(match &cfg.fixed {
            Some(p) => Gate::Fixed(p.clone()),
            None => Gate::Open,
        });
    };
    Ok(Gate::Check(
        auth.clone(),
        access,
        Presented::from_headers(headers)?,
    ))
}

/// What the connection proves: the verified client certificate's service
/// identity (mTLS) and the peer's address.
fn connection(req: &Request<Body>) -> (Option<String>, Option<std::net::IpAddr>) {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    if let Some(tls) = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>() {
        let subject = tls.peer_certs().and_then(|certs| {
            certs
                .first()
                .and_then(|c| crate::tls::certificate_subject(c))
        });
        return (subject, tls.get_ref().remote_addr().map(|a| a.ip()));
    }
    let peer = req
        .extensions()
        .get::<TcpConnectInfo>()
        .and_then(|c| c.remote_addr())
        .map(|a| a.ip());
    (None, peer)
}

/// Authenticates and authorizes a request to `path`: `Ok(None)` for open
/// methods (health, reflection) and servers without auth.
async fn admit(gate: Gate, path: &str) -> Result<Option<Arc<Principal>>, AuthError> {
    let (auth, access, presented) = match gate {
        Gate::Open => return Ok(None),
        Gate::Fixed(p) => return Ok(Some(p)),
        Gate::Check(auth, access, presented) => (auth, access, presented),
    };
    let principal = auth.authenticate(&presented, crate::time::now_ms()).await?;
    principal.allowed(access, path)?;
    Ok(Some(principal))
}

#[derive(Debug, Clone)]
pub(crate) struct RpcLayer {
    pub(crate) timeout: Option<Duration>,
    pub(crate) max_message_bytes: usize,
    /// `None` only on agent and tool endpoints (not control-plane services).
    pub(crate) auth: Option<Arc<Authenticator>>,
    /// Benchmarks only: every request runs as this principal, unchecked.
    pub(crate) fixed: Option<Arc<Principal>>,
}

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            cfg: Arc::new(self.clone()),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct RpcService<S> {
    inner: S,
    cfg: Arc<RpcLayer>,
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// `/switchyard.registry.v1.RegistryService/Heartbeat` → (`registry`, `Heartbeat`).
fn rpc_name(path: &str) -> (&str, &str) {
    let path = path.trim_start_matches('/');
    let (service, method) = path.split_once('/').unwrap_or((path, ""));
    let short = service
        .strip_prefix("switchyard.")
        .and_then(|s| s.split('.').next())
        .unwrap_or(service);
    (short, method)
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S> tower::Service<Request<Body>> for RpcService<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Response<Body>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        // Take the service that was driven to readiness; leave a clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let cfg = self.cfg.clone();

        let (correlation_id, traceparent) = context::from_headers(req.headers());
        let (service, method) = rpc_name(req.uri().path());
        let span = tracing::info_span!(
            "rpc",
            otel.name = %format_args!("{service}.{method}"),
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
            correlation_id = %correlation_id,
            principal = tracing::field::Empty,
            grpc.status = tracing::field::Empty,
        );
        if crate::telemetry::otel_enabled() && traceparent.is_some() {
            let parent = TraceContextPropagator::new().extract(&HeaderExtractor(req.headers()));
            let _ = span.set_parent(parent);
        }
        let gate = gate(&cfg, req.uri().path(), req.headers()).map(|g| match g {
            Gate::Check(auth, access, presented) => {
                let (certificate, peer) = connection(&req);
                let presented = presented.with_connection(
                    certificate,
                    peer,
                    req.headers(),
                    auth.forwarded_cert(),
                );
                Gate::Check(auth, access, presented)
            }
            open => open,
        });
        let path = req.uri().path().to_owned();
        let started = std::time::Instant::now();
        // gRPC methods only: `/metrics` itself is not an RPC.
        let metered =
            (!method.is_empty()).then(|| crate::metrics::global().method(service, method));

        Box::pin(
            async move {
                let admitted = match gate {
                    Ok(g) => admit(g, &path).await,
                    Err(e) => Err(e),
                };
                let principal = match admitted {
                    Ok(p) => p,
                    Err(refused) => {
                        tracing::debug!(error = %refused, "request refused");
                        let status = tonic::Status::from(refused);
                        if metered.is_none() {
                            // Plain HTTP (`/metrics`): an HTTP status and the
                            // JSON error envelope, not a gRPC status.
                            return Ok(http_refusal(&status, &correlation_id));
                        }
                        let mut resp = status.into_http();
                        if let Ok(v) = HeaderValue::from_str(&correlation_id) {
                            resp.headers_mut().insert(CORRELATION_HEADER, v);
                        }
                        if let Some(m) = metered {
                            resp = crate::metrics::metered(resp, m, started);
                        }
                        return Ok(resp);
                    }
                };
                if let Some(p) = &principal {
                    tracing::Span::current().record("principal", tracing::field::display(&p.subject));
                    req.extensions_mut().insert(p.clone());
                }
                let ctx = RequestContext {
                    correlation_id: correlation_id.clone(),
                    traceparent,
                    principal,
                };
                // The handler's deadline: the server's limit, or the
                // caller's own `grpc-timeout` when that comes first.
                let limit = match (cfg.timeout, context::grpc_timeout(req.headers())) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let fut = context::scope(ctx, inner.call(req));
                let fut = async move {
                    match limit {
                        Some(l) => context::with_deadline(std::time::Instant::now() + l, fut).await,
                        None => fut.await,
                    }
                };
                let result = match cfg.timeout {
                    Some(limit) => match tokio::time::timeout(limit, fut).await {
                        Ok(r) => r,
                        Err(_) => Ok(error::status(
                            Code::DeadlineExceeded,
                            Reason::RequestTimeout,
                            format!("request did not finish within the server's {} ms limit", limit.as_millis()),
                        )
                        .into_http()),
                    },
                    None => fut.await,
                };
                result.map(|mut resp| {
                    if is_decode_too_large(resp.headers()) {
                        resp = error::status(
                            Code::ResourceExhausted,
                            Reason::MessageTooLarge,
                            format!(
                                "request message is larger than the server's limit of {} bytes (server.max_message_bytes)",
                                cfg.max_message_bytes
                            ),
                        )
                        .into_http();
                    }
                    if is_decode_failure(resp.headers()) {
                        resp = error::status(
                            Code::InvalidArgument,
                            Reason::MalformedRequest,
                            "the request message could not be decoded (bad protobuf bytes or invalid UTF-8 in a string field); send a message of the method's request type",
                        )
                        .into_http();
                    }
                    if let Some(code) = resp.headers().get("grpc-status").and_then(|v| v.to_str().ok()) {
                        tracing::Span::current().record("grpc.status", code);
                    }
                    if let Ok(v) = HeaderValue::from_str(&correlation_id) {
                        resp.headers_mut().insert(CORRELATION_HEADER, v);
                    }
                    match metered {
                        Some(m) => crate::metrics::metered(resp, m, started),
                        None => resp,
                    }
                })
            }
            .instrument(span),
        )
    }
}

/// A refused plain-HTTP request: 401 without valid credentials, 403
/// without the permission, in the one JSON error envelope.
fn http_refusal(status: &tonic::Status, request_id: &str) -> Response<Body> {
    use axum::response::IntoResponse as _;
    let (code, body) = crate::error::http_error(status, request_id);
    (code, axum::Json(body)).into_response().map(Body::new)
}

/// tonic refuses an oversized request with OUT_OF_RANGE; gRPC's convention
/// (and what clients in other languages expect) is RESOURCE_EXHAUSTED.
fn is_decode_too_large(h: &HeaderMap) -> bool {
    h.get("grpc-status").is_some_and(|v| v == "11")
        && h.get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|m| {
                m.contains("decoded%20message%20length%20too%20large")
                    || m.contains("decoded message length too large")
            })
}

/// tonic answers a request it cannot decode with a bare INTERNAL; it is the
/// caller's input that is wrong, so it becomes INVALID_ARGUMENT with a reason.
fn is_decode_failure(h: &HeaderMap) -> bool {
    h.get("grpc-status").is_some_and(|v| v == "13")
        && h.get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|m| {
                m.starts_with("failed%20to%20decode%20Protobuf%20message")
                    || m.starts_with("failed to decode Protobuf message")
            })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service};

    /// An inner service that answers OK after `delay`, or with tonic's own
    /// oversize refusal when `too_large` is set.
    #[derive(Clone)]
    struct Inner {
        delay: Duration,
        too_large: bool,
    }

    impl Service<Request<Body>> for Inner {
        type Response = Response<Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<Response<Body>, std::convert::Infallible>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Body>) -> Self::Future {
            let (delay, too_large) = (self.delay, self.too_large);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Ok(if too_large {
                    tonic::Status::out_of_range("Error, decoded message length too large: found 9 bytes, the limit is: 4 bytes")
                        .into_http()
                } else {
                    tonic::Status::ok("").into_http()
                })
            })
        }
    }

    fn request(correlation: Option<&str>) -> Request<Body> {
        let mut b = Request::builder().uri("/switchyard.registry.v1.RegistryService/ListAgents");
        if let Some(c) = correlation {
            b = b.header(CORRELATION_HEADER, c);
        }
        b.body(Body::empty()).unwrap()
    }

    fn reason(resp: Response<Body>) -> (Code, Option<String>) {
        let status = tonic::Status::from_header_map(resp.headers()).unwrap();
        (status.code(), crate::error::ApiError::from(status).reason)
    }

    #[tokio::test(start_paused = true)]
    async fn slow_requests_end_with_deadline_exceeded_and_request_timeout_reason() {
        let layer = RpcLayer {
            timeout: Some(Duration::from_millis(100)),
            max_message_bytes: 4,
            auth: None,
            fixed: None,
        };
        let mut svc = layer.layer(Inner {
            delay: Duration::from_secs(5),
            too_large: false,
        });
        let resp = svc.call(request(Some("slow-1"))).await.unwrap();
        assert_eq!(
            resp.headers()[CORRELATION_HEADER],
            "slow-1",
            "echoed on timeouts too"
        );
        assert_eq!(
            reason(resp),
            (Code::DeadlineExceeded, Some("REQUEST_TIMEOUT".into()))
        );

        let mut fast = layer.layer(Inner {
            delay: Duration::from_millis(10),
            too_large: false,
        });
        let resp = fast.call(request(None)).await.unwrap();
        assert_eq!(reason(resp).0, Code::Ok);
    }

    #[tokio::test]
    async fn oversize_refusal_becomes_resource_exhausted_with_reason() {
        let layer = RpcLayer {
            timeout: None,
            max_message_bytes: 4,
            auth: None,
            fixed: None,
        };
        let mut svc = layer.layer(Inner {
            delay: Duration::ZERO,
            too_large: true,
        });
        let resp = svc.call(request(None)).await.unwrap();
        assert!(
            resp.headers().contains_key(CORRELATION_HEADER),
            "a correlation id is generated"
        );
        assert_eq!(
            reason(resp),
            (Code::ResourceExhausted, Some("MESSAGE_TOO_LARGE".into()))
        );
    }

    #[test]
    fn rpc_name_shortens_switchyard_services() {
        assert_eq!(
            rpc_name("/switchyard.registry.v1.RegistryService/Heartbeat"),
            ("registry", "Heartbeat")
        );
        assert_eq!(
            rpc_name("/grpc.health.v1.Health/Check"),
            ("grpc.health.v1.Health", "Check")
        );
    }
}
