//! The executor end to end over gRPC, against the whole stack in one
//! process: every seed format, validation texts, DAG order and parallelism,
//! templates, retries, fallbacks, fail-fast, timeouts, cancellation, approval
//! gating, budget refusal and WatchJob resume.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::Duration;

use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    GetJobRequest, GetResultRequest, GetResultResponse, Job, JobState, SubmitJobRequest, TaskState,
    WatchJobRequest,
};
use switchyard_testkit::Stack;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

type Jobs = JobServiceClient<Channel>;

async fn stack() -> (Stack, Jobs) {
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.commands.push("sh".into());
        c.executor.kill_grace_ms = 300;
        c.executor.approval_poll_ms = 20;
    })
    .await
    .unwrap();
    let c = JobServiceClient::new(s.channel().await.unwrap());
    (s, c)
}

async fn submit(c: &mut Jobs, doc: &str) -> Result<Job, tonic::Status> {
    c.submit_job(SubmitJobRequest {
        document: doc.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().job.unwrap())
}

fn id(j: &Job) -> String {
    j.spec.as_ref().unwrap().job_id.clone()
}

/// Waits (bounded) until the job is in a final state; returns its result.
async fn finish(c: &mut Jobs, job_id: &str) -> GetResultResponse {
    for _ in 0..400 {
        let j = c
            .get_job(GetJobRequest {
                job_id: job_id.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        let s = JobState::try_from(j.state).unwrap();
        if matches!(
            s,
            JobState::Completed | JobState::Cancelled | JobState::Discarded | JobState::Retryable
        ) {
            return c
                .get_result(GetResultRequest {
                    job_id: job_id.into(),
                })
                .await
                .unwrap()
                .into_inner();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("job {job_id} did not finish in 10 s");
}

fn stdout(r: &GetResultResponse, task: &str) -> String {
    let t = r.tasks.iter().find(|t| t.task_id == task).unwrap();
    String::from_utf8_lossy(&t.stdout).into_owned()
}

fn state_of(r: &GetResultResponse, task: &str) -> TaskState {
    TaskState::try_from(r.tasks.iter().find(|t| t.task_id == task).unwrap().state).unwrap()
}

#[tokio::test]
async fn the_seed_001_envelope_runs_as_a_piped_chain() {
    let (s, mut c) = stack().await;
    let doc = r#"{
      "job_id": "job-abc123", "plan_id": "plan-log-analysis",
      "plan_description": "Extract errors from logs, count by severity",
      "tasks": [
        {"task_number": 1, "command": "grep", "args": ["-i", "error", "app.log"], "timeout_secs": 60},
        {"task_number": 2, "command": "sort", "args": [], "input_from_task": 1, "timeout_secs": 30},
        {"task_number": 3, "command": "uniq", "args": ["-c"], "input_from_task": 2, "timeout_secs": 30}
      ]}"#;
    let job = c
        .submit_job(SubmitJobRequest {
            document: doc.into(),
            files: [(
                "app.log".to_owned(),
                b"ERROR disk\ninfo ok\nerror net\nERROR disk\n".to_vec(),
            )]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(id(&job), "job-abc123");
    let r = finish(&mut c, "job-abc123").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(
        stdout(&r, "task_3"),
        "      2 ERROR disk\n      1 error net\n"
    );
    s.stop().await.unwrap();
}
