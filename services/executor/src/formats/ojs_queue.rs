//! An OJS job for pull workers (`ojs-queue`): the envelope of the OJS HTTP
//! binding's `POST /ojs/v1/jobs`, as one queue task on `options.queue`
//! (default `default`) whose payload is `args`. The envelope's own rules
//! apply (OJS 1.0): a lowercase UUIDv7 `id` if given, a dotted lowercase
//! `type`, `args` an array, a queue name, priority −100…100, and a retry
//! policy whose durations are ISO 8601 (`PT1S`) or `*_ms` integers.
//! Everything the job model has no field for — `meta`, `options`, `ext_*`
//! and unknown top-level fields — is kept in `JobSpec.envelope` and
//! returned as submitted; system-managed fields sent by a client are
//! dropped (seed 000 §6).

use serde_json::{Map, Value};
use switchyard_core::{Reason, Violations};
use switchyard_kit::json::json_to_struct;
use switchyard_proto::executor::v1::{
    BackoffStrategy, Delegation, JobApproval, JobBudget, JobSpec, QueueTask, RetryPolicy, TaskSpec,
    task_spec,
};

use super::{FormatError, Limits};

/// What an OJS job keeps of its document beyond the job model's own
/// fields: `meta`, `options`, `ext_*` and unknown top-level fields, as
/// submitted (`args` too when `keep_args`: a queue job's args are its
/// task's payload). Never `id`, `type` or what the server sets.
pub(crate) fn envelope(o: &Map<String, Value>, keep_args: bool) -> Option<prost_types::Struct> {
    let kept: Map<String, Value> = o
        .iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            !matches!(k, "id" | "type")
                && (keep_args || k != "args")
                && !SYSTEM_MANAGED.contains(&k)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    json_to_struct(&Value::Object(kept))
}

/// Fields the server sets; a client's values are ignored.
pub(crate) const SYSTEM_MANAGED: &[&str] = &[
    "state",
    "attempt",
    "created_at",
    "enqueued_at",
    "started_at",
    "completed_at",
    "cancelled_at",
    "discarded_at",
    "error",
    "errors",
    "result",
    "specversion",
    "ext_agent_tokens_used",
    "ext_agent_cost_usd",
    "ext_agent_model_used",
    "ext_agent_tool_results",
];

/// The task id of an OJS queue job's one task.
pub const TASK_ID: &str = "job";

/// The OJS retry defaults: 3 attempts, from 1 s, doubling, at most 5 min,
/// with jitter.
fn default_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 2,
        backoff_strategy: BackoffStrategy::Exponential as i32,
        backoff_base_ms: 1000,
        backoff_max_ms: 300_000,
        jitter: 0.5,
        backoff_coefficient: 2.0,
        non_retryable_errors: Vec::new(),
    }
}

/// A lowercase, hyphenated UUID of version 7.
pub fn is_uuidv7(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() == 36
        && s.chars().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
        && b[14] == b'7'
        && matches!(b[19], b'8' | b'9' | b'a' | b'b')
}

/// An ISO 8601 duration (`PT1S`, `PT0.5S`, `PT5M`, `PT1H30M`, `P1D`) in ms.
pub fn iso_duration_ms(s: &str) -> Option<u64> {
    let rest = s.strip_prefix('P')?;
    let (days, time) = match rest.split_once('T') {
        Some((d, t)) => (d, t),
        None => (rest, ""),
    };
    if days.is_empty() && time.is_empty() {
        return None;
    }
    let mut ms = 0f64;
    let mut take = |part: &str, units: &[(char, f64)]| -> Option<()> {
        let mut num = String::new();
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' {
                num.push(c);
                continue;
            }
            let (_, scale) = units.iter().find(|(u, _)| *u == c)?;
            ms += num.parse::<f64>().ok()? * scale;
            num.clear();
        }
        num.is_empty().then_some(())
    };
    take(days, &[('W', 604_800_000.0), ('D', 86_400_000.0)])?;
    take(time, &[('H', 3_600_000.0), ('M', 60_000.0), ('S', 1000.0)])?;
    (0.0..1e15).contains(&ms).then_some(ms.round() as u64)
}

/// A duration given as `<name>` (ISO 8601) or `<name>_ms` (integer).
fn duration(o: &Map<String, Value>, name: &str, at: &str, v: &mut Violations) -> Option<u64> {
    if let Some(x) = o.get(&format!("{name}_ms")) {
        return match x.as_u64() {
            Some(ms) => Some(ms),
            None => {
                v.add(
                    format!("{at}.{name}_ms"),
                    "must be a non-negative integer of milliseconds",
                );
                None
            }
        };
    }
    match o.get(name) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match iso_duration_ms(s) {
            Some(ms) => Some(ms),
            None => {
                v.add(
                    format!("{at}.{name}"),
                    format!("{s:?} is not an ISO 8601 duration (e.g. \"PT1S\", \"PT5M\")"),
                );
                None
            }
        },
        Some(Value::Number(n)) => n.as_u64().map(|s| s * 1000),
        Some(_) => {
            v.add(
                format!("{at}.{name}"),
                "must be an ISO 8601 duration such as \"PT1S\"",
            );
            None
        }
    }
}

/// `options.retry` to a retry policy (violations under `options.retry`).
fn retry(r: &Value, v: &mut Violations) -> Option<RetryPolicy> {
    let at = "options.retry";
    let Some(o) = r.as_object() else {
        v.add(at, "retry must be an object");
        return None;
    };
    let mut p = default_retry();
    match o.get("max_attempts") {
        None | Some(Value::Null) => {}
        Some(m) => match m.as_u64() {
            Some(n) if (1..=101).contains(&n) => p.max_retries = (n - 1) as u32,
            _ => v.add(
                format!("{at}.max_attempts"),
                format!("max_attempts must be an integer from 1 to 101, got {m}"),
            ),
        },
    }
    if let Some(ms) = duration(o, "initial_interval", at, v) {
        p.backoff_base_ms = ms.max(1);
    }
    if let Some(ms) = duration(o, "max_interval", at, v) {
        p.backoff_max_ms = ms.max(p.backoff_base_ms);
    }
    match o.get("backoff_coefficient") {
        None | Some(Value::Null) => {}
        Some(c) => match c.as_f64() {
            Some(c) if (1.0..=100.0).contains(&c) => p.backoff_coefficient = c,
            _ => v.add(
                format!("{at}.backoff_coefficient"),
                format!("backoff_coefficient must be a number from 1 to 100, got {c}"),
            ),
        },
    }
    let strategy = o
        .get("backoff_strategy")
        .or_else(|| o.get("backoff_type"))
        .and_then(Value::as_str)
        .unwrap_or("exponential");
    p.backoff_strategy = match strategy {
        "exponential" => BackoffStrategy::Exponential,
        "linear" => BackoffStrategy::Linear,
        "constant" | "fixed" => BackoffStrategy::Fixed,
        other => {
            v.add(
                format!("{at}.backoff_strategy"),
                format!("backoff_strategy must be exponential, linear or constant, got {other:?}"),
            );
            BackoffStrategy::Exponential
        }
    } as i32;
    match o.get("jitter") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(j)) => p.jitter = if *j { 0.5 } else { 0.0 },
        Some(j) => match j.as_f64() {
            Some(f) if (0.0..=1.0).contains(&f) => p.jitter = f,
            _ => v.add(format!("{at}.jitter"), "jitter must be true, false or 0-1"),
        },
    }
    match o.get("non_retryable_errors") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            p.non_retryable_errors = a
                .iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect();
        }
        Some(_) => v.add(
            format!("{at}.non_retryable_errors"),
            "non_retryable_errors must be an array of error codes or `Prefix.*` patterns",
        ),
    }
    match o.get("on_exhaustion").and_then(Value::as_str) {
        None | Some("discard" | "dead_letter") => {}
        Some(other) => v.add(
            format!("{at}.on_exhaustion"),
            format!("on_exhaustion must be discard or dead_letter, got {other:?}"),
        ),
    }
    Some(p)
}

/// When to run: `delay_until` / `scheduled_at`, absolute (RFC 3339) or
/// relative to `now_ms` (`+PT2S`).
fn schedule(
    options: &Map<String, Value>,
    now_ms: u64,
    v: &mut Violations,
) -> Option<prost_types::Timestamp> {
    let (field, s) = ["delay_until", "scheduled_at"]
        .iter()
        .find_map(|f| options.get(*f).and_then(Value::as_str).map(|s| (*f, s)))?;
    let at = format!("options.{field}");
    if let Some(rel) = s.strip_prefix('+') {
        return match iso_duration_ms(rel) {
            Some(ms) => Some(switchyard_kit::time::timestamp(now_ms + ms)),
            None => {
                v.add(
                    at,
                    format!("{s:?} is neither an RFC 3339 time nor +<ISO 8601 duration>"),
                );
                None
            }
        };
    }
    match s.parse::<prost_types::Timestamp>() {
        Ok(t) => Some(t),
        Err(e) => {
            v.add(at, format!("{s:?} is not an RFC 3339 time: {e}"));
            None
        }
    }
}

/// An OJS envelope to a queue job (see the module docs). `now_ms` anchors
/// relative schedules.
pub(crate) fn convert(v: &Value, limits: Limits, now_ms: u64) -> Result<JobSpec, FormatError> {
    let o = v.as_object().cloned().unwrap_or_default();
    let mut bad = Violations::new();
    let mut reason = Reason::InvalidArgument;
    let id = match o.get("id") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) if is_uuidv7(s) => s.clone(),
        Some(x) => {
            bad.add(
                "id",
                format!("id must be a lowercase UUIDv7 (or absent, to have one made), got {x}"),
            );
            String::new()
        }
    };
    let job_type = match o.get("type") {
        Some(Value::String(t)) => {
            if let Err(e) = switchyard_core::validate::job_type(t) {
                bad.add("type", e);
            }
            t.clone()
        }
        None | Some(Value::Null) => {
            bad.add("type", "an OJS job needs a type, e.g. \"email.send\"");
            String::new()
        }
        Some(x) => {
            bad.add("type", format!("type must be a string, got {x}"));
            String::new()
        }
    };
    let args = match o.get("args") {
        Some(a @ Value::Array(_)) => a.clone(),
        None => {
            bad.add(
                "args",
                "an OJS job needs args: an array of its arguments (may be empty)",
            );
            Value::Null
        }
        Some(x) => {
            bad.add("args", format!("args must be an array, got {x}"));
            Value::Null
        }
    };
    if o.get("meta")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        bad.add("meta", "meta must be an object");
    }
    let options = match o.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            bad.add("options", "options must be an object");
            Map::new()
        }
    };
    let queue = match options.get("queue") {
        None | Some(Value::Null) => "default".to_owned(),
        Some(Value::String(q)) => {
            if let Err(e) = switchyard_core::validate::queue(q) {
                bad.add("options.queue", e);
            }
            q.clone()
        }
        Some(x) => {
            bad.add("options.queue", format!("queue must be a string, got {x}"));
            String::new()
        }
    };
    let priority = match options.get("priority") {
        None | Some(Value::Null) => 0,
        Some(p) => match p.as_i64() {
            Some(p) if (-100..=100).contains(&p) => p as i32,
            _ => {
                bad.add(
                    "options.priority",
                    format!("priority must be an integer from -100 to 100, got {p}"),
                );
                0
            }
        },
    };
    let timeout_secs = match options.get("timeout_ms") {
        None | Some(Value::Null) => 0,
        Some(t) => match t.as_u64() {
            Some(ms) if ms <= 86_400_000 => ms.div_ceil(1000) as u32,
            _ => {
                bad.add(
                    "options.timeout_ms",
                    format!("timeout_ms must be 0-86400000, got {t}"),
                );
                0
            }
        },
    };
    let visibility_timeout_ms = match options.get("visibility_timeout_ms") {
        None | Some(Value::Null) => 0,
        Some(t) => match t.as_u64() {
            Some(ms) if (100..=86_400_000).contains(&ms) => ms,
            _ => {
                bad.add(
                    "options.visibility_timeout_ms",
                    format!("visibility_timeout_ms must be 100-86400000, got {t}"),
                );
                0
            }
        },
    };
    let retry = match options.get("retry") {
        None | Some(Value::Null) => Some(default_retry()),
        Some(r) => retry(r, &mut bad),
    };
    let dead_letter = options
        .get("retry")
        .and_then(|r| r.get("on_exhaustion"))
        .and_then(Value::as_str)
        == Some("dead_letter");
    let scheduled_at = schedule(&options, now_ms, &mut bad);
    let pending = match options.get("pending") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            bad.add("options.pending", "pending must be true or false");
            false
        }
    };
    let uint = |k: &str, bad: &mut Violations| -> Option<u64> {
        match o.get(k) {
            None | Some(Value::Null) => None,
            Some(x) => x.as_u64().or_else(|| {
                bad.add(k, format!("{k} must be a non-negative integer"));
                None
            }),
        }
    };
    let depth = uint("ext_agent_delegation_depth", &mut bad).unwrap_or(0) as u32;
    let max_depth = uint("ext_agent_max_delegation_depth", &mut bad)
        .map_or(limits.max_delegation_depth, |m| {
            (m as u32).min(limits.max_delegation_depth)
        });
    if depth > max_depth {
        bad.add(
            "ext_agent_delegation_depth",
            format!("delegation depth {depth} exceeds the maximum of {max_depth}"),
        );
        reason = Reason::AgentMaxDelegationDepth;
    }
    let token_budget = uint("ext_agent_token_budget", &mut bad);
    if !bad.is_empty() {
        return Err(FormatError::new(reason, bad));
    }
    let mut labels = std::collections::BTreeMap::new();
    labels.insert("ojs.type".to_owned(), job_type.clone());
    Ok(JobSpec {
        job_id: id,
        plan_id: job_type.clone(),
        plan_description: format!("OJS job {job_type} on queue {queue}"),
        tasks: vec![TaskSpec {
            id: TASK_ID.into(),
            name: job_type.clone(),
            timeout_secs,
            retry,
            kind: Some(task_spec::Kind::Queue(QueueTask {
                queue: queue.clone(),
                payload: Some(switchyard_kit::json::json_to_value(&args)),
                visibility_timeout_ms,
            })),
            ..Default::default()
        }],
        budget: token_budget.map(|t| JobBudget {
            token_budget: Some(t),
            ..Default::default()
        }),
        approval: Some(JobApproval {
            intent: format!("OJS job {job_type} on queue {queue}"),
            requires_approval: pending,
            ..Default::default()
        }),
        labels,
        priority,
        queue,
        delegation: Some(Delegation {
            parent_job_id: o
                .get("ext_agent_parent_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            depth,
            max_depth,
        }),
        scheduled_at,
        envelope: envelope(&o, false),
        dead_letter,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_durations_read_as_milliseconds() {
        assert_eq!(iso_duration_ms("PT1S"), Some(1000));
        assert_eq!(iso_duration_ms("PT0.5S"), Some(500));
        assert_eq!(iso_duration_ms("PT5M"), Some(300_000));
        assert_eq!(iso_duration_ms("PT1H30M"), Some(5_400_000));
        assert_eq!(iso_duration_ms("P1D"), Some(86_400_000));
        for bad in ["", "P", "PT", "1S", "PTS", "PT1X", "PT-1S"] {
            assert_eq!(iso_duration_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_lowercase_version_7_uuids_are_ids() {
        assert!(is_uuidv7("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"));
        assert!(!is_uuidv7("019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F"));
        assert!(!is_uuidv7("550e8400-e29b-41d4-a716-446655440000"));
        assert!(!is_uuidv7("019461a8-1a2b-7c3d-0e4f-5a6b7c8d9e0f"));
        assert!(!is_uuidv7("not-a-uuid"));
    }

    fn limits() -> Limits {
        Limits {
            max_tasks: 100,
            max_delegation_depth: 10,
        }
    }

    #[test]
    fn an_envelope_becomes_one_queue_task_and_keeps_what_the_model_has_no_field_for() {
        let v = serde_json::json!({
            "type": "email.send", "args": ["a", 1], "meta": {"trace_id": "t"},
            "options": {"queue": "mail", "priority": 5, "retry": {"max_attempts": 4, "initial_interval": "PT2S", "backoff_coefficient": 3.0, "max_interval": "PT1M", "jitter": false}},
            "x_custom": {"n": 1}, "state": "completed", "ext_agent_tokens_used": 99
        });
        let spec = convert(&v, limits(), 0).unwrap();
        let t = &spec.tasks[0];
        let Some(task_spec::Kind::Queue(q)) = &t.kind else {
            panic!("{t:?}")
        };
        assert_eq!(q.queue, "mail");
        let r = t.retry.clone().unwrap();
        assert_eq!(
            (r.max_retries, r.backoff_base_ms, r.backoff_max_ms, r.jitter),
            (3, 2000, 60_000, 0.0)
        );
        assert_eq!(r.backoff_coefficient, 3.0);
        assert_eq!(spec.priority, 5);
        let env = switchyard_kit::json::struct_to_json(spec.envelope.as_ref().unwrap());
        assert_eq!(env["x_custom"]["n"], 1);
        assert_eq!(env["meta"]["trace_id"], "t");
        assert!(env.get("state").is_none() && env.get("ext_agent_tokens_used").is_none());
    }

    #[test]
    fn envelope_rules_name_each_bad_field() {
        let cases = [
            (serde_json::json!({"args": []}), "type"),
            (
                serde_json::json!({"type": "Email.Send", "args": []}),
                "type",
            ),
            (serde_json::json!({"type": "a.b"}), "args"),
            (serde_json::json!({"type": "a.b", "args": {}}), "args"),
            (
                serde_json::json!({"type": "a.b", "args": [], "id": ""}),
                "id",
            ),
            (
                serde_json::json!({"type": "a.b", "args": [], "options": {"queue": "Default"}}),
                "options.queue",
            ),
            (
                serde_json::json!({"type": "a.b", "args": [], "options": {"priority": 101}}),
                "options.priority",
            ),
            (
                serde_json::json!({"type": "a.b", "args": [], "options": {"retry": {"backoff_coefficient": 0.5}}}),
                "options.retry.backoff_coefficient",
            ),
            (
                serde_json::json!({"type": "a.b", "args": [], "options": {"retry": {"max_attempts": -1}}}),
                "options.retry.max_attempts",
            ),
            (
                serde_json::json!({"type": "a.b", "args": [], "options": {"delay_until": "soon"}}),
                "options.delay_until",
            ),
        ];
        for (doc, field) in cases {
            let e = convert(&doc, limits(), 0).unwrap_err();
            assert!(
                e.violations.0.iter().any(|v| v.field == field),
                "{doc}: {:?}",
                e.violations
            );
        }
    }

    #[test]
    fn a_delegation_deeper_than_allowed_is_refused_with_its_reason() {
        let doc = serde_json::json!({"type": "a.b", "args": [], "ext_agent_delegation_depth": 4, "ext_agent_max_delegation_depth": 3});
        let e = convert(&doc, limits(), 0).unwrap_err();
        assert_eq!(e.reason, Reason::AgentMaxDelegationDepth);
    }
}
