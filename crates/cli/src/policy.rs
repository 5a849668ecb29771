//! `switchyard policy ...`: check Cedar policies offline, print the schema
//! they are written against, and explain what the policies in force decide.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;
use switchyard_proto::approval::v1::{
    DeletePolicyRequest, GetRunRequest, ListPoliciesRequest, ListRunsRequest, PutPolicyRequest,
};
use switchyard_proto::executor::v1::{
    GetResultRequest, GetResultResponse, ToolResult, ValidateJobRequest,
};

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json, table};

/// `switchyard policy ...`
#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Validate a directory of `*.cedar` policies against Switchyard's
    /// schema, as a service would load it (offline): prints the policies'
    /// ids and the set's version, or what is wrong and where.
    Check {
        /// The directory (`[policy] dir`).
        dir: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the Cedar schema policies are validated against.
    Schema,
    /// What the policies in force decide, and why: about a job document
    /// before it is submitted (a dry run on the server, as you: nothing is
    /// proposed), or about a run or job already proposed (what was decided,
    /// by which policies, under which version).
    Explain {
        /// A job document (a file, or `-` for standard input), a run id or
        /// a job id.
        target: String,
        /// The document's format when it is a file (native, agenix, aitp,
        /// ojs); detected when unset.
        #[arg(long)]
        format: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Store a Cedar policy file in the deployment's policy store (on
    /// PostgreSQL, shared by every replica), replacing one of the same
    /// name. Refused, with Cedar's words, unless the whole set loads with
    /// it. Every process decides with it within `policy.reload_ms`. Needs
    /// the service token (a policy decides for every tenant).
    Put {
        /// The `.cedar` file.
        file: PathBuf,
        /// Its name in the store (default: the file's name without
        /// `.cedar`).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the stored policy files.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a stored policy file.
    Delete {
        /// Its name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Runs a `policy` command.
pub async fn run(cmd: PolicyCmd) -> anyhow::Result<()> {
    match cmd {
        PolicyCmd::Check { dir, json } => {
            let sources = switchyard_policy::read_dir(&dir)?;
            if sources.is_empty() {
                anyhow::bail!("{} holds no *.cedar files: nothing to check", dir.display());
            }
            let set =
                switchyard_policy::PolicySet::load(&sources).map_err(|e| anyhow::anyhow!("{e}"))?;
            if json {
                print_json(&json!({"version": set.version(), "policies": set.ids(),
                                   "files": sources.iter().map(|s| &s.name).collect::<Vec<_>>()}));
            } else {
                println!(
                    "ok: {} policies in {} files, version {}",
                    set.len(),
                    sources.len(),
                    set.version()
                );
                for id in set.ids() {
                    println!("  {id}");
                }
            }
            Ok(())
        }
        PolicyCmd::Schema => {
            print!("{}", switchyard_policy::SCHEMA);
            Ok(())
        }
        PolicyCmd::Put { file, name, conn } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
            let name = match name {
                Some(n) => n,
                None => file
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            };
            let out = crate::approval::client(&conn)
                .await?
                .put_policy(PutPolicyRequest { name, text })
                .await
                .map_err(api)?;
            let p = out.policy.unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&json!({"name": p.name, "updated_by": p.updated_by,
                    "version": out.version})),
                Format::Table => println!(
                    "stored policy file {} (by {}); the set in force is now {}",
                    p.name, p.updated_by, out.version
                ),
            }
            Ok(())
        }
        PolicyCmd::List { conn } => {
            let listed = crate::approval::client(&conn)
                .await?
                .list_policies(ListPoliciesRequest {})
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!(
                    listed
                        .policies
                        .iter()
                        .map(|p| json!({
                            "name": p.name, "text": p.text, "updated_by": p.updated_by,
                            "updated_at": p.updated_at.map(|t| t.to_string()),
                        }))
                        .collect::<Vec<_>>()
                )),
                Format::Table => {
                    let rows: Vec<Vec<String>> = listed
                        .policies
                        .iter()
                        .map(|p| {
                            vec![
                                p.name.clone(),
                                p.updated_by.clone(),
                                p.updated_at.map(|t| t.to_string()).unwrap_or_default(),
                                p.text.lines().count().to_string(),
                            ]
                        })
                        .collect();
                    table(&["NAME", "UPDATED_BY", "UPDATED_AT", "LINES"], &rows);
                }
            }
            Ok(())
        }
        PolicyCmd::Delete { name, conn } => {
            let out = crate::approval::client(&conn)
                .await?
                .delete_policy(DeletePolicyRequest { name: name.clone() })
                .await
                .map_err(api)?;
            println!(
                "removed stored policy file {name}; the set in force is now {}",
                out.version
            );
            Ok(())
        }
        PolicyCmd::Explain {
            target,
            format,
            conn,
        } => {
            let path = PathBuf::from(&target);
            if target == "-" || path.is_file() {
                return explain_document(&path, format, &conn).await;
            }
            let jobs = switchyard_api::ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
            match jobs
                .get_result(GetResultRequest {
                    job_id: target.clone(),
                    ..Default::default()
                })
                .await
            {
                Ok(r) => explain_job(&target, &r, &conn).await,
                Err(s) if s.code() == tonic::Code::NotFound => explain_run(&target, &conn).await,
                Err(s) => Err(api(s)),
            }
        }
    }
}

/// The dry run of a job document: ValidateJob's policy checks.
async fn explain_document(
    path: &std::path::Path,
    format: Option<String>,
    conn: &Conn,
) -> anyhow::Result<()> {
    let c = switchyard_api::ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
    let v = c
        .validate_job(ValidateJobRequest {
            spec: None,
            document: crate::job::read(path)?,
            format: format.unwrap_or_default(),
        })
        .await
        .map_err(api)?;
    match conn.output {
        Format::Json => print_json(&json!({
            "policies": v.policies.iter().map(crate::approval::policy_json).collect::<Vec<_>>()})),
        Format::Table => {
            let rows: Vec<Vec<String>> = v
                .policies
                .iter()
                .map(|p| {
                    vec![
                        p.action.clone(),
                        decided_on(p).to_owned(),
                        p.effect.clone(),
                        p.explanation.clone(),
                    ]
                })
                .collect();
            table(&["ACTION", "ON", "EFFECT", "WHY"], &rows);
            if let Some(p) = v.policies.first() {
                println!("policy set {}", p.version);
            }
            for p in &v.policies {
                for e in &p.errors {
                    println!("error: {e}");
                }
            }
        }
    }
    Ok(())
}

/// Every decision about job `job_id`: its runs' (the job's own, each
/// gated tool call's) as the approval service recorded them, and the tool
/// calls refused in-process.
async fn explain_job(job_id: &str, r: &GetResultResponse, conn: &Conn) -> anyhow::Result<()> {
    let c = crate::approval::client(conn).await?;
    let runs = c
        .list_runs(ListRunsRequest {
            work_item_id: job_id.to_owned(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .map_err(api)?
        .runs;
    let forbidden: Vec<(&str, &ToolResult)> = r
        .tasks
        .iter()
        .flat_map(|t| t.tool_results.iter().map(move |c| (t.task_id.as_str(), c)))
        .filter(|(_, c)| c.reason == "POLICY_FORBIDDEN")
        .collect();
    match conn.output {
        Format::Json => print_json(&json!({
            "job_id": job_id,
            "runs": runs.iter().map(|run| json!({"run_id": run.run_id, "decided_by": run.decided_by,
                "policy": run.policy.as_ref().map(crate::approval::policy_json)})).collect::<Vec<_>>(),
            "forbidden_calls": forbidden.iter().map(|(task, c)| json!({"task_id": task,
                "call_id": c.call_id, "tool": c.name, "arguments": c.arguments, "error": c.error})).collect::<Vec<_>>(),
        })),
        Format::Table => {
            let mut rows: Vec<Vec<String>> = runs
                .iter()
                .filter_map(|run| {
                    let p = run.policy.as_ref()?;
                    Some(vec![
                        run.run_id.clone(),
                        if p.action.is_empty() {
                            "extension".into()
                        } else {
                            p.action.clone()
                        },
                        p.resource.clone(),
                        p.effect.clone(),
                        p.explanation.clone(),
                    ])
                })
                .collect();
            rows.extend(forbidden.iter().map(|(task, c)| {
                vec![
                    format!("(task {task}, call {})", c.call_id),
                    "call_tool".into(),
                    c.name.clone(),
                    "forbid".into(),
                    c.error.clone(),
                ]
            }));
            table(&["DECIDED FOR", "ACTION", "ON", "EFFECT", "WHY"], &rows);
            let versions: std::collections::BTreeSet<&str> = runs
                .iter()
                .filter_map(|r| r.policy.as_ref().map(|p| p.version.as_str()))
                .collect();
            for v in versions {
                println!("policy set {v}");
            }
        }
    }
    Ok(())
}

/// What was decided about a run when it was proposed.
async fn explain_run(id: &str, conn: &Conn) -> anyhow::Result<()> {
    let c = crate::approval::client(conn).await?;
    let run_id = crate::approval::resolve(conn, &c, id).await?;
    let run = c
        .get_run(GetRunRequest {
            run_id: run_id.clone(),
        })
        .await
        .map_err(api)?
        .run
        .unwrap_or_default();
    let Some(p) = &run.policy else {
        anyhow::bail!(
            "run {run_id} was proposed before policies were recorded on runs: `switchyard approval show {run_id}` shows its audit trail"
        );
    };
    match conn.output {
        Format::Json => print_json(&json!({"run_id": run_id, "decided_by": run.decided_by,
            "policy": crate::approval::policy_json(p)})),
        Format::Table => {
            println!("run {run_id}: {}", p.explanation);
            println!("effect         {}", p.effect);
            if !p.policies.is_empty() {
                println!("policies       {}", p.policies.join(", "));
            }
            println!("approvals      {}", p.approvals_required);
            if !run.decided_by.is_empty() {
                println!("decided by     {}", run.decided_by);
            }
            println!("policy set     {}", p.version);
            for e in &p.errors {
                println!("error          {e}");
            }
        }
    }
    Ok(())
}

/// What a decision was taken on, in words: a submission's decision has no
/// resource yet (the job does not exist), so it reads "(new job)".
pub(crate) fn decided_on(p: &switchyard_proto::common::v1::PolicyDecision) -> &str {
    if p.resource.is_empty() {
        "(new job)"
    } else {
        &p.resource
    }
}
