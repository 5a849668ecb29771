//! The approval service's storage seam: where runs and the audit log live.
//! The service's logic (the run table, policy, the dispatcher, the sweeper)
//! never asks which backend it runs on; every difference is here:
//!
//! - sled (`SledBook`): runs in flight in memory, ended runs and the audit
//!   log on disk, one process;
//! - PostgreSQL (`pg::PgRuns`): rows every replica shares, each change one
//!   transaction holding the rows of the runs it touches, one replica
//!   electing itself for the work done once for all (sweeping, dispatching).

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use switchyard_core::run::RunStatus as S;
use switchyard_kit::time::timestamp_ms;
use switchyard_proto::approval::v1::{
    AuditRecord, ListAuditRequest, ListAuditResponse, ListRunsRequest, ListRunsResponse, Run,
    StoredPolicy,
};
use switchyard_store::{Log, Store, StoreError};

use crate::runs::{self, RunSet};
use crate::{ApprovalError, State, list_key, listed, pg, status_of};

/// The sled tree of the policy store.
const POLICIES: &str = "policies";

/// Where the runs and the audit log live.
pub(crate) enum Backend {
    /// In this process, on sled.
    Sled(Box<SledBook>),
    /// In PostgreSQL, shared by every replica.
    Pg(Arc<pg::PgRuns>),
}

/// The embedded backend: runs in flight in memory, the audit log and the
/// runs on sled.
pub(crate) struct SledBook {
    pub(crate) state: Mutex<State>,
    pub(crate) audit: Log<AuditRecord>,
    pub(crate) store: Store,
}

impl SledBook {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Backend {
    /// The policy store's files, by name.
    pub(crate) async fn stored_policies(&self) -> Result<Vec<StoredPolicy>, ApprovalError> {
        match self {
            Backend::Pg(pg) => pg.stored_policies().await,
            Backend::Sled(sled) => {
                let tree = sled.store.tree::<StoredPolicy>(POLICIES)?;
                let mut out = Vec::new();
                for kv in tree.iter() {
                    out.push(kv?.1);
                }
                Ok(out)
            }
        }
    }

    /// Stores (or replaces) policy file `p`, durably.
    pub(crate) async fn put_policy(&self, p: &StoredPolicy) -> Result<(), ApprovalError> {
        match self {
            Backend::Pg(pg) => pg.put_policy(p).await,
            Backend::Sled(sled) => {
                sled.store.tree::<StoredPolicy>(POLICIES)?.put(&p.name, p)?;
                Ok(sled.store.sync().await?)
            }
        }
    }

    /// Removes policy file `name`, durably; whether it was there.
    pub(crate) async fn delete_policy(&self, name: &str) -> Result<bool, ApprovalError> {
        match self {
            Backend::Pg(pg) => pg.delete_policy(name).await,
            Backend::Sled(sled) => {
                let was = sled.store.tree::<StoredPolicy>(POLICIES)?.remove(name)?;
                sled.store.sync().await?;
                Ok(was)
            }
        }
    }

    /// Runs `body` against the runs `ids` (and only those) at time `now`,
    /// and answers once what it wrote is durable. On sled, under the books'
    /// lock, waiting for the audit record whose sequence `body` returns; on
    /// PostgreSQL, in one transaction holding those runs' rows, run again
    /// whole if the transaction must be retried.
    pub(crate) async fn mutate<T: Send>(
        &self,
        ids: &[&str],
        now: u64,
        mut body: impl FnMut(&mut State) -> Result<(T, u64), ApprovalError> + Send,
    ) -> Result<T, ApprovalError> {
        match self {
            Backend::Sled(sled) => {
                let (out, seq) = {
                    let mut st = sled.lock();
                    body(&mut st)?
                };
                sled.audit.make_durable(seq).await?;
                Ok(out)
            }
            Backend::Pg(pg) => {
                let ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
                pg.mutate(&ids, now, &mut |st| body(st).map(|(out, _)| out))
                    .await
            }
        }
    }

    /// Keeps `run` as it is now and appends the audit record `make`
    /// numbers about the change; returns its sequence (on PostgreSQL a
    /// place-holder: records are numbered at commit). Every change of a
    /// run goes through here, so a run is never kept without its record:
    /// on sled the record carries the run; on PostgreSQL the run's row is
    /// written in the same transaction.
    pub(crate) fn append_audit(
        &self,
        st: &mut State,
        run: &Run,
        now: u64,
        make: impl FnOnce(u64) -> AuditRecord,
    ) -> Result<u64, ApprovalError> {
        match (self, &mut st.runs) {
            (Backend::Sled(sled), RunSet::Sled(runs)) => {
                let beside = runs::KeptRun {
                    run_id: String::new(),
                    run: Some(run.clone()),
                };
                let mut kept = Ok(());
                let (seq, _) = sled.audit.append_beside(
                    |seq| {
                        kept = runs.keep(run, seq, now);
                        make(seq)
                    },
                    Some(&beside),
                );
                kept?;
                Ok(seq)
            }
            (_, runs) => {
                if let RunSet::Slice(slice) = runs {
                    slice.dirty.insert(run.run_id.clone());
                    slice.runs.insert(run.run_id.clone(), run.clone());
                }
                let seq = st.pending.len() as u64 + 1;
                st.pending.push(make(seq));
                Ok(seq)
            }
        }
    }

    /// Everything audited so far (sled); an answer that rests on a record
    /// may wait for it to be durable. (PostgreSQL answers after commit.)
    pub(crate) fn audited_so_far(&self) -> u64 {
        match self {
            Backend::Sled(sled) => sled.audit.last(),
            Backend::Pg(_) => 0,
        }
    }

    /// Whether this member does the work named `lease` for all, for
    /// `ttl_ms` (always, on one node).
    pub(crate) async fn elected(
        &self,
        lease: &str,
        now: u64,
        ttl_ms: u64,
    ) -> Result<bool, ApprovalError> {
        match self {
            Backend::Sled(_) => Ok(true),
            Backend::Pg(pg) => Ok(pg
                .db()
                .lease(lease, pg.replica_id(), now, ttl_ms)
                .await?
                .is_some()),
        }
    }

    /// The runs not yet ended.
    pub(crate) async fn in_flight(&self) -> Result<Vec<Run>, ApprovalError> {
        match self {
            Backend::Pg(pg) => pg.in_flight().await,
            Backend::Sled(sled) => Ok(sled
                .lock()
                .runs
                .sled()
                .map(|r| r.live().cloned().collect())
                .unwrap_or_default()),
        }
    }

    /// Running runs whose claim expired by `now`, with their workers.
    pub(crate) async fn expired_claims(
        &self,
        now: u64,
    ) -> Result<Vec<(String, String)>, ApprovalError> {
        match self {
            Backend::Pg(pg) => pg.expired_claims(now).await,
            Backend::Sled(sled) => Ok(sled
                .lock()
                .runs
                .sled()
                .map(|runs| {
                    runs.live()
                        .filter(|r| {
                            status_of(r) == S::Running
                                && r.claim_expires_at.as_ref().map_or(0, timestamp_ms) <= now
                        })
                        .map(|r| (r.run_id.clone(), r.claimed_by.clone()))
                        .collect()
                })
                .unwrap_or_default()),
        }
    }

    /// One run.
    pub(crate) async fn get(&self, run_id: &str) -> Result<Option<Run>, ApprovalError> {
        match self {
            Backend::Pg(pg) => pg.get(run_id).await,
            Backend::Sled(sled) => Ok(sled.lock().runs.get(run_id).map(Cow::into_owned)),
        }
    }

    /// `f` of run `run_id` without copying it where it is in memory
    /// (`None`: not found); else of the run read.
    pub(crate) async fn with_run<R>(
        &self,
        run_id: &str,
        f: impl FnOnce(&Run) -> R,
    ) -> Result<Option<R>, ApprovalError> {
        match self {
            Backend::Sled(sled) => Ok(sled.lock().runs.get(run_id).map(|r| f(&r))),
            Backend::Pg(pg) => Ok(pg.get(run_id).await?.map(|r| f(&r))),
        }
    }

    /// ListRuns: filtered (`statuses` parsed), proposed first, then by
    /// creation time, `size` a page.
    pub(crate) async fn list(
        &self,
        req: &ListRunsRequest,
        statuses: &[S],
        size: usize,
    ) -> Result<ListRunsResponse, ApprovalError> {
        let sled = match self {
            Backend::Pg(pg) => return pg.list(req, statuses, size).await,
            Backend::Sled(sled) => sled,
        };
        let st = sled.lock();
        let Some(all) = st.runs.sled() else {
            return Ok(ListRunsResponse::default());
        };
        // Ended runs are read from disk only when the filter asks for them.
        let in_flight_only = !statuses.is_empty() && statuses.iter().all(|s| !runs::ended(*s));
        let candidates: Box<dyn Iterator<Item = Cow<'_, Run>>> = if in_flight_only {
            Box::new(all.live().map(Cow::Borrowed))
        } else {
            Box::new(all.all())
        };
        let mut runs: Vec<(String, Cow<'_, Run>)> = candidates
            .filter(|r| listed(req, statuses, r))
            .map(|r| (list_key(&r), r))
            .filter(|(k, _)| req.page_token.is_empty() || *k > req.page_token)
            .collect();
        runs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let next_page_token = if runs.len() > size {
            runs.truncate(size);
            runs.last().map(|(k, _)| k.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(ListRunsResponse {
            runs: runs.into_iter().map(|(_, r)| r.into_owned()).collect(),
            next_page_token,
        })
    }

    /// The durable audit log, of one run or all, after a sequence.
    pub(crate) async fn list_audit(
        &self,
        req: &ListAuditRequest,
        size: usize,
    ) -> Result<ListAuditResponse, ApprovalError> {
        let sled = match self {
            Backend::Pg(pg) => return pg.list_audit(req, size).await,
            Backend::Sled(sled) => sled,
        };
        let durable = sled.audit.durable();
        let log = &sled.audit;
        let records = if req.run_id.is_empty() {
            log.read(req.after_sequence, durable, size)?
        } else {
            let seqs: Vec<u64> = {
                let st = sled.lock();
                let Some(seqs) = st.runs.sled().and_then(|r| r.positions(&req.run_id)) else {
                    return Err(ApprovalError::RunNotFound(req.run_id.clone()));
                };
                seqs.iter()
                    .copied()
                    .filter(|s| *s > req.after_sequence && *s <= durable)
                    .take(size)
                    .collect()
            };
            log.read_each(&seqs)?
        };
        Ok(ListAuditResponse {
            records: records.into_iter().map(|(_, r)| r).collect(),
        })
    }

    /// Runs (one, or all when `run_id` is empty) with their audit records
    /// in the log's order, consistent with each other: every record of a
    /// run as it is kept, and nothing it does not vouch for yet.
    pub(crate) async fn audit_snapshot(
        &self,
        run_id: &str,
    ) -> Result<Vec<(Run, Vec<AuditRecord>)>, ApprovalError> {
        let sled = match self {
            Backend::Pg(pg) => return pg.audit_snapshot(run_id).await,
            Backend::Sled(sled) => sled,
        };
        // The ids first, then each run with its positions under the lock
        // for that run alone: consistent per run, and approvals are not held
        // up while thousands of runs are read.
        let ids: Vec<String> = if run_id.is_empty() {
            let Some((live, ended)) = sled.lock().runs.sled().map(|r| r.ids()) else {
                return Ok(Vec::new());
            };
            let mut ids: std::collections::BTreeSet<String> = live.into_iter().collect();
            for kv in ended.iter() {
                ids.insert(kv?.0);
            }
            ids.into_iter().collect()
        } else {
            vec![run_id.to_owned()]
        };
        let mut runs: Vec<(Run, Vec<u64>)> = Vec::with_capacity(ids.len());
        for id in ids {
            let st = sled.lock();
            let Some(kept) = st.runs.sled() else {
                return Ok(Vec::new());
            };
            if let Some(run) = kept.get(&id) {
                let positions = kept.positions(&id).unwrap_or_default();
                runs.push((run.into_owned(), positions));
            }
        }
        // What the snapshot's runs vouch for is durable before it is read.
        let last = runs
            .iter()
            .filter_map(|(_, p)| p.iter().max())
            .max()
            .copied()
            .unwrap_or(0);
        sled.audit.make_durable(last).await?;
        let mut out = Vec::with_capacity(runs.len());
        for (run, positions) in runs {
            let recs = sled.audit.read_each(&positions)?;
            out.push((run, recs.into_iter().map(|(_, r)| r).collect()));
        }
        Ok(out)
    }

    /// The durable audit records after `after`, then each new one.
    pub(crate) fn tail(&self, after: u64) -> BoxStream<'static, Result<AuditRecord, StoreError>> {
        match self {
            Backend::Pg(pg) => pg.tail(after),
            Backend::Sled(sled) => sled
                .audit
                .tail(after)
                .map(|r| r.map(|(_, rec)| rec))
                .boxed(),
        }
    }

    /// Removes the runs that ended before `cutoff_ms`, with their audit
    /// records; returns how many runs and records went.
    pub(crate) async fn prune(&self, cutoff_ms: u64) -> Result<(usize, u64), ApprovalError> {
        match self {
            Backend::Pg(pg) => pg.prune(cutoff_ms).await,
            Backend::Sled(sled) => {
                let pruned = {
                    let mut st = sled.lock();
                    match st.runs.sled_mut() {
                        Some(runs) => runs.prune(cutoff_ms, &sled.audit)?,
                        None => (0, 0),
                    }
                };
                sled.store.sync().await?;
                Ok(pruned)
            }
        }
    }

    /// Notes where the next start-up replays from (sled; PostgreSQL
    /// replays nothing).
    pub(crate) fn checkpoint(&self) -> Result<(), ApprovalError> {
        if let Backend::Sled(sled) = self {
            // Never past what is on disk (numbers after it could be handed
            // out again after a crash).
            let durable = sled.audit.durable();
            if let Some(runs) = sled.lock().runs.sled() {
                runs.checkpoint(durable)?;
            }
        }
        Ok(())
    }

    /// Flushes to disk (shutdown), with a fresh replay checkpoint.
    pub(crate) fn flush(&self) -> Result<(), ApprovalError> {
        let Backend::Sled(sled) = self else {
            return Ok(());
        };
        // Everything written goes to disk, then the checkpoint moves up to it.
        sled.store.flush_blocking()?;
        if let Some(runs) = sled.lock().runs.sled() {
            runs.checkpoint(sled.audit.last())?;
        }
        sled.store.flush_blocking()?;
        Ok(())
    }

    /// When each run waiting for a person was proposed, where this member
    /// holds them all in memory (`None` on PostgreSQL: the gauges come from
    /// whichever replica serves the scrape, and no replica holds them all).
    pub(crate) fn proposed_at(&self, now: u64) -> Option<Vec<u64>> {
        let Backend::Sled(sled) = self else {
            return None;
        };
        let st = sled.lock();
        let runs = st.runs.sled()?;
        Some(
            runs.live()
                .filter(|r| status_of(r) == S::Proposed)
                .map(|r| r.created_at.as_ref().map_or(now, timestamp_ms))
                .collect(),
        )
    }
}
