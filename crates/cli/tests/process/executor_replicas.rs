//! Executor replicas (`switchyard serve --services executor`, each its own
//! process) sharing one PostgreSQL database, with the other services in one
//! process on the same database:
//!
//! - three replicas take a thousand jobs of mixed kinds (commands, built-in
//!   agents, chains, DAGs) submitted round-robin, while one replica after
//!   another is killed with `kill -9` and restarted, and PostgreSQL itself
//!   crashes and restarts once: every accepted job completes exactly once,
//!   no finished task runs again (marker files), none is stuck, every
//!   replica ran a share, and watchers on other replicas see gapless logs;
//! - a replica paused (SIGSTOP) past its lease loses the job to another and,
//!   resumed, cannot write: the log has one owner per epoch;
//! - a rolling restart (SIGTERM, one replica at a time) hands running jobs
//!   over at once: none is lost and none waits a lease;
//! - a cancel, an answer to a waiting step and a conversation message sent
//!   through a replica that does not run the job reach the one that does.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use switchyard_kit::client::Intercepted;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{GetJobRequest, JobState, SubmitJobRequest, WatchJobRequest};
use switchyard_testkit::pg::{PgCluster, Unavailable};
use tokio_stream::StreamExt;

type Jobs = JobServiceClient<Intercepted>;

/// The services besides the executors, the database, and where the
/// replicas keep their (unshared) data.
struct Cluster {
    pg: PgCluster,
    db: String,
    hub: Proc,
    dir: tempfile::TempDir,
    marks: PathBuf,
}

impl Cluster {
    fn start() -> Option<Cluster> {
        Cluster::start_with(&[])
    }

    /// With `hub_env` added to the other services' environment.
    fn start_with(hub_env: &[(&str, &str)]) -> Option<Cluster> {
        let pg = match PgCluster::start() {
            Ok(c) => c,
            Err(Unavailable::Skip(why)) => {
                eprintln!("skipped: {why}");
                return None;
            }
        };
        let db = pg.database().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("marks");
        std::fs::create_dir_all(&marks).unwrap();
        let mut env = vec![
            ("SWITCHYARD_STORAGE__BACKEND", "postgres"),
            ("SWITCHYARD_STORAGE__POSTGRES__URL", db.as_str()),
            ("SWITCHYARD_STORAGE__POSTGRES__POOL_SIZE", "8"),
        ];
        env.extend_from_slice(hub_env);
        let hub = serve(
            "auth,registry,router,ledger,approval",
            &dir.path().join("hub"),
            &env,
        );
        Some(Cluster {
            pg,
            db,
            hub,
            dir,
            marks,
        })
    }

    /// Executor replica `name` with a lease of `lease_ms`.
    fn replica(&self, name: &str, lease_ms: u64, extra: &[(&str, &str)]) -> Proc {
        let hub = self.hub.url();
        let to = Remotes {
            keys: &hub,
            registry: &hub,
            router: &hub,
            ledger: &hub,
            approval: &hub,
        };
        let lease = lease_ms.to_string();
        let mut env = vec![
            ("SWITCHYARD_STORAGE__BACKEND", "postgres"),
            ("SWITCHYARD_STORAGE__POSTGRES__URL", self.db.as_str()),
            ("SWITCHYARD_STORAGE__POSTGRES__POOL_SIZE", "8"),
            ("SWITCHYARD_EXECUTOR__REPLICA_ID", name),
            ("SWITCHYARD_EXECUTOR__JOB_LEASE_MS", lease.as_str()),
            // Marker files outside the job's scratch directory, which
            // another replica does not share: commands run unconfined here.
            ("SWITCHYARD_EXECUTOR__SANDBOX", "off"),
            ("SWITCHYARD_EXECUTOR__COMMANDS", "[\"sh\", \"sleep\"]"),
        ];
        env.extend_from_slice(extra);
        let data = self.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        serve_executor_logged(&data, &to, &env, &self.log(name))
    }

    /// Where replica `name` logs (warnings and errors).
    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// `sql`'s rows, one per line (psql's unaligned output).
    fn sql(&self, sql: &str) -> String {
        self.pg.psql(&self.db, sql).unwrap()
    }

    /// Lines in each marker file (`<job>.<task>`: one line per run).
    fn runs(&self) -> HashMap<String, usize> {
        std::fs::read_dir(&self.marks)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let n = std::fs::read_to_string(e.path()).unwrap().lines().count();
                (e.file_name().to_string_lossy().into_owned(), n)
            })
            .collect()
    }
}

/// The test's client runtime.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A channel to `url` presenting `token`, unless `url` does not answer.
async fn channel(url: &str, token: &str) -> Option<Intercepted> {
    let channel = switchyard_kit::client::connect(url).await.ok()?;
    Some(switchyard_kit::client::authed(
        channel,
        Some(switchyard_kit::client::Credential::bearer(token).unwrap()),
    ))
}

async fn client(url: &str, token: &str) -> Option<Jobs> {
    Some(JobServiceClient::new(channel(url, token).await?))
}

/// Job `i` of the mix: a command, a built-in agent call, a three-step
/// AGEniX chain, a four-task DAG; every command marks each run of itself.
fn job(i: usize, marks: &Path) -> (String, String) {
    let id = format!("j{i:05}");
    let mark = |task: &str| format!("echo run >> {}/{id}.{task}", marks.display());
    let doc = match i % 4 {
        0 => serde_json::json!({"job_id": id, "tasks": [
            {"id": "a", "command": {"command": "sh", "args": ["-c", mark("a")]}}]}),
        1 => serde_json::json!({"job_id": id, "tasks": [
            {"id": "a", "agent": {"capability": "builtin.echo", "input": {"text": "hi"}}}]}),
        2 => serde_json::json!({"job_id": id, "plan_id": "chain", "tasks": [
            {"task_number": 1, "command": "sh", "args": ["-c", format!("{}; echo one", mark("task_1"))]},
            {"task_number": 2, "command": "sh", "args": ["-c", format!("{}; cat", mark("task_2"))], "input_from_task": 1},
            {"task_number": 3, "command": "sh", "args": ["-c", format!("{}; cat", mark("task_3"))], "input_from_task": 2}]}),
        _ => serde_json::json!({"job_id": id, "tasks": [
            {"id": "a", "command": {"command": "sh", "args": ["-c", mark("a")]}},
            {"id": "b", "depends_on": ["a"], "command": {"command": "sh", "args": ["-c", mark("b")]}},
            {"id": "c", "depends_on": ["a"], "agent": {"capability": "builtin.echo", "input": {"text": "c"}}},
            {"id": "d", "depends_on": ["b", "c"], "command": {"command": "sh", "args": ["-c", mark("d")]}}]}),
    };
    (id, doc.to_string())
}

/// The replicas' current URLs, by slot (a restarted replica has a new port).
type Urls = Arc<Mutex<Vec<String>>>;

fn url_of(urls: &Urls, n: usize) -> String {
    let u = urls.lock().unwrap();
    u[n % u.len()].clone()
}

/// Submits `doc` through replica `slot`, going on to the next replica
/// while one is down (the same job id: a repeat is answered, never run
/// twice). Returns the slot that accepted it.
async fn submit(urls: &Urls, token: &str, slot: usize, doc: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut n = slot;
    loop {
        let url = url_of(urls, n);
        if let Some(mut c) = client(&url, token).await {
            let r = c
                .submit_job(SubmitJobRequest {
                    document: doc.to_owned(),
                    ..Default::default()
                })
                .await;
            match r {
                Ok(_) => return n % 3,
                // A replica going away or the database restarting: try the
                // next. Anything else is a refusal, and a failure here.
                Err(s) => assert!(
                    matches!(
                        s.code(),
                        tonic::Code::Unavailable
                            | tonic::Code::Unknown
                            | tonic::Code::Internal
                            | tonic::Code::DeadlineExceeded
                            | tonic::Code::Cancelled
                            | tonic::Code::Aborted
                    ),
                    "submission refused: {s:?}"
                ),
            }
        }
        assert!(Instant::now() < deadline, "no replica took the job");
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Watches job `id` from replicas other than `slot`'s, resuming after the
/// last sequence seen whenever a replica goes away, until the job's final
/// event. Returns every sequence seen, in order.
async fn watch(urls: Urls, token: String, slot: usize, id: String) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen: Vec<u64> = Vec::new();
    let mut n = slot + 1;
    while Instant::now() < deadline {
        let url = url_of(&urls, n);
        n += 1;
        let Some(mut c) = client(&url, &token).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let stream = c
            .watch_job(WatchJobRequest {
                job_id: id.clone(),
                after_sequence: seen.last().copied().unwrap_or(0),
                ..Default::default()
            })
            .await;
        let Ok(stream) = stream else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        let mut ended = false;
        while let Some(item) = stream.next().await {
            let Ok(r) = item else { break };
            let e: Event = r.event.unwrap();
            seen.push(e.sequence);
            if e.kind == "job.state" && terminal(&field(&e, "to")) {
                ended = true;
                break;
            }
        }
        if ended {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("watching {id}: no final event in time (seen {seen:?})");
}

fn terminal(state: &str) -> bool {
    matches!(state, "completed" | "cancelled" | "discarded")
}

/// Waits until every job in `ids` has finished; returns their states.
async fn finished(urls: &Urls, token: &str, ids: &[String], limit: Duration) -> Vec<i32> {
    let deadline = Instant::now() + limit;
    let mut states = vec![0; ids.len()];
    let mut n = 0;
    for (i, id) in ids.iter().enumerate() {
        loop {
            n += 1;
            let job = match client(&url_of(urls, n), token).await {
                Some(mut c) => c
                    .get_job(GetJobRequest { job_id: id.clone() })
                    .await
                    .ok()
                    .and_then(|r| r.into_inner().job),
                None => None,
            };
            if Instant::now() >= deadline {
                let tasks: Vec<_> = job
                    .iter()
                    .flat_map(|j| j.tasks.iter().map(|t| (t.task_id.clone(), t.state)))
                    .collect();
                panic!(
                    "job {id} is stuck: state {:?} reason {:?} tasks {tasks:?}",
                    job.as_ref().map(|j| j.state),
                    job.as_ref().map(|j| j.reason.clone())
                );
            }
            if let Some(j) = job
                && [
                    JobState::Completed as i32,
                    JobState::Cancelled as i32,
                    JobState::Discarded as i32,
                ]
                .contains(&j.state)
            {
                states[i] = j.state;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    states
}

/// Checks that every job's stored log is numbered 1..n without a gap.
fn stored_logs_are_gapless(c: &Cluster, ids: &[String]) {
    let rows = c.sql(
        "SELECT e.job_id, e.seq FROM exec_events e JOIN exec_jobs j ON j.id = e.job_id ORDER BY 1, 2",
    );
    let mut seqs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in rows.lines() {
        let (job, seq) = line.split_once('|').unwrap();
        seqs.entry(job.to_owned())
            .or_default()
            .push(seq.parse().unwrap());
    }
    for id in ids {
        let s = &seqs[id];
        assert_eq!(
            *s,
            (1..=s.len() as u64).collect::<Vec<_>>(),
            "{id}: stored sequence has a gap"
        );
    }
}

/// Per (job, task): starts and successes in the log, and whether a start
/// came after the success.
#[derive(Default, Debug)]
struct TaskLog {
    starts: usize,
    successes: usize,
    started_after_success: bool,
}

/// Job `id`'s whole log, read through replica `n` (of the current ones).
async fn job_events(urls: &Urls, token: &str, n: usize, id: &str) -> Vec<Event> {
    let mut c = client(&url_of(urls, n), token).await.unwrap();
    let mut s = c
        .watch_job(WatchJobRequest {
            job_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(r) = s.next().await {
        events.push(r.unwrap().event.unwrap());
    }
    events
}

async fn task_logs(urls: &Urls, token: &str, ids: &[String]) -> HashMap<String, TaskLog> {
    let mut out: HashMap<String, TaskLog> = HashMap::new();
    let mut completions = HashMap::<String, usize>::new();
    for (n, id) in ids.iter().enumerate() {
        for e in job_events(urls, token, n, id).await {
            if e.kind == "job.state" && field(&e, "to") == "completed" {
                *completions.entry(id.clone()).or_default() += 1;
            }
            if e.kind != "task.state" {
                continue;
            }
            let t = out.entry(format!("{id}.{}", e.task_id)).or_default();
            match field(&e, "to").as_str() {
                "running" => {
                    t.starts += 1;
                    t.started_after_success |= t.successes > 0;
                }
                "succeeded" => t.successes += 1,
                _ => {}
            }
        }
    }
    for id in ids {
        assert_eq!(completions.get(id), Some(&1), "{id} completed once");
    }
    out
}

#[test]
fn three_replicas_run_a_thousand_jobs_exactly_once_through_kills_and_a_database_restart() {
    const JOBS: usize = 1000;
    let Some(c) = Cluster::start() else { return };
    let lease = 2000;
    let mut incarnation = [0usize; 3];
    let mut replicas: Vec<Option<Proc>> = (0..3)
        .map(|i| Some(c.replica(&format!("x{i}-0"), lease, &[])))
        .collect();
    let urls: Urls = Arc::new(Mutex::new(
        replicas.iter().map(|p| p.as_ref().unwrap().url()).collect(),
    ));
    let hub = c.hub.url();
    wait_for("built-in agents routable", Duration::from_secs(20), || {
        routed(&hub, &["--capability", "builtin.echo"]).is_some_and(|ids| !ids.is_empty())
    });
    let token = token(&hub, "alice");
    let rt = runtime();
    let jobs: Vec<(String, String)> = (0..JOBS).map(|i| job(i, &c.marks)).collect();
    let ids: Vec<String> = jobs.iter().map(|(id, _)| id.clone()).collect();
    let done = Arc::new(AtomicBool::new(false));

    // Submitters (16 at a time, round-robin over the replicas) and
    // watchers of every 25th job, on replicas other than the submitter's.
    let load = {
        let (urls, token, jobs, done) = (urls.clone(), token.clone(), jobs.clone(), done.clone());
        rt.spawn(async move {
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut tasks = Vec::new();
            let watchers = Arc::new(Mutex::new(Vec::new()));
            for _ in 0..16 {
                let (urls, token, jobs, next, watchers) = (
                    urls.clone(),
                    token.clone(),
                    jobs.clone(),
                    next.clone(),
                    watchers.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((id, doc)) = jobs.get(i) else { return };
                        let slot = submit(&urls, &token, i, doc).await;
                        if i % 25 == 0 {
                            let w =
                                tokio::spawn(watch(urls.clone(), token.clone(), slot, id.clone()));
                            watchers.lock().unwrap().push((id.clone(), w));
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            done.store(true, Ordering::Relaxed);
            let ws: Vec<_> = std::mem::take(&mut *watchers.lock().unwrap());
            let mut out = Vec::new();
            for (id, w) in ws {
                out.push((id, w.await.unwrap()));
            }
            out
        })
    };

    // Chaos while the load runs: a replica killed (-9) and restarted every
    // 3 s, in turn; PostgreSQL crashed and restarted once.
    let started = Instant::now();
    let mut kills = 0;
    let mut db_restarted = false;
    let mut round = 0usize;
    while !done.load(Ordering::Relaxed) || round < 3 {
        std::thread::sleep(Duration::from_secs(3));
        let slot = round % 3;
        round += 1;
        if round == 3 && !db_restarted {
            c.pg.kill().unwrap();
            std::thread::sleep(Duration::from_millis(500));
            c.pg.restart().unwrap();
            db_restarted = true;
            continue;
        }
        replicas[slot].take().unwrap().kill9();
        kills += 1;
        incarnation[slot] += 1;
        let p = c.replica(&format!("x{slot}-{}", incarnation[slot]), lease, &[]);
        urls.lock().unwrap()[slot] = p.url();
        replicas[slot] = Some(p);
        if round > 12 {
            break;
        }
    }
    let watched = rt.block_on(load).unwrap();
    let submitted_in = started.elapsed();
    let states = rt.block_on(finished(&urls, &token, &ids, Duration::from_secs(300)));
    let completed = states
        .iter()
        .filter(|s| **s == JobState::Completed as i32)
        .count();
    if completed != JOBS {
        rt.block_on(async {
            let mut cl = client(&url_of(&urls, 0), &token).await.unwrap();
            for (id, st) in ids.iter().zip(&states) {
                if *st != JobState::Completed as i32 {
                    let j = cl
                        .get_job(GetJobRequest { job_id: id.clone() })
                        .await
                        .unwrap()
                        .into_inner()
                        .job
                        .unwrap();
                    let tasks: Vec<_> = j
                        .tasks
                        .iter()
                        .map(|t| (t.task_id.clone(), t.state, t.error.clone()))
                        .collect();
                    eprintln!(
                        "{id}: state {} reason {} error {} tasks {tasks:?}",
                        j.state, j.reason, j.error
                    );
                }
            }
        });
    }
    assert_eq!(completed, JOBS, "every accepted job completed");

    // Watchers on other replicas saw gapless logs to the end.
    for (id, seqs) in &watched {
        assert_eq!(
            *seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "watcher of {id} saw a gap"
        );
    }
    stored_logs_are_gapless(&c, &ids);
    let logs = rt.block_on(task_logs(&urls, &token, &ids));
    let runs = c.runs();
    let mut rerun_after_takeover = 0;
    for (task, log) in &logs {
        assert_eq!(log.successes, 1, "{task} succeeded exactly once: {log:?}");
        assert!(
            !log.started_after_success,
            "{task} started after it succeeded"
        );
        if let Some(&n) = runs.get(task) {
            assert!(
                n <= log.starts,
                "{task} ran {n} times but started {} times in its log",
                log.starts
            );
            rerun_after_takeover += n - 1;
        }
    }
    let marked: HashSet<&String> = runs.keys().collect();
    for t in &marked {
        assert!(logs.contains_key(*t), "a run of {t} the log never started");
    }

    // Each replica slot ran a share.
    let shares = c.sql(
        "SELECT split_part(owner, '-', 1), count(DISTINCT job_id) FROM exec_events GROUP BY 1 ORDER BY 1",
    );
    let shares: Vec<(String, usize)> = shares
        .lines()
        .map(|l| {
            let (s, n) = l.split_once('|').unwrap();
            (s.to_owned(), n.parse().unwrap())
        })
        .collect();
    assert_eq!(shares.len(), 3, "{shares:?}");
    assert!(shares.iter().all(|(_, n)| *n >= JOBS / 20), "{shares:?}");
    println!(
        "executor replicas: {JOBS} jobs submitted in {:.1}s, {completed} completed, 0 lost, 0 stuck; \
         {kills} replicas killed -9, database restarted {}; {} watchers gapless; \
         tasks re-run after a takeover {rerun_after_takeover}, completed tasks re-run 0; \
         jobs touched per replica slot {shares:?}",
        submitted_in.as_secs_f64(),
        u8::from(db_restarted),
        watched.len(),
    );
    // Every journal, written by three replicas through kills, takeovers
    // and a database restart, verifies (their seals by the key the first
    // replica kept in the database for all of them).
    let admin = self::token(&hub, "admin");
    let verified = rt.block_on(async {
        let mut x = client(&url_of(&urls, 0), &admin).await.unwrap();
        x.verify_journals(switchyard_proto::executor::v1::VerifyJournalsRequest::default())
            .await
            .unwrap()
            .into_inner()
    });
    assert!(
        verified.problems.is_empty(),
        "{:?}",
        verified.problems.first()
    );
    assert_eq!(verified.jobs, JOBS as u64, "{verified:?}");
    assert!(verified.sealed > 0, "{verified:?}");
    for p in replicas.into_iter().flatten() {
        assert_eq!(p.terminate(), Some(0));
    }
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

/// Waits (bounded) until `sql` answers `want`.
fn wait_sql(c: &Cluster, sql: &str, want: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let got = c.sql(sql);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sql}: {got:?}, waited for {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_paused_replica_whose_lease_was_taken_over_cannot_write_when_it_wakes() {
    let Some(c) = Cluster::start() else { return };
    let lease = 1500;
    let a = c.replica("pa-0", lease, &[]);
    let b = c.replica("pb-0", lease, &[]);
    let token = token(&c.hub.url(), "alice");
    let rt = runtime();
    let mark = c.marks.join("slow.a");
    let mark_b = c.marks.join("slow.b");
    let doc = serde_json::json!({"job_id": "slow", "tasks": [
        {"id": "a", "command": {"command": "sh", "args": ["-c",
            format!("echo run >> {}; sleep 2; echo done", mark.display())]}},
        {"id": "b", "depends_on": ["a"], "command": {"command": "sh", "args": ["-c",
            format!("echo run >> {}", mark_b.display())]}}]})
    .to_string();
    // Accepted by A, so A runs it; its first task starts there.
    let urls: Urls = Arc::new(Mutex::new(vec![a.url(), b.url()]));
    rt.block_on(submit(&urls, &token, 0, &doc));
    let owner = "SELECT owner || ' ' || epoch FROM exec_jobs WHERE id = 'slow'";
    wait_sql(&c, owner, "pa-0 1", Duration::from_secs(10));
    wait_for("task a running on A", Duration::from_secs(10), || {
        std::fs::read_to_string(&mark).is_ok_and(|s| s.lines().count() == 1)
    });

    // Paused past its lease: B takes the job over (epoch 2) and finishes it.
    signal(a.pid(), "STOP");
    wait_sql(&c, owner, "pb-0 2", Duration::from_secs(10));
    let states = rt.block_on(finished(
        &Arc::new(Mutex::new(vec![b.url()])),
        &token,
        &["slow".to_owned()],
        Duration::from_secs(30),
    ));
    assert_eq!(states, [JobState::Completed as i32]);
    let before =
        c.sql("SELECT seq, epoch, owner FROM exec_events WHERE job_id = 'slow' ORDER BY seq");

    // Woken, A's attempt of task a ends and it tries to record that: refused.
    signal(a.pid(), "CONT");
    wait_for(
        "A finds the job taken over",
        Duration::from_secs(20),
        || {
            std::fs::read_to_string(c.log("pa-0"))
                .is_ok_and(|l| l.contains("taken over by another replica"))
        },
    );
    // A still works for new jobs after that.
    let urls_a: Urls = Arc::new(Mutex::new(vec![a.url()]));
    let next = serde_json::json!({"job_id": "after", "tasks": [
        {"id": "a", "command": {"command": "sh", "args": ["-c", "echo ok"]}}]})
    .to_string();
    rt.block_on(submit(&urls_a, &token, 0, &next));
    let states = rt.block_on(finished(
        &urls_a,
        &token,
        &["after".to_owned()],
        Duration::from_secs(30),
    ));
    assert_eq!(states, [JobState::Completed as i32]);

    // Nothing A did after losing the lease is in the log: the same rows as
    // before it woke, one owner per epoch, epochs in order.
    let after =
        c.sql("SELECT seq, epoch, owner FROM exec_events WHERE job_id = 'slow' ORDER BY seq");
    assert_eq!(after, before, "a fenced replica's late writes are refused");
    let mut owners: BTreeMap<u64, HashSet<String>> = BTreeMap::new();
    let mut last_epoch = 0;
    for line in after.lines() {
        let f: Vec<&str> = line.split('|').collect();
        let epoch: u64 = f[1].parse().unwrap();
        assert!(epoch >= last_epoch, "epochs go up along the log: {after}");
        last_epoch = epoch;
        owners.entry(epoch).or_default().insert(f[2].to_owned());
    }
    assert_eq!(
        owners,
        BTreeMap::from([
            (1, HashSet::from(["pa-0".to_owned()])),
            (2, HashSet::from(["pb-0".to_owned()])),
        ]),
        "exactly one owner per epoch"
    );
    // Task a ran twice (at least once; A's run and B's), succeeded once.
    assert_eq!(std::fs::read_to_string(&mark).unwrap().lines().count(), 2);
    let logs = rt.block_on(task_logs(&urls_a, &token, &["slow".to_owned()]));
    assert_eq!(logs["slow.a"].successes, 1);
    // Task b, which A would start once its run of a ended, ran only on B:
    // an attempt whose start was refused never acts.
    assert_eq!(
        std::fs::read_to_string(&mark_b).unwrap().lines().count(),
        1,
        "task b ran on the replica that lost the job"
    );
    assert_eq!(logs["slow.b"].starts, 1);
    assert_eq!(a.terminate(), Some(0));
    assert_eq!(b.terminate(), Some(0));
}

#[test]
fn a_rolling_restart_hands_running_jobs_over_without_loss_or_waiting_a_lease() {
    const JOBS: usize = 300;
    let Some(c) = Cluster::start() else { return };
    let lease: u64 = 4000;
    let mut replicas: Vec<Proc> = (0..3)
        .map(|i| c.replica(&format!("r{i}-0"), lease, &[]))
        .collect();
    let urls: Urls = Arc::new(Mutex::new(replicas.iter().map(Proc::url).collect()));
    let token = token(&c.hub.url(), "alice");
    let rt = runtime();
    let ids: Vec<String> = (0..JOBS).map(|i| format!("roll{i:04}")).collect();
    let load = {
        let (urls, token, ids) = (urls.clone(), token.clone(), ids.clone());
        let marks = c.marks.clone();
        rt.spawn(async move {
            for (i, id) in ids.iter().enumerate() {
                // Each run of a command leaves a line in its marker file
                // as it starts: a run stopped half way counts too.
                let run = |task: &str| format!("echo {task} >> {}/{id}.{task}; sleep 0.3", marks.display());
                let doc = serde_json::json!({"job_id": id, "tasks": [
                    {"id": "a", "command": {"command": "sh", "args": ["-c", run("a")]}},
                    {"id": "b", "depends_on": ["a"], "command": {"command": "sh", "args": ["-c", run("b")]}}]})
                .to_string();
                submit(&urls, &token, i, &doc).await;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    // One replica at a time: SIGTERM (it hands its jobs back), then its
    // successor starts under a new name.
    for (slot, p) in replicas.iter_mut().enumerate() {
        std::thread::sleep(Duration::from_millis(1200));
        let next = c.replica(&format!("r{slot}-1"), lease, &[]);
        urls.lock().unwrap()[slot] = next.url();
        let old = std::mem::replace(p, next);
        assert_eq!(old.terminate(), Some(0), "a replica stops cleanly");
    }
    rt.block_on(load).unwrap();
    let states = rt.block_on(finished(&urls, &token, &ids, Duration::from_secs(120)));
    assert!(
        states.iter().all(|s| *s == JobState::Completed as i32),
        "{states:?}"
    );
    // No job waited a lease: the longest pause between two of a job's
    // events is well under it (a handed-back job is claimed at once).
    let times = rt.block_on(event_times(&urls, &token, &ids));
    let (worst_job, worst) = times
        .iter()
        .map(|(id, t)| (id, t.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)))
        .max_by_key(|(_, g)| *g)
        .unwrap();
    let handed = c.sql("SELECT count(DISTINCT job_id) FROM exec_events WHERE epoch > 1");
    println!(
        "rolling restart: {JOBS} jobs completed, {handed} taken over after a hand-back; longest pause between two events of one job {worst} ms ({worst_job}), lease {lease} ms"
    );
    assert!(
        worst < lease,
        "{worst_job} waited {worst} ms between events, a lease is {lease} ms"
    );
    assert!(
        handed.parse::<usize>().unwrap() > 0,
        "some jobs were handed over"
    );
    // Stopping drained: what was running finished where it ran, so no
    // command ran twice.
    let runs = c.runs();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert_eq!(runs.len(), JOBS * 2, "every command ran");
    assert!(twice.is_empty(), "ran more than once: {twice:?}");
    for p in replicas {
        assert_eq!(p.terminate(), Some(0));
    }
}

#[test]
fn while_the_database_is_down_submissions_are_unavailable_never_internal() {
    let Some(c) = Cluster::start() else { return };
    let replica = c.replica("down-0", 4000, &[]);
    let token = token(&c.hub.url(), "alice");
    let rt = runtime();
    let url = replica.url();
    let doc = |i: usize| {
        serde_json::json!({"job_id": format!("down{i:03}"), "tasks": [
            {"id": "a", "command": {"command": "sh", "args": ["-c", "echo a"]}}]})
        .to_string()
    };
    let submit_once = |i: usize| {
        let (url, token, doc) = (url.clone(), token.clone(), doc(i));
        rt.block_on(async move {
            let mut c = client(&url, &token).await.expect("the replica answers");
            c.submit_job(SubmitJobRequest {
                document: doc,
                ..Default::default()
            })
            .await
            .map(|_| ())
        })
    };
    submit_once(0).expect("a submission with the database up");
    c.pg.kill().unwrap();
    // Every refusal while it is down says "try again": a client that
    // retries only UNAVAILABLE loses nothing.
    let mut refused = Vec::new();
    for i in 1..=5 {
        if let Err(s) = submit_once(i) {
            refused.push((s.code(), s.message().to_owned()));
        }
    }
    assert!(!refused.is_empty(), "the database was down");
    assert!(
        refused
            .iter()
            .all(|(code, _)| *code == tonic::Code::Unavailable),
        "{refused:#?}"
    );
    c.pg.restart().unwrap();
    // Retrying the same ids succeeds once it is back.
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 1..=5 {
        while let Err(s) = submit_once(i) {
            if s.code() != tonic::Code::Unavailable {
                eprintln!(
                    "REPLICA LOG:\n{}",
                    std::fs::read_to_string(c.log("down-0")).unwrap_or_default()
                );
            }
            assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
            assert!(Instant::now() < deadline, "never accepted again: {s:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let ids: Vec<String> = (0..=5).map(|i| format!("down{i:03}")).collect();
    let states = rt.block_on(finished(
        &Arc::new(Mutex::new(vec![url.clone(); 3])),
        &token,
        &ids,
        Duration::from_secs(60),
    ));
    assert!(
        states.iter().all(|s| *s == JobState::Completed as i32),
        "{states:?}"
    );
    assert_eq!(replica.terminate(), Some(0));
}

#[test]
fn a_batch_stored_before_its_commit_answer_was_lost_is_written_again_without_wedging_the_replica() {
    let Some(c) = Cluster::start() else { return };
    let replica = c.replica("doubt-0", 4000, &[]);
    let token = token(&c.hub.url(), "alice");
    let rt = runtime();
    let urls = Arc::new(Mutex::new(vec![replica.url(); 3]));
    let doc = |id: &str| {
        serde_json::json!({"job_id": id, "tasks": [
            {"id": "a", "command": {"command": "sleep", "args": ["1"]}},
            {"id": "b", "depends_on": ["a"], "command": {"command": "sh", "args": ["-c", "echo b"]}}]})
        .to_string()
    };
    rt.block_on(submit(&urls, &token, 0, &doc("doubt")));
    wait_sql(
        &c,
        "SELECT count(*) > 0 FROM exec_events WHERE job_id = 'doubt'",
        "t",
        Duration::from_secs(30),
    );
    // The job's next position is already stored, as when the database
    // dies after committing a batch and before answering: the replica
    // writes that batch again. Before the fix its insert failed on the
    // stored key for ever, and every later write of the replica waited.
    // The replica may write that very position meanwhile (the job is
    // running): then the stored batch is its own, and the next one is
    // taken instead, until one is ours.
    let injected = (0..50).any(|_| {
        !c.sql(
            "INSERT INTO exec_events (job_id, seq, epoch, owner, data)
             SELECT job_id, seq + 1, epoch, owner, data FROM exec_events
             WHERE job_id = 'doubt' ORDER BY seq DESC LIMIT 1
             ON CONFLICT DO NOTHING RETURNING seq",
        )
        .trim()
        .is_empty()
    });
    assert!(injected, "the stored-but-unanswered batch was never placed");
    rt.block_on(submit(&urls, &token, 1, &doc("after")));
    let ids = ["doubt".to_owned(), "after".to_owned()];
    let states = rt.block_on(finished(&urls, &token, &ids, Duration::from_secs(60)));
    assert!(
        states.iter().all(|s| *s == JobState::Completed as i32),
        "{states:?}"
    );
    assert_eq!(replica.terminate(), Some(0));
}

/// Each job's event times (ms), in order.
async fn event_times(urls: &Urls, token: &str, ids: &[String]) -> Vec<(String, Vec<u64>)> {
    let mut out = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let times = job_events(urls, token, n, id)
            .await
            .iter()
            .map(|e| switchyard_kit::time::timestamp_ms(e.time.as_ref().unwrap()))
            .collect();
        out.push((id.clone(), times));
    }
    out
}

type Workers =
    switchyard_proto::executor::v1::worker_service_client::WorkerServiceClient<Intercepted>;

async fn workers(url: &str, token: &str) -> Workers {
    Workers::new(channel(url, token).await.unwrap())
}

/// Fetches up to `count` tasks of queue `q` as `worker`, waiting up to 3 s.
async fn fetch_n(w: &mut Workers, q: &str, worker: &str, count: u32) -> Vec<(String, u32)> {
    use switchyard_proto::executor::v1::FetchRequest;
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < count as usize && Instant::now() < deadline {
        let tasks = w
            .fetch(FetchRequest {
                queues: vec![q.into()],
                count: count - got.len() as u32,
                worker_id: worker.into(),
                wait: Some(switchyard_kit::time::duration(3000)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .tasks;
        got.extend(tasks.into_iter().map(|t| {
            let r = t.task.unwrap();
            (r.job_id, r.attempt)
        }));
    }
    got
}

fn ack_req(job_id: &str, attempt: u32, worker: &str) -> switchyard_proto::executor::v1::AckRequest {
    use switchyard_proto::executor::v1::{AckRequest, TaskRef};
    AckRequest {
        task: Some(TaskRef {
            job_id: job_id.into(),
            attempt,
            ..Default::default()
        }),
        worker_id: worker.into(),
        result: Some(switchyard_kit::json::json_to_value(
            &serde_json::json!({"done": true}),
        )),
        ..Default::default()
    }
}

#[test]
fn pull_workers_fetch_from_any_replica_and_a_dead_replicas_leased_work_is_fetched_again() {
    let Some(c) = Cluster::start() else { return };
    let lease = 1500;
    let a = c.replica("qa-0", lease, &[]);
    let b = c.replica("qb-0", lease, &[]);
    let hub = c.hub.url();
    let (alice, agents) = (token(&hub, "alice"), token(&hub, "agents"));
    let rt = runtime();
    rt.block_on(async {
        // Twenty queue jobs, all submitted through replica A.
        let mut jobs = client(&a.url(), &alice).await.unwrap();
        let mut ids = Vec::new();
        for n in 0..20 {
            let doc =
                format!(r#"{{"type": "test.work", "args": [{n}], "options": {{"queue": "q1"}}}}"#);
            let out = jobs
                .submit_job(SubmitJobRequest {
                    document: doc,
                    format: "ojs-queue".into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            ids.push(out.job.unwrap().spec.unwrap().job_id);
        }
        // A worker on replica B fetches and acks ten of them there.
        let mut wb = workers(&b.url(), &agents).await;
        let first = fetch_n(&mut wb, "q1", "w-b", 10).await;
        assert_eq!(
            first.len(),
            10,
            "fetched through the replica that did not accept them"
        );
        for (id, attempt) in &first {
            let job = wb
                .ack(ack_req(id, *attempt, "w-b"))
                .await
                .unwrap()
                .into_inner()
                .job
                .unwrap();
            assert_eq!(job.state, JobState::Completed as i32);
        }
        // A report to a replica that does not run the job is refused
        // (LEASE_LOST), never applied.
        let mut wa = workers(&a.url(), &agents).await;
        let (id, attempt) = fetch_n(&mut wb, "q1", "w-b", 1).await.remove(0);
        let refused = wa.ack(ack_req(&id, attempt, "w-b")).await.unwrap_err();
        assert_eq!(
            switchyard_kit::error::ApiError::from(refused)
                .reason
                .as_deref(),
            Some("LEASE_LOST")
        );
        wb.ack(ack_req(&id, attempt, "w-b")).await.unwrap();
        // Five more leased on B, which then dies holding them.
        let held = fetch_n(&mut wb, "q1", "w-b", 5).await;
        assert_eq!(held.len(), 5);
        drop(wb);
        b.kill9();
        // Once B's leases lapse, a worker on A fetches them again (a new
        // attempt) with the four never fetched, and completes them all.
        let rest = fetch_n(&mut wa, "q1", "w-a", 9).await;
        let again: HashSet<&String> = rest.iter().map(|(id, _)| id).collect();
        for (id, _) in &held {
            assert!(
                again.contains(id),
                "{id}, leased on the dead replica, is fetched again"
            );
        }
        for (id, attempt) in &rest {
            let job = wa
                .ack(ack_req(id, *attempt, "w-a"))
                .await
                .unwrap()
                .into_inner()
                .job
                .unwrap();
            assert_eq!(job.state, JobState::Completed as i32, "{id}");
        }
        let urls: Urls = Arc::new(Mutex::new(vec![a.url()]));
        let states = finished(&urls, &alice, &ids, Duration::from_secs(30)).await;
        assert!(states.iter().all(|s| *s == JobState::Completed as i32));
    });
    assert_eq!(a.terminate(), Some(0));
}

#[test]
fn a_job_is_cancelled_through_a_replica_that_does_not_run_it() {
    let Some(c) = Cluster::start() else { return };
    let a = c.replica("ca-0", 5000, &[]);
    let b = c.replica("cb-0", 5000, &[]);
    let token = token(&c.hub.url(), "alice");
    let rt = runtime();
    let doc = serde_json::json!({"job_id": "long", "tasks": [
        {"id": "a", "command": {"command": "sleep", "args": ["30"]}}]})
    .to_string();
    let urls: Urls = Arc::new(Mutex::new(vec![a.url()]));
    rt.block_on(submit(&urls, &token, 0, &doc));
    let running = "SELECT owner || ' ' || state FROM exec_jobs WHERE id = 'long'";
    wait_sql(&c, running, "ca-0 active", Duration::from_secs(10));
    // Asked on B, which does not run it: A stops the task and cancels the
    // job, long before the command would have ended.
    let started = Instant::now();
    let job = rt.block_on(async {
        let mut cb = client(&b.url(), &token).await.unwrap();
        cb.cancel_job(switchyard_proto::executor::v1::CancelJobRequest {
            job_id: "long".into(),
            reason: "not needed any more".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
    });
    assert_eq!(job.state, JobState::Cancelled as i32, "{job:?}");
    assert_eq!(job.error, "not needed any more");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    // Every event was written by A, the replica that ran it.
    assert_eq!(
        c.sql("SELECT DISTINCT owner FROM exec_events WHERE job_id = 'long'"),
        "ca-0"
    );
    assert_eq!(a.terminate(), Some(0));
    assert_eq!(b.terminate(), Some(0));
}

const WAITS: &str = r#"
job_id: deploy-size
tasks:
  - id: ask
    input:
      prompt: "How many replicas?"
      schema: {type: object, required: [size], properties: {size: {type: integer, minimum: 1}}}
  - id: use
    depends_on: [ask]
    agent: {capability: builtin.echo, input: {text: "size ${ask.output.answer.size}"}}
"#;

/// `who` was refused for who they are: the job is not theirs to see
/// (`NOT_FOUND`) or their key may not answer (`PERMISSION_DENIED`).
fn refused_outright(who: &str, refused: &tonic::Status) {
    assert!(
        matches!(
            refused.code(),
            tonic::Code::NotFound | tonic::Code::PermissionDenied
        ),
        "{who}: {refused:?}"
    );
}

/// A new admin key of `tenant`, made at `hub` with the cluster's service
/// token (which spans tenants).
async fn tenant_admin(hub: &str, tenant: &str, subject: &str) -> String {
    use switchyard_proto::auth::v1::auth_service_client::AuthServiceClient;
    use switchyard_proto::auth::v1::{CreateKeyRequest, PrincipalKind};
    let service = switchyard_kit::client::Credential::bearer(SERVICE_TOKEN).unwrap();
    let channel = switchyard_kit::client::authed(
        switchyard_kit::client::connect(hub).await.unwrap(),
        Some(service),
    );
    AuthServiceClient::new(channel)
        .create_key(CreateKeyRequest {
            subject: subject.into(),
            roles: vec!["admin".into()],
            kind: PrincipalKind::Human as i32,
            tenant: tenant.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .secret
}

#[test]
fn an_answer_and_a_message_sent_through_a_replica_that_does_not_run_the_job_reach_the_one_that_does()
 {
    use switchyard_proto::executor::v1::{SendInputRequest, SendMessageRequest};
    let (script, llm_url, stop_llm) = crate::llm_split::scripted();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = crate::conversation::config(cfg_dir.path(), &llm_url);
    let cfg = cfg.to_str().unwrap();
    let Some(c) = Cluster::start_with(&[("SWITCHYARD_CONFIG", cfg)]) else {
        return;
    };
    let a = c.replica("ra-0", 3000, &[("SWITCHYARD_CONFIG", cfg)]);
    let b = c.replica("rb-0", 3000, &[("SWITCHYARD_CONFIG", cfg)]);
    let alice = token(&c.hub.url(), "alice");
    let bob = token(&c.hub.url(), "bob");
    let rt = runtime();
    let outsiders = [
        (
            "alice-of-tenant-b",
            rt.block_on(tenant_admin(&c.hub.url(), "tenant-b", "alice")),
        ),
        ("agents", token(&c.hub.url(), "agents")),
    ];
    let urls: Urls = Arc::new(Mutex::new(vec![a.url()]));
    rt.block_on(submit(&urls, &alice, 0, WAITS));
    let talk = serde_json::json!({"job_id": "talk", "tasks": [{"id": "chat", "conversation": {
        "orchestrator": {"model": "gpt-4o-mini", "instructions": "Be brief.", "max_tokens": 16},
        "max_messages": 4,
    }}]})
    .to_string();
    rt.block_on(submit(&urls, &alice, 0, &talk));
    rt.block_on(kinds_until(
        &a.url(),
        &alice,
        "deploy-size",
        "task.input_requested",
    ));
    wait_sql(
        &c,
        "SELECT owner FROM exec_jobs WHERE id IN ('deploy-size', 'talk') GROUP BY owner",
        "ra-0",
        Duration::from_secs(10),
    );
    rt.block_on(async {
        let mut on_b = client(&b.url(), &alice).await.unwrap();
        let answer = |key: &str, size: serde_json::Value| SendInputRequest {
            job_id: "deploy-size".into(),
            task_id: "ask".into(),
            answer: Some(switchyard_kit::json::json_to_value(
                &serde_json::json!({"size": size}),
            )),
            idempotency_key: key.into(),
        };
        // B lists what waits on A for whoever may answer it, and only them.
        let b_url = b.url();
        let listed = |token: String| {
            let url = b_url.clone();
            async move {
                let mut c = client(&url, &token).await.unwrap();
                let req = switchyard_proto::executor::v1::ListInputRequestsRequest::default();
                let requests = c
                    .list_input_requests(req)
                    .await
                    .unwrap()
                    .into_inner()
                    .requests;
                requests
                    .into_iter()
                    .map(|r| (r.job_id, r.task_id, r.prompt))
                    .collect::<Vec<_>>()
            }
        };
        let waiting = (
            "deploy-size".into(),
            "ask".into(),
            "How many replicas?".into(),
        );
        assert_eq!(listed(alice.clone()).await, [waiting]);
        assert_eq!(
            listed(bob.clone()).await,
            Vec::<(String, String, String)>::new()
        );
        // The schema is checked by the replica running the job; its
        // refusal comes back through B as it is, and takes nothing.
        let bad = on_b
            .send_input(answer("k-bad", serde_json::json!("many")))
            .await
            .unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
        assert!(bad.message().contains("answer_schema"), "{bad:?}");
        // Another submitter may not answer: refused on B, nothing relayed.
        let mut bob_on_b = client(&b.url(), &bob).await.unwrap();
        let denied = bob_on_b
            .send_input(answer("k-bob", serde_json::json!(3)))
            .await
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
        // An admin of another tenant (named alice there) and an agent key:
        // refused on B too, and shown nothing waiting.
        for (who, token) in &outsiders {
            let mut theirs = client(&b.url(), token).await.unwrap();
            let refused = theirs
                .send_input(answer(&format!("k-{who}"), serde_json::json!(3)))
                .await
                .unwrap_err();
            refused_outright(who, &refused);
            if *who == "alice-of-tenant-b" {
                assert_eq!(
                    listed(token.clone()).await,
                    Vec::<(String, String, String)>::new()
                );
            }
        }
        let taken = on_b
            .send_input(answer("k-1", serde_json::json!(3)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (
                taken.task_id.as_str(),
                taken.answered_by.as_str(),
                taken.replayed
            ),
            ("ask", "alice", false)
        );
        let again = on_b
            .send_input(answer("k-1", serde_json::json!(3)))
            .await
            .unwrap()
            .into_inner();
        assert!(again.replayed, "{again:?}");
        let states = finished(
            &urls,
            &alice,
            &["deploy-size".to_owned()],
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(states, [JobState::Completed as i32]);

        // A conversation message through B: answered by A, once.
        script.for_model(
            "gpt-4o-mini",
            vec![switchyard_llm::scripted::Reply::text(
                "Hello from the replica that runs it.",
                20,
                8,
            )],
        );
        let message = SendMessageRequest {
            job_id: "talk".into(),
            text: "hello".into(),
            idempotency_key: "m-1".into(),
            ..Default::default()
        };
        let sent = on_b
            .send_message(message.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (sent.task_id.as_str(), sent.seq, sent.replayed),
            ("chat", 1, false)
        );
        kinds_until(&b.url(), &alice, "talk", "conversation.replied").await;
        let again = on_b.send_message(message).await.unwrap().into_inner();
        assert_eq!((again.seq, again.replayed), (1, true));
        let denied = bob_on_b
            .send_message(SendMessageRequest {
                job_id: "talk".into(),
                text: "let me in".into(),
                idempotency_key: "m-bob".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
        for (who, token) in &outsiders {
            let mut theirs = client(&b.url(), token).await.unwrap();
            let refused = theirs
                .send_message(SendMessageRequest {
                    job_id: "talk".into(),
                    text: "let me in".into(),
                    idempotency_key: format!("m-{who}"),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            refused_outright(who, &refused);
        }
    });
    assert_eq!(script.received().len(), 1, "one model call for one message");
    // Every event so far was written by A, the replica that runs both jobs.
    assert_eq!(
        c.sql("SELECT DISTINCT owner FROM exec_events WHERE job_id IN ('deploy-size', 'talk')"),
        "ra-0"
    );
    // A dies holding the conversation: a message sent through B waits,
    // stored, until B takes the job over (its lease runs out), and is
    // answered there, once.
    a.kill9();
    script.for_model(
        "gpt-4o-mini",
        vec![switchyard_llm::scripted::Reply::text("Still here.", 20, 3)],
    );
    rt.block_on(async {
        let mut on_b = client(&b.url(), &alice).await.unwrap();
        let sent = on_b
            .send_message(SendMessageRequest {
                job_id: "talk".into(),
                text: "are you there?".into(),
                idempotency_key: "m-2".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((sent.seq, sent.replayed), (2, false));
    });
    wait_sql(
        &c,
        "SELECT count(*) > 0 FROM exec_events WHERE job_id = 'talk' AND owner = 'rb-0'
         AND position(convert_to('Still here.', 'UTF8') in data) > 0",
        "t",
        Duration::from_secs(30),
    );
    assert_eq!(script.received().len(), 2, "one model call per message");
    // Nothing relayed is left behind.
    assert_eq!(c.sql("SELECT count(*) FROM exec_deliveries"), "0");
    assert_eq!(b.terminate(), Some(0));
    let _ = stop_llm.send(());
}

/// Schedules across replicas (issue 47): three replicas poll one
/// schedule every 100 ms; the replica that decided the latest tick is
/// killed with SIGKILL; over the ticks before and after, every tick has
/// exactly one job — none missed, none extra, and no replica ever
/// submitted a tick another had (it would have logged its job as taken
/// over). Overlap QUEUE with catch-up ALL: a tick due while the killed
/// replica's last job waits for its lease to lapse is delayed, never
/// skipped (with the default SKIP it would be recorded as skipped).
#[test]
fn three_replicas_start_exactly_one_job_per_tick_while_one_is_killed() {
    use switchyard_proto::executor::v1::schedule_service_client::ScheduleServiceClient;
    use switchyard_proto::executor::v1::{
        CatchUpPolicy, CreateScheduleRequest, GetScheduleRequest, OverlapPolicy,
        PauseScheduleRequest, Schedule, TickOutcome,
    };
    let Some(c) = Cluster::start() else { return };
    let fast = [("SWITCHYARD_EXECUTOR__SCHEDULE_POLL_MS", "100")];
    let mut replicas: Vec<Option<Proc>> = (0..3)
        .map(|i| Some(c.replica(&format!("s{i}"), 2000, &fast)))
        .collect();
    let urls: Vec<String> = replicas.iter().map(|p| p.as_ref().unwrap().url()).collect();
    let hub = c.hub.url();
    wait_for("built-in agents routable", Duration::from_secs(20), || {
        routed(&hub, &["--capability", "builtin.echo"]).is_some_and(|ids| !ids.is_empty())
    });
    let token = token(&hub, "alice");
    let rt = runtime();
    let on = |i: usize| {
        let (url, token) = (urls[i].clone(), token.clone());
        async move { ScheduleServiceClient::new(channel(&url, &token).await.unwrap()) }
    };
    let doc = serde_json::json!({"plan_id": "beat", "tasks": [
        {"id": "say", "agent": {"capability": "builtin.echo", "input": {"text": "beat"}}}]})
    .to_string();
    rt.block_on(async {
        on(0)
            .await
            .create_schedule(CreateScheduleRequest {
                // Every tick gets a job: one due while the previous job
                // runs (the victim's, until its lease lapses and another
                // replica finishes it) waits for it instead of being
                // skipped.
                schedule: Some(Schedule {
                    schedule_id: "beat".into(),
                    cron: "* * * * * *".into(),
                    overlap: OverlapPolicy::Queue as i32,
                    catch_up: CatchUpPolicy::All as i32,
                    ..Default::default()
                }),
                document: doc,
                ..Default::default()
            })
            .await
            .unwrap();
    });
    // Started ticks as replica `i` reads them: (tick ms, decided by).
    let started = |i: usize| -> Vec<(u64, String)> {
        rt.block_on(async {
            let s = on(i)
                .await
                .get_schedule(GetScheduleRequest {
                    schedule_id: "beat".into(),
                })
                .await
                .unwrap()
                .into_inner()
                .schedule
                .unwrap();
            s.recent_ticks
                .iter()
                .filter(|t| t.outcome == TickOutcome::Started as i32)
                .map(|t| {
                    (
                        switchyard_kit::time::timestamp_ms(t.at.as_ref().unwrap()),
                        t.decided_by.clone(),
                    )
                })
                .collect()
        })
    };
    wait_for("three ticks started", Duration::from_secs(30), || {
        started(1).len() >= 3
    });
    // The replica that decided the latest tick dies.
    let latest = started(1).into_iter().max().unwrap();
    let victim: usize = latest.1.trim_start_matches('s').parse().unwrap();
    replicas[victim].take().unwrap().kill9();
    let killed_at = switchyard_kit::time::now_ms();
    let alive = (victim + 1) % 3;
    // A tick it claimed but never stored is taken over after 30 s: wait
    // for four ticks after the kill (bounded).
    wait_for("four ticks after the kill", Duration::from_secs(90), || {
        started(alive)
            .iter()
            .filter(|(t, _)| *t > killed_at)
            .count()
            >= 4
    });
    rt.block_on(async {
        on(alive)
            .await
            .pause_schedule(PauseScheduleRequest {
                schedule_id: "beat".into(),
                note: "test over".into(),
            })
            .await
            .unwrap();
    });
    let not_done = "SELECT count(*) FROM exec_jobs WHERE id LIKE 'beat-%' AND state <> 'completed'";
    wait_sql(&c, not_done, "0", Duration::from_secs(30));
    let ids: Vec<String> = c
        .sql("SELECT id FROM exec_jobs WHERE id LIKE 'beat-%' ORDER BY id")
        .lines()
        .map(str::to_owned)
        .collect();
    let secs = tick_seconds(&ids, "beat-");
    assert!(secs.len() >= 7, "{ids:?}");
    for w in secs.windows(2) {
        assert_eq!(w[1], w[0] + 1, "one job per tick, none missed: {ids:?}");
    }
    // One claim per tick, and more than one replica decided.
    let claims =
        c.sql("SELECT count(*) FROM exec_kv WHERE space = 'schedule_ticks' AND key LIKE 'beat/%'");
    assert_eq!(claims, ids.len().to_string(), "{ids:?}");
    let deciders: HashSet<String> = started(alive).into_iter().map(|(_, by)| by).collect();
    assert!(deciders.len() >= 2, "the survivors took over: {deciders:?}");
    for name in ["s0", "s1", "s2"] {
        let log = std::fs::read_to_string(c.log(name)).unwrap_or_default();
        assert!(
            !log.contains("taken over by another replica"),
            "{name} submitted a tick another replica had:\n{log}"
        );
    }
    for r in replicas.into_iter().flatten() {
        assert_eq!(r.terminate(), Some(0));
    }
}

/// The tick each job id names (`beat-20261130T045333Z`), in seconds.
pub(crate) fn tick_seconds(ids: &[String], prefix: &str) -> Vec<i64> {
    ids.iter()
        .map(|id| {
            let t = id.strip_prefix(prefix).unwrap().trim_end_matches('Z');
            jiff::civil::DateTime::strptime("%Y%m%dT%H%M%S", t)
                .unwrap()
                .to_zoned_datetime(jiff::tz::TimeZone::UTC)
                .unwrap()
                .timestamp()
                .as_second()
        })
        .collect()
}
