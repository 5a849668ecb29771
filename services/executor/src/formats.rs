//! Every accepted job format, converted to the one `JobSpec`: the native form
//! (JSON or YAML with the proto's field names), the AGEniX job envelope (seed
//! 001, with its validation rules and error texts), an AITP task with
//! subtasks (seed 002) and an OJS job carrying `ext_agent_*` fields (seed
//! 000). Format-specific rules are checked here; the rules every JobSpec
//! obeys are in [`crate::spec`].

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use switchyard_core::{Reason, Violations};
use switchyard_kit::json::json_to_struct;
use switchyard_proto::common::v1::Money;
use switchyard_proto::executor::v1::{
    AgentTask, ArtifactOutput, BackoffStrategy, CommandTask, ConversationTask, Delegation,
    FallbackPolicy, FallbackStrategy, HandoffLimits, InputAnswerers, InputTask, JobApproval,
    JobBudget, JobSpec, LlmTask, ResourceLimits, RetryPolicy, TaskSpec, ToolDefinition, task_spec,
};

/// A document that is not a valid job of its format.
#[derive(Debug, Clone, PartialEq)]
pub struct FormatError {
    /// `INVALID_ARGUMENT`, `INVALID_TASK_NUMBERING`, `AGENT_INVALID_PARAMETER`, …
    pub reason: Reason,
    /// Every problem, against its field.
    pub violations: Violations,
    /// Where each field stands in the document (`line 4, column 5`), by
    /// field path, when the job came as a document. Kept apart from the
    /// descriptions, which keep the specifications' exact texts.
    pub positions: std::collections::BTreeMap<String, String>,
}

impl FormatError {
    /// A format error listing `violations`.
    pub fn new(reason: Reason, violations: Violations) -> Self {
        FormatError {
            reason,
            violations,
            positions: Default::default(),
        }
    }

    /// This error with `found` (problems met earlier in the same document)
    /// listed first, so one answer names them all in document order.
    pub fn after(mut self, mut found: Violations) -> Self {
        found.0.append(&mut self.violations.0);
        self.violations = found;
        self
    }

    pub(crate) fn one(reason: Reason, field: &str, text: impl Into<String>) -> Self {
        let mut violations = Violations::new();
        violations.add(field, text);
        FormatError::new(reason, violations)
    }
}

/// Format names, as recorded in `JobSpec.source_format`.
pub const NATIVE: &str = "native";
/// AGEniX job envelope.
pub const AGENIX: &str = "agenix";
/// AITP task.
pub const AITP: &str = "aitp";
/// OJS job that Switchyard runs itself (an LLM task, or an agent call).
pub const OJS: &str = "ojs";
/// OJS job for pull workers: one queue task (the OJS HTTP binding's jobs).
pub const OJS_QUEUE: &str = "ojs-queue";

mod ojs_queue;
pub use ojs_queue::{TASK_ID as OJS_QUEUE_TASK_ID, is_uuidv7, iso_duration_ms};

/// Limits that depend on the deployment.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Seed 001's task limit (default 100).
    pub max_tasks: usize,
    /// Seed 000's delegation cap (default 10).
    pub max_delegation_depth: u32,
}

/// A document read as a job: the spec, the fields that did not fit (see
/// [`convert_all`]) and warnings that do not stop it.
#[derive(Debug)]
pub struct Parsed {
    /// The job, without the fields in `found`.
    pub spec: JobSpec,
    /// Fields that did not fit.
    pub found: Violations,
    /// What is kept but not used (unknown `ext_agent_*` fields of an OJS job).
    pub warnings: Vec<String>,
}

/// The format a document must be read as: `format` when the client named
/// one (a front door that speaks one format), else detected from `v`'s
/// shape. An unknown name is refused, naming the choices.
fn format_of(v: &Value, format: &str) -> Result<&'static str, FormatError> {
    match format.trim() {
        "" => Ok(detect(v)),
        f => [NATIVE, AGENIX, AITP, OJS, OJS_QUEUE]
            .into_iter()
            .find(|known| known.eq_ignore_ascii_case(f))
            .ok_or_else(|| {
                FormatError::one(
                    Reason::InvalidArgument,
                    "format",
                    format!(
                        "unknown format {:?}: use native, agenix, aitp, ojs or ojs-queue, or leave it empty to detect it",
                        switchyard_core::validate::clamp(f, 40)
                    ),
                )
            }),
    }
}

/// Parses JSON or YAML text and converts it, as `format` when not empty
/// (see [`format_of`]).
pub fn parse_document(text: &str, format: &str, limits: Limits) -> Result<Parsed, FormatError> {
    let trimmed = text.trim_start();
    let value: Value = if trimmed.starts_with('{') {
        serde_json::from_str(text).map_err(|e| {
            FormatError::one(
                Reason::InvalidArgument,
                "document",
                format!("not valid JSON: {e}"),
            )
        })?
    } else {
        serde_saphyr::from_str(text).map_err(|e| {
            FormatError::one(
                Reason::InvalidArgument,
                "document",
                // The parser's first line says where and what; the rest
                // is a drawing of the same spot.
                format!(
                    "not valid JSON or YAML: {}",
                    e.to_string().lines().next().unwrap_or_default()
                ),
            )
        })?
    };
    let format = format_of(&value, format)?;
    let (spec, found) = convert_as(&value, format, limits)?;
    Ok(Parsed {
        spec,
        found,
        warnings: warnings(&value),
    })
}

/// Seed 000's `ext_agent_*` fields. Others are kept on the job (the seed
/// says so) but draw a warning: most are typos.
const OJS_AGENT_FIELDS: &[&str] = &[
    "ext_agent_model",
    "ext_agent_fallback_models",
    "ext_agent_provider",
    "ext_agent_temperature",
    "ext_agent_max_tokens",
    "ext_agent_token_budget",
    "ext_agent_tokens_used",
    "ext_agent_tools",
    "ext_agent_tool_choice",
    "ext_agent_tool_results",
    "ext_agent_parent_id",
    "ext_agent_delegation_depth",
    "ext_agent_max_delegation_depth",
    "ext_agent_output_schema",
    "ext_agent_output_format",
    "ext_agent_model_used",
    "ext_agent_agents",
    "ext_agent_max_turns",
    "ext_agent_max_tokens_per_invocation",
    "ext_agent_time_budget_ms",
    "ext_agent_tool_timeout_ms",
    "ext_agent_instructions",
    "ext_agent_artifact",
];

/// Warnings about a document that is still accepted: each `ext_agent_*`
/// field of an OJS job that the extension does not define, by name.
pub fn warnings(v: &Value) -> Vec<String> {
    if detect(v) != OJS {
        return Vec::new();
    }
    let Some(o) = v.as_object() else {
        return Vec::new();
    };
    o.keys()
        .filter(|k| k.starts_with("ext_agent_") && !OJS_AGENT_FIELDS.contains(&k.as_str()))
        .map(|k| {
            let hint = switchyard_core::validate::did_you_mean(k, OJS_AGENT_FIELDS.iter().copied())
                .map(|m| format!("; did you mean {m:?}?"))
                .unwrap_or_default();
            format!(
                "{:?} is not a field of the OJS AI-agent extension: it is kept with the job but has no effect{hint}",
                switchyard_core::validate::clamp(k, 100)
            )
        })
        .collect()
}

/// Which format a document is, from its shape.
pub fn detect(v: &Value) -> &'static str {
    let Some(o) = v.as_object() else {
        return NATIVE;
    };
    let envelope = o
        .get("tasks")
        .and_then(Value::as_array)
        .is_some_and(|t| t.is_empty() || t.iter().any(|t| t.get("task_number").is_some()));
    if envelope {
        AGENIX
    } else if o.contains_key("subtasks") || o.contains_key("Subtasks") {
        AITP
    } else if o.keys().any(|k| k.starts_with("ext_agent_"))
        || (o.contains_key("type") && !o.contains_key("tasks"))
    {
        OJS
    } else {
        NATIVE
    }
}

/// Converts a parsed document of any accepted format.
pub fn convert(v: &Value, limits: Limits) -> Result<JobSpec, FormatError> {
    let (spec, found) = convert_all(v, limits)?;
    match found.is_empty() {
        true => Ok(spec),
        false => Err(FormatError::new(Reason::InvalidArgument, found)),
    }
}

/// Converts a document, going on past fields that do not fit (unknown
/// fields, wrong types): those are returned, not the first alone, with
/// the spec of the rest, so later checks can add theirs to one answer.
/// An error means the document could not be read as a job at all.
pub fn convert_all(v: &Value, limits: Limits) -> Result<(JobSpec, Violations), FormatError> {
    convert_as(v, detect(v), limits)
}

/// [`convert_all`] as the named format, whatever the document's shape.
fn convert_as(
    v: &Value,
    format: &'static str,
    limits: Limits,
) -> Result<(JobSpec, Violations), FormatError> {
    if !v.is_object() {
        return Err(FormatError::one(
            Reason::InvalidArgument,
            "document",
            "a job document must be an object",
        ));
    }
    let mut found = Violations::new();
    let converted = match format {
        AGENIX => agenix(v, limits, &mut found),
        AITP => aitp(v, &mut found),
        OJS => ojs(v, limits),
        // A queue job carrying seed-000 fields obeys seed 000's rules too,
        // exactly as when Switchyard runs it (one validation for every door).
        OJS_QUEUE => ojs_agent_fields(v, limits)
            .and_then(|()| ojs_queue::convert(v, limits, switchyard_kit::time::now_ms())),
        _ => native(v, &mut found),
    };
    match converted {
        Ok(mut spec) => {
            spec.source_format = format.into();
            Ok((spec, found))
        }
        Err(e) => Err(e.after(found)),
    }
}

/// A JobSpec field path (`tasks[0].agent.capability`) in the terms of the
/// document format it came from, so an error names a field the submitter
/// wrote: AITP's `subtasks[0].agent_capability`. Fields with no AITP
/// counterpart, and other formats, keep the JobSpec name.
pub fn source_field(format: &str, field: &str) -> String {
    if format != AITP {
        return field.to_owned();
    }
    if field == "job_id" {
        return "task_id".into();
    }
    let Some(rest) = field.strip_prefix("tasks[") else {
        return field.to_owned();
    };
    let Some((index, inner)) = rest.split_once(']') else {
        return field.to_owned();
    };
    let inner = inner.strip_prefix('.').unwrap_or(inner);
    // The longest JobSpec prefix first.
    const RENAMES: [(&str, &str); 9] = [
        ("agent.capability", "agent_capability"),
        ("agent.input", "input"),
        ("agent.output_mapping", "output_mapping"),
        ("agent.min_trust", "min_trust"),
        ("agent.exclude_agents", "exclude_agents"),
        ("timeout_secs", "timeout_seconds"),
        ("retry", "retry_policy"),
        ("id", "subtask_id"),
        ("agent", "agent_capability"),
    ];
    let mapped = RENAMES
        .iter()
        .find_map(|(native, aitp)| {
            let tail = inner.strip_prefix(native)?;
            (tail.is_empty() || tail.starts_with(['.', '['])).then(|| format!("{aitp}{tail}"))
        })
        .unwrap_or_else(|| inner.to_owned());
    if mapped.is_empty() {
        format!("subtasks[{index}]")
    } else {
        format!("subtasks[{index}].{mapped}")
    }
}

/// Most problems one document reports before reading stops.
const MAX_PROBLEMS: usize = 100;

/// Reads `v` as `T`. Each field that does not fit is recorded in `found`
/// (unknown ones with the field probably meant) and dropped, and reading
/// goes on, so one answer names every such field. Errs, with nothing more
/// to add, when what is left still cannot be read.
fn typed<T: serde::de::DeserializeOwned>(
    v: &Value,
    found: &mut Violations,
) -> Result<T, FormatError> {
    let mut v = v.clone();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..MAX_PROBLEMS {
        let e = match serde_path_to_error::deserialize::<_, T>(&v) {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let mut path: Vec<Segment> = e.path().iter().map(Segment::from).collect();
        let text = e.inner().to_string();
        // serde names an unknown field in its message; the path ends at
        // the object that has it (or at the field itself).
        let unknown = between(&text, "unknown field `", "`");
        if let Some(name) = &unknown
            && path.last() != Some(&Segment::Key(name.clone()))
        {
            path.push(Segment::Key(name.clone()));
        }
        let field = render(&path);
        let description = match &unknown {
            Some(name) => unknown_field(name, &text),
            None => {
                switchyard_core::validate::in_words(text.split(" at line ").next().unwrap_or(&text))
            }
        };
        if !seen.insert(field.clone()) {
            // Already reported (a list item nulled out is still of the
            // wrong type): what was found is the answer.
            break;
        }
        if !remove(&mut v, &path) {
            // Dropping it cannot help (a required field, the document
            // itself): what was found is the answer.
            found.add(
                if field.is_empty() {
                    "document".into()
                } else {
                    field
                },
                description,
            );
            break;
        }
        found.add(field, description);
    }
    Err(FormatError::new(Reason::InvalidArgument, Violations::new()))
}

/// One step of a field path.
#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Key(String),
    Index(usize),
}

impl From<&serde_path_to_error::Segment> for Segment {
    fn from(s: &serde_path_to_error::Segment) -> Self {
        match s {
            serde_path_to_error::Segment::Seq { index } => Segment::Index(*index),
            serde_path_to_error::Segment::Map { key } => Segment::Key(key.clone()),
            serde_path_to_error::Segment::Enum { variant } => Segment::Key(variant.clone()),
            serde_path_to_error::Segment::Unknown => Segment::Key("?".into()),
        }
    }
}

/// `tasks[1].depends_on`, as violations name fields.
fn render(path: &[Segment]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
            Segment::Key(k) if out.is_empty() => out.push_str(k),
            Segment::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
        }
    }
    out
}

/// Removes the value at `path`; false when there is none.
fn remove(v: &mut Value, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = v;
    for s in parents {
        let next = match (s, at) {
            (Segment::Key(k), Value::Object(o)) => o.get_mut(k),
            (Segment::Index(i), Value::Array(a)) => a.get_mut(*i),
            _ => None,
        };
        match next {
            Some(n) => at = n,
            None => return false,
        }
    }
    match (last, at) {
        (Segment::Key(k), Value::Object(o)) => o.remove(k).is_some(),
        // Dropping an item would renumber the rest; null it instead (the
        // next read reports it, once, as of the wrong type).
        (Segment::Index(i), Value::Array(a)) if *i < a.len() && !a[*i].is_null() => {
            a[*i] = Value::Null;
            true
        }
        _ => false,
    }
}

/// The text between `start` and the next `end` in `s`.
fn between(s: &str, start: &str, end: &str) -> Option<String> {
    let from = s.find(start)? + start.len();
    let len = s[from..].find(end)?;
    Some(s[from..from + len].to_owned())
}

/// "unknown field; did you mean `depends_on`?" from serde's message, which
/// lists the expected fields in backticks after the unknown one.
fn unknown_field(name: &str, serde_text: &str) -> String {
    let expected: Vec<&str> = serde_text.split('`').skip(3).step_by(2).collect();
    match switchyard_core::validate::did_you_mean(name, expected.iter().copied()) {
        Some(meant) => format!("unknown field {name:?}; did you mean {meant:?}?"),
        None if expected.is_empty() => format!("unknown field {name:?}"),
        None => format!(
            "unknown field {name:?}; the fields here are {}",
            expected.join(", ")
        ),
    }
}

// ---------------------------------------------------------------- AGEniX (seed 001)

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    #[serde(default)]
    job_id: String,
    #[serde(default)]
    plan_id: String,
    #[serde(default)]
    plan_description: String,
    #[serde(default)]
    tasks: Vec<EnvelopeTask>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvelopeTask {
    task_number: u32,
    #[serde(default)]
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    timeout_secs: Option<u32>,
    #[serde(default)]
    input_from_task: Option<u32>,
}

/// Seed 001's client-side rules, in its order, with its texts.
///
/// Long on purpose: the seed's rules one after another, so each can be
/// checked against the seed's text and error message in order.
fn agenix(v: &Value, limits: Limits, found: &mut Violations) -> Result<JobSpec, FormatError> {
    let env: Envelope = typed(v, found)?;
    if env.plan_id.trim().is_empty() {
        return Err(FormatError::one(
            Reason::InvalidArgument,
            "plan_id",
            "Invalid job: plan_id is required",
        ));
    }
    // 1. Non-empty tasks.
    if env.tasks.is_empty() {
        return Err(FormatError::one(
            Reason::InvalidArgument,
            "tasks",
            "Invalid job: tasks must contain at least one task",
        ));
    }
    // 2. Contiguous numbering from 1.
    for (i, t) in env.tasks.iter().enumerate() {
        let expected = i as u32 + 1;
        if t.task_number == expected {
            continue;
        }
        let field = format!("tasks[{i}].task_number");
        let prev = if i == 0 {
            0
        } else {
            env.tasks[i - 1].task_number
        };
        let text = if i == 0 {
            format!(
                "Invalid task numbering: must start at 1, found {}",
                t.task_number
            )
        } else if t.task_number <= prev {
            format!(
                "Invalid task numbering: duplicate or out-of-order task {} after task {prev}",
                t.task_number
            )
        } else {
            format!(
                "Invalid task numbering: gap between task {prev} and {}",
                t.task_number
            )
        };
        return Err(FormatError::one(Reason::InvalidTaskNumbering, &field, text));
    }
    // 3. Task limit.
    if env.tasks.len() > limits.max_tasks {
        return Err(FormatError::one(
            Reason::InvalidArgument,
            "tasks",
            format!(
                "Invalid job: {} tasks exceed the limit of {}",
                env.tasks.len(),
                limits.max_tasks
            ),
        ));
    }
    // 4. Input references point strictly backwards.
    for (i, t) in env.tasks.iter().enumerate() {
        if let Some(from) = t.input_from_task
            && from >= t.task_number
        {
            let text = if from == t.task_number {
                format!(
                    "Invalid input reference: task {} cannot read its own output",
                    t.task_number
                )
            } else {
                format!(
                    "Invalid input reference: task {} reads task {from}, which does not come before it",
                    t.task_number
                )
            };
            return Err(FormatError::one(
                Reason::InvalidArgument,
                &format!("tasks[{i}].input_from_task"),
                text,
            ));
        }
        if t.input_from_task == Some(0) {
            return Err(FormatError::one(
                Reason::InvalidArgument,
                &format!("tasks[{i}].input_from_task"),
                format!(
                    "Invalid input reference: task {} reads task 0, which does not exist",
                    t.task_number
                ),
            ));
        }
    }
    // 5. Commands present (the allowlist is checked with every JobSpec).
    for (i, t) in env.tasks.iter().enumerate() {
        if t.command.trim().is_empty() {
            return Err(FormatError::one(
                Reason::InvalidArgument,
                &format!("tasks[{i}].command"),
                format!(
                    "Invalid command: task {} has an empty command",
                    t.task_number
                ),
            ));
        }
    }
    let id = |n: u32| format!("task_{n}");
    let tasks = env
        .tasks
        .iter()
        .map(|t| TaskSpec {
            id: id(t.task_number),
            name: format!("{} {}", t.command, t.args.join(" "))
                .trim()
                .to_owned(),
            // Sequential: each task runs after the previous one.
            depends_on: if t.task_number > 1 {
                vec![id(t.task_number - 1)]
            } else {
                vec![]
            },
            timeout_secs: t.timeout_secs.unwrap_or(0),
            kind: Some(task_spec::Kind::Command(CommandTask {
                command: t.command.clone(),
                args: t.args.clone(),
                env: BTreeMap::new(),
                stdin_from: t.input_from_task.map(id).unwrap_or_default(),
                limits: None,
            })),
            ..Default::default()
        })
        .collect();
    Ok(JobSpec {
        job_id: env.job_id,
        plan_id: env.plan_id,
        plan_description: env.plan_description,
        tasks,
        // Seed 001: one worker, in order.
        max_parallel: 1,
        ..Default::default()
    })
}

// ---------------------------------------------------------------- AITP (seed 002)

#[derive(Deserialize, Default)]
#[serde(default)]
struct AitpTask {
    task_id: String,
    name: String,
    description: String,
    goal: String,
    input: Value,
    input_values: Value,
    output: Value,
    priority: Value,
    metadata: AitpMetadata,
    subtasks: Vec<AitpSubtask>,
    created_by: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AitpMetadata {
    deadline: Option<i64>,
    timeout_seconds: Option<u32>,
    retry_policy: Option<AitpRetry>,
    cost_limit: Option<f64>,
    tags: Vec<String>,
    fallback: Option<AitpFallback>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default, deny_unknown_fields)]
struct AitpRetry {
    max_retries: u32,
    backoff_strategy: String,
    backoff_base_ms: u64,
    backoff_max_ms: u64,
    jitter: f64,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default, deny_unknown_fields)]
struct AitpFallback {
    on_agent_offline: Option<AitpStrategy>,
    on_timeout: Option<AitpStrategy>,
    on_cost_exceeded: Option<AitpStrategy>,
    on_capability_unavailable: Option<AitpStrategy>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default, deny_unknown_fields)]
struct AitpStrategy {
    strategy: String,
    extended_timeout_seconds: u32,
    notification: String,
    interval_seconds: u32,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct AitpSubtask {
    subtask_id: String,
    name: String,
    agent_capability: String,
    input: Map<String, Value>,
    output_mapping: BTreeMap<String, String>,
    priority: i32,
    depends_on: Vec<String>,
    timeout_seconds: Option<u32>,
    retry_policy: Option<AitpRetry>,
    fallback: Option<AitpFallback>,
    cost_limit: Option<f64>,
    deadline: Option<i64>,
    min_trust: Option<u32>,
    exclude_agents: Vec<String>,
}

fn is_schema(v: &Value) -> bool {
    v.get("type").is_some_and(Value::is_string) && v.get("properties").is_some_and(Value::is_object)
}

fn usd_to_micro(usd: f64, field: &str) -> Result<Money, FormatError> {
    if !(usd.is_finite() && (0.0..=1e9).contains(&usd)) {
        return Err(FormatError::one(
            Reason::InvalidArgument,
            field,
            format!("{usd} is not a cost in USD between 0 and 1e9"),
        ));
    }
    Ok(Money {
        micro_usd: (usd * 1e6).round() as i64,
    })
}

fn timestamp(unix: Option<i64>) -> Option<prost_types::Timestamp> {
    unix.map(|seconds| prost_types::Timestamp { seconds, nanos: 0 })
}

fn strategy(s: &Option<AitpStrategy>, field: &str) -> Result<i32, FormatError> {
    let Some(s) = s else { return Ok(0) };
    let v = match s.strategy.to_ascii_uppercase().as_str() {
        "" => FallbackStrategy::Unspecified,
        "SELECT_NEXT_BEST" => FallbackStrategy::SelectNextBest,
        "RETRY_WITH_TIMEOUT_EXTENSION" => FallbackStrategy::RetryWithTimeoutExtension,
        "FAIL_AND_NOTIFY" => FallbackStrategy::FailAndNotify,
        "DEFER" => FallbackStrategy::Defer,
        other => {
            return Err(FormatError::one(
                Reason::InvalidArgument,
                field,
                format!(
                    "unknown strategy {other:?}; expected SELECT_NEXT_BEST, RETRY_WITH_TIMEOUT_EXTENSION, FAIL_AND_NOTIFY or DEFER"
                ),
            ));
        }
    };
    Ok(v as i32)
}

fn fallback(f: &Option<AitpFallback>, at: &str) -> Result<Option<FallbackPolicy>, FormatError> {
    let Some(f) = f else { return Ok(None) };
    let get = |s: &Option<AitpStrategy>, f: fn(&AitpStrategy) -> u32| s.as_ref().map_or(0, f);
    Ok(Some(FallbackPolicy {
        on_agent_offline: strategy(&f.on_agent_offline, &format!("{at}.on_agent_offline"))?,
        on_timeout: strategy(&f.on_timeout, &format!("{at}.on_timeout"))?,
        extended_timeout_seconds: get(&f.on_timeout, |s| s.extended_timeout_seconds),
        on_cost_exceeded: strategy(&f.on_cost_exceeded, &format!("{at}.on_cost_exceeded"))?,
        notification: f
            .on_cost_exceeded
            .as_ref()
            .map(|s| s.notification.clone())
            .unwrap_or_default(),
        on_capability_unavailable: strategy(
            &f.on_capability_unavailable,
            &format!("{at}.on_capability_unavailable"),
        )?,
        defer_interval_seconds: get(&f.on_capability_unavailable, |s| s.interval_seconds),
    }))
}

fn backoff(s: &str, field: &str) -> Result<i32, FormatError> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "" => BackoffStrategy::Unspecified,
        "fixed" => BackoffStrategy::Fixed,
        "linear" => BackoffStrategy::Linear,
        "exponential" => BackoffStrategy::Exponential,
        other => {
            return Err(FormatError::one(
                Reason::InvalidArgument,
                field,
                format!(
                    "unknown backoff strategy {other:?}; expected exponential, linear or fixed"
                ),
            ));
        }
    } as i32)
}

fn retry(r: &Option<AitpRetry>, field: &str) -> Result<Option<RetryPolicy>, FormatError> {
    let Some(r) = r else { return Ok(None) };
    Ok(Some(RetryPolicy {
        max_retries: r.max_retries,
        backoff_strategy: backoff(&r.backoff_strategy, &format!("{field}.backoff_strategy"))?,
        backoff_base_ms: r.backoff_base_ms,
        backoff_max_ms: r.backoff_max_ms,
        jitter: r.jitter,
        ..Default::default()
    }))
}

fn aitp_priority(v: &Value) -> i32 {
    match v.as_str().map(str::to_ascii_uppercase).as_deref() {
        Some("HIGH") => -1,
        Some("LOW") => 1,
        _ => v.as_i64().map_or(0, |n| n as i32),
    }
}

/// Seed 002's AITP task definition to a JobSpec.
///
/// Long on purpose: one seed format's whole mapping, in the seed's order,
/// so it reads against the seed document.
fn aitp(v: &Value, found: &mut Violations) -> Result<JobSpec, FormatError> {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut()
        && let Some(s) = o.remove("Subtasks")
    {
        o.insert("subtasks".into(), s);
    }
    let t: AitpTask = typed(&v, found)?;
    // The task's `input` is either the values themselves or (as in the seed)
    // a JSON Schema whose defaults, overridden by `input_values`, are the values.
    let mut input = Map::new();
    if is_schema(&t.input) {
        if let Some(props) = t.input.get("properties").and_then(Value::as_object) {
            for (k, p) in props {
                if let Some(d) = p.get("default") {
                    input.insert(k.clone(), d.clone());
                }
            }
        }
        if let Some(given) = t.input_values.as_object() {
            input.extend(given.clone());
        }
        let validator = jsonschema::validator_for(&t.input).map_err(|e| {
            FormatError::one(
                Reason::InvalidArgument,
                "input",
                format!("input is not a valid JSON Schema: {e}"),
            )
        })?;
        let values = Value::Object(input.clone());
        if let Some(e) = validator.iter_errors(&values).next() {
            return Err(FormatError::one(
                Reason::InvalidArgument,
                &format!("input_values{}", e.instance_path()),
                format!("input does not match the task's input schema: {e}"),
            ));
        }
    } else if let Some(o) = t.input.as_object() {
        input = o.clone();
    }
    if t.subtasks.is_empty() {
        return Err(FormatError::one(
            Reason::InvalidArgument,
            "subtasks",
            "an AITP task needs at least one subtask",
        ));
    }
    let job_retry = retry(&t.metadata.retry_policy, "metadata.retry_policy")?;
    let job_fallback = fallback(&t.metadata.fallback, "metadata.fallback")?;
    let mut tasks = Vec::new();
    for (i, s) in t.subtasks.iter().enumerate() {
        let at = format!("subtasks[{i}]");
        let cost_limit = s
            .cost_limit
            .map(|c| usd_to_micro(c, &format!("{at}.cost_limit")))
            .transpose()?;
        tasks.push(TaskSpec {
            id: s.subtask_id.clone(),
            name: s.name.clone(),
            depends_on: s.depends_on.clone(),
            timeout_secs: s
                .timeout_seconds
                .or(t.metadata.timeout_seconds)
                .unwrap_or(0),
            retry: retry(&s.retry_policy, &format!("{at}.retry_policy"))?.or(job_retry.clone()),
            fallback: fallback(&s.fallback, &format!("{at}.fallback"))?.or(job_fallback.clone()),
            priority: s.priority,
            deadline: timestamp(s.deadline.or(t.metadata.deadline)),
            cost_limit,
            kind: Some(task_spec::Kind::Agent(AgentTask {
                capability: s.agent_capability.clone(),
                input: json_to_struct(&Value::Object(s.input.clone())),
                output_mapping: s.output_mapping.clone().into_iter().collect(),
                min_trust: s.min_trust,
                exclude_agents: s.exclude_agents.clone(),
                ..Default::default()
            })),
        });
    }
    let cost_limit = t
        .metadata
        .cost_limit
        .map(|c| usd_to_micro(c, "metadata.cost_limit"))
        .transpose()?;
    let mut labels: BTreeMap<String, String> = t
        .metadata
        .tags
        .iter()
        .map(|tag| (format!("tag.{tag}"), "true".into()))
        .collect();
    if !t.created_by.is_empty() {
        labels.insert("created_by".into(), t.created_by.clone());
    }
    let description = [t.description.as_str(), t.goal.trim()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("\n\n");
    Ok(JobSpec {
        job_id: t.task_id,
        plan_id: if t.name.is_empty() {
            "aitp".into()
        } else {
            slug(&t.name)
        },
        plan_description: if description.is_empty() {
            t.name.clone()
        } else {
            description
        },
        input: json_to_struct(&Value::Object(input)),
        tasks,
        budget: cost_limit.map(|c| JobBudget {
            cost_limit: Some(c),
            ..Default::default()
        }),
        approval: Some(JobApproval {
            intent: t.name.clone(),
            ..Default::default()
        }),
        labels,
        priority: aitp_priority(&t.priority),
        deadline: timestamp(t.metadata.deadline),
        ..Default::default()
    })
}

fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').chars().take(64).collect()
}

// ---------------------------------------------------------------- OJS (seed 000)

/// An optional array of strings (absent or null: empty).
fn strings(v: Option<&Value>, field: &str, why: &str) -> Result<Vec<String>, FormatError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => Ok(a
            .iter()
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect()),
        Some(_) => Err(FormatError::one(Reason::AgentInvalidParameter, field, why)),
    }
}

/// Seed 000's OJS job (`ext_agent_*`) to a JobSpec.
///
/// Long on purpose: one seed format's whole mapping, field by field in the
/// seed's order, so it reads against the seed document; split up, the
/// mapping would be scattered over helpers that each make sense only here.
/// Seed 000's checks of an OJS envelope's `ext_agent_*` fields, when it
/// has any: the same conversion an agent job goes through, its result
/// dropped.
fn ojs_agent_fields(v: &Value, limits: Limits) -> Result<(), FormatError> {
    let has_agent_fields = v
        .as_object()
        .is_some_and(|o| o.keys().any(|k| k.starts_with("ext_agent_")));
    if has_agent_fields {
        ojs(v, limits).map(drop)
    } else {
        Ok(())
    }
}

fn ojs(v: &Value, limits: Limits) -> Result<JobSpec, FormatError> {
    let o = v.as_object().cloned().unwrap_or_default();
    let bad =
        |field: &str, text: String| FormatError::one(Reason::AgentInvalidParameter, field, text);
    let str_field = |k: &str| -> Result<String, FormatError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(bad(k, format!("{k} must be a string"))),
        }
    };
    let uint = |k: &str| -> Result<Option<u64>, FormatError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| bad(k, format!("{k} must be a non-negative integer"))),
        }
    };
    let job_type = str_field("type")?;
    if job_type.is_empty() {
        return Err(FormatError::one(
            Reason::InvalidArgument,
            "type",
            "an OJS job needs a type",
        ));
    }
    let args: Vec<Value> = match o.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => {
            return Err(FormatError::one(
                Reason::InvalidArgument,
                "args",
                "args must be an array",
            ));
        }
    };
    let options = o
        .get("options")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let timeout_secs = options
        .get("timeout_ms")
        .and_then(Value::as_u64)
        .map_or(0, |ms| ms.div_ceil(1000) as u32);

    // Seed 000 §2: ranges and shapes.
    let temperature = match o.get("ext_agent_temperature") {
        None | Some(Value::Null) => None,
        Some(t) => match t.as_f64() {
            Some(t) if (0.0..=2.0).contains(&t) => Some(t),
            _ => {
                return Err(bad(
                    "ext_agent_temperature",
                    format!("ext_agent_temperature must be between 0.0 and 2.0, got {t}"),
                ));
            }
        },
    };
    let depth = uint("ext_agent_delegation_depth")?.unwrap_or(0) as u32;
    let max_depth = uint("ext_agent_max_delegation_depth")?
        .map_or(limits.max_delegation_depth, |m| {
            (m as u32).min(limits.max_delegation_depth)
        });
    // Seed 000: a job fails when its depth *exceeds* the maximum (equal is
    // allowed); the deployment's cap bounds whatever the client asks for.
    if depth > max_depth {
        return Err(FormatError::one(
            Reason::AgentMaxDelegationDepth,
            "ext_agent_delegation_depth",
            format!("delegation depth {depth} exceeds the maximum of {max_depth}"),
        ));
    }
    let mut tools = Vec::new();
    let mut seen = std::collections::HashSet::new();
    if let Some(list) = o.get("ext_agent_tools") {
        let Some(list) = list.as_array() else {
            return Err(bad(
                "ext_agent_tools",
                "ext_agent_tools must be an array".into(),
            ));
        };
        for (i, t) in list.iter().enumerate() {
            let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
            let field = format!("ext_agent_tools[{i}].name");
            if let Err(e) = switchyard_core::validate::tool_name(name) {
                return Err(bad(&field, e));
            }
            if !seen.insert(name.to_owned()) {
                return Err(bad(&field, format!("tool name {name:?} is used twice")));
            }
            let parameters = t.get("parameters").cloned().unwrap_or(Value::Null);
            if !parameters.is_null() && !parameters.is_object() {
                return Err(bad(
                    &format!("ext_agent_tools[{i}].parameters"),
                    "parameters must be a JSON Schema object".into(),
                ));
            }
            let command = t.get("command").and_then(Value::as_str).unwrap_or_default();
            let args = strings(
                t.get("args"),
                &format!("ext_agent_tools[{i}].args"),
                "args must be an array of strings",
            )?;
            if !args.is_empty() && command.is_empty() {
                return Err(bad(
                    &format!("ext_agent_tools[{i}].args"),
                    "args needs a command".into(),
                ));
            }
            let requires_approval = match t.get("requires_approval") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(bad(
                        &format!("ext_agent_tools[{i}].requires_approval"),
                        "requires_approval must be true or false".into(),
                    ));
                }
            };
            tools.push(ToolDefinition {
                requires_approval,
                name: name.to_owned(),
                description: t
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                parameters: json_to_struct(&parameters),
                command: command.to_owned(),
                args,
            });
        }
    }
    let tool_choice = str_field("ext_agent_tool_choice")?;
    if !matches!(tool_choice.as_str(), "" | "auto" | "required" | "none") {
        return Err(bad(
            "ext_agent_tool_choice",
            format!("ext_agent_tool_choice must be auto, required or none, got {tool_choice:?}"),
        ));
    }
    let output_format = str_field("ext_agent_output_format")?;
    if !matches!(output_format.as_str(), "" | "json" | "text" | "markdown") {
        return Err(bad(
            "ext_agent_output_format",
            format!(
                "ext_agent_output_format must be json, text or markdown, got {output_format:?}"
            ),
        ));
    }
    let output_schema = match o.get("ext_agent_output_schema") {
        None | Some(Value::Null) => None,
        Some(s @ Value::Object(_)) => {
            jsonschema::validator_for(s).map_err(|e| {
                bad(
                    "ext_agent_output_schema",
                    format!("not a valid JSON Schema: {e}"),
                )
            })?;
            json_to_struct(s)
        }
        Some(_) => {
            return Err(bad(
                "ext_agent_output_schema",
                "must be a JSON Schema object".into(),
            ));
        }
    };
    let fallback_models = strings(
        o.get("ext_agent_fallback_models"),
        "ext_agent_fallback_models",
        "must be an array of model names",
    )?;
    let max_tokens = uint("ext_agent_max_tokens")?;
    let token_budget = uint("ext_agent_token_budget")?;
    let max_turns = uint("ext_agent_max_turns")?.unwrap_or(0);
    if max_turns > 1000 {
        return Err(bad(
            "ext_agent_max_turns",
            format!("ext_agent_max_turns must be at most 1000, got {max_turns}"),
        ));
    }
    let max_tokens_per_invocation = uint("ext_agent_max_tokens_per_invocation")?.unwrap_or(0);
    let time_budget_ms = uint("ext_agent_time_budget_ms")?.unwrap_or(0);
    let tool_timeout_ms = uint("ext_agent_tool_timeout_ms")?.unwrap_or(0);
    let instructions = str_field("ext_agent_instructions")?;
    let artifact = artifact_output(o.get("ext_agent_artifact"))?;
    let agents = strings(
        o.get("ext_agent_agents"),
        "ext_agent_agents",
        "must be an array of agent ids or capabilities",
    )?;
    for (i, a) in agents.iter().enumerate() {
        // `prefix.*`: every agent offering a capability under prefix.
        let named = a.strip_suffix(".*").unwrap_or(a);
        if switchyard_core::validate::capability(named).is_err() {
            return Err(bad(
                &format!("ext_agent_agents[{i}]"),
                format!(
                    "{a:?} is neither an agent id, a capability nor `prefix.*` (every agent under a capability)"
                ),
            ));
        }
    }
    // System-managed fields from the client are ignored (seed 000 §6).
    let unknown: Map<String, Value> = o
        .iter()
        .filter(|(k, _)| k.starts_with("ext_agent_") && !OJS_AGENT_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let model = str_field("ext_agent_model")?;
    let provider = str_field("ext_agent_provider")?;
    let prompt = args
        .iter()
        .map(|a| a.as_str().map_or_else(|| a.to_string(), str::to_owned))
        .collect::<Vec<_>>()
        .join("\n");
    let is_llm = !model.is_empty()
        || !provider.is_empty()
        || !tools.is_empty()
        || max_tokens.is_some()
        || !agents.is_empty();
    let kind = if is_llm {
        task_spec::Kind::Llm(LlmTask {
            model,
            fallback_models,
            provider,
            temperature,
            max_tokens,
            token_budget,
            instructions,
            prompt,
            tools,
            tool_choice,
            output_schema,
            output_format,
            extensions: (!unknown.is_empty())
                .then(|| json_to_struct(&Value::Object(unknown)))
                .flatten(),
            agents,
            max_turns: max_turns as u32,
            max_tokens_per_invocation,
            time_budget_ms,
            tool_timeout_ms,
            artifact,
        })
    } else {
        task_spec::Kind::Agent(AgentTask {
            capability: job_type.clone(),
            input: json_to_struct(&serde_json::json!({ "args": args })),
            ..Default::default()
        })
    };
    let mut labels = BTreeMap::new();
    labels.insert("ojs.type".to_owned(), job_type.clone());
    Ok(JobSpec {
        job_id: str_field("id")?,
        plan_id: job_type.clone(),
        plan_description: format!("OJS job {job_type}"),
        tasks: vec![TaskSpec {
            id: "agent".into(),
            name: job_type.clone(),
            timeout_secs,
            kind: Some(kind),
            ..Default::default()
        }],
        budget: token_budget.map(|t| JobBudget {
            token_budget: Some(t),
            ..Default::default()
        }),
        approval: Some(JobApproval {
            intent: format!("OJS job {job_type}"),
            ..Default::default()
        }),
        labels,
        queue: options
            .get("queue")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        delegation: Some(Delegation {
            parent_job_id: str_field("ext_agent_parent_id")?,
            depth,
            max_depth,
        }),
        envelope: ojs_queue::envelope(&o, true),
        ..Default::default()
    })
}

// ---------------------------------------------------------------- native

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeJob {
    job_id: String,
    plan_id: String,
    plan_description: String,
    correlation_id: String,
    input: Option<Map<String, Value>>,
    tasks: Vec<NativeTask>,
    budget: Option<NativeBudget>,
    approval: Option<NativeApproval>,
    labels: BTreeMap<String, String>,
    priority: i32,
    queue: String,
    delegation: Option<NativeDelegation>,
    deadline: Option<i64>,
    scheduled_at: Option<i64>,
    max_parallel: u32,
}

/// `ext_agent_artifact`: `{"kind": "changeset_bundle", "name": "..."}`.
fn artifact_output(v: Option<&Value>) -> Result<Option<ArtifactOutput>, FormatError> {
    let bad =
        |field: &str, text: String| FormatError::one(Reason::AgentInvalidParameter, field, text);
    const FIELD: &str = "ext_agent_artifact";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(o) = v.as_object() else {
        return Err(bad(FIELD, "must be an object {kind, name}".into()));
    };
    if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "kind" | "name")) {
        return Err(bad(
            &format!("{FIELD}.{k}"),
            "unknown field (kind, name)".into(),
        ));
    }
    let kind = o.get("kind").and_then(Value::as_str).unwrap_or("file");
    let Some(kind) = switchyard_core::artifact::ArtifactKind::parse(kind) else {
        return Err(bad(
            &format!("{FIELD}.kind"),
            format!(
                "unknown artifact kind {kind:?} (file, changeset_bundle, draft_pr, issue_comment, test_plan)"
            ),
        ));
    };
    let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
    if !name.is_empty() {
        switchyard_core::artifact::check_name(name)
            .map_err(|e| bad(&format!("{FIELD}.name"), e))?;
    }
    Ok(Some(ArtifactOutput {
        kind: switchyard_api::artifacts::proto_kind(kind) as i32,
        name: name.to_owned(),
    }))
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeBudget {
    token_budget: Option<u64>,
    cost_limit_usd: Option<f64>,
    cost_limit_micro_usd: Option<i64>,
    parent_budget_id: String,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeApproval {
    intent: String,
    tools_allowed: Vec<String>,
    outputs_allowed: Vec<String>,
    requires_approval: bool,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeDelegation {
    parent_job_id: String,
    depth: u32,
    max_depth: u32,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeTask {
    id: String,
    name: String,
    depends_on: Vec<String>,
    timeout_secs: u32,
    retry: Option<AitpRetry>,
    fallback: Option<AitpFallback>,
    priority: i32,
    deadline: Option<i64>,
    cost_limit_usd: Option<f64>,
    command: Option<NativeCommand>,
    agent: Option<NativeAgent>,
    llm: Option<Value>,
    input: Option<NativeInput>,
    conversation: Option<NativeConversation>,
}

/// A native conversation task: `orchestrator` (an `llm` block without a
/// prompt), `participants`, `idle_secs`, `max_messages`.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeConversation {
    orchestrator: Option<Value>,
    participants: Option<NativeAnswerers>,
    idle_secs: u32,
    max_messages: u32,
    handoff: Option<NativeHandoff>,
}

/// A conversation's handoff limits.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeHandoff {
    max_turns: u32,
    timeout_secs: u32,
    max_tokens: u64,
    max_cost_micro_usd: i64,
}

impl NativeAnswerers {
    fn proto(self) -> InputAnswerers {
        InputAnswerers {
            submitter: self.submitter,
            subjects: self.subjects,
            roles: self.roles,
        }
    }
}

/// A native input task: `prompt`, `schema`, `answerers`, `wait_secs`,
/// `default`.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeInput {
    prompt: String,
    schema: Option<Map<String, Value>>,
    answerers: Option<NativeAnswerers>,
    wait_secs: u32,
    default: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeAnswerers {
    submitter: bool,
    subjects: Vec<String>,
    roles: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeCommand {
    command: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    stdin_from: String,
    limits: Option<NativeLimits>,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeLimits {
    memory_bytes: u64,
    cpu_seconds: u64,
    processes: u64,
    open_files: u64,
    file_size_bytes: u64,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NativeAgent {
    capability: String,
    input: Map<String, Value>,
    output_mapping: BTreeMap<String, String>,
    min_trust: Option<u32>,
    max_cost_micro_usd: Option<i64>,
    exclude_agents: Vec<String>,
    prefer_agents: Vec<String>,
    no_downgrade: bool,
}

/// A native `llm` block (the OJS field names without their prefix, and
/// `instructions`) to an LlmTask; violations are named under `at`.
fn native_llm(at: &str, llm: &Value) -> Result<LlmTask, FormatError> {
    let mut doc = Map::new();
    doc.insert("type".into(), Value::String("llm".into()));
    if let Value::Object(m) = llm {
        for (k, v) in m {
            if k == "prompt" {
                doc.insert("args".into(), Value::Array(vec![v.clone()]));
            } else {
                doc.insert(format!("ext_agent_{k}"), v.clone());
            }
        }
    }
    let limits = Limits {
        max_tasks: usize::MAX,
        max_delegation_depth: 10,
    };
    let converted = ojs(&Value::Object(doc), limits).map_err(|mut e| {
        for v in &mut e.violations.0 {
            v.field = format!("{at}.{}", v.field.trim_start_matches("ext_agent_"));
        }
        e
    })?;
    match converted.tasks.into_iter().next().and_then(|t| t.kind) {
        Some(task_spec::Kind::Llm(mut l)) => {
            if let Value::Object(m) = llm {
                l.instructions = m
                    .get("instructions")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
            }
            Ok(l)
        }
        _ => Err(FormatError::one(
            Reason::InvalidArgument,
            at,
            "an llm block needs at least a model",
        )),
    }
}

/// The native JobSpec document (JSON or YAML) to a JobSpec.
///
/// Long on purpose: every field of the document mapped in one place, in
/// the proto's order, so a new field is added next to its neighbours.
fn native(v: &Value, found: &mut Violations) -> Result<JobSpec, FormatError> {
    let j: NativeJob = typed(v, found)?;
    let mut tasks = Vec::new();
    for (i, t) in j.tasks.into_iter().enumerate() {
        let at = format!("tasks[{i}]");
        let kinds = usize::from(t.command.is_some())
            + usize::from(t.agent.is_some())
            + usize::from(t.llm.is_some())
            + usize::from(t.input.is_some())
            + usize::from(t.conversation.is_some());
        if kinds != 1 {
            return Err(FormatError::one(
                Reason::InvalidArgument,
                &at,
                "a task needs exactly one of command, agent, llm, input or conversation",
            ));
        }
        let kind = if let Some(c) = t.conversation {
            let orchestrator = match &c.orchestrator {
                Some(o) => Some(native_llm(&format!("{at}.conversation.orchestrator"), o)?),
                None => None,
            };
            task_spec::Kind::Conversation(ConversationTask {
                orchestrator,
                participants: c.participants.map(NativeAnswerers::proto),
                idle_secs: c.idle_secs,
                max_messages: c.max_messages,
                handoff: c.handoff.map(|h| HandoffLimits {
                    max_turns: h.max_turns,
                    timeout_secs: h.timeout_secs,
                    max_tokens: h.max_tokens,
                    max_cost_micro_usd: h.max_cost_micro_usd,
                }),
            })
        } else if let Some(q) = t.input {
            task_spec::Kind::Input(InputTask {
                prompt: q.prompt,
                answer_schema: q.schema.and_then(|m| json_to_struct(&Value::Object(m))),
                answerers: q.answerers.map(NativeAnswerers::proto),
                wait_secs: q.wait_secs,
                default_answer: q.default.as_ref().map(switchyard_kit::json::json_to_value),
            })
        } else if let Some(c) = t.command {
            task_spec::Kind::Command(CommandTask {
                command: c.command,
                args: c.args,
                env: c.env,
                stdin_from: c.stdin_from,
                limits: c.limits.map(|l| ResourceLimits {
                    memory_bytes: l.memory_bytes,
                    cpu_seconds: l.cpu_seconds,
                    processes: l.processes,
                    open_files: l.open_files,
                    file_size_bytes: l.file_size_bytes,
                }),
            })
        } else if let Some(a) = t.agent {
            task_spec::Kind::Agent(AgentTask {
                capability: a.capability,
                input: json_to_struct(&Value::Object(a.input)),
                output_mapping: a.output_mapping,
                min_trust: a.min_trust,
                max_cost_micro_usd: a.max_cost_micro_usd,
                exclude_agents: a.exclude_agents,
                prefer_agents: a.prefer_agents,
                no_downgrade: a.no_downgrade,
            })
        } else {
            task_spec::Kind::Llm(native_llm(
                &format!("{at}.llm"),
                t.llm.as_ref().unwrap_or(&Value::Null),
            )?)
        };
        tasks.push(TaskSpec {
            id: t.id,
            name: t.name,
            depends_on: t.depends_on,
            timeout_secs: t.timeout_secs,
            retry: retry(&t.retry, &format!("{at}.retry"))?,
            fallback: fallback(&t.fallback, &format!("{at}.fallback"))?,
            priority: t.priority,
            deadline: timestamp(t.deadline),
            cost_limit: t
                .cost_limit_usd
                .map(|c| usd_to_micro(c, &format!("{at}.cost_limit_usd")))
                .transpose()?,
            kind: Some(kind),
        });
    }
    let budget = match j.budget {
        None => None,
        Some(b) => Some(JobBudget {
            token_budget: b.token_budget,
            cost_limit: match (b.cost_limit_micro_usd, b.cost_limit_usd) {
                (Some(m), _) => Some(Money { micro_usd: m }),
                (None, Some(usd)) => Some(usd_to_micro(usd, "budget.cost_limit_usd")?),
                (None, None) => None,
            },
            parent_budget_id: b.parent_budget_id,
        }),
    };
    Ok(JobSpec {
        job_id: j.job_id,
        plan_id: j.plan_id,
        plan_description: j.plan_description,
        correlation_id: j.correlation_id,
        input: j.input.and_then(|m| json_to_struct(&Value::Object(m))),
        tasks,
        budget,
        approval: j.approval.map(|a| JobApproval {
            intent: a.intent,
            tools_allowed: a.tools_allowed,
            outputs_allowed: a.outputs_allowed,
            requires_approval: a.requires_approval,
        }),
        labels: j.labels,
        priority: j.priority,
        queue: j.queue,
        delegation: j.delegation.map(|d| Delegation {
            parent_job_id: d.parent_job_id,
            depth: d.depth,
            max_depth: d.max_depth,
        }),
        deadline: timestamp(j.deadline),
        scheduled_at: timestamp(j.scheduled_at),
        max_parallel: j.max_parallel,
        ..Default::default()
    })
}

/// Parses `text` as every format, then normalizes and validates what
/// converted — the path every door's submission takes — and drops the
/// result. Whatever a client sends, this returns: the fuzzers (`make fuzz`,
/// and the property tests `make test` runs) drive it.
pub fn exercise(text: &str) {
    let commands = vec!["true".to_owned(), "sort".to_owned()];
    let caps = crate::command::limits::ResourceLimits::default();
    let rules = crate::spec::Rules {
        max_tasks: 100,
        commands: &commands,
        default_timeout_secs: 300,
        default_max_parallel: 4,
        max_delegation_depth: 10,
        max_file_bytes: 1 << 20,
        limit_caps: &caps,
    };
    let limits = Limits {
        max_tasks: 100,
        max_delegation_depth: 10,
    };
    for format in ["", NATIVE, AGENIX, AITP, OJS, OJS_QUEUE] {
        if let Ok(mut p) = parse_document(text, format, limits) {
            crate::spec::normalize(&mut p.spec, &rules);
            let _ = crate::spec::validate(&p.spec, &rules);
            let _ = crate::spec::context_hash(&p.spec);
        }
    }
}
