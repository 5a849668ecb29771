//! What provider rate limits cost a model call, limits off against on in
//! the same run:
//!
//! 1. the ledger engine in-process (sled, durable group commit), 64
//!    callers making Reserve+Commit pairs as a model call does, each with
//!    its rate claim when limits are on (four limits apply to every call:
//!    shared requests and tokens, a per-tenant concurrency cap, a
//!    per-person daily tokens cap, none ever full): the time each pair
//!    holds the books (1 / throughput) and the CPU it costs;
//! 2. the ledger on PostgreSQL (a throwaway cluster), one caller: the
//!    database round trips and the latency of a Reserve+Commit pair.

use std::time::{Duration, Instant};

use switchyard_core::SystemClock;
use switchyard_ledger::rates::{LimitConfig, Per};
use switchyard_ledger::{Ledger, LedgerConfig};
use switchyard_proto::common::v1::Money;
use switchyard_proto::ledger::v1::{CommitRequest, CreateBudgetRequest, RateClaim, ReserveRequest};
use switchyard_testkit::pg::{PgCluster, Unavailable};

use crate::{CALLERS, verdict};

/// Limits that apply to every call and never fill.
fn limits() -> Vec<LimitConfig> {
    let big = Some(1_000_000_000_000);
    vec![
        LimitConfig {
            name: "openai".into(),
            provider: "openai".into(),
            requests_per_minute: big,
            tokens_per_minute: big,
            ..Default::default()
        },
        LimitConfig {
            name: "per-tenant".into(),
            per: Per::Tenant,
            concurrent: Some(1_000_000),
            ..Default::default()
        },
        LimitConfig {
            name: "per-person".into(),
            per: Per::Person,
            tokens_per_day: big,
            ..Default::default()
        },
    ]
}

fn claim(on: bool, tokens: u64) -> Option<RateClaim> {
    on.then(|| RateClaim {
        provider: "openai".into(),
        model: "gpt-4o".into(),
        key: "OPENAI_API_KEY".into(),
        tokens,
    })
}

/// One model call's Reserve and Commit, with its claim when `on`.
async fn pair(l: &Ledger, on: bool, seq: u64) -> anyhow::Result<()> {
    let r = l
        .reserve_as(
            ReserveRequest {
                budget_id: "hot".into(),
                tokens: 100,
                cost: Some(Money { micro_usd: 10 }),
                idempotency_key: format!("bench-{seq}"),
                rate: claim(on, 100),
                ..Default::default()
            },
            "bench",
            "alice",
        )
        .await?;
    l.commit_as(
        CommitRequest {
            reservation_id: r.reservation_id,
            tokens: 60,
            cost: Some(Money { micro_usd: 6 }),
            rate: claim(on, 60),
            ..Default::default()
        },
        "alice",
    )
    .await?;
    Ok(())
}

async fn budget(l: &Ledger) -> anyhow::Result<()> {
    l.create_budget(CreateBudgetRequest {
        budget_id: "hot".into(),
        token_limit: Some(switchyard_ledger::MAX_AMOUNT),
        ..Default::default()
    })
    .await?;
    Ok(())
}

/// CPU time (user + system) of this process, seconds.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let Some(close) = stat.rfind(')') else {
        return 0.0;
    };
    let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Pairs per second and CPU µs per pair over `dur`, `CALLERS` at once.
async fn measure(l: &Ledger, on: bool, dur: Duration, base: u64) -> anyhow::Result<(f64, f64)> {
    let (cpu0, start) = (cpu_secs(), Instant::now());
    let tasks: Vec<_> = (0..CALLERS as u64)
        .map(|c| {
            let l = l.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + dur;
                let mut n = 0u64;
                while !n.is_multiple_of(16) || Instant::now() < deadline {
                    pair(&l, on, base + c * 10_000_000 + n).await?;
                    n += 1;
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    let mut n = 0;
    for t in tasks {
        n += t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((n as f64 / secs, (cpu_secs() - cpu0) * 1e6 / n as f64))
}

async fn in_process() -> anyhow::Result<()> {
    let (_trigger, shutdown) = switchyard_kit::shutdown::channel();
    let open = |cfg: LedgerConfig| -> anyhow::Result<(Ledger, tempfile::TempDir)> {
        let dir = tempfile::tempdir()?;
        let store = switchyard_store::Store::open(dir.path())?;
        let l = Ledger::open(
            cfg,
            store,
            std::sync::Arc::new(SystemClock),
            shutdown.clone(),
        )?;
        Ok((l, dir))
    };
    let (off, _d1) = open(LedgerConfig::default())?;
    let (on, _d2) = open(LedgerConfig {
        limits: limits(),
        ..Default::default()
    })?;
    budget(&off).await?;
    budget(&on).await?;
    // Warm both, then alternate, keeping each side's best of three.
    measure(&off, false, Duration::from_millis(500), 0).await?;
    measure(&on, true, Duration::from_millis(500), 0).await?;
    let (mut best_off, mut best_on) = ((0.0f64, f64::MAX), (0.0f64, f64::MAX));
    for round in 1..=3u64 {
        let base = round * 1_000_000_000;
        let (r, c) = measure(&off, false, Duration::from_secs(2), base).await?;
        best_off = (best_off.0.max(r), best_off.1.min(c));
        let (r, c) = measure(&on, true, Duration::from_secs(2), base).await?;
        best_on = (best_on.0.max(r), best_on.1.min(c));
    }
    let held_off = 1e6 / best_off.0;
    let held_on = 1e6 / best_on.0;
    let added = held_on - held_off;
    let cpu_added = best_on.1 - best_off.1;
    println!(
        "
Rate limits, ledger engine in-process (sled, durable), {CALLERS} callers, Reserve+Commit per model call, limits off vs on (3 limits, 4 buckets per call):"
    );
    println!(
        "  off {:>9.0} calls/s ({held_off:.1} us each, {:.1} us CPU)   on {:>9.0} calls/s ({held_on:.1} us each, {:.1} us CPU)   ratio {:.2}",
        best_off.0,
        best_off.1,
        best_on.0,
        best_on.1,
        best_off.0 / best_on.0
    );
    println!(
        "  the rate-limit check adds {added:.1} us per call ({cpu_added:.1} us CPU)  [{}: <= 20 us]",
        verdict(added <= 20.0 && cpu_added <= 20.0)
    );
    Ok(())
}

async fn postgres() -> anyhow::Result<()> {
    let pg = match PgCluster::start() {
        Ok(c) => c,
        Err(Unavailable::Skip(why)) => {
            println!("\nRate limits on PostgreSQL: skipped ({why})");
            return Ok(());
        }
    };
    let url = pg.database()?;
    let (_trigger, shutdown) = switchyard_kit::shutdown::channel();
    let db_cfg = switchyard_store::pg::PgConfig {
        url,
        pool_size: 4,
        ..Default::default()
    };
    let m = switchyard_kit::metrics::global();
    let mut rows = Vec::new();
    for (name, on) in [("off", false), ("on", true)] {
        let db = switchyard_store::pg::Pg::connect(&db_cfg).await?;
        let mut cfg = LedgerConfig::default();
        if on {
            cfg.limits = limits();
        }
        let l =
            Ledger::open_pg(cfg, db, std::sync::Arc::new(SystemClock), shutdown.clone()).await?;
        // One database: the second ledger finds the budget the first made.
        if !on {
            budget(&l).await?;
        }
        let base = if on { 500_000 } else { 0 };
        // Warm: the chain and the buckets are known to this replica.
        for i in 0..20 {
            pair(&l, on, base + i).await?;
        }
        let n = 300u64;
        let (trips0, tx0) = (
            m.ledger_pg_round_trips.get(),
            m.ledger_pg_transactions.get(),
        );
        let start = Instant::now();
        for i in 0..n {
            pair(&l, on, base + 100 + i).await?;
        }
        let took = start.elapsed();
        let trips = (m.ledger_pg_round_trips.get() - trips0) as f64 / (2 * n) as f64;
        let txs = (m.ledger_pg_transactions.get() - tx0) as f64 / (2 * n) as f64;
        let us = took.as_secs_f64() * 1e6 / n as f64;
        rows.push((name, trips, txs, us));
    }
    println!(
        "\nRate limits on PostgreSQL (one replica, one caller, Reserve+Commit per model call):"
    );
    for (name, trips, txs, us) in &rows {
        println!(
            "  limits {name:<3}  {trips:.2} round trips and {txs:.2} transactions per write, {us:>7.0} us per call"
        );
    }
    let same = (rows[0].1 - rows[1].1).abs() < 0.01;
    println!(
        "  round trips added by limits: {:.2} per write  [{}: none]",
        rows[1].1 - rows[0].1,
        verdict(same)
    );
    Ok(())
}

pub async fn run() -> anyhow::Result<()> {
    in_process().await?;
    postgres().await
}
