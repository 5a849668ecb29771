//! The A2A JSON-RPC client: `SendStreamingMessage` (server-sent events)
//! or `SendMessage`, read as one sequence of [`Update`]s whatever the
//! method, and `CancelTask` — in A2A 1.0, or for an agent whose card is
//! 0.3 in that version's names (`message/stream`, `message/send`,
//! `tasks/cancel`) and shapes (`kind`-tagged messages, parts and results).
//! The version is the card's, never guessed from an answer.

use std::pin::Pin;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::A2aError;

/// The states of an A2A task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskState {
    /// Accepted, not started.
    Submitted,
    /// Running.
    Working,
    /// Done.
    Completed,
    /// Failed.
    Failed,
    /// Cancelled.
    Canceled,
    /// Waiting for the client's answer.
    InputRequired,
    /// Not taken on.
    Rejected,
    /// Waiting for authentication.
    AuthRequired,
    /// A state this build does not know.
    Other(String),
}

impl TaskState {
    /// Reads `TASK_STATE_COMPLETED` (1.0) or `completed` (0.3).
    pub fn parse(s: &str) -> TaskState {
        match crate::v03::state(s).as_str() {
            "submitted" => TaskState::Submitted,
            "working" => TaskState::Working,
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "canceled" => TaskState::Canceled,
            "input-required" => TaskState::InputRequired,
            "rejected" => TaskState::Rejected,
            "auth-required" => TaskState::AuthRequired,
            _ => TaskState::Other(s.to_owned()),
        }
    }

    /// Whether the task is over, or waits for the client (which, for
    /// Switchyard, ends the invocation too).
    pub fn ends_the_call(&self) -> bool {
        !matches!(self, TaskState::Submitted | TaskState::Working)
    }
}

/// One thing the agent said about the task.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// The task's state, with the text of the status message, if any.
    Status {
        /// The task's id.
        task_id: String,
        /// Its state.
        state: TaskState,
        /// The status message's text parts, joined.
        text: String,
    },
    /// An artifact (or a chunk of one).
    Artifact {
        /// Its name.
        name: String,
        /// Its text parts, joined.
        text: String,
        /// Its data parts.
        data: Vec<Value>,
    },
    /// A direct answer without a task.
    Message {
        /// Its text parts, joined.
        text: String,
    },
}

/// A stream of updates.
pub type Updates = Pin<Box<dyn Stream<Item = Result<Update, A2aError>> + Send>>;

/// A client of one agent's JSON-RPC endpoint.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    version: String,
    tenant: String,
}

impl Client {
    /// A client of the endpoint at `url`, speaking protocol `version`.
    pub fn new(http: reqwest::Client, url: &str, version: &str) -> Client {
        Client {
            http,
            url: url.to_owned(),
            version: version.to_owned(),
            tenant: String::new(),
        }
    }

    /// The same client naming `tenant` (the card interface's) in every
    /// request's `params.tenant`; empty: none.
    pub fn with_tenant(mut self, tenant: &str) -> Client {
        self.tenant = tenant.to_owned();
        self
    }

    fn request(&self, method: &str, mut params: Value) -> reqwest::RequestBuilder {
        if let (false, Some(p)) = (self.tenant.is_empty(), params.as_object_mut()) {
            p.insert("tenant".into(), Value::String(self.tenant.clone()));
        }
        let body = json!({"jsonrpc": "2.0", "id": uuid::Uuid::new_v4().to_string(), "method": method, "params": params});
        self.http
            .post(&self.url)
            .header("A2A-Version", &self.version)
            .json(&body)
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> A2aError {
        A2aError::Unreachable(format!("A2A agent at {}: {e}", self.url))
    }

    /// Whether the agent speaks A2A 0.3.
    fn legacy(&self) -> bool {
        self.version.starts_with("0.")
    }

    /// Sends `message` (an A2A 1.0 `Message`); with `stream`, over
    /// `SendStreamingMessage`, else `SendMessage` (its one answer read as
    /// updates too).
    pub async fn send(&self, message: Value, stream: bool) -> Result<Updates, A2aError> {
        let (method, message) = match (self.legacy(), stream) {
            (false, true) => ("SendStreamingMessage", message),
            (false, false) => ("SendMessage", message),
            (true, true) => ("message/stream", crate::v03::message(&message)),
            (true, false) => ("message/send", crate::v03::message(&message)),
        };
        let mut req = self.request(method, json!({"message": message}));
        if stream {
            req = req.header("accept", "text/event-stream");
        }
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        if !resp.status().is_success() {
            return Err(self.unreachable(format!("HTTP {}", resp.status())));
        }
        let is_sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            let body: Value = resp.json().await.map_err(|e| self.unreachable(e))?;
            let updates = result_of(body).map(|r| updates_of(&r));
            let items: Vec<Result<Update, A2aError>> = match updates {
                Ok(u) => u.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            return Ok(Box::pin(futures_util::stream::iter(items)));
        }
        let url = self.url.clone();
        let mut bytes = resp.bytes_stream();
        let s = async_stream(move |tx| async move {
            let mut buf = Vec::new();
            while let Some(chunk) = bytes.next().await {
                let chunk = match chunk {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx
                            .send(Err(A2aError::Unreachable(format!(
                                "A2A agent at {url}: the stream broke: {e}"
                            ))))
                            .await;
                        return;
                    }
                };
                buf.extend_from_slice(&chunk);
                while let Some((_, data)) = switchyard_kit::sse::next_event(&mut buf) {
                    let parsed = serde_json::from_str::<Value>(&data)
                        .map_err(|e| A2aError::Protocol(format!("an event is not JSON: {e}")))
                        .and_then(result_of);
                    match parsed {
                        Ok(r) => {
                            for u in updates_of(&r) {
                                if tx.send(Ok(u)).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                }
            }
        });
        Ok(s)
    }

    /// Asks the agent to cancel task `task_id`, within `timeout`.
    pub async fn cancel(&self, task_id: &str, timeout: Duration) -> Result<(), A2aError> {
        let method = if self.legacy() {
            "tasks/cancel"
        } else {
            "CancelTask"
        };
        let resp = self
            .request(method, json!({"id": task_id}))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let body: Value = resp.json().await.map_err(|e| self.unreachable(e))?;
        result_of(body).map(drop)
    }
}

/// A stream fed by a task that sends into a channel.
fn async_stream<F, Fut>(f: F) -> Updates
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Update, A2aError>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(32);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A JSON-RPC response's `result`, or its error.
fn result_of(body: Value) -> Result<Value, A2aError> {
    if let Some(e) = body.get("error") {
        return Err(A2aError::Rpc {
            code: e["code"].as_i64().unwrap_or(0),
            message: e["message"].as_str().unwrap_or("no message").to_owned(),
        });
    }
    body.get("result")
        .cloned()
        .ok_or_else(|| A2aError::Protocol("a JSON-RPC answer without result or error".into()))
}

/// The text parts of `parts`, joined with newlines.
fn text_of(parts: &Value) -> String {
    parts
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn status(task_id: &str, s: &Value) -> Update {
    Update::Status {
        task_id: task_id.to_owned(),
        state: TaskState::parse(s["state"].as_str().unwrap_or_default()),
        text: text_of(&s["message"]["parts"]),
    }
}

fn artifact(a: &Value) -> Update {
    Update::Artifact {
        name: a["name"].as_str().unwrap_or_default().to_owned(),
        text: text_of(&a["parts"]),
        data: a["parts"]
            .as_array()
            .map(|ps| ps.iter().filter_map(|p| p.get("data").cloned()).collect())
            .unwrap_or_default(),
    }
}

/// The updates in one result: a `task` (its artifacts, then its status), a
/// `statusUpdate`, an `artifactUpdate` or a `message` — or, from an A2A 0.3
/// agent, the same objects bare, told apart by their `kind`.
fn updates_of(r: &Value) -> Vec<Update> {
    let wrapped;
    let r = match r.get("kind").and_then(Value::as_str) {
        Some(kind @ ("task" | "status-update" | "artifact-update" | "message")) => {
            let key = match kind {
                "status-update" => "statusUpdate",
                "artifact-update" => "artifactUpdate",
                other => other,
            };
            wrapped = json!({ key: r });
            &wrapped
        }
        _ => r,
    };
    if let Some(t) = r.get("task") {
        let id = t["id"].as_str().unwrap_or_default();
        let mut out: Vec<Update> = t["artifacts"]
            .as_array()
            .map(|a| a.iter().map(artifact).collect())
            .unwrap_or_default();
        out.push(status(id, &t["status"]));
        return out;
    }
    if let Some(s) = r.get("statusUpdate") {
        return vec![status(
            s["taskId"].as_str().unwrap_or_default(),
            &s["status"],
        )];
    }
    if let Some(a) = r.get("artifactUpdate") {
        return vec![artifact(&a["artifact"])];
    }
    if let Some(m) = r.get("message") {
        return vec![Update::Message {
            text: text_of(&m["parts"]),
        }];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_in_both_protocol_versions() {
        assert_eq!(
            TaskState::parse("TASK_STATE_INPUT_REQUIRED"),
            TaskState::InputRequired
        );
        assert_eq!(TaskState::parse("input-required"), TaskState::InputRequired);
        assert_eq!(TaskState::parse("TASK_STATE_CANCELED"), TaskState::Canceled);
        assert!(TaskState::parse("TASK_STATE_REJECTED").ends_the_call());
        assert!(!TaskState::parse("TASK_STATE_WORKING").ends_the_call());
        assert_eq!(
            TaskState::parse("paused"),
            TaskState::Other("paused".into())
        );
    }

    #[test]
    fn a_0_3_agent_is_sent_0_3_messages_and_its_bare_kind_tagged_results_read() {
        let m = json!({"messageId": "m1", "taskId": "t1", "role": "ROLE_USER",
            "parts": [{"text": "shout: hi"}, {"data": {"n": 1}}]});
        assert_eq!(
            crate::v03::message(&m),
            json!({"kind": "message", "messageId": "m1", "taskId": "t1", "role": "user",
                "parts": [{"kind": "text", "text": "shout: hi"}, {"kind": "data", "data": {"n": 1}}]})
        );
        let task = json!({"kind": "task", "id": "t1", "status": {"state": "completed",
            "message": {"kind": "message", "parts": [{"kind": "text", "text": "HI"}]}}});
        assert_eq!(
            updates_of(&task),
            [Update::Status {
                task_id: "t1".into(),
                state: TaskState::Completed,
                text: "HI".into()
            }]
        );
        let update =
            json!({"kind": "status-update", "taskId": "t1", "status": {"state": "working"}});
        assert_eq!(
            updates_of(&update),
            [Update::Status {
                task_id: "t1".into(),
                state: TaskState::Working,
                text: String::new()
            }]
        );
        let art = json!({"kind": "artifact-update", "taskId": "t1",
            "artifact": {"name": "out", "parts": [{"kind": "text", "text": "a"}]}});
        assert!(matches!(&updates_of(&art)[..], [Update::Artifact { name, .. }] if name == "out"));
    }

    #[test]
    fn results_become_updates_and_errors_keep_their_code() {
        let task = json!({"task": {"id": "t1", "status": {"state": "TASK_STATE_COMPLETED",
            "message": {"parts": [{"text": "HELLO"}]}},
            "artifacts": [{"name": "out", "parts": [{"text": "a"}, {"data": {"n": 1}}]}]}});
        assert_eq!(
            updates_of(&task),
            [
                Update::Artifact {
                    name: "out".into(),
                    text: "a".into(),
                    data: vec![json!({"n": 1})]
                },
                Update::Status {
                    task_id: "t1".into(),
                    state: TaskState::Completed,
                    text: "HELLO".into()
                },
            ]
        );
        let err = result_of(json!({"error": {"code": -32009, "message": "version"}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the A2A agent answered error -32009: version"
        );
    }
}
