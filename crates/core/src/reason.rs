//! The one catalogue of machine-readable error reasons.
//!
//! Each reason travels as `google.rpc.ErrorInfo.reason` (domain
//! [`DOMAIN`]) so that a client in any language can branch on it. Add new
//! reasons here, never as string literals elsewhere.

use std::fmt;

/// `ErrorInfo.domain` of every Switchyard error.
pub const DOMAIN: &str = "switchyard.dev";

macro_rules! reasons {
    ($($(#[$doc:meta])* $variant:ident => $text:literal,)*) => {
        /// A stable, documented error reason.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[$doc])* $variant,)*
        }

        impl Reason {
            /// Every reason, in catalogue order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The wire form, e.g. `BUDGET_EXCEEDED`.
            pub const fn as_str(self) -> &'static str {
                match self { $(Reason::$variant => $text,)* }
            }

            /// Parses the wire form; `None` for reasons this build does not know.
            pub fn parse(s: &str) -> Option<Reason> {
                match s { $($text => Some(Reason::$variant),)* _ => None }
            }
        }
    };
}

reasons! {
    /// A request field failed validation; see the BadRequest field violations.
    InvalidArgument => "INVALID_ARGUMENT",
    /// The named agent is not registered.
    AgentNotFound => "AGENT_NOT_FOUND",
    /// The named tool is not registered (also seed 000's unknown tool call).
    ToolNotFound => "AGENT_TOOL_NOT_FOUND",
    /// No eligible agent offers the capability right now.
    CapabilityUnavailable => "CAPABILITY_UNAVAILABLE",
    /// A tool cannot be removed while agents list it in `uses_tools`.
    ToolInUse => "TOOL_IN_USE",
    /// A tool's `parameters` is not a valid JSON Schema.
    InvalidToolSchema => "INVALID_TOOL_SCHEMA",
    /// The named MCP server is not registered.
    McpServerNotFound => "MCP_SERVER_NOT_FOUND",
    /// An MCP server could not be started, reached or initialised.
    McpServerUnavailable => "MCP_SERVER_UNAVAILABLE",
    /// The tool comes from an MCP server: change the server, not the tool.
    McpToolManaged => "MCP_TOOL_MANAGED",
    /// An A2A Agent Card could not be read or describes no agent Switchyard
    /// can call.
    A2aAgentUnavailable => "A2A_AGENT_UNAVAILABLE",
    /// An A2A Agent Card's signature does not verify with a key trusted for
    /// it, or the card is unsigned where a signature is required.
    A2aCardUnverified => "A2A_CARD_UNVERIFIED",
    /// A request message is larger than the server accepts.
    MessageTooLarge => "MESSAGE_TOO_LARGE",
    /// The request did not finish within the server's time limit.
    RequestTimeout => "REQUEST_TIMEOUT",
    /// The service is starting or draining.
    Unavailable => "SERVICE_UNAVAILABLE",
    /// The service is replaying its log after a start; it answers once done.
    Starting => "STARTING",
    /// Another Switchyard service this work needs cannot be reached right
    /// now; the work waits for it (only a deadline turns that into a failure).
    DependencyUnavailable => "DEPENDENCY_UNAVAILABLE",
    /// Storage failed; the operation was not applied.
    StorageFailure => "STORAGE_FAILURE",
    /// A state-machine transition that the table does not allow.
    TransitionNotAllowed => "TRANSITION_NOT_ALLOWED",
    /// Seed 000: tokens used exceed the token budget.
    AgentTokenBudgetExceeded => "AGENT_TOKEN_BUDGET_EXCEEDED",
    /// Money ran out: a reservation's cost does not fit in the job's budget
    /// (or an enclosing one). The job pauses (`budget_paused`) and asks for
    /// an extension.
    AgentCostBudgetExceeded => "AGENT_COST_BUDGET_EXCEEDED",
    /// A reservation drawn from a hold (an approval's scope) asks more than
    /// the hold has left, or the hold was released or has lapsed: the job
    /// has spent what it was approved for and pauses to ask for more.
    HoldExhausted => "HOLD_EXHAUSTED",
    /// A model call used more than its reservation held (the provider's
    /// hidden prompt was larger than its configured overhead, or it ignored
    /// `max_tokens`): the usage is on the budget, and the task fails without
    /// another call. Not a budget that ran out: raise the provider's
    /// `prompt_overhead_tokens` or `tool_overhead_tokens`.
    UsageOverrun => "USAGE_OVERRUN",
    /// A task's own `cost_limit` leaves no room for its next reservation:
    /// raising the job's budget cannot help, so the task fails.
    TaskCostLimit => "TASK_COST_LIMIT",
    /// An approver rejected (or withdrew) a budget-paused job's extension
    /// request: the job ends with what it finished.
    BudgetExtensionRejected => "BUDGET_EXTENSION_REJECTED",
    /// Nobody decided a budget-paused job's extension request in time
    /// (`executor.budget_extension.timeout_secs`).
    BudgetExtensionTimeout => "BUDGET_EXTENSION_TIMEOUT",
    /// A Cedar policy forbids the action (a submission, a spend, a tool
    /// call, a delegation): the message names the policy and says why.
    PolicyForbidden => "POLICY_FORBIDDEN",
    /// Seed 000: delegation deeper than allowed.
    AgentMaxDelegationDepth => "AGENT_MAX_DELEGATION_DEPTH",
    /// Seed 000: output does not match `ext_agent_output_schema`.
    AgentOutputSchemaViolation => "AGENT_OUTPUT_SCHEMA_VIOLATION",
    /// Seed 000: an `ext_agent_*` parameter is out of range.
    AgentInvalidParameter => "AGENT_INVALID_PARAMETER",
    /// Seed 001: task numbers are not 1..n contiguous.
    InvalidTaskNumbering => "INVALID_TASK_NUMBERING",
    /// A reservation does not fit in a budget or one of its ancestors.
    BudgetExceeded => "BUDGET_EXCEEDED",
    /// A model call does not fit a provider rate limit now (RetryInfo says
    /// when to ask again) or ever (no RetryInfo: it is larger than the
    /// limit allows in a whole window); nothing was reserved.
    RateLimited => "RATE_LIMITED",
    /// The work needs an approved run first.
    ApprovalRequired => "APPROVAL_REQUIRED",
    /// The named budget does not exist.
    BudgetNotFound => "BUDGET_NOT_FOUND",
    /// A budget with this id exists with different settings.
    BudgetAlreadyExists => "BUDGET_ALREADY_EXISTS",
    /// The budget (or an ancestor) is closed to new reservations and children.
    BudgetClosed => "BUDGET_CLOSED",
    /// The run has no signed receipt: it was never approved.
    ReceiptNotFound => "RECEIPT_NOT_FOUND",
    /// No stored policy file has that name (`switchyard policy list`).
    PolicyNotFound => "POLICY_NOT_FOUND",
    /// The named reservation does not exist.
    ReservationNotFound => "RESERVATION_NOT_FOUND",
    /// The reservation was already committed, released or expired.
    ReservationNotOpen => "RESERVATION_NOT_OPEN",
    /// An idempotency key was reused with different arguments.
    IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
    /// The model or agent has no entry in the price catalogue.
    ModelNotPriced => "MODEL_NOT_PRICED",
    /// The named run does not exist.
    RunNotFound => "RUN_NOT_FOUND",
    /// A run with this id exists with a different spec.
    RunAlreadyExists => "RUN_ALREADY_EXISTS",
    /// The run is in a terminal status; nothing moves it any more.
    RunTerminal => "RUN_TERMINAL",
    /// The run is already in the requested status.
    RunAlreadyInStatus => "RUN_ALREADY_IN_STATUS",
    /// The run's retry is scheduled later (`next_attempt_at`).
    RunNotDue => "RUN_NOT_DUE",
    /// The caller does not hold the run's claim (other worker, or it expired).
    ClaimNotHeld => "CLAIM_NOT_HELD",
    /// The approver is the run's creator; someone else must approve.
    SeparationOfDuties => "SEPARATION_OF_DUTIES",
    /// The action needs an authenticated person.
    ActorRequired => "ACTOR_REQUIRED",
    /// The imported result was produced against another context pack.
    ContextHashMismatch => "CONTEXT_HASH_MISMATCH",
    /// The named job does not exist.
    JobNotFound => "JOB_NOT_FOUND",
    /// The caller does not hold this queue task's lease (it lapsed, was
    /// re-leased, the task was cancelled, or another worker holds it); its
    /// ack, nack or heartbeat changed nothing.
    LeaseLost => "LEASE_LOST",
    /// The queue task is not leased (waiting for a worker, backing off, or
    /// finished): there is nothing to ack or nack.
    TaskNotLeased => "TASK_NOT_LEASED",
    /// The job is not in the dead letter (it did not end `discarded`, or
    /// its spec does not keep it there): nothing to retry or delete.
    NotInDeadLetter => "NOT_IN_DEAD_LETTER",
    /// A job with this id exists with a different spec.
    JobAlreadyExists => "JOB_ALREADY_EXISTS",
    /// The job finished (completed, cancelled or discarded); nothing moves it.
    JobTerminal => "JOB_TERMINAL",
    /// The job has not finished yet, so it has no result; follow it or ask
    /// again once it has.
    JobNotFinished => "JOB_NOT_FINISHED",
    /// A resume of a job that completed: every task succeeded, so nothing
    /// would run; re-run it afresh instead.
    NothingToResume => "NOTHING_TO_RESUME",
    /// No schedule with that id is visible to the caller.
    ScheduleNotFound => "SCHEDULE_NOT_FOUND",
    /// A schedule with that id exists with another definition.
    ScheduleAlreadyExists => "SCHEDULE_ALREADY_EXISTS",
    /// A schedule's cron expression or time zone does not parse, or it
    /// never fires.
    ScheduleInvalid => "SCHEDULE_INVALID",
    /// No trigger with that id is visible to the caller (or the caller
    /// may not deliver events to it).
    TriggerNotFound => "TRIGGER_NOT_FOUND",
    /// A trigger with that id exists with another definition.
    TriggerAlreadyExists => "TRIGGER_ALREADY_EXISTS",
    /// A trigger's definition does not fit, or an event it was sent
    /// cannot be mapped into its job's input (or has no event id).
    TriggerInvalid => "TRIGGER_INVALID",
    /// An event id was delivered to the trigger before with another body.
    EventAlreadyDelivered => "EVENT_ALREADY_DELIVERED",
    /// No webhook delivery with that id is visible to the caller.
    DeliveryNotFound => "DELIVERY_NOT_FOUND",
    /// No HTTP route has this path (or not with this method).
    RouteNotFound => "ROUTE_NOT_FOUND",
    /// A request body is not in a media type the route accepts.
    UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
    /// The task finished; nothing moves it.
    TaskTerminal => "TASK_TERMINAL",
    /// The job's approval run was rejected or cancelled.
    ApprovalRejected => "APPROVAL_REJECTED",
    /// The job was cancelled while the task waited or ran.
    JobCancelled => "JOB_CANCELLED",
    /// Not run: a task it depends on failed (fail-fast).
    UpstreamFailed => "UPSTREAM_FAILED",
    /// The command is not on the executor's allowlist.
    CommandNotAllowed => "COMMAND_NOT_ALLOWED",
    /// The command exited non-zero or could not start.
    CommandFailed => "COMMAND_FAILED",
    /// The attempt ran past its timeout and was stopped.
    TaskTimeout => "TASK_TIMEOUT",
    /// A command task hit one of its resource limits (metadata `limit`
    /// names it: memory_bytes, cpu_seconds, processes, open_files,
    /// file_size_bytes).
    TaskResourceLimit => "TASK_RESOURCE_LIMIT",
    /// This executor cannot isolate command tasks (no Landlock in the
    /// kernel) and the operator has not turned the sandbox off.
    SandboxUnavailable => "SANDBOX_UNAVAILABLE",
    /// The job's or task's deadline passed.
    DeadlineExceeded => "DEADLINE_EXCEEDED",
    /// The agent answered ERROR.
    AgentError => "AGENT_ERROR",
    /// Every candidate agent answered REFUSED.
    AgentRefused => "AGENT_REFUSED",
    /// The agent could not be reached (offline, connection refused).
    AgentUnreachable => "AGENT_UNREACHABLE",
    /// A `${...}` template named a value that does not exist at run time.
    TemplateUnresolved => "TEMPLATE_UNRESOLVED",
    /// An LLM task, but no LLM provider is configured.
    LlmProviderNotConfigured => "LLM_PROVIDER_NOT_CONFIGURED",
    /// Every model in the fallback chain was rate-limited, unavailable or
    /// unreachable, or the provider answered with an error.
    LlmUnavailable => "LLM_UNAVAILABLE",
    /// The model's answer could not be used (malformed JSON, no choices).
    LlmBadResponse => "LLM_BAD_RESPONSE",
    /// A tool call's arguments do not match the tool's JSON Schema.
    ToolInvalidArguments => "AGENT_TOOL_INVALID_ARGUMENTS",
    /// A tool ran past its timeout.
    ToolTimeout => "AGENT_TOOL_TIMEOUT",
    /// A tool failed while running.
    ToolFailed => "AGENT_TOOL_FAILED",
    /// A person rejected a tool call that needed approval (or cancelled its
    /// approval run): the tool did not run.
    ToolCallRejected => "TOOL_CALL_REJECTED",
    /// Nobody decided about a tool call within the approval timeout: it
    /// counts as rejected.
    ToolApprovalTimeout => "TOOL_APPROVAL_TIMEOUT",
    /// An input task waits for a person's answer (a task's reason while it
    /// waits, not an error).
    InputRequired => "INPUT_REQUIRED",
    /// Nobody answered an input task within its wait, and it has no
    /// default answer.
    InputTimeout => "INPUT_TIMEOUT",
    /// SendInput to a task that does not wait for input (not an input
    /// task, not asked yet, already answered, or finished).
    InputNotWaiting => "INPUT_NOT_WAITING",
    /// The caller can see the job but is not among those the input task
    /// lets answer.
    InputNotAllowed => "INPUT_NOT_ALLOWED",
    /// The caller can see the job but is not among the conversation's
    /// participants.
    ConversationNotAllowed => "CONVERSATION_NOT_ALLOWED",
    /// A message to a conversation that has ended (closed, idle, at its
    /// message limit, or its job finished), or to a task that is not one.
    ConversationClosed => "CONVERSATION_CLOSED",
    /// An artifact's kind is not allowed by its run's `outputs_allowed`.
    ArtifactKindNotAllowed => "ARTIFACT_KIND_NOT_ALLOWED",
    /// An artifact is larger than the configured limit, or its name is not
    /// a plain file name.
    ArtifactInvalid => "ARTIFACT_INVALID",
    /// No artifact with that id or path belongs to the job or run.
    ArtifactNotFound => "ARTIFACT_NOT_FOUND",
    /// Adapter: the outside system could not be reached (connection refused,
    /// DNS, TLS, timeout).
    AdapterUnreachable => "ADAPTER_UNREACHABLE",
    /// Adapter: the outside system refused the submission (a 4xx answer).
    AdapterSubmissionRejected => "ADAPTER_SUBMISSION_REJECTED",
    /// Adapter: the outside system failed (a 5xx answer, or an answer that
    /// is not its protocol).
    AdapterBadResponse => "ADAPTER_BAD_RESPONSE",
    /// Adapter: the submitted job is unknown to the outside system.
    AdapterJobNotFound => "ADAPTER_JOB_NOT_FOUND",
    /// Adapter: the submitted job failed there.
    AdapterJobFailed => "ADAPTER_JOB_FAILED",
    /// Adapter: the submitted job was cancelled there.
    AdapterJobCancelled => "ADAPTER_JOB_CANCELLED",
    /// Adapter: the run names an adapter this server has not configured.
    AdapterNotConfigured => "ADAPTER_NOT_CONFIGURED",
    /// `tool_choice=required`, but the model answered without a tool call.
    ToolCallRequired => "AGENT_TOOL_CALL_REQUIRED",
    /// The agent loop reached `max_turns` without a final answer.
    AgentMaxTurns => "AGENT_MAX_TURNS",
    /// The agent loop used its `max_tokens_per_invocation`.
    AgentTokenLimit => "AGENT_TOKEN_LIMIT",
    /// The agent loop ran out of its `time_budget_ms`.
    AgentTimeBudget => "AGENT_TIME_BUDGET",
    /// `output_format=json`, but the answer is not JSON.
    AgentOutputNotJson => "AGENT_OUTPUT_NOT_JSON",
    /// The answer was cut off at `max_tokens` (`finish_reason: length`)
    /// before the JSON it had to be ended.
    AgentOutputTruncated => "AGENT_OUTPUT_TRUNCATED",
    /// The model's final answer was empty.
    AgentOutputEmpty => "AGENT_OUTPUT_EMPTY",
    /// Delegation needs the parent job to be active.
    ParentNotActive => "PARENT_NOT_ACTIVE",
    /// Delegation needs the parent's run to be running.
    RunNotRunning => "RUN_NOT_RUNNING",
    /// An agent manifest is invalid.
    InvalidManifest => "INVALID_MANIFEST",
    /// The request carries no credential; every RPC but health and
    /// reflection needs one.
    AuthRequired => "AUTH_REQUIRED",
    /// The credential is unknown, revoked, malformed or its signature fails.
    AuthInvalid => "AUTH_INVALID",
    /// The credential has expired.
    AuthExpired => "AUTH_EXPIRED",
    /// The principal lacks the permission the RPC needs (ErrorInfo metadata
    /// `permission` names it).
    PermissionDenied => "PERMISSION_DENIED",
    /// An agent acted on a job, budget or reservation without the
    /// invocation grant that covers it (missing, altered, expired, or for
    /// another job or budget): nothing was done.
    GrantRefused => "GRANT_REFUSED",
    /// A console form came without its session's anti-forgery token, or
    /// from another site: nothing was done. Reload the page and try again.
    FormForged => "FORM_FORGED",
    /// The named API key does not exist in the caller's tenant.
    KeyNotFound => "KEY_NOT_FOUND",
    /// A session was asked of a credential that cannot start one (a
    /// session or a service credential), or a session call came with
    /// something other than a session.
    SessionRefused => "SESSION_REFUSED",
    /// A request could not be decoded (bad protobuf bytes, invalid UTF-8 in a
    /// string field).
    MalformedRequest => "MALFORMED_REQUEST",
    /// A sum of money or tokens would overflow its integer type.
    AmountOverflow => "AMOUNT_OVERFLOW",
    /// The run needs a second, distinct approver (two-person rule): this
    /// approver already approved it.
    SecondApprovalRequired => "SECOND_APPROVAL_REQUIRED",
    /// A break-glass approval needs a reason.
    ReasonRequired => "REASON_REQUIRED",
    /// An internal invariant broke; a bug.
    Internal => "INTERNAL",
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_round_trips_and_is_unique() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(*r));
            assert!(seen.insert(r.as_str()), "duplicate wire form {r}");
            // google.rpc.ErrorInfo: `[A-Z][A-Z0-9_]+[A-Z0-9]`, at most 63.
            let s = r.as_str();
            let ok = s.len() <= 63
                && s.starts_with(|c: char| c.is_ascii_uppercase())
                && s.ends_with(|c: char| c.is_ascii_uppercase() || c.is_ascii_digit())
                && s.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            assert!(ok, "{r} does not match ErrorInfo's [A-Z][A-Z0-9_]+[A-Z0-9]");
        }
        assert_eq!(Reason::parse("NO_SUCH_REASON"), None);
    }
}
