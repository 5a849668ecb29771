//! Agents the executor hosts itself, for tests, demos and benchmarks. They
//! are registered with the registry and routed like any other agent (no
//! shortcut around the router, the ledger or the event log); only the
//! transport is in-process when the chosen endpoint is this executor's own.

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_agent_sdk::{Agent, Invocation, Progress, input_json, respond};
use switchyard_proto::agent::v1::AgentResponse;
use switchyard_proto::registry::v1::{AgentSpec, Capability, IntegrationMode};

/// Registry id of the built-in agent.
pub const AGENT_ID: &str = "builtin";

/// The capabilities offered.
pub const CAPABILITIES: &[&str] = &[
    "builtin.echo",
    "builtin.noop",
    "builtin.sleep",
    "builtin.fail_once",
    "builtin.fail_always",
];

/// The registry entry, served at `endpoint`.
pub fn spec(endpoint: &str) -> AgentSpec {
    AgentSpec {
        id: AGENT_ID.into(),
        name: "Switchyard built-in agents".into(),
        description: "Test and demo agents hosted by the executor: echo returns its input, \
                      noop does nothing, sleep waits input.ms, fail_once fails the first \
                      attempt, fail_always always fails."
            .into(),
        endpoint: endpoint.into(),
        capabilities: CAPABILITIES
            .iter()
            .map(|c| Capability {
                name: (*c).into(),
                proficiency: Some(1.0),
                price_per_unit_micro_usd: 0,
                unit: "call".into(),
            })
            .collect(),
        trust_score: 100,
        max_concurrency: 0,
        integration_mode: IntegrationMode::Tool as i32,
        latency_estimate_ms: 1,
        ..Default::default()
    }
}

/// The built-in agents.
#[derive(Debug, Default, Clone, Copy)]
pub struct Builtins;

#[tonic::async_trait]
impl Agent for Builtins {
    async fn invoke(&self, req: Invocation, progress: Progress) -> AgentResponse {
        let input = input_json(&req);
        let attempt = req.context.as_ref().map_or(1, |c| c.attempt);
        match req.capability.as_str() {
            "builtin.echo" => {
                let text = match input.get("text") {
                    Some(Value::String(s)) => s.clone(),
                    _ => input.to_string(),
                };
                progress.chunk(text.clone()).await;
                respond::success(text, Some(input))
            }
            "builtin.noop" => respond::success("", None),
            "builtin.sleep" => {
                let ms = input
                    .get("ms")
                    .and_then(Value::as_u64)
                    .unwrap_or(100)
                    .min(3_600_000);
                progress.send(format!("sleeping {ms} ms"), Some(0)).await;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                respond::success(format!("slept {ms} ms"), Some(json!({ "slept_ms": ms })))
            }
            "builtin.fail_once" if attempt <= 1 => {
                respond::error("builtin.fail_once fails its first attempt")
            }
            "builtin.fail_once" => respond::success(
                format!("succeeded on attempt {attempt}"),
                Some(json!({ "attempt": attempt })),
            ),
            "builtin.fail_always" => respond::error("builtin.fail_always always fails"),
            other => respond::refused(format!("the built-in agent does not offer {other:?}")),
        }
    }
}
