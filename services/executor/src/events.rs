//! The job event log, typed: one [`JobEvent`] per kind, each with its
//! payload struct. Recording encodes an event into the wire
//! [`Event`](switchyard_proto::common::v1::Event) (`kind` + `data`, what
//! `WatchJob` streams and the log stores); replay decodes it back. Both go
//! through the one table in [`job_events!`], so a kind and its fields cannot
//! drift apart between the writer and the reader.
//!
//! Wire compatibility: every payload serializes to the same `data` object
//! the untyped log wrote (field names, numbers, `""` for absent text), so
//! data directories and `WatchJob` clients of earlier releases keep working
//! (`tests/replay.rs` replays a log written before this module existed).
//! Fields added later are `#[serde(default)]`, so older events decode. The
//! contract for clients is the comment on `WatchJobResponse` in
//! `proto/switchyard/executor/v1/executor.proto`; a test keeps every kind
//! listed there.

use serde::{Deserialize, Serialize};
use serde_json::Value;
pub use switchyard_llm::agent::{LlmCall, LlmDelta, Overrun, ToolCall};

/// Declares [`JobEvent`] and its one mapping to and from `(kind, data)`.
macro_rules! job_events {
    ($( $(#[$doc:meta])* $variant:ident($payload:ty) = $kind:literal, )*) => {
        /// One event of a job's log.
        #[derive(Debug, Clone, PartialEq)]
        pub enum JobEvent {
            $( $(#[$doc])* $variant($payload), )*
        }

        impl JobEvent {
            /// Every kind, in declaration order.
            pub const KINDS: &'static [&'static str] = &[$($kind),*];

            /// The wire kind, `<area>.<what>`.
            pub fn kind(&self) -> &'static str {
                match self { $( JobEvent::$variant(_) => $kind, )* }
            }

            /// The wire `data` object.
            pub fn data(&self) -> Option<prost_types::Struct> {
                let v = match self {
                    $( JobEvent::$variant(p) => serde_json::to_value(p), )*
                };
                // Payloads are plain structs of text, numbers and flags:
                // serializing them cannot fail.
                v.ok().and_then(|v| switchyard_kit::json::json_to_struct(&v))
            }

            /// Decodes a stored or streamed event; `Ok(None)` for a kind this
            /// release does not know (written by a newer one: replay skips it).
            pub fn decode(kind: &str, data: Option<&prost_types::Struct>) -> Result<Option<JobEvent>, DecodeError> {
                let v = data.map_or_else(|| Value::Object(Default::default()), switchyard_kit::json::struct_to_json);
                let wrap = |e: serde_json::Error| DecodeError { kind: kind.to_owned(), message: e.to_string() };
                match kind {
                    $( $kind => serde_json::from_value(v).map(JobEvent::$variant).map(Some).map_err(wrap), )*
                    _ => Ok(None),
                }
            }
        }
    };
}

job_events! {
    /// The job was accepted.
    Submitted(Submitted) = "job.submitted",
    /// The job changed state.
    JobMoved(JobMoved) = "job.state",
    /// An approval run was proposed.
    ApprovalRequested(ApprovalRequested) = "approval.requested",
    /// The approval run was decided.
    ApprovalDecided(ApprovalDecided) = "approval.decided",
    /// The job's budget exists.
    BudgetCreated(BudgetCreated) = "budget.created",
    /// A reservation was made.
    Reserved(Reserved) = "budget.reserved",
    /// A reservation was committed.
    Committed(Committed) = "budget.committed",
    /// A reservation was released.
    Released(Released) = "budget.released",
    /// A reservation was refused (by the ledger or the task's cost limit).
    Refused(Refused) = "budget.refused",
    /// A self-billing agent committed its own usage on the job's budget.
    BilledByAgent(BilledByAgent) = "budget.billed_by_agent",
    /// The budget ran out: the job pauses and asks for an extension.
    BudgetPaused(BudgetPaused) = "budget.paused",
    /// A person (or the timeout) decided a budget-paused job's extension.
    ExtensionDecided(ExtensionDecided) = "budget.extension_decided",
    /// An approval's scope was placed as a hold on the job's budget chain
    /// (or could not be, and why).
    ScopeHeld(ScopeHeld) = "budget.scope_held",
    /// A task changed state.
    TaskMoved(TaskMoved) = "task.state",
    /// A task attempt started.
    AttemptStarted(AttemptStarted) = "task.attempt",
    /// A queue task's worker reported a failure (Nack).
    WorkerFailed(WorkerFailed) = "task.worker_error",
    /// A task's outputs were stored (kept with this event on disk).
    ResultStored(ResultStored) = "task.result",
    /// A chunk of output.
    Output(Output) = "task.output",
    /// Candidates from the router, with scores.
    Routed(Routed) = "routing.decision",
    /// The budget refused a candidate's price; a cheaper one is tried.
    Downgraded(Downgraded) = "route.downgraded",
    /// An agent call ended.
    AgentCalled(AgentCalled) = "agent.call",
    /// Progress relayed from an agent.
    AgentProgress(AgentProgress) = "agent.progress",
    /// An operator retried the dead-lettered job: its tasks start over.
    Revived(Revived) = "job.revived",
    /// A note for people, e.g. FAIL_AND_NOTIFY's notification.
    Notice(Notice) = "job.notice",
    /// A model call of an LLM task ended; fallbacks show as several.
    LlmCalled(LlmCall) = "llm.call",
    /// A tool call of an LLM task ended.
    ToolCalled(ToolCall) = "llm.tool_call",
    /// An MCP tool reported progress (`notifications/progress`).
    ToolProgress(ToolProgress) = "llm.tool_progress",
    /// Part of a streamed model answer arrived.
    LlmDelta(LlmDelta) = "llm.delta",
    /// A model call used more than its reservation held; the task stops.
    Overrun(Overrun) = "budget.overrun",
    /// The task created a child job.
    Delegated(Delegated) = "delegation.created",
    /// A child job ended; its usage rolls up into this job.
    ChildSettled(ChildSettled) = "delegation.settled",
    /// A Switchyard service the work needs is unreachable; it waits.
    DependencyWaiting(DependencyWaiting) = "dependency.waiting",
    /// The service answered again after a wait.
    DependencyRecovered(DependencyRecovered) = "dependency.recovered",
    /// A tool call waits for a person's approval.
    AwaitingApproval(AwaitingApproval) = "task.awaiting_approval",
    /// A person (or the timeout) decided about a waiting tool call.
    CallDecided(CallDecided) = "task.approval_decided",
    /// An input task asks its question and waits for an answer.
    InputRequested(InputRequested) = "task.input_requested",
    /// An input task's wait ended: answered, or its time ran out.
    InputReceived(InputReceived) = "task.input_received",
    /// A participant's message to a conversation task.
    MessageReceived(MessageReceived) = "conversation.message",
    /// The orchestrator's reply to one message.
    Replied(Replied) = "conversation.replied",
    /// A conversation takes no more messages.
    ConversationEnded(ConversationEnded) = "conversation.ended",
    /// The orchestrator handed the conversation to an agent.
    HandoffStarted(HandoffStarted) = "handoff.started",
    /// The orchestrator took the conversation back.
    HandoffReclaimed(HandoffReclaimed) = "handoff.reclaimed",
    /// An agent holding the conversation is sent a message.
    AgentInvoked(AgentInvoked) = "agent.invoked",
    /// It answered.
    AgentResult(AgentResult) = "agent.result",
    /// It failed or refused.
    AgentError(AgentFailed) = "agent.error",
    /// A task's artifact was stored.
    ArtifactStored(ArtifactStored) = "artifact.stored",
    /// A task's artifact was refused.
    ArtifactRefused(ArtifactRefused) = "artifact.refused",
    /// The job waited for one of its tenant's running-job slots
    /// (`waiting`), then took one (`granted`).
    SlotWait(SlotWait) = "job.waiting_for_slot",
    /// A model call waited for room in a provider rate limit (`waiting`),
    /// then went (`granted`) or gave up (`deferred`).
    RateLimited(RateLimited) = "llm.rate_limited",
    /// The policies decided an action of the job (its submission, its
    /// run's spend, a tool call or a handoff), with the facts they were
    /// given: what `audit replay` decides again.
    PolicyDecided(Box<switchyard_policy::Recorded>) = "policy.decided",
}

/// `task.awaiting_approval`. (The loop's checkpoint is kept beside the
/// log, like outputs: the event names the call only.)
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AwaitingApproval {
    /// The call's approval run.
    pub run_id: String,
    /// The model's id for the call.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// Arguments (JSON text).
    pub arguments: String,
    /// What the model said alongside the call.
    pub reason: String,
    /// The task's attempt.
    pub attempt: u32,
    /// A call undecided this long counts as rejected.
    pub timeout_secs: u64,
    /// When that is, ms since the epoch (a restart keeps it).
    pub deadline_ms: u64,
    /// When the call is an approver's edit that needs its own decision:
    /// that approver (who may not decide it).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub edited_by: String,
}

/// `task.approval_decided`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CallDecided {
    /// The call's approval run.
    pub run_id: String,
    /// The model's id for the call.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// `approved`, `rejected`, `cancelled` or `timed_out`.
    pub decision: String,
    /// Who decided (empty for a timeout).
    pub by: String,
    /// Their comment.
    pub comment: String,
    /// Approved with an edit: the call as the approver changed it,
    /// `tool(arguments)`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub edited: String,
}

/// `task.input_requested`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct InputRequested {
    /// What is asked (templates resolved).
    pub prompt: String,
    /// The task's attempt.
    pub attempt: u32,
    /// How long the task waits, seconds.
    pub wait_secs: u64,
    /// When the wait ends, ms since the epoch (kept across restarts).
    pub deadline_ms: u64,
}

/// `task.input_received`. The answer is the task's output, kept here too so
/// a restart between this record and the task's end takes the same answer.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct InputReceived {
    /// `answered`, `default` (the wait ran out; the task's default answer
    /// was taken) or `timed_out` (no default: the task fails).
    pub outcome: String,
    /// Who answered (the authenticated subject); empty unless answered.
    pub by: String,
    /// The caller's idempotency key; a retry with it gets this outcome.
    pub idempotency_key: String,
    /// The answer taken (null when timed out).
    pub answer: Value,
}

/// `conversation.message`: recorded by SendMessage before it returns.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MessageReceived {
    /// The message's number in the conversation (1, 2, ...).
    pub seq: u32,
    /// What was said.
    pub text: String,
    /// Who said it (the authenticated subject).
    pub by: String,
    /// The conversation ends once this message is answered.
    pub close: bool,
    /// The caller's idempotency key; a retry with it gets this message.
    pub idempotency_key: String,
    /// When it was recorded, ms since the epoch.
    pub at_ms: u64,
}

/// `conversation.replied`: how the turn for message `seq` ended.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Replied {
    /// The message answered.
    pub seq: u32,
    /// `answered`, `paused` (the budget is used up) or `failed`.
    pub outcome: String,
    /// The answer, or what the person is told.
    pub text: String,
    /// The model that answered.
    pub model: String,
    /// Prompt tokens of every model call of the turn.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Total tokens.
    pub total_tokens: u64,
    /// Model calls made.
    pub llm_calls: u32,
    /// Reason code of a paused or failed turn.
    pub reason: String,
    /// When it was recorded, ms since the epoch.
    pub at_ms: u64,
    /// The agent holding the conversation that answered; empty: the
    /// orchestrator.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub agent_id: String,
    /// What the turn's own model calls cost, micro-USD (agents it called
    /// are accounted apart, in `agent.result`).
    pub cost_micro_usd: i64,
}

/// `handoff.started`: at message `seq` the orchestrator handed the
/// conversation to `agent_id` with `task`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HandoffStarted {
    /// The agent now holding the conversation.
    pub agent_id: String,
    /// The capability it was called on.
    pub capability: String,
    /// What the orchestrator asked of it (all the agent is told besides
    /// the messages since).
    pub task: String,
    /// The message the handoff answers.
    pub seq: u32,
    /// When, ms since the epoch (the handoff's time limit counts from it).
    pub at_ms: u64,
    /// Tokens of the orchestrator's turn that handed off (it has no reply
    /// of its own to carry them).
    pub orchestrator_tokens: u64,
    /// What that turn cost, micro-USD.
    pub orchestrator_cost_micro_usd: i64,
}

/// `handoff.reclaimed`: the orchestrator holds the conversation again.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HandoffReclaimed {
    /// The agent that held it.
    pub agent_id: String,
    /// `handed_back`, `user`, `timeout`, `max_turns`, `budget`, `error` or
    /// `refused`.
    pub why: String,
    /// What the agent handed back (`handed_back` only).
    pub result: Value,
    /// The message at which it was reclaimed.
    pub seq: u32,
    /// Messages the agent answered in the handoff.
    pub turns: u32,
    /// Tokens it spent in the handoff.
    pub tokens: u64,
    /// Money it spent in the handoff, micro-USD.
    pub cost_micro_usd: i64,
}

/// `agent.invoked`: an agent holding the conversation is sent message `seq`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentInvoked {
    /// The agent.
    pub agent_id: String,
    /// The message.
    pub seq: u32,
    /// Messages it was sent (those since the handoff).
    pub messages: u32,
}

/// `agent.result`: it answered message `seq`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentResult {
    /// The agent.
    pub agent_id: String,
    /// The message.
    pub seq: u32,
    /// Tokens the call spent.
    pub tokens: u64,
    /// Money it cost, micro-USD.
    pub cost_micro_usd: i64,
    /// It handed the conversation back.
    pub handback: bool,
}

/// `agent.error`: it failed or refused message `seq`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentFailed {
    /// The agent.
    pub agent_id: String,
    /// The message.
    pub seq: u32,
    /// `error` or `refused`.
    pub status: String,
    /// Reason code.
    pub reason: String,
    /// What it said.
    pub error: String,
    /// Tokens the failed call spent all the same.
    pub tokens: u64,
    /// Money it cost, micro-USD.
    pub cost_micro_usd: i64,
}

/// `conversation.ended`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ConversationEnded {
    /// Messages the conversation had.
    pub messages: u32,
    /// Who closed it (empty unless closed by a message).
    pub by: String,
    /// `closed`, `idle` or `max_messages`.
    pub why: String,
}

/// `artifact.stored`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ArtifactStored {
    /// Content address.
    pub artifact_id: String,
    /// File name.
    pub name: String,
    /// Kind (`changeset_bundle`, ...).
    pub kind: String,
    /// Media type.
    pub media_type: String,
    /// Length.
    pub size_bytes: u64,
    /// `<task_id>/<name>`.
    pub path: String,
}

/// `artifact.refused`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ArtifactRefused {
    /// File name.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// Reason code.
    pub reason: String,
    /// Why.
    pub message: String,
}

/// An event whose data does not fit its kind.
#[derive(Debug, Clone, thiserror::Error)]
#[error("event {kind:?}: {message}")]
pub struct DecodeError {
    /// The event's kind.
    pub kind: String,
    /// What did not fit.
    pub message: String,
}

/// `job.submitted`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Submitted {
    /// Source format (native, agenix, aitp, ojs).
    pub format: String,
    /// Number of tasks.
    pub tasks: u64,
    /// The submitting subject.
    pub submitted_by: String,
    /// Its tenant.
    pub tenant: String,
    /// Its kind (`human`, `agent`, `service`).
    pub submitter_kind: String,
    /// Trace context at submission, so work resumed later joins the trace.
    pub traceparent: String,
    /// The job this one runs again (RerunJob); absent otherwise.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rerun_of: String,
    /// Resume: the tasks kept from that job (their outputs are recorded
    /// right after, and they move to `succeeded` as the job starts).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reused: Vec<String>,
    /// The schedule whose tick started it (ScheduleService); absent
    /// otherwise.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub schedule_id: String,
    /// That tick (ms since the epoch).
    #[serde(skip_serializing_if = "is_zero")]
    pub schedule_tick_ms: u64,
    /// The trigger whose event started it (TriggerService); absent
    /// otherwise.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub trigger_id: String,
    /// That event's id.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub event_id: String,
}

/// `job.state`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JobMoved {
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Reason code ("" for a normal move).
    pub reason: String,
    /// Error text.
    pub error: String,
}

/// `approval.requested`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ApprovalRequested {
    /// The run.
    pub run_id: String,
    /// Context hash bound to the run.
    pub context_hash: String,
    /// Worst-case input tokens.
    pub estimated_input_tokens: u64,
    /// Worst-case output tokens.
    pub estimated_output_tokens: u64,
    /// Worst-case cost; `None` when some part cannot be priced.
    pub estimated_cost_micro_usd: Option<i64>,
    /// The cap a person approves.
    pub max_tokens: u64,
    /// The job asked for a person whatever the policies say.
    pub skip_policies: bool,
}

/// `job.revived`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Revived {
    /// The round that starts (1 for the first retry).
    pub round: u32,
    /// Who retried it.
    pub by: String,
}

/// `approval.decided`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ApprovalDecided {
    /// `approved`, `rejected` or `cancelled`.
    pub status: String,
    /// Who decided (`policy:<name>`, a subject, `delegation:<run>`).
    pub by: String,
}

/// `budget.created`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetCreated {
    /// The job's budget.
    pub budget_id: String,
    /// The budget it nests under ("" for none).
    pub parent_id: String,
}

/// `budget.reserved`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Reserved {
    /// The reservation.
    pub reservation_id: String,
    /// Tokens held.
    pub tokens: u64,
    /// Cost held.
    pub cost_micro_usd: i64,
    /// The agent called (agent calls).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub agent_id: String,
    /// The model call (LLM tasks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<u32>,
}

/// `budget.committed`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Committed {
    /// The reservation.
    pub reservation_id: String,
    /// Tokens spent.
    pub tokens: u64,
    /// Cost spent.
    pub cost_micro_usd: i64,
    /// The commit exceeded the hold.
    pub overrun: bool,
}

/// `budget.released`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Released {
    /// The reservation.
    pub reservation_id: String,
    /// Why nothing was spent.
    pub why: String,
}

/// `job.waiting_for_slot`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotWait {
    /// `waiting` or `granted`.
    pub phase: String,
    /// The tenant whose slots are taken.
    pub tenant: String,
    /// How many of its jobs may run at once.
    pub cap: u32,
    /// How long it had waited, ms.
    pub waited_ms: u64,
}

/// `llm.rate_limited`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RateLimited {
    /// The model call (1-based).
    pub call: u32,
    /// `waiting`, `granted` or `deferred`.
    pub phase: String,
    /// The limit it waits on (empty: an upstream key's cooldown).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub limit: String,
    /// Its bucket's scope (`shared`, `tenant:<t>`, `key:<k>`, …).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub scope: String,
    /// Why (the ledger's words), or why it gave up.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// How long it had waited, ms.
    pub waited_ms: u64,
}

/// `budget.refused`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Refused {
    /// The budget that refused, or `task.cost_limit`.
    pub refused_by: String,
    /// Why.
    pub message: String,
    /// Tokens asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Cost asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd: Option<i64>,
    /// What ran out: `tokens` or `cost` (empty for the task's cost limit,
    /// and in events of earlier releases).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub dimension: String,
    /// Tokens the hold needed beyond what the budget had left.
    #[serde(skip_serializing_if = "is_zero")]
    pub short_tokens: u64,
    /// Micro-USD the hold needed beyond what the budget had left.
    #[serde(skip_serializing_if = "is_zero_i64")]
    pub short_micro_usd: i64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// `route.downgraded`: the budget refused the chosen candidate's price, so
/// a cheaper one routing offered is tried.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Downgraded {
    /// The capability routed.
    pub capability: String,
    /// The candidate the budget refused.
    pub from_agent: String,
    /// The cheaper candidate tried instead.
    pub to_agent: String,
    /// The refused candidate's price per unit.
    pub from_price_micro_usd: i64,
    /// The cheaper candidate's price per unit.
    pub to_price_micro_usd: i64,
    /// The budget's refusal.
    pub reason: String,
}

/// `budget.paused`: what ran out, and the extension asked for.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetPaused {
    /// The extension's approval run.
    pub run_id: String,
    /// 1 for the job's first pause, 2 for its second, ...
    pub number: u32,
    /// What ran out: `tokens` or `cost`.
    pub dimension: String,
    /// The budget that refused.
    pub refused_by: String,
    /// The refusal, with its numbers.
    pub message: String,
    /// Tokens the extension adds.
    pub tokens: u64,
    /// Micro-USD the extension adds.
    pub cost_micro_usd: i64,
    /// Tasks not yet finished, in spec order.
    pub remaining_tasks: Vec<String>,
    /// Undecided by then (ms since the epoch), the job ends.
    pub decide_by_ms: u64,
}

/// `budget.extension_decided`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ExtensionDecided {
    /// The extension's run.
    pub run_id: String,
    /// `approved`, `rejected`, `cancelled` or `timed_out`.
    pub decision: String,
    /// Who decided.
    pub by: String,
    /// Their comment, or why it timed out.
    pub comment: String,
    /// Approved: the job budget's token limit once raised (unset: not
    /// raised — no token limit, or money ran out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_limit: Option<u64>,
    /// Approved: the job budget's money limit once raised, micro-USD.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_limit_micro_usd: Option<i64>,
    /// Approved: the tokens granted (the approver's scope, else as asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub granted_tokens: Option<u64>,
    /// Approved: the money granted, micro-USD (the approver's scope, else as
    /// asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub granted_cost_micro_usd: Option<i64>,
}

impl ExtensionDecided {
    /// What an approved extension adds, tokens and micro-USD: what the
    /// approver granted, else what `p` asked (a decision recorded before
    /// approvers could choose).
    pub fn granted(&self, p: &BudgetPaused) -> (u64, i64) {
        (
            self.granted_tokens.unwrap_or(p.tokens),
            self.granted_cost_micro_usd.unwrap_or(p.cost_micro_usd),
        )
    }
}

/// `budget.scope_held`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ScopeHeld {
    /// The approval it grants: the job's run, or an extension's.
    pub run_id: String,
    /// The ledger hold the job's steps now draw from; empty when the
    /// chain could not hold the scope (the steps then reserve on the chain
    /// as they go, and `refused` says why).
    pub reservation_id: String,
    /// Tokens held.
    pub tokens: u64,
    /// Money held, micro-USD.
    pub cost_micro_usd: i64,
    /// Until when, ms since the epoch.
    pub until_ms: u64,
    /// Why the hold was not placed (the ledger's words); empty when held.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub refused: String,
}

/// `budget.billed_by_agent`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BilledByAgent {
    /// The agent.
    pub agent_id: String,
    /// Model it used.
    pub model: String,
    /// Tokens it committed.
    pub tokens: u64,
    /// Cost it committed.
    pub cost_micro_usd: i64,
}

/// `task.state`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskMoved {
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Reason code ("" for a normal move).
    pub reason: String,
    /// Error text.
    pub error: String,
    /// Retrying/deferred: when the next attempt is due (0: not waiting).
    pub next_attempt_at_ms: u64,
    /// The next attempt runs with the extended timeout
    /// (RETRY_WITH_TIMEOUT_EXTENSION). On the wire `"true"` or `""`.
    #[serde(with = "flag")]
    pub extend: bool,
}

/// `task.attempt`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AttemptStarted {
    /// Attempt number (1-based).
    pub attempt: u32,
    /// Its timeout.
    pub timeout_secs: u32,
    /// Queue tasks: the worker that leased it (an attempt of a queue task
    /// starts when a worker fetches it). Absent for other tasks, so their
    /// events stay as earlier releases wrote them.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub worker_id: String,
}

/// `task.worker_error`: the worker's own account of a failed queue task
/// attempt (Nack), before the task's state change says what follows.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerFailed {
    /// The attempt.
    pub attempt: u32,
    /// The worker.
    pub worker_id: String,
    /// Its error code.
    pub code: String,
    /// Its error type (the code when it gave none).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its message.
    pub message: String,
    /// Handed back untried.
    #[serde(with = "flag")]
    pub requeue: bool,
}

/// `task.result`: a summary; the outputs are in the outputs tree.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ResultStored {
    /// Command tasks: the exit code.
    pub exit_code: Option<i32>,
    /// Agent tasks: the agent that answered.
    pub agent_id: String,
    /// Output was cut at the cap.
    pub truncated: bool,
    /// The resource limit the command hit ("" for none).
    pub resource_limit: String,
}

/// `task.output`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Output {
    /// `stdout`, `stderr` or `agent`.
    pub stream: String,
    /// The text.
    pub chunk: String,
}

/// `routing.decision`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Routed {
    /// The capability asked for.
    pub capability: String,
    /// Ranked candidates.
    pub candidates: Vec<Candidate>,
    /// Agents filtered out, by reason.
    pub filtered: std::collections::BTreeMap<String, u32>,
}

/// One routing candidate.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Candidate {
    /// Agent.
    pub agent_id: String,
    /// Total score.
    pub score: f64,
    /// Where it listens.
    pub endpoint: String,
    /// Its price per unit.
    pub price_per_unit_micro_usd: i64,
    /// The unit.
    pub unit: String,
    /// The score's parts.
    pub breakdown: Breakdown,
}

/// A candidate's score by factor.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Breakdown {
    /// Capability match.
    pub capability_match: f64,
    /// Trust.
    pub trust: f64,
    /// Latency.
    pub latency: f64,
    /// Cost.
    pub cost: f64,
    /// Label preference.
    pub preference: f64,
    /// Observed latency.
    pub latency_ms: f64,
    /// The capability that matched.
    pub matched_capability: String,
}

/// `agent.call`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentCalled {
    /// The agent.
    pub agent_id: String,
    /// `success`, `error`, `refused`, `timeout` or `unreachable`.
    pub status: String,
    /// How long the call took.
    pub latency_ms: u64,
    /// Error text.
    pub error: String,
}

/// `agent.progress`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentProgress {
    /// The agent.
    pub agent_id: String,
    /// What it says.
    pub message: String,
    /// How far, if it says.
    pub percent: Option<u32>,
}

/// `llm.tool_progress`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolProgress {
    /// The model's id for the call.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Progress so far, as the tool counts it.
    pub progress: f64,
    /// Total, when the tool knows it (0: unknown).
    pub total: f64,
    /// The tool's message.
    pub message: String,
}

/// `job.notice`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Notice {
    /// The note.
    pub message: String,
}

/// `dependency.waiting`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DependencyWaiting {
    /// The service waited for: `ledger`, `router`, `approval`, `registry`.
    pub service: String,
    /// Why it could not be reached, as the transport said.
    pub error: String,
}

/// `dependency.recovered`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DependencyRecovered {
    /// The service that answered again.
    pub service: String,
    /// How long the work waited for it, ms.
    pub waited_ms: u64,
}

/// `delegation.created`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Delegated {
    /// The child job.
    pub child_job_id: String,
}

/// `delegation.settled`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ChildSettled {
    /// The child job.
    pub child_job_id: String,
    /// Its final state (`JOB_STATE_…`).
    pub state: String,
    /// Tokens it used.
    pub tokens: u64,
    /// What it cost.
    pub cost_micro_usd: i64,
}

/// A flag written as `"true"` or `""` (the untyped log's encoding).
mod flag {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &bool, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if *v { "true" } else { "" })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            Flag(bool),
        }
        Ok(match Either::deserialize(d)? {
            Either::Text(s) => s == "true",
            Either::Flag(b) => b,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(e: JobEvent) {
        let data = e.data();
        let back = JobEvent::decode(e.kind(), data.as_ref()).expect("decodes");
        assert_eq!(back, Some(e));
    }

    #[test]
    fn a_policy_decision_keeps_its_facts_exactly_through_the_wire_form() {
        use switchyard_policy::{Action, Facts, Recorded, Remaining};
        for remaining in [
            Remaining::default(),
            Remaining::left(None, None),
            Remaining::left(Some(5_000), None),
            Remaining::left(None, Some(1_250_000)),
        ] {
            let facts = Facts {
                action: Action::CallTool,
                resource: "shell".into(),
                remaining,
                now_ms: 1_796_000_000_123,
                arguments: serde_json::json!({"cmd": "ls", "n": 3, "deep": {"x": [1.5, true]}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                ..Default::default()
            };
            round_trip(JobEvent::PolicyDecided(Box::new(Recorded {
                facts,
                effect: "require".into(),
                policies: vec!["two-for-shell".into()],
                version: "sha256:abc".into(),
                approvals: 2,
            })));
        }
    }

    #[test]
    fn every_kind_round_trips_through_its_wire_form() {
        round_trip(JobEvent::TaskMoved(TaskMoved {
            from: "running".into(),
            to: "retrying".into(),
            reason: "TASK_TIMEOUT".into(),
            error: "slow".into(),
            next_attempt_at_ms: 1_795_410_601_873,
            extend: true,
        }));
        round_trip(JobEvent::AgentProgress(AgentProgress {
            agent_id: "a".into(),
            message: "half".into(),
            percent: Some(50),
        }));
        round_trip(JobEvent::Delegated(Delegated {
            child_job_id: "c".into(),
        }));
        round_trip(JobEvent::ChildSettled(ChildSettled {
            child_job_id: "c".into(),
            state: "JOB_STATE_COMPLETED".into(),
            tokens: 7,
            cost_micro_usd: 9,
        }));
        round_trip(JobEvent::Refused(Refused {
            refused_by: "task.cost_limit".into(),
            message: "no".into(),
            tokens: None,
            cost_micro_usd: None,
            ..Default::default()
        }));
        round_trip(JobEvent::Refused(Refused {
            refused_by: "b-1".into(),
            message: "no".into(),
            tokens: Some(80),
            cost_micro_usd: Some(30),
            dimension: "cost".into(),
            short_tokens: 0,
            short_micro_usd: 10,
        }));
        round_trip(JobEvent::BudgetPaused(BudgetPaused {
            run_id: "extend-1".into(),
            number: 2,
            dimension: "tokens".into(),
            refused_by: "b-1".into(),
            message: "no".into(),
            tokens: 80,
            cost_micro_usd: 0,
            remaining_tasks: vec!["c".into(), "d".into()],
            decide_by_ms: 1_795_410_601_873,
        }));
        round_trip(JobEvent::ExtensionDecided(ExtensionDecided {
            run_id: "extend-1".into(),
            decision: "approved".into(),
            by: "bob".into(),
            comment: String::new(),
            token_limit: Some(160),
            cost_limit_micro_usd: None,
            granted_tokens: Some(80),
            granted_cost_micro_usd: None,
        }));
        round_trip(JobEvent::ApprovalRequested(ApprovalRequested {
            estimated_cost_micro_usd: None,
            ..Default::default()
        }));
    }

    #[test]
    fn the_contract_lists_every_kind() {
        let proto = include_str!("../../../proto/switchyard/executor/v1/executor.proto");
        let contract = &proto[proto.find("message WatchJobResponse").expect("the message")..];
        for kind in JobEvent::KINDS {
            assert!(
                contract.contains(&format!("//   {kind} ")),
                "{kind} is not documented in WatchJobResponse"
            );
        }
    }

    #[test]
    fn the_extension_flag_keeps_its_text_encoding() {
        let e = JobEvent::TaskMoved(TaskMoved {
            extend: true,
            ..Default::default()
        });
        let data = switchyard_kit::json::struct_to_json(&e.data().expect("an object"));
        assert_eq!(data["extend"], "true");
        let plain = JobEvent::TaskMoved(TaskMoved::default());
        let data = switchyard_kit::json::struct_to_json(&plain.data().expect("an object"));
        assert_eq!(data["extend"], "");
    }

    #[test]
    fn unknown_kinds_are_skipped_and_misfit_data_is_an_error() {
        assert_eq!(
            JobEvent::decode("job.from_the_future", None).ok(),
            Some(None)
        );
        let bad = switchyard_kit::json::json_to_struct(&serde_json::json!({"tokens": "many"}));
        let e = JobEvent::decode("budget.committed", bad.as_ref()).expect_err("tokens is a number");
        assert!(e.to_string().contains("budget.committed"), "{e}");
    }
}
