//! The ledger on PostgreSQL, for any number of replicas on one database.
//!
//! Budgets, reservations and the journal are tables. A write is decided by
//! the same [`Desk`] code as on sled, against the slice of the books its
//! transaction locked: the reservations it names (by id and by key) and
//! every budget of the chains it touches, locked `FOR UPDATE` in id order —
//! one fixed order, so concurrent chains cannot deadlock. The decision's
//! records are inserted and the changed rows written back in the same
//! transaction, so a Reserve is atomic across the whole ancestor chain and
//! across replicas: two replicas reserving on one budget take turns on its
//! row, each deciding against what the other committed.
//!
//! Each replica batches: writes that arrive while a transaction is in
//! flight go together into the next one (up to [`MAX_BATCH`]), so one hot
//! budget costs one row lock and one commit per batch rather than per
//! request. A batch whose transaction hits a serialization failure, a
//! deadlock or a key another replica inserted first runs again whole;
//! any other database error fails the batch's callers (nothing was
//! acknowledged).
//!
//! Journal sequence numbers come from a sequence, taken after the locks so
//! that the records of one chain are numbered in commit order. Numbers a
//! batch took but did not use are written as void rows, so a reader tailing
//! the journal (`Watch`) meets a gap only while a transaction is in flight
//! (or after one rolled back: it then waits
//! [`switchyard_store::pg::GAP_GRACE`] before moving on). Watch polls; there is no LISTEN, which CockroachDB lacks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use prost::Message;
use switchyard_proto::ledger::v1::{
    Budget, Entry, JournalRecord, ListBudgetsRequest, ListBudgetsResponse, ListEntriesRequest,
    RecordKind, VerifyJournalResponse,
};
use switchyard_store::StoreError;
use switchyard_store::pg::{Migration, Pg, TxError};
use tokio::sync::{mpsc, oneshot};

use crate::books::{Books, BudgetState, Charge, Res, Settled};
use crate::chain;
use crate::cold::{StoredBudget, StoredRes};
use crate::desk::{Desk, Done, Op, Sink};
use crate::rates::{self, Bucket, RateWork, RatesConfig, Table};
use crate::{LedgerError, page_of_budgets};

/// Most writes one transaction carries.
pub(crate) const MAX_BATCH: usize = 128;
/// Transactions each replica runs at once. One: a replica's writes that
/// wait meanwhile all go into its next batch, where several writers would
/// only queue on the same parent budgets' row locks (measured: four writers
/// gave 2,115 pairs/s against one's 3,078 on a shared parent).
const WRITERS: usize = 1;
/// A batch runs again at most this often after a retryable failure.
const ATTEMPTS: usize = 8;

/// The schema, in order. Never edit a released migration: add one.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "budgets, reservations and the journal",
        sql: "
        CREATE TABLE ledger_budgets (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            parent TEXT NOT NULL,
            data BYTEA NOT NULL);
        CREATE INDEX ledger_budgets_by_parent ON ledger_budgets (parent, id);
        CREATE TABLE ledger_reservations (
            id TEXT PRIMARY KEY,
            budget_id TEXT NOT NULL,
            reserve_key TEXT NOT NULL UNIQUE,
            settle_key TEXT UNIQUE,
            open BOOLEAN NOT NULL,
            expires_ms BIGINT NOT NULL,
            data BYTEA NOT NULL,
            entry BYTEA,
            overrun BOOLEAN NOT NULL DEFAULT false);
        CREATE INDEX ledger_reservations_open_by_expiry
            ON ledger_reservations (expires_ms) WHERE open;
        CREATE SEQUENCE ledger_journal_seq;
        CREATE TABLE ledger_journal (
            seq BIGINT PRIMARY KEY,
            kind INT NOT NULL,
            budget_id TEXT NOT NULL,
            job_id TEXT NOT NULL,
            correlation_id TEXT NOT NULL,
            record BYTEA NOT NULL);
        CREATE INDEX ledger_journal_entries_by_budget
            ON ledger_journal (budget_id, seq) WHERE kind = 5;
        CREATE INDEX ledger_journal_entries_by_job
            ON ledger_journal (job_id, seq) WHERE kind = 5;
        CREATE INDEX ledger_journal_entries_by_correlation
            ON ledger_journal (correlation_id, seq) WHERE kind = 5;
    ",
    },
    Migration {
        version: 2,
        name: "rate-limit buckets",
        sql: "
        CREATE TABLE ledger_rate_buckets (
            key TEXT PRIMARY KEY,
            data BYTEA NOT NULL);
    ",
    },
];

// The SQL above and below names committed records by their number.
const _: () = assert!(RecordKind::Committed as i32 == 5);

/// Counts one round trip to the database (`ledger_pg_round_trips`).
fn trip() {
    switchyard_kit::metrics::global()
        .ledger_pg_round_trips
        .inc();
}

/// One write waiting for a transaction.
struct Job {
    op: Op,
    /// Its rate-limit part.
    work: Option<RateWork>,
    prefix: String,
    now: u64,
    reply: oneshot::Sender<Result<Done, LedgerError>>,
}

/// The books in PostgreSQL.
pub(crate) struct PgBooks {
    db: Pg,
    /// Tenant and parent of budgets seen: both fixed at creation.
    facts: Mutex<HashMap<String, (String, String)>>,
    /// The budget of each open reservation this replica made or settled
    /// (fixed at creation; forgotten once settled).
    homes: Mutex<HashMap<String, String>>,
    jobs: mpsc::Sender<Job>,
    /// The rate limits.
    rates: std::sync::Arc<RatesConfig>,
    /// The rate-limit buckets as this replica's last writes left them.
    last: Mutex<BTreeMap<String, Bucket>>,
}

impl PgBooks {
    /// Migrates the schema and starts this replica's writers.
    pub(crate) async fn open(
        db: Pg,
        rates: std::sync::Arc<RatesConfig>,
    ) -> Result<std::sync::Arc<Self>, LedgerError> {
        crate::Ledger::migrate(&db).await?;
        let (tx, rx) = mpsc::channel::<Job>(4 * MAX_BATCH);
        let books = std::sync::Arc::new(PgBooks {
            db,
            facts: Mutex::new(HashMap::new()),
            homes: Mutex::new(HashMap::new()),
            jobs: tx,
            rates,
            last: Mutex::new(BTreeMap::new()),
        });
        let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..WRITERS {
            let (books, rx) = (std::sync::Arc::downgrade(&books), rx.clone());
            tokio::spawn(async move {
                loop {
                    // Take what is waiting, up to a batch.
                    let batch = {
                        let mut rx = rx.lock().await;
                        let Some(first) = rx.recv().await else { return };
                        let mut batch = vec![first];
                        while batch.len() < MAX_BATCH {
                            match rx.try_recv() {
                                Ok(j) => batch.push(j),
                                Err(_) => break,
                            }
                        }
                        batch
                    };
                    let Some(books) = books.upgrade() else { return };
                    books.run(batch).await;
                }
            });
        }
        Ok(books)
    }

    /// Decides `op` in the next transaction; answers once it committed.
    pub(crate) async fn write(
        &self,
        op: Op,
        work: Option<RateWork>,
        prefix: &str,
        now: u64,
    ) -> Result<Done, LedgerError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            op,
            work,
            prefix: prefix.to_owned(),
            now,
            reply,
        };
        if self.jobs.send(job).await.is_err() {
            return Err(StoreError::Closed.into());
        }
        answer.await.unwrap_or(Err(StoreError::Closed.into()))
    }

    /// Runs one batch, again while it fails in a way a retry cures, and
    /// answers each caller.
    async fn run(&self, jobs: Vec<Job>) {
        let mut outcome = Err(StoreError::Closed);
        for attempt in 0..ATTEMPTS {
            match self.attempt(&jobs).await {
                Ok(done) => {
                    outcome = Ok(done);
                    break;
                }
                Err(TxError::Retry(e)) if attempt + 1 < ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "ledger batch runs again");
                    // A little jitter, so two replicas that collided do not
                    // collide again in step.
                    let pause = 1 + (rand_unit() * 4.0 * (attempt as f64 + 1.0)) as u64;
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                Err(TxError::Retry(e) | TxError::Fatal(e)) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        match outcome {
            Ok(done) => {
                for (job, d) in jobs.into_iter().zip(done) {
                    let _ = job.reply.send(d);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, writes = jobs.len(), "ledger batch failed; nothing was recorded");
                let msg = e.to_string();
                for job in jobs {
                    let _ = job.reply.send(Err(StoreError::Io(msg.clone()).into()));
                }
            }
        }
    }

    /// One transaction over the batch.
    async fn attempt(&self, jobs: &[Job]) -> Result<Vec<Result<Done, LedgerError>>, TxError> {
        let db = &self.db;
        let mut client = db.client().await.map_err(TxError::Fatal)?;
        let fail = |doing: &'static str| move |e: tokio_postgres::Error| db.tx_error(doing, &e);
        switchyard_kit::metrics::global()
            .ledger_pg_transactions
            .inc();
        trip();
        let tx = client
            .transaction()
            .await
            .map_err(fail("starting a transaction"))?;

        // 1. The reservations the batch names (by id or key), then every
        // budget of the chains it touches, each locked in id order; then
        // numbers for the records (at most two per write). When this
        // replica already knows the chains (budgets' parents never change;
        // it remembers the budget of the reservations it made), the three
        // go in one round trip: pipelined statements run in order, so the
        // locks are still taken reservations first, budgets second.
        let ids: Vec<&str> = jobs.iter().filter_map(|j| j.op.reservation()).collect();
        let rkeys: Vec<&str> = jobs.iter().filter_map(|j| j.op.reserve_key()).collect();
        let skeys: Vec<&str> = jobs.iter().filter_map(|j| j.op.settle_key()).collect();
        let wanted: i64 = jobs
            .iter()
            .map(|j| {
                if matches!(j.op, Op::Commit { .. }) {
                    2
                } else {
                    1
                }
            })
            .sum();
        // Parsed and planned once per connection, not per batch.
        let mut statements = Vec::with_capacity(BATCH_SQL.len());
        for sql in BATCH_SQL {
            statements.push(
                tx.prepare_cached(sql)
                    .await
                    .map_err(fail("preparing a statement"))?,
            );
        }
        type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
        let res_params: [Param<'_>; 3] = [&ids, &rkeys, &skeys];
        let num_params: [Param<'_>; 1] = [&wanted];
        // A batch that names no reservation (budgets created, closed or
        // read) skips their statement.
        let names_reservations = !(ids.is_empty() && rkeys.is_empty() && skeys.is_empty());
        let reservations = async {
            if names_reservations {
                tx.query(&statements[0], &res_params).await
            } else {
                Ok(Vec::new())
            }
        };
        let known = self.known_chains(jobs);
        // The rate-limit buckets the batch touches, when this replica knows
        // the facts they follow from: locked in the same round trip, after
        // the budgets (a model call that reserves money pays no extra trip).
        let early_keys: Vec<String> = match known {
            Some(_) => {
                let facts = self.facts.lock().unwrap_or_else(|p| p.into_inner());
                let homes = self.homes.lock().unwrap_or_else(|p| p.into_inner());
                self.buckets_of(
                    jobs,
                    |id| facts.get(id).cloned(),
                    |rid| homes.get(rid).cloned(),
                )
                .into_iter()
                .collect()
            }
            None => Vec::new(),
        };
        let bucket_params: [Param<'_>; 1] = [&early_keys];
        let mut bucket_rows = Vec::new();
        let (res_rows, mut chain, budget_rows, seq_rows) = match known {
            Some(chain) => {
                let chain_ids: Vec<&str> = chain.iter().map(String::as_str).collect();
                let budget_params: [Param<'_>; 1] = [&chain_ids];
                let buckets = async {
                    if early_keys.is_empty() {
                        return Ok(Vec::new());
                    }
                    // Both sent at once: the lock runs after the insert.
                    let (_, rows) = futures_util::try_join!(
                        tx.execute(&statements[6], &bucket_params),
                        tx.query(&statements[7], &bucket_params),
                    )?;
                    Ok(rows)
                };
                trip();
                let (r, b, n, k) = futures_util::try_join!(
                    reservations,
                    tx.query(&statements[1], &budget_params),
                    tx.query(&statements[2], &num_params),
                    buckets,
                )
                .map_err(fail("locking the batch's rows"))?;
                bucket_rows = k;
                (r, chain.clone(), b, n)
            }
            None => {
                if names_reservations {
                    trip();
                }
                let r = reservations.await.map_err(fail("locking reservations"))?;
                let mut leaves: BTreeSet<String> = jobs
                    .iter()
                    .flat_map(|j| j.op.budgets())
                    .map(str::to_owned)
                    .collect();
                for row in &r {
                    leaves.insert(reservation_budget(&row.get::<_, Vec<u8>>(0))?);
                }
                let chain = self.chains(&tx, &leaves).await?;
                let chain_ids: Vec<&str> = chain.iter().map(String::as_str).collect();
                let budget_params: [Param<'_>; 1] = [&chain_ids];
                trip();
                let (b, n) = futures_util::try_join!(
                    tx.query(&statements[1], &budget_params),
                    tx.query(&statements[2], &num_params),
                )
                .map_err(fail("locking budgets"))?;
                (r, chain, b, n)
            }
        };
        let mut books = Books::default();
        let mut before: HashMap<String, Vec<u8>> = HashMap::new();
        for row in res_rows {
            let data: Vec<u8> = row.get(0);
            let stored =
                StoredRes::decode(data.as_slice()).map_err(|e| corrupt("reservation", e))?;
            let res = Res::from(stored);
            if let (Settled::Committed(seq), Some(entry)) =
                (res.settled, row.get::<_, Option<Vec<u8>>>(1))
            {
                let entry = Entry::decode(entry.as_slice()).map_err(|e| corrupt("entry", e))?;
                books.entries.insert(
                    seq,
                    Charge {
                        entry,
                        overrun: row.get(2),
                    },
                );
            }
            before.insert(format!("r{}", res.id), data);
            books.restore(res);
        }
        // Draws being settled give back to their holds: lock those too (out
        // of order, like the chains below).
        let holds: Vec<String> = books
            .reservations
            .values()
            .map(|r| r.from_hold.clone())
            .filter(|h| !h.is_empty() && !books.reservations.contains_key(h))
            .collect();
        if !holds.is_empty() {
            trip();
            let none: Vec<&str> = Vec::new();
            for row in tx
                .query(&statements[0], &[&holds, &none, &none])
                .await
                .map_err(fail("locking holds"))?
            {
                let data: Vec<u8> = row.get(0);
                let stored =
                    StoredRes::decode(data.as_slice()).map_err(|e| corrupt("reservation", e))?;
                let res = Res::from(stored);
                before.insert(format!("r{}", res.id), data);
                books.restore(res);
            }
        }
        let mut budget_rows = budget_rows;
        // A reservation found by key may sit on a budget the batch did not
        // name (an idempotent replay, a reused key): lock its chain too
        // (out of order: a deadlock this rare costs a retry).
        let extra: BTreeSet<String> = books
            .reservations
            .values()
            .map(|r| r.budget_id.clone())
            .filter(|b| !chain.contains(b))
            .collect();
        if !extra.is_empty() {
            let more: Vec<String> = self
                .chains(&tx, &extra)
                .await?
                .into_iter()
                .filter(|b| !chain.contains(b))
                .collect();
            trip();
            let rows = tx
                .query(&statements[1], &[&more])
                .await
                .map_err(fail("locking budgets"))?;
            budget_rows.extend(rows);
            chain.extend(more);
        }
        for row in budget_rows {
            let data: Vec<u8> = row.get(0);
            let b = BudgetState::from(
                StoredBudget::decode(data.as_slice()).map_err(|e| corrupt("budget", e))?,
            );
            before.insert(format!("b{}", b.id), data);
            books.budgets.insert(b.id.clone(), b);
        }
        // Parents learn of the children created under them in the batch.
        for b in books.budgets.values_mut() {
            b.children.clear();
        }
        // Buckets the batch needs that were not locked above (a chain this
        // replica had not seen): one more round trip.
        let mut table = Table::default();
        for row in bucket_rows {
            let (key, data): (String, Vec<u8>) = (row.get(0), row.get(1));
            let bucket = Bucket::decode(data.as_slice()).map_err(|e| corrupt("rate bucket", e))?;
            table.buckets.insert(key, bucket);
        }
        let needed = self.buckets_of(jobs, rates::books_facts(&books), |rid| {
            books.reservations.get(rid).map(|r| r.budget_id.clone())
        });
        let late: Vec<String> = needed
            .into_iter()
            .filter(|k| !table.buckets.contains_key(k))
            .collect();
        if !late.is_empty() {
            let params: [Param<'_>; 1] = [&late];
            trip();
            let (_, rows) = futures_util::try_join!(
                tx.execute(&statements[6], &params),
                tx.query(&statements[7], &params),
            )
            .map_err(fail("locking rate buckets"))?;
            for row in rows {
                let (key, data): (String, Vec<u8>) = (row.get(0), row.get(1));
                let bucket =
                    Bucket::decode(data.as_slice()).map_err(|e| corrupt("rate bucket", e))?;
                table.buckets.insert(key, bucket);
            }
        }
        let seqs: Vec<i64> = seq_rows.iter().map(|r| r.get(0)).collect();
        let mut sink = Batch {
            seqs: seqs
                .iter()
                .map(|s| *s as u64)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            next: 0,
            records: Vec::new(),
        };

        // 4. Decide, in arrival order.
        let mut done = Vec::with_capacity(jobs.len());
        for job in jobs {
            let mut desk = Desk {
                books: &mut books,
                cold: None,
                sink: &mut sink,
                prefix: &job.prefix,
                now: job.now,
            };
            done.push(rates::decide(
                &mut desk,
                &mut table,
                &self.rates,
                job.op.clone(),
                job.work.as_ref(),
            ));
        }

        // 5. Write back what changed, the records and the unused numbers.
        let mut b_rows: (Vec<String>, Vec<String>, Vec<String>, Vec<Vec<u8>>) = Default::default();
        for b in books.budgets.values() {
            let mut stored = StoredBudget::from(b);
            // Children and entries are rows of their own here.
            stored.children.clear();
            stored.entries.clear();
            let data = stored.encode_to_vec();
            if before.get(&format!("b{}", b.id)) != Some(&data) {
                b_rows.0.push(b.id.clone());
                b_rows.1.push(b.tenant.clone());
                b_rows.2.push(b.parent.clone().unwrap_or_default());
                b_rows.3.push(data);
            }
        }
        let mut r_rows = ResRows::default();
        for r in books.reservations.values() {
            let data = StoredRes::from(r).encode_to_vec();
            if before.get(&format!("r{}", r.id)) != Some(&data) {
                let charge = match r.settled {
                    Settled::Committed(seq) => books.entries.get(&seq),
                    _ => None,
                };
                r_rows.push(r, data, charge);
            }
        }
        let used: BTreeSet<u64> = sink.records.iter().map(|r| r.sequence).collect();
        let mut j_rows = JournalRows::default();
        for rec in &sink.records {
            j_rows.push(rec);
        }
        for seq in sink.seqs.iter().filter(|s| !used.contains(s)) {
            j_rows.void(*seq);
        }
        let b_params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&b_rows.0, &b_rows.1, &b_rows.2, &b_rows.3];
        let r_params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
            &r_rows.id,
            &r_rows.budget,
            &r_rows.reserve_key,
            &r_rows.settle_key,
            &r_rows.open,
            &r_rows.expires,
            &r_rows.data,
            &r_rows.entry,
            &r_rows.overrun,
        ];
        let j_params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
            &j_rows.seq,
            &j_rows.kind,
            &j_rows.budget,
            &j_rows.job,
            &j_rows.correlation,
            &j_rows.record,
        ];
        // Each write only when it has rows (a batch of budgets changes no
        // reservation, one of reads writes nothing).
        let budgets_written = async {
            if b_rows.0.is_empty() {
                return Ok(0);
            }
            tx.execute(&statements[3], &b_params).await
        };
        let reservations_written = async {
            if r_rows.id.is_empty() {
                return Ok(0);
            }
            tx.execute(&statements[4], &r_params).await
        };
        let journal_written = async {
            if j_rows.seq.is_empty() {
                return Ok(0);
            }
            tx.execute(&statements[5], &j_params).await
        };
        let mut k_rows: (Vec<String>, Vec<Vec<u8>>) = Default::default();
        for key in &table.changed {
            if let Some(b) = table.buckets.get(key) {
                k_rows.0.push(key.clone());
                k_rows.1.push(b.encode_to_vec());
            }
        }
        let k_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&k_rows.0, &k_rows.1];
        let buckets_written = async {
            if k_rows.0.is_empty() {
                return Ok(0);
            }
            tx.execute(&statements[8], &k_params).await
        };
        // Pipelined: one round trip for the four.
        trip();
        futures_util::try_join!(
            budgets_written,
            reservations_written,
            journal_written,
            buckets_written
        )
        .map_err(fail("writing the batch"))?;
        trip();
        tx.commit().await.map_err(fail("committing the batch"))?;
        if !table.changed.is_empty() {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            for key in &table.changed {
                if let Some(b) = table.buckets.remove(key) {
                    last.insert(key.clone(), b);
                }
            }
        }

        {
            let mut homes = self.homes.lock().unwrap_or_else(|p| p.into_inner());
            for r in books.reservations.values() {
                if r.settled == Settled::Open {
                    homes.insert(r.id.clone(), r.budget_id.clone());
                } else {
                    homes.remove(&r.id);
                }
            }
        }
        let mut facts = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        for b in books.budgets.values() {
            facts
                .entry(b.id.clone())
                .or_insert_with(|| (b.tenant.clone(), b.parent.clone().unwrap_or_default()));
        }
        Ok(done)
    }

    /// Every budget of the chains `jobs` touch, if this replica knows them
    /// all without asking the database.
    fn known_chains(&self, jobs: &[Job]) -> Option<BTreeSet<String>> {
        let mut leaves = Vec::new();
        {
            let homes = self.homes.lock().unwrap_or_else(|p| p.into_inner());
            for job in jobs {
                if matches!(job.op, Op::Create { .. }) {
                    return None;
                }
                leaves.extend(job.op.budgets().into_iter().map(str::to_owned));
                if let Some(rid) = job.op.reservation() {
                    leaves.push(homes.get(rid)?.clone());
                }
            }
        }
        let (out, missing) = self.cached_chains(leaves.iter());
        missing.is_empty().then_some(out)
    }

    /// The rate-limit buckets `jobs` touch that follow from budget `facts`
    /// and reservation `homes` (a job whose facts are missing adds none).
    fn buckets_of(
        &self,
        jobs: &[Job],
        facts: impl Fn(&str) -> Option<(String, String)>,
        home: impl Fn(&str) -> Option<String>,
    ) -> BTreeSet<String> {
        jobs.iter()
            .filter_map(|job| {
                let work = job.work.as_ref()?;
                rates::keys_of(&self.rates, &job.op, work, &facts, &home)
            })
            .flatten()
            .collect()
    }

    /// `leaves` and their ancestors as far as this replica knows them, and
    /// the budgets it does not know.
    fn cached_chains<'a>(
        &self,
        leaves: impl Iterator<Item = &'a String>,
    ) -> (BTreeSet<String>, Vec<String>) {
        let facts = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        let (mut out, mut missing) = (BTreeSet::new(), Vec::new());
        for leaf in leaves {
            let mut cur = leaf.clone();
            loop {
                match facts.get(&cur) {
                    Some((_, parent)) => {
                        out.insert(cur.clone());
                        if parent.is_empty() || out.contains(parent) {
                            break;
                        }
                        cur = parent.clone();
                    }
                    None => {
                        missing.push(cur);
                        break;
                    }
                }
            }
        }
        (out, missing)
    }

    /// `leaves` and all their ancestors (those that exist).
    async fn chains(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        leaves: &BTreeSet<String>,
    ) -> Result<BTreeSet<String>, TxError> {
        let (mut out, missing) = self.cached_chains(leaves.iter());
        if missing.is_empty() {
            return Ok(out);
        }
        trip();
        let rows = tx
            .query(
                "WITH RECURSIVE up (id, tenant, parent) AS (
                     SELECT id, tenant, parent FROM ledger_budgets WHERE id = ANY($1)
                     UNION
                     SELECT b.id, b.tenant, b.parent FROM ledger_budgets b JOIN up ON b.id = up.parent)
                 SELECT id, tenant, parent FROM up",
                &[&missing],
            )
            .await
            .map_err(|e| self.db.tx_error("reading budget chains", &e))?;
        let mut facts = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        for row in rows {
            let (id, tenant, parent): (String, String, String) =
                (row.get(0), row.get(1), row.get(2));
            out.insert(id.clone());
            facts.insert(id, (tenant, parent));
        }
        Ok(out)
    }

    /// The rate-limit buckets as this replica's last writes left them.
    pub(crate) fn last_buckets(&self) -> Vec<(String, Bucket)> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.iter().map(|(k, b)| (k.clone(), b.clone())).collect()
    }

    /// Every rate-limit bucket.
    pub(crate) async fn buckets(&self) -> Result<Vec<(String, Bucket)>, LedgerError> {
        let c = self.db.client().await?;
        let rows = c
            .query(
                "SELECT key, data FROM ledger_rate_buckets ORDER BY key",
                &[],
            )
            .await
            .map_err(|e| self.db.error("reading rate buckets", &e))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let (key, data): (String, Vec<u8>) = (row.get(0), row.get(1));
            match Bucket::decode(data.as_slice()) {
                Ok(b) => out.push((key, b)),
                Err(e) => {
                    tracing::error!(key = %key, error = %e, "rate bucket skipped: undecodable")
                }
            }
        }
        Ok(out)
    }

    /// Budget `id`'s tenant and parent.
    pub(crate) async fn facts(&self, id: &str) -> Result<Option<(String, String)>, LedgerError> {
        if let Some(f) = self.facts.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Ok(Some(f.clone()));
        }
        let c = self.db.client().await?;
        let row = c
            .query_opt(
                "SELECT tenant, parent FROM ledger_budgets WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(|e| self.db.error("reading a budget", &e))?;
        Ok(row.map(|r| {
            let f: (String, String) = (r.get(0), r.get(1));
            self.facts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id.to_owned(), f.clone());
            f
        }))
    }

    /// One budget.
    pub(crate) async fn budget(&self, id: &str) -> Result<Option<Budget>, LedgerError> {
        let c = self.db.client().await?;
        let row = c
            .query_opt("SELECT data FROM ledger_budgets WHERE id = $1", &[&id])
            .await
            .map_err(|e| self.db.error("reading a budget", &e))?;
        row.map(|r| budget_view(&r.get::<_, Vec<u8>>(0)))
            .transpose()
    }

    /// The budget reservation `id` was made on.
    pub(crate) async fn reservation_budget(&self, id: &str) -> Result<Option<String>, LedgerError> {
        let c = self.db.client().await?;
        let row = c
            .query_opt(
                "SELECT budget_id FROM ledger_reservations WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(|e| self.db.error("reading a reservation", &e))?;
        Ok(row.map(|r| r.get(0)))
    }

    /// A page of budgets in id order.
    pub(crate) async fn list_budgets(
        &self,
        req: &ListBudgetsRequest,
    ) -> Result<ListBudgetsResponse, LedgerError> {
        let size = switchyard_core::validate::page_size(req.page_size);
        let c = self.db.client().await?;
        let rows = c
            .query(
                "SELECT data FROM ledger_budgets WHERE id > $1 AND ($2 = '' OR parent = $2)
                 ORDER BY id LIMIT $3",
                &[&req.page_token, &req.parent_id, &(size as i64 + 1)],
            )
            .await
            .map_err(|e| self.db.error("listing budgets", &e))?;
        let budgets = rows
            .iter()
            .map(|r| budget_view(&r.get::<_, Vec<u8>>(0)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(page_of_budgets(budgets, size))
    }

    /// Every budget in id order.
    pub(crate) async fn budgets(&self) -> Result<Vec<Budget>, LedgerError> {
        let c = self.db.client().await?;
        let rows = c
            .query("SELECT data FROM ledger_budgets ORDER BY id", &[])
            .await
            .map_err(|e| self.db.error("listing budgets", &e))?;
        rows.iter()
            .map(|r| budget_view(&r.get::<_, Vec<u8>>(0)))
            .collect()
    }

    /// The charges a ListEntries selects (ascending), and the budget it
    /// names.
    pub(crate) async fn charges(
        &self,
        req: &ListEntriesRequest,
    ) -> Result<crate::Selected, LedgerError> {
        let c = self.db.client().await?;
        let err =
            |e: tokio_postgres::Error| LedgerError::from(self.db.error("listing entries", &e));
        let (rows, budget) = if !req.budget_id.is_empty() {
            let Some(budget) = self.budget(&req.budget_id).await? else {
                return Err(LedgerError::BudgetNotFound(req.budget_id.clone()));
            };
            let rows = c
                .query(
                    "WITH RECURSIVE down (id) AS (
                         SELECT $1::TEXT
                         UNION
                         SELECT b.id FROM ledger_budgets b JOIN down ON b.parent = down.id)
                     SELECT seq, record FROM ledger_journal
                     WHERE kind = 5 AND budget_id IN (SELECT id FROM down) ORDER BY seq",
                    &[&req.budget_id],
                )
                .await
                .map_err(err)?;
            (rows, Some(budget))
        } else if !req.job_id.is_empty() {
            let rows = c
                .query(
                    "SELECT seq, record FROM ledger_journal WHERE kind = 5 AND job_id = $1 ORDER BY seq",
                    &[&req.job_id],
                )
                .await
                .map_err(err)?;
            (rows, None)
        } else {
            let rows = c
                .query(
                    "SELECT seq, record FROM ledger_journal WHERE kind = 5 AND correlation_id = $1
                     ORDER BY seq",
                    &[&req.correlation_id],
                )
                .await
                .map_err(err)?;
            (rows, None)
        };
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let rec = record(&r.get::<_, Vec<u8>>(1))?;
            let charge = Charge {
                entry: rec.entry.unwrap_or_default(),
                overrun: rec.overrun,
            };
            out.push((r.get::<_, i64>(0) as u64, charge));
        }
        Ok((out, budget))
    }

    /// Checks the journal's chains (budget `only`, or all) against the
    /// heads the budgets `wanted` (by id and tenant) keep, from one
    /// snapshot of the database: a record committed meanwhile is in both
    /// or neither.
    pub(crate) async fn check_chains(
        &self,
        only: &str,
        wanted: impl Fn(&str, &str) -> bool,
    ) -> Result<VerifyJournalResponse, LedgerError> {
        let err = |e: tokio_postgres::Error| self.db.error("reading the journal to verify it", &e);
        let mut c = self.db.client().await?;
        let tx = self.db.snapshot(&mut c).await.map_err(err)?;
        let rows = tx
            .query(
                "SELECT id, tenant, data FROM ledger_budgets WHERE $1 = '' OR id = $1",
                &[&only],
            )
            .await
            .map_err(err)?;
        let mut kept = BTreeMap::new();
        for r in &rows {
            let (id, tenant): (String, String) = (r.get(0), r.get(1));
            if !wanted(&id, &tenant) {
                continue;
            }
            let b = StoredBudget::decode(r.get::<_, &[u8]>(2))
                .map_err(|e| StoreError::Io(format!("budget {id:?} does not decode: {e}")))?;
            let head = switchyard_kit::chain::Head::of_proto(b.head.as_ref());
            kept.insert(id, chain::Kept { head, base: None });
        }
        let mut check = chain::Check::new(kept);
        // In pages: the journal may be far larger than memory allows.
        let mut after = 0i64;
        loop {
            let rows = tx
                .query(
                    "SELECT seq, record FROM ledger_journal
                     WHERE seq > $1 AND kind <> 0 AND ($2 = '' OR budget_id = $2)
                     ORDER BY seq LIMIT 10000",
                    &[&after, &only],
                )
                .await
                .map_err(err)?;
            let Some(last) = rows.last() else {
                break;
            };
            after = last.get(0);
            for r in &rows {
                check.record(&record(r.get::<_, &[u8]>(1))?);
            }
        }
        tx.commit().await.map_err(err)?;
        Ok(check.finish())
    }

    /// Feeds every journal record, in sequence order, to `apply`.
    pub(crate) async fn replay(
        &self,
        apply: &mut impl FnMut(&JournalRecord),
    ) -> Result<(), LedgerError> {
        let c = self.db.client().await?;
        let mut after = 0i64;
        loop {
            let rows = c
                .query(
                    "SELECT seq, record FROM ledger_journal WHERE seq > $1 AND kind <> 0
                     ORDER BY seq LIMIT 10000",
                    &[&after],
                )
                .await
                .map_err(|e| self.db.error("replaying the journal", &e))?;
            let Some(last) = rows.last() else {
                return Ok(());
            };
            after = last.get(0);
            for r in &rows {
                apply(&record(&r.get::<_, Vec<u8>>(1))?);
            }
        }
    }

    /// Releases reservations past their TTL, when this replica holds the
    /// sweeper lease (one replica sweeps; any may take over when it stops).
    /// Each expiry is decided under the rows' locks like any write, so a
    /// reservation committed meanwhile is left alone.
    pub(crate) async fn sweep(
        &self,
        holder: &str,
        now: u64,
        period_ms: u64,
    ) -> Result<usize, LedgerError> {
        let ttl = period_ms.saturating_mul(3).max(1_000);
        if self
            .db
            .lease("ledger.sweeper", holder, now, ttl)
            .await?
            .is_none()
        {
            return Ok(0);
        }
        let c = self.db.client().await?;
        let rows = c
            .query(
                "SELECT id FROM ledger_reservations WHERE open AND expires_ms <= $1
                 ORDER BY expires_ms LIMIT 1000",
                &[&switchyard_store::pg::ms(now)],
            )
            .await
            .map_err(|e| self.db.error("finding expired reservations", &e))?;
        drop(c);
        let expiring = rows.iter().map(|r| {
            let id: String = r.get(0);
            self.write(Op::Expire(id), None, holder, now)
        });
        let mut n = 0;
        for done in futures_util::future::join_all(expiring).await {
            if matches!(done?, Done::Expired(true)) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// The journal after sequence `after`, as it commits.
    pub(crate) fn tail(&self, after: u64) -> BoxStream<'static, Result<JournalRecord, StoreError>> {
        switchyard_store::pg::tail(
            self.db.clone(),
            "SELECT seq, CASE WHEN kind = 0 THEN NULL ELSE record END FROM ledger_journal
             WHERE seq > $1 ORDER BY seq LIMIT 1000",
            after,
        )
        .map(|r| r.and_then(|(_, data)| record(&data)))
        .boxed()
    }
}

fn corrupt(what: &str, e: prost::DecodeError) -> TxError {
    TxError::Fatal(StoreError::Io(format!(
        "a stored {what} does not decode: {e}"
    )))
}

/// The budget a stored reservation was made on.
fn reservation_budget(data: &[u8]) -> Result<String, TxError> {
    Ok(StoredRes::decode(data)
        .map_err(|e| corrupt("reservation", e))?
        .budget_id)
}

fn budget_view(data: &[u8]) -> Result<Budget, LedgerError> {
    let stored = StoredBudget::decode(data)
        .map_err(|e| StoreError::Io(format!("a stored budget does not decode: {e}")))?;
    Ok(BudgetState::from(stored).view())
}

fn record(data: &[u8]) -> Result<JournalRecord, StoreError> {
    JournalRecord::decode(data)
        .map_err(|e| StoreError::Io(format!("a journal record does not decode: {e}")))
}

/// A number in [0, 1) for retry jitter.
fn rand_unit() -> f64 {
    let n = uuid::Uuid::new_v4().as_u128() as u64;
    (n >> 11) as f64 / (1u64 << 53) as f64
}

/// The batch's records, numbered from the sequence values it took.
struct Batch {
    seqs: Vec<u64>,
    next: usize,
    records: Vec<JournalRecord>,
}

impl Sink for Batch {
    fn append(&mut self, build: impl FnOnce(u64) -> JournalRecord) -> (u64, JournalRecord) {
        // Two numbers per write are taken, at most two used.
        let seq = self.seqs.get(self.next).copied().unwrap_or_else(|| {
            tracing::error!("a ledger batch ran out of journal numbers");
            u64::MAX - self.next as u64
        });
        self.next += 1;
        let rec = build(seq);
        self.records.push(rec.clone());
        (seq, rec)
    }

    fn charges(&self, books: &Books, seqs: &[u64]) -> Result<Vec<(u64, Charge)>, StoreError> {
        // The transaction loaded the charges of the reservations it locked.
        crate::cold::charges(books, None, seqs)
    }
}

#[derive(Default)]
struct ResRows {
    id: Vec<String>,
    budget: Vec<String>,
    reserve_key: Vec<String>,
    settle_key: Vec<Option<String>>,
    open: Vec<bool>,
    expires: Vec<i64>,
    data: Vec<Vec<u8>>,
    entry: Vec<Option<Vec<u8>>>,
    overrun: Vec<bool>,
}

impl ResRows {
    fn push(&mut self, r: &Res, data: Vec<u8>, charge: Option<&Charge>) {
        self.id.push(r.id.clone());
        self.budget.push(r.budget_id.clone());
        self.reserve_key.push(r.key.clone());
        self.settle_key
            .push((!r.settle_key.is_empty()).then(|| r.settle_key.clone()));
        self.open.push(r.settled == Settled::Open);
        self.expires.push(switchyard_store::pg::ms(r.expires_ms));
        self.data.push(data);
        self.entry.push(charge.map(|c| c.entry.encode_to_vec()));
        self.overrun.push(charge.is_some_and(|c| c.overrun));
    }
}

#[derive(Default)]
struct JournalRows {
    seq: Vec<i64>,
    kind: Vec<i32>,
    budget: Vec<String>,
    job: Vec<String>,
    correlation: Vec<String>,
    record: Vec<Vec<u8>>,
}

impl JournalRows {
    fn push(&mut self, rec: &JournalRecord) {
        let ctx = rec.context.clone().unwrap_or_default();
        self.seq.push(rec.sequence as i64);
        self.kind.push(rec.kind);
        self.budget.push(rec.budget_id.clone());
        self.job.push(ctx.job_id);
        self.correlation.push(ctx.correlation_id);
        self.record.push(rec.encode_to_vec());
    }

    /// A number the batch took and did not use.
    fn void(&mut self, seq: u64) {
        self.seq.push(seq as i64);
        self.kind.push(0);
        self.budget.push(String::new());
        self.job.push(String::new());
        self.correlation.push(String::new());
        self.record.push(Vec::new());
    }
}

/// The batch's statements, in the order [`PgBooks::attempt`] indexes them:
/// lock the reservations named, lock the budgets of their chains, take
/// journal numbers; write budgets, reservations, journal records.
const BATCH_SQL: [&str; 9] = [
    "SELECT data, entry, overrun FROM ledger_reservations
     WHERE id = ANY($1) OR reserve_key = ANY($2) OR settle_key = ANY($3)
     ORDER BY id FOR UPDATE",
    "SELECT data FROM ledger_budgets WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    "SELECT nextval('ledger_journal_seq') FROM generate_series(1, $1::BIGINT)",
    "INSERT INTO ledger_budgets (id, tenant, parent, data)
     SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BYTEA[])
     ON CONFLICT (id) DO UPDATE SET data = EXCLUDED.data",
    "INSERT INTO ledger_reservations
         (id, budget_id, reserve_key, settle_key, open, expires_ms, data, entry, overrun)
     SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BOOL[],
                          $6::BIGINT[], $7::BYTEA[], $8::BYTEA[], $9::BOOL[])
     ON CONFLICT (id) DO UPDATE SET settle_key = EXCLUDED.settle_key,
         open = EXCLUDED.open, data = EXCLUDED.data, entry = EXCLUDED.entry,
         overrun = EXCLUDED.overrun",
    "INSERT INTO ledger_journal (seq, kind, budget_id, job_id, correlation_id, record)
     SELECT * FROM unnest($1::BIGINT[], $2::INT[], $3::TEXT[], $4::TEXT[], $5::TEXT[],
                          $6::BYTEA[])",
    // 6-8: the rate-limit buckets: made if new (waiting for a replica
    // making the same one to commit), locked in key order, written back.
    "INSERT INTO ledger_rate_buckets (key, data)
     SELECT k, ''::BYTEA FROM unnest($1::TEXT[]) AS k ON CONFLICT (key) DO NOTHING",
    "SELECT key, data FROM ledger_rate_buckets WHERE key = ANY($1) ORDER BY key FOR UPDATE",
    "UPDATE ledger_rate_buckets AS b SET data = u.data
     FROM unnest($1::TEXT[], $2::BYTEA[]) AS u(key, data) WHERE b.key = u.key",
];
