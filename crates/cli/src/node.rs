//! One Switchyard process: the chosen services mounted on one gRPC port,
//! calling each other in-process when they share the process and over gRPC
//! when they do not.

use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context as _;
use switchyard_api::{ApprovalClient, AuthClient, LedgerClient, RegistryClient, RouterClient};
use switchyard_approval::Approval;
use switchyard_auth::Auth;
use switchyard_core::SystemClock;
use switchyard_executor::Executor;
use switchyard_kit::auth::authn::Authenticator;
use switchyard_kit::auth::keys::KeySet;
use switchyard_kit::client::Credential;
use switchyard_kit::server::Server;
use switchyard_kit::shutdown::Shutdown;
use switchyard_ledger::Ledger;
use switchyard_registry::Registry;
use switchyard_router::Router;
use switchyard_store::Store;
use tokio::net::TcpListener;

use crate::Config;

/// A service a process can host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceKind {
    /// API keys and who-am-i.
    Auth,
    /// Agents and tools.
    Registry,
    /// Capability routing.
    Router,
    /// Budgets, reservations and the cost journal.
    Ledger,
    /// Runs, approvals and the audit log.
    Approval,
    /// Jobs: conversion, approval, budgets, the durable DAG run, events.
    Executor,
    /// The other front doors: AITP REST/JSON and AGEniX RESP.
    Gateway,
}

impl ServiceKind {
    /// Every service implemented in this build (what `switchyard dev` runs).
    pub const ALL: &'static [ServiceKind] = &[
        ServiceKind::Auth,
        ServiceKind::Registry,
        ServiceKind::Router,
        ServiceKind::Ledger,
        ServiceKind::Approval,
        ServiceKind::Executor,
        ServiceKind::Gateway,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ServiceKind::Auth => "auth",
            ServiceKind::Registry => "registry",
            ServiceKind::Router => "router",
            ServiceKind::Ledger => "ledger",
            ServiceKind::Approval => "approval",
            ServiceKind::Executor => "executor",
            ServiceKind::Gateway => "gateway",
        }
    }
}

impl FromStr for ServiceKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ServiceKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ServiceKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown service {s:?}; expected one of: {}",
                    names.join(", ")
                )
            })
    }
}

/// The services that keep state, each in a store of its own name.
const STATEFUL: &[ServiceKind] = &[
    ServiceKind::Auth,
    ServiceKind::Registry,
    ServiceKind::Ledger,
    ServiceKind::Approval,
    ServiceKind::Executor,
];

/// Where a process hosting every stateful service (`switchyard dev`) keeps
/// them all: one database, each service under its own namespace, so one
/// group commit (one fsync) makes a round of all their writes durable
/// instead of one per service. `None` when the process hosts only some
/// (a split keeps a database per service, so the split can change), or
/// when the data directory already holds per-service databases from a
/// release before this layout (they go on being used as they are).
pub fn shared_store_path(
    data_dir: &std::path::Path,
    services: &[ServiceKind],
) -> Option<std::path::PathBuf> {
    let all = STATEFUL.iter().all(|k| services.contains(k));
    let apart = STATEFUL.iter().any(|k| data_dir.join(k.name()).exists());
    (all && !apart).then(|| data_dir.join(SHARED_STORE))
}

/// The shared database's directory under the data directory.
const SHARED_STORE: &str = "services";

/// The listeners of one process: the gRPC port, and the gateway's doors
/// when it hosts the gateway and they are on. Bound before the process
/// starts (binaries from the configuration, tests on `127.0.0.1:0`).
#[derive(Debug)]
pub struct Listeners {
    /// Every gRPC service, health, reflection and `/metrics`.
    pub grpc: TcpListener,
    /// The AITP REST/JSON door.
    pub http: Option<TcpListener>,
    /// The RESP door.
    pub resp: Option<TcpListener>,
}

impl From<TcpListener> for Listeners {
    fn from(grpc: TcpListener) -> Listeners {
        Listeners {
            grpc,
            http: None,
            resp: None,
        }
    }
}

/// Where a process listens, as its start-up line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    /// The gRPC port.
    pub grpc: std::net::SocketAddr,
    /// The AITP REST/JSON door, if open.
    pub http: Option<std::net::SocketAddr>,
    /// The RESP door, if open.
    pub resp: Option<std::net::SocketAddr>,
}

impl std::fmt::Display for Addresses {
    /// `grpc=127.0.0.1:7600 http=127.0.0.1:7680 resp=127.0.0.1:7679`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "grpc={}", self.grpc)?;
        if let Some(a) = self.http {
            write!(f, " http={a}")?;
        }
        if let Some(a) = self.resp {
            write!(f, " resp={a}")?;
        }
        Ok(())
    }
}

/// Binding a listen address failed. The message says the cause once (it
/// is not also chained as a source, which would print it twice).
#[derive(Debug, thiserror::Error)]
#[error("{addr}{}", in_use_hint(.cause))]
pub struct BindError {
    /// The address.
    pub addr: String,
    /// Why.
    pub cause: std::io::Error,
}

fn in_use_hint(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        " is already in use: another switchyard (or another program) listens there; stop it, or start this one elsewhere with --listen 127.0.0.1:0 and its own --data-dir".into()
    } else {
        format!(": {e}")
    }
}

impl Listeners {
    /// Binds what `cfg` asks for `services`: the gRPC port, and the
    /// gateway's open doors when it hosts the gateway.
    pub async fn bind(cfg: &Config, services: &[ServiceKind]) -> Result<Listeners, BindError> {
        let bind = |addr: String| async move {
            TcpListener::bind(&addr)
                .await
                .map_err(|cause| BindError { addr, cause })
        };
        let grpc = bind(cfg.server.listen.clone()).await?;
        let gateway = services.contains(&ServiceKind::Gateway);
        let g = &cfg.gateway;
        let http = match gateway && g.http.enabled {
            true => Some(bind(g.http_listen(&cfg.server.listen)).await?),
            false => None,
        };
        let resp = match gateway && g.resp.enabled {
            true => Some(bind(g.resp_listen(&cfg.server.listen)).await?),
            false => None,
        };
        Ok(Listeners { grpc, http, resp })
    }

    /// The bound addresses.
    pub fn addresses(&self) -> std::io::Result<Addresses> {
        let local = |l: &Option<TcpListener>| l.as_ref().map(TcpListener::local_addr).transpose();
        Ok(Addresses {
            grpc: self.grpc.local_addr()?,
            http: local(&self.http)?,
            resp: local(&self.resp)?,
        })
    }
}

/// The key the A2A door's Agent Card is signed with and the door's public
/// URL: `gateway.a2a`'s, or under `switchyard dev` (which writes its
/// credentials) a key kept in the data directory (`a2a-card-key.pem`, made
/// on the first start) and the HTTP door's own address. `None`: the card is
/// served unsigned.
fn card_key(
    cfg: &Config,
    http: Option<std::net::SocketAddr>,
) -> anyhow::Result<Option<(switchyard_a2a::signature::SigningKey, String)>> {
    use switchyard_a2a::signature::SigningKey;
    let a2a = &cfg.gateway.a2a;
    let (file, url) = match (&a2a.signing_key_file, &a2a.public_url, http) {
        (Some(f), Some(u), _) => (f.clone(), u.clone()),
        (None, None, Some(addr)) if cfg.auth.dev_credentials == Some(true) => {
            let f = cfg.storage.data_dir.join("a2a-card-key.pem");
            if !f.exists() {
                let pem = SigningKey::generate_pem().map_err(anyhow::Error::msg)?;
                switchyard_kit::fs::write_private(&f, pem.as_bytes())
                    .with_context(|| format!("writing {}", f.display()))?;
            }
            (f, format!("http://{addr}"))
        }
        _ => return Ok(None),
    };
    let pem = std::fs::read_to_string(&file)
        .with_context(|| format!("reading gateway.a2a.signing_key_file {}", file.display()))?;
    let key = SigningKey::from_pem(&pem)
        .map_err(|e| anyhow::anyhow!("gateway.a2a.signing_key_file {}: {e}", file.display()))?;
    Ok(Some((key, url)))
}

/// Runs `services` on `listeners` until `shutdown` fires, then drains and
/// flushes storage.
pub async fn run_node(
    cfg: Config,
    services: &[ServiceKind],
    listeners: impl Into<Listeners>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    run_node_then(cfg, services, listeners, shutdown, |_| {}).await
}

/// [`run_node`], calling `ready` once every store is open (their logs
/// replayed) and the services are about to serve. Until then the port
/// answers every call with UNAVAILABLE / STARTING and health NOT_SERVING.
pub async fn run_node_then(
    cfg: Config,
    services: &[ServiceKind],
    listeners: impl Into<Listeners>,
    signal: Shutdown,
    ready: impl FnOnce(Addresses),
) -> anyhow::Result<()> {
    // Stopping takes two steps once `signal` fires: the executor drains
    // (nothing new starts; running attempts get executor.drain_grace_ms to
    // end) while everything else still serves (a draining attempt may call
    // an agent or the ledger); then the doors stop accepting and finish
    // their calls as the services stop, and storage is flushed.
    let (doors_stop, doors) = switchyard_kit::shutdown::channel();
    let (services_stop, shutdown) = switchyard_kit::shutdown::channel();
    let listeners = listeners.into();
    let addresses = listeners.addresses()?;
    let Listeners {
        grpc: listener,
        http: http_listener,
        resp: resp_listener,
    } = listeners;
    cfg.validate().map_err(anyhow::Error::msg)?;
    switchyard_store::observe_flushes(|took| {
        switchyard_kit::metrics::global()
            .store_flush
            .observe(took.as_secs_f64())
    });
    let max = cfg.server.max_message_bytes;
    let starting = switchyard_kit::server::Starting::serve(&cfg.server, &listener).await?;
    // A lock still held by a node that stopped in this process (tests
    // restart in-process) is waited for, yielding to the runtime: the last
    // handle may belong to a task of the stopped node that has yet to run
    // to its end here. Another process holding it is an error at once.
    async fn reopen(path: &std::path::Path, what: &str) -> anyhow::Result<Store> {
        Store::reopen(path, std::time::Duration::from_secs(30))
            .await
            .with_context(|| format!("opening {what} store at {}", path.display()))
    }
    let shared = match shared_store_path(&cfg.storage.data_dir, services) {
        Some(path) => {
            starting.phase("opening the services' shared store".to_string());
            Some(reopen(&path, "the services' shared").await?)
        }
        None => None,
    };
    // The PostgreSQL pool, shared by this process's services that keep
    // their state there (ledger, approval, registry and executor).
    let pg = match cfg.storage.backend {
        crate::config::StorageBackend::Postgres => {
            starting.phase("connecting to PostgreSQL".to_string());
            Some(switchyard_store::pg::Pg::connect(&cfg.storage.postgres).await?)
        }
        crate::config::StorageBackend::Sled => None,
    };
    let open = |name: &'static str| {
        starting.phase(format!("opening and replaying the {name} store"));
        let (shared, dir) = (shared.as_ref(), cfg.storage.data_dir.join(name));
        async move {
            match shared {
                Some(store) => Ok(store.within(name)),
                None => reopen(&dir, name).await,
            }
        }
    };

    // Identity first: every port is served behind it.
    // A process following another's key set is not ready until its first
    // snapshot arrives.
    let keys = if services.contains(&ServiceKind::Auth) || cfg.auth.keys_url.is_none() {
        KeySet::default()
    } else {
        KeySet::pending()
    };
    // The cluster's service token (auth.service_token_env or _file): it
    // authenticates other processes here, and this process presents it to
    // them, with its certificate for https:// URLs (mTLS).
    let service_token = cfg.auth.service_token().map_err(anyhow::Error::msg)?;
    // Invocation grants are signed with a key every process of the
    // deployment derives from auth.grant_key_env, else from that token; one
    // process alone makes its own.
    if let Some(secret) = cfg.auth.grant_secret().map_err(anyhow::Error::msg)? {
        switchyard_kit::auth::grant::install(switchyard_kit::auth::grant::GrantKey::from_secret(
            secret.as_bytes(),
        ));
    }
    let authenticator =
        Authenticator::with_service_token(&cfg.auth, keys.clone(), service_token.as_deref())
            .map_err(anyhow::Error::msg)?;
    let credential = service_token
        .as_deref()
        .map(Credential::bearer)
        .transpose()?;
    let client_tls = match &cfg.auth.service_tls {
        Some(t) => Some(t.tonic().map_err(anyhow::Error::msg)?),
        None => None,
    };
    let remote = |url: &str| -> anyhow::Result<switchyard_kit::client::Intercepted> {
        Ok(switchyard_kit::client::service(
            switchyard_kit::client::service_channel(url, client_tls.as_ref())?,
            credential.clone(),
        ))
    };
    // One set of LLM providers per process: the executor and the
    // declarative agents share it, and so its model checks.
    let llm = switchyard_llm::Llm::new(&cfg.llm).map_err(anyhow::Error::msg)?;
    if services.contains(&ServiceKind::Executor) || cfg.agents.dir.is_some() {
        llm.spawn_model_checks();
    }
    let authenticator = Arc::new(authenticator);
    let mut server = Server::new(cfg.server.clone()).with_auth(authenticator.clone());
    let mut auth = None;
    if services.contains(&ServiceKind::Auth) {
        let a = Auth::open(open("auth").await?, keys.clone())?;
        if cfg.auth.dev_credentials() {
            let path = a.bootstrap_dev(&cfg.storage.data_dir).await?;
            tracing::info!(path = %path.display(), "dev credentials (admin, alice, bob) are in this file, mode 0600");
        }
        if let Some(var) = &cfg.auth.bootstrap_admin_env {
            let token = std::env::var(var)
                .with_context(|| format!("{var} (auth.bootstrap_admin_env) is not set"))?;
            if a.ensure_admin(&token, &cfg.auth.bootstrap_tenant).await? {
                tracing::info!(tenant = %cfg.auth.bootstrap_tenant, "bootstrap admin key created");
            }
        }
        server = server.add_service(a.server(max));
        auth = Some(a);
    } else if let Some(url) = &cfg.auth.keys_url {
        let client = AuthClient::remote(remote(url)?, max);
        let ready = switchyard_auth::spawn_follow(client, keys.clone(), shutdown.clone());
        // Serving before the key set arrives would refuse every key.
        let mut ready = ready;
        server = server.with_gate("switchyard.auth.v1.KeySet", async move {
            let _ = ready.wait_for(|r| *r).await;
        });
    } else {
        tracing::warn!(
            "no key source (auth.keys_url) and no auth service here: only the service token authenticates"
        );
    }

    let mut registry = None;

    if services.contains(&ServiceKind::Registry) {
        let mut registry_cfg = cfg.registry.clone();
        if registry_cfg.mcp.scratch_dir.as_os_str().is_empty() {
            registry_cfg.mcp.scratch_dir = default_mcp_scratch(&cfg.storage.data_dir)?;
        }
        let reg = match &pg {
            Some(db) => {
                starting.phase("migrating and loading the registry from PostgreSQL".to_string());
                Registry::open_pg(
                    registry_cfg,
                    db.clone(),
                    Arc::new(SystemClock),
                    shutdown.clone(),
                )
                .await?
            }
            None => {
                let store = open("registry").await?;
                blocking(|| {
                    Registry::open(registry_cfg, store, Arc::new(SystemClock), shutdown.clone())
                })?
            }
        };
        reg.spawn_background();
        server = server.add_service(reg.server(max));
        registry = Some(reg);
    }

    let mut router_svc = None;
    if services.contains(&ServiceKind::Router) {
        let client = match (&registry, &cfg.router.registry_url) {
            (Some(reg), _) => RegistryClient::local(Arc::new(reg.clone())),
            (None, Some(url)) => RegistryClient::remote(remote(url)?, max),
            (None, None) => anyhow::bail!(
                "the router needs a registry: run both in one process or pass --registry-url (router.registry_url)"
            ),
        };
        let router = Router::new(cfg.router.clone());
        router.spawn_sync(client, shutdown.clone());
        let ready = router.clone();
        server = server.add_gated_service(router.server(max), async move { ready.ready().await });
        router_svc = Some(router);
    }

    // One policy set for every service here, reloaded from its directory.
    let policies = cfg
        .policies()
        .map_err(anyhow::Error::msg)
        .context("loading the policy set ([[approval.policies]] and policy.dir)")?;
    {
        let stop = shutdown.clone();
        switchyard_policy::watch(
            policies.clone(),
            std::time::Duration::from_millis(cfg.policy.reload_ms),
            async move { stop.wait().await },
        );
        // Each load or refusal counted, for operators (and alerts on
        // `outcome="refused"`).
        let mut status = policies.status();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = status.changed() => if changed.is_err() { return },
                    () = stop.wait() => return,
                }
                let outcome = if status.borrow_and_update().refused.is_empty() {
                    "loaded"
                } else {
                    "refused"
                };
                switchyard_kit::metrics::global()
                    .policy_loads
                    .get_or_create(&switchyard_kit::metrics::PolicyLoadLabels {
                        outcome: outcome.into(),
                    })
                    .inc();
            }
        });
    }

    let mut ledger = None;
    if services.contains(&ServiceKind::Ledger) {
        let mut ledger_cfg = cfg.ledger.clone();
        ledger_cfg.prices = cfg.price_catalogue().map_err(anyhow::Error::msg)?;
        let l = match &pg {
            Some(db) => {
                starting.phase("migrating and opening the ledger on PostgreSQL".to_string());
                Ledger::open_pg(
                    ledger_cfg,
                    db.clone(),
                    Arc::new(SystemClock),
                    shutdown.clone(),
                )
                .await?
            }
            None => {
                let store = open("ledger").await?;
                blocking(|| {
                    Ledger::open(ledger_cfg, store, Arc::new(SystemClock), shutdown.clone())
                })?
            }
        };
        l.set_policies(policies.clone());
        l.spawn_sweeper();
        l.spawn_maintenance();
        server = server.add_service(l.server(max));
        ledger = Some(l);
    }

    let mut approval = None;
    if services.contains(&ServiceKind::Approval) {
        let a = match &pg {
            Some(db) => {
                starting.phase("migrating and opening approval on PostgreSQL".to_string());
                Approval::open_pg(
                    cfg.approval.clone(),
                    db.clone(),
                    Arc::new(SystemClock),
                    shutdown.clone(),
                )
                .await?
            }
            None => {
                let store = open("approval").await?;
                blocking(|| {
                    Approval::open(
                        cfg.approval.clone(),
                        store,
                        Arc::new(SystemClock),
                        shutdown.clone(),
                    )
                })?
            }
        };
        a.set_policies(policies.clone());
        // The policy store is this service's: read here.
        policies.set_feed(a.policy_feed());
        a.spawn_sweeper();
        a.spawn_pruner();
        a.spawn_dispatcher();
        if let Some(u) = &cfg.approval.adapters.executor_url {
            a.set_executor(switchyard_api::ExecutorClient::remote(remote(u)?, max));
        }
        server = server.add_service(a.server(max));
        approval = Some(a);
    }

    // Without the approval service here, the policy store is read from it
    // over gRPC (policy.approval_url, else an executor's approval_url).
    // Either way it is read now, and at each reload tick.
    if approval.is_none() {
        let url = cfg.policy.approval_url.clone().or_else(|| {
            services
                .contains(&ServiceKind::Executor)
                .then(|| cfg.executor.approval_url.clone())
                .flatten()
        });
        if let Some(u) = url {
            let client = ApprovalClient::remote(remote(&u)?, max);
            policies.set_feed(Arc::new(move || {
                let client = client.clone();
                Box::pin(async move {
                    let listed = client
                        .list_policies(switchyard_proto::approval::v1::ListPoliciesRequest {})
                        .await
                        .map_err(|e| e.message().to_owned())?;
                    Ok(listed
                        .policies
                        .iter()
                        .map(|p| switchyard_policy::stored_source(&p.name, &p.text))
                        .collect())
                })
            }));
        }
    }
    if let Err(e) = policies.refresh().await {
        tracing::warn!(error = %e, "the stored policy files do not load with the rest; the set without them stays in force");
    }

    let mut executor = None;
    if services.contains(&ServiceKind::Executor) {
        let e = &cfg.executor;
        let url = |what: &str,
                   u: &Option<String>|
         -> anyhow::Result<switchyard_kit::client::Intercepted> {
            let u = u.as_deref().with_context(|| {
                format!("the executor needs the {what}: run both in one process or set executor.{what}_url")
            })?;
            remote(u)
        };
        let clients = switchyard_executor::Clients {
            llm: llm.clone(),
            registry: match &registry {
                Some(r) => RegistryClient::local(Arc::new(r.clone())),
                None => RegistryClient::remote(url("registry", &e.registry_url)?, max),
            },
            router: match &router_svc {
                Some(r) => RouterClient::local(Arc::new(r.clone())),
                None => RouterClient::remote(url("router", &e.router_url)?, max),
            },
            ledger: match &ledger {
                Some(l) => LedgerClient::local(Arc::new(l.clone())),
                None => LedgerClient::remote(url("ledger", &e.ledger_url)?, max),
            },
            approval: match &approval {
                Some(a) => ApprovalClient::local(Arc::new(a.clone())),
                None => ApprovalClient::remote(url("approval", &e.approval_url)?, max),
            },
        };
        // The deployment's `[audit]` key signs the journal's seals.
        let mut e = e.clone();
        e.audit = cfg.audit.clone();
        let x = match &pg {
            Some(db) => {
                Executor::open_pg(
                    e.clone(),
                    db.clone(),
                    clients,
                    Arc::new(SystemClock),
                    shutdown.clone(),
                    &cfg.storage.data_dir,
                    max,
                )
                .await?
            }
            None => {
                let store = open("executor").await?;
                blocking(|| {
                    Executor::open(
                        e.clone(),
                        store,
                        clients,
                        Arc::new(SystemClock),
                        shutdown.clone(),
                        &cfg.storage.data_dir,
                        max,
                    )
                })?
            }
        };
        x.set_policies(policies.clone());
        x.start(listener.local_addr()?);
        if let Some(a) = &approval {
            a.set_executor(switchyard_api::ExecutorClient::local(Arc::new(x.clone())));
        }
        server = server.add_service(x.server(max));
        server = server.add_service(x.worker_server(max));
        server = server.add_service(x.schedule_server(max));
        server = server.add_service(x.trigger_server(max));
        server = server.add_service(x.notification_server(max));
        if e.builtin_agents {
            server = server.add_service(x.builtin_agents_server());
        }
        executor = Some(x);
    }

    // The other doors: they call the executor as their callers, in-process
    // when it is here, else over gRPC with each caller's own credential
    // (so the channel carries none of its own).
    let gateway = if services.contains(&ServiceKind::Gateway) {
        let (client, workers) = match &executor {
            Some(x) => (
                switchyard_api::ExecutorClient::local(Arc::new(x.clone())),
                switchyard_api::WorkerClient::local(Arc::new(x.clone())),
            ),
            None => {
                let url = cfg.gateway.executor_url.as_deref().context(
                    "the gateway needs the executor: run both in one process or set gateway.executor_url",
                )?;
                let channel = switchyard_kit::client::service_channel(url, client_tls.as_ref())?;
                let channel = switchyard_kit::client::authed(channel, None);
                (
                    switchyard_api::ExecutorClient::remote(channel.clone(), max),
                    switchyard_api::WorkerClient::remote(channel, max),
                )
            }
        };
        let triggers = match &executor {
            Some(x) => switchyard_api::TriggerClient::local(Arc::new(x.clone())),
            None => {
                let url = cfg.gateway.executor_url.as_deref().context(
                    "the gateway needs the executor: run both in one process or set gateway.executor_url",
                )?;
                let channel = switchyard_kit::client::service_channel(url, client_tls.as_ref())?;
                switchyard_api::TriggerClient::remote(
                    switchyard_kit::client::authed(channel, None),
                    max,
                )
            }
        };
        let mut jobs = switchyard_gateway::Jobs::new(client, workers).with_triggers(triggers);
        // The console calls each service as the signed-in person: here when
        // hosted, else at the configured URL with no credential of its own.
        let bare = |url: &str| -> anyhow::Result<switchyard_kit::client::Intercepted> {
            let channel = switchyard_kit::client::service_channel(url, client_tls.as_ref())?;
            Ok(switchyard_kit::client::authed(channel, None))
        };
        let console = switchyard_gateway::ConsoleServices {
            // Sessions live with the keys: here when hosted, else where
            // this process follows the key set from.
            auth: match (&auth, &cfg.auth.keys_url) {
                (Some(a), _) => Some(AuthClient::local(Arc::new(a.clone()))),
                (None, Some(url)) => Some(AuthClient::remote(bare(url)?, max)),
                (None, None) => None,
            },
            approval: match (&approval, &cfg.gateway.approval_url) {
                (Some(a), _) => Some(ApprovalClient::local(Arc::new(a.clone()))),
                (None, Some(url)) => Some(ApprovalClient::remote(bare(url)?, max)),
                (None, None) => None,
            },
            ledger: match (&ledger, &cfg.gateway.ledger_url) {
                (Some(l), _) => Some(LedgerClient::local(Arc::new(l.clone()))),
                (None, Some(url)) => Some(LedgerClient::remote(bare(url)?, max)),
                (None, None) => None,
            },
            registry: match (&registry, &cfg.gateway.registry_url) {
                (Some(r), _) => Some(RegistryClient::local(Arc::new(r.clone()))),
                (None, Some(url)) => Some(RegistryClient::remote(bare(url)?, max)),
                (None, None) => None,
            },
            router: match (&router_svc, &cfg.gateway.router_url) {
                (Some(r), _) => Some(RouterClient::local(Arc::new(r.clone()))),
                (None, Some(url)) => Some(RouterClient::remote(bare(url)?, max)),
                (None, None) => None,
            },
            notifications: match (&executor, &cfg.gateway.executor_url) {
                (Some(x), _) => Some(switchyard_api::NotificationClient::local(Arc::new(
                    x.clone(),
                ))),
                (None, Some(url)) => {
                    Some(switchyard_api::NotificationClient::remote(bare(url)?, max))
                }
                (None, None) => None,
            },
            // The executor hosts the schedules.
            schedules: match (&executor, &cfg.gateway.executor_url) {
                (Some(x), _) => Some(switchyard_api::ScheduleClient::local(Arc::new(x.clone()))),
                (None, Some(url)) => Some(switchyard_api::ScheduleClient::remote(bare(url)?, max)),
                (None, None) => None,
            },
            oidc: switchyard_gateway::console::oidc::Provider::new(
                &cfg.gateway.console.oidc,
                cfg.auth.oidc.as_ref().map(|o| o.issuer.as_str()),
            )
            .map_err(anyhow::Error::msg)?
            .map(Arc::new),
            dev_keys: (auth.is_some() && cfg.auth.dev_credentials == Some(true)).then(|| {
                cfg.storage
                    .data_dir
                    .join(switchyard_auth::credentials::FILE)
            }),
        };
        if let Some(a) = console.approval.clone() {
            jobs = jobs.with_approvals(a);
        }
        // `/mcp` calls the services with each request's own token, over
        // gRPC: this node's port for the services it hosts, the configured
        // URLs for the others. A gRPC client at the HTTP door is told it.
        let own = format!("http://{}", listener.local_addr()?);
        let mut gateway =
            switchyard_gateway::Gateway::new(cfg.gateway.clone(), max, jobs, authenticator.clone())
                .with_console(console)
                .with_grpc_address(own.clone());
        if let Some((key, url)) = card_key(&cfg, addresses.http)? {
            tracing::info!(kid = %key.kid(), public_url = %url, "the A2A Agent Card is signed");
            gateway = gateway.with_signed_card(key, &url);
        }
        let url_of = |here: bool, there: &Option<String>| {
            if here {
                Some(own.clone())
            } else {
                there.clone()
            }
        };
        let urls = [
            url_of(executor.is_some(), &cfg.gateway.executor_url),
            url_of(registry.is_some(), &cfg.gateway.registry_url),
            url_of(approval.is_some(), &cfg.gateway.approval_url),
        ];
        Some(match urls {
            [Some(x), Some(r), Some(a)] if cfg.gateway.mcp.enabled => {
                let ch = |u: &str| switchyard_kit::client::service_channel(u, client_tls.as_ref());
                let server = switchyard_mcp::server::SwitchyardMcp::with_channels(
                    [ch(&x)?, ch(&r)?, ch(&a)?],
                    switchyard_mcp::server::Identity::PerRequest,
                    max,
                );
                gateway.with_mcp(server)
            }
            _ => {
                if cfg.gateway.mcp.enabled {
                    tracing::warn!(
                        "/mcp is not served: the gateway needs the executor, registry and approval here or at gateway.executor_url, registry_url and approval_url"
                    );
                }
                gateway
            }
        })
    } else {
        None
    };

    // Declarative agents (`[agents] dir`): their own AgentService endpoint,
    // talking to this node's services over loopback like any agent process.
    let mut agents_hosted = None;
    if let Some(dir) = &cfg.agents.dir {
        let own = format!("http://{}", listener.local_addr()?);
        // They call this node over loopback as an agent would, with the dev
        // agents identity (or the service token in split deployments).
        let agents_credential = if cfg.auth.dev_credentials() {
            {
                let path = cfg
                    .storage
                    .data_dir
                    .join(switchyard_auth::credentials::FILE);
                let creds = switchyard_auth::credentials::Credentials::read(&path)
                    .map_err(anyhow::Error::msg)?;
                let token = creds
                    .token("agents")
                    .with_context(|| format!("{} has no agents credential", path.display()))?;
                Some(Credential::bearer(token)?)
            }
        } else {
            credential.clone()
        };
        agents_hosted = Some(crate::agents::host(
            &cfg,
            dir,
            Some(&own),
            agents_credential,
            llm.clone(),
        )?);
    }

    starting.stop().await;
    // The declarative agents call this node: only once it no longer
    // answers "starting" (their first call, the tool-collision check, would
    // be refused and end them). Calls made before `server.run` accepts wait
    // in the listen backlog.
    let agents_task = agents_hosted.map(|hosted| {
        let ids = hosted.ids();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let r = switchyard_agents::serve_until(hosted, stop, |addr| {
                tracing::info!(%addr, agents = ?ids, "declarative agents serving");
            })
            .await;
            if let Err(e) = &r {
                tracing::error!(error = %e, "declarative agents stopped");
            }
            r
        })
    });
    let gateway_task = gateway.map(|g| {
        let drain = std::time::Duration::from_millis(cfg.server.drain_timeout_ms);
        tokio::spawn(g.run(http_listener, resp_listener, doors.clone(), drain))
    });
    let names: Vec<_> = services.iter().map(|s| s.name()).collect();
    tracing::info!(services = ?names, addr = %addresses, "serving");
    ready(addresses);
    let drainer = {
        let x = executor.clone();
        let services_stop = services_stop.clone();
        tokio::spawn(async move {
            signal.wait().await;
            if let Some(x) = x {
                x.drain().await;
            }
            doors_stop.fire();
            // At once, as before draining existed: background tasks end
            // while the doors finish, not after the node has returned.
            services_stop.fire();
        })
    };
    server.run(listener, doors).await?;
    services_stop.fire();
    drainer.abort();
    if let Some(t) = gateway_task {
        match t.await {
            Ok(Err(e)) => tracing::error!(error = %e, "gateway stopped"),
            Err(e) => tracing::error!(error = %e, "gateway task failed"),
            Ok(Ok(())) => {}
        }
    }
    if let Some(t) = agents_task
        && let Err(e) = t.await
    {
        tracing::error!(error = %e, "declarative agents task failed");
    }
    if let Some(a) = auth {
        a.flush().context("flushing auth storage")?;
    }
    if let Some(reg) = registry {
        reg.flush().context("flushing registry storage")?;
    }
    if let Some(l) = ledger {
        l.flush().context("flushing ledger storage")?;
    }
    if let Some(a) = approval {
        a.flush().context("flushing approval storage")?;
    }
    if let Some(x) = executor {
        x.close().await;
        x.flush().context("flushing executor storage")?;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Runs a store's replay (CPU-bound, synchronous) without holding up the
/// runtime's other tasks (the starting port answers meanwhile).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_parse_and_unknown_names_list_the_choices() {
        assert_eq!(
            "router".parse::<ServiceKind>().unwrap(),
            ServiceKind::Router
        );
        let e = "ledgr".parse::<ServiceKind>().unwrap_err();
        assert!(
            e.contains("auth, registry, router, ledger, approval, executor, gateway"),
            "{e}"
        );
    }

    #[test]
    fn every_stateful_service_in_one_process_shares_a_store_unless_the_data_dir_is_per_service() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("services");
        assert_eq!(
            shared_store_path(dir.path(), ServiceKind::ALL),
            Some(shared.clone())
        );
        let split = [ServiceKind::Ledger, ServiceKind::Approval];
        assert_eq!(shared_store_path(dir.path(), &split), None);
        // A data directory from before the shared layout keeps its own.
        std::fs::create_dir_all(dir.path().join("ledger")).unwrap();
        assert_eq!(shared_store_path(dir.path(), ServiceKind::ALL), None);
    }
}

/// Where stdio MCP servers' scratch directories go when the config names no
/// place. A server may resolve its directory by absolute path (the reference
/// filesystem server does), which the sandbox's user — 65534, when this
/// process runs as root — cannot do under the 0700 data directory. So as
/// root the root is a directory of this data directory's own under the
/// system temp dir, mode 0711 (passable, not listable) and owned by root;
/// each server's directory in it is 0700 and the server's. As another user
/// the sandbox keeps that user, and `<data_dir>/mcp` serves.
pub fn default_mcp_scratch(data_dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    if !rustix::process::geteuid().is_root() {
        return Ok(data_dir.join("mcp"));
    }
    let absolute = std::path::absolute(data_dir)?;
    let digest = <sha2::Sha256 as sha2::Digest>::digest(absolute.as_os_str().as_encoded_bytes());
    let tag: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("switchyard-mcp-{tag}"));
    match std::fs::DirBuilder::new().create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => anyhow::bail!("making the MCP scratch root {}: {e}", dir.display()),
    }
    // The temp dir is everyone's: a directory someone else made (or a link)
    // in our place is refused, never used.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != 0 {
        anyhow::bail!(
            "{} is not a directory of root's: remove it, or set registry.mcp.scratch_dir",
            dir.display()
        );
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?;
    Ok(dir)
}

#[cfg(test)]
mod scratch_tests {
    use super::default_mcp_scratch;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    #[test]
    fn stdio_mcp_servers_get_a_scratch_root_their_sandbox_user_can_pass() {
        let data = tempfile::tempdir().expect("tempdir");
        let root = default_mcp_scratch(data.path()).expect("a scratch root");
        if !rustix::process::geteuid().is_root() {
            assert_eq!(root, data.path().join("mcp"));
            return;
        }
        // Not under the 0700 data dir; passable by others, not listable.
        assert!(!root.starts_with(data.path()), "{}", root.display());
        let meta = std::fs::metadata(&root).expect("made");
        assert_eq!((meta.permissions().mode() & 0o777, meta.uid()), (0o711, 0));
        // The same data dir, the same root; another data dir, another.
        assert_eq!(default_mcp_scratch(data.path()).expect("again"), root);
        let other = tempfile::tempdir().expect("tempdir");
        let elsewhere = default_mcp_scratch(other.path()).expect("another root");
        assert_ne!(elsewhere, root);
        // Someone else's directory in its place is refused, not used.
        std::fs::remove_dir(&elsewhere).expect("empty");
        std::os::unix::fs::symlink(data.path(), &elsewhere).expect("a link in its place");
        let refused = default_mcp_scratch(other.path()).expect_err("a link is refused");
        assert!(
            refused.to_string().contains("not a directory of root's"),
            "{refused}"
        );
        std::fs::remove_file(&elsewhere).expect("cleanup");
        std::fs::remove_dir(&root).expect("cleanup");
    }
}
