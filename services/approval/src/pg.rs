//! The approval service on PostgreSQL, for any number of replicas on one
//! database.
//!
//! Runs, the audit log and artifact content are tables. Every change to a
//! run is one transaction that locks the rows of the runs it names
//! (`SELECT … FOR UPDATE`, in id order), runs the same code as on sled
//! against them — so every status change still goes through the one
//! transition table — and writes back the changed runs and their audit
//! records before it commits. Two replicas approving and cancelling one
//! run at once take turns on its row: the second decides against what the
//! first committed, and gets the table's reason. Claims are fenced the same
//! way: a worker whose lease lapsed, and whose run another worker then
//! claimed, finds the claim no longer its own.
//!
//! Audit records are numbered from a sequence when their transaction
//! commits; `Watch` tails the table from any replica
//! ([`switchyard_store::pg::tail`]). Expired claims are swept, and approved
//! runs handed to their adapters, by whichever replica holds the
//! `approval.sweeper` and `approval.dispatcher` lease rows.

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use prost::Message;
use std::collections::HashMap;
use switchyard_core::run::RunStatus as S;
use switchyard_proto::approval::v1::{
    AuditRecord, ListAuditRequest, ListAuditResponse, ListRunsRequest, ListRunsResponse, Run,
    RunStatus, StoredPolicy,
};
use switchyard_store::StoreError;
use switchyard_store::pg::{Migration, Pg, TxError, ms};

use crate::runs::{RunSet, Slice, ended};
use crate::{ApprovalError, State, list_key, listed, status_of};

/// The schema, in order. Never edit a released migration: add one.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "runs, the audit log and artifact content",
        sql: "
        CREATE TABLE approval_runs (
            id TEXT PRIMARY KEY,
            status INT NOT NULL,
            list_key TEXT NOT NULL,
            created_by TEXT NOT NULL,
            claim_expires_ms BIGINT NOT NULL,
            ended_ms BIGINT,
            data BYTEA NOT NULL);
        CREATE INDEX approval_runs_by_list_key ON approval_runs (list_key);
        CREATE INDEX approval_runs_claims ON approval_runs (claim_expires_ms) WHERE status = 4;
        CREATE INDEX approval_runs_in_flight ON approval_runs (status) WHERE status IN (2, 4);
        CREATE INDEX approval_runs_ended ON approval_runs (ended_ms) WHERE ended_ms IS NOT NULL;
        CREATE SEQUENCE approval_audit_seq;
        CREATE TABLE approval_audit (
            seq BIGINT PRIMARY KEY,
            run_id TEXT NOT NULL,
            record BYTEA NOT NULL);
        CREATE INDEX approval_audit_by_run ON approval_audit (run_id, seq);
        CREATE TABLE approval_blobs (
            address TEXT PRIMARY KEY,
            data BYTEA NOT NULL);
    ",
    },
    Migration {
        version: 2,
        name: "the policy store",
        sql: "
            CREATE TABLE approval_policies (
                name TEXT PRIMARY KEY,
                data BYTEA NOT NULL);
        ",
    },
    Migration {
        version: 3,
        name: "the signing key every replica shares",
        sql: "
            CREATE TABLE approval_keys (
                name TEXT PRIMARY KEY,
                seed BYTEA NOT NULL);
        ",
    },
];

// The SQL above names statuses by number.
const _: () = assert!(RunStatus::Approved as i32 == 2 && RunStatus::Running as i32 == 4);

/// How often a transaction that must be retried runs again.
const ATTEMPTS: usize = 8;

/// The runs in PostgreSQL.
pub(crate) struct PgRuns {
    db: Pg,
    /// Names this replica in lease rows.
    replica: String,
}

impl PgRuns {
    /// Migrates the schema.
    pub(crate) async fn open(db: Pg) -> Result<std::sync::Arc<Self>, ApprovalError> {
        crate::Approval::migrate(&db).await?;
        Ok(std::sync::Arc::new(PgRuns {
            db,
            replica: format!("approval-{}", uuid::Uuid::new_v4().simple()),
        }))
    }

    pub(crate) fn db(&self) -> &Pg {
        &self.db
    }

    pub(crate) fn replica_id(&self) -> &str {
        &self.replica
    }

    /// Runs `body` in a transaction holding the rows of runs `ids`; writes
    /// back what it changed and audited, at time `now`. Run again whole
    /// when the transaction must be retried; a refusal from `body` rolls
    /// back and is returned.
    pub(crate) async fn mutate<T>(
        &self,
        ids: &[String],
        now: u64,
        body: &mut (dyn FnMut(&mut State) -> Result<T, ApprovalError> + Send),
    ) -> Result<T, ApprovalError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.attempt(ids, now, body).await {
                Err(Attempt::Tx(TxError::Retry(e))) if attempt < ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "approval transaction runs again");
                }
                Err(Attempt::Tx(TxError::Retry(e) | TxError::Fatal(e))) => return Err(e.into()),
                Err(Attempt::Refused(e)) => return Err(e),
                Ok(out) => return Ok(out),
            }
        }
    }

    async fn attempt<T>(
        &self,
        ids: &[String],
        now: u64,
        body: &mut (dyn FnMut(&mut State) -> Result<T, ApprovalError> + Send),
    ) -> Result<T, Attempt> {
        let db = &self.db;
        let fail = |doing: &'static str| {
            move |e: tokio_postgres::Error| Attempt::Tx(db.tx_error(doing, &e))
        };
        let mut client = db
            .client()
            .await
            .map_err(|e| Attempt::Tx(TxError::Fatal(e)))?;
        let tx = client
            .transaction()
            .await
            .map_err(fail("starting a transaction"))?;
        let mut ids: Vec<&str> = ids
            .iter()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let lock = tx
            .prepare_cached(
                "SELECT data FROM approval_runs WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            )
            .await
            .map_err(fail("preparing a statement"))?;
        let rows = tx
            .query(&lock, &[&ids])
            .await
            .map_err(fail("locking runs"))?;
        let mut slice = Slice::default();
        for row in rows {
            let run = decode_run(&row.get::<_, Vec<u8>>(0))
                .map_err(|e| Attempt::Tx(TxError::Fatal(e)))?;
            slice.runs.insert(run.run_id.clone(), run);
        }
        let mut st = State {
            runs: RunSet::Slice(slice),
            pending: Vec::new(),
        };
        let out = body(&mut st).map_err(Attempt::Refused)?;
        let RunSet::Slice(slice) = st.runs else {
            return Err(Attempt::Tx(TxError::Fatal(StoreError::Io(
                "internal error: not a slice".into(),
            ))));
        };
        let mut w = RunRows::default();
        for id in &slice.dirty {
            if let Some(run) = slice.runs.get(id) {
                w.push(run, now);
            }
        }
        // Records go in without their number: the sequence numbers them
        // in the statement that stores them (in order), and readers take
        // the number from the `seq` column.
        let mut a_rec = Vec::with_capacity(st.pending.len());
        for rec in &mut st.pending {
            // The body numbered them within the batch only.
            rec.sequence = 0;
            a_rec.push(rec.encode_to_vec());
        }
        let a_run: Vec<&str> = st.pending.iter().map(|r| r.run_id.as_str()).collect();
        type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
        let params: [Param<'_>; 9] = [
            &w.id,
            &w.status,
            &w.list_key,
            &w.created_by,
            &w.claim_expires,
            &w.ended,
            &w.data,
            &a_run,
            &a_rec,
        ];
        // One statement stores the changed runs and their audit records.
        tx.execute(
            &tx.prepare_cached(WRITE)
                .await
                .map_err(fail("preparing a statement"))?,
            &params,
        )
        .await
        .map_err(fail("writing runs"))?;
        tx.commit().await.map_err(fail("committing"))?;
        Ok(out)
    }

    /// The seed of signing key `name`: the one stored, else `seed`, stored
    /// now (of replicas starting together, the first to store wins and
    /// every one reads its seed back).
    pub(crate) async fn key_seed(&self, name: &str, seed: &[u8]) -> Result<Vec<u8>, ApprovalError> {
        let c = self.db.client().await?;
        let err = |e: tokio_postgres::Error| self.db.error("keeping the signing key", &e);
        c.execute(
            "INSERT INTO approval_keys (name, seed) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            &[&name, &seed],
        )
        .await
        .map_err(err)?;
        let row = c
            .query_one("SELECT seed FROM approval_keys WHERE name = $1", &[&name])
            .await
            .map_err(err)?;
        Ok(row.get(0))
    }

    /// The policy store's files, by name.
    pub(crate) async fn stored_policies(&self) -> Result<Vec<StoredPolicy>, ApprovalError> {
        let c = self.db.client().await?;
        let rows = c
            .query("SELECT data FROM approval_policies ORDER BY name", &[])
            .await
            .map_err(|e| self.db.error("reading the policy store", &e))?;
        rows.iter()
            .map(|r| Ok(decoded("policy", &r.get::<_, Vec<u8>>(0))?))
            .collect()
    }

    /// Stores (or replaces) `p`.
    pub(crate) async fn put_policy(&self, p: &StoredPolicy) -> Result<(), ApprovalError> {
        let c = self.db.client().await?;
        c.execute(
            "INSERT INTO approval_policies (name, data) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET data = EXCLUDED.data",
            &[&p.name, &p.encode_to_vec()],
        )
        .await
        .map_err(|e| self.db.error("storing a policy", &e))?;
        Ok(())
    }

    /// Removes policy file `name`; whether it was there.
    pub(crate) async fn delete_policy(&self, name: &str) -> Result<bool, ApprovalError> {
        let c = self.db.client().await?;
        let n = c
            .execute("DELETE FROM approval_policies WHERE name = $1", &[&name])
            .await
            .map_err(|e| self.db.error("removing a policy", &e))?;
        Ok(n > 0)
    }

    /// One run.
    pub(crate) async fn get(&self, id: &str) -> Result<Option<Run>, ApprovalError> {
        let c = self.db.client().await?;
        let row = c
            .query_opt("SELECT data FROM approval_runs WHERE id = $1", &[&id])
            .await
            .map_err(|e| self.db.error("reading a run", &e))?;
        Ok(row
            .map(|r| decode_run(&r.get::<_, Vec<u8>>(0)))
            .transpose()?)
    }

    /// A page of runs: the filter's, proposed first, then by creation time.
    pub(crate) async fn list(
        &self,
        req: &ListRunsRequest,
        statuses: &[S],
        size: usize,
    ) -> Result<ListRunsResponse, ApprovalError> {
        let c = self.db.client().await?;
        let wanted: Vec<i32> = statuses
            .iter()
            .map(|s| crate::to_proto(*s) as i32)
            .collect();
        let mut after = req.page_token.clone();
        let mut runs = Vec::new();
        // Target filters are applied here, a page of rows at a time.
        'pages: loop {
            let rows = c
                .query(
                    "SELECT list_key, data FROM approval_runs
                     WHERE list_key > $1 AND (cardinality($2::INT[]) = 0 OR status = ANY($2))
                       AND ($3 = '' OR created_by = $3)
                     ORDER BY list_key LIMIT 500",
                    &[&after, &wanted, &req.created_by],
                )
                .await
                .map_err(|e| self.db.error("listing runs", &e))?;
            let Some(last) = rows.last() else { break };
            after = last.get(0);
            for r in &rows {
                let run = decode_run(&r.get::<_, Vec<u8>>(1))?;
                if listed(req, statuses, &run) {
                    runs.push(run);
                    if runs.len() > size {
                        break 'pages;
                    }
                }
            }
        }
        let next_page_token = if runs.len() > size {
            runs.truncate(size);
            runs.last().map(list_key).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(ListRunsResponse {
            runs,
            next_page_token,
        })
    }

    /// Audit records after a sequence, of one run or all.
    pub(crate) async fn list_audit(
        &self,
        req: &ListAuditRequest,
        size: usize,
    ) -> Result<ListAuditResponse, ApprovalError> {
        if !req.run_id.is_empty() && self.get(&req.run_id).await?.is_none() {
            return Err(ApprovalError::RunNotFound(req.run_id.clone()));
        }
        let c = self.db.client().await?;
        let rows = c
            .query(
                "SELECT seq, record FROM approval_audit WHERE seq > $1 AND ($2 = '' OR run_id = $2)
                 ORDER BY seq LIMIT $3",
                &[&ms(req.after_sequence), &req.run_id, &(size as i64)],
            )
            .await
            .map_err(|e| self.db.error("listing the audit log", &e))?;
        let records = rows
            .iter()
            .map(|r| {
                let seq = u64::try_from(r.get::<_, i64>(0)).unwrap_or_default();
                decode_audit(seq, &r.get::<_, Vec<u8>>(1))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ListAuditResponse { records })
    }

    /// Runs (one, or all when `run_id` is empty) with their audit records
    /// in order, from one snapshot of the database: a record committed
    /// meanwhile is in both or neither.
    pub(crate) async fn audit_snapshot(
        &self,
        run_id: &str,
    ) -> Result<Vec<(Run, Vec<AuditRecord>)>, ApprovalError> {
        let err =
            |e: tokio_postgres::Error| self.db.error("reading the audit log to verify it", &e);
        let mut c = self.db.client().await?;
        let tx = self.db.snapshot(&mut c).await.map_err(err)?;
        let runs = tx
            .query(
                "SELECT data FROM approval_runs WHERE $1 = '' OR id = $1 ORDER BY id",
                &[&run_id],
            )
            .await
            .map_err(err)?;
        let rows = tx
            .query(
                "SELECT seq, record FROM approval_audit WHERE $1 = '' OR run_id = $1 ORDER BY seq",
                &[&run_id],
            )
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        let mut by_run: HashMap<String, Vec<AuditRecord>> = HashMap::new();
        for r in &rows {
            let seq = u64::try_from(r.get::<_, i64>(0)).unwrap_or_default();
            let rec = decode_audit(seq, &r.get::<_, Vec<u8>>(1))?;
            by_run.entry(rec.run_id.clone()).or_default().push(rec);
        }
        runs.iter()
            .map(|r| {
                let run = decode_run(&r.get::<_, Vec<u8>>(0))?;
                let recs = by_run.remove(&run.run_id).unwrap_or_default();
                Ok((run, recs))
            })
            .collect()
    }

    /// The audit log after `after`, as it commits.
    pub(crate) fn tail(&self, after: u64) -> BoxStream<'static, Result<AuditRecord, StoreError>> {
        switchyard_store::pg::tail(
            self.db.clone(),
            "SELECT seq, record FROM approval_audit WHERE seq > $1 ORDER BY seq LIMIT 1000",
            after,
        )
        .map(|r| r.and_then(|(seq, data)| decode_audit(seq, &data)))
        .boxed()
    }

    /// Running runs whose claim lapsed by `now`: (run, worker).
    pub(crate) async fn expired_claims(
        &self,
        now: u64,
    ) -> Result<Vec<(String, String)>, ApprovalError> {
        let c = self.db.client().await?;
        let rows = c
            .query(
                "SELECT data FROM approval_runs WHERE status = 4 AND claim_expires_ms <= $1
                 ORDER BY claim_expires_ms LIMIT 1000",
                &[&ms(now)],
            )
            .await
            .map_err(|e| self.db.error("finding expired claims", &e))?;
        rows.iter()
            .map(|r| {
                let run = decode_run(&r.get::<_, Vec<u8>>(0))?;
                Ok((run.run_id, run.claimed_by))
            })
            .collect()
    }

    /// Approved and running runs.
    pub(crate) async fn in_flight(&self) -> Result<Vec<Run>, ApprovalError> {
        let c = self.db.client().await?;
        let rows = c
            .query("SELECT data FROM approval_runs WHERE status IN (2, 4)", &[])
            .await
            .map_err(|e| self.db.error("listing runs in flight", &e))?;
        Ok(rows
            .iter()
            .map(|r| decode_run(&r.get::<_, Vec<u8>>(0)))
            .collect::<Result<_, _>>()?)
    }

    /// Removes the runs that ended before `cutoff_ms`, with their audit
    /// records; returns how many of each went.
    pub(crate) async fn prune(&self, cutoff_ms: u64) -> Result<(usize, u64), ApprovalError> {
        let mut c = self.db.client().await?;
        let tx = c
            .transaction()
            .await
            .map_err(|e| self.db.error("pruning runs", &e))?;
        let gone: Vec<String> = tx
            .query(
                "DELETE FROM approval_runs WHERE ended_ms < $1 RETURNING id",
                &[&ms(cutoff_ms)],
            )
            .await
            .map_err(|e| self.db.error("pruning runs", &e))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let records = tx
            .execute(
                "DELETE FROM approval_audit WHERE run_id = ANY($1)",
                &[&gone],
            )
            .await
            .map_err(|e| self.db.error("pruning the audit log", &e))?;
        tx.commit()
            .await
            .map_err(|e| self.db.error("pruning runs", &e))?;
        Ok((gone.len(), records))
    }
}

/// How a transaction failed.
enum Attempt {
    /// In the database.
    Tx(TxError),
    /// The change itself was refused (nothing written).
    Refused(ApprovalError),
}

/// A stored `what` (a run, an audit record, a policy file) read back.
fn decoded<T: Message + Default>(what: &str, data: &[u8]) -> Result<T, StoreError> {
    T::decode(data).map_err(|e| StoreError::Io(format!("a stored {what} does not decode: {e}")))
}

fn decode_run(data: &[u8]) -> Result<Run, StoreError> {
    decoded("run", data)
}

/// Audit record number `seq` (the `seq` column: records are stored
/// without their number; older ones carry the same number inside).
fn decode_audit(seq: u64, data: &[u8]) -> Result<AuditRecord, StoreError> {
    let mut rec: AuditRecord = decoded("audit record", data)?;
    rec.sequence = seq;
    Ok(rec)
}

/// Stores changed runs ($1..$7, as columns) and numbers and stores their
/// audit records ($8 run ids, $9 records) in order. `nextval` in the
/// select list runs after the `ORDER BY`, so numbers follow the records'
/// order.
const WRITE: &str = "WITH runs AS (
    INSERT INTO approval_runs (id, status, list_key, created_by, claim_expires_ms, ended_ms, data)
    SELECT * FROM unnest($1::TEXT[], $2::INT[], $3::TEXT[], $4::TEXT[],
                         $5::BIGINT[], $6::BIGINT[], $7::BYTEA[])
    ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status,
        list_key = EXCLUDED.list_key, claim_expires_ms = EXCLUDED.claim_expires_ms,
        ended_ms = EXCLUDED.ended_ms, data = EXCLUDED.data)
INSERT INTO approval_audit (seq, run_id, record)
SELECT nextval('approval_audit_seq'), a.run_id, a.record
FROM unnest($8::TEXT[], $9::BYTEA[]) WITH ORDINALITY AS a(run_id, record, n)
ORDER BY a.n";

/// Changed runs, as columns.
#[derive(Default)]
struct RunRows {
    id: Vec<String>,
    status: Vec<i32>,
    list_key: Vec<String>,
    created_by: Vec<String>,
    claim_expires: Vec<i64>,
    ended: Vec<Option<i64>>,
    data: Vec<Vec<u8>>,
}

impl RunRows {
    fn push(&mut self, run: &Run, now: u64) {
        let status = status_of(run);
        self.id.push(run.run_id.clone());
        self.status.push(run.status);
        self.list_key.push(list_key(run));
        self.created_by.push(run.created_by.clone());
        self.claim_expires.push(
            run.claim_expires_at
                .as_ref()
                .map_or(0, |t| ms(switchyard_kit::time::timestamp_ms(t))),
        );
        self.ended.push(ended(status).then(|| ms(now)));
        self.data.push(run.encode_to_vec());
    }
}
