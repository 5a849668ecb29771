//! Notifications (issue 47): signed CloudEvents webhooks for an approval
//! needed, jobs completed and failed and a budget at 80% — checked by a
//! receiver here that verifies each signature, answers the first
//! deliveries with 500 (they are retried), and never sees a secret or a
//! prompt; a webhook that never answers ends in the dead-letter view.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::notification_service_client::NotificationServiceClient;
use switchyard_proto::executor::v1::{ListDeliveriesRequest, RetryDeliveryRequest};
use switchyard_testkit::Stack;

use crate::common::*;

const SECRET: &str = "whsec-0123456789abcdef0123456789abcdef";
const MARKER: &str = "SECRET-PROMPT-MARKER";

/// What the receiver saw: each request's signature header and body,
/// whether the signature verified, and whether it was accepted (2xx).
#[derive(Default)]
struct Seen {
    requests: Vec<(String, String, bool, bool)>,
}

/// A webhook receiver on 127.0.0.1 that answers its first `fail_first`
/// requests with 500; stops with the trigger.
async fn receiver(
    fail_first: usize,
) -> (String, Arc<Mutex<Seen>>, switchyard_kit::shutdown::Trigger) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let state = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: http::HeaderMap, body: String| {
            let state = state.clone();
            async move {
                let sig = headers
                    .get(switchyard_kit::webhook::SIGNATURE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let now = switchyard_kit::time::now_ms() / 1000;
                let ok = switchyard_kit::webhook::verify(
                    SECRET.as_bytes(),
                    &sig,
                    body.as_bytes(),
                    now,
                    300,
                ) && headers.get("content-type").and_then(|v| v.to_str().ok())
                    == Some("application/cloudevents+json");
                let mut s = state.lock().unwrap();
                let accepted = s.requests.len() >= fail_first;
                s.requests.push((sig, body, ok, accepted));
                if accepted {
                    http::StatusCode::NO_CONTENT
                } else {
                    http::StatusCode::INTERNAL_SERVER_ERROR
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.wait().await })
            .await
    });
    (url, seen, trigger)
}

/// The distinct events the receiver accepted, by CloudEvent id.
fn events(seen: &Mutex<Seen>) -> Vec<Value> {
    let s = seen.lock().unwrap();
    let mut by_id = std::collections::BTreeMap::new();
    for (_, body, _, _) in s.requests.iter().filter(|r| r.3) {
        let v: Value = serde_json::from_str(body).unwrap();
        by_id.insert(v["id"].as_str().unwrap().to_owned(), v);
    }
    by_id.into_values().collect()
}

/// A condition on the events seen so far.
type Check = Box<dyn Fn(&[Value]) -> bool + Send>;

fn of_type<'a>(evs: &'a [Value], t: &str) -> Vec<&'a Value> {
    evs.iter()
        .filter(|e| e["type"] == format!("dev.switchyard.{t}"))
        .collect()
}

async fn webhooks_are_signed_retried_dead_lettered_and_carry_no_secret_or_prompt(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("hook.secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let (url, seen, stop) = receiver(2).await;
    // A port nothing listens on: every attempt is refused.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        use switchyard_executor::config::WebhookConfig;
        c.executor.commands.push("cat".into());
        c.executor.approval_poll_ms = 20;
        let n = &mut c.executor.notifications;
        n.max_attempts = 3;
        n.retry_base_ms = 20;
        n.retry_max_ms = 100;
        n.timeout_ms = 2_000;
        n.webhooks = vec![
            WebhookConfig {
                name: "ops".into(),
                url: url.clone(),
                secret_file: secret_file.clone(),
                events: Vec::new(),
                tenant: "default".into(),
            },
            WebhookConfig {
                name: "gone".into(),
                url: format!("http://{gone}/hook"),
                secret_file: secret_file.clone(),
                events: vec!["job.completed".into()],
                tenant: String::new(),
            },
        ];
        b.apply(c);
    })
    .await
    .unwrap();
    let (stop_agent, agent) = serve_priced_agent(&s, "priced", "text.count", 30, Counting(1));
    wait_routed(&s, "text.count").await;
    let mut alice = JobServiceClient::new(s.channel_as("alice").await.unwrap());

    // A job a person approves, whose step is a priced agent call: 30 of a
    // 35 micro-USD budget (past 80%). Its input holds the marker.
    let priced = json!({"job_id": "priced", "approval": {"requires_approval": true},
        "budget": {"cost_limit_micro_usd": 35},
        "input": {"brief": MARKER},
        "tasks": [{"id": "a", "agent": {"capability": "text.count",
                   "input": {"text": "${parent.input.brief}"}}}]})
    .to_string();
    let j = submit(&mut alice, &priced).await.unwrap();
    // A job that fails.
    let failing = json!({"job_id": "failing",
        "tasks": [{"id": "b", "retry": {"max_retries": 0},
                   "command": {"command": "cat", "args": ["/nonexistent/nothing-here"]}}]})
    .to_string();
    submit(&mut alice, &failing).await.unwrap();
    // Wait for the approval notice, then approve.
    let until = |what: &'static str, done: Check| {
        let seen = seen.clone();
        async move {
            for _ in 0..300 {
                if done(&events(&seen)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("{what} within 30 s: {:?}", events(&seen));
        }
    };
    until(
        "an approval.needed notice",
        Box::new(|e| !of_type(e, "approval.needed").is_empty()),
    )
    .await;
    approve(&s, &j.run_id).await;
    finish(&mut alice, "priced").await;
    finish(&mut alice, "failing").await;
    until(
        "completed, failed and budget notices",
        Box::new(|e| {
            !of_type(e, "job.completed").is_empty()
                && !of_type(e, "job.failed").is_empty()
                && !of_type(e, "budget.threshold").is_empty()
        }),
    )
    .await;

    let evs = events(&seen);
    let needed = of_type(&evs, "approval.needed")[0];
    assert_eq!(needed["subject"], "priced");
    assert_eq!(needed["data"]["run_id"], j.run_id.as_str());
    assert_eq!(needed["specversion"], "1.0");
    let done = of_type(&evs, "job.completed")[0];
    assert_eq!(
        (
            done["data"]["state"].as_str(),
            done["data"]["cost_micro_usd"].as_i64()
        ),
        (Some("completed"), Some(30))
    );
    let failed = of_type(&evs, "job.failed")[0];
    assert_eq!(failed["subject"], "failing");
    let budget = of_type(&evs, "budget.threshold");
    assert_eq!(budget.len(), 1, "80% was crossed, 100% was not: {budget:?}");
    assert_eq!(
        (
            budget[0]["data"]["percent"].as_i64(),
            budget[0]["data"]["limit_micro_usd"].as_i64()
        ),
        (Some(80), Some(35))
    );
    {
        let s2 = seen.lock().unwrap();
        // Every request verified; the two answered 500 were sent again
        // and accepted.
        assert!(
            s2.requests.iter().all(|r| r.2),
            "a signature did not verify"
        );
        let id = |body: &str| serde_json::from_str::<Value>(body).unwrap()["id"].clone();
        let refused: Vec<Value> = s2
            .requests
            .iter()
            .filter(|r| !r.3)
            .map(|r| id(&r.1))
            .collect();
        assert_eq!(refused.len(), 2);
        for r in &refused {
            assert!(evs.iter().any(|e| &e["id"] == r), "{r} was not sent again");
        }
        // No secret, no key, no prompt in any payload.
        for (sig, body, _, _) in &s2.requests {
            for leak in [SECRET, MARKER, s.token("alice").unwrap().as_str()] {
                assert!(
                    !body.contains(leak) && !sig.contains(leak),
                    "a payload carries {leak:?}: {body}"
                );
            }
        }
    }

    // The webhook nothing answers: its deliveries end dead-lettered after
    // three attempts, in the view operators and admins have.
    let mut admin = NotificationServiceClient::new(s.channel_as("admin").await.unwrap());
    let mut dead = Vec::new();
    for _ in 0..300 {
        dead = admin
            .list_deliveries(ListDeliveriesRequest { dead_only: true })
            .await
            .unwrap()
            .into_inner()
            .deliveries;
        if !dead.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let d = dead
        .iter()
        .find(|d| d.webhook == "gone")
        .expect("a dead-lettered delivery");
    assert_eq!(
        (d.attempts, d.last_error.as_str()),
        (3, "the webhook could not be reached: connection failed")
    );
    assert!(!d.body.contains(MARKER));
    // A submitter may not look; another tenant's admin sees none of it.
    let mut alice_n = NotificationServiceClient::new(s.channel_as("alice").await.unwrap());
    let e = alice_n
        .list_deliveries(ListDeliveriesRequest { dead_only: true })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let [_, mallory, _] = outsiders(&s).await;
    let mut other = NotificationServiceClient::new(s.channel_with(&mallory).await.unwrap());
    let theirs = other
        .list_deliveries(ListDeliveriesRequest { dead_only: false })
        .await
        .unwrap()
        .into_inner()
        .deliveries;
    assert!(theirs.is_empty(), "{theirs:?}");
    let e = other
        .retry_delivery(RetryDeliveryRequest {
            delivery_id: d.delivery_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    // Sent again on request: pending, its attempts counted afresh.
    let again = admin
        .retry_delivery(RetryDeliveryRequest {
            delivery_id: d.delivery_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .delivery
        .unwrap();
    assert!(!again.dead && again.attempts == 0, "{again:?}");
    stop.fire();
    stop_agent.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}

switchyard_testkit::on_both_backends!(
    sled, postgres;
    webhooks_are_signed_retried_dead_lettered_and_carry_no_secret_or_prompt,
);

/// The example receiver (`examples/notifications/chat_relay.py`, run with
/// the real Python) checks the signature of what Switchyard sends and
/// posts a line to a chat webhook (here a stand-in recording what it
/// gets); a forged delivery is refused and posts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_chat_relay_verifies_deliveries_and_posts_them_to_a_chat() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("hook.secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    // The chat's incoming webhook: what was posted to it.
    let chat: Arc<Mutex<Vec<Value>>> = Arc::default();
    let posted = chat.clone();
    let app = axum::Router::new().route(
        "/chat",
        axum::routing::post(move |axum::Json(v): axum::Json<Value>| {
            let posted = posted.clone();
            async move {
                posted.lock().unwrap().push(v);
                http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let chat_url = format!("http://{}/chat", listener.local_addr().unwrap());
    let (stop_chat, chat_down) = switchyard_kit::shutdown::channel();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { chat_down.wait().await })
            .await
    });
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut relay = tokio::process::Command::new(crate::mcp::python())
        .arg(root.join("examples/notifications/chat_relay.py"))
        .args(["--port", "0"])
        .env("SWITCHYARD_WEBHOOK_SECRET_FILE", &secret_file)
        .env("CHAT_WEBHOOK_URL", &chat_url)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(relay.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let relay_url = first.strip_prefix("listening ").unwrap().to_owned();

    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.notifications.webhooks = vec![switchyard_executor::config::WebhookConfig {
            name: "chat".into(),
            url: format!("{relay_url}hook"),
            secret_file: secret_file.clone(),
            events: vec!["approval.needed".into()],
            tenant: "default".into(),
        }];
    })
    .await
    .unwrap();
    let mut alice = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    let doc = json!({"job_id": "relay-1", "approval": {"requires_approval": true},
        "input": {"brief": MARKER},
        "tasks": [{"id": "a", "agent": {"capability": "builtin.echo", "input": {"text": "hi"}}}]})
    .to_string();
    submit(&mut alice, &doc).await.unwrap();
    let mut said = Vec::new();
    for _ in 0..200 {
        said = chat.lock().unwrap().clone();
        if !said.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(said.len(), 1, "{said:?}");
    let text = said[0]["text"].as_str().unwrap();
    assert!(
        text.contains("Approval needed: job relay-1 (run run-relay-1) submitted by alice"),
        "{text}"
    );
    assert!(!text.contains(MARKER));
    // A forged delivery: refused, nothing posted.
    let body = json!({"specversion": "1.0", "id": "forged", "type": "dev.switchyard.job.failed",
                      "data": {"job_id": "relay-1"}})
    .to_string();
    let forged = reqwest::Client::new()
        .post(format!("{relay_url}hook"))
        .header(
            switchyard_kit::webhook::SIGNATURE_HEADER,
            switchyard_kit::webhook::sign(
                b"not-the-secret-at-all",
                switchyard_kit::time::now_ms() / 1000,
                body.as_bytes(),
            ),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 401);
    assert_eq!(chat.lock().unwrap().len(), 1, "the forged event was posted");
    stop_chat.fire();
    let _ = relay.kill().await;
    s.stop().await.unwrap();
}
