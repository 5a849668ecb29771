//! A job its budget pauses, from the CLI against a real `switchyard dev`,
//! through a `kill -9` while it is paused: after the restart it is still
//! paused with the same extension request; `job retry` says what to do
//! instead; its submitter may not resume it; an approver's `job resume`
//! raises its budget and it goes on where it stopped — the finished step
//! does not run again.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// A free first step (a command), then an agent step whose hold (4,096
/// tokens) does not fit in the team's 100: the example the docs record.
const JOB: &str = include_str!("../../../../examples/jobs/team_budget.yaml");

fn job(url: &str) -> Value {
    serde_json::from_str(&ok(&cli(
        url,
        &["job", "get", "tight-team", "-o", "json", "--as", "alice"],
    )))
    .unwrap()
}

/// Waits (bounded) until the job is in `state`; the job.
fn until_state(url: &str, state: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        last = job(url);
        if last["state"] == state {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("tight-team is not {state} within 30 s: {last}");
}

#[test]
fn a_budget_paused_job_survives_kill_9_and_an_approver_resumes_it_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, JOB).unwrap();
    let dev1 = dev_in(dir.path());
    let url = dev1.url();
    ok(&cli(
        &url,
        &[
            "budget",
            "create",
            "team",
            "--tokens",
            "100",
            "--label",
            "shared_with=alice",
        ],
    ));
    submit_as(&url, file.to_str().unwrap(), "alice");
    let paused = until_state(&url, "budget_paused");
    let pause = paused["budget_pause"].clone();
    assert_eq!(pause["dimension"], "tokens", "{paused}");
    assert_eq!(pause["decision"], "pending", "{paused}");
    assert_eq!(pause["remaining_tasks"], serde_json::json!(["answer"]));
    let run = pause["run_id"].as_str().unwrap().to_owned();
    assert_eq!(paused["tasks"][0]["state"], "succeeded");
    assert_eq!(paused["tasks"][1]["state"], "budget_paused");
    // Crash while the job is paused.
    dev1.kill9();

    let dev2 = dev_in(dir.path());
    let url = dev2.url();
    let again = until_state(&url, "budget_paused");
    assert_eq!(
        again["budget_pause"], pause,
        "the same request after the restart"
    );
    let shown = ok(&cli(&url, &["job", "get", "tight-team", "--as", "alice"]));
    assert!(
        shown.contains(&format!("extension run {run} asks for"))
            && shown.contains("switchyard job resume tight-team"),
        "{shown}"
    );
    // `job retry` says what to do instead of a bare refusal.
    let retry = cli(&url, &["job", "retry", "tight-team", "--as", "admin"]);
    assert!(!retry.status.success());
    let why = String::from_utf8_lossy(&retry.stderr);
    assert!(
        why.contains("paused by its budget") && why.contains("switchyard job resume"),
        "{why}"
    );
    // The submitter may not extend her own job's budget.
    let mine = cli(&url, &["job", "resume", "tight-team", "--as", "alice"]);
    assert!(!mine.status.success());
    assert!(
        String::from_utf8_lossy(&mine.stderr).contains("PERMISSION_DENIED"),
        "{}",
        String::from_utf8_lossy(&mine.stderr)
    );
    // The team's budget was the limit: raised, and bob approves.
    ok(&cli(
        &url,
        &["budget", "update", "team", "--tokens", "10000"],
    ));
    let out = ok(&cli(
        &url,
        &[
            "job",
            "resume",
            "tight-team",
            "--as",
            "bob",
            "-m",
            "worth it",
        ],
    ));
    assert!(
        out.contains(&format!("approved extension run {run} of job tight-team")),
        "{out}"
    );
    // bob's decision as a signed receipt, checked offline; a copy with
    // the amount changed does not verify.
    let got = cli(&url, &["approval", "receipt", &run, "--as", "bob"]);
    let receipt = ok(&got);
    let stderr = String::from_utf8_lossy(&got.stderr).into_owned();
    let key = stderr
        .lines()
        .find_map(|l| l.strip_prefix("deployment key "))
        .and_then(|l| l.split(": ").nth(1))
        .expect("the deployment's public key")
        .trim()
        .to_owned();
    let file = dir.path().join("receipt.json");
    std::fs::write(&file, &receipt).unwrap();
    let checked = ok(&cli(
        &url,
        &["approval", "verify", file.to_str().unwrap(), "--key", &key],
    ));
    assert!(
        checked.starts_with(&format!("valid: run {run} approved by bob at ")),
        "{checked}"
    );
    let forged = receipt.replace("\"tokens\": 3996", "\"tokens\": 399600");
    assert_ne!(forged, receipt, "the amount is in the receipt: {receipt}");
    std::fs::write(&file, forged).unwrap();
    let refused = cli(
        &url,
        &["approval", "verify", file.to_str().unwrap(), "--key", &key],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("the signature does not match"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let done = until_state(&url, "completed");
    assert_eq!(done["budget_pause"]["decision"], "approved", "{done}");
    assert_eq!(done["budget_pause"]["decided_by"], "bob", "{done}");
    let attempts = |i: usize| done["tasks"][i]["attempts"].as_array().map_or(0, Vec::len);
    assert_eq!((attempts(0), attempts(1)), (1, 2), "{done}");
    // Resuming a job that is not paused says so.
    let twice = cli(&url, &["job", "resume", "tight-team", "--as", "bob"]);
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("is completed, not paused by its budget"),
        "{}",
        String::from_utf8_lossy(&twice.stderr)
    );
    assert_eq!(dev2.terminate(), Some(0));
}
