//! A stand-in model server for demos and manual testing without a model:
//! it answers `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages`
//! (Anthropic) from a JSON script and prints every request's model and
//! messages count.
//!
//! ```sh
//! cargo run -p switchyard-llm --features scripted --example scripted-openai -- 127.0.0.1:8089 script.json
//! ```
//!
//! The script maps a model name (or `*` for any) to the replies it gives in
//! order; `otherwise` answers when a list runs out:
//!
//! ```json
//! {"gpt-4o": [{"status": 429, "retry_after": "1"},
//!             {"tools": [{"name": "web_search", "arguments": {"query": "qubits"}}], "prompt_tokens": 300, "completion_tokens": 20},
//!             {"text": "{\"summary\": \"...\"}", "prompt_tokens": 500, "completion_tokens": 40}],
//!  "otherwise": {"text": "ok", "prompt_tokens": 10, "completion_tokens": 2}}
//! ```

use serde_json::Value;
use switchyard_llm::scripted::{Reply, Script};

fn reply(v: &Value) -> Result<Reply, String> {
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    if let Some(status) = v.get("status").and_then(Value::as_u64) {
        let mut r = Reply::status(status as u16);
        if let Some(ra) = v.get("retry_after").and_then(Value::as_str) {
            r = r.retry_after(ra);
        }
        return Ok(r);
    }
    if let Some(tools) = v.get("tools").and_then(Value::as_array) {
        let calls: Vec<(&str, Value)> = tools
            .iter()
            .map(|t| {
                (
                    t.get("name").and_then(Value::as_str).unwrap_or_default(),
                    t.get("arguments").cloned().unwrap_or(Value::Null),
                )
            })
            .collect();
        return Ok(Reply::tools(
            &calls,
            n("prompt_tokens"),
            n("completion_tokens"),
        ));
    }
    match v.get("text").and_then(Value::as_str) {
        Some(t) => Ok(Reply::text(t, n("prompt_tokens"), n("completion_tokens"))),
        None => Err(format!("a reply needs text, tools or status: {v}")),
    }
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(addr), Some(file)) = (args.get(1), args.get(2)) else {
        return Err("usage: scripted-openai ADDR SCRIPT.json".into());
    };
    let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{file}: {e}"))?;
    let script = Script::new();
    for (model, replies) in doc.as_object().into_iter().flatten() {
        if model == "otherwise" {
            script.otherwise(reply(replies)?);
            continue;
        }
        let list = replies
            .as_array()
            .ok_or_else(|| format!("{model}: a list of replies"))?
            .iter()
            .map(reply)
            .collect::<Result<Vec<_>, _>>()?;
        script.for_model(model, list);
    }
    let server = script
        .serve_on(addr)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    println!(
        "scripted model server on {} (chat/completions and messages)",
        server.base_url()
    );
    let mut seen = 0;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
        }
        let got = script.received();
        for r in &got[seen..] {
            println!(
                "request: {} model {} with {} messages{}",
                r.route,
                r.model,
                r.body["messages"].as_array().map_or(0, Vec::len),
                if r.body.get("tools").is_some() {
                    ", tools offered"
                } else {
                    ""
                }
            );
        }
        seen = got.len();
    }
    Ok(())
}
