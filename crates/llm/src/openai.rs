//! The OpenAI-compatible chat-completions client.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{ProviderConfig, StructuredOutput};
use crate::http::{Auth, Endpoint, Streamed as ReadStream};
use crate::{
    ChatRequest, ChatResponse, Delta, OutputFormat, ProviderError, Role, ToolCall, ToolChoice,
    ToolDelta, Usage,
};

/// A provider speaking `POST {base_url}/chat/completions`.
#[derive(Debug)]
pub struct OpenAi {
    pub(crate) endpoint: Endpoint,
    structured: StructuredOutput,
    pub(crate) stream: bool,
}

impl OpenAi {
    /// A client for one configured provider.
    pub fn new(cfg: &ProviderConfig) -> Result<OpenAi, String> {
        Ok(OpenAi {
            endpoint: Endpoint::new(cfg, "chat/completions", Auth::Bearer, Vec::new())?,
            structured: cfg.structured_output(),
            stream: cfg.stream,
        })
    }

    /// The request body; `stream` asks for server-sent events with the
    /// usage in the last one.
    pub fn body(&self, model: &str, req: &ChatRequest, stream: bool) -> Value {
        let messages: Vec<Value> = req
            .messages
            .iter()
            .map(|m| {
                let mut o = json!({"role": m.role.as_str(), "content": m.content});
                if !m.tool_calls.is_empty() {
                    o["tool_calls"] = m
                        .tool_calls
                        .iter()
                        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                        .collect();
                    // `content` stays a string (`""` when the model said
                    // nothing): OpenAI accepts it, and llama.cpp-family
                    // servers answer HTTP 500 to `null`.
                }
                if m.role == Role::Tool {
                    o["tool_call_id"] = json!(m.tool_call_id);
                }
                o
            })
            .collect();
        let mut body = json!({"model": model, "messages": messages});
        // `none` offers no tools at all: the model cannot call one.
        if !req.tools.is_empty() && req.tool_choice != ToolChoice::None {
            body["tools"] = req
                .tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
            body["tool_choice"] = json!(req.tool_choice.as_str());
        }
        if let Some(t) = req.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = req.max_tokens {
            body["max_tokens"] = json!(m);
        }
        if let Some(f) = response_format(self.structured, &req.format) {
            body["response_format"] = f;
        }
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }
}

/// The `response_format` that asks for `format` in `mode`.
fn response_format(mode: StructuredOutput, format: &OutputFormat) -> Option<Value> {
    let schema = match format {
        OutputFormat::Text => return None,
        OutputFormat::Json => None,
        OutputFormat::Schema(s) => Some(s),
    };
    match (mode, schema) {
        (StructuredOutput::None | StructuredOutput::Tool, _) => None,
        (StructuredOutput::JsonSchema, Some(s)) => Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": s, "strict": strict_allows(s)},
        })),
        (StructuredOutput::JsonObjectSchema, Some(s)) => {
            Some(json!({"type": "json_object", "schema": s}))
        }
        _ => Some(json!({"type": "json_object"})),
    }
}

/// Whether OpenAI's strict mode can take `schema` as it is: every object
/// closed (`additionalProperties: false`) with all its properties required,
/// and no keyword strict mode rejects. A schema that does not fit is sent
/// without `strict` (the answer is still checked against it afterwards).
pub fn strict_allows(schema: &Value) -> bool {
    const UNSUPPORTED: &[&str] = &[
        "patternProperties",
        "unevaluatedProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "if",
        "then",
        "else",
        "not",
        "dependentRequired",
        "dependentSchemas",
        "contains",
        "uniqueItems",
    ];
    match schema {
        Value::Object(o) => {
            if UNSUPPORTED.iter().any(|k| o.contains_key(*k)) {
                return false;
            }
            let is_object = o.get("type").and_then(Value::as_str) == Some("object")
                || o.contains_key("properties");
            if is_object {
                if o.get("additionalProperties") != Some(&Value::Bool(false)) {
                    return false;
                }
                let props = o.get("properties").and_then(Value::as_object);
                let required: Vec<&str> = o
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if let Some(props) = props
                    && props.keys().any(|k| !required.contains(&k.as_str()))
                {
                    return false;
                }
            }
            o.iter().all(|(k, v)| match k.as_str() {
                // Maps of names to schemas: the names are not keywords.
                "properties" | "$defs" | "definitions" => {
                    v.as_object().is_none_or(|m| m.values().all(strict_allows))
                }
                // Values, not schemas.
                "required" | "enum" | "const" | "default" | "examples" | "description"
                | "title" => true,
                _ => strict_allows(v),
            })
        }
        Value::Array(a) => a.iter().all(strict_allows),
        _ => true,
    }
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    model: String,
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
}

#[derive(Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    total_tokens: u64,
}

/// Parses a chat-completions response body.
pub fn parse_response(text: &str) -> Result<ChatResponse, String> {
    let wire: Wire = serde_json::from_str(text)
        .map_err(|e| format!("the provider's answer is not a chat completion: {e}"))?;
    let Some(choice) = wire.choices.into_iter().next() else {
        return Err("the provider's answer has no choices".into());
    };
    let usage_reported = wire.usage.is_some();
    let usage: Usage = wire.usage.unwrap_or_default().into();
    Ok(ChatResponse {
        model: wire.model,
        content: choice.message.content.unwrap_or_default(),
        tool_calls: choice
            .message
            .tool_calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: if c.id.is_empty() {
                    format!("call_{i}")
                } else {
                    c.id
                },
                name: c.function.name,
                arguments: c.function.arguments,
            })
            .collect(),
        finish_reason: choice.finish_reason.unwrap_or_default(),
        usage,
        usage_reported,
        provider_wait: None,
    })
}

/// Reads a streamed chat completion: `choices[0].delta` pieces of text
/// and of tool calls (by `index`), the finish reason, and the usage of the
/// last chunk (`stream_options.include_usage`), until `[DONE]`.
#[derive(Debug, Default)]
pub struct Streamed {
    model: String,
    answer: Delta,
    finish_reason: String,
    usage: Option<Usage>,
    /// Chunks that carried text or tool-call pieces: about one token each.
    chunks: u64,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    model: String,
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<ChunkDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChunkDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ChunkToolCall>,
}

#[derive(Deserialize)]
struct ChunkToolCall {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<ChunkFunction>,
}

#[derive(Deserialize)]
struct ChunkFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

impl ReadStream for Streamed {
    fn event(&mut self, _name: &str, data: &str, out: &mut Delta) -> Result<bool, ProviderError> {
        if data.trim() == "[DONE]" {
            return Ok(true);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            ProviderError::Malformed(format!(
                "a streamed chunk is not a chat completion chunk: {e}"
            ))
        })?;
        if let Some(e) = chunk.error {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| e.to_string(), str::to_owned);
            return Err(ProviderError::Status {
                status: 200,
                message: format!("the stream ended in an error: {message}"),
            });
        }
        if !chunk.model.is_empty() {
            self.model = chunk.model;
        }
        if let Some(u) = chunk.usage {
            self.usage = Some(u.into());
        }
        for c in chunk.choices {
            if let Some(r) = c.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = r;
            }
            let Some(d) = c.delta else { continue };
            let mut piece = Delta {
                text: d.content.unwrap_or_default(),
                tool_calls: Vec::new(),
            };
            for t in d.tool_calls {
                let (name, arguments) = t
                    .function
                    .map(|f| (f.name, f.arguments))
                    .unwrap_or_default();
                piece.tool_calls.push(ToolDelta {
                    index: t.index,
                    id: t.id.unwrap_or_default(),
                    name: name.unwrap_or_default(),
                    arguments: arguments.unwrap_or_default(),
                });
            }
            if !piece.is_empty() {
                self.chunks += 1;
            }
            self.answer.merge(piece.clone());
            out.merge(piece);
        }
        Ok(false)
    }

    fn finish(self) -> Result<ChatResponse, String> {
        // A server that ignores `stream_options.include_usage` (as
        // llama-cpp-python does) reports nothing: the chunks are counted,
        // and the caller bills at least its reservation.
        let usage_reported = self.usage.is_some();
        let usage = self.usage.unwrap_or(Usage {
            prompt_tokens: 0,
            completion_tokens: self.chunks,
            total_tokens: self.chunks,
        });
        if self.finish_reason.is_empty() {
            return Err("the stream ended before the answer did (no finish_reason)".into());
        }
        let mut calls = self.answer.tool_calls;
        calls.sort_by_key(|c| c.index);
        Ok(ChatResponse {
            model: self.model,
            content: self.answer.text,
            tool_calls: calls
                .into_iter()
                .map(|c| ToolCall {
                    id: if c.id.is_empty() {
                        format!("call_{}", c.index)
                    } else {
                        c.id
                    },
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect(),
            finish_reason: self.finish_reason,
            usage,
            usage_reported,
            provider_wait: None,
        })
    }
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.total_tokens.max(u.prompt_tokens + u.completion_tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_with_tool_calls_and_usage() {
        let r = parse_response(r#"{"model":"m","choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{\"q\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#).unwrap();
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].name, "lookup");
        assert_eq!(r.usage.total_tokens, 15);
        assert!(parse_response("{not json").is_err());
        assert!(parse_response(r#"{"choices":[]}"#).is_err());
    }

    #[test]
    fn tool_choice_none_offers_no_tools() {
        let p = OpenAi::new(&ProviderConfig {
            name: "p".into(),
            base_url: "http://127.0.0.1:1/v1/".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.endpoint.url, "http://127.0.0.1:1/v1/chat/completions");
        let mut req = ChatRequest {
            tools: vec![crate::ToolSpec {
                name: "t".into(),
                description: String::new(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::None,
            ..Default::default()
        };
        assert!(p.body("m", &req, false).get("tools").is_none());
        req.tool_choice = ToolChoice::Required;
        let b = p.body("m", &req, false);
        assert_eq!(b["tool_choice"], "required");
        assert_eq!(b["tools"][0]["function"]["name"], "t");
    }

    fn provider(mode: Option<StructuredOutput>) -> OpenAi {
        OpenAi::new(&ProviderConfig {
            name: "p".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            structured_output: mode,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn an_assistant_tool_call_message_keeps_string_content() {
        let req = ChatRequest {
            messages: vec![crate::Message {
                role: Role::Assistant,
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "lookup".into(),
                    arguments: "{}".into(),
                }],
                tool_call_id: String::new(),
            }],
            ..Default::default()
        };
        let b = provider(None).body("m", &req, false);
        assert_eq!(b["messages"][0]["content"], json!(""));
        assert_eq!(b["messages"][0]["tool_calls"][0]["id"], "c1");
    }

    #[test]
    fn structured_output_is_asked_for_in_each_mode() {
        let closed = json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false});
        let open = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let ask = |mode, format: OutputFormat| {
            let req = ChatRequest {
                format,
                ..Default::default()
            };
            provider(mode).body("m", &req, false)["response_format"].clone()
        };
        let f = ask(None, OutputFormat::Schema(closed.clone()));
        assert_eq!(f["type"], "json_schema");
        assert_eq!(f["json_schema"]["schema"], closed);
        assert_eq!(f["json_schema"]["strict"], true);
        let f = ask(None, OutputFormat::Schema(open.clone()));
        assert_eq!(f["json_schema"]["strict"], false);
        assert_eq!(ask(None, OutputFormat::Json)["type"], "json_object");
        let f = ask(
            Some(StructuredOutput::JsonObjectSchema),
            OutputFormat::Schema(open.clone()),
        );
        assert_eq!(f, json!({"type": "json_object", "schema": open}));
        assert_eq!(
            ask(
                Some(StructuredOutput::JsonObject),
                OutputFormat::Schema(open.clone())
            ),
            json!({"type": "json_object"})
        );
        assert_eq!(
            ask(Some(StructuredOutput::None), OutputFormat::Json),
            Value::Null
        );
        assert_eq!(ask(None, OutputFormat::Text), Value::Null);
    }

    #[test]
    fn strict_mode_needs_closed_objects_with_every_property_required() {
        assert!(strict_allows(
            &json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"], "additionalProperties": false}}}, "required": ["a"], "additionalProperties": false})
        ));
        assert!(!strict_allows(
            &json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "integer"}}}}}, "required": ["a"], "additionalProperties": false})
        ));
        assert!(!strict_allows(
            &json!({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"], "additionalProperties": false})
        ));
        assert!(!strict_allows(
            &json!({"type": "object", "properties": {}, "additionalProperties": false, "minProperties": 1})
        ));
        // A property named like a keyword is a name, not the keyword.
        assert!(strict_allows(
            &json!({"type": "object", "properties": {"not": {"type": "string"}}, "required": ["not"], "additionalProperties": false})
        ));
    }

    #[test]
    fn a_stream_assembles_text_tool_calls_and_the_final_usage() {
        let mut s = Streamed::default();
        let mut seen = Delta::default();
        let chunks = [
            r#"{"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_x","type":"function","function":{"name":"lookup","arguments":"{\"q\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#,
        ];
        for c in chunks {
            assert!(!s.event("", c, &mut seen).unwrap());
        }
        assert!(s.event("", "[DONE]", &mut seen).unwrap());
        assert_eq!(seen.text, "Hello");
        assert_eq!(seen.tool_calls[0].arguments, r#"{"q":"a"}"#);
        let r = s.finish().unwrap();
        assert_eq!(r.content, "Hello");
        assert_eq!(r.tool_calls[0].id, "call_x");
        assert_eq!(r.tool_calls[0].name, "lookup");
        assert_eq!(r.tool_calls[0].arguments, r#"{"q":"a"}"#);
        assert_eq!(r.finish_reason, "tool_calls");
        assert_eq!(r.usage.total_tokens, 19);
        assert!(r.usage_reported);
        // No usage chunk: the chunks are counted and the answer says so.
        let fed = |chunks: &[&str]| {
            let mut s = Streamed::default();
            for c in chunks {
                s.event("", c, &mut Delta::default()).unwrap();
            }
            s
        };
        let x = r#"{"choices":[{"delta":{"content":"x"}}]}"#;
        let r = fed(&[
            x,
            r#"{"choices":[{"delta":{"content":"y"},"finish_reason":"stop"}]}"#,
        ])
        .finish()
        .unwrap();
        assert!(!r.usage_reported);
        assert_eq!(r.usage.completion_tokens, 2);
        // A stream cut before its finish reason is no answer.
        let s = fed(&[x]);
        assert!(s.finish().unwrap_err().contains("finish_reason"));
    }
}
