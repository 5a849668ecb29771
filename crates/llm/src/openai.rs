//! The OpenAI-compatible chat-completions client.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::ProviderConfig;
use crate::{ChatRequest, ChatResponse, ProviderError, Role, ToolCall, ToolChoice, Usage};

/// A provider speaking `POST {base_url}/chat/completions`.
pub struct OpenAi {
    name: String,
    url: String,
    api_key_env: String,
    json_mode: bool,
    http: reqwest::Client,
}

impl std::fmt::Debug for OpenAi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAi")
            .field("name", &self.name)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl OpenAi {
    /// A client for one configured provider.
    pub fn new(cfg: &ProviderConfig) -> Result<OpenAi, String> {
        crate::install_crypto();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
            .timeout(Duration::from_millis(cfg.request_timeout_ms))
            .user_agent(concat!("switchyard/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("llm.providers.{}: {e}", cfg.name))?;
        Ok(OpenAi {
            name: cfg.name.clone(),
            url: format!("{}/chat/completions", cfg.base_url.trim_end_matches('/')),
            api_key_env: cfg.api_key_env.clone(),
            json_mode: cfg.json_mode,
            http,
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

    /// One chat-completions call.
    pub async fn chat(
        &self,
        model: &str,
        req: &ChatRequest,
    ) -> Result<ChatResponse, ProviderError> {
        let mut call = self.http.post(&self.url).json(&self.body(model, req));
        let key = if self.api_key_env.is_empty() {
            None
        } else {
            match read_key(&self.api_key_env) {
                Some(k) if !k.is_empty() => Some(k),
                _ => {
                    return Err(ProviderError::Config(format!(
                        "provider {}: environment variable {} is not set",
                        self.name, self.api_key_env
                    )));
                }
            }
        };
        if let Some(k) = &key {
            call = call.bearer_auth(k);
        }
        let scrub = |s: String| match &key {
            Some(k) if k.len() >= 4 => s.replace(k.as_str(), "[redacted]"),
            _ => s,
        };
        let resp = match call.send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return Err(ProviderError::Connect(scrub(without_url(&e))));
            }
            Err(e) if e.is_timeout() => return Err(ProviderError::Timeout),
            Err(e) => return Err(ProviderError::Connect(scrub(without_url(&e)))),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) if e.is_timeout() => return Err(ProviderError::Timeout),
            Err(e) => return Err(ProviderError::Connect(scrub(without_url(&e)))),
        };
        if status == 429 {
            return Err(ProviderError::RateLimited { retry_after });
        }
        if status == 503 {
            return Err(ProviderError::Unavailable {
                status,
                retry_after,
            });
        }
        if !(200..300).contains(&status) {
            return Err(ProviderError::Status {
                status,
                message: scrub(error_message(&text)),
            });
        }
        parse_response(&text).map_err(|e| ProviderError::Malformed(scrub(e)))
    }
}

/// The key in `var`, read at each call so a rotated key takes effect.
fn read_key(var: &str) -> Option<String> {
    #[cfg(test)]
    if let Some(k) = TEST_KEYS.lock().ok().and_then(|m| m.get(var).cloned()) {
        return Some(k);
    }
    std::env::var(var).ok()
}

// Tests cannot set process variables (`set_var` is unsafe in edition 2024
// and unsafe code is forbidden here), so they plant keys here.
#[cfg(test)]
static TEST_KEYS: std::sync::Mutex<std::collections::BTreeMap<String, String>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

#[cfg(test)]
pub(crate) fn test_key(var: &str, key: &str) {
    if let Ok(mut m) = TEST_KEYS.lock() {
        m.insert(var.into(), key.into());
    }
}

/// reqwest's message without the URL (which could carry credentials).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), "<provider>");
    }
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s = format!("{s}: {inner}");
        source = inner.source();
    }
    s
}

/// Seconds, or an HTTP date (then: unknown, use no wait).
fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<f64>()
        && secs.is_finite()
        && secs >= 0.0
    {
        return Some(Duration::from_secs_f64(secs.min(86_400.0)));
    }
    None
}

/// The provider's own error text, cut short.
fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let s = from_json.unwrap_or_else(|| body.to_owned());
    s.chars().take(300).collect()
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
    fn retry_after_reads_seconds() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn tool_choice_none_offers_no_tools() {
        let p = OpenAi::new(&ProviderConfig {
            name: "p".into(),
            base_url: "http://127.0.0.1:1/v1/".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.url, "http://127.0.0.1:1/v1/chat/completions");
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
