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
    executor(&cluster).await?;
    // The cluster stops when dropped; give the replicas' pools a moment.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

/// A whole stack (every service) on database `url`, or on sled when `None`.
async fn stack(url: Option<&str>) -> anyhow::Result<Stack> {
    let url = url.map(str::to_owned);
    Stack::start_with(ServiceKind::ALL, move |c| {
        if let Some(url) = url {
            c.storage.backend = switchyard_cli::config::StorageBackend::Postgres;
            c.storage.postgres.url = url;
            c.storage.postgres.pool_size = 16;
        }
        c.server.request_timeout_ms = 60_000;
        c.executor.max_parallel = 4;
    })
    .await
}

/// What PostgreSQL ran for a phase: statements, and the one that took the
/// most time (calls, ms, text).
fn statements(cluster: &PgCluster, url: &str) -> Option<(u64, String)> {
    let total = cluster
        .psql(
            url,
            "SELECT sum(calls) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .ok()?;
    let top = cluster
        .psql(
            url,
            "SELECT calls || ' calls, ' || round(total_exec_time) || ' ms: ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 70)
             FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             ORDER BY total_exec_time DESC LIMIT 1",
        )
        .ok()?;
    // Calls by the service whose tables a statement names (BEGIN, COMMIT
    // and the like apart).
    let by = cluster
        .psql(
            url,
            "SELECT string_agg(who || ' ' || n, ', ' ORDER BY n DESC) FROM (
                 SELECT CASE WHEN query ~* 'exec_' THEN 'executor'
                             WHEN query ~* 'ledger_' THEN 'ledger'
                             WHEN query ~* 'approval_' THEN 'approval'
                             WHEN query ~* 'registry_' THEN 'registry'
                             WHEN query ~* 'switchyard_leases' THEN 'leases'
                             ELSE 'begin/commit/other' END AS who,
                        sum(calls) AS n
                 FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                 GROUP BY 1) x",
        )
        .ok()?;
    Some((
        total.trim().parse().ok()?,
        format!("{}; calls by service: {}", top.trim(), by.trim()),
    ))
}

/// The executor on PostgreSQL with one and three replicas (each a whole
/// stack on the database), next to sled: W1 (single-task jobs, 64
/// submitters, SubmitJob waiting for the end) and the 3-step chain.
async fn executor(cluster: &PgCluster) -> anyhow::Result<()> {
    use crate::executor::{Shape, chain, ms, throughput};
    const CHAINS: usize = 100;
    println!(
        "\nExecutor on PostgreSQL 15 (each replica a whole stack on one database; {CALLERS} submitters; approval by policy):"
    );
    let mut rows: Vec<Row> = Vec::new();
    for n in [0usize, 1, 3] {
        let url = if n == 0 {
            None
        } else {
            Some(cluster.database()?)
        };
        if let Some(u) = &url {
            let _ = cluster.psql(u, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        }
        let mut stacks = Vec::new();
        for _ in 0..n.max(1) {
            stacks.push(stack(url.as_deref()).await?);
        }
        let mut channels = Vec::new();
        for s in &stacks {
            channels.push(s.channel().await?);
            channels.push(s.channel().await?);
        }
        for ch in &channels {
            let c = switchyard_api::ExecutorClient::remote(ch.clone(), 4 << 20);
            crate::history::wait_routable(&c).await?;
        }
        if let Some(u) = &url {
            let _ = cluster.psql(u, "SELECT pg_stat_statements_reset()");
        }
        let (cpu0, t0) = (postgres_cpu_secs(), Instant::now());
        let (rate, all, failed) = throughput(&channels, Shape::Wait).await?;
        anyhow::ensure!(failed == 0, "{failed} jobs did not complete");
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let pg_cpu = postgres_cpu_secs() - cpu0;
        let share = pg_cpu / (t0.elapsed().as_secs_f64() * cores);
        let pg_cpu_per_job = pg_cpu / crate::executor::JOBS as f64;
        let stmts = url.as_deref().and_then(|u| statements(cluster, u));
        let c = switchyard_api::ExecutorClient::remote(channels[0].clone(), 4 << 20);
        let h = chain(&c, CHAINS).await?;
        let who = match n {
            0 => "sled, 1 process".to_owned(),
            1 => "postgres, 1 replica".to_owned(),
            _ => format!("postgres, {n} replicas"),
        };
        let (per_job, top) = match stmts {
            Some((total, top)) => (total as f64 / crate::executor::JOBS as f64, top),
            None => (0.0, String::new()),
        };
        rows.push(Row {
            who,
            rate,
            p50: ms(&all, 0.5),
            chain_p50: ms(&h, 0.5),
            share,
            cpu_per_job: pg_cpu_per_job,
            per_job,
            top,
        });
        for s in stacks {
            s.stop().await?;
        }
    }
    for Row {
        who,
        rate,
        p50,
        chain_p50,
        share,
        cpu_per_job,
        per_job,
        ..
    } in &rows
    {
        let pg = if who.starts_with("postgres") {
            format!(
                "  postgres CPU {:>3.0}% of the machine, {:.2} ms/job ({:.0} jobs per postgres CPU-second) [{}: >= 1000], {per_job:.1} statements/job [{}: <= 10]",
                share * 100.0,
                cpu_per_job * 1000.0,
                1.0 / cpu_per_job.max(1e-9),
                verdict(*cpu_per_job > 0.0 && 1.0 / cpu_per_job >= 1000.0),
                verdict(*per_job <= 10.0)
            )
        } else {
            String::new()
        };
        println!(
            "  {who:<22} W1 {rate:>6.0} jobs/s  submit->completed p50 {p50:>6.1} ms;  3-step chain p50 {chain_p50:>6.2} ms{pg}"
        );
    }
    for Row { who, top, .. } in &rows {
        if !top.is_empty() {
            println!("  {who}: most time in {top}");
        }
    }
    let three = rows.iter().find(|r| r.who == "postgres, 3 replicas");
    let one = rows.iter().find(|r| r.who == "postgres, 1 replica");
    if let (Some(three), Some(one)) = (three, one) {
        println!(
            "  3 replicas: {:.0} jobs/s ({:.2}x of 1 replica)  [{}: >= 1000 jobs/s; {}: >= 0.9x of 1 replica]; chain p50 {:.2} ms  [{}: <= 20 ms]",
            three.rate,
            three.rate / one.rate.max(1.0),
            verdict(three.rate >= 1000.0),
            verdict(three.rate >= 0.9 * one.rate),
            three.chain_p50,
            verdict(three.chain_p50 <= 20.0)
        );
    }
    Ok(())
}

/// One row of the executor-on-PostgreSQL figures.
struct Row {
    who: String,
    /// W1 jobs/s.
    rate: f64,
    /// Submit to completed, p50 ms.
    p50: f64,
    /// The 3-step chain, p50 ms.
    chain_p50: f64,
    /// PostgreSQL's share of the machine's CPU.
    share: f64,
    /// PostgreSQL CPU seconds per job.
    cpu_per_job: f64,
    /// SQL statements per job.
    per_job: f64,
    /// The statement that took most time, and calls by service.
    top: String,
}
