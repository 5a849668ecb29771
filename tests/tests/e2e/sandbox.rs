//! Command tasks through the job API, sandboxed: what a job can no longer
//! reach, what a task over its limits gets, and the explicit sandbox-off
//! path (the sandbox's own escape tests are in crates/sandbox/tests).
#![allow(clippy::unwrap_used)] // a failed setup step is a failed test

use std::os::unix::fs::PermissionsExt;

use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    GetResultResponse, Isolation, JobState, TaskState, TaskStatus,
};
use switchyard_testkit::Stack;

use crate::common::*;

async fn stack(off: bool) -> (Stack, Jobs) {
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.approval_poll_ms = 20;
        if off {
            c.executor.sandbox = switchyard_executor::SandboxMode::Off;
        }
    })
    .await
    .unwrap();
    let c = JobServiceClient::new(s.channel().await.unwrap());
    (s, c)
}

fn task<'a>(r: &'a GetResultResponse, id: &str) -> &'a TaskStatus {
    r.tasks.iter().find(|t| t.task_id == id).unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn a_job_cannot_run_a_shell_or_read_the_data_directory() {
    let (s, mut c) = stack(false).await;
    // Only the sandbox can stop these reads: the files are world-readable.
    let data = s.data_dir().to_path_buf();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let visible = data.join("visible.txt");
    std::fs::write(&visible, "secret\n").unwrap();
    std::fs::set_permissions(&visible, std::fs::Permissions::from_mode(0o644)).unwrap();
    let marker = data.join("escaped");
    let doc = serde_json::json!({"job_id": "escape", "tasks": [
        {"id": "shell", "command": {"command": "awk", "args": [
            format!("BEGIN {{ r = system(\"echo owned > {}\"); print \"system returned\", r }}", marker.display())]}},
        {"id": "data", "command": {"command": "cat", "args": [visible.display().to_string()]}},
        {"id": "creds", "command": {"command": "cat", "args": [data.join("credentials.json").display().to_string()]}}
    ]})
    .to_string();
    submit(&mut c, &doc).await.unwrap();
    let r = finish(&mut c, "escape").await;
    assert!(!marker.exists(), "awk's system() ran a shell");
    let shell = task(&r, "shell");
    assert!(text(&shell.stdout).contains("system returned"), "{shell:?}");
    assert_eq!(shell.isolation, Isolation::Sandboxed as i32);
    assert!(
        shell.isolation_detail.starts_with("landlock abi"),
        "{}",
        shell.isolation_detail
    );
    for id in ["data", "creds"] {
        let t = task(&r, id);
        assert_eq!(t.state, TaskState::Failed as i32, "{id}: {t:?}");
        assert_eq!(t.reason, "COMMAND_FAILED");
        assert!(text(&t.stderr).contains("Permission denied"), "{id}: {t:?}");
        assert!(!text(&t.stdout).contains("secret"));
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_task_over_its_cpu_limit_fails_naming_it_and_keeps_partial_results() {
    let (s, mut c) = stack(false).await;
    let doc = r#"{"job_id":"hog","tasks":[
        {"id":"before","command":{"command":"echo","args":["partial"]}},
        {"id":"spin","depends_on":["before"],"command":{"command":"awk","args":["BEGIN { while (1) n++ }"],
            "limits":{"cpu_seconds":1}}},
        {"id":"after","depends_on":["spin"],"command":{"command":"echo","args":["never"]}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let r = finish(&mut c, "hog").await;
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    assert_eq!(r.reason, "TASK_RESOURCE_LIMIT");
    let spin = task(&r, "spin");
    assert_eq!(
        (spin.reason.as_str(), spin.resource_limit.as_str()),
        ("TASK_RESOURCE_LIMIT", "cpu_seconds")
    );
    assert!(
        spin.error.contains("CPU time limit (cpu_seconds = 1)"),
        "{}",
        spin.error
    );
    assert_eq!(text(&task(&r, "before").stdout), "partial\n");
    assert_eq!(task(&r, "after").state, TaskState::Skipped as i32);
    // The executor is unaffected: the next job runs normally.
    submit(
        &mut c,
        r#"{"job_id":"next","tasks":[{"id":"t","command":{"command":"echo","args":["fine"]}}]}"#,
    )
    .await
    .unwrap();
    let r = finish(&mut c, "next").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn limits_above_the_deployment_cap_are_refused_at_submission() {
    let (s, mut c) = stack(false).await;
    let e = submit(
        &mut c,
        r#"{"tasks":[{"id":"t","command":{"command":"true","limits":{"memory_bytes":1099511627776}}}]}"#,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .contains("executor.task_limit_caps.memory_bytes"),
        "{e:?}"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn with_the_sandbox_off_every_command_task_says_so() {
    let (s, mut c) = stack(true).await;
    submit(
        &mut c,
        r#"{"job_id":"open","tasks":[{"id":"t","command":{"command":"true"}}]}"#,
    )
    .await
    .unwrap();
    let r = finish(&mut c, "open").await;
    let t = task(&r, "t");
    assert_eq!(t.isolation, Isolation::Off as i32);
    assert!(t.isolation_detail.starts_with("sandbox off"), "{t:?}");
    s.stop().await.unwrap();
}
