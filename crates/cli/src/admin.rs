//! `switchyard admin ...`: operating a deployment.

use clap::Subcommand;
use serde_json::json;
use switchyard_api::ExecutorClient;
use switchyard_proto::executor::v1::PruneJobsRequest;

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json};

/// `switchyard admin ...`
#[derive(Subcommand, Debug)]
pub enum AdminCmd {
    /// Remove finished jobs (records, events, outputs) that finished longer
    /// ago than `--older-than`; running and waiting jobs are never touched.
    /// A tenant admin prunes that tenant's jobs; the service token, all.
    Prune {
        /// Age, like 30d, 12h, 45m or 90s.
        #[arg(long, value_parser = parse_age)]
        older_than: u64,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Seconds from `30d`, `12h`, `45m` or `90s`.
pub(crate) fn parse_age(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not an age: write a number and a unit, like 30d or 12h"))?;
    let per = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" | "" => 1,
        other => return Err(format!("unknown unit {other:?}: use d, h, m or s")),
    };
    n.checked_mul(per)
        .filter(|s| *s >= 1)
        .ok_or_else(|| format!("{s:?} must be at least 1s and fit in 64 bits"))
}

pub async fn run(cmd: AdminCmd) -> anyhow::Result<()> {
    match cmd {
        AdminCmd::Prune { older_than, conn } => {
            let c = ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
            let out = c
                .prune_jobs(PruneJobsRequest {
                    older_than: Some(prost_types::Duration {
                        seconds: older_than as i64,
                        nanos: 0,
                    }),
                })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({"jobs": out.jobs, "records": out.records})),
                _ => println!(
                    "pruned {} finished jobs ({} event records) older than {older_than}s",
                    out.jobs, out.records
                ),
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_take_a_unit_and_refuse_nonsense() {
        assert_eq!(parse_age("30d"), Ok(30 * 86_400));
        assert_eq!(parse_age("12h"), Ok(43_200));
        assert_eq!(parse_age("90"), Ok(90));
        assert!(parse_age("0s").is_err());
        assert!(parse_age("3w").unwrap_err().contains("unknown unit"));
        assert!(parse_age("soon").is_err());
    }
}
