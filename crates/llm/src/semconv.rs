//! Model calls as the OpenTelemetry GenAI semantic conventions name them:
//! a client span `chat {model}` with `gen_ai.*` attributes, and the
//! `gen_ai.client.token.usage` / `gen_ai.client.operation.duration`
//! metrics. Messages go on the span (`gen_ai.input.messages`,
//! `gen_ai.output.messages`) only when telemetry is told to capture them.

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_kit::metrics::{GenAiCallLabels, GenAiTokenLabels};
use switchyard_kit::telemetry::int;
use tracing::field::Empty;

use crate::config::ProviderKind;
use crate::{ChatRequest, ChatResponse, Message, ProviderError, Role, ToolCall};

/// `gen_ai.provider.name` of a provider speaking `kind`'s wire.
pub(crate) fn provider_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Openai => "openai",
        ProviderKind::Anthropic => "anthropic",
    }
}

/// The span of one model call: `chat {model}` (kind client), child of
/// whatever made the call (the task's span).
pub(crate) fn chat_span(
    model: &str,
    provider: &str,
    wire: &str,
    round: u32,
    req: &ChatRequest,
) -> tracing::Span {
    let span = tracing::info_span!(
        "chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = wire,
        gen_ai.request.model = %model,
        gen_ai.request.max_tokens = req.max_tokens.map(int),
        gen_ai.request.temperature = req.temperature,
        gen_ai.response.model = Empty,
        gen_ai.response.finish_reasons = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
        error.type = Empty,
        switchyard.llm.provider = %provider,
        switchyard.llm.round = i64::from(round),
    );
    if switchyard_kit::telemetry::capture_message_content() {
        span.record(
            "gen_ai.input.messages",
            input_messages(&req.messages).to_string(),
        );
    }
    span
}

/// Records an answer on its call's span and in the GenAI metrics.
pub(crate) fn answered(
    span: &tracing::Span,
    wire: &str,
    model: &str,
    resp: &ChatResponse,
    took: Duration,
) {
    let response_model = if resp.model.is_empty() {
        model
    } else {
        &resp.model
    };
    span.record("gen_ai.response.model", response_model);
    if !resp.finish_reason.is_empty() {
        span.record(
            "gen_ai.response.finish_reasons",
            resp.finish_reason.as_str(),
        );
    }
    span.record("gen_ai.usage.input_tokens", int(resp.usage.prompt_tokens));
    span.record(
        "gen_ai.usage.output_tokens",
        int(resp.usage.completion_tokens),
    );
    if switchyard_kit::telemetry::capture_message_content() {
        span.record("gen_ai.output.messages", output_messages(resp).to_string());
    }
    let m = switchyard_kit::metrics::global();
    for (kind, n) in [
        ("input", resp.usage.prompt_tokens),
        ("output", resp.usage.completion_tokens),
    ] {
        let labels = GenAiTokenLabels {
            gen_ai_operation_name: "chat".into(),
            gen_ai_provider_name: wire.into(),
            gen_ai_request_model: model.into(),
            gen_ai_token_type: kind.into(),
        };
        m.gen_ai_token_usage
            .get_or_create(&labels)
            .observe(n as f64);
    }
    m.gen_ai_operation_duration
        .get_or_create(&call(wire, model, None))
        .observe(took.as_secs_f64());
}

/// Records a failed call on its span and in the duration metric.
pub(crate) fn failed(
    span: &tracing::Span,
    wire: &str,
    model: &str,
    e: &ProviderError,
    took: Duration,
) {
    span.record("error.type", e.kind());
    span.record("otel.status_code", "ERROR");
    switchyard_kit::metrics::global()
        .gen_ai_operation_duration
        .get_or_create(&call(wire, model, Some(e.kind())))
        .observe(took.as_secs_f64());
}

fn call(wire: &str, model: &str, error: Option<&str>) -> GenAiCallLabels {
    GenAiCallLabels {
        gen_ai_operation_name: "chat".into(),
        gen_ai_provider_name: wire.into(),
        gen_ai_request_model: model.into(),
        error_type: error.map(str::to_owned),
    }
}

fn role(r: Role) -> &'static str {
    match r {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn tool_call_parts(calls: &[ToolCall]) -> impl Iterator<Item = Value> + '_ {
    calls.iter().map(|c| {
        let arguments = serde_json::from_str::<Value>(&c.arguments)
            .unwrap_or(Value::String(c.arguments.clone()));
        json!({"type": "tool_call", "id": c.id, "name": c.name, "arguments": arguments})
    })
}

/// `gen_ai.input.messages`: the conversation in the conventions' shape
/// (role, parts of text, tool calls and tool results).
fn input_messages(messages: &[Message]) -> Value {
    Value::Array(
        messages
            .iter()
            .map(|m| {
                let mut parts: Vec<Value> = Vec::new();
                if m.role == Role::Tool {
                    parts.push(json!({"type": "tool_call_response", "id": m.tool_call_id, "response": m.content}));
                } else if !m.content.is_empty() {
                    parts.push(json!({"type": "text", "content": m.content}));
                }
                parts.extend(tool_call_parts(&m.tool_calls));
                json!({"role": role(m.role), "parts": parts})
            })
            .collect(),
    )
}

/// `gen_ai.output.messages`: the answer, with why it ended.
fn output_messages(resp: &ChatResponse) -> Value {
    let mut parts: Vec<Value> = Vec::new();
    if !resp.content.is_empty() {
        parts.push(json!({"type": "text", "content": resp.content}));
    }
    parts.extend(tool_call_parts(&resp.tool_calls));
    json!([{"role": "assistant", "parts": parts, "finish_reason": resp.finish_reason}])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_take_the_conventions_shape() {
        let messages = vec![
            Message::text(Role::System, "be brief"),
            Message {
                role: Role::Assistant,
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "weather".into(),
                    arguments: r#"{"city":"Oslo"}"#.into(),
                }],
                ..Default::default()
            },
            Message {
                role: Role::Tool,
                content: "sunny".into(),
                tool_call_id: "c1".into(),
                ..Default::default()
            },
        ];
        assert_eq!(
            input_messages(&messages),
            json!([
                {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "weather", "arguments": {"city": "Oslo"}}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny"}]},
            ])
        );
        let resp = ChatResponse {
            content: "It is sunny.".into(),
            finish_reason: "stop".into(),
            ..Default::default()
        };
        assert_eq!(
            output_messages(&resp),
            json!([{"role": "assistant", "parts": [{"type": "text", "content": "It is sunny."}], "finish_reason": "stop"}])
        );
    }
}
