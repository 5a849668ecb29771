//! Agent and tool definitions as users write them (YAML or JSON), converted
//! to the protobuf messages. Unknown keys are errors, so a typo is caught
//! before anything is sent.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;
use switchyard_proto::approval::v1::{ContextPack, CostEstimate, Run, Target};
use switchyard_proto::common::v1::Money;
use switchyard_proto::registry::v1::{
    AgentSpec, Capability, IntegrationMode, McpHttp, McpServer, McpStdio, RegisterA2aAgentRequest,
    Tool, mcp_server,
};

/// One capability in an agent file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilityFile {
    name: String,
    #[serde(default)]
    proficiency: Option<f64>,
    #[serde(default)]
    price_per_unit_micro_usd: i64,
    #[serde(default)]
    unit: String,
}

/// An agent registration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    endpoint: String,
    capabilities: Vec<CapabilityFile>,
    #[serde(default)]
    trust_score: u32,
    #[serde(default)]
    max_concurrency: u32,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    integration_mode: Option<String>,
    #[serde(default)]
    models: Vec<String>,
    #[serde(default)]
    uses_tools: Vec<String>,
    #[serde(default)]
    latency_estimate_ms: u32,
    /// The agent reserves and commits its own model usage on the job budget.
    #[serde(default)]
    bills_tokens: bool,
}

/// A tool definition file (seed 000's tool shape plus an endpoint).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFile {
    name: String,
    #[serde(default)]
    description: String,
    parameters: serde_json::Value,
    #[serde(default)]
    endpoint: String,
}

/// The `target` of a run file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetFile {
    org: String,
    #[serde(default)]
    repo: String,
    work_item_ids: Vec<String>,
}

/// The `context_pack` of a run file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextPackFile {
    pack_id: String,
    hash: String,
    version: String,
    #[serde(default)]
    inputs: Vec<String>,
}

/// The `cost_estimate` of a run file; money as `estimated_usd` (a decimal
/// such as `0.42`, never rounded through a float) or `estimated_micro_usd`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostEstimateFile {
    #[serde(default)]
    estimated_input_tokens: u64,
    #[serde(default)]
    estimated_output_tokens: u64,
    #[serde(default)]
    estimated_usd: Option<serde_json::Value>,
    #[serde(default)]
    estimated_micro_usd: Option<i64>,
}

/// An AgentRunSpec file: seed 004's JSON shape (status and server-set
/// fields are not accepted).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    schema_version: String,
    #[serde(default)]
    run_id: String,
    #[serde(default)]
    created_by: String,
    #[serde(default)]
    requires_approval: Option<bool>,
    target: TargetFile,
    intent: String,
    context_pack: ContextPackFile,
    model: String,
    max_tokens: u64,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    cost_estimate: Option<CostEstimateFile>,
    tools_allowed: Vec<String>,
    outputs_allowed: Vec<String>,
    #[serde(default)]
    max_retries: Option<u32>,
    #[serde(default)]
    job_id: String,
}

impl RunFile {
    /// Reads a run file.
    pub fn read(path: &Path) -> anyhow::Result<RunFile> {
        parse(path)
    }

    /// The run message.
    pub fn into_run(self) -> anyhow::Result<Run> {
        if self.requires_approval == Some(false) {
            anyhow::bail!(
                "requires_approval must be true: every run that can spend needs approval"
            );
        }
        let cost_estimate = match self.cost_estimate {
            None => None,
            Some(c) => {
                let micro = match (c.estimated_usd, c.estimated_micro_usd) {
                    (Some(_), Some(_)) => {
                        anyhow::bail!("give estimated_usd or estimated_micro_usd, not both")
                    }
                    (Some(serde_json::Value::String(s)), None) => {
                        Some(crate::output::parse_usd(&s))
                    }
                    (Some(serde_json::Value::Number(n)), None) => {
                        Some(crate::output::parse_usd(&n.to_string()))
                    }
                    (Some(other), None) => {
                        anyhow::bail!("estimated_usd must be a number like 0.42, got {other}")
                    }
                    (None, m) => m.map(Ok),
                };
                Some(CostEstimate {
                    estimated_input_tokens: c.estimated_input_tokens,
                    estimated_output_tokens: c.estimated_output_tokens,
                    estimated_cost: micro
                        .transpose()
                        .map_err(|e| anyhow::anyhow!("cost_estimate.estimated_usd: {e}"))?
                        .map(|micro_usd| Money { micro_usd }),
                })
            }
        };
        Ok(Run {
            schema_version: self.schema_version,
            run_id: self.run_id,
            created_by: self.created_by,
            target: Some(Target {
                org: self.target.org,
                repo: self.target.repo,
                work_item_ids: self.target.work_item_ids,
            }),
            intent: self.intent,
            context_pack: Some(ContextPack {
                pack_id: self.context_pack.pack_id,
                hash: self.context_pack.hash,
                version: self.context_pack.version,
                inputs: self.context_pack.inputs,
            }),
            model: self.model,
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            cost_estimate,
            tools_allowed: self.tools_allowed,
            outputs_allowed: self.outputs_allowed,
            max_retries: self.max_retries,
            job_id: self.job_id,
            ..Default::default()
        })
    }
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let is_json =
        path.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
    if is_json {
        serde_json::from_str(&text).with_context(|| format!("parsing {} as JSON", path.display()))
    } else {
        serde_saphyr::from_str(&text)
            .map_err(|e| anyhow::anyhow!("parsing {} as YAML: {e}", path.display()))
    }
}

impl AgentFile {
    /// Reads an agent file.
    pub fn read(path: &Path) -> anyhow::Result<AgentFile> {
        parse(path)
    }

    /// The registration message.
    pub fn into_spec(self) -> anyhow::Result<AgentSpec> {
        let mode = match self.integration_mode.as_deref() {
            None | Some("tool") => IntegrationMode::Tool,
            Some("handoff") => IntegrationMode::Handoff,
            Some(other) => {
                anyhow::bail!("integration_mode must be \"tool\" or \"handoff\", got {other:?}")
            }
        };
        Ok(AgentSpec {
            id: self.id,
            name: self.name,
            description: self.description,
            endpoint: self.endpoint,
            capabilities: self
                .capabilities
                .into_iter()
                .map(|c| Capability {
                    name: c.name,
                    proficiency: c.proficiency,
                    price_per_unit_micro_usd: c.price_per_unit_micro_usd,
                    unit: c.unit,
                })
                .collect(),
            trust_score: self.trust_score,
            max_concurrency: self.max_concurrency,
            labels: self.labels.into_iter().collect(),
            integration_mode: mode as i32,
            models: self.models,
            uses_tools: self.uses_tools,
            latency_estimate_ms: self.latency_estimate_ms,
            bills_tokens: self.bills_tokens,
            a2a: None,
        })
    }
}

/// An A2A agent registration file: its Agent Card's URL, and what
/// Switchyard decides about it (id, trust, price, limits, labels).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aAgentFile {
    card_url: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    trust_score: u32,
    #[serde(default)]
    price_per_unit_micro_usd: i64,
    #[serde(default)]
    unit: String,
    #[serde(default)]
    max_concurrency: u32,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    latency_estimate_ms: u32,
    /// The public keys trusted to sign the card: a JWKS document, inline.
    #[serde(default)]
    card_keys: Option<serde_json::Value>,
    /// The same, from a JSON file (relative to this file's directory).
    #[serde(default)]
    card_keys_file: Option<std::path::PathBuf>,
}

impl A2aAgentFile {
    /// Reads an A2A agent file (and the key set it names, if any).
    pub fn read(path: &Path) -> anyhow::Result<A2aAgentFile> {
        let mut f: A2aAgentFile = parse(path)?;
        if let Some(keys) = f.card_keys_file.take() {
            anyhow::ensure!(
                f.card_keys.is_none(),
                "{}: give card_keys or card_keys_file, not both",
                path.display()
            );
            let at = path.parent().unwrap_or(Path::new(".")).join(keys);
            let text = std::fs::read_to_string(&at)
                .with_context(|| format!("reading card_keys_file {}", at.display()))?;
            let jwks = serde_json::from_str(&text)
                .with_context(|| format!("card_keys_file {} is not JSON", at.display()))?;
            f.card_keys = Some(jwks);
        }
        Ok(f)
    }

    /// The registration request.
    pub fn into_request(self) -> RegisterA2aAgentRequest {
        RegisterA2aAgentRequest {
            card_url: self.card_url,
            id: self.id,
            trust_score: self.trust_score,
            price_per_unit_micro_usd: self.price_per_unit_micro_usd,
            unit: self.unit,
            max_concurrency: self.max_concurrency,
            labels: self.labels.into_iter().collect(),
            latency_estimate_ms: self.latency_estimate_ms,
            card_keys: self.card_keys.map(|k| k.to_string()).unwrap_or_default(),
        }
    }
}

/// An MCP server registration file: a name, and exactly one of `stdio`
/// (an allowlisted program) or `http` (a URL and an optional configured
/// bearer secret's name).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerFile {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    stdio: Option<McpStdioFile>,
    #[serde(default)]
    http: Option<McpHttpFile>,
}

/// `stdio` of an MCP server file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpStdioFile {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

/// `http` of an MCP server file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpHttpFile {
    url: String,
    #[serde(default)]
    bearer_secret: String,
}

impl McpServerFile {
    /// Reads an MCP server file.
    pub fn read(path: &Path) -> anyhow::Result<McpServerFile> {
        parse(path)
    }

    /// The registration message.
    pub fn into_server(self) -> anyhow::Result<McpServer> {
        let transport = match (self.stdio, self.http) {
            (Some(s), None) => mcp_server::Transport::Stdio(McpStdio {
                command: s.command,
                args: s.args,
                env: s.env.into_iter().collect(),
            }),
            (None, Some(h)) => mcp_server::Transport::Http(McpHttp {
                url: h.url,
                bearer_secret: h.bearer_secret,
            }),
            _ => anyhow::bail!("an MCP server file needs exactly one of stdio or http"),
        };
        Ok(McpServer {
            name: self.name,
            description: self.description,
            transport: Some(transport),
            ..Default::default()
        })
    }
}

impl ToolFile {
    /// Reads a tool file.
    pub fn read(path: &Path) -> anyhow::Result<ToolFile> {
        parse(path)
    }

    /// The tool message.
    pub fn into_tool(self) -> anyhow::Result<Tool> {
        let parameters = switchyard_kit::json::json_to_struct(&self.parameters)
            .ok_or_else(|| anyhow::anyhow!("tool parameters must be a JSON Schema object"))?;
        Ok(Tool {
            name: self.name,
            description: self.description,
            parameters: Some(parameters),
            endpoint: self.endpoint,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_agent_parses_into_a_valid_registration() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/agents");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let spec = AgentFile::read(&path).unwrap().into_spec().unwrap();
                let v = switchyard_registry::validate::agent_spec(&spec, |_| true);
                assert!(v.is_empty(), "{}: {v}", path.display());
                n += 1;
            }
        }
        assert!(n >= 4, "expected the example agents, found {n}");
    }

    #[test]
    fn example_tools_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tools");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let tool = ToolFile::read(&path).unwrap().into_tool().unwrap();
            let (v, _) = switchyard_registry::validate::tool(&tool);
            assert!(v.is_empty(), "{}: {v}", path.display());
        }
    }

    #[test]
    fn example_mcp_servers_parse_into_registrations_with_one_transport() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/mcp");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let s = McpServerFile::read(&path).unwrap().into_server().unwrap();
                assert!(s.transport.is_some(), "{}", path.display());
                n += 1;
            }
        }
        assert_eq!(n, 2);
        let both = "name: x\nstdio: {command: node}\nhttp: {url: 'http://h/'}\n";
        let f: McpServerFile = serde_saphyr::from_str(both).unwrap();
        let err = f.into_server().unwrap_err().to_string();
        assert!(err.contains("exactly one of stdio or http"), "{err}");
    }

    #[test]
    fn the_example_a2a_registration_parses() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/a2a/text-tricks.yaml"
        );
        let req = A2aAgentFile::read(Path::new(path)).unwrap().into_request();
        assert!(req.card_url.ends_with("/.well-known/agent-card.json"));
        assert_eq!(req.price_per_unit_micro_usd, 1_000);
    }

    #[test]
    fn example_runs_parse_into_valid_proposals_with_exact_money() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/runs");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let run = RunFile::read(&path).unwrap().into_run().unwrap();
            assert_eq!(
                run.schema_version,
                "agent_run_spec/v1",
                "{}",
                path.display()
            );
            n += 1;
        }
        assert!(n >= 2);
        let p = std::path::Path::new(dir).join("draft_docs.json");
        let run = RunFile::read(&p).unwrap().into_run().unwrap();
        let cost = run.cost_estimate.unwrap().estimated_cost.unwrap().micro_usd;
        assert_eq!(cost, 420_000, "0.42 USD without float rounding");
    }

    #[test]
    fn unknown_keys_and_bad_modes_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.yaml");
        std::fs::write(
            &p,
            "id: a\nendpoint: http://x:1\ncapabilities: [{name: x}]\ntrust: 5\n",
        )
        .unwrap();
        let e = AgentFile::read(&p).unwrap_err().to_string();
        assert!(e.contains("trust"), "{e}");
        std::fs::write(
            &p,
            "id: a\nendpoint: http://x:1\ncapabilities: [{name: x}]\nintegration_mode: loop\n",
        )
        .unwrap();
        let e = AgentFile::read(&p)
            .unwrap()
            .into_spec()
            .unwrap_err()
            .to_string();
        assert!(e.contains("integration_mode"), "{e}");
    }
}
