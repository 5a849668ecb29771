//! Anthropic's native Messages API (`POST {base_url}/messages`): the key
//! goes in `x-api-key`, system prompts are a top-level field, tool calls
//! and results are content blocks, and 529 ("overloaded") counts as
//! unavailable, so the chain falls back as it does on 503.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::ProviderConfig;
use crate::http::{Auth, Endpoint};
use crate::{ChatRequest, ChatResponse, Role, ToolCall, ToolChoice, Usage};

/// The API version this client speaks.
pub const API_VERSION: &str = "2023-06-01";

/// `max_tokens` is required by the API; the agent loop always sets it,
/// direct callers that do not get this.
const DEFAULT_MAX_TOKENS: u64 = 4096;

/// A provider speaking Anthropic's Messages API.
#[derive(Debug)]
pub struct Anthropic {
    pub(crate) endpoint: Endpoint,
}

impl Anthropic {
    /// A client for one configured provider.
    pub fn new(cfg: &ProviderConfig) -> Result<Anthropic, String> {
        Ok(Anthropic {
            endpoint: Endpoint::new(
                cfg,
                "messages",
                Auth::ApiKeyHeader,
                vec![("anthropic-version", API_VERSION)],
            )?,
        })
    }

    /// The request body. System messages become `system`; an assistant's
    /// tool calls become `tool_use` blocks and tool results `tool_result`
    /// blocks of one user turn, so user and assistant turns alternate.
    pub fn body(&self, model: &str, req: &ChatRequest) -> Value {
        let mut system = Vec::new();
        let mut turns: Vec<(Role, Vec<Value>)> = Vec::new();
        for m in &req.messages {
            let (role, blocks) = match m.role {
                Role::System => {
                    system.push(m.content.as_str());
                    continue;
                }
                Role::User => (Role::User, vec![text_block(&m.content)]),
                Role::Tool => (
                    Role::User,
                    vec![
                        json!({"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}),
                    ],
                ),
                Role::Assistant => {
                    let mut blocks = Vec::new();
                    if !m.content.is_empty() {
                        blocks.push(text_block(&m.content));
                    }
                    for c in &m.tool_calls {
                        // The API wants an object; arguments that were not
                        // one were refused to the model already.
                        let input = serde_json::from_str::<Value>(&c.arguments)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| json!({}));
                        blocks.push(
                            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}),
                        );
                    }
                    (Role::Assistant, blocks)
                }
            };
            match turns.last_mut() {
                Some((last, b)) if *last == role => b.extend(blocks),
                _ => turns.push((role, blocks)),
            }
        }
        let messages: Vec<Value> = turns
            .into_iter()
            .map(|(role, content)| json!({"role": role.as_str(), "content": content}))
            .collect();
        let mut body = json!({
            "model": model,
            "max_tokens": req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            "messages": messages,
        });
        if !system.is_empty() {
            body["system"] = json!(system.join("\n\n"));
        }
        // As with OpenAI: `none` offers no tools at all.
        if !req.tools.is_empty() && req.tool_choice != ToolChoice::None {
            body["tools"] = req
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect();
            body["tool_choice"] = json!({"type": match req.tool_choice {
                ToolChoice::Required => "any",
                _ => "auto",
            }});
        }
        if let Some(t) = req.temperature {
            body["temperature"] = json!(t);
        }
        body
    }
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    model: String,
    content: Vec<WireBlock>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
}

/// Parses a Messages response body. Stop reasons are given in OpenAI's
/// words (`tool_calls`, `stop`, `length`) like every provider's; cached
/// prompt tokens count as prompt tokens, which can only over-charge.
pub fn parse_response(text: &str) -> Result<ChatResponse, String> {
    let wire: Wire = serde_json::from_str(text)
        .map_err(|e| format!("the provider's answer is not a Messages response: {e}"))?;
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for b in wire.content {
        match b {
            WireBlock::Text { text } => content.push_str(&text),
            WireBlock::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                id,
                name,
                arguments: input.to_string(),
            }),
            WireBlock::Other => {}
        }
    }
    let finish_reason = match wire.stop_reason.as_deref() {
        Some("tool_use") => "tool_calls",
        Some("max_tokens") => "length",
        Some(_) => "stop",
        None => "",
    };
    let u = wire.usage;
    let prompt_tokens = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
    Ok(ChatResponse {
        model: wire.model,
        content,
        tool_calls,
        finish_reason: finish_reason.into(),
        usage: Usage {
            prompt_tokens,
            completion_tokens: u.output_tokens,
            total_tokens: prompt_tokens + u.output_tokens,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, ToolSpec};

    fn client() -> Anthropic {
        Anthropic::new(&ProviderConfig {
            name: "anthropic".into(),
            kind: crate::ProviderKind::Anthropic,
            base_url: "https://api.anthropic.com/v1/".into(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn a_tool_conversation_becomes_alternating_turns_of_blocks() {
        let req = ChatRequest {
            messages: vec![
                Message::text(Role::System, "Be brief."),
                Message::text(Role::User, "Weather in Oslo and Rome?"),
                Message {
                    role: Role::Assistant,
                    content: "Looking.".into(),
                    tool_calls: vec![
                        ToolCall {
                            id: "t1".into(),
                            name: "weather".into(),
                            arguments: r#"{"city":"Oslo"}"#.into(),
                        },
                        ToolCall {
                            id: "t2".into(),
                            name: "weather".into(),
                            arguments: "not json".into(),
                        },
                    ],
                    ..Default::default()
                },
                Message {
                    role: Role::Tool,
                    content: "-3C".into(),
                    tool_call_id: "t1".into(),
                    ..Default::default()
                },
                Message {
                    role: Role::Tool,
                    content: "14C".into(),
                    tool_call_id: "t2".into(),
                    ..Default::default()
                },
            ],
            tools: vec![ToolSpec {
                name: "weather".into(),
                description: "Weather now".into(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::Required,
            temperature: Some(0.2),
            max_tokens: Some(300),
            json: true,
        };
        let c = client();
        assert_eq!(c.endpoint.url, "https://api.anthropic.com/v1/messages");
        let b = c.body("claude-sonnet-4", &req);
        assert_eq!(b["system"], "Be brief.");
        assert_eq!(b["max_tokens"], 300);
        assert_eq!(b["temperature"], 0.2);
        assert_eq!(b["tool_choice"], json!({"type": "any"}));
        assert_eq!(b["tools"][0]["input_schema"], json!({"type": "object"}));
        assert!(
            b.get("response_format").is_none(),
            "no JSON mode on this wire"
        );
        let m = b["messages"].as_array().unwrap();
        let roles: Vec<&str> = m.iter().map(|t| t["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(
            m[1]["content"][0],
            json!({"type": "text", "text": "Looking."})
        );
        assert_eq!(m[1]["content"][1]["input"], json!({"city": "Oslo"}));
        assert_eq!(m[1]["content"][2]["input"], json!({}));
        assert_eq!(m[2]["content"][0]["tool_use_id"], "t1");
        assert_eq!(m[2]["content"][1]["content"], "14C");
    }

    #[test]
    fn tool_choice_none_offers_no_tools_and_max_tokens_is_always_sent() {
        let req = ChatRequest {
            messages: vec![Message::text(Role::User, "hi")],
            tools: vec![ToolSpec {
                name: "t".into(),
                description: String::new(),
                parameters: json!({}),
            }],
            tool_choice: ToolChoice::None,
            ..Default::default()
        };
        let b = client().body("m", &req);
        assert!(b.get("tools").is_none() && b.get("tool_choice").is_none());
        assert!(b.get("system").is_none());
        assert_eq!(b["max_tokens"], DEFAULT_MAX_TOKENS);
    }

    #[test]
    fn responses_parse_text_tool_use_stop_reason_and_usage() {
        let r = parse_response(
            r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4",
                "content":[{"type":"thinking","thinking":"..."},{"type":"text","text":"Checking. "},
                           {"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Oslo"}}],
                "stop_reason":"tool_use",
                "usage":{"input_tokens":20,"output_tokens":7,"cache_read_input_tokens":100}}"#,
        )
        .unwrap();
        assert_eq!(r.content, "Checking. ");
        assert_eq!(r.finish_reason, "tool_calls");
        assert_eq!(r.tool_calls[0].id, "toolu_1");
        assert_eq!(r.tool_calls[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(
            (
                r.usage.prompt_tokens,
                r.usage.completion_tokens,
                r.usage.total_tokens
            ),
            (120, 7, 127)
        );
        let end = parse_response(
            r#"{"content":[{"type":"text","text":"done"}],"stop_reason":"max_tokens"}"#,
        )
        .unwrap();
        assert_eq!(
            (end.content.as_str(), end.finish_reason.as_str()),
            ("done", "length")
        );
        assert!(
            parse_response(r#"{"choices":[]}"#).is_err(),
            "an OpenAI body is not a Messages body"
        );
        assert!(parse_response("{oops").is_err());
    }
}
