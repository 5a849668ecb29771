//! Executor benchmarks (issue 4): job throughput on `builtin.noop`, the
//! latency of a durable 3-step `builtin.echo` chain, and the overhead of a
//! command task over spawning the command directly. The whole stack runs in
//! this process as `switchyard dev` does; clients use gRPC on loopback and
//! learn of completion through WatchJob, as a user would.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use switchyard_api::ExecutorClient;
use switchyard_cli::ServiceKind;
use switchyard_proto::executor::v1::{
    AgentTask, CommandTask, JobSpec, JobState, SubmitJobRequest, TaskSpec, WatchJobRequest,
    task_spec::Kind,
};
use switchyard_testkit::Stack;
use tokio_stream::StreamExt;

use crate::{CALLERS, CONNECTIONS, us, verdict};

pub(crate) const JOBS: usize = 5_000;
/// Jobs whose journals are linked again to time the chain.
const CHAINED_JOBS: usize = 200;
const CHAIN_RUNS: usize = 200;
const COMMAND_RUNS: usize = 200;

/// `true` through the command runner alone, sandboxed and not, interleaved;
/// also the Landlock ABI in use.
async fn runner_overhead() -> anyhow::Result<(Histogram<u64>, Histogram<u64>, i32)> {
    use switchyard_sandbox::{Limits, Policy, Sandbox, SandboxMode, program::Programs};
    let dir = tempfile::tempdir()?;
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let read = switchyard_sandbox::policy::default_read_paths();
    let sandbox = |mode| {
        Sandbox::detect(&Policy {
            mode,
            read_paths: &read,
            ids_when_root: (65534, 65534),
            network_commands: &[],
            scratch_root: dir.path(),
        })
        .map_err(anyhow::Error::msg)
    };
    let (on, off) = (sandbox(SandboxMode::On)?, sandbox(SandboxMode::Off)?);
    on.hand_over(&scratch)?;
    let programs = Programs::resolve(&["true".into()], "/usr/bin:/bin");
    let program = programs.get("true").map_err(anyhow::Error::msg)?;
    let limits = Limits {
        timeout: Duration::from_secs(10),
        grace: Duration::from_millis(100),
        cap: 1024,
    };
    let (mut h_on, mut h_off) = (Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?);
    for _ in 0..COMMAND_RUNS {
        for (s, h) in [(&on, &mut h_on), (&off, &mut h_off)] {
            let t = Instant::now();
            let jail = s
                .confine("true", program, &scratch, &Default::default())
                .map_err(anyhow::Error::msg)?;
            let f = switchyard_sandbox::run(
                &program.path,
                "true",
                &[],
                &[],
                &scratch,
                None,
                &limits,
                jail,
                &|_, _| {},
            )
            .await?;
            anyhow::ensure!(f.exit_code == Some(0), "true failed: {f:?}");
            h.record(t.elapsed().as_nanos() as u64).ok();
        }
    }
    Ok((h_on, h_off, on.abi()))
}

pub(crate) fn agent(
    id: &str,
    capability: &str,
    depends_on: &[&str],
    input: serde_json::Value,
) -> TaskSpec {
    TaskSpec {
        id: id.into(),
        depends_on: depends_on.iter().map(|s| s.to_string()).collect(),
        kind: Some(Kind::Agent(AgentTask {
            capability: capability.into(),
            input: switchyard_kit::json::json_to_struct(&input),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// How a client learns a job's end.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Shape {
    /// One call: SubmitJob with `wait` answers with the result.
    Wait,
    /// SubmitJob, then every event through WatchJob (the shape before
    /// SubmitJob could wait).
    Watch,
}

/// Runs `spec` with one SubmitJob that waits for its end; returns the time
/// from submit to the answer, and whether it completed.
pub(crate) async fn run_job(c: &ExecutorClient, spec: JobSpec) -> anyhow::Result<(Duration, bool)> {
    run_job_as(c, spec, Shape::Wait).await
}

/// Runs `spec`, learning its end the way `shape` says.
pub(crate) async fn run_job_as(
    c: &ExecutorClient,
    spec: JobSpec,
    shape: Shape,
) -> anyhow::Result<(Duration, bool)> {
    if shape == Shape::Wait {
        let t = Instant::now();
        let out = c
            .submit_job(SubmitJobRequest {
                spec: Some(spec),
                wait: Some(switchyard_kit::time::duration(60_000)),
                ..Default::default()
            })
            .await?;
        let completed = out
            .result
            .is_some_and(|r| r.state == JobState::Completed as i32);
        return Ok((t.elapsed(), completed));
    }
    let t = Instant::now();
    let job = c
        .submit_job(SubmitJobRequest {
            spec: Some(spec),
            ..Default::default()
        })
        .await?
        .job
        .unwrap_or_default();
    let id = job.spec.map(|s| s.job_id).unwrap_or_default();
    let mut stream = c
        .watch_job(WatchJobRequest {
            job_id: id,
            after_sequence: 0,
            ..Default::default()
        })
        .await?;
    let mut completed = false;
    while let Some(e) = stream.next().await {
        let e = e?.event.unwrap_or_default();
        if e.kind == "job.state" {
            let to = e
                .data
                .as_ref()
                .and_then(|d| d.fields.get("to"))
                .map(switchyard_kit::json::value_to_json);
            completed = to.as_ref().and_then(|v| v.as_str()) == Some("completed");
        }
    }
    Ok((t.elapsed(), completed))
}

pub(crate) fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    us(h, q) / 1000.0
}

pub async fn run() -> anyhow::Result<()> {
    let stack = Stack::start_with(ServiceKind::ALL, |c| {
        c.server.request_timeout_ms = 60_000;
        c.executor.max_parallel = 4;
    })
    .await?;
    let mut channels = Vec::new();
    for _ in 0..CONNECTIONS {
        channels.push(stack.channel().await?);
    }
    // The built-in agents register at start; wait until they route.
    let c = ExecutorClient::remote(channels[0].clone(), 4 << 20);
    crate::history::wait_routable(&c).await?;

    println!(
        "\nExecutor: the whole stack in-process, gRPC on loopback, durable sled (group commit), approval by policy:"
    );

    // 1. Throughput: 5,000 single-task jobs on builtin.noop, 64 submitters,
    // first with the one-call shape, then following every event (as
    // clients had to before SubmitJob could wait), in the same run.
    let mut rates = Vec::new();
    for shape in [Shape::Wait, Shape::Watch] {
        let before = Costs::now();
        let (rate, all, failed) = throughput(&channels, shape).await?;
        let cost = Costs::now().since(&before);
        rates.push(rate);
        let how = match shape {
            Shape::Wait => "SubmitJob(wait)          ",
            Shape::Watch => "SubmitJob + every event  ",
        };
        let goal = match shape {
            Shape::Wait => format!(
                "  [{}: >= 3000 jobs/s]",
                verdict(rate >= 3000.0 && failed == 0)
            ),
            Shape::Watch => format!("  ({:.2}x of the one call)", rate / rates[0]),
        };
        println!(
            "  {JOBS} single-task jobs (builtin.noop), {CALLERS} submitters, {how}: {rate:>7.0} jobs/s  submit->completed p50 {:>6.1} ms  p99 {:>6.1} ms  not completed {failed}{goal}",
            ms(&all, 0.5),
            ms(&all, 0.99),
        );
        let per = |v: u64| v as f64 / JOBS as f64;
        println!(
            "    per job: {:>7.0} bytes written by the process, {:>7.0} to the machine's disks (file-system journal included), {:.2} store flushes, {:.1} context switches (the whole process, client included)",
            per(cost.write_bytes),
            per(cost.disk_bytes),
            per(cost.flushes),
            per(cost.context_switches),
        );
    }

    // 1b. The same throughput with 100 Cedar policies in force (each job's
    // submission and spend decided by them), against this stack without,
    // alternated so both see the same machine.
    let dir = tempfile::tempdir()?;
    let hundred = crate::policy::hundred();
    for s in &hundred {
        std::fs::write(dir.path().join(&s.name), &s.text)?;
    }
    let policy_dir = dir.path().to_owned();
    let with_policies = Stack::start_with(ServiceKind::ALL, move |c| {
        c.server.request_timeout_ms = 60_000;
        c.executor.max_parallel = 4;
        c.policy.dir = Some(policy_dir);
    })
    .await?;
    let mut on_channels = Vec::new();
    for _ in 0..CONNECTIONS {
        on_channels.push(with_policies.channel().await?);
    }
    crate::history::wait_routable(&ExecutorClient::remote(on_channels[0].clone(), 4 << 20)).await?;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        off.push(throughput(&channels, Shape::Wait).await?.0);
        let (rate, _, failed) = throughput(&on_channels, Shape::Wait).await?;
        anyhow::ensure!(
            failed == 0,
            "{failed} jobs did not complete with policies on"
        );
        on.push(rate);
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let ratio = best(&on) / best(&off);
    println!(
        "  the same with 100 Cedar policies deciding each submission and spend: {:>7.0} jobs/s vs {:>7.0} without (best of 2 each, alternated): {ratio:.2}x  [{}: >= 0.95x]",
        best(&on),
        best(&off),
        verdict(ratio >= 0.95)
    );
    with_policies.stop().await?;

    // 1c. The journal's hash chain and seals (issue 46): what linking every
    // event and signing each finished job's head costs a job, as a share
    // of the machine time a job takes at the throughput measured above (2
    // cores / jobs per second); and how fast VerifyJournals checks what
    // this run stored.
    let approvals = switchyard_api::ApprovalClient::remote(channels[0].clone(), 4 << 20);
    let ledger = switchyard_api::LedgerClient::remote(channels[0].clone(), 4 << 20);
    journal(&c, &approvals, &ledger, best(&off)).await?;

    // 2. Latency: a 3-step chain of builtin.echo, one at a time.
    let c = ExecutorClient::remote(channels[0].clone(), 4 << 20);
    let h = chain(&c, CHAIN_RUNS).await?;
    println!(
        "  3-step builtin.echo chain, {CHAIN_RUNS} runs, every step durable: submit->result p50 {:>6.2} ms  p99 {:>6.2} ms  [{}: p50 <= 3 ms]",
        ms(&h, 0.5),
        ms(&h, 0.99),
        verdict(ms(&h, 0.5) <= 3.0)
    );

    // 3. Command-task overhead: a job of one `true` vs spawning `true`, with
    // the sandbox on (this stack) and off (a second stack), interleaved so
    // both see the same machine; and the runner alone, on and off.
    let off_stack = Stack::start_with(ServiceKind::ALL, |c| {
        c.executor.approval_poll_ms = 5;
        c.executor.sandbox = switchyard_executor::SandboxMode::Off;
    })
    .await?;
    let c_off = ExecutorClient::remote(off_stack.channel().await?, 4 << 20);
    let command_job = || JobSpec {
        tasks: vec![TaskSpec {
            id: "t".into(),
            kind: Some(Kind::Command(CommandTask {
                command: "true".into(),
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut direct = Histogram::<u64>::new(3)?;
    let mut job_on = Histogram::<u64>::new(3)?;
    let mut job_off = Histogram::<u64>::new(3)?;
    for _ in 0..COMMAND_RUNS {
        let t = Instant::now();
        tokio::process::Command::new("true").status().await?;
        direct.record(t.elapsed().as_nanos() as u64).ok();
        let (took, ok) = run_job(&c, command_job()).await?;
        anyhow::ensure!(ok, "sandboxed command job did not complete");
        job_on.record(took.as_nanos() as u64).ok();
        let (took, ok) = run_job(&c_off, command_job()).await?;
        anyhow::ensure!(ok, "unsandboxed command job did not complete");
        job_off.record(took.as_nanos() as u64).ok();
    }
    let (runner_on, runner_off, abi) = runner_overhead().await?;
    println!(
        "  one `true` command: spawned directly p50 {:>6.2} ms  p99 {:>6.2} ms; as a job p50 {:>6.2} ms  p99 {:>6.2} ms; overhead p50 {:>6.2} ms",
        ms(&direct, 0.5),
        ms(&direct, 0.99),
        ms(&job_on, 0.5),
        ms(&job_on, 0.99),
        ms(&job_on, 0.5) - ms(&direct, 0.5)
    );
    let added_job = ms(&job_on, 0.5) - ms(&job_off, 0.5);
    let added_runner = ms(&runner_on, 0.5) - ms(&runner_off, 0.5);
    println!(
        "  the sandbox (Landlock ABI {abi}, seccomp, rlimits): job with it p50 {:>6.2} ms, without {:>6.2} ms (+{added_job:.2} ms); runner alone p50 {:>6.3} ms vs {:>6.3} ms (+{added_runner:.3} ms)  [{}: adds <= 1 ms p50]",
        ms(&job_on, 0.5),
        ms(&job_off, 0.5),
        ms(&runner_on, 0.5),
        ms(&runner_off, 0.5),
        verdict(added_job <= 1.0 && added_runner <= 1.0)
    );
    off_stack.stop().await?;
    stack.stop().await?;
    Ok(())
}

/// `runs` 3-step `builtin.echo` chains, one at a time through `c`: each
/// one's time from submit to result.
pub(crate) async fn chain(c: &ExecutorClient, runs: usize) -> anyhow::Result<Histogram<u64>> {
    let mut h = Histogram::<u64>::new(3)?;
    for i in 0..runs {
        let spec = JobSpec {
            input: switchyard_kit::json::json_to_struct(&serde_json::json!({"n": i})),
            tasks: vec![
                agent(
                    "a",
                    "builtin.echo",
                    &[],
                    serde_json::json!({"text": "${parent.input.n}"}),
                ),
                agent(
                    "b",
                    "builtin.echo",
                    &["a"],
                    serde_json::json!({"text": "${a.output.text}"}),
                ),
                agent(
                    "c",
                    "builtin.echo",
                    &["b"],
                    serde_json::json!({"text": "${b.output.text}"}),
                ),
            ],
            ..Default::default()
        };
        let (took, ok) = run_job(c, spec).await?;
        anyhow::ensure!(ok, "chain {i} did not complete");
        h.record(took.as_nanos() as u64).ok();
    }
    Ok(h)
}

/// [`JOBS`] single-task `builtin.noop` jobs from [`CALLERS`] closed-loop
/// submitters over `channels`: jobs/s, latencies, and how many did not
/// complete.
pub(crate) async fn throughput(
    channels: &[switchyard_kit::client::Intercepted],
    shape: Shape,
) -> anyhow::Result<(f64, Histogram<u64>, u64)> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..CALLERS {
        let c = ExecutorClient::remote(channels[w % channels.len()].clone(), 4 << 20);
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            let mut failed = 0u64;
            for _ in (w..JOBS).step_by(CALLERS) {
                let spec = JobSpec {
                    tasks: vec![agent("t", "builtin.noop", &[], serde_json::json!({}))],
                    ..Default::default()
                };
                let (took, ok) = run_job_as(&c, spec, shape).await?;
                h.record(took.as_nanos() as u64).ok();
                failed += u64::from(!ok);
            }
            Ok::<_, anyhow::Error>((h, failed))
        }));
    }
    let mut all = Histogram::<u64>::new(3)?;
    let mut failed = 0;
    for t in tasks {
        let (h, f) = t.await??;
        all.add(h).ok();
        failed += f;
    }
    Ok((JOBS as f64 / start.elapsed().as_secs_f64(), all, failed))
}

/// What the process has spent so far: bytes it caused to be written to
/// storage (`/proc/self/io`), bytes the machine's disks took (everything,
/// the file system's journal included, which `/proc/self/io` leaves out:
/// meaningful on an otherwise idle machine), store flushes (the
/// `store_flush_seconds` histogram's count) and context switches (every
/// thread's status).
struct Costs {
    write_bytes: u64,
    disk_bytes: u64,
    flushes: u64,
    context_switches: u64,
}

/// Bytes written to the machine's disks so far: the whole devices in
/// `/sys/block` (partitions are not listed there), without loop, RAM and
/// device-mapper devices, which would count the same writes twice.
fn disk_bytes() -> u64 {
    let Ok(devices) = std::fs::read_dir("/sys/block") else {
        return 0;
    };
    devices
        .flatten()
        .filter(|d| {
            let name = d.file_name();
            let name = name.to_string_lossy();
            !["loop", "ram", "zram", "dm-", "md"]
                .iter()
                .any(|p| name.starts_with(p))
        })
        .filter_map(|d| std::fs::read_to_string(d.path().join("stat")).ok())
        // Field 7: sectors written (512 bytes each).
        .filter_map(|stat| stat.split_whitespace().nth(6)?.parse::<u64>().ok())
        .sum::<u64>()
        * 512
}

impl Costs {
    fn now() -> Costs {
        let field = |text: &str, name: &str| -> u64 {
            text.lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .sum()
        };
        let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
        // Per thread (a process's own status file counts its first thread
        // only); threads that ended are not counted.
        let status: String = std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("status")).ok())
            .collect();
        let metrics = switchyard_kit::metrics::global().render();
        let flushes = metrics
            .lines()
            .filter(|l| l.contains("store_flush_seconds_count"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>() as u64;
        Costs {
            write_bytes: field(&io, "write_bytes:"),
            disk_bytes: disk_bytes(),
            flushes,
            context_switches: field(&status, "voluntary_ctxt_switches:")
                + field(&status, "nonvoluntary_ctxt_switches:"),
        }
    }

    fn since(&self, before: &Costs) -> Costs {
        Costs {
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
            disk_bytes: self.disk_bytes.saturating_sub(before.disk_bytes),
            flushes: self.flushes.saturating_sub(before.flushes),
            context_switches: self
                .context_switches
                .saturating_sub(before.context_switches),
        }
    }
}

/// The chains' cost per job against the machine time a job takes at
/// `rate` jobs/s — the job's journal and its approval run's audit, each
/// linked and sealed, and its share of the ledger's records linked — and
/// how fast VerifyJournals, VerifyAudit and the ledger's VerifyJournal
/// check what is stored.
async fn journal(
    c: &ExecutorClient,
    approvals: &switchyard_api::ApprovalClient,
    ledger: &switchyard_api::LedgerClient,
    rate: f64,
) -> anyhow::Result<()> {
    use prost::Message as _;
    use switchyard_kit::chain::{self, Head};
    let listed = c
        .list_jobs(switchyard_proto::executor::v1::ListJobsRequest {
            page_size: CHAINED_JOBS as u32,
            ..Default::default()
        })
        .await?;
    let mut journals = Vec::new();
    for j in &listed.jobs {
        let id = j
            .spec
            .as_ref()
            .map(|s| s.job_id.clone())
            .unwrap_or_default();
        let mut w = c
            .watch_job(WatchJobRequest {
                job_id: id,
                ..Default::default()
            })
            .await?;
        let mut evs = Vec::new();
        while let Some(m) = w.next().await {
            if let Some(e) = m?.event {
                evs.push(e);
            }
        }
        let audit = approvals
            .list_audit(switchyard_proto::approval::v1::ListAuditRequest {
                run_id: j.run_id.clone(),
                page_size: 1000,
                ..Default::default()
            })
            .await?
            .records;
        journals.push((j.clone(), evs, audit));
    }
    anyhow::ensure!(!journals.is_empty(), "no job to chain");
    // The ledger's records, all of them (each budget's chain); this run's
    // jobs wrote them, so per job is their number over the jobs'.
    let t = Instant::now();
    let lv = ledger
        .verify_journal(switchyard_proto::ledger::v1::VerifyJournalRequest::default())
        .await?;
    let ledger_took = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        lv.problems.is_empty(),
        "the ledger journal of this run does not verify: {:?}",
        lv.problems.first()
    );
    let mut ledger_records = Vec::new();
    let mut w = ledger
        .watch(switchyard_proto::ledger::v1::WatchRequest::default())
        .await?;
    while (ledger_records.len() as u64) < lv.records + lv.unlinked {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
            .await
            .map_err(|_| anyhow::anyhow!("the ledger's watch stopped short"))?;
        let Some(m) = next else { break };
        if let Some(r) = m?.record {
            ledger_records.push(r);
        }
    }
    drop(w);
    let events: usize = journals.iter().map(|(_, e, _)| e.len()).sum();
    let records: usize = journals.iter().map(|(_, _, a)| a.len()).sum();
    let (key, _) = switchyard_kit::receipt::ReceiptKey::generate()?;
    // What the services do per job: the executor links each event as it
    // records it (a protobuf encoding and a SHA-256) and signs the head
    // when the job finishes; the approval service links each of the run's
    // audit records and signs the head when the run ends.
    let t = Instant::now();
    let mut bytes = 0usize;
    for (job, evs, audit) in &journals {
        let mut head = Head::default();
        for e in evs {
            bytes += e.encoded_len();
            head = switchyard_executor::audit::next_head(head, e);
        }
        let id = job
            .spec
            .as_ref()
            .map(|s| s.job_id.as_str())
            .unwrap_or_default();
        let seal = switchyard_executor::audit::seal_of(&key, id, job, head, 0);
        std::hint::black_box(seal);
        let head = audit.iter().fold(Head::default(), |h, rec| {
            switchyard_approval::chain::next_head(&job.run_id, h, rec)
        });
        let stream = switchyard_approval::chain::stream(&job.run_id);
        let summary =
            serde_json::json!({"run_id": job.run_id, "tenant": job.tenant, "status": "completed"});
        std::hint::black_box(chain::checkpoint_with(&key, &[(stream, head)], 0, summary));
    }
    let mut per_job = t.elapsed().as_secs_f64() / journals.len() as f64;
    // The ledger links each record as the desk makes it and moves the
    // budget's head as the books apply it: one encoding and one SHA-256.
    let t = Instant::now();
    for r in &ledger_records {
        std::hint::black_box(switchyard_ledger::chain::head_after(r));
    }
    let ledger_all = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let v = c
        .verify_journals(switchyard_proto::executor::v1::VerifyJournalsRequest::default())
        .await?;
    let took = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        v.problems.is_empty(),
        "the journals of this run do not verify: {:?}",
        v.problems.first()
    );
    // Every job of the run wrote its share of the ledger's records.
    let ledger_jobs = v.jobs.max(1) as f64;
    per_job += ledger_all / ledger_jobs;
    let machine_per_job = 2.0 / rate;
    let share = per_job / machine_per_job;
    println!(
        "  the chains and seals: {:.1} us a job ({} events of {:.0} bytes, {} audit records and {:.1} ledger records linked, two Ed25519 seals), {:.2}% of the {:.0} us of machine time a job takes at {rate:.0} jobs/s on 2 cores  [{}: <= 5%]",
        per_job * 1e6,
        events / journals.len(),
        bytes as f64 / events as f64,
        records / journals.len(),
        ledger_records.len() as f64 / ledger_jobs,
        share * 100.0,
        machine_per_job * 1e6,
        verdict(share <= 0.05)
    );
    println!(
        "  VerifyJournals over this run's {} jobs ({} events, {} seals): {:.2} s, {:.0} events/s",
        v.jobs,
        v.records,
        v.sealed,
        took,
        v.records as f64 / took
    );
    let t = Instant::now();
    let v = approvals
        .verify_audit(switchyard_proto::approval::v1::VerifyAuditRequest::default())
        .await?;
    let took = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        v.problems.is_empty(),
        "the approval audit of this run does not verify: {:?}",
        v.problems.first()
    );
    println!(
        "  VerifyAudit over this run's {} approval runs ({} records, {} seals): {:.2} s, {:.0} records/s",
        v.runs,
        v.records,
        v.sealed,
        took,
        v.records as f64 / took
    );
    println!(
        "  ledger VerifyJournal over {} budgets ({} records): {:.2} s, {:.0} records/s",
        lv.budgets,
        lv.records,
        ledger_took,
        lv.records as f64 / ledger_took
    );
    Ok(())
}
