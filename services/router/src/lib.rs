//! The Switchyard router: given a capability and constraints, the eligible
//! agents ranked by the AITP score (seed 002 §4, see
//! [`switchyard_core::routing`]), each with its per-factor breakdown.
//!
//! The router owns nothing durable. It keeps an index of agents by capability,
//! loaded from the registry's watch snapshot at start and kept current by the
//! watch, so a route never waits on the registry. Called by the executor and
//! the CLI.

mod index;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use switchyard_api::RegistryClient;
use switchyard_core::routing::ScoringConfig;
use switchyard_core::{Reason, Violations};
use switchyard_kit::error::{invalid_argument, status, status_with_metadata};
use switchyard_kit::shutdown::Shutdown;
use switchyard_proto::registry::v1::{WatchEventType, WatchRequest, WatchResponse};
use switchyard_proto::router::v1::router_service_server::{RouterService, RouterServiceServer};
use switchyard_proto::router::v1::{RouteConstraints, RouteRequest, RouteResponse};
use tokio::sync::watch;
use tonic::{Code, Request, Response, Status};

use index::{AgentInfo, FILTER_REASONS, Index};

/// `[router]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Registry to watch when the router runs without one in its process.
    pub registry_url: Option<String>,
    /// `min_trust` when a request does not set it (the seed's default, 50).
    pub default_min_trust: u32,
    /// Candidates returned when a request does not set `limit`.
    pub default_limit: u32,
    /// Largest `limit` accepted.
    pub max_limit: u32,
    /// Weights, latency ceiling and parent-capability discount.
    pub scoring: ScoringConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            registry_url: None,
            default_min_trust: 50,
            default_limit: 5,
            max_limit: 100,
            scoring: ScoringConfig::default(),
        }
    }
}

impl RouterConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        self.scoring
            .validate()
            .map_err(|e| format!("router.scoring.{e}"))?;
        if self.default_min_trust > 100 {
            return Err("router.default_min_trust must be at most 100".into());
        }
        if self.default_limit == 0 || self.max_limit == 0 || self.default_limit > self.max_limit {
            return Err("router.default_limit must be between 1 and router.max_limit".into());
        }
        Ok(())
    }
}

/// Router failures; each maps to one gRPC status in `From<RouterError>`.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The request has invalid fields.
    #[error("invalid request: {0}")]
    Invalid(Violations),
    /// No agent passes the filters.
    #[error(
        "no available agent for capability {capability:?} ({offered} offer it{})",
        filtered_text(filtered)
    )]
    CapabilityUnavailable {
        /// Capability asked for.
        capability: String,
        /// Agents offering it before filters.
        offered: usize,
        /// Agents filtered out, by reason.
        filtered: std::collections::BTreeMap<String, u32>,
    },
    /// The index has not been loaded from the registry yet.
    #[error("router has not loaded the registry yet; retry shortly")]
    NotReady,
}

fn filtered_text(f: &std::collections::BTreeMap<String, u32>) -> String {
    if f.is_empty() {
        return String::new();
    }
    let mut v: Vec<_> = f.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    v.sort();
    format!("; filtered out by {}", v.join(", "))
}

impl From<RouterError> for Status {
    fn from(e: RouterError) -> Status {
        let msg = e.to_string();
        match e {
            RouterError::Invalid(v) => invalid_argument(Reason::InvalidArgument, &v),
            RouterError::CapabilityUnavailable {
                capability,
                filtered,
                ..
            } => {
                let mut md: HashMap<String, String> = filtered
                    .into_iter()
                    .map(|(k, v)| (format!("filtered_{k}"), v.to_string()))
                    .collect();
                md.insert("capability".into(), capability);
                status_with_metadata(Code::NotFound, Reason::CapabilityUnavailable, msg, md)
            }
            RouterError::NotReady => status(Code::Unavailable, Reason::Unavailable, msg),
        }
    }
}

struct Inner {
    cfg: RouterConfig,
    index: RwLock<Index>,
    ready_tx: watch::Sender<bool>,
}

/// The router service. Cheap to clone; clones share the index.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").finish_non_exhaustive()
    }
}

impl Router {
    /// A router with an empty index (not ready until a snapshot arrives).
    pub fn new(cfg: RouterConfig) -> Router {
        Router {
            inner: Arc::new(Inner {
                cfg,
                index: RwLock::new(Index::default()),
                ready_tx: watch::channel(false).0,
            }),
        }
    }

    /// Follows `registry`'s watch until shutdown, reconnecting with backoff and
    /// resuming from the last revision seen.
    pub fn spawn_sync(
        &self,
        registry: RegistryClient,
        shutdown: Shutdown,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let (mut epoch, mut revision) = (String::new(), 0u64);
            let mut staging: Option<Index> = None;
            let mut backoff = Duration::from_millis(100);
            while !shutdown.is_shutdown() {
                match registry
                    .watch(WatchRequest {
                        start_revision: revision,
                        epoch: epoch.clone(),
                    })
                    .await
                {
                    Ok(mut stream) => loop {
                        let item = tokio::select! {
                            item = stream.next() => item,
                            _ = shutdown.wait() => return,
                        };
                        match item {
                            Some(Ok(ev)) => {
                                backoff = Duration::from_millis(100);
                                revision = ev.revision;
                                epoch.clone_from(&ev.epoch);
                                me.apply(&mut staging, ev);
                            }
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "registry watch failed; reconnecting");
                                break;
                            }
                            None if shutdown.is_shutdown() => return,
                            None => {
                                tracing::warn!("registry watch ended; reconnecting");
                                break;
                            }
                        }
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, retry_ms = backoff.as_millis() as u64, "cannot watch registry")
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.wait() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        })
    }

    /// Applies one watch event. A snapshot is built aside and swapped in
    /// whole, so routes keep using the previous index while it loads.
    fn apply(&self, staging: &mut Option<Index>, ev: WatchResponse) {
        let kind = WatchEventType::try_from(ev.r#type).unwrap_or(WatchEventType::Unspecified);
        match kind {
            WatchEventType::Reset => *staging = Some(Index::default()),
            WatchEventType::SnapshotComplete => {
                if let Some(ix) = staging.take() {
                    let n = ix.len();
                    *self.inner.index.write().unwrap_or_else(|p| p.into_inner()) = ix;
                    self.inner.ready_tx.send_replace(true);
                    tracing::info!(
                        agents = n,
                        revision = ev.revision,
                        "router index loaded from registry snapshot"
                    );
                }
            }
            WatchEventType::AgentUpserted => {
                if let Some(info) = ev.agent.as_ref().and_then(AgentInfo::from_agent) {
                    match staging {
                        Some(ix) => ix.upsert(info),
                        None => self
                            .inner
                            .index
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .upsert(info),
                    }
                }
            }
            WatchEventType::AgentRemoved => match staging {
                Some(ix) => ix.remove(&ev.removed_id),
                None => self
                    .inner
                    .index
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&ev.removed_id),
            },
            WatchEventType::ToolUpserted
            | WatchEventType::ToolRemoved
            | WatchEventType::Unspecified => {}
        }
    }

    /// Waits until the first registry snapshot is loaded.
    pub async fn ready(&self) {
        let mut rx = self.inner.ready_tx.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Agents in the index.
    pub fn indexed_agents(&self) -> usize {
        self.inner
            .index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Loads agents straight into the index, bypassing the watch (benchmarks
    /// and tests of the scoring path).
    pub fn load_agents<'a>(
        &self,
        agents: impl IntoIterator<Item = &'a switchyard_proto::registry::v1::Agent>,
    ) {
        let mut ix = self.inner.index.write().unwrap_or_else(|p| p.into_inner());
        for a in agents {
            if let Some(info) = AgentInfo::from_agent(a) {
                ix.upsert(info);
            }
        }
        self.inner.ready_tx.send_replace(true);
    }

    /// The tonic server for this router.
    pub fn server(&self, max_message_bytes: usize) -> RouterServiceServer<Router> {
        RouterServiceServer::new(self.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// Routes one request among every agent (in-process tools and tests).
    pub fn route(&self, req: &RouteRequest) -> Result<RouteResponse, RouterError> {
        self.route_for(req, None)
    }

    /// Routes one request among the agents `tenant` sees: its own and the
    /// shared platform ones (`None`: all).
    pub fn route_for(
        &self,
        req: &RouteRequest,
        tenant: Option<&str>,
    ) -> Result<RouteResponse, RouterError> {
        let cfg = &self.inner.cfg;
        let default = RouteConstraints::default();
        let c = req.constraints.as_ref().unwrap_or(&default);
        let mut v = Violations::new();
        v.check(
            "capability",
            switchyard_core::validate::capability(&req.capability),
        );
        if c.min_trust.is_some_and(|t| t > 100) {
            v.add(
                "constraints.min_trust",
                "min_trust must be between 0 and 100",
            );
        }
        if c.max_cost_micro_usd.is_some_and(|m| m < 0) {
            v.add(
                "constraints.max_cost_micro_usd",
                "max_cost must not be negative",
            );
        }
        if req.limit > cfg.max_limit {
            v.add("limit", format!("limit must be at most {}", cfg.max_limit));
        }
        v.into_result().map_err(RouterError::Invalid)?;
        if !*self.inner.ready_tx.borrow() {
            return Err(RouterError::NotReady);
        }
        let limit = if req.limit == 0 {
            cfg.default_limit
        } else {
            req.limit
        } as usize;
        let min_trust = c.min_trust.unwrap_or(cfg.default_min_trust);
        let routed = self
            .inner
            .index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .route(&cfg.scoring, &req.capability, c, min_trust, limit, tenant);
        let filtered: std::collections::BTreeMap<String, u32> = FILTER_REASONS
            .iter()
            .zip(routed.filtered)
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| ((*k).to_owned(), n))
            .collect();
        if routed.candidates.is_empty() {
            return Err(RouterError::CapabilityUnavailable {
                capability: req.capability.clone(),
                offered: routed.offered,
                filtered,
            });
        }
        Ok(RouteResponse {
            candidates: routed.candidates,
            filtered,
        })
    }
}

#[tonic::async_trait]
impl RouterService for Router {
    async fn route(&self, req: Request<RouteRequest>) -> Result<Response<RouteResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let routed = self.route_for(req.get_ref(), p.tenant_scope());
        let outcome = match &routed {
            Ok(_) => "routed",
            Err(RouterError::CapabilityUnavailable { .. }) => "CAPABILITY_UNAVAILABLE",
            Err(_) => "refused",
        };
        switchyard_kit::metrics::global()
            .routing_decisions
            .get_or_create(&switchyard_kit::metrics::ReasonLabels {
                reason: outcome.into(),
            })
            .inc();
        Ok(Response::new(routed?))
    }
}

#[cfg(test)]
mod tests;
