//! Manual mode (seed 004): the prompt bundle a person runs in an external
//! tool. Rendered only from the run's stored fields, with a fixed key order
//! and no clock, so the same run always yields byte-identical bundles.

use sha2::{Digest, Sha256};
use switchyard_proto::approval::v1::Run;

/// Media type of a bundle.
pub const CONTENT_TYPE: &str = "application/json";

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn instructions(run: &Run) -> String {
    let outputs = run.outputs_allowed.join(", ");
    let tools = run.tools_allowed.join(", ");
    format!(
        "You are carrying out an approved agent run.\n\
         Intent: {intent}\n\
         Work only from the context pack below. Use at most {max} tokens.\n\
         Tools you may use: {tools}.\n\
         You may only propose these outputs: {outputs}. Propose; never merge, \
         publish or write anything yourself: a person reviews every proposal.\n\
         When done, paste your result back with:\n  \
         switchyard approval import {id} --context-hash {hash} -f RESULT_FILE\n",
        intent = run.intent,
        max = run.max_tokens,
        id = run.run_id,
        hash = run
            .context_pack
            .as_ref()
            .map(|p| p.hash.as_str())
            .unwrap_or(""),
    )
}

/// The bundle of `run`: pretty JSON with `\n` line ends.
pub fn render(run: &Run) -> Vec<u8> {
    let target = run.target.clone().unwrap_or_default();
    let pack = run.context_pack.clone().unwrap_or_default();
    // serde_json::json! objects are maps with a deterministic key order.
    let doc = serde_json::json!({
        "schema_version": "prompt_bundle/v1",
        "run_id": run.run_id,
        "intent": run.intent,
        "model": run.model,
        "max_tokens": run.max_tokens,
        "temperature": run.temperature,
        "target": {
            "org": target.org,
            "repo": target.repo,
            "work_item_ids": target.work_item_ids,
        },
        "context_pack": {
            "pack_id": pack.pack_id,
            "hash": pack.hash,
            "version": pack.version,
            "inputs": pack.inputs,
        },
        "tools_allowed": run.tools_allowed,
        "outputs_allowed": run.outputs_allowed,
        "instructions": instructions(run),
    });
    let mut out = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    out.push(b'\n');
    out
}
