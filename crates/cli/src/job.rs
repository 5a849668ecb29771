//! `switchyard job ...`: submit jobs in any accepted format, follow them
//! live, read results, cancel.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Subcommand;
use serde_json::{Value, json};
use switchyard_api::ExecutorClient;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::*;
use tokio_stream::StreamExt;

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json, print_list, short_name, table, usd};

/// `switchyard job ...`
#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Submit a job: a native JobSpec, an AGEniX envelope, an AITP task or an
    /// OJS job, as JSON or YAML.
    #[command(after_help = crate::report::EXIT_CODES)]
    Submit {
        /// The job file; `-` reads it from standard input.
        file: PathBuf,
        /// Files for the job's scratch directory (by file name); repeat for several.
        #[arg(long = "attach")]
        attach: Vec<PathBuf>,
        /// Follow the job live until it finishes (exit 0 when it completes,
        /// 3 when it ends discarded or cancelled).
        #[arg(long)]
        watch: bool,
        /// Read the file as this format only (native, agenix, aitp, ojs)
        /// instead of detecting it from the document's shape.
        #[arg(long)]
        format: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Run a finished job again as a new job from the same spec: afresh
    /// (every task runs; --input replaces its input), or with --resume from
    /// where it stopped — the tasks that succeeded are kept with their
    /// outputs and never run again, the rest run. The new job is yours,
    /// approved and budgeted like any you submit.
    #[command(after_help = crate::report::EXIT_CODES)]
    Rerun {
        /// The finished job.
        id: String,
        /// Keep the tasks that succeeded and run the rest (a failed,
        /// cancelled or budget-stopped job goes on where it stopped).
        #[arg(long)]
        resume: bool,
        /// Afresh only: the new job's input, as JSON (`@FILE` reads it
        /// from a file).
        #[arg(long, conflicts_with = "resume")]
        input: Option<String>,
        /// The new job's id (a repeat with the same id answers with that
        /// job); default: a new one.
        #[arg(long = "new-id")]
        new_id: Option<String>,
        /// Follow the new job live until it finishes (exit 0 when it
        /// completes, 3 when it ends discarded or cancelled).
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Run a job and print its result: one call submits it and waits for it
    /// to end (no event stream). Exit 0 when it completed, 3 when it ended
    /// discarded or cancelled, 4 when it was still running after --wait.
    #[command(after_help = crate::report::EXIT_CODES)]
    Run {
        /// The job file; `-` reads it from standard input.
        file: PathBuf,
        /// Files for the job's scratch directory (by file name); repeat for several.
        #[arg(long = "attach")]
        attach: Vec<PathBuf>,
        /// Read the file as this format only (native, agenix, aitp, ojs).
        #[arg(long)]
        format: Option<String>,
        /// Seconds to wait for the job to end; it goes on after that.
        #[arg(long, default_value_t = 600)]
        wait: u64,
        #[command(flatten)]
        conn: Conn,
    },
    /// Dry run: validation, execution order, worst-case cost, routing preview.
    Validate {
        /// The job file; `-` reads it from standard input.
        file: PathBuf,
        /// Read the file as this format only (native, agenix, aitp, ojs).
        #[arg(long)]
        format: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a job: state, progress, cost, tasks.
    Get {
        /// Job id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// The story of a job, in order: who submitted it, how it was approved,
    /// where each step went and why, what was reserved, spent and released,
    /// which tool calls a person gated, delegations, pauses; the cost by
    /// step, agent and model against what was approved; whether its journal
    /// verifies.
    Explain {
        /// Job id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List jobs, newest first.
    List {
        /// Only these states, comma-separated (pending, active, completed, ...).
        #[arg(long, value_delimiter = ',')]
        state: Vec<String>,
        /// Only jobs of this plan.
        #[arg(long)]
        plan: Option<String>,
        /// Only jobs created since: an age (30m, 12h, 7d, 2w ago), a date
        /// (2026-11-29) or a UTC time (2026-11-29T14:00:00Z).
        #[arg(long, value_parser = crate::output::parse_time)]
        since: Option<u64>,
        /// Only jobs created before this time (the same forms).
        #[arg(long, value_parser = crate::output::parse_time)]
        until: Option<u64>,
        /// Only jobs submitted by this principal.
        #[arg(long)]
        submitter: Option<String>,
        /// Only jobs with this label (KEY=VALUE); repeatable, all must hold.
        #[arg(long = "label", value_parser = crate::client::parse_kv)]
        labels: Vec<(String, String)>,
        /// Most jobs to show.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        conn: Conn,
        /// Only dead-lettered jobs (discarded, kept for an operator to retry
        /// or delete).
        #[arg(long)]
        dead_letter: bool,
    },
    /// Follow a job's events (resumable with --after); ends when the job
    /// does: exit 0 when it completed, 3 when it ended discarded or cancelled.
    #[command(after_help = crate::report::EXIT_CODES)]
    Watch {
        /// Job id.
        id: String,
        /// Resume after this event sequence.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Print every event instead of the progress view.
        #[arg(long)]
        events: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// List a job's artifacts (changeset bundles, draft PRs, files its
    /// tasks produced); with --out, download them byte for byte.
    Artifacts {
        /// Job id.
        id: String,
        /// Write each artifact to DIR/<task id>/<name>.
        #[arg(long = "out", value_name = "DIR")]
        out: Option<std::path::PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Outputs, partial results, cost and execution time.
    #[command(after_help = crate::report::EXIT_CODES)]
    Result {
        /// Job id.
        id: String,
        /// Wait up to this many seconds for the job to end first (exit 4
        /// when it is still running then; without it, the result as it is
        /// now, exit 0).
        #[arg(long)]
        wait: Option<u64>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Run a dead-lettered job again (`job list --dead-letter` lists them):
    /// its tasks start over with no attempts, under a new approval run and
    /// budget. Needs `dead_letter.manage` (operators, admins).
    Retry {
        /// Job id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a dead-lettered job for good: its record, outputs and events.
    /// Needs `dead_letter.manage` (operators, admins).
    Delete {
        /// Job id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Answer a task waiting for input (an input task): the answer is JSON,
    /// from a file (`-`: standard input) or `--answer`. Retrying with the
    /// same `--key` is safe: the first answer's outcome comes back.
    #[command(after_help = crate::report::EXIT_CODES)]
    Input {
        /// Job id.
        id: String,
        /// The waiting task (needed when several wait).
        #[arg(long = "task", default_value = "")]
        task: String,
        /// A JSON file with the answer; `-` reads standard input.
        #[arg(short = 'f', long = "file", conflicts_with = "answer")]
        file: Option<PathBuf>,
        /// The answer as JSON text (a bare word is taken as a string).
        #[arg(long)]
        answer: Option<String>,
        /// Idempotency key (default: a new one per call).
        #[arg(long, default_value = "")]
        key: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the tasks waiting for input that you may answer, oldest first.
    Inputs {
        /// Only this job's.
        #[arg(long = "job", default_value = "")]
        job: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Resume a job its budget paused (budget_paused): approve the
    /// extension it asks for (`job get` shows it). The job's budget is
    /// raised by that much and the job goes on where it stopped; no
    /// finished task runs again. Needs the approver role, and someone other
    /// than the submitter (a second approver when the amount is above the
    /// two-person threshold). `switchyard approval reject JOB -m why` ends
    /// it instead. --up-to and --tokens grant another amount than asked.
    Resume {
        /// Job id.
        id: String,
        /// Comment for the audit log.
        #[arg(short = 'm', long, default_value = "")]
        comment: String,
        /// Grant this much money instead of what the job asks for
        /// (dollars, `0.25`, or micro-USD, `250000micro`).
        #[arg(long, value_parser = crate::output::parse_money)]
        up_to: Option<i64>,
        /// Grant this many tokens instead of what the job asks for.
        #[arg(long)]
        tokens: Option<u64>,
        /// The approval service's URL when it is not at --url (services
        /// split).
        #[arg(long, env = "SWITCHYARD_APPROVAL_URL")]
        approval_url: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Cancel a job: stop running work, release reservations, cancel its run.
    Cancel {
        /// Job id.
        id: String,
        /// Why (kept on the job and the approval run).
        #[arg(short = 'm', long, default_value = "")]
        reason: String,
        #[command(flatten)]
        conn: Conn,
    },
}

type Client = ExecutorClient;

async fn client(conn: &Conn) -> anyhow::Result<Client> {
    Ok(ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE))
}

/// A JSON-object argument (`--input`, `--event`; `flag` names it in
/// errors): the object, or `@FILE` holding one.
pub(crate) fn object_arg(flag: &str, text: &str) -> anyhow::Result<prost_types::Struct> {
    let read = match text.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{flag} {text}: {e}"))?
        }
        None => text.to_owned(),
    };
    let v: serde_json::Value = serde_json::from_str(&read).map_err(|e| {
        anyhow::anyhow!("{flag} is not JSON ({e}); give an object, like '{{\"topic\": \"x\"}}'")
    })?;
    switchyard_kit::json::json_to_struct(&v)
        .ok_or_else(|| anyhow::anyhow!("{flag} must be a JSON object, like '{{\"topic\": \"x\"}}'"))
}

/// The document in `file`, or on standard input for `-`.
pub(crate) fn read(file: &Path) -> anyhow::Result<String> {
    if file == Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the job document from standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
}

/// Tasks that succeeded and tasks in all.
fn succeeded_of(j: &Job) -> (usize, usize) {
    let ok = j
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Succeeded as i32)
        .count();
    (ok, j.tasks.len())
}

/// When `j` was created, UTC to the second.
fn created(j: &Job) -> String {
    let ms = j
        .created_at
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms);
    let t = switchyard_kit::time::utc(ms);
    format!("{} {}", &t[..10], &t[11..19])
}

/// How long `j` ran: started to finished, or to `now_ms` while running
/// (`running 12.3 s`); `-` before it starts.
fn took(j: &Job, now_ms: u64) -> String {
    let ms = |t: &Option<prost_types::Timestamp>| {
        t.as_ref().map_or(0, switchyard_kit::time::timestamp_ms)
    };
    let (start, end) = (ms(&j.started_at), ms(&j.finished_at));
    match switchyard_kit::time::ran_for(start, end, now_ms) {
        Some(took) => took,
        None if end > 0 => "never started".into(),
        None => "-".into(),
    }
}

/// `3/5`: tasks that succeeded of all.
fn succeeded(j: &Job) -> String {
    let (ok, total) = succeeded_of(j);
    format!("{ok}/{total}")
}

/// What a person sees of progress: how many tasks succeeded, so a job that
/// failed early never reads "5/5 (100%)".
fn progress(j: &Job) -> String {
    let (ok, total) = succeeded_of(j);
    let percent = (ok * 100).checked_div(total).unwrap_or(0);
    format!("{ok}/{total} tasks succeeded ({percent}%)")
}

/// The line that says a job waits for a person, and what to run.
fn approval_hint(j: &Job) -> String {
    let by = if j.submitted_by.is_empty() {
        "the submitter".to_owned()
    } else {
        j.submitted_by.clone()
    };
    format!(
        "waiting for approval of run {run} by someone other than {by}: switchyard approval approve {run} --as <approver>  (or reject it: switchyard approval reject {run} -m why)",
        run = j.run_id
    )
}

/// What a budget pause asks for: `12,000 more tokens` or `$0.000040 more`.
fn extension_amount(p: &BudgetPause) -> String {
    match p.cost {
        Some(m) if m.micro_usd > 0 => format!("{} more", usd(m.micro_usd)),
        _ => format!("{} more tokens", p.tokens),
    }
}

/// The lines that say what a job's budget pause asks for, and what to run.
fn pause_line(j: &Job, p: &BudgetPause) -> String {
    let job_id = j.spec.as_ref().map_or("", |s| s.job_id.as_str());
    let head = format!(
        "paused     #{} by the {} of budget {}; extension run {} asks for {} to finish {}",
        p.number,
        p.dimension,
        p.refused_by,
        p.run_id,
        extension_amount(p),
        p.remaining_tasks.join(", ")
    );
    if j.state == JobState::BudgetPaused as i32 && p.decision == "pending" {
        format!(
            "{head}
           switchyard job resume {job_id} --as <approver>  (or end it: switchyard approval reject {job_id} -m why)"
        )
    } else {
        let by = if p.decided_by.is_empty() {
            String::new()
        } else {
            format!(" by {}", p.decided_by)
        };
        let granted = match (&p.granted_cost, p.granted_tokens) {
            (Some(m), _) if m.micro_usd > 0 => format!(": {} granted", usd(m.micro_usd)),
            (_, t) if t > 0 => format!(": {t} tokens granted"),
            _ => String::new(),
        };
        format!(
            "{head}
           extension {}{by}{granted}",
            p.decision.replace('_', " ")
        )
    }
}

/// A followed job's end as the exit-code rule wants it.
fn ended(j: &Job) -> anyhow::Result<()> {
    let state = job_state(j.state);
    if state == "completed" {
        return Ok(());
    }
    Err(crate::report::Stop::JobEnded {
        job_id: j
            .spec
            .as_ref()
            .map(|s| s.job_id.clone())
            .unwrap_or_default(),
        state,
        reason: j.reason.clone(),
        error: j.error.clone(),
    }
    .into())
}

fn attachments(paths: &[PathBuf]) -> anyhow::Result<std::collections::BTreeMap<String, Vec<u8>>> {
    let mut out = std::collections::BTreeMap::new();
    for p in paths {
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{} has no file name", p.display()))?
            .to_owned();
        let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        if out.insert(name.clone(), bytes).is_some() {
            anyhow::bail!("two attachments are named {name:?}");
        }
    }
    Ok(out)
}

/// A state's short name.
pub fn job_state(s: i32) -> String {
    short_name(
        JobState::try_from(s).ok().map(|s| s.as_str_name()),
        "JOB_STATE_",
    )
}

fn task_state(s: i32) -> String {
    short_name(
        TaskState::try_from(s).ok().map(|s| s.as_str_name()),
        "TASK_STATE_",
    )
}

fn parse_state(s: &str) -> anyhow::Result<i32> {
    JobState::from_str_name(&format!("JOB_STATE_{}", s.to_ascii_uppercase()))
        .filter(|s| *s != JobState::Unspecified)
        .map(|s| s as i32)
        .ok_or_else(|| anyhow::anyhow!("unknown state {s:?}; expected scheduled, available, pending, active, budget_paused, completed, retryable, cancelled or discarded"))
}

fn ms(t: &Option<prost_types::Timestamp>) -> Option<u64> {
    t.as_ref().map(switchyard_kit::time::timestamp_ms)
}

fn task_json(t: &TaskStatus) -> Value {
    json!({
        "task_id": t.task_id, "state": task_state(t.state), "reason": t.reason, "error": t.error,
        "agent_id": t.agent_id, "exit_code": t.exit_code,
        "started_at_ms": ms(&t.started_at), "finished_at_ms": ms(&t.finished_at),
        "attempts": t.attempts.iter().map(|a| json!({
            "number": a.number, "agent_id": a.agent_id, "error": a.error, "reason": a.reason,
            "started_at_ms": ms(&a.started_at), "finished_at_ms": ms(&a.finished_at)})).collect::<Vec<_>>(),
        "output": t.output.as_ref().map(switchyard_kit::json::struct_to_json),
        "stdout": String::from_utf8_lossy(&t.stdout), "stderr": String::from_utf8_lossy(&t.stderr),
        "output_truncated": t.output_truncated,
        "tokens_used": t.tokens_used, "cost_micro_usd": t.cost.map_or(0, |m| m.micro_usd),
        "model_used": t.model_used,
        "tool_results": t.tool_results.iter().map(|r| json!({
            "call_id": r.call_id, "name": r.name, "arguments": r.arguments,
            "result": r.result.as_ref().map(switchyard_kit::json::value_to_json),
            "error": r.error, "reason": r.reason, "turn": r.turn, "duration_ms": r.duration_ms})).collect::<Vec<_>>(),
        "llm_usage": t.llm_usage.map(|u| json!({
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "llm_calls": u.llm_calls, "turns": u.turns})),
        "child_job_ids": t.child_job_ids,
        "isolation": isolation(t.isolation), "isolation_detail": t.isolation_detail,
        "resource_limit": t.resource_limit,
    })
}

/// `TaskStatus.isolation` as a word ("" for tasks that ran no command).
fn isolation(i: i32) -> String {
    match Isolation::try_from(i) {
        Ok(Isolation::Unspecified) | Err(_) => String::new(),
        Ok(x) => short_name(Some(x.as_str_name()), "ISOLATION_"),
    }
}

/// A job as JSON.
pub fn job_json(j: &Job) -> Value {
    let s = j.spec.clone().unwrap_or_default();
    let p = j.progress.unwrap_or_default();
    json!({
        "job_id": s.job_id, "plan_id": s.plan_id, "plan_description": s.plan_description,
        "source_format": s.source_format, "correlation_id": s.correlation_id,
        "state": job_state(j.state), "reason": j.reason, "error": j.error,
        "progress": {"current_step": p.current_step, "total_steps": p.total_steps, "percent_complete": p.percent_complete},
        "cost_so_far_micro_usd": j.cost_so_far.map_or(0, |m| m.micro_usd), "tokens_used": j.tokens_used,
        "run_id": j.run_id, "budget_id": j.budget_id, "submitted_by": j.submitted_by,
        "rerun_of": j.rerun_of,
        "schedule_id": j.schedule_id,
        "schedule_tick": j.schedule_tick.as_ref().map(switchyard_kit::time::timestamp_ms),
        "created_at_ms": ms(&j.created_at), "started_at_ms": ms(&j.started_at), "finished_at_ms": ms(&j.finished_at),
        "last_sequence": j.last_sequence,
        "tasks": j.tasks.iter().map(task_json).collect::<Vec<_>>(),
        "budget_pause": j.budget_pause.as_ref().map(|b| json!({
            "run_id": b.run_id, "number": b.number, "dimension": b.dimension,
            "refused_by": b.refused_by, "message": b.message, "tokens": b.tokens,
            "cost_micro_usd": b.cost.map_or(0, |m| m.micro_usd),
            "remaining_tasks": b.remaining_tasks, "decide_by_ms": ms(&b.decide_by),
            "decision": b.decision, "decided_by": b.decided_by,
        })),
    })
}

fn event_json(e: &Event) -> Value {
    json!({
        "sequence": e.sequence, "time_ms": ms(&e.time), "kind": e.kind, "job_id": e.job_id,
        "task_id": e.task_id, "correlation_id": e.correlation_id,
        "data": e.data.as_ref().map(switchyard_kit::json::struct_to_json),
    })
}

/// Whether task `t`'s model answer stopped at its `max_tokens`.
fn cut_off(t: &TaskStatus) -> bool {
    t.output
        .as_ref()
        .and_then(|o| o.fields.get("finish_reason"))
        .and_then(|v| match &v.kind {
            Some(prost_types::value::Kind::StringValue(s)) => Some(s.as_str()),
            _ => None,
        })
        == Some("length")
}

fn duration(t: &TaskStatus) -> String {
    match (ms(&t.started_at), ms(&t.finished_at)) {
        (Some(a), Some(b)) => format!("{} ms", b.saturating_sub(a)),
        _ => String::new(),
    }
}

fn print_job(j: &Job) {
    let s = j.spec.clone().unwrap_or_default();
    println!(
        "job {}  ({}, plan {})",
        s.job_id, s.source_format, s.plan_id
    );
    println!(
        "state      {}{}",
        job_state(j.state),
        if j.reason.is_empty() {
            String::new()
        } else {
            format!(" ({}: {})", j.reason, j.error)
        }
    );
    println!("progress   {}", progress(j));
    println!(
        "cost       {}   tokens {}",
        usd(j.cost_so_far.map_or(0, |m| m.micro_usd)),
        j.tokens_used
    );
    println!(
        "approval   {}   budget {}   submitted by {}",
        j.run_id, j.budget_id, j.submitted_by
    );
    println!("correlation {}", s.correlation_id);
    if !j.schedule_id.is_empty() {
        println!(
            "schedule    {} (tick {})",
            j.schedule_id,
            switchyard_kit::time::utc(
                j.schedule_tick
                    .as_ref()
                    .map_or(0, switchyard_kit::time::timestamp_ms)
            )
        );
    }
    if !j.rerun_of.is_empty() {
        println!("runs again  job {}", j.rerun_of);
    }
    if let Some(p) = &j.budget_pause {
        println!("{}", pause_line(j, p));
    }
    println!();
    let rows: Vec<Vec<String>> = j
        .tasks
        .iter()
        .map(|t| {
            vec![
                t.task_id.clone(),
                task_state(t.state),
                t.attempts.len().to_string(),
                t.agent_id.clone(),
                t.exit_code.map(|c| c.to_string()).unwrap_or_default(),
                duration(t),
                if !t.reason.is_empty() {
                    format!("{}: {}", t.reason, t.error)
                } else if cut_off(t) {
                    "answer cut at max_tokens (finish_reason length)".to_owned()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    table(
        &[
            "TASK", "STATE", "ATTEMPTS", "AGENT", "EXIT", "TIME", "REASON",
        ],
        &rows,
    );
    // Command tasks: how they were isolated; an unconfined run stands out.
    let mut seen = std::collections::BTreeSet::new();
    for t in j.tasks.iter().filter(|t| t.isolation != 0) {
        if seen.insert((t.isolation, t.isolation_detail.clone())) {
            let label = if t.isolation == Isolation::Off as i32 {
                "WARNING: commands ran WITHOUT the sandbox"
            } else {
                "commands sandboxed"
            };
            println!();
            println!("{label}: {}", t.isolation_detail);
        }
    }
    // LLM tasks: the model that answered, usage and every tool call.
    for t in j.tasks.iter().filter(|t| !t.model_used.is_empty()) {
        let u = t.llm_usage.unwrap_or_default();
        println!();
        println!(
            "{}: model {}  {} calls, {} turns, {} prompt + {} completion tokens",
            t.task_id, t.model_used, u.llm_calls, u.turns, u.prompt_tokens, u.completion_tokens
        );
        for r in &t.tool_results {
            let outcome = if r.error.is_empty() {
                "ok".to_owned()
            } else {
                format!("{}: {}", r.reason, r.error)
            };
            println!(
                "  turn {} {}({}) {} ms  {outcome}",
                r.turn, r.name, r.arguments, r.duration_ms
            );
        }
        for c in &t.child_job_ids {
            println!("  delegated job {c}");
        }
    }
}

fn show(format: Format, j: &Job) {
    match format {
        Format::Json => print_json(&job_json(j)),
        Format::Table => print_job(j),
    }
}

fn bar(t: &TaskStatus, percent: Option<u32>) -> String {
    const W: usize = 20;
    let fill = match TaskState::try_from(t.state) {
        Ok(TaskState::Succeeded) => W,
        Ok(TaskState::Running) => percent.map_or(W / 2, |p| (p as usize * W / 100).min(W - 1)),
        Ok(TaskState::Failed | TaskState::Skipped | TaskState::Cancelled) => 0,
        _ => 0,
    };
    format!("[{}{}]", "#".repeat(fill), "-".repeat(W - fill))
}

/// Renders the live view: a bar per task, step, cost, approval prompt.
fn render(
    j: &Job,
    percents: &std::collections::HashMap<String, u32>,
    streamed: &std::collections::HashMap<String, String>,
    lines_before: usize,
    tty: bool,
) -> usize {
    let s = j.spec.clone().unwrap_or_default();
    let mut out = Vec::new();
    out.push(format!(
        "job {}  {}  {}  cost {}  tokens {}",
        s.job_id,
        job_state(j.state),
        progress(j),
        usd(j.cost_so_far.map_or(0, |m| m.micro_usd)),
        j.tokens_used
    ));
    if JobState::try_from(j.state) == Ok(JobState::Pending) && !j.run_id.is_empty() {
        out.push(format!("  {}", approval_hint(j)));
    }
    let width = j.tasks.iter().map(|t| t.task_id.len()).max().unwrap_or(4);
    for t in &j.tasks {
        let detail = if !t.error.is_empty() {
            format!("  {}: {}", t.reason, t.error)
        } else if !t.agent_id.is_empty() {
            format!("  {}", t.agent_id)
        } else {
            String::new()
        };
        let detail: String = detail.chars().take(100).collect();
        out.push(format!(
            "  {:<width$} {} {:<9}{}",
            t.task_id,
            bar(t, percents.get(&t.task_id).copied()),
            task_state(t.state),
            detail
        ));
        // The tail of the model's streamed answer, while the task runs.
        if let Some(text) = streamed.get(&t.task_id)
            && TaskState::try_from(t.state) == Ok(TaskState::Running)
        {
            out.push(format!("  {:<width$} > {}", "", tail(text, 100)));
        }
    }
    if tty && lines_before > 0 {
        // Move up and clear the previous view.
        print!("\x1b[{lines_before}A\x1b[J");
    }
    for l in &out {
        println!("{l}");
    }
    out.len()
}

/// The last `n` characters of `text` on one line.
fn tail(text: &str, n: usize) -> String {
    let one: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let skip = one.chars().count().saturating_sub(n);
    one.chars().skip(skip).collect()
}

/// Where the text of a streamed answer is being printed (no terminal):
/// the task and turn whose line is open.
#[derive(Default)]
struct Open(Option<(String, u64)>);

impl Open {
    /// Ends the open line, before anything else is printed.
    fn close(&mut self) {
        if self.0.take().is_some() {
            println!();
        }
    }

    /// Prints a piece of task `task`'s answer for turn `turn`.
    fn piece(&mut self, task: &str, turn: u64, data: &Value) {
        use std::io::Write;
        let at = (task.to_owned(), turn);
        if self.0.as_ref() != Some(&at) {
            self.close();
            print!("task {task} turn {turn}: ");
            self.0 = Some(at);
        }
        print!("{}", data["text"].as_str().unwrap_or_default());
        for t in data["tool_calls"].as_array().into_iter().flatten() {
            if let Some(name) = t["name"].as_str().filter(|n| !n.is_empty()) {
                print!("\n  calls {name} ");
            }
            print!("{}", t["arguments"].as_str().unwrap_or_default());
        }
        let _ = std::io::stdout().flush();
    }
}

async fn get(c: &Client, job_id: &str) -> anyhow::Result<Job> {
    Ok(c.get_job(GetJobRequest {
        job_id: job_id.into(),
    })
    .await
    .map_err(api)?
    .job
    .unwrap_or_default())
}

/// An event's time of day, UTC to the millisecond (`14:38:05.123Z`), for
/// `job watch` lines.
fn stamp(e: &Event) -> String {
    let t = switchyard_kit::time::utc(
        e.time
            .as_ref()
            .map_or(0, switchyard_kit::time::timestamp_ms),
    );
    t[11..].to_owned()
}

/// Follows a job until it finishes; returns it.
async fn follow(
    c: &Client,
    job_id: &str,
    after: u64,
    raw: bool,
    format: Format,
) -> anyhow::Result<Job> {
    let mut stream = c
        .watch_job(WatchJobRequest {
            job_id: job_id.into(),
            after_sequence: after,
            ..Default::default()
        })
        .await
        .map_err(api)?;
    // Ctrl-C is caught from here on (before anything is printed, so a
    // person reacting to the first line is never met by the default
    // handler): the job goes on, and the CLI says how to find it again.
    let mut interrupted = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("listening for Ctrl-C")?;
    let tty = std::io::stdout().is_terminal() && format == Format::Table && !raw;
    let mut percents = std::collections::HashMap::new();
    let mut streamed: std::collections::HashMap<String, String> = Default::default();
    let mut open = Open::default();
    let mut lines = 0;
    let mut last_state = String::new();
    let mut shown = Job::default();
    // When each task (or the job, under "") last started running, ms.
    let mut since: std::collections::HashMap<String, u64> = Default::default();
    if tty {
        shown = get(c, job_id).await?;
        lines = render(&shown, &percents, &streamed, 0, tty);
        last_state = job_state(shown.state);
    } else if format == Format::Table && !raw {
        // A job already waiting for a person says so at once, not only
        // when its state next changes.
        let j = get(c, job_id).await?;
        last_state = job_state(j.state);
        if last_state == "pending" && !j.run_id.is_empty() {
            println!("{}", approval_hint(&j));
        }
    }
    loop {
        let msg = tokio::select! {
            msg = stream.next() => msg,
            _ = interrupted.recv() => {
                open.close();
                return Err(crate::report::Stop::Interrupted { job_id: job_id.to_owned() }.into());
            }
        };
        let Some(msg) = msg else { break };
        let e = msg.map_err(api)?.event.unwrap_or_default();
        if raw || format == Format::Json {
            if format == Format::Json {
                println!("{}", event_json(&e));
            } else {
                let data = e
                    .data
                    .as_ref()
                    .map(switchyard_kit::json::struct_to_json)
                    .unwrap_or(Value::Null);
                println!(
                    "{:>4} {} {:<18} {:<10} {}",
                    e.sequence,
                    stamp(&e),
                    e.kind,
                    e.task_id,
                    data
                );
            }
            continue;
        }
        if e.kind == "agent.progress"
            && let Some(p) = e
                .data
                .as_ref()
                .and_then(|d| d.fields.get("percent"))
                .and_then(|v| match v.kind {
                    Some(prost_types::value::Kind::NumberValue(n)) => Some(n as u32),
                    _ => None,
                })
        {
            percents.insert(e.task_id.clone(), p);
        }
        // The model's answer as it arrives.
        if e.kind == "llm.delta" {
            let data = e
                .data
                .as_ref()
                .map(switchyard_kit::json::struct_to_json)
                .unwrap_or(Value::Null);
            if tty {
                let text = streamed.entry(e.task_id.clone()).or_default();
                text.push_str(data["text"].as_str().unwrap_or_default());
                let keep = text.len().saturating_sub(400);
                if keep > 0 && text.is_char_boundary(keep) {
                    text.drain(..keep);
                }
                lines = render(&shown, &percents, &streamed, lines, tty);
            } else {
                open.piece(&e.task_id, data["turn"].as_u64().unwrap_or(0), &data);
            }
            continue;
        }
        if !tty {
            open.close();
        }
        // A service this job needs went away or came back.
        if !tty && e.kind.starts_with("dependency.") {
            let field = |k: &str| {
                e.data
                    .as_ref()
                    .and_then(|d| d.fields.get(k))
                    .map(switchyard_kit::json::value_to_json)
                    .unwrap_or(Value::Null)
            };
            let whose = if e.task_id.is_empty() {
                "job".to_owned()
            } else {
                format!("task {}", e.task_id)
            };
            let service = field("service");
            let service = service
                .as_str()
                .filter(|s| !s.is_empty())
                .unwrap_or("its services");
            if e.kind == "dependency.waiting" {
                println!(
                    "{} {whose} waits for {service}: {}",
                    stamp(&e),
                    field("error").as_str().unwrap_or_default()
                );
            } else {
                println!(
                    "{} {whose}: {service} is back after {} ms",
                    stamp(&e),
                    field("waited_ms")
                );
            }
        }
        // Redraw on changes that the view shows.
        if !matches!(
            e.kind.as_str(),
            "job.state"
                | "task.state"
                | "agent.progress"
                | "budget.committed"
                | "approval.decided"
                | "dependency.waiting"
                | "dependency.recovered"
        ) {
            continue;
        }
        let j = get(c, job_id).await?;
        if tty {
            lines = render(&j, &percents, &streamed, lines, tty);
            shown = j.clone();
        } else if e.kind == "job.state" || e.kind == "task.state" {
            let to = e
                .data
                .as_ref()
                .and_then(|d| d.fields.get("to"))
                .map(switchyard_kit::json::value_to_json)
                .unwrap_or(Value::Null);
            let what = if e.task_id.is_empty() {
                "job".to_owned()
            } else {
                format!("task {}", e.task_id)
            };
            let to = to.as_str().unwrap_or_default();
            let at = e
                .time
                .as_ref()
                .map_or(0, switchyard_kit::time::timestamp_ms);
            // How long it was running, once it stops.
            let took = match to {
                "running" | "active" => {
                    since.insert(e.task_id.clone(), at);
                    String::new()
                }
                _ => since
                    .remove(&e.task_id)
                    .map(|s| {
                        format!(
                            " after {}",
                            switchyard_kit::time::human_duration(at.saturating_sub(s))
                        )
                    })
                    .unwrap_or_default(),
            };
            println!("{} {what} -> {to}{took}", stamp(&e));
            let now = job_state(j.state);
            if now != last_state && now == "pending" && !j.run_id.is_empty() {
                println!("{}", approval_hint(&j));
            }
            if now != last_state
                && now == "budget_paused"
                && let Some(p) = &j.budget_pause
            {
                println!("{}", pause_line(&j, p));
            }
            last_state = now;
        }
    }
    open.close();
    let j = get(c, job_id).await?;
    if !tty && !raw && format == Format::Table {
        render(&j, &percents, &streamed, 0, false);
    }
    Ok(j)
}

/// SubmitJob of the document in `file` with its attachments (`job submit`,
/// `job run`), waiting up to `wait` for its end when given.
async fn submit_file(
    c: &Client,
    file: &std::path::Path,
    attach: &[PathBuf],
    format: Option<String>,
    wait: Option<std::time::Duration>,
) -> anyhow::Result<switchyard_proto::executor::v1::SubmitJobResponse> {
    let req = SubmitJobRequest {
        spec: None,
        document: read(file)?,
        files: attachments(attach)?,
        format: format.unwrap_or_default(),
        wait: wait.map(|w| switchyard_kit::time::duration(w.as_millis() as u64)),
        invocation_grant: String::new(),
    };
    c.submit_job(req).await.map_err(api)
}

/// Runs a job command.
pub async fn run(cmd: JobCmd) -> anyhow::Result<()> {
    match cmd {
        JobCmd::Submit {
            file,
            attach,
            watch,
            format,
            conn,
        } => {
            let c = client(&conn).await?;
            let out = submit_file(&c, &file, &attach, format, None).await?;
            let j = out.job.unwrap_or_default();
            let id = j
                .spec
                .as_ref()
                .map(|s| s.job_id.clone())
                .unwrap_or_default();
            if !watch {
                match conn.output {
                    Format::Json => {
                        print_json(&json!({"job": job_json(&j), "created": out.created}))
                    }
                    Format::Table => println!(
                        "{} job {id} ({}): {}",
                        if out.created {
                            "submitted"
                        } else {
                            "already submitted"
                        },
                        j.spec
                            .as_ref()
                            .map(|s| s.source_format.clone())
                            .unwrap_or_default(),
                        job_state(j.state)
                    ),
                }
                return Ok(());
            }
            if conn.output == Format::Table {
                println!("submitted job {id}");
            }
            let j = follow(&c, &id, 0, false, conn.output).await?;
            ended(&j)
        }
        JobCmd::Rerun {
            id,
            resume,
            input,
            new_id,
            watch,
            conn,
        } => {
            let input = input.map(|i| object_arg("--input", &i)).transpose()?;
            let c = client(&conn).await?;
            let out = c
                .rerun_job(RerunJobRequest {
                    job_id: id.clone(),
                    resume,
                    input,
                    new_job_id: new_id.unwrap_or_default(),
                })
                .await
                .map_err(api)?;
            let j = out.job.clone().unwrap_or_default();
            let new = j
                .spec
                .as_ref()
                .map(|s| s.job_id.clone())
                .unwrap_or_default();
            let how = if resume { "resumed" } else { "re-ran" };
            match conn.output {
                Format::Json if !watch => print_json(&json!({
                    "job": job_json(&j),
                    "created": out.created,
                    "rerun_of": id,
                    "reused_tasks": out.reused_tasks,
                })),
                Format::Json => {}
                Format::Table => {
                    println!(
                        "{how} job {id} as job {new}: {}{}",
                        job_state(j.state),
                        if out.reused_tasks.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; kept {} (their outputs reused, not run again)",
                                out.reused_tasks.join(", ")
                            )
                        }
                    );
                }
            }
            if !watch {
                return Ok(());
            }
            let j = follow(&c, &new, 0, false, conn.output).await?;
            ended(&j)
        }
        JobCmd::Validate { file, format, conn } => {
            let c = client(&conn).await?;
            let v = c
                .validate_job(ValidateJobRequest {
                    spec: None,
                    document: read(&file)?,
                    format: format.unwrap_or_default(),
                })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({
                    "source_format": v.source_format, "order": v.order, "context_hash": v.context_hash,
                    "estimated_micro_usd": v.estimated_cost.map(|m| m.micro_usd), "estimated_tokens": v.estimated_tokens,
                    "routes": v.routes.iter().map(|r| json!({"task_id": r.task_id, "agent_id": r.agent_id, "score": r.score})).collect::<Vec<_>>(),
                    "warnings": v.warnings,
                    "policies": v.policies.iter().map(crate::approval::policy_json).collect::<Vec<_>>(),
                })),
                Format::Table => {
                    println!("valid {} job", v.source_format);
                    for w in &v.warnings {
                        println!("warning        {w}");
                    }
                    for p in &v.policies {
                        println!(
                            "policy         {} {}: {}",
                            p.action,
                            crate::policy::decided_on(p),
                            p.explanation
                        );
                    }
                    println!("order          {}", v.order.join(" -> "));
                    println!(
                        "worst case     {}, {} tokens",
                        v.estimated_cost
                            .map_or("unknown (needs a person to approve)".into(), |m| usd(
                                m.micro_usd
                            )),
                        v.estimated_tokens
                    );
                    println!("context hash   {}", v.context_hash);
                    if !v.routes.is_empty() {
                        println!();
                        let rows: Vec<Vec<String>> = v
                            .routes
                            .iter()
                            .map(|r| {
                                vec![
                                    r.task_id.clone(),
                                    if r.agent_id.is_empty() {
                                        "(no agent now)".into()
                                    } else {
                                        r.agent_id.clone()
                                    },
                                    format!("{:.3}", r.score),
                                ]
                            })
                            .collect();
                        table(&["TASK", "AGENT", "SCORE"], &rows);
                    }
                }
            }
            Ok(())
        }
        JobCmd::Explain { id, conn } => {
            let c = client(&conn).await?;
            let x = c
                .explain_job(switchyard_proto::executor::v1::ExplainJobRequest { job_id: id })
                .await
                .map_err(api)?;
            explained(conn.output, &x);
            Ok(())
        }
        JobCmd::Get { id, conn } => {
            let c = client(&conn).await?;
            let j = get(&c, &id).await?;
            show(conn.output, &j);
            Ok(())
        }
        JobCmd::List {
            state,
            plan,
            since,
            until,
            submitter,
            labels,
            limit,
            dead_letter,
            conn,
        } => {
            let states = state
                .iter()
                .map(|s| parse_state(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let now = switchyard_kit::time::now_ms();
            let created_after = since.map(switchyard_kit::time::timestamp);
            let created_before = until.map(switchyard_kit::time::timestamp);
            let c = client(&conn).await?;
            let l = c
                .list_jobs(ListJobsRequest {
                    states,
                    plan_id: plan.unwrap_or_default(),
                    page_size: limit,
                    dead_letter,
                    submitted_by: submitter.unwrap_or_default(),
                    created_after,
                    created_before,
                    labels: labels.into_iter().collect(),
                    ..Default::default()
                })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => {
                    print_list(l.jobs.iter().map(job_json).collect(), &l.next_page_token)
                }
                Format::Table => {
                    let rows: Vec<Vec<String>> = l
                        .jobs
                        .iter()
                        .map(|j| {
                            let s = j.spec.clone().unwrap_or_default();
                            vec![
                                s.job_id,
                                job_state(j.state),
                                succeeded(j),
                                created(j),
                                took(j, now),
                                usd(j.cost_so_far.map_or(0, |m| m.micro_usd)),
                                j.submitted_by.clone(),
                                s.plan_id,
                            ]
                        })
                        .collect();
                    table(
                        &[
                            "JOB",
                            "STATE",
                            "SUCCEEDED",
                            "CREATED (UTC)",
                            "DURATION",
                            "COST",
                            "SUBMITTER",
                            "PLAN",
                        ],
                        &rows,
                    );
                }
            }
            Ok(())
        }
        JobCmd::Watch {
            id,
            after,
            events,
            conn,
        } => {
            let c = client(&conn).await?;
            let j = follow(&c, &id, after, events, conn.output).await?;
            ended(&j)
        }
        JobCmd::Run {
            file,
            attach,
            format,
            wait,
            conn,
        } => {
            let c = client(&conn).await?;
            let waited = std::time::Duration::from_secs(wait);
            let deadline = tokio::time::Instant::now() + waited;
            let out = submit_file(&c, &file, &attach, format, Some(waited)).await?;
            let id = out
                .job
                .as_ref()
                .and_then(|j| j.spec.as_ref())
                .map(|s| s.job_id.clone())
                .unwrap_or_default();
            let r = match out.result {
                Some(r) => r,
                None => result_by(&c, &id, deadline).await?,
            };
            show_result(&r, conn.output);
            result_ended(&r, wait)
        }
        JobCmd::Artifacts { id, out, conn } => {
            let c = client(&conn).await?;
            let list = c
                .list_artifacts(switchyard_proto::executor::v1::ListArtifactsRequest {
                    job_id: id.clone(),
                })
                .await
                .map_err(api)?
                .artifacts;
            let fetch = |artifact: String| {
                let (c, id) = (c.clone(), id.clone());
                async move {
                    let req = switchyard_proto::executor::v1::GetArtifactRequest {
                        job_id: id,
                        artifact,
                    };
                    Ok(c.get_artifact(req).await.map_err(api)?.content)
                }
            };
            crate::output::artifacts(&list, out.as_deref(), conn.output, fetch).await
        }
        JobCmd::Result { id, wait, conn } => {
            let c = client(&conn).await?;
            let r = match wait {
                Some(secs) => {
                    let deadline =
                        tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
                    result_by(&c, &id, deadline).await?
                }
                None => c
                    .get_result(GetResultRequest {
                        job_id: id,
                        wait: None,
                    })
                    .await
                    .map_err(api)?,
            };
            show_result(&r, conn.output);
            match wait {
                Some(secs) => result_ended(&r, secs),
                None => Ok(()),
            }
        }
        JobCmd::Retry { id, conn } => {
            let c = client(&conn).await?;
            let req = RetryDeadLetterRequest { job_id: id };
            shown(
                conn.output,
                c.retry_dead_letter(req).await.map_err(api)?.job,
            )
        }
        JobCmd::Delete { id, conn } => {
            let c = client(&conn).await?;
            let out = c
                .delete_dead_letter(DeleteDeadLetterRequest { job_id: id })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({"deleted": true, "job_id": out.job_id})),
                Format::Table => println!("deleted job {}", out.job_id),
            }
            Ok(())
        }
        JobCmd::Input {
            id,
            task,
            file,
            answer,
            key,
            conn,
        } => {
            let text = match (file, answer) {
                (Some(f), _) => read(&f)?,
                (None, Some(a)) => a,
                (None, None) => anyhow::bail!(
                    "give the answer: -f FILE (JSON; - for standard input) or --answer JSON"
                ),
            };
            let value = switchyard_kit::json::json_or_text(&text);
            let key = if key.is_empty() {
                format!("cli-{}", uuid::Uuid::now_v7())
            } else {
                key
            };
            let c = client(&conn).await?;
            let req = SendInputRequest {
                job_id: id,
                task_id: task,
                answer: Some(switchyard_kit::json::json_to_value(&value)),
                idempotency_key: key,
            };
            let out = c.send_input(req).await.map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({
                    "task_id": out.task_id,
                    "answered_by": out.answered_by,
                    "replayed": out.replayed,
                    "job": out.job.as_ref().map(job_json),
                })),
                Format::Table => {
                    let again = if out.replayed { " (already taken)" } else { "" };
                    println!(
                        "answered task {} as {}{again}",
                        out.task_id, out.answered_by
                    );
                    if let Some(j) = &out.job {
                        show(Format::Table, j);
                    }
                }
            }
            Ok(())
        }
        JobCmd::Inputs { job, conn } => {
            let c = client(&conn).await?;
            let out = c
                .list_input_requests(ListInputRequestsRequest { job_id: job })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({
                    "requests": out.requests.iter().map(|r| json!({
                        "job_id": r.job_id,
                        "task_id": r.task_id,
                        "prompt": r.prompt,
                        "answer_schema": r.answer_schema.as_ref().map(switchyard_kit::json::struct_to_json),
                        "asked_at_ms": ms(&r.asked_at),
                        "deadline_ms": ms(&r.deadline),
                        "submitted_by": r.submitted_by,
                    })).collect::<Vec<_>>(),
                })),
                Format::Table => {
                    if out.requests.is_empty() {
                        println!("nothing waits for your input");
                    }
                    let now = switchyard_kit::time::now_ms();
                    for r in &out.requests {
                        let left = ms(&r.deadline).unwrap_or(now).saturating_sub(now) / 1000;
                        println!(
                            "{} {}  from {}, {left} s left\n  {}",
                            r.job_id, r.task_id, r.submitted_by, r.prompt
                        );
                    }
                }
            }
            Ok(())
        }
        JobCmd::Resume {
            id,
            comment,
            up_to,
            tokens,
            approval_url,
            conn,
        } => {
            let scope = (up_to.is_some() || tokens.is_some()).then(|| {
                switchyard_proto::approval::v1::ApprovalScope {
                    tokens: tokens.unwrap_or(0),
                    cost: up_to.map(|micro_usd| switchyard_proto::common::v1::Money { micro_usd }),
                    until: None,
                }
            });
            resume(&conn, &id, comment, scope, approval_url.as_deref()).await
        }
        JobCmd::Cancel { id, reason, conn } => {
            let c = client(&conn).await?;
            let req = CancelJobRequest { job_id: id, reason };
            shown(conn.output, c.cancel_job(req).await.map_err(api)?.job)
        }
    }
}

/// `job resume`: approves the extension a budget-paused job asks for.
async fn resume(
    conn: &Conn,
    job_id: &str,
    comment: String,
    scope: Option<switchyard_proto::approval::v1::ApprovalScope>,
    approval_url: Option<&str>,
) -> anyhow::Result<()> {
    let c = client(conn).await?;
    let j = get(&c, job_id).await?;
    let state = job_state(j.state);
    let pause = j
        .budget_pause
        .as_ref()
        .filter(|p| j.state == JobState::BudgetPaused as i32 && p.decision == "pending");
    let Some(p) = pause else {
        let what = if state == "retryable" {
            "it was stopped by its budget under an earlier release, which could not pause it: submit it again"
        } else {
            "nothing to resume"
        };
        anyhow::bail!("job {job_id} is {state}, not paused by its budget: {what}");
    };
    let approval = crate::publish::at(conn, &conn.channel().await?, approval_url).await?;
    let approval = switchyard_api::ApprovalClient::remote(approval, MAX_MESSAGE);
    let req = switchyard_proto::approval::v1::ApproveRequest {
        run_id: p.run_id.clone(),
        comment,
        edit: None,
        scope,
    };
    let run = approval
        .approve(req)
        .await
        .map_err(api)?
        .run
        .unwrap_or_default();
    if run.status == switchyard_proto::approval::v1::RunStatus::Proposed as i32 {
        println!(
            "approval of extension run {} recorded; a second, different approver is needed before job {job_id} goes on",
            p.run_id
        );
    } else {
        let granted = match &run.scope {
            Some(s) => {
                let money = s.cost.map_or(0, |m| m.micro_usd);
                if money > 0 && p.cost.is_some_and(|c| c.micro_usd > 0) {
                    format!("{} more", usd(money))
                } else {
                    format!("{} more tokens", s.tokens)
                }
            }
            None => extension_amount(p),
        };
        println!(
            "approved extension run {} of job {job_id}: its budget grows by {granted} and it goes on where it stopped (switchyard job watch {job_id})",
            p.run_id,
        );
    }
    Ok(())
}

/// Prints the job an answer carries (`job cancel`, `job retry`).
fn shown(output: Format, job: Option<Job>) -> anyhow::Result<()> {
    show(output, &job.unwrap_or_default());
    Ok(())
}

/// Prints a GetResult answer (`job result`, `job run`).
fn show_result(r: &GetResultResponse, output: Format) {
    let result = r
        .result
        .as_ref()
        .map(switchyard_kit::json::value_to_json)
        .unwrap_or(Value::Null);
    match output {
        Format::Json => print_json(&json!({
            "job_id": r.job_id, "state": job_state(r.state), "reason": r.reason, "error": r.error,
            "result": result, "cost_micro_usd": r.cost.map_or(0, |m| m.micro_usd), "tokens_used": r.tokens_used,
            "execution_time_ms": r.execution_time_ms, "tasks": r.tasks.iter().map(task_json).collect::<Vec<_>>(),
        })),
        Format::Table => {
            println!(
                "job {}: {} in {} ms, cost {}, {} tokens",
                r.job_id,
                job_state(r.state),
                r.execution_time_ms,
                usd(r.cost.map_or(0, |m| m.micro_usd)),
                r.tokens_used
            );
            if !r.error.is_empty() {
                println!("{}: {}", r.reason, r.error);
            }
            for t in &r.tasks {
                println!("\n== {} ({})", t.task_id, task_state(t.state));
                if !t.stdout.is_empty() {
                    print!("{}", String::from_utf8_lossy(&t.stdout));
                }
                if !t.stderr.is_empty() {
                    println!(
                        "-- stderr --\n{}",
                        String::from_utf8_lossy(&t.stderr).trim_end()
                    );
                }
                if let Some(o) = &t.output
                    && !o.fields.is_empty()
                    && t.exit_code.is_none()
                {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&switchyard_kit::json::struct_to_json(o))
                            .unwrap_or_default()
                    );
                }
                if !t.error.is_empty() {
                    println!("{}: {}", t.reason, t.error);
                }
            }
        }
    }
}

/// Polls nothing: waits with GetResult's `wait` (the server cuts each wait
/// to its request limit) until `job_id` ends or `deadline` passes; the
/// result as it is then.
async fn result_by(
    c: &Client,
    job_id: &str,
    deadline: tokio::time::Instant,
) -> anyhow::Result<GetResultResponse> {
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let r = c
            .get_result(GetResultRequest {
                job_id: job_id.into(),
                wait: Some(switchyard_kit::time::duration(left.as_millis() as u64)),
            })
            .await
            .map_err(api)?;
        if is_final(r.state) || left.is_zero() {
            return Ok(r);
        }
    }
}

/// The exit of `job run` and `job result --wait`: 0 completed, 3 ended
/// otherwise, 4 still running after `waited_secs`.
fn result_ended(r: &GetResultResponse, waited_secs: u64) -> anyhow::Result<()> {
    let state = job_state(r.state);
    if state == "completed" {
        return Ok(());
    }
    if !is_final(r.state) {
        return Err(crate::report::Stop::StillRunning {
            job_id: r.job_id.clone(),
            state,
            waited_secs,
        }
        .into());
    }
    Err(crate::report::Stop::JobEnded {
        job_id: r.job_id.clone(),
        state,
        reason: r.reason.clone(),
        error: r.error.clone(),
    }
    .into())
}

fn is_final(state: i32) -> bool {
    use switchyard_proto::executor::v1::JobState as S;
    matches!(
        S::try_from(state).unwrap_or(S::Unspecified),
        S::Completed | S::Cancelled | S::Discarded
    )
}

/// `job explain`'s output: the story, then what it cost.
fn explained(output: Format, x: &switchyard_proto::executor::v1::ExplainJobResponse) {
    use switchyard_kit::money::usd_compact;
    use switchyard_kit::time::{human_duration, timestamp_ms, utc};
    let shares = |v: &[switchyard_proto::executor::v1::CostShare]| {
        v.iter()
            .map(|s| {
                json!({"name": s.name, "cost_micro_usd": s.cost_micro_usd,
                       "tokens": s.tokens, "calls": s.calls})
            })
            .collect::<Vec<_>>()
    };
    if output == Format::Json {
        print_json(&json!({
            "job_id": x.job_id,
            "state": x.state,
            "duration_ms": x.duration_ms,
            "spent_micro_usd": x.spent_micro_usd,
            "approved_micro_usd": x.approved_micro_usd,
            "journal": x.journal,
            "lines": x.lines.iter().map(|l| json!({
                "time": l.time.as_ref().map(|t| utc(timestamp_ms(t))),
                "offset_ms": l.offset_ms, "task_id": l.task_id, "topic": l.topic,
                "text": l.text, "sequence": l.sequence,
            })).collect::<Vec<_>>(),
            "by_task": shares(&x.by_task),
            "by_agent": shares(&x.by_agent),
            "by_model": shares(&x.by_model),
        }));
        return;
    }
    println!(
        "job {}: {} after {}; spent {}{}",
        x.job_id,
        x.state,
        human_duration(x.duration_ms),
        usd_compact(x.spent_micro_usd),
        if x.approved_micro_usd > 0 {
            format!(" of {} approved", usd_compact(x.approved_micro_usd))
        } else {
            String::new()
        }
    );
    println!("journal: {}", x.journal);
    println!();
    for l in &x.lines {
        let at = l.time.as_ref().map_or(0, timestamp_ms);
        println!(
            "{}  +{:<9} {:<11} {}",
            &utc(at)[11..],
            human_duration(l.offset_ms),
            l.topic,
            l.text
        );
    }
    for (what, v) in [
        ("step", &x.by_task),
        ("agent", &x.by_agent),
        ("model", &x.by_model),
    ] {
        if v.is_empty() {
            continue;
        }
        let parts: Vec<String> = v
            .iter()
            .map(|s| {
                format!(
                    "{} {} ({} token{}, {} call{})",
                    s.name,
                    usd_compact(s.cost_micro_usd),
                    s.tokens,
                    if s.tokens == 1 { "" } else { "s" },
                    s.calls,
                    if s.calls == 1 { "" } else { "s" }
                )
            })
            .collect();
        println!("by {what}: {}", parts.join("; "));
    }
}
