//! Helpers shared by the end-to-end tests.
#![allow(dead_code, clippy::unwrap_used)]

use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
use switchyard_proto::registry::v1::{AgentSpec, Capability, RegisterAgentRequest};
use switchyard_proto::router::v1::router_service_client::RouterServiceClient;
use switchyard_proto::router::v1::{RouteConstraints, RouteRequest, RouteResponse};
use tonic::transport::Channel;

pub fn agent(id: &str, cap: &str, trust: u32, price: i64) -> AgentSpec {
    AgentSpec {
        id: id.into(),
        name: id.into(),
        endpoint: format!("http://127.0.0.1:9/{id}"),
        capabilities: vec![Capability {
            name: cap.into(),
            proficiency: None,
            price_per_unit_micro_usd: price,
            unit: "task".into(),
        }],
        trust_score: trust,
        max_concurrency: 2,
        latency_estimate_ms: 100,
        ..Default::default()
    }
}

pub async fn register(reg: &mut RegistryServiceClient<Channel>, spec: AgentSpec) {
    reg.register_agent(RegisterAgentRequest { agent: Some(spec) })
        .await
        .expect("register");
}

pub async fn route(
    router: &mut RouterServiceClient<Channel>,
    cap: &str,
    exclude: &[&str],
) -> Result<RouteResponse, tonic::Status> {
    router
        .route(RouteRequest {
            capability: cap.into(),
            constraints: Some(RouteConstraints {
                exclude_agents: exclude.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            limit: 0,
        })
        .await
        .map(|r| r.into_inner())
}

pub fn ids(r: &RouteResponse) -> Vec<String> {
    r.candidates.iter().map(|c| c.agent_id.clone()).collect()
}

/// Polls `f` until it returns `want` (bounded: 5 s).
pub async fn eventually<F, Fut>(what: &str, want: Vec<String>, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let mut last = Vec::new();
    for _ in 0..250 {
        last = f().await;
        if last == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{what}: wanted {want:?}, last saw {last:?}");
}

/// Polls the router until `cap` routes to exactly `want`, in order (bounded: 5 s).
pub async fn eventually_routed(router: &RouterServiceClient<Channel>, cap: &str, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    eventually(&format!("route {cap}"), want, || {
        let mut r = router.clone();
        let cap = cap.to_owned();
        async move {
            route(&mut r, &cap, &[])
                .await
                .map(|x| ids(&x))
                .unwrap_or_default()
        }
    })
    .await;
}
