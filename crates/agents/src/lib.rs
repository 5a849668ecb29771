//! Declarative agents (seed ADR 003): every `manifest.yaml` in a directory
//! becomes an agent served on one `AgentService` endpoint, registered as
//! `agent_<id>` with its capabilities and its description written for LLM
//! routing, kept alive by heartbeats, and run by the shared agent loop.
//!
//! These agents bill their own model calls: each call is reserved on the
//! job budget the caller passes (`InvocationContext.budget_id`) before it is
//! made and committed after, so they register with `bills_tokens`. They see
//! only the tools their manifest lists in `uses_tools`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use switchyard_agent_sdk::{Agent, Invocation, Progress, delegation, respond};
use switchyard_api::spend::{self, Hold, HoldRequest};
use switchyard_api::{ExecutorClient, LedgerClient, RegistryClient};
use switchyard_core::Reason;
use switchyard_core::artifact::ArtifactKind;
use switchyard_kit::client::{Credential, Intercepted, authed};
use switchyard_kit::json::json_to_struct;
use switchyard_kit::shutdown::Shutdown;
use switchyard_llm::agent::{self, Host, LoopEvent, Refusal};
use switchyard_llm::{BoxFuture, Llm, ToolChoice, ToolSpec, Usage};
use switchyard_proto::agent::v1::{AgentResponse, IntegrationMode, ResponseStatus};
use switchyard_proto::common::v1::{CorrelationContext, Money, NewArtifact};
use switchyard_proto::executor::v1::LlmTask;
use switchyard_proto::registry::v1::{AgentSpec, Capability, ListToolsRequest, Tool};

pub mod manifest;

pub use manifest::{Declared, Keep, Loaded, check_proposed, load_dir};

/// `[agents]` configuration (and `switchyard agents serve` flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentsConfig {
    /// Directory of manifests; unset: `switchyard dev` hosts none.
    pub dir: Option<PathBuf>,
    /// Project root instruction files are also looked up in (default: the
    /// parent of `dir`).
    pub root: Option<PathBuf>,
    /// Address the AgentService binds.
    pub listen: String,
    /// Endpoint registered; empty: `http://<bound address>`.
    pub advertise_url: String,
    /// Registry URL (default in `switchyard dev`: the node itself).
    pub registry_url: Option<String>,
    /// Ledger URL, for the agents' own reservations.
    pub ledger_url: Option<String>,
    /// Executor URL, for the `delegate` tool.
    pub executor_url: Option<String>,
    /// Default completion cap per model call when the manifest sets none.
    pub default_max_output_tokens: u64,
    /// Default tool-call timeout, milliseconds.
    pub tool_timeout_ms: u64,
    /// How often the manifest directory is checked for changes (a
    /// published agent, an edited manifest), milliseconds; 0: never — the
    /// agents are those found at start.
    pub reload_ms: u64,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            dir: None,
            root: None,
            listen: "127.0.0.1:0".into(),
            advertise_url: String::new(),
            registry_url: None,
            ledger_url: None,
            executor_url: None,
            default_max_output_tokens: 4096,
            tool_timeout_ms: 30_000,
            reload_ms: 2_000,
        }
    }
}

/// Errors starting the agents host.
#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    /// Manifests are invalid (every problem, one per line).
    #[error("invalid agent manifests:\n  {}", .0.join("\n  "))]
    Manifests(Vec<String>),
    /// A name is already taken in the registry.
    #[error("{0}")]
    Collision(String),
    /// Configuration is missing or wrong.
    #[error("{0}")]
    Config(String),
    /// A client could not be built.
    #[error("client: {0}")]
    Client(#[from] switchyard_kit::client::ClientError),
    /// Serving failed.
    #[error(transparent)]
    Sdk(#[from] switchyard_agent_sdk::SdkError),
    /// The registry refused.
    #[error("registry: {0}")]
    Registry(tonic::Status),
}

/// The registration of one declared agent.
pub fn agent_spec(a: &Declared, endpoint: &str) -> AgentSpec {
    AgentSpec {
        id: a.registry_id.clone(),
        name: a.name.clone(),
        description: a.description.clone(),
        endpoint: endpoint.into(),
        capabilities: a
            .capabilities
            .iter()
            .map(|c| Capability {
                name: c.name.clone(),
                proficiency: None,
                price_per_unit_micro_usd: c.price_per_unit_micro_usd,
                unit: c.unit.clone(),
            })
            .collect(),
        trust_score: 80,
        max_concurrency: 0,
        labels: std::collections::BTreeMap::from([
            ("kind".to_owned(), "declarative".to_owned()),
            ("version".to_owned(), a.version.clone()),
        ]),
        integration_mode: if a.handoff {
            IntegrationMode::Handoff
        } else {
            IntegrationMode::Tool
        } as i32,
        models: a.models.clone(),
        uses_tools: a
            .uses_tools
            .iter()
            .filter(|t| *t != delegation::TOOL)
            .cloned()
            .collect(),
        latency_estimate_ms: 2000,
        bills_tokens: true,
        a2a: None,
    }
}

/// Every declared agent, served from one endpoint: `Invoke` dispatches on
/// `InvokeRequest.agent_id`.
#[derive(Clone)]
pub struct Hosted {
    /// The agents hosted now, by registry id: replaced whole at a reload
    /// (an invocation keeps the set it started with).
    agents: Arc<std::sync::RwLock<Agents>>,
    llm: Llm,
    cfg: AgentsConfig,
    registry: RegistryClient,
    ledger: LedgerClient,
    executor: Option<ExecutorClient>,
    channels: switchyard_kit::client::Channels,
    max_message_bytes: usize,
}

impl std::fmt::Debug for Hosted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosted")
            .field("agents", &self.ids())
            .finish_non_exhaustive()
    }
}

impl Hosted {
    /// Hosts `loaded` with model calls through `llm`.
    pub fn new(
        loaded: Loaded,
        llm: Llm,
        cfg: AgentsConfig,
        credential: Option<Credential>,
        tls: Option<&tonic::transport::ClientTlsConfig>,
        max_message_bytes: usize,
    ) -> Result<Hosted, AgentsError> {
        // https:// service URLs are reached over TLS (the cluster's CA).
        let channel = |u: &str| switchyard_kit::client::service_channel(u, tls);
        let url = |what: &str, u: &Option<String>| -> Result<Intercepted, AgentsError> {
            let u = u.as_deref().ok_or_else(|| {
                AgentsError::Config(format!("declarative agents need agents.{what}_url"))
            })?;
            Ok(authed(channel(u)?, credential.clone()))
        };
        let registry =
            RegistryClient::remote(url("registry", &cfg.registry_url)?, max_message_bytes);
        let ledger = LedgerClient::remote(url("ledger", &cfg.ledger_url)?, max_message_bytes);
        let executor = match &cfg.executor_url {
            Some(u) => Some(ExecutorClient::remote(
                authed(channel(u)?, credential.clone()),
                max_message_bytes,
            )),
            None => None,
        };
        let agents = served_by(&llm, loaded).map_err(|es| AgentsError::Config(es.join("\n")))?;
        Ok(Hosted {
            agents: Arc::new(std::sync::RwLock::new(agents)),
            llm,
            cfg,
            registry,
            ledger,
            executor,
            channels: Default::default(),
            max_message_bytes,
        })
    }

    /// Registry ids of the hosted agents.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.agents().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The agents hosted now.
    fn agents(&self) -> Agents {
        match self.agents.read() {
            Ok(a) => a.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Loads the manifest directory again. Returns the new set, or every
    /// problem (the set hosted stays as it was: one bad manifest stops
    /// nothing that runs).
    fn reload(&self) -> Result<Agents, Vec<String>> {
        let (Some(dir), Some(root)) = (&self.cfg.dir, &self.cfg.root) else {
            return Err(vec!["no manifest directory to reload".into()]);
        };
        let loaded = load_dir(dir, root)?;
        let agents = served_by(&self.llm, loaded)?;
        match self.agents.write() {
            Ok(mut a) => *a = agents.clone(),
            Err(poisoned) => *poisoned.into_inner() = agents.clone(),
        }
        Ok(agents)
    }

    /// Refuses to start when a hosted agent's tool name `agent_<id>` is
    /// taken by a registered tool (seed ADR 003: names are unique at wire
    /// time).
    /// Returns the registered tool names (what registration needs next).
    pub async fn check_collisions(&self) -> Result<Vec<String>, AgentsError> {
        let registered = registry_tools(&self.registry).await?;
        let agents = self.agents();
        if let Some(t) = registered.iter().find(|t| agents.contains_key(*t)) {
            return Err(AgentsError::Collision(format!(
                "agent {t} would be offered as tool {t:?}, but a registered tool already has that name"
            )));
        }
        Ok(registered)
    }

    /// The tools `a` may call, resolved against the registry now: only
    /// those in its `uses_tools`.
    async fn tools(&self, a: &Declared) -> Result<(Vec<ToolSpec>, HashMap<String, Tool>), String> {
        let names: Vec<String> = a
            .uses_tools
            .iter()
            .filter(|t| *t != delegation::TOOL)
            .cloned()
            .collect();
        let mut specs = Vec::new();
        let mut registered = HashMap::new();
        if !names.is_empty() {
            let listed = self
                .registry
                .list_tools(ListToolsRequest { names: Vec::new() })
                .await
                .map_err(|e| format!("registry: {}", e.message()))?
                .tools;
            for t in listed.into_iter().filter(|t| names.contains(&t.name)) {
                specs.push(ToolSpec {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: t
                        .parameters
                        .as_ref()
                        .map(switchyard_kit::json::struct_to_json)
                        .unwrap_or(json!({"type": "object"})),
                });
                registered.insert(t.name.clone(), t);
            }
        }
        if a.uses_tools.iter().any(|t| t == delegation::TOOL) && self.executor.is_some() {
            specs.push(ToolSpec {
                name: delegation::TOOL.into(),
                description: delegation::TOOL_DESCRIPTION.into(),
                parameters: delegation::tool_schema(),
            });
        }
        Ok((specs, registered))
    }
}

/// The hosted agents by registry id, shared by every invocation.
type Agents = Arc<HashMap<String, Arc<Declared>>>;

/// `loaded`'s agents, each with a configured provider for its models.
fn served_by(llm: &Llm, loaded: Loaded) -> Result<Agents, Vec<String>> {
    let unserved: Vec<String> = loaded
        .agents
        .iter()
        .filter(|a| llm.chain_price(&a.models, &a.provider).is_none())
        .map(|a| {
            format!(
                "agent {}: no configured LLM provider serves {} (see [llm])",
                a.id,
                a.models.join(" or ")
            )
        })
        .collect();
    if !unserved.is_empty() {
        return Err(unserved);
    }
    Ok(Arc::new(
        loaded
            .agents
            .into_iter()
            .map(|a| (a.registry_id.clone(), Arc::new(a)))
            .collect(),
    ))
}

/// Names of the registered tools.
async fn registry_tools(registry: &RegistryClient) -> Result<Vec<String>, AgentsError> {
    Ok(registry
        .list_tools(ListToolsRequest { names: Vec::new() })
        .await
        .map_err(AgentsError::Registry)?
        .tools
        .into_iter()
        .map(|t| t.name)
        .collect())
}

/// The loop's host for one invocation.
struct InvocationHost<'a> {
    hosted: &'a Hosted,
    agent: &'a Declared,
    req: &'a Invocation,
    progress: &'a Progress,
    budget_id: String,
    /// The invocation's grant: the ledger lets this agent's key spend only
    /// under it.
    grant: String,
    correlation: CorrelationContext,
    key: String,
    /// The registered tools the agent lists, by name.
    registered: HashMap<String, Tool>,
    /// What a handoff agent handed back (`hand_back`), once it did.
    handed_back: std::sync::Mutex<Option<Value>>,
    /// The provider rate-limit claims of its model calls.
    claims: spend::RateClaims,
}

/// Longest a declarative agent's model call waits for rate-limit room.
const RATE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl InvocationHost<'_> {
    /// Reserves `req`, waiting (up to [`RATE_WAIT`]) while a provider rate
    /// limit has no room for it.
    async fn hold(&self, req: HoldRequest) -> Result<Hold, spend::Refusal> {
        let started = std::time::Instant::now();
        loop {
            match spend::reserve(&self.hosted.ledger, req.clone()).await {
                Err(spend::Refusal::RateLimited {
                    retry_after_ms: Some(ms),
                    ..
                }) if started.elapsed() + spend::rate_pause(ms) <= RATE_WAIT => {
                    tokio::time::sleep(spend::rate_pause(ms)).await;
                }
                r => break r,
            }
        }
    }

    /// Releases the holds of no money that claimed room for later calls of
    /// a model call, each with its claim.
    async fn release_extras(&self, extras: Vec<(String, switchyard_proto::ledger::v1::RateClaim)>) {
        for (hold, claim) in extras {
            let _ = Hold::resume(&self.hosted.ledger, &hold)
                .under_grant(&self.grant)
                .with_rate(Some(claim))
                .release()
                .await;
        }
    }
}

impl Host for InvocationHost<'_> {
    fn admit<'a>(&'a self, t: &'a switchyard_llm::Target) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let (call, claim) = self.claims.again(&t.provider, &t.model, &t.key);
            let n = (self.claims.extras() + 1).to_string();
            // An agent's claim is backed by the tokens it holds: the
            // fallback's tokens are held too while its call is made.
            let req = HoldRequest {
                budget_id: self.budget_id.clone(),
                tokens: claim.tokens,
                cost_micro_usd: 0,
                key: spend::key(&[
                    &self.key,
                    &self.agent.registry_id,
                    "llm",
                    &call.to_string(),
                    "again",
                    &n,
                ]),
                context: self.correlation.clone(),
                note: format!(
                    "{} call {call}: room for {}",
                    self.agent.registry_id, t.model
                ),
                grant: self.grant.clone(),
                from_hold: String::new(),
                rate: Some(claim.clone()),
            };
            let h = self.hold(req).await.map_err(|r| r.to_string())?;
            self.claims.extra(h.id(), claim);
            Ok(())
        })
    }

    fn aim(&self, _call: u32, t: &switchyard_llm::Target) {
        self.claims.aim(&t.provider, &t.model, &t.key);
    }

    fn reserve(&self, call: u32, tokens: u64, cost: i64) -> BoxFuture<'_, Result<String, Refusal>> {
        Box::pin(async move {
            let rate = self.claims.claim(call, tokens);
            let req = HoldRequest {
                budget_id: self.budget_id.clone(),
                tokens,
                cost_micro_usd: cost,
                key: spend::key(&[&self.key, &self.agent.registry_id, "llm", &call.to_string()]),
                context: self.correlation.clone(),
                note: format!("{} call {call}", self.agent.registry_id),
                grant: self.grant.clone(),
                // An agent spends under its invocation's grant, on the
                // chain: the caller's scope hold is the caller's.
                from_hold: String::new(),
                rate: rate.clone(),
            };
            let reserved = self.hold(req).await;
            match reserved {
                Ok(h) => {
                    self.claims.held(h.id(), rate);
                    Ok(h.id().to_owned())
                }
                Err(r @ spend::Refusal::RateLimited { .. }) => {
                    Err(Refusal::RateLimited(format!("model call {call}: {r}")))
                }
                Err(spend::Refusal::Budget { message, short, .. }) => {
                    Err(Refusal::budget(&message, short.reason(), call))
                }
                Err(r @ (spend::Refusal::Unavailable(_) | spend::Refusal::Unreachable(_))) => {
                    Err(Refusal::Unavailable(r.to_string()))
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
            let prices = self.hosted.llm.entry_prices(model, &self.agent.provider);
            let entry = switchyard_api::spend::llm_entry(
                &self.correlation.task_id,
                &self.agent.registry_id,
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
            let hold = Hold::resume(&self.hosted.ledger, hold)
                .under_grant(&self.grant)
                .with_rate(rate);
            if let Err(e) = hold.commit(usage.total_tokens, cost, entry).await {
                tracing::warn!(reservation_id = hold.id(), error = %e.message(), "commit failed; the reservation's TTL bounds the hold");
            }
        })
    }

    fn release<'a>(&'a self, hold: &'a str, why: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            tracing::debug!(
                reservation_id = hold,
                why,
                "releasing an unused reservation"
            );
            let (rate, extras) = self.claims.settle(hold, None, 0);
            self.release_extras(extras).await;
            let _ = Hold::resume(&self.hosted.ledger, hold)
                .under_grant(&self.grant)
                .with_rate(rate)
                .release()
                .await;
        })
    }

    fn call_tool<'a>(
        &'a self,
        name: &'a str,
        call_id: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move {
            if name == delegation::TOOL {
                return self.delegate(args).await;
            }
            if name == HAND_BACK && self.agent.handoff {
                let result = args.get("result").cloned().unwrap_or(Value::Null);
                let mut h = self.handed_back.lock().map_err(|e| e.to_string())?;
                *h = Some(result);
                return Ok(json!({"handed_back": true}));
            }
            let tool = self
                .registered
                .get(name)
                .ok_or_else(|| format!("tool {name:?} has no provider endpoint"))?;
            if !tool.mcp_server.is_empty() {
                // The tool's progress goes on as the agent's own.
                let progress = |p: switchyard_agent_sdk::tools::McpProgress| {
                    let of = if p.total > 0.0 {
                        format!("/{}", p.total)
                    } else {
                        String::new()
                    };
                    let line = format!("{name}: {}{of} {}", p.progress, p.message);
                    self.progress.note(line.trim_end());
                };
                return switchyard_agent_sdk::tools::call_mcp(
                    &self.hosted.registry,
                    name,
                    call_id,
                    &args,
                    self.correlation.clone(),
                    &progress,
                )
                .await;
            }
            if tool.endpoint.is_empty() {
                return Err(format!("tool {name:?} has no provider endpoint"));
            }
            let channel = self
                .hosted
                .channels
                .get(&tool.endpoint)
                .map_err(|e| e.to_string())?;
            switchyard_agent_sdk::tools::call(
                channel,
                self.hosted.max_message_bytes,
                name,
                call_id,
                &args,
                self.correlation.clone(),
            )
            .await
        })
    }

    fn finished(&self) -> bool {
        self.handed_back.lock().is_ok_and(|h| h.is_some())
    }

    fn event(&self, event: LoopEvent) {
        let line = match event {
            LoopEvent::LlmCall(c) => {
                format!(
                    "model {} {} (turn {})",
                    c.call.model, c.call.outcome, c.turn
                )
            }
            LoopEvent::ToolCall(t) => format!("tool {} {}", t.name, t.status),
            LoopEvent::Overrun(o) => format!(
                "model {} used {} tokens where {} were reserved (turn {}): stopping",
                o.model, o.used_tokens, o.reserved_tokens, o.turn
            ),
            // Answers are not streamed here (`streams` is false).
            LoopEvent::Delta(_) => return,
        };
        self.progress.note(line);
    }
}

impl InvocationHost<'_> {
    async fn delegate(&self, args: Value) -> Result<Value, String> {
        let Some(executor) = self.hosted.executor.clone() else {
            return Err("delegation is not configured here (agents.executor_url)".into());
        };
        let agent = self.agent;
        let spec = delegation::child_job(
            &args,
            format!("delegated-by-{}", agent.registry_id),
            |task| LlmTask {
                model: agent.models[0].clone(),
                fallback_models: agent.models[1..].to_vec(),
                provider: agent.provider.clone(),
                instructions: agent.instructions.clone(),
                prompt: task,
                max_tokens: agent.max_output_tokens,
                ..Default::default()
            },
        );
        let wait = Duration::from_millis(
            self.agent
                .tool_timeout_ms
                .unwrap_or(self.hosted.cfg.tool_timeout_ms),
        );
        let child = delegation::delegate(&executor, self.req, spec, wait)
            .await
            .map_err(|s| {
                let api = switchyard_kit::error::ApiError::from(s);
                format!("{}: {}", api.reason.unwrap_or_default(), api.message)
            })?;
        child.tool_result()
    }
}

#[tonic::async_trait]
impl Agent for Hosted {
    async fn invoke(&self, req: Invocation, progress: Progress) -> AgentResponse {
        let agents = self.agents();
        let agent = match agents.get(&req.agent_id) {
            Some(a) => a,
            None if req.agent_id.is_empty() && agents.len() == 1 => match agents.values().next() {
                Some(a) => a,
                None => return respond::refused("no agents are hosted here"),
            },
            None => {
                return respond::refused(format!(
                    "agent {:?} is not hosted here (hosted: {})",
                    req.agent_id,
                    self.ids().join(", ")
                ));
            }
        };
        let ctx = req.context.clone().unwrap_or_default();
        if ctx.budget_id.is_empty() {
            return respond::refused(format!(
                "{} spends model tokens and bills them to a job budget: InvocationContext.budget_id is required",
                agent.registry_id
            ));
        }
        let (mut tools, registered) = match self.tools(agent).await {
            Ok(x) => x,
            Err(e) => return respond::error(format!("{}: {e}", Reason::Unavailable)),
        };
        // A handoff agent talks with the person: the messages since the
        // handoff are its conversation, the last one its prompt, and it
        // may hand the conversation back.
        let (prompt, history, instructions) = if agent.handoff {
            tools.push(hand_back_tool());
            let (history, last) = handed_conversation(&req);
            let task = format!(
                "You were handed this conversation with the task: {}\nTalk with the person until it is done; then call {HAND_BACK} with the result (or with why you cannot do it).",
                req.task
            );
            let instructions = if agent.instructions.is_empty() {
                task
            } else {
                format!("{}\n\n{task}", agent.instructions)
            };
            (last, history, instructions)
        } else {
            (prompt_of(&req), Vec::new(), agent.instructions.clone())
        };
        let limits = req.limits.unwrap_or_default();
        let l = agent.limits;
        let pick = |own: u64, asked: u64| if asked > 0 { own.min(asked) } else { own };
        let mut time = pick(l.time_budget_ms, limits.time_budget_ms);
        if let Some(t) = agent.timeout_ms {
            time = time.min(t);
        }
        let spec = agent::Spec {
            chain: agent.models.clone(),
            provider: agent.provider.clone(),
            instructions,
            prompt,
            tools,
            tool_choice: ToolChoice::parse(&agent.tool_choice).unwrap_or_default(),
            temperature: agent.temperature,
            max_tokens: agent
                .max_output_tokens
                .unwrap_or(self.cfg.default_max_output_tokens),
            json: agent.output_format == "json",
            output_schema: agent.output_schema.clone(),
            max_turns: pick(u64::from(l.max_turns), u64::from(limits.max_turns)) as u32,
            max_tokens_per_invocation: pick(l.max_tokens_per_invocation, limits.max_tokens),
            deadline: Instant::now() + Duration::from_millis(time),
            history,
            tool_timeout: Duration::from_millis(
                agent.tool_timeout_ms.unwrap_or(self.cfg.tool_timeout_ms),
            ),
        };
        let correlation = ctx.correlation.clone().unwrap_or_default();
        let host = InvocationHost {
            hosted: self,
            agent,
            req: &req,
            progress: &progress,
            budget_id: ctx.budget_id.clone(),
            grant: ctx.grant.clone(),
            key: if ctx.idempotency_key.is_empty() {
                uuid_like()
            } else {
                format!("{}/{}", ctx.idempotency_key, ctx.attempt)
            },
            correlation,
            registered,
            handed_back: Default::default(),
            claims: spend::RateClaims::default(),
        };
        let ran = agent::run(&self.llm, &spec, &host).await;
        let handed_back = host.handed_back.lock().ok().and_then(|mut h| h.take());
        let (report, mut status, mut error) = match ran {
            Ok(r) => (r, ResponseStatus::Success, String::new()),
            Err(f) => (
                *f.report,
                ResponseStatus::Error,
                format!("{}: {}", f.reason, f.message),
            ),
        };
        let mut artifacts = Vec::new();
        if let Some(keep) = agent
            .artifact
            .as_ref()
            .filter(|_| status == ResponseStatus::Success)
        {
            match self.kept(keep, &report) {
                Ok(a) => artifacts.push(a),
                Err(e) => (status, error) = (ResponseStatus::Error, e),
            }
        }
        let output = match &handed_back {
            Some(result) => json_to_struct(&json!({"handback": true, "result": result})),
            None => report.output.as_ref().and_then(json_to_struct).or_else(|| {
                json_to_struct(&json!({"tool_results": report.tool_results}))
                    .filter(|_| !report.tool_results.is_empty())
            }),
        };
        let content = if report.content.is_empty() && handed_back.is_some() {
            "I am handing you back to the orchestrator.".to_owned()
        } else {
            report.content.clone()
        };
        AgentResponse {
            status: status as i32,
            content,
            output,
            error,
            tokens_used: report.usage.total_tokens,
            turns_used: report.turns,
            cost: Some(Money {
                micro_usd: report.cost,
            }),
            billed: true,
            model_used: report.model_used,
            artifacts,
        }
    }
}

impl Hosted {
    /// The answer in `report` as the artifact `keep` asks for; a proposed
    /// agent is checked first (every problem, in the error the caller's
    /// model reads, so it can correct the proposal).
    fn kept(&self, keep: &Keep, report: &agent::Report) -> Result<NewArtifact, String> {
        let content = match (&report.output, keep.kind) {
            (_, ArtifactKind::AgentManifest) => {
                let text = manifest::unfenced(&report.content);
                let proposed =
                    manifest::check_proposed(text, &keep.grants, "the builder may grant").map_err(
                        |es| {
                            format!(
                                "{}: the proposed agent was refused:\n- {}",
                                Reason::ArtifactInvalid,
                                es.join("\n- ")
                            )
                        },
                    )?;
                if self.agents().contains_key(&proposed.registry_id) {
                    return Err(format!(
                        "{}: the proposed agent was refused: id {:?} is an agent hosted here already; propose another id",
                        Reason::ArtifactInvalid,
                        proposed.id
                    ));
                }
                text.to_owned()
            }
            (Some(json), _) => json.to_string(),
            (None, _) => report.content.clone(),
        };
        let media_type = match keep.kind {
            ArtifactKind::AgentManifest => "application/yaml",
            _ if report.output.is_some() => "application/json",
            _ => "text/markdown",
        };
        Ok(NewArtifact {
            name: keep.name.clone(),
            kind: switchyard_api::artifacts::proto_kind(keep.kind) as i32,
            media_type: media_type.into(),
            content: content.into_bytes(),
        })
    }
}

/// The tool a handoff agent calls to give the conversation back.
const HAND_BACK: &str = "hand_back";

fn hand_back_tool() -> ToolSpec {
    ToolSpec {
        name: HAND_BACK.into(),
        description: "Give the conversation back to the orchestrator, with the result of the task you were handed (or why you could not do it).".into(),
        parameters: json!({
            "type": "object",
            "properties": {"result": {"description": "What you did or found, for the orchestrator"}},
            "required": ["result"]
        }),
    }
}

/// A handed-off conversation as the model takes it: the messages since the
/// handoff before the last (user and assistant in turn), and the last.
fn handed_conversation(req: &Invocation) -> (Vec<switchyard_llm::Message>, String) {
    let input = switchyard_agent_sdk::input_json(req);
    let mut messages: Vec<switchyard_llm::Message> = input
        .get("messages")
        .and_then(Value::as_array)
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    let role = if m.get("role").and_then(Value::as_str) == Some("assistant") {
                        switchyard_llm::Role::Assistant
                    } else {
                        switchyard_llm::Role::User
                    };
                    let text = m.get("text").and_then(Value::as_str).unwrap_or_default();
                    switchyard_llm::Message::text(role, text)
                })
                .collect()
        })
        .unwrap_or_default();
    let last = match messages.pop() {
        Some(m) if m.role == switchyard_llm::Role::User => m.content,
        Some(m) => {
            messages.push(m);
            req.task.clone()
        }
        None => req.task.clone(),
    };
    (messages, last)
}

/// The user message: the task (or the input's `task`), then any other
/// input as JSON.
fn prompt_of(req: &Invocation) -> String {
    let mut input = switchyard_agent_sdk::input_json(req)
        .as_object()
        .cloned()
        .unwrap_or_default();
    let from_input = match input.get("task") {
        Some(Value::String(t)) if req.task.is_empty() || *t == req.task => input.remove("task"),
        _ => None,
    };
    let task = match (req.task.is_empty(), from_input) {
        (true, Some(Value::String(t))) => t,
        _ => req.task.clone(),
    };
    if input.is_empty() {
        return task;
    }
    format!(
        "{task}\n\nInput:\n{}",
        serde_json::to_string_pretty(&Value::Object(input)).unwrap_or_default()
    )
}

fn uuid_like() -> String {
    format!(
        "direct-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}

/// `spec` with every tool of `wanted` that is registered by now, when that
/// adds any to its `uses_tools`.
async fn with_new_tools(
    registry: RegistryClient,
    mut spec: AgentSpec,
    wanted: Vec<String>,
) -> Option<AgentSpec> {
    if spec.uses_tools.len() == wanted.len() {
        return None;
    }
    let registered = registry_tools(&registry).await.ok()?;
    let had = spec.uses_tools.len();
    spec.uses_tools = wanted
        .into_iter()
        .filter(|t| registered.contains(t))
        .collect();
    (spec.uses_tools.len() > had).then_some(spec)
}

/// Serves every agent of `hosted` on `cfg.listen` and keeps each
/// registered until `shutdown`. Calls `on_bound` with the bound address.
/// With `reload_ms`, the manifest directory is read again when it changes:
/// new agents are registered, changed ones re-registered, removed ones
/// deregistered — without restarting this host or any other service.
pub async fn serve_until(
    hosted: Hosted,
    shutdown: Shutdown,
    on_bound: impl FnOnce(std::net::SocketAddr),
) -> Result<(), AgentsError> {
    let registered = hosted.check_collisions().await?;
    let cfg = switchyard_kit::server::ServerConfig {
        listen: hosted.cfg.listen.clone(),
        max_message_bytes: hosted.max_message_bytes,
        ..Default::default()
    };
    let listener = switchyard_kit::server::bind(&cfg)
        .await
        .map_err(switchyard_agent_sdk::SdkError::from)?;
    let addr = listener
        .local_addr()
        .map_err(switchyard_agent_sdk::SdkError::from)?;
    on_bound(addr);
    let endpoint = if hosted.cfg.advertise_url.is_empty() {
        format!("http://{addr}")
    } else {
        hosted.cfg.advertise_url.clone()
    };
    let agents = hosted.agents();
    // One descriptor for the endpoint; each registration carries its own.
    let describe = AgentSpec {
        name: "switchyard declarative agents".into(),
        description: format!("Declarative agents: {}", hosted.ids().join(", ")),
        integration_mode: IntegrationMode::Tool as i32,
        capabilities: agents
            .values()
            .flat_map(|a| agent_spec(a, &endpoint).capabilities)
            .collect(),
        ..Default::default()
    };
    let server = switchyard_kit::server::Server::new(cfg.clone()).add_service(
        switchyard_agent_sdk::AgentServer::new(hosted.clone(), &describe)
            .into_service(cfg.max_message_bytes),
    );
    let serving = tokio::spawn(server.run(listener, shutdown.clone()));
    let mut keepers = Keepers {
        registry: hosted.registry.clone(),
        endpoint,
        shutdown: shutdown.clone(),
        running: HashMap::new(),
    };
    keepers.sync(&agents, &registered).await;
    let reload_every = Duration::from_millis(hosted.cfg.reload_ms);
    if hosted.cfg.reload_ms > 0 && hosted.cfg.dir.is_some() {
        let dir = hosted.cfg.dir.clone().unwrap_or_default();
        let mut seen = fingerprint(&dir);
        let mut tick = tokio::time::interval(reload_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = tick.tick() => {}
            }
            let now = fingerprint(&dir);
            if now == seen {
                continue;
            }
            seen = now;
            match hosted.reload() {
                Ok(agents) => {
                    let registered = registry_tools(&hosted.registry).await.unwrap_or_default();
                    let taken: Vec<&String> = registered
                        .iter()
                        .filter(|t| agents.contains_key(*t))
                        .collect();
                    if taken.is_empty() {
                        keepers.sync(&agents, &registered).await;
                        tracing::info!(agents = ?hosted.ids(), "manifests reloaded");
                    } else {
                        tracing::error!(
                            ?taken,
                            "manifests not reloaded: these agents' tool names are taken by registered tools"
                        );
                    }
                }
                Err(problems) => {
                    tracing::error!(
                        ?problems,
                        "manifests not reloaded: the agents hosted stay as they were"
                    );
                }
            }
        }
    } else {
        shutdown.wait().await;
    }
    keepers.stop_all().await?;
    serving
        .await
        .map_err(|e| AgentsError::Config(format!("server task: {e}")))?
        .map_err(switchyard_agent_sdk::SdkError::from)?;
    Ok(())
}

/// What identifies the manifest directory's contents: every file (two
/// levels down, where manifests and their prompts live) with its size and
/// modification time.
fn fingerprint(dir: &std::path::Path) -> Vec<(PathBuf, u64, Option<std::time::SystemTime>)> {
    let mut out = Vec::new();
    let mut walk = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = walk.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() && depth < 2 {
                walk.push((e.path(), depth + 1));
            } else if m.is_file() {
                out.push((e.path(), m.len(), m.modified().ok()));
            }
        }
    }
    out.sort();
    out
}

/// The registration keepers of the hosted agents, one per agent.
struct Keepers {
    registry: RegistryClient,
    endpoint: String,
    shutdown: Shutdown,
    running: HashMap<String, Keeper>,
}

/// One agent's registration, kept alive until its trigger fires.
struct Keeper {
    spec: AgentSpec,
    stop: switchyard_kit::shutdown::Trigger,
    task: tokio::task::JoinHandle<Result<(), switchyard_agent_sdk::SdkError>>,
}

impl Keeper {
    /// Ends the registration (deregistering the agent) and waits for it.
    async fn stop(self) {
        self.stop.fire();
        let _ = self.task.await;
    }
}

impl Keepers {
    /// Registers what `agents` adds or changes, deregisters what it drops.
    /// The registry accepts only registered tools in uses_tools, so each
    /// agent registers those in `registered` and adds the others as they
    /// appear (a tool is resolved at each invocation, so it works before).
    async fn sync(&mut self, agents: &Agents, registered: &[String]) {
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|id| !agents.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(k) = self.running.remove(&id) {
                k.stop().await;
            }
        }
        for (id, a) in agents.iter() {
            let mut spec = agent_spec(a, &self.endpoint);
            let wanted = spec.uses_tools.clone();
            spec.uses_tools.retain(|t| registered.contains(t));
            if self.running.get(id).is_some_and(|k| k.spec == spec) {
                continue;
            }
            // The old registration is gone before the new one is made (its
            // keeper deregisters as it ends).
            if let Some(old) = self.running.remove(id) {
                old.stop().await;
            }
            let (stop, own) = switchyard_kit::shutdown::channel();
            // The host's shutdown ends this registration too; the relay
            // ends with it (a reload that replaces the agent stops it).
            let (all, fire, ended) = (self.shutdown.clone(), stop.clone(), own.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = all.wait() => fire.fire(),
                    () = ended.wait() => {}
                }
            });
            let tools = self.registry.clone();
            let keep = switchyard_agent_sdk::keep_registered_updating(
                self.registry.clone(),
                spec.clone(),
                own,
                move |now: &AgentSpec| with_new_tools(tools.clone(), now.clone(), wanted.clone()),
            );
            let agent_id = id.clone();
            let task = tokio::spawn(async move {
                let r = keep.await;
                if let Err(e) = &r {
                    tracing::error!(%agent_id, error = %e, "agent not registered");
                }
                r
            });
            self.running.insert(id.clone(), Keeper { spec, stop, task });
        }
    }

    /// Stops every keeper (each deregisters its agent) and waits for them;
    /// the first registration that failed is the error.
    async fn stop_all(self) -> Result<(), AgentsError> {
        for k in self.running.values() {
            k.stop.fire();
        }
        for (_, k) in self.running {
            match k.task.await {
                Ok(r) => r?,
                Err(e) => return Err(AgentsError::Config(format!("registration task: {e}"))),
            }
        }
        Ok(())
    }
}
