//! What every HTTP provider shares: the client with its timeouts, the key
//! read from its variable at each call and scrubbed from anything shown,
//! and the statuses that mean "try the next model".

use std::time::Duration;

use serde_json::Value;

use crate::config::ProviderConfig;
use crate::{ChatResponse, ProviderError};

/// How a provider expects its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Auth {
    /// `Authorization: Bearer <key>` (OpenAI and compatible servers).
    Bearer,
    /// `x-api-key: <key>` (Anthropic).
    ApiKeyHeader,
}

/// One provider's endpoint.
pub(crate) struct Endpoint {
    pub(crate) name: String,
    pub(crate) url: String,
    api_key_env: String,
    auth: Auth,
    headers: Vec<(&'static str, &'static str)>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// `POST {base_url}/{path}` for the provider `cfg`, with fixed `headers`.
    pub(crate) fn new(
        cfg: &ProviderConfig,
        path: &str,
        auth: Auth,
        headers: Vec<(&'static str, &'static str)>,
    ) -> Result<Endpoint, String> {
        crate::install_crypto();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
            .timeout(Duration::from_millis(cfg.request_timeout_ms))
            .user_agent(concat!("switchyard/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("llm.providers.{}: {e}", cfg.name))?;
        Ok(Endpoint {
            name: cfg.name.clone(),
            url: format!("{}/{path}", cfg.base_url.trim_end_matches('/')),
            api_key_env: cfg.api_key_env.clone(),
            auth,
            headers,
            http,
        })
    }

    /// Posts `body` and parses a 2xx answer with `parse`. 429 is
    /// rate-limited; 503 and 529 (Anthropic's "overloaded") are
    /// unavailable; both carry the server's Retry-After.
    pub(crate) async fn call(
        &self,
        body: Value,
        parse: impl FnOnce(&str) -> Result<ChatResponse, String>,
    ) -> Result<ChatResponse, ProviderError> {
        let mut call = self.http.post(&self.url).json(&body);
        for (k, v) in &self.headers {
            call = call.header(*k, *v);
        }
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
            call = match self.auth {
                Auth::Bearer => call.bearer_auth(k),
                Auth::ApiKeyHeader => call.header("x-api-key", k),
            };
        }
        let scrub = |s: String| match &key {
            Some(k) if k.len() >= 4 => s.replace(k.as_str(), "[redacted]"),
            _ => s,
        };
        let resp = match call.send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() && !e.is_connect() => return Err(ProviderError::Timeout),
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
        match status {
            429 => Err(ProviderError::RateLimited { retry_after }),
            503 | 529 => Err(ProviderError::Unavailable {
                status,
                retry_after,
            }),
            200..=299 => parse(&text).map_err(|e| ProviderError::Malformed(scrub(e))),
            _ => Err(ProviderError::Status {
                status,
                message: scrub(error_message(&text)),
            }),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn error_messages_come_from_either_wire_shape() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad model"}}"#),
            "bad model"
        );
        assert_eq!(
            error_message(
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: required"}}"#
            ),
            "max_tokens: required"
        );
        assert_eq!(error_message("plain text"), "plain text");
    }
}
