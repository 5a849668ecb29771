//! The CLI and operational surface a newcomer meets first: quiet exits on a
//! closed pipe, the ready line only once serving, documents from stdin,
//! every problem of a document at once with its position, errors as JSON,
//! one exit-code rule, and Prometheus metrics read by a real parser.

#![allow(clippy::unwrap_used)] // test helpers: a failed spawn or pipe is a failed test

use std::process::{Command, Output, Stdio};

use crate::support::*;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const FAILING: &str = "plan_id: failing
tasks:
  - id: a
    agent: {capability: builtin.fail_always, input: {}}
  - id: b
    depends_on: [a]
    agent: {capability: builtin.echo, input: {text: x}}
";

const FINE: &str = "plan_id: fine
tasks:
  - id: a
    agent: {capability: builtin.echo, input: {text: hi}}
";

#[test]
fn a_closed_stdout_ends_the_cli_with_141_and_no_panic() {
    let (dev, _data) = Proc::dev(&[]);
    ok(&cli_stdin(
        &dev.url(),
        &["job", "submit", "-", "--as", "alice"],
        FINE,
    ));
    for args in [&["version"][..], &["job", "list"], &["completions", "bash"]] {
        // The reading end is gone before the CLI writes a byte: every
        // write fails with EPIPE, deterministically.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(BIN)
            .args(args)
            .env("SWITCHYARD_URL", dev.url())
            .env(
                "SWITCHYARD_CREDENTIALS",
                credentials_for(&dev.url()).unwrap(),
            )
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(141), "{args:?}: {}", stderr(&out));
        assert!(out.stderr.is_empty(), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn dev_prints_its_ready_line_only_once_it_serves() {
    let (first, data) = Proc::dev(&[]);
    // A second node on the same data directory cannot open its stores: it
    // must fail without ever saying it is listening.
    let out = Command::new(BIN)
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.path().to_str().unwrap(),
        ])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("listening grpc="), "{stdout}");
    let err = stderr(&out);
    assert!(
        err.contains("is in use by another process") && err.contains("--data-dir"),
        "{err}"
    );
    // The same address as a running node: one cause, said once, with the fix.
    let out = Command::new(BIN)
        .args(["dev", "--listen", &first.addr, "--data-dir"])
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("is already in use")
            && err.contains("--listen")
            && err.matches("in use").count() == 1,
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening grpc="));
}

#[test]
fn a_newcomer_is_shown_the_console_and_told_the_right_port_and_how_to_sign_in() {
    use std::io::BufRead as _;
    let data = tempfile::tempdir().unwrap();
    let mut dev = Command::new(BIN)
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(dev.stdout.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    let banner = lines.next().unwrap().unwrap();
    let field = |name: &str| {
        ready
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .unwrap()
            .to_owned()
    };
    let (grpc, http, resp) = (field("grpc="), field("http="), field("resp="));
    // The banner names the console and the keys to sign in with.
    assert!(
        banner.starts_with(&format!("console http://{http}/ui/")),
        "{banner}"
    );
    assert!(banner.contains("credentials.json"), "{banner}");
    // The door's root is the console.
    let root = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
        ])
        .arg(format!("http://{http}/"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&root.stdout),
        format!("303 http://{http}/ui/")
    );
    // The sign-in page shows the keys' real prefix and where dev's are.
    let page = Command::new("curl")
        .args(["-s", &format!("http://{http}/ui/sign-in")])
        .output()
        .unwrap();
    // (As a browser shows it: the template escapes `/`.)
    let page = String::from_utf8_lossy(&page.stdout).replace("&#x2f;", "/");
    assert!(page.contains("<code>syk_…</code>"), "{page}");
    let keys = format!("{}", data.path().join("credentials.json").display());
    assert!(
        page.contains(&format!("jq -r .principals.bob.token {keys}")),
        "{page}"
    );
    let creds = data.path().join("credentials.json");
    let run = |url: &str, creds: &std::path::Path| {
        Command::new(BIN)
            .args(["job", "list"])
            .env("SWITCHYARD_URL", url)
            .env("SWITCHYARD_CREDENTIALS", creds)
            .output()
            .unwrap()
    };
    // The CLI pointed at the HTTP door is told where gRPC is.
    let out = run(&format!("http://{http}"), &creds);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("not its gRPC port") && err.contains(&format!("http://{grpc}")),
        "{err}"
    );
    // At the RESP door: not gRPC, and how to find the right port.
    let out = run(&format!("http://{resp}"), &creds);
    let err = stderr(&out);
    assert!(
        err.contains("did not answer in gRPC") && err.contains("listening grpc="),
        "{err}"
    );
    // Without a key: what to pass this CLI, not which header to send.
    let out = run(&format!("http://{grpc}"), &data.path().join("none.json"));
    let err = stderr(&out);
    assert!(
        err.contains("AUTH_REQUIRED") && err.contains("--token") && err.contains("--as"),
        "{err}"
    );
    assert!(!err.contains("authorization: Bearer"), "{err}");
    let _ = dev.kill();
    let _ = dev.wait();
}

#[test]
fn job_submit_dash_reads_the_document_from_stdin() {
    let (dev, _data) = Proc::dev(&[]);
    let out = cli_stdin(
        &dev.url(),
        &["job", "submit", "-", "--watch", "--as", "alice"],
        FINE,
    );
    let text = ok(&out);
    assert!(text.contains("1/1 tasks succeeded"), "{text}");
}

#[test]
fn validation_reports_every_problem_with_its_line_column_and_the_field_meant() {
    let (dev, _data) = Proc::dev(&[]);
    let doc = "plan_id: p
prioritty: 3
tasks:
  - id: a
    agnet: {capability: builtin.echo}
  - id: b
    depends_onn: [a]
    agent: {capability: builtin.echo}
    timeout_secs: soon
";
    let out = cli_stdin(&dev.url(), &["job", "validate", "-", "--as", "alice"], doc);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    for want in [
        "prioritty: unknown field \"prioritty\"; did you mean \"priority\"? (line 2, column 1)",
        "tasks[0].agnet: unknown field \"agnet\"; did you mean \"agent\"? (line 5, column 5)",
        "tasks[1].depends_onn: unknown field \"depends_onn\"; did you mean \"depends_on\"? (line 7, column 5)",
        "tasks[1].timeout_secs: expected a whole number from 0 to 4294967295, got the text \"soon\" (line 9, column 5)",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    // In a person's words: no Rust type names.
    assert!(!err.contains("u32") && !err.contains("struct "), "{err}");
    // The same as JSON, on stderr, under -o json.
    let out = cli_stdin(
        &dev.url(),
        &["job", "validate", "-", "--as", "alice", "-o", "json"],
        doc,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let v: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(v["error"]["reason"], "INVALID_ARGUMENT");
    // The HTTP door's envelope, field for field.
    assert_eq!(v["error"]["code"], 400);
    assert_eq!(v["error"]["status"], "INVALID_ARGUMENT");
    for key in ["message", "fields", "metadata", "request_id"] {
        assert!(v["error"].get(key).is_some(), "{key}: {v}");
    }
    let fields: Vec<&str> = v["error"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "prioritty",
            "tasks[0].agnet",
            "tasks[1].depends_onn",
            "tasks[1].timeout_secs",
            "tasks[0]"
        ]
    );
    // Positions travel beside the descriptions, which keep their exact texts.
    assert_eq!(v["error"]["fields"][0]["at"], "line 2, column 1");
    assert_eq!(
        v["error"]["fields"][0]["description"],
        "unknown field \"prioritty\"; did you mean \"priority\"?"
    );
    // An OJS job's unknown ext_agent_* field is kept and warned about by name.
    let ojs = r#"{"type": "summarize", "args": ["hi"], "ext_agent_model": "m", "ext_agent_max_token": 5}"#;
    let out = ok(&cli_stdin(
        &dev.url(),
        &["job", "validate", "-", "--as", "alice"],
        ojs,
    ));
    assert!(
        out.contains("\"ext_agent_max_token\" is not a field")
            && out.contains("did you mean \"ext_agent_max_tokens\"?"),
        "{out}"
    );
    // A huge value is never echoed whole.
    let huge = format!(
        r#"{{"job_id": "{}", "plan_id": "p", "tasks": [{{"id": "a", "agent": {{"capability": "builtin.echo"}}}}]}}"#,
        "a".repeat(10_000)
    );
    let out = cli_stdin(
        &dev.url(),
        &["job", "validate", "-", "--as", "alice"],
        &huge,
    );
    let err = stderr(&out);
    assert!(
        err.len() < 1_000 && err.contains("characters cut"),
        "{} bytes",
        err.len()
    );
}

#[test]
fn commands_that_follow_a_job_share_one_exit_code_rule() {
    let (dev, _data) = Proc::dev(&[]);
    let url = dev.url();
    // Completed: 0. Discarded: 3, from `submit --watch` and `watch` alike.
    let out = cli_stdin(
        &url,
        &["job", "submit", "-", "--watch", "--as", "alice"],
        FINE,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = cli_stdin(
        &url,
        &["job", "submit", "-", "--watch", "--as", "alice"],
        FAILING,
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("ended discarded"), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("0/2 tasks succeeded (0%)"), "{text}");
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("submitted job "))
        .unwrap()
        .to_owned();
    let out = cli(&url, &["job", "watch", &id, "--as", "alice"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // Under -o json the ending is JSON too.
    let out = cli(&url, &["job", "watch", &id, "--as", "alice", "-o", "json"]);
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(v["error"]["reason"], "JOB_DID_NOT_COMPLETE");
    assert_eq!(v["error"]["state"], "discarded");
    // Not found, and nothing listening: 1, with the reason and the fix.
    let out = cli(&url, &["budget", "entries", "--job", "nope", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(v["error"]["reason"], "JOB_NOT_FOUND");
    let out = cli("http://127.0.0.1:9", &["job", "list", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(v["error"]["reason"], "UNAVAILABLE");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("http://127.0.0.1:9 (from SWITCHYARD_URL)")
            && msg.contains("switchyard dev")
            && msg.matches("onnection refused").count() == 1,
        "{msg}"
    );
    // The rule is in --help.
    let help = ok(&cli(&url, &["job", "watch", "--help"]));
    assert!(
        help.contains("3 a followed job ended without completing"),
        "{help}"
    );
}

#[test]
fn a_job_waiting_for_approval_says_who_must_act_and_a_job_id_finds_its_run() {
    let (dev, _data) = Proc::dev(&[]);
    let url = dev.url();
    let submitted = submit_as(&url, "examples/jobs/needs_approval.yaml", "alice");
    let id = submitted["job_id"].as_str().unwrap().to_owned();
    // Following it prints, at once, the run and the command to run.
    let follow = || {
        let mut watch = Command::new(BIN)
            .args(["job", "watch", &id, "--as", "alice"])
            .env("SWITCHYARD_URL", &url)
            .env("SWITCHYARD_CREDENTIALS", credentials_for(&url).unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(watch.stdout.take().unwrap()));
        let first = lines.next().unwrap().unwrap();
        assert!(
            first.contains(&format!("run-{id}"))
                && first.contains("someone other than alice")
                && first.contains("switchyard approval approve"),
            "{first}"
        );
        // The rest of its output is read to the end, so it never meets a
        // closed pipe.
        let rest = std::thread::spawn(move || lines.count());
        (watch, rest)
    };
    // Ctrl-C: 130, and the job goes on, with how to follow or cancel it.
    let (interrupted, _) = follow();
    Command::new("kill")
        .args(["-INT", &interrupted.id().to_string()])
        .status()
        .unwrap();
    let out = interrupted.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = stderr(&out);
    assert!(
        err.contains("continues on the server")
            && err.contains(&format!("switchyard job cancel {id}")),
        "{err}"
    );
    let (mut watch, _) = follow();
    // bob approves by the job's id.
    let out = cli(&url, &["approval", "approve", &id, "--as", "bob"]);
    assert!(ok(&out).contains("approved"), "{}", stderr(&out));
    assert!(watch.wait().unwrap().success());
    let out = cli(&url, &["approval", "approve", "nope", "--as", "bob"]);
    assert!(stderr(&out).contains("run-<job id>"), "{}", stderr(&out));
}

#[test]
fn metrics_parse_as_prometheus_text_and_counters_move_after_a_job() {
    let python = std::env::var("SWITCHYARD_PYTHON")
        .expect("SWITCHYARD_PYTHON is not set: run the tests with `make test`");
    let (dev, data) = Proc::dev(&[]);
    let url = dev.url();
    let creds: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.path().join("credentials.json")).unwrap())
            .unwrap();
    let admin = creds["principals"]["admin"]["token"].as_str().unwrap();
    let alice = creds["principals"]["alice"]["token"].as_str().unwrap();
    // The HTTP status and the metric families a real Prometheus parser
    // reads from `/metrics` at `at`, scraped with `token`.
    let scrape_at = |at: &str, token: &str| -> (u16, serde_json::Value) {
        let out = Command::new(&python)
            .arg(repo_root().join("tests/python/scrape_metrics.py"))
            .arg(at)
            .arg(token)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["status"].as_u64().unwrap() as u16, v["families"].clone())
    };
    let grpc_port = format!("{url}/metrics");
    let scrape = |token: &str| scrape_at(&grpc_port, token);
    // Not open: no credential is 401, a submitter's is 403.
    assert_eq!(scrape("").0, 401);
    assert_eq!(scrape(alice).0, 403);
    let (status, before) = scrape(admin);
    assert_eq!(status, 200);
    ok(&cli_stdin(
        &url,
        &["job", "submit", "-", "--watch", "--as", "alice"],
        FINE,
    ));
    let (_, after) = scrape(admin);
    for (name, kind) in [
        ("switchyard_rpc_requests", "counter"),
        ("switchyard_rpc_duration_seconds", "histogram"),
        ("switchyard_jobs_finished", "counter"),
        ("switchyard_tasks_started", "counter"),
        ("switchyard_queue_depth", "gauge"),
        ("switchyard_approvals_pending", "gauge"),
        ("switchyard_agents", "gauge"),
        ("switchyard_store_flush_seconds", "histogram"),
    ] {
        assert_eq!(after[name]["type"], kind, "{name}: {after}");
    }
    let sum = |f: &serde_json::Value, name: &str, label: Option<(&str, &str)>| -> f64 {
        f[name]["samples"]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter(|s| label.is_none_or(|(k, v)| s["labels"][k] == v))
                    .map(|s| s["value"].as_f64().unwrap())
                    .sum()
            })
            .unwrap_or(0.0)
    };
    let moved = |name: &str, label: Option<(&str, &str)>| {
        sum(&after, name, label) > sum(&before, name, label)
    };
    for (name, label) in [
        ("switchyard_rpc_requests", ("method", "SubmitJob")),
        ("switchyard_tasks_started", ("kind", "agent")),
        ("switchyard_tasks_succeeded", ("kind", "agent")),
        ("switchyard_jobs_finished", ("state", "completed")),
        ("switchyard_routing_decisions", ("reason", "routed")),
    ] {
        assert!(moved(name, Some(label)), "{name} {label:?}: {after}");
    }
    // No job id ever becomes a label.
    let text = after.to_string();
    assert!(!text.contains("job_id"), "{text}");
    // How long jobs took, and how long runs waited for a decision.
    for (name, label) in [
        ("switchyard_job_duration_seconds", ("state", "completed")),
        ("switchyard_approval_wait_seconds", ("decision", "approved")),
    ] {
        assert_eq!(after[name]["type"], "histogram", "{name}: {after}");
        assert!(moved(name, Some(label)), "{name} {label:?}: {after}");
    }
    // The HTTP door serves the same scrape, behind the same permission.
    let http = format!(
        "http://{}/metrics",
        dev.http.as_deref().expect("dev hosts the HTTP door")
    );
    let over_http = |token: &str| scrape_at(&http, token);
    assert_eq!(over_http("").0, 401);
    assert_eq!(over_http(alice).0, 403);
    let (status, door) = over_http(admin);
    assert_eq!(status, 200);
    assert_eq!(
        door["switchyard_job_duration_seconds"]["type"], "histogram",
        "{door}"
    );
}

#[test]
fn job_list_narrows_by_time_submitter_and_label_and_shows_when_and_how_long() {
    let (dev, _data) = Proc::dev(&[]);
    let url = dev.url();
    let labelled = format!("labels: {{team: docs}}\n{FINE}");
    ok(&cli_stdin(
        &url,
        &["job", "run", "-", "--as", "alice"],
        &labelled,
    ));
    ok(&cli_stdin(
        &url,
        &["job", "run", "-", "--as", "alice"],
        FINE,
    ));
    let count = |args: &[&str]| {
        let mut all = vec!["job", "list", "-o", "json", "--as", "alice"];
        all.extend_from_slice(args);
        let v: serde_json::Value = serde_json::from_str(&ok(&cli(&url, &all))).unwrap();
        v["items"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(count(&[]), 2);
    assert_eq!(count(&["--label", "team=docs"]), 1);
    assert_eq!(count(&["--label", "team=web"]), 0);
    assert_eq!(count(&["--submitter", "alice"]), 2);
    assert_eq!(count(&["--submitter", "bob"]), 0);
    assert_eq!(count(&["--since", "1h"]), 2);
    assert_eq!(count(&["--until", "2020-01-01"]), 0);
    assert_eq!(count(&["--since", "2020-01-01", "--until", "now"]), 2);
    let table = ok(&cli(&url, &["job", "list", "--as", "alice"]));
    let header = table.lines().next().unwrap_or_default();
    for column in ["CREATED (UTC)", "DURATION", "SUBMITTER"] {
        assert!(header.contains(column), "{table}");
    }
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.contains(" ms ") || row.contains(" s "),
        "a finished job shows how long it ran: {table}"
    );
    // A time nobody could mean is refused, saying what is expected.
    let bad = cli(&url, &["job", "list", "--since", "soon", "--as", "alice"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("expected a time: an age like 30m, 7d or 2w"),
        "{}",
        stderr(&bad)
    );
    // The spend report reads the same time forms.
    let report = ok(&cli(
        &url,
        &[
            "budget", "report", "--since", "1h", "--by", "model", "-o", "json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(v["group_by"], "model", "{v}");
    assert_eq!(v["interval"], "minute", "{v}");
    let bad = cli(&url, &["budget", "report", "--until", "yesterday-ish"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

#[test]
fn agent_and_agents_say_which_is_which() {
    let out = Command::new(BIN).args(["agents", "list"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("the registry's agents are `switchyard agent list`"),
        "{}",
        stderr(&out)
    );
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let line = |name: &str| {
        help.lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line("agent").contains("registry"), "{help}");
    assert!(line("agents").contains("manifest"), "{help}");
}
