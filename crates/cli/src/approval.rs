//! `switchyard approval ...`: review runs, decide, and manual mode.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Value, json};
use switchyard_api::ApprovalClient;
use switchyard_kit::error::ApiError;
use switchyard_proto::approval::v1::*;
use switchyard_proto::common::v1::Money;

use crate::client::{Conn, Files, MAX_MESSAGE, api};
use crate::files::RunFile;
use crate::output::{Format, print_json, print_list, short_name, table, usd};

/// `switchyard approval ...`
#[derive(Subcommand, Debug)]
pub enum ApprovalCmd {
    /// Propose runs from AgentRunSpec files (JSON or YAML).
    Propose {
        #[command(flatten)]
        files: Files,
        #[command(flatten)]
        conn: Conn,
    },
    /// List runs: pending ones first, with their cost estimates.
    List {
        /// Only these statuses, comma-separated (proposed, approved, running, ...).
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        /// Only runs for this org.
        #[arg(long)]
        org: Option<String>,
        /// Only runs by this creator.
        #[arg(long)]
        created_by: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a run and its audit trail.
    Show {
        /// Run id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Approve a proposed (or failed) run, named by its id or its job's id;
    /// the approver must not be its creator.
    Approve(Decision),
    /// Reject a proposed run.
    Reject(Decision),
    /// Cancel a run.
    Cancel(Decision),
    /// Write an approved run's prompt bundle (manual mode).
    Bundle {
        /// Run id.
        id: String,
        /// File to write (stdout when omitted).
        #[arg(long = "out")]
        out: Option<PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Complete an approved run with a result produced from its bundle.
    Import {
        /// Run id.
        id: String,
        /// File holding the result.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The context hash from the bundle.
        #[arg(long)]
        context_hash: String,
        /// Kind of artifact the result is kept as (file, changeset_bundle,
        /// draft_pr, issue_comment, test_plan); the run's outputs_allowed
        /// must allow it.
        #[arg(long, default_value = "file")]
        kind: String,
        /// File name of that artifact (default: the file's own name).
        #[arg(long)]
        name: Option<String>,
        /// Its media type (default text/markdown).
        #[arg(long)]
        media_type: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print the signed receipt of a run's approval (JSON; save it to keep
    /// proof of who approved what, when, within which scope).
    Receipt {
        /// Run id, or the id of the job whose run it is.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Check a receipt offline: its Ed25519 signature, and with --key that
    /// it was signed by your deployment's key (`approval receipt` shows it).
    /// Exits 1 when it does not hold.
    Verify {
        /// The receipt file (`-`: standard input).
        file: PathBuf,
        /// The deployment's public key (base64) it must be signed with.
        #[arg(long)]
        key: Option<String>,
    },
    /// List a run's artifacts; with --out, download them byte for byte.
    Artifacts {
        /// Run id.
        id: String,
        /// Write each artifact to DIR/<path>.
        #[arg(long = "out", value_name = "DIR")]
        out: Option<PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
}

/// A person's decision on a run.
#[derive(clap::Args, Debug)]
pub struct Decision {
    /// Run id, or the id of the job whose run it is.
    id: String,
    /// Comment for the audit log (with --break-glass: the required reason).
    #[arg(short = 'm', long, default_value = "")]
    comment: String,
    /// Approve as the audited override (admins only): no approver role,
    /// separation of duties or second approver needed; -m gives the reason.
    #[arg(long)]
    break_glass: bool,
    /// Approve a gated tool call changed: run this tool instead (one the
    /// task offers). An edit to a tool that needs approval waits for a
    /// decision of its own, which you may not take.
    #[arg(long, conflicts_with = "break_glass")]
    edit_tool: Option<String>,
    /// Approve a gated tool call changed: with these arguments (a JSON
    /// object). The model is told what you changed.
    #[arg(long, conflicts_with = "break_glass")]
    edit_args: Option<String>,
    /// Approve a job up to a scope (the amounts its estimate gives, unless
    /// --up-to/--tokens/--for say otherwise): the money is held on the
    /// job's budget chain at once, and the job pauses to ask for more past
    /// it. Implied by --up-to, --tokens and --for.
    #[arg(long, conflicts_with_all = ["break_glass", "edit_tool", "edit_args"])]
    hold: bool,
    /// The scope's money, in dollars (`0.50`) or micro-USD (`500000micro`).
    #[arg(long, value_parser = crate::output::parse_money, conflicts_with_all = ["break_glass", "edit_tool", "edit_args"])]
    up_to: Option<i64>,
    /// The scope's tokens.
    #[arg(long, conflicts_with_all = ["break_glass", "edit_tool", "edit_args"])]
    tokens: Option<u64>,
    /// How long the scope stands (`30m`, `4h`; at most 24h).
    #[arg(long = "for", value_parser = crate::admin::parse_age, conflicts_with_all = ["break_glass", "edit_tool", "edit_args"])]
    for_secs: Option<u64>,
    #[command(flatten)]
    conn: Conn,
}

impl Decision {
    /// The scope asked for, if any.
    fn scope(&self) -> Option<ApprovalScope> {
        let asked =
            self.hold || self.up_to.is_some() || self.tokens.is_some() || self.for_secs.is_some();
        asked.then(|| ApprovalScope {
            tokens: self.tokens.unwrap_or(0),
            cost: self.up_to.map(|micro_usd| Money { micro_usd }),
            until: self.for_secs.map(|s| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                prost_types::Timestamp {
                    seconds: (now.as_secs() + s) as i64,
                    nanos: 0,
                }
            }),
        })
    }
}

type Client = ApprovalClient;

pub(crate) async fn client(conn: &Conn) -> anyhow::Result<Client> {
    Ok(ApprovalClient::remote(conn.channel().await?, MAX_MESSAGE))
}

fn status_name(s: i32) -> String {
    short_name(
        RunStatus::try_from(s).ok().map(|s| s.as_str_name()),
        "RUN_STATUS_",
    )
}

fn parse_status(s: &str) -> anyhow::Result<i32> {
    RunStatus::from_str_name(&format!("RUN_STATUS_{}", s.to_ascii_uppercase()))
        .filter(|s| *s != RunStatus::Unspecified)
        .map(|s| s as i32)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "unknown status {s:?}; expected proposed, approved, rejected, running, completed, failed or cancelled"
            )
        })
}

fn ms(t: &Option<prost_types::Timestamp>) -> Option<u64> {
    t.as_ref().map(switchyard_kit::time::timestamp_ms)
}

fn estimate(r: &Run) -> String {
    r.cost_estimate
        .as_ref()
        .and_then(|e| e.estimated_cost)
        .map_or_else(|| "unknown".into(), |m| usd(m.micro_usd))
}

/// A run as JSON.
pub fn run_json(r: &Run) -> Value {
    let t = r.target.clone().unwrap_or_default();
    let p = r.context_pack.clone().unwrap_or_default();
    let e = r.cost_estimate.unwrap_or_default();
    let res = r.result.clone().unwrap_or_default();
    json!({
        "schema_version": r.schema_version, "run_id": r.run_id, "created_at_ms": ms(&r.created_at),
        "created_by": r.created_by, "status": status_name(r.status), "requires_approval": r.requires_approval,
        "target": {"org": t.org, "repo": t.repo, "work_item_ids": t.work_item_ids},
        "intent": r.intent,
        "context_pack": {"pack_id": p.pack_id, "hash": p.hash, "version": p.version, "inputs": p.inputs},
        "model": r.model, "max_tokens": r.max_tokens, "temperature": r.temperature,
        "cost_estimate": r.cost_estimate.map(|_| json!({
            "estimated_input_tokens": e.estimated_input_tokens,
            "estimated_output_tokens": e.estimated_output_tokens,
            "estimated_micro_usd": e.estimated_cost.map(|m| m.micro_usd)})),
        "tools_allowed": r.tools_allowed, "outputs_allowed": r.outputs_allowed,
        "result": r.result.as_ref().map(|_| json!({
            "changeset_bundle_id": res.changeset_bundle_id, "draft_pr_url": res.draft_pr_url,
            "artifact_paths": res.artifact_paths, "summary": res.summary, "content": res.content,
            "artifacts": res.artifacts.iter().map(|a| json!({"path": a.path, "artifact_id": a.artifact_id,
                "kind": crate::output::artifact_kind(a.kind), "size_bytes": a.size_bytes})).collect::<Vec<_>>()})),
        "adapter": r.adapter, "adapter_state": r.adapter_state, "reason_code": r.reason_code,
        "tool_call": r.tool_call.as_ref().map(|t| json!({"job_id": t.job_id, "task_id": t.task_id,
            "call_id": t.call_id, "tool": t.tool, "arguments": t.arguments, "reason": t.reason,
            "attempt": t.attempt, "job_run_id": t.job_run_id})),
        "claimed_by": r.claimed_by, "claim_expires_at_ms": ms(&r.claim_expires_at),
        "retry_count": r.retry_count, "max_retries": r.max_retries,
        "next_attempt_at_ms": ms(&r.next_attempt_at), "last_error": r.last_error,
        "job_id": r.job_id, "correlation_id": r.correlation_id, "labels": r.labels,
        "policy": r.policy.as_ref().map(policy_json),
        "scope": r.scope.as_ref().map(|s| json!({"tokens": s.tokens,
            "cost_micro_usd": s.cost.map_or(0, |m| m.micro_usd),
            "until_ms": ms(&s.until)})),
    })
}

/// The scope an approval granted, in words: `up to $0.000050 and 12288
/// tokens, held until …`.
fn scope_line(s: &ApprovalScope) -> String {
    let until = s
        .until
        .map(|t| format!(", held until {t}"))
        .unwrap_or_default();
    format!(
        "up to {} and {} tokens{until}",
        usd(s.cost.map_or(0, |m| m.micro_usd)),
        s.tokens
    )
}

/// A policy decision as JSON.
pub(crate) fn policy_json(p: &switchyard_proto::common::v1::PolicyDecision) -> Value {
    json!({"effect": p.effect, "policies": p.policies, "version": p.version,
           "approvals_required": p.approvals_required, "explanation": p.explanation,
           "delegation_depth": p.delegation_depth, "errors": p.errors,
           "action": p.action, "resource": p.resource})
}

const RUN_HEADERS: [&str; 7] = [
    "RUN",
    "STATUS",
    "CREATED_BY",
    "EST_COST",
    "MODEL",
    "MAX_TOKENS",
    "INTENT",
];

fn run_rows(runs: &[Run]) -> Vec<Vec<String>> {
    runs.iter()
        .map(|r| {
            vec![
                r.run_id.clone(),
                status_name(r.status),
                r.created_by.clone(),
                estimate(r),
                r.model.clone(),
                r.max_tokens.to_string(),
                match &r.tool_call {
                    // What a person approves: the call itself.
                    Some(t) => format!(
                        "call {}({}) in job {}",
                        t.tool,
                        t.arguments.chars().take(80).collect::<String>(),
                        t.job_id
                    ),
                    None => r.intent.clone(),
                },
            ]
        })
        .collect()
}

/// Where a run executes and what it produced: its adapter and submission,
/// the tool call it stands for, its artifacts.
fn show_execution(run: &Run) {
    if let Some(t) = &run.tool_call {
        println!(
            "tool call:     {}({}) in job {} task {} (attempt {})",
            t.tool, t.arguments, t.job_id, t.task_id, t.attempt
        );
        if !t.reason.is_empty() {
            println!("model said:    {}", t.reason);
        }
    }
    if !run.adapter.is_empty() {
        let state = if run.adapter_state.is_empty() {
            String::new()
        } else {
            format!(" ({})", run.adapter_state)
        };
        let job = if run.job_id.is_empty() {
            String::new()
        } else {
            format!(" job {}", run.job_id)
        };
        println!("adapter:       {}{job}{state}", run.adapter);
    }
    if let Some(s) = &run.scope {
        println!("scope:         {}", scope_line(s));
    }
    if !run.reason_code.is_empty() {
        println!("reason code:   {}", run.reason_code);
    }
    let r = run.result.clone().unwrap_or_default();
    for a in &r.artifacts {
        println!(
            "artifact:      {} {} {} bytes {}",
            a.path,
            crate::output::artifact_kind(a.kind),
            a.size_bytes,
            a.artifact_id
        );
    }
    if !r.draft_pr_url.is_empty() {
        println!(
            "draft PR:      {} (not published: a person opens it)",
            r.draft_pr_url
        );
    }
}

fn show_run(conn: &Conn, run: &Run, verb: &str) {
    match conn.output {
        Format::Json => print_json(&run_json(run)),
        Format::Table => {
            println!("{verb} run {} ({})", run.run_id, status_name(run.status));
            if let Some(s) = &run.scope {
                println!("scope:         {}", scope_line(s));
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Verdict {
    Approve,
    Reject,
    Cancel,
}

/// The run `id` names: a run id as is, or a job id, whose job's run is
/// looked up (a job's run is `run-<job id>`, an id people rarely have at
/// hand). Unknown ids get an error that says where run ids come from.
pub(crate) async fn resolve(conn: &Conn, c: &Client, id: &str) -> anyhow::Result<String> {
    let not_found = match c.get_run(GetRunRequest { run_id: id.into() }).await {
        Ok(_) => return Ok(id.to_owned()),
        Err(s) if s.code() == tonic::Code::NotFound => s,
        Err(s) => return Err(api(s)),
    };
    // Not a run: perhaps a job, on the same server (dev mode) or wherever
    // --url points.
    let jobs = switchyard_api::ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
    let job = jobs
        .get_job(switchyard_proto::executor::v1::GetJobRequest { job_id: id.into() })
        .await
        .ok()
        .and_then(|r| r.job)
        .filter(|j| !j.run_id.is_empty());
    match job {
        // Paused by its budget: the decision it waits for is its extension.
        Some(j)
            if j.state == switchyard_proto::executor::v1::JobState::BudgetPaused as i32
                && j.budget_pause.as_ref().is_some_and(|p| p.decision == "pending") =>
        {
            let run = j.budget_pause.map(|p| p.run_id).unwrap_or_default();
            eprintln!("job {id} is paused by its budget and waits on extension run {run}");
            Ok(run)
        }
        Some(j) => {
            eprintln!("job {id} waits on run {}", j.run_id);
            Ok(j.run_id)
        }
        None => Err(anyhow::Error::from(ApiError::from(not_found)).context(format!(
            "no run or job {id:?}: a job's run is named run-<job id>; `switchyard approval list --status proposed` lists the runs waiting"
        ))),
    }
}

/// The edit `--edit-tool` / `--edit-args` ask for, completed from the
/// call as the model made it (an edit of the tool alone keeps its
/// arguments; of the arguments alone, its tool).
async fn edit_of(
    c: &Client,
    run_id: &str,
    tool: Option<String>,
    args: Option<String>,
) -> anyhow::Result<Option<ToolCallEdit>> {
    if tool.is_none() && args.is_none() {
        return Ok(None);
    }
    let run = c
        .get_run(GetRunRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .map_err(api)?
        .run
        .unwrap_or_default();
    let Some(call) = run.tool_call else {
        anyhow::bail!(
            "run {run_id} is not a tool call's run: only a gated tool call can be approved with --edit-tool/--edit-args"
        );
    };
    Ok(Some(ToolCallEdit {
        tool: tool.unwrap_or(call.tool),
        arguments: args.unwrap_or(call.arguments),
        by: String::new(),
    }))
}

async fn decide(d: Decision, verdict: Verdict) -> anyhow::Result<()> {
    if !matches!(verdict, Verdict::Approve) && (d.edit_tool.is_some() || d.edit_args.is_some()) {
        anyhow::bail!("--edit-tool and --edit-args go with `approval approve` only");
    }
    let scope = d.scope();
    if !matches!(verdict, Verdict::Approve) && scope.is_some() {
        anyhow::bail!("--hold, --up-to, --tokens and --for go with `approval approve` only");
    }
    let c = client(&d.conn).await?;
    let run_id = resolve(&d.conn, &c, &d.id).await?;
    let comment = d.comment;
    let (run, verb) = match verdict {
        Verdict::Approve if d.break_glass => {
            let r = c
                .break_glass_approve(BreakGlassApproveRequest {
                    run_id,
                    reason: comment,
                })
                .await;
            (
                r.map_err(api)?.run,
                "approved (break-glass, audited)".to_owned(),
            )
        }
        Verdict::Approve => {
            let edit = edit_of(&c, &run_id, d.edit_tool, d.edit_args).await?;
            let r = c
                .approve(ApproveRequest {
                    run_id,
                    comment,
                    edit,
                    scope,
                })
                .await;
            let run = r.map_err(api)?.run;
            let still_proposed = run
                .as_ref()
                .is_some_and(|r| r.status == RunStatus::Proposed as i32);
            let verb = match &run {
                Some(r) if still_proposed => {
                    let needed = r.policy.as_ref().map_or(2, |p| p.approvals_required.max(2));
                    format!(
                        "approval {} of {needed} recorded; another, different approver is needed",
                        r.approved_by.len()
                    )
                }
                _ => "approved".to_owned(),
            };
            (run, verb)
        }
        Verdict::Reject => {
            let r = c.reject(RejectRequest { run_id, comment }).await;
            (r.map_err(api)?.run, "rejected".to_owned())
        }
        Verdict::Cancel => {
            let r = c.cancel(CancelRequest { run_id, comment }).await;
            (r.map_err(api)?.run, "cancelled".to_owned())
        }
    };
    show_run(&d.conn, &run.unwrap_or_default(), &verb);
    Ok(())
}

/// `approval verify`: checks a receipt offline.
fn verify(file: &std::path::Path, key: Option<&str>) -> anyhow::Result<()> {
    let text = if file == std::path::Path::new("-") {
        let mut t = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut t)?;
        t
    } else {
        std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?
    };
    let r: switchyard_kit::receipt::Receipt = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a receipt: {e}", file.display()))?;
    switchyard_kit::receipt::verify(&r, key)
        .map_err(|e| anyhow::anyhow!("INVALID receipt {}: {e}", file.display()))?;
    let b = &r.receipt;
    let by = b["approved_by"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    println!(
        "valid: run {} approved by {by} at {} ms, signed by key {}{}",
        b["run_id"].as_str().unwrap_or_default(),
        b["decided_at_ms"],
        r.key_id,
        if key.is_some() {
            " (the key you gave)"
        } else {
            " (its own key: pass --key to check it is your deployment's)"
        }
    );
    Ok(())
}

/// Runs an approval command.
pub async fn run(cmd: ApprovalCmd) -> anyhow::Result<()> {
    match cmd {
        ApprovalCmd::Propose { files, conn } => {
            let runs = files.parse(|f| RunFile::read(f).and_then(RunFile::into_run))?;
            let c = client(&conn).await?;
            let mut out = Vec::new();
            for run in runs {
                let r = c
                    .propose(ProposeRequest {
                        run: Some(run),
                        ..Default::default()
                    })
                    .await
                    .map_err(api)?;
                let run = r.run.clone().unwrap_or_default();
                if conn.output == Format::Table {
                    let how = if r.auto_approved_by.is_empty() {
                        status_name(run.status)
                    } else {
                        format!("approved by policy {}", r.auto_approved_by)
                    };
                    println!(
                        "{} run {}: {how}, estimated cost {}",
                        if r.created { "proposed" } else { "unchanged" },
                        run.run_id,
                        estimate(&run)
                    );
                }
                out.push(json!({"created": r.created, "auto_approved_by": r.auto_approved_by, "run": run_json(&run)}));
            }
            if conn.output == Format::Json {
                print_json(&Value::Array(out));
            }
        }
        ApprovalCmd::List {
            status,
            org,
            created_by,
            conn,
        } => {
            let statuses = status
                .iter()
                .map(|s| parse_status(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let c = client(&conn).await?;
            let mut runs = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = c
                    .list_runs(ListRunsRequest {
                        statuses: statuses.clone(),
                        target_org: org.clone().unwrap_or_default(),
                        created_by: created_by.clone().unwrap_or_default(),
                        page_size: 1000,
                        page_token,
                        ..Default::default()
                    })
                    .await
                    .map_err(api)?;
                runs.extend(r.runs);
                if r.next_page_token.is_empty() {
                    break;
                }
                page_token = r.next_page_token;
            }
            match conn.output {
                Format::Json => print_list(runs.iter().map(run_json).collect(), ""),
                Format::Table => table(&RUN_HEADERS, &run_rows(&runs)),
            }
        }
        ApprovalCmd::Show { id, conn } => {
            let c = client(&conn).await?;
            let id = resolve(&conn, &c, &id).await?;
            let run = c
                .get_run(GetRunRequest { run_id: id.clone() })
                .await
                .map_err(api)?
                .run
                .unwrap_or_default();
            let audit = c
                .list_audit(ListAuditRequest {
                    run_id: id,
                    page_size: 1000,
                    ..Default::default()
                })
                .await
                .map_err(api)?
                .records;
            let audit_json: Vec<Value> = audit
                .iter()
                .map(|a| {
                    json!({"sequence": a.sequence, "time_ms": ms(&a.time), "actor": a.actor,
                           "event_type": a.event_type, "from": status_name(a.from_status),
                           "to": status_name(a.to_status), "reason": a.reason,
                           "correlation_id": a.correlation_id, "details": a.details})
                })
                .collect();
            match conn.output {
                Format::Json => print_json(&json!({"run": run_json(&run), "audit": audit_json})),
                Format::Table => {
                    table(&RUN_HEADERS, &run_rows(std::slice::from_ref(&run)));
                    let pack = run.context_pack.clone().unwrap_or_default();
                    let t = run.target.clone().unwrap_or_default();
                    println!();
                    println!("target:        {}/{} {:?}", t.org, t.repo, t.work_item_ids);
                    println!(
                        "context pack:  {} {} ({})",
                        pack.pack_id, pack.hash, pack.version
                    );
                    let at = |t: &Option<prost_types::Timestamp>| {
                        t.as_ref().map_or(0, switchyard_kit::time::timestamp_ms)
                    };
                    let proposed = at(&run.created_at);
                    println!("proposed:      {}", switchyard_kit::time::utc(proposed));
                    // The first approval or rejection: how long the run
                    // waited for a person.
                    if let Some(d) = audit.iter().find(|a| {
                        matches!(status_name(a.to_status).as_str(), "approved" | "rejected")
                            && a.from_status != a.to_status
                    }) {
                        println!(
                            "decided:       {} by {}, after waiting {}",
                            switchyard_kit::time::utc(at(&d.time)),
                            d.actor,
                            switchyard_kit::time::human_duration(
                                at(&d.time).saturating_sub(proposed)
                            )
                        );
                    }
                    println!("tools:         {}", run.tools_allowed.join(", "));
                    println!("outputs:       {}", run.outputs_allowed.join(", "));
                    println!(
                        "retries:       {}/{}",
                        run.retry_count,
                        run.max_retries.unwrap_or_default()
                    );
                    if !run.claimed_by.is_empty() {
                        println!("claimed by:    {}", run.claimed_by);
                    }
                    if !run.last_error.is_empty() {
                        println!("last error:    {}", run.last_error);
                    }
                    if let Some(p) = &run.policy {
                        println!("why:           {}", p.explanation);
                        println!(
                            "policy set:    {} (approvals required: {})",
                            p.version, p.approvals_required
                        );
                    }
                    show_execution(&run);
                    println!();
                    let rows: Vec<Vec<String>> = audit
                        .iter()
                        .map(|a| {
                            let from = status_name(a.from_status);
                            vec![
                                a.sequence.to_string(),
                                switchyard_kit::time::utc(ms(&a.time).unwrap_or(0)),
                                a.event_type.clone(),
                                a.actor.clone(),
                                if from == "unspecified" || a.from_status == a.to_status {
                                    status_name(a.to_status)
                                } else {
                                    format!("{from} -> {}", status_name(a.to_status))
                                },
                                a.reason.clone(),
                            ]
                        })
                        .collect();
                    table(
                        &["SEQ", "TIME (UTC)", "EVENT", "ACTOR", "STATUS", "REASON"],
                        &rows,
                    );
                }
            }
        }
        ApprovalCmd::Approve(d) => decide(d, Verdict::Approve).await?,
        ApprovalCmd::Receipt { id, conn } => {
            let c = client(&conn).await?;
            let run_id = resolve(&conn, &c, &id).await?;
            let r = c
                .get_receipt(GetReceiptRequest { run_id })
                .await
                .map_err(api)?;
            let receipt: serde_json::Value = serde_json::from_str(&r.receipt_json)
                .map_err(|e| anyhow::anyhow!("the server sent a receipt that is not JSON: {e}"))?;
            println!("{}", serde_json::to_string_pretty(&receipt)?);
            if receipt["key_id"] != r.key_id.as_str() {
                eprintln!(
                    "note: signed by key {}; this deployment signs with key {} now",
                    receipt["key_id"], r.key_id
                );
            }
            eprintln!("deployment key {}: {}", r.key_id, r.public_key);
        }
        ApprovalCmd::Verify { file, key } => verify(&file, key.as_deref())?,
        ApprovalCmd::Reject(d) => decide(d, Verdict::Reject).await?,
        ApprovalCmd::Cancel(d) => decide(d, Verdict::Cancel).await?,
        ApprovalCmd::Bundle { id, out, conn } => {
            let c = client(&conn).await?;
            let r = c
                .export_prompt_bundle(ExportPromptBundleRequest { run_id: id })
                .await
                .map_err(api)?;
            match out {
                Some(path) => {
                    std::fs::write(&path, &r.bundle)
                        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
                    eprintln!("wrote {} ({} bytes)", path.display(), r.bundle.len());
                }
                None => {
                    use std::io::Write;
                    std::io::stdout().write_all(&r.bundle)?;
                }
            }
        }
        ApprovalCmd::Artifacts { id, out, conn } => {
            let c = client(&conn).await?;
            let list = c
                .list_run_artifacts(ListRunArtifactsRequest { run_id: id.clone() })
                .await
                .map_err(api)?
                .artifacts;
            let fetch = |artifact_id: String| {
                let (c, id, list) = (c.clone(), id.clone(), list.clone());
                async move {
                    let path = list
                        .iter()
                        .find(|a| a.artifact_id == artifact_id)
                        .map(|a| a.path.clone())
                        .unwrap_or_default();
                    let req = GetRunArtifactRequest { run_id: id, path };
                    Ok(c.get_run_artifact(req).await.map_err(api)?.content)
                }
            };
            crate::output::artifacts(&list, out.as_deref(), conn.output, fetch).await?;
        }
        ApprovalCmd::Import {
            id,
            file,
            context_hash,
            kind,
            name,
            media_type,
            conn,
        } => {
            let content = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            let Some(kind) = switchyard_core::artifact::ArtifactKind::parse(&kind) else {
                anyhow::bail!(
                    "--kind {kind:?} is not one of file, changeset_bundle, draft_pr, issue_comment, test_plan"
                );
            };
            let c = client(&conn).await?;
            let r = c
                .import_manual_result(ImportManualResultRequest {
                    run_id: id,
                    content,
                    context_hash,
                    kind: switchyard_api::artifacts::proto_kind(kind) as i32,
                    // Kept under the name the person gave the file, unless
                    // told otherwise (the server's default is result.md).
                    name: name.unwrap_or_else(|| {
                        file.file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    }),
                    media_type: media_type.unwrap_or_default(),
                })
                .await
                .map_err(api)?;
            show_run(&conn, &r.run.unwrap_or_default(), "completed");
        }
    }
    Ok(())
}
