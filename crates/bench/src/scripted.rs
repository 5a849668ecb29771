//! `switchyard-bench scripted-llm FILE`: the scripted OpenAI-compatible
//! model server the tests use, on its own, for recording sessions with
//! exact replies. FILE maps each model to its replies, in order:
//! `{"m-chat": [{"text": "Hi.", "prompt": 10, "completion": 2},
//!              {"tools": [["agent_builder", {"task": "…"}]], "prompt": 20, "completion": 5}]}`.

use serde_json::Value;
use switchyard_llm::scripted::{Reply, Script};

/// One reply as the file writes it.
fn reply(v: &Value) -> anyhow::Result<Reply> {
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(10);
    if let Some(t) = v.get("text").and_then(Value::as_str) {
        return Ok(Reply::text(t, n("prompt"), n("completion")));
    }
    let Some(calls) = v.get("tools").and_then(Value::as_array) else {
        anyhow::bail!("a reply needs \"text\" or \"tools\": {v}");
    };
    let calls: Vec<(String, Value)> = calls
        .iter()
        .map(|c| {
            let name = c.get(0).and_then(Value::as_str).unwrap_or_default();
            (name.to_owned(), c.get(1).cloned().unwrap_or(Value::Null))
        })
        .collect();
    let refs: Vec<(&str, Value)> = calls.iter().map(|(n, a)| (n.as_str(), a.clone())).collect();
    Ok(Reply::tools(&refs, n("prompt"), n("completion")))
}

/// Serves the replies in `file` until interrupted.
pub async fn run(file: &str) -> anyhow::Result<()> {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
    let Some(models) = doc.as_object() else {
        anyhow::bail!("{file}: expected an object of model name to replies");
    };
    let script = Script::new();
    for (model, replies) in models {
        let replies = replies
            .as_array()
            .map(|rs| rs.iter().map(reply).collect::<anyhow::Result<Vec<_>>>())
            .transpose()?
            .unwrap_or_default();
        script.for_model(model, replies);
    }
    let server = script.serve().await;
    println!("scripted model server at {}", server.base_url());
    tokio::signal::ctrl_c().await?;
    drop(server);
    Ok(())
}
