//! The Switchyard ledger: hierarchical budgets (org → project → job), atomic
//! reservations across a budget's whole ancestor chain, and the append-only
//! cost journal. Tokens are `u64` and money is micro-USD (`i64`): no floats.
//!
//! Called by the executor (reserve before every call that spends, commit the
//! actual usage after) and by operators through the CLI. Every mutation is a
//! journal record; balances are the replay of the journal ([`books`]), and a
//! Reserve or Commit is acknowledged only once its record is durable (group
//! commit: concurrent callers share one flush).

mod backend;
mod books;
pub mod chain;
mod cold;
mod desk;
mod pg;
pub mod rates;
mod report;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use switchyard_core::{Clock, Reason, Violations};
use switchyard_kit::auth::grant::GrantError;
use switchyard_kit::error::{ApiError, invalid_argument, metadata, status_with_metadata};
use switchyard_kit::shutdown::Shutdown;
use switchyard_kit::time::duration_ms;
use switchyard_proto::common::v1::{CorrelationContext, Event, UnitPrice};
use switchyard_proto::ledger::v1::ledger_service_server::{LedgerService, LedgerServiceServer};
use switchyard_proto::ledger::v1::*;
use switchyard_store::{Store, StoreError};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use backend::{Backend, Sled};
use books::{Books, Charge, micro, money};
use cold::Cold;
use desk::{Done, Op};

/// Prices of one model or agent, per million units, in micro-USD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct PriceConfig {
    /// Micro-USD per million input (prompt) tokens: $2.50/M = 2500000.
    pub input_micro_usd_per_million: i64,
    /// Micro-USD per million output (completion) tokens.
    pub output_micro_usd_per_million: i64,
}

/// `[ledger]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LedgerConfig {
    /// TTL of a reservation that does not ask for one.
    pub default_ttl_secs: u64,
    /// Longest TTL a reservation may ask for.
    pub max_ttl_secs: u64,
    /// How often expired reservations are released, ms.
    pub sweep_interval_ms: u64,
    /// How often the books are snapshotted (start-up replays the journal
    /// only after the last snapshot) and closed budgets that hold nothing
    /// leave memory, ms.
    pub snapshot_interval_ms: u64,
    /// Retired budgets (their reservations, keys and entry index) and the
    /// journal records before the snapshot are kept this long, seconds; 0
    /// keeps them forever. Balances are never lost: the snapshot holds them.
    pub retention_secs: u64,
    /// The price catalogue: `[ledger.prices."gpt-4o-mini"]`.
    pub prices: BTreeMap<String, PriceConfig>,
    /// Provider rate limits (`[[ledger.limits]]`), shared by every replica
    /// (see `rates.rs`).
    pub limits: Vec<rates::LimitConfig>,
    /// Fair-share weight of each tenant when a limit is the bottleneck
    /// (`[ledger.tenant_weights]`, default 1).
    pub tenant_weights: BTreeMap<String, u32>,
    /// How long calls through a key wait after its provider answered 429
    /// without a Retry-After, ms.
    pub rate_cooldown_ms: u64,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            default_ttl_secs: 300,
            max_ttl_secs: 86_400,
            sweep_interval_ms: 1_000,
            snapshot_interval_ms: 2_000,
            retention_secs: 7 * 24 * 3600,
            prices: BTreeMap::new(),
            limits: Vec::new(),
            tenant_weights: BTreeMap::new(),
            rate_cooldown_ms: 1_000,
        }
    }
}

impl LedgerConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        if self.default_ttl_secs == 0 || self.default_ttl_secs > self.max_ttl_secs {
            return Err("ledger.default_ttl_secs must be > 0 and <= ledger.max_ttl_secs".into());
        }
        if self.sweep_interval_ms == 0 || self.snapshot_interval_ms == 0 {
            return Err(
                "ledger.sweep_interval_ms and ledger.snapshot_interval_ms must be > 0".into(),
            );
        }
        for (model, p) in &self.prices {
            if p.input_micro_usd_per_million < 0 || p.output_micro_usd_per_million < 0 {
                return Err(format!(
                    "ledger.prices.{model}: prices must not be negative"
                ));
            }
        }
        let problems = self.rates().problems();
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(())
    }

    /// The rate-limit settings.
    pub fn rates(&self) -> rates::RatesConfig {
        rates::RatesConfig {
            limits: self.limits.clone(),
            tenant_weights: self.tenant_weights.clone(),
            cooldown_ms: self.rate_cooldown_ms,
        }
    }
}

/// Largest token count or micro-USD amount one request may carry; keeps every
/// sum far from overflow.
pub const MAX_AMOUNT: u64 = 1_000_000_000_000_000;

/// Why a reservation did not fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Budget the reservation was made on.
    pub budget_id: String,
    /// The budget (itself or an ancestor) whose limit refused it.
    pub refused_by: String,
    /// `tokens` or `cost`.
    pub dimension: &'static str,
    /// Tokens asked for.
    pub tokens: u64,
    /// Micro-USD asked for.
    pub cost: i64,
    /// What the refusing budget has left, `None` when unlimited.
    pub tokens_remaining: Option<u64>,
    /// What the refusing budget has left, `None` when unlimited.
    pub cost_remaining: Option<i64>,
}

fn or_unlimited<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "unlimited".into(), |v| v.to_string())
}

/// Ledger failures; each maps to one gRPC status in `From<LedgerError>`.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The request has invalid fields.
    #[error("invalid request: {0}")]
    Invalid(Violations),
    /// No such budget.
    #[error("budget {0:?} does not exist")]
    BudgetNotFound(String),
    /// The id is taken by a budget with other settings.
    #[error("budget {0:?} already exists with different parent, limits or labels")]
    BudgetExists(String),
    /// The budget or an ancestor is closed.
    #[error("budget {closed:?} is closed{}", if .closed == .budget_id { String::new() } else { format!(" (an ancestor of {:?})", .budget_id) })]
    Closed {
        /// Budget asked for.
        budget_id: String,
        /// The closed one.
        closed: String,
    },
    /// A model call does not fit a rate limit (now, or ever).
    #[error("rate limit: {}", .0.why)]
    RateLimited(rates::Wait),
    /// The reservation does not fit.
    #[error(
        "budget {:?} cannot hold {} tokens and {} micro-USD: {} tokens and {} micro-USD remain{}",
        .0.refused_by, .0.tokens, .0.cost,
        or_unlimited(.0.tokens_remaining), or_unlimited(.0.cost_remaining),
        if .0.refused_by == .0.budget_id { String::new() } else { format!(" (an ancestor of {:?})", .0.budget_id) }
    )]
    Exceeded(Box<Refusal>),
    /// A sum on the budget chain would overflow its integer type.
    #[error(
        "budget {budget_id:?} cannot hold more: its token or money sums would overflow (tokens at most {}, money at most {} micro-USD)",
        u64::MAX,
        i64::MAX
    )]
    Overflow {
        /// The budget whose sums would overflow.
        budget_id: String,
    },
    /// A draw asks more than its hold has left, or the hold is settled.
    #[error("hold {hold_id:?} {why}")]
    HoldExhausted {
        /// The hold.
        hold_id: String,
        /// What is short, with the numbers, or how the hold ended.
        why: String,
        /// Tokens the hold has left (0 once settled).
        tokens_left: u64,
        /// Money the hold has left, micro-USD (0 once settled).
        cost_left: i64,
    },
    /// No such reservation.
    #[error("reservation {0:?} does not exist")]
    ReservationNotFound(String),
    /// An agent asked for what its invocation grant does not cover.
    #[error("{0}")]
    Grant(#[from] GrantError),
    /// The reservation was settled already.
    #[error("reservation {id:?} is already {state}")]
    ReservationNotOpen {
        /// Reservation id.
        id: String,
        /// committed, released or expired.
        state: &'static str,
    },
    /// An idempotency key was used before with other arguments.
    #[error("idempotency key {key:?} was already used for a {what} with different arguments")]
    KeyReused {
        /// The key.
        key: String,
        /// What it was used for.
        what: &'static str,
    },
    /// The model has no price.
    #[error("model {0:?} is not in the price catalogue")]
    NotPriced(String),
    /// A policy forbids nesting this budget: which one and why.
    #[error("{0}")]
    PolicyForbidden(String),
    /// Storage failed; nothing was acknowledged.
    #[error("storage failed: {0}")]
    Storage(#[from] StoreError),
}

impl From<LedgerError> for Status {
    fn from(e: LedgerError) -> Status {
        let msg = e.to_string();
        let (code, reason, md) = match e {
            LedgerError::Invalid(v) => return invalid_argument(Reason::InvalidArgument, &v),
            LedgerError::Overflow { budget_id } => {
                return status_with_metadata(
                    Code::ResourceExhausted,
                    Reason::AmountOverflow,
                    msg,
                    metadata([("budget_id", budget_id)]),
                );
            }
            LedgerError::Exceeded(r) => {
                let info = metadata([
                    ("budget_id", r.budget_id.clone()),
                    ("refused_by", r.refused_by.clone()),
                    ("dimension", r.dimension.to_owned()),
                    ("tokens_requested", r.tokens.to_string()),
                    ("cost_requested_micro_usd", r.cost.to_string()),
                    ("tokens_remaining", or_unlimited(r.tokens_remaining)),
                    ("cost_remaining_micro_usd", or_unlimited(r.cost_remaining)),
                ]);
                // A QuotaFailure too, which generic gRPC tooling understands.
                let mut details = ErrorDetails::with_error_info(
                    Reason::BudgetExceeded.as_str(),
                    switchyard_core::reason::DOMAIN,
                    info,
                );
                details
                    .add_quota_failure_violation(format!("budget:{}", r.refused_by), msg.clone());
                return Status::with_error_details(Code::ResourceExhausted, msg, details);
            }
            LedgerError::RateLimited(w) => {
                let (scope_limit, scope) = rates::scope(&w.bucket);
                let mut info = metadata([("limit", scope_limit), ("scope", scope)]);
                if let Some(ms) = w.after_ms {
                    info.insert("retry_after_ms".into(), ms.to_string());
                }
                let mut details = ErrorDetails::with_error_info(
                    Reason::RateLimited.as_str(),
                    switchyard_core::reason::DOMAIN,
                    info,
                );
                if let Some(ms) = w.after_ms {
                    details.set_retry_info(Some(Duration::from_millis(ms)));
                }
                return Status::with_error_details(Code::ResourceExhausted, msg, details);
            }
            LedgerError::Grant(_) => (Code::PermissionDenied, Reason::GrantRefused, metadata([])),
            LedgerError::PolicyForbidden(_) => (
                Code::FailedPrecondition,
                Reason::PolicyForbidden,
                metadata([]),
            ),
            LedgerError::BudgetNotFound(id) => (
                Code::NotFound,
                Reason::BudgetNotFound,
                metadata([("budget_id", id)]),
            ),
            LedgerError::BudgetExists(id) => (
                Code::AlreadyExists,
                Reason::BudgetAlreadyExists,
                metadata([("budget_id", id)]),
            ),
            LedgerError::Closed { budget_id, closed } => (
                Code::FailedPrecondition,
                Reason::BudgetClosed,
                metadata([("budget_id", budget_id), ("closed_budget_id", closed)]),
            ),
            LedgerError::HoldExhausted {
                hold_id,
                tokens_left,
                cost_left,
                ..
            } => (
                Code::ResourceExhausted,
                Reason::HoldExhausted,
                metadata([
                    ("hold_id", hold_id),
                    ("tokens_left", tokens_left.to_string()),
                    ("cost_left_micro_usd", cost_left.to_string()),
                ]),
            ),
            LedgerError::ReservationNotFound(id) => (
                Code::NotFound,
                Reason::ReservationNotFound,
                metadata([("reservation_id", id)]),
            ),
            LedgerError::ReservationNotOpen { id, state } => (
                Code::FailedPrecondition,
                Reason::ReservationNotOpen,
                metadata([("reservation_id", id), ("state", state.to_owned())]),
            ),
            LedgerError::KeyReused { key, .. } => (
                Code::AlreadyExists,
                Reason::IdempotencyKeyReused,
                metadata([("idempotency_key", key)]),
            ),
            LedgerError::NotPriced(model) => (
                Code::NotFound,
                Reason::ModelNotPriced,
                metadata([("model", model)]),
            ),
            LedgerError::Storage(_) => (Code::Unavailable, Reason::StorageFailure, metadata([])),
        };
        status_with_metadata(code, reason, msg, md)
    }
}

fn invalid(field: &str, description: impl Into<String>) -> LedgerError {
    let mut v = Violations::new();
    v.add(field, description);
    LedgerError::Invalid(v)
}

/// The rate-limit part of a request's `rate` claim, checked, for
/// `person`.
fn rate_work(
    v: &mut Violations,
    rate: Option<&RateClaim>,
    person: &str,
) -> Option<rates::RateWork> {
    let r = rate?;
    for (field, value) in [
        ("rate.provider", &r.provider),
        ("rate.model", &r.model),
        ("rate.key", &r.key),
    ] {
        if value.len() > 256 || value.contains('/') || value.chars().any(char::is_control) {
            v.add(
                field,
                "must be at most 256 bytes, without '/' or control characters",
            );
        }
    }
    amount(v, "rate.tokens", r.tokens);
    Some(rates::RateWork {
        claim: rates::Claim {
            provider: r.provider.clone(),
            model: r.model.clone(),
            key: r.key.clone(),
            tokens: r.tokens,
            person: person.to_owned(),
            ..Default::default()
        },
        cool: None,
    })
}

fn amount(v: &mut Violations, field: &str, n: u64) {
    if n > MAX_AMOUNT {
        v.add(field, format!("must be at most {MAX_AMOUNT}"));
    }
}

fn money_amount(v: &mut Violations, field: &str, m: Option<&switchyard_proto::common::v1::Money>) {
    let n = micro(m);
    if n < 0 {
        v.add(field, "must not be negative");
    } else {
        amount(v, field, n.unsigned_abs());
    }
}

/// Rounds `units × price` up to a whole micro-USD.
pub fn charge(units: u64, price: &UnitPrice) -> i64 {
    switchyard_core::money::charge(units, price.micro_usd_per_million)
}

struct Inner {
    /// Random per open, so ids stay unique even if the data is wiped.
    id_prefix: String,
    cfg: LedgerConfig,
    /// `cfg.rates()`, built once (the PostgreSQL books share it).
    rates: Arc<rates::RatesConfig>,
    clock: Arc<dyn Clock>,
    shutdown: Shutdown,
    backend: Backend,
    /// The policy set in force: decides `nest_budget` (set by the process).
    policies: switchyard_policy::Slot,
}

/// Money held by open reservations, summed over each tenant's root budgets
/// (a reservation is held on every ancestor, so roots hold it all).
impl switchyard_kit::metrics::Gauges for Inner {
    fn set(&self, m: &switchyard_kit::metrics::Metrics) {
        let now = self.clock.now_ms();
        for (key, mut b) in self.backend.last_buckets() {
            b.prune(self.rates.limit_of(&key), now);
            let (limit, scope) = rates::scope(&key);
            for u in rates::usage(&self.rates, &key, &b, now) {
                let labels = switchyard_kit::metrics::LimitUseLabels {
                    limit: limit.clone(),
                    scope: scope.clone(),
                    dimension: u.dimension.to_owned(),
                };
                m.rate_limit_used.get_or_create(&labels).set(u.used as i64);
                m.rate_limit_capacity
                    .get_or_create(&labels)
                    .set(u.limit as i64);
            }
            let live = b
                .waiting
                .values()
                .filter(|w| w.seen_ms + rates::WAITER_TTL_MS > now)
                .count();
            m.rate_limit_waiting
                .get_or_create(&switchyard_kit::metrics::LimitLabels { limit, scope })
                .set(live as i64);
        }
        for (tenant, reserved) in self.backend.reserved_by_tenant() {
            m.budget_reserved_micro_usd
                .get_or_create(&switchyard_kit::metrics::BudgetLabels { tenant })
                .inc_by(reserved);
        }
    }
}

/// The ledger service. Cheap to clone; all clones share state.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").finish_non_exhaustive()
    }
}

/// Correlation fields that make two Reserve calls "the same": the trace
/// context and a server-generated correlation id differ between retries.
fn same_work(a: &CorrelationContext, b: &CorrelationContext) -> bool {
    a.job_id == b.job_id && a.task_id == b.task_id
}

impl Ledger {
    /// Opens the ledger on `store`, replaying the whole journal.
    pub fn open(
        cfg: LedgerConfig,
        store: Store,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
    ) -> Result<Ledger, LedgerError> {
        let journal = store.log::<JournalRecord>("journal")?;
        let cold = Cold::open(&store)?;
        let started = std::time::Instant::now();
        let (books, records, gaps) = cold.load(&journal)?;
        for gap in gaps {
            tracing::error!(error = %gap, "journal record skipped");
        }
        tracing::info!(
            records,
            budgets = books.budgets.len(),
            open_reservations = books.expiry.len(),
            ms = started.elapsed().as_millis() as u64,
            "ledger loaded"
        );
        let buckets = backend::load_buckets(&store)?;
        let sled = Sled {
            books: Mutex::new(books),
            rates: Mutex::new(buckets),
            journal,
            cold,
            pruned_at: std::sync::atomic::AtomicU64::new(0),
            store,
        };
        let rates = Arc::new(cfg.rates());
        Ok(Self::with(
            cfg,
            rates,
            clock,
            shutdown,
            Backend::Sled(Box::new(sled)),
        ))
    }

    /// Opens the ledger on PostgreSQL (migrating the schema first), as one
    /// of any number of replicas sharing the database.
    pub async fn open_pg(
        cfg: LedgerConfig,
        db: switchyard_store::pg::Pg,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
    ) -> Result<Ledger, LedgerError> {
        let rates = Arc::new(cfg.rates());
        let books = pg::PgBooks::open(db, rates.clone()).await?;
        Ok(Self::with(cfg, rates, clock, shutdown, Backend::Pg(books)))
    }

    /// Applies the ledger's schema migrations to `db` (idempotent, safe
    /// from several replicas at once); returns how many this call applied.
    pub async fn migrate(db: &switchyard_store::pg::Pg) -> Result<usize, LedgerError> {
        Ok(db.migrate_service("ledger", pg::MIGRATIONS).await?)
    }

    fn with(
        cfg: LedgerConfig,
        rates: Arc<rates::RatesConfig>,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        backend: Backend,
    ) -> Self {
        let inner = Arc::new(Inner {
            id_prefix: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
            rates,
            cfg,
            clock,
            shutdown,
            backend,
            policies: switchyard_policy::Slot::default(),
        });
        switchyard_kit::metrics::global().add_gauges(&inner);
        Ledger { inner }
    }

    /// Decides nested budgets with `engine` from now on.
    pub fn set_policies(&self, engine: Arc<switchyard_policy::Engine>) {
        self.inner.policies.set(engine);
    }

    /// A budget nested under another is a `nest_budget` action: refused
    /// when a policy forbids it (a budget is not put to people, so only a
    /// forbid decides here).
    fn may_nest(
        &self,
        p: &switchyard_kit::auth::Principal,
        req: &CreateBudgetRequest,
    ) -> Result<(), LedgerError> {
        if req.parent_id.is_empty() {
            return Ok(());
        }
        let who = p.acting_party();
        let facts = switchyard_policy::Facts {
            principal: switchyard_policy::Principal::of(
                who.kind.as_str(),
                &who.subject,
                &who.tenant,
            ),
            action: switchyard_policy::Action::NestBudget,
            resource: req.budget_id.clone(),
            parent_budget: req.parent_id.clone(),
            job: switchyard_policy::JobFacts {
                id: req.labels.get("job_id").cloned().unwrap_or_default(),
                tenant: who.tenant.clone(),
                submitter: who.subject.clone(),
                labels: req
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            },
            estimate: switchyard_policy::Estimate {
                priced: req.cost_limit.is_some(),
                tokens: req.token_limit.unwrap_or(0),
                micro_usd: req.cost_limit.as_ref().map_or(0, |m| m.micro_usd),
            },
            now_ms: self.inner.clock.now_ms(),
            ..Default::default()
        };
        let decision = self.inner.policies.decide(&facts);
        match decision.verdict {
            switchyard_policy::Verdict::Forbid { .. } => {
                Err(LedgerError::PolicyForbidden(decision.explain()))
            }
            _ => Ok(()),
        }
    }

    /// The tonic server for this ledger.
    pub fn server(&self, max_message_bytes: usize) -> LedgerServiceServer<Ledger> {
        LedgerServiceServer::new(self.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// Releases expired reservations every `sweep_interval_ms` until shutdown.
    pub fn spawn_sweeper(&self) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let period = Duration::from_millis(self.inner.cfg.sweep_interval_ms);
        self.inner
            .shutdown
            .spawn_every(period, "releasing expired reservations", move || {
                let me = me.clone();
                async move { me.sweep().await.map(drop) }
            })
    }

    /// Snapshots the books and retires what can go every
    /// `snapshot_interval_ms` until shutdown (sled; PostgreSQL keeps the
    /// books in its tables and needs neither).
    pub fn spawn_maintenance(&self) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let period = Duration::from_millis(self.inner.cfg.snapshot_interval_ms);
        self.inner
            .shutdown
            .spawn_every(period, "ledger snapshot", move || {
                let me = me.clone();
                async move { me.maintain().await }
            })
    }

    /// Retires closed budgets that hold nothing, snapshots the books (once
    /// the journal is durable up to the snapshot), and prunes what is past
    /// retention: retired budgets, and journal records before the snapshot
    /// that no budget in memory still reads.
    pub async fn maintain(&self) -> Result<(), LedgerError> {
        let retention_ms = self.inner.cfg.retention_secs.saturating_mul(1000);
        self.inner.backend.maintain(self.now(), retention_ms).await
    }

    /// Releases every reservation past its TTL; returns how many. On
    /// PostgreSQL only the replica holding the sweeper lease sweeps.
    pub async fn sweep(&self) -> Result<usize, LedgerError> {
        let period = self.inner.cfg.sweep_interval_ms;
        self.inner
            .backend
            .sweep(&self.inner.id_prefix, self.now(), period)
            .await
    }

    /// Flushes the journal to disk (shutdown).
    pub fn flush(&self) -> Result<(), LedgerError> {
        self.inner.backend.flush(self.now())
    }

    fn now(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Decides and records one write; answers once it is durable.
    async fn write(&self, op: Op) -> Result<Done, LedgerError> {
        self.write_rated(op, None).await
    }

    /// Writes `op` with its rate-limit part.
    async fn write_rated(
        &self,
        op: Op,
        work: Option<rates::RateWork>,
    ) -> Result<Done, LedgerError> {
        let work = work.filter(|_| self.inner.rates.on());
        let done = self
            .inner
            .backend
            .write(
                op,
                work,
                &self.inner.rates,
                &self.inner.id_prefix,
                self.now(),
            )
            .await;
        if let Err(LedgerError::RateLimited(w)) = &done {
            let (limit, scope) = rates::scope(&w.bucket);
            let labels = switchyard_kit::metrics::LimitLabels { limit, scope };
            let m = switchyard_kit::metrics::global();
            match w.after_ms {
                Some(_) => m.rate_limit_waits.get_or_create(&labels).inc(),
                None => m.rate_limit_refusals.get_or_create(&labels).inc(),
            };
        }
        done
    }

    /// Refuses with BUDGET_NOT_FOUND unless `p` sees budget `id`'s tenant.
    async fn visible(
        &self,
        p: &switchyard_kit::auth::Principal,
        id: &str,
    ) -> Result<(), LedgerError> {
        if self.sees(p, id).await? {
            Ok(())
        } else {
            Err(LedgerError::BudgetNotFound(id.to_owned()))
        }
    }

    /// Refuses with RESERVATION_NOT_FOUND unless `p` sees the reservation's
    /// budget.
    async fn visible_reservation(
        &self,
        p: &switchyard_kit::auth::Principal,
        id: &str,
    ) -> Result<String, LedgerError> {
        let budget = self.inner.backend.reservation_budget(id).await?;
        match budget {
            Some(b) if self.sees(p, &b).await? => Ok(b),
            _ => Err(LedgerError::ReservationNotFound(id.to_owned())),
        }
    }

    /// Returns one budget.
    pub async fn budget(&self, id: &str) -> Result<Budget, LedgerError> {
        self.inner
            .backend
            .budget(id)
            .await?
            .ok_or_else(|| LedgerError::BudgetNotFound(id.to_owned()))
    }

    /// Budget `id`'s tenant and parent (`None`: no such budget), whether in
    /// memory or retired.
    async fn facts(&self, id: &str) -> Result<Option<(String, String)>, LedgerError> {
        self.inner.backend.facts(id).await
    }

    /// Whether `p` sees budget `id` (in memory or retired).
    async fn sees(
        &self,
        p: &switchyard_kit::auth::Principal,
        id: &str,
    ) -> Result<bool, LedgerError> {
        Ok(self
            .facts(id)
            .await?
            .is_some_and(|(tenant, _)| p.sees_tenant(&tenant)))
    }

    /// True when `ancestor` is `id` or one of its ancestors (in memory or
    /// retired).
    async fn within(&self, id: &str, ancestor: &str) -> Result<bool, LedgerError> {
        let mut cur = id.to_owned();
        for _ in 0..64 {
            if cur == ancestor {
                return Ok(true);
            }
            match self.facts(&cur).await? {
                Some((_, parent)) if !parent.is_empty() => cur = parent,
                _ => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Creates a budget with no tenant (tests and tools inside the ledger).
    pub async fn create_budget(
        &self,
        req: CreateBudgetRequest,
    ) -> Result<CreateBudgetResponse, LedgerError> {
        self.create_budget_in(req, "", "").await
    }

    /// Creates a budget of `tenant` by (or for) `by` (idempotent for
    /// identical settings, whoever repeats it); a parent of another tenant
    /// is not found.
    pub async fn create_budget_in(
        &self,
        req: CreateBudgetRequest,
        tenant: &str,
        by: &str,
    ) -> Result<CreateBudgetResponse, LedgerError> {
        let mut v = Violations::new();
        v.check(
            "budget_id",
            switchyard_core::validate::key(&req.budget_id, "budget id"),
        );
        v.check(
            "parent_id",
            switchyard_core::validate::optional_key(&req.parent_id, "parent id"),
        );
        if req.parent_id == req.budget_id && !req.budget_id.is_empty() {
            v.add("parent_id", "a budget cannot be its own parent");
        }
        amount(&mut v, "token_limit", req.token_limit.unwrap_or(0));
        if let Some(c) = &req.cost_limit {
            money_amount(&mut v, "cost_limit", Some(c));
        }
        v.into_result().map_err(LedgerError::Invalid)?;
        let id = req.budget_id.clone();
        let op = Op::Create {
            req,
            tenant: tenant.to_owned(),
            by: by.to_owned(),
        };
        let created = matches!(self.write(op).await?, Done::Created(true));
        if created {
            tracing::debug!(budget_id = %id, "budget created");
        }
        Ok(CreateBudgetResponse {
            budget: Some(self.budget(&id).await?),
            created,
        })
    }

    /// Changes a budget's limits.
    pub async fn update_limits(&self, req: UpdateLimitsRequest) -> Result<Budget, LedgerError> {
        let mut v = Violations::new();
        amount(&mut v, "token_limit", req.token_limit.unwrap_or(0));
        if let Some(c) = &req.cost_limit {
            money_amount(&mut v, "cost_limit", Some(c));
        }
        if req.remove_token_limit && req.token_limit.is_some() {
            v.add(
                "remove_token_limit",
                "cannot both set and remove the token limit",
            );
        }
        if req.remove_cost_limit && req.cost_limit.is_some() {
            v.add(
                "remove_cost_limit",
                "cannot both set and remove the cost limit",
            );
        }
        v.into_result().map_err(LedgerError::Invalid)?;
        let id = req.budget_id.clone();
        self.write(Op::Update(req)).await?;
        tracing::info!(budget_id = %id, "budget limits updated");
        self.budget(&id).await
    }

    /// Closes a budget to new reservations and children.
    pub async fn close_budget(&self, id: &str) -> Result<Budget, LedgerError> {
        self.write(Op::Close(id.to_owned())).await?;
        self.budget(id).await
    }

    /// Lists budgets in id order.
    pub async fn list_budgets(
        &self,
        req: &ListBudgetsRequest,
    ) -> Result<ListBudgetsResponse, LedgerError> {
        self.inner.backend.list_budgets(req).await
    }

    /// Reserves on a budget and every ancestor, atomically; acknowledged once
    /// durable. `correlation_id` fills in the context when the request has none.
    pub async fn reserve(
        &self,
        req: ReserveRequest,
        correlation_id: &str,
    ) -> Result<Reservation, LedgerError> {
        self.reserve_as(req, correlation_id, "").await
    }

    /// [`Ledger::reserve`] for `person` (the acting subject: the person
    /// its rate claim counts against).
    pub async fn reserve_as(
        &self,
        req: ReserveRequest,
        correlation_id: &str,
        person: &str,
    ) -> Result<Reservation, LedgerError> {
        let mut v = Violations::new();
        let work = rate_work(&mut v, req.rate.as_ref(), person);
        v.check(
            "budget_id",
            switchyard_core::validate::key(&req.budget_id, "budget id"),
        );
        v.check(
            "idempotency_key",
            switchyard_core::validate::key(&req.idempotency_key, "idempotency key"),
        );
        amount(&mut v, "tokens", req.tokens);
        money_amount(&mut v, "cost", req.cost.as_ref());
        let max_ttl = self.inner.cfg.max_ttl_secs * 1000;
        let ttl_ms = match &req.ttl {
            None => self.inner.cfg.default_ttl_secs * 1000,
            Some(d) => {
                let ms = duration_ms(d);
                if !(1.0..=max_ttl as f64).contains(&ms) {
                    v.add(
                        "ttl",
                        format!("must be between 1ms and {}s", self.inner.cfg.max_ttl_secs),
                    );
                }
                ms as u64
            }
        };
        if req.note.len() > 1024 {
            v.add("note", "must be at most 1024 bytes");
        }
        if !req.hold_id.is_empty() {
            if req.hold {
                v.add("hold_id", "a hold is reserved on the budget chain, not drawn from another hold: set hold or hold_id, not both");
            }
            v.check(
                "hold_id",
                switchyard_core::validate::key(&req.hold_id, "hold id"),
            );
        }
        v.into_result().map_err(LedgerError::Invalid)?;
        let mut context = req.context.clone().unwrap_or_default();
        if context.correlation_id.is_empty() {
            context.correlation_id = correlation_id.to_owned();
        }
        let cost = micro(req.cost.as_ref());
        let op = Op::Reserve {
            req: Box::new(req),
            context,
            cost,
            ttl_ms,
        };
        match self.write_rated(op, work).await? {
            Done::Reserved(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// Commits a reservation's actual usage: journals the entry, releases the
    /// rest, records an overrun when usage exceeded the reservation.
    pub async fn commit(&self, req: CommitRequest) -> Result<CommitResponse, LedgerError> {
        self.commit_as(req, "").await
    }

    /// [`Ledger::commit`] for `person` (see [`Ledger::reserve_as`]).
    pub async fn commit_as(
        &self,
        req: CommitRequest,
        person: &str,
    ) -> Result<CommitResponse, LedgerError> {
        let mut v = Violations::new();
        let work = rate_work(&mut v, req.rate.as_ref(), person);
        let key = settle_key(&mut v, &req.reservation_id, &req.idempotency_key);
        amount(&mut v, "tokens", req.tokens);
        money_amount(&mut v, "cost", req.cost.as_ref());
        let entry = req.entry.clone().unwrap_or_default();
        amount(&mut v, "entry.units", entry.units);
        let price = entry.price_per_unit.unwrap_or_default();
        for (field, p) in [
            ("entry.price_per_unit", Some(price)),
            ("entry.input_price", entry.input_price),
            ("entry.output_price", entry.output_price),
        ] {
            if p.is_some_and(|p| p.micro_usd_per_million < 0) {
                v.add(field, "must not be negative");
            }
        }
        for (field, value) in [
            ("entry.subtask_id", &entry.subtask_id),
            ("entry.agent_id", &entry.agent_id),
            ("entry.model", &entry.model),
        ] {
            if value.len() > 256 {
                v.add(field, "must be at most 256 bytes");
            }
        }
        v.into_result().map_err(LedgerError::Invalid)?;
        let cost = match &req.cost {
            Some(m) => m.micro_usd,
            None => charge(entry.units, &price),
        };
        let op = Op::Commit {
            req: Box::new(req),
            key,
            cost,
            entry: Box::new(entry),
            price,
        };
        match self.write_rated(op, work).await? {
            Done::Committed(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// Releases a reservation without spending.
    pub async fn release(&self, req: ReleaseRequest) -> Result<(), LedgerError> {
        self.release_as(req, "").await
    }

    /// [`Ledger::release`] for `person` (see [`Ledger::reserve_as`]).
    pub async fn release_as(&self, req: ReleaseRequest, person: &str) -> Result<(), LedgerError> {
        let mut v = Violations::new();
        let key = settle_key(&mut v, &req.reservation_id, &req.idempotency_key);
        let work = rate_work(&mut v, req.rate.as_ref(), person);
        v.into_result().map_err(LedgerError::Invalid)?;
        self.write_rated(
            Op::Release {
                reservation_id: req.reservation_id,
                key,
            },
            work,
        )
        .await?;
        Ok(())
    }

    /// Sets a cooldown on upstream key `rate.key` for `wait` from now;
    /// returns when it ends (ms).
    pub async fn cool_down(&self, req: CoolDownRequest) -> Result<u64, LedgerError> {
        let mut v = Violations::new();
        let mut work = rate_work(&mut v, req.rate.as_ref(), "").unwrap_or_default();
        if work.claim.key.is_empty() {
            v.add(
                "rate.key",
                "name the upstream key that was refused (the provider's api_key_env, or its name)",
            );
        }
        let wait_ms = req
            .wait
            .as_ref()
            .map_or(self.inner.cfg.rate_cooldown_ms as f64, duration_ms);
        if !(1.0..=rates::MAX_COOLDOWN_MS as f64).contains(&wait_ms) {
            v.add(
                "wait",
                format!("must be between 1ms and {}s", rates::MAX_COOLDOWN_MS / 1000),
            );
        }
        if req.why.len() > 256 {
            v.add("why", "must be at most 256 bytes");
        }
        v.into_result().map_err(LedgerError::Invalid)?;
        let until = self.now().saturating_add(wait_ms as u64);
        tracing::info!(key = %work.claim.key, wait_ms, why = %req.why, "upstream key cools down");
        work.cool = Some((until, req.why));
        self.write_rated(Op::Cool, Some(work)).await?;
        Ok(until)
    }

    /// The rate-limit buckets `tenant` may see (`None`: every tenant's),
    /// waiting calls of other tenants counted, not named.
    pub async fn list_limits(
        &self,
        req: &ListLimitsRequest,
        tenant: Option<&str>,
    ) -> Result<ListLimitsResponse, LedgerError> {
        let buckets = self.inner.backend.buckets().await?;
        let now = self.now();
        let cfg = &self.inner.rates;
        let mut out = Vec::new();
        for (key, mut b) in buckets {
            b.prune(cfg.limit_of(&key), now);
            let (limit, scope) = rates::scope(&key);
            if !req.limit.is_empty() && req.limit != limit {
                continue;
            }
            if !limit.is_empty() && cfg.limit_of(&key).is_none() {
                // A limit no longer configured.
                continue;
            }
            // A bucket of one tenant (per tenant, project or person) is
            // its tenant's to see; shared ones everyone's.
            if tenant.is_some_and(|t| !b.tenant.is_empty() && b.tenant != t) {
                continue;
            }
            // Per tenant shown: calls, the longest wait's start and why.
            let mut waiting: BTreeMap<String, (u32, u64, String)> = BTreeMap::new();
            for w in b.waiting.values() {
                let shown = match tenant {
                    Some(t) if t != w.tenant => String::new(),
                    _ => w.tenant.clone(),
                };
                let e = waiting
                    .entry(shown)
                    .or_insert_with(|| (0, w.since_ms, w.why.clone()));
                e.0 += 1;
                if w.since_ms < e.1 {
                    (e.1, e.2) = (w.since_ms, w.why.clone());
                }
            }
            out.push(LimitBucket {
                limit,
                scope,
                r#use: rates::usage(cfg, &key, &b, now)
                    .into_iter()
                    .map(|u| LimitUse {
                        dimension: u.dimension.to_owned(),
                        used: u.used,
                        limit: u.limit,
                    })
                    .collect(),
                cooldown_until: (b.cooldown_until_ms > now)
                    .then(|| switchyard_kit::time::timestamp(b.cooldown_until_ms)),
                cooldown_why: b.cooldown_why.clone(),
                waiting: waiting
                    .into_iter()
                    .map(|(tenant, (calls, since, why))| LimitWaiting {
                        tenant,
                        calls,
                        since: Some(switchyard_kit::time::timestamp(since)),
                        why,
                    })
                    .collect(),
                granted: b.granted,
                waits: b.waits,
                refused: b.refused,
            });
        }
        Ok(ListLimitsResponse { buckets: out })
    }

    /// Journal entries of a budget (and its nested budgets), a job or a
    /// correlation id, in the AITP cost-ledger shape.
    pub async fn list_entries(
        &self,
        req: &ListEntriesRequest,
    ) -> Result<ListEntriesResponse, LedgerError> {
        let selectors = [&req.budget_id, &req.job_id, &req.correlation_id]
            .iter()
            .filter(|s| !s.is_empty())
            .count();
        if selectors != 1 {
            return Err(invalid(
                "budget_id",
                "give exactly one of budget_id, job_id or correlation_id",
            ));
        }
        let after: u64 = if req.page_token.is_empty() {
            0
        } else {
            req.page_token
                .parse()
                .map_err(|_| invalid("page_token", "not a token from a previous page"))?
        };
        let size = switchyard_core::validate::page_size(req.page_size);
        let (charges, budget) = self.inner.backend.charges(req).await?;
        let (mut total_cost, mut total_tokens) = (0i64, 0u64);
        let mut entries = Vec::new();
        let (mut last_seq, mut more) = (0, false);
        for (seq, c) in &charges {
            total_cost = total_cost.saturating_add(micro(c.entry.total.as_ref()));
            total_tokens = total_tokens.saturating_add(c.entry.tokens);
            if *seq > after {
                if entries.len() < size {
                    entries.push(c.entry.clone());
                    last_seq = *seq;
                } else {
                    more = true;
                }
            }
        }
        let next_page_token = if more {
            last_seq.to_string()
        } else {
            String::new()
        };
        Ok(ListEntriesResponse {
            entries,
            total_cost: Some(money(total_cost)),
            remaining_budget: budget.as_ref().and_then(|b| b.cost_remaining),
            next_page_token,
            budget,
            total_tokens,
        })
    }

    /// What was spent in a time range, summed by `req.group_by` and per
    /// bucket: budget `req.budget_id` and every budget under it, or every
    /// budget `sees` (by tenant) when none is named.
    pub async fn report(
        &self,
        req: &ReportRequest,
        sees: impl Fn(&str) -> bool,
    ) -> Result<ReportResponse, LedgerError> {
        let range =
            report::Range::of(req, self.inner.clock.now_ms()).map_err(LedgerError::Invalid)?;
        let mut budgets = self.budgets().await?;
        budgets.retain(|b| sees(&b.tenant));
        let scope = (!req.budget_id.is_empty()).then_some(req.budget_id.as_str());
        let roots: Vec<String> = match scope {
            Some(id) if budgets.iter().any(|b| b.budget_id == id) => vec![id.to_owned()],
            Some(id) => return Err(LedgerError::BudgetNotFound(id.to_owned())),
            None => budgets
                .iter()
                .filter(|b| b.parent_id.is_empty())
                .map(|b| b.budget_id.clone())
                .collect(),
        };
        let mut charges = Vec::new();
        for root in roots {
            let select = ListEntriesRequest {
                budget_id: root,
                ..Default::default()
            };
            charges.extend(self.inner.backend.charges(&select).await?.0);
        }
        let tree = report::Tree::new(&budgets, scope);
        Ok(report::report(
            range,
            req.group_by(),
            &tree,
            charges.iter().map(|(_, c)| &c.entry),
        ))
    }

    /// Checks the journal's hash chains (budget `budget_id`, or every
    /// budget whose tenant `sees` accepts) against the heads the budgets
    /// keep; names each budget that does not verify.
    pub async fn verify_journal(
        &self,
        budget_id: &str,
        sees: impl Fn(&str) -> bool,
    ) -> Result<VerifyJournalResponse, LedgerError> {
        self.inner
            .backend
            .check_chains(budget_id, |_, tenant| sees(tenant))
            .await
    }

    /// Worst-case cost of a model call from the price catalogue.
    pub fn estimate_cost(
        &self,
        req: &EstimateCostRequest,
    ) -> Result<EstimateCostResponse, LedgerError> {
        let mut v = Violations::new();
        if req.model.is_empty() {
            v.add("model", "model is required");
        }
        amount(&mut v, "input_tokens", req.input_tokens);
        amount(&mut v, "max_output_tokens", req.max_output_tokens);
        v.into_result().map_err(LedgerError::Invalid)?;
        let Some(p) = self.inner.cfg.prices.get(&req.model) else {
            return Err(LedgerError::NotPriced(req.model.clone()));
        };
        let input = UnitPrice {
            micro_usd_per_million: p.input_micro_usd_per_million,
        };
        let output = UnitPrice {
            micro_usd_per_million: p.output_micro_usd_per_million,
        };
        let cost =
            charge(req.input_tokens, &input).saturating_add(charge(req.max_output_tokens, &output));
        Ok(EstimateCostResponse {
            cost: Some(money(cost)),
            tokens: req.input_tokens + req.max_output_tokens,
            price: Some(ModelPrice {
                model: req.model.clone(),
                input: Some(input),
                output: Some(output),
            }),
        })
    }

    /// Replays the whole journal into fresh books and returns every budget,
    /// for checking that live balances equal the replay.
    pub async fn replayed_budgets(&self) -> Result<Vec<Budget>, LedgerError> {
        let mut books = Books::default();
        self.replay(&mut |rec: &JournalRecord| {
            // Gaps are reported at open; here they only mean a mismatch.
            let _ = books.apply(rec);
        })
        .await?;
        Ok(books.budgets.values().map(|b| b.view()).collect())
    }

    /// Feeds the whole journal, in order, to `apply`.
    async fn replay(&self, apply: &mut impl FnMut(&JournalRecord)) -> Result<(), LedgerError> {
        self.inner.backend.replay(apply).await
    }

    /// Every budget as the live books hold it, in id order.
    pub async fn budgets(&self) -> Result<Vec<Budget>, LedgerError> {
        self.inner.backend.budgets().await
    }

    async fn watch_stream(
        &self,
        req: WatchRequest,
        p: std::sync::Arc<switchyard_kit::auth::Principal>,
    ) -> Result<futures_util::stream::BoxStream<'static, Result<WatchResponse, Status>>, LedgerError>
    {
        if !req.budget_id.is_empty() && self.facts(&req.budget_id).await?.is_none() {
            return Err(LedgerError::BudgetNotFound(req.budget_id));
        }
        let records = self.inner.backend.tail(req.after_sequence);
        let me = self.clone();
        let shutdown = self.inner.shutdown.clone();
        let stream = records
            .take_until(async move { shutdown.wait().await })
            .filter_map(move |r| {
                let me = me.clone();
                let (p, budget_id) = (p.clone(), req.budget_id.clone());
                async move {
                    match r {
                        Err(e) => Some(Err(Status::from(LedgerError::Storage(e)))),
                        Ok(rec) => {
                            let wanted = async {
                                Ok::<_, LedgerError>(
                                    (budget_id.is_empty()
                                        || me.within(&rec.budget_id, &budget_id).await?)
                                        && me.sees(&p, &rec.budget_id).await?,
                                )
                            };
                            match wanted.await {
                                Ok(true) => Some(Ok(watch_response(rec))),
                                Ok(false) => None,
                                Err(e) => Some(Err(Status::from(e))),
                            }
                        }
                    }
                }
            });
        Ok(Box::pin(stream))
    }
}

/// The charges a ListEntries selects (ascending), and the budget it names.
pub(crate) type Selected = (Vec<(u64, Charge)>, Option<Budget>);

/// A write answered with the wrong kind of result: a bug, reported as one.
fn unexpected(done: &Done) -> LedgerError {
    LedgerError::Storage(StoreError::Io(format!(
        "internal error: unexpected answer {done:?}"
    )))
}

/// Sorts `budgets` by id and cuts the page at `size`, with the token of the
/// next page.
pub(crate) fn page_of_budgets(mut budgets: Vec<Budget>, size: usize) -> ListBudgetsResponse {
    budgets.sort_by(|a, b| a.budget_id.cmp(&b.budget_id));
    budgets.truncate(size + 1);
    let next_page_token = if budgets.len() > size {
        budgets.truncate(size);
        budgets
            .last()
            .map(|b| b.budget_id.clone())
            .unwrap_or_default()
    } else {
        String::new()
    };
    ListBudgetsResponse {
        budgets,
        next_page_token,
    }
}

/// The books in memory, as of journal position `at`.
pub(crate) fn snapshot(books: &Books, at: u64) -> cold::Snapshot {
    cold::Snapshot {
        at,
        budgets: books.budgets.values().map(Into::into).collect(),
        reservations: books.reservations.values().map(Into::into).collect(),
    }
}

/// Checks that `tokens` and `cost` fit the budget and every ancestor.
fn check_reserve(
    books: &Books,
    budget_id: &str,
    tokens: u64,
    cost: i64,
) -> Result<(), LedgerError> {
    let chain = books.chain(budget_id);
    if chain.is_empty() {
        return Err(LedgerError::BudgetNotFound(budget_id.to_owned()));
    }
    fits_integers(&chain, tokens, cost, 0, 0)?;
    for b in &chain {
        if b.closed {
            return Err(LedgerError::Closed {
                budget_id: budget_id.to_owned(),
                closed: b.id.clone(),
            });
        }
        let tokens_fit = b.token_limit.is_none_or(|l| {
            u128::from(b.tokens_reserved) + u128::from(b.tokens_spent) + u128::from(tokens)
                <= u128::from(l)
        });
        let cost_fits = b.cost_limit.is_none_or(|l| {
            i128::from(b.cost_reserved) + i128::from(b.cost_spent) + i128::from(cost)
                <= i128::from(l)
        });
        if !tokens_fit || !cost_fits {
            return Err(LedgerError::Exceeded(Box::new(refusal(
                budget_id,
                b,
                if tokens_fit { "cost" } else { "tokens" },
                tokens,
                cost,
            ))));
        }
    }
    Ok(())
}

/// Refuses a change that would take any budget of `chain` past u64 tokens or
/// i64 micro-USD: adds `add_*` and takes `sub_*` from its reserved amounts
/// (sums are checked in 128 bits, so nothing is ever saturated).
fn fits_integers(
    chain: &[&books::BudgetState],
    add_tokens: u64,
    add_cost: i64,
    sub_tokens: u64,
    sub_cost: i64,
) -> Result<(), LedgerError> {
    for b in chain {
        let tokens =
            u128::from(b.tokens_reserved) + u128::from(b.tokens_spent) + u128::from(add_tokens)
                - u128::from(sub_tokens.min(b.tokens_reserved));
        let cost = i128::from(b.cost_reserved) + i128::from(b.cost_spent) + i128::from(add_cost)
            - i128::from(sub_cost.min(b.cost_reserved));
        if tokens > u128::from(u64::MAX) || cost > i128::from(i64::MAX) {
            return Err(LedgerError::Overflow {
                budget_id: b.id.clone(),
            });
        }
    }
    Ok(())
}

fn refusal(
    budget_id: &str,
    b: &books::BudgetState,
    dimension: &'static str,
    tokens: u64,
    cost: i64,
) -> Refusal {
    Refusal {
        budget_id: budget_id.to_owned(),
        refused_by: b.id.clone(),
        dimension,
        tokens,
        cost,
        tokens_remaining: b.tokens_remaining(),
        cost_remaining: b.cost_remaining(),
    }
}

/// Checks a Commit's or Release's reservation id and optional key, and
/// returns the key it settles under: the idempotency key, else the
/// reservation id.
fn settle_key(v: &mut Violations, reservation_id: &str, idempotency_key: &str) -> String {
    use switchyard_core::validate::{key, optional_key};
    v.check("reservation_id", key(reservation_id, "reservation id"));
    v.check(
        "idempotency_key",
        optional_key(idempotency_key, "idempotency key"),
    );
    if idempotency_key.is_empty() {
        reservation_id.to_owned()
    } else {
        idempotency_key.to_owned()
    }
}

/// The watch form of a journal record.
fn watch_response(rec: JournalRecord) -> WatchResponse {
    let kind = rec.kind().as_str_name();
    let kind = format!(
        "ledger.{}",
        kind.trim_start_matches("RECORD_KIND_").to_ascii_lowercase()
    );
    let ctx = rec.context.clone().unwrap_or_default();
    let data = serde_json::json!({
        "budget_id": rec.budget_id,
        "reservation_id": rec.reservation_id,
        "tokens": rec.tokens,
        "cost_micro_usd": micro(rec.cost.as_ref()),
        "refused_by": rec.refused_by,
        "reason": rec.reason,
    });
    WatchResponse {
        event: Some(Event {
            sequence: rec.sequence,
            time: rec.time,
            correlation_id: ctx.correlation_id,
            job_id: ctx.job_id,
            task_id: ctx.task_id,
            kind,
            data: switchyard_kit::json::json_to_struct(&data),
            chain: None,
        }),
        record: Some(rec),
    }
}

#[tonic::async_trait]
impl LedgerService for Ledger {
    async fn cool_down(
        &self,
        req: Request<CoolDownRequest>,
    ) -> Result<Response<CoolDownResponse>, Status> {
        let until = Ledger::cool_down(self, req.into_inner()).await?;
        Ok(Response::new(CoolDownResponse {
            until: Some(switchyard_kit::time::timestamp(until)),
        }))
    }

    async fn list_limits(
        &self,
        req: Request<ListLimitsRequest>,
    ) -> Result<Response<ListLimitsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let tenant = p.tenant_scope().map(str::to_owned);
        Ok(Response::new(
            Ledger::list_limits(self, req.get_ref(), tenant.as_deref()).await?,
        ))
    }

    async fn create_budget(
        &self,
        req: Request<CreateBudgetRequest>,
    ) -> Result<Response<CreateBudgetResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let tenant = p
            .tenant_scope()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                invalid(
                    "budget_id",
                    "a budget belongs to a tenant: a service creates budgets on behalf of a user",
                )
            })?
            .to_owned();
        self.may_nest(&p, req.get_ref())?;
        Ok(Response::new(
            self.create_budget_in(req.into_inner(), &tenant, p.acting_subject())
                .await?,
        ))
    }

    async fn get_budget(
        &self,
        req: Request<GetBudgetRequest>,
    ) -> Result<Response<GetBudgetResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.visible(&p, &req.get_ref().budget_id).await?;
        let budget = self.budget(&req.into_inner().budget_id).await?;
        Ok(Response::new(GetBudgetResponse {
            budget: Some(budget),
        }))
    }

    async fn list_budgets(
        &self,
        req: Request<ListBudgetsRequest>,
    ) -> Result<Response<ListBudgetsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let mut out = Ledger::list_budgets(self, req.get_ref()).await?;
        out.budgets.retain(|b| p.sees_tenant(&b.tenant));
        Ok(Response::new(out))
    }

    async fn update_limits(
        &self,
        req: Request<UpdateLimitsRequest>,
    ) -> Result<Response<UpdateLimitsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.visible(&p, &req.get_ref().budget_id).await?;
        let budget = Ledger::update_limits(self, req.into_inner()).await?;
        Ok(Response::new(UpdateLimitsResponse {
            budget: Some(budget),
        }))
    }

    async fn close_budget(
        &self,
        req: Request<CloseBudgetRequest>,
    ) -> Result<Response<CloseBudgetResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.visible(&p, &req.get_ref().budget_id).await?;
        let budget = Ledger::close_budget(self, &req.into_inner().budget_id).await?;
        Ok(Response::new(CloseBudgetResponse {
            budget: Some(budget),
        }))
    }

    async fn reserve(
        &self,
        req: Request<ReserveRequest>,
    ) -> Result<Response<ReserveResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let r = req.get_ref();
        self.visible(&p, &r.budget_id).await?;
        within_grant(&p, &r.invocation_grant, &r.budget_id, Some(r.tokens))?;
        // Room in a shared limit is everyone's: only a service may claim
        // more of it than the tokens it holds on the budget (an agent's
        // claim is bounded by its grant and its budget, like its money).
        if let Some(rate) = &r.rate
            && rate.tokens > r.tokens
            && !p.roles.has(switchyard_kit::auth::Role::Service)
        {
            return Err(invalid(
                "rate.tokens",
                format!(
                    "claims {} tokens of rate-limit room but reserves {}: reserve at least the tokens claimed",
                    rate.tokens, r.tokens
                ),
            )
            .into());
        }
        if !r.hold_id.is_empty() {
            // The hold is a reference: the caller must see it, and it must
            // sit on the budget the caller may reserve on (the desk refuses
            // a hold elsewhere).
            self.visible_reservation(&p, &r.hold_id).await?;
        }
        let corr = switchyard_kit::context::correlation_id(&req);
        let person = p.acting_subject().to_owned();
        let reservation = Ledger::reserve_as(self, req.into_inner(), &corr, &person)
            .await
            .map_err(|e| {
                let s = Status::from(e);
                let reason = ApiError::from(s.clone())
                    .reason
                    .unwrap_or_else(|| "UNKNOWN".into());
                switchyard_kit::metrics::global()
                    .ledger_refusals
                    .get_or_create(&switchyard_kit::metrics::ReasonLabels { reason })
                    .inc();
                s
            })?;
        Ok(Response::new(ReserveResponse {
            reservation: Some(reservation),
        }))
    }

    async fn commit(
        &self,
        req: Request<CommitRequest>,
    ) -> Result<Response<CommitResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let r = req.get_ref();
        let budget = self.visible_reservation(&p, &r.reservation_id).await?;
        within_grant(&p, &r.invocation_grant, &budget, None)?;
        let person = p.acting_subject().to_owned();
        Ok(Response::new(
            Ledger::commit_as(self, req.into_inner(), &person).await?,
        ))
    }

    async fn release(
        &self,
        req: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let r = req.get_ref();
        let budget = self.visible_reservation(&p, &r.reservation_id).await?;
        within_grant(&p, &r.invocation_grant, &budget, None)?;
        let person = p.acting_subject().to_owned();
        Ledger::release_as(self, req.into_inner(), &person).await?;
        Ok(Response::new(ReleaseResponse {}))
    }

    async fn list_entries(
        &self,
        req: Request<ListEntriesRequest>,
    ) -> Result<Response<ListEntriesResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        if !req.get_ref().budget_id.is_empty() {
            self.visible(&p, &req.get_ref().budget_id).await?;
        }
        let mut out = Ledger::list_entries(self, req.get_ref()).await?;
        let mut kept = Vec::with_capacity(out.entries.len());
        for e in out.entries {
            if self.sees(&p, &e.budget_id).await? {
                kept.push(e);
            }
        }
        out.entries = kept;
        Ok(Response::new(out))
    }

    async fn report(
        &self,
        req: Request<ReportRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let out = Ledger::report(self, req.get_ref(), |tenant| p.sees_tenant(tenant)).await?;
        Ok(Response::new(out))
    }

    async fn verify_journal(
        &self,
        req: Request<VerifyJournalRequest>,
    ) -> Result<Response<VerifyJournalResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let id = &req.get_ref().budget_id;
        if !id.is_empty() {
            self.visible(&p, id).await?;
        }
        let out = Ledger::verify_journal(self, id, |tenant| p.sees_tenant(tenant)).await?;
        Ok(Response::new(out))
    }

    async fn estimate_cost(
        &self,
        req: Request<EstimateCostRequest>,
    ) -> Result<Response<EstimateCostResponse>, Status> {
        Ok(Response::new(Ledger::estimate_cost(self, req.get_ref())?))
    }

    type WatchStream = futures_util::stream::BoxStream<'static, Result<WatchResponse, Status>>;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        if !req.get_ref().budget_id.is_empty() {
            self.visible(&p, &req.get_ref().budget_id).await?;
        }
        Ok(Response::new(self.watch_stream(req.into_inner(), p).await?))
    }
}

/// An agent key spends only inside the invocation grant it was handed
/// (`InvocationContext.grant`): on the budget the grant names, at most its
/// ceiling per reservation, and reserving only before it expires (settling
/// what was reserved stays possible after). People and services act by
/// their roles and the budget's tenant alone.
fn within_grant(
    p: &switchyard_kit::auth::Principal,
    token: &str,
    budget_id: &str,
    reserving: Option<u64>,
) -> Result<(), LedgerError> {
    // The caller itself: the executor spending for a job an agent
    // submitted acts under its own service identity.
    if p.kind != switchyard_kit::auth::Kind::Agent {
        return Ok(());
    }
    let key = switchyard_kit::auth::grant::key();
    let grant = match reserving {
        Some(_) => key.verify(token, switchyard_kit::time::now_ms())?,
        None => key.open(token)?,
    };
    if grant.budget_id != budget_id || p.tenant_scope().is_some_and(|t| t != grant.tenant) {
        return Err(GrantError::Outside(format!(
            "it names budget {:?}, not {budget_id:?}",
            grant.budget_id
        ))
        .into());
    }
    if let Some(tokens) = reserving.filter(|t| *t > grant.max_tokens) {
        return Err(GrantError::Outside(format!(
            "{tokens} tokens exceed the {} one reservation under it may hold",
            grant.max_tokens
        ))
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
