//! An A2A agent behind Switchyard's `AgentService` contract, so the
//! executor calls it as it calls any agent — routing, budgets, outcomes,
//! progress events and cancellation unchanged. One invocation is one A2A
//! message; its task's updates become progress and its final state the
//! `AgentResponse`:
//!
//! | A2A state | AgentResponse |
//! |---|---|
//! | completed (or a direct message) | success: the final message's text, else the artifacts' text |
//! | failed, canceled | error, with the agent's message |
//! | rejected | refused (the router may pick another agent) |
//! | input-required, auth-required | error saying so: Switchyard cannot answer an agent's question yet |
//!
//! An invocation whose caller goes away (timeout, cancelled job) cancels
//! the A2A task (`CancelTask`).

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Map, Value, json};
use switchyard_kit::json::{json_to_struct, struct_to_json};
use switchyard_proto::agent::v1::agent_service_server::AgentService;
use switchyard_proto::agent::v1::invoke_response::Message;
use switchyard_proto::agent::v1::*;
use switchyard_proto::registry::v1::A2aBinding;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::client::{Client, TaskState, Update};

/// How long a cancellation may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// One A2A agent, reached at its JSON-RPC endpoint.
#[derive(Debug, Clone)]
pub struct A2aAgent {
    client: Client,
    streaming: bool,
}

impl A2aAgent {
    /// The agent at `endpoint`, as its binding describes it.
    pub fn new(http: reqwest::Client, endpoint: &str, binding: &A2aBinding) -> A2aAgent {
        A2aAgent {
            client: Client::new(http, endpoint, &binding.protocol_version)
                .with_tenant(&binding.tenant),
            streaming: binding.streaming,
        }
    }
}

type Sender = mpsc::Sender<Result<InvokeResponse, Status>>;

/// The A2A message of an invocation: the task's text (`input.task`, else
/// `input.text`, else the task's name) as a text part, and the rest of the
/// input, if any, as a data part.
pub fn message_of(req: &InvokeRequest) -> Value {
    let mut input: Map<String, Value> = match req.input.as_ref().map(struct_to_json) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let text = ["task", "text"].iter().find_map(|k| match input.get(*k) {
        Some(Value::String(s)) if !s.is_empty() => Some((k.to_string(), s.clone())),
        _ => None,
    });
    let text = match text {
        Some((k, s)) => {
            input.remove(&k);
            s
        }
        None => req.task.clone(),
    };
    let mut parts = vec![json!({"text": text})];
    if !input.is_empty() {
        parts.push(json!({"data": Value::Object(input)}));
    }
    json!({"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER", "parts": parts})
}

async fn emit(tx: &Sender, m: Message) -> bool {
    tx.send(Ok(InvokeResponse { message: Some(m) }))
        .await
        .is_ok()
}

fn response(
    status: ResponseStatus,
    content: String,
    error: String,
    output: Option<Value>,
) -> Message {
    Message::Response(AgentResponse {
        status: status as i32,
        content,
        output: output.as_ref().and_then(json_to_struct),
        error,
        ..Default::default()
    })
}

/// What the invocation ends with, once the task reached `state`.
fn settle(
    state: &TaskState,
    text: String,
    artifacts: &[(String, String, Vec<Value>)],
    task_id: &str,
) -> Message {
    let said = |what: &str| {
        if text.is_empty() {
            what.to_owned()
        } else {
            format!("{what}: {text}")
        }
    };
    match state {
        TaskState::Completed => {
            let joined: Vec<&str> = artifacts
                .iter()
                .map(|a| a.1.as_str())
                .filter(|t| !t.is_empty())
                .collect();
            let content = if text.is_empty() {
                joined.join("\n")
            } else {
                text.clone()
            };
            let mut output = json!({"text": content, "a2a_task_id": task_id,
                "artifacts": artifacts.iter().map(|(n, t, d)| json!({"name": n, "text": t, "data": d})).collect::<Vec<_>>()});
            // An artifact's object data is the task's structured output.
            for d in artifacts.iter().flat_map(|a| a.2.iter()) {
                if let (Some(o), Some(fields)) = (output.as_object_mut(), d.as_object()) {
                    for (k, v) in fields {
                        o.entry(k.clone()).or_insert(v.clone());
                    }
                }
            }
            response(
                ResponseStatus::Success,
                content,
                String::new(),
                Some(output),
            )
        }
        TaskState::Rejected => response(
            ResponseStatus::Refused,
            String::new(),
            said("the A2A agent rejected the task"),
            None,
        ),
        TaskState::Failed => response(
            ResponseStatus::Error,
            String::new(),
            said("the A2A agent failed the task"),
            None,
        ),
        TaskState::Canceled => response(
            ResponseStatus::Error,
            String::new(),
            said("the A2A agent cancelled the task"),
            None,
        ),
        TaskState::InputRequired => response(
            ResponseStatus::Error,
            String::new(),
            format!(
                "{} (input-required); Switchyard cannot answer an agent's question yet (handoff mode): give the task everything it needs up front",
                said("the A2A agent asked for more input")
            ),
            None,
        ),
        TaskState::AuthRequired => response(
            ResponseStatus::Error,
            String::new(),
            said(
                "the A2A agent asked for authentication (auth-required), which Switchyard cannot give it",
            ),
            None,
        ),
        TaskState::Submitted | TaskState::Working | TaskState::Other(_) => response(
            ResponseStatus::Error,
            String::new(),
            format!("the A2A agent ended its stream with the task in state {state:?}"),
            None,
        ),
    }
}

impl A2aAgent {
    /// Runs one invocation, sending progress and the response to `tx`;
    /// cancels the A2A task when `tx`'s receiver goes away first.
    async fn run(self, req: InvokeRequest, tx: Sender) {
        let mut updates = match self.client.send(message_of(&req), self.streaming).await {
            Ok(u) => u,
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return;
            }
        };
        let mut task_id = String::new();
        let mut artifacts: Vec<(String, String, Vec<Value>)> = Vec::new();
        loop {
            let next = tokio::select! {
                n = updates.next() => n,
                () = tx.closed() => {
                    if !task_id.is_empty() {
                        let cancelled = self.client.cancel(&task_id, CANCEL_TIMEOUT).await;
                        tracing::info!(task_id, ok = cancelled.is_ok(), "cancelled an A2A task its caller left");
                    }
                    return;
                }
            };
            let m = match next {
                None => response(
                    ResponseStatus::Error,
                    String::new(),
                    "the A2A agent ended its stream without finishing the task".into(),
                    None,
                ),
                Some(Err(e)) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
                Some(Ok(Update::Message { text })) => response(
                    ResponseStatus::Success,
                    text.clone(),
                    String::new(),
                    Some(json!({"text": text})),
                ),
                Some(Ok(Update::Artifact { name, text, data })) => {
                    let chunk = text.clone();
                    artifacts.push((name, text, data));
                    let progress = Progress {
                        output_chunk: chunk,
                        ..Default::default()
                    };
                    if !emit(&tx, Message::Progress(progress)).await {
                        continue;
                    }
                    continue;
                }
                Some(Ok(Update::Status {
                    task_id: id,
                    state,
                    text,
                })) => {
                    task_id = id;
                    if !state.ends_the_call() {
                        if !text.is_empty() {
                            let progress = Progress {
                                message: text,
                                ..Default::default()
                            };
                            emit(&tx, Message::Progress(progress)).await;
                        }
                        continue;
                    }
                    settle(&state, text, &artifacts, &task_id)
                }
            };
            emit(&tx, m).await;
            return;
        }
    }
}

#[tonic::async_trait]
impl AgentService for A2aAgent {
    async fn describe(
        &self,
        _req: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(DescribeResponse {
            name: "a2a".into(),
            description: "an A2A agent".into(),
            ..Default::default()
        }))
    }

    type InvokeStream = ReceiverStream<Result<InvokeResponse, Status>>;

    async fn invoke(
        &self,
        req: Request<InvokeRequest>,
    ) -> Result<Response<Self::InvokeStream>, Status> {
        let (tx, rx) = mpsc::channel(32);
        tokio::spawn(self.clone().run(req.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_carries_the_task_text_and_the_rest_of_the_input_as_data() {
        let req = InvokeRequest {
            task: "Shout".into(),
            input: json_to_struct(&json!({"task": "shout: hi", "lang": "en"})),
            ..Default::default()
        };
        let m = message_of(&req);
        assert_eq!(m["role"], "ROLE_USER");
        assert_eq!(m["parts"][0]["text"], "shout: hi");
        assert_eq!(m["parts"][1]["data"], json!({"lang": "en"}));
        let bare = InvokeRequest {
            task: "Shout".into(),
            ..Default::default()
        };
        assert_eq!(message_of(&bare)["parts"], json!([{"text": "Shout"}]));
    }

    #[test]
    fn every_final_state_maps_to_the_agent_response_the_table_says() {
        let arts = vec![("out".to_owned(), "HI".to_owned(), vec![json!({"n": 2})])];
        let status = |m: Message| match m {
            Message::Response(r) => (
                ResponseStatus::try_from(r.status).unwrap(),
                r.content,
                r.error,
                r.output,
            ),
            Message::Progress(_) => panic!("not a response"),
        };
        let (s, content, _, out) = status(settle(&TaskState::Completed, String::new(), &arts, "t"));
        assert_eq!((s, content.as_str()), (ResponseStatus::Success, "HI"));
        assert_eq!(struct_to_json(&out.unwrap())["n"], 2);
        for (state, want, says) in [
            (TaskState::Failed, ResponseStatus::Error, "failed"),
            (TaskState::Canceled, ResponseStatus::Error, "cancelled"),
            (TaskState::Rejected, ResponseStatus::Refused, "rejected"),
            (
                TaskState::InputRequired,
                ResponseStatus::Error,
                "input-required",
            ),
            (
                TaskState::AuthRequired,
                ResponseStatus::Error,
                "auth-required",
            ),
            (TaskState::Working, ResponseStatus::Error, "Working"),
        ] {
            let (s, _, error, _) = status(settle(&state, "why".into(), &[], "t"));
            assert_eq!(s, want, "{state:?}");
            assert!(error.contains(says), "{state:?}: {error}");
        }
    }
}
