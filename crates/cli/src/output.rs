//! Output: aligned tables for people, JSON (proto field names) for scripts.

use serde_json::{Value, json};
use switchyard_proto::registry::v1::{Agent, AgentStatus, CapabilityStats, Tool};
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

/// Prints a JSON document.
pub fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
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
    })
}

/// A tool as JSON.
pub fn tool_json(t: &Tool) -> Value {
    json!({"name": t.name, "description": t.description, "endpoint": t.endpoint,
           "parameters": t.parameters.as_ref().map_or(Value::Null, switchyard_kit::json::struct_to_json)})
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

/// Micro-USD as dollars for tables.
pub fn usd(micro: i64) -> String {
    format!("${}.{:06}", micro / 1_000_000, (micro % 1_000_000).abs())
}
