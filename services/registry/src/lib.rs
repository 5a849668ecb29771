//! The Switchyard registry (AINS): which agents and tools exist, what they can
//! do at what price and trust, whether they are alive (leases kept by
//! heartbeats), how they have performed (per-capability outcome stats), and a
//! resumable watch of all of it that routers build their index from.
//!
//! Called by agents (register, heartbeat), the executor (report outcomes), the
//! router (watch) and the CLI. Durable records live in sled; heartbeats and
//! stats are held in memory and written lazily, never one fsync each.

pub mod a2a;
mod durable;
pub mod mcp;
mod state;
pub mod validate;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::{Clock, Reason, Violations, offer};
use switchyard_kit::auth::{Principal, Role, principal};
use switchyard_kit::error::{invalid_argument, status_with_metadata};
use switchyard_kit::shutdown::Shutdown;
use switchyard_kit::time::{duration, duration_ms, timestamp, timestamp_ms};
use switchyard_proto::registry::v1::registry_service_server::{
    RegistryService, RegistryServiceServer,
};
use switchyard_proto::registry::v1::*;
use switchyard_store::{Store, StoreError};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use state::{Catchup, Entry, State};

/// `[registry]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// How long a registration or heartbeat keeps an agent available.
    pub lease_ttl_secs: u64,
    /// How often lapsed leases are detected, ms.
    pub sweep_interval_ms: u64,
    /// How often heartbeat and stats changes are written to disk, ms.
    pub persist_interval_ms: u64,
    /// Watch events kept for resuming; older positions get a snapshot.
    pub watch_log_capacity: usize,
    /// Weight of the newest sample in the latency EWMA (0–1].
    pub ewma_alpha: f64,
    /// MCP servers as tool providers (`[registry.mcp]`).
    pub mcp: mcp::McpConfig,
    /// A2A agents (`[registry.a2a]`).
    pub a2a: a2a::A2aConfig,
    /// The highest trust score an agent key may claim for an agent it
    /// registers itself (seed 002: 0–100). Trust steers routing, so it is
    /// an operator's to grant: a higher claim is lowered to this, and
    /// re-registering keeps what the agent already had.
    pub self_declared_trust_max: u32,
    /// Which destinations a caller may register: agent endpoints, MCP
    /// servers, A2A cards (`[registry.egress]`).
    pub egress: switchyard_kit::egress::EgressConfig,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            lease_ttl_secs: 30,
            sweep_interval_ms: 500,
            persist_interval_ms: 2_000,
            watch_log_capacity: 100_000,
            ewma_alpha: 0.2,
            mcp: mcp::McpConfig::default(),
            a2a: a2a::A2aConfig::default(),
            // The router's default minimum: routable, never preferred on trust.
            self_declared_trust_max: 50,
            egress: Default::default(),
        }
    }
}

impl RegistryConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_ttl_secs == 0 {
            return Err("registry.lease_ttl_secs must be > 0".into());
        }
        if self.sweep_interval_ms == 0 || self.persist_interval_ms == 0 {
            return Err("registry.sweep_interval_ms and persist_interval_ms must be > 0".into());
        }
        if !(self.ewma_alpha > 0.0 && self.ewma_alpha <= 1.0) {
            return Err(format!(
                "registry.ewma_alpha must be in (0, 1], got {}",
                self.ewma_alpha
            ));
        }
        self.mcp.validate()?;
        self.a2a.validate()
    }
}

/// Registry failures; each maps to one gRPC status in `From<RegistryError>`.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The request has invalid fields.
    #[error("invalid request: {0}")]
    Invalid(Violations),
    /// A tool's parameters are not a valid JSON Schema.
    #[error("invalid tool schema: {0}")]
    InvalidToolSchema(Violations),
    /// No such agent.
    #[error("agent {0:?} is not registered")]
    AgentNotFound(String),
    /// No such tool.
    #[error("tool {0:?} is not registered")]
    ToolNotFound(String),
    /// The tool is still listed by agents.
    #[error("tool {tool:?} is used by agents: {}", agents.join(", "))]
    ToolInUse {
        /// Tool name.
        tool: String,
        /// Agents listing it.
        agents: Vec<String>,
    },
    /// The agent or tool belongs to another subject (or is a shared
    /// platform object) and the caller may change only its own.
    #[error(
        "{what} {id:?} belongs to {owner:?}; you may change only your own (operators and admins may change any of the tenant's)"
    )]
    NotOwner {
        /// `agent` or `tool`.
        what: &'static str,
        /// Its id or name.
        id: String,
        /// Its owner (`platform` for shared ones).
        owner: String,
    },
    /// The id is taken by another tenant's agent or tool.
    #[error("{what} id {id:?} is taken; choose another")]
    Taken {
        /// `agent` or `tool`.
        what: &'static str,
        /// The id.
        id: String,
    },
    /// An Agent Card could not be read, or does not describe an agent
    /// Switchyard can call; nothing was stored.
    #[error("A2A agent card {url:?}: {message}")]
    A2aUnavailable {
        /// The card's URL.
        url: String,
        /// Why.
        message: String,
    },
    /// An Agent Card's signature does not verify with a key trusted for it
    /// (or it is unsigned where a signature is required); nothing was
    /// stored, or the agent's lease was not renewed.
    #[error("A2A agent card {url:?}: {message}")]
    A2aUnverified {
        /// The card's URL.
        url: String,
        /// Why.
        message: String,
    },
    /// No such MCP server.
    #[error("MCP server {0:?} is not registered")]
    McpServerNotFound(String),
    /// An MCP server could not be started, reached or initialised, or did
    /// not list its tools; nothing was stored.
    #[error("MCP server {server:?} is unavailable: {message}")]
    McpUnavailable {
        /// Server name.
        server: String,
        /// Why (never a credential).
        message: String,
    },
    /// The tool comes from an MCP server and follows it.
    #[error(
        "tool {tool:?} comes from MCP server {server:?}: register or deregister the server instead"
    )]
    McpToolManaged {
        /// Tool name.
        tool: String,
        /// Its server.
        server: String,
    },
    /// Storage failed; nothing was acknowledged.
    #[error("storage failed: {0}")]
    Storage(#[from] StoreError),
}

/// Who may change an agent or tool of `tenant` owned by `owner`: `Ok` or
/// why not. Others' tenants' objects do not exist for the caller; shared
/// (platform) ones belong to the services; within a tenant, operators and
/// admins change any, agents only their own.
fn may_change(
    p: &Principal,
    what: &'static str,
    id: &str,
    tenant: &str,
    owner: &str,
) -> Result<(), RegistryError> {
    let unscoped = p.tenant_scope().is_none();
    if !tenant.is_empty() && !p.sees_tenant(tenant) {
        return Err(RegistryError::Taken {
            what,
            id: id.to_owned(),
        });
    }
    if tenant.is_empty() && !unscoped {
        return Err(RegistryError::NotOwner {
            what,
            id: id.to_owned(),
            owner: "platform".into(),
        });
    }
    let manager = [Role::Operator, Role::Admin, Role::Service]
        .into_iter()
        .any(|r| p.roles.has(r));
    if manager || p.owns(owner) {
        Ok(())
    } else {
        Err(RegistryError::NotOwner {
            what,
            id: id.to_owned(),
            owner: owner.to_owned(),
        })
    }
}

/// Tools from an MCP server change only with the server.
fn managed(t: &Tool) -> Result<(), RegistryError> {
    if t.mcp_server.is_empty() {
        Ok(())
    } else {
        Err(RegistryError::McpToolManaged {
            tool: t.name.clone(),
            server: t.mcp_server.clone(),
        })
    }
}

/// Whether `p` sees an agent or tool of `tenant` (its own tenant's, and the
/// shared platform ones).
fn sees(p: &Principal, tenant: &str) -> bool {
    tenant.is_empty() || p.sees_tenant(tenant)
}

impl From<RegistryError> for Status {
    fn from(e: RegistryError) -> Status {
        let msg = e.to_string();
        match e {
            RegistryError::Invalid(v) => invalid_argument(Reason::InvalidArgument, &v),
            RegistryError::NotOwner { what, id, owner } => status_with_metadata(
                Code::PermissionDenied,
                Reason::PermissionDenied,
                msg,
                HashMap::from([
                    ("permission".into(), format!("{what}.owner")),
                    (format!("{what}_id"), id),
                    ("owner".into(), owner),
                ]),
            ),
            RegistryError::Taken { what, .. } => {
                let mut v = Violations::new();
                v.add(
                    if what == "agent" {
                        "agent.id"
                    } else {
                        "tool.name"
                    },
                    msg,
                );
                invalid_argument(Reason::InvalidArgument, &v)
            }
            RegistryError::InvalidToolSchema(v) => invalid_argument(Reason::InvalidToolSchema, &v),
            RegistryError::AgentNotFound(id) => status_with_metadata(
                Code::NotFound,
                Reason::AgentNotFound,
                msg,
                HashMap::from([("agent_id".into(), id)]),
            ),
            RegistryError::ToolNotFound(name) => status_with_metadata(
                Code::NotFound,
                Reason::ToolNotFound,
                msg,
                HashMap::from([("tool".into(), name)]),
            ),
            RegistryError::ToolInUse { tool, agents } => status_with_metadata(
                Code::FailedPrecondition,
                Reason::ToolInUse,
                msg,
                HashMap::from([("tool".into(), tool), ("agents".into(), agents.join(","))]),
            ),
            RegistryError::A2aUnavailable { url, .. } => status_with_metadata(
                Code::FailedPrecondition,
                Reason::A2aAgentUnavailable,
                msg,
                HashMap::from([("card_url".into(), url)]),
            ),
            RegistryError::A2aUnverified { url, .. } => status_with_metadata(
                Code::FailedPrecondition,
                Reason::A2aCardUnverified,
                msg,
                HashMap::from([("card_url".into(), url)]),
            ),
            RegistryError::McpServerNotFound(name) => status_with_metadata(
                Code::NotFound,
                Reason::McpServerNotFound,
                msg,
                HashMap::from([("server".into(), name)]),
            ),
            RegistryError::McpUnavailable { server, .. } => status_with_metadata(
                Code::FailedPrecondition,
                Reason::McpServerUnavailable,
                msg,
                HashMap::from([("server".into(), server)]),
            ),
            RegistryError::McpToolManaged { tool, server } => status_with_metadata(
                Code::FailedPrecondition,
                Reason::McpToolManaged,
                msg,
                HashMap::from([("tool".into(), tool), ("server".into(), server)]),
            ),
            RegistryError::Storage(_) => {
                switchyard_kit::error::status(Code::Unavailable, Reason::StorageFailure, msg)
            }
        }
    }
}

pub(crate) fn invalid(field: &str, description: impl Into<String>) -> RegistryError {
    let mut v = Violations::new();
    v.add(field, description);
    RegistryError::Invalid(v)
}

struct Inner {
    cfg: RegistryConfig,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    head_tx: watch::Sender<u64>,
    /// Where the records are kept.
    durable: durable::Durable,
    /// When this replica last read the leases others wrote (PostgreSQL), ms.
    lease_synced_ms: std::sync::atomic::AtomicU64,
    hub: mcp::Hub,
    /// For Agent Cards and HTTP MCP servers.
    http: Result<reqwest::Client, String>,
    shutdown: Shutdown,
}

/// The in-memory entry of a stored agent: available while its lease runs,
/// lapsed once it ran out.
fn entry_of(mut agent: Agent, now: u64) -> Entry {
    let lease = agent.lease_expires_at.as_ref().map_or(0, timestamp_ms);
    agent.status = if lease > now {
        AgentStatus::Available
    } else {
        AgentStatus::Lapsed
    } as i32;
    Entry {
        agent,
        lease_expires_ms: lease,
        dirty: false,
    }
}

/// Registered agents by status.
impl switchyard_kit::metrics::Gauges for Inner {
    fn set(&self, m: &switchyard_kit::metrics::Metrics) {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for e in st.agents.values() {
            let status = e
                .status()
                .as_str_name()
                .trim_start_matches("AGENT_STATUS_")
                .to_ascii_lowercase();
            m.agents
                .get_or_create(&switchyard_kit::metrics::StateLabels { state: status })
                .inc();
        }
    }
}

/// The registry service. Cheap to clone; all clones share state.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// Opens the registry on `store`, loading every stored agent and tool.
    /// Agents whose lease ran out while the registry was down come back lapsed.
    pub fn open(
        cfg: RegistryConfig,
        store: Store,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
    ) -> Result<Registry, RegistryError> {
        let durable = durable::Durable::sled(store)?;
        let loaded = durable.load_sled()?;
        Ok(Self::with(cfg, clock, shutdown, durable, loaded))
    }

    /// Opens the registry on PostgreSQL (migrating the schema first), as
    /// one of any number of replicas sharing the database: it loads every
    /// stored record, then follows the other replicas' changes.
    pub async fn open_pg(
        cfg: RegistryConfig,
        db: switchyard_store::pg::Pg,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
    ) -> Result<Registry, RegistryError> {
        let pg = durable::PgRegistry::open(db).await?;
        // Changes from here on are replayed (re-reading a record is
        // harmless): a little before the last, for transactions in flight.
        let from = pg.last_change().await?.saturating_sub(1_000);
        let durable = durable::Durable::Pg(pg);
        let loaded = durable.load().await?;
        let reg = Self::with(cfg, clock, shutdown, durable, loaded);
        reg.follow_changes(from);
        Ok(reg)
    }

    /// Applies migrations of the registry's tables to `db`.
    pub async fn migrate(db: &switchyard_store::pg::Pg) -> Result<usize, RegistryError> {
        Ok(db.migrate_service("registry", durable::MIGRATIONS).await?)
    }

    fn with(
        cfg: RegistryConfig,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        durable: durable::Durable,
        (agents, tools, servers): durable::Loaded,
    ) -> Registry {
        let now = clock.now_ms();
        let mut st = State::new(
            uuid::Uuid::new_v4().simple().to_string(),
            cfg.watch_log_capacity,
        );
        for tool in tools {
            st.tools.insert(tool.name.clone(), tool);
        }
        for agent in agents {
            st.put_agent(entry_of(agent, now));
        }
        tracing::info!(agents = st.agents.len(), tools = st.tools.len(), epoch = %st.epoch, "registry loaded");
        let (head_tx, _) = watch::channel(0);
        let http = switchyard_a2a::http_client();
        let hub = mcp::Hub::new(cfg.mcp.clone(), http.clone());
        let inner = Arc::new(Inner {
            cfg,
            clock,
            state: Mutex::new(st),
            head_tx,
            durable,
            lease_synced_ms: std::sync::atomic::AtomicU64::new(0),
            hub,
            http,
            shutdown,
        });
        switchyard_kit::metrics::global().add_gauges(&inner);
        let reg = Registry { inner };
        for server in servers {
            reg.load_mcp_server(server);
        }
        reg
    }

    /// Applies the other replicas' changes (PostgreSQL) as they commit:
    /// each record named is read again and replaces this replica's view.
    fn follow_changes(&self, after: u64) {
        let changes = self.inner.durable.changes(after);
        let me = self.clone();
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut changes =
                std::pin::pin!(changes.take_until(async move { shutdown.wait().await }));
            while let Some(c) = changes.next().await {
                match c {
                    Ok(c) => {
                        if let Err(e) = me.apply_change(c).await {
                            tracing::warn!(error = %e, "applying another replica's change");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "following the registry's changes"),
                }
            }
        });
    }

    async fn apply_change(&self, c: durable::Change) -> Result<(), RegistryError> {
        let durable = &self.inner.durable;
        let now = self.inner.clock.now_ms();
        match c {
            durable::Change::Agent(id) => {
                let stored = durable.agent(&id).await?;
                let mut st = self.lock();
                match stored {
                    Some(agent) => {
                        st.put_agent(entry_of(agent, now));
                        st.emit_agent(&id);
                    }
                    None => {
                        if st.remove_agent(&id).is_some() {
                            st.emit_agent_removed(&id);
                        }
                    }
                }
            }
            durable::Change::Tool(name) => {
                let stored = durable.tool(&name).await?;
                let mut st = self.lock();
                match stored {
                    Some(tool) => {
                        st.tools.insert(name.clone(), tool.clone());
                        st.emit_tool(tool);
                    }
                    None => {
                        if st.tools.remove(&name).is_some() {
                            st.emit_tool_removed(&name);
                        }
                    }
                }
            }
            durable::Change::Mcp(name) => match durable.mcp(&name).await? {
                Some(server) => self.load_mcp_server(server),
                None => self.unload_mcp_server(&name),
            },
        }
        self.notify();
        Ok(())
    }

    /// Runs lease sweeping and lazy persistence until shutdown.
    pub fn spawn_background(&self) {
        let cfg = &self.inner.cfg;
        let shutdown = &self.inner.shutdown;
        let me = self.clone();
        shutdown.spawn_every(
            Duration::from_millis(cfg.sweep_interval_ms),
            "sweeping leases",
            move || {
                let me = me.clone();
                async move {
                    me.sync_leases().await?;
                    me.sweep();
                    Ok::<_, RegistryError>(())
                }
            },
        );
        let me = self.clone();
        shutdown.spawn_every(
            Duration::from_millis(cfg.persist_interval_ms),
            "persisting heartbeats",
            move || {
                let me = me.clone();
                async move { me.persist_dirty().await.map(drop) }
            },
        );
        self.spawn_mcp_connections();
        self.spawn_a2a_leases();
    }

    /// Marks agents whose lease ran out as lapsed; returns how many lapsed.
    pub fn sweep(&self) -> usize {
        let now = self.inner.clock.now_ms();
        let lapsed = {
            let mut st = self.lock();
            let ids: Vec<String> = st
                .agents
                .iter()
                .filter(|(_, e)| e.status() == AgentStatus::Available && e.lease_expires_ms <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                if let Some(e) = st.agents.get_mut(id) {
                    e.agent.status = AgentStatus::Lapsed as i32;
                    e.dirty = true;
                }
                st.emit_agent(id);
                tracing::info!(agent_id = %id, "agent lease lapsed");
            }
            ids.len()
        };
        if lapsed > 0 {
            self.notify();
        }
        lapsed
    }

    /// Takes in the leases, in-flight counts and statistics other replicas
    /// wrote since the last look (PostgreSQL), so every replica lapses an
    /// agent from the same lease and routes on the same saturation.
    pub async fn sync_leases(&self) -> Result<usize, RegistryError> {
        let now = self.inner.clock.now_ms();
        // Batches are written once per persist interval: looking more often
        // would only read the same rows again. Each look reaches back one
        // interval before the last (batches in flight, clocks apart); the
        // first, two intervals and a second.
        let every = self.inner.cfg.persist_interval_ms;
        let last = self.inner.lease_synced_ms.load(Ordering::Relaxed);
        if last != 0 && now < last.saturating_add(every) {
            return Ok(0);
        }
        let since = if last == 0 {
            now.saturating_sub(2 * every + 1_000)
        } else {
            last.saturating_sub(every)
        };
        let stored = self.inner.durable.leases_since(since).await?;
        self.inner.lease_synced_ms.store(now, Ordering::Relaxed);
        let mut changed = 0;
        {
            let mut st = self.lock();
            for a in stored {
                let Some(id) = a.spec.as_ref().map(|s| s.id.clone()) else {
                    continue;
                };
                let lease = a.lease_expires_at.as_ref().map_or(0, timestamp_ms);
                let Some(e) = st.agents.get_mut(&id) else {
                    continue;
                };
                if lease <= e.lease_expires_ms {
                    continue;
                }
                let before = (e.status(), e.saturated());
                e.lease_expires_ms = lease;
                e.agent.in_flight = a.in_flight;
                e.agent.stats = a.stats;
                if lease > now {
                    e.agent.status = AgentStatus::Available as i32;
                }
                if before != (e.status(), e.saturated()) {
                    st.emit_agent(&id);
                    changed += 1;
                }
            }
        }
        if changed > 0 {
            self.notify();
        }
        Ok(changed)
    }

    /// Writes heartbeat and stats changes in one batch (without waiting for
    /// fsync on sled, which flushes in the background). Returns how many
    /// agents were written.
    pub async fn persist_dirty(&self) -> Result<usize, RegistryError> {
        let dirty = self.take_dirty();
        self.inner
            .durable
            .persist_leases(&dirty, self.inner.clock.now_ms())
            .await?;
        Ok(dirty.len())
    }

    /// The agents whose lease or statistics changed since the last batch.
    fn take_dirty(&self) -> Vec<Agent> {
        let dirty: Vec<Agent> = {
            let mut st = self.lock();
            st.agents
                .values_mut()
                .filter(|e| e.dirty)
                .map(|e| {
                    e.dirty = false;
                    e.view()
                })
                .collect()
        };
        dirty
    }

    /// Persists everything and flushes to disk (shutdown; on PostgreSQL
    /// the last lease batch is written by the background task, and leases
    /// are renewed by heartbeats anyway).
    pub fn flush(&self) -> Result<(), RegistryError> {
        self.inner.durable.flush_blocking(|| self.take_dirty())?;
        Ok(())
    }

    /// The tonic server for this registry, accepting messages up to `max_message_bytes`.
    pub fn server(&self, max_message_bytes: usize) -> RegistryServiceServer<Registry> {
        RegistryServiceServer::new(self.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// The current watch revision.
    pub fn revision(&self) -> u64 {
        self.lock().head()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self) {
        let head = self.lock().head();
        self.inner.head_tx.send_replace(head);
    }

    fn lease(&self, id: &str, expires_ms: u64) -> Lease {
        Lease {
            agent_id: id.to_owned(),
            ttl: Some(duration(self.inner.cfg.lease_ttl_secs * 1000)),
            expires_at: Some(timestamp(expires_ms)),
        }
    }

    async fn register_agent_impl(
        &self,
        spec: Option<AgentSpec>,
        p: &Principal,
    ) -> Result<RegisterAgentResponse, RegistryError> {
        let Some(mut spec) = spec else {
            return Err(invalid("agent", "agent is required"));
        };
        if spec.name.is_empty() {
            spec.name = spec.id.clone();
        }
        {
            let st = self.lock();
            let v = validate::agent_spec(&spec, |t| st.tools.contains_key(t));
            if !v.is_empty() {
                return Err(RegistryError::Invalid(v));
            }
        }
        // A well-formed endpoint must also be one the egress guard allows.
        self.reachable(p, "agent.endpoint", &spec.endpoint).await?;
        let now = self.inner.clock.now_ms();
        let expires = now + self.inner.cfg.lease_ttl_secs * 1000;
        let (agent, created) = {
            let mut st = self.lock();
            let prev = st.agents.get(&spec.id);
            if let Some(prev) = prev {
                may_change(p, "agent", &spec.id, &prev.agent.tenant, &prev.agent.owner)?;
            }
            let created = prev.is_none();
            if p.kind == switchyard_kit::auth::Kind::Agent {
                // An agent does not vouch for itself.
                let ceiling = self.inner.cfg.self_declared_trust_max;
                spec.trust_score = match prev.and_then(|e| e.agent.spec.as_ref()) {
                    Some(kept) => kept.trust_score,
                    None => spec.trust_score.min(ceiling),
                };
            }
            let agent = Agent {
                tenant: prev.map_or_else(
                    || p.tenant_scope().unwrap_or_default().to_owned(),
                    |e| e.agent.tenant.clone(),
                ),
                owner: prev
                    .map_or_else(|| p.acting_subject().to_owned(), |e| e.agent.owner.clone()),
                status: AgentStatus::Available as i32,
                in_flight: 0,
                lease_expires_at: Some(timestamp(expires)),
                registered_at: Some(
                    prev.and_then(|p| p.agent.registered_at)
                        .unwrap_or_else(|| timestamp(now)),
                ),
                updated_at: Some(timestamp(now)),
                stats: prev.map(|p| p.agent.stats.clone()).unwrap_or_default(),
                spec: Some(spec.clone()),
            };
            self.inner.durable.put_agent(&agent)?;
            st.put_agent(Entry {
                agent: agent.clone(),
                lease_expires_ms: expires,
                dirty: false,
            });
            st.emit_agent(&spec.id);
            (agent, created)
        };
        self.notify();
        self.inner.durable.sync().await?;
        tracing::info!(agent_id = %spec.id, created, "agent registered");
        Ok(RegisterAgentResponse {
            lease: Some(self.lease(&spec.id, expires)),
            agent: Some(agent),
            created,
        })
    }

    fn heartbeat_impl(
        &self,
        req: HeartbeatRequest,
        p: &Principal,
    ) -> Result<HeartbeatResponse, RegistryError> {
        let now = self.inner.clock.now_ms();
        let expires = now + self.inner.cfg.lease_ttl_secs * 1000;
        let changed = {
            let mut st = self.lock();
            let Some(e) = st
                .agents
                .get_mut(&req.agent_id)
                .filter(|e| sees(p, &e.agent.tenant))
            else {
                return Err(RegistryError::AgentNotFound(req.agent_id));
            };
            may_change(p, "agent", &req.agent_id, &e.agent.tenant, &e.agent.owner)?;
            Self::renew(&mut st, &req.agent_id, req.in_flight, expires)
        };
        if changed {
            self.notify();
        }
        Ok(HeartbeatResponse {
            lease: Some(self.lease(&req.agent_id, expires)),
        })
    }

    /// Renews agent `id`'s lease to `expires` with `in_flight` calls;
    /// whether routing sees a change (a revival, or saturation flipping).
    fn renew(st: &mut State, id: &str, in_flight: u32, expires: u64) -> bool {
        let Some(e) = st.agents.get_mut(id) else {
            return false;
        };
        let was_saturated = e.saturated();
        let revived = e.status() == AgentStatus::Lapsed;
        e.lease_expires_ms = expires;
        e.agent.in_flight = in_flight;
        e.agent.status = AgentStatus::Available as i32;
        e.dirty = true;
        // Only routing-relevant changes become watch events, so heartbeats
        // at high rates do not flood watchers.
        let changed = revived || was_saturated != e.saturated();
        if changed {
            st.emit_agent(id);
        }
        if revived {
            tracing::info!(agent_id = %id, "agent lease renewed after lapse");
        }
        changed
    }

    async fn deregister_impl(&self, id: String, p: &Principal) -> Result<(), RegistryError> {
        {
            let mut st = self.lock();
            let Some(e) = st.agents.get(&id).filter(|e| sees(p, &e.agent.tenant)) else {
                return Err(RegistryError::AgentNotFound(id));
            };
            may_change(p, "agent", &id, &e.agent.tenant, &e.agent.owner)?;
            st.remove_agent(&id);
            self.inner.durable.remove_agent(&id)?;
            st.emit_agent_removed(&id);
        }
        self.notify();
        self.inner.durable.sync().await?;
        tracing::info!(agent_id = %id, "agent deregistered");
        Ok(())
    }

    fn list_impl(
        &self,
        req: ListAgentsRequest,
        p: &Principal,
    ) -> Result<ListAgentsResponse, RegistryError> {
        let mut v = Violations::new();
        if !req.capability.is_empty() {
            v.check(
                "capability",
                switchyard_core::validate::capability(&req.capability),
            );
        }
        let status =
            AgentStatus::try_from(req.status).map_err(|_| invalid("status", "unknown status"))?;
        v.into_result().map_err(RegistryError::Invalid)?;
        let size = switchyard_core::validate::page_size(req.page_size);
        let st = self.lock();
        let matches = |e: &Entry| {
            sees(p, &e.agent.tenant)
                && (status == AgentStatus::Unspecified || e.status() == status)
                && req.labels.iter().all(|(k, val)| {
                    e.agent.spec.as_ref().and_then(|s| s.labels.get(k)) == Some(val)
                })
        };
        let start = std::ops::Bound::Excluded(req.page_token.clone());
        let mut agents: Vec<Agent> = Vec::with_capacity(size.min(st.agents.len()));
        let mut more = false;
        let mut push = |e: &Entry| {
            if agents.len() == size {
                more = true;
                return false;
            }
            agents.push(e.view());
            true
        };
        if req.capability.is_empty() {
            let range = if req.page_token.is_empty() {
                st.agents.range::<String, _>(..)
            } else {
                st.agents.range((start, std::ops::Bound::Unbounded))
            };
            for (_, e) in range.filter(|(_, e)| matches(e)) {
                if !push(e) {
                    break;
                }
            }
        } else {
            for id in st
                .offering(&req.capability)
                .into_iter()
                .filter(|id| *id > req.page_token)
            {
                if let Some(e) = st.agents.get(&id).filter(|e| matches(e))
                    && !push(e)
                {
                    break;
                }
            }
        }
        let next_page_token = if more {
            agents
                .last()
                .and_then(|a| a.spec.as_ref())
                .map(|s| s.id.clone())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(ListAgentsResponse {
            agents,
            next_page_token,
        })
    }

    async fn register_tool_impl(
        &self,
        tool: Option<Tool>,
        p: &Principal,
    ) -> Result<RegisterToolResponse, RegistryError> {
        let Some(mut tool) = tool else {
            return Err(invalid("tool", "tool is required"));
        };
        // Only the registry says a tool comes from an MCP server.
        tool.mcp_server.clear();
        tool.mcp_tool.clear();
        let (v, schema_bad) = validate::tool(&tool);
        if !v.is_empty() {
            return Err(if schema_bad {
                RegistryError::InvalidToolSchema(v)
            } else {
                RegistryError::Invalid(v)
            });
        }
        let created = {
            let mut st = self.lock();
            let prev = st.tools.get(&tool.name);
            if let Some(prev) = prev {
                may_change(p, "tool", &tool.name, &prev.tenant, &prev.owner)?;
                managed(prev)?;
            }
            tool.tenant = prev.map_or_else(
                || p.tenant_scope().unwrap_or_default().to_owned(),
                |t| t.tenant.clone(),
            );
            tool.owner = prev.map_or_else(|| p.acting_subject().to_owned(), |t| t.owner.clone());
            let created = prev.is_none();
            self.inner.durable.put_tool(&tool)?;
            st.tools.insert(tool.name.clone(), tool.clone());
            st.emit_tool(tool.clone());
            created
        };
        self.notify();
        self.inner.durable.sync().await?;
        tracing::info!(tool = %tool.name, created, "tool registered");
        Ok(RegisterToolResponse {
            tool: Some(tool),
            created,
        })
    }

    async fn deregister_tool_impl(&self, name: String, p: &Principal) -> Result<(), RegistryError> {
        {
            let mut st = self.lock();
            let Some(t) = st.tools.get(&name).filter(|t| sees(p, &t.tenant)) else {
                return Err(RegistryError::ToolNotFound(name));
            };
            may_change(p, "tool", &name, &t.tenant, &t.owner)?;
            managed(t)?;
            let users = st.tool_users(&name);
            if !users.is_empty() {
                return Err(RegistryError::ToolInUse {
                    tool: name,
                    agents: users,
                });
            }
            self.inner.durable.remove_tool(&name)?;
            st.tools.remove(&name);
            st.emit_tool_removed(&name);
        }
        self.notify();
        self.inner.durable.sync().await?;
        Ok(())
    }

    /// The egress guard for a destination a caller names (`field`): its
    /// host must not resolve into a range `[registry.egress]` refuses. The
    /// platform's own registrations (a service acting for no one) are its
    /// operator's, and exempt.
    pub(crate) async fn reachable(
        &self,
        p: &Principal,
        field: &str,
        raw: &str,
    ) -> Result<(), RegistryError> {
        if p.kind == switchyard_kit::auth::Kind::Service && p.on_behalf_of.is_none() {
            return Ok(());
        }
        let checked = match switchyard_kit::egress::parse(raw) {
            Ok(u) => switchyard_kit::egress::resolve_check(&u, &self.inner.cfg.egress).await,
            Err(e) => Err(e),
        };
        checked.map_err(|e| invalid(field, e.to_string()))
    }

    fn report_outcome_impl(
        &self,
        req: ReportOutcomeRequest,
        p: &Principal,
    ) -> Result<ReportOutcomeResponse, RegistryError> {
        let mut v = Violations::new();
        v.check(
            "capability",
            switchyard_core::validate::capability(&req.capability),
        );
        let latency_ms = match &req.latency {
            Some(d) if d.seconds >= 0 && d.nanos >= 0 => duration_ms(d),
            Some(_) => {
                v.add("latency", "latency must not be negative");
                0.0
            }
            None => {
                v.add("latency", "latency is required");
                0.0
            }
        };
        v.into_result().map_err(RegistryError::Invalid)?;
        let alpha = self.inner.cfg.ewma_alpha;
        let stats = {
            let mut st = self.lock();
            // Outcomes feed routing for every tenant that can route to the
            // agent: the executor (a service) reports the calls it makes,
            // and a principal only on agents it registered itself.
            let service = p.kind == switchyard_kit::auth::Kind::Service;
            let Some(e) = st
                .agents
                .get_mut(&req.agent_id)
                .filter(|e| sees(p, &e.agent.tenant))
                .filter(|e| service || p.owns(&e.agent.owner))
            else {
                return Err(RegistryError::AgentNotFound(req.agent_id));
            };
            let offered: Vec<&str> = e.capabilities().collect();
            let served = switchyard_core::validate::capability_lineage(&req.capability)
                .any(|c| offered.contains(&c));
            if !served {
                return Err(invalid(
                    "capability",
                    format!(
                        "agent {:?} does not offer capability {:?}",
                        req.agent_id, req.capability
                    ),
                ));
            }
            let s = e.stats_mut(&req.capability);
            s.ewma_latency_ms = if s.count == 0 {
                latency_ms
            } else {
                alpha * latency_ms + (1.0 - alpha) * s.ewma_latency_ms
            };
            s.count += 1;
            if req.success {
                s.successes += 1;
            }
            s.success_rate = s.successes as f64 / s.count as f64;
            let stats = s.clone();
            e.dirty = true;
            st.emit_agent(&req.agent_id);
            stats
        };
        self.notify();
        Ok(ReportOutcomeResponse { stats: Some(stats) })
    }
}

impl Registry {
    /// Tools and routable tool-mode agents, listed apart for a prompt,
    /// each with what offering it adds to a prompt.
    pub fn summary(
        &self,
        req: &GetCapabilitiesSummaryRequest,
        p: &Principal,
    ) -> GetCapabilitiesSummaryResponse {
        let st = self.lock();
        let tools: Vec<SummaryItem> = st
            .tools
            .values()
            .filter(|t| sees(p, &t.tenant))
            .filter(|t| (req.tools.is_empty() && !req.only_named) || req.tools.contains(&t.name))
            .map(|t| {
                // Offered with its registered schema, else any object
                // (as the executor offers it).
                let parameters = t.parameters.as_ref().map_or_else(
                    || serde_json::json!({"type": "object"}),
                    switchyard_kit::json::struct_to_json,
                );
                SummaryItem {
                    prompt_tokens: offer::tool_prompt_tokens(&t.name, &t.description, &parameters),
                    name: t.name.clone(),
                    description: t.description.clone(),
                }
            })
            .collect();
        let wanted = |e: &Entry| {
            let id = e.agent.spec.as_ref().map_or("", |s| s.id.as_str());
            (req.agents.is_empty() && !req.only_named)
                || req.agents.iter().any(|w| {
                    w == id
                        || e.capabilities()
                            .any(|c| switchyard_core::validate::capability_under(c, w))
                })
        };
        let agents: Vec<SummaryItem> = st
            .agents
            .values()
            .filter(|e| sees(p, &e.agent.tenant))
            .filter(|e| e.status() == AgentStatus::Available)
            .filter(|e| {
                e.agent.spec.as_ref().is_some_and(|s| {
                    s.integration_mode
                        != switchyard_proto::agent::v1::IntegrationMode::Handoff as i32
                })
            })
            .filter(|e| wanted(e))
            .filter_map(|e| e.agent.spec.as_ref())
            .map(|s| {
                let name = switchyard_core::validate::agent_tool_name(&s.id);
                let description = s.description.trim().to_owned();
                SummaryItem {
                    prompt_tokens: offer::tool_prompt_tokens(
                        &name,
                        &description,
                        &offer::agent_tool_parameters(),
                    ),
                    name,
                    description,
                }
            })
            .collect();
        let line = |i: &SummaryItem| {
            let d = i
                .description
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            format!("- {}: {d}\n", i.name)
        };
        let mut text = String::from("Available tools:\n");
        tools.iter().for_each(|t| text.push_str(&line(t)));
        text.push_str("\nAvailable agents:\n");
        agents.iter().for_each(|a| text.push_str(&line(a)));
        GetCapabilitiesSummaryResponse {
            prompt_tokens: tools.iter().chain(&agents).map(|i| i.prompt_tokens).sum(),
            tools,
            agents,
            text,
        }
    }
}

#[tonic::async_trait]
impl RegistryService for Registry {
    async fn register_agent(
        &self,
        req: Request<RegisterAgentRequest>,
    ) -> Result<Response<RegisterAgentResponse>, Status> {
        let p = principal(&req)?;
        let mut spec = req.into_inner().agent;
        // Only RegisterA2aAgent, which read the card, says an agent is A2A.
        if let Some(s) = spec.as_mut() {
            s.a2a = None;
        }
        Ok(Response::new(self.register_agent_impl(spec, &p).await?))
    }

    async fn register_a2a_agent(
        &self,
        req: Request<RegisterA2aAgentRequest>,
    ) -> Result<Response<RegisterA2aAgentResponse>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(
            self.register_a2a_impl(req.into_inner(), &p).await?,
        ))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(self.heartbeat_impl(req.into_inner(), &p)?))
    }

    async fn deregister_agent(
        &self,
        req: Request<DeregisterAgentRequest>,
    ) -> Result<Response<DeregisterAgentResponse>, Status> {
        let p = principal(&req)?;
        self.deregister_impl(req.into_inner().agent_id, &p).await?;
        Ok(Response::new(DeregisterAgentResponse {}))
    }

    async fn get_agent(
        &self,
        req: Request<GetAgentRequest>,
    ) -> Result<Response<GetAgentResponse>, Status> {
        let p = principal(&req)?;
        let id = req.into_inner().agent_id;
        let agent = self
            .lock()
            .agents
            .get(&id)
            .filter(|e| sees(&p, &e.agent.tenant))
            .map(Entry::view);
        match agent {
            Some(a) => Ok(Response::new(GetAgentResponse { agent: Some(a) })),
            None => Err(RegistryError::AgentNotFound(id).into()),
        }
    }

    async fn list_agents(
        &self,
        req: Request<ListAgentsRequest>,
    ) -> Result<Response<ListAgentsResponse>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(self.list_impl(req.into_inner(), &p)?))
    }

    async fn find_by_capability(
        &self,
        req: Request<FindByCapabilityRequest>,
    ) -> Result<Response<FindByCapabilityResponse>, Status> {
        let p = principal(&req)?;
        let req = req.into_inner();
        if let Err(e) = switchyard_core::validate::capability(&req.capability) {
            return Err(invalid("capability", e).into());
        }
        let st = self.lock();
        let agents = st
            .offering(&req.capability)
            .iter()
            .filter_map(|id| st.agents.get(id))
            .filter(|e| sees(&p, &e.agent.tenant))
            .filter(|e| req.include_unavailable || e.status() == AgentStatus::Available)
            .map(Entry::view)
            .collect();
        Ok(Response::new(FindByCapabilityResponse { agents }))
    }

    async fn get_capabilities_summary(
        &self,
        req: Request<GetCapabilitiesSummaryRequest>,
    ) -> Result<Response<GetCapabilitiesSummaryResponse>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(self.summary(req.get_ref(), &p)))
    }

    async fn register_tool(
        &self,
        req: Request<RegisterToolRequest>,
    ) -> Result<Response<RegisterToolResponse>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(
            self.register_tool_impl(req.into_inner().tool, &p).await?,
        ))
    }

    async fn deregister_tool(
        &self,
        req: Request<DeregisterToolRequest>,
    ) -> Result<Response<DeregisterToolResponse>, Status> {
        let p = principal(&req)?;
        self.deregister_tool_impl(req.into_inner().name, &p).await?;
        Ok(Response::new(DeregisterToolResponse {}))
    }

    async fn list_tools(
        &self,
        req: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        let p = principal(&req)?;
        let names = req.into_inner().names;
        let st = self.lock();
        let tools = if names.is_empty() {
            st.tools
                .values()
                .filter(|t| sees(&p, &t.tenant))
                .cloned()
                .collect()
        } else {
            let mut out = Vec::new();
            for n in &names {
                match st.tools.get(n).filter(|t| sees(&p, &t.tenant)) {
                    Some(t) => out.push(t.clone()),
                    None => return Err(RegistryError::ToolNotFound(n.clone()).into()),
                }
            }
            out
        };
        Ok(Response::new(ListToolsResponse { tools }))
    }

    async fn report_outcome(
        &self,
        req: Request<ReportOutcomeRequest>,
    ) -> Result<Response<ReportOutcomeResponse>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(
            self.report_outcome_impl(req.into_inner(), &p)?,
        ))
    }

    async fn register_mcp_server(
        &self,
        req: Request<RegisterMcpServerRequest>,
    ) -> Result<Response<RegisterMcpServerResponse>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(
            self.register_mcp_impl(req.into_inner().server, &p).await?,
        ))
    }

    async fn deregister_mcp_server(
        &self,
        req: Request<DeregisterMcpServerRequest>,
    ) -> Result<Response<DeregisterMcpServerResponse>, Status> {
        let p = principal(&req)?;
        self.deregister_mcp_impl(req.into_inner().name, &p).await?;
        Ok(Response::new(DeregisterMcpServerResponse {}))
    }

    async fn list_mcp_servers(
        &self,
        req: Request<ListMcpServersRequest>,
    ) -> Result<Response<ListMcpServersResponse>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(self.list_mcp_impl(&p).await))
    }

    type CallMcpToolStream = ReceiverStream<Result<CallMcpToolResponse, Status>>;

    async fn call_mcp_tool(
        &self,
        req: Request<CallMcpToolRequest>,
    ) -> Result<Response<Self::CallMcpToolStream>, Status> {
        let p = principal(&req)?;
        Ok(Response::new(self.call_mcp_impl(req.into_inner(), &p)?))
    }

    type WatchStream = ReceiverStream<Result<WatchResponse, Status>>;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let WatchRequest {
            start_revision,
            epoch,
        } = req.into_inner();
        let (tx, rx) = mpsc::channel(512);
        let me = self.clone();
        tokio::spawn(async move {
            let mut head_rx = me.inner.head_tx.subscribe();
            let (mut epoch, mut after) = (epoch, start_revision);
            loop {
                let catchup = me.lock().catch_up(&epoch, after);
                let sent = match catchup {
                    Catchup::Snapshot(evs) => {
                        for ev in evs {
                            after = ev.revision;
                            epoch.clone_from(&ev.epoch);
                            if tx.send(Ok(ev)).await.is_err() {
                                return;
                            }
                        }
                        true
                    }
                    Catchup::Events(evs) => {
                        let any = !evs.is_empty();
                        for ev in evs {
                            after = ev.revision;
                            if tx.send(Ok((*ev).clone())).await.is_err() {
                                return;
                            }
                        }
                        any
                    }
                };
                if !sent {
                    tokio::select! {
                        r = head_rx.changed() => if r.is_err() { return },
                        _ = me.inner.shutdown.wait() => return,
                        _ = tx.closed() => return,
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests;
