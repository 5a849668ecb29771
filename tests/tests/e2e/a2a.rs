//! A2A agents as agents, against an agent built with the Python `a2a-sdk`
//! and served by that SDK's own server (`examples/a2a/agent.py`): registered
//! from its Agent Card, routed to by skill, invoked over A2A 1.0 JSON-RPC
//! with streamed updates, its final states mapped to AgentResponse,
//! cancelled when the job is, and mixed with a native agent in one job.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_kit::error::ApiError;
use switchyard_kit::json::struct_to_json;
use switchyard_proto::executor::v1::{CancelJobRequest, JobState, TaskState, WatchJobRequest};
use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
use switchyard_proto::registry::v1::*;
use tokio_stream::StreamExt;

use crate::common::{finish, id, submit};
use crate::llm::{Env, env, events, task};
use crate::mcp::{Child, listening, python, until};

fn agent_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/a2a/agent.py")
}

/// The Python agent, logging to `log`.
async fn start_agent(log: &Path) -> Child {
    start_agent_of(log, "").await
}

/// The Python agent, logging to `log`, its card's interface naming
/// `tenant` (when not empty).
async fn start_agent_of(log: &Path, tenant: &str) -> Child {
    listening(
        &python(),
        &[
            &agent_script().display().to_string(),
            &log.display().to_string(),
            "0",
            tenant,
        ],
    )
    .await
}

/// The Python agent with an A2A 0.3 card, logging each JSON-RPC method
/// it is called with.
async fn start_agent_v03(log: &Path) -> Child {
    listening(
        &python(),
        &[
            &agent_script().display().to_string(),
            &log.display().to_string(),
            "0",
            "",
            "0.3",
        ],
    )
    .await
}

/// A2A 0.3 agents are still about: one whose card is 0.3 (one `url`) is
/// registered and spoken to in 0.3 — `message/stream`, `tasks/cancel`,
/// `kind`-tagged messages — its answers read as a 1.0 agent's are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_0_3_agent_is_spoken_to_in_0_3_as_its_card_says() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let agent = start_agent_v03(&log).await;
    let (mut e, reg) = stack_with(&agent, |_| {}).await;
    let a2a = reg.agent.unwrap().spec.unwrap().a2a.unwrap();
    assert_eq!(a2a.protocol_version, "0.3.0");
    assert!(a2a.streaming);

    shouts_hello(&mut e).await;

    let j = submit(&mut e.jobs, &job("text.wait", "wait: a minute"))
        .await
        .unwrap();
    crate::common::until_event(&mut e.jobs, &id(&j), "agent.progress").await;
    cancel_heard(&mut e.jobs, &id(&j), &log).await;
    let heard = std::fs::read_to_string(&log).unwrap();
    let methods: Vec<&str> = heard
        .lines()
        .filter_map(|l| l.strip_prefix("method "))
        .collect();
    assert_eq!(
        methods,
        ["message/stream", "message/stream", "tasks/cancel"],
        "{heard}"
    );
    drop(agent);
    e.stack.stop().await.unwrap();
}

/// The stack (auto-approving small spend), with the agent registered at
/// $0.001 a call.
async fn stack_with(
    agent: &Child,
    tweak: impl FnOnce(&mut switchyard_cli::Config),
) -> (Env, RegisterA2aAgentResponse) {
    let e = env(true, tweak).await;
    let mut r = RegistryServiceClient::new(e.stack.channel().await.unwrap());
    let reg = r
        .register_a2a_agent(RegisterA2aAgentRequest {
            card_url: format!(
                "http://127.0.0.1:{}/.well-known/agent-card.json",
                agent.port
            ),
            trust_score: 75,
            price_per_unit_micro_usd: 1_000,
            latency_estimate_ms: 200,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // The router learns of the agent from the registry's watch, a moment
    // later: a job submitted before then is estimated without the agent's
    // price, and an unpriced estimate waits for a person instead of the
    // auto-approval. So wait until the router routes to it.
    let spec = reg.agent.clone().unwrap().spec.unwrap();
    let cap = spec.capabilities[0].name.clone();
    let router = switchyard_proto::router::v1::router_service_client::RouterServiceClient::new(
        e.stack.channel().await.unwrap(),
    );
    until("the router sees the A2A agent", || {
        let (mut router, cap, id) = (router.clone(), cap.clone(), spec.id.clone());
        async move {
            crate::common::route(&mut router, &cap, &[])
                .await
                .is_ok_and(|r| crate::common::ids(&r) == [id])
        }
    })
    .await;
    (e, reg)
}

/// Runs `shout: hello` on the agent: it completes with HELLO and the
/// `shouted` artifact, its working updates arriving as it ran. The job's
/// events.
async fn shouts_hello(e: &mut Env) -> Vec<(String, Value)> {
    let j = submit(&mut e.jobs, &job("text.shout", "shout: hello"))
        .await
        .unwrap();
    let res = finish(&mut e.jobs, &id(&j)).await;
    assert_eq!(res.state, JobState::Completed as i32, "{res:?}");
    let t = task(&res, "t");
    assert_eq!(t.agent_id, "text_tricks");
    let out = output(t);
    assert_eq!(out["text"], "HELLO");
    assert_eq!(out["artifacts"][0]["name"], "shouted");
    let evs = events(&mut e.jobs, &id(&j)).await;
    let progress: Vec<&str> = evs
        .iter()
        .filter(|(k, _)| k == "agent.progress")
        .map(|(_, d)| d["message"].as_str().unwrap())
        .collect();
    assert_eq!(progress, ["reading the text", "raising its voice"]);
    evs
}

/// Cancels `job_id` and waits until the agent (logging to `log`) records
/// that its A2A task was cancelled.
async fn cancel_heard(jobs: &mut crate::common::Jobs, job_id: &str, log: &Path) {
    jobs.cancel_job(CancelJobRequest {
        job_id: job_id.into(),
        reason: "no longer needed".into(),
    })
    .await
    .unwrap();
    until("the agent records the cancellation", || async {
        std::fs::read_to_string(log).is_ok_and(|l| l.contains("cancelled "))
    })
    .await;
}

/// A one-task job on `capability` with `text` as its task, no retries.
fn job(capability: &str, text: &str) -> String {
    json!({"plan_id": "a2a", "tasks": [{"id": "t", "retry": {"max_retries": 0},
        "agent": {"capability": capability, "input": {"task": text}}}]})
    .to_string()
}

fn output(t: &switchyard_proto::executor::v1::TaskStatus) -> Value {
    t.output.as_ref().map(struct_to_json).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_agent_is_registered_from_its_card_and_routed_to_by_skill_with_streamed_updates() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    // Its card's interface serves tenant team-blue (A2A 1.0 tenancy).
    let agent = start_agent_of(&log, "team-blue").await;
    let (mut e, reg) = stack_with(&agent, |_| {}).await;
    let spec = reg.agent.unwrap().spec.unwrap();
    assert_eq!(spec.id, "text_tricks");
    let caps: Vec<&str> = spec.capabilities.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        caps,
        [
            "text.shout",
            "text.fail",
            "text.refuse",
            "text.ask",
            "text.wait"
        ]
    );
    let a2a = spec.a2a.unwrap();
    assert!(a2a.streaming);
    assert_eq!(a2a.protocol_version, "1.0");
    assert_eq!(a2a.tenant, "team-blue");

    let evs = shouts_hello(&mut e).await;
    assert!(
        evs.iter()
            .any(|(k, d)| k == "task.output" && d["chunk"] == "HELLO")
    );
    let committed: Vec<i64> = evs
        .iter()
        .filter(|(k, _)| k == "budget.committed")
        .map(|(_, d)| d["cost_micro_usd"].as_i64().unwrap())
        .collect();
    assert_eq!(
        committed,
        [1_000],
        "the registered price, on the job's budget"
    );
    // The request named the card's tenant.
    let heard = std::fs::read_to_string(&log).unwrap();
    assert!(
        heard.contains("request shout: hello\ntenant team-blue"),
        "{heard}"
    );
    drop(agent);
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_final_states_become_the_task_outcome_the_mapping_says() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&dir.path().join("agent.log")).await;
    let (mut e, _) = stack_with(&agent, |_| {}).await;
    for (cap, text, says) in [
        (
            "text.fail",
            "fail: no disk",
            "the A2A agent failed the task: cannot do it: no disk",
        ),
        (
            "text.refuse",
            "refuse: poems",
            "rejected the task: not my kind of work: poems",
        ),
        ("text.ask", "ask: x", "input-required"),
    ] {
        let j = submit(&mut e.jobs, &job(cap, text)).await.unwrap();
        let res = finish(&mut e.jobs, &id(&j)).await;
        assert_eq!(res.state, JobState::Discarded as i32, "{cap}: {res:?}");
        let t = task(&res, "t");
        assert_eq!(t.state, TaskState::Failed as i32, "{cap}");
        assert!(t.error.contains(says), "{cap}: {}", t.error);
    }
    drop(agent);
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_job_cancels_the_a2a_task() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let agent = start_agent(&log).await;
    let (mut e, _) = stack_with(&agent, |_| {}).await;
    let j = submit(&mut e.jobs, &job("text.wait", "wait: a minute"))
        .await
        .unwrap();
    let job_id = id(&j);
    // Running: the agent's first update is on the job.
    let mut jobs = e.jobs.clone();
    let mut watch = jobs
        .watch_job(WatchJobRequest {
            job_id: job_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // A bound on waiting for the event, not a sleep: generous, because on
    // two cores this test shares the machine with the whole suite (its
    // PostgreSQL stacks included) and the agent is a Python process.
    let mut seen = Vec::new();
    let progressed = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(Ok(m)) = watch.next().await {
            let Some(ev) = m.event else { continue };
            if ev.kind == "agent.progress" {
                return true;
            }
            let data = ev.data.as_ref().map(struct_to_json).unwrap_or(Value::Null);
            seen.push(format!("{} {}", ev.kind, data));
        }
        false
    })
    .await;
    if progressed.as_ref().ok() != Some(&true) {
        // Where it stopped: the events so far, the job now, what the agent heard.
        let now = crate::common::job(&mut e.jobs, &job_id).await;
        panic!(
            "the agent reported no progress ({progressed:?}); events: {seen:#?}\njob: {now:?}\nagent log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    cancel_heard(&mut jobs, &job_id, &log).await;
    let res = finish(&mut e.jobs, &job_id).await;
    assert_eq!(res.state, JobState::Cancelled as i32);
    drop(agent);
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_mixes_a_native_agent_and_an_a2a_agent() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&dir.path().join("agent.log")).await;
    let (mut e, _) = stack_with(&agent, |_| {}).await;
    let doc = json!({"plan_id": "mixed", "tasks": [
        {"id": "greet", "agent": {"capability": "builtin.echo", "input": {"text": "hello from echo"}}},
        {"id": "loud", "depends_on": ["greet"],
         "agent": {"capability": "text.shout", "input": {"task": "shout: ${greet.output.text}"}}}
    ]})
    .to_string();
    let j = submit(&mut e.jobs, &doc).await.unwrap();
    let res = finish(&mut e.jobs, &id(&j)).await;
    assert_eq!(res.state, JobState::Completed as i32, "{res:?}");
    assert_eq!(task(&res, "greet").agent_id, "builtin");
    let loud = task(&res, "loud");
    assert_eq!(loud.agent_id, "text_tricks");
    assert_eq!(output(loud)["text"], "HELLO FROM ECHO");
    drop(agent);
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_keeps_an_a2a_agent_alive_while_its_card_answers_and_lets_it_lapse_after() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&dir.path().join("agent.log")).await;
    let (e, reg) = stack_with(&agent, |c| c.registry.lease_ttl_secs = 1).await;
    let first = reg.lease.unwrap().expires_at.unwrap();
    let mut r = RegistryServiceClient::new(e.stack.channel().await.unwrap());
    let get = |r: &RegistryServiceClient<_>| {
        let mut r = r.clone();
        async move {
            r.get_agent(GetAgentRequest {
                agent_id: "text_tricks".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .agent
            .unwrap()
        }
    };
    // It never heartbeats; the registry renews it by reading its card.
    until("the lease is renewed", || async {
        let a = get(&r).await;
        a.lease_expires_at.unwrap().seconds > first.seconds + 1
            && a.status == AgentStatus::Available as i32
    })
    .await;
    drop(agent);
    until("the agent lapses once its card is gone", || async {
        get(&r).await.status == AgentStatus::Lapsed as i32
    })
    .await;
    // A card that cannot be read is refused, and nothing is stored.
    let s = r
        .register_a2a_agent(RegisterA2aAgentRequest {
            card_url: "http://127.0.0.1:9/.well-known/agent-card.json".into(),
            id: "ghost".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        ApiError::from(s.clone()).reason.as_deref(),
        Some("A2A_AGENT_UNAVAILABLE"),
        "{s:?}"
    );
    let s = r
        .get_agent(GetAgentRequest {
            agent_id: "ghost".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::NotFound);
    // Only RegisterA2aAgent says an agent is A2A.
    let mut spec = crate::common::agent("pretender", "text.shout", 90, 1);
    spec.a2a = Some(A2aBinding {
        card_url: "http://127.0.0.1:9/".into(),
        protocol_version: "1.0".into(),
        streaming: true,
        card_signed_by: "forged".into(),
        ..Default::default()
    });
    let stored = r
        .register_agent(RegisterAgentRequest { agent: Some(spec) })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert!(stored.spec.unwrap().a2a.is_none());
    e.stack.stop().await.unwrap();
}

/// The agent with its card signed by the `a2a-sdk`'s own signer
/// (`tests/a2a/signed_agent.py`, ES256) in `mode`; its public key set is
/// written to `<dir>/<mode>.jwks`, returned with it.
async fn start_signed(dir: &Path, mode: &str) -> (Child, String, PathBuf) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/a2a/signed_agent.py");
    let jwks = dir.join(format!("{mode}.jwks"));
    let agent = listening(
        &python(),
        &[
            &script.display().to_string(),
            &dir.join(format!("{mode}.log")).display().to_string(),
            &jwks.display().to_string(),
            mode,
        ],
    )
    .await;
    let url = format!(
        "http://127.0.0.1:{}/.well-known/agent-card.json",
        agent.port
    );
    (agent, url, jwks)
}

/// RegisterA2aAgent of the card at `url` as `id`, with `card_keys` pinned.
fn signed_req(url: &str, id: &str, card_keys: &str) -> RegisterA2aAgentRequest {
    RegisterA2aAgentRequest {
        card_url: url.into(),
        id: id.into(),
        trust_score: 75,
        price_per_unit_micro_usd: 1_000,
        card_keys: card_keys.into(),
        ..Default::default()
    }
}

fn reason(s: &tonic::Status) -> String {
    ApiError::from(s.clone()).reason.unwrap_or_default()
}

/// Signed Agent Cards, signed by the reference SDK: a card whose signature
/// verifies with the key its `jku` names on the card's origin, or with
/// pinned keys, is registered and says by which key; a card changed after
/// it was signed, one signed by a key other than the pinned one, one whose
/// `jku` is elsewhere, and an unsigned card when keys are pinned are
/// refused (`A2A_CARD_UNVERIFIED`) with nothing stored; symmetric or
/// malformed pinned keys are invalid input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_agent_card_is_verified_and_a_tampered_or_untrusted_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_signed, signed_url, signed_keys) = start_signed(dir.path(), "signed").await;
    let (_tampered, tampered_url, other_keys) = start_signed(dir.path(), "tampered").await;
    let (_unsigned, unsigned_url, unsigned_keys) = start_signed(dir.path(), "unsigned").await;
    let (_elsewhere, elsewhere_url, _) = start_signed(dir.path(), "elsewhere").await;
    let e = env(true, |_| {}).await;
    let mut r = RegistryServiceClient::new(e.stack.channel().await.unwrap());
    let keys = |p: &Path| std::fs::read_to_string(p).unwrap();

    // Verified with the key its jku names (on the card's own origin), and
    // with the same key pinned.
    for (id, pinned) in [("by_jku", String::new()), ("pinned", keys(&signed_keys))] {
        let got = r
            .register_a2a_agent(signed_req(&signed_url, id, &pinned))
            .await
            .unwrap()
            .into_inner();
        let a2a = got.agent.unwrap().spec.unwrap().a2a.unwrap();
        assert_eq!(a2a.card_signed_by, "text-tricks-2026", "{id}");
    }

    // Refused, and nothing stored.
    let refused = [
        (
            "tampered",
            signed_req(&tampered_url, "tampered", ""),
            "does not verify",
        ),
        (
            "signed by another key than the pinned one",
            signed_req(&signed_url, "other_key", &keys(&other_keys)),
            "does not verify",
        ),
        (
            "its keys published on another origin",
            signed_req(&elsewhere_url, "elsewhere", ""),
            "no key to check it is trusted",
        ),
        (
            "unsigned though keys are pinned",
            signed_req(&unsigned_url, "unsigned_pinned", &keys(&unsigned_keys)),
            "unsigned",
        ),
    ];
    for (what, req, says) in refused {
        let id = req.id.clone();
        let s = r.register_a2a_agent(req).await.unwrap_err();
        assert_eq!(reason(&s), "A2A_CARD_UNVERIFIED", "{what}: {s:?}");
        assert!(s.message().contains(says), "{what}: {}", s.message());
        let gone = r
            .get_agent(GetAgentRequest { agent_id: id })
            .await
            .unwrap_err();
        assert_eq!(gone.code(), tonic::Code::NotFound, "{what}");
    }

    // Unsigned, with no keys pinned: registered as unsigned.
    let got = r
        .register_a2a_agent(signed_req(&unsigned_url, "unsigned", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.agent.unwrap().spec.unwrap().a2a.unwrap().card_signed_by,
        ""
    );

    // Pinned keys must be public keys in a JWKS.
    for bad in [
        "not json",
        r#"{"keys": []}"#,
        r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}"#,
    ] {
        let s = r
            .register_a2a_agent(signed_req(&signed_url, "bad_keys", bad))
            .await
            .unwrap_err();
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{bad}: {s:?}");
        assert!(s.message().contains("card_keys"), "{}", s.message());
    }
    e.stack.stop().await.unwrap();
}

/// `registry.a2a.card_signatures = "required"`: an unsigned card is
/// refused, a signed one registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_card_signatures_refuse_an_unsigned_card() {
    let dir = tempfile::tempdir().unwrap();
    let (_signed, signed_url, _) = start_signed(dir.path(), "signed").await;
    let (_unsigned, unsigned_url, _) = start_signed(dir.path(), "unsigned").await;
    let e = env(true, |c| {
        c.registry.a2a.card_signatures = switchyard_registry::a2a::CardSignatures::Required
    })
    .await;
    let mut r = RegistryServiceClient::new(e.stack.channel().await.unwrap());
    let s = r
        .register_a2a_agent(signed_req(&unsigned_url, "unsigned", ""))
        .await
        .unwrap_err();
    assert_eq!(reason(&s), "A2A_CARD_UNVERIFIED", "{s:?}");
    assert!(s.message().contains("card_signatures"), "{}", s.message());
    r.register_a2a_agent(signed_req(&signed_url, "signed", ""))
        .await
        .unwrap();
    e.stack.stop().await.unwrap();
}

/// A card registered signed must stay so: once its host serves a changed
/// card, the registry stops renewing the agent's lease and it lapses (not
/// routed to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_signed_card_is_changed_after_registration_lapses() {
    let dir = tempfile::tempdir().unwrap();
    let (_agent, url, jwks) = start_signed(dir.path(), "switch").await;
    let e = env(true, |c| c.registry.lease_ttl_secs = 1).await;
    let mut r = RegistryServiceClient::new(e.stack.channel().await.unwrap());
    r.register_a2a_agent(signed_req(&url, "switching", ""))
        .await
        .unwrap();
    let agent = |r: &RegistryServiceClient<_>| {
        let mut r = r.clone();
        async move {
            r.get_agent(GetAgentRequest {
                agent_id: "switching".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .agent
            .unwrap()
        }
    };
    let first = agent(&r).await.lease_expires_at.unwrap();
    until("the signed card keeps the lease", || async {
        agent(&r).await.lease_expires_at.unwrap().seconds > first.seconds + 1
    })
    .await;
    std::fs::write(format!("{}.tamper", jwks.display()), b"").unwrap();
    until("the agent with a changed card lapses", || async {
        agent(&r).await.status == AgentStatus::Lapsed as i32
    })
    .await;
    e.stack.stop().await.unwrap();
}
