//! Decision receipts (issue 44 §2): every approval — a person's, the
//! second of two, break-glass, a policy's, a delegation's — is signed with
//! the deployment's Ed25519 key at the moment it is recorded, over what it
//! binds, and kept in the decision's audit record (`details.receipt`).
//! `GetReceipt` returns the latest; `switchyard approval verify` checks one
//! offline with [`switchyard_kit::receipt::verify`].
//!
//! What a receipt binds: the run and its tenant; the decision, who made it
//! (and every approver so far), when; the context hash (the plan); the
//! SHA-256 of the run's whole spec as proposed (`spec_sha256`, of its
//! protobuf encoding); and the scope granted — model, token cap, estimated
//! cost, the tools and outputs allowed, and for a tool call its tool and
//! arguments, for a budget extension its job and amounts, for a
//! publication its artifact.

use prost::Message as _;
use serde_json::{Value, json};
use switchyard_kit::receipt::ReceiptKey;
use switchyard_proto::approval::v1::{ListAuditRequest, Run};
use switchyard_store::Store;

use crate::{Approval, ApprovalConfig, ApprovalError};

/// The receipt key from `receipt_key_file`, when one is set.
fn file_key(cfg: &ApprovalConfig) -> Result<Option<ReceiptKey>, ApprovalError> {
    let Some(path) = &cfg.receipt_key_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| ApprovalError::ReceiptKey(format!("reading {}: {e}", path.display())))?;
    ReceiptKey::parse(&text)
        .map(Some)
        .map_err(|e| ApprovalError::ReceiptKey(e.to_string()))
}

fn bad(e: switchyard_kit::receipt::ReceiptError) -> ApprovalError {
    ApprovalError::ReceiptKey(e.to_string())
}

/// The receipt key on PostgreSQL: from `receipt_key_file`, else the one
/// the database keeps (made by the first replica to start, and every
/// replica's: receipts and audit seals any of them signs verify on all).
pub(crate) async fn shared_key(
    cfg: &ApprovalConfig,
    runs: &crate::pg::PgRuns,
) -> Result<ReceiptKey, ApprovalError> {
    if let Some(key) = file_key(cfg)? {
        return Ok(key);
    }
    let (_, seed) = ReceiptKey::generate().map_err(bad)?;
    let kept = runs.key_seed("receipts", &seed).await?;
    let key = ReceiptKey::from_seed(&kept).map_err(bad)?;
    if kept == seed.as_slice() {
        tracing::info!(key_id = key.id(), "made the receipt signing key");
    }
    Ok(key)
}

/// The receipt key on the embedded store: from `receipt_key_file`, else
/// the one kept there (made on first start).
pub(crate) fn key(cfg: &ApprovalConfig, store: &Store) -> Result<ReceiptKey, ApprovalError> {
    if let Some(key) = file_key(cfg)? {
        return Ok(key);
    }
    let kept = store.tree::<Vec<u8>>("receipt_key")?;
    if let Some(seed) = kept.get("seed")? {
        return ReceiptKey::from_seed(&seed).map_err(bad);
    }
    let (key, seed) = ReceiptKey::generate().map_err(bad)?;
    kept.put("seed", &seed.to_vec())?;
    store.flush_blocking()?;
    tracing::info!(key_id = key.id(), "made the receipt signing key");
    Ok(key)
}

/// What the approval of `run` (already changed: approved) by `actor` at
/// `now_ms`, recorded as audit event `event`, binds.
pub(crate) fn body(run: &Run, actor: &str, now_ms: u64, event: &str) -> Value {
    let spec_sha256 =
        switchyard_store::blobs::address(&crate::validate::spec_of(run).encode_to_vec());
    let est = run.cost_estimate.unwrap_or_default();
    json!({
        "v": 1,
        "run_id": run.run_id,
        "tenant": run.tenant,
        "created_by": run.created_by,
        "decision": "approved",
        "event": event,
        "decided_by": actor,
        "approved_by": run.approved_by,
        "decided_at_ms": now_ms,
        "context_hash": run.context_pack.as_ref().map_or("", |p| p.hash.as_str()),
        "spec_sha256": spec_sha256,
        // The policies that decided the run when it was proposed, by the
        // set's content hash: which rules were in force is part of what
        // was approved.
        "policy": run.policy.as_ref().map(|p| json!({
            "version": p.version, "effect": p.effect, "policies": p.policies,
            "approvals_required": p.approvals_required,
        })),
        "scope": {
            "model": run.model,
            "max_tokens": run.max_tokens,
            "estimated_cost_micro_usd": est.estimated_cost.map(|m| m.micro_usd),
            "tools_allowed": run.tools_allowed,
            "outputs_allowed": run.outputs_allowed,
            "tool_call": run.tool_call.as_ref().map(|t| json!({
                "job_id": t.job_id, "task_id": t.task_id, "call_id": t.call_id,
                "tool": t.tool, "arguments": t.arguments,
            })),
            "extension": run.extension.as_ref().map(|x| json!({
                "job_id": x.job_id, "budget_id": x.budget_id, "tokens": x.tokens,
                "cost_micro_usd": x.cost.map_or(0, |m| m.micro_usd),
            })),
            // An approval up to a scope binds the hold it grants.
            "hold": run.scope.as_ref().map(|h| json!({
                "tokens": h.tokens,
                "cost_micro_usd": h.cost.map_or(0, |m| m.micro_usd),
                "until": h.until.map(|t| t.to_string()),
            })),
            // An approval with an edit binds the call as changed.
            "edit": run.edit.as_ref().map(|e| json!({"tool": e.tool, "arguments": e.arguments})),
            "publication": run.publication.as_ref().map(|p| json!({
                "job_id": p.job_id, "artifact_path": p.artifact_path,
                "artifact_id": p.artifact_id, "destination": p.destination,
            })),
        },
    })
}

impl Approval {
    /// The receipt of run `run_id`'s latest approval, as JSON.
    pub async fn receipt(&self, run_id: &str) -> Result<String, ApprovalError> {
        let mut req = ListAuditRequest {
            run_id: run_id.to_owned(),
            after_sequence: 0,
            page_size: 1000,
        };
        let mut latest = None;
        loop {
            let page = self.list_audit(&req).await?.records;
            let Some(last) = page.last() else { break };
            req.after_sequence = last.sequence;
            latest = page
                .iter()
                .rev()
                .find_map(|r| r.details.get("receipt").cloned())
                .or(latest);
        }
        latest.ok_or_else(|| ApprovalError::ReceiptNotFound(run_id.to_owned()))
    }

    /// The key receipts are signed with now: its id and public key.
    pub fn receipt_key(&self) -> (String, String) {
        let k = &self.inner.receipts;
        (k.id().to_owned(), k.public_key())
    }
}
