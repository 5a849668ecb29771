//! `switchyard audit ...`: is the record intact, and the deployment's
//! signing key.

use clap::Subcommand;
use prost::Message as _;
use serde_json::json;
use switchyard_api::ExecutorClient;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::{ListJobsRequest, VerifyJournalsRequest};
use switchyard_proto::ledger::v1::VerifyJournalRequest;

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json};

/// `switchyard audit ...`
#[derive(Subcommand, Debug)]
pub enum AuditCmd {
    /// Verify the jobs' journals as stored: each job's hash chain and each
    /// finished job's signed seal. Exits 1 when any does not verify,
    /// naming the job and where its chain breaks.
    Verify {
        /// Only this job.
        #[arg(long)]
        job: Option<String>,
        /// Check a bundle `audit export` wrote, offline (no deployment is
        /// called).
        #[arg(long, conflicts_with = "job")]
        bundle: Option<std::path::PathBuf>,
        /// With --bundle: the deployment's public key (base64) to trust,
        /// repeatable; without it the bundle's own keys are trusted, which
        /// proves the journal consistent but not who signed it.
        #[arg(long)]
        trust: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Write a job's journal as a self-contained bundle (events, chain
    /// links, its seal, the deployment's public keys, the policy set's
    /// version) that `audit verify --bundle` checks on another machine.
    Export {
        /// The job.
        #[arg(long)]
        job: String,
        /// Where to write it (default: `<job>.journal.json`).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Decide jobs' recorded policy decisions (their submission, their
    /// runs' spend, their tool calls and handoffs, with the facts recorded
    /// then) again under another policy set, calling no model, tool or
    /// agent: prints each decision that would differ, and over many jobs
    /// how many would have.
    Replay {
        /// The other policy set: a directory of `*.cedar` files.
        #[arg(long)]
        policy: std::path::PathBuf,
        /// One job.
        #[arg(long, conflicts_with_all = ["bundle", "since", "until"])]
        job: Option<String>,
        /// A bundle `audit export` wrote (offline).
        #[arg(long, conflicts_with_all = ["since", "until"])]
        bundle: Option<std::path::PathBuf>,
        /// Every job you may read created since: an age (30m, 12h, 7d, 2w
        /// ago), a date (2026-11-29) or a UTC time (2026-11-29T14:00:00Z).
        #[arg(long, value_parser = crate::output::parse_time)]
        since: Option<u64>,
        /// Only jobs created before this time (the same forms).
        #[arg(long, value_parser = crate::output::parse_time)]
        until: Option<u64>,
        /// Most jobs to replay over a time range.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// The deployment's signing key for journal seals (`[audit] key_file`).
    Key {
        /// Print a new key (its seed, base64: the file's content) and its
        /// public key.
        #[arg(long, required = true)]
        new: bool,
    },
}

pub async fn run(cmd: AuditCmd) -> anyhow::Result<()> {
    match cmd {
        AuditCmd::Verify {
            bundle: Some(path),
            trust,
            ..
        } => verify_bundle(&path, &trust),
        AuditCmd::Export { job, out, conn } => {
            let c = ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
            let x = c
                .export_journal(switchyard_proto::executor::v1::ExportJournalRequest {
                    job_id: job.clone(),
                })
                .await
                .map_err(api)?;
            let path = out.unwrap_or_else(|| format!("{job}.journal.json").into());
            let seal: serde_json::Value = if x.seal.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::from_str(&x.seal)?
            };
            let doc = json!({
                "format": BUNDLE_FORMAT,
                "job_id": x.job_id,
                "finished": x.finished,
                "policy_version": x.policy_version,
                "public_keys": x.public_keys,
                "seal": seal,
                "events": x.events.iter().map(|e| json!({
                    "sequence": e.sequence,
                    "kind": e.kind,
                    "protobuf": switchyard_kit::hex::encode(&e.encode_to_vec()),
                })).collect::<Vec<_>>(),
            });
            std::fs::write(&path, serde_json::to_vec_pretty(&doc)?)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            println!(
                "wrote {} ({} events{}) — check it anywhere with: switchyard audit verify --bundle {} --trust <the deployment's public key>",
                path.display(),
                x.events.len(),
                match (x.finished, x.seal.is_empty()) {
                    (true, _) => ", sealed",
                    (false, false) => ", checkpointed while it runs",
                    (false, true) => ", not sealed yet",
                },
                path.display()
            );
            Ok(())
        }
        AuditCmd::Verify { job, conn, .. } => {
            use switchyard_proto::approval::v1::VerifyAuditRequest;
            // Services split into processes answer at their own addresses:
            // what is not served here is said, and the rest checked.
            let c = ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
            let asked = c
                .verify_journals(VerifyJournalsRequest {
                    job_id: job.clone().unwrap_or_default(),
                })
                .await;
            let jobs = match &job {
                None => served_here(asked, "executor (the job journals)")?,
                // One job asked: the executor must answer for it.
                Some(_) => Some(asked.map_err(api)?),
            };
            // The approval service's audit log and the ledger's journal
            // too, unless one job is asked.
            let (runs, budgets) = if job.is_none() {
                let a = crate::approval::client(&conn).await?;
                let runs = served_here(
                    a.verify_audit(VerifyAuditRequest::default()).await,
                    "approval service (the runs' audit log)",
                )?;
                let l = conn.ledger().await?;
                let budgets = served_here(
                    l.verify_journal(VerifyJournalRequest::default()).await,
                    "ledger (the budgets' journal)",
                )?;
                (runs, budgets)
            } else {
                (None, None)
            };
            if jobs.is_none() && runs.is_none() && budgets.is_none() {
                anyhow::bail!(
                    "neither the executor, the approval service nor the ledger answers here: point --url at one of them"
                );
            }
            match conn.output {
                Format::Json => print_json(&json!({
                    "jobs": jobs.as_ref().map(|out| json!({
                        "jobs": out.jobs,
                        "records": out.records,
                        "sealed": out.sealed,
                        "unlinked": out.unlinked,
                        "pruned": out.pruned,
                        "key_id": out.key_id,
                        "trusted_key_ids": out.trusted_key_ids,
                        "problems": out.problems.iter().map(|p| json!({
                            "job_id": p.job_id, "problem": p.problem,
                        })).collect::<Vec<_>>(),
                    })),
                    "runs": runs.as_ref().map(|r| json!({
                        "runs": r.runs, "records": r.records, "sealed": r.sealed,
                        "unlinked": r.unlinked, "key_id": r.key_id,
                        "trusted_key_ids": r.trusted_key_ids,
                        "problems": r.problems.iter().map(|p| json!({
                            "run_id": p.run_id, "problem": p.problem,
                        })).collect::<Vec<_>>(),
                    })),
                    "budgets": budgets.as_ref().map(|b| json!({
                        "budgets": b.budgets, "records": b.records,
                        "unlinked": b.unlinked, "pruned": b.pruned,
                        "problems": b.problems.iter().map(|p| json!({
                            "budget_id": p.budget_id, "problem": p.problem,
                        })).collect::<Vec<_>>(),
                    })),
                })),
                Format::Table => {
                    if let Some(out) = &jobs {
                        print_journals(out);
                    }
                    if let Some(r) = &runs {
                        print_runs(r);
                    }
                    if let Some(b) = &budgets {
                        print_budgets(b);
                    }
                }
            }
            let mut broken = Vec::new();
            let n = jobs.as_ref().map_or(0, |o| o.problems.len()) as u64;
            if n > 0 {
                broken.push(format!("{n} journal{}", plural(n)));
            }
            let n = runs.as_ref().map_or(0, |r| r.problems.len()) as u64;
            if n > 0 {
                broken.push(format!("{n} run audit{}", plural(n)));
            }
            let n = budgets.as_ref().map_or(0, |b| b.problems.len()) as u64;
            if n > 0 {
                broken.push(format!("{n} budget journal{}", plural(n)));
            }
            if !broken.is_empty() {
                anyhow::bail!("{} did not verify", broken.join(" and "));
            }
            Ok(())
        }
        AuditCmd::Replay {
            policy,
            job,
            bundle,
            since,
            until,
            limit,
            conn,
        } => {
            let sources = switchyard_policy::read_dir(&policy)?;
            if sources.is_empty() {
                anyhow::bail!(
                    "{} holds no *.cedar files: give the directory of the policy set to replay under",
                    policy.display()
                );
            }
            let set =
                switchyard_policy::PolicySet::load(&sources).map_err(|e| anyhow::anyhow!("{e}"))?;
            let journals = match (job, bundle) {
                (_, Some(path)) => {
                    let x = read_bundle(&path)?;
                    vec![(x.job_id, x.events)]
                }
                (Some(job), None) => {
                    let c = ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
                    vec![(job.clone(), journal(&c, &job).await?)]
                }
                (None, None) => {
                    if since.is_none() && until.is_none() {
                        anyhow::bail!(
                            "say which jobs to replay: --job ID, --bundle FILE, or a time range (--since 7d, --until ...)"
                        );
                    }
                    let c = ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
                    let mut out = Vec::new();
                    for id in jobs_between(&c, since, until, limit).await? {
                        let events = journal(&c, &id).await?;
                        out.push((id, events));
                    }
                    out
                }
            };
            replay(&set, &journals, conn.output)
        }
        AuditCmd::Key { .. } => {
            let (key, seed) = switchyard_kit::receipt::ReceiptKey::generate()?;
            println!("{}", switchyard_kit::receipt::ReceiptKey::seed_text(&seed));
            eprintln!(
                "key id {}, public key {} — write the first line to the file [audit] key_file names (mode 0600, or a Secret); keep the public key to verify with, and list it in previous_public_keys once you rotate",
                key.id(),
                key.public_key()
            );
            Ok(())
        }
    }
}

/// VerifyJournals' answer, for a person.
fn print_journals(out: &switchyard_proto::executor::v1::VerifyJournalsResponse) {
    // ", 3 pruned jobs …", or nothing when there are none.
    let some = |n: u64, what: &str, rest: &str| {
        if n > 0 {
            format!(", {n} {what}{} {rest}", plural(n))
        } else {
            String::new()
        }
    };
    println!(
        "{} job{} checked: {} event{}, {} finished job{} sealed{}{}",
        out.jobs,
        plural(out.jobs),
        out.records,
        plural(out.records),
        out.sealed,
        plural(out.sealed),
        some(out.pruned, "pruned job", "vouched for by their seals"),
        some(out.unlinked, "event", "from before journals were chained"),
    );
    println!(
        "signing key {} (trusted: {})",
        out.key_id,
        out.trusted_key_ids.join(", ")
    );
    for p in &out.problems {
        println!("BROKEN  job {}: {}", p.job_id, p.problem);
    }
    if out.problems.is_empty() {
        println!("every journal verifies");
    }
}

/// A verifier's answer at `--url`; `None`, said on stderr, when the
/// service (`what`) is not served there (services split into processes).
fn served_here<T>(answer: Result<T, tonic::Status>, what: &str) -> anyhow::Result<Option<T>> {
    match answer {
        Ok(out) => Ok(Some(out)),
        Err(s) if s.code() == tonic::Code::Unimplemented => {
            eprintln!(
                "note: no {what} answers here, so it was not checked: run `switchyard audit verify` against its address too"
            );
            Ok(None)
        }
        Err(s) => Err(api(s)),
    }
}

/// VerifyAudit's answer, for a person.
fn print_runs(r: &switchyard_proto::approval::v1::VerifyAuditResponse) {
    let key = if r.trusted_key_ids.len() > 1 {
        format!(
            "key {}; trusted: {}",
            r.key_id,
            r.trusted_key_ids.join(", ")
        )
    } else {
        format!("key {}", r.key_id)
    };
    println!(
        "{} approval run{} checked: {} audit record{}, {} ended run{} sealed ({key}){}",
        r.runs,
        plural(r.runs),
        r.records,
        plural(r.records),
        r.sealed,
        plural(r.sealed),
        if r.unlinked > 0 {
            format!(
                ", {} record{} from before audit chains",
                r.unlinked,
                plural(r.unlinked)
            )
        } else {
            String::new()
        }
    );
    for p in &r.problems {
        println!("BROKEN  run {}: {}", p.run_id, p.problem);
    }
    if r.problems.is_empty() {
        println!("every run's audit verifies");
    }
}

/// VerifyJournal's answer, for a person.
fn print_budgets(b: &switchyard_proto::ledger::v1::VerifyJournalResponse) {
    let mut extra = Vec::new();
    if b.pruned > 0 {
        extra.push(format!(
            "{} continuing from the head kept when their first records were pruned",
            b.pruned
        ));
    }
    if b.unlinked > 0 {
        extra.push(format!(
            "{} record{} in no chain (from before chains, or refusals of retired budgets)",
            b.unlinked,
            plural(b.unlinked)
        ));
    }
    println!(
        "{} budget{} checked: {} ledger record{}{}",
        b.budgets,
        plural(b.budgets),
        b.records,
        plural(b.records),
        if extra.is_empty() {
            String::new()
        } else {
            format!(", {}", extra.join(", "))
        }
    );
    for p in &b.problems {
        println!("BROKEN  budget {}: {}", p.budget_id, p.problem);
    }
    if b.problems.is_empty() {
        println!("every budget's journal verifies");
    }
}

/// What a bundle file says it is.
const BUNDLE_FORMAT: &str = "switchyard.journal-bundle.v1";

/// `audit verify --bundle`: the chain and seal of an exported journal,
/// offline.
fn verify_bundle(path: &std::path::Path, trust: &[String]) -> anyhow::Result<()> {
    let mut x = read_bundle(path)?;
    let bundle_keys = std::mem::take(&mut x.public_keys);
    let trusted = if trust.is_empty() {
        eprintln!(
            "note: trusting the bundle's own public keys; pass --trust <key> with the deployment's public key to rule out a bundle re-signed by someone else"
        );
        bundle_keys
    } else {
        trust.to_vec()
    };
    let c = switchyard_executor::audit::check_export(&x, &trusted);
    match c.problem {
        Some(p) => {
            println!("BROKEN  job {}: {p}", c.job_id);
            anyhow::bail!("the bundle's journal did not verify")
        }
        None => {
            println!(
                "job {}: {} event{} verify{}",
                c.job_id,
                c.records,
                plural(c.records),
                c.sealed_by
                    .map(|k| format!(", sealed by key {k}"))
                    .unwrap_or_else(|| " (not sealed: the job had not finished)".into())
            );
            Ok(())
        }
    }
}

/// A bundle `audit export` wrote, read back as the export's answer.
fn read_bundle(
    path: &std::path::Path,
) -> anyhow::Result<switchyard_proto::executor::v1::ExportJournalResponse> {
    let text =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let doc: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a journal bundle (JSON): {e}", path.display()))?;
    if doc["format"] != BUNDLE_FORMAT {
        anyhow::bail!(
            "{} is not a journal bundle: its format is {}, not {BUNDLE_FORMAT} (write one with switchyard audit export)",
            path.display(),
            doc["format"]
        );
    }
    let mut events = Vec::new();
    for (i, e) in doc["events"].as_array().into_iter().flatten().enumerate() {
        let bytes = e["protobuf"]
            .as_str()
            .and_then(|h| switchyard_kit::hex::decode(h, h.len()))
            .ok_or_else(|| anyhow::anyhow!("event {} of the bundle is not hex protobuf", i + 1))?;
        events.push(
            switchyard_proto::common::v1::Event::decode(bytes.as_slice()).map_err(|e| {
                anyhow::anyhow!("event {} of the bundle does not decode: {e}", i + 1)
            })?,
        );
    }
    let public_keys: Vec<String> = doc["public_keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect();
    Ok(switchyard_proto::executor::v1::ExportJournalResponse {
        job_id: doc["job_id"].as_str().unwrap_or_default().to_owned(),
        events,
        finished: doc["finished"].as_bool().unwrap_or(false),
        seal: if doc["seal"].is_null() {
            String::new()
        } else {
            doc["seal"].to_string()
        },
        public_keys,
        policy_version: doc["policy_version"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    })
}

/// A job's journal, as `ExportJournal` gives it.
async fn journal(c: &ExecutorClient, job_id: &str) -> anyhow::Result<Vec<Event>> {
    let x = c
        .export_journal(switchyard_proto::executor::v1::ExportJournalRequest {
            job_id: job_id.to_owned(),
        })
        .await
        .map_err(api)?;
    Ok(x.events)
}

/// The ids of the jobs the caller may read created in `[since, until)`,
/// newest first, at most `limit`.
async fn jobs_between(
    c: &ExecutorClient,
    since: Option<u64>,
    until: Option<u64>,
    limit: u32,
) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .list_jobs(ListJobsRequest {
                created_after: since.map(switchyard_kit::time::timestamp),
                created_before: until.map(switchyard_kit::time::timestamp),
                page_size: limit.saturating_sub(ids.len() as u32).min(500),
                page_token,
                ..Default::default()
            })
            .await
            .map_err(api)?;
        ids.extend(
            page.jobs
                .into_iter()
                .filter_map(|j| j.spec.map(|s| s.job_id)),
        );
        if page.next_page_token.is_empty() || ids.len() as u32 >= limit {
            return Ok(ids);
        }
        page_token = page.next_page_token;
    }
}

/// Prints what `set` would decide differently in `journals`.
fn replay(
    set: &switchyard_policy::PolicySet,
    journals: &[(String, Vec<Event>)],
    format: Format,
) -> anyhow::Result<()> {
    use switchyard_policy::Change;
    let replays: Vec<(&str, switchyard_executor::audit::JobReplay)> = journals
        .iter()
        .map(|(id, events)| {
            (
                id.as_str(),
                switchyard_executor::audit::replay_journal(set, events),
            )
        })
        .collect();
    let decisions: u64 = replays.iter().map(|(_, r)| r.decisions).sum();
    let differing = replays
        .iter()
        .filter(|(_, r)| !r.differences.is_empty())
        .count();
    let unrecorded = replays.iter().filter(|(_, r)| r.decisions == 0).count();
    // Jobs per kind of change: "3 would need approval".
    let by_change: Vec<(Change, usize)> = Change::ALL
        .into_iter()
        .map(|c| {
            let n = replays
                .iter()
                .filter(|(_, r)| r.differences.iter().any(|d| d.difference.change == c))
                .count();
            (c, n)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    if let Format::Json = format {
        print_json(&json!({
            "policy_version": set.version(),
            "jobs": replays.len(),
            "decisions": decisions,
            "jobs_differing": differing,
            "jobs_without_recorded_decisions": unrecorded,
            "by_change": by_change.iter().map(|(c, n)| (json!(c).as_str().unwrap_or_default().to_owned(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "replays": replays.iter().map(|(id, r)| json!({
                "job_id": id, "decisions": r.decisions, "differences": r.differences,
                "unreadable": r.unreadable.iter().map(|(seq, why)| json!({"sequence": seq, "error": why})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = replays
        .iter()
        .flat_map(|(id, r)| {
            r.differences.iter().map(move |d| {
                vec![
                    id.to_string(),
                    if d.task_id.is_empty() {
                        "-".into()
                    } else {
                        d.task_id.clone()
                    },
                    d.action.clone(),
                    d.resource.clone(),
                    d.difference.was.words(),
                    d.difference.now.words(),
                    if d.difference.now_by.is_empty() {
                        "(no policy)".into()
                    } else {
                        d.difference.now_by.join(",")
                    },
                ]
            })
        })
        .collect();
    if !rows.is_empty() {
        crate::output::table(
            &["JOB", "STEP", "ACTION", "RESOURCE", "WAS", "WOULD BE", "BY"],
            &rows,
        );
    }
    for (id, r) in &replays {
        for (seq, why) in &r.unreadable {
            println!("UNREADABLE  job {id} event {seq}: {why}");
        }
    }
    let n = replays.len() as u64;
    let changes = by_change
        .iter()
        .map(|(c, k)| format!("{k} {}", c.words()))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "with policy set {}, {differing} of {n} job{} would have been decided differently ({decisions} recorded decision{} replayed){}",
        set.version(),
        plural(n),
        plural(decisions),
        if changes.is_empty() {
            String::new()
        } else {
            format!(": {changes}")
        }
    );
    if unrecorded > 0 {
        println!(
            "{unrecorded} job{} recorded no policy decision (refused before its journal began, or recorded before decisions were journaled)",
            plural(unrecorded as u64)
        );
    }
    Ok(())
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
