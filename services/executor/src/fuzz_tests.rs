//! The job-document parsers of every format under arbitrary input: bytes,
//! and JSON built from the formats' own field names with extreme values.
//! Nothing a client sends may panic the parsing, conversion or validation
//! of a job (`make test` runs these on stable; `make fuzz` runs cargo-fuzz
//! over the same entry point, `formats::exercise`, for longer).

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::formats::exercise;

/// Field names the formats read, so generated documents reach deep.
const KEYS: &[&str] = &[
    "job_id",
    "plan_id",
    "plan_description",
    "tasks",
    "task_number",
    "command",
    "args",
    "input_from_task",
    "timeout_secs",
    "id",
    "depends_on",
    "agent",
    "capability",
    "input",
    "llm",
    "model",
    "max_tokens",
    "token_budget",
    "max_turns",
    "retry",
    "max_retries",
    "backoff_coefficient",
    "fallback",
    "budget",
    "parent_budget_id",
    "cost_limit",
    "micro_usd",
    "delegation",
    "parent_job_id",
    "depth",
    "max_depth",
    "task_id",
    "name",
    "subtasks",
    "subtask_id",
    "agent_capability",
    "output_mapping",
    "metadata",
    "retry_policy",
    "backoff_strategy",
    "type",
    "options",
    "queue",
    "timeout_ms",
    "ext_agent_model",
    "ext_agent_max_tokens",
    "ext_agent_token_budget",
    "ext_agent_temperature",
    "ext_agent_tools",
    "ext_agent_tool_choice",
    "ext_agent_delegation_depth",
    "ext_agent_max_delegation_depth",
    "ext_agent_parent_id",
    "ext_agent_output_schema",
    "ext_agent_output_format",
    "parameters",
    "files",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            Just(json!(u64::MAX)),
            Just(json!(i64::MIN)),
            Just(json!(1u64 << 63)),
            Just(json!(-1)),
            Just(json!(0)),
            Just(json!(1e308)),
            Just(json!(-0.5)),
            any::<u32>().prop_map(|n| json!(n)),
        ],
        prop_oneof![
            Just(json!("")),
            Just(json!("a/../../x")),
            Just(json!("${parent.input.x}")),
            Just(json!("${t.output.y}")),
            Just(json!("\u{0}")),
            "[a-z0-9_.:/-]{0,12}".prop_map(Value::String),
        ],
    ]
}

fn document() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::vec((proptest::sample::select(KEYS), inner), 0..8).prop_map(
                |kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            ),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn arbitrary_bytes_never_panic_any_format(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        exercise(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn documents_of_the_formats_own_fields_never_panic(doc in document()) {
        exercise(&doc.to_string());
    }
}

#[test]
fn the_seeds_examples_and_the_known_crashers_parse_without_panicking() {
    for doc in [
        r#"{"type":"agent.research","ext_agent_model":"m","ext_agent_max_tokens":9223372036854775808}"#,
        r#"{"type":"agent.research","ext_agent_model":"m","ext_agent_max_tokens":18446744073709551615,"ext_agent_token_budget":18446744073709551615}"#,
        r#"{"job_id":"a/../../x","plan_id":"p","tasks":[{"task_number":1,"command":"sort"}]}"#,
        r#"{"tasks":[{"id":"t","llm":{"model":"m","max_tokens":18446744073709551615,"max_turns":4294967295},"retry":{"max_retries":4294967295}}]}"#,
    ] {
        exercise(doc);
    }
}
