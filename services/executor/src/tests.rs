//! Unit tests of format conversion and spec rules (the service end to end is
//! tested over gRPC in `tests/tests/executor.rs`).

use serde_json::json;
use switchyard_core::Reason;
use switchyard_proto::executor::v1::task_spec::Kind;

use crate::formats::{self, Limits};
use crate::spec::{self, Rules};

const LIMITS: Limits = Limits {
    max_tasks: 100,
    max_delegation_depth: 10,
};

fn rules(commands: &[String]) -> Rules<'_> {
    Rules {
        max_tasks: 100,
        commands,
        default_timeout_secs: 300,
        default_max_parallel: 4,
        max_delegation_depth: 10,
        max_file_bytes: 1024,
        limit_caps: &CAPS,
    }
}

const CAPS: crate::command::limits::ResourceLimits = crate::command::limits::ResourceLimits {
    memory_bytes: 1 << 30,
    cpu_seconds: 60,
    processes: 0,
    open_files: 1024,
    file_size_bytes: 1 << 30,
};

/// Converts, normalizes and checks `spec` the way SubmitJob does.
fn check(
    mut spec: switchyard_proto::executor::v1::JobSpec,
    allowed: &[&str],
) -> Result<(), crate::formats::FormatError> {
    let allowed: Vec<String> = allowed.iter().map(|c| c.to_string()).collect();
    spec::normalize(&mut spec, &rules(&allowed));
    spec::validate(&spec, &rules(&allowed)).map(|_| ())
}

fn convert(doc: serde_json::Value) -> switchyard_proto::executor::v1::JobSpec {
    formats::convert(&doc, LIMITS).unwrap()
}

#[test]
fn each_format_is_recognised_by_its_shape() {
    let cases = [
        (
            json!({"plan_id": "p", "tasks": [{"task_number": 1, "command": "sort"}]}),
            "agenix",
        ),
        (
            json!({"name": "x", "subtasks": [{"subtask_id": "a", "agent_capability": "c"}]}),
            "aitp",
        ),
        (
            json!({"type": "agent.research", "ext_agent_model": "m"}),
            "ojs",
        ),
        (json!({"type": "builtin.echo", "args": ["hi"]}), "ojs"),
        (
            json!({"tasks": [{"id": "a", "command": {"command": "true"}}]}),
            "native",
        ),
    ];
    for (doc, want) in cases {
        assert_eq!(formats::detect(&doc), want, "{doc}");
        assert_eq!(formats::convert(&doc, LIMITS).unwrap().source_format, want);
    }
}

#[test]
fn an_envelope_becomes_a_chain_with_stdin_piping_and_one_worker() {
    let doc = json!({"job_id": "j", "plan_id": "p", "tasks": [
        {"task_number": 1, "command": "sort", "args": ["-r"], "timeout_secs": 30},
        {"task_number": 2, "command": "uniq", "input_from_task": 1}]});
    let s = formats::convert(&doc, LIMITS).unwrap();
    assert_eq!(s.max_parallel, 1);
    assert_eq!(s.tasks[1].depends_on, ["task_1"]);
    let Some(Kind::Command(c)) = &s.tasks[1].kind else {
        panic!()
    };
    assert_eq!(c.stdin_from, "task_1");
    assert_eq!(s.tasks[0].timeout_secs, 30);
}

#[test]
fn the_task_limit_is_configurable() {
    let doc = json!({"plan_id": "p", "tasks": [
        {"task_number": 1, "command": "a"}, {"task_number": 2, "command": "b"}, {"task_number": 3, "command": "c"}]});
    let e = formats::convert(
        &doc,
        Limits {
            max_tasks: 2,
            ..LIMITS
        },
    )
    .unwrap_err();
    assert_eq!(
        e.violations.0[0].description,
        "Invalid job: 3 tasks exceed the limit of 2"
    );
}

#[test]
fn job_spec_fields_are_named_in_aitp_terms_for_an_aitp_document() {
    for (native, aitp) in [
        ("tasks[0].id", "subtasks[0].subtask_id"),
        ("tasks[2].agent.capability", "subtasks[2].agent_capability"),
        ("tasks[1].agent.input.text", "subtasks[1].input.text"),
        ("tasks[1].timeout_secs", "subtasks[1].timeout_seconds"),
        (
            "tasks[1].retry.max_retries",
            "subtasks[1].retry_policy.max_retries",
        ),
        ("tasks[0].depends_on[1]", "subtasks[0].depends_on[1]"),
        ("tasks[0]", "subtasks[0]"),
        ("job_id", "task_id"),
        ("budget.cost_limit", "budget.cost_limit"),
    ] {
        assert_eq!(formats::source_field(formats::AITP, native), aitp);
        assert_eq!(formats::source_field(formats::NATIVE, native), native);
    }
}

#[test]
fn aitp_input_schema_gives_defaults_and_checks_values() {
    let doc = json!({"name": "Paper", "input": {"type": "object",
        "properties": {"url": {"type": "string"}, "max_pages": {"type": "integer", "default": 50}},
        "required": ["url"]},
        "input_values": {"url": "u"},
        "metadata": {"cost_limit": 10.0, "deadline": 1700700600,
                     "retry_policy": {"max_retries": 3, "backoff_strategy": "linear", "backoff_base_ms": 1000}},
        "subtasks": [{"subtask_id": "s1", "agent_capability": "c"}]});
    let s = formats::convert(&doc, LIMITS).unwrap();
    let input = switchyard_kit::json::struct_to_json(s.input.as_ref().unwrap());
    assert_eq!(input, json!({"url": "u", "max_pages": 50}));
    assert_eq!(s.budget.unwrap().cost_limit.unwrap().micro_usd, 10_000_000);
    assert_eq!(
        s.tasks[0].retry.as_ref().unwrap().max_retries,
        3,
        "the task inherits the task-level policy"
    );
    assert_eq!(s.tasks[0].deadline.unwrap().seconds, 1700700600);
    let mut bad = doc.clone();
    bad["input_values"] = json!({"url": 7});
    let e = formats::convert(&bad, LIMITS).unwrap_err();
    assert_eq!(e.violations.0[0].field, "input_values/url");
}

#[test]
fn ojs_rules_give_the_seeds_error_codes() {
    let e = |doc: serde_json::Value| formats::convert(&doc, LIMITS).unwrap_err().reason;
    assert_eq!(
        e(json!({"type": "t", "ext_agent_model": "m", "ext_agent_temperature": -0.1})),
        Reason::AgentInvalidParameter
    );
    assert_eq!(
        e(json!({"type": "t", "ext_agent_model": "m", "ext_agent_tool_choice": "sometimes"})),
        Reason::AgentInvalidParameter
    );
    assert_eq!(
        e(json!({"type": "t", "ext_agent_model": "m", "ext_agent_delegation_depth": 11})),
        Reason::AgentMaxDelegationDepth
    );
    assert_eq!(
        e(
            json!({"type": "t", "ext_agent_model": "m", "ext_agent_delegation_depth": 3, "ext_agent_max_delegation_depth": 2})
        ),
        Reason::AgentMaxDelegationDepth
    );
    let err = formats::convert(&json!({"type": "t", "ext_agent_model": "m", "ext_agent_delegation_depth": 3, "ext_agent_max_delegation_depth": 2}), LIMITS).unwrap_err();
    assert!(
        err.violations
            .to_string()
            .contains("exceeds the maximum of 2"),
        "{err:?}"
    );
    // Seed 000: only a depth that *exceeds* the maximum fails; equal is fine.
    let ok = formats::convert(&json!({"type": "t", "ext_agent_model": "m", "ext_agent_delegation_depth": 2, "ext_agent_max_delegation_depth": 2}), LIMITS).unwrap();
    assert_eq!(ok.delegation.unwrap().depth, 2);
}

#[test]
fn the_allowlist_and_env_rules_are_enforced_with_the_specific_reason() {
    let s = convert(json!({"tasks": [
        {"id": "a", "command": {"command": "curl", "env": {"LD_PRELOAD": "x", "OK_VAR": "1"}}}]}));
    let e = check(s, &["sort"]).unwrap_err();
    assert_eq!(e.reason, Reason::CommandNotAllowed);
    let fields: Vec<&str> = e.violations.0.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "tasks[0].command.command",
            "tasks[0].command.env.LD_PRELOAD"
        ]
    );
}

#[test]
fn loader_variables_and_limits_above_the_caps_are_refused() {
    let s = convert(json!({"tasks": [
        {"id": "a", "command": {"command": "sort",
            "env": {"LD_BIND_NOW": "1", "GCONV_PATH": ".", "TMPDIR": "/tmp", "OK": "1"},
            "limits": {"memory_bytes": 2147483648u64, "cpu_seconds": 5, "processes": 100000}}}]}));
    let e = check(s, &["sort"]).unwrap_err();
    let mut fields: Vec<&str> = e.violations.0.iter().map(|v| v.field.as_str()).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "tasks[0].command.env.GCONV_PATH",
            "tasks[0].command.env.LD_BIND_NOW",
            "tasks[0].command.env.TMPDIR",
            "tasks[0].command.limits.memory_bytes",
        ],
        "processes has no cap here, cpu_seconds is within it"
    );
    assert!(
        e.violations.to_string().contains(
            "above this executor's cap of 1073741824 (executor.task_limit_caps.memory_bytes)"
        ),
        "{e:?}"
    );
    let ok = convert(json!({"tasks": [
        {"id": "a", "command": {"command": "sort", "limits": {"cpu_seconds": 60}}}]}));
    let Some(Kind::Command(c)) = &ok.tasks[0].kind else {
        panic!()
    };
    assert_eq!(c.limits.as_ref().unwrap().cpu_seconds, 60);
    check(ok, &["sort"]).unwrap();
}

#[test]
fn normalizing_fills_defaults_and_the_context_hash_ignores_ids_and_map_order() {
    let allowed = vec!["true".to_owned()];
    let doc = json!({"tasks": [{"id": "a", "command": {"command": "true", "env": {"A": "1", "B": "2", "C": "3"}}}],
                     "labels": {"x": "1", "y": "2", "z": "3"}});
    let mut s = formats::convert(&doc, LIMITS).unwrap();
    spec::normalize(&mut s, &rules(&allowed));
    assert_eq!(
        (
            s.plan_id.as_str(),
            s.max_parallel,
            s.tasks[0].timeout_secs,
            s.tasks[0].name.as_str()
        ),
        ("adhoc", 4, 300, "a")
    );
    let h = spec::context_hash(&s);
    assert!(h.starts_with("sha256:") && h.len() == 71);
    for _ in 0..8 {
        let mut again = formats::convert(&doc, LIMITS).unwrap();
        spec::normalize(&mut again, &rules(&allowed));
        again.job_id = "other".into();
        again.correlation_id = "c".into();
        assert_eq!(spec::context_hash(&again), h);
    }
    s.labels.insert("x".into(), "changed".into());
    assert_ne!(spec::context_hash(&s), h);
}

#[test]
fn file_names_must_be_plain() {
    let mut s = convert(json!({"tasks": [{"id": "a", "command": {"command": "true"}}]}));
    s.files.insert("../etc/passwd".into(), b"x".to_vec());
    s.files.insert("big".into(), vec![0; 2048]);
    let e = check(s, &["true"]).unwrap_err().violations.to_string();
    assert!(
        e.contains("files.../etc/passwd: file names must be plain names"),
        "{e}"
    );
    assert!(e.contains("the limit is 1024"), "{e}");
}

#[test]
fn fallback_strategies_must_fit_their_situation() {
    let s = convert(
        json!({"tasks": [{"id": "a", "timeout_secs": 60, "command": {"command": "true"},
        "fallback": {"on_timeout": {"strategy": "DEFER"},
                     "on_cost_exceeded": {"strategy": "SELECT_NEXT_BEST"}}}]}),
    );
    let e = check(s, &["true"]).unwrap_err().violations.to_string();
    assert!(
        e.contains(
            "tasks[0].fallback.on_timeout: FALLBACK_STRATEGY_DEFER does not apply to on_timeout"
        ),
        "{e}"
    );
    assert!(e.contains("on_cost_exceeded"), "{e}");
    let s = convert(
        json!({"tasks": [{"id": "a", "timeout_secs": 60, "command": {"command": "true"},
        "fallback": {"on_timeout": {"strategy": "RETRY_WITH_TIMEOUT_EXTENSION", "extended_timeout_seconds": 30}}}]}),
    );
    let e = check(s, &["true"]).unwrap_err().violations.to_string();
    assert!(e.contains("must exceed the task's timeout of 60s"), "{e}");
}

#[test]
fn every_field_that_does_not_fit_is_reported_at_once_with_the_field_meant() {
    let doc = json!({
        "plan_id": "p",
        "prioritty": 3,
        "tasks": [
            {"id": "a", "agnet": {"capability": "x"}},
            {"id": "b", "depends_onn": ["a"], "agent": {"capability": "x"}, "timeout_secs": "soon"},
        ]
    });
    let e = formats::convert(&doc, LIMITS).unwrap_err();
    let got: Vec<(&str, &str)> = e
        .violations
        .0
        .iter()
        .map(|v| (v.field.as_str(), v.description.as_str()))
        .collect();
    let has = |field: &str, text: &str| got.iter().any(|(f, d)| *f == field && d.contains(text));
    assert!(has("prioritty", "did you mean \"priority\"?"), "{got:?}");
    assert!(has("tasks[0].agnet", "did you mean \"agent\"?"), "{got:?}");
    assert!(
        has("tasks[1].depends_onn", "did you mean \"depends_on\"?"),
        "{got:?}"
    );
    assert!(
        has("tasks[1].timeout_secs", "expected a whole number"),
        "{got:?}"
    );
    // Read without the unknown field, task a has no kind: said in the same answer.
    assert!(
        has(
            "tasks[0]",
            "exactly one of command, agent, llm, input or conversation"
        ),
        "{got:?}"
    );
    assert_eq!(got.len(), 5, "{got:?}");
}

#[test]
fn unknown_ext_agent_fields_are_kept_and_warned_about_by_name() {
    let doc = json!({"type": "t", "ext_agent_model": "m", "ext_agent_max_token": 5, "ext_agent_mood": "calm"});
    let s = convert(doc.clone());
    let Some(Kind::Llm(l)) = &s.tasks[0].kind else {
        panic!("an llm task")
    };
    let kept = switchyard_kit::json::struct_to_json(l.extensions.as_ref().unwrap());
    assert_eq!(kept["ext_agent_mood"], "calm");
    let w = formats::warnings(&doc);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w.iter().any(|w| w.contains("\"ext_agent_max_token\"")
            && w.contains("did you mean \"ext_agent_max_tokens\"?")),
        "{w:?}"
    );
    assert!(w.iter().any(|w| w.contains("\"ext_agent_mood\"")), "{w:?}");
    assert!(formats::warnings(&json!({"plan_id": "p", "tasks": []})).is_empty());
}

#[test]
fn documents_report_positions_through_parse() {
    let yaml = "plan_id: p\nlabelz: {}\ntasks:\n  - id: a\n    agent: {capability: x}\n";
    let p = formats::parse_document(yaml, "", LIMITS).unwrap();
    assert_eq!(p.found.0.len(), 1, "{:?}", p.found);
    assert_eq!(p.found.0[0].field, "labelz");
    assert_eq!(p.spec.tasks.len(), 1, "the rest of the job is read");
    let e = formats::parse_document("plan_id: p\ntasks: [\n", "", LIMITS).unwrap_err();
    assert!(
        e.violations.0[0].description.contains("line"),
        "{:?}",
        e.violations
    );
}

#[test]
fn a_list_item_of_the_wrong_type_is_reported_once() {
    let doc = json!({"plan_id": "p", "tasks": [{"id": "a", "command": {"command": "head", "args": [-3]}}]});
    let e = formats::convert(&doc, LIMITS).unwrap_err();
    assert_eq!(e.violations.0.len(), 1, "{:?}", e.violations);
    assert_eq!(e.violations.0[0].field, "tasks[0].command.args[0]");
}

#[test]
fn a_named_format_reads_the_document_as_that_format_only() {
    // An AITP task document without subtasks would be detected as a native
    // job; named, it gets the AITP rule it breaks.
    let aitp = r#"{"name": "Research", "goal": "g"}"#;
    let e = formats::parse_document(aitp, "aitp", LIMITS).unwrap_err();
    assert_eq!(e.violations.0[0].field, "subtasks", "{:?}", e.violations);
    // A native job sent where an AGEniX envelope is required is refused
    // with the envelope's rules, not run as a native job.
    let native = r#"{"plan_id": "p", "tasks": [{"id": "a", "command": {"command": "true"}}]}"#;
    assert!(formats::parse_document(native, "", LIMITS).is_ok());
    let e = formats::parse_document(native, "agenix", LIMITS).unwrap_err();
    let missing = e.violations.0.iter().find(|v| v.field == "tasks[0]");
    assert!(
        missing.is_some_and(|v| v.description.contains("task_number")),
        "{:?}",
        e.violations
    );
    let p = formats::parse_document(native, "NATIVE", LIMITS).unwrap();
    assert_eq!(p.spec.source_format, "native");
    let e = formats::parse_document(native, "yaml", LIMITS).unwrap_err();
    assert_eq!(e.violations.0[0].field, "format");
    assert!(
        e.violations.0[0]
            .description
            .contains("native, agenix, aitp, ojs or ojs-queue"),
        "{:?}",
        e.violations
    );
}
