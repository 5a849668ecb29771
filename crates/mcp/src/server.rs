//! Switchyard as an MCP server: tools for an MCP host (an IDE, a desktop
//! assistant, another agent) to validate and submit jobs, follow them, read
//! their results and cost, list agents and capabilities, and list the runs
//! waiting for approval. Nothing here can approve: approving is a person's
//! act in the approval service, never a tool.
//!
//! Every call is made over gRPC *as the principal whose credential the
//! server holds* — `switchyard mcp` (stdio) runs with its user's key; the
//! gateway's `/mcp` endpoint forwards each HTTP request's own bearer token
//! — so Switchyard's table, tenancy and ownership rules apply exactly as to
//! a direct call.

use std::time::Duration;

use futures_util::StreamExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Map, Value, json};
use switchyard_api::{ApprovalClient, ExecutorClient, RegistryClient};
use switchyard_kit::client::{Credential, authed};
use switchyard_kit::error::ApiError;
use switchyard_kit::json::{struct_to_json, value_to_json};
use switchyard_proto::approval::v1::{GetRunRequest, ListRunsRequest, Run, RunStatus};
use switchyard_proto::executor::v1::*;
use switchyard_proto::registry::v1::{Agent, GetCapabilitiesSummaryRequest, ListAgentsRequest};

/// Longest wait a tool call may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Most events one `watch_job` call returns.
const MAX_EVENTS: usize = 500;

/// Whose credential a call carries.
#[derive(Debug, Clone)]
pub enum Identity {
    /// One credential for every call (`switchyard mcp` on stdio).
    Fixed(Credential),
    /// The bearer token of the HTTP request that carries the call (the
    /// gateway authenticated it before the request reached the server).
    PerRequest,
}

/// Where Switchyard's services answer (one URL in `switchyard dev`).
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// The executor's gRPC URL.
    pub executor: String,
    /// The registry's gRPC URL.
    pub registry: String,
    /// The approval service's gRPC URL.
    pub approval: String,
}

impl Endpoints {
    /// Every service at `url`.
    pub fn single(url: &str) -> Endpoints {
        Endpoints {
            executor: url.into(),
            registry: url.into(),
            approval: url.into(),
        }
    }
}

/// The MCP server: one per session (rmcp's HTTP service makes one per
/// session; stdio has one).
#[derive(Debug, Clone)]
pub struct SwitchyardMcp {
    channels: [tonic::transport::Channel; 3],
    identity: Identity,
    max_message_bytes: usize,
}

/// The clients of one call, carrying its caller's credential.
pub(crate) struct Clients {
    pub(crate) jobs: ExecutorClient,
    registry: RegistryClient,
    approval: ApprovalClient,
}

impl SwitchyardMcp {
    /// A server calling `endpoints` with `identity`.
    pub fn new(
        endpoints: &Endpoints,
        identity: Identity,
        max_message_bytes: usize,
    ) -> Result<SwitchyardMcp, String> {
        let ch = |u: &str| switchyard_kit::client::lazy_channel(u).map_err(|e| e.to_string());
        Ok(SwitchyardMcp::with_channels(
            [
                ch(&endpoints.executor)?,
                ch(&endpoints.registry)?,
                ch(&endpoints.approval)?,
            ],
            identity,
            max_message_bytes,
        ))
    }

    /// A server calling the executor, registry and approval services over
    /// `channels` (in that order), which carry no credential of their own.
    pub fn with_channels(
        channels: [tonic::transport::Channel; 3],
        identity: Identity,
        max_message_bytes: usize,
    ) -> SwitchyardMcp {
        SwitchyardMcp {
            channels,
            identity,
            max_message_bytes,
        }
    }

    /// The clients of a call carried by the HTTP request `parts` (none on
    /// stdio), with its credential.
    pub(crate) fn clients(&self, parts: Option<&http::request::Parts>) -> Result<Clients, String> {
        let credential = match &self.identity {
            Identity::Fixed(c) => c.clone(),
            Identity::PerRequest => {
                let token = parts
                    .and_then(|p| p.headers.get(http::header::AUTHORIZATION))
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .ok_or("the request carries no bearer token")?;
                Credential::bearer(token.trim()).map_err(|_| "the bearer token is malformed")?
            }
        };
        let [x, r, a] = self.channels.clone();
        let max = self.max_message_bytes;
        Ok(Clients {
            jobs: ExecutorClient::remote(authed(x, Some(credential.clone())), max),
            registry: RegistryClient::remote(authed(r, Some(credential.clone())), max),
            approval: ApprovalClient::remote(authed(a, Some(credential)), max),
        })
    }
}

/// The tools, each with its description and input schema (every revision
/// of the protocol lists the same).
pub(crate) fn tools() -> Vec<Tool> {
    let schema = |v: Value| match v {
        Value::Object(m) => std::sync::Arc::new(m),
        _ => std::sync::Arc::new(Map::new()),
    };
    let job_id = json!({"type": "string", "description": "The job's id."});
    let wait = json!({"type": "integer", "minimum": 0, "maximum": 60000,
        "description": "Wait up to this many milliseconds for the job to end (default 0)."});
    let document = json!({"type": "string", "description": "The job: a native JobSpec, an AGEniX envelope, an AITP task or an OJS job, as JSON or YAML."});
    vec![
        Tool::new(
            "validate_job",
            "Check a job without running it: every validation rule, the execution order, the worst-case cost and tokens, and where each agent task would be routed.",
            schema(
                json!({"type": "object", "properties": {"document": document}, "required": ["document"]}),
            ),
        ),
        Tool::new(
            "submit_job",
            "Submit a job. A job that can spend waits for a person to approve it (state pending); nothing is spent before. Returns the job id, its state, its approval run and correlation id.",
            schema(
                json!({"type": "object", "properties": {"document": document, "wait_ms": wait}, "required": ["document"]}),
            ),
        ),
        Tool::new(
            "get_job",
            "A job's state, progress, tasks (state, agent, error), cost and tokens so far.",
            schema(
                json!({"type": "object", "properties": {"job_id": job_id}, "required": ["job_id"]}),
            ),
        ),
        Tool::new(
            "watch_job",
            "Follow a job: its events after a sequence number, up to max_events, waiting up to wait_ms for new ones. Call again with next_after_sequence to continue.",
            schema(json!({"type": "object", "properties": {"job_id": job_id,
                "after_sequence": {"type": "integer", "minimum": 0, "description": "Return events after this sequence (default 0: from the start)."},
                "max_events": {"type": "integer", "minimum": 1, "maximum": MAX_EVENTS, "description": "Most events to return (default 100)."},
                "wait_ms": wait}, "required": ["job_id"]})),
        ),
        Tool::new(
            "get_result",
            "A job's result: each task's outputs and errors, the total cost and tokens, and how long it ran.",
            schema(
                json!({"type": "object", "properties": {"job_id": job_id, "wait_ms": wait}, "required": ["job_id"]}),
            ),
        ),
        Tool::new(
            "cancel_job",
            "Cancel a job; running tasks are stopped.",
            schema(json!({"type": "object", "properties": {"job_id": job_id,
                "reason": {"type": "string", "description": "Why, recorded on the job."}}, "required": ["job_id"]})),
        ),
        Tool::new(
            "list_agents",
            "Registered agents: capabilities, trust, price, status.",
            schema(
                json!({"type": "object", "properties": {"capability": {"type": "string", "description": "Only agents offering this capability."}}}),
            ),
        ),
        Tool::new(
            "list_capabilities",
            "The tools and agents a model could be offered, each with its description.",
            schema(json!({"type": "object", "properties": {}})),
        ),
        Tool::new(
            "list_pending_approvals",
            "Runs waiting for a person's approval: intent, who proposed it, model, token cap and cost estimate. Approving is not a tool: a person does it.",
            schema(json!({"type": "object", "properties": {}})),
        ),
    ]
}

fn arg_str<'a>(args: &'a Map<String, Value>, k: &str) -> Result<&'a str, String> {
    args.get(k)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{k} is required (a string)"))
}

fn arg_u64(args: &Map<String, Value>, k: &str) -> Option<u64> {
    args.get(k).and_then(Value::as_u64)
}

fn wait_of(args: &Map<String, Value>) -> Option<prost_types::Duration> {
    let ms = arg_u64(args, "wait_ms").filter(|ms| *ms > 0)?;
    let d = Duration::from_millis(ms).min(MAX_WAIT);
    Some(prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

fn money(m: Option<&switchyard_proto::common::v1::Money>) -> Value {
    let micro = m.map_or(0, |m| m.micro_usd);
    json!({"micro_usd": micro, "usd": format!("{}.{:06}", micro / 1_000_000, (micro % 1_000_000).abs())})
}

fn state_name(s: &str) -> String {
    s.rsplit_once("_STATE_")
        .map_or(s, |(_, n)| n)
        .to_ascii_lowercase()
}

fn task_json(t: &TaskStatus) -> Value {
    let state =
        TaskState::try_from(t.state).map_or("unknown".into(), |s| state_name(s.as_str_name()));
    let mut v = json!({"task_id": t.task_id, "state": state, "agent_id": t.agent_id,
        "attempts": t.attempts.len(), "tokens_used": t.tokens_used, "cost": money(t.cost.as_ref())});
    if !t.error.is_empty() {
        v["reason"] = json!(t.reason);
        v["error"] = json!(t.error);
    }
    v
}

pub(crate) fn job_json(j: &Job) -> Value {
    let spec = j.spec.clone().unwrap_or_default();
    let state =
        JobState::try_from(j.state).map_or("unknown".into(), |s| state_name(s.as_str_name()));
    let mut v = json!({"job_id": spec.job_id, "state": state, "run_id": j.run_id,
        "correlation_id": spec.correlation_id, "submitted_by": j.submitted_by,
        "progress": j.progress.as_ref().map(|p| json!({"percent": p.percent_complete, "current_step": p.current_step, "total_steps": p.total_steps})),
        "cost_so_far": money(j.cost_so_far.as_ref()), "tokens_used": j.tokens_used,
        "tasks": j.tasks.iter().map(task_json).collect::<Vec<_>>()});
    if !j.error.is_empty() {
        v["reason"] = json!(j.reason);
        v["error"] = json!(j.error);
    }
    v
}

pub(crate) fn result_json(r: &GetResultResponse) -> Value {
    let state =
        JobState::try_from(r.state).map_or("unknown".into(), |s| state_name(s.as_str_name()));
    json!({"job_id": r.job_id, "state": state, "cost": money(r.cost.as_ref()), "tokens_used": r.tokens_used,
        "execution_time_ms": r.execution_time_ms, "reason": r.reason, "error": r.error,
        "result": r.result.as_ref().map(value_to_json),
        "tasks": r.tasks.iter().map(|t| {
            let mut v = task_json(t);
            v["output"] = t.output.as_ref().map(struct_to_json).unwrap_or(Value::Null);
            v
        }).collect::<Vec<_>>()})
}

fn run_json(r: &Run) -> Value {
    let est = r.cost_estimate.unwrap_or_default();
    json!({"run_id": r.run_id, "job_id": r.job_id, "intent": r.intent, "created_by": r.created_by,
        "model": r.model, "max_tokens": r.max_tokens, "tools_allowed": r.tools_allowed,
        "outputs_allowed": r.outputs_allowed,
        "estimated_cost": money(est.estimated_cost.as_ref()),
        "estimated_tokens": est.estimated_input_tokens + est.estimated_output_tokens})
}

fn agent_json(a: &Agent) -> Value {
    let s = a.spec.clone().unwrap_or_default();
    json!({"agent_id": s.id, "name": s.name, "description": s.description,
        "status": if a.status == switchyard_proto::registry::v1::AgentStatus::Available as i32 { "available" } else { "lapsed" },
        "trust_score": s.trust_score, "a2a": s.a2a.is_some(),
        "capabilities": s.capabilities.iter().map(|c| json!({"name": c.name,
            "price": money(Some(&switchyard_proto::common::v1::Money { micro_usd: c.price_per_unit_micro_usd })), "unit": c.unit})).collect::<Vec<_>>()})
}

/// What a refused call tells the model: the reason code and the message.
pub(crate) fn refused(s: tonic::Status) -> String {
    let e = ApiError::from(s);
    match e.reason {
        Some(r) => format!("{r}: {}", e.message),
        None => e.message,
    }
}

impl SwitchyardMcp {
    /// Runs tool `name` (the job tools here, the rest in
    /// [`Self::directory`]); `Err` is a tool error the model reads.
    pub(crate) async fn run(
        &self,
        name: &str,
        args: &Map<String, Value>,
        parts: Option<&http::request::Parts>,
    ) -> Result<Value, String> {
        let c = self.clients(parts)?;
        match name {
            "validate_job" => {
                let req = ValidateJobRequest {
                    document: arg_str(args, "document")?.into(),
                    ..Default::default()
                };
                let v = c.jobs.validate_job(req).await.map_err(refused)?;
                Ok(
                    json!({"valid": true, "format": v.source_format, "order": v.order,
                    "estimated_cost": money(v.estimated_cost.as_ref()), "estimated_tokens": v.estimated_tokens,
                    "context_hash": v.context_hash, "warnings": v.warnings,
                    "routes": v.routes.iter().map(|r| json!({"task_id": r.task_id, "agent_id": r.agent_id, "score": r.score})).collect::<Vec<_>>()}),
                )
            }
            "submit_job" => {
                let req = SubmitJobRequest {
                    document: arg_str(args, "document")?.into(),
                    wait: wait_of(args),
                    ..Default::default()
                };
                let r = c.jobs.submit_job(req).await.map_err(refused)?;
                let mut v = job_json(&r.job.unwrap_or_default());
                v["created"] = json!(r.created);
                if let Some(res) = &r.result {
                    v["result"] = result_json(res);
                }
                Ok(v)
            }
            "get_job" => {
                let req = GetJobRequest {
                    job_id: arg_str(args, "job_id")?.into(),
                };
                let j = c.jobs.get_job(req).await.map_err(refused)?;
                Ok(job_json(&j.job.unwrap_or_default()))
            }
            "get_result" => {
                let req = GetResultRequest {
                    job_id: arg_str(args, "job_id")?.into(),
                    wait: wait_of(args),
                };
                let r = c.jobs.get_result(req).await.map_err(refused)?;
                Ok(result_json(&r))
            }
            "watch_job" => self.watch(&c, args).await,
            "cancel_job" => {
                let req = CancelJobRequest {
                    job_id: arg_str(args, "job_id")?.into(),
                    reason: args
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or("cancelled through MCP")
                        .into(),
                };
                let j = c.jobs.cancel_job(req).await.map_err(refused)?;
                Ok(job_json(&j.job.unwrap_or_default()))
            }
            other => self.directory(&c, other, args).await,
        }
    }

    /// Where approval run `run_id` stands in Switchyard's approval record,
    /// read as the caller: `proposed`, `approved`, `rejected`, ...
    pub(crate) async fn run_status(
        &self,
        run_id: &str,
        parts: Option<&http::request::Parts>,
    ) -> Result<String, String> {
        let c = self.clients(parts)?;
        let req = GetRunRequest {
            run_id: run_id.into(),
        };
        let run = c.approval.get_run(req).await.map_err(refused)?.run;
        let status = run.map_or(0, |r| r.status);
        Ok(RunStatus::try_from(status).map_or("unknown".into(), |s| {
            s.as_str_name()
                .trim_start_matches("RUN_STATUS_")
                .to_ascii_lowercase()
        }))
    }

    /// The tools that read the registry and the approval service.
    async fn directory(
        &self,
        c: &Clients,
        name: &str,
        args: &Map<String, Value>,
    ) -> Result<Value, String> {
        match name {
            "list_agents" => {
                let req = ListAgentsRequest {
                    capability: args
                        .get("capability")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    ..Default::default()
                };
                let r = c.registry.list_agents(req).await.map_err(refused)?;
                Ok(json!({"agents": r.agents.iter().map(agent_json).collect::<Vec<_>>()}))
            }
            "list_capabilities" => {
                let r = c
                    .registry
                    .get_capabilities_summary(GetCapabilitiesSummaryRequest::default())
                    .await
                    .map_err(refused)?;
                let item = |i: &switchyard_proto::registry::v1::SummaryItem| json!({"name": i.name, "description": i.description});
                Ok(
                    json!({"tools": r.tools.iter().map(item).collect::<Vec<_>>(),
                    "agents": r.agents.iter().map(item).collect::<Vec<_>>()}),
                )
            }
            "list_pending_approvals" => {
                let req = ListRunsRequest {
                    statuses: vec![RunStatus::Proposed as i32],
                    ..Default::default()
                };
                let r = c.approval.list_runs(req).await.map_err(refused)?;
                Ok(json!({"runs": r.runs.iter().map(run_json).collect::<Vec<_>>()}))
            }
            other => Err(format!("no tool {other:?}")),
        }
    }

    /// `watch_job`: events after a sequence, bounded in count and time.
    async fn watch(&self, c: &Clients, args: &Map<String, Value>) -> Result<Value, String> {
        let job_id = arg_str(args, "job_id")?.to_owned();
        let after = arg_u64(args, "after_sequence").unwrap_or(0);
        let most = arg_u64(args, "max_events").map_or(100, |n| (n as usize).clamp(1, MAX_EVENTS));
        let wait = Duration::from_millis(arg_u64(args, "wait_ms").unwrap_or(0)).min(MAX_WAIT);
        let req = WatchJobRequest {
            job_id: job_id.clone(),
            after_sequence: after,
            ..Default::default()
        };
        let mut stream = c.jobs.watch_job(req).await.map_err(refused)?;
        let mut events = Vec::new();
        let (mut last, mut ended) = (after, false);
        // Whatever is already there, then new events until `wait` is up.
        let deadline = tokio::time::Instant::now() + wait;
        while events.len() < most {
            let next = if events.is_empty() || tokio::time::Instant::now() < deadline {
                tokio::time::timeout_at(
                    deadline.max(tokio::time::Instant::now() + Duration::from_millis(50)),
                    stream.next(),
                )
                .await
            } else {
                tokio::time::timeout(Duration::from_millis(50), stream.next()).await
            };
            match next {
                Err(_) => break,
                Ok(None) => {
                    ended = true;
                    break;
                }
                Ok(Some(Err(s))) => return Err(refused(s)),
                Ok(Some(Ok(m))) => {
                    if let Some(e) = m.event {
                        last = e.sequence;
                        events.push(
                            json!({"sequence": e.sequence, "kind": e.kind, "task_id": e.task_id,
                            "data": e.data.as_ref().map(struct_to_json).unwrap_or(Value::Null)}),
                        );
                    }
                }
            }
        }
        Ok(
            json!({"job_id": job_id, "events": events, "next_after_sequence": last, "job_ended": ended}),
        )
    }
}

/// What the server tells a client about itself.
pub(crate) const INSTRUCTIONS: &str = "Switchyard runs jobs of agent, LLM and command tasks under budgets. Submit a job, \
     follow it with watch_job or get_job, read get_result. A job that can spend waits \
     for a person to approve it (list_pending_approvals shows what waits); you cannot \
     approve. Jobs are resources too: switchyard://jobs/{job_id} and its /result.";

impl SwitchyardMcp {
    /// Calls tool `name` (known) with `args` as the principal of the HTTP
    /// request `parts` (or the fixed one): a failure is a tool error the
    /// model reads.
    pub(crate) async fn call_as(
        &self,
        parts: Option<&http::request::Parts>,
        name: &str,
        args: &Map<String, Value>,
    ) -> CallToolResult {
        tool_result(self.run(name, args, parts).await)
    }
}

/// A tool's outcome as its result: the value, or an error the model reads.
pub(crate) fn tool_result(r: Result<Value, String>) -> CallToolResult {
    match r {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => CallToolResult::error(vec![rmcp::model::ContentBlock::text(e)]),
    }
}

impl ServerHandler for SwitchyardMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("switchyard", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !tools().iter().any(|t| t.name == request.name) {
            return Err(ErrorData::invalid_params(
                format!("no tool {:?}", request.name),
                None,
            ));
        }
        let args = request.arguments.unwrap_or_default();
        let parts = ctx.extensions.get::<http::request::Parts>();
        let result = self.call_as(parts, &request.name, &args).await;
        Ok(CallToolResponse::Complete(result))
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let parts = ctx.extensions.get::<http::request::Parts>();
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let listed = self.jobs_as_resources(parts, cursor).await;
        typed(listed.map_err(rpc_error)?)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        typed(crate::resources::templates())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let parts = ctx.extensions.get::<http::request::Parts>();
        let read = self.read_job_resource(parts, &request.uri).await;
        Ok(ReadResourceResponse::Complete(typed(
            read.map_err(rpc_error)?,
        )?))
    }
}

/// A result written as JSON (one writer for both revisions) as rmcp's type.
fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ErrorData> {
    serde_json::from_value(v).map_err(|e| ErrorData::internal_error(e.to_string(), None))
}

fn rpc_error(e: crate::resources::ResourceError) -> ErrorData {
    ErrorData::new(rmcp::model::ErrorCode(e.code as i32), e.message, e.data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_have_object_schemas_and_none_approves() {
        let tools = tools();
        assert_eq!(tools.len(), 9);
        for t in &tools {
            assert_eq!(
                t.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                t.name
            );
            assert!(!t.name.contains("approve"), "{}", t.name);
        }
    }

    #[test]
    fn money_is_shown_in_dollars_and_micro_usd() {
        let m = switchyard_proto::common::v1::Money {
            micro_usd: 1_234_567,
        };
        assert_eq!(
            money(Some(&m)),
            json!({"micro_usd": 1_234_567, "usd": "1.234567"})
        );
        assert_eq!(state_name("JOB_STATE_COMPLETED"), "completed");
    }
}
