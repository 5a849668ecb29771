//! Input into a running job, from the CLI against a real `switchyard dev`,
//! through two crashes: `kill -9` while the task waits keeps the question,
//! and `kill -9` right after an answer was acknowledged keeps the answer —
//! the job goes on with it once, and the same answer sent again is told it
//! was already taken.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures_util::StreamExt;
use switchyard_kit::client::{Credential, Intercepted, authed, connect};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{GetJobRequest, Job, JobState, TaskState, WatchJobRequest};

use crate::support::*;

const JOB: &str = r#"
job_id: deploy-size
input: {service: checkout}
tasks:
  - id: ask
    input:
      prompt: "How many replicas for ${parent.input.service}?"
      schema: {type: object, required: [size], properties: {size: {type: integer, minimum: 1}}}
  - id: use
    depends_on: [ask]
    agent: {capability: builtin.echo, input: {text: "size ${ask.output.answer.size}"}}
"#;

async fn alice(url: &str) -> JobServiceClient<Intercepted> {
    JobServiceClient::new(authed(
        connect(url).await.unwrap(),
        Some(Credential::bearer(&token(url, "alice")).unwrap()),
    ))
}

/// Waits (bounded) until deploy-size asks its question.
async fn asked(url: &str) {
    kinds_until(
        url,
        &token(url, "alice"),
        "deploy-size",
        "task.input_requested",
    )
    .await;
}

async fn job_of(url: &str, id: &str) -> Job {
    alice(url)
        .await
        .get_job(GetJobRequest { job_id: id.into() })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
}

/// deploy-size's result as alice reads it (`job result -o json`).
fn result_of(url: &str) -> String {
    ok(&cli(
        url,
        &[
            "job",
            "result",
            "deploy-size",
            "-o",
            "json",
            "--as",
            "alice",
        ],
    ))
}

/// Waits (bounded) until deploy-size completed.
async fn until_completed(url: &str) {
    let done = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if job_of(url, "deploy-size").await.state == JobState::Completed as i32 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(done.is_ok(), "{:?}", job_of(url, "deploy-size").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_survives_kill_9_on_either_side_and_is_taken_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, JOB).unwrap();
    let dev1 = dev_in(dir.path());
    let url = dev1.url();
    submit_as(&url, file.to_str().unwrap(), "alice");
    asked(&url).await;
    // Crash while the task waits.
    dev1.kill9();

    let dev2 = dev_in(dir.path());
    let url = dev2.url();
    let job = job_of(&url, "deploy-size").await;
    assert_eq!(job.tasks[0].state, TaskState::InputRequired as i32);
    let listed = ok(&cli(&url, &["job", "inputs", "--as", "alice"]));
    assert!(
        listed.contains("deploy-size ask") && listed.contains("How many replicas for checkout?"),
        "{listed}"
    );
    // A bad answer is refused and changes nothing.
    let bad = cli(
        &url,
        &[
            "job",
            "input",
            "deploy-size",
            "--answer",
            r#"{"size": "many"}"#,
            "--as",
            "alice",
        ],
    );
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("answer_schema"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    // The resumed attempt may not be waiting yet: the same key is safe to send again.
    let args = [
        "job",
        "input",
        "deploy-size",
        "--answer",
        r#"{"size": 3}"#,
        "--key",
        "k-1",
        "--as",
        "alice",
    ];
    let mut answered = cli(&url, &args);
    for _ in 0..100 {
        if answered.status.success() {
            break;
        }
        assert!(
            String::from_utf8_lossy(&answered.stderr).contains("send the same answer"),
            "{}",
            String::from_utf8_lossy(&answered.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
        answered = cli(&url, &args);
    }
    let out = ok(&answered);
    assert!(out.starts_with("answered task ask as alice"), "{out}");
    // Crash right after the answer was acknowledged.
    dev2.kill9();

    let dev3 = dev_in(dir.path());
    let url = dev3.url();
    until_completed(&url).await;
    let again = ok(&cli(&url, &args));
    assert!(again.contains("(already taken)"), "{again}");
    let job = job_of(&url, "deploy-size").await;
    assert_eq!(job.state, JobState::Completed as i32);
    assert_eq!(job.tasks[0].attempts.len(), 1, "{:?}", job.tasks[0]);
    // (The step after may have been running at the crash: like any
    // attempt cut off by one, it runs again — with the same answer.)
    assert_eq!(job.tasks[1].state, TaskState::Succeeded as i32);
    let all = {
        let mut c = alice(&url).await;
        c.watch_job(WatchJobRequest {
            job_id: "deploy-size".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .map(|m| m.unwrap().event.unwrap().kind)
        .collect::<Vec<_>>()
        .await
    };
    let count = |k: &str| all.iter().filter(|x| x.as_str() == k).count();
    assert_eq!(count("task.input_requested"), 1, "{all:?}");
    assert_eq!(count("task.input_received"), 1, "{all:?}");
    let result = result_of(&url);
    assert!(result.contains("size 3"), "{result}");
    assert_eq!(dev3.terminate(), Some(0));
}

/// `curl -s -w '\n%{http_code}' -X METHOD URL` with `token` as bearer and an
/// optional JSON body: (status, body as JSON).
fn curl(method: &str, url: &str, token: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    let mut c = std::process::Command::new("curl");
    c.args(["-s", "-w", "\n%{http_code}", "-X", method, url])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", "Idempotency-Key: rest-1"]);
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "--data", b]);
    }
    let out = c.output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(body).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_lists_and_answers_a_waiting_step_over_rest() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, JOB).unwrap();
    let dev = dev_in(dir.path());
    let url = dev.url();
    let http = format!("http://{}", dev.http.as_deref().unwrap());
    submit_as(&url, file.to_str().unwrap(), "alice");
    asked(&url).await;
    let (alice, bob) = (token(&url, "alice"), token(&url, "bob"));
    let input = format!("{http}/aitp/tasks/deploy-size/input");

    let (code, listed) = curl("GET", &input, &alice, None);
    assert_eq!(code, 200, "{listed}");
    assert_eq!(listed["waiting"][0]["subtask_id"], "ask", "{listed}");
    assert_eq!(
        listed["waiting"][0]["prompt"],
        "How many replicas for checkout?"
    );
    // bob can read the job (approver) but the step takes the submitter's answer.
    let (code, e) = curl("POST", &input, &bob, Some(r#"{"answer": {"size": 2}}"#));
    assert_eq!(code, 403, "{e}");
    assert_eq!(e["error"]["reason"], "INPUT_NOT_ALLOWED", "{e}");
    let (code, e) = curl("POST", &input, &alice, Some(r#"{"answer": {"size": 0}}"#));
    assert_eq!(code, 400, "{e}");
    let (code, e) = curl("POST", &input, &alice, Some(r#"{"anwser": 3}"#));
    assert_eq!(code, 400, "{e}");
    let (code, ok) = curl("POST", &input, &alice, Some(r#"{"answer": {"size": 2}}"#));
    assert_eq!(code, 200, "{ok}");
    assert_eq!(ok["answered_by"], "alice", "{ok}");
    assert_eq!(ok["replayed"], false, "{ok}");
    // The same Idempotency-Key: the first outcome.
    let (code, again) = curl("POST", &input, &alice, Some(r#"{"answer": {"size": 7}}"#));
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(dev.terminate(), Some(0));
}

/// One A2A JSON-RPC call to `http`/a2a as `token`: the response.
fn a2a(http: &str, token: &str, method: &str, params: serde_json::Value) -> serde_json::Value {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let out = std::process::Command::new("curl")
        .args(["-s", &format!("{http}/a2a")])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", "Content-Type: application/json", "--data"])
        .arg(body.to_string())
        .output()
        .expect("run curl");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The A2A door's side of exactly-once: an answer sent over A2A and
/// acknowledged survives `kill -9`, and the same message sent again after
/// the restart (a client that never saw the acknowledgement) is taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_sent_over_a2a_survives_kill_9_and_a_resend_is_taken_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, JOB).unwrap();
    let dev1 = dev_in(dir.path());
    let url = dev1.url();
    let http = format!("http://{}", dev1.http.as_deref().unwrap());
    submit_as(&url, file.to_str().unwrap(), "alice");
    asked(&url).await;
    let alice = token(&url, "alice");
    let asked = a2a(
        &http,
        &alice,
        "GetTask",
        serde_json::json!({"id": "deploy-size"}),
    );
    assert_eq!(
        asked["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{asked}"
    );
    assert_eq!(
        asked["result"]["status"]["message"]["parts"][0]["text"],
        "How many replicas for checkout?"
    );
    let message = serde_json::json!({"message": {"messageId": "a2a-answer-1", "taskId": "deploy-size",
        "role": "ROLE_USER", "parts": [{"data": {"size": 4}}]}});
    let sent = a2a(&http, &alice, "SendMessage", message.clone());
    assert!(sent["result"]["task"]["id"] == "deploy-size", "{sent}");
    // Crash right after the acknowledgement.
    dev1.kill9();

    let dev2 = dev_in(dir.path());
    let url = dev2.url();
    let http = format!("http://{}", dev2.http.as_deref().unwrap());
    until_completed(&url).await;
    // The same message again: the first outcome, not a second answer.
    let again = a2a(&http, &alice, "SendMessage", message);
    assert_eq!(
        again["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{again}"
    );
    // A different answer now: refused, the step is not waiting.
    let other = a2a(
        &http,
        &alice,
        "SendMessage",
        serde_json::json!({"message": {"messageId": "a2a-answer-2", "taskId": "deploy-size",
            "role": "ROLE_USER", "parts": [{"data": {"size": 5}}]}}),
    );
    assert!(
        other["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("does not wait for input"),
        "{other}"
    );
    let job = job_of(&url, "deploy-size").await;
    assert_eq!(job.tasks[0].attempts.len(), 1, "{:?}", job.tasks[0]);
    let result = result_of(&url);
    assert!(result.contains("size 4"), "{result}");
    assert_eq!(dev2.terminate(), Some(0));
}
