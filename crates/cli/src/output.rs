//! Output: aligned tables for people, JSON (proto field names) for scripts.

use serde_json::{Value, json};
use switchyard_proto::registry::v1::{
    Agent, AgentStatus, CapabilityStats, McpServer, McpServerInfo, McpServerState, Tool, mcp_server,
};
use switchyard_proto::router::v1::{Candidate, RouteResponse};

/// Output format of client commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns.
    Table,
    /// JSON, one document.
    Json,
}

/// Prints rows under headers with columns padded to the widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(headers.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// A proto enum value's short lowercase name (`RUN_STATUS_PROPOSED` → `proposed`).
pub fn short_name(full: Option<&str>, prefix: &str) -> String {
    full.map_or_else(
        || "unknown".into(),
        |n| n.trim_start_matches(prefix).to_ascii_lowercase(),
    )
}

/// Prints a JSON document, its fractions rounded to 6 decimals (scores and
/// rates are `float`s in the protos: 0.709 must not print as
/// 0.7090000000000001).
pub fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(&rounded(v)).unwrap_or_default()
    );
}

/// Every list command's JSON: `{"items": [...], "next_page_token": ""}`
/// (the token is empty when there is no further page).
pub fn print_list(items: Vec<Value>, next_page_token: &str) {
    print_json(&json!({"items": items, "next_page_token": next_page_token}));
}

fn rounded(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => n
            .as_f64()
            .map(|f| (f * 1e6).round() / 1e6)
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| v.clone(), Value::Number),
        Value::Array(a) => Value::Array(a.iter().map(rounded).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), rounded(v))).collect()),
        other => other.clone(),
    }
}

fn ts(t: &Option<prost_types::Timestamp>) -> Value {
    t.as_ref().map_or(Value::Null, |t| {
        json!(switchyard_kit::time::timestamp_ms(t))
    })
}

/// Status as its short lowercase name.
pub fn status_name(s: i32) -> &'static str {
    match AgentStatus::try_from(s) {
        Ok(AgentStatus::Available) => "available",
        Ok(AgentStatus::Lapsed) => "lapsed",
        _ => "unknown",
    }
}

fn stats_json(s: &CapabilityStats) -> Value {
    json!({"capability": s.capability, "count": s.count, "successes": s.successes,
           "success_rate": s.success_rate, "ewma_latency_ms": s.ewma_latency_ms})
}

/// An agent as JSON.
pub fn agent_json(a: &Agent) -> Value {
    let spec = a.spec.clone().unwrap_or_default();
    json!({
        "id": spec.id, "name": spec.name, "description": spec.description, "endpoint": spec.endpoint,
        "capabilities": spec.capabilities.iter().map(|c| json!({
            "name": c.name, "proficiency": c.proficiency.unwrap_or(1.0),
            "price_per_unit_micro_usd": c.price_per_unit_micro_usd, "unit": c.unit})).collect::<Vec<_>>(),
        "trust_score": spec.trust_score, "max_concurrency": spec.max_concurrency,
        "labels": spec.labels, "models": spec.models, "uses_tools": spec.uses_tools,
        "latency_estimate_ms": spec.latency_estimate_ms,
        "integration_mode": if spec.integration_mode == 2 { "handoff" } else { "tool" },
        "status": status_name(a.status), "in_flight": a.in_flight,
        "lease_expires_at_ms": ts(&a.lease_expires_at), "registered_at_ms": ts(&a.registered_at),
        "updated_at_ms": ts(&a.updated_at),
        "stats": a.stats.iter().map(stats_json).collect::<Vec<_>>(),
        "a2a": spec.a2a.as_ref().map(|b| json!({
            "card_url": b.card_url, "protocol_version": b.protocol_version, "streaming": b.streaming,
            "card_signed_by": b.card_signed_by, "card_keys_pinned": !b.card_keys.is_empty()})),
    })
}

/// A tool as JSON.
pub fn tool_json(t: &Tool) -> Value {
    json!({"name": t.name, "description": t.description, "endpoint": t.endpoint,
           "mcp_server": t.mcp_server, "mcp_tool": t.mcp_tool,
           "parameters": t.parameters.as_ref().map_or(Value::Null, switchyard_kit::json::struct_to_json)})
}

/// How an MCP server is reached, for people: `stdio: node a.js` or the URL
/// (with the secret's name, never a token).
fn mcp_transport(s: &McpServer) -> String {
    match &s.transport {
        Some(mcp_server::Transport::Stdio(st)) => {
            format!("stdio: {} {}", st.command, st.args.join(" "))
                .trim_end()
                .to_owned()
        }
        Some(mcp_server::Transport::Http(h)) if h.bearer_secret.is_empty() => h.url.clone(),
        Some(mcp_server::Transport::Http(h)) => format!("{} (secret {})", h.url, h.bearer_secret),
        None => "-".into(),
    }
}

fn mcp_state(i: &McpServerInfo) -> &'static str {
    match McpServerState::try_from(i.state) {
        Ok(McpServerState::Connected) => "connected",
        Ok(McpServerState::Disconnected) => "disconnected",
        _ => "unknown",
    }
}

/// An MCP server as JSON.
pub fn mcp_json(i: &McpServerInfo) -> Value {
    let s = i.server.clone().unwrap_or_default();
    json!({"name": s.name, "description": s.description, "transport": mcp_transport(&s),
           "tenant": s.tenant, "owner": s.owner, "state": mcp_state(i),
           "state_message": i.state_message, "tools": i.tools,
           "server_version": i.server_version, "protocol_version": i.protocol_version})
}

/// An MCP server as a table row: NAME STATE TRANSPORT TOOLS SERVER.
pub fn mcp_row(i: &McpServerInfo) -> Vec<String> {
    let s = i.server.clone().unwrap_or_default();
    let state = if i.state_message.is_empty() {
        mcp_state(i).to_owned()
    } else {
        format!("{} ({})", mcp_state(i), i.state_message)
    };
    vec![
        s.name.clone(),
        state,
        mcp_transport(&s),
        i.tools.len().to_string(),
        i.server_version.clone(),
    ]
}

fn candidate_json(c: &Candidate) -> Value {
    let b = c.breakdown.clone().unwrap_or_default();
    json!({"agent_id": c.agent_id, "endpoint": c.endpoint, "score": c.score,
           "price_per_unit_micro_usd": c.price_per_unit_micro_usd, "unit": c.unit, "trust_score": c.trust_score,
           "breakdown": {"capability_match": b.capability_match, "trust": b.trust, "latency": b.latency,
                         "cost": b.cost, "preference": b.preference, "latency_ms": b.latency_ms,
                         "latency_observed": b.latency_observed, "matched_capability": b.matched_capability}})
}

/// A route response as JSON.
pub fn route_json(r: &RouteResponse) -> Value {
    json!({"candidates": r.candidates.iter().map(candidate_json).collect::<Vec<_>>(), "filtered": r.filtered})
}

pub use switchyard_kit::money::{usd, usd_compact};

/// A money amount given at the CLI: dollars (`12`, `0.42`, `$1.000001`),
/// or micro-USD with an explicit suffix (`420000micro`, `420000µ`), exactly.
pub fn parse_money(s: &str) -> Result<i64, String> {
    let t = s.trim();
    match t.strip_suffix("micro").or_else(|| t.strip_suffix('µ')) {
        Some(n) => n
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| format!("{s:?} is not a whole number of micro-USD like 420000micro")),
        None => parse_usd(s),
    }
}

/// A time given at the CLI (`--since 7d`, `--until 2026-11-29T14:00:00Z`)
/// as epoch milliseconds: an age (that long before now), a UTC date or a
/// UTC time; anything else is a usage error saying what is expected.
pub fn parse_time(s: &str) -> Result<u64, String> {
    switchyard_kit::time::parse_instant(s, switchyard_kit::time::now_ms())
}

/// A dollar amount (`12`, `0.42`, `$1.000001`) as micro-USD, exactly.
pub use switchyard_core::money::parse_usd;

/// An artifact's kind as the CLI shows it (`changeset_bundle`, ...).
pub fn artifact_kind(k: i32) -> &'static str {
    switchyard_api::artifacts::kind_of(k).as_str()
}

/// Lists artifacts, and with `out` writes each under `out/<path>` byte for
/// byte (`content` fetches one). A path that would leave `out` is refused.
pub async fn artifacts<F, Fut>(
    list: &[switchyard_proto::common::v1::Artifact],
    out: Option<&std::path::Path>,
    format: Format,
    content: F,
) -> anyhow::Result<()>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<u8>>>,
{
    let mut written = Vec::new();
    if let Some(dir) = out {
        for a in list {
            let rel = std::path::Path::new(&a.path);
            let plain = rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain {
                anyhow::bail!(
                    "refusing to write artifact path {:?}: it is not a plain relative path",
                    a.path
                );
            }
            let bytes = content(a.artifact_id.clone()).await?;
            let file = dir.join(rel);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| anyhow::anyhow!("creating {}: {e}", parent.display()))?;
            }
            std::fs::write(&file, &bytes)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", file.display()))?;
            written.push(file.display().to_string());
        }
    }
    match format {
        Format::Json => print_json(&json!({"items": list.iter().map(|a| json!({
            "artifact_id": a.artifact_id, "path": a.path, "name": a.name,
            "kind": artifact_kind(a.kind), "media_type": a.media_type,
            "size_bytes": a.size_bytes, "task_id": a.task_id,
        })).collect::<Vec<_>>(), "written": written})),
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|a| {
                    vec![
                        a.path.clone(),
                        artifact_kind(a.kind).to_owned(),
                        a.media_type.clone(),
                        a.size_bytes.to_string(),
                        a.artifact_id.chars().take(19).collect(),
                    ]
                })
                .collect();
            table(&["PATH", "KIND", "MEDIA_TYPE", "BYTES", "ID"], &rows);
            for w in &written {
                eprintln!("wrote {w}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fractions_print_short() {
        let v = json!({"a": [0.709_f32 as f64, 1], "b": {"c": 0.1 + 0.2}});
        assert_eq!(rounded(&v).to_string(), r#"{"a":[0.709,1],"b":{"c":0.3}}"#);
    }

    #[test]
    fn dollars_parse_exactly_and_format_back() {
        assert_eq!(parse_usd("12.50"), Ok(12_500_000));
        assert_eq!(parse_usd("$0.000001"), Ok(1));
        assert_eq!(parse_usd("0.42"), Ok(420_000));
        assert_eq!(parse_usd("7"), Ok(7_000_000));
        for bad in [
            "",
            "-1",
            "1.",
            ".5",
            "1.2345678",
            "abc",
            "1e3",
            "99999999999999999",
        ] {
            assert!(parse_usd(bad).is_err(), "{bad}");
        }
        assert_eq!(usd(12_500_000), "$12.500000");
        assert_eq!(usd_compact(3_000_000), "$3");
        assert_eq!(usd_compact(150_000), "$0.15");
        assert_eq!(usd_compact(0), "$0");
        assert_eq!(parse_money("0.42"), Ok(420_000));
        assert_eq!(parse_money("420000micro"), Ok(420_000));
        assert_eq!(parse_money("5µ"), Ok(5));
        assert!(parse_money("1.5micro").is_err());
        assert!(parse_money("-5micro").is_err());
        assert_eq!(usd(-1), "-$0.000001");
    }
}
