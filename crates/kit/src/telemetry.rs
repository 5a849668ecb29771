//! Logs and traces. Logs go to stderr, human-readable or JSON; spans are
//! exported over OTLP/gRPC when an endpoint is configured (or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set). Call [`init`] first thing and
//! [`TelemetryGuard::shutdown`] last, to flush spans.

mod counted;
mod human;

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

static OTEL_ENABLED: AtomicBool = AtomicBool::new(false);
static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// True when model calls' spans carry their messages
/// (`gen_ai.input.messages`, `gen_ai.output.messages`): only when
/// `telemetry.capture_message_content` or the conventions' own
/// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` asks — never by
/// default, since prompts hold what users typed.
pub fn capture_message_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// True when spans are exported over OTLP.
pub fn otel_enabled() -> bool {
    OTEL_ENABLED.load(Ordering::Relaxed)
}

/// A count as a span attribute. tracing-opentelemetry exports a `u64`
/// field as text and an `i64` as a number, so counts are recorded as `i64`
/// (saturating: no count here comes near 2^63).
pub fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// `[telemetry]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Log format.
    pub log_format: LogFormat,
    /// Filter directives for logs (overridden by `RUST_LOG`).
    pub log_filter: String,
    /// Filter directives for exported spans, separate from logs so quiet
    /// logs do not silence traces. The default exports Switchyard's own
    /// spans only (RPCs, jobs), not HTTP/2 and runtime internals.
    pub trace_filter: String,
    /// OTLP gRPC endpoint; when unset, `OTEL_EXPORTER_OTLP_ENDPOINT` is used.
    pub otlp_endpoint: Option<String>,
    /// `service.name` resource attribute of exported spans; empty: from the
    /// process's role (`switchyard-executor`, `switchyard-dev`, …).
    pub service_name: String,
    /// Fraction of traces exported, decided once per trace at its root (a
    /// job's trace is kept or dropped whole); 1.0 keeps every trace.
    pub trace_sample_ratio: f64,
    /// Spans buffered for export (queued or being sent); beyond it new
    /// spans are dropped and counted (`switchyard_trace_spans_dropped_total`).
    /// Sized for bursts of jobs; at least 512.
    pub span_queue: usize,
    /// Put model calls' messages on their `chat` spans
    /// (`gen_ai.input.messages`, `gen_ai.output.messages`, as the GenAI
    /// conventions name them). Off by default: prompts and completions hold
    /// what users and models wrote, and a trace backend is rarely cleared
    /// to keep them.
    pub capture_message_content: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Human,
            log_filter: "info".into(),
            trace_filter: "switchyard=info".into(),
            otlp_endpoint: None,
            service_name: String::new(),
            trace_sample_ratio: 1.0,
            span_queue: 65_536,
            capture_message_content: false,
        }
    }
}

/// Flushes telemetry on shutdown.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Flushes and stops the span exporter.
    pub fn shutdown(self) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            eprintln!("telemetry: flushing spans failed: {e}");
        }
    }
}

/// Errors initialising telemetry.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse.
    #[error("invalid log filter {0:?}: {1}")]
    Filter(String, String),
    /// The OTLP exporter could not be built.
    #[error("otlp exporter for {0}: {1}")]
    Exporter(String, String),
    /// A global subscriber is already installed.
    #[error("telemetry already initialised: {0}")]
    AlreadyInit(String),
}

/// `service.name` for a process hosting `services` (unless configured).
pub fn service_name(cfg: &TelemetryConfig, services: &[&str], dev: bool) -> String {
    if !cfg.service_name.is_empty() {
        cfg.service_name.clone()
    } else if dev {
        "switchyard-dev".into()
    } else if services.is_empty() {
        "switchyard".into()
    } else {
        format!("switchyard-{}", services.join("+"))
    }
}

/// Installs the global subscriber. Must run inside a tokio runtime when OTLP
/// export is on. `role` names the services this process hosts (the
/// `switchyard.role` resource attribute; `service.name` derives from it).
pub fn init(cfg: &TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    init_as(cfg, "switchyard", "")
}

/// Routes every panic through `tracing` at ERROR (where, and the message)
/// and counts it in `/metrics` (`switchyard_panics_total`), so a panic in a
/// request handler is seen by the log collector and alerting rather than
/// printed to stderr alone. Installed by [`init_as`]; the default hook
/// still runs after (a backtrace when `RUST_BACKTRACE` asks for one).
pub fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            crate::metrics::global().panics.inc();
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(
                at,
                message,
                "panic: this is a bug; the request it served failed"
            );
            default(info);
        }));
    });
}

/// [`init`] for a process named `service_name` in role `role`.
pub fn init_as(
    cfg: &TelemetryConfig,
    service_name: &str,
    role: &str,
) -> Result<TelemetryGuard, TelemetryError> {
    install_panic_hook();
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => {
            EnvFilter::try_new(&v).map_err(|e| TelemetryError::Filter(v, e.to_string()))?
        }
        _ => EnvFilter::try_new(&cfg.log_filter)
            .map_err(|e| TelemetryError::Filter(cfg.log_filter.clone(), e.to_string()))?,
    };
    let fmt = match cfg.log_format {
        // The message first, then its fields, the spans' and the target.
        LogFormat::Human => tracing_subscriber::fmt::layer()
            .event_format(human::MessageFirst)
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    let endpoint = cfg
        .otlp_endpoint
        .clone()
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
        .filter(|s| !s.is_empty());
    let (otel, provider) = match endpoint {
        Some(ep) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(ep.clone())
                .build()
                .map_err(|e| TelemetryError::Exporter(ep, e.to_string()))?;
            let trace_filter = EnvFilter::try_new(&cfg.trace_filter)
                .map_err(|e| TelemetryError::Filter(cfg.trace_filter.clone(), e.to_string()))?;
            let queue = cfg.span_queue.max(512);
            let batch = opentelemetry_sdk::trace::BatchConfigBuilder::default()
                .with_max_queue_size(queue)
                .with_max_export_batch_size(4_096.min(queue))
                .with_scheduled_delay(std::time::Duration::from_millis(500))
                .build();
            // Every span the queue cannot take is counted, not lost silently.
            let stats = std::sync::Arc::new(counted::Stats::default());
            let exporter = counted::Counted {
                inner: exporter,
                stats: stats.clone(),
            };
            let processor = counted::Admit {
                inner: opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
                    .with_batch_config(batch)
                    .build(),
                stats,
                cap: queue,
            };
            let ratio = cfg.trace_sample_ratio.clamp(0.0, 1.0);
            // Head sampling by trace: a job's spans share its trace id, so
            // a sampled job is exported whole.
            let sampler = opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
                opentelemetry_sdk::trace::Sampler::TraceIdRatioBased(ratio),
            ));
            let name = if cfg.service_name.is_empty() {
                service_name.to_owned()
            } else {
                cfg.service_name.clone()
            };
            let provider = SdkTracerProvider::builder()
                .with_span_processor(processor)
                .with_sampler(sampler)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(name)
                        .with_attribute(opentelemetry::KeyValue::new(
                            "switchyard.role",
                            role.to_owned(),
                        ))
                        .build(),
                )
                .build();
            let tracer = provider.tracer("switchyard");
            opentelemetry::global::set_text_map_propagator(
                opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            );
            (
                Some(
                    tracing_opentelemetry::layer()
                        .with_tracer(tracer)
                        .with_filter(trace_filter),
                ),
                Some(provider),
            )
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| TelemetryError::AlreadyInit(e.to_string()))?;
    OTEL_ENABLED.store(provider.is_some(), Ordering::Relaxed);
    let asked = std::env::var("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
        .is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    CAPTURE_CONTENT.store(cfg.capture_message_content || asked, Ordering::Relaxed);
    Ok(TelemetryGuard { provider })
}
