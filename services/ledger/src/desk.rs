//! Where every write is decided: one [`Op`] against [`Books`], its records
//! appended to a [`Sink`] and applied to the same books. The code is the
//! same whichever backend runs it: on sled the books are the replica's
//! whole books and the sink the journal log; on PostgreSQL they are the
//! slice of the books one transaction locked (the budget chains, the
//! reservations and keys the batch touches), and the sink the batch's rows.

use switchyard_kit::time::timestamp;
use switchyard_proto::common::v1::{CorrelationContext, UnitPrice};
use switchyard_proto::ledger::v1::{
    Budget, CommitRequest, CommitResponse, CreateBudgetRequest, Entry, JournalRecord, RecordKind,
    Reservation, ReserveRequest, UpdateLimitsRequest,
};
use switchyard_store::{Log, StoreError};

use switchyard_kit::chain::Head;

use crate::books::{Books, Charge, Settled, micro, money};
use crate::chain;
use crate::cold::{self, Cold, ColdBudget};
use crate::{LedgerError, check_reserve, fits_integers, same_work};

/// Where decided records go.
pub(crate) trait Sink {
    /// Appends the record `build` makes from its sequence number.
    fn append(&mut self, build: impl FnOnce(u64) -> JournalRecord) -> (u64, JournalRecord);
    /// The charges of committed entries `seqs` (ascending) the books or the
    /// journal still hold.
    fn charges(&self, books: &Books, seqs: &[u64]) -> Result<Vec<(u64, Charge)>, StoreError>;
}

/// The sled journal as a sink; remembers how far the caller must wait for
/// durability.
pub(crate) struct LogSink<'a> {
    log: &'a Log<JournalRecord>,
    appended: Option<u64>,
}

impl<'a> LogSink<'a> {
    pub(crate) fn new(log: &'a Log<JournalRecord>) -> Self {
        Self {
            log,
            appended: None,
        }
    }

    /// The sequence the answer must wait for: the last record this decision
    /// appended, else everything appended so far (an idempotent answer may
    /// rest on a record still on its way to disk).
    pub(crate) fn durable_point(&self) -> u64 {
        self.appended.unwrap_or_else(|| self.log.last())
    }
}

impl Sink for LogSink<'_> {
    fn append(&mut self, build: impl FnOnce(u64) -> JournalRecord) -> (u64, JournalRecord) {
        let (seq, rec) = self.log.append(build);
        self.appended = Some(seq);
        (seq, rec)
    }

    fn charges(&self, books: &Books, seqs: &[u64]) -> Result<Vec<(u64, Charge)>, StoreError> {
        cold::charges(books, Some(self.log), seqs)
    }
}

/// One write, its arguments checked.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// Create a budget of `tenant`.
    Create {
        /// The request.
        req: CreateBudgetRequest,
        /// Owner of the new budget.
        tenant: String,
        /// Who creates it, or for whom (the acting subject).
        by: String,
    },
    /// Change a budget's limits.
    Update(UpdateLimitsRequest),
    /// Close a budget.
    Close(String),
    /// Reserve on a budget chain.
    Reserve {
        /// The request.
        req: Box<ReserveRequest>,
        /// Its context, the correlation id filled in.
        context: CorrelationContext,
        /// Its cost, micro-USD.
        cost: i64,
        /// Its time to live, ms.
        ttl_ms: u64,
    },
    /// Commit a reservation's usage.
    Commit {
        /// The request.
        req: Box<CommitRequest>,
        /// The key it settles under.
        key: String,
        /// Its cost, micro-USD.
        cost: i64,
        /// The entry to journal.
        entry: Box<Entry>,
        /// Price per unit.
        price: UnitPrice,
    },
    /// Release a reservation.
    Release {
        /// Reservation id.
        reservation_id: String,
        /// The key it settles under.
        key: String,
    },
    /// Release a reservation past its TTL (the sweeper), if still open.
    Expire(String),
    /// Nothing on the books: a write of rate-limit buckets only (a
    /// cooldown, `rates::decide`).
    Cool,
}

impl Op {
    /// The budgets whose chains the op reads, besides the budget chains of
    /// the reservations it names.
    pub(crate) fn budgets(&self) -> Vec<&str> {
        match self {
            Op::Create { req, .. } if req.parent_id.is_empty() => vec![&req.budget_id],
            Op::Create { req, .. } => vec![&req.budget_id, &req.parent_id],
            Op::Update(r) => vec![&r.budget_id],
            Op::Close(id) => vec![id],
            Op::Reserve { req, .. } => vec![&req.budget_id],
            Op::Commit { .. } | Op::Release { .. } | Op::Expire(_) | Op::Cool => vec![],
        }
    }

    /// The reservation the op settles, if any.
    pub(crate) fn reservation(&self) -> Option<&str> {
        match self {
            Op::Commit { req, .. } => Some(&req.reservation_id),
            // A draw decides on its hold.
            Op::Reserve { req, .. } if !req.hold_id.is_empty() => Some(&req.hold_id),
            Op::Release { reservation_id, .. } | Op::Expire(reservation_id) => Some(reservation_id),
            _ => None,
        }
    }

    /// The idempotency key of a Reserve.
    pub(crate) fn reserve_key(&self) -> Option<&str> {
        match self {
            Op::Reserve { req, .. } => Some(&req.idempotency_key),
            _ => None,
        }
    }

    /// The key a Commit or Release settles under.
    pub(crate) fn settle_key(&self) -> Option<&str> {
        match self {
            Op::Commit { key, .. } | Op::Release { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// What a write answered.
#[derive(Debug, Clone)]
pub(crate) enum Done {
    /// Created (true) or already there with the same settings (false).
    Created(bool),
    /// Limits changed or budget closed (or closed already).
    Budget,
    /// The reservation made (or made before under the same key).
    Reserved(Reservation),
    /// The entry committed (or committed before under the same key).
    Committed(CommitResponse),
    /// Released (now or before).
    Released,
    /// Expired now (true) or not open any more (false).
    Expired(bool),
}

/// Budget `id`'s tenant and parent (`None`: no such budget), in `books` or
/// retired in `cold`.
pub(crate) fn facts(
    books: &Books,
    cold: Option<&Cold>,
    id: &str,
) -> Result<Option<(String, String)>, StoreError> {
    Ok(match books.budgets.get(id) {
        Some(b) => Some((b.tenant.clone(), b.parent.clone().unwrap_or_default())),
        None => match cold {
            Some(c) => c
                .budget(id)?
                .and_then(|c| c.budget)
                .map(|b| (b.tenant, b.parent_id)),
            None => None,
        },
    })
}

/// Decides writes against `books`.
pub(crate) struct Desk<'a, S: Sink> {
    /// The books to decide against and apply to.
    pub books: &'a mut Books,
    /// Retired budgets (sled only).
    pub cold: Option<&'a Cold>,
    /// Where records go.
    pub sink: &'a mut S,
    /// Put in reservation and entry ids: `<kind>-<prefix>-<sequence>`.
    pub prefix: &'a str,
    /// Now, ms.
    pub now: u64,
}

impl<S: Sink> Desk<'_, S> {
    /// Decides `op`.
    pub(crate) fn decide(&mut self, op: Op) -> Result<Done, LedgerError> {
        match op {
            Op::Create { req, tenant, by } => self.create(req, &tenant, &by).map(Done::Created),
            Op::Update(req) => self.update(req).map(|()| Done::Budget),
            Op::Close(id) => self.close(&id).map(|()| Done::Budget),
            Op::Reserve {
                req,
                context,
                cost,
                ttl_ms,
            } => self
                .reserve(*req, context, cost, ttl_ms)
                .map(Done::Reserved),
            Op::Commit {
                req,
                key,
                cost,
                entry,
                price,
            } => self
                .commit(*req, key, cost, *entry, price)
                .map(Done::Committed),
            Op::Release {
                reservation_id,
                key,
            } => self.release(reservation_id, key).map(|()| Done::Released),
            Op::Expire(id) => Ok(Done::Expired(self.expire(&id))),
            Op::Cool => Ok(Done::Budget),
        }
    }

    fn append(&mut self, build: impl FnOnce(u64) -> JournalRecord) -> JournalRecord {
        let books = &*self.books;
        let (_, rec) = self.sink.append(|sequence| {
            let mut rec = build(sequence);
            // Each record links after its budget's last (a new budget's
            // first, after nothing); a retired budget's chain has ended.
            let head = match books.budgets.get(&rec.budget_id) {
                Some(b) => Some(b.head),
                None if rec.kind() == RecordKind::BudgetCreated => Some(Head::default()),
                None => None,
            };
            if let Some(head) = head {
                chain::link(&mut rec, head);
            }
            rec
        });
        if let Err(gap) = self.books.apply(&rec) {
            // Live records are built from the books they apply to, so a gap
            // here is a bug; it is logged, never panics.
            tracing::error!(error = %gap, "live journal record did not apply");
        }
        rec
    }

    fn cold_budget(&self, id: &str) -> Result<Option<ColdBudget>, LedgerError> {
        match self.cold {
            Some(c) => Ok(c.budget(id)?),
            None => Ok(None),
        }
    }

    /// Budget `id`'s tenant and parent, in the books or retired.
    fn facts(&self, id: &str) -> Result<Option<(String, String)>, LedgerError> {
        Ok(facts(self.books, self.cold, id)?)
    }

    fn create(
        &mut self,
        req: CreateBudgetRequest,
        tenant: &str,
        by: &str,
    ) -> Result<bool, LedgerError> {
        let wanted = Budget {
            budget_id: req.budget_id.clone(),
            parent_id: req.parent_id.clone(),
            token_limit: req.token_limit,
            cost_limit: req.cost_limit,
            labels: req.labels,
            tenant: tenant.to_owned(),
            created_by: by.to_owned(),
            created_at: Some(timestamp(self.now)),
            ..Default::default()
        };
        if !req.parent_id.is_empty()
            && self
                .facts(&req.parent_id)?
                .is_some_and(|(t, _)| t != tenant)
        {
            return Err(LedgerError::BudgetNotFound(req.parent_id));
        }
        let retired = match self.books.budgets.contains_key(&req.budget_id) {
            true => None,
            false => self.cold_budget(&req.budget_id)?.and_then(|c| c.budget),
        };
        if let Some(b) = retired {
            // Created (and closed) before: the same request is answered.
            let same = b.tenant == tenant
                && b.parent_id == wanted.parent_id
                && b.token_limit == wanted.token_limit
                && b.cost_limit.map(|m| m.micro_usd) == wanted.cost_limit.map(|m| m.micro_usd)
                && b.labels == wanted.labels;
            return if same {
                Ok(false)
            } else {
                Err(LedgerError::BudgetExists(req.budget_id))
            };
        }
        if let Some(b) = self.books.budgets.get(&req.budget_id) {
            let same = b.tenant == tenant
                && b.parent.clone().unwrap_or_default() == wanted.parent_id
                && b.token_limit == wanted.token_limit
                && b.cost_limit == wanted.cost_limit.map(|m| m.micro_usd)
                && b.labels == wanted.labels;
            return if same {
                Ok(false)
            } else {
                Err(LedgerError::BudgetExists(req.budget_id))
            };
        }
        let parent_id = req.parent_id;
        if !parent_id.is_empty() {
            let chain = self.books.chain(&parent_id);
            if chain.is_empty() {
                if self.cold_budget(&parent_id)?.is_some() {
                    // Retired: it was closed.
                    return Err(LedgerError::Closed {
                        budget_id: parent_id.clone(),
                        closed: parent_id,
                    });
                }
                return Err(LedgerError::BudgetNotFound(parent_id));
            }
            if let Some(c) = chain.iter().find(|b| b.closed) {
                return Err(LedgerError::Closed {
                    budget_id: parent_id.clone(),
                    closed: c.id.clone(),
                });
            }
        }
        let now = self.now;
        self.append(|sequence| JournalRecord {
            sequence,
            time: Some(timestamp(now)),
            kind: RecordKind::BudgetCreated as i32,
            budget_id: wanted.budget_id.clone(),
            budget: Some(wanted),
            ..Default::default()
        });
        Ok(true)
    }

    fn update(&mut self, req: UpdateLimitsRequest) -> Result<(), LedgerError> {
        let Some(b) = self.books.budgets.get(&req.budget_id) else {
            if self.cold_budget(&req.budget_id)?.is_some() {
                return Err(LedgerError::Closed {
                    budget_id: req.budget_id.clone(),
                    closed: req.budget_id,
                });
            }
            return Err(LedgerError::BudgetNotFound(req.budget_id));
        };
        let token_limit = if req.remove_token_limit {
            None
        } else {
            req.token_limit.or(b.token_limit)
        };
        let cost_limit = if req.remove_cost_limit {
            None
        } else {
            req.cost_limit.map(|m| m.micro_usd).or(b.cost_limit)
        };
        let now = self.now;
        self.append(|sequence| JournalRecord {
            sequence,
            time: Some(timestamp(now)),
            kind: RecordKind::LimitsUpdated as i32,
            budget_id: req.budget_id.clone(),
            budget: Some(Budget {
                budget_id: req.budget_id.clone(),
                token_limit,
                cost_limit: cost_limit.map(money),
                ..Default::default()
            }),
            ..Default::default()
        });
        Ok(())
    }

    fn close(&mut self, id: &str) -> Result<(), LedgerError> {
        match self.books.budgets.get(id) {
            // Retired: closed long ago.
            None if self.cold_budget(id)?.is_some() => Ok(()),
            None => Err(LedgerError::BudgetNotFound(id.to_owned())),
            Some(b) if b.closed => Ok(()),
            Some(_) => {
                let now = self.now;
                self.append(|sequence| JournalRecord {
                    sequence,
                    time: Some(timestamp(now)),
                    kind: RecordKind::BudgetClosed as i32,
                    budget_id: id.to_owned(),
                    ..Default::default()
                });
                Ok(())
            }
        }
    }

    fn reserve(
        &mut self,
        req: ReserveRequest,
        context: CorrelationContext,
        cost: i64,
        ttl_ms: u64,
    ) -> Result<Reservation, LedgerError> {
        let prior = match self.books.reserve_keys.get(&req.idempotency_key) {
            Some(rid) => self.books.reservations.get(rid).cloned(),
            // A reservation of a retired budget answers too.
            None => match self.cold {
                Some(cold) => match cold.key('r', &req.idempotency_key)? {
                    Some(rid) => cold.reservation(&rid)?,
                    None => None,
                },
                None => None,
            },
        };
        if let Some(res) = prior {
            let same = res.budget_id == req.budget_id
                && res.tokens == req.tokens
                && res.cost == cost
                // A hold's repeat computes its time left from a later
                // clock: the hold placed first answers it.
                && (res.ttl_ms == ttl_ms || res.hold)
                && res.note == req.note
                && res.hold == req.hold
                && res.from_hold == req.hold_id
                && same_work(&res.context, &context);
            if !same {
                return Err(LedgerError::KeyReused {
                    key: req.idempotency_key,
                    what: "reservation",
                });
            }
            return Ok(res.view());
        }
        let fits = if !self.books.budgets.contains_key(&req.budget_id)
            && self.cold_budget(&req.budget_id)?.is_some()
        {
            // Retired: it was closed.
            Err(LedgerError::Closed {
                budget_id: req.budget_id.clone(),
                closed: req.budget_id.clone(),
            })
        } else if !req.hold_id.is_empty() {
            self.check_draw(&req, cost)
        } else {
            check_reserve(self.books, &req.budget_id, req.tokens, cost)
        };
        let now = self.now;
        match fits {
            Ok(()) => {
                let prefix = self.prefix.to_owned();
                let rec = self.append(|sequence| JournalRecord {
                    sequence,
                    time: Some(timestamp(now)),
                    kind: RecordKind::Reserved as i32,
                    budget_id: req.budget_id.clone(),
                    reservation_id: format!("rsv-{prefix}-{sequence}"),
                    tokens: req.tokens,
                    cost: Some(money(cost)),
                    context: Some(context.clone()),
                    idempotency_key: req.idempotency_key.clone(),
                    expires_at: Some(timestamp(now + ttl_ms)),
                    note: req.note.clone(),
                    ttl_ms,
                    hold: req.hold,
                    from_hold: req.hold_id.clone(),
                    ..Default::default()
                });
                let view = self
                    .books
                    .reservations
                    .get(&rec.reservation_id)
                    .map(|r| r.view());
                Ok(view.unwrap_or_default())
            }
            Err(e) => {
                let (refused_by, why) = match &e {
                    LedgerError::Exceeded(r) => (r.refused_by.clone(), r.dimension.to_owned()),
                    LedgerError::Closed { closed, .. } => (closed.clone(), "closed".to_owned()),
                    LedgerError::HoldExhausted { hold_id, .. } => {
                        (hold_id.clone(), "hold".to_owned())
                    }
                    _ => return Err(e),
                };
                // Refusals are journaled for watchers and audits; the
                // caller hears of it once the record is durable.
                self.append(|sequence| JournalRecord {
                    sequence,
                    time: Some(timestamp(now)),
                    kind: RecordKind::Refused as i32,
                    budget_id: req.budget_id.clone(),
                    tokens: req.tokens,
                    cost: Some(money(cost)),
                    context: Some(context.clone()),
                    idempotency_key: req.idempotency_key.clone(),
                    refused_by,
                    reason: why,
                    note: req.note.clone(),
                    ..Default::default()
                });
                tracing::info!(budget_id = %req.budget_id, error = %e, "reservation refused");
                Err(e)
            }
        }
    }

    fn commit(
        &mut self,
        req: CommitRequest,
        key: String,
        cost: i64,
        mut entry: Entry,
        price: UnitPrice,
    ) -> Result<CommitResponse, LedgerError> {
        if let Some(prior) = self.settled_by_key(&key, &req.reservation_id, "commit")? {
            return match prior {
                Settled::Committed(seq) => {
                    let charge = self.sink.charges(self.books, &[seq])?.pop().map(|(_, c)| c);
                    let same = charge.as_ref().is_some_and(|c| {
                        c.entry.tokens == req.tokens
                            && micro(c.entry.total.as_ref()) == cost
                            && c.entry.subtask_id == entry.subtask_id
                            && c.entry.agent_id == entry.agent_id
                            && c.entry.model == entry.model
                            && c.entry.units == entry.units
                            && c.entry.price_per_unit.unwrap_or_default() == price
                            && c.entry.usage == entry.usage
                            && c.entry.input_price == entry.input_price
                            && c.entry.output_price == entry.output_price
                    });
                    match (same, charge) {
                        (true, Some(c)) => Ok(CommitResponse {
                            entry: Some(c.entry),
                            overrun: c.overrun,
                        }),
                        _ => Err(LedgerError::KeyReused {
                            key,
                            what: "commit",
                        }),
                    }
                }
                other => Err(LedgerError::ReservationNotOpen {
                    id: req.reservation_id,
                    state: other.as_str(),
                }),
            };
        }
        let res = self.open_reservation(&req.reservation_id)?;
        if res.hold {
            return Err(crate::invalid(
                "reservation_id",
                format!(
                    "{:?} is a hold, which is never committed: commit the reservations drawn from it (hold_id) and release the hold",
                    res.id
                ),
            ));
        }
        // Usage replaces the reservation on every budget of the chain (what
        // a draw does not use stays there, in its hold).
        let (back_tokens, back_cost) =
            self.books
                .given_back(&res.from_hold, (res.tokens, res.cost), (req.tokens, cost));
        fits_integers(
            &self.books.chain(&res.budget_id),
            req.tokens,
            cost,
            res.tokens - back_tokens,
            res.cost - back_cost,
        )?;
        let over_tokens = req.tokens.saturating_sub(res.tokens);
        let over_cost = (cost - res.cost).max(0);
        let overrun = over_tokens > 0 || over_cost > 0;
        if let Some(b) = self.books.budgets.get(&res.budget_id) {
            switchyard_kit::metrics::global()
                .budget_spent_micro_usd
                .get_or_create(&switchyard_kit::metrics::BudgetLabels {
                    tenant: b.tenant.clone(),
                })
                .inc_by(u64::try_from(cost).unwrap_or(0));
        }
        let now = self.now;
        entry.budget_id = res.budget_id.clone();
        entry.reservation_id = res.id.clone();
        entry.tokens = req.tokens;
        entry.total = Some(money(cost));
        entry.price_per_unit = Some(price);
        entry.time = Some(timestamp(now));
        entry.context = Some(res.context.clone());
        let prefix = self.prefix.to_owned();
        let rec = self.append(|sequence| JournalRecord {
            sequence,
            time: Some(timestamp(now)),
            kind: RecordKind::Committed as i32,
            budget_id: res.budget_id.clone(),
            reservation_id: res.id.clone(),
            tokens: req.tokens,
            cost: Some(money(cost)),
            context: Some(res.context.clone()),
            idempotency_key: key.clone(),
            entry: Some(Entry {
                entry_id: format!("ent-{prefix}-{sequence}"),
                ..entry
            }),
            overrun,
            ..Default::default()
        });
        if overrun {
            self.append(|sequence| JournalRecord {
                sequence,
                time: Some(timestamp(now)),
                kind: RecordKind::Overrun as i32,
                budget_id: res.budget_id.clone(),
                reservation_id: res.id.clone(),
                tokens: over_tokens,
                cost: Some(money(over_cost)),
                context: Some(res.context.clone()),
                reason: format!(
                    "used {} tokens and {} micro-USD against a reservation of {} and {}",
                    req.tokens, cost, res.tokens, res.cost
                ),
                ..Default::default()
            });
            tracing::warn!(
                reservation_id = %res.id,
                budget_id = %res.budget_id,
                over_tokens,
                over_cost,
                "usage exceeded its reservation"
            );
        }
        Ok(CommitResponse {
            entry: rec.entry,
            overrun,
        })
    }

    fn release(&mut self, reservation_id: String, key: String) -> Result<(), LedgerError> {
        match self.settled_by_key(&key, &reservation_id, "release")? {
            Some(Settled::Released) => Ok(()),
            Some(other) => Err(LedgerError::ReservationNotOpen {
                id: reservation_id,
                state: other.as_str(),
            }),
            None => {
                let res = self.open_reservation(&reservation_id)?;
                let now = self.now;
                let (tokens, cost) = res.on_chain();
                self.append(|sequence| JournalRecord {
                    sequence,
                    time: Some(timestamp(now)),
                    kind: RecordKind::Released as i32,
                    budget_id: res.budget_id.clone(),
                    reservation_id: res.id.clone(),
                    tokens,
                    cost: Some(money(cost)),
                    context: Some(res.context.clone()),
                    idempotency_key: key,
                    ..Default::default()
                });
                Ok(())
            }
        }
    }

    /// Releases reservation `id` as expired if it is still open.
    fn expire(&mut self, id: &str) -> bool {
        let Some(res) = self
            .books
            .reservations
            .get(id)
            .filter(|r| r.settled == Settled::Open)
        else {
            return false;
        };
        let (tokens, cost) = res.on_chain();
        let (budget_id, context) = (res.budget_id.clone(), res.context.clone());
        let now = self.now;
        self.append(|sequence| JournalRecord {
            sequence,
            time: Some(timestamp(now)),
            kind: RecordKind::Expired as i32,
            budget_id,
            reservation_id: id.to_owned(),
            tokens,
            cost: Some(money(cost)),
            context: Some(context),
            ..Default::default()
        });
        tracing::info!(reservation_id = %id, "reservation expired and was released");
        true
    }

    /// Whether a draw of `cost` micro-USD and `req.tokens` fits in the hold
    /// it names: an open, unexpired hold on the same budget, whose budget
    /// chain is open, with that much left.
    fn check_draw(&self, req: &ReserveRequest, cost: i64) -> Result<(), LedgerError> {
        let hold_id = &req.hold_id;
        let exhausted = |why: String, left: (u64, i64)| LedgerError::HoldExhausted {
            hold_id: hold_id.clone(),
            why,
            tokens_left: left.0,
            cost_left: left.1,
        };
        let Some(h) = self.books.reservations.get(hold_id) else {
            return match self
                .cold
                .map(|c| c.reservation(hold_id))
                .transpose()?
                .flatten()
            {
                Some(r) => Err(exhausted(format!("is {}", r.settled.as_str()), (0, 0))),
                None => Err(LedgerError::ReservationNotFound(hold_id.clone())),
            };
        };
        if !h.hold || h.budget_id != req.budget_id {
            return Err(crate::invalid(
                "hold_id",
                format!(
                    "{hold_id:?} is not a hold on budget {:?}: draw from a hold (ReserveRequest.hold) on the budget reserved on",
                    req.budget_id
                ),
            ));
        }
        if h.settled != Settled::Open {
            return Err(exhausted(format!("is {}", h.settled.as_str()), (0, 0)));
        }
        if h.expires_ms <= self.now {
            return Err(exhausted(
                format!("lapsed at {}", timestamp(h.expires_ms)),
                (0, 0),
            ));
        }
        if let Some(c) = self.books.chain(&req.budget_id).iter().find(|b| b.closed) {
            return Err(LedgerError::Closed {
                budget_id: req.budget_id.clone(),
                closed: c.id.clone(),
            });
        }
        let left = h.left();
        if req.tokens > left.0 || cost > left.1 {
            return Err(exhausted(
                format!(
                    "cannot give {} tokens and {} micro-USD: {} tokens and {} micro-USD of it are left",
                    req.tokens, cost, left.0, left.1
                ),
                left,
            ));
        }
        Ok(())
    }

    /// The open reservation `id`, or why it cannot be settled (a retired
    /// one was settled long ago).
    fn open_reservation(&self, id: &str) -> Result<crate::books::Res, LedgerError> {
        match self.books.reservations.get(id) {
            None => match self.cold.map(|c| c.reservation(id)).transpose()?.flatten() {
                Some(r) => Err(LedgerError::ReservationNotOpen {
                    id: id.to_owned(),
                    state: r.settled.as_str(),
                }),
                None => Err(LedgerError::ReservationNotFound(id.to_owned())),
            },
            Some(r) if r.settled != Settled::Open => Err(LedgerError::ReservationNotOpen {
                id: id.to_owned(),
                state: r.settled.as_str(),
            }),
            Some(r) => Ok(r.clone()),
        }
    }

    /// How the reservation was settled under `key`, if the key was used
    /// before. A key that settled another reservation is a reuse with
    /// different arguments.
    fn settled_by_key(
        &self,
        key: &str,
        reservation_id: &str,
        what: &'static str,
    ) -> Result<Option<Settled>, LedgerError> {
        let rid = match self.books.settle_keys.get(key) {
            Some(rid) => Some(rid.clone()),
            None => self.cold.map(|c| c.key('s', key)).transpose()?.flatten(),
        };
        match rid {
            None => Ok(None),
            Some(rid) if rid != reservation_id => Err(LedgerError::KeyReused {
                key: key.to_owned(),
                what,
            }),
            Some(rid) => Ok(match self.books.reservations.get(&rid) {
                Some(r) => Some(r.settled),
                None => self
                    .cold
                    .map(|c| c.reservation(&rid))
                    .transpose()?
                    .flatten()
                    .map(|r| r.settled),
            }),
        }
    }
}
