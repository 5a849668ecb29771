//! One gRPC port for any set of Switchyard services, with `grpc.health.v1`
//! (per-service status, NOT_SERVING while starting and draining), server
//! reflection v1 and v1alpha, limits, correlation and graceful shutdown.

use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::layer::RpcLayer;
use crate::shutdown::Shutdown;

/// `[server]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on (`host:port`; port 0 picks a free one).
    pub listen: String,
    /// Largest request message accepted, bytes; larger ones get RESOURCE_EXHAUSTED.
    pub max_message_bytes: usize,
    /// Time limit of one unary request (or a stream's start), ms; 0 = none.
    pub request_timeout_ms: u64,
    /// How long shutdown waits for in-flight requests, ms.
    pub drain_timeout_ms: u64,
    /// `[server.tls]`: TLS, and client certificates for mTLS between
    /// services. Unset: plaintext h2c (loopback, or behind a mesh).
    pub tls: Option<crate::tls::ServerTls>,
    /// A second, plaintext address serving only `grpc.health.v1` (same
    /// statuses): for kubelet gRPC probes, which speak neither TLS nor
    /// credentials, when the main port is TLS. Unset: none.
    pub health_listen: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7600".into(),
            max_message_bytes: 4 * 1024 * 1024,
            request_timeout_ms: 30_000,
            drain_timeout_ms: 10_000,
            tls: None,
            health_listen: None,
        }
    }
}

/// Health service name that reports SERVING while the process runs, whatever
/// the readiness of the services it hosts (use it for liveness probes; use the
/// service names or `""` for readiness).
pub const LIVENESS: &str = "liveness";

/// Errors starting or running a server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Reflection could not be built from the descriptor sets.
    #[error("building reflection service: {0}")]
    Reflection(String),
    /// The transport failed.
    #[error("grpc server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The TLS settings could not be used.
    #[error("server.tls: {0}")]
    Tls(String),
    /// Binding the listen address failed.
    #[error("binding {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
}

/// Binds the configured listen address.
pub async fn bind(cfg: &ServerConfig) -> Result<TcpListener, ServerError> {
    TcpListener::bind(&cfg.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: cfg.listen.clone(),
            source,
        })
}

/// A generated tonic server that can be mounted on a [`Server`].
pub trait GrpcService:
    tower::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + NamedService
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> GrpcService for S where
    S: tower::Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Services to serve on one port.
pub struct Server {
    cfg: ServerConfig,
    auth: Option<std::sync::Arc<crate::auth::authn::Authenticator>>,
    fixed: Option<std::sync::Arc<crate::auth::Principal>>,
    routes: RoutesBuilder,
    names: Vec<&'static str>,
    gates: Vec<(&'static str, Gate)>,
}

/// Completes when a service is ready to take traffic.
type Gate = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("services", &self.names)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// An empty server with `cfg`'s limits and no authentication: for agent
    /// and tool endpoints, which Switchyard calls. Control-plane services are
    /// served [`Server::with_auth`].
    pub fn new(cfg: ServerConfig) -> Self {
        Server {
            cfg,
            auth: None,
            fixed: None,
            routes: RoutesBuilder::default(),
            names: Vec::new(),
            gates: Vec::new(),
        }
    }

    /// Every request but health and reflection is authenticated by `auth`
    /// and checked against the authorization table (default deny).
    pub fn with_auth(mut self, auth: std::sync::Arc<crate::auth::authn::Authenticator>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Benchmarks only, never a deployment: no authentication at all, every
    /// request runs as `principal`. It lets a benchmark measure what
    /// authentication costs on an otherwise identical server; `switchyard`
    /// itself never calls it.
    pub fn with_fixed_principal_insecure(mut self, principal: crate::auth::Principal) -> Self {
        self.fixed = Some(std::sync::Arc::new(principal));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Adds a generated tonic server (already sized with
    /// [`ServerConfig::max_message_bytes`]).
    pub fn add_service<S: GrpcService>(mut self, svc: S) -> Self {
        self.names.push(S::NAME);
        self.routes.add_service(svc);
        self
    }

    /// Like [`Server::add_service`], but health reports the service (and the
    /// server as a whole) NOT_SERVING until `ready` completes — for services
    /// that need state from elsewhere before they can answer, such as a router
    /// waiting for its first registry snapshot.
    pub fn add_gated_service<S: GrpcService>(
        mut self,
        svc: S,
        ready: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.gates.push((S::NAME, Box::pin(ready)));
        self.add_service(svc)
    }

    /// Health reports the server as a whole NOT_SERVING until `ready`
    /// completes (reported under `name`): for state the whole process needs,
    /// such as the key set it verifies credentials against.
    pub fn with_gate(
        mut self,
        name: &'static str,
        ready: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.gates.push((name, Box::pin(ready)));
        self
    }

    /// Serves on `listener` until `shutdown` fires, then reports NOT_SERVING,
    /// stops accepting, and waits up to the drain timeout for in-flight
    /// requests. Callers flush storage and telemetry after it returns.
    pub async fn run(self, listener: TcpListener, shutdown: Shutdown) -> Result<(), ServerError> {
        let (reporter, health) = tonic_health::server::health_reporter();
        set_all(&reporter, &self.names, ServingStatus::NotServing).await;
        // `liveness` means "this process is up": for liveness probes, which
        // must not restart a process that is only waiting on a dependency.
        // Set before the first request can be served, so no probe ever finds
        // it missing.
        reporter
            .set_service_status(LIVENESS, ServingStatus::Serving)
            .await;

        // Every descriptor is registered (so messages and error details
        // resolve), but only the services this process hosts are advertised.
        let reflection = || {
            let builder = tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(switchyard_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                // google.rpc error details, so reflection clients (grpcurl)
                // can decode the ErrorInfo and BadRequest we attach.
                .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
                .with_service_name("grpc.health.v1.Health");
            self.names
                .iter()
                .fold(builder, |b, name| b.with_service_name(*name))
        };
        let refl_v1 = reflection()
            .build_v1()
            .map_err(|e| ServerError::Reflection(e.to_string()))?;
        let refl_v1alpha = reflection()
            .build_v1alpha()
            .map_err(|e| ServerError::Reflection(e.to_string()))?;

        let health_only = match &self.cfg.health_listen {
            Some(addr) => Some(spawn_health_only(addr, health.clone(), shutdown.clone()).await?),
            None => None,
        };
        let mut routes = self.routes;
        routes
            .add_service(health)
            .add_service(refl_v1)
            .add_service(refl_v1alpha);

        let layer = RpcLayer {
            timeout: (self.cfg.request_timeout_ms > 0)
                .then(|| Duration::from_millis(self.cfg.request_timeout_ms)),
            max_message_bytes: self.cfg.max_message_bytes,
            auth: self.auth,
            fixed: self.fixed,
        };
        let drain = Duration::from_millis(self.cfg.drain_timeout_ms);

        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &self.cfg.tls {
            builder = builder
                .tls_config(tls.tonic().map_err(ServerError::Tls)?)
                .map_err(|e| ServerError::Tls(e.to_string()))?;
        }
        // `GET /metrics` beside the gRPC services, over HTTP/1.1 as
        // Prometheus and curl speak it (gRPC stays on HTTP/2).
        let routes = tonic::service::Routes::from(
            routes
                .routes()
                .into_axum_router()
                .merge(crate::metrics::router()),
        );
        let server = builder
            .tcp_nodelay(true)
            .accept_http1(true)
            .layer(layer)
            .add_routes(routes)
            // The listener is bound by the caller, so tonic's own
            // `tcp_nodelay` does not reach it: without this, multi-frame
            // responses stall ~40 ms on Nagle + delayed ACK.
            .serve_with_incoming_shutdown(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                async {
                    let _ = stop_rx.await;
                },
            );
        let mut server = tokio::spawn(server);
        // A gate of one service holds that service; a gate of the whole
        // process (the key set every credential is verified against) holds
        // every service, since a readiness probe names one of them. Services
        // with neither serve at once; the rest, and the server as a whole,
        // once their gates open.
        let gated: Vec<&'static str> = self.gates.iter().map(|(n, _)| *n).collect();
        let process_wide = gated.iter().any(|g| !self.names.contains(g));
        let ungated: Vec<&'static str> = self
            .names
            .iter()
            .copied()
            .filter(|n| !gated.contains(n))
            .collect();
        if !process_wide {
            for name in &ungated {
                reporter
                    .set_service_status(*name, ServingStatus::Serving)
                    .await;
            }
        }
        let opener = {
            let reporter = reporter.clone();
            let shutdown = shutdown.clone();
            let gates = self.gates;
            let names = self.names.clone();
            tokio::spawn(async move {
                let open = async {
                    // Process-wide gates first: until they open, no service
                    // is ready, whatever its own state.
                    let (wide, own): (Vec<_>, Vec<_>) =
                        gates.into_iter().partition(|(n, _)| !names.contains(n));
                    for (_, gate) in wide {
                        gate.await;
                    }
                    if process_wide {
                        for name in &ungated {
                            reporter
                                .set_service_status(*name, ServingStatus::Serving)
                                .await;
                        }
                    }
                    for (name, gate) in own {
                        gate.await;
                        reporter
                            .set_service_status(name, ServingStatus::Serving)
                            .await;
                    }
                    reporter
                        .set_service_status("", ServingStatus::Serving)
                        .await;
                };
                tokio::select! {
                    _ = open => {}
                    _ = shutdown.wait() => {}
                }
            })
        };

        tokio::select! {
            r = &mut server => {
                opener.abort();
                return flatten(r);
            }
            _ = shutdown.wait() => {}
        }
        let _ = opener.await;
        set_all(&reporter, &self.names, ServingStatus::NotServing).await;
        let _ = stop_tx.send(());
        if let Some(h) = health_only {
            let _ = h.await;
        }
        match tokio::time::timeout(drain, &mut server).await {
            Ok(r) => flatten(r),
            Err(_) => {
                tracing::warn!(
                    drain_ms = drain.as_millis() as u64,
                    "drain timed out; closing remaining connections"
                );
                server.abort();
                Ok(())
            }
        }
    }
}

/// What a process answers on its port while it opens its stores (replaying
/// their logs): every call gets UNAVAILABLE with reason STARTING and what
/// is being replayed, so callers retry instead of hanging on a port that
/// accepts but never answers; `grpc.health.v1` answers NOT_SERVING for the
/// services (and SERVING for [`LIVENESS`], so a long replay is not killed).
/// Stop it, then [`Server::run`] on the same listener.
pub struct Starting {
    phase: std::sync::Arc<std::sync::Mutex<String>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Starting {
    /// Serves the starting answers on a second handle of `listener`.
    pub async fn serve(
        cfg: &ServerConfig,
        listener: &TcpListener,
    ) -> Result<Starting, ServerError> {
        use std::os::fd::AsFd;
        let bind_err = |source| ServerError::Bind {
            addr: cfg.listen.clone(),
            source,
        };
        let owned = listener.as_fd().try_clone_to_owned().map_err(bind_err)?;
        let std_listener = std::net::TcpListener::from(owned);
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let second = TcpListener::from_std(std_listener).map_err(bind_err)?;
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", ServingStatus::NotServing)
            .await;
        reporter
            .set_service_status(LIVENESS, ServingStatus::Serving)
            .await;
        let phase = std::sync::Arc::new(std::sync::Mutex::new("opening storage".to_owned()));
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &cfg.tls {
            builder = builder
                .tls_config(tls.tonic().map_err(ServerError::Tls)?)
                .map_err(|e| ServerError::Tls(e.to_string()))?;
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = builder
            .layer(RefuseLayer(phase.clone()))
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(second), async {
                let _ = stopped.await;
            });
        let task = tokio::spawn(async move {
            if let Err(e) = served.await {
                tracing::warn!(error = %e, "the starting port stopped");
            }
        });
        Ok(Starting { phase, stop, task })
    }

    /// Says what the process is doing now (`replaying the ledger's journal`).
    pub fn phase(&self, what: impl Into<String>) {
        let what = what.into();
        tracing::info!(phase = %what, "starting");
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = what;
    }

    /// Stops answering (connections made meanwhile are closed gracefully,
    /// and their clients reconnect to the real server).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Refuses everything but health with STARTING.
#[derive(Clone)]
struct RefuseLayer(std::sync::Arc<std::sync::Mutex<String>>);

impl<S> tower::Layer<S> for RefuseLayer {
    type Service = Refuse<S>;
    fn layer(&self, inner: S) -> Refuse<S> {
        Refuse {
            inner,
            phase: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct Refuse<S> {
    inner: S,
    phase: std::sync::Arc<std::sync::Mutex<String>>,
}

impl<S> tower::Service<http::Request<Body>> for Refuse<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path().starts_with("/grpc.health.v1.Health/") {
            return Box::pin(self.inner.call(req));
        }
        let phase = self.phase.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let refused = crate::error::status(
            tonic::Code::Unavailable,
            switchyard_core::Reason::Starting,
            format!("the server is starting ({phase}); retry shortly"),
        );
        Box::pin(async move { Ok(refused.into_http()) })
    }
}

/// Serves only `health` on `addr`, in plaintext, until `shutdown`.
async fn spawn_health_only(
    addr: &str,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    shutdown: Shutdown,
) -> Result<tokio::task::JoinHandle<()>, ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
    tracing::info!(addr = %addr, "health-only port (plaintext, for probes)");
    Ok(tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async move {
                shutdown.wait().await
            })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "health-only port stopped");
        }
    }))
}

/// Sets every hosted service, and the server as a whole (""), to `status`.
async fn set_all(
    reporter: &tonic_health::server::HealthReporter,
    names: &[&'static str],
    status: ServingStatus,
) {
    for name in names {
        reporter.set_service_status(*name, status).await;
    }
    reporter.set_service_status("", status).await;
}

fn flatten(
    r: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
) -> Result<(), ServerError> {
    match r {
        Ok(inner) => inner.map_err(ServerError::from),
        // The task only ends by returning or by our abort.
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::registry::v1::ListAgentsRequest;
    use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn while_starting_every_call_is_refused_with_starting_and_health_says_not_serving() {
        let cfg = ServerConfig {
            listen: "127.0.0.1:0".into(),
            ..Default::default()
        };
        let listener = bind(&cfg).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let starting = Starting::serve(&cfg, &listener).await.unwrap();
        starting.phase("replaying the ledger's journal");
        let ch = tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let refused = RegistryServiceClient::new(ch.clone())
            .list_agents(ListAgentsRequest::default())
            .await
            .unwrap_err();
        let api = crate::error::ApiError::from(refused.clone());
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert_eq!(api.known_reason(), Some(switchyard_core::Reason::Starting));
        assert!(
            refused.message().contains("replaying the ledger's journal"),
            "{refused:?}"
        );
        assert!(crate::error::is_outage(&refused), "callers wait, not fail");
        let mut health = HealthClient::new(ch);
        let check = |service: &str| HealthCheckRequest {
            service: service.into(),
        };
        let all = health.check(check("")).await.unwrap().into_inner().status;
        assert_eq!(all, ServingStatus::NotServing as i32);
        let live = health
            .check(check(LIVENESS))
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(
            live,
            ServingStatus::Serving as i32,
            "a long replay is not killed"
        );
        starting.stop().await;
    }
}
