//! The command sandbox as an operator and a user meet it, against real
//! `switchyard dev` processes: what the start-up log says, what `job get`
//! shows, and command tasks refused when the kernel cannot isolate them.

#![allow(clippy::unwrap_used)] // test helpers: a failed step is a failed test

use crate::support::*;

const COMMAND_JOB: &str = r#"{"tasks":[{"id":"t","command":{"command":"echo","args":["hi"]}}]}"#;

/// Waits (bounded) for the process's log, written in the background, to
/// say `what`.
fn logged(log: &std::path::Path, what: &str) {
    wait_for(what, std::time::Duration::from_secs(10), || {
        std::fs::read_to_string(log).is_ok_and(|l| l.contains(what))
    });
}

/// Submits `doc` as alice and waits for the job to end; returns its id.
fn run_job(url: &str, dir: &std::path::Path, doc: &str) -> String {
    let file = dir.join("job.json");
    std::fs::write(&file, doc).unwrap();
    let out = ok(&cli(
        url,
        &[
            "job",
            "submit",
            file.to_str().unwrap(),
            "--watch",
            "--as",
            "alice",
        ],
    ));
    out.lines()
        .find_map(|l| l.strip_prefix("submitted job "))
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn dev_sandboxes_command_tasks_and_job_get_says_how() {
    let (dev, data) = Proc::dev(&[]);
    let id = run_job(&dev.url(), data.path(), COMMAND_JOB);
    let shown = ok(&cli(&dev.url(), &["job", "get", &id]));
    assert!(
        shown.contains("commands sandboxed: landlock abi"),
        "{shown}"
    );
    let json = ok(&cli(&dev.url(), &["job", "get", &id, "-o", "json"]));
    assert!(json.contains("\"isolation\": \"sandboxed\""), "{json}");
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn dev_without_landlock_refuses_command_tasks_and_says_why() {
    let (dev, data, log) = Proc::dev_logged(&[("SWITCHYARD_SANDBOX_MAX_ABI", "0")]);
    logged(&log, "command tasks are REFUSED");
    let file = data.path().join("job.json");
    std::fs::write(&file, COMMAND_JOB).unwrap();
    let out = cli(
        &dev.url(),
        &["job", "submit", file.to_str().unwrap(), "--as", "alice"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("SANDBOX_UNAVAILABLE"), "{err}");
    assert!(err.contains("executor.sandbox = \"off\""), "{err}");
    // Jobs without commands are unaffected.
    let agent_only =
        r#"{"tasks":[{"id":"a","agent":{"capability":"builtin.echo","input":{"x":1}}}]}"#;
    let id = run_job(&dev.url(), data.path(), agent_only);
    let shown = ok(&cli(&dev.url(), &["job", "get", &id]));
    assert!(shown.contains("completed"), "{shown}");
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn dev_with_the_sandbox_off_warns_at_start_and_on_every_command_task() {
    let (dev, data, log) = Proc::dev_logged(&[("SWITCHYARD_EXECUTOR__SANDBOX", "off")]);
    logged(&log, "command sandbox OFF");
    let id = run_job(&dev.url(), data.path(), COMMAND_JOB);
    let shown = ok(&cli(&dev.url(), &["job", "get", &id]));
    assert!(
        shown.contains("WARNING: commands ran WITHOUT the sandbox"),
        "{shown}"
    );
    assert_eq!(dev.terminate(), Some(0));
}
