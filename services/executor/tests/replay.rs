//! Data directories written by earlier releases still open: the executor
//! replays a log from `fixtures/log-v1` (written by the release before the
//! typed event log; see `fixtures/make-log-v1.sh`) to exactly the jobs that
//! release served.

use std::sync::Arc;

use serde_json::{Value, json};
use switchyard_core::SystemClock;
use switchyard_executor::{Clients, Executor, ExecutorConfig};
use switchyard_proto::executor::v1::{Job, TaskStatus};
use switchyard_store::Store;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/log-v1");

fn ms(t: &Option<prost_types::Timestamp>) -> Option<u64> {
    t.as_ref().map(switchyard_kit::time::timestamp_ms)
}

fn short(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_ascii_lowercase()
}

/// The fields of `switchyard job get -o json` that come from the event log.
fn task_view(t: &TaskStatus) -> Value {
    use switchyard_proto::executor::v1::TaskState;
    let state = TaskState::try_from(t.state).unwrap_or_default();
    json!({
        "task_id": t.task_id, "state": short(state.as_str_name(), "TASK_STATE_"),
        "reason": t.reason, "error": t.error, "agent_id": t.agent_id, "exit_code": t.exit_code,
        "started_at_ms": ms(&t.started_at), "finished_at_ms": ms(&t.finished_at),
        "attempts": t.attempts.iter().map(|a| json!({
            "number": a.number, "agent_id": a.agent_id, "error": a.error, "reason": a.reason,
            "started_at_ms": ms(&a.started_at), "finished_at_ms": ms(&a.finished_at)})).collect::<Vec<_>>(),
        "output": t.output.as_ref().map(switchyard_kit::json::struct_to_json),
        "stdout": String::from_utf8_lossy(&t.stdout), "stderr": String::from_utf8_lossy(&t.stderr),
        "output_truncated": t.output_truncated,
        "tokens_used": t.tokens_used, "cost_micro_usd": t.cost.map_or(0, |m| m.micro_usd),
        "model_used": t.model_used,
        "llm_usage": t.llm_usage.map(|u| json!({
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "llm_calls": u.llm_calls, "turns": u.turns})),
        "child_job_ids": t.child_job_ids,
        "resource_limit": t.resource_limit,
    })
}

fn job_view(j: &Job) -> Value {
    use switchyard_proto::executor::v1::JobState;
    let s = j.spec.clone().unwrap_or_default();
    let p = j.progress.unwrap_or_default();
    let state = JobState::try_from(j.state).unwrap_or_default();
    json!({
        "job_id": s.job_id, "plan_id": s.plan_id, "source_format": s.source_format,
        "correlation_id": s.correlation_id,
        "state": short(state.as_str_name(), "JOB_STATE_"), "reason": j.reason, "error": j.error,
        "progress": {"current_step": p.current_step, "total_steps": p.total_steps, "percent_complete": p.percent_complete},
        "cost_so_far_micro_usd": j.cost_so_far.map_or(0, |m| m.micro_usd), "tokens_used": j.tokens_used,
        "run_id": j.run_id, "budget_id": j.budget_id, "submitted_by": j.submitted_by,
        "created_at_ms": ms(&j.created_at), "started_at_ms": ms(&j.started_at), "finished_at_ms": ms(&j.finished_at),
        "last_sequence": j.last_sequence,
        "tasks": j.tasks.iter().map(task_view).collect::<Vec<_>>(),
    })
}

/// The same fields of the fixture's recorded answer.
fn recorded_view(v: &Value) -> Value {
    let keep = |v: &Value, keys: &[&str]| -> Value {
        let o = v.as_object().expect("an object");
        Value::Object(
            keys.iter()
                .map(|k| ((*k).to_owned(), o.get(*k).cloned().unwrap_or(Value::Null)))
                .collect(),
        )
    };
    let mut job = keep(
        v,
        &[
            "job_id",
            "plan_id",
            "source_format",
            "correlation_id",
            "state",
            "reason",
            "error",
            "progress",
            "cost_so_far_micro_usd",
            "tokens_used",
            "run_id",
            "budget_id",
            "submitted_by",
            "created_at_ms",
            "started_at_ms",
            "finished_at_ms",
            "last_sequence",
        ],
    );
    // Progress is derived from the task states, not stored: this release
    // counts the steps that succeeded (the earlier one counted every step
    // that ended, so a discarded job read 100%).
    let all = v["tasks"].as_array().expect("tasks");
    let done = all.iter().filter(|t| t["state"] == "succeeded").count() as u64;
    let total = all.len() as u64;
    job["progress"] = serde_json::json!({
        "current_step": done,
        "total_steps": total,
        "percent_complete": (done * 100).checked_div(total).unwrap_or(100),
    });
    let tasks: Vec<Value> = v["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| {
            keep(
                t,
                &[
                    "task_id",
                    "state",
                    "reason",
                    "error",
                    "agent_id",
                    "exit_code",
                    "started_at_ms",
                    "finished_at_ms",
                    "attempts",
                    "output",
                    "stdout",
                    "stderr",
                    "output_truncated",
                    "tokens_used",
                    "cost_micro_usd",
                    "model_used",
                    "llm_usage",
                    "child_job_ids",
                    "resource_limit",
                ],
            )
        })
        .collect();
    job["tasks"] = Value::Array(tasks);
    job
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read fixture") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// The executor of a copy of the fixture; its peers are never called
/// while it only replays.
fn open_fixture(dir: &std::path::Path) -> Executor {
    copy_dir(std::path::Path::new(FIXTURE), dir);
    let store = Store::open(dir.join("executor")).expect("open the fixture's store");
    let nowhere = || {
        switchyard_kit::client::authed(
            switchyard_kit::client::lazy_channel("http://127.0.0.1:9").expect("url"),
            None,
        )
    };
    let clients = Clients {
        registry: switchyard_api::RegistryClient::remote(nowhere(), 1 << 20),
        router: switchyard_api::RouterClient::remote(nowhere(), 1 << 20),
        ledger: switchyard_api::LedgerClient::remote(nowhere(), 1 << 20),
        approval: switchyard_api::ApprovalClient::remote(nowhere(), 1 << 20),
        llm: switchyard_llm::Llm::new(&Default::default()).expect("no providers"),
    };
    let cfg = ExecutorConfig {
        sandbox: switchyard_executor::SandboxMode::Off,
        ..Default::default()
    };
    let (_trigger, shutdown) = switchyard_kit::shutdown::channel();
    Executor::open(
        cfg,
        store,
        clients,
        Arc::new(SystemClock),
        shutdown,
        dir,
        1 << 20,
    )
    .expect("the executor opens a data directory of the earlier release")
}

#[tokio::test]
async fn a_log_written_by_the_earlier_release_replays_to_the_jobs_it_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let x = open_fixture(dir.path());
    let recorded: Vec<Value> =
        serde_json::from_slice(&std::fs::read(format!("{FIXTURE}/jobs.json")).expect("jobs.json"))
            .expect("jobs.json is JSON");
    assert_eq!(recorded.len(), 7);
    for want in &recorded {
        let id = want["job_id"].as_str().expect("job_id");
        let got = x.job(id).await.expect("the job is there after replay");
        assert_eq!(job_view(&got), recorded_view(want), "job {id}");
    }
}

#[test]
fn every_event_of_the_earlier_release_round_trips_through_the_typed_log() {
    use switchyard_executor::events::JobEvent;
    use switchyard_proto::common::v1::Event;
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(std::path::Path::new(FIXTURE), dir.path());
    let store = Store::open(dir.path().join("executor")).expect("open the fixture's store");
    let log = store.log::<Event>("events").expect("the event log");
    let mut kinds = std::collections::BTreeSet::new();
    let mut n = 0;
    for r in log.replay() {
        let (_, ev) = r.expect("a stored event");
        let typed = JobEvent::decode(&ev.kind, ev.data.as_ref())
            .expect("decodes")
            .unwrap_or_else(|| panic!("{} is a kind this release knows", ev.kind));
        assert_eq!(typed.kind(), ev.kind);
        assert_eq!(
            typed.data(),
            ev.data,
            "{} #{} of {}",
            ev.kind,
            ev.sequence,
            ev.job_id
        );
        kinds.insert(ev.kind.clone());
        n += 1;
    }
    assert!(n > 100, "{n} events");
    // The fixture exercises every kind but delegation's two (they
    // round-trip in the unit tests of `events`).
    assert_eq!(kinds.len(), 20, "{kinds:?}");
}
