//! The job book: the only owner of job state and the only writer of job
//! events. Every change is a typed [`JobEvent`] applied to the job's
//! [`JobEntry`] and appended to the durable log in the same step; reads
//! (`GetJob`, `ListJobs`, `GetResult`, `WatchJob`) are answered from here.
//!
//! Storage is behind [`crate::store`]: the book never asks which backend
//! it runs on. Durability: appends are group-committed; [`JobBook::durable`]
//! waits for a log position and then tells each job's watchers how far its
//! events are durable. Start-up ([`JobBook::open`]) holds what the store
//! replays (its events through the same `apply`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use switchyard_core::Clock;
use switchyard_core::Reason;
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_kit::auth::Principal;
use switchyard_kit::shutdown::Shutdown;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{
    GetResultResponse, Job, JobSpec, ListJobsRequest, ListJobsResponse, TaskStatus,
};

use crate::error::ExecutorError;
use crate::events::{self, JobEvent};
use crate::job::JobEntry;
use crate::store::{Cluster, JobStore};

/// Nothing more happens to a job in these states unless someone acts:
/// watch streams end there.
pub(crate) fn finished(s: JobState) -> bool {
    s.is_terminal() || s == JobState::Retryable
}

/// A task state change to record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Change<'a> {
    pub(crate) to: TaskState,
    pub(crate) reason: Option<Reason>,
    pub(crate) error: &'a str,
    /// Retrying/deferred: the next attempt is due this long after the
    /// change is recorded (the same clock reading stamps both).
    pub(crate) after_ms: Option<u64>,
    /// The next attempt runs with the extended timeout.
    pub(crate) extend: bool,
}

impl<'a> Change<'a> {
    pub(crate) fn to(to: TaskState) -> Self {
        Change {
            to,
            reason: None,
            error: "",
            after_ms: None,
            extend: false,
        }
    }

    pub(crate) fn because(mut self, reason: Reason, error: &'a str) -> Self {
        self.reason = Some(reason);
        self.error = error;
        self
    }

    pub(crate) fn after(mut self, delay_ms: u64) -> Self {
        self.after_ms = Some(delay_ms);
        self
    }
}

/// Per-job control of a running driver.
#[derive(Debug, Default)]
pub(crate) struct Control {
    /// Why the job is being cancelled and by whom, once asked.
    pub(crate) cancel: Mutex<Option<(String, Option<switchyard_kit::auth::OnBehalf>)>>,
    pub(crate) wake: tokio::sync::Notify,
    /// Aborts the driver (its attempts with it): the job was taken over.
    pub(crate) abort: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Control {
    /// Stops the driver where it is, dropping its attempts (their
    /// processes are killed): another replica runs the job now.
    pub(crate) fn stop(&self) {
        if let Some(a) = crate::lock(&self.abort).take() {
            a.abort();
        }
    }
}

/// The jobs in memory, behind the book's lock.
#[derive(Default)]
pub(crate) struct Jobs {
    jobs: HashMap<String, JobEntry>,
    /// Drivers running, by job id.
    pub(crate) drivers: HashMap<String, Arc<Control>>,
    /// Jobs with events not yet known durable.
    dirty: HashSet<String>,
    /// Jobs waiting for approval or their scheduled time (what the poller checks).
    pub(crate) waiting: BTreeSet<String>,
}

impl Jobs {
    /// Sets the jobs gauges: live jobs by state, how many wait to run and
    /// how long the oldest has waited for approval.
    pub(crate) fn gauges(&self, m: &switchyard_kit::metrics::Metrics, now_ms: u64) {
        let mut oldest_pending = now_ms;
        let mut waiting = 0;
        for e in self.jobs.values() {
            let state = e.state();
            if finished(state) {
                continue;
            }
            m.jobs
                .get_or_create(&switchyard_kit::metrics::StateLabels {
                    state: state.as_str().into(),
                })
                .inc();
            if matches!(state, JobState::Pending | JobState::Available) {
                waiting += 1;
            }
            if state == JobState::Pending {
                let created = e
                    .job
                    .created_at
                    .as_ref()
                    .map_or(now_ms, switchyard_kit::time::timestamp_ms);
                oldest_pending = oldest_pending.min(created);
            }
        }
        m.queue_depth.inc_by(waiting);
        m.oldest_pending_seconds
            .set(i64::try_from(now_ms.saturating_sub(oldest_pending) / 1000).unwrap_or(i64::MAX));
    }

    /// Job `id`, or JOB_NOT_FOUND.
    pub(crate) fn get(&self, id: &str) -> Result<&JobEntry, ExecutorError> {
        self.jobs
            .get(id)
            .ok_or_else(|| ExecutorError::NotFound(id.into()))
    }

    /// Every job in memory, in no order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &JobEntry> {
        self.jobs.values()
    }

    /// Job `id` if it exists.
    pub(crate) fn find(&self, id: &str) -> Option<&JobEntry> {
        self.jobs.get(id)
    }

    /// Job `id` if it exists, to change what is kept in memory only (its
    /// durable state changes through events).
    pub(crate) fn find_mut(&mut self, id: &str) -> Option<&mut JobEntry> {
        self.jobs.get_mut(id)
    }

    /// Claims `entry`'s id for a submission in progress; it is listed once
    /// [`JobBook::accept`] stores it.
    pub(crate) fn claim(&mut self, entry: JobEntry) {
        self.jobs.insert(entry.id().to_owned(), entry);
    }

    /// Forgets a claimed job whose submission failed.
    pub(crate) fn unclaim(&mut self, id: &str) {
        self.jobs.remove(id);
    }

    /// Counts `cost` as being reserved by a task (see [`JobEntry::task_exposure`]).
    pub(crate) fn reserving(&mut self, job_id: &str, task_id: &str, cost: i64) {
        if let Some(e) = self.jobs.get_mut(job_id) {
            *e.reserving.entry(task_id.to_owned()).or_default() += cost;
        }
    }

    /// The reservation of `cost` by a task ended (held or refused).
    pub(crate) fn unreserve(&mut self, job_id: &str, task_id: &str, cost: i64) {
        if let Some(e) = self.jobs.get_mut(job_id)
            && let Some(c) = e.reserving.get_mut(task_id)
        {
            *c -= cost;
            if *c == 0 {
                e.reserving.remove(task_id);
            }
        }
    }

    /// The ids of the jobs in memory.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.jobs.keys().cloned().collect()
    }

    /// How many jobs are in memory.
    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// After loading jobs replayed from storage: each one's events are
    /// durable, and the ones waiting for approval or their time are known.
    pub(crate) fn settle_loaded(&mut self) {
        for e in self.jobs.values_mut() {
            e.durable_to.send_replace(e.job.last_sequence);
        }
        self.waiting = self
            .in_states(&[JobState::Pending, JobState::Scheduled])
            .into_iter()
            .collect();
    }

    /// Drops a retired job from memory (it is stored).
    pub(crate) fn forget(&mut self, id: &str) {
        if self.jobs.get(id).is_some_and(|e| e.state().is_terminal()) {
            self.jobs.remove(id);
            self.waiting.remove(id);
            self.dirty.remove(id);
        }
    }

    /// The log position of the first event of any job in memory.
    pub(crate) fn first_event(&self) -> Option<u64> {
        self.jobs
            .values()
            .filter_map(|e| e.events.first())
            .min()
            .copied()
    }

    /// Ids of jobs in `states`.
    pub(crate) fn in_states(&self, states: &[JobState]) -> Vec<String> {
        self.jobs
            .values()
            .filter(|e| states.contains(&e.state()))
            .map(|e| e.id().to_owned())
            .collect()
    }
}

/// The job book.
pub(crate) struct JobBook {
    clock: Arc<dyn Clock>,
    /// Where jobs live (see [`crate::store`]).
    pub(crate) store: Arc<dyn JobStore>,
    /// Who else may run them.
    pub(crate) cluster: Arc<dyn Cluster>,
    jobs: Mutex<Jobs>,
    pub(crate) shutdown: Shutdown,
    /// Bumped whenever a job finishes (for waiters such as CancelJob).
    finished: tokio::sync::watch::Sender<u64>,
    /// The log position up to which watchers have been told their jobs'
    /// events are durable.
    told: std::sync::atomic::AtomicU64,
    /// Wakes the background flusher of events nobody waits for.
    flush_wanted: tokio::sync::Notify,
    /// Signs each job's journal head when it retires.
    pub(crate) seal: Arc<crate::audit::Seal>,
    /// Told what each recorded event means for the webhooks.
    pub(crate) notifier: Arc<crate::notify::Notifier>,
}

impl JobBook {
    /// Opens the book on `store`, holding the jobs it holds at start-up.
    pub(crate) fn open(
        store: Arc<dyn JobStore>,
        cluster: Arc<dyn Cluster>,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        seal: Arc<crate::audit::Seal>,
        notifier: Arc<crate::notify::Notifier>,
    ) -> Result<JobBook, ExecutorError> {
        let jobs = store.load_held()?;
        let book = JobBook {
            clock,
            store,
            cluster,
            jobs: Mutex::new(jobs),
            shutdown,
            finished: tokio::sync::watch::channel(0).0,
            told: std::sync::atomic::AtomicU64::new(0),
            flush_wanted: tokio::sync::Notify::new(),
            seal,
            notifier,
        };
        book.checkpoint()?;
        Ok(book)
    }

    /// Retires jobs `ids`, once each is final and durable with no driver:
    /// copies taken under the lock, written without it (nothing changes a
    /// final job meanwhile, and readers find it in memory until it is
    /// forgotten), forgotten under it.
    pub(crate) fn retire(&self, ids: &[String]) {
        let taken: Vec<Retiring> = {
            let st = self.lock();
            ids.iter().filter_map(|id| Retiring::of(&st, id)).collect()
        };
        let written: Vec<&Retiring> = taken
            .iter()
            .filter(|r| match self.store.retire(r) {
                Ok(()) => {
                    // Sealed again over anything recorded after the final
                    // move, and in case a crash kept the move but not its
                    // seal (the embedded store flushes the log and the
                    // trees one after the other). Where replicas share jobs
                    // the seal went with the move, fenced like it, and an
                    // unfenced write here could outlive a lost lease.
                    if !self.cluster.shared() {
                        self.seal.seal(&r.id, &r.job, r.head, self.now());
                    }
                    true
                }
                Err(e) => {
                    tracing::warn!(job_id = %r.id, error = %e, "retiring a finished job; it stays in memory");
                    false
                }
            })
            .collect();
        let mut st = self.lock();
        for r in written {
            st.forget(&r.id);
        }
    }

    /// Records where replay may start: before the first event of every job
    /// in memory. (A job that starts later has later events, so an old
    /// checkpoint is only slower, never wrong.)
    pub(crate) fn checkpoint(&self) -> Result<u64, ExecutorError> {
        let first = self.lock().first_event();
        self.store.checkpoint(first, None)
    }

    /// Removes the jobs that finished before `cutoff_ms` (their record,
    /// outputs and events), of `tenant` only when given; nothing of a job
    /// in memory is touched. Returns how many jobs and log records went.
    pub(crate) async fn prune(
        &self,
        cutoff_ms: u64,
        tenant: Option<&str>,
    ) -> Result<(u64, u64), ExecutorError> {
        let first = self.lock().first_event();
        let held = |id: &str| self.lock().find(id).is_some();
        self.store.prune(cutoff_ms, tenant, &held, first).await
    }

    /// Flushes storage (shutdown): everything written is on disk, then the
    /// checkpoint moves up to it.
    pub(crate) fn flush(&self) -> Result<(), ExecutorError> {
        let first = self.lock().first_event();
        self.store.flush(first)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Jobs> {
        crate::lock(&self.jobs)
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The log's last position.
    pub(crate) fn last(&self) -> u64 {
        self.store.last()
    }

    /// Follows how many jobs have finished (CancelJob waits on it).
    pub(crate) fn finishes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.finished.subscribe()
    }

    /// Tells finish waiters to look again (a driver stopped).
    pub(crate) fn bump_finished(&self) {
        self.finished.send_modify(|n| *n += 1);
    }

    /// Stores an accepted job (claimed in `st`) and lists it.
    pub(crate) fn accept(&self, st: &mut Jobs, job_id: &str) -> Result<(), ExecutorError> {
        let lease = self.store.accept(st.get(job_id)?)?;
        if let Some(e) = st.find_mut(job_id) {
            e.lease = lease;
        }
        Ok(())
    }

    /// Appends `ev` for `job_id` (and `task_id`), applying it first. Not
    /// durable until [`JobBook::durable`].
    pub(crate) fn record(&self, st: &mut Jobs, job_id: &str, task_id: &str, ev: JobEvent) -> u64 {
        let now = self.now();
        self.record_at(st, job_id, task_id, ev, None, now)
    }

    /// [`JobBook::record`] stamped at `time_ms`, with the task's outputs when
    /// `ev` stores them.
    pub(crate) fn record_at(
        &self,
        st: &mut Jobs,
        job_id: &str,
        task_id: &str,
        ev: JobEvent,
        stored: Option<&TaskStatus>,
        time_ms: u64,
    ) -> u64 {
        let Some(entry) = st.jobs.get_mut(job_id) else {
            // Not (or no longer) held here: nothing to record.
            return self.last();
        };
        let wire = Event {
            sequence: entry.job.last_sequence + 1,
            time: Some(switchyard_kit::time::timestamp(time_ms)),
            correlation_id: entry.spec().correlation_id.clone(),
            job_id: job_id.to_owned(),
            task_id: task_id.to_owned(),
            kind: ev.kind().to_owned(),
            data: ev.data(),
            chain: Some(switchyard_proto::common::v1::ChainLink {
                n: entry.job.last_sequence + 1,
                prev: entry.chain.hash.to_vec(),
            }),
        };
        let spent_before = entry.job.cost_so_far.map_or(0, |c| c.micro_usd);
        entry.apply(&wire, &ev, |_| stored.cloned());
        self.notifier.observe(entry, &ev, spent_before, time_ms);
        if matches!(entry.state(), JobState::Pending | JobState::Scheduled) {
            st.waiting.insert(job_id.to_owned());
        } else {
            st.waiting.remove(job_id);
        }
        tracing::debug!(
            job_id,
            task_id,
            kind = ev.kind(),
            sequence = wire.sequence,
            "job event"
        );
        // The stored record moves with the job, and with a task's move into
        // or out of waiting for a person (which other replicas list).
        let input = TaskState::InputRequired.as_str();
        let finished = matches!(ev, JobEvent::JobMoved(_)) && entry.state().is_terminal();
        let moved = match ev {
            JobEvent::JobMoved(_) => true,
            JobEvent::TaskMoved(m) => m.to == input || m.from == input,
            _ => false,
        };
        // A job's final move carries its journal's seal: the store writes
        // it with the move, and only where the move is written (a replica
        // that lost the job writes neither).
        let seal = finished.then(|| self.seal.signed(job_id, &entry.job, entry.chain, time_ms));
        let g = self
            .store
            .append(entry, &wire, moved, stored, seal.as_deref());
        entry.cache.push(wire);
        entry.events.push(g);
        st.dirty.insert(job_id.to_owned());
        g
    }

    /// Records an event and has it flushed in the background (shared with
    /// other flushes), so watchers see it soon without this caller waiting.
    pub(crate) fn note(&self, job_id: &str, task_id: &str, ev: JobEvent) {
        {
            let mut st = self.lock();
            self.record(&mut st, job_id, task_id, ev);
        }
        self.flush_wanted.notify_one();
    }

    /// Keeps an attempt's outputs and records that they are kept.
    pub(crate) fn keep_result(&self, st: &mut Jobs, job_id: &str, status: &TaskStatus) -> u64 {
        let ev = JobEvent::ResultStored(events::ResultStored {
            exit_code: status.exit_code,
            agent_id: status.agent_id.clone(),
            truncated: status.output_truncated,
            resource_limit: status.resource_limit.clone(),
        });
        let now = self.now();
        self.record_at(st, job_id, &status.task_id, ev, Some(status), now)
    }

    /// Moves a job through the table, recording the change.
    pub(crate) fn move_job(
        &self,
        st: &mut Jobs,
        job_id: &str,
        to: JobState,
        reason: Reason,
        error: &str,
    ) -> Result<u64, ExecutorError> {
        let from = st.get(job_id)?.state();
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
            let m = switchyard_kit::metrics::global();
            let state = switchyard_kit::metrics::StateLabels {
                state: to.as_str().into(),
            };
            m.jobs_finished.get_or_create(&state).inc();
            let since = created_ms(&st.get(job_id)?.job);
            m.job_duration
                .get_or_create(&state)
                .observe(self.now().saturating_sub(since) as f64 / 1000.0);
            tracing::info!(job_id, %from, %to, %reason, error, "job finished");
        } else {
            tracing::debug!(job_id, %from, %to, "job moved");
        }
        let ev = JobEvent::JobMoved(events::JobMoved {
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
            reason,
            error: error.to_owned(),
        });
        let g = self.record(st, job_id, "", ev);
        if finished(to) {
            self.bump_finished();
        }
        Ok(g)
    }

    /// Moves task `i` through the table, recording the change.
    pub(crate) fn move_task(
        &self,
        st: &mut Jobs,
        job_id: &str,
        i: usize,
        c: Change<'_>,
    ) -> Result<u64, ExecutorError> {
        let entry = st.get(job_id)?;
        let from = entry.task_state(i);
        from.check(c.to)?;
        let task_id = entry.spec().tasks[i].id.clone();
        count_task(entry.spec().tasks[i].kind.as_ref(), c.to);
        // One clock reading: an attempt's end and its retry's due time are
        // exactly the delay apart.
        let now = self.now();
        let ev = JobEvent::TaskMoved(events::TaskMoved {
            from: from.as_str().to_owned(),
            to: c.to.as_str().to_owned(),
            reason: c.reason.map_or("", |r| r.as_str()).to_owned(),
            error: c.error.to_owned(),
            next_attempt_at_ms: c.after_ms.map_or(0, |d| now + d),
            extend: c.extend,
        });
        Ok(self.record_at(st, job_id, &task_id, ev, None, now))
    }

    /// Runs until shutdown: makes events recorded without a waiter
    /// (progress, output, routing) durable soon after they are recorded.
    /// It waits [`NOTED_FLUSH_DELAY`] first: a job's next step (or any
    /// other caller's flush) usually carries them sooner, and a flush of
    /// their own started just before that step's would make it wait for
    /// two.
    pub(crate) async fn flush_in_background(&self) {
        loop {
            tokio::select! {
                _ = self.flush_wanted.notified() => {}
                _ = self.shutdown.wait() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(NOTED_FLUSH_DELAY) => {}
                _ = self.shutdown.wait() => return,
            }
            if let Err(e) = self.durable(self.last()).await {
                tracing::warn!(error = %e, "flushing job events");
            }
        }
    }

    /// Waits until the log is durable up to `g`, then tells each job's
    /// watchers how far its events are durable.
    pub(crate) async fn durable(&self, g: u64) -> Result<(), ExecutorError> {
        if self.told.load(std::sync::atomic::Ordering::Acquire) >= g {
            // On disk, and whoever saw it there told the watchers.
            return Ok(());
        }
        // Free when a flush asked for by another caller (or another
        // service sharing the database) carried it already.
        let upto = self.store.durable(g).await?;
        // Jobs whose writes were refused (taken over) leave memory before
        // any caller learns its position is done, so no attempt of theirs
        // starts on a step that was not stored.
        for id in self.cluster.take_lost() {
            self.drop_job(&id, true);
        }
        let mut st_guard = self.lock();
        let st = &mut *st_guard;
        let mut retire = Vec::new();
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
                if e.state().is_terminal() && !st.drivers.contains_key(id) {
                    retire.push(id.clone());
                }
            }
            !all
        });
        drop(st_guard);
        self.told
            .fetch_max(upto, std::sync::atomic::Ordering::AcqRel);
        self.retire(&retire);
        Ok(())
    }

    // ------------------------------------------------------------ members

    /// Takes job `id`, claimed at `epoch`, into memory to run it here (its
    /// state rebuilt from its events); returns its state.
    pub(crate) async fn adopt(
        &self,
        id: &str,
        epoch: i64,
        fetched: bool,
    ) -> Result<JobState, ExecutorError> {
        let mut e = self
            .store
            .load(id, true)
            .await?
            .ok_or_else(|| ExecutorError::NotFound(id.into()))?;
        e.lease = epoch;
        e.fetched = fetched;
        let state = e.state();
        let mut st = self.lock();
        if matches!(state, JobState::Pending | JobState::Scheduled) {
            st.waiting.insert(id.to_owned());
        }
        st.jobs.insert(id.to_owned(), e);
        Ok(state)
    }

    /// Hands job `id` back for another member to run (no room here,
    /// draining, or a driver that stopped early) where other members may;
    /// on one node the job stays (it resumes here). Returns whether it was
    /// handed back.
    pub(crate) fn hand_back(&self, id: &str) -> bool {
        if !self.cluster.shared() {
            return false;
        }
        self.drop_job(id, false);
        true
    }

    /// Takes job `id` out of memory, its lease released after its queued
    /// writes (handed back); or, when `lost` (another member took it over),
    /// stops its driver and forgets the lease.
    pub(crate) fn drop_job(&self, id: &str, lost: bool) {
        let mut st = self.lock();
        let lease = st.jobs.get(id).map(|e| e.lease);
        st.jobs.remove(id);
        st.waiting.remove(id);
        st.dirty.remove(id);
        let ctl = st.drivers.remove(id);
        drop(st);
        if let Some(lease) = lease {
            self.cluster.release(id, lease, lost);
        }
        if lost {
            if let Some(ctl) = ctl {
                ctl.stop();
            }
            tracing::warn!(job_id = %id, "lease lost: the job runs on another replica now");
        }
        self.bump_finished();
    }

    /// [`JobBook::durable`] for an attempt of job `job_id` about to act
    /// outside the job: also that its step was stored under the lease it
    /// started under (`lease`), not refused because another member took
    /// the job over — even if this one has claimed the job again since.
    pub(crate) async fn durable_for(
        &self,
        job_id: &str,
        g: u64,
        lease: i64,
    ) -> Result<(), ExecutorError> {
        self.durable(g).await?;
        // The writer notes a refused job before the position moves, so
        // this holds even while the job is still being dropped.
        let here = self.lock().find(job_id).map(|e| e.lease);
        if self.cluster.lost_at(job_id, lease) || here != Some(lease) {
            return Err(ExecutorError::Storage(switchyard_store::StoreError::Io(
                format!("job {job_id} was taken over by another replica; it runs there now"),
            )));
        }
        Ok(())
    }

    /// Whether job `id` may be run by another member right now: jobs are
    /// shared and this one does not hold it in memory.
    pub(crate) fn elsewhere(&self, id: &str) -> bool {
        self.cluster.shared() && self.lock().find(id).is_none()
    }

    // ------------------------------------------------------------ reads

    /// `f` of job `id` wherever it is: in memory while it runs here, else
    /// as stored.
    pub(crate) async fn read<R>(
        &self,
        id: &str,
        f: impl FnOnce(&JobEntry) -> R,
    ) -> Result<R, ExecutorError> {
        {
            let st = self.lock();
            if let Some(e) = st.find(id) {
                return Ok(f(e));
            }
        }
        match self.store.load(id, false).await? {
            Some(e) => Ok(f(&e)),
            None => Err(ExecutorError::NotFound(id.into())),
        }
    }

    /// Stored job `id` (one not held here: finished, or on another replica)
    /// with the events of its log that `keep` picks replayed through the
    /// job's one `apply` — what a finished job's record does not keep
    /// (answers, conversations) but its log does. `None`: no such job.
    pub(crate) async fn stored_with(
        &self,
        id: &str,
        keep: impl Fn(&JobEvent) -> bool,
    ) -> Result<Option<JobEntry>, ExecutorError> {
        let Some(mut e) = self.store.load(id, false).await? else {
            return Ok(None);
        };
        for wire in self
            .store
            .events(id, 0, e.job.last_sequence, &e.events)
            .await?
        {
            if let Ok(Some(ev)) = JobEvent::decode(&wire.kind, wire.data.as_ref())
                && keep(&ev)
            {
                e.apply(&wire, &ev, |_| None);
            }
        }
        Ok(Some(e))
    }

    /// Job `id`'s record without its outputs, wherever it is (no outputs
    /// read, unlike [`JobBook::read`]).
    pub(crate) async fn record_of(&self, id: &str) -> Result<Job, ExecutorError> {
        if let Some(e) = self.lock().find(id) {
            return Ok(e.job.clone());
        }
        self.store
            .record(id)
            .await?
            .ok_or_else(|| ExecutorError::NotFound(id.into()))
    }

    /// A job as it is now, wherever it is.
    pub(crate) async fn job(&self, job_id: &str) -> Result<Job, ExecutorError> {
        self.read(job_id, |e| e.job.clone()).await
    }

    /// GetResult: the outputs of the job's sink tasks (no dependents), by
    /// task id, wherever the job is.
    pub(crate) async fn result(&self, job_id: &str) -> Result<GetResultResponse, ExecutorError> {
        let now = self.now();
        self.read(job_id, |e| result_of(e, now)).await
    }

    /// JOB_NOT_FOUND unless `p` may see job `job_id`: its tenant's jobs, and
    /// for submitters and agents only their own.
    pub(crate) async fn visible(&self, p: &Principal, job_id: &str) -> Result<(), ExecutorError> {
        let here = self
            .lock()
            .find(job_id)
            .map(|e| p.may_see(&e.job.tenant, &e.job.submitted_by));
        let seen = match here {
            Some(seen) => seen,
            None => self
                .store
                .record(job_id)
                .await?
                .is_some_and(|j| p.may_see(&j.tenant, &j.submitted_by)),
        };
        if seen {
            Ok(())
        } else {
            Err(ExecutorError::NotFound(job_id.into()))
        }
    }

    /// ListJobs: newest first, filtered, paginated by job id; a page of
    /// stored jobs at a time, the ones in memory shown as they are there.
    pub(crate) async fn list_for(
        &self,
        req: &ListJobsRequest,
        p: &Principal,
    ) -> Result<ListJobsResponse, ExecutorError> {
        let size = switchyard_core::validate::page_size(req.page_size);
        let mut before = if req.page_token.is_empty() {
            None
        } else {
            let j = self.record_of(&req.page_token).await?;
            Some((created_ms(&j), req.page_token.clone()))
        };
        let mut jobs: Vec<Job> = Vec::new();
        let mut next = String::new();
        'pages: loop {
            let page = self
                .store
                .page(before.as_ref().map(|(c, id)| (*c, id.as_str())), LIST_PAGE)
                .await?;
            let full = page.len() == LIST_PAGE;
            for (id, record) in page {
                before = Some((created_ms(&record), id.clone()));
                // Newest first: past the range's start, nothing older can be in it.
                if req
                    .created_after
                    .as_ref()
                    .is_some_and(|t| created_ms(&record) < switchyard_kit::time::timestamp_ms(t))
                {
                    break 'pages;
                }
                let live = self.lock().find(&id).map(|e| e.job.clone());
                let mut j = match live {
                    Some(j) => j,
                    // Not finished when the page was read (stored without a
                    // final record), retired since: its final record; gone
                    // since (deleted): not listed.
                    None if record.state == 0 => match self.store.record(&id).await? {
                        Some(r) if r.state != 0 => r,
                        _ => continue,
                    },
                    None => record,
                };
                if !listed(req, p, &j) {
                    continue;
                }
                if jobs.len() == size {
                    next = jobs.last().map_or(String::new(), |j| {
                        j.spec.as_ref().map_or(String::new(), |s| s.job_id.clone())
                    });
                    break 'pages;
                }
                strip_outputs(&mut j);
                jobs.push(j);
            }
            if !full {
                break;
            }
        }
        Ok(ListJobsResponse {
            jobs,
            next_page_token: next,
        })
    }
}

/// Whether ListJobs `req` shows job `j` to `p`.
fn listed(req: &ListJobsRequest, p: &Principal, j: &Job) -> bool {
    let spec = j.spec.as_ref();
    let of = |f: fn(&JobSpec) -> &str| spec.map_or("", f);
    p.may_see(&j.tenant, &j.submitted_by)
        && (req.states.is_empty() || req.states.contains(&j.state))
        && (req.plan_id.is_empty() || of(|s| &s.plan_id) == req.plan_id)
        && (req.correlation_id.is_empty() || of(|s| &s.correlation_id) == req.correlation_id)
        && (req.submitted_by.is_empty() || j.submitted_by == req.submitted_by)
        && (!req.dead_letter || dead_lettered(j))
        && req
            .created_before
            .as_ref()
            .is_none_or(|t| created_ms(j) < switchyard_kit::time::timestamp_ms(t))
        && req
            .created_after
            .as_ref()
            .is_none_or(|t| created_ms(j) >= switchyard_kit::time::timestamp_ms(t))
        && req
            .labels
            .iter()
            .all(|(k, v)| spec.and_then(|s| s.labels.get(k)) == Some(v))
}

/// A finished job's copy to keep once it leaves memory.
pub(crate) struct Retiring {
    pub(crate) id: String,
    /// Its final record, outputs stripped.
    pub(crate) job: Job,
    /// Where its events are in the log.
    pub(crate) positions: Positions,
    /// Its journal's head.
    pub(crate) head: switchyard_kit::chain::Head,
}

impl Retiring {
    /// Job `id`'s copy, when it can retire: final, durable, no driver.
    pub(crate) fn of(st: &Jobs, id: &str) -> Option<Retiring> {
        let e = st.jobs.get(id)?;
        let done = e.state().is_terminal()
            && *e.durable_to.borrow() >= e.job.last_sequence
            && !st.drivers.contains_key(id);
        if !done {
            return None;
        }
        Some(Retiring {
            id: id.to_owned(),
            job: stripped(&e.job),
            positions: Positions {
                positions: e.events.clone(),
            },
            head: e.chain,
        })
    }
}

/// A job's record without its tasks' outputs (kept apart).
pub(crate) fn stripped(j: &Job) -> Job {
    let mut job = j.clone();
    for t in &mut job.tasks {
        t.stdout.clear();
        t.stderr.clear();
        t.output = None;
    }
    job
}

/// Whether job `j` is in the dead letter.
pub(crate) fn dead_lettered(j: &Job) -> bool {
    j.state == switchyard_proto::executor::v1::JobState::Discarded as i32
        && j.spec.as_ref().is_some_and(|s| s.dead_letter)
}

/// GetResult of job `e` at `now`.
fn result_of(e: &JobEntry, now: u64) -> GetResultResponse {
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
        (Some(a), None) => now.saturating_sub(a),
        _ => 0,
    };
    GetResultResponse {
        job_id: e.id().to_owned(),
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
    }
}

/// When a job was created, ms.
pub(crate) fn created_ms(j: &Job) -> u64 {
    j.created_at
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms)
}

/// Jobs read per query when listing.
const LIST_PAGE: usize = 200;
/// How long events recorded without a waiter wait for another flush to
/// carry them before the background flusher asks for one.
const NOTED_FLUSH_DELAY: std::time::Duration = std::time::Duration::from_millis(2);

/// A retired job's event positions in the log.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Positions {
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) positions: Vec<u64>,
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

/// A task kind's name, as metrics and spans say it.
pub(crate) fn kind_name(
    kind: Option<&switchyard_proto::executor::v1::task_spec::Kind>,
) -> &'static str {
    use switchyard_proto::executor::v1::task_spec::Kind;
    match kind {
        Some(Kind::Command(_)) => "command",
        Some(Kind::Agent(_)) => "agent",
        Some(Kind::Llm(_)) => "llm",
        Some(Kind::Queue(_)) => "queue",
        Some(Kind::Input(_)) => "input",
        Some(Kind::Conversation(_)) => "conversation",
        None => "unknown",
    }
}

/// Counts a live task move in the process's metrics: every attempt that
/// starts, and each task's final success or failure, by kind.
fn count_task(kind: Option<&switchyard_proto::executor::v1::task_spec::Kind>, to: TaskState) {
    let m = switchyard_kit::metrics::global();
    let family = match to {
        TaskState::Running => &m.tasks_started,
        TaskState::Succeeded => &m.tasks_succeeded,
        TaskState::Failed => &m.tasks_failed,
        _ => return,
    };
    let kind = kind_name(kind);
    family
        .get_or_create(&switchyard_kit::metrics::TaskLabels { kind: kind.into() })
        .inc();
}

impl switchyard_kit::metrics::Gauges for JobBook {
    fn set(&self, m: &switchyard_kit::metrics::Metrics) {
        let now = self.now();
        self.lock().gauges(m, now);
    }
}
