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
struct Sink(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().expect("sink lock");
        for rs in req.into_inner().resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_covers_a_job_across_the_services_it_calls() {
    use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
    use switchyard_proto::executor::v1::{SubmitJobRequest, WatchJobRequest};
    use tokio_stream::StreamExt;

    let (sink, endpoint, stop_tx, server) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let otel = ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str());
    let data = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let (d1, d2) = (data("others"), data("executor"));
    let others = Proc::start(
        &[
            "serve",
            "--services",
            "registry,router,ledger,approval,auth",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &d1,
        ],
        &[otel],
    );
    let url = others.url();
    let x = Proc::start(
        &[
            "serve",
            "--services",
            "executor",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &d2,
        ],
        &[
            otel,
            ("SWITCHYARD_AUTH__KEYS_URL", &url),
            ("SWITCHYARD_EXECUTOR__REGISTRY_URL", &url),
            ("SWITCHYARD_EXECUTOR__ROUTER_URL", &url),
            ("SWITCHYARD_EXECUTOR__LEDGER_URL", &url),
            ("SWITCHYARD_EXECUTOR__APPROVAL_URL", &url),
        ],
    );
    wait_for(
        "built-in agents routable",
        std::time::Duration::from_secs(20),
        || routed(&url, &["--capability", "builtin.echo"]).is_some_and(|ids| !ids.is_empty()),
    );
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
        })
        .await
        .unwrap()
        .into_inner();
    while w.next().await.is_some() {}
    assert_eq!(x.terminate(), Some(0));
    assert_eq!(others.terminate(), Some(0));

    let spans = sink.0.lock().unwrap().clone();
    let in_trace: Vec<&str> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .map(|s| s.name.as_str())
        .collect();
    for want in [
        "executor.SubmitJob",
        "executor.job",
        "ledger.CreateBudget",
        "approval.Propose",
        "approval.Claim",
        "router.Route",
        "ledger.Reserve",
        "approval.Complete",
    ] {
        assert!(
            in_trace.contains(&want),
            "{want} not in the job's trace: {in_trace:?}"
        );
    }
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

    let spans = sink.0.lock().unwrap().clone();
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
