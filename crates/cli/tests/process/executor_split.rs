//! The executor with every service in its own `switchyard serve` process:
//! jobs driven from the CLI, approval by a second person, and a `kill -9` of
//! the executor in the middle of a job, after which the job resumes: finished
//! tasks never run again, the interrupted one runs again, its reservation is
//! reconciled, and a watcher resumes from the last sequence it saw.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::*;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{GetResultRequest, SubmitJobRequest, WatchJobRequest};
use tokio_stream::StreamExt;

fn executor(data: &std::path::Path, others: &str) -> Proc {
    let url = format!("http://{others}");
    let to = Remotes {
        keys: &url,
        registry: &url,
        router: &url,
        ledger: &url,
        approval: &url,
    };
    let commands = "[\"sh\", \"echo\", \"grep\", \"sort\", \"uniq\", \"cut\", \"sleep\", \"true\"]";
    serve_executor(data, &to, &[("SWITCHYARD_EXECUTOR__COMMANDS", commands)])
}

#[test]
fn five_processes_run_jobs_driven_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| {
        let p = dir.path().join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    // The registry's process keeps the API keys; the others follow its key
    // set and call each other with the cluster's service token.
    let registry = serve("registry,auth", &d("registry"), &[]);
    let keys = follow_keys(&registry.url());
    let keys = (keys.0, keys.1.as_str());
    let router = serve(
        "router",
        &d("router"),
        &[("SWITCHYARD_ROUTER__REGISTRY_URL", &registry.url()), keys],
    );
    let ledger = serve("ledger", &d("ledger"), &[keys]);
    let approval = serve("approval", &d("approval"), &[keys]);
    let (r, l, a, ro) = (registry.url(), ledger.url(), approval.url(), router.url());
    let to = Remotes {
        keys: keys.1,
        registry: &r,
        router: &ro,
        ledger: &l,
        approval: &a,
    };
    let x = serve_executor(&d("executor"), &to, &[]);
    let url = x.url();
    // The built-in agents register with the remote registry and the router learns of them.
    wait_for("built-in agents routable", Duration::from_secs(20), || {
        routed(&ro, &["--capability", "builtin.echo"]).is_some_and(|ids| ids == ["builtin"])
    });

    // The seed 001 envelope over the bundled log, followed live.
    let out = ok(&cli(
        &url,
        &[
            "job",
            "submit",
            "examples/jobs/log_analysis.json",
            "--attach",
            "examples/jobs/sample.log",
            "--watch",
            "--as",
            "alice",
        ],
    ));
    assert!(out.contains("job -> completed"), "{out}");
    let id = out
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("submitted job ")
        .to_owned();
    let result = ok(&cli(&url, &["job", "result", &id]));
    assert!(
        result.contains("3 ERROR db       connection refused host=db-1"),
        "{result}"
    );

    // The seed's validation text, from the CLI, exit 1, nothing created.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"plan_id":"p","tasks":[{"task_number":1,"command":"sort"},{"task_number":3,"command":"uniq"}]}"#).unwrap();
    let e = cli(
        &url,
        &["job", "submit", bad.to_str().unwrap(), "--as", "alice"],
    );
    assert!(!e.status.success());
    assert!(
        String::from_utf8_lossy(&e.stderr)
            .contains("Invalid task numbering: gap between task 1 and 3"),
        "{e:?}"
    );

    // A job needing a person: pending until bob approves in the approval service.
    let submitted = submit_as(&url, "examples/jobs/needs_approval.yaml", "alice");
    let (job, run) = (
        submitted["job_id"].as_str().unwrap().to_owned(),
        submitted["run_id"].as_str().unwrap().to_owned(),
    );
    assert_eq!(submitted["state"], "pending");
    let own = cli(&a, &["approval", "approve", &run, "--as", "alice"]);
    assert!(
        String::from_utf8_lossy(&own.stderr).contains("PERMISSION_DENIED"),
        "a submitter cannot approve: {own:?}"
    );
    ok(&cli(
        &a,
        &["approval", "approve", &run, "--as", "bob", "-m", "ok"],
    ));
    let shown = ok(&cli(&a, &["approval", "show", &run]));
    assert!(shown.contains("proposed:      20"), "{shown}");
    assert!(shown.contains(" by bob, after waiting "), "{shown}");
    assert!(shown.contains("TIME (UTC)"), "{shown}");
    let watched = ok(&cli(&url, &["job", "watch", &job]));
    assert!(watched.contains("job -> completed after "), "{watched}");
    // Every state line leads with its time (UTC, to the millisecond), and
    // a task that stopped says how long it ran.
    let line = watched
        .lines()
        .find(|l| l.contains(" -> succeeded"))
        .unwrap_or_default();
    let (time, rest) = line.split_once(' ').unwrap_or_default();
    assert!(
        time.len() == 13 && time.ends_with('Z') && time.as_bytes()[2] == b':',
        "{watched}"
    );
    assert!(
        rest.starts_with("task ") && rest.contains(" after "),
        "{watched}"
    );
    let got: serde_json::Value =
        serde_json::from_str(&ok(&cli(&url, &["job", "get", &job, "-o", "json"]))).unwrap();
    assert_eq!(got["tasks"][0]["agent_id"], "builtin");
    assert_eq!(got["submitted_by"], "alice");

    // Run again across the split: a new job of alice's, approved again
    // by a person in the approval service's process.
    let again = ok(&cli(
        &url,
        &["job", "rerun", &job, "--new-id", "again", "--as", "alice"],
    ));
    assert!(
        again.contains(&format!("re-ran job {job} as job again: pending")),
        "{again}"
    );
    ok(&cli(
        &a,
        &[
            "approval",
            "approve",
            "run-again",
            "--as",
            "bob",
            "-m",
            "once more",
        ],
    ));
    let watched = ok(&cli(&url, &["job", "watch", "again"]));
    assert!(watched.contains("job -> completed after "), "{watched}");
    let got: serde_json::Value =
        serde_json::from_str(&ok(&cli(&url, &["job", "get", "again", "-o", "json"]))).unwrap();
    assert_eq!(got["rerun_of"], job.as_str());

    // Validate shows the route; list shows the jobs.
    let v = ok(&cli(
        &url,
        &[
            "job",
            "validate",
            "examples/jobs/echo_chain.yaml",
            "--as",
            "alice",
        ],
    ));
    assert!(
        v.contains("first -> second -> third") && v.contains("builtin"),
        "{v}"
    );
    let list = ok(&cli(&url, &["job", "list"]));
    assert_eq!(list.lines().count(), 4, "{list}");

    assert_eq!(x.terminate(), Some(0));
    for p in [approval, ledger, router, registry] {
        assert_eq!(p.terminate(), Some(0));
    }
}

/// A JobService client at `url`, authenticated as alice of the key set at
/// `keys_url`.
async fn alice(url: &str, keys_url: &str) -> JobServiceClient<switchyard_kit::client::Intercepted> {
    let token = token(keys_url, "alice");
    JobServiceClient::new(switchyard_kit::client::authed(
        switchyard_kit::client::connect(url).await.unwrap(),
        Some(switchyard_kit::client::Credential::bearer(&token).unwrap()),
    ))
}

async fn watch_until(
    c: &mut JobServiceClient<switchyard_kit::client::Intercepted>,
    job: &str,
    after: u64,
    mut stop: impl FnMut(&Event) -> bool,
) -> Vec<Event> {
    let mut s = c
        .watch_job(WatchJobRequest {
            job_id: job.into(),
            after_sequence: after,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(30), s.next())
        .await
        .unwrap()
    {
        let e = e.unwrap().event.unwrap();
        let done = stop(&e);
        out.push(e);
        if done {
            break;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_executor_resumes_its_job_without_rerunning_finished_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let others = serve(
        "registry,router,ledger,approval,auth",
        &dir.path().join("others"),
        &[],
    );
    let xdata = dir.path().join("executor");
    let x = executor(&xdata, &others.addr);
    // Each command task marks each run of itself in the job's scratch
    // directory (the only place a sandboxed task can write), which outlives
    // the executor; t3 reports every mark.
    let doc = r#"{"job_id":"survivor","tasks":[
          {"id":"t1","command":{"command":"sh","args":["-c","echo t1 ran >> marks"]}},
          {"id":"t2","depends_on":["t1"],"agent":{"capability":"builtin.sleep","input":{"ms":3000}},
            "retry":{"max_retries":5,"backoff_strategy":"fixed","backoff_base_ms":300}},
          {"id":"t3","depends_on":["t2"],"command":{"command":"sh","args":["-c","echo t3 ran >> marks; while read -r l; do echo \"$l\"; done < marks"]}}]}"#
        .to_owned();
    // The built-in agents register and reach the router before the job is priced.
    wait_for("built-in agents routable", Duration::from_secs(20), || {
        routed(&others.url(), &["--capability", "builtin.sleep"]).is_some_and(|ids| !ids.is_empty())
    });
    let mut c = alice(&x.url(), &others.url()).await;
    c.submit_job(SubmitJobRequest {
        document: doc,
        ..Default::default()
    })
    .await
    .unwrap();
    // Watch until t2's agent call holds a reservation: t1 is done and durable.
    let before = watch_until(&mut c, "survivor", 0, |e| {
        e.kind == "budget.reserved" && e.task_id == "t2"
    })
    .await;
    let seen = before.last().unwrap().sequence;
    assert!(
        before
            .iter()
            .any(|e| e.kind == "task.state" && e.task_id == "t1" && field(e, "to") == "succeeded")
    );
    x.kill9();

    let x = executor(&xdata, &others.addr);
    let mut c = alice(&x.url(), &others.url()).await;
    let after = watch_until(&mut c, "survivor", seen, |_| false).await;
    assert_eq!(
        after.first().unwrap().sequence,
        seen + 1,
        "the watcher resumes right after what it saw"
    );
    assert!(
        after.windows(2).all(|w| w[1].sequence == w[0].sequence + 1),
        "no gaps"
    );
    assert_eq!(
        (
            after.last().unwrap().kind.as_str(),
            field(after.last().unwrap(), "to").as_str()
        ),
        ("job.state", "completed")
    );
    assert!(
        after.iter().any(|e| e.kind == "task.state"
            && e.task_id == "t2"
            && field(e, "from") == "running"
            && field(e, "to") == "ready"),
        "the interrupted attempt is requeued"
    );
    assert!(
        after
            .iter()
            .any(|e| e.kind == "budget.released" && field(e, "why") == "reconciled after restart"),
        "its reservation is reconciled"
    );
    let result = c
        .get_result(GetResultRequest {
            job_id: "survivor".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let t3 = result.tasks.iter().find(|t| t.task_id == "t3").unwrap();
    assert_eq!(
        String::from_utf8_lossy(&t3.stdout),
        "t1 ran\nt3 ran\n",
        "t1 never ran again, t3 once"
    );
    // The journal written across the kill verifies, from the CLI against
    // the split executor.
    let out = cli(&x.url(), &["audit", "verify", "--as", "admin"]);
    let said = ok(&out);
    assert!(said.contains("every journal verifies"), "{said}");
    assert!(said.contains("1 job checked"), "{said}");
    // The approval service's audit, where it answers: the job's run.
    let runs = ok(&cli(&others.url(), &["audit", "verify", "--as", "admin"]));
    assert!(
        runs.contains("1 approval run checked") && runs.contains("every run's audit verifies"),
        "{runs}"
    );
    // And the ledger's journal where the ledger answers: the job's budget.
    assert!(
        runs.contains("every budget's journal verifies") && !runs.contains(" 0 ledger records"),
        "{runs}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no ledger (the budgets' journal) answers here"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Its story, from the CLI: the interrupted attempt ran again.
    let story = ok(&cli(
        &x.url(),
        &["job", "explain", "survivor", "--as", "alice"],
    ));
    assert!(story.contains("journal: verifies"), "{story}");
    assert!(story.contains("Step t2: attempt 2 started"), "{story}");
    assert!(story.contains("The job became completed after"), "{story}");
    // Exported, its journal checks out on its own, offline; with two
    // events swapped it does not.
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("survivor.json");
    let bundle_arg = bundle.display().to_string();
    ok(&cli(
        &x.url(),
        &[
            "audit",
            "export",
            "--job",
            "survivor",
            "--out",
            &bundle_arg,
            "--as",
            "admin",
        ],
    ));
    let offline = std::process::Command::new(BIN)
        .args(["audit", "verify", "--bundle", &bundle_arg])
        .env("SWITCHYARD_URL", "http://127.0.0.1:9")
        .output()
        .unwrap();
    let said = ok(&offline);
    assert!(
        said.contains("job survivor:") && said.contains("sealed by key"),
        "{said}"
    );
    // Its decisions replayed under a set that freezes submissions: the
    // same answer from the deployment, over a time range, and offline
    // from the bundle; a directory of no policies is refused.
    let freeze = dir.path().join("freeze");
    std::fs::create_dir(&freeze).unwrap();
    std::fs::write(
        freeze.join("freeze.cedar"),
        r#"@id("freeze") @message("frozen") forbid(principal, action == Action::"submit_job", resource);"#,
    )
    .unwrap();
    let freeze_arg = freeze.display().to_string();
    let replay = |how: &[&str]| {
        let mut args = vec!["audit", "replay", "--policy", freeze_arg.as_str()];
        args.extend_from_slice(how);
        ok(&cli(&x.url(), &args))
    };
    let one = replay(&["--job", "survivor", "--as", "admin"]);
    assert!(
        one.contains("survivor") && one.contains("submit_job"),
        "{one}"
    );
    assert!(
        one.contains("1 of 1 job would have been decided differently")
            && one.contains("1 would be forbidden"),
        "{one}"
    );
    let range = replay(&["--since", "1h", "--as", "admin"]);
    assert!(
        range.contains("1 of 1 job would have been decided differently"),
        "{range}"
    );
    let offline = std::process::Command::new(BIN)
        .args([
            "audit",
            "replay",
            "--policy",
            &freeze_arg,
            "--bundle",
            &bundle_arg,
        ])
        .env("SWITCHYARD_URL", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(ok(&offline), one, "offline, the bundle replays alike");
    let empty = dir.path().join("none");
    std::fs::create_dir(&empty).unwrap();
    let refused = cli(
        &x.url(),
        &[
            "audit",
            "replay",
            "--policy",
            &empty.display().to_string(),
            "--job",
            "survivor",
            "--as",
            "admin",
        ],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("holds no *.cedar files"),
        "{refused:?}"
    );
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    doc["events"].as_array_mut().unwrap().swap(4, 5);
    std::fs::write(&bundle, serde_json::to_vec(&doc).unwrap()).unwrap();
    let swapped = std::process::Command::new(BIN)
        .args(["audit", "verify", "--bundle", &bundle_arg])
        .output()
        .unwrap();
    assert!(!swapped.status.success());
    let said = String::from_utf8_lossy(&swapped.stdout);
    assert!(said.contains("expected record 5, found record 6"), "{said}");
    assert_eq!(x.terminate(), Some(0));
    assert_eq!(others.terminate(), Some(0));
}
