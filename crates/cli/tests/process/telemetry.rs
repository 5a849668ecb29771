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
/// another, both exporting spans to `endpoint`; returns once the built-in
/// agents route.
fn split_exporting_to(endpoint: &str, dir: &std::path::Path) -> (Proc, Proc) {
    let otel = ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    let data = |n: &str| dir.join(n).to_str().unwrap().to_owned();
    let (d1, d2) = (data("others"), data("executor"));
    let serve = |services: &str, data: &str, env: &[(&str, &str)]| {
        let args = [
            "serve",
            "--services",
            services,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
        ];
        Proc::start(&args, env)
    };
    let others = serve("registry,router,ledger,approval,auth", &d1, &[otel]);
    let url = others.url();
    let x = serve(
        "executor",
        &d2,
        &[
            otel,
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
    use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
    use switchyard_proto::executor::v1::{SubmitJobRequest, WatchJobRequest};
    use tokio_stream::StreamExt;

    let (sink, endpoint, stop_tx, server) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let (others, x) = split_exporting_to(&endpoint, dir.path());
    let url = others.url();
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let mut c = JobServiceClient::new(switchyard_kit::client::authed(
        switchyard_kit::client::connect(&x.url()).await.unwrap(),
        switchyard_kit::client::Credential::bearer(&token(&url, "alice")).ok(),
    ));
    let mut req = tonic::Request::new(SubmitJobRequest {
        document: r#"{"job_id":"traced","tasks":[{"id":"a","agent":{"capability":"builtin.echo","input":{"text":"hi"}}}]}"#.into(),
        ..Default::default()
    });
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-b7ad6b7169203331-01")
            .parse()
            .unwrap(),
    );
    c.submit_job(req).await.unwrap();
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

fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
}

/// 100 jobs submitted at 100 a second, each in its own trace with its own
/// correlation id: every job's trace is complete — every service's spans,
/// the registry's outcome report included — each span names the process's
/// service and carries the job's correlation id, and nothing but
/// Switchyard's own spans is exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_trace_is_complete_at_100_jobs_a_second() {
    use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
    use switchyard_proto::executor::v1::{JobState, SubmitJobRequest, WatchJobRequest};
    use tokio_stream::StreamExt;

    const JOBS: usize = 100;
    let (sink, endpoint, stop_tx, server) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let (others, x) = split_exporting_to(&endpoint, dir.path());
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
    // SIGTERM flushes each process's spans.
    assert_eq!(x.terminate(), Some(0));
    assert_eq!(others.terminate(), Some(0));

    let named = sink.0.lock().unwrap().clone();
    let foreign: Vec<&str> = named
        .iter()
        .filter(|(_, s)| !s.name.contains('.'))
        .map(|(_, s)| s.name.as_str())
        .collect();
    assert!(
        foreign.len() <= named.len() / 100,
        "only Switchyard spans: {:?}",
        &foreign[..foreign.len().min(10)]
    );
    let mut incomplete = Vec::new();
    for i in 0..JOBS {
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
                incomplete.push(format!("load-{i}: {} carries {corr:?}", s.name));
            }
            let want = if s.name.starts_with("executor.") {
                "switchyard-executor"
            } else {
                "switchyard-registry+router+ledger+approval+auth"
            };
            if service != want {
                incomplete.push(format!("load-{i}: {} from service {service:?}", s.name));
            }
        }
    }
    assert!(
        incomplete.is_empty(),
        "{} problems, first: {:?}",
        incomplete.len(),
        &incomplete[..incomplete.len().min(5)]
    );
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}
