//! RerunJob (issue 47): a finished job run again as a new job — afresh,
//! or resumed with the tasks that succeeded kept (never run again) — as
//! the caller, approved like any submission.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::path::Path;

use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{JobState, RerunJobRequest, RerunJobResponse, TaskState};
use switchyard_testkit::Stack;

use crate::common::*;

/// The kind of an attempt's start in a job's journal.
const ATTEMPT_STARTED: &str = "task.attempt";

async fn start(b: &Backend, readable: &Path) -> Stack {
    let readable = readable.to_path_buf();
    Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.commands.extend(["cat".into(), "echo".into()]);
        c.executor.sandbox_read_paths.push(readable);
        c.executor.approval_poll_ms = 20;
        b.apply(c);
    })
    .await
    .expect("the stack starts")
}

/// A job a person must approve whose task `b` reads `<dir>/ok` — absent
/// at first, so `b` fails and `c` after it never runs.
fn flaky(id: &str, dir: &Path) -> String {
    let ok = dir.join("ok");
    serde_json::json!({
        "job_id": id,
        "approval": {"requires_approval": true},
        "input": {"topic": "first"},
        "tasks": [
            {"id": "a", "agent": {"capability": "text.count", "input": {"text": "made by a"}}},
            {"id": "b", "depends_on": ["a"], "retry": {"max_retries": 0},
             "command": {"command": "cat", "args": [ok.to_str().expect("a UTF-8 temp path")]}},
            {"id": "c", "depends_on": ["b"], "command": {"command": "echo", "args": ["c ran"]}},
        ]
    })
    .to_string()
}

async fn rerun(
    c: &mut Jobs,
    job_id: &str,
    resume: bool,
    input: Option<serde_json::Value>,
) -> Result<RerunJobResponse, tonic::Status> {
    c.rerun_job(RerunJobRequest {
        job_id: job_id.into(),
        resume,
        input: input.and_then(|v| switchyard_kit::json::json_to_struct(&v)),
        new_job_id: String::new(),
    })
    .await
    .map(|r| r.into_inner())
}

fn task<'a>(
    tasks: &'a [switchyard_proto::executor::v1::TaskStatus],
    id: &str,
) -> &'a switchyard_proto::executor::v1::TaskStatus {
    tasks
        .iter()
        .find(|t| t.task_id == id)
        .expect("the task is the job's")
}

async fn a_resumed_job_keeps_what_succeeded_runs_the_rest_and_is_approved_again(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let s = start(&b, dir.path()).await;
    // `a` is an agent's work at 30 micro-USD a call: what the approval of
    // a resume no longer prices once `a` is kept.
    let (stop_agent, agent) = serve_priced_agent(&s, "priced", "text.count", 30, Counting(1));
    wait_routed(&s, "text.count").await;
    let mut alice = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    let first = submit(&mut alice, &flaky("flaky", dir.path()))
        .await
        .unwrap();
    approve(&s, &first.run_id).await;
    let failed = finish(&mut alice, "flaky").await;
    assert_eq!(failed.state(), JobState::Discarded, "{failed:?}");
    let a_then = task(&failed.tasks, "a").clone();
    assert!(a_then.output.is_some(), "{a_then:?}");
    assert_eq!(task(&failed.tasks, "b").state(), TaskState::Failed);

    // The cause is mended; the job resumes as a new one, alice's.
    std::fs::write(dir.path().join("ok"), "now there\n").unwrap();
    let resumed = rerun(&mut alice, "flaky", true, None).await.unwrap();
    assert_eq!(resumed.reused_tasks, ["a"]);
    assert!(resumed.created);
    let new = resumed.job.unwrap();
    let new_id = id(&new);
    assert_ne!(new_id, "flaky");
    assert_eq!(new.rerun_of, "flaky");
    assert_eq!(new.submitted_by, "alice");
    // Approval applies to the new spend: it waits for a person, and a job
    // not finished cannot be run again meanwhile.
    assert_eq!(new.state(), JobState::Pending, "{new:?}");
    let e = rerun(&mut alice, &new_id, true, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        switchyard_kit::error::ApiError::from(e).known_reason(),
        Some(switchyard_core::Reason::JobNotFinished)
    );
    approve(&s, &new.run_id).await;
    let done = finish(&mut alice, &new_id).await;
    assert_eq!(done.state(), JobState::Completed, "{done:?}");
    // `a` was kept, never run: no attempt, the first job's output.
    let a_now = task(&done.tasks, "a");
    assert_eq!(a_now.state(), TaskState::Succeeded);
    assert!(a_now.attempts.is_empty(), "{a_now:?}");
    assert_eq!(a_now.output, a_then.output);
    // Its approval priced only what was left to run: not a's 30.
    let estimate = |run: switchyard_proto::approval::v1::Run| {
        run.cost_estimate
            .and_then(|e| e.estimated_cost)
            .map_or(-1, |m| m.micro_usd)
    };
    assert!(estimate(run_of(&s, &first.run_id).await) >= 30);
    assert_eq!(estimate(run_of(&s, &new.run_id).await), 0);
    assert_eq!(task(&done.tasks, "b").stdout, b"now there\n");
    assert_eq!(task(&done.tasks, "c").attempts.len(), 1);
    let started = events_of(&mut alice, &new_id, ATTEMPT_STARTED).await;
    assert_eq!(started.len(), 2, "b and c started, a never: {started:?}");
    let submitted = events_of(&mut alice, &new_id, "job.submitted").await;
    assert_eq!(submitted[0]["rerun_of"], "flaky", "{submitted:?}");
    assert_eq!(submitted[0]["reused"], serde_json::json!(["a"]));
    // Its story says where it came from and what it kept.
    let story = explain(&mut alice, &new_id).await;
    story_says(
        &story,
        "It resumes job flaky, keeping 1 step that succeeded there (a).",
    );
    story_says(
        &story,
        "Step a kept from job flaky: its output is that job's, and it did not run again.",
    );

    // Nothing is left to resume of a completed job; afresh, with a new
    // input, every task runs.
    let e = rerun(&mut alice, &new_id, true, None).await.unwrap_err();
    assert_eq!(
        switchyard_kit::error::ApiError::from(e).known_reason(),
        Some(switchyard_core::Reason::NothingToResume)
    );
    let e = rerun(
        &mut alice,
        "flaky",
        true,
        Some(serde_json::json!({"topic": "second"})),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let fresh = rerun(
        &mut alice,
        &new_id,
        false,
        Some(serde_json::json!({"topic": "second"})),
    )
    .await
    .unwrap();
    assert!(fresh.reused_tasks.is_empty());
    let fresh = fresh.job.unwrap();
    let fresh_id = id(&fresh);
    assert_eq!(
        fresh
            .spec
            .as_ref()
            .unwrap()
            .input
            .as_ref()
            .map(switchyard_kit::json::struct_to_json),
        Some(serde_json::json!({"topic": "second"}))
    );
    approve(&s, &fresh.run_id).await;
    let again = finish(&mut alice, &fresh_id).await;
    assert_eq!(again.state(), JobState::Completed, "{again:?}");
    assert_eq!(task(&again.tasks, "a").attempts.len(), 1);
    assert!(estimate(run_of(&s, &fresh.run_id).await) >= 30);

    // Only someone who may read the job may run it again: another
    // submitter, another tenant's submitter and an agent key (it reads
    // only its own jobs) find nothing; another tenant's admin (no
    // job.submit) is refused.
    let [carol, mallory, robot] = outsiders(&s).await;
    let trent = tenant_key(
        &s,
        "tenant-b",
        "trent",
        &["submitter"],
        switchyard_proto::auth::v1::PrincipalKind::Human,
    )
    .await;
    for (who, token, code) in [
        ("carol", carol, tonic::Code::NotFound),
        ("trent", trent, tonic::Code::NotFound),
        ("mallory", mallory, tonic::Code::PermissionDenied),
        ("robot", robot, tonic::Code::NotFound),
    ] {
        let mut c = JobServiceClient::new(s.channel_with(&token).await.unwrap());
        let e = rerun(&mut c, "flaky", true, None).await.unwrap_err();
        assert_eq!(e.code(), code, "{who}: {e:?}");
    }
    stop_agent.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}

switchyard_testkit::on_both_backends!(
    sled, postgres;
    a_resumed_job_keeps_what_succeeded_runs_the_rest_and_is_approved_again,
);
