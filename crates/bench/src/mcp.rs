//! What going through Switchyard costs an MCP tool call
//! (`switchyard-bench mcp`): the reference server-everything over streamable
//! HTTP (from `make mcp-servers`), its `echo` tool called 16 at a time
//! - directly, with Switchyard's MCP client session (rmcp), and
//! - through the registry (`CallMcpTool` over gRPC, as the executor calls
//!   it: the registry's session, the stream of progress then the result),
//!
//! in interleaved rounds, with the ratio of the two rates.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use switchyard_api::RegistryClient;
use switchyard_cli::ServiceKind;
use switchyard_proto::registry::v1::call_mcp_tool_response::Event;
use switchyard_proto::registry::v1::{
    CallMcpToolRequest, McpHttp, McpServer, RegisterMcpServerRequest, mcp_server,
};
use switchyard_testkit::Stack;
use tokio::io::AsyncBufReadExt;
use tokio_stream::StreamExt;

use crate::us;

const CALLERS: usize = 16;
const ROUNDS: usize = 3;
const PHASE: Duration = Duration::from_secs(3);

/// `(calls/s, latency)` of `CALLERS` loops of `call` for `PHASE`.
async fn measure<F, Fut>(call: F) -> (f64, Histogram<u64>)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CALLERS {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            while start.elapsed() < PHASE {
                let t = Instant::now();
                if call().await {
                    let _ = h.record(t.elapsed().as_nanos() as u64);
                }
            }
            h
        }));
    }
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    for t in tasks {
        if let Ok(h) = t.await {
            let _ = all.add(&h);
        }
    }
    (all.len() as f64 / start.elapsed().as_secs_f64(), all)
}

pub(crate) async fn run() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp");
    let index = root.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !index.exists() {
        println!("MCP tool calls: skipped (run `make mcp-servers` first)");
        return Ok(());
    }
    let mut server = tokio::process::Command::new("node")
        .arg("--require")
        .arg(root.join("loopback.cjs"))
        .arg(&index)
        .arg("streamableHttp")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(server.stderr.take().expect("stderr")).lines();
    let port: u16 = loop {
        match lines.next_line().await? {
            Some(l) if l.starts_with("LISTENING ") => break l[10..].trim().parse()?,
            Some(_) => continue,
            None => anyhow::bail!("server-everything exited before listening"),
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let url = format!("http://127.0.0.1:{port}/mcp");

    let stack = Stack::start_with(ServiceKind::ALL, |_| {}).await?;
    let registry = RegistryClient::remote(stack.channel().await?, 4 << 20);
    registry
        .register_mcp_server(RegisterMcpServerRequest {
            server: Some(McpServer {
                name: "bench".into(),
                transport: Some(mcp_server::Transport::Http(McpHttp {
                    url: url.clone(),
                    bearer_secret: String::new(),
                })),
                ..Default::default()
            }),
        })
        .await?;
    switchyard_kit::tls::install_crypto();
    let direct = Arc::new(
        switchyard_mcp::Session::connect(
            "direct",
            switchyard_mcp::Transport::Http {
                url,
                bearer: None,
                client: reqwest::Client::new(),
            },
            Arc::default(),
            Duration::from_secs(10),
        )
        .await?,
    );
    let args = json!({"message": "ping"});
    let direct_call = {
        let (s, args) = (direct.clone(), args.clone());
        move || {
            let (s, args) = (s.clone(), args.clone());
            async move {
                let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
                let m = args.as_object().cloned().unwrap_or_default();
                s.call("echo", m, tx).await.is_ok()
            }
        }
    };
    let bridged_call = {
        let r = registry.clone();
        move || {
            let r = r.clone();
            async move {
                let req = CallMcpToolRequest {
                    name: "bench__echo".into(),
                    arguments: switchyard_kit::json::json_to_struct(&json!({"message": "ping"})),
                    ..Default::default()
                };
                let Ok(mut s) = r.call_mcp_tool(req).await else {
                    return false;
                };
                while let Some(Ok(m)) = s.next().await {
                    if let Some(Event::Result(res)) = m.event {
                        return res.error.is_empty();
                    }
                }
                false
            }
        }
    };
    println!(
        "MCP tool calls: server-everything `echo` over streamable HTTP, {CALLERS} callers, {ROUNDS} rounds of {} s each",
        PHASE.as_secs()
    );
    let (mut best_direct, mut best_bridged) = ((0.0, None), (0.0, None));
    for _ in 0..ROUNDS {
        let d = measure(direct_call.clone()).await;
        let b = measure(bridged_call.clone()).await;
        if d.0 > best_direct.0 {
            best_direct = (d.0, Some(d.1));
        }
        if b.0 > best_bridged.0 {
            best_bridged = (b.0, Some(b.1));
        }
    }
    let row = |name: &str, (rate, h): &(f64, Option<Histogram<u64>>)| {
        let h = h.as_ref().expect("a round ran");
        println!(
            "  {name:<34} {rate:>8.0} calls/s  p50 {:>8.1} us  p99 {:>8.1} us",
            us(h, 0.5),
            us(h, 0.99)
        );
    };
    row("direct (rmcp session)", &best_direct);
    row("through the registry (CallMcpTool)", &best_bridged);
    println!(
        "  ratio through / direct: {:.2} (best round of each)",
        best_bridged.0 / best_direct.0
    );
    stack.stop().await?;
    drop(server);
    Ok(())
}
