//! Prometheus metrics, served at `GET /metrics` on every Switchyard port in
//! the Prometheus text format (prometheus-client).
//!
//! Counters and histograms are process-wide ([`global`]) and updated where
//! the thing happens (the RPC layer, the executor, the ledger, the LLM
//! client, the store). Gauges that describe state — jobs by state, runs
//! waiting for approval, money held on budgets, agents by status — are read
//! from each service at scrape time through a [`Gauges`] source it
//! registers, so they can never drift from the state itself.
//!
//! Labels are bounded: services, methods, codes, states, reasons, models
//! and tenants, never job, run, budget or agent ids.
//!
//! `/metrics` is not open: it needs `metrics.read` (admins, operators and
//! the cluster's service token, which is what Prometheus scrapes with).
//! Series labelled with a tenant are shown only to that tenant's
//! principals and to the service token.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `service`, `method` and gRPC `code` of a finished RPC.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// `executor`, `ledger`, … (`grpc` for health and reflection).
    pub service: String,
    /// `SubmitJob`, `Reserve`, …
    pub method: String,
    /// `OK`, `NOT_FOUND`, …
    pub code: String,
}

/// `service` and `method`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// Service.
    pub service: String,
    /// Method.
    pub method: String,
}

/// One label named `kind` (task kinds, outcomes).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    /// `command`, `agent` or `llm`.
    pub kind: String,
}

/// An agent and how a call of it ended.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentCallLabels {
    /// The registered agent id.
    pub agent_id: String,
    /// `success`, `error`, `refused`, `timeout`, `unreachable`, …
    pub outcome: String,
}

/// How a load of the policy set ended.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLoadLabels {
    /// `loaded` (the new set is in force) or `refused` (it did not
    /// validate; the set in force stayed).
    pub outcome: String,
}

/// One agent.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabels {
    /// The registered agent id.
    pub agent_id: String,
}

/// A catalogued reason.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `BUDGET_EXCEEDED`, `CAPABILITY_UNAVAILABLE`, …
    pub reason: String,
}

/// A rate-limit bucket: its limit and scope (`shared`, `tenant:<t>`, …).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// The limit's name (empty: an upstream key's cooldown bucket).
    pub limit: String,
    /// The bucket's scope.
    pub scope: String,
}

/// One dimension of a rate-limit bucket.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitUseLabels {
    /// The limit's name.
    pub limit: String,
    /// The bucket's scope.
    pub scope: String,
    /// `requests_per_minute`, `tokens_per_minute`, `tokens_per_day` or
    /// `concurrent`.
    pub dimension: String,
}

/// An LLM model at a provider.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// Provider name from the configuration.
    pub provider: String,
    /// Model name.
    pub model: String,
}

/// A model call's tokens of one direction, labelled as the OpenTelemetry
/// GenAI semantic conventions' `gen_ai.client.token.usage` (Prometheus
/// spells the attributes' dots as underscores).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GenAiTokenLabels {
    /// `chat`.
    pub gen_ai_operation_name: String,
    /// `openai` or `anthropic` (the provider's wire protocol).
    pub gen_ai_provider_name: String,
    /// The model asked for (a configured model).
    pub gen_ai_request_model: String,
    /// `input` or `output`.
    pub gen_ai_token_type: String,
}

/// A model call, labelled as `gen_ai.client.operation.duration`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GenAiCallLabels {
    /// `chat`.
    pub gen_ai_operation_name: String,
    /// `openai` or `anthropic`.
    pub gen_ai_provider_name: String,
    /// The model asked for (a configured model).
    pub gen_ai_request_model: String,
    /// The failure's kind (`rate_limited`, `timeout`, …); absent for an
    /// answered call.
    pub error_type: Option<String>,
}

/// An LLM call's model and outcome (`ok` or an error kind).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LlmCallLabels {
    /// Provider name.
    pub provider: String,
    /// Model name.
    pub model: String,
    /// `ok`, `rate_limited`, `unavailable`, `model_not_found`, `error`.
    pub outcome: String,
}

/// Tokens of one direction.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// Provider name.
    pub provider: String,
    /// Model name.
    pub model: String,
    /// `prompt` or `completion`.
    pub direction: String,
}

/// A state of some state machine.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// The state's short name.
    pub state: String,
}

/// How a person (or a policy) decided a run.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `approved` or `rejected`.
    pub decision: String,
}

/// A tenant's budgets (the sum over its root budgets).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    /// The tenant.
    pub tenant: String,
}

/// One RPC method's series: its latency and its OK count at hand, other
/// codes through the family.
pub(crate) struct MethodMetrics {
    labels: MethodLabels,
    duration: Histogram,
    ok: Counter,
}

impl MethodMetrics {
    /// Counts a finished call.
    pub(crate) fn done(&self, code: tonic::Code, took: Duration) {
        self.duration.observe(took.as_secs_f64());
        if code == tonic::Code::Ok {
            self.ok.inc();
            return;
        }
        global()
            .rpc_requests
            .get_or_create(&RpcLabels {
                service: self.labels.service.clone(),
                method: self.labels.method.clone(),
                code: code_name(code).into(),
            })
            .inc();
    }
}

/// Every metric a Switchyard process exports.
pub struct Metrics {
    registry: Registry,
    /// RPCs finished, by service, method and code.
    pub rpc_requests: Family<RpcLabels, Counter>,
    /// RPC latency (until the response headers), by service and method.
    pub rpc_duration: Family<MethodLabels, Histogram>,
    /// Jobs that ended, by final state.
    pub jobs_finished: Family<StateLabels, Counter>,
    /// Tasks started, by kind.
    pub tasks_started: Family<TaskLabels, Counter>,
    /// Tasks that succeeded, by kind.
    pub tasks_succeeded: Family<TaskLabels, Counter>,
    /// Tasks that failed for good, by kind.
    pub tasks_failed: Family<TaskLabels, Counter>,
    /// Reservations the ledger refused, by reason.
    pub ledger_refusals: Family<ReasonLabels, Counter>,
    /// Routing decisions, by outcome (`routed` or `CAPABILITY_UNAVAILABLE`).
    pub routing_decisions: Family<ReasonLabels, Counter>,
    /// LLM calls, by provider, model and outcome.
    pub llm_calls: Family<LlmCallLabels, Counter>,
    /// LLM tokens, by provider, model and direction.
    pub llm_tokens: Family<TokenLabels, Counter>,
    /// LLM cost in micro-USD, by provider and model.
    pub llm_cost_micro_usd: Family<ModelLabels, Counter>,
    /// Times a chain moved on to its next model, by the model that failed.
    pub llm_fallbacks: Family<ModelLabels, Counter>,
    /// Time to make a group of store writes durable (fsync).
    pub store_flush: Histogram,
    /// Jobs from submission to their end, by final state.
    pub job_duration: Family<StateLabels, Histogram>,
    /// Runs from proposal to their approval or rejection.
    pub approval_wait: Family<DecisionLabels, Histogram>,
    /// Jobs not yet finished, by OJS state (scrape time).
    pub jobs: Family<StateLabels, Gauge>,
    /// Jobs waiting to run: pending approval or available.
    pub queue_depth: Gauge,
    /// Age in seconds of the oldest job waiting for approval.
    pub oldest_pending_seconds: Gauge,
    /// Runs waiting for a person.
    pub approvals_pending: Gauge,
    /// Age in seconds of the oldest run waiting for a person.
    pub oldest_approval_seconds: Gauge,
    /// Money held by open reservations, by tenant (root budgets), micro-USD.
    pub budget_reserved_micro_usd: Family<BudgetLabels, Gauge>,
    /// Money committed (spent), by tenant, micro-USD.
    pub budget_spent_micro_usd: Family<BudgetLabels, Counter>,
    /// Registered agents by status.
    pub agents: Family<StateLabels, Gauge>,
    /// Agent invocations (tasks, tool calls, handoff turns), by agent and
    /// outcome.
    pub agent_calls: Family<AgentCallLabels, Counter>,
    /// Changes of the policy directory loaded or refused.
    pub policy_loads: Family<PolicyLoadLabels, Counter>,
    /// Tokens agents reported using, by agent.
    pub agent_tokens: Family<AgentLabels, Counter>,
    /// Money charged for agent calls, by agent, micro-USD.
    pub agent_cost_micro_usd: Family<AgentLabels, Counter>,
    /// Panics caught by the process's panic hook (each is a bug: a request
    /// that panics is answered as an internal error, never silently).
    pub panics: Counter,
    /// Spans dropped because the export queue was full
    /// (`telemetry.span_queue`): a trace missing spans is counted here.
    pub trace_spans_dropped: Counter,
    /// Spans the OTLP collector accepted.
    pub trace_spans_exported: Counter,
    /// Spans whose export failed (collector unreachable or refusing).
    pub trace_spans_export_failed: Counter,
    /// `gen_ai.client.token.usage`: tokens per model call, by direction.
    pub gen_ai_token_usage: Family<GenAiTokenLabels, Histogram>,
    /// `gen_ai.client.operation.duration`: model calls' time, seconds.
    pub gen_ai_operation_duration: Family<GenAiCallLabels, Histogram>,
    /// What each rate-limit bucket holds now, per dimension (the ledger).
    pub rate_limit_used: Family<LimitUseLabels, Gauge>,
    /// Each rate-limit bucket's limit, per dimension (the ledger).
    pub rate_limit_capacity: Family<LimitUseLabels, Gauge>,
    /// Calls waiting on each bucket now (the ledger).
    pub rate_limit_waiting: Family<LimitLabels, Gauge>,
    /// Times a model call was told to wait, by the bucket that refused
    /// (the ledger).
    pub rate_limit_waits: Family<LimitLabels, Counter>,
    /// Model calls refused for good (larger than the limit), or given up
    /// after waiting as long as allowed, by bucket.
    pub rate_limit_refusals: Family<LimitLabels, Counter>,
    /// How long model calls waited for rate-limit room before going
    /// (the executor).
    pub rate_limit_wait_seconds: Histogram,
    /// Transactions the ledger's PostgreSQL writers ran (one per batch of
    /// writes, again after a retryable failure).
    pub ledger_pg_transactions: Counter,
    /// Round trips to PostgreSQL those transactions made (pipelined
    /// statements count once; statement preparation, once per connection,
    /// is not counted).
    pub ledger_pg_round_trips: Counter,
    sources: Mutex<Vec<Weak<dyn Gauges>>>,
    /// Per-method series, by service then method.
    methods: std::sync::RwLock<HashMap<String, HashMap<String, Arc<MethodMetrics>>>>,
}

/// A service's state-describing gauges, set at scrape time.
pub trait Gauges: Send + Sync {
    /// Sets this source's gauges in `m` (they were cleared just before).
    fn set(&self, m: &Metrics);
}

static GLOBAL: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn global() -> &'static Metrics {
    &GLOBAL
}

impl Metrics {
    fn new() -> Metrics {
        // Switchyard's own metrics are `switchyard_*`; the GenAI
        // conventions' keep their names (`gen_ai_*`).
        let mut root = Registry::default();
        let r = root.sub_registry_with_prefix("switchyard");
        let seconds = || Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        let m = Metrics {
            rpc_requests: Family::default(),
            rpc_duration: Family::new_with_constructor(seconds),
            jobs_finished: Family::default(),
            tasks_started: Family::default(),
            tasks_succeeded: Family::default(),
            tasks_failed: Family::default(),
            ledger_refusals: Family::default(),
            routing_decisions: Family::default(),
            llm_calls: Family::default(),
            llm_tokens: Family::default(),
            llm_cost_micro_usd: Family::default(),
            llm_fallbacks: Family::default(),
            store_flush: seconds(),
            // 10 ms to ~3 h.
            job_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.01, 2.0, 21))
            }),
            // 1 ms (a policy's own decision) to ~36 h.
            approval_wait: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 28))
            }),
            jobs: Family::default(),
            queue_depth: Gauge::default(),
            oldest_pending_seconds: Gauge::default(),
            approvals_pending: Gauge::default(),
            oldest_approval_seconds: Gauge::default(),
            budget_reserved_micro_usd: Family::default(),
            budget_spent_micro_usd: Family::default(),
            agents: Family::default(),
            agent_calls: Family::default(),
            policy_loads: Family::default(),
            agent_tokens: Family::default(),
            agent_cost_micro_usd: Family::default(),
            panics: Counter::default(),
            trace_spans_dropped: Counter::default(),
            trace_spans_exported: Counter::default(),
            trace_spans_export_failed: Counter::default(),
            // The buckets the GenAI conventions advise.
            gen_ai_token_usage: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1.0, 4.0, 14))
            }),
            gen_ai_operation_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.01, 2.0, 14))
            }),
            rate_limit_used: Family::default(),
            rate_limit_capacity: Family::default(),
            rate_limit_waiting: Family::default(),
            rate_limit_waits: Family::default(),
            rate_limit_refusals: Family::default(),
            rate_limit_wait_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            ledger_pg_transactions: Counter::default(),
            ledger_pg_round_trips: Counter::default(),
            sources: Mutex::new(Vec::new()),
            methods: Default::default(),
            registry: Registry::default(),
        };
        r.register(
            "rpc_requests",
            "RPCs finished, by service, method and gRPC code",
            m.rpc_requests.clone(),
        );
        r.register(
            "rpc_duration_seconds",
            "RPC latency until the response starts, by service and method",
            m.rpc_duration.clone(),
        );
        r.register(
            "jobs_finished",
            "Jobs that ended, by final state (completed, discarded, cancelled)",
            m.jobs_finished.clone(),
        );
        r.register(
            "tasks_started",
            "Tasks started, by kind",
            m.tasks_started.clone(),
        );
        r.register(
            "tasks_succeeded",
            "Tasks that succeeded, by kind",
            m.tasks_succeeded.clone(),
        );
        r.register(
            "tasks_failed",
            "Tasks that failed for good, by kind",
            m.tasks_failed.clone(),
        );
        r.register(
            "ledger_refusals",
            "Reservations the ledger refused, by reason",
            m.ledger_refusals.clone(),
        );
        r.register(
            "routing_decisions",
            "Routing decisions, by outcome (routed or CAPABILITY_UNAVAILABLE)",
            m.routing_decisions.clone(),
        );
        r.register(
            "llm_calls",
            "LLM calls, by provider, model and outcome",
            m.llm_calls.clone(),
        );
        r.register(
            "llm_tokens",
            "LLM tokens, by provider, model and direction",
            m.llm_tokens.clone(),
        );
        r.register(
            "llm_cost_micro_usd",
            "LLM cost in micro-USD, by provider and model",
            m.llm_cost_micro_usd.clone(),
        );
        r.register(
            "llm_fallbacks",
            "Times a model chain moved past a model, by that model",
            m.llm_fallbacks.clone(),
        );
        r.register(
            "job_duration_seconds",
            "Jobs from submission to their end (approval waits included), by final state",
            m.job_duration.clone(),
        );
        r.register(
            "approval_wait_seconds",
            "Runs from proposal to their approval or rejection (by a person or a policy), by decision",
            m.approval_wait.clone(),
        );
        r.register(
            "store_flush_seconds",
            "Time to make a group of store writes durable",
            m.store_flush.clone(),
        );
        r.register(
            "jobs",
            "Jobs not yet finished, by OJS state",
            m.jobs.clone(),
        );
        r.register(
            "queue_depth",
            "Jobs waiting to run (pending approval or available)",
            m.queue_depth.clone(),
        );
        r.register(
            "oldest_pending_job_seconds",
            "Age of the oldest job waiting for approval",
            m.oldest_pending_seconds.clone(),
        );
        r.register(
            "approvals_pending",
            "Runs waiting for a person's decision",
            m.approvals_pending.clone(),
        );
        r.register(
            "oldest_approval_seconds",
            "Age of the oldest run waiting for a person",
            m.oldest_approval_seconds.clone(),
        );
        r.register(
            "rate_limit_used",
            "What each rate-limit bucket holds now, by limit, scope and dimension",
            m.rate_limit_used.clone(),
        );
        r.register(
            "rate_limit_capacity",
            "Each rate-limit bucket's limit, by limit, scope and dimension",
            m.rate_limit_capacity.clone(),
        );
        r.register(
            "rate_limit_waiting",
            "Model calls waiting on a rate-limit bucket now",
            m.rate_limit_waiting.clone(),
        );
        r.register(
            "rate_limit_waits",
            "Times a model call was told to wait by a rate-limit bucket",
            m.rate_limit_waits.clone(),
        );
        r.register(
            "rate_limit_refusals",
            "Model calls a rate limit refused for good or that waited as long as allowed",
            m.rate_limit_refusals.clone(),
        );
        r.register(
            "rate_limit_wait_seconds",
            "How long model calls waited for rate-limit room before going",
            m.rate_limit_wait_seconds.clone(),
        );
        r.register(
            "ledger_pg_transactions",
            "Transactions the ledger's PostgreSQL writers ran",
            m.ledger_pg_transactions.clone(),
        );
        r.register(
            "ledger_pg_round_trips",
            "Round trips to PostgreSQL the ledger's write transactions made (pipelined statements count once)",
            m.ledger_pg_round_trips.clone(),
        );
        r.register(
            "budget_reserved_micro_usd",
            "Money held by open reservations on root budgets, by tenant",
            m.budget_reserved_micro_usd.clone(),
        );
        r.register(
            "budget_spent_micro_usd",
            "Money committed on budgets, by tenant",
            m.budget_spent_micro_usd.clone(),
        );
        r.register("agents", "Registered agents by status", m.agents.clone());
        r.register(
            "policy_loads",
            "Changes of the policy directory, by outcome: loaded (in force) or refused (invalid; the set in force stayed)",
            m.policy_loads.clone(),
        );
        r.register(
            "agent_calls",
            "Agent invocations (agent tasks, agent tool calls, handoff turns), by agent and outcome",
            m.agent_calls.clone(),
        );
        r.register(
            "agent_tokens",
            "Tokens agents reported using, by agent",
            m.agent_tokens.clone(),
        );
        r.register(
            "agent_cost_micro_usd",
            "Money charged for agent calls, by agent, micro-USD",
            m.agent_cost_micro_usd.clone(),
        );
        r.register(
            "panics",
            "Panics in this process (each one a bug; logged at ERROR with where it happened)",
            m.panics.clone(),
        );
        r.register(
            "trace_spans_dropped",
            "Spans dropped because the span export queue was full (telemetry.span_queue)",
            m.trace_spans_dropped.clone(),
        );
        r.register(
            "trace_spans_exported",
            "Spans the OTLP collector accepted",
            m.trace_spans_exported.clone(),
        );
        r.register(
            "trace_spans_export_failed",
            "Spans whose OTLP export failed (collector unreachable or refusing)",
            m.trace_spans_export_failed.clone(),
        );
        root.register(
            "gen_ai_client_token_usage",
            "Tokens used per model call, by direction (OpenTelemetry GenAI gen_ai.client.token.usage)",
            m.gen_ai_token_usage.clone(),
        );
        root.register_with_unit(
            "gen_ai_client_operation_duration",
            "Model calls' duration (OpenTelemetry GenAI gen_ai.client.operation.duration)",
            prometheus_client::registry::Unit::Seconds,
            m.gen_ai_operation_duration.clone(),
        );
        Metrics {
            registry: root,
            ..m
        }
    }

    /// Registers a source of gauges, read at every scrape while it lives.
    pub fn add_gauges<G: Gauges + 'static>(&self, source: &Arc<G>) {
        let weak: Weak<G> = Arc::downgrade(source);
        let weak: Weak<dyn Gauges> = weak;
        let mut s = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        s.retain(|w| w.strong_count() > 0);
        s.push(weak);
    }

    /// Counts one finished RPC.
    pub fn rpc(&self, service: &str, method: &str, code: tonic::Code, took: Duration) {
        self.method(service, method).done(code, took);
    }

    /// The metrics of one RPC method, made once and then looked up without
    /// allocating: every RPC passes through here.
    pub(crate) fn method(&self, service: &str, method: &str) -> Arc<MethodMetrics> {
        let read = self.methods.read().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = read.get(service).and_then(|by| by.get(method)) {
            return m.clone();
        }
        drop(read);
        let mut write = self.methods.write().unwrap_or_else(|e| e.into_inner());
        let labels = MethodLabels {
            service: service.into(),
            method: method.into(),
        };
        let made = Arc::new(MethodMetrics {
            duration: self.rpc_duration.get_or_create(&labels).clone(),
            ok: self
                .rpc_requests
                .get_or_create(&RpcLabels {
                    service: service.into(),
                    method: method.into(),
                    code: code_name(tonic::Code::Ok).into(),
                })
                .clone(),
            labels,
        });
        write
            .entry(service.to_owned())
            .or_default()
            .entry(method.to_owned())
            .or_insert(made)
            .clone()
    }

    /// The Prometheus text exposition of everything, gauges read now.
    pub fn render(&self) -> String {
        // One scrape at a time: gauges are cleared and set as a whole.
        let sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        self.jobs.clear();
        self.agents.clear();
        self.budget_reserved_micro_usd.clear();
        self.rate_limit_used.clear();
        self.rate_limit_capacity.clear();
        self.rate_limit_waiting.clear();
        for g in [
            &self.queue_depth,
            &self.oldest_pending_seconds,
            &self.approvals_pending,
            &self.oldest_approval_seconds,
        ] {
            g.set(0);
        }
        for s in sources.iter().filter_map(Weak::upgrade) {
            s.set(self);
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// The Content-Type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// gRPC code names as the gRPC spec spells them (`NOT_FOUND`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Counts `resp` once it ends: its gRPC code comes from the headers (an
/// error answered at once) or from the trailers at the end of the body
/// (every other answer, streams included); a body dropped before its end is
/// a CANCELLED call. The duration runs to that end.
pub(crate) fn metered(
    resp: http::Response<tonic::body::Body>,
    method: Arc<MethodMetrics>,
    start: std::time::Instant,
) -> http::Response<tonic::body::Body> {
    let record = Record { method, start };
    if let Some(code) = grpc_code(resp.headers()) {
        record.done(code);
        return resp;
    }
    resp.map(|inner| {
        tonic::body::Body::new(Metered {
            inner,
            record: Some(record),
        })
    })
}

struct Record {
    method: Arc<MethodMetrics>,
    start: std::time::Instant,
}

impl Record {
    fn done(self, code: tonic::Code) {
        self.method.done(code, self.start.elapsed());
    }
}

fn grpc_code(h: &http::HeaderMap) -> Option<tonic::Code> {
    h.get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(tonic::Code::from)
}

struct Metered {
    inner: tonic::body::Body,
    record: Option<Record>,
}

impl http_body::Body for Metered {
    type Data = <tonic::body::Body as http_body::Body>::Data;
    type Error = <tonic::body::Body as http_body::Body>::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        let code = match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => frame
                .trailers_ref()
                .map(|t| grpc_code(t).unwrap_or(tonic::Code::Ok)),
            std::task::Poll::Ready(Some(Err(_))) => Some(tonic::Code::Internal),
            std::task::Poll::Ready(None) => Some(tonic::Code::Ok),
            std::task::Poll::Pending => None,
        };
        if let Some(code) = code
            && let Some(r) = self.record.take()
        {
            r.done(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        if let Some(r) = self.record.take() {
            r.done(tonic::Code::Cancelled);
        }
    }
}

/// The `GET /metrics` route, for every server's HTTP side. The RPC layer
/// has authenticated the caller and checked `metrics.read` already.
pub fn router() -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(
            |principal: Option<axum::Extension<Arc<crate::auth::Principal>>>| async move {
                let text = match principal {
                    Some(axum::Extension(p)) => scrape_for(&p),
                    // Servers without authentication (tests, benches).
                    None => global().render(),
                };
                ([(http::header::CONTENT_TYPE, CONTENT_TYPE)], text)
            },
        ),
    )
}

/// This process's metrics as `p` may read them: the series of tenants it
/// does not see left out (`/metrics` on every port, the HTTP door's too).
pub fn scrape_for(p: &crate::auth::Principal) -> String {
    visible(&global().render(), |t| p.sees_tenant(t))
}

/// `text` without the series of tenants `sees` refuses.
fn visible(text: &str, sees: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let tenant = line
            .split_once("tenant=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(t, _)| t);
        if line.starts_with('#') || tenant.is_none_or(&sees) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two;
    impl Gauges for Two {
        fn set(&self, m: &Metrics) {
            m.jobs
                .get_or_create(&StateLabels {
                    state: "active".into(),
                })
                .set(2);
        }
    }

    #[test]
    fn counters_histograms_and_scrape_time_gauges_render_as_prometheus_text() {
        let m = global();
        m.rpc(
            "ledger",
            "Reserve",
            tonic::Code::Ok,
            Duration::from_millis(3),
        );
        let source = Arc::new(Two);
        m.add_gauges(&source);
        let text = m.render();
        assert!(
            text.contains("# TYPE switchyard_rpc_requests_total counter"),
            "{text}"
        );
        assert!(
            text.contains(
                r#"switchyard_rpc_requests_total{service="ledger",method="Reserve",code="OK"}"#
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE switchyard_rpc_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(r#"switchyard_jobs{state="active"} 2"#),
            "{text}"
        );
        // Each tenant sees its own tenant's series only.
        let both = "a 1\nb{tenant=\"t1\"} 2\nb{tenant=\"t2\"} 3\n";
        assert_eq!(visible(both, |t| t == "t1"), "a 1\nb{tenant=\"t1\"} 2\n");
        // A source that is gone no longer counts.
        drop(source);
        assert!(!m.render().contains(r#"switchyard_jobs{state="active"}"#));
    }

    /// Every sample name the registry exports, with its label names, once
    /// each family has a sample.
    fn exported() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
        let m = Metrics::new();
        m.rpc_requests.get_or_create(&RpcLabels::default()).inc();
        m.rpc_duration
            .get_or_create(&MethodLabels::default())
            .observe(0.1);
        m.jobs_finished.get_or_create(&StateLabels::default()).inc();
        for f in [&m.tasks_started, &m.tasks_succeeded, &m.tasks_failed] {
            f.get_or_create(&TaskLabels::default()).inc();
        }
        for f in [&m.ledger_refusals, &m.routing_decisions] {
            f.get_or_create(&ReasonLabels::default()).inc();
        }
        m.llm_calls.get_or_create(&LlmCallLabels::default()).inc();
        m.llm_tokens.get_or_create(&TokenLabels::default()).inc();
        for f in [&m.llm_cost_micro_usd, &m.llm_fallbacks] {
            f.get_or_create(&ModelLabels::default()).inc();
        }
        m.store_flush.observe(0.1);
        m.job_duration
            .get_or_create(&StateLabels::default())
            .observe(1.0);
        m.approval_wait
            .get_or_create(&DecisionLabels::default())
            .observe(1.0);
        for f in [&m.jobs, &m.agents] {
            f.get_or_create(&StateLabels::default()).set(1);
        }
        m.budget_reserved_micro_usd
            .get_or_create(&BudgetLabels::default())
            .set(1);
        m.budget_spent_micro_usd
            .get_or_create(&BudgetLabels::default())
            .inc();
        m.agent_calls
            .get_or_create(&AgentCallLabels::default())
            .inc();
        m.policy_loads
            .get_or_create(&PolicyLoadLabels::default())
            .inc();
        for f in [&m.agent_tokens, &m.agent_cost_micro_usd] {
            f.get_or_create(&AgentLabels::default()).inc();
        }
        m.panics.inc();
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &m.registry)
            .expect("encodes");
        let mut out: std::collections::BTreeMap<_, std::collections::BTreeSet<String>> =
            Default::default();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let labels = out.entry(line[..name_end].to_owned()).or_default();
            if let Some(inner) = line[name_end..]
                .strip_prefix('{')
                .and_then(|r| r.split_once('}'))
                .map(|(l, _)| l)
            {
                for pair in inner.split(',').filter(|p| !p.is_empty()) {
                    if let Some((k, _)) = pair.split_once('=') {
                        labels.insert(k.to_owned());
                    }
                }
            }
        }
        out
    }

    /// The words of a PromQL expression made of `[A-Za-z0-9_]`, with what
    /// follows each (to tell a metric from a function call).
    fn words(expr: &str) -> Vec<(&str, &str)> {
        let mut out = Vec::new();
        let mut start = None;
        for (i, c) in expr.char_indices() {
            let word = c.is_ascii_alphanumeric() || c == '_';
            match (word, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    out.push((&expr[s..i], &expr[i..]));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            out.push((&expr[s..], ""));
        }
        out
    }

    #[test]
    fn the_grafana_dashboard_asks_only_for_metrics_and_labels_this_code_exports() {
        let exported = exported();
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../../deploy/grafana/switchyard.json"))
                .expect("the dashboard is JSON");
        let panels = dashboard["panels"].as_array().expect("panels");
        assert!(panels.len() >= 10, "{} panels", panels.len());
        let mut asked = std::collections::BTreeSet::new();
        for p in panels {
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{}: no query", p["title"]);
            for t in targets {
                let expr = t["expr"].as_str().expect("expr");
                let metrics: Vec<&str> = words(expr)
                    .into_iter()
                    .map(|(w, _)| w)
                    .filter(|w| w.starts_with("switchyard_"))
                    .collect();
                assert!(!metrics.is_empty(), "{expr}: no Switchyard metric");
                let mut labels = std::collections::BTreeSet::new();
                for name in &metrics {
                    let Some(l) = exported.get(*name) else {
                        panic!(
                            "{expr}: {name} is not exported (exported: {:?})",
                            exported.keys()
                        );
                    };
                    labels.extend(l.iter().cloned());
                    asked.insert(name.to_string());
                }
                // Labels in `by (...)` and in `{...}` matchers must be the
                // metrics' own.
                let mut rest = expr;
                while let Some(i) = rest.find("by (") {
                    let (inner, after) = rest[i + 4..].split_once(')').expect("closed by");
                    for l in inner.split(',').map(str::trim) {
                        assert!(labels.contains(l), "{expr}: no label {l:?} on {metrics:?}");
                    }
                    rest = after;
                }
                let mut rest = expr;
                while let Some(i) = rest.find('{') {
                    let (inner, after) = rest[i + 1..].split_once('}').expect("closed matcher");
                    for m in inner.split(',') {
                        let l = m.split(['=', '!', '~']).next().unwrap_or_default().trim();
                        assert!(labels.contains(l), "{expr}: no label {l:?} on {metrics:?}");
                    }
                    rest = after;
                }
            }
        }
        for must in [
            "switchyard_job_duration_seconds_bucket",
            "switchyard_approval_wait_seconds_bucket",
            "switchyard_llm_cost_micro_usd_total",
            "switchyard_agent_cost_micro_usd_total",
        ] {
            assert!(asked.contains(must), "the dashboard shows no {must}");
        }
    }
}
