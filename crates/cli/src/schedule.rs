//! `switchyard schedule ...`: run a job on a cron timetable.

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use serde_json::{Value, json};
use switchyard_api::ScheduleClient;
use switchyard_kit::time::timestamp_ms;
use switchyard_proto::executor::v1::*;

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json, print_list, table};

/// `switchyard schedule ...`
#[derive(Subcommand, Debug)]
pub enum ScheduleCmd {
    /// Create a schedule: the job in FILE (any accepted format, as `job
    /// submit` reads it) starts at each tick of the cron expression, read
    /// in --tz. Its jobs are yours, approved and budgeted like any you
    /// submit, each named `<id>-<UTC time of its tick>`.
    Create {
        /// The job file; `-` reads it from standard input.
        file: PathBuf,
        /// When it fires: five fields (minute hour day-of-month month
        /// day-of-week), six with seconds first, or @hourly, @daily,
        /// @weekly, @monthly, @yearly.
        #[arg(long)]
        cron: String,
        /// The IANA time zone the expression is read in (default UTC).
        #[arg(long = "tz", default_value = "")]
        tz: String,
        /// The schedule's id (default: a new one).
        #[arg(long)]
        id: Option<String>,
        /// While the previous job still runs, a tick is skipped, queued
        /// (starts when it ends), or cancels it.
        #[arg(long, value_enum, default_value_t = Overlap::Skip)]
        overlap: Overlap,
        /// Ticks missed while no executor ran: none fire, the latest fires
        /// once, or all fire in turn.
        #[arg(long = "catch-up", value_enum, default_value_t = CatchUp::Latest)]
        catch_up: CatchUp,
        /// How far back a missed tick still fires (`30m`, `6h`).
        #[arg(long = "catch-up-window")]
        catch_up_window: Option<String>,
        /// Replace the job's input, as JSON (`@FILE` reads it from a file).
        #[arg(long)]
        input: Option<String>,
        /// What it is for, shown in lists.
        #[arg(long, default_value = "")]
        description: String,
        /// Create it paused.
        #[arg(long)]
        paused: bool,
        /// Read the file as this format only (native, agenix, aitp, ojs).
        #[arg(long)]
        format: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the schedules you may see, with their next fire time and last
    /// tick.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a schedule: its timetable, next fire times and recent ticks
    /// with the jobs they started.
    Get {
        /// Schedule id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Pause a schedule: no tick fires until it is resumed (the ticks that
    /// pass meanwhile never fire).
    Pause {
        /// Schedule id.
        id: String,
        /// Why, shown with the schedule.
        #[arg(long, default_value = "")]
        note: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Resume a paused schedule from now on.
    Resume {
        /// Schedule id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a schedule (the jobs it started stay).
    Delete {
        /// Schedule id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `--overlap`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Overlap {
    Skip,
    Queue,
    CancelPrevious,
}

/// `--catch-up`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CatchUp {
    Skip,
    Latest,
    All,
}

async fn client(conn: &Conn) -> anyhow::Result<ScheduleClient> {
    Ok(ScheduleClient::remote(conn.channel().await?, MAX_MESSAGE))
}

/// Runs a `schedule` command.
pub async fn run(cmd: ScheduleCmd) -> anyhow::Result<()> {
    match cmd {
        ScheduleCmd::Create {
            file,
            cron,
            tz,
            id,
            overlap,
            catch_up,
            catch_up_window,
            input,
            description,
            paused,
            format,
            conn,
        } => {
            let document = crate::job::read(&file)?;
            let input = input
                .map(|i| crate::job::object_arg("--input", &i))
                .transpose()?;
            let window = catch_up_window
                .map(|w| {
                    switchyard_kit::time::parse_span(&w)
                        .map_err(|e| anyhow::anyhow!("--catch-up-window {w}: {e}"))
                })
                .transpose()?;
            let schedule = Schedule {
                schedule_id: id.unwrap_or_default(),
                cron,
                time_zone: tz,
                overlap: match overlap {
                    Overlap::Skip => OverlapPolicy::Skip,
                    Overlap::Queue => OverlapPolicy::Queue,
                    Overlap::CancelPrevious => OverlapPolicy::CancelPrevious,
                } as i32,
                catch_up: match catch_up {
                    CatchUp::Skip => CatchUpPolicy::Skip,
                    CatchUp::Latest => CatchUpPolicy::Latest,
                    CatchUp::All => CatchUpPolicy::All,
                } as i32,
                catch_up_window: window.map(switchyard_kit::time::duration),
                description,
                paused,
                ..Default::default()
            };
            let out = client(&conn)
                .await?
                .create_schedule(CreateScheduleRequest {
                    schedule: Some(schedule),
                    document,
                    format: format.unwrap_or_default(),
                    input,
                })
                .await
                .map_err(api)?;
            let s = out.schedule.unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&json!({
                    "schedule": schedule_json(&s),
                    "created": out.created,
                })),
                Format::Table => {
                    let verb = if out.created {
                        "created"
                    } else {
                        "already had"
                    };
                    println!(
                        "{verb} schedule {}: {:?} in {}{}",
                        s.schedule_id,
                        s.cron,
                        zone(&s),
                        if s.paused { " (paused)" } else { "" }
                    );
                    print_next(&s);
                }
            }
        }
        ScheduleCmd::List { conn } => {
            let out = client(&conn)
                .await?
                .list_schedules(ListSchedulesRequest {})
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_list(out.schedules.iter().map(schedule_json).collect(), ""),
                Format::Table => {
                    let rows: Vec<Vec<String>> = out
                        .schedules
                        .iter()
                        .map(|s| {
                            vec![
                                s.schedule_id.clone(),
                                s.cron.clone(),
                                zone(s),
                                if s.paused { "paused" } else { "active" }.into(),
                                s.next_fire_times
                                    .first()
                                    .map(|t| wall(s, timestamp_ms(t)))
                                    .unwrap_or_else(|| "-".into()),
                                s.recent_ticks.first().map_or_else(|| "-".into(), tick_text),
                                s.created_by.clone(),
                            ]
                        })
                        .collect();
                    table(
                        &["ID", "CRON", "ZONE", "STATE", "NEXT", "LAST TICK", "BY"],
                        &rows,
                    );
                }
            }
        }
        ScheduleCmd::Get { id, conn } => {
            let s = client(&conn)
                .await?
                .get_schedule(GetScheduleRequest { schedule_id: id })
                .await
                .map_err(api)?
                .schedule
                .unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&schedule_json(&s)),
                Format::Table => print_schedule(&s),
            }
        }
        ScheduleCmd::Pause { id, note, conn } => {
            let s = client(&conn)
                .await?
                .pause_schedule(PauseScheduleRequest {
                    schedule_id: id,
                    note,
                })
                .await
                .map_err(api)?
                .schedule
                .unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&schedule_json(&s)),
                Format::Table => println!("paused schedule {}", s.schedule_id),
            }
        }
        ScheduleCmd::Resume { id, conn } => {
            let s = client(&conn)
                .await?
                .resume_schedule(ResumeScheduleRequest { schedule_id: id })
                .await
                .map_err(api)?
                .schedule
                .unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&schedule_json(&s)),
                Format::Table => {
                    println!("resumed schedule {}", s.schedule_id);
                    print_next(&s);
                }
            }
        }
        ScheduleCmd::Delete { id, conn } => {
            client(&conn)
                .await?
                .delete_schedule(DeleteScheduleRequest {
                    schedule_id: id.clone(),
                })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({"schedule_id": id, "deleted": true})),
                Format::Table => println!("deleted schedule {id} (the jobs it started stay)"),
            }
        }
    }
    Ok(())
}

fn zone(s: &Schedule) -> String {
    if s.time_zone.is_empty() {
        "UTC".into()
    } else {
        s.time_zone.clone()
    }
}

/// `ms` on the schedule's wall clock, with its UTC time.
fn wall(s: &Schedule, ms: u64) -> String {
    let utc = switchyard_kit::time::utc(ms);
    let tz = match s.time_zone.as_str() {
        "" | "UTC" | "Etc/UTC" => return utc,
        name => jiff::tz::TimeZone::get(name).ok(),
    };
    let at = i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok());
    match (tz, at) {
        (Some(tz), Some(at)) => format!(
            "{} ({utc})",
            at.to_zoned_datetime(tz).strftime("%Y-%m-%d %H:%M:%S %Z")
        ),
        _ => utc,
    }
}

/// `--overlap`'s word for `o` (unset: the default, skip).
fn overlap_name(o: OverlapPolicy) -> &'static str {
    match o {
        OverlapPolicy::Queue => "queue",
        OverlapPolicy::CancelPrevious => "cancel-previous",
        OverlapPolicy::Skip | OverlapPolicy::Unspecified => "skip",
    }
}

/// `--catch-up`'s word for `c` (unset: the default, latest).
fn catch_up_name(c: CatchUpPolicy) -> &'static str {
    match c {
        CatchUpPolicy::Skip => "skip",
        CatchUpPolicy::All => "all",
        CatchUpPolicy::Latest | CatchUpPolicy::Unspecified => "latest",
    }
}

fn outcome(t: &ScheduleTick) -> &'static str {
    match t.outcome() {
        TickOutcome::Started => "started",
        TickOutcome::SkippedOverlap => "skipped (previous job still running)",
        TickOutcome::SkippedMissed => "skipped (missed)",
        TickOutcome::Failed => "failed",
        TickOutcome::Unspecified => "unknown",
    }
}

fn tick_text(t: &ScheduleTick) -> String {
    let at = t.at.as_ref().map_or(0, timestamp_ms);
    let mut text = format!("{} {}", switchyard_kit::time::utc(at), outcome(t));
    if !t.job_id.is_empty() {
        text.push_str(&format!(" {}", t.job_id));
    }
    text
}

fn print_next(s: &Schedule) {
    if s.paused {
        println!("paused: no tick fires until it is resumed");
        return;
    }
    for t in &s.next_fire_times {
        println!("  next: {}", wall(s, timestamp_ms(t)));
    }
}

fn print_schedule(s: &Schedule) {
    println!("schedule {}", s.schedule_id);
    if !s.description.is_empty() {
        println!("  {}", s.description);
    }
    println!("  cron:       {} in {}", s.cron, zone(s));
    println!("  overlap:    {}", overlap_name(s.overlap()));
    println!(
        "  catch-up:   {} (window {})",
        catch_up_name(s.catch_up()),
        switchyard_kit::time::human_duration(
            s.catch_up_window
                .as_ref()
                .map_or(3_600_000, |d| d.seconds.max(0) as u64 * 1000)
        )
    );
    println!("  created by: {} ({})", s.created_by, s.tenant);
    if s.paused {
        let why = if s.pause_note.is_empty() {
            String::new()
        } else {
            format!(": {}", s.pause_note)
        };
        println!("  paused{why}");
    }
    print_next(s);
    if s.recent_ticks.is_empty() {
        println!("no tick yet");
        return;
    }
    let rows: Vec<Vec<String>> = s
        .recent_ticks
        .iter()
        .map(|t| {
            let mut what = outcome(t).to_owned();
            if t.skipped_before > 0 {
                what.push_str(&format!(", for {} earlier", t.skipped_before));
            }
            if !t.cancelled_job_id.is_empty() {
                what.push_str(&format!(", cancelled {}", t.cancelled_job_id));
            }
            if !t.error.is_empty() {
                what.push_str(&format!(": {}", t.error));
            }
            vec![
                switchyard_kit::time::utc(t.at.as_ref().map_or(0, timestamp_ms)),
                what,
                t.job_id.clone(),
            ]
        })
        .collect();
    table(&["TICK", "OUTCOME", "JOB"], &rows);
}

/// A schedule as JSON.
fn schedule_json(s: &Schedule) -> Value {
    let ms = |t: &Option<prost_types::Timestamp>| t.as_ref().map(timestamp_ms);
    json!({
        "schedule_id": s.schedule_id,
        "cron": s.cron,
        "time_zone": zone(s),
        "overlap": s.overlap().as_str_name(),
        "catch_up": s.catch_up().as_str_name(),
        "catch_up_window_secs": s.catch_up_window.as_ref().map(|d| d.seconds),
        "paused": s.paused,
        "pause_note": s.pause_note,
        "description": s.description,
        "tenant": s.tenant,
        "created_by": s.created_by,
        "created_at": ms(&s.created_at),
        "next_fire_times": s.next_fire_times.iter().map(timestamp_ms).collect::<Vec<_>>(),
        "recent_ticks": s.recent_ticks.iter().map(|t| json!({
            "at": ms(&t.at),
            "outcome": t.outcome().as_str_name(),
            "job_id": t.job_id,
            "skipped_before": t.skipped_before,
            "error": t.error,
            "cancelled_job_id": t.cancelled_job_id,
            "decided_by": t.decided_by,
        })).collect::<Vec<_>>(),
    })
}
