//! The executor's storage seam. The job book ([`crate::book`]) decides;
//! what it keeps and who else may run its jobs sit behind two traits, so
//! the driver, admission, the queue, cancel and the outbox never ask which
//! backend they run on:
//!
//! - [`JobStore`] — where jobs live: the typed event log (appended in
//!   group-committed batches), each job's accepted spec and final record,
//!   task outputs, and reads of jobs that are not in memory here;
//! - [`Cluster`] — who runs them: one node that holds every job it stores
//!   ([`SingleNode`]), or replicas that claim jobs under leases and fence
//!   each write with the lease's epoch ([`pg::PgJobs`]).
//!
//! Backends: [`sled::SledJobs`] (embedded, one node) and [`pg::PgJobs`]
//! (shared tables, any number of replicas; it is its own cluster). A new
//! backend implements [`JobStore`] (and [`Cluster`] when several processes
//! share it) and is chosen in `Executor::open*`; the behaviour suites run
//! on each backend. `docs/architecture.md` walks through it.

use std::sync::Arc;
use std::time::Duration;

use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{Job, TaskStatus};

use crate::Executor;
use crate::book::{Jobs, Retiring};
use crate::error::ExecutorError;
use crate::job::JobEntry;

pub(crate) mod kept;
pub(crate) mod pg;
pub(crate) mod replicas;
pub(crate) mod sled;

pub(crate) use kept::{Content, Kept, Space};

/// Where jobs live. Writes return at once (they join the next
/// group-committed batch); [`JobStore::durable`] waits for one.
#[tonic::async_trait]
pub(crate) trait JobStore: Send + Sync {
    /// The jobs this node holds at start-up, their state replayed from
    /// their events (none where jobs are claimed after start-up).
    fn load_held(&self) -> Result<Jobs, ExecutorError>;

    /// Stores accepted job `e` (its spec, tenant, creation time); returns
    /// the lease epoch it is held under here.
    fn accept(&self, e: &JobEntry) -> Result<i64, ExecutorError>;

    /// Appends `wire`, an event of job `e` (already applied to it; `moved`
    /// when it moved the job, so a store keeping a row per job updates it
    /// in the same write; `kept`, the attempt's outputs a `task.result`
    /// event stores, durable no later than the event; `seal`, the job's
    /// journal seal a final move carries, written with the event and only
    /// where the event is — a store that fences writes fences it too);
    /// returns its log position.
    fn append(
        &self,
        e: &JobEntry,
        wire: &Event,
        moved: bool,
        kept: Option<&TaskStatus>,
        seal: Option<&[u8]>,
    ) -> u64;

    /// Waits until the log is durable up to `g`; returns the position up
    /// to which everything is.
    async fn durable(&self, g: u64) -> Result<u64, ExecutorError>;

    /// The last position handed out.
    fn last(&self) -> u64;

    /// Keeps a finished job's final record for reads once it leaves memory.
    fn retire(&self, r: &Retiring) -> Result<(), ExecutorError>;

    /// Notes where a replay after a crash may start, given the first log
    /// position of any job in memory, never past `upto` (what is durable;
    /// `None`: what the store knows is durable). Returns it.
    fn checkpoint(&self, first_event: Option<u64>, upto: Option<u64>)
    -> Result<u64, ExecutorError>;

    /// Flushes everything written (shutdown), with a fresh checkpoint.
    fn flush(&self, first_event: Option<u64>) -> Result<(), ExecutorError>;

    /// Job `id` as stored, rebuilt: a finished job from its final record
    /// and outputs (unless `replay`), any other as the replay of its
    /// events. `None`: no such job.
    async fn load(&self, id: &str, replay: bool) -> Result<Option<JobEntry>, ExecutorError>;

    /// The context hash and tenant of stored job `id` (`None`: no such job).
    async fn identity(&self, id: &str) -> Result<Option<(String, String)>, ExecutorError>;

    /// Job `id`'s stored record without outputs (`None`: no such job).
    async fn record(&self, id: &str) -> Result<Option<Job>, ExecutorError>;

    /// Job `id`'s stored events with sequences in `(after, upto]`, in
    /// order. `positions` are their log positions when the caller holds
    /// the job (a store that keeps no per-job index reads them there).
    async fn events(
        &self,
        id: &str,
        after: u64,
        upto: u64,
        positions: &[u64],
    ) -> Result<Vec<Event>, ExecutorError>;

    /// Up to `n` stored jobs, newest first, created before `before`
    /// (creation ms and id); a job in memory may come with its spec only or
    /// an empty record, its state unspecified (the caller shows it as it is
    /// in memory, or reads its record again once it left).
    async fn page(
        &self,
        before: Option<(u64, &str)>,
        n: usize,
    ) -> Result<Vec<(String, Job)>, ExecutorError>;

    /// Up to `n` unfinished jobs (of `tenant` when given) as stored,
    /// oldest first: what another member runs. Empty where every job this
    /// store holds is in this process (the book has them).
    async fn open_records(
        &self,
        _tenant: Option<&str>,
        _n: usize,
    ) -> Result<Vec<(String, Job)>, ExecutorError> {
        Ok(Vec::new())
    }

    /// Removes the jobs that finished before `cutoff_ms` (of `tenant`
    /// when given) and are not `held` here; returns how many jobs and log
    /// records went.
    async fn prune(
        &self,
        cutoff_ms: u64,
        tenant: Option<&str>,
        held: &(dyn for<'k> Fn(&'k str) -> bool + Send + Sync),
        first_event: Option<u64>,
    ) -> Result<(u64, u64), ExecutorError>;

    /// Removes finished job `job` (`id`) for good.
    async fn delete(&self, id: &str, job: &Job) -> Result<(), ExecutorError>;

    /// Finished job `id` runs again (a dead letter's next round): it is
    /// held again, and a replay must reach back to `first_event`.
    fn reopen(&self, id: &str, first_event: Option<u64>) -> Result<(), ExecutorError>;

    /// Wakes when job `id`'s stored events may have moved (written by
    /// another process); see [`JobStore::poll`].
    fn subscribe(&self, id: &str) -> tokio::sync::watch::Receiver<u64>;

    /// How often readers of jobs run elsewhere look again without a wake
    /// (`None`: every job this store holds is in this process).
    fn poll(&self) -> Option<Duration>;

    /// A space of keyed values kept beside the jobs (outbox intents, tool
    /// calls' checkpoints).
    fn space(self: Arc<Self>, name: &'static str) -> Space;

    /// Artifacts' content.
    fn content(self: Arc<Self>) -> Result<Content, ExecutorError>;
}

/// Who runs the jobs: one node, or replicas under leases.
#[tonic::async_trait]
pub(crate) trait Cluster: Send + Sync {
    /// Whether other members may run this node's jobs: a job can then be
    /// handed back (no room, draining, a stalled driver) for another to
    /// claim, and a job not in memory here may be running elsewhere.
    fn shared(&self) -> bool;

    /// The lease epoch job `id` is held under here, if held.
    fn holds(&self, id: &str) -> Option<i64>;

    /// Gives up job `id`'s lease (`lease`) after its queued writes, or,
    /// when `lost`, forgets it (another member took it over).
    fn release(&self, id: &str, lease: i64, lost: bool);

    /// Whether writes of job `id` under `lease` were refused (taken over).
    fn lost_at(&self, id: &str, lease: i64) -> bool;

    /// Jobs whose writes were refused since last asked.
    fn take_lost(&self) -> Vec<String>;

    /// Claims up to `n` jobs of queue tasks only, on `queues`, that no
    /// member runs; returns them with their lease epochs.
    async fn claim_queued(
        &self,
        queues: &[String],
        tenant: Option<&str>,
        n: usize,
    ) -> Result<Vec<(String, i64)>, ExecutorError>;

    /// Claims finished job `id` to run it again here; its lease epoch, or
    /// `None` when another member did first.
    async fn adopt_finished(&self, id: &str) -> Result<Option<i64>, ExecutorError>;

    /// Asks the member running job `id` to cancel it (`ask`, encoded).
    async fn request_cancel(&self, id: &str, ask: &[u8]) -> Result<(), ExecutorError>;

    /// Stores a message or answer (`ask`, encoded) under `key` for the
    /// member running job `id`, and wakes it (see `crate::relay`).
    async fn request_delivery(&self, id: &str, key: &str, ask: &[u8]) -> Result<(), ExecutorError>;

    /// Delivery `key` of job `id`: `None` when there is none, else its
    /// outcome once the member running the job acted (taken: read once).
    async fn take_delivery(
        &self,
        id: &str,
        key: &str,
    ) -> Result<Option<Option<Vec<u8>>>, ExecutorError>;

    /// How often a worker's long poll looks for work another member
    /// accepted (`None`: only this node accepts work).
    fn claim_poll(&self) -> Option<Duration>;

    /// Takes one of tenant `tenant`'s running-job slots for job `id`: at
    /// most `cap` of the tenant's unfinished jobs hold one at once, across
    /// members. True when the job holds one (now or already).
    async fn take_slot(&self, tenant: &str, id: &str, cap: u32) -> Result<bool, ExecutorError>;

    /// Gives job `id`'s running-job slot back (if it holds one).
    async fn free_slot(&self, id: &str) -> Result<(), ExecutorError>;

    /// Whether this member does the maintenance shared by all, for `ttl_ms`.
    async fn maintains(&self, now_ms: u64, ttl_ms: u64) -> bool;

    /// Starts running jobs: the ones held at start-up, and (replicas) the
    /// claiming, takeover and cancel loops.
    fn start(self: Arc<Self>, x: &Executor);

    /// Waits for the last batch and the hand-back of held jobs (shutdown).
    async fn closed(&self);
}

/// One node: it holds every job it stores, so nothing is handed back or
/// taken over, and its jobs resume here after a restart.
#[derive(Default)]
pub(crate) struct SingleNode {
    /// Jobs holding a running-job slot, by tenant (memory: after a restart
    /// the jobs that resume take theirs again).
    slots: std::sync::Mutex<std::collections::HashMap<String, std::collections::BTreeSet<String>>>,
}

#[tonic::async_trait]
impl Cluster for SingleNode {
    fn shared(&self) -> bool {
        false
    }

    fn holds(&self, _id: &str) -> Option<i64> {
        Some(0)
    }

    fn release(&self, _id: &str, _lease: i64, _lost: bool) {}

    fn lost_at(&self, _id: &str, _lease: i64) -> bool {
        false
    }

    fn take_lost(&self) -> Vec<String> {
        Vec::new()
    }

    async fn claim_queued(
        &self,
        _queues: &[String],
        _tenant: Option<&str>,
        _n: usize,
    ) -> Result<Vec<(String, i64)>, ExecutorError> {
        // Every job accepted here is offered here already.
        Ok(Vec::new())
    }

    async fn adopt_finished(&self, _id: &str) -> Result<Option<i64>, ExecutorError> {
        Ok(Some(0))
    }

    async fn request_cancel(&self, id: &str, _ask: &[u8]) -> Result<(), ExecutorError> {
        // Never asked: a job not in memory on one node is finished.
        Err(ExecutorError::NotFound(id.into()))
    }

    async fn request_delivery(
        &self,
        id: &str,
        _key: &str,
        _ask: &[u8],
    ) -> Result<(), ExecutorError> {
        // Never asked: one node runs every job it stores.
        Err(ExecutorError::NotFound(id.into()))
    }

    async fn take_delivery(
        &self,
        _id: &str,
        _key: &str,
    ) -> Result<Option<Option<Vec<u8>>>, ExecutorError> {
        Ok(None)
    }

    fn claim_poll(&self) -> Option<Duration> {
        None
    }

    async fn take_slot(&self, tenant: &str, id: &str, cap: u32) -> Result<bool, ExecutorError> {
        let mut slots = crate::lock(&self.slots);
        let held = slots.entry(tenant.to_owned()).or_default();
        if held.contains(id) {
            return Ok(true);
        }
        if held.len() >= cap as usize {
            return Ok(false);
        }
        held.insert(id.to_owned());
        Ok(true)
    }

    async fn free_slot(&self, id: &str) -> Result<(), ExecutorError> {
        let mut slots = crate::lock(&self.slots);
        for held in slots.values_mut() {
            held.remove(id);
        }
        slots.retain(|_, h| !h.is_empty());
        Ok(())
    }

    async fn maintains(&self, _now_ms: u64, _ttl_ms: u64) -> bool {
        true
    }

    fn start(self: Arc<Self>, x: &Executor) {
        x.resume_held();
    }

    async fn closed(&self) {}
}
