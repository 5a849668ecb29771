//! `[llm]` configuration: providers, the models each serves, and their
//! prices. API keys are named by environment variable, never written here.

use serde::{Deserialize, Serialize};

/// Wire protocol of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI's chat-completions API, which OpenAI, vLLM, llama.cpp server,
    /// Ollama, LM Studio and LiteLLM all speak.
    #[default]
    Openai,
    /// Anthropic's native Messages API (`{base_url}/messages`, key in
    /// `x-api-key`).
    Anthropic,
}

/// How a provider is asked for structured (JSON) output when a task wants
/// JSON (`output_format = json`) or gives `ext_agent_output_schema`. The
/// answer is checked against the schema after the call whatever the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// OpenAI's `response_format: {type: json_schema, json_schema: {name,
    /// schema, strict}}`, strict when the schema allows it (every object
    /// closed with `additionalProperties: false` and every property
    /// required); `json_object` when the task gives no schema. OpenAI,
    /// vLLM, llama.cpp's `llama-server`, LM Studio and Ollama accept it.
    JsonSchema,
    /// `response_format: {type: json_object, schema}`: the form
    /// llama-cpp-python's server (and other llama.cpp-family servers)
    /// constrain decoding with; they answer HTTP 500 to `json_schema`.
    JsonObjectSchema,
    /// `response_format: {type: json_object}` only: valid JSON of no
    /// particular shape.
    JsonObject,
    /// Nothing is sent; the prompt alone asks for JSON.
    None,
    /// Anthropic: a forced tool call whose `input_schema` is the schema (the
    /// tool's input is the answer). The default for `kind = "anthropic"`.
    Tool,
}

impl StructuredOutput {
    /// The mode a provider of `kind` uses when its configuration names none.
    pub fn default_for(kind: ProviderKind) -> StructuredOutput {
        match kind {
            ProviderKind::Openai => StructuredOutput::JsonSchema,
            ProviderKind::Anthropic => StructuredOutput::Tool,
        }
    }

    /// The configuration's name.
    pub fn as_str(self) -> &'static str {
        match self {
            StructuredOutput::JsonSchema => "json_schema",
            StructuredOutput::JsonObjectSchema => "json_object_schema",
            StructuredOutput::JsonObject => "json_object",
            StructuredOutput::None => "none",
            StructuredOutput::Tool => "tool",
        }
    }
}

/// One model a provider serves, with its prices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Model id as the provider knows it, e.g. `gpt-4o-mini`.
    pub name: String,
    /// Price per million prompt tokens, micro-USD (`2500000` = $2.50).
    /// Required: a model without a price would look free to approval
    /// policies. Local models say 0.
    pub input_micro_usd_per_million: Option<i64>,
    /// Price per million completion tokens, micro-USD. Required.
    pub output_micro_usd_per_million: Option<i64>,
    /// This model's [`ProviderConfig::prompt_overhead_tokens`], when it
    /// differs from its provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_overhead_tokens: Option<u64>,
    /// This model's [`ProviderConfig::tool_overhead_tokens`], when it
    /// differs from its provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_overhead_tokens: Option<u64>,
}

impl ModelConfig {
    /// A model at these per-million prices (micro-USD), with its
    /// provider's overheads.
    pub fn priced(name: impl Into<String>, input: i64, output: i64) -> ModelConfig {
        ModelConfig {
            name: name.into(),
            input_micro_usd_per_million: Some(input),
            output_micro_usd_per_million: Some(output),
            ..Default::default()
        }
    }
}

/// The default [`ProviderConfig::tool_overhead_tokens`]: above what the
/// function-calling templates measured in the tests add (llama-cpp-python's
/// `chatml-function-calling`: about 150 tokens; OpenAI's hidden tool
/// preamble is smaller).
pub const DEFAULT_TOOL_OVERHEAD_TOKENS: u64 = 256;

/// One provider endpoint.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    /// Unique name, matched against a task's `ext_agent_provider`.
    pub name: String,
    /// Wire protocol.
    pub kind: ProviderKind,
    /// Base URL up to and including the version, e.g.
    /// `https://api.openai.com/v1`, `http://127.0.0.1:11434/v1` or
    /// `https://api.anthropic.com/v1`.
    pub base_url: String,
    /// Environment variable holding the API key (sent as a bearer token,
    /// or as `x-api-key` to Anthropic);
    /// empty for servers without keys. The key never appears in logs,
    /// events or errors.
    pub api_key_env: String,
    /// TCP/TLS connect timeout, milliseconds.
    pub connect_timeout_ms: u64,
    /// Whole-request timeout, milliseconds.
    pub request_timeout_ms: u64,
    /// How structured output is asked for; by default `json_schema` for
    /// `kind = "openai"` and `tool` for `kind = "anthropic"`.
    pub structured_output: Option<StructuredOutput>,
    /// Stream answers (`stream: true` with `stream_options.include_usage`
    /// on chat completions; Anthropic's message stream): the text becomes
    /// `llm.delta` events on the job as it arrives.
    pub stream: bool,
    /// Tokens the provider adds to every prompt beyond its messages (chat
    /// template, hidden instructions), added to each reservation's prompt
    /// bound. Per model: `models[].prompt_overhead_tokens`.
    pub prompt_overhead_tokens: u64,
    /// Tokens the provider adds when tools are offered (function-calling
    /// templates describe the tools in hidden text: llama-cpp-python's
    /// `chatml-function-calling` adds about 150), on top of
    /// `prompt_overhead_tokens`. Per model: `models[].tool_overhead_tokens`.
    pub tool_overhead_tokens: u64,
    /// List the provider's models (`GET {base_url}/models`) at start-up and
    /// every `llm.model_check_interval_ms`: a configured model the provider
    /// does not serve is skipped as unavailable, so the fallback chain
    /// moves on instead of being answered (and billed) by another model.
    /// Turn off for servers without the endpoint.
    pub check_models: bool,
    /// Models served here.
    pub models: Vec<ModelConfig>,
}

impl ProviderConfig {
    /// The structured-output mode in force.
    pub fn structured_output(&self) -> StructuredOutput {
        self.structured_output
            .unwrap_or_else(|| StructuredOutput::default_for(self.kind))
    }
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            name: String::new(),
            kind: ProviderKind::Openai,
            base_url: String::new(),
            api_key_env: String::new(),
            connect_timeout_ms: 5_000,
            request_timeout_ms: 120_000,
            structured_output: None,
            stream: false,
            prompt_overhead_tokens: 0,
            tool_overhead_tokens: DEFAULT_TOOL_OVERHEAD_TOKENS,
            check_models: true,
            models: Vec::new(),
        }
    }
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only the variable's name is configuration; its value is a secret
        // and is never read here.
        f.debug_struct("ProviderConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key_env", &self.api_key_env)
            .field("structured_output", &self.structured_output())
            .field("stream", &self.stream)
            .field("models", &self.models.len())
            .finish_non_exhaustive()
    }
}

/// The `[llm]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// Providers, in preference order when several serve a model.
    pub providers: Vec<ProviderConfig>,
    /// Rounds over the fallback chain when every model was rate-limited or
    /// unavailable and one named a Retry-After that fits the deadline.
    pub max_rounds: u32,
    /// Longest Retry-After honoured, milliseconds.
    pub max_retry_after_ms: u64,
    /// How often each provider's model list is read again, milliseconds.
    pub model_check_interval_ms: u64,
    /// A streamed answer's text is sent as an `llm.delta` event at most
    /// this often, milliseconds (or sooner when `delta_max_bytes` gathered).
    pub delta_interval_ms: u64,
    /// An `llm.delta` event is sent once this many bytes gathered.
    pub delta_max_bytes: usize,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            providers: Vec::new(),
            max_rounds: 2,
            max_retry_after_ms: 30_000,
            model_check_interval_ms: 300_000,
            delta_interval_ms: 50,
            delta_max_bytes: 200,
        }
    }
}

impl LlmConfig {
    /// Every problem with the section, as `llm.…: why` lines.
    pub fn validate(&self) -> Result<(), String> {
        let mut errors = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            let at = if p.name.is_empty() {
                format!("llm.providers[{i}]")
            } else {
                format!("llm.providers.{}", p.name)
            };
            if p.name.is_empty() {
                errors.push(format!("{at}.name is required"));
            } else if !names.insert(p.name.as_str()) {
                errors.push(format!("{at}: the name is used twice"));
            }
            if !(p.base_url.starts_with("http://") || p.base_url.starts_with("https://")) {
                errors.push(format!(
                    "{at}.base_url must be an http:// or https:// URL, got {:?}",
                    p.base_url
                ));
            }
            if !p.api_key_env.is_empty()
                && !p
                    .api_key_env
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                errors.push(format!(
                    "{at}.api_key_env must be an environment variable name, not a key"
                ));
            }
            if p.request_timeout_ms == 0 || p.connect_timeout_ms == 0 {
                errors.push(format!("{at}: timeouts must be positive"));
            }
            let mode = p.structured_output();
            let fits = match p.kind {
                ProviderKind::Openai => mode != StructuredOutput::Tool,
                ProviderKind::Anthropic => {
                    matches!(mode, StructuredOutput::Tool | StructuredOutput::None)
                }
            };
            if !fits {
                errors.push(format!(
                    "{at}.structured_output {:?} does not fit kind {:?} (openai: json_schema, json_object_schema, json_object or none; anthropic: tool or none)",
                    mode.as_str(),
                    match p.kind {
                        ProviderKind::Openai => "openai",
                        ProviderKind::Anthropic => "anthropic",
                    }
                ));
            }
            if p.models.is_empty() {
                errors.push(format!("{at}.models: list at least one model"));
            }
            let mut models = std::collections::HashSet::new();
            for m in &p.models {
                if m.name.trim().is_empty() {
                    errors.push(format!("{at}.models: a model has no name"));
                    continue;
                }
                if !models.insert(m.name.as_str()) {
                    errors.push(format!("{at}.models.{}: listed twice", m.name));
                }
                match (m.input_micro_usd_per_million, m.output_micro_usd_per_million) {
                    (Some(i), Some(o)) if i >= 0 && o >= 0 => {}
                    (Some(_), Some(_)) => {
                        errors.push(format!("{at}.models.{}: prices must not be negative", m.name))
                    }
                    _ => errors.push(format!(
                        "{at}.models.{}: input_micro_usd_per_million and output_micro_usd_per_million are required (0 for a free local model)",
                        m.name
                    )),
                }
            }
        }
        if self.delta_interval_ms == 0 || self.delta_max_bytes == 0 {
            errors.push("llm.delta_interval_ms and llm.delta_max_bytes must be positive".into());
        }
        if self.model_check_interval_ms < 1_000 {
            errors.push("llm.model_check_interval_ms must be at least 1000".into());
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> ProviderConfig {
        ProviderConfig {
            name: "local".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            models: vec![ModelConfig::priced("m", 0, 0)],
            ..Default::default()
        }
    }

    #[test]
    fn a_priced_provider_is_valid_and_each_mistake_is_named() {
        let ok = LlmConfig {
            providers: vec![provider()],
            ..Default::default()
        };
        assert_eq!(ok.validate(), Ok(()));
        type Mutate = Box<dyn Fn(&mut ProviderConfig)>;
        let cases: Vec<(Mutate, &str)> = vec![
            (Box::new(|p| p.name.clear()), "name is required"),
            (
                Box::new(|p| p.base_url = "api.openai.com".into()),
                "base_url",
            ),
            (
                Box::new(|p| p.api_key_env = "sk-live-123".into()),
                "not a key",
            ),
            (Box::new(|p| p.models.clear()), "at least one model"),
            (
                Box::new(|p| p.models[0].output_micro_usd_per_million = None),
                "are required",
            ),
            (
                Box::new(|p| p.models[0].input_micro_usd_per_million = Some(-1)),
                "negative",
            ),
            (Box::new(|p| p.request_timeout_ms = 0), "positive"),
            (
                Box::new(|p| p.structured_output = Some(StructuredOutput::Tool)),
                "does not fit kind",
            ),
            (
                Box::new(|p| {
                    p.kind = ProviderKind::Anthropic;
                    p.structured_output = Some(StructuredOutput::JsonSchema);
                }),
                "does not fit kind",
            ),
        ];
        for (mutate, want) in cases {
            let mut p = provider();
            mutate(&mut p);
            let err = LlmConfig {
                providers: vec![p],
                ..Default::default()
            }
            .validate()
            .unwrap_err();
            assert!(err.contains(want), "{err} should mention {want}");
        }
        let twice = LlmConfig {
            providers: vec![provider(), provider()],
            ..Default::default()
        };
        assert!(twice.validate().unwrap_err().contains("used twice"));
    }

    #[test]
    fn debug_output_names_the_key_variable_only() {
        let mut p = provider();
        p.api_key_env = "OPENAI_API_KEY".into();
        let shown = format!("{p:?}");
        assert!(shown.contains("OPENAI_API_KEY"));
    }
}
