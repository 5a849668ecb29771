//! MCP servers as tool providers, against servers nobody here wrote: the
//! npm reference servers `@modelcontextprotocol/server-everything` and
//! `server-filesystem` (over stdio, started by the registry under the
//! command sandbox, and over streamable HTTP), and a server written with
//! the Python `mcp` SDK (`tests/mcp/py_server.py`, HTTP). `make test`
//! installs them and passes their directory in SWITCHYARD_MCP_SERVERS.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_kit::error::ApiError;
use switchyard_kit::json::{json_to_struct, value_to_json};
use switchyard_llm::scripted::Reply;
use switchyard_proto::executor::v1::{JobState, TaskStatus};
use switchyard_proto::registry::v1::call_mcp_tool_response::Event;
use switchyard_proto::registry::v1::mcp_server::Transport;
use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
use switchyard_proto::registry::v1::*;
use switchyard_testkit::Stack;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_stream::StreamExt;

use crate::common::{finish, id, submit};
use crate::llm::{Env, env, events, task, tool_outcomes};

type Registry = RegistryServiceClient<switchyard_kit::client::Intercepted>;

/// The Python of `.venv`, which has the `mcp` and `a2a-sdk` SDKs.
pub(crate) fn python() -> String {
    std::env::var("SWITCHYARD_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SWITCHYARD_PYTHON is not set: run the tests with `make test`, which installs the SDKs"
        )
    })
}

/// Where `make test` installed the servers (`tests/mcp`).
fn servers() -> PathBuf {
    PathBuf::from(std::env::var("SWITCHYARD_MCP_SERVERS").unwrap_or_else(|_| {
        panic!("SWITCHYARD_MCP_SERVERS is not set: run the tests with `make test`, which installs the MCP servers")
    }))
}

fn npm_server(name: &str) -> String {
    servers()
        .join("node_modules/@modelcontextprotocol")
        .join(name)
        .join("dist/index.js")
        .display()
        .to_string()
}

/// The LLM test stack, whose registry may start `node` servers from
/// `tests/mcp` and gives each a scratch directory under `scratch`
/// (reachable by the sandbox's user, unlike the stack's 0700 data dir).
async fn stack(scratch: &Path, tweak: impl FnOnce(&mut switchyard_cli::Config)) -> Env {
    let scratch = scratch.to_path_buf();
    env(true, move |c| {
        c.registry.mcp.read_paths.push(servers());
        c.registry.mcp.scratch_dir = scratch;
        tweak(c);
    })
    .await
}

/// A 0755 temporary directory.
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

async fn registry(s: &Stack) -> Registry {
    RegistryServiceClient::new(s.channel().await.unwrap())
}

/// A scratch directory, the stack (with `tweak`) and a registry client.
async fn started(
    tweak: impl FnOnce(&mut switchyard_cli::Config),
) -> (tempfile::TempDir, Env, Registry) {
    let scratch = open_dir();
    let e = stack(scratch.path(), tweak).await;
    let r = registry(&e.stack).await;
    (scratch, e, r)
}

/// The reference server-everything over stdio, named `everything`.
fn everything() -> McpServer {
    stdio("everything", &[&npm_server("server-everything"), "stdio"])
}

fn stdio(name: &str, args: &[&str]) -> McpServer {
    McpServer {
        name: name.into(),
        transport: Some(Transport::Stdio(McpStdio {
            command: "node".into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn http(name: &str, url: &str) -> McpServer {
    McpServer {
        name: name.into(),
        transport: Some(Transport::Http(McpHttp {
            url: url.into(),
            bearer_secret: String::new(),
        })),
        ..Default::default()
    }
}

async fn register(r: &mut Registry, server: McpServer) -> RegisterMcpServerResponse {
    r.register_mcp_server(RegisterMcpServerRequest {
        server: Some(server),
    })
    .await
    .unwrap()
    .into_inner()
}

fn reason(s: &tonic::Status) -> String {
    ApiError::from(s.clone()).reason.unwrap_or_default()
}

/// A third-party server process of the test: killed when dropped.
pub(crate) struct Child {
    _child: tokio::process::Child,
    pub(crate) port: u16,
}

/// Starts `program args…` and waits for its `LISTENING <port>` line.
pub(crate) async fn listening(program: &str, args: &[&str]) -> Child {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(p) = line.strip_prefix("LISTENING ") {
                return p.trim().parse::<u16>().unwrap();
            }
        }
        panic!("{program} exited before listening");
    })
    .await
    .expect("the server listens within 30 s");
    // Keep draining its stderr so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Child {
        _child: child,
        port,
    }
}

/// Runs one MCP tool call through the registry; (progress updates, result).
async fn call(r: &mut Registry, name: &str, args: Value) -> (Vec<McpProgress>, McpToolResult) {
    let mut stream = r
        .call_mcp_tool(CallMcpToolRequest {
            name: name.into(),
            arguments: json_to_struct(&args),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut progress = Vec::new();
    while let Some(msg) = stream.next().await {
        match msg.unwrap().event {
            Some(Event::Progress(p)) => progress.push(p),
            Some(Event::Result(res)) => return (progress, res),
            None => {}
        }
    }
    panic!("the call of {name} ended without a result");
}

/// A result's text: a plain string, or the `result` field of the
/// structured content the Python SDK makes of a function's return value.
fn text(r: &McpToolResult) -> String {
    match r.result.as_ref().map(value_to_json) {
        Some(Value::String(s)) => s,
        Some(Value::Object(o)) if o.get("result").is_some_and(Value::is_string) => {
            o["result"].as_str().unwrap_or_default().to_owned()
        }
        other => format!("{other:?}"),
    }
}

/// Runs an LLM job on `model` (scripted with `replies`) offering `tools`;
/// the job's id and its one task, once the job completed.
async fn run_llm(
    e: &mut Env,
    model: &str,
    replies: Vec<Reply>,
    tools: &[&str],
) -> (String, TaskStatus) {
    e.script.for_model(model, replies);
    let tools: Vec<Value> = tools.iter().map(|t| json!({"name": t})).collect();
    let doc = json!({"type": "t.mcp", "args": ["use the MCP tools"], "ext_agent_model": model,
        "ext_agent_max_tokens": 50, "ext_agent_tools": tools})
    .to_string();
    let job = submit(&mut e.jobs, &doc).await.unwrap();
    let res = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(res.state, JobState::Completed as i32, "{res:?}");
    (id(&job), task(&res, "agent").clone())
}

/// Waits (bounded) until `f` holds.
pub(crate) async fn until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut f: impl FnMut() -> F,
) {
    for _ in 0..300 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 15 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_servers_over_stdio_serve_an_llm_task_with_every_tool_guarantee() {
    let (scratch, mut e, mut r) = started(|_| {}).await;
    let reg = register(&mut r, everything()).await;
    assert!(reg.created);
    let names: Vec<&str> = reg.tools.iter().map(|t| t.name.as_str()).collect();
    for want in [
        "everything__echo",
        "everything__get_sum",
        "everything__trigger_long_running_operation",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    let sum = reg
        .tools
        .iter()
        .find(|t| t.name == "everything__get_sum")
        .unwrap();
    assert_eq!(
        (sum.mcp_server.as_str(), sum.mcp_tool.as_str()),
        ("everything", "get-sum")
    );
    // The filesystem server, allowed only its own scratch directory ("." is
    // where the registry starts it).
    let fs = npm_server("server-filesystem");
    let reg = register(&mut r, stdio("fs", &[&fs, "."])).await;
    assert!(reg.tools.iter().any(|t| t.name == "fs__read_text_file"));
    // Listed like any tool, and in the capabilities summary a model is given.
    let listed = r
        .list_tools(ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tools;
    assert!(
        listed
            .iter()
            .any(|t| t.name == "fs__write_file" && t.mcp_server == "fs")
    );
    let summary = r
        .get_capabilities_summary(GetCapabilitiesSummaryRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        summary.text.contains("everything__get_sum"),
        "{}",
        summary.text
    );
    let servers = r
        .list_mcp_servers(ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner()
        .servers;
    assert_eq!(servers.len(), 2);
    assert!(
        servers
            .iter()
            .all(|s| s.state == McpServerState::Connected as i32)
    );

    let replies = vec![
        Reply::tools(
            &[
                ("everything__get_sum", json!({"a": 2, "b": 3})),
                ("everything__get_sum", json!({"a": "two", "b": 3})),
                ("everything__get_env", json!({})),
                (
                    "fs__write_file",
                    json!({"path": "notes.txt", "content": "hello from a job"}),
                ),
            ],
            40,
            10,
        ),
        Reply::tools(
            &[
                ("fs__read_text_file", json!({"path": "notes.txt"})),
                ("fs__read_text_file", json!({"path": "/etc/hostname"})),
            ],
            80,
            10,
        ),
        Reply::text("done", 120, 5),
    ];
    let offered = [
        "everything__get_sum",
        "fs__write_file",
        "fs__read_text_file",
    ];
    let (_, t) = run_llm(&mut e, "m-mcp", replies, &offered).await;
    let seen = tool_outcomes(&t);
    assert_eq!(
        seen,
        [
            ("everything__get_sum", ""),
            // Refused by the tool's own schema before any call.
            ("everything__get_sum", "AGENT_TOOL_INVALID_ARGUMENTS"),
            // Registered, but not declared by this task: isolation.
            ("everything__get_env", "AGENT_TOOL_NOT_FOUND"),
            ("fs__write_file", ""),
            ("fs__read_text_file", ""),
            // The server's own error (outside its allowed directory) goes
            // back to the model.
            ("fs__read_text_file", "AGENT_TOOL_FAILED"),
        ]
    );
    let result = |i: usize| value_to_json(t.tool_results[i].result.as_ref().unwrap());
    assert_eq!(result(0), json!("The sum of 2 and 3 is 5."));
    // The server's structured content is what the model gets.
    assert_eq!(result(4), json!({"content": "hello from a job"}));
    assert!(
        t.tool_results[5].error.to_lowercase().contains("denied"),
        "{}",
        t.tool_results[5].error
    );
    // The file is in the server's scratch directory, nowhere else.
    let written = std::fs::read_to_string(scratch.path().join("fs/notes.txt")).unwrap();
    assert_eq!(written, "hello from a job");
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_is_confined_by_the_sandbox_whatever_it_allows_itself() {
    let (scratch, e, mut r) = started(|_| {}).await;
    // The filesystem server told it may serve the whole disk: the sandbox
    // still lets it read only the system paths and its scratch directory.
    let fs = npm_server("server-filesystem");
    register(&mut r, stdio("wide", &[&fs, "/"])).await;
    let creds = e.stack.data_dir().join("credentials.json");
    assert!(creds.exists());
    let (_, res) = call(
        &mut r,
        "wide__read_text_file",
        json!({"path": creds.display().to_string()}),
    )
    .await;
    assert!(res.result.is_none(), "{res:?}");
    assert!(
        res.error.contains("EACCES") || res.error.to_lowercase().contains("denied"),
        "{}",
        res.error
    );
    let admin = e.stack.token("admin").unwrap();
    assert!(!res.error.contains(&admin), "a credential leaked");
    // Writing outside the scratch directory fails the same way.
    let outside = scratch.path().join("outside.txt");
    let (_, res) = call(
        &mut r,
        "wide__write_file",
        json!({"path": outside.display().to_string(), "content": "x"}),
    )
    .await;
    assert!(!res.error.is_empty(), "{res:?}");
    assert!(!outside.exists());
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_tool_is_timed_out_and_cancelled_on_the_server_with_its_progress_on_the_job() {
    let scratch = open_dir();
    let log = scratch.path().join("py-server.log");
    let py = listening(
        &python(),
        &[
            &servers().join("py_server.py").display().to_string(),
            &log.display().to_string(),
        ],
    )
    .await;
    let mut e = stack(scratch.path(), |c| c.executor.tool_timeout_ms = 1_500).await;
    let mut r = registry(&e.stack).await;
    let url = format!("http://127.0.0.1:{}/mcp", py.port);
    let reg = register(&mut r, http("py", &url)).await;
    let names: Vec<&str> = reg.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["py__fail", "py__grow", "py__wait"]);
    // The Python SDK speaks both eras: the stateless one is picked, so the
    // progress, the cancellation (the closing of the call's stream) and the
    // list change (a subscription stream) below are 2026-07-28's.
    let info = reg.server.as_ref().unwrap();
    assert_eq!(info.protocol_version, "2026-07-28", "{info:?}");

    let replies = vec![
        Reply::tools(
            &[
                ("py__wait", json!({"seconds": 30})),
                ("py__fail", json!({"why": "the disk is full"})),
            ],
            40,
            10,
        ),
        Reply::text("gave up", 80, 5),
    ];
    let (job_id, t) = run_llm(&mut e, "m-mcp-slow", replies, &["py__wait", "py__fail"]).await;
    assert_eq!(t.tool_results[0].reason, "AGENT_TOOL_TIMEOUT", "{t:?}");
    assert_eq!(t.tool_results[1].reason, "AGENT_TOOL_FAILED");
    assert!(
        t.tool_results[1].error.contains("the disk is full"),
        "{t:?}"
    );
    // The server was told to stop: its tool saw the cancellation.
    until("the server records the cancellation", || async {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("cancelled wait 30"))
    })
    .await;
    // Its progress notifications are on the job, in order, before the end.
    let evs = events(&mut e.jobs, &job_id).await;
    let progress: Vec<f64> = evs
        .iter()
        .filter(|(k, _)| k == "llm.tool_progress")
        .map(|(_, d)| d["progress"].as_f64().unwrap())
        .collect();
    assert!(progress.len() >= 3, "{progress:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    let first = evs.iter().find(|(k, _)| k == "llm.tool_progress").unwrap();
    assert_eq!(
        (first.1["name"].as_str(), first.1["total"].as_f64()),
        (Some("py__wait"), Some(300.0))
    );

    // A tool the server adds is registered when it says its list changed.
    let (_, grown) = call(&mut r, "py__grow", json!({"name": "shout"})).await;
    assert_eq!(text(&grown), "added shout");
    until("py__shout is registered", || {
        let mut r = r.clone();
        async move {
            r.list_tools(ListToolsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .tools
                .iter()
                .any(|t| t.name == "py__shout")
        }
    })
    .await;
    let (_, shouted) = call(&mut r, "py__shout", json!({"text": "quiet"})).await;
    assert_eq!(text(&shouted), "QUIET");
    drop(py);
    e.stack.stop().await.unwrap();
}

/// Pids whose working directory is `dir`.
fn pids_in(dir: &Path) -> Vec<u32> {
    let dir = dir.canonicalize().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            (std::fs::read_link(e.path().join("cwd")).ok()? == dir).then_some(pid)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_mid_call_fails_that_call_and_is_started_again_for_the_next() {
    let (scratch, e, mut r) = started(|_| {}).await;
    register(&mut r, everything()).await;
    let mut stream = r
        .call_mcp_tool(CallMcpToolRequest {
            name: "everything__trigger_long_running_operation".into(),
            arguments: json_to_struct(&json!({"duration": 30, "steps": 60})),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // In flight: its first progress update arrived.
    let first = stream.next().await.unwrap().unwrap();
    assert!(matches!(first.event, Some(Event::Progress(_))), "{first:?}");
    let pids = pids_in(&scratch.path().join("everything"));
    assert!(!pids.is_empty(), "the server runs in its scratch directory");
    for pid in &pids {
        std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
    }
    let end = loop {
        match stream.next().await.unwrap().unwrap().event {
            Some(Event::Result(res)) => break res,
            _ => continue,
        }
    };
    assert!(end.result.is_none());
    assert!(end.error.contains("closed the connection"), "{}", end.error);
    let servers = r
        .list_mcp_servers(ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner()
        .servers;
    assert_eq!(
        servers[0].state,
        McpServerState::Disconnected as i32,
        "{servers:?}"
    );
    assert!(!servers[0].state_message.is_empty());
    // The next call starts it again.
    let (_, sum) = call(&mut r, "everything__get_sum", json!({"a": 1, "b": 2})).await;
    assert_eq!(text(&sum), "The sum of 1 and 2 is 3.");
    let servers = r
        .list_mcp_servers(ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner()
        .servers;
    assert_eq!(servers[0].state, McpServerState::Connected as i32);
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_server_over_streamable_http_lists_and_runs_its_tools() {
    let server = listening(
        "node",
        &[
            "--require",
            &servers().join("loopback.cjs").display().to_string(),
            &npm_server("server-everything"),
            "streamableHttp",
        ],
    )
    .await;
    let (_scratch, e, mut r) = started(|_| {}).await;
    let url = format!("http://127.0.0.1:{}/mcp", server.port);
    let reg = register(&mut r, http("web", &url)).await;
    assert!(
        reg.tools.iter().any(|t| t.name == "web__echo"),
        "{:?}",
        reg.tools
    );
    let info = reg.server.unwrap();
    assert!(info.server_version.contains("everything"), "{info:?}");
    // It speaks no 2026-07-28: discovery falls back to the handshake.
    assert_eq!(info.protocol_version, "2025-11-25", "{info:?}");
    let (_, echoed) = call(&mut r, "web__echo", json!({"message": "over http"})).await;
    assert_eq!(text(&echoed), "Echo: over http");
    let (progress, done) = call(
        &mut r,
        "web__trigger_long_running_operation",
        json!({"duration": 0.3, "steps": 3}),
    )
    .await;
    assert!(done.error.is_empty(), "{done:?}");
    // Relayed in order as they came; the client handles each notification
    // on its own task (rmcp), so the last one may race the answer and be
    // dropped once the call has ended.
    let steps: Vec<f64> = progress.iter().map(|p| p.progress).collect();
    assert!(
        !steps.is_empty() && steps[0] == 1.0 && steps.windows(2).all(|w| w[0] < w[1]),
        "{steps:?}"
    );
    assert!(progress.iter().all(|p| p.total == 3.0), "{progress:?}");
    drop(server);
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_registrations_are_refused_with_the_reason_and_store_nothing() {
    let (_scratch, e, mut r) = started(|c| {
        c.registry.mcp.secrets.insert(
            "gh".into(),
            switchyard_registry::mcp::McpSecret {
                env: "SWITCHYARD_TEST_NO_SUCH_TOKEN".into(),
                urls: vec!["https://api.example.com/".into()],
            },
        );
    })
    .await;
    let refuse = |server: McpServer| {
        let mut r = r.clone();
        async move {
            r.register_mcp_server(RegisterMcpServerRequest {
                server: Some(server),
            })
            .await
            .unwrap_err()
        }
    };
    // A program that is not on registry.mcp.commands.
    let s = refuse(McpServer {
        name: "shell".into(),
        transport: Some(Transport::Stdio(McpStdio {
            command: "sh".into(),
            args: vec!["-c".into(), "cat".into()],
            ..Default::default()
        })),
        ..Default::default()
    })
    .await;
    assert_eq!(reason(&s), "INVALID_ARGUMENT", "{s:?}");
    assert!(
        s.message().contains("server.stdio.command") || format!("{s:?}").contains("stdio.command")
    );
    // The loader's variables.
    let mut bad_env = stdio("env", &["x.js"]);
    if let Some(Transport::Stdio(st)) = &mut bad_env.transport {
        st.env.insert("LD_PRELOAD".into(), "/tmp/evil.so".into());
    }
    assert_eq!(reason(&refuse(bad_env).await), "INVALID_ARGUMENT");
    // A secret that is not configured, and one sent where it may not go.
    let mut unknown = http("web", "https://api.example.com/mcp");
    if let Some(Transport::Http(h)) = &mut unknown.transport {
        h.bearer_secret = "nope".into();
    }
    assert_eq!(reason(&refuse(unknown).await), "INVALID_ARGUMENT");
    let mut elsewhere = http("web", "https://attacker.example.net/mcp");
    if let Some(Transport::Http(h)) = &mut elsewhere.transport {
        h.bearer_secret = "gh".into();
    }
    let s = refuse(elsewhere).await;
    assert_eq!(reason(&s), "INVALID_ARGUMENT");
    assert!(format!("{s:?}").contains("may not be sent"), "{s:?}");
    // Nobody answers there: unavailable, nothing stored.
    let s = refuse(http("gone", "http://127.0.0.1:9/mcp")).await;
    assert_eq!(reason(&s), "MCP_SERVER_UNAVAILABLE", "{s:?}");
    // A bad name.
    assert_eq!(
        reason(&refuse(http("Bad__Name", "http://127.0.0.1:9/")).await),
        "INVALID_ARGUMENT"
    );
    let servers = r
        .list_mcp_servers(ListMcpServersRequest {})
        .await
        .unwrap()
        .into_inner()
        .servers;
    assert!(servers.is_empty(), "{servers:?}");

    // An MCP tool changes only with its server.
    register(&mut r, everything()).await;
    let s = r
        .register_tool(RegisterToolRequest {
            tool: Some(Tool {
                name: "everything__echo".into(),
                parameters: json_to_struct(&json!({"type": "object"})),
                endpoint: "http://127.0.0.1:9".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&s), "MCP_TOOL_MANAGED");
    let s = r
        .deregister_tool(DeregisterToolRequest {
            name: "everything__echo".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&s), "MCP_TOOL_MANAGED");
    // A submitter may not call a tool directly (only jobs run tools).
    let alice = e.stack.token("alice").unwrap();
    let mut as_alice = RegistryServiceClient::new(e.stack.channel_with(&alice).await.unwrap());
    let s = as_alice
        .call_mcp_tool(CallMcpToolRequest {
            name: "everything__echo".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied);
    // Deregistering removes the tools.
    r.deregister_mcp_server(DeregisterMcpServerRequest {
        name: "everything".into(),
    })
    .await
    .unwrap();
    let tools = r
        .list_tools(ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tools;
    assert!(
        !tools.iter().any(|t| t.mcp_server == "everything"),
        "{tools:?}"
    );
    let s = r
        .deregister_mcp_server(DeregisterMcpServerRequest {
            name: "everything".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&s), "MCP_SERVER_NOT_FOUND");
    e.stack.stop().await.unwrap();
}
