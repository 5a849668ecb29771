//! AgentRunSpec validation (seed 004's required fields), with a violation
//! per field, and the client-provided part of a run for idempotent proposals.

use switchyard_core::Violations;
use switchyard_core::validate::{key, optional_key};
use switchyard_proto::approval::v1::{Run, RunResult};

/// The one schema version this service speaks.
pub const SCHEMA_VERSION: &str = "agent_run_spec/v1";

/// `snake_case` names of tools and outputs (`filesystem_read`, `propose_pr`).
fn snake(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some('a'..='z'))
        && c.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && s.len() <= 64
}

/// `<algorithm>:<hex digest>`, e.g. `sha256:9f86d0…`.
fn content_hash(s: &str) -> bool {
    match s.split_once(':') {
        Some((algo, hex)) => {
            !algo.is_empty()
                && algo
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && hex.len() >= 8
                && hex.chars().all(|c| c.is_ascii_hexdigit())
        }
        None => false,
    }
}

fn names(v: &mut Violations, field: &str, list: &[String], example: &str) {
    if list.is_empty() {
        v.add(field, format!("{field} is required (e.g. [\"{example}\"])"));
    }
    for (i, n) in list.iter().enumerate() {
        if !snake(n) {
            v.add(
                format!("{field}[{i}]"),
                format!("{n:?} must be snake_case, at most 64 characters"),
            );
        }
    }
}

/// Checks a proposed run.
pub fn run(r: &Run) -> Result<(), Violations> {
    let mut v = Violations::new();
    if r.schema_version != SCHEMA_VERSION {
        v.add(
            "schema_version",
            if r.schema_version.is_empty() {
                format!("schema_version is required: {SCHEMA_VERSION}")
            } else {
                format!(
                    "unsupported schema_version {:?}; expected {SCHEMA_VERSION}",
                    r.schema_version
                )
            },
        );
    }
    v.check("run_id", optional_key(&r.run_id, "run id"));
    if r.created_by.is_empty() {
        v.add(
            "created_by",
            "created_by is required: the authenticated proposer",
        );
    } else {
        v.check("created_by", key(&r.created_by, "created_by"));
    }
    match &r.target {
        None => v.add("target", "target is required"),
        Some(t) => {
            if t.org.is_empty() {
                v.add("target.org", "target.org is required");
            }
            if t.work_item_ids.is_empty() {
                v.add(
                    "target.work_item_ids",
                    "at least one work item id is required",
                );
            }
            for (i, w) in t.work_item_ids.iter().enumerate() {
                if w.trim().is_empty() || w.len() > 256 {
                    v.add(
                        format!("target.work_item_ids[{i}]"),
                        "must be 1-256 characters",
                    );
                }
            }
        }
    }
    if r.intent.trim().is_empty() {
        v.add("intent", "intent is required");
    } else if r.intent.len() > 500 {
        v.add(
            "intent",
            "intent must be at most 500 bytes: a short description",
        );
    }
    match &r.context_pack {
        None => v.add(
            "context_pack",
            "context_pack is required: a run is bound to a context pack",
        ),
        Some(p) => {
            if p.pack_id.is_empty() {
                v.add("context_pack.pack_id", "pack_id is required");
            }
            if !content_hash(&p.hash) {
                v.add(
                    "context_pack.hash",
                    format!(
                        "hash {:?} must be <algorithm>:<hex digest>, e.g. sha256:9f86d081…",
                        p.hash
                    ),
                );
            }
            if p.version.is_empty() {
                v.add(
                    "context_pack.version",
                    "version is required (e.g. context_pack/v1)",
                );
            }
        }
    }
    if r.model.is_empty() {
        v.add("model", "model is required");
    }
    if r.max_tokens == 0 {
        v.add("max_tokens", "max_tokens must be > 0");
    }
    if let Some(t) = r.temperature
        && !(0.0..=2.0).contains(&t)
    {
        v.add("temperature", "temperature must be between 0 and 2");
    }
    if let Some(e) = &r.cost_estimate
        && e.estimated_cost.as_ref().is_some_and(|m| m.micro_usd < 0)
    {
        v.add("cost_estimate.estimated_cost", "must not be negative");
    }
    names(&mut v, "tools_allowed", &r.tools_allowed, "none");
    names(
        &mut v,
        "outputs_allowed",
        &r.outputs_allowed,
        "propose_changeset_bundle",
    );
    if r.max_retries.is_some_and(|m| m > 100) {
        v.add("max_retries", "max_retries must be at most 100");
    }
    if let Some(p) = &r.publication {
        let hash = r.context_pack.as_ref().map(|c| c.hash.as_str());
        if p.job_id.is_empty() || p.artifact_path.is_empty() {
            v.add(
                "publication",
                "publication.job_id and artifact_path name the artifact published",
            );
        }
        if hash != Some(p.artifact_id.as_str()) {
            v.add(
                "publication.artifact_id",
                "publication.artifact_id must equal context_pack.hash: the approval binds to exactly the bytes published",
            );
        }
        if r.tool_call.is_some() {
            v.add(
                "publication",
                "a run stands for a publication or a tool call, not both",
            );
        }
    }
    if let Some(x) = &r.extension {
        if x.job_id.is_empty() || x.budget_id.is_empty() {
            v.add(
                "extension",
                "extension.job_id and budget_id name the paused job and the budget raised",
            );
        }
        if x.tokens == 0 && x.cost.as_ref().is_none_or(|m| m.micro_usd <= 0) {
            v.add(
                "extension",
                "an extension adds tokens or money (a positive cost)",
            );
        }
        if r.tool_call.is_some() || r.publication.is_some() {
            v.add(
                "extension",
                "a run stands for one thing: an extension, a tool call or a publication",
            );
        }
    }
    v.into_result()
}

/// What the client chose: the run without anything the server sets.
pub fn spec_of(r: &Run) -> Run {
    Run {
        schema_version: String::new(),
        created_at: None,
        status: 0,
        requires_approval: false,
        result: None::<RunResult>,
        claimed_by: String::new(),
        claim_expires_at: None,
        retry_count: 0,
        next_attempt_at: None,
        last_error: String::new(),
        correlation_id: String::new(),
        // Decisions and the adapter's progress are state, not the spec: a
        // repeated proposal of a decided run is the same run.
        approved_by: Vec::new(),
        decided_by: String::new(),
        decision_comment: String::new(),
        decided_at: None,
        reason_code: String::new(),
        adapter_state: String::new(),
        edit: None,
        policy: None,
        // The audit chain's head and seal are the server's record.
        audit_head: None,
        audit_seal: String::new(),
        ..r.clone()
    }
}
