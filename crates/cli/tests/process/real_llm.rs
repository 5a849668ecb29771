//! LLM tasks against a real OpenAI-compatible server that nobody here
//! wrote: llama-cpp-python's server with the Gemma 3 270M GGUF, started
//! per test on a free loopback port, and `switchyard dev` in front of it,
//! driven from the CLI. The model is a 270M base model: the tests assert
//! the protocol and the accounting, never the wording.
//!
//! Run by `make test-real-llm` (and so by `make test`), which installs the
//! server and the model and sets `SWITCHYARD_LLAMA_PYTHON` and
//! `SWITCHYARD_LLAMA_MODEL`; ignored by a plain `cargo test`.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_llm::agent::{estimate_prompt_tokens, first_turn};
use switchyard_llm::config::DEFAULT_TOOL_OVERHEAD_TOKENS;
use switchyard_llm::llama::{self, MODEL};
use switchyard_llm::{Message, ToolSpec};

use crate::support::*;

/// A llama-cpp-python server with `chat_format`, stopped on drop.
fn start(chat_format: &str) -> llama::Server {
    llama::Server::start(chat_format).unwrap()
}

/// One chat call made directly to `server`, as a reference for the
/// accounting.
fn direct(server: &llama::Server, body: Value) -> Value {
    let out = Command::new("curl")
        .args(["-sf", &format!("{}/chat/completions", server.url())])
        .args([
            "-H",
            "content-type: application/json",
            "-d",
            &body.to_string(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "direct call failed: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `switchyard dev` with `llm` (the `[llm]` provider lines) and any
/// `extra` configuration, data in a temporary directory.
struct Dev {
    _proc: Proc,
    url: String,
    dir: tempfile::TempDir,
}

fn dev(server: &llama::Server, provider: &str, extra: &str) -> Dev {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("switchyard.toml");
    let text = format!(
        r#"
[[llm.providers]]
name = "local"
base_url = "{url}"
structured_output = "json_object_schema"
{provider}
models = [
  {{ name = "{MODEL}", input_micro_usd_per_million = 0, output_micro_usd_per_million = 0 }},
  {{ name = "gpt-4o", input_micro_usd_per_million = 2500000, output_micro_usd_per_million = 10000000 }},
]
{extra}
"#,
        url = server.url()
    );
    std::fs::write(&config, text).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let proc = Proc::start(
        &[
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[
            ("SWITCHYARD_CONFIG", config.to_str().unwrap()),
            ("SWITCHYARD_EXECUTOR__APPROVAL_POLL_MS", "50"),
        ],
    );
    let url = proc.url();
    Dev {
        _proc: proc,
        url,
        dir,
    }
}

impl Dev {
    /// Submits the OJS job `doc` as alice, has bob approve it when it
    /// waits for a person, and follows it to its end; returns the job.
    fn run(&self, doc: Value) -> Value {
        let id = self.submit(doc);
        self.approve(&id);
        let _ = cli(&self.url, &["job", "watch", &id, "--as", "alice"]);
        self.job(&id)
    }

    /// Submits and approves `doc` as [`Dev::run`] does, and waits
    /// (bounded: 60 s) until its budget pauses it; returns the paused job.
    fn run_to_pause(&self, doc: Value) -> Value {
        let id = self.submit(doc);
        self.approve(&id);
        for _ in 0..600 {
            let j = self.job(&id);
            if j["state"] == "budget_paused" {
                return j;
            }
            let state = j["state"].as_str().unwrap_or_default();
            assert!(
                !matches!(state, "completed" | "cancelled" | "discarded"),
                "the job ended instead of pausing: {j}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("job {id} did not pause within 60 s");
    }

    /// Cancels a job as alice (a paused job ends, so its events end).
    fn cancel(&self, id: &str) {
        ok(&cli(&self.url, &["job", "cancel", id, "--as", "alice"]));
    }

    fn submit(&self, doc: Value) -> String {
        let file = self.dir.path().join(format!("{}.json", uuid_like()));
        std::fs::write(&file, doc.to_string()).unwrap();
        let out = ok(&cli(
            &self.url,
            &[
                "job",
                "submit",
                file.to_str().unwrap(),
                "--as",
                "alice",
                "-o",
                "json",
            ],
        ));
        let v: Value = serde_json::from_str(&out).unwrap();
        v["job"]["job_id"].as_str().unwrap().to_owned()
    }

    fn approve(&self, id: &str) {
        let j = self.job(id);
        if j["state"] == "pending" && !j["run_id"].as_str().unwrap_or_default().is_empty() {
            let run = j["run_id"].as_str().unwrap();
            let _ = cli(
                &self.url,
                &["approval", "approve", run, "--as", "bob", "-m", "test"],
            );
        }
    }

    fn job(&self, id: &str) -> Value {
        serde_json::from_str(&ok(&cli(
            &self.url,
            &["job", "get", id, "-o", "json", "--as", "alice"],
        )))
        .unwrap()
    }

    /// The job's events, in order: (kind, data).
    fn events(&self, id: &str) -> Vec<(String, Value)> {
        // Every end is fine here: `job watch` exits 0 for a completed job
        // and 3 for one that ended otherwise; the events are what count.
        let out = cli(
            &self.url,
            &["job", "watch", id, "-o", "json", "--as", "alice"],
        );
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = String::from_utf8_lossy(&out.stdout);
        out.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|e| {
                (
                    e["kind"].as_str().unwrap_or_default().to_owned(),
                    e["data"].clone(),
                )
            })
            .collect()
    }

    /// The job's budget, as `budget get -o json` shows it.
    fn budget(&self, id: &str) -> Value {
        let out = ok(&cli(
            &self.url,
            &["budget", "get", &format!("job-{id}"), "-o", "json"],
        ));
        let v: Value = serde_json::from_str(&out).unwrap();
        v.get("budget").cloned().unwrap_or(v)
    }
}

/// A file name unique within the test.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("job-{}", N.fetch_add(1, Ordering::Relaxed))
}

fn llm_job(prompt: &str, extra: Value) -> Value {
    let mut doc = json!({
        "type": "llm.test",
        "args": [prompt],
        "options": {"timeout_ms": 120000},
        "ext_agent_model": MODEL,
        "ext_agent_temperature": 0.0,
        "ext_agent_max_tokens": 24,
    });
    for (k, v) in extra.as_object().unwrap() {
        doc[k] = v.clone();
    }
    doc
}

fn calls(events: &[(String, Value)]) -> Vec<Value> {
    events
        .iter()
        .filter(|(k, _)| k == "llm.call")
        .map(|(_, d)| d.clone())
        .collect()
}

/// A job whose model is told to use the lookup tool, for up to 3 turns.
fn lookup_job() -> Value {
    llm_job(
        "Look up the word 'harbour', then answer.",
        json!({"ext_agent_instructions": "Use the lookup tool.", "ext_agent_tools": [lookup_tool()],
               "ext_agent_max_turns": 3}),
    )
}

fn lookup_tool() -> Value {
    json!({"name": "lookup", "description": "Look a word up", "command": "cat",
           "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 12}}, "required": ["q"]}})
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_plain_text_is_billed_exactly_what_the_server_reports() {
    let server = start("gemma");
    let d = dev(&server, "", "");
    let prompt = "Name three colours.";
    let job = d.run(llm_job(prompt, json!({})));
    assert_eq!(job["state"], "completed", "{job}");
    let t = &job["tasks"][0];
    assert_eq!(t["model_used"], MODEL);
    assert!(!t["output"]["content"].as_str().unwrap().is_empty(), "{t}");
    // The same request made directly (greedy decoding: the same tokens).
    let direct = direct(
        &server,
        json!({
            "model": MODEL, "temperature": 0.0, "max_tokens": 24,
            "messages": [{"role": "user", "content": prompt}],
        }),
    );
    let reported = direct["usage"]["total_tokens"].as_u64().unwrap();
    assert_eq!(
        job["tokens_used"].as_u64(),
        Some(reported),
        "{job}\n{direct}"
    );
    let b = d.budget(job["job_id"].as_str().unwrap());
    assert_eq!(b["tokens_spent"].as_u64(), Some(reported), "{b}");
    assert_eq!(server.requests(), 2, "one by the job, one direct");
    assert!(server.failures().is_empty(), "{:?}", server.failures());
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_a_multi_turn_tool_loop_completes_its_turns() {
    let server = start("chatml-function-calling");
    let d = dev(&server, "", "");
    let job = d.run(lookup_job());
    let id = job["job_id"].as_str().unwrap();
    let t = &job["tasks"][0];
    // The model here never stops calling tools: the loop runs all three
    // turns, each answered (no LLM_UNAVAILABLE after the first tool call).
    assert_ne!(t["reason"], "LLM_UNAVAILABLE", "{job}");
    let c = calls(&d.events(id));
    assert!(c.len() >= 2, "{c:?}");
    assert!(c.iter().all(|c| c["outcome"] == "ok"), "{c:?}");
    let results = t["tool_results"].as_array().unwrap();
    assert!(!results.is_empty());
    for r in results {
        assert_eq!(r["name"], "lookup");
        assert!(r["error"].as_str().unwrap_or_default().is_empty(), "{r}");
        // The server's own call ids came back and were answered.
        assert!(r["call_id"].as_str().unwrap().contains("cmpl-"), "{r}");
    }
    assert_eq!(server.requests(), c.len());
    assert!(server.failures().is_empty(), "{:?}", server.failures());
    if job["state"] != "completed" {
        assert_eq!(t["reason"], "AGENT_MAX_TURNS", "{job}");
        assert_eq!(c.len(), 3);
    }
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_an_agent_called_as_a_tool_with_the_servers_call_ids() {
    let server = start("chatml-function-calling");
    // The agent's own model call goes to a plain chat server (the tools
    // template leaves this base model nothing to say without tools).
    let plain = start("gemma");
    let agents = tempfile::tempdir().unwrap();
    std::fs::write(
        agents.path().join("manifest.yaml"),
        format!(
            "id: summarizer\nname: Summarizer\nversion: \"1.0.0\"\ndescription: Summarizes a text.\ncapabilities:\n  - text.summary\nagent:\n  integration_mode: tool\n  model: {MODEL}\n  provider: plain\n  instructions: \"Summarize in one line.\"\n  parameters:\n    temperature: 0.0\n    max_output_tokens: 16\n  uses_tools: []\n  limits:\n    max_turns: 1\nenabled: true\n"
        ),
    )
    .unwrap();
    let d = dev(
        &server,
        "",
        &format!(
            "[[llm.providers]]\nname = \"plain\"\nbase_url = \"{}\"\nmodels = [{{ name = \"{MODEL}\", input_micro_usd_per_million = 0, output_micro_usd_per_million = 0 }}]\n\n[agents]\ndir = {:?}\n",
            plain.url(),
            agents.path().to_str().unwrap()
        ),
    );
    wait_for(
        "the summarizer is routable",
        Duration::from_secs(20),
        || routed(&d.url, &["--capability", "text.summary"]).is_some_and(|ids| !ids.is_empty()),
    );
    let job = d.run(llm_job(
        "Summarize: the harbour opens at dawn and closes at dusk.",
        json!({"ext_agent_instructions": "Call the summarizer agent with the text.",
               "ext_agent_agents": ["text.summary"], "ext_agent_max_turns": 2}),
    ));
    let t = &job["tasks"][0];
    let results = t["tool_results"].as_array().unwrap();
    assert!(!results.is_empty(), "{job}");
    let first = &results[0];
    assert_eq!(first["name"], "agent_summarizer", "{job}");
    // A real id is long (call__0_agent_summarizer_cmpl-<uuid>): the hold
    // for the agent call is keyed by a bounded hash of it, and the agent ran.
    assert!(first["call_id"].as_str().unwrap().len() > 60, "{first}");
    assert!(
        first["error"].as_str().unwrap_or_default().is_empty(),
        "{first}"
    );
    assert!(
        first["result"].is_object() || first["result"].is_string(),
        "{first}"
    );
    assert_ne!(t["reason"], "SERVICE_UNAVAILABLE", "{job}");
    assert!(server.failures().is_empty(), "{:?}", server.failures());
    let id = job["job_id"].as_str().unwrap();
    let held: Vec<Value> = d
        .events(id)
        .into_iter()
        .filter(|(k, d)| k == "budget.reserved" && d["agent_id"] == "agent_summarizer")
        .map(|(_, d)| d)
        .collect();
    assert!(!held.is_empty(), "the agent call was held on the budget");
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_json_output_follows_the_schema_sent_and_a_cut_off_answer_is_named() {
    let server = start("gemma");
    let d = dev(&server, "", "");
    let schema = json!({"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "visits": {"type": "integer"}},
        "required": ["city", "visits"]});
    let job = d.run(llm_job(
        "Give a city and a number of visits as JSON.",
        json!({"ext_agent_output_format": "json", "ext_agent_output_schema": schema, "ext_agent_max_tokens": 64}),
    ));
    assert_eq!(job["state"], "completed", "{job}");
    let out = &job["tasks"][0]["output"];
    assert!(out["city"].is_string() && out["visits"].is_u64(), "{out}");
    // Too few tokens for the object to close: reported as cut off.
    let job = d.run(llm_job(
        "Give a city and a number of visits as JSON.",
        json!({"ext_agent_output_format": "json", "ext_agent_output_schema": schema, "ext_agent_max_tokens": 3}),
    ));
    let t = &job["tasks"][0];
    assert_eq!(t["reason"], "AGENT_OUTPUT_TRUNCATED", "{job}");
    assert!(
        t["error"].as_str().unwrap().contains("max_tokens (3)"),
        "{t}"
    );
    assert!(server.failures().is_empty(), "{:?}", server.failures());
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_a_budget_too_small_is_refused_before_any_request() {
    let server = start("gemma");
    let d = dev(&server, "", "");
    let job = d.run_to_pause(llm_job(
        "Name three colours.",
        json!({"ext_agent_token_budget": 10}),
    ));
    assert_eq!(
        job["tasks"][0]["reason"], "AGENT_TOKEN_BUDGET_EXCEEDED",
        "{job}"
    );
    assert_eq!(server.requests(), 0, "no request reached the model server");
    let b = d.budget(job["job_id"].as_str().unwrap());
    assert_eq!(b["tokens_spent"].as_u64().unwrap_or(0), 0, "{b}");
}

/// The tight-budget job: a system prompt and a tool (so the server's
/// function-calling template adds its hidden text), a token budget just
/// above the first call's reservation.
fn tight_job(budget: u64) -> Value {
    llm_job(
        "Look up the word 'harbour'.",
        json!({"ext_agent_instructions": "Use the lookup tool.", "ext_agent_tools": [lookup_tool()],
               "ext_agent_max_turns": 3, "ext_agent_max_tokens": 32, "ext_agent_token_budget": budget}),
    )
}

/// The prompt bound Switchyard computes for the tight job's first call,
/// before any provider overhead.
fn tight_bound() -> u64 {
    let tool: Value = lookup_tool();
    let spec = ToolSpec {
        name: "lookup".into(),
        description: tool["description"].as_str().unwrap().into(),
        parameters: tool["parameters"].clone(),
    };
    let messages: Vec<Message> = first_turn("Use the lookup tool.", "Look up the word 'harbour'.");
    estimate_prompt_tokens(&messages, &[spec])
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_a_tight_budget_under_tool_overhead_is_never_exceeded() {
    let server = start("chatml-function-calling");
    let d = dev(&server, "", "");
    let first = tight_bound() + DEFAULT_TOOL_OVERHEAD_TOKENS + 32;
    let job = d.run_to_pause(tight_job(first + 40));
    let id = job["job_id"].as_str().unwrap();
    d.cancel(id);
    let b = d.budget(id);
    let spent = b["tokens_spent"].as_u64().unwrap();
    assert!(spent <= first + 40, "spent {spent} of {}: {b}", first + 40);
    assert_ne!(b["overrun"], true, "{b}");
    let events = d.events(id);
    assert!(
        !events.iter().any(|(k, _)| k == "budget.overrun"),
        "{events:?}"
    );
    // The margin the server needs over the byte bound: its hidden
    // function-calling text, measured on the first call.
    let c = calls(&events);
    let prompt = c[0]["prompt_tokens"].as_u64().unwrap();
    let needed = prompt.saturating_sub(tight_bound());
    eprintln!(
        "chatml-function-calling: prompt {prompt} tokens, byte bound {} before overhead: margin needed {needed}, configured {DEFAULT_TOOL_OVERHEAD_TOKENS}",
        tight_bound()
    );
    assert!(
        needed > 0,
        "the template adds hidden text the bound alone misses"
    );
    assert!(needed <= DEFAULT_TOOL_OVERHEAD_TOKENS);
    assert_eq!(
        job["tasks"][0]["reason"], "AGENT_TOKEN_BUDGET_EXCEEDED",
        "{job}"
    );
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_without_the_tool_margin_the_overrun_stops_the_task() {
    let server = start("chatml-function-calling");
    let d = dev(&server, "tool_overhead_tokens = 0", "");
    let job = d.run(tight_job(10_000));
    let id = job["job_id"].as_str().unwrap();
    let t = &job["tasks"][0];
    assert_eq!(t["reason"], "USAGE_OVERRUN", "{job}");
    assert!(
        t["error"]
            .as_str()
            .unwrap()
            .contains("tool_overhead_tokens"),
        "{t}"
    );
    let events = d.events(id);
    let overrun: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| k == "budget.overrun")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(overrun.len(), 1, "{events:?}");
    assert!(overrun[0]["used_tokens"].as_u64() > overrun[0]["reserved_tokens"].as_u64());
    assert_eq!(server.requests(), 1, "no call after the overrun");
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_fallback_moves_past_a_model_the_server_does_not_serve() {
    let server = start("gemma");
    let d = dev(&server, "", "");
    // `switchyard llm check` names the model the server does not serve.
    let cfg = d.dir.path().join("switchyard.toml");
    let out = cli(&d.url, &["llm", "check", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(MODEL) && l.contains(" yes ")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("gpt-4o") && l.contains(" NO ")),
        "{stdout}"
    );
    let job = d.run(llm_job(
        "Name three colours.",
        json!({"ext_agent_model": "gpt-4o", "ext_agent_fallback_models": [MODEL]}),
    ));
    assert_eq!(job["state"], "completed", "{job}");
    let t = &job["tasks"][0];
    assert_eq!(t["model_used"], MODEL);
    let c = calls(&d.events(job["job_id"].as_str().unwrap()));
    assert_eq!(c[0]["model"], "gpt-4o");
    assert_eq!(c[0]["outcome"], "model_not_found", "{c:?}");
    assert_eq!(c[1]["model"], MODEL);
    assert_eq!(server.requests(), 1, "gpt-4o was never asked (nor billed)");
    assert_eq!(job["cost_so_far_micro_usd"], 0, "{job}");
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_a_streamed_answer_arrives_before_the_call_ends() {
    let server = start("gemma");
    // Pieces gathered for up to half a second: several tokens an event
    // even on a slow machine.
    let d = dev(&server, "stream = true", "[llm]\ndelta_interval_ms = 500\n");
    let job = d.run(llm_job(
        "Write a story about a lighthouse keeper.",
        json!({"ext_agent_max_tokens": 120, "ext_agent_temperature": 0.8}),
    ));
    assert_eq!(job["state"], "completed", "{job}");
    let id = job["job_id"].as_str().unwrap();
    let events = d.events(id);
    let call = events.iter().position(|(k, _)| k == "llm.call").unwrap();
    let deltas: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| k == "llm.delta")
        .map(|(_, d)| d)
        .collect();
    let before = events[..call]
        .iter()
        .filter(|(k, _)| k == "llm.delta")
        .count();
    assert!(
        before >= 2 && before == deltas.len(),
        "{before} of {} before the call ended",
        deltas.len()
    );
    let text: String = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(text, job["tasks"][0]["output"]["content"].as_str().unwrap());
    // Gathered, not one event a token.
    let tokens = events[call].1["completion_tokens"].as_u64().unwrap_or(120);
    assert!(
        (deltas.len() as u64) < tokens,
        "{} events for {tokens} tokens",
        deltas.len()
    );
    // This server sends no usage in streams: billed at the reservation.
    assert_eq!(
        events[call].1["usage_estimated"], true,
        "{:?}",
        events[call]
    );
    // `job watch` shows the text as it came.
    let watched = ok(&cli(&d.url, &["job", "watch", id, "--as", "alice"]));
    assert!(watched.contains("task agent turn 1: "), "{watched}");
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_two_overlapping_streamed_jobs_both_complete() {
    let server = start("gemma");
    let d = dev(&server, "stream = true", "");
    let story = |about: &str| {
        llm_job(
            &format!("Write a story about {about}."),
            json!({"ext_agent_max_tokens": 80, "ext_agent_temperature": 0.8}),
        )
    };
    let ids = [
        d.submit(story("a lighthouse")),
        d.submit(story("a harbour")),
    ];
    for id in &ids {
        d.approve(id);
    }
    for id in &ids {
        let _ = cli(&d.url, &["job", "watch", id, "--as", "alice"]);
        let job = d.job(id);
        assert_eq!(job["state"], "completed", "{job}");
        let content = job["tasks"][0]["output"]["content"]
            .as_str()
            .unwrap_or_default();
        assert!(!content.trim().is_empty(), "{job}");
        // Each answer whole, streamed: no call cut short.
        let c = calls(&d.events(id));
        assert!(c.iter().all(|c| c["outcome"] == "ok"), "{c:?}");
        assert!(
            c.iter()
                .any(|c| !c["finish_reason"].as_str().unwrap_or_default().is_empty()),
            "{c:?}"
        );
    }
    assert_eq!(server.requests(), 2);
    assert!(server.failures().is_empty(), "{:?}", server.failures());
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_a_tool_task_on_a_streaming_provider_completes_its_turns() {
    // This server's tool-calling template cannot stream a tool choice: it
    // answers the first streamed request with tools 200 and ends the
    // stream before any of the answer; that call is asked again whole, and
    // every later tool turn goes whole at once.
    let server = start("chatml-function-calling");
    let d = dev(&server, "stream = true", "");
    let job = d.run(lookup_job());
    let id = job["job_id"].as_str().unwrap();
    let t = &job["tasks"][0];
    assert_ne!(t["reason"], "LLM_UNAVAILABLE", "{job}");
    assert_ne!(t["reason"], "LLM_BAD_RESPONSE", "{job}");
    let c = calls(&d.events(id));
    assert!(c.len() >= 2, "{c:?}");
    assert!(c.iter().all(|c| c["outcome"] == "ok"), "{c:?}");
    assert!(!t["tool_results"].as_array().unwrap().is_empty(), "{job}");
    // One streamed request that came to nothing, then each turn answered
    // once, whole.
    assert_eq!(server.requests(), c.len() + 1, "{}", server.log_text());
    if job["state"] != "completed" {
        assert_eq!(t["reason"], "AGENT_MAX_TURNS", "{job}");
    }
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_a_text_answer_cut_at_max_tokens_says_so() {
    let server = start("gemma");
    let d = dev(&server, "stream = true", "");
    let job = d.run(llm_job(
        "Write a very long story about a dragon who lives by the sea.",
        json!({"ext_agent_max_tokens": 6, "ext_agent_temperature": 0.8}),
    ));
    assert_eq!(
        job["state"], "completed",
        "a cut answer is still an answer: {job}"
    );
    let id = job["job_id"].as_str().unwrap();
    assert_eq!(
        job["tasks"][0]["output"]["finish_reason"], "length",
        "{job}"
    );
    let c = calls(&d.events(id));
    assert_eq!(
        c.last().map(|c| c["finish_reason"].clone()),
        Some(json!("length")),
        "{c:?}"
    );
    let shown = ok(&cli(&d.url, &["job", "get", id, "--as", "alice"]));
    assert!(shown.contains("answer cut at max_tokens"), "{shown}");
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_cancelling_a_job_stops_the_stream() {
    let server = start("gemma");
    let d = dev(&server, "stream = true", "");
    let id = d.submit(llm_job(
        "Write a very long story about a dragon who lives by the sea.",
        json!({"ext_agent_max_tokens": 1500, "ext_agent_temperature": 0.9}),
    ));
    d.approve(&id);
    // Follow the events until the first piece of the answer arrives.
    let mut watch = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["job", "watch", &id, "--events", "--as", "alice"])
        .env("SWITCHYARD_URL", &d.url)
        .env(
            "SWITCHYARD_CREDENTIALS",
            d.dir.path().join("data/credentials.json"),
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut saw_delta = false;
    for line in lines.by_ref().map_while(Result::ok) {
        if line.contains("llm.delta") {
            saw_delta = true;
            break;
        }
        assert!(
            !line.contains("job.state") || !line.contains("\"completed\""),
            "{line}"
        );
    }
    assert!(saw_delta);
    ok(&cli(
        &d.url,
        &["job", "cancel", &id, "--as", "alice", "--reason", "enough"],
    ));
    let _ = watch.wait();
    assert_eq!(d.job(&id)["state"], "cancelled");
    // The connection closed: the server stopped generating.
    wait_for(
        "the server to see the client leave",
        Duration::from_secs(30),
        || server.log_text().contains("Disconnected from client"),
    );
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_a_gated_tool_call_waits_for_bob_with_nothing_reserved_then_runs_once() {
    let server = start("chatml-function-calling");
    let d = dev(&server, "", "");
    let mut tool = lookup_tool();
    tool["requires_approval"] = json!(true);
    let id = d.submit(llm_job(
        "Look up the word 'harbour', then answer.",
        json!({"ext_agent_instructions": "Use the lookup tool.", "ext_agent_tools": [tool],
               "ext_agent_max_turns": 2}),
    ));
    d.approve(&id);
    // The model asked for the tool: the call waits as a run of its own.
    let started = std::time::Instant::now();
    let mut pending = pending_calls(&d.url, Some(&id));
    while pending.is_empty() {
        let j = d.job(&id);
        assert!(
            started.elapsed() < Duration::from_secs(120)
                && j["state"] != "completed"
                && j["state"] != "discarded",
            "no gated call: {j}\n{:?}",
            d.events(&id)
        );
        std::thread::sleep(Duration::from_millis(200));
        pending = pending_calls(&d.url, Some(&id));
    }
    assert_eq!(pending[0]["tool_call"]["tool"], "lookup");
    assert_eq!(server.requests(), 1, "one model call, then the wait");
    let b = d.budget(&id);
    assert_eq!(b["tokens_reserved"].as_u64().unwrap_or(0), 0, "{b}");
    // This base model calls the tool again on its next turn: bob approves
    // each call as it comes, until the job ends.
    let mut approved = 0;
    loop {
        for r in &pending {
            let run = r["run_id"].as_str().unwrap();
            ok(&cli(
                &d.url,
                &["approval", "approve", run, "--as", "bob", "-m", "fine"],
            ));
            approved += 1;
        }
        let j = d.job(&id);
        if ["completed", "discarded"].contains(&j["state"].as_str().unwrap_or_default()) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "{j}");
        std::thread::sleep(Duration::from_millis(200));
        pending = pending_calls(&d.url, Some(&id));
    }
    let job = d.job(&id);
    let t = &job["tasks"][0];
    let results = t["tool_results"].as_array().unwrap();
    assert_eq!(
        results.len(),
        approved,
        "each approved call ran once: {job}"
    );
    for r in results {
        assert_eq!(r["name"], "lookup", "{job}");
        assert!(r["error"].as_str().unwrap_or_default().is_empty(), "{job}");
    }
    let events = d.events(&id);
    let decided: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| k == "task.approval_decided")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(decided.len(), approved, "{events:?}");
    assert!(
        decided.iter().all(|d| d["decision"] == "approved"),
        "{events:?}"
    );
    // Every model call was billed once, as the server reported it.
    let c = calls(&events);
    assert_eq!(server.requests(), c.len());
    let b = d.budget(&id);
    assert_eq!(b["tokens_spent"], job["tokens_used"], "{b}");
    assert!(server.failures().is_empty(), "{:?}", server.failures());
}

#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_a_conversation_answers_each_message_once_and_bills_every_turn() {
    let server = start("gemma");
    let d = dev(&server, "", "");
    let file = d.dir.path().join("chat.json");
    std::fs::write(
        &file,
        json!({"job_id": "talk", "tasks": [{"id": "chat", "conversation": {"orchestrator": {
            "model": MODEL, "temperature": 0.0, "max_tokens": 24,
            "instructions": "Answer in one short sentence."}}}]})
        .to_string(),
    )
    .unwrap();
    ok(&cli(
        &d.url,
        &["job", "submit", file.to_str().unwrap(), "--as", "alice"],
    ));
    d.approve("talk");
    // The terminal: two messages, each reply printed, then /close.
    let said = ok(&cli_stdin(
        &d.url,
        &["chat", "--job", "talk", "--as", "alice"],
        "Name a colour.\nName another one.\n/close\n",
    ));
    assert!(said.contains("closed conversation talk"), "{said}");
    let events = d.events("talk");
    let replies: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| k == "conversation.replied")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(replies.len(), 2, "{events:?}");
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(
            (r["seq"].as_u64(), r["outcome"].as_str()),
            (Some(i as u64 + 1), Some("answered")),
            "{r}"
        );
        assert_eq!(r["model"], MODEL);
        assert!(!r["text"].as_str().unwrap().is_empty(), "{r}");
    }
    // Every turn is billed what the server reported, and nothing else.
    let billed: u64 = replies
        .iter()
        .map(|r| r["total_tokens"].as_u64().unwrap())
        .sum();
    let reported: u64 = calls(&events)
        .iter()
        .map(|c| {
            c["prompt_tokens"].as_u64().unwrap_or_default()
                + c["completion_tokens"].as_u64().unwrap_or_default()
        })
        .sum();
    assert_eq!(billed, reported, "{events:?}");
    let job = d.job("talk");
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["tokens_used"].as_u64(), Some(billed), "{job}");
    let b = d.budget("talk");
    assert_eq!(b["tokens_spent"].as_u64(), Some(billed), "{b}");
    // The second turn carried the first exchange: its prompt is longer.
    assert!(
        replies[1]["prompt_tokens"].as_u64() > replies[0]["prompt_tokens"].as_u64(),
        "{replies:?}"
    );
    assert_eq!(server.requests(), 2, "one model call per message");
    assert!(server.failures().is_empty(), "{:?}", server.failures());
}

/// The builder against the real model server: the shipped builder agent
/// (its model call to llama.cpp) is asked for an agent by a job that allows
/// `propose_agent`. A 270M base model does not write a valid manifest (and
/// does not reliably call tools, so the orchestrator's side of the
/// self-hosting run is proven with the scripted model): what is asserted is
/// the protocol and the accounting — the builder is invoked and billed on
/// the job's budget, and its answer is kept only if it passes the check
/// `agents publish` makes, else refused with the problems and nothing kept.
#[test]
#[ignore = "needs a real model server: make test-real-llm"]
fn real_llm_the_builder_is_invoked_billed_and_its_proposal_checked() {
    let server = start("gemma");
    let agents = tempfile::tempdir().unwrap();
    let builder = repo_root().join("examples/agents/builder");
    let d = agents.path().join("builder");
    std::fs::create_dir_all(d.join("prompts")).unwrap();
    std::fs::copy(
        builder.join("prompts/builder.md"),
        d.join("prompts/builder.md"),
    )
    .unwrap();
    let manifest = std::fs::read_to_string(builder.join("manifest.yaml"))
        .unwrap()
        .replace("model: gpt-4o-mini", &format!("model: {MODEL}"))
        .replace("max_output_tokens: 1200", "max_output_tokens: 160");
    std::fs::write(d.join("manifest.yaml"), manifest).unwrap();
    let dev = dev(
        &server,
        "",
        &format!("[agents]\ndir = {:?}\n", agents.path().to_str().unwrap()),
    );
    wait_for("the builder is routable", Duration::from_secs(20), || {
        routed(&dev.url, &["--capability", "agent.build"]).is_some_and(|ids| !ids.is_empty())
    });
    let job = dev.run(json!({"job_id": "real-builder",
        "approval": {"outputs_allowed": ["propose_agent"]},
        "tasks": [{"id": "build", "timeout_secs": 120, "agent": {"capability": "agent.build",
            "input": {"task": "an agent that translates English into French"}}}]}));
    let events = dev.events("real-builder");
    // Invoked, and its own model call billed on the job's budget.
    let billed: Vec<&Value> = events
        .iter()
        .filter(|(k, d)| k == "budget.billed_by_agent" && d["agent_id"] == "agent_builder")
        .map(|(_, d)| d)
        .collect();
    assert!(
        billed.iter().any(|d| d["tokens"].as_u64().unwrap_or(0) > 0),
        "{events:?}"
    );
    let billed_tokens: u64 = billed.iter().filter_map(|d| d["tokens"].as_u64()).sum();
    assert_eq!(job["tokens_used"].as_u64(), Some(billed_tokens), "{job}");
    let artifacts: Value = serde_json::from_str(&ok(&cli(
        &dev.url,
        &[
            "job",
            "artifacts",
            "real-builder",
            "-o",
            "json",
            "--as",
            "alice",
        ],
    )))
    .unwrap();
    let kept = artifacts["items"].as_array().cloned().unwrap_or_default();
    let t = &job["tasks"][0];
    if job["state"] == "completed" {
        // Kept: one agent manifest, which publishing would accept.
        assert_eq!(kept.len(), 1, "{artifacts}");
        assert_eq!(kept[0]["kind"], "agent_manifest");
    } else {
        // Refused: why, and nothing kept.
        let error = t["error"].as_str().unwrap_or_default();
        assert!(error.contains("the proposed agent was refused"), "{job}");
        assert!(kept.is_empty(), "{artifacts}");
    }
    assert!(server.failures().is_empty(), "{:?}", server.failures());
}
