//! The OpenAI-compatible chat-completions client.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::ProviderConfig;
use crate::http::{Auth, Endpoint};
use crate::{ChatRequest, ChatResponse, Role, ToolCall, ToolChoice, Usage};

/// A provider speaking `POST {base_url}/chat/completions`.
#[derive(Debug)]
pub struct OpenAi {
    pub(crate) endpoint: Endpoint,
    json_mode: bool,
}

impl OpenAi {
    /// A client for one configured provider.
    pub fn new(cfg: &ProviderConfig) -> Result<OpenAi, String> {
        Ok(OpenAi {
            endpoint: Endpoint::new(cfg, "chat/completions", Auth::Bearer, Vec::new())?,
            json_mode: cfg.json_mode,
        })
    }

    /// The request body.
    pub fn body(&self, model: &str, req: &ChatRequest) -> Value {
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
                    if m.content.is_empty() {
                        o["content"] = Value::Null;
                    }
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
        if req.json && self.json_mode {
            body["response_format"] = json!({"type": "json_object"});
        }
        body
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
    let usage = wire.usage.unwrap_or_default();
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
        usage: Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage
                .total_tokens
                .max(usage.prompt_tokens + usage.completion_tokens),
        },
    })
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
        assert!(p.body("m", &req).get("tools").is_none());
        req.tool_choice = ToolChoice::Required;
        let b = p.body("m", &req);
        assert_eq!(b["tool_choice"], "required");
        assert_eq!(b["tools"][0]["function"]["name"], "t");
    }
}
