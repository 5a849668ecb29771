//! Per-call approval of risky tools, and artifacts, end to end against the
//! scripted model server: a gated call waits as its own approval run with
//! no budget held, runs only once a person other than the submitter
//! approves it, is refused to the model when rejected or undecided, and
//! survives a restart while it waits; a run's artifacts are kept only when
//! its outputs_allowed allows their kind.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use serde_json::{Value, json};
use switchyard_llm::scripted::{Reply, Script};
use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::approval::v1::{
    ApproveRequest, ListRunsRequest, RejectRequest, Run, RunStatus,
};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{CancelJobRequest, GetArtifactRequest, JobState, TaskState};
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_testkit::Stack;

use crate::common::{
    self, Jobs, approvals_as, awaiting_call, budget, finish, id, proposed_run, run_of, submit,
    until_event,
};
use crate::console::as_session;
use crate::llm::{Provider, env, events, provide, task};

/// A native job with one LLM task on `model` offering `deploy`, keeping its
/// JSON answer as `artifact` (a kind) and allowing `outputs`.
fn gated_job(job_id: &str, model: &str, gated: bool, artifact: &str, outputs: &[&str]) -> String {
    json!({
        "job_id": job_id,
        "approval": {"outputs_allowed": outputs},
        "tasks": [{"id": "fix", "llm": {
            "model": model, "prompt": "fix the docs", "max_tokens": 50, "output_format": "json",
            "artifact": {"kind": artifact, "name": "bundle.json"},
            "tools": [{"name": "deploy", "requires_approval": gated}]
        }}]
    })
    .to_string()
}

/// Marks registered tool `name` risky in the registry: every call of it,
/// in any job, waits for a person.
async fn mark_risky(s: &Stack, name: &str) {
    use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
    use switchyard_proto::registry::v1::{ListToolsRequest, RegisterToolRequest};
    let mut reg = RegistryServiceClient::new(s.channel().await.unwrap());
    let mut tool = reg
        .list_tools(ListToolsRequest {
            names: vec![name.into()],
        })
        .await
        .unwrap()
        .into_inner()
        .tools
        .remove(0);
    tool.requires_approval = true;
    reg.register_tool(RegisterToolRequest { tool: Some(tool) })
        .await
        .unwrap();
}

/// The per-call runs waiting for a decision, as `who` sees them.
pub(crate) async fn pending_calls(s: &Stack, who: &str) -> Vec<Run> {
    approvals_as(s, who)
        .await
        .list_runs(ListRunsRequest {
            statuses: vec![RunStatus::Proposed as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .runs
        .into_iter()
        .filter(|r| r.tool_call.is_some())
        .collect()
}

/// Waits (bounded) until the run reaches `status`.
async fn run_reaches(s: &Stack, run_id: &str, status: RunStatus) -> Run {
    for _ in 0..400 {
        let r = run_of(s, run_id).await;
        if r.status == status as i32 {
            return r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("run {run_id} did not become {status:?} in 10 s");
}

async fn task_state(c: &mut Jobs, job_id: &str, task_id: &str) -> TaskState {
    let j = common::job(c, job_id).await;
    let t = j.tasks.iter().find(|t| t.task_id == task_id).unwrap();
    TaskState::try_from(t.state).unwrap()
}

/// What the model was told about its call of `deploy` on its second turn.
pub(crate) fn told(script: &Script) -> String {
    let second = &script.received()[1].body["messages"];
    second
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .unwrap()
}

#[tokio::test]
async fn a_gated_call_waits_holding_no_budget_until_bob_approves_and_carol_downloads_the_bundle() {
    let e = env(true, |_| {}).await;
    let provider = Provider::default();
    let _stop = provide(&e.stack, provider.clone(), &["deploy"]).await;
    let bundle = json!({"changes": [{"path": "README.md", "diff": "+hello"}]});
    e.script.for_model(
        "m-gate",
        vec![
            Reply::tools_saying(
                "deploying the docs fix to check it renders",
                &[("deploy", json!({"q": "prod"}))],
                40,
                10,
            ),
            Reply::text(&bundle.to_string(), 80, 20),
        ],
    );
    // Carol may submit and approve: separation of duties is what stops
    // her approving her own job's call.
    let carol_key = e
        .stack
        .key(
            "carol",
            &["submitter", "approver"],
            switchyard_proto::auth::v1::PrincipalKind::Human,
        )
        .await
        .unwrap();
    let mut carol = JobServiceClient::new(e.stack.channel_with(&carol_key).await.unwrap());
    let doc = gated_job(
        "gated-ok",
        "m-gate",
        true,
        "changeset_bundle",
        &["propose_changeset_bundle"],
    );
    let job = submit(&mut carol, &doc).await.unwrap();
    let waiting = awaiting_call(&mut carol, &e.stack, "gated-ok").await;
    assert_eq!(waiting["tool"], "deploy");
    assert_eq!(waiting["arguments"], r#"{"q":"prod"}"#);
    assert_eq!(
        waiting["reason"],
        "deploying the docs fix to check it renders"
    );
    assert_eq!(
        task_state(&mut carol, "gated-ok", "fix").await,
        TaskState::AwaitingApproval
    );
    assert!(
        provider.calls().is_empty(),
        "the tool does not run before approval"
    );
    // Waiting holds no budget: the first model call was committed, nothing is reserved.
    let mut ledger = LedgerServiceClient::new(e.stack.channel().await.unwrap());
    let job_now = common::job(&mut carol, "gated-ok").await;
    let b = budget(&mut ledger, &job_now.budget_id).await;
    assert_eq!((b.tokens_reserved, b.tokens_spent), (0, 50), "{b:?}");
    // The call is in bob's list with its arguments and the model's reason.
    let calls = pending_calls(&e.stack, "bob").await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = calls[0].clone();
    let tc = call.tool_call.clone().unwrap();
    assert_eq!(
        (tc.job_id.as_str(), tc.task_id.as_str(), tc.tool.as_str()),
        ("gated-ok", "fix", "deploy")
    );
    assert_eq!(tc.reason, "deploying the docs fix to check it renders");
    assert_eq!(tc.job_run_id, job.run_id);
    assert_eq!(call.created_by, "carol");
    assert_eq!(call.run_id, waiting["run_id"]);
    // Carol submitted the job: she cannot approve its call.
    let own = ApprovalServiceClient::new(e.stack.channel_with(&carol_key).await.unwrap())
        .approve(ApproveRequest {
            run_id: call.run_id.clone(),
            comment: "mine".into(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap_err();
    assert_eq!(
        switchyard_kit::error::ApiError::from(own.clone())
            .reason
            .as_deref(),
        Some("SEPARATION_OF_DUTIES"),
        "{own:?}"
    );
    assert!(provider.calls().is_empty());
    approvals_as(&e.stack, "bob")
        .await
        .approve(ApproveRequest {
            run_id: call.run_id.clone(),
            comment: "go".into(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap();
    let r = finish(&mut carol, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(provider.calls(), ["deploy"], "the approved call ran once");
    let t = task(&r, "fix");
    assert_eq!(t.tool_results[0].name, "deploy");
    assert_eq!(t.tool_results[0].reason, "");
    let evs = events(&mut carol, "gated-ok").await;
    let decided = evs
        .iter()
        .find(|(k, _)| k == "task.approval_decided")
        .unwrap();
    assert_eq!(
        (decided.1["decision"].as_str(), decided.1["by"].as_str()),
        (Some("approved"), Some("bob"))
    );
    let states: Vec<&str> = evs
        .iter()
        .filter(|(k, _)| k == "task.state")
        .map(|(_, d)| d["to"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        [
            "ready",
            "running",
            "awaiting_approval",
            "running",
            "succeeded"
        ]
    );
    // The answer is a changeset bundle, carol's to download byte for byte.
    let listed = crate::common::artifacts(&mut carol, "gated-ok").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].path, "fix/bundle.json");
    assert_eq!(
        listed[0].kind,
        switchyard_proto::common::v1::ArtifactKind::ChangesetBundle as i32
    );
    let got = carol
        .get_artifact(GetArtifactRequest {
            job_id: "gated-ok".into(),
            artifact: "fix/bundle.json".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serde_json::from_slice::<Value>(&got.content).unwrap(),
        bundle
    );
    assert_eq!(got.artifact.unwrap().artifact_id, listed[0].artifact_id);
    // The job's run is bound to the bundle; the call's run completed.
    let run = run_reaches(&e.stack, &job.run_id, RunStatus::Completed).await;
    let result = run.result.unwrap();
    assert_eq!(result.changeset_bundle_id, listed[0].artifact_id);
    assert_eq!(result.artifact_paths, ["fix/bundle.json"]);
    // The job's run serves the bundle too (the switchyard adapter fetches
    // it from the executor), byte for byte.
    let through_run = approvals_as(&e.stack, "bob")
        .await
        .get_run_artifact(switchyard_proto::approval::v1::GetRunArtifactRequest {
            run_id: job.run_id.clone(),
            path: "fix/bundle.json".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(through_run.content, got.content);
    run_reaches(&e.stack, &call.run_id, RunStatus::Completed).await;
    // The story says the call waited for a person and who let it run.
    let x = common::explain(&mut carol, "gated-ok").await;
    common::story_says(&x, "the call deploy({\"q\":\"prod\"}) waits for a person");
    common::story_says(&x, "the call of deploy was approved by bob");
    common::story_says(&x, "tool deploy ran ok");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_rejected_call_does_not_run_and_the_model_is_told_why_and_goes_on() {
    let mut e = env(true, |c| {
        c.executor.tool_approval.tools = vec!["dep*".into()]
    })
    .await;
    let provider = Provider::default();
    let _stop = provide(&e.stack, provider.clone(), &["deploy"]).await;
    e.script.for_model(
        "m-gate-reject",
        vec![
            Reply::tools(&[("deploy", json!({"q": "prod"}))], 40, 10),
            Reply::text(r#"{"changes": []}"#, 80, 20),
        ],
    );
    // Not marked in the job: the executor's policy pattern gates it.
    let doc = gated_job("gated-no", "m-gate-reject", false, "file", &[]);
    let job = submit(&mut e.jobs, &doc).await.unwrap();
    let waiting = awaiting_call(&mut e.jobs, &e.stack, "gated-no").await;
    approvals_as(&e.stack, "bob")
        .await
        .reject(RejectRequest {
            run_id: waiting["run_id"].as_str().unwrap().into(),
            comment: "not on a Friday".into(),
        })
        .await
        .unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert!(provider.calls().is_empty(), "a rejected call never runs");
    let t = task(&r, "fix");
    assert_eq!(t.tool_results[0].reason, "TOOL_CALL_REJECTED");
    let said = told(&e.script);
    assert!(
        said.contains("TOOL_CALL_REJECTED")
            && said.contains("not on a Friday")
            && said.contains("bob"),
        "{said}"
    );
    let evs = events(&mut e.jobs, "gated-no").await;
    let decided = evs
        .iter()
        .find(|(k, _)| k == "task.approval_decided")
        .unwrap();
    assert_eq!(decided.1["decision"], "rejected");
    assert_eq!(decided.1["comment"], "not on a Friday");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn an_undecided_call_times_out_as_a_rejection_and_its_run_is_withdrawn() {
    let mut e = env(true, |c| c.executor.tool_approval.timeout_secs = 1).await;
    let provider = Provider::default();
    let _stop = provide(&e.stack, provider.clone(), &["deploy"]).await;
    e.script.for_model(
        "m-gate-timeout",
        vec![
            Reply::tools(&[("deploy", json!({"q": "prod"}))], 40, 10),
            Reply::text(r#"{"changes": []}"#, 80, 20),
        ],
    );
    let doc = gated_job("gated-late", "m-gate-timeout", true, "file", &[]);
    let job = submit(&mut e.jobs, &doc).await.unwrap();
    let waiting = awaiting_call(&mut e.jobs, &e.stack, "gated-late").await;
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(
        task(&r, "fix").tool_results[0].reason,
        "TOOL_APPROVAL_TIMEOUT"
    );
    assert!(told(&e.script).contains("TOOL_APPROVAL_TIMEOUT"));
    assert!(provider.calls().is_empty());
    run_reaches(
        &e.stack,
        waiting["run_id"].as_str().unwrap(),
        RunStatus::Cancelled,
    )
    .await;
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn cancelling_a_job_withdraws_its_waiting_call() {
    let mut e = env(true, |_| {}).await;
    let provider = Provider::default();
    let _stop = provide(&e.stack, provider.clone(), &["deploy"]).await;
    e.script.for_model(
        "m-gate-cancel",
        vec![Reply::tools(&[("deploy", json!({"q": "prod"}))], 40, 10)],
    );
    // Not marked in the job: the registry marks the tool itself.
    mark_risky(&e.stack, "deploy").await;
    let doc = gated_job("gated-cancel", "m-gate-cancel", false, "file", &[]);
    let job = submit(&mut e.jobs, &doc).await.unwrap();
    let waiting = awaiting_call(&mut e.jobs, &e.stack, "gated-cancel").await;
    e.jobs
        .cancel_job(CancelJobRequest {
            job_id: "gated-cancel".into(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Cancelled as i32, "{r:?}");
    run_reaches(
        &e.stack,
        waiting["run_id"].as_str().unwrap(),
        RunStatus::Cancelled,
    )
    .await;
    assert!(pending_calls(&e.stack, "bob").await.is_empty());
    assert!(provider.calls().is_empty());
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_draft_pr_without_propose_pr_in_outputs_allowed_is_refused_and_nothing_is_kept() {
    let mut e = env(true, |_| {}).await;
    e.script.for_model(
        "m-pr",
        vec![Reply::text(
            r#"{"title": "Fix docs", "body": "..."}"#,
            40,
            10,
        )],
    );
    let doc = json!({
        "job_id": "pr-refused",
        "approval": {"outputs_allowed": ["propose_changeset_bundle"]},
        "tasks": [{"id": "pr", "llm": {
            "model": "m-pr", "prompt": "open a PR", "max_tokens": 50, "output_format": "json",
            "artifact": {"kind": "draft_pr"}
        }}]
    })
    .to_string();
    let job = submit(&mut e.jobs, &doc).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    let t = task(&r, "pr");
    assert_eq!(t.reason, "ARTIFACT_KIND_NOT_ALLOWED", "{t:?}");
    assert!(t.error.contains("propose_pr"), "{}", t.error);
    assert_eq!(e.script.count(), 1, "a refusal is not retried");
    let evs = events(&mut e.jobs, "pr-refused").await;
    let refused = evs.iter().find(|(k, _)| k == "artifact.refused").unwrap();
    assert_eq!(
        (refused.1["kind"].as_str(), refused.1["reason"].as_str()),
        (Some("draft_pr"), Some("ARTIFACT_KIND_NOT_ALLOWED"))
    );
    let listed = crate::common::artifacts(&mut e.jobs, "pr-refused").await;
    assert!(listed.is_empty(), "{listed:?}");
    let missing = e
        .jobs
        .get_artifact(GetArtifactRequest {
            job_id: "pr-refused".into(),
            artifact: "pr/pr.json".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_restart_while_a_call_awaits_keeps_it_waiting_and_approval_resumes_the_task_once() {
    let script = Script::new();
    let server = script.serve().await;
    let url = server.base_url();
    let configure = |c: &mut switchyard_cli::Config, url: &str| {
        c.llm = crate::llm::llm_config(url);
        c.executor.approval_poll_ms = 20;
        c.approval.policies.push(switchyard_approval::Policy {
            name: "up-to-10-dollars".into(),
            max_estimated_cost_micro_usd: Some(10_000_000),
            ..Default::default()
        });
    };
    let stack = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| configure(c, &url))
        .await
        .unwrap();
    let provider = Provider::default();
    let stop_provider = provide(&stack, provider.clone(), &["deploy"]).await;
    script.for_model(
        "m-gate-restart",
        vec![
            Reply::tools(&[("deploy", json!({"q": "prod"}))], 40, 10),
            Reply::text(r#"{"changes": ["after the restart"]}"#, 80, 20),
        ],
    );
    let mut jobs = JobServiceClient::new(stack.channel_as("alice").await.unwrap());
    let doc = gated_job(
        "gated-restart",
        "m-gate-restart",
        true,
        "changeset_bundle",
        &["propose_changeset_bundle"],
    );
    let job = submit(&mut jobs, &doc).await.unwrap();
    let waiting = until_event(&mut jobs, "gated-restart", "task.awaiting_approval").await;
    let run_id = waiting["run_id"].as_str().unwrap().to_owned();
    // The tool's provider stays up across the restart (its registration
    // is kept by the registry).
    let dir = stack.stop().await.unwrap();
    let path = dir.path().to_path_buf();
    let stack = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        configure(c, &url);
        c.storage.data_dir = path;
    })
    .await
    .unwrap();
    let mut jobs = JobServiceClient::new(stack.channel_as("alice").await.unwrap());
    assert_eq!(
        task_state(&mut jobs, "gated-restart", "fix").await,
        TaskState::AwaitingApproval
    );
    // The resumed attempt proposes the same run again (idempotently).
    proposed_run(&stack, &run_id).await;
    let calls = pending_calls(&stack, "bob").await;
    assert_eq!(
        calls.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        [run_id.as_str()]
    );
    assert_eq!(
        script.count(),
        1,
        "the model is not asked again after the restart"
    );
    approvals_as(&stack, "bob")
        .await
        .approve(ApproveRequest {
            run_id,
            comment: "after restart".into(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap();
    let r = finish(&mut jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(
        provider.calls(),
        ["deploy"],
        "the call ran exactly once: {:?}",
        task(&r, "fix").tool_results
    );
    assert_eq!(script.count(), 2, "one model call before, one after");
    let t = task(&r, "fix");
    assert_eq!(t.attempts.len(), 1, "the same attempt went on");
    // Same idempotency keys: the budget counts each model call once.
    let mut ledger = LedgerServiceClient::new(stack.channel().await.unwrap());
    let budget_id = common::job(&mut jobs, "gated-restart").await.budget_id;
    let b = budget(&mut ledger, &budget_id).await;
    assert_eq!((b.tokens_spent, b.tokens_reserved), (150, 0), "{b:?}");
    let evs = events(&mut jobs, "gated-restart").await;
    assert_eq!(
        evs.iter()
            .filter(|(k, _)| k == "task.awaiting_approval")
            .count(),
        1
    );
    assert_eq!(
        evs.iter()
            .filter(|(k, _)| k == "task.approval_decided")
            .count(),
        1
    );
    stack.stop().await.unwrap();
    drop((dir, server, stop_provider));
}

#[tokio::test]
async fn a_person_cannot_propose_a_per_call_run_only_the_executor_does() {
    let e = env(true, |_| {}).await;
    let run = Run {
        schema_version: "agent_run_spec/v1".into(),
        target: Some(switchyard_proto::approval::v1::Target {
            org: "default".into(),
            work_item_ids: vec!["someone-elses-job".into()],
            ..Default::default()
        }),
        intent: "call tool deploy".into(),
        context_pack: Some(switchyard_proto::approval::v1::ContextPack {
            pack_id: "p".into(),
            hash: "sha256:0123456789abcdef".into(),
            version: "tool_call/v1".into(),
            inputs: vec!["t".into()],
        }),
        model: "none".into(),
        max_tokens: 1,
        tools_allowed: vec!["deploy".into()],
        outputs_allowed: vec!["tool_call".into()],
        tool_call: Some(switchyard_proto::approval::v1::ToolCall {
            job_id: "someone-elses-job".into(),
            tool: "deploy".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let err = approvals_as(&e.stack, "alice")
        .await
        .propose(switchyard_proto::approval::v1::ProposeRequest {
            run: Some(run),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("tool_call"), "{}", err.message());
    e.stack.stop().await.unwrap();
}

/// An SDK agent whose answer carries a draft PR description.
#[derive(Clone)]
struct Drafter;

#[tonic::async_trait]
impl switchyard_agent_sdk::Agent for Drafter {
    async fn invoke(
        &self,
        _req: switchyard_agent_sdk::Invocation,
        _progress: switchyard_agent_sdk::Progress,
    ) -> switchyard_proto::agent::v1::AgentResponse {
        let mut r = switchyard_agent_sdk::respond::success(String::from("drafted"), None);
        r.artifacts = vec![switchyard_proto::common::v1::NewArtifact {
            name: "pr.md".into(),
            kind: switchyard_proto::common::v1::ArtifactKind::DraftPr as i32,
            media_type: "text/markdown".into(),
            content: b"# Fix docs\n\nA draft for a person to open.\n".to_vec(),
        }];
        r
    }
}

#[tokio::test]
async fn an_agent_s_draft_pr_is_kept_only_where_propose_pr_is_allowed() {
    let e = env(false, |_| {}).await;
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let mut spec = switchyard_proto::registry::v1::AgentSpec {
        id: "drafter".into(),
        capabilities: vec![switchyard_proto::registry::v1::Capability {
            name: "docs.draft_pr".into(),
            ..Default::default()
        }],
        trust_score: 90,
        ..Default::default()
    };
    let opts = switchyard_agent_sdk::ServeOptions {
        registry_url: e.stack.url.clone(),
        credential: switchyard_kit::client::Credential::bearer(&e.stack.token("agents").unwrap())
            .ok(),
        ..Default::default()
    };
    let agent = tokio::spawn(async move {
        switchyard_agent_sdk::serve_until(Drafter, &mut spec, opts, shutdown).await
    });
    crate::common::wait_routed(&e.stack, "docs.draft_pr").await;
    let mut jobs = e.jobs.clone();
    let doc = |id: &str, outputs: &str| {
        format!(
            r#"{{"job_id":"{id}","approval":{{"outputs_allowed":[{outputs}]}},
            "tasks":[{{"id":"d","agent":{{"capability":"docs.draft_pr"}}}}]}}"#
        )
    };
    // Allowed (a free agent: the default policy approves the job): kept,
    // and the run's result names it (never published).
    let job = submit(&mut jobs, &doc("pr-ok", r#""propose_pr""#))
        .await
        .unwrap();
    let r = finish(&mut jobs, "pr-ok").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let listed = crate::common::artifacts(&mut jobs, "pr-ok").await;
    assert_eq!(listed[0].path, "d/pr.md");
    let run = run_reaches(&e.stack, &job.run_id, RunStatus::Completed).await;
    assert_eq!(
        run.result.unwrap().draft_pr_url,
        format!("artifact:{}", listed[0].artifact_id)
    );
    // Not allowed: the task fails for good and nothing is kept.
    submit(&mut jobs, &doc("pr-no", r#""propose_changeset_bundle""#))
        .await
        .unwrap();
    let r = finish(&mut jobs, "pr-no").await;
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    assert_eq!(task(&r, "d").reason, "ARTIFACT_KIND_NOT_ALLOWED");
    let listed = crate::common::artifacts(&mut jobs, "pr-no").await;
    assert!(listed.is_empty());
    trigger.fire();
    agent.await.unwrap().unwrap();
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn an_agent_offered_as_a_tool_above_the_price_rule_waits_for_a_person() {
    let mut e = env(true, |c| {
        c.executor.tool_approval.above_micro_usd = Some(100_000)
    })
    .await;
    let mut reg =
        switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient::new(
            e.stack.channel().await.unwrap(),
        );
    // $0.50 a call (above the $0.10 rule); its endpoint is never reached.
    crate::common::register(
        &mut reg,
        crate::common::agent("pricey", "text.pricey", 90, 500_000),
    )
    .await;
    crate::common::wait_routed(&e.stack, "text.pricey").await;
    e.script.for_model(
        "m-gate-price",
        vec![
            Reply::tools(&[("agent_pricey", json!({"task": "say hi"}))], 40, 10),
            Reply::text("done without it", 80, 5),
        ],
    );
    let doc = json!({"job_id": "gated-price", "tasks": [{"id": "t", "llm": {
        "model": "m-gate-price", "prompt": "ask the agent", "max_tokens": 50, "agents": ["text.pricey"]}}]})
    .to_string();
    let job = submit(&mut e.jobs, &doc).await.unwrap();
    if job.state == JobState::Pending as i32 {
        crate::common::approve(&e.stack, &job.run_id).await;
    }
    let waiting = awaiting_call(&mut e.jobs, &e.stack, "gated-price").await;
    assert_eq!(waiting["tool"], "agent_pricey");
    // The approver sees what the call costs.
    let call = run_of(&e.stack, waiting["run_id"].as_str().unwrap()).await;
    let cost = call
        .cost_estimate
        .and_then(|c| c.estimated_cost)
        .map(|m| m.micro_usd);
    assert_eq!(cost, Some(500_000));
    approvals_as(&e.stack, "bob")
        .await
        .reject(RejectRequest {
            run_id: waiting["run_id"].as_str().unwrap().into(),
            comment: "too expensive".into(),
        })
        .await
        .unwrap();
    let r = finish(&mut e.jobs, "gated-price").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(task(&r, "t").tool_results[0].reason, "TOOL_CALL_REJECTED");
    e.stack.stop().await.unwrap();
}

/// A job whose model may call `search` and `delete_repo`, both of which
/// need a person's approval, and `notes`, which does not.
fn two_tools_job(job_id: &str, model: &str) -> String {
    json!({
        "job_id": job_id,
        "tasks": [{"id": "fix", "llm": {
            "model": model, "prompt": "tidy the repos", "max_tokens": 50,
            "tools": [{"name": "search", "requires_approval": true},
                      {"name": "delete_repo", "requires_approval": true},
                      {"name": "notes"}]
        }}]
    })
    .to_string()
}

/// The scripted stack with `search`, `delete_repo` and `notes` served by a
/// recording provider.
async fn edit_env() -> (crate::llm::Env, Provider, switchyard_kit::shutdown::Trigger) {
    let e = env(true, |_| {}).await;
    let provider = Provider::default();
    let stop = provide(
        &e.stack,
        provider.clone(),
        &["search", "delete_repo", "notes"],
    )
    .await;
    (e, provider, stop)
}

fn edit(tool: &str, arguments: Value) -> Option<switchyard_proto::approval::v1::ToolCallEdit> {
    Some(switchyard_proto::approval::v1::ToolCallEdit {
        tool: tool.into(),
        arguments: arguments.to_string(),
        by: String::new(),
    })
}

/// The LangChain human-in-the-loop bypass, refused: an approver edits a
/// gated `search` into `delete_repo`. The edit is a new action: it meets
/// delete_repo's own rule — a decision of its own, which the editor may
/// not take — and nothing runs until then; rejected, nothing runs at all,
/// and the model is told what was changed and why it did not run.
#[tokio::test]
async fn editing_a_gated_call_into_another_gated_tool_needs_that_tools_own_decision() {
    let (mut e, provider, _stop) = edit_env().await;
    e.script.for_model(
        "m-edit-bypass",
        vec![
            Reply::tools(&[("search", json!({"q": "old repos"}))], 40, 10),
            Reply::text("done", 80, 20),
        ],
    );
    let job = submit(&mut e.jobs, &two_tools_job("edit-bypass", "m-edit-bypass"))
        .await
        .unwrap();
    let first = awaiting_call(&mut e.jobs, &e.stack, "edit-bypass").await;
    let first_run = first["run_id"].as_str().unwrap().to_owned();
    approvals_as(&e.stack, "bob")
        .await
        .approve(ApproveRequest {
            run_id: first_run.clone(),
            comment: "delete it instead".into(),
            edit: edit("delete_repo", json!({"repo": "prod"})),
            scope: None,
        })
        .await
        .unwrap();
    // A second run, for the edited call, made by bob's edit.
    let mut second = None;
    for _ in 0..400 {
        let calls = pending_calls(&e.stack, "bob").await;
        second = calls.into_iter().find(|r| r.run_id != first_run);
        if second.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let second = second.unwrap_or_else(|| {
        panic!(
            "no run for the edited call within 10 s; tools run: {:?}",
            provider.calls()
        )
    });
    let call = second.tool_call.clone().unwrap();
    assert_eq!(
        (call.tool.as_str(), call.edited_by.as_str()),
        ("delete_repo", "bob")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&call.arguments).unwrap(),
        json!({"repo": "prod"})
    );
    assert!(provider.calls().is_empty(), "nothing ran yet");
    // bob may not approve the call his own edit made.
    let own = approvals_as(&e.stack, "bob")
        .await
        .approve(ApproveRequest {
            run_id: second.run_id.clone(),
            comment: "mine".into(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap_err();
    assert_eq!(own.code(), tonic::Code::PermissionDenied, "{own:?}");
    assert!(
        own.message().contains("cannot approve"),
        "{}",
        own.message()
    );
    common::new_approver(&e.stack, "dave")
        .await
        .reject(RejectRequest {
            run_id: second.run_id.clone(),
            comment: "never delete prod".into(),
        })
        .await
        .unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert!(
        provider.calls().is_empty(),
        "neither search nor delete_repo ran"
    );
    let t = task(&r, "fix");
    assert_eq!(
        (
            t.tool_results[0].name.as_str(),
            t.tool_results[0].reason.as_str()
        ),
        ("delete_repo", "TOOL_CALL_REJECTED")
    );
    let said = told(&e.script);
    assert!(
        said.contains("an approver (bob) changed this call from search")
            && said.contains("never delete prod"),
        "{said}"
    );
    let evs = events(&mut e.jobs, "edit-bypass").await;
    let decided: Vec<&Value> = evs
        .iter()
        .filter(|(k, _)| k == "task.approval_decided")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(decided.len(), 2, "{decided:?}");
    assert_eq!(decided[0]["edited"], r#"delete_repo({"repo":"prod"})"#);
    assert_eq!(decided[1]["decision"], "rejected");
    e.stack.stop().await.unwrap();
}

/// Edits that need no further decision run as edited, and the model is
/// told; an edit naming a tool the task does not offer runs nothing; a
/// malformed edit, or one on a run that is not a tool call, is refused.
#[tokio::test]
async fn an_approvers_edit_runs_as_changed_within_the_tasks_tools_and_the_model_is_told() {
    let (mut e, provider, _stop) = edit_env().await;
    for (model, job_id) in [("m-edit-args", "edit-args"), ("m-edit-gone", "edit-gone")] {
        e.script.for_model(
            model,
            vec![
                Reply::tools(&[("search", json!({"q": "everything"}))], 40, 10),
                Reply::text("done", 80, 20),
            ],
        );
        submit(&mut e.jobs, &two_tools_job(job_id, model))
            .await
            .unwrap();
    }
    let bob = approvals_as(&e.stack, "bob").await;
    // Other arguments for the same tool: approved as edited, it runs once.
    let waiting = awaiting_call(&mut e.jobs, &e.stack, "edit-args").await;
    let run_id = waiting["run_id"].as_str().unwrap().to_owned();
    let bad = bob
        .clone()
        .approve(ApproveRequest {
            run_id: run_id.clone(),
            comment: String::new(),
            edit: Some(switchyard_proto::approval::v1::ToolCallEdit {
                tool: "search".into(),
                arguments: "[1, 2]".into(),
                by: String::new(),
            }),
            scope: None,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
    bob.clone()
        .approve(ApproveRequest {
            run_id: run_id.clone(),
            comment: "narrower".into(),
            edit: edit("", json!({"q": "public docs"})),
            scope: None,
        })
        .await
        .unwrap();
    let r = finish(&mut e.jobs, "edit-args").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(
        provider.calls_with_args(),
        vec![("search".to_owned(), json!({"q": "public docs"}))]
    );
    let t = task(&r, "fix");
    assert_eq!(t.tool_results[0].arguments, r#"{"q":"public docs"}"#);
    // The receipt binds the call as edited.
    let receipt = bob
        .clone()
        .get_receipt(switchyard_proto::approval::v1::GetReceiptRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let receipt: Value = serde_json::from_str(&receipt.receipt_json).unwrap();
    assert_eq!(
        receipt["receipt"]["scope"]["edit"],
        json!({"tool": "search", "arguments": r#"{"q":"public docs"}"#})
    );
    // And the policies that decided it, by the set's version.
    let decided = run_of(&e.stack, &run_id).await.policy.unwrap();
    assert_eq!(receipt["receipt"]["policy"]["version"], decided.version);
    assert_eq!(receipt["receipt"]["policy"]["effect"], "default");
    // A tool the task does not offer: nothing runs.
    let waiting = awaiting_call(&mut e.jobs, &e.stack, "edit-gone").await;
    bob.clone()
        .approve(ApproveRequest {
            run_id: waiting["run_id"].as_str().unwrap().into(),
            comment: String::new(),
            edit: edit("drop_tables", json!({})),
            scope: None,
        })
        .await
        .unwrap();
    let r = finish(&mut e.jobs, "edit-gone").await;
    let t = task(&r, "fix");
    assert_eq!(t.tool_results[0].reason, "AGENT_TOOL_NOT_FOUND", "{t:?}");
    assert!(
        t.tool_results[0]
            .error
            .contains("the approver's edit cannot run"),
        "{}",
        t.tool_results[0].error
    );
    assert_eq!(provider.calls().len(), 1, "only the edited search ran");
    // An edit on a job's run (not a tool call) is refused.
    let job_run = common::job(&mut e.jobs, "edit-gone").await.run_id;
    let not_call = bob
        .clone()
        .approve(ApproveRequest {
            run_id: job_run,
            comment: String::new(),
            edit: edit("search", json!({})),
            scope: None,
        })
        .await
        .unwrap_err();
    assert_eq!(
        not_call.code(),
        tonic::Code::InvalidArgument,
        "{not_call:?}"
    );
    e.stack.stop().await.unwrap();
}

/// The console's inbox edits a gated call too: the call is shown with
/// its tool and arguments, a bad edit is refused and approves nothing,
/// and an approval with changed arguments runs the call as changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_edits_a_gated_call_in_the_console_and_it_runs_as_changed() {
    let (mut e, provider, _stop) = edit_env().await;
    e.script.for_model(
        "m-edit-console",
        vec![
            Reply::tools(&[("search", json!({"q": "everything"}))], 40, 10),
            Reply::text("done", 80, 20),
        ],
    );
    submit(
        &mut e.jobs,
        &two_tools_job("edit-console", "m-edit-console"),
    )
    .await
    .unwrap();
    let waiting = awaiting_call(&mut e.jobs, &e.stack, "edit-console").await;
    let run_id = waiting["run_id"].as_str().unwrap().to_owned();
    let s = &e.stack;
    let base = format!("http://{}", s.http.unwrap());
    let bob = s.session(&s.token("bob").unwrap()).await.unwrap();
    let c = crate::console::client();
    let (_, inbox) = as_session(&c, &base, "GET", "/ui/", &bob, &[]).await;
    assert!(
        inbox.contains("name=\"edit_args\"")
            && inbox.contains("{&quot;q&quot;:&quot;everything&quot;}"),
        "the inbox shows the call to edit: {inbox}"
    );
    let path = format!("/ui/runs/{run_id}/approve");
    let post = |form: &'static [(&'static str, &'static str)]| {
        as_session(&c, &base, "POST", &path, &bob, form)
    };
    // Arguments that are not a JSON object: refused, nothing approved.
    let (code, _) = post(&[("edit_tool", "search"), ("edit_args", "[1, 2]")]).await;
    assert_eq!(code, 400);
    assert_eq!(
        run_of(s, &run_id).await.status,
        RunStatus::Proposed as i32,
        "a refused edit approves nothing"
    );
    // Narrower arguments: approved as edited, the call runs once, so.
    let (code, _) = post(&[
        ("comment", "narrower"),
        ("edit_tool", "search"),
        ("edit_args", r#"{"q": "public docs"}"#),
    ])
    .await;
    assert_eq!(code, 303);
    let r = finish(&mut e.jobs, "edit-console").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(
        provider.calls_with_args(),
        vec![("search".to_owned(), json!({"q": "public docs"}))]
    );
    let edit = run_of(s, &run_id).await.edit.unwrap();
    assert_eq!((edit.tool.as_str(), edit.by.as_str()), ("search", "bob"));
}
