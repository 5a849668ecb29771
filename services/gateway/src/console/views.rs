//! What the console's pages show, shaped from the services' messages. Pure:
//! the handlers fetch, these decide the wording, money, times, the budget
//! tree and the spend chart; the templates only lay them out.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use switchyard_proto::common::v1::Money;
use switchyard_proto::executor::v1::{Job, TaskSpec, TaskStatus, task_spec};
use switchyard_proto::ledger::v1::{Budget, Entry, ReportResponse, SpendBucket};

/// Money as people read it — dollars to the nearest cent from a cent up
/// (`$0.03`, `$1,234.50`), the exact figure below a cent (`$0.00002`) —
/// with the exact micro-USD figure beside it (shown on hover).
pub fn money(micro_usd: i64) -> Value {
    let sign = if micro_usd < 0 { "-" } else { "" };
    let abs = micro_usd.unsigned_abs();
    let text = if abs == 0 {
        "$0".to_owned()
    } else if abs >= 10_000 {
        let cents = (abs + 5_000) / 10_000;
        format!("{sign}${}.{:02}", group((cents / 100) as i64), cents % 100)
    } else {
        let exact = format!("{:06}", abs);
        format!("{sign}$0.{}", exact.trim_end_matches('0'))
    };
    json!({"text": text, "micro": micro_usd, "title": format!("{} micro-USD", group(micro_usd))})
}

/// [`money`] of an optional amount; `None` shows as "no limit".
pub fn money_of(m: Option<&Money>) -> Value {
    m.map_or(Value::Null, |m| money(m.micro_usd))
}

/// `1234567` → `1,234,567`.
pub fn group(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// A time both ways: relative to `now_ms` ("3 min ago") and absolute (UTC,
/// ISO 8601 for the `datetime` attribute and as text). `None` for unset.
pub fn when(ms: u64, now_ms: u64) -> Value {
    if ms == 0 {
        return Value::Null;
    }
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = switchyard_kit::time::civil(days);
    let abs = format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    let iso = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    json!({"rel": relative(ms, now_ms), "abs": abs, "iso": iso, "ms": ms})
}

/// "just now", "42 s ago", "3 min ago", "5 h ago", "2 days ago", or "in …"
/// for a time ahead.
pub fn relative(ms: u64, now_ms: u64) -> String {
    let (ahead, d) = if ms > now_ms {
        (true, (ms - now_ms) / 1000)
    } else {
        (false, (now_ms - ms) / 1000)
    };
    let span = match d {
        0..=4 => return "just now".into(),
        5..=59 => format!("{d} s"),
        60..=3599 => format!("{} min", d / 60),
        3600..=86_399 => format!("{} h", d / 3600),
        86_400..=172_799 => "1 day".into(),
        _ => format!("{} days", d / 86_400),
    };
    if ahead {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// How a state reads at a glance: `ok` (done well), `bad` (ended badly),
/// `live` (running), `wait` (not started or waiting). The state's name is
/// always shown beside the colour.
pub fn tone(state: &str) -> &'static str {
    match state {
        "succeeded" | "completed" | "approved" => "ok",
        "failed" | "cancelled" | "discarded" | "skipped" | "rejected" | "retryable" => "bad",
        "running" | "active" | "retrying" | "awaiting_approval" | "input_required"
        | "budget_paused" => "live",
        _ => "wait",
    }
}

/// What a task does, in a few words: `agent text.stats`, `llm gpt-4o`,
/// `command sort -u`, `queue emails`.
pub fn task_kind(t: &TaskSpec) -> (String, String) {
    match &t.kind {
        Some(task_spec::Kind::Agent(a)) => ("agent".into(), a.capability.clone()),
        Some(task_spec::Kind::Llm(l)) => ("llm".into(), l.model.clone()),
        Some(task_spec::Kind::Conversation(c)) => (
            "conversation".into(),
            c.orchestrator
                .as_ref()
                .map(|o| o.model.clone())
                .unwrap_or_default(),
        ),
        Some(task_spec::Kind::Command(c)) => {
            let mut s = c.command.clone();
            for a in c.args.iter().take(4) {
                s.push(' ');
                s.push_str(a);
            }
            ("command".into(), s)
        }
        Some(task_spec::Kind::Queue(q)) => ("queue".into(), q.queue.clone()),
        Some(task_spec::Kind::Input(t)) => (
            "input".into(),
            t.prompt.chars().take(60).collect::<String>(),
        ),
        None => ("task".into(), String::new()),
    }
}

/// The tasks of `job`: each spec with its status (state, agent or model,
/// tokens, cost, attempts, output).
pub fn tasks(job: &Job, now_ms: u64) -> Vec<Value> {
    let specs = job.spec.as_ref().map_or(&[][..], |s| &s.tasks[..]);
    let status: BTreeMap<&str, &TaskStatus> =
        job.tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
    specs
        .iter()
        .map(|spec| {
            let (kind, what) = task_kind(spec);
            let st = status.get(spec.id.as_str());
            let state = st.map_or("waiting".to_owned(), |t| {
                crate::http::task_state_name(t.state)
            });
            let ts = |f: fn(&TaskStatus) -> Option<&prost_types::Timestamp>| {
                st.and_then(|t| f(t))
                    .map_or(0, switchyard_kit::time::timestamp_ms)
            };
            let output_json = st
                .and_then(|t| t.output.as_ref())
                .map(switchyard_kit::json::struct_to_json);
            // A model's answer cut at max_tokens is still an answer: said.
            let cut = output_json
                .as_ref()
                .is_some_and(|o| o["finish_reason"] == "length");
            let output = output_json
                .as_ref()
                .map(|o| serde_json::to_string_pretty(o).unwrap_or_default());
            // What the step was given, as written (templates are filled in
            // when it runs).
            let input = match &spec.kind {
                Some(task_spec::Kind::Agent(a)) => a
                    .input
                    .as_ref()
                    .map(switchyard_kit::json::struct_to_json),
                Some(task_spec::Kind::Command(c)) => {
                    Some(json!({"command": c.command, "args": c.args}))
                }
                Some(task_spec::Kind::Llm(l)) => Some(json!({"model": l.model, "prompt": l.prompt})),
                Some(task_spec::Kind::Input(i)) => Some(json!({"prompt": i.prompt})),
                _ => None,
            }
            .map(|v| serde_json::to_string_pretty(&v).unwrap_or_default());
            let stdout = st
                .filter(|t| !t.stdout.is_empty())
                .map(|t| String::from_utf8_lossy(&t.stdout).into_owned());
            json!({
                "id": spec.id,
                "name": spec.name,
                "kind": kind,
                "what": what,
                "depends_on": spec.depends_on,
                "state": state,
                "tone": tone(&state),
                "agent": st.map_or("", |t| t.agent_id.as_str()),
                "model": st.map_or("", |t| t.model_used.as_str()),
                "tokens": st.map_or(0, |t| t.tokens_used),
                "cost": money(st.and_then(|t| t.cost.as_ref()).map_or(0, |m| m.micro_usd)),
                "attempts": st.map_or(0, |t| t.attempts.len()),
                "reason": st.map_or("", |t| t.reason.as_str()),
                "error": st.map_or("", |t| t.error.as_str()),
                "started": when(ts(|t| t.started_at.as_ref()), now_ms),
                "finished": when(ts(|t| t.finished_at.as_ref()), now_ms),
                "duration": switchyard_kit::time::ran_for(ts(|t| t.started_at.as_ref()), ts(|t| t.finished_at.as_ref()), now_ms),
                "output": output,
                "input": input,
                "cut": cut,
                "stdout": stdout,
            })
        })
        .collect()
}

/// A run status's short name (`approved`).
pub fn run_status(s: i32) -> String {
    switchyard_proto::approval::v1::RunStatus::try_from(s)
        .map_or("unknown", |s| s.as_str_name())
        .trim_start_matches("RUN_STATUS_")
        .to_ascii_lowercase()
}

/// One bar of the waterfall: start and end (ms), its title and tone.
type Bar = (u64, u64, String, &'static str);

/// Width of the waterfall's time axis, in SVG user units.
const FALL_W: f64 = 600.0;

/// A call inside a step, for the waterfall: a model call (`llm.call`), a
/// tool call (`llm.tool_call`) or an agent call (`agent.call`), from the
/// event that ended it (its time, and the latency it reports).
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The step it was made in.
    pub task_id: String,
    /// `model gpt-4o-mini, turn 1`, `tool fs__write_file`, `agent text_stats`.
    pub label: String,
    /// When it started and ended, ms.
    pub start: u64,
    pub end: u64,
    /// How it ended (`ok`, `error`, ...).
    pub outcome: String,
}

impl Call {
    /// The call an event records, if it is one.
    pub fn of(e: &switchyard_proto::common::v1::Event) -> Option<Call> {
        let d = e
            .data
            .as_ref()
            .map_or(Value::Null, switchyard_kit::json::struct_to_json);
        let text = |k: &str| d[k].as_str().unwrap_or_default().to_owned();
        let (label, took, outcome) = match e.kind.as_str() {
            "llm.call" => (
                format!("model {}, turn {}", text("model"), d["turn"]),
                d["latency_ms"].as_f64()?,
                text("outcome"),
            ),
            "llm.tool_call" => (
                format!("tool {}", text("name")),
                d["duration_ms"].as_f64()?,
                text("status"),
            ),
            "agent.call" => (
                format!("agent {}", text("agent_id")),
                d["latency_ms"].as_f64()?,
                text("status"),
            ),
            _ => return None,
        };
        let end = e
            .time
            .as_ref()
            .map_or(0, switchyard_kit::time::timestamp_ms);
        Some(Call {
            task_id: e.task_id.clone(),
            label,
            start: end.saturating_sub(took.max(0.0) as u64),
            end,
            outcome,
        })
    }
}

/// The job's waterfall: one row per task, one bar per attempt from its
/// start to its end (to `now_ms` while it runs), and under each task a row
/// per model, tool or agent call made in it (`calls`), all on one time
/// axis from the job's first start; what each bar was (attempt, agent, how
/// long, how it ended) in its title. `None` before anything ran.
pub fn waterfall(job: &Job, calls: &[Call], now_ms: u64) -> Option<Value> {
    let ms = |t: Option<&prost_types::Timestamp>| t.map_or(0, switchyard_kit::time::timestamp_ms);
    let specs = job.spec.as_ref().map_or(&[][..], |s| &s.tasks[..]);
    let status: BTreeMap<&str, &TaskStatus> =
        job.tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let mut rows: Vec<(&str, String, Vec<Bar>)> = Vec::new();
    for spec in specs {
        let Some(st) = status.get(spec.id.as_str()) else {
            rows.push((&spec.id, "waiting".into(), Vec::new()));
            continue;
        };
        let state = crate::http::task_state_name(st.state);
        let mut bars = Vec::new();
        let n = st.attempts.len();
        for (i, a) in st.attempts.iter().enumerate() {
            let start = ms(a.started_at.as_ref());
            if start == 0 {
                continue;
            }
            let end = match ms(a.finished_at.as_ref()) {
                0 if i + 1 == n && st.finished_at.is_none() => now_ms,
                0 => ms(st.finished_at.as_ref()).max(start),
                e => e,
            };
            let ok = a.error.is_empty() && (i + 1 < n || tone(&state) == "ok");
            let last = i + 1 == n;
            let tone = if !a.error.is_empty() {
                "bad"
            } else if last {
                tone(&state)
            } else if ok {
                "ok"
            } else {
                "wait"
            };
            let mut title = format!(
                "{} attempt {}{}: {} ({} to {})",
                spec.id,
                a.number.max(i as u32 + 1),
                if a.agent_id.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", a.agent_id)
                },
                switchyard_kit::time::human_duration(end.saturating_sub(start)),
                &switchyard_kit::time::utc(start)[11..],
                &switchyard_kit::time::utc(end)[11..],
            );
            if !a.error.is_empty() {
                title.push_str(&format!(", failed: {}", a.error));
            }
            bars.push((start, end, title, tone));
        }
        // A task with no attempt recorded (a command, an input) that ran:
        // its own start and end.
        let (s, e) = (ms(st.started_at.as_ref()), ms(st.finished_at.as_ref()));
        if bars.is_empty() && s > 0 {
            let end = if e == 0 { now_ms } else { e };
            let title = format!(
                "{}: {} ({} to {})",
                spec.id,
                switchyard_kit::time::human_duration(end.saturating_sub(s)),
                &switchyard_kit::time::utc(s)[11..],
                &switchyard_kit::time::utc(end)[11..],
            );
            bars.push((s, end, title, tone(&state)));
        }
        rows.push((&spec.id, state, bars));
        for c in calls.iter().filter(|c| c.task_id == spec.id) {
            let title = format!(
                "{} in {}: {} ({} to {}), {}",
                c.label,
                spec.id,
                switchyard_kit::time::human_duration(c.end.saturating_sub(c.start)),
                &switchyard_kit::time::utc(c.start)[11..],
                &switchyard_kit::time::utc(c.end)[11..],
                c.outcome
            );
            let tone = match c.outcome.as_str() {
                "ok" | "success" => "ok",
                _ => "bad",
            };
            rows.push((&c.label, "call".into(), vec![(c.start, c.end, title, tone)]));
        }
    }
    let t0 = rows.iter().flat_map(|r| r.2.iter().map(|b| b.0)).min()?;
    let t1 = rows
        .iter()
        .flat_map(|r| r.2.iter().map(|b| b.1))
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let scale = FALL_W / (t1 - t0) as f64;
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|(id, state, bars)| {
            json!({
                "id": id,
                "state": state,
                "call": state == "call",
                "bars": bars.iter().map(|(s, e, title, tone)| json!({
                    "x": format!("{:.2}", (s - t0) as f64 * scale),
                    // At least a sliver: a 2 ms step is still seen.
                    "w": format!("{:.2}", ((e - s) as f64 * scale).max(2.0)),
                    "title": title,
                    "tone": tone,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Some(json!({
        "rows": rows,
        "width": FALL_W,
        "span": switchyard_kit::time::human_duration(t1 - t0),
        "from": &switchyard_kit::time::utc(t0)[11..],
        "to": &switchyard_kit::time::utc(t1)[11..],
    }))
}

/// Sizes of the plan's drawing, in SVG user units.
const NODE_W: usize = 150;
const NODE_H: usize = 40;
const GAP_X: usize = 50;
const GAP_Y: usize = 14;

/// The job's plan as a drawing: each task a box in the column of its
/// depth (the longest chain of `depends_on` before it), edges from each
/// dependency to its dependant. `tasks` is [`tasks`]'s output (id,
/// `depends_on`, state, tone), in the spec's order.
pub fn dag(tasks: &[Value]) -> Value {
    let index: BTreeMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t["id"].as_str().map(|id| (id, i)))
        .collect();
    let deps = |t: &Value| -> Vec<usize> {
        t["depends_on"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str().and_then(|d| index.get(d).copied()))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Longest path from a root, by relaxation: at most one pass per task
    // (the executor only accepts acyclic plans; the bound keeps a bad one
    // from looping).
    let mut depth = vec![0usize; tasks.len()];
    for _ in 0..tasks.len() {
        let mut changed = false;
        for (i, t) in tasks.iter().enumerate() {
            let d = deps(t).iter().map(|&j| depth[j] + 1).max().unwrap_or(0);
            if d > depth[i] {
                depth[i] = d;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut rows: BTreeMap<usize, usize> = BTreeMap::new();
    let place: Vec<(usize, usize)> = depth
        .iter()
        .map(|&d| {
            let row = rows.entry(d).or_default();
            *row += 1;
            (d * (NODE_W + GAP_X), (*row - 1) * (NODE_H + GAP_Y))
        })
        .collect();
    let nodes: Vec<Value> = tasks
        .iter()
        .zip(&place)
        .map(|(t, (x, y))| {
            json!({"id": t["id"], "state": t["state"], "tone": t["tone"], "x": x, "y": y,
                   "w": NODE_W, "h": NODE_H, "tx": x + 8, "ty1": y + 16, "ty2": y + 32})
        })
        .collect();
    let place = &place;
    let edges: Vec<Value> = tasks
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            let to = place[i];
            deps(t).into_iter().map(move |j| {
                let from = place[j];
                let (x1, y1) = (from.0 + NODE_W, from.1 + NODE_H / 2);
                let (x2, y2) = (to.0, to.1 + NODE_H / 2);
                let mid = (x1 + x2) / 2;
                json!({"d": format!("M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}")})
            })
        })
        .collect();
    let columns = depth.iter().max().map_or(0, |d| d + 1);
    let tallest = rows.values().max().copied().unwrap_or(0);
    json!({
        "nodes": nodes,
        "edges": edges,
        "width": (columns * (NODE_W + GAP_X)).saturating_sub(GAP_X).max(1),
        "height": (tallest * (NODE_H + GAP_Y)).saturating_sub(GAP_Y).max(1),
    })
}

/// A budget's figures: limits, reserved, spent, remaining, and how full it
/// is (spent + reserved over the cost limit, else the token limit).
pub fn budget(b: &Budget) -> Value {
    let micro = |m: Option<&Money>| m.map_or(0, |m| m.micro_usd);
    let used_cost = micro(b.cost_spent.as_ref()) + micro(b.cost_reserved.as_ref());
    let used_tokens = b.tokens_spent + b.tokens_reserved;
    let percent = match (b.cost_limit.as_ref(), b.token_limit) {
        (Some(l), _) if l.micro_usd > 0 => Some(used_cost as f64 / l.micro_usd as f64),
        (_, Some(t)) if t > 0 => Some(used_tokens as f64 / t as f64),
        _ => None,
    }
    .map(|f| (f * 100.0).clamp(0.0, 100.0).round() as u64);
    json!({
        "id": b.budget_id,
        "parent": b.parent_id,
        "tenant": b.tenant,
        "cost_limit": money_of(b.cost_limit.as_ref()),
        "cost_reserved": money(micro(b.cost_reserved.as_ref())),
        "cost_spent": money(micro(b.cost_spent.as_ref())),
        "cost_remaining": money_of(b.cost_remaining.as_ref()),
        "token_limit": b.token_limit,
        "tokens_reserved": b.tokens_reserved,
        "tokens_spent": b.tokens_spent,
        "tokens_remaining": b.tokens_remaining,
        "percent": percent,
        "closed": b.closed,
        "overrun": b.overrun,
        "job_id": b.labels.get("job_id"),
        "created_by": b.created_by,
        "created": b.created_at.as_ref().map_or(Value::Null, |t| when(switchyard_kit::time::timestamp_ms(t), switchyard_kit::time::now_ms())),
    })
}

/// `budgets` as a tree: each budget after its parent, with its depth
/// (tenant → project → job). A budget whose parent is not among them is a
/// root; open budgets before closed ones, each in id order. Figures are
/// the ledger's, which roll up: a budget's spent and held include every
/// budget under it.
pub fn tree(budgets: &[Budget]) -> Vec<Value> {
    let ids: std::collections::HashSet<&str> =
        budgets.iter().map(|b| b.budget_id.as_str()).collect();
    let mut children: BTreeMap<&str, Vec<&Budget>> = BTreeMap::new();
    let mut roots = Vec::new();
    for b in budgets {
        if !b.parent_id.is_empty() && ids.contains(b.parent_id.as_str()) {
            children.entry(b.parent_id.as_str()).or_default().push(b);
        } else {
            roots.push(b);
        }
    }
    // Open budgets first, then closed ones; each in id order.
    let order = |a: &&Budget, b: &&Budget| (a.closed, &a.budget_id).cmp(&(b.closed, &b.budget_id));
    roots.sort_by(order);
    for v in children.values_mut() {
        v.sort_by(order);
    }
    let mut out = Vec::new();
    // Depth-first, iteratively (a parent cycle cannot occur: each budget
    // is visited once, from its one parent or as a root).
    let mut stack: Vec<(&Budget, usize)> = roots.into_iter().rev().map(|b| (b, 0)).collect();
    while let Some((b, depth)) = stack.pop() {
        let mut v = budget(b);
        let kids = children.get(b.budget_id.as_str());
        v["depth"] = depth.into();
        v["children"] = kids.map_or(0, Vec::len).into();
        out.push(v);
        if let Some(kids) = kids {
            stack.extend(kids.iter().rev().map(|k| (*k, depth + 1)));
        }
    }
    out
}

/// An entry in AITP's cost-ledger shape (seed 002 §7.2).
pub fn entry(e: &Entry, now_ms: u64) -> Value {
    let t = e
        .time
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms);
    json!({
        "entry_id": e.entry_id,
        "subtask_id": e.subtask_id,
        "agent_id": e.agent_id,
        "model": e.model,
        "units": e.units,
        "tokens": e.tokens,
        "price_per_unit": unit_price(e.price_per_unit.as_ref().map_or(0, |p| p.micro_usd_per_million)),
        "total": money(e.total.as_ref().map_or(0, |m| m.micro_usd)),
        "timestamp": when(t, now_ms),
        "job_id": e.context.as_ref().map_or("", |c| c.job_id.as_str()),
        "budget_id": e.budget_id,
    })
}

/// A price kept per million units (tokens, pages, calls) as people read
/// it: per unit when that is a whole number of micro-dollars (agents priced
/// per call or page), else per million (model tokens, `$2.50/M`).
pub fn unit_price(micro_usd_per_million: i64) -> Value {
    let mut v = if micro_usd_per_million % 1_000_000 == 0 {
        let mut v = money(micro_usd_per_million / 1_000_000);
        v["per"] = "unit".into();
        v
    } else {
        let mut v = money(micro_usd_per_million);
        v["per"] = "M units".into();
        v
    };
    v["title"] = format!(
        "{} micro-USD per million units",
        group(micro_usd_per_million)
    )
    .into();
    v
}

/// A spend report for the page: its groups with their share of the total,
/// and its buckets as bars (each bucket one bar whatever the spread of
/// times inside it, so spend all in one second is one bar, not a line).
pub fn report(r: &ReportResponse, now_ms: u64) -> Value {
    let micro = |m: Option<&Money>| m.map_or(0, |m| m.micro_usd);
    let total = micro(r.total_cost.as_ref());
    let by = r.group_by();
    let groups: Vec<Value> = r
        .groups
        .iter()
        .map(|g| {
            let cost = micro(g.cost.as_ref());
            let share = if total > 0 {
                (cost as f64 * 100.0 / total as f64).round() as u64
            } else {
                0
            };
            json!({
                "key": g.key,
                "label": if g.key.is_empty() { switchyard_api::spend::unnamed_group(by).to_owned() } else { g.key.clone() },
                "cost": money(cost),
                "tokens": g.tokens,
                "entries": g.entries,
                "share": share,
            })
        })
        .collect();
    let top = r
        .buckets
        .iter()
        .map(|b| micro(b.cost.as_ref()))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let n = r.buckets.len().max(1) as f64;
    let width = CHART_W / n;
    let t = |b: &SpendBucket| {
        b.start
            .as_ref()
            .map_or(0, switchyard_kit::time::timestamp_ms)
    };
    let bars: Vec<Value> = r
        .buckets
        .iter()
        .enumerate()
        .filter(|(_, b)| b.entries > 0)
        .map(|(i, b)| {
            let cost = micro(b.cost.as_ref());
            // A bar of any spend is at least 2 units tall: visible.
            let h = (cost as f64 / top * CHART_H).max(2.0);
            json!({
                "x": format!("{:.2}", i as f64 * width),
                "y": format!("{:.2}", CHART_H - h),
                "w": format!("{:.2}", (width * 0.8).max(1.0)),
                "h": format!("{:.2}", h),
                "title": format!(
                    "{}: {} ({} micro-USD), {} tokens, {} entries",
                    switchyard_kit::time::utc(t(b)),
                    money(cost)["text"].as_str().unwrap_or_default(),
                    group(cost),
                    b.tokens,
                    b.entries
                ),
            })
        })
        .collect();
    let interval = switchyard_api::spend::interval_name(r.interval());
    let since = r
        .since
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms);
    let until = r
        .until
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms);
    json!({
        "groups": groups,
        "bars": bars,
        "width": CHART_W,
        "height": CHART_H,
        "interval": interval,
        "buckets": r.buckets.len(),
        "top": money(top as i64),
        "since": when(since, now_ms),
        "until": when(until, now_ms),
        "total_cost": money(total),
        "total_tokens": r.total_tokens,
        "entries": r.entries,
    })
}

/// Width and height of the spend chart, in SVG user units.
const CHART_W: f64 = 600.0;
const CHART_H: f64 = 160.0;

/// A schedule as the schedules page shows it: its timetable, its next
/// three fire times and its last five ticks.
pub fn schedule(s: &switchyard_proto::executor::v1::Schedule, now_ms: u64) -> Value {
    use switchyard_proto::executor::v1::TickOutcome;
    let short = |name: &str| {
        name.split_once("_POLICY_")
            .map_or(name, |(_, v)| v)
            .to_ascii_lowercase()
            .replace('_', "-")
    };
    let ms = |t: &Option<prost_types::Timestamp>| {
        t.as_ref().map_or(0, switchyard_kit::time::timestamp_ms)
    };
    json!({
        "id": s.schedule_id,
        "description": s.description,
        "cron": s.cron,
        "zone": if s.time_zone.is_empty() { "UTC" } else { s.time_zone.as_str() },
        "paused": s.paused,
        "pause_note": s.pause_note,
        "created_by": s.created_by,
        "overlap": short(s.overlap().as_str_name()),
        "catch_up": short(s.catch_up().as_str_name()),
        "next": s.next_fire_times.iter().take(3)
            .map(|t| when(switchyard_kit::time::timestamp_ms(t), now_ms))
            .collect::<Vec<_>>(),
        "ticks": s.recent_ticks.iter().take(5).map(|t| {
            let (text, tone) = match t.outcome() {
                TickOutcome::Started => ("started", "ok"),
                TickOutcome::SkippedOverlap => ("skipped: the previous job still ran", "muted"),
                TickOutcome::SkippedMissed => ("skipped: missed", "muted"),
                TickOutcome::Failed => ("failed", "bad"),
                TickOutcome::Unspecified => ("unknown", "muted"),
            };
            json!({
                "at": when(ms(&t.at), now_ms),
                "outcome": text,
                "tone": tone,
                "job_id": t.job_id,
                "skipped_before": t.skipped_before,
                "error": t.error,
                "cancelled": t.cancelled_job_id,
            })
        }).collect::<Vec<_>>(),
    })
}

/// A webhook delivery as the notifications page shows it.
pub fn delivery(d: &switchyard_proto::executor::v1::Delivery, now_ms: u64) -> Value {
    let ms = |t: &Option<prost_types::Timestamp>| {
        t.as_ref().map_or(0, switchyard_kit::time::timestamp_ms)
    };
    json!({
        "id": d.delivery_id,
        "webhook": d.webhook,
        "event": d.event_type.trim_start_matches("dev.switchyard."),
        "subject": d.subject,
        "dead": d.dead,
        "attempts": d.attempts,
        "next": if d.dead { Value::Null } else { when(ms(&d.next_attempt_at), now_ms) },
        "created": when(ms(&d.created_at), now_ms),
        "last_error": d.last_error,
    })
}

/// A rate-limit bucket as the limits page shows it.
pub fn limit_bucket(b: &switchyard_proto::ledger::v1::LimitBucket, now_ms: u64) -> Value {
    let ms = |t: &Option<prost_types::Timestamp>| {
        t.as_ref().map_or(0, switchyard_kit::time::timestamp_ms)
    };
    json!({
        "limit": b.limit,
        "scope": b.scope,
        "use": b.r#use.iter().map(|u| json!({"dimension": u.dimension, "used": u.used, "limit": u.limit})).collect::<Vec<_>>(),
        "cooldown": b.cooldown_until.as_ref().map(|_| when(ms(&b.cooldown_until), now_ms)),
        "cooldown_why": b.cooldown_why,
        "waiting": b.waiting.iter().map(|w| json!({
            "tenant": w.tenant,
            "calls": w.calls,
            "since": when(ms(&w.since), now_ms),
            "why": w.why,
        })).collect::<Vec<_>>(),
        "granted": b.granted,
        "waits": b.waits,
        "refused": b.refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::ledger::v1::{GroupBy, Interval};

    #[test]
    fn money_shows_dollars_and_keeps_the_exact_micro_usd_figure() {
        for (micro, text) in [
            (0, "$0"),
            (20, "$0.00002"),
            (9_990, "$0.00999"),
            (25_000, "$0.03"),
            (999_999, "$1.00"),
            (1_000_000, "$1.00"),
            (12_345_678, "$12.35"),
            (1_234_567_890_000, "$1,234,567.89"),
            (-1_500_000, "-$1.50"),
        ] {
            let m = money(micro);
            assert_eq!(m["text"], text, "{micro}");
            assert_eq!(m["micro"], micro);
        }
        assert_eq!(money(12_345_678)["title"], "12,345,678 micro-USD");
        assert_eq!(group(-1000), "-1,000");
        assert_eq!(money_of(None), Value::Null);
    }

    #[test]
    fn prices_read_per_unit_when_whole_else_per_million() {
        let call = unit_price(25_000 * 1_000_000);
        assert_eq!(
            (call["text"].as_str(), call["per"].as_str()),
            (Some("$0.03"), Some("unit"))
        );
        let tokens = unit_price(2_500_000);
        assert_eq!(
            (tokens["text"].as_str(), tokens["per"].as_str()),
            (Some("$2.50"), Some("M units"))
        );
        assert_eq!(tokens["title"], "2,500,000 micro-USD per million units");
    }

    #[test]
    fn times_read_relative_and_absolute() {
        let now = 1_764_124_800_000; // 2025-11-26T02:40:00Z
        let t = when(now - 3 * 60_000, now);
        assert_eq!(t["rel"], "3 min ago");
        assert_eq!(t["abs"], "2025-11-26 02:37:00 UTC");
        assert_eq!(t["iso"], "2025-11-26T02:37:00Z");
        assert_eq!(relative(now, now), "just now");
        assert_eq!(relative(now - 42_000, now), "42 s ago");
        assert_eq!(relative(now - 5 * 3_600_000, now), "5 h ago");
        assert_eq!(relative(now - 3 * 86_400_000, now), "3 days ago");
        assert_eq!(relative(now + 120_000, now), "in 2 min");
        assert_eq!(when(0, now), Value::Null);
        assert_eq!(switchyard_kit::time::civil(0), (1970, 1, 1));
        assert_eq!(switchyard_kit::time::civil(11_016), (2000, 2, 29));
    }

    #[test]
    fn every_state_reads_as_one_tone() {
        assert_eq!(tone("succeeded"), "ok");
        assert_eq!(tone("failed"), "bad");
        assert_eq!(tone("running"), "live");
        assert_eq!(tone("waiting"), "wait");
        assert_eq!(tone("pending"), "wait");
    }

    #[test]
    fn the_plan_is_drawn_in_columns_by_the_longest_chain_before_each_task() {
        let t = |id: &str, deps: &[&str]| json!({"id": id, "depends_on": deps, "state": "waiting", "tone": "wait"});
        // a → b → d, a → c → d, and e alone; d listed before c.
        let tasks = [
            t("a", &[]),
            t("b", &["a"]),
            t("d", &["b", "c"]),
            t("c", &["a"]),
            t("e", &[]),
        ];
        let g = dag(&tasks);
        let at: Vec<(u64, u64)> = g["nodes"]
            .as_array()
            .map(|n| {
                n.iter()
                    .map(|n| (n["x"].as_u64().unwrap_or(99), n["y"].as_u64().unwrap_or(99)))
                    .collect()
            })
            .unwrap_or_default();
        let (cx, ry) = ((NODE_W + GAP_X) as u64, (NODE_H + GAP_Y) as u64);
        assert_eq!(at, [(0, 0), (cx, 0), (2 * cx, 0), (cx, ry), (0, ry)]);
        assert_eq!(g["edges"].as_array().map_or(0, Vec::len), 4);
        assert_eq!(g["width"], 3 * cx - GAP_X as u64);
        assert_eq!(g["height"], 2 * ry - GAP_Y as u64);
        // An edge runs from its dependency's right side to the dependant's left.
        assert_eq!(
            g["edges"][0]["d"],
            format!("M{NODE_W},20 C175,20 175,20 {cx},20")
        );
        assert_eq!(dag(&[])["nodes"].as_array().map_or(9, Vec::len), 0);
    }

    fn b(id: &str, parent: &str, limit: Option<i64>, spent: i64, reserved: i64) -> Budget {
        Budget {
            budget_id: id.into(),
            parent_id: parent.into(),
            cost_limit: limit.map(|micro_usd| Money { micro_usd }),
            cost_spent: Some(Money { micro_usd: spent }),
            cost_reserved: Some(Money {
                micro_usd: reserved,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn budgets_nest_under_their_parents_depth_first_open_ones_first() {
        let closed = Budget {
            closed: true,
            ..b("job:0", "team", None, 0, 0)
        };
        let all = [
            b("job:b", "team", None, 0, 0),
            b("team", "org", Some(1_000_000), 250_000, 250_000),
            closed,
            b("org", "", Some(10_000_000), 0, 0),
            b("job:a", "team", None, 0, 0),
            b("orphan", "gone", None, 0, 0),
        ];
        let t = tree(&all);
        let order: Vec<(&str, u64)> = t
            .iter()
            .map(|v| {
                (
                    v["id"].as_str().unwrap_or(""),
                    v["depth"].as_u64().unwrap_or(9),
                )
            })
            .collect();
        assert_eq!(
            order,
            [
                ("org", 0),
                ("team", 1),
                ("job:a", 2),
                ("job:b", 2),
                ("job:0", 2),
                ("orphan", 0)
            ]
        );
        assert_eq!(t[1]["percent"], 50, "spent + reserved over the limit");
        assert_eq!(t[1]["children"], 3);
        assert_eq!(t[2]["percent"], Value::Null, "no limit, no gauge");
    }

    #[test]
    fn a_report_reads_as_bars_with_shares_and_names_what_the_charges_did_not_say() {
        let bucket = |ms: u64, micro_usd: i64, entries: u64| SpendBucket {
            start: Some(switchyard_kit::time::timestamp(ms)),
            cost: Some(Money { micro_usd }),
            tokens: 0,
            entries,
        };
        let r = ReportResponse {
            group_by: GroupBy::Model as i32,
            interval: Interval::Hour as i32,
            groups: vec![
                switchyard_proto::ledger::v1::SpendGroup {
                    key: "gpt-4o-mini".into(),
                    cost: Some(Money { micro_usd: 75 }),
                    tokens: 100,
                    entries: 3,
                },
                switchyard_proto::ledger::v1::SpendGroup {
                    key: String::new(),
                    cost: Some(Money { micro_usd: 25 }),
                    tokens: 0,
                    entries: 1,
                },
            ],
            // All spend in one second of the last hour: one bar, full
            // height, the empty hours drawn as nothing.
            buckets: vec![
                bucket(0, 0, 0),
                bucket(3_600_000, 0, 0),
                bucket(7_200_000, 100, 4),
            ],
            total_cost: Some(Money { micro_usd: 100 }),
            ..Default::default()
        };
        let v = report(&r, 0);
        assert_eq!(v["groups"][0]["share"], 75);
        assert_eq!(v["groups"][1]["label"], "(no model)");
        let bars = v["bars"].as_array().expect("bars");
        assert_eq!(bars.len(), 1);
        assert_eq!(
            (bars[0]["x"].as_str(), bars[0]["h"].as_str()),
            (Some("400.00"), Some("160.00"))
        );
        assert!(
            bars[0]["title"]
                .as_str()
                .unwrap_or_default()
                .contains("100 micro-USD")
        );
        assert_eq!(
            (v["interval"].as_str(), v["buckets"].as_u64()),
            (Some("hour"), Some(3))
        );
    }

    #[test]
    fn the_waterfall_draws_each_attempt_on_one_axis_and_a_retry_in_red_then_green() {
        use switchyard_proto::executor::v1::{Attempt, JobSpec, TaskState};
        let t = switchyard_kit::time::timestamp;
        let attempt = |n: u32, s: u64, e: u64, error: &str| Attempt {
            number: n,
            agent_id: "builtin".into(),
            started_at: Some(t(s)),
            finished_at: Some(t(e)),
            error: error.into(),
            ..Default::default()
        };
        let spec = |id: &str| TaskSpec {
            id: id.into(),
            ..Default::default()
        };
        let job = Job {
            spec: Some(JobSpec {
                tasks: vec![spec("a"), spec("b"), spec("c")],
                ..Default::default()
            }),
            tasks: vec![
                TaskStatus {
                    task_id: "a".into(),
                    state: TaskState::Succeeded as i32,
                    attempts: vec![attempt(1, 1_000, 1_100, "")],
                    ..Default::default()
                },
                TaskStatus {
                    task_id: "b".into(),
                    state: TaskState::Succeeded as i32,
                    attempts: vec![
                        attempt(1, 1_100, 1_200, "fails once"),
                        attempt(2, 1_300, 1_600, ""),
                    ],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let calls = [Call {
            task_id: "b".into(),
            label: "model m, turn 1".into(),
            start: 1_350,
            end: 1_450,
            outcome: "ok".into(),
        }];
        let w = waterfall(&job, &calls, 5_000).expect("something ran");
        assert_eq!(w["span"], "600 ms");
        let rows = w["rows"].as_array().expect("rows");
        assert_eq!(
            rows.len(),
            4,
            "every step has a row, one not started too, and the call"
        );
        assert_eq!(
            (rows[2]["call"].as_bool(), rows[2]["id"].as_str()),
            (Some(true), Some("model m, turn 1"))
        );
        assert_eq!(rows[2]["bars"][0]["x"], "350.00");
        let b = rows[1]["bars"].as_array().expect("bars");
        assert_eq!(
            (b[0]["x"].as_str(), b[0]["w"].as_str()),
            (Some("100.00"), Some("100.00"))
        );
        assert_eq!(
            (b[0]["tone"].as_str(), b[1]["tone"].as_str()),
            (Some("bad"), Some("ok"))
        );
        assert!(
            b[0]["title"]
                .as_str()
                .unwrap_or_default()
                .contains("failed: fails once")
        );
        assert_eq!(rows[3]["bars"].as_array().map(Vec::len), Some(0));
        assert!(waterfall(&Job::default(), &[], 0).is_none());
    }

    #[test]
    fn a_call_is_read_from_the_event_that_ended_it() {
        let e = switchyard_proto::common::v1::Event {
            task_id: "t".into(),
            kind: "llm.tool_call".into(),
            time: Some(switchyard_kit::time::timestamp(10_000)),
            data: switchyard_kit::json::json_to_struct(
                &json!({"name": "fs__write_file", "duration_ms": 6, "status": "ok"}),
            ),
            ..Default::default()
        };
        let c = Call::of(&e).expect("a call");
        assert_eq!(
            (c.label.as_str(), c.start, c.end, c.outcome.as_str()),
            ("tool fs__write_file", 9_994, 10_000, "ok")
        );
        let other = switchyard_proto::common::v1::Event {
            kind: "task.state".into(),
            ..e
        };
        assert!(Call::of(&other).is_none());
    }
}
