//! `make bench`: Switchyard's foundation benchmarks, printed as a table.
//!
//! 1. Route latency in-process (no gRPC) at 10k and 100k agents over 100
//!    capabilities.
//! 2. Over gRPC on loopback with 64 concurrent callers, client and server in
//!    this process sharing the machine: a bare unary RPC (`grpc.health.v1`
//!    Check, which does no work) as the baseline, then Route and Heartbeat,
//!    each printed with its ratio to the baseline measured in the same run.
//!
//! 3. The ledger engine in-process (no gRPC) with durable, group-committed
//!    acknowledgements: reservations/s on one hot budget, 64 callers.
//! 4. The ledger over gRPC, 64 callers: Reserve+Commit pairs on one hot
//!    budget and spread over 1,000 budgets, with Reserve latency and the
//!    RPC rate's ratio to the bare ping of item 2.
//!
//! 5. The executor (see `executor.rs`): 5,000 single-task jobs on
//!    `builtin.noop` from 64 submitters, a durable 3-step echo chain, and a
//!    command task against spawning the command directly.
//!
//! 5b. Policy decisions (see `policy.rs`): one Cedar decision with 100
//!    policies in force; the executor's throughput with them on.
//!
//! 6. The LLM agent loop (see `llm.rs`): a task with 3 tool-call turns
//!    against the scripted OpenAI-compatible server, 200 runs; the latency
//!    the loop and the whole job add beyond the server's own time.
//!
//! The stack is the one `switchyard dev` runs (durable sled store in a
//! temporary directory, per-RPC spans enabled at the default `info` level).

mod auth;
mod console;
mod conversation;
mod executor;
mod gateway;
mod history;
mod input;
mod limits;
mod llm;
mod mcp;
mod metrics;
mod policy;
mod postgres;
mod queue;
mod real_llm;
mod scripted;

use std::hint::black_box;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use switchyard_cli::ServiceKind;
use switchyard_core::SystemClock;
use switchyard_kit::client::Intercepted as Channel;
use switchyard_ledger::{Ledger, LedgerConfig};
use switchyard_proto::common::v1::Money;
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_proto::ledger::v1::{CommitRequest, CreateBudgetRequest, ReserveRequest};
use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
use switchyard_proto::registry::v1::{
    Agent, AgentSpec, AgentStatus, Capability, HeartbeatRequest, RegisterAgentRequest,
};
use switchyard_proto::router::v1::router_service_client::RouterServiceClient;
use switchyard_proto::router::v1::{RouteConstraints, RouteRequest};
use switchyard_router::{Router, RouterConfig};
use switchyard_testkit::Stack;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const CAPABILITIES: usize = 100;
const CALLERS: usize = 64;
const CONNECTIONS: usize = 4;
const RUN: Duration = Duration::from_secs(4);
const WARMUP: Duration = Duration::from_millis(500);

/// A small deterministic generator, so every run uses the same agents.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

fn spec(i: usize, rng: &mut Lcg) -> AgentSpec {
    AgentSpec {
        id: format!("agent_{i:06}"),
        name: format!("Agent {i}"),
        endpoint: format!("http://10.0.{}.{}:7700", (i / 250) % 250, i % 250),
        capabilities: vec![Capability {
            name: format!("cap_{:03}", i % CAPABILITIES),
            proficiency: Some(rng.range(50, 101) as f64 / 100.0),
            price_per_unit_micro_usd: rng.range(0, 50_000) as i64,
            unit: "task".into(),
        }],
        trust_score: rng.range(40, 101) as u32,
        max_concurrency: 8,
        latency_estimate_ms: rng.range(10, 2_000) as u32,
        ..Default::default()
    }
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// A router whose index holds `n` random available agents.
fn router_with(n: usize, seed: u64) -> Router {
    let mut rng = Lcg(seed);
    let agents: Vec<Agent> = (0..n)
        .map(|i| Agent {
            spec: Some(spec(i, &mut rng)),
            status: AgentStatus::Available as i32,
            ..Default::default()
        })
        .collect();
    let router = Router::new(RouterConfig::default());
    router.load_agents(&agents);
    router
}

fn route_in_process(n: usize) -> (f64, f64, f64) {
    let router = router_with(n, 42);
    let reqs: Vec<RouteRequest> = (0..CAPABILITIES)
        .map(|c| RouteRequest {
            capability: format!("cap_{c:03}"),
            constraints: Some(RouteConstraints {
                exclude_agents: vec![format!("agent_{c:06}")],
                ..Default::default()
            }),
            limit: 5,
        })
        .collect();
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    for r in reqs.iter().cycle().take(2_000) {
        black_box(router.route(r).ok());
    }
    let total = 20_000;
    let start = Instant::now();
    for r in reqs.iter().cycle().take(total) {
        let t = Instant::now();
        let out = router.route(r);
        h.record(t.elapsed().as_nanos() as u64).ok();
        black_box(out.ok());
    }
    let rate = total as f64 / start.elapsed().as_secs_f64();
    (us(&h, 0.5), us(&h, 0.99), rate)
}

struct Load {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

/// `CALLERS` tasks over `CONNECTIONS` channels call `f` in a loop for `RUN`.
/// Latency is the whole call, or the part `f` reports when it returns one.
async fn load<F, Fut>(channels: &[Channel], f: F) -> Load
where
    F: Fn(Channel, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Option<Duration>, tonic::Status>> + Send,
{
    let run = |dur: Duration| {
        let mut tasks = Vec::new();
        for c in 0..CALLERS {
            let ch = channels[c % channels.len()].clone();
            let f = f.clone();
            tasks.push(tokio::spawn(async move {
                let mut h = Histogram::<u64>::new(3).expect("histogram");
                let (mut n, mut errors) = (0u64, 0u64);
                let deadline = Instant::now() + dur;
                let mut seq = c as u64 * 1_000_003;
                while Instant::now() < deadline {
                    seq += 1;
                    let t = Instant::now();
                    let took = match f(ch.clone(), seq).await {
                        Ok(part) => part.unwrap_or_else(|| t.elapsed()),
                        Err(_) => {
                            errors += 1;
                            t.elapsed()
                        }
                    };
                    h.record(took.as_nanos() as u64).ok();
                    n += 1;
                }
                (h, n, errors)
            }));
        }
        tasks
    };
    for t in run(WARMUP) {
        let _ = t.await;
    }
    let start = Instant::now();
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    let (mut n, mut errors) = (0, 0);
    for t in run(RUN) {
        let (h, k, e) = t.await.expect("caller task");
        all.add(h).ok();
        n += k;
        errors += e;
    }
    Load {
        rate: n as f64 / start.elapsed().as_secs_f64(),
        p50_us: us(&all, 0.5),
        p99_us: us(&all, 0.99),
        errors,
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "goal met" } else { "GOAL MISSED" }
}

async fn run() -> anyhow::Result<()> {
    // `switchyard-bench scripted-llm FILE` serves scripted model replies.
    if std::env::args().nth(1).as_deref() == Some("scripted-llm") {
        let file = std::env::args().nth(2).unwrap_or_default();
        return scripted::run(&file).await;
    }
    println!(
        "Switchyard benchmarks ({} cores)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // `switchyard-bench executor` runs only the executor's figures.
    if std::env::args().nth(1).as_deref() == Some("executor") {
        return executor::run().await;
    }
    // `switchyard-bench auth` runs only the authentication figures.
    if std::env::args().nth(1).as_deref() == Some("auth") {
        return auth::run().await;
    }
    // `switchyard-bench history [N]` runs only the growth-with-history figures.
    if std::env::args().nth(1).as_deref() == Some("history") {
        let n = std::env::args()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(100_000);
        return history::run(n).await;
    }
    // `switchyard-bench input` runs only the input-into-running-work figures.
    if std::env::args().nth(1).as_deref() == Some("input") {
        return input::run().await;
    }
    // `switchyard-bench conversation` runs only a conversation turn's figures.
    if std::env::args().nth(1).as_deref() == Some("conversation") {
        return conversation::run().await;
    }
    // `switchyard-bench llm` runs only the agent loop's figures.
    if std::env::args().nth(1).as_deref() == Some("llm") {
        return llm::run().await;
    }
    // `switchyard-bench mcp` runs only the MCP tool-call figures.
    if std::env::args().nth(1).as_deref() == Some("mcp") {
        return mcp::run().await;
    }
    // `switchyard-bench metrics` runs only the metrics' cost.
    if std::env::args().nth(1).as_deref() == Some("metrics") {
        metrics::run();
        return Ok(());
    }
    // `switchyard-bench gateway` runs only the doors' figures.
    if std::env::args().nth(1).as_deref() == Some("gateway") {
        return gateway::run().await;
    }
    // `switchyard-bench console` runs only the web console's figures.
    if std::env::args().nth(1).as_deref() == Some("console") {
        return console::run().await;
    }
    // `switchyard-bench queue` runs only the pull workers' figures.
    if std::env::args().nth(1).as_deref() == Some("queue") {
        return queue::run().await;
    }
    // `switchyard-bench limits` runs only the provider rate limits' figures.
    if std::env::args().nth(1).as_deref() == Some("limits") {
        return limits::run().await;
    }
    // `switchyard-bench postgres` runs only the ledger-on-PostgreSQL figures.
    if std::env::args().nth(1).as_deref() == Some("postgres") {
        return postgres::run().await;
    }
    // `switchyard-bench policy` runs only the policy decision figures.
    if std::env::args().nth(1).as_deref() == Some("policy") {
        return policy::run().await;
    }
    // `switchyard-bench executor` runs only the executor's figures.
    if std::env::args().nth(1).as_deref() == Some("executor") {
        return executor::run().await;
    }
    // `switchyard-bench real-llm` runs only the real model server's figures.
    if std::env::args().nth(1).as_deref() == Some("real-llm") {
        return real_llm::run().await;
    }

    println!("Route, in-process (no gRPC), {CAPABILITIES} capabilities, limit 5, one exclusion:");
    for n in [10_000, 100_000] {
        let (p50, p99, rate) = route_in_process(n);
        println!(
            "  {:>7} agents ({:>4}/capability): p50 {:>7.1} us  p99 {:>7.1} us  {:>9.0} routes/s (1 thread)  [{}: p99 <= 100 us at 100k]",
            n,
            n / CAPABILITIES,
            p50,
            p99,
            rate,
            if n == 100_000 {
                verdict(p99 <= 100.0)
            } else {
                "-"
            }
        );
    }

    ledger_in_process().await?;

    let agents = 10_000;
    let stack = Stack::start_with(ServiceKind::ALL, |c| {
        c.registry.lease_ttl_secs = 3_600;
        c.server.request_timeout_ms = 60_000;
        // The synthetic fleet's endpoints (10.0.x.y) are never called.
        c.registry.egress.allow_private = true;
    })
    .await?;
    let mut channels = Vec::new();
    for _ in 0..CONNECTIONS {
        channels.push(stack.channel().await?);
    }

    // Registrations are durable; concurrent ones share group-committed flushes.
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..CALLERS {
        let ch = channels[w % CONNECTIONS].clone();
        tasks.push(tokio::spawn(async move {
            let mut reg = RegistryServiceClient::new(ch);
            let mut rng = Lcg(7 + w as u64);
            for i in (w..agents).step_by(CALLERS) {
                reg.register_agent(RegisterAgentRequest {
                    agent: Some(spec(i, &mut rng)),
                })
                .await?;
            }
            Ok::<_, tonic::Status>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let reg_rate = agents as f64 / start.elapsed().as_secs_f64();

    // Wait (bounded) until the router's index, fed by the watch, has them all.
    let mut router = RouterServiceClient::new(channels[0].clone());
    let last_cap = format!("cap_{:03}", CAPABILITIES - 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = RouteConstraints {
            min_trust: Some(0),
            ..Default::default()
        };
        let r = router
            .route(RouteRequest {
                capability: last_cap.clone(),
                constraints: Some(all),
                limit: 100,
            })
            .await;
        let n = r.map(|r| r.into_inner().candidates.len()).unwrap_or(0);
        if n == agents / CAPABILITIES {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "router index not complete after 60 s ({n} candidates)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    println!(
        "\ngRPC on loopback, {CALLERS} concurrent callers over {CONNECTIONS} connections, {agents} agents, {} s per figure:",
        RUN.as_secs()
    );
    println!("  durable registrations (group commit): {reg_rate:>9.0} /s");

    let ping = load(&channels, |ch, _| async move {
        HealthClient::new(ch)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|_| None)
    })
    .await;
    let route = load(&channels, |ch, seq| async move {
        let capability = format!("cap_{:03}", seq % CAPABILITIES as u64);
        RouterServiceClient::new(ch)
            .route(RouteRequest {
                capability,
                constraints: None,
                limit: 5,
            })
            .await
            .map(|_| None)
    })
    .await;
    let heartbeat = load(&channels, move |ch, seq| async move {
        let agent_id = format!("agent_{:06}", (seq * 7_919) % agents as u64);
        RegistryServiceClient::new(ch)
            .heartbeat(HeartbeatRequest {
                agent_id,
                in_flight: (seq % 4) as u32,
            })
            .await
            .map(|_| None)
    })
    .await;

    let row = |name: &str, l: &Load, goal: &str| {
        println!(
            "  {name:<26} {:>9.0} /s  p50 {:>7.1} us  p99 {:>8.1} us  ratio to ping {:>5.2}  errors {}  {goal}",
            l.rate,
            l.p50_us,
            l.p99_us,
            l.rate / ping.rate,
            l.errors
        );
    };
    row("bare unary ping (health)", &ping, "");
    let route_goal = format!(
        "[{}: >= 0.60 of ping]",
        verdict(route.rate >= 0.6 * ping.rate)
    );
    row("Route", &route, &route_goal);
    let hb_goal = format!("[{}: >= 20000/s]", verdict(heartbeat.rate >= 20_000.0));
    row("Heartbeat (10k agents)", &heartbeat, &hb_goal);

    ledger_grpc(&channels, ping.rate).await?;
    stack.stop().await?;
    postgres::run().await?;
    auth::run().await?;
    policy::run().await?;
    executor::run().await?;
    llm::run().await?;
    Ok(())
}

fn reserve_req(budget: String, seq: u64) -> ReserveRequest {
    ReserveRequest {
        budget_id: budget,
        tokens: 100,
        cost: Some(Money { micro_usd: 10 }),
        idempotency_key: format!("bench-{seq}"),
        ..Default::default()
    }
}

/// One Reserve (key from `key_seq`) and its Commit; returns the Reserve's
/// latency.
async fn reserve_commit(
    l: &mut LedgerServiceClient<Channel>,
    budget: String,
    key_seq: u64,
) -> Result<Duration, tonic::Status> {
    let t = Instant::now();
    let r = l.reserve(reserve_req(budget, key_seq)).await?;
    let reserve_took = t.elapsed();
    let rid = r
        .into_inner()
        .reservation
        .map(|r| r.reservation_id)
        .unwrap_or_default();
    l.commit(CommitRequest {
        reservation_id: rid,
        tokens: 80,
        cost: Some(Money { micro_usd: 8 }),
        ..Default::default()
    })
    .await?;
    Ok(reserve_took)
}

/// The ledger engine alone: durable reservations on one hot budget.
async fn ledger_in_process() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (_trigger, shutdown) = switchyard_kit::shutdown::channel();
    let store = switchyard_store::Store::open(dir.path())?;
    let ledger = Ledger::open(
        LedgerConfig::default(),
        store,
        std::sync::Arc::new(SystemClock),
        shutdown,
    )?;
    ledger
        .create_budget(CreateBudgetRequest {
            budget_id: "hot".into(),
            token_limit: Some(switchyard_ledger::MAX_AMOUNT),
            ..Default::default()
        })
        .await?;
    let run = |dur: Duration, base: u64| {
        (0..CALLERS as u64)
            .map(|c| {
                let l = ledger.clone();
                tokio::spawn(async move {
                    let deadline = Instant::now() + dur;
                    let mut n = 0u64;
                    // Reading the clock every call would be a visible share of the cost.
                    while !n.is_multiple_of(32) || Instant::now() < deadline {
                        let seq = base + c * 100_000_000 + n;
                        l.reserve(reserve_req("hot".into(), seq), "bench").await?;
                        n += 1;
                    }
                    anyhow::Ok(n)
                })
            })
            .collect::<Vec<_>>()
    };
    for t in run(WARMUP, 0) {
        t.await??;
    }
    let start = Instant::now();
    let mut n = 0;
    for t in run(RUN, 50_000_000) {
        n += t.await??;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    println!(
        "
Ledger engine in-process (no gRPC), durable group commit, {CALLERS} callers, one hot budget:"
    );
    println!(
        "  reservations {rate:>9.0} /s  [{}: >= 100000/s]",
        verdict(rate >= 100_000.0)
    );
    Ok(())
}

/// Reserve+Commit pairs over gRPC on one hot budget and on 1,000 budgets.
async fn ledger_grpc(channels: &[Channel], ping: f64) -> anyhow::Result<()> {
    let mut c = LedgerServiceClient::new(channels[0].clone());
    c.create_budget(CreateBudgetRequest {
        budget_id: "org".into(),
        token_limit: Some(switchyard_ledger::MAX_AMOUNT),
        ..Default::default()
    })
    .await?;
    let budgets = 1_000u64;
    for b in 0..=budgets {
        c.create_budget(CreateBudgetRequest {
            budget_id: format!("org/b{b:04}"),
            parent_id: "org".into(),
            ..Default::default()
        })
        .await?;
    }
    println!(
        "
Ledger over gRPC, {CALLERS} callers, Reserve+Commit pairs (both durable):"
    );
    for (name, spread) in [("one hot budget", 1), ("1,000 budgets", budgets)] {
        let pairs = load(channels, move |ch, seq| async move {
            let mut l = LedgerServiceClient::new(ch);
            let budget = format!("org/b{:04}", seq % spread);
            let reserve_took = reserve_commit(&mut l, budget, seq + spread * 1_000_000_000).await?;
            Ok(Some(reserve_took))
        })
        .await;
        let ratio = 2.0 * pairs.rate / ping;
        println!(
            "  {name:<15} {:>8.0} pairs/s = {:>8.0} RPC/s  ratio to ping {ratio:>5.2}  Reserve p50 {:>7.1} us  p99 {:>8.1} us  errors {}  [{}: ratio >= 0.50] [{}: Reserve p99 <= 5 ms]",
            pairs.rate,
            2.0 * pairs.rate,
            pairs.p50_us,
            pairs.p99_us,
            pairs.errors,
            verdict(ratio >= 0.5),
            verdict(pairs.p99_us <= 5_000.0)
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        // The same telemetry a default `switchyard dev` has: per-RPC spans at
        // info; the registry's per-registration log lines silenced.
        let t = switchyard_kit::telemetry::TelemetryConfig {
            log_filter:
                "info,switchyard_registry=warn,switchyard_router=warn,switchyard_executor=warn"
                    .into(),
            ..Default::default()
        };
        let guard = switchyard_kit::telemetry::init(&t)?;
        let r = run().await;
        guard.shutdown();
        r
    })
}
