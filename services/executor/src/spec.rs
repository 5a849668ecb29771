//! The rules every JobSpec obeys, whatever format it came in: ids, task
//! kinds, the command allowlist, templates a task can see, retry and fallback
//! settings, delegation depth, the DAG. [`normalize`] fills defaults, so the
//! stored spec is exactly what runs, and [`context_hash`] binds it to its
//! approval run.

use std::collections::HashSet;

use prost::Message as _;
use serde_json::Value;
use sha2::{Digest, Sha256};
use switchyard_core::dag::{Dag, Node};
use switchyard_core::money::{check_micro_usd, check_tokens};
use switchyard_core::template::{self, Ref};
use switchyard_core::validate::{capability, key, optional_key, optional_object_id, tool_name};
use switchyard_core::{Reason, Violations};
use switchyard_kit::json::struct_to_json;
use switchyard_proto::executor::v1::{FallbackStrategy as FS, JobSpec, TaskSpec, task_spec::Kind};
use switchyard_sandbox::{DENIED_ENV, denied_env};

use crate::formats::FormatError;

use crate::command::limits::ResourceLimits;

/// What validation needs from the deployment.
#[derive(Debug, Clone)]
pub struct Rules<'a> {
    /// Most tasks in a job.
    pub max_tasks: usize,
    /// Commands a task may run.
    pub commands: &'a [String],
    /// Timeout when a task gives none, seconds.
    pub default_timeout_secs: u32,
    /// Parallel tasks when the job gives no limit.
    pub default_max_parallel: u32,
    /// Deployment cap on delegation depth.
    pub max_delegation_depth: u32,
    /// Most bytes of `files` in a job.
    pub max_file_bytes: usize,
    /// The most a command task may ask for (0: no cap).
    pub limit_caps: &'a ResourceLimits,
}

fn task_id(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else if s.is_empty() {
        Err("task id is required".into())
    } else {
        Err(format!(
            "task id {s:?} must be 1-64 letters, digits, '_' or '-'"
        ))
    }
}

fn env_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some('A'..='Z' | '_'))
        && c.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Fills defaults in place: plan id, task names, timeouts, parallelism.
pub fn normalize(spec: &mut JobSpec, rules: &Rules<'_>) {
    if spec.plan_id.is_empty() {
        spec.plan_id = "adhoc".into();
    }
    if spec.max_parallel == 0 {
        spec.max_parallel = rules.default_max_parallel.max(1);
    }
    for t in &mut spec.tasks {
        if t.name.is_empty() {
            t.name = t.id.clone();
        }
        if t.timeout_secs == 0 {
            t.timeout_secs = rules.default_timeout_secs;
        }
    }
}

/// Checks a (normalized) spec; returns its DAG. The error's reason is the
/// most specific one found (e.g. `COMMAND_NOT_ALLOWED`), else INVALID_ARGUMENT.
pub fn validate(spec: &JobSpec, rules: &Rules<'_>) -> Result<Dag, FormatError> {
    let mut v = Violations::new();
    let mut reason = Reason::InvalidArgument;
    let mut specific = |r: Reason, reason: &mut Reason| {
        if *reason == Reason::InvalidArgument {
            *reason = r;
        }
    };
    v.check("job_id", optional_object_id(&spec.job_id, "job_id"));
    v.check("plan_id", key(&spec.plan_id, "plan_id"));
    if !spec.correlation_id.is_empty()
        && !switchyard_kit::context::is_valid_correlation_id(&spec.correlation_id)
    {
        v.add(
            "correlation_id",
            "correlation_id must be 1-128 visible ASCII characters",
        );
    }
    if spec.tasks.is_empty() {
        v.add("tasks", "a job needs at least one task");
    }
    if spec.tasks.len() > rules.max_tasks {
        v.add(
            "tasks",
            format!(
                "{} tasks exceed the limit of {}",
                spec.tasks.len(),
                rules.max_tasks
            ),
        );
    }
    for k in spec.labels.keys() {
        v.check(format!("labels.{k}"), key(k, "label key"));
    }
    if let Some(b) = &spec.budget {
        v.check(
            "budget.parent_budget_id",
            optional_key(&b.parent_budget_id, "parent_budget_id"),
        );
        if let Some(m) = &b.cost_limit {
            v.check(
                "budget.cost_limit",
                check_micro_usd(m.micro_usd, "cost_limit"),
            );
        }
        if let Some(t) = b.token_budget {
            v.check("budget.token_budget", check_tokens(t, "token_budget"));
        }
    }
    if let Some(d) = &spec.delegation {
        let max = if d.max_depth == 0 {
            rules.max_delegation_depth
        } else {
            d.max_depth.min(rules.max_delegation_depth)
        };
        if d.depth > max {
            v.add(
                "delegation.depth",
                format!("delegation depth {} exceeds the maximum of {max}", d.depth),
            );
            specific(Reason::AgentMaxDelegationDepth, &mut reason);
        }
    }
    check_files(&mut v, &spec.files, rules.max_file_bytes);
    if let Some(a) = &spec.approval {
        check_approval(&mut v, a);
    }
    for (i, t) in spec.tasks.iter().enumerate() {
        v.check(format!("tasks[{i}].id"), task_id(&t.id));
        check_task(&mut v, &mut reason, &mut specific, i, t, rules);
    }
    let dag = if v.is_empty() {
        match dag(spec) {
            Ok(d) => Some(d),
            Err(e) => {
                v.0.extend(e.violations.0);
                None
            }
        }
    } else {
        None
    };
    if let Some(dag) = &dag {
        check_references(&mut v, spec, dag);
    }
    match (dag, v.is_empty()) {
        (Some(d), true) => Ok(d),
        _ => Err(FormatError::new(reason, v)),
    }
}

fn check_task(
    v: &mut Violations,
    reason: &mut Reason,
    specific: &mut impl FnMut(Reason, &mut Reason),
    i: usize,
    t: &TaskSpec,
    rules: &Rules<'_>,
) {
    let at = format!("tasks[{i}]");
    if t.timeout_secs > 86_400 {
        v.add(
            format!("{at}.timeout_secs"),
            "timeout_secs must be at most 86400 (a day)",
        );
    }
    if let Some(r) = &t.retry {
        check_retry(v, &at, r);
    }
    if let Some(f) = &t.fallback {
        check_fallback(v, &at, t, f);
    }
    if let Some(m) = &t.cost_limit {
        v.check(
            format!("{at}.cost_limit"),
            check_micro_usd(m.micro_usd, "cost_limit"),
        );
    }
    match &t.kind {
        None => v.add(
            format!("{at}.kind"),
            "a task needs one of command, agent, llm, queue, input or conversation",
        ),
        Some(Kind::Input(t)) => check_input(v, &at, t),
        Some(Kind::Conversation(c)) => check_conversation(v, reason, specific, &at, c),
        Some(Kind::Command(c)) => check_command(v, reason, specific, &at, c, rules),
        Some(Kind::Agent(a)) => {
            v.check(format!("{at}.agent.capability"), capability(&a.capability));
            if a.min_trust.is_some_and(|m| m > 100) {
                v.add(format!("{at}.agent.min_trust"), "min_trust must be 0-100");
            }
            if a.max_cost_micro_usd.is_some_and(|m| m < 0) {
                v.add(
                    format!("{at}.agent.max_cost_micro_usd"),
                    "must not be negative",
                );
            }
        }
        Some(Kind::Llm(l)) => check_llm(v, reason, specific, &format!("{at}.llm"), l),
        Some(Kind::Queue(q)) => {
            v.check(
                format!("{at}.queue.queue"),
                switchyard_core::validate::queue(&q.queue),
            );
            if q.visibility_timeout_ms > 86_400_000 {
                v.add(
                    format!("{at}.queue.visibility_timeout_ms"),
                    "visibility_timeout_ms must be at most 86400000 (a day)",
                );
            }
        }
    }
}

/// An input task: a prompt, a wait within bounds, a schema that compiles
/// and a default it accepts, answerers of the roles that may answer.
fn check_input(v: &mut Violations, at: &str, t: &switchyard_proto::executor::v1::InputTask) {
    let chars = t.prompt.chars().count();
    if chars == 0 || chars > 4000 {
        v.add(
            format!("{at}.input.prompt"),
            format!("prompt must be 1 to 4000 characters, got {chars}"),
        );
    }
    if u64::from(t.wait_secs) > crate::input::MAX_WAIT_SECS {
        v.add(
            format!("{at}.input.wait_secs"),
            format!(
                "wait_secs must be at most {} (30 days), got {}",
                crate::input::MAX_WAIT_SECS,
                t.wait_secs
            ),
        );
    }
    if let Some(schema) = &t.answer_schema {
        let schema = struct_to_json(schema);
        if let Err(e) = jsonschema::validator_for(&schema) {
            v.add(
                format!("{at}.input.answer_schema"),
                format!("answer_schema is not a valid JSON Schema: {e}"),
            );
        } else if let Some(d) = &t.default_answer {
            let d = switchyard_kit::json::value_to_json(d);
            if let Err(why) = switchyard_llm::agent::check_schema(&schema, &d) {
                v.add(
                    format!("{at}.input.default_answer"),
                    format!("default_answer does not match answer_schema: {why}"),
                );
            }
        }
    }
    if let Some(a) = &t.answerers {
        check_answerers(v, &format!("{at}.input.answerers"), a);
    }
}

/// Who may answer an input task, or take part in a conversation.
fn check_answerers(
    v: &mut Violations,
    at: &str,
    a: &switchyard_proto::executor::v1::InputAnswerers,
) {
    if a.subjects.len() > 32 {
        v.add(
            format!("{at}.subjects"),
            format!("at most 32 subjects, got {}", a.subjects.len()),
        );
    }
    for (j, s) in a.subjects.iter().enumerate() {
        if s.is_empty() || s.len() > 255 || s.chars().any(char::is_control) {
            v.add(
                format!("{at}.subjects[{j}]"),
                "a subject is 1 to 255 characters without control characters",
            );
        }
    }
    for (j, r) in a.roles.iter().enumerate() {
        let known = switchyard_kit::auth::Role::parse(r)
            .is_some_and(|r| crate::input::ANSWERING_ROLES.contains(&r));
        if !known {
            v.add(
                format!("{at}.roles[{j}]"),
                format!("role {r:?} cannot answer: use submitter, approver, operator or admin"),
            );
        }
    }
}

/// The model a task runs: an LLM task's, or a conversation's orchestrator.
pub(crate) fn model_task(kind: Option<&Kind>) -> Option<&switchyard_proto::executor::v1::LlmTask> {
    match kind {
        Some(Kind::Llm(l)) => Some(l),
        Some(Kind::Conversation(c)) => c.orchestrator.as_ref(),
        _ => None,
    }
}

/// A conversation task: its orchestrator is an LLM task without a prompt
/// or structured answer (each message is a turn's prompt, each reply text).
fn check_conversation(
    v: &mut Violations,
    reason: &mut Reason,
    specific: &mut impl FnMut(Reason, &mut Reason),
    at: &str,
    c: &switchyard_proto::executor::v1::ConversationTask,
) {
    let at = format!("{at}.conversation");
    match &c.orchestrator {
        None => v.add(
            format!("{at}.orchestrator"),
            "orchestrator is required: the model (and its instructions, tools and agents) that answers",
        ),
        Some(o) => {
            let oat = format!("{at}.orchestrator");
            check_llm(v, reason, specific, &oat, o);
            if !o.prompt.is_empty() {
                v.add(
                    format!("{oat}.prompt"),
                    "a conversation's orchestrator takes no prompt: each message is its turn's prompt (put standing instructions in instructions)",
                );
            }
            if !o.output_format.is_empty() || o.output_schema.is_some() || o.artifact.is_some() {
                v.add(
                    format!("{oat}.output_format"),
                    "a conversation answers in text: remove output_format, output_schema and artifact",
                );
            }
        }
    }
    if u64::from(c.idle_secs) > crate::input::MAX_WAIT_SECS {
        v.add(
            format!("{at}.idle_secs"),
            format!(
                "idle_secs must be at most {} (30 days), got {}",
                crate::input::MAX_WAIT_SECS,
                c.idle_secs
            ),
        );
    }
    if c.max_messages > crate::conversation::MAX_MESSAGES {
        v.add(
            format!("{at}.max_messages"),
            format!(
                "max_messages must be at most {}, got {}",
                crate::conversation::MAX_MESSAGES,
                c.max_messages
            ),
        );
    }
    if let Some(a) = &c.participants {
        check_answerers(v, &format!("{at}.participants"), a);
    }
    if let Some(h) = &c.handoff {
        if h.max_cost_micro_usd < 0 {
            v.add(
                format!("{at}.handoff.max_cost_micro_usd"),
                "max_cost_micro_usd must not be negative",
            );
        }
        if u64::from(h.timeout_secs) > crate::input::MAX_WAIT_SECS {
            v.add(
                format!("{at}.handoff.timeout_secs"),
                format!(
                    "timeout_secs must be at most {} (30 days), got {}",
                    crate::input::MAX_WAIT_SECS,
                    h.timeout_secs
                ),
            );
        }
    }
}

/// A task's retry policy.
fn check_retry(v: &mut Violations, at: &str, r: &switchyard_proto::executor::v1::RetryPolicy) {
    if r.max_retries > 100 {
        v.add(
            format!("{at}.retry.max_retries"),
            "max_retries must be at most 100",
        );
    }
    if !(0.0..=1.0).contains(&r.jitter) {
        v.add(
            format!("{at}.retry.jitter"),
            "jitter must be between 0 and 1",
        );
    }
    if r.backoff_coefficient != 0.0 && !(1.0..=100.0).contains(&r.backoff_coefficient) {
        v.add(
            format!("{at}.retry.backoff_coefficient"),
            format!(
                "backoff_coefficient must be between 1 and 100, got {}",
                r.backoff_coefficient
            ),
        );
    }
    if r.backoff_max_ms != 0 && r.backoff_max_ms < r.backoff_base_ms {
        v.add(
            format!("{at}.retry.backoff_max_ms"),
            "backoff_max_ms must be at least backoff_base_ms",
        );
    }
}

/// A task's fallbacks: each strategy only where it applies.
fn check_fallback(
    v: &mut Violations,
    at: &str,
    t: &TaskSpec,
    f: &switchyard_proto::executor::v1::FallbackPolicy,
) {
    let only = |v: &mut Violations, field: &str, got: i32, allowed: &[FS]| {
        let ok = got == 0 || allowed.iter().any(|a| *a as i32 == got);
        if !ok {
            let name = FS::try_from(got).map_or("unknown".into(), |s| s.as_str_name().to_owned());
            v.add(
                format!("{at}.fallback.{field}"),
                format!("{name} does not apply to {field}"),
            );
        }
    };
    only(
        v,
        "on_agent_offline",
        f.on_agent_offline,
        &[FS::SelectNextBest, FS::FailAndNotify],
    );
    only(
        v,
        "on_timeout",
        f.on_timeout,
        &[FS::RetryWithTimeoutExtension, FS::FailAndNotify],
    );
    only(
        v,
        "on_cost_exceeded",
        f.on_cost_exceeded,
        &[FS::FailAndNotify],
    );
    only(
        v,
        "on_capability_unavailable",
        f.on_capability_unavailable,
        &[FS::Defer, FS::FailAndNotify],
    );
    if f.on_timeout == FS::RetryWithTimeoutExtension as i32
        && f.extended_timeout_seconds <= t.timeout_secs
    {
        v.add(
            format!("{at}.fallback.extended_timeout_seconds"),
            format!("must exceed the task's timeout of {}s", t.timeout_secs),
        );
    }
}

/// A command task: the allowlist, arguments, limits within the caps, env.
fn check_command(
    v: &mut Violations,
    reason: &mut Reason,
    specific: &mut impl FnMut(Reason, &mut Reason),
    at: &str,
    c: &switchyard_proto::executor::v1::CommandTask,
    rules: &Rules<'_>,
) {
    if c.command.trim().is_empty() {
        v.add(format!("{at}.command.command"), "command is required");
    } else if !rules.commands.contains(&c.command) {
        v.add(
            format!("{at}.command.command"),
            format!(
                "command {:?} is not on the allowlist ({})",
                c.command,
                rules.commands.join(", ")
            ),
        );
        specific(Reason::CommandNotAllowed, reason);
    }
    for (j, a) in c.args.iter().enumerate() {
        if a.contains('\0') {
            v.add(
                format!("{at}.command.args[{j}]"),
                "arguments cannot contain NUL",
            );
        }
    }
    if let Some(asked) = &c.limits {
        for (l, v_asked, cap) in ResourceLimits::above_caps(asked, rules.limit_caps) {
            v.add(
                format!("{at}.command.limits.{}", l.name()),
                format!(
                    "{v_asked} is above this executor's cap of {cap} (executor.task_limit_caps.{})",
                    l.name()
                ),
            );
        }
    }
    for (k, val) in &c.env {
        if !env_name(k) || denied_env(k) {
            v.add(
                format!("{at}.command.env.{k}"),
                format!(
                    "{k:?} cannot be set (names are UPPER_SNAKE; LD_* and {} are reserved)",
                    DENIED_ENV.join(", ")
                ),
            );
        }
        if val.contains('\0') {
            v.add(format!("{at}.command.env.{k}"), "values cannot contain NUL");
        }
    }
}

/// An LLM task: model, temperature, tool names.
fn check_llm(
    v: &mut Violations,
    reason: &mut Reason,
    specific: &mut impl FnMut(Reason, &mut Reason),
    at: &str,
    l: &switchyard_proto::executor::v1::LlmTask,
) {
    if l.model.is_empty() {
        v.add(format!("{at}.model"), "model is required");
    }
    if let Some(t) = l.temperature
        && !(0.0..=2.0).contains(&t)
    {
        v.add(
            format!("{at}.temperature"),
            format!("temperature must be between 0.0 and 2.0, got {t}"),
        );
        specific(Reason::AgentInvalidParameter, reason);
    }
    for (field, tokens) in [
        ("max_tokens", l.max_tokens),
        ("token_budget", l.token_budget),
    ] {
        if let Some(Err(e)) = tokens.map(|t| check_tokens(t, field)) {
            v.add(format!("{at}.{field}"), e);
            specific(Reason::AgentInvalidParameter, reason);
        }
    }
    let mut seen = HashSet::new();
    for (j, tool) in l.tools.iter().enumerate() {
        let field = format!("{at}.tools[{j}].name");
        if let Err(e) = tool_name(&tool.name) {
            v.add(field, e);
            specific(Reason::AgentInvalidParameter, reason);
        } else if !seen.insert(&tool.name) {
            v.add(field, format!("tool name {:?} is used twice", tool.name));
            specific(Reason::AgentInvalidParameter, reason);
        }
    }
}

/// The job's files: plain names, within the size limit.
fn check_files(
    v: &mut Violations,
    files: &std::collections::BTreeMap<String, Vec<u8>>,
    max_bytes: usize,
) {
    let mut total = 0;
    for (name, bytes) in files {
        total += bytes.len();
        let plain = !name.is_empty()
            && name.len() <= 128
            && name != "."
            && name != ".."
            && !name.contains(['/', '\\', '\0']);
        if !plain {
            v.add(
                format!("files.{name}"),
                "file names must be plain names without directories",
            );
        }
    }
    if total > max_bytes {
        v.add(
            "files",
            format!("files hold {total} bytes; the limit is {}", max_bytes),
        );
    }
}

/// The tools and outputs an approval allows: valid names.
fn check_approval(v: &mut Violations, t: &switchyard_proto::executor::v1::JobApproval) {
    for (i, n) in t.tools_allowed.iter().enumerate() {
        v.check(format!("approval.tools_allowed[{i}]"), tool_name(n));
    }
    for (i, n) in t.outputs_allowed.iter().enumerate() {
        v.check(format!("approval.outputs_allowed[{i}]"), tool_name(n));
    }
}

/// The task graph of a spec (ids, dependencies, no cycles).
pub fn dag(spec: &JobSpec) -> Result<Dag, FormatError> {
    let nodes: Vec<Node<'_>> = spec
        .tasks
        .iter()
        .map(|t| Node {
            id: &t.id,
            depends_on: &t.depends_on,
            priority: t.priority,
        })
        .collect();
    Dag::build(&nodes).map_err(|violations| FormatError::new(Reason::InvalidArgument, violations))
}

/// The templated inputs of a task, as JSON, with where they sit.
pub fn templated(t: &TaskSpec) -> Vec<(String, Value)> {
    match &t.kind {
        Some(Kind::Agent(a)) => vec![(
            "agent.input".into(),
            a.input.as_ref().map(struct_to_json).unwrap_or(Value::Null),
        )],
        Some(Kind::Llm(l)) => vec![
            ("llm.prompt".into(), Value::String(l.prompt.clone())),
            (
                "llm.instructions".into(),
                Value::String(l.instructions.clone()),
            ),
        ],
        Some(Kind::Command(c)) => c
            .args
            .iter()
            .enumerate()
            .map(|(j, a)| (format!("command.args[{j}]"), Value::String(a.clone())))
            .collect(),
        Some(Kind::Input(t)) => vec![("input.prompt".into(), Value::String(t.prompt.clone()))],
        // Messages are taken as written; the instructions may read the
        // job's input.
        Some(Kind::Conversation(c)) => c
            .orchestrator
            .iter()
            .map(|o| {
                (
                    "conversation.orchestrator.instructions".into(),
                    Value::String(o.instructions.clone()),
                )
            })
            .collect(),
        // A worker gets its payload as submitted: no templates.
        Some(Kind::Queue(_)) | None => Vec::new(),
    }
}

/// Templates and stdin may only read the job input and tasks that finish
/// before this one (its ancestors in the DAG).
fn check_references(v: &mut Violations, spec: &JobSpec, dag: &Dag) {
    let index: std::collections::HashMap<&str, usize> = spec
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.as_str(), i))
        .collect();
    let input = spec
        .input
        .as_ref()
        .map(struct_to_json)
        .unwrap_or(Value::Null);
    let visible = |v: &mut Violations, field: String, i: usize, task: &str| match index.get(task) {
        None => v.add(field, format!("refers to unknown task {task:?}")),
        Some(&k) if !dag.is_ancestor(k, i) => v.add(
            field,
            format!(
                "task {:?} cannot read {task:?}: it does not depend on it (add it to depends_on)",
                spec.tasks[i].id
            ),
        ),
        Some(_) => {}
    };
    for (i, t) in spec.tasks.iter().enumerate() {
        if let Some(Kind::Command(c)) = &t.kind
            && !c.stdin_from.is_empty()
        {
            visible(
                v,
                format!("tasks[{i}].command.stdin_from"),
                i,
                &c.stdin_from,
            );
        }
        for (at, value) in templated(t) {
            match template::refs(&value, &format!("tasks[{i}].{at}")) {
                Err((field, e)) => v.add(field, e),
                Ok(refs) => {
                    for (field, r) in refs {
                        match r {
                            Ref::ParentInput(path) => {
                                if template::lookup(&input, &path[..1]).is_none() {
                                    v.add(
                                        field,
                                        format!("the job input has no field {:?}", path[0]),
                                    );
                                }
                            }
                            Ref::TaskOutput { task, .. } => visible(v, field, i, &task),
                        }
                    }
                }
            }
        }
    }
}

/// A content hash of the spec (`sha256:<hex>`), independent of map order and
/// of the server-assigned job and correlation ids: the approval context hash.
pub fn context_hash(spec: &JobSpec) -> String {
    let mut s = spec.clone();
    s.job_id.clear();
    s.correlation_id.clear();
    let mut h = Sha256::new();
    let mut sorted = |label: &str, map: &mut std::collections::BTreeMap<String, Vec<u8>>| {
        // Sorted by key (a BTreeMap), as this hash always took them.
        let entries = std::mem::take(map);
        h.update(label.as_bytes());
        for (k, v) in entries {
            h.update((k.len() as u64).to_be_bytes());
            h.update(k.as_bytes());
            h.update((v.len() as u64).to_be_bytes());
            h.update(&v);
        }
    };
    let strings = |m: &mut std::collections::BTreeMap<String, String>| {
        std::mem::take(m)
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect()
    };
    sorted("labels", &mut strings(&mut s.labels));
    sorted("files", &mut std::mem::take(&mut s.files));
    for t in &mut s.tasks {
        match &mut t.kind {
            Some(Kind::Command(c)) => sorted("env", &mut strings(&mut c.env)),
            Some(Kind::Agent(a)) => sorted("output_mapping", &mut strings(&mut a.output_mapping)),
            _ => {}
        }
    }
    h.update(s.encode_to_vec());
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}
