//! Our own services' outages delay work, never fail it. Six `switchyard
//! serve` processes (auth, registry, router, ledger, approval, executor);
//! 300 jobs of three sequential agent calls each, with the default retry
//! policy (none). While they run, one service is killed with SIGKILL and
//! restarted 3 s later on the same port and data, then restarted again
//! with SIGTERM (a rolling restart). Every job must complete, and once
//! everything is back every job's approval run must be completed, its
//! budget closed, and nothing of it still reserved.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use switchyard_kit::client::{Credential, Intercepted, authed, connect};
use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::approval::v1::{GetRunRequest, RunStatus};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{Job, JobState, ListJobsRequest, SubmitJobRequest, TaskState};
use switchyard_proto::ledger::v1::GetBudgetRequest;
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;

use crate::support::*;

const JOBS: usize = 300;
/// Jobs submitted while the service is down.
const LATE: usize = 5;
/// Each of a job's three steps sleeps this long: the jobs are still running
/// through both restarts.
const STEP_MS: u64 = 3_000;

/// The six processes, each restartable on its own port and data.
struct Cluster {
    dir: tempfile::TempDir,
    procs: Vec<(&'static str, Option<Proc>, String)>,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cluster {
            dir,
            procs: Vec::new(),
        };
        for name in [
            "auth", "registry", "router", "ledger", "approval", "executor",
        ] {
            let p = c.launch(name, "127.0.0.1:0");
            let addr = p.addr.clone();
            c.procs.push((name, Some(p), addr));
        }
        c
    }

    fn addr(&self, name: &str) -> String {
        let (_, _, addr) = self.procs.iter().find(|(n, _, _)| *n == name).unwrap();
        format!("http://{addr}")
    }

    fn data(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn launch(&self, name: &str, listen: &str) -> Proc {
        let data = self.data(name);
        let mut env: Vec<(&str, String)> = Vec::new();
        if name != "auth" {
            env.push(follow_keys(&self.addr("auth")));
        }
        match name {
            "router" => env.push(("SWITCHYARD_ROUTER__REGISTRY_URL", self.addr("registry"))),
            "executor" => {
                for s in ["registry", "router", "ledger", "approval"] {
                    let key = match s {
                        "registry" => "SWITCHYARD_EXECUTOR__REGISTRY_URL",
                        "router" => "SWITCHYARD_EXECUTOR__ROUTER_URL",
                        "ledger" => "SWITCHYARD_EXECUTOR__LEDGER_URL",
                        _ => "SWITCHYARD_EXECUTOR__APPROVAL_URL",
                    };
                    env.push((key, self.addr(s)));
                }
                env.push(("SWITCHYARD_EXECUTOR__APPROVAL_POLL_MS", "100".into()));
                env.push(("SWITCHYARD_EXECUTOR__DEPENDENCY_RETRY_MAX_MS", "500".into()));
            }
            _ => {}
        }
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Proc::start(
            &[
                "serve",
                "--services",
                name,
                "--listen",
                listen,
                "--data-dir",
                data.to_str().unwrap(),
            ],
            &env,
        )
    }

    fn take(&mut self, name: &str) -> (Proc, String) {
        let (_, p, addr) = self.procs.iter_mut().find(|(n, _, _)| *n == name).unwrap();
        (p.take().unwrap(), addr.clone())
    }

    fn put_back(&mut self, name: &str, p: Proc) {
        let slot = self.procs.iter_mut().find(|(n, _, _)| *n == name).unwrap();
        slot.1 = Some(p);
    }

    /// SIGKILL `name`; returns its address for [`Cluster::revive`].
    fn crash(&mut self, name: &str) -> String {
        let (p, addr) = self.take(name);
        p.kill9();
        addr
    }

    /// Starts `name` again on the same port and data.
    fn revive(&mut self, name: &str, addr: &str) {
        let p = self.launch(name, addr);
        self.put_back(name, p);
    }

    /// SIGTERM `name` (it drains and exits 0), then start it again.
    fn rolling_restart(&mut self, name: &str) {
        let (p, addr) = self.take(name);
        assert_eq!(p.terminate(), Some(0), "{name} stops cleanly");
        let p = self.launch(name, &addr);
        self.put_back(name, p);
    }
}

fn job(i: usize) -> String {
    let step = |id: &str, after: Option<&str>| {
        let deps = after.map_or(String::new(), |a| format!(r#""depends_on":["{a}"],"#));
        format!(
            r#"{{"id":"{id}",{deps}"agent":{{"capability":"builtin.sleep","input":{{"ms":{STEP_MS}}}}}}}"#
        )
    };
    format!(
        r#"{{"job_id":"outage-{i}","tasks":[{},{},{}]}}"#,
        step("a", None),
        step("b", Some("a")),
        step("c", Some("b"))
    )
}

/// Submits job `i` of the test.
async fn submit(
    mut c: JobServiceClient<Intercepted>,
    i: usize,
) -> Result<tonic::Response<switchyard_proto::executor::v1::SubmitJobResponse>, tonic::Status> {
    c.submit_job(SubmitJobRequest {
        document: job(i),
        ..Default::default()
    })
    .await
}

async fn as_admin(url: &str, auth_url: &str) -> Intercepted {
    as_user(url, auth_url, "admin").await
}

async fn as_user(url: &str, auth_url: &str, who: &str) -> Intercepted {
    let token = token(auth_url, who);
    authed(
        connect(url).await.unwrap(),
        Some(Credential::bearer(&token).unwrap()),
    )
}

/// Every job of the test, as the executor lists it.
async fn all_jobs(c: &mut JobServiceClient<Intercepted>) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_jobs(ListJobsRequest {
                page_size: 1000,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return jobs;
        }
        token = page.next_page_token;
    }
}

/// What is not consistent between the jobs and the approval runs and
/// budgets (empty: everything is).
async fn inconsistencies(cluster: &Cluster, jobs: &[Job]) -> Vec<String> {
    let auth = cluster.addr("auth");
    let mut runs = ApprovalServiceClient::new(as_admin(&cluster.addr("approval"), &auth).await);
    let mut ledger = LedgerServiceClient::new(as_admin(&cluster.addr("ledger"), &auth).await);
    let mut wrong = Vec::new();
    for j in jobs {
        let run = runs
            .get_run(GetRunRequest {
                run_id: j.run_id.clone(),
            })
            .await
            .map(|r| r.into_inner().run.unwrap_or_default().status);
        if !run
            .as_ref()
            .is_ok_and(|s| *s == RunStatus::Completed as i32)
        {
            wrong.push(format!("run {} is {run:?}", j.run_id));
        }
        let budget = ledger
            .get_budget(GetBudgetRequest {
                budget_id: j.budget_id.clone(),
            })
            .await
            .map(|b| b.into_inner().budget.unwrap_or_default());
        match budget {
            Ok(b) if b.closed && b.tokens_reserved == 0 => {}
            other => wrong.push(format!("budget {}: {other:?}", j.budget_id)),
        }
    }
    wrong
}

/// Runs the scenario against `service`; returns the table row.
async fn outage_of(service: &'static str) -> String {
    let mut cluster = Cluster::start();
    let url = cluster.addr("executor");
    let router = cluster.addr("router");
    wait_for("built-in agents routable", Duration::from_secs(30), || {
        routed(&router, &["--capability", "builtin.sleep"]).is_some_and(|ids| !ids.is_empty())
    });
    let client = JobServiceClient::new(as_user(&url, &cluster.addr("auth"), "alice").await);
    let submitted = futures_util::stream::iter(0..JOBS)
        .map(|i| submit(client.clone(), i))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let refused: Vec<_> = submitted.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "every job is accepted: {:?}",
        &refused[..refused.len().min(3)]
    );
    let mut c = client.clone();
    // The outage starts while every job is running — for the approval
    // service, as their last steps start, so the jobs end while it is down.
    let last_step = usize::from(service == "approval") * 2;
    let running = async {
        loop {
            let jobs = all_jobs(&mut c).await;
            let active = jobs
                .iter()
                .filter(|j| j.state == JobState::Active as i32)
                .count();
            let at_step = jobs.iter().any(|j| {
                j.tasks
                    .get(last_step)
                    .is_some_and(|t| t.state == TaskState::Running as i32)
            });
            if active == JOBS && at_step {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("all jobs running");
    let started = Instant::now();
    let addr = cluster.crash(service);
    // Jobs submitted meanwhile are accepted and wait (the submission waits
    // a while first), unless the service is one admission does not need.
    let late: Vec<_> = futures_util::future::join_all((JOBS..JOBS + LATE).map(|i| {
        let submitted = submit(client.clone(), i);
        async move { submitted.await.unwrap().into_inner() }
    }))
    .await;
    if ["ledger", "approval", "router"].contains(&service) {
        for r in &late {
            let j = r.job.as_ref().unwrap();
            assert!(r.created);
            assert_eq!(
                (j.state, j.reason.as_str()),
                (JobState::Pending as i32, "DEPENDENCY_UNAVAILABLE"),
                "{}",
                j.error
            );
            assert!(j.error.contains(service), "{}", j.error);
        }
    }
    let down = Duration::from_secs(3).saturating_sub(started.elapsed());
    tokio::time::sleep(down).await;
    tokio::task::block_in_place(|| cluster.revive(service, &addr));
    tokio::task::block_in_place(|| cluster.rolling_restart(service));
    let outages = started.elapsed();

    // Bounded: no job may be stuck.
    let mut c = client.clone();
    let done = async {
        loop {
            let jobs = all_jobs(&mut c).await;
            let finished = jobs.iter().all(|j| {
                ![
                    JobState::Pending,
                    JobState::Available,
                    JobState::Active,
                    JobState::Scheduled,
                ]
                .contains(&JobState::try_from(j.state).unwrap_or(JobState::Unspecified))
            });
            if finished {
                return jobs;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let jobs = tokio::time::timeout(Duration::from_secs(120), done)
        .await
        .expect("every job finishes: none is stuck");
    let not_completed: Vec<_> = jobs
        .iter()
        .filter(|j| j.state != JobState::Completed as i32)
        .map(|j| format!("{}: state {} {} {}", j.run_id, j.state, j.reason, j.error))
        .collect();
    assert_eq!(jobs.len(), JOBS + LATE);
    assert!(
        not_completed.is_empty(),
        "{service} outage: {} of {} jobs did not complete: {:?}",
        not_completed.len(),
        JOBS + LATE,
        &not_completed[..not_completed.len().min(5)]
    );
    // Eventually consistent: the outbox delivers what the outage held up.
    let deadline = Instant::now() + Duration::from_secs(60);
    let wrong = loop {
        let wrong = inconsistencies(&cluster, &jobs).await;
        if wrong.is_empty() || Instant::now() > deadline {
            break wrong;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        wrong.is_empty(),
        "{service} outage left {} inconsistencies: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    for name in [
        "executor", "approval", "ledger", "router", "registry", "auth",
    ] {
        let (p, _) = cluster.take(name);
        assert_eq!(p.terminate(), Some(0), "{name} stops cleanly");
    }
    let row = format!(
        "| {service} | kill -9 for 3 s, then SIGTERM restart ({:.1} s) | {JOBS} running + {LATE} submitted during the outage | {} completed | 0 discarded | 0 stuck | runs, budgets, reservations consistent |",
        outages.as_secs_f64(),
        jobs.len()
    );
    eprintln!("{row}");
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_outage_delays_running_jobs_and_fails_none() {
    outage_of("ledger").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_outage_delays_running_jobs_and_fails_none() {
    outage_of("router").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_outage_delays_running_jobs_and_fails_none() {
    outage_of("approval").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_delays_running_jobs_and_fails_none() {
    outage_of("registry").await;
}
