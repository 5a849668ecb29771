//! A conversation against a real `switchyard dev` and a scripted model
//! server: `switchyard chat` in the terminal (the reply streamed), a
//! message over REST with curl, `kill -9` while the model is answering it
//! — after the restart the message is answered once, nothing lost — then a
//! reply streamed as SSE to curl, and `/close` from the terminal.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_llm::scripted::Reply;

use crate::llm_split::scripted;
use crate::support::*;

/// A configuration with the scripted model server at `llm_url` as
/// `gpt-4o-mini` and a policy approving small conversations.
pub(crate) fn config(dir: &std::path::Path, llm_url: &str) -> std::path::PathBuf {
    let path = dir.join("switchyard.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[llm]
[[llm.providers]]
name = "openai"
base_url = "{llm_url}"
stream = true
models = [
  {{ name = "gpt-4o-mini", input_micro_usd_per_million = 150000, output_micro_usd_per_million = 600000 }},
]

[[approval.policies]]
name = "small-talk"
max_estimated_cost_micro_usd = 10000000
"#
        ),
    )
    .unwrap();
    path
}

fn dev(dir: &std::path::Path, cfg: &std::path::Path) -> Proc {
    Proc::dev_at(
        &dir.join("data"),
        &[("SWITCHYARD_CONFIG", cfg.to_str().unwrap())],
        &dir.join("dev.log"),
    )
}

/// `switchyard chat ARGS` as alice against `url`, `input` on its standard
/// input: what it printed.
fn chat(url: &str, args: &[&str], input: &str) -> String {
    let mut all = vec!["chat"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--as", "alice"]);
    ok(&cli_stdin(url, &all, input))
}

/// curl with alice's token: the body it printed and the status.
fn curl(args: &[&str], token: &str) -> (String, u16) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(args)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (body.to_owned(), code.trim().parse().unwrap())
}

/// `POST /aitp/tasks/{job}/messages` with `body` and `headers`.
fn post(http: &str, job: &str, token: &str, headers: &[&str], body: &str) -> (String, u16) {
    let url = format!("{http}/aitp/tasks/{job}/messages");
    let mut args = vec!["-N", "--max-time", "30", "-X", "POST", url.as_str()];
    for h in headers {
        args.extend_from_slice(&["-H", h]);
    }
    args.extend_from_slice(&["-H", "Content-Type: application/json", "--data", body]);
    curl(&args, token)
}

fn history(http: &str, job: &str, token: &str) -> Value {
    let (body, code) = curl(&[&format!("{http}/aitp/tasks/{job}/messages")], token);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn a_conversation_goes_on_through_kill_9_mid_reply_and_answers_each_message_once() {
    let (script, llm_url, _stop) = scripted();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &llm_url);
    script.for_model(
        "gpt-4o-mini",
        vec![
            Reply::text("Hello there.", 20, 4).chunk_delay(Duration::from_millis(2)),
            // Cut off by the crash: never recorded.
            Reply::text("lost", 30, 2).delay(Duration::from_secs(30)),
            Reply::text("Second answer.", 30, 4),
            Reply::text("Third answer.", 40, 4).chunk_delay(Duration::from_millis(2)),
        ],
    );
    let dev1 = dev(dir.path(), &cfg);
    let url = dev1.url();

    // The terminal: a new conversation, one message, the reply streamed.
    let said = chat(
        &url,
        &["--model", "gpt-4o-mini", "--instructions", "Be brief."],
        "hi\n/quit\n",
    );
    let job = said
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    assert!(said.starts_with("conversation "), "{said}");
    assert!(said.contains("\nHello there.\n"), "{said}");
    assert!(said.contains("left conversation"), "{said}");

    // A message over REST while the model takes its time; the crash comes
    // while it is answering.
    let alice = token(&url, "alice");
    let http = format!("http://{}", dev1.http.as_deref().unwrap());
    let (body, code) = post(
        &http,
        &job,
        &alice,
        &["Idempotency-Key: rest-2"],
        r#"{"text": "and now?"}"#,
    );
    assert_eq!(code, 202, "{body}");
    let sent: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(sent["seq"], 2);
    wait_for("the model asked", Duration::from_secs(20), || {
        script.count() == 2
    });
    dev1.kill9();

    let dev2 = dev(dir.path(), &cfg);
    let url = dev2.url();
    let http = format!("http://{}", dev2.http.as_deref().unwrap());
    wait_for("message 2 answered", Duration::from_secs(30), || {
        history(&http, &job, &alice)["messages"][1]["reply"]["text"] == "Second answer."
    });
    let h = history(&http, &job, &alice);
    assert_eq!(h["messages"].as_array().unwrap().len(), 2, "{h}");
    assert_eq!(h["messages"][0]["reply"]["text"], "Hello there.");
    assert_eq!(h["waiting"], true, "{h}");
    // The turn ran again from its start, with the conversation so far.
    let again = &script.received()[2].body["messages"];
    assert_eq!(
        again,
        &json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello there."},
            {"role": "user", "content": "and now?"}
        ]),
        "{again}"
    );
    // The retried POST is the same message, not a third.
    let (body, code) = post(
        &http,
        &job,
        &alice,
        &["Idempotency-Key: rest-2"],
        r#"{"text": "and now?"}"#,
    );
    assert_eq!(code, 202, "{body}");
    let replayed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&replayed["seq"], &replayed["replayed"]),
        (&json!(2), &json!(true))
    );

    // The reply as Server-Sent Events, ending once it is recorded.
    let (sse, code) = post(
        &http,
        &job,
        &alice,
        &["Accept: text/event-stream"],
        r#"{"text": "third"}"#,
    );
    assert_eq!(code, 200, "{sse}");
    assert!(sse.contains("event: llm.delta"), "{sse}");
    assert!(sse.contains("event: conversation.replied"), "{sse}");
    assert!(sse.contains("Third answer."), "{sse}");

    // Back in the terminal: the history, then /close.
    let said = chat(&url, &["--job", &job], "/close\n");
    assert!(
        said.contains("you (alice) › and now?\nSecond answer."),
        "{said}"
    );
    assert!(
        said.contains(&format!("closed conversation {job}")),
        "{said}"
    );
    wait_for("the job completed", Duration::from_secs(20), || {
        let j = ok(&cli(
            &url,
            &["job", "get", &job, "--as", "alice", "-o", "json"],
        ));
        j.contains("JOB_STATE_COMPLETED") || j.contains("\"completed\"")
    });
    let h = history(&http, &job, &alice);
    assert_eq!(h["open"], false);
    let replies: Vec<&str> = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["reply"]["text"].as_str())
        .collect();
    assert_eq!(
        replies,
        vec!["Hello there.", "Second answer.", "Third answer."]
    );
    assert_eq!(
        script.count(),
        4,
        "each message answered once (one lost to the crash)"
    );
    assert_eq!(dev2.terminate(), Some(0));
}

#[test]
fn split_a_gateway_in_its_own_process_streams_a_remote_conversations_reply_as_the_caller() {
    let (script, llm_url, _stop) = scripted();
    script.for_model(
        "gpt-4o-mini",
        vec![
            Reply::text("From afar.", 10, 3).chunk_delay(Duration::from_millis(2)),
            Reply::text("Over A2A too.", 12, 4),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &llm_url);
    let (dev, _data) = Proc::dev(&[("SWITCHYARD_CONFIG", cfg.to_str().unwrap())]);
    let url = dev.url();
    let gw_data = tempfile::tempdir().unwrap();
    let gw =
        crate::gateway::gateway_for(&url, gw_data.path(), &["EXECUTOR", "REGISTRY", "APPROVAL"]);
    let http = format!("http://{}", gw.http.as_deref().unwrap());
    let job = dir.path().join("talk.json");
    std::fs::write(
        &job,
        json!({"job_id": "split-talk", "tasks": [{"id": "chat", "conversation": {
            "orchestrator": {"model": "gpt-4o-mini", "max_tokens": 20}}}]})
        .to_string(),
    )
    .unwrap();
    ok(&cli(
        &url,
        &["job", "submit", job.to_str().unwrap(), "--as", "alice"],
    ));
    let (alice, bob) = (token(&url, "alice"), token(&url, "bob"));
    // bob may read jobs but does not take part: refused through the gateway.
    let (body, code) = post(&http, "split-talk", &bob, &[], r#"{"text": "hi"}"#);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("CONVERSATION_NOT_ALLOWED"), "{body}");
    let (sse, code) = post(
        &http,
        "split-talk",
        &alice,
        &["Accept: text/event-stream"],
        r#"{"text": "hello?"}"#,
    );
    assert_eq!(code, 200, "{sse}");
    assert!(
        sse.contains("event: conversation.replied") && sse.contains("From afar."),
        "{sse}"
    );
    // The A2A door of the gateway process: the same conversation, the job
    // as the A2A task.
    let a2a = std::process::Command::new("curl")
        .args([
            "-s",
            &format!("{http}/a2a"),
            "-H",
            &format!("Authorization: Bearer {alice}"),
        ])
        .args(["-H", "Content-Type: application/json", "--data"])
        .arg(
            json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
                "messageId": "split-a2a-1", "taskId": "split-talk", "role": "ROLE_USER",
                "parts": [{"text": "and over A2A?"}]}}})
            .to_string(),
        )
        .output()
        .unwrap();
    let a2a: Value = serde_json::from_slice(&a2a.stdout).unwrap();
    let task = &a2a["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{a2a}"
    );
    assert_eq!(
        task["status"]["message"]["parts"][0]["text"], "Over A2A too.",
        "{a2a}"
    );
    let (body, code) = post(&http, "split-talk", &alice, &[], r#"{"close": true}"#);
    assert_eq!(code, 202, "{body}");
    let got = ok(&cli(
        &url,
        &[
            "job",
            "result",
            "split-talk",
            "--wait",
            "20",
            "-o",
            "json",
            "--as",
            "alice",
        ],
    ));
    assert!(got.contains("\"completed\""), "{got}");
    let h = history(&http, "split-talk", &alice);
    assert_eq!(h["messages"][0]["by"], "alice", "{h}");
    assert_eq!(gw.terminate(), Some(0));
    assert_eq!(dev.terminate(), Some(0));
}
