//! LLM tasks: the shared agent loop ([`switchyard_llm::agent`]) run with
//! the job's budget, the job's events and the task's tools.
//!
//! Tools a task may run are exactly those it declares (`ext_agent_tools`)
//! and the agents it lists (`ext_agent_agents`, offered as `agent_<id>`).
//! A declared tool runs as its allowlisted `command`, through the
//! registry's provider of that name (ToolService), or as the built-in
//! `delegate`, which creates a child job.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_agent_sdk::delegation;
use switchyard_api::spend::Hold;
use switchyard_core::Reason;
use switchyard_core::validate::capability_under;
use switchyard_kit::context;
use switchyard_kit::error::ApiError;
use switchyard_kit::json::{json_to_struct, json_to_value, struct_to_json, value_to_json};
use switchyard_llm::agent::{self, Host, LoopEvent, Refusal};
use switchyard_llm::{BoxFuture, ToolChoice, ToolSpec, Usage};
use switchyard_proto::executor::v1::{
    AgentTask, Delegation, LlmTask, LlmUsage, SubmitJobRequest, TaskStatus, ToolDefinition,
    ToolResult,
};
use switchyard_proto::registry::v1::{
    FindByCapabilityRequest, GetAgentRequest, ListAgentsRequest, ListToolsRequest,
};

use super::{Attempt, NotHeld, Outcome, Purpose, Snapshot, Spender};
use crate::depend::Service;
use crate::events::{self, JobEvent};
use crate::schedule::Class;
use crate::{Executor, command};

/// An LLM task's outputs: the answer (and its structured fields), the model
/// that gave it, every tool call and the usage.
fn llm_status(task_id: &str, report: &agent::Report, children: Vec<String>) -> TaskStatus {
    let mut output = json!({"content": report.content});
    if let Some(v) = &report.output {
        output["output"] = v.clone();
        if let (Some(o), Some(fields)) = (output.as_object_mut(), v.as_object()) {
            for (k, v) in fields {
                o.entry(k.clone()).or_insert(v.clone());
            }
        }
    }
    output["model_used"] = json!(report.model_used);
    // `length`: the answer was cut at max_tokens (still an answer).
    if !report.finish_reason.is_empty() {
        output["finish_reason"] = json!(report.finish_reason);
    }
    let tool_results = report
        .tool_results
        .iter()
        .map(|t| ToolResult {
            call_id: t.call_id.clone(),
            name: t.name.clone(),
            arguments: t.arguments.clone(),
            result: t.result.as_ref().map(json_to_value),
            error: t.error.clone(),
            reason: t.reason.clone(),
            turn: t.turn,
            duration_ms: t.duration_ms,
        })
        .collect();
    TaskStatus {
        task_id: task_id.to_owned(),
        output: json_to_struct(&output),
        model_used: report.model_used.clone(),
        tool_results,
        llm_usage: Some(LlmUsage {
            prompt_tokens: report.usage.prompt_tokens,
            completion_tokens: report.usage.completion_tokens,
            total_tokens: report.usage.total_tokens,
            llm_calls: report.llm_calls,
            turns: report.turns,
        }),
        child_job_ids: children,
        ..Default::default()
    }
}

/// A declared tool as offered to the model, and how it runs: the built-in
/// `delegate`, an allowlisted command, a registered provider, or nothing.
pub(crate) fn declared_tool(
    t: &ToolDefinition,
    registered: &HashMap<String, switchyard_proto::registry::v1::Tool>,
) -> (ToolSpec, Route) {
    let declared = t.parameters.as_ref().map(struct_to_json);
    let object = || json!({"type": "object"});
    let provider = registered.get(&t.name).filter(|r| !r.endpoint.is_empty());
    let mcp = registered.get(&t.name).filter(|r| !r.mcp_server.is_empty());
    let (route, parameters) = if t.name == delegation::TOOL && t.command.is_empty() {
        (
            Route::Delegate,
            declared.unwrap_or_else(delegation::tool_schema),
        )
    } else if !t.command.is_empty() {
        (Route::Command(t.clone()), declared.unwrap_or_else(object))
    } else if let Some(r) = provider {
        let p = declared
            .or_else(|| r.parameters.as_ref().map(struct_to_json))
            .unwrap_or_else(object);
        (Route::Provider(r.endpoint.clone()), p)
    } else if let Some(r) = mcp {
        let p = declared
            .or_else(|| r.parameters.as_ref().map(struct_to_json))
            .unwrap_or_else(object);
        (Route::Mcp, p)
    } else {
        (Route::Missing, declared.unwrap_or_else(object))
    };
    let description = match (&route, t.description.is_empty()) {
        (_, false) => t.description.clone(),
        (Route::Delegate, true) => delegation::TOOL_DESCRIPTION.to_owned(),
        _ => registered
            .get(&t.name)
            .map(|r| r.description.clone())
            .unwrap_or_default(),
    };
    let spec = ToolSpec {
        name: t.name.clone(),
        description,
        parameters,
    };
    (spec, route)
}

/// How one offered tool runs.
#[derive(Debug, Clone)]
pub(crate) enum Route {
    /// An allowlisted command: arguments on stdin, stdout back.
    Command(ToolDefinition),
    /// A registered tool provider's ToolService.
    Provider(String),
    /// A tool of a registered MCP server, called through the registry.
    Mcp,
    /// An agent, through routing and the budget.
    Agent {
        agent_id: String,
        capability: String,
        /// The capability's unit price, micro-USD.
        price: i64,
    },
    /// The built-in child-job tool.
    Delegate,
    /// Hand the conversation to this agent (handoff mode).
    Handoff {
        agent_id: String,
        capability: String,
    },
    /// Declared, but nothing runs it (the model is told so).
    Missing,
}

/// What one run of the loop did.
pub(crate) struct Ran {
    /// Its report (also when it failed).
    pub(crate) report: agent::Report,
    /// How it failed, if it did.
    pub(crate) failure: Option<crate::schedule::Failure>,
    /// The child jobs it created.
    pub(crate) children: Vec<String>,
    /// The handoff it ended with, if the model handed the conversation off.
    pub(crate) handoff: Option<HandoffTo>,
}

/// One turn of a conversation: its message and what was said before.
pub(crate) struct Turn {
    /// The conversation so far (user and assistant messages in turn).
    pub(crate) history: Vec<switchyard_llm::Message>,
    /// The message to answer.
    pub(crate) text: String,
    /// Offer the orchestrator its handoff agents (`handoff_<id>`).
    pub(crate) handoffs: bool,
    /// The message answered: agents the orchestrator calls during the turn
    /// are accounted to the conversation under it.
    pub(crate) seq: u32,
}

/// The orchestrator's call of `handoff_<id>`: who takes the conversation,
/// on which capability, with what task.
#[derive(Debug, Clone)]
pub(crate) struct HandoffTo {
    pub(crate) agent_id: String,
    pub(crate) capability: String,
    pub(crate) task: String,
}

/// The loop's host for one attempt of one LLM task.
struct TaskHost<'a> {
    x: &'a Executor,
    job_id: &'a str,
    snap: &'a Snapshot,
    llm_task: &'a LlmTask,
    routes: HashMap<String, Route>,
    scratch: &'a Path,
    children: std::sync::Mutex<Vec<String>>,
    spender: Spender<'a>,
    /// Tools whose calls wait for a person's approval.
    gated: HashSet<String>,
    /// The handoff the model asked for, if it did (the loop then ends).
    handoff: std::sync::Mutex<Option<HandoffTo>>,
    /// The conversation message this run of the loop answers, if it does.
    seq: Option<u32>,
    /// The policy facts every call of this loop shares: its job and the
    /// submitter it acts for.
    facts: switchyard_policy::Facts,
    /// The provider rate-limit claims of its model calls.
    claims: switchyard_api::spend::RateClaims,
}

impl Attempt<'_> {
    /// One attempt of an LLM task.
    pub(crate) async fn llm(&self, l: &LlmTask) -> Outcome {
        let (report, failure, children) = match self.run_loop(l, None).await {
            Ok(ran) => (ran.report, ran.failure, ran.children),
            Err(out) => return out,
        };
        let failure = match failure {
            Some(f) => Some(f),
            None => self.answer_artifact(l, &report),
        };
        Outcome {
            failure,
            status: Some(llm_status(&self.snap.task.id, &report, children)),
            settled: None,
        }
    }

    /// One run of the agent loop for `l` (from the attempt's checkpoint,
    /// if it has one), or for one turn of a conversation: what it did,
    /// how it failed, and the child jobs it created.
    pub(crate) async fn run_loop(&self, l: &LlmTask, turn: Option<Turn>) -> Result<Ran, Outcome> {
        let (x, snap) = (self.x, self.snap);
        let from = match turn {
            None => snap.resume.as_deref().cloned(),
            Some(_) => None,
        };
        let seq = turn.as_ref().map(|t| t.seq);
        let (spec, routes, gated) = self.loop_spec(l, turn).await?;
        if let Err(e) = x
            .inner
            .book
            .durable_for(&snap.job_id, snap.start_g, snap.lease)
            .await
        {
            return Err(Outcome::fail(
                Class::Other,
                Reason::StorageFailure,
                e.to_string(),
            ));
        }
        let host = TaskHost {
            x,
            job_id: &snap.job_id,
            snap,
            llm_task: l,
            routes,
            scratch: self.scratch,
            children: Default::default(),
            spender: self.spender(),
            gated,
            handoff: Default::default(),
            seq,
            facts: x.job_facts(&snap.job_id, &l.model),
            claims: Default::default(),
        };
        let ran = agent::resume(&x.inner.clients.llm, &spec, &host, from).await;
        let children = host.children.lock().map(|c| c.clone()).unwrap_or_default();
        let (report, failure) = match ran {
            Ok(r) => (r, None),
            Err(f) => {
                let class = match f.reason {
                    Reason::AgentTokenBudgetExceeded | Reason::AgentCostBudgetExceeded => {
                        Class::Budget
                    }
                    // The task's own limit, or a provider that bills past
                    // its hold: neither an extension nor a retry helps.
                    Reason::TaskCostLimit | Reason::UsageOverrun => Class::Permanent,
                    Reason::AgentTimeBudget | Reason::DeadlineExceeded => Class::Timeout,
                    Reason::LlmProviderNotConfigured => Class::Permanent,
                    _ => Class::Other,
                };
                let failure = crate::schedule::Failure {
                    class,
                    reason: f.reason,
                    error: f.message,
                };
                (*f.report, Some(failure))
            }
        };
        let handoff = host.handoff.lock().ok().and_then(|mut h| h.take());
        Ok(Ran {
            report,
            failure,
            children,
            handoff,
        })
    }

    /// Keeps the answer as the artifact the task asks for (`ext_agent_artifact`):
    /// the structured answer as JSON, else the text. A refusal fails the task.
    fn answer_artifact(&self, l: &LlmTask, r: &agent::Report) -> Option<crate::schedule::Failure> {
        let a = l.artifact.as_ref()?;
        let task = &self.snap.task.id;
        let (content, media, ext) = match &r.output {
            Some(v) => (
                serde_json::to_vec_pretty(v).unwrap_or_default(),
                "application/json",
                "json",
            ),
            None => (r.content.clone().into_bytes(), "text/markdown", "md"),
        };
        let new = switchyard_proto::common::v1::NewArtifact {
            name: if a.name.is_empty() {
                format!("{task}.{ext}")
            } else {
                a.name.clone()
            },
            kind: a.kind,
            media_type: media.to_owned(),
            content,
        };
        self.x
            .keep_artifacts(&self.snap.job_id, task, std::slice::from_ref(&new))
            .err()
            .and_then(|e| super::artifact_refused(e).failure)
    }

    /// What the loop runs for this attempt: the task's templates resolved,
    /// its tools offered, its limits and the executor's defaults.
    async fn loop_spec(
        &self,
        l: &LlmTask,
        turn: Option<Turn>,
    ) -> Result<(agent::Spec, HashMap<String, Route>, HashSet<String>), Outcome> {
        let (snap, timeout) = (self.snap, self.timeout);
        let text = |s: &str| snap.resolve_text(s);
        // A person's message is taken as written: templates in it are text.
        let (prompt, history, handoffs) = match turn {
            Some(t) => (Ok(t.text), t.history, t.handoffs),
            None => (text(&l.prompt), Vec::new(), false),
        };
        let (prompt, instructions) = match (prompt, text(&l.instructions)) {
            (Ok(p), Ok(i)) => (p, i),
            (Err(e), _) | (_, Err(e)) => {
                return Err(Outcome::fail(
                    Class::Permanent,
                    Reason::TemplateUnresolved,
                    e,
                ));
            }
        };
        let (mut tools, mut routes, gated) = self
            .offered_tools(l)
            .await
            .map_err(|e| Outcome::fail(Class::Other, Reason::Unavailable, e))?;
        if handoffs {
            for wanted in &l.agents {
                for (spec, route) in self.handoff_tools(wanted).await {
                    if !routes.contains_key(&spec.name) {
                        routes.insert(spec.name.clone(), route);
                        tools.push(spec);
                    }
                }
            }
        }
        let cfg = &self.x.inner.cfg;
        let time_budget = if l.time_budget_ms > 0 {
            Duration::from_millis(l.time_budget_ms).min(timeout)
        } else {
            timeout
        };
        let or = |v: u64, default: u64| if v == 0 { default } else { v };
        let mut chain = vec![l.model.clone()];
        chain.extend(l.fallback_models.iter().cloned());
        let spec = agent::Spec {
            chain,
            provider: l.provider.clone(),
            instructions,
            prompt,
            tools,
            tool_choice: ToolChoice::parse(&l.tool_choice).unwrap_or_default(),
            temperature: l.temperature,
            max_tokens: l.max_tokens.unwrap_or(cfg.llm_default_max_tokens),
            json: l.output_format == "json",
            output_schema: l.output_schema.as_ref().map(struct_to_json),
            max_turns: or(u64::from(l.max_turns), u64::from(cfg.llm_max_turns)) as u32,
            max_tokens_per_invocation: l.max_tokens_per_invocation,
            deadline: Instant::now() + time_budget,
            history,
            tool_timeout: Duration::from_millis(or(l.tool_timeout_ms, cfg.tool_timeout_ms)),
        };
        Ok((spec, routes, gated))
    }

    /// The tools a task offers its model, how each runs, and which need a
    /// person's approval per call: its declared tools, then the agents it
    /// lists.
    async fn offered_tools(
        &self,
        l: &LlmTask,
    ) -> Result<(Vec<ToolSpec>, HashMap<String, Route>, HashSet<String>), String> {
        let registered = self.registered_tools(l).await?;
        let policy = &self.x.inner.cfg.tool_approval;
        let mut specs = Vec::new();
        let mut routes = HashMap::new();
        let mut gated = HashSet::new();
        for t in &l.tools {
            let (spec, route) = declared_tool(t, &registered);
            let marked = registered.get(&t.name).is_some_and(|r| r.requires_approval);
            if t.requires_approval || marked || policy.names(&t.name) {
                gated.insert(t.name.clone());
            }
            specs.push(spec);
            routes.insert(t.name.clone(), route);
        }
        for wanted in &l.agents {
            for (spec, route, price) in self.agents_as_tools(wanted).await {
                if !routes.contains_key(&spec.name) {
                    let costly = policy.above_micro_usd.is_some_and(|above| price > above);
                    if costly || policy.names(&spec.name) {
                        gated.insert(spec.name.clone());
                    }
                    routes.insert(spec.name.clone(), route);
                    specs.push(spec);
                }
            }
        }
        Ok((specs, routes, gated))
    }

    /// The registry's tools that `l` declares by name only (no command).
    /// Unknown names are not an error here: the model is told when it calls one.
    async fn registered_tools(
        &self,
        l: &LlmTask,
    ) -> Result<HashMap<String, switchyard_proto::registry::v1::Tool>, String> {
        let wanted: Vec<&str> = l
            .tools
            .iter()
            .filter(|t| t.command.is_empty() && t.name != delegation::TOOL)
            .map(|t| t.name.as_str())
            .collect();
        if wanted.is_empty() {
            return Ok(HashMap::new());
        }
        let registry = &self.x.inner.clients.registry;
        let all = self
            .spender()
            .waiter()
            .call(Service::Registry, || {
                registry.list_tools(ListToolsRequest { names: Vec::new() })
            })
            .await
            .map_err(|e| format!("registry: {}", e.message()))?;
        Ok(all
            .tools
            .into_iter()
            .filter(|t| wanted.contains(&t.name.as_str()))
            .map(|t| (t.name.clone(), t))
            .collect())
    }

    /// The handoff-mode agents among `wanted` (an id, else a capability) as
    /// tools `handoff_<id>`: calling one hands the conversation to it.
    async fn handoff_tools(&self, wanted: &str) -> Vec<(ToolSpec, Route)> {
        let handoff = switchyard_proto::agent::v1::IntegrationMode::Handoff as i32;
        self.find_agents(wanted)
            .await
            .into_iter()
            .filter_map(|a| a.spec.filter(|s| s.integration_mode == handoff))
            .map(|s| {
                let capability = s
                    .capabilities
                    .first()
                    .map(|c| c.name.clone())
                    .unwrap_or_default();
                let spec = ToolSpec {
                    name: switchyard_core::validate::handoff_tool_name(&s.id),
                    description: format!(
                        "Hand the conversation to {}: it talks with the person until it is done. {}",
                        s.id,
                        s.description.trim()
                    ),
                    parameters: json!({
                        "type": "object",
                        "properties": {"task": {"type": "string", "description": "What the agent is to do with the person (it sees nothing else of the conversation so far)"}},
                        "required": ["task"]
                    }),
                };
                let route = Route::Handoff {
                    agent_id: s.id.clone(),
                    capability,
                };
                (spec, route)
            })
            .collect()
    }

    /// The registered agents `wanted` names: by id, else by capability;
    /// `prefix.*` names every available agent offering a capability under
    /// `prefix` (agents published later, like a builder's, are found at
    /// the next turn).
    async fn find_agents(&self, wanted: &str) -> Vec<switchyard_proto::registry::v1::Agent> {
        let registry = &self.x.inner.clients.registry;
        if let Some(prefix) = wanted.strip_suffix(".*") {
            let waiter = self.spender().waiter();
            let all = ListAgentsRequest {
                page_size: 1000,
                status: switchyard_proto::registry::v1::AgentStatus::Available as i32,
                ..Default::default()
            };
            let listed = waiter
                .call(Service::Registry, || registry.list_agents(all.clone()))
                .await
                .map(|r| r.agents)
                .unwrap_or_default();
            return listed
                .into_iter()
                .filter(|a| {
                    a.spec.as_ref().is_some_and(|s| {
                        s.capabilities
                            .iter()
                            .any(|c| capability_under(&c.name, prefix))
                    })
                })
                .collect();
        }
        let by_id = GetAgentRequest {
            agent_id: wanted.to_owned(),
        };
        let waiter = self.spender().waiter();
        match waiter
            .call(Service::Registry, || registry.get_agent(by_id.clone()))
            .await
        {
            Ok(a) => a.agent.into_iter().collect::<Vec<_>>(),
            Err(_) => waiter
                .call(Service::Registry, || {
                    registry.find_by_capability(FindByCapabilityRequest {
                        capability: wanted.to_owned(),
                        include_unavailable: false,
                    })
                })
                .await
                .map(|r| r.agents)
                .unwrap_or_default(),
        }
    }

    /// Agent `wanted` (an id, else a capability) as tools `agent_<id>`,
    /// with the price of a call (the capability's unit price); handoff
    /// agents take over a conversation and are not tools.
    async fn agents_as_tools(&self, wanted: &str) -> Vec<(ToolSpec, Route, i64)> {
        let handoff = switchyard_proto::agent::v1::IntegrationMode::Handoff as i32;
        self.find_agents(wanted)
            .await
            .into_iter()
            .filter_map(|a| a.spec.filter(|s| s.integration_mode != handoff))
            .map(|s| {
                let chosen = s
                    .capabilities
                    .iter()
                    .find(|c| {
                        capability_under(&c.name, wanted.strip_suffix(".*").unwrap_or(wanted))
                    })
                    .or_else(|| s.capabilities.first());
                let capability = chosen.map(|c| c.name.clone()).unwrap_or_default();
                let price = chosen.map_or(0, |c| c.price_per_unit_micro_usd);
                let spec = ToolSpec {
                    name: switchyard_core::validate::agent_tool_name(&s.id),
                    description: s.description.trim().to_owned(),
                    parameters: switchyard_core::offer::agent_tool_parameters(),
                };
                let route = Route::Agent {
                    agent_id: s.id.clone(),
                    capability,
                    price,
                };
                (spec, route, price)
            })
            .collect()
    }
}

impl TaskHost<'_> {
    fn task_id(&self) -> &str {
        &self.snap.task.id
    }

    async fn run_command(&self, def: &ToolDefinition, args: Value) -> Result<Value, String> {
        let x = self.x;
        let cfg = &x.inner.cfg;
        let ready = x
            .prepare_command(&def.command, self.scratch, None)
            .map_err(|f| f.error)?;
        let env = x.command_env(
            self.job_id,
            self.task_id(),
            self.scratch,
            &Default::default(),
        );
        let limits = command::Limits {
            // A backstop: the loop's tool timeout usually ends the call
            // first, and dropping the run kills the whole process group.
            timeout: Duration::from_millis(cfg.tool_timeout_ms.max(self.llm_task.tool_timeout_ms)),
            grace: Duration::from_millis(cfg.kill_grace_ms),
            cap: cfg.max_output_bytes,
        };
        let stdin = args.to_string().into_bytes();
        let done = command::run(
            &ready.program,
            &def.command,
            &def.args,
            &env,
            self.scratch,
            Some(stdin),
            &limits,
            ready.jail,
            &|_, _| {},
        )
        .await
        .map_err(|e| e.to_string())?;
        let out = String::from_utf8_lossy(&done.stdout).trim().to_owned();
        if let Some(l) = command::limits::hit(&done) {
            return Err(command::limits::describe(
                &def.command,
                l,
                &ready.limits,
                &done,
            ));
        }
        if done.exit_code != Some(0) {
            let err = String::from_utf8_lossy(&done.stderr);
            return Err(format!(
                "{} exited with {:?}: {}",
                def.command,
                done.exit_code,
                err.trim().chars().take(300).collect::<String>()
            ));
        }
        Ok(serde_json::from_str(&out).unwrap_or(Value::String(out)))
    }

    async fn run_provider(
        &self,
        endpoint: &str,
        name: &str,
        call_id: &str,
        args: Value,
    ) -> Result<Value, String> {
        let channel = self
            .x
            .inner
            .tool_channels
            .get(endpoint)
            .map_err(|e| e.to_string())?;
        switchyard_agent_sdk::tools::call(
            channel,
            self.x.inner.max_message_bytes,
            name,
            call_id,
            &args,
            self.snap.correlation(),
        )
        .await
    }

    async fn run_mcp(&self, name: &str, call_id: &str, args: Value) -> Result<Value, String> {
        let book = &self.x.inner.book;
        let progress = |p: switchyard_agent_sdk::tools::McpProgress| {
            let ev = events::ToolProgress {
                call_id: call_id.to_owned(),
                name: name.to_owned(),
                progress: p.progress,
                total: p.total,
                message: p.message,
            };
            book.note(self.job_id, self.task_id(), JobEvent::ToolProgress(ev));
        };
        switchyard_agent_sdk::tools::call_mcp(
            &self.x.inner.clients.registry,
            name,
            call_id,
            &args,
            self.snap.correlation(),
            &progress,
        )
        .await
    }

    async fn run_agent(
        &self,
        agent_id: &str,
        capability: &str,
        call_id: &str,
        args: Value,
    ) -> Result<Value, String> {
        let mut input = args.get("input").cloned().unwrap_or_else(|| json!({}));
        if let Some(o) = input.as_object_mut() {
            o.insert(
                "task".into(),
                args.get("task").cloned().unwrap_or(Value::Null),
            );
        }
        let task = AgentTask {
            capability: capability.into(),
            prefer_agents: vec![agent_id.into()],
            ..Default::default()
        };
        let mut snap = self.snap.clone_for_call(call_id);
        snap.task.name = args
            .get("task")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let left = Duration::from_millis(
            self.x
                .inner
                .cfg
                .tool_timeout_ms
                .max(self.llm_task.tool_timeout_ms),
        );
        let call = Attempt {
            x: self.x,
            snap: &snap,
            timeout: left,
            scratch: self.scratch,
        };
        let before = super::handoff::task_spent(self.x, self.snap);
        let out = call.agent(&task, input).await;
        // In a conversation, what the agent spent is its own (per-agent
        // totals): the task's spend moved only by this call meanwhile.
        if let Some(seq) = self.seq {
            let after = super::handoff::task_spent(self.x, self.snap);
            let (tokens, cost) = (
                after.0.saturating_sub(before.0),
                after.1.saturating_sub(before.1),
            );
            let ev = match &out.failure {
                None => JobEvent::AgentResult(events::AgentResult {
                    agent_id: agent_id.to_owned(),
                    seq,
                    tokens,
                    cost_micro_usd: cost,
                    handback: false,
                }),
                Some(f) => JobEvent::AgentError(events::AgentFailed {
                    agent_id: agent_id.to_owned(),
                    seq,
                    status: if f.reason == Reason::AgentRefused {
                        "refused"
                    } else {
                        "error"
                    }
                    .to_owned(),
                    reason: f.reason.as_str().to_owned(),
                    error: f.error.clone(),
                    tokens,
                    cost_micro_usd: cost,
                }),
            };
            self.x.inner.book.note(self.job_id, self.task_id(), ev);
        }
        match (out.failure, out.status) {
            (None, Some(s)) => Ok(s.output.as_ref().map(struct_to_json).unwrap_or(Value::Null)),
            (Some(f), _) => Err(format!("{}: {}", f.reason, f.error)),
            (None, None) => Err("the agent returned nothing".into()),
        }
    }

    /// The built-in `delegate` tool: a child job, waited for.
    async fn delegate(&self, args: Value) -> Result<Value, String> {
        let child = self.submit_child(&args).await?;
        let book = &self.x.inner.book;
        // Wait for the child (the loop's tool timeout bounds the wait). If
        // the wait is abandoned — the tool call timed out, or this task was
        // cancelled — the child is cancelled too: nobody would read it.
        let mut abandon = Abandon {
            x: self.x.clone(),
            child: Some(child.clone()),
            parent: self.job_id.to_owned(),
        };
        let Some(state) = crate::watch::until_finished(book, &child)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Err("the executor is shutting down".into());
        };
        abandon.child = None;
        let state = crate::job::proto_job_state(state);
        let result = book.result(&child).await.map_err(|e| e.to_string())?;
        let settled = delegation::ChildResult {
            job_id: child.clone(),
            state,
            result: result.result.as_ref().map_or(Value::Null, value_to_json),
            tokens_used: result.tokens_used,
            cost_micro_usd: result.cost.map_or(0, |m| m.micro_usd),
            error: format!("{} {}", result.reason, result.error),
        };
        let child_settled = events::ChildSettled {
            child_job_id: child,
            state: state.as_str_name().to_owned(),
            tokens: settled.tokens_used,
            cost_micro_usd: settled.cost_micro_usd,
        };
        let ev = JobEvent::ChildSettled(child_settled);
        book.note(self.job_id, self.task_id(), ev);
        settled.tool_result()
    }

    /// Submits the child job `args` asks for; returns its id. Without a
    /// capability the child is the same kind of model task, with the task
    /// as its prompt (and the same tools, so it may delegate in turn, down
    /// to the depth limit).
    async fn submit_child(&self, args: &Value) -> Result<String, String> {
        let name = format!("delegated-by-{}", self.job_id);
        let mut spec = delegation::child_job(args, name, |task| LlmTask {
            prompt: task,
            ..self.llm_task.clone()
        });
        spec.correlation_id = self.snap.correlation_id.clone();
        spec.tasks[0].timeout_secs = self.snap.task.timeout_secs;
        spec.delegation = Some(Delegation {
            parent_job_id: self.job_id.into(),
            ..Default::default()
        });
        let req = SubmitJobRequest {
            spec: Some(spec),
            ..Default::default()
        };
        let corr = self.snap.correlation_id.clone();
        let created = self
            .x
            .submit(req, None, corr, context::outgoing_traceparent())
            .await
            .map_err(|e| {
                let api = ApiError::from(tonic::Status::from(e));
                format!("{}: {}", api.reason.unwrap_or_default(), api.message)
            })?;
        let child = created
            .job
            .and_then(|j| j.spec)
            .map(|s| s.job_id)
            .unwrap_or_default();
        if let Ok(mut c) = self.children.lock() {
            c.push(child.clone());
        }
        let delegated = events::Delegated {
            child_job_id: child.clone(),
        };
        let book = &self.x.inner.book;
        book.note(self.job_id, self.task_id(), JobEvent::Delegated(delegated));
        Ok(child)
    }
}

/// Cancels a child job whose parent stopped waiting for it.
struct Abandon {
    x: Executor,
    child: Option<String>,
    parent: String,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let (x, why) = (
                self.x.clone(),
                format!("job {} stopped waiting for it", self.parent),
            );
            tokio::spawn(async move {
                let _ = x.cancel(&child, &why, None).await;
            });
        }
    }
}

impl TaskHost<'_> {
    /// Releases the holds of no money that claimed room for later calls of
    /// a model call, each with its claim.
    async fn release_extras(&self, extras: Vec<(String, switchyard_proto::ledger::v1::RateClaim)>) {
        for (hold, claim) in extras {
            let hold = Hold::resume(&self.x.inner.clients.ledger, &hold).with_rate(Some(claim));
            self.spender
                .release(&hold, "room claimed for a later call of the chain")
                .await;
        }
    }

    /// Tells the ledger that `call`'s provider refused for rate, or said in
    /// its rate-limit headers that nothing is left: every replica's calls
    /// through its key wait as long as the provider said (or the ledger's
    /// default cooldown). Sent on its own: the loop does not wait for it.
    fn cool_down(&self, call: &switchyard_llm::CallRecord) {
        let llm = &self.x.inner.clients.llm;
        let req = switchyard_proto::ledger::v1::CoolDownRequest {
            rate: Some(switchyard_proto::ledger::v1::RateClaim {
                provider: call.provider.clone(),
                model: call.model.clone(),
                key: llm.key_of(&call.provider),
                tokens: 0,
            }),
            wait: (call.retry_after_ms > 0)
                .then(|| switchyard_kit::time::duration(call.retry_after_ms)),
            why: match (call.outcome.as_str(), call.retry_after_ms) {
                ("rate_limited", 0) => format!("{} answered 429 for {}", call.provider, call.model),
                ("rate_limited", ms) => format!(
                    "{} answered 429 for {}, Retry-After {ms} ms",
                    call.provider, call.model
                ),
                (_, ms) => format!(
                    "{} said its rate limit has nothing left for {} ms (answering {})",
                    call.provider, ms, call.model
                ),
            },
        };
        let ledger = self.x.inner.clients.ledger.clone();
        tokio::spawn(async move {
            if let Err(e) = ledger.cool_down(req).await {
                tracing::warn!(error = %e.message(), "the ledger did not take a provider's cooldown");
            }
        });
    }
}

impl TaskHost<'_> {
    /// Runs a tool call where its name routes it.
    async fn route_tool(&self, name: &str, call_id: &str, args: Value) -> Result<Value, String> {
        match self.routes.get(name) {
            Some(Route::Command(def)) => self.run_command(def, args).await,
            Some(Route::Provider(endpoint)) => {
                self.run_provider(endpoint, name, call_id, args).await
            }
            Some(Route::Mcp) => self.run_mcp(name, call_id, args).await,
            Some(Route::Agent {
                agent_id,
                capability,
                ..
            }) => self.run_agent(agent_id, capability, call_id, args).await,
            Some(Route::Delegate) => self.delegate(args).await,
            Some(Route::Handoff {
                agent_id,
                capability,
            }) => {
                let task = args
                    .get("task")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let mut h = self.handoff.lock().map_err(|e| e.to_string())?;
                if h.is_some() {
                    return Err("the conversation is already handed off in this turn".to_owned());
                }
                *h = Some(HandoffTo {
                    agent_id: agent_id.clone(),
                    capability: capability.clone(),
                    task,
                });
                Ok(json!({"handed_off_to": agent_id}))
            }
            Some(Route::Missing) | None => Err(format!(
                "{}: tool {name:?} has no provider: register it with the registry (RegisterTool with an endpoint) or give it a command",
                Reason::ToolNotFound
            )),
        }
    }
}

impl Host for TaskHost<'_> {
    fn aim(&self, _call: u32, t: &switchyard_llm::Target) {
        self.claims.aim(&t.provider, &t.model, &t.key);
    }

    fn admit<'a>(&'a self, t: &'a switchyard_llm::Target) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let (call, claim) = self.claims.again(&t.provider, &t.model, &t.key);
            let n = (self.claims.extras() + 1).to_string();
            let key = self.spender.key(&["llm", &call.to_string(), "again", &n]);
            let note = format!("{} call {call}: room for {}", self.llm_task.model, t.model);
            let purpose = Purpose::ModelCall(call, Some(claim.clone()));
            match self.spender.reserve(purpose, 0, 0, key, note).await {
                Ok(h) => {
                    self.claims.extra(h.id(), claim);
                    Ok(())
                }
                Err(
                    NotHeld::RateLimited(m)
                    | NotHeld::CostLimit(m)
                    | NotHeld::Budget(m, _)
                    | NotHeld::Unavailable(m)
                    | NotHeld::Unreachable(m),
                ) => Err(m),
            }
        })
    }

    fn reserve(&self, call: u32, tokens: u64, cost: i64) -> BoxFuture<'_, Result<String, Refusal>> {
        Box::pin(async move {
            let key = self.spender.key(&["llm", &call.to_string()]);
            let note = format!("{} call {call}", self.llm_task.model);
            let rate = self.claims.claim(call, tokens);
            let held = self
                .spender
                .reserve(
                    Purpose::ModelCall(call, rate.clone()),
                    tokens,
                    cost,
                    key,
                    note,
                )
                .await;
            match held {
                Ok(h) => {
                    self.claims.held(h.id(), rate);
                    Ok(h.id().to_owned())
                }
                Err(NotHeld::RateLimited(m)) => Err(Refusal::RateLimited(m)),
                Err(NotHeld::CostLimit(m)) => {
                    Err(Refusal::Limit(format!("model call {call}: {m}")))
                }
                Err(NotHeld::Budget(m, reason)) => Err(Refusal::budget(&m, reason, call)),
                Err(NotHeld::Unavailable(m) | NotHeld::Unreachable(m)) => {
                    Err(Refusal::Unavailable(m))
                }
            }
        })
    }

    fn commit<'a>(
        &'a self,
        hold: &'a str,
        model: &'a str,
        usage: Usage,
        cost: i64,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let prices = self
                .x
                .inner
                .clients
                .llm
                .entry_prices(model, &self.llm_task.provider);
            let entry = switchyard_api::spend::llm_entry(
                self.task_id(),
                &format!("llm:{model}"),
                model,
                (
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.total_tokens,
                ),
                prices,
            );
            let (rate, extras) = self.claims.settle(hold, Some(model), usage.total_tokens);
            self.release_extras(extras).await;
            let hold = Hold::resume(&self.x.inner.clients.ledger, hold).with_rate(rate);
            self.spender
                .commit(&hold, usage.total_tokens, cost, entry)
                .await;
        })
    }

    fn release<'a>(&'a self, hold: &'a str, why: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let (rate, extras) = self.claims.settle(hold, None, 0);
            self.release_extras(extras).await;
            let hold = Hold::resume(&self.x.inner.clients.ledger, hold).with_rate(rate);
            self.spender.release(&hold, why).await;
        })
    }

    fn call_tool<'a>(
        &'a self,
        name: &'a str,
        call_id: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, String>> {
        let kind = match self.routes.get(name) {
            Some(Route::Command(_) | Route::Provider(_)) => "function",
            _ => "extension",
        };
        let span = crate::spans::execute_tool(self.snap, name, call_id, kind);
        let call = self.route_tool(name, call_id, args);
        Box::pin(async move {
            let r = tracing::Instrument::instrument(call, span.clone()).await;
            if r.is_err() {
                crate::spans::failed(&span, "tool_error");
            }
            r
        })
    }

    fn event(&self, event: LoopEvent) {
        // A 429, or an answer whose rate-limit headers say nothing is left:
        // the key cools down for every replica.
        if let LoopEvent::LlmCall(c) = &event
            && (c.call.outcome == "rate_limited" || c.call.retry_after_ms > 0)
        {
            self.cool_down(&c.call);
        }
        let ev = match event {
            LoopEvent::LlmCall(c) => JobEvent::LlmCalled(c),
            LoopEvent::ToolCall(t) => JobEvent::ToolCalled(t),
            LoopEvent::Delta(d) => JobEvent::LlmDelta(d),
            LoopEvent::Overrun(o) => JobEvent::Overrun(o),
        };
        self.x.inner.book.note(self.job_id, self.task_id(), ev);
    }

    fn streams(&self) -> bool {
        true
    }

    fn rule(&self, name: &str, args: &Value) -> agent::Rule {
        use switchyard_policy::{Action, Verdict};
        // A handoff is decided as one, on the agent that would take over.
        let (action, resource) = match self.routes.get(name) {
            Some(Route::Handoff { agent_id, .. }) => (Action::HandOff, agent_id.clone()),
            _ => (Action::CallTool, name.to_owned()),
        };
        let facts = switchyard_policy::Facts {
            action,
            resource,
            arguments: args.as_object().cloned().unwrap_or_default(),
            now_ms: self.x.inner.book.now(),
            // What is left when the model asks, not when the task began.
            remaining: self.x.job_remaining(self.job_id),
            ..self.facts.clone()
        };
        let decision = self.x.decide(&facts);
        let rule = match decision.verdict {
            Verdict::Forbid { .. } => agent::Rule::Forbidden(decision.explain()),
            // A policy's requirement, or the job's own gate: a person
            // decides (and the approval service asks for as many as the
            // policies say).
            Verdict::Require { .. } => agent::Rule::Ask,
            _ if self.gated.contains(name) => agent::Rule::Ask,
            _ => agent::Rule::Run,
        };
        let decided = switchyard_policy::Recorded::of(&decision, facts);
        let ev = JobEvent::PolicyDecided(Box::new(decided));
        self.x.inner.book.note(self.job_id, self.task_id(), ev);
        rule
    }

    fn finished(&self) -> bool {
        self.handoff.lock().is_ok_and(|h| h.is_some())
    }

    fn gate<'a>(&'a self, at: &'a agent::Checkpoint) -> BoxFuture<'a, agent::Gate> {
        Box::pin(async move {
            // What the call costs, when Switchyard knows: a command spends
            // nothing, an agent its price; other tools' costs are their own.
            let name = at
                .pending
                .first()
                .map(|c| c.name.as_str())
                .unwrap_or_default();
            let price = match self.routes.get(name) {
                Some(Route::Command(_)) => Some(0),
                Some(Route::Agent { price, .. }) => Some(*price),
                _ => None,
            };
            let gate = super::gate::CallGate {
                x: self.x,
                snap: self.snap,
                model: &self.llm_task.model,
                waiter: self.spender.waiter(),
                price,
            };
            gate.ask(at).await
        })
    }
}
