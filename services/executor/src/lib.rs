//! The Switchyard executor: it accepts jobs in every seed format (converted
//! to one `JobSpec` by [`formats`] and checked by [`spec`]), estimates their
//! worst-case cost, gets them approved by the approval service and budgeted
//! by the ledger, runs their tasks as a durable DAG ([`driver`]) — commands
//! without a shell ([`command`]), agents through the router and
//! `AgentService.Invoke`, built-in agents ([`builtin`]) — and streams every
//! step as events.
//!
//! Durability: the job's state is derived only from its event log
//! ([`state`]); everything acknowledged is in sled (group commit), and a
//! restarted executor replays the log and resumes what was running.
//!
//! Called by the gRPC server (`JobService`), the CLI and `switchyard dev`.

pub mod builtin;
/// Command tasks run through the sandbox crate.
use switchyard_sandbox as command;
mod driver;
pub mod formats;
mod llm;
pub mod spec;
pub mod state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use switchyard_agent_sdk::AgentServer;
use switchyard_approval::ApprovalClient;
use switchyard_core::lifecycle::{JobState, Refused, TaskState};
use switchyard_core::{Clock, Reason};
use switchyard_kit::auth::{OnBehalf, Principal};
use switchyard_kit::error::{metadata, status, status_with_metadata};
use switchyard_kit::shutdown::Shutdown;
use switchyard_ledger::LedgerClient;
use switchyard_proto::agent::v1::agent_service_client::AgentServiceClient;
use switchyard_proto::agent::v1::agent_service_server::AgentService;
use switchyard_proto::agent::v1::{
    DescribeRequest, DescribeResponse, InvokeRequest, InvokeResponse,
};
use switchyard_proto::approval::v1 as ap;
use switchyard_proto::common::v1::{Event, Money};
use switchyard_proto::executor::v1::job_service_server::{JobService, JobServiceServer};
use switchyard_proto::executor::v1::{
    CancelJobRequest, CancelJobResponse, GetJobRequest, GetJobResponse, GetResultRequest,
    GetResultResponse, Job, JobSpec, ListJobsRequest, ListJobsResponse, RoutePreview,
    SubmitJobRequest, SubmitJobResponse, TaskStatus, ValidateJobRequest, ValidateJobResponse,
    WatchJobRequest, WatchJobResponse, task_spec::Kind,
};
use switchyard_proto::ledger::v1::{CreateBudgetRequest, EstimateCostRequest};
use switchyard_proto::router::v1::{RouteConstraints, RouteRequest};
use switchyard_registry::RegistryClient;
use switchyard_router::RouterClient;
use switchyard_store::{Log, Store, StoreError, Tree};
use tonic::{Code, Request, Response, Status};

use crate::builtin::Builtins;
pub use crate::command::SandboxMode;
use crate::command::limits::ResourceLimits;
use crate::command::program::Programs;
use crate::command::{Policy, Sandbox};
use crate::formats::{FormatError, Limits};
use crate::spec::Rules;
use crate::state::{JobEntry, kind};

/// `[executor]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutorConfig {
    /// Worker id used to claim approval runs; keep it stable across restarts.
    pub worker_id: String,
    /// Registry URL when it runs in another process.
    pub registry_url: Option<String>,
    /// Router URL when it runs in another process.
    pub router_url: Option<String>,
    /// Ledger URL when it runs in another process.
    pub ledger_url: Option<String>,
    /// Approval URL when it runs in another process.
    pub approval_url: Option<String>,
    /// URL at which this process's built-in agents are reachable; empty =
    /// `http://<listen address>`.
    pub advertise_url: String,
    /// Host and register the built-in agents.
    pub builtin_agents: bool,
    /// Most tasks in one job (seed 001's limit).
    pub max_tasks: usize,
    /// Tasks of one job running at once when the job sets no limit.
    pub max_parallel: u32,
    /// Task timeout when a task sets none, seconds (seed 001: 300).
    pub default_timeout_secs: u32,
    /// Wait between SIGTERM and SIGKILL, ms.
    pub kill_grace_ms: u64,
    /// Bytes of stdout and of stderr kept per task.
    pub max_output_bytes: usize,
    /// Bytes of `files` a job may carry.
    pub max_file_bytes: usize,
    /// Commands a task may run (names looked up on `path` once, at start-up).
    /// Tools that can start other programs (awk's `system()`, sed's `e`) are
    /// safe here because the sandbox lets a task execute only its own
    /// binary: such a call fails with EACCES. See docs/sandbox.md.
    pub commands: Vec<String>,
    /// The only PATH commands see and are looked up on.
    pub path: String,
    /// `"on"`: every command task runs in the sandbox (Landlock, seccomp,
    /// no_new_privs, rlimits), and command tasks are refused when the kernel
    /// has no Landlock. `"off"`: they run unconfined as the executor's user
    /// (rlimits only) — logged at start-up and shown on every command task.
    pub sandbox: SandboxMode,
    /// User id command tasks run as when the executor runs as root.
    pub sandbox_uid: u32,
    /// Group id command tasks run as when the executor runs as root.
    pub sandbox_gid: u32,
    /// Paths every command task may read (not write or execute). Keep
    /// secrets out: the default names single files of /etc, not /etc.
    pub sandbox_read_paths: Vec<PathBuf>,
    /// Allowlisted commands that may open network connections (all others
    /// cannot create a socket). No host allowlist: a command here reaches
    /// whatever the executor's host reaches.
    pub network_commands: Vec<String>,
    /// Resource limits of every command task unless it asks for others.
    pub task_limits: ResourceLimits,
    /// The most a task may ask for (0: no cap).
    pub task_limit_caps: ResourceLimits,
    /// Budget that job budgets nest under when the job names none (empty:
    /// job budgets are top-level).
    pub default_parent_budget: String,
    /// Tokens reserved for one agent call (capped by the job's token budget).
    pub agent_max_tokens: u64,
    /// Output tokens assumed for an LLM task without max_tokens.
    pub llm_default_max_tokens: u64,
    /// Most model calls of one LLM task attempt when the task says none.
    pub llm_max_turns: u32,
    /// Timeout of one tool call when the task says none, ms (seed 000
    /// `ext_agent_tool_timeout_ms`).
    pub tool_timeout_ms: u64,
    /// Approval claim lease, seconds (renewed at a third of it).
    pub lease_secs: u32,
    /// How often pending jobs check their approval run, ms.
    pub approval_poll_ms: u64,
    /// DEFER re-check interval when the task gives none, seconds (seed 002: 5 minutes).
    pub defer_interval_secs: u32,
    /// Longest a task may stay deferred when it has no deadline, seconds.
    pub max_defer_secs: u64,
    /// Seed 000's delegation cap.
    pub max_delegation_depth: u32,
    /// Organisation recorded on approval runs when the job has no `org` label.
    pub default_org: String,
    /// Cancel a job's running tasks when another fails for good (else they finish).
    pub cancel_running_on_failure: bool,
    /// Where per-job scratch directories live; empty = `<data_dir>/scratch`.
    pub scratch_dir: PathBuf,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            worker_id: "executor".into(),
            registry_url: None,
            router_url: None,
            ledger_url: None,
            approval_url: None,
            advertise_url: String::new(),
            builtin_agents: true,
            max_tasks: 100,
            max_parallel: 4,
            default_timeout_secs: 300,
            kill_grace_ms: 2000,
            max_output_bytes: 1024 * 1024,
            max_file_bytes: 2 * 1024 * 1024,
            commands: [
                "cat",
                "echo",
                "grep",
                "sort",
                "uniq",
                "wc",
                "head",
                "tail",
                "cut",
                "tr",
                "sed",
                "awk",
                "jq",
                "tac",
                "rev",
                "nl",
                "fold",
                "paste",
                "seq",
                "printf",
                "true",
                "false",
                "sleep",
                "date",
                "base64",
                "sha256sum",
                "md5sum",
                "comm",
                "join",
                "expand",
                "fmt",
            ]
            .map(String::from)
            .to_vec(),
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            sandbox: SandboxMode::On,
            sandbox_uid: 65534,
            sandbox_gid: 65534,
            sandbox_read_paths: command::policy::default_read_paths(),
            network_commands: Vec::new(),
            task_limits: ResourceLimits::default(),
            task_limit_caps: ResourceLimits {
                memory_bytes: 16 << 30,
                cpu_seconds: 3600,
                processes: 4096,
                open_files: 65536,
                file_size_bytes: 16 << 30,
            },
            default_parent_budget: String::new(),
            agent_max_tokens: 4096,
            llm_default_max_tokens: 4096,
            llm_max_turns: 10,
            tool_timeout_ms: 30_000,
            lease_secs: 60,
            approval_poll_ms: 250,
            defer_interval_secs: 300,
            max_defer_secs: 3600,
            max_delegation_depth: 10,
            default_org: "default".into(),
            cancel_running_on_failure: false,
            scratch_dir: PathBuf::new(),
        }
    }
}

impl ExecutorConfig {
    /// Checks values that would make the executor misbehave.
    pub fn validate(&self) -> Result<(), String> {
        if self.worker_id.trim().is_empty() {
            return Err("executor.worker_id must not be empty".into());
        }
        if self.max_tasks == 0 || self.max_parallel == 0 {
            return Err("executor.max_tasks and executor.max_parallel must be at least 1".into());
        }
        if self.lease_secs < 3 {
            return Err("executor.lease_secs must be at least 3".into());
        }
        if self.llm_max_turns == 0 || self.tool_timeout_ms == 0 {
            return Err(
                "executor.llm_max_turns and executor.tool_timeout_ms must be at least 1".into(),
            );
        }
        if self.approval_poll_ms == 0 {
            return Err("executor.approval_poll_ms must be at least 1".into());
        }
        for c in &self.commands {
            if c.is_empty() || c.contains(char::is_whitespace) {
                return Err(format!("executor.commands: {c:?} is not a command name"));
            }
        }
        if let Some(c) = self
            .network_commands
            .iter()
            .find(|c| !self.commands.contains(c))
        {
            return Err(format!(
                "executor.network_commands: {c:?} is not in executor.commands"
            ));
        }
        self.task_limits.check_within(&self.task_limit_caps)?;
        Ok(())
    }

    fn rules(&self) -> Rules<'_> {
        Rules {
            max_tasks: self.max_tasks,
            commands: &self.commands,
            default_timeout_secs: self.default_timeout_secs,
            default_max_parallel: self.max_parallel,
            max_delegation_depth: self.max_delegation_depth,
            max_file_bytes: self.max_file_bytes,
            limit_caps: &self.task_limit_caps,
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            max_tasks: self.max_tasks,
            max_delegation_depth: self.max_delegation_depth,
        }
    }
}

/// Whether a job starts programs: command tasks, or LLM tasks offering a
/// command tool.
fn runs_commands(spec: &JobSpec) -> bool {
    spec.tasks.iter().any(|t| match &t.kind {
        Some(Kind::Command(_)) => true,
        Some(Kind::Llm(l)) => l.tools.iter().any(|tool| !tool.command.is_empty()),
        _ => false,
    })
}

/// Executor errors; mapped to a status once, in `From<ExecutorError> for Status`.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The job is not valid; see the field violations.
    #[error("{}", .0.violations.0.iter().map(|v| v.description.as_str()).collect::<Vec<_>>().join("; "))]
    Invalid(FormatError),
    /// No such job.
    #[error("job {0:?} not found")]
    NotFound(String),
    /// An agent (no submitter role) submitted a job that is not a delegation.
    #[error(
        "an agent submits only delegated child jobs: set delegation.parent_job_id to the active job it works for"
    )]
    DelegationOnly,
    /// The id is taken by a different spec.
    #[error("job {0:?} already exists with a different spec")]
    Exists(String),
    /// A state change the table refuses.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// Another service refused or failed; its status is passed on.
    #[error("{service}: {}", .status.message())]
    Upstream {
        /// Which service.
        service: &'static str,
        /// What it said.
        status: Status,
    },
    /// Storage failed.
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    /// The job's scratch directory could not be prepared.
    #[error("scratch directory: {0}")]
    Scratch(String),
    /// The command sandbox's configuration cannot be honoured.
    #[error("{0}")]
    Sandbox(String),
    /// Delegation from a job that is not running.
    #[error("job {parent:?} is {state}, not active: only a running job can delegate")]
    ParentNotActive {
        /// The parent job.
        parent: String,
        /// Its state.
        state: String,
    },
}

impl From<ExecutorError> for Status {
    fn from(e: ExecutorError) -> Status {
        let msg = e.to_string();
        match e {
            ExecutorError::Invalid(f) => {
                let mut s = switchyard_kit::error::invalid_argument(f.reason, &f.violations);
                // Keep the seed's wording as the message (e.g. `Invalid task numbering: …`).
                let details = s.details().to_vec();
                s = Status::with_details(Code::InvalidArgument, msg, details.into());
                s
            }
            ExecutorError::NotFound(id) => status_with_metadata(
                Code::NotFound,
                Reason::JobNotFound,
                msg,
                metadata([("job_id", id)]),
            ),
            ExecutorError::DelegationOnly => status_with_metadata(
                Code::PermissionDenied,
                Reason::PermissionDenied,
                msg,
                metadata([("permission", "job.submit".to_owned())]),
            ),
            ExecutorError::ParentNotActive { parent, state } => status_with_metadata(
                Code::FailedPrecondition,
                Reason::ParentNotActive,
                msg,
                metadata([("parent_job_id", parent), ("state", state)]),
            ),
            ExecutorError::Exists(id) => status_with_metadata(
                Code::AlreadyExists,
                Reason::JobAlreadyExists,
                msg,
                metadata([("job_id", id)]),
            ),
            ExecutorError::Refused(r) => status_with_metadata(
                Code::FailedPrecondition,
                r.reason,
                msg,
                metadata([("from", r.from.to_owned()), ("to", r.to.to_owned())]),
            ),
            ExecutorError::Upstream { status, .. } => {
                Status::with_details(status.code(), msg, status.details().to_vec().into())
            }
            ExecutorError::Storage(_) => status(Code::Internal, Reason::StorageFailure, msg),
            ExecutorError::Scratch(_) => status(Code::Internal, Reason::Internal, msg),
            ExecutorError::Sandbox(_) => {
                status(Code::FailedPrecondition, Reason::SandboxUnavailable, msg)
            }
        }
    }
}

fn upstream(service: &'static str) -> impl FnOnce(Status) -> ExecutorError {
    move |status| ExecutorError::Upstream { service, status }
}

/// The job a delegated job comes from.
#[derive(Debug, Clone)]
struct Parent {
    run_id: String,
    budget_id: String,
    submitter: OnBehalf,
}

/// The services the executor calls, each in-process or remote.
#[derive(Debug, Clone)]
pub struct Clients {
    /// Registry (outcomes, built-in registration).
    pub registry: RegistryClient,
    /// Router (candidates).
    pub router: RouterClient,
    /// Ledger (budgets, reservations).
    pub ledger: LedgerClient,
    /// Approval (runs).
    pub approval: ApprovalClient,
    /// LLM providers (`[llm]`), for LLM tasks.
    pub llm: switchyard_llm::Llm,
}

switchyard_kit::service_client! {
    /// An agent, called in-process (the built-in agents of this executor) or
    /// over gRPC.
    pub AgentClient {
        local: AgentServer<Builtins> as AgentService,
        remote: AgentServiceClient,
        unary {
            /// The agent's descriptor.
            describe(DescribeRequest) -> DescribeResponse;
        }
        streaming {
            /// Runs a task.
            invoke(InvokeRequest) -> InvokeResponse;
        }
    }
}

/// A task state change to record.
#[derive(Debug, Clone, Copy)]
struct Change<'a> {
    to: TaskState,
    reason: Option<Reason>,
    error: &'a str,
    /// Retrying/deferred: the next attempt is due this long after the
    /// change is recorded (the same clock reading stamps both).
    after_ms: Option<u64>,
    extend: bool,
}

impl<'a> Change<'a> {
    fn to(to: TaskState) -> Self {
        Change {
            to,
            reason: None,
            error: "",
            after_ms: None,
            extend: false,
        }
    }

    fn because(mut self, reason: Reason, error: &'a str) -> Self {
        self.reason = Some(reason);
        self.error = error;
        self
    }

    fn after(mut self, delay_ms: u64) -> Self {
        self.after_ms = Some(delay_ms);
        self
    }
}

/// Per-job control of a running driver.
#[derive(Debug, Default)]
struct Control {
    /// Why the job is being cancelled and by whom, once asked.
    cancel: Mutex<Option<(String, Option<OnBehalf>)>>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    jobs: HashMap<String, JobEntry>,
    /// Jobs by creation (ms, id), for listing newest first.
    order: std::collections::BTreeSet<(u64, String)>,
    /// Drivers running, by job id.
    drivers: HashMap<String, Arc<Control>>,
    /// Jobs with events not yet known durable.
    dirty: std::collections::HashSet<String>,
    /// Jobs waiting for approval or their scheduled time (what the poller checks).
    waiting: std::collections::BTreeSet<String>,
}

struct Inner {
    cfg: ExecutorConfig,
    clock: Arc<dyn Clock>,
    store: Store,
    events: Log<Event>,
    specs: Tree<Job>,
    outputs: Tree<TaskStatus>,
    state: Mutex<State>,
    clients: Clients,
    agents: Mutex<HashMap<String, AgentClient>>,
    /// Channels to tool providers, by endpoint.
    tool_channels: switchyard_kit::client::Channels,
    local_agents: Arc<AgentServer<Builtins>>,
    local_endpoint: Mutex<String>,
    max_message_bytes: usize,
    shutdown: Shutdown,
    /// Bumped whenever a job finishes (for waiters such as CancelJob).
    finished: tokio::sync::watch::Sender<u64>,
    /// Wakes the background flusher of events nobody waits for.
    flush_wanted: tokio::sync::Notify,
    /// Releases running in the background, by job.
    settling: Mutex<HashMap<String, Vec<tokio::task::JoinHandle<()>>>>,
    /// The allowlist, resolved at start-up.
    programs: Programs,
    /// How command tasks are confined.
    sandbox: Sandbox,
}

/// The executor service.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").finish_non_exhaustive()
    }
}

/// The worst case of a job.
#[derive(Debug, Clone, Default)]
struct Estimate {
    input_tokens: u64,
    output_tokens: u64,
    /// `None` when some part cannot be priced (unknown model, no agent yet).
    cost: Option<i64>,
    routes: Vec<RoutePreview>,
}

impl Executor {
    /// Opens the executor on `store`, replaying its event log. Call
    /// [`Executor::start`] once the server is listening.
    pub fn open(
        mut cfg: ExecutorConfig,
        store: Store,
        clients: Clients,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        data_dir: &std::path::Path,
        max_message_bytes: usize,
    ) -> Result<Executor, ExecutorError> {
        if cfg.scratch_dir.as_os_str().is_empty() {
            cfg.scratch_dir = data_dir.join("scratch");
        }
        let sandbox = Sandbox::detect(&Policy {
            mode: cfg.sandbox,
            read_paths: &cfg.sandbox_read_paths,
            ids_when_root: (cfg.sandbox_uid, cfg.sandbox_gid),
            network_commands: &cfg.network_commands,
            scratch_root: &cfg.scratch_dir,
        })
        .map_err(ExecutorError::Sandbox)?;
        match (sandbox.mode(), sandbox.unavailable()) {
            (SandboxMode::On, None) => tracing::info!("{}", sandbox.describe()),
            (SandboxMode::On, Some(_)) => tracing::error!("{}", sandbox.describe()),
            (SandboxMode::Off, _) => tracing::warn!("{}", sandbox.describe()),
        }
        let programs = Programs::resolve(&cfg.commands, &cfg.path);
        for (name, why) in programs.unusable() {
            tracing::warn!(command = name, "allowlisted command cannot run: {why}");
        }
        let events = store.log::<Event>("events")?;
        let specs = store.tree::<Job>("jobs")?;
        let outputs = store.tree::<TaskStatus>("outputs")?;
        let mut st = State::default();
        for r in specs.iter() {
            let (id, job) = r?;
            let Some(spec) = job.spec.clone() else {
                continue;
            };
            // Stored specs were validated when accepted; only their graph is
            // rebuilt, so a later config change (say, a shorter allowlist)
            // cannot stop accepted jobs from loading.
            let dag = spec::dag(&spec).map_err(ExecutorError::Invalid)?;
            let created = job
                .created_at
                .as_ref()
                .map_or(0, switchyard_kit::time::timestamp_ms);
            let mut entry = JobEntry::new(spec, dag, created);
            entry.job.created_at = job.created_at;
            st.order.insert((created, id.clone()));
            st.jobs.insert(id, entry);
        }
        for r in events.replay() {
            let (g, ev) = r?;
            if let Some(entry) = st.jobs.get_mut(&ev.job_id) {
                let key = format!("{}/{}", ev.job_id, ev.task_id);
                entry.apply(&ev, |_| outputs.get(&key).ok().flatten());
                entry.events.push(g);
            }
        }
        for e in st.jobs.values_mut() {
            e.durable_to.send_replace(e.job.last_sequence);
        }
        st.waiting = st
            .jobs
            .values()
            .filter(|e| matches!(e.state(), JobState::Pending | JobState::Scheduled))
            .map(|e| e.id().to_owned())
            .collect();
        let spec = builtin::spec("");
        Ok(Executor {
            inner: Arc::new(Inner {
                cfg,
                clock,
                store,
                events,
                specs,
                outputs,
                state: Mutex::new(st),
                clients,
                agents: Mutex::new(HashMap::new()),
                tool_channels: Default::default(),
                local_agents: Arc::new(AgentServer::new(Builtins, &spec)),
                local_endpoint: Mutex::new(String::new()),
                max_message_bytes,
                shutdown,
                finished: tokio::sync::watch::channel(0).0,
                flush_wanted: tokio::sync::Notify::new(),
                settling: Mutex::new(HashMap::new()),
                programs,
                sandbox,
            }),
        })
    }

    /// The gRPC service.
    pub fn server(&self, max_message_bytes: usize) -> JobServiceServer<Executor> {
        JobServiceServer::new(self.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// The built-in agents' gRPC service, to mount on the same server.
    pub fn builtin_agents_server(
        &self,
    ) -> switchyard_proto::agent::v1::agent_service_server::AgentServiceServer<AgentServer<Builtins>>
    {
        let spec = builtin::spec("");
        AgentServer::new(Builtins, &spec).into_service(self.inner.max_message_bytes)
    }

    /// Starts background work once the process listens at `listen`: the
    /// built-in agents' registration, the approval poller, and the drivers
    /// of jobs that were running before a restart.
    pub fn start(&self, listen: std::net::SocketAddr) {
        let endpoint = if self.inner.cfg.advertise_url.is_empty() {
            format!("http://{listen}")
        } else {
            self.inner.cfg.advertise_url.clone()
        };
        *lock(&self.inner.local_endpoint) = endpoint.clone();
        if self.inner.cfg.builtin_agents {
            let registry = self.inner.clients.registry.clone();
            let shutdown = self.inner.shutdown.clone();
            tokio::spawn(async move {
                keep_builtins_registered(registry, builtin::spec(&endpoint), shutdown).await;
            });
        }
        // Flushes events recorded without a waiter (progress, output, routing).
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = me.inner.flush_wanted.notified() => {}
                    _ = me.inner.shutdown.wait() => return,
                }
                let g = me.inner.events.last();
                if let Err(e) = me.durable(g).await {
                    tracing::warn!(error = %e, "flushing job events");
                }
            }
        });
        let me = self.clone();
        self.inner.shutdown.spawn_every(
            Duration::from_millis(self.inner.cfg.approval_poll_ms),
            "executor approval poll",
            move || {
                let me = me.clone();
                async move { me.poll_approvals().await }
            },
        );
        let resume: Vec<String> = {
            let st = self.lock();
            st.jobs
                .values()
                .filter(|e| matches!(e.state(), JobState::Available | JobState::Active))
                .map(|e| e.id().to_owned())
                .collect()
        };
        for id in resume {
            tracing::info!(job_id = %id, "resuming job after restart");
            self.spawn_driver(&id);
        }
    }

    /// Flushes storage (shutdown).
    pub fn flush(&self) -> Result<(), ExecutorError> {
        self.inner.store.flush_blocking()?;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.inner.state)
    }

    fn now(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Appends an event for `job_id` (and `task_id`), applying it first.
    /// Not durable until [`Executor::durable`].
    fn record(
        &self,
        st: &mut State,
        job_id: &str,
        task_id: &str,
        kind: &str,
        data: serde_json::Value,
        stored: Option<&TaskStatus>,
    ) -> u64 {
        let now = self.now();
        self.record_at(st, job_id, task_id, kind, data, stored, now)
    }

    /// [`Executor::record`] stamped at `time_ms`.
    #[allow(clippy::too_many_arguments)]
    fn record_at(
        &self,
        st: &mut State,
        job_id: &str,
        task_id: &str,
        kind: &str,
        data: serde_json::Value,
        stored: Option<&TaskStatus>,
        time_ms: u64,
    ) -> u64 {
        let Some(entry) = st.jobs.get_mut(job_id) else {
            return self.inner.events.last();
        };
        let ev = Event {
            sequence: entry.job.last_sequence + 1,
            time: Some(switchyard_kit::time::timestamp(time_ms)),
            correlation_id: entry.spec().correlation_id.clone(),
            job_id: job_id.to_owned(),
            task_id: task_id.to_owned(),
            kind: kind.to_owned(),
            data: state::data(data),
        };
        entry.apply(&ev, |_| stored.cloned());
        if matches!(entry.state(), JobState::Pending | JobState::Scheduled) {
            st.waiting.insert(job_id.to_owned());
        } else {
            st.waiting.remove(job_id);
        }
        tracing::debug!(job_id, task_id, kind, sequence = ev.sequence, "job event");
        entry.cache.push(ev.clone());
        let (g, _) = self.inner.events.append(|_| ev);
        entry.events.push(g);
        st.dirty.insert(job_id.to_owned());
        g
    }

    /// Moves a job through the table, recording the change.
    fn move_job(
        &self,
        st: &mut State,
        job_id: &str,
        to: JobState,
        reason: Reason,
        error: &str,
    ) -> Result<u64, ExecutorError> {
        let entry = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        let from = entry.state();
        from.check(to)?;
        let reason = if matches!(
            to,
            JobState::Completed | JobState::Available | JobState::Active | JobState::Scheduled
        ) {
            String::new()
        } else {
            reason.as_str().to_owned()
        };
        if finished(to) {
            tracing::info!(job_id, %from, %to, %reason, error, "job finished");
        } else {
            tracing::debug!(job_id, %from, %to, "job moved");
        }
        let g = self.record(
            st,
            job_id,
            "",
            kind::JOB_STATE,
            json!({"from": from.as_str(), "to": to.as_str(), "reason": reason, "error": error}),
            None,
        );
        if to.is_terminal() || to == JobState::Retryable {
            self.inner.finished.send_modify(|n| *n += 1);
        }
        Ok(g)
    }

    /// Moves a task through the table, recording the change.
    fn move_task(
        &self,
        st: &mut State,
        job_id: &str,
        i: usize,
        c: Change<'_>,
    ) -> Result<u64, ExecutorError> {
        let entry = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        let from = entry.task_state(i);
        from.check(c.to)?;
        let task_id = entry.spec().tasks[i].id.clone();
        // One clock reading: an attempt's end and its retry's due time are
        // exactly the delay apart.
        let now = self.now();
        Ok(self.record_at(
            st,
            job_id,
            &task_id,
            kind::TASK_STATE,
            json!({
                "from": from.as_str(), "to": c.to.as_str(),
                "reason": c.reason.map_or("", |r| r.as_str()), "error": c.error,
                "next_attempt_at_ms": c.after_ms.map_or(0, |d| now + d),
                "extend": if c.extend { "true" } else { "" },
            }),
            None,
            now,
        ))
    }

    /// Waits until the log is durable up to `g`, then tells each job's
    /// watchers how far its events are durable.
    async fn durable(&self, g: u64) -> Result<(), ExecutorError> {
        if self.inner.events.durable() >= g {
            // Already on disk; whoever flushed it told the watchers.
            return Ok(());
        }
        self.inner.events.make_durable(g).await?;
        let upto = self.inner.events.durable();
        let mut st = self.lock();
        let st = &mut *st;
        st.dirty.retain(|id| {
            let Some(e) = st.jobs.get_mut(id) else {
                return false;
            };
            let n = e.events.partition_point(|&x| x <= upto) as u64;
            e.durable_to.send_if_modified(|d| {
                let moved = n > *d;
                *d = (*d).max(n);
                moved
            });
            let all = n == e.events.len() as u64;
            if all && finished(e.state()) {
                // Watchers of a finished job read the log.
                e.cache = Vec::new();
            }
            !all
        });
        Ok(())
    }

    // ------------------------------------------------------------ submit / validate

    /// Converts and checks a request's job; returns the normalized spec and its DAG.
    fn accept(
        &self,
        spec: Option<JobSpec>,
        document: &str,
        files: HashMap<String, Vec<u8>>,
    ) -> Result<(JobSpec, switchyard_core::dag::Dag), ExecutorError> {
        let mut spec = match spec {
            Some(mut s) => {
                s.source_format = formats::NATIVE.into();
                s
            }
            None if !document.trim().is_empty() => {
                formats::parse_document(document, self.inner.cfg.limits())
                    .map_err(ExecutorError::Invalid)?
            }
            None => {
                return Err(ExecutorError::Invalid(FormatError {
                    reason: Reason::InvalidArgument,
                    violations: {
                        let mut v = switchyard_core::Violations::new();
                        v.add("spec", "a job is required: send spec or document");
                        v
                    },
                }));
            }
        };
        spec.files.extend(files);
        let rules = self.inner.cfg.rules();
        spec::normalize(&mut spec, &rules);
        let dag = spec::validate(&spec, &rules).map_err(ExecutorError::Invalid)?;
        if let Some(why) = self.inner.sandbox.unavailable()
            && runs_commands(&spec)
        {
            return Err(ExecutorError::Sandbox(why));
        }
        Ok((spec, dag))
    }

    /// Worst-case tokens and cost, with a routing preview.
    async fn estimate(&self, spec: &JobSpec) -> Result<Estimate, ExecutorError> {
        let mut est = Estimate {
            cost: Some(0),
            ..Default::default()
        };
        let token_cap = spec.budget.as_ref().and_then(|b| b.token_budget);
        for t in &spec.tasks {
            let retry = t.retry.as_ref().map_or(0, |r| r.max_retries);
            let extension = t.fallback.as_ref().is_some_and(|f| {
                f.on_timeout
                    == switchyard_proto::executor::v1::FallbackStrategy::RetryWithTimeoutExtension
                        as i32
            });
            let attempts = 1 + u64::from(retry) + u64::from(extension);
            match &t.kind {
                Some(Kind::Agent(a)) => {
                    let routed = self.route(a).await.map_err(upstream("router"))?;
                    // An agent that bills its own model calls can spend more
                    // than its price: its worst case is unknown, so a person
                    // (not a cost policy) approves.
                    let worst = if routed.candidates.iter().any(|c| c.bills_tokens) {
                        None
                    } else {
                        routed
                            .candidates
                            .iter()
                            .map(|c| c.price_per_unit_micro_usd)
                            .max()
                    };
                    let tokens = self.agent_tokens(token_cap) * attempts;
                    est.output_tokens += tokens;
                    est.cost = match (est.cost, worst) {
                        (Some(c), Some(p)) => Some(c + p * attempts as i64),
                        _ => None,
                    };
                    if let Some(best) = routed.candidates.first() {
                        est.routes.push(RoutePreview {
                            task_id: t.id.clone(),
                            agent_id: best.agent_id.clone(),
                            score: best.score,
                        });
                    } else {
                        est.routes.push(RoutePreview {
                            task_id: t.id.clone(),
                            ..Default::default()
                        });
                    }
                }
                Some(Kind::Llm(l)) => {
                    let input = ((l.prompt.len() + l.instructions.len()) as u64).div_ceil(4) + 16;
                    let output = l
                        .max_tokens
                        .unwrap_or(self.inner.cfg.llm_default_max_tokens);
                    let mut chain = vec![l.model.clone()];
                    chain.extend(l.fallback_models.iter().cloned());
                    if let Some(price) = self.inner.clients.llm.chain_price(&chain, &l.provider) {
                        // Worst case: every turn of every attempt spends its
                        // full completion cap, within the token budget.
                        let turns = u64::from(if l.max_turns == 0 {
                            self.inner.cfg.llm_max_turns
                        } else {
                            l.max_turns
                        });
                        let (mut i, mut o) = (input * turns * attempts, output * turns * attempts);
                        let cap = l.token_budget.or(token_cap);
                        if let Some(cap) = cap
                            && i + o > cap
                        {
                            o = (u128::from(cap) * u128::from(o) / u128::from(i + o)) as u64;
                            i = cap - o;
                        }
                        est.input_tokens += i;
                        est.output_tokens += o;
                        let usage = switchyard_llm::Usage {
                            prompt_tokens: i,
                            completion_tokens: o,
                            total_tokens: i + o,
                        };
                        // Agents called as tools and delegated jobs spend
                        // inside the job's budget too, by amounts not known
                        // now: a person approves.
                        let open_ended = !l.agents.is_empty()
                            || l.tools
                                .iter()
                                .any(|t| t.name == "delegate" && t.command.is_empty());
                        est.cost = est
                            .cost
                            .filter(|_| !open_ended)
                            .map(|c| c + price.cost(&usage));
                        continue;
                    }
                    est.input_tokens += input * attempts;
                    est.output_tokens += output * attempts;
                    let priced = self
                        .inner
                        .clients
                        .ledger
                        .estimate_cost(EstimateCostRequest {
                            model: l.model.clone(),
                            input_tokens: input,
                            max_output_tokens: output,
                        })
                        .await;
                    est.cost = match (est.cost, priced) {
                        (Some(c), Ok(r)) => {
                            Some(c + r.cost.map_or(0, |m| m.micro_usd) * attempts as i64)
                        }
                        _ => None,
                    };
                }
                _ => {}
            }
        }
        Ok(est)
    }

    /// Candidates for an agent task; none (rather than an error) when no
    /// agent offers the capability right now.
    async fn route(
        &self,
        a: &switchyard_proto::executor::v1::AgentTask,
    ) -> Result<switchyard_proto::router::v1::RouteResponse, Status> {
        match self.inner.clients.router.route(route_request(a, 5)).await {
            Err(e)
                if switchyard_kit::error::ApiError::from(e.clone()).known_reason()
                    == Some(Reason::CapabilityUnavailable) =>
            {
                Ok(Default::default())
            }
            r => r,
        }
    }

    fn agent_tokens(&self, token_cap: Option<u64>) -> u64 {
        let t = self.inner.cfg.agent_max_tokens;
        token_cap.map_or(t, |cap| t.min(cap))
    }

    /// ValidateJob: everything SubmitJob checks and estimates; creates nothing.
    pub async fn validate_job(
        &self,
        req: ValidateJobRequest,
    ) -> Result<ValidateJobResponse, ExecutorError> {
        let (spec, dag) = self.accept(req.spec, &req.document, HashMap::new())?;
        let est = self.estimate(&spec).await?;
        Ok(ValidateJobResponse {
            order: dag
                .order()
                .iter()
                .map(|&i| spec.tasks[i].id.clone())
                .collect(),
            estimated_cost: est.cost.map(|micro_usd| Money { micro_usd }),
            estimated_tokens: est.input_tokens + est.output_tokens,
            routes: est.routes,
            context_hash: spec::context_hash(&spec),
            source_format: spec.source_format.clone(),
            spec: Some(spec),
        })
    }

    /// SubmitJob.
    pub async fn submit(
        &self,
        req: SubmitJobRequest,
        who: Option<OnBehalf>,
        correlation_id: String,
        traceparent: Option<String>,
    ) -> Result<SubmitJobResponse, ExecutorError> {
        self.submit_as(req, who, false, correlation_id, traceparent)
            .await
    }

    /// SubmitJob for `who`; with `delegation_only` (an agent without the
    /// submitter role) only a child of an active job is accepted, so it
    /// spends within the parent's approved budget.
    async fn submit_as(
        &self,
        req: SubmitJobRequest,
        who: Option<OnBehalf>,
        delegation_only: bool,
        correlation_id: String,
        traceparent: Option<String>,
    ) -> Result<SubmitJobResponse, ExecutorError> {
        let (mut spec, dag) = self.accept(req.spec, &req.document, req.files)?;
        let delegated = spec
            .delegation
            .as_ref()
            .is_some_and(|d| !d.parent_job_id.is_empty());
        if delegation_only && !delegated {
            return Err(ExecutorError::DelegationOnly);
        }
        if spec.correlation_id.is_empty() {
            spec.correlation_id = correlation_id;
        }
        let client_id = !spec.job_id.is_empty();
        if !client_id {
            spec.job_id = uuid::Uuid::now_v7().to_string();
        }
        let parent = self.adopt(&mut spec)?;
        // The submitter: the caller, else (a service delegating) the parent's.
        let submitter = match (who, &parent) {
            (Some(w), Some(p)) if w.tenant != p.submitter.tenant => {
                // Another tenant's parent job does not exist for this caller.
                let id = spec
                    .delegation
                    .as_ref()
                    .map(|d| d.parent_job_id.clone())
                    .unwrap_or_default();
                return Err(ExecutorError::NotFound(id));
            }
            (Some(w), _) => w,
            (None, Some(p)) => p.submitter.clone(),
            (None, None) => {
                return Err(ExecutorError::Invalid(FormatError::one(
                    Reason::InvalidArgument,
                    "job",
                    "a job belongs to a tenant: a service submits on behalf of a user",
                )));
            }
        };
        let job_id = spec.job_id.clone();
        let hash = spec::context_hash(&spec);
        let now = self.now();
        // Claim the id, or answer for the job that has it.
        {
            let mut st = self.lock();
            if let Some(existing) = st.jobs.get(&job_id) {
                return if existing.context_hash == hash && existing.job.tenant == submitter.tenant {
                    Ok(SubmitJobResponse {
                        job: Some(existing.job.clone()),
                        created: false,
                    })
                } else {
                    Err(ExecutorError::Exists(job_id))
                };
            }
            let mut entry = JobEntry::new(spec.clone(), dag, now);
            entry.context_hash = hash.clone();
            entry.job.tenant.clone_from(&submitter.tenant);
            entry.job.submitted_by.clone_from(&submitter.subject);
            entry.submitter_kind = submitter.kind.as_str().to_owned();
            st.jobs.insert(job_id.clone(), entry);
        }
        let submitted_by = submitter.subject.clone();
        // The budget and the run are made for the submitter, whatever context
        // the caller runs in (a gRPC request, a job driver, an LLM tool).
        let ctx = acting_context(&spec.correlation_id, submitter.clone());
        let result = switchyard_kit::context::scope(
            ctx,
            self.admit(&spec, &hash, &submitted_by, parent.as_ref()),
        )
        .await;
        let (budget_id, run, auto) = match result {
            Ok(x) => x,
            Err(e) => {
                self.lock().jobs.remove(&job_id);
                return Err(e);
            }
        };
        let (g, start) = {
            let mut st = self.lock();
            let entry = st
                .jobs
                .get_mut(&job_id)
                .ok_or_else(|| ExecutorError::NotFound(job_id.clone()))?;
            let stored = Job {
                spec: Some(spec.clone()),
                created_at: entry.job.created_at,
                ..Default::default()
            };
            self.inner.specs.put(&job_id, &stored)?;
            st.order.insert((now, job_id.clone()));
            self.record(
                &mut st,
                &job_id,
                "",
                kind::SUBMITTED,
                json!({
                    "format": spec.source_format, "tasks": spec.tasks.len(),
                    "submitted_by": submitted_by,
                    "tenant": submitter.tenant,
                    "submitter_kind": submitter.kind.as_str(),
                    "traceparent": traceparent.unwrap_or_default(),
                }),
                None,
            );
            self.record(
                &mut st,
                &job_id,
                "",
                kind::BUDGET_CREATED,
                json!({"budget_id": budget_id, "parent_id": self.parent_budget(&spec)}),
                None,
            );
            let est = run.cost_estimate.unwrap_or_default();
            let mut g = self.record(
                &mut st,
                &job_id,
                "",
                kind::APPROVAL_REQUESTED,
                json!({
                    "run_id": run.run_id, "context_hash": hash,
                    "estimated_input_tokens": est.estimated_input_tokens,
                    "estimated_output_tokens": est.estimated_output_tokens,
                    "estimated_cost_micro_usd": est.estimated_cost.map(|m| m.micro_usd),
                    "max_tokens": run.max_tokens,
                    "skip_policies": spec.approval.as_ref().is_some_and(|a| a.requires_approval),
                }),
                None,
            );
            let mut start = false;
            if let Some(by) = auto {
                (g, start) = self.approved(&mut st, &job_id, &by, now)?;
            }
            (g, start)
        };
        self.durable(g).await?;
        if start {
            self.spawn_driver(&job_id);
        }
        let job = self.job(&job_id)?;
        tracing::info!(job_id = %job_id, state = ?job.state, "job submitted");
        Ok(SubmitJobResponse {
            job: Some(job),
            created: true,
        })
    }

    /// Delegation (seed 000 §2.3): a job naming a parent is accepted only
    /// while the parent is active and below its maximum depth; it gets the
    /// parent's depth + 1, and its budget nests under the parent's.
    fn adopt(&self, spec: &mut JobSpec) -> Result<Option<Parent>, ExecutorError> {
        let Some(d) = spec
            .delegation
            .as_mut()
            .filter(|d| !d.parent_job_id.is_empty())
        else {
            return Ok(None);
        };
        let st = self.lock();
        let Some(p) = st.jobs.get(&d.parent_job_id) else {
            return Err(ExecutorError::Invalid(FormatError::one(
                Reason::JobNotFound,
                "delegation.parent_job_id",
                format!("parent job {:?} does not exist", d.parent_job_id),
            )));
        };
        if p.state() != JobState::Active {
            return Err(ExecutorError::ParentNotActive {
                parent: d.parent_job_id.clone(),
                state: p.state().as_str().to_owned(),
            });
        }
        let pd = p.spec().delegation.clone().unwrap_or_default();
        let cap = self.inner.cfg.max_delegation_depth;
        let max = if pd.max_depth == 0 {
            cap
        } else {
            pd.max_depth.min(cap)
        };
        let depth = pd.depth + 1;
        // Seed 000: refused only when the child's depth exceeds the maximum.
        if depth > max {
            return Err(ExecutorError::Invalid(FormatError::one(
                Reason::AgentMaxDelegationDepth,
                "delegation.depth",
                format!(
                    "delegation depth {depth} exceeds the maximum of {max}: job {:?} may not delegate further",
                    d.parent_job_id
                ),
            )));
        }
        d.depth = depth;
        d.max_depth = max;
        let parent = Parent {
            run_id: p.job.run_id.clone(),
            budget_id: p.job.budget_id.clone(),
            submitter: p.submitter(),
        };
        spec.budget.get_or_insert_default().parent_budget_id = parent.budget_id.clone();
        Ok(Some(parent))
    }

    fn parent_budget(&self, spec: &JobSpec) -> String {
        spec.budget
            .as_ref()
            .map(|b| b.parent_budget_id.clone())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| self.inner.cfg.default_parent_budget.clone())
    }

    /// Records the approval of a pending job and moves it on; returns the
    /// last event and whether it may start now.
    fn approved(
        &self,
        st: &mut State,
        job_id: &str,
        by: &str,
        now: u64,
    ) -> Result<(u64, bool), ExecutorError> {
        let spec = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?
            .spec();
        let (to, go) = self.after_approval(spec, now);
        self.record(
            st,
            job_id,
            "",
            kind::APPROVAL_DECIDED,
            json!({"status": "approved", "by": by}),
            None,
        );
        Ok((
            self.move_job(st, job_id, to, Reason::InvalidArgument, "")?,
            go,
        ))
    }

    /// Where an approved job goes: scheduled (not due yet) or available.
    fn after_approval(&self, spec: &JobSpec, now: u64) -> (JobState, bool) {
        let due = spec
            .scheduled_at
            .as_ref()
            .is_none_or(|t| switchyard_kit::time::timestamp_ms(t) <= now);
        if due {
            (JobState::Available, true)
        } else {
            (JobState::Scheduled, false)
        }
    }

    /// Creates the job's budget and proposes its approval run. Both are
    /// idempotent, so a client retrying the same job id repeats them safely.
    async fn admit(
        &self,
        spec: &JobSpec,
        hash: &str,
        submitted_by: &str,
        parent: Option<&Parent>,
    ) -> Result<(String, ap::Run, Option<String>), ExecutorError> {
        let est = self.estimate(spec).await?;
        let budget_id = format!("job-{}", spec.job_id);
        let mut b = spec.budget.clone().unwrap_or_default();
        if let Some(p) = parent {
            // The child gets what the parent has left, as a budget nested
            // under the parent's: its spending rolls up, and every
            // reservation must also fit the parent's.
            let left = self
                .inner
                .clients
                .ledger
                .get_budget(switchyard_proto::ledger::v1::GetBudgetRequest {
                    budget_id: p.budget_id.clone(),
                })
                .await
                .map_err(upstream("ledger"))?
                .budget
                .unwrap_or_default();
            let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            b.token_budget = min(b.token_budget, left.tokens_remaining);
            b.cost_limit = min(
                b.cost_limit.map(|m| m.micro_usd.max(0) as u64),
                left.cost_remaining.map(|m| m.micro_usd.max(0) as u64),
            )
            .map(|c| Money {
                micro_usd: c as i64,
            });
        }
        let mut labels = HashMap::new();
        labels.insert("job_id".to_owned(), spec.job_id.clone());
        let first_llm = spec.tasks.iter().find_map(|t| match &t.kind {
            Some(Kind::Llm(l)) => Some(l),
            _ => None,
        });
        let approval = spec.approval.clone().unwrap_or_default();
        let mut tools: Vec<String> = approval.tools_allowed.clone();
        if tools.is_empty() {
            tools = spec
                .tasks
                .iter()
                .flat_map(|t| match &t.kind {
                    Some(Kind::Llm(l)) => l.tools.iter().map(|t| t.name.clone()).collect(),
                    _ => Vec::new(),
                })
                .collect();
        }
        if tools.is_empty() {
            tools.push("none".into());
        }
        let outputs = if approval.outputs_allowed.is_empty() {
            vec!["job_result".into()]
        } else {
            approval.outputs_allowed.clone()
        };
        let intent: String = [approval.intent.as_str(), spec.plan_description.as_str()]
            .into_iter()
            .find(|s| !s.trim().is_empty())
            .map_or_else(
                || format!("run job of plan {}", spec.plan_id),
                str::to_owned,
            )
            .chars()
            .take(400)
            .collect();
        let run = ap::Run {
            schema_version: "agent_run_spec/v1".into(),
            run_id: format!("run-{}", spec.job_id),
            created_by: submitted_by.to_owned(),
            target: Some(ap::Target {
                org: spec
                    .labels
                    .get("org")
                    .cloned()
                    .unwrap_or_else(|| self.inner.cfg.default_org.clone()),
                repo: spec.labels.get("repo").cloned().unwrap_or_default(),
                work_item_ids: vec![spec.job_id.clone()],
            }),
            intent,
            context_pack: Some(ap::ContextPack {
                pack_id: spec.job_id.clone(),
                hash: hash.to_owned(),
                version: "jobspec/v1".into(),
                inputs: spec.tasks.iter().map(|t| t.id.clone()).collect(),
            }),
            model: first_llm.map_or_else(|| "none".into(), |l| l.model.clone()),
            // Seed 004 requires a positive cap; jobs that spend no tokens say 1.
            max_tokens: (est.input_tokens + est.output_tokens).max(1),
            temperature: first_llm.and_then(|l| l.temperature),
            cost_estimate: Some(ap::CostEstimate {
                estimated_input_tokens: est.input_tokens,
                estimated_output_tokens: est.output_tokens,
                estimated_cost: est.cost.map(|micro_usd| Money { micro_usd }),
            }),
            tools_allowed: tools,
            outputs_allowed: outputs,
            job_id: spec.job_id.clone(),
            correlation_id: spec.correlation_id.clone(),
            ..Default::default()
        };
        // The budget and the proposal are independent: both at once.
        let budget = self
            .inner
            .clients
            .ledger
            .create_budget(CreateBudgetRequest {
                budget_id: budget_id.clone(),
                parent_id: self.parent_budget(spec),
                token_limit: b.token_budget,
                cost_limit: b.cost_limit,
                labels,
            });
        let propose = self.inner.clients.approval.propose(ap::ProposeRequest {
            run: Some(run),
            skip_policies: approval.requires_approval,
            approved_under: parent.map(|p| p.run_id.clone()).unwrap_or_default(),
        });
        let (budget, out) = tokio::join!(budget, propose);
        if let Err(e) = budget {
            // No job: withdraw the proposal made alongside.
            if let Ok(p) = &out {
                let run_id = p.run.as_ref().map(|r| r.run_id.clone()).unwrap_or_default();
                let why = "the job was not accepted: its budget could not be created";
                self.cancel_run_by_id(run_id, why, None).await;
            }
            return Err(upstream("ledger")(e));
        }
        let out = out.map_err(upstream("approval"))?;
        let run = out.run.unwrap_or_default();
        let approved = matches!(
            ap::RunStatus::try_from(run.status),
            Ok(ap::RunStatus::Approved | ap::RunStatus::Running)
        );
        let by = if out.auto_approved_by.starts_with("delegation:") {
            Some(out.auto_approved_by.clone())
        } else if !out.auto_approved_by.is_empty() {
            Some(format!("policy:{}", out.auto_approved_by))
        } else if approved {
            Some("approval".to_owned())
        } else {
            None
        };
        Ok((budget_id, run, by))
    }

    /// Checks pending jobs' runs and starts scheduled jobs that are due.
    async fn poll_approvals(&self) -> Result<(), ExecutorError> {
        let now = self.now();
        let (pending, due): (Vec<(String, String)>, Vec<String>) = {
            let st = self.lock();
            let waiting = st.waiting.iter().filter_map(|id| st.jobs.get(id));
            let (mut pending, mut due) = (Vec::new(), Vec::new());
            for e in waiting {
                match e.state() {
                    JobState::Pending if !e.job.run_id.is_empty() => {
                        pending.push((e.id().to_owned(), e.job.run_id.clone()))
                    }
                    JobState::Scheduled if self.after_approval(e.spec(), now).1 => {
                        due.push(e.id().to_owned())
                    }
                    _ => {}
                }
            }
            (pending, due)
        };
        for id in due {
            let g = {
                let mut st = self.lock();
                self.move_job(
                    &mut st,
                    &id,
                    JobState::Available,
                    Reason::InvalidArgument,
                    "",
                )
            };
            if let Ok(g) = g {
                self.durable(g).await?;
                self.spawn_driver(&id);
            }
        }
        for (job_id, run_id) in pending {
            let run = match self
                .inner
                .clients
                .approval
                .get_run(ap::GetRunRequest { run_id })
                .await
            {
                Ok(r) => r.run.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(job_id = %job_id, error = %e.message(), "cannot read approval run");
                    continue;
                }
            };
            let status = ap::RunStatus::try_from(run.status).unwrap_or(ap::RunStatus::Unspecified);
            match status {
                ap::RunStatus::Approved | ap::RunStatus::Running => {
                    let by = self.decider(&run).await;
                    let go = {
                        let mut st = self.lock();
                        let Some(entry) = st.jobs.get(&job_id) else {
                            continue;
                        };
                        if entry.state() != JobState::Pending {
                            continue;
                        }
                        self.approved(&mut st, &job_id, &by, now)?
                    };
                    self.durable(go.0).await?;
                    if go.1 {
                        self.spawn_driver(&job_id);
                    }
                }
                ap::RunStatus::Rejected | ap::RunStatus::Cancelled => {
                    let by = self.decider(&run).await;
                    let why = format!(
                        "approval run {} was {}",
                        run.run_id,
                        status
                            .as_str_name()
                            .trim_start_matches("RUN_STATUS_")
                            .to_lowercase()
                    );
                    let g = {
                        let mut st = self.lock();
                        let Some(entry) = st.jobs.get(&job_id) else {
                            continue;
                        };
                        if entry.state() != JobState::Pending {
                            continue;
                        }
                        self.record(&mut st, &job_id, "", kind::APPROVAL_DECIDED, json!({"status": status.as_str_name().trim_start_matches("RUN_STATUS_").to_lowercase(), "by": by}), None);
                        self.cancel_idle(&mut st, &job_id, Reason::ApprovalRejected, &why)?
                    };
                    self.durable(g).await?;
                    self.close_budget(&job_id).await;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Who decided a run, from its audit log (best effort, bounded). The
    /// run's status can be seen before its audit record is durable, so this
    /// follows the run's watch, which yields records once durable.
    async fn decider(&self, run: &ap::Run) -> String {
        use futures_util::StreamExt as _;
        let find = async {
            let mut events = self
                .inner
                .clients
                .approval
                .watch(ap::WatchRequest {
                    run_id: run.run_id.clone(),
                    after_sequence: 0,
                })
                .await
                .ok()?;
            while let Some(Ok(w)) = events.next().await {
                let Some(e) = w.event else { continue };
                let decided = matches!(
                    e.kind.as_str(),
                    "run.approved" | "run.auto_approved" | "run.rejected" | "run.cancelled"
                );
                if decided {
                    let data = e.data.as_ref().map(switchyard_kit::json::struct_to_json);
                    return data.and_then(|d| d["actor"].as_str().map(str::to_owned));
                }
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(5), find)
            .await
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Cancels a job that no driver runs: its waiting tasks and the job.
    fn cancel_idle(
        &self,
        st: &mut State,
        job_id: &str,
        reason: Reason,
        why: &str,
    ) -> Result<u64, ExecutorError> {
        let n = st.jobs.get(job_id).map_or(0, |e| e.job.tasks.len());
        for i in 0..n {
            let s = st.jobs.get(job_id).map(|e| e.task_state(i));
            if s.is_some_and(|s| !s.is_terminal()) {
                self.move_task(
                    st,
                    job_id,
                    i,
                    Change::to(TaskState::Cancelled).because(Reason::JobCancelled, why),
                )?;
            }
        }
        self.move_job(st, job_id, JobState::Cancelled, reason, why)
    }

    async fn close_budget(&self, job_id: &str) {
        let budget_id = self
            .lock()
            .jobs
            .get(job_id)
            .map(|e| e.job.budget_id.clone())
            .unwrap_or_default();
        if budget_id.is_empty() {
            return;
        }
        if let Err(e) = self
            .inner
            .clients
            .ledger
            .close_budget(switchyard_proto::ledger::v1::CloseBudgetRequest { budget_id })
            .await
        {
            tracing::warn!(job_id, error = %e.message(), "closing job budget");
        }
    }

    fn spawn_driver(&self, job_id: &str) {
        let ctl = {
            let mut st = self.lock();
            if st.drivers.contains_key(job_id) {
                return;
            }
            let ctl = Arc::new(Control::default());
            st.drivers.insert(job_id.to_owned(), ctl.clone());
            ctl
        };
        let me = self.clone();
        let id = job_id.to_owned();
        tokio::spawn(async move {
            me.drive(&id, ctl).await;
            me.lock().drivers.remove(&id);
            me.inner.finished.send_modify(|n| *n += 1);
        });
    }

    // ------------------------------------------------------------ reads

    /// A job as it is now.
    pub fn job(&self, job_id: &str) -> Result<Job, ExecutorError> {
        self.lock()
            .jobs
            .get(job_id)
            .map(|e| e.job.clone())
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))
    }

    /// ListJobs: newest first, filtered, paginated by job id.
    pub fn list_for(
        &self,
        req: &ListJobsRequest,
        p: &Principal,
    ) -> Result<ListJobsResponse, ExecutorError> {
        let size = switchyard_core::validate::page_size(req.page_size);
        let st = self.lock();
        let mut jobs = Vec::new();
        let mut skipping = !req.page_token.is_empty();
        let mut next = String::new();
        for (_, id) in st.order.iter().rev() {
            if skipping {
                if *id == req.page_token {
                    skipping = false;
                }
                continue;
            }
            let Some(e) = st.jobs.get(id) else { continue };
            if !p.may_see(&e.job.tenant, &e.job.submitted_by) {
                continue;
            }
            if !req.states.is_empty() && !req.states.contains(&e.job.state) {
                continue;
            }
            if !req.plan_id.is_empty() && e.spec().plan_id != req.plan_id {
                continue;
            }
            if !req.correlation_id.is_empty() && e.spec().correlation_id != req.correlation_id {
                continue;
            }
            if jobs.len() == size {
                next = jobs.last().map_or(String::new(), |j: &Job| {
                    j.spec.as_ref().map_or(String::new(), |s| s.job_id.clone())
                });
                break;
            }
            let mut j = e.job.clone();
            strip_outputs(&mut j);
            jobs.push(j);
        }
        Ok(ListJobsResponse {
            jobs,
            next_page_token: next,
        })
    }

    /// GetResult.
    pub fn result(&self, job_id: &str) -> Result<GetResultResponse, ExecutorError> {
        let st = self.lock();
        let e = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        // The job's result: the outputs of its sink tasks (no dependents), by task id.
        let mut result = serde_json::Map::new();
        for (i, t) in e.spec().tasks.iter().enumerate() {
            if e.dag.dependents(i).is_empty()
                && let Some(out) = e.output_of(&t.id)
            {
                result.insert(t.id.clone(), out);
            }
        }
        let j = &e.job;
        let ms =
            |t: &Option<prost_types::Timestamp>| t.as_ref().map(switchyard_kit::time::timestamp_ms);
        let execution_time_ms = match (ms(&j.started_at), ms(&j.finished_at)) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            (Some(a), None) => self.now().saturating_sub(a),
            _ => 0,
        };
        Ok(GetResultResponse {
            job_id: job_id.to_owned(),
            state: j.state,
            result: Some(switchyard_kit::json::json_to_value(
                &serde_json::Value::Object(result),
            )),
            tasks: j.tasks.clone(),
            cost: j.cost_so_far,
            tokens_used: j.tokens_used,
            execution_time_ms,
            reason: j.reason.clone(),
            error: j.error.clone(),
        })
    }

    /// CancelJob: stops running work, releases reservations, cancels the run.
    pub async fn cancel(
        &self,
        job_id: &str,
        why: &str,
        who: Option<OnBehalf>,
    ) -> Result<Job, ExecutorError> {
        let why = if why.is_empty() {
            "cancelled by request"
        } else {
            why
        };
        let mut finished = self.inner.finished.subscribe();
        let idle = {
            let mut st = self.lock();
            let e = st
                .jobs
                .get(job_id)
                .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
            e.state().check(JobState::Cancelled)?;
            match st.drivers.get(job_id).cloned() {
                Some(ctl) => {
                    *lock(&ctl.cancel) = Some((why.to_owned(), who.clone()));
                    ctl.wake.notify_one();
                    None
                }
                None => Some(self.cancel_idle(&mut st, job_id, Reason::JobCancelled, why)?),
            }
        };
        if let Some(g) = idle {
            self.durable(g).await?;
        }
        let driven = idle.is_none();
        if driven {
            // The driver stops its tasks (SIGTERM, grace, SIGKILL) and finishes the job.
            let limit =
                Duration::from_millis(self.inner.cfg.kill_grace_ms) + Duration::from_secs(10);
            let _ = tokio::time::timeout(limit, async {
                loop {
                    if self
                        .job(job_id)
                        .is_ok_and(|j| state::job_state(j.state).is_terminal())
                    {
                        break;
                    }
                    if finished.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
        } else {
            self.cancel_run(job_id, why, who).await;
            self.close_budget(job_id).await;
        }
        self.job(job_id)
    }

    /// Cancels the job's approval run for `who` (the person cancelling the
    /// job), or for whoever the current request or driver acts for.
    async fn cancel_run(&self, job_id: &str, why: &str, who: Option<OnBehalf>) {
        let run_id = self
            .lock()
            .jobs
            .get(job_id)
            .map(|e| e.job.run_id.clone())
            .unwrap_or_default();
        self.cancel_run_by_id(run_id, why, who).await;
    }

    async fn cancel_run_by_id(&self, run_id: String, why: &str, who: Option<OnBehalf>) {
        if run_id.is_empty() {
            return;
        }
        let call = self.inner.clients.approval.cancel(ap::CancelRequest {
            run_id,
            comment: why.to_owned(),
        });
        // A job driver acts for the submitter; the run is cancelled for the
        // person who cancelled the job.
        let done = match who {
            Some(who) => {
                let corr = switchyard_kit::context::current()
                    .map(|c| c.correlation_id)
                    .unwrap_or_else(switchyard_kit::context::new_correlation_id);
                switchyard_kit::context::scope(acting_context(&corr, who), call).await
            }
            None => call.await,
        };
        if let Err(e) = done
            && !matches!(
                switchyard_kit::error::ApiError::from(e.clone()).known_reason(),
                Some(Reason::RunTerminal)
            )
        {
            tracing::warn!(error = %e.message(), "cancelling approval run");
        }
    }

    /// Follows how far `job_id`'s events are durable.
    fn durable_to(&self, job_id: &str) -> Result<tokio::sync::watch::Receiver<u64>, ExecutorError> {
        let st = self.lock();
        let e = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        Ok(e.durable_to.subscribe())
    }

    /// Waits, without polling, until `job_id` has finished and its final
    /// event is durable (the point where WatchJob ends). `None` when the
    /// executor shuts down first.
    pub(crate) async fn until_finished(
        &self,
        job_id: &str,
    ) -> Result<Option<JobState>, ExecutorError> {
        let mut durable = self.durable_to(job_id)?;
        loop {
            {
                let st = self.lock();
                let e = st
                    .jobs
                    .get(job_id)
                    .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
                let state = e.state();
                if finished(state) && *durable.borrow_and_update() >= e.job.last_sequence {
                    return Ok(Some(state));
                }
            }
            tokio::select! {
                changed = durable.changed() => if changed.is_err() { return Ok(None) },
                _ = self.inner.shutdown.wait() => return Ok(None),
            }
        }
    }

    /// WatchJob: the job's durable events after `after`, then each new one
    /// as it becomes durable; ends after the job's final event. Running
    /// jobs' events come from memory, finished jobs' from the log.
    pub fn watch(
        &self,
        job_id: &str,
        after: u64,
    ) -> Result<
        impl futures_util::Stream<Item = Result<Event, Status>> + Send + 'static,
        ExecutorError,
    > {
        let mut durable = self.durable_to(job_id)?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let me = self.clone();
        let id = job_id.to_owned();
        tokio::spawn(async move {
            let mut sent = after;
            loop {
                let upto = *durable.borrow_and_update();
                // Under the lock: cached events, or the log positions of the rest.
                let (cached, from_log, end) = {
                    let st = me.lock();
                    let Some(e) = st.jobs.get(&id) else { return };
                    let mut cached = Vec::new();
                    let mut from_log = Vec::new();
                    for seq in sent + 1..=upto {
                        match e.cache.get(seq as usize - 1) {
                            Some(ev) => cached.push(ev.clone()),
                            None => from_log.extend(e.events.get(seq as usize - 1).copied()),
                        }
                    }
                    // The final state is a job's last event.
                    let end = finished(e.state()) && upto >= e.job.last_sequence;
                    (cached, from_log, end)
                };
                let mut batch = Vec::with_capacity(cached.len() + from_log.len());
                for g in from_log {
                    match me.inner.events.read(g - 1, g, 1) {
                        Ok(mut r) => batch.extend(r.pop().map(|(_, ev)| ev)),
                        Err(e) => {
                            let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                            return;
                        }
                    }
                }
                batch.extend(cached);
                batch.sort_by_key(|e| e.sequence);
                for ev in batch {
                    sent = sent.max(ev.sequence);
                    if tx.send(Ok(ev)).await.is_err() {
                        return;
                    }
                }
                if end {
                    return;
                }
                tokio::select! {
                    changed = durable.changed() => if changed.is_err() { return },
                    _ = me.inner.shutdown.wait() => return,
                }
            }
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}

/// Nothing more happens to a job in these states unless someone acts:
/// watch streams end there.
fn finished(s: JobState) -> bool {
    s.is_terminal() || s == JobState::Retryable
}

/// Drops captured output from list views (GetJob/GetResult carry it).
fn strip_outputs(j: &mut Job) {
    for t in &mut j.tasks {
        t.stdout.clear();
        t.stderr.clear();
        t.output = None;
    }
    if let Some(s) = &mut j.spec {
        s.files.clear();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn route_request(a: &switchyard_proto::executor::v1::AgentTask, limit: u32) -> RouteRequest {
    RouteRequest {
        capability: a.capability.clone(),
        constraints: Some(RouteConstraints {
            min_trust: a.min_trust,
            max_cost_micro_usd: a.max_cost_micro_usd,
            exclude_agents: a.exclude_agents.clone(),
            prefer_labels: HashMap::new(),
        }),
        limit,
    }
}

/// Keeps the built-in agents registered (re-registering after a lapse)
/// until shutdown, then deregisters them.
async fn keep_builtins_registered(
    registry: RegistryClient,
    spec: switchyard_proto::registry::v1::AgentSpec,
    shutdown: Shutdown,
) {
    use switchyard_proto::registry::v1::{
        DeregisterAgentRequest, HeartbeatRequest, RegisterAgentRequest,
    };
    let mut registered = false;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = shutdown.wait() => break,
            _ = tick.tick() => {}
        }
        if !registered {
            match registry
                .register_agent(RegisterAgentRequest {
                    agent: Some(spec.clone()),
                })
                .await
            {
                Ok(_) => {
                    registered = true;
                    tracing::info!(endpoint = %spec.endpoint, "built-in agents registered");
                }
                Err(e) => {
                    tracing::debug!(error = %e.message(), "registering built-in agents; will retry")
                }
            }
            continue;
        }
        if let Err(e) = registry
            .heartbeat(HeartbeatRequest {
                agent_id: spec.id.clone(),
                in_flight: 0,
            })
            .await
        {
            tracing::debug!(error = %e.message(), "built-in agents heartbeat; re-registering");
            registered = false;
        }
    }
    let _ = registry
        .deregister_agent(DeregisterAgentRequest {
            agent_id: spec.id.clone(),
        })
        .await;
}

/// A request context in which this process's calls act for `user`, keeping
/// the current trace context.
fn acting_context(correlation_id: &str, user: OnBehalf) -> switchyard_kit::context::RequestContext {
    let current = switchyard_kit::context::current();
    switchyard_kit::context::RequestContext {
        correlation_id: correlation_id.to_owned(),
        traceparent: current.and_then(|c| c.traceparent),
        principal: Some(std::sync::Arc::new(
            Principal::in_process().acting_for(user),
        )),
    }
}

/// The user a request acts for: the authenticated principal's acting
/// subject and tenant (none for a service acting for no one).
fn submitter(p: &Principal) -> Option<OnBehalf> {
    let tenant = p.tenant_scope()?;
    Some(match &p.on_behalf_of {
        Some(o) => o.clone(),
        None => OnBehalf {
            subject: p.subject.clone(),
            tenant: tenant.to_owned(),
            kind: p.kind,
        },
    })
}

impl Executor {
    /// Refuses with JOB_NOT_FOUND unless `p` may see job `job_id`: its
    /// tenant's jobs, and for submitters and agents only their own.
    fn visible(&self, p: &Principal, job_id: &str) -> Result<(), ExecutorError> {
        let st = self.lock();
        match st.jobs.get(job_id) {
            Some(e) if p.may_see(&e.job.tenant, &e.job.submitted_by) => Ok(()),
            _ => Err(ExecutorError::NotFound(job_id.into())),
        }
    }
}

#[tonic::async_trait]
impl JobService for Executor {
    async fn submit_job(
        &self,
        req: Request<SubmitJobRequest>,
    ) -> Result<Response<SubmitJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let who = submitter(&p);
        let delegation_only = !p.roles.has(switchyard_kit::auth::Role::Submitter)
            && !p.roles.has(switchyard_kit::auth::Role::Service);
        let ctx = switchyard_kit::context::current();
        let correlation = ctx
            .as_ref()
            .map(|c| c.correlation_id.clone())
            .unwrap_or_else(switchyard_kit::context::new_correlation_id);
        let traceparent = switchyard_kit::context::outgoing_traceparent();
        Ok(Response::new(
            self.submit_as(
                req.into_inner(),
                who,
                delegation_only,
                correlation,
                traceparent,
            )
            .await?,
        ))
    }

    async fn validate_job(
        &self,
        req: Request<ValidateJobRequest>,
    ) -> Result<Response<ValidateJobResponse>, Status> {
        Ok(Response::new(
            Executor::validate_job(self, req.into_inner()).await?,
        ))
    }

    async fn get_job(
        &self,
        req: Request<GetJobRequest>,
    ) -> Result<Response<GetJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.visible(&p, &req.get_ref().job_id)?;
        let job = self.job(&req.get_ref().job_id)?;
        Ok(Response::new(GetJobResponse { job: Some(job) }))
    }

    async fn list_jobs(
        &self,
        req: Request<ListJobsRequest>,
    ) -> Result<Response<ListJobsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(self.list_for(req.get_ref(), &p)?))
    }

    type WatchJobStream =
        futures_util::stream::BoxStream<'static, Result<WatchJobResponse, Status>>;

    async fn watch_job(
        &self,
        req: Request<WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.visible(&p, &req.get_ref().job_id)?;
        let r = req.into_inner();
        let s = self.watch(&r.job_id, r.after_sequence)?;
        Ok(Response::new(Box::pin(s.map(|e| {
            e.map(|event| WatchJobResponse { event: Some(event) })
        }))))
    }

    async fn cancel_job(
        &self,
        req: Request<CancelJobRequest>,
    ) -> Result<Response<CancelJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.visible(&p, &req.get_ref().job_id)?;
        let who = submitter(&p);
        let r = req.into_inner();
        let job = self.cancel(&r.job_id, &r.reason, who).await?;
        Ok(Response::new(CancelJobResponse { job: Some(job) }))
    }

    async fn get_result(
        &self,
        req: Request<GetResultRequest>,
    ) -> Result<Response<GetResultResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.visible(&p, &req.get_ref().job_id)?;
        Ok(Response::new(self.result(&req.get_ref().job_id)?))
    }
}

switchyard_kit::service_client! {
    /// Executor client, in-process or remote.
    pub ExecutorClient {
        local: Executor as JobService,
        remote: JobServiceClient,
        unary {
            /// SubmitJob.
            submit_job(SubmitJobRequest) -> SubmitJobResponse;
            /// ValidateJob.
            validate_job(ValidateJobRequest) -> ValidateJobResponse;
            /// GetJob.
            get_job(GetJobRequest) -> GetJobResponse;
            /// ListJobs.
            list_jobs(ListJobsRequest) -> ListJobsResponse;
            /// CancelJob.
            cancel_job(CancelJobRequest) -> CancelJobResponse;
            /// GetResult.
            get_result(GetResultRequest) -> GetResultResponse;
        }
        streaming {
            /// WatchJob.
            watch_job(WatchJobRequest) -> WatchJobResponse;
        }
    }
}

use switchyard_proto::executor::v1::job_service_client::JobServiceClient;

#[cfg(test)]
mod tests;
