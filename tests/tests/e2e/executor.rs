//! The executor end to end over gRPC, against the whole stack in one
//! process: every seed format, validation texts, DAG order and parallelism,
//! templates, retries, fallbacks, fail-fast, timeouts, cancellation, approval
//! gating, budget refusal and WatchJob resume.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::Duration;

use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    GetJobRequest, GetResultRequest, GetResultResponse, JobState, SubmitJobRequest, TaskState,
    WatchJobRequest,
};
use switchyard_testkit::Stack;

use crate::common::*;
use switchyard_kit::client::Intercepted;
use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::auth::v1::PrincipalKind;
use tokio_stream::StreamExt;

async fn stack(b: &Backend) -> (Stack, Jobs) {
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.commands.push("sh".into());
        c.executor.kill_grace_ms = 300;
        c.executor.approval_poll_ms = 20;
        b.apply(c);
    })
    .await
    .unwrap();
    let c = JobServiceClient::new(s.channel().await.unwrap());
    (s, c)
}

fn stdout(r: &GetResultResponse, task: &str) -> String {
    let t = r.tasks.iter().find(|t| t.task_id == task).unwrap();
    String::from_utf8_lossy(&t.stdout).into_owned()
}

fn state_of(r: &GetResultResponse, task: &str) -> TaskState {
    TaskState::try_from(r.tasks.iter().find(|t| t.task_id == task).unwrap().state).unwrap()
}

async fn the_seed_001_envelope_runs_as_a_piped_chain(b: Backend) {
    let (s, mut c) = stack(&b).await;
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

async fn events(
    c: &mut Jobs,
    job_id: &str,
    after: u64,
) -> Vec<switchyard_proto::common::v1::Event> {
    let every = switchyard_proto::executor::v1::WatchDetail::Unspecified;
    events_after(c, job_id, after, every).await
}

fn field(e: &switchyard_proto::common::v1::Event, k: &str) -> String {
    let v = e
        .data
        .as_ref()
        .and_then(|d| d.fields.get(k))
        .cloned()
        .unwrap_or_default();
    match switchyard_kit::json::value_to_json(&v) {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

fn invalid(status: &tonic::Status) -> (String, Vec<String>) {
    let e = switchyard_kit::error::ApiError::from(status.clone());
    (
        e.reason.unwrap_or_default(),
        e.violations
            .iter()
            .map(|v| format!("{}: {}", v.field, v.description))
            .collect(),
    )
}

/// A run's status.
async fn run_status(
    a: &mut switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient<
        Intercepted,
    >,
    run_id: &str,
) -> i32 {
    let req = switchyard_proto::approval::v1::GetRunRequest {
        run_id: run_id.into(),
    };
    a.get_run(req)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .status
}

async fn seed_001_rules_are_refused_with_the_seeds_texts(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"{"plan_id":"p","tasks":[{"task_number":1,"command":"sort"},{"task_number":2,"command":"uniq"},{"task_number":4,"command":"wc"}]}"#,
            "INVALID_TASK_NUMBERING",
            "Invalid task numbering: gap between task 2 and 4",
        ),
        (
            r#"{"plan_id":"p","tasks":[]}"#,
            "INVALID_ARGUMENT",
            "Invalid job: tasks must contain at least one task",
        ),
        (
            r#"{"plan_id":"p","tasks":[{"task_number":2,"command":"sort"}]}"#,
            "INVALID_TASK_NUMBERING",
            "Invalid task numbering: must start at 1, found 2",
        ),
        (
            r#"{"plan_id":"p","tasks":[{"task_number":1,"command":"sort","input_from_task":2},{"task_number":2,"command":"uniq"}]}"#,
            "INVALID_ARGUMENT",
            "Invalid input reference: task 1 reads task 2, which does not come before it",
        ),
        (
            r#"{"plan_id":"p","tasks":[{"task_number":1,"command":"sort","input_from_task":1}]}"#,
            "INVALID_ARGUMENT",
            "Invalid input reference: task 1 cannot read its own output",
        ),
        (
            r#"{"plan_id":"p","tasks":[{"task_number":1,"command":" "}]}"#,
            "INVALID_ARGUMENT",
            "Invalid command: task 1 has an empty command",
        ),
        (
            r#"{"plan_id":"p","tasks":[{"task_number":1,"command":"rm","args":["-rf","/"]}]}"#,
            "COMMAND_NOT_ALLOWED",
            "is not on the allowlist",
        ),
    ];
    for (doc, reason, text) in cases {
        let e = submit(&mut c, doc).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{doc}");
        assert!(e.message().contains(text), "{doc}: {}", e.message());
        assert_eq!(invalid(&e).0, *reason, "{doc}");
    }
    // The 100-task limit.
    let tasks: Vec<String> = (1..=101)
        .map(|n| format!(r#"{{"task_number":{n},"command":"true"}}"#))
        .collect();
    let e = submit(
        &mut c,
        &format!(r#"{{"plan_id":"p","tasks":[{}]}}"#, tasks.join(",")),
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.message(),
        "Invalid job: 101 tasks exceed the limit of 100"
    );
    // Nothing was created.
    let list = c
        .list_jobs(switchyard_proto::executor::v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.jobs.is_empty());
    s.stop().await.unwrap();
}

async fn graphs_and_templates_are_checked_at_submit_with_field_violations(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let cycle = r#"{"tasks":[
        {"id":"a","depends_on":["c"],"agent":{"capability":"builtin.echo"}},
        {"id":"b","depends_on":["a"],"agent":{"capability":"builtin.echo"}},
        {"id":"c","depends_on":["b"],"agent":{"capability":"builtin.echo"}}]}"#;
    let e = submit(&mut c, cycle).await.unwrap_err();
    assert!(
        invalid(&e)
            .1
            .iter()
            .any(|v| v.starts_with("tasks: dependency cycle: ")),
        "{e:?}"
    );
    let unknown =
        r#"{"tasks":[{"id":"a","depends_on":["zz"],"agent":{"capability":"builtin.echo"}}]}"#;
    let e = submit(&mut c, unknown).await.unwrap_err();
    assert_eq!(
        invalid(&e).1,
        ["tasks[0].depends_on[0]: depends on unknown task \"zz\""]
    );
    // b reads a's output without depending on it; c reads a job input that does not exist.
    let unseen = r#"{"input":{"x":1},"tasks":[
        {"id":"a","agent":{"capability":"builtin.echo"}},
        {"id":"b","agent":{"capability":"builtin.echo","input":{"t":"${a.output.text}"}}},
        {"id":"c","agent":{"capability":"builtin.echo","input":{"t":"${parent.input.y}"}}}]}"#;
    let e = submit(&mut c, unseen).await.unwrap_err();
    let v = invalid(&e).1;
    assert!(
        v.iter()
            .any(|v| v.starts_with("tasks[1].agent.input.t: task \"b\" cannot read \"a\"")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|v| v == "tasks[2].agent.input.t: the job input has no field \"y\""),
        "{v:?}"
    );
    s.stop().await.unwrap();
}

async fn seed_000_ojs_fields_are_validated_and_llm_tasks_fail_cleanly_without_a_provider(
    b: Backend,
) {
    let (s, mut c) = stack(&b).await;
    let bad_temp = r#"{"type":"agent.research","args":["x"],"ext_agent_model":"gpt-4o","ext_agent_temperature":2.5}"#;
    let e = submit(&mut c, bad_temp).await.unwrap_err();
    assert_eq!(invalid(&e).0, "AGENT_INVALID_PARAMETER");
    let bad_tool = r#"{"type":"agent.research","ext_agent_model":"gpt-4o","ext_agent_tools":[{"name":"Web-Search"}]}"#;
    assert_eq!(
        invalid(&submit(&mut c, bad_tool).await.unwrap_err()).0,
        "AGENT_INVALID_PARAMETER"
    );
    let dup_tool = r#"{"type":"agent.research","ext_agent_model":"gpt-4o","ext_agent_tools":[{"name":"web_search"},{"name":"web_search"}]}"#;
    assert_eq!(
        invalid(&submit(&mut c, dup_tool).await.unwrap_err()).0,
        "AGENT_INVALID_PARAMETER"
    );
    let deep = r#"{"type":"agent.research","ext_agent_model":"gpt-4o","ext_agent_delegation_depth":4,"ext_agent_max_delegation_depth":3}"#;
    assert_eq!(
        invalid(&submit(&mut c, deep).await.unwrap_err()).0,
        "AGENT_MAX_DELEGATION_DEPTH"
    );
    assert!(
        c.list_jobs(switchyard_proto::executor::v1::ListJobsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .jobs
            .is_empty()
    );

    // The seed's own example: accepted, estimated, waits for a person (the model is not priced).
    let example = r#"{"type":"agent.research","args":["Summarize recent developments in quantum computing"],
      "options":{"queue":"ai-agents","timeout_ms":120000},
      "ext_agent_model":"gpt-4o","ext_agent_fallback_models":["claude-3.5-sonnet","gpt-4o-mini"],
      "ext_agent_provider":"openai","ext_agent_temperature":0.7,"ext_agent_max_tokens":4096,
      "ext_agent_token_budget":50000,"ext_agent_tokens_used":123456,"ext_agent_custom_flag":"kept",
      "ext_agent_tools":[{"name":"web_search","description":"Search the web","parameters":{"type":"object","properties":{"query":{"type":"string"}},"required":["query"]}}],
      "ext_agent_tool_choice":"auto",
      "ext_agent_output_schema":{"type":"object","properties":{"summary":{"type":"string"}},"required":["summary"]},
      "ext_agent_output_format":"json"}"#;
    let job = submit(&mut c, example).await.unwrap();
    assert_eq!(job.state, JobState::Pending as i32);
    assert_eq!(job.tokens_used, 0, "client tokens_used is ignored");
    let spec = job.spec.clone().unwrap();
    assert_eq!(spec.source_format, "ojs");
    let Some(switchyard_proto::executor::v1::task_spec::Kind::Llm(l)) = &spec.tasks[0].kind else {
        panic!()
    };
    assert_eq!(l.fallback_models, ["claude-3.5-sonnet", "gpt-4o-mini"]);
    assert!(
        l.extensions
            .as_ref()
            .unwrap()
            .fields
            .contains_key("ext_agent_custom_flag"),
        "unknown ext_agent_* kept"
    );
    approve(&s, &job.run_id).await;
    let r = finish(&mut c, &id(&job)).await;
    assert_eq!(r.state, JobState::Discarded as i32);
    assert_eq!(r.reason, "LLM_PROVIDER_NOT_CONFIGURED");
    assert!(
        r.error.contains("no configured LLM provider serves"),
        "{}",
        r.error
    );
    s.stop().await.unwrap();
}

async fn an_aitp_task_runs_its_subtasks_as_a_dag_with_templates_and_mappings(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"
task_id: paper-1
name: Research Paper Analysis
description: Analyze a research paper
input:
  type: object
  properties:
    paper_pdf_url: {type: string}
    max_pages: {type: integer, default: 50}
input_values:
  paper_pdf_url: https://example.org/p.pdf
metadata:
  retry_policy: {max_retries: 1, backoff_strategy: fixed, backoff_base_ms: 10}
subtasks:
  - subtask_id: subtask_1
    name: Extract Text from PDF
    agent_capability: builtin.echo
    input:
      text: "text of ${parent.input.paper_pdf_url}"
      max_pages: "${parent.input.max_pages}"
    output_mapping: {text: raw_text}
    priority: 1
  - subtask_id: subtask_2
    name: Analyze Text with NLP
    agent_capability: builtin.echo
    depends_on: [subtask_1]
    input: {text: "${subtask_1.output.raw_text}"}
    output_mapping: {text: nlp_results}
    priority: 2
  - subtask_id: subtask_3
    name: Aggregate Results
    agent_capability: builtin.echo
    depends_on: [subtask_1, subtask_2]
    input:
      raw_text: "${subtask_1.output.raw_text}"
      nlp_results: "${subtask_2.output.nlp_results}"
      pages: "${subtask_1.output.max_pages}"
    output_mapping: {}
    priority: 3
"#;
    let job = submit(&mut c, doc).await.unwrap();
    assert_eq!(job.spec.as_ref().unwrap().source_format, "aitp");
    let r = finish(&mut c, "paper-1").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let out = switchyard_kit::json::value_to_json(r.result.as_ref().unwrap());
    let agg = &out["subtask_3"];
    assert_eq!(agg["raw_text"], "text of https://example.org/p.pdf");
    assert_eq!(agg["nlp_results"], "text of https://example.org/p.pdf");
    assert_eq!(agg["pages"], 50, "a whole template keeps its JSON type");
    // Routing decisions were logged with their score breakdown.
    let evs = events(&mut c, "paper-1", 0).await;
    let routed: Vec<_> = evs
        .iter()
        .filter(|e| e.kind == "routing.decision")
        .collect();
    assert_eq!(routed.len(), 3);
    assert!(field(routed[0], "candidates").contains("capability_match"));
    s.stop().await.unwrap();
}

fn ms(t: &Option<prost_types::Timestamp>) -> u64 {
    switchyard_kit::time::timestamp_ms(t.as_ref().unwrap())
}

async fn independent_tasks_run_in_parallel_and_dependents_wait_for_all(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"diamond","max_parallel":4,"tasks":[
        {"id":"a","command":{"command":"true"}},
        {"id":"b","depends_on":["a"],"agent":{"capability":"builtin.sleep","input":{"ms":400}}},
        {"id":"c","depends_on":["a"],"command":{"command":"sleep","args":["0.4"]}},
        {"id":"d","depends_on":["b","c"],"command":{"command":"echo","args":["done"]}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let r = finish(&mut c, "diamond").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let t = |id: &str| r.tasks.iter().find(|t| t.task_id == id).unwrap().clone();
    let (a, b, cc, d) = (t("a"), t("b"), t("c"), t("d"));
    assert!(ms(&b.started_at) >= ms(&a.finished_at) && ms(&cc.started_at) >= ms(&a.finished_at));
    // b and c overlap: each started before the other finished.
    assert!(
        ms(&b.started_at) < ms(&cc.finished_at) && ms(&cc.started_at) < ms(&b.finished_at),
        "{b:?} {cc:?}"
    );
    assert!(ms(&d.started_at) >= ms(&b.finished_at).max(ms(&cc.finished_at)));
    assert_eq!(stdout(&r, "d"), "done\n");
    // With max_parallel 1 the same tasks never overlap.
    submit(
        &mut c,
        &doc.replace(
            "\"diamond\",\"max_parallel\":4",
            "\"serial\",\"max_parallel\":1",
        ),
    )
    .await
    .unwrap();
    let r = finish(&mut c, "serial").await;
    let t = |id: &str| r.tasks.iter().find(|t| t.task_id == id).unwrap().clone();
    let (b, cc) = (t("b"), t("c"));
    assert!(ms(&b.finished_at) <= ms(&cc.started_at) || ms(&cc.finished_at) <= ms(&b.started_at));
    s.stop().await.unwrap();
}

async fn retries_back_off_and_keep_every_attempts_error(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"flaky","tasks":[
        {"id":"once","agent":{"capability":"builtin.fail_once"},
         "retry":{"max_retries":2,"backoff_strategy":"fixed","backoff_base_ms":200}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let r = finish(&mut c, "flaky").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let t = &r.tasks[0];
    assert_eq!(t.attempts.len(), 2);
    assert_eq!(t.attempts[0].reason, "AGENT_ERROR");
    assert!(t.attempts[0].error.contains("fails its first attempt"));
    assert!(
        ms(&t.attempts[1].started_at) >= ms(&t.attempts[0].finished_at) + 200,
        "fixed backoff waited"
    );
    assert_eq!(t.attempts[1].error, "");

    let doc = r#"{"job_id":"doomed","tasks":[
        {"id":"always","agent":{"capability":"builtin.fail_always"},
         "retry":{"max_retries":2,"backoff_strategy":"exponential","backoff_base_ms":100}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let r = finish(&mut c, "doomed").await;
    assert_eq!(r.state, JobState::Discarded as i32);
    assert_eq!(r.reason, "AGENT_ERROR");
    let a = &r.tasks[0].attempts;
    assert_eq!(a.len(), 3, "1 + max_retries");
    let gap = |i: usize| ms(&a[i].started_at) - ms(&a[i - 1].finished_at);
    assert!(
        gap(1) >= 100 && gap(2) >= 200,
        "exponential: 100 ms then 200 ms ({}, {})",
        gap(1),
        gap(2)
    );
    s.stop().await.unwrap();
}

async fn fail_fast_skips_what_did_not_start_and_keeps_partial_results(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"plan_id":"p","job_id":"ff","tasks":[
        {"task_number":1,"command":"echo","args":["partial output"]},
        {"task_number":2,"command":"sh","args":["-c","echo oops >&2; exit 3"]},
        {"task_number":3,"command":"wc","input_from_task":2}]}"#;
    submit(&mut c, doc).await.unwrap();
    let r = finish(&mut c, "ff").await;
    assert_eq!(r.state, JobState::Discarded as i32);
    assert_eq!(r.reason, "COMMAND_FAILED");
    assert_eq!(stdout(&r, "task_1"), "partial output\n");
    assert_eq!(state_of(&r, "task_2"), TaskState::Failed);
    let t2 = r.tasks.iter().find(|t| t.task_id == "task_2").unwrap();
    assert_eq!(t2.exit_code, Some(3));
    assert!(
        t2.error.contains("exited with code 3: oops"),
        "{}",
        t2.error
    );
    assert_eq!(state_of(&r, "task_3"), TaskState::Skipped);
    assert_eq!(r.tasks[2].reason, "UPSTREAM_FAILED");
    s.stop().await.unwrap();
}

async fn a_timeout_kills_a_process_that_ignores_sigterm(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"stubborn","tasks":[
        {"id":"t","timeout_secs":1,"command":{"command":"sh","args":["-c","trap '' TERM; while :; do :; done"]}}]}"#;
    let started = std::time::Instant::now();
    submit(&mut c, doc).await.unwrap();
    let r = finish(&mut c, "stubborn").await;
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(r.reason, "TASK_TIMEOUT");
    assert_eq!(
        r.tasks[0].exit_code,
        Some(137),
        "SIGKILL after the grace period"
    );
    s.stop().await.unwrap();
}

async fn timeout_extension_retries_once_with_the_longer_timeout(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"slow","tasks":[
        {"id":"t","timeout_secs":1,"agent":{"capability":"builtin.sleep","input":{"ms":1500}},
         "fallback":{"on_timeout":{"strategy":"RETRY_WITH_TIMEOUT_EXTENSION","extended_timeout_seconds":5}}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let r = finish(&mut c, "slow").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(r.tasks[0].attempts.len(), 2);
    assert_eq!(r.tasks[0].attempts[0].reason, "TASK_TIMEOUT");
    s.stop().await.unwrap();
}

async fn an_offline_agent_falls_back_to_the_next_best(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let mut reg =
        switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient::new(
            s.channel().await.unwrap(),
        );
    let mut dead = switchyard_executor::builtin::spec("http://127.0.0.1:9");
    dead.id = "dead".into();
    reg.register_agent(switchyard_proto::registry::v1::RegisterAgentRequest { agent: Some(dead) })
        .await
        .unwrap();
    let doc = r#"{"job_id":"offline","tasks":[
        {"id":"t","agent":{"capability":"builtin.echo","input":{"text":"hi"},"prefer_agents":["dead"]},
         "fallback":{"on_agent_offline":{"strategy":"SELECT_NEXT_BEST"}}}]}"#;
    let mut ok = false;
    for _ in 0..100 {
        // The router learns of the new agent through its watch.
        let v = c
            .validate_job(switchyard_proto::executor::v1::ValidateJobRequest {
                document: doc.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if v.routes.len() == 1 {
            ok = true;
            break;
        }
    }
    assert!(ok);
    submit(&mut c, doc).await.unwrap();
    let r = finish(&mut c, "offline").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(r.tasks[0].agent_id, "builtin");
    let calls: Vec<_> = events(&mut c, "offline", 0)
        .await
        .into_iter()
        .filter(|e| e.kind == "agent.call")
        .collect();
    assert_eq!(
        calls
            .iter()
            .map(|e| (field(e, "agent_id"), field(e, "status")))
            .collect::<Vec<_>>(),
        [
            ("dead".to_owned(), "unreachable".to_owned()),
            ("builtin".to_owned(), "success".to_owned())
        ]
    );
    s.stop().await.unwrap();
}

async fn a_refused_reservation_means_the_agent_is_never_called(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let mut ledger = switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        s.channel().await.unwrap(),
    );
    ledger
        .create_budget(switchyard_proto::ledger::v1::CreateBudgetRequest {
            budget_id: "team".into(),
            token_limit: Some(100),
            ..Default::default()
        })
        .await
        .unwrap();
    let doc = r#"{"job_id":"broke","budget":{"parent_budget_id":"team"},"tasks":[
        {"id":"t","agent":{"capability":"builtin.echo"},
         "fallback":{"on_cost_exceeded":{"strategy":"FAIL_AND_NOTIFY","notification":"Task exceeded budget"}}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let paused = until_event(&mut c, "broke", "budget.paused").await;
    // The enclosing budget ran out: the pause says so, and what is short.
    assert_eq!(paused["refused_by"], "team", "{paused}");
    let j = job(&mut c, "broke").await;
    assert_eq!(
        j.state,
        JobState::BudgetPaused as i32,
        "seed 000's retryable: paused, not failed"
    );
    assert_eq!(j.reason, "AGENT_TOKEN_BUDGET_EXCEEDED");
    // The team's budget raised and the extension approved, the job goes on.
    ledger
        .update_limits(switchyard_proto::ledger::v1::UpdateLimitsRequest {
            budget_id: "team".into(),
            token_limit: Some(10_000),
            ..Default::default()
        })
        .await
        .unwrap();
    approve(&s, paused["run_id"].as_str().unwrap()).await;
    let r = finish(&mut c, "broke").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let evs = events(&mut c, "broke", 0).await;
    assert!(
        evs.iter()
            .any(|e| e.kind == "budget.refused" && field(e, "refused_by") == "team")
    );
    assert!(
        evs.iter()
            .any(|e| e.kind == "job.notice"
                && field(e, "message").starts_with("Task exceeded budget"))
    );
    // The refused attempt called nothing: the one call is after the pause.
    let kinds: Vec<&str> = evs
        .iter()
        .map(|e| e.kind.as_str())
        .filter(|k| matches!(*k, "agent.call" | "budget.reserved" | "budget.paused"))
        .collect();
    assert_eq!(
        kinds,
        ["budget.paused", "budget.reserved", "agent.call"],
        "no call without a reservation"
    );
    s.stop().await.unwrap();
}

async fn nothing_runs_before_approval_and_a_rejection_cancels_the_job(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = |id: &str| {
        format!(
            r#"{{"job_id":"{id}","approval":{{"intent":"echo things","requires_approval":true}},
        "tasks":[{{"id":"t","agent":{{"capability":"builtin.echo","input":{{"text":"hi"}}}}}}]}}"#
        )
    };
    // carol may both submit and approve: separation of duties still stops
    // her approving her own job.
    let carol = s
        .key("carol", &["submitter", "approver"], PrincipalKind::Human)
        .await
        .unwrap();
    let mut as_carol = JobServiceClient::new(s.channel_with(&carol).await.unwrap());
    let job = submit(&mut as_carol, &doc("gated")).await.unwrap();
    assert_eq!(job.state, JobState::Pending as i32);
    assert_eq!(
        job.submitted_by, "carol",
        "from the key, not from the request"
    );
    let j = c
        .get_job(GetJobRequest {
            job_id: "gated".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(j.state, JobState::Pending as i32);
    assert_eq!(j.tasks[0].attempts.len(), 0, "no agent before approval");
    let mut a = approvals(&s).await;
    // Separation of duties holds for jobs too.
    let own = ApprovalServiceClient::new(s.channel_with(&carol).await.unwrap())
        .approve(switchyard_proto::approval::v1::ApproveRequest {
            run_id: j.run_id.clone(),
            comment: String::new(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap_err();
    assert_eq!(
        switchyard_kit::error::ApiError::from(own).reason.as_deref(),
        Some("SEPARATION_OF_DUTIES")
    );
    approve(&s, &j.run_id).await;
    let r = finish(&mut c, "gated").await;
    assert_eq!(r.state, JobState::Completed as i32);
    let evs = events(&mut c, "gated", 0).await;
    let decided = evs
        .iter()
        .position(|e| e.kind == "approval.decided")
        .unwrap();
    assert_eq!(field(&evs[decided], "by"), "bob");
    // Nothing of any task happened before the approval: the log is the
    // order things happened in.
    assert!(
        evs[..decided].iter().all(|e| e.task_id.is_empty()),
        "{:?}",
        evs[..decided].iter().map(|e| &e.kind).collect::<Vec<_>>()
    );
    let first_call = evs.iter().position(|e| e.kind == "agent.call").unwrap();
    assert!(decided < first_call);
    assert_eq!(
        run_status(&mut a, &j.run_id).await,
        switchyard_proto::approval::v1::RunStatus::Completed as i32,
        "the executor completed its run"
    );

    let job = submit(&mut as_carol, &doc("nope")).await.unwrap();
    approvals_as(&s, "bob")
        .await
        .reject(switchyard_proto::approval::v1::RejectRequest {
            run_id: job.run_id.clone(),
            comment: "too risky".into(),
        })
        .await
        .unwrap();
    let r = finish(&mut c, "nope").await;
    assert_eq!(r.state, JobState::Cancelled as i32);
    assert_eq!(r.reason, "APPROVAL_REJECTED");
    assert_eq!(r.tasks[0].attempts.len(), 0);
    s.stop().await.unwrap();
}

async fn cancelling_stops_running_work_and_cancels_the_run(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"long","tasks":[
        {"id":"cmd","command":{"command":"sleep","args":["30"]}},
        {"id":"agent","agent":{"capability":"builtin.sleep","input":{"ms":30000}}},
        {"id":"after","depends_on":["cmd"],"command":{"command":"true"}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let mut watch = c
        .watch_job(WatchJobRequest {
            job_id: "long".into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    // Wait until the agent call holds a reservation and the command runs.
    while !(seen
        .iter()
        .any(|e: &switchyard_proto::common::v1::Event| e.kind == "budget.reserved")
        && seen
            .iter()
            .any(|e| e.kind == "task.state" && e.task_id == "cmd" && field(e, "to") == "running"))
    {
        let e = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(e.event.unwrap());
    }
    let started = std::time::Instant::now();
    let j = c
        .cancel_job(switchyard_proto::executor::v1::CancelJobRequest {
            job_id: "long".into(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(j.state, JobState::Cancelled as i32);
    assert_eq!(j.error, "changed my mind");
    assert!(
        j.tasks
            .iter()
            .all(|t| t.state == TaskState::Cancelled as i32),
        "{:?}",
        j.tasks
    );
    // The reservation of the agent call was released; the live stream ends with the job.
    while let Some(e) = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .unwrap()
    {
        seen.push(e.unwrap().event.unwrap());
    }
    assert_eq!(
        seen,
        events(&mut c, "long", 0).await,
        "live and replayed streams agree"
    );
    let evs = seen;
    let reserved = evs.iter().filter(|e| e.kind == "budget.reserved").count();
    let released = evs.iter().filter(|e| e.kind == "budget.released").count();
    assert_eq!((reserved, released), (1, 1));
    let mut a = approvals(&s).await;
    assert_eq!(
        run_status(&mut a, &j.run_id).await,
        switchyard_proto::approval::v1::RunStatus::Cancelled as i32
    );
    // A finished job cannot be cancelled again.
    let again = c
        .cancel_job(switchyard_proto::executor::v1::CancelJobRequest {
            job_id: "long".into(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        switchyard_kit::error::ApiError::from(again)
            .reason
            .as_deref(),
        Some("JOB_TERMINAL")
    );
    s.stop().await.unwrap();
}

async fn watch_replays_a_finished_job_and_resumes_after_any_sequence(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"w","tasks":[{"id":"a","command":{"command":"echo","args":["x"]}},
        {"id":"b","depends_on":["a"],"agent":{"capability":"builtin.echo","input":{"text":"${a.output.stdout}"}}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let all = events(&mut c, "w", 0).await;
    assert_eq!(
        all.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        (1..=all.len() as u64).collect::<Vec<_>>()
    );
    assert_eq!(all.last().unwrap().kind, "job.state");
    assert_eq!(field(all.last().unwrap(), "to"), "completed");
    assert!(
        all.iter()
            .all(|e| e.job_id == "w" && !e.correlation_id.is_empty() && e.time.is_some())
    );
    for kind in [
        "job.submitted",
        "approval.requested",
        "approval.decided",
        "budget.created",
        "task.attempt",
        "task.output",
        "routing.decision",
        "budget.reserved",
        "agent.call",
        "task.result",
    ] {
        assert!(all.iter().any(|e| e.kind == kind), "missing {kind}");
    }
    let after = 5;
    let rest = events(&mut c, "w", after).await;
    assert_eq!(rest, all[after as usize..].to_vec());
    assert!(
        events(&mut c, "w", all.len() as u64).await.is_empty(),
        "nothing after the last event: the stream closes"
    );
    let e = c
        .watch_job(WatchJobRequest {
            job_id: "nope".into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    s.stop().await.unwrap();
}

async fn a_client_job_id_is_idempotent_for_the_same_spec_only(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"same","tasks":[{"id":"a","command":{"command":"true"}}]}"#;
    let req = || SubmitJobRequest {
        document: doc.into(),
        ..Default::default()
    };
    let first = c.submit_job(req()).await.unwrap().into_inner();
    let again = c.submit_job(req()).await.unwrap().into_inner();
    assert!(first.created && !again.created);
    assert_eq!(
        id(first.job.as_ref().unwrap()),
        id(again.job.as_ref().unwrap())
    );
    let e = submit(&mut c, &doc.replace("true", "false"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists);
    assert_eq!(
        switchyard_kit::error::ApiError::from(e).reason.as_deref(),
        Some("JOB_ALREADY_EXISTS")
    );
    let j = submit(
        &mut c,
        r#"{"tasks":[{"id":"a","command":{"command":"true"}}]}"#,
    )
    .await
    .unwrap();
    assert_eq!(uuid_version(&id(&j)), Some(7));
    s.stop().await.unwrap();
}

fn uuid_version(s: &str) -> Option<usize> {
    let hex: Vec<char> = s.chars().filter(|c| *c != '-').collect();
    (hex.len() == 32).then(|| hex[12].to_digit(16).unwrap() as usize)
}

/// An agent written with the SDK that fails its first call and records what
/// it was asked.
#[derive(Clone, Default)]
struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, String)>>>);

#[tonic::async_trait]
impl switchyard_agent_sdk::Agent for Recorder {
    async fn invoke(
        &self,
        req: switchyard_agent_sdk::Invocation,
        _progress: switchyard_agent_sdk::Progress,
    ) -> switchyard_proto::agent::v1::AgentResponse {
        let ctx = req.context.clone().unwrap_or_default();
        let calls = {
            let mut seen = self.0.lock().unwrap();
            seen.push((ctx.attempt, ctx.idempotency_key.clone()));
            seen.len()
        };
        if calls == 1 {
            switchyard_agent_sdk::respond::error("first call fails")
        } else {
            switchyard_agent_sdk::respond::success(
                switchyard_agent_sdk::input_text(&req, "text"),
                None,
            )
        }
    }
}

async fn a_deferred_task_runs_once_its_capability_appears_and_retries_keep_one_idempotency_key(
    b: Backend,
) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"later","tasks":[{"id":"t","agent":{"capability":"late.echo","input":{"text":"finally"}},
        "retry":{"max_retries":1,"backoff_strategy":"fixed","backoff_base_ms":100},
        "fallback":{"on_capability_unavailable":{"strategy":"DEFER","interval_seconds":1}}}]}"#;
    let job = submit(&mut c, doc).await.unwrap();
    assert_eq!(
        job.state,
        JobState::Pending as i32,
        "no agent yet: the cost is unknown, a person decides"
    );
    approve(&s, &job.run_id).await;
    let mut watch = c
        .watch_job(WatchJobRequest {
            job_id: "later".into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .event
            .unwrap();
        if e.kind == "task.state" && field(&e, "to") == "deferred" {
            assert_eq!(field(&e, "reason"), "CAPABILITY_UNAVAILABLE");
            break;
        }
    }
    // Now an agent offering the capability comes up.
    let rec = Recorder::default();
    let (trigger, agent) = serve_sdk_agent(&s, "late", "late.echo", rec.clone());
    let r = finish(&mut c, "later").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(r.tasks[0].agent_id, "late");
    let reasons: Vec<&str> = r.tasks[0]
        .attempts
        .iter()
        .map(|a| a.reason.as_str())
        .collect();
    assert_eq!(reasons.first(), Some(&"CAPABILITY_UNAVAILABLE"));
    assert_eq!(
        reasons[reasons.len() - 2..],
        ["AGENT_ERROR", ""],
        "{reasons:?}"
    );
    let calls = rec.0.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    assert!(calls[0].0 < calls[1].0, "attempt numbers grow: {calls:?}");
    assert_eq!(calls[0].1, "later/t");
    assert_eq!(calls[0].1, calls[1].1, "one idempotency key across retries");
    trigger.fire();
    agent.await.unwrap().unwrap();

    // Deferral is bounded by the deadline.
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 2;
    let doc = format!(
        r#"{{"job_id":"never","tasks":[{{"id":"t","deadline":{deadline},"agent":{{"capability":"never.here"}},
        "fallback":{{"on_capability_unavailable":{{"strategy":"DEFER","interval_seconds":1}}}}}}]}}"#
    );
    let job = submit(&mut c, &doc).await.unwrap();
    approve(&s, &job.run_id).await;
    let r = finish(&mut c, "never").await;
    assert_eq!(r.state, JobState::Discarded as i32);
    assert_eq!(r.tasks[0].reason, "DEADLINE_EXCEEDED");
    s.stop().await.unwrap();
}

pub(crate) fn example(name: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/jobs");
    std::fs::read_to_string(root.join(name)).unwrap()
}

async fn every_example_job_validates_and_the_paper_analysis_runs_on_the_example_agents(b: Backend) {
    let (s, mut c) = stack(&b).await;
    for name in [
        "log_analysis.json",
        "paper_analysis.yaml",
        "echo_chain.yaml",
        "ojs_research.json",
        "needs_approval.yaml",
        "a2a_mixed.yaml",
        "ask_replicas.yaml",
        "ask_oncall.yaml",
        "support_chat.yaml",
        "self_hosting_chat.yaml",
    ] {
        let v = c
            .validate_job(switchyard_proto::executor::v1::ValidateJobRequest {
                document: example(name),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"))
            .into_inner();
        assert!(!v.order.is_empty(), "{name}");
    }
    // The two example agents, served and registered as their binaries do.
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let opts = switchyard_agent_sdk::ServeOptions {
        registry_url: s.url.clone(),
        credential: switchyard_kit::client::Credential::bearer(&s.token("agents").unwrap()).ok(),
        ..Default::default()
    };
    let mut stats = switchyard_example_agents::spec(
        "text_stats",
        "Text statistics",
        "counts",
        "text.stats",
        10,
    );
    let mut extract = switchyard_example_agents::spec(
        "text_extract",
        "Text extraction",
        "extracts",
        "text.extract",
        20,
    );
    let (o1, o2, sd1, sd2) = (opts.clone(), opts, shutdown.clone(), shutdown);
    let a1 = tokio::spawn(async move {
        switchyard_agent_sdk::serve_until(switchyard_example_agents::TextStats, &mut stats, o1, sd1)
            .await
    });
    let a2 = tokio::spawn(async move {
        switchyard_agent_sdk::serve_until(switchyard_example_agents::Extract, &mut extract, o2, sd2)
            .await
    });
    for _ in 0..200 {
        let v = c
            .validate_job(switchyard_proto::executor::v1::ValidateJobRequest {
                document: example("paper_analysis.yaml"),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if v.routes.iter().all(|r| !r.agent_id.is_empty()) {
            assert_eq!(
                v.estimated_cost.unwrap().micro_usd,
                90,
                "(20 + 10 + 0) x 3 attempts"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let job = submit(&mut c, &example("paper_analysis.yaml"))
        .await
        .unwrap();
    assert_eq!(
        job.state,
        JobState::Pending as i32,
        "priced agents: a person decides"
    );
    approve(&s, &job.run_id).await;
    let r = finish(&mut c, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let out = switchyard_kit::json::value_to_json(r.result.as_ref().unwrap());
    let agg = &out["subtask_3"];
    assert_eq!(
        agg["links"],
        serde_json::json!(["https://example.org/routing"])
    );
    assert_eq!(agg["top_terms"][0]["term"], "agents");
    assert!(
        agg["findings"]["limitation"][0]
            .as_str()
            .unwrap()
            .starts_with("A limitation is the small fleet")
    );
    assert_eq!(
        r.cost.unwrap().micro_usd,
        30,
        "each agent's price, committed once"
    );
    trigger.fire();
    a1.await.unwrap().unwrap();
    a2.await.unwrap().unwrap();
    s.stop().await.unwrap();
}

async fn a_scheduled_job_waits_for_its_time_and_a_passed_deadline_stops_a_task_from_starting(
    b: Backend,
) {
    let (s, mut c) = stack(&b).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let doc = format!(
        r#"{{"job_id":"later-on","scheduled_at":{},"tasks":[{{"id":"a","command":{{"command":"true"}}}}]}}"#,
        now + 2
    );
    let j = submit(&mut c, &doc).await.unwrap();
    assert_eq!(j.state, JobState::Scheduled as i32);
    let r = finish(&mut c, "later-on").await;
    assert_eq!(r.state, JobState::Completed as i32);
    let started = ms(&c
        .get_job(GetJobRequest {
            job_id: "later-on".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
        .started_at);
    assert!(started >= (now + 2) * 1000, "not before scheduled_at");

    let doc = format!(
        r#"{{"job_id":"too-late","deadline":{},"tasks":[{{"id":"a","command":{{"command":"true"}}}}]}}"#,
        now - 60
    );
    submit(&mut c, &doc).await.unwrap();
    let r = finish(&mut c, "too-late").await;
    assert_eq!(
        (r.state, r.tasks[0].reason.as_str()),
        (JobState::Discarded as i32, "DEADLINE_EXCEEDED")
    );
    assert!(r.tasks[0].attempts.is_empty(), "it never started");
    s.stop().await.unwrap();
}

async fn jobs_survive_a_restart_even_when_the_config_no_longer_allows_them(b: Backend) {
    let (s, mut c) = stack(&b).await;
    submit(
        &mut c,
        r#"{"job_id":"kept","tasks":[{"id":"a","command":{"command":"sh","args":["-c","echo hi"]}},
        {"id":"b","agent":{"capability":"builtin.echo","input":{"text":"kept"}}}]}"#,
    )
    .await
    .unwrap();
    let before = finish(&mut c, "kept").await;
    assert_eq!(before.state, JobState::Completed as i32);
    let all_before = events(&mut c, "kept", 0).await;
    let dir = s.stop().await.unwrap();
    // `sh` is no longer on the allowlist: the accepted job still loads, as it was.
    let path = dir.path().to_path_buf();
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |cfg| {
        cfg.storage.data_dir = path;
        b.apply(cfg);
    })
    .await
    .unwrap();
    let mut c = JobServiceClient::new(s.channel().await.unwrap());
    let after = c
        .get_result(GetResultRequest {
            job_id: "kept".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.state, JobState::Completed as i32);
    assert_eq!(stdout(&after, "a"), "hi\n");
    let b_out = after.tasks.iter().find(|t| t.task_id == "b").unwrap();
    let b_out = b_out
        .output
        .as_ref()
        .map(switchyard_kit::json::struct_to_json);
    assert_eq!(
        b_out.as_ref().map(|o| &o["text"]),
        Some(&serde_json::json!("kept")),
        "an agent task's output is read back after the restart"
    );
    assert_eq!(
        events(&mut c, "kept", 0).await,
        all_before,
        "the log replays as it was written"
    );
    let e = submit(&mut c, r#"{"job_id":"new","tasks":[{"id":"a","command":{"command":"sh","args":["-c","echo hi"]}}]}"#).await.unwrap_err();
    assert_eq!(
        invalid(&e).0,
        "COMMAND_NOT_ALLOWED",
        "new jobs follow the new config"
    );
    s.stop().await.unwrap();
    drop(dir);
}

/// WatchJob at `detail`, to the end.
async fn events_at(
    c: &mut Jobs,
    job_id: &str,
    detail: switchyard_proto::executor::v1::WatchDetail,
) -> Vec<switchyard_proto::common::v1::Event> {
    events_after(c, job_id, 0, detail).await
}

/// WatchJob after `after` at `detail`, to the end.
async fn events_after(
    c: &mut Jobs,
    job_id: &str,
    after: u64,
    detail: switchyard_proto::executor::v1::WatchDetail,
) -> Vec<switchyard_proto::common::v1::Event> {
    let mut s = c
        .watch_job(WatchJobRequest {
            job_id: job_id.into(),
            after_sequence: after,
            detail: detail as i32,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .unwrap()
    {
        out.push(e.unwrap().event.unwrap());
    }
    out
}

fn wait(ms: u64) -> Option<prost_types::Duration> {
    Some(switchyard_kit::time::duration(ms))
}

async fn submit_with_wait_answers_with_the_result_in_one_call(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"one-call","tasks":[
        {"id":"a","agent":{"capability":"builtin.echo","input":{"text":"hi"}}},
        {"id":"b","depends_on":["a"],"agent":{"capability":"builtin.echo","input":{"text":"${a.output.text}!"}}}]}"#;
    let out = c
        .submit_job(SubmitJobRequest {
            document: doc.into(),
            wait: wait(20_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let r = out
        .result
        .expect("the job ended within the wait: its result");
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(
        switchyard_kit::json::value_to_json(r.result.as_ref().unwrap())["b"]["text"],
        "hi!"
    );
    // The job in the answer is the job as it ended.
    assert_eq!(out.job.unwrap().state, JobState::Completed as i32);
    // Resubmitting the same job answers with the same result at once.
    let again = c
        .submit_job(SubmitJobRequest {
            document: doc.into(),
            wait: wait(20_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.result.unwrap().state, JobState::Completed as i32);
    s.stop().await.unwrap();
}

async fn a_wait_ends_at_the_callers_deadline_with_the_job_as_it_is_and_get_result_waits_on(
    b: Backend,
) {
    let (s, mut c) = stack(&b).await;
    let doc = example("needs_approval.yaml");
    // The caller allows 3 s (a submission on a loaded two-core machine,
    // PostgreSQL included, stays well inside it); the job waits for a
    // person: the answer comes before the deadline, without a result, and
    // the job goes on.
    let mut req = tonic::Request::new(SubmitJobRequest {
        document: doc,
        wait: wait(60_000),
        ..Default::default()
    });
    req.set_timeout(Duration::from_secs(3));
    let out = c.submit_job(req).await.unwrap().into_inner();
    assert!(out.result.is_none());
    let job = out.job.unwrap();
    assert_eq!(job.state, JobState::Pending as i32);
    let job_id = id(&job);
    // GetResult with a wait answers with the state as it is when the wait ends.
    let r = c
        .get_result(GetResultRequest {
            job_id: job_id.clone(),
            wait: wait(50),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.state, JobState::Pending as i32);
    // Approved, the job runs; GetResult waits for its end.
    approve(&s, &job.run_id).await;
    let r = c
        .get_result(GetResultRequest {
            job_id,
            wait: wait(20_000),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    s.stop().await.unwrap();
}

async fn a_negative_wait_is_refused_naming_the_field_and_creates_nothing(b: Backend) {
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"neg","tasks":[{"id":"a","agent":{"capability":"builtin.echo"}}]}"#;
    let e = c
        .submit_job(SubmitJobRequest {
            document: doc.into(),
            wait: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("wait"), "{}", e.message());
    let gone = c
        .get_job(GetJobRequest {
            job_id: "neg".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    s.stop().await.unwrap();
}

async fn watch_detail_narrows_the_stream_to_state_changes_with_the_logs_own_sequences(b: Backend) {
    use switchyard_proto::executor::v1::WatchDetail;
    let (s, mut c) = stack(&b).await;
    let doc = r#"{"job_id":"narrow","tasks":[
        {"id":"a","agent":{"capability":"builtin.echo","input":{"text":"x"}}},
        {"id":"b","depends_on":["a"],"agent":{"capability":"builtin.echo"}}]}"#;
    submit(&mut c, doc).await.unwrap();
    let all = events_at(&mut c, "narrow", WatchDetail::Unspecified).await;
    let jobs = events_at(&mut c, "narrow", WatchDetail::Job).await;
    let tasks = events_at(&mut c, "narrow", WatchDetail::Tasks).await;
    let want = |kinds: &[&str]| {
        all.iter()
            .filter(|e| kinds.contains(&e.kind.as_str()))
            .map(|e| (e.sequence, e.kind.clone()))
            .collect::<Vec<_>>()
    };
    let got = |es: &[switchyard_proto::common::v1::Event]| {
        es.iter()
            .map(|e| (e.sequence, e.kind.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(got(&jobs), want(&["job.state"]));
    assert_eq!(got(&tasks), want(&["job.state", "task.state"]));
    assert!(all.len() > tasks.len() && tasks.len() > jobs.len());
    assert_eq!(field(jobs.last().unwrap(), "to"), "completed");
    assert_eq!(events_at(&mut c, "narrow", WatchDetail::All).await, all);
    s.stop().await.unwrap();
}

/// More jobs waiting for approval (in memory, nothing finished) than the
/// executor reads from its store per query (200): one large page holds
/// every one, and pages of 100 go through every one, newest first, none
/// twice.
async fn list_jobs_pages_through_more_jobs_in_flight_than_one_store_read(b: Backend) {
    const N: usize = 230;
    let (s, mut c) = stack(&b).await;
    for i in 0..N {
        let doc = format!(
            r#"{{"job_id":"wait-{i:03}","approval":{{"intent":"echo","requires_approval":true}},
            "tasks":[{{"id":"t","agent":{{"capability":"builtin.echo","input":{{"text":"hi"}}}}}}]}}"#
        );
        let job = submit(&mut c, &doc).await.unwrap();
        assert_eq!(job.state, JobState::Pending as i32);
    }
    let one = c
        .list_jobs(switchyard_proto::executor::v1::ListJobsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.jobs.len(), N, "one page of up to 1000");
    let mut listed: Vec<switchyard_proto::executor::v1::Job> = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_jobs(switchyard_proto::executor::v1::ListJobsRequest {
                page_size: 100,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        listed.extend(page.jobs);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let ids: Vec<String> = listed
        .iter()
        .map(|j| j.spec.as_ref().unwrap().job_id.clone())
        .collect();
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!((ids.len(), distinct.len()), (N, N), "{ids:?}");
    let created: Vec<i64> = listed
        .iter()
        .map(|j| {
            let t = j.created_at.unwrap();
            t.seconds * 1_000_000_000 + i64::from(t.nanos)
        })
        .collect();
    assert!(created.windows(2).all(|w| w[0] >= w[1]), "newest first");
    assert!(
        listed.iter().all(|j| j.state == JobState::Pending as i32),
        "shown as they are in memory"
    );
    s.stop().await.unwrap();
}

switchyard_testkit::on_both_backends!(
    sled, postgres;
    list_jobs_pages_through_more_jobs_in_flight_than_one_store_read,
    the_seed_001_envelope_runs_as_a_piped_chain,
    seed_001_rules_are_refused_with_the_seeds_texts,
    graphs_and_templates_are_checked_at_submit_with_field_violations,
    seed_000_ojs_fields_are_validated_and_llm_tasks_fail_cleanly_without_a_provider,
    an_aitp_task_runs_its_subtasks_as_a_dag_with_templates_and_mappings,
    independent_tasks_run_in_parallel_and_dependents_wait_for_all,
    retries_back_off_and_keep_every_attempts_error,
    fail_fast_skips_what_did_not_start_and_keeps_partial_results,
    a_timeout_kills_a_process_that_ignores_sigterm,
    timeout_extension_retries_once_with_the_longer_timeout,
    an_offline_agent_falls_back_to_the_next_best,
    a_refused_reservation_means_the_agent_is_never_called,
    nothing_runs_before_approval_and_a_rejection_cancels_the_job,
    cancelling_stops_running_work_and_cancels_the_run,
    watch_replays_a_finished_job_and_resumes_after_any_sequence,
    a_client_job_id_is_idempotent_for_the_same_spec_only,
    a_deferred_task_runs_once_its_capability_appears_and_retries_keep_one_idempotency_key,
    every_example_job_validates_and_the_paper_analysis_runs_on_the_example_agents,
    a_scheduled_job_waits_for_its_time_and_a_passed_deadline_stops_a_task_from_starting,
    jobs_survive_a_restart_even_when_the_config_no_longer_allows_them,
    submit_with_wait_answers_with_the_result_in_one_call,
    a_wait_ends_at_the_callers_deadline_with_the_job_as_it_is_and_get_result_waits_on,
    a_negative_wait_is_refused_naming_the_field_and_creates_nothing,
    watch_detail_narrows_the_stream_to_state_changes_with_the_logs_own_sequences,
    a_run_approved_by_policy_is_claimed_with_its_proposal_and_one_a_person_approves_by_claim,
);

/// The audit records of run `run_id`: (event type, actor, with_proposal).
async fn claims_of(s: &Stack, run_id: &str) -> Vec<(String, String, String)> {
    audit_of(s, "admin", run_id)
        .await
        .into_iter()
        .map(|r| {
            let with = r.details.get("with_proposal").cloned().unwrap_or_default();
            (r.event_type, r.actor, with)
        })
        .collect()
}

async fn a_run_approved_by_policy_is_claimed_with_its_proposal_and_one_a_person_approves_by_claim(
    b: Backend,
) {
    let (s, mut c) = stack(&b).await;
    let doc = |id: &str, person: bool| {
        format!(
            r#"{{"job_id":"{id}","approval":{{"intent":"echo","requires_approval":{person}}},
        "tasks":[{{"id":"t","agent":{{"capability":"builtin.echo","input":{{"text":"hi"}}}}}}]}}"#
        )
    };
    // Zero cost: the policy approves it, and the proposal claims it for
    // the executor; nothing else claims it.
    let job = submit(&mut c, &doc("free", false)).await.unwrap();
    let r = finish(&mut c, "free").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let audit = claims_of(&s, &job.run_id).await;
    let claims: Vec<_> = audit.iter().filter(|(k, ..)| k == "claimed").collect();
    assert_eq!(
        claims,
        [&(
            "claimed".to_owned(),
            "executor".to_owned(),
            "true".to_owned()
        )],
        "{audit:?}"
    );
    // Left for a person: claimed once, by Claim, after bob approved.
    let job = submit(&mut c, &doc("reviewed", true)).await.unwrap();
    assert_eq!(job.state, JobState::Pending as i32);
    approve(&s, &job.run_id).await;
    let r = finish(&mut c, "reviewed").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let audit = claims_of(&s, &job.run_id).await;
    let kinds: Vec<&str> = audit.iter().map(|(k, ..)| k.as_str()).collect();
    let approved = kinds.iter().position(|k| *k == "approved").unwrap();
    let claimed = kinds.iter().position(|k| *k == "claimed").unwrap();
    assert!(approved < claimed, "{kinds:?}");
    assert_eq!(audit[claimed].2, "", "claimed by Claim: {audit:?}");
    assert_eq!(audit[approved].1, "bob");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_lets_a_running_command_finish_and_the_restart_runs_only_what_is_left() {
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.approval_poll_ms = 20;
    })
    .await
    .unwrap();
    let mut c = JobServiceClient::new(s.channel_as("tester").await.unwrap());
    let doc = r#"{"job_id":"drained","tasks":[
        {"id":"p","command":{"command":"printf","args":["p"]}},
        {"id":"a","depends_on":["p"],"command":{"command":"sleep","args":["1"]}},
        {"id":"b","depends_on":["a"],"command":{"command":"printf","args":["b${p.output.stdout}"]}}]}"#;
    submit(&mut c, doc).await.unwrap();
    // Stop while `a` runs.
    let mut running = false;
    for _ in 0..400 {
        let j = job(&mut c, "drained").await;
        if j.tasks[1].state == TaskState::Running as i32 {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(running, "task a never started");
    let dir = s.stop().await.unwrap();
    // The same data, started again.
    let data = dir.path().to_path_buf();
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.approval_poll_ms = 20;
        c.storage.data_dir = data;
    })
    .await
    .unwrap();
    let mut c = JobServiceClient::new(s.channel_as("tester").await.unwrap());
    let r = finish(&mut c, "drained").await;
    let task = |id: &str| r.tasks.iter().find(|t| t.task_id == id).unwrap();
    assert_eq!(
        task("b").stdout,
        b"bp",
        "b reads p's output, replayed with p's result after the restart"
    );
    // `a` ended during the drain, once; it is not run again.
    assert_eq!(
        task("a").attempts.len(),
        1,
        "a ran again: {:?}",
        task("a").attempts
    );
    assert_eq!(task("a").exit_code, Some(0));
    s.stop().await.unwrap();
    drop(dir);
}

/// A budget that fits a chain's work fits the chain: the next step may use
/// what the steps before it left, and a step that used nothing holds
/// nothing by the time the next reserves (issue 44: with 1,000-2,000
/// tokens, 12 of 20 two-step chains were refused, each step asking for the
/// whole budget).
#[tokio::test]
async fn twenty_chains_under_a_budget_that_fits_their_work_all_complete() {
    let (s, mut c) = stack(&sled()).await;
    let (trigger, agent) = serve_sdk_agent(&s, "counting", "text.count", Counting(40));
    wait_routed(&s, "text.count").await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let doc = serde_json::json!({"job_id": format!("chain-{i}"),
            "budget": {"token_budget": 1500},
            "tasks": [
                {"id": "a", "agent": {"capability": "text.count", "input": {"text": "one"}}},
                {"id": "b", "depends_on": ["a"],
                 "agent": {"capability": "text.count", "input": {"text": "two"}}},
                // Uses nothing: its hold is released in the background,
                // and must be gone before c reserves.
                {"id": "nothing", "depends_on": ["b"],
                 "agent": {"capability": "builtin.echo", "input": {"text": "three"}}},
                {"id": "c", "depends_on": ["nothing"],
                 "agent": {"capability": "text.count", "input": {"text": "four"}}}]});
        let job = submit(&mut c, &doc.to_string()).await.unwrap();
        if job.state == JobState::Pending as i32 && !job.run_id.is_empty() {
            approve(&s, &job.run_id).await;
        }
        ids.push(id(&job));
    }
    for job_id in &ids {
        let r = finish(&mut c, job_id).await;
        let why: Vec<String> = r
            .tasks
            .iter()
            .map(|t| format!("{} {} {}", t.task_id, t.reason, t.error))
            .collect();
        assert_eq!(r.state, JobState::Completed as i32, "{job_id}: {why:?}");
        assert_eq!(r.tokens_used, 120, "{job_id}");
    }
    trigger.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}
