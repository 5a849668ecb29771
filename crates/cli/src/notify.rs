//! `switchyard notify ...`: the webhook deliveries waiting to be sent
//! again, and the dead-lettered ones.

use clap::Subcommand;
use serde_json::json;
use switchyard_api::NotificationClient;
use switchyard_kit::time::{timestamp_ms, utc};
use switchyard_proto::executor::v1::*;

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json, print_list, table};

/// `switchyard notify ...`
#[derive(Subcommand, Debug)]
pub enum NotifyCmd {
    /// Webhook deliveries not yet accepted: those waiting to be tried
    /// again, and (with --dead, only) those whose attempts ran out.
    List {
        /// Only dead-lettered deliveries.
        #[arg(long)]
        dead: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Send a dead-lettered delivery again (its attempts start over).
    Retry {
        /// The delivery (`<webhook>/<event id>`).
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

async fn client(conn: &Conn) -> anyhow::Result<NotificationClient> {
    Ok(NotificationClient::remote(
        conn.channel().await?,
        MAX_MESSAGE,
    ))
}

fn delivery_json(d: &Delivery) -> serde_json::Value {
    json!({
        "delivery_id": d.delivery_id,
        "webhook": d.webhook,
        "event_type": d.event_type,
        "event_id": d.event_id,
        "tenant": d.tenant,
        "subject": d.subject,
        "dead": d.dead,
        "attempts": d.attempts,
        "next_attempt_at": d.next_attempt_at.as_ref().map(timestamp_ms),
        "last_error": d.last_error,
        "created_at": d.created_at.as_ref().map(timestamp_ms),
        "body": serde_json::from_str::<serde_json::Value>(&d.body).unwrap_or_default(),
    })
}

/// Runs a `notify` command.
pub async fn run(cmd: NotifyCmd) -> anyhow::Result<()> {
    match cmd {
        NotifyCmd::List { dead, conn } => {
            let out = client(&conn)
                .await?
                .list_deliveries(ListDeliveriesRequest { dead_only: dead })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_list(out.deliveries.iter().map(delivery_json).collect(), ""),
                Format::Table => {
                    let rows: Vec<Vec<String>> = out
                        .deliveries
                        .iter()
                        .map(|d| {
                            vec![
                                d.delivery_id.clone(),
                                d.event_type
                                    .trim_start_matches("dev.switchyard.")
                                    .to_owned(),
                                if d.dead {
                                    "dead".into()
                                } else {
                                    format!(
                                        "next {}",
                                        utc(d.next_attempt_at.as_ref().map_or(0, timestamp_ms))
                                    )
                                },
                                d.attempts.to_string(),
                                d.last_error.clone(),
                            ]
                        })
                        .collect();
                    table(
                        &["DELIVERY", "EVENT", "STATE", "ATTEMPTS", "LAST ERROR"],
                        &rows,
                    );
                }
            }
        }
        NotifyCmd::Retry { id, conn } => {
            let d = client(&conn)
                .await?
                .retry_delivery(RetryDeliveryRequest { delivery_id: id })
                .await
                .map_err(api)?
                .delivery
                .unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&delivery_json(&d)),
                Format::Table => println!("sending {} again", d.delivery_id),
            }
        }
    }
    Ok(())
}
