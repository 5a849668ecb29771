//! The self-hosting test (seed ADR 003 acceptance 1): in a conversation, the
//! orchestrator asks the shipped builder agent for a new agent; the builder's
//! manifest is checked and kept as an `agent_manifest` artifact (only when
//! the job allows `propose_agent`); publishing it proposes an approval run,
//! a person (an approver, not the publisher) approves it, and only then is
//! it written into the manifest directory; the agents host loads it without
//! a restart, the registry routes to it, and the orchestrator invokes it in
//! the same conversation.
//! Proposals that cannot be hosted are refused with every problem listed.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_api::{ApprovalClient, ExecutorClient, RegistryClient};
use switchyard_cli::agents::{Publish, publish};
use switchyard_llm::scripted::Reply;
use switchyard_proto::common::v1::ArtifactKind;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{JobState, ListArtifactsRequest};

use crate::common::{Jobs, submit};
use crate::conversation::{history, reply_to};
use crate::llm::{Env, env};

/// The translator the builder proposes: valid, using the one tool the
/// builder may grant.
const TRANSLATOR: &str = "```yaml
id: translator
name: Translator
description: |
  Use this agent to translate a short English text into French. It returns
  only the translation.
capabilities:
  - built.translator
agent:
  integration_mode: tool
  model: gpt-4o-mini
  instructions: |
    Translate the text you are given into French. Answer with the translation only.
  parameters:
    temperature: 0.3
    max_output_tokens: 200
  uses_tools: [web_search]
  limits:
    max_turns: 4
enabled: true
```";

/// A proposal with three problems: a prompt file, a tool the builder may
/// not grant, and an id that is not one.
const BAD: &str = "id: Bad-Id
name: Bad
description: Does bad things.
agent:
  model: gpt-4o-mini
  instructions: prompts/evil.md
  uses_tools: [file_manager]
";

/// The stack with the scripted model and a manifest directory holding the
/// shipped builder, reloaded every 50 ms.
async fn stack_with_builder() -> (Env, tempfile::TempDir) {
    let agents = tempfile::tempdir().unwrap();
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/builder");
    let d = agents.path().join("builder");
    std::fs::create_dir_all(d.join("prompts")).unwrap();
    for f in ["manifest.yaml", "prompts/builder.md"] {
        std::fs::copy(example.join(f), d.join(f)).unwrap();
    }
    let dir = agents.path().to_path_buf();
    let e = env(true, move |c| {
        c.agents.dir = Some(dir);
        c.agents.reload_ms = 50;
    })
    .await;
    crate::common::wait_routed(&e.stack, "agent.build").await;
    (e, agents)
}

fn publishing<'a>(artifact: &'a str, dir: &'a std::path::Path, allow: &'a [String]) -> Publish<'a> {
    Publish {
        job: "self-host",
        artifact,
        dir,
        allow_tools: allow,
        wait: Duration::from_secs(20),
    }
}

fn builder_chat(job_id: &str, outputs: &[&str]) -> String {
    json!({"job_id": job_id,
           "approval": {"outputs_allowed": outputs},
           "tasks": [{"id": "chat", "conversation": {
               "orchestrator": {"model": "m-chat", "instructions": "You are the front desk.",
                                "max_tokens": 40, "agents": ["agent_builder", "built.*"]}}}]})
    .to_string()
}

/// Submits `doc` and approves its run when it waits for a person.
pub(crate) async fn start(e: &Env, c: &mut Jobs, doc: &str) {
    let j = submit(c, doc).await.unwrap();
    if j.state == JobState::Pending as i32 && !j.run_id.is_empty() {
        crate::common::approve(&e.stack, &j.run_id).await;
    }
}

/// Says `text` and waits for the reply.
async fn say(c: &mut Jobs, job_id: &str, text: &str) -> Value {
    let (seq, after) = crate::handoff::say(c, job_id, text).await;
    reply_to(c, job_id, seq, after).await
}

/// The body of the `n`th request `model` received.
fn request(e: &Env, model: &str, n: usize) -> Value {
    e.script
        .received()
        .into_iter()
        .filter(|r| r.model == model)
        .nth(n)
        .unwrap()
        .body
}

/// The texts of the tool results the orchestrator's `n`th request carried.
fn tool_messages(e: &Env, model: &str, n: usize) -> Vec<String> {
    request(e, model, n)["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let content = m["content"].as_str().unwrap_or_default();
            // A failed call's content is `{"error": …, "reason": …}`.
            serde_json::from_str::<Value>(content)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_else(|| content.to_owned())
        })
        .collect()
}

/// The tool names the `n`th request of `model` offered.
fn offered(e: &Env, model: &str, n: usize) -> Vec<String> {
    request(e, model, n)["tools"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_builder_proposes_an_agent_a_person_publishes_it_and_the_orchestrator_invokes_it_in_the_same_conversation()
 {
    let (e, agents) = stack_with_builder().await;
    let mut alice = JobServiceClient::new(e.stack.channel_as("alice").await.unwrap());
    // The orchestrator asks the builder twice (its first proposal is
    // refused), says so; later it calls the new agent.
    e.script.for_model(
        "m-chat",
        vec![
            Reply::tools(
                &[(
                    "agent_builder",
                    json!({"task": "an English to French translator"}),
                )],
                50,
                10,
            ),
            Reply::tools(
                &[(
                    "agent_builder",
                    json!({"task": "an English to French translator, valid this time"}),
                )],
                60,
                10,
            ),
            Reply::text(
                "A translator is proposed; a person must publish it.",
                70,
                10,
            ),
            Reply::tools(
                &[("agent_translator", json!({"task": "hello, friend"}))],
                80,
                10,
            ),
            Reply::text("Bonjour, mon ami.", 90, 10),
        ],
    );
    e.script.for_model(
        "gpt-4o-mini",
        vec![
            Reply::text(BAD, 30, 40),
            Reply::text(TRANSLATOR, 30, 120),
            Reply::text("Bonjour, mon ami.", 20, 6),
        ],
    );
    start(
        &e,
        &mut alice,
        &builder_chat("self-host", &["propose_agent"]),
    )
    .await;
    let r = say(
        &mut alice,
        "self-host",
        "I need an agent that translates into French",
    )
    .await;
    assert_eq!(r["outcome"], "answered", "{r}");

    // The refused proposal reached the orchestrator with every problem.
    let told = tool_messages(&e, "m-chat", 1).join("\n");
    for problem in [
        "ARTIFACT_INVALID",
        "names a file",
        "\"file_manager\" may not be granted (the builder may grant: web_search)",
        "id \"Bad-Id\" must match",
    ] {
        assert!(told.contains(problem), "{problem:?} missing from {told}");
    }
    // The valid one is kept: one agent_manifest artifact, the YAML unfenced.
    let listed = alice
        .list_artifacts(ListArtifactsRequest {
            job_id: "self-host".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .artifacts;
    assert_eq!(
        listed.len(),
        1,
        "{listed:?} {:?}",
        tool_messages(&e, "m-chat", 2)
    );
    let proposal = &listed[0];
    assert_eq!(proposal.kind, ArtifactKind::AgentManifest as i32);
    assert_eq!(proposal.name, "manifest.yaml");
    assert_eq!(proposal.media_type, "application/yaml");

    // Nothing is hosted before a person publishes it.
    let registry_api = RegistryClient::remote(e.stack.channel().await.unwrap(), 4 << 20);
    assert!(
        registry_api
            .get_agent(switchyard_proto::registry::v1::GetAgentRequest {
                agent_id: "agent_translator".into()
            })
            .await
            .is_err()
    );

    // Who may publish from the job: not another submitter, another tenant
    // or an agent key (they cannot read the artifact); not with tools the
    // publisher does not allow; then as the job's owner.
    let as_key = |token: String| {
        let s = &e.stack;
        async move {
            let ch = s.channel_with(&token).await.unwrap();
            (
                ExecutorClient::remote(ch.clone(), 4 << 20),
                RegistryClient::remote(ch.clone(), 4 << 20),
                ApprovalClient::remote(ch, 4 << 20),
            )
        }
    };
    let web = ["web_search".to_owned()];
    let dir = agents.path();
    let asking = |allow| publishing(&proposal.path, dir, allow);
    let others = crate::common::outsiders(&e.stack).await;
    for token in others.clone() {
        let (x, r, a) = as_key(token).await;
        let err = publish(&x, &r, &a, asking(&web))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("NOT_FOUND")
                || err.contains("PERMISSION_DENIED")
                || err.contains("not found"),
            "{err}"
        );
    }
    assert!(!agents.path().join("translator").exists());
    let alice_key = e.stack.token("alice").unwrap();
    let (x, r, a) = as_key(alice_key).await;
    let err = publish(&x, &r, &a, asking(&[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"web_search\" may not be granted (--allow-tool allows: no tools)"),
        "{err}"
    );
    // Publishing asks a person: the approval run is proposed (never
    // approved by a policy), and nothing is written while it waits.
    let now = Publish {
        wait: Duration::ZERO,
        ..asking(&web)
    };
    let waits = publish(&x, &r, &a, now).await.unwrap_err().to_string();
    let run_id = switchyard_cli::agents::publish_run_id("self-host", &proposal.artifact_id);
    assert!(
        waits.contains(&format!("approval run {run_id} is proposed")),
        "{waits}"
    );
    assert!(!agents.path().join("translator").exists());
    // Neither the publisher nor another submitter, another tenant or an
    // agent key may approve it; an approver of the tenant (bob) does.
    let approve = |token: String| {
        let (s, run_id) = (&e.stack, run_id.clone());
        async move {
            let ch = s.channel_with(&token).await.unwrap();
            ApprovalClient::remote(ch, 4 << 20)
                .approve(switchyard_proto::approval::v1::ApproveRequest {
                    run_id,
                    comment: "the translator only translates".into(),
                    edit: None,
                    scope: None,
                })
                .await
        }
    };
    for token in [e.stack.token("alice").unwrap()].into_iter().chain(others) {
        let refused = approve(token).await.unwrap_err();
        assert!(
            matches!(
                refused.code(),
                tonic::Code::PermissionDenied | tonic::Code::NotFound
            ),
            "{refused:?}"
        );
    }
    assert!(!agents.path().join("translator").exists());
    approve(e.stack.token("bob").unwrap()).await.unwrap();
    let done = publish(&x, &r, &a, asking(&web)).await.unwrap();
    assert_eq!(done.registry_id, "agent_translator");
    assert_eq!(done.capabilities, ["built.translator"]);
    assert_eq!(
        (done.run_id.as_str(), done.approved_by.as_str()),
        (run_id.as_str(), "bob")
    );
    let written = std::fs::read_to_string(agents.path().join("translator/manifest.yaml")).unwrap();
    assert!(written.starts_with("# Published with `switchyard agents publish` from job self-host"));
    assert!(
        written.contains(&format!("# approved by bob in approval run {run_id}.")),
        "{written}"
    );
    assert!(!written.contains("```"), "{written}");
    // Published twice: refused, the file as it was.
    let again = publish(&x, &r, &a, asking(&web))
        .await
        .unwrap_err()
        .to_string();
    assert!(again.contains("is published there already"), "{again}");

    // The same conversation: the orchestrator is offered the new agent
    // (capability built.*), calls it, and the agent answers with its own
    // instructions — no service was restarted.
    let r = say(&mut alice, "self-host", "Translate: hello, friend").await;
    assert_eq!(r["outcome"], "answered", "{r}");
    assert_eq!(r["text"], "Bonjour, mon ami.");
    let now = offered(&e, "m-chat", 3);
    assert!(now.contains(&"agent_translator".to_owned()), "{now:?}");
    let sub = request(&e, "gpt-4o-mini", 2);
    assert!(
        sub["messages"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Translate the text you are given into French."),
        "{sub}"
    );
    let h = history(&mut alice, "self-host").await;
    assert_eq!(h.turns.len(), 2);
    // Per participant — the orchestrator, the builder (two calls, one
    // refused proposal), the new agent — adding up to the job's spend.
    let by: Vec<(String, u32)> = h
        .agents
        .iter()
        .map(|a| (a.agent_id.clone(), a.turns))
        .collect();
    assert_eq!(
        by,
        [
            (String::new(), 2),
            ("agent_builder".to_owned(), 2),
            ("agent_translator".to_owned(), 1)
        ],
        "{h:?}"
    );
    let j = crate::common::job(&mut alice, "self-host").await;
    let tokens: u64 = h.agents.iter().map(|a| a.tokens).sum();
    let cost: i64 = h.agents.iter().map(|a| a.cost_micro_usd).sum();
    assert_eq!(tokens, j.tokens_used, "{h:?}");
    assert_eq!(cost, j.cost_so_far.unwrap().micro_usd, "{h:?}");
    assert!(
        h.agents
            .iter()
            .all(|a| a.tokens > 0 && a.cost_micro_usd > 0),
        "{h:?}"
    );

    // Removed from the directory: deregistered at the next reload, the
    // builder still hosted.
    std::fs::remove_dir_all(agents.path().join("translator")).unwrap();
    let gone = |id: &'static str| {
        let r = registry_api.clone();
        async move {
            r.get_agent(switchyard_proto::registry::v1::GetAgentRequest {
                agent_id: id.into(),
            })
            .await
            .is_err()
        }
    };
    let mut deregistered = false;
    for _ in 0..400 {
        if gone("agent_translator").await {
            deregistered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        deregistered,
        "agent_translator is still registered 10 s after its manifest went"
    );
    assert!(!gone("agent_builder").await);
    e.stack.stop().await.unwrap();
}

#[tokio::test]
async fn a_job_that_does_not_allow_propose_agent_keeps_no_proposal() {
    let (e, _agents) = stack_with_builder().await;
    let mut alice = JobServiceClient::new(e.stack.channel_as("alice").await.unwrap());
    e.script.for_model(
        "m-chat",
        vec![
            Reply::tools(
                &[("agent_builder", json!({"task": "a translator"}))],
                50,
                10,
            ),
            Reply::text("The builder could not propose it.", 70, 10),
        ],
    );
    e.script
        .for_model("gpt-4o-mini", vec![Reply::text(TRANSLATOR, 30, 120)]);
    start(&e, &mut alice, &builder_chat("no-proposals", &[])).await;
    let r = say(&mut alice, "no-proposals", "I need a translator").await;
    assert_eq!(r["outcome"], "answered", "{r}");
    let told = tool_messages(&e, "m-chat", 1).join("\n");
    assert!(told.contains("propose_agent"), "{told}");
    let listed = alice
        .list_artifacts(ListArtifactsRequest {
            job_id: "no-proposals".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .artifacts;
    assert!(listed.is_empty(), "{listed:?}");
    e.stack.stop().await.unwrap();
}
