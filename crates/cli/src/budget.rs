//! `switchyard budget ...`: budgets and the cost journal.

use clap::Subcommand;
use serde_json::{Value, json};
use switchyard_proto::common::v1::{Money, UnitPrice};
use switchyard_proto::ledger::v1::*;

use crate::client::{Conn, MAX_MESSAGE, api, parse_kv};
use crate::output::{
    Format, parse_money, parse_time, print_json, print_list, table, usd, usd_compact,
};

/// `switchyard budget ...`
#[derive(Subcommand, Debug)]
pub enum BudgetCmd {
    /// Create a budget, optionally nested under a parent.
    Create {
        /// Budget id, e.g. org/acme or org/acme/search.
        id: String,
        /// Parent budget id.
        #[arg(long)]
        parent: Option<String>,
        /// Token limit (unlimited when omitted).
        #[arg(long)]
        tokens: Option<u64>,
        /// Money limit in USD, e.g. 12.50, or micro-USD with a suffix:
        /// 12500000micro (unlimited when omitted).
        #[arg(long, value_parser = parse_money)]
        usd: Option<i64>,
        /// Label (KEY=VALUE); repeatable.
        #[arg(long = "label", value_parser = parse_kv)]
        labels: Vec<(String, String)>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a budget: limits, reserved, spent, remaining.
    Get {
        /// Budget id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List budgets.
    List {
        /// Only children of this budget.
        #[arg(long)]
        parent: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Change limits (lowering below spend blocks new reservations).
    Update {
        /// Budget id.
        id: String,
        /// New token limit.
        #[arg(long, conflicts_with = "unlimited_tokens")]
        tokens: Option<u64>,
        /// New money limit in USD.
        #[arg(long, value_parser = parse_money, conflicts_with = "unlimited_usd")]
        usd: Option<i64>,
        /// Remove the token limit.
        #[arg(long)]
        unlimited_tokens: bool,
        /// Remove the money limit.
        #[arg(long)]
        unlimited_usd: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Close a budget to new reservations and children.
    Close {
        /// Budget id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// The cost journal (AITP ledger shape) of a budget, a job or a correlation id.
    Entries {
        /// Entries of this budget and the budgets under it.
        #[arg(long, group = "selector")]
        budget: Option<String>,
        /// Entries of this job.
        #[arg(long, group = "selector")]
        job: Option<String>,
        /// Entries of this correlation id.
        #[arg(long, group = "selector")]
        correlation: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// What was spent in a time range, by project, person, agent, model,
    /// capability or job, and per minute, hour or day.
    Report {
        /// Only this budget and every budget under it (default: every
        /// budget of your tenant).
        #[arg(long)]
        budget: Option<String>,
        /// Start: an age (30m, 12h, 7d, 2w ago), a date (2026-11-29) or a
        /// UTC time (2026-11-29T14:00:00Z). Default: 7 days before --until.
        #[arg(long, value_parser = parse_time)]
        since: Option<u64>,
        /// End (exclusive), the same forms. Default: now.
        #[arg(long, value_parser = parse_time)]
        until: Option<u64>,
        /// Sum by this.
        #[arg(long, value_enum)]
        by: Option<ReportBy>,
        /// Bucket length of the series (default: from the range).
        #[arg(long, value_enum)]
        interval: Option<ReportInterval>,
        #[command(flatten)]
        conn: Conn,
    },
}

/// What `budget report --by` sums by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportBy {
    /// The budget one level under --budget (the top-level budget without it).
    Project,
    /// Who the charged budget was created by or for (a job's submitter).
    Person,
    /// The agent that did the work.
    Agent,
    /// The model used.
    Model,
    /// The task's capability.
    Capability,
    /// The job.
    Job,
}

impl ReportBy {
    fn proto(self) -> GroupBy {
        match self {
            ReportBy::Project => GroupBy::Project,
            ReportBy::Person => GroupBy::Person,
            ReportBy::Agent => GroupBy::Agent,
            ReportBy::Model => GroupBy::Model,
            ReportBy::Capability => GroupBy::Capability,
            ReportBy::Job => GroupBy::Job,
        }
    }
}

/// `budget report --interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportInterval {
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day (UTC).
    Day,
}

/// Prints a spend report.
fn print_report(conn: &Conn, r: &ReportResponse) {
    let at = |t: &Option<prost_types::Timestamp>| {
        switchyard_kit::time::utc(t.as_ref().map_or(0, switchyard_kit::time::timestamp_ms))
    };
    let by = r.group_by();
    let interval = switchyard_api::spend::interval_name(r.interval());
    match conn.output {
        Format::Json => print_json(&json!({
            "since": at(&r.since),
            "until": at(&r.until),
            "group_by": by.as_str_name().trim_start_matches("GROUP_BY_").to_lowercase(),
            "interval": interval,
            "groups": r.groups.iter().map(|g| json!({
                "key": g.key, "cost_micro_usd": micro(&g.cost), "tokens": g.tokens, "entries": g.entries,
            })).collect::<Vec<_>>(),
            "buckets": r.buckets.iter().map(|b| json!({
                "start": at(&b.start), "cost_micro_usd": micro(&b.cost), "tokens": b.tokens, "entries": b.entries,
            })).collect::<Vec<_>>(),
            "total_cost_micro_usd": micro(&r.total_cost),
            "total_tokens": r.total_tokens,
            "entries": r.entries,
        })),
        Format::Table => {
            println!("spend from {} to {}", at(&r.since), at(&r.until));
            let total = micro(&r.total_cost);
            if by != GroupBy::Unspecified {
                let head = by.as_str_name().trim_start_matches("GROUP_BY_");
                let rows: Vec<Vec<String>> = r
                    .groups
                    .iter()
                    .map(|g| {
                        let cost = micro(&g.cost);
                        vec![
                            if g.key.is_empty() {
                                switchyard_api::spend::unnamed_group(by).into()
                            } else {
                                g.key.clone()
                            },
                            usd(cost),
                            g.tokens.to_string(),
                            g.entries.to_string(),
                            match total {
                                0 => "-".into(),
                                t => format!("{:.0}%", cost as f64 * 100.0 / t as f64),
                            },
                        ]
                    })
                    .collect();
                table(&[head, "COST", "TOKENS", "ENTRIES", "SHARE"], &rows);
                println!();
            }
            let rows: Vec<Vec<String>> = r
                .buckets
                .iter()
                .filter(|b| b.entries > 0)
                .map(|b| {
                    vec![
                        at(&b.start),
                        usd(micro(&b.cost)),
                        b.tokens.to_string(),
                        b.entries.to_string(),
                    ]
                })
                .collect();
            let when = format!("{} (UTC)", interval.to_uppercase());
            if rows.is_empty() {
                println!("nothing was spent in this range");
            } else {
                table(&[when.as_str(), "COST", "TOKENS", "ENTRIES"], &rows);
            }
            println!(
                "total: {} ({} micro-USD), {} tokens, {} entries",
                usd(total),
                total,
                r.total_tokens,
                r.entries
            );
        }
    }
}

/// UNITS and PRICE_PER_M of a journal line, so that units × prices is the
/// line's total: LLM calls show prompt and completion tokens with their own
/// prices; other lines one count at one price.
fn units_and_price(e: &Entry) -> (String, String) {
    let per_m = |p: Option<UnitPrice>| usd_compact(p.map_or(0, |p| p.micro_usd_per_million));
    match e.usage {
        Some(u) if e.input_price.is_some() || e.output_price.is_some() => (
            format!("{} in + {} out", u.input_tokens, u.output_tokens),
            format!("{} in, {} out", per_m(e.input_price), per_m(e.output_price)),
        ),
        _ => (e.units.to_string(), per_m(e.price_per_unit)),
    }
}

/// No entries for `--job ID`: say when the job itself does not exist
/// (JOB_NOT_FOUND) rather than print an empty table. The ledger knows no
/// jobs, so the executor at the same URL is asked; a server without one
/// (a ledger on its own) leaves the empty answer as it is.
async fn job_exists(conn: &Conn, job_id: &str) -> anyhow::Result<()> {
    let jobs = switchyard_api::ExecutorClient::remote(conn.channel().await?, MAX_MESSAGE);
    match jobs
        .get_job(switchyard_proto::executor::v1::GetJobRequest {
            job_id: job_id.into(),
        })
        .await
    {
        Err(s) if s.code() == tonic::Code::NotFound => Err(api(s)),
        _ => Ok(()),
    }
}

fn micro(m: &Option<Money>) -> i64 {
    m.as_ref().map_or(0, |m| m.micro_usd)
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "unlimited".into(), |v| v.to_string())
}

/// A budget as JSON (money in micro-USD).
pub fn budget_json(b: &Budget) -> Value {
    json!({
        "budget_id": b.budget_id, "parent_id": b.parent_id,
        "token_limit": b.token_limit, "cost_limit_micro_usd": b.cost_limit.map(|m| m.micro_usd),
        "tokens_reserved": b.tokens_reserved, "tokens_spent": b.tokens_spent,
        "tokens_remaining": b.tokens_remaining,
        "cost_reserved_micro_usd": micro(&b.cost_reserved), "cost_spent_micro_usd": micro(&b.cost_spent),
        "cost_remaining_micro_usd": b.cost_remaining.map(|m| m.micro_usd),
        "labels": b.labels, "closed": b.closed, "overrun": b.overrun,
    })
}

fn budget_rows(budgets: &[Budget]) -> Vec<Vec<String>> {
    budgets
        .iter()
        .map(|b| {
            let state = match (b.closed, b.overrun) {
                (true, _) => "closed",
                (_, true) => "overrun",
                _ => "open",
            };
            vec![
                b.budget_id.clone(),
                if b.parent_id.is_empty() {
                    "-".into()
                } else {
                    b.parent_id.clone()
                },
                opt(b.token_limit),
                b.tokens_reserved.to_string(),
                b.tokens_spent.to_string(),
                opt(b.tokens_remaining),
                opt(b.cost_limit.map(|m| usd(m.micro_usd))),
                usd(micro(&b.cost_reserved)),
                usd(micro(&b.cost_spent)),
                opt(b.cost_remaining.map(|m| usd(m.micro_usd))),
                state.into(),
            ]
        })
        .collect()
}

const BUDGET_HEADERS: [&str; 11] = [
    "BUDGET",
    "PARENT",
    "TOKENS",
    "RESERVED",
    "SPENT",
    "REMAINING",
    "USD",
    "USD_RESERVED",
    "USD_SPENT",
    "USD_REMAINING",
    "STATE",
];

fn show(conn: &Conn, b: Budget) {
    match conn.output {
        Format::Json => print_json(&budget_json(&b)),
        Format::Table => table(&BUDGET_HEADERS, &budget_rows(&[b])),
    }
}

/// Runs a budget command.
pub async fn run(cmd: BudgetCmd) -> anyhow::Result<()> {
    match cmd {
        BudgetCmd::Create {
            id,
            parent,
            tokens,
            usd: cost,
            labels,
            conn,
        } => {
            let r = conn
                .ledger()
                .await?
                .create_budget(CreateBudgetRequest {
                    budget_id: id,
                    parent_id: parent.unwrap_or_default(),
                    token_limit: tokens,
                    cost_limit: cost.map(|micro_usd| Money { micro_usd }),
                    labels: labels.into_iter().collect(),
                })
                .await
                .map_err(api)?;
            let b = r.budget.unwrap_or_default();
            if conn.output == Format::Table {
                println!(
                    "{} budget {}",
                    if r.created { "created" } else { "unchanged" },
                    b.budget_id
                );
            }
            show(&conn, b);
        }
        BudgetCmd::Get { id, conn } => {
            let b = conn
                .ledger()
                .await?
                .get_budget(GetBudgetRequest { budget_id: id })
                .await
                .map_err(api)?
                .budget
                .unwrap_or_default();
            show(&conn, b);
        }
        BudgetCmd::List { parent, conn } => {
            let c = conn.ledger().await?;
            let mut budgets = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = c
                    .list_budgets(ListBudgetsRequest {
                        parent_id: parent.clone().unwrap_or_default(),
                        page_size: 1000,
                        page_token,
                    })
                    .await
                    .map_err(api)?;
                budgets.extend(r.budgets);
                if r.next_page_token.is_empty() {
                    break;
                }
                page_token = r.next_page_token;
            }
            match conn.output {
                Format::Json => print_list(budgets.iter().map(budget_json).collect(), ""),
                Format::Table => table(&BUDGET_HEADERS, &budget_rows(&budgets)),
            }
        }
        BudgetCmd::Update {
            id,
            tokens,
            usd: cost,
            unlimited_tokens,
            unlimited_usd,
            conn,
        } => {
            let b = conn
                .ledger()
                .await?
                .update_limits(UpdateLimitsRequest {
                    budget_id: id,
                    token_limit: tokens,
                    cost_limit: cost.map(|micro_usd| Money { micro_usd }),
                    remove_token_limit: unlimited_tokens,
                    remove_cost_limit: unlimited_usd,
                })
                .await
                .map_err(api)?
                .budget
                .unwrap_or_default();
            show(&conn, b);
        }
        BudgetCmd::Close { id, conn } => {
            let b = conn
                .ledger()
                .await?
                .close_budget(CloseBudgetRequest { budget_id: id })
                .await
                .map_err(api)?
                .budget
                .unwrap_or_default();
            show(&conn, b);
        }
        BudgetCmd::Report {
            budget,
            since,
            until,
            by,
            interval,
            conn,
        } => {
            let req = ReportRequest {
                budget_id: budget.unwrap_or_default(),
                since: since.map(switchyard_kit::time::timestamp),
                until: until.map(switchyard_kit::time::timestamp),
                group_by: by.map_or(GroupBy::Unspecified, ReportBy::proto) as i32,
                interval: match interval {
                    None => Interval::Unspecified,
                    Some(ReportInterval::Minute) => Interval::Minute,
                    Some(ReportInterval::Hour) => Interval::Hour,
                    Some(ReportInterval::Day) => Interval::Day,
                } as i32,
            };
            let r = conn.ledger().await?.report(req).await.map_err(api)?;
            print_report(&conn, &r);
        }
        BudgetCmd::Entries {
            budget,
            job,
            correlation,
            conn,
        } => {
            if budget.is_none() && job.is_none() && correlation.is_none() {
                anyhow::bail!("give one of --budget, --job or --correlation");
            }
            let c = conn.ledger().await?;
            let mut first: Option<ListEntriesResponse> = None;
            let mut entries = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = c
                    .list_entries(ListEntriesRequest {
                        budget_id: budget.clone().unwrap_or_default(),
                        job_id: job.clone().unwrap_or_default(),
                        correlation_id: correlation.clone().unwrap_or_default(),
                        page_size: 1000,
                        page_token,
                    })
                    .await
                    .map_err(api)?;
                entries.extend(r.entries.iter().cloned());
                page_token = r.next_page_token.clone();
                first.get_or_insert(r);
                if page_token.is_empty() {
                    break;
                }
            }
            if entries.is_empty()
                && let Some(job_id) = &job
            {
                job_exists(&conn, job_id).await?;
            }
            let head = first.unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&json!({
                    "budget": head.budget.as_ref().map(budget_json),
                    "next_page_token": "",
                    "items": entries.iter().map(|e| json!({
                        "entry_id": e.entry_id, "budget_id": e.budget_id, "subtask_id": e.subtask_id,
                        "agent_id": e.agent_id, "model": e.model, "units": e.units,
                        "price_per_unit_micro_usd_per_million": e.price_per_unit.map(|p| p.micro_usd_per_million),
                        "input_tokens": e.usage.map(|u| u.input_tokens),
                        "output_tokens": e.usage.map(|u| u.output_tokens),
                        "input_price_micro_usd_per_million": e.input_price.map(|p| p.micro_usd_per_million),
                        "output_price_micro_usd_per_million": e.output_price.map(|p| p.micro_usd_per_million),
                        "total_micro_usd": micro(&e.total), "tokens": e.tokens,
                        "job_id": e.context.as_ref().map(|c| c.job_id.clone()),
                        "correlation_id": e.context.as_ref().map(|c| c.correlation_id.clone()),
                    })).collect::<Vec<_>>(),
                    "total_cost_micro_usd": micro(&head.total_cost),
                    "total_tokens": head.total_tokens,
                    "remaining_budget_micro_usd": head.remaining_budget.map(|m| m.micro_usd),
                })),
                Format::Table => {
                    let rows: Vec<Vec<String>> = entries
                        .iter()
                        .map(|e| {
                            let (units, price) = units_and_price(e);
                            vec![
                                if e.subtask_id.is_empty() {
                                    "-".into()
                                } else {
                                    e.subtask_id.clone()
                                },
                                if e.agent_id.is_empty() {
                                    "-".into()
                                } else {
                                    e.agent_id.clone()
                                },
                                if e.model.is_empty() {
                                    "-".into()
                                } else {
                                    e.model.clone()
                                },
                                units,
                                price,
                                usd(micro(&e.total)),
                                e.budget_id.clone(),
                            ]
                        })
                        .collect();
                    table(
                        &[
                            "SUBTASK",
                            "AGENT",
                            "MODEL",
                            "UNITS",
                            "PRICE_PER_M",
                            "TOTAL",
                            "BUDGET",
                        ],
                        &rows,
                    );
                    println!("total_cost: {}", usd(micro(&head.total_cost)));
                    if let Some(b) = &head.budget {
                        let limit = b.cost_limit.map(|m| usd(m.micro_usd));
                        println!("budget: {}", opt(limit));
                        println!(
                            "remaining_budget: {}",
                            opt(head.remaining_budget.map(|m| usd(m.micro_usd)))
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
