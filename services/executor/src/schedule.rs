//! Scheduling policy, pure: functions from a job's state (a [`JobEntry`]),
//! the time, what is running and a random number passed in, to decisions.
//! The driver records the decisions as events and starts the attempts; it
//! decides nothing itself. The rules:
//!
//! - **Readiness**: a waiting task becomes ready once every task it depends
//!   on succeeded; one whose dependency failed, was skipped or cancelled is
//!   skipped.
//! - **Fail-fast**: once a task failed for good, tasks not started are
//!   skipped and tasks waiting to retry (or deferred) are cancelled; with
//!   `cancel_running_on_failure`, running ones are cancelled too.
//! - **Parallelism**: at most the job's `max_parallel` attempts run at once;
//!   starts go in DAG order.
//! - **Deadlines**: the earlier of the task's and the job's; a task is not
//!   started after it, and a retry or deferral that would pass it fails.
//! - **Budget pauses**: a task the budget refused is `budget_paused` (with
//!   FAIL_AND_NOTIFY's notification); while one is, nothing new starts, and
//!   once nothing runs the job pauses ([`Step::paused`]) until its
//!   extension is decided. The attempt it cost does not count against the
//!   task's retries.
//! - **Fallbacks** ([`after_failure`]): on timeout FAIL_AND_NOTIFY or one
//!   RETRY_WITH_TIMEOUT_EXTENSION; on capability unavailable DEFER; on
//!   agent offline SELECT_NEXT_BEST
//!   ([`next_on_offline`]). Everything else goes to the retry policy, with
//!   backoff (fixed, linear, exponential) and jitter.

use switchyard_core::Reason;
use switchyard_core::backoff::{Backoff, Strategy};
use switchyard_core::lifecycle::TaskState;
use switchyard_proto::executor::v1::{BackoffStrategy, FallbackStrategy as FS, TaskSpec};

use crate::book::Change;
use crate::job::JobEntry;

/// How an attempt failed, which decides what happens next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The budget refused: on_cost_exceeded.
    Budget,
    /// The attempt timed out: on_timeout.
    Timeout,
    /// No agent offers the capability: on_capability_unavailable.
    Unavailable,
    /// Retrying cannot help (bad template, no LLM provider).
    Permanent,
    /// A pull worker's lease lapsed or it handed the task back: offered
    /// again at once, counting the attempt against the retry policy.
    Requeue,
    /// Anything else: the retry policy.
    Other,
}

/// A task state change the driver records.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Move {
    /// The task (index in the spec).
    pub(crate) task: usize,
    /// Its next state.
    pub(crate) to: TaskState,
    /// Why, for anything but a normal move.
    pub(crate) reason: Option<Reason>,
    /// Error text.
    pub(crate) error: String,
    /// Retrying/deferred: the next attempt is due this long after the move.
    pub(crate) after_ms: Option<u64>,
    /// The next attempt runs with the extended timeout.
    pub(crate) extend: bool,
}

impl Move {
    fn to(task: usize, to: TaskState) -> Move {
        Move {
            task,
            to,
            reason: None,
            error: String::new(),
            after_ms: None,
            extend: false,
        }
    }

    fn because(mut self, reason: Reason, error: impl Into<String>) -> Move {
        self.reason = Some(reason);
        self.error = error.into();
        self
    }

    fn after(mut self, ms: u64) -> Move {
        self.after_ms = Some(ms);
        self
    }

    /// The change the book records.
    pub(crate) fn change(&self) -> Change<'_> {
        let mut c = Change::to(self.to);
        if let Some(r) = self.reason {
            c = c.because(r, &self.error);
        }
        if let Some(ms) = self.after_ms {
            c = c.after(ms);
        }
        c.extend = self.extend;
        c
    }
}

/// One decision of a scheduling step, in the order to record it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Record a task move.
    Move(Move),
    /// Start an attempt of a task (record it, move the task to running).
    Start {
        /// The task.
        task: usize,
        /// Attempt number (1-based).
        attempt: u32,
        /// Its timeout.
        timeout_secs: u32,
    },
}

/// A scheduling step's decisions.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Step {
    /// What to record and start, in order.
    pub(crate) decisions: Vec<Decision>,
    /// Stop the running attempts (fail-fast with `cancel_running_on_failure`).
    pub(crate) abort_running: bool,
    /// When a retrying or deferred task is next due.
    pub(crate) next_wake: Option<u64>,
    /// Every task is final once the decisions are recorded.
    pub(crate) done: bool,
    /// A task waits for the budget: nothing was started, and once no
    /// attempt runs the job pauses for its extension.
    pub(crate) paused: bool,
}

/// Policy knobs from the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// Cancel running tasks when another fails for good.
    pub(crate) cancel_running_on_failure: bool,
    /// DEFER re-check interval when the task gives none, seconds.
    pub(crate) defer_interval_secs: u32,
    /// Longest a task may stay deferred when it has no deadline, seconds.
    pub(crate) max_defer_secs: u64,
}

/// The earlier of the task's and the job's deadline, ms.
pub(crate) fn deadline(job: &JobEntry, i: usize) -> Option<u64> {
    [
        job.spec().tasks[i].deadline.as_ref(),
        job.spec().deadline.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(switchyard_kit::time::timestamp_ms)
    .min()
}

/// One step: readiness and fail-fast over every task, then starts up to the
/// job's parallelism. `running` is how many attempts run now.
pub(crate) fn step(job: &JobEntry, now: u64, running: usize, policy: &Policy) -> Step {
    let n = job.job.tasks.len();
    let mut states: Vec<TaskState> = (0..n).map(|i| job.task_state(i)).collect();
    let mut out = Step::default();
    let record = |states: &mut Vec<TaskState>, out: &mut Step, m: Move| {
        states[m.task] = m.to;
        out.decisions.push(Decision::Move(m));
    };
    let failed = (0..n)
        .find(|&i| states[i] == TaskState::Failed)
        .map(|i| job.spec().tasks[i].id.clone());
    // Readiness and fail-fast, in DAG order so skips cascade in one pass.
    for &i in job.dag.order() {
        if let Some(m) = readiness(job, &states, i, failed.as_deref()) {
            record(&mut states, &mut out, m);
        }
    }
    let mut running = running;
    if failed.is_some() && policy.cancel_running_on_failure {
        out.abort_running = running > 0;
        running = 0;
        for i in 0..n {
            if matches!(
                states[i],
                TaskState::Running | TaskState::AwaitingApproval | TaskState::InputRequired
            ) {
                let m = Move::to(i, TaskState::Cancelled)
                    .because(Reason::UpstreamFailed, "cancelled: another task failed");
                record(&mut states, &mut out, m);
            }
        }
    }
    out.paused = states.contains(&TaskState::BudgetPaused);
    let max_parallel = job.spec().max_parallel.max(1) as usize;
    let mut started = 0;
    for &i in job.dag.order() {
        if out.paused {
            // Nothing more is spent until the extension is decided.
            break;
        }
        let due = match states[i] {
            TaskState::Ready => true,
            TaskState::Retrying | TaskState::Deferred => {
                let at = job.job.tasks[i]
                    .next_attempt_at
                    .as_ref()
                    .map_or(0, switchyard_kit::time::timestamp_ms);
                if at > now {
                    out.next_wake = Some(out.next_wake.map_or(at, |w| w.min(at)));
                }
                at <= now
            }
            _ => false,
        };
        if !due || running + started >= max_parallel {
            continue;
        }
        if deadline(job, i).is_some_and(|d| d < now) {
            let why = "the deadline passed before the task could start";
            let m = Move::to(i, TaskState::Failed).because(Reason::DeadlineExceeded, why);
            record(&mut states, &mut out, m);
            continue;
        }
        states[i] = TaskState::Running;
        started += 1;
        out.decisions.push(Decision::Start {
            task: i,
            attempt: job.job.tasks[i].attempts.len() as u32 + 1,
            timeout_secs: timeout_secs(job, i),
        });
    }
    out.done = states.iter().all(|s| s.is_terminal());
    out
}

/// How a budget pause ends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PauseEnd<'a> {
    /// The extension was approved: the paused tasks are ready again.
    Approved,
    /// Rejected or undecided: the paused tasks fail, with this reason.
    Refused(Reason, &'a str),
}

/// The moves that end a budget pause, one per paused task.
pub(crate) fn end_pause(job: &JobEntry, end: PauseEnd<'_>) -> Vec<Move> {
    (0..job.job.tasks.len())
        .filter(|&i| job.task_state(i) == TaskState::BudgetPaused)
        .map(|i| match end {
            PauseEnd::Approved => Move::to(i, TaskState::Ready),
            PauseEnd::Refused(reason, error) => {
                Move::to(i, TaskState::Failed).because(reason, error)
            }
        })
        .collect()
}

/// Readiness and fail-fast for task `i`, given the states decided so far.
fn readiness(job: &JobEntry, states: &[TaskState], i: usize, failed: Option<&str>) -> Option<Move> {
    let deps = job.dag.deps(i);
    let upstream_bad = deps.iter().any(|&d| {
        matches!(
            states[d],
            TaskState::Failed | TaskState::Skipped | TaskState::Cancelled
        )
    });
    let why = |what: &str| match failed {
        Some(id) => format!("{what}: task {id:?} failed (fail-fast)"),
        None => format!("{what}: a task it depends on did not succeed"),
    };
    match states[i] {
        TaskState::Waiting | TaskState::Ready if failed.is_some() || upstream_bad => {
            Some(Move::to(i, TaskState::Skipped).because(Reason::UpstreamFailed, why("not run")))
        }
        TaskState::Retrying | TaskState::Deferred | TaskState::BudgetPaused if failed.is_some() => {
            Some(Move::to(i, TaskState::Cancelled).because(Reason::UpstreamFailed, why("stopped")))
        }
        TaskState::Waiting if deps.iter().all(|&d| states[d] == TaskState::Succeeded) => {
            Some(Move::to(i, TaskState::Ready))
        }
        _ => None,
    }
}

/// The timeout of task `i`'s next attempt: the extended one after a
/// RETRY_WITH_TIMEOUT_EXTENSION.
pub(crate) fn timeout_secs(job: &JobEntry, i: usize) -> u32 {
    let spec = &job.spec().tasks[i];
    match &spec.fallback {
        Some(f) if job.extended.contains(&spec.id) && f.extended_timeout_seconds > 0 => {
            f.extended_timeout_seconds
        }
        _ => spec.timeout_secs,
    }
}

/// An attempt's failure.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// What kind of failure, which picks the fallback.
    pub(crate) class: Class,
    /// Reason code.
    pub(crate) reason: Reason,
    /// Error text.
    pub(crate) error: String,
}

/// What follows a failed attempt of running task `i`: the move to record and,
/// for FAIL_AND_NOTIFY, the note for people. `unit_random` in [0, 1] draws
/// the jitter.
pub(crate) fn after_failure(
    job: &JobEntry,
    i: usize,
    f: &Failure,
    now: u64,
    unit_random: f64,
    policy: &Policy,
) -> (Move, Option<String>) {
    let task = &job.spec().tasks[i];
    let fallback = task.fallback.clone().unwrap_or_default();
    let fail = |reason: Reason, error: &str| Move::to(i, TaskState::Failed).because(reason, error);
    let extended = job.extended.contains(&task.id);
    match f.class {
        Class::Permanent => return (fail(f.reason, &f.error), None),
        Class::Budget => {
            // on_cost_exceeded: the task waits for the job's extension
            // (FAIL_AND_NOTIFY's notification still goes out).
            let note = if fallback.notification.is_empty() {
                "Task exceeded budget"
            } else {
                &fallback.notification
            };
            let note = format!("{note}: {}", f.error);
            let m = Move::to(i, TaskState::BudgetPaused).because(f.reason, &f.error);
            return (m, Some(note));
        }
        Class::Timeout if fallback.on_timeout == FS::FailAndNotify as i32 => {
            let note = format!("task {} timed out: {}", task.id, f.error);
            return (fail(f.reason, &f.error), Some(note));
        }
        Class::Timeout
            if fallback.on_timeout == FS::RetryWithTimeoutExtension as i32 && !extended =>
        {
            let mut m = Move::to(i, TaskState::Retrying)
                .because(f.reason, &f.error)
                .after(0);
            m.extend = true;
            return (m, None);
        }
        Class::Unavailable if fallback.on_capability_unavailable == FS::Defer as i32 => {
            return (defer(job, i, f, now, policy), None);
        }
        _ => {}
    }
    (retry(job, i, f, now, unit_random), None)
}

/// DEFER: check again after the interval, unless that passes the deadline
/// (or, without one, the longest deferral since the first attempt).
fn defer(job: &JobEntry, i: usize, f: &Failure, now: u64, policy: &Policy) -> Move {
    let fallback = job.spec().tasks[i].fallback.clone().unwrap_or_default();
    let every = if fallback.defer_interval_seconds > 0 {
        fallback.defer_interval_seconds
    } else {
        policy.defer_interval_secs
    };
    let wait = u64::from(every) * 1000;
    let first_start = job.job.tasks[i]
        .started_at
        .as_ref()
        .map_or(now, switchyard_kit::time::timestamp_ms);
    let limit = deadline(job, i).unwrap_or(first_start + policy.max_defer_secs * 1000);
    if now + wait > limit {
        let why = format!("{}; deferring again would pass the deadline", f.error);
        return Move::to(i, TaskState::Failed).because(Reason::DeadlineExceeded, why);
    }
    Move::to(i, TaskState::Deferred)
        .because(f.reason, &f.error)
        .after(wait)
}

/// Whether an attempt ended because the budget refused it (it paused the
/// job; it is not a retry).
fn budget_stop(reason: &str) -> bool {
    reason == Reason::AgentTokenBudgetExceeded.as_str()
        || reason == Reason::AgentCostBudgetExceeded.as_str()
}

/// The retry policy. Deferrals, the timeout extension and budget pauses
/// are not retries.
fn retry(job: &JobEntry, i: usize, f: &Failure, now: u64, unit_random: f64) -> Move {
    let task = &job.spec().tasks[i];
    let policy = task.retry.clone().unwrap_or_default();
    let extended = job.extended.contains(&task.id);
    let used = job.job.tasks[i]
        .attempts
        .iter()
        .filter(|a| {
            (a.reason != Reason::CapabilityUnavailable.as_str() || f.class == Class::Unavailable)
                && !budget_stop(&a.reason)
        })
        .count()
        .saturating_sub(1 + usize::from(extended)) as u32;
    if used >= policy.max_retries {
        return Move::to(i, TaskState::Failed).because(f.reason, &f.error);
    }
    let delay = if f.class == Class::Requeue {
        0
    } else {
        backoff(task).delay(used + 1, unit_random).as_millis() as u64
    };
    if deadline(job, i).is_some_and(|d| now + delay > d) {
        let why = format!("{}; the next retry would pass the deadline", f.error);
        return Move::to(i, TaskState::Failed).because(Reason::DeadlineExceeded, why);
    }
    Move::to(i, TaskState::Retrying)
        .because(f.reason, &f.error)
        .after(delay)
}

/// A task's backoff (seed defaults: exponential from 1 s, at most 5 min).
pub(crate) fn backoff(task: &TaskSpec) -> Backoff {
    let policy = task.retry.clone().unwrap_or_default();
    let or =
        |v: u64, default: u64| std::time::Duration::from_millis(if v == 0 { default } else { v });
    Backoff {
        strategy: match BackoffStrategy::try_from(policy.backoff_strategy).unwrap_or_default() {
            BackoffStrategy::Fixed => Strategy::Fixed,
            BackoffStrategy::Linear => Strategy::Linear,
            _ => Strategy::Exponential,
        },
        base: or(policy.backoff_base_ms, 1000),
        max: or(policy.backoff_max_ms, 300_000),
        jitter: policy.jitter,
        coefficient: if policy.backoff_coefficient == 0.0 {
            2.0
        } else {
            policy.backoff_coefficient
        },
    }
}

/// SELECT_NEXT_BEST on agent offline (the default): an unreachable agent
/// passes the task to the next candidate; FAIL_AND_NOTIFY ends the attempt.
pub(crate) fn next_on_offline(task: &TaskSpec) -> bool {
    let s = task.fallback.as_ref().map_or(0, |f| f.on_agent_offline);
    FS::try_from(s).unwrap_or(FS::Unspecified) != FS::FailAndNotify
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
