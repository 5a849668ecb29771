//! The agent loop: call the model, run the tools it asks for, give it the
//! results, until it answers — within max_turns, a token limit and a time
//! budget. Shared by LLM tasks (in the executor) and declarative agents
//! (`switchyard agents serve`); what differs between them — where budget
//! is reserved, how a tool runs, where events go — is the [`Host`].
//!
//! Before **each** model call the worst case of that call (estimated prompt
//! tokens + the completion cap, at the highest price in the fallback chain)
//! is reserved through the host; a refusal means the call is not made.
//! After the call the actual usage is committed at the answering model's
//! price.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use switchyard_core::Reason;

use crate::{
    BoxFuture, CallRecord, ChatRequest, Delta, Llm, Message, OutputFormat, Role, ToolChoice,
    ToolSpec, Usage,
};

/// What one run of the loop is asked to do.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The primary model, then the fallbacks in order.
    pub chain: Vec<String>,
    /// Preferred provider (`ext_agent_provider`), or empty.
    pub provider: String,
    /// System prompt; empty for none.
    pub instructions: String,
    /// The conversation before the prompt (a conversation's earlier
    /// messages and replies, user and assistant in turn); empty for a task.
    pub history: Vec<Message>,
    /// The task.
    pub prompt: String,
    /// Tools offered (the allowlist: nothing else may run).
    pub tools: Vec<ToolSpec>,
    /// Tool choice; `required` applies to the first turn, after which the
    /// model may answer.
    pub tool_choice: ToolChoice,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Completion cap of each call.
    pub max_tokens: u64,
    /// The answer must be JSON (`output_format=json`).
    pub json: bool,
    /// JSON Schema the answer must match.
    pub output_schema: Option<Value>,
    /// Most model calls.
    pub max_turns: u32,
    /// Most tokens over all calls; 0: no limit.
    pub max_tokens_per_invocation: u64,
    /// When the run must end (time budget and task timeout).
    pub deadline: Instant,
    /// Timeout of one tool call.
    pub tool_timeout: Duration,
}

/// Why a reservation was not granted.
#[derive(Debug, Clone)]
pub enum Refusal {
    /// The budget (or an ancestor) refused: what ran out is the reason,
    /// `AGENT_TOKEN_BUDGET_EXCEEDED` or `AGENT_COST_BUDGET_EXCEEDED`.
    Budget(String, Reason),
    /// The task's own cost limit leaves no room (`TASK_COST_LIMIT`).
    Limit(String),
    /// A provider rate limit had no room within the wait allowed, or can
    /// never hold the call (`RATE_LIMITED`).
    RateLimited(String),
    /// The ledger could not be asked.
    Unavailable(String),
}

impl Refusal {
    /// The ledger's budget refusal (its `message`, and what ran out as
    /// `reason`) of model call `call`'s reservation. Which answers are
    /// refusals the spend protocol decides
    /// (`switchyard_api::spend::reserve`).
    pub fn budget(message: &str, reason: Reason, call: u32) -> Refusal {
        Refusal::Budget(
            format!("the budget refused the reservation for model call {call}: {message}"),
            reason,
        )
    }
}

/// A model call of the loop ended (one per provider tried: fallbacks show
/// as several).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LlmCall {
    /// Turn (1-based) the call served.
    pub turn: u32,
    /// The call: model, provider, outcome, error, round, latency.
    #[serde(flatten)]
    pub call: CallRecord,
}

/// A tool call of the loop ended.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ToolCall {
    /// Turn (1-based) that asked for it.
    pub turn: u32,
    /// The model's id for the call.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// `ok` or `error`.
    pub status: String,
    /// Reason code of the error.
    pub reason: String,
    /// Error given to the model instead of a result.
    pub error: String,
    /// How long the tool ran, milliseconds.
    pub duration_ms: u64,
}

/// Part of a model's answer arrived (streaming providers only).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LlmDelta {
    /// Turn (1-based) the call serves.
    pub turn: u32,
    /// The text and tool-call pieces that arrived.
    #[serde(flatten)]
    pub delta: Delta,
}

/// A provider reported more usage than the call's reservation held.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Overrun {
    /// Turn (1-based) of the call.
    pub turn: u32,
    /// The model that answered.
    pub model: String,
    /// Tokens reserved for the call.
    pub reserved_tokens: u64,
    /// Tokens the provider reported.
    pub used_tokens: u64,
    /// Of which prompt tokens.
    pub prompt_tokens: u64,
    /// Cost reserved, micro-USD.
    pub reserved_cost_micro_usd: i64,
    /// Cost of what was used, micro-USD.
    pub cost_micro_usd: i64,
}

/// What the loop reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopEvent {
    /// A model call ended.
    LlmCall(LlmCall),
    /// A tool call ended.
    ToolCall(ToolCall),
    /// Part of an answer arrived.
    Delta(LlmDelta),
    /// A call used more than was reserved for it; the loop stops.
    Overrun(Overrun),
}

/// What the loop needs from where it runs.
pub trait Host: Send + Sync {
    /// Reserves `tokens` and `cost` (micro-USD) for model call `call`
    /// (1-based); returns a handle for commit or release.
    fn reserve(&self, call: u32, tokens: u64, cost: i64) -> BoxFuture<'_, Result<String, Refusal>>;
    /// Where model call `call` goes first, told just before its
    /// [`Host::reserve`] (so the reservation can claim room in that
    /// provider's rate limits).
    fn aim(&self, _call: u32, _target: &crate::Target) {}
    /// Room in the provider rate limits for a later call of the same model
    /// call (a fallback, or the chain's next round), to `target`: the call
    /// is made only if this answers `Ok`.
    fn admit<'a>(&'a self, _target: &'a crate::Target) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    /// Commits what call `hold` used.
    fn commit<'a>(
        &'a self,
        hold: &'a str,
        model: &'a str,
        usage: Usage,
        cost: i64,
    ) -> BoxFuture<'a, ()>;
    /// Releases `hold` unused.
    fn release<'a>(&'a self, hold: &'a str, why: &'a str) -> BoxFuture<'a, ()>;
    /// Runs tool `name` with arguments already checked against its schema.
    fn call_tool<'a>(
        &'a self,
        name: &'a str,
        call_id: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, String>>;
    /// Records what the loop did.
    fn event(&self, event: LoopEvent);
    /// Whether answers should be streamed to [`Host::event`] as
    /// [`LoopEvent::Delta`]s (by providers configured to stream).
    fn streams(&self) -> bool {
        false
    }
    /// Whether a tool call of the round just run ends the loop (a handoff
    /// took the conversation elsewhere): then no further model call is
    /// made and the run ends with what it reported so far.
    fn finished(&self) -> bool {
        false
    }
    /// What may happen to a call of tool `name` with `args` (already
    /// checked against its schema): it runs, waits for a person's decision
    /// first, or is refused (a policy forbids it).
    fn rule(&self, _name: &str, _args: &Value) -> Rule {
        Rule::Run
    }
    /// Asks for that decision about the first pending call of `at` (its
    /// arguments already checked) and waits for it. `at` is the loop's
    /// state at that call: a host that can outlive the wait (a restart)
    /// keeps it and goes on from there with [`resume`]. Time spent here
    /// does not count against the loop's time budget.
    fn gate<'a>(&'a self, _at: &'a Checkpoint) -> BoxFuture<'a, Gate> {
        Box::pin(async { Gate::Run })
    }
}

/// What may happen to one tool call, before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// It runs.
    Run,
    /// It waits for a person's decision ([`Host::gate`]).
    Ask,
    /// It is refused: the model is told this, as the call's result, with
    /// `POLICY_FORBIDDEN`.
    Forbidden(String),
}

/// A person's decision about one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Run it.
    Run,
    /// Do not: the model is told why, as the call's result.
    Refused {
        /// `TOOL_CALL_REJECTED` or `TOOL_APPROVAL_TIMEOUT`.
        reason: Reason,
        /// What the model is told.
        message: String,
    },
    /// Run it as an approver changed it: a new action, checked as one (the
    /// tool must be offered, the arguments match its schema, and a changed
    /// tool that needs approval waits for its own decision).
    Edited {
        /// The tool to call.
        tool: String,
        /// Its arguments, JSON text.
        arguments: String,
        /// The approver who edited.
        by: String,
    },
}

/// The loop's state at a tool call waiting for a decision: what [`resume`]
/// needs to go on from that call, exactly where it was.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Checkpoint {
    /// The turn whose calls are being run.
    pub turn: u32,
    /// The conversation so far: up to the model's message with the calls,
    /// then the results of the calls already answered.
    pub messages: Vec<Message>,
    /// What the loop reported so far.
    pub report: Report,
    /// Tool choice of this turn.
    pub tool_choice: ToolChoice,
    /// The model chain from the model that answered.
    pub chain: Vec<String>,
    /// This turn's calls not yet answered; the first is the one waiting.
    pub pending: Vec<crate::ToolCall>,
    /// When the waiting call is an approver's edit of the model's call (an
    /// edit to a tool that needs its own decision): that approver, who may
    /// not decide it.
    pub edited_by: String,
}

/// One tool call, as recorded (`ext_agent_tool_results`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ToolResult {
    /// The model's id for the call.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as sent.
    pub arguments: String,
    /// Result, when the tool ran.
    pub result: Option<Value>,
    /// Error given to the model instead.
    pub error: String,
    /// Reason code of the error.
    pub reason: String,
    /// Turn that asked.
    pub turn: u32,
    /// Duration, milliseconds.
    pub duration_ms: u64,
}

/// What a run produced, also when it failed (partial results).
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Report {
    /// Final text.
    pub content: String,
    /// Parsed JSON answer, when JSON was asked for.
    pub output: Option<Value>,
    /// Usage over every call.
    pub usage: Usage,
    /// Model calls that answered.
    pub llm_calls: u32,
    /// Turns started.
    pub turns: u32,
    /// The model that answered last; empty when none answered (the
    /// `llm.call` events say what was tried).
    pub model_used: String,
    /// Why the last answer ended (`stop`, `length`, `tool_calls`).
    pub finish_reason: String,
    /// Tool calls in invocation order.
    pub tool_results: Vec<ToolResult>,
    /// Money committed.
    pub cost: i64,
}

/// A failed run: why, and what it did before.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Reason code.
    pub reason: Reason,
    /// What happened.
    pub message: String,
    /// Everything up to the failure.
    pub report: Box<Report>,
}

/// Makes the ids of `calls` (answered at `turn`) unique in the loop: a
/// provider that sends none is given `call_<i>` at every turn, and a call's
/// id keys what it reserves and runs (a second call reusing an earlier
/// one's key would be refused, or taken for it). A repeated id gets the
/// turn and its place appended — the same on a re-run, so keys stay
/// stable across a restart.
fn unique_call_ids(calls: &mut [crate::ToolCall], earlier: &[Message], turn: u32) {
    let mut seen: std::collections::HashSet<String> = earlier
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.id.clone()))
        .collect();
    for (k, c) in calls.iter_mut().enumerate() {
        if !seen.insert(c.id.clone()) {
            c.id = format!("{}_t{turn}_{k}", c.id);
            seen.insert(c.id.clone());
        }
    }
}

/// An upper bound on a prompt's tokens: a token never covers less than one
/// byte (byte-level BPE), so the bytes of every message and tool schema,
/// plus framing per message, are at least the tokens the provider counts.
/// Reserving this bound (not a 4-characters-a-token guess) is what keeps
/// parallel calls on one budget from overrunning it; what is not used is
/// released at commit.
pub fn estimate_prompt_tokens(messages: &[Message], tools: &[ToolSpec]) -> u64 {
    let bytes: usize = messages
        .iter()
        .map(|m| {
            m.content.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.len() + 16)
                    .sum::<usize>()
        })
        .sum();
    // What each offered tool adds, by the rule the capabilities summary
    // reports (`switchyard tool summary`).
    let offered: u64 = tools
        .iter()
        .map(|t| switchyard_core::offer::tool_prompt_tokens(&t.name, &t.description, &t.parameters))
        .sum();
    bytes as u64 + offered + 4 * messages.len() as u64 + 8
}

/// The most prompt tokens a call of `chain` with `messages` and `tools`
/// can be counted for: the messages' bound ([`estimate_prompt_tokens`])
/// plus what the chain's providers add to a prompt (their configured
/// prompt overhead, and tool overhead when tools are offered). The loop
/// reserves this before each call and the approval estimate prices it.
pub fn prompt_bound(
    llm: &Llm,
    chain: &[String],
    hint: &str,
    messages: &[Message],
    tools: &[ToolSpec],
) -> u64 {
    estimate_prompt_tokens(messages, tools) + llm.prompt_overhead(chain, hint, !tools.is_empty())
}

/// The conversation a loop starts with: the instructions (if any) as the
/// system message, then the prompt. The approval estimate prices exactly
/// these messages with [`estimate_prompt_tokens`], as the loop does before
/// its first call.
pub fn first_turn(instructions: &str, prompt: &str) -> Vec<Message> {
    continued(instructions, &[], prompt)
}

/// The messages a loop starts with when it continues a conversation: the
/// instructions, the conversation so far, then the new prompt.
pub fn continued(instructions: &str, history: &[Message], prompt: &str) -> Vec<Message> {
    let mut messages = Vec::with_capacity(history.len() + 2);
    if !instructions.trim().is_empty() {
        messages.push(Message::text(Role::System, instructions));
    }
    messages.extend_from_slice(history);
    messages.push(Message::text(Role::User, prompt));
    messages
}

/// Reads a model's JSON answer, allowing a fenced ```json block.
fn parse_json_answer(text: &str) -> Option<Value> {
    let t = text.trim();
    if let Ok(v) = serde_json::from_str(t) {
        return Some(v);
    }
    let inner = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))?
        .strip_suffix("```")?;
    serde_json::from_str(inner.trim()).ok()
}

/// Checks `value` against `schema`; the validator's first messages.
pub fn check_schema(schema: &Value, value: &Value) -> Result<(), String> {
    let v = jsonschema::validator_for(schema).map_err(|e| format!("invalid schema: {e}"))?;
    let errors: Vec<String> = v
        .iter_errors(value)
        .take(3)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The host's [`Host::admit`] as the chain's [`crate::Admit`].
struct ViaHost<'a>(&'a dyn Host);

impl crate::Admit for ViaHost<'_> {
    fn admit<'a>(&'a self, target: &'a crate::Target) -> BoxFuture<'a, Result<(), String>> {
        self.0.admit(target)
    }
}

/// Runs the loop.
pub async fn run(llm: &Llm, spec: &Spec, host: &dyn Host) -> Result<Report, Failure> {
    resume(llm, spec, host, None).await
}

/// Runs the loop, from its start or from `from`: a checkpoint a gated
/// tool call left (the calls still pending run first, the first of them
/// through [`Host::gate`] again, then the next turn).
pub async fn resume(
    llm: &Llm,
    spec: &Spec,
    host: &dyn Host,
    from: Option<Checkpoint>,
) -> Result<Report, Failure> {
    let mut report = Report::default();
    let fail = |reason: Reason, message: String, report: &Report| Failure {
        reason,
        message,
        report: Box::new(report.clone()),
    };
    let Some(price) = llm.chain_price(&spec.chain, &spec.provider) else {
        return Err(fail(
            Reason::LlmProviderNotConfigured,
            format!(
                "no configured LLM provider serves {} (see [llm] in the configuration)",
                spec.chain.join(" or ")
            ),
            &report,
        ));
    };
    let messages = continued(&spec.instructions, &spec.history, &spec.prompt);
    // `none` offers no tools at all; otherwise the offer never changes.
    let offered: &[ToolSpec] = if spec.tool_choice == ToolChoice::None {
        &[]
    } else {
        &spec.tools
    };
    // Structured output is asked for when no tools are offered (a model
    // that must answer in a schema could not call a tool); the answer is
    // checked either way.
    let format = match (&spec.output_schema, spec.json) {
        _ if !offered.is_empty() => OutputFormat::Text,
        (Some(s), _) => OutputFormat::Schema(s.clone()),
        (None, true) => OutputFormat::Json,
        (None, false) => OutputFormat::Text,
    };
    // One request, grown turn by turn.
    let mut req = ChatRequest {
        messages,
        tools: offered.to_vec(),
        tool_choice: spec.tool_choice,
        temperature: spec.temperature,
        max_tokens: None,
        format,
    };
    // Once a fallback answered, later turns start from it: the
    // conversation stays with one model, and a model known to be down is
    // not asked again on every turn.
    let mut chain: &[String] = &spec.chain;
    // Waiting for a person moves the deadline out by the wait.
    let mut deadline = spec.deadline;
    let mut first = 1;
    if let Some(cp) = from {
        req.messages = cp.messages;
        req.tool_choice = cp.tool_choice;
        report = cp.report;
        if let Some(i) = cp
            .chain
            .first()
            .and_then(|m| spec.chain.iter().position(|c| c == m))
        {
            chain = &spec.chain[i..];
        }
        let round = Round {
            spec,
            host,
            offered,
            turn: cp.turn,
            chain,
        };
        round
            .run(&cp.pending, &mut req, &mut report, &mut deadline)
            .await;
        if req.tool_choice == ToolChoice::Required {
            req.tool_choice = ToolChoice::Auto;
        }
        first = cp.turn + 1;
    }
    for turn in first..=spec.max_turns.max(1) {
        report.turns = turn;
        if Instant::now() >= deadline {
            return Err(fail(
                Reason::AgentTimeBudget,
                format!("the time budget ran out after {} turns", turn - 1),
                &report,
            ));
        }
        let prompt = prompt_bound(llm, chain, &spec.provider, &req.messages, offered);
        let mut cap = spec.max_tokens.max(1);
        if spec.max_tokens_per_invocation > 0 {
            let left = spec
                .max_tokens_per_invocation
                .saturating_sub(report.usage.total_tokens);
            if left <= prompt {
                return Err(fail(
                    Reason::AgentTokenLimit,
                    format!(
                        "max_tokens_per_invocation {} is used up ({} used, the next call needs about {prompt} for its prompt)",
                        spec.max_tokens_per_invocation, report.usage.total_tokens
                    ),
                    &report,
                ));
            }
            cap = cap.min(left - prompt);
        }
        let tokens = prompt + cap;
        let cost = crate::Price::cost(
            &price,
            &Usage {
                prompt_tokens: prompt,
                completion_tokens: cap,
                total_tokens: tokens,
            },
        );
        if let Some(target) = llm.target(chain, &spec.provider) {
            host.aim(turn, &target);
        }
        let hold = match host.reserve(turn, tokens, cost).await {
            Ok(h) => h,
            Err(Refusal::Budget(m, reason)) => {
                return Err(fail(reason, m, &report));
            }
            Err(Refusal::Limit(m)) => {
                return Err(fail(Reason::TaskCostLimit, m, &report));
            }
            Err(Refusal::RateLimited(m)) => {
                return Err(fail(Reason::RateLimited, m, &report));
            }
            Err(Refusal::Unavailable(m)) => {
                return Err(fail(Reason::Unavailable, m, &report));
            }
        };
        req.max_tokens = Some(cap);
        let mut on_call = |c: &CallRecord| {
            host.event(LoopEvent::LlmCall(LlmCall {
                turn,
                call: c.clone(),
            }));
        };
        let on_delta = |delta: Delta| host.event(LoopEvent::Delta(LlmDelta { turn, delta }));
        let streamed: Option<&(dyn Fn(Delta) + Send + Sync)> = host.streams().then_some(&on_delta);
        let hooks = crate::Hooks {
            on_call: &mut on_call,
            on_delta: streamed,
            admit: Some(&ViaHost(host)),
        };
        let answered = llm
            .chat_with(chain, &spec.provider, &req, deadline, hooks)
            .await;
        let (mut resp, model) = match answered {
            Ok(x) => x,
            Err(e) => {
                host.release(&hold, "the model call failed").await;
                return Err(fail(e.reason, e.message, &report));
            }
        };
        if let Some(i) = chain.iter().position(|m| *m == model) {
            chain = &chain[i..];
        }
        if !resp.usage_reported {
            // No usage from the provider: bill what was reserved (the
            // prompt's bound and the cap, or the chunks counted if more).
            let completion = cap.max(resp.usage.completion_tokens);
            resp.usage = Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                total_tokens: prompt + completion,
            };
        }
        let used = llm.price(&model, &spec.provider).unwrap_or(price);
        let call_cost = used.cost(&resp.usage);
        host.commit(&hold, &model, resp.usage, call_cost).await;
        report.usage.add(&resp.usage);
        report.cost = report.cost.saturating_add(call_cost);
        report.llm_calls += 1;
        report.model_used = model.clone();
        report.finish_reason = resp.finish_reason.clone();
        // A provider that used more than was held for the call (a hidden
        // prompt larger than the margin, or `max_tokens` ignored) has
        // overspent: the ledger recorded the overrun; no further call is
        // made on the budget, and the run does not end as a success.
        if resp.usage.total_tokens > tokens || call_cost > cost {
            host.event(LoopEvent::Overrun(Overrun {
                turn,
                model: model.clone(),
                reserved_tokens: tokens,
                used_tokens: resp.usage.total_tokens,
                prompt_tokens: resp.usage.prompt_tokens,
                reserved_cost_micro_usd: cost,
                cost_micro_usd: call_cost,
            }));
            return Err(fail(
                Reason::UsageOverrun,
                format!(
                    "model call {turn} ({model}) used {} tokens ({} prompt, {} completion) where {tokens} were reserved ({prompt} prompt at most, {cap} completion): the overrun is recorded on the budget and no further call is made; if the provider adds hidden prompt text, raise its prompt_overhead_tokens or tool_overhead_tokens",
                    resp.usage.total_tokens, resp.usage.prompt_tokens, resp.usage.completion_tokens
                ),
                &report,
            ));
        }
        if resp.tool_calls.is_empty() {
            if req.tool_choice == ToolChoice::Required {
                return Err(fail(
                    Reason::ToolCallRequired,
                    "tool_choice is required, but the model answered without calling a tool".into(),
                    &report,
                ));
            }
            report.content = resp.content;
            return finish(spec, report);
        }
        unique_call_ids(&mut resp.tool_calls, &req.messages, turn);
        req.messages.push(Message {
            role: Role::Assistant,
            content: resp.content,
            tool_calls: resp.tool_calls.clone(),
            tool_call_id: String::new(),
        });
        let round = Round {
            spec,
            host,
            offered,
            turn,
            chain,
        };
        round
            .run(&resp.tool_calls, &mut req, &mut report, &mut deadline)
            .await;
        // A call that ends the run (a handoff took the conversation): no
        // further model call; the host has what it needs.
        if host.finished() {
            return Ok(report);
        }
        // `required` forces a tool call once; then the model may answer.
        if req.tool_choice == ToolChoice::Required {
            req.tool_choice = ToolChoice::Auto;
        }
    }
    Err(fail(
        Reason::AgentMaxTurns,
        format!(
            "max_turns {} reached without a final answer",
            spec.max_turns.max(1)
        ),
        &report,
    ))
}

fn finish(spec: &Spec, mut report: Report) -> Result<Report, Failure> {
    let structured = spec.json || spec.output_schema.is_some();
    if report.finish_reason == "length" && structured {
        let shown: String = report.content.chars().take(120).collect();
        return Err(Failure {
            reason: Reason::AgentOutputTruncated,
            message: format!(
                "the answer was cut off at max_tokens ({}) before its JSON ended: {shown:?}; raise ext_agent_max_tokens",
                spec.max_tokens
            ),
            report: Box::new(report),
        });
    }
    if report.content.trim().is_empty() {
        let wanted = if structured { "JSON" } else { "text" };
        return Err(Failure {
            reason: Reason::AgentOutputEmpty,
            message: format!(
                "the model answered with no {wanted} (finish_reason {:?})",
                report.finish_reason
            ),
            report: Box::new(report),
        });
    }
    if !structured {
        return Ok(report);
    }
    let Some(value) = parse_json_answer(&report.content) else {
        let reason = if spec.json {
            Reason::AgentOutputNotJson
        } else {
            Reason::AgentOutputSchemaViolation
        };
        let shown: String = report.content.chars().take(120).collect();
        return Err(Failure {
            reason,
            message: format!("the answer is not JSON: {shown:?}"),
            report: Box::new(report),
        });
    };
    if let Some(schema) = &spec.output_schema
        && let Err(e) = check_schema(schema, &value)
    {
        return Err(Failure {
            reason: Reason::AgentOutputSchemaViolation,
            message: format!("the answer does not match ext_agent_output_schema: {e}"),
            report: Box::new(report),
        });
    }
    report.output = Some(value);
    Ok(report)
}

/// One turn's tool calls, run in order, their results added to the
/// conversation.
struct Round<'a> {
    spec: &'a Spec,
    host: &'a dyn Host,
    offered: &'a [ToolSpec],
    turn: u32,
    chain: &'a [String],
}

impl Round<'_> {
    async fn run(
        &self,
        calls: &[crate::ToolCall],
        req: &mut ChatRequest,
        report: &mut Report,
        deadline: &mut Instant,
    ) {
        for (k, call) in calls.iter().enumerate() {
            let r = self.call(calls, k, req, report, deadline).await;
            let content = match (&r.result, r.error.is_empty()) {
                (Some(v), true) => v.to_string(),
                _ => json!({"error": r.error, "reason": r.reason}).to_string(),
            };
            req.messages.push(Message {
                role: Role::Tool,
                content,
                tool_calls: Vec::new(),
                tool_call_id: call.id.clone(),
            });
            report.tool_results.push(r);
        }
    }

    /// Call `k` of `calls`: its arguments checked, the decision asked for
    /// when the tool needs one, then the tool run within its timeout.
    async fn call(
        &self,
        calls: &[crate::ToolCall],
        k: usize,
        req: &ChatRequest,
        report: &Report,
        deadline: &mut Instant,
    ) -> ToolResult {
        let (host, call) = (self.host, &calls[k]);
        let mut started = Instant::now();
        let mut r = ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            result: None,
            error: String::new(),
            reason: String::new(),
            turn: self.turn,
            duration_ms: 0,
        };
        // The call as it will run: the model's, or an approver's edit of it.
        let mut current = call.clone();
        let mut edited_by = String::new();
        let mut told = None;
        let ran = loop {
            let args = match self.checked_args(&current) {
                Ok(args) => args,
                Err((reason, message)) if told.is_some() => {
                    break Err((reason, format!("the approver's edit cannot run: {message}")));
                }
                Err(refused) => break Err(refused),
            };
            let mut gate = Gate::Run;
            let rule = host.rule(&current.name, &args);
            if let Rule::Forbidden(why) = rule {
                break Err((Reason::PolicyForbidden, why));
            }
            // An approver's edit of the same tool was that decision; an
            // edit to another tool needs its own.
            if rule == Rule::Ask && (told.is_none() || current.name != call.name) {
                let mut pending = calls[k..].to_vec();
                pending[0] = current.clone();
                let at = Checkpoint {
                    turn: self.turn,
                    messages: req.messages.clone(),
                    report: report.clone(),
                    tool_choice: req.tool_choice,
                    chain: self.chain.to_vec(),
                    pending,
                    edited_by: edited_by.clone(),
                };
                let asked = Instant::now();
                gate = host.gate(&at).await;
                *deadline += asked.elapsed();
            }
            match gate {
                Gate::Refused { reason, message } => break Err((reason, message)),
                Gate::Run => {
                    // The call's duration is the tool's, not the wait for a person.
                    started = Instant::now();
                    break self.invoke(&current, args, *deadline).await;
                }
                Gate::Edited {
                    tool,
                    arguments,
                    by,
                } => {
                    // A new action: checked again from the top, and a
                    // changed tool that needs approval is decided anew
                    // (not by the editor).
                    told = Some(format!(
                        "an approver ({by}) changed this call from {}({}) to {tool}({arguments}) before it ran",
                        call.name, call.arguments
                    ));
                    current = crate::ToolCall {
                        id: call.id.clone(),
                        name: tool,
                        arguments,
                    };
                    edited_by = by;
                }
            }
        };
        r.name.clone_from(&current.name);
        r.arguments.clone_from(&current.arguments);
        // The model is told what was changed, with the result.
        let ran = match (ran, &told) {
            (Ok(v), Some(note)) => Ok(json!({"edited": note, "result": v})),
            (Err((reason, error)), Some(note)) => Err((reason, format!("{note}; {error}"))),
            (ran, None) => ran,
        };
        if let Err((reason, error)) = ran.as_ref().map(|_| ()).map_err(Clone::clone) {
            r.reason = reason.as_str().into();
            r.error = error;
        }
        r.result = ran.ok();
        r.duration_ms = started.elapsed().as_millis() as u64;
        host.event(LoopEvent::ToolCall(ToolCall {
            turn: self.turn,
            call_id: r.call_id.clone(),
            name: r.name.clone(),
            status: if r.error.is_empty() { "ok" } else { "error" }.to_owned(),
            reason: r.reason.clone(),
            error: r.error.clone(),
            duration_ms: r.duration_ms,
        }));
        r
    }

    /// The call's arguments, when the tool is offered and they match its
    /// schema.
    fn checked_args(&self, call: &crate::ToolCall) -> Result<Value, (Reason, String)> {
        let Some(tool) = self.offered.iter().find(|t| t.name == call.name) else {
            let names: Vec<&str> = self.offered.iter().map(|t| t.name.as_str()).collect();
            return Err((
                Reason::ToolNotFound,
                format!(
                    "tool {:?} is not available to this task (available: {})",
                    call.name,
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
        };
        let args = if call.arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str::<Value>(&call.arguments).map_err(|e| {
                (
                    Reason::ToolInvalidArguments,
                    format!("the arguments are not JSON: {e}"),
                )
            })?
        };
        let schema = if tool.parameters.is_object() {
            tool.parameters.clone()
        } else {
            json!({"type": "object"})
        };
        check_schema(&schema, &args).map_err(|e| {
            (
                Reason::ToolInvalidArguments,
                format!("the arguments do not match the tool's schema: {e}"),
            )
        })?;
        Ok(args)
    }

    /// Runs the tool within its timeout (and what is left of the deadline).
    async fn invoke(
        &self,
        call: &crate::ToolCall,
        args: Value,
        deadline: Instant,
    ) -> Result<Value, (Reason, String)> {
        let left = deadline.saturating_duration_since(Instant::now());
        let limit = self.spec.tool_timeout.min(left);
        match tokio::time::timeout(limit, self.host.call_tool(&call.name, &call.id, args)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err((Reason::ToolFailed, e)),
            Err(_) => Err((
                Reason::ToolTimeout,
                format!(
                    "tool {:?} did not finish within {} ms",
                    call.name,
                    limit.as_millis()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::scripted::{Reply, Script};
    use crate::{LlmConfig, ModelConfig, ProviderConfig};

    /// A host with a token allowance, a `lookup` tool and a `slow` tool.
    #[derive(Default)]
    struct TestHost {
        allowance: Mutex<u64>,
        reserved: Mutex<Vec<u64>>,
        committed: Mutex<Vec<(String, Usage, i64)>>,
        tools_run: Mutex<Vec<String>>,
        events: Mutex<Vec<LoopEvent>>,
        /// Ask for streamed answers.
        streams: bool,
        /// Tools whose calls are put to a person, and the answer given.
        gated: Vec<String>,
        decision: Option<Gate>,
        asked: Mutex<Vec<Checkpoint>>,
    }

    impl Host for TestHost {
        fn reserve(
            &self,
            _call: u32,
            tokens: u64,
            _cost: i64,
        ) -> BoxFuture<'_, Result<String, Refusal>> {
            Box::pin(async move {
                let mut a = self.allowance.lock().unwrap();
                if tokens > *a {
                    return Err(Refusal::Budget(
                        format!("{tokens} tokens do not fit in {}", *a),
                        Reason::AgentTokenBudgetExceeded,
                    ));
                }
                *a -= tokens;
                let mut r = self.reserved.lock().unwrap();
                r.push(tokens);
                Ok(format!("hold-{}", r.len()))
            })
        }
        fn commit<'a>(
            &'a self,
            _hold: &'a str,
            model: &'a str,
            usage: Usage,
            cost: i64,
        ) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                self.committed
                    .lock()
                    .unwrap()
                    .push((model.into(), usage, cost))
            })
        }
        fn release<'a>(&'a self, _hold: &'a str, _why: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn call_tool<'a>(
            &'a self,
            name: &'a str,
            _id: &'a str,
            args: Value,
        ) -> BoxFuture<'a, Result<Value, String>> {
            Box::pin(async move {
                self.tools_run.lock().unwrap().push(name.into());
                match name {
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        Ok(json!("late"))
                    }
                    "broken" => Err("the tool crashed".into()),
                    _ => Ok(json!({"found": args["q"]})),
                }
            })
        }
        fn event(&self, event: LoopEvent) {
            self.events.lock().unwrap().push(event);
        }
        fn streams(&self) -> bool {
            self.streams
        }
        fn rule(&self, name: &str, args: &Value) -> Rule {
            // A stand-in policy: "/etc" paths are forbidden.
            if args["q"].as_str().is_some_and(|q| q.starts_with("/etc")) {
                return Rule::Forbidden(format!("forbidden by no-etc: {name} may not read /etc"));
            }
            if self.gated.iter().any(|g| g == name) {
                Rule::Ask
            } else {
                Rule::Run
            }
        }
        fn gate<'a>(&'a self, at: &'a Checkpoint) -> BoxFuture<'a, Gate> {
            Box::pin(async move {
                self.asked.lock().unwrap().push(at.clone());
                self.decision.clone().unwrap_or(Gate::Run)
            })
        }
    }

    fn host(allowance: u64) -> TestHost {
        TestHost {
            allowance: Mutex::new(allowance),
            ..Default::default()
        }
    }

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("{name} things"),
            parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
        }
    }

    fn spec(tools: Vec<ToolSpec>) -> Spec {
        Spec {
            chain: vec!["m".into()],
            provider: String::new(),
            instructions: "be brief".into(),
            prompt: "find it".into(),
            tools,
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: 100,
            json: false,
            output_schema: None,
            max_turns: 5,
            max_tokens_per_invocation: 0,
            deadline: Instant::now() + Duration::from_secs(10),
            history: Vec::new(),
            tool_timeout: Duration::from_millis(200),
        }
    }

    async fn llm(script: &Script) -> (Llm, crate::scripted::Server) {
        llm_with(script, |_| {}).await
    }

    async fn llm_with(
        script: &Script,
        change: impl FnOnce(&mut ProviderConfig),
    ) -> (Llm, crate::scripted::Server) {
        let server = script.serve().await;
        let mut p = ProviderConfig {
            name: "s".into(),
            base_url: server.base_url(),
            models: vec![ModelConfig::priced("m", 1_000_000, 3_000_000)],
            ..Default::default()
        };
        change(&mut p);
        let llm = Llm::new(&LlmConfig {
            providers: vec![p],
            ..Default::default()
        })
        .unwrap();
        (llm, server)
    }

    fn gated_host(decision: Option<Gate>) -> TestHost {
        TestHost {
            gated: vec!["lookup".into()],
            decision,
            ..host(1_000_000)
        }
    }

    #[tokio::test]
    async fn a_gated_call_is_put_to_a_person_with_its_checkpoint_and_a_refusal_reaches_the_model_not_the_tool()
     {
        let script = Script::new();
        script.for_model(
            "m",
            vec![
                Reply::tools_saying(
                    "checking both",
                    &[("lookup", json!({"q": "a"})), ("free", json!({"q": "b"}))],
                    100,
                    10,
                ),
                Reply::text("done", 150, 5),
            ],
        );
        let (llm, _s) = llm(&script).await;
        let refused = Gate::Refused {
            reason: Reason::ToolCallRejected,
            message: "rejected by bob: not today".into(),
        };
        let h = gated_host(Some(refused));
        let r = run(&llm, &spec(vec![tool("lookup"), tool("free")]), &h)
            .await
            .unwrap();
        assert_eq!(r.content, "done");
        assert_eq!(
            *h.tools_run.lock().unwrap(),
            ["free"],
            "the refused call never ran"
        );
        let asked = h.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "only the gated tool is asked about");
        let cp = &asked[0];
        assert_eq!(cp.turn, 1);
        assert_eq!(
            cp.pending
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["lookup", "free"]
        );
        let last = cp.messages.last().unwrap();
        assert_eq!(
            (last.role, last.content.as_str()),
            (Role::Assistant, "checking both")
        );
        assert_eq!(cp.report.llm_calls, 1);
        assert_eq!(r.tool_results[0].reason, "TOOL_CALL_REJECTED");
        let told = &script.received()[1].body["messages"];
        let first_result = told
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool")
            .unwrap();
        assert!(
            first_result["content"]
                .as_str()
                .unwrap()
                .contains("not today"),
            "{first_result}"
        );
    }

    #[tokio::test]
    async fn a_forbidden_call_never_runs_nor_asks_and_the_model_is_told_why() {
        let script = Script::new();
        script.for_model(
            "m",
            vec![
                Reply::tools_saying(
                    "reading",
                    &[
                        ("lookup", json!({"q": "/etc/passwd"})),
                        ("free", json!({"q": "b"})),
                    ],
                    100,
                    10,
                ),
                Reply::text("done", 150, 5),
            ],
        );
        let (llm, _s) = llm(&script).await;
        let h = gated_host(None);
        let r = run(&llm, &spec(vec![tool("lookup"), tool("free")]), &h)
            .await
            .unwrap();
        assert_eq!(*h.tools_run.lock().unwrap(), ["free"]);
        assert!(
            h.asked.lock().unwrap().is_empty(),
            "a forbidden call is not put to a person"
        );
        assert_eq!(r.tool_results[0].reason, "POLICY_FORBIDDEN");
        let told = script.received()[1].body["messages"].to_string();
        assert!(told.contains("forbidden by no-etc"), "{told}");
    }

    #[tokio::test]
    async fn an_approver_s_edit_into_a_forbidden_call_is_refused() {
        let script = Script::new();
        script.for_model(
            "m",
            vec![
                Reply::tools_saying("reading", &[("lookup", json!({"q": "a"}))], 100, 10),
                Reply::text("done", 150, 5),
            ],
        );
        let (llm, _s) = llm(&script).await;
        let edit = Gate::Edited {
            tool: "lookup".into(),
            arguments: json!({"q": "/etc/shadow"}).to_string(),
            by: "bob".into(),
        };
        let h = gated_host(Some(edit));
        let r = run(&llm, &spec(vec![tool("lookup")]), &h).await.unwrap();
        assert!(h.tools_run.lock().unwrap().is_empty(), "the edit never ran");
        assert_eq!(r.tool_results[0].reason, "POLICY_FORBIDDEN");
        assert!(
            r.tool_results[0].error.contains("changed this call"),
            "{}",
            r.tool_results[0].error
        );
    }

    #[tokio::test]
    async fn resuming_from_a_checkpoint_runs_the_pending_calls_and_only_the_next_turn() {
        // First life: the call is put to a person (who says no, so the
        // checkpoint is all we keep), as before a restart.
        let first = Script::new();
        first.for_model(
            "m",
            vec![Reply::tools(
                &[("lookup", json!({"q": "a"})), ("free", json!({"q": "b"}))],
                100,
                10,
            )],
        );
        first.otherwise(Reply::text("unused", 1, 1));
        let (llm1, _s1) = llm(&first).await;
        let refused = Gate::Refused {
            reason: Reason::ToolCallRejected,
            message: "stop".into(),
        };
        let h1 = gated_host(Some(refused));
        let specs = spec(vec![tool("lookup"), tool("free")]);
        let _ = run(&llm1, &specs, &h1).await;
        let cp = h1.asked.lock().unwrap()[0].clone();
        // Second life: approved; only the second turn reaches the model.
        let second = Script::new();
        second.for_model("m", vec![Reply::text("after", 150, 5)]);
        let (llm2, _s2) = llm(&second).await;
        let h2 = gated_host(None);
        let r = resume(&llm2, &specs, &h2, Some(cp)).await.unwrap();
        assert_eq!(r.content, "after");
        assert_eq!(*h2.tools_run.lock().unwrap(), ["lookup", "free"]);
        assert_eq!(second.count(), 1, "the first turn is not asked again");
        assert_eq!(r.llm_calls, 2, "the report goes on from the checkpoint");
        assert_eq!(r.usage.total_tokens, 110 + 155);
        assert_eq!(r.turns, 2);
        let sent = second.received()[0].body["messages"]
            .as_array()
            .unwrap()
            .len();
        // system, user, the assistant's calls, two results.
        assert_eq!(sent, 5);
    }

    #[tokio::test]
    async fn tool_turns_run_in_order_and_usage_is_committed_per_call() {
        let script = Script::new();
        script.for_model(
            "m",
            vec![
                Reply::tools(
                    &[("lookup", json!({"q": "a"})), ("lookup", json!({"q": "b"}))],
                    100,
                    10,
                ),
                Reply::text("done", 150, 5),
            ],
        );
        let (llm, _s) = llm(&script).await;
        let h = host(1_000_000);
        let r = run(&llm, &spec(vec![tool("lookup")]), &h).await.unwrap();
        assert_eq!(r.content, "done");
        assert_eq!(r.llm_calls, 2);
        assert_eq!(r.usage.total_tokens, 265);
        assert_eq!(
            r.tool_results
                .iter()
                .map(|t| t.result.clone())
                .collect::<Vec<_>>(),
            vec![Some(json!({"found": "a"})), Some(json!({"found": "b"}))]
        );
        let committed = h.committed.lock().unwrap().clone();
        assert_eq!(committed.len(), 2);
        // 100 × $1/M + 10 × $3/M = 130 µ$.
        assert_eq!(committed[0].2, 130);
        assert_eq!(r.cost, 130 + 165);
        // The second request carries the tool results back.
        let second = &script.received()[1].body;
        let roles: Vec<&str> = second["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, vec!["system", "user", "assistant", "tool", "tool"]);
    }

    #[tokio::test]
    async fn a_refused_reservation_makes_no_request() {
        let script = Script::new();
        script.otherwise(Reply::text("never", 1, 1));
        let (llm, _s) = llm(&script).await;
        let f = run(&llm, &spec(vec![]), &host(10)).await.unwrap_err();
        assert_eq!(f.reason, Reason::AgentTokenBudgetExceeded);
        assert_eq!(script.count(), 0);
    }

    #[tokio::test]
    async fn unknown_tools_and_bad_arguments_are_reported_to_the_model_not_run() {
        let script = Script::new();
        script.for_model(
            "m",
            vec![
                Reply::tools(
                    &[
                        ("shell_exec", json!({"cmd": "rm -rf /"})),
                        ("lookup", json!({"q": 7})),
                    ],
                    10,
                    10,
                ),
                Reply::text("ok", 10, 1),
            ],
        );
        let (llm, _s) = llm(&script).await;
        let h = host(1_000_000);
        let r = run(&llm, &spec(vec![tool("lookup")]), &h).await.unwrap();
        assert_eq!(r.tool_results[0].reason, "AGENT_TOOL_NOT_FOUND");
        assert_eq!(r.tool_results[1].reason, "AGENT_TOOL_INVALID_ARGUMENTS");
        assert!(h.tools_run.lock().unwrap().is_empty());
        let back = script.received()[1].body["messages"][3]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(back.contains("AGENT_TOOL_NOT_FOUND"), "{back}");
    }

    #[tokio::test]
    async fn a_slow_tool_times_out_and_a_failing_one_reports_its_error() {
        let script = Script::new();
        script.for_model(
            "m",
            vec![
                Reply::tools(
                    &[("slow", json!({"q": "x"})), ("broken", json!({"q": "y"}))],
                    10,
                    10,
                ),
                Reply::text("ok", 10, 1),
            ],
        );
        let (llm, _s) = llm(&script).await;
        let started = Instant::now();
        let r = run(
            &llm,
            &spec(vec![tool("slow"), tool("broken")]),
            &host(1_000_000),
        )
        .await
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(r.tool_results[0].reason, "AGENT_TOOL_TIMEOUT");
        assert_eq!(r.tool_results[1].reason, "AGENT_TOOL_FAILED");
        assert_eq!(r.tool_results[1].error, "the tool crashed");
    }

    #[tokio::test]
    async fn tool_choice_required_and_none() {
        let script = Script::new();
        script.for_model("m", vec![Reply::text("no tools for me", 10, 1)]);
        let (llm, _s) = llm(&script).await;
        let mut s = spec(vec![tool("lookup")]);
        s.tool_choice = ToolChoice::Required;
        let f = run(&llm, &s, &host(1_000_000)).await.unwrap_err();
        assert_eq!(f.reason, Reason::ToolCallRequired);
        assert_eq!(script.received()[0].body["tool_choice"], "required");
        script.for_model("m", vec![Reply::text("plain", 10, 1)]);
        s.tool_choice = ToolChoice::None;
        run(&llm, &s, &host(1_000_000)).await.unwrap();
        assert!(script.received()[1].body.get("tools").is_none());
    }

    #[tokio::test]
    async fn max_turns_and_token_limit_end_the_run() {
        let script = Script::new();
        script.otherwise(Reply::tools(&[("lookup", json!({"q": "again"}))], 10, 10));
        let (llm, _s) = llm(&script).await;
        let mut s = spec(vec![tool("lookup")]);
        s.max_turns = 3;
        let f = run(&llm, &s, &host(1_000_000)).await.unwrap_err();
        assert_eq!(f.reason, Reason::AgentMaxTurns);
        assert_eq!(script.count(), 3);
        assert_eq!(f.report.tool_results.len(), 3);
        script.clear_received();
        s.max_turns = 50;
        s.max_tokens_per_invocation = 150;
        let f = run(&llm, &s, &host(1_000_000)).await.unwrap_err();
        assert_eq!(f.reason, Reason::AgentTokenLimit);
        assert!(f.report.usage.total_tokens <= 150);
    }

    #[tokio::test]
    async fn json_output_is_parsed_and_checked_against_the_schema() {
        let script = Script::new();
        script.for_model(
            "m",
            vec![
                Reply::text("```json\n{\"summary\": \"s\"}\n```", 10, 5),
                Reply::text("{\"sources\": []}", 10, 5),
                Reply::text("not json at all", 10, 5),
            ],
        );
        let (llm, _s) = llm(&script).await;
        let mut s = spec(vec![]);
        s.json = true;
        s.output_schema = Some(
            json!({"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}),
        );
        let r = run(&llm, &s, &host(1_000_000)).await.unwrap();
        assert_eq!(r.output, Some(json!({"summary": "s"})));
        // The schema goes to the model (json_schema, the default mode).
        let asked = &script.received()[0].body["response_format"];
        assert_eq!(asked["type"], "json_schema");
        assert_eq!(
            asked["json_schema"]["schema"],
            *s.output_schema.as_ref().unwrap()
        );
        let f = run(&llm, &s, &host(1_000_000)).await.unwrap_err();
        assert_eq!(f.reason, Reason::AgentOutputSchemaViolation);
        assert!(f.message.contains("summary"), "{}", f.message);
        let f = run(&llm, &s, &host(1_000_000)).await.unwrap_err();
        assert_eq!(f.reason, Reason::AgentOutputNotJson);
    }

    #[tokio::test]
    async fn usage_over_the_reservation_stops_the_run_with_an_overrun_event() {
        let script = Script::new();
        // The provider says it read 5,000 prompt tokens of a tiny prompt.
        script.for_model("m", vec![Reply::text("fine", 5_000, 3)]);
        let (llm, _s) = llm(&script).await;
        let h = host(1_000_000);
        let f = run(&llm, &spec(vec![]), &h).await.unwrap_err();
        assert_eq!(f.reason, Reason::UsageOverrun);
        assert!(f.message.contains("used 5003 tokens"), "{}", f.message);
        assert_eq!(
            f.report.content, "",
            "an overspent answer is not the result"
        );
        let reserved = h.reserved.lock().unwrap()[0];
        // The usage is still committed: the ledger records the overrun.
        assert_eq!(h.committed.lock().unwrap()[0].1.total_tokens, 5_003);
        let events = h.events.lock().unwrap();
        let o = events
            .iter()
            .find_map(|e| match e {
                LoopEvent::Overrun(o) => Some(o.clone()),
                _ => None,
            })
            .expect("an overrun event");
        assert_eq!(
            (o.reserved_tokens, o.used_tokens, o.prompt_tokens),
            (reserved, 5_003, 5_000)
        );
        assert_eq!(script.count(), 1, "no further call");
    }

    #[tokio::test]
    async fn configured_overheads_are_reserved_on_top_of_the_prompt_bound() {
        let script = Script::new();
        script.otherwise(Reply::text("ok", 1, 1));
        let (llm, _s) = llm_with(&script, |p| {
            p.prompt_overhead_tokens = 20;
            p.tool_overhead_tokens = 300;
            p.models[0].tool_overhead_tokens = Some(400);
        })
        .await;
        let bare = spec(vec![]);
        let tools = spec(vec![tool("lookup")]);
        for (s, extra) in [(&bare, 20), (&tools, 20 + 400)] {
            let h = host(1_000_000);
            run(&llm, s, &h).await.unwrap();
            let messages = first_turn(&s.instructions, &s.prompt);
            let bound = estimate_prompt_tokens(&messages, &s.tools);
            assert_eq!(h.reserved.lock().unwrap()[0], bound + extra + s.max_tokens);
        }
    }

    #[tokio::test]
    async fn a_cut_off_or_empty_answer_is_named_as_such() {
        let script = Script::new();
        script.for_model(
            "m",
            vec![
                Reply::text("{\"summary\": \"it was", 10, 100).finish_reason("length"),
                Reply::text("  ", 10, 1),
                Reply::text("a cut-off sentence", 10, 100).finish_reason("length"),
            ],
        );
        let (llm, _s) = llm(&script).await;
        let mut s = spec(vec![]);
        s.json = true;
        let f = run(&llm, &s, &host(1_000_000)).await.unwrap_err();
        assert_eq!(f.reason, Reason::AgentOutputTruncated);
        assert!(f.message.contains("max_tokens (100)"), "{}", f.message);
        s.json = false;
        let f = run(&llm, &s, &host(1_000_000)).await.unwrap_err();
        assert_eq!(f.reason, Reason::AgentOutputEmpty);
        // Text cut off is still an answer, and says how it ended.
        let r = run(&llm, &s, &host(1_000_000)).await.unwrap();
        assert_eq!(r.finish_reason, "length");
    }

    #[tokio::test]
    async fn a_streamed_answer_without_usage_is_billed_at_its_reservation() {
        let script = Script::new();
        script.for_model(
            "m",
            vec![Reply::text("streamed", 3, 2).without_stream_usage()],
        );
        let (llm, _s) = llm_with(&script, |p| p.stream = true).await;
        let h = TestHost {
            streams: true,
            ..host(1_000_000)
        };
        let r = run(&llm, &spec(vec![]), &h).await.unwrap();
        assert_eq!(r.content, "streamed");
        let reserved = h.reserved.lock().unwrap()[0];
        assert_eq!(r.usage.total_tokens, reserved);
        let events = h.events.lock().unwrap();
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                LoopEvent::Delta(d) => Some(d.delta.text.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "streamed");
        assert!(
            events
                .iter()
                .any(|e| matches!(e, LoopEvent::LlmCall(c) if c.call.usage_estimated))
        );
    }

    #[test]
    fn a_tool_call_id_repeated_across_turns_is_made_unique_the_same_way_each_time() {
        let call = |id: &str| crate::ToolCall {
            id: id.into(),
            name: "agent_builder".into(),
            arguments: "{}".into(),
        };
        let earlier = vec![Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![call("call_0")],
            tool_call_id: String::new(),
        }];
        let mut calls = vec![call("call_0"), call("call_1"), call("call_1")];
        unique_call_ids(&mut calls, &earlier, 2);
        let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_0_t2_0", "call_1", "call_1_t2_2"]);
        let mut again = vec![call("call_0"), call("call_1"), call("call_1")];
        unique_call_ids(&mut again, &earlier, 2);
        assert_eq!(again, calls);
    }
}
