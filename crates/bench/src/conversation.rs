//! A conversation turn's overhead (`switchyard-bench conversation`): the
//! same model call made directly, and as one turn of a conversation job on
//! the in-process stack (durable sled store) — SendMessage, the message
//! recorded durably, a reservation and commit on the job's budget, the
//! model call with the conversation so far, the reply recorded durably and
//! seen through WatchJob. Both against the scripted OpenAI-compatible
//! server, in the same run; the overhead is the turn's time beyond the
//! direct call's (issue 43's goal: p50 ≤ 2 ms).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use hdrhistogram::Histogram;
use serde_json::json;
use switchyard_cli::ServiceKind;
use switchyard_kit::json::struct_to_json;
use switchyard_llm::scripted::{Reply, Script};
use switchyard_llm::{ChatRequest, Llm, Message, Role};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{SendMessageRequest, SubmitJobRequest, WatchJobRequest};
use switchyard_testkit::Stack;

use crate::llm::ms;
use crate::verdict;

const TURNS: u32 = 300;
const MODEL: &str = "bench-chat";

/// The store's flushes during the turns: how many, and their time (on the
/// flusher thread: the writes, the database's flush and the syncs).
static FLUSHES: AtomicU64 = AtomicU64::new(0);
static FLUSH_NANOS: AtomicU64 = AtomicU64::new(0);

fn count_flush(took: Duration) {
    FLUSHES.fetch_add(1, Ordering::Relaxed);
    FLUSH_NANOS.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
}

fn config(base_url: &str) -> switchyard_llm::LlmConfig {
    crate::llm::scripted_config(base_url, MODEL)
}

pub async fn run() -> anyhow::Result<()> {
    let script = Script::new();
    let server = script.serve().await;
    let llm = Llm::new(&config(&server.base_url())).map_err(anyhow::Error::msg)?;
    let reply = || Reply::text("Noted.", 40, 3);

    // 1. The model call made directly, with a conversation of the size the
    //    turns reach halfway.
    let chain = vec![MODEL.to_owned()];
    let mut history = vec![Message::text(Role::System, "Be brief.")];
    for i in 0..TURNS / 2 {
        history.push(Message::text(Role::User, format!("message {i}")));
        history.push(Message::text(Role::Assistant, "Noted."));
    }
    history.push(Message::text(Role::User, "one more"));
    let req = ChatRequest {
        messages: history,
        max_tokens: Some(16),
        ..Default::default()
    };
    let mut direct = Histogram::<u64>::new(3)?;
    for _ in 0..TURNS {
        script.for_model(MODEL, vec![reply()]);
        let t = Instant::now();
        llm.chat(
            &chain,
            "",
            &req,
            Instant::now() + Duration::from_secs(10),
            &mut |_| {},
            None,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        direct.record(t.elapsed().as_nanos() as u64)?;
    }

    // 2. The same call as a conversation turn. Flushes are counted here
    //    (set before the stack starts, this observer is the process's).
    switchyard_store::observe_flushes(count_flush);
    let base = server.base_url();
    let stack = Stack::start_with(ServiceKind::ALL, move |c| {
        c.llm = config(&base);
        c.approval.policies.push(switchyard_approval::Policy {
            name: "bench".into(),
            max_estimated_cost_micro_usd: Some(100_000_000),
            ..Default::default()
        });
    })
    .await?;
    let mut c = JobServiceClient::new(stack.channel_as("alice").await?);
    let doc = json!({"job_id": "bench-talk", "tasks": [{"id": "chat", "conversation": {
        "orchestrator": {"model": MODEL, "instructions": "Be brief.", "max_tokens": 16},
        "max_messages": TURNS + 10,
    }}]});
    c.submit_job(SubmitJobRequest {
        document: doc.to_string(),
        ..Default::default()
    })
    .await?;
    let mut turn = Histogram::<u64>::new(3)?;
    let mut ack = Histogram::<u64>::new(3)?;
    let mut server_time = Histogram::<u64>::new(3)?;
    let started = Instant::now();
    let (flushes_before, nanos_before) = (
        FLUSHES.load(Ordering::Relaxed),
        FLUSH_NANOS.load(Ordering::Relaxed),
    );
    for i in 0..TURNS {
        script.for_model(MODEL, vec![reply()]);
        script.clear_received();
        let t = Instant::now();
        let sent = c
            .send_message(SendMessageRequest {
                job_id: "bench-talk".into(),
                text: format!("message {i}"),
                idempotency_key: format!("m-{i}"),
                ..Default::default()
            })
            .await?
            .into_inner();
        ack.record(t.elapsed().as_nanos() as u64)?;
        let mut w = c
            .watch_job(WatchJobRequest {
                job_id: "bench-talk".into(),
                after_sequence: sent.event_sequence,
                ..Default::default()
            })
            .await?
            .into_inner();
        let mut answered = false;
        while let Some(m) = w.next().await {
            let Some(e) = m?.event else { continue };
            let data = e.data.as_ref().map(struct_to_json).unwrap_or_default();
            if e.kind == "conversation.replied" && data["seq"] == sent.seq {
                anyhow::ensure!(data["outcome"] == "answered", "turn {i}: {data}");
                answered = true;
                break;
            }
        }
        anyhow::ensure!(answered, "turn {i} was not answered");
        turn.record(t.elapsed().as_nanos() as u64)?;
        let server: Duration = script.received().iter().map(|r| r.handled).sum();
        server_time.record(server.as_nanos() as u64)?;
    }
    let took = started.elapsed();
    let flushes = FLUSHES.load(Ordering::Relaxed) - flushes_before;
    let flush_ms = (FLUSH_NANOS.load(Ordering::Relaxed) - nanos_before) as f64 / 1e6;
    stack.stop().await?;
    drop(server);

    let (d50, t50) = (ms(&direct, 0.5), ms(&turn, 0.5));
    println!(
        "\nConversation turns: {TURNS} messages to one conversation (the history grows to {TURNS} exchanges), scripted model, durable sled, in {:.1} s:",
        took.as_secs_f64()
    );
    println!(
        "  the model call made directly:                        p50 {d50:>6.2} ms  p99 {:>6.2} ms",
        ms(&direct, 0.99)
    );
    println!(
        "  SendMessage round trip (message recorded, durable):  p50 {:>6.2} ms  p99 {:>6.2} ms",
        ms(&ack, 0.5),
        ms(&ack, 0.99)
    );
    println!(
        "  a turn: message sent -> reply recorded, seen:        p50 {t50:>6.2} ms  p99 {:>6.2} ms  (server's own time p50 {:.2} ms)",
        ms(&turn, 0.99),
        ms(&server_time, 0.5)
    );
    println!(
        "  durable flushes (the store's, all services):        {:.2} per turn, {:.3} ms each on average ({:.2} ms of a turn)",
        f64::from(flushes as u32) / f64::from(TURNS),
        flush_ms / (flushes.max(1) as f64),
        flush_ms / f64::from(TURNS)
    );
    let over = t50 - d50;
    println!(
        "  a turn's overhead over the direct call:              p50 {over:>6.2} ms  ({:.1}x the direct call)  [{}: p50 <= 2 ms]",
        t50 / d50.max(0.001),
        verdict(over <= 2.0)
    );
    Ok(())
}
