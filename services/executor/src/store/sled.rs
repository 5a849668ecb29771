//! Jobs in the embedded store (sled): one node holds them all. Events go
//! to one group-committed log, which also carries what would otherwise be
//! written per job ([`Kept`]): an accepted job's spec in the record of its
//! first event, a task's outputs in the record of its `task.result` event.
//! Once a job finished, its final record (outputs stripped) and where its
//! events are go to trees read when the job is not in memory; every job is
//! listed by creation time from acceptance. Start-up replays the log from
//! the checkpoint (before the first event of every job in memory): a job
//! whose first event it meets is loaded from the spec that event carries,
//! unless it was retired or removed since.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{Job, TaskStatus};
use switchyard_store::{Blobs, Log, Mark, Number, Store, Tree};

use super::{Content, JobStore, Space};
use crate::book::{Jobs, Positions, Retiring, created_ms};
use crate::error::ExecutorError;
use crate::events::JobEvent;
use crate::job::JobEntry;

/// What a log record keeps after the fields of its event (fields 1000 and
/// 1001 are reserved in `Event` for it): durable exactly when the event is,
/// written once, and skipped by every reader of events.
#[derive(Clone, PartialEq, prost::Message)]
struct Kept {
    /// A `task.result` event's task outputs. Data directories of earlier
    /// releases keep them in the `outputs` tree, still read.
    #[prost(message, optional, tag = "1000")]
    output: Option<TaskStatus>,
    /// A job's first event: the job as accepted (spec, creation time).
    /// Earlier releases stored it in the `jobs` tree and listed the job in
    /// `live`, still read.
    #[prost(message, optional, tag = "1001")]
    accepted: Option<Job>,
}

/// The sled backend.
pub(crate) struct SledJobs {
    store: Store,
    events: Log<Event>,
    /// A finished (retired) job's final record, its outputs stripped (and,
    /// from earlier releases, a running job's spec).
    specs: Tree<Job>,
    /// Outputs as releases before [`Kept`] kept them.
    outputs: Tree<TaskStatus>,
    /// Jobs in memory that start-up finds by this list rather than by their
    /// first event: reopened (dead-letter rounds) and those earlier
    /// releases listed.
    live: Tree<Mark>,
    /// The jobs in memory listed in `live` (their mark goes when they retire).
    listed: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Every job by `{created ms:016x}/{id}`, for listing newest first.
    by_time: Tree<Mark>,
    /// A retired job's event positions in the log.
    index: Tree<Positions>,
    /// Journal seals, by job (the space [`crate::audit::Seal`] reads).
    seals: Tree<Vec<u8>>,
    /// Running jobs' periodic checkpoints, by job: they go with the job's
    /// records (its seal stays).
    checkpoints: Tree<Vec<u8>>,
    /// The layout version and the replay checkpoint.
    meta: Tree<Number>,
    /// Never moves: every job stored here is written by this process, so
    /// readers wait on the job in memory instead.
    still: tokio::sync::watch::Sender<u64>,
}

impl SledJobs {
    /// Opens the trees and the log in `store`.
    pub(crate) fn open(store: &Store) -> Result<SledJobs, ExecutorError> {
        Ok(SledJobs {
            store: store.clone(),
            events: store.log::<Event>("events")?,
            specs: store.tree::<Job>("jobs")?,
            outputs: store.tree::<TaskStatus>("outputs")?,
            live: store.tree::<Mark>("live")?,
            listed: std::sync::Mutex::default(),
            by_time: store.tree::<Mark>("by_time")?,
            index: store.tree::<Positions>("index")?,
            seals: store.tree::<Vec<u8>>(crate::audit::SEALS)?,
            checkpoints: store.tree::<Vec<u8>>(crate::audit::LIVE)?,
            meta: store.tree::<Number>("meta")?,
            still: tokio::sync::watch::channel(0).0,
        })
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
            if ev.sequence == 1 && st.find(&ev.job_id).is_none() {
                self.accepted_at(st, g, &ev.job_id)?;
            }
            let Some(entry) = st.find_mut(&ev.job_id) else {
                continue;
            };
            let Some(typed) = JobEvent::decode(&ev.kind, ev.data.as_ref())? else {
                continue;
            };
            // Outputs are read only for the events that store them.
            let stored = |task: &str| self.kept_output(g, &ev.job_id, task);
            entry.apply(&ev, &typed, stored);
            entry.events.push(g);
            applied += 1;
        }
        Ok((read, applied))
    }

    /// Start-up met job `id`'s first event, at `g`: the job, loaded from
    /// the spec that record carries, unless it was retired (its final
    /// record is stored) or removed (pruned or deleted: no longer listed by
    /// time, which acceptance wrote before this record).
    fn accepted_at(&self, st: &mut Jobs, g: u64, id: &str) -> Result<(), ExecutorError> {
        if self.index.get(id)?.is_some() {
            return Ok(());
        }
        let Some((_, kept)) = self.events.read_each_as::<Kept>(&[g])?.pop() else {
            return Ok(());
        };
        let Some(job) = kept.accepted else {
            // An earlier release's: it listed its jobs in `live`.
            return Ok(());
        };
        if self.by_time.get(&time_key(created_ms(&job), id))?.is_none() {
            return Ok(());
        }
        if let Some(entry) = JobEntry::restored(&job)? {
            st.claim(entry);
        }
        Ok(())
    }

    /// The outputs kept with the event at `g` (of `job_id`'s `task`).
    fn kept_output(&self, g: u64, job_id: &str, task: &str) -> Option<TaskStatus> {
        let read = || -> Result<Option<TaskStatus>, ExecutorError> {
            if let Some((_, kept)) = self.events.read_each_as::<Kept>(&[g])?.pop()
                && kept.output.is_some()
            {
                return Ok(kept.output);
            }
            Ok(self.outputs.get(&output_key(job_id, task))?)
        };
        read().unwrap_or_else(|e| {
            tracing::error!(job_id, task_id = task, error = %e, "reading a task's kept outputs");
            None
        })
    }

    /// Moves a data directory of the first layout to this one: every job
    /// indexed by time, the finished ones retired.
    fn upgrade(&self, st: &mut Jobs) -> Result<(), ExecutorError> {
        for id in st.ids() {
            let Some(e) = st.find(&id) else { continue };
            self.by_time
                .put(&time_key(created_ms(&e.job), &id), &Mark {})?;
            self.live.put(&id, &Mark {})?;
            if let Some(r) = Retiring::of(st, &id) {
                self.retire(&r)?;
                st.forget(&id);
            }
        }
        self.meta.put(LAYOUT, &Number { value: 2 })?;
        self.store.flush_blocking()?;
        tracing::info!("job book upgraded: finished jobs are read from disk on demand");
        Ok(())
    }

    /// Removes retired job `id` (listed under `key`): its record, outputs
    /// and where its events are (the log drops them with their chunk).
    fn remove_retired(&self, id: &str, key: &str) -> Result<(), ExecutorError> {
        self.unlist(id)?;
        self.specs.remove(id)?;
        self.index.remove(id)?;
        self.outputs.remove_prefix(&format!("{id}/"))?;
        self.by_time.remove(key)?;
        self.checkpoints.remove(id)?;
        Ok(())
    }

    /// Takes job `id` off the `live` list if it is on it.
    fn unlist(&self, id: &str) -> Result<(), ExecutorError> {
        if crate::lock(&self.listed).remove(id) {
            self.live.remove(id)?;
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl JobStore for SledJobs {
    /// The jobs not yet retired, replayed from the checkpoint (a data
    /// directory of the first layout is replayed whole once, and its
    /// finished jobs retired).
    fn load_held(&self) -> Result<Jobs, ExecutorError> {
        let layout = self.meta.get(LAYOUT)?.map_or(1, |m| m.value);
        let first_layout = layout < 2 && !self.specs.is_empty();
        let started = Instant::now();
        let mut st = Jobs::default();
        let ids: Vec<String> = if first_layout {
            self.specs
                .iter()
                .map(|r| r.map(|(id, _)| id))
                .collect::<Result<_, _>>()?
        } else {
            self.live
                .iter()
                .map(|r| r.map(|(id, _)| id))
                .collect::<Result<_, _>>()?
        };
        for id in ids {
            let Some(job) = self.specs.get(&id)? else {
                continue;
            };
            if let Some(entry) = JobEntry::restored(&job)? {
                st.claim(entry);
                if !first_layout {
                    crate::lock(&self.listed).insert(id);
                }
            }
        }
        let after = if first_layout {
            0
        } else {
            self.meta.get(CHECKPOINT)?.map_or(0, |m| m.value)
        };
        let (replayed, applied) = self.replay(&mut st, after)?;
        st.settle_loaded();
        if first_layout {
            self.upgrade(&mut st)?;
            crate::lock(&self.listed).extend(st.ids());
        } else if layout < 2 {
            // A new data directory starts in this layout.
            self.meta.put(LAYOUT, &Number { value: 2 })?;
        }
        tracing::info!(
            jobs = st.len(),
            replayed,
            applied,
            after,
            ms = started.elapsed().as_millis() as u64,
            "job book open"
        );
        Ok(st)
    }

    fn accept(&self, e: &JobEntry) -> Result<i64, ExecutorError> {
        // Listed before its first event is appended: that record is never
        // durable without the listing (start-up tells a removed job by its
        // missing listing). The spec rides in that record.
        self.by_time
            .put(&time_key(created_ms(&e.job), e.id()), &Mark {})?;
        Ok(0)
    }

    fn append(
        &self,
        e: &JobEntry,
        wire: &Event,
        _moved: bool,
        kept: Option<&TaskStatus>,
        seal: Option<&[u8]>,
    ) -> u64 {
        if let Some(seal) = seal
            && let Err(err) = self.seals.put(e.id(), &seal.to_vec())
        {
            // Retiring the job seals it again.
            tracing::error!(job_id = e.id(), error = %err, "keeping a journal seal");
        }
        let accepted = (wire.sequence == 1).then(|| Job {
            spec: Some(e.spec().clone()),
            created_at: e.job.created_at,
            ..Default::default()
        });
        let kept = (kept.is_some() || accepted.is_some()).then(|| Kept {
            output: kept.cloned(),
            accepted,
        });
        self.events.append_ref(wire, kept.as_ref())
    }

    async fn durable(&self, g: u64) -> Result<u64, ExecutorError> {
        self.events.make_durable(g).await?;
        Ok(self.events.durable())
    }

    fn last(&self) -> u64 {
        self.events.last()
    }

    fn retire(&self, r: &Retiring) -> Result<(), ExecutorError> {
        self.specs.put(&r.id, &r.job)?;
        self.index.put(&r.id, &r.positions)?;
        self.unlist(&r.id)
    }

    fn checkpoint(
        &self,
        first_event: Option<u64>,
        upto: Option<u64>,
    ) -> Result<u64, ExecutorError> {
        // Never past what is on disk: a crash could lose records after it,
        // and their numbers be handed out again.
        let upto = upto.unwrap_or_else(|| self.events.durable());
        let at = first_event.map_or(self.events.last(), |f| f - 1).min(upto);
        self.meta.put(CHECKPOINT, &Number { value: at })?;
        Ok(at)
    }

    fn flush(&self, first_event: Option<u64>) -> Result<(), ExecutorError> {
        self.store.flush_blocking()?;
        self.checkpoint(first_event, Some(self.events.last()))?;
        Ok(self.store.flush_blocking()?)
    }

    async fn load(&self, id: &str, _replay: bool) -> Result<Option<JobEntry>, ExecutorError> {
        // Only finished jobs are read here: the others are in memory.
        let Some(job) = self.specs.get(id)? else {
            return Ok(None);
        };
        let Some(mut e) = JobEntry::restored(&job)? else {
            return Ok(None);
        };
        e.job = job;
        e.events = self.index.get(id)?.unwrap_or_default().positions;
        let mut kept: std::collections::HashMap<String, TaskStatus> = self
            .events
            .read_each_as::<Kept>(&e.events)?
            .into_iter()
            .filter_map(|(_, k)| k.output)
            .map(|o| (o.task_id.clone(), o))
            .collect();
        for i in 0..e.job.tasks.len() {
            let task = &e.job.tasks[i].task_id;
            let stored = match kept.remove(task) {
                Some(o) => Some(o),
                None => self.outputs.get(&output_key(id, task))?,
            };
            if let Some(stored) = stored {
                e.keep_outputs(i, stored);
            }
        }
        e.durable_to.send_replace(e.job.last_sequence);
        Ok(Some(e))
    }

    async fn identity(&self, id: &str) -> Result<Option<(String, String)>, ExecutorError> {
        // A stored job's hash is its spec's (kept apart only while it runs).
        Ok(self.specs.get(id)?.and_then(|j| {
            let hash = crate::spec::context_hash(j.spec.as_ref()?);
            Some((hash, j.tenant))
        }))
    }

    async fn record(&self, id: &str) -> Result<Option<Job>, ExecutorError> {
        Ok(self.specs.get(id)?)
    }

    async fn events(
        &self,
        id: &str,
        after: u64,
        upto: u64,
        positions: &[u64],
    ) -> Result<Vec<Event>, ExecutorError> {
        // In the index's order, repeats included: a damaged or rewritten
        // index reads back as it is, for the journal's chain to judge.
        let read = |at: &[u64]| -> Result<Vec<Event>, ExecutorError> {
            let wanted = |ev: &Event| ev.sequence > after && ev.sequence <= upto;
            if at.windows(2).all(|w| w[0] < w[1]) {
                return Ok(self
                    .events
                    .read_each(at)?
                    .into_iter()
                    .map(|(_, ev)| ev)
                    .filter(wanted)
                    .collect());
            }
            let mut sorted = at.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            let found: std::collections::HashMap<u64, Event> =
                self.events.read_each(&sorted)?.into_iter().collect();
            Ok(at
                .iter()
                .filter_map(|g| found.get(g).cloned())
                .filter(wanted)
                .collect())
        };
        if !positions.is_empty() {
            return read(positions);
        }
        let index = self
            .index
            .get(id)?
            .ok_or_else(|| ExecutorError::NotFound(id.into()))?;
        let len = index.positions.len() as u64;
        let (from, to) = (after.min(len) as usize, upto.min(len) as usize);
        read(&index.positions[from..to])
    }

    async fn page(
        &self,
        before: Option<(u64, &str)>,
        n: usize,
    ) -> Result<Vec<(String, Job)>, ExecutorError> {
        let before = before.map(|(created, id)| time_key(created, id));
        let mut page = Vec::new();
        for r in self.by_time.iter_rev_before(before.as_deref()) {
            if page.len() == n {
                break;
            }
            let (key, _) = r?;
            let (created, id) = key.split_once('/').unwrap_or(("", key.as_str()));
            // A job not yet retired has no stored record: the book shows it
            // from memory, and pages on from its creation time.
            let j = match self.specs.get(id)? {
                Some(j) => j,
                None => Job {
                    created_at: u64::from_str_radix(created, 16)
                        .ok()
                        .map(switchyard_kit::time::timestamp),
                    ..Default::default()
                },
            };
            page.push((id.to_owned(), j));
        }
        Ok(page)
    }

    async fn prune(
        &self,
        cutoff_ms: u64,
        tenant: Option<&str>,
        held: &(dyn for<'k> Fn(&'k str) -> bool + Send + Sync),
        first_event: Option<u64>,
    ) -> Result<(u64, u64), ExecutorError> {
        let mut keep_from = first_event.unwrap_or(self.events.last() + 1);
        let mut jobs = 0;
        for r in self.by_time.iter() {
            let (key, _) = r?;
            let id = key.split_once('/').map_or(key.as_str(), |(_, id)| id);
            if held(id) {
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
        self.checkpoint(first_event, None)?;
        self.store.sync().await?;
        Ok((jobs, records))
    }

    async fn delete(&self, id: &str, job: &Job) -> Result<(), ExecutorError> {
        self.remove_retired(id, &time_key(created_ms(job), id))?;
        self.store.sync().await?;
        Ok(())
    }

    fn reopen(&self, id: &str, first_event: Option<u64>) -> Result<(), ExecutorError> {
        // Its first event may be before the checkpoint: start-up finds it
        // by the list.
        self.live.put(id, &Mark {})?;
        crate::lock(&self.listed).insert(id.to_owned());
        // Replay after a crash must reach back to this job's first event.
        self.checkpoint(first_event, None)?;
        Ok(())
    }

    fn subscribe(&self, _id: &str) -> tokio::sync::watch::Receiver<u64> {
        self.still.subscribe()
    }

    fn poll(&self) -> Option<Duration> {
        None
    }

    fn space(self: Arc<Self>, name: &'static str) -> Space {
        Space::Sled(self.store.clone(), name)
    }

    fn content(self: Arc<Self>) -> Result<Content, ExecutorError> {
        Ok(Content::Sled(Blobs::open(&self.store, "artifact_blobs")?))
    }
}

/// Where a task's outputs are kept.
fn output_key(job_id: &str, task_id: &str) -> String {
    format!("{job_id}/{task_id}")
}

/// A job's key in the by-time index: sorts by creation, then id.
fn time_key(created_ms: u64, id: &str) -> String {
    format!("{created_ms:016x}/{id}")
}

/// The layout version (`meta` key).
const LAYOUT: &str = "layout";
/// Where replay starts (`meta` key).
const CHECKPOINT: &str = "checkpoint";
