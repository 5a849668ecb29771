use super::*;
use std::collections::HashMap;
use switchyard_core::ManualClock;
use switchyard_kit::error::ApiError;
use switchyard_proto::common::v1::Money;
use switchyard_proto::ledger::v1::JournalRecord;

struct Fixture {
    ledger: Ledger,
    clock: ManualClock,
    _trigger: switchyard_kit::shutdown::Trigger,
}

/// The store at `path`, opened again after a drop in this process.
async fn reopen(path: &std::path::Path) -> Store {
    Store::reopen(path, std::time::Duration::from_secs(5))
        .await
        .unwrap()
}

fn cfg() -> LedgerConfig {
    LedgerConfig {
        prices: BTreeMap::from([(
            "gpt-4o-mini".to_owned(),
            PriceConfig {
                input_micro_usd_per_million: 150_000,
                output_micro_usd_per_million: 600_000,
            },
        )]),
        // Calls to provider `p` (only calls that claim room count).
        limits: vec![
            rates::LimitConfig {
                name: "p-rpm".into(),
                provider: "p".into(),
                requests_per_minute: Some(2),
                ..Default::default()
            },
            rates::LimitConfig {
                name: "p-per-tenant".into(),
                provider: "p".into(),
                per: rates::Per::Tenant,
                tokens_per_minute: Some(10_000),
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

fn fixture_on(store: Store, clock: ManualClock) -> Fixture {
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let ledger = Ledger::open(cfg(), store, Arc::new(clock.clone()), shutdown).unwrap();
    Fixture {
        ledger,
        clock,
        _trigger: trigger,
    }
}

fn fixture() -> Fixture {
    fixture_on(
        Store::temporary().unwrap(),
        ManualClock::new(1_700_000_000_000),
    )
}

impl Ledger {
    /// The sled backend's state (tests that look inside it).
    fn sled(&self) -> &Sled {
        match &self.inner.backend {
            Backend::Sled(s) => s,
            Backend::Pg(_) => panic!("not a sled ledger"),
        }
    }
}

/// A ledger on a fresh database of the shared throwaway PostgreSQL
/// cluster, or `None` (said on stderr) when the run skips PostgreSQL.
async fn pg_fixture() -> Option<Fixture> {
    let url = switchyard_testkit::pg::fresh_database()?;
    Some(pg_replica(&url, &ManualClock::new(1_700_000_000_000)).await)
}

/// A ledger replica on database `url` with `clock`.
async fn pg_replica(url: &str, clock: &ManualClock) -> Fixture {
    let db = switchyard_store::pg::Pg::connect(&switchyard_store::pg::PgConfig {
        url: url.to_owned(),
        pool_size: 8,
        ..Default::default()
    })
    .await
    .unwrap();
    let clock = clock.clone();
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let ledger = Ledger::open_pg(cfg(), db, Arc::new(clock.clone()), shutdown)
        .await
        .unwrap();
    Fixture {
        ledger,
        clock,
        _trigger: trigger,
    }
}

switchyard_testkit::on_both_backends!(
    fixture, pg_fixture;
    reservation_must_fit_every_ancestor_and_a_refusal_changes_nothing,
    commit_journals_the_entry_releases_the_rest_and_rolls_spend_up,
    cost_is_computed_from_units_and_price_when_not_given,
    overrun_is_recorded_and_blocks_the_budget_until_raised,
    lowering_a_limit_below_spend_is_allowed_and_blocks_new_reservations,
    closed_budgets_refuse_reservations_and_children_but_settle_open_ones,
    create_is_idempotent_for_identical_settings_only,
    retried_calls_never_double_count_and_reused_keys_are_refused,
    expired_reservations_are_released_by_the_sweeper_with_an_event,
    entries_come_in_the_aitp_shape_by_budget_subtree_job_and_correlation,
    spend_rolls_up_from_closed_jobs_through_open_projects_and_reports_by_person_and_project,
    bad_input_is_refused_with_every_field_named,
    watch_streams_durable_events_of_a_budget_subtree_and_resumes,
    sums_that_would_overflow_are_refused_never_saturated,
    a_hold_keeps_its_amount_from_others_and_gives_it_out_only_to_its_draws,
    a_rate_refusal_reserves_no_money_and_a_budget_refusal_takes_no_rate_room,
    limits_are_listed_per_tenant_with_other_tenants_waiting_calls_unnamed,
);

/// A watch of `budget` (or everything, for "") after `after`, as the
/// in-process principal.
async fn watch(
    l: &Ledger,
    budget: impl Into<String>,
    after: u64,
) -> Result<futures_util::stream::BoxStream<'static, Result<WatchResponse, Status>>, LedgerError> {
    l.watch_stream(
        WatchRequest {
            budget_id: budget.into(),
            after_sequence: after,
        },
        std::sync::Arc::new(switchyard_kit::auth::Principal::in_process()),
    )
    .await
}

fn usd(micro_usd: i64) -> Option<Money> {
    Some(Money { micro_usd })
}

async fn budget(l: &Ledger, id: &str, parent: &str, tokens: Option<u64>, cost: Option<i64>) {
    l.create_budget(CreateBudgetRequest {
        budget_id: id.into(),
        parent_id: parent.into(),
        token_limit: tokens,
        cost_limit: cost.map(|c| Money { micro_usd: c }),
        labels: Default::default(),
    })
    .await
    .unwrap();
}

fn reserve_req(budget: &str, tokens: u64, cost: i64, key: &str) -> ReserveRequest {
    ReserveRequest {
        budget_id: budget.into(),
        tokens,
        cost: usd(cost),
        idempotency_key: key.into(),
        context: Some(CorrelationContext {
            correlation_id: "corr-1".into(),
            job_id: "job-1".into(),
            task_id: "t1".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn reserve(
    l: &Ledger,
    budget: &str,
    tokens: u64,
    cost: i64,
    key: &str,
) -> Result<Reservation, LedgerError> {
    l.reserve(reserve_req(budget, tokens, cost, key), "corr-x")
        .await
}

async fn release(l: &Ledger, rid: &str) {
    l.release(ReleaseRequest {
        reservation_id: rid.into(),
        ..Default::default()
    })
    .await
    .unwrap();
}

fn commit_req(rid: &str, tokens: u64, cost: i64) -> CommitRequest {
    CommitRequest {
        invocation_grant: Default::default(),
        reservation_id: rid.into(),
        tokens,
        cost: usd(cost),
        entry: Some(Entry {
            subtask_id: "subtask_1".into(),
            agent_id: "agent_1".into(),
            model: "gpt-4o-mini".into(),
            units: tokens,
            price_per_unit: Some(UnitPrice {
                micro_usd_per_million: 10_000_000,
            }),
            ..Default::default()
        }),
        idempotency_key: String::new(),
        rate: None,
    }
}

fn hold_req(budget: &str, tokens: u64, cost: i64, key: &str) -> ReserveRequest {
    ReserveRequest {
        hold: true,
        ..reserve_req(budget, tokens, cost, key)
    }
}

fn draw_req(hold: &str, budget: &str, tokens: u64, cost: i64, key: &str) -> ReserveRequest {
    ReserveRequest {
        hold_id: hold.into(),
        ..reserve_req(budget, tokens, cost, key)
    }
}

/// Tokens and money reserved, and tokens and money spent, of budget `id`.
async fn balances(l: &Ledger, id: &str) -> (u64, i64, u64, i64) {
    let b = l.budget(id).await.unwrap();
    (
        b.tokens_reserved,
        micro(b.cost_reserved.as_ref()),
        b.tokens_spent,
        micro(b.cost_spent.as_ref()),
    )
}

async fn a_hold_keeps_its_amount_from_others_and_gives_it_out_only_to_its_draws(f: Fixture) {
    let l = &f.ledger;
    budget(l, "team", "", Some(1_000), Some(1_000)).await;
    budget(l, "team/job", "team", None, None).await;
    budget(l, "team/other", "team", None, None).await;
    // The approved scope: 600 tokens and 600 micro-USD held at once.
    let h = l
        .reserve(hold_req("team/job", 600, 600, "scope"), "c")
        .await
        .unwrap();
    assert!(h.hold);
    assert_eq!((h.tokens_left, micro(h.cost_left.as_ref())), (600, 600));
    assert_eq!(balances(l, "team").await, (600, 600, 0, 0));
    // Nothing else can take it: another job gets only the rest.
    let err = api(reserve(l, "team/other", 500, 0, "o1").await.unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::BudgetExceeded));
    let other = reserve(l, "team/other", 400, 400, "o2").await.unwrap();

    // Draws come out of the hold; the chain's totals do not move.
    let d1 = l
        .reserve(draw_req(&h.reservation_id, "team/job", 250, 250, "d1"), "c")
        .await
        .unwrap();
    assert_eq!(d1.from_hold, h.reservation_id);
    assert_eq!(balances(l, "team").await, (1_000, 1_000, 0, 0));
    let d2 = l
        .reserve(draw_req(&h.reservation_id, "team/job", 300, 300, "d2"), "c")
        .await
        .unwrap();
    // More than is left is refused, with what is left.
    let err = api(l
        .reserve(draw_req(&h.reservation_id, "team/job", 100, 10, "d3"), "c")
        .await
        .unwrap_err());
    assert_eq!(err.code, Code::ResourceExhausted);
    assert_eq!(err.known_reason(), Some(Reason::HoldExhausted));
    assert_eq!(err.metadata["tokens_left"], "50");
    assert_eq!(err.metadata["cost_left_micro_usd"], "50");
    assert!(
        err.message.contains("50 tokens and 50 micro-USD"),
        "{}",
        err.message
    );

    // A commit spends from the draw and gives the unspent part back to the
    // hold, which still keeps it from the others.
    l.commit(commit_req(&d1.reservation_id, 100, 100))
        .await
        .unwrap();
    assert_eq!(balances(l, "team/job").await, (500, 500, 100, 100));
    assert_eq!(balances(l, "team").await, (900, 900, 100, 100));
    l.release(ReleaseRequest {
        reservation_id: d2.reservation_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let d4 = l
        .reserve(draw_req(&h.reservation_id, "team/job", 500, 500, "d4"), "c")
        .await
        .unwrap();
    // A hold is never committed directly.
    let err = api(l
        .commit(commit_req(&h.reservation_id, 1, 1))
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::InvalidArgument));
    // Released, the hold frees what is left undrawn; an open draw keeps its
    // own amount and, settled later, frees it on the chain.
    l.release(ReleaseRequest {
        reservation_id: h.reservation_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(balances(l, "team/job").await, (500, 500, 100, 100));
    let err = api(l
        .reserve(draw_req(&h.reservation_id, "team/job", 1, 1, "d5"), "c")
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::HoldExhausted));
    assert!(err.message.contains("released"), "{}", err.message);
    l.commit(commit_req(&d4.reservation_id, 200, 200))
        .await
        .unwrap();
    assert_eq!(balances(l, "team/job").await, (0, 0, 300, 300));
    l.commit(commit_req(&other.reservation_id, 400, 400))
        .await
        .unwrap();
    assert_eq!(balances(l, "team").await, (0, 0, 700, 700));

    // A draw must name a hold on its own budget.
    let plain = reserve(l, "team/job", 1, 1, "plain").await.unwrap();
    let err = api(l
        .reserve(draw_req(&plain.reservation_id, "team/job", 1, 1, "d6"), "c")
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::InvalidArgument));
    let h2 = l
        .reserve(hold_req("team/job", 10, 10, "scope-2"), "c")
        .await
        .unwrap();
    let err = api(l
        .reserve(draw_req(&h2.reservation_id, "team/other", 1, 1, "d7"), "c")
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::InvalidArgument));
    // A lapsed hold gives nothing, even before the sweeper ran.
    f.clock.advance_ms(24 * 3_600_000);
    let err = api(l
        .reserve(draw_req(&h2.reservation_id, "team/job", 1, 1, "d8"), "c")
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::HoldExhausted));
    assert!(
        err.message.contains("lapsed") || err.message.contains("expired"),
        "{}",
        err.message
    );
    // Live balances are the replay of the journal.
    assert_eq!(
        l.budgets().await.unwrap(),
        l.replayed_budgets().await.unwrap()
    );
}

fn api(e: LedgerError) -> ApiError {
    ApiError::from(Status::from(e))
}

async fn reservation_must_fit_every_ancestor_and_a_refusal_changes_nothing(f: Fixture) {
    let l = &f.ledger;
    budget(l, "org", "", Some(1_000), None).await;
    budget(l, "org/proj", "org", Some(10_000), Some(5_000_000)).await;
    budget(l, "org/proj/job", "org/proj", None, None).await;

    reserve(l, "org/proj/job", 600, 100, "k1").await.unwrap();
    let before = l.budgets().await.unwrap();
    let err = api(reserve(l, "org/proj/job", 500, 100, "k2")
        .await
        .unwrap_err());
    assert_eq!(err.code, Code::ResourceExhausted);
    assert_eq!(err.known_reason(), Some(Reason::BudgetExceeded));
    assert_eq!(err.metadata["refused_by"], "org");
    assert_eq!(err.metadata["budget_id"], "org/proj/job");
    assert_eq!(err.metadata["dimension"], "tokens");
    assert_eq!(err.metadata["tokens_remaining"], "400");
    assert_eq!(err.metadata["cost_remaining_micro_usd"], "unlimited");
    assert!(err.message.contains("an ancestor of"), "{}", err.message);
    // The refusal is journaled in the refused budget's chain: its head
    // moves one record on; nothing else does.
    let mut after = l.budgets().await.unwrap();
    for (a, b) in after.iter_mut().zip(&before) {
        let moved = a.journal_head.take().map(|h| h.n);
        let was = b.journal_head.as_ref().map(|h| h.n);
        let by = u64::from(a.budget_id == "org/proj/job");
        assert_eq!(moved, was.map(|n| n + by), "{}", a.budget_id);
    }
    let before: Vec<Budget> = before
        .into_iter()
        .map(|b| Budget {
            journal_head: None,
            ..b
        })
        .collect();
    assert_eq!(after, before, "a refusal must not touch any budget");

    // What remains is exactly usable.
    reserve(l, "org/proj/job", 400, 0, "k3").await.unwrap();
    let org = l.budget("org").await.unwrap();
    assert_eq!(
        (org.tokens_reserved, org.tokens_remaining),
        (1_000, Some(0))
    );
    assert_eq!(l.budget("org/proj").await.unwrap().cost_reserved, usd(100));
}

async fn commit_journals_the_entry_releases_the_rest_and_rolls_spend_up(f: Fixture) {
    let l = &f.ledger;
    budget(l, "org", "", Some(10_000), Some(1_000_000)).await;
    budget(l, "job", "org", Some(5_000), Some(500_000)).await;
    let r = reserve(l, "job", 4_000, 400_000, "k1").await.unwrap();
    let c = l
        .commit(commit_req(&r.reservation_id, 1_500, 15_000))
        .await
        .unwrap();
    assert!(!c.overrun);
    let e = c.entry.unwrap();
    assert_eq!(
        (e.budget_id.as_str(), e.tokens, e.total),
        ("job", 1_500, usd(15_000))
    );
    assert_eq!(e.context.unwrap().job_id, "job-1");
    for id in ["job", "org"] {
        let b = l.budget(id).await.unwrap();
        assert_eq!((b.tokens_reserved, b.tokens_spent), (0, 1_500), "{id}");
        assert_eq!(
            (b.cost_reserved, b.cost_spent),
            (usd(0), usd(15_000)),
            "{id}"
        );
    }
    assert_eq!(l.budget("job").await.unwrap().tokens_remaining, Some(3_500));
}

async fn cost_is_computed_from_units_and_price_when_not_given(f: Fixture) {
    let l = &f.ledger;
    budget(l, "b", "", None, None).await;
    let r = reserve(l, "b", 5_000, 100, "k").await.unwrap();
    let mut req = commit_req(&r.reservation_id, 5_000, 0);
    req.cost = None;
    // 5000 units at $10 per million = 50,000 micro-USD ($0.05), as in AITP §7.2.
    let e = l.commit(req).await.unwrap().entry.unwrap();
    assert_eq!(e.total, usd(50_000));
    assert_eq!(
        charge(
            1,
            &UnitPrice {
                micro_usd_per_million: 1
            }
        ),
        1,
        "rounds up"
    );
    assert_eq!(
        charge(
            0,
            &UnitPrice {
                micro_usd_per_million: 7
            }
        ),
        0
    );
}

async fn overrun_is_recorded_and_blocks_the_budget_until_raised(f: Fixture) {
    let l = &f.ledger;
    budget(l, "b", "", Some(1_000), None).await;
    let r = reserve(l, "b", 800, 0, "k1").await.unwrap();
    let c = l
        .commit(commit_req(&r.reservation_id, 1_200, 0))
        .await
        .unwrap();
    assert!(c.overrun);
    let b = l.budget("b").await.unwrap();
    assert!(b.overrun);
    assert_eq!((b.tokens_spent, b.tokens_remaining), (1_200, Some(0)));
    let err = api(reserve(l, "b", 0, 0, "k2").await.unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::BudgetExceeded));

    let mut kinds = Vec::new();
    l.replay(&mut |r: &JournalRecord| kinds.push(r.kind()))
        .await
        .unwrap();
    assert!(
        kinds.ends_with(&[
            RecordKind::Committed,
            RecordKind::Overrun,
            RecordKind::Refused
        ]),
        "{kinds:?}"
    );

    l.update_limits(UpdateLimitsRequest {
        budget_id: "b".into(),
        token_limit: Some(2_000),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(!l.budget("b").await.unwrap().overrun);
    reserve(l, "b", 800, 0, "k3").await.unwrap();
}

async fn lowering_a_limit_below_spend_is_allowed_and_blocks_new_reservations(f: Fixture) {
    let l = &f.ledger;
    budget(l, "b", "", Some(1_000), Some(1_000)).await;
    let r = reserve(l, "b", 500, 500, "k1").await.unwrap();
    l.commit(commit_req(&r.reservation_id, 500, 500))
        .await
        .unwrap();
    let b = l
        .update_limits(UpdateLimitsRequest {
            budget_id: "b".into(),
            cost_limit: usd(100),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (b.token_limit, b.cost_limit, b.overrun),
        (Some(1_000), usd(100), true)
    );
    let err = api(reserve(l, "b", 1, 0, "k2").await.unwrap_err());
    assert_eq!(err.metadata["dimension"], "cost");
    let b = l
        .update_limits(UpdateLimitsRequest {
            budget_id: "b".into(),
            remove_cost_limit: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(b.cost_limit, None);
    reserve(l, "b", 1, 0, "k3").await.unwrap();
}

async fn closed_budgets_refuse_reservations_and_children_but_settle_open_ones(f: Fixture) {
    let l = &f.ledger;
    budget(l, "org", "", None, None).await;
    budget(l, "job", "org", None, None).await;
    let r = reserve(l, "job", 10, 10, "k1").await.unwrap();
    assert!(l.close_budget("org").await.unwrap().closed);
    let err = api(reserve(l, "job", 1, 1, "k2").await.unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::FailedPrecondition, Some(Reason::BudgetClosed))
    );
    assert_eq!(err.metadata["closed_budget_id"], "org");
    let err = api(l
        .create_budget(CreateBudgetRequest {
            budget_id: "job2".into(),
            parent_id: "org".into(),
            ..Default::default()
        })
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::BudgetClosed));
    l.commit(commit_req(&r.reservation_id, 5, 5)).await.unwrap();
    assert_eq!(l.budget("org").await.unwrap().tokens_spent, 5);
}

async fn create_is_idempotent_for_identical_settings_only(f: Fixture) {
    let l = &f.ledger;
    let req = CreateBudgetRequest {
        budget_id: "b".into(),
        token_limit: Some(5),
        ..Default::default()
    };
    assert!(l.create_budget(req.clone()).await.unwrap().created);
    assert!(!l.create_budget(req.clone()).await.unwrap().created);
    let err = api(l
        .create_budget(CreateBudgetRequest {
            token_limit: Some(6),
            ..req
        })
        .await
        .unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::AlreadyExists, Some(Reason::BudgetAlreadyExists))
    );
    let err = api(l
        .create_budget(CreateBudgetRequest {
            budget_id: "c".into(),
            parent_id: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::BudgetNotFound));
}

async fn retried_calls_never_double_count_and_reused_keys_are_refused(f: Fixture) {
    let l = &f.ledger;
    budget(l, "b", "", Some(1_000), None).await;
    let r1 = reserve(l, "b", 100, 10, "k").await.unwrap();
    let r2 = reserve(l, "b", 100, 10, "k").await.unwrap();
    assert_eq!(r1, r2);
    assert_eq!(l.budget("b").await.unwrap().tokens_reserved, 100);
    let err = api(reserve(l, "b", 101, 10, "k").await.unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::AlreadyExists, Some(Reason::IdempotencyKeyReused))
    );

    let c1 = l
        .commit(commit_req(&r1.reservation_id, 50, 5))
        .await
        .unwrap();
    let c2 = l
        .commit(commit_req(&r1.reservation_id, 50, 5))
        .await
        .unwrap();
    assert_eq!(c1, c2);
    assert_eq!(l.budget("b").await.unwrap().tokens_spent, 50);
    let err = api(l
        .commit(commit_req(&r1.reservation_id, 60, 5))
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::IdempotencyKeyReused));
    let err = api(l
        .release(ReleaseRequest {
            reservation_id: r1.reservation_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::FailedPrecondition, Some(Reason::ReservationNotOpen))
    );
    assert_eq!(err.metadata["state"], "committed");

    // A reserve retried after its reservation was committed still returns the original.
    assert_eq!(reserve(l, "b", 100, 10, "k").await.unwrap(), r1);

    let r3 = reserve(l, "b", 100, 0, "k3").await.unwrap();
    let rel = ReleaseRequest {
        invocation_grant: Default::default(),
        reservation_id: r3.reservation_id.clone(),
        idempotency_key: "rel-1".into(),
        rate: None,
    };
    l.release(rel.clone()).await.unwrap();
    l.release(rel).await.unwrap();
    assert_eq!(l.budget("b").await.unwrap().tokens_reserved, 0);
    let err = api(l
        .release(ReleaseRequest {
            invocation_grant: Default::default(),
            reservation_id: "rsv-unknown".into(),
            idempotency_key: "rel-1".into(),
            rate: None,
        })
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::IdempotencyKeyReused));
    let err = api(l
        .release(ReleaseRequest {
            reservation_id: "rsv-unknown".into(),
            ..Default::default()
        })
        .await
        .unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::ReservationNotFound));
}

async fn expired_reservations_are_released_by_the_sweeper_with_an_event(f: Fixture) {
    let l = &f.ledger;
    budget(l, "b", "", Some(100), None).await;
    let mut req = reserve_req("b", 100, 0, "k1");
    req.ttl = Some(switchyard_kit::time::duration(5_000));
    let r = l.reserve(req, "c").await.unwrap();
    assert_eq!(l.sweep().await.unwrap(), 0);
    f.clock.advance_ms(5_000);
    assert_eq!(l.sweep().await.unwrap(), 1);
    assert_eq!(l.budget("b").await.unwrap().tokens_reserved, 0);
    let err = api(l
        .commit(commit_req(&r.reservation_id, 1, 0))
        .await
        .unwrap_err());
    assert_eq!(err.metadata["state"], "expired");
    let mut last = None;
    l.replay(&mut |r: &JournalRecord| last = Some(r.clone()))
        .await
        .unwrap();
    let last = last.unwrap();
    assert_eq!(
        (last.kind(), last.context.unwrap().correlation_id.as_str()),
        (RecordKind::Expired, "corr-1")
    );
}

async fn spend_rolls_up_from_closed_jobs_through_open_projects_and_reports_by_person_and_project(
    f: Fixture,
) {
    let l = &f.ledger;
    let create = |id: &str, parent: &str, by: &str| {
        let req = CreateBudgetRequest {
            budget_id: id.into(),
            parent_id: parent.into(),
            ..Default::default()
        };
        let (id, by) = (id.to_owned(), by.to_owned());
        async move {
            l.create_budget_in(req, "t1", &by)
                .await
                .unwrap_or_else(|e| panic!("create {id}: {e}"));
        }
    };
    create("acme", "", "admin").await;
    create("acme/docs", "acme", "admin").await;
    create("job-a", "acme/docs", "alice").await;
    // A budget whose id reads like a child of `acme` in a path-shaped
    // index (`acme/docs/job-a` is `acme/` + `docs/job-a`), but is not: its
    // parent is `docs`.
    create("docs", "", "mallory").await;
    create("docs/job-a", "docs", "mallory").await;
    for (i, (b, cost)) in [("job-a", 700), ("acme", 5), ("docs/job-a", 9_000)]
        .iter()
        .enumerate()
    {
        let r = reserve(l, b, 10, *cost, &format!("k{i}")).await.unwrap();
        l.commit(commit_req(&r.reservation_id, 10, *cost))
            .await
            .unwrap();
    }
    l.close_budget("job-a").await.unwrap();
    l.close_budget("docs/job-a").await.unwrap();
    // sled retires closed, settled budgets to disk; PostgreSQL keeps them.
    l.maintain().await.unwrap();
    let total = |id: &str| {
        let req = ListEntriesRequest {
            budget_id: id.into(),
            ..Default::default()
        };
        async move {
            let r = l.list_entries(&req).await.unwrap();
            (r.entries.len(), r.total_cost.map_or(0, |m| m.micro_usd))
        }
    };
    assert_eq!(
        total("acme").await,
        (2, 705),
        "acme over its closed grandchild"
    );
    assert_eq!(total("acme/docs").await, (1, 700));
    assert_eq!(
        l.budget("acme")
            .await
            .unwrap()
            .cost_spent
            .map(|m| m.micro_usd),
        Some(705),
        "the balance rolls up the same"
    );
    let report = |budget: &str, by: GroupBy| {
        let req = ReportRequest {
            budget_id: budget.into(),
            group_by: by as i32,
            ..Default::default()
        };
        async move {
            let r = l.report(&req, |t| t == "t1").await.unwrap();
            r.groups
                .iter()
                .map(|g| (g.key.clone(), g.cost.map_or(0, |m| m.micro_usd)))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        report("acme", GroupBy::Project).await,
        [("acme/docs".to_owned(), 700), ("acme".to_owned(), 5)]
    );
    assert_eq!(
        report("acme", GroupBy::Person).await,
        [("alice".to_owned(), 700), ("admin".to_owned(), 5)]
    );
    assert_eq!(
        report("", GroupBy::Project).await,
        [("docs".to_owned(), 9_000), ("acme".to_owned(), 705)]
    );
    // Another tenant's report sees none of it, and cannot name its budgets.
    let other = l
        .report(&ReportRequest::default(), |t| t == "t2")
        .await
        .unwrap();
    assert_eq!((other.entries, other.groups.len()), (0, 0));
    let named = ReportRequest {
        budget_id: "acme".into(),
        ..Default::default()
    };
    let err = api(l.report(&named, |t| t == "t2").await.unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::BudgetNotFound));
}

async fn entries_come_in_the_aitp_shape_by_budget_subtree_job_and_correlation(f: Fixture) {
    let l = &f.ledger;
    budget(l, "task", "", None, Some(10_000_000)).await;
    budget(l, "task/a", "task", None, None).await;
    for (i, (b, units, cost)) in [
        ("task", 1, 1_000),
        ("task/a", 5_000, 50_000),
        ("task/a", 10, 100),
    ]
    .iter()
    .enumerate()
    {
        let mut req = reserve_req(b, *units, *cost, &format!("k{i}"));
        if i == 2 {
            req.context = Some(CorrelationContext {
                correlation_id: "other".into(),
                job_id: "job-2".into(),
                ..Default::default()
            });
        }
        let r = l.reserve(req, "c").await.unwrap();
        l.commit(commit_req(&r.reservation_id, *units, *cost))
            .await
            .unwrap();
    }
    let all = l
        .list_entries(&ListEntriesRequest {
            budget_id: "task".into(),
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.entries.len(), 2);
    assert_eq!(all.total_cost, usd(51_100), "totals cover every page");
    assert_eq!(all.remaining_budget, usd(10_000_000 - 51_100));
    assert_eq!(all.budget.unwrap().budget_id, "task");
    let rest = l
        .list_entries(&ListEntriesRequest {
            budget_id: "task".into(),
            page_size: 2,
            page_token: all.next_page_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((rest.entries.len(), rest.next_page_token.as_str()), (1, ""));
    let by_job = l
        .list_entries(&ListEntriesRequest {
            job_id: "job-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((by_job.entries.len(), by_job.total_cost), (2, usd(51_000)));
    let by_corr = l
        .list_entries(&ListEntriesRequest {
            correlation_id: "other".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_corr.entries[0].units, 10);
    let err = api(l
        .list_entries(&ListEntriesRequest::default())
        .await
        .unwrap_err());
    assert_eq!(err.code, Code::InvalidArgument);
}

#[test]
fn estimates_round_each_part_up_and_unknown_models_are_named() {
    let f = fixture();
    let e = f
        .ledger
        .estimate_cost(&EstimateCostRequest {
            model: "gpt-4o-mini".into(),
            input_tokens: 1_000,
            max_output_tokens: 500,
        })
        .unwrap();
    // 1000 × 0.15 µ$ = 150; 500 × 0.6 µ$ = 300.
    assert_eq!((e.cost, e.tokens), (usd(450), 1_500));
    let err = api(f
        .ledger
        .estimate_cost(&EstimateCostRequest {
            model: "gpt-9".into(),
            ..Default::default()
        })
        .unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::NotFound, Some(Reason::ModelNotPriced))
    );
}

async fn bad_input_is_refused_with_every_field_named(f: Fixture) {
    let l = &f.ledger;
    let mut req = reserve_req("bad id", MAX_AMOUNT + 1, -5, "");
    req.ttl = Some(switchyard_kit::time::duration(0));
    let err = api(l.reserve(req, "c").await.unwrap_err());
    let fields: Vec<_> = err.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(
        fields,
        ["budget_id", "idempotency_key", "tokens", "cost", "ttl"]
    );
    let err = api(l
        .create_budget(CreateBudgetRequest {
            budget_id: "x".into(),
            parent_id: "x".into(),
            cost_limit: usd(-1),
            ..Default::default()
        })
        .await
        .unwrap_err());
    let fields: Vec<_> = err.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, ["parent_id", "cost_limit"]);
    assert_eq!(
        api(reserve(l, "missing", 1, 1, "k").await.unwrap_err()).known_reason(),
        Some(Reason::BudgetNotFound)
    );
}

#[tokio::test]
async fn balances_survive_reopen_and_equal_the_journal_replay() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let open_rid = {
        let f = fixture_on(reopen(dir.path()).await, clock.clone());
        let l = &f.ledger;
        budget(l, "org", "", Some(10_000), Some(1_000_000)).await;
        budget(l, "job", "org", None, None).await;
        let r = reserve(l, "job", 1_000, 1_000, "k1").await.unwrap();
        l.commit(commit_req(&r.reservation_id, 700, 700))
            .await
            .unwrap();
        reserve(l, "job", 300, 30, "k2")
            .await
            .unwrap()
            .reservation_id
    };
    let f = fixture_on(reopen(dir.path()).await, clock);
    let l = &f.ledger;
    let org = l.budget("org").await.unwrap();
    assert_eq!((org.tokens_spent, org.tokens_reserved), (700, 300));
    assert_eq!(
        l.budgets().await.unwrap(),
        l.replayed_budgets().await.unwrap()
    );
    // Idempotency survives the restart too.
    assert_eq!(
        reserve(l, "job", 300, 30, "k2")
            .await
            .unwrap()
            .reservation_id,
        open_rid
    );
    l.release(ReleaseRequest {
        reservation_id: open_rid,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(l.budget("org").await.unwrap().tokens_reserved, 0);
}

async fn watch_streams_durable_events_of_a_budget_subtree_and_resumes(f: Fixture) {
    let l = &f.ledger;
    budget(l, "org", "", Some(100), None).await;
    budget(l, "job", "org", None, None).await;
    budget(l, "other", "", None, None).await;
    let mut all = watch(l, "org", 0).await.unwrap();
    let r = reserve(l, "job", 60, 0, "k1").await.unwrap();
    reserve(l, "other", 1, 0, "k2").await.unwrap();
    assert!(reserve(l, "job", 60, 0, "k3").await.is_err());
    l.release(ReleaseRequest {
        reservation_id: r.reservation_id,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 5 {
        let ev = tokio::time::timeout(Duration::from_secs(5), all.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let e = ev.event.unwrap();
        if e.kind.starts_with("ledger.reserved") || e.kind == "ledger.refused" {
            assert_eq!(e.correlation_id, "corr-1");
        }
        kinds.push(e.kind);
    }
    assert_eq!(
        kinds,
        [
            "ledger.budget_created",
            "ledger.budget_created",
            "ledger.reserved",
            "ledger.refused",
            "ledger.released"
        ]
    );
    let mut resumed = watch(l, "", 4).await.unwrap();
    let ev = resumed.next().await.unwrap().unwrap().event.unwrap();
    assert_eq!((ev.sequence, ev.kind.as_str()), (5, "ledger.reserved"));
    let err = api(watch(l, "nope", 0).await.err().unwrap());
    assert_eq!(err.known_reason(), Some(Reason::BudgetNotFound));
}

mod properties {
    //! Random sequences of create/reserve/commit/release/expire/restart: no
    //! budget ever holds more than its limit except through recorded
    //! overruns, and the live balances always equal the journal replay.
    use super::*;
    use crate::books::Settled;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Create {
            parent: usize,
            tokens: Option<u64>,
            cost: Option<i64>,
        },
        Reserve {
            budget: usize,
            tokens: u64,
            cost: i64,
            key: u8,
        },
        Commit {
            res: usize,
            tokens: u64,
            cost: i64,
        },
        Release {
            res: usize,
        },
        /// A hold on a budget (kept with the reservations, so commits and
        /// releases name holds too).
        Hold {
            budget: usize,
            tokens: u64,
            cost: i64,
            key: u8,
        },
        /// A draw from the `hold`-th hold made.
        Draw {
            hold: usize,
            tokens: u64,
            cost: i64,
            key: u8,
        },
        Expire {
            ms: u64,
        },
        Restart,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (0..16usize, proptest::option::of(0..800u64), proptest::option::of(0..800i64))
                .prop_map(|(parent, tokens, cost)| Op::Create { parent, tokens, cost }),
            4 => (0..16usize, 0..400u64, 0..400i64, 0..40u8)
                .prop_map(|(budget, tokens, cost, key)| Op::Reserve { budget, tokens, cost, key }),
            3 => (0..64usize, 0..500u64, 0..500i64).prop_map(|(res, tokens, cost)| Op::Commit { res, tokens, cost }),
            1 => (0..64usize).prop_map(|res| Op::Release { res }),
            1 => (0..16usize, 0..500u64, 0..500i64, 0..40u8)
                .prop_map(|(budget, tokens, cost, key)| Op::Hold { budget, tokens, cost, key }),
            3 => (0..8usize, 0..200u64, 0..200i64, 0..40u8)
                .prop_map(|(hold, tokens, cost, key)| Op::Draw { hold, tokens, cost, key }),
            1 => (0..20_000u64).prop_map(|ms| Op::Expire { ms }),
            1 => Just(Op::Restart),
        ]
    }

    /// org(1000 tokens, 1000 µ$) → {p1(600, —) → {j1, j2(300, 300)}, p2(—, 700)}
    const BUDGETS: [(&str, &str, Option<u64>, Option<i64>); 5] = [
        ("org", "", Some(1_000), Some(1_000)),
        ("p1", "org", Some(600), None),
        ("p2", "org", None, Some(700)),
        ("j1", "p1", None, None),
        ("j2", "p1", Some(300), Some(300)),
    ];

    async fn check_invariants(
        l: &Ledger,
        overrun_tokens: &HashMap<String, u64>,
        overrun_cost: &HashMap<String, i64>,
    ) {
        let live = l.budgets().await.unwrap();
        assert_eq!(
            live,
            l.replayed_budgets().await.unwrap(),
            "live balances differ from the journal replay"
        );
        // What each budget holds is what the open reservations of its
        // subtree keep on the chain: a hold what is left undrawn, any other
        // its amounts.
        {
            let books = l.sled().lock();
            for b in books.budgets.values() {
                let subtree: Vec<&str> =
                    books.subtree(&b.id).iter().map(|s| s.id.as_str()).collect();
                let (t, c) = books
                    .reservations
                    .values()
                    .filter(|r| {
                        r.settled == Settled::Open && subtree.contains(&r.budget_id.as_str())
                    })
                    .map(|r| r.on_chain())
                    .fold((0u64, 0i64), |(t, c), (rt, rc)| (t + rt, c + rc));
                assert_eq!(
                    (b.tokens_reserved, b.cost_reserved),
                    (t, c),
                    "{} holds other than its open reservations",
                    b.id
                );
            }
        }
        for b in &live {
            let spent_reserved = b.tokens_spent + b.tokens_reserved;
            if let Some(limit) = b.token_limit {
                let slack = overrun_tokens.get(&b.budget_id).copied().unwrap_or(0);
                assert!(
                    spent_reserved <= limit + slack,
                    "{} tokens {spent_reserved} > {limit} + {slack}",
                    b.budget_id
                );
            }
            let cost = micro(b.cost_spent.as_ref()) + micro(b.cost_reserved.as_ref());
            if let Some(limit) = b.cost_limit {
                let slack = overrun_cost.get(&b.budget_id).copied().unwrap_or(0);
                assert!(
                    cost <= limit.micro_usd + slack,
                    "{} cost {cost} > {} + {slack}",
                    b.budget_id,
                    limit.micro_usd
                );
            }
        }
    }

    /// Reserves `req` (with a 10 s TTL); the new reservation's id, or
    /// `None` when refused or already among `known`.
    async fn made(
        l: &Ledger,
        mut req: ReserveRequest,
        known: &[(String, String)],
    ) -> Option<String> {
        req.ttl = Some(switchyard_kit::time::duration(10_000));
        let r = l.reserve(req, "c").await.ok()?;
        (!known.iter().any(|(id, _)| *id == r.reservation_id)).then_some(r.reservation_id)
    }

    async fn run(ops: Vec<Op>) {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let mut f = fixture_on(reopen(dir.path()).await, clock.clone());
        for (id, parent, t, c) in BUDGETS {
            budget(&f.ledger, id, parent, t, c).await;
        }
        let mut budgets: Vec<String> = BUDGETS.iter().map(|b| b.0.to_owned()).collect();
        let mut reservations: Vec<(String, String)> = Vec::new();
        let mut holds: Vec<(String, String)> = Vec::new();
        // Overruns recorded per budget chain: the only allowed excess.
        let mut over_t: HashMap<String, u64> = HashMap::new();
        let mut over_c: HashMap<String, i64> = HashMap::new();
        for op in ops {
            match op {
                Op::Reserve {
                    budget,
                    tokens,
                    cost,
                    key,
                } => {
                    let b = budgets[budget % budgets.len()].clone();
                    let req = reserve_req(&b, tokens, cost, &format!("key-{key}"));
                    if let Some(id) = made(&f.ledger, req, &reservations).await {
                        reservations.push((id, b));
                    }
                }
                Op::Hold {
                    budget,
                    tokens,
                    cost,
                    key,
                } => {
                    let b = budgets[budget % budgets.len()].clone();
                    let req = hold_req(&b, tokens, cost, &format!("hold-{key}"));
                    if let Some(id) = made(&f.ledger, req, &holds).await {
                        holds.push((id.clone(), b.clone()));
                        reservations.push((id, b));
                    }
                }
                Op::Draw {
                    hold,
                    tokens,
                    cost,
                    key,
                } => {
                    if let Some((hid, b)) = holds.get(hold).cloned() {
                        let req = draw_req(&hid, &b, tokens, cost, &format!("draw-{key}"));
                        if let Some(id) = made(&f.ledger, req, &reservations).await {
                            reservations.push((id, b));
                        }
                    }
                }
                Op::Create {
                    parent,
                    tokens,
                    cost,
                } => {
                    let parent = budgets[parent % budgets.len()].clone();
                    let id = format!("{parent}/n{}", budgets.len());
                    budget(&f.ledger, &id, &parent, tokens, cost).await;
                    budgets.push(id);
                }
                Op::Commit { res, tokens, cost } => {
                    if let Some((rid, b)) = reservations.get(res) {
                        let held = f
                            .ledger
                            .sled()
                            .lock()
                            .reservations
                            .get(rid)
                            .map(|r| (r.tokens, r.cost, r.settled));
                        if let Ok(c) = f.ledger.commit(commit_req(rid, tokens, cost)).await
                            && c.overrun
                            && let Some((ht, hc, Settled::Open)) = held
                        {
                            for a in f.ledger.sled().lock().chain(b) {
                                *over_t.entry(a.id.clone()).or_default() +=
                                    tokens.saturating_sub(ht);
                                *over_c.entry(a.id.clone()).or_default() += (cost - hc).max(0);
                            }
                        }
                    }
                }
                Op::Release { res } => {
                    if let Some((rid, _)) = reservations.get(res) {
                        let _ = f
                            .ledger
                            .release(ReleaseRequest {
                                reservation_id: rid.clone(),
                                ..Default::default()
                            })
                            .await;
                    }
                }
                Op::Expire { ms } => {
                    clock.advance_ms(ms);
                    f.ledger.sweep().await.unwrap();
                }
                Op::Restart => {
                    let before = f.ledger.budgets().await.unwrap();
                    drop(f);
                    f = fixture_on(reopen(dir.path()).await, clock.clone());
                    assert_eq!(
                        f.ledger.budgets().await.unwrap(),
                        before,
                        "balances changed across a restart"
                    );
                }
            }
            check_invariants(&f.ledger, &over_t, &over_c).await;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn no_budget_is_overspent_and_balances_equal_the_journal(ops in proptest::collection::vec(op(), 1..60)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(run(ops));
        }
    }
}

async fn sums_that_would_overflow_are_refused_never_saturated(f: Fixture) {
    // Unlimited budgets: no limit stops the sums, only their integer types.
    budget(&f.ledger, "root", "", None, None).await;
    budget(&f.ledger, "root/job", "root", None, None).await;
    let max = crate::MAX_AMOUNT;
    // i64::MAX / 1e15 ≈ 9223 reservations of the largest amount fit.
    let fit = (i64::MAX as u64 / max) as usize;
    for i in 0..fit {
        reserve(&f.ledger, "root/job", max, max as i64, &format!("k{i}"))
            .await
            .unwrap();
    }
    let before = f.ledger.budget("root").await.unwrap();
    let e = reserve(&f.ledger, "root/job", max, max as i64, "one-too-many")
        .await
        .unwrap_err();
    let e = api(e);
    assert_eq!(e.reason.as_deref(), Some("AMOUNT_OVERFLOW"), "{e:?}");
    assert_eq!(
        f.ledger.budget("root").await.unwrap(),
        before,
        "nothing changed"
    );
    assert!(
        before.cost_reserved.unwrap().micro_usd > 0,
        "not saturated or wrapped"
    );
    // The books still equal the replay of the journal.
    assert_eq!(
        f.ledger.replayed_budgets().await.unwrap(),
        f.ledger.budgets().await.unwrap()
    );
}

#[tokio::test]
async fn closed_budgets_leave_memory_and_everything_about_them_still_answers() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let (rid, entries_before) = {
        let f = fixture_on(reopen(dir.path()).await, clock.clone());
        let l = &f.ledger;
        budget(l, "org", "", Some(10_000), Some(1_000_000)).await;
        budget(l, "job-a", "org", None, None).await;
        budget(l, "job-b", "org", None, None).await;
        let r = reserve(l, "job-a", 1_000, 1_000, "ka").await.unwrap();
        l.commit(commit_req(&r.reservation_id, 700, 700))
            .await
            .unwrap();
        let rb = reserve(l, "job-b", 100, 10, "kb").await.unwrap();
        l.release(ReleaseRequest {
            reservation_id: rb.reservation_id,
            ..Default::default()
        })
        .await
        .unwrap();
        l.close_budget("job-a").await.unwrap();
        l.close_budget("job-b").await.unwrap();
        let by = |job: &str| ListEntriesRequest {
            job_id: job.into(),
            ..Default::default()
        };
        let before = l.list_entries(&by("job-1")).await.unwrap().entries.len();
        l.maintain().await.unwrap();
        {
            let books = l.sled().lock();
            assert!(!books.budgets.contains_key("job-a") && !books.budgets.contains_key("job-b"));
            assert!(books.reservations.is_empty() && books.entries.is_empty());
            assert!(books.budgets["org"].children.is_empty());
        }
        // Reads fall back to disk.
        let a = l.budget("job-a").await.unwrap();
        assert!(a.closed && a.tokens_spent == 700);
        assert_eq!(
            l.list_entries(&by("job-1")).await.unwrap().entries.len(),
            before
        );
        let org_entries = l
            .list_entries(&ListEntriesRequest {
                budget_id: "org".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            org_entries.total_tokens, 700,
            "retired children's entries count"
        );
        let listed = l
            .list_budgets(&ListBudgetsRequest::default())
            .await
            .unwrap();
        assert_eq!(listed.budgets.len(), 3);
        (r.reservation_id, before)
    };
    // A restart loads the snapshot and replays nothing before it.
    let f = fixture_on(reopen(dir.path()).await, clock);
    let l = &f.ledger;
    assert_eq!(l.sled().lock().budgets.len(), 1, "only org is in memory");
    assert_eq!(
        l.budgets().await.unwrap(),
        l.replayed_budgets().await.unwrap()
    );
    let org = l.budget("org").await.unwrap();
    assert_eq!((org.tokens_spent, org.tokens_reserved), (700, 0));
    // Idempotent answers for retired reservations.
    assert_eq!(
        reserve(l, "job-a", 1_000, 1_000, "ka")
            .await
            .unwrap()
            .reservation_id,
        rid
    );
    let again = l.commit(commit_req(&rid, 700, 700)).await.unwrap();
    assert_eq!(
        again.entry.unwrap().tokens,
        700,
        "the same commit answers the same"
    );
    assert_eq!(
        api(reserve(l, "job-a", 1, 1, "new").await.unwrap_err()).known_reason(),
        Some(Reason::BudgetClosed)
    );
    assert_eq!(
        l.list_entries(&ListEntriesRequest {
            job_id: "job-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .entries
        .len(),
        entries_before
    );
}

#[tokio::test]
async fn retention_prunes_retired_budgets_and_old_journal_but_never_balances() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    {
        let f = fixture_on(reopen(dir.path()).await, clock.clone());
        let l = &f.ledger;
        budget(l, "org", "", Some(10_000), None).await;
        // Records of org's own, to be pruned: its chain must go on from
        // the head kept at the pruning.
        let r = reserve(l, "org", 10, 0, "org-1").await.unwrap();
        release(l, &r.reservation_id).await;
        for i in 0..300 {
            let job = format!("job-{i}");
            budget(l, &job, "org", None, None).await;
            let r = reserve(l, &job, 10, 0, &format!("k{i}")).await.unwrap();
            l.commit(commit_req(&r.reservation_id, 10, 0))
                .await
                .unwrap();
            l.close_budget(&job).await.unwrap();
        }
        l.maintain().await.unwrap();
        assert_eq!(
            l.budget("job-0").await.unwrap().tokens_spent,
            10,
            "retired, still readable"
        );
        // Past the retention window (7 days by default).
        clock.advance_ms(8 * 24 * 3_600_000);
        l.maintain().await.unwrap();
        assert_eq!(
            api(l.budget("job-0").await.unwrap_err()).known_reason(),
            Some(Reason::BudgetNotFound)
        );
        assert!(
            l.sled().journal.read(0, 10, 10).unwrap().is_empty(),
            "old records are gone"
        );
        let r = reserve(l, "org", 10, 0, "org-2").await.unwrap();
        release(l, &r.reservation_id).await;
        let v = l.verify_journal("", |_| true).await.unwrap();
        assert!(v.problems.is_empty(), "{v:?}");
        assert_eq!((v.budgets, v.records, v.pruned), (1, 2, 1), "{v:?}");
    }
    // The balances came through in the snapshot, and the chain's head.
    let f = fixture_on(reopen(dir.path()).await, clock);
    let org = f.ledger.budget("org").await.unwrap();
    assert_eq!((org.tokens_spent, org.tokens_reserved), (3_000, 0));
    assert_eq!(org.journal_head.map(|h| h.n), Some(5));
    let v = f.ledger.verify_journal("", |_| true).await.unwrap();
    assert!(v.problems.is_empty(), "{v:?}");
    assert_eq!((v.records, v.pruned), (2, 1), "{v:?}");
}

#[tokio::test]
async fn a_watch_on_one_replica_streams_what_the_others_journal_in_order() {
    let Some(url) = switchyard_testkit::pg::fresh_database() else {
        return;
    };
    let clock = ManualClock::new(1_700_000_000_000);
    let (a, b) = (
        pg_replica(&url, &clock).await,
        pg_replica(&url, &clock).await,
    );
    budget(&a.ledger, "org", "", Some(1_000), None).await;
    let mut stream = watch(&b.ledger, "org", 0).await.unwrap();
    // Reservations through A, one released through B.
    let r = reserve(&a.ledger, "org", 100, 0, "k1").await.unwrap();
    reserve(&a.ledger, "org", 200, 0, "k2").await.unwrap();
    b.ledger
        .release(ReleaseRequest {
            reservation_id: r.reservation_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the watch on B streams A's records")
            .unwrap()
            .unwrap();
        let e = ev.event.unwrap();
        seen.push((e.sequence, e.kind));
    }
    let kinds: Vec<&str> = seen.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ledger.budget_created",
            "ledger.reserved",
            "ledger.reserved",
            "ledger.released"
        ]
    );
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "in sequence order: {seen:?}"
    );
    // Both replicas answer the same balances.
    assert_eq!(
        a.ledger.budget("org").await.unwrap(),
        b.ledger.budget("org").await.unwrap()
    );
    assert_eq!(b.ledger.budget("org").await.unwrap().tokens_reserved, 200);
}

fn claim(tokens: u64) -> Option<RateClaim> {
    Some(RateClaim {
        provider: "p".into(),
        model: "m".into(),
        key: "P_KEY".into(),
        tokens,
    })
}

fn claimed(budget: &str, tokens: u64, key: &str) -> ReserveRequest {
    ReserveRequest {
        rate: claim(tokens),
        ..reserve_req(budget, tokens, 0, key)
    }
}

async fn a_rate_refusal_reserves_no_money_and_a_budget_refusal_takes_no_rate_room(f: Fixture) {
    let l = &f.ledger;
    budget(l, "b", "", Some(10_000), None).await;
    budget(l, "small", "", Some(10), None).await;
    // A budget refusal takes no room: two calls still fit afterwards.
    let e = l
        .reserve(claimed("small", 100, "too-big"), "c")
        .await
        .unwrap_err();
    assert_eq!(api(e).reason.as_deref(), Some("BUDGET_EXCEEDED"));
    let first = l.reserve(claimed("b", 100, "k1"), "c").await.unwrap();
    l.reserve(claimed("b", 100, "k2"), "c").await.unwrap();
    // The third call: no room in the window, and no money reserved.
    let e = api(l.reserve(claimed("b", 100, "k3"), "c").await.unwrap_err());
    assert_eq!(e.reason.as_deref(), Some("RATE_LIMITED"), "{e:?}");
    assert_eq!(e.metadata.get("limit").map(String::as_str), Some("p-rpm"));
    let after: u64 = e.metadata["retry_after_ms"].parse().unwrap();
    assert!((60_000..=63_000).contains(&after), "{after}");
    assert_eq!(balances(l, "b").await.0, 200, "tokens reserved");
    // A retried Reserve of a granted call is answered, not refused.
    let again = l.reserve(claimed("b", 100, "k1"), "c").await.unwrap();
    assert_eq!(again.reservation_id, first.reservation_id);
    // A reservation without a claim is not a model call: not limited.
    l.reserve(reserve_req("b", 100, 0, "plain"), "c")
        .await
        .unwrap();
    // Once the window has passed the call fits.
    f.clock.advance_ms(after);
    l.reserve(claimed("b", 100, "k3"), "c").await.unwrap();
}

async fn limits_are_listed_per_tenant_with_other_tenants_waiting_calls_unnamed(f: Fixture) {
    let l = &f.ledger;
    for (id, tenant) in [("a-job", "acme"), ("b-job", "globex")] {
        l.create_budget_in(
            CreateBudgetRequest {
                budget_id: id.into(),
                token_limit: Some(10_000),
                ..Default::default()
            },
            tenant,
            "someone",
        )
        .await
        .unwrap();
    }
    l.reserve(claimed("a-job", 100, "a1"), "c").await.unwrap();
    l.reserve(claimed("b-job", 100, "b1"), "c").await.unwrap();
    // globex's next call waits on the shared limit.
    l.reserve(claimed("b-job", 100, "b2"), "c")
        .await
        .unwrap_err();
    let seen = |tenant: Option<&'static str>| async move {
        l.list_limits(&ListLimitsRequest::default(), tenant)
            .await
            .unwrap()
            .buckets
            .into_iter()
            .map(|b| {
                let waiting: Vec<(String, u32)> = b
                    .waiting
                    .iter()
                    .map(|w| (w.tenant.clone(), w.calls))
                    .collect();
                (b.limit, b.scope, b.granted, waiting)
            })
            .collect::<Vec<_>>()
    };
    let acme = seen(Some("acme")).await;
    assert_eq!(
        acme,
        [
            ("".to_owned(), "key:P_KEY".to_owned(), 2, vec![]),
            ("p-per-tenant".into(), "tenant:acme".into(), 1, vec![]),
            // globex's waiting call is counted, not named.
            ("p-rpm".into(), "shared".into(), 2, vec![("".into(), 1)]),
        ]
    );
    let all = seen(None).await;
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(all.contains(&(
        "p-rpm".into(),
        "shared".into(),
        2,
        vec![("globex".into(), 1)]
    )));
}

#[tokio::test]
async fn rate_buckets_survive_a_restart_of_the_single_node() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    {
        let f = fixture_on(Store::open(dir.path()).unwrap(), clock.clone());
        budget(&f.ledger, "b", "", Some(10_000), None).await;
        f.ledger
            .reserve(claimed("b", 100, "k1"), "c")
            .await
            .unwrap();
        f.ledger
            .reserve(claimed("b", 100, "k2"), "c")
            .await
            .unwrap();
        f.ledger.maintain().await.unwrap();
    }
    let f = fixture_on(reopen(dir.path()).await, clock);
    let e = api(f
        .ledger
        .reserve(claimed("b", 100, "k3"), "c")
        .await
        .unwrap_err());
    assert_eq!(e.reason.as_deref(), Some("RATE_LIMITED"), "{e:?}");
}

#[tokio::test]
async fn only_a_service_may_set_a_cooldown_and_it_holds_every_call_through_the_key() {
    let f = fixture();
    let l = &f.ledger;
    budget(l, "b", "", Some(10_000), None).await;
    let bad = l
        .cool_down(CoolDownRequest {
            rate: Some(RateClaim::default()),
            wait: None,
            why: String::new(),
        })
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("rate.key"), "{bad}");
    let until = l
        .cool_down(CoolDownRequest {
            rate: claim(0),
            wait: Some(switchyard_kit::time::duration(5_000)),
            why: "p answered 429".into(),
        })
        .await
        .unwrap();
    assert_eq!(until, f.clock.now_ms() + 5_000);
    let e = api(l.reserve(claimed("b", 100, "k1"), "c").await.unwrap_err());
    assert_eq!(
        e.metadata.get("scope").map(String::as_str),
        Some("key:P_KEY")
    );
    assert!(e.message.contains("p answered 429"), "{e:?}");
    f.clock.advance_ms(5_000);
    l.reserve(claimed("b", 100, "k1"), "c").await.unwrap();
    // The RPC needs ledger.rate_report, which only the service token holds.
    for role in switchyard_kit::auth::Role::ALL {
        let may = switchyard_kit::auth::permissions::grants(
            role,
            switchyard_kit::auth::Permission::RateReport,
        );
        assert_eq!(may, role == switchyard_kit::auth::Role::Service, "{role:?}");
    }
}
