//! LLM work with the services in separate processes: the core services in
//! one, the executor in another, and the declarative agents of
//! `examples/agents` in a third (`switchyard agents serve`), all calling a
//! scripted OpenAI-compatible server, driven from the CLI.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::*;
use serde_json::json;
use switchyard_llm::scripted::{Reply, Script};

/// Runs the scripted server on its own runtime thread for the test's life.
pub(crate) fn scripted() -> (Script, String, std::sync::mpsc::Sender<()>) {
    let script = Script::new();
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let s = script.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = s.serve().await;
            url_tx.send(server.base_url()).unwrap();
            let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
            drop(server);
        });
    });
    let url = url_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    (script, url, stop_tx)
}

/// A provider at `llm_url` (its key in `SWITCHYARD_TEST_LLM_KEY`) serving
/// gpt-4o-mini at its list prices.
pub(crate) fn gpt_4o_mini(llm_url: &str) -> String {
    format!(
        r#"
[[llm.providers]]
name = "openai"
base_url = "{llm_url}"
api_key_env = "SWITCHYARD_TEST_LLM_KEY"
models = [
  {{ name = "gpt-4o-mini", input_micro_usd_per_million = 150000, output_micro_usd_per_million = 600000 }},
]
"#
    )
}

/// The three processes of these tests, their data under `dir`: the core
/// services (with `core_cfg`, if any), the executor (with `cfg`), and
/// `switchyard agents serve` hosting `agents_dir`; `env` goes to the
/// executor and the agents (provider keys). Returns (core, executor, agents).
pub(crate) fn split(
    dir: &std::path::Path,
    core_cfg: Option<&str>,
    cfg: &str,
    agents_dir: &std::path::Path,
    env: &[(&str, &str)],
) -> (Proc, Proc, Proc) {
    let d = |n: &str| {
        let p = dir.join(n);
        std::fs::create_dir_all(&p).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let core_dir = d("core");
    let mut core_args = vec![
        "serve",
        "--services",
        "registry,router,ledger,approval,auth",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &core_dir,
    ];
    if let Some(c) = core_cfg {
        core_args.extend(["--config", c]);
    }
    let core = Proc::start(&core_args, &[]);
    let c = core.url();
    let mut x_env = vec![
        ("SWITCHYARD_AUTH__KEYS_URL", c.as_str()),
        ("SWITCHYARD_EXECUTOR__REGISTRY_URL", c.as_str()),
        ("SWITCHYARD_EXECUTOR__ROUTER_URL", c.as_str()),
        ("SWITCHYARD_EXECUTOR__LEDGER_URL", c.as_str()),
        ("SWITCHYARD_EXECUTOR__APPROVAL_URL", c.as_str()),
        ("SWITCHYARD_EXECUTOR__APPROVAL_POLL_MS", "50"),
    ];
    x_env.extend_from_slice(env);
    let executor = Proc::start(
        &[
            "serve",
            "--services",
            "executor",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &d("executor"),
            "--config",
            cfg,
        ],
        &x_env,
    );
    let x = executor.url();
    let agents_token = token(&c, "agents");
    let mut a_env = vec![
        ("SWITCHYARD_AGENTS__EXECUTOR_URL", x.as_str()),
        ("SWITCHYARD_TOKEN", agents_token.as_str()),
    ];
    a_env.extend_from_slice(env);
    let agents = Proc::start(
        &[
            "agents",
            "serve",
            "--dir",
            agents_dir.to_str().unwrap(),
            "--url",
            &c,
            "--listen",
            "127.0.0.1:0",
            "--config",
            cfg,
        ],
        &a_env,
    );
    (core, executor, agents)
}

/// Submits `file` as alice; returns the job id, run id and state.
fn submit(url: &str, file: &str) -> (String, String, String) {
    let out = ok(&cli(
        url,
        &["job", "submit", file, "--as", "alice", "-o", "json"],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = |k: &str| v["job"][k].as_str().unwrap().to_owned();
    (s("job_id"), s("run_id"), s("state"))
}

#[test]
fn llm_jobs_and_declarative_agents_across_processes() {
    let (script, llm_url, _stop) = scripted();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("switchyard.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[llm]
[[llm.providers]]
name = "openai"
base_url = "{llm_url}"
api_key_env = "SWITCHYARD_TEST_LLM_KEY"
models = [
  {{ name = "gpt-4o", input_micro_usd_per_million = 2500000, output_micro_usd_per_million = 10000000 }},
  {{ name = "gpt-4o-mini", input_micro_usd_per_million = 150000, output_micro_usd_per_million = 600000 }},
]

[[llm.providers]]
name = "anthropic"
kind = "anthropic"
base_url = "{llm_url}"
api_key_env = "SWITCHYARD_TEST_ANTHROPIC_KEY"
models = [
  {{ name = "claude-3.5-sonnet", input_micro_usd_per_million = 3000000, output_micro_usd_per_million = 15000000 }},
]
"#
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let (core, executor, agents) = split(
        dir.path(),
        None,
        cfg,
        &repo_root().join("examples/agents"),
        &[
            ("SWITCHYARD_TEST_LLM_KEY", "sk-test-split"),
            ("SWITCHYARD_TEST_ANTHROPIC_KEY", "sk-ant-split"),
        ],
    );
    let (c, x) = (core.url(), executor.url());
    wait_routed(&c, "text.summary", &["agent_summarizer"]);
    let summary = ok(&cli(&c, &["tool", "summary"]));
    assert!(
        summary.contains("Available agents:\n- agent_builder: Use this agent when the person asks for a new agent")
            && summary.contains("\n- agent_summarizer: Use this agent to summarize")
            && summary.contains("Prompt size of these offers: at most "),
        "{summary}"
    );
    let checked = ok(&cli(&c, &["agents", "check", "--dir", "examples/agents"]));
    assert!(
        checked.starts_with("ok      agent_builder (Builder) model gpt-4o-mini")
            && checked.contains("\nok      agent_summarizer (Summarizer) model gpt-4o-mini"),
        "{checked}"
    );

    // 1. An agent task routed to the declarative summarizer: a person
    // approves (it bills its own tokens), then one model call.
    script.for_model(
        "gpt-4o-mini",
        vec![Reply::text(
            "Ledger ships in March; dashboards first.",
            120,
            12,
        )],
    );
    let (job, run, state) = submit(&x, "examples/jobs/summarize.yaml");
    assert_eq!(state, "pending");
    ok(&cli(&c, &["approval", "approve", &run, "--as", "bob"]));
    let watched = ok(&cli(&x, &["job", "watch", &job]));
    assert!(watched.contains("job -> completed"), "{watched}");
    // Nothing reached the model before approval: the log is the order
    // things happened in, and the job's task started only after the
    // decision (the agent's one model call is inside that attempt).
    let log = ok(&cli(&x, &["job", "watch", &job, "--events"]));
    let kinds: Vec<&str> = log
        .lines()
        // `SEQ TIME KIND TASK DATA`
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let decided = kinds.iter().position(|k| *k == "approval.decided").unwrap();
    let first_attempt = kinds.iter().position(|k| *k == "task.attempt").unwrap();
    assert!(decided < first_attempt, "{log}");
    assert_eq!(script.count(), 1, "one model call, by the approved attempt");
    let got: serde_json::Value =
        serde_json::from_str(&ok(&cli(&x, &["job", "get", &job, "-o", "json"]))).unwrap();
    assert_eq!(got["tasks"][0]["agent_id"], "agent_summarizer");
    assert_eq!(got["tokens_used"], 132, "billed by the agent, counted once");
    assert_eq!(
        script.auth_headers(),
        ["Bearer sk-test-split"],
        "the key comes from the environment variable the config names"
    );

    // 2. The OJS research job: gpt-4o is unavailable, so its fallback
    // claude-3.5-sonnet, over Anthropic's Messages API, calls
    // agent_summarizer as a tool (through routing and the budget), then
    // answers in JSON.
    script.clear_received();
    script.for_model("gpt-4o", vec![Reply::status(503)]);
    script.for_model(
        "claude-3.5-sonnet",
        vec![
            Reply::tools(
                &[(
                    "agent_summarizer",
                    json!({"task": "summarize: qubits scaled"}),
                )],
                400,
                20,
            ),
            Reply::text(r#"{"summary": "Qubits scaled.", "sources": []}"#, 600, 30),
        ],
    );
    script.for_model("gpt-4o-mini", vec![Reply::text("Qubits scaled.", 50, 5)]);
    let (job, run, _) = submit(&x, "examples/jobs/research_llm.json");
    ok(&cli(&c, &["approval", "approve", &run, "--as", "bob"]));
    let watched = ok(&cli(&x, &["job", "watch", &job]));
    assert!(watched.contains("job -> completed"), "{watched}");
    let got: serde_json::Value =
        serde_json::from_str(&ok(&cli(&x, &["job", "get", &job, "-o", "json"]))).unwrap();
    let t = &got["tasks"][0];
    assert_eq!(t["model_used"], "claude-3.5-sonnet");
    assert_eq!(t["output"]["summary"], "Qubits scaled.");
    assert_eq!(t["tool_results"][0]["name"], "agent_summarizer");
    assert_eq!(got["tokens_used"], 420 + 630 + 55);
    let entries = ok(&cli(
        &c,
        &["budget", "entries", "--job", &job, "-o", "json"],
    ));
    let e: serde_json::Value = serde_json::from_str(&entries).unwrap();
    let models: Vec<&str> = e["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["model"].as_str().unwrap_or_default())
        .collect();
    assert!(
        models.contains(&"claude-3.5-sonnet") && models.contains(&"gpt-4o-mini"),
        "{entries}"
    );
    let claude: Vec<_> = script
        .received()
        .into_iter()
        .filter(|r| r.model == "claude-3.5-sonnet")
        .collect();
    assert_eq!(claude.len(), 2);
    assert!(
        claude
            .iter()
            .all(|r| r.route == "messages" && r.api_key.as_deref() == Some("sk-ant-split")),
        "{claude:?}"
    );

    // 3. An A2A agent (the Python a2a-sdk example): the core's registry
    // reads its card, the executor process calls it over A2A.
    let (_a2a, port) = a2a_agent(&dir.path().join("a2a.log"));
    let reg = dir.path().join("text-tricks.yaml");
    std::fs::write(
        &reg,
        format!("card_url: http://127.0.0.1:{port}/.well-known/agent-card.json\nprice_per_unit_micro_usd: 1000\ntrust_score: 75\n"),
    )
    .unwrap();
    let registered = ok(&cli(
        &c,
        &["agent", "register-a2a", "-f", reg.to_str().unwrap()],
    ));
    assert!(
        registered.starts_with("registered A2A agent text_tricks"),
        "{registered}"
    );
    wait_routed(&c, "text.shout", &["text_tricks"]);
    let (job, run, _) = submit(&x, "examples/jobs/a2a_mixed.yaml");
    ok(&cli(&c, &["approval", "approve", &run, "--as", "bob"]));
    let watched = ok(&cli(&x, &["job", "watch", &job]));
    assert!(watched.contains("job -> completed"), "{watched}");
    let got: serde_json::Value =
        serde_json::from_str(&ok(&cli(&x, &["job", "get", &job, "-o", "json"]))).unwrap();
    assert_eq!(got["tasks"][1]["agent_id"], "text_tricks", "{got}");

    assert_eq!(agents.terminate(), Some(0));
    assert_eq!(executor.terminate(), Some(0));
    assert_eq!(core.terminate(), Some(0));
}

/// The example A2A agent (`examples/a2a/agent.py`, Python a2a-sdk) on a
/// port the kernel picks: the child (killed when dropped) and its port.
fn a2a_agent(log: &std::path::Path) -> (KillOnDrop, u16) {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(tool("SWITCHYARD_PYTHON"))
        .arg(repo_root().join("examples/a2a/agent.py"))
        .arg(log)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let port = lines
        .find_map(|l| {
            l.ok()?
                .strip_prefix("LISTENING ")?
                .trim()
                .parse::<u16>()
                .ok()
        })
        .expect("the agent prints LISTENING <port>");
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (KillOnDrop(child), port)
}

/// A child process killed when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where `make test` installed the MCP reference servers (`tests/mcp`).
fn mcp_servers() -> std::path::PathBuf {
    std::path::PathBuf::from(tool("SWITCHYARD_MCP_SERVERS"))
}

#[test]
fn mcp_tools_and_a2a_agents_serve_tasks_and_declarative_agents_across_processes() {
    let (script, llm_url, _stop) = scripted();
    let dir = tempfile::tempdir().unwrap();
    // The stdio server's scratch directory is the default one: reachable by
    // the sandbox's user although the data directory is 0700 (the README's
    // MCP session, which broke when it was under it).
    let servers = mcp_servers();
    let config = dir.path().join("switchyard.toml");
    std::fs::write(
        &config,
        format!(
            r#"{}
[registry.mcp]
read_paths = ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/ssl/openssl.cnf", "{servers}"]
"#,
            gpt_4o_mini(&llm_url),
            servers = servers.display(),
        ),
    )
    .unwrap();
    // A declarative agent that may read notes, and nothing else.
    let agents_dir = dir.path().join("agents/reader");
    std::fs::create_dir_all(&agents_dir).unwrap();
    std::fs::write(
        agents_dir.join("manifest.yaml"),
        "id: reader\nname: Reader\ndescription: Reads a note aloud.\ncapabilities: [notes.read]\n\
         agent:\n  model: gpt-4o-mini\n  instructions: Read the note the task names.\n  uses_tools: [fs__read_text_file]\n",
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let (core, executor, agents) = split(
        dir.path(),
        Some(cfg),
        cfg,
        &dir.path().join("agents"),
        &[("SWITCHYARD_TEST_LLM_KEY", "sk-test-split")],
    );
    let (c, x) = (core.url(), executor.url());
    // The filesystem reference server, started by the registry process.
    let server = dir.path().join("fs.yaml");
    let index = servers.join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    std::fs::write(
        &server,
        format!(
            "name: fs\nstdio:\n  command: node\n  args: [{}, \".\"]\n",
            index.display()
        ),
    )
    .unwrap();
    let registered = ok(&cli(
        &c,
        &["tool", "mcp", "register", "-f", server.to_str().unwrap()],
    ));
    assert!(
        registered.starts_with("registered MCP server fs (secure-filesystem-server"),
        "{registered}"
    );
    let listed = ok(&cli(&c, &["tool", "mcp", "list"]));
    assert!(listed.contains("fs    connected"), "{listed}");
    wait_routed(&c, "notes.read", &["agent_reader"]);

    // 1. An LLM task in the executor process writes and reads through the
    // registry process's session.
    script.for_model(
        "gpt-4o-mini",
        vec![
            Reply::tools(
                &[(
                    "fs__write_file",
                    json!({"path": "notes.txt", "content": "ship in March"}),
                )],
                300,
                20,
            ),
            Reply::tools(
                &[("fs__read_text_file", json!({"path": "notes.txt"}))],
                340,
                20,
            ),
            Reply::text("The note says: ship in March.", 400, 10),
        ],
    );
    let (job, run, state) = submit(&x, "examples/jobs/mcp_notes.json");
    assert_eq!(state, "pending");
    ok(&cli(&c, &["approval", "approve", &run, "--as", "bob"]));
    let watched = ok(&cli(&x, &["job", "watch", &job]));
    assert!(watched.contains("job -> completed"), "{watched}");
    let got: serde_json::Value =
        serde_json::from_str(&ok(&cli(&x, &["job", "get", &job, "-o", "json"]))).unwrap();
    let results = got["tasks"][0]["tool_results"].as_array().unwrap();
    let names: Vec<(&str, &str)> = results
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["reason"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [("fs__write_file", ""), ("fs__read_text_file", "")],
        "{got}"
    );
    assert_eq!(results[1]["result"]["content"], "ship in March");
    let scratch = switchyard_cli::node::default_mcp_scratch(&dir.path().join("core")).unwrap();
    let note = scratch.join("fs/notes.txt");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "ship in March");

    // 2. The declarative reader (in the agents process) may read, not
    // write: its `uses_tools` holds, whatever the model asks for.
    script.clear_received();
    script.for_model(
        "gpt-4o-mini",
        vec![
            Reply::tools(
                &[
                    (
                        "fs__write_file",
                        json!({"path": "notes.txt", "content": "overwritten"}),
                    ),
                    ("fs__read_text_file", json!({"path": "notes.txt"})),
                ],
                200,
                20,
            ),
            Reply::text("It says: ship in March.", 260, 10),
        ],
    );
    let doc = dir.path().join("read.yaml");
    std::fs::write(
        &doc,
        "plan_id: read-note\ntasks:\n  - id: read\n    agent:\n      capability: notes.read\n      input:\n        task: Read notes.txt.\n",
    )
    .unwrap();
    let (job, run, _) = submit(&x, doc.to_str().unwrap());
    ok(&cli(&c, &["approval", "approve", &run, "--as", "bob"]));
    let watched = ok(&cli(&x, &["job", "watch", &job]));
    assert!(watched.contains("job -> completed"), "{watched}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "ship in March");
    let answers = script.received();
    let back = answers[1].body["messages"].to_string();
    assert!(back.contains("AGENT_TOOL_NOT_FOUND"), "{back}");
    assert!(back.contains("ship in March"), "{back}");

    assert_eq!(agents.terminate(), Some(0));
    assert_eq!(executor.terminate(), Some(0));
    assert_eq!(core.terminate(), Some(0));
}
