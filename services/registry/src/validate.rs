//! Validation of registry requests into field violations.

use std::collections::HashSet;

use switchyard_core::{Violations, validate};
use switchyard_proto::registry::v1::{AgentSpec, Tool};

/// Longest description accepted (descriptions go into LLM prompts).
pub const MAX_DESCRIPTION: usize = 8192;

fn label_key(k: &str) -> Result<(), String> {
    let ok = !k.is_empty()
        && k.len() <= 63
        && k.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-' | b'/')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "label key {k:?} must be 1-63 characters of [a-z0-9._/-]"
        ))
    }
}

/// Checks an agent registration. `tool_exists` answers whether a tool name is
/// registered (for `uses_tools`).
pub fn agent_spec(a: &AgentSpec, tool_exists: impl Fn(&str) -> bool) -> Violations {
    let mut v = Violations::new();
    v.check("agent.id", validate::agent_id(&a.id));
    if a.name.len() > 256 {
        v.add("agent.name", "name must be at most 256 characters");
    }
    if a.description.len() > MAX_DESCRIPTION {
        v.add(
            "agent.description",
            format!("description must be at most {MAX_DESCRIPTION} characters"),
        );
    }
    v.check("agent.endpoint", validate::endpoint(&a.endpoint));
    if a.capabilities.is_empty() {
        v.add("agent.capabilities", "at least one capability is required");
    }
    let mut seen = HashSet::new();
    for (i, c) in a.capabilities.iter().enumerate() {
        let f = format!("agent.capabilities[{i}]");
        v.check(format!("{f}.name"), validate::capability(&c.name));
        if !seen.insert(c.name.as_str()) {
            v.add(
                format!("{f}.name"),
                format!("capability {:?} is listed twice", c.name),
            );
        }
        if let Some(p) = c.proficiency {
            v.check(
                format!("{f}.proficiency"),
                validate::in_range(p, 0.0, 1.0, "proficiency"),
            );
        }
        if c.price_per_unit_micro_usd < 0 {
            v.add(
                format!("{f}.price_per_unit_micro_usd"),
                "price must not be negative",
            );
        }
        if c.unit.len() > 64 {
            v.add(format!("{f}.unit"), "unit must be at most 64 characters");
        }
    }
    if a.trust_score > 100 {
        v.add(
            "agent.trust_score",
            format!(
                "trust score must be between 0 and 100, got {}",
                a.trust_score
            ),
        );
    }
    for (k, val) in &a.labels {
        v.check(format!("agent.labels[{k}]"), label_key(k));
        if val.len() > 256 {
            v.add(
                format!("agent.labels[{k}]"),
                "label value must be at most 256 characters",
            );
        }
    }
    for (i, m) in a.models.iter().enumerate() {
        if m.trim().is_empty() || m.len() > 256 {
            v.add(
                format!("agent.models[{i}]"),
                "model ids must be 1-256 characters",
            );
        }
    }
    let mut seen = HashSet::new();
    for (i, t) in a.uses_tools.iter().enumerate() {
        let f = format!("agent.uses_tools[{i}]");
        if let Err(e) = validate::tool_name(t) {
            v.add(f, e);
        } else if !seen.insert(t.as_str()) {
            v.add(f, format!("tool {t:?} is listed twice"));
        } else if !tool_exists(t) {
            v.add(
                f,
                format!("tool {t:?} is not registered; register it first"),
            );
        }
    }
    v
}

/// Checks a tool definition, including that `parameters` is a valid JSON
/// Schema. Returns the violations and whether the schema was the problem.
pub fn tool(t: &Tool) -> (Violations, bool) {
    let mut v = Violations::new();
    v.check("tool.name", validate::tool_name(&t.name));
    if t.description.len() > MAX_DESCRIPTION {
        v.add(
            "tool.description",
            format!("description must be at most {MAX_DESCRIPTION} characters"),
        );
    }
    if !t.endpoint.is_empty() {
        v.check("tool.endpoint", validate::endpoint(&t.endpoint));
    }
    let mut schema_bad = false;
    match &t.parameters {
        None => {
            v.add(
                "tool.parameters",
                "parameters (a JSON Schema object) is required",
            );
        }
        Some(p) => {
            let schema = switchyard_kit::json::struct_to_json(p);
            if let Err(e) = jsonschema::meta::validate(&schema) {
                schema_bad = true;
                v.add("tool.parameters", format!("not a valid JSON Schema: {e}"));
            } else if let Err(e) = jsonschema::validator_for(&schema) {
                schema_bad = true;
                v.add("tool.parameters", format!("not a usable JSON Schema: {e}"));
            }
        }
    }
    (v, schema_bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::registry::v1::Capability;

    pub(crate) fn spec(id: &str) -> AgentSpec {
        AgentSpec {
            id: id.into(),
            name: "Agent".into(),
            endpoint: "http://127.0.0.1:7700".into(),
            capabilities: vec![Capability {
                name: "nlp.analysis".into(),
                ..Default::default()
            }],
            trust_score: 80,
            ..Default::default()
        }
    }

    fn fields(v: &Violations) -> Vec<&str> {
        v.0.iter().map(|f| f.field.as_str()).collect()
    }

    #[test]
    fn valid_agent_has_no_violations() {
        assert!(agent_spec(&spec("nlp_1"), |_| true).is_empty());
    }

    #[test]
    fn every_bad_agent_field_is_reported_at_once() {
        let mut a = spec("Bad-Id");
        a.endpoint = "localhost:80".into();
        a.trust_score = 101;
        a.capabilities.push(Capability {
            name: "NLP".into(),
            proficiency: Some(1.5),
            price_per_unit_micro_usd: -1,
            ..Default::default()
        });
        a.capabilities.push(Capability {
            name: "nlp.analysis".into(),
            ..Default::default()
        });
        a.labels.insert("Bad Key".into(), "v".into());
        a.uses_tools = vec!["web_search".into(), "web_search".into(), "Nope".into()];
        let v = agent_spec(&a, |t| t != "web_search");
        assert_eq!(
            fields(&v),
            [
                "agent.id",
                "agent.endpoint",
                "agent.capabilities[1].name",
                "agent.capabilities[1].proficiency",
                "agent.capabilities[1].price_per_unit_micro_usd",
                "agent.capabilities[2].name",
                "agent.trust_score",
                "agent.labels[Bad Key]",
                "agent.uses_tools[0]",
                "agent.uses_tools[1]",
                "agent.uses_tools[2]",
            ]
        );
        assert!(v.0[8].description.contains("not registered"));
    }

    #[test]
    fn agent_without_capabilities_is_rejected() {
        let mut a = spec("a");
        a.capabilities.clear();
        assert_eq!(fields(&agent_spec(&a, |_| true)), ["agent.capabilities"]);
    }

    #[test]
    fn tool_schema_must_be_valid_json_schema() {
        let good = serde_json::json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]});
        let t = Tool {
            name: "web_search".into(),
            description: "Search".into(),
            parameters: switchyard_kit::json::json_to_struct(&good),
            endpoint: String::new(),
            ..Default::default()
        };
        let (v, bad) = tool(&t);
        assert!(v.is_empty() && !bad, "{v}");

        let wrong = serde_json::json!({"type": "no_such_type"});
        let t2 = Tool {
            parameters: switchyard_kit::json::json_to_struct(&wrong),
            ..t.clone()
        };
        let (v, bad) = tool(&t2);
        assert!(bad);
        assert_eq!(fields(&v), ["tool.parameters"]);

        let t3 = Tool {
            name: "Bad".into(),
            parameters: None,
            ..t
        };
        let (v, _) = tool(&t3);
        assert_eq!(fields(&v), ["tool.name", "tool.parameters"]);
    }
}
