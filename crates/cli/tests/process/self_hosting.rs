//! The self-hosting test across processes: the core services, the executor
//! and `switchyard agents serve` (hosting the shipped builder) apart; a
//! conversation from `switchyard chat` gets a proposed agent from the
//! builder, a person publishes it with `switchyard agents publish`, and the
//! agents process — never restarted — hosts it for the next message.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use switchyard_llm::scripted::Reply;

use crate::llm_split::{scripted, split};
use crate::support::*;

const TRANSLATOR: &str = "id: translator
name: Translator
description: Use this agent to translate a short English text into French.
capabilities: [built.translator]
agent:
  model: gpt-4o-mini
  instructions: |
    Translate the text you are given into French.
  uses_tools: []
";

#[test]
fn a_proposed_agent_published_with_the_cli_is_hosted_by_a_running_agents_process() {
    let (script, llm_url, _stop) = scripted();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("switchyard.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[agents]
reload_ms = 100

[llm]
[[llm.providers]]
name = "openai"
base_url = "{llm_url}"
api_key_env = "SWITCHYARD_TEST_LLM_KEY"
models = [
  {{ name = "m-chat", input_micro_usd_per_million = 150000, output_micro_usd_per_million = 600000 }},
  {{ name = "gpt-4o-mini", input_micro_usd_per_million = 150000, output_micro_usd_per_million = 600000 }},
]
"#
        ),
    )
    .unwrap();
    let agents_dir = dir.path().join("agents");
    let builder = repo_root().join("examples/agents/builder");
    std::fs::create_dir_all(agents_dir.join("builder/prompts")).unwrap();
    for f in ["manifest.yaml", "prompts/builder.md"] {
        std::fs::copy(builder.join(f), agents_dir.join("builder").join(f)).unwrap();
    }
    let (core, executor, agents) = split(
        dir.path(),
        None,
        config.to_str().unwrap(),
        &agents_dir,
        &[("SWITCHYARD_TEST_LLM_KEY", "sk-test-self-hosting")],
    );
    let (c, x) = (core.url(), executor.url());
    wait_routed(&c, "agent.build", &["agent_builder"]);
    script.for_model(
        "m-chat",
        vec![
            Reply::tools(
                &[(
                    "agent_builder",
                    json!({"task": "an English to French translator"}),
                )],
                40,
                8,
            ),
            Reply::text("A translator is proposed: publish it to use it.", 60, 10),
            Reply::tools(&[("agent_translator", json!({"task": "hello"}))], 70, 8),
            Reply::text("Bonjour.", 80, 3),
        ],
    );
    script.for_model(
        "gpt-4o-mini",
        vec![
            Reply::text(TRANSLATOR, 30, 90),
            Reply::text("Bonjour.", 20, 3),
        ],
    );
    let job = dir.path().join("chat.json");
    std::fs::write(
        &job,
        json!({"job_id": "self-hosted", "approval": {"outputs_allowed": ["propose_agent"]},
               "tasks": [{"id": "chat", "conversation": {
                   "orchestrator": {"model": "m-chat", "max_tokens": 40,
                                    "agents": ["agent_builder", "built.*"]}}}]})
        .to_string(),
    )
    .unwrap();
    let submitted: Value = serde_json::from_str(&ok(&cli(
        &x,
        &[
            "job",
            "submit",
            job.to_str().unwrap(),
            "--as",
            "alice",
            "-o",
            "json",
        ],
    )))
    .unwrap();
    let run = submitted["job"]["run_id"].as_str().unwrap().to_owned();
    ok(&cli(&c, &["approval", "approve", &run, "--as", "bob"]));

    let said = ok(&cli_stdin(
        &x,
        &["chat", "--job", "self-hosted", "--as", "alice"],
        "I need an agent that translates into French\n/quit\n",
    ));
    assert!(said.contains("A translator is proposed"), "{said}");
    let listed: Value = serde_json::from_str(&ok(&cli(
        &x,
        &[
            "job",
            "artifacts",
            "self-hosted",
            "-o",
            "json",
            "--as",
            "alice",
        ],
    )))
    .unwrap();
    let proposal = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "agent_manifest")
        .unwrap_or_else(|| panic!("no agent_manifest in {listed}"));
    let path = proposal["path"].as_str().unwrap().to_owned();

    let dir = agents_dir.to_str().unwrap();
    let publish = |wait: &str| {
        cli(
            &x,
            &[
                "agents",
                "publish",
                "--job",
                "self-hosted",
                "--artifact",
                &path,
                "--dir",
                dir,
                "--registry-url",
                &c,
                "--approval-url",
                &c,
                "--wait-secs",
                wait,
                "--as",
                "alice",
            ],
        )
    };
    // Publishing asks a person first: the run is proposed, nothing written.
    let waits = publish("0");
    let told = String::from_utf8_lossy(&waits.stderr).into_owned();
    assert!(!waits.status.success(), "{told}");
    let run = switchyard_cli::agents::publish_run_id(
        "self-hosted",
        proposal["artifact_id"].as_str().unwrap(),
    );
    assert!(
        told.contains(&format!("approval run {run} is proposed")),
        "{told}"
    );
    assert!(!agents_dir.join("translator").exists());
    ok(&cli(
        &c,
        &[
            "approval",
            "approve",
            &run,
            "--as",
            "bob",
            "-m",
            "translates only",
        ],
    ));
    let published = ok(&publish("30"));
    assert!(
        published.contains(&format!("approved by bob (approval run {run})")),
        "{published}"
    );
    assert!(
        published.contains("published agent_translator (Translator)")
            && published.contains(
                "agent_translator is registered and routable: capabilities [built.translator]"
            ),
        "{published}"
    );
    let said = ok(&cli_stdin(
        &x,
        &["chat", "--job", "self-hosted", "--as", "alice"],
        "Translate: hello\n/close\n",
    ));
    assert!(said.contains("Bonjour."), "{said}");
    let translator = script
        .received()
        .into_iter()
        .filter(|r| r.model == "gpt-4o-mini")
        .nth(1)
        .unwrap();
    assert!(
        translator.body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Translate the text you are given into French."),
        "{}",
        translator.body
    );
    for p in [agents, executor, core] {
        assert_eq!(p.terminate(), Some(0));
    }
}
