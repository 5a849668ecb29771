//! Input into running work (`switchyard-bench input`): jobs whose first
//! task waits for a person and whose second echoes the answer, on the
//! in-process stack (durable sled store), 8 lanes of people answering.
//!
//! Each lane submits a job, follows its events until the question is asked
//! (`task.input_requested`), then answers with SendInput and keeps
//! following until the next task starts. Figures: SendInput's round trip
//! (the answer checked, recorded, the input task's end durable) and the
//! time from sending the answer to the next task running — the
//! input-to-resume latency of issue 43 (goal: p50 ≤ 5 ms).

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use hdrhistogram::Histogram;
use serde_json::json;
use switchyard_kit::json::{json_to_value, struct_to_json};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{SendInputRequest, SubmitJobRequest, WatchJobRequest};
use switchyard_testkit::Stack;

use crate::{us, verdict};

const LANES: usize = 8;
const JOBS_PER_LANE: usize = 50;

type Jobs = JobServiceClient<switchyard_kit::client::Intercepted>;

/// One job: submit, wait for the question, answer, wait for the next task
/// to run. Returns (answer round trip, answer → next task running), ns.
async fn one(c: &mut Jobs, id: &str) -> anyhow::Result<(u64, u64)> {
    let doc = json!({"job_id": id, "tasks": [
        {"id": "ask", "input": {"prompt": "size?", "schema": {"type": "integer"}}},
        {"id": "use", "depends_on": ["ask"],
         "agent": {"capability": "builtin.echo", "input": {"text": "${ask.output.answer}"}}}
    ]});
    c.submit_job(SubmitJobRequest {
        document: doc.to_string(),
        ..Default::default()
    })
    .await?;
    let mut w = c
        .watch_job(WatchJobRequest {
            job_id: id.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    while let Some(m) = w.next().await {
        if m?.event.is_some_and(|e| e.kind == "task.input_requested") {
            break;
        }
    }
    let sent = Instant::now();
    c.send_input(SendInputRequest {
        job_id: id.into(),
        task_id: "ask".into(),
        answer: Some(json_to_value(&json!(3))),
        idempotency_key: format!("{id}-k"),
    })
    .await?;
    let acked = sent.elapsed().as_nanos() as u64;
    while let Some(m) = w.next().await {
        let Some(e) = m?.event else { continue };
        let data = e.data.as_ref().map(struct_to_json).unwrap_or_default();
        if e.kind == "task.state" && e.task_id == "use" && data["to"] == "running" {
            return Ok((acked, sent.elapsed().as_nanos() as u64));
        }
    }
    anyhow::bail!("job {id} ended without running its second task")
}

pub async fn run() -> anyhow::Result<()> {
    let stack = Stack::start().await?;
    let channel = stack.channel_as("alice").await?;
    // Warm up: connections, the echo agent's route.
    let mut c = JobServiceClient::new(channel.clone());
    for i in 0..20 {
        one(&mut c, &format!("warm-{i}")).await?;
    }
    let started = Instant::now();
    let lanes = (0..LANES).map(|lane| {
        let mut c = JobServiceClient::new(channel.clone());
        tokio::spawn(async move {
            let mut out = Vec::with_capacity(JOBS_PER_LANE);
            for i in 0..JOBS_PER_LANE {
                out.push(one(&mut c, &format!("in-{lane}-{i}")).await?);
            }
            anyhow::Ok(out)
        })
    });
    let mut ack = Histogram::<u64>::new(3)?;
    let mut resume = Histogram::<u64>::new(3)?;
    for lane in futures_util::future::join_all(lanes).await {
        for (a, r) in lane?? {
            ack.record(a)?;
            resume.record(r)?;
        }
    }
    let took = started.elapsed();
    let n = LANES * JOBS_PER_LANE;
    println!(
        "Input into running work: {n} jobs (ask -> echo), {LANES} lanes answering, in {:.1} s:",
        took.as_secs_f64()
    );
    println!(
        "  SendInput round trip (checked, recorded, the task's end durable): p50 {:>7.2} ms  p99 {:>7.2} ms",
        us(&ack, 0.5) / 1000.0,
        us(&ack, 0.99) / 1000.0
    );
    let p50 = us(&resume, 0.5) / 1000.0;
    println!(
        "  answer sent -> next task running:                               p50 {:>7.2} ms  p99 {:>7.2} ms  [{}: p50 <= 5 ms]",
        p50,
        us(&resume, 0.99) / 1000.0,
        verdict(p50 <= 5.0)
    );
    stack.stop().await?;
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}
