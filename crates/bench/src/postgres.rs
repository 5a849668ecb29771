//! The ledger on PostgreSQL: Reserve+Commit pairs over gRPC with one and
//! with three replicas on one throwaway database, on one hot budget and on
//! 1,000 budgets, next to the sled ledger in the same run, with
//! PostgreSQL's own share of the CPU.

use std::time::{Duration, Instant};

use switchyard_cli::ServiceKind;
use switchyard_proto::ledger::v1::CreateBudgetRequest;
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_testkit::Stack;
use switchyard_testkit::pg::{PgCluster, Unavailable};

use crate::{CALLERS, Channel, Load, load, reserve_commit, verdict};

const BUDGETS: u64 = 1_000;

/// CPU time (user + system) of every process named `postgres`, seconds.
fn postgres_cpu_secs() -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let mut total = 0u64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    for e in dir.flatten() {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid … utime(14) stime(15)
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        if !stat[..close].ends_with("(postgres") {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let (u, s) = (fields.get(11), fields.get(12));
        total += u.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        total += s.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    total as f64 / tick
}

/// One ledger replica (with its own key service) on database `url`.
async fn replica(url: &str) -> anyhow::Result<Stack> {
    let url = url.to_owned();
    Stack::start_with(&[ServiceKind::Auth, ServiceKind::Ledger], move |c| {
        c.storage.backend = switchyard_cli::config::StorageBackend::Postgres;
        c.storage.postgres.url = url;
        c.storage.postgres.pool_size = 16;
        c.server.request_timeout_ms = 60_000;
    })
    .await
}

/// Creates `org` and `org/b0000`..`org/b0999` through `ch`.
async fn budgets(ch: Channel) -> anyhow::Result<()> {
    let mut c = LedgerServiceClient::new(ch);
    c.create_budget(CreateBudgetRequest {
        budget_id: "org".into(),
        token_limit: Some(switchyard_ledger::MAX_AMOUNT),
        ..Default::default()
    })
    .await?;
    for b in 0..BUDGETS {
        c.create_budget(CreateBudgetRequest {
            budget_id: format!("org/b{b:04}"),
            parent_id: "org".into(),
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

async fn pairs(channels: &[Channel], spread: u64, base: u64) -> Load {
    load(channels, move |ch, seq| async move {
        let mut l = LedgerServiceClient::new(ch);
        let budget = format!("org/b{:04}", seq % spread);
        let took = reserve_commit(&mut l, budget, base + seq).await?;
        Ok(Some(took))
    })
    .await
}

pub(crate) async fn run() -> anyhow::Result<()> {
    let cluster = match PgCluster::start() {
        Ok(c) => c,
        Err(Unavailable::Skip(why)) => {
            println!("\nLedger on PostgreSQL: skipped ({why})");
            return Ok(());
        }
    };
    println!(
        "\nLedger over gRPC on PostgreSQL 15 (throwaway cluster, fsync on), {CALLERS} callers, Reserve+Commit pairs (both durable):"
    );
    // Sled, in the same run and the same shape (a replica with its own key
    // service), for comparison.
    let sled = Stack::start_with(&[ServiceKind::Auth, ServiceKind::Ledger], |c| {
        c.server.request_timeout_ms = 60_000;
    })
    .await?;
    let ch = vec![sled.channel().await?, sled.channel().await?];
    budgets(ch[0].clone()).await?;
    let mut figures: Vec<(String, u64, Load, f64)> = Vec::new();
    for (spread, base) in [(1, 0), (BUDGETS, 1 << 40)] {
        let l = pairs(&ch, spread, base).await;
        figures.push(("sled, 1 process".into(), spread, l, 0.0));
    }
    sled.stop().await?;

    for n in [1usize, 3] {
        let url = cluster.database()?;
        let mut stacks = Vec::new();
        for _ in 0..n {
            stacks.push(replica(&url).await?);
        }
        let mut channels = Vec::new();
        for s in &stacks {
            channels.push(s.channel().await?);
            channels.push(s.channel().await?);
        }
        budgets(channels[0].clone()).await?;
        for (spread, base) in [(1, 2 << 40), (BUDGETS, 3 << 40)] {
            let (cpu0, t0) = (postgres_cpu_secs(), Instant::now());
            let l = pairs(&channels, spread, base).await;
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            let share = (postgres_cpu_secs() - cpu0) / (t0.elapsed().as_secs_f64() * cores);
            figures.push((
                format!("postgres, {n} replica{}", if n == 1 { "" } else { "s" }),
                spread,
                l,
                share,
            ));
        }
        for s in stacks {
            s.stop().await?;
        }
    }
    let rate = |who: &str, spread: u64| {
        figures
            .iter()
            .find(|(w, s, _, _)| w == who && *s == spread)
            .map_or(0.0, |f| f.2.rate)
    };
    for (who, spread, l, share) in &figures {
        let name = if *spread == 1 {
            "one hot budget"
        } else {
            "1,000 budgets"
        };
        let pg = if who.starts_with("postgres") {
            format!("  postgres CPU {:>4.0}% of the machine", share * 100.0)
        } else {
            String::new()
        };
        println!(
            "  {who:<22} {name:<15} {:>8.0} pairs/s  Reserve p50 {:>7.1} us  p99 {:>8.1} us  errors {}{pg}",
            l.rate, l.p50_us, l.p99_us, l.errors
        );
    }
    let (one, three) = (
        rate("postgres, 1 replica", BUDGETS),
        rate("postgres, 3 replicas", BUDGETS),
    );
    let hot = rate("postgres, 1 replica", 1).max(rate("postgres, 3 replicas", 1));
    println!(
        "  3 replicas / 1 replica on 1,000 budgets: {:.2}x  [{}: >= 1.50x]",
        three / one.max(1.0),
        verdict(three >= 1.5 * one)
    );
    println!(
        "  one hot budget, best of 1 and 3 replicas: {hot:.0} pairs/s  [{}: >= 5000 pairs/s]",
        verdict(hot >= 5_000.0)
    );
    // The cluster stops when dropped; give the replicas' pools a moment.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}
