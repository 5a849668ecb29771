//! Growth with history: a real `switchyard dev` process runs N finished
//! single-task jobs; its resident memory, data on disk and restart time
//! are measured after them, after a restart, and after retention prunes
//! them. What should grow with live work only must not grow with N.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use switchyard_api::ExecutorClient;
use switchyard_kit::client::{Credential, authed, connect};
use switchyard_proto::executor::v1::{GetJobRequest, JobSpec};

use crate::executor::{agent, run_job};
use crate::verdict;

/// Submitters.
const CALLERS: usize = 64;

/// A `switchyard dev` process.
pub(crate) struct Dev {
    child: Child,
    pub(crate) url: String,
    /// Spawn to the `listening grpc=` line (every store replayed).
    pub(crate) ready_in: Duration,
}

impl Dev {
    pub(crate) fn start(bin: &Path, data: &Path, env: &[(&str, &str)]) -> anyhow::Result<Dev> {
        let started = Instant::now();
        let mut cmd = Command::new(bin);
        cmd.args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // `SWITCHYARD_BENCH_LOG=FILE`: start-up and warnings go there.
        if let Some(log) = std::env::var_os("SWITCHYARD_BENCH_LOG") {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?;
            cmd.env("RUST_LOG", "warn,switchyard_kit::server=info,switchyard_ledger=info,switchyard_approval=info,switchyard_executor::book=info,switchyard_cli=info")
                .stderr(Stdio::from(f));
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let addr = loop {
            let line = lines
                .next()
                .context("switchyard dev exited before it was ready")??;
            if let Some(a) = line.strip_prefix("listening grpc=") {
                // `grpc=ADDR http=ADDR resp=ADDR`: the first is the gRPC port.
                break a.split_whitespace().next().unwrap_or_default().to_owned();
            }
        };
        // Keep draining stdout so the process never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Ok(Dev {
            child,
            url: format!("http://{addr}"),
            ready_in: started.elapsed(),
        })
    }

    /// Resident memory, bytes.
    pub(crate) fn rss(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("VmRSS")?;
        Ok(kb * 1024)
    }

    /// SIGTERM and wait.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes under `dir`.
pub(crate) fn disk(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The `switchyard` binary beside this one (`cargo build --release -p
/// switchyard-cli`), or `SWITCHYARD_BIN`.
pub(crate) fn binary() -> anyhow::Result<PathBuf> {
    if let Some(b) = std::env::var_os("SWITCHYARD_BIN") {
        return Ok(b.into());
    }
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("switchyard");
    anyhow::ensure!(
        bin.exists(),
        "{} not found: build it first (cargo build --release -p switchyard-cli)",
        bin.display()
    );
    Ok(bin)
}

/// A JobService client as alice of `data`'s dev credentials.
pub(crate) async fn alice(url: &str, data: &Path) -> anyhow::Result<ExecutorClient> {
    let creds: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("credentials.json"))?)?;
    let token = creds["principals"]["alice"]["token"]
        .as_str()
        .context("alice's token")?;
    let ch = authed(
        connect(url).await?,
        Some(Credential::bearer(token).map_err(anyhow::Error::msg)?),
    );
    Ok(ExecutorClient::remote(ch, 4 << 20))
}

/// Runs `n` single-task jobs to their end, `CALLERS` at a time; returns
/// the first job's id and how many did not complete.
pub(crate) async fn run_jobs(c: &ExecutorClient, n: usize) -> anyhow::Result<(String, u64)> {
    let first = format!("history-{}", uuid_like());
    let mut tasks = Vec::new();
    for w in 0..CALLERS {
        let c = c.clone();
        let first = first.clone();
        tasks.push(tokio::spawn(async move {
            let mut failed = 0;
            for i in (w..n).step_by(CALLERS) {
                let spec = JobSpec {
                    job_id: if i == 0 { first.clone() } else { String::new() },
                    tasks: vec![agent("t", "builtin.noop", &[], serde_json::json!({}))],
                    ..Default::default()
                };
                let (_, ok) = run_job(&c, spec).await?;
                failed += u64::from(!ok);
            }
            Ok::<_, anyhow::Error>(failed)
        }));
    }
    let mut failed = 0;
    for t in tasks {
        failed += t.await??;
    }
    Ok((first, failed))
}

fn uuid_like() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Waits until the built-in agents route.
pub(crate) async fn wait_routable(c: &ExecutorClient) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = c
            .validate_job(switchyard_proto::executor::v1::ValidateJobRequest {
                spec: Some(JobSpec {
                    tasks: vec![agent("t", "builtin.noop", &[], serde_json::json!({}))],
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?;
        if v.routes.first().is_some_and(|r| !r.agent_id.is_empty()) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "built-in agents did not register"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Waits (up to a minute) until retention has pruned job `id`.
async fn pruned(c: &ExecutorClient, id: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while c
        .get_job(GetJobRequest {
            job_id: id.to_owned(),
        })
        .await
        .is_ok()
    {
        anyhow::ensure!(Instant::now() < deadline, "retention did not prune");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// `switchyard-bench history [N]`.
pub async fn run(n: usize) -> anyhow::Result<()> {
    let bin = binary()?;
    let dir = tempfile::tempdir()?;
    // `SWITCHYARD_BENCH_DATA` keeps the data directory for a look afterwards.
    let kept = std::env::var_os("SWITCHYARD_BENCH_DATA").map(PathBuf::from);
    let data = kept.as_deref().unwrap_or(dir.path());
    println!(
        "\nGrowth with history: `switchyard dev` (release), {n} finished single-task jobs (builtin.noop), {CALLERS} submitters:"
    );
    let dev = Dev::start(&bin, data, &[])?;
    let c = alice(&dev.url, data).await?;
    wait_routable(&c).await?;
    let rss0 = dev.rss()?;
    let disk0 = disk(data);
    let fresh = dev.ready_in;
    let started = Instant::now();
    let (first, failed) = run_jobs(&c, n).await?;
    let took = started.elapsed();
    let rss1 = dev.rss()?;
    dev.stop()?;
    let disk1 = disk(data);

    let dev = Dev::start(&bin, data, &[])?;
    let restart = dev.ready_in;
    let c = alice(&dev.url, data).await?;
    let first_job = c
        .get_job(GetJobRequest {
            job_id: first.clone(),
        })
        .await?;
    anyhow::ensure!(
        first_job.job.is_some(),
        "the first finished job reads back from disk"
    );
    let rss2 = dev.rss()?;
    dev.stop()?;

    // Retention: everything finished is past a 1 s window; one prune round.
    std::thread::sleep(Duration::from_millis(1_100));
    let env = [
        ("SWITCHYARD_EXECUTOR__RETENTION_SECS", "1"),
        ("SWITCHYARD_EXECUTOR__PRUNE_INTERVAL_SECS", "1"),
        ("SWITCHYARD_LEDGER__RETENTION_SECS", "1"),
        ("SWITCHYARD_APPROVAL__RETENTION_SECS", "1"),
        ("SWITCHYARD_APPROVAL__PRUNE_INTERVAL_SECS", "1"),
    ];
    let dev = Dev::start(&bin, data, &env)?;
    let c = alice(&dev.url, data).await?;
    pruned(&c, &first).await?;
    // Steady state with the short window: another fifth as many jobs, all
    // pruned in turn. Space the pruned jobs held is written again.
    let more = (n / 5).max(1);
    let (first_more, _) = run_jobs(&c, more).await?;
    // Memory of a process that keeps running while retention prunes: right
    // after these jobs, and once they are pruned too.
    let rss3 = dev.rss()?;
    pruned(&c, &first_more).await?;
    std::thread::sleep(Duration::from_millis(2_500));
    let rss4 = dev.rss()?;
    dev.stop()?;
    let disk3 = disk(data);

    let per_job = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / n as f64;
    println!(
        "  ran {n} jobs in {:.1} s ({:.0} jobs/s), not completed {failed}",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
    println!(
        "  RSS: fresh {:.1} MB, after the jobs {:.1} MB ({:.0} B/job), after a restart {:.1} MB  [{}: <= 150 MB after the jobs and after the restart]",
        mb(rss0),
        mb(rss1),
        per_job(rss0, rss1),
        mb(rss2),
        verdict(rss1 <= 150 << 20 && rss2 <= 150 << 20)
    );
    println!(
        "  RSS of the process that keeps running with a 1 s retention window: after {more} more jobs {:.1} MB, once retention pruned them {:.1} MB  [{}: pruning gives memory back without a restart]",
        mb(rss3),
        mb(rss4),
        verdict(rss4 < rss3)
    );
    println!(
        "  start-up to serving: fresh {:.0} ms, restart after {n} jobs {:.0} ms  [{}: <= 2 s]",
        fresh.as_secs_f64() * 1e3,
        restart.as_secs_f64() * 1e3,
        verdict(restart <= Duration::from_secs(2))
    );
    println!(
        "  disk: fresh {:.1} MB, after the jobs {:.1} MB ({:.0} B/job); with a 1 s retention window, pruned and {more} more jobs run: {:.1} MB  [{}: no growth past the first {n}]",
        mb(disk0),
        mb(disk1),
        per_job(disk0, disk1),
        mb(disk3),
        verdict(disk3 <= disk1 + disk1 / 20)
    );
    Ok(())
}
