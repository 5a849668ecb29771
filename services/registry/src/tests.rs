use super::*;

/// A request as the in-process client sends it: with the calling service's
/// principal.
fn rq<T>(msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.extensions_mut()
        .insert(std::sync::Arc::new(Principal::in_process()));
    r
}
use futures_util::StreamExt;
use switchyard_core::ManualClock;
use switchyard_kit::error::ApiError;

type BoxWatch =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<WatchResponse, Status>> + Send>>;

/// The store at `path`, opened again after a drop in this process.
async fn reopen(path: &std::path::Path) -> Store {
    Store::reopen(path, std::time::Duration::from_secs(5))
        .await
        .unwrap()
}

fn spec(id: &str, caps: &[&str]) -> AgentSpec {
    AgentSpec {
        id: id.into(),
        endpoint: "http://127.0.0.1:7700".into(),
        capabilities: caps
            .iter()
            .map(|c| Capability {
                name: (*c).into(),
                ..Default::default()
            })
            .collect(),
        trust_score: 80,
        max_concurrency: 2,
        ..Default::default()
    }
}

struct Fixture {
    reg: Registry,
    clock: ManualClock,
    _trigger: switchyard_kit::shutdown::Trigger,
}

fn test_cfg() -> RegistryConfig {
    RegistryConfig {
        lease_ttl_secs: 10,
        watch_log_capacity: 8,
        ..Default::default()
    }
}

fn fixture_on(store: Store) -> Fixture {
    let clock = ManualClock::new(1_700_000_000_000);
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let reg = Registry::open(test_cfg(), store, Arc::new(clock.clone()), shutdown).unwrap();
    Fixture {
        reg,
        clock,
        _trigger: trigger,
    }
}

fn fixture() -> Fixture {
    fixture_on(Store::temporary().unwrap())
}

/// A registry replica on database `url` with `clock`.
async fn replica(url: &str, clock: &ManualClock) -> Fixture {
    let db = switchyard_store::pg::Pg::connect(&switchyard_store::pg::PgConfig {
        url: url.to_owned(),
        pool_size: 4,
        ..Default::default()
    })
    .await
    .unwrap();
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let reg = Registry::open_pg(test_cfg(), db, Arc::new(clock.clone()), shutdown)
        .await
        .unwrap();
    Fixture {
        reg,
        clock: clock.clone(),
        _trigger: trigger,
    }
}

/// A registry on a fresh database of the shared throwaway PostgreSQL
/// cluster, or `None` (said on stderr) when the run skips PostgreSQL.
async fn pg_fixture() -> Option<Fixture> {
    let url = switchyard_testkit::pg::fresh_database()?;
    Some(replica(&url, &ManualClock::new(1_700_000_000_000)).await)
}

switchyard_testkit::on_both_backends!(
    fixture, pg_fixture;
    register_returns_lease_and_reregister_updates_in_place,
    invalid_registration_reports_field_violations_and_stores_nothing,
    lease_lapses_without_heartbeat_and_heartbeat_revives,
    heartbeat_for_unknown_agent_is_not_found_with_reason,
    heartbeats_emit_watch_events_only_on_routing_relevant_changes,
    report_outcome_keeps_count_success_rate_and_ewma,
    list_filters_and_paginates_by_id,
    tools_need_valid_schema_and_cannot_be_removed_while_used,
    watch_starts_with_snapshot_then_streams_live_changes,
    watch_of_an_empty_registry_sends_one_snapshot_then_waits,
    watch_resumes_after_a_revision_in_the_same_epoch,
    watch_gives_snapshot_for_foreign_epoch_future_revision_or_trimmed_log,
);

async fn register(reg: &Registry, s: AgentSpec) -> Result<RegisterAgentResponse, ApiError> {
    reg.register_agent(rq(RegisterAgentRequest { agent: Some(s) }))
        .await
        .map(|r| r.into_inner())
        .map_err(ApiError::from)
}

async fn get(reg: &Registry, id: &str) -> Agent {
    reg.get_agent(rq(GetAgentRequest {
        agent_id: id.into(),
    }))
    .await
    .unwrap()
    .into_inner()
    .agent
    .unwrap()
}

async fn register_returns_lease_and_reregister_updates_in_place(f: Fixture) {
    let r = register(&f.reg, spec("a", &["nlp"])).await.unwrap();
    assert!(r.created);
    assert_eq!(r.lease.unwrap().ttl.unwrap().seconds, 10);
    assert_eq!(
        r.agent.as_ref().unwrap().spec.as_ref().unwrap().name,
        "a",
        "name defaults to id"
    );

    f.clock.advance_ms(1_000);
    let mut s = spec("a", &["pdf"]);
    s.trust_score = 90;
    let r2 = register(&f.reg, s).await.unwrap();
    assert!(!r2.created);
    let a = r2.agent.unwrap();
    assert_eq!(a.spec.unwrap().trust_score, 90);
    assert_eq!(
        a.registered_at,
        r.agent.unwrap().registered_at,
        "first registration time kept"
    );
    // the capability index follows the update
    let find = |cap: &str| {
        let reg = f.reg.clone();
        let cap = cap.to_owned();
        async move {
            reg.find_by_capability(rq(FindByCapabilityRequest {
                capability: cap,
                include_unavailable: true,
            }))
            .await
            .unwrap()
            .into_inner()
            .agents
            .len()
        }
    };
    assert_eq!(find("nlp").await, 0);
    assert_eq!(find("pdf").await, 1);
}

async fn invalid_registration_reports_field_violations_and_stores_nothing(f: Fixture) {
    let mut s = spec("Bad", &["nlp"]);
    s.trust_score = 500;
    let err = register(&f.reg, s).await.unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert_eq!(err.known_reason(), Some(Reason::InvalidArgument));
    let fields: Vec<_> = err.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, ["agent.id", "agent.trust_score"]);
    assert_eq!(f.reg.revision(), 0);
    let err = register(&f.reg, AgentSpec::default()).await.unwrap_err();
    assert!(err.violations.len() >= 3);
}

async fn lease_lapses_without_heartbeat_and_heartbeat_revives(f: Fixture) {
    register(&f.reg, spec("a", &["nlp"])).await.unwrap();
    f.clock.advance_ms(9_999);
    assert_eq!(f.reg.sweep(), 0);
    f.reg
        .heartbeat(rq(HeartbeatRequest {
            agent_id: "a".into(),
            in_flight: 0,
        }))
        .await
        .unwrap();
    f.clock.advance_ms(9_999);
    assert_eq!(f.reg.sweep(), 0, "heartbeat extended the lease");
    f.clock.advance_ms(1);
    assert_eq!(f.reg.sweep(), 1);
    assert_eq!(get(&f.reg, "a").await.status, AgentStatus::Lapsed as i32);
    assert_eq!(f.reg.sweep(), 0, "a lapsed agent lapses once");

    // lapsed agents are kept, hidden from FindByCapability by default
    let found = f
        .reg
        .find_by_capability(rq(FindByCapabilityRequest {
            capability: "nlp".into(),
            include_unavailable: false,
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(found.agents.is_empty());

    let lease = f
        .reg
        .heartbeat(rq(HeartbeatRequest {
            agent_id: "a".into(),
            in_flight: 1,
        }))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    assert_eq!(
        timestamp_ms(&lease.expires_at.unwrap()),
        f.clock.now_ms() + 10_000
    );
    let a = get(&f.reg, "a").await;
    assert_eq!(a.status, AgentStatus::Available as i32);
    assert_eq!(a.in_flight, 1);
}

async fn heartbeat_for_unknown_agent_is_not_found_with_reason(f: Fixture) {
    let err = ApiError::from(
        f.reg
            .heartbeat(rq(HeartbeatRequest {
                agent_id: "ghost".into(),
                in_flight: 0,
            }))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, Code::NotFound);
    assert_eq!(err.known_reason(), Some(Reason::AgentNotFound));
    assert_eq!(err.metadata["agent_id"], "ghost");
}

async fn heartbeats_emit_watch_events_only_on_routing_relevant_changes(f: Fixture) {
    register(&f.reg, spec("a", &["nlp"])).await.unwrap(); // max_concurrency 2
    let before = f.reg.revision();
    let hb = |n| {
        f.reg.heartbeat(rq(HeartbeatRequest {
            agent_id: "a".into(),
            in_flight: n,
        }))
    };
    hb(0).await.unwrap();
    hb(1).await.unwrap();
    assert_eq!(
        f.reg.revision(),
        before,
        "no change in availability or saturation"
    );
    hb(2).await.unwrap();
    assert_eq!(f.reg.revision(), before + 1, "saturated");
    hb(3).await.unwrap();
    assert_eq!(f.reg.revision(), before + 1);
    hb(1).await.unwrap();
    assert_eq!(f.reg.revision(), before + 2, "free again");
}

async fn report_outcome_keeps_count_success_rate_and_ewma(f: Fixture) {
    register(&f.reg, spec("a", &["nlp"])).await.unwrap();
    let report = |ok: bool, ms: u64, cap: &str| {
        f.reg.report_outcome(rq(ReportOutcomeRequest {
            agent_id: "a".into(),
            capability: cap.into(),
            success: ok,
            latency: Some(duration(ms)),
        }))
    };
    report(true, 100, "nlp").await.unwrap();
    let s = report(false, 200, "nlp.analysis")
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    assert_eq!(
        (s.count, s.successes),
        (1, 0),
        "child capability tracked separately"
    );
    let s = report(true, 300, "nlp")
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    assert_eq!((s.count, s.successes), (2, 2));
    assert!((s.success_rate - 1.0).abs() < 1e-12);
    // 0.2 * 300 + 0.8 * 100
    assert!(
        (s.ewma_latency_ms - 140.0).abs() < 1e-9,
        "{}",
        s.ewma_latency_ms
    );
    let err = ApiError::from(report(true, 1, "pdf").await.unwrap_err());
    assert_eq!(err.violations[0].field, "capability");
}

async fn list_filters_and_paginates_by_id(f: Fixture) {
    for i in 0..5 {
        let mut s = spec(
            &format!("a{i}"),
            if i % 2 == 0 { &["nlp"] } else { &["pdf"] },
        );
        s.labels
            .insert("region".into(), if i < 3 { "eu" } else { "us" }.into());
        register(&f.reg, s).await.unwrap();
    }
    let list = |req: ListAgentsRequest| f.reg.list_impl(req, &Principal::in_process()).unwrap();
    let ids = |r: &ListAgentsResponse| {
        r.agents
            .iter()
            .map(|a| a.spec.as_ref().unwrap().id.clone())
            .collect::<Vec<_>>()
    };

    let p1 = list(ListAgentsRequest {
        page_size: 2,
        ..Default::default()
    });
    assert_eq!(ids(&p1), ["a0", "a1"]);
    let p2 = list(ListAgentsRequest {
        page_size: 2,
        page_token: p1.next_page_token.clone(),
        ..Default::default()
    });
    assert_eq!(ids(&p2), ["a2", "a3"]);
    let p3 = list(ListAgentsRequest {
        page_size: 2,
        page_token: p2.next_page_token.clone(),
        ..Default::default()
    });
    assert_eq!(ids(&p3), ["a4"]);
    assert!(p3.next_page_token.is_empty());

    let nlp = list(ListAgentsRequest {
        capability: "nlp.analysis".into(),
        ..Default::default()
    });
    assert_eq!(
        ids(&nlp),
        ["a0", "a2", "a4"],
        "agents offering the parent capability serve the child"
    );
    let none = list(ListAgentsRequest {
        capability: "pdf.ocr.fast".into(),
        page_size: 1,
        ..Default::default()
    });
    assert_eq!(ids(&none), ["a1"]);
    let eu = list(ListAgentsRequest {
        labels: [("region".to_string(), "eu".to_string())].into(),
        capability: "nlp.analysis".into(),
        ..Default::default()
    });
    assert_eq!(ids(&eu), ["a0", "a2"]);
}

async fn tools_need_valid_schema_and_cannot_be_removed_while_used(f: Fixture) {
    let params = switchyard_kit::json::json_to_struct(
        &serde_json::json!({"type":"object","properties":{"q":{"type":"string"}}}),
    );
    let tool = Tool {
        name: "web_search".into(),
        description: "search".into(),
        parameters: params,
        endpoint: String::new(),
        ..Default::default()
    };
    let mut s = spec("a", &["nlp"]);
    s.uses_tools = vec!["web_search".into()];
    let err = register(&f.reg, s.clone()).await.unwrap_err();
    assert!(err.violations[0].description.contains("not registered"));

    f.reg
        .register_tool(rq(RegisterToolRequest {
            tool: Some(tool.clone()),
        }))
        .await
        .unwrap();
    register(&f.reg, s).await.unwrap();
    let err = ApiError::from(
        f.reg
            .deregister_tool(rq(DeregisterToolRequest {
                name: "web_search".into(),
            }))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.known_reason(), Some(Reason::ToolInUse));

    let bad = Tool {
        parameters: switchyard_kit::json::json_to_struct(&serde_json::json!({"type": 12})),
        ..tool
    };
    let err = ApiError::from(
        f.reg
            .register_tool(rq(RegisterToolRequest { tool: Some(bad) }))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.known_reason(), Some(Reason::InvalidToolSchema));
    assert_eq!(err.violations[0].field, "tool.parameters");
}

async fn watch(reg: &Registry, start: u64, epoch: &str) -> BoxWatch {
    Box::pin(
        reg.watch(rq(WatchRequest {
            start_revision: start,
            epoch: epoch.into(),
        }))
        .await
        .unwrap()
        .into_inner(),
    )
}

async fn next(s: &mut BoxWatch) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("watch event in time")
        .unwrap()
        .unwrap()
}

fn kind(ev: &WatchResponse) -> WatchEventType {
    WatchEventType::try_from(ev.r#type).unwrap()
}

async fn watch_starts_with_snapshot_then_streams_live_changes(f: Fixture) {
    register(&f.reg, spec("a", &["nlp"])).await.unwrap();
    let mut w = watch(&f.reg, 0, "").await;
    assert_eq!(kind(&next(&mut w).await), WatchEventType::Reset);
    let ev = next(&mut w).await;
    assert_eq!(kind(&ev), WatchEventType::AgentUpserted);
    assert_eq!(ev.agent.unwrap().spec.unwrap().id, "a");
    assert_eq!(kind(&next(&mut w).await), WatchEventType::SnapshotComplete);

    register(&f.reg, spec("b", &["pdf"])).await.unwrap();
    let ev = next(&mut w).await;
    assert_eq!((kind(&ev), ev.revision), (WatchEventType::AgentUpserted, 2));
    f.reg
        .deregister_agent(rq(DeregisterAgentRequest {
            agent_id: "a".into(),
        }))
        .await
        .unwrap();
    let ev = next(&mut w).await;
    assert_eq!(
        (kind(&ev), ev.removed_id.as_str()),
        (WatchEventType::AgentRemoved, "a")
    );
    f.clock.advance_ms(20_000);
    assert_eq!(f.reg.sweep(), 1);
    let ev = next(&mut w).await;
    assert_eq!(ev.agent.unwrap().status, AgentStatus::Lapsed as i32);
}

async fn watch_of_an_empty_registry_sends_one_snapshot_then_waits(f: Fixture) {
    let mut w = watch(&f.reg, 0, "").await;
    assert_eq!(kind(&next(&mut w).await), WatchEventType::Reset);
    assert_eq!(kind(&next(&mut w).await), WatchEventType::SnapshotComplete);
    let quiet = tokio::time::timeout(Duration::from_millis(100), w.next()).await;
    assert!(quiet.is_err(), "no more snapshots until something changes");
    register(&f.reg, spec("a", &["nlp"])).await.unwrap();
    let ev = next(&mut w).await;
    assert_eq!((kind(&ev), ev.revision), (WatchEventType::AgentUpserted, 1));
}

async fn watch_resumes_after_a_revision_in_the_same_epoch(f: Fixture) {
    for id in ["a", "b", "c"] {
        register(&f.reg, spec(id, &["nlp"])).await.unwrap();
    }
    let epoch = f.reg.lock().epoch.clone();
    let mut w = watch(&f.reg, 1, &epoch).await;
    let ev = next(&mut w).await;
    assert_eq!(
        (ev.revision, ev.agent.unwrap().spec.unwrap().id),
        (2, "b".to_string())
    );
    assert_eq!(next(&mut w).await.revision, 3);
}

async fn watch_gives_snapshot_for_foreign_epoch_future_revision_or_trimmed_log(f: Fixture) {
    // log capacity 8
    for i in 0..12 {
        register(&f.reg, spec(&format!("a{i}"), &["nlp"]))
            .await
            .unwrap();
    }
    let epoch = f.reg.lock().epoch.clone();
    for (start, ep) in [
        (3, epoch.as_str()),
        (5, "other-epoch"),
        (99, epoch.as_str()),
    ] {
        let mut w = watch(&f.reg, start, ep).await;
        let first = next(&mut w).await;
        assert_eq!(
            kind(&first),
            WatchEventType::Reset,
            "start {start} epoch {ep}"
        );
        assert_eq!(first.revision, 12);
    }
    // a position still in the log resumes without snapshot
    let mut w = watch(&f.reg, 6, &epoch).await;
    assert_eq!(next(&mut w).await.revision, 7);
}

#[tokio::test]
async fn agents_and_tools_survive_restart_and_expired_leases_come_back_lapsed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let f = fixture_on(reopen(dir.path()).await);
        register(&f.reg, spec("a", &["nlp"])).await.unwrap();
        f.reg
            .report_outcome(rq(ReportOutcomeRequest {
                agent_id: "a".into(),
                capability: "nlp".into(),
                success: true,
                latency: Some(duration(50)),
            }))
            .await
            .unwrap();
        let params = switchyard_kit::json::json_to_struct(&serde_json::json!({"type":"object"}));
        f.reg
            .register_tool(rq(RegisterToolRequest {
                tool: Some(Tool {
                    name: "t".into(),
                    parameters: params,
                    ..Default::default()
                }),
            }))
            .await
            .unwrap();
        f.reg.flush().unwrap();
    }
    let f = fixture_on(reopen(dir.path()).await);
    // the fixture clock starts at the same time: lease still valid
    let a = get(&f.reg, "a").await;
    assert_eq!(a.status, AgentStatus::Available as i32);
    assert_eq!(
        a.stats[0].count, 1,
        "lazily persisted stats were flushed at shutdown"
    );
    let tools = f
        .reg
        .list_tools(rq(ListToolsRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .tools;
    assert_eq!(tools.len(), 1);
    drop(f);

    let store = reopen(dir.path()).await;
    let clock = ManualClock::new(1_700_000_000_000 + 60_000);
    let (_t, shutdown) = switchyard_kit::shutdown::channel();
    let reg = Registry::open(RegistryConfig::default(), store, Arc::new(clock), shutdown).unwrap();
    assert_eq!(get(&reg, "a").await.status, AgentStatus::Lapsed as i32);
}

/// Waits (bounded) until `f` holds of `reg`'s view.
async fn until(reg: &Registry, what: &str, f: impl Fn(&State) -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !f(&reg.lock()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The lease of agent `id` as stored in the database.
async fn stored_lease(reg: &Registry, id: &str) -> u64 {
    let durable::Durable::Pg(pg) = &reg.inner.durable else {
        panic!("not on PostgreSQL")
    };
    let a = pg.agent(id).await.unwrap().unwrap();
    a.lease_expires_at.as_ref().map_or(0, timestamp_ms)
}

#[tokio::test]
async fn two_replicas_share_registrations_and_lapse_an_agent_from_the_same_lease() {
    let Some(url) = switchyard_testkit::pg::fresh_database() else {
        return;
    };
    let clock = ManualClock::new(1_700_000_000_000);
    let (a, b) = (replica(&url, &clock).await, replica(&url, &clock).await);
    register(&a.reg, spec("x", &["nlp.summarize"]))
        .await
        .unwrap();
    // B learns of it from the change log.
    until(&b.reg, "B to see agent x", |st| st.agents.contains_key("x")).await;
    let available = |r: &Registry| r.lock().agents.get("x").map(Entry::status);

    // Heartbeats reach A only, for longer than the 10 s lease: B keeps the
    // agent too, from the leases A writes in batches.
    for _ in 0..5 {
        clock.advance_ms(4_000);
        let hb = HeartbeatRequest {
            agent_id: "x".into(),
            in_flight: 0,
        };
        a.reg.heartbeat(rq(hb)).await.unwrap();
        a.reg.persist_dirty().await.unwrap();
        b.reg.sync_leases().await.unwrap();
        assert_eq!((a.reg.sweep(), b.reg.sweep()), (0, 0));
        assert_eq!(available(&b.reg), Some(AgentStatus::Available));
    }

    // Heartbeats write no row each: the stored lease moves at the batch.
    let before = stored_lease(&a.reg, "x").await;
    for _ in 0..100 {
        clock.advance_ms(10);
        let hb = HeartbeatRequest {
            agent_id: "x".into(),
            in_flight: 1,
        };
        a.reg.heartbeat(rq(hb)).await.unwrap();
    }
    assert_eq!(
        stored_lease(&a.reg, "x").await,
        before,
        "no write per heartbeat"
    );
    assert_eq!(
        a.reg.persist_dirty().await.unwrap(),
        1,
        "one agent in the batch"
    );
    assert_eq!(stored_lease(&a.reg, "x").await, clock.now_ms() + 10_000);

    // No more heartbeats: both replicas lapse it once the lease ran out.
    clock.advance_ms(10_001);
    b.reg.sync_leases().await.unwrap();
    assert_eq!((a.reg.sweep(), b.reg.sweep()), (1, 1));
    assert_eq!(available(&a.reg), Some(AgentStatus::Lapsed));
    assert_eq!(available(&b.reg), Some(AgentStatus::Lapsed));

    // A heartbeat to B revives it on A too.
    let hb = HeartbeatRequest {
        agent_id: "x".into(),
        in_flight: 0,
    };
    b.reg.heartbeat(rq(hb)).await.unwrap();
    b.reg.persist_dirty().await.unwrap();
    a.reg.sync_leases().await.unwrap();
    assert_eq!(available(&a.reg), Some(AgentStatus::Available));

    // Deregistered through B: gone from A.
    b.reg
        .deregister_agent(rq(DeregisterAgentRequest {
            agent_id: "x".into(),
        }))
        .await
        .unwrap();
    until(&a.reg, "A to forget agent x", |st| {
        !st.agents.contains_key("x")
    })
    .await;
}
