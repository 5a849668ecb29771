//! `switchyard schedule` against a real `switchyard dev` killed with
//! SIGKILL mid-timetable: every tick before, during and after the crash
//! has exactly one job (a restart within the grace minute catches the
//! ticks it missed one by one), and the CLI shows the timetable.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::executor_replicas::tick_seconds;
use crate::support::*;

fn schedule(url: &str, id: &str) -> serde_json::Value {
    let out = ok(&cli(
        url,
        &["schedule", "get", id, "--as", "alice", "-o", "json"],
    ));
    serde_json::from_str(&out).expect("schedule get -o json prints JSON")
}

/// Started ticks (ms) of schedule `id` as `url` shows them.
fn started(url: &str, id: &str) -> Vec<u64> {
    schedule(url, id)["recent_ticks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["outcome"] == "TICK_OUTCOME_STARTED")
        .map(|t| t["at"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_schedule_on_one_node_starts_exactly_one_job_per_tick_through_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let log = data.path().join("stderr.log");
    let env = [("SWITCHYARD_EXECUTOR__SCHEDULE_POLL_MS", "100")];
    let dev = Proc::dev_at(data.path(), &env, &log);
    let url = dev.url();
    let file = data.path().join("beat.json");
    std::fs::write(
        &file,
        r#"{"plan_id": "beat", "tasks": [
             {"id": "say", "agent": {"capability": "builtin.echo", "input": {"text": "beat"}}}]}"#,
    )
    .unwrap();
    let made = ok(&cli(
        &url,
        &[
            "schedule",
            "create",
            file.to_str().unwrap(),
            "--cron",
            "* * * * * *",
            "--id",
            "beat",
            "--overlap",
            "queue",
            "--catch-up",
            "all",
            "--as",
            "alice",
        ],
    ));
    assert!(made.starts_with("created schedule beat"), "{made}");
    assert_eq!(made.matches("next:").count(), 5, "{made}");
    wait_for("three ticks", Duration::from_secs(20), || {
        started(&url, "beat").len() >= 3
    });
    dev.kill9();
    let dev = Proc::dev_at(data.path(), &env, &log);
    let url = dev.url();
    let back = switchyard_kit::time::now_ms();
    wait_for(
        "three ticks after the restart",
        Duration::from_secs(30),
        || {
            cli(
                &url,
                &["schedule", "get", "beat", "--as", "alice", "-o", "json"],
            )
            .status
            .success()
                && started(&url, "beat").iter().filter(|t| **t > back).count() >= 3
        },
    );
    ok(&cli(&url, &["schedule", "pause", "beat", "--as", "alice"]));
    let listed = ok(&cli(&url, &["schedule", "list", "--as", "alice"]));
    assert!(
        listed.contains("beat") && listed.contains("paused"),
        "{listed}"
    );
    // Every job of the schedule, one per second with no gap: none missed
    // across the crash, none twice.
    let jobs: serde_json::Value = serde_json::from_str(&ok(&cli(
        &url,
        &["job", "list", "--as", "alice", "-o", "json"],
    )))
    .unwrap();
    let mut ids: Vec<String> = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().to_owned())
        .filter(|id| id.starts_with("beat-"))
        .collect();
    ids.sort();
    let secs = tick_seconds(&ids, "beat-");
    assert!(secs.len() >= 6, "{ids:?}");
    for w in secs.windows(2) {
        assert_eq!(w[1], w[0] + 1, "one job per tick, none missed: {ids:?}");
    }
    let ticks = started(&url, "beat");
    assert_eq!(ticks.len(), ids.len(), "each started tick names one job");
    assert_eq!(dev.terminate(), Some(0));
}
