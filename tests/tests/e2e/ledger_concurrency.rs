//! 64 concurrent callers over gRPC on one hot budget and on siblings sharing
//! a parent, with random reserve/commit/release: no budget is ever
//! overspent, every refusal is BUDGET_EXCEEDED, and at the end the balances
//! equal both what the callers were acknowledged and the journal's entries.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use switchyard_core::Reason;
use switchyard_kit::error::ApiError;
use switchyard_proto::common::v1::Money;
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_proto::ledger::v1::*;
use switchyard_testkit::Stack;

use crate::common::budget;

/// xorshift64*: a small deterministic generator per task.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

const BUDGETS: [(&str, &str, Option<u64>, Option<i64>); 5] = [
    ("org", "", Some(60_000), Some(60_000)),
    ("org/hot", "org", Some(20_000), None),
    ("org/b1", "org", None, Some(15_000)),
    ("org/b2", "org", None, None),
    ("org/b3", "org", Some(10_000), Some(10_000)),
];

#[derive(Default, Clone, Copy, Debug, PartialEq)]
struct Tally {
    reserved_tokens: i64,
    reserved_cost: i64,
    spent_tokens: i64,
    spent_cost: i64,
}

fn within_limits(b: &Budget) -> bool {
    let tokens = b.tokens_spent + b.tokens_reserved;
    let cost = b.cost_spent.unwrap().micro_usd + b.cost_reserved.unwrap().micro_usd;
    b.token_limit.is_none_or(|l| tokens <= l) && b.cost_limit.is_none_or(|l| cost <= l.micro_usd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_callers_never_overspend_and_balances_add_up() {
    let stack = Stack::start().await.unwrap();
    let ch = stack.channel().await.unwrap();
    let mut c = LedgerServiceClient::new(ch.clone());
    for (id, parent, tokens, cost) in BUDGETS {
        c.create_budget(CreateBudgetRequest {
            budget_id: id.into(),
            parent_id: parent.into(),
            token_limit: tokens,
            cost_limit: cost.map(|micro_usd| Money { micro_usd }),
            ..Default::default()
        })
        .await
        .unwrap();
    }

    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (mut c, done) = (c.clone(), done.clone());
        tokio::spawn(async move {
            let mut checks = 0;
            while !done.load(Ordering::Relaxed) {
                for (id, ..) in BUDGETS {
                    let b = budget(&mut c, id).await;
                    assert!(within_limits(&b), "overspent while under load: {b:?}");
                }
                checks += 1;
            }
            checks
        })
    };

    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let mut c = LedgerServiceClient::new(ch.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
            // Half the callers hammer the hot budget, the rest its siblings.
            let target = if t % 2 == 0 {
                "org/hot"
            } else {
                ["org/b1", "org/b2", "org/b3"][(t / 2 % 3) as usize]
            };
            let mut tally = Tally::default();
            let (mut refused, mut open) = (0u32, Vec::new());
            for i in 0..120 {
                let (tokens, cost) = (1 + rng.below(800), 1 + rng.below(800) as i64);
                let r = c
                    .reserve(ReserveRequest {
                        budget_id: target.into(),
                        tokens,
                        cost: Some(Money { micro_usd: cost }),
                        idempotency_key: format!("t{t}-{i}"),
                        ..Default::default()
                    })
                    .await;
                match r {
                    Err(s) => {
                        let e = ApiError::from(s);
                        assert_eq!(e.known_reason(), Some(Reason::BudgetExceeded), "{e}");
                        refused += 1;
                    }
                    Ok(r) => open.push((
                        r.into_inner().reservation.unwrap().reservation_id,
                        tokens,
                        cost,
                    )),
                }
                // Settle a random open reservation now and then.
                if !open.is_empty() && rng.below(3) > 0 {
                    let (rid, tokens, cost) =
                        open.swap_remove(rng.below(open.len() as u64) as usize);
                    if rng.below(4) == 0 {
                        c.release(ReleaseRequest {
                            reservation_id: rid,
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    } else {
                        let (used_t, used_c) =
                            (rng.below(tokens + 1), rng.below(cost as u64 + 1) as i64);
                        c.commit(CommitRequest {
                            reservation_id: rid,
                            tokens: used_t,
                            cost: Some(Money { micro_usd: used_c }),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                        tally.spent_tokens += used_t as i64;
                        tally.spent_cost += used_c;
                    }
                }
            }
            for (_, tokens, cost) in &open {
                tally.reserved_tokens += *tokens as i64;
                tally.reserved_cost += *cost;
            }
            (target, tally, refused)
        }));
    }
    let mut expected: HashMap<&str, Tally> = HashMap::new();
    let mut refusals = 0;
    for t in tasks {
        let (target, tally, refused) = t.await.unwrap();
        refusals += refused;
        for id in [target, "org"] {
            let e = expected.entry(id).or_default();
            e.reserved_tokens += tally.reserved_tokens;
            e.reserved_cost += tally.reserved_cost;
            e.spent_tokens += tally.spent_tokens;
            e.spent_cost += tally.spent_cost;
        }
    }
    done.store(true, Ordering::Relaxed);
    assert!(monitor.await.unwrap() > 0);
    assert!(refusals > 0, "the limits were meant to be hit");

    for (id, ..) in BUDGETS {
        let b = budget(&mut c, id).await;
        assert!(within_limits(&b), "{b:?}");
        let got = Tally {
            reserved_tokens: b.tokens_reserved as i64,
            reserved_cost: b.cost_reserved.unwrap().micro_usd,
            spent_tokens: b.tokens_spent as i64,
            spent_cost: b.cost_spent.unwrap().micro_usd,
        };
        assert_eq!(
            got,
            expected.get(id).copied().unwrap_or_default(),
            "{id}: balances equal what callers were acknowledged"
        );
        let journal = c
            .list_entries(ListEntriesRequest {
                budget_id: id.into(),
                page_size: 1,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (journal.total_tokens, journal.total_cost.unwrap().micro_usd),
            (b.tokens_spent, b.cost_spent.unwrap().micro_usd),
            "{id}: the journal adds up to the balance"
        );
    }
    stack.stop().await.unwrap();
}
