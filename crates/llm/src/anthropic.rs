//! Anthropic's native Messages API (`POST {base_url}/messages`): the key
//! goes in `x-api-key`, system prompts are a top-level field, tool calls
//! and results are content blocks, and 529 ("overloaded") counts as
//! unavailable, so the chain falls back as it does on 503.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{ProviderConfig, StructuredOutput};
use crate::http::{Auth, Endpoint, Streamed as ReadStream};
use crate::{
    ChatRequest, ChatResponse, Delta, OutputFormat, ProviderError, Role, ToolCall, ToolChoice,
    ToolDelta, Usage,
};

/// The API version this client speaks.
pub const API_VERSION: &str = "2023-06-01";

/// `max_tokens` is required by the API; the agent loop always sets it,
/// direct callers that do not get this.
const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The tool that carries a structured answer (`structured_output =
/// "tool"`): forced, with the task's schema as its `input_schema`; its
/// input is the answer.
pub const ANSWER_TOOL: &str = "switchyard_answer";

/// A provider speaking Anthropic's Messages API.
#[derive(Debug)]
pub struct Anthropic {
    pub(crate) endpoint: Endpoint,
    structured: StructuredOutput,
    pub(crate) stream: bool,
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
            structured: cfg.structured_output(),
            stream: cfg.stream,
        })
    }

    /// The request body. System messages become `system`; an assistant's
    /// tool calls become `tool_use` blocks and tool results `tool_result`
    /// blocks of one user turn, so user and assistant turns alternate. A
    /// structured answer is a forced call of [`ANSWER_TOOL`].
    pub fn body(&self, model: &str, req: &ChatRequest, stream: bool) -> Value {
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
        let schema = match &req.format {
            OutputFormat::Text => None,
            OutputFormat::Json => Some(json!({"type": "object"})),
            OutputFormat::Schema(s) => Some(s.clone()),
        };
        if let (Some(schema), StructuredOutput::Tool) = (schema, self.structured)
            && body.get("tools").is_none()
        {
            body["tools"] = json!([{
                "name": ANSWER_TOOL,
                "description": "Give the answer, in the shape of this tool's input schema.",
                "input_schema": schema,
            }]);
            body["tool_choice"] = json!({"type": "tool", "name": ANSWER_TOOL});
        }
        if let Some(t) = req.temperature {
            body["temperature"] = json!(t);
        }
        if stream {
            body["stream"] = json!(true);
        }
        body
    }
}

/// The answer in OpenAI's words: the [`ANSWER_TOOL`] call's input becomes
/// the text, stop reasons become `tool_calls`, `stop` or `length`.
fn answer(
    model: String,
    mut content: String,
    mut tool_calls: Vec<ToolCall>,
    stop_reason: Option<&str>,
    usage: Usage,
) -> ChatResponse {
    if let Some(i) = tool_calls.iter().position(|c| c.name == ANSWER_TOOL) {
        content = tool_calls.remove(i).arguments;
    }
    let finish_reason = match stop_reason {
        Some("max_tokens") => "length",
        Some("tool_use") if !tool_calls.is_empty() => "tool_calls",
        Some(_) => "stop",
        None => "",
    };
    ChatResponse {
        model,
        content,
        tool_calls,
        finish_reason: finish_reason.into(),
        usage,
        usage_reported: true,
        provider_wait: None,
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
    let u = wire.usage;
    let prompt_tokens = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
    let usage = Usage {
        prompt_tokens,
        completion_tokens: u.output_tokens,
        total_tokens: prompt_tokens + u.output_tokens,
    };
    Ok(answer(
        wire.model,
        content,
        tool_calls,
        wire.stop_reason.as_deref(),
        usage,
    ))
}

/// Reads Anthropic's message stream: `message_start` (model, prompt
/// usage), `content_block_start`/`_delta` (text, and tool input as
/// partial JSON), `message_delta` (stop reason, output tokens) and
/// `message_stop`; an `error` event ends it.
#[derive(Debug, Default)]
pub struct Streamed {
    model: String,
    text: String,
    /// Content blocks by index: tool calls with their input so far.
    blocks: Vec<(u32, ToolCall)>,
    stop_reason: Option<String>,
    prompt_tokens: u64,
    output_tokens: u64,
    started: bool,
}

impl ReadStream for Streamed {
    fn event(&mut self, name: &str, data: &str, out: &mut Delta) -> Result<bool, ProviderError> {
        let v: Value = serde_json::from_str(data)
            .map_err(|e| ProviderError::Malformed(format!("a streamed event is not JSON: {e}")))?;
        let kind = if name.is_empty() {
            v.get("type").and_then(Value::as_str).unwrap_or_default()
        } else {
            name
        };
        let num = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
        let text = |p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match kind {
            "message_start" => {
                self.started = true;
                self.model = text("/message/model");
                self.prompt_tokens = num("/message/usage/input_tokens")
                    + num("/message/usage/cache_creation_input_tokens")
                    + num("/message/usage/cache_read_input_tokens");
                self.output_tokens = num("/message/usage/output_tokens");
            }
            "content_block_start" if text("/content_block/type") == "tool_use" => {
                let call = ToolCall {
                    id: text("/content_block/id"),
                    name: text("/content_block/name"),
                    arguments: String::new(),
                };
                if call.name != ANSWER_TOOL {
                    out.tool_calls.push(ToolDelta {
                        index: self.tool_index(),
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments: String::new(),
                    });
                }
                self.blocks.push((num("/index") as u32, call));
            }
            "content_block_delta" => {
                let index = num("/index") as u32;
                match text("/delta/type").as_str() {
                    "text_delta" => {
                        let t = text("/delta/text");
                        self.text.push_str(&t);
                        out.text.push_str(&t);
                    }
                    "input_json_delta" => {
                        let piece = text("/delta/partial_json");
                        let at = self.blocks.iter().position(|(i, _)| *i == index);
                        if let Some(at) = at {
                            let call = &mut self.blocks[at].1;
                            call.arguments.push_str(&piece);
                            if call.name == ANSWER_TOOL {
                                out.text.push_str(&piece);
                            } else {
                                out.tool_calls.push(ToolDelta {
                                    index: at as u32,
                                    arguments: piece,
                                    ..Default::default()
                                });
                            }
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(r.to_owned());
                }
                let o = num("/usage/output_tokens");
                self.output_tokens = self.output_tokens.max(o);
            }
            "message_stop" => return Ok(true),
            "error" => {
                let kind = text("/error/type");
                let message = text("/error/message");
                return Err(if kind == "overloaded_error" {
                    ProviderError::Unavailable {
                        status: 529,
                        retry_after: None,
                    }
                } else {
                    ProviderError::Status {
                        status: 200,
                        message: format!("the stream ended in an error: {kind}: {message}"),
                    }
                });
            }
            _ => {}
        }
        Ok(false)
    }

    fn finish(self) -> Result<ChatResponse, String> {
        if !self.started || self.stop_reason.is_none() {
            return Err("the stream ended before the answer did (no stop_reason)".into());
        }
        let usage = Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.output_tokens,
            total_tokens: self.prompt_tokens + self.output_tokens,
        };
        let calls = self
            .blocks
            .into_iter()
            .map(|(_, mut c)| {
                if c.arguments.trim().is_empty() {
                    c.arguments = "{}".into();
                }
                c
            })
            .collect();
        Ok(answer(
            self.model,
            self.text,
            calls,
            self.stop_reason.as_deref(),
            usage,
        ))
    }
}

impl Streamed {
    /// The index the next tool call of the answer gets.
    fn tool_index(&self) -> u32 {
        self.blocks.len() as u32
    }
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
            format: OutputFormat::Json,
        };
        let c = client();
        assert_eq!(c.endpoint.url, "https://api.anthropic.com/v1/messages");
        let b = c.body("claude-sonnet-4", &req, false);
        assert_eq!(b["system"], "Be brief.");
        assert_eq!(b["max_tokens"], 300);
        assert_eq!(b["temperature"], 0.2);
        assert_eq!(b["tool_choice"], json!({"type": "any"}));
        assert_eq!(b["tools"][0]["input_schema"], json!({"type": "object"}));
        assert!(
            b.get("response_format").is_none(),
            "no JSON mode on this wire"
        );
        assert_eq!(
            b["tools"].as_array().unwrap().len(),
            1,
            "the answer tool is forced only when no tools are offered"
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
        let b = client().body("m", &req, false);
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

    #[test]
    fn a_structured_answer_is_a_forced_tool_call_whose_input_is_the_text() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let req = ChatRequest {
            messages: vec![Message::text(Role::User, "count")],
            format: OutputFormat::Schema(schema.clone()),
            ..Default::default()
        };
        let b = client().body("m", &req, false);
        assert_eq!(b["tools"][0]["name"], ANSWER_TOOL);
        assert_eq!(b["tools"][0]["input_schema"], schema);
        assert_eq!(
            b["tool_choice"],
            json!({"type": "tool", "name": ANSWER_TOOL})
        );
        let r = parse_response(&format!(
            r#"{{"content":[{{"type":"tool_use","id":"t","name":"{ANSWER_TOOL}","input":{{"n":3}}}}],"stop_reason":"tool_use","usage":{{"input_tokens":5,"output_tokens":2}}}}"#
        ))
        .unwrap();
        assert_eq!(r.content, r#"{"n":3}"#);
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.finish_reason, "stop");
    }

    #[test]
    fn a_message_stream_assembles_text_tool_input_and_usage() {
        let events = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":25,"output_tokens":1}}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            ),
            ("ping", r#"{"type":"ping"}"#),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me "}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"look."}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_9","name":"lookup","input":{}}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"q\": "}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"x\"}"}}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":30}}"#,
            ),
        ];
        let mut s = Streamed::default();
        let mut seen = Delta::default();
        for (name, data) in events {
            let mut piece = Delta::default();
            assert!(!s.event(name, data, &mut piece).unwrap());
            seen.merge(piece);
        }
        assert!(
            s.event("message_stop", r#"{"type":"message_stop"}"#, &mut seen)
                .unwrap()
        );
        assert_eq!(seen.text, "Let me look.");
        assert_eq!(seen.tool_calls[0].name, "lookup");
        assert_eq!(seen.tool_calls[0].arguments, r#"{"q": "x"}"#);
        let r = s.finish().unwrap();
        assert_eq!(r.tool_calls[0].id, "toolu_9");
        assert_eq!(r.tool_calls[0].arguments, r#"{"q": "x"}"#);
        assert_eq!(r.finish_reason, "tool_calls");
        assert_eq!((r.usage.prompt_tokens, r.usage.completion_tokens), (25, 30));
        let mut s = Streamed::default();
        let err = s
            .event(
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                &mut Delta::default(),
            )
            .unwrap_err();
        assert!(err.falls_back());
    }
}
