//! The driver: one task per running job. It claims the job's approval run,
//! then loops — ask the scheduler ([`crate::schedule`]) for a step, record
//! its decisions in the book, make them durable, start the attempts
//! ([`crate::attempt`]) — and settles each attempt's outcome the same way.
//! It decides nothing itself. At the end it finishes the job, its approval
//! run and its budget; cancellation and shutdown stop it cleanly.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use switchyard_api::spend::Hold;
use switchyard_core::Reason;
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_kit::auth::OnBehalf;
use switchyard_kit::context::{self, RequestContext};
use switchyard_kit::error::ApiError;
use switchyard_kit::json::struct_to_json;
use switchyard_proto::approval::v1 as ap;
use switchyard_proto::executor::v1::task_spec::Kind;
use switchyard_sandbox::scratch::ScratchRoot;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::Executor;
use crate::attempt::{Attempt, Outcome, Snapshot};
use crate::book::{Change, Control, Jobs};
use crate::depend::Service;
use crate::error::ExecutorError;
use crate::events::{self, JobEvent};
use crate::outbox::RunEnd;
use crate::schedule::{self, Decision};

mod pause;

/// Claim outcome.
enum Claimed {
    Yes,
    /// The job was cancelled, or its run ended, meanwhile (why, by whom).
    Gone(String, Option<OnBehalf>),
    /// The process is stopping.
    Stopping,
}

/// Attempts running, each ending with its task's index and outcome.
type Running = JoinSet<(usize, Outcome)>;

/// A uniform random number in [0, 1), for backoff jitter.
pub(crate) fn unit_random() -> f64 {
    (uuid::Uuid::new_v4().as_u128() >> 75) as f64 / (1u64 << 53) as f64
}

impl Executor {
    /// Starts `job_id`'s driver unless one runs.
    pub(crate) fn spawn_driver(&self, job_id: &str) {
        if self.draining() {
            // Stopping: the job is not taken on here (handed back where
            // another member may run it; on one node it resumes here).
            self.inner.book.hand_back(job_id);
            return;
        }
        let shared = self.inner.book.cluster.shared();
        let ctl = {
            let mut st = self.inner.book.lock();
            if st.drivers.contains_key(job_id) {
                return;
            }
            if shared && st.drivers.len() >= self.inner.cfg.max_running_jobs {
                // No room here: another replica with room claims it.
                drop(st);
                tracing::debug!(job_id, "no room to run the job here; handing it back");
                self.inner.book.drop_job(job_id, false);
                return;
            }
            let for_workers = shared
                && st
                    .find(job_id)
                    .is_some_and(|e| !e.fetched && crate::queue::queue_job(e.spec()));
            if for_workers {
                // Only workers run it: it waits, unowned, for the replica a
                // worker fetches from to claim it.
                drop(st);
                self.inner.book.drop_job(job_id, false);
                return;
            }
            let ctl = Arc::new(Control::default());
            st.drivers.insert(job_id.to_owned(), ctl.clone());
            ctl
        };
        let driver = Driver {
            x: self.clone(),
            job_id: job_id.to_owned(),
            ctl,
        };
        let (me, id) = (self.clone(), job_id.to_owned());
        let ctl = driver.ctl.clone();
        let handle = tokio::spawn(async move {
            driver.drive().await;
            let stalled = {
                let mut st = me.inner.book.lock();
                st.drivers.remove(&id);
                st.find(&id).is_some_and(|e| {
                    matches!(
                        e.state(),
                        JobState::Available | JobState::Active | JobState::BudgetPaused
                    )
                })
            };
            if stalled && me.draining() {
                // Drained: nothing of it runs here any more.
                if me.inner.book.hand_back(&id) {
                    tracing::debug!(job_id = %id, "drained; handed the job back");
                }
            } else if stalled && !me.inner.shutdown.is_shutdown() && me.inner.book.hand_back(&id) {
                // The driver stopped on an error (the database or a service
                // was unreachable) with the job unfinished: handed back, the
                // job is claimed again (here or elsewhere) and resumed from
                // its events, instead of sitting on a renewed lease.
                tracing::warn!(job_id = %id, "job driver stopped early; handed the job back to be resumed");
            }
            me.inner.book.bump_finished();
            // A finished job leaves memory once its driver is gone.
            me.inner.book.retire(std::slice::from_ref(&id));
        });
        *crate::lock(&ctl.abort) = Some(handle.abort_handle());
    }

    /// Waits for job `job_id`'s background releases so far: a step about
    /// to reserve does not find the budget still held by one that used
    /// nothing.
    pub(crate) async fn settle_now(&self, job_id: &str) {
        let pending = crate::lock(&self.inner.settling)
            .remove(job_id)
            .unwrap_or_default();
        for h in pending {
            let _ = h.await;
        }
    }

    /// Runs `work` (a release nobody waits for) off the task's path; the
    /// job's end waits for it, so its final state stays its last event.
    pub(crate) fn settle_later(
        &self,
        job_id: &str,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let h = tokio::spawn(context::propagate(work));
        crate::lock(&self.inner.settling)
            .entry(job_id.to_owned())
            .or_default()
            .push(h);
    }
}

/// The driver of one running job.
struct Driver {
    x: Executor,
    job_id: String,
    /// How the job's canceller and the executor reach this driver.
    ctl: Arc<Control>,
}

impl Driver {
    /// Runs a job to its end (or until shutdown), inside its own trace,
    /// acting for its submitter.
    async fn drive(self) {
        let job_id = self.job_id.as_str();
        let (correlation_id, traceparent, submitter) = {
            let st = self.x.inner.book.lock();
            match st.find(job_id) {
                Some(e) => (
                    e.spec().correlation_id.clone(),
                    e.traceparent.clone(),
                    e.submitter(),
                ),
                None => return,
            }
        };
        let span = tracing::info_span!("executor.job", otel.name = "executor.job", job_id, correlation_id = %correlation_id);
        context::continue_trace(&span, &traceparent);
        let ctx = RequestContext {
            correlation_id,
            traceparent: (!traceparent.is_empty()).then_some(traceparent),
            principal: Some(Arc::new(
                switchyard_kit::auth::Principal::in_process().acting_for(submitter),
            )),
        };
        let run = async {
            if let Err(e) = self.run_job().await {
                tracing::error!(job_id, error = %e, "job driver stopped");
            }
        };
        context::scope(ctx, run.instrument(span)).await;
    }

    /// Takes one of the job's tenant's running-job slots
    /// (`executor.max_running_jobs_per_tenant`), waiting while all are
    /// taken, until the job is cancelled or the process stops. The wait is
    /// recorded on the job.
    async fn take_slot(&self) -> Result<Claimed, ExecutorError> {
        let job_id = self.job_id.as_str();
        let cfg = &self.x.inner.cfg;
        let tenant = {
            let st = self.x.inner.book.lock();
            st.find(job_id)
                .map(|e| e.job.tenant.clone())
                .unwrap_or_default()
        };
        let cap = cfg
            .running_jobs_per_tenant
            .get(&tenant)
            .copied()
            .unwrap_or(cfg.max_running_jobs_per_tenant);
        if cap == 0 {
            return Ok(Claimed::Yes);
        }
        let cluster = &self.x.inner.book.cluster;
        let mut finishes = self.x.inner.book.finishes();
        let started = std::time::Instant::now();
        let mut waited = false;
        let note = |phase: &str, ms: u64| {
            self.x.inner.book.note(
                job_id,
                "",
                JobEvent::SlotWait(events::SlotWait {
                    phase: phase.into(),
                    tenant: tenant.clone(),
                    cap,
                    waited_ms: ms,
                }),
            );
        };
        loop {
            if self.x.inner.shutdown.is_shutdown() || self.x.draining() {
                return Ok(Claimed::Stopping);
            }
            let cancel = crate::lock(&self.ctl.cancel).clone();
            if let Some((why, who)) = cancel {
                return Ok(Claimed::Gone(why, who));
            }
            if cluster.take_slot(&tenant, job_id, cap).await? {
                if waited {
                    note("granted", started.elapsed().as_millis() as u64);
                }
                return Ok(Claimed::Yes);
            }
            if !waited {
                note("waiting", 0);
                waited = true;
            }
            // A job finishing here frees a slot at once; one finishing on
            // another replica is seen within the poll.
            tokio::select! {
                _ = finishes.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = self.x.inner.shutdown.wait() => {}
            }
        }
    }

    /// Renews this worker's claim on the job's approval run.
    async fn renew(&self, run_id: &str) -> Result<ap::RenewClaimResponse, tonic::Status> {
        let cfg = &self.x.inner.cfg;
        self.x
            .inner
            .clients
            .approval
            .renew_claim(ap::RenewClaimRequest {
                run_id: run_id.into(),
                worker_id: cfg.worker_id.clone(),
                lease_secs: cfg.lease_secs,
            })
            .await
    }

    /// Claims the job's approval run for this worker, retrying until it is
    /// ours, the job is gone, or the process stops.
    async fn claim(&self, run_id: &str) -> Claimed {
        let cfg = &self.x.inner.cfg;
        loop {
            if self.x.inner.shutdown.is_shutdown() || self.x.draining() {
                return Claimed::Stopping;
            }
            let cancel = crate::lock(&self.ctl.cancel).clone();
            if let Some((why, who)) = cancel {
                return Claimed::Gone(why, who);
            }
            let approval = &self.x.inner.clients.approval;
            let req = ap::ClaimRequest {
                run_id: run_id.into(),
                worker_id: cfg.worker_id.clone(),
                lease_secs: cfg.lease_secs,
            };
            // Waits (recorded on the job) while the approval service is down.
            let claimed = self
                .x
                .waiter(&self.job_id, "")
                .call(Service::Approval, || approval.claim(req.clone()))
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
                    let why = format!("approval run {run_id} ended: {}", err.message);
                    return Claimed::Gone(why, None);
                }
                // A lapsed lease scheduled a retry; wait for it.
                Some(Reason::RunNotDue | Reason::ClaimNotHeld) => {}
                _ => {
                    tracing::warn!(run_id, error = %err.message, "claiming approval run; will retry")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = self.ctl.wake.notified() => {}
                _ = self.x.inner.shutdown.wait() => {}
                _ = self.x.inner.draining.wait() => {}
            }
        }
    }

    async fn run_job(&self) -> Result<(), ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let (run_id, all_final) = {
            let st = book.lock();
            let e = st.get(job_id)?;
            let all_final = (0..e.job.tasks.len()).all(|i| e.task_state(i).is_terminal());
            (e.job.run_id.clone(), all_final)
        };
        if all_final {
            // Every task ended before a crash (or a takeover) kept the job
            // from recording its end: its run may have ended already
            // (ending it again is an acknowledgement), so it is not claimed
            // again — the job just finishes.
            return self.finish().await;
        }
        // Claimed with the proposal (this submission, this process): the
        // run is ours already.
        let claimed = book
            .lock()
            .find_mut(job_id)
            .is_some_and(|e| std::mem::take(&mut e.run_claimed));
        let claim = if claimed {
            Claimed::Yes
        } else {
            let correlation_id = context::current()
                .map(|c| c.correlation_id)
                .unwrap_or_default();
            let span = crate::spans::approval_wait(&correlation_id, &run_id);
            let claim = tracing::Instrument::instrument(self.claim(&run_id), span.clone()).await;
            span.record(
                "switchyard.approval.outcome",
                match &claim {
                    Claimed::Yes => "claimed",
                    Claimed::Stopping => "stopping",
                    Claimed::Gone(..) => "gone",
                },
            );
            claim
        };
        // The run is ours; then one of the tenant's running-job slots.
        let claim = match claim {
            Claimed::Yes => self.take_slot().await?,
            other => other,
        };
        match claim {
            Claimed::Yes => {}
            Claimed::Stopping => return Ok(()),
            Claimed::Gone(why, who) => {
                let (g, intents) = {
                    let mut st = book.lock();
                    let g = crate::cancel::cancel_idle(
                        book,
                        &mut st,
                        job_id,
                        Reason::JobCancelled,
                        &why,
                    )?;
                    (g, self.x.intend(&st, job_id, RunEnd::Cancel(why, who))?)
                };
                book.durable(g).await?;
                self.x.deliver_now(intents).await;
                return Ok(());
            }
        }
        let ran = self.run_claimed(&run_id).await;
        if let Err(e) = self.x.inner.book.cluster.free_slot(job_id).await {
            tracing::warn!(job_id, error = %e, "giving the job's slot back; it frees once the job is seen finished");
        }
        ran
    }

    /// Runs the job once its run is claimed and it holds a slot.
    async fn run_claimed(&self, run_id: &str) -> Result<(), ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let awaiting = self.resume().await?;
        let scratch_root = ScratchRoot::new(&self.x.inner.cfg.scratch_dir);
        // Only commands (and a model's command tools) run in the scratch
        // directory; a job of agent calls alone never touches it, and a
        // directory made and removed per job costs more than the job.
        let files = book
            .lock()
            .find(job_id)
            .filter(|e| needs_scratch(e.spec()))
            .map(|e| e.spec().files.clone());
        let scratch = match &files {
            Some(files) => self.prepare_scratch(&scratch_root, files)?,
            None => scratch_root.dir(job_id).map_err(scratch_error(job_id))?,
        };
        let result = self.run_loop(run_id, &scratch, awaiting).await;
        // A job stopped or drained unfinished keeps its files for the run
        // that resumes it.
        if files.is_some() && !self.x.inner.shutdown.is_shutdown() && !self.x.draining() {
            let _ = scratch_root.remove(job_id);
        }
        result
    }

    /// Starts the job, or resumes it after a restart: attempts that were
    /// running run again (made durable with the first scheduling step,
    /// before anything starts) and reservations left open are released.
    /// Attempts paused at a tool call awaiting a person, and input tasks
    /// waiting for an answer, stay paused: their tasks are returned, to go
    /// on from their checkpoints (input tasks: from their question).
    async fn resume(&self) -> Result<Vec<usize>, ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let mut awaiting = Vec::new();
        let stale = {
            let mut st = book.lock();
            let entry = st.get(job_id)?;
            let n = entry.job.tasks.len();
            let stale: Vec<(String, String)> = entry
                .open_reservations
                .iter()
                .map(|(r, h)| (r.clone(), h.task_id.clone()))
                .collect();
            // A resumed job's kept tasks are done: their outputs were
            // recorded with its submission.
            let kept: Vec<usize> = entry
                .reused
                .iter()
                .filter_map(|t| entry.index.get(t).copied())
                .filter(|&i| entry.task_state(i) == TaskState::Waiting)
                .collect();
            // A queue job stays available until a worker leases it.
            if entry.state() == JobState::Available && !crate::queue::queue_job(entry.spec()) {
                book.move_job(
                    &mut st,
                    job_id,
                    JobState::Active,
                    Reason::InvalidArgument,
                    "",
                )?;
            }
            for i in kept {
                book.move_task(&mut st, job_id, i, Change::to(TaskState::Succeeded))?;
            }
            for i in 0..n {
                if matches!(
                    st.get(job_id)?.task_state(i),
                    TaskState::AwaitingApproval | TaskState::InputRequired
                ) {
                    awaiting.push(i);
                }
                if st.get(job_id)?.task_state(i) == TaskState::Running {
                    let why = "the executor restarted during this attempt; running it again";
                    let c = Change::to(TaskState::Ready).because(Reason::Unavailable, why);
                    book.move_task(&mut st, job_id, i, c)?;
                }
            }
            stale
        };
        let ledger = &self.x.inner.clients.ledger;
        for (rid, task) in stale {
            let hold = Hold::resume(ledger, &rid);
            crate::attempt::release(&self.x, job_id, &task, &hold, "reconciled after restart")
                .await;
        }
        Ok(awaiting)
    }

    /// The attempt of task `i`, paused at a tool call awaiting a person
    /// before a restart, going on from its checkpoint: the same attempt
    /// (so the same idempotency keys), not a new one.
    async fn paused_attempt(
        &self,
        i: usize,
    ) -> Result<Option<(Snapshot, Duration)>, ExecutorError> {
        let job_id = self.job_id.as_str();
        let (mut snap, timeout) = {
            let st = self.x.inner.book.lock();
            let e = st.get(job_id)?;
            let attempt = e.job.tasks[i].attempts.len() as u32;
            let snap = snapshot(&st, job_id, i, attempt)?;
            let timeout = Duration::from_secs(u64::from(schedule::timeout_secs(e, i)));
            (snap, timeout)
        };
        if matches!(snap.task.kind, Some(Kind::Input(_) | Kind::Conversation(_))) {
            // Its question and deadline (a conversation: everything said)
            // are in the job's log.
            snap.start_g = self.x.inner.book.last();
            return Ok(Some((snap, timeout)));
        }
        let Some(cp) = self.x.checkpoint(job_id, &snap.task.id).await? else {
            return Ok(None);
        };
        snap.resume = Some(Box::new(cp));
        snap.start_g = self.x.inner.book.last();
        Ok(Some((snap, timeout)))
    }

    /// The job's scratch directory with its files, owned by the tasks'
    /// user: made through the one mapper from ids to directories, files
    /// created afresh without following anything a task left there (a
    /// resumed job's directory was the task's to change).
    fn prepare_scratch(
        &self,
        root: &ScratchRoot,
        files: &std::collections::BTreeMap<String, Vec<u8>>,
    ) -> Result<PathBuf, ExecutorError> {
        let job_id = self.job_id.as_str();
        let files = files.iter().map(|(n, b)| (n.as_str(), b.as_slice()));
        // When tasks run as the sandbox's user (the executor is root), the
        // directory is theirs; Landlock keeps other jobs' tasks out of it.
        root.prepare(job_id, files, self.x.inner.sandbox.owner())
            .map_err(scratch_error(job_id))
    }

    /// The scheduling loop: step, make durable, start; then wait for an
    /// attempt to end, a timer, a cancel, the lease renewal or shutdown.
    async fn run_loop(
        &self,
        run_id: &str,
        scratch: &std::path::Path,
        paused: Vec<usize>,
    ) -> Result<(), ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let mut running = Running::new();
        for i in paused {
            match self.paused_attempt(i).await? {
                Some((snap, timeout)) => self.start(&mut running, i, snap, timeout, scratch),
                None => {
                    // No checkpoint (written by an older release): run it again.
                    let mut st = book.lock();
                    let why = "the executor restarted while a tool call awaited approval; running the attempt again";
                    let c = Change::to(TaskState::Failed).because(Reason::Unavailable, why);
                    book.move_task(&mut st, job_id, i, c)?;
                }
            }
        }
        let lease = u64::from(self.x.inner.cfg.lease_secs / 3).max(1);
        // The first renewal is one period away. (An interval's immediate
        // first tick is not free: it waits for the timer's next turn, a
        // millisecond on every job.)
        let period = Duration::from_secs(lease);
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        // Workers' reports waiting for their outcome to be durable.
        let mut settled: Vec<tokio::sync::oneshot::Sender<()>> = Vec::new();
        loop {
            let cancel = crate::lock(&self.ctl.cancel).clone();
            if let Some((why, who)) = cancel {
                running.abort_all();
                while running.join_next().await.is_some() {}
                return self.finish_cancelled(&why, who).await;
            }
            let now = book.now();
            let (g, step) = self.take_step(now, &mut running)?;
            // One durable step covers the last settle and these starts. An
            // attempt does nothing outside the job before this step is on
            // disk (it waits for it after routing and its idempotent
            // reservation), so it starts now and its own writes share this
            // step's flush instead of following it.
            for (i, snap, timeout) in step.starts {
                self.start(&mut running, i, snap, timeout, scratch);
            }
            book.durable(g).await?;
            for s in settled.drain(..) {
                let _ = s.send(());
            }
            if step.done && running.is_empty() {
                return self.finish().await;
            }
            if step.paused && running.is_empty() && !self.x.draining() {
                match self.budget_pause(run_id, &mut renew).await? {
                    pause::Waited::Decided | pause::Waited::Cancelled => continue,
                    pause::Waited::Stopping => return Ok(()),
                }
            }
            if running.is_empty() && self.x.draining() {
                // Drained: nothing runs and nothing may start here.
                return Ok(());
            }
            let sleep = step.next_wake.map_or(Duration::from_secs(3600), |at| {
                Duration::from_millis(at.saturating_sub(now))
            });
            tokio::select! {
                joined = running.join_next(), if !running.is_empty() => {
                    if let Some(Ok((i, mut outcome))) = joined {
                        let reply = outcome.settled.take();
                        self.settle(i, outcome)?;
                        settled.extend(reply);
                    }
                }
                _ = tokio::time::sleep(sleep) => {}
                _ = self.ctl.wake.notified() => {}
                _ = renew.tick() => {
                    if let Err(e) = self.renew(run_id).await {
                        tracing::warn!(job_id, error = %e.message(), "renewing approval claim");
                    }
                }
                _ = self.x.inner.draining.wait(), if !self.x.draining() => {}
                _ = self.x.inner.shutdown.wait() => {
                    // Attempts stop here and run again after the restart.
                    running.abort_all();
                    while running.join_next().await.is_some() {}
                    return Ok(());
                }
            }
        }
    }

    /// Starts an attempt of task `i`.
    fn start(
        &self,
        running: &mut Running,
        i: usize,
        snap: Snapshot,
        timeout: Duration,
        scratch: &std::path::Path,
    ) {
        let me = self.x.clone();
        let dir = scratch.to_path_buf();
        let attempt = async move {
            let attempt = Attempt {
                x: &me,
                snap: &snap,
                timeout,
                scratch: &dir,
            };
            (i, attempt.run().await)
        };
        // The attempt's calls carry the job's correlation id and trace.
        running.spawn(context::propagate(attempt));
    }

    /// Asks the scheduler for a step and records its decisions under one
    /// lock; returns the last event and what to start.
    fn take_step(&self, now: u64, running: &mut Running) -> Result<(u64, Started), ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let policy = self.policy();
        // Draining, nothing starts: the task stays ready for whoever resumes
        // the job.
        let draining = self.x.draining();
        let mut st = book.lock();
        let step = schedule::step(st.get(job_id)?, now, running.len(), &policy);
        if step.abort_running {
            running.abort_all();
        }
        let mut g = book.last();
        let mut starts = Vec::new();
        for d in step.decisions {
            match d {
                Decision::Move(m) => g = book.move_task(&mut st, job_id, m.task, m.change())?,
                Decision::Start { .. } if draining => {}
                Decision::Start {
                    task,
                    attempt,
                    timeout_secs,
                } => {
                    let spec_task = &st.get(job_id)?.spec().tasks[task];
                    let task_id = spec_task.id.clone();
                    // A queue task's attempt starts when a worker leases it.
                    if !matches!(spec_task.kind, Some(Kind::Queue(_))) {
                        let started = events::AttemptStarted {
                            attempt,
                            timeout_secs,
                            worker_id: String::new(),
                        };
                        book.record(&mut st, job_id, &task_id, JobEvent::AttemptStarted(started));
                    }
                    g = book.move_task(&mut st, job_id, task, Change::to(TaskState::Running))?;
                    let mut snap = snapshot(&st, job_id, task, attempt)?;
                    snap.start_g = g;
                    starts.push((task, snap, Duration::from_secs(u64::from(timeout_secs))));
                }
            }
        }
        Ok((
            g,
            Started {
                starts,
                next_wake: step.next_wake,
                done: step.done,
                paused: step.paused,
            },
        ))
    }

    fn policy(&self) -> schedule::Policy {
        let cfg = &self.x.inner.cfg;
        schedule::Policy {
            cancel_running_on_failure: cfg.cancel_running_on_failure,
            defer_interval_secs: cfg.defer_interval_secs,
            max_defer_secs: cfg.max_defer_secs,
        }
    }

    /// Records an attempt's end and the scheduler's decision about it.
    fn settle(&self, i: usize, out: Outcome) -> Result<u64, ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let now = book.now();
        let mut st = book.lock();
        let e = st.get(job_id)?;
        // Cancelled meanwhile, or parked without an end (an input task
        // still waiting when the job is handed back).
        if e.task_state(i) != TaskState::Running || (out.status.is_none() && out.failure.is_none())
        {
            return Ok(book.last());
        }
        let task_id = e.spec().tasks[i].id.clone();
        if let Some(status) = &out.status {
            let mut status = status.clone();
            status.task_id.clone_from(&task_id);
            book.keep_result(&mut st, job_id, &status);
        }
        let Some(failure) = out.failure else {
            return book.move_task(&mut st, job_id, i, Change::to(TaskState::Succeeded));
        };
        tracing::info!(job_id, task_id = %task_id, reason = %failure.reason, error = %failure.error, "attempt failed");
        let policy = self.policy();
        let (m, note) =
            schedule::after_failure(st.get(job_id)?, i, &failure, now, unit_random(), &policy);
        if let Some(message) = note {
            let notice = events::Notice { message };
            book.record(&mut st, job_id, &task_id, JobEvent::Notice(notice));
        }
        book.move_task(&mut st, job_id, i, m.change())
    }

    /// Waits for the job's background releases.
    async fn settled(&self) {
        self.x.settle_now(&self.job_id).await;
    }

    /// Every task is final: the job ends, and so do its run and budget.
    async fn finish(&self) -> Result<(), ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let (to, reason, error) = final_state(&book.lock(), job_id)?;
        let run = if to == JobState::Completed {
            let ms = book.result(job_id).await?.execution_time_ms;
            RunEnd::Complete(format!("job {job_id} completed in {ms} ms"))
        } else {
            RunEnd::Fail(error.clone())
        };
        let (close, end) = self
            .x
            .intents(&book.lock(), job_id, run)?
            .into_iter()
            .partition(|i| i.closes_budget());
        // The run and the budget end first, so a job seen finished has its
        // run ended — when the services answer. The run ends while the
        // job's last holds are released; the budget closes after them. If
        // a service is down, the outbox keeps the intent (durable with the
        // final event below) and delivers it once it is back; the job does
        // not wait.
        let closed = async {
            self.settled().await;
            self.x.deliver_first(close).await
        };
        let (ended, closed) = tokio::join!(self.x.deliver_first(end), closed);
        ended?;
        closed?;
        let g = {
            let mut st = book.lock();
            book.move_job(&mut st, job_id, to, reason, &error)?
        };
        book.durable(g).await?;
        Ok(())
    }

    /// A cancelled running job: its holds are released first, so the job's
    /// last event is its final state; then its run and budget end.
    async fn finish_cancelled(
        &self,
        why: &str,
        who: Option<OnBehalf>,
    ) -> Result<(), ExecutorError> {
        let job_id = self.job_id.as_str();
        self.settled().await;
        let book = &self.x.inner.book;
        // A pending extension request is withdrawn with the job.
        let asking = book.lock().find(job_id).and_then(|e| match &e.pause {
            Some((p, None)) if e.state() == JobState::BudgetPaused => Some(p.run_id.clone()),
            _ => None,
        });
        if let Some(run_id) = asking {
            self.x.cancel_run_by_id(run_id, why, who.clone()).await;
        }
        let open: Vec<(String, String)> = book
            .lock()
            .find(job_id)
            .map(|e| {
                e.open_reservations
                    .iter()
                    .map(|(r, h)| (r.clone(), h.task_id.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let ledger = &self.x.inner.clients.ledger;
        for (rid, task) in open {
            let hold = Hold::resume(ledger, &rid);
            crate::attempt::release(&self.x, job_id, &task, &hold, "job cancelled").await;
        }
        let (g, intents) = {
            let mut st = book.lock();
            let g = crate::cancel::cancel_idle(book, &mut st, job_id, Reason::JobCancelled, why)?;
            let run = RunEnd::Cancel(why.to_owned(), who);
            (g, self.x.intend(&st, job_id, run)?)
        };
        book.durable(g).await?;
        self.x.deliver_now(intents).await;
        Ok(())
    }
}

/// What a scheduling step starts.
struct Started {
    starts: Vec<(usize, Snapshot, Duration)>,
    next_wake: Option<u64>,
    done: bool,
    paused: bool,
}

/// How a job whose tasks are all final ends: completed, or discarded with
/// the first failed task's reason. (A budget no longer fails a task: it
/// pauses the job, seed 000's `retryable` as OJS shows it.)
fn final_state(st: &Jobs, job_id: &str) -> Result<(JobState, Reason, String), ExecutorError> {
    let e = st.get(job_id)?;
    let failed = e
        .job
        .tasks
        .iter()
        .find(|t| crate::job::task_state(t.state) == TaskState::Failed);
    Ok(match failed {
        None => (JobState::Completed, Reason::InvalidArgument, String::new()),
        Some(t) => {
            let r = Reason::parse(&t.reason).unwrap_or(Reason::Internal);
            let error = format!("task {} failed: {}", t.task_id, t.error);
            (JobState::Discarded, r, error)
        }
    })
}

/// What attempt `attempt` of task `i` needs, read under the lock.
fn snapshot(st: &Jobs, job_id: &str, i: usize, attempt: u32) -> Result<Snapshot, ExecutorError> {
    let e = st.get(job_id)?;
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
        job_id: job_id.to_owned(),
        job_input: spec
            .input
            .as_ref()
            .map(struct_to_json)
            .unwrap_or_else(|| json!({})),
        outputs,
        stdin,
        budget_id: e.job.budget_id.clone(),
        scope_hold: e.scope_hold.clone(),
        // The spec's, and what approved extensions added to it.
        token_budget: spec
            .budget
            .as_ref()
            .and_then(|b| b.token_budget)
            .map(|t| t.saturating_add(e.extra_tokens)),
        correlation_id: spec.correlation_id.clone(),
        delegation_depth: spec.delegation.as_ref().map_or(0, |d| d.depth),
        attempt,
        deadline_ms: schedule::deadline(e, i),
        task,
        start_g: 0,
        lease: e.lease,
        scope: String::new(),
        user_message: String::new(),
        resume: None,
    })
}

/// The error of a scratch directory that could not be made for `job_id`.
fn scratch_error(job_id: &str) -> impl Fn(std::io::Error) -> ExecutorError + '_ {
    move |e| ExecutorError::Scratch(format!("job {job_id:?}: {e}"))
}

/// Whether a job runs anything in a scratch directory: a command task, a
/// model task (its tools may be commands), or files handed to its tasks.
fn needs_scratch(spec: &switchyard_proto::executor::v1::JobSpec) -> bool {
    use switchyard_proto::executor::v1::task_spec::Kind;
    !spec.files.is_empty()
        || spec.tasks.iter().any(|t| {
            matches!(
                t.kind,
                Some(Kind::Command(_) | Kind::Llm(_) | Kind::Conversation(_))
            )
        })
}

#[cfg(test)]
mod tests {
    use super::needs_scratch;
    use switchyard_proto::executor::v1::task_spec::Kind;
    use switchyard_proto::executor::v1::{AgentTask, CommandTask, JobSpec, LlmTask, TaskSpec};

    fn job(kinds: Vec<Kind>) -> JobSpec {
        JobSpec {
            tasks: kinds
                .into_iter()
                .map(|k| TaskSpec {
                    kind: Some(k),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_jobs_that_run_commands_models_or_get_files_get_a_scratch_directory() {
        let agent = || Kind::Agent(AgentTask::default());
        assert!(!needs_scratch(&job(vec![agent(), agent()])));
        assert!(needs_scratch(&job(vec![
            agent(),
            Kind::Command(CommandTask::default())
        ])));
        assert!(needs_scratch(&job(vec![Kind::Llm(LlmTask::default())])));
        let mut with_files = job(vec![agent()]);
        with_files.files.insert("in.txt".into(), b"x".to_vec());
        assert!(needs_scratch(&with_files));
    }
}
