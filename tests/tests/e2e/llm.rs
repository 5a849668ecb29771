//! LLM tasks and declarative agents end to end, against a scripted
//! OpenAI-compatible server on loopback that counts every request: nothing
//! reaches the model before approval or past the budget; fallback, tools,
//! structured output, delegation and declarative agents behave as the seeds
//! say.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_agent_sdk::tools::{ToolProvider, ToolServer};
use switchyard_kit::json::{struct_to_json, value_to_json};
use switchyard_llm::scripted::{Reply, Script, Server};
use switchyard_llm::{Llm, LlmConfig, ModelConfig, ProviderConfig, ProviderKind};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    GetJobRequest, GetResultResponse, Job, JobState, ListJobsRequest, TaskState, TaskStatus,
    WatchJobRequest,
};
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
use switchyard_proto::registry::v1::{
    DeregisterToolRequest, GetAgentRequest, RegisterToolRequest, Tool,
};
use switchyard_testkit::Stack;

use crate::common::{Jobs, explain, finish, id, story_says, submit};
use tokio_stream::StreamExt;

/// Models served by the scripted server over OpenAI's wire, at $2.50/$10
/// per million tokens.
const MODELS: &[&str] = &[
    "gpt-4o",
    "gpt-4o-mini",
    "m-required",
    "m-none",
    "m-turns",
    "m-schema",
    "m-deleg",
    "m-deleg-slow",
    "m-tools",
    "m-parallel",
    "m-budget",
    "m-policy",
    "m-edit-console",
    "m-policy-edit",
    "m-cost",
    "m-sdk",
    "m-stream",
    "m-overrun",
    "m-edit-bypass",
    "m-edit-args",
    "m-edit-gone",
    "m-mcp",
    "m-mcp-slow",
    "m-gate",
    "m-gate-reject",
    "m-gate-timeout",
    "m-gate-restart",
    "m-gate-cancel",
    "m-gate-price",
    "m-pr",
    "m-chat",
    "m-concierge",
    "m-offer",
    "m-web",
    "m-data",
];

/// Served over Anthropic's Messages wire by the same server, same prices.
const ANTHROPIC_MODELS: &[&str] = &["claude-3.5-sonnet"];

pub(crate) fn llm_config(base_url: &str) -> LlmConfig {
    let provider = |name: &str, kind, models: &[&str]| ProviderConfig {
        name: name.into(),
        kind,
        base_url: base_url.into(),
        models: models
            .iter()
            .map(|m| ModelConfig::priced(*m, 2_500_000, 10_000_000))
            .collect(),
        ..Default::default()
    };
    LlmConfig {
        providers: vec![
            provider("openai", ProviderKind::Openai, MODELS),
            provider("anthropic", ProviderKind::Anthropic, ANTHROPIC_MODELS),
        ],
        ..Default::default()
    }
}

pub(crate) struct Env {
    pub(crate) stack: Stack,
    pub(crate) jobs: Jobs,
    pub(crate) script: Script,
    _server: Server,
}

/// The whole stack with the scripted provider; `auto_approve` adds a
/// policy approving runs up to $10 (else only zero-cost runs pass).
pub(crate) async fn env(
    auto_approve: bool,
    tweak: impl FnOnce(&mut switchyard_cli::Config),
) -> Env {
    let script = Script::new();
    let server = script.serve().await;
    let url = server.base_url();
    let stack = Stack::start_with(switchyard_cli::ServiceKind::ALL, move |c| {
        c.llm = llm_config(&url);
        c.executor.approval_poll_ms = 20;
        c.executor.commands.push("sh".into());
        if auto_approve {
            c.approval.policies.push(switchyard_approval::Policy {
                name: "up-to-10-dollars".into(),
                max_estimated_cost_micro_usd: Some(10_000_000),
                ..Default::default()
            });
        }
        tweak(c);
    })
    .await
    .unwrap();
    let jobs = JobServiceClient::new(stack.channel().await.unwrap());
    Env {
        stack,
        jobs,
        script,
        _server: server,
    }
}

async fn get(c: &mut Jobs, job_id: &str) -> Job {
    c.get_job(GetJobRequest {
        job_id: job_id.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .job
    .unwrap()
}

async fn all_jobs(c: &mut Jobs) -> Vec<Job> {
    c.list_jobs(ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs
}

/// (tool, reason) of each tool call of a task, in order ("" for success).
pub(crate) fn tool_outcomes(t: &TaskStatus) -> Vec<(&str, &str)> {
    t.tool_results
        .iter()
        .map(|x| (x.name.as_str(), x.reason.as_str()))
        .collect()
}

pub(crate) fn task<'a>(r: &'a GetResultResponse, id: &str) -> &'a TaskStatus {
    r.tasks.iter().find(|t| t.task_id == id).unwrap()
}

fn output(t: &TaskStatus) -> Value {
    t.output.as_ref().map(struct_to_json).unwrap_or(Value::Null)
}

/// Approves a run as a reviewer (the submitter is anonymous).
async fn approve(s: &Stack, run_id: &str) {
    crate::common::approve(s, run_id).await;
}

/// Submits a job that waits for a person, approves it, and waits for its end.
async fn approved(e: &mut Env, doc: &str) -> GetResultResponse {
    let job = submit(&mut e.jobs, doc).await.unwrap();
    assert_eq!(job.state, JobState::Pending as i32, "{job:?}");
    approve(&e.stack, &job.run_id).await;
    finish(&mut e.jobs, &id(&job)).await
}

/// Asserts that nothing of any task (an attempt, a reservation, a model
/// call) happened before the job's approval: its log is the order things
/// happened in.
fn nothing_before_approval(events: &[(String, Value)]) {
    let decided = events
        .iter()
        .position(|(k, _)| k == "approval.decided")
        .expect("the job was approved");
    let early: Vec<&str> = events[..decided]
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| k.starts_with("task.") || k.starts_with("llm.") || *k == "budget.reserved")
        .collect();
    assert!(early.is_empty(), "before approval: {early:?}");
}

/// Events of a job: (kind, data).
pub(crate) async fn events(c: &mut Jobs, job_id: &str) -> Vec<(String, Value)> {
    let mut stream = c
        .watch_job(WatchJobRequest {
            job_id: job_id.into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(Ok(m)) = stream.next().await {
        if let Some(e) = m.event {
            out.push((
                e.kind,
                e.data.as_ref().map(struct_to_json).unwrap_or(Value::Null),
            ));
        }
    }
    out
}

async fn budget(s: &Stack, id: &str) -> switchyard_proto::ledger::v1::Budget {
    crate::common::budget(
        &mut LedgerServiceClient::new(s.channel().await.unwrap()),
        id,
    )
    .await
}

/// A tool provider that records its calls: `lookup` echoes, `secret`
/// answers (and must never be reached by a task that did not list it).
#[derive(Clone, Default)]
pub(crate) struct Provider(Arc<Mutex<Vec<(String, Value)>>>);

#[tonic::async_trait]
impl ToolProvider for Provider {
    async fn call(&self, name: &str, args: Value) -> Result<Value, String> {
        self.0.lock().unwrap().push((name.into(), args.clone()));
        match name {
            "web_search" => Ok(json!({"results": ["https://arxiv.org/abs/2401.00001"]})),
            _ => Ok(json!({"found": args})),
        }
    }
}

impl Provider {
    pub(crate) fn calls(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().map(|c| c.0.clone()).collect()
    }

    /// Every call, with its arguments.
    pub(crate) fn calls_with_args(&self) -> Vec<(String, Value)> {
        self.0.lock().unwrap().clone()
    }
}

/// Serves `p` on loopback and registers `tools` with its endpoint.
pub(crate) async fn provide(
    s: &Stack,
    p: Provider,
    tools: &[&str],
) -> switchyard_kit::shutdown::Trigger {
    let cfg = switchyard_kit::server::ServerConfig {
        listen: "127.0.0.1:0".into(),
        ..Default::default()
    };
    let listener = switchyard_kit::server::bind(&cfg).await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let server = switchyard_kit::server::Server::new(cfg)
        .add_service(ToolServer::new(p).into_service(4 << 20));
    tokio::spawn(server.run(listener, shutdown));
    let mut reg = RegistryServiceClient::new(s.channel().await.unwrap());
    for name in tools {
        reg.register_tool(RegisterToolRequest {
            tool: Some(Tool {
                name: (*name).into(),
                description: format!("{name} things"),
                parameters: switchyard_kit::json::json_to_struct(&json!({
                    "type": "object", "properties": {"q": {"type": "string"}, "query": {"type": "string"}}
                })),
                endpoint: endpoint.clone(),
                            ..Default::default()
}),
        })
        .await
        .unwrap();
    }
    trigger
}

const SEED_000_EXAMPLE: &str = include_str!("../../../examples/jobs/ojs_research.json");

#[tokio::test]
async fn no_request_reaches_the_model_before_approval_or_after_the_budget_refuses() {
    let mut e = env(false, |_| {}).await;
    e.script.otherwise(Reply::text("fine", 20, 5));
    let doc = r#"{"type": "t.ask", "args": ["Say fine"], "ext_agent_model": "gpt-4o", "ext_agent_max_tokens": 50}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    assert_eq!(
        job.state,
        JobState::Pending as i32,
        "a priced model needs a person"
    );
    approve(&e.stack, &job.run_id).await;
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    // One request in all, made by the one attempt, which came after the approval.
    assert_eq!(e.script.count(), 1);
    let log = events(&mut e.jobs, &id(&job)).await;
    nothing_before_approval(&log);
    // What the person approved is what the job's budget holds at most.
    let approved = log
        .iter()
        .find(|(k, _)| k == "approval.requested")
        .and_then(|(_, d)| d["max_tokens"].as_u64())
        .unwrap();
    let b = budget(&e.stack, &format!("job-{}", id(&job))).await;
    assert_eq!(b.token_limit, Some(approved));
    assert_eq!(output(task(&r, "agent"))["content"], "fine");
    // Tokens are server-managed: the provider's usage, committed.
    assert_eq!(r.tokens_used, 25);
    // 20 × $2.50/M + 5 × $10/M = 50 + 50 µ$.
    assert_eq!(r.cost.unwrap().micro_usd, 100);

    // A token budget too small for one call: refused, no request, paused
    // for a person to extend it.
    let tight = r#"{"type": "t.ask", "args": ["Say fine"], "ext_agent_model": "gpt-4o",
                    "ext_agent_max_tokens": 500, "ext_agent_token_budget": 100}"#;
    let job = submit(&mut e.jobs, tight).await.unwrap();
    approve(&e.stack, &job.run_id).await;
    let r = crate::common::until_paused(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.reason, "AGENT_TOKEN_BUDGET_EXCEEDED");
    assert_eq!(e.script.count(), 1, "no request once the budget refuses");
    let b = budget(&e.stack, &format!("job-{}", id(&job))).await;
    assert_eq!((b.tokens_spent, b.tokens_reserved), (0, 0));
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn parallel_tasks_sharing_one_budget_never_exceed_it() {
    let mut e = env(true, |_| {}).await;
    // Every answer takes a while, so reservations overlap.
    e.script
        .otherwise(Reply::text("part", 10, 300).delay(Duration::from_millis(150)));
    let tasks: Vec<Value> = (0..6)
        .map(|i| json!({"id": format!("t{i}"), "llm": {"model": "m-parallel", "prompt": format!("part {i}"), "max_tokens": 300}}))
        .collect();
    let doc = json!({"plan_id": "parallel", "max_parallel": 6,
                     "budget": {"token_budget": 1500}, "tasks": tasks})
    .to_string();
    let job = submit(&mut e.jobs, &doc).await.unwrap();
    // The tasks that do not fit pause the job once the others are done.
    let r = crate::common::until_paused(&mut e.jobs, &id(&job)).await;
    let b = budget(&e.stack, &format!("job-{}", id(&job))).await;
    let done = r
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Succeeded as i32)
        .count();
    assert!(b.tokens_spent <= 1500, "spent {} of 1500", b.tokens_spent);
    assert_eq!(b.tokens_reserved, 0, "a paused job holds nothing");
    assert!(!b.overrun);
    assert_eq!(b.tokens_spent, 310 * done as u64, "every request committed");
    assert_eq!(
        e.script.count(),
        done,
        "one request per successful call, none refused"
    );
    assert!((2..6).contains(&done), "{done} of 6 fit");
    assert_eq!(r.reason, "AGENT_TOKEN_BUDGET_EXCEEDED");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_streamed_answer_becomes_gathered_llm_delta_events_before_the_call_ends() {
    let mut e = env(true, |c| {
        c.llm.providers[0].stream = true;
        c.llm.delta_max_bytes = 16;
    })
    .await;
    let text = "Streamed answers arrive piece by piece, gathered into a few events.";
    e.script.for_model(
        "m-stream",
        vec![Reply::text(text, 12, 30).chunk_delay(Duration::from_millis(2))],
    );
    let doc = r#"{"plan_id": "s", "tasks": [{"id": "a", "llm": {"model": "m-stream", "prompt": "tell"}}]}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let log = events(&mut e.jobs, &id(&job)).await;
    let call = log.iter().position(|(k, _)| k == "llm.call").unwrap();
    let deltas: Vec<&Value> = log
        .iter()
        .filter(|(k, _)| k == "llm.delta")
        .map(|(_, d)| d)
        .collect();
    assert!(
        log[call + 1..].iter().all(|(k, _)| k != "llm.delta"),
        "every piece came before the call ended"
    );
    let joined: String = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(joined, text);
    // Gathered by size: far fewer events than the stand-in's 4-byte chunks.
    assert!(
        deltas.len() > 1 && deltas.len() <= text.len() / 16 + 1,
        "{} events",
        deltas.len()
    );
    assert_eq!(deltas[0]["turn"], 1);
    assert_eq!(
        log[call].1["completion_tokens"], 30,
        "the usage of the last chunk"
    );
    assert_eq!(r.tokens_used, 42);
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn usage_beyond_the_reservation_is_an_overrun_that_stops_the_task() {
    let mut e = env(true, |_| {}).await;
    // The provider claims a 40,000-token prompt for a few words.
    e.script.for_model(
        "m-overrun",
        vec![
            Reply::tools(&[("stamp", json!({}))], 40_000, 5),
            Reply::text("never sent", 1, 1),
        ],
    );
    let doc = r#"{"plan_id": "o", "tasks": [{"id": "a",
        "llm": {"model": "m-overrun", "prompt": "x", "max_tokens": 20, "tools": [{"name": "stamp", "command": "true"}]}}]}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    // Not a budget that ran out (an extension would not help): the task
    // fails with the overrun's own reason.
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    assert_eq!(r.reason, "USAGE_OVERRUN", "{r:?}");
    assert_eq!(
        e.script.count(),
        1,
        "no call after the overrun, and no tool ran"
    );
    assert!(r.tasks[0].tool_results.is_empty());
    let log = events(&mut e.jobs, &id(&job)).await;
    let overrun: Vec<&Value> = log
        .iter()
        .filter(|(k, _)| k == "budget.overrun")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(overrun.len(), 1);
    assert_eq!(overrun[0]["used_tokens"], 40_005);
    let b = budget(&e.stack, &format!("job-{}", id(&job))).await;
    assert_eq!(b.tokens_spent, 40_005, "what was used is on the books");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_tasks_cost_limit_bounds_the_sum_of_its_model_calls() {
    // The figures below are for a provider that adds no hidden tool text.
    let mut e = env(true, |c| {
        for p in &mut c.llm.providers {
            p.tool_overhead_tokens = 0;
        }
    })
    .await;
    // Call 1 reserves about 308 µ$ and commits 225; call 2 would reserve
    // about 390 more: past the 600 µ$ limit, so it is not made.
    e.script.for_model(
        "m-cost",
        vec![
            Reply::tools(&[("stamp", json!({}))], 10, 20),
            Reply::text("never sent", 1, 1),
        ],
    );
    let doc = r#"{"plan_id": "c", "tasks": [{"id": "a", "cost_limit_usd": 0.0006,
        "llm": {"model": "m-cost", "prompt": "x", "max_tokens": 20, "tools": [{"name": "stamp", "command": "true"}]}}]}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    // The task's own limit, which no extension raises: it fails.
    assert_eq!(r.reason, "TASK_COST_LIMIT", "{r:?}");
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    assert_eq!(e.script.count(), 1);
    assert_eq!(r.cost.unwrap().micro_usd, 225);
    let refused: Vec<Value> = events(&mut e.jobs, &id(&job))
        .await
        .into_iter()
        .filter(|(k, _)| k == "budget.refused")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0]["refused_by"], "task.cost_limit");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn fallback_follows_the_order_records_model_used_and_honours_retry_after() {
    let mut e = env(true, |_| {}).await;
    e.script.for_model("gpt-4o", vec![Reply::status(429)]);
    e.script
        .for_model("claude-3.5-sonnet", vec![Reply::status(503)]);
    e.script
        .for_model("gpt-4o-mini", vec![Reply::text("from mini", 10, 2)]);
    let doc = r#"{"type": "t.ask", "args": ["hi"], "ext_agent_model": "gpt-4o", "ext_agent_max_tokens": 20,
                  "ext_agent_fallback_models": ["claude-3.5-sonnet", "gpt-4o-mini"]}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let t = task(&r, "agent");
    assert_eq!(t.model_used, "gpt-4o-mini");
    assert_eq!(output(t)["model_used"], "gpt-4o-mini");
    assert_eq!(t.attempts.len(), 1, "fallbacks are not job retries");
    assert_eq!(
        e.script.models_called(),
        ["gpt-4o", "claude-3.5-sonnet", "gpt-4o-mini"]
    );
    let calls: Vec<(String, String, String)> = events(&mut e.jobs, &id(&job))
        .await
        .into_iter()
        .filter(|(k, _)| k == "llm.call")
        .map(|(_, d)| {
            (
                d["model"].as_str().unwrap().into(),
                d["provider"].as_str().unwrap().into(),
                d["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("gpt-4o".into(), "openai".into(), "rate_limited".into()),
            (
                "claude-3.5-sonnet".into(),
                "anthropic".into(),
                "unavailable".into()
            ),
            ("gpt-4o-mini".into(), "openai".into(), "ok".into())
        ]
    );
    // The story tells the fallback, and charges the model that answered.
    let x = explain(&mut e.jobs, &id(&job)).await;
    story_says(&x, "model gpt-4o (openai) failed turn 1");
    story_says(&x, "model claude-3.5-sonnet (anthropic) failed turn 1");
    story_says(&x, "model gpt-4o-mini (openai) answered turn 1");
    story_says(
        &x,
        "The run was approved automatically by policy \"up-to-10-dollars\"",
    );
    let mini = x.by_model.iter().find(|m| m.name == "gpt-4o-mini").unwrap();
    assert_eq!((mini.calls, mini.tokens), (1, 12), "{x:?}");
    assert_eq!(x.spent_micro_usd, mini.cost_micro_usd, "{x:?}");
    assert!(x.journal.starts_with("verifies"), "{}", x.journal);
    // Another submitter, another tenant's admin and an agent key learn
    // nothing of the job.
    for (who, key) in ["carol", "mallory", "robot"]
        .into_iter()
        .zip(crate::common::outsiders(&e.stack).await)
    {
        let mut c = JobServiceClient::new(e.stack.channel_with(&key).await.unwrap());
        let err = c
            .explain_job(switchyard_proto::executor::v1::ExplainJobRequest { job_id: id(&job) })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{who}: {err:?}");
    }
    // The primary answering is recorded too.
    e.script.for_model(
        "gpt-4o",
        vec![
            Reply::status(429).retry_after("1"),
            Reply::text("after wait", 1, 1),
        ],
    );
    let doc = r#"{"type": "t.ask", "args": ["hi"], "ext_agent_model": "gpt-4o", "ext_agent_max_tokens": 20}"#;
    let started = Instant::now();
    let job = submit(&mut e.jobs, doc).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "Retry-After was honoured"
    );
    assert_eq!(task(&r, "agent").model_used, "gpt-4o");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn only_declared_tools_run_with_valid_arguments_within_their_timeout() {
    let mut e = env(true, |c| {
        c.executor.tool_timeout_ms = 300;
    })
    .await;
    let provider = Provider::default();
    let _stop = provide(&e.stack, provider.clone(), &["lookup", "secret"]).await;
    e.script.for_model(
        "m-tools",
        vec![
            Reply::tools(
                &[
                    ("lookup", json!({"q": "switchyard"})),
                    ("secret", json!({"q": "x"})),
                    ("lookup", json!({"q": 5})),
                    ("slow", json!({})),
                    ("stamp", json!({"n": 1})),
                ],
                40,
                10,
            ),
            Reply::text("all done", 80, 5),
        ],
    );
    let doc = json!({"type": "t.tools", "args": ["use the tools"], "ext_agent_model": "m-tools", "ext_agent_max_tokens": 50,
        "ext_agent_tools": [
            {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}},
            {"name": "slow", "command": "sleep", "args": ["5"]},
            {"name": "stamp", "command": "sh", "args": ["-c", "read -r line; echo \"$line\""]}
        ]})
    .to_string();
    let job = submit(&mut e.jobs, &doc).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let t = task(&r, "agent");
    let seen = tool_outcomes(t);
    assert_eq!(
        seen,
        [
            ("lookup", ""),
            ("secret", "AGENT_TOOL_NOT_FOUND"),
            ("lookup", "AGENT_TOOL_INVALID_ARGUMENTS"),
            ("slow", "AGENT_TOOL_TIMEOUT"),
            ("stamp", "")
        ]
    );
    assert_eq!(
        value_to_json(t.tool_results[0].result.as_ref().unwrap()),
        json!({"found": {"q": "switchyard"}})
    );
    // The command tool got its arguments as JSON on stdin.
    assert_eq!(
        value_to_json(t.tool_results[4].result.as_ref().unwrap()),
        json!({"n": 1})
    );
    assert_eq!(
        provider.calls(),
        ["lookup"],
        "only the valid, declared call ran"
    );
    // The model saw only the declared tools, and got every result back in order.
    let req = &e.script.received()[0].body;
    let offered: Vec<&str> = req["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["lookup", "slow", "stamp"]);
    let back = &e.script.received()[1].body["messages"];
    // user, the assistant's calls, then one result per call.
    assert_eq!(back.as_array().unwrap().len(), 1 + 1 + 5);
    assert!(
        back[3]["content"]
            .as_str()
            .unwrap()
            .contains("AGENT_TOOL_NOT_FOUND")
    );
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn tool_choice_modes_and_max_turns_end_runs_as_asked() {
    let mut e = env(true, |_| {}).await;
    e.script
        .for_model("m-required", vec![Reply::text("no tools", 5, 1)]);
    e.script
        .for_model("m-none", vec![Reply::text("plain", 5, 1)]);
    e.script
        .otherwise(Reply::tools(&[("stamp", json!({}))], 5, 1));
    let tool = r#"[{"name": "stamp", "command": "true"}]"#;
    let doc = |model: &str, choice: &str, extra: &str| {
        format!(
            r#"{{"type": "t", "args": ["x"], "ext_agent_model": "{model}", "ext_agent_max_tokens": 10,
                "ext_agent_tools": {tool}, "ext_agent_tool_choice": "{choice}" {extra}}}"#
        )
    };
    let job = submit(&mut e.jobs, &doc("m-required", "required", ""))
        .await
        .unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.reason, "AGENT_TOOL_CALL_REQUIRED", "{r:?}");

    let job = submit(&mut e.jobs, &doc("m-none", "none", ""))
        .await
        .unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32);
    let none_req = e
        .script
        .received()
        .into_iter()
        .find(|x| x.model == "m-none")
        .unwrap();
    assert!(none_req.body.get("tools").is_none(), "none offers no tools");

    let job = submit(
        &mut e.jobs,
        &doc("m-turns", "auto", r#", "ext_agent_max_turns": 3"#),
    )
    .await
    .unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.reason, "AGENT_MAX_TURNS", "{r:?}");
    assert_eq!(
        e.script
            .models_called()
            .iter()
            .filter(|m| *m == "m-turns")
            .count(),
        3
    );
    let t = task(&r, "agent");
    assert_eq!(t.tool_results.len(), 3, "partial results are kept");
    assert_eq!(t.llm_usage.unwrap().llm_calls, 3);
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn structured_output_must_parse_and_match_the_schema_with_retries_per_policy() {
    let mut e = env(true, |_| {}).await;
    e.script.for_model(
        "m-schema",
        vec![
            Reply::text(r#"{"summary": "ok", "sources": ["a"]}"#, 10, 5),
            Reply::text(r#"{"sources": "not a list"}"#, 10, 5),
            Reply::text("plain words", 10, 5),
        ],
    );
    let schema = r#"{"type": "object", "properties": {"summary": {"type": "string"}, "sources": {"type": "array"}}, "required": ["summary"]}"#;
    let doc = |retries: u32| {
        format!(
            r#"{{"plan_id": "s", "tasks": [{{"id": "a", "retry": {{"max_retries": {retries}, "backoff_strategy": "FIXED", "backoff_base_ms": 1}},
               "llm": {{"model": "m-schema", "prompt": "x", "max_tokens": 20, "output_format": "json", "output_schema": {schema}}}}}]}}"#
        )
    };
    let job = submit(&mut e.jobs, &doc(0)).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(output(task(&r, "a"))["summary"], "ok");
    assert_eq!(output(task(&r, "a"))["output"]["sources"], json!(["a"]));

    let job = submit(&mut e.jobs, &doc(1)).await.unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    let t = task(&r, "a");
    let reasons: Vec<&str> = t.attempts.iter().map(|a| a.reason.as_str()).collect();
    assert_eq!(
        reasons,
        ["AGENT_OUTPUT_SCHEMA_VIOLATION", "AGENT_OUTPUT_NOT_JSON"]
    );
    assert!(
        t.attempts[0].error.contains("sources"),
        "{}",
        t.attempts[0].error
    );
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn delegation_nests_the_budget_rolls_costs_up_and_stops_at_the_depth_limit() {
    let mut e = env(false, |_| {}).await;
    // Parent turn 1 delegates; the child's turn 1 tries to delegate again
    // (depth 2 exceeds the maximum of 1: refused, told to the model), then answers;
    // the parent then answers.
    e.script.for_model(
        "m-deleg",
        vec![
            Reply::tools(&[("delegate", json!({"task": "find the answer"}))], 100, 20),
            Reply::tools(&[("delegate", json!({"task": "deeper"}))], 50, 10),
            Reply::text("child says 42", 60, 5),
            Reply::text("parent says 42", 150, 5),
        ],
    );
    let doc = r#"{"type": "t.deleg", "args": ["what is the answer"], "ext_agent_model": "m-deleg",
                  "ext_agent_max_tokens": 100, "ext_agent_token_budget": 10000,
                  "ext_agent_max_delegation_depth": 1, "ext_agent_tools": [{"name": "delegate"}]}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    assert_eq!(
        job.state,
        JobState::Pending as i32,
        "delegation spends open-ended: a person approves"
    );
    approve(&e.stack, &job.run_id).await;
    let parent = id(&job);
    let r = finish(&mut e.jobs, &parent).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let t = task(&r, "agent");
    assert_eq!(
        output(t)["content"],
        "parent says 42",
        "{:?}",
        t.tool_results
    );
    assert_eq!(t.child_job_ids.len(), 1);
    let child_id = t.child_job_ids[0].clone();
    let child = get(&mut e.jobs, &child_id).await;
    assert_eq!(
        child.state,
        JobState::Completed as i32,
        "approved under the parent's run"
    );
    let d = child.spec.as_ref().unwrap().delegation.clone().unwrap();
    assert_eq!(
        (d.parent_job_id.as_str(), d.depth, d.max_depth),
        (parent.as_str(), 1, 1),
        "depth equal to the maximum is allowed (seed 000: only exceeding fails)"
    );
    let cr = finish(&mut e.jobs, &child_id).await;
    let ct = task(&cr, "delegated");
    assert_eq!(ct.tool_results.len(), 1);
    assert!(
        ct.tool_results[0]
            .error
            .contains("AGENT_MAX_DELEGATION_DEPTH"),
        "{:?}",
        ct.tool_results[0]
    );
    let all = all_jobs(&mut e.jobs).await;
    assert_eq!(all.len(), 2, "no grandchild was created");
    // The child's budget: nested under the parent's, with what the parent
    // had left (10000 - the 120 tokens of its first call).
    let cb = budget(&e.stack, &format!("job-{child_id}")).await;
    assert_eq!(cb.parent_id, format!("job-{parent}"));
    assert_eq!(cb.token_limit, Some(10_000 - 120));
    assert_eq!(cb.tokens_spent, 60 + 65);
    // Roll-up: the parent's budget and job count the child's tokens too.
    let pb = budget(&e.stack, &format!("job-{parent}")).await;
    assert_eq!(pb.tokens_spent, 120 + 155 + 125);
    assert_eq!(r.tokens_used, 120 + 155 + 125);
    // The parent's story names the child, and what it used; the child's
    // says whom the person approved (its parent's run, by delegation).
    let x = explain(&mut e.jobs, &parent).await;
    story_says(&x, &format!("delegated work to child job {child_id}"));
    story_says(&x, &format!("child job {child_id} ended completed, using"));
    story_says(&x, "tool delegate ran ok");
    let cx = explain(&mut e.jobs, &child_id).await;
    story_says(&cx, "approved as a delegation under run");
    // Delegating from a finished job is refused.
    let late = json!({"plan_id": "late", "delegation": {"parent_job_id": parent},
                      "tasks": [{"id": "a", "command": {"command": "true"}}]})
    .to_string();
    let err = submit(&mut e.jobs, &late).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("not active"), "{}", err.message());
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_child_job_is_cancelled_when_its_parent_stops_waiting_for_it() {
    let mut e = env(true, |_| {}).await;
    e.script.for_model(
        "m-deleg-slow",
        vec![
            Reply::tools(&[("delegate", json!({"task": "slow work"}))], 10, 5),
            Reply::text("too late", 10, 5).delay(Duration::from_secs(3)),
            Reply::text("gave up on the child", 10, 5),
        ],
    );
    let doc = r#"{"type": "t.deleg", "args": ["x"], "ext_agent_model": "m-deleg-slow", "ext_agent_max_tokens": 20,
                  "ext_agent_tool_timeout_ms": 300, "ext_agent_tools": [{"name": "delegate"}]}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    approve(&e.stack, &job.run_id).await;
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let t = task(&r, "agent");
    assert_eq!(t.tool_results[0].reason, "AGENT_TOOL_TIMEOUT");
    let child = finish(&mut e.jobs, &t.child_job_ids[0]).await;
    assert_eq!(child.state, JobState::Cancelled as i32, "{child:?}");
    e.stack.stop().await.unwrap();
}

/// A programmatic agent that hands its `task` to a child model job through
/// the SDK's `delegation::delegate`, waits up to `wait_ms` for it, and
/// answers with what the child gave back.
struct Planner {
    executor_url: String,
    token: String,
}

#[tonic::async_trait]
impl switchyard_agent_sdk::Agent for Planner {
    async fn invoke(
        &self,
        req: switchyard_agent_sdk::Invocation,
        _progress: switchyard_agent_sdk::Progress,
    ) -> switchyard_proto::agent::v1::AgentResponse {
        use switchyard_agent_sdk::{delegation, input_json, respond};
        let input = input_json(&req);
        let wait = Duration::from_millis(input["wait_ms"].as_u64().unwrap_or(10_000));
        let spec = delegation::child_job(&input, "planner".into(), |task| {
            switchyard_proto::executor::v1::LlmTask {
                model: "m-sdk".into(),
                max_tokens: Some(50),
                prompt: task,
                ..Default::default()
            }
        });
        let executor = match switchyard_kit::client::connect(&self.executor_url).await {
            Ok(ch) => switchyard_api::ExecutorClient::remote(
                switchyard_kit::client::authed(
                    ch,
                    switchyard_kit::client::Credential::bearer(&self.token).ok(),
                ),
                4 << 20,
            ),
            Err(e) => return respond::error(e.to_string()),
        };
        match delegation::delegate(&executor, &req, spec, wait).await {
            Ok(child) => match child.tool_result() {
                Ok(v) => respond::success(v.to_string(), Some(v)),
                Err(why) => respond::error(why),
            },
            Err(status) => respond::error(status.message()),
        }
    }
}

#[tokio::test]
async fn a_programmatic_agent_delegates_through_the_sdk_and_waits_within_its_bound() {
    let mut e = env(false, |_| {}).await;
    e.script.for_model(
        "m-sdk",
        vec![
            Reply::text("child done", 40, 7),
            Reply::text("slow child done", 30, 3).delay(Duration::from_millis(1500)),
        ],
    );
    let (stop, shutdown) = switchyard_kit::shutdown::channel();
    // A price makes the parent's cost non-zero, so a person approves it.
    let mut spec = crate::common::agent("planner", "plan", 90, 1_000);
    let token = e.stack.token("agents").unwrap();
    let opts = switchyard_agent_sdk::ServeOptions {
        registry_url: e.stack.url.clone(),
        credential: switchyard_kit::client::Credential::bearer(&token).ok(),
        ..Default::default()
    };
    let planner = Planner {
        executor_url: e.stack.url.clone(),
        token,
    };
    let served = tokio::spawn(async move {
        switchyard_agent_sdk::serve_until(planner, &mut spec, opts, shutdown).await
    });
    let plan = |job: &str, wait_ms: u64| {
        json!({"job_id": job, "tasks": [{"id": "plan", "retry": {"max_retries": 0}, "agent": {"capability": "plan",
               "input": {"task": "count the words", "wait_ms": wait_ms}}}]})
        .to_string()
    };

    // The child completes within the wait: its result is the agent's, and
    // its tokens roll up into the parent.
    let r = approved(&mut e, &plan("sdk-parent", 10_000)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let out = output(task(&r, "plan"));
    assert_eq!(out["state"], "completed", "{out}");
    assert_eq!(out["result"]["delegated"]["content"], "child done", "{out}");
    assert_eq!(out["tokens_used"], 47);
    let child_id = out["job_id"].as_str().unwrap().to_owned();
    let child = get(&mut e.jobs, &child_id).await;
    let d = child.spec.as_ref().unwrap().delegation.clone().unwrap();
    assert_eq!((d.parent_job_id.as_str(), d.depth), ("sdk-parent", 1));
    assert_eq!(
        child.spec.as_ref().unwrap().correlation_id,
        get(&mut e.jobs, "sdk-parent")
            .await
            .spec
            .unwrap()
            .correlation_id,
        "one correlation id across parent and child"
    );
    let pb = budget(&e.stack, "job-sdk-parent").await;
    assert_eq!(pb.tokens_spent, 47, "the child's tokens roll up");

    // The child outlives the wait: the agent is told it is still running,
    // and the child itself goes on to complete.
    let r = approved(&mut e, &plan("sdk-impatient", 200)).await;
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    assert!(
        r.tasks[0].error.contains("still running"),
        "{}",
        r.tasks[0].error
    );
    let all = all_jobs(&mut e.jobs).await;
    let slow = all
        .iter()
        .find(|j| {
            j.spec
                .as_ref()
                .and_then(|s| s.delegation.as_ref())
                .map(|d| d.parent_job_id.as_str())
                == Some("sdk-impatient")
        })
        .map(id)
        .unwrap();
    let cr = finish(&mut e.jobs, &slow).await;
    assert_eq!(cr.state, JobState::Completed as i32, "{cr:?}");
    stop.fire();
    served.await.unwrap().unwrap();
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn the_seed_000_example_runs_end_to_end_with_fallback_a_tool_and_a_schema() {
    let mut e = env(false, |_| {}).await;
    let provider = Provider::default();
    let _stop = provide(&e.stack, provider.clone(), &["web_search"]).await;
    e.script.for_model("gpt-4o", vec![Reply::status(503)]);
    e.script.for_model(
        "claude-3.5-sonnet",
        vec![
            Reply::tools(&[("web_search", json!({"query": "quantum computing 2026"}))], 300, 30),
            Reply::text(
                r#"{"summary": "Error-corrected qubits scaled up.", "sources": ["https://arxiv.org/abs/2401.00001"]}"#,
                500,
                60,
            ),
        ],
    );
    let job = submit(&mut e.jobs, SEED_000_EXAMPLE).await.unwrap();
    assert_eq!(job.state, JobState::Pending as i32);
    approve(&e.stack, &job.run_id).await;
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let log = events(&mut e.jobs, &id(&job)).await;
    nothing_before_approval(&log);
    let approved_tokens = log
        .iter()
        .find(|(k, _)| k == "approval.requested")
        .and_then(|(_, d)| d["max_tokens"].as_u64())
        .unwrap();
    let t = task(&r, "agent");
    assert_eq!(t.model_used, "claude-3.5-sonnet");
    assert_eq!(output(t)["summary"], "Error-corrected qubits scaled up.");
    assert_eq!(t.tool_results[0].name, "web_search");
    assert_eq!(provider.calls(), ["web_search"]);
    // The fallback speaks Anthropic's Messages API, tool round trip included.
    let got = e.script.received();
    assert_eq!(
        got.iter().map(|r| r.route).collect::<Vec<_>>(),
        ["chat/completions", "messages", "messages"]
    );
    let req = &got[1].body;
    assert_eq!(req["temperature"], 0.7);
    assert_eq!(req["max_tokens"], 4096);
    assert_eq!(req["tool_choice"], json!({"type": "auto"}));
    let turns = got[2].body["messages"].as_array().unwrap();
    assert_eq!(turns[1]["content"][0]["type"], "tool_use");
    assert_eq!(turns[2]["content"][0]["type"], "tool_result");
    // Usage is the provider's, never the client's ext_agent_tokens_used.
    assert_eq!(r.tokens_used, 330 + 560);
    let b = budget(&e.stack, &format!("job-{}", id(&job))).await;
    assert_eq!(b.tokens_spent, 890);
    // The job asked for 50,000 tokens; the person approved its estimate,
    // which is less: the budget holds what was approved.
    assert!(approved_tokens < 50_000, "{approved_tokens}");
    assert_eq!(b.token_limit, Some(approved_tokens));
    e.stack.stop().await.unwrap();
}

fn write_agent(dir: &std::path::Path, id: &str, yaml: &str) {
    let d = dir.join(id);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("manifest.yaml"), yaml).unwrap();
}

#[tokio::test]
async fn declarative_agents_bill_their_own_calls_see_only_their_tools_and_serve_as_tools() {
    let agents = tempfile::tempdir().unwrap();
    // The shipped example, copied, plus an agent allowed one tool.
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/summarizer");
    let d = agents.path().join("summarizer");
    std::fs::create_dir_all(d.join("prompts")).unwrap();
    for f in ["manifest.yaml", "prompts/summarizer.jinja2"] {
        std::fs::copy(example.join(f), d.join(f)).unwrap();
    }
    write_agent(
        agents.path(),
        "researcher",
        "id: researcher\nname: Researcher\ndescription: Looks things up.\ncapabilities: [research.lookup]\n\
         agent:\n  model: gpt-4o-mini\n  instructions: 'Look it up with {{ tool_name }}.'\n  uses_tools: [lookup]\n\
         config:\n  tool_name: lookup\n",
    );
    let dir = agents.path().to_path_buf();
    let mut e = env(false, move |c| {
        c.agents.dir = Some(dir);
        // Agents heartbeat every second, and add late tools then.
        c.registry.lease_ttl_secs = 3;
    })
    .await;
    // Both agents register (bills_tokens) and route.
    let mut reg = RegistryServiceClient::new(e.stack.channel().await.unwrap());
    let mut ids = Vec::new();
    for _ in 0..200 {
        ids = reg
            .list_agents(switchyard_proto::registry::v1::ListAgentsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .agents
            .into_iter()
            .filter_map(|a| a.spec)
            .filter(|s| s.bills_tokens)
            .map(|s| s.id)
            .collect::<Vec<_>>();
        if ids.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(ids, ["agent_researcher", "agent_summarizer"]);
    // The tools come up after the agents.
    let provider = Provider::default();
    let _stop = provide(&e.stack, provider.clone(), &["lookup", "secret"]).await;

    // 1. The researcher: the model asks for a tool it was not given, then its own.
    e.script.for_model(
        "gpt-4o-mini",
        vec![
            Reply::tools(&[("secret", json!({"q": "x"}))], 30, 5),
            Reply::tools(&[("lookup", json!({"q": "bills"}))], 40, 5),
            Reply::text("found it", 50, 5),
        ],
    );
    let doc = r#"{"plan_id": "r", "tasks": [{"id": "a", "agent": {"capability": "research.lookup", "input": {"task": "find bills"}}}]}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    assert_eq!(
        job.state,
        JobState::Pending as i32,
        "an agent billing its own tokens needs a person"
    );
    approve(&e.stack, &job.run_id).await;
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(output(task(&r, "a"))["content"], "found it");
    assert_eq!(provider.calls(), ["lookup"], "the unlisted tool never ran");
    let first = &e.script.received()[0].body;
    assert_eq!(first["messages"][0]["content"], "Look it up with lookup.");
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["lookup"]);
    // Billed once: by the agent on the job's budget, recorded on the task.
    let b = budget(&e.stack, &format!("job-{}", id(&job))).await;
    assert_eq!(b.tokens_spent, 35 + 45 + 55);
    assert_eq!(r.tokens_used, 135);

    // 2. Agent-as-tool: an LLM task calls agent_summarizer, which calls the model.
    e.script.clear_received();
    e.script.for_model(
        "gpt-4o",
        vec![
            Reply::tools(
                &[(
                    "agent_summarizer",
                    json!({"task": "summarize: the ledger ships in March"}),
                )],
                70,
                10,
            ),
            Reply::text("The summary is in.", 90, 5),
        ],
    );
    e.script.for_model(
        "gpt-4o-mini",
        vec![Reply::text("Ledger ships in March.", 40, 8)],
    );
    let doc = r#"{"type": "t.orchestrate", "args": ["get a summary"], "ext_agent_model": "gpt-4o",
                  "ext_agent_max_tokens": 50, "ext_agent_agents": ["text.summary"]}"#;
    let job = submit(&mut e.jobs, doc).await.unwrap();
    approve(&e.stack, &job.run_id).await;
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let t = task(&r, "agent");
    assert_eq!(t.tool_results[0].name, "agent_summarizer");
    let got = value_to_json(t.tool_results[0].result.as_ref().unwrap());
    assert_eq!(got["content"], "Ledger ships in March.");
    let first = &e.script.received()[0].body;
    let tool = &first["tools"][0]["function"];
    assert_eq!(tool["name"], "agent_summarizer");
    assert!(
        tool["description"]
            .as_str()
            .unwrap()
            .starts_with("Use this agent to summarize")
    );
    // The summarizer's system prompt was rendered from its template.
    let sub = e
        .script
        .received()
        .into_iter()
        .find(|x| x.model == "gpt-4o-mini")
        .unwrap();
    assert!(
        sub.body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("concise summary")
    );
    let kinds: HashMap<String, usize> =
        events(&mut e.jobs, &id(&job))
            .await
            .into_iter()
            .fold(HashMap::new(), |mut m, (k, _)| {
                *m.entry(k).or_default() += 1;
                m
            });
    assert!(kinds.contains_key("routing.decision"), "{kinds:?}");
    assert!(kinds.contains_key("budget.billed_by_agent"), "{kinds:?}");
    assert_eq!(r.tokens_used, 80 + 95 + 48);

    // 3. The researcher registered before `lookup` existed; its registration
    // gains the tool at a heartbeat, and the registry then protects it.
    let mut uses = Vec::new();
    for _ in 0..100 {
        uses = reg
            .get_agent(GetAgentRequest {
                agent_id: "agent_researcher".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .agent
            .and_then(|a| a.spec)
            .unwrap()
            .uses_tools;
        if !uses.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(uses, ["lookup"]);
    let err = reg
        .deregister_tool(DeregisterToolRequest {
            name: "lookup".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("agent_researcher"),
        "{}",
        err.message()
    );
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn an_agent_whose_tool_name_is_taken_is_refused_at_start() {
    let e = env(false, |_| {}).await;
    let _stop = provide(&e.stack, Provider::default(), &["agent_summarizer"]).await;
    let cfg = switchyard_cli::Config {
        llm: llm_config("http://127.0.0.1:9/v1"),
        ..Default::default()
    };
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    let credential =
        switchyard_kit::client::Credential::bearer(&e.stack.token("agents").unwrap()).ok();
    let llm = Llm::new(&cfg.llm).unwrap();
    let hosted =
        switchyard_cli::agents::host(&cfg, &examples, Some(&e.stack.url), credential, llm).unwrap();
    let err = hosted.check_collisions().await.unwrap_err().to_string();
    assert!(
        err.contains("agent_summarizer") && err.contains("already has that name"),
        "{err}"
    );
    e.stack.stop().await.unwrap();
}

/// `POST path` with an OJS body as `token` on the stack's HTTP door.
async fn ojs_get(s: &Stack, path: &str, token: &str) -> (u16, Value) {
    switchyard_kit::tls::install_crypto();
    let resp = reqwest::Client::new()
        .get(format!("http://{}{path}", s.http.unwrap()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap())
}

async fn ojs_post(s: &Stack, path: &str, token: &str, body: Value) -> (u16, Value) {
    switchyard_kit::tls::install_crypto();
    let resp = reqwest::Client::new()
        .post(format!("http://{}{path}", s.http.unwrap()))
        .bearer_auth(token)
        .header("content-type", "application/openjobspec+json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap())
}

#[tokio::test]
async fn over_ojs_an_approver_activates_a_pending_llm_job_and_a_too_small_budget_calls_no_model() {
    let mut e = env(false, |_| {}).await;
    let (alice, bob) = (
        e.stack.token("alice").unwrap(),
        e.stack.token("bob").unwrap(),
    );
    // A job Switchyard runs (type switchyard.*): it may spend, so it waits.
    let tight = json!({"type": "switchyard.ask", "args": ["Say fine"], "ext_agent_model": "gpt-4o",
                       "ext_agent_max_tokens": 500, "ext_agent_token_budget": 100,
                       "meta": {"team": "docs"}});
    let (code, v) = ojs_post(&e.stack, "/ojs/v1/jobs", &alice, tight).await;
    assert_eq!(
        (code, v["job"]["state"].as_str()),
        (201, Some("pending")),
        "{v}"
    );
    let job_id = v["job"]["id"].as_str().unwrap().to_owned();
    let activate = format!("/ojs/v1/jobs/{job_id}/activate");

    // Activating is approving: not the submitter's to do.
    let (code, v) = ojs_post(&e.stack, &activate, &alice, json!({})).await;
    assert_eq!(code, 403, "{v}");
    let (code, v) = ojs_post(&e.stack, &activate, &bob, json!({})).await;
    assert_eq!(code, 200, "{v}");
    assert_ne!(v["job"]["state"], "pending", "moved on once approved: {v}");
    // Its envelope comes back as submitted.
    assert_eq!(v["job"]["args"], json!(["Say fine"]), "{v}");
    assert_eq!(v["job"]["meta"], json!({"team": "docs"}), "{v}");

    // Its budget cannot hold one call: refused before any model request,
    // and paused (OJS `retryable`, seed 000) until a person extends it.
    let r = crate::common::until_paused(&mut e.jobs, &job_id).await;
    assert_eq!(r.reason, "AGENT_TOKEN_BUDGET_EXCEEDED");
    assert_eq!(e.script.count(), 0, "no model request");
    let (code, v) = ojs_get(&e.stack, &format!("/ojs/v1/jobs/{job_id}"), &alice).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (
            v["job"]["state"].as_str(),
            v["job"]["ext_agent_state"].as_str()
        ),
        (Some("retryable"), Some("budget_paused")),
        "{v}"
    );
    let pause = &v["job"]["ext_agent_budget_pause"];
    assert_eq!(pause["dimension"], "tokens", "{v}");
    assert_eq!(pause["remaining_tasks"], json!(["agent"]), "{v}");
    let (code, v) = ojs_post(&e.stack, &activate, &bob, json!({})).await;
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{v}"
    );

    // Deeper than the delegation limit: refused at the door.
    let deep = json!({"type": "switchyard.ask", "args": ["x"], "ext_agent_model": "gpt-4o",
                      "ext_agent_delegation_depth": 4, "ext_agent_max_delegation_depth": 3});
    let (code, v) = ojs_post(&e.stack, "/ojs/v1/jobs", &alice, deep).await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(
        v["error"]["details"]["reason"],
        "AGENT_MAX_DELEGATION_DEPTH"
    );
    e.stack.stop().await.unwrap();
}

/// Seed ADR 003 acceptance 3, measured: moving tools behind an agent
/// shrinks what an orchestrator is offered by those tools' entries less
/// the agent's, and the summary's figures are what the model receives.
#[tokio::test]
async fn moving_tools_behind_an_agent_shrinks_the_offer_by_their_entries_as_the_model_receives_them()
 {
    use switchyard_proto::registry::v1::GetCapabilitiesSummaryRequest;
    let mut e = env(true, |_| {}).await;
    let names = [
        "lookup_order",
        "refund_order",
        "track_parcel",
        "change_address",
    ];
    let _stop = provide(&e.stack, Provider::default(), &names).await;
    let mut reg = RegistryServiceClient::new(e.stack.channel().await.unwrap());
    let mut orders = crate::common::agent("orders", "orders.manage", 80, 0);
    orders.description = "Use this agent for anything about an order: look it up, refund it, \
                          track its parcel or change its address."
        .into();
    orders.uses_tools = names.iter().map(|n| (*n).to_owned()).collect();
    crate::common::register(&mut reg, orders).await;
    let summary = |tools: &[&str], agents: &[&str]| GetCapabilitiesSummaryRequest {
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        agents: agents.iter().map(|a| (*a).to_owned()).collect(),
        only_named: true,
    };
    let before = reg
        .get_capabilities_summary(summary(&names, &[]))
        .await
        .unwrap()
        .into_inner();
    let after = reg
        .get_capabilities_summary(summary(&[], &["orders"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((before.tools.len(), before.agents.len()), (4, 0));
    assert_eq!((after.tools.len(), after.agents.len()), (0, 1));
    let moved: u64 = before.tools.iter().map(|t| t.prompt_tokens).sum();
    let agent = after.agents[0].prompt_tokens;
    assert_eq!(before.prompt_tokens, moved);
    assert_eq!(after.prompt_tokens, agent);
    assert!(
        after.prompt_tokens < before.prompt_tokens,
        "{before:?} {after:?}"
    );
    // Nothing named, nothing listed (not everything).
    let none = reg
        .get_capabilities_summary(summary(&[], &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (none.tools.len(), none.agents.len(), none.prompt_tokens),
        (0, 0, 0)
    );

    // The same two orchestrators, run: each offer on the wire costs what
    // the summary said.
    e.script.for_model(
        "m-offer",
        vec![Reply::text("done", 10, 2), Reply::text("done", 10, 2)],
    );
    let tools: Vec<Value> = names.iter().map(|n| json!({"name": n})).collect();
    let direct = json!({"type": "t.offer", "args": ["help"], "ext_agent_model": "m-offer",
        "ext_agent_max_tokens": 20, "ext_agent_tools": tools});
    let behind = json!({"type": "t.offer", "args": ["help"], "ext_agent_model": "m-offer",
        "ext_agent_max_tokens": 20, "ext_agent_agents": ["orders"]});
    for doc in [direct, behind] {
        let job = submit(&mut e.jobs, &doc.to_string()).await.unwrap();
        if job.state == JobState::Pending as i32 {
            approve(&e.stack, &job.run_id).await;
        }
        let r = finish(&mut e.jobs, &id(&job)).await;
        assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    }
    let sent: Vec<u64> = e
        .script
        .received()
        .iter()
        .map(|x| {
            x.body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let f = &t["function"];
                    switchyard_core::offer::tool_prompt_tokens(
                        f["name"].as_str().unwrap(),
                        f["description"].as_str().unwrap(),
                        &f["parameters"],
                    )
                })
                .sum()
        })
        .collect();
    assert_eq!(sent, [before.prompt_tokens, after.prompt_tokens]);
    e.stack.stop().await.unwrap();
}

/// Seed ADR 003 phase 3, loop limits: a chain of delegations has a time to
/// live as well as a depth. A child's deadline is at most the TTL after the
/// chain's first delegation and never past its parent's, however deep the
/// chain goes; once a parent's time is up, delegating from it is refused
/// with DEADLINE_EXCEEDED and nothing is created.
#[tokio::test]
async fn a_delegation_chain_lives_no_longer_than_its_ttl_or_its_parents_deadline() {
    let mut e = env(false, |c| {
        c.executor.delegation_ttl_secs = 600;
        c.executor.commands.push("sleep".into());
    })
    .await;
    let secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let sleeper = |id: &str, parent: Option<&str>, deadline: Option<i64>| {
        let mut doc = json!({"job_id": id,
            "tasks": [{"id": "a", "command": {"command": "sleep", "args": ["30"]}}]});
        if let Some(p) = parent {
            doc["delegation"] = json!({"parent_job_id": p});
        }
        if let Some(d) = deadline {
            doc["deadline"] = json!(d);
        }
        doc.to_string()
    };
    let deadline_of = |j: &Job| j.spec.as_ref().unwrap().deadline.map(|t| t.seconds);
    let before = secs();
    submit(&mut e.jobs, &sleeper("root", None, None))
        .await
        .unwrap();
    crate::common::until_event(&mut e.jobs, "root", "task.attempt").await;
    let child = submit(&mut e.jobs, &sleeper("child", Some("root"), None))
        .await
        .unwrap();
    let end = deadline_of(&child).expect("a delegated job gets the chain's deadline");
    assert!((before + 600..=secs() + 600).contains(&end), "{end}");
    crate::common::until_event(&mut e.jobs, "child", "task.attempt").await;
    // Deeper, or asking for later: never past the chain's end.
    let grandchild = submit(
        &mut e.jobs,
        &sleeper("grandchild", Some("child"), Some(end + 3600)),
    )
    .await
    .unwrap();
    assert_eq!(deadline_of(&grandchild), Some(end));
    // Asking for earlier is kept.
    let sooner = submit(
        &mut e.jobs,
        &sleeper("sooner", Some("root"), Some(secs() + 100)),
    )
    .await
    .unwrap();
    assert!(deadline_of(&sooner).unwrap() < end);

    // A parent whose time is up (its task still running) may not delegate.
    let short = secs() + 1;
    submit(&mut e.jobs, &sleeper("short", None, Some(short)))
        .await
        .unwrap();
    crate::common::until_event(&mut e.jobs, "short", "task.attempt").await;
    while secs() <= short {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = submit(&mut e.jobs, &sleeper("late", Some("short"), None))
        .await
        .unwrap_err();
    let api = switchyard_kit::error::ApiError::from(late.clone());
    assert_eq!(api.reason.as_deref(), Some("DEADLINE_EXCEEDED"), "{late:?}");
    assert!(
        late.message().contains("delegation chain's time ran out"),
        "{late:?}"
    );
    let listed = all_jobs(&mut e.jobs).await;
    assert!(
        !listed
            .iter()
            .any(|j| j.spec.as_ref().unwrap().job_id == "late")
    );
    // The sleepers end here, not in the node's drain: stopping is not
    // what this test is about.
    for id in ["grandchild", "sooner", "child", "root"] {
        e.jobs
            .cancel_job(switchyard_proto::executor::v1::CancelJobRequest {
                job_id: id.into(),
                reason: "the test is over".into(),
            })
            .await
            .unwrap();
        finish(&mut e.jobs, id).await;
    }
    e.stack.stop().await.unwrap();
}
