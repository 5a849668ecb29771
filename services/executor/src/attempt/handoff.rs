//! Handoff mode (seed ADR 003, phase 2): a conversation's orchestrator
//! hands the conversation to an agent registered with integration mode
//! HANDOFF; the agent then answers the person's messages — proxied through
//! the executor, never direct — until the conversation is reclaimed.
//!
//! Who holds the conversation is a table-driven machine
//! ([`switchyard_core::lifecycle::Holder`]) whose state is derived from the
//! log (`handoff.started`, `handoff.reclaimed`). The reclaim triggers are
//! checked before each message the agent would answer — the person's
//! `/reclaim`, the handoff's `timeout_secs`, `max_turns`, `max_tokens` and
//! `max_cost_micro_usd` — and after each of its answers: it handed back
//! (`handback: true` in its output), it failed, or it refused. A message
//! that arrives during a reclaim waits in the log and is answered by the
//! orchestrator, which holds the conversation once the reclaim is recorded.
//!
//! Context isolation: the agent is sent the handoff's task and the messages
//! since the handoff (the person's and its own replies), nothing from
//! before — not the orchestrator's instructions, history or tools.

use serde_json::{Value, json};
use switchyard_core::Reason;
use switchyard_kit::json::struct_to_json;
use switchyard_proto::executor::v1::{AgentTask, ConversationTask, HandoffLimits};

use super::{Attempt, Snapshot};
use crate::conversation::{self as talk, Talk};
use crate::events::{self, JobEvent};
use crate::schedule::Class;

/// The command that takes the conversation back to the orchestrator.
pub(crate) const RECLAIM_COMMAND: &str = "/reclaim";

/// A handoff's most messages when its limits say 0.
const DEFAULT_MAX_TURNS: u32 = 20;
/// A handoff's longest life when its limits say 0, seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 3_600;

/// A handoff's limits, defaults filled in.
pub(crate) fn limits(c: &ConversationTask) -> HandoffLimits {
    let l = c.handoff.unwrap_or_default();
    HandoffLimits {
        max_turns: if l.max_turns == 0 {
            DEFAULT_MAX_TURNS
        } else {
            l.max_turns
        },
        timeout_secs: if l.timeout_secs == 0 {
            DEFAULT_TIMEOUT_SECS as u32
        } else {
            l.timeout_secs
        },
        ..l
    }
}

/// Why the conversation goes back to the orchestrator before message
/// `text` reaches the agent holding it, if it does.
pub(crate) fn reclaim_before(
    t: &Talk,
    l: &HandoffLimits,
    text: &str,
    now_ms: u64,
) -> Option<&'static str> {
    let h = t.handoff.as_ref()?;
    if text.trim() == RECLAIM_COMMAND {
        Some(talk::BY_USER)
    } else if now_ms.saturating_sub(h.started.at_ms) >= u64::from(l.timeout_secs) * 1000 {
        Some(talk::TIMED_OUT)
    } else if h.turns >= l.max_turns {
        Some(talk::MAX_TURNS)
    } else if (l.max_tokens > 0 && h.tokens >= l.max_tokens)
        || (l.max_cost_micro_usd > 0 && h.cost >= l.max_cost_micro_usd)
    {
        Some(talk::OVER_BUDGET)
    } else {
        None
    }
}

/// What an agent holding the conversation answered.
pub(crate) enum Answered {
    /// Its reply, and whether it hands the conversation back (with its
    /// result for the orchestrator).
    Reply {
        text: String,
        handback: Option<Value>,
    },
    /// The job's budget refused the call: the turn is paused.
    Paused(String, Reason),
    /// It failed or refused (`error` or `refused`): the orchestrator takes
    /// the conversation back and answers.
    Failed { status: &'static str, error: String },
}

impl Attempt<'_> {
    /// Message `seq` (`text`) answered by the agent of handoff `h`, which
    /// is sent the handoff's task and `messages` — the conversation since
    /// the handoff — and nothing else.
    pub(crate) async fn agent_turn(
        &self,
        h: &events::HandoffStarted,
        seq: u32,
        text: &str,
        messages: Vec<Value>,
    ) -> Answered {
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        let invoked = events::AgentInvoked {
            agent_id: h.agent_id.clone(),
            seq,
            messages: messages.len() as u32,
        };
        book.note(&s.job_id, &s.task.id, JobEvent::AgentInvoked(invoked));
        let before = self.spent();
        let mut snap: Snapshot = s.clone_for_call(&format!("msg/{seq}/agent"));
        snap.task.name = h.task.clone();
        snap.user_message = text.to_owned();
        let call = Attempt {
            x,
            snap: &snap,
            timeout: self.timeout,
            scratch: self.scratch,
        };
        let a = AgentTask {
            capability: h.capability.clone(),
            prefer_agents: vec![h.agent_id.clone()],
            ..Default::default()
        };
        let input = json!({"task": h.task, "messages": messages});
        let out = call.agent_only(&a, input, &h.agent_id).await;
        let (tokens, cost) = {
            let after = self.spent();
            (
                after.0.saturating_sub(before.0),
                after.1.saturating_sub(before.1),
            )
        };
        match (out.failure, out.status) {
            (None, Some(status)) => {
                let output = status
                    .output
                    .as_ref()
                    .map(struct_to_json)
                    .unwrap_or_default();
                let text = output
                    .get("reply")
                    .or_else(|| output.get("content"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let handback = (output.get("handback") == Some(&Value::Bool(true)))
                    .then(|| output.get("result").cloned().unwrap_or(Value::Null));
                let result = events::AgentResult {
                    agent_id: h.agent_id.clone(),
                    seq,
                    tokens,
                    cost_micro_usd: cost,
                    handback: handback.is_some(),
                };
                book.note(&s.job_id, &s.task.id, JobEvent::AgentResult(result));
                Answered::Reply { text, handback }
            }
            (Some(f), _) if f.class == Class::Budget => Answered::Paused(f.error, f.reason),
            (f, _) => {
                let (reason, error) = f.map_or(
                    (Reason::AgentError, "the agent returned nothing".to_owned()),
                    |f| (f.reason, f.error),
                );
                let status = if reason == Reason::AgentRefused {
                    "refused"
                } else {
                    "error"
                };
                let failed = events::AgentFailed {
                    agent_id: h.agent_id.clone(),
                    seq,
                    status: status.to_owned(),
                    reason: reason.as_str().to_owned(),
                    error: error.clone(),
                    tokens,
                    cost_micro_usd: cost,
                };
                book.note(&s.job_id, &s.task.id, JobEvent::AgentError(failed));
                Answered::Failed { status, error }
            }
        }
    }

    /// Tokens and money the task has spent so far (its budget's view).
    fn spent(&self) -> (u64, i64) {
        task_spent(self.x, self.snap)
    }
}

/// Tokens and money task `snap` has spent so far, as its record says.
pub(crate) fn task_spent(x: &crate::Executor, snap: &Snapshot) -> (u64, i64) {
    let st = x.inner.book.lock();
    st.get(&snap.job_id)
        .ok()
        .and_then(|e| e.index.get(&snap.task.id).map(|&i| &e.job.tasks[i]))
        .map_or((0, 0), |t| {
            (t.tokens_used, t.cost.as_ref().map_or(0, |m| m.micro_usd))
        })
}
