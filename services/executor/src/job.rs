//! A job's state is derived only from its events: live changes build an
//! event, [`JobEntry::apply`] it, then append it to the durable log; start-up
//! replays the log through the same `apply`. So "the state equals the replay
//! of the log" holds by construction.

use std::collections::{BTreeMap, HashSet};

use serde_json::{Value, json};
use switchyard_core::dag::Dag;
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_kit::json::{json_to_struct, struct_to_json};
use switchyard_kit::time::timestamp;
use switchyard_proto::common::v1::{Event, Money};
use switchyard_proto::executor::v1::{self as pb, Attempt, Job, JobSpec, Progress, TaskStatus};

/// Event kinds, `<area>.<what>`.
pub mod kind {
    /// The job was accepted (data: format, tasks, submitted_by, traceparent).
    pub const SUBMITTED: &str = "job.submitted";
    /// The job changed state (data: from, to, reason, error).
    pub const JOB_STATE: &str = "job.state";
    /// An approval run was proposed (data: run_id, estimates, context_hash).
    pub const APPROVAL_REQUESTED: &str = "approval.requested";
    /// The approval run was decided (data: status, by, comment).
    pub const APPROVAL_DECIDED: &str = "approval.decided";
    /// The job's budget exists (data: budget_id, parent_id).
    pub const BUDGET_CREATED: &str = "budget.created";
    /// A reservation was made (data: reservation_id, tokens, cost_micro_usd).
    pub const RESERVED: &str = "budget.reserved";
    /// A reservation was committed (data: reservation_id, tokens, cost_micro_usd).
    pub const COMMITTED: &str = "budget.committed";
    /// A reservation was released (data: reservation_id, why).
    pub const RELEASED: &str = "budget.released";
    /// A reservation was refused (data: refused_by, message).
    pub const REFUSED: &str = "budget.refused";
    /// A task changed state (data: from, to, reason, error, next_attempt_at_ms).
    pub const TASK_STATE: &str = "task.state";
    /// A task attempt started (data: attempt, timeout_secs).
    pub const ATTEMPT: &str = "task.attempt";
    /// A task's final outputs were stored (data: exit_code, output, agent_id).
    pub const RESULT: &str = "task.result";
    /// A chunk of output (data: stream, chunk).
    pub const OUTPUT: &str = "task.output";
    /// Candidates from the router, with scores (data: capability, candidates).
    pub const ROUTED: &str = "routing.decision";
    /// An agent call ended (data: agent_id, status, latency_ms, error).
    pub const AGENT_CALL: &str = "agent.call";
    /// Progress relayed from an agent (data: agent_id, message, percent).
    pub const AGENT_PROGRESS: &str = "agent.progress";
    /// A note for people (data: message), e.g. FAIL_AND_NOTIFY's notification.
    pub const NOTICE: &str = "job.notice";
    /// A model call of an LLM task ended (data: turn, model, provider,
    /// outcome, error, round, latency_ms); fallbacks show as several.
    pub const LLM_CALL: &str = "llm.call";
    /// A tool call of an LLM task ended (data: turn, call_id, name, status,
    /// reason, error, duration_ms).
    pub const TOOL_CALL: &str = "llm.tool_call";
    /// The task created a child job (data: child_job_id).
    pub const DELEGATED: &str = "delegation.created";
    /// A child job ended; its usage rolls up into this job (data:
    /// child_job_id, state, tokens, cost_micro_usd).
    pub const CHILD_SETTLED: &str = "delegation.settled";
    /// A self-billing agent committed its own usage on the job's budget
    /// (data: agent_id, model, tokens, cost_micro_usd).
    pub const BILLED: &str = "budget.billed_by_agent";
}

/// Builds an event's data object.
pub fn data(v: Value) -> Option<prost_types::Struct> {
    json_to_struct(&v)
}

fn get<'a>(e: &'a Event, k: &str) -> Option<&'a prost_types::Value> {
    e.data.as_ref().and_then(|d| d.fields.get(k))
}

/// A string field of an event's data.
pub fn text(e: &Event, k: &str) -> String {
    match get(e, k).and_then(|v| v.kind.as_ref()) {
        Some(prost_types::value::Kind::StringValue(s)) => s.clone(),
        _ => String::new(),
    }
}

/// A numeric field of an event's data.
pub fn num(e: &Event, k: &str) -> f64 {
    match get(e, k).and_then(|v| v.kind.as_ref()) {
        Some(prost_types::value::Kind::NumberValue(n)) => *n,
        _ => 0.0,
    }
}

/// One job in memory.
#[derive(Debug)]
pub struct JobEntry {
    /// The public view.
    pub job: Job,
    /// The checked DAG of its tasks.
    pub dag: Dag,
    /// Global log sequences of its events, in order.
    pub events: Vec<u64>,
    /// Reservations made and not yet committed or released: id -> task id.
    pub open_reservations: BTreeMap<String, String>,
    /// Trace context at submission, so work resumed later joins the trace.
    pub traceparent: String,
    /// Tasks whose timeout was already extended (RETRY_WITH_TIMEOUT_EXTENSION).
    pub extended: HashSet<String>,
    /// Context hash bound to the approval run.
    pub context_hash: String,
    /// Task index by id.
    pub index: std::collections::HashMap<String, usize>,
    /// The job's events while it runs (index = sequence - 1), so live
    /// watchers need not read the log; emptied once the job finished.
    pub cache: Vec<Event>,
    /// The job's highest sequence known durable; watchers follow it.
    pub durable_to: tokio::sync::watch::Sender<u64>,
    /// Kind of the submitting principal (`human`, `agent`, `service`).
    pub submitter_kind: String,
}

impl JobEntry {
    /// The user the job runs for: its driver's calls act on their behalf.
    pub fn submitter(&self) -> switchyard_kit::auth::OnBehalf {
        switchyard_kit::auth::OnBehalf {
            subject: self.job.submitted_by.clone(),
            tenant: self.job.tenant.clone(),
            kind: switchyard_kit::auth::Kind::parse(&self.submitter_kind)
                .unwrap_or(switchyard_kit::auth::Kind::Human),
        }
    }

    /// A new entry for an accepted spec.
    pub fn new(spec: JobSpec, dag: Dag, created_ms: u64) -> JobEntry {
        let tasks = spec
            .tasks
            .iter()
            .map(|t| TaskStatus {
                task_id: t.id.clone(),
                state: pb::TaskState::Waiting as i32,
                ..Default::default()
            })
            .collect();
        let index = spec
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.clone(), i))
            .collect();
        let total = spec.tasks.len() as u32;
        JobEntry {
            job: Job {
                spec: Some(spec),
                state: pb::JobState::Pending as i32,
                tasks,
                progress: Some(Progress {
                    current_step: 0,
                    total_steps: total,
                    percent_complete: 0,
                }),
                cost_so_far: Some(Money::default()),
                created_at: Some(timestamp(created_ms)),
                ..Default::default()
            },
            dag,
            events: Vec::new(),
            open_reservations: BTreeMap::new(),
            traceparent: String::new(),
            extended: HashSet::new(),
            context_hash: String::new(),
            index,
            cache: Vec::new(),
            durable_to: tokio::sync::watch::channel(0).0,
            submitter_kind: String::new(),
        }
    }

    /// The job id.
    pub fn id(&self) -> &str {
        self.spec().job_id.as_str()
    }

    /// The accepted spec.
    pub fn spec(&self) -> &JobSpec {
        self.job
            .spec
            .as_ref()
            .expect("an entry always holds its spec")
    }

    /// The job's state.
    pub fn state(&self) -> JobState {
        job_state(self.job.state)
    }

    /// A task's state.
    pub fn task_state(&self, i: usize) -> TaskState {
        task_state(self.job.tasks[i].state)
    }

    /// Applies one event to the state. Transitions were checked when the
    /// event was made; replay trusts the log.
    pub fn apply(&mut self, e: &Event, outputs: impl FnOnce(&str) -> Option<TaskStatus>) {
        let at = e.time;
        let task = self.index.get(&e.task_id).copied();
        self.job.last_sequence = e.sequence;
        match e.kind.as_str() {
            kind::SUBMITTED => {
                self.job.submitted_by = text(e, "submitted_by");
                self.job.tenant = text(e, "tenant");
                self.submitter_kind = text(e, "submitter_kind");
                self.traceparent = text(e, "traceparent");
            }
            kind::JOB_STATE => {
                let to = JobState::parse(&text(e, "to")).unwrap_or(JobState::Pending);
                self.job.state = proto_job_state(to) as i32;
                self.job.reason = text(e, "reason");
                self.job.error = text(e, "error");
                if to == JobState::Active && self.job.started_at.is_none() {
                    self.job.started_at = at;
                }
                if to.is_terminal() || to == JobState::Retryable {
                    self.job.finished_at = at;
                }
            }
            kind::APPROVAL_REQUESTED => {
                self.job.run_id = text(e, "run_id");
                self.context_hash = text(e, "context_hash");
            }
            kind::BUDGET_CREATED => self.job.budget_id = text(e, "budget_id"),
            kind::RESERVED => {
                self.open_reservations
                    .insert(text(e, "reservation_id"), e.task_id.clone());
            }
            kind::COMMITTED => {
                self.open_reservations.remove(&text(e, "reservation_id"));
                self.count_usage(e, task);
            }
            // Charged on this job's budget elsewhere (a child's nested
            // budget, or a self-billing agent's own commits): counted here too.
            kind::CHILD_SETTLED | kind::BILLED => self.count_usage(e, task),
            kind::RELEASED => {
                self.open_reservations.remove(&text(e, "reservation_id"));
            }
            kind::ATTEMPT => {
                if let Some(i) = task {
                    let t = &mut self.job.tasks[i];
                    t.started_at = t.started_at.or(at);
                    let number = t.attempts.len() as u32 + 1;
                    t.attempts.push(Attempt {
                        number,
                        started_at: at,
                        ..Default::default()
                    });
                }
            }
            kind::AGENT_CALL => {
                if let Some(i) = task
                    && let Some(a) = self.job.tasks[i].attempts.last_mut()
                {
                    a.agent_id = text(e, "agent_id");
                }
            }
            kind::RESULT => {
                if let Some(i) = task
                    && let Some(stored) = outputs(&e.task_id)
                {
                    let t = &mut self.job.tasks[i];
                    t.output = stored.output;
                    t.stdout = stored.stdout;
                    t.stderr = stored.stderr;
                    t.exit_code = stored.exit_code;
                    t.output_truncated = stored.output_truncated;
                    t.agent_id = stored.agent_id;
                    t.model_used = stored.model_used;
                    t.tool_results = stored.tool_results;
                    t.llm_usage = stored.llm_usage;
                    t.child_job_ids = stored.child_job_ids;
                    t.isolation = stored.isolation;
                    t.isolation_detail = stored.isolation_detail;
                    t.resource_limit = stored.resource_limit;
                }
            }
            kind::TASK_STATE => {
                if let Some(i) = task {
                    let from = self.task_state(i);
                    let to = TaskState::parse(&text(e, "to")).unwrap_or(TaskState::Waiting);
                    let t = &mut self.job.tasks[i];
                    t.state = proto_task_state(to) as i32;
                    let (reason, error) = (text(e, "reason"), text(e, "error"));
                    if from == TaskState::Running
                        && let Some(a) = t.attempts.last_mut()
                    {
                        a.finished_at = at;
                        if to != TaskState::Succeeded {
                            a.error = error.clone();
                            a.reason = reason.clone();
                        }
                    }
                    t.reason = reason;
                    t.error = error;
                    if text(e, "extend") == "true" {
                        self.extended.insert(e.task_id.clone());
                    }
                    let next = num(e, "next_attempt_at_ms") as u64;
                    t.next_attempt_at = (next > 0).then(|| timestamp(next));
                    if to.is_terminal() {
                        t.finished_at = at;
                    }
                    self.recount();
                }
            }
            _ => {}
        }
    }

    /// Adds an event's tokens and cost to the job and its task.
    fn count_usage(&mut self, e: &Event, task: Option<usize>) {
        let tokens = num(e, "tokens") as u64;
        let cost = num(e, "cost_micro_usd") as i64;
        self.job.tokens_used += tokens;
        self.job.cost_so_far.get_or_insert_default().micro_usd += cost;
        if let Some(i) = task {
            let t = &mut self.job.tasks[i];
            t.tokens_used += tokens;
            t.cost.get_or_insert_default().micro_usd += cost;
        }
    }

    fn recount(&mut self) {
        let total = self.job.tasks.len() as u32;
        let done = (0..self.job.tasks.len())
            .filter(|&i| self.task_state(i).is_done())
            .count() as u32;
        self.job.progress = Some(Progress {
            current_step: done,
            total_steps: total,
            percent_complete: (done * 100).checked_div(total).unwrap_or(100),
        });
    }

    /// Outputs visible to templates: task id -> output object (command tasks:
    /// `stdout`, `stderr`, `exit_code`).
    pub fn output_of(&self, task_id: &str) -> Option<Value> {
        let t = &self.job.tasks[*self.index.get(task_id)?];
        if task_state(t.state) != TaskState::Succeeded {
            return None;
        }
        let mut out = t
            .output
            .as_ref()
            .map(struct_to_json)
            .unwrap_or_else(|| json!({}));
        if let (Some(o), Some(code)) = (out.as_object_mut(), t.exit_code) {
            o.entry("stdout")
                .or_insert_with(|| Value::String(String::from_utf8_lossy(&t.stdout).into_owned()));
            o.entry("stderr")
                .or_insert_with(|| Value::String(String::from_utf8_lossy(&t.stderr).into_owned()));
            o.entry("exit_code").or_insert(json!(code));
        }
        Some(out)
    }
}

/// Proto job state -> table state.
pub fn job_state(s: i32) -> JobState {
    match pb::JobState::try_from(s).unwrap_or(pb::JobState::Unspecified) {
        pb::JobState::Scheduled => JobState::Scheduled,
        pb::JobState::Available => JobState::Available,
        pb::JobState::Active => JobState::Active,
        pb::JobState::Completed => JobState::Completed,
        pb::JobState::Retryable => JobState::Retryable,
        pb::JobState::Cancelled => JobState::Cancelled,
        pb::JobState::Discarded => JobState::Discarded,
        pb::JobState::Pending | pb::JobState::Unspecified => JobState::Pending,
    }
}

/// Table state -> proto.
pub fn proto_job_state(s: JobState) -> pb::JobState {
    match s {
        JobState::Scheduled => pb::JobState::Scheduled,
        JobState::Available => pb::JobState::Available,
        JobState::Pending => pb::JobState::Pending,
        JobState::Active => pb::JobState::Active,
        JobState::Completed => pb::JobState::Completed,
        JobState::Retryable => pb::JobState::Retryable,
        JobState::Cancelled => pb::JobState::Cancelled,
        JobState::Discarded => pb::JobState::Discarded,
    }
}

/// Proto task state -> table state.
pub fn task_state(s: i32) -> TaskState {
    match pb::TaskState::try_from(s).unwrap_or(pb::TaskState::Unspecified) {
        pb::TaskState::Ready => TaskState::Ready,
        pb::TaskState::Running => TaskState::Running,
        pb::TaskState::Retrying => TaskState::Retrying,
        pb::TaskState::Succeeded => TaskState::Succeeded,
        pb::TaskState::Failed => TaskState::Failed,
        pb::TaskState::Skipped => TaskState::Skipped,
        pb::TaskState::Cancelled => TaskState::Cancelled,
        pb::TaskState::Deferred => TaskState::Deferred,
        pb::TaskState::Waiting | pb::TaskState::Unspecified => TaskState::Waiting,
    }
}

/// Table state -> proto.
pub fn proto_task_state(s: TaskState) -> pb::TaskState {
    match s {
        TaskState::Waiting => pb::TaskState::Waiting,
        TaskState::Ready => pb::TaskState::Ready,
        TaskState::Running => pb::TaskState::Running,
        TaskState::Retrying => pb::TaskState::Retrying,
        TaskState::Succeeded => pb::TaskState::Succeeded,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Skipped => pb::TaskState::Skipped,
        TaskState::Cancelled => pb::TaskState::Cancelled,
        TaskState::Deferred => pb::TaskState::Deferred,
    }
}
