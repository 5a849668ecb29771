//! Provider rate limits end to end: model calls of many jobs against a
//! scripted OpenAI-compatible server that records when each request
//! arrived. The server must never see more requests than the limit in any
//! window, and a 429 it answers must hold every later call through the
//! same key for the time it asked.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::{Duration, Instant};

use switchyard_llm::scripted::Reply;
use switchyard_proto::executor::v1::JobState;
use switchyard_proto::ledger::v1::ListLimitsRequest;
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;

use crate::common::{finish, id, submit};
use crate::llm::{env, events};

/// The most requests that arrived within any `window` (sliding).
fn most_in_any_window(at: &[Instant], window: Duration) -> usize {
    let mut at = at.to_vec();
    at.sort();
    let mut most = 0;
    let mut start = 0;
    for end in 0..at.len() {
        while at[end].duration_since(at[start]) >= window {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

fn limit(rpm: u64, window_ms: u64) -> switchyard_ledger::rates::LimitConfig {
    switchyard_ledger::rates::LimitConfig {
        name: "openai-rpm".into(),
        provider: "openai".into(),
        requests_per_minute: Some(rpm),
        window_ms,
        ..Default::default()
    }
}

/// Waits (5 s at most) until the ledger holds a cooldown on upstream key
/// `key` (the executor reports it on its own, beside the job).
async fn until_cooling(stack: &switchyard_testkit::Stack, key: &str) {
    let mut ledger = LedgerServiceClient::new(stack.channel().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let l = ledger
            .list_limits(ListLimitsRequest::default())
            .await
            .unwrap()
            .into_inner();
        let scope = format!("key:{key}");
        if l.buckets
            .iter()
            .any(|b| b.scope == scope && b.cooldown_until.is_some())
        {
            return;
        }
        assert!(Instant::now() < deadline, "no cooldown on {key}: {l:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Once the ledger holds the cooldown the first call's answer caused, a
/// second job's call: how long after the first it reached the server, and
/// the data of its `llm.rate_limited` waiting event.
async fn next_call_after_cooldown(e: &mut crate::llm::Env) -> (Duration, serde_json::Value) {
    let first_at = e.script.received()[0].at;
    until_cooling(&e.stack, "openai").await;
    let second = id(&submit(&mut e.jobs, ASK).await.unwrap());
    let r = finish(&mut e.jobs, &second).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let gap = e.script.received()[1].at.duration_since(first_at);
    let log = events(&mut e.jobs, &second).await;
    let (_, w) = log
        .into_iter()
        .find(|(k, d)| k == "llm.rate_limited" && d["phase"] == "waiting")
        .unwrap();
    (gap, w)
}

const ASK: &str = r#"{"type": "t.ask", "args": ["Say fine"], "ext_agent_model": "gpt-4o", "ext_agent_max_tokens": 20}"#;

#[tokio::test]
async fn calls_of_many_jobs_never_exceed_a_requests_limit_in_any_window_and_waits_are_events() {
    let (rpm, window) = (3u64, Duration::from_millis(1_000));
    let mut e = env(true, |c| {
        c.ledger.limits.push(limit(rpm, window.as_millis() as u64));
    })
    .await;
    e.script.otherwise(Reply::text("fine", 10, 2));
    let started = Instant::now();
    let mut jobs = Vec::new();
    for _ in 0..9 {
        jobs.push(id(&submit(&mut e.jobs, ASK).await.unwrap()));
    }
    for j in &jobs {
        let r = finish(&mut e.jobs, j).await;
        assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    }
    let took = started.elapsed();
    let at: Vec<Instant> = e.script.received().iter().map(|r| r.at).collect();
    assert_eq!(at.len(), 9, "one request per job, none refused upstream");
    let most = most_in_any_window(&at, window);
    println!("most requests in any {window:?}: {most} (limit {rpm}); 9 calls took {took:?}");
    assert!(most as u64 <= rpm, "{most} requests in one window");
    // Nine calls at three a window need two windows of waiting at least.
    let span = at
        .iter()
        .max()
        .unwrap()
        .duration_since(*at.iter().min().unwrap());
    assert!(span >= window * 2, "{span:?}");
    // The jobs that waited say so, with the limit and why.
    let mut waited = 0;
    for j in &jobs {
        let log = events(&mut e.jobs, j).await;
        let phases: Vec<&str> = log
            .iter()
            .filter(|(k, _)| k == "llm.rate_limited")
            .filter_map(|(_, d)| d["phase"].as_str())
            .collect();
        if phases.contains(&"waiting") {
            waited += 1;
            assert!(phases.contains(&"granted"), "{phases:?}");
            let w = log
                .iter()
                .find(|(k, d)| k == "llm.rate_limited" && d["phase"] == "waiting")
                .unwrap();
            assert_eq!(w.1["limit"], "openai-rpm");
            assert!(
                w.1["why"].as_str().unwrap().contains("allows 3 requests"),
                "{w:?}"
            );
        }
    }
    assert!(waited >= 6, "{waited} jobs waited");
    // The bucket is visible, with what it granted.
    let mut ledger = LedgerServiceClient::new(e.stack.channel().await.unwrap());
    let limits = ledger
        .list_limits(ListLimitsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let b = limits
        .buckets
        .iter()
        .find(|b| b.limit == "openai-rpm")
        .unwrap();
    assert_eq!((b.scope.as_str(), b.granted), ("shared", 9));
    assert!(b.waits > 0, "{b:?}");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_429_holds_every_later_call_through_the_key_for_the_time_the_provider_asked() {
    let mut e = env(true, |c| {
        c.ledger.limits.push(limit(1_000, 60_000));
        // The chain itself does not retry: the cooldown is what holds.
        c.llm.max_rounds = 1;
    })
    .await;
    e.script
        .for_model("gpt-4o", vec![Reply::status(429).retry_after("2")]);
    e.script.otherwise(Reply::text("fine", 10, 2));
    let first = id(&submit(&mut e.jobs, ASK).await.unwrap());
    let r = finish(&mut e.jobs, &first).await;
    assert_eq!(
        r.state,
        JobState::Discarded as i32,
        "the 429 ends it: {r:?}"
    );
    // The next job's call waits out the cooldown before it is sent.
    let (gap, w) = next_call_after_cooldown(&mut e).await;
    println!("the call after the 429 went {gap:?} later (Retry-After 2 s)");
    assert!(gap >= Duration::from_millis(1_900), "{gap:?}");
    assert_eq!(w["scope"], "key:openai");
    assert!(w["why"].as_str().unwrap().contains("429"), "{w:?}");
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_fallback_model_takes_room_of_its_own_and_one_without_room_is_not_called() {
    // gpt-4o-mini may be called once a minute, gpt-4o freely.
    let mut e = env(true, |c| {
        c.ledger.limits.push(switchyard_ledger::rates::LimitConfig {
            name: "mini".into(),
            model: "gpt-4o-mini".into(),
            requests_per_minute: Some(1),
            tokens_per_minute: Some(10_000),
            ..Default::default()
        });
        c.llm.max_rounds = 1;
        c.executor.llm_rate_max_wait_ms = 200;
    })
    .await;
    e.script
        .for_model("gpt-4o", vec![Reply::status(503), Reply::status(503)]);
    e.script
        .for_model("gpt-4o-mini", vec![Reply::text("from mini", 10, 2)]);
    let doc = r#"{"type": "t.ask", "args": ["hi"], "ext_agent_model": "gpt-4o", "ext_agent_max_tokens": 20,
                  "ext_agent_fallback_models": ["gpt-4o-mini"]}"#;
    let first = id(&submit(&mut e.jobs, doc).await.unwrap());
    let r = finish(&mut e.jobs, &first).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    // The fallback's room was taken, and what it did not use came back.
    let mut ledger = LedgerServiceClient::new(e.stack.channel().await.unwrap());
    let mini = |l: &switchyard_proto::ledger::v1::ListLimitsResponse| {
        l.buckets
            .iter()
            .find(|b| b.limit == "mini")
            .cloned()
            .unwrap()
    };
    let l = ledger
        .list_limits(ListLimitsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let used: Vec<(String, u64)> = mini(&l)
        .r#use
        .iter()
        .map(|u| (u.dimension.clone(), u.used))
        .collect();
    assert_eq!(
        used,
        [
            ("requests_per_minute".to_owned(), 1),
            ("tokens_per_minute".to_owned(), 12)
        ]
    );
    // A second job's fallback finds no room: it is not called, and the
    // job says why.
    let second = id(&submit(&mut e.jobs, doc).await.unwrap());
    let r = finish(&mut e.jobs, &second).await;
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    assert_eq!(
        e.script.models_called(),
        ["gpt-4o", "gpt-4o-mini", "gpt-4o"],
        "the second fallback was never sent"
    );
    let log = events(&mut e.jobs, &second).await;
    let deferred = log
        .iter()
        .find(|(k, d)| k == "llm.call" && d["outcome"] == "deferred")
        .unwrap();
    assert!(
        deferred.1["error"]
            .as_str()
            .unwrap()
            .contains("limit mini allows 1 requests"),
        "{deferred:?}"
    );
    e.stack.stop().await.unwrap();
}

/// A job of one command that takes `secs`, as `id`.
fn sleeper(id: &str, secs: f64) -> String {
    serde_json::json!({"job_id": id, "tasks": [{"id": "a", "command": {"command": "sleep", "args": [secs.to_string()]}}]})
        .to_string()
}

#[tokio::test]
async fn a_tenant_runs_at_most_its_cap_of_jobs_at_once_and_another_tenant_is_not_held() {
    let mut e = env(false, |c| {
        c.executor.max_running_jobs_per_tenant = 1;
        c.executor.commands.push("sleep".into());
    })
    .await;
    let bea = crate::common::tenant_key(
        &e.stack,
        "tenant-b",
        "bea",
        &["submitter"],
        switchyard_proto::auth::v1::PrincipalKind::Human,
    )
    .await;
    let mut b = switchyard_proto::executor::v1::job_service_client::JobServiceClient::new(
        e.stack.channel_with(&bea).await.unwrap(),
    );
    let first = id(&submit(&mut e.jobs, &sleeper("cap-1", 0.6)).await.unwrap());
    let second = id(&submit(&mut e.jobs, &sleeper("cap-2", 0.1)).await.unwrap());
    let other = id(&submit(&mut b, &sleeper("cap-b", 0.1)).await.unwrap());
    // Tenant b's job is not held by tenant a's cap: it ends first.
    let rb = finish(&mut b, &other).await;
    assert_eq!(rb.state, JobState::Completed as i32, "{rb:?}");
    let r1 = finish(&mut e.jobs, &first).await;
    let r2 = finish(&mut e.jobs, &second).await;
    assert_eq!(
        (r1.state, r2.state),
        (JobState::Completed as i32, JobState::Completed as i32)
    );
    // The second of alice's jobs waited for the first's slot, and said so.
    let log = events(&mut e.jobs, &second).await;
    let phases: Vec<&str> = log
        .iter()
        .filter(|(k, _)| k == "job.waiting_for_slot")
        .filter_map(|(_, d)| d["phase"].as_str())
        .collect();
    assert_eq!(phases, ["waiting", "granted"], "{log:?}");
    let granted = log
        .iter()
        .find(|(k, d)| k == "job.waiting_for_slot" && d["phase"] == "granted")
        .unwrap();
    assert!(
        granted.1["waited_ms"].as_u64().unwrap() >= 300,
        "{granted:?}"
    );
    assert_eq!(granted.1["cap"], 1);
    let log = events(&mut b, &other).await;
    assert!(
        !log.iter().any(|(k, _)| k == "job.waiting_for_slot"),
        "{log:?}"
    );
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn an_answer_saying_the_limit_has_nothing_left_holds_the_next_call_until_its_reset() {
    let mut e = env(true, |c| {
        c.ledger.limits.push(limit(1_000, 60_000));
    })
    .await;
    e.script.for_model(
        "gpt-4o",
        vec![
            Reply::text("fine", 10, 2)
                .header("x-ratelimit-remaining-requests", "0")
                .header("x-ratelimit-reset-requests", "2s"),
        ],
    );
    e.script.otherwise(Reply::text("fine", 10, 2));
    let first = id(&submit(&mut e.jobs, ASK).await.unwrap());
    let r = finish(&mut e.jobs, &first).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let (gap, w) = next_call_after_cooldown(&mut e).await;
    println!("the call after 'nothing left, resets in 2s' went {gap:?} later");
    assert!(gap >= Duration::from_millis(1_900), "{gap:?}");
    assert!(w["why"].as_str().unwrap().contains("nothing left"), "{w:?}");
    e.stack.stop().await.unwrap();
}
