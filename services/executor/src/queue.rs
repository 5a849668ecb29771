//! Pull workers: queue tasks wait on the [`Board`] until a worker leases
//! them through `WorkerService` (Fetch, Ack, Nack, Heartbeat).
//!
//! A queue task's attempt ([`crate::attempt`]'s `queue`) offers the task on
//! the board and waits. Fetch takes offers — queues in the order asked,
//! then the job's priority (higher first), then first come first served —
//! records each lease as the attempt's start (`task.attempt` with the
//! worker), makes it durable and only then answers. The attempt then waits
//! for the lease holder's Ack or Nack, for the lease to lapse (no heartbeat
//! within its visibility timeout), or for the task's timeout. Ack and Nack
//! answer once their outcome is durable.
//!
//! Fencing: the board holds one lease per task, with its attempt number and
//! owner. An Ack, Nack or Heartbeat for any other (attempt, owner) — a
//! lapsed lease, a re-leased task, a cancelled one — is refused with
//! `LEASE_LOST` and changes nothing. The board is memory: after a restart
//! every running attempt runs again (the driver's resume), so leases from
//! before it are lost and their holders are told so.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use switchyard_core::Reason;
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_kit::auth::Principal;
use switchyard_kit::error::invalid_field;
use switchyard_proto::executor::v1::{
    AckRequest, AckResponse, FetchRequest, FetchResponse, HeartbeatRequest, HeartbeatResponse, Job,
    LeasedTask, NackRequest, NackResponse, SetWorkerStateRequest, SetWorkerStateResponse, TaskRef,
    WorkerError, WorkerState, task_spec::Kind,
};
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use crate::Executor;
use crate::events::{self, JobEvent};

/// Most tasks one Fetch leases.
const MAX_FETCH: u32 = 100;
/// What a worker reported for a lease, handed to the waiting attempt.
#[derive(Debug)]
pub(crate) enum Report {
    /// Ack: the result.
    Ack(serde_json::Value),
    /// Nack: the error, and whether the task is handed back untried.
    Nack(WorkerError, bool),
}

/// What reaches a waiting attempt.
#[derive(Debug)]
pub(crate) enum Signal {
    /// A worker leased it; the lease is durable.
    Leased,
    /// The lease holder reported; `settled` is answered once the outcome
    /// is durable.
    Reported(Report, oneshot::Sender<()>),
}

/// One offered task.
#[derive(Debug)]
struct Offer {
    job_id: String,
    /// The job's tenant: only its workers lease it.
    tenant: String,
    task_id: String,
    /// Attempt number its lease will start.
    attempt: u32,
    visibility_ms: u64,
    to_attempt: mpsc::UnboundedSender<Signal>,
}

/// One lease.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) worker_id: String,
    pub(crate) attempt: u32,
    /// Ends then (ms since the epoch) unless extended.
    pub(crate) expires_ms: u64,
    visibility_ms: u64,
    to_attempt: mpsc::UnboundedSender<Signal>,
}

#[derive(Debug, Default)]
struct State {
    seq: u64,
    /// Offers by queue, ordered by (−priority, arrival).
    waiting: HashMap<String, BTreeMap<(i64, u64), Offer>>,
    /// Where each offered task sits: (queue, key).
    offered: HashMap<(String, String), (String, (i64, u64))>,
    leases: HashMap<(String, String), Lease>,
    workers: HashMap<String, WorkerState>,
}

/// The queues of offered tasks, the leases and the workers' states.
#[derive(Debug, Default)]
pub(crate) struct Board {
    state: Mutex<State>,
    /// Wakes fetchers long-polling for work.
    offered: tokio::sync::Notify,
}

/// Withdraws its task from the board when the attempt ends (or is aborted
/// by a cancel or shutdown), so no worker can lease or report on it after.
pub(crate) struct OnBoard<'a> {
    board: &'a Board,
    key: (String, String),
}

impl Drop for OnBoard<'_> {
    fn drop(&mut self) {
        let mut st = crate::lock(&self.board.state);
        if let Some((queue, k)) = st.offered.remove(&self.key)
            && let Some(q) = st.waiting.get_mut(&queue)
        {
            q.remove(&k);
        }
        st.leases.remove(&self.key);
    }
}

impl Board {
    /// Takes the lease `(job, task, attempt)` from `worker_id`, fenced;
    /// `None` when no lease of the task is held.
    fn take(
        &self,
        job_id: &str,
        task_id: &str,
        attempt: u32,
        worker_id: &str,
    ) -> Option<Result<Lease, Status>> {
        let key = (job_id.to_owned(), task_id.to_owned());
        let mut st = crate::lock(&self.state);
        let l = st.leases.get(&key)?;
        if !worker_id.is_empty() && l.worker_id != worker_id {
            return Some(Err(lease_lost(
                job_id,
                &format!("worker {:?} holds it", l.worker_id),
            )));
        }
        if attempt != 0 && l.attempt != attempt {
            return Some(Err(lease_lost(
                job_id,
                &format!(
                    "attempt {attempt} ended; attempt {} holds it now",
                    l.attempt
                ),
            )));
        }
        st.leases.remove(&key).map(Ok)
    }

    /// Offers task `task_id` of `job_id` (attempt `attempt`) on `queue`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn offer(
        &self,
        queue: &str,
        priority: i32,
        tenant: &str,
        job_id: &str,
        task_id: &str,
        attempt: u32,
        visibility_ms: u64,
        to_attempt: mpsc::UnboundedSender<Signal>,
    ) -> OnBoard<'_> {
        let key = (job_id.to_owned(), task_id.to_owned());
        let mut st = crate::lock(&self.state);
        st.seq += 1;
        let k = (-i64::from(priority), st.seq);
        st.waiting.entry(queue.to_owned()).or_default().insert(
            k,
            Offer {
                job_id: job_id.to_owned(),
                tenant: tenant.to_owned(),
                task_id: task_id.to_owned(),
                attempt,
                visibility_ms,
                to_attempt,
            },
        );
        st.offered.insert(key.clone(), (queue.to_owned(), k));
        drop(st);
        self.offered.notify_waiters();
        OnBoard { board: self, key }
    }

    /// Waits, up to `limit`, until one of `tasks` of job `job_id` is
    /// offered or leased: a queue job answered as available is then there
    /// for the next fetch (its driver offers it moments after submission).
    pub(crate) async fn wait_offered(
        &self,
        job_id: &str,
        tasks: &[String],
        limit: std::time::Duration,
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let offered = self.offered.notified();
            tokio::pin!(offered);
            offered.as_mut().enable();
            let there = {
                let st = crate::lock(&self.state);
                tasks.iter().any(|t| {
                    let key = (job_id.to_owned(), t.clone());
                    st.offered.contains_key(&key) || st.leases.contains_key(&key)
                })
            };
            if there || tokio::time::timeout_at(deadline, offered).await.is_err() {
                return;
            }
        }
    }

    /// The lease of a task, if any: (owner, attempt, expiry).
    pub(crate) fn lease_of(&self, job_id: &str, task_id: &str) -> Option<(String, u32, u64)> {
        let st = crate::lock(&self.state);
        st.leases
            .get(&(job_id.to_owned(), task_id.to_owned()))
            .map(|l| (l.worker_id.clone(), l.attempt, l.expires_ms))
    }

    /// Ends a lease from the attempt's side (lapsed, timed out), unless it
    /// was already reported on. True when it was still held.
    pub(crate) fn end_lease(&self, job_id: &str, task_id: &str, attempt: u32) -> bool {
        let mut st = crate::lock(&self.state);
        let key = (job_id.to_owned(), task_id.to_owned());
        if st.leases.get(&key).is_some_and(|l| l.attempt == attempt) {
            st.leases.remove(&key);
            return true;
        }
        false
    }

    fn worker_state(st: &State, worker_id: &str) -> WorkerState {
        st.workers
            .get(worker_id)
            .copied()
            .unwrap_or(WorkerState::Running)
    }
}

/// A refusal of the worker protocol.
fn refuse(code: Code, reason: Reason, message: String) -> Status {
    switchyard_kit::error::status(code, reason, message)
}

fn lease_lost(job_id: &str, why: &str) -> Status {
    refuse(
        Code::FailedPrecondition,
        Reason::LeaseLost,
        format!(
            "the lease on job {job_id} is not yours: {why}; stop working on it (its ack or nack changes nothing) and fetch again"
        ),
    )
}

fn millis(d: Option<&prost_types::Duration>) -> Option<u64> {
    d.map(|d| switchyard_kit::time::duration_ms(d) as u64)
        .filter(|ms| *ms > 0)
}

/// True for a job whose every task is a queue task: its state follows its
/// leases (available until a worker first leases it).
pub(crate) fn queue_job(spec: &switchyard_proto::executor::v1::JobSpec) -> bool {
    !spec.tasks.is_empty()
        && spec
            .tasks
            .iter()
            .all(|t| matches!(t.kind, Some(Kind::Queue(_))))
}

impl Executor {
    /// Fetch: leases up to `count` offers for `p`'s worker.
    pub(crate) async fn fetch(
        &self,
        p: &Principal,
        req: FetchRequest,
    ) -> Result<FetchResponse, Status> {
        if req.queues.is_empty() {
            return Err(invalid_field(
                "queues",
                "name at least one queue to fetch from",
            ));
        }
        for (i, q) in req.queues.iter().enumerate() {
            switchyard_core::validate::queue(q)
                .map_err(|e| invalid_field(&format!("queues[{i}]"), &e))?;
        }
        if req.worker_id.is_empty() || req.worker_id.len() > 255 {
            return Err(invalid_field(
                "worker_id",
                "a worker needs an id of 1-255 characters, stable for its life (e.g. host and pid)",
            ));
        }
        let count = req.count.clamp(1, MAX_FETCH) as usize;
        let wanted_visibility = millis(req.visibility_timeout.as_ref());
        let board = &self.inner.board;
        let book = &self.inner.book;
        // Take offers under the board's lock (waiting for one up to the
        // long poll), then record their leases.
        let wait = millis(req.wait.as_ref()).map_or(std::time::Duration::ZERO, |ms| {
            switchyard_kit::context::wait_within_deadline(std::time::Duration::from_millis(ms))
        });
        let deadline = tokio::time::Instant::now() + wait;
        let mut taken = Vec::new();
        let tenant = p.tenant_scope();
        let state = loop {
            let offered = board.offered.notified();
            tokio::pin!(offered);
            offered.as_mut().enable();
            // Where jobs are shared, jobs only workers run are claimed by
            // the member their worker fetches from.
            self.claim_for_workers(&req.queues, tenant, count - taken.len())
                .await;
            let state = {
                let mut st = crate::lock(&board.state);
                let state = Board::worker_state(&st, &req.worker_id);
                if state == WorkerState::Running {
                    for q in &req.queues {
                        while taken.len() < count {
                            let Some(offers) = st.waiting.get_mut(q) else {
                                break;
                            };
                            // The first offer of the worker's tenant.
                            let pick = offers
                                .iter()
                                .find(|(_, o)| tenant.is_none_or(|t| t == o.tenant))
                                .map(|(k, _)| *k);
                            let Some(k) = pick else { break };
                            let Some(o) = offers.remove(&k) else { break };
                            st.offered.remove(&(o.job_id.clone(), o.task_id.clone()));
                            taken.push((q.clone(), o));
                        }
                    }
                }
                state
            };
            if !taken.is_empty() || state != WorkerState::Running {
                break state;
            }
            // Where another member may accept work meanwhile, look again
            // every so often within the long poll.
            let until = match book.cluster.claim_poll() {
                Some(every) => deadline.min(tokio::time::Instant::now() + every),
                None => deadline,
            };
            if tokio::time::timeout_at(until, offered).await.is_err()
                && tokio::time::Instant::now() >= deadline
            {
                break state;
            }
        };
        let now = book.now();
        let mut leased = Vec::new();
        let mut g = 0;
        {
            let mut st = book.lock();
            for (queue, o) in taken {
                let visibility = wanted_visibility.unwrap_or(o.visibility_ms);
                let Ok(e) = st.get(&o.job_id) else { continue };
                let Some(&i) = e.index.get(&o.task_id) else {
                    continue;
                };
                // Cancelled or ended meanwhile: its attempt is gone.
                if e.task_state(i) != TaskState::Running || o.to_attempt.is_closed() {
                    continue;
                }
                let timeout_secs = e.spec().tasks[i].timeout_secs;
                let started = events::AttemptStarted {
                    attempt: o.attempt,
                    timeout_secs,
                    worker_id: req.worker_id.clone(),
                };
                g = book.record(
                    &mut st,
                    &o.job_id,
                    &o.task_id,
                    JobEvent::AttemptStarted(started),
                );
                if st.get(&o.job_id).map(crate::job::JobEntry::state).ok()
                    == Some(JobState::Available)
                {
                    match book.move_job(
                        &mut st,
                        &o.job_id,
                        JobState::Active,
                        Reason::InvalidArgument,
                        "",
                    ) {
                        Ok(gj) => g = gj,
                        Err(e) => {
                            tracing::warn!(job_id = %o.job_id, error = %e, "moving a leased job to active")
                        }
                    }
                }
                leased.push((queue, o, visibility, timeout_secs));
            }
        }
        // The board's lock is never taken under the book's.
        {
            let mut bs = crate::lock(&board.state);
            for (_, o, visibility, _) in &leased {
                if o.to_attempt.is_closed() {
                    continue;
                }
                bs.leases.insert(
                    (o.job_id.clone(), o.task_id.clone()),
                    Lease {
                        worker_id: req.worker_id.clone(),
                        attempt: o.attempt,
                        expires_ms: now + visibility,
                        visibility_ms: *visibility,
                        to_attempt: o.to_attempt.clone(),
                    },
                );
            }
        }
        if g > 0 {
            book.durable(g).await?;
        }
        let mut tasks = Vec::with_capacity(leased.len());
        for (queue, o, visibility, timeout_secs) in leased {
            let _ = o.to_attempt.send(Signal::Leased);
            let job = self.job(&o.job_id).await?;
            let spec = job.spec.clone().unwrap_or_default();
            let payload =
                spec.tasks
                    .iter()
                    .find(|t| t.id == o.task_id)
                    .and_then(|t| match &t.kind {
                        Some(Kind::Queue(q)) => q.payload.clone(),
                        _ => None,
                    });
            let declared = may_spend(&spec);
            // A worker that may spend gets the lease's grant: the job's
            // budget, its token budget as the ceiling, for the lease's (and
            // the task's) time.
            let grant = if declared {
                let ceiling = spec
                    .budget
                    .as_ref()
                    .and_then(|b| b.token_budget)
                    .unwrap_or(switchyard_core::money::MAX_TOKENS);
                let lasts = visibility.max(u64::from(timeout_secs) * 1000);
                self.sign_grant(&o.job_id, &o.task_id, "", &job.budget_id, ceiling, lasts)
            } else {
                String::new()
            };
            tasks.push(LeasedTask {
                task: Some(TaskRef {
                    job_id: o.job_id.clone(),
                    task_id: o.task_id.clone(),
                    attempt: o.attempt,
                }),
                queue,
                payload,
                lease_expires_at: Some(switchyard_kit::time::timestamp(now + visibility)),
                budget_id: if declared {
                    job.budget_id.clone()
                } else {
                    String::new()
                },
                correlation_id: spec.correlation_id.clone(),
                timeout_ms: u64::from(timeout_secs) * 1000,
                job: Some(job),
                grant,
            });
        }
        Ok(FetchResponse {
            tasks,
            state: state as i32,
        })
    }

    /// Claims up to `n` jobs of queue tasks only, on `queues`, that no
    /// member runs (none on one node: every job is offered where it was
    /// accepted), and starts them here so their tasks are offered on this
    /// board (waiting briefly until they are).
    async fn claim_for_workers(&self, queues: &[String], tenant: Option<&str>, n: usize) {
        let cluster = &self.inner.book.cluster;
        // Queue by queue, in the order the worker named them.
        let mut claimed = Vec::new();
        for q in queues {
            if claimed.len() >= n {
                break;
            }
            match cluster
                .claim_queued(std::slice::from_ref(q), tenant, n - claimed.len())
                .await
            {
                Ok(c) => claimed.extend(c),
                Err(e) => {
                    tracing::warn!(error = %e, "claiming queued jobs for a fetch");
                    break;
                }
            }
        }
        for (id, epoch) in claimed {
            match self.inner.book.adopt(&id, epoch, true).await {
                Ok(JobState::Available | JobState::Active) => {
                    self.spawn_driver(&id);
                    let tasks: Vec<String> = self
                        .inner
                        .book
                        .lock()
                        .find(&id)
                        .map(|e| e.spec().tasks.iter().map(|t| t.id.clone()).collect())
                        .unwrap_or_default();
                    self.inner
                        .board
                        .wait_offered(&id, &tasks, std::time::Duration::from_secs(2))
                        .await;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(job_id = %id, error = %e, "taking a queued job; handing it back");
                    self.inner.book.drop_job(&id, false);
                }
            }
        }
    }

    /// The task a [`TaskRef`] names: its id (the job's only queue task when
    /// empty), after checking the caller may see the job.
    async fn task_of(
        &self,
        p: &Principal,
        r: Option<&TaskRef>,
    ) -> Result<(String, String, u32), Status> {
        let r = r.ok_or_else(|| {
            invalid_field(
                "task",
                "name the leased task: job_id (and task_id, attempt)",
            )
        })?;
        if r.job_id.is_empty() {
            return Err(invalid_field(
                "task.job_id",
                "name the job whose task you leased",
            ));
        }
        // A worker reports on any task of its tenant it leased (the lease
        // fences it), not only on jobs it submitted. One read, from disk
        // for a finished job.
        let book = &self.inner.book;
        let here = !book.elsewhere(&r.job_id);
        let (tenant, queued, state): (String, Vec<String>, JobState) = book
            .read(&r.job_id, |e| {
                let queued = e
                    .spec()
                    .tasks
                    .iter()
                    .filter(|t| matches!(t.kind, Some(Kind::Queue(_))))
                    .map(|t| t.id.clone())
                    .collect();
                (e.job.tenant.clone(), queued, e.state())
            })
            .await?;
        if !p.sees_tenant(&tenant) {
            return Err(Status::from(crate::ExecutorError::NotFound(
                r.job_id.clone(),
            )));
        }
        if !here {
            // Another member runs the job (and keeps its leases), or took it
            // over since this worker fetched it here.
            if state.is_terminal() {
                return Err(refuse(
                    Code::FailedPrecondition,
                    Reason::JobTerminal,
                    format!(
                        "job {} is {state}: nothing acks or nacks it any more",
                        r.job_id
                    ),
                ));
            }
            return Err(lease_lost(
                &r.job_id,
                "the job is run by another replica now (this one's lease on it ended)",
            ));
        }
        if !r.task_id.is_empty() {
            return Ok((r.job_id.clone(), r.task_id.clone(), r.attempt));
        }
        match queued.as_slice() {
            [one] => Ok((r.job_id.clone(), one.clone(), r.attempt)),
            [] => Err(refuse(
                Code::FailedPrecondition,
                Reason::TaskNotLeased,
                format!(
                    "job {} has no queue task: Switchyard runs it itself, no worker acks it",
                    r.job_id
                ),
            )),
            _ => Err(invalid_field(
                "task.task_id",
                "this job has several queue tasks: name the one you leased",
            )),
        }
    }

    /// Why there is no lease to report on: the job's or task's state (a
    /// finished job is read from disk).
    async fn not_leased(&self, job_id: &str, task_id: &str) -> Status {
        let states = self
            .inner
            .book
            .read(job_id, |e| {
                (e.state(), e.index.get(task_id).map(|&i| e.task_state(i)))
            })
            .await;
        let (job, task) = match states {
            Ok(s) => s,
            Err(e) => return Status::from(e),
        };
        if job.is_terminal() {
            return refuse(
                Code::FailedPrecondition,
                Reason::JobTerminal,
                format!("job {job_id} is {job}: nothing acks or nacks it any more"),
            );
        }
        refuse(
            Code::FailedPrecondition,
            Reason::TaskNotLeased,
            format!(
                "task {task_id:?} of job {job_id} is not leased (job {job}, task {}): only a task a worker fetched can be acked or nacked",
                task.map_or("unknown", TaskState::as_str)
            ),
        )
    }

    /// Takes the lease `(job, task, attempt)` from `worker_id`, fenced.
    async fn take_lease(
        &self,
        job_id: &str,
        task_id: &str,
        attempt: u32,
        worker_id: &str,
    ) -> Result<Lease, Status> {
        match self.inner.board.take(job_id, task_id, attempt, worker_id) {
            Some(taken) => taken,
            // A lapsed or cancelled lease of this attempt is LEASE_LOST; a
            // task never leased (or finished) is a state conflict.
            None => Err(self
                .lost_or_not_leased(job_id, task_id, attempt, worker_id)
                .await),
        }
    }

    async fn lost_or_not_leased(
        &self,
        job_id: &str,
        task_id: &str,
        attempt: u32,
        worker_id: &str,
    ) -> Status {
        // A finished job says so, whoever held it.
        if self
            .inner
            .book
            .read(job_id, |e| e.state().is_terminal())
            .await
            .unwrap_or(false)
        {
            return self.not_leased(job_id, task_id).await;
        }
        let held_before = self
            .inner
            .book
            .read(job_id, |e| {
                let &i = e.index.get(task_id)?;
                let t = &e.job.tasks[i];
                t.attempts
                    .iter()
                    .rev()
                    .find(|a| {
                        (attempt == 0 || a.number == attempt)
                            && !a.worker_id.is_empty()
                            && (worker_id.is_empty() || a.worker_id == worker_id)
                    })
                    .map(|a| (a.number, a.error.clone()))
            })
            .await
            .ok()
            .flatten();
        match held_before {
            Some((n, why)) if !worker_id.is_empty() || attempt != 0 => lease_lost(
                job_id,
                &format!(
                    "attempt {n} ended{}",
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(" ({why})")
                    }
                ),
            ),
            _ => self.not_leased(job_id, task_id).await,
        }
    }

    /// Hands a report to the attempt holding `lease` and waits until its
    /// outcome is durable and, when that ends the job, the job's end too.
    async fn report(&self, job_id: &str, lease: Lease, report: Report) -> Result<Job, Status> {
        let (tx, rx) = oneshot::channel();
        if lease.to_attempt.send(Signal::Reported(report, tx)).is_err() {
            return Err(lease_lost(
                job_id,
                "its attempt ended (cancelled or timed out)",
            ));
        }
        if rx.await.is_err() {
            return Err(lease_lost(
                job_id,
                "its attempt ended before the report was recorded",
            ));
        }
        let done = self
            .inner
            .book
            .read(job_id, |e| {
                (0..e.job.tasks.len()).all(|i| e.task_state(i).is_terminal())
            })
            .await?;
        if done {
            crate::watch::until_finished(&self.inner.book, job_id).await?;
        }
        Ok(self.job(job_id).await?)
    }

    /// Ack: completes the lease holder's task with `result`.
    pub(crate) async fn ack(&self, p: &Principal, req: AckRequest) -> Result<AckResponse, Status> {
        let (job_id, task_id, attempt) = self.task_of(p, req.task.as_ref()).await?;
        let lease = self
            .take_lease(&job_id, &task_id, attempt, &req.worker_id)
            .await?;
        if !req.artifacts.is_empty()
            && let Err(e) = self.keep_artifacts(&job_id, &task_id, &req.artifacts)
        {
            // Refused: the task fails for good, and the worker is told why.
            let why = e.to_string();
            let reason = match &e {
                crate::error::ExecutorError::ArtifactRefused(r) => r.reason,
                _ => switchyard_core::Reason::StorageFailure,
            };
            let error = switchyard_proto::executor::v1::WorkerError {
                code: reason.as_str().to_owned(),
                message: why,
                retryable: Some(false),
                ..Default::default()
            };
            self.report(&job_id, lease, Report::Nack(error, false))
                .await?;
            return Err(e.into());
        }
        let result = req
            .result
            .as_ref()
            .map_or(serde_json::Value::Null, switchyard_kit::json::value_to_json);
        let job = self.report(&job_id, lease, Report::Ack(result)).await?;
        Ok(AckResponse { job: Some(job) })
    }

    /// Nack: fails (or hands back) the lease holder's task.
    pub(crate) async fn nack(
        &self,
        p: &Principal,
        req: NackRequest,
    ) -> Result<NackResponse, Status> {
        let (job_id, task_id, attempt) = self.task_of(p, req.task.as_ref()).await?;
        let error = req.error.unwrap_or_default();
        if error.message.len() > 64 * 1024 {
            return Err(invalid_field("error.message", "at most 64 KiB"));
        }
        let lease = self
            .take_lease(&job_id, &task_id, attempt, &req.worker_id)
            .await?;
        // The delay counts from when the nack arrived: read the clock before
        // the report schedules the retry, so the figure is never shorter
        // than the backoff the schedule chose.
        let now = self.inner.book.now();
        let job = self
            .report(&job_id, lease, Report::Nack(error, req.requeue))
            .await?;
        let retry_delay_ms = job
            .tasks
            .iter()
            .find(|t| t.task_id == task_id)
            .and_then(|t| t.next_attempt_at.as_ref())
            .map_or(0, |at| {
                switchyard_kit::time::timestamp_ms(at).saturating_sub(now)
            });
        Ok(NackResponse {
            job: Some(job),
            retry_delay_ms,
        })
    }

    /// Heartbeat: extends every listed lease the worker holds.
    pub(crate) async fn heartbeat(
        &self,
        p: &Principal,
        req: HeartbeatRequest,
    ) -> Result<HeartbeatResponse, Status> {
        if req.worker_id.is_empty() {
            return Err(invalid_field(
                "worker_id",
                "name the worker whose leases to extend",
            ));
        }
        let wanted = millis(req.visibility_timeout.as_ref());
        let now = self.inner.book.now();
        let mut lost = Vec::new();
        let mut extended = 0;
        let mut refs = Vec::with_capacity(req.active.len());
        for r in req.active {
            match self.task_of(p, Some(&r)).await {
                Ok((job_id, task_id, attempt)) => refs.push((r, job_id, task_id, attempt)),
                Err(_) => lost.push(r),
            }
        }
        let mut held = Vec::new();
        let mut st = crate::lock(&self.inner.board.state);
        for (r, job_id, task_id, attempt) in refs {
            match st.leases.get_mut(&(job_id.clone(), task_id)) {
                Some(l)
                    if l.worker_id == req.worker_id && (attempt == 0 || l.attempt == attempt) =>
                {
                    l.expires_ms = now + wanted.unwrap_or(l.visibility_ms);
                    extended += 1;
                    held.push(job_id);
                }
                _ => lost.push(r),
            }
        }
        let mut state = Board::worker_state(&st, &req.worker_id);
        drop(st);
        if self.inner.cfg.queue_test_directives && state == WorkerState::Running {
            state = self.test_directive(p, &held).unwrap_or(state);
        }
        Ok(HeartbeatResponse {
            state: state as i32,
            lost,
            extended,
        })
    }

    /// The OJS worker signals a job may carry
    /// (`executor.queue_test_directives`): `quiet` or `terminate` from
    /// `options.metadata.test_directive` of a job the worker holds — only
    /// a job of the worker's own tenant, and only to a worker scoped to one
    /// tenant: a producer can signal its own tenant's worker while it
    /// holds the producer's job, never another tenant's or a cross-tenant
    /// service worker. It ends when the job is no longer held.
    fn test_directive(&self, worker: &Principal, held: &[String]) -> Option<WorkerState> {
        let tenant = worker.tenant_scope()?;
        let st = self.inner.book.lock();
        held.iter()
            .filter_map(|id| {
                let e = st.find(id)?;
                if e.job.tenant != tenant {
                    return None;
                }
                let env = e.spec().envelope.as_ref()?;
                let v = switchyard_kit::json::struct_to_json(env);
                match v.pointer("/options/metadata/test_directive")?.as_str()? {
                    "terminate" => Some(WorkerState::Terminate),
                    "quiet" => Some(WorkerState::Quiet),
                    _ => None,
                }
            })
            .max_by_key(|s| *s as i32)
    }

    /// SetWorkerState: an operator drains or stops a worker.
    pub(crate) fn set_worker_state(
        &self,
        req: SetWorkerStateRequest,
    ) -> Result<SetWorkerStateResponse, Status> {
        if req.worker_id.is_empty() {
            return Err(invalid_field("worker_id", "name the worker"));
        }
        let state = WorkerState::try_from(req.state).unwrap_or(WorkerState::Unspecified);
        if state == WorkerState::Unspecified {
            return Err(invalid_field("state", "RUNNING, QUIET or TERMINATE"));
        }
        let mut st = crate::lock(&self.inner.board.state);
        if state == WorkerState::Running {
            st.workers.remove(&req.worker_id);
        } else {
            st.workers.insert(req.worker_id, state);
        }
        Ok(SetWorkerStateResponse {
            state: state as i32,
        })
    }
}

/// Whether a queue job's workers may spend: it declared a budget (its
/// workers are handed the budget id and reserve on it).
pub(crate) fn may_spend(spec: &switchyard_proto::executor::v1::JobSpec) -> bool {
    spec.budget
        .as_ref()
        .is_some_and(|b| b.token_budget.is_some() || b.cost_limit.is_some())
}
