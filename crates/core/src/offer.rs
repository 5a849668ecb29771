//! How a tool or an agent is offered to a model, and what each offer adds
//! to a prompt: the one definition the executor's loop (which sends the
//! offers and reserves their tokens) and the registry's capabilities
//! summary (which reports them) share, so `switchyard tool summary` prints
//! what a run is charged for.

use serde_json::{Value, json};

/// The parameters an agent offered as a tool `agent_<id>` takes (seed ADR
/// 003 tool mode): the task, and structured input if it takes any.
pub fn agent_tool_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "The task for the agent"},
            "input": {"type": "object", "description": "Structured input, if the agent takes any"}
        },
        "required": ["task"]
    })
}

/// Tokens offering one tool adds to a prompt, at most: a token never
/// covers less than one byte (byte-level BPE), so the bytes of its name,
/// description and parameter schema (as sent, compact JSON), plus 8 for
/// the framing around them, bound what any provider counts.
pub fn tool_prompt_tokens(name: &str, description: &str, parameters: &Value) -> u64 {
    (name.len() + description.len() + parameters.to_string().len()) as u64 + 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_costs_its_name_description_and_compact_schema_plus_framing() {
        let p = json!({"type": "object"});
        assert_eq!(p.to_string().len(), 17);
        assert_eq!(
            tool_prompt_tokens("lookup", "Finds it.", &p),
            6 + 9 + 17 + 8
        );
        // A longer description costs exactly its extra bytes.
        assert_eq!(
            tool_prompt_tokens("lookup", "Finds it fast.", &p)
                - tool_prompt_tokens("lookup", "Finds it.", &p),
            5
        );
    }

    #[test]
    fn an_agent_offered_as_a_tool_requires_a_task() {
        assert_eq!(agent_tool_parameters()["required"], json!(["task"]));
    }
}
