//! Memory and start-up follow live work, not history: in `switchyard dev`,
//! finished jobs leave memory (and are read back from disk), a restart
//! loads only what is in flight and replays nothing before the services'
//! checkpoints, and `switchyard admin prune` removes finished jobs past an
//! age without touching one that runs. (The figures at 100,000 jobs are in
//! `make bench`: `switchyard-bench history`.)
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures_util::StreamExt;
use switchyard_kit::client::{Credential, Intercepted, authed, connect};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    CancelJobRequest, GetJobRequest, GetResultRequest, Job, JobState, SubmitJobRequest,
    WatchJobRequest,
};

use crate::support::*;

const JOBS: usize = 200;

const LOG: (&str, &str) = (
    "RUST_LOG",
    "warn,switchyard_executor::book=info,switchyard_executor::store=info,switchyard_ledger=info,switchyard_approval=info",
);

async fn alice(url: &str) -> JobServiceClient<Intercepted> {
    JobServiceClient::new(authed(
        connect(url).await.unwrap(),
        Some(Credential::bearer(&token(url, "alice")).unwrap()),
    ))
}

/// Submits a one-task job and waits for its last event.
async fn run(c: &JobServiceClient<Intercepted>, id: String, capability: &str, input: &str) {
    let mut c = c.clone();
    c.submit_job(SubmitJobRequest {
        document: format!(
            r#"{{"job_id":"{id}","tasks":[{{"id":"t","agent":{{"capability":"{capability}","input":{input}}}}}]}}"#
        ),
        ..Default::default()
    })
    .await
    .unwrap();
    follow(&mut c, id).await;
}

/// Follows job `id`'s events to its last.
async fn follow(c: &mut JobServiceClient<Intercepted>, id: String) {
    let mut w = c
        .watch_job(WatchJobRequest {
            job_id: id,
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while w.next().await.is_some() {}
}

/// Job `id` as GetJob answers.
async fn job_of(c: &mut JobServiceClient<Intercepted>, id: &str) -> Job {
    c.get_job(GetJobRequest { job_id: id.into() })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
}

/// `switchyard dev` on a data directory in `dir`, logging to a file there,
/// once its built-in agents route: the process, the data directory, the log.
fn started(dir: &std::path::Path) -> (Proc, std::path::PathBuf, std::path::PathBuf) {
    let data = dir.join("data");
    let log = dir.join("dev.log");
    let dev = Proc::dev_at(&data, &[LOG], &log);
    let url = dev.url();
    wait_for("built-in agents routable", Duration::from_secs(20), || {
        routed(&url, &["--capability", "builtin.noop"]).is_some_and(|ids| !ids.is_empty())
    });
    (dev, data, log)
}

/// The `key=value` after `marker` in the last log line holding `marker`.
fn logged(log: &std::path::Path, marker: &str, key: &str) -> String {
    let text = std::fs::read_to_string(log).unwrap();
    let clean: String = text
        .split('\u{1b}')
        .map(|part| part.split_once('m').map_or(part, |(_, rest)| rest))
        .collect();
    let line = clean
        .lines()
        .rev()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no {marker:?} in the log"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_leave_memory_a_restart_loads_only_live_work_and_prune_removes_old_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, data, log) = started(dir.path());
    let url = dev.url();
    let c = alice(&url).await;
    futures_util::stream::iter(0..JOBS)
        .for_each_concurrent(16, |i| run(&c, format!("h-{i}"), "builtin.noop", "{}"))
        .await;
    assert_eq!(dev.terminate(), Some(0));

    let dev = Proc::dev_at(&data, &[LOG], &log);
    let url = dev.url();
    // Nothing finished is loaded, nothing before the checkpoints replayed.
    assert_eq!(logged(&log, "job book open", "jobs"), "0");
    assert_eq!(logged(&log, "job book open", "replayed"), "0");
    assert_eq!(logged(&log, "approval loaded", "runs_in_flight"), "0");
    assert_eq!(logged(&log, "ledger loaded", "records"), "0");
    assert_eq!(logged(&log, "ledger loaded", "budgets"), "0");
    // Finished jobs read back from disk, events and results included.
    let mut c = alice(&url).await;
    let job = job_of(&mut c, "h-0").await;
    assert_eq!(job.state, JobState::Completed as i32);
    let result = c
        .get_result(GetResultRequest {
            job_id: "h-0".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(result.tasks.len(), 1);
    let events: Vec<_> = c
        .watch_job(WatchJobRequest {
            job_id: "h-0".into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(events.len() as u64, job.last_sequence);
    let listed = ok(&cli(
        &url,
        &["job", "list", "--limit", "1000", "--as", "alice"],
    ));
    assert!(listed.lines().count() > JOBS, "{listed}");

    // A job that runs is never pruned.
    let running = tokio::spawn({
        let c = c.clone();
        async move { run(&c, "h-running".into(), "builtin.sleep", r#"{"ms":3000}"#).await }
    });
    let active = async {
        loop {
            let got = c
                .get_job(GetJobRequest {
                    job_id: "h-running".into(),
                })
                .await;
            if got.is_ok_and(|r| r.into_inner().job.unwrap().state == JobState::Active as i32) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), active)
        .await
        .expect("the long job runs");
    // Bad input is refused; an admin prunes the tenant's finished jobs.
    let bad = cli(&url, &["admin", "prune", "--older-than", "soon"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a length of time"));
    let refused = cli(
        &url,
        &["admin", "prune", "--older-than", "1s", "--as", "alice"],
    );
    assert!(!refused.status.success(), "a submitter may not prune");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("job.prune"));
    std::thread::sleep(Duration::from_millis(1_100));
    let pruned = ok(&cli(&url, &["admin", "prune", "--older-than", "1s"]));
    assert!(
        pruned.starts_with(&format!("pruned {JOBS} finished jobs")),
        "{pruned}"
    );
    let gone = c
        .get_job(GetJobRequest {
            job_id: "h-0".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    running.await.unwrap();
    let kept = job_of(&mut c, "h-running").await;
    assert_eq!(kept.state, JobState::Completed as i32);
    assert_eq!(dev.terminate(), Some(0));
}

/// A crash (kill -9) replays the log from before the first event of the job
/// still in flight (waiting for a person: no timing), across the records of
/// jobs that finished and were pruned since: the job in flight comes back
/// from the spec its first record carries, the pruned ones stay gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_the_job_in_flight_comes_back_from_its_first_record_and_pruned_jobs_stay_gone()
 {
    const AFTER: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let (dev, data, log) = started(dir.path());
    let url = dev.url();
    let mut c = alice(&url).await;
    // The waiting job first: the replay checkpoint stays before its first
    // event.
    c.submit_job(SubmitJobRequest {
        document: r#"{"job_id":"long","approval":{"intent":"wait for a person","requires_approval":true},"tasks":[{"id":"t","agent":{"capability":"builtin.noop","input":{}}}]}"#.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    futures_util::stream::iter(0..AFTER)
        .for_each_concurrent(8, |i| run(&c, format!("p-{i}"), "builtin.noop", "{}"))
        .await;
    std::thread::sleep(Duration::from_millis(1_100));
    let pruned = ok(&cli(&url, &["admin", "prune", "--older-than", "1s"]));
    assert!(
        pruned.starts_with(&format!("pruned {AFTER} finished jobs")),
        "{pruned}"
    );
    dev.kill9();

    let dev = Proc::dev_at(&data, &[LOG], &log);
    let url = dev.url();
    // Only the waiting job is loaded, though the replay read the others'.
    assert_eq!(logged(&log, "job book open", "jobs"), "1");
    assert!(
        logged(&log, "job book open", "replayed")
            .parse::<u64>()
            .unwrap()
            > AFTER as u64
    );
    let mut c = alice(&url).await;
    for i in 0..AFTER {
        let gone = c
            .get_job(GetJobRequest {
                job_id: format!("p-{i}"),
            })
            .await
            .unwrap_err();
        assert_eq!(gone.code(), tonic::Code::NotFound, "p-{i}");
    }
    let listed = ok(&cli(
        &url,
        &["job", "list", "--limit", "1000", "--as", "alice"],
    ));
    assert!(!listed.contains("p-"), "{listed}");
    assert!(listed.contains("long"), "{listed}");
    // It is where it was, and moves on.
    assert_eq!(job_of(&mut c, "long").await.state, JobState::Pending as i32);
    c.cancel_job(CancelJobRequest {
        job_id: "long".into(),
        reason: "not needed".into(),
    })
    .await
    .unwrap();
    follow(&mut c, "long".into()).await;
    assert_eq!(
        job_of(&mut c, "long").await.state,
        JobState::Cancelled as i32
    );
    assert_eq!(dev.terminate(), Some(0));
}
