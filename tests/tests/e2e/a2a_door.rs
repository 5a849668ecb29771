//! The A2A door, driven by the reference `a2a-sdk` client (Python): a job
//! is an A2A task; a message answers its step waiting for input, or is said
//! in its conversation and the reply comes back with the task waiting for
//! the next message. Only who may answer or talk gets through: another
//! submitter, another tenant and an agent key are refused and nothing is
//! recorded.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use serde_json::{Value, json};
use switchyard_llm::scripted::Reply;
use switchyard_proto::executor::v1::JobState;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;

use crate::common::{finish, submit};
use crate::conversation::history;
use crate::llm::env;

/// Runs `tests/a2a/<script>` with `args`, which must succeed: its output,
/// one JSON value per line.
async fn python(script: &str, args: &[&str]) -> Vec<Value> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("a2a")
        .join(script);
    // Async: the stack serves the script from this same runtime.
    let out = tokio::process::Command::new(crate::mcp::python())
        .arg(script)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Runs tests/a2a/door_client.py against the stack's HTTP door as `token`:
/// one JSON line per step.
async fn client(base: &str, token: &str, steps: Value) -> Vec<Value> {
    python("door_client.py", &[base, token, &steps.to_string()]).await
}

/// The same over the card's HTTP+JSON interface.
async fn rest_client(base: &str, token: &str, steps: Value) -> Vec<Value> {
    python(
        "door_client.py",
        &[base, token, &steps.to_string(), "HTTP+JSON"],
    )
    .await
}

/// A2A 1.0's HTTP+JSON binding: the reference client, picking that
/// interface from the signed card, talks in a conversation, answers an
/// input step and cancels, as the caller; others are refused as over
/// JSON-RPC, with nothing recorded.
#[tokio::test]
async fn the_reference_a2a_client_over_http_json_talks_answers_and_cancels_as_the_caller() {
    let e = env(true, |_| {}).await;
    e.script
        .for_model("m-chat", vec![Reply::text("Hello over REST.", 20, 4)]);
    let base = format!("http://{}", e.stack.http.unwrap());
    let mut alice = JobServiceClient::new(e.stack.channel_as("alice").await.unwrap());
    let talk = json!({"job_id": "rest-talk", "tasks": [{"id": "chat", "conversation": {
        "orchestrator": {"model": "m-chat", "max_tokens": 40}}}]});
    submit(&mut alice, &talk.to_string()).await.unwrap();
    let ask = json!({"job_id": "rest-ask", "tasks": [{"id": "ask", "input": {
        "prompt": "How many replicas?",
        "schema": {"type": "object", "required": ["size"], "properties": {"size": {"type": "integer"}}}}}]});
    submit(&mut alice, &ask.to_string()).await.unwrap();
    crate::common::until_event(&mut alice, "rest-ask", "task.input_requested").await;

    for token in &crate::common::outsiders(&e.stack).await {
        let lines = rest_client(
            &base,
            token,
            json!([{"send": "let me in", "task": "rest-talk"}, {"get": "rest-ask"},
                   {"cancel": "rest-ask"}]),
        )
        .await;
        for l in &lines {
            assert!(l["error"].is_string(), "{lines:?}");
        }
    }
    assert!(history(&mut alice, "rest-talk").await.turns.is_empty());

    let alice_token = e.stack.token("alice").unwrap();
    let lines = rest_client(
        &base,
        &alice_token,
        json!([{"send": "hi", "task": "rest-talk"},
               {"get": "rest-ask"},
               {"send_data": {"size": 3}, "task": "rest-ask"},
               {"get": "no-such-job"},
               {"cancel": "rest-talk"}]),
    )
    .await;
    assert_eq!(lines[0]["state"], "TASK_STATE_INPUT_REQUIRED", "{lines:?}");
    assert_eq!(lines[0]["text"], "Hello over REST.");
    assert_eq!(lines[1]["text"], "How many replicas?", "{lines:?}");
    assert!(lines[2]["error"].is_null(), "{lines:?}");
    // A2A's error class, read from the ErrorInfo reason.
    assert!(
        lines[3]["error"]
            .as_str()
            .unwrap()
            .starts_with("TaskNotFoundError"),
        "{lines:?}"
    );
    assert_eq!(lines[4]["state"], "TASK_STATE_CANCELED", "{lines:?}");
    let done = finish(&mut alice, "rest-ask").await;
    assert_eq!(done.state, JobState::Completed as i32, "{done:?}");
    let said = history(&mut alice, "rest-talk").await;
    assert_eq!(said.turns.len(), 1, "{said:?}");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn the_reference_a2a_client_talks_in_a_conversation_and_answers_an_input_as_the_job_allows() {
    let e = env(true, |_| {}).await;
    e.script.for_model(
        "m-chat",
        vec![
            Reply::text("Hello over A2A.", 20, 4),
            Reply::text("Still here.", 30, 3),
            Reply::text("Hello, dave.", 10, 3),
        ],
    );
    let base = format!("http://{}", e.stack.http.unwrap());
    let mut alice = JobServiceClient::new(e.stack.channel_as("alice").await.unwrap());
    let talk = json!({"job_id": "a2a-talk", "tasks": [{"id": "chat", "conversation": {
        "orchestrator": {"model": "m-chat", "max_tokens": 40}}}]});
    submit(&mut alice, &talk.to_string()).await.unwrap();
    let ask = json!({"job_id": "a2a-ask", "tasks": [{"id": "ask", "input": {
        "prompt": "How many replicas?",
        "schema": {"type": "object", "required": ["size"], "properties": {"size": {"type": "integer"}}}}}]});
    submit(&mut alice, &ask.to_string()).await.unwrap();
    crate::common::until_event(&mut alice, "a2a-ask", "task.input_requested").await;

    // Others: refused by the executor's checks, nothing recorded.
    let others = crate::common::outsiders(&e.stack).await;
    for token in &others {
        let lines = client(
            &base,
            token,
            json!([{"send": "let me in", "task": "a2a-talk"},
                   {"send_data": {"size": 9}, "task": "a2a-ask"}]),
        )
        .await;
        for l in &lines {
            assert!(l["error"].is_string(), "{lines:?}");
        }
    }
    assert!(history(&mut alice, "a2a-talk").await.turns.is_empty());

    // alice: the conversation answers, and waits for the next message.
    let alice_token = e.stack.token("alice").unwrap();
    let lines = client(
        &base,
        &alice_token,
        json!([{"send": "hi", "task": "a2a-talk"},
               {"get": "a2a-talk"},
               {"send": "still there?", "task": "a2a-talk"},
               {"get": "a2a-ask"},
               {"send_data": {"size": 3}, "task": "a2a-ask"}]),
    )
    .await;
    assert_eq!(lines[0]["id"], "a2a-talk", "{lines:?}");
    assert_eq!(lines[0]["context_id"], "a2a-talk");
    assert_eq!(lines[0]["state"], "TASK_STATE_INPUT_REQUIRED", "{lines:?}");
    assert_eq!(lines[0]["text"], "Hello over A2A.");
    assert_eq!(lines[1]["state"], "TASK_STATE_INPUT_REQUIRED");
    assert_eq!(
        lines[1]["text"], "Hello over A2A.",
        "GetTask carries the last reply"
    );
    assert_eq!(lines[2]["text"], "Still here.", "{lines:?}");
    // The input step: its prompt is the status message; a data part answers.
    assert_eq!(lines[3]["state"], "TASK_STATE_INPUT_REQUIRED", "{lines:?}");
    assert_eq!(lines[3]["text"], "How many replicas?");
    assert!(lines[4]["error"].is_null(), "{lines:?}");
    let h = history(&mut alice, "a2a-talk").await;
    let said: Vec<(&str, &str)> = h
        .turns
        .iter()
        .map(|t| (t.text.as_str(), t.by.as_str()))
        .collect();
    assert_eq!(said, [("hi", "alice"), ("still there?", "alice")]);
    let done = finish(&mut alice, "a2a-ask").await;
    assert_eq!(done.state, JobState::Completed as i32, "{done:?}");

    // dave is named in a conversation and on an input step of jobs he
    // cannot read: he talks and answers over A2A all the same, and what he
    // reads back is what he may read.
    let dave = e
        .stack
        .key(
            "dave",
            &["submitter"],
            switchyard_proto::auth::v1::PrincipalKind::Human,
        )
        .await
        .unwrap();
    let team = json!({"job_id": "a2a-team", "tasks": [{"id": "chat", "conversation": {
        "orchestrator": {"model": "m-chat", "max_tokens": 40},
        "participants": {"subjects": ["dave"]}}}]});
    submit(&mut alice, &team.to_string()).await.unwrap();
    let named = json!({"job_id": "a2a-named", "tasks": [{"id": "ask", "input": {
        "prompt": "Which region?", "answerers": {"subjects": ["dave"]}}}]});
    submit(&mut alice, &named.to_string()).await.unwrap();
    crate::common::until_event(&mut alice, "a2a-named", "task.input_requested").await;
    let lines = client(
        &base,
        &dave,
        json!([{"send": "hello from dave", "task": "a2a-team"},
               {"get": "a2a-team"},
               {"get": "a2a-named"},
               {"send": "eu-west", "task": "a2a-named"}]),
    )
    .await;
    assert_eq!(lines[0]["state"], "TASK_STATE_INPUT_REQUIRED", "{lines:?}");
    assert_eq!(lines[0]["text"], "Hello, dave.", "{lines:?}");
    assert_eq!(lines[1]["text"], "Hello, dave.", "{lines:?}");
    assert_eq!(lines[2]["text"], "Which region?", "{lines:?}");
    assert!(lines[3]["error"].is_null(), "{lines:?}");
    let done = finish(&mut alice, "a2a-named").await;
    assert_eq!(done.state, JobState::Completed as i32, "{done:?}");

    // A schema violation comes back as an error; the step still waits.
    submit(&mut alice, &ask.to_string().replace("a2a-ask", "a2a-ask-2"))
        .await
        .unwrap();
    crate::common::until_event(&mut alice, "a2a-ask-2", "task.input_requested").await;
    let lines = client(
        &base,
        &alice_token,
        json!([{"send_data": {"size": "three"}, "task": "a2a-ask-2"}, {"get": "a2a-ask-2"}]),
    )
    .await;
    assert!(
        lines[0]["error"]
            .as_str()
            .unwrap()
            .contains("INPUT_INVALID")
            || lines[0]["error"].as_str().unwrap().contains("schema"),
        "{lines:?}"
    );
    assert_eq!(lines[1]["state"], "TASK_STATE_INPUT_REQUIRED", "{lines:?}");
    // CancelTask cancels the job.
    let lines = client(&base, &alice_token, json!([{"cancel": "a2a-ask-2"}])).await;
    assert_eq!(lines[0]["state"], "TASK_STATE_CANCELED", "{lines:?}");

    // Raw JSON-RPC: a message naming no job, an unknown method, a retried
    // message id (taken once), and no credential at all.
    let http = reqwest::Client::new();
    let rpc = |body: Value, token: Option<&str>| {
        let mut r = http.post(format!("{base}/a2a")).json(&body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let answered = |body: Value| {
        let r = rpc(body, Some(&alice_token));
        async move { r.await.unwrap().json::<Value>().await.unwrap() }
    };
    let v = answered(
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
               "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}}),
    )
    .await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("taskId"),
        "{v}"
    );
    let v = answered(
        json!({"jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage", "params": {}}),
    )
    .await;
    assert_eq!(v["error"]["code"], -32601, "{v}");
    e.script
        .for_model("m-chat", vec![Reply::text("Once.", 10, 2)]);
    let again = json!({"jsonrpc": "2.0", "id": 3, "method": "SendMessage",
        "params": {"message": {"messageId": "same-message", "taskId": "a2a-talk", "role": "ROLE_USER",
                               "parts": [{"text": "once only"}]}}});
    for _ in 0..2 {
        let v = answered(again.clone()).await;
        assert_eq!(v["result"]["task"]["id"], "a2a-talk", "{v}");
    }
    let h = history(&mut alice, "a2a-talk").await;
    assert_eq!(h.turns.iter().filter(|t| t.text == "once only").count(), 1);
    // A2A 1.0 tenancy: a request naming the caller's own tenant is served;
    // naming another is refused, whatever the task.
    let get = |tenant: &str| json!({"jsonrpc": "2.0", "id": 4, "method": "GetTask", "params": {"tenant": tenant, "id": "a2a-talk"}});
    let v = answered(get("default")).await;
    assert_eq!(v["result"]["id"], "a2a-talk", "{v}");
    let v = answered(get("tenant-b")).await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(v["error"]["data"]["reason"], "PERMISSION_DENIED", "{v}");
    // An A2A 0.3 client: the same operations by 0.3's names, with its
    // kind-tagged message, answered in 0.3's shapes (the task bare,
    // `kind: task`, states in 0.3's words).
    e.script
        .for_model("m-chat", vec![Reply::text("Hello, 0.3.", 10, 2)]);
    let v = answered(json!({"jsonrpc": "2.0", "id": 5, "method": "message/send",
        "params": {"message": {"kind": "message", "messageId": "m-03", "taskId": "a2a-talk",
            "role": "user", "parts": [{"kind": "text", "text": "from 0.3"}]}}}))
    .await;
    let t = &v["result"];
    assert_eq!(
        (&t["kind"], &t["id"], &t["status"]["state"]),
        (&json!("task"), &json!("a2a-talk"), &json!("input-required")),
        "{v}"
    );
    let m = &t["status"]["message"];
    assert_eq!(
        (&m["kind"], &m["role"]),
        (&json!("message"), &json!("agent")),
        "{v}"
    );
    assert_eq!(
        m["parts"][0],
        json!({"kind": "text", "text": "Hello, 0.3."}),
        "{v}"
    );
    let v = answered(
        json!({"jsonrpc": "2.0", "id": 6, "method": "tasks/get", "params": {"id": "a2a-talk"}}),
    )
    .await;
    assert_eq!(v["result"]["status"]["state"], "input-required", "{v}");
    let v = answered(
        json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/cancel", "params": {"id": "a2a-talk"}}),
    )
    .await;
    assert_eq!(v["result"]["status"]["state"], "canceled", "{v}");
    let h = history(&mut alice, "a2a-talk").await;
    assert!(
        h.turns
            .iter()
            .any(|t| t.text == "from 0.3" && t.by == "alice"),
        "{h:?}"
    );
    let unauthenticated = rpc(again, None).await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    e.stack.stop().await.unwrap();
}

/// Switchyard's own Agent Card is signed with the deployment's key (under
/// `switchyard dev`, a key made in its data directory): the reference
/// SDK's verifier (`tests/a2a/verify_card.py`) accepts it with the key its
/// `jku` names and refuses it once changed, and a signed card names the
/// door's own address whatever Host a client sends.
#[tokio::test]
async fn the_doors_own_card_is_signed_and_the_reference_sdk_verifies_it() {
    let e = env(true, |_| {}).await;
    let base = format!("http://{}", e.stack.http.unwrap());
    let card = format!("{base}/.well-known/agent-card.json");
    let v = python("verify_card.py", &[&card]).await.remove(0);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["tampered_refused"], true, "{v}");
    assert_eq!(v["alg"], "EdDSA");
    assert_eq!(v["jku"], format!("{base}/.well-known/jwks.json"));
    // Public: read with no credential.
    assert_eq!(v["url"], format!("{base}/a2a"));

    switchyard_kit::tls::install_crypto();
    let card: Value = reqwest::Client::new()
        .get(format!("{base}/.well-known/agent-card.json"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(card["supportedInterfaces"][0]["url"], format!("{base}/a2a"));
    e.stack.stop().await.unwrap();
}
