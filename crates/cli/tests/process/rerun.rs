//! `switchyard job rerun --resume` against a real `switchyard dev` killed
//! with SIGKILL twice: while the resumed job waits for its approval, and
//! while its last task runs. A kept task never runs again.

use std::time::Duration;

use crate::support::*;

fn job_json(url: &str, id: &str) -> serde_json::Value {
    let out = ok(&cli(
        url,
        &["job", "get", id, "--as", "alice", "-o", "json"],
    ));
    serde_json::from_str(&out).expect("job get -o json prints JSON")
}

fn task<'a>(job: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    job["tasks"]
        .as_array()
        .expect("a job has tasks")
        .iter()
        .find(|t| t["task_id"] == id)
        .expect("the task is the job's")
}

/// `switchyard dev` on `data` again (after a crash), once it answers.
fn restart(data: &std::path::Path, env: &[(&str, &str)], log: &std::path::Path, id: &str) -> Proc {
    let dev = Proc::dev_at(data, env, log);
    let url = dev.url();
    wait_for(
        "the restarted node answers",
        Duration::from_secs(20),
        || {
            cli(&url, &["job", "get", id, "--as", "alice", "-o", "json"])
                .status
                .success()
        },
    );
    dev
}

#[test]
fn a_resumed_job_survives_kill_9_and_never_runs_a_kept_task_again() {
    let data = tempfile::tempdir().unwrap();
    let flags = tempfile::tempdir().unwrap();
    let log = data.path().join("stderr.log");
    let env = [
        ("SWITCHYARD_EXECUTOR__SANDBOX", "off"),
        ("SWITCHYARD_EXECUTOR__COMMANDS", "[\"sh\", \"sleep\"]"),
    ];
    let dev = Proc::dev_at(data.path(), &env, &log);
    let url = dev.url();
    let f = flags.path().display();
    // `a` counts its runs; `b` fails until the flag file exists; `c` is slow.
    let spec = format!(
        r#"{{"job_id": "nightly", "approval": {{"requires_approval": true}},
            "tasks": [
              {{"id": "a", "command": {{"command": "sh", "args": ["-c", "echo run >> {f}/a-ran; echo made by a"]}}}},
              {{"id": "b", "depends_on": ["a"], "retry": {{"max_retries": 0}},
                "command": {{"command": "sh", "args": ["-c", "test -f {f}/ok && echo b"]}}}},
              {{"id": "c", "depends_on": ["b"], "command": {{"command": "sleep", "args": ["3"]}}}}
            ]}}"#
    );
    let file = data.path().join("nightly.json");
    std::fs::write(&file, spec).unwrap();
    submit_as(&url, file.to_str().unwrap(), "alice");
    ok(&cli(
        &url,
        &[
            "approval",
            "approve",
            "run-nightly",
            "-m",
            "ok",
            "--as",
            "bob",
        ],
    ));
    let watched = cli(&url, &["job", "watch", "nightly", "--as", "alice"]);
    assert_eq!(watched.status.code(), Some(3), "it fails at b");
    assert_eq!(task(&job_json(&url, "nightly"), "b")["state"], "failed");

    std::fs::write(flags.path().join("ok"), "").unwrap();
    let out = ok(&cli(
        &url,
        &[
            "job",
            "rerun",
            "nightly",
            "--resume",
            "--new-id",
            "nightly-2",
            "--as",
            "alice",
        ],
    ));
    assert!(
        out.contains("resumed job nightly as job nightly-2: pending; kept a (their outputs reused, not run again)"),
        "{out}"
    );
    // Killed while the resumed job waits for its approval.
    dev.kill9();
    let dev = restart(data.path(), &env, &log, "nightly-2");
    let url = dev.url();
    let pending = job_json(&url, "nightly-2");
    assert_eq!(pending["state"], "pending", "{pending}");
    assert_eq!(pending["rerun_of"], "nightly");
    ok(&cli(
        &url,
        &[
            "approval",
            "approve",
            "run-nightly-2",
            "-m",
            "ok",
            "--as",
            "bob",
        ],
    ));
    // Killed again while its last task runs.
    wait_for("c runs", Duration::from_secs(20), || {
        task(&job_json(&url, "nightly-2"), "c")["state"] == "running"
    });
    dev.kill9();
    let dev = restart(data.path(), &env, &log, "nightly-2");
    let url = dev.url();
    let watched = cli(&url, &["job", "watch", "nightly-2", "--as", "alice"]);
    assert_eq!(
        watched.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&watched.stdout)
    );
    let done = job_json(&url, "nightly-2");
    assert_eq!(done["state"], "completed", "{done}");
    let a = task(&done, "a");
    assert_eq!(a["state"], "succeeded");
    assert_eq!(a["attempts"], serde_json::json!([]), "a was kept: {a}");
    assert_eq!(a["stdout"], "made by a\n", "with the first job's output");
    let ran = std::fs::read_to_string(flags.path().join("a-ran")).unwrap();
    assert_eq!(ran.lines().count(), 1, "a ran once, in the first job only");
    assert_eq!(dev.terminate(), Some(0));
}
