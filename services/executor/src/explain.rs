//! The story of a job (issue 46 §2): its journal told in order, in words a
//! platform lead reads — who submitted it, how it was approved, where each
//! step went and why, what was reserved, spent and released, which tool
//! calls a person gated, delegations, handoffs and pauses — with times,
//! durations, the cost by step, agent and model against what was
//! approved, and whether the journal verifies. One function of a job and
//! its events ([`story`]); `ExplainJob`, `switchyard job explain` and the
//! console read it.

use std::collections::{BTreeMap, HashMap};

use switchyard_kit::money::usd_compact as usd;
use switchyard_kit::time::{human_duration, timestamp_ms};
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{CostShare, ExplainJobResponse, Job, StoryLine};

use crate::events::JobEvent;

/// What a reservation was for, to attribute its charge.
#[derive(Default, Clone)]
struct Hold {
    task: String,
    agent: String,
    model: String,
}

/// Running sums of one name.
#[derive(Default)]
struct Sum {
    cost: i64,
    tokens: u64,
    calls: u64,
}

fn shares(m: BTreeMap<String, Sum>) -> Vec<CostShare> {
    let mut v: Vec<CostShare> = m
        .into_iter()
        .map(|(name, s)| CostShare {
            name,
            cost_micro_usd: s.cost,
            tokens: s.tokens,
            calls: s.calls,
        })
        .collect();
    v.sort_by(|a, b| {
        b.cost_micro_usd
            .cmp(&a.cost_micro_usd)
            .then(a.name.cmp(&b.name))
    });
    v
}

fn plural(n: u64, one: &str) -> String {
    format!("{n} {one}{}", if n == 1 { "" } else { "s" })
}

/// `s` between `before` and `after`, or nothing when `s` is empty.
fn part(before: &str, s: &str, after: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("{before}{s}{after}")
    }
}

/// `: "s"` (a person's words, quoted), or nothing when `s` is empty.
fn quoted(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!(": {s:?}")
    }
}

/// "who" of a decision: a policy, a delegation or a person.
fn decider(by: &str) -> String {
    if let Some(p) = by.strip_prefix("policy:") {
        format!("automatically by policy {p:?}")
    } else if let Some(r) = by.strip_prefix("delegation:") {
        format!("as a delegation under run {r}")
    } else if by.is_empty() {
        "by nobody (it timed out)".into()
    } else {
        format!("by {by}")
    }
}

/// A policy set's version as a story prints it: `sha256:` and 12 digits.
fn short_version(v: &str) -> &str {
    v.get(..19).unwrap_or(v)
}

/// Adds what the policy set decided to the story's approval decision.
fn policy_said(out: &mut ExplainJobResponse, p: &switchyard_proto::common::v1::PolicyDecision) {
    let Some(line) = out
        .lines
        .iter_mut()
        .find(|l| l.topic == "approval" && l.text.starts_with("The run was"))
    else {
        return;
    };
    let version = short_version(&p.version);
    line.text.push_str(&format!(
        " Policy set {version}… decided {}{}{}.",
        if p.effect.is_empty() {
            "default"
        } else {
            &p.effect
        },
        if p.policies.is_empty() {
            String::new()
        } else {
            format!(" by {}", p.policies.join(", "))
        },
        part(": ", &p.explanation, "")
    ));
}

/// The story of `job` from its `events` (in the journal's order).
pub(crate) fn story(job: &Job, events: &[Event]) -> ExplainJobResponse {
    let start = events
        .first()
        .and_then(|e| e.time.as_ref())
        .map(timestamp_ms)
        .unwrap_or_default();
    let mut lines = Vec::new();
    let mut holds: HashMap<String, Hold> = HashMap::new();
    let (mut by_task, mut by_agent, mut by_model) = (
        BTreeMap::<String, Sum>::new(),
        BTreeMap::<String, Sum>::new(),
        BTreeMap::<String, Sum>::new(),
    );
    let mut spent = 0i64;
    let mut approved = 0i64;
    // When each step started running, and when each approval was asked.
    let mut started: HashMap<String, u64> = HashMap::new();
    let mut asked_at: Option<u64> = None;
    // The job this one runs again, if any (from its submission).
    let mut rerun_of = String::new();
    let mut last = start;
    for ev in events {
        let at = ev.time.as_ref().map(timestamp_ms).unwrap_or(last);
        last = at;
        let task = ev.task_id.as_str();
        let step = if task.is_empty() {
            "The job".to_owned()
        } else {
            format!("Step {task}")
        };
        let Ok(Some(decoded)) = JobEvent::decode(&ev.kind, ev.data.as_ref()) else {
            continue;
        };
        let (topic, text) = match decoded {
            JobEvent::Submitted(s) => {
                rerun_of.clone_from(&s.rerun_of);
                let again = match (s.rerun_of.as_str(), s.reused.is_empty()) {
                    ("", _) => String::new(),
                    (of, true) => format!(" It runs job {of} again, afresh."),
                    (of, false) => format!(
                        " It resumes job {of}, keeping {} that succeeded there ({}).",
                        plural(s.reused.len() as u64, "step"),
                        s.reused.join(", ")
                    ),
                };
                let fired = if s.schedule_id.is_empty() {
                    String::new()
                } else {
                    format!(
                        " Schedule {} started it for its tick at {}.",
                        s.schedule_id,
                        switchyard_kit::time::utc(s.schedule_tick_ms)
                    )
                };
                (
                    "submitted",
                    format!(
                        "Submitted by {} ({}, tenant {}) in the {} format, {}.{again}{fired}",
                        s.submitted_by,
                        s.submitter_kind,
                        s.tenant,
                        s.format,
                        plural(s.tasks, "step")
                    ),
                )
            }
            JobEvent::ApprovalRequested(r) => {
                asked_at = Some(at);
                approved = r.estimated_cost_micro_usd.unwrap_or(0);
                let cost = r
                    .estimated_cost_micro_usd
                    .map_or("an estimate that could not be priced".into(), |c| {
                        format!("an estimated {}", usd(c))
                    });
                (
                    "approval",
                    format!(
                        "Approval asked (run {}): {cost} for up to {}{}.",
                        r.run_id,
                        plural(r.max_tokens, "token"),
                        if r.skip_policies {
                            "; the job asked for a person whatever the policies say"
                        } else {
                            ""
                        }
                    ),
                )
            }
            JobEvent::ApprovalDecided(d) => (
                "approval",
                format!(
                    "The run was {} {}{}.",
                    d.status,
                    decider(&d.by),
                    asked_at
                        .map(|t| format!(" after {}", human_duration(at.saturating_sub(t))))
                        .unwrap_or_default()
                ),
            ),
            JobEvent::BudgetCreated(b) => (
                "budget",
                if b.parent_id.is_empty() {
                    format!("Budget {} opened for the job.", b.budget_id)
                } else {
                    format!("Budget {} opened under {}.", b.budget_id, b.parent_id)
                },
            ),
            JobEvent::ScopeHeld(h) => (
                "budget",
                if h.refused.is_empty() {
                    format!(
                        "Held {} and {} for the approved scope (reservation {}); the steps draw from it.",
                        usd(h.cost_micro_usd),
                        plural(h.tokens, "token"),
                        h.reservation_id
                    )
                } else {
                    format!("The approved scope could not be held: {}.", h.refused)
                },
            ),
            JobEvent::Routed(r) => {
                let ranked: Vec<String> = r
                    .candidates
                    .iter()
                    .map(|c| {
                        format!(
                            "{} (score {:.2}: trust {:.2}, cost {:.2}, latency {:.2}; {} per {})",
                            c.agent_id,
                            c.score,
                            c.breakdown.trust,
                            c.breakdown.cost,
                            c.breakdown.latency,
                            usd(c.price_per_unit_micro_usd),
                            if c.unit.is_empty() { "call" } else { &c.unit }
                        )
                    })
                    .collect();
                let filtered: Vec<String> = r
                    .filtered
                    .iter()
                    .map(|(why, n)| format!("{n} {why}"))
                    .collect();
                (
                    "routing",
                    format!(
                        "{step} routed {} to {}{}.",
                        r.capability,
                        if ranked.is_empty() {
                            "no agent".to_owned()
                        } else {
                            ranked.join(", then ")
                        },
                        if filtered.is_empty() {
                            String::new()
                        } else {
                            format!("; left out: {}", filtered.join(", "))
                        }
                    ),
                )
            }
            JobEvent::Downgraded(d) => (
                "routing",
                format!(
                    "{step}: the budget refused {} at {} ({}), so it went to the cheaper {} at {}.",
                    d.from_agent,
                    usd(d.from_price_micro_usd),
                    d.reason,
                    d.to_agent,
                    usd(d.to_price_micro_usd)
                ),
            ),
            JobEvent::Reserved(r) => {
                let what = if !r.agent_id.is_empty() {
                    format!(" for agent {}", r.agent_id)
                } else if let Some(n) = r.call {
                    format!(" for model call {n}")
                } else {
                    String::new()
                };
                holds.insert(
                    r.reservation_id.clone(),
                    Hold {
                        task: task.to_owned(),
                        agent: r.agent_id.clone(),
                        model: String::new(),
                    },
                );
                (
                    "budget",
                    format!(
                        "{step} reserved {} and {}{what}.",
                        usd(r.cost_micro_usd),
                        plural(r.tokens, "token")
                    ),
                )
            }
            JobEvent::Committed(c) => {
                let hold = holds.remove(&c.reservation_id).unwrap_or(Hold {
                    task: task.to_owned(),
                    ..Default::default()
                });
                spent += c.cost_micro_usd;
                let add = |m: &mut BTreeMap<String, Sum>, k: &str| {
                    if !k.is_empty() {
                        let s = m.entry(k.to_owned()).or_default();
                        s.cost += c.cost_micro_usd;
                        s.tokens += c.tokens;
                    }
                };
                add(&mut by_task, &hold.task);
                add(&mut by_agent, &hold.agent);
                add(&mut by_model, &hold.model);
                (
                    "budget",
                    format!(
                        "{step} spent {} and {}{}.",
                        usd(c.cost_micro_usd),
                        plural(c.tokens, "token"),
                        if c.overrun {
                            " — more than it had reserved"
                        } else {
                            ""
                        }
                    ),
                )
            }
            JobEvent::Released(r) => (
                "budget",
                // (A released hold is settled: no later call pays from it.)
                {
                    holds.remove(&r.reservation_id);
                    format!(
                        "{step} released reservation {} unused ({}).",
                        r.reservation_id, r.why
                    )
                },
            ),
            JobEvent::SlotWait(w) => (
                "job",
                if w.phase == "waiting" {
                    format!(
                        "{step}: it waited for a slot: tenant {} may run {} jobs at once and all were running.",
                        w.tenant, w.cap
                    )
                } else {
                    format!("{step}: it took a slot after waiting {} ms.", w.waited_ms)
                },
            ),
            JobEvent::RateLimited(r) => (
                "llm",
                match r.phase.as_str() {
                    "waiting" => format!(
                        "{step}: model call {} waited for rate-limit room ({}).",
                        r.call, r.why
                    ),
                    "granted" => format!(
                        "{step}: model call {} went after waiting {} ms for rate-limit room.",
                        r.call, r.waited_ms
                    ),
                    _ => format!(
                        "{step}: model call {} gave up after waiting {} ms: {}.",
                        r.call, r.waited_ms, r.why
                    ),
                },
            ),
            JobEvent::Refused(r) => (
                "budget",
                format!("{step}: budget {} refused: {}.", r.refused_by, r.message),
            ),
            JobEvent::BilledByAgent(b) => {
                spent += b.cost_micro_usd;
                for (m, k) in [
                    (&mut by_task, task),
                    (&mut by_agent, b.agent_id.as_str()),
                    (&mut by_model, b.model.as_str()),
                ] {
                    if !k.is_empty() {
                        let s = m.entry(k.to_owned()).or_default();
                        s.cost += b.cost_micro_usd;
                        s.tokens += b.tokens;
                    }
                }
                (
                    "budget",
                    format!(
                        "{step}: agent {} billed {} and {} on model {} itself.",
                        b.agent_id,
                        usd(b.cost_micro_usd),
                        plural(b.tokens, "token"),
                        b.model
                    ),
                )
            }
            JobEvent::BudgetPaused(p) => (
                "budget",
                format!(
                    "Paused: {} ran out at {} ({}); asked for {} and {} more to finish {} (run {}).",
                    p.dimension,
                    p.refused_by,
                    p.message,
                    usd(p.cost_micro_usd),
                    plural(p.tokens, "token"),
                    p.remaining_tasks.join(", "),
                    p.run_id
                ),
            ),
            JobEvent::ExtensionDecided(d) => {
                if d.decision == "approved" {
                    approved += d.granted_cost_micro_usd.unwrap_or(0);
                }
                (
                    "budget",
                    format!(
                        "The extension was {} {}{}{}.",
                        d.decision,
                        decider(&d.by),
                        d.granted_cost_micro_usd
                            .map(|c| format!(", granting {}", usd(c)))
                            .unwrap_or_default(),
                        quoted(&d.comment)
                    ),
                )
            }
            JobEvent::TaskMoved(m) => {
                if m.to == "running" {
                    started.insert(task.to_owned(), at);
                }
                let took = match m.to.as_str() {
                    "succeeded" | "failed" | "cancelled" | "skipped" | "retrying" => started
                        .get(task)
                        .map(|t| format!(" after {}", human_duration(at.saturating_sub(*t))))
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                if matches!(m.to.as_str(), "ready" | "waiting") && m.reason.is_empty() {
                    continue;
                }
                let to = match m.to.as_str() {
                    "running" => "started",
                    "retrying" => "will retry",
                    other => other,
                };
                if m.from == "waiting" && m.to == "succeeded" {
                    // Kept by a resume: never run here.
                    (
                        "state",
                        format!(
                            "{step} kept from job {rerun_of}: its output is that job's, and it did not run again."
                        ),
                    )
                } else {
                    (
                        "state",
                        format!(
                            "{step} {to}{took}{}{}.",
                            part(" (", &m.reason, ")"),
                            part(": ", &m.error, "")
                        ),
                    )
                }
            }
            JobEvent::AttemptStarted(a) => {
                by_task.entry(task.to_owned()).or_default();
                (
                    "attempt",
                    format!(
                        "{step}: attempt {} started (timeout {} s){}.",
                        a.attempt,
                        a.timeout_secs,
                        part(" on worker ", &a.worker_id, "")
                    ),
                )
            }
            JobEvent::AgentCalled(c) => {
                let s = by_agent.entry(c.agent_id.clone()).or_default();
                s.calls += 1;
                by_task.entry(task.to_owned()).or_default().calls += 1;
                (
                    "agent",
                    format!(
                        "{step}: agent {} answered {} in {}{}.",
                        c.agent_id,
                        c.status,
                        human_duration(c.latency_ms),
                        part(": ", &c.error, "")
                    ),
                )
            }
            JobEvent::LlmCalled(c) => {
                let call = &c.call;
                let s = by_model.entry(call.model.clone()).or_default();
                s.calls += 1;
                by_task.entry(task.to_owned()).or_default().calls += 1;
                let ok = call.outcome == "ok";
                // The call's charge is the step's open model reservation:
                // the model that answered is the one it pays for (a
                // fallback's failed tries spend nothing). A fallback's own
                // reservation of rate-limit room is open beside it, so
                // every open one of the step is the answering model's.
                if ok {
                    for h in holds
                        .values_mut()
                        .filter(|h| h.task == task && h.agent.is_empty() && h.model.is_empty())
                    {
                        h.model.clone_from(&call.model);
                    }
                }
                (
                    "model",
                    if ok {
                        format!(
                            "{step}: model {} ({}) answered turn {} in {}: {} prompt + {} completion tokens{}.",
                            call.model,
                            call.provider,
                            c.turn,
                            human_duration(call.latency_ms),
                            call.prompt_tokens,
                            call.completion_tokens,
                            part(", ", &call.finish_reason, "")
                        )
                    } else {
                        format!(
                            "{step}: model {} ({}) failed turn {} after {} ({}: {}); the next model in the fallback order is tried.",
                            call.model,
                            call.provider,
                            c.turn,
                            human_duration(call.latency_ms),
                            call.outcome,
                            call.error
                        )
                    },
                )
            }
            JobEvent::ToolCalled(t) => (
                "tool",
                format!(
                    "{step}: tool {} ran {} in {}{}.",
                    t.name,
                    t.status,
                    human_duration(t.duration_ms),
                    if t.error.is_empty() {
                        String::new()
                    } else {
                        format!(" ({}: {})", t.reason, t.error)
                    }
                ),
            ),
            JobEvent::AwaitingApproval(a) => (
                "tool",
                format!(
                    "{step}: the call {}({}) waits for a person (run {}).",
                    a.tool, a.arguments, a.run_id
                ),
            ),
            JobEvent::CallDecided(d) => (
                "tool",
                format!(
                    "{step}: the call of {} was {} {}{}{}.",
                    d.tool,
                    d.decision,
                    decider(&d.by),
                    part(", edited to ", &d.edited, ""),
                    quoted(&d.comment)
                ),
            ),
            JobEvent::Delegated(d) => (
                "delegation",
                format!("{step} delegated work to child job {}.", d.child_job_id),
            ),
            JobEvent::ChildSettled(c) => (
                "delegation",
                format!(
                    "{step}: child job {} ended {}, using {} and {}.",
                    c.child_job_id,
                    c.state
                        .trim_start_matches("JOB_STATE_")
                        .to_ascii_lowercase(),
                    usd(c.cost_micro_usd),
                    plural(c.tokens, "token")
                ),
            ),
            JobEvent::HandoffStarted(h) => (
                "handoff",
                format!(
                    "{step} handed the conversation to agent {} ({}): {:?}.",
                    h.agent_id, h.capability, h.task
                ),
            ),
            JobEvent::HandoffReclaimed(h) => (
                "handoff",
                format!(
                    "{step} took the conversation back from agent {} ({}) after {}, {} and {}.",
                    h.agent_id,
                    h.why,
                    plural(u64::from(h.turns), "turn"),
                    plural(h.tokens, "token"),
                    usd(h.cost_micro_usd)
                ),
            ),
            JobEvent::InputRequested(i) => {
                ("input", format!("{step} asked for input: {:?}.", i.prompt))
            }
            JobEvent::InputReceived(i) => (
                "input",
                format!("{step}: input {}{}.", i.outcome, part(" from ", &i.by, "")),
            ),
            JobEvent::ConversationEnded(c) => (
                "conversation",
                format!(
                    "{step}: the conversation ended ({}) after {}.",
                    c.why,
                    plural(u64::from(c.messages), "message")
                ),
            ),
            JobEvent::ArtifactStored(a) => (
                "artifact",
                format!(
                    "{step} stored artifact {} ({}, {} bytes).",
                    a.name, a.kind, a.size_bytes
                ),
            ),
            JobEvent::ArtifactRefused(a) => (
                "artifact",
                format!(
                    "{step}: artifact {} was refused ({}): {}.",
                    a.name, a.reason, a.message
                ),
            ),
            JobEvent::JobMoved(m) => (
                "state",
                format!(
                    "The job became {}{}{}{}.",
                    m.to,
                    if matches!(m.to.as_str(), "completed" | "cancelled" | "discarded") {
                        format!(" after {}", human_duration(at.saturating_sub(start)))
                    } else {
                        String::new()
                    },
                    part(" (", &m.reason, ")"),
                    part(": ", &m.error, "")
                ),
            ),
            JobEvent::Revived(r) => (
                "state",
                format!(
                    "Retried from the dead letter by {} (round {}).",
                    r.by, r.round
                ),
            ),
            JobEvent::Notice(n) => ("notice", n.message.clone()),
            // A run's spend is told with its approval (`policy_said`).
            JobEvent::PolicyDecided(d) if d.facts.action == switchyard_policy::Action::Spend => {
                continue;
            }
            JobEvent::PolicyDecided(d) => (
                "policy",
                format!(
                    "{step}: the policies decided {} {}: {} ({}; policy set {}…).",
                    d.facts.action.as_str(),
                    d.facts.resource,
                    d.outcome().words(),
                    if d.policies.is_empty() {
                        "no policy matched".to_owned()
                    } else {
                        format!("{} by {}", d.effect, d.policies.join(", "))
                    },
                    short_version(&d.version)
                ),
            ),
            JobEvent::DependencyWaiting(d) => (
                "notice",
                format!("{step} waits for the {} service: {}.", d.service, d.error),
            ),
            JobEvent::DependencyRecovered(d) => (
                "notice",
                format!(
                    "The {} service answered again after {}.",
                    d.service,
                    human_duration(d.waited_ms)
                ),
            ),
            JobEvent::Overrun(o) => (
                "budget",
                format!(
                    "{step}: model {} used {} where {} were reserved; the step stops.",
                    o.model,
                    plural(o.used_tokens, "token"),
                    o.reserved_tokens
                ),
            ),
            // Streamed pieces and progress: the calls they belong to tell
            // the story; the rest is said by the events above.
            JobEvent::Output(_)
            | JobEvent::LlmDelta(_)
            | JobEvent::ToolProgress(_)
            | JobEvent::AgentProgress(_)
            | JobEvent::ResultStored(_)
            | JobEvent::WorkerFailed(_)
            | JobEvent::MessageReceived(_)
            | JobEvent::Replied(_)
            | JobEvent::AgentInvoked(_)
            | JobEvent::AgentResult(_)
            | JobEvent::AgentError(_) => continue,
        };
        lines.push(StoryLine {
            time: ev.time,
            offset_ms: at.saturating_sub(start),
            task_id: task.to_owned(),
            topic: topic.to_owned(),
            text,
            sequence: ev.sequence,
        });
    }
    let state = switchyard_proto::executor::v1::JobState::try_from(job.state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("JOB_STATE_")
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    ExplainJobResponse {
        job_id: job
            .spec
            .as_ref()
            .map(|s| s.job_id.clone())
            .unwrap_or_default(),
        state,
        lines,
        by_task: shares(by_task),
        by_agent: shares(by_agent),
        by_model: shares(by_model),
        spent_micro_usd: spent,
        approved_micro_usd: approved,
        duration_ms: last.saturating_sub(start),
        journal: String::new(),
    }
}

impl crate::Executor {
    /// Job `job_id`'s story, with whether its journal verifies.
    pub async fn explain(
        &self,
        job_id: &str,
    ) -> Result<ExplainJobResponse, crate::error::ExecutorError> {
        let job = self.job(job_id).await?;
        let events = self.journal_of(job_id).await?;
        let mut out = story(&job, &events);
        out.job_id = job_id.to_owned();
        // Which policy set decided the run, and how: the approval service
        // keeps it with the run (read as this service; the caller may read
        // the job, whose run it is).
        if let Some(p) = self.run_policy(&job.run_id).await {
            policy_said(&mut out, &p);
        }
        out.journal = self.check_journal(job_id, &job, &events).await?;
        Ok(out)
    }

    /// What the policy set decided for run `run_id`, as the approval
    /// service keeps it (`None`: no run, none recorded, or not readable).
    pub(crate) async fn run_policy(
        &self,
        run_id: &str,
    ) -> Option<switchyard_proto::common::v1::PolicyDecision> {
        if run_id.is_empty() {
            return None;
        }
        self.inner
            .clients
            .approval
            .get_run(switchyard_proto::approval::v1::GetRunRequest {
                run_id: run_id.to_owned(),
            })
            .await
            .ok()
            .and_then(|r| r.run)
            .and_then(|r| r.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{AgentCalled, Committed, Released, Reserved};

    fn ev(seq: u64, ms: u64, task: &str, e: JobEvent) -> Event {
        Event {
            sequence: seq,
            time: Some(switchyard_kit::time::timestamp(ms)),
            task_id: task.into(),
            kind: e.kind().into(),
            data: e.data(),
            ..Default::default()
        }
    }

    #[test]
    fn charges_go_to_the_step_and_agent_that_reserved_them_and_released_holds_to_nobody() {
        let reserve = |id: &str, agent: &str| {
            JobEvent::Reserved(Reserved {
                reservation_id: id.into(),
                tokens: 10,
                cost_micro_usd: 100,
                agent_id: agent.into(),
                call: None,
            })
        };
        let events = [
            ev(1, 1_000, "a", reserve("r1", "cheap")),
            ev(
                2,
                1_050,
                "a",
                JobEvent::Released(Released {
                    reservation_id: "r1".into(),
                    why: "agent failed".into(),
                }),
            ),
            ev(3, 1_100, "b", reserve("r2", "dear")),
            ev(
                4,
                1_200,
                "b",
                JobEvent::AgentCalled(AgentCalled {
                    agent_id: "dear".into(),
                    status: "success".into(),
                    latency_ms: 90,
                    error: String::new(),
                }),
            ),
            ev(
                5,
                2_500,
                "b",
                JobEvent::Committed(Committed {
                    reservation_id: "r2".into(),
                    tokens: 7,
                    cost_micro_usd: 70,
                    overrun: false,
                }),
            ),
        ];
        let x = story(&Job::default(), &events);
        assert_eq!(x.spent_micro_usd, 70);
        assert_eq!(x.duration_ms, 1_500);
        assert_eq!(
            x.by_agent
                .iter()
                .map(|s| (s.name.as_str(), s.cost_micro_usd, s.calls))
                .collect::<Vec<_>>(),
            [("dear", 70, 1)]
        );
        assert_eq!(
            x.by_task
                .iter()
                .map(|s| (s.name.as_str(), s.tokens))
                .collect::<Vec<_>>(),
            [("b", 7)]
        );
        let texts: Vec<&str> = x.lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(
            texts[0],
            "Step a reserved $0.0001 and 10 tokens for agent cheap."
        );
        assert_eq!(
            texts[1],
            "Step a released reservation r1 unused (agent failed)."
        );
        assert_eq!(texts[4], "Step b spent $0.00007 and 7 tokens.");
        assert_eq!((x.lines[4].offset_ms, x.lines[4].sequence), (1_500, 5));
    }
}
