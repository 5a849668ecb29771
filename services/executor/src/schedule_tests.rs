//! Table tests of each scheduling rule, and a property: random DAGs with
//! random failures never start a task before its dependencies, never
//! exceed max_parallel, and always end.

use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest};
use proptest::strategy::Strategy as Generate;
use switchyard_core::Reason;
use switchyard_core::lifecycle::TaskState;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{
    BackoffStrategy, CommandTask, FallbackPolicy, FallbackStrategy as FS, JobSpec, RetryPolicy,
    TaskSpec, task_spec::Kind,
};

use super::*;
use crate::events::{self, JobEvent};
use crate::job::JobEntry;

const POLICY: Policy = Policy {
    cancel_running_on_failure: false,
    defer_interval_secs: 300,
    max_defer_secs: 3600,
};

fn task(id: &str, deps: &[&str]) -> TaskSpec {
    TaskSpec {
        id: id.into(),
        depends_on: deps.iter().map(|d| (*d).into()).collect(),
        timeout_secs: 30,
        kind: Some(Kind::Command(CommandTask {
            command: "true".into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn job(tasks: Vec<TaskSpec>, max_parallel: u32) -> JobEntry {
    let spec = JobSpec {
        job_id: "j".into(),
        tasks,
        max_parallel,
        ..Default::default()
    };
    let dag = crate::spec::dag(&spec).expect("a valid DAG");
    JobEntry::new(spec, dag, 0)
}

/// Applies an event the way the book does.
fn apply(j: &mut JobEntry, task: usize, ev: JobEvent, now: u64) {
    let at = Event {
        sequence: j.job.last_sequence + 1,
        time: Some(switchyard_kit::time::timestamp(now)),
        task_id: j.spec().tasks[task].id.clone(),
        ..Default::default()
    };
    j.apply(&at, &ev, |_| None);
}

fn record(j: &mut JobEntry, m: &Move, now: u64) {
    let from = j.task_state(m.task);
    assert!(
        from.check(m.to).is_ok(),
        "{from} -> {} is not in the table",
        m.to
    );
    let ev = JobEvent::TaskMoved(events::TaskMoved {
        from: from.as_str().into(),
        to: m.to.as_str().into(),
        reason: m.reason.map_or("", |r| r.as_str()).into(),
        error: m.error.clone(),
        next_attempt_at_ms: m.after_ms.map_or(0, |d| now + d),
        extend: m.extend,
    });
    apply(j, m.task, ev, now);
}

fn start(j: &mut JobEntry, task: usize, attempt: u32, timeout_secs: u32, now: u64) {
    let started = events::AttemptStarted {
        attempt,
        timeout_secs,
        worker_id: String::new(),
    };
    apply(j, task, JobEvent::AttemptStarted(started), now);
    record(j, &Move::to(task, TaskState::Running), now);
}

/// Records a step's decisions; returns the tasks started.
fn take(j: &mut JobEntry, step: &Step, now: u64) -> Vec<usize> {
    let mut started = Vec::new();
    for d in &step.decisions {
        match d {
            Decision::Move(m) => record(j, m, now),
            Decision::Start {
                task,
                attempt,
                timeout_secs,
            } => {
                start(j, *task, *attempt, *timeout_secs, now);
                started.push(*task);
            }
        }
    }
    started
}

fn states(j: &JobEntry) -> Vec<TaskState> {
    (0..j.job.tasks.len()).map(|i| j.task_state(i)).collect()
}

fn fail(class: Class) -> Failure {
    Failure {
        class,
        reason: Reason::CommandFailed,
        error: "boom".into(),
    }
}

/// A job whose only task is running its first attempt.
fn running_one(t: TaskSpec) -> JobEntry {
    let mut j = job(vec![t], 1);
    let s = step(&j, 1_000, 0, &POLICY);
    take(&mut j, &s, 1_000);
    assert_eq!(j.task_state(0), TaskState::Running);
    j
}

#[test]
fn a_task_becomes_ready_and_starts_only_after_its_dependencies_succeed() {
    let mut j = job(vec![task("a", &[]), task("b", &["a"])], 4);
    let s = step(&j, 0, 0, &POLICY);
    assert_eq!(take(&mut j, &s, 0), [0]);
    assert_eq!(states(&j), [TaskState::Running, TaskState::Waiting]);
    record(&mut j, &Move::to(0, TaskState::Succeeded), 1);
    let s = step(&j, 1, 0, &POLICY);
    assert_eq!(take(&mut j, &s, 1), [1]);
    let s = step(&j, 2, 1, &POLICY);
    assert!(s.decisions.is_empty() && !s.done);
    record(&mut j, &Move::to(1, TaskState::Succeeded), 3);
    assert!(step(&j, 3, 0, &POLICY).done);
}

#[test]
fn fail_fast_skips_what_has_not_started_and_cancels_what_waits_to_retry() {
    let mut j = job(
        vec![
            task("a", &[]),
            task("b", &[]),
            task("c", &["a"]),
            task("d", &[]),
        ],
        1,
    );
    let s = step(&j, 0, 0, &POLICY);
    take(&mut j, &s, 0);
    // b runs and fails for good; d is left waiting to retry meanwhile.
    record(&mut j, &Move::to(0, TaskState::Succeeded), 1);
    let s = step(&j, 1, 0, &POLICY);
    assert_eq!(take(&mut j, &s, 1), [1]);
    record(
        &mut j,
        &Move::to(1, TaskState::Failed).because(Reason::CommandFailed, "x"),
        2,
    );
    let s = step(&j, 2, 0, &POLICY);
    take(&mut j, &s, 2);
    assert_eq!(
        states(&j),
        [
            TaskState::Succeeded,
            TaskState::Failed,
            TaskState::Skipped,
            TaskState::Skipped
        ]
    );
    assert!(s.done);
    let mut j = job(vec![task("a", &[]), task("b", &[])], 2);
    let s = step(&j, 0, 0, &POLICY);
    take(&mut j, &s, 0);
    record(
        &mut j,
        &Move::to(0, TaskState::Retrying)
            .because(Reason::CommandFailed, "x")
            .after(50),
        1,
    );
    record(
        &mut j,
        &Move::to(1, TaskState::Failed).because(Reason::CommandFailed, "x"),
        1,
    );
    let s = step(&j, 1, 0, &POLICY);
    take(&mut j, &s, 1);
    assert_eq!(j.task_state(0), TaskState::Cancelled);
    assert!(
        j.job.tasks[0].error.contains("fail-fast"),
        "{}",
        j.job.tasks[0].error
    );
}

#[test]
fn skips_cascade_down_the_graph_in_one_step() {
    let mut j = job(
        vec![task("a", &[]), task("b", &["a"]), task("c", &["b"])],
        1,
    );
    let s = step(&j, 0, 0, &POLICY);
    take(&mut j, &s, 0);
    record(
        &mut j,
        &Move::to(0, TaskState::Failed).because(Reason::CommandFailed, "x"),
        1,
    );
    let s = step(&j, 1, 0, &POLICY);
    take(&mut j, &s, 1);
    assert_eq!(j.task_state(1), TaskState::Skipped);
    assert_eq!(j.task_state(2), TaskState::Skipped);
    assert!(s.done);
}

#[test]
fn cancel_running_on_failure_stops_the_running_attempts() {
    let policy = Policy {
        cancel_running_on_failure: true,
        ..POLICY
    };
    let mut j = job(vec![task("a", &[]), task("b", &[])], 2);
    let s = step(&j, 0, 0, &policy);
    take(&mut j, &s, 0);
    record(
        &mut j,
        &Move::to(0, TaskState::Failed).because(Reason::CommandFailed, "x"),
        1,
    );
    let s = step(&j, 1, 1, &policy);
    assert!(s.abort_running);
    take(&mut j, &s, 1);
    assert_eq!(j.task_state(1), TaskState::Cancelled);
    let s = step(&j, 1, 1, &POLICY);
    assert!(!s.abort_running, "off by default");
}

#[test]
fn no_more_than_max_parallel_attempts_run() {
    let tasks = (0..5).map(|i| task(&format!("t{i}"), &[])).collect();
    let mut j = job(tasks, 2);
    let s = step(&j, 0, 0, &POLICY);
    assert_eq!(take(&mut j, &s, 0).len(), 2);
    let s = step(&j, 0, 2, &POLICY);
    assert!(take(&mut j, &s, 0).is_empty());
    let s = step(&j, 0, 1, &POLICY);
    assert_eq!(take(&mut j, &s, 0).len(), 1);
}

#[test]
fn a_task_past_its_deadline_is_not_started() {
    let mut t = task("a", &[]);
    t.deadline = Some(switchyard_kit::time::timestamp(500));
    let mut j = job(vec![t], 1);
    let s = step(&j, 1_000, 0, &POLICY);
    take(&mut j, &s, 1_000);
    assert_eq!(j.task_state(0), TaskState::Failed);
    assert_eq!(j.job.tasks[0].reason, Reason::DeadlineExceeded.as_str());
}

#[test]
fn a_retrying_task_is_due_at_its_time_and_the_step_says_when() {
    let mut j = running_one(task("a", &[]));
    record(
        &mut j,
        &Move::to(0, TaskState::Retrying)
            .because(Reason::CommandFailed, "x")
            .after(250),
        1_000,
    );
    let s = step(&j, 1_100, 0, &POLICY);
    assert!(s.decisions.is_empty());
    assert_eq!(s.next_wake, Some(1_250));
    let s = step(&j, 1_250, 0, &POLICY);
    assert!(matches!(
        s.decisions[..],
        [Decision::Start {
            task: 0,
            attempt: 2,
            ..
        }]
    ));
}

fn fallback(f: FallbackPolicy) -> TaskSpec {
    TaskSpec {
        fallback: Some(f),
        ..task("a", &[])
    }
}

#[test]
fn permanent_failures_fail_at_once() {
    let mut t = task("a", &[]);
    t.retry = Some(RetryPolicy {
        max_retries: 5,
        ..Default::default()
    });
    let j = running_one(t);
    let (m, note) = after_failure(&j, 0, &fail(Class::Permanent), 1_000, 0.0, &POLICY);
    assert_eq!((m.to, note), (TaskState::Failed, None));
}

#[test]
fn cost_exceeded_pauses_the_task_and_notifies_with_the_tasks_notification() {
    let j = running_one(task("a", &[]));
    let (m, note) = after_failure(&j, 0, &fail(Class::Budget), 1_000, 0.0, &POLICY);
    assert_eq!(m.to, TaskState::BudgetPaused);
    assert_eq!(note.as_deref(), Some("Task exceeded budget: boom"));
    let j = running_one(fallback(FallbackPolicy {
        notification: "page the owner".into(),
        ..Default::default()
    }));
    let (_, note) = after_failure(&j, 0, &fail(Class::Budget), 1_000, 0.0, &POLICY);
    assert_eq!(note.as_deref(), Some("page the owner: boom"));
}

/// A budget refusal as the attempt records it.
fn budget_refused() -> Failure {
    Failure {
        class: Class::Budget,
        reason: Reason::AgentCostBudgetExceeded,
        error: "the budget refused the reservation".into(),
    }
}

#[test]
fn a_budget_pause_starts_nothing_new_and_pauses_once_nothing_runs() {
    // a and b run side by side; c follows a.
    let mut j = job(vec![task("a", &[]), task("b", &[]), task("c", &["a"])], 2);
    let s = step(&j, 1_000, 0, &POLICY);
    assert_eq!(take(&mut j, &s, 1_000), vec![0, 1]);
    let (m, _) = after_failure(&j, 0, &budget_refused(), 1_010, 0.0, &POLICY);
    record(&mut j, &m, 1_010);
    // b still runs: the job is not paused yet, and nothing starts.
    let s = step(&j, 1_020, 1, &POLICY);
    assert!(s.paused && !s.done);
    assert!(take(&mut j, &s, 1_020).is_empty());
    record(&mut j, &Move::to(1, TaskState::Succeeded), 1_030);
    let s = step(&j, 1_040, 0, &POLICY);
    assert!(s.paused && !s.done && s.next_wake.is_none());
    assert_eq!(
        states(&j),
        vec![
            TaskState::BudgetPaused,
            TaskState::Succeeded,
            TaskState::Waiting
        ]
    );
    // Approved: a runs again as attempt 2, and b is never run again.
    for m in end_pause(&j, PauseEnd::Approved) {
        record(&mut j, &m, 1_050);
    }
    let s = step(&j, 1_060, 0, &POLICY);
    assert!(!s.paused);
    assert_eq!(take(&mut j, &s, 1_060), vec![0]);
    assert_eq!(j.job.tasks[0].attempts.len(), 2);
    assert_eq!(j.job.tasks[1].attempts.len(), 1);
}

#[test]
fn a_budget_pause_is_not_a_retry_and_a_refused_extension_fails_the_task() {
    let mut t = task("a", &[]);
    t.retry = Some(RetryPolicy {
        max_retries: 1,
        ..Default::default()
    });
    let mut j = running_one(t);
    // Three pauses, each approved: the one retry is still there.
    for n in 0..3u64 {
        let at = 1_000 + n * 100;
        let (m, _) = after_failure(&j, 0, &budget_refused(), at, 0.0, &POLICY);
        record(&mut j, &m, at);
        for m in end_pause(&j, PauseEnd::Approved) {
            record(&mut j, &m, at + 10);
        }
        let s = step(&j, at + 20, 0, &POLICY);
        take(&mut j, &s, at + 20);
    }
    let (m, _) = after_failure(&j, 0, &fail(Class::Other), 2_000, 0.0, &POLICY);
    assert_eq!(m.to, TaskState::Retrying);
    // A rejected extension fails the paused task with the decision's reason.
    let mut j = running_one(task("a", &[]));
    let (m, _) = after_failure(&j, 0, &budget_refused(), 1_000, 0.0, &POLICY);
    record(&mut j, &m, 1_000);
    let why = "the extension was rejected";
    let moves = end_pause(&j, PauseEnd::Refused(Reason::BudgetExtensionRejected, why));
    assert_eq!(moves.len(), 1);
    assert_eq!(
        (moves[0].to, moves[0].reason, moves[0].error.as_str()),
        (
            TaskState::Failed,
            Some(Reason::BudgetExtensionRejected),
            why
        )
    );
}

#[test]
fn another_tasks_failure_cancels_a_budget_paused_task() {
    let mut j = job(vec![task("a", &[]), task("b", &[])], 2);
    let s = step(&j, 1_000, 0, &POLICY);
    take(&mut j, &s, 1_000);
    let (m, _) = after_failure(&j, 0, &budget_refused(), 1_010, 0.0, &POLICY);
    record(&mut j, &m, 1_010);
    record(
        &mut j,
        &Move::to(1, TaskState::Failed).because(Reason::CommandFailed, "boom"),
        1_020,
    );
    let s = step(&j, 1_030, 0, &POLICY);
    take(&mut j, &s, 1_030);
    assert!(s.done);
    assert_eq!(j.task_state(0), TaskState::Cancelled);
}

#[test]
fn timeouts_fail_and_notify_or_retry_once_with_the_extended_timeout() {
    let j = running_one(fallback(FallbackPolicy {
        on_timeout: FS::FailAndNotify as i32,
        ..Default::default()
    }));
    let (m, note) = after_failure(&j, 0, &fail(Class::Timeout), 1_000, 0.0, &POLICY);
    assert_eq!(m.to, TaskState::Failed);
    assert!(note.is_some_and(|n| n.contains("timed out")));

    let mut j = running_one(fallback(FallbackPolicy {
        on_timeout: FS::RetryWithTimeoutExtension as i32,
        extended_timeout_seconds: 90,
        ..Default::default()
    }));
    let (m, _) = after_failure(&j, 0, &fail(Class::Timeout), 1_000, 0.0, &POLICY);
    assert_eq!(
        (m.to, m.extend, m.after_ms),
        (TaskState::Retrying, true, Some(0))
    );
    record(&mut j, &m, 1_000);
    let s = step(&j, 1_000, 0, &POLICY);
    assert!(matches!(
        s.decisions[..],
        [Decision::Start {
            timeout_secs: 90,
            ..
        }]
    ));
    take(&mut j, &s, 1_000);
    // Extended once: a second timeout goes to the retry policy (none left).
    let (m, _) = after_failure(&j, 0, &fail(Class::Timeout), 2_000, 0.0, &POLICY);
    assert_eq!(m.to, TaskState::Failed);
}

#[test]
fn unavailable_capabilities_defer_until_the_deadline() {
    let t = fallback(FallbackPolicy {
        on_capability_unavailable: FS::Defer as i32,
        defer_interval_seconds: 10,
        ..Default::default()
    });
    let j = running_one(t.clone());
    let (m, _) = after_failure(&j, 0, &fail(Class::Unavailable), 1_000, 0.0, &POLICY);
    assert_eq!((m.to, m.after_ms), (TaskState::Deferred, Some(10_000)));
    let mut late = t;
    late.deadline = Some(switchyard_kit::time::timestamp(5_000));
    let j = running_one(late);
    let (m, _) = after_failure(&j, 0, &fail(Class::Unavailable), 1_000, 0.0, &POLICY);
    assert_eq!(m.to, TaskState::Failed);
    assert_eq!(m.reason, Some(Reason::DeadlineExceeded));
    // Without a deadline, the longest deferral bounds it.
    let policy = Policy {
        max_defer_secs: 5,
        ..POLICY
    };
    let j = running_one(fallback(FallbackPolicy {
        on_capability_unavailable: FS::Defer as i32,
        defer_interval_seconds: 10,
        ..Default::default()
    }));
    let (m, _) = after_failure(&j, 0, &fail(Class::Unavailable), 1_000, 0.0, &policy);
    assert_eq!(m.to, TaskState::Failed);
}

#[test]
fn agents_offline_go_to_the_next_candidate_unless_told_to_fail() {
    assert!(next_on_offline(&task("a", &[])));
    let t = fallback(FallbackPolicy {
        on_agent_offline: FS::SelectNextBest as i32,
        ..Default::default()
    });
    assert!(next_on_offline(&t));
    let t = fallback(FallbackPolicy {
        on_agent_offline: FS::FailAndNotify as i32,
        ..Default::default()
    });
    assert!(!next_on_offline(&t));
}

fn retrying(strategy: BackoffStrategy, jitter: f64, max_retries: u32) -> TaskSpec {
    TaskSpec {
        retry: Some(RetryPolicy {
            max_retries,
            backoff_strategy: strategy as i32,
            backoff_base_ms: 100,
            backoff_max_ms: 1_000,
            jitter,
            ..Default::default()
        }),
        ..task("a", &[])
    }
}

/// The delays of retries 1..=n when every attempt fails at `now`.
fn delays(t: TaskSpec, n: u32, unit: f64) -> Vec<u64> {
    let mut j = running_one(t);
    let mut out = Vec::new();
    let mut now = 1_000;
    for _ in 0..n {
        let (m, _) = after_failure(&j, 0, &fail(Class::Other), now, unit, &POLICY);
        if m.to != TaskState::Retrying {
            break;
        }
        out.push(m.after_ms.unwrap_or_default());
        record(&mut j, &m, now);
        now += m.after_ms.unwrap_or_default();
        let s = step(&j, now, 0, &POLICY);
        take(&mut j, &s, now);
    }
    out
}

#[test]
fn every_backoff_kind_grows_as_named_up_to_its_cap_and_the_retries_run_out() {
    assert_eq!(
        delays(retrying(BackoffStrategy::Fixed, 0.0, 3), 5, 0.5),
        [100, 100, 100]
    );
    assert_eq!(
        delays(retrying(BackoffStrategy::Linear, 0.0, 4), 5, 0.5),
        [100, 200, 300, 400]
    );
    assert_eq!(
        delays(retrying(BackoffStrategy::Exponential, 0.0, 5), 6, 0.5),
        [100, 200, 400, 800, 1_000]
    );
}

#[test]
fn jitter_shortens_a_delay_by_at_most_its_fraction() {
    for unit in [0.0, 0.25, 0.999] {
        let got = delays(retrying(BackoffStrategy::Exponential, 0.5, 4), 4, unit);
        assert_eq!(got.len(), 4);
        for (d, nominal) in got.into_iter().zip([100, 200, 400, 800]) {
            assert!(
                d >= nominal / 2 && d <= nominal,
                "unit {unit}: {d} for {nominal}"
            );
        }
    }
    assert_eq!(
        delays(retrying(BackoffStrategy::Fixed, 0.5, 1), 1, 0.0),
        [100]
    );
    assert_eq!(
        delays(retrying(BackoffStrategy::Fixed, 0.5, 1), 1, 1.0),
        [50]
    );
}

#[test]
fn a_retry_that_would_pass_the_deadline_fails_instead() {
    let mut t = retrying(BackoffStrategy::Fixed, 0.0, 3);
    t.deadline = Some(switchyard_kit::time::timestamp(1_050));
    let j = running_one(t);
    let (m, _) = after_failure(&j, 0, &fail(Class::Other), 1_000, 0.0, &POLICY);
    assert_eq!(
        (m.to, m.reason),
        (TaskState::Failed, Some(Reason::DeadlineExceeded))
    );
}

/// A random job: tasks depend only on earlier ones.
fn arb_job() -> impl Generate<Value = (Vec<Vec<usize>>, u32, Vec<u32>)> {
    (1usize..9).prop_flat_map(|n| {
        let deps = (0..n)
            .map(|i| proptest::collection::vec(0..i.max(1), 0..=i.min(3)))
            .collect::<Vec<_>>();
        (deps, 1u32..4, proptest::collection::vec(0u32..3, n))
    })
}

proptest! {
    #[test]
    fn random_dags_with_random_failures_respect_dependencies_and_parallelism_and_end(
        (deps, max_parallel, retries) in arb_job(),
        outcomes in proptest::collection::vec(0u8..6, 64),
        picks in proptest::collection::vec(any::<u16>(), 64),
    ) {
        let tasks: Vec<TaskSpec> = deps
            .iter()
            .enumerate()
            .map(|(i, ds)| {
                let mut ds: Vec<usize> = ds.iter().copied().filter(|&d| d < i).collect();
                ds.sort_unstable();
                ds.dedup();
                let names: Vec<String> = ds.iter().map(|d| format!("t{d}")).collect();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let mut t = task(&format!("t{i}"), &refs);
                t.retry = Some(RetryPolicy { max_retries: retries[i], backoff_base_ms: 10, ..Default::default() });
                t.fallback = Some(FallbackPolicy {
                    on_timeout: if i % 2 == 0 { FS::RetryWithTimeoutExtension } else { FS::FailAndNotify } as i32,
                    on_capability_unavailable: FS::Defer as i32,
                    defer_interval_seconds: 1,
                    extended_timeout_seconds: 60,
                    ..Default::default()
                });
                t
            })
            .collect();
        let mut j = job(tasks, max_parallel);
        let policy = Policy { max_defer_secs: 3, ..POLICY };
        let mut running: Vec<usize> = Vec::new();
        let mut now = 1_000u64;
        let mut draws = 0usize;
        let mut ended = false;
        for _ in 0..2_000 {
            let s = step(&j, now, running.len(), &policy);
            for d in &s.decisions {
                if let Decision::Start { task, .. } = d {
                    for &dep in j.dag.deps(*task) {
                        prop_assert_eq!(j.task_state(dep), TaskState::Succeeded, "t{} started before t{}", task, dep);
                    }
                }
            }
            running.extend(take(&mut j, &s, now));
            prop_assert!(running.len() <= max_parallel as usize);
            if s.done && running.is_empty() {
                ended = true;
                break;
            }
            if s.paused && running.is_empty() {
                // The job paused for its budget: the extension is approved.
                for m in end_pause(&j, PauseEnd::Approved) {
                    record(&mut j, &m, now);
                }
                continue;
            }
            if running.is_empty() {
                // Nothing runs: something must be due later.
                let wake = s.next_wake;
                prop_assert!(wake.is_some(), "stuck: {:?}", states(&j));
                now = wake.unwrap_or(now);
                continue;
            }
            let which = picks[draws % picks.len()] as usize % running.len();
            let i = running.swap_remove(which);
            let class = match outcomes[draws % outcomes.len()] {
                0 | 1 => None,
                2 => Some(Class::Timeout),
                3 => Some(Class::Unavailable),
                4 => Some(Class::Budget),
                _ => Some(Class::Other),
            };
            draws += 1;
            now += 5;
            match class {
                None => record(&mut j, &Move::to(i, TaskState::Succeeded), now),
                Some(c) => {
                    let (m, _) = after_failure(&j, i, &fail(c), now, 0.5, &policy);
                    record(&mut j, &m, now);
                }
            }
        }
        prop_assert!(ended, "did not end: {:?}", states(&j));
        prop_assert!(states(&j).iter().all(|s| s.is_terminal()));
    }
}
