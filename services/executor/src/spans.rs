//! The executor's trace spans: one per task attempt, the routing decision,
//! each budget step, and — named as the OpenTelemetry GenAI conventions
//! name them — each agent invocation (`invoke_agent {agent}`) and tool call
//! (`execute_tool {tool}`). Model calls' `chat {model}` spans come from
//! `switchyard-llm`. Switchyard's own decisions and costs are attributes
//! in the `switchyard.*` namespace; every span carries the job's
//! `correlation_id`, like the RPC spans.

use switchyard_kit::telemetry::int;
use tracing::field::Empty;

use crate::attempt::{NotHeld, Snapshot};

/// The span of one attempt of a task, child of the job's span.
pub(crate) fn task(snap: &Snapshot, kind: &str) -> tracing::Span {
    tracing::info_span!(
        "executor.task",
        otel.name = "executor.task",
        correlation_id = %snap.correlation_id,
        switchyard.job.id = %snap.job_id,
        switchyard.task.id = %snap.task.id,
        switchyard.task.kind = kind,
        switchyard.task.attempt = i64::from(snap.attempt),
    )
}

/// The span of routing a capability; [`routed`] records the decision.
pub(crate) fn route(snap: &Snapshot, capability: &str) -> tracing::Span {
    tracing::info_span!(
        "switchyard.route",
        otel.name = "switchyard.route",
        correlation_id = %snap.correlation_id,
        switchyard.route.capability = %capability,
        switchyard.route.candidates = Empty,
        switchyard.route.agent_id = Empty,
        switchyard.route.score = Empty,
        switchyard.route.price_micro_usd = Empty,
    )
}

/// Records the candidate tried first and how many there were.
pub(crate) fn routed(span: &tracing::Span, candidates: &[switchyard_proto::router::v1::Candidate]) {
    span.record("switchyard.route.candidates", candidates.len() as i64);
    if let Some(c) = candidates.first() {
        span.record("switchyard.route.agent_id", c.agent_id.as_str());
        span.record("switchyard.route.score", c.score);
        span.record(
            "switchyard.route.price_micro_usd",
            c.price_per_unit_micro_usd,
        );
    }
}

/// The span of one call to an agent (`invoke_agent {agent}`, kind client).
pub(crate) fn invoke_agent(snap: &Snapshot, agent_id: &str, capability: &str) -> tracing::Span {
    tracing::info_span!(
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {agent_id}"),
        otel.kind = "client",
        otel.status_code = Empty,
        correlation_id = %snap.correlation_id,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.provider.name = "switchyard",
        gen_ai.agent.id = %agent_id,
        gen_ai.agent.name = %agent_id,
        gen_ai.response.model = Empty,
        error.type = Empty,
        switchyard.capability = %capability,
        switchyard.agent.status = Empty,
        switchyard.agent.tokens_used = Empty,
        switchyard.cost.micro_usd = Empty,
    )
}

/// The span of one tool call an LLM task's model asked for
/// (`execute_tool {tool}`); `kind` is the conventions' `gen_ai.tool.type`
/// (`function` for commands and registered tools, `extension` for MCP
/// servers' tools and agents).
pub(crate) fn execute_tool(
    snap: &Snapshot,
    tool: &str,
    call_id: &str,
    kind: &str,
) -> tracing::Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %format_args!("execute_tool {tool}"),
        otel.status_code = Empty,
        correlation_id = %snap.correlation_id,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool,
        gen_ai.tool.call.id = %call_id,
        gen_ai.tool.type = kind,
        error.type = Empty,
    )
}

/// Marks `span` failed, with the error's kind (`error.type`).
pub(crate) fn failed(span: &tracing::Span, kind: &str) {
    span.record("error.type", kind);
    span.record("otel.status_code", "ERROR");
}

/// The span of one budget step (`switchyard.budget.reserve`, `.commit`,
/// `.release`) on the job's budget, with the money and tokens it moves.
pub(crate) fn budget(
    snap: &Snapshot,
    step: &str,
    tokens: u64,
    cost_micro_usd: i64,
) -> tracing::Span {
    tracing::info_span!(
        "switchyard.budget",
        otel.name = %format_args!("switchyard.budget.{step}"),
        otel.status_code = Empty,
        correlation_id = %snap.correlation_id,
        switchyard.budget.id = %snap.budget_id,
        switchyard.budget.tokens = int(tokens),
        switchyard.cost.micro_usd = cost_micro_usd,
        switchyard.budget.reservation_id = Empty,
        switchyard.budget.outcome = Empty,
        switchyard.budget.overrun = Empty,
        switchyard.budget.why = Empty,
    )
}

/// Records a reservation's outcome: its id, or why there is none.
pub(crate) fn reserved(span: &tracing::Span, held: &Result<switchyard_api::spend::Hold, NotHeld>) {
    match held {
        Ok(h) => {
            span.record("switchyard.budget.reservation_id", h.id());
            span.record("switchyard.budget.outcome", "reserved");
        }
        Err(e) => {
            let outcome = match e {
                NotHeld::CostLimit(_) => "task_cost_limit",
                NotHeld::Budget(..) => "budget_refused",
                NotHeld::RateLimited(_) => "rate_limited",
                NotHeld::Unavailable(_) => "unavailable",
                NotHeld::Unreachable(_) => "unreachable",
            };
            span.record("switchyard.budget.outcome", outcome);
            failed(span, outcome);
        }
    }
}

/// The gRPC code of a failed call, as `error.type`.
pub(crate) fn code(e: &tonic::Status) -> &'static str {
    switchyard_kit::metrics::code_name(e.code())
}

/// The span of proposing a job's approval run: what it is estimated to
/// cost and whether a policy (or the parent job) approved it at once.
pub(crate) fn propose(
    correlation_id: &str,
    run: &switchyard_proto::approval::v1::Run,
) -> tracing::Span {
    let estimate = run.cost_estimate.unwrap_or_default();
    tracing::info_span!(
        "switchyard.approval.propose",
        otel.name = "switchyard.approval.propose",
        otel.status_code = Empty,
        correlation_id = %correlation_id,
        switchyard.approval.run_id = %run.run_id,
        switchyard.approval.requires_person = run.requires_approval,
        switchyard.cost.estimated_micro_usd = estimate.estimated_cost.map_or(0, |m| m.micro_usd),
        switchyard.approval.estimated_tokens =
            int(estimate.estimated_input_tokens.saturating_add(estimate.estimated_output_tokens)),
        switchyard.approval.decision = Empty,
        switchyard.approval.approved_by = Empty,
    )
}

/// Records a proposal's outcome: `approved` (and by which policy, parent
/// or person) or `pending` a person's decision.
pub(crate) fn proposed(span: &tracing::Span, approved_by: Option<&str>) {
    match approved_by {
        Some(by) => {
            span.record("switchyard.approval.decision", "approved");
            span.record("switchyard.approval.approved_by", by);
        }
        None => {
            span.record("switchyard.approval.decision", "pending");
        }
    }
}

/// The span of a job waiting for its approval run to be its to run (a
/// person's decision, or a claim after a restart).
pub(crate) fn approval_wait(correlation_id: &str, run_id: &str) -> tracing::Span {
    tracing::info_span!(
        "switchyard.approval.wait",
        otel.name = "switchyard.approval.wait",
        otel.status_code = Empty,
        correlation_id = %correlation_id,
        switchyard.approval.run_id = %run_id,
        switchyard.approval.outcome = Empty,
    )
}
