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
#[cfg(feature = "scripted")]
pub mod llama;
pub mod openai;
#[cfg(any(test, feature = "scripted"))]
pub mod scripted;
mod semconv;

pub use config::{LlmConfig, ModelConfig, ProviderConfig, ProviderKind, StructuredOutput};

/// Installs the process's rustls crypto provider (see `switchyard_kit::tls`).
pub(crate) fn install_crypto() {
    switchyard_kit::tls::install_crypto();
}

/// Who speaks in a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
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
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ToolCall {
    /// The model's id for the call.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as JSON text.
    pub arguments: String,
}

/// `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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

/// The form an answer must take.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum OutputFormat {
    /// Free text.
    #[default]
    Text,
    /// Any JSON value.
    Json,
    /// JSON matching this schema.
    Schema(Value),
}

/// A piece of a streamed answer, as gathered for one `llm.delta` event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Delta {
    /// Text that arrived.
    pub text: String,
    /// Tool-call pieces that arrived.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolDelta>,
}

/// A piece of one tool call of a streamed answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ToolDelta {
    /// Which call of the answer (0-based).
    pub index: u32,
    /// The call's id, once known.
    pub id: String,
    /// The tool's name, once known.
    pub name: String,
    /// More of the arguments' JSON text.
    pub arguments: String,
}

impl Delta {
    /// Whether nothing arrived.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.tool_calls.is_empty()
    }

    /// Bytes gathered.
    pub fn len(&self) -> usize {
        self.text.len()
            + self
                .tool_calls
                .iter()
                .map(|t| t.arguments.len() + t.name.len())
                .sum::<usize>()
    }

    /// Appends `o`, merging pieces of the same tool call.
    pub fn merge(&mut self, o: Delta) {
        self.text.push_str(&o.text);
        for t in o.tool_calls {
            match self.tool_calls.iter_mut().find(|x| x.index == t.index) {
                Some(x) => {
                    if x.id.is_empty() {
                        x.id = t.id;
                    }
                    if x.name.is_empty() {
                        x.name = t.name;
                    }
                    x.arguments.push_str(&t.arguments);
                }
                None => self.tool_calls.push(t),
            }
        }
    }
}

/// Where a streamed answer's pieces go, and how they are gathered: one
/// call of `sink` per `interval` or `max_bytes`, whichever comes first, so
/// a fast model does not turn every token into an event.
pub struct Stream<'a> {
    /// Receives the gathered pieces.
    pub sink: &'a (dyn Fn(Delta) + Send + Sync),
    /// Longest wait before gathered text is passed on.
    pub interval: Duration,
    /// Gathered bytes that are passed on at once.
    pub max_bytes: usize,
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
    /// The form the answer must take, asked for in the provider's
    /// structured-output mode.
    pub format: OutputFormat,
}

/// Token usage of one or more calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
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
    /// What the call used, as the provider reported it.
    pub usage: Usage,
    /// Whether the provider reported usage at all (some servers send none
    /// in streams); when it did not, `usage` holds only the completion
    /// chunks counted, and the caller bills its reservation instead.
    pub usage_reported: bool,
    /// The provider's rate-limit headers said a dimension has nothing left
    /// for this long (the next call would be refused until then).
    pub provider_wait: Option<Duration>,
}

/// How long after a cut stream the chain is tried again, ms.
const INCOMPLETE_PAUSE_MS: u64 = 250;

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
    /// The provider does not serve the model: HTTP 404, an error coded
    /// `model_not_found`, or a model its model list does not name.
    #[error("model not found: {0}")]
    ModelNotFound(String),
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
    /// A streamed answer ended before it was whole (no finish reason): the
    /// server cut the stream (llama.cpp's server ends an older stream when
    /// a newer request arrives, unless started with
    /// `--interrupt_requests False`) or the connection closed mid-answer.
    #[error("{message}")]
    Incomplete {
        /// What the wire says was missing.
        message: String,
        /// Whether any of the answer arrived before the end.
        received: bool,
    },
    /// The provider is misconfigured here (e.g. its key variable is unset).
    #[error("{0}")]
    Config(String),
}

impl ProviderError {
    /// Seed 000 §3.2: the next model in the chain is tried only when this
    /// one is unavailable: rate-limited (429), unavailable or overloaded
    /// (503, 529), unreachable (connection failed), not served by its
    /// provider (404, `model_not_found`, or absent from the provider's
    /// model list), or its stream was cut before the answer was whole.
    pub fn falls_back(&self) -> bool {
        matches!(
            self,
            ProviderError::RateLimited { .. }
                | ProviderError::Unavailable { .. }
                | ProviderError::Connect(_)
                | ProviderError::ModelNotFound(_)
                | ProviderError::Incomplete { .. }
        )
    }

    /// How long to wait before the chain is tried again after this: the
    /// server's Retry-After, or a short pause after a cut stream (what cut
    /// it has usually passed by then).
    fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::RateLimited { retry_after }
            | ProviderError::Unavailable { retry_after, .. } => *retry_after,
            ProviderError::Incomplete { .. } => Some(Duration::from_millis(INCOMPLETE_PAUSE_MS)),
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
            ProviderError::ModelNotFound(_) => "model_not_found",
            ProviderError::Status { .. } => "http_error",
            ProviderError::Malformed(_) => "malformed",
            ProviderError::Incomplete { .. } => "incomplete",
            ProviderError::Config(_) => "config",
        }
    }
}

/// A boxed future, for object-safe traits.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A wire protocol to a model server.
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// One chat call to `model`. With `stream`, a provider configured to
    /// stream passes the answer's pieces on as they arrive; the answer is
    /// the same either way.
    fn chat<'a>(
        &'a self,
        model: &'a str,
        req: &'a ChatRequest,
        stream: Option<&'a Stream<'a>>,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>>;

    /// The models the provider serves (`GET {base_url}/models`).
    fn models(&self) -> BoxFuture<'_, Result<Vec<String>, ProviderError>>;
}

/// The HTTP wires: each writes its request body and reads its answer,
/// whole or streamed; their endpoint does the rest.
macro_rules! over_http {
    ($($wire:ident :: $client:ident),+) => {$(
        impl Provider for $wire::$client {
            fn chat<'a>(
                &'a self,
                model: &'a str,
                req: &'a ChatRequest,
                stream: Option<&'a Stream<'a>>,
            ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
                Box::pin(async move {
                    let tools = !req.tools.is_empty();
                    let unstreamed = || async {
                        let body = self.body(model, req, false);
                        self.endpoint.call(body, $wire::parse_response).await
                    };
                    // A server that cannot stream tool calls still runs
                    // tool turns: unstreamed (their text arrives whole).
                    let streamed = self.stream && (!tools || self.endpoint.streams_tools());
                    match stream.filter(|_| streamed) {
                        Some(s) => {
                            let body = self.body(model, req, true);
                            match self.endpoint.stream(body, $wire::Streamed::default(), s).await {
                                Err(e) if tools && self.endpoint.refused_streamed_tools(&e) => {
                                    // A server that failed mid-stream may
                                    // have reset the pooled connection.
                                    match unstreamed().await {
                                        Err(ProviderError::Connect(_)) => unstreamed().await,
                                        r => r,
                                    }
                                }
                                r => r,
                            }
                        }
                        None => unstreamed().await,
                    }
                })
            }

            fn models(&self) -> BoxFuture<'_, Result<Vec<String>, ProviderError>> {
                Box::pin(self.endpoint.models())
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
    /// Prompt overhead, and the extra when tools are offered.
    overhead: (u64, u64),
}

/// The longest a model list is waited for: a provider that does not
/// answer it is called anyway (and fails over if it is down).
const MODEL_LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// What a provider's model list said, last time it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// Not read yet, or the provider is configured not to be checked.
    Unchecked,
    /// Reading it failed; calls go ahead (and fail over if the provider is
    /// down).
    Failed(String),
    /// The models it serves.
    Served(std::collections::BTreeSet<String>),
}

/// One provider's model check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCheck {
    /// The provider.
    pub provider: String,
    /// What its list said.
    pub listing: Listing,
    /// Each configured model, and whether the list names it (`None` when
    /// the list could not be read or is not checked).
    pub models: Vec<(String, Option<bool>)>,
}

/// What [`Llm::chat_with`] reports to and asks of its caller.
pub struct Hooks<'a> {
    /// Told of every call made (or skipped).
    pub on_call: &'a mut (dyn FnMut(&CallRecord) + Send),
    /// Streamed answers' pieces, from providers configured to stream.
    pub on_delta: Option<&'a (dyn Fn(Delta) + Send + Sync)>,
    /// Asked before each call after the first.
    pub admit: Option<&'a dyn Admit>,
}

/// Takes room in the provider rate limits for a call of a chain after its
/// first (a fallback, or a later round), or says why there is none.
pub trait Admit: Send + Sync {
    /// Room for the next call, to `target`.
    fn admit<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<(), String>>;
}

/// Where a model call goes upstream: what provider rate limits key on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Target {
    /// Provider name.
    pub provider: String,
    /// Model.
    pub model: String,
    /// The upstream key's name (never the key).
    pub key: String,
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
    /// Prompt tokens the provider reported (answered calls).
    #[serde(skip_serializing_if = "is_zero")]
    pub prompt_tokens: u64,
    /// Completion tokens the provider reported (answered calls).
    #[serde(skip_serializing_if = "is_zero")]
    pub completion_tokens: u64,
    /// The provider reported no usage, so the call was billed at what was
    /// reserved for it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub usage_estimated: bool,
    /// How the answer ended (answered calls): `stop`, `tool_calls`, or
    /// `length` when it was cut at `max_tokens`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub finish_reason: String,
    /// How long the provider asked callers to wait (a 429's Retry-After
    /// or rate-limit reset headers), milliseconds; 0: it did not say.
    #[serde(skip_serializing_if = "is_zero")]
    pub retry_after_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// Provider names in configuration order, with their configured
    /// models, and whether their model lists are checked.
    order: Vec<(String, Vec<String>, bool)>,
    /// model → (provider, price), in configuration order.
    models: HashMap<String, Vec<Served>>,
    /// provider → what its model list said.
    listings: Arc<std::sync::RwLock<HashMap<String, Listing>>>,
    /// provider → the name of its upstream key (its `api_key_env`, or its
    /// own name without one): what rate limits and cooldowns key on.
    keys: HashMap<String, String>,
    /// provider → its `gen_ai.provider.name` (by its wire).
    wires: HashMap<String, &'static str>,
    max_rounds: u32,
    max_retry_after: Duration,
    check_interval: Duration,
    delta_interval: Duration,
    delta_max_bytes: usize,
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
            check_interval: Duration::from_millis(cfg.model_check_interval_ms),
            delta_interval: Duration::from_millis(cfg.delta_interval_ms),
            delta_max_bytes: cfg.delta_max_bytes,
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
                overhead: (
                    m.prompt_overhead_tokens.unwrap_or(p.prompt_overhead_tokens),
                    m.tool_overhead_tokens.unwrap_or(p.tool_overhead_tokens),
                ),
            });
        }
        let key = if p.api_key_env.is_empty() {
            p.name.clone()
        } else {
            p.api_key_env.clone()
        };
        self.keys.insert(p.name.clone(), key);
        self.wires
            .insert(p.name.clone(), semconv::provider_name(p.kind));
        self.order.push((
            p.name.clone(),
            p.models.iter().map(|m| m.name.clone()).collect(),
            p.check_models,
        ));
        self.providers.insert(p.name.clone(), provider);
    }

    /// Tokens the providers of `chain` may add to a prompt beyond its
    /// messages (the most over the chain): their prompt overhead, and
    /// their tool overhead when `tools` are offered.
    pub fn prompt_overhead(&self, chain: &[String], hint: &str, tools: bool) -> u64 {
        chain
            .iter()
            .filter_map(|m| self.served(m, hint))
            .map(|s| s.overhead.0 + if tools { s.overhead.1 } else { 0 })
            .max()
            .unwrap_or(0)
    }

    /// Reads `name`'s model list now (when it is checked) and keeps it.
    async fn list(&self, name: &str, checked: bool) -> Listing {
        let listing = match (checked, self.providers.get(name)) {
            (true, Some(p)) => match tokio::time::timeout(MODEL_LIST_TIMEOUT, p.models()).await {
                Ok(Ok(ids)) => Listing::Served(ids.into_iter().collect()),
                Ok(Err(e)) => Listing::Failed(e.to_string()),
                Err(_) => Listing::Failed(format!(
                    "GET /models did not answer within {} s",
                    MODEL_LIST_TIMEOUT.as_secs()
                )),
            },
            _ => Listing::Unchecked,
        };
        if let Ok(mut l) = self.listings.write() {
            l.insert(name.to_owned(), listing.clone());
        }
        listing
    }

    /// Reads every checked provider's model list now, and says, for each
    /// configured model, whether its provider serves it. A model its
    /// provider does not list is skipped by [`Llm::chat`] until a later
    /// check finds it.
    pub async fn check_models(&self) -> Vec<ProviderCheck> {
        let mut out = Vec::with_capacity(self.order.len());
        for (name, configured, checked) in &self.order {
            let listing = self.list(name, *checked).await;
            let models = configured
                .iter()
                .map(|m| {
                    let found = match &listing {
                        Listing::Served(ids) => Some(ids.contains(m)),
                        _ => None,
                    };
                    (m.clone(), found)
                })
                .collect();
            out.push(ProviderCheck {
                provider: name.clone(),
                listing,
                models,
            });
        }
        out
    }

    /// Checks the model lists now and every `llm.model_check_interval_ms`,
    /// logging each configured model a provider does not serve, until the
    /// runtime stops.
    pub fn spawn_model_checks(&self) -> tokio::task::JoinHandle<()> {
        let llm = self.clone();
        tokio::spawn(async move {
            let mut reported = std::collections::HashSet::new();
            loop {
                for c in llm.check_models().await {
                    for (model, found) in &c.models {
                        let key = (c.provider.clone(), model.clone());
                        if *found == Some(false) {
                            if reported.insert(key) {
                                tracing::warn!(
                                    provider = %c.provider,
                                    model = %model,
                                    "provider {} does not serve model {model:?} (its model list does not name it): calls to it are skipped and the fallback chain moves on",
                                    c.provider
                                );
                            }
                        } else {
                            reported.remove(&key);
                        }
                    }
                    if let Listing::Failed(e) = &c.listing {
                        tracing::debug!(provider = %c.provider, "could not list models: {e}");
                    }
                }
                tokio::time::sleep(llm.check_interval.max(Duration::from_secs(1))).await;
            }
        })
    }

    /// Why `provider` cannot serve `model`, when its list says so. A
    /// checked provider whose list was never read is read first, so the
    /// first call after start-up cannot reach a model it does not serve.
    async fn not_served(&self, provider: &str, model: &str) -> Option<ProviderError> {
        let checked = self
            .order
            .iter()
            .any(|(name, _, checked)| name == provider && *checked);
        let unread = || {
            self.listings
                .read()
                .is_ok_and(|l| matches!(l.get(provider), None | Some(Listing::Unchecked)))
        };
        if checked && unread() {
            self.list(provider, true).await;
        }
        // Looked up in place: a call does not copy the provider's list.
        let l = self.listings.read().ok()?;
        let Some(Listing::Served(ids)) = l.get(provider) else {
            return None;
        };
        if ids.contains(model) {
            return None;
        }
        let mut named: Vec<&str> = ids.iter().take(5).map(String::as_str).collect();
        if ids.len() > 5 {
            named.push("…");
        }
        Some(ProviderError::ModelNotFound(format!(
            "provider {provider} does not serve {model:?}; its model list names {}",
            if named.is_empty() {
                "none".to_owned()
            } else {
                named.join(", ")
            }
        )))
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

    /// Where a call over `chain` goes first: the first model a provider
    /// serves, that provider, and its upstream key's name.
    pub fn target(&self, chain: &[String], hint: &str) -> Option<Target> {
        chain.iter().find_map(|m| {
            let served = self.served(m, hint)?;
            Some(Target {
                provider: served.provider.clone(),
                model: m.clone(),
                key: self.key_of(&served.provider),
            })
        })
    }

    /// The name of provider `provider`'s upstream key.
    pub fn key_of(&self, provider: &str) -> String {
        self.keys
            .get(provider)
            .cloned()
            .unwrap_or_else(|| provider.to_owned())
    }

    /// The price of `model` (via `hint` when several providers serve it).
    pub fn price(&self, model: &str, hint: &str) -> Option<Price> {
        self.served(model, hint).map(|s| s.price)
    }

    /// The per-million prices of `model`'s input and output tokens for a
    /// journal entry (zero for a model with no price).
    pub fn entry_prices(&self, model: &str, hint: &str) -> (i64, i64) {
        self.price(model, hint)
            .map_or((0, 0), |p| (p.input, p.output))
    }

    /// The highest price over a chain's configured models: what one call
    /// is reserved at, whichever model ends up answering.
    pub fn chain_price(&self, chain: &[String], hint: &str) -> Option<Price> {
        chain
            .iter()
            .filter_map(|m| self.price(m, hint))
            .reduce(Price::max)
    }

    /// Counts a call in the metrics: outcome, tokens and cost by provider
    /// and model. Only configured models are labels (a job may name any
    /// model; those no provider serves stay out, so labels stay bounded).
    fn count(&self, r: &CallRecord, hint: &str) {
        if r.provider.is_empty() {
            return;
        }
        let m = switchyard_kit::metrics::global();
        m.llm_calls
            .get_or_create(&switchyard_kit::metrics::LlmCallLabels {
                provider: r.provider.clone(),
                model: r.model.clone(),
                outcome: r.outcome.clone(),
            })
            .inc();
        for (direction, n) in [
            ("prompt", r.prompt_tokens),
            ("completion", r.completion_tokens),
        ] {
            if n > 0 {
                m.llm_tokens
                    .get_or_create(&switchyard_kit::metrics::TokenLabels {
                        provider: r.provider.clone(),
                        model: r.model.clone(),
                        direction: direction.into(),
                    })
                    .inc_by(n);
            }
        }
        let usage = Usage {
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            total_tokens: r.prompt_tokens + r.completion_tokens,
        };
        let cost = self.price(&r.model, hint).map_or(0, |p| p.cost(&usage));
        if cost > 0 {
            m.llm_cost_micro_usd
                .get_or_create(&switchyard_kit::metrics::ModelLabels {
                    provider: r.provider.clone(),
                    model: r.model.clone(),
                })
                .inc_by(u64::try_from(cost).unwrap_or(0));
        }
    }

    /// One answer from the first model of `chain` that gives one: on 429,
    /// 503 or a connection failure the next model is tried, strictly in
    /// order. When every model failed so and one named a Retry-After that
    /// fits before `deadline`, the chain is tried again after it (up to
    /// `max_rounds`). A model its provider's list does not name is skipped
    /// as not found. Other errors end the chain at once. With `on_delta`,
    /// providers configured to stream pass on the answer as it arrives.
    /// Returns the answer and the model that gave it.
    pub async fn chat(
        &self,
        chain: &[String],
        hint: &str,
        req: &ChatRequest,
        deadline: Instant,
        on_call: &mut (dyn FnMut(&CallRecord) + Send),
        on_delta: Option<&(dyn Fn(Delta) + Send + Sync)>,
    ) -> Result<(ChatResponse, String), ChainError> {
        let hooks = Hooks {
            on_call,
            on_delta,
            admit: None,
        };
        self.chat_with(chain, hint, req, deadline, hooks).await
    }

    /// [`Llm::chat`], with every call after the first admitted by
    /// `hooks.admit` first (the first was admitted with its reservation): a
    /// call it refuses is not made, and the chain moves on.
    pub async fn chat_with(
        &self,
        chain: &[String],
        hint: &str,
        req: &ChatRequest,
        deadline: Instant,
        hooks: Hooks<'_>,
    ) -> Result<(ChatResponse, String), ChainError> {
        let Hooks {
            on_call,
            on_delta,
            admit,
        } = hooks;
        let mut admitted_first = false;
        let stream = on_delta.map(|sink| Stream {
            sink,
            interval: self.delta_interval,
            max_bytes: self.delta_max_bytes,
        });
        // Every call record is counted in the process's metrics too.
        let mut on_call = |r: &CallRecord| {
            self.count(r, hint);
            on_call(r);
        };
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
                        ..Default::default()
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
                // Every call but the first takes its own room in the
                // provider's rate limits.
                let refused = match admit {
                    Some(a) if admitted_first => {
                        let target = Target {
                            provider: served.provider.clone(),
                            model: model.clone(),
                            key: self.key_of(&served.provider),
                        };
                        a.admit(&target).await.err()
                    }
                    _ => None,
                };
                admitted_first = true;
                if let Some(why) = refused {
                    on_call(&CallRecord {
                        model: model.clone(),
                        provider: served.provider.clone(),
                        outcome: "deferred".into(),
                        error: why.clone(),
                        round,
                        ..Default::default()
                    });
                    tried.push(format!("{model} via {}: {why}", served.provider));
                    continue;
                }
                let wire = self
                    .wires
                    .get(&served.provider)
                    .copied()
                    .unwrap_or("openai");
                let span = semconv::chat_span(model, &served.provider, wire, round, req);
                let r = match self.not_served(&served.provider, model).await {
                    Some(e) => Err(e),
                    None => {
                        let call = provider.chat(model, req, stream.as_ref());
                        let call = tracing::Instrument::instrument(call, span.clone());
                        match tokio::time::timeout(left, call).await {
                            Ok(r) => r,
                            Err(_) => Err(ProviderError::Timeout),
                        }
                    }
                };
                let latency_ms = started.elapsed().as_millis() as u64;
                match &r {
                    Ok(resp) => semconv::answered(&span, wire, model, resp, started.elapsed()),
                    Err(e) => semconv::failed(&span, wire, model, e, started.elapsed()),
                }
                drop(span);
                match r {
                    Ok(resp) => {
                        on_call(&CallRecord {
                            model: model.clone(),
                            provider: served.provider.clone(),
                            outcome: "ok".into(),
                            error: String::new(),
                            round,
                            latency_ms,
                            prompt_tokens: resp.usage.prompt_tokens,
                            completion_tokens: resp.usage.completion_tokens,
                            usage_estimated: !resp.usage_reported,
                            finish_reason: resp.finish_reason.clone(),
                            retry_after_ms: resp.provider_wait.map_or(0, |d| d.as_millis() as u64),
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
                            retry_after_ms: e.retry_after().map_or(0, |d| d.as_millis() as u64),
                            ..Default::default()
                        });
                        tried.push(format!("{model} via {}: {e}", served.provider));
                        if e.falls_back() {
                            switchyard_kit::metrics::global()
                                .llm_fallbacks
                                .get_or_create(&switchyard_kit::metrics::ModelLabels {
                                    provider: served.provider.clone(),
                                    model: model.clone(),
                                })
                                .inc();
                        }
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
                    .map(|m| ModelConfig::priced(*m, 1_000_000, 2_000_000))
                    .collect(),
                ..Default::default()
            }],
            max_rounds: 2,
            max_retry_after_ms: 5_000,
            ..Default::default()
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
            None,
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
                None,
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

    #[tokio::test]
    async fn a_model_its_provider_does_not_list_is_skipped_so_the_chain_falls_back() {
        let script = Script::new();
        script.serve_models(&["b"]);
        script.otherwise(Reply::text("from b", 3, 1));
        let server = script.serve().await;
        let llm = Llm::new(&cfg(&server.base_url(), &["gpt-4o", "b"])).unwrap();
        let checks = llm.check_models().await;
        assert_eq!(
            checks[0].models,
            vec![
                ("gpt-4o".to_owned(), Some(false)),
                ("b".to_owned(), Some(true))
            ]
        );
        let mut calls = Vec::new();
        let (_, used) = llm
            .chat(
                &chain(&["gpt-4o", "b"]),
                "",
                &ChatRequest::default(),
                Instant::now() + Duration::from_secs(5),
                &mut |c| calls.push((c.outcome.clone(), c.error.clone())),
                None,
            )
            .await
            .unwrap();
        assert_eq!(used, "b");
        assert_eq!(script.models_called(), vec!["b"], "gpt-4o was never asked");
        assert_eq!(calls[0].0, "model_not_found");
        assert!(calls[0].1.contains("names b"), "{}", calls[0].1);
        // Alone, the unserved model is unavailable, and says why.
        let err = ask(&llm, &["gpt-4o"], 5).await.unwrap_err();
        assert_eq!(err.reason, Reason::LlmUnavailable);
        assert!(
            err.message.contains("does not serve \"gpt-4o\""),
            "{}",
            err.message
        );
    }

    #[tokio::test]
    async fn http_404_and_model_not_found_fall_back_and_an_empty_error_body_says_so() {
        let script = Script::new();
        script.for_model("a", vec![Reply::status(404)]);
        script.for_model(
            "b",
            vec![
                Reply::status(400)
                    .body(r#"{"error":{"message":"no such model","code":"model_not_found"}}"#),
            ],
        );
        script.for_model("c", vec![Reply::text("ok", 1, 1)]);
        let server = script.serve().await;
        let llm = Llm::new(&cfg(&server.base_url(), &["a", "b", "c"])).unwrap();
        let (_, used) = ask(&llm, &["a", "b", "c"], 5).await.unwrap();
        assert_eq!(used, "c");
        assert_eq!(script.models_called(), vec!["a", "b", "c"]);
        script.for_model("a", vec![Reply::status(500).body("")]);
        let err = ask(&llm, &["a", "c"], 5).await.unwrap_err();
        assert_eq!(err.reason, Reason::LlmUnavailable);
        assert!(
            err.message
                .ends_with("HTTP 500: the server sent no error text (its own log says why)"),
            "{}",
            err.message
        );
    }

    fn streaming(base: &str, models: &[&str]) -> Llm {
        let mut c = cfg(base, models);
        c.providers[0].stream = true;
        c.delta_max_bytes = 8;
        Llm::new(&c).unwrap()
    }

    #[tokio::test]
    async fn a_streamed_answer_arrives_in_gathered_pieces_before_the_call_ends() {
        let text = "The quick brown fox jumps over the lazy dog.";
        let script = Script::new();
        script.for_model(
            "a",
            vec![Reply::text(text, 9, 11).chunk_delay(Duration::from_millis(15))],
        );
        let server = script.serve().await;
        let llm = streaming(&server.base_url(), &["a"]);
        let seen = std::sync::Mutex::new(Vec::<(Delta, usize)>::new());
        let sink = |d: Delta| {
            let finished = script.streams_finished();
            seen.lock().unwrap().push((d, finished));
        };
        let (resp, _) = llm
            .chat(
                &chain(&["a"]),
                "",
                &ChatRequest::default(),
                Instant::now() + Duration::from_secs(10),
                &mut |_| {},
                Some(&sink),
            )
            .await
            .unwrap();
        assert_eq!(resp.content, text);
        assert_eq!(resp.usage.total_tokens, 20);
        assert!(resp.usage_reported);
        let body = &script.received()[0].body;
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        let seen = seen.into_inner().unwrap();
        let joined: String = seen.iter().map(|(d, _)| d.text.as_str()).collect();
        assert_eq!(joined, text);
        // Gathered: fewer events than the server's 4-character chunks.
        assert!(
            seen.len() > 1 && seen.len() < text.len() / 4,
            "{}",
            seen.len()
        );
        assert_eq!(
            seen[0].1, 0,
            "the first piece came while the stream was still open"
        );
        // Without a sink (or with streaming off) the same call is not streamed.
        script.for_model("a", vec![Reply::text(text, 9, 11)]);
        let (resp, _) = ask(&llm, &["a"], 5).await.unwrap();
        assert_eq!(resp.content, text);
        assert!(script.received()[1].body.get("stream").is_none());
    }

    /// One streamed request over `models` (its pieces dropped), its
    /// calls' (outcome, round, finish reason).
    async fn streamed(
        llm: &Llm,
        models: &[&str],
        req: &ChatRequest,
    ) -> (
        Result<(ChatResponse, String), ChainError>,
        Vec<(String, u32, String)>,
    ) {
        let sink = |_: Delta| {};
        let mut calls = Vec::new();
        let r = llm
            .chat(
                &chain(models),
                "",
                req,
                Instant::now() + Duration::from_secs(10),
                &mut |r| calls.push((r.outcome.clone(), r.round, r.finish_reason.clone())),
                Some(&sink),
            )
            .await;
        (r, calls)
    }

    /// Whether each request `script` received asked for a stream.
    fn streams_asked(script: &Script) -> Vec<bool> {
        script
            .received()
            .iter()
            .map(|r| r.body["stream"] == true)
            .collect()
    }

    #[tokio::test]
    async fn a_stream_cut_before_its_finish_reason_is_asked_again_and_then_falls_back() {
        let script = Script::new();
        script.for_model(
            "a",
            vec![
                Reply::text("the first half", 5, 3).cut(),
                Reply::text("the whole answer", 5, 4),
            ],
        );
        let server = script.serve().await;
        let llm = streaming(&server.base_url(), &["a", "b"]);
        let (r, calls) = streamed(&llm, &["a"], &ChatRequest::default()).await;
        let (resp, used) = r.unwrap();
        assert_eq!(
            (resp.content.as_str(), used.as_str()),
            ("the whole answer", "a")
        );
        assert_eq!(
            calls,
            vec![
                ("incomplete".to_owned(), 1, String::new()),
                ("ok".to_owned(), 2, "stop".to_owned())
            ]
        );
        // Cut on the first model, answered by the next in the chain.
        script.for_model("a", vec![Reply::text("cut", 5, 1).cut()]);
        script.for_model("b", vec![Reply::text("from b", 5, 2)]);
        let (r, _) = streamed(&llm, &["a", "b"], &ChatRequest::default()).await;
        let (resp, used) = r.unwrap();
        assert_eq!((resp.content.as_str(), used.as_str()), ("from b", "b"));
    }

    #[tokio::test]
    async fn a_server_that_cannot_stream_tool_calls_still_answers_tool_turns_unstreamed() {
        let script = Script::new();
        let lookup = || Reply::tools(&[("lookup", serde_json::json!({"q": "x"}))], 5, 6);
        script.for_model(
            "a",
            vec![
                Reply::status(500).body("Automatic streaming tool choice is not supported"),
                lookup(),
                lookup(),
                Reply::text("plain text streams still", 5, 4),
            ],
        );
        let server = script.serve().await;
        let llm = streaming(&server.base_url(), &["a"]);
        let with_tools = ChatRequest {
            tools: vec![ToolSpec {
                name: "lookup".into(),
                description: "looks up".into(),
                parameters: serde_json::json!({"type": "object"}),
            }],
            ..Default::default()
        };
        for _ in 0..2 {
            let (r, _) = streamed(&llm, &["a"], &with_tools).await;
            assert_eq!(r.unwrap().0.tool_calls[0].name, "lookup");
        }
        let (r, _) = streamed(&llm, &["a"], &ChatRequest::default()).await;
        assert_eq!(r.unwrap().0.content, "plain text streams still");
        // Streamed and refused; asked again whole; from then on tool turns
        // go whole at once; a turn without tools still streams.
        assert_eq!(streams_asked(&script), vec![true, false, false, true]);
        // A server that starts the stream and ends it before anything of
        // the answer (no finish reason: llama-cpp-python's
        // chatml-function-calling) is read the same way.
        script.clear_received();
        script.for_model("a", vec![Reply::text("", 5, 0).cut(), lookup()]);
        let llm = streaming(&server.base_url(), &["a"]);
        let (r, _) = streamed(&llm, &["a"], &with_tools).await;
        assert_eq!(r.unwrap().0.tool_calls[0].name, "lookup");
        assert_eq!(streams_asked(&script), vec![true, false]);
    }

    #[tokio::test]
    async fn streamed_tool_calls_are_assembled_over_both_wires() {
        let script = Script::new();
        let reply = || {
            Reply::tools(
                &[("lookup", serde_json::json!({"q": "a long query"}))],
                5,
                6,
            )
        };
        script.for_model("a", vec![reply()]);
        script.for_model("claude", vec![reply()]);
        let server = script.serve().await;
        let mut c = cfg(&server.base_url(), &["a"]);
        c.providers[0].stream = true;
        let mut ant = cfg(&server.base_url(), &["claude"]).providers.remove(0);
        ant.name = "anthropic".into();
        ant.kind = ProviderKind::Anthropic;
        ant.stream = true;
        c.providers.push(ant);
        let llm = Llm::new(&c).unwrap();
        for model in ["a", "claude"] {
            let pieces = std::sync::Mutex::new(Delta::default());
            let sink = |d: Delta| pieces.lock().unwrap().merge(d);
            let (resp, _) = llm
                .chat(
                    &chain(&[model]),
                    "",
                    &ChatRequest::default(),
                    Instant::now() + Duration::from_secs(5),
                    &mut |_| {},
                    Some(&sink),
                )
                .await
                .unwrap();
            assert_eq!(resp.tool_calls.len(), 1, "{model}");
            assert_eq!(resp.tool_calls[0].name, "lookup");
            let args: serde_json::Value =
                serde_json::from_str(&resp.tool_calls[0].arguments).unwrap();
            assert_eq!(args, serde_json::json!({"q": "a long query"}));
            assert_eq!(resp.finish_reason, "tool_calls");
            assert_eq!(resp.usage.total_tokens, 11, "{model}");
            let pieces = pieces.into_inner().unwrap();
            assert_eq!(pieces.tool_calls[0].name, "lookup");
            assert_eq!(pieces.tool_calls[0].arguments, resp.tool_calls[0].arguments);
        }
    }

    #[tokio::test]
    async fn dropping_a_streamed_call_closes_the_stream() {
        let script = Script::new();
        script.for_model(
            "a",
            vec![Reply::text(&"word ".repeat(200), 1, 200).chunk_delay(Duration::from_millis(20))],
        );
        let server = script.serve().await;
        let llm = streaming(&server.base_url(), &["a"]);
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
        let first = std::sync::Mutex::new(Some(first_tx));
        let sink = |_d: Delta| {
            if let Some(t) = first.lock().unwrap().take() {
                let _ = t.send(());
            }
        };
        let (models, req) = (chain(&["a"]), ChatRequest::default());
        let mut on_call = |_: &CallRecord| {};
        let call = llm.chat(
            &models,
            "",
            &req,
            Instant::now() + Duration::from_secs(30),
            &mut on_call,
            Some(&sink),
        );
        tokio::select! {
            _ = call => panic!("the stream of 250 chunks 20 ms apart ended first"),
            _ = first_rx => {}
        }
        // The call future is dropped here: the connection closes.
        let started = Instant::now();
        while script.streams_dropped() == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the server kept streaming"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(script.streams_finished(), 0);
    }

    #[tokio::test]
    async fn a_stream_without_usage_is_marked_estimated() {
        let script = Script::new();
        script.for_model(
            "a",
            vec![Reply::text("abcdefgh", 5, 2).without_stream_usage()],
        );
        let server = script.serve().await;
        let llm = streaming(&server.base_url(), &["a"]);
        let mut estimated = Vec::new();
        let (resp, _) = llm
            .chat(
                &chain(&["a"]),
                "",
                &ChatRequest::default(),
                Instant::now() + Duration::from_secs(5),
                &mut |c| estimated.push(c.usage_estimated),
                Some(&|_| {}),
            )
            .await
            .unwrap();
        assert!(!resp.usage_reported);
        assert_eq!(resp.usage.completion_tokens, 2, "two 4-character chunks");
        assert_eq!(estimated, vec![true]);
    }
}
