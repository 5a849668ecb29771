//! The gateway's doors against the in-process stack: AITP over REST/JSON
//! (reqwest) and AGEniX over RESP (a raw socket, replies read by the RESP
//! codec), each behind the same identity as the gRPC API.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::Duration;

use bytes::BytesMut;
use redis_protocol::resp2::types::OwnedFrame as Frame;
use serde_json::{Value, json};
use switchyard_proto::auth::v1::PrincipalKind;
use switchyard_testkit::Stack;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn stack() -> Stack {
    Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.approval_poll_ms = 20;
        c.gateway.resp.max_bulk_bytes = Some(64 * 1024);
    })
    .await
    .unwrap()
}

/// Seed 002's paper analysis, on the executor's built-in echo agent.
fn paper(task_id: &str) -> String {
    json!({
        "task_id": task_id,
        "name": "Research Paper Analysis",
        "description": "Analyze a research paper and extract key findings",
        "goal": "Extract key findings",
        "input": {"type": "object", "properties": {
            "paper_pdf_url": {"type": "string", "format": "uri", "default": "https://example.org/p.pdf"},
            "max_pages": {"type": "integer", "default": 50}}},
        "metadata": {"timeout_seconds": 60, "retry_policy": {"max_retries": 1, "backoff_strategy": "fixed", "backoff_base_ms": 10}},
        "subtasks": [
            {"subtask_id": "subtask_1", "name": "Extract Text from PDF", "agent_capability": "builtin.echo",
             "input": {"text": "text of ${parent.input.paper_pdf_url}"}, "output_mapping": {"text": "raw_text"}},
            {"subtask_id": "subtask_2", "name": "Analyze Text with NLP", "agent_capability": "builtin.echo",
             "depends_on": ["subtask_1"], "input": {"text": "${subtask_1.output.raw_text}"}, "output_mapping": {"text": "nlp_results"}},
            {"subtask_id": "subtask_3", "name": "Aggregate Results", "agent_capability": "builtin.echo",
             "depends_on": ["subtask_1", "subtask_2"],
             "input": {"raw_text": "${subtask_1.output.raw_text}", "nlp_results": "${subtask_2.output.nlp_results}"}}
        ]
    })
    .to_string()
}

struct Http {
    base: String,
    client: reqwest::Client,
}

impl Http {
    fn new(s: &Stack) -> Http {
        switchyard_kit::tls::install_crypto();
        Http {
            base: format!("http://{}", s.http.unwrap()),
            client: reqwest::Client::new(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<String>,
    ) -> (u16, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req.send().await.unwrap();
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `POST /aitp/tasks` with `body` as `token`.
    async fn post(&self, token: &str, body: impl Into<String>) -> (u16, Value) {
        self.call(
            reqwest::Method::POST,
            "/aitp/tasks",
            Some(token),
            Some(body.into()),
        )
        .await
    }

    /// `GET path` as `token`.
    async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, Some(token), None)
            .await
    }

    /// `DELETE path` as `token`.
    async fn delete(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(reqwest::Method::DELETE, path, Some(token), None)
            .await
    }

    /// Polls the status until the task is no longer PENDING or EXECUTING.
    async fn until_done(&self, id: &str, token: &str) -> Value {
        for _ in 0..400 {
            let (code, v) = self.get(&format!("/aitp/tasks/{id}"), token).await;
            assert_eq!(code, 200, "{v}");
            if v["status"] == "COMPLETED" || v["status"] == "FAILED" {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("task {id} did not finish in 10 s");
    }

    /// The task's SSE stream after `after`, read to its end: (id, event, data).
    async fn events(
        &self,
        id: &str,
        token: &str,
        after: Option<u64>,
    ) -> Vec<(Option<u64>, String, Value)> {
        let mut req = self
            .client
            .get(format!("{}/aitp/tasks/{id}/events", self.base))
            .bearer_auth(token);
        if let Some(a) = after {
            req = req.header("last-event-id", a.to_string());
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let body = tokio::time::timeout(Duration::from_secs(20), resp.text())
            .await
            .expect("the stream ends once the task has")
            .unwrap();
        body.split("\n\n")
            .filter(|block| block.lines().any(|l| l.starts_with("event:")))
            .map(|block| {
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
                };
                (
                    field("id:").map(|v| v.parse().unwrap()),
                    field("event:").unwrap(),
                    serde_json::from_str(&field("data:").unwrap()).unwrap(),
                )
            })
            .collect()
    }
}

#[tokio::test]
async fn aitp_tasks_are_submitted_followed_and_read_over_rest_as_the_seed_shows() {
    let s = stack().await;
    let h = Http::new(&s);
    let alice = s.token("alice").unwrap();
    let post = |body: String| {
        h.call(
            reqwest::Method::POST,
            "/aitp/tasks",
            Some(&alice),
            Some(body),
        )
    };

    let (code, v) = post(paper("paper-rest-1")).await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["task_id"], "paper-rest-1");
    assert!(
        v["created_at"].as_u64().unwrap() > 1_700_000_000,
        "unix seconds: {v}"
    );
    assert!(
        ["PENDING", "EXECUTING", "COMPLETED"].contains(&v["status"].as_str().unwrap()),
        "{v}"
    );

    // The events, to the end, then the result.
    let events = h.events("paper-rest-1", &alice, None).await;
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last.1, "end");
    assert_eq!(last.2["status"], "COMPLETED", "{last:?}");
    assert_eq!(rest[0].1, "job.submitted");
    let seqs: Vec<u64> = rest.iter().map(|e| e.0.unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "contiguous from 1: {seqs:?}"
    );
    assert_eq!(seqs[0], 1);
    assert!(rest.iter().all(|e| e.2["task_id"] == "paper-rest-1"));
    // Resumed after an event: only what came after.
    let resumed = h.events("paper-rest-1", &alice, Some(seqs[2])).await;
    assert_eq!(resumed[0].0, Some(seqs[3]));
    assert_eq!(resumed.len(), events.len() - 3);
    // Resumed after the last event: only `end`, with the final status.
    let tail = h.events("paper-rest-1", &alice, seqs.last().copied()).await;
    assert_eq!(tail.len(), 1, "{tail:?}");
    assert_eq!(
        (tail[0].1.as_str(), &tail[0].2["status"]),
        ("end", &json!("COMPLETED"))
    );

    let done = h.until_done("paper-rest-1", &alice).await;
    assert_eq!(done["state"], "completed");
    assert_eq!(done["progress"]["total_steps"], 3);
    assert_eq!(done["progress"]["percent_complete"], 100);
    let steps = done["progress"]["steps"].as_array().unwrap();
    assert_eq!(steps[2]["name"], "Aggregate Results");
    assert!(
        steps
            .iter()
            .all(|s| s["status"] == "COMPLETED" && s["agent_id"].is_string()),
        "{steps:?}"
    );
    assert!(
        done.get("estimated_completion").is_none(),
        "finished: no estimate"
    );
    assert_eq!(done["cost_so_far"], 0.0);

    let (code, r) = h.get("/aitp/tasks/paper-rest-1/result", &alice).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["status"], "COMPLETED");
    assert_eq!(
        r["result"]["subtask_3"]["raw_text"],
        "text of https://example.org/p.pdf"
    );
    assert!(r["execution_time_ms"].is_u64());
    assert_eq!(r["subtasks"].as_array().unwrap().len(), 3);

    // The same task again: the same task (200), run once; another
    // document under the same id: 409.
    let (code, again) = post(paper("paper-rest-1")).await;
    assert_eq!(
        (code, &again["task_id"]),
        (200, &json!("paper-rest-1")),
        "{again}"
    );
    let other = paper("paper-rest-1").replace("Aggregate Results", "Aggregate");
    let (code, e) = post(other).await;
    assert_eq!(
        (code, &e["error"]["reason"]),
        (409, &json!("JOB_ALREADY_EXISTS")),
        "{e}"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn aitp_errors_are_one_envelope_with_grpc_reasons_and_http_statuses() {
    let s = stack().await;
    let h = Http::new(&s);
    let alice = s.token("alice").unwrap();
    // 400: every problem, with reasons and fields, as gRPC says them.
    let bad = json!({"name": "x", "subtasks": [
        {"subtask_id": "a", "agent_capability": "builtin.echo", "depends_on": ["b"]},
        {"subtask_id": "b", "agent_capability": "builtin.echo", "depends_on": ["a"], "colour": "red"}]});
    let (code, e) = h.post(&alice, bad.to_string()).await;
    assert_eq!(code, 400, "{e}");
    let err = &e["error"];
    assert_eq!(err["status"], "INVALID_ARGUMENT");
    assert!(err["request_id"].as_str().is_some_and(|r| !r.is_empty()));
    let fields: Vec<&str> = err["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert!(fields.iter().any(|f| f.contains("colour")), "{fields:?}");
    assert!(
        err["fields"][0]["at"]
            .as_str()
            .is_some_and(|a| a.starts_with("line ")),
        "{err}"
    );
    // Problems found after reading name AITP's fields, never the JobSpec's
    // they were read into (no `tasks[0].agent.capability` for a submitter
    // who wrote `agent_capability`).
    let unnamed =
        json!({"name": "x", "subtasks": [{"subtask_id": "", "agent_capability": "Bad Cap!"}],});
    let (code, e) = h.post(&alice, unnamed.to_string()).await;
    assert_eq!(code, 400, "{e}");
    let fields: Vec<&str> = e["error"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"subtasks[0].subtask_id"), "{fields:?}");
    assert!(
        fields.contains(&"subtasks[0].agent_capability"),
        "{fields:?}"
    );
    assert!(
        !fields.iter().any(|f| f.starts_with("tasks[")),
        "{fields:?}"
    );
    // A document of another format is read as AITP and refused as such.
    let native =
        json!({"plan_id": "p", "tasks": [{"id": "a", "agent": {"capability": "builtin.echo"}}]});
    let (code, e) = h.post(&alice, native.to_string()).await;
    assert_eq!(code, 400, "{e}");
    // Not JSON at all; the wrong media type; too large.
    let (code, _) = h.post(&alice, "{nope").await;
    assert_eq!(code, 400);
    let resp = h
        .client
        .post(format!("{}/aitp/tasks", h.base))
        .bearer_auth(&alice)
        .header("content-type", "text/csv")
        .body("a,b")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);
    let big = "x".repeat(5 * 1024 * 1024);
    let (code, e) = h.post(&alice, big).await;
    assert_eq!(
        (code, &e["error"]["reason"]),
        (413, &json!("MESSAGE_TOO_LARGE")),
        "{e}"
    );
    // 404 for an unknown task; 404 for an unknown route.
    let (code, e) = h.get("/aitp/tasks/nope", &alice).await;
    assert_eq!(
        (code, &e["error"]["reason"]),
        (404, &json!("JOB_NOT_FOUND")),
        "{e}"
    );
    let (code, e) = h.get("/aitp/nothing", &alice).await;
    assert_eq!(
        (code, &e["error"]["reason"]),
        (404, &json!("ROUTE_NOT_FOUND")),
        "{e}"
    );
    // 409 while a task has not finished: one that sleeps.
    let slow = json!({"task_id": "slow-1", "subtasks": [{"subtask_id": "nap", "agent_capability": "builtin.sleep", "input": {"ms": 60000}}]});
    let (code, v) = h.post(&alice, slow.to_string()).await;
    assert_eq!(code, 201, "{v}");
    let (code, e) = h.get("/aitp/tasks/slow-1/result", &alice).await;
    assert_eq!(
        (code, &e["error"]["reason"]),
        (409, &json!("JOB_NOT_FINISHED")),
        "{e}"
    );
    // DELETE cancels; then the result is there, partial.
    let (code, v) = h.delete("/aitp/tasks/slow-1", &alice).await;
    assert_eq!((code, &v["status"]), (200, &json!("FAILED")), "{v}");
    assert_eq!(v["state"], "cancelled");
    let (code, r) = h.get("/aitp/tasks/slow-1/result", &alice).await;
    assert_eq!((code, &r["state"]), (200, &json!("cancelled")), "{r}");
    // Cancelling again: the job is final (409).
    let (code, e) = h.delete("/aitp/tasks/slow-1", &alice).await;
    assert_eq!(code, 409, "{e}");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn aitp_callers_are_who_they_authenticate_as_not_the_gateway() {
    let s = stack().await;
    let h = Http::new(&s);
    let alice = s.token("alice").unwrap();
    let carol = s
        .key("carol", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let viewer = s
        .key("vera", &["viewer"], PrincipalKind::Human)
        .await
        .unwrap();
    let (code, v) = h.post(&alice, paper("owned-1")).await;
    assert_eq!(code, 201, "{v}");
    // Recorded as alice's, from her key, whatever the document says.
    let mut jobs = switchyard_proto::executor::v1::job_service_client::JobServiceClient::new(
        s.channel().await.unwrap(),
    );
    let job = jobs
        .get_job(switchyard_proto::executor::v1::GetJobRequest {
            job_id: "owned-1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(job.submitted_by, "alice");
    // Another submitter does not see it (a gateway acting as a service
    // would read the whole tenant); a viewer reads but may not submit or cancel.
    for path in [
        "/aitp/tasks/owned-1",
        "/aitp/tasks/owned-1/result",
        "/aitp/tasks/owned-1/events",
    ] {
        let (code, e) = h.get(path, &carol).await;
        assert_eq!(
            (code, &e["error"]["reason"]),
            (404, &json!("JOB_NOT_FOUND")),
            "{path}: {e}"
        );
    }
    let (code, _) = h.delete("/aitp/tasks/owned-1", &carol).await;
    assert_eq!(code, 404);
    let (code, _) = h.get("/aitp/tasks/owned-1", &viewer).await;
    assert_eq!(code, 200);
    for (method, path, body) in [
        (reqwest::Method::POST, "/aitp/tasks", Some(paper("v-1"))),
        (reqwest::Method::DELETE, "/aitp/tasks/owned-1", None),
    ] {
        let (code, e) = h.call(method, path, Some(&viewer), body).await;
        assert_eq!(
            (code, &e["error"]["reason"]),
            (403, &json!("PERMISSION_DENIED")),
            "{path}: {e}"
        );
    }
    // No credential, a wrong one, a revoked-looking one: 401.
    for token in [None, Some("syk_not-a-key"), Some("garbage")] {
        let (code, e) = h
            .call(reqwest::Method::GET, "/aitp/tasks/owned-1", token, None)
            .await;
        assert_eq!(code, 401, "{token:?}: {e}");
    }
    // Open: the document and health.
    let (code, doc) = h
        .call(reqwest::Method::GET, "/openapi.json", None, None)
        .await;
    assert_eq!((code, &doc["openapi"]), (200, &json!("3.1.0")));
    s.stop().await.unwrap();
}

/// A RESP connection: commands out, replies in (decoded by the codec).
struct Resp {
    sock: TcpStream,
    buf: BytesMut,
}

impl Resp {
    async fn connect(s: &Stack) -> Resp {
        Resp {
            sock: TcpStream::connect(s.resp.unwrap()).await.unwrap(),
            buf: BytesMut::new(),
        }
    }

    fn encode(args: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        out
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).await.unwrap();
    }

    /// The next reply; `None` once the server closed the connection.
    async fn reply(&mut self) -> Option<Frame> {
        loop {
            if let Some((frame, used)) = redis_protocol::resp2::decode::decode(&self.buf).unwrap() {
                let _ = self.buf.split_to(used);
                return Some(frame);
            }
            let n =
                tokio::time::timeout(Duration::from_secs(10), self.sock.read_buf(&mut self.buf))
                    .await
                    .expect("a reply within 10 s")
                    .unwrap();
            if n == 0 {
                return None;
            }
        }
    }

    async fn cmd(&mut self, args: &[&str]) -> Frame {
        self.send(&Self::encode(args)).await;
        self.reply().await.expect("a reply")
    }
}

fn text(f: &Frame) -> String {
    match f {
        Frame::SimpleString(b) | Frame::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Frame::Error(e) => e.clone(),
        other => format!("{other:?}"),
    }
}

/// A RESP2 map reply (flat array) as pairs.
fn map(f: &Frame) -> std::collections::HashMap<String, Frame> {
    let Frame::Array(items) = f else {
        panic!("not a map: {f:?}")
    };
    items
        .chunks(2)
        .map(|kv| (text(&kv[0]), kv[1].clone()))
        .collect()
}

const LOG_ANALYSIS: &str = include_str!("../../../examples/jobs/log_analysis.json");

#[tokio::test]
async fn resp_submits_agenix_envelopes_with_the_seeds_answers_behind_auth() {
    let s = stack().await;
    let alice = s.token("alice").unwrap();
    let mut r = Resp::connect(&s).await;
    assert_eq!(text(&r.cmd(&["PING"]).await), "PONG");
    // Nothing but the handshake before AUTH.
    assert!(text(&r.cmd(&["PLAN.SUBMIT", LOG_ANALYSIS]).await).starts_with("NOAUTH"));
    assert!(text(&r.cmd(&["FLUSHALL"]).await).starts_with("NOAUTH"));
    assert!(text(&r.cmd(&["AUTH", "syk_wrong"]).await).starts_with("WRONGPASS"));
    assert!(
        text(&r.cmd(&["AUTH", "bob", &alice]).await).starts_with("WRONGPASS"),
        "the user must be the key's"
    );
    assert_eq!(text(&r.cmd(&["AUTH", "alice", &alice]).await), "OK");

    // Seed 001's example: +OK job_id=<id>.
    let ok = text(&r.cmd(&["PLAN.SUBMIT", LOG_ANALYSIS]).await);
    let id = ok
        .strip_prefix("OK job_id=")
        .unwrap_or_else(|| panic!("{ok}"))
        .to_owned();
    assert!(!id.is_empty());
    // The envelope's own job_id is the job's.
    let own = LOG_ANALYSIS.replacen('{', r#"{"job_id": "job-abc123","#, 1);
    assert_eq!(
        text(&r.cmd(&["PLAN.SUBMIT", &own]).await),
        "OK job_id=job-abc123"
    );
    // Every validation rule's text, as -ERR <text>.
    let envelope = |tasks: Value| json!({"job_id": "", "plan_id": "p", "tasks": tasks}).to_string();
    let t = |n: u32, extra: Value| {
        let mut v = json!({"task_number": n, "command": "sort"});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    for (tasks, want) in [
        (
            json!([]),
            "ERR Invalid job: tasks must contain at least one task",
        ),
        (
            json!([t(1, json!({})), t(2, json!({})), t(4, json!({}))]),
            "ERR Invalid task numbering: gap between task 2 and 4",
        ),
        (
            json!([t(2, json!({}))]),
            "ERR Invalid task numbering: must start at 1, found 2",
        ),
        (
            json!([t(1, json!({})), t(1, json!({}))]),
            "ERR Invalid task numbering: duplicate or out-of-order task 1 after task 1",
        ),
        (
            json!([t(1, json!({"input_from_task": 1}))]),
            "ERR Invalid input reference: task 1 cannot read its own output",
        ),
        (
            json!([t(1, json!({"input_from_task": 2})), t(2, json!({}))]),
            "ERR Invalid input reference: task 1 reads task 2, which does not come before it",
        ),
        (
            json!([t(1, json!({"command": ""}))]),
            "ERR Invalid command: task 1 has an empty command",
        ),
    ] {
        assert_eq!(text(&r.cmd(&["JOB.SUBMIT", &envelope(tasks)]).await), want);
    }
    let many: Vec<Value> = (1..=101).map(|n| t(n, json!({}))).collect();
    assert_eq!(
        text(&r.cmd(&["PLAN.SUBMIT", &envelope(Value::Array(many))]).await),
        "ERR Invalid job: 101 tasks exceed the limit of 100"
    );
    assert_eq!(
        text(
            &r.cmd(&[
                "PLAN.SUBMIT",
                &json!({"tasks": [t(1, json!({}))]}).to_string()
            ])
            .await
        ),
        "ERR Invalid job: plan_id is required"
    );
    assert!(text(&r.cmd(&["PLAN.SUBMIT", "{not json"]).await).starts_with("ERR not valid JSON"));
    assert!(text(&r.cmd(&["PLAN.SUBMIT"]).await).contains("wrong number of arguments"));
    assert!(text(&r.cmd(&["NOPE", "x"]).await).starts_with("ERR unknown command 'NOPE'"));

    // Status, result once finished (this machine has no `grep` allowlisted
    // in the test stack's executor, so the job fails: partial results).
    let status = map(&r.cmd(&["JOB.STATUS", &id]).await);
    assert_eq!(text(&status["job_id"]), id);
    let mut result = Frame::Null;
    for _ in 0..400 {
        result = r.cmd(&["JOB.RESULT", &id]).await;
        if !text(&result).contains("has not finished") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let result = map(&result);
    assert!(
        ["completed", "discarded"].contains(&text(&result["state"]).as_str()),
        "{result:?}"
    );
    let Frame::Array(tasks) = &result["tasks"] else {
        panic!()
    };
    let first = map(&tasks[0]);
    assert_eq!(text(&first["task_id"]), "task_1");
    assert_eq!(first["task_number"], Frame::Integer(1));
    assert!(text(&r.cmd(&["JOB.STATUS", "nope"]).await).starts_with("ERR job \"nope\" not found"));
    // Cancel: a finished job is final.
    assert!(text(&r.cmd(&["JOB.CANCEL", &id]).await).starts_with("ERR"));
    assert_eq!(text(&r.cmd(&["QUIT"]).await), "OK");
    assert!(r.reply().await.is_none(), "QUIT closes");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn resp_framing_holds_pipelines_partial_reads_bad_frames_and_huge_lengths() {
    let s = stack().await;
    let alice = s.token("alice").unwrap();
    let viewer = s
        .key("vera", &["viewer"], PrincipalKind::Human)
        .await
        .unwrap();
    // Pipelined: three commands in one write, three replies in order.
    let mut r = Resp::connect(&s).await;
    let mut batch = Resp::encode(&["AUTH", &alice]);
    batch.extend(Resp::encode(&["PING", "one"]));
    batch.extend(Resp::encode(&["JOB.STATUS", "nope"]));
    r.send(&batch).await;
    assert_eq!(text(&r.reply().await.unwrap()), "OK");
    assert_eq!(text(&r.reply().await.unwrap()), "one");
    assert!(text(&r.reply().await.unwrap()).contains("not found"));
    // A command split over many writes.
    let cmd = Resp::encode(&["PING", "split"]);
    for b in &cmd {
        r.send(&[*b]).await;
    }
    assert_eq!(text(&r.reply().await.unwrap()), "split");
    // HELLO 3: a RESP3 map (decoded raw: `%7`).
    r.send(&Resp::encode(&["HELLO", "3"])).await;
    let mut raw = vec![0u8; 256];
    let n = r.sock.read(&mut raw).await.unwrap();
    assert!(
        raw[..n].starts_with(b"%7\r\n"),
        "{:?}",
        String::from_utf8_lossy(&raw[..n])
    );

    // A viewer may read but not submit: -NOPERM.
    let mut v = Resp::connect(&s).await;
    assert_eq!(text(&v.cmd(&["AUTH", &viewer]).await), "OK");
    assert!(text(&v.cmd(&["PLAN.SUBMIT", LOG_ANALYSIS]).await).starts_with("NOPERM"));
    assert!(text(&v.cmd(&["JOB.STATUS", "nope"]).await).contains("not found"));

    // A malformed frame: -ERR Protocol error, then closed.
    let mut m = Resp::connect(&s).await;
    m.send(b"*1\r\n:5\r\n").await;
    assert!(text(&m.reply().await.unwrap()).starts_with("ERR Protocol error"));
    assert!(m.reply().await.is_none());
    // A 100 MB bulk string is refused from its header: nothing of it is
    // sent, and the answer comes at once.
    let mut big = Resp::connect(&s).await;
    big.send(b"*2\r\n$11\r\nPLAN.SUBMIT\r\n$104857600\r\n")
        .await;
    let refused = text(&big.reply().await.unwrap());
    assert!(
        refused.starts_with("ERR Protocol error: invalid bulk length"),
        "{refused}"
    );
    assert!(big.reply().await.is_none());
    s.stop().await.unwrap();
}

/// The gRPC call each gateway route and verb stands for.
pub(crate) const DOOR_RPCS: &[(&str, &str)] = &[
    // Not an RPC: the permission itself (operators and admins).
    ("GET /metrics", "metrics.read"),
    ("POST /aitp/tasks", "JobService/SubmitJob"),
    ("GET /aitp/tasks/{task_id}", "JobService/GetJob"),
    ("GET /aitp/tasks/{task_id}/result", "JobService/GetResult"),
    ("GET /aitp/tasks/{task_id}/events", "JobService/WatchJob"),
    ("DELETE /aitp/tasks/{task_id}", "JobService/CancelJob"),
    (
        "GET /aitp/tasks/{task_id}/input",
        "JobService/ListInputRequests",
    ),
    ("POST /aitp/tasks/{task_id}/input", "JobService/SendInput"),
    (
        "GET /aitp/tasks/{task_id}/messages",
        "JobService/ListMessages",
    ),
    (
        "POST /aitp/tasks/{task_id}/messages",
        "JobService/SendMessage",
    ),
    ("PLAN.SUBMIT", "JobService/SubmitJob"),
    ("JOB.SUBMIT", "JobService/SubmitJob"),
    ("JOB.STATUS", "JobService/GetJob"),
    ("JOB.RESULT", "JobService/GetResult"),
    ("JOB.CANCEL", "JobService/CancelJob"),
    ("POST /ojs/v1/jobs", "JobService/SubmitJob"),
    ("POST /ojs/v1/jobs/batch", "JobService/SubmitJob"),
    ("GET /ojs/v1/jobs/{id}", "JobService/GetJob"),
    ("DELETE /ojs/v1/jobs/{id}", "JobService/CancelJob"),
    ("POST /ojs/v1/jobs/{id}/activate", "ApprovalService/Approve"),
    ("GET /ojs/v1/events", "JobService/ListJobs"),
    ("GET /ojs/v1/dead-letter", "JobService/ListJobs"),
    (
        "POST /ojs/v1/dead-letter/{id}/retry",
        "JobService/RetryDeadLetter",
    ),
    (
        "DELETE /ojs/v1/dead-letter/{id}",
        "JobService/DeleteDeadLetter",
    ),
    ("POST /ojs/v1/workers/fetch", "WorkerService/Fetch"),
    ("POST /ojs/v1/workers/ack", "WorkerService/Ack"),
    ("POST /ojs/v1/workers/nack", "WorkerService/Nack"),
    ("POST /ojs/v1/workers/heartbeat", "WorkerService/Heartbeat"),
    // `/mcp` admits any authenticated principal (as WhoAmI does); each of
    // its tools then needs what its gRPC call needs, checked by the
    // service it calls with the request's own token
    // (tests/mcp/client_test.py: a viewer's submit_job is refused).
    // `/a2a` likewise: each JSON-RPC method is checked by the executor as
    // the caller (a2a_door.rs: another submitter, tenant or agent key is
    // refused).
    (
        "POST /v1/triggers/{trigger_id}/events",
        "TriggerService/FireTrigger",
    ),
    ("POST /a2a", "AuthService/WhoAmI"),
    // A2A's HTTP+JSON binding: the gate lets every caller through; a
    // refusal of the executor's is a 403 here (over JSON-RPC it is a 200
    // carrying an error), so reading a task is GetJob's rule. A message
    // naming no task and a POST that is no `:cancel` are refused for
    // everyone alike (400, 404).
    ("POST /a2a/message:send", "AuthService/WhoAmI"),
    ("GET /a2a/tasks/{task_id}", "JobService/GetJob"),
    ("POST /a2a/tasks/{task_id}", "AuthService/WhoAmI"),
    ("POST /mcp", "AuthService/WhoAmI"),
    ("GET /mcp", "AuthService/WhoAmI"),
    ("DELETE /mcp", "AuthService/WhoAmI"),
    // The console: each page needs what the call it makes needs (checked
    // with a session cookie in console.rs).
    ("POST /ui/sign-out", "AuthService/EndSession"),
    ("GET /ui/", "ApprovalService/ListRuns"),
    (
        "POST /ui/runs/{run_id}/{decision}",
        "ApprovalService/Approve",
    ),
    ("GET /ui/jobs", "JobService/ListJobs"),
    ("GET /ui/jobs/{job_id}", "JobService/GetJob"),
    ("GET /ui/jobs/{job_id}/events", "JobService/WatchJob"),
    ("POST /ui/jobs/{job_id}/cancel", "JobService/CancelJob"),
    ("POST /ui/jobs/{job_id}/input", "JobService/SendInput"),
    ("POST /ui/jobs/{job_id}/rerun", "JobService/RerunJob"),
    ("GET /ui/jobs/{job_id}/chat", "JobService/ListMessages"),
    ("POST /ui/jobs/{job_id}/chat", "JobService/SendMessage"),
    ("GET /ui/submit", "JobService/SubmitJob"),
    ("POST /ui/submit", "JobService/SubmitJob"),
    ("GET /ui/budgets", "LedgerService/ListBudgets"),
    ("GET /ui/limits", "LedgerService/ListLimits"),
    ("GET /ui/agents", "RegistryService/ListAgents"),
    ("GET /ui/schedules", "ScheduleService/ListSchedules"),
    (
        "GET /ui/notifications",
        "NotificationService/ListDeliveries",
    ),
    (
        "POST /ui/notifications/retry",
        "NotificationService/RetryDelivery",
    ),
    (
        "POST /ui/schedules/{schedule_id}/{action}",
        "ScheduleService/PauseSchedule",
    ),
    // Any signed-in person: each list it watches is read as them.
    ("GET /ui/live", "AuthService/WhoAmI"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorization_matrix_holds_for_every_gateway_route_and_verb() {
    let s = stack().await;
    let h = Http::new(&s);
    // Every guarded route of the table is in the matrix.
    for (m, r, a) in switchyard_kit::auth::HTTP_ROUTES {
        if *a != switchyard_kit::auth::Access::Open {
            assert!(
                DOOR_RPCS.iter().any(|(d, _)| *d == format!("{m} {r}")),
                "{m} {r} is not in the matrix"
            );
        }
    }
    let (mut tried, mut wrong) = (0, Vec::new());
    for role in crate::auth::ROLES {
        let token = crate::auth::role_key(&s, "g", role).await;
        let allowed = crate::auth::allowed(role);
        let mut resp = Resp::connect(&s).await;
        assert_eq!(text(&resp.cmd(&["AUTH", &token]).await), "OK");
        for (door, rpc) in DOOR_RPCS {
            if door.contains(" /ui/") {
                continue; // session cookies: console.rs
            }
            let want = allowed.contains(*rpc);
            let denied = match door.split_once(' ') {
                Some((method, route)) => {
                    let path = route
                        .replace("{task_id}", "no-such-task")
                        .replace("{id}", "no-such-job");
                    let body = (method == "POST").then(|| match route {
                        "/ojs/v1/jobs/batch" => {
                            json!({"jobs": [{"type": "m.x", "args": []}]}).to_string()
                        }
                        "/aitp/tasks/{task_id}/input" => json!({"answer": 1}).to_string(),
                        "/aitp/tasks/{task_id}/messages" => json!({"text": "hi"}).to_string(),
                        r if r.starts_with("/ojs/") => {
                            json!({"type": "m.x", "args": [], "queues": ["m"], "worker_id": "w"})
                                .to_string()
                        }
                        _ => paper(&format!("m-{role}")),
                    });
                    let (code, e) = h
                        .call(method.parse().unwrap(), &path, Some(&token), body)
                        .await;
                    assert_ne!(code, 401, "{role} {door}: {e}");
                    if role == "agent" && *rpc == "JobService/SubmitJob" {
                        // The executor's own rule, as over gRPC: an agent
                        // submits only child jobs of the job it works for.
                        assert!(
                            e["error"]["message"]
                                .as_str()
                                .unwrap()
                                .contains("delegated"),
                            "{e}"
                        );
                        continue;
                    }
                    code == 403
                }
                None => {
                    let arg = if door.ends_with("SUBMIT") {
                        LOG_ANALYSIS
                    } else {
                        "no-such-job"
                    };
                    let answer = text(&resp.cmd(&[door, arg]).await);
                    if role == "agent" && *rpc == "JobService/SubmitJob" {
                        assert!(
                            answer.starts_with("NOPERM") && answer.contains("delegated"),
                            "{answer}"
                        );
                        continue;
                    }
                    answer.starts_with("NOPERM")
                }
            };
            tried += 1;
            if want == denied {
                wrong.push(format!("{role} {door}: allowed={want}, denied={denied}"));
            }
        }
    }
    // Without a credential: 401 and -NOAUTH everywhere.
    let mut anon = Resp::connect(&s).await;
    for (door, _) in DOOR_RPCS {
        if door.contains(" /ui/") {
            continue; // no session: sign-in or a refused form (console.rs)
        }
        match door.split_once(' ') {
            Some((method, route)) => {
                let path = route.replace("{task_id}", "x");
                let (code, e) = h.call(method.parse().unwrap(), &path, None, None).await;
                // OJS routes answer in the OJS envelope (reason in details).
                let reason = if route.starts_with("/ojs/") {
                    assert_eq!(e["error"]["code"], "unauthenticated", "{door}");
                    &e["error"]["details"]["reason"]
                } else {
                    &e["error"]["reason"]
                };
                assert_eq!((code, reason), (401, &json!("AUTH_REQUIRED")), "{door}");
            }
            None => assert!(
                text(&anon.cmd(&[door, "x"]).await).starts_with("NOAUTH"),
                "{door}"
            ),
        }
    }
    println!(
        "gateway authorization matrix: {tried} (role x door) pairs tried, {} wrong",
        wrong.len()
    );
    assert!(wrong.is_empty(), "wrong:\n{}", wrong.join("\n"));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn resp_connections_past_the_limit_are_refused_and_idle_ones_closed() {
    // The limit, with no idle timeout to free a place meanwhile.
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.gateway.resp.max_connections = 2;
        c.gateway.resp.idle_timeout_secs = 0;
    })
    .await
    .unwrap();
    let alice = s.token("alice").unwrap();
    let mut a = Resp::connect(&s).await;
    let mut b = Resp::connect(&s).await;
    assert_eq!(text(&a.cmd(&["AUTH", &alice]).await), "OK");
    assert_eq!(text(&b.cmd(&["PING"]).await), "PONG");
    // A third, while two are open: Redis's answer, then closed.
    let mut c = Resp::connect(&s).await;
    assert_eq!(
        text(&c.reply().await.unwrap()),
        "ERR max number of clients reached"
    );
    assert!(c.reply().await.is_none());
    // One leaves: its place is free again.
    assert_eq!(text(&a.cmd(&["QUIT"]).await), "OK");
    assert!(a.reply().await.is_none());
    // (Its connection task ends just after the close: poll, bounded.)
    let mut freed = false;
    for _ in 0..100 {
        let mut d = Resp::connect(&s).await;
        if text(&d.cmd(&["PING"]).await) == "PONG" {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "a closed connection's place is given back");
    s.stop().await.unwrap();

    // Silent past the idle limit: the server closes the connection
    // (awaited, bounded by the reply timeout, not slept).
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.gateway.resp.idle_timeout_secs = 1;
    })
    .await
    .unwrap();
    let mut idle = Resp::connect(&s).await;
    assert_eq!(text(&idle.cmd(&["PING"]).await), "PONG");
    assert!(idle.reply().await.is_none(), "an idle connection is closed");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_rest_callers_correlation_id_is_the_tasks_and_answers_carry_it() {
    let s = stack().await;
    let h = Http::new(&s);
    let alice = s.token("alice").unwrap();
    let resp = h
        .client
        .post(format!("{}/aitp/tasks", h.base))
        .bearer_auth(&alice)
        .header("x-correlation-id", "corr-rest-1")
        .header("content-type", "application/json")
        .body(paper("corr-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-correlation-id"], "corr-rest-1");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["correlation_id"], "corr-rest-1", "{v}");
    let events = h.events("corr-1", &alice, None).await;
    assert!(
        events
            .iter()
            .filter(|e| e.1 != "end")
            .all(|e| e.2["correlation_id"] == "corr-rest-1"),
        "every event carries it"
    );
    s.stop().await.unwrap();
}

/// Reads until the server closes the connection (`true`), bounded by
/// `limit` (`false` when it is still open then).
async fn closed_within(sock: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let read_to_end = async {
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, read_to_end).await.is_ok()
}

#[tokio::test]
async fn http_clients_that_trickle_a_request_are_cut_off_and_one_address_cannot_take_every_slot() {
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.gateway.http.header_read_timeout_ms = 300;
        c.gateway.http.max_connections_per_ip = 2;
    })
    .await
    .unwrap();
    let addr = s.http.unwrap();
    // A head trickled a byte at a time: closed once its deadline passes,
    // long before the trickle would end (100 bytes, one each 50 ms).
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ")
        .await
        .unwrap();
    let trickle = async {
        for _ in 0..100 {
            if slow.write_all(b"a").await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    let cut = trickle.await || closed_within(&mut slow, Duration::from_secs(1)).await;
    assert!(cut, "a trickled request head is cut off");

    // Two connections from 127.0.0.1 held open: a third is closed at once.
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let n = c.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1"), "served");
        held.push(c);
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    let _ = third
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
        .await
        .expect("answered or closed within 5 s")
        .unwrap_or(0);
    assert_eq!(
        n, 0,
        "a third connection from one address is closed unserved"
    );
    drop(held);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn ojs_refuses_an_oversized_body_with_413_and_closes_and_checks_queue_jobs_agent_fields() {
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.gateway.http.max_body_bytes = Some(1024);
    })
    .await
    .unwrap();
    let alice = s.token("alice").unwrap();
    // Over the limit: 413 request_too_large, not retryable, and the
    // connection is closed as announced.
    let body = format!(r#"{{"type":"email.send","args":["{}"]}}"#, "x".repeat(4096));
    let mut c = TcpStream::connect(s.http.unwrap()).await.unwrap();
    let head = format!(
        "POST /ojs/v1/jobs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {alice}\r\ncontent-type: application/openjobspec+json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let _ = c.write_all(body.as_bytes()).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server closes the connection");
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 413"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(answer.contains("\"request_too_large\""), "{answer}");
    assert!(answer.contains("\"retryable\":false"), "{answer}");

    // A queue job with seed 000's fields obeys seed 000.
    let h = Http::new(&s);
    for (field, value) in [
        ("ext_agent_temperature", json!(2.5)),
        ("ext_agent_tool_choice", json!("sometimes")),
    ] {
        let mut job = json!({"type": "email.send", "args": []});
        job[field] = value;
        let (code, body) = h
            .call(
                reqwest::Method::POST,
                "/ojs/v1/jobs",
                Some(&alice),
                Some(job.to_string()),
            )
            .await;
        assert_eq!(code, 400, "{field}: {body}");
        assert!(body.to_string().contains(field), "{body}");
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn resp_clients_must_authenticate_in_time_and_cannot_all_wait_unauthenticated() {
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.gateway.resp.auth_timeout_ms = 300;
        c.gateway.resp.max_unauthenticated = 1;
        c.gateway.resp.frame_timeout_ms = 300;
    })
    .await
    .unwrap();
    let alice = s.token("alice").unwrap();
    // Never AUTHs: told why, then closed.
    let mut lazy = Resp::connect(&s).await;
    assert_eq!(text(&lazy.cmd(&["PING"]).await), "PONG");
    // The only unauthenticated slot is taken: another is refused.
    let mut second = Resp::connect(&s).await;
    assert_eq!(
        text(&second.reply().await.unwrap()),
        "ERR max number of clients reached"
    );
    assert!(
        text(&lazy.reply().await.unwrap()).contains("authenticate with AUTH first"),
        "the deadline is named"
    );
    assert!(lazy.reply().await.is_none());
    // Its slot is free again (the connection task ends just after the
    // close: poll, bounded); one that AUTHs stays, and a frame it
    // trickles is cut off.
    let mut ok = None;
    for _ in 0..100 {
        let mut c = Resp::connect(&s).await;
        c.send(&Resp::encode(&["AUTH", &alice])).await;
        if let Some(f) = c.reply().await
            && text(&f) == "OK"
        {
            ok = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut authed = ok.expect("an authenticated connection");
    authed.send(b"*1\r\n$4\r\nPI").await;
    assert!(
        text(&authed.reply().await.unwrap()).contains("not completed in time"),
        "a partial frame is cut off"
    );
    assert!(authed.reply().await.is_none());
    s.stop().await.unwrap();
}
