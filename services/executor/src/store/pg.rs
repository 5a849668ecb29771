//! The job book's PostgreSQL backend: jobs, their event logs and outputs in
//! tables every executor replica shares, so any replica accepts and answers
//! for any job while exactly one *runs* it.
//!
//! Ownership is a lease on the job's row: `owner`, `lease_until` and
//! `epoch`, the fencing token, bumped by every claim. A replica claims jobs
//! nobody holds (or whose lease lapsed) with `FOR UPDATE SKIP LOCKED`, as
//! many as it has room for, oldest first, one per tenant per round (so one
//! tenant's backlog cannot starve the others). Everything a running job
//! writes goes through one batch writer per replica: each batch is one
//! transaction whose one statement updates the rows of the jobs it touches
//! *where this replica still owns them at their epoch* — which locks them,
//! renews their leases and stores the latest record of those that moved —
//! and inserts their events and outputs joined on the rows it updated.
//! A job missing from that answer was taken over (or never inserted): its
//! events are dropped, and the book stops its driver. So a replica that
//! lost a lease (paused, partitioned, slow) cannot write anything after
//! another took over. The leases of the jobs a replica runs are renewed
//! in one statement every third of a lease; a row it owns but does not run
//! is handed back.
//!
//! Wake-ups: `NOTIFY switchyard_exec_events` (job ids) after each batch,
//! `switchyard_exec_jobs` when a job is up for claiming and
//! `switchyard_exec_cancel` for a cancel request, each with a bounded poll
//! behind it (CockroachDB has no LISTEN/NOTIFY).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use switchyard_core::Clock;
use switchyard_kit::shutdown::Shutdown;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{Job, TaskStatus};
use switchyard_store::StoreError;
use switchyard_store::pg::{Migration, Pg, TxError, ms};

use super::{Cluster, Content, JobStore, Space};
use crate::Executor;
use crate::book::{Jobs, Retiring, created_ms, stripped};
use crate::error::ExecutorError;
use crate::events::JobEvent;
use crate::job::JobEntry;

/// The executor's tables.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "jobs, events, outputs, blobs and keyed state",
        sql: "
CREATE TABLE exec_jobs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    submitted_by TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    state TEXT NOT NULL,
    context_hash TEXT NOT NULL,
    record BYTEA NOT NULL,
    finished_ms BIGINT,
    owner TEXT,
    lease_until BIGINT NOT NULL DEFAULT 0,
    epoch BIGINT NOT NULL DEFAULT 0,
    cancel BYTEA
);
CREATE INDEX exec_jobs_newest ON exec_jobs (created_ms DESC, id DESC);
CREATE INDEX exec_jobs_open ON exec_jobs (lease_until) WHERE finished_ms IS NULL;
CREATE INDEX exec_jobs_owner ON exec_jobs (owner) WHERE finished_ms IS NULL;
CREATE INDEX exec_jobs_finished ON exec_jobs (finished_ms) WHERE finished_ms IS NOT NULL;
CREATE TABLE exec_events (
    job_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    owner TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (job_id, seq)
);
CREATE TABLE exec_outputs (
    job_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (job_id, task_id)
);
CREATE TABLE exec_blobs (address TEXT PRIMARY KEY, data BYTEA NOT NULL);
CREATE TABLE exec_kv (
    space TEXT NOT NULL,
    key TEXT NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (space, key)
);
",
    },
    Migration {
        version: 2,
        name: "pull-worker queues of jobs that only workers run",
        sql: "
ALTER TABLE exec_jobs ADD COLUMN queues TEXT;
ALTER TABLE exec_jobs ADD COLUMN priority INT NOT NULL DEFAULT 0;
",
    },
    Migration {
        version: 3,
        name: "messages and answers for a job another replica runs",
        sql: "
CREATE TABLE exec_deliveries (
    job_id TEXT NOT NULL,
    key TEXT NOT NULL,
    ask BYTEA NOT NULL,
    outcome BYTEA,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (job_id, key)
);
",
    },
    Migration {
        version: 4,
        name: "running-job slots per tenant",
        sql: "
CREATE TABLE exec_job_slots (
    job_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL
);
CREATE INDEX exec_job_slots_by_tenant ON exec_job_slots (tenant);
",
    },
];

/// Notified with the ids of jobs that have new events (comma-separated).
const EVENTS: &str = "switchyard_exec_events";
/// Notified when a job is up for claiming.
const JOBS: &str = "switchyard_exec_jobs";
/// Notified with a job id when someone asks to cancel it.
const CANCEL: &str = "switchyard_exec_cancel";
/// Marks a cancel notification's payload (job ids never start with it).
const CANCEL_MARK: &str = "!";
/// Marks a delivery notification's payload (on the cancel channel).
const DELIVER_MARK: &str = ">";
/// How often a watcher of a job run elsewhere looks again without a
/// notification.
pub(crate) const WATCH_POLL: Duration = Duration::from_millis(500);
/// Jobs claimed per candidate round (before SKIP LOCKED thins them out).
const CANDIDATES: i64 = 256;
/// How long a lost job's epoch is remembered (see `PgJobs::lost_at`).
const LOST_KEPT: Duration = Duration::from_secs(600);

/// The epochs at which jobs were lost here, each kept [`LOST_KEPT`].
#[derive(Debug, Default)]
struct LostEpochs(HashMap<String, (i64, std::time::Instant)>);

impl LostEpochs {
    /// Notes jobs lost at their epochs (a job lost again: the later one).
    fn note(&mut self, lost: &[(String, i64)], now: std::time::Instant) {
        self.0
            .retain(|_, (_, at)| now.duration_since(*at) < LOST_KEPT);
        for (id, epoch) in lost {
            self.0.insert(id.clone(), (*epoch, now));
        }
    }

    /// Whether job `id` was lost at `epoch`.
    fn at(&self, id: &str, epoch: i64) -> bool {
        self.0.get(id).is_some_and(|&(e, _)| e == epoch)
    }
}

/// A job accepted here, to insert with the next batch (owned by this replica).
#[derive(Debug, Clone)]
pub(crate) struct NewJob {
    pub(crate) id: String,
    pub(crate) tenant: String,
    pub(crate) submitted_by: String,
    pub(crate) created_ms: u64,
    pub(crate) context_hash: String,
    pub(crate) record: Job,
    /// For a job whose every task is a queue task: its queues (the replica
    /// a worker fetches from claims it), with its priority.
    pub(crate) queues: Option<Vec<String>>,
    pub(crate) priority: i32,
}

/// The latest of a touched job, stored with its batch.
#[derive(Debug, Clone, Default)]
struct Touch {
    epoch: i64,
    /// Set when the job moved: its state, record and (final) end time.
    moved: Option<(String, Vec<u8>, Option<i64>)>,
    /// Hand the job back after this batch's writes.
    release: bool,
    /// The job's journal seal (its final move), written only if the batch
    /// still holds the job.
    seal: Option<Vec<u8>>,
}

/// What the next batch writes.
#[derive(Default)]
struct Pending {
    /// The last position handed out.
    next: u64,
    new_jobs: Vec<NewJob>,
    touched: HashMap<String, Touch>,
    events: Vec<(String, i64, Vec<u8>)>,
    outputs: Vec<(String, String, Vec<u8>)>,
    blobs: Vec<(String, Vec<u8>)>,
    kv: Vec<(String, String, Option<Vec<u8>>)>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.new_jobs.is_empty()
            && self.touched.is_empty()
            && self.blobs.is_empty()
            && self.kv.is_empty()
    }
}

/// A job as stored, for reads on a replica that does not run it.
pub(crate) struct Stored {
    /// Its latest record (final once finished; its state kept current by
    /// its owner).
    pub(crate) record: Job,
    /// Whether it finished (its record is final).
    pub(crate) finished: bool,
}

/// The shared job tables and this replica's writer.
pub(crate) struct PgJobs {
    pub(crate) db: Pg,
    /// This replica's name in `owner` (unique per process start).
    pub(crate) me: String,
    lease_ms: u64,
    clock: Arc<dyn Clock>,
    shutdown: Shutdown,
    pending: Mutex<Pending>,
    /// The position up to which batches are done.
    committed: tokio::sync::watch::Sender<u64>,
    /// Set once the writer has stopped (after its last batch and handing
    /// back its jobs).
    closed: tokio::sync::watch::Sender<bool>,
    wake: tokio::sync::Notify,
    /// Jobs this replica holds, at their epoch.
    held: Mutex<HashMap<String, i64>>,
    /// Jobs found taken over, for the book to drop.
    lost: Mutex<Vec<String>>,
    /// Jobs whose writes were refused (or whose lease was gone), at the
    /// epoch held then, noted before the batch's position is done; kept
    /// ten minutes, long past any attempt still waiting on that batch.
    lost_epochs: Mutex<LostEpochs>,
    pub(crate) lost_wake: tokio::sync::Notify,
    /// Jobs with a cancel request, for the book to act on.
    cancels: Mutex<Vec<String>>,
    pub(crate) cancel_wake: tokio::sync::Notify,
    /// Jobs with a message or answer sent through another replica.
    deliveries: Mutex<Vec<String>>,
    pub(crate) delivery_wake: tokio::sync::Notify,
    /// Wakes the claimer.
    pub(crate) claim_wake: tokio::sync::Notify,
    /// Watchers' wake-ups, by job (bumped when its events change).
    hub: Mutex<HashMap<String, tokio::sync::watch::Sender<u64>>>,
    /// Jobs found owned here but not run at the last renewal.
    strays: Mutex<HashSet<String>>,
}

impl PgJobs {
    /// Migrates the tables and starts nothing yet (see [`PgJobs::run`]).
    pub(crate) async fn open(
        db: Pg,
        me: String,
        lease_ms: u64,
        clock: Arc<dyn Clock>,
        shutdown: Shutdown,
    ) -> Result<Arc<PgJobs>, ExecutorError> {
        db.migrate_service("executor", MIGRATIONS).await?;
        // A replica named like an earlier one (a configured `replica_id`,
        // a pod restarted under its name) must not renew leases it does not
        // run: whatever that one held is handed back for claiming.
        let handed = db
            .client()
            .await?
            .execute(
                "UPDATE exec_jobs SET owner = NULL, lease_until = 0
                 WHERE owner = $1 AND finished_ms IS NULL",
                &[&me],
            )
            .await
            .map_err(|e| db.error("handing back an earlier run's jobs", &e))?;
        if handed > 0 {
            tracing::info!(jobs = handed, replica = %me, "handed back the jobs an earlier run under this name held");
        }
        Ok(Arc::new(PgJobs {
            db,
            me,
            lease_ms,
            clock,
            shutdown,
            pending: Mutex::new(Pending::default()),
            committed: tokio::sync::watch::channel(0).0,
            closed: tokio::sync::watch::channel(false).0,
            wake: tokio::sync::Notify::new(),
            held: Mutex::new(HashMap::new()),
            lost: Mutex::new(Vec::new()),
            lost_epochs: Mutex::new(LostEpochs::default()),
            lost_wake: tokio::sync::Notify::new(),
            cancels: Mutex::new(Vec::new()),
            cancel_wake: tokio::sync::Notify::new(),
            deliveries: Mutex::new(Vec::new()),
            delivery_wake: tokio::sync::Notify::new(),
            claim_wake: tokio::sync::Notify::new(),
            hub: Mutex::new(HashMap::new()),
            strays: Mutex::new(HashSet::new()),
        }))
    }

    // ------------------------------------------------------------ writes

    /// Queues `job`'s insertion (with the next batch), owned here at epoch 1.
    pub(crate) fn accept(&self, job: NewJob) {
        crate::lock(&self.pending).new_jobs.push(job);
    }

    /// Queues event `ev` of `job_id` (held at `epoch`); `moved` carries the
    /// job's state, record and end time when `ev` moved it. Returns the
    /// position [`PgJobs::durable`] waits for.
    pub(crate) fn append(
        &self,
        job_id: &str,
        epoch: i64,
        ev: &Event,
        moved: Option<(String, Job, Option<u64>)>,
        seal: Option<&[u8]>,
    ) -> u64 {
        let data = ev.encode_to_vec();
        let mut p = crate::lock(&self.pending);
        p.next += 1;
        let t = p.touched.entry(job_id.to_owned()).or_default();
        t.epoch = epoch;
        if let Some(seal) = seal {
            t.seal = Some(seal.to_vec());
        }
        if let Some((state, record, finished)) = moved {
            t.moved = Some((state, record.encode_to_vec(), finished.map(ms)));
        }
        p.events.push((job_id.to_owned(), ms(ev.sequence), data));
        let g = p.next;
        drop(p);
        self.wake.notify_one();
        g
    }

    /// Queues a task's outputs (written only while `job_id` is held).
    pub(crate) fn output(&self, job_id: &str, status: &TaskStatus) {
        crate::lock(&self.pending).outputs.push((
            job_id.to_owned(),
            status.task_id.clone(),
            status.encode_to_vec(),
        ));
    }

    /// Queues content under its address; returns the address.
    pub(crate) fn blob(&self, bytes: &[u8]) -> String {
        let id = switchyard_store::blobs::address(bytes);
        crate::lock(&self.pending)
            .blobs
            .push((id.clone(), bytes.to_vec()));
        self.wake.notify_one();
        id
    }

    /// Queues a keyed value's write (`None`: removal).
    pub(crate) fn kv(&self, space: &str, key: &str, value: Option<Vec<u8>>) {
        crate::lock(&self.pending)
            .kv
            .push((space.to_owned(), key.to_owned(), value));
        self.wake.notify_one();
    }

    /// Waits until every kept value queued before the call is written.
    pub(crate) async fn kv_sync(&self) -> Result<(), StoreError> {
        let g = {
            let mut p = crate::lock(&self.pending);
            p.next += 1;
            p.next
        };
        self.durable(g)
            .await
            .map_err(|e| StoreError::Io(e.to_string()))
    }

    /// Queues handing `job_id` back (after its queued writes), so another
    /// replica with room claims it.
    pub(crate) fn release(&self, job_id: &str, epoch: i64) {
        {
            let mut p = crate::lock(&self.pending);
            let t = p.touched.entry(job_id.to_owned()).or_default();
            t.epoch = epoch;
            t.release = true;
        }
        crate::lock(&self.held).remove(job_id);
        self.wake.notify_one();
    }

    /// The last position handed out.
    pub(crate) fn last(&self) -> u64 {
        crate::lock(&self.pending).next
    }

    /// The position up to which batches are done.
    pub(crate) fn committed(&self) -> u64 {
        *self.committed.borrow()
    }

    /// Waits until every batch up to position `g` is done (its writes
    /// committed, or dropped for jobs this replica no longer holds).
    pub(crate) async fn durable(&self, g: u64) -> Result<(), ExecutorError> {
        let mut done = self.committed.subscribe();
        self.wake.notify_one();
        tokio::select! {
            r = done.wait_for(|&c| c >= g) => return r.map(|_| ()).map_err(|_| stopping()),
            _ = self.shutdown.wait() => {}
        }
        // Shutting down: the writer's last batch still runs; wait for it
        // briefly.
        match tokio::time::timeout(Duration::from_secs(5), done.wait_for(|&c| c >= g)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(stopping()),
        }
    }

    /// Whether job `id`'s writes under lease `epoch` were refused: an
    /// attempt started under it must not act.
    pub(crate) fn lost_at(&self, id: &str, epoch: i64) -> bool {
        crate::lock(&self.lost_epochs).at(id, epoch)
    }

    /// Jobs found taken over since the last call.
    pub(crate) fn take_lost(&self) -> Vec<String> {
        std::mem::take(&mut *crate::lock(&self.lost))
    }

    /// Jobs with a cancel request since the last call.
    pub(crate) fn take_cancels(&self) -> Vec<String> {
        std::mem::take(&mut *crate::lock(&self.cancels))
    }

    /// Jobs held here with a delivery asked since the last call.
    pub(crate) fn take_deliveries(&self) -> Vec<String> {
        let mut ids = std::mem::take(&mut *crate::lock(&self.deliveries));
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Notes that job `id` (held here) may have deliveries waiting.
    pub(crate) fn deliveries_wanted(&self, id: &str) {
        crate::lock(&self.deliveries).push(id.to_owned());
        self.delivery_wake.notify_one();
    }

    /// Forgets a job that finished or was dropped here.
    pub(crate) fn forget(&self, job_id: &str) {
        crate::lock(&self.held).remove(job_id);
    }

    /// Runs the writer until shutdown: batches as they come, a lease
    /// renewal every third of the lease, then a last batch and every job
    /// handed back.
    pub(crate) async fn run_writer(self: Arc<Self>) {
        let renew_every = Duration::from_millis((self.lease_ms / 3).max(50));
        let mut next_renewal = tokio::time::Instant::now() + renew_every;
        loop {
            let stopping = tokio::select! {
                _ = self.wake.notified() => false,
                _ = tokio::time::sleep_until(next_renewal) => false,
                _ = self.shutdown.wait() => true,
            };
            let renew = tokio::time::Instant::now() >= next_renewal;
            if renew {
                next_renewal = tokio::time::Instant::now() + renew_every;
            }
            self.write_pending(renew).await;
            if stopping {
                break;
            }
        }
        self.write_pending(false).await;
        if let Err(e) = self.release_all().await {
            tracing::warn!(error = %e, "handing jobs back at shutdown; they are taken over once their leases lapse");
        }
        self.closed.send_replace(true);
    }

    /// Waits until the writer has stopped (shutdown).
    pub(crate) async fn closed(&self) {
        let mut c = self.closed.subscribe();
        let _ = tokio::time::timeout(Duration::from_secs(10), c.wait_for(|&c| c)).await;
    }

    /// Writes what is pending (and renews leases when `renew`), retrying
    /// through outages until done or shut down.
    async fn write_pending(&self, renew: bool) {
        // Everything handed out so far is in this batch: positions are
        // handed out under the same lock.
        let batch = {
            let mut p = crate::lock(&self.pending);
            Pending {
                next: p.next,
                new_jobs: std::mem::take(&mut p.new_jobs),
                touched: std::mem::take(&mut p.touched),
                events: std::mem::take(&mut p.events),
                outputs: std::mem::take(&mut p.outputs),
                blobs: std::mem::take(&mut p.blobs),
                kv: std::mem::take(&mut p.kv),
            }
        };
        let upto = batch.next;
        if batch.is_empty() && !renew {
            self.committed.send_replace(upto.max(self.committed()));
            return;
        }
        let mut delay = Duration::from_millis(20);
        loop {
            match self.commit(&batch, renew).await {
                Ok(()) => break,
                Err(TxError::Retry(e)) | Err(TxError::Fatal(e)) => {
                    tracing::warn!(error = %e, "writing job events; trying again");
                    if self.shutdown.is_shutdown() && delay > Duration::from_secs(2) {
                        tracing::error!(
                            "job events not written before shutdown; their jobs resume from what is stored"
                        );
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        }
        self.committed.send_replace(upto.max(self.committed()));
    }

    /// One batch in one transaction.
    async fn commit(&self, b: &Pending, renew: bool) -> Result<(), TxError> {
        let db = &self.db;
        let mut client = db.client().await.map_err(TxError::Retry)?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| db.tx_error("starting a transaction", &e))?;
        let now = self.clock.now_ms();
        let until = ms(now.saturating_add(self.lease_ms));
        let mut refused: HashSet<String> = HashSet::new();
        if !b.new_jobs.is_empty() {
            let ids: Vec<&str> = b.new_jobs.iter().map(|j| j.id.as_str()).collect();
            let tenants: Vec<&str> = b.new_jobs.iter().map(|j| j.tenant.as_str()).collect();
            let subs: Vec<&str> = b.new_jobs.iter().map(|j| j.submitted_by.as_str()).collect();
            let created: Vec<i64> = b.new_jobs.iter().map(|j| ms(j.created_ms)).collect();
            let hashes: Vec<&str> = b.new_jobs.iter().map(|j| j.context_hash.as_str()).collect();
            let records: Vec<Vec<u8>> = b
                .new_jobs
                .iter()
                .map(|j| j.record.encode_to_vec())
                .collect();
            let states: Vec<&str> = b
                .new_jobs
                .iter()
                .map(|j| crate::job::job_state(j.record.state).as_str())
                .collect();
            // Queue names never hold a space: " q1 q2 " matches each by
            // position.
            let queues: Vec<Option<String>> = b
                .new_jobs
                .iter()
                .map(|j| j.queues.as_ref().map(|q| format!(" {} ", q.join(" "))))
                .collect();
            let priorities: Vec<i32> = b.new_jobs.iter().map(|j| j.priority).collect();
            let rows = tx
                .query(
                    &tx.prepare_cached(INSERT_JOBS)
                        .await
                        .map_err(|e| db.tx_error("preparing a statement", &e))?,
                    &[
                        &ids,
                        &tenants,
                        &subs,
                        &created,
                        &states,
                        &hashes,
                        &self.me,
                        &until,
                        &records,
                        &queues,
                        &priorities,
                    ],
                )
                .await
                .map_err(|e| db.tx_error("inserting jobs", &e))?;
            let inserted: HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
            for j in &b.new_jobs {
                if !inserted.contains(&j.id) {
                    refused.insert(j.id.clone());
                }
            }
        }
        let mut held_now: Vec<String> = Vec::new();
        if !b.touched.is_empty() {
            let mut ids = Vec::new();
            let mut epochs = Vec::new();
            let mut states: Vec<Option<&str>> = Vec::new();
            let mut records: Vec<Option<&[u8]>> = Vec::new();
            let mut finished: Vec<Option<i64>> = Vec::new();
            for (id, t) in &b.touched {
                ids.push(id.as_str());
                epochs.push(t.epoch);
                states.push(t.moved.as_ref().map(|m| m.0.as_str()));
                records.push(t.moved.as_ref().map(|m| m.1.as_slice()));
                finished.push(t.moved.as_ref().and_then(|m| m.2));
            }
            let (mut ev_jobs, mut ev_seqs, mut ev_data) = (Vec::new(), Vec::new(), Vec::new());
            for (j, s, d) in &b.events {
                ev_jobs.push(j.as_str());
                ev_seqs.push(*s);
                ev_data.push(d.as_slice());
            }
            let (mut out_jobs, mut out_tasks, mut out_data) = (Vec::new(), Vec::new(), Vec::new());
            for (j, t, d) in &b.outputs {
                out_jobs.push(j.as_str());
                out_tasks.push(t.as_str());
                out_data.push(d.as_slice());
            }
            // One statement: fence (lock and check the lease), renew, store
            // the record; then events and outputs of the jobs still held.
            let rows = tx
                .query(
                    &tx.prepare_cached(WRITE_BATCH)
                        .await
                        .map_err(|e| db.tx_error("preparing a statement", &e))?,
                    &[
                        &ids, &epochs, &states, &records, &finished, &self.me, &until, &ev_jobs,
                        &ev_seqs, &ev_data, &out_jobs, &out_tasks, &out_data,
                    ],
                )
                .await
                .map_err(|e| db.tx_error("writing job events", &e))?;
            let held: HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
            for id in b.touched.keys() {
                if held.contains(id) {
                    held_now.push(id.clone());
                } else {
                    refused.insert(id.clone());
                }
            }
            // Seals of the final moves this batch wrote (of jobs still
            // held), in one statement.
            let (seal_jobs, seals): (Vec<&str>, Vec<Vec<u8>>) = b
                .touched
                .iter()
                .filter(|(id, _)| held.contains(*id))
                .filter_map(|(id, t)| Some((id.as_str(), t.seal.as_ref()?.encode_to_vec())))
                .unzip();
            if !seal_jobs.is_empty() {
                tx.execute(
                    "INSERT INTO exec_kv (space, key, value)
                     SELECT $1::TEXT, k, v FROM unnest($2::TEXT[], $3::BYTEA[]) AS s(k, v)
                     ON CONFLICT (space, key) DO UPDATE SET value = EXCLUDED.value",
                    &[&crate::audit::SEALS, &seal_jobs, &seals],
                )
                .await
                .map_err(|e| db.tx_error("keeping journal seals", &e))?;
            }
            let released: Vec<&str> = b
                .touched
                .iter()
                .filter(|(id, t)| t.release && held.contains(*id))
                .map(|(id, _)| id.as_str())
                .collect();
            if !released.is_empty() {
                tx.execute(
                    "UPDATE exec_jobs SET owner = NULL, lease_until = 0
                     WHERE id = ANY($1) AND owner = $2 AND finished_ms IS NULL",
                    &[&released, &self.me],
                )
                .await
                .map_err(|e| db.tx_error("handing jobs back", &e))?;
                tx.execute("SELECT pg_notify($1, '')", &[&JOBS])
                    .await
                    .map_err(|e| db.tx_error("notifying", &e))?;
            }
            if !b.events.is_empty() {
                let payload = notify_payload(held.iter().map(String::as_str));
                tx.execute("SELECT pg_notify($1, $2)", &[&EVENTS, &payload])
                    .await
                    .map_err(|e| db.tx_error("notifying", &e))?;
            }
        }
        for (address, data) in &b.blobs {
            tx.execute(
                "INSERT INTO exec_blobs (address, data) VALUES ($1, $2) ON CONFLICT (address) DO NOTHING",
                &[address, data],
            )
            .await
            .map_err(|e| db.tx_error("storing an artifact", &e))?;
        }
        for (space, key, value) in &b.kv {
            let done = match value {
                Some(v) => {
                    tx.execute(
                        "INSERT INTO exec_kv (space, key, value) VALUES ($1, $2, $3)
                         ON CONFLICT (space, key) DO UPDATE SET value = EXCLUDED.value",
                        &[space, key, v],
                    )
                    .await
                }
                None => {
                    tx.execute(
                        "DELETE FROM exec_kv WHERE space = $1 AND key = $2",
                        &[space, key],
                    )
                    .await
                }
            };
            done.map_err(|e| db.tx_error("storing executor state", &e))?;
        }
        // The renewal: every lease this replica holds, in one statement.
        let held_before: Option<HashMap<String, i64>> =
            renew.then(|| crate::lock(&self.held).clone());
        let renewed = if renew {
            // Only the leases of jobs this replica runs (held, or accepted
            // in this batch); a row it owns but does not run — a job it
            // dropped, a claim it lost track of — is handed back, so no
            // lease is ever renewed for a job nobody drives.
            let mut running: Vec<&str> = held_before
                .iter()
                .flat_map(|h| h.keys().map(String::as_str))
                .collect();
            running.extend(
                b.new_jobs
                    .iter()
                    .filter(|j| !refused.contains(&j.id))
                    .map(|j| j.id.as_str()),
            );
            let rows = tx
                .query(
                    &tx.prepare_cached(RENEW)
                        .await
                        .map_err(|e| db.tx_error("preparing a statement", &e))?,
                    &[&self.me, &until, &running],
                )
                .await
                .map_err(|e| db.tx_error("renewing leases", &e))?;
            // Owned here but not run: handed back only when it was so at
            // the last renewal too (a claim commits a moment before the
            // claimer notes it as held).
            let strays: Vec<String> = tx
                .query(
                    "SELECT id FROM exec_jobs
                     WHERE owner = $1 AND finished_ms IS NULL AND NOT (id = ANY($2))",
                    &[&self.me, &running],
                )
                .await
                .map_err(|e| db.tx_error("looking for jobs not run here", &e))?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let orphans: Vec<String> = {
                let mut suspects = crate::lock(&self.strays);
                let orphans = strays
                    .iter()
                    .filter(|id| suspects.contains(*id))
                    .cloned()
                    .collect();
                *suspects = strays.into_iter().collect();
                orphans
            };
            if !orphans.is_empty() {
                tx.execute(
                    "UPDATE exec_jobs SET owner = NULL, lease_until = 0
                     WHERE owner = $1 AND finished_ms IS NULL AND id = ANY($2)",
                    &[&self.me, &orphans],
                )
                .await
                .map_err(|e| db.tx_error("handing back jobs not run here", &e))?;
                tracing::warn!(jobs = ?orphans, replica = %self.me, "handed back jobs this replica owned but did not run");
                tx.execute("SELECT pg_notify($1, '')", &[&JOBS])
                    .await
                    .map_err(|e| db.tx_error("notifying", &e))?;
            }
            Some(
                rows.iter()
                    .map(|r| {
                        (
                            r.get::<_, String>(0),
                            r.get::<_, i64>(1),
                            r.get::<_, bool>(2),
                        )
                    })
                    .collect::<Vec<_>>(),
            )
        } else {
            None
        };
        tx.commit()
            .await
            .map_err(|e| db.tx_error("committing job events", &e))?;
        // Committed: newly accepted jobs are held; refused ones are lost.
        {
            let mut held = crate::lock(&self.held);
            for j in &b.new_jobs {
                if !refused.contains(&j.id) {
                    held.insert(j.id.clone(), 1);
                }
            }
            for (id, t) in &b.touched {
                if t.moved.as_ref().is_some_and(|m| m.2.is_some()) || t.release {
                    held.remove(id);
                }
            }
        }
        // The epoch each refused job was written under.
        let mut lost: Vec<(String, i64)> = refused
            .into_iter()
            .map(|id| {
                let epoch = b.touched.get(&id).map_or(1, |t| t.epoch);
                (id, epoch)
            })
            .collect();
        if let (Some(before), Some(renewed)) = (held_before, renewed) {
            let still: HashMap<&str, i64> =
                renewed.iter().map(|(id, e, _)| (id.as_str(), *e)).collect();
            // Jobs that finished or were handed back in this very batch are
            // not renewed, and not lost either.
            let let_go = |id: &str| {
                b.touched
                    .get(id)
                    .is_some_and(|t| t.release || t.moved.as_ref().is_some_and(|m| m.2.is_some()))
            };
            for (id, epoch) in before {
                if still.get(id.as_str()) != Some(&epoch) && !let_go(&id) {
                    lost.push((id, epoch));
                }
            }
            let asked: Vec<String> = renewed
                .into_iter()
                .filter(|(_, _, c)| *c)
                .map(|(id, _, _)| id)
                .collect();
            if !asked.is_empty() {
                crate::lock(&self.cancels).extend(asked);
                self.cancel_wake.notify_one();
            }
        }
        if !lost.is_empty() {
            {
                let mut held = crate::lock(&self.held);
                for (id, _) in &lost {
                    held.remove(id);
                }
            }
            crate::lock(&self.lost_epochs).note(&lost, std::time::Instant::now());
            let lost: Vec<String> = lost.into_iter().map(|(id, _)| id).collect();
            tracing::warn!(jobs = ?lost, replica = %self.me, "jobs taken over by another replica; stopping them here");
            crate::lock(&self.lost).extend(lost);
            self.lost_wake.notify_one();
        }
        let touched: Vec<&str> = held_now.iter().map(String::as_str).collect();
        self.bump(&touched);
        Ok(())
    }

    /// Hands every job this replica holds back (shutdown), so others claim
    /// them at once instead of after their leases lapse.
    async fn release_all(&self) -> Result<(), StoreError> {
        let c = self.db.client().await?;
        let n = c
            .execute(
                "UPDATE exec_jobs SET owner = NULL, lease_until = 0
                 WHERE owner = $1 AND finished_ms IS NULL",
                &[&self.me],
            )
            .await
            .map_err(|e| self.db.error("handing jobs back", &e))?;
        c.execute("SELECT pg_notify($1, '')", &[&JOBS])
            .await
            .map_err(|e| self.db.error("notifying", &e))?;
        crate::lock(&self.held).clear();
        tracing::info!(jobs = n, "handed running jobs back to the other replicas");
        Ok(())
    }

    // ------------------------------------------------------------ claims

    /// Claims up to `n` jobs nobody holds (or whose lease lapsed): the
    /// oldest of each tenant first. Returns their ids and epochs.
    pub(crate) async fn claim(&self, n: usize) -> Result<Vec<(String, i64)>, StoreError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let now = self.clock.now_ms();
        let rows = self
            .db
            .client()
            .await?
            .query(
                "WITH c AS (
                     SELECT id, created_ms,
                            row_number() OVER (PARTITION BY tenant ORDER BY created_ms, id) AS turn
                     FROM exec_jobs
                     WHERE finished_ms IS NULL AND lease_until < $2 AND owner IS DISTINCT FROM $1
                       AND queues IS NULL
                     ORDER BY created_ms, id
                     LIMIT $5
                 ), picked AS (
                     SELECT j.id FROM exec_jobs j JOIN c ON c.id = j.id
                     WHERE j.finished_ms IS NULL AND j.lease_until < $2
                     ORDER BY c.turn, c.created_ms, c.id
                     LIMIT $4
                     FOR UPDATE OF j SKIP LOCKED
                 )
                 UPDATE exec_jobs j SET owner = $1, lease_until = $3, epoch = j.epoch + 1
                 FROM picked WHERE j.id = picked.id
                 RETURNING j.id, j.epoch",
                &[
                    &self.me,
                    &ms(now),
                    &ms(now.saturating_add(self.lease_ms)),
                    &i64::try_from(n).unwrap_or(i64::MAX),
                    &CANDIDATES,
                ],
            )
            .await
            .map_err(|e| self.db.error("claiming jobs", &e))?;
        Ok(self.hold(rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
    }

    /// Notes `claimed` jobs (id, epoch) as held here; returns them.
    fn hold(&self, claimed: Vec<(String, i64)>) -> Vec<(String, i64)> {
        let mut held = crate::lock(&self.held);
        for (id, epoch) in &claimed {
            held.insert(id.clone(), *epoch);
        }
        claimed
    }

    /// Claims up to `n` jobs whose every task is a queue task, on one of
    /// `queues` (of `tenant` when given), that nobody runs (or whose
    /// runner's lease lapsed): a worker fetching here will take their
    /// tasks. Highest priority first, then oldest.
    pub(crate) async fn claim_queued(
        &self,
        queues: &[String],
        tenant: Option<&str>,
        n: usize,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let now = self.clock.now_ms();
        let rows = self
            .db
            .client()
            .await?
            .query(
                "UPDATE exec_jobs j SET owner = $1, lease_until = $3, epoch = j.epoch + 1
                 FROM (
                     SELECT id FROM exec_jobs
                     WHERE finished_ms IS NULL AND queues IS NOT NULL AND lease_until < $2
                       AND state IN ('available', 'active')
                       AND ($5::text IS NULL OR tenant = $5)
                       AND EXISTS (SELECT 1 FROM unnest($6::text[]) q
                                   WHERE position(' ' || q || ' ' IN queues) > 0)
                     ORDER BY priority DESC, created_ms, id
                     LIMIT $4
                     FOR UPDATE SKIP LOCKED
                 ) picked
                 WHERE j.id = picked.id
                 RETURNING j.id, j.epoch",
                &[
                    &self.me,
                    &ms(now),
                    &ms(now.saturating_add(self.lease_ms)),
                    &i64::try_from(n).unwrap_or(i64::MAX),
                    &tenant,
                    &queues,
                ],
            )
            .await
            .map_err(|e| self.db.error("claiming queued jobs", &e))?;
        Ok(self.hold(rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
    }

    /// Takes finished job `id` back to run it again (a dead-letter retry):
    /// its new epoch, or `None` when it is not finished or not stored.
    pub(crate) async fn adopt_finished(&self, id: &str) -> Result<Option<i64>, StoreError> {
        let until = ms(self.clock.now_ms().saturating_add(self.lease_ms));
        let row = self
            .db
            .client()
            .await?
            .query_opt(
                "UPDATE exec_jobs SET owner = $2, lease_until = $3, epoch = epoch + 1,
                        finished_ms = NULL, cancel = NULL
                 WHERE id = $1 AND finished_ms IS NOT NULL
                 RETURNING epoch",
                &[&id, &self.me, &until],
            )
            .await
            .map_err(|e| self.db.error("taking a job back", &e))?;
        let epoch = row.map(|r| r.get::<_, i64>(0));
        if let Some(e) = epoch {
            crate::lock(&self.held).insert(id.to_owned(), e);
        }
        Ok(epoch)
    }

    /// Takes one of tenant `tenant`'s running-job slots for job `id` if
    /// fewer than `cap` of its unfinished jobs hold one; true when it holds
    /// one. Replicas take their turns on the tenant's advisory lock; a slot
    /// of a finished job (its member died before giving it back) does not
    /// count.
    pub(crate) async fn take_slot(
        &self,
        tenant: &str,
        id: &str,
        cap: u32,
    ) -> Result<bool, StoreError> {
        let mut c = self.db.client().await?;
        let tx = c
            .transaction()
            .await
            .map_err(|e| self.db.error("taking a job slot", &e))?;
        let lock = format!("exec_job_slots/{tenant}");
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&lock])
            .await
            .map_err(|e| self.db.error("locking a tenant's job slots", &e))?;
        let row = tx
            .query_one(
                "SELECT count(*) FILTER (WHERE s.job_id <> $2), coalesce(bool_or(s.job_id = $2), false)
                 FROM exec_job_slots s JOIN exec_jobs j ON j.id = s.job_id
                 WHERE s.tenant = $1 AND j.finished_ms IS NULL",
                &[&tenant, &id],
            )
            .await
            .map_err(|e| self.db.error("counting a tenant's job slots", &e))?;
        let (others, mine): (i64, bool) = (row.get(0), row.get(1));
        let taken = mine || others < i64::from(cap);
        if taken && !mine {
            tx.execute(
                "INSERT INTO exec_job_slots (job_id, tenant) VALUES ($1, $2)
                 ON CONFLICT (job_id) DO NOTHING",
                &[&id, &tenant],
            )
            .await
            .map_err(|e| self.db.error("taking a job slot", &e))?;
        }
        tx.commit()
            .await
            .map_err(|e| self.db.error("taking a job slot", &e))?;
        Ok(taken)
    }

    /// Gives job `id`'s running-job slot back.
    pub(crate) async fn free_slot(&self, id: &str) -> Result<(), StoreError> {
        self.db
            .client()
            .await?
            .execute("DELETE FROM exec_job_slots WHERE job_id = $1", &[&id])
            .await
            .map_err(|e| self.db.error("giving a job slot back", &e))?;
        Ok(())
    }

    /// Asks whoever runs job `id` to cancel it (`request`: why and for
    /// whom); false when it has finished.
    pub(crate) async fn request_cancel(
        &self,
        id: &str,
        request: &[u8],
    ) -> Result<bool, StoreError> {
        let c = self.db.client().await?;
        let n = c
            .execute(
                "UPDATE exec_jobs SET cancel = $2 WHERE id = $1 AND finished_ms IS NULL",
                &[&id, &request],
            )
            .await
            .map_err(|e| self.db.error("asking for a cancel", &e))?;
        let payload = format!("{CANCEL_MARK}{id}");
        c.execute("SELECT pg_notify($1, $2)", &[&CANCEL, &payload])
            .await
            .map_err(|e| self.db.error("notifying", &e))?;
        Ok(n > 0)
    }

    /// Stores a message or answer (`ask`, encoded) for whoever runs job
    /// `id`, under `key` (a repeat of the same key is the same delivery),
    /// and wakes that replica.
    pub(crate) async fn request_delivery(
        &self,
        id: &str,
        key: &str,
        ask: &[u8],
    ) -> Result<(), StoreError> {
        let c = self.db.client().await?;
        let now = ms(self.clock.now_ms());
        c.execute(
            "INSERT INTO exec_deliveries (job_id, key, ask, created_ms) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job_id, key) DO NOTHING",
            &[&id, &key, &ask, &now],
        )
        .await
        .map_err(|e| self.db.error("storing a delivery", &e))?;
        let payload = format!("{DELIVER_MARK}{id}");
        c.execute("SELECT pg_notify($1, $2)", &[&CANCEL, &payload])
            .await
            .map_err(|e| self.db.error("notifying", &e))?;
        Ok(())
    }

    /// The deliveries stored for job `id` not yet acted on: key and ask.
    pub(crate) async fn pending_deliveries(
        &self,
        id: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let rows = self
            .db
            .client()
            .await?
            .query(
                "SELECT key, ask FROM exec_deliveries
                 WHERE job_id = $1 AND outcome IS NULL ORDER BY created_ms, key",
                &[&id],
            )
            .await
            .map_err(|e| self.db.error("reading deliveries", &e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Records what delivery `key` of job `id` came to, and wakes the
    /// job's watchers (its sender among them).
    pub(crate) async fn answer_delivery(
        &self,
        id: &str,
        key: &str,
        outcome: &[u8],
    ) -> Result<(), StoreError> {
        let c = self.db.client().await?;
        c.execute(
            "UPDATE exec_deliveries SET outcome = $3 WHERE job_id = $1 AND key = $2",
            &[&id, &key, &outcome],
        )
        .await
        .map_err(|e| self.db.error("answering a delivery", &e))?;
        c.execute("SELECT pg_notify($1, $2)", &[&EVENTS, &id])
            .await
            .map_err(|e| self.db.error("notifying", &e))?;
        Ok(())
    }

    /// Delivery `key` of job `id`: `None` when there is none, else its
    /// outcome once acted on. An outcome read is taken (the row goes).
    pub(crate) async fn take_delivery(
        &self,
        id: &str,
        key: &str,
    ) -> Result<Option<Option<Vec<u8>>>, StoreError> {
        let c = self.db.client().await?;
        let row = c
            .query_opt(
                "DELETE FROM exec_deliveries WHERE job_id = $1 AND key = $2 AND outcome IS NOT NULL
                 RETURNING outcome",
                &[&id, &key],
            )
            .await
            .map_err(|e| self.db.error("reading a delivery", &e))?;
        if let Some(r) = row {
            return Ok(Some(r.get(0)));
        }
        let waiting = c
            .query_opt(
                "SELECT 1 FROM exec_deliveries WHERE job_id = $1 AND key = $2",
                &[&id, &key],
            )
            .await
            .map_err(|e| self.db.error("reading a delivery", &e))?;
        Ok(waiting.map(|_| None))
    }

    /// The cancel request stored for job `id`, if any.
    pub(crate) async fn cancel_request(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .db
            .client()
            .await?
            .query_opt("SELECT cancel FROM exec_jobs WHERE id = $1", &[&id])
            .await
            .map_err(|e| self.db.error("reading a cancel request", &e))?
            .and_then(|r| r.get::<_, Option<Vec<u8>>>(0)))
    }

    /// Whether this replica holds job `id` (at any epoch).
    pub(crate) fn holds(&self, id: &str) -> Option<i64> {
        crate::lock(&self.held).get(id).copied()
    }

    // ------------------------------------------------------------ reads

    /// Job `id` as stored.
    pub(crate) async fn stored(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let row = self
            .db
            .client()
            .await?
            .query_opt(
                "SELECT record, finished_ms IS NOT NULL FROM exec_jobs WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(|e| self.db.error("reading a job", &e))?;
        row.map(|r| {
            Ok(Stored {
                record: decode(&r.get::<_, Vec<u8>>(0))?,
                finished: r.get(1),
            })
        })
        .transpose()
    }

    /// The context hash and tenant job `id` was accepted with.
    pub(crate) async fn identity(&self, id: &str) -> Result<Option<(String, String)>, StoreError> {
        Ok(self
            .db
            .client()
            .await?
            .query_opt(
                "SELECT context_hash, tenant FROM exec_jobs WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(|e| self.db.error("reading a job", &e))?
            .map(|r| (r.get(0), r.get(1))))
    }

    /// Job `id`'s events after sequence `after`, up to `limit`, in order.
    pub(crate) async fn events_after(
        &self,
        id: &str,
        after: u64,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let rows = self
            .db
            .client()
            .await?
            .query(
                "SELECT data FROM exec_events WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                &[&id, &ms(after), &limit],
            )
            .await
            .map_err(|e| self.db.error("reading job events", &e))?;
        rows.iter()
            .map(|r| decode(&r.get::<_, Vec<u8>>(0)))
            .collect()
    }

    /// Job `id`'s stored outputs.
    pub(crate) async fn outputs(&self, id: &str) -> Result<Vec<TaskStatus>, StoreError> {
        let rows = self
            .db
            .client()
            .await?
            .query("SELECT data FROM exec_outputs WHERE job_id = $1", &[&id])
            .await
            .map_err(|e| self.db.error("reading task outputs", &e))?;
        rows.iter()
            .map(|r| decode(&r.get::<_, Vec<u8>>(0)))
            .collect()
    }

    /// Up to `limit` unfinished jobs (of `tenant` when given), oldest
    /// first: their ids and records.
    pub(crate) async fn open_records(
        &self,
        tenant: Option<&str>,
        limit: i64,
    ) -> Result<Vec<(String, Job)>, StoreError> {
        let rows = self
            .db
            .client()
            .await?
            .query(
                "SELECT id, record FROM exec_jobs
                 WHERE finished_ms IS NULL AND ($1::text IS NULL OR tenant = $1)
                 ORDER BY created_ms, id LIMIT $2",
                &[&tenant, &limit],
            )
            .await
            .map_err(|e| self.db.error("listing unfinished jobs", &e))?;
        rows.iter()
            .map(|r| Ok((r.get(0), decode(&r.get::<_, Vec<u8>>(1))?)))
            .collect()
    }

    /// A page of jobs, newest first, before `(created_ms, id)` when given:
    /// their ids and records.
    pub(crate) async fn page(
        &self,
        before: Option<(u64, &str)>,
        limit: i64,
    ) -> Result<Vec<(String, Job)>, StoreError> {
        let c = self.db.client().await?;
        let rows = match before {
            Some((created, id)) => {
                c.query(
                    "SELECT id, record FROM exec_jobs
                     WHERE (created_ms, id) < ($1, $2)
                     ORDER BY created_ms DESC, id DESC LIMIT $3",
                    &[&ms(created), &id, &limit],
                )
                .await
            }
            None => {
                c.query(
                    "SELECT id, record FROM exec_jobs
                     ORDER BY created_ms DESC, id DESC LIMIT $1",
                    &[&limit],
                )
                .await
            }
        }
        .map_err(|e| self.db.error("listing jobs", &e))?;
        rows.iter()
            .map(|r| Ok((r.get(0), decode(&r.get::<_, Vec<u8>>(1))?)))
            .collect()
    }

    /// The content at `address`, when stored.
    pub(crate) async fn blob_get(&self, address: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .db
            .client()
            .await?
            .query_opt(
                "SELECT data FROM exec_blobs WHERE address = $1",
                &[&address],
            )
            .await
            .map_err(|e| self.db.error("reading an artifact", &e))?
            .map(|r| r.get(0)))
    }

    /// Keeps `value` under `key` of `space` unless a value is there;
    /// returns the value there (committed, whoever wrote it).
    pub(crate) async fn kv_put_absent(
        &self,
        space: &str,
        key: &str,
        value: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        let c = self.db.client().await?;
        c.execute(
            "INSERT INTO exec_kv (space, key, value) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            &[&space, &key, &value],
        )
        .await
        .map_err(|e| self.db.error("keeping executor state", &e))?;
        let row = c
            .query_one(
                "SELECT value FROM exec_kv WHERE space = $1 AND key = $2",
                &[&space, &key],
            )
            .await
            .map_err(|e| self.db.error("reading executor state", &e))?;
        Ok(row.get(0))
    }

    /// The value under `key` of `space`, as committed.
    pub(crate) async fn kv_get(
        &self,
        space: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .db
            .client()
            .await?
            .query_opt(
                "SELECT value FROM exec_kv WHERE space = $1 AND key = $2",
                &[&space, &key],
            )
            .await
            .map_err(|e| self.db.error("reading executor state", &e))?
            .map(|r| r.get(0)))
    }

    /// Every value of `space`, by key.
    pub(crate) async fn kv_list(&self, space: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let rows = self
            .db
            .client()
            .await?
            .query(
                "SELECT key, value FROM exec_kv WHERE space = $1 ORDER BY key LIMIT 10000",
                &[&space],
            )
            .await
            .map_err(|e| self.db.error("reading executor state", &e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Removes the jobs that finished before `cutoff_ms` (of `tenant`
    /// when given) with their events and outputs, a chunk per transaction.
    /// Returns how many jobs and events went.
    pub(crate) async fn prune(
        &self,
        cutoff_ms: u64,
        tenant: Option<&str>,
    ) -> Result<(u64, u64), StoreError> {
        let (mut jobs, mut events) = (0u64, 0u64);
        loop {
            let mut c = self.db.client().await?;
            let tx = c
                .transaction()
                .await
                .map_err(|e| self.db.error("pruning jobs", &e))?;
            let rows = tx
                .query(
                    "DELETE FROM exec_jobs WHERE id IN (
                         SELECT id FROM exec_jobs
                         WHERE finished_ms < $1 AND ($2::text IS NULL OR tenant = $2)
                         LIMIT 500)
                     RETURNING id",
                    &[&ms(cutoff_ms), &tenant],
                )
                .await
                .map_err(|e| self.db.error("pruning jobs", &e))?;
            let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            if ids.is_empty() {
                return Ok((jobs, events));
            }
            events += tx
                .execute("DELETE FROM exec_events WHERE job_id = ANY($1)", &[&ids])
                .await
                .map_err(|e| self.db.error("pruning job events", &e))?;
            tx.execute("DELETE FROM exec_outputs WHERE job_id = ANY($1)", &[&ids])
                .await
                .map_err(|e| self.db.error("pruning task outputs", &e))?;
            tx.execute(
                "DELETE FROM exec_deliveries WHERE job_id = ANY($1)",
                &[&ids],
            )
            .await
            .map_err(|e| self.db.error("pruning deliveries", &e))?;
            // Periodic checkpoints go with the records; the seal stays.
            tx.execute(
                "DELETE FROM exec_kv WHERE space = $1 AND key = ANY($2)",
                &[&crate::audit::LIVE, &ids],
            )
            .await
            .map_err(|e| self.db.error("pruning journal checkpoints", &e))?;
            tx.commit()
                .await
                .map_err(|e| self.db.error("pruning jobs", &e))?;
            jobs += ids.len() as u64;
        }
    }

    /// Removes job `id` for good (a dead letter deleted).
    pub(crate) async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let mut c = self.db.client().await?;
        let tx = c
            .transaction()
            .await
            .map_err(|e| self.db.error("deleting a job", &e))?;
        for sql in [
            "DELETE FROM exec_events WHERE job_id = $1",
            "DELETE FROM exec_outputs WHERE job_id = $1",
            "DELETE FROM exec_deliveries WHERE job_id = $1",
            "DELETE FROM exec_jobs WHERE id = $1 AND finished_ms IS NOT NULL",
        ] {
            tx.execute(sql, &[&id])
                .await
                .map_err(|e| self.db.error("deleting a job", &e))?;
        }
        tx.commit()
            .await
            .map_err(|e| self.db.error("deleting a job", &e))
    }

    // ------------------------------------------------------------ wake-ups

    /// Follows job `id`'s changes (new events, here or elsewhere).
    pub(crate) fn subscribe(&self, id: &str) -> tokio::sync::watch::Receiver<u64> {
        let mut hub = crate::lock(&self.hub);
        hub.retain(|_, tx| tx.receiver_count() > 0);
        hub.entry(id.to_owned())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    /// Wakes the watchers of `ids` (`["*"]`: of every job).
    fn bump(&self, ids: &[&str]) {
        let hub = crate::lock(&self.hub);
        if ids.contains(&switchyard_store::pg::RESYNC) {
            for tx in hub.values() {
                tx.send_modify(|n| *n += 1);
            }
            return;
        }
        for id in ids {
            if let Some(tx) = hub.get(*id) {
                tx.send_modify(|n| *n += 1);
            }
        }
    }

    /// Runs until shutdown: turns notifications into wake-ups.
    pub(crate) async fn run_listener(self: Arc<Self>) {
        let mut rx = self.db.listen(&[EVENTS, JOBS, CANCEL]);
        // Payloads tell the channels apart: empty for claims, a marked id
        // for a cancel, job ids for events.
        loop {
            let payload = tokio::select! {
                p = rx.recv() => match p { Some(p) => p, None => return },
                _ = self.shutdown.wait() => return,
            };
            if payload.is_empty() || payload == switchyard_store::pg::RESYNC {
                self.claim_wake.notify_one();
            }
            if payload.is_empty() {
                continue;
            }
            if let Some(id) = payload.strip_prefix(CANCEL_MARK) {
                if self.holds(id).is_some() {
                    crate::lock(&self.cancels).push(id.to_owned());
                    self.cancel_wake.notify_one();
                }
                continue;
            }
            if let Some(id) = payload.strip_prefix(DELIVER_MARK) {
                if self.holds(id).is_some() {
                    self.deliveries_wanted(id);
                }
                continue;
            }
            if payload == switchyard_store::pg::RESYNC {
                // Notifications may have been missed: look at every job
                // held here for deliveries.
                let held: Vec<String> = crate::lock(&self.held).keys().cloned().collect();
                crate::lock(&self.deliveries).extend(held);
                self.delivery_wake.notify_one();
            }
            let ids: Vec<&str> = payload.split(',').collect();
            self.bump(&ids);
        }
    }
}

/// Inserts the jobs accepted here (owned here, epoch 1); answers the ids
/// inserted (an id already taken is not). A batch retried after a commit
/// whose answer was lost (the database died between) finds its own rows:
/// still ours at epoch 1, created at the same moment by the same submitter
/// with the same context — those count as inserted, not as taken.
const INSERT_JOBS: &str = "INSERT INTO exec_jobs (id, tenant, submitted_by, created_ms, state, context_hash, record, owner, lease_until, epoch, queues, priority)
    SELECT u.id, u.tenant, u.sub, u.created, u.state, u.hash, u.record, $7, $8, 1, u.queues, u.priority
    FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $9::bytea[], $10::text[], $11::int[])
    AS u(id, tenant, sub, created, state, hash, record, queues, priority)
    ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until
        WHERE exec_jobs.owner = EXCLUDED.owner AND exec_jobs.epoch = 1
          AND exec_jobs.created_ms = EXCLUDED.created_ms
          AND exec_jobs.submitted_by = EXCLUDED.submitted_by
          AND exec_jobs.context_hash = EXCLUDED.context_hash
    RETURNING id";
/// The batch: fences (locks the rows of the jobs still held here at their
/// epoch), renews their leases and stores the records of those that moved,
/// then inserts the events and outputs of held jobs only; answers the ids
/// still held. An event already stored at its position is the same batch
/// committed before (its answer lost): kept, not refused — positions of a
/// held job are only ever handed out here.
const WRITE_BATCH: &str = "WITH held AS (
    UPDATE exec_jobs j
    SET lease_until = GREATEST(j.lease_until, $7),
        state = COALESCE(u.state, j.state),
        record = COALESCE(u.record, j.record),
        finished_ms = COALESCE(u.finished, j.finished_ms)
    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[], $5::bigint[])
         AS u(id, epoch, state, record, finished)
    WHERE j.id = u.id AND j.owner = $6 AND j.epoch = u.epoch
    RETURNING j.id, j.epoch
), evs AS (
    INSERT INTO exec_events (job_id, seq, epoch, owner, data)
    SELECT e.job_id, e.seq, h.epoch, $6, e.data
    FROM unnest($8::text[], $9::bigint[], $10::bytea[]) AS e(job_id, seq, data)
    JOIN held h ON h.id = e.job_id
    ON CONFLICT (job_id, seq) DO NOTHING
), outs AS (
    INSERT INTO exec_outputs (job_id, task_id, data)
    SELECT o.job_id, o.task_id, o.data
    FROM unnest($11::text[], $12::text[], $13::bytea[]) AS o(job_id, task_id, data)
    JOIN held h ON h.id = o.job_id
    ON CONFLICT (job_id, task_id) DO UPDATE SET data = EXCLUDED.data
)
SELECT id FROM held";
/// Renews the leases of the jobs this replica runs (`$3`); answers them,
/// with whether a cancel was asked.
const RENEW: &str = "UPDATE exec_jobs SET lease_until = $2
    WHERE owner = $1 AND finished_ms IS NULL AND id = ANY($3)
    RETURNING id, epoch, cancel IS NOT NULL";

/// A NOTIFY payload naming `ids` (or every job, past the payload limit).
fn notify_payload<'a>(ids: impl Iterator<Item = &'a str>) -> String {
    let mut s = String::new();
    for id in ids {
        if s.len() + id.len() + 1 > 7000 {
            return switchyard_store::pg::RESYNC.to_owned();
        }
        if !s.is_empty() {
            s.push(',');
        }
        s.push_str(id);
    }
    s
}

fn decode<M: prost::Message + Default>(bytes: &[u8]) -> Result<M, StoreError> {
    M::decode(bytes)
        .map_err(|e| StoreError::Io(format!("a stored job record does not decode: {e}")))
}

fn stopping() -> ExecutorError {
    ExecutorError::Storage(StoreError::Io(
        "the executor is shutting down; what was not written is resumed from the stored events by the replica that takes the job".into(),
    ))
}

/// Events read per query when replaying a job.
const REPLAY_PAGE: i64 = 1000;
/// How often a worker's long poll looks for work another replica accepted.
const CLAIM_POLL: Duration = Duration::from_millis(250);
/// The maintenance lease's name.
const MAINTENANCE: &str = "executor.maintenance";

#[tonic::async_trait]
impl JobStore for PgJobs {
    fn load_held(&self) -> Result<Jobs, ExecutorError> {
        // Jobs are claimed from the shared tables once started.
        Ok(Jobs::default())
    }

    fn accept(&self, e: &JobEntry) -> Result<i64, ExecutorError> {
        let spec = e.spec();
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
        PgJobs::accept(
            self,
            NewJob {
                id: spec.job_id.clone(),
                tenant: e.job.tenant.clone(),
                submitted_by: e.job.submitted_by.clone(),
                created_ms: created_ms(&e.job),
                context_hash: e.context_hash.clone(),
                record: e.job.clone(),
                queues,
                priority: spec.priority,
            },
        );
        // The insert claims it at the first epoch.
        Ok(1)
    }

    fn append(
        &self,
        e: &JobEntry,
        wire: &Event,
        moved: bool,
        kept: Option<&TaskStatus>,
        seal: Option<&[u8]>,
    ) -> u64 {
        if let Some(status) = kept {
            // Queued first: written in the same batch as the event or an
            // earlier one.
            self.output(e.id(), status);
        }
        // The job's row moves with the event in the same batch.
        let moved = moved.then(|| {
            let state = e.state();
            let finished = state.is_terminal().then(|| {
                wire.time
                    .as_ref()
                    .map_or(0, switchyard_kit::time::timestamp_ms)
            });
            (state.as_str().to_owned(), stripped(&e.job), finished)
        });
        PgJobs::append(self, e.id(), e.lease, wire, moved, seal)
    }

    async fn durable(&self, g: u64) -> Result<u64, ExecutorError> {
        PgJobs::durable(self, g).await?;
        Ok(self.committed())
    }

    fn last(&self) -> u64 {
        PgJobs::last(self)
    }

    fn retire(&self, _r: &Retiring) -> Result<(), ExecutorError> {
        // The job's row holds its final record (written with its final
        // event).
        Ok(())
    }

    fn checkpoint(&self, _first: Option<u64>, _upto: Option<u64>) -> Result<u64, ExecutorError> {
        // A replica replays nothing at start-up: it claims jobs and reads
        // each one's events then.
        Ok(0)
    }

    fn flush(&self, _first_event: Option<u64>) -> Result<(), ExecutorError> {
        // The writer's last batch ran at shutdown.
        Ok(())
    }

    async fn load(&self, id: &str, replay: bool) -> Result<Option<JobEntry>, ExecutorError> {
        let Some(stored) = self.stored(id).await? else {
            return Ok(None);
        };
        let Some(mut e) = JobEntry::restored(&stored.record)? else {
            return Ok(None);
        };
        let outputs: HashMap<String, TaskStatus> = self
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
                let page = self.events_after(id, after, REPLAY_PAGE).await?;
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

    async fn identity(&self, id: &str) -> Result<Option<(String, String)>, ExecutorError> {
        Ok(PgJobs::identity(self, id).await?)
    }

    async fn record(&self, id: &str) -> Result<Option<Job>, ExecutorError> {
        Ok(self.stored(id).await?.map(|s| s.record))
    }

    async fn events(
        &self,
        id: &str,
        after: u64,
        upto: u64,
        _positions: &[u64],
    ) -> Result<Vec<Event>, ExecutorError> {
        let limit = i64::try_from(upto.saturating_sub(after)).unwrap_or(REPLAY_PAGE);
        Ok(self.events_after(id, after, limit.min(REPLAY_PAGE)).await?)
    }

    async fn page(
        &self,
        before: Option<(u64, &str)>,
        n: usize,
    ) -> Result<Vec<(String, Job)>, ExecutorError> {
        Ok(PgJobs::page(self, before, i64::try_from(n).unwrap_or(i64::MAX)).await?)
    }

    async fn open_records(
        &self,
        tenant: Option<&str>,
        n: usize,
    ) -> Result<Vec<(String, Job)>, ExecutorError> {
        Ok(PgJobs::open_records(self, tenant, i64::try_from(n).unwrap_or(i64::MAX)).await?)
    }

    async fn prune(
        &self,
        cutoff_ms: u64,
        tenant: Option<&str>,
        _held: &(dyn for<'k> Fn(&'k str) -> bool + Send + Sync),
        _first_event: Option<u64>,
    ) -> Result<(u64, u64), ExecutorError> {
        // Only finished jobs' rows go, and a finished job is held nowhere.
        Ok(PgJobs::prune(self, cutoff_ms, tenant).await?)
    }

    async fn delete(&self, id: &str, _job: &Job) -> Result<(), ExecutorError> {
        Ok(PgJobs::delete(self, id).await?)
    }

    fn reopen(&self, _id: &str, _first_event: Option<u64>) -> Result<(), ExecutorError> {
        // Its row's state moves with the events of its new round.
        Ok(())
    }

    fn subscribe(&self, id: &str) -> tokio::sync::watch::Receiver<u64> {
        PgJobs::subscribe(self, id)
    }

    fn poll(&self) -> Option<Duration> {
        Some(WATCH_POLL)
    }

    fn space(self: Arc<Self>, name: &'static str) -> Space {
        Space::Pg(self, name)
    }

    fn content(self: Arc<Self>) -> Result<Content, ExecutorError> {
        Ok(Content::Pg(self))
    }
}

#[tonic::async_trait]
impl Cluster for PgJobs {
    fn shared(&self) -> bool {
        true
    }

    fn holds(&self, id: &str) -> Option<i64> {
        PgJobs::holds(self, id)
    }

    fn release(&self, id: &str, lease: i64, lost: bool) {
        if lost {
            self.forget(id);
        } else {
            PgJobs::release(self, id, lease);
        }
    }

    fn lost_at(&self, id: &str, lease: i64) -> bool {
        PgJobs::lost_at(self, id, lease)
    }

    fn take_lost(&self) -> Vec<String> {
        PgJobs::take_lost(self)
    }

    async fn claim_queued(
        &self,
        queues: &[String],
        tenant: Option<&str>,
        n: usize,
    ) -> Result<Vec<(String, i64)>, ExecutorError> {
        Ok(PgJobs::claim_queued(self, queues, tenant, n).await?)
    }

    async fn adopt_finished(&self, id: &str) -> Result<Option<i64>, ExecutorError> {
        Ok(PgJobs::adopt_finished(self, id).await?)
    }

    async fn request_cancel(&self, id: &str, ask: &[u8]) -> Result<(), ExecutorError> {
        PgJobs::request_cancel(self, id, ask).await?;
        Ok(())
    }

    async fn take_slot(&self, tenant: &str, id: &str, cap: u32) -> Result<bool, ExecutorError> {
        Ok(PgJobs::take_slot(self, tenant, id, cap).await?)
    }

    async fn free_slot(&self, id: &str) -> Result<(), ExecutorError> {
        Ok(PgJobs::free_slot(self, id).await?)
    }

    async fn request_delivery(&self, id: &str, key: &str, ask: &[u8]) -> Result<(), ExecutorError> {
        Ok(PgJobs::request_delivery(self, id, key, ask).await?)
    }

    async fn take_delivery(
        &self,
        id: &str,
        key: &str,
    ) -> Result<Option<Option<Vec<u8>>>, ExecutorError> {
        Ok(PgJobs::take_delivery(self, id, key).await?)
    }

    fn claim_poll(&self) -> Option<Duration> {
        Some(CLAIM_POLL)
    }

    async fn maintains(&self, now_ms: u64, ttl_ms: u64) -> bool {
        matches!(
            self.db.lease(MAINTENANCE, &self.me, now_ms, ttl_ms).await,
            Ok(Some(_))
        )
    }

    fn start(self: Arc<Self>, x: &Executor) {
        x.start_replica(self);
    }

    async fn closed(&self) {
        PgJobs::closed(self).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_started_under_a_lost_lease_is_refused_even_after_the_job_is_claimed_again() {
        let t0 = std::time::Instant::now();
        let mut lost = LostEpochs::default();
        assert!(!lost.at("j", 1), "nothing lost yet");
        lost.note(&[("j".to_owned(), 1)], t0);
        assert!(lost.at("j", 1), "the attempt of epoch 1 must not act");
        assert!(!lost.at("j", 2), "a later claim's attempts act");
        assert!(!lost.at("k", 1), "other jobs are untouched");
        // Lost again at its next epoch: the later loss is the one kept (an
        // older attempt also finds the job gone or at another epoch).
        lost.note(&[("j".to_owned(), 2)], t0);
        assert!(lost.at("j", 2));
        // Forgotten once no attempt can still wait on that batch.
        lost.note(&[("k".to_owned(), 7)], t0 + LOST_KEPT);
        assert!(!lost.at("j", 2), "kept only {LOST_KEPT:?}");
        assert!(lost.at("k", 7));
    }
}
