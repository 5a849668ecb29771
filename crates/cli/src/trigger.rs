//! `switchyard trigger ...`: start a job from an incoming event.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Value, json};
use switchyard_api::TriggerClient;
use switchyard_proto::executor::v1::*;

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json, print_list, table};

/// `switchyard trigger ...`
#[derive(Subcommand, Debug)]
pub enum TriggerCmd {
    /// Create a trigger: each event delivered to it (`trigger fire`, or
    /// `POST /v1/triggers/ID/events` on the HTTP door) starts the job in
    /// FILE as you, with the event in its input; once per event id.
    Create {
        /// The job file; `-` reads it from standard input.
        file: PathBuf,
        /// The trigger's id (default: a new one).
        #[arg(long)]
        id: Option<String>,
        /// The input key the whole event goes under (default `event`; `-`
        /// for none).
        #[arg(long = "event-field", default_value = "")]
        event_field: String,
        /// An input key read from the event: KEY=/json/pointer (repeat).
        #[arg(long = "map", value_parser = crate::client::parse_kv)]
        map: Vec<(String, String)>,
        /// A principal (subject) of your tenant that may deliver events
        /// besides you, such as a webhook sender's key (repeat).
        #[arg(long = "sender")]
        senders: Vec<String>,
        /// What it is for, shown in lists.
        #[arg(long, default_value = "")]
        description: String,
        /// Read the file as this format only (native, agenix, aitp, ojs).
        #[arg(long)]
        format: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the triggers you may see.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a trigger.
    Get {
        /// Trigger id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a trigger (the jobs it started stay).
    Delete {
        /// Trigger id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Deliver an event: start the trigger's job (a repeat of the event
    /// id answers with the job it started).
    Fire {
        /// Trigger id.
        id: String,
        /// The event, a JSON object (`@FILE` reads it from a file).
        #[arg(long)]
        event: String,
        /// The event's id at its source.
        #[arg(long = "event-id")]
        event_id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

async fn client(conn: &Conn) -> anyhow::Result<TriggerClient> {
    Ok(TriggerClient::remote(conn.channel().await?, MAX_MESSAGE))
}

/// Runs a `trigger` command.
pub async fn run(cmd: TriggerCmd) -> anyhow::Result<()> {
    match cmd {
        TriggerCmd::Create {
            file,
            id,
            event_field,
            map,
            senders,
            description,
            format,
            conn,
        } => {
            let document = crate::job::read(&file)?;
            let out = client(&conn)
                .await?
                .create_trigger(CreateTriggerRequest {
                    trigger: Some(Trigger {
                        trigger_id: id.unwrap_or_default(),
                        description,
                        event_field,
                        input_map: map.into_iter().collect(),
                        senders,
                        ..Default::default()
                    }),
                    document,
                    format: format.unwrap_or_default(),
                })
                .await
                .map_err(api)?;
            let t = out.trigger.unwrap_or_default();
            match conn.output {
                Format::Json => {
                    print_json(&json!({"trigger": trigger_json(&t), "created": out.created}))
                }
                Format::Table => {
                    let verb = if out.created {
                        "created"
                    } else {
                        "already had"
                    };
                    println!("{verb} trigger {}", t.trigger_id);
                    println!(
                        "  deliver events: switchyard trigger fire {} --event JSON --event-id ID",
                        t.trigger_id
                    );
                    println!(
                        "  or POST /v1/triggers/{}/events with an Idempotency-Key header",
                        t.trigger_id
                    );
                }
            }
        }
        TriggerCmd::List { conn } => {
            let out = client(&conn)
                .await?
                .list_triggers(ListTriggersRequest {})
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_list(out.triggers.iter().map(trigger_json).collect(), ""),
                Format::Table => {
                    let rows: Vec<Vec<String>> = out
                        .triggers
                        .iter()
                        .map(|t| {
                            vec![
                                t.trigger_id.clone(),
                                t.job
                                    .as_ref()
                                    .map(|j| j.plan_id.clone())
                                    .unwrap_or_default(),
                                mapping(t),
                                if t.senders.is_empty() {
                                    "-".into()
                                } else {
                                    t.senders.join(", ")
                                },
                                t.created_by.clone(),
                            ]
                        })
                        .collect();
                    table(&["ID", "PLAN", "INPUT FROM EVENT", "SENDERS", "BY"], &rows);
                }
            }
        }
        TriggerCmd::Get { id, conn } => {
            let t = client(&conn)
                .await?
                .get_trigger(GetTriggerRequest { trigger_id: id })
                .await
                .map_err(api)?
                .trigger
                .unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&trigger_json(&t)),
                Format::Table => {
                    println!("trigger {}", t.trigger_id);
                    if !t.description.is_empty() {
                        println!("  {}", t.description);
                    }
                    println!(
                        "  plan:       {}",
                        t.job.as_ref().map(|j| j.plan_id.as_str()).unwrap_or("")
                    );
                    println!("  input:      {}", mapping(&t));
                    println!("  created by: {} ({})", t.created_by, t.tenant);
                    if !t.senders.is_empty() {
                        println!("  senders:    {}", t.senders.join(", "));
                    }
                }
            }
        }
        TriggerCmd::Delete { id, conn } => {
            client(&conn)
                .await?
                .delete_trigger(DeleteTriggerRequest {
                    trigger_id: id.clone(),
                })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({"trigger_id": id, "deleted": true})),
                Format::Table => println!("deleted trigger {id} (the jobs it started stay)"),
            }
        }
        TriggerCmd::Fire {
            id,
            event,
            event_id,
            conn,
        } => {
            let event = crate::job::object_arg("--event", &event)?;
            let out = client(&conn)
                .await?
                .fire_trigger(FireTriggerRequest {
                    trigger_id: id,
                    event: Some(event),
                    event_id,
                })
                .await
                .map_err(api)?;
            let j = out.job.unwrap_or_default();
            let job_id = j
                .spec
                .as_ref()
                .map(|s| s.job_id.clone())
                .unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&json!({
                    "job_id": job_id,
                    "state": crate::job::job_state(j.state),
                    "created": out.created,
                })),
                Format::Table if out.created => {
                    println!("started job {job_id}: {}", crate::job::job_state(j.state));
                }
                Format::Table => println!(
                    "this event was delivered before: job {job_id} ({})",
                    crate::job::job_state(j.state)
                ),
            }
        }
    }
    Ok(())
}

/// How a trigger fills its job's input, in words.
fn mapping(t: &Trigger) -> String {
    let mut parts: Vec<String> = match t.event_field.as_str() {
        "-" => Vec::new(),
        "" => vec!["event = the event".into()],
        f => vec![format!("{f} = the event")],
    };
    parts.extend(t.input_map.iter().map(|(k, p)| format!("{k} = {p}")));
    if parts.is_empty() {
        "the template's".into()
    } else {
        parts.join(", ")
    }
}

fn trigger_json(t: &Trigger) -> Value {
    json!({
        "trigger_id": t.trigger_id,
        "description": t.description,
        "plan_id": t.job.as_ref().map(|j| j.plan_id.clone()),
        "event_field": if t.event_field.is_empty() { "event" } else { t.event_field.as_str() },
        "input_map": t.input_map,
        "senders": t.senders,
        "tenant": t.tenant,
        "created_by": t.created_by,
        "created_at": t.created_at.as_ref().map(switchyard_kit::time::timestamp_ms),
    })
}
