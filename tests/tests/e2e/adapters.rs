//! Seed 004's adapter contract end to end: approved runs go to an outside
//! OJS server (another Switchyard's OJS door — the HTTP binding the public
//! OJS conformance suite checks) and come back with its result as an
//! artifact; cancel reaches it; a refused submission and a failed job map to
//! their codes. The `switchyard` adapter's four operations work on a real
//! job of the executor.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_api::ExecutorClient;
use switchyard_approval::adapter::{Adapter, State, Switchyard};
use switchyard_core::Reason;
use switchyard_proto::approval::v1::{
    ApproveRequest, CancelRequest, GetRunArtifactRequest, GetRunRequest, ListRunArtifactsRequest,
    ProposeRequest, Run, RunStatus,
};
use switchyard_testkit::Stack;

use crate::common::approvals_as;

/// An AgentRunSpec naming `adapter`.
fn run_for(adapter: &str) -> Run {
    Run {
        schema_version: "agent_run_spec/v1".into(),
        target: Some(switchyard_proto::approval::v1::Target {
            org: "phys-sims".into(),
            repo: "pm-bot".into(),
            work_item_ids: vec!["feat:contracts".into()],
        }),
        intent: "Draft docs/contracts pages".into(),
        context_pack: Some(switchyard_proto::approval::v1::ContextPack {
            pack_id: "cp_0009".into(),
            hash: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
            version: "context_pack/v1".into(),
            inputs: vec!["feat:contracts".into()],
        }),
        model: "gpt-5".into(),
        max_tokens: 12_000,
        tools_allowed: vec!["filesystem_read".into()],
        outputs_allowed: vec!["propose_changeset_bundle".into()],
        adapter: adapter.into(),
        ..Default::default()
    }
}

/// Proposes `run` as alice and has bob approve it; its id.
async fn approved(s: &Stack, run: Run) -> String {
    let id = approvals_as(s, "alice")
        .await
        .propose(ProposeRequest {
            run: Some(run),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .run_id;
    approvals_as(s, "bob")
        .await
        .approve(ApproveRequest {
            run_id: id.clone(),
            comment: "ok".into(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap();
    id
}

async fn get_run(s: &Stack, id: &str) -> Run {
    approvals_as(s, "bob")
        .await
        .get_run(GetRunRequest { run_id: id.into() })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
}

/// Waits (bounded) until `f` holds for the run.
async fn run_until(s: &Stack, id: &str, what: &str, f: impl Fn(&Run) -> bool) -> Run {
    for _ in 0..400 {
        let r = get_run(s, id).await;
        if f(&r) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "run {id}: {what} did not happen within 10 s: {:?}",
        get_run(s, id).await
    );
}

/// An HTTP call to the outside OJS server as `token`.
async fn ojs(s: &Stack, method: &str, path: &str, token: &str, body: Value) -> (u16, Value) {
    switchyard_kit::tls::install_crypto();
    let url = format!("http://{}{path}", s.http.unwrap());
    let c = reqwest::Client::new();
    let req = match method {
        "GET" => c.get(url),
        "DELETE" => c.delete(url),
        _ => c.post(url).body(body.to_string()),
    };
    let resp = req
        .bearer_auth(token)
        .header("content-type", "application/openjobspec+json")
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap_or(Value::Null))
}

/// The outside OJS server, its client key (`submitter`), and the approval
/// side whose `ojs` adapter points at it with that key (or, when `valid` is
/// false, a key the server does not know).
async fn two_stacks(valid: bool) -> (Stack, Stack, tempfile::TempDir) {
    let outside = Stack::start().await.unwrap();
    let key = outside
        .key(
            "ojs-client",
            &["submitter", "viewer"],
            switchyard_proto::auth::v1::PrincipalKind::Human,
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("ojs-token");
    let token = if valid { key } else { "sy_not-a-key".into() };
    std::fs::write(&token_file, token).unwrap();
    let url = format!("http://{}", outside.http.unwrap());
    let ours = Stack::start_with(switchyard_cli::ServiceKind::ALL, move |c| {
        c.approval.adapters.poll_ms = 50;
        c.approval.adapters.ojs = Some(switchyard_approval::adapter::OjsConfig {
            url,
            token_file: Some(token_file),
            queue: "agent-runs".into(),
            ..Default::default()
        });
    })
    .await
    .unwrap();
    (outside, ours, dir)
}

/// Waits until the run was handed to the OJS server; its job id there.
async fn handed_over(s: &Stack, id: &str) -> String {
    let r = run_until(s, id, "submitted", |r| {
        r.status == RunStatus::Running as i32 && !r.job_id.is_empty()
    })
    .await;
    assert_eq!(r.claimed_by, "adapter-ojs");
    r.job_id
}

/// A worker of the outside server takes the next job of `agent-runs`.
async fn take(outside: &Stack, job_id: &str) -> Value {
    let agents = outside.token("agents").unwrap();
    let body = json!({"queues": ["agent-runs"], "worker_id": "w1", "wait_ms": 5000});
    let (code, v) = ojs(outside, "POST", "/ojs/v1/workers/fetch", &agents, body).await;
    assert_eq!(code, 200, "{v}");
    let job = v["jobs"][0].clone();
    assert_eq!(job["id"], job_id, "{v}");
    job
}

#[tokio::test]
async fn an_ojs_run_is_submitted_polled_and_completed_with_the_result_as_an_artifact() {
    let (outside, ours, _dir) = two_stacks(true).await;
    let id = approved(&ours, run_for("ojs")).await;
    let job_id = handed_over(&ours, &id).await;
    // The outside server holds the job: the run's prompt bundle as its argument.
    let reader = outside.token("tester").unwrap();
    let (code, there) = ojs(
        &outside,
        "GET",
        &format!("/ojs/v1/jobs/{job_id}"),
        &reader,
        Value::Null,
    )
    .await;
    assert_eq!(code, 200, "{there}");
    assert_eq!(there["job"]["type"], "agent_run");
    assert_eq!(there["job"]["queue"], "agent-runs");
    assert_eq!(there["job"]["args"][0]["run_id"], id.as_str());
    let job = take(&outside, &job_id).await;
    let result = json!({"changes": [{"path": "docs/contracts.md", "diff": "+contracts"}], "note": "ünïcode"});
    let agents = outside.token("agents").unwrap();
    // An ack may carry artifacts over HTTP too (a Switchyard extension):
    // a kind it does not know is a field error, and the lease stays held.
    let bad = json!({"job_id": job_id, "attempt": job["attempt"], "worker_id": "w1", "result": result,
        "artifacts": [{"name": "log.txt", "kind": "poem", "content_base64": "d29ya2VyIGxvZw=="}]});
    let (code, v) = ojs(&outside, "POST", "/ojs/v1/workers/ack", &agents, bad).await;
    assert_eq!(code, 400, "{v}");
    let ack = json!({"job_id": job_id, "attempt": job["attempt"], "worker_id": "w1", "result": result,
        "artifacts": [{"name": "log.txt", "kind": "file", "media_type": "text/plain", "content_base64": "d29ya2VyIGxvZw=="}]});
    let (code, v) = ojs(&outside, "POST", "/ojs/v1/workers/ack", &agents, ack).await;
    assert_eq!(code, 200, "{v}");
    let mut there = switchyard_proto::executor::v1::job_service_client::JobServiceClient::new(
        outside.channel_as("tester").await.unwrap(),
    );
    let listed = crate::common::artifacts(&mut there, &job_id).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let got = there
        .get_artifact(switchyard_proto::executor::v1::GetArtifactRequest {
            job_id: job_id.clone(),
            artifact: listed[0].path.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.content, b"worker log");
    let done = run_until(&ours, &id, "completed", |r| {
        r.status == RunStatus::Completed as i32
    })
    .await;
    let res = done.result.unwrap();
    assert_eq!(res.artifact_paths, ["result.json"]);
    let mut approvals = approvals_as(&ours, "alice").await;
    let listed = approvals
        .list_run_artifacts(ListRunArtifactsRequest { run_id: id.clone() })
        .await
        .unwrap()
        .into_inner()
        .artifacts;
    assert_eq!(listed.len(), 1);
    let got = approvals
        .get_run_artifact(GetRunArtifactRequest {
            run_id: id.clone(),
            path: "result.json".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serde_json::from_slice::<Value>(&got.content).unwrap(),
        result
    );
    ours.stop().await.unwrap();
    outside.stop().await.unwrap();
}

#[tokio::test]
async fn cancelling_an_ojs_run_cancels_its_job_there_and_a_failed_job_fails_the_run_with_its_code()
{
    let (outside, ours, _dir) = two_stacks(true).await;
    let id = approved(&ours, run_for("ojs")).await;
    let job_id = handed_over(&ours, &id).await;
    approvals_as(&ours, "alice")
        .await
        .cancel(CancelRequest {
            run_id: id.clone(),
            comment: "not needed".into(),
        })
        .await
        .unwrap();
    let r = get_run(&ours, &id).await;
    assert_eq!(
        (r.status, r.adapter_state.as_str()),
        (RunStatus::Cancelled as i32, "cancelled"),
        "the adapter's cancel: reason {:?}, last error {:?}",
        r.reason_code,
        r.last_error
    );
    let reader = outside.token("tester").unwrap();
    let (_, there) = ojs(
        &outside,
        "GET",
        &format!("/ojs/v1/jobs/{job_id}"),
        &reader,
        Value::Null,
    )
    .await;
    assert_eq!(there["job"]["state"], "cancelled", "{there}");
    // A job that fails there fails the run with ADAPTER_JOB_FAILED.
    let id = approved(&ours, run_for("ojs")).await;
    let job_id = handed_over(&ours, &id).await;
    let job = take(&outside, &job_id).await;
    let agents = outside.token("agents").unwrap();
    let nack = json!({"job_id": job_id, "attempt": job["attempt"], "worker_id": "w1",
        "error": {"code": "BROKEN", "message": "the repo is gone", "retryable": false}});
    let (code, v) = ojs(&outside, "POST", "/ojs/v1/workers/nack", &agents, nack).await;
    assert_eq!(code, 200, "{v}");
    let failed = run_until(&ours, &id, "failed", |r| {
        r.status == RunStatus::Failed as i32
    })
    .await;
    assert_eq!(failed.reason_code, "ADAPTER_JOB_FAILED", "{failed:?}");
    ours.stop().await.unwrap();
    outside.stop().await.unwrap();
}

#[tokio::test]
async fn a_submission_the_ojs_server_refuses_fails_the_run_with_adapter_submission_rejected() {
    let (outside, ours, _dir) = two_stacks(false).await;
    let id = approved(&ours, run_for("ojs")).await;
    let failed = run_until(&ours, &id, "failed", |r| {
        r.status == RunStatus::Failed as i32
    })
    .await;
    assert_eq!(
        failed.reason_code, "ADAPTER_SUBMISSION_REJECTED",
        "{failed:?}"
    );
    assert!(failed.last_error.contains("401"), "{}", failed.last_error);
    ours.stop().await.unwrap();
    outside.stop().await.unwrap();
}

#[tokio::test]
async fn the_switchyard_adapter_reads_fetches_and_cancels_a_real_job() {
    let s = Stack::start().await.unwrap();
    let executor = ExecutorClient::remote(s.channel_as("tester").await.unwrap(), 4 << 20);
    let adapter = Switchyard::default();
    *adapter.executor.write().unwrap() = Some(executor);
    // A job that waits for a person, so it can be cancelled mid-way.
    let mut jobs = switchyard_proto::executor::v1::job_service_client::JobServiceClient::new(
        s.channel_as("tester").await.unwrap(),
    );
    let doc = r#"{"job_id": "sy-1", "approval": {"requires_approval": true},
        "tasks": [{"id": "a", "agent": {"capability": "builtin.echo", "input": {"text": "hi"}}}]}"#;
    let job = crate::common::submit(&mut jobs, doc).await.unwrap();
    let run = get_run(&s, &job.run_id).await;
    assert_eq!(
        (run.adapter.as_str(), run.job_id.as_str()),
        ("switchyard", "sy-1")
    );
    let submitted = adapter.submit(&run).await.unwrap();
    assert_eq!(
        (submitted.job_id.as_str(), submitted.state.as_str()),
        ("sy-1", "pending")
    );
    let polled = adapter.poll(&run).await.unwrap();
    assert_eq!(
        (polled.state, polled.detail.as_str()),
        (State::Running, "pending")
    );
    assert!(adapter.fetch_artifacts(&run).await.unwrap().is_empty());
    let cancelled = adapter.cancel(&run).await.unwrap();
    assert_eq!(
        (cancelled.state, cancelled.reason_code),
        (State::Cancelled, Some(Reason::AdapterJobCancelled))
    );
    let mut gone = run.clone();
    gone.job_id = "no-such-job".into();
    assert_eq!(
        adapter.poll(&gone).await.unwrap_err().reason,
        Reason::AdapterJobNotFound
    );
    s.stop().await.unwrap();
}
