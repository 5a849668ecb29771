//! A data directory written by the release before the storage seams and
//! the cheaper storage of issue 42 (`fixtures/release-44c6680`, written by
//! `fixtures/make-release-data.sh`) opens in today's `switchyard dev`: every
//! job, run, audit record and budget reads as that release answered, and new
//! work runs on it.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Proc, cli, ok, submit_as, wait_for};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/release-44c6680"
);

/// Copies directory `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Where `now` differs from `then`, for every field `then` has (a newer
/// release may add fields; it may not change or drop one).
fn differences(path: &str, then: &Value, now: &Value, out: &mut Vec<String>) {
    match (then, now) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => differences(&format!("{path}.{k}"), v, w, out),
                    None => out.push(format!("{path}.{k}: gone (was {v})")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), v, w, out);
            }
        }
        _ if then == now => {}
        _ => out.push(format!("{path}: was {then}, now {now}")),
    }
}

fn recorded(name: &str) -> Value {
    let text = std::fs::read_to_string(Path::new(FIXTURE).join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn json(url: &str, args: &[&str]) -> Value {
    serde_json::from_str(&ok(&cli(url, args))).unwrap()
}

#[test]
fn a_data_directory_of_the_previous_release_reads_the_same_and_takes_new_work() {
    let data = tempfile::tempdir().unwrap();
    copy_dir(Path::new(FIXTURE), data.path());
    let log = data.path().join("stderr.log");
    let dev = Proc::dev_at(data.path(), &[], &log);
    let url = dev.url();

    let mut diff = Vec::new();
    let jobs = recorded("jobs.json");
    let jobs = jobs.as_array().unwrap();
    assert_eq!(jobs.len(), 5, "the fixture's jobs");
    for then in jobs {
        let id = then["job_id"].as_str().unwrap();
        let now = json(&url, &["job", "get", id, "--as", "alice", "-o", "json"]);
        differences(id, then, &now, &mut diff);
        // Every event it recorded still streams, to the job's end.
        let out = cli(&url, &["job", "watch", id, "--as", "alice", "-o", "json"]);
        // 0: it completed; 3: it ended without completing.
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "{id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let last = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|e| e["sequence"].as_u64())
            .max();
        assert_eq!(
            last,
            then["last_sequence"].as_u64(),
            "{id}: its events stream to the last one"
        );
    }
    differences(
        "runs",
        &recorded("runs.json"),
        &json(&url, &["approval", "list", "-o", "json"]),
        &mut diff,
    );
    let audit = recorded("audit.json");
    let run = audit["run"]["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    differences(
        "audit",
        &audit,
        &json(&url, &["approval", "show", &run, "-o", "json"]),
        &mut diff,
    );
    differences(
        "budgets",
        &recorded("budgets.json"),
        &json(&url, &["budget", "list", "-o", "json"]),
        &mut diff,
    );
    assert!(
        diff.is_empty(),
        "answers changed after the upgrade:\n{}",
        diff.join("\n")
    );

    // New work runs on the upgraded directory, and survives a restart.
    let job = submit_as(&url, "examples/jobs/echo_chain.yaml", "alice");
    let id = job["job_id"].as_str().unwrap().to_owned();
    ok(&cli(&url, &["job", "watch", &id, "--as", "alice"]));
    assert_eq!(dev.terminate(), Some(0));
    let dev = Proc::dev_at(data.path(), &[], &log);
    let url = dev.url();
    wait_for(
        "the restarted node answers",
        Duration::from_secs(20),
        || {
            cli(&url, &["job", "get", &id, "--as", "alice", "-o", "json"])
                .status
                .success()
        },
    );
    let now = json(&url, &["job", "get", &id, "--as", "alice", "-o", "json"]);
    assert_eq!(now["state"], "completed", "{now}");
    for then in jobs {
        let id = then["job_id"].as_str().unwrap();
        let now = json(&url, &["job", "get", id, "--as", "alice", "-o", "json"]);
        let mut diff = Vec::new();
        differences(id, then, &now, &mut diff);
        assert!(diff.is_empty(), "after a restart: {}", diff.join("\n"));
    }
    // History from before chains verifies, counted apart, and the new
    // work's records are chained in all three logs.
    let v = json(&url, &["audit", "verify", "--as", "admin", "-o", "json"]);
    for (log, what) in [
        ("jobs", "job_id"),
        ("runs", "run_id"),
        ("budgets", "budget_id"),
    ] {
        assert_eq!(
            v[log]["problems"],
            serde_json::json!([]),
            "{log} ({what}): {v}"
        );
        assert!(v[log]["records"].as_u64().unwrap() > 0, "{log}: {v}");
    }
    assert!(v["budgets"]["unlinked"].as_u64().unwrap() > 0, "{v}");
}
