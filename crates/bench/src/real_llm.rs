//! What Switchyard adds to each call of a real model server (issue 15):
//! llama-cpp-python serving Gemma 3 270M on loopback, one short chat call
//! (the same body every time, greedy decoding, 4 completion tokens), made
//! in turn:
//! 1. directly, with a bare HTTP client: the server's own time as any
//!    client sees it;
//! 2. through Switchyard's LLM client (`Llm::chat`: model check, fallback
//!    chain, request building, parsing);
//! 3. as a whole job through the in-process stack: submit, approval by
//!    policy, budget, one reservation and commit, durable events, the end
//!    seen through WatchJob.
//!
//! The runs interleave, so the server's drift touches every layer alike.
//! "Added" is a layer's percentile minus the direct call's. Then the same
//! with streaming (`stream = true`: the direct call reads the whole event
//! stream too). Needs `SWITCHYARD_LLAMA_PYTHON` and `SWITCHYARD_LLAMA_MODEL`
//! (`make llm-venv`); `make bench` runs it when they are installed.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use switchyard_api::ExecutorClient;
use switchyard_cli::ServiceKind;
use switchyard_llm::llama::{self, MODEL};
use switchyard_llm::{ChatRequest, Llm, LlmConfig, Message, ModelConfig, ProviderConfig, Role};
use switchyard_proto::executor::v1::{JobSpec, LlmTask, TaskSpec, task_spec::Kind};
use switchyard_testkit::Stack;

const RUNS: usize = 60;
const PROMPT: &str = "Say yes.";
const MAX_TOKENS: u64 = 4;

fn config(url: &str, stream: bool) -> LlmConfig {
    LlmConfig {
        providers: vec![ProviderConfig {
            name: "local".into(),
            base_url: url.into(),
            stream,
            models: vec![ModelConfig::priced(MODEL, 0, 0)],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

pub async fn run() -> anyhow::Result<()> {
    if !llama::Server::available() {
        println!(
            "\nReal model server: skipped (make llm-venv installs llama-cpp-python and the model; make bench then measures it)"
        );
        return Ok(());
    }
    let server = llama::Server::start("gemma").map_err(anyhow::Error::msg)?;
    println!(
        "\nA real model server's calls (llama-cpp-python, Gemma 3 270M, {MAX_TOKENS} tokens a call, 2 threads), {RUNS} interleaved runs a layer:"
    );
    for stream in [false, true] {
        measure(&server, stream).await?;
    }
    Ok(())
}

async fn measure(server: &llama::Server, stream: bool) -> anyhow::Result<()> {
    let url = server.url().to_owned();
    let llm = Llm::new(&config(&url, stream)).map_err(anyhow::Error::msg)?;
    let stack = {
        let url = url.clone();
        Stack::start_with(ServiceKind::ALL, move |c| c.llm = config(&url, stream)).await?
    };
    let jobs = ExecutorClient::remote(stack.channel().await?, 4 << 20);
    let http = reqwest::Client::new();
    let mut body = json!({
        "model": MODEL, "temperature": 0.0, "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": PROMPT}],
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let req = ChatRequest {
        messages: vec![Message::text(Role::User, PROMPT)],
        temperature: Some(0.0),
        max_tokens: Some(MAX_TOKENS),
        ..Default::default()
    };
    let spec = JobSpec {
        tasks: vec![TaskSpec {
            id: "ask".into(),
            kind: Some(Kind::Llm(LlmTask {
                model: MODEL.into(),
                prompt: PROMPT.into(),
                temperature: Some(0.0),
                max_tokens: Some(MAX_TOKENS),
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    };
    let chain = vec![MODEL.to_owned()];
    let (mut direct, mut client, mut job) = (
        Histogram::<u64>::new(3)?,
        Histogram::<u64>::new(3)?,
        Histogram::<u64>::new(3)?,
    );
    let mut failed = 0;
    // One of each first, unmeasured: the server's prompt cache, the
    // connections and the model list are warm for every layer alike.
    let sink = |_d: switchyard_llm::Delta| {};
    let delta: Option<&(dyn Fn(switchyard_llm::Delta) + Send + Sync)> =
        if stream { Some(&sink) } else { None };
    for i in 0..=RUNS {
        // Each layer goes first, second and third in turn: no layer always
        // follows the same one (the server's work after an answer is
        // spread alike).
        let mut took = [Duration::ZERO; 3];
        for k in 0..3 {
            let layer = (i + k) % 3;
            let t = Instant::now();
            match layer {
                0 => {
                    let resp = http
                        .post(format!("{url}/chat/completions"))
                        .json(&body)
                        .send()
                        .await?;
                    anyhow::ensure!(resp.status().is_success(), "direct call: {}", resp.status());
                    let _ = resp.bytes().await?;
                }
                1 => {
                    llm.chat(
                        &chain,
                        "",
                        &req,
                        Instant::now() + Duration::from_secs(60),
                        &mut |_| {},
                        delta,
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                _ => {
                    let (_, completed) = crate::executor::run_job(&jobs, spec.clone()).await?;
                    if i > 0 {
                        failed += usize::from(!completed);
                    }
                }
            }
            took[layer] = t.elapsed();
        }
        // One of each first, unmeasured: the connections, the server's
        // prompt and the model list are warm for every layer alike.
        if i == 0 {
            continue;
        }
        direct.record(took[0].as_micros() as u64)?;
        client.record(took[1].as_micros() as u64)?;
        job.record(took[2].as_micros() as u64)?;
    }
    stack.stop().await?;
    let mode = if stream { "streamed" } else { "whole answers" };
    println!("  {mode}:");
    println!(
        "    {:<44} p50 {:>7.2} ms  p99 {:>7.2} ms",
        "the server, called directly",
        ms(&direct, 0.5),
        ms(&direct, 0.99)
    );
    for (what, h) in [
        ("through Switchyard's LLM client", &client),
        ("as a whole job through the stack", &job),
    ] {
        let added50 = ms(h, 0.5) - ms(&direct, 0.5);
        println!(
            "    {what:<44} p50 {:>7.2} ms  p99 {:>7.2} ms   added: p50 {:>+6.2} ms  p99 {:>+6.2} ms",
            ms(h, 0.5),
            ms(h, 0.99),
            added50,
            ms(h, 0.99) - ms(&direct, 0.99),
        );
        if what.starts_with("as a whole job") {
            println!(
                "    {:<44} [{}: <= 5 ms p50 added per call; {failed} of {RUNS} jobs failed]",
                "",
                crate::verdict(added50 <= 5.0 && failed == 0)
            );
        }
    }
    Ok(())
}
