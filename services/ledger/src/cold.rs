//! What the books no longer need in memory. A budget that is closed, holds
//! nothing and has no budget under it still in memory is *retired*: its
//! final view, its reservations (for idempotent answers), their keys and
//! the index of its entries go to disk, and the books forget it. Reads fall
//! back to here; entries themselves are read from the journal by sequence.
//!
//! With a [`Snapshot`] of the books (balances, open reservations, what is
//! not retired) taken at a journal position, start-up loads the snapshot and
//! replays only the journal after it: memory and start-up grow with the
//! budgets in use, not with history.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use switchyard_kit::chain::Head;

use switchyard_proto::common::v1::{ChainHead, CorrelationContext};
use switchyard_proto::ledger::v1::{Budget, JournalRecord};
use switchyard_store::{Log, Mark, Store, StoreError, Tree};

use crate::books::{Books, BudgetState, Charge, Res, Settled};

/// A retired budget.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ColdBudget {
    /// Its final view.
    #[prost(message, optional, tag = "1")]
    pub(crate) budget: Option<Budget>,
    /// Journal sequences of the entries charged to it.
    #[prost(uint64, repeated, tag = "2")]
    pub(crate) entries: Vec<u64>,
    /// Its reservations.
    #[prost(string, repeated, tag = "3")]
    pub(crate) reservations: Vec<String>,
    /// Its keys in the entry indexes (for pruning).
    #[prost(string, repeated, tag = "4")]
    pub(crate) index_keys: Vec<String>,
    /// When it was retired, ms.
    #[prost(uint64, tag = "5")]
    pub(crate) retired_ms: u64,
}

/// A reservation as the books hold it.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StoredRes {
    #[prost(string, tag = "1")]
    pub(crate) id: String,
    #[prost(string, tag = "2")]
    pub(crate) budget_id: String,
    #[prost(uint64, tag = "3")]
    pub(crate) tokens: u64,
    #[prost(int64, tag = "4")]
    pub(crate) cost: i64,
    #[prost(uint64, tag = "5")]
    pub(crate) expires_ms: u64,
    #[prost(uint64, tag = "6")]
    pub(crate) ttl_ms: u64,
    #[prost(message, optional, tag = "7")]
    pub(crate) context: Option<CorrelationContext>,
    #[prost(string, tag = "8")]
    pub(crate) note: String,
    #[prost(string, tag = "9")]
    pub(crate) key: String,
    /// 0 open, 1 committed, 2 released, 3 expired.
    #[prost(uint32, tag = "10")]
    pub(crate) settled: u32,
    /// The committing entry's sequence.
    #[prost(uint64, tag = "11")]
    pub(crate) committed_seq: u64,
    #[prost(string, tag = "12")]
    pub(crate) settle_key: String,
    #[prost(bool, tag = "13")]
    pub(crate) hold: bool,
    #[prost(uint64, tag = "14")]
    pub(crate) drawn_tokens: u64,
    #[prost(int64, tag = "15")]
    pub(crate) drawn_cost: i64,
    #[prost(string, tag = "16")]
    pub(crate) from_hold: String,
}

impl From<&Res> for StoredRes {
    fn from(r: &Res) -> StoredRes {
        let (settled, committed_seq) = match r.settled {
            Settled::Open => (0, 0),
            Settled::Committed(seq) => (1, seq),
            Settled::Released => (2, 0),
            Settled::Expired => (3, 0),
        };
        StoredRes {
            id: r.id.clone(),
            budget_id: r.budget_id.clone(),
            tokens: r.tokens,
            cost: r.cost,
            expires_ms: r.expires_ms,
            ttl_ms: r.ttl_ms,
            context: Some(r.context.clone()),
            note: r.note.clone(),
            key: r.key.clone(),
            settled,
            committed_seq,
            settle_key: r.settle_key.clone(),
            hold: r.hold,
            drawn_tokens: r.drawn_tokens,
            drawn_cost: r.drawn_cost,
            from_hold: r.from_hold.clone(),
        }
    }
}

impl From<StoredRes> for Res {
    fn from(s: StoredRes) -> Res {
        Res {
            id: s.id,
            budget_id: s.budget_id,
            tokens: s.tokens,
            cost: s.cost,
            expires_ms: s.expires_ms,
            ttl_ms: s.ttl_ms,
            context: s.context.unwrap_or_default(),
            note: s.note,
            key: s.key,
            settled: match s.settled {
                0 => Settled::Open,
                1 => Settled::Committed(s.committed_seq),
                2 => Settled::Released,
                _ => Settled::Expired,
            },
            settle_key: s.settle_key,
            hold: s.hold,
            drawn_tokens: s.drawn_tokens,
            drawn_cost: s.drawn_cost,
            from_hold: s.from_hold,
        }
    }
}

/// A budget as the books hold it.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StoredBudget {
    #[prost(string, tag = "1")]
    pub(crate) id: String,
    #[prost(string, tag = "2")]
    pub(crate) tenant: String,
    #[prost(string, optional, tag = "3")]
    pub(crate) parent: Option<String>,
    #[prost(uint64, optional, tag = "4")]
    pub(crate) token_limit: Option<u64>,
    #[prost(int64, optional, tag = "5")]
    pub(crate) cost_limit: Option<i64>,
    #[prost(btree_map = "string, string", tag = "6")]
    pub(crate) labels: std::collections::BTreeMap<String, String>,
    #[prost(bool, tag = "7")]
    pub(crate) closed: bool,
    #[prost(uint64, tag = "8")]
    pub(crate) tokens_reserved: u64,
    #[prost(uint64, tag = "9")]
    pub(crate) tokens_spent: u64,
    #[prost(int64, tag = "10")]
    pub(crate) cost_reserved: i64,
    #[prost(int64, tag = "11")]
    pub(crate) cost_spent: i64,
    #[prost(string, repeated, tag = "12")]
    pub(crate) children: Vec<String>,
    #[prost(uint64, repeated, tag = "13")]
    pub(crate) entries: Vec<u64>,
    #[prost(string, tag = "14")]
    pub(crate) created_by: String,
    #[prost(uint64, tag = "15")]
    pub(crate) created_ms: u64,
    /// The journal chain's head.
    #[prost(message, optional, tag = "16")]
    pub(crate) head: Option<ChainHead>,
}

impl From<&BudgetState> for StoredBudget {
    fn from(b: &BudgetState) -> StoredBudget {
        StoredBudget {
            id: b.id.clone(),
            tenant: b.tenant.clone(),
            parent: b.parent.clone(),
            token_limit: b.token_limit,
            cost_limit: b.cost_limit,
            labels: b.labels.clone(),
            closed: b.closed,
            tokens_reserved: b.tokens_reserved,
            tokens_spent: b.tokens_spent,
            cost_reserved: b.cost_reserved,
            cost_spent: b.cost_spent,
            children: b.children.iter().cloned().collect(),
            entries: b.entries.clone(),
            created_by: b.created_by.clone(),
            created_ms: b.created_ms,
            head: b.head.to_proto(),
        }
    }
}

impl From<StoredBudget> for BudgetState {
    fn from(b: StoredBudget) -> BudgetState {
        BudgetState {
            id: b.id,
            tenant: b.tenant,
            parent: b.parent,
            token_limit: b.token_limit,
            cost_limit: b.cost_limit,
            labels: b.labels,
            closed: b.closed,
            tokens_reserved: b.tokens_reserved,
            tokens_spent: b.tokens_spent,
            cost_reserved: b.cost_reserved,
            cost_spent: b.cost_spent,
            children: b.children.into_iter().collect::<BTreeSet<_>>(),
            entries: b.entries,
            created_by: b.created_by,
            created_ms: b.created_ms,
            head: Head::of_proto(b.head.as_ref()),
        }
    }
}

/// The books in memory at a journal position.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Snapshot {
    /// Every journal record up to here is in it.
    #[prost(uint64, tag = "1")]
    pub(crate) at: u64,
    #[prost(message, repeated, tag = "2")]
    pub(crate) budgets: Vec<StoredBudget>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) reservations: Vec<StoredRes>,
}

/// A reservation id, under a key.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Id {
    #[prost(string, tag = "1")]
    pub(crate) value: String,
}

/// A budget about to retire: what goes to disk.
pub(crate) struct Retirement {
    /// The budget as the books hold it (to see that it did not change).
    state: StoredBudget,
    cold: ColdBudget,
    reservations: Vec<StoredRes>,
}

/// The retired part of the books, on disk.
pub(crate) struct Cold {
    budgets: Tree<ColdBudget>,
    /// `{parent}/{child}` for retired children.
    children: Tree<Mark>,
    reservations: Tree<StoredRes>,
    /// `r/{key}` (Reserve) and `s/{key}` (Commit, Release) → reservation id.
    keys: Tree<Id>,
    /// `j/{job}/{seq:016x}` and `c/{correlation}/{seq:016x}`.
    index: Tree<Mark>,
    snapshot: Tree<Snapshot>,
    /// Budget id → its chain's head at its last record pruned from the
    /// journal (the records left continue from it).
    bases: Tree<ChainHead>,
}

const SNAPSHOT: &str = "books";

impl Cold {
    pub(crate) fn open(store: &Store) -> Result<Cold, StoreError> {
        Ok(Cold {
            budgets: store.tree("cold_budgets")?,
            children: store.tree("cold_children")?,
            reservations: store.tree("cold_reservations")?,
            keys: store.tree("cold_keys")?,
            index: store.tree("cold_index")?,
            snapshot: store.tree("snapshot")?,
            bases: store.tree("chain_bases")?,
        })
    }

    /// The books: the snapshot, then the journal after it.
    pub(crate) fn load(
        &self,
        journal: &Log<JournalRecord>,
    ) -> Result<(Books, u64, Vec<String>), StoreError> {
        let mut books = Books::default();
        let snap = self.snapshot.get(SNAPSHOT)?.unwrap_or_default();
        for b in snap.budgets {
            let b = BudgetState::from(b);
            books.budgets.insert(b.id.clone(), b);
        }
        for r in snap.reservations {
            books.restore(Res::from(r));
        }
        // Entries of the budgets in memory come back from the journal.
        let mut seqs: Vec<u64> = books
            .budgets
            .values()
            .flat_map(|b| b.entries.iter().copied())
            .collect();
        seqs.sort_unstable();
        for (_, rec) in journal.read_each(&seqs)? {
            books.index_entry(&rec);
        }
        let mut read = 0;
        let mut gaps = Vec::new();
        for r in journal.replay_after(snap.at) {
            let (_, record) = r?;
            read += 1;
            if let Err(gap) = books.apply(&record) {
                gaps.push(gap.to_string());
            }
        }
        Ok((books, read, gaps))
    }

    /// Stores the books as of journal position `at` (every record up to it
    /// must be durable first, and applied).
    pub(crate) fn save(&self, snap: &Snapshot) -> Result<(), StoreError> {
        self.snapshot.put(SNAPSHOT, snap)
    }

    /// The budgets that can go now (closed, holding nothing, no child in
    /// memory), copied for disk. Called under the books' lock; the writing
    /// ([`Cold::write`]) happens without it and [`Cold::forget`] after.
    pub(crate) fn plan(&self, books: &Books, now_ms: u64) -> Vec<Retirement> {
        let ready: Vec<&BudgetState> = books
            .budgets
            .values()
            .filter(|b| {
                b.closed && b.children.is_empty() && b.tokens_reserved == 0 && b.cost_reserved == 0
            })
            .collect();
        if ready.is_empty() {
            return Vec::new();
        }
        let ids: BTreeSet<&str> = ready.iter().map(|b| b.id.as_str()).collect();
        let mut by_budget: HashMap<&str, Vec<StoredRes>> = HashMap::new();
        for r in books.reservations.values() {
            if let Some(id) = ids.get(r.budget_id.as_str()) {
                by_budget.entry(id).or_default().push(StoredRes::from(r));
            }
        }
        ready
            .into_iter()
            .map(|b| {
                let mut index_keys = Vec::new();
                for seq in &b.entries {
                    let ctx = books
                        .entries
                        .get(seq)
                        .and_then(|c| c.entry.context.clone())
                        .unwrap_or_default();
                    if !ctx.job_id.is_empty() {
                        index_keys.push(format!("j/{}/{seq:016x}", ctx.job_id));
                    }
                    if !ctx.correlation_id.is_empty() {
                        index_keys.push(format!("c/{}/{seq:016x}", ctx.correlation_id));
                    }
                }
                let reservations = by_budget.remove(b.id.as_str()).unwrap_or_default();
                Retirement {
                    state: StoredBudget::from(b),
                    cold: ColdBudget {
                        budget: Some(b.view()),
                        entries: b.entries.clone(),
                        reservations: reservations.iter().map(|r| r.id.clone()).collect(),
                        index_keys,
                        retired_ms: now_ms,
                    },
                    reservations,
                }
            })
            .collect()
    }

    /// Writes planned retirements to disk.
    pub(crate) fn write(&self, plan: &[Retirement]) -> Result<(), StoreError> {
        for r in plan {
            let id = &r.state.id;
            for res in &r.reservations {
                self.reservations.put(&res.id, res)?;
                let rid = Id {
                    value: res.id.clone(),
                };
                self.keys.put(&format!("r/{}", res.key), &rid)?;
                if !res.settle_key.is_empty() {
                    self.keys.put(&format!("s/{}", res.settle_key), &rid)?;
                }
            }
            for k in &r.cold.index_keys {
                self.index.put(k, &Mark {})?;
            }
            if let Some(parent) = &r.state.parent {
                self.children.put(&format!("{parent}/{id}"), &Mark {})?;
            }
            self.budgets.put(id, &r.cold)?;
        }
        Ok(())
    }

    /// Drops written retirements from the books (a budget changed meanwhile
    /// stays, and goes next time); returns how many went.
    pub(crate) fn forget(&self, books: &mut Books, plan: Vec<Retirement>) -> usize {
        let mut gone = 0;
        for r in plan {
            let id = r.state.id.as_str();
            let unchanged = books
                .budgets
                .get(id)
                .is_some_and(|b| StoredBudget::from(b) == r.state);
            if !unchanged {
                continue;
            }
            books.budgets.remove(id);
            for res in &r.reservations {
                books.reservations.remove(&res.id);
                books.reserve_keys.remove(&res.key);
                if !res.settle_key.is_empty() {
                    books.settle_keys.remove(&res.settle_key);
                }
            }
            for seq in &r.state.entries {
                if let Some(c) = books.entries.remove(seq) {
                    let ctx = c.entry.context.unwrap_or_default();
                    books.forget_entry(&ctx.job_id, &ctx.correlation_id, *seq);
                }
            }
            if let Some(parent) = &r.state.parent
                && let Some(p) = books.budgets.get_mut(parent)
            {
                p.children.remove(id);
            }
            gone += 1;
        }
        gone
    }

    /// Retires everything that can go, all in one step (start-up, shutdown,
    /// tests: nobody else holds the books). Parents whose last child went
    /// follow in the next rounds.
    pub(crate) fn retire(&self, books: &mut Books, now_ms: u64) -> Result<usize, StoreError> {
        let mut gone = 0;
        loop {
            let plan = self.plan(books, now_ms);
            if plan.is_empty() {
                return Ok(gone);
            }
            self.write(&plan)?;
            gone += self.forget(books, plan);
        }
    }

    /// A retired budget.
    pub(crate) fn budget(&self, id: &str) -> Result<Option<ColdBudget>, StoreError> {
        self.budgets.get(id)
    }

    /// Retired budgets with ids after `after`, in id order.
    pub(crate) fn budgets_after<'a>(
        &'a self,
        after: &str,
    ) -> impl Iterator<Item = Result<(String, ColdBudget), StoreError>> + 'a {
        self.budgets.iter_after(after)
    }

    /// Each budget's chain head at its last record pruned (budgets with
    /// none pruned are not there).
    pub(crate) fn bases(&self) -> impl Iterator<Item = Result<(String, Head), StoreError>> + '_ {
        self.bases
            .iter()
            .map(|r| r.map(|(id, h)| (id, Head::of_proto(Some(&h)))))
    }

    /// Keeps `bases` (budget id → head at its last record about to be
    /// pruned).
    pub(crate) fn keep_bases(&self, bases: &BTreeMap<String, Head>) -> Result<(), StoreError> {
        for (id, head) in bases {
            if let Some(h) = head.to_proto() {
                self.bases.put(id, &h)?;
            }
        }
        Ok(())
    }

    /// A retired reservation.
    pub(crate) fn reservation(&self, id: &str) -> Result<Option<Res>, StoreError> {
        Ok(self.reservations.get(id)?.map(Res::from))
    }

    /// The reservation a Reserve (`r`) or settle (`s`) key was used for.
    pub(crate) fn key(&self, kind: char, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.keys.get(&format!("{kind}/{key}"))?.map(|i| i.value))
    }

    /// Entry sequences of retired budgets for a job (`j`) or correlation id (`c`).
    pub(crate) fn indexed(&self, kind: char, value: &str) -> Result<Vec<u64>, StoreError> {
        let prefix = format!("{kind}/{value}/");
        let mut out = Vec::new();
        for r in self.index.scan_prefix(&prefix) {
            let (k, _) = r?;
            if let Ok(seq) = u64::from_str_radix(&k[prefix.len()..], 16) {
                out.push(seq);
            }
        }
        Ok(out)
    }

    /// Every retired budget under `id` (at any depth) with its entries.
    pub(crate) fn subtree_entries(&self, id: &str) -> Result<Vec<u64>, StoreError> {
        let mut out = Vec::new();
        let mut stack = vec![id.to_owned()];
        while let Some(cur) = stack.pop() {
            let prefix = format!("{cur}/");
            for r in self.children.scan_prefix(&prefix) {
                let (k, _) = r?;
                // Ids hold `/` too: `a/b/c` under prefix `a/` is `c` of
                // `a/b`, not `b/c` of `a`. Only a budget whose parent is
                // `cur` is its child.
                let child = k[prefix.len()..].to_owned();
                let Some(b) = self
                    .budgets
                    .get(&child)?
                    .filter(|b| b.budget.as_ref().is_some_and(|v| v.parent_id == cur))
                else {
                    continue;
                };
                out.extend(b.entries);
                stack.push(child);
            }
        }
        Ok(out)
    }

    /// Removes the budgets retired before `cutoff_ms` and all that is kept
    /// for them; returns how many.
    pub(crate) fn prune(&self, cutoff_ms: u64) -> Result<usize, StoreError> {
        let mut n = 0;
        let old: Vec<(String, ColdBudget)> = self
            .budgets
            .iter()
            .filter_map(|r| r.ok())
            .filter(|(_, b)| b.retired_ms < cutoff_ms)
            .collect();
        for (id, b) in old {
            for rid in &b.reservations {
                if let Some(r) = self.reservations.get(rid)? {
                    self.keys.remove(&format!("r/{}", r.key))?;
                    self.keys.remove(&format!("s/{}", r.settle_key))?;
                }
                self.reservations.remove(rid)?;
            }
            for k in &b.index_keys {
                self.index.remove(k)?;
            }
            if let Some(parent) = b.budget.as_ref().map(|v| v.parent_id.clone()) {
                self.children.remove(&format!("{parent}/{id}"))?;
            }
            self.bases.remove(&id)?;
            self.budgets.remove(&id)?;
            n += 1;
        }
        Ok(n)
    }
}

/// The charges of entries `seqs` (ascending), in order: from the books,
/// else from the journal (entries pruned past retention are left out).
pub(crate) fn charges(
    books: &Books,
    journal: Option<&Log<JournalRecord>>,
    seqs: &[u64],
) -> Result<Vec<(u64, Charge)>, StoreError> {
    let cold: Vec<u64> = seqs
        .iter()
        .copied()
        .filter(|s| !books.entries.contains_key(s))
        .collect();
    let read = match journal {
        Some(j) => j.read_each(&cold)?,
        None => Vec::new(),
    };
    let mut read = read.into_iter().peekable();
    let mut out = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        if let Some(c) = books.entries.get(&seq) {
            out.push((seq, c.clone()));
        } else if let Some((_, rec)) = read.next_if(|(s, _)| *s == seq) {
            let charge = Charge {
                entry: rec.entry.unwrap_or_default(),
                overrun: rec.overrun,
            };
            out.push((seq, charge));
        }
    }
    Ok(out)
}
