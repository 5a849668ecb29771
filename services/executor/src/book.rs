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

use switchyard_core::Clock;
use switchyard_core::Reason;
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_kit::auth::Principal;
use switchyard_kit::shutdown::Shutdown;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{
    GetResultResponse, Job, JobSpec, ListJobsRequest, ListJobsResponse, TaskStatus,
};
use switchyard_store::{Log, Store, Tree};
use tonic::Status;

use crate::error::ExecutorError;
use crate::events::{self, JobEvent};
use crate::job::JobEntry;

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
}

/// The jobs in memory, behind the book's lock.
#[derive(Default)]
pub(crate) struct Jobs {
    jobs: HashMap<String, JobEntry>,
    /// Jobs by creation (ms, id), for listing newest first.
    order: BTreeSet<(u64, String)>,
    /// Drivers running, by job id.
    pub(crate) drivers: HashMap<String, Arc<Control>>,
    /// Jobs with events not yet known durable.
    dirty: HashSet<String>,
    /// Jobs waiting for approval or their scheduled time (what the poller checks).
    pub(crate) waiting: BTreeSet<String>,
}

impl Jobs {
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
    specs: Tree<Job>,
    outputs: Tree<TaskStatus>,
    jobs: Mutex<Jobs>,
    shutdown: Shutdown,
    /// Bumped whenever a job finishes (for waiters such as CancelJob).
    finished: tokio::sync::watch::Sender<u64>,
    /// Wakes the background flusher of events nobody waits for.
    flush_wanted: tokio::sync::Notify,
}

impl JobBook {
    /// Opens the book on `store`, replaying its event log.
    pub(crate) fn open(
        store: &Store,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
    ) -> Result<JobBook, ExecutorError> {
        let events = store.log::<Event>("events")?;
        let specs = store.tree::<Job>("jobs")?;
        let outputs = store.tree::<TaskStatus>("outputs")?;
        let mut st = Jobs::default();
        for r in specs.iter() {
            let (id, job) = r?;
            let Some(spec) = job.spec.clone() else {
                continue;
            };
            // Stored specs were validated when accepted; only their graph is
            // rebuilt, so a later config change (say, a shorter allowlist)
            // cannot stop accepted jobs from loading.
            let dag = crate::spec::dag(&spec).map_err(ExecutorError::Invalid)?;
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
            let Some(entry) = st.jobs.get_mut(&ev.job_id) else {
                continue;
            };
            let Some(typed) = JobEvent::decode(&ev.kind, ev.data.as_ref())? else {
                continue;
            };
            // Outputs are read only for the events that store them.
            let stored = |task: &str| outputs.get(&output_key(&ev.job_id, task)).ok().flatten();
            entry.apply(&ev, &typed, stored);
            entry.events.push(g);
        }
        for e in st.jobs.values_mut() {
            e.durable_to.send_replace(e.job.last_sequence);
        }
        st.waiting = st
            .in_states(&[JobState::Pending, JobState::Scheduled])
            .into_iter()
            .collect();
        Ok(JobBook {
            store: store.clone(),
            clock,
            events,
            specs,
            outputs,
            jobs: Mutex::new(st),
            shutdown,
            finished: tokio::sync::watch::channel(0).0,
            flush_wanted: tokio::sync::Notify::new(),
        })
    }

    /// Flushes storage (shutdown).
    pub(crate) fn flush_blocking(&self) -> Result<(), ExecutorError> {
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
        self.events.last()
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
        let stored = Job {
            spec: Some(spec.clone()),
            created_at,
            ..Default::default()
        };
        self.specs.put(&spec.job_id, &stored)?;
        st.order.insert((created, spec.job_id.clone()));
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
            return self.events.last();
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
        entry.cache.push(wire.clone());
        let (g, _) = self.events.append(|_| wire);
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
        self.outputs
            .put(&output_key(job_id, &status.task_id), status)?;
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
    pub(crate) async fn flush_in_background(&self) {
        loop {
            tokio::select! {
                _ = self.flush_wanted.notified() => {}
                _ = self.shutdown.wait() => return,
            }
            if let Err(e) = self.durable(self.events.last()).await {
                tracing::warn!(error = %e, "flushing job events");
            }
        }
    }

    /// Waits until the log is durable up to `g`, then tells each job's
    /// watchers how far its events are durable.
    pub(crate) async fn durable(&self, g: u64) -> Result<(), ExecutorError> {
        if self.events.durable() >= g {
            // Already on disk; whoever flushed it told the watchers.
            return Ok(());
        }
        self.events.make_durable(g).await?;
        let upto = self.events.durable();
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

    // ------------------------------------------------------------ reads

    /// A job as it is now.
    pub(crate) fn job(&self, job_id: &str) -> Result<Job, ExecutorError> {
        Ok(self.lock().get(job_id)?.job.clone())
    }

    /// JOB_NOT_FOUND unless `p` may see job `job_id`: its tenant's jobs, and
    /// for submitters and agents only their own.
    pub(crate) fn visible(&self, p: &Principal, job_id: &str) -> Result<(), ExecutorError> {
        match self.lock().find(job_id) {
            Some(e) if p.may_see(&e.job.tenant, &e.job.submitted_by) => Ok(()),
            _ => Err(ExecutorError::NotFound(job_id.into())),
        }
    }

    /// ListJobs: newest first, filtered, paginated by job id.
    pub(crate) fn list_for(&self, req: &ListJobsRequest, p: &Principal) -> ListJobsResponse {
        let size = switchyard_core::validate::page_size(req.page_size);
        let st = self.lock();
        let wanted = |e: &JobEntry| {
            p.may_see(&e.job.tenant, &e.job.submitted_by)
                && (req.states.is_empty() || req.states.contains(&e.job.state))
                && (req.plan_id.is_empty() || e.spec().plan_id == req.plan_id)
                && (req.correlation_id.is_empty() || e.spec().correlation_id == req.correlation_id)
        };
        let newest_first = st.order.iter().rev().map(|(_, id)| id);
        let after_token = newest_first
            .skip_while(|id| !req.page_token.is_empty() && **id != req.page_token)
            .skip(usize::from(!req.page_token.is_empty()));
        let mut jobs = Vec::new();
        let mut next = String::new();
        for e in after_token
            .filter_map(|id| st.jobs.get(id))
            .filter(|e| wanted(e))
        {
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
        ListJobsResponse {
            jobs,
            next_page_token: next,
        }
    }

    /// GetResult: the outputs of the job's sink tasks (no dependents), by task id.
    pub(crate) fn result(&self, job_id: &str) -> Result<GetResultResponse, ExecutorError> {
        let st = self.lock();
        let e = st.get(job_id)?;
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

    /// Follows how far `job_id`'s events are durable.
    fn durable_to(&self, job_id: &str) -> Result<tokio::sync::watch::Receiver<u64>, ExecutorError> {
        Ok(self.lock().get(job_id)?.durable_to.subscribe())
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
                let e = st.get(job_id)?;
                let state = e.state();
                if finished(state) && *durable.borrow_and_update() >= e.job.last_sequence {
                    return Ok(Some(state));
                }
            }
            tokio::select! {
                changed = durable.changed() => if changed.is_err() { return Ok(None) },
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
    ) -> Result<tokio::sync::mpsc::Receiver<Result<Event, Status>>, ExecutorError> {
        let mut durable = self.durable_to(job_id)?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let book = self.clone();
        let id = job_id.to_owned();
        tokio::spawn(async move {
            let mut sent = after;
            loop {
                let upto = *durable.borrow_and_update();
                let Some((batch, end)) = book.durable_events(&id, sent, upto) else {
                    return;
                };
                let batch = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                        return;
                    }
                };
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
                    _ = book.shutdown.wait() => return,
                }
            }
        });
        Ok(rx)
    }

    /// `job_id`'s events with sequences in `(after, upto]`, in order, and
    /// whether they include its final one. `None` when the job is gone.
    #[allow(clippy::type_complexity)]
    fn durable_events(
        &self,
        job_id: &str,
        after: u64,
        upto: u64,
    ) -> Option<(Result<Vec<Event>, ExecutorError>, bool)> {
        // Under the lock: cached events, or the log positions of the rest.
        let (cached, from_log, end) = {
            let st = self.lock();
            let e = st.find(job_id)?;
            let mut cached = Vec::new();
            let mut from_log = Vec::new();
            for seq in after + 1..=upto {
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
            match self.events.read(g - 1, g, 1) {
                Ok(mut r) => batch.extend(r.pop().map(|(_, ev)| ev)),
                Err(e) => return Some((Err(e.into()), true)),
            }
        }
        batch.extend(cached);
        batch.sort_by_key(|e| e.sequence);
        Some((Ok(batch), end))
    }
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
