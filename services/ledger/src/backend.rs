//! The ledger's storage seam: where the books and the journal live. The
//! decisions are one core (`desk.rs`) over either backend; every other
//! difference is here, so the service never asks which backend it runs on:
//!
//! - sled (`Sled`): the books in memory, the journal and the retired part
//!   (`cold.rs`) on disk, one process;
//! - PostgreSQL (`pg::PgBooks`): rows every replica shares, each write one
//!   transaction deciding on the rows it locks, one replica sweeping.

use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use switchyard_proto::ledger::v1::*;
use switchyard_store::{Log, Store, StoreError};

use crate::books::Books;
use crate::cold::Cold;
use crate::desk::{Desk, Done, LogSink, Op};
use crate::rates::{self, Bucket, RateWork, RatesConfig, Table};
use crate::{LedgerError, Selected, page_of_budgets, pg, snapshot};
use crate::{chain, cold, desk};

/// Where the books and the journal live.
pub(crate) enum Backend {
    /// In this process, journaled to sled.
    Sled(Box<Sled>),
    /// In PostgreSQL, shared by every replica.
    Pg(Arc<pg::PgBooks>),
}

/// The embedded backend: the books in memory, the journal and the retired
/// part on sled.
pub(crate) struct Sled {
    pub(crate) books: Mutex<Books>,
    /// The rate-limit buckets (locked after the books), stored in the
    /// `rate_buckets` tree at each snapshot: a crash forgets at most a
    /// snapshot interval of grants.
    pub(crate) rates: Mutex<Table>,
    pub(crate) journal: Log<JournalRecord>,
    /// Retired budgets and the books' snapshot.
    pub(crate) cold: Cold,
    /// When retention last pruned, ms.
    pub(crate) pruned_at: std::sync::atomic::AtomicU64,
    pub(crate) store: Store,
}

impl Backend {
    /// Decides and records one write (ids minted with `prefix`, at `now`);
    /// answers once it is durable.
    /// With `work`, the write's rate-limit part is decided in the same
    /// atomic step (`rates::decide`).
    pub(crate) async fn write(
        &self,
        op: Op,
        work: Option<RateWork>,
        cfg: &RatesConfig,
        prefix: &str,
        now: u64,
    ) -> Result<Done, LedgerError> {
        match self {
            Backend::Pg(pg) => pg.write(op, work, prefix, now).await,
            Backend::Sled(sled) => {
                let (done, seq) = {
                    let mut books = sled.lock();
                    let mut sink = LogSink::new(&sled.journal);
                    let mut desk = Desk {
                        books: &mut books,
                        cold: Some(&sled.cold),
                        sink: &mut sink,
                        prefix,
                        now,
                    };
                    let done = match &work {
                        None => desk.decide(op),
                        Some(w) => {
                            let mut table = sled.rates.lock().unwrap_or_else(|p| p.into_inner());
                            rates::decide(&mut desk, &mut table, cfg, op, Some(w))
                        }
                    };
                    (done, sink.durable_point())
                };
                sled.journal.make_durable(seq).await?;
                done
            }
        }
    }

    /// The rate-limit buckets as this process last saw them (for metrics,
    /// read without waiting: sled's are all of them, a PostgreSQL
    /// replica's those its writes touched).
    pub(crate) fn last_buckets(&self) -> Vec<(String, Bucket)> {
        match self {
            Backend::Pg(pg) => pg.last_buckets(),
            Backend::Sled(sled) => sled.buckets(),
        }
    }

    /// Every rate-limit bucket, as stored now.
    pub(crate) async fn buckets(&self) -> Result<Vec<(String, Bucket)>, LedgerError> {
        match self {
            Backend::Pg(pg) => pg.buckets().await,
            Backend::Sled(sled) => Ok(sled.buckets()),
        }
    }

    /// Releases every reservation past its TTL at `now`; returns how many.
    /// Among replicas, only the holder of the sweeper lease sweeps (for
    /// `period_ms`).
    pub(crate) async fn sweep(
        &self,
        prefix: &str,
        now: u64,
        period_ms: u64,
    ) -> Result<usize, LedgerError> {
        let sled = match self {
            Backend::Pg(pg) => return pg.sweep(prefix, now, period_ms).await,
            Backend::Sled(sled) => sled,
        };
        let (n, last) = {
            let mut books = sled.lock();
            let due: Vec<String> = books
                .expiry
                .iter()
                .take_while(|(at, _)| *at <= now)
                .map(|(_, id)| id.clone())
                .collect();
            let mut sink = LogSink::new(&sled.journal);
            let mut desk = Desk {
                books: &mut books,
                cold: Some(&sled.cold),
                sink: &mut sink,
                prefix,
                now,
            };
            for id in &due {
                desk.decide(Op::Expire(id.clone()))?;
            }
            (due.len(), sink.durable_point())
        };
        if n > 0 {
            sled.journal.make_durable(last).await?;
        }
        Ok(n)
    }

    /// Retires closed budgets that hold nothing, snapshots the books (once
    /// the journal is durable up to the snapshot), and prunes what is past
    /// `retention_ms`: retired budgets, and journal records before the
    /// snapshot that no budget in memory still reads.
    pub(crate) async fn maintain(&self, now: u64, retention_ms: u64) -> Result<(), LedgerError> {
        let Backend::Sled(sled) = self else {
            // Nothing to retire or snapshot: PostgreSQL keeps the books.
            return Ok(());
        };
        let journal = &sled.journal;
        journal.make_durable(journal.last()).await?;
        // Closed budgets that hold nothing: copied under the lock, written
        // without it, dropped from the books under it.
        let plan = sled.cold.plan(&sled.lock(), now);
        sled.cold.write(&plan)?;
        let (snap, keep_from) = {
            let mut books = sled.lock();
            let retired = sled.cold.forget(&mut books, plan);
            if retired > 0 {
                tracing::debug!(retired, "closed budgets left memory");
            }
            // Entries of budgets in memory are read back from the journal.
            let first_entry = books.entries.keys().next().copied();
            (
                snapshot(&books, journal.last()),
                first_entry.unwrap_or(u64::MAX),
            )
        };
        journal.make_durable(snap.at).await?;
        sled.cold.save(&snap)?;
        save_buckets(sled)?;
        // Pruning reads every retired budget: at most once a minute (or once
        // per window, for windows shorter than that).
        let every = retention_ms.min(60_000);
        let last = sled.pruned_at.load(std::sync::atomic::Ordering::Relaxed);
        if retention_ms > 0 && now.saturating_sub(last) >= every {
            sled.pruned_at
                .store(now, std::sync::atomic::Ordering::Relaxed);
            let cutoff = now.saturating_sub(retention_ms);
            let pruned = sled.cold.prune(cutoff)?;
            // Records before the snapshot, not read back, and older than
            // the retention window go. Each budget whose first records go
            // keeps the head at its last one (its base), durably before
            // they go: the rest continue from it.
            let mut before = keep_from.min(snap.at + 1);
            let mut bases = std::collections::BTreeMap::new();
            for r in journal.replay() {
                let (seq, rec) = r?;
                if seq >= before
                    || rec
                        .time
                        .as_ref()
                        .map_or(0, switchyard_kit::time::timestamp_ms)
                        >= cutoff
                {
                    before = before.min(seq);
                    break;
                }
                if let Some(head) = chain::head_after(&rec) {
                    bases.insert(rec.budget_id, head);
                }
            }
            if !bases.is_empty() {
                sled.cold.keep_bases(&bases)?;
                sled.store.sync().await?;
            }
            let records = journal.prune_before(before)?;
            if pruned > 0 || records > 0 {
                tracing::info!(
                    budgets = pruned,
                    records,
                    "pruned the ledger past its retention"
                );
            }
        }
        sled.store.sync().await?;
        Ok(())
    }

    /// Checks the journal's chains (budget `only`, or all) against the
    /// heads the budgets `wanted` (by id and tenant) keep, retired ones
    /// included.
    pub(crate) async fn check_chains(
        &self,
        only: &str,
        wanted: impl Fn(&str, &str) -> bool,
    ) -> Result<VerifyJournalResponse, LedgerError> {
        let sled = match self {
            Backend::Pg(pg) => return pg.check_chains(only, wanted).await,
            Backend::Sled(sled) => sled,
        };
        let mine = |id: &str, tenant: &str| (only.is_empty() || id == only) && wanted(id, tenant);
        // The heads and the journal's end at one instant: records are
        // appended under the same lock.
        let (mut kept, last) = {
            let books = sled.lock();
            let kept: std::collections::BTreeMap<String, chain::Kept> = books
                .budgets
                .values()
                .filter(|b| mine(&b.id, &b.tenant))
                .map(|b| {
                    let k = chain::Kept {
                        head: b.head,
                        base: None,
                    };
                    (b.id.clone(), k)
                })
                .collect();
            (kept, sled.journal.last())
        };
        for r in sled.cold.budgets_after("") {
            let (id, retired) = r?;
            let view = retired.budget.unwrap_or_default();
            if mine(&id, &view.tenant) {
                let head = switchyard_kit::chain::Head::of_proto(view.journal_head.as_ref());
                let k = chain::Kept { head, base: None };
                kept.insert(id, k);
            }
        }
        for r in sled.cold.bases() {
            let (id, base) = r?;
            if let Some(k) = kept.get_mut(&id) {
                k.base = Some(base);
            }
        }
        sled.journal.make_durable(last).await?;
        let mut check = chain::Check::new(kept);
        for r in sled.journal.replay() {
            let (seq, rec) = r?;
            if seq > last {
                break;
            }
            check.record(&rec);
        }
        Ok(check.finish())
    }

    /// Flushes the journal to disk (shutdown), with the books as they are
    /// at `now` as the snapshot.
    pub(crate) fn flush(&self, now: u64) -> Result<(), LedgerError> {
        let Backend::Sled(sled) = self else {
            return Ok(());
        };
        // The flush below writes everything appended, so the books as they
        // are now are the snapshot.
        let snap = {
            let mut books = sled.lock();
            // Everything appended is durable after the flush below; what
            // can retire does, so the next start loads less.
            sled.cold.retire(&mut books, now)?;
            snapshot(&books, sled.journal.last())
        };
        sled.cold.save(&snap)?;
        sled.store.flush_blocking()?;
        Ok(())
    }

    /// The budget reservation `id` holds on (`None`: no such reservation).
    pub(crate) async fn reservation_budget(&self, id: &str) -> Result<Option<String>, LedgerError> {
        Ok(match self {
            Backend::Pg(pg) => pg.reservation_budget(id).await?,
            Backend::Sled(sled) => {
                let books = sled.lock();
                match books.reservations.get(id) {
                    Some(r) => Some(r.budget_id.clone()),
                    None => sled.cold.reservation(id)?.map(|r| r.budget_id),
                }
            }
        })
    }

    /// One budget.
    pub(crate) async fn budget(&self, id: &str) -> Result<Option<Budget>, LedgerError> {
        match self {
            Backend::Pg(pg) => pg.budget(id).await,
            Backend::Sled(sled) => sled.budget(id),
        }
    }

    /// Budget `id`'s tenant and parent (`None`: no such budget), whether in
    /// memory or retired.
    pub(crate) async fn facts(&self, id: &str) -> Result<Option<(String, String)>, LedgerError> {
        match self {
            Backend::Pg(pg) => pg.facts(id).await,
            Backend::Sled(sled) => Ok(sled.facts(&sled.lock(), id)),
        }
    }

    /// ListBudgets, in id order.
    pub(crate) async fn list_budgets(
        &self,
        req: &ListBudgetsRequest,
    ) -> Result<ListBudgetsResponse, LedgerError> {
        match self {
            Backend::Pg(pg) => pg.list_budgets(req).await,
            Backend::Sled(sled) => Ok(sled.list_budgets(req)),
        }
    }

    /// The charges ListEntries `req` selects, and the budget it names.
    pub(crate) async fn charges(&self, req: &ListEntriesRequest) -> Result<Selected, LedgerError> {
        match self {
            Backend::Pg(pg) => pg.charges(req).await,
            Backend::Sled(sled) => sled.charges(req),
        }
    }

    /// Feeds the whole journal, in order, to `apply`.
    pub(crate) async fn replay(
        &self,
        apply: &mut impl FnMut(&JournalRecord),
    ) -> Result<(), LedgerError> {
        match self {
            Backend::Pg(pg) => pg.replay(apply).await,
            Backend::Sled(sled) => {
                for r in sled.journal.replay() {
                    apply(&r?.1);
                }
                Ok(())
            }
        }
    }

    /// Every budget as the live books hold it, in id order.
    pub(crate) async fn budgets(&self) -> Result<Vec<Budget>, LedgerError> {
        match self {
            Backend::Pg(pg) => pg.budgets().await,
            Backend::Sled(sled) => Ok(sled.budgets()),
        }
    }

    /// The durable journal records after `after`, then each new one.
    pub(crate) fn tail(&self, after: u64) -> BoxStream<'static, Result<JournalRecord, StoreError>> {
        match self {
            Backend::Pg(pg) => pg.tail(after),
            Backend::Sled(sled) => sled
                .journal
                .tail(after)
                .map(|r| r.map(|(_, rec)| rec))
                .boxed(),
        }
    }

    /// Money held by open reservations on each tenant's root budgets, where
    /// this member holds the books in memory (none on PostgreSQL: no
    /// replica holds them all).
    pub(crate) fn reserved_by_tenant(&self) -> Vec<(String, i64)> {
        let Backend::Sled(sled) = self else {
            return Vec::new();
        };
        let books = sled.lock();
        books
            .budgets
            .values()
            .filter(|b| b.parent.is_none())
            .map(|b| (b.tenant.clone(), b.cost_reserved))
            .collect()
    }
}

impl Sled {
    /// A copy of every rate-limit bucket.
    fn buckets(&self) -> Vec<(String, Bucket)> {
        let table = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        table
            .buckets
            .iter()
            .map(|(k, b)| (k.clone(), b.clone()))
            .collect()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One budget, in memory or retired.
    pub(crate) fn budget(&self, id: &str) -> Result<Option<Budget>, LedgerError> {
        let hot = self.lock().budgets.get(id).map(|b| b.view());
        match hot {
            Some(b) => Ok(Some(b)),
            None => Ok(self.cold.budget(id)?.and_then(|c| c.budget)),
        }
    }

    /// Budget `id`'s tenant and parent (`None`: no such budget).
    pub(crate) fn facts(&self, books: &Books, id: &str) -> Option<(String, String)> {
        desk::facts(books, Some(&self.cold), id).unwrap_or_else(|e| {
            tracing::error!(budget_id = id, error = %e, "reading a retired budget");
            None
        })
    }

    pub(crate) fn list_budgets(&self, req: &ListBudgetsRequest) -> ListBudgetsResponse {
        let size = switchyard_core::validate::page_size(req.page_size);
        let books = self.lock();
        let start = std::ops::Bound::Excluded(req.page_token.clone());
        let wanted = |parent: &str| req.parent_id.is_empty() || parent == req.parent_id;
        let mut budgets: Vec<Budget> = books
            .budgets
            .range::<String, _>((start, std::ops::Bound::Unbounded))
            .map(|(_, b)| b)
            .filter(|b| wanted(b.parent.as_deref().unwrap_or("")))
            .take(size + 1)
            .map(|b| b.view())
            .collect();
        // Retired budgets, merged in id order.
        let retired = self
            .cold
            .budgets_after(&req.page_token)
            .filter_map(|r| match r {
                Ok((_, c)) => c.budget,
                Err(e) => {
                    tracing::error!(error = %e, "listing retired budgets");
                    None
                }
            })
            .filter(|b| wanted(&b.parent_id))
            .take(size + 1);
        budgets.extend(retired);
        page_of_budgets(budgets, size)
    }

    /// The charges a ListEntries selects (ascending), and the budget it
    /// names.
    pub(crate) fn charges(&self, req: &ListEntriesRequest) -> Result<Selected, LedgerError> {
        let books = self.lock();
        let cold = &self.cold;
        let (mut seqs, budget) = if !req.budget_id.is_empty() {
            let (mut seqs, view): (Vec<u64>, Budget) = match books.budgets.get(&req.budget_id) {
                Some(b) => {
                    let mut seqs = Vec::new();
                    for live in books.subtree(&req.budget_id) {
                        seqs.extend(live.entries.iter().copied());
                        // Retired budgets under a budget still in memory
                        // (a closed job's, under its open project).
                        if live.id != req.budget_id {
                            seqs.extend(cold.subtree_entries(&live.id)?);
                        }
                    }
                    (seqs, b.view())
                }
                None => match cold.budget(&req.budget_id)? {
                    Some(c) => (c.entries, c.budget.unwrap_or_default()),
                    None => return Err(LedgerError::BudgetNotFound(req.budget_id.clone())),
                },
            };
            // Entries of retired budgets under it.
            seqs.extend(cold.subtree_entries(&req.budget_id)?);
            (seqs, Some(view))
        } else if !req.job_id.is_empty() {
            let mut seqs = books.by_job.get(&req.job_id).cloned().unwrap_or_default();
            seqs.extend(cold.indexed('j', &req.job_id)?);
            (seqs, None)
        } else {
            let seqs = books.by_correlation.get(&req.correlation_id).cloned();
            let mut seqs = seqs.unwrap_or_default();
            seqs.extend(cold.indexed('c', &req.correlation_id)?);
            (seqs, None)
        };
        seqs.sort_unstable();
        seqs.dedup();
        // Retired budgets' entries are read from the journal (and are gone
        // once pruned past retention).
        let charges = cold::charges(&books, Some(&self.journal), &seqs)?;
        Ok((charges, budget))
    }

    /// Every budget, in memory or retired, in id order.
    pub(crate) fn budgets(&self) -> Vec<Budget> {
        let retired: Vec<Budget> = self
            .cold
            .budgets_after("")
            .filter_map(|r| r.ok().and_then(|(_, c)| c.budget))
            .collect();
        let mut all: Vec<Budget> = self.lock().budgets.values().map(|b| b.view()).collect();
        all.extend(retired);
        all.sort_by(|a, b| a.budget_id.cmp(&b.budget_id));
        all
    }
}

/// Name of the sled tree holding the rate-limit buckets.
const BUCKETS: &str = "rate_buckets";

/// The rate-limit buckets stored at the last snapshot.
pub(crate) fn load_buckets(store: &Store) -> Result<Table, LedgerError> {
    let tree = store.tree::<Bucket>(BUCKETS)?;
    let mut table = Table::default();
    for row in tree.iter() {
        let (key, bucket) = row?;
        table.buckets.insert(key, bucket);
    }
    Ok(table)
}

/// Stores the buckets changed since the last snapshot.
fn save_buckets(sled: &Sled) -> Result<(), LedgerError> {
    let changed: Vec<(String, Bucket)> = {
        let mut table = sled.rates.lock().unwrap_or_else(|p| p.into_inner());
        let keys = std::mem::take(&mut table.changed);
        keys.into_iter()
            .filter_map(|k| table.buckets.get(&k).map(|b| (k, b.clone())))
            .collect()
    };
    if changed.is_empty() {
        return Ok(());
    }
    let tree = sled.store.tree::<Bucket>(BUCKETS)?;
    for (key, bucket) in &changed {
        tree.put(key, bucket)?;
    }
    Ok(())
}
