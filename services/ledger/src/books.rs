//! The ledger's in-memory books: budgets, reservations and indexes, derived
//! only from journal records through [`Books::apply`]. Live requests decide
//! (check limits, idempotency) and then apply the record they journal; start-up
//! replays the journal through the same function, so balances are by
//! construction the replay of the journal.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use switchyard_kit::time::{timestamp, timestamp_ms};
use switchyard_proto::common::v1::{CorrelationContext, Money};
use switchyard_proto::ledger::v1::{Budget, Entry, JournalRecord, RecordKind, Reservation};

/// One budget: its settings and balances, which include every budget nested
/// under it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct BudgetState {
    pub id: String,
    pub tenant: String,
    pub parent: Option<String>,
    pub token_limit: Option<u64>,
    pub cost_limit: Option<i64>,
    pub labels: BTreeMap<String, String>,
    pub closed: bool,
    pub tokens_reserved: u64,
    pub tokens_spent: u64,
    pub cost_reserved: i64,
    pub cost_spent: i64,
    pub children: BTreeSet<String>,
    /// Sequences of entries charged directly to this budget.
    pub entries: Vec<u64>,
    /// Who created it, or for whom.
    pub created_by: String,
    /// When it was created, ms.
    pub created_ms: u64,
    /// Its journal chain's head (moved by [`Books::apply`]).
    pub head: switchyard_kit::chain::Head,
}

impl BudgetState {
    /// Remaining tokens, `None` when unlimited.
    pub fn tokens_remaining(&self) -> Option<u64> {
        self.token_limit
            .map(|l| l.saturating_sub(self.tokens_reserved.saturating_add(self.tokens_spent)))
    }

    /// Remaining money, `None` when unlimited; never negative.
    pub fn cost_remaining(&self) -> Option<i64> {
        self.cost_limit
            .map(|l| (l.saturating_sub(self.cost_reserved.saturating_add(self.cost_spent))).max(0))
    }

    /// Spent more than a limit: only possible through overruns or lowered limits.
    pub fn overrun(&self) -> bool {
        self.token_limit.is_some_and(|l| self.tokens_spent > l)
            || self.cost_limit.is_some_and(|l| self.cost_spent > l)
    }

    pub fn view(&self) -> Budget {
        Budget {
            budget_id: self.id.clone(),
            parent_id: self.parent.clone().unwrap_or_default(),
            token_limit: self.token_limit,
            cost_limit: self.cost_limit.map(money),
            tokens_reserved: self.tokens_reserved,
            tokens_spent: self.tokens_spent,
            cost_reserved: Some(money(self.cost_reserved)),
            cost_spent: Some(money(self.cost_spent)),
            tokens_remaining: self.tokens_remaining(),
            cost_remaining: self.cost_remaining().map(money),
            labels: self.labels.clone(),
            closed: self.closed,
            overrun: self.overrun(),
            tenant: self.tenant.clone(),
            created_by: self.created_by.clone(),
            created_at: (self.created_ms > 0).then(|| timestamp(self.created_ms)),
            journal_head: self.head.to_proto(),
        }
    }
}

/// Where a reservation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    Open,
    /// Committed by the entry at this sequence.
    Committed(u64),
    Released,
    Expired,
}

impl Settled {
    pub fn as_str(self) -> &'static str {
        match self {
            Settled::Open => "open",
            Settled::Committed(_) => "committed",
            Settled::Released => "released",
            Settled::Expired => "expired",
        }
    }
}

/// A reservation as made (the original Reserve arguments are kept for
/// idempotent replays).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Res {
    pub id: String,
    pub budget_id: String,
    pub tokens: u64,
    pub cost: i64,
    pub expires_ms: u64,
    pub ttl_ms: u64,
    pub context: CorrelationContext,
    pub note: String,
    pub key: String,
    pub settled: Settled,
    /// The key the reservation was settled with.
    pub settle_key: String,
    /// A hold: drawn from, never committed.
    pub hold: bool,
    /// A hold: what its draws took and have not given back (held by open
    /// draws, or spent by settled ones).
    pub drawn_tokens: u64,
    /// A hold: the same in money, micro-USD.
    pub drawn_cost: i64,
    /// A draw: the hold it came from.
    pub from_hold: String,
}

impl Res {
    /// A hold: the tokens and money still free to draw (0 once settled);
    /// any other reservation: nothing. This is also what the hold keeps on
    /// its budget chain besides its open draws.
    pub fn left(&self) -> (u64, i64) {
        if !self.hold || self.settled != Settled::Open {
            return (0, 0);
        }
        (
            self.tokens.saturating_sub(self.drawn_tokens),
            self.cost.saturating_sub(self.drawn_cost).max(0),
        )
    }

    /// What the reservation keeps on its budget chain while open: a hold
    /// what is left undrawn, any other its amounts.
    pub fn on_chain(&self) -> (u64, i64) {
        if self.hold {
            self.left()
        } else {
            (self.tokens, self.cost)
        }
    }

    pub fn view(&self) -> Reservation {
        let (tokens_left, cost_left) = self.left();
        Reservation {
            reservation_id: self.id.clone(),
            budget_id: self.budget_id.clone(),
            tokens: self.tokens,
            cost: Some(money(self.cost)),
            expires_at: Some(timestamp(self.expires_ms)),
            context: Some(self.context.clone()),
            hold: self.hold,
            tokens_left,
            cost_left: self.hold.then(|| money(cost_left)),
            from_hold: self.from_hold.clone(),
        }
    }
}

/// A committed entry and whether it overran its reservation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Charge {
    pub entry: Entry,
    pub overrun: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Books {
    pub budgets: BTreeMap<String, BudgetState>,
    pub reservations: HashMap<String, Res>,
    /// Open reservations by expiry.
    pub expiry: BTreeSet<(u64, String)>,
    /// Reserve idempotency keys → reservation id.
    pub reserve_keys: HashMap<String, String>,
    /// Commit/Release idempotency keys → reservation id.
    pub settle_keys: HashMap<String, String>,
    /// Entries by journal sequence.
    pub entries: BTreeMap<u64, Charge>,
    pub by_job: HashMap<String, Vec<u64>>,
    pub by_correlation: HashMap<String, Vec<u64>>,
}

pub(crate) fn money(micro_usd: i64) -> Money {
    Money { micro_usd }
}

pub(crate) fn micro(m: Option<&Money>) -> i64 {
    m.map_or(0, |m| m.micro_usd)
}

/// A problem found while replaying: the journal references something it
/// never created. Replay skips such records and reports them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("journal record {seq} ({kind}) {problem}")]
pub(crate) struct ReplayGap {
    pub seq: u64,
    pub kind: &'static str,
    pub problem: String,
}

impl Books {
    /// Keeps the entry a Committed record charged, indexed by job and
    /// correlation id.
    pub fn index_entry(&mut self, r: &JournalRecord) {
        let entry = r.entry.clone().unwrap_or_default();
        let ctx = entry.context.clone().unwrap_or_default();
        if !ctx.job_id.is_empty() {
            self.by_job.entry(ctx.job_id).or_default().push(r.sequence);
        }
        if !ctx.correlation_id.is_empty() {
            self.by_correlation
                .entry(ctx.correlation_id)
                .or_default()
                .push(r.sequence);
        }
        self.entries.insert(
            r.sequence,
            Charge {
                entry,
                overrun: r.overrun,
            },
        );
    }

    /// Forgets entry `seq` from the job and correlation indexes (it is
    /// retired with its budget).
    pub fn forget_entry(&mut self, job_id: &str, correlation_id: &str, seq: u64) {
        for (map, key) in [
            (&mut self.by_job, job_id),
            (&mut self.by_correlation, correlation_id),
        ] {
            if let Some(v) = map.get_mut(key) {
                v.retain(|s| *s != seq);
                if v.is_empty() {
                    map.remove(key);
                }
            }
        }
    }

    /// Puts back a reservation from a snapshot, with its keys and expiry.
    pub fn restore(&mut self, res: Res) {
        if res.settled == Settled::Open {
            self.expiry.insert((res.expires_ms, res.id.clone()));
        }
        self.reserve_keys.insert(res.key.clone(), res.id.clone());
        if !res.settle_key.is_empty() {
            self.settle_keys
                .insert(res.settle_key.clone(), res.id.clone());
        }
        self.reservations.insert(res.id.clone(), res);
    }

    /// What settling a draw from hold `from_hold` that held `held` tokens
    /// and micro-USD, having spent `spent`, gives back to the hold: the
    /// unspent part while the hold is open; nothing for a reservation that
    /// is no draw (`from_hold` empty) or once the hold is settled.
    pub fn given_back(&self, from_hold: &str, held: (u64, i64), spent: (u64, i64)) -> (u64, i64) {
        match self.reservations.get(from_hold) {
            Some(h) if !from_hold.is_empty() && h.settled == Settled::Open => (
                held.0.saturating_sub(spent.0),
                held.1.saturating_sub(spent.1).max(0),
            ),
            _ => (0, 0),
        }
    }

    /// The budget and its ancestors, nearest first.
    pub fn chain(&self, id: &str) -> Vec<&BudgetState> {
        let mut out = Vec::new();
        let mut cur = self.budgets.get(id);
        while let Some(b) = cur {
            out.push(b);
            // A cycle cannot be created (parents must exist first), but the
            // bound keeps a corrupted journal from looping forever.
            if out.len() > self.budgets.len() {
                break;
            }
            cur = b.parent.as_deref().and_then(|p| self.budgets.get(p));
        }
        out
    }

    /// The budget and every budget nested under it.
    pub fn subtree(&self, id: &str) -> Vec<&BudgetState> {
        let mut out = Vec::new();
        let mut stack = vec![id.to_owned()];
        while let Some(cur) = stack.pop() {
            if let Some(b) = self.budgets.get(&cur) {
                stack.extend(b.children.iter().cloned());
                out.push(b);
            }
        }
        out
    }

    /// Runs `f` on the budget and each ancestor, nearest first.
    fn for_chain(&mut self, id: &str, mut f: impl FnMut(&mut BudgetState)) {
        let mut cur = Some(id.to_owned());
        // Bounded like `chain`, against a corrupted journal.
        for _ in 0..=self.budgets.len() {
            let Some(b) = cur.take().and_then(|c| self.budgets.get_mut(&c)) else {
                return;
            };
            f(b);
            cur.clone_from(&b.parent);
        }
    }

    /// Applies one journal record. The only place balances change.
    pub fn apply(&mut self, r: &JournalRecord) -> Result<(), ReplayGap> {
        let gap = |problem: String| ReplayGap {
            seq: r.sequence,
            kind: r.kind().as_str_name(),
            problem,
        };
        match r.kind() {
            RecordKind::BudgetCreated => {
                let b = r.budget.clone().unwrap_or_default();
                let parent = (!b.parent_id.is_empty()).then(|| b.parent_id.clone());
                if let Some(p) = &parent {
                    let Some(pb) = self.budgets.get_mut(p) else {
                        return Err(gap(format!(
                            "creates {:?} under unknown parent {p:?}",
                            b.budget_id
                        )));
                    };
                    pb.children.insert(b.budget_id.clone());
                }
                self.budgets.insert(
                    b.budget_id.clone(),
                    BudgetState {
                        id: b.budget_id.clone(),
                        tenant: b.tenant.clone(),
                        parent,
                        token_limit: b.token_limit,
                        cost_limit: b.cost_limit.map(|m| m.micro_usd),
                        labels: b.labels,
                        created_by: b.created_by,
                        created_ms: r.time.as_ref().map_or(0, timestamp_ms),
                        ..Default::default()
                    },
                );
            }
            RecordKind::LimitsUpdated => {
                let b = r.budget.clone().unwrap_or_default();
                let Some(s) = self.budgets.get_mut(&r.budget_id) else {
                    return Err(gap(format!("updates unknown budget {:?}", r.budget_id)));
                };
                s.token_limit = b.token_limit;
                s.cost_limit = b.cost_limit.map(|m| m.micro_usd);
            }
            RecordKind::BudgetClosed => {
                let Some(s) = self.budgets.get_mut(&r.budget_id) else {
                    return Err(gap(format!("closes unknown budget {:?}", r.budget_id)));
                };
                s.closed = true;
            }
            RecordKind::Reserved => {
                if !self.budgets.contains_key(&r.budget_id) {
                    return Err(gap(format!("reserves on unknown budget {:?}", r.budget_id)));
                }
                let cost = micro(r.cost.as_ref());
                let res = Res {
                    id: r.reservation_id.clone(),
                    budget_id: r.budget_id.clone(),
                    tokens: r.tokens,
                    cost,
                    expires_ms: r.expires_at.as_ref().map_or(0, timestamp_ms),
                    ttl_ms: r.ttl_ms,
                    context: r.context.clone().unwrap_or_default(),
                    note: r.note.clone(),
                    key: r.idempotency_key.clone(),
                    settled: Settled::Open,
                    settle_key: String::new(),
                    hold: r.hold,
                    drawn_tokens: 0,
                    drawn_cost: 0,
                    from_hold: r.from_hold.clone(),
                };
                if r.from_hold.is_empty() {
                    self.for_chain(&r.budget_id, |b| {
                        b.tokens_reserved = b.tokens_reserved.saturating_add(r.tokens);
                        b.cost_reserved = b.cost_reserved.saturating_add(cost);
                    });
                } else {
                    // Moved from the hold to the draw: the chain's totals
                    // stay as they are.
                    let Some(h) = self.reservations.get_mut(&r.from_hold) else {
                        return Err(gap(format!("draws from unknown hold {:?}", r.from_hold)));
                    };
                    h.drawn_tokens = h.drawn_tokens.saturating_add(r.tokens);
                    h.drawn_cost = h.drawn_cost.saturating_add(cost);
                }
                self.expiry.insert((res.expires_ms, res.id.clone()));
                self.reserve_keys.insert(res.key.clone(), res.id.clone());
                self.reservations.insert(res.id.clone(), res);
            }
            RecordKind::Committed | RecordKind::Released | RecordKind::Expired => {
                let Some(res) = self.reservations.get_mut(&r.reservation_id) else {
                    return Err(gap(format!(
                        "settles unknown reservation {:?}",
                        r.reservation_id
                    )));
                };
                if res.settled != Settled::Open {
                    return Err(gap(format!(
                        "settles reservation {:?} that is already {}",
                        r.reservation_id,
                        res.settled.as_str()
                    )));
                }
                // What it kept on the chain, read while still open.
                let (tokens, cost) = res.on_chain();
                res.settled = match r.kind() {
                    RecordKind::Committed => Settled::Committed(r.sequence),
                    RecordKind::Released => Settled::Released,
                    _ => Settled::Expired,
                };
                res.settle_key = r.idempotency_key.clone();
                let (budget, expires, from_hold) =
                    (res.budget_id.clone(), res.expires_ms, res.from_hold.clone());
                let held = (res.tokens, res.cost);
                self.expiry.remove(&(expires, r.reservation_id.clone()));
                if !r.idempotency_key.is_empty() {
                    self.settle_keys
                        .insert(r.idempotency_key.clone(), r.reservation_id.clone());
                }
                let (spent_tokens, spent_cost) = if r.kind() == RecordKind::Committed {
                    (r.tokens, micro(r.cost.as_ref()))
                } else {
                    (0, 0)
                };
                // A draw gives what it did not spend back to its open hold,
                // which keeps it on the chain.
                let (back_tokens, back_cost) =
                    self.given_back(&from_hold, held, (spent_tokens, spent_cost));
                if let Some(h) = self.reservations.get_mut(&from_hold) {
                    h.drawn_tokens = h.drawn_tokens.saturating_sub(back_tokens);
                    h.drawn_cost = h.drawn_cost.saturating_sub(back_cost);
                }
                let (tokens, cost) = (tokens - back_tokens.min(tokens), cost - back_cost.min(cost));
                self.for_chain(&budget, |b| {
                    b.tokens_reserved = b.tokens_reserved.saturating_sub(tokens);
                    b.cost_reserved = b.cost_reserved.saturating_sub(cost);
                    b.tokens_spent = b.tokens_spent.saturating_add(spent_tokens);
                    b.cost_spent = b.cost_spent.saturating_add(spent_cost);
                });
                if r.kind() == RecordKind::Committed {
                    if let Some(b) = self.budgets.get_mut(&budget) {
                        b.entries.push(r.sequence);
                    }
                    self.index_entry(r);
                }
            }
            // Facts for watchers and audits; balances already reflect them.
            RecordKind::Refused | RecordKind::Overrun | RecordKind::Unspecified => {}
        }
        // Every chained record moves its budget's head, whatever its kind.
        if let Some(head) = crate::chain::head_after(r)
            && let Some(b) = self.budgets.get_mut(&r.budget_id)
        {
            b.head = head;
        }
        Ok(())
    }
}
