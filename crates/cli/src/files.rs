//! Agent and tool definitions as users write them (YAML or JSON), converted
//! to the protobuf messages. Unknown keys are errors, so a typo is caught
//! before anything is sent.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;
use switchyard_proto::registry::v1::{AgentSpec, Capability, IntegrationMode, Tool};

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
