//! LLM providers for Switchyard: OpenAI-compatible chat completions with
//! tools, configured in TOML with per-model prices; model fallback in the
//! order a task gives (seed 000 §3.2), honouring Retry-After within the
//! deadline; and the agent loop ([`agent`]) that LLM tasks and declarative
//! agents share, in which every model call is reserved on a budget first.
//!
//! The [`Provider`] trait is the seam for wire protocols: OpenAI's chat
//! completions ([`openai`]) and Anthropic's Messages API ([`anthropic`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use switchyard_core::Reason;

pub mod agent;
pub mod anthropic;
pub mod config;
mod http;
pub mod openai;
#[cfg(any(test, feature = "scripted"))]
pub mod scripted;

pub use config::{LlmConfig, ModelConfig, ProviderConfig, ProviderKind};

/// Installs the process's rustls crypto provider (see `switchyard_kit::tls`).
pub(crate) fn install_crypto() {
    switchyard_kit::tls::install_crypto();
}

/// Who speaks in a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Instructions.
    System,
    /// The task.
    #[default]
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

impl Role {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, Default)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Text.
    pub content: String,
    /// Tool calls the assistant asked for.
    pub tool_calls: Vec<ToolCall>,
    /// For tool results: the call answered.
    pub tool_call_id: String,
}

impl Message {
    /// A message with text only.
    pub fn text(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            ..Default::default()
        }
    }
}

/// A tool as offered to a model (seed 000 §4, OpenAI function shape).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    /// The model's id for the call.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as JSON text.
    pub arguments: String,
}

/// `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call a tool.
    Required,
    /// No tools are offered.
    None,
}

impl ToolChoice {
    /// Parses `auto|required|none` (empty: auto).
    pub fn parse(s: &str) -> Option<ToolChoice> {
        match s {
            "" | "auto" => Some(ToolChoice::Auto),
            "required" => Some(ToolChoice::Required),
            "none" => Some(ToolChoice::None),
            _ => None,
        }
    }

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolChoice::Auto => "auto",
            ToolChoice::Required => "required",
            ToolChoice::None => "none",
        }
    }
}

/// One chat-completions request, without the model (the fallback chain
/// picks it).
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// Tools offered.
    pub tools: Vec<ToolSpec>,
    /// Tool choice.
    pub tool_choice: ToolChoice,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Most completion tokens.
    pub max_tokens: Option<u64>,
    /// Ask for a JSON answer.
    pub json: bool,
}

/// Token usage of one or more calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
}

impl Usage {
    /// Adds another call's usage.
    pub fn add(&mut self, o: &Usage) {
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        self.total_tokens += o.total_tokens;
    }
}

/// A model's answer.
#[derive(Debug, Clone, Default)]
pub struct ChatResponse {
    /// Model as the provider names it.
    pub model: String,
    /// Text, possibly empty when tools are called.
    pub content: String,
    /// Tool calls asked for.
    pub tool_calls: Vec<ToolCall>,
    /// Why the model stopped.
    pub finish_reason: String,
    /// What the call used.
    pub usage: Usage,
}

/// Why one provider call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// HTTP 429.
    #[error("rate limited (HTTP 429)")]
    RateLimited {
        /// The server's Retry-After.
        retry_after: Option<Duration>,
    },
    /// HTTP 503.
    #[error("unavailable (HTTP {status})")]
    Unavailable {
        /// The status.
        status: u16,
        /// The server's Retry-After.
        retry_after: Option<Duration>,
    },
    /// The connection failed.
    #[error("connection failed: {0}")]
    Connect(String),
    /// The request ran past the provider's timeout.
    #[error("the request timed out")]
    Timeout,
    /// Another HTTP error.
    #[error("HTTP {status}: {message}")]
    Status {
        /// The status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The answer could not be parsed.
    #[error("{0}")]
    Malformed(String),
    /// The provider is misconfigured here (e.g. its key variable is unset).
    #[error("{0}")]
    Config(String),
}

impl ProviderError {
    /// Seed 000 §3.2: the next model in the chain is tried only when this
    /// one is rate-limited, unavailable or unreachable.
    pub fn falls_back(&self) -> bool {
        matches!(
            self,
            ProviderError::RateLimited { .. }
                | ProviderError::Unavailable { .. }
                | ProviderError::Connect(_)
        )
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::RateLimited { retry_after }
            | ProviderError::Unavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Short event name.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::RateLimited { .. } => "rate_limited",
            ProviderError::Unavailable { .. } => "unavailable",
            ProviderError::Connect(_) => "connect_failed",
            ProviderError::Timeout => "timeout",
            ProviderError::Status { .. } => "http_error",
            ProviderError::Malformed(_) => "malformed",
            ProviderError::Config(_) => "config",
        }
    }
}

/// A boxed future, for object-safe traits.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A wire protocol to a model server.
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// One chat call to `model`.
    fn chat<'a>(
        &'a self,
        model: &'a str,
        req: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>>;
}

/// The HTTP wires: each writes its request body and reads its answer;
/// their endpoint does the rest.
macro_rules! over_http {
    ($($wire:ident :: $client:ident),+) => {$(
        impl Provider for $wire::$client {
            fn chat<'a>(
                &'a self,
                model: &'a str,
                req: &'a ChatRequest,
            ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
                Box::pin(self.endpoint.call(self.body(model, req), $wire::parse_response))
            }
        }
    )+};
}

over_http!(openai::OpenAi, anthropic::Anthropic);

/// Per-million prices of a model, micro-USD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Price {
    /// Prompt tokens.
    pub input: i64,
    /// Completion tokens.
    pub output: i64,
}

impl Price {
    /// What `usage` costs, rounded up.
    pub fn cost(&self, usage: &Usage) -> i64 {
        switchyard_core::money::charge(usage.prompt_tokens, self.input).saturating_add(
            switchyard_core::money::charge(usage.completion_tokens, self.output),
        )
    }

    /// The higher of each price.
    pub fn max(self, o: Price) -> Price {
        Price {
            input: self.input.max(o.input),
            output: self.output.max(o.output),
        }
    }
}

#[derive(Clone)]
struct Served {
    provider: String,
    price: Price,
}

/// One call of a fallback chain, for events.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CallRecord {
    /// Model tried.
    pub model: String,
    /// Provider that served it ("" when none is configured).
    pub provider: String,
    /// `ok`, or the failure kind.
    pub outcome: String,
    /// Error text for failures.
    pub error: String,
    /// Round over the chain (1-based).
    pub round: u32,
    /// How long the call took, milliseconds.
    pub latency_ms: u64,
}

/// Why a chain produced no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ChainError {
    /// Reason code.
    pub reason: Reason,
    /// What happened, model by model.
    pub message: String,
}

/// Every configured provider, and which serves each model.
#[derive(Clone, Default)]
pub struct Llm {
    providers: HashMap<String, Arc<dyn Provider>>,
    /// model → (provider, price), in configuration order.
    models: HashMap<String, Vec<Served>>,
    max_rounds: u32,
    max_retry_after: Duration,
}

impl std::fmt::Debug for Llm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llm")
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.provider)
    }
}

impl Llm {
    /// Builds the providers of a validated configuration.
    pub fn new(cfg: &LlmConfig) -> Result<Llm, String> {
        cfg.validate()?;
        let mut llm = Llm {
            max_rounds: cfg.max_rounds.max(1),
            max_retry_after: Duration::from_millis(cfg.max_retry_after_ms),
            ..Default::default()
        };
        for p in &cfg.providers {
            let provider: Arc<dyn Provider> = match p.kind {
                ProviderKind::Openai => Arc::new(openai::OpenAi::new(p)?),
                ProviderKind::Anthropic => Arc::new(anthropic::Anthropic::new(p)?),
            };
            llm.add(p, provider);
        }
        Ok(llm)
    }

    /// Adds a provider under its configuration (tests plug in their own).
    pub fn add(&mut self, p: &ProviderConfig, provider: Arc<dyn Provider>) {
        for m in &p.models {
            self.models.entry(m.name.clone()).or_default().push(Served {
                provider: p.name.clone(),
                price: Price {
                    input: m.input_micro_usd_per_million.unwrap_or(0),
                    output: m.output_micro_usd_per_million.unwrap_or(0),
                },
            });
        }
        self.providers.insert(p.name.clone(), provider);
    }

    fn served(&self, model: &str, hint: &str) -> Option<&Served> {
        let all = self.models.get(model)?;
        if hint.is_empty() {
            return all.first();
        }
        // A hint that no provider of that name serves is ignored: the
        // seed's `ext_agent_provider` is a preference, not a requirement.
        all.iter()
            .find(|s| s.provider == hint)
            .or_else(|| all.first())
    }

    /// The price of `model` (via `hint` when several providers serve it).
    pub fn price(&self, model: &str, hint: &str) -> Option<Price> {
        self.served(model, hint).map(|s| s.price)
    }

    /// One per-million price for a journal entry of `model` (the higher of
    /// its two; the entry's total is the exact cost either way).
    pub fn entry_price(&self, model: &str, hint: &str) -> i64 {
        self.price(model, hint).map_or(0, |p| p.input.max(p.output))
    }

    /// The highest price over a chain's configured models: what one call
    /// is reserved at, whichever model ends up answering.
    pub fn chain_price(&self, chain: &[String], hint: &str) -> Option<Price> {
        chain
            .iter()
            .filter_map(|m| self.price(m, hint))
            .reduce(Price::max)
    }

    /// One answer from the first model of `chain` that gives one: on 429,
    /// 503 or a connection failure the next model is tried, strictly in
    /// order. When every model failed so and one named a Retry-After that
    /// fits before `deadline`, the chain is tried again after it (up to
    /// `max_rounds`). Other errors end the chain at once. Returns the
    /// answer and the model that gave it.
    pub async fn chat(
        &self,
        chain: &[String],
        hint: &str,
        req: &ChatRequest,
        deadline: Instant,
        on_call: &mut (dyn FnMut(&CallRecord) + Send),
    ) -> Result<(ChatResponse, String), ChainError> {
        let mut tried = Vec::new();
        let configured: Vec<&String> = chain
            .iter()
            .filter(|m| self.models.contains_key(*m))
            .collect();
        if configured.is_empty() {
            return Err(ChainError {
                reason: Reason::LlmProviderNotConfigured,
                message: format!(
                    "no configured LLM provider serves {}",
                    chain
                        .iter()
                        .map(|m| format!("{m:?}"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            });
        }
        for round in 1..=self.max_rounds {
            let mut wait: Option<Duration> = None;
            for model in chain {
                let Some(served) = self.served(model, hint) else {
                    on_call(&CallRecord {
                        model: model.clone(),
                        provider: String::new(),
                        outcome: "not_configured".into(),
                        error: "no provider serves this model".into(),
                        round,
                        latency_ms: 0,
                    });
                    if round == 1 {
                        tried.push(format!("{model}: not configured"));
                    }
                    continue;
                };
                let Some(provider) = self.providers.get(&served.provider) else {
                    continue;
                };
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ChainError {
                        reason: Reason::DeadlineExceeded,
                        message: format!("the deadline passed; tried {}", tried.join("; ")),
                    });
                }
                let started = Instant::now();
                let span = tracing::info_span!("llm.chat", model = %model, provider = %served.provider, round);
                let call = tracing::Instrument::instrument(provider.chat(model, req), span);
                let r = match tokio::time::timeout(left, call).await {
                    Ok(r) => r,
                    Err(_) => Err(ProviderError::Timeout),
                };
                let latency_ms = started.elapsed().as_millis() as u64;
                match r {
                    Ok(resp) => {
                        on_call(&CallRecord {
                            model: model.clone(),
                            provider: served.provider.clone(),
                            outcome: "ok".into(),
                            error: String::new(),
                            round,
                            latency_ms,
                        });
                        return Ok((resp, model.clone()));
                    }
                    Err(e) => {
                        on_call(&CallRecord {
                            model: model.clone(),
                            provider: served.provider.clone(),
                            outcome: e.kind().into(),
                            error: e.to_string(),
                            round,
                            latency_ms,
                        });
                        tried.push(format!("{model} via {}: {e}", served.provider));
                        if !e.falls_back() {
                            let reason = match e {
                                ProviderError::Malformed(_) => Reason::LlmBadResponse,
                                _ => Reason::LlmUnavailable,
                            };
                            return Err(ChainError {
                                reason,
                                message: format!("model {model}: {e}"),
                            });
                        }
                        if let Some(w) = e.retry_after() {
                            wait = Some(wait.map_or(w, |x| x.min(w)));
                        }
                    }
                }
            }
            let Some(w) = wait else { break };
            let fits = Instant::now() + w < deadline && w <= self.max_retry_after;
            if round == self.max_rounds || !fits {
                break;
            }
            tokio::time::sleep(w).await;
        }
        Err(ChainError {
            reason: Reason::LlmUnavailable,
            message: format!("every model failed: {}", tried.join("; ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripted::{Reply, Script};

    fn cfg(base: &str, models: &[&str]) -> LlmConfig {
        LlmConfig {
            providers: vec![ProviderConfig {
                name: "scripted".into(),
                base_url: base.into(),
                models: models
                    .iter()
                    .map(|m| ModelConfig {
                        name: (*m).into(),
                        input_micro_usd_per_million: Some(1_000_000),
                        output_micro_usd_per_million: Some(2_000_000),
                    })
                    .collect(),
                ..Default::default()
            }],
            max_rounds: 2,
            max_retry_after_ms: 5_000,
        }
    }

    fn chain(m: &[&str]) -> Vec<String> {
        m.iter().map(|s| (*s).to_owned()).collect()
    }

    /// One plain request over `models`, within `secs`.
    async fn ask(
        llm: &Llm,
        models: &[&str],
        secs: u64,
    ) -> Result<(ChatResponse, String), ChainError> {
        llm.chat(
            &chain(models),
            "",
            &ChatRequest::default(),
            Instant::now() + Duration::from_secs(secs),
            &mut |_| {},
        )
        .await
    }

    #[tokio::test]
    async fn fallback_tries_models_in_order_on_429_503_and_stops_at_the_first_answer() {
        let script = Script::new();
        script.for_model("a", vec![Reply::status(429)]);
        script.for_model("b", vec![Reply::status(503)]);
        script.for_model("c", vec![Reply::text("hello", 7, 3)]);
        let server = script.serve().await;
        let llm = Llm::new(&cfg(&server.base_url(), &["a", "b", "c", "d"])).unwrap();
        let mut calls = Vec::new();
        let (resp, used) = llm
            .chat(
                &chain(&["a", "b", "c", "d"]),
                "",
                &ChatRequest::default(),
                Instant::now() + Duration::from_secs(5),
                &mut |c| calls.push((c.model.clone(), c.outcome.clone())),
            )
            .await
            .unwrap();
        assert_eq!(used, "c");
        assert_eq!(resp.content, "hello");
        assert_eq!(
            calls,
            vec![
                ("a".into(), "rate_limited".into()),
                ("b".into(), "unavailable".into()),
                ("c".into(), "ok".into())
            ]
        );
        assert_eq!(script.models_called(), vec!["a", "b", "c"]);
    }

    #[tokio::test]
    async fn other_errors_do_not_fall_back() {
        let script = Script::new();
        script.for_model("a", vec![Reply::status(400)]);
        let server = script.serve().await;
        let llm = Llm::new(&cfg(&server.base_url(), &["a", "b"])).unwrap();
        let err = ask(&llm, &["a", "b"], 5).await.unwrap_err();
        assert_eq!(err.reason, Reason::LlmUnavailable);
        assert_eq!(script.models_called(), vec!["a"]);
        script.for_model("a", vec![Reply::malformed()]);
        let err = ask(&llm, &["a", "b"], 5).await.unwrap_err();
        assert_eq!(err.reason, Reason::LlmBadResponse);
    }

    #[tokio::test]
    async fn retry_after_is_honoured_when_it_fits_the_deadline() {
        let script = Script::new();
        script.for_model(
            "a",
            vec![
                Reply::status(429).retry_after("1"),
                Reply::text("late", 1, 1),
            ],
        );
        let server = script.serve().await;
        let llm = Llm::new(&cfg(&server.base_url(), &["a"])).unwrap();
        let started = Instant::now();
        let (resp, _) = ask(&llm, &["a"], 5).await.unwrap();
        assert_eq!(resp.content, "late");
        assert!(started.elapsed() >= Duration::from_millis(950));
        // A Retry-After beyond the deadline is not waited for.
        script.for_model("a", vec![Reply::status(429).retry_after("30")]);
        let started = Instant::now();
        let err = ask(&llm, &["a"], 2).await.unwrap_err();
        assert_eq!(err.reason, Reason::LlmUnavailable);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn connection_failure_falls_back_and_unconfigured_models_are_named() {
        let script = Script::new();
        script.for_model("b", vec![Reply::text("ok", 1, 1)]);
        let server = script.serve().await;
        let mut c = cfg("http://127.0.0.1:9/v1", &["a"]);
        c.providers[0].name = "down".into();
        c.providers
            .push(cfg(&server.base_url(), &["b"]).providers.remove(0));
        let llm = Llm::new(&c).unwrap();
        let (_, used) = ask(&llm, &["a", "b"], 5).await.unwrap();
        assert_eq!(used, "b");
        let err = ask(&llm, &["x", "y"], 5).await.unwrap_err();
        assert_eq!(err.reason, Reason::LlmProviderNotConfigured);
        assert!(err.message.contains("\"x\" or \"y\""));
    }

    #[tokio::test]
    async fn the_api_key_is_sent_but_never_shown() {
        let script = Script::new();
        script.for_model(
            "a",
            vec![Reply::status(401).body(r#"{"error":{"message":"bad key sk-test-SECRET-42"}}"#)],
        );
        let server = script.serve().await;
        let mut c = cfg(&server.base_url(), &["a"]);
        c.providers[0].api_key_env = "SWITCHYARD_TEST_LLM_KEY".into();
        crate::http::test_key("SWITCHYARD_TEST_LLM_KEY", "sk-test-SECRET-42");
        let llm = Llm::new(&c).unwrap();
        let err = ask(&llm, &["a"], 5).await.unwrap_err();
        assert!(!err.message.contains("SECRET"), "{}", err.message);
        assert!(err.message.contains("[redacted]"));
        assert_eq!(
            script.auth_headers(),
            vec!["Bearer sk-test-SECRET-42".to_owned()]
        );
        assert!(!format!("{llm:?}").contains("SECRET"));
    }

    #[tokio::test]
    async fn an_anthropic_provider_speaks_messages_falls_back_on_529_and_hides_its_key() {
        let script = Script::new();
        script.for_model("claude", vec![Reply::status(529)]);
        script.for_model("gpt", vec![Reply::text("from openai", 5, 2)]);
        let server = script.serve().await;
        let mut c = cfg(&server.base_url(), &["claude"]);
        c.providers[0].name = "anthropic".into();
        c.providers[0].kind = ProviderKind::Anthropic;
        c.providers[0].api_key_env = "SWITCHYARD_TEST_ANTHROPIC_KEY".into();
        c.providers
            .push(cfg(&server.base_url(), &["gpt"]).providers.remove(0));
        crate::http::test_key("SWITCHYARD_TEST_ANTHROPIC_KEY", "sk-ant-test-SECRET-7");
        let llm = Llm::new(&c).unwrap();
        // 529 (overloaded) falls back like 503, across wire protocols.
        let (resp, used) = ask(&llm, &["claude", "gpt"], 5).await.unwrap();
        assert_eq!(
            (resp.content.as_str(), used.as_str()),
            ("from openai", "gpt")
        );
        let got = script.received();
        assert_eq!(
            got.iter().map(|r| r.route).collect::<Vec<_>>(),
            ["messages", "chat/completions"]
        );
        assert_eq!(got[0].api_key.as_deref(), Some("sk-ant-test-SECRET-7"));
        assert_eq!(
            got[0].authorization, None,
            "the key is not a bearer token here"
        );
        assert_eq!(
            got[0].anthropic_version.as_deref(),
            Some(anthropic::API_VERSION)
        );
        // A tool call and its usage come back in the common shape.
        script.for_model(
            "claude",
            vec![Reply::tools(
                &[("lookup", serde_json::json!({"q": "x"}))],
                11,
                4,
            )],
        );
        let (resp, _) = ask(&llm, &["claude"], 5).await.unwrap();
        assert_eq!(resp.tool_calls[0].name, "lookup");
        assert_eq!(resp.tool_calls[0].arguments, r#"{"q":"x"}"#);
        assert_eq!(resp.finish_reason, "tool_calls");
        assert_eq!(resp.usage.total_tokens, 15);
        // An error echoing the key shows it redacted.
        script.for_model(
            "claude",
            vec![Reply::status(401).body(
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key sk-ant-test-SECRET-7"}}"#,
            )],
        );
        let err = ask(&llm, &["claude"], 5).await.unwrap_err();
        assert!(!err.message.contains("SECRET"), "{}", err.message);
        assert!(
            err.message.contains("invalid x-api-key [redacted]"),
            "{}",
            err.message
        );
    }
}
