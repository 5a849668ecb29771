//! The Switchyard approval gate: AgentRunSpec records (seed 004). Nothing
//! spends tokens before its run is approved — by a TOML policy or by a person
//! other than the run's creator — and every action lands in an append-only
//! audit log.
//!
//! Called by the executor (propose a run per job, claim it while working,
//! complete or fail it), by people through the CLI (approve, reject, cancel,
//! manual mode) and by watchers. Run statuses move only through
//! [`switchyard_core::run::check`]; who may act is decided in [`authorize`].

pub mod adapter;
mod backend;
mod bundle;
pub mod chain;
mod content;
mod dispatch;
mod pg;
mod policy;
mod receipts;
mod runs;
mod stored;
mod validate;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use switchyard_core::run::{self as table, Refused, RunStatus as S};
use switchyard_core::{Clock, Reason, Violations};
use switchyard_kit::error::{invalid_argument, metadata, status_with_metadata};
use switchyard_kit::shutdown::Shutdown;
use switchyard_kit::time::{timestamp, timestamp_ms};
use switchyard_proto::approval::v1::approval_service_server::{
    ApprovalService, ApprovalServiceServer,
};
use switchyard_proto::approval::v1::*;
use switchyard_proto::common::v1::Event;
use switchyard_store::{Store, StoreError};

use crate::backend::{Backend, SledBook};
use crate::runs::{RunSet, Runs};
use tonic::{Code, Request, Response, Status};

pub use policy::{Policy, sources as policy_sources};

use switchyard_kit::auth::{Kind, Permission, Principal, principal};

/// `[approval]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalConfig {
    /// Claim lease when the worker asks for none.
    pub default_lease_secs: u32,
    /// Longest claim lease.
    pub max_lease_secs: u32,
    /// Retries of a run that does not say.
    pub default_max_retries: u32,
    /// First retry delay; doubles per retry.
    pub retry_backoff_base_ms: u64,
    /// Longest retry delay.
    pub retry_backoff_max_ms: u64,
    /// How often expired claims are detected, ms.
    pub sweep_interval_ms: u64,
    /// Auto-approve rules, tried in order (`[[approval.policies]]`). The
    /// default approves only runs whose estimated cost is zero.
    pub policies: Vec<Policy>,
    /// Two-person rule: a run whose estimated cost is above this many
    /// micro-USD (or unknown) needs two distinct approvers. Unset: one.
    pub two_person_above_micro_usd: Option<i64>,
    /// Runs that ended (completed, rejected, cancelled, failed) are kept
    /// this long after they ended, with their audit records, seconds; 0
    /// keeps them forever.
    pub retention_secs: u64,
    /// How often runs past their retention are pruned, seconds.
    pub prune_interval_secs: u64,
    /// The adapters that execute approved runs (`[approval.adapters]`).
    pub adapters: adapter::AdaptersConfig,
    /// Largest artifact a run may carry (a pasted result, an OJS job's
    /// result), bytes.
    pub artifact_max_bytes: usize,
    /// A file holding the Ed25519 key that signs decision receipts: its
    /// 32-byte seed in base64 (on Kubernetes, a Secret mounted as a file;
    /// every replica the same). Unset: on the embedded store a key is made
    /// once and kept there; on PostgreSQL the first replica to start makes
    /// one and the database keeps it for every replica (a file keeps it out
    /// of reach of whoever can write the database: set one there).
    pub receipt_key_file: Option<std::path::PathBuf>,
    /// Public keys (base64) of receipt keys used before the current one:
    /// the run seals they signed still verify after a rotation
    /// (`switchyard audit key --new` prints a key and its public key).
    pub previous_receipt_public_keys: Vec<String>,
}

impl Default for ApprovalConfig {
    fn default() -> Self {
        Self {
            default_lease_secs: 300,
            max_lease_secs: 3_600,
            default_max_retries: 3,
            retry_backoff_base_ms: 1_000,
            retry_backoff_max_ms: 300_000,
            sweep_interval_ms: 1_000,
            policies: vec![Policy::zero_cost()],
            two_person_above_micro_usd: None,
            retention_secs: 7 * 24 * 3600,
            prune_interval_secs: 3600,
            adapters: adapter::AdaptersConfig::default(),
            artifact_max_bytes: 1 << 20,
            receipt_key_file: None,
            previous_receipt_public_keys: Vec::new(),
        }
    }
}

impl ApprovalConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        if self.default_lease_secs == 0 || self.default_lease_secs > self.max_lease_secs {
            return Err("approval.default_lease_secs must be > 0 and <= max_lease_secs".into());
        }
        if self.sweep_interval_ms == 0 || self.retry_backoff_base_ms == 0 {
            return Err("approval.sweep_interval_ms and retry_backoff_base_ms must be > 0".into());
        }
        if !adapter::NAMES.contains(&self.adapters.default.as_str())
            || self.adapters.default == "switchyard"
        {
            return Err(format!(
                "approval.adapters.default must be manual or ojs, got {:?}",
                self.adapters.default
            ));
        }
        if self.adapters.poll_ms == 0 || self.artifact_max_bytes == 0 {
            return Err(
                "approval.adapters.poll_ms and approval.artifact_max_bytes must be > 0".into(),
            );
        }
        if let Some(o) = &self.adapters.ojs {
            adapter::Ojs::new(o.clone())?;
        }
        for k in &self.previous_receipt_public_keys {
            if !switchyard_kit::receipt::is_public_key(k) {
                return Err(format!(
                    "approval.previous_receipt_public_keys: {k:?} is not an Ed25519 public key in base64 (what `switchyard audit key --new` printed as the public key)"
                ));
            }
        }
        policy::validate_all(&self.policies)
    }

    /// Delay before retry number `n` (1-based): base × 2^(n-1), capped.
    pub fn backoff_ms(&self, n: u32) -> u64 {
        let factor = 1u64.checked_shl(n.saturating_sub(1)).unwrap_or(u64::MAX);
        self.retry_backoff_base_ms
            .saturating_mul(factor)
            .min(self.retry_backoff_max_ms)
    }
}

/// Approval failures; each maps to one gRPC status in `From<ApprovalError>`.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// The request has invalid fields.
    #[error("invalid request: {0}")]
    Invalid(Violations),
    /// No such run.
    #[error("run {parent:?} is {status}, not running, so it cannot cover a delegated run")]
    ParentNotRunning { parent: String, status: String },
    #[error("run {0:?} does not exist")]
    RunNotFound(String),
    /// The id is taken by a run with another spec.
    #[error("run {0:?} already exists with a different spec")]
    RunExists(String),
    /// The table does not allow the move.
    #[error("{refused}")]
    Transition {
        /// Run id.
        run_id: String,
        /// Why.
        refused: Refused,
    },
    /// The run's retry is scheduled later.
    #[error("run {run_id:?} may not be claimed before its next attempt at {next_attempt_ms} ms")]
    NotDue {
        /// Run id.
        run_id: String,
        /// `next_attempt_at`, Unix ms.
        next_attempt_ms: u64,
    },
    /// The worker does not hold the claim.
    #[error("worker {worker:?} does not hold the claim on run {run_id:?}: {why}")]
    ClaimNotHeld {
        /// Run id.
        run_id: String,
        /// Caller.
        worker: String,
        /// Why not.
        why: String,
    },
    /// The approver created the run.
    #[error("{actor:?} created run {run_id:?} and cannot approve it; someone else must")]
    SeparationOfDuties {
        /// Run id.
        run_id: String,
        /// Would-be approver.
        actor: String,
    },
    /// Two-person rule: this approver already approved the run.
    #[error("{actor:?} already approved run {run_id:?}; it needs a second, different approver")]
    SecondApproval {
        /// Run id.
        run_id: String,
        /// The approver who tried twice.
        actor: String,
    },
    /// The action needs an actor.
    #[error("{action} needs an authenticated person")]
    ActorRequired {
        /// The action.
        action: &'static str,
    },
    /// The imported result was made against another context pack.
    #[error("context hash {got:?} does not match run {run_id:?}'s context pack {expected:?}")]
    ContextHashMismatch {
        /// Run id.
        run_id: String,
        /// The run's hash.
        expected: String,
        /// The import's hash.
        got: String,
    },
    /// The run is not approved, so it cannot be exported for manual execution.
    #[error("run {run_id:?} is {status}; only approved runs can be exported for manual execution")]
    ApprovalRequired {
        /// Run id.
        run_id: String,
        /// Its status.
        status: S,
    },
    /// An adapter failed or refused; its deterministic code is the reason.
    #[error("{0}")]
    Adapter(#[from] adapter::AdapterError),
    /// A run's artifact was refused (kind not allowed, too large, bad name).
    #[error("{}", .0.message)]
    ArtifactRefused(switchyard_api::artifacts::Refused),
    /// No artifact of the run has that path.
    #[error(
        "run {run_id:?} has no artifact {path:?}; `switchyard approval artifacts {run_id}` lists them"
    )]
    ArtifactNotFound {
        /// Run id.
        run_id: String,
        /// The path asked for.
        path: String,
    },
    /// Storage failed; nothing was acknowledged.
    #[error("storage failed: {0}")]
    Storage(#[from] StoreError),
    /// The run was never approved, so it has no receipt.
    #[error(
        "run {0:?} has no receipt: it was never approved (`switchyard approval show {0}` shows its decisions)"
    )]
    ReceiptNotFound(String),
    /// The receipt key could not be read.
    #[error("approval.receipt_key_file: {0}")]
    ReceiptKey(String),
    /// No stored policy file of that name.
    #[error("no stored policy file is named {0:?} (`switchyard policy list` lists them)")]
    PolicyNotFound(String),
}

impl From<ApprovalError> for Status {
    fn from(e: ApprovalError) -> Status {
        let msg = e.to_string();
        let (code, reason, md) = match e {
            ApprovalError::Invalid(v) => return invalid_argument(Reason::InvalidArgument, &v),
            ApprovalError::ParentNotRunning { parent, status } => (
                Code::FailedPrecondition,
                Reason::RunNotRunning,
                metadata([("approved_under", parent), ("status", status)]),
            ),
            ApprovalError::RunNotFound(id) => (
                Code::NotFound,
                Reason::RunNotFound,
                metadata([("run_id", id)]),
            ),
            ApprovalError::ReceiptNotFound(id) => (
                Code::NotFound,
                Reason::ReceiptNotFound,
                metadata([("run_id", id)]),
            ),
            ApprovalError::PolicyNotFound(name) => (
                Code::NotFound,
                Reason::PolicyNotFound,
                metadata([("name", name)]),
            ),
            ApprovalError::ReceiptKey(_) => (
                Code::FailedPrecondition,
                Reason::InvalidArgument,
                metadata([]),
            ),
            ApprovalError::RunExists(id) => (
                Code::AlreadyExists,
                Reason::RunAlreadyExists,
                metadata([("run_id", id)]),
            ),
            ApprovalError::Transition { run_id, refused } => (
                Code::FailedPrecondition,
                refused.reason,
                metadata([
                    ("run_id", run_id),
                    ("from", refused.from.as_str().into()),
                    ("to", refused.to.as_str().into()),
                ]),
            ),
            ApprovalError::NotDue {
                run_id,
                next_attempt_ms,
            } => (
                Code::FailedPrecondition,
                Reason::RunNotDue,
                metadata([
                    ("run_id", run_id),
                    ("next_attempt_at_ms", next_attempt_ms.to_string()),
                ]),
            ),
            ApprovalError::ClaimNotHeld { run_id, worker, .. } => (
                Code::FailedPrecondition,
                Reason::ClaimNotHeld,
                metadata([("run_id", run_id), ("worker_id", worker)]),
            ),
            ApprovalError::SeparationOfDuties { run_id, actor } => (
                Code::PermissionDenied,
                Reason::SeparationOfDuties,
                metadata([("run_id", run_id), ("actor", actor)]),
            ),
            ApprovalError::SecondApproval { run_id, actor } => (
                Code::FailedPrecondition,
                Reason::SecondApprovalRequired,
                metadata([("run_id", run_id), ("actor", actor)]),
            ),
            ApprovalError::ActorRequired { action } => (
                Code::Unauthenticated,
                Reason::ActorRequired,
                metadata([("action", action.into())]),
            ),
            ApprovalError::ContextHashMismatch {
                run_id, expected, ..
            } => (
                Code::FailedPrecondition,
                Reason::ContextHashMismatch,
                metadata([("run_id", run_id), ("expected_hash", expected)]),
            ),
            ApprovalError::ApprovalRequired { run_id, status } => (
                Code::FailedPrecondition,
                Reason::ApprovalRequired,
                metadata([("run_id", run_id), ("status", status.as_str().into())]),
            ),
            ApprovalError::Adapter(a) => (
                match a.reason {
                    Reason::AdapterUnreachable => Code::Unavailable,
                    Reason::AdapterJobNotFound => Code::NotFound,
                    _ => Code::FailedPrecondition,
                },
                a.reason,
                metadata([]),
            ),
            ApprovalError::ArtifactRefused(r) => (Code::FailedPrecondition, r.reason, metadata([])),
            ApprovalError::ArtifactNotFound { run_id, path } => (
                Code::NotFound,
                Reason::ArtifactNotFound,
                metadata([("run_id", run_id), ("path", path)]),
            ),
            ApprovalError::Storage(_) => (Code::Unavailable, Reason::StorageFailure, metadata([])),
        };
        status_with_metadata(code, reason, msg, md)
    }
}

fn invalid(field: &str, description: impl Into<String>) -> ApprovalError {
    let mut v = Violations::new();
    v.add(field, description);
    ApprovalError::Invalid(v)
}

/// The proto status of a core status.
pub fn to_proto(s: S) -> RunStatus {
    match s {
        S::Proposed => RunStatus::Proposed,
        S::Approved => RunStatus::Approved,
        S::Rejected => RunStatus::Rejected,
        S::Running => RunStatus::Running,
        S::Completed => RunStatus::Completed,
        S::Failed => RunStatus::Failed,
        S::Cancelled => RunStatus::Cancelled,
    }
}

/// The core status of a proto status (`None` for unspecified or unknown).
pub fn from_proto(s: i32) -> Option<S> {
    Some(match RunStatus::try_from(s).ok()? {
        RunStatus::Unspecified => return None,
        RunStatus::Proposed => S::Proposed,
        RunStatus::Approved => S::Approved,
        RunStatus::Rejected => S::Rejected,
        RunStatus::Running => S::Running,
        RunStatus::Completed => S::Completed,
        RunStatus::Failed => S::Failed,
        RunStatus::Cancelled => S::Cancelled,
    })
}

fn status_of(run: &Run) -> S {
    from_proto(run.status).unwrap_or(S::Proposed)
}

/// The name the audit log records for `p`: the user, and the service acting
/// for them when there is one (`alice (via service:executor)`).
pub fn audit_name(p: &Principal) -> String {
    match p.via() {
        Some(via) => format!("{} (via {via})", p.acting_subject()),
        None => p.acting_subject().to_owned(),
    }
}

/// Whether `p` may see `run`: its tenant's runs, and of those only its own
/// unless it reads the audit (approvers, operators, viewers, admins,
/// services).
pub fn visible(p: &Principal, run: &Run) -> bool {
    p.may_see(&run.tenant, &run.created_by)
}

/// Actions that need a decision about who may act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// proposed|failed → approved.
    Approve,
    /// proposed → rejected.
    Reject,
    /// → cancelled.
    Cancel,
    /// Manual mode: export the prompt bundle.
    Export,
    /// Manual mode: import a pasted result.
    Import,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Approve => "approve",
            Action::Reject => "reject",
            Action::Cancel => "cancel",
            Action::Export => "export",
            Action::Import => "import",
        }
    }
}

/// Who may do `action` on `run`: every human action needs an actor, and the
/// approver must not be the run's creator (separation of duties).
pub fn authorize(action: Action, actor: Option<&str>, run: &Run) -> Result<String, ApprovalError> {
    let Some(actor) = actor else {
        return Err(ApprovalError::ActorRequired {
            action: action.as_str(),
        });
    };
    // Nor may the approver whose edit made this call approve it.
    let editor = run.tool_call.as_ref().map(|c| c.edited_by.as_str());
    if action == Action::Approve && (actor == run.created_by || editor == Some(actor)) {
        return Err(ApprovalError::SeparationOfDuties {
            run_id: run.run_id.clone(),
            actor: actor.to_owned(),
        });
    }
    Ok(actor.to_owned())
}

/// Whether two JSON texts hold the same value (text that does not parse
/// is compared as text).
fn same_json(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Worker actions check that the caller holds an unexpired claim.
fn claim_held(run: &Run, worker: &str, now: u64) -> Result<(), ApprovalError> {
    let not_held = |why: String| ApprovalError::ClaimNotHeld {
        run_id: run.run_id.clone(),
        worker: worker.to_owned(),
        why,
    };
    if status_of(run) != S::Running {
        return Err(not_held(format!("the run is {}", status_of(run))));
    }
    if run.claimed_by != worker {
        return Err(not_held(format!("it is held by {:?}", run.claimed_by)));
    }
    if run.claim_expires_at.as_ref().map_or(0, timestamp_ms) <= now {
        return Err(not_held("the claim expired".into()));
    }
    Ok(())
}

/// One audit record about to be written; the sequence and time are filled in
/// when it is appended.
struct Note<'a> {
    actor: &'a str,
    event_type: &'a str,
    from: Option<S>,
    reason: String,
    details: std::collections::BTreeMap<String, String>,
}

impl<'a> Note<'a> {
    fn new(actor: &'a str, event_type: &'a str, reason: impl Into<String>) -> Self {
        Note {
            actor,
            event_type,
            from: None,
            reason: reason.into(),
            details: Default::default(),
        }
    }

    fn detail(mut self, k: &str, v: impl ToString) -> Self {
        self.details.insert(k.to_owned(), v.to_string());
        self
    }
}

/// What a mutation works on: the runs, and (on PostgreSQL) the audit
/// records it wrote, numbered when its transaction commits.
pub(crate) struct State {
    runs: RunSet,
    pending: Vec<AuditRecord>,
}

struct Inner {
    cfg: ApprovalConfig,
    clock: Arc<dyn Clock>,
    shutdown: Shutdown,
    /// Adapters of approved runs.
    adapters: adapter::Adapters,
    /// Run artifacts' content, by address.
    content: content::Content,
    backend: Backend,
    /// Signs decision receipts.
    receipts: switchyard_kit::receipt::ReceiptKey,
    /// The policy set in force (the `[[approval.policies]]` rules, and the
    /// `[policy]` directory's when the process gives it).
    policies: switchyard_policy::Slot,
}

/// Runs waiting for a person, and how long the oldest has waited.
impl switchyard_kit::metrics::Gauges for Inner {
    fn set(&self, m: &switchyard_kit::metrics::Metrics) {
        let now = self.clock.now_ms();
        let Some(waiting) = self.backend.proposed_at(now) else {
            return;
        };
        m.approvals_pending.set(waiting.len() as i64);
        let oldest = waiting
            .iter()
            .min()
            .map_or(0, |t| now.saturating_sub(*t) / 1000);
        m.oldest_approval_seconds
            .set(i64::try_from(oldest).unwrap_or(i64::MAX));
    }
}

/// The approval service. Cheap to clone; all clones share state.
#[derive(Clone)]
pub struct Approval {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Approval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approval").finish_non_exhaustive()
    }
}

/// Whether `run` passes a ListRuns filter (`statuses` parsed from it).
fn listed(req: &ListRunsRequest, statuses: &[S], r: &Run) -> bool {
    let t = r.target.as_ref();
    (statuses.is_empty() || statuses.contains(&status_of(r)))
        && (req.created_by.is_empty() || r.created_by == req.created_by)
        && (req.target_org.is_empty() || t.is_some_and(|t| t.org == req.target_org))
        && (req.target_repo.is_empty() || t.is_some_and(|t| t.repo == req.target_repo))
        && (req.work_item_id.is_empty()
            || t.is_some_and(|t| t.work_item_ids.contains(&req.work_item_id)))
}

/// The policies' principal kind of an authenticated kind.
fn policy_kind(kind: Kind) -> switchyard_policy::PrincipalKind {
    match kind {
        Kind::Human => switchyard_policy::PrincipalKind::Person,
        Kind::Agent => switchyard_policy::PrincipalKind::Agent,
        Kind::Service => switchyard_policy::PrincipalKind::Service,
    }
}

/// Sort key of `ListRuns`: proposed runs first, then by creation time.
fn list_key(run: &Run) -> String {
    let rank = u8::from(status_of(run) != S::Proposed);
    let created = run.created_at.as_ref().map_or(0, timestamp_ms);
    format!("{rank}:{created:020}:{}", run.run_id)
}

impl Approval {
    /// Opens the approval service on `store`.
    pub fn open(
        cfg: ApprovalConfig,
        store: Store,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
    ) -> Result<Approval, ApprovalError> {
        let audit = store.log::<AuditRecord>("audit")?;
        let started = std::time::Instant::now();
        let runs = Runs::open(&store, &audit)?;
        tracing::info!(
            runs_in_flight = runs.in_memory(),
            audit_records = audit.last(),
            ms = started.elapsed().as_millis() as u64,
            "approval loaded"
        );
        let blobs = switchyard_store::Blobs::open(&store, "artifact_blobs")?;
        let content = content::Content::Sled(blobs);
        let receipts = receipts::key(&cfg, &store)?;
        let book = SledBook {
            state: Mutex::new(State {
                runs: RunSet::Sled(runs),
                pending: Vec::new(),
            }),
            audit,
            store,
        };
        Self::with(
            cfg,
            clock,
            shutdown,
            content,
            Backend::Sled(Box::new(book)),
            receipts,
        )
    }

    /// Opens the approval service on PostgreSQL (migrating the schema
    /// first), as one of any number of replicas sharing the database.
    pub async fn open_pg(
        cfg: ApprovalConfig,
        db: switchyard_store::pg::Pg,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
    ) -> Result<Approval, ApprovalError> {
        let runs = pg::PgRuns::open(db.clone()).await?;
        let content = content::Content::Pg(db);
        let receipts = receipts::shared_key(&cfg, &runs).await?;
        Self::with(cfg, clock, shutdown, content, Backend::Pg(runs), receipts)
    }

    /// Applies the approval service's schema migrations to `db`.
    pub async fn migrate(db: &switchyard_store::pg::Pg) -> Result<usize, ApprovalError> {
        Ok(db.migrate_service("approval", pg::MIGRATIONS).await?)
    }

    fn with(
        cfg: ApprovalConfig,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        content: content::Content,
        backend: Backend,
        receipts: switchyard_kit::receipt::ReceiptKey,
    ) -> Result<Approval, ApprovalError> {
        let ojs = match &cfg.adapters.ojs {
            Some(o) => Some(adapter::Ojs::new(o.clone()).map_err(|e| invalid("adapters.ojs", e))?),
            None => None,
        };
        let adapters = adapter::Adapters {
            manual: adapter::Manual {
                blobs: Some(content.clone()),
            },
            switchyard: adapter::Switchyard::default(),
            ojs,
        };
        let policies = switchyard_policy::Engine::new(policy::sources(&cfg.policies), None)
            .map_err(|e| invalid("approval.policies", e.to_string()))?;
        let inner = Arc::new(Inner {
            cfg,
            clock,
            shutdown,
            adapters,
            content,
            backend,
            receipts,
            policies: switchyard_policy::Slot::new(policies),
        });
        switchyard_kit::metrics::global().add_gauges(&inner);
        Ok(Approval { inner })
    }

    /// Decides runs with `engine` (built from this service's rules and the
    /// `[policy]` directory) from now on.
    pub fn set_policies(&self, engine: Arc<switchyard_policy::Engine>) {
        self.inner.policies.set(engine);
    }

    /// The tonic server for this service.
    pub fn server(&self, max_message_bytes: usize) -> ApprovalServiceServer<Approval> {
        ApprovalServiceServer::new(self.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// Returns runs with expired claims to `approved` (or `failed`) every
    /// `sweep_interval_ms` until shutdown, and moves the replay checkpoint.
    pub fn spawn_sweeper(&self) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let period = Duration::from_millis(self.inner.cfg.sweep_interval_ms);
        self.inner
            .shutdown
            .spawn_every(period, "expiring claims", move || {
                let me = me.clone();
                async move {
                    me.sweep().await?;
                    // The next start-up replays from here.
                    me.inner.backend.checkpoint()
                }
            })
    }

    /// Removes the runs that ended longer ago than `retention_secs` every
    /// `prune_interval_secs` until shutdown (when a retention is set).
    pub fn spawn_pruner(&self) -> Option<tokio::task::JoinHandle<()>> {
        let keep_ms = self.inner.cfg.retention_secs.saturating_mul(1000);
        if keep_ms == 0 {
            return None;
        }
        let me = self.clone();
        let period = Duration::from_secs(self.inner.cfg.prune_interval_secs.max(1));
        Some(
            self.inner
                .shutdown
                .spawn_every(period, "pruning ended runs", move || {
                    let me = me.clone();
                    async move { me.prune(keep_ms).await.map(drop) }
                }),
        )
    }

    /// Removes the runs that ended more than `older_than_ms` ago, with
    /// their audit records; returns how many runs and records went.
    pub async fn prune(&self, older_than_ms: u64) -> Result<(usize, u64), ApprovalError> {
        let cutoff = self.now().saturating_sub(older_than_ms);
        let (runs, records) = self.inner.backend.prune(cutoff).await?;
        if runs > 0 {
            tracing::info!(runs, records, "pruned ended runs past their retention");
        }
        Ok((runs, records))
    }

    /// Flushes to disk (shutdown), with a fresh replay checkpoint.
    pub fn flush(&self) -> Result<(), ApprovalError> {
        self.inner.backend.flush()
    }

    fn now(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Everything audited so far; an answer that rests on a record may
    /// wait for it to be durable.
    fn audited_so_far(&self) -> u64 {
        self.inner.backend.audited_so_far()
    }

    /// Runs `body` against the runs `ids` (and only those) and answers once
    /// what it wrote is durable (see [`Backend::mutate`]).
    async fn mutate<T: Send>(
        &self,
        ids: &[&str],
        body: impl FnMut(&mut State) -> Result<(T, u64), ApprovalError> + Send,
    ) -> Result<T, ApprovalError> {
        self.inner.backend.mutate(ids, self.now(), body).await
    }

    /// Keeps `run` (already in its new state) and appends an audit record
    /// about the change: the one way a run is stored.
    fn audit(&self, st: &mut State, run: &mut Run, note: Note<'_>) -> Result<u64, ApprovalError> {
        let now = self.now();
        let to = status_of(run);
        let mut rec = AuditRecord {
            sequence: 0,
            time: Some(timestamp(now)),
            actor: note.actor.to_owned(),
            run_id: run.run_id.clone(),
            event_type: note.event_type.to_owned(),
            from_status: note.from.map_or(RunStatus::Unspecified, to_proto) as i32,
            to_status: to_proto(to) as i32,
            reason: note.reason,
            correlation_id: run.correlation_id.clone(),
            details: note.details,
            chain: None,
        };
        // The record links to the head kept with the run's last record
        // (a new run has none, whatever its proposal said); `run` leaves
        // with the new head, as it is kept.
        run.audit_head = st.runs.get(&run.run_id).and_then(|r| r.audit_head.clone());
        chain::link(run, &mut rec, &self.inner.receipts, now);
        let make = move |sequence| AuditRecord { sequence, ..rec };
        self.inner.backend.append_audit(st, run, now, make)
    }

    /// Audits something that happened to `run` without moving it.
    fn audit_in_place(
        &self,
        st: &mut State,
        run: &mut Run,
        note: Note<'_>,
    ) -> Result<u64, ApprovalError> {
        let from = Some(status_of(run));
        self.audit(st, run, Note { from, ..note })
    }

    /// Moves run `id` to `to` through the table, applying `change`, storing
    /// the run and auditing the move. The one place statuses change.
    fn transition(
        &self,
        st: &mut State,
        id: &str,
        to: S,
        note: Note<'_>,
        change: impl FnOnce(&mut Run),
    ) -> Result<(Run, u64), ApprovalError> {
        let Some(current) = st.runs.get(id) else {
            return Err(ApprovalError::RunNotFound(id.to_owned()));
        };
        let from = status_of(&current);
        table::check(from, to).map_err(|refused| ApprovalError::Transition {
            run_id: id.to_owned(),
            refused,
        })?;
        let mut run = current.into_owned();
        change(&mut run);
        run.status = to_proto(to) as i32;
        if matches!(to, S::Approved | S::Rejected | S::Cancelled) {
            note.actor.clone_into(&mut run.decided_by);
            note.reason.clone_into(&mut run.decision_comment);
            run.decided_at = Some(switchyard_kit::time::timestamp(self.now()));
        }
        if matches!(to, S::Approved | S::Completed | S::Failed | S::Cancelled) {
            run.claimed_by.clear();
            run.claim_expires_at = None;
        }
        let mut note = Note {
            from: Some(from),
            ..note
        };
        if from == S::Proposed && matches!(to, S::Approved | S::Rejected) {
            let proposed = run
                .created_at
                .as_ref()
                .map_or(0, switchyard_kit::time::timestamp_ms);
            switchyard_kit::metrics::global()
                .approval_wait
                .get_or_create(&switchyard_kit::metrics::DecisionLabels {
                    decision: to.to_string(),
                })
                .observe(self.now().saturating_sub(proposed) as f64 / 1000.0);
        }
        if to == S::Approved {
            // The decision's receipt, kept with its audit record.
            let body = receipts::body(&run, note.actor, self.now(), note.event_type);
            let receipt = self.inner.receipts.sign(body);
            note = note.detail(
                "receipt",
                serde_json::to_string(&receipt).unwrap_or_default(),
            );
        }
        let seq = self.audit(st, &mut run, note)?;
        if matches!(to, S::Approved | S::Rejected | S::Cancelled) {
            // A decision is an operator's event: who decided what (never
            // the run's prompt or the decider's comment).
            tracing::info!(run_id = %id, job_id = %run.job_id, by = %run.decided_by, "run {to}");
        } else {
            tracing::debug!(run_id = %id, %from, %to, "run moved");
        }
        Ok((run, seq))
    }

    /// Proposes a run; a matching policy approves it at once.
    pub async fn propose(
        &self,
        req: ProposeRequest,
        actor: Option<String>,
    ) -> Result<ProposeResponse, ApprovalError> {
        self.propose_by(req, actor, switchyard_policy::PrincipalKind::Person)
            .await
    }

    /// Proposes a run for a party of `kind` (what the policies see as the
    /// principal, with the run's `created_by` and `tenant`).
    pub async fn propose_by(
        &self,
        req: ProposeRequest,
        actor: Option<String>,
        kind: switchyard_policy::PrincipalKind,
    ) -> Result<ProposeResponse, ApprovalError> {
        let Some(mut run) = req.run else {
            return Err(invalid("run", "run is required"));
        };
        if run.created_by.is_empty() {
            run.created_by = actor.clone().unwrap_or_default();
        }
        validate::run(&run).map_err(ApprovalError::Invalid)?;
        self.bind_adapter(&mut run)?;
        let actor = actor.unwrap_or_else(|| run.created_by.clone());
        let now = self.now();
        if run.run_id.is_empty() {
            run.run_id = format!("run-{}", uuid::Uuid::now_v7());
        }
        run.max_retries = Some(
            run.max_retries
                .unwrap_or(self.inner.cfg.default_max_retries),
        );
        run.correlation_id = if run.correlation_id.is_empty() {
            switchyard_kit::context::current()
                .map(|c| c.correlation_id)
                .unwrap_or_default()
        } else {
            run.correlation_id
        };
        let spec = validate::spec_of(&run);
        let proposal = run;
        let approved_under = req.approved_under.clone();
        // A claim asked for with the proposal: its lease checked up front.
        let claim = match &req.claim {
            Some(c) => Some((
                c.worker_id.clone(),
                self.lease_ms("claim.", &c.worker_id, c.lease_secs)?,
            )),
            None => None,
        };
        let ids = [proposal.run_id.as_str(), approved_under.as_str()];
        self.mutate(&ids, |st| {
            let mut run = proposal.clone();
            if !req.approved_under.is_empty() && !st.runs.contains_key(&run.run_id) {
                let Some(parent) = st.runs.get(&req.approved_under) else {
                    return Err(ApprovalError::RunNotFound(req.approved_under.clone()));
                };
                // The parent's approval covers only runs of its tenant and
                // never itself (the executor bound the child to the parent
                // job before proposing); any other run is not visible here.
                if parent.tenant != run.tenant
                    || (!run.job_id.is_empty() && parent.job_id == run.job_id)
                {
                    return Err(ApprovalError::RunNotFound(req.approved_under.clone()));
                }
                if status_of(&parent) != S::Running {
                    return Err(ApprovalError::ParentNotRunning {
                        parent: req.approved_under.clone(),
                        status: status_of(&parent).as_str().to_owned(),
                    });
                }
            }
            if let Some(existing) = st.runs.get(&run.run_id) {
                if validate::spec_of(&existing) != spec {
                    return Err(ApprovalError::RunExists(run.run_id));
                }
                let out = ProposeResponse {
                    run: Some(existing.into_owned()),
                    auto_approved_by: String::new(),
                    created: false,
                };
                Ok((out, self.audited_so_far()))
            } else {
                run.schema_version = validate::SCHEMA_VERSION.into();
                run.created_at = Some(timestamp(now));
                run.status = RunStatus::Proposed as i32;
                // Seed 004: a run that can spend always needs approval; policy
                // approval is recorded as such, never skipped.
                run.requires_approval = true;
                run.retry_count = 0;
                run.claimed_by.clear();
                run.claim_expires_at = None;
                run.next_attempt_at = None;
                run.last_error.clear();
                run.result = None;
                // Who approved and decided is the server's record of
                // authenticated people, never the proposer's claim: a run
                // proposed with an approver already named would need one
                // real approval less.
                run.approved_by.clear();
                run.decided_by.clear();
                run.decision_comment.clear();
                run.decided_at = None;
                run.reason_code.clear();
                run.adapter_state.clear();
                // What the policies decide about it, with the facts now.
                let left = req.budget_left.as_ref().map(|b| {
                    switchyard_policy::Remaining::left(b.tokens, b.cost.map(|m| m.micro_usd))
                });
                let decision =
                    self.policy_decision(st, &mut run, &req.approved_under, left, kind, now);
                self.audit(st, &mut run, Note::new(&actor, "proposed", ""))?;
                let pack = run.context_pack.clone().unwrap_or_default();
                let est = run.cost_estimate.unwrap_or_default();
                let max_tokens = run.max_tokens;
                let mut seq = self.audit(
                    st,
                    &mut run,
                    Note::new(
                        &actor,
                        "context_pack_built",
                        "context pack bound to the run",
                    )
                    .detail("context_hash", &pack.hash)
                    .detail("pack_id", &pack.pack_id)
                    .detail("pack_version", &pack.version)
                    .detail("inputs", pack.inputs.len())
                    .detail("max_tokens", max_tokens)
                    .detail("estimated_input_tokens", est.estimated_input_tokens)
                    .detail("estimated_output_tokens", est.estimated_output_tokens)
                    .detail(
                        "estimated_cost_micro_usd",
                        est.estimated_cost
                            .map_or("unknown".into(), |m| m.micro_usd.to_string()),
                    )
                    .detail("requested_by", &actor),
                )?;
                if let switchyard_policy::Verdict::Forbid { by, message } = &decision.verdict {
                    let who = format!("policy:{}", by.join(","));
                    let why = decision.explain();
                    let (refused, s) = self.transition(
                        st,
                        &run.run_id,
                        S::Rejected,
                        Note::new(&who, "policy_forbidden", &why)
                            .detail("policies", by.join(","))
                            .detail("policy_version", &decision.version)
                            .detail("message", message),
                        |r| {
                            r.reason_code = Reason::PolicyForbidden.as_str().to_owned();
                            r.last_error.clone_from(&why);
                        },
                    )?;
                    let out = ProposeResponse {
                        run: Some(refused),
                        auto_approved_by: String::new(),
                        created: true,
                    };
                    return Ok((out, s));
                }
                // Delegation (the parent's approval covers a child spending
                // inside the parent's budget) or a permitting policy
                // approves at once, in its own name: (actor, why, detail,
                // answer). A run that asked for review (skip_policies), or
                // that a policy says needs people, gets review.
                let automatic = match &decision.verdict {
                    _ if req.skip_policies => None,
                    switchyard_policy::Verdict::Require { .. } => None,
                    _ if !req.approved_under.is_empty() => {
                        let by = format!("delegation:{}", req.approved_under);
                        Some((
                            by.clone(),
                            "delegated by a running, approved run".to_owned(),
                            ("approved_under", req.approved_under.clone()),
                            by,
                        ))
                    }
                    switchyard_policy::Verdict::Permit { by } => {
                        let ids = by.join(",");
                        Some((
                            format!("policy:{ids}"),
                            decision.explain(),
                            ("policy", ids.clone()),
                            ids,
                        ))
                    }
                    _ => None,
                };
                let mut auto = String::new();
                if let Some((by, why, (k, v), answer)) = automatic {
                    let (approved, s) = self.transition(
                        st,
                        &run.run_id,
                        S::Approved,
                        Note::new(&by, "auto_approved", why)
                            .detail(k, v)
                            .detail("policy_version", &decision.version),
                        |_| {},
                    )?;
                    (run, seq, auto) = (approved, s, answer);
                    if let Some((worker, lease)) = &claim {
                        // Claimed in the same change, as `claim` would.
                        let note = Note::new(worker, "claimed", "")
                            .detail("lease_ms", lease)
                            .detail("with_proposal", true);
                        (run, seq) = self.transition(st, &run.run_id, S::Running, note, |r| {
                            r.claimed_by.clone_from(worker);
                            r.claim_expires_at = Some(timestamp(now + lease));
                        })?;
                    }
                }
                let out = ProposeResponse {
                    run: Some(run),
                    auto_approved_by: auto,
                    created: true,
                };
                Ok((out, seq))
            }
        })
        .await
    }

    /// Approve, reject or cancel: a person's decision.
    pub async fn decide(
        &self,
        action: Action,
        run_id: &str,
        comment: &str,
        actor: Option<&str>,
    ) -> Result<Run, ApprovalError> {
        self.decide_with(action, run_id, comment, actor, None, None)
            .await
    }

    /// Approves job run `run_id` up to `scope` (see `ApprovalScope`): its
    /// unset fields take the run's estimate; the run keeps the result.
    pub async fn approve_scoped(
        &self,
        run_id: &str,
        comment: &str,
        actor: Option<&str>,
        scope: ApprovalScope,
    ) -> Result<Run, ApprovalError> {
        let run = self.get(run_id).await?;
        let scope = fill_scope(&run, scope, self.now())?;
        self.decide_with(Action::Approve, run_id, comment, actor, None, Some(scope))
            .await
    }

    /// Approves per-call run `run_id` with the call changed as `edit`
    /// says (the tool, its arguments or both): see `ToolCallEdit`.
    pub async fn approve_edited(
        &self,
        run_id: &str,
        comment: &str,
        actor: Option<&str>,
        mut edit: ToolCallEdit,
    ) -> Result<Run, ApprovalError> {
        let run = self.get(run_id).await?;
        let Some(call) = &run.tool_call else {
            return Err(invalid(
                "edit",
                "only a tool call's run (Run.tool_call) can be approved with an edit",
            ));
        };
        if edit.tool.is_empty() {
            edit.tool.clone_from(&call.tool);
        }
        let mut v = Violations::new();
        if edit.tool.len() > 128
            || !edit
                .tool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            v.add(
                "edit.tool",
                "a tool name: letters, digits, _ - . (at most 128)",
            );
        }
        if !serde_json::from_str::<serde_json::Value>(&edit.arguments).is_ok_and(|a| a.is_object())
        {
            v.add(
                "edit.arguments",
                "the edited arguments are a JSON object, as text",
            );
        }
        v.into_result().map_err(ApprovalError::Invalid)?;
        if edit.tool == call.tool && same_json(&edit.arguments, &call.arguments) {
            // Nothing changed: a plain approval.
            return self.decide(Action::Approve, run_id, comment, actor).await;
        }
        let needed = self.approvals_needed(&run);
        if needed > 1 {
            return Err(invalid(
                "edit",
                format!(
                    "this call needs {needed} approvers, so it cannot be approved with an edit: reject it (the model is told why) instead"
                ),
            ));
        }
        edit.by = actor.unwrap_or_default().to_owned();
        self.decide_with(Action::Approve, run_id, comment, actor, Some(edit), None)
            .await
    }

    async fn decide_with(
        &self,
        action: Action,
        run_id: &str,
        comment: &str,
        actor: Option<&str>,
        edit: Option<ToolCallEdit>,
        scope: Option<ApprovalScope>,
    ) -> Result<Run, ApprovalError> {
        let now = self.now();
        self.mutate(&[run_id], |st| {
            let Some(run) = st.runs.get(run_id) else {
                return Err(ApprovalError::RunNotFound(run_id.to_owned()));
            };
            let run = run.into_owned();
            let actor = authorize(action, actor, &run)?;
            let (to, event) = match action {
                Action::Approve => (S::Approved, "approved"),
                Action::Reject => (S::Rejected, "rejected"),
                _ => (S::Cancelled, "cancelled"),
            };
            let from = status_of(&run);
            table::check_by_person(from, to).map_err(|refused| ApprovalError::Transition {
                run_id: run_id.to_owned(),
                refused,
            })?;
            let needed = if action == Action::Approve && from == S::Proposed {
                self.approvals_needed(&run)
            } else {
                1
            };
            if needed > 1 && run.approved_by.contains(&actor) {
                return Err(ApprovalError::SecondApproval {
                    run_id: run_id.to_owned(),
                    actor,
                });
            }
            if run.approved_by.len() + 1 < needed {
                // Not the last of the approvals needed: recorded, the run
                // stays proposed.
                self.record_approval(st, run_id, &actor, comment)
            } else {
                let reapproval = action == Action::Approve && from == S::Failed;
                let mut note = Note::new(&actor, event, comment);
                if let Some(e) = &edit {
                    note = note
                        .detail("edited_tool", &e.tool)
                        .detail("edited_arguments", &e.arguments);
                }
                if let Some(s) = &scope {
                    note = note
                        .detail("scope_tokens", s.tokens.to_string())
                        .detail(
                            "scope_cost_micro_usd",
                            s.cost.map_or(0, |m| m.micro_usd).to_string(),
                        )
                        .detail(
                            "scope_until",
                            s.until.map(|t| t.to_string()).unwrap_or_default(),
                        );
                }
                self.transition(st, run_id, to, note, |r| {
                    if action == Action::Approve {
                        r.approved_by.push(actor.clone());
                        r.edit.clone_from(&edit);
                        r.scope = scope;
                    }
                    if reapproval {
                        // A person gives a failed run another attempt.
                        r.next_attempt_at = Some(timestamp(now));
                    }
                })
            }
        })
        .await
    }

    /// How many distinct people must approve `run`: what the policies
    /// decided at proposal (kept on the run), and two when the two-person
    /// rule applies (the estimated cost is above the threshold, or unknown).
    fn approvals_needed(&self, run: &Run) -> usize {
        let two = self
            .inner
            .cfg
            .two_person_above_micro_usd
            .is_some_and(|limit| {
                run.cost_estimate
                    .as_ref()
                    .and_then(|e| e.estimated_cost.as_ref())
                    .is_none_or(|m| m.micro_usd > limit)
            });
        let by_policy = run.policy.as_ref().map_or(1, |p| p.approvals_required);
        (by_policy.max(1) as usize).max(if two { 2 } else { 1 })
    }

    /// What the policy set decides about `run` (proposed by a party of
    /// `kind`, under `approved_under` when delegated, its budget having
    /// `left`), recorded on the run: the verdict, the policies, the set's
    /// version and the approvals it needs. A budget extension is a person's
    /// decision alone: no policy is asked.
    fn policy_decision(
        &self,
        st: &State,
        run: &mut Run,
        approved_under: &str,
        left: Option<switchyard_policy::Remaining>,
        kind: switchyard_policy::PrincipalKind,
        now: u64,
    ) -> switchyard_policy::Decision {
        let delegated = !approved_under.is_empty();
        let depth = if delegated {
            st.runs
                .get(approved_under)
                .and_then(|p| p.policy.as_ref().map(|d| d.delegation_depth))
                .unwrap_or(0)
                + 1
        } else {
            0
        };
        let engine = self.inner.policies.get();
        let mut facts = switchyard_policy::run_facts(run, kind, delegated, depth, now);
        facts.remaining = left.unwrap_or_default();
        let decision = if run.extension.is_some() {
            switchyard_policy::Decision {
                verdict: switchyard_policy::Verdict::Default,
                version: engine.current().version().to_owned(),
                errors: Vec::new(),
            }
        } else {
            engine.decide(&facts)
        };
        let mut record = switchyard_policy::record(&decision, &facts);
        if run.extension.is_some() {
            // No policy decides an extension: no action was put to them.
            record.action.clear();
            record.resource.clear();
        }
        run.policy = Some(record);
        let needed = self.approvals_needed(run) as u32;
        if let Some(p) = run.policy.as_mut() {
            p.approvals_required = needed;
        }
        decision
    }

    /// An approval short of the number needed: recorded on the run and audited; the run
    /// stays proposed.
    fn record_approval(
        &self,
        st: &mut State,
        run_id: &str,
        actor: &str,
        comment: &str,
    ) -> Result<(Run, u64), ApprovalError> {
        let Some(current) = st.runs.get(run_id) else {
            return Err(ApprovalError::RunNotFound(run_id.to_owned()));
        };
        let mut run = current.into_owned();
        run.approved_by.push(actor.to_owned());
        let note = Note::new(actor, "approval_recorded", comment)
            .detail("approvals", run.approved_by.len())
            .detail("needed", 2);
        let seq = self.audit(st, &mut run, note)?;
        Ok((run, seq))
    }

    /// The audited override: `actor` (an admin) approves without approver,
    /// separation of duties or second approver, for `reason`.
    pub async fn break_glass(
        &self,
        run_id: &str,
        reason: &str,
        actor: &str,
    ) -> Result<Run, ApprovalError> {
        if reason.trim().chars().count() < 10 {
            return Err(invalid(
                "reason",
                "a break-glass approval needs a reason of at least 10 characters; it is kept in the audit log",
            ));
        }
        let now = self.now();
        let run = self
            .mutate(&[run_id], |st| {
                let Some(run) = st.runs.get(run_id) else {
                    return Err(ApprovalError::RunNotFound(run_id.to_owned()));
                };
                let from = status_of(&run);
                table::check_by_person(from, S::Approved).map_err(|refused| {
                    ApprovalError::Transition {
                        run_id: run_id.to_owned(),
                        refused,
                    }
                })?;
                let note =
                    Note::new(actor, "break_glass_approved", reason).detail("break_glass", true);
                self.transition(st, run_id, S::Approved, note, |r| {
                    r.approved_by.push(actor.to_owned());
                    if from == S::Failed {
                        r.next_attempt_at = Some(timestamp(now));
                    }
                })
            })
            .await?;
        tracing::warn!(run_id, actor, reason, "break-glass approval");
        Ok(run)
    }

    /// Claims an approved run for `worker` under a lease.
    pub async fn claim(&self, req: ClaimRequest) -> Result<Run, ApprovalError> {
        let lease = self.lease_ms("", &req.worker_id, req.lease_secs)?;
        let now = self.now();
        self.mutate(&[&req.run_id], |st| {
            let Some(run) = st.runs.get(&req.run_id) else {
                return Err(ApprovalError::RunNotFound(req.run_id.clone()));
            };
            let due = run.next_attempt_at.as_ref().map_or(0, timestamp_ms);
            if status_of(&run) == S::Approved && due > now {
                return Err(ApprovalError::NotDue {
                    run_id: req.run_id.clone(),
                    next_attempt_ms: due,
                });
            }
            let note = Note::new(&req.worker_id, "claimed", "").detail("lease_ms", lease);
            self.transition(st, &req.run_id, S::Running, note, |r| {
                r.claimed_by.clone_from(&req.worker_id);
                r.claim_expires_at = Some(timestamp(now + lease));
            })
        })
        .await
    }

    /// A claim's lease in ms, checked with its worker id; `at` prefixes the
    /// fields' names (`claim.` inside a proposal).
    fn lease_ms(&self, at: &str, worker: &str, lease_secs: u32) -> Result<u64, ApprovalError> {
        let mut v = Violations::new();
        v.check(
            format!("{at}worker_id"),
            switchyard_core::validate::key(worker, "worker id"),
        );
        if lease_secs > self.inner.cfg.max_lease_secs {
            v.add(
                format!("{at}lease_secs"),
                format!("must be at most {}", self.inner.cfg.max_lease_secs),
            );
        }
        v.into_result().map_err(ApprovalError::Invalid)?;
        let secs = if lease_secs == 0 {
            self.inner.cfg.default_lease_secs
        } else {
            lease_secs
        };
        Ok(u64::from(secs) * 1000)
    }

    /// Extends the caller's claim.
    pub async fn renew(&self, req: RenewClaimRequest) -> Result<Run, ApprovalError> {
        let lease = self.lease_ms("", &req.worker_id, req.lease_secs)?;
        let now = self.now();
        self.mutate(&[&req.run_id], |st| {
            let Some(run) = st.runs.get_mut(&req.run_id) else {
                return Err(ApprovalError::RunNotFound(req.run_id.clone()));
            };
            claim_held(run, &req.worker_id, now)?;
            run.claim_expires_at = Some(timestamp(now + lease));
            let mut run = run.clone();
            let note = Note::new(&req.worker_id, "claim_renewed", "").detail("lease_ms", lease);
            let seq = self.audit(
                st,
                &mut run,
                Note {
                    from: Some(S::Running),
                    ..note
                },
            )?;
            Ok((run, seq))
        })
        .await
    }

    /// Completes the caller's run with its result.
    pub async fn complete(&self, req: CompleteRequest) -> Result<Run, ApprovalError> {
        let now = self.now();
        self.mutate(&[&req.run_id], |st| {
            let Some(run) = st.runs.get(&req.run_id) else {
                return Err(ApprovalError::RunNotFound(req.run_id.clone()));
            };
            claim_held(&run, &req.worker_id, now)?;
            let note = Note::new(&req.worker_id, "completed", "");
            self.transition(st, &req.run_id, S::Completed, note, |r| {
                r.result.clone_from(&req.result);
            })
        })
        .await
    }

    /// Fails the caller's run: a retry while retries remain, else `failed`.
    pub async fn fail(&self, req: FailRequest) -> Result<Run, ApprovalError> {
        let now = self.now();
        self.mutate(&[&req.run_id], |st| {
            let Some(run) = st.runs.get(&req.run_id) else {
                return Err(ApprovalError::RunNotFound(req.run_id.clone()));
            };
            claim_held(&run, &req.worker_id, now)?;
            self.fail_locked(
                st,
                &req.run_id,
                &req.worker_id,
                &req.last_error,
                req.retryable,
                now,
            )
        })
        .await
    }

    fn fail_locked(
        &self,
        st: &mut State,
        run_id: &str,
        actor: &str,
        error: &str,
        retryable: bool,
        now: u64,
    ) -> Result<(Run, u64), ApprovalError> {
        let run = st
            .runs
            .get(run_id)
            .ok_or_else(|| ApprovalError::RunNotFound(run_id.to_owned()))?
            .into_owned();
        let max = run
            .max_retries
            .unwrap_or(self.inner.cfg.default_max_retries);
        let error = error.to_owned();
        if retryable && run.retry_count < max {
            let n = run.retry_count + 1;
            let at = now + self.inner.cfg.backoff_ms(n);
            let note = Note::new(actor, "retry_scheduled", error.clone())
                .detail("retry_count", n)
                .detail("next_attempt_at_ms", at);
            self.transition(st, run_id, S::Approved, note, |r| {
                r.retry_count = n;
                r.next_attempt_at = Some(timestamp(at));
                r.last_error = error;
            })
        } else {
            let why = if retryable {
                "retries exhausted"
            } else {
                "not retryable"
            };
            let note = Note::new(actor, "failed", error.clone()).detail("why", why);
            self.transition(st, run_id, S::Failed, note, |r| r.last_error = error)
        }
    }

    /// Treats every claim past its lease as a retryable failure; returns how
    /// many runs it moved. On PostgreSQL only the replica holding the
    /// sweeper lease sweeps, and each run is re-checked under its row lock.
    pub async fn sweep(&self) -> Result<usize, ApprovalError> {
        let now = self.now();
        // Among replicas, one sweeps for all (each run is re-checked under
        // its row lock regardless).
        let ttl = self
            .inner
            .cfg
            .sweep_interval_ms
            .saturating_mul(3)
            .max(1_000);
        if !self
            .inner
            .backend
            .elected("approval.sweeper", now, ttl)
            .await?
        {
            return Ok(0);
        }
        let expired = self.inner.backend.expired_claims(now).await?;
        let mut n = 0;
        for (id, worker) in &expired {
            let error = format!("claim of worker {worker:?} expired");
            let moved = self
                .mutate(&[id], |st| {
                    // Still running past its lease, now that it is locked?
                    let due = st.runs.get(id).is_some_and(|r| {
                        status_of(&r) == S::Running
                            && r.claim_expires_at.as_ref().map_or(0, timestamp_ms) <= now
                    });
                    if !due {
                        return Ok((false, self.audited_so_far()));
                    }
                    let (_, seq) = self.fail_locked(st, id, "system:lease", &error, true, now)?;
                    Ok((true, seq))
                })
                .await?;
            n += usize::from(moved);
        }
        Ok(n)
    }

    /// Returns one run.
    pub async fn get(&self, run_id: &str) -> Result<Run, ApprovalError> {
        self.inner
            .backend
            .get(run_id)
            .await?
            .ok_or_else(|| ApprovalError::RunNotFound(run_id.to_owned()))
    }

    /// Lists runs: filtered, proposed first, then by creation time.
    pub async fn list(&self, req: &ListRunsRequest) -> Result<ListRunsResponse, ApprovalError> {
        let mut statuses = Vec::new();
        for (i, s) in req.statuses.iter().enumerate() {
            match from_proto(*s) {
                Some(s) => statuses.push(s),
                None => return Err(invalid(&format!("statuses[{i}]"), "unknown status")),
            }
        }
        let size = switchyard_core::validate::page_size(req.page_size);
        self.inner.backend.list(req, &statuses, size).await
    }

    /// The durable audit log, of one run or all, after a sequence.
    pub async fn list_audit(
        &self,
        req: &ListAuditRequest,
    ) -> Result<ListAuditResponse, ApprovalError> {
        let size = switchyard_core::validate::page_size(req.page_size);
        self.inner.backend.list_audit(req, size).await
    }

    /// VerifyAudit: the audit of every run `p` may see (or of `run_id`
    /// alone), checked as stored — each run's chain, its stored head, an
    /// ended run's seal under the service's key.
    pub async fn verify_audit(
        &self,
        p: &Principal,
        run_id: &str,
    ) -> Result<VerifyAuditResponse, ApprovalError> {
        if !run_id.is_empty() {
            self.check_visible(p, run_id).await?;
        }
        let snapshot = self.inner.backend.audit_snapshot(run_id).await?;
        // The current key and every retired one: seals made before a
        // rotation still verify.
        let mut trusted = vec![self.inner.receipts.public_key()];
        trusted.extend(
            self.inner
                .cfg
                .previous_receipt_public_keys
                .iter()
                .map(|k| k.trim().to_owned()),
        );
        let mut out = VerifyAuditResponse {
            key_id: self.inner.receipts.id().to_owned(),
            trusted_key_ids: trusted
                .iter()
                .filter_map(|k| switchyard_kit::receipt::key_id_of(k))
                .collect(),
            ..Default::default()
        };
        for (run, recs) in snapshot.iter().filter(|(r, _)| visible(p, r)) {
            let c = chain::check_run(run, recs, &trusted);
            out.runs += 1;
            out.records += c.records;
            out.unlinked += c.unlinked;
            out.sealed += u64::from(c.sealed);
            if let Some(problem) = c.problem {
                out.problems.push(AuditProblem {
                    run_id: run.run_id.clone(),
                    problem,
                });
            }
        }
        Ok(out)
    }

    /// The deterministic prompt bundle of an approved run.
    pub async fn export(
        &self,
        run_id: &str,
        actor: Option<&str>,
    ) -> Result<ExportPromptBundleResponse, ApprovalError> {
        let bundle = self
            .mutate(&[run_id], |st| {
                let mut run = st
                    .runs
                    .get(run_id)
                    .map(Cow::into_owned)
                    .ok_or_else(|| ApprovalError::RunNotFound(run_id.to_owned()))?;
                let actor = authorize(Action::Export, actor, &run)?;
                if matches!(status_of(&run), S::Proposed | S::Rejected | S::Cancelled) {
                    return Err(ApprovalError::ApprovalRequired {
                        run_id: run_id.to_owned(),
                        status: status_of(&run),
                    });
                }
                let bundle = bundle::render(&run);
                let note = Note::new(&actor, "prompt_bundle_exported", "")
                    .detail("bundle_sha256", bundle::sha256_hex(&bundle))
                    .detail(
                        "context_hash",
                        run.context_pack
                            .as_ref()
                            .map(|p| p.hash.as_str())
                            .unwrap_or(""),
                    );
                let seq = self.audit_in_place(st, &mut run, note)?;
                Ok((bundle, seq))
            })
            .await?;
        Ok(ExportPromptBundleResponse {
            bundle,
            content_type: bundle::CONTENT_TYPE.into(),
        })
    }

    /// Completes an approved run with a result pasted back from manual mode:
    /// approved → running (claimed by the importer) → completed.
    pub async fn import(
        &self,
        req: ImportManualResultRequest,
        actor: Option<&str>,
    ) -> Result<Run, ApprovalError> {
        let mut v = Violations::new();
        if req.content.trim().is_empty() {
            v.add("content", "content is required");
        }
        if req.context_hash.is_empty() {
            v.add(
                "context_hash",
                "context_hash is required: copy it from the prompt bundle",
            );
        }
        v.into_result().map_err(ApprovalError::Invalid)?;
        let now = self.now();
        // The artifacts are checked, and their content stored, before the
        // run is locked (content-addressed: an import that then fails
        // leaves only bytes nothing refers to).
        let before = self.get(&req.run_id).await?;
        authorize(Action::Import, actor, &before)?;
        let kept = match self.manual_result(&before, &req).await {
            Ok(result) => Ok(result),
            Err(ApprovalError::ArtifactRefused(r)) => Err(r),
            Err(e) => return Err(e),
        };
        // Imported, or refused (the refusal is audited too).
        let outcome = self
            .mutate(&[&req.run_id], |st| {
                let mut run = st
                    .runs
                    .get(&req.run_id)
                    .map(Cow::into_owned)
                    .ok_or_else(|| ApprovalError::RunNotFound(req.run_id.clone()))?;
                let actor = authorize(Action::Import, actor, &run)?;
                let expected = run
                    .context_pack
                    .as_ref()
                    .map(|p| p.hash.clone())
                    .unwrap_or_default();
                if expected != req.context_hash {
                    return Err(ApprovalError::ContextHashMismatch {
                        run_id: req.run_id.clone(),
                        expected,
                        got: req.context_hash.clone(),
                    });
                }
                let result = match &kept {
                    Ok(r) => r.clone(),
                    Err(r) => {
                        let note = Note::new(&actor, "artifact_refused", r.reason.as_str())
                            .detail("message", &r.message);
                        let from = Some(status_of(&run));
                        let seq = self.audit(st, &mut run, Note { from, ..note })?;
                        return Ok((Err(r.clone()), seq));
                    }
                };
                // Handed to the manual adapter already (running), or not yet.
                let handed =
                    status_of(&run) == S::Running && run.claimed_by == dispatch::worker("manual");
                if !handed {
                    let claim = Note::new(&actor, "claimed", "manual mode");
                    self.transition(st, &req.run_id, S::Running, claim, |r| {
                        r.claimed_by.clone_from(&actor);
                        r.claim_expires_at = Some(timestamp(now));
                    })?;
                }
                let done = Note::new(&actor, "manual_result_imported", "")
                    .detail("content_bytes", req.content.len())
                    .detail("artifacts", result.artifact_paths.join(","));
                let (run, seq) = self.transition(st, &req.run_id, S::Completed, done, |r| {
                    r.result = Some(result.clone());
                })?;
                Ok((Ok(run), seq))
            })
            .await?;
        outcome.map_err(ApprovalError::ArtifactRefused)
    }

    /// Approve, reject or cancel as asked over gRPC, by the authenticated
    /// principal: another tenant's run (or, for a submitter, someone else's)
    /// is not found; deciding needs `run.decide` even when called in-process.
    async fn decide_request<T>(
        &self,
        action: Action,
        req: Request<T>,
        fields: impl FnOnce(T) -> (String, String, Option<ToolCallEdit>, Option<ApprovalScope>),
    ) -> Result<Run, Status> {
        let p = principal(&req)?;
        if action != Action::Cancel {
            p.require(Permission::RunDecide)?;
        }
        let (run_id, comment, edit, scope) = fields(req.into_inner());
        self.check_visible(&p, &run_id).await?;
        // Services never hold run.decide, so an approver's name is always
        // their own subject and separation of duties compares like with like.
        let actor = audit_name(&p);
        Ok(match (edit, scope) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "scope",
                    "a scope is for a job's run and an edit for a tool call's: give one",
                )
                .into());
            }
            (Some(edit), None) => {
                self.approve_edited(&run_id, &comment, Some(&actor), edit)
                    .await?
            }
            (None, Some(scope)) => {
                self.approve_scoped(&run_id, &comment, Some(&actor), scope)
                    .await?
            }
            (None, None) => self.decide(action, &run_id, &comment, Some(&actor)).await?,
        })
    }

    /// The run `run_id` if `p` may see it, else RUN_NOT_FOUND.
    async fn visible_run(&self, p: &Principal, run_id: &str) -> Result<Run, ApprovalError> {
        match self.get(run_id).await {
            Ok(r) if visible(p, &r) => Ok(r),
            Ok(_) | Err(ApprovalError::RunNotFound(_)) => {
                Err(ApprovalError::RunNotFound(run_id.to_owned()))
            }
            Err(e) => Err(e),
        }
    }

    /// RUN_NOT_FOUND unless `p` may see run `run_id`.
    async fn check_visible(&self, p: &Principal, run_id: &str) -> Result<(), ApprovalError> {
        let seen = self
            .inner
            .backend
            .with_run(run_id, |r| visible(p, r))
            .await?;
        if seen == Some(true) {
            Ok(())
        } else {
            Err(ApprovalError::RunNotFound(run_id.to_owned()))
        }
    }

    /// Binds a proposal to its proposer: `created_by` and `tenant` come from
    /// the principal; a body naming someone else is refused.
    async fn bind_proposal(
        &self,
        p: &Principal,
        req: &mut ProposeRequest,
    ) -> Result<(), ApprovalError> {
        let me = p.acting_subject().to_owned();
        let tenant = p.tenant_scope().unwrap_or_default().to_owned();
        if let Some(run) = req.run.as_mut() {
            if !run.created_by.is_empty() && run.created_by != me {
                return Err(invalid(
                    "run.created_by",
                    format!("created_by is your authenticated identity ({me:?}); leave it empty"),
                ));
            }
            if tenant.is_empty() {
                return Err(invalid(
                    "run.tenant",
                    "a run belongs to a tenant: a service proposes on behalf of a user",
                ));
            }
            if !run.tenant.is_empty() && run.tenant != tenant {
                return Err(invalid(
                    "run.tenant",
                    format!(
                        "runs are proposed in your own tenant ({tenant:?}); leave tenant empty"
                    ),
                ));
            }
            if run.tool_call.is_some() && p.on_behalf_of.is_none() {
                return Err(invalid(
                    "run.tool_call",
                    "per-call runs are proposed by the executor for a tool call awaiting approval; leave tool_call empty",
                ));
            }
            if run.extension.is_some() && p.on_behalf_of.is_none() {
                return Err(invalid(
                    "run.extension",
                    "budget-extension runs are proposed by the executor for a budget-paused job; leave extension empty",
                ));
            }
            run.created_by = me;
            run.tenant = tenant;
            // An edit and a scope are decisions, never part of a proposal.
            run.edit = None;
            run.scope = None;
        }
        if !req.approved_under.is_empty() {
            // Which run covers a child is a fact the platform establishes
            // (the executor, having bound the child to its parent job),
            // never a claim a client makes.
            if p.kind != Kind::Service || p.on_behalf_of.is_none() {
                return Err(invalid(
                    "approved_under",
                    "approved_under is set by the executor for a delegated child job; leave it empty (submit the child job with delegation.parent_job_id instead)",
                ));
            }
            self.check_visible(p, &req.approved_under).await?;
        }
        if req.budget_left.is_some() && (p.kind != Kind::Service || p.on_behalf_of.is_none()) {
            // What a budget has left is the platform's to say: a proposer
            // naming its own would choose what the policies see.
            return Err(invalid(
                "budget_left",
                "budget_left is set by the executor for a job's run; leave it empty",
            ));
        }
        Ok(())
    }

    /// The run of a worker request, when `p` may see it.
    async fn worker_check<T>(&self, req: &Request<T>, run_id: &str) -> Result<(), Status> {
        let p = principal(req)?;
        self.check_visible(&p, run_id).await?;
        Ok(())
    }

    async fn watch_stream(
        &self,
        req: WatchRequest,
        p: std::sync::Arc<Principal>,
    ) -> Result<
        futures_util::stream::BoxStream<'static, Result<WatchResponse, Status>>,
        ApprovalError,
    > {
        if !req.run_id.is_empty() {
            self.get(&req.run_id).await?;
        }
        let records = self.inner.backend.tail(req.after_sequence);
        let me = self.clone();
        let shutdown = self.inner.shutdown.clone();
        let stream = records
            .take_until(async move { shutdown.wait().await })
            .filter_map(move |r| {
                let (me, p, only) = (me.clone(), p.clone(), req.run_id.clone());
                async move {
                    let rec = match r {
                        Err(e) => return Some(Err(Status::from(ApprovalError::Storage(e)))),
                        Ok(rec) => rec,
                    };
                    if !only.is_empty() && rec.run_id != only {
                        return None;
                    }
                    let run = match me.visible_run(&p, &rec.run_id).await {
                        Ok(run) => run,
                        Err(ApprovalError::RunNotFound(_)) => return None,
                        Err(e) => return Some(Err(Status::from(e))),
                    };
                    Some(Ok(WatchResponse {
                        event: Some(Event {
                            sequence: rec.sequence,
                            time: rec.time,
                            correlation_id: rec.correlation_id.clone(),
                            kind: format!("run.{}", rec.event_type),
                            data: switchyard_kit::json::json_to_struct(&serde_json::json!({
                                "run_id": rec.run_id,
                                "actor": rec.actor,
                                "reason": rec.reason,
                            })),
                            ..Default::default()
                        }),
                        run: Some(run),
                    }))
                }
            });
        Ok(Box::pin(stream))
    }
}

#[tonic::async_trait]
impl ApprovalService for Approval {
    async fn propose(
        &self,
        req: Request<ProposeRequest>,
    ) -> Result<Response<ProposeResponse>, Status> {
        let p = principal(&req)?;
        let mut r = req.into_inner();
        if r.claim.is_some() {
            // Claiming with the proposal is claiming: the same permission.
            p.require(Permission::RunWork)?;
        }
        self.bind_proposal(&p, &mut r).await?;
        let kind = p.on_behalf_of.as_ref().map_or(p.kind, |o| o.kind);
        // The audit log names the user and, for a service acting for them,
        // the service too.
        Ok(Response::new(
            Approval::propose_by(self, r, Some(audit_name(&p)), policy_kind(kind)).await?,
        ))
    }

    async fn approve(
        &self,
        req: Request<ApproveRequest>,
    ) -> Result<Response<ApproveResponse>, Status> {
        let run = self
            .decide_request(Action::Approve, req, |r| {
                (r.run_id, r.comment, r.edit, r.scope)
            })
            .await?;
        Ok(Response::new(ApproveResponse { run: Some(run) }))
    }

    async fn break_glass_approve(
        &self,
        req: Request<BreakGlassApproveRequest>,
    ) -> Result<Response<BreakGlassApproveResponse>, Status> {
        let p = principal(&req)?;
        p.require(Permission::RunBreakGlass)?;
        let r = req.get_ref();
        self.check_visible(&p, &r.run_id).await?;
        let run = self
            .break_glass(&r.run_id, &r.reason, p.acting_subject())
            .await?;
        Ok(Response::new(BreakGlassApproveResponse { run: Some(run) }))
    }

    async fn reject(
        &self,
        req: Request<RejectRequest>,
    ) -> Result<Response<RejectResponse>, Status> {
        let run = self
            .decide_request(Action::Reject, req, |r| (r.run_id, r.comment, None, None))
            .await?;
        Ok(Response::new(RejectResponse { run: Some(run) }))
    }

    async fn cancel(
        &self,
        req: Request<CancelRequest>,
    ) -> Result<Response<CancelResponse>, Status> {
        // Handed to an adapter: stopped there first (what it answers is
        // kept on the run), then cancelled here.
        let p = principal(&req)?;
        if let Ok(before) = self.visible_run(&p, &req.get_ref().run_id).await {
            self.cancel_at_adapter(&before).await;
        }
        let run = self
            .decide_request(Action::Cancel, req, |r| (r.run_id, r.comment, None, None))
            .await?;
        Ok(Response::new(CancelResponse { run: Some(run) }))
    }

    async fn list_run_artifacts(
        &self,
        req: Request<ListRunArtifactsRequest>,
    ) -> Result<Response<ListRunArtifactsResponse>, Status> {
        let p = principal(&req)?;
        let run = self.visible_run(&p, &req.get_ref().run_id).await?;
        let artifacts = run.result.map(|r| r.artifacts).unwrap_or_default();
        Ok(Response::new(ListRunArtifactsResponse { artifacts }))
    }

    async fn get_run_artifact(
        &self,
        req: Request<GetRunArtifactRequest>,
    ) -> Result<Response<GetRunArtifactResponse>, Status> {
        let p = principal(&req)?;
        let run = self.visible_run(&p, &req.get_ref().run_id).await?;
        let (artifact, content) = self.run_artifact(&run, &req.get_ref().path).await?;
        Ok(Response::new(GetRunArtifactResponse {
            artifact: Some(artifact),
            content,
        }))
    }

    async fn get_run(
        &self,
        req: Request<GetRunRequest>,
    ) -> Result<Response<GetRunResponse>, Status> {
        let p = principal(&req)?;
        let run = self.visible_run(&p, &req.get_ref().run_id).await?;
        Ok(Response::new(GetRunResponse { run: Some(run) }))
    }

    async fn list_runs(
        &self,
        req: Request<ListRunsRequest>,
    ) -> Result<Response<ListRunsResponse>, Status> {
        let p = principal(&req)?;
        let mut out = self.list(req.get_ref()).await?;
        out.runs.retain(|r| visible(&p, r));
        Ok(Response::new(out))
    }

    async fn claim(&self, req: Request<ClaimRequest>) -> Result<Response<ClaimResponse>, Status> {
        self.worker_check(&req, &req.get_ref().run_id).await?;
        let run = Approval::claim(self, req.into_inner()).await?;
        Ok(Response::new(ClaimResponse { run: Some(run) }))
    }

    async fn renew_claim(
        &self,
        req: Request<RenewClaimRequest>,
    ) -> Result<Response<RenewClaimResponse>, Status> {
        self.worker_check(&req, &req.get_ref().run_id).await?;
        let run = self.renew(req.into_inner()).await?;
        Ok(Response::new(RenewClaimResponse { run: Some(run) }))
    }

    async fn complete(
        &self,
        req: Request<CompleteRequest>,
    ) -> Result<Response<CompleteResponse>, Status> {
        self.worker_check(&req, &req.get_ref().run_id).await?;
        let from_service = principal(&req)?.kind == Kind::Service;
        let mut req = req.into_inner();
        // A run's artifacts are what the platform stored for it (fetched
        // from its adapter, imported, or the executor's own job's), never
        // another worker's claim: an artifact id names content by address,
        // and naming another run's would serve it under this one.
        if !from_service && let Some(result) = req.result.as_mut() {
            result.artifacts.clear();
        }
        let run = Approval::complete(self, req).await?;
        Ok(Response::new(CompleteResponse { run: Some(run) }))
    }

    async fn fail(&self, req: Request<FailRequest>) -> Result<Response<FailResponse>, Status> {
        self.worker_check(&req, &req.get_ref().run_id).await?;
        let run = Approval::fail(self, req.into_inner()).await?;
        Ok(Response::new(FailResponse { run: Some(run) }))
    }

    async fn get_receipt(
        &self,
        req: Request<GetReceiptRequest>,
    ) -> Result<Response<GetReceiptResponse>, Status> {
        let p = principal(&req)?;
        let run_id = &req.get_ref().run_id;
        self.check_visible(&p, run_id).await?;
        let receipt_json = self.receipt(run_id).await?;
        let (key_id, public_key) = self.receipt_key();
        Ok(Response::new(GetReceiptResponse {
            receipt_json,
            key_id,
            public_key,
        }))
    }

    async fn put_policy(
        &self,
        req: Request<PutPolicyRequest>,
    ) -> Result<Response<PutPolicyResponse>, Status> {
        let p = principal(&req)?;
        p.require(Permission::PolicyManage)?;
        let r = req.into_inner();
        let (policy, version) =
            Approval::put_policy(self, &r.name, &r.text, &audit_name(&p)).await?;
        Ok(Response::new(PutPolicyResponse {
            policy: Some(policy),
            version,
        }))
    }

    async fn delete_policy(
        &self,
        req: Request<DeletePolicyRequest>,
    ) -> Result<Response<DeletePolicyResponse>, Status> {
        let p = principal(&req)?;
        p.require(Permission::PolicyManage)?;
        let version = Approval::delete_policy(self, &req.get_ref().name, &audit_name(&p)).await?;
        Ok(Response::new(DeletePolicyResponse { version }))
    }

    async fn list_policies(
        &self,
        req: Request<ListPoliciesRequest>,
    ) -> Result<Response<ListPoliciesResponse>, Status> {
        let p = principal(&req)?;
        p.require(Permission::PolicyManage)?;
        Ok(Response::new(ListPoliciesResponse {
            policies: self.stored_policies().await?,
        }))
    }

    async fn list_audit(
        &self,
        req: Request<ListAuditRequest>,
    ) -> Result<Response<ListAuditResponse>, Status> {
        let p = principal(&req)?;
        if !req.get_ref().run_id.is_empty() {
            self.check_visible(&p, &req.get_ref().run_id).await?;
        }
        let mut out = Approval::list_audit(self, req.get_ref()).await?;
        let mut seen: HashMap<String, bool> = HashMap::new();
        let mut kept = Vec::with_capacity(out.records.len());
        for rec in out.records {
            let ok = match seen.get(&rec.run_id) {
                Some(ok) => *ok,
                None => {
                    let ok = self.check_visible(&p, &rec.run_id).await.is_ok();
                    seen.insert(rec.run_id.clone(), ok);
                    ok
                }
            };
            if ok {
                kept.push(rec);
            }
        }
        out.records = kept;
        Ok(Response::new(out))
    }

    async fn verify_audit(
        &self,
        req: Request<VerifyAuditRequest>,
    ) -> Result<Response<VerifyAuditResponse>, Status> {
        let p = principal(&req)?;
        let out = Approval::verify_audit(self, &p, &req.get_ref().run_id).await?;
        Ok(Response::new(out))
    }

    async fn export_prompt_bundle(
        &self,
        req: Request<ExportPromptBundleRequest>,
    ) -> Result<Response<ExportPromptBundleResponse>, Status> {
        let p = principal(&req)?;
        self.check_visible(&p, &req.get_ref().run_id).await?;
        Ok(Response::new(
            self.export(&req.into_inner().run_id, Some(p.acting_subject()))
                .await?,
        ))
    }

    async fn import_manual_result(
        &self,
        req: Request<ImportManualResultRequest>,
    ) -> Result<Response<ImportManualResultResponse>, Status> {
        let p = principal(&req)?;
        self.check_visible(&p, &req.get_ref().run_id).await?;
        let run = self
            .import(req.into_inner(), Some(p.acting_subject()))
            .await?;
        Ok(Response::new(ImportManualResultResponse { run: Some(run) }))
    }

    type WatchStream = futures_util::stream::BoxStream<'static, Result<WatchResponse, Status>>;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let p = principal(&req)?;
        if !req.get_ref().run_id.is_empty() {
            self.check_visible(&p, &req.get_ref().run_id).await?;
        }
        Ok(Response::new(self.watch_stream(req.into_inner(), p).await?))
    }
}

#[cfg(test)]
mod tests;

use switchyard_core::money;

/// `scope` for job run `run` with its unset fields taken from the run's
/// estimate, or why it cannot be granted.
fn fill_scope(run: &Run, scope: ApprovalScope, now: u64) -> Result<ApprovalScope, ApprovalError> {
    if let Some(x) = &run.extension {
        // An extension granted in another amount than asked.
        let mut v = Violations::new();
        if scope.until.is_some() {
            v.add(
                "scope.until",
                "an extension's scope is its amounts: the hold it places stands as long as a hold may",
            );
        }
        let cost = scope.cost.or(x.cost);
        let tokens = if scope.tokens == 0 {
            x.tokens
        } else {
            scope.tokens
        };
        if tokens > 1_000_000_000_000 {
            v.add("scope.tokens", "must be at most 10^12");
        }
        if tokens == 0 && cost.is_none_or(|m| m.micro_usd == 0) {
            v.add("scope", "grants nothing: give tokens or money to add");
        }
        v.into_result().map_err(ApprovalError::Invalid)?;
        return Ok(ApprovalScope {
            tokens,
            cost,
            until: None,
        });
    }
    if run.adapter != "switchyard" || run.job_id.is_empty() {
        return Err(invalid(
            "scope",
            "only a job's run (adapter switchyard) or a budget extension is approved up to a scope: the hold is placed on the job's budget",
        ));
    }
    let est = run.cost_estimate.unwrap_or_default();
    let mut v = Violations::new();
    let tokens = match scope.tokens {
        0 => est
            .estimated_input_tokens
            .saturating_add(est.estimated_output_tokens),
        n => n,
    };
    v.check("scope.tokens", money::check_tokens(tokens, "scope.tokens"));
    let cost = scope.cost.or(est.estimated_cost);
    match cost {
        None => v.add(
            "scope.cost",
            "the run has no priced estimate: give the amount to approve (e.g. --up-to 0.50)",
        ),
        Some(m) => v.check(
            "scope.cost",
            money::check_micro_usd(m.micro_usd, "scope.cost"),
        ),
    }
    let until = match scope.until {
        None => now + money::MAX_HOLD_MS,
        Some(t) => {
            let ms = switchyard_kit::time::timestamp_ms(&t);
            if ms <= now {
                v.add("scope.until", "must be in the future");
            } else if ms > now + money::MAX_HOLD_MS {
                v.add(
                    "scope.until",
                    "must be within 24 hours (the longest a hold stands); extend it later if the job runs longer",
                );
            }
            ms
        }
    };
    v.into_result().map_err(ApprovalError::Invalid)?;
    Ok(ApprovalScope {
        tokens,
        cost,
        until: Some(timestamp(until)),
    })
}
