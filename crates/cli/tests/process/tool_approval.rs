//! Per-call approval and artifacts from the CLI: a risky tool call of a job
//! run by a separate executor process waits for bob, who approves it with
//! `approval approve`; the submitter downloads the changeset bundle with `job
//! artifacts --out`. And seed 004's manual adapter round trip in `switchyard
//! dev`: propose, approve, bundle out, result in, artifacts out byte for
//! byte.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::llm_split::{scripted, split};
use crate::support::*;
use serde_json::{Value, json};
use switchyard_llm::scripted::Reply;

#[test]
fn a_gated_call_across_processes_waits_for_bob_and_the_submitter_downloads_the_bundle() {
    let (script, llm_url, _stop) = scripted();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("switchyard.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[executor]
commands = ["sh"]

[llm]
[[llm.providers]]
name = "openai"
base_url = "{llm_url}"
models = [
  {{ name = "gpt-4o", input_micro_usd_per_million = 2500000, output_micro_usd_per_million = 10000000 }},
  {{ name = "gpt-4o-mini", input_micro_usd_per_million = 150000, output_micro_usd_per_million = 600000 }},
]
"#
        ),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let (core, executor, _agents) = split(
        dir.path(),
        None,
        cfg,
        &repo_root().join("examples/agents"),
        &[],
    );
    let (c, x) = (core.url(), executor.url());
    let bundle = json!({"changes": [{"path": "docs/index.md", "diff": "+Switchyard"}]});
    script.for_model(
        "gpt-4o",
        vec![
            Reply::tools_saying(
                "I will publish the preview",
                &[("publish_preview", json!({"branch": "docs-fix"}))],
                60,
                12,
            ),
            Reply::text(&bundle.to_string(), 90, 30),
        ],
    );
    let job_file = dir.path().join("gated.json");
    std::fs::write(
        &job_file,
        json!({
            "job_id": "docs-fix",
            "approval": {"intent": "fix the docs", "outputs_allowed": ["propose_changeset_bundle"]},
            "tasks": [{"id": "fix", "llm": {
                "model": "gpt-4o", "prompt": "fix the docs", "max_tokens": 100, "output_format": "json",
                "artifact": {"kind": "changeset_bundle", "name": "bundle.json"},
                "tools": [{"name": "publish_preview", "requires_approval": true,
                           "command": "sh", "args": ["-c", "read -r args; echo \"{\\\"published\\\": $args}\""]}]
            }}]
        })
        .to_string(),
    )
    .unwrap();
    // Carol may both submit and approve: separation of duties is what
    // stops her approving her own job's call.
    let carol = create_key(&c, "carol", "submitter,approver");
    let submitted: Value = serde_json::from_str(&ok(&cli(
        &x,
        &[
            "job",
            "submit",
            job_file.to_str().unwrap(),
            "--token",
            &carol,
            "-o",
            "json",
        ],
    )))
    .unwrap();
    let run = submitted["job"]["run_id"].as_str().unwrap().to_owned();
    // The job itself costs money: bob approves it first.
    ok(&cli(&c, &["approval", "approve", &run, "--as", "bob"]));
    wait_for("the call's run", Duration::from_secs(20), || {
        !pending_calls(&c, None).is_empty()
    });
    let call = pending_calls(&c, None).remove(0);
    assert_eq!(call["tool_call"]["tool"], "publish_preview");
    assert_eq!(call["tool_call"]["arguments"], r#"{"branch":"docs-fix"}"#);
    assert_eq!(call["tool_call"]["reason"], "I will publish the preview");
    assert_eq!(call["created_by"], "carol");
    let call_run = call["run_id"].as_str().unwrap().to_owned();
    let table = ok(&cli(
        &c,
        &["approval", "list", "--status", "proposed", "--as", "bob"],
    ));
    assert!(
        table.contains(r#"call publish_preview({"branch":"docs-fix"}) in job docs-fix"#),
        "{table}"
    );
    let job = ok(&cli(
        &x,
        &["job", "get", "docs-fix", "--token", &carol, "-o", "json"],
    ));
    assert!(
        job.contains("TASK_STATE_AWAITING_APPROVAL") || job.contains("awaiting_approval"),
        "{job}"
    );
    // Carol's own job's call is not hers to approve.
    let own = cli(&c, &["approval", "approve", &call_run, "--token", &carol]);
    assert!(!own.status.success());
    assert!(
        String::from_utf8_lossy(&own.stderr).contains("SEPARATION_OF_DUTIES"),
        "{own:?}"
    );
    ok(&cli(
        &c,
        &[
            "approval",
            "approve",
            &call_run,
            "--as",
            "bob",
            "--comment",
            "preview only",
        ],
    ));
    let watched = ok(&cli(&x, &["job", "watch", "docs-fix", "--token", &carol]));
    assert!(watched.contains("job -> completed"), "{watched}");
    let log = ok(&cli(
        &x,
        &[
            "job", "watch", "docs-fix", "--events", "--token", &carol, "-o", "json",
        ],
    ));
    assert!(
        log.contains("task.awaiting_approval") && log.contains("task.approval_decided"),
        "{log}"
    );
    let result: Value = serde_json::from_str(&ok(&cli(
        &x,
        &["job", "result", "docs-fix", "--token", &carol, "-o", "json"],
    )))
    .unwrap();
    let calls = result["tasks"][0]["tool_results"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        calls[0]["result"],
        json!({"published": {"branch": "docs-fix"}}),
        "{result}"
    );
    // Carol downloads the bundle byte for byte.
    let out = dir.path().join("artifacts");
    let listed = ok(&cli(
        &x,
        &[
            "job",
            "artifacts",
            "docs-fix",
            "--out",
            out.to_str().unwrap(),
            "--token",
            &carol,
        ],
    ));
    assert!(
        listed.contains("fix/bundle.json") && listed.contains("changeset_bundle"),
        "{listed}"
    );
    let got: Value =
        serde_json::from_slice(&std::fs::read(out.join("fix/bundle.json")).unwrap()).unwrap();
    assert_eq!(got, bundle);
    wait_for("the job's run to complete", Duration::from_secs(10), || {
        let shown = ok(&cli(
            &c,
            &["approval", "show", &run, "--as", "bob", "-o", "json"],
        ));
        shown.contains("\"changeset_bundle_id\": \"sha256:")
    });
}

#[test]
fn the_manual_adapter_round_trip_from_the_cli_keeps_the_pasted_result_byte_identical() {
    let (dev, dir) = Proc::dev(&[("SWITCHYARD_APPROVAL__ADAPTERS__POLL_MS", "50")]);
    let url = dev.url();
    let proposed: Value = serde_json::from_str(&ok(&cli(
        &url,
        &[
            "approval",
            "propose",
            "-f",
            "examples/runs/draft_docs.json",
            "--as",
            "alice",
            "-o",
            "json",
        ],
    )))
    .unwrap();
    let run = proposed[0]["run"]["run_id"].as_str().unwrap().to_owned();
    ok(&cli(&url, &["approval", "approve", &run, "--as", "bob"]));
    // The dispatcher hands it to the manual adapter: running, awaiting the result.
    wait_for("the manual adapter", Duration::from_secs(10), || {
        let shown = ok(&cli(
            &url,
            &["approval", "show", &run, "--as", "bob", "-o", "json"],
        ));
        shown.contains("\"adapter_state\": \"awaiting_result\"")
    });
    let bundle = dir.path().join("bundle.json");
    ok(&cli(
        &url,
        &[
            "approval",
            "bundle",
            &run,
            "--out",
            bundle.to_str().unwrap(),
            "--as",
            "bob",
        ],
    ));
    let doc: Value = serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    let hash = doc["context_pack"]["hash"].as_str().unwrap().to_owned();
    let pasted = dir.path().join("changes.diff");
    std::fs::write(
        &pasted,
        "--- a/docs/contracts.md\n+++ b/docs/contracts.md\n+héllo\n",
    )
    .unwrap();
    let import = |extra: &[&str]| {
        let mut args = vec!["approval", "import", &run, "-f", pasted.to_str().unwrap()];
        args.extend(["--context-hash", &hash, "--as", "bob"]);
        args.extend(extra);
        cli(&url, &args)
    };
    // The artifact is named after the file given, unless --name says otherwise.
    let bad = import(&["--kind", "issue_comment"]);
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("ARTIFACT_KIND_NOT_ALLOWED") && said.contains(r#"artifact "changes.diff""#),
        "{bad:?}"
    );
    ok(&import(&["--kind", "changeset_bundle"]));
    let out = dir.path().join("out");
    let listed = ok(&cli(
        &url,
        &[
            "approval",
            "artifacts",
            &run,
            "--out",
            out.to_str().unwrap(),
            "--as",
            "alice",
        ],
    ));
    assert!(
        listed.contains("changes.diff") && listed.contains("prompt-bundle.json"),
        "{listed}"
    );
    assert_eq!(
        std::fs::read(out.join("changes.diff")).unwrap(),
        std::fs::read(&pasted).unwrap()
    );
    assert_eq!(
        std::fs::read(out.join("prompt-bundle.json")).unwrap(),
        std::fs::read(&bundle).unwrap()
    );
    drop(dev);
}
