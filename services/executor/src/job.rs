//! One job in memory, derived only from its events: live changes build a
//! [`JobEvent`], [`JobEntry::apply`] it, then append it to the durable log;
//! start-up replays the log through the same `apply`. So "the state equals
//! the replay of the log" holds by construction. Pure: no I/O, no clock.

use std::collections::{BTreeMap, HashSet};

use serde_json::{Value, json};
use switchyard_core::Reason;
use switchyard_core::dag::Dag;
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_kit::json::struct_to_json;
use switchyard_kit::time::timestamp;
use switchyard_proto::common::v1::{Event, Money};
use switchyard_proto::executor::v1::{self as pb, Attempt, Job, JobSpec, Progress, TaskStatus};

use crate::events::JobEvent;

/// A reservation not yet committed or released.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenHold {
    /// The task it is for.
    pub task_id: String,
    /// The tokens it holds.
    pub tokens: u64,
    /// The cost it holds.
    pub cost_micro_usd: i64,
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
    /// Reservations made and not yet committed or released, by id.
    pub open_reservations: BTreeMap<String, OpenHold>,
    /// Cost being reserved right now, by task (not an event: what is in
    /// flight to the ledger, so two reservations of one task cannot both
    /// pass its cost limit).
    pub reserving: std::collections::HashMap<String, i64>,
    /// Trace context at submission, so work resumed later joins the trace.
    pub traceparent: String,
    /// Tasks whose timeout was already extended (RETRY_WITH_TIMEOUT_EXTENSION).
    pub extended: HashSet<String>,
    /// The ledger hold the job's steps draw from (an approval's scope);
    /// empty: they reserve on the budget chain.
    pub scope_hold: String,
    /// Every hold placed for the job's scope, released when it ends.
    pub scope_holds: Vec<String>,
    /// The tokens and money of the last scope held.
    pub scope_amounts: (u64, i64),
    /// Context hash bound to the approval run.
    pub context_hash: String,
    /// Task index by id.
    pub index: std::collections::HashMap<String, usize>,
    /// The job's events while it runs, in order from the first it holds, so live
    /// watchers need not read the log; emptied once the job finished.
    pub cache: Vec<Event>,
    /// The job's highest sequence known durable; watchers follow it.
    pub durable_to: tokio::sync::watch::Sender<u64>,
    /// Kind of the submitting principal (`human`, `agent`, `service`).
    pub submitter_kind: String,
    /// Tool calls waiting for a person, by task id.
    pub awaiting: std::collections::HashMap<String, crate::events::AwaitingApproval>,
    /// Input tasks asked and not yet answered (this round), by task id.
    pub asked: std::collections::HashMap<String, crate::events::InputRequested>,
    /// How each input task's wait ended (this round), by task id.
    pub answered: std::collections::HashMap<String, crate::events::InputReceived>,
    /// Conversation tasks' messages and replies (this round), by task id.
    pub talks: std::collections::HashMap<String, crate::conversation::Talk>,
    /// Where jobs are shared, the epoch of this member's lease on the job
    /// (the fencing token its writes carry); 0 on one node.
    pub lease: i64,
    /// Where jobs are shared, a job of queue tasks only claimed here for a worker's
    /// fetch (such jobs run where their workers fetch).
    pub fetched: bool,
    /// Its approval run was claimed for this executor with the proposal
    /// (in memory only: the driver takes it instead of calling Claim; a
    /// restart or another replica claims again).
    pub run_claimed: bool,
    /// Each task's last budget refusal (what its pause is sized from).
    pub refusals: std::collections::HashMap<String, crate::events::Refused>,
    /// The job's latest budget pause (this round), and its decision once
    /// made.
    pub pause: Option<(
        crate::events::BudgetPaused,
        Option<crate::events::ExtensionDecided>,
    )>,
    /// Tokens the approved extensions added to the job's budget (this
    /// round): what its tasks size their holds against, with the spec's.
    pub extra_tokens: u64,
    /// Micro-USD the approved extensions added (this round).
    pub extra_cost: i64,
    /// The head of the job's hash chain (stream `job/<id>`): what its next
    /// event links to.
    pub chain: switchyard_kit::chain::Head,
    /// The record its latest periodic checkpoint signed (0: none yet, in
    /// this process).
    pub checkpointed: u64,
    /// A resumed job's tasks kept from the job it resumes: they move to
    /// `succeeded` as the job starts, their outputs already recorded.
    pub reused: Vec<String>,
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

    /// The entry of stored job `record`, its graph rebuilt from its
    /// accepted spec (`None`: the record has no spec). Stored specs were
    /// validated when accepted; only their graph is rebuilt, so a later
    /// config change (say, a shorter allowlist) cannot stop accepted jobs
    /// from loading.
    pub fn restored(record: &Job) -> Result<Option<JobEntry>, crate::error::ExecutorError> {
        let Some(spec) = record.spec.clone() else {
            return Ok(None);
        };
        let dag = crate::spec::dag(&spec).map_err(crate::error::ExecutorError::Invalid)?;
        let created = record
            .created_at
            .as_ref()
            .map_or(0, switchyard_kit::time::timestamp_ms);
        let mut e = JobEntry::new(spec, dag, created);
        e.job.created_at = record.created_at;
        Ok(Some(e))
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
            reserving: Default::default(),
            traceparent: String::new(),
            extended: HashSet::new(),
            scope_hold: String::new(),
            scope_holds: Vec::new(),
            scope_amounts: (0, 0),
            context_hash: String::new(),
            index,
            cache: Vec::new(),
            durable_to: tokio::sync::watch::channel(0).0,
            submitter_kind: String::new(),
            awaiting: Default::default(),
            asked: Default::default(),
            answered: Default::default(),
            talks: Default::default(),
            lease: 0,
            fetched: false,
            run_claimed: false,
            refusals: Default::default(),
            pause: None,
            extra_tokens: 0,
            extra_cost: 0,
            chain: Default::default(),
            checkpointed: 0,
            reused: Vec::new(),
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

    /// Applies one event, `ev`, whose envelope (sequence, time, task) is
    /// `at`. Transitions were checked when the event was made; replay trusts
    /// the log. `outputs` reads a task's stored outputs.
    ///
    /// One arm per event kind, with no catch-all: a new kind does not
    /// compile until this says what it does to the state (the larger arms
    /// are their own functions).
    pub fn apply(
        &mut self,
        at: &Event,
        ev: &JobEvent,
        outputs: impl FnOnce(&str) -> Option<TaskStatus>,
    ) {
        let time = at.time;
        let task = self.index.get(&at.task_id).copied();
        self.job.last_sequence = at.sequence;
        self.chain = crate::audit::next_head(self.chain, at);
        match ev {
            JobEvent::Submitted(s) => {
                self.job.submitted_by.clone_from(&s.submitted_by);
                self.job.tenant.clone_from(&s.tenant);
                self.submitter_kind.clone_from(&s.submitter_kind);
                self.traceparent.clone_from(&s.traceparent);
                self.job.rerun_of.clone_from(&s.rerun_of);
                self.reused.clone_from(&s.reused);
                self.job.schedule_id.clone_from(&s.schedule_id);
                self.job.schedule_tick = (s.schedule_tick_ms > 0)
                    .then(|| switchyard_kit::time::timestamp(s.schedule_tick_ms));
                self.job.trigger_id.clone_from(&s.trigger_id);
                self.job.event_id.clone_from(&s.event_id);
            }
            JobEvent::JobMoved(m) => {
                let to = JobState::parse(&m.to).unwrap_or(JobState::Pending);
                self.job.state = proto_job_state(to) as i32;
                self.job.reason.clone_from(&m.reason);
                self.job.error.clone_from(&m.error);
                if to == JobState::Active && self.job.started_at.is_none() {
                    self.job.started_at = time;
                }
                if to.is_terminal() || to == JobState::Retryable {
                    self.job.finished_at = time;
                }
            }
            JobEvent::ApprovalRequested(r) => {
                self.job.run_id.clone_from(&r.run_id);
                self.context_hash.clone_from(&r.context_hash);
            }
            JobEvent::BudgetCreated(b) => self.job.budget_id.clone_from(&b.budget_id),
            JobEvent::Reserved(r) => {
                let hold = OpenHold {
                    task_id: at.task_id.clone(),
                    tokens: r.tokens,
                    cost_micro_usd: r.cost_micro_usd,
                };
                self.open_reservations
                    .insert(r.reservation_id.clone(), hold);
            }
            JobEvent::Committed(c) => {
                self.open_reservations.remove(&c.reservation_id);
                self.count_usage(task, c.tokens, c.cost_micro_usd);
            }
            // Charged on this job's budget elsewhere (a child's nested
            // budget, or a self-billing agent's own commits): counted here too.
            JobEvent::ChildSettled(c) => self.count_usage(task, c.tokens, c.cost_micro_usd),
            JobEvent::BilledByAgent(b) => self.count_usage(task, b.tokens, b.cost_micro_usd),
            JobEvent::Released(r) => {
                self.open_reservations.remove(&r.reservation_id);
            }
            JobEvent::AttemptStarted(s) => {
                if let Some(i) = task {
                    let t = &mut self.job.tasks[i];
                    t.started_at = t.started_at.or(time);
                    let number = t.attempts.len() as u32 + 1;
                    t.attempts.push(Attempt {
                        number,
                        started_at: time,
                        worker_id: s.worker_id.clone(),
                        ..Default::default()
                    });
                }
            }
            JobEvent::WorkerFailed(w) => {
                if let Some(i) = task
                    && let Some(a) = self.job.tasks[i].attempts.last_mut()
                {
                    a.error_code.clone_from(&w.code);
                    a.error_type.clone_from(&w.kind);
                    a.worker_message.clone_from(&w.message);
                }
            }
            JobEvent::AgentCalled(c) => {
                if let Some(i) = task
                    && let Some(a) = self.job.tasks[i].attempts.last_mut()
                {
                    a.agent_id.clone_from(&c.agent_id);
                }
            }
            JobEvent::ResultStored(_) => {
                if let Some(i) = task
                    && let Some(stored) = outputs(&at.task_id)
                {
                    self.keep_outputs(i, stored);
                }
            }
            JobEvent::TaskMoved(m) => {
                if let Some(i) = task {
                    self.move_task(i, m, time);
                }
            }
            JobEvent::Revived(r) => self.revive(r.round),
            JobEvent::DependencyWaiting(w) => {
                let (reason, error) = self.reason_of(task);
                *reason = Reason::DependencyUnavailable.as_str().to_owned();
                *error = format!("waiting for {}: {}", w.service, w.error);
            }
            JobEvent::DependencyRecovered(_) => {
                let (reason, error) = self.reason_of(task);
                if reason == Reason::DependencyUnavailable.as_str() {
                    reason.clear();
                    error.clear();
                }
            }
            JobEvent::AwaitingApproval(a) => {
                self.awaiting.insert(at.task_id.clone(), a.clone());
            }
            JobEvent::CallDecided(_) => {
                self.awaiting.remove(&at.task_id);
            }
            JobEvent::InputRequested(r) => {
                self.asked.insert(at.task_id.clone(), r.clone());
            }
            JobEvent::InputReceived(r) => {
                self.asked.remove(&at.task_id);
                self.answered.insert(at.task_id.clone(), r.clone());
            }
            JobEvent::MessageReceived(_)
            | JobEvent::Replied(_)
            | JobEvent::ConversationEnded(_)
            | JobEvent::HandoffStarted(_)
            | JobEvent::HandoffReclaimed(_)
            | JobEvent::AgentResult(_)
            | JobEvent::AgentError(_) => {
                self.talks
                    .entry(at.task_id.clone())
                    .or_default()
                    .apply(ev, at.sequence);
            }
            JobEvent::ArtifactStored(a) => self.job.artifacts.push(pb_artifact(a, at)),
            JobEvent::Refused(r) => {
                self.refusals.insert(at.task_id.clone(), r.clone());
            }
            JobEvent::BudgetPaused(p) => {
                self.job.budget_pause = Some(pb_pause(p, None));
                self.pause = Some((p.clone(), None));
            }
            JobEvent::ExtensionDecided(d) => {
                if let Some((p, decided)) = &mut self.pause
                    && p.run_id == d.run_id
                {
                    if d.decision == "approved" {
                        let (tokens, cost) = d.granted(p);
                        self.extra_tokens += tokens;
                        self.extra_cost += cost;
                    }
                    self.job.budget_pause = Some(pb_pause(p, Some(d)));
                    *decided = Some(d.clone());
                }
            }
            JobEvent::ScopeHeld(h) => {
                self.scope_hold.clone_from(&h.reservation_id);
                if !h.reservation_id.is_empty() {
                    self.scope_amounts = (h.tokens, h.cost_micro_usd);
                    if !self.scope_holds.contains(&h.reservation_id) {
                        self.scope_holds.push(h.reservation_id.clone());
                    }
                }
            }
            JobEvent::ApprovalDecided(_)
            | JobEvent::ArtifactRefused(_)
            | JobEvent::RateLimited(_)
            | JobEvent::SlotWait(_)
            | JobEvent::Output(_)
            | JobEvent::Routed(_)
            | JobEvent::Downgraded(_)
            | JobEvent::AgentProgress(_)
            | JobEvent::Notice(_)
            | JobEvent::LlmCalled(_)
            | JobEvent::ToolCalled(_)
            | JobEvent::ToolProgress(_)
            | JobEvent::LlmDelta(_)
            | JobEvent::Overrun(_)
            | JobEvent::AgentInvoked(_)
            | JobEvent::PolicyDecided(_)
            | JobEvent::Delegated(_) => {}
        }
    }

    /// A new round (RetryDeadLetter): every task starts over with no
    /// attempts; the job keeps its id, spec, events and what it spent, and
    /// gets its run and budget anew at approval.
    fn revive(&mut self, round: u32) {
        // A new round runs every task: a resume's kept outputs went with
        // the statuses cleared below.
        self.reused.clear();
        for t in &mut self.job.tasks {
            *t = TaskStatus {
                task_id: std::mem::take(&mut t.task_id),
                state: pb::TaskState::Waiting as i32,
                ..Default::default()
            };
        }
        let j = &mut self.job;
        j.round = round;
        j.run_id.clear();
        j.budget_id.clear();
        j.reason.clear();
        j.error.clear();
        j.started_at = None;
        j.finished_at = None;
        self.extended.clear();
        self.awaiting.clear();
        self.asked.clear();
        self.answered.clear();
        self.talks.clear();
        self.refusals.clear();
        self.pause = None;
        self.extra_tokens = 0;
        self.extra_cost = 0;
        self.context_hash = crate::spec::context_hash(self.spec());
        self.recount();
    }

    /// The reason and error fields of task `task`, or of the job.
    fn reason_of(&mut self, task: Option<usize>) -> (&mut String, &mut String) {
        match task {
            Some(i) => {
                let t = &mut self.job.tasks[i];
                (&mut t.reason, &mut t.error)
            }
            None => (&mut self.job.reason, &mut self.job.error),
        }
    }

    pub(crate) fn keep_outputs(&mut self, i: usize, stored: TaskStatus) {
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

    fn move_task(
        &mut self,
        i: usize,
        m: &crate::events::TaskMoved,
        time: Option<prost_types::Timestamp>,
    ) {
        let from = self.task_state(i);
        let to = TaskState::parse(&m.to).unwrap_or(TaskState::Waiting);
        let t = &mut self.job.tasks[i];
        t.state = proto_task_state(to) as i32;
        // An input task's attempt goes on while it waits for its answer.
        if from == TaskState::Running
            && to != TaskState::InputRequired
            && let Some(a) = t.attempts.last_mut()
            && a.finished_at.is_none()
        {
            a.finished_at = time;
            if to != TaskState::Succeeded {
                a.error.clone_from(&m.error);
                a.reason.clone_from(&m.reason);
            }
        }
        t.reason.clone_from(&m.reason);
        t.error.clone_from(&m.error);
        if m.extend {
            self.extended.insert(t.task_id.clone());
        }
        t.next_attempt_at = (m.next_attempt_at_ms > 0).then(|| timestamp(m.next_attempt_at_ms));
        if to.is_terminal() {
            t.finished_at = time;
        }
        self.recount();
    }

    /// Adds tokens and cost to the job and, if any, its task.
    fn count_usage(&mut self, task: Option<usize>, tokens: u64, cost: i64) {
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
        // Steps that got done: succeeded. A failed, cancelled or skipped
        // (its upstream failed) step is over, not done: a cancelled or
        // discarded job does not read 100%.
        let done = (0..self.job.tasks.len())
            .filter(|&i| self.task_state(i) == TaskState::Succeeded)
            .count() as u32;
        self.job.progress = Some(Progress {
            current_step: done,
            total_steps: total,
            percent_complete: (done * 100).checked_div(total).unwrap_or(100),
        });
    }

    /// What is left of a job budget of `budget` tokens for a new hold: less
    /// what the job used and what its open reservations hold. The ledger decides;
    /// this sizes a reservation so that a budget that fits the work is not
    /// refused because a step asks for all of it.
    pub fn tokens_left(&self, budget: u64) -> u64 {
        let held: u64 = self.open_reservations.values().map(|h| h.tokens).sum();
        budget
            .saturating_sub(self.job.tokens_used)
            .saturating_sub(held)
    }

    /// What the job's own budget has left, as the policies see it
    /// (`context.remaining` of the actions it takes): its limits and what
    /// approved extensions added, less what it spent and what its open
    /// reservations hold. Unknown when the job set no limit.
    pub fn remaining(&self) -> switchyard_policy::Remaining {
        let b = self.spec().budget.clone().unwrap_or_default();
        let tokens = b
            .token_budget
            .map(|t| self.tokens_left(t.saturating_add(self.extra_tokens)));
        let cost = b.cost_limit.map(|m| {
            let spent = self.job.cost_so_far.map_or(0, |m| m.micro_usd);
            let held: i64 = self
                .open_reservations
                .values()
                .map(|h| h.cost_micro_usd)
                .sum();
            (m.micro_usd + self.extra_cost - spent - held).max(0)
        });
        switchyard_policy::Remaining::left(tokens, cost)
    }

    /// What task `task_id` has spent or holds: its committed cost (its
    /// own calls, agents billing themselves, child jobs), its open
    /// reservations and those being made. The task's cost limit bounds this.
    pub fn task_exposure(&self, task_id: &str) -> i64 {
        let spent = self
            .index
            .get(task_id)
            .and_then(|&i| self.job.tasks[i].cost)
            .map_or(0, |m| m.micro_usd);
        let held: i64 = self
            .open_reservations
            .values()
            .filter(|h| h.task_id == task_id)
            .map(|h| h.cost_micro_usd)
            .sum();
        spent + held + self.reserving.get(task_id).copied().unwrap_or(0)
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

/// The public view of a budget pause and its decision.
fn pb_pause(
    p: &crate::events::BudgetPaused,
    d: Option<&crate::events::ExtensionDecided>,
) -> pb::BudgetPause {
    pb::BudgetPause {
        run_id: p.run_id.clone(),
        number: p.number,
        dimension: p.dimension.clone(),
        refused_by: p.refused_by.clone(),
        message: p.message.clone(),
        tokens: p.tokens,
        cost: (p.cost_micro_usd > 0).then_some(Money {
            micro_usd: p.cost_micro_usd,
        }),
        remaining_tasks: p.remaining_tasks.clone(),
        decide_by: Some(timestamp(p.decide_by_ms)),
        decision: d.map_or("pending", |d| d.decision.as_str()).to_owned(),
        decided_by: d.map(|d| d.by.clone()).unwrap_or_default(),
        granted_tokens: d
            .filter(|d| d.decision == "approved")
            .map_or(0, |d| d.granted(p).0),
        granted_cost: d
            .filter(|d| d.decision == "approved")
            .map(|d| d.granted(p).1)
            .filter(|c| *c > 0)
            .map(|micro_usd| Money { micro_usd }),
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
        pb::JobState::BudgetPaused => JobState::BudgetPaused,
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
        JobState::BudgetPaused => pb::JobState::BudgetPaused,
    }
}

/// The stored artifact an `artifact.stored` event describes.
fn pb_artifact(
    a: &crate::events::ArtifactStored,
    at: &Event,
) -> switchyard_proto::common::v1::Artifact {
    let kind = switchyard_core::artifact::ArtifactKind::parse(&a.kind)
        .unwrap_or(switchyard_core::artifact::ArtifactKind::File);
    switchyard_proto::common::v1::Artifact {
        artifact_id: a.artifact_id.clone(),
        name: a.name.clone(),
        kind: switchyard_api::artifacts::proto_kind(kind) as i32,
        media_type: a.media_type.clone(),
        size_bytes: a.size_bytes,
        task_id: at.task_id.clone(),
        created_at: at.time,
        path: a.path.clone(),
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
        pb::TaskState::AwaitingApproval => TaskState::AwaitingApproval,
        pb::TaskState::InputRequired => TaskState::InputRequired,
        pb::TaskState::BudgetPaused => TaskState::BudgetPaused,
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
        TaskState::AwaitingApproval => pb::TaskState::AwaitingApproval,
        TaskState::InputRequired => pb::TaskState::InputRequired,
        TaskState::BudgetPaused => pb::TaskState::BudgetPaused,
    }
}

#[cfg(test)]
mod tests {
    use switchyard_proto::executor::v1::{CommandTask, TaskSpec, task_spec::Kind};

    use super::*;
    use crate::events;

    fn entry() -> JobEntry {
        let task = |id: &str| TaskSpec {
            id: id.into(),
            kind: Some(Kind::Command(CommandTask {
                command: "true".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let spec = JobSpec {
            job_id: "j".into(),
            tasks: vec![task("a"), task("b")],
            ..Default::default()
        };
        let dag = crate::spec::dag(&spec).expect("a valid DAG");
        JobEntry::new(spec, dag, 0)
    }

    fn apply(j: &mut JobEntry, task: &str, ev: JobEvent) {
        let at = Event {
            sequence: j.job.last_sequence + 1,
            task_id: task.into(),
            ..Default::default()
        };
        j.apply(&at, &ev, |_| None);
    }

    fn reserved(id: &str, cost: i64) -> JobEvent {
        JobEvent::Reserved(events::Reserved {
            reservation_id: id.into(),
            cost_micro_usd: cost,
            ..Default::default()
        })
    }

    fn committed(id: &str, tokens: u64, cost: i64) -> JobEvent {
        JobEvent::Committed(events::Committed {
            reservation_id: id.into(),
            tokens,
            cost_micro_usd: cost,
            overrun: false,
        })
    }

    #[test]
    fn a_resumed_jobs_kept_tasks_are_forgotten_when_a_new_round_runs_everything() {
        let mut j = entry();
        let submitted = events::Submitted {
            rerun_of: "old".into(),
            reused: vec!["a".into()],
            ..Default::default()
        };
        apply(&mut j, "", JobEvent::Submitted(submitted));
        assert_eq!(
            (j.job.rerun_of.as_str(), &j.reused[..]),
            ("old", &["a".to_owned()][..])
        );
        let revived = events::Revived {
            round: 1,
            by: "op".into(),
        };
        apply(&mut j, "", JobEvent::Revived(revived));
        assert!(
            j.reused.is_empty(),
            "a new round keeps nothing: its outputs were cleared"
        );
        assert_eq!(j.job.rerun_of, "old", "it still runs that job again");
    }

    #[test]
    fn a_tasks_exposure_is_all_it_spent_holds_and_is_reserving_across_attempts() {
        let mut j = entry();
        apply(&mut j, "a", reserved("r1", 40));
        apply(&mut j, "a", committed("r1", 5, 30));
        // A later attempt's hold, another task's hold, a billing agent.
        apply(&mut j, "a", reserved("r2", 25));
        apply(&mut j, "b", reserved("r3", 1000));
        let billed = events::BilledByAgent {
            agent_id: "x".into(),
            model: "m".into(),
            tokens: 1,
            cost_micro_usd: 7,
        };
        apply(&mut j, "a", JobEvent::BilledByAgent(billed));
        j.reserving.insert("a".into(), 3);
        assert_eq!(j.task_exposure("a"), 30 + 25 + 7 + 3);
        let released = events::Released {
            reservation_id: "r2".into(),
            why: "unused".into(),
        };
        apply(&mut j, "a", JobEvent::Released(released));
        assert_eq!(j.task_exposure("a"), 30 + 7 + 3);
        assert_eq!(j.task_exposure("b"), 1000);
    }

    #[test]
    fn progress_counts_the_steps_that_succeeded_so_a_cancelled_job_does_not_read_100() {
        let mut j = entry();
        let moved = |from: &str, to: &str| {
            JobEvent::TaskMoved(events::TaskMoved {
                from: from.into(),
                to: to.into(),
                ..Default::default()
            })
        };
        for (from, to) in [
            ("waiting", "ready"),
            ("ready", "running"),
            ("running", "succeeded"),
        ] {
            apply(&mut j, "a", moved(from, to));
        }
        for (from, to) in [
            ("waiting", "ready"),
            ("ready", "running"),
            ("running", "cancelled"),
        ] {
            apply(&mut j, "b", moved(from, to));
        }
        let p = j.job.progress.expect("progress");
        assert_eq!(
            (p.current_step, p.total_steps, p.percent_complete),
            (1, 2, 50)
        );
    }

    #[test]
    fn what_a_job_has_left_for_the_policies_is_its_limits_and_extensions_less_spent_and_held() {
        let j = entry();
        assert!(!j.remaining().known, "no limits: unknown");
        let mut spec = j.spec().clone();
        spec.budget = Some(pb::JobBudget {
            token_budget: Some(100),
            cost_limit: Some(Money { micro_usd: 1000 }),
            ..Default::default()
        });
        let dag = crate::spec::dag(&spec).expect("a valid DAG");
        let mut j = JobEntry::new(spec, dag, 0);
        let left = |j: &JobEntry| j.remaining().amounts();
        assert_eq!(left(&j), (Some(100), Some(1000)));
        apply(&mut j, "a", reserved("r1", 40));
        assert_eq!(left(&j), (Some(100), Some(960)));
        apply(&mut j, "a", committed("r1", 5, 30));
        assert_eq!(left(&j), (Some(95), Some(970)));
        let paused = events::BudgetPaused {
            run_id: "ext-1".into(),
            tokens: 10,
            cost_micro_usd: 100,
            ..Default::default()
        };
        apply(&mut j, "", JobEvent::BudgetPaused(paused));
        let decided = events::ExtensionDecided {
            run_id: "ext-1".into(),
            decision: "approved".into(),
            granted_tokens: Some(50),
            granted_cost_micro_usd: Some(500),
            ..Default::default()
        };
        apply(&mut j, "", JobEvent::ExtensionDecided(decided));
        assert_eq!(left(&j), (Some(145), Some(1470)));
    }
}
