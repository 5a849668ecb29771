//! Running one job: claim its approval run, then schedule its DAG — start
//! tasks whose dependencies succeeded, up to the job's parallelism; retry
//! with backoff; apply fallback strategies; fail fast; finish the job and
//! its run. Every decision is an event (see [`crate::state`]) made durable
//! before the next side effect depends on it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use switchyard_core::Reason;
use switchyard_core::backoff::{Backoff, Strategy};
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_core::template;
use switchyard_kit::context::{self, RequestContext};
use switchyard_kit::error::ApiError;
use switchyard_kit::json::{json_to_struct, struct_to_json};
use switchyard_proto::agent::v1::invoke_response::Message;
use switchyard_proto::agent::v1::{
    AgentResponse, InvocationContext, InvokeRequest, Limits as AgentLimits, ResponseStatus,
};
use switchyard_proto::approval::v1 as ap;
use switchyard_proto::common::v1::{CorrelationContext, Money, UnitPrice};
use switchyard_proto::executor::v1::{
    AgentTask, BackoffStrategy, CommandTask, FallbackStrategy as FS, ResourceLimits, TaskSpec,
    TaskStatus, task_spec::Kind,
};
use switchyard_proto::ledger::v1::{CommitRequest, Entry, ReleaseRequest, ReserveRequest};
use switchyard_proto::registry::v1::ReportOutcomeRequest;
use switchyard_proto::router::v1::Candidate;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::command::Confinement;
use crate::state::kind;
use crate::{AgentClient, Change, Control, Executor, ExecutorError, command, lock};

/// How an attempt failed, which decides what happens next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The budget refused: on_cost_exceeded.
    Budget,
    /// The attempt timed out: on_timeout.
    Timeout,
    /// No agent offers the capability: on_capability_unavailable.
    Unavailable,
    /// Retrying cannot help (bad template, no LLM provider).
    Permanent,
    /// Anything else: the retry policy.
    Other,
}

/// The end of one attempt.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) failure: Option<(Class, Reason, String)>,
    /// Outputs to keep (also for failed attempts: partial results).
    pub(crate) status: Option<TaskStatus>,
}

impl Outcome {
    pub(crate) fn ok(status: TaskStatus) -> Self {
        Outcome {
            failure: None,
            status: Some(status),
        }
    }

    pub(crate) fn fail(class: Class, reason: Reason, error: impl Into<String>) -> Self {
        Outcome {
            failure: Some((class, reason, error.into())),
            status: None,
        }
    }
}

/// A command ready to start.
pub(crate) struct Prepared {
    /// The program file (resolved at start-up).
    pub(crate) program: std::path::PathBuf,
    /// Its resource limits.
    pub(crate) limits: command::limits::ResourceLimits,
    /// What confines it.
    pub(crate) jail: Confinement,
}

/// What an attempt needs from the job, read once under the lock.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) task: TaskSpec,
    pub(crate) job_input: Value,
    pub(crate) outputs: HashMap<String, Value>,
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) budget_id: String,
    pub(crate) token_budget: Option<u64>,
    pub(crate) correlation_id: String,
    pub(crate) delegation_depth: u32,
    pub(crate) attempt: u32,
    /// Log position of the attempt's start: nothing with an effect outside
    /// the executor happens before it is durable.
    pub(crate) start_g: u64,
    /// Empty for the task itself; `/tool/<call id>` for a call an LLM task
    /// makes to an agent, so its idempotency keys are its own.
    pub(crate) scope: String,
}

impl Snapshot {
    /// The snapshot of an agent call made as LLM tool call `call_id`.
    pub(crate) fn clone_for_call(&self, call_id: &str) -> Snapshot {
        Snapshot {
            scope: format!("{}/tool/{call_id}", self.scope),
            ..self.clone()
        }
    }
}

/// One scheduling step: the last event, the next timer, whether every task
/// is final, and the attempts to start.
struct Step {
    g: u64,
    next_wake: Option<u64>,
    done: bool,
    starts: Vec<(usize, Snapshot, Duration)>,
}

/// Claim outcome.
enum Claimed {
    Yes,
    /// The job was cancelled, or its run ended, meanwhile (why, by whom).
    Gone(String, Option<switchyard_kit::auth::OnBehalf>),
    /// The process is stopping.
    Stopping,
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn unit_random() -> f64 {
    (uuid::Uuid::new_v4().as_u128() >> 75) as f64 / (1u64 << 53) as f64
}

impl Executor {
    /// Runs a job to its end (or until shutdown), inside its own trace.
    pub(crate) async fn drive(&self, job_id: &str, ctl: Arc<Control>) {
        let (correlation_id, traceparent, submitter) = {
            let st = self.lock();
            match st.jobs.get(job_id) {
                Some(e) => (
                    e.spec().correlation_id.clone(),
                    e.traceparent.clone(),
                    e.submitter(),
                ),
                None => return,
            }
        };
        let span = tracing::info_span!("executor.job", otel.name = "executor.job", job_id, correlation_id = %correlation_id);
        switchyard_kit::context::continue_trace(&span, &traceparent);
        let ctx = RequestContext {
            correlation_id,
            traceparent: (!traceparent.is_empty()).then_some(traceparent),
            // The driver's calls act for the job's submitter.
            principal: Some(std::sync::Arc::new(
                switchyard_kit::auth::Principal::in_process().acting_for(submitter),
            )),
        };
        let run = async {
            if let Err(e) = self.run_job(job_id, &ctl).await {
                tracing::error!(job_id, error = %e, "job driver stopped");
            }
        };
        context::scope(ctx, run.instrument(span)).await;
    }

    /// Renews this worker's claim on the job's approval run.
    async fn renew(&self, run_id: &str) -> Result<ap::RenewClaimResponse, tonic::Status> {
        let cfg = &self.inner.cfg;
        self.inner
            .clients
            .approval
            .renew_claim(ap::RenewClaimRequest {
                run_id: run_id.into(),
                worker_id: cfg.worker_id.clone(),
                lease_secs: cfg.lease_secs,
            })
            .await
    }

    async fn claim(&self, run_id: &str, ctl: &Control) -> Claimed {
        let cfg = &self.inner.cfg;
        let approval = &self.inner.clients.approval;
        loop {
            if self.inner.shutdown.is_shutdown() {
                return Claimed::Stopping;
            }
            let cancel = lock(&ctl.cancel).clone();
            if let Some((why, who)) = cancel {
                return Claimed::Gone(why, who);
            }
            let claimed = approval
                .claim(ap::ClaimRequest {
                    run_id: run_id.into(),
                    worker_id: cfg.worker_id.clone(),
                    lease_secs: cfg.lease_secs,
                })
                .await;
            let err = match claimed {
                Ok(_) => return Claimed::Yes,
                Err(e) => ApiError::from(e),
            };
            match err.known_reason() {
                // Already running: ours from before a restart, if the lease holds.
                Some(Reason::TransitionNotAllowed | Reason::RunAlreadyInStatus) => {
                    if self.renew(run_id).await.is_ok() {
                        return Claimed::Yes;
                    }
                }
                Some(Reason::RunTerminal) => {
                    return Claimed::Gone(
                        format!("approval run {run_id} ended: {}", err.message),
                        None,
                    );
                }
                // A lapsed lease scheduled a retry; wait for it.
                Some(Reason::RunNotDue | Reason::ClaimNotHeld) => {}
                _ => {
                    tracing::warn!(run_id, error = %err.message, "claiming approval run; will retry")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = ctl.wake.notified() => {}
                _ = self.inner.shutdown.wait() => {}
            }
        }
    }

    async fn run_job(&self, job_id: &str, ctl: &Control) -> Result<(), ExecutorError> {
        let run_id = self.job(job_id)?.run_id;
        match self.claim(&run_id, ctl).await {
            Claimed::Yes => {}
            Claimed::Stopping => return Ok(()),
            Claimed::Gone(why, who) => {
                let g = {
                    let mut st = self.lock();
                    self.cancel_idle(&mut st, job_id, Reason::JobCancelled, &why)?
                };
                self.durable(g).await?;
                self.cancel_run(job_id, &why, who).await;
                self.close_budget(job_id).await;
                return Ok(());
            }
        }
        // Start, or resume after a restart: attempts that were running run
        // again. Made durable with the first scheduling step, before anything starts.
        let stale = {
            let mut st = self.lock();
            let entry = st
                .jobs
                .get(job_id)
                .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
            let n = entry.job.tasks.len();
            let stale: Vec<(String, String)> = entry
                .open_reservations
                .iter()
                .map(|(r, t)| (r.clone(), t.clone()))
                .collect();
            if entry.state() == JobState::Available {
                self.move_job(
                    &mut st,
                    job_id,
                    JobState::Active,
                    Reason::InvalidArgument,
                    "",
                )?;
            }
            for i in 0..n {
                if st
                    .jobs
                    .get(job_id)
                    .is_some_and(|e| e.task_state(i) == TaskState::Running)
                {
                    self.move_task(
                        &mut st,
                        job_id,
                        i,
                        Change::to(TaskState::Ready).because(
                            Reason::Unavailable,
                            "the executor restarted during this attempt; running it again",
                        ),
                    )?;
                }
            }
            stale
        };
        for (rid, task) in stale {
            self.release(job_id, &task, &rid, "reconciled after restart")
                .await;
        }
        let scratch = self.inner.cfg.scratch_dir.join(job_id);
        self.prepare_scratch(job_id, &scratch).await?;
        let result = self.schedule(job_id, &run_id, ctl, &scratch).await;
        if !self.inner.shutdown.is_shutdown() {
            let _ = std::fs::remove_dir_all(&scratch);
        }
        result
    }

    async fn prepare_scratch(
        &self,
        job_id: &str,
        dir: &std::path::Path,
    ) -> Result<(), ExecutorError> {
        let files = self
            .lock()
            .jobs
            .get(job_id)
            .map(|e| e.spec().files.clone())
            .unwrap_or_default();
        let io = |e: std::io::Error| ExecutorError::Scratch(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        let sandbox = &self.inner.sandbox;
        for (name, bytes) in files {
            let file = dir.join(name);
            std::fs::write(&file, bytes).map_err(io)?;
            sandbox.hand_over(&file).map_err(io)?;
        }
        // When tasks run as the sandbox's user (the executor is root), the
        // directory is theirs; Landlock keeps other jobs' tasks out of it.
        sandbox.hand_over(dir).map_err(io)?;
        Ok(())
    }

    /// The scheduling loop.
    async fn schedule(
        &self,
        job_id: &str,
        run_id: &str,
        ctl: &Control,
        scratch: &std::path::Path,
    ) -> Result<(), ExecutorError> {
        let cfg = &self.inner.cfg;
        let mut running: JoinSet<(usize, Outcome)> = JoinSet::new();
        let mut renew =
            tokio::time::interval(Duration::from_secs(u64::from(cfg.lease_secs / 3).max(1)));
        renew.tick().await;
        loop {
            let cancel = lock(&ctl.cancel).clone();
            if let Some((why, who)) = cancel {
                running.abort_all();
                while running.join_next().await.is_some() {}
                return self.finish_cancelled(job_id, &why, who).await;
            }
            let now = self.now();
            let Step {
                g,
                next_wake,
                done,
                starts,
            } = {
                let mut st = self.lock();
                self.advance(&mut st, job_id, now, &mut running)?
            };
            // One durable step covers the last settle and these starts: a
            // task starts only once what it depends on is on disk.
            self.durable(g).await?;
            for (i, snap, timeout) in starts {
                let me = self.clone();
                let job = job_id.to_owned();
                let dir = scratch.to_path_buf();
                running.spawn(
                    async move {
                        let out = me.attempt(&job, snap, timeout, &dir).await;
                        (i, out)
                    }
                    .in_current_span(),
                );
            }
            if done && running.is_empty() {
                return self.finish(job_id, run_id).await;
            }
            let sleep = match next_wake {
                Some(at) => Duration::from_millis(at.saturating_sub(now)),
                None => Duration::from_secs(3600),
            };
            tokio::select! {
                joined = running.join_next(), if !running.is_empty() => {
                    if let Some(Ok((i, outcome))) = joined {
                        self.settle(job_id, i, outcome)?;
                    }
                }
                _ = tokio::time::sleep(sleep) => {}
                _ = ctl.wake.notified() => {}
                _ = renew.tick() => {
                    if let Err(e) = self.renew(run_id).await {
                        tracing::warn!(job_id, error = %e.message(), "renewing approval claim");
                    }
                }
                _ = self.inner.shutdown.wait() => {
                    // Attempts stop here and run again after the restart.
                    running.abort_all();
                    while running.join_next().await.is_some() {}
                    return Ok(());
                }
            }
        }
    }

    /// One scheduling step under the lock: readiness, fail-fast, starts.
    /// Returns the last event, the next timer, and whether every task is final.
    fn advance(
        &self,
        st: &mut crate::State,
        job_id: &str,
        now: u64,
        running: &mut JoinSet<(usize, Outcome)>,
    ) -> Result<Step, ExecutorError> {
        let mut g = self.inner.events.last();
        let mut starts = Vec::new();
        let entry = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        let order: Vec<usize> = entry.dag.order().to_vec();
        let n = order.len();
        let max_parallel = entry.spec().max_parallel.max(1) as usize;
        let failed = (0..n)
            .find(|&i| entry.task_state(i) == TaskState::Failed)
            .map(|i| entry.spec().tasks[i].id.clone());
        // Readiness and fail-fast, in DAG order so skips cascade in one pass.
        for &i in &order {
            let e = st
                .jobs
                .get(job_id)
                .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
            let s = e.task_state(i);
            let deps: Vec<TaskState> = e.dag.deps(i).iter().map(|&d| e.task_state(d)).collect();
            let upstream_bad = deps.iter().any(|d| {
                matches!(
                    d,
                    TaskState::Failed | TaskState::Skipped | TaskState::Cancelled
                )
            });
            // Fail-fast: what has not started is skipped, what waits to retry stops.
            let stop = match s {
                TaskState::Waiting | TaskState::Ready if failed.is_some() || upstream_bad => {
                    Some((TaskState::Skipped, "not run"))
                }
                TaskState::Retrying | TaskState::Deferred if failed.is_some() => {
                    Some((TaskState::Cancelled, "stopped"))
                }
                _ => None,
            };
            if let Some((to, what)) = stop {
                let why = match &failed {
                    Some(id) => format!("{what}: task {id:?} failed (fail-fast)"),
                    None => format!("{what}: a task it depends on did not succeed"),
                };
                g = self.move_task(
                    st,
                    job_id,
                    i,
                    Change::to(to).because(Reason::UpstreamFailed, &why),
                )?;
                continue;
            }
            match s {
                TaskState::Waiting if deps.iter().all(|d| *d == TaskState::Succeeded) => {
                    g = self.move_task(st, job_id, i, Change::to(TaskState::Ready))?;
                }
                _ => {}
            }
        }
        if failed.is_some() && self.inner.cfg.cancel_running_on_failure {
            running.abort_all();
            for i in 0..n {
                if st
                    .jobs
                    .get(job_id)
                    .is_some_and(|e| e.task_state(i) == TaskState::Running)
                {
                    g = self.move_task(
                        st,
                        job_id,
                        i,
                        Change::to(TaskState::Cancelled)
                            .because(Reason::UpstreamFailed, "cancelled: another task failed"),
                    )?;
                }
            }
        }
        // Starts, in DAG order (priority breaks ties), up to the job's limit.
        let mut next_wake: Option<u64> = None;
        for &i in &order {
            let e = st
                .jobs
                .get(job_id)
                .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
            let t = &e.job.tasks[i];
            let s = e.task_state(i);
            let due = match s {
                TaskState::Ready => true,
                TaskState::Retrying | TaskState::Deferred => {
                    let at = t
                        .next_attempt_at
                        .as_ref()
                        .map_or(0, switchyard_kit::time::timestamp_ms);
                    if at > now {
                        next_wake = Some(next_wake.map_or(at, |w: u64| w.min(at)));
                    }
                    at <= now
                }
                _ => false,
            };
            if !due || running.len() + starts.len() >= max_parallel {
                continue;
            }
            let spec = &e.spec().tasks[i];
            let deadline = [spec.deadline.as_ref(), e.spec().deadline.as_ref()]
                .into_iter()
                .flatten()
                .map(switchyard_kit::time::timestamp_ms)
                .min();
            if deadline.is_some_and(|d| d < now) {
                let why = "the deadline passed before the task could start";
                g = self.move_task(
                    st,
                    job_id,
                    i,
                    Change::to(TaskState::Failed).because(Reason::DeadlineExceeded, why),
                )?;
                continue;
            }
            let timeout_secs = match &spec.fallback {
                Some(f) if e.extended.contains(&spec.id) && f.extended_timeout_seconds > 0 => {
                    f.extended_timeout_seconds
                }
                _ => spec.timeout_secs,
            };
            let attempt = t.attempts.len() as u32 + 1;
            let task_id = spec.id.clone();
            self.record(
                st,
                job_id,
                &task_id,
                kind::ATTEMPT,
                json!({"attempt": attempt, "timeout_secs": timeout_secs}),
                None,
            );
            g = self.move_task(st, job_id, i, Change::to(TaskState::Running))?;
            let mut snap = self.snapshot(st, job_id, i, attempt)?;
            snap.start_g = g;
            starts.push((i, snap, Duration::from_secs(u64::from(timeout_secs))));
        }
        let e = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        let done = (0..n).all(|i| e.task_state(i).is_terminal());
        Ok(Step {
            g,
            next_wake,
            done,
            starts,
        })
    }

    fn snapshot(
        &self,
        st: &crate::State,
        job_id: &str,
        i: usize,
        attempt: u32,
    ) -> Result<Snapshot, ExecutorError> {
        let e = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        let spec = e.spec();
        let task = spec.tasks[i].clone();
        let mut outputs = HashMap::new();
        for (k, t) in spec.tasks.iter().enumerate() {
            if e.dag.is_ancestor(k, i)
                && let Some(o) = e.output_of(&t.id)
            {
                outputs.insert(t.id.clone(), o);
            }
        }
        let stdin = match &task.kind {
            Some(Kind::Command(c)) if !c.stdin_from.is_empty() => e
                .index
                .get(&c.stdin_from)
                .map(|&k| e.job.tasks[k].stdout.clone()),
            _ => None,
        };
        Ok(Snapshot {
            job_input: spec
                .input
                .as_ref()
                .map(struct_to_json)
                .unwrap_or_else(|| json!({})),
            outputs,
            stdin,
            budget_id: e.job.budget_id.clone(),
            token_budget: spec.budget.as_ref().and_then(|b| b.token_budget),
            correlation_id: spec.correlation_id.clone(),
            delegation_depth: spec.delegation.as_ref().map_or(0, |d| d.depth),
            attempt,
            task,
            start_g: 0,
            scope: String::new(),
        })
    }

    /// Records an attempt's end and decides the task's next state.
    fn settle(&self, job_id: &str, i: usize, out: Outcome) -> Result<u64, ExecutorError> {
        let now = self.now();
        let mut st = self.lock();
        let e = st
            .jobs
            .get(job_id)
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        if e.task_state(i) != TaskState::Running {
            // Cancelled meanwhile.
            return Ok(self.inner.events.last());
        }
        let task = e.spec().tasks[i].clone();
        let job_deadline = e
            .spec()
            .deadline
            .as_ref()
            .map(switchyard_kit::time::timestamp_ms);
        let first_start = e.job.tasks[i]
            .started_at
            .as_ref()
            .map_or(now, switchyard_kit::time::timestamp_ms);
        let attempts = e.job.tasks[i].attempts.clone();
        let extended = e.extended.contains(&task.id);
        if let Some(status) = &out.status {
            let key = format!("{job_id}/{}", task.id);
            self.inner.outputs.put(&key, status)?;
            self.record(
                &mut st,
                job_id,
                &task.id,
                kind::RESULT,
                json!({"exit_code": status.exit_code, "agent_id": status.agent_id, "truncated": status.output_truncated,
                    "resource_limit": status.resource_limit}),
                Some(status),
            );
        }
        let Some((class, reason, error)) = out.failure else {
            return self.move_task(&mut st, job_id, i, Change::to(TaskState::Succeeded));
        };
        tracing::info!(job_id, task_id = %task.id, reason = %reason, error = %error, "attempt failed");
        let fallback = task.fallback.clone().unwrap_or_default();
        let deadline = [
            task.deadline
                .as_ref()
                .map(switchyard_kit::time::timestamp_ms),
            job_deadline,
        ]
        .into_iter()
        .flatten()
        .min();
        let fail = |st: &mut crate::State, reason: Reason, error: &str| {
            self.move_task(
                st,
                job_id,
                i,
                Change::to(TaskState::Failed).because(reason, error),
            )
        };
        let notify = |st: &mut crate::State, msg: &str| {
            if !msg.is_empty() {
                self.record(
                    st,
                    job_id,
                    &task.id,
                    kind::NOTICE,
                    json!({"message": msg}),
                    None,
                );
            }
        };
        match class {
            Class::Permanent => return fail(&mut st, reason, &error),
            Class::Budget => {
                // on_cost_exceeded: FAIL_AND_NOTIFY is the only strategy.
                let note = if fallback.notification.is_empty() {
                    "Task exceeded budget".to_owned()
                } else {
                    fallback.notification.clone()
                };
                notify(&mut st, &format!("{note}: {error}"));
                return fail(&mut st, reason, &error);
            }
            Class::Timeout if fallback.on_timeout == FS::FailAndNotify as i32 => {
                notify(&mut st, &format!("task {} timed out: {error}", task.id));
                return fail(&mut st, reason, &error);
            }
            Class::Timeout
                if fallback.on_timeout == FS::RetryWithTimeoutExtension as i32 && !extended =>
            {
                let mut c = Change::to(TaskState::Retrying)
                    .because(reason, &error)
                    .after(0);
                c.extend = true;
                return self.move_task(&mut st, job_id, i, c);
            }
            Class::Unavailable if fallback.on_capability_unavailable == FS::Defer as i32 => {
                let every = if fallback.defer_interval_seconds > 0 {
                    fallback.defer_interval_seconds
                } else {
                    self.inner.cfg.defer_interval_secs
                };
                let wait = u64::from(every) * 1000;
                let next = now + wait;
                let limit = deadline.unwrap_or(first_start + self.inner.cfg.max_defer_secs * 1000);
                if next > limit {
                    return fail(
                        &mut st,
                        Reason::DeadlineExceeded,
                        &format!("{error}; deferring again would pass the deadline"),
                    );
                }
                return self.move_task(
                    &mut st,
                    job_id,
                    i,
                    Change::to(TaskState::Deferred)
                        .because(reason, &error)
                        .after(wait),
                );
            }
            _ => {}
        }
        // The retry policy. Deferrals and the timeout extension are not retries.
        let policy = task.retry.unwrap_or_default();
        let used = attempts
            .iter()
            .filter(|a| {
                a.reason != Reason::CapabilityUnavailable.as_str() || class == Class::Unavailable
            })
            .count()
            .saturating_sub(1 + usize::from(extended)) as u32;
        if used >= policy.max_retries {
            return fail(&mut st, reason, &error);
        }
        let backoff = Backoff {
            strategy: match BackoffStrategy::try_from(policy.backoff_strategy).unwrap_or_default() {
                BackoffStrategy::Fixed => Strategy::Fixed,
                BackoffStrategy::Linear => Strategy::Linear,
                _ => Strategy::Exponential,
            },
            base: Duration::from_millis(if policy.backoff_base_ms == 0 {
                1000
            } else {
                policy.backoff_base_ms
            }),
            max: Duration::from_millis(if policy.backoff_max_ms == 0 {
                300_000
            } else {
                policy.backoff_max_ms
            }),
            jitter: policy.jitter,
        };
        let delay = millis(backoff.delay(used + 1, unit_random()));
        if deadline.is_some_and(|d| now + delay > d) {
            return fail(
                &mut st,
                Reason::DeadlineExceeded,
                &format!("{error}; the next retry would pass the deadline"),
            );
        }
        self.move_task(
            &mut st,
            job_id,
            i,
            Change::to(TaskState::Retrying)
                .because(reason, &error)
                .after(delay),
        )
    }

    /// Every task is final: the job ends, and so does its approval run.
    /// Waits for the job's background releases, so its final state stays
    /// its last event.
    async fn settled(&self, job_id: &str) {
        let pending = lock(&self.inner.settling)
            .remove(job_id)
            .unwrap_or_default();
        for h in pending {
            let _ = h.await;
        }
    }

    async fn finish(&self, job_id: &str, run_id: &str) -> Result<(), ExecutorError> {
        self.settled(job_id).await;
        let (to, reason, error) = {
            let st = self.lock();
            let e = st
                .jobs
                .get(job_id)
                .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
            let failed: Vec<(String, String, String)> = e
                .job
                .tasks
                .iter()
                .filter(|t| crate::state::task_state(t.state) == TaskState::Failed)
                .map(|t| (t.task_id.clone(), t.reason.clone(), t.error.clone()))
                .collect();
            let (to, reason, error) = match failed.first() {
                None => (JobState::Completed, Reason::InvalidArgument, String::new()),
                Some((id, reason, error)) => {
                    let r = Reason::parse(reason).unwrap_or(Reason::Internal);
                    // Seed 000: a job stopped by its token budget may be retried.
                    let to = if r == Reason::AgentTokenBudgetExceeded {
                        JobState::Retryable
                    } else {
                        JobState::Discarded
                    };
                    (to, r, format!("task {id} failed: {error}"))
                }
            };
            (to, reason, error)
        };
        // The run and the budget are settled first (both at once), so a job
        // seen finished has its run ended; after a crash in between, finishing
        // again finds the run already ended and goes on.
        let approval = &self.inner.clients.approval;
        let worker_id = self.inner.cfg.worker_id.clone();
        let end_run = async {
            if to == JobState::Completed {
                let result = self.result(job_id).map_err(|e| e.to_string())?;
                approval
                    .complete(ap::CompleteRequest {
                        run_id: run_id.into(),
                        worker_id,
                        result: Some(ap::RunResult {
                            summary: format!(
                                "job {job_id} completed in {} ms",
                                result.execution_time_ms
                            ),
                            ..Default::default()
                        }),
                    })
                    .await
                    .map(|_| ())
                    .map_err(|e| e.message().to_owned())
            } else {
                approval
                    .fail(ap::FailRequest {
                        run_id: run_id.into(),
                        worker_id,
                        last_error: error.clone(),
                        retryable: false,
                    })
                    .await
                    .map(|_| ())
                    .map_err(|e| e.message().to_owned())
            }
        };
        let (ended, ()) = tokio::join!(end_run, self.close_budget(job_id));
        if let Err(e) = ended {
            tracing::warn!(job_id, error = %e, "ending approval run");
        }
        let g = {
            let mut st = self.lock();
            self.move_job(&mut st, job_id, to, reason, &error)?
        };
        self.durable(g).await?;
        Ok(())
    }

    async fn finish_cancelled(
        &self,
        job_id: &str,
        why: &str,
        who: Option<switchyard_kit::auth::OnBehalf>,
    ) -> Result<(), ExecutorError> {
        // Release first, so the job's last event is its final state.
        self.settled(job_id).await;
        let open: Vec<(String, String)> = self
            .lock()
            .jobs
            .get(job_id)
            .map(|e| {
                e.open_reservations
                    .iter()
                    .map(|(r, t)| (r.clone(), t.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for (rid, task) in open {
            self.release(job_id, &task, &rid, "job cancelled").await;
        }
        let g = {
            let mut st = self.lock();
            self.cancel_idle(&mut st, job_id, Reason::JobCancelled, why)?
        };
        self.durable(g).await?;
        self.cancel_run(job_id, why, who).await;
        self.close_budget(job_id).await;
        Ok(())
    }

    /// Releases a reservation and records it (idempotent).
    pub(crate) async fn release(
        &self,
        job_id: &str,
        task_id: &str,
        reservation_id: &str,
        why: &str,
    ) {
        let r = self
            .inner
            .clients
            .ledger
            .release(ReleaseRequest {
                reservation_id: reservation_id.into(),
                idempotency_key: format!("release-{reservation_id}"),
            })
            .await;
        match r {
            Ok(_) => {}
            // Already committed, released or expired: nothing is held.
            Err(e)
                if matches!(
                    ApiError::from(e.clone()).known_reason(),
                    Some(Reason::ReservationNotOpen | Reason::ReservationNotFound)
                ) => {}
            Err(e) => {
                tracing::warn!(job_id, reservation_id, error = %e.message(), "releasing reservation; its TTL will free it");
                return;
            }
        }
        self.event(
            job_id,
            task_id,
            kind::RELEASED,
            json!({"reservation_id": reservation_id, "why": why}),
        );
    }

    // ------------------------------------------------------------ attempts

    async fn attempt(
        &self,
        job_id: &str,
        snap: Snapshot,
        timeout: Duration,
        scratch: &std::path::Path,
    ) -> Outcome {
        let source = |t: Option<&str>| match t {
            None => Some(&snap.job_input),
            Some(id) => snap.outputs.get(id),
        };
        let kind = snap.task.kind.clone();
        match kind {
            Some(Kind::Command(c)) => {
                let mut args = Vec::with_capacity(c.args.len());
                for a in &c.args {
                    match template::resolve(&Value::String(a.clone()), &source) {
                        Ok(Value::String(s)) => args.push(s),
                        Ok(other) => args.push(other.to_string()),
                        Err(e) => {
                            return Outcome::fail(Class::Permanent, Reason::TemplateUnresolved, e);
                        }
                    }
                }
                self.command_attempt(job_id, &snap, &c, args, timeout, scratch)
                    .await
            }
            Some(Kind::Agent(a)) => {
                let input = a
                    .input
                    .as_ref()
                    .map(struct_to_json)
                    .unwrap_or_else(|| json!({}));
                let input = match template::resolve(&input, &source) {
                    Ok(v) => v,
                    Err(e) => {
                        return Outcome::fail(Class::Permanent, Reason::TemplateUnresolved, e);
                    }
                };
                self.agent_attempt(job_id, &snap, &a, input, timeout).await
            }
            Some(Kind::Llm(l)) => self.llm_attempt(job_id, &snap, &l, timeout, scratch).await,
            None => Outcome::fail(
                Class::Permanent,
                Reason::InvalidArgument,
                "task has no kind",
            ),
        }
    }

    async fn command_attempt(
        &self,
        job_id: &str,
        snap: &Snapshot,
        c: &CommandTask,
        args: Vec<String>,
        timeout: Duration,
        scratch: &std::path::Path,
    ) -> Outcome {
        let cfg = &self.inner.cfg;
        let ready = match self.prepare_command(&c.command, scratch, c.limits.as_ref()) {
            Ok(r) => r,
            Err((class, reason, e)) => return Outcome::fail(class, reason, e),
        };
        let env = self.command_env(job_id, &snap.task.id, scratch, &c.env);
        let limits = command::Limits {
            timeout,
            grace: Duration::from_millis(cfg.kill_grace_ms),
            cap: cfg.max_output_bytes,
        };
        let me = self.clone();
        let (job, task) = (job_id.to_owned(), snap.task.id.clone());
        let on_chunk = move |stream: &'static str, chunk: &[u8]| {
            me.event(
                &job,
                &task,
                kind::OUTPUT,
                json!({"stream": stream, "chunk": String::from_utf8_lossy(chunk)}),
            );
        };
        if let Err(e) = self.durable(snap.start_g).await {
            return Outcome::fail(Class::Other, Reason::StorageFailure, e.to_string());
        }
        let sandbox = &self.inner.sandbox;
        let ran = command::run(
            &ready.program,
            &c.command,
            &args,
            &env,
            scratch,
            snap.stdin.clone(),
            &limits,
            ready.jail,
            &on_chunk,
        )
        .await;
        let f = match ran {
            Ok(f) => f,
            Err(e) => return Outcome::fail(Class::Other, Reason::CommandFailed, e.to_string()),
        };
        let hit = command::limits::hit(&f);
        let status = TaskStatus {
            task_id: snap.task.id.clone(),
            stdout: f.stdout.clone(),
            stderr: f.stderr.clone(),
            exit_code: f.exit_code.or(f.signal.map(|s| 128 + s)),
            output_truncated: f.truncated,
            isolation: sandbox.isolation() as i32,
            isolation_detail: sandbox.detail(&c.command),
            resource_limit: hit.map(|l| l.name().to_owned()).unwrap_or_default(),
            ..Default::default()
        };
        let tail = |b: &[u8]| {
            let s = String::from_utf8_lossy(&b[b.len().saturating_sub(500)..])
                .trim()
                .to_owned();
            if s.is_empty() {
                String::new()
            } else {
                format!(": {s}")
            }
        };
        let failure = if let Some(l) = hit {
            Some((
                Class::Other,
                Reason::TaskResourceLimit,
                command::limits::describe(&c.command, l, &ready.limits, &f),
            ))
        } else if f.timed_out {
            Some((
                Class::Timeout,
                Reason::TaskTimeout,
                format!(
                    "{} timed out after {} s and was stopped",
                    c.command,
                    timeout.as_secs()
                ),
            ))
        } else if f.exit_code != Some(0) {
            let how = match (f.exit_code, f.signal) {
                (Some(code), _) => format!("exited with code {code}"),
                (None, Some(sig)) => format!("was killed by signal {sig}"),
                _ => "ended abnormally".to_owned(),
            };
            Some((
                Class::Other,
                Reason::CommandFailed,
                format!("{} {how}{}", c.command, tail(&f.stderr)),
            ))
        } else {
            None
        };
        Outcome {
            failure,
            status: Some(status),
        }
    }

    /// An allowlisted command made ready to start: its program as resolved
    /// at start-up, the task's resource limits, and the sandbox around it.
    pub(crate) fn prepare_command(
        &self,
        command: &str,
        scratch: &std::path::Path,
        asked: Option<&ResourceLimits>,
    ) -> Result<Prepared, (Class, Reason, String)> {
        let inner = &self.inner;
        let program = inner.programs.get(command).map_err(|e| {
            let reason = match e {
                command::program::Unrunnable::NotAllowed(_) => Reason::CommandNotAllowed,
                command::program::Unrunnable::Unusable(_) => Reason::CommandFailed,
            };
            (Class::Permanent, reason, e.to_string())
        })?;
        let limits = inner.cfg.task_limits.for_task(asked);
        let jail = inner
            .sandbox
            .confine(command, program, scratch, &limits)
            .map_err(|e| {
                let reason = match e {
                    command::ConfineError::Unavailable(_) => Reason::SandboxUnavailable,
                    command::ConfineError::Ruleset(_) => Reason::CommandFailed,
                };
                (Class::Permanent, reason, e.to_string())
            })?;
        Ok(Prepared {
            program: program.path.clone(),
            limits,
            jail,
        })
    }

    /// The whole environment a command sees: nothing inherited. HOME and
    /// TMPDIR are the scratch directory (`.` when the task's user cannot
    /// reach it by its absolute path; it starts there either way).
    pub(crate) fn command_env(
        &self,
        job_id: &str,
        task_id: &str,
        scratch: &std::path::Path,
        extra: &HashMap<String, String>,
    ) -> Vec<(String, String)> {
        let home = if self.inner.sandbox.scratch_reachable() {
            scratch.display().to_string()
        } else {
            ".".to_owned()
        };
        let mut env = vec![
            ("PATH".to_owned(), self.inner.cfg.path.clone()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            ("HOME".to_owned(), home.clone()),
            ("TMPDIR".to_owned(), home),
            ("SWITCHYARD_JOB_ID".to_owned(), job_id.to_owned()),
            ("SWITCHYARD_TASK_ID".to_owned(), task_id.to_owned()),
        ];
        let mut extra: Vec<_> = extra.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        extra.sort();
        env.extend(extra);
        env
    }

    fn agent_client(&self, endpoint: &str) -> Result<AgentClient, String> {
        if endpoint == *lock(&self.inner.local_endpoint) {
            return Ok(AgentClient::local(self.inner.local_agents.clone()));
        }
        let mut agents = lock(&self.inner.agents);
        if let Some(c) = agents.get(endpoint) {
            return Ok(c.clone());
        }
        let channel = switchyard_kit::client::lazy_channel(endpoint).map_err(|e| e.to_string())?;
        // Agents are third parties: they never get this process's credential.
        let client = AgentClient::remote(
            switchyard_kit::client::authed(channel, None),
            self.inner.max_message_bytes,
        );
        agents.insert(endpoint.to_owned(), client.clone());
        Ok(client)
    }

    /// Records an event and has it flushed in the background (shared with
    /// other flushes), so watchers see it soon without this caller waiting.
    pub(crate) fn event(&self, job_id: &str, task_id: &str, kind: &str, data: Value) {
        let g = {
            let mut st = self.lock();
            self.record(&mut st, job_id, task_id, kind, data, None)
        };
        self.flush_soon(g);
    }

    /// Asks the background flusher to make the log durable soon; one
    /// flush covers every event recorded until it starts.
    pub(crate) fn flush_soon(&self, _g: u64) {
        self.inner.flush_wanted.notify_one();
    }

    pub(crate) async fn agent_attempt(
        &self,
        job_id: &str,
        snap: &Snapshot,
        a: &AgentTask,
        input: Value,
        timeout: Duration,
    ) -> Outcome {
        let clients = &self.inner.clients;
        let task_id = snap.task.id.as_str();
        let routed = match self.route(a).await {
            Ok(r) => r,
            Err(e) => {
                return Outcome::fail(
                    Class::Other,
                    Reason::AgentUnreachable,
                    format!("router: {}", e.message()),
                );
            }
        };
        let mut candidates: Vec<Candidate> = routed.candidates;
        // prefer_agents first, keeping the router's order otherwise.
        candidates.sort_by_key(|c| !a.prefer_agents.contains(&c.agent_id));
        let shown: Vec<Value> = candidates
            .iter()
            .map(|c| {
                let b = c.breakdown.clone().unwrap_or_default();
                json!({
                    "agent_id": c.agent_id, "score": c.score, "endpoint": c.endpoint,
                    "price_per_unit_micro_usd": c.price_per_unit_micro_usd, "unit": c.unit,
                    "breakdown": {"capability_match": b.capability_match, "trust": b.trust, "latency": b.latency,
                                  "cost": b.cost, "preference": b.preference, "latency_ms": b.latency_ms,
                                  "matched_capability": b.matched_capability},
                })
            })
            .collect();
        self.event(
            job_id,
            task_id,
            kind::ROUTED,
            json!({"capability": a.capability, "candidates": shown, "filtered": routed.filtered}),
        );
        if candidates.is_empty() {
            return Outcome::fail(
                Class::Unavailable,
                Reason::CapabilityUnavailable,
                format!("no agent offers {:?} right now", a.capability),
            );
        }
        let offline_next = FS::try_from(
            snap.task
                .fallback
                .as_ref()
                .map_or(0, |f| f.on_agent_offline),
        )
        .unwrap_or(FS::Unspecified)
            != FS::FailAndNotify;
        let tokens = self.agent_tokens(snap.token_budget);
        let mut last: Option<Outcome> = None;
        for c in &candidates {
            let cost = c.price_per_unit_micro_usd;
            if let Some(limit) = &snap.task.cost_limit
                && cost > limit.micro_usd
            {
                let msg = format!(
                    "agent {} costs {cost} micro-USD per call, above the task's cost_limit of {}",
                    c.agent_id, limit.micro_usd
                );
                self.event(
                    job_id,
                    task_id,
                    kind::REFUSED,
                    json!({"refused_by": "task.cost_limit", "message": msg}),
                );
                last = Some(Outcome::fail(
                    Class::Budget,
                    Reason::AgentTokenBudgetExceeded,
                    msg,
                ));
                continue;
            }
            // A self-billing agent reserves its own model calls on the
            // budget it is given; holding tokens here too would halve it.
            let tokens = if c.bills_tokens { 0 } else { tokens };
            // Reserve the worst case first; a refusal means the call is not made.
            let reserved = clients
                .ledger
                .reserve(ReserveRequest {
                    budget_id: snap.budget_id.clone(),
                    tokens,
                    cost: Some(Money { micro_usd: cost }),
                    idempotency_key: format!(
                        "{job_id}/{task_id}/{}{}/{}",
                        snap.attempt, snap.scope, c.agent_id
                    ),
                    ttl: None,
                    context: Some(CorrelationContext {
                        correlation_id: snap.correlation_id.clone(),
                        traceparent: String::new(),
                        job_id: job_id.into(),
                        task_id: task_id.into(),
                    }),
                    note: format!("{} via {}", a.capability, c.agent_id),
                })
                .await;
            let reservation = match reserved {
                Ok(r) => r.reservation.unwrap_or_default(),
                Err(e) => {
                    let api = ApiError::from(e);
                    if api.known_reason() == Some(Reason::BudgetExceeded) {
                        let by = api.metadata.get("refused_by").cloned().unwrap_or_default();
                        self.event(job_id, task_id, kind::REFUSED, json!({"refused_by": by, "message": api.message, "tokens": tokens, "cost_micro_usd": cost}));
                        return Outcome::fail(
                            Class::Budget,
                            Reason::AgentTokenBudgetExceeded,
                            format!("the budget refused the reservation: {}", api.message),
                        );
                    }
                    return Outcome::fail(
                        Class::Other,
                        Reason::Unavailable,
                        format!("ledger: {}", api.message),
                    );
                }
            };
            let rid = reservation.reservation_id.clone();
            self.event(job_id, task_id, kind::RESERVED, json!({"reservation_id": rid, "tokens": tokens, "cost_micro_usd": cost, "agent_id": c.agent_id}));

            if let Err(e) = self.durable(snap.start_g).await {
                self.release(job_id, task_id, &rid, "storage failed").await;
                return Outcome::fail(Class::Other, Reason::StorageFailure, e.to_string());
            }
            let started = Instant::now();
            let called = self
                .call_agent(job_id, snap, a, c, &input, tokens, timeout)
                .await;
            let latency = started.elapsed();
            let report = |success: bool| {
                let registry = clients.registry.clone();
                let req = ReportOutcomeRequest {
                    agent_id: c.agent_id.clone(),
                    capability: a.capability.clone(),
                    success,
                    latency: Some(switchyard_kit::time::duration(millis(latency))),
                };
                // In-process it is a quick in-memory update; over gRPC it must
                // not hold up the task.
                match registry {
                    switchyard_registry::RegistryClient::Local(_) => {
                        let _ = futures_util::FutureExt::now_or_never(registry.report_outcome(req));
                    }
                    remote => {
                        tokio::spawn(async move {
                            let _ = remote.report_outcome(req).await;
                        });
                    }
                }
            };
            let call_event = |status: &str, error: &str| {
                self.event(job_id, task_id, kind::AGENT_CALL, json!({"agent_id": c.agent_id, "status": status, "latency_ms": millis(latency), "error": error}));
            };
            // The agent answered ERROR (or its call failed): the retry policy decides.
            let agent_error = |msg: String| {
                call_event("error", &msg);
                report(false);
                Outcome::fail(
                    Class::Other,
                    Reason::AgentError,
                    format!("agent {}: {msg}", c.agent_id),
                )
            };
            match called {
                Err(CallError::Timeout) => {
                    self.release(job_id, task_id, &rid, "agent call timed out")
                        .await;
                    call_event("timeout", "");
                    report(false);
                    return Outcome::fail(
                        Class::Timeout,
                        Reason::TaskTimeout,
                        format!(
                            "agent {} did not answer within {} s",
                            c.agent_id,
                            timeout.as_secs()
                        ),
                    );
                }
                Err(CallError::Unreachable(msg)) => {
                    self.release(job_id, task_id, &rid, "agent unreachable")
                        .await;
                    call_event("unreachable", &msg);
                    report(false);
                    last = Some(Outcome::fail(
                        Class::Other,
                        Reason::AgentUnreachable,
                        format!("agent {} is unreachable: {msg}", c.agent_id),
                    ));
                    if offline_next {
                        continue;
                    }
                    break;
                }
                Err(CallError::Failed(msg)) => {
                    self.release(job_id, task_id, &rid, "agent call failed")
                        .await;
                    return agent_error(msg);
                }
                Ok(resp) => {
                    let status = ResponseStatus::try_from(resp.status)
                        .unwrap_or(ResponseStatus::Unspecified);
                    if status == ResponseStatus::Refused {
                        self.release(job_id, task_id, &rid, "agent refused").await;
                        call_event("refused", &resp.error);
                        last = Some(Outcome::fail(
                            Class::Other,
                            Reason::AgentRefused,
                            format!(
                                "every candidate refused; last, {}: {}",
                                c.agent_id, resp.error
                            ),
                        ));
                        continue;
                    }
                    // An agent that bills its own model calls has committed
                    // them on the job budget already: record them, charge
                    // only its price here.
                    let billed = c.bills_tokens && resp.billed;
                    if billed
                        && (resp.tokens_used > 0 || resp.cost.is_some_and(|m| m.micro_usd > 0))
                    {
                        self.event(job_id, task_id, kind::BILLED, json!({"agent_id": c.agent_id, "tokens": resp.tokens_used, "cost_micro_usd": resp.cost.map_or(0, |m| m.micro_usd), "model": resp.model_used}));
                    }
                    let (used_tokens, reported) = if billed {
                        (0, 0)
                    } else {
                        (resp.tokens_used, resp.cost.map_or(0, |m| m.micro_usd))
                    };
                    // Commit what was used (server-side: the agent's report, never the client's).
                    let used_cost = reported.max(if status == ResponseStatus::Success {
                        cost
                    } else {
                        0
                    });
                    if used_tokens > 0 || used_cost > 0 {
                        let entry = Entry {
                            subtask_id: task_id.into(),
                            agent_id: c.agent_id.clone(),
                            model: resp.model_used.clone(),
                            units: 1,
                            price_per_unit: Some(UnitPrice {
                                micro_usd_per_million: cost.saturating_mul(1_000_000),
                            }),
                            ..Default::default()
                        };
                        self.commit(job_id, task_id, &rid, used_tokens, used_cost, entry)
                            .await;
                    } else {
                        // Nothing to account for: release off the task's
                        // path; the job's end waits for it.
                        let me = self.clone();
                        let (job, task, rid) = (job_id.to_owned(), task_id.to_owned(), rid.clone());
                        let h = tokio::spawn(
                            async move { me.release(&job, &task, &rid, "nothing used").await }
                                .in_current_span(),
                        );
                        lock(&self.inner.settling)
                            .entry(job_id.to_owned())
                            .or_default()
                            .push(h);
                    }
                    if status == ResponseStatus::Success {
                        call_event("success", "");
                        report(true);
                        let mut output = resp
                            .output
                            .as_ref()
                            .map(struct_to_json)
                            .unwrap_or_else(|| json!({}));
                        if let Some(o) = output.as_object_mut() {
                            for (from, to) in &a.output_mapping {
                                if let Some(v) = o.remove(from) {
                                    o.insert(to.clone(), v);
                                }
                            }
                            if !resp.content.is_empty() {
                                o.entry("content")
                                    .or_insert(Value::String(resp.content.clone()));
                            }
                        }
                        return Outcome::ok(TaskStatus {
                            task_id: task_id.into(),
                            output: json_to_struct(&output),
                            agent_id: c.agent_id.clone(),
                            ..Default::default()
                        });
                    }
                    let msg = if resp.error.is_empty() {
                        "the agent reported an error".to_owned()
                    } else {
                        resp.error.clone()
                    };
                    return agent_error(msg);
                }
            }
        }
        last.unwrap_or_else(|| {
            Outcome::fail(
                Class::Other,
                Reason::AgentError,
                "no candidate could be called",
            )
        })
    }

    /// Commits what reservation `rid` used, with its journal entry.
    pub(crate) async fn commit(
        &self,
        job_id: &str,
        task_id: &str,
        rid: &str,
        tokens: u64,
        cost: i64,
        entry: Entry,
    ) {
        let r = self
            .inner
            .clients
            .ledger
            .commit(CommitRequest {
                reservation_id: rid.into(),
                tokens,
                cost: Some(Money { micro_usd: cost }),
                entry: Some(entry),
                idempotency_key: format!("commit-{rid}"),
            })
            .await;
        match r {
            Ok(c) => {
                self.event(job_id, task_id, kind::COMMITTED, json!({"reservation_id": rid, "tokens": tokens, "cost_micro_usd": cost, "overrun": c.overrun}));
            }
            Err(e) => {
                tracing::warn!(job_id, reservation_id = rid, error = %e.message(), "commit failed; the reservation's TTL bounds the hold")
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_agent(
        &self,
        job_id: &str,
        snap: &Snapshot,
        a: &AgentTask,
        c: &Candidate,
        input: &Value,
        tokens: u64,
        timeout: Duration,
    ) -> Result<AgentResponse, CallError> {
        let client = self
            .agent_client(&c.endpoint)
            .map_err(CallError::Unreachable)?;
        let task_id = snap.task.id.as_str();
        let req = InvokeRequest {
            agent_id: c.agent_id.clone(),
            capability: a.capability.clone(),
            task: snap.task.name.clone(),
            input: json_to_struct(input),
            context: Some(InvocationContext {
                correlation: Some(CorrelationContext {
                    correlation_id: snap.correlation_id.clone(),
                    traceparent: context::outgoing_traceparent().unwrap_or_default(),
                    job_id: job_id.into(),
                    task_id: task_id.into(),
                }),
                attempt: snap.attempt,
                // Stable across retries and restarts: the agent can deduplicate.
                idempotency_key: format!("{job_id}/{task_id}{}", snap.scope),
                budget_id: snap.budget_id.clone(),
                delegation_depth: snap.delegation_depth,
                ..Default::default()
            }),
            limits: Some(AgentLimits {
                max_turns: 0,
                max_tokens: tokens,
                time_budget_ms: millis(timeout),
            }),
        };
        let call = async {
            let mut stream = client.invoke(req).await.map_err(classify)?;
            while let Some(msg) = stream.next().await {
                match msg.map_err(classify)?.message {
                    Some(Message::Progress(p)) => {
                        if !p.output_chunk.is_empty() {
                            self.event(
                                job_id,
                                task_id,
                                kind::OUTPUT,
                                json!({"stream": "agent", "chunk": p.output_chunk}),
                            );
                        }
                        if !p.message.is_empty() || p.percent.is_some() {
                            self.event(job_id, task_id, kind::AGENT_PROGRESS, json!({"agent_id": c.agent_id, "message": p.message, "percent": p.percent}));
                        }
                    }
                    Some(Message::Response(r)) => return Ok(r),
                    None => {}
                }
            }
            Err(CallError::Failed(
                "the agent ended its stream without a response".into(),
            ))
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout),
        }
    }
}

/// Why a call produced no response.
#[derive(Debug)]
enum CallError {
    Timeout,
    Unreachable(String),
    Failed(String),
}

fn classify(s: tonic::Status) -> CallError {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unimplemented => {
            CallError::Unreachable(s.message().to_owned())
        }
        tonic::Code::DeadlineExceeded => CallError::Timeout,
        _ => CallError::Failed(s.message().to_owned()),
    }
}
