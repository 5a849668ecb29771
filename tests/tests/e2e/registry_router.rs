//! Registry and router end to end over the generated gRPC clients, against
//! the in-process stack (the same composition as `switchyard dev`).

use crate::common::*;
use switchyard_cli::ServiceKind;
use switchyard_core::Reason;
use switchyard_kit::error::ApiError;
use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
use switchyard_proto::registry::v1::*;
use switchyard_proto::router::v1::router_service_client::RouterServiceClient;
use switchyard_testkit::Stack;
use tonic::Code;

async fn clients(
    s: &Stack,
) -> (
    RegistryServiceClient<switchyard_kit::client::Intercepted>,
    RouterServiceClient<switchyard_kit::client::Intercepted>,
) {
    let ch = s.channel().await.expect("connect to the stack");
    (
        RegistryServiceClient::new(ch.clone()),
        RouterServiceClient::new(ch),
    )
}

/// Just the services under test (no executor registering its built-in agents).
async fn registry_and_router() -> Stack {
    Stack::start_with(&[ServiceKind::Registry, ServiceKind::Router], |_| {})
        .await
        .expect("stack starts")
}

#[tokio::test]
async fn register_route_and_fall_back_to_next_best_with_exclude() {
    let s = registry_and_router().await;
    let (mut reg, mut router) = clients(&s).await;
    register(&mut reg, agent("best", "pdf_text_extraction", 95, 1_000)).await;
    register(&mut reg, agent("second", "pdf_text_extraction", 80, 1_000)).await;
    register(&mut reg, agent("other", "nlp_analysis", 99, 0)).await;

    eventually_routed(&router, "pdf_text_extraction", &["best", "second"]).await;
    // SELECT_NEXT_BEST: the caller excludes the agent that failed it
    let next = route(&mut router, "pdf_text_extraction", &["best"])
        .await
        .unwrap();
    assert_eq!(ids(&next), ["second"]);
    assert_eq!(next.filtered["excluded"], 1);
    let b = next.candidates[0].breakdown.as_ref().unwrap();
    assert_eq!(b.matched_capability, "pdf_text_extraction");

    let err = ApiError::from(
        route(&mut router, "pdf_text_extraction", &["best", "second"])
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, Code::NotFound);
    assert_eq!(err.known_reason(), Some(Reason::CapabilityUnavailable));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn lapsed_agents_leave_routing_and_return_on_heartbeat() {
    let s = Stack::start_with(ServiceKind::ALL, |c| {
        c.registry.lease_ttl_secs = 1;
        c.registry.sweep_interval_ms = 50;
    })
    .await
    .unwrap();
    let (mut reg, router) = clients(&s).await;
    register(&mut reg, agent("steady", "x", 80, 0)).await;
    register(&mut reg, agent("flaky", "x", 90, 0)).await;
    let routed = || {
        let mut r = router.clone();
        async move {
            route(&mut r, "x", &[])
                .await
                .map(|x| ids(&x))
                .unwrap_or_default()
        }
    };
    eventually_routed(&router, "x", &["flaky", "steady"]).await;

    // keep `steady` alive while `flaky` lapses (TTL 1 s, bounded loop)
    let mut lapsed = false;
    for _ in 0..40 {
        reg.heartbeat(HeartbeatRequest {
            agent_id: "steady".into(),
            in_flight: 0,
        })
        .await
        .unwrap();
        if routed().await == ["steady"] {
            lapsed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(lapsed, "flaky never lapsed out of routing");
    let a = reg
        .get_agent(GetAgentRequest {
            agent_id: "flaky".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(
        a.status,
        AgentStatus::Lapsed as i32,
        "lapsed agents are kept"
    );

    reg.heartbeat(HeartbeatRequest {
        agent_id: "flaky".into(),
        in_flight: 0,
    })
    .await
    .unwrap();
    reg.heartbeat(HeartbeatRequest {
        agent_id: "steady".into(),
        in_flight: 0,
    })
    .await
    .unwrap();
    eventually_routed(&router, "x", &["flaky", "steady"]).await;

    // saturation: in-flight at max concurrency (2) removes it from routing
    reg.heartbeat(HeartbeatRequest {
        agent_id: "flaky".into(),
        in_flight: 2,
    })
    .await
    .unwrap();
    // saturated
    eventually_routed(&router, "x", &["steady"]).await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn invalid_input_carries_error_info_and_field_violations() {
    let s = registry_and_router().await;
    let (mut reg, _) = clients(&s).await;
    let mut bad = agent("Bad Id", "x", 101, -5);
    bad.endpoint = "not-a-url".into();
    let err = ApiError::from(
        reg.register_agent(RegisterAgentRequest { agent: Some(bad) })
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, Code::InvalidArgument);
    assert_eq!(err.reason.as_deref(), Some("INVALID_ARGUMENT"));
    let fields: Vec<_> = err.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "agent.id",
            "agent.endpoint",
            "agent.capabilities[0].price_per_unit_micro_usd",
            "agent.trust_score"
        ]
    );
    // nothing was stored
    let list = reg
        .list_agents(ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.agents.is_empty());

    let err = ApiError::from(
        reg.get_agent(GetAgentRequest {
            agent_id: "nope".into(),
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::NotFound, Some(Reason::AgentNotFound))
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_request_is_resource_exhausted_and_server_keeps_serving() {
    let s = Stack::start_with(ServiceKind::ALL, |c| c.server.max_message_bytes = 64 * 1024)
        .await
        .unwrap();
    let (reg, _) = clients(&s).await;
    let mut big = agent("big", "x", 80, 0);
    big.description = "x".repeat(100 * 1024);
    let mut reg = reg.max_encoding_message_size(1 << 20);
    let err = ApiError::from(
        reg.register_agent(RegisterAgentRequest { agent: Some(big) })
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, Code::ResourceExhausted, "{err}");
    assert_eq!(err.known_reason(), Some(Reason::MessageTooLarge));
    register(&mut reg, agent("small", "x", 80, 0)).await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn correlation_id_is_taken_from_metadata_or_generated_and_echoed() {
    let s = registry_and_router().await;
    let (mut reg, _) = clients(&s).await;
    let mut req = tonic::Request::new(ListAgentsRequest::default());
    req.metadata_mut()
        .insert("x-correlation-id", "job-42".parse().unwrap());
    let resp = reg.list_agents(req).await.unwrap();
    assert_eq!(resp.metadata().get("x-correlation-id").unwrap(), "job-42");

    let resp = reg.list_agents(ListAgentsRequest::default()).await.unwrap();
    let id = resp
        .metadata()
        .get("x-correlation-id")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(id.len(), 36, "a UUID was generated: {id}");

    // errors echo it too
    let mut req = tonic::Request::new(GetAgentRequest {
        agent_id: "nope".into(),
    });
    req.metadata_mut()
        .insert("x-correlation-id", "job-43".parse().unwrap());
    let st = reg.get_agent(req).await.unwrap_err();
    assert_eq!(st.metadata().get("x-correlation-id").unwrap(), "job-43");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn registry_state_survives_a_restart_on_the_same_data_dir() {
    let s = registry_and_router().await;
    let (mut reg, _) = clients(&s).await;
    register(&mut reg, agent("durable", "x", 80, 0)).await;
    let dir = s.stop().await.unwrap();

    let path = dir.path().to_path_buf();
    let s2 = Stack::start_with(ServiceKind::ALL, |c| c.storage.data_dir = path)
        .await
        .unwrap();
    let (mut reg, router) = clients(&s2).await;
    let a = reg
        .get_agent(GetAgentRequest {
            agent_id: "durable".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(a.spec.unwrap().trust_score, 80);
    // the restarted router routes to the stored agent
    eventually_routed(&router, "x", &["durable"]).await;
    s2.stop().await.unwrap();
    drop(dir);
}

#[tokio::test]
async fn watch_over_grpc_resumes_from_revision() {
    use tokio_stream::StreamExt;
    let s = registry_and_router().await;
    let (mut reg, _) = clients(&s).await;
    register(&mut reg, agent("a", "x", 80, 0)).await;
    // Following the registry is for routers: the cluster's service identity.
    let mut reg = RegistryServiceClient::new(s.channel_as("operator").await.unwrap());
    let mut w = reg
        .watch(WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(ev) = w.next().await {
        let ev = ev.unwrap();
        let done = ev.r#type == WatchEventType::SnapshotComplete as i32;
        events.push(ev);
        if done {
            break;
        }
    }
    let (epoch, rev) = (events[0].epoch.clone(), events[0].revision);
    assert_eq!(events.len(), 3);
    drop(w);
    register(&mut reg, agent("b", "x", 80, 0)).await;
    let mut w = reg
        .watch(WatchRequest {
            start_revision: rev,
            epoch,
        })
        .await
        .unwrap()
        .into_inner();
    let ev = w.next().await.unwrap().unwrap();
    assert_eq!(ev.r#type, WatchEventType::AgentUpserted as i32);
    assert_eq!(ev.agent.unwrap().spec.unwrap().id, "b");
    assert_eq!(ev.revision, rev + 1);
    s.stop().await.unwrap();
}
