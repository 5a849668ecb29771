//! The agent loop's orchestration overhead (issue 5): an LLM task whose
//! model asks for a tool three times and then answers — four model calls
//! and three tool calls — against the scripted OpenAI-compatible server,
//! 200 runs. Each run's "added" time is its wall time minus what the
//! scripted server itself spent on that run's requests (it records each
//! request's handling time), so the figure is everything else: HTTP,
//! the loop, and for the job, the orchestration. Three layers:
//! 1. the four chat calls made directly (the HTTP client and loopback);
//! 2. the agent loop alone with a host that does nothing (estimates, tool
//!    lookup, argument checks against the schema);
//! 3. the whole job through the stack: submit, policy approval, budget,
//!    a reservation and commit per model call, three ToolService calls on
//!    loopback, durable events, completion seen through WatchJob.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use switchyard_agent_sdk::tools::{ToolProvider, ToolServer};
use switchyard_api::{ExecutorClient, RegistryClient};
use switchyard_cli::ServiceKind;
use switchyard_llm::agent::{self, Host, Refusal};
use switchyard_llm::scripted::{Reply, Script};
use switchyard_llm::{BoxFuture, ChatRequest, Llm, LlmConfig, ModelConfig, ProviderConfig, Usage};
use switchyard_proto::executor::v1::{JobSpec, LlmTask, TaskSpec, ToolDefinition, task_spec::Kind};
use switchyard_proto::registry::v1::{RegisterToolRequest, Tool};
use switchyard_testkit::Stack;

use crate::us;

const RUNS: usize = 200;
const MODEL: &str = "bench-model";

fn replies() -> Vec<Reply> {
    let mut r: Vec<Reply> = (0..3)
        .map(|i| Reply::tools(&[("lookup", json!({"q": format!("step {i}")}))], 200, 20))
        .collect();
    r.push(Reply::text("done", 300, 10));
    r
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
}

struct Echo;

#[tonic::async_trait]
impl ToolProvider for Echo {
    async fn call(&self, _name: &str, args: Value) -> Result<Value, String> {
        Ok(json!({"found": args}))
    }
}

/// A host that grants everything and runs tools as no-ops.
struct NullHost;

impl Host for NullHost {
    fn reserve(&self, _c: u32, _t: u64, _cost: i64) -> BoxFuture<'_, Result<String, Refusal>> {
        Box::pin(async { Ok(String::new()) })
    }
    fn commit<'a>(&'a self, _h: &'a str, _m: &'a str, _u: Usage, _c: i64) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
    fn release<'a>(&'a self, _h: &'a str, _w: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
    fn call_tool<'a>(
        &'a self,
        _n: &'a str,
        _i: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move { Ok(json!({"found": args})) })
    }
    fn event(&self, _e: switchyard_llm::agent::LoopEvent) {}
}

/// The scripted provider at `base_url` serving `model`.
pub(crate) fn scripted_config(base_url: &str, model: &str) -> LlmConfig {
    LlmConfig {
        providers: vec![ProviderConfig {
            name: "scripted".into(),
            base_url: base_url.into(),
            models: vec![ModelConfig::priced(model, 150_000, 600_000)],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The scripted provider serving the bench model.
fn config(base_url: &str) -> LlmConfig {
    scripted_config(base_url, MODEL)
}

pub(crate) fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    us(h, q) / 1000.0
}

/// One layer's runs: the whole time, and the time beyond what the
/// scripted server itself spent on the run's requests (per run).
struct Layer {
    total: Histogram<u64>,
    added: Histogram<u64>,
}

impl Layer {
    fn new() -> anyhow::Result<Layer> {
        Ok(Layer {
            total: Histogram::new(3)?,
            added: Histogram::new(3)?,
        })
    }

    /// Records a run that took `took`; the server's time comes from the
    /// requests it received since `script` was last cleared.
    fn record(&mut self, script: &Script, took: Duration) -> anyhow::Result<()> {
        let server: Duration = script.received().iter().map(|r| r.handled).sum();
        self.total.record(took.as_nanos() as u64)?;
        self.added
            .record(took.saturating_sub(server).as_nanos() as u64)?;
        script.clear_received();
        Ok(())
    }

    fn row(&self, what: &str) {
        println!(
            "  {what:<56} p50 {:>6.2} ms  p99 {:>6.2} ms   added beyond the server: p50 {:>6.2} ms  p99 {:>6.2} ms",
            ms(&self.total, 0.5),
            ms(&self.total, 0.99),
            ms(&self.added, 0.5),
            ms(&self.added, 0.99)
        );
    }
}

pub async fn run() -> anyhow::Result<()> {
    let script = Script::new();
    let server = script.serve().await;
    let llm = Llm::new(&config(&server.base_url())).map_err(anyhow::Error::msg)?;
    println!(
        "\nLLM agent loop: 3 tool-call turns + a final answer (4 model calls, 3 tool calls) against the scripted server, {RUNS} runs:"
    );

    // 1. The four calls made directly: the scripted server's own time.
    let chain = vec![MODEL.to_owned()];
    let mut direct = Layer::new()?;
    for _ in 0..RUNS {
        script.clear_received();
        script.for_model(MODEL, replies());
        let t = Instant::now();
        for _ in 0..4 {
            llm.chat(
                &chain,
                "",
                &ChatRequest::default(),
                Instant::now() + Duration::from_secs(10),
                &mut |_| {},
                None,
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        direct.record(&script, t.elapsed())?;
    }

    // 2. The loop alone.
    let spec = agent::Spec {
        chain: chain.clone(),
        provider: String::new(),
        instructions: "Use the tool three times.".into(),
        prompt: "Look it up.".into(),
        tools: vec![switchyard_llm::ToolSpec {
            name: "lookup".into(),
            description: "Look things up".into(),
            parameters: schema(),
        }],
        tool_choice: Default::default(),
        temperature: None,
        max_tokens: 256,
        json: false,
        output_schema: None,
        max_turns: 10,
        max_tokens_per_invocation: 0,
        deadline: Instant::now() + Duration::from_secs(3600),
        history: Vec::new(),
        tool_timeout: Duration::from_secs(5),
    };
    let mut bare = Layer::new()?;
    for _ in 0..RUNS {
        script.clear_received();
        script.for_model(MODEL, replies());
        let t = Instant::now();
        let r = agent::run(&llm, &spec, &NullHost).await;
        anyhow::ensure!(r.is_ok(), "loop failed: {:?}", r.err().map(|f| f.message));
        bare.record(&script, t.elapsed())?;
    }

    // 3. The whole job through the stack.
    let base = server.base_url();
    let stack = Stack::start_with(ServiceKind::ALL, move |c| {
        c.llm = config(&base);
        c.approval.policies.push(switchyard_approval::Policy {
            name: "bench".into(),
            max_estimated_cost_micro_usd: Some(1_000_000),
            ..Default::default()
        });
    })
    .await?;
    let tool_cfg = switchyard_kit::server::ServerConfig {
        listen: "127.0.0.1:0".into(),
        ..Default::default()
    };
    let listener = switchyard_kit::server::bind(&tool_cfg).await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    tokio::spawn(
        switchyard_kit::server::Server::new(tool_cfg)
            .add_service(ToolServer::new(Echo).into_service(4 << 20))
            .run(listener, shutdown),
    );
    let channel = stack.channel().await?;
    RegistryClient::remote(channel.clone(), 4 << 20)
        .register_tool(RegisterToolRequest {
            tool: Some(Tool {
                name: "lookup".into(),
                description: "Look things up".into(),
                parameters: switchyard_kit::json::json_to_struct(&schema()),
                endpoint,
                ..Default::default()
            }),
        })
        .await?;
    let jobs = ExecutorClient::remote(channel, 4 << 20);
    let job_spec = JobSpec {
        tasks: vec![TaskSpec {
            id: "ask".into(),
            kind: Some(Kind::Llm(LlmTask {
                model: MODEL.into(),
                instructions: "Use the tool three times.".into(),
                prompt: "Look it up.".into(),
                max_tokens: Some(256),
                tools: vec![ToolDefinition {
                    name: "lookup".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut full = Layer::new()?;
    let mut failed = 0;
    for _ in 0..RUNS {
        script.clear_received();
        script.for_model(MODEL, replies());
        let (took, completed) = crate::executor::run_job(&jobs, job_spec.clone()).await?;
        if !completed {
            failed += 1;
        }
        full.record(&script, took)?;
    }
    trigger.fire();
    stack.stop().await?;
    drop(server);

    direct.row("four chat calls made directly (HTTP client + loopback)");
    bare.row("agent loop alone (null host)");
    full.row("whole job (approval, budget, tools over gRPC, durable)");
    println!("  {failed} of {RUNS} jobs not completed");
    anyhow::ensure!(failed == 0, "{failed} LLM jobs did not complete");
    Ok(())
}
