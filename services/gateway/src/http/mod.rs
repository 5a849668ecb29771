//! The HTTP door: AITP over REST/JSON (seed 002 §8), each task's events as
//! Server-Sent Events, and the OpenAPI document, on the gateway's own
//! listener.
//!
//! Every route passes one gate ([`gate`]): the correlation id (taken from
//! `x-correlation-id` or made, and echoed), a span named `gateway.<METHOD>
//! <route>`, authentication and the route's permission from the one table
//! ([`switchyard_kit::auth::http_access`]), and the time limit. Every error,
//! from the gate or the executor, is the one JSON envelope
//! ([`switchyard_kit::error::http_error`]).

pub mod a2a;
mod aitp;
pub mod ojs;
mod shapes;
mod triggers;

pub(crate) use aitp::{event_stream, not_finished};
pub(crate) use shapes::{finished, job_id, job_state_name, task_state_name};

use crate::console;

use std::collections::HashMap;
use std::future::Future as _;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use switchyard_core::Reason;
use switchyard_kit::auth::authn::Authenticator;
use switchyard_kit::auth::{AuthError, Method};
use switchyard_kit::context::{CORRELATION_HEADER, RequestContext};
use switchyard_kit::shutdown::Shutdown;
use tokio::net::TcpListener;
use tonic::{Code, Status};
use tracing::Instrument as _;

use crate::caller::{Jobs, admit};
use crate::config::HttpConfig;
use switchyard_kit::context::from_headers as correlation;

/// The OpenAPI 3.1 document of this door, served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("../../openapi.json");

/// What every handler shares.
pub(crate) struct Door {
    pub(crate) jobs: Jobs,
    auth: Arc<Authenticator>,
    timeout: Option<Duration>,
    pub(crate) max_body: usize,
    /// Ends event streams on shutdown, so draining does not wait for jobs.
    pub(crate) shutdown: Shutdown,
    /// The OJS binding's settings.
    pub(crate) ojs: crate::config::OjsConfig,
    /// What signs the A2A door's card, if anything does.
    pub(crate) card: Option<Arc<a2a::CardSigner>>,
}

/// Settings of the doors on the HTTP listener beyond its limits.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `[gateway.ojs]`.
    pub ojs: crate::config::OjsConfig,
    /// What signs the A2A door's Agent Card (none: it is served unsigned).
    pub card: Option<Arc<a2a::CardSigner>>,
}

impl Door {
    /// A request body, up to the door's limit (MESSAGE_TOO_LARGE beyond it,
    /// naming `what` the body is).
    pub(crate) async fn read_body(
        &self,
        body: axum::body::Body,
        what: &str,
    ) -> Result<axum::body::Bytes, Status> {
        axum::body::to_bytes(body, self.max_body).await.map_err(|_| {
            switchyard_kit::error::status(
                Code::ResourceExhausted,
                Reason::MessageTooLarge,
                format!(
                    "the {what} is larger than the gateway's limit of {} bytes (gateway.http.max_body_bytes)",
                    self.max_body
                ),
            )
        })
    }

    /// A JSON body of a write that may be retried: read within the limit,
    /// parsed as `T` (`shape` says what was expected), and its client key —
    /// `body_key` of `T` when given, else the `Idempotency-Key` header.
    pub(crate) async fn keyed_json<T: serde::de::DeserializeOwned>(
        &self,
        body: axum::body::Body,
        what: &str,
        shape: &str,
        headers: &http::HeaderMap,
        body_key: impl FnOnce(&T) -> String,
    ) -> Result<(T, String), Status> {
        let bytes = self.read_body(body, what).await?;
        let parsed: T = serde_json::from_slice(&bytes)
            .map_err(|e| malformed("body", format!("expected {shape}: {e}")))?;
        let key = match body_key(&parsed) {
            k if !k.is_empty() => k,
            _ => headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        };
        Ok((parsed, key))
    }
}

/// A request the door cannot read: `MALFORMED_REQUEST`, naming `field`
/// and why.
pub(crate) fn malformed(field: &str, why: impl Into<String>) -> Status {
    let mut v = switchyard_core::Violations::new();
    v.add(field, why);
    switchyard_kit::error::invalid_argument(Reason::MalformedRequest, &v)
}

/// An error answered in the envelope, with the request's correlation id.
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) Status);

impl From<Status> for Failure {
    fn from(s: Status) -> Failure {
        Failure(s)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let request_id = switchyard_kit::context::current()
            .map(|c| c.correlation_id)
            .unwrap_or_default();
        let (code, body) = switchyard_kit::error::http_error(&self.0, &request_id);
        (code, axum::Json(body)).into_response()
    }
}

/// The router of the HTTP door over `jobs`, with the web console over
/// `console` when given.
pub fn router(
    cfg: &HttpConfig,
    settings: Settings,
    max_message_bytes: usize,
    jobs: Jobs,
    auth: Arc<Authenticator>,
    shutdown: Shutdown,
    console: Option<(crate::config::ConsoleConfig, console::ConsoleServices)>,
) -> Router {
    let max_body = cfg.max_body_bytes.unwrap_or(max_message_bytes);
    let console_routes = console.map(|(c, services)| {
        console::routes(jobs.clone(), services, auth.clone(), c, shutdown.clone())
    });
    let door = Arc::new(Door {
        jobs,
        auth,
        timeout: (cfg.request_timeout_ms > 0)
            .then(|| Duration::from_millis(cfg.request_timeout_ms)),
        max_body,
        shutdown,
        ojs: settings.ojs,
        card: settings.card,
    });
    let mut router = Router::new()
        .route("/openapi.json", get(openapi))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(aitp::routes())
        .merge(ojs::routes())
        .merge(a2a::routes())
        .merge(triggers::routes());
    if let Some(c) = console_routes {
        // The door's root is the console, for a person who types the
        // address the banner printed without the path.
        router = router
            .merge(c)
            .route(
                "/ui",
                get(|| async { axum::response::Redirect::to("/ui/") }),
            )
            .route("/", get(|| async { axum::response::Redirect::to("/ui/") }));
    }
    router
        .route_layer(axum::middleware::from_fn_with_state(door.clone(), gate))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(door)
}

/// `router` with Switchyard as an MCP server at `/mcp` (streamable HTTP,
/// rmcp): each request authenticated like every route, and each tool call
/// made with the request's own bearer token, so it can do what its
/// principal may and nothing more.
pub fn with_mcp(
    router: Router,
    server: switchyard_mcp::server::SwitchyardMcp,
    cfg: &crate::config::McpConfig,
    auth: Arc<Authenticator>,
    max_body_bytes: usize,
) -> Router {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts.clone_from(&cfg.allowed_hosts);
    let stateless = Arc::new(switchyard_mcp::stateless::Stateless {
        server: server.clone(),
        max_body: max_body_bytes,
        allowed_hosts: cfg.allowed_hosts.clone(),
    });
    let svc = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    // Authenticated first (the outer layer), then 2026-07-28 (stateless)
    // answered here and the session revisions by rmcp.
    let mcp = Router::new()
        .route_service("/mcp", svc)
        .route_layer(axum::middleware::from_fn_with_state(
            stateless,
            switchyard_mcp::stateless::layer,
        ))
        .route_layer(axum::middleware::from_fn_with_state(auth, mcp_gate));
    router.merge(mcp)
}

/// Authentication and the route's permission for `/mcp`, answering 401
/// with `WWW-Authenticate: Bearer` as MCP clients expect.
async fn mcp_gate(State(auth): State<Arc<Authenticator>>, req: Request, next: Next) -> Response {
    let method = req.method().as_str().to_owned();
    let access = switchyard_kit::auth::http_access(&method, "/mcp");
    match admit(&auth, req.headers(), access, &format!("{method} /mcp")).await {
        Ok(_) => next.run(req).await,
        Err(refused) => {
            let status = Status::from(refused);
            let unauthenticated = status.code() == Code::Unauthenticated;
            let mut resp = Failure(status).into_response();
            if unauthenticated {
                resp.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer"),
                );
            }
            resp
        }
    }
}

/// Correlation, span, authentication and authorization, time limit.
async fn gate(
    State(door): State<Arc<Door>>,
    matched: Option<MatchedPath>,
    mut req: Request,
    next: Next,
) -> Response {
    let (correlation_id, traceparent) = correlation(req.headers());
    let route = matched.as_ref().map_or("", MatchedPath::as_str).to_owned();
    let method = req.method().as_str().to_owned();
    let span = tracing::info_span!(
        "http",
        otel.name = %format_args!("gateway.{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        correlation_id = %correlation_id,
        principal = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(tp) = &traceparent {
        switchyard_kit::context::continue_trace(&span, tp);
    }
    let ctx = RequestContext {
        correlation_id: correlation_id.clone(),
        traceparent,
        principal: None,
    };
    let base = ctx.clone();
    let served = async {
        let access = switchyard_kit::auth::http_access(&method, &route);
        let on_console = console::is_console(&route);
        let path = req
            .uri()
            .path_and_query()
            .map_or("", |p| p.as_str())
            .to_owned();
        // A console form is checked for forgery before anyone acts on it.
        if on_console && method == "POST" {
            req = match console::check_form(req, &route, door.max_body).await {
                Ok(r) => r,
                Err(refused) => return refused,
            };
        }
        let session = on_console.then(|| console::credential_headers(req.headers()));
        let presented = session.as_ref().unwrap_or(req.headers());
        let admitted = admit(&door.auth, presented, access, &format!("{method} {route}"))
            .await
            .and_then(|c| match &c {
                // The console's cookie carries a session, never a key or
                // token itself (one pasted into the cookie by hand is not
                // a sign-in).
                Some(c) if on_console && c.principal.method != Method::Session => {
                    Err(AuthError::Invalid)
                }
                _ => Ok(c),
            });
        let caller = match admitted {
            Ok(c) => c,
            Err(refused) => {
                tracing::debug!(error = %refused, "request refused");
                if on_console {
                    return console::refusal(&method, &route, &path, Status::from(refused));
                }
                return refusal(&route, Status::from(refused));
            }
        };
        if on_console {
            let session = console::session_of(req.headers());
            req.extensions_mut().insert(session);
        }
        let mut ctx = base;
        if let Some(c) = caller {
            tracing::Span::current()
                .record("principal", tracing::field::display(&c.principal.subject));
            ctx.principal = Some(c.principal.clone());
            req.extensions_mut().insert(c);
        }
        let run = switchyard_kit::context::scope(ctx, next.run(req));
        match door.timeout {
            Some(limit) => tokio::time::timeout(limit, run).await.unwrap_or_else(|_| {
                let late = switchyard_kit::error::status(
                    Code::DeadlineExceeded,
                    Reason::RequestTimeout,
                    format!(
                        "request did not finish within the gateway's {} ms limit (gateway.http.request_timeout_ms)",
                        limit.as_millis()
                    ),
                );
                refusal(&route, late)
            }),
            None => run.await,
        }
    };
    let mut resp = switchyard_kit::context::scope(ctx, served)
        .instrument(span.clone())
        .await;
    span.record("http.response.status_code", resp.status().as_u16());
    if let Ok(v) = http::HeaderValue::from_str(&correlation_id) {
        resp.headers_mut().insert(CORRELATION_HEADER, v);
    }
    resp
}

/// A refusal by the door itself (authentication, permission, time limit)
/// in the envelope of the route's protocol: OJS routes answer in the OJS
/// error envelope, the others in the AITP one.
fn refusal(route: &str, s: Status) -> Response {
    if console::is_console(route) {
        console::error_page(&s, None)
    } else if route.starts_with("/ojs/") {
        ojs::OjsFailure::from(s).into_response()
    } else {
        Failure(s).into_response()
    }
}

async fn openapi() -> Response {
    ([(http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// `GET /metrics`: this process's Prometheus metrics, as on every gRPC port
/// (the gate has checked `metrics.read`).
async fn metrics(axum::Extension(caller): axum::Extension<crate::caller::Caller>) -> Response {
    (
        [(
            http::header::CONTENT_TYPE,
            switchyard_kit::metrics::CONTENT_TYPE,
        )],
        switchyard_kit::metrics::scrape_for(&caller.principal),
    )
        .into_response()
}

async fn healthz() -> Response {
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

/// The envelope for a path no route has.
/// `router` answering a gRPC call (`content-type: application/grpc…`) in
/// gRPC's own terms: this is not the gRPC port, and `grpc` (when known) is.
/// A client pointed at the wrong port reads that, not a protocol error.
pub fn grpc_elsewhere(router: Router, grpc: Option<String>) -> Router {
    router.layer(axum::middleware::from_fn(
        move |req: Request, next: axum::middleware::Next| {
            let grpc = grpc.clone();
            async move {
                let is_grpc = req
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/grpc"));
                if !is_grpc {
                    return next.run(req).await;
                }
                let there = grpc.map_or_else(
                    || "the address `listening grpc=…` names when the server starts".to_owned(),
                    |a| format!("{a} here"),
                );
                let message = format!(
                    "this is Switchyard's HTTP door (REST, OJS, A2A, the console), not its gRPC port: point --url or SWITCHYARD_URL at the gRPC port, {there}"
                );
                let status =
                    switchyard_kit::error::status(Code::Unimplemented, Reason::RouteNotFound, message);
                let mut resp = status.into_http::<axum::body::Body>();
                *resp.status_mut() = http::StatusCode::OK;
                resp.into_response()
            }
        },
    ))
}

async fn not_found(req: Request) -> Response {
    unrouted(&req, http::StatusCode::NOT_FOUND, "no route")
}

async fn method_not_allowed(req: Request) -> Response {
    unrouted(
        &req,
        http::StatusCode::METHOD_NOT_ALLOWED,
        "no route takes this method at",
    )
}

fn unrouted(req: &Request, code: http::StatusCode, what: &str) -> Response {
    let (request_id, _) = correlation(req.headers());
    let path = switchyard_core::validate::clamp(req.uri().path(), 200);
    let status = switchyard_kit::error::status(
        Code::NotFound,
        Reason::RouteNotFound,
        format!(
            "{what} {} {path}; GET /openapi.json lists the routes",
            req.method()
        ),
    );
    let (_, body) = switchyard_kit::error::http_error(&status, &request_id);
    let mut resp = (code, axum::Json(body)).into_response();
    if let Ok(v) = http::HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert(CORRELATION_HEADER, v);
    }
    resp
}

/// What keeps the HTTP door from being held open: how many connections,
/// how many from one address, how long a request's head may take to
/// arrive, and how long a connection may sit silent.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Connections one peer address may hold; more are closed at once.
    pub max_connections_per_ip: usize,
    /// A request head (line and headers) must arrive within this, from its
    /// first byte: byte-trickling clients are cut off.
    pub header_read: Duration,
    /// A connection with nothing read or written for this long is closed
    /// (an idle keep-alive, or a client that stopped sending; server-sent
    /// event streams write a keep-alive well within it).
    pub idle: Duration,
}

/// Serves `router` on `listener` within `limits`, until `shutdown`; then
/// stops accepting and gives open requests `drain` to finish (event
/// streams end at shutdown).
pub async fn serve(
    router: Router,
    listener: TcpListener,
    limits: Limits,
    shutdown: Shutdown,
    drain: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let per_ip: PerIp = Arc::default();
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder.http2().timer(TokioTimer::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        // A permit before accepting: excess connections wait in the
        // kernel's backlog instead of being read.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = shutdown.wait() => break,
        };
        let (io, addr) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                // Out of file descriptors and the like: wait, do not spin.
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.wait() => break,
        };
        let Some(slot) = PeerSlot::take(&per_ip, addr.ip(), limits.max_connections_per_ip) else {
            tracing::warn!(peer = %addr.ip(), limit = limits.max_connections_per_ip, "http connection refused: too many from one address");
            continue;
        };
        let _ = io.set_nodelay(true);
        let io = Counted::new(io, permit, slot, limits.idle);
        let svc = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(drain) => {
            tracing::warn!(drain_ms = drain.as_millis() as u64, "http drain timed out; closing remaining connections");
        }
    }
    Ok(())
}

type PerIp = Arc<std::sync::Mutex<HashMap<std::net::IpAddr, usize>>>;

/// One connection's place in its peer address's count, given back on drop.
struct PeerSlot {
    counts: PerIp,
    ip: std::net::IpAddr,
}

impl PeerSlot {
    fn take(counts: &PerIp, ip: std::net::IpAddr, max: usize) -> Option<PeerSlot> {
        let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = c.entry(ip).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            counts: counts.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.ip);
            }
        }
    }
}

/// A connection, the permits it holds until it closes, and its idle
/// timer: nothing read or written for `idle` ends it with `TimedOut`.
struct Counted {
    io: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _slot: PeerSlot,
    idle: Duration,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Counted {
    fn new(
        io: tokio::net::TcpStream,
        permit: tokio::sync::OwnedSemaphorePermit,
        slot: PeerSlot,
        idle: Duration,
    ) -> Counted {
        Counted {
            io,
            _permit: permit,
            _slot: slot,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// Progress: the idle timer starts again.
    fn progressed(&mut self) {
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// `Ready(Err(TimedOut))` once the idle timer ran out.
    fn expired(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Error> {
        self.deadline
            .as_mut()
            .poll(cx)
            .map(|()| std::io::Error::new(std::io::ErrorKind::TimedOut, "connection idle too long"))
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.expired(cx).map(Err),
        }
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(r) => {
                if r.as_ref().is_ok_and(|n| *n > 0) {
                    self.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.expired(cx).map(Err),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_kit::auth::{Access, HTTP_ROUTES};

    /// The document's (method, path) pairs.
    fn documented() -> std::collections::BTreeSet<(String, String)> {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("openapi.json is JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        let mut out = std::collections::BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in ["get", "post", "put", "patch", "delete"] {
                if item.get(method).is_some() {
                    out.insert((method.to_ascii_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn the_openapi_document_lists_exactly_the_routes_of_the_authorization_table() {
        // The console's pages are HTML for people, not API: not documented.
        let table: std::collections::BTreeSet<(String, String)> = HTTP_ROUTES
            .iter()
            .filter(|(_, r, _)| !matches!(*r, "/" | "/ui") && !console::is_console(r))
            .map(|(m, r, _)| (m.to_string(), r.to_string()))
            .collect();
        assert_eq!(documented(), table);
        assert!(HTTP_ROUTES.iter().all(|(_, _, a)| *a != Access::Unknown));
    }

    #[tokio::test]
    async fn every_route_in_the_table_is_routed_and_nothing_else_is() {
        use tower::ServiceExt as _;
        let keys = switchyard_kit::auth::keys::KeySet::default();
        let auth = Arc::new(
            Authenticator::new(&Default::default(), keys)
                .expect("an authenticator without a service token"),
        );
        let channel = switchyard_kit::client::authed(
            switchyard_kit::client::lazy_channel("http://127.0.0.1:9").expect("channel"),
            None,
        );
        let jobs = Jobs::new(
            switchyard_api::ExecutorClient::remote(channel.clone(), 1024),
            switchyard_api::WorkerClient::remote(channel, 1024),
        );
        let (_trigger, shutdown) = switchyard_kit::shutdown::channel();
        let key = switchyard_a2a::signature::SigningKey::generate_pem()
            .and_then(|pem| switchyard_a2a::signature::SigningKey::from_pem(&pem))
            .expect("a key");
        let settings = Settings {
            card: Some(Arc::new(a2a::CardSigner {
                key,
                public_url: "http://127.0.0.1:7680".into(),
            })),
            ..Default::default()
        };
        let app = router(
            &HttpConfig::default(),
            settings,
            4096,
            jobs,
            auth.clone(),
            shutdown,
            Some((Default::default(), Default::default())),
        );
        let nowhere =
            || switchyard_kit::client::lazy_channel("http://127.0.0.1:9").expect("channel");
        let mcp = switchyard_mcp::server::SwitchyardMcp::with_channels(
            [nowhere(), nowhere(), nowhere()],
            switchyard_mcp::server::Identity::PerRequest,
            1024,
        );
        let app = with_mcp(app, mcp, &Default::default(), auth, 4096);
        let call = |method: &str, path: &str| {
            let req = http::Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::empty())
                .expect("request");
            app.clone().oneshot(req)
        };
        for (method, route, access) in HTTP_ROUTES {
            let path = route
                .replace("{task_id}", "t1")
                .replace("{file}", "console.css");
            let resp = call(method, &path).await.expect("infallible");
            // Routed: the gate answered (401 without a credential) or the
            // open route did; never the fallback's 404/405. The console
            // sends a page without a session to sign-in (303) and refuses a
            // form without its anti-forgery token (403) before anything.
            let want = match (*method, *access == Access::Open) {
                _ if matches!(*route, "/" | "/ui") => 303,
                // No identity provider configured; no sign-in in flight.
                _ if *route == "/ui/sign-in/oidc" => 404,
                _ if *route == "/ui/oidc/callback" => 400,
                ("POST", _) if console::is_console(route) => 403,
                ("GET", false) if console::is_console(route) && !route.ends_with("/events") => 303,
                (_, true) => 200,
                (_, false) => 401,
            };
            assert_eq!(resp.status().as_u16(), want, "{method} {route}");
        }
        for (method, path, code) in [
            ("GET", "/aitp/nope", 404),
            ("PUT", "/aitp/tasks/t1", 405),
            ("POST", "/aitp/tasks/t1/result", 405),
        ] {
            let resp = call(method, path).await.expect("infallible");
            assert_eq!(resp.status().as_u16(), code, "{method} {path}");
            let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .expect("body");
            let v: serde_json::Value = serde_json::from_slice(&body).expect("the error envelope");
            assert_eq!(v["error"]["reason"], "ROUTE_NOT_FOUND", "{v}");
        }
    }
}
