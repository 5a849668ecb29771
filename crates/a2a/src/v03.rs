//! A2A 0.3's shapes, for the agents and clients that still speak it: the
//! client sends a 0.3 agent its messages so, and the door answers a 0.3
//! client's methods so. 0.3 tags messages, parts and results with `kind`,
//! names roles `user`/`agent` and states in lower-case words
//! (`input-required`), where 1.0 has `ROLE_USER` and `TASK_STATE_…`.

use serde_json::{Value, json};

/// A task state in 0.3's words, from either version's (`TASK_STATE_INPUT_REQUIRED`
/// or `input-required` → `input-required`; `cancelled` → `canceled`).
pub fn state(s: &str) -> String {
    s.trim_start_matches("TASK_STATE_")
        .to_ascii_lowercase()
        .replace('_', "-")
        .replace("cancelled", "canceled")
}

/// A 1.0 `Message` in 0.3's shape: `kind`-tagged, its role and each part
/// (`text` or `data`) in that version's words.
pub fn message(m: &Value) -> Value {
    let mut out = m.clone();
    out["kind"] = json!("message");
    if let Some(role) = m["role"].as_str() {
        out["role"] = json!(match role {
            "ROLE_AGENT" => "agent",
            "ROLE_USER" => "user",
            other => other,
        });
    }
    if let Some(parts) = out["parts"].as_array_mut() {
        for p in parts {
            if p.get("text").is_some() {
                p["kind"] = json!("text");
            } else if p.get("data").is_some() {
                p["kind"] = json!("data");
            }
        }
    }
    out
}

/// A 1.0 result (a task, or `{task}` as SendMessage answers) in 0.3's
/// shape: the task itself, `kind`-tagged, its state in 0.3's words and its
/// status message as 0.3 has it.
pub fn task(r: &Value) -> Value {
    let mut t = r.get("task").unwrap_or(r).clone();
    t["kind"] = json!("task");
    let s = state(t["status"]["state"].as_str().unwrap_or_default());
    t["status"]["state"] = json!(s);
    if let Some(m) = t["status"].get_mut("message").filter(|m| m.is_object()) {
        *m = message(m);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_the_same_in_both_versions_words() {
        assert_eq!(state("TASK_STATE_INPUT_REQUIRED"), "input-required");
        assert_eq!(state("input-required"), "input-required");
        assert_eq!(state("TASK_STATE_CANCELLED"), "canceled");
    }
}
