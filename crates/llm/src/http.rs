//! What every HTTP provider shares: the client with its timeouts, the key
//! read from its variable at each call and scrubbed from anything shown,
//! and the statuses that mean "try the next model".

use std::time::Duration;

use serde_json::Value;

use crate::config::ProviderConfig;
use crate::{ChatResponse, Delta, ProviderError, Stream};

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
    base: String,
    api_key_env: String,
    auth: Auth,
    headers: Vec<(&'static str, &'static str)>,
    http: reqwest::Client,
    /// Set once a streamed request with tools was refused: this server
    /// cannot stream tool calls, so requests with tools go unstreamed.
    tools_unstreamed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// A wire's reader of a streamed answer: fed each server-sent event, it
/// passes on what arrived and builds the whole answer.
pub(crate) trait Streamed: Send {
    /// One event: its `event:` name (empty when none) and its `data:`.
    /// What arrived goes into `out`. `Ok(true)` once the answer is whole.
    fn event(&mut self, name: &str, data: &str, out: &mut Delta) -> Result<bool, ProviderError>;
    /// The whole answer, once the stream ended.
    fn finish(self) -> Result<ChatResponse, String>;
}

/// Removes the key from text shown to anyone.
struct Scrub(Option<String>);

impl Scrub {
    fn apply(&self, s: String) -> String {
        match &self.0 {
            Some(k) if k.len() >= 4 => s.replace(k.as_str(), "[redacted]"),
            _ => s,
        }
    }

    /// `e` with the key removed from any text the server sent.
    fn error(&self, e: ProviderError) -> ProviderError {
        match e {
            ProviderError::Malformed(m) => ProviderError::Malformed(self.apply(m)),
            ProviderError::Incomplete { message, received } => ProviderError::Incomplete {
                message: self.apply(message),
                received,
            },
            ProviderError::Status { status, message } => ProviderError::Status {
                status,
                message: self.apply(message),
            },
            e => e,
        }
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
        let base = cfg.base_url.trim_end_matches('/').to_owned();
        Ok(Endpoint {
            name: cfg.name.clone(),
            url: format!("{base}/{path}"),
            base,
            api_key_env: cfg.api_key_env.clone(),
            auth,
            headers,
            http,
            tools_unstreamed: Default::default(),
        })
    }

    /// Whether a request with tools may be streamed here.
    pub(crate) fn streams_tools(&self) -> bool {
        !self
            .tools_unstreamed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `e`, the answer to a streamed request with tools, says this
    /// server cannot stream tool calls: it refused the request, or its
    /// stream ended before any of the answer arrived (llama-cpp-python
    /// fails a streamed tool choice after it started answering). Asked
    /// again unstreamed by the caller; remembered, and said once.
    pub(crate) fn refused_streamed_tools(&self, e: &ProviderError) -> bool {
        let refused = matches!(
            e,
            ProviderError::Status { .. }
                | ProviderError::Incomplete {
                    received: false,
                    ..
                }
        );
        if !refused {
            return false;
        }
        let before = self
            .tools_unstreamed
            .swap(true, std::sync::atomic::Ordering::Relaxed);
        if !before {
            tracing::warn!(provider = %self.name, error = %e, "the provider refused a streamed request with tools: requests with tools go unstreamed from now on");
        }
        true
    }

    /// Sends `call` with the fixed headers and the key. A 2xx answer comes
    /// back to be read; any other status is read here: 429 is rate-limited;
    /// 503 and 529 (Anthropic's "overloaded") are unavailable, both with
    /// the server's Retry-After; 404 and `model_not_found` mean the model
    /// is not served.
    async fn send(
        &self,
        mut call: reqwest::RequestBuilder,
    ) -> Result<(reqwest::Response, Scrub), ProviderError> {
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
        let scrub = Scrub(key);
        let resp = match call.send().await {
            Ok(r) => r,
            Err(e) => return Err(transport(e, &scrub)),
        };
        let status = resp.status().as_u16();
        if (200..=299).contains(&status) {
            return Ok((resp, scrub));
        }
        let retry_after = provider_wait(resp.headers());
        let text = resp.text().await.map_err(|e| transport(e, &scrub))?;
        let (message, code) = error_message(&text);
        let message = scrub.apply(message);
        Err(match status {
            429 => ProviderError::RateLimited { retry_after },
            503 | 529 => ProviderError::Unavailable {
                status,
                retry_after,
            },
            404 => ProviderError::ModelNotFound(format!("HTTP 404: {message}")),
            _ if code == "model_not_found" => {
                ProviderError::ModelNotFound(format!("HTTP {status}: {message}"))
            }
            _ => ProviderError::Status { status, message },
        })
    }

    /// Posts `body` and parses the whole answer with `parse`.
    pub(crate) async fn call(
        &self,
        body: Value,
        parse: impl FnOnce(&str) -> Result<ChatResponse, String>,
    ) -> Result<ChatResponse, ProviderError> {
        let (resp, scrub) = self.send(self.http.post(&self.url).json(&body)).await?;
        let wait = exhausted_for(resp.headers(), jiff::Timestamp::now());
        let text = resp.text().await.map_err(|e| transport(e, &scrub))?;
        let mut answer = parse(&text).map_err(|e| ProviderError::Malformed(scrub.apply(e)))?;
        answer.provider_wait = wait;
        Ok(answer)
    }

    /// Posts `body` (which asks for a stream) and reads the server-sent
    /// events with `wire`, passing what arrives on to `out.sink`, gathered
    /// per `out.interval` or `out.max_bytes`. Dropping the future closes
    /// the connection, which stops the server's generation.
    pub(crate) async fn stream(
        &self,
        body: Value,
        mut wire: impl Streamed,
        out: &Stream<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let (mut resp, scrub) = self.send(self.http.post(&self.url).json(&body)).await?;
        let wait = exhausted_for(resp.headers(), jiff::Timestamp::now());
        let mut buf: Vec<u8> = Vec::new();
        let mut gathered = Delta::default();
        let mut due: Option<tokio::time::Instant> = None;
        let mut received = false;
        let pass_on = |gathered: &mut Delta, due: &mut Option<tokio::time::Instant>| {
            *due = None;
            if !gathered.is_empty() {
                (out.sink)(std::mem::take(gathered));
            }
        };
        'read: loop {
            let chunk = match due {
                Some(at) => match tokio::time::timeout_at(at, resp.chunk()).await {
                    Ok(c) => c,
                    Err(_) => {
                        pass_on(&mut gathered, &mut due);
                        continue;
                    }
                },
                None => resp.chunk().await,
            };
            match chunk.map_err(|e| transport(e, &scrub))? {
                Some(bytes) => buf.extend_from_slice(&bytes),
                None => break,
            }
            while let Some((name, data)) = switchyard_kit::sse::next_event(&mut buf) {
                let mut piece = Delta::default();
                let done = wire
                    .event(&name, &data, &mut piece)
                    .map_err(|e| scrub.error(e))?;
                received |= !piece.is_empty();
                gathered.merge(piece);
                if done {
                    break 'read;
                }
            }
            if gathered.len() >= out.max_bytes {
                pass_on(&mut gathered, &mut due);
            } else if !gathered.is_empty() && due.is_none() {
                due = Some(tokio::time::Instant::now() + out.interval);
            }
        }
        pass_on(&mut gathered, &mut due);
        // Every way a wire's answer is not whole at the end is a cut stream.
        let mut answer = wire.finish().map_err(|e| ProviderError::Incomplete {
            message: scrub.apply(e),
            received,
        })?;
        answer.provider_wait = wait;
        Ok(answer)
    }

    /// The ids of `GET {base_url}/models` (`{"data": [{"id": …}]}` on both
    /// wires), following Anthropic's pages (`has_more`, `last_id`).
    pub(crate) async fn models(&self) -> Result<Vec<String>, ProviderError> {
        let mut ids = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_MODEL_PAGES {
            let url = format!("{}/models", self.base);
            let page_url = match &after {
                Some(a) => format!("{url}?limit=1000&after_id={}", encode(a)),
                None => url.clone(),
            };
            let (resp, scrub) = self.send(self.http.get(&page_url)).await?;
            let text = resp.text().await.map_err(|e| transport(e, &scrub))?;
            let page: ModelPage = serde_json::from_str(&text).map_err(|e| {
                ProviderError::Malformed(format!("GET /models: not a model list: {e}"))
            })?;
            ids.extend(page.data.into_iter().map(|m| m.id));
            match (page.has_more, page.last_id) {
                (true, Some(last)) if after.as_deref() != Some(last.as_str()) => after = Some(last),
                _ => break,
            }
        }
        Ok(ids)
    }
}

/// `s` percent-encoded for a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// More pages than any provider serves models: a server that keeps saying
/// `has_more` is not followed further.
const MAX_MODEL_PAGES: usize = 20;

#[derive(serde::Deserialize)]
struct ModelPage {
    #[serde(default)]
    data: Vec<ModelId>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

#[derive(serde::Deserialize)]
struct ModelId {
    id: String,
}

/// A transport failure: a timeout, or a failed connection (without the
/// URL, key scrubbed).
fn transport(e: reqwest::Error, scrub: &Scrub) -> ProviderError {
    if e.is_timeout() && !e.is_connect() {
        ProviderError::Timeout
    } else {
        ProviderError::Connect(scrub.apply(without_url(&e)))
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
/// How long a refusing provider asks callers to wait: `Retry-After`, else
/// OpenAI's `retry-after-ms`, else the latest reset (`x-ratelimit-reset-*`,
/// e.g. `6m0s`, `1.5s`, `20ms`) of a rate-limit dimension with nothing
/// remaining.
fn provider_wait(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    if let Some(d) = get("retry-after").and_then(parse_retry_after) {
        return Some(d);
    }
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_millis(ms as u64));
    }
    exhausted_for(h, jiff::Timestamp::now())
}

/// How long a provider says its limit stays exhausted: the latest reset of
/// a dimension with nothing remaining — OpenAI's `x-ratelimit-remaining-*`
/// with `x-ratelimit-reset-*` (a span, `6m0s`), Anthropic's
/// `anthropic-ratelimit-*-remaining` with `-reset` (an RFC 3339 time).
pub(crate) fn exhausted_for(
    h: &reqwest::header::HeaderMap,
    now: jiff::Timestamp,
) -> Option<Duration> {
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    let empty = |v: Option<&str>| v.is_some_and(|v| v.trim() == "0");
    let openai = ["requests", "tokens"]
        .iter()
        .filter(|d| empty(get(&format!("x-ratelimit-remaining-{d}"))))
        .filter_map(|d| get(&format!("x-ratelimit-reset-{d}")).and_then(parse_reset));
    let anthropic = ["requests", "tokens", "input-tokens", "output-tokens"]
        .iter()
        .filter(|d| empty(get(&format!("anthropic-ratelimit-{d}-remaining"))))
        .filter_map(|d| get(&format!("anthropic-ratelimit-{d}-reset")))
        .filter_map(|v| v.trim().parse::<jiff::Timestamp>().ok())
        .map(|at| {
            let ms = at.as_millisecond().saturating_sub(now.as_millisecond());
            Duration::from_millis(u64::try_from(ms).unwrap_or(0))
        });
    openai.chain(anthropic).max()
}

/// An OpenAI reset span: `1s`, `6m0s`, `1.5s`, `20ms`, `1h2m3s`.
fn parse_reset(v: &str) -> Option<Duration> {
    let (mut total, mut num) = (0.0f64, String::new());
    let mut chars = v.trim().chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let n: f64 = num.parse().ok()?;
        num.clear();
        let unit = match c {
            'h' => 3_600_000.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                1.0
            }
            'm' => 60_000.0,
            's' => 1_000.0,
            _ => return None,
        };
        total += n * unit;
        any = true;
    }
    (any && num.is_empty() && total.is_finite()).then(|| Duration::from_millis(total as u64))
}

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

/// The provider's own error text, cut short, and its error code (OpenAI's
/// `error.code`, Anthropic's `error.type`; empty when none). An empty body
/// says so.
fn error_message(body: &str) -> (String, String) {
    let v = serde_json::from_str::<Value>(body).ok();
    let from_json = v.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let code = v
        .as_ref()
        .and_then(|v| {
            v.pointer("/error/code")
                .or_else(|| v.pointer("/error/type"))
        })
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let s = from_json.unwrap_or_else(|| body.trim().to_owned());
    let s = if s.trim().is_empty() {
        "the server sent no error text (its own log says why)".to_owned()
    } else {
        s
    };
    (s.chars().take(300).collect(), code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_spans_read_like_openai_writes_them() {
        assert_eq!(parse_reset("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_reset("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_reset("1.5s"), Some(Duration::from_millis(1_500)));
        assert_eq!(parse_reset("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_reset("1h2m3s"), Some(Duration::from_secs(3_723)));
        assert_eq!(parse_reset("soon"), None);
        assert_eq!(parse_reset("5"), None);
    }

    #[test]
    fn a_provider_wait_comes_from_retry_after_or_an_exhausted_dimension_reset() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("x-ratelimit-remaining-requests", "3".parse().unwrap());
        h.insert("x-ratelimit-reset-requests", "9s".parse().unwrap());
        h.insert("x-ratelimit-remaining-tokens", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-tokens", "2s".parse().unwrap());
        assert_eq!(provider_wait(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "750".parse().unwrap());
        assert_eq!(provider_wait(&h), Some(Duration::from_millis(750)));
        h.insert("retry-after", "4".parse().unwrap());
        assert_eq!(provider_wait(&h), Some(Duration::from_secs(4)));
        assert_eq!(provider_wait(&reqwest::header::HeaderMap::new()), None);
    }

    #[test]
    fn a_success_that_exhausted_a_limit_says_until_when_openai_and_anthropic_alike() {
        let now: jiff::Timestamp = "2026-11-30T08:00:00Z".parse().unwrap();
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(exhausted_for(&h, now), None);
        h.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-requests", "1.5s".parse().unwrap());
        assert_eq!(exhausted_for(&h, now), Some(Duration::from_millis(1_500)));
        h.insert(
            "anthropic-ratelimit-output-tokens-remaining",
            "0".parse().unwrap(),
        );
        h.insert(
            "anthropic-ratelimit-output-tokens-reset",
            "2026-11-30T08:00:07Z".parse().unwrap(),
        );
        h.insert(
            "anthropic-ratelimit-requests-remaining",
            "40".parse().unwrap(),
        );
        h.insert(
            "anthropic-ratelimit-requests-reset",
            "2026-11-30T08:01:00Z".parse().unwrap(),
        );
        // The latest reset of an exhausted dimension; one with room left
        // does not count.
        assert_eq!(exhausted_for(&h, now), Some(Duration::from_secs(7)));
    }

    #[test]
    fn retry_after_reads_seconds() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn error_messages_come_from_either_wire_shape_and_an_empty_body_says_so() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad model","code":"model_not_found"}}"#),
            ("bad model".to_owned(), "model_not_found".to_owned())
        );
        assert_eq!(
            error_message(
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: required"}}"#
            ),
            (
                "max_tokens: required".to_owned(),
                "invalid_request_error".to_owned()
            )
        );
        assert_eq!(error_message("plain text").0, "plain text");
        assert_eq!(
            error_message("  ").0,
            "the server sent no error text (its own log says why)"
        );
    }
}
