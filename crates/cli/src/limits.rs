//! `switchyard limits`: the provider rate-limit buckets in use, what each
//! holds, the cooldowns providers asked for, and who is waiting.

use clap::Args;
use serde_json::json;
use switchyard_api::LedgerClient;
use switchyard_kit::time::{timestamp_ms, utc};
use switchyard_proto::ledger::v1::{LimitBucket, ListLimitsRequest};

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_list, table};

/// `switchyard limits`
#[derive(Args, Debug)]
pub struct LimitsArgs {
    /// Only the buckets of this limit (its `name` in `[[ledger.limits]]`).
    #[arg(long)]
    pub limit: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

fn bucket_json(b: &LimitBucket) -> serde_json::Value {
    json!({
        "limit": b.limit,
        "scope": b.scope,
        "use": b.r#use.iter().map(|u| json!({"dimension": u.dimension, "used": u.used, "limit": u.limit})).collect::<Vec<_>>(),
        "cooldown_until": b.cooldown_until.as_ref().map(timestamp_ms),
        "cooldown_why": b.cooldown_why,
        "waiting": b.waiting.iter().map(|w| json!({
            "tenant": w.tenant,
            "calls": w.calls,
            "since": w.since.as_ref().map(timestamp_ms),
            "why": w.why,
        })).collect::<Vec<_>>(),
        "granted": b.granted,
        "waits": b.waits,
        "refused": b.refused,
    })
}

/// What a bucket holds, in one line: `requests_per_minute 3/6, …`.
fn use_text(b: &LimitBucket) -> String {
    let mut parts: Vec<String> = b
        .r#use
        .iter()
        .map(|u| format!("{} {}/{}", u.dimension, u.used, u.limit))
        .collect();
    if let Some(t) = &b.cooldown_until {
        parts.push(format!(
            "cooling down until {} ({})",
            utc(timestamp_ms(t)),
            b.cooldown_why
        ));
    }
    parts.join(", ")
}

/// Who waits on a bucket, in one line.
fn waiting_text(b: &LimitBucket) -> String {
    b.waiting
        .iter()
        .map(|w| {
            let who = if w.tenant.is_empty() {
                "other tenants"
            } else {
                w.tenant.as_str()
            };
            let since = w.since.as_ref().map_or(0, timestamp_ms);
            format!("{who}: {} since {}", w.calls, utc(since))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs `switchyard limits`.
pub async fn run(args: LimitsArgs) -> anyhow::Result<()> {
    let out = LedgerClient::remote(args.conn.channel().await?, MAX_MESSAGE)
        .list_limits(ListLimitsRequest {
            limit: args.limit.unwrap_or_default(),
        })
        .await
        .map_err(api)?;
    match args.conn.output {
        Format::Json => print_list(out.buckets.iter().map(bucket_json).collect(), ""),
        Format::Table => {
            if out.buckets.is_empty() {
                println!("no rate-limit bucket in use (declare limits with [[ledger.limits]])");
                return Ok(());
            }
            let rows: Vec<Vec<String>> = out
                .buckets
                .iter()
                .map(|b| {
                    vec![
                        if b.limit.is_empty() {
                            "(cooldown)".into()
                        } else {
                            b.limit.clone()
                        },
                        b.scope.clone(),
                        use_text(b),
                        waiting_text(b),
                        format!("{}/{}/{}", b.granted, b.waits, b.refused),
                    ]
                })
                .collect();
            table(
                &[
                    "LIMIT",
                    "SCOPE",
                    "IN USE",
                    "WAITING",
                    "GRANTED/WAITS/REFUSED",
                ],
                &rows,
            );
        }
    }
    Ok(())
}
