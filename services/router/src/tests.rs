use super::*;
use switchyard_kit::error::ApiError;
use switchyard_proto::registry::v1::{Agent, AgentSpec, AgentStatus, Capability, CapabilityStats};

fn agent(id: &str, cap: &str, trust: u32, price: i64, latency: u32) -> Agent {
    Agent {
        spec: Some(AgentSpec {
            id: id.into(),
            endpoint: format!("http://{id}:1"),
            capabilities: vec![Capability {
                name: cap.into(),
                proficiency: None,
                price_per_unit_micro_usd: price,
                unit: "task".into(),
            }],
            trust_score: trust,
            latency_estimate_ms: latency,
            ..Default::default()
        }),
        status: AgentStatus::Available as i32,
        ..Default::default()
    }
}

fn router(agents: &[Agent]) -> Router {
    let r = Router::new(RouterConfig::default());
    r.load_agents(agents);
    r
}

fn req(cap: &str) -> RouteRequest {
    RouteRequest {
        capability: cap.into(),
        ..Default::default()
    }
}

fn ids(r: &RouteResponse) -> Vec<&str> {
    r.candidates.iter().map(|c| c.agent_id.as_str()).collect()
}

#[test]
fn ranks_by_hand_computed_score_with_breakdown() {
    // max_cost = highest price among candidates = 4000
    // a: 0.3*1 + 0.3*0.9 + 0.2*(1-100/1000) + 0.2*(1-1000/4000) = 0.3+0.27+0.18+0.15 = 0.90
    // b: 0.3*1 + 0.3*0.6 + 0.2*(1-500/1000) + 0.2*(1-0/4000)    = 0.3+0.18+0.10+0.20 = 0.78
    // c: 0.3*1 + 0.3*1.0 + 0.2*(1-2000/1000→0) + 0.2*(1-4000/4000) = 0.3+0.3+0+0 = 0.60
    let r = router(&[
        agent("a", "nlp_analysis", 90, 1_000, 100),
        agent("b", "nlp_analysis", 60, 0, 500),
        agent("c", "nlp_analysis", 100, 4_000, 2_000),
    ]);
    let resp = r.route(&req("nlp_analysis")).unwrap();
    assert_eq!(ids(&resp), ["a", "b", "c"]);
    let scores: Vec<f64> = resp.candidates.iter().map(|c| c.score).collect();
    for (got, want) in scores.iter().zip([0.90, 0.78, 0.60]) {
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    }
    let b = resp.candidates[0].breakdown.as_ref().unwrap();
    assert_eq!(
        (b.trust, b.latency_ms, b.latency_observed),
        (0.9, 100.0, false)
    );
    assert!((b.cost - 0.75).abs() < 1e-12);
    assert_eq!(b.matched_capability, "nlp_analysis");
    assert_eq!(resp.candidates[0].endpoint, "http://a:1");
}

#[test]
fn max_cost_constraint_filters_and_becomes_the_denominator() {
    let r = router(&[agent("a", "x", 90, 1_000, 0), agent("b", "x", 90, 3_000, 0)]);
    let mut q = req("x");
    q.constraints = Some(RouteConstraints {
        max_cost_micro_usd: Some(2_000),
        ..Default::default()
    });
    let resp = r.route(&q).unwrap();
    assert_eq!(ids(&resp), ["a"]);
    assert_eq!(resp.filtered["cost"], 1);
    assert!((resp.candidates[0].breakdown.as_ref().unwrap().cost - 0.5).abs() < 1e-12);
}

#[test]
fn filters_trust_availability_saturation_and_exclusions_with_counts() {
    let mut lapsed = agent("lapsed", "x", 90, 0, 0);
    lapsed.status = AgentStatus::Lapsed as i32;
    let mut busy = agent("busy", "x", 90, 0, 0);
    busy.spec.as_mut().unwrap().max_concurrency = 2;
    busy.in_flight = 2;
    let r = router(&[
        agent("ok", "x", 50, 0, 0),
        agent("low", "x", 49, 0, 0),
        lapsed,
        busy,
        agent("ex", "x", 99, 0, 0),
    ]);
    let mut q = req("x");
    q.constraints = Some(RouteConstraints {
        exclude_agents: vec!["ex".into()],
        ..Default::default()
    });
    let resp = r.route(&q).unwrap();
    assert_eq!(ids(&resp), ["ok"], "default min_trust is 50, inclusive");
    let f = &resp.filtered;
    assert_eq!(
        (f["trust"], f["unavailable"], f["saturated"], f["excluded"]),
        (1, 1, 1, 1)
    );

    // SELECT_NEXT_BEST: excluding the best gives the next one
    let r = router(&[agent("a", "y", 90, 0, 0), agent("b", "y", 80, 0, 0)]);
    assert_eq!(ids(&r.route(&req("y")).unwrap()), ["a", "b"]);
    let mut q = req("y");
    q.constraints = Some(RouteConstraints {
        exclude_agents: vec!["a".into()],
        ..Default::default()
    });
    assert_eq!(ids(&r.route(&q).unwrap()), ["b"]);
}

#[test]
fn no_candidate_is_not_found_with_capability_unavailable_and_counts() {
    let r = router(&[agent("low", "x", 10, 0, 0)]);
    let err = ApiError::from(Status::from(r.route(&req("x")).unwrap_err()));
    assert_eq!(err.code, Code::NotFound);
    assert_eq!(err.known_reason(), Some(Reason::CapabilityUnavailable));
    assert_eq!(err.metadata["capability"], "x");
    assert_eq!(err.metadata["filtered_trust"], "1");
    assert!(err.message.contains("1 offer it"), "{}", err.message);

    let err = ApiError::from(Status::from(r.route(&req("unknown_cap")).unwrap_err()));
    assert_eq!(err.known_reason(), Some(Reason::CapabilityUnavailable));
}

#[test]
fn invalid_requests_are_rejected_with_field_violations() {
    let r = router(&[]);
    let mut q = req("Not Valid");
    q.limit = 1_000;
    q.constraints = Some(RouteConstraints {
        min_trust: Some(101),
        max_cost_micro_usd: Some(-1),
        ..Default::default()
    });
    let err = ApiError::from(Status::from(r.route(&q).unwrap_err()));
    let fields: Vec<_> = err.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "capability",
            "constraints.min_trust",
            "constraints.max_cost_micro_usd",
            "limit"
        ]
    );
}

#[test]
fn parent_capability_agents_serve_children_with_discount_and_count_once() {
    let mut both = agent("both", "nlp", 80, 0, 0);
    both.spec.as_mut().unwrap().capabilities.push(Capability {
        name: "nlp.analysis".into(),
        ..Default::default()
    });
    let r = router(&[
        agent("general", "nlp", 80, 0, 0),
        agent("special", "nlp.analysis", 80, 0, 0),
        both,
    ]);
    let resp = r.route(&req("nlp.analysis")).unwrap();
    assert_eq!(ids(&resp), ["both", "special", "general"]);
    let general = &resp.candidates[2].breakdown.as_ref().unwrap();
    assert_eq!(general.matched_capability, "nlp");
    assert!((general.capability_match - 0.8).abs() < 1e-12);
    assert_eq!(
        resp.candidates[0]
            .breakdown
            .as_ref()
            .unwrap()
            .matched_capability,
        "nlp.analysis"
    );
    // asking for the parent does not return the specialist
    assert_eq!(ids(&r.route(&req("nlp")).unwrap()), ["both", "general"]);
}

#[test]
fn observed_latency_replaces_estimate() {
    let mut slow_estimate = agent("a", "x", 80, 0, 900);
    slow_estimate.stats = vec![CapabilityStats {
        capability: "x".into(),
        count: 3,
        successes: 3,
        success_rate: 1.0,
        ewma_latency_ms: 100.0,
    }];
    let r = router(&[slow_estimate, agent("b", "x", 80, 0, 500)]);
    let resp = r.route(&req("x")).unwrap();
    assert_eq!(ids(&resp), ["a", "b"]);
    let b = resp.candidates[0].breakdown.as_ref().unwrap();
    assert_eq!((b.latency_ms, b.latency_observed), (100.0, true));
}

#[test]
fn preferred_labels_earn_the_preference_bonus() {
    let mut eu = agent("z_eu", "x", 80, 0, 0);
    eu.spec
        .as_mut()
        .unwrap()
        .labels
        .insert("region".into(), "eu".into());
    let r = router(&[agent("a_us", "x", 80, 0, 0), eu]);
    assert_eq!(
        ids(&r.route(&req("x")).unwrap()),
        ["a_us", "z_eu"],
        "tie broken by id"
    );
    let mut q = req("x");
    q.constraints = Some(RouteConstraints {
        prefer_labels: [("region".into(), "eu".into())].into(),
        ..Default::default()
    });
    let resp = r.route(&q).unwrap();
    assert_eq!(ids(&resp), ["z_eu", "a_us"]);
    assert_eq!(
        resp.candidates[0].breakdown.as_ref().unwrap().preference,
        1.0
    );
}

#[test]
fn limit_keeps_the_best_in_order() {
    let agents: Vec<Agent> = (0..50)
        .map(|i| agent(&format!("a{i:02}"), "x", 50 + i, 0, 0))
        .collect();
    let r = router(&agents);
    let mut q = req("x");
    q.limit = 3;
    assert_eq!(ids(&r.route(&q).unwrap()), ["a49", "a48", "a47"]);
    assert_eq!(
        r.route(&req("x")).unwrap().candidates.len(),
        5,
        "default limit"
    );
}

#[test]
fn route_before_index_load_is_unavailable() {
    let r = Router::new(RouterConfig::default());
    let err = ApiError::from(Status::from(r.route(&req("x")).unwrap_err()));
    assert_eq!(err.code, Code::Unavailable);
}

#[tokio::test]
async fn index_follows_registry_through_register_lapse_and_deregister() {
    use switchyard_core::ManualClock;
    use switchyard_proto::registry::v1::{
        DeregisterAgentRequest, HeartbeatRequest, RegisterAgentRequest,
    };
    use switchyard_registry::{Registry, RegistryConfig};

    let clock = ManualClock::new(1_700_000_000_000);
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let store = switchyard_store::Store::temporary().unwrap();
    let reg = Registry::open(
        RegistryConfig {
            lease_ttl_secs: 5,
            ..Default::default()
        },
        store,
        Arc::new(clock.clone()),
        shutdown.clone(),
    )
    .unwrap();
    let client = RegistryClient::local(Arc::new(reg.clone()));
    client
        .register_agent(RegisterAgentRequest {
            agent: agent("a", "x", 80, 0, 0).spec,
        })
        .await
        .unwrap();

    let r = Router::new(RouterConfig::default());
    let sync = r.spawn_sync(client.clone(), shutdown.clone());
    tokio::time::timeout(Duration::from_secs(5), r.ready())
        .await
        .unwrap();

    async fn until(r: &Router, want: &[&str]) {
        for _ in 0..500 {
            let got: Vec<String> = r
                .route(&req("x"))
                .map(|x| x.candidates.into_iter().map(|c| c.agent_id).collect())
                .unwrap_or_default();
            if got == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("router never reached {want:?}");
    }
    until(&r, &["a"]).await;
    client
        .register_agent(RegisterAgentRequest {
            agent: agent("b", "x", 90, 0, 0).spec,
        })
        .await
        .unwrap();
    until(&r, &["b", "a"]).await;
    clock.advance_ms(3_000);
    client
        .heartbeat(HeartbeatRequest {
            agent_id: "a".into(),
            in_flight: 0,
        })
        .await
        .unwrap();
    clock.advance_ms(3_000);
    reg.sweep(); // b lapses, a was renewed
    until(&r, &["a"]).await;
    client
        .heartbeat(HeartbeatRequest {
            agent_id: "b".into(),
            in_flight: 0,
        })
        .await
        .unwrap();
    until(&r, &["b", "a"]).await;
    client
        .deregister_agent(DeregisterAgentRequest {
            agent_id: "b".into(),
        })
        .await
        .unwrap();
    until(&r, &["a"]).await;

    trigger.fire();
    tokio::time::timeout(Duration::from_secs(5), sync)
        .await
        .unwrap()
        .unwrap();
}
