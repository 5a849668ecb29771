//! The spend protocol, the one way anything spends on a budget: [`reserve`]
//! the worst case first (a refusal means the work is not done), then
//! [`Hold::commit`] what was used, with its journal entry, or
//! [`Hold::release`] it. The executor's agent calls, its LLM tasks and the
//! declarative agents all go through here, with keys from [`key`].

use std::fmt::Write as _;

use sha2::{Digest, Sha256};
use switchyard_core::{Reason, validate};
use switchyard_kit::error::ApiError;
use switchyard_proto::common::v1::{CorrelationContext, Money, TokenUsage, UnitPrice};
use switchyard_proto::ledger::v1::{
    CommitRequest, CommitResponse, Entry, RateClaim, ReleaseRequest, ReserveRequest,
};
use tonic::Status;

use crate::LedgerClient;

/// What a spend report's group reads as when its charges did not say
/// (an empty key): the CLI's tables and the console say the same.
pub fn unnamed_group(by: switchyard_proto::ledger::v1::GroupBy) -> &'static str {
    use switchyard_proto::ledger::v1::GroupBy;
    match by {
        GroupBy::Model => "(no model)",
        GroupBy::Capability => "(no capability)",
        GroupBy::Job => "(outside a job)",
        GroupBy::Agent => "(no agent)",
        _ => "(unknown)",
    }
}

/// A report bucket's length as a word (`minute`, `hour`, `day`).
pub fn interval_name(i: switchyard_proto::ledger::v1::Interval) -> &'static str {
    use switchyard_proto::ledger::v1::Interval;
    match i {
        Interval::Minute => "minute",
        Interval::Hour => "hour",
        _ => "day",
    }
}

/// The journal entry of one LLM call: prompt and completion tokens priced
/// apart, so `input × input_price + output × output_price` is the line's
/// total; `units` is their sum and `price_per_unit` the effective price
/// (rounded up) for readers that know only one price. `tokens` is
/// `(prompt, completion, total)`, `prices` per million `(input, output)`.
pub fn llm_entry(
    task_id: &str,
    agent_id: &str,
    model: &str,
    tokens: (u64, u64, u64),
    prices: (i64, i64),
) -> Entry {
    let (input, output, total) = tokens;
    let micro_times_million =
        i128::from(input) * i128::from(prices.0) + i128::from(output) * i128::from(prices.1);
    let effective = match i128::from(total) {
        0 => prices.0.max(prices.1),
        t => i64::try_from((micro_times_million + t - 1) / t).unwrap_or(i64::MAX),
    };
    Entry {
        subtask_id: task_id.into(),
        agent_id: agent_id.into(),
        model: model.into(),
        units: total,
        price_per_unit: Some(UnitPrice {
            micro_usd_per_million: effective,
        }),
        usage: Some(TokenUsage {
            input_tokens: input,
            output_tokens: output,
            total_tokens: total,
        }),
        input_price: Some(UnitPrice {
            micro_usd_per_million: prices.0,
        }),
        output_price: Some(UnitPrice {
            micro_usd_per_million: prices.1,
        }),
        ..Default::default()
    }
}

/// Longest idempotency key the ledger accepts.
const MAX_KEY: usize = 128;

/// An idempotency key from its parts, joined by `/`: the same parts give the
/// same key, so a retried call (after a restart, say) is answered, not
/// repeated. Parts come from clients and providers (job ids, tool-call ids),
/// so a key that would be too long or use characters the ledger refuses
/// keeps a readable prefix and ends in a hash of the whole.
pub fn key(parts: &[&str]) -> String {
    let whole = parts.join("/");
    if validate::key(&whole, "key").is_ok() {
        return whole;
    }
    let digest = Sha256::digest(whole.as_bytes());
    let mut hash = String::with_capacity(32);
    for b in &digest[..16] {
        let _ = write!(hash, "{b:02x}");
    }
    let readable: String = whole
        .chars()
        .map(|c| if validate::key_char(c) { c } else { '_' })
        .take(MAX_KEY - hash.len() - 1)
        .collect();
    let readable = readable.trim_start_matches(|c: char| !validate::key_start(c));
    if readable.is_empty() {
        hash
    } else {
        format!("{readable}-{hash}")
    }
}

/// What to hold.
#[derive(Debug, Clone)]
pub struct HoldRequest {
    /// The budget to hold on (its ancestors are held too).
    pub budget_id: String,
    /// Tokens to hold.
    pub tokens: u64,
    /// Cost to hold, micro-USD.
    pub cost_micro_usd: i64,
    /// From [`key`]; the same key gives the same hold.
    pub key: String,
    /// Where the spending comes from.
    pub context: CorrelationContext,
    /// A note for the ledger's readers.
    pub note: String,
    /// An agent's invocation grant (`InvocationContext.grant`), kept by
    /// the hold for its commit or release; empty for people and services.
    pub grant: String,
    /// Draw from this ledger hold (an approval's scope) instead of the
    /// budget chain; empty: reserve on the chain.
    pub from_hold: String,
    /// A model call's upstream use, for the provider rate limits (taken in
    /// the same step as the money, or nothing is).
    pub rate: Option<RateClaim>,
}

/// What a budget refusal ran out of, and by how much: from the ledger's
/// `ErrorInfo` (`dimension`, the amounts requested and remaining).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shortfall {
    /// True when money ran out; else tokens did.
    pub money: bool,
    /// Tokens the hold needed beyond what was left (0 when tokens fit).
    pub tokens: u64,
    /// Micro-USD the hold needed beyond what was left (0 when money fit).
    pub micro_usd: i64,
    /// True when an approval's scope (a ledger hold drawn from) ran out,
    /// not the budget itself.
    pub scope: bool,
}

impl Shortfall {
    /// Read from a `BUDGET_EXCEEDED` refusal's metadata.
    pub fn from_metadata(md: &std::collections::HashMap<String, String>) -> Shortfall {
        let num = |k: &str| md.get(k).and_then(|v| v.parse::<i64>().ok());
        let short = |asked: &str, left: &str| match (num(asked), num(left)) {
            (Some(a), Some(l)) => (a - l).max(0),
            // Unlimited (or not said): nothing short on that dimension.
            _ => 0,
        };
        Shortfall {
            money: md.get("dimension").is_some_and(|d| d == "cost"),
            tokens: short("tokens_requested", "tokens_remaining") as u64,
            micro_usd: short("cost_requested_micro_usd", "cost_remaining_micro_usd"),
            scope: false,
        }
    }

    /// Read from a `HOLD_EXHAUSTED` refusal of a draw of `tokens` and
    /// `micro_usd`: what the hold lacked (all of it once the hold lapsed).
    pub fn from_hold(
        md: &std::collections::HashMap<String, String>,
        tokens: u64,
        micro_usd: i64,
    ) -> Shortfall {
        let num = |k: &str| md.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        let short_tokens = (tokens as i64 - num("tokens_left")).max(0) as u64;
        let short_money = (micro_usd - num("cost_left_micro_usd")).max(0);
        Shortfall {
            money: short_money > 0 && short_tokens == 0,
            tokens: short_tokens,
            micro_usd: short_money,
            scope: true,
        }
    }

    /// The reason a task stopped by this refusal carries: money or tokens.
    pub fn reason(&self) -> Reason {
        if self.money {
            Reason::AgentCostBudgetExceeded
        } else {
            Reason::AgentTokenBudgetExceeded
        }
    }
}

/// Why nothing was held.
#[derive(Debug, Clone)]
pub enum Refusal {
    /// A budget on the chain has not enough left: the work must not run.
    Budget {
        /// The budget that refused.
        refused_by: String,
        /// The ledger's words.
        message: String,
        /// What ran out, with how much more the hold needed.
        short: Shortfall,
    },
    /// A provider rate limit has no room for the call now (ask again after
    /// `retry_after_ms`) or ever (`None`); nothing was reserved.
    RateLimited {
        /// The ledger's words.
        message: String,
        /// When to ask again, ms; `None`: the call can never fit.
        retry_after_ms: Option<u64>,
        /// The limit that refused (empty: an upstream key's cooldown).
        limit: String,
        /// Its bucket's scope (`shared`, `tenant:<t>`, `key:<k>`, …).
        scope: String,
    },
    /// The ledger refused for another reason (not the budget).
    Unavailable(String),
    /// The ledger could not be reached ([`switchyard_kit::error::is_outage`]):
    /// nothing was decided, and the same request may be repeated.
    Unreachable(Status),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Budget { message, .. } => {
                write!(f, "the budget refused the reservation: {message}")
            }
            Refusal::RateLimited { message, .. } => write!(f, "{message}"),
            Refusal::Unavailable(m) => write!(f, "ledger: {m}"),
            Refusal::Unreachable(s) => write!(f, "ledger unreachable: {}", s.message()),
        }
    }
}

/// A reservation: commit what was used, or release it. Dropping a hold
/// leaves it to the reservation's TTL.
#[derive(Debug, Clone)]
pub struct Hold {
    ledger: LedgerClient,
    id: String,
    grant: String,
    rate: Option<RateClaim>,
}

/// Reserves `r` on its budget chain, all or nothing.
pub async fn reserve(ledger: &LedgerClient, r: HoldRequest) -> Result<Hold, Refusal> {
    let reserved = ledger
        .reserve(ReserveRequest {
            budget_id: r.budget_id.clone(),
            tokens: r.tokens,
            cost: Some(Money {
                micro_usd: r.cost_micro_usd,
            }),
            idempotency_key: r.key,
            ttl: None,
            context: Some(r.context),
            note: r.note,
            invocation_grant: r.grant.clone(),
            hold: false,
            hold_id: r.from_hold.clone(),
            rate: r.rate.clone(),
        })
        .await;
    match reserved {
        Ok(res) => Ok(Hold {
            ledger: ledger.clone(),
            id: res.reservation.unwrap_or_default().reservation_id,
            grant: r.grant,
            rate: r.rate,
        }),
        Err(e) if switchyard_kit::error::is_outage(&e) => Err(Refusal::Unreachable(e)),
        Err(e) => {
            let api = ApiError::from(e);
            if api.known_reason() == Some(Reason::HoldExhausted) {
                // The hold stands on the budget the draw was made on.
                return Err(Refusal::Budget {
                    refused_by: r.budget_id,
                    short: Shortfall::from_hold(&api.metadata, r.tokens, r.cost_micro_usd),
                    message: format!("the approved scope is spent: {}", api.message),
                });
            }
            if api.known_reason() == Some(Reason::RateLimited) {
                let md = |k: &str| api.metadata.get(k).cloned().unwrap_or_default();
                return Err(Refusal::RateLimited {
                    retry_after_ms: api
                        .metadata
                        .get("retry_after_ms")
                        .and_then(|v| v.parse().ok()),
                    limit: md("limit"),
                    scope: md("scope"),
                    message: api.message,
                });
            }
            if api.known_reason() == Some(Reason::BudgetExceeded) {
                let refused_by = api.metadata.get("refused_by").cloned().unwrap_or_default();
                Err(Refusal::Budget {
                    refused_by,
                    short: Shortfall::from_metadata(&api.metadata),
                    message: api.message,
                })
            } else {
                Err(Refusal::Unavailable(api.message))
            }
        }
    }
}

impl Hold {
    /// The hold on reservation `id` (made earlier, e.g. by a loop that
    /// passes holds around by id).
    pub fn resume(ledger: &LedgerClient, id: &str) -> Hold {
        Hold {
            ledger: ledger.clone(),
            id: id.to_owned(),
            grant: String::new(),
            rate: None,
        }
    }

    /// This hold, settling the rate claim `rate` (its `tokens`: what the
    /// call used upstream, 0 when another model answered).
    pub fn with_rate(self, rate: Option<RateClaim>) -> Hold {
        Hold { rate, ..self }
    }

    /// This hold, settled under an agent's invocation grant.
    pub fn under_grant(self, grant: &str) -> Hold {
        Hold {
            grant: grant.to_owned(),
            ..self
        }
    }

    /// The reservation id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Commits what was used, with its journal entry (idempotent).
    pub async fn commit(
        &self,
        tokens: u64,
        cost_micro_usd: i64,
        entry: Entry,
    ) -> Result<CommitResponse, Status> {
        self.ledger
            .commit(CommitRequest {
                reservation_id: self.id.clone(),
                tokens,
                cost: Some(Money {
                    micro_usd: cost_micro_usd,
                }),
                entry: Some(entry),
                idempotency_key: format!("commit-{}", self.id),
                invocation_grant: self.grant.clone(),
                rate: self.rate.clone(),
            })
            .await
    }

    /// Releases the hold unused (idempotent). A reservation already
    /// committed, released or expired holds nothing: that is success.
    pub async fn release(&self) -> Result<(), Status> {
        let r = self
            .ledger
            .release(ReleaseRequest {
                reservation_id: self.id.clone(),
                idempotency_key: format!("release-{}", self.id),
                invocation_grant: self.grant.clone(),
                rate: self.rate.clone(),
            })
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    ApiError::from(e.clone()).known_reason(),
                    Some(Reason::ReservationNotOpen | Reason::ReservationNotFound)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// The rate claims of one agent loop's model calls: where the next call
/// goes (`aim`), and the claim each open hold made, until it is settled.
#[derive(Debug, Default)]
pub struct RateClaims {
    aimed: std::sync::Mutex<Option<RateClaim>>,
    held: std::sync::Mutex<std::collections::HashMap<String, RateClaim>>,
    /// The model call being made and its most tokens.
    current: std::sync::Mutex<(u32, u64)>,
    /// Holds of no money that claimed room for later calls of the current
    /// model call (fallbacks, later rounds).
    extra: std::sync::Mutex<Vec<(String, RateClaim)>>,
}

impl RateClaims {
    /// The next call goes to `provider`'s `model` through upstream key `key`.
    pub fn aim(&self, provider: &str, model: &str, key: &str) {
        let claim = RateClaim {
            provider: provider.to_owned(),
            model: model.to_owned(),
            key: key.to_owned(),
            tokens: 0,
        };
        *self.aimed.lock().unwrap_or_else(|p| p.into_inner()) = Some(claim);
    }

    /// The claim for model call `call`, of at most `tokens`.
    pub fn claim(&self, call: u32, tokens: u64) -> Option<RateClaim> {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = (call, tokens);
        let aimed = self.aimed.lock().unwrap_or_else(|p| p.into_inner());
        aimed.clone().map(|c| RateClaim { tokens, ..c })
    }

    /// Hold `hold` was made with `claim`.
    pub fn held(&self, hold: &str, claim: Option<RateClaim>) {
        if let Some(c) = claim {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.insert(hold.to_owned(), c);
        }
    }

    /// The claim for a later call of the current model call, to
    /// `provider`'s `model` through `key`, and that model call's number.
    pub fn again(&self, provider: &str, model: &str, key: &str) -> (u32, RateClaim) {
        let (call, tokens) = *self.current.lock().unwrap_or_else(|p| p.into_inner());
        let claim = RateClaim {
            provider: provider.to_owned(),
            model: model.to_owned(),
            key: key.to_owned(),
            tokens,
        };
        (call, claim)
    }

    /// Hold `hold` (of no money) claimed room for a later call.
    pub fn extra(&self, hold: &str, claim: RateClaim) {
        let mut extra = self.extra.lock().unwrap_or_else(|p| p.into_inner());
        extra.push((hold.to_owned(), claim));
    }

    /// How many later calls the current model call has claimed room for.
    pub fn extras(&self) -> usize {
        self.extra.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// How model call `hold` settles: the claim to commit or release the
    /// hold with, and the holds of no money its later calls (fallbacks,
    /// later rounds) made, each with the claim to release it with. The last
    /// call made is the one that answered: it used `used` tokens when it
    /// went to `model` (`None`: no call answered); every other used none.
    pub fn settle(
        &self,
        hold: &str,
        model: Option<&str>,
        used: u64,
    ) -> (Option<RateClaim>, Vec<(String, RateClaim)>) {
        let answered = |c: &RateClaim, last: bool| {
            let tokens = if last && model == Some(c.model.as_str()) {
                used
            } else {
                0
            };
            RateClaim {
                tokens,
                ..c.clone()
            }
        };
        let mut extra = self.extra.lock().unwrap_or_else(|p| p.into_inner());
        let n = extra.len();
        let extras = extra
            .drain(..)
            .enumerate()
            .map(|(i, (h, c))| (h, answered(&c, i + 1 == n)))
            .collect();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let first = held.remove(hold).map(|c| answered(&c, n == 0));
        (first, extras)
    }
}

/// How long to wait before asking again after a rate-limit refusal that
/// said `retry_after_ms`: that long, but at most a second (a waiting call
/// asks again at least once a second, so the limit counts it as waiting
/// when it shares room fairly between tenants).
pub fn rate_pause(retry_after_ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(retry_after_ms.clamp(1, 1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_fit_are_kept_as_they_are() {
        assert_eq!(key(&["job-1", "t", "1", "agent_x"]), "job-1/t/1/agent_x");
    }

    #[test]
    fn long_or_foreign_keys_stay_valid_distinct_and_stable() {
        let id = "call__0_agent_summarizer_cmpl-0b5b3e53-5f0e-4c3e-9d55-0d5d0e7c2b7a";
        let a = key(&[
            "01a206cf-e166-71cd-b879-5971accf9e08",
            "agent",
            "1/tool",
            id,
            "agent_summarizer",
        ]);
        let b = key(&[
            "01a206cf-e166-71cd-b879-5971accf9e08",
            "agent",
            "1/tool",
            id,
            "agent_other",
        ]);
        for k in [&a, &b] {
            assert!(switchyard_core::validate::key(k, "key").is_ok(), "{k}");
        }
        assert_ne!(a, b);
        assert_eq!(
            a,
            key(&[
                "01a206cf-e166-71cd-b879-5971accf9e08",
                "agent",
                "1/tool",
                id,
                "agent_summarizer"
            ])
        );
        let odd = key(&["job", "t", "call id with spaces+ü"]);
        assert!(switchyard_core::validate::key(&odd, "key").is_ok(), "{odd}");
        assert!(odd.starts_with("job/t/call_id"), "{odd}");
        let all_odd = key(&["~~~"]);
        assert!(
            switchyard_core::validate::key(&all_odd, "key").is_ok(),
            "{all_odd}"
        );
    }
}
