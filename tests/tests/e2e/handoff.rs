//! Handoff mode (seed ADR 003 phase 2): the orchestrator of a conversation
//! hands it to an agent registered with integration mode HANDOFF; the
//! person's messages then go to that agent — with only what the handoff
//! passes it — until it hands back or the orchestrator reclaims it (the
//! person's `/reclaim`, the handoff's limits, an error, a refusal).

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_kit::json::struct_to_json;
use switchyard_llm::scripted::Reply;
use switchyard_proto::agent::v1::{AgentResponse, IntegrationMode};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{JobState, SendMessageRequest, WatchJobRequest};
use switchyard_proto::registry::v1::{AgentSpec, Capability};
use tokio_stream::StreamExt;

use crate::common::{Jobs, finish, job, submit};
use crate::conversation::history;
use crate::llm::{Env, env};

/// A handoff agent that records every request and answers by the last
/// message: `done` hands back, `fail` errs, `nope` refuses, anything else
/// gets a reply naming how many messages it was sent.
#[derive(Clone, Default)]
struct Travel(Arc<Mutex<Vec<switchyard_agent_sdk::Invocation>>>);

#[tonic::async_trait]
impl switchyard_agent_sdk::Agent for Travel {
    async fn invoke(
        &self,
        req: switchyard_agent_sdk::Invocation,
        _progress: switchyard_agent_sdk::Progress,
    ) -> AgentResponse {
        self.0.lock().unwrap().push(req.clone());
        let input = req.input.as_ref().map(struct_to_json).unwrap_or_default();
        let messages = input["messages"].as_array().cloned().unwrap_or_default();
        let last = messages
            .last()
            .and_then(|m| m["text"].as_str())
            .unwrap_or_default()
            .to_owned();
        let mut r = match last.as_str() {
            "done" => switchyard_agent_sdk::respond::success(
                "All booked.",
                Some(json!({"handback": true, "result": {"booked": "Lisbon"}})),
            ),
            "fail" => switchyard_agent_sdk::respond::error("the booking system is down"),
            "nope" => switchyard_agent_sdk::respond::refused("I only book trains"),
            _ => switchyard_agent_sdk::respond::success(
                format!("travel heard {} messages", messages.len()),
                None,
            ),
        };
        r.tokens_used = 5;
        r
    }
}

impl Travel {
    fn requests(&self) -> Vec<switchyard_agent_sdk::Invocation> {
        self.0.lock().unwrap().clone()
    }
}

/// The stack with the scripted model, and the travel agent registered in
/// handoff mode; stop with the returned trigger.
async fn stack_with_travel() -> (Env, Travel, switchyard_kit::shutdown::Trigger) {
    let e = env(true, |_| {}).await;
    let travel = Travel::default();
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let mut spec = AgentSpec {
        id: "travel".into(),
        description: "Books trips with the person, over several messages.".into(),
        capabilities: vec![Capability {
            name: "travel.booking".into(),
            ..Default::default()
        }],
        integration_mode: IntegrationMode::Handoff as i32,
        trust_score: 90,
        ..Default::default()
    };
    let opts = switchyard_agent_sdk::ServeOptions {
        registry_url: e.stack.url.clone(),
        credential: switchyard_kit::client::Credential::bearer(&e.stack.token("agents").unwrap())
            .ok(),
        ..Default::default()
    };
    let agent = travel.clone();
    tokio::spawn(async move {
        switchyard_agent_sdk::serve_until(agent, &mut spec, opts, shutdown).await
    });
    crate::common::wait_routed(&e.stack, "travel.booking").await;
    (e, travel, trigger)
}

/// Submits a conversation job and approves its run when it waits for a
/// person (listing agents makes its worst case unpriced).
async fn start(e: &Env, c: &mut Jobs, job_id: &str, handoff: Value) {
    crate::self_hosting::start(e, c, &chat_job(job_id, handoff)).await;
}

fn chat_job(job_id: &str, handoff: Value) -> String {
    json!({"job_id": job_id, "tasks": [{"id": "chat", "conversation": {
        "orchestrator": {"model": "m-chat", "instructions": "You are the front desk.",
                         "max_tokens": 40, "agents": ["travel"]},
        "handoff": handoff,
    }}]})
    .to_string()
}

pub(crate) async fn say(c: &mut Jobs, job_id: &str, text: &str) -> (u32, u64) {
    let r = c
        .send_message(SendMessageRequest {
            job_id: job_id.into(),
            text: text.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (r.seq, r.event_sequence)
}

/// Says `text` and waits for its reply: (who answered, the reply's text, outcome).
async fn turn(c: &mut Jobs, job_id: &str, text: &str) -> (String, String, String) {
    let (seq, after) = say(c, job_id, text).await;
    let d = crate::conversation::reply_to(c, job_id, seq, after).await;
    let field = |k: &str| d[k].as_str().unwrap_or_default().to_owned();
    (field("agent_id"), field("text"), field("outcome"))
}

/// The kinds and data of the job's events so far of `kind`.
async fn events_of(c: &mut Jobs, job_id: &str, kind: &str) -> Vec<Value> {
    let j = job(c, job_id).await;
    let mut s = c
        .watch_job(WatchJobRequest {
            job_id: job_id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(Ok(m)) = s.next().await {
        let e = m.event.unwrap();
        if e.kind == kind {
            out.push(e.data.as_ref().map(struct_to_json).unwrap_or(Value::Null));
        }
        if e.sequence >= j.last_sequence {
            break;
        }
    }
    out
}

fn handoff_call() -> Reply {
    Reply::tools(
        &[(
            "handoff_travel",
            json!({"task": "book a trip to where the person says"}),
        )],
        30,
        5,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_proxies_messages_to_the_agent_with_only_what_it_passes_until_it_hands_back() {
    let (e, travel, stop) = stack_with_travel().await;
    e.script.for_model(
        "m-chat",
        vec![
            Reply::text("Hello, how can I help?", 20, 6),
            handoff_call(),
            Reply::text("Glad the trip is booked.", 40, 6),
        ],
    );
    let mut alice = JobServiceClient::new(e.stack.channel_as("alice").await.unwrap());
    start(&e, &mut alice, "hand-1", json!({})).await;
    let t1 = turn(&mut alice, "hand-1", "secret-before: my card is 4242").await;
    assert_eq!(
        t1,
        (
            "".into(),
            "Hello, how can I help?".into(),
            "answered".into()
        )
    );
    // The orchestrator hands off: the agent answers this very message.
    let t2 = turn(&mut alice, "hand-1", "I need a trip").await;
    assert_eq!(
        t2,
        (
            "travel".into(),
            "travel heard 1 messages".into(),
            "answered".into()
        )
    );
    assert_eq!(history(&mut alice, "hand-1").await.active_agent, "travel");
    // The next message goes to the agent, with the messages since the handoff.
    let t3 = turn(&mut alice, "hand-1", "Lisbon").await;
    assert_eq!(t3.0, "travel");
    assert_eq!(t3.1, "travel heard 3 messages");
    // It hands back: its reply, then the orchestrator holds the conversation.
    let t4 = turn(&mut alice, "hand-1", "done").await;
    assert_eq!((t4.0.as_str(), t4.1.as_str()), ("travel", "All booked."));
    assert_eq!(history(&mut alice, "hand-1").await.active_agent, "");
    let t5 = turn(&mut alice, "hand-1", "thanks").await;
    assert_eq!(t5.0, "", "back with the orchestrator");

    // Context isolation: the agent's requests carry the handoff's task and
    // the messages since the handoff, nothing from before it.
    let reqs = travel.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        let wire = format!("{r:?}");
        assert!(!wire.contains("secret-before"), "{wire}");
        assert!(!wire.contains("You are the front desk."), "{wire}");
        assert!(!wire.contains("Hello, how can I help?"), "{wire}");
        assert_eq!(r.task, "book a trip to where the person says");
        assert_eq!(r.agent_id, "travel");
    }
    let sent = |i: usize| struct_to_json(reqs[i].input.as_ref().unwrap())["messages"].clone();
    assert_eq!(sent(0), json!([{"role": "user", "text": "I need a trip"}]));
    assert_eq!(
        sent(1),
        json!([
            {"role": "user", "text": "I need a trip"},
            {"role": "assistant", "text": "travel heard 1 messages"},
            {"role": "user", "text": "Lisbon"}
        ])
    );
    assert_eq!(reqs[1].context.as_ref().unwrap().user_message, "Lisbon");
    // The orchestrator, back, is told the result, not the agent's exchanges.
    let back = e.script.received().last().unwrap().body.to_string();
    assert!(back.contains("booked") && back.contains("Lisbon"), "{back}");
    assert!(!back.contains("travel heard"), "{back}");

    // The events, typed, in the job's log.
    let started = events_of(&mut alice, "hand-1", "handoff.started").await;
    assert_eq!(started.len(), 1);
    assert_eq!(
        (&started[0]["agent_id"], &started[0]["seq"]),
        (&json!("travel"), &json!(2))
    );
    let back = events_of(&mut alice, "hand-1", "handoff.reclaimed").await;
    assert_eq!(back.len(), 1);
    assert_eq!(
        (&back[0]["why"], &back[0]["turns"]),
        (&json!("handed_back"), &json!(3))
    );
    assert_eq!(back[0]["result"], json!({"booked": "Lisbon"}));
    assert_eq!(
        events_of(&mut alice, "hand-1", "agent.invoked").await.len(),
        3
    );
    assert_eq!(
        events_of(&mut alice, "hand-1", "agent.result").await.len(),
        3
    );

    // Per-agent totals: each agent's tokens, adding up to the ledger's.
    let h = history(&mut alice, "hand-1").await;
    let total: u64 = h.agents.iter().map(|a| a.tokens).sum();
    let travel_total = h.agents.iter().find(|a| a.agent_id == "travel").unwrap();
    assert_eq!((travel_total.turns, travel_total.tokens), (3, 15));
    let j = job(&mut alice, "hand-1").await;
    assert_eq!(total, j.tokens_used, "{h:?}");
    // Overall, per agent, in /metrics (the process's: other tests' calls of
    // travel may add to it, never take away).
    let text = switchyard_kit::metrics::global().render();
    let value = |series: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in {text}")) as u64
    };
    assert!(value("switchyard_agent_calls_total{agent_id=\"travel\",outcome=\"success\"}") >= 3);
    assert!(value("switchyard_agent_tokens_total{agent_id=\"travel\"}") >= 15);
    alice
        .send_message(SendMessageRequest {
            job_id: "hand-1".into(),
            close: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let r = finish(&mut alice, "hand-1").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    stop.fire();
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reclaim_trigger_gives_the_conversation_back_and_the_conversation_goes_on() {
    let (e, travel, stop) = stack_with_travel().await;
    let mut alice = JobServiceClient::new(e.stack.channel_as("alice").await.unwrap());
    let back_to = |why: &str| Reply::text(&format!("orchestrator after {why}"), 20, 4);
    // (job, limits, what the person says once the agent holds it, why it
    // is reclaimed, whether the agent saw that message)
    let cases = [
        ("r-user", json!({}), "/reclaim", "user", false),
        (
            "r-turns",
            json!({"max_turns": 1}),
            "again",
            "max_turns",
            false,
        ),
        (
            "r-budget",
            json!({"max_tokens": 5}),
            "again",
            "budget",
            false,
        ),
        ("r-error", json!({}), "fail", "error", true),
        ("r-refused", json!({}), "nope", "refused", true),
    ];
    for (job_id, limits, says, why, agent_saw) in cases {
        let mut replies = vec![handoff_call()];
        if why != "user" {
            replies.push(back_to(why));
        }
        e.script.for_model("m-chat", replies);
        start(&e, &mut alice, job_id, limits).await;
        let first = turn(&mut alice, job_id, "I need a trip").await;
        assert_eq!(first.0, "travel", "{job_id}");
        let before = travel.requests().len();
        let (by, text, outcome) = turn(&mut alice, job_id, says).await;
        assert_eq!(
            (by.as_str(), outcome.as_str()),
            ("", "answered"),
            "{job_id}: {text}"
        );
        if why == "user" {
            assert!(text.contains("back with the orchestrator"), "{text}");
        } else {
            assert_eq!(text, format!("orchestrator after {why}"), "{job_id}");
        }
        assert_eq!(
            travel.requests().len() - before,
            usize::from(agent_saw),
            "{job_id}"
        );
        let back = events_of(&mut alice, job_id, "handoff.reclaimed").await;
        assert_eq!(back.len(), 1, "{job_id}");
        assert_eq!(back[0]["why"], why, "{job_id}");
        let h = history(&mut alice, job_id).await;
        assert!(h.open && h.active_agent.is_empty(), "{job_id}: {h:?}");
    }
    // A message sent while the reclaim is being recorded waits in the log
    // and is answered by the orchestrator, which holds the conversation.
    e.script.for_model(
        "m-chat",
        vec![
            handoff_call(),
            Reply::text("the orchestrator answers the buffered one", 10, 2),
        ],
    );
    start(&e, &mut alice, "r-buffer", json!({})).await;
    turn(&mut alice, "r-buffer", "I need a trip").await;
    say(&mut alice, "r-buffer", "/reclaim").await;
    let (by, text, _) = turn(&mut alice, "r-buffer", "and now?").await;
    assert_eq!(
        (by.as_str(), text.as_str()),
        ("", "the orchestrator answers the buffered one")
    );

    // The time limit: the next message after it is answered by the orchestrator.
    e.script
        .for_model("m-chat", vec![handoff_call(), back_to("timeout")]);
    start(&e, &mut alice, "r-time", json!({"timeout_secs": 1})).await;
    turn(&mut alice, "r-time", "I need a trip").await;
    // Let the handoff's second pass (the condition, not an assertion that
    // nothing happened).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (by, text, _) = turn(&mut alice, "r-time", "still there?").await;
    assert_eq!(
        (by.as_str(), text.as_str()),
        ("", "orchestrator after timeout")
    );
    let back = events_of(&mut alice, "r-time", "handoff.reclaimed").await;
    assert_eq!(back[0]["why"], "timeout");
    stop.fire();
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declarative_agent_in_handoff_mode_talks_with_the_person_and_hands_back_its_result() {
    let agents = tempfile::tempdir().unwrap();
    let d = agents.path().join("concierge");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("manifest.yaml"),
        "id: concierge\nname: Concierge\ndescription: Plans weekends with the person.\n\
         capabilities: [travel.concierge]\n\
         agent:\n  model: m-concierge\n  instructions: 'You plan weekends.'\n  integration_mode: handoff\n",
    )
    .unwrap();
    let dir = agents.path().to_path_buf();
    let e = env(true, move |c| c.agents.dir = Some(dir)).await;
    crate::common::wait_routed(&e.stack, "travel.concierge").await;
    e.script.for_model(
        "m-chat",
        vec![
            Reply::tools(
                &[(
                    "handoff_agent_concierge",
                    json!({"task": "plan a weekend away"}),
                )],
                30,
                5,
            ),
            Reply::text("Enjoy Porto.", 40, 4),
        ],
    );
    e.script.for_model(
        "m-concierge",
        vec![
            Reply::text("Which city?", 25, 3),
            Reply::tools(
                &[("hand_back", json!({"result": {"city": "Porto"}}))],
                40,
                6,
            ),
        ],
    );
    let mut alice = JobServiceClient::new(e.stack.channel_as("alice").await.unwrap());
    let doc = json!({"job_id": "decl-1", "tasks": [{"id": "chat", "conversation": {
        "orchestrator": {"model": "m-chat", "instructions": "You are the front desk.",
                         "max_tokens": 40, "agents": ["agent_concierge"]}}}]})
    .to_string();
    let j = submit(&mut alice, &doc).await.unwrap();
    if j.state == JobState::Pending as i32 {
        crate::common::approve(&e.stack, &j.run_id).await;
    }
    let t1 = turn(&mut alice, "decl-1", "plan my weekend").await;
    assert_eq!(
        (t1.0.as_str(), t1.1.as_str()),
        ("agent_concierge", "Which city?")
    );
    let t2 = turn(&mut alice, "decl-1", "Porto").await;
    assert_eq!(t2.0, "agent_concierge");
    assert_eq!(t2.1, "I am handing you back to the orchestrator.");
    let back = events_of(&mut alice, "decl-1", "handoff.reclaimed").await;
    assert_eq!(back[0]["why"], "handed_back");
    assert_eq!(back[0]["result"], json!({"city": "Porto"}));
    let t3 = turn(&mut alice, "decl-1", "thanks").await;
    assert_eq!((t3.0.as_str(), t3.1.as_str()), ("", "Enjoy Porto."));
    // The agent's second model call: its instructions and the task, the
    // conversation since the handoff, the new message; nothing before.
    let asked: Vec<_> = e
        .script
        .received()
        .into_iter()
        .filter(|r| r.model == "m-concierge")
        .collect();
    assert_eq!(asked.len(), 2);
    let msgs = asked[1].body["messages"].as_array().unwrap().clone();
    let said: Vec<(&str, &str)> = msgs
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(said[0].0, "system");
    assert!(
        said[0].1.starts_with("You plan weekends.") && said[0].1.contains("plan a weekend away")
    );
    assert_eq!(
        &said[1..],
        &[
            ("user", "plan my weekend"),
            ("assistant", "Which city?"),
            ("user", "Porto")
        ]
    );
    assert!(!asked[1].body.to_string().contains("front desk"));
    e.stack.stop().await.unwrap();
}
