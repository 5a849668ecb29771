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
        /// Age, like 2w, 30d, 12h, 45m or 90s.
        #[arg(long, value_parser = parse_age)]
        older_than: u64,
        #[command(flatten)]
        conn: Conn,
    },
}

/// Seconds from an age a person types: `2w`, `30d`, `12h`, `45m`, `90s` (a
/// bare number is seconds); at least a second.
pub(crate) fn parse_age(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let secs = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<u64>()
            .map_err(|_| format!("{t:?} is too long an age"))?
    } else {
        switchyard_kit::time::parse_span(t)? / 1000
    };
    if secs == 0 {
        return Err(format!("{t:?} must be at least 1s"));
    }
    Ok(secs)
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
                    "pruned {} finished job{} ({} event records) older than {}",
                    out.jobs,
                    if out.jobs == 1 { "" } else { "s" },
                    out.records,
                    switchyard_kit::time::span_words(older_than.saturating_mul(1000))
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
        assert_eq!(parse_age("3w"), Ok(3 * 7 * 86_400));
        assert!(parse_age("3y").unwrap_err().contains("unknown unit"));
        assert!(parse_age("500ms").unwrap_err().contains("unknown unit"));
        assert!(parse_age("soon").is_err());
    }
}
