//! The Switchyard executor: it accepts jobs in every seed format, gets them
//! approved and budgeted, runs their tasks as a durable DAG and streams
//! every step as events. Where each part lives:
//!
//! - [`config`] — `[executor]`; [`error`] — errors and their one status mapping;
//! - `grpc` — `JobService` over the executor;
//! - [`formats`] and [`spec`] — every seed format to one checked `JobSpec`;
//! - `admission` — estimate, approval run proposal (both pure), budget,
//!   waiting for approval;
//! - `book` — the job book: the only owner of job state and the only
//!   writer of events ([`events`], typed), answering every read; `watch`
//!   — WatchJob streams; `job` — one job's state as the replay of its
//!   events;
//! - `store` — the storage seam: `JobStore` (sled or PostgreSQL) and
//!   `Cluster` (one node, or replicas under leases), so nothing above it
//!   asks which backend it runs on;
//! - `schedule` — scheduling policy, pure: readiness, fail-fast,
//!   parallelism, deadlines, fallbacks, retries with backoff;
//! - `driver` — one task per running job, applying the scheduler's
//!   decisions; `cancel` — CancelJob and ending runs and budgets;
//! - `attempt` — one attempt per task kind (command in the sandbox, agent,
//!   LLM, queue), spending through the ledger's spend protocol;
//! - `queue` — pull workers: queue tasks offered on a board, leased,
//!   acked and nacked through `WorkerService`, fenced by attempt and owner;
//! - [`builtin`] — the built-in agents.
//!
//! Durability: a job's state is derived only from its event log; everything
//! acknowledged is durable in the job store (group commit), and a restarted
//! executor replays the log and resumes what was running. See
//! `docs/architecture.md`.

mod admission;
mod artifacts;
mod attempt;
pub mod audit;
mod book;
pub mod builtin;
mod cancel;
mod conversation;
mod creator;
mod dead_letter;
mod depend;
/// Command tasks run through the sandbox crate.
use switchyard_sandbox as command;
pub mod config;
mod driver;
pub mod error;
pub mod events;
mod explain;
pub mod formats;
mod grpc;
mod input;
mod job;
mod locate;
mod notify;
mod outbox;
mod queue;
mod relay;
mod rerun;
mod schedule;
mod spans;
pub mod spec;
mod store;
mod timetable;
mod triggers;
mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchyard_agent_sdk::AgentServer;
use switchyard_api::{AgentClient, ApprovalClient, LedgerClient, RegistryClient, RouterClient};
use switchyard_core::Clock;
use switchyard_kit::shutdown::Shutdown;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::job_service_server::JobServiceServer;
use switchyard_proto::executor::v1::{GetResultResponse, Job, WatchDetail};
use switchyard_store::Store;
use tonic::Status;

use crate::book::JobBook;
use crate::builtin::Builtins;
pub use crate::command::SandboxMode;
use crate::command::program::Programs;
use crate::command::{Policy, Sandbox};
pub use crate::config::ExecutorConfig;
pub use crate::error::ExecutorError;

/// The services the executor calls, each in-process or remote.
#[derive(Debug, Clone)]
pub struct Clients {
    /// Registry (outcomes, built-in registration, tools).
    pub registry: RegistryClient,
    /// Router (candidates).
    pub router: RouterClient,
    /// Ledger (budgets, reservations).
    pub ledger: LedgerClient,
    /// Approval (runs).
    pub approval: ApprovalClient,
    /// LLM providers and the price catalogue (`[llm]`), for LLM tasks.
    pub llm: switchyard_llm::Llm,
}

struct Inner {
    cfg: ExecutorConfig,
    book: Arc<JobBook>,
    clients: Clients,
    shutdown: Shutdown,
    /// Fired by [`Executor::drain`].
    drain: switchyard_kit::shutdown::Trigger,
    /// Draining: no attempt starts, no job is taken on.
    draining: Shutdown,
    /// Clients of agents, by endpoint.
    agents: Mutex<HashMap<String, AgentClient>>,
    /// Channels to tool providers, by endpoint.
    tool_channels: switchyard_kit::client::Channels,
    local_agents: Arc<AgentServer<Builtins>>,
    /// For A2A agents.
    a2a_http: Result<reqwest::Client, String>,
    local_endpoint: Mutex<String>,
    max_message_bytes: usize,
    /// Releases running in the background, by job.
    settling: Mutex<HashMap<String, Vec<tokio::task::JoinHandle<()>>>>,
    /// The allowlist, resolved at start-up.
    programs: Programs,
    /// How command tasks are confined.
    sandbox: Sandbox,
    /// What finished jobs must still do in other services.
    outbox: outbox::Outbox,
    /// Queue tasks offered to pull workers, and their leases.
    board: queue::Board,
    /// Artifacts' content, by address.
    artifacts: store::Content,
    /// Loop checkpoints of tool calls waiting for a person (JSON), by
    /// `<job id>/<task id>`.
    checkpoints: store::Kept<Vec<u8>>,
    /// Cancel requests already acted on here (PostgreSQL replicas).
    cancels_seen: Mutex<std::collections::HashSet<String>>,
    /// Input tasks waiting for an answer.
    inputs: input::Desk,
    /// The policy set in force: decides submissions, tool calls and
    /// handoffs in-process (the `[policy]` directory, set by the process).
    policies: switchyard_policy::Slot,
    /// Schedules and their ticks.
    timetable: timetable::Timetable,
    /// Triggers, by id.
    triggers: store::Kept<switchyard_proto::executor::v1::Trigger>,
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

impl Executor {
    /// Opens the executor on `store`, replaying its event log. Call
    /// [`Executor::start`] once the server is listening.
    pub fn open(
        cfg: ExecutorConfig,
        store: Store,
        clients: Clients,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        data_dir: &std::path::Path,
        max_message_bytes: usize,
    ) -> Result<Executor, ExecutorError> {
        let jobs = Arc::new(store::sled::SledJobs::open(&store)?);
        let stored: Arc<dyn store::JobStore> = jobs.clone();
        let seal = Self::seal(&cfg, &stored);
        // Sled's kept values are read at once: the future is ready.
        let seal = futures_util::FutureExt::now_or_never(seal).unwrap_or_else(|| {
            Err(ExecutorError::Audit(
                "the embedded store did not answer at once".into(),
            ))
        })?;
        let at = Placement {
            jobs,
            cluster: Arc::new(store::SingleNode::default()),
            seal,
            data_dir,
            replica: replica_name(),
        };
        Self::build(cfg, at, clients, clock, shutdown, max_message_bytes)
    }

    /// Opens the executor as one of N replicas sharing job tables on
    /// PostgreSQL (migrated here): it runs the jobs it claims, and answers
    /// for every job. `store` holds nothing durable on this backend.
    #[allow(clippy::too_many_arguments)]
    pub async fn open_pg(
        cfg: ExecutorConfig,
        db: switchyard_store::pg::Pg,
        clients: Clients,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        data_dir: &std::path::Path,
        max_message_bytes: usize,
    ) -> Result<Executor, ExecutorError> {
        let me = if cfg.replica_id.is_empty() {
            replica_name()
        } else {
            cfg.replica_id.clone()
        };
        let jobs =
            store::pg::PgJobs::open(db, me, cfg.job_lease_ms, clock.clone(), shutdown.clone())
                .await?;
        tracing::info!(replica = %jobs.me, "executor replica on postgres");
        let stored: Arc<dyn store::JobStore> = jobs.clone();
        let seal = Self::seal(&cfg, &stored).await?;
        let at = Placement {
            replica: jobs.me.clone(),
            jobs: jobs.clone(),
            cluster: jobs,
            seal,
            data_dir,
        };
        Self::build(cfg, at, clients, clock, shutdown, max_message_bytes)
    }

    /// The journal's seal: `cfg.audit`'s key, or the one kept in `jobs`.
    async fn seal(
        cfg: &ExecutorConfig,
        jobs: &Arc<dyn store::JobStore>,
    ) -> Result<audit::Seal, ExecutorError> {
        audit::Seal::open(
            &cfg.audit,
            store::Kept::open(jobs.clone().space(audit::KEYS))?,
            store::Kept::open(jobs.clone().space(audit::SEALS))?,
            store::Kept::open(jobs.clone().space(audit::LIVE))?,
        )
        .await
    }

    /// Migrates the executor's tables; returns how many migrations ran.
    pub async fn migrate(db: &switchyard_store::pg::Pg) -> Result<usize, ExecutorError> {
        Ok(db
            .migrate_service("executor", store::pg::MIGRATIONS)
            .await?)
    }

    fn build(
        mut cfg: ExecutorConfig,
        at: Placement<'_>,
        clients: Clients,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        max_message_bytes: usize,
    ) -> Result<Executor, ExecutorError> {
        let Placement {
            jobs,
            cluster,
            seal,
            data_dir,
            replica,
        } = at;
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
        sandbox.log(None);
        let programs = Programs::resolve(&cfg.commands, &cfg.path);
        for (name, why) in programs.unusable() {
            tracing::warn!(command = name, "allowlisted command cannot run: {why}");
        }
        let notifier = Arc::new(notify::Notifier::open(
            &cfg.notifications,
            jobs.clone().space("notifications"),
        )?);
        let book = Arc::new(JobBook::open(
            jobs.clone(),
            cluster,
            clock,
            shutdown.clone(),
            Arc::new(seal),
            notifier,
        )?);
        switchyard_kit::metrics::global().add_gauges(&book);
        let spec = builtin::spec("");
        let (drain, draining) = switchyard_kit::shutdown::channel();
        Ok(Executor {
            inner: Arc::new(Inner {
                cfg,
                book,
                clients,
                shutdown,
                drain,
                draining,
                agents: Mutex::new(HashMap::new()),
                tool_channels: Default::default(),
                local_agents: Arc::new(AgentServer::new(Builtins, &spec)),
                a2a_http: switchyard_a2a::http_client(),
                local_endpoint: Mutex::new(String::new()),
                max_message_bytes,
                settling: Mutex::new(HashMap::new()),
                programs,
                sandbox,
                outbox: outbox::Outbox::open(jobs.clone().space("outbox"))?,
                board: queue::Board::default(),
                artifacts: jobs.clone().content()?,
                checkpoints: store::Kept::open(jobs.clone().space("checkpoints"))?,
                timetable: timetable::Timetable::open(|name| jobs.clone().space(name), replica)?,
                triggers: store::Kept::open(jobs.clone().space("triggers"))?,
                cancels_seen: Mutex::new(Default::default()),
                inputs: input::Desk::default(),
                policies: switchyard_policy::Slot::default(),
            }),
        })
    }

    /// Decides with `engine` from now on.
    pub fn set_policies(&self, engine: Arc<switchyard_policy::Engine>) {
        self.inner.policies.set(engine);
    }

    /// The policy facts of what job `job_id` does for its submitter with
    /// `model` (the action, the resource and what the budget has left at
    /// that moment are the caller's to set).
    pub(crate) fn job_facts(&self, job_id: &str, model: &str) -> switchyard_policy::Facts {
        let st = self.inner.book.lock();
        let Ok(e) = st.get(job_id) else {
            return switchyard_policy::Facts::default();
        };
        let who = e.submitter();
        switchyard_policy::Facts {
            principal: switchyard_policy::Principal::of(
                who.kind.as_str(),
                &who.subject,
                &who.tenant,
            ),
            job: switchyard_policy::JobFacts {
                id: job_id.to_owned(),
                tenant: who.tenant,
                submitter: who.subject,
                labels: e
                    .spec()
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            },
            model: model.to_owned(),
            ..Default::default()
        }
    }

    /// What job `job_id`'s own budget has left now (`context.remaining`).
    pub(crate) fn job_remaining(&self, job_id: &str) -> switchyard_policy::Remaining {
        let st = self.inner.book.lock();
        st.get(job_id).map(|e| e.remaining()).unwrap_or_default()
    }

    /// What the policy set in force decides about `facts`.
    pub(crate) fn decide(&self, facts: &switchyard_policy::Facts) -> switchyard_policy::Decision {
        self.inner.policies.decide(facts)
    }

    /// The gRPC service.
    pub fn server(&self, max_message_bytes: usize) -> JobServiceServer<Executor> {
        JobServiceServer::new(self.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// The pull workers' gRPC service (`WorkerService`), to mount beside
    /// [`Executor::server`].
    pub fn worker_server(
        &self,
        max_message_bytes: usize,
    ) -> switchyard_proto::executor::v1::worker_service_server::WorkerServiceServer<Executor> {
        switchyard_proto::executor::v1::worker_service_server::WorkerServiceServer::new(
            self.clone(),
        )
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
    }

    /// The schedules' gRPC service (`ScheduleService`), to mount beside
    /// [`Executor::server`].
    pub fn schedule_server(
        &self,
        max_message_bytes: usize,
    ) -> switchyard_proto::executor::v1::schedule_service_server::ScheduleServiceServer<Executor>
    {
        switchyard_proto::executor::v1::schedule_service_server::ScheduleServiceServer::new(
            self.clone(),
        )
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
    }

    /// The triggers' gRPC service (`TriggerService`), to mount beside
    /// [`Executor::server`].
    pub fn trigger_server(
        &self,
        max_message_bytes: usize,
    ) -> switchyard_proto::executor::v1::trigger_service_server::TriggerServiceServer<Executor>
    {
        switchyard_proto::executor::v1::trigger_service_server::TriggerServiceServer::new(
            self.clone(),
        )
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes)
    }

    /// The notifications' gRPC service (`NotificationService`), to mount
    /// beside [`Executor::server`].
    pub fn notification_server(
        &self,
        max_message_bytes: usize,
    ) -> switchyard_proto::executor::v1::notification_service_server::NotificationServiceServer<
        Executor,
    > {
        switchyard_proto::executor::v1::notification_service_server::NotificationServiceServer::new(
            self.clone(),
        )
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
    /// built-in agents' registration (the SDK's keeper, as every agent
    /// host), the flusher of events nobody waits for, the approval poller,
    /// and the drivers of jobs that were running before a restart.
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
                let spec = builtin::spec(&endpoint);
                if let Err(e) =
                    switchyard_agent_sdk::keep_registered(registry, spec, shutdown).await
                {
                    tracing::error!(error = %e, "the built-in agents cannot register");
                }
            });
        }
        let book = self.inner.book.clone();
        tokio::spawn(async move { book.flush_in_background().await });
        let me = self.clone();
        tokio::spawn(async move { me.deliver_in_background().await });
        let me = self.clone();
        self.inner.shutdown.spawn_every(
            Duration::from_millis(self.inner.cfg.approval_poll_ms),
            "executor approval poll",
            move || {
                let me = me.clone();
                async move { me.poll_approvals().await }
            },
        );
        let me = self.clone();
        self.inner.shutdown.spawn_every(
            Duration::from_millis(self.inner.cfg.schedule_poll_ms),
            "executor schedules",
            move || {
                let me = me.clone();
                async move { me.fire_due().await }
            },
        );
        if self.inner.book.notifier.active() {
            let me = self.clone();
            tokio::spawn(async move {
                loop {
                    if let Err(e) = me.deliver_notifications().await {
                        tracing::warn!(error = %e, "delivering notifications; trying again");
                    }
                    tokio::select! {
                        _ = me.notification_wake(NOTIFY_EVERY) => {}
                        _ = me.inner.shutdown.wait() => return,
                    }
                }
            });
        }
        let book = self.inner.book.clone();
        self.inner
            .shutdown
            .spawn_every(CHECKPOINT_EVERY, "executor checkpoint", move || {
                let book = book.clone();
                async move { book.checkpoint().map(|_| ()) }
            });
        let every = self.inner.cfg.audit.checkpoint_ms;
        if every > 0 {
            let me = self.clone();
            self.inner.shutdown.spawn_every(
                Duration::from_millis(every),
                "executor journal checkpoints",
                move || {
                    let me = me.clone();
                    async move { me.checkpoint_journals().await }
                },
            );
        }
        let retention_ms = self.inner.cfg.retention_secs.saturating_mul(1000);
        if retention_ms > 0 {
            let me = self.clone();
            self.inner.shutdown.spawn_every(
                Duration::from_secs(self.inner.cfg.prune_interval_secs),
                "executor prune",
                move || {
                    let me = me.clone();
                    async move {
                        // On PostgreSQL one replica prunes for all.
                        if !me.maintains().await {
                            return Ok(());
                        }
                        me.prune(retention_ms, None).await.map(|_| ())
                    }
                },
            );
        }
        self.inner.book.cluster.clone().start(self);
    }

    /// Resumes the jobs that were running here before a restart (one
    /// node: it holds every job it stored).
    pub(crate) fn resume_held(&self) {
        let active = [
            switchyard_core::lifecycle::JobState::Available,
            switchyard_core::lifecycle::JobState::Active,
            switchyard_core::lifecycle::JobState::BudgetPaused,
        ];
        let resume = self.inner.book.lock().in_states(&active);
        for id in resume {
            tracing::info!(job_id = %id, "resuming job after restart");
            self.spawn_driver(&id);
        }
    }

    /// Flushes storage (shutdown), with a fresh replay checkpoint.
    pub fn flush(&self) -> Result<(), ExecutorError> {
        self.inner.book.flush()
    }

    /// Whether [`Executor::drain`] has begun.
    pub(crate) fn draining(&self) -> bool {
        self.inner.draining.is_shutdown()
    }

    /// The first step of stopping, before the services stop: no attempt
    /// starts and no job is taken on any more; running attempts get up to
    /// the configured `drain_grace_ms` to end, their outcomes recorded as
    /// usual; a job with nothing left running is handed back (on
    /// PostgreSQL to another replica at once, on sled to the next start).
    /// Returns how many jobs still had attempts running when the grace ran
    /// out (shutdown then stops them, to run again).
    pub async fn drain(&self) -> usize {
        self.inner.drain.fire();
        let grace = Duration::from_millis(self.inner.cfg.drain_grace_ms);
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let left = self.inner.book.lock().drivers.len();
            if left == 0 {
                return 0;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    jobs = left,
                    grace_ms = self.inner.cfg.drain_grace_ms,
                    "drain grace over with attempts still running; they stop now and run again (executor.drain_grace_ms)"
                );
                return left;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the last batch and the hand-back of running jobs where
    /// they are shared (shutdown); nothing to wait for on one node.
    pub async fn close(&self) {
        self.inner.book.cluster.closed().await;
    }

    /// Removes the jobs (of `tenant`, when given) that finished more than
    /// `older_than_ms` ago: their records, outputs and events (never anything
    /// of a job still running or waiting). Returns how many jobs and log
    /// records went.
    pub async fn prune(
        &self,
        older_than_ms: u64,
        tenant: Option<&str>,
    ) -> Result<(u64, u64), ExecutorError> {
        let cutoff = self.inner.book.now().saturating_sub(older_than_ms);
        let (jobs, records) = self.inner.book.prune(cutoff, tenant).await?;
        if jobs > 0 || records > 0 {
            tracing::info!(jobs, records, "pruned finished jobs past their retention");
        }
        Ok((jobs, records))
    }

    /// A job as it is now.
    pub async fn job(&self, job_id: &str) -> Result<Job, ExecutorError> {
        self.inner.book.job(job_id).await
    }

    /// GetResult.
    pub async fn result(&self, job_id: &str) -> Result<GetResultResponse, ExecutorError> {
        self.inner.book.result(job_id).await
    }

    /// GetResult once `job_id` has ended and its final event is durable,
    /// waiting up to `wait` (cut to the caller's deadline) for that; `None`
    /// when it has not ended by then
    /// (or the executor is shutting down).
    pub async fn result_within(
        &self,
        job_id: &str,
        wait: Duration,
    ) -> Result<Option<GetResultResponse>, ExecutorError> {
        // Cut to the caller's deadline (less a margin to answer in) as the
        // wait begins, not when the request arrived: what came before it
        // (a submission's admission) has used part of the deadline.
        let wait = switchyard_kit::context::wait_within_deadline(wait);
        let ended =
            match tokio::time::timeout(wait, watch::until_finished(&self.inner.book, job_id)).await
            {
                Ok(state) => state?.is_some(),
                Err(_) => false,
            };
        Ok(if ended {
            Some(self.result(job_id).await?)
        } else {
            None
        })
    }

    /// WatchJob: the job's durable events after `after` at `detail`, then
    /// each new one as it becomes durable; ends after the job's final event.
    /// The caller checks first that the job exists and is visible (as
    /// `WatchJob` does).
    pub fn watch(
        &self,
        job_id: &str,
        after: u64,
        detail: WatchDetail,
    ) -> impl futures_util::Stream<Item = Result<Event, Status>> + Send + 'static {
        let rx = watch::Watch::start(self.inner.book.clone(), job_id, after, detail);
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

/// Where the executor keeps its jobs and who else runs them.
struct Placement<'a> {
    jobs: Arc<dyn store::JobStore>,
    cluster: Arc<dyn store::Cluster>,
    /// The journal's signing key and seals.
    seal: audit::Seal,
    /// Where scratch directories go by default.
    data_dir: &'a std::path::Path,
    /// This process's replica name.
    replica: String,
}

/// A replica name unique to this process start: host, process id and a
/// random suffix.
fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "executor".into());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &random[..8])
}

/// How often the replay checkpoint moves forward.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

/// How often due webhook deliveries (retries) are looked for, besides
/// being woken by a new one.
const NOTIFY_EVERY: Duration = Duration::from_millis(250);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
