//! `switchyard audit ...`: is the record intact, and the deployment's
//! signing key.

use clap::Subcommand;
use serde_json::json;
use switchyard_api::ExecutorClient;
use switchyard_proto::executor::v1::VerifyJournalsRequest;

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
        AuditCmd::Verify { job, conn } => {
            let c = ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
            let out = c
                .verify_journals(VerifyJournalsRequest {
                    job_id: job.unwrap_or_default(),
                })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({
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
                Format::Table => {
                    // "3 jobs", or nothing when there are none.
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
            }
            if !out.problems.is_empty() {
                anyhow::bail!(
                    "{} journal{} did not verify",
                    out.problems.len(),
                    plural(out.problems.len() as u64)
                );
            }
            Ok(())
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

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
