//! OTLP export from a real `switchyard dev` process: the RPC span reaches an
//! OTLP collector, continues the caller's W3C trace, is named
//! `<service>.<rpc>` and carries the correlation id.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use crate::support::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use switchyard_proto::registry::v1::ListAgentsRequest;
use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;

#[derive(Clone, Default)]
/// Every exported span, with the `service.name` of the process that sent it.
struct Sink(Arc<Mutex<Vec<(String, Span)>>>);

impl Sink {
    fn spans(&self) -> Vec<Span> {
        let named = self.0.lock().unwrap();
        named.iter().map(|(_, s)| s.clone()).collect()
    }
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut named = self.0.lock().expect("sink lock");
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .and_then(|a| a.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                named.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Spans every job's trace holds, across the services it calls. (A job
/// a policy approves has its run claimed by the proposal: no
/// `approval.Claim`, which [`no_claim`] checks.)
const JOB_SPANS: [&str; 7] = [
    "executor.SubmitJob",
    "executor.job",
    "ledger.CreateBudget",
    "approval.Propose",
    "router.Route",
    "ledger.Reserve",
    "approval.Complete",
];

/// A policy-approved job's run is claimed with its proposal: its trace
/// holds no separate Claim call.
fn no_claim(names: &[&str]) -> Option<String> {
    names
        .contains(&"approval.Claim")
        .then(|| format!("approval.Claim in a policy-approved job's trace: {names:?}"))
}

/// SubmitJob of `document`, continuing trace `trace_id` (W3C traceparent).
fn in_trace(
    document: &str,
    trace_id: &str,
) -> tonic::Request<switchyard_proto::executor::v1::SubmitJobRequest> {
    let mut req = tonic::Request::new(switchyard_proto::executor::v1::SubmitJobRequest {
        document: document.into(),
        ..Default::default()
    });
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-b7ad6b7169203331-01")
            .parse()
            .unwrap(),
    );
    req
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OTLP collector on an ephemeral port: (sink, endpoint, stop, server).
async fn collector() -> (
    Sink,
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let sink = Sink::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink_addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(sink.clone()))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stop_rx.await;
                },
            ),
    );
    (sink, format!("http://{sink_addr}"), stop_tx, server)
}

/// Every service but the executor in one `serve` process, the executor in
/// another (with `config`, if any), both exporting spans to `endpoint`;
/// returns once the built-in agents route.
fn split_exporting_to(endpoint: &str, dir: &std::path::Path, config: Option<&str>) -> (Proc, Proc) {
    let otel = ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    let data = |n: &str| dir.join(n).to_str().unwrap().to_owned();
    let (d1, d2) = (data("others"), data("executor"));
    let serve = |services: &str, data: &str, config: Option<&str>, env: &[(&str, &str)]| {
        let mut args = vec![
            "serve",
            "--services",
            services,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
        ];
        if let Some(c) = config {
            args.extend(["--config", c]);
        }
        Proc::start(&args, env)
    };
    let others = serve("registry,router,ledger,approval,auth", &d1, None, &[otel]);
    let url = others.url();
    let x = serve(
        "executor",
        &d2,
        config,
        &[
            otel,
            ("SWITCHYARD_TEST_LLM_KEY", "sk-test-trace"),
            ("SWITCHYARD_AUTH__KEYS_URL", &url),
            ("SWITCHYARD_EXECUTOR__REGISTRY_URL", &url),
            ("SWITCHYARD_EXECUTOR__ROUTER_URL", &url),
            ("SWITCHYARD_EXECUTOR__LEDGER_URL", &url),
            ("SWITCHYARD_EXECUTOR__APPROVAL_URL", &url),
            ("SWITCHYARD_EXECUTOR__APPROVAL_POLL_MS", "50"),
        ],
    );
    wait_for(
        "built-in agents routable",
        std::time::Duration::from_secs(20),
        || routed(&url, &["--capability", "builtin.echo"]).is_some_and(|ids| !ids.is_empty()),
    );
    (others, x)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_covers_a_job_across_the_services_it_calls() {
    use switchyard_proto::executor::v1::WatchJobRequest;
    use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
    use tokio_stream::StreamExt;

    let (sink, endpoint, stop_tx, server) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let (others, x) = split_exporting_to(&endpoint, dir.path(), None);
    let url = others.url();
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let mut c = JobServiceClient::new(switchyard_kit::client::authed(
        switchyard_kit::client::connect(&x.url()).await.unwrap(),
        switchyard_kit::client::Credential::bearer(&token(&url, "alice")).ok(),
    ));
    let doc = r#"{"job_id":"traced","tasks":[{"id":"a","agent":{"capability":"builtin.echo","input":{"text":"hi"}}}]}"#;
    c.submit_job(in_trace(doc, trace_id)).await.unwrap();
    let mut w = c
        .watch_job(WatchJobRequest {
            job_id: "traced".into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while w.next().await.is_some() {}
    assert_eq!(x.terminate(), Some(0));
    assert_eq!(others.terminate(), Some(0));

    let spans = sink.spans();
    let in_trace: Vec<&str> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .map(|s| s.name.as_str())
        .collect();
    for want in JOB_SPANS {
        assert!(
            in_trace.contains(&want),
            "{want} not in the job's trace: {in_trace:?}"
        );
    }
    assert_eq!(no_claim(&in_trace), None);
    // The agent call as the GenAI conventions name it, and the routing
    // decision that chose the agent, both children of the task.
    let span = |name: &str| {
        spans
            .iter()
            .find(|s| hex(&s.trace_id) == trace_id && s.name == name)
            .unwrap_or_else(|| panic!("no {name} in {in_trace:?}"))
    };
    let task = span("executor.task");
    let invoked = span("invoke_agent builtin");
    assert_eq!(invoked.parent_span_id, task.span_id);
    assert_eq!(invoked.kind, 3, "invoke_agent is a CLIENT span");
    assert_eq!(
        attr(invoked, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(attr(invoked, "gen_ai.agent.id").as_deref(), Some("builtin"));
    assert_eq!(
        attr(invoked, "switchyard.capability").as_deref(),
        Some("builtin.echo")
    );
    assert_eq!(
        attr(invoked, "switchyard.agent.status").as_deref(),
        Some("RESPONSE_STATUS_SUCCESS")
    );
    let routed = span("switchyard.route");
    assert_eq!(routed.parent_span_id, task.span_id);
    assert_eq!(
        attr(routed, "switchyard.route.agent_id").as_deref(),
        Some("builtin")
    );
    assert_eq!(int_attr(routed, "switchyard.route.candidates"), Some(1));
    assert!(
        spans
            .iter()
            .any(|s| s.name == "router.Route" && s.parent_span_id == routed.span_id),
        "the router's span is the routing decision's child"
    );
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_spans_are_exported_over_otlp_continuing_the_callers_trace() {
    let (sink, endpoint, stop_tx, server) = collector().await;
    let (dev, _data) = Proc::dev(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]);

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut client = RegistryServiceClient::new(switchyard_kit::client::authed(
        switchyard_kit::client::connect(&dev.url()).await.unwrap(),
        switchyard_kit::client::Credential::bearer(&token(&dev.url(), "admin")).ok(),
    ));
    let mut req = tonic::Request::new(ListAgentsRequest::default());
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    req.metadata_mut()
        .insert("x-correlation-id", "otel-corr-7".parse().unwrap());
    client.list_agents(req).await.unwrap();

    // SIGTERM flushes telemetry before exit.
    assert_eq!(dev.terminate(), Some(0));

    let spans = sink.spans();
    let span = spans
        .iter()
        .find(|s| s.name == "registry.ListAgents")
        .unwrap_or_else(|| {
            panic!(
                "no registry.ListAgents span among {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        });
    assert_eq!(
        hex(&span.trace_id),
        trace_id,
        "span continues the caller's trace"
    );
    assert_eq!(
        hex(&span.parent_span_id),
        parent_id,
        "caller's span is the parent"
    );
    let corr = span
        .attributes
        .iter()
        .find(|a| a.key == "correlation_id")
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref());
    assert!(
        matches!(corr, Some(Value::StringValue(s)) if s == "otel-corr-7"),
        "{corr:?}"
    );

    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

fn value<'a>(s: &'a Span, key: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn attr(s: &Span, key: &str) -> Option<String> {
    match value(s, key)? {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn int_attr(s: &Span, key: &str) -> Option<i64> {
    match value(s, key)? {
        Value::IntValue(n) => Some(*n),
        _ => None,
    }
}

/// A span Switchyard made: its own (`service.method`, `switchyard.*`,
/// `executor.*`) or a GenAI operation's (`chat {model}`,
/// `invoke_agent {agent}`, `execute_tool {tool}`).
fn ours(name: &str) -> bool {
    name.contains('.')
        || ["chat ", "invoke_agent ", "execute_tool "]
            .iter()
            .any(|p| name.starts_with(p))
}

/// Whether the executor process made span `name` (else the core's).
fn executors(name: &str) -> bool {
    name.starts_with("executor.") || name.starts_with("switchyard.") || !name.contains('.')
}

/// The `/metrics` of the process at `url` (whose keys are at `keys`).
fn scrape(url: &str, keys: &str) -> String {
    let admin = token(keys, "admin");
    let out = std::process::Command::new("curl")
        .args(["-sf", "-H", &format!("authorization: Bearer {admin}")])
        .arg(format!("{url}/metrics"))
        .output()
        .unwrap();
    assert!(out.status.success(), "scraping {url}/metrics");
    String::from_utf8(out.stdout).unwrap()
}

/// A counter's value in the `/metrics` of the process at `url`.
fn counter(url: &str, name: &str) -> u64 {
    scrape(url, url)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {url}/metrics"))
}

/// 200 jobs submitted in 2 s, each in its own trace with its own
/// correlation id: every job's trace is complete — every service's spans,
/// the registry's outcome report included — or the spans it lost are
/// counted (`switchyard_trace_spans_dropped_total`); each span names the
/// process's service and carries the job's correlation id, and nothing but
/// Switchyard's own spans is exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_trace_is_complete_at_200_jobs_in_two_seconds_or_its_drops_are_counted() {
    use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
    use switchyard_proto::executor::v1::{JobState, SubmitJobRequest, WatchJobRequest};
    use tokio_stream::StreamExt;

    const JOBS: usize = 200;
    let (sink, endpoint, stop_tx, server) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let (others, x) = split_exporting_to(&endpoint, dir.path(), None);
    let url = others.url();
    let c = JobServiceClient::new(switchyard_kit::client::authed(
        switchyard_kit::client::connect(&x.url()).await.unwrap(),
        switchyard_kit::client::Credential::bearer(&token(&url, "alice")).ok(),
    ));
    let trace_of = |i: usize| {
        format!(
            "{:032x}",
            0x5eed_0000_0000_0000_0000_0000_0000u128 + i as u128
        )
    };
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(10));
    let mut watches = Vec::new();
    for i in 0..JOBS {
        tick.tick().await;
        let mut c = c.clone();
        let job = format!("load-{i}");
        let mut req = tonic::Request::new(SubmitJobRequest {
            document: format!(
                r#"{{"job_id":"{job}","tasks":[{{"id":"a","agent":{{"capability":"builtin.echo","input":{{"text":"hi"}}}}}}]}}"#
            ),
            ..Default::default()
        });
        req.metadata_mut().insert(
            "traceparent",
            format!("00-{}-b7ad6b7169203331-01", trace_of(i))
                .parse()
                .unwrap(),
        );
        req.metadata_mut().insert(
            "x-correlation-id",
            format!("corr-load-{i}").parse().unwrap(),
        );
        watches.push(tokio::spawn(async move {
            c.submit_job(req).await.unwrap();
            let mut w = c
                .watch_job(WatchJobRequest {
                    job_id: job,
                    after_sequence: 0,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let mut last = None;
            while let Some(e) = w.next().await {
                last = Some(e.unwrap().event.unwrap());
            }
            last.map(|e| e.kind)
        }));
    }
    for w in watches {
        assert_eq!(w.await.unwrap().as_deref(), Some("job.state"));
    }
    let _ = JobState::Completed;
    // Every span is ended by now but the RPC spans of the last answers; a
    // span dropped at the queue is counted when it ends.
    let dropped = ["switchyard_trace_spans_dropped_total"]
        .iter()
        .map(|n| counter(&x.url(), n) + counter(&url, n))
        .sum::<u64>();
    // SIGTERM flushes each process's spans.
    assert_eq!(x.terminate(), Some(0));
    assert_eq!(others.terminate(), Some(0));

    let named = sink.0.lock().unwrap().clone();
    let foreign: Vec<&str> = named
        .iter()
        .filter(|(_, s)| !ours(&s.name))
        .map(|(_, s)| s.name.as_str())
        .collect();
    assert!(
        foreign.len() <= named.len() / 100,
        "only Switchyard spans: {:?}",
        &foreign[..foreign.len().min(10)]
    );
    let mut incomplete = Vec::new();
    let mut lost = std::collections::BTreeSet::new();
    // What no drop excuses: a span from the wrong process or without the
    // job's correlation id.
    let mut wrong = Vec::new();
    for i in 0..JOBS {
        let before = incomplete.len();
        let trace = trace_of(i);
        let spans: Vec<&(String, Span)> = named
            .iter()
            .filter(|(_, s)| hex(&s.trace_id) == trace)
            .collect();
        let names: Vec<&str> = spans.iter().map(|(_, s)| s.name.as_str()).collect();
        for want in JOB_SPANS
            .iter()
            .chain(&["registry.ReportOutcome", "ledger.CloseBudget"])
        {
            if !names.contains(want) {
                incomplete.push(format!("load-{i}: no {want} in {names:?}"));
            }
        }
        incomplete.extend(no_claim(&names).map(|e| format!("load-{i}: {e}")));
        if !names.contains(&"ledger.Commit") && !names.contains(&"ledger.Release") {
            incomplete.push(format!(
                "load-{i}: the hold is neither committed nor released"
            ));
        }
        for (service, s) in &spans {
            let corr = attr(s, "correlation_id");
            if corr.as_deref() != Some(format!("corr-load-{i}").as_str()) {
                wrong.push(format!("load-{i}: {} carries {corr:?}", s.name));
            }
            let want = if executors(&s.name) {
                "switchyard-executor"
            } else {
                "switchyard-registry+router+ledger+approval+auth"
            };
            if service != want {
                wrong.push(format!("load-{i}: {} from service {service:?}", s.name));
            }
        }
        if incomplete.len() > before {
            lost.insert(i);
        }
    }
    assert!(wrong.is_empty(), "{:?}", &wrong[..wrong.len().min(5)]);
    // Each incomplete trace lost at least one span, and every lost span
    // is counted.
    assert!(
        lost.len() as u64 <= dropped,
        "{} traces incomplete with {dropped} spans counted as dropped; first problems: {:?}",
        lost.len(),
        &incomplete[..incomplete.len().min(5)]
    );
    eprintln!(
        "{JOBS} jobs: {} spans exported, {dropped} dropped, {} traces incomplete",
        named.len(),
        lost.len()
    );
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

/// One job whose LLM task calls a tool, across two processes exporting to
/// one collector: its trace holds the whole tree with the OpenTelemetry
/// GenAI conventions' names and attributes — executor.job → executor.task
/// → {switchyard.budget.reserve → ledger.Reserve, `chat gpt-4o-mini`,
/// `execute_tool stamp`, switchyard.budget.commit → ledger.Commit} — the
/// budget spans carry the money they move, and no prompt or completion is
/// on any span (capturing them is off by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_trace_names_model_and_tool_calls_as_the_genai_conventions_do() {
    use crate::llm_split::{gpt_4o_mini, scripted};
    use switchyard_llm::scripted::Reply;
    use switchyard_proto::executor::v1::JobState;

    let (script, llm_url, _stop_llm) = scripted();
    let (sink, endpoint, stop_tx, server) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("switchyard.toml");
    std::fs::write(&config, gpt_4o_mini(&llm_url)).unwrap();
    let (others, x) = split_exporting_to(&endpoint, dir.path(), config.to_str());
    let url = others.url();
    script.for_model(
        "gpt-4o-mini",
        vec![
            Reply::tools(
                &[("stamp", serde_json::json!({"q": "secret prompt"}))],
                300,
                20,
            ),
            Reply::text("Stamped: the secret answer.", 340, 12),
        ],
    );
    use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
    use switchyard_proto::executor::v1::{GetJobRequest, WatchJobRequest};
    use tokio_stream::StreamExt;
    let mut c = JobServiceClient::new(switchyard_kit::client::authed(
        switchyard_kit::client::connect(&x.url()).await.unwrap(),
        switchyard_kit::client::Credential::bearer(&token(&url, "alice")).ok(),
    ));
    let trace_id = "7a3c0ffee0000000000000000000beef";
    let doc = r#"{"job_id": "traced-llm", "tasks": [{"id": "ask", "llm": {"model": "gpt-4o-mini", "prompt": "stamp the secret prompt", "max_tokens": 50,
            "tools": [{"name": "stamp", "command": "cat"}]}}]}"#;
    let req = in_trace(doc, trace_id);
    let run = c
        .submit_job(req)
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
        .run_id;
    ok(&cli(&url, &["approval", "approve", &run, "--as", "bob"]));
    let mut w = c
        .watch_job(WatchJobRequest {
            job_id: "traced-llm".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while w.next().await.is_some() {}
    let job = c
        .get_job(GetJobRequest {
            job_id: "traced-llm".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(job.state, JobState::Completed as i32, "{job:?}");
    let spent = job.cost_so_far.unwrap_or_default().micro_usd;
    assert!(spent > 0);
    // The conventions' metrics, in the executor's /metrics.
    let metrics = scrape(&x.url(), &url);
    let labels = r#"gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="gpt-4o-mini""#;
    for want in [
        format!(r#"gen_ai_client_token_usage_sum{{{labels},gen_ai_token_type="input"}} 640"#),
        format!(r#"gen_ai_client_token_usage_sum{{{labels},gen_ai_token_type="output"}} 32"#),
        format!(r#"gen_ai_client_operation_duration_seconds_count{{{labels},error_type=""}} 2"#),
    ] {
        assert!(
            metrics.contains(&want),
            "no {want} in:\n{}",
            metrics
                .lines()
                .filter(|l| l.starts_with("gen_ai"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_eq!(x.terminate(), Some(0));
    assert_eq!(others.terminate(), Some(0));

    let spans: Vec<Span> = sink
        .spans()
        .into_iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .collect();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let one = |name: &str| -> &Span {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} in the job's trace: {names:?}"))
    };
    let all = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let job = one("executor.job");
    let task = one("executor.task");
    assert_eq!(
        task.parent_span_id, job.span_id,
        "the task is the job's child"
    );
    assert_eq!(attr(task, "switchyard.task.id").as_deref(), Some("ask"));

    // The approval: proposed with its estimate, waiting for bob.
    let proposed = one("switchyard.approval.propose");
    assert_eq!(
        attr(proposed, "switchyard.approval.decision").as_deref(),
        Some("pending")
    );
    assert!(int_attr(proposed, "switchyard.cost.estimated_micro_usd").is_some_and(|c| c > 0));
    assert!(
        all("approval.Propose")
            .iter()
            .all(|p| p.parent_span_id == proposed.span_id)
    );
    let waited = one("switchyard.approval.wait");
    assert_eq!(waited.parent_span_id, job.span_id);
    assert_eq!(
        attr(waited, "switchyard.approval.outcome").as_deref(),
        Some("claimed")
    );

    // Two model calls, named and attributed as the conventions say.
    let chats = all("chat gpt-4o-mini");
    assert_eq!(chats.len(), 2, "{names:?}");
    for c in &chats {
        assert_eq!(
            c.parent_span_id, task.span_id,
            "a model call is the task's child"
        );
        assert_eq!(c.kind, 3, "chat spans are CLIENT spans");
        assert_eq!(attr(c, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(attr(c, "gen_ai.provider.name").as_deref(), Some("openai"));
        assert_eq!(
            attr(c, "gen_ai.request.model").as_deref(),
            Some("gpt-4o-mini")
        );
        assert!(
            attr(c, "gen_ai.response.model").is_some(),
            "{:?}",
            c.attributes
        );
        assert_eq!(
            int_attr(c, "gen_ai.request.max_tokens"),
            Some(50),
            "{:?}",
            c.attributes
        );
    }
    let usage: Vec<(Option<i64>, Option<i64>)> = chats
        .iter()
        .map(|c| {
            (
                int_attr(c, "gen_ai.usage.input_tokens"),
                int_attr(c, "gen_ai.usage.output_tokens"),
            )
        })
        .collect();
    assert!(
        usage.contains(&(Some(300), Some(20))) && usage.contains(&(Some(340), Some(12))),
        "{usage:?}"
    );

    let tool = one("execute_tool stamp");
    assert_eq!(tool.parent_span_id, task.span_id);
    assert_eq!(
        attr(tool, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    assert_eq!(attr(tool, "gen_ai.tool.name").as_deref(), Some("stamp"));
    assert_eq!(attr(tool, "gen_ai.tool.type").as_deref(), Some("function"));
    assert!(attr(tool, "gen_ai.tool.call.id").is_some_and(|id| !id.is_empty()));

    // Budget spans carry the money, and the ledger's RPC spans (another
    // process) are their children.
    let reserves = all("switchyard.budget.reserve");
    let commits = all("switchyard.budget.commit");
    assert_eq!((reserves.len(), commits.len()), (2, 2), "{names:?}");
    for b in reserves.iter().chain(&commits) {
        assert_eq!(b.parent_span_id, task.span_id);
        assert!(attr(b, "switchyard.budget.id").is_some_and(|id| !id.is_empty()));
        assert!(attr(b, "switchyard.budget.reservation_id").is_some_and(|id| !id.is_empty()));
        assert!(
            int_attr(b, "switchyard.cost.micro_usd").is_some_and(|c| c > 0),
            "{:?}",
            b.attributes
        );
    }
    let committed: i64 = commits
        .iter()
        .filter_map(|c| int_attr(c, "switchyard.cost.micro_usd"))
        .sum();
    assert_eq!(
        committed, spent,
        "the commits' costs are what the job spent"
    );
    for (rpc, parents) in [("ledger.Reserve", &reserves), ("ledger.Commit", &commits)] {
        for r in all(rpc) {
            assert!(
                parents.iter().any(|p| p.span_id == r.parent_span_id),
                "{rpc} is a child of a budget span"
            );
        }
        assert!(!all(rpc).is_empty(), "{rpc} in {names:?}");
    }

    // The tree, for the docs (`--nocapture`).
    fn show(spans: &[Span], parent: &[u8], depth: usize) {
        let mut kids: Vec<&Span> = spans
            .iter()
            .filter(|s| s.parent_span_id == parent)
            .collect();
        kids.sort_by_key(|s| s.start_time_unix_nano);
        for s in kids {
            let attrs: Vec<String> = s
                .attributes
                .iter()
                .filter(|a| a.key.starts_with("gen_ai.") || a.key.starts_with("switchyard.cost"))
                .map(|a| match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(v)) => format!("{}={v}", a.key),
                    Some(Value::IntValue(v)) => format!("{}={v}", a.key),
                    other => format!("{}={other:?}", a.key),
                })
                .collect();
            eprintln!("{}{}  {}", "  ".repeat(depth), s.name, attrs.join(" "));
            show(spans, &s.span_id, depth + 1);
        }
    }
    show(&spans, &one("executor.SubmitJob").span_id, 0);

    // No prompt or completion left the process.
    for s in &spans {
        for a in &s.attributes {
            assert!(
                !a.key.ends_with(".messages"),
                "{} carries {}",
                s.name,
                a.key
            );
            let v = format!("{:?}", a.value);
            assert!(
                !v.contains("secret"),
                "{}'s {} carries message text: {v}",
                s.name,
                a.key
            );
        }
    }
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}
