//! The job book: the only owner of job state and the only writer of job
//! events. Every change is a typed [`JobEvent`] applied to the job's
//! [`JobEntry`] and appended to the durable log in the same step; reads
//! (`GetJob`, `ListJobs`, `GetResult`, `WatchJob`) are answered from here.
//!
//! Durability: appends are group-committed; [`JobBook::durable`] waits for a
//! log position and then tells each job's watchers how far its events are
//! on disk. Start-up ([`JobBook::open`]) replays the log through the same
//! `apply`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use switchyard_core::Clock;
use switchyard_core::Reason;
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_kit::auth::Principal;
use switchyard_kit::shutdown::Shutdown;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{
    GetResultResponse, Job, JobSpec, ListJobsRequest, ListJobsResponse, TaskStatus, WatchDetail,
};
use switchyard_store::{Log, Mark, Number, Store, Tree};
use tonic::Status;

use crate::error::ExecutorError;
use crate::events::{self, JobEvent};
use crate::job::JobEntry;
use crate::pg::PgJobs;

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

    /// The log position of the first event of any job in memory.
    fn first_event(&self) -> Option<u64> {
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
    store: Store,
    clock: Arc<dyn Clock>,
    events: Log<Event>,
    /// Every job by id: a running job's spec and creation time; a finished
    /// (retired) job's final record, its outputs stripped.
    specs: Tree<Job>,
    outputs: Tree<TaskStatus>,
    /// Jobs not yet retired (start-up loads only these).
    live: Tree<Mark>,
    /// Every job by `{created ms:016x}/{id}`, for listing newest first.
    by_time: Tree<Mark>,
    /// A retired job's event positions in the log.
    index: Tree<Positions>,
    /// The layout version and the replay checkpoint.
    meta: Tree<Number>,
    jobs: Mutex<Jobs>,
    shutdown: Shutdown,
    /// Bumped whenever a job finishes (for waiters such as CancelJob).
    finished: tokio::sync::watch::Sender<u64>,
    /// The log position up to which watchers have been told their jobs'
    /// events are durable.
    told: std::sync::atomic::AtomicU64,
    /// Wakes the background flusher of events nobody waits for.
    flush_wanted: tokio::sync::Notify,
    /// On PostgreSQL: the shared tables (the sled trees above stay empty).
    pub(crate) pg: Option<Arc<PgJobs>>,
}

impl JobBook {
    /// Opens the book on `store`: loads the jobs not yet retired and
    /// replays the log from the checkpoint (a data directory of the first
    /// layout is replayed whole once, and its finished jobs retired).
    pub(crate) fn open(
        store: &Store,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
        pg: Option<Arc<PgJobs>>,
    ) -> Result<JobBook, ExecutorError> {
        let book = JobBook {
            store: store.clone(),
            clock,
            events: store.log::<Event>("events")?,
            specs: store.tree::<Job>("jobs")?,
            outputs: store.tree::<TaskStatus>("outputs")?,
            live: store.tree::<Mark>("live")?,
            by_time: store.tree::<Mark>("by_time")?,
            index: store.tree::<Positions>("index")?,
            meta: store.tree::<Number>("meta")?,
            jobs: Mutex::new(Jobs::default()),
            shutdown,
            finished: tokio::sync::watch::channel(0).0,
            told: std::sync::atomic::AtomicU64::new(0),
            flush_wanted: tokio::sync::Notify::new(),
            pg,
        };
        if book.pg.is_some() {
            // Jobs are claimed from the shared tables once started.
            return Ok(book);
        }
        let layout = book.meta.get(LAYOUT)?.map_or(1, |m| m.value);
        let first_layout = layout < 2 && !book.specs.is_empty();
        let started = Instant::now();
        let mut st = Jobs::default();
        let ids: Vec<String> = if first_layout {
            book.specs
                .iter()
                .map(|r| r.map(|(id, _)| id))
                .collect::<Result<_, _>>()?
        } else {
            book.live
                .iter()
                .map(|r| r.map(|(id, _)| id))
                .collect::<Result<_, _>>()?
        };
        for id in ids {
            let Some(job) = book.specs.get(&id)? else {
                continue;
            };
            let Some(spec) = job.spec.clone() else {
                continue;
            };
            // Stored specs were validated when accepted; only their graph is
            // rebuilt, so a later config change (say, a shorter allowlist)
            // cannot stop accepted jobs from loading.
            let dag = crate::spec::dag(&spec).map_err(ExecutorError::Invalid)?;
            let mut entry = JobEntry::new(spec, dag, created_ms(&job));
            entry.job.created_at = job.created_at;
            st.jobs.insert(id, entry);
        }
        let after = if first_layout {
            0
        } else {
            book.meta.get(CHECKPOINT)?.map_or(0, |m| m.value)
        };
        let (replayed, applied) = book.replay(&mut st, after)?;
        for e in st.jobs.values_mut() {
            e.durable_to.send_replace(e.job.last_sequence);
        }
        st.waiting = st
            .in_states(&[JobState::Pending, JobState::Scheduled])
            .into_iter()
            .collect();
        if first_layout {
            book.upgrade(&mut st)?;
        } else if layout < 2 {
            // A new data directory starts in this layout.
            book.meta.put(LAYOUT, &Number { value: 2 })?;
        }
        tracing::info!(
            jobs = st.jobs.len(),
            replayed,
            applied,
            after,
            ms = started.elapsed().as_millis() as u64,
            "job book open"
        );
        *book.lock() = st;
        book.checkpoint()?;
        Ok(book)
    }

    /// Applies the log's records after `after` to the jobs loaded;
    /// returns how many it read and how many it applied.
    fn replay(&self, st: &mut Jobs, after: u64) -> Result<(u64, u64), ExecutorError> {
        let (mut read, mut applied) = (0u64, 0u64);
        let mut told = Instant::now();
        for r in self.events.replay_after(after) {
            let (g, ev) = r?;
            read += 1;
            if told.elapsed() >= Duration::from_secs(2) {
                told = Instant::now();
                tracing::info!(
                    read,
                    at = g,
                    last = self.events.last(),
                    "replaying job events"
                );
            }
            let Some(entry) = st.jobs.get_mut(&ev.job_id) else {
                continue;
            };
            let Some(typed) = JobEvent::decode(&ev.kind, ev.data.as_ref())? else {
                continue;
            };
            // Outputs are read only for the events that store them.
            let outputs = &self.outputs;
            let stored = |task: &str| outputs.get(&output_key(&ev.job_id, task)).ok().flatten();
            entry.apply(&ev, &typed, stored);
            entry.events.push(g);
            applied += 1;
        }
        Ok((read, applied))
    }

    /// Moves a data directory of the first layout to this one: every job
    /// indexed by time, the finished ones retired.
    fn upgrade(&self, st: &mut Jobs) -> Result<(), ExecutorError> {
        let ids: Vec<String> = st.jobs.keys().cloned().collect();
        for id in ids {
            let created = st.jobs.get(&id).map_or(0, |e| created_ms(&e.job));
            self.by_time.put(&time_key(created, &id), &Mark {})?;
            self.live.put(&id, &Mark {})?;
            if st.jobs.get(&id).is_some_and(|e| e.state().is_terminal()) {
                self.retire(st, &id)?;
            }
        }
        self.meta.put(LAYOUT, &Number { value: 2 })?;
        self.store.flush_blocking()?;
        tracing::info!("job book upgraded: finished jobs are read from disk on demand");
        Ok(())
    }

    /// Moves a finished job out of memory: its final record, without its
    /// outputs (kept apart), and where its events are, go to disk.
    fn retire(&self, st: &mut Jobs, id: &str) -> Result<(), ExecutorError> {
        if let Some(r) = retiring(st, id) {
            self.write_retired(&r)?;
            forget(st, id);
        }
        Ok(())
    }

    /// Writes what a retired job keeps on disk (outside the book's lock:
    /// the job is final, so nothing changes it meanwhile, and readers find
    /// it in memory until [`forget`] removes it there).
    fn write_retired(&self, r: &Retiring) -> Result<(), ExecutorError> {
        if self.pg.is_some() {
            // The job's row holds its final record (written with its
            // final event).
            return Ok(());
        }
        self.specs.put(&r.id, &r.job)?;
        self.index.put(&r.id, &r.positions)?;
        self.live.remove(&r.id)?;
        Ok(())
    }

    /// Retires jobs `ids`, once each is final and durable with no driver:
    /// copies taken under the lock, written without it, forgotten under it.
    fn retire_all(&self, ids: &[String]) {
        let taken: Vec<Retiring> = {
            let st = self.lock();
            ids.iter().filter_map(|id| retiring(&st, id)).collect()
        };
        let written: Vec<&Retiring> = taken
            .iter()
            .filter(|r| match self.write_retired(r) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(job_id = %r.id, error = %e, "retiring a finished job; it stays in memory");
                    false
                }
            })
            .collect();
        let mut st = self.lock();
        for r in written {
            forget(&mut st, &r.id);
        }
    }

    /// Retires job `id` once it is final, durable and no driver runs it.
    pub(crate) fn retire_if_done(&self, id: &str) {
        self.retire_all(&[id.to_owned()]);
    }

    /// A retired job, rebuilt from disk (`None`: no such job).
    fn load_retired(&self, id: &str) -> Result<Option<JobEntry>, ExecutorError> {
        let Some(job) = self.specs.get(id)? else {
            return Ok(None);
        };
        let Some(spec) = job.spec.clone() else {
            return Ok(None);
        };
        let dag = crate::spec::dag(&spec).map_err(ExecutorError::Invalid)?;
        let mut e = JobEntry::new(spec, dag, created_ms(&job));
        e.job = job;
        for i in 0..e.job.tasks.len() {
            let key = output_key(id, &e.job.tasks[i].task_id);
            if let Some(stored) = self.outputs.get(&key)? {
                e.keep_outputs(i, stored);
            }
        }
        e.events = self.index.get(id)?.unwrap_or_default().positions;
        e.durable_to.send_replace(e.job.last_sequence);
        Ok(Some(e))
    }

    /// `f` of job `id`: from memory while it runs, else from disk.
    pub(crate) fn read<R>(
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
        match self.load_retired(id)? {
            Some(e) => Ok(f(&e)),
            None => Err(ExecutorError::NotFound(id.into())),
        }
    }

    /// Records where replay may start: before the first event of every job
    /// not yet retired. (A job that starts later has later events, so an
    /// old checkpoint is only slower, never wrong.)
    pub(crate) fn checkpoint(&self) -> Result<u64, ExecutorError> {
        self.checkpoint_upto(self.events.durable())
    }

    /// [`JobBook::checkpoint`], never past `upto`: what is on disk (a crash
    /// could lose records after it, and their numbers be handed out again).
    fn checkpoint_upto(&self, upto: u64) -> Result<u64, ExecutorError> {
        self.checkpoint_of(&self.lock(), upto)
    }

    /// [`JobBook::checkpoint_upto`] of the jobs `st` (the book's lock held).
    fn checkpoint_of(&self, st: &Jobs, upto: u64) -> Result<u64, ExecutorError> {
        if self.pg.is_some() {
            return Ok(0);
        }
        let at = st
            .first_event()
            .map_or(self.events.last(), |f| f - 1)
            .min(upto);
        self.meta.put(CHECKPOINT, &Number { value: at })?;
        Ok(at)
    }

    /// Removes the jobs that finished before `cutoff_ms` (their record,
    /// outputs and events), of `tenant` only when given; nothing of a job
    /// not yet retired is touched. Returns how many jobs and log records went.
    pub(crate) async fn prune(
        &self,
        cutoff_ms: u64,
        tenant: Option<&str>,
    ) -> Result<(u64, u64), ExecutorError> {
        if let Some(pg) = &self.pg {
            return Ok(pg.prune(cutoff_ms, tenant).await?);
        }
        let mut keep_from = self.lock().first_event().unwrap_or(self.events.last() + 1);
        let mut jobs = 0;
        for r in self.by_time.iter() {
            let (key, _) = r?;
            let id = key.split_once('/').map_or(key.as_str(), |(_, id)| id);
            if self.lock().find(id).is_some() {
                continue;
            }
            let Some(job) = self.specs.get(id)? else {
                continue;
            };
            let finished = job
                .finished_at
                .as_ref()
                .map(switchyard_kit::time::timestamp_ms);
            let ours = tenant.is_none_or(|t| job.tenant == t);
            if ours && finished.is_some_and(|at| at < cutoff_ms) {
                self.remove_retired(id, &key)?;
                jobs += 1;
            } else {
                // Kept (recent, another tenant's, or accepted a moment ago
                // and not yet in memory here), and so are its events.
                let index = self.index.get(id)?.unwrap_or_default();
                if let Some(&f) = index.positions.first() {
                    keep_from = keep_from.min(f);
                }
            }
        }
        let records = self.events.prune_before(keep_from)?;
        self.checkpoint()?;
        self.store.sync().await?;
        Ok((jobs, records))
    }

    /// Removes retired job `id` (listed under `key`): its record, outputs
    /// and where its events are (the log drops them with their chunk).
    fn remove_retired(&self, id: &str, key: &str) -> Result<(), ExecutorError> {
        self.specs.remove(id)?;
        self.index.remove(id)?;
        self.outputs.remove_prefix(&format!("{id}/"))?;
        self.by_time.remove(key)?;
        Ok(())
    }

    /// Waits (up to `within`) until no driver runs job `id` and it is
    /// retired if it is final: a job that has just ended is still being
    /// wound up for a moment (its run and budget settled).
    pub(crate) async fn settle(&self, id: &str, within: Duration) {
        let mut finishes = self.finishes();
        let until = tokio::time::Instant::now() + within;
        loop {
            self.retire_if_done(id);
            let busy = {
                let st = self.lock();
                st.drivers.contains_key(id) || st.find(id).is_some_and(|e| e.state().is_terminal())
            };
            if !busy {
                return;
            }
            if tokio::time::timeout_at(until, finishes.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Job `id`'s record without its outputs: from memory while it runs,
    /// else its retired record (no outputs read, unlike [`JobBook::read`]).
    pub(crate) fn record_of(&self, id: &str) -> Result<Job, ExecutorError> {
        self.with_record(id, Job::clone)
    }

    /// `f` of job `id`'s record ([`JobBook::record_of`], without a copy
    /// while it runs).
    fn with_record<R>(&self, id: &str, f: impl FnOnce(&Job) -> R) -> Result<R, ExecutorError> {
        if let Some(e) = self.lock().find(id) {
            return Ok(f(&e.job));
        }
        match self.specs.get(id)? {
            Some(job) => Ok(f(&job)),
            None => Err(ExecutorError::NotFound(id.into())),
        }
    }

    /// Job `id` as the dead letter holds it, or why it is not there.
    async fn dead_letter(&self, id: &str) -> Result<Job, ExecutorError> {
        let job = self.record_any(id).await?;
        if dead_lettered(&job) {
            return Ok(job);
        }
        Err(not_in_dead_letter(id, &job))
    }

    /// Starts round `round` of dead-lettered job `id`, for `by`: brought
    /// back into memory, its tasks reset and the job `pending` (admission
    /// follows). Returns the last event recorded.
    pub(crate) fn revive(&self, id: &str, by: &str) -> Result<u64, ExecutorError> {
        // Retired (the usual case, once settled): rebuilt from disk with
        // its earlier events, which the live cache then carries, so
        // watchers read one numbering from the first event.
        let in_memory = self.lock().find(id).is_some();
        let loaded = if in_memory {
            None
        } else {
            let e = self
                .load_retired(id)?
                .ok_or_else(|| ExecutorError::NotFound(id.into()))?;
            if !dead_lettered(&e.job) {
                return Err(not_in_dead_letter(id, &e.job));
            }
            Some(e)
        };
        let mut st = self.lock();
        if let Some(mut e) = loaded
            && st.find(id).is_none()
        {
            e.cache = self
                .events
                .read_each(&e.events)?
                .into_iter()
                .map(|(_, ev)| ev)
                .collect();
            st.jobs.insert(id.to_owned(), e);
        }
        let e = st.get(id)?;
        if !dead_lettered(&e.job) {
            // Not in the dead letter, or retried by someone else meanwhile.
            return Err(not_in_dead_letter(id, &e.job));
        }
        if st.drivers.contains_key(id) {
            return Err(winding_up(id));
        }
        let round = e.job.round + 1;
        if self.pg.is_none() {
            self.live.put(id, &Mark {})?;
            // Replay after a crash must reach back to this job's first event.
            self.checkpoint_of(&st, self.events.durable())?;
        }
        let ev = JobEvent::Revived(events::Revived {
            round,
            by: by.to_owned(),
        });
        self.record(&mut st, id, "", ev);
        self.move_job(&mut st, id, JobState::Pending, Reason::InvalidArgument, "")
    }

    /// On PostgreSQL, takes dead-lettered job `id` into this replica's
    /// memory (claimed at a new epoch) so [`JobBook::revive`] can start its
    /// next round here; nothing to do on sled or when it is here already.
    pub(crate) async fn adopt_dead_letter(&self, id: &str) -> Result<(), ExecutorError> {
        let Some(pg) = &self.pg else {
            return Ok(());
        };
        if self.lock().find(id).is_some() {
            return Ok(());
        }
        self.dead_letter(id).await?;
        match pg.adopt_finished(id).await? {
            Some(epoch) => self.adopt(id, epoch, false).await.map(|_| ()),
            // Retried on another replica meanwhile.
            None => Err(not_in_dead_letter(id, &self.record_any(id).await?)),
        }
    }

    /// Removes dead-lettered job `id` for good.
    pub(crate) async fn delete_dead_letter(&self, id: &str) -> Result<(), ExecutorError> {
        let job = self.dead_letter(id).await?;
        {
            let mut st = self.lock();
            if st.drivers.contains_key(id) {
                return Err(winding_up(id));
            }
            forget(&mut st, id);
        }
        if let Some(pg) = &self.pg {
            return Ok(pg.delete(id).await?);
        }
        self.live.remove(id)?;
        self.remove_retired(id, &time_key(created_ms(&job), id))?;
        self.store.sync().await?;
        Ok(())
    }

    /// Flushes storage (shutdown): everything written is on disk, then the
    /// checkpoint moves up to it.
    pub(crate) fn flush_blocking(&self) -> Result<(), ExecutorError> {
        if self.pg.is_some() {
            // The writer's last batch ran at shutdown.
            return Ok(());
        }
        self.store.flush_blocking()?;
        self.checkpoint_upto(self.events.last())?;
        Ok(self.store.flush_blocking()?)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Jobs> {
        crate::lock(&self.jobs)
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The log's last position.
    pub(crate) fn last(&self) -> u64 {
        match &self.pg {
            Some(pg) => pg.last(),
            None => self.events.last(),
        }
    }

    /// Follows how many jobs have finished (CancelJob waits on it).
    pub(crate) fn finishes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.finished.subscribe()
    }

    /// Tells finish waiters to look again (a driver stopped).
    pub(crate) fn bump_finished(&self) {
        self.finished.send_modify(|n| *n += 1);
    }

    /// Stores an accepted job's spec and lists it (it was claimed).
    pub(crate) fn accept(&self, st: &mut Jobs, spec: &JobSpec) -> Result<(), ExecutorError> {
        let entry = st.get(&spec.job_id)?;
        let created_at = entry.job.created_at;
        let created = created_at
            .as_ref()
            .map_or(0, switchyard_kit::time::timestamp_ms);
        if let Some(pg) = &self.pg {
            let queues = crate::queue::queue_job(spec).then(|| {
                let mut q: Vec<String> = spec
                    .tasks
                    .iter()
                    .filter_map(|t| match &t.kind {
                        Some(switchyard_proto::executor::v1::task_spec::Kind::Queue(q)) => {
                            Some(q.queue.clone())
                        }
                        _ => None,
                    })
                    .collect();
                q.sort();
                q.dedup();
                q
            });
            let new = crate::pg::NewJob {
                id: spec.job_id.clone(),
                tenant: entry.job.tenant.clone(),
                submitted_by: entry.job.submitted_by.clone(),
                created_ms: created,
                context_hash: entry.context_hash.clone(),
                record: entry.job.clone(),
                queues,
                priority: spec.priority,
            };
            pg.accept(new);
            if let Some(e) = st.jobs.get_mut(&spec.job_id) {
                e.lease = 1;
            }
            return Ok(());
        }
        let stored = Job {
            spec: Some(spec.clone()),
            created_at,
            ..Default::default()
        };
        self.specs.put(&spec.job_id, &stored)?;
        self.live.put(&spec.job_id, &Mark {})?;
        self.by_time
            .put(&time_key(created, &spec.job_id), &Mark {})?;
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
        };
        entry.apply(&wire, &ev, |_| stored.cloned());
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
        let g = match &self.pg {
            Some(pg) => {
                let moved = matches!(ev, JobEvent::JobMoved(_)).then(|| {
                    let state = entry.state();
                    let finished = state.is_terminal().then_some(time_ms);
                    (state.as_str().to_owned(), stripped(&entry.job), finished)
                });
                entry.cache.push(wire.clone());
                pg.append(job_id, entry.lease, &wire, moved)
            }
            None => {
                entry.cache.push(wire.clone());
                self.events.append(|_| wire).0
            }
        };
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
    pub(crate) fn keep_result(
        &self,
        st: &mut Jobs,
        job_id: &str,
        status: &TaskStatus,
    ) -> Result<u64, ExecutorError> {
        match &self.pg {
            Some(pg) => pg.output(job_id, status),
            None => self
                .outputs
                .put(&output_key(job_id, &status.task_id), status)?,
        }
        let ev = JobEvent::ResultStored(events::ResultStored {
            exit_code: status.exit_code,
            agent_id: status.agent_id.clone(),
            truncated: status.output_truncated,
            resource_limit: status.resource_limit.clone(),
        });
        let now = self.now();
        Ok(self.record_at(st, job_id, &status.task_id, ev, Some(status), now))
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
            switchyard_kit::metrics::global()
                .jobs_finished
                .get_or_create(&switchyard_kit::metrics::StateLabels {
                    state: to.as_str().into(),
                })
                .inc();
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

    /// Cancels a job that no driver runs: its unfinished tasks, then the job.
    pub(crate) fn cancel_idle(
        &self,
        st: &mut Jobs,
        job_id: &str,
        reason: Reason,
        why: &str,
    ) -> Result<u64, ExecutorError> {
        let n = st.get(job_id)?.job.tasks.len();
        for i in 0..n {
            if !st.get(job_id)?.task_state(i).is_terminal() {
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
        let upto = match &self.pg {
            Some(pg) => {
                pg.durable(g).await?;
                // Jobs whose writes were refused (taken over) leave memory
                // before any caller learns its position is done, so no
                // attempt of theirs starts on a step that was not stored.
                for id in pg.take_lost() {
                    self.stop_lost(&id);
                }
                pg.committed()
            }
            None => {
                self.events.make_durable(g).await?;
                self.events.durable()
            }
        };
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
        self.retire_all(&retire);
        Ok(())
    }

    // ------------------------------------------------------------ replicas

    /// Job `id` from the shared tables: a finished job from its final
    /// record and outputs (unless `replay`), a running one (or any, with
    /// `replay`) as the replay of its events.
    async fn load_pg(
        &self,
        pg: &PgJobs,
        id: &str,
        replay: bool,
    ) -> Result<Option<JobEntry>, ExecutorError> {
        let Some(stored) = pg.stored(id).await? else {
            return Ok(None);
        };
        let Some(spec) = stored.record.spec.clone() else {
            return Ok(None);
        };
        let dag = crate::spec::dag(&spec).map_err(ExecutorError::Invalid)?;
        let mut e = JobEntry::new(spec, dag, created_ms(&stored.record));
        let outputs: HashMap<String, TaskStatus> = pg
            .outputs(id)
            .await?
            .into_iter()
            .map(|s| (s.task_id.clone(), s))
            .collect();
        if stored.finished && !replay {
            e.job = stored.record;
            for i in 0..e.job.tasks.len() {
                if let Some(o) = outputs.get(&e.job.tasks[i].task_id) {
                    e.keep_outputs(i, o.clone());
                }
            }
            e.events = vec![0; usize::try_from(e.job.last_sequence).unwrap_or(0)];
        } else {
            let mut after = 0;
            loop {
                let page = pg.events_after(id, after, REPLAY_PAGE).await?;
                let n = page.len();
                for ev in page {
                    after = ev.sequence;
                    if let Some(typed) = JobEvent::decode(&ev.kind, ev.data.as_ref())? {
                        e.apply(&ev, &typed, |task| outputs.get(task).cloned());
                    }
                    // Stored events are durable: position 0 counts as such.
                    e.events.push(0);
                }
                if n < REPLAY_PAGE as usize {
                    break;
                }
            }
        }
        e.durable_to.send_replace(e.job.last_sequence);
        Ok(Some(e))
    }

    /// Takes job `id`, claimed at `epoch`, into memory to run it here (its
    /// state rebuilt from its events); returns its state.
    pub(crate) async fn adopt(
        &self,
        id: &str,
        epoch: i64,
        fetched: bool,
    ) -> Result<JobState, ExecutorError> {
        let pg = self
            .pg
            .as_ref()
            .ok_or_else(|| ExecutorError::NotFound(id.into()))?;
        let mut e = self
            .load_pg(pg, id, true)
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

    /// Hands job `id` back to the shared tables for another replica to
    /// run (no room here, or a lost lease when `lost`): out of memory now,
    /// its lease released after its queued writes (unless lost).
    pub(crate) fn drop_job(&self, id: &str, lost: bool) -> Option<Arc<Control>> {
        let mut st = self.lock();
        let lease = st.jobs.get(id).map(|e| e.lease);
        st.jobs.remove(id);
        st.waiting.remove(id);
        st.dirty.remove(id);
        let ctl = st.drivers.remove(id);
        drop(st);
        if let (Some(pg), Some(lease)) = (&self.pg, lease) {
            if lost {
                pg.forget(id);
            } else {
                pg.release(id, lease);
            }
        }
        self.bump_finished();
        ctl
    }

    /// Stops job `id` here: another replica took it over.
    pub(crate) fn stop_lost(&self, id: &str) {
        if let Some(ctl) = self.drop_job(id, true) {
            ctl.stop();
        }
        tracing::warn!(job_id = %id, "lease lost: the job runs on another replica now");
    }

    /// [`JobBook::durable`] for an attempt of job `job_id` about to act
    /// outside the job: on PostgreSQL also that its step was stored under
    /// the lease it started under (`lease`), not refused because another
    /// replica took the job over — even if this replica has claimed the
    /// job again since.
    pub(crate) async fn durable_for(
        &self,
        job_id: &str,
        g: u64,
        lease: i64,
    ) -> Result<(), ExecutorError> {
        self.durable(g).await?;
        let Some(pg) = &self.pg else {
            return Ok(());
        };
        // The writer notes a refused job before the position moves, so
        // this holds even while the job is still being dropped.
        let here = self.lock().find(job_id).map(|e| e.lease);
        if pg.lost_at(job_id, lease) || here != Some(lease) {
            return Err(ExecutorError::Storage(switchyard_store::StoreError::Io(
                format!("job {job_id} was taken over by another replica; it runs there now"),
            )));
        }
        Ok(())
    }

    /// `f` of job `id` wherever it is: in memory while this replica runs
    /// it, else on disk (sled) or in the shared tables (PostgreSQL).
    pub(crate) async fn read_any<R>(
        &self,
        id: &str,
        f: impl FnOnce(&JobEntry) -> R,
    ) -> Result<R, ExecutorError> {
        let Some(pg) = &self.pg else {
            return self.read(id, f);
        };
        {
            let st = self.lock();
            if let Some(e) = st.find(id) {
                return Ok(f(e));
            }
        }
        match self.load_pg(pg, id, false).await? {
            Some(e) => Ok(f(&e)),
            None => Err(ExecutorError::NotFound(id.into())),
        }
    }

    /// Job `id`'s record without its outputs, wherever it is.
    pub(crate) async fn record_any(&self, id: &str) -> Result<Job, ExecutorError> {
        let Some(pg) = &self.pg else {
            return self.record_of(id);
        };
        if let Some(e) = self.lock().find(id) {
            return Ok(e.job.clone());
        }
        match pg.stored(id).await? {
            Some(s) => Ok(s.record),
            None => Err(ExecutorError::NotFound(id.into())),
        }
    }

    /// A job as it is now, wherever it is.
    pub(crate) async fn job_any(&self, job_id: &str) -> Result<Job, ExecutorError> {
        self.read_any(job_id, |e| e.job.clone()).await
    }

    /// GetResult, wherever the job is.
    pub(crate) async fn result_any(
        &self,
        job_id: &str,
    ) -> Result<GetResultResponse, ExecutorError> {
        let now = self.now();
        self.read_any(job_id, |e| result_of(e, now)).await
    }

    // ------------------------------------------------------------ reads

    /// JOB_NOT_FOUND unless `p` may see job `job_id`: its tenant's jobs, and
    /// for submitters and agents only their own.
    pub(crate) async fn visible(&self, p: &Principal, job_id: &str) -> Result<(), ExecutorError> {
        let seen = match &self.pg {
            None => self.with_record(job_id, |j| p.may_see(&j.tenant, &j.submitted_by)),
            Some(_) => self
                .record_any(job_id)
                .await
                .map(|j| p.may_see(&j.tenant, &j.submitted_by)),
        };
        match seen {
            Ok(true) => Ok(()),
            _ => Err(ExecutorError::NotFound(job_id.into())),
        }
    }

    /// ListJobs: newest first, filtered, paginated by job id. Running jobs
    /// are read from memory, finished ones from disk.
    pub(crate) async fn list_for(
        &self,
        req: &ListJobsRequest,
        p: &Principal,
    ) -> Result<ListJobsResponse, ExecutorError> {
        let size = switchyard_core::validate::page_size(req.page_size);
        let wanted = |j: &Job| listed(req, p, j);
        if let Some(pg) = &self.pg {
            return self.list_pg(pg, req, size, wanted).await;
        }
        let before = if req.page_token.is_empty() {
            None
        } else {
            let created = self.read(&req.page_token, |e| created_ms(&e.job))?;
            Some(time_key(created, &req.page_token))
        };
        let mut jobs = Vec::new();
        let mut next = String::new();
        for r in self.by_time.iter_rev_before(before.as_deref()) {
            let (key, _) = r?;
            let id = key.split_once('/').map_or(key.as_str(), |(_, id)| id);
            let live = self.lock().find(id).map(|e| e.job.clone());
            let Some(mut j) = live.or(self.specs.get(id)?) else {
                continue;
            };
            if !wanted(&j) {
                continue;
            }
            if jobs.len() == size {
                next = jobs.last().map_or(String::new(), |j: &Job| {
                    j.spec.as_ref().map_or(String::new(), |s| s.job_id.clone())
                });
                break;
            }
            strip_outputs(&mut j);
            jobs.push(j);
        }
        Ok(ListJobsResponse {
            jobs,
            next_page_token: next,
        })
    }

    /// ListJobs from the shared tables: newest first, a page of rows at a
    /// time; jobs running here are shown as they are in memory.
    async fn list_pg(
        &self,
        pg: &PgJobs,
        req: &ListJobsRequest,
        size: usize,
        wanted: impl Fn(&Job) -> bool,
    ) -> Result<ListJobsResponse, ExecutorError> {
        let mut before = if req.page_token.is_empty() {
            None
        } else {
            let j = self.record_any(&req.page_token).await?;
            Some((created_ms(&j), req.page_token.clone()))
        };
        let mut jobs: Vec<Job> = Vec::new();
        let mut next = String::new();
        'pages: loop {
            let page = pg
                .page(before.as_ref().map(|(c, id)| (*c, id.as_str())), LIST_PAGE)
                .await?;
            let full = page.len() == LIST_PAGE as usize;
            for (id, record) in page {
                before = Some((created_ms(&record), id.clone()));
                let live = self.lock().find(&id).map(|e| e.job.clone());
                let mut j = live.unwrap_or(record);
                if !wanted(&j) {
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

    /// GetResult: the outputs of the job's sink tasks (no dependents), by task id.
    pub(crate) fn result(&self, job_id: &str) -> Result<GetResultResponse, ExecutorError> {
        let now = self.now();
        self.read(job_id, |e| result_of(e, now))
    }

    /// Follows how far `job_id`'s events are durable (a retired job's are all).
    fn durable_to(&self, job_id: &str) -> Result<tokio::sync::watch::Receiver<u64>, ExecutorError> {
        self.read(job_id, |e| e.durable_to.subscribe())
    }

    /// Waits, without polling, until `job_id` has finished and its final
    /// event is durable (the point where WatchJob ends). `None` when the
    /// executor shuts down first.
    pub(crate) async fn until_finished(
        &self,
        job_id: &str,
    ) -> Result<Option<JobState>, ExecutorError> {
        // On PostgreSQL a job in memory runs here; else it is stored.
        let local = match &self.pg {
            Some(_) => self.lock().find(job_id).map(|e| e.durable_to.subscribe()),
            None => Some(self.durable_to(job_id)?),
        };
        let Some(mut durable) = local else {
            return self.until_stored_finished(job_id).await;
        };
        loop {
            let state = self
                .read_any(job_id, |e| {
                    let state = e.state();
                    (finished(state) && *durable.borrow_and_update() >= e.job.last_sequence)
                        .then_some(state)
                })
                .await?;
            if state.is_some() {
                return Ok(state);
            }
            tokio::select! {
                changed = durable.changed() => if changed.is_err() {
                    // Retired (or, on PostgreSQL, handed over) meanwhile:
                    // where it is stored says how it stands.
                    let state = self.read_any(job_id, JobEntry::state).await?;
                    if finished(state) || self.pg.is_none() {
                        return Ok(Some(state));
                    }
                    return self.until_stored_finished(job_id).await;
                },
                _ = self.shutdown.wait() => return Ok(None),
            }
        }
    }

    /// [`JobBook::until_finished`] of a job run by another replica (or
    /// none): its stored state, looked at on each wake-up.
    async fn until_stored_finished(&self, job_id: &str) -> Result<Option<JobState>, ExecutorError> {
        let Some(pg) = &self.pg else {
            return Err(ExecutorError::NotFound(job_id.into()));
        };
        // The row's state moves with the final event, in one commit.
        let mut wake = pg.subscribe(job_id);
        loop {
            let stored = pg
                .stored(job_id)
                .await?
                .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
            let state = crate::job::job_state(stored.record.state);
            if finished(state) {
                return Ok(Some(state));
            }
            tokio::select! {
                _ = wake.changed() => {}
                _ = tokio::time::sleep(crate::pg::WATCH_POLL) => {}
                _ = self.shutdown.wait() => return Ok(None),
            }
        }
    }

    /// WatchJob: the job's durable events after `after`, then each new one
    /// as it becomes durable; ends after the job's final event. Running
    /// jobs' events come from memory, finished jobs' from the log.
    pub(crate) fn watch(
        self: &Arc<Self>,
        job_id: &str,
        after: u64,
        detail: WatchDetail,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<Event, Status>>, ExecutorError> {
        let wanted = watched(detail);
        if self.pg.is_some() {
            return Ok(self.watch_pg(job_id, after, wanted));
        }
        let mut durable = self.durable_to(job_id)?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let book = self.clone();
        let id = job_id.to_owned();
        tokio::spawn(async move {
            let mut sent = after;
            loop {
                let upto = *durable.borrow_and_update();
                let (batch, upto_read, end) = match book.durable_events(&id, sent, upto, wanted) {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(e))).await;
                        return;
                    }
                };
                for ev in batch {
                    if tx.send(Ok(ev)).await.is_err() {
                        return;
                    }
                }
                // Events skipped at this detail count as sent.
                sent = sent.max(upto_read);
                if end {
                    return;
                }
                tokio::select! {
                    // Retired meanwhile: the next round reads the rest from disk.
                    changed = durable.changed() => if changed.is_err() {
                        durable = tokio::sync::watch::channel(u64::MAX).1;
                    },
                    _ = book.shutdown.wait() => return,
                }
            }
        });
        Ok(rx)
    }

    /// WatchJob on PostgreSQL: the job's stored events after `after`, read
    /// again on each wake-up (a batch committed here, a notification from
    /// the replica running it, or a poll), so a watcher on any replica sees
    /// one gapless sequence whoever runs the job, across takeovers.
    fn watch_pg(
        self: &Arc<Self>,
        job_id: &str,
        after: u64,
        wanted: fn(&str) -> bool,
    ) -> tokio::sync::mpsc::Receiver<Result<Event, Status>> {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let book = self.clone();
        let id = job_id.to_owned();
        tokio::spawn(async move {
            let Some(pg) = book.pg.clone() else {
                return;
            };
            let mut wake = pg.subscribe(&id);
            let mut sent = after;
            loop {
                wake.borrow_and_update();
                let page = match pg.events_after(&id, sent, REPLAY_PAGE).await {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(ExecutorError::from(e)))).await;
                        return;
                    }
                };
                let full = page.len() == REPLAY_PAGE as usize;
                let mut ending = page.is_empty();
                for ev in page {
                    sent = ev.sequence;
                    // A job's end is its last event unless it is retried
                    // (a dead letter's next round): the stored record says.
                    ending = ends_watch(&ev);
                    if wanted(&ev.kind) && tx.send(Ok(ev)).await.is_err() {
                        return;
                    }
                }
                if full {
                    continue;
                }
                if ending
                    && sent > 0
                    && let Ok(Some(s)) = pg.stored(&id).await
                    && finished(crate::job::job_state(s.record.state))
                    && s.record.last_sequence <= sent
                {
                    return;
                }
                tokio::select! {
                    _ = wake.changed() => {}
                    _ = tokio::time::sleep(crate::pg::WATCH_POLL) => {}
                    _ = tx.closed() => return,
                    _ = book.shutdown.wait() => return,
                }
            }
        });
        rx
    }

    /// `job_id`'s durable events of the `wanted` kinds with sequences in
    /// `(after, upto]`, in order; the last sequence read (events up to it
    /// are durable); and whether they include its final one.
    fn durable_events(
        &self,
        job_id: &str,
        after: u64,
        upto: u64,
        wanted: fn(&str) -> bool,
    ) -> Result<(Vec<Event>, u64, bool), ExecutorError> {
        // Cached events, or the log positions of the rest.
        let (cached, from_log, upto, end) = self.read(job_id, |e| {
            let upto = upto.min(*e.durable_to.borrow()).max(after);
            let mut cached = Vec::new();
            let mut from_log = Vec::new();
            // The cache holds the events from its first on (a job resumed
            // after a restart caches only what it records from then).
            let first_cached = e.cache.first().map_or(u64::MAX, |c| c.sequence);
            for seq in after + 1..=upto {
                let hit = seq
                    .checked_sub(first_cached)
                    .and_then(|i| e.cache.get(usize::try_from(i).ok()?));
                match hit {
                    Some(ev) if wanted(&ev.kind) => cached.push(ev.clone()),
                    Some(_) => {}
                    None => from_log.extend(e.events.get(seq as usize - 1).copied()),
                }
            }
            // The final state is a job's last event.
            let end = finished(e.state()) && upto >= e.job.last_sequence;
            (cached, from_log, upto, end)
        })?;
        let mut batch: Vec<Event> = self
            .events
            .read_each(&from_log)?
            .into_iter()
            .map(|(_, ev)| ev)
            .filter(|ev| wanted(&ev.kind))
            .collect();
        batch.extend(cached);
        batch.sort_by_key(|e| e.sequence);
        Ok((batch, upto, end))
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
}

/// Whether `ev` is a job's move to a state where watching ends.
fn ends_watch(ev: &Event) -> bool {
    matches!(
        JobEvent::decode(&ev.kind, ev.data.as_ref()),
        Ok(Some(JobEvent::JobMoved(m))) if JobState::parse(&m.to).is_some_and(finished)
    )
}

/// Which event kinds WatchJob streams at `detail`.
fn watched(detail: WatchDetail) -> fn(&str) -> bool {
    match detail {
        WatchDetail::Job => |kind| kind == "job.state",
        WatchDetail::Tasks => |kind| kind == "job.state" || kind == "task.state",
        WatchDetail::Unspecified | WatchDetail::All => |_| true,
    }
}

/// A finished job's copy for disk.
struct Retiring {
    id: String,
    job: Job,
    positions: Positions,
}

/// Job `id`'s copy for disk, when it can retire: final, durable, no driver.
fn retiring(st: &Jobs, id: &str) -> Option<Retiring> {
    let e = st.jobs.get(id)?;
    let done = e.state().is_terminal()
        && *e.durable_to.borrow() >= e.job.last_sequence
        && !st.drivers.contains_key(id);
    if !done {
        return None;
    }
    let job = stripped(&e.job);
    Some(Retiring {
        id: id.to_owned(),
        job,
        positions: Positions {
            positions: e.events.clone(),
        },
    })
}

/// A job's record without its tasks' outputs (kept apart).
fn stripped(j: &Job) -> Job {
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

/// Why job `j` (`id`) is not in the dead letter.
fn not_in_dead_letter(id: &str, j: &Job) -> ExecutorError {
    let state = crate::job::job_state(j.state);
    let why = if state == JobState::Discarded {
        " without dead_letter in its spec"
    } else {
        ""
    };
    ExecutorError::NotInDeadLetter {
        job: id.to_owned(),
        state: state.as_str().to_owned(),
        why,
    }
}

/// A dead-lettered job that has only just ended: its driver still settles
/// its run and budget.
fn winding_up(id: &str) -> ExecutorError {
    ExecutorError::NotInDeadLetter {
        job: id.to_owned(),
        state: JobState::Discarded.as_str().to_owned(),
        why: " and still being wound up (its run and budget settled); ask again in a moment",
    }
}

/// Drops a retired job from memory (it is on disk).
fn forget(st: &mut Jobs, id: &str) {
    if st.jobs.get(id).is_some_and(|e| e.state().is_terminal()) {
        st.jobs.remove(id);
        st.waiting.remove(id);
        st.dirty.remove(id);
    }
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
fn created_ms(j: &Job) -> u64 {
    j.created_at
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms)
}

/// A job's key in the by-time index: sorts by creation, then id.
fn time_key(created_ms: u64, id: &str) -> String {
    format!("{created_ms:016x}/{id}")
}

/// Events read per query when replaying or watching from PostgreSQL.
const REPLAY_PAGE: i64 = 1000;
/// Jobs read per query when listing from PostgreSQL.
const LIST_PAGE: i64 = 200;

/// The layout version (`meta` key).
const LAYOUT: &str = "layout";
/// Where replay starts (`meta` key).
const CHECKPOINT: &str = "checkpoint";
/// How long events recorded without a waiter wait for another flush to
/// carry them before the background flusher asks for one.
const NOTED_FLUSH_DELAY: std::time::Duration = std::time::Duration::from_millis(2);

/// A retired job's event positions in the log.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Positions {
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) positions: Vec<u64>,
}

/// Where a task's outputs are kept.
fn output_key(job_id: &str, task_id: &str) -> String {
    format!("{job_id}/{task_id}")
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

/// Counts a live task move in the process's metrics: every attempt that
/// starts, and each task's final success or failure, by kind.
fn count_task(kind: Option<&switchyard_proto::executor::v1::task_spec::Kind>, to: TaskState) {
    use switchyard_proto::executor::v1::task_spec::Kind;
    let m = switchyard_kit::metrics::global();
    let family = match to {
        TaskState::Running => &m.tasks_started,
        TaskState::Succeeded => &m.tasks_succeeded,
        TaskState::Failed => &m.tasks_failed,
        _ => return,
    };
    let kind = match kind {
        Some(Kind::Command(_)) => "command",
        Some(Kind::Agent(_)) => "agent",
        Some(Kind::Llm(_)) => "llm",
        Some(Kind::Queue(_)) => "queue",
        None => "unknown",
    };
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
