//! Jobs in the shapes of AITP (seed 002): a task's status (§8.2) with its
//! progress (§5.3), and its result (§8.3). Pure: the handlers fetch, these
//! decide what the answer says.

use serde_json::{Value, json};
use switchyard_proto::executor::v1::{GetResultResponse, Job, JobState, TaskState, TaskStatus};

/// The seed's coarse status of a job state: `PENDING | EXECUTING |
/// COMPLETED | FAILED`. The precise OJS state travels beside it.
pub fn job_status(s: JobState) -> &'static str {
    match s {
        JobState::Unspecified | JobState::Scheduled | JobState::Available | JobState::Pending => {
            "PENDING"
        }
        // Paused by its budget: it goes on once its extension is approved.
        JobState::Active | JobState::BudgetPaused => "EXECUTING",
        JobState::Completed => "COMPLETED",
        // Retryable: failed, and nothing runs until it is submitted again.
        JobState::Retryable | JobState::Cancelled | JobState::Discarded => "FAILED",
    }
}

/// Whether a job has its final result (nothing more will run).
pub fn finished(s: JobState) -> bool {
    matches!(
        s,
        JobState::Completed | JobState::Cancelled | JobState::Discarded | JobState::Retryable
    )
}

/// The seed's step status (§5.1: PENDING, EXECUTING, RETRYING, COMPLETED,
/// FAILED) of a task state; the precise state travels beside it.
pub fn step_status(s: TaskState) -> &'static str {
    match s {
        TaskState::Unspecified
        | TaskState::Waiting
        | TaskState::Ready
        | TaskState::Deferred
        | TaskState::BudgetPaused => "PENDING",
        TaskState::Running | TaskState::AwaitingApproval | TaskState::InputRequired => "EXECUTING",
        TaskState::Retrying => "RETRYING",
        TaskState::Succeeded => "COMPLETED",
        TaskState::Failed | TaskState::Skipped | TaskState::Cancelled => "FAILED",
    }
}

/// `active`, `succeeded`, …: the lower-case name of a proto enum value.
fn short(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

/// A job state's short name (`active`), as the doors write it.
pub fn job_state_name(s: i32) -> String {
    short(
        JobState::try_from(s)
            .unwrap_or(JobState::Unspecified)
            .as_str_name(),
        "JOB_STATE_",
    )
}

/// A task state's short name (`succeeded`).
pub fn task_state_name(s: i32) -> String {
    short(
        TaskState::try_from(s)
            .unwrap_or(TaskState::Unspecified)
            .as_str_name(),
        "TASK_STATE_",
    )
}

fn job_state(j: &Job) -> JobState {
    JobState::try_from(j.state).unwrap_or(JobState::Unspecified)
}

fn task_state(t: &TaskStatus) -> TaskState {
    TaskState::try_from(t.state).unwrap_or(TaskState::Unspecified)
}

/// Unix seconds of a timestamp, as the seed writes times; `null` when unset.
fn secs(t: Option<&prost_types::Timestamp>) -> Value {
    t.filter(|t| t.seconds > 0)
        .map_or(Value::Null, |t| t.seconds.into())
}

/// Money in USD as the seed shows it (`0.051`).
pub fn usd(micro: i64) -> f64 {
    micro as f64 / 1e6
}

fn ms(t: Option<&prost_types::Timestamp>) -> Option<u64> {
    t.filter(|t| t.seconds > 0)
        .map(switchyard_kit::time::timestamp_ms)
}

/// The job's id.
pub fn job_id(j: &Job) -> &str {
    j.spec.as_ref().map_or("", |s| s.job_id.as_str())
}

/// One step of §5.3's progress.
fn step(i: usize, t: &TaskStatus, name: &str) -> Value {
    let state = task_state(t);
    let mut s = json!({
        "step_id": i + 1,
        "subtask_id": t.task_id,
        "name": name,
        "status": step_status(state),
        "state": short(state.as_str_name(), "TASK_STATE_"),
        "started_at": secs(t.started_at.as_ref()),
        "completed_at": secs(t.finished_at.as_ref()),
        "agent_id": if t.agent_id.is_empty() { Value::Null } else { t.agent_id.clone().into() },
        "attempts": t.attempts.len(),
    });
    if !t.reason.is_empty() {
        s["reason"] = t.reason.clone().into();
        s["error"] = t.error.clone().into();
    }
    s
}

/// The step being worked on, 1-based: the first running (or backing off)
/// one, else the first not finished; the last when all are; 0 with none.
fn current_step(tasks: &[TaskStatus]) -> usize {
    let at = |pred: &dyn Fn(TaskState) -> bool| tasks.iter().position(|t| pred(task_state(t)));
    at(&|s| matches!(s, TaskState::Running | TaskState::Retrying))
        .or_else(|| {
            at(&|s| {
                !matches!(
                    s,
                    TaskState::Succeeded
                        | TaskState::Failed
                        | TaskState::Skipped
                        | TaskState::Cancelled
                )
            })
        })
        .map_or(tasks.len(), |i| i + 1)
}

/// When the job should finish, from observed step times: the mean time of
/// the steps that finished, times the steps left, from now (unix seconds).
/// `None` — omitted, not invented — while no step has finished or the job
/// is not running.
fn estimated_completion(j: &Job, now_ms: u64) -> Option<u64> {
    if job_state(j) != JobState::Active {
        return None;
    }
    let took: Vec<u64> = j
        .tasks
        .iter()
        .filter(|t| task_state(t) == TaskState::Succeeded)
        .filter_map(|t| {
            Some(ms(t.finished_at.as_ref())?.saturating_sub(ms(t.started_at.as_ref())?))
        })
        .collect();
    if took.is_empty() {
        return None;
    }
    let mean = took.iter().sum::<u64>() / took.len() as u64;
    let left = j
        .tasks
        .iter()
        .filter(|t| {
            !matches!(
                task_state(t),
                TaskState::Succeeded
                    | TaskState::Failed
                    | TaskState::Skipped
                    | TaskState::Cancelled
            )
        })
        .count() as u64;
    Some((now_ms + mean * left).div_ceil(1000))
}

/// §8.2: the task's status, with §5.3's progress.
pub fn status(j: &Job, now_ms: u64) -> Value {
    let state = job_state(j);
    let id = job_id(j);
    let names: std::collections::HashMap<&str, &str> = j
        .spec
        .as_ref()
        .map(|s| {
            s.tasks
                .iter()
                .map(|t| (t.id.as_str(), t.name.as_str()))
                .collect()
        })
        .unwrap_or_default();
    let steps: Vec<Value> = j
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            step(
                i,
                t,
                names.get(t.task_id.as_str()).copied().unwrap_or_default(),
            )
        })
        .collect();
    let progress = j.progress.unwrap_or_default();
    let current = current_step(&j.tasks);
    let cost = j.cost_so_far.map_or(0, |m| m.micro_usd);
    let mut v = json!({
        "task_id": id,
        "status": job_status(state),
        "state": short(state.as_str_name(), "JOB_STATE_"),
        "progress": {
            "task_id": id,
            "current_step": current,
            "total_steps": progress.total_steps,
            "percent_complete": progress.percent_complete,
            "steps": steps,
        },
        "current_step": current,
        "cost_so_far": usd(cost),
        "cost_so_far_micro_usd": cost,
        "tokens_used": j.tokens_used,
        "created_at": secs(j.created_at.as_ref()),
        "started_at": secs(j.started_at.as_ref()),
        "finished_at": secs(j.finished_at.as_ref()),
        "correlation_id": j.spec.as_ref().map_or("", |s| s.correlation_id.as_str()),
        "run_id": j.run_id,
        "last_event_id": j.last_sequence,
    });
    if let Some(t) = estimated_completion(j, now_ms) {
        v["estimated_completion"] = t.into();
    }
    if !j.reason.is_empty() {
        v["reason"] = j.reason.clone().into();
        v["error"] = j.error.clone().into();
    }
    v
}

/// §8.1's answer to a submission.
pub fn submitted(j: &Job) -> Value {
    let state = job_state(j);
    json!({
        "task_id": job_id(j),
        "status": job_status(state),
        "state": short(state.as_str_name(), "JOB_STATE_"),
        "created_at": secs(j.created_at.as_ref()),
        "correlation_id": j.spec.as_ref().map_or("", |s| s.correlation_id.as_str()),
        "run_id": j.run_id,
    })
}

/// The `end` event of a task's event stream: how it ended.
pub fn ended(task_id: &str, state: JobState) -> Value {
    json!({
        "task_id": task_id,
        "status": job_status(state),
        "state": short(state.as_str_name(), "JOB_STATE_"),
    })
}

/// §8.3: the result of a finished task, with every subtask's own outcome
/// (the partial results of a failed one).
pub fn result(r: &GetResultResponse) -> Value {
    let state = JobState::try_from(r.state).unwrap_or(JobState::Unspecified);
    let cost = r.cost.map_or(0, |m| m.micro_usd);
    let subtasks: Vec<Value> = r
        .tasks
        .iter()
        .map(|t| {
            let state = task_state(t);
            let mut s = json!({
                "subtask_id": t.task_id,
                "status": step_status(state),
                "state": short(state.as_str_name(), "TASK_STATE_"),
                "output": t.output.as_ref().map_or(Value::Null, switchyard_kit::json::struct_to_json),
            });
            if let Some(code) = t.exit_code {
                s["exit_code"] = code.into();
                s["stdout"] = String::from_utf8_lossy(&t.stdout).into_owned().into();
                s["stderr"] = String::from_utf8_lossy(&t.stderr).into_owned().into();
            }
            if !t.agent_id.is_empty() {
                s["agent_id"] = t.agent_id.clone().into();
            }
            if !t.reason.is_empty() {
                s["reason"] = t.reason.clone().into();
                s["error"] = t.error.clone().into();
            }
            s
        })
        .collect();
    let mut v = json!({
        "task_id": r.job_id,
        "status": job_status(state),
        "state": short(state.as_str_name(), "JOB_STATE_"),
        "result": r.result.as_ref().map_or(Value::Null, switchyard_kit::json::value_to_json),
        "cost": usd(cost),
        "cost_micro_usd": cost,
        "tokens_used": r.tokens_used,
        "execution_time_ms": r.execution_time_ms,
        "subtasks": subtasks,
    });
    if !r.reason.is_empty() {
        v["reason"] = r.reason.clone().into();
        v["error"] = r.error.clone().into();
    }
    v
}

/// An event of the job's log as an SSE `data` object.
pub fn event(e: &switchyard_proto::common::v1::Event) -> Value {
    json!({
        "sequence": e.sequence,
        "time_ms": e.time.as_ref().map(switchyard_kit::time::timestamp_ms),
        "correlation_id": e.correlation_id,
        "task_id": e.job_id,
        "subtask_id": e.task_id,
        "kind": e.kind,
        "data": e.data.as_ref().map_or(Value::Null, switchyard_kit::json::struct_to_json),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_kit::time::timestamp;
    use switchyard_proto::executor::v1::{JobSpec, Progress};

    #[test]
    fn every_job_state_has_a_seed_status_and_only_final_states_have_results() {
        let table = [
            (JobState::Scheduled, "PENDING", false),
            (JobState::Available, "PENDING", false),
            (JobState::Pending, "PENDING", false),
            (JobState::Active, "EXECUTING", false),
            (JobState::Completed, "COMPLETED", true),
            (JobState::Retryable, "FAILED", true),
            (JobState::Cancelled, "FAILED", true),
            (JobState::Discarded, "FAILED", true),
        ];
        for (s, status, done) in table {
            assert_eq!((job_status(s), finished(s)), (status, done), "{s:?}");
        }
        assert_eq!(table.len() + 1, 9, "every state but UNSPECIFIED is listed");
    }

    #[test]
    fn every_task_state_has_a_seed_step_status() {
        for (s, want) in [
            (TaskState::Waiting, "PENDING"),
            (TaskState::Ready, "PENDING"),
            (TaskState::Deferred, "PENDING"),
            (TaskState::Running, "EXECUTING"),
            (TaskState::Retrying, "RETRYING"),
            (TaskState::Succeeded, "COMPLETED"),
            (TaskState::Failed, "FAILED"),
            (TaskState::Skipped, "FAILED"),
            (TaskState::Cancelled, "FAILED"),
        ] {
            assert_eq!(step_status(s), want, "{s:?}");
        }
    }

    fn task(id: &str, state: TaskState, from_s: i64, to_s: i64) -> TaskStatus {
        TaskStatus {
            task_id: id.into(),
            state: state as i32,
            started_at: (from_s > 0).then(|| timestamp(from_s as u64 * 1000)),
            finished_at: (to_s > 0).then(|| timestamp(to_s as u64 * 1000)),
            ..Default::default()
        }
    }

    fn job(state: JobState, tasks: Vec<TaskStatus>) -> Job {
        Job {
            spec: Some(JobSpec {
                job_id: "j1".into(),
                ..Default::default()
            }),
            state: state as i32,
            progress: Some(Progress {
                current_step: 1,
                total_steps: tasks.len() as u32,
                percent_complete: 33,
            }),
            tasks,
            ..Default::default()
        }
    }

    #[test]
    fn status_names_the_step_in_progress_and_estimates_only_from_observed_steps() {
        let j = job(
            JobState::Active,
            vec![
                task(
                    "subtask_1",
                    TaskState::Succeeded,
                    1_700_614_200,
                    1_700_614_220,
                ),
                task("subtask_2", TaskState::Running, 1_700_614_220, 0),
                task("subtask_3", TaskState::Waiting, 0, 0),
            ],
        );
        let v = status(&j, 1_700_614_230_000);
        assert_eq!(v["status"], "EXECUTING");
        assert_eq!(v["state"], "active");
        assert_eq!(v["current_step"], 2);
        let steps = v["progress"]["steps"].as_array().unwrap();
        assert_eq!(steps[0]["status"], "COMPLETED");
        assert_eq!(steps[0]["completed_at"], 1_700_614_220);
        assert_eq!(steps[1]["status"], "EXECUTING");
        assert_eq!(steps[2]["agent_id"], Value::Null);
        // One step took 20 s; two are left: now + 40 s.
        assert_eq!(v["estimated_completion"], 1_700_614_270);
        // Nothing finished yet, or not running: omitted, not invented.
        let fresh = job(JobState::Active, vec![task("a", TaskState::Running, 1, 0)]);
        assert!(status(&fresh, 5_000).get("estimated_completion").is_none());
        let waiting = job(JobState::Pending, vec![task("a", TaskState::Waiting, 0, 0)]);
        let w = status(&waiting, 5_000);
        assert!(w.get("estimated_completion").is_none());
        assert_eq!(
            (w["status"].as_str(), w["current_step"].as_u64()),
            (Some("PENDING"), Some(1))
        );
        let done = job(
            JobState::Completed,
            vec![task("a", TaskState::Succeeded, 1, 2)],
        );
        assert_eq!(status(&done, 5_000)["current_step"], 1);
    }

    #[test]
    fn money_is_shown_in_usd_and_kept_in_micro_usd() {
        let mut j = job(JobState::Completed, vec![]);
        j.cost_so_far = Some(switchyard_proto::common::v1::Money { micro_usd: 51_000 });
        let v = status(&j, 0);
        assert_eq!(v["cost_so_far"], 0.051);
        assert_eq!(v["cost_so_far_micro_usd"], 51_000);
    }
}
