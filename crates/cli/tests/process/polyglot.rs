//! Clients in other languages: a Python client generated from `proto/` with
//! grpcio-tools, and grpcurl through server reflection. `make test` installs
//! both into `.venv` and passes their paths in SWITCHYARD_PYTHON and
//! SWITCHYARD_GRPCURL.

use crate::support::*;
use std::process::Command;

#[test]
fn python_client_generated_from_proto_registers_routes_reserves_and_reads_error_info() {
    let python = tool("SWITCHYARD_PYTHON");
    let (dev, _data) = Proc::dev(&[]);
    let root = repo_root();
    // A key for the Python client: it registers agents, routes, creates
    // budgets and reserves on them.
    let secret = create_key(&dev.url(), "py-client", "admin,agent");
    let out = Command::new(python)
        .env("SWITCHYARD_TOKEN", &secret)
        .arg(root.join("tests/python/test_client.py"))
        .arg(&dev.addr)
        .arg(root.join("proto"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("9 passed, 0 failed"), "{stdout}");
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn grpcurl_lists_describes_and_invokes_through_reflection() {
    let grpcurl = tool("SWITCHYARD_GRPCURL");
    let (dev, _data) = Proc::dev(&[]);
    let header = format!("authorization: Bearer {}", token(&dev.url(), "admin"));
    // Reflection and health need no credential; everything else does.
    let anonymous = |args: &[&str]| {
        let mut a = vec!["-plaintext"];
        a.extend_from_slice(args);
        Command::new(&grpcurl).args(&a).output().unwrap()
    };
    let run = |args: &[&str]| {
        let mut a = vec!["-plaintext", "-H", header.as_str()];
        a.extend_from_slice(args);
        Command::new(&grpcurl).args(&a).output().unwrap()
    };
    let refused = anonymous(&[
        "-d",
        "{}",
        &dev.addr,
        "switchyard.registry.v1.RegistryService/ListAgents",
    ]);
    let text = String::from_utf8_lossy(&refused.stdout).to_string()
        + &String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && text.contains("Unauthenticated")
            && text.contains("AUTH_REQUIRED"),
        "{text}"
    );
    ok(&anonymous(&[&dev.addr, "grpc.health.v1.Health/Check"]));
    let list = ok(&anonymous(&[&dev.addr, "list"]));
    for svc in [
        "switchyard.registry.v1.RegistryService",
        "switchyard.router.v1.RouterService",
        "grpc.health.v1.Health",
    ] {
        assert!(list.contains(svc), "{svc} not in:\n{list}");
    }
    let desc = ok(&run(&[
        &dev.addr,
        "describe",
        "switchyard.router.v1.RouterService.Route",
    ]));
    assert!(desc.contains("rpc Route ( .switchyard.router.v1.RouteRequest ) returns ( .switchyard.router.v1.RouteResponse )"), "{desc}");

    let body = r#"{"agent":{"id":"curl_agent","endpoint":"http://127.0.0.1:9","capabilities":[{"name":"curl.test"}],"trustScore":70}}"#;
    let reg = ok(&run(&[
        "-d",
        body,
        &dev.addr,
        "switchyard.registry.v1.RegistryService/RegisterAgent",
    ]));
    assert!(reg.contains("\"created\": true"), "{reg}");

    let out = run(&[
        "-d",
        r#"{"capability":"nothing_here"}"#,
        &dev.addr,
        "switchyard.router.v1.RouterService/Route",
    ]);
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("NotFound") && text.contains("nothing_here"),
        "{text}"
    );
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn a_python_agent_built_from_the_generated_stubs_takes_part_in_a_job() {
    let python = tool("SWITCHYARD_PYTHON");
    let (dev, _data) = Proc::dev(&[]);
    let root = repo_root();
    let mut agent = Command::new(&python)
        .env("SWITCHYARD_TOKEN", token(&dev.url(), "agents"))
        .arg(root.join("examples/python/agent.py"))
        .arg(&dev.addr)
        .arg(root.join("proto"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        "the python agent to register",
        std::time::Duration::from_secs(30),
        || {
            routed(&dev.url(), &["--capability", "text.sentiment"])
                .is_some_and(|ids| ids == ["py_sentiment"])
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        "plan_id: py\ntasks:\n  - id: mood\n    agent: {capability: text.sentiment, input: {text: \"fast reliable great release, one slow test\"}}\n",
    )
    .unwrap();
    let submitted = submit_as(&dev.url(), job.to_str().unwrap(), "alice");
    let (id, run) = (
        submitted["job_id"].as_str().unwrap().to_owned(),
        submitted["run_id"].as_str().unwrap().to_owned(),
    );
    // The Python agent charges per call, so a person approves.
    ok(&cli(
        &dev.url(),
        &["approval", "approve", &run, "--as", "bob"],
    ));
    ok(&cli(&dev.url(), &["job", "watch", &id]));
    let r: serde_json::Value =
        serde_json::from_str(&ok(&cli(&dev.url(), &["job", "result", &id, "-o", "json"]))).unwrap();
    assert_eq!(r["state"], "completed", "{r}");
    assert_eq!(r["result"]["mood"]["label"], "positive", "{r}");
    assert_eq!(r["tasks"][0]["agent_id"], "py_sentiment");
    assert_eq!(
        r["cost_micro_usd"], 5,
        "the agent's price was committed to the ledger"
    );
    Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status()
        .unwrap();
    assert!(
        agent.wait().unwrap().success(),
        "the agent deregisters and exits cleanly"
    );
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn a_python_pull_worker_built_from_the_generated_stubs_works_a_queue_and_spends_only_its_budget() {
    let python = tool("SWITCHYARD_PYTHON");
    let (dev, _data) = Proc::dev(&[]);
    let root = repo_root();
    let dir = tempfile::tempdir().unwrap();
    let enqueue = |name: &str, doc: serde_json::Value| {
        let file = dir.path().join(name);
        std::fs::write(&file, doc.to_string()).unwrap();
        let out = ok(&cli(
            &dev.url(),
            &[
                "job",
                "submit",
                file.to_str().unwrap(),
                "--format",
                "ojs-queue",
                "--as",
                "alice",
                "-o",
                "json",
            ],
        ));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["job"].clone()
    };
    // A job with no budget may not spend: it is approved at once.
    let free = enqueue(
        "free.json",
        serde_json::json!({"type": "text.count", "args": ["one two three"], "options": {"queue": "text.count"}}),
    );
    assert_eq!(free["state"], "available", "{free}");
    // A job with a token budget may spend: a person approves it first.
    let paid = enqueue(
        "paid.json",
        serde_json::json!({"type": "text.count", "args": ["four five six seven"],
                           "options": {"queue": "text.count"}, "ext_agent_token_budget": 100}),
    );
    assert_eq!(paid["state"], "pending", "{paid}");
    ok(&cli(
        &dev.url(),
        &[
            "approval",
            "approve",
            paid["run_id"].as_str().unwrap(),
            "--as",
            "bob",
        ],
    ));
    let worker = Command::new(&python)
        .env("SWITCHYARD_TOKEN", token(&dev.url(), "agents"))
        .arg(root.join("examples/python/worker.py"))
        .arg(&dev.addr)
        .arg(root.join("proto"))
        .args(["--max", "2", "--id", "py-counter"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = worker.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("worker stopped after 2 tasks"), "{said}");
    let result = |job: &serde_json::Value| -> serde_json::Value {
        let id = job["job_id"].as_str().unwrap();
        serde_json::from_str(&ok(&cli(&dev.url(), &["job", "result", id, "-o", "json"]))).unwrap()
    };
    let r = result(&free);
    assert_eq!(r["state"], "completed", "{r}");
    assert_eq!(r["result"]["job"]["words"], 3, "{r}");
    assert_eq!(r["tokens_used"], 0, "{r}");
    // The four words were reserved and committed on the job's budget: the
    // job's count is the ledger's.
    let r = result(&paid);
    assert_eq!(r["state"], "completed", "{r}");
    assert_eq!(r["result"]["job"]["words"], 4, "{r}");
    assert_eq!(r["tokens_used"], 4, "{r}");
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn operators_retry_or_delete_dead_letters_and_drain_workers_from_the_cli() {
    let python = tool("SWITCHYARD_PYTHON");
    let (dev, _data) = Proc::dev(&[]);
    let dir = tempfile::tempdir().unwrap();
    let url = dev.url();
    // Two jobs whose budget (2 tokens) cannot pay for their 4 words: the
    // worker's reservation is refused, it nacks them undone, and they go to
    // the dead letter.
    let mut ids = Vec::new();
    for n in 0..2 {
        let file = dir.path().join(format!("tight-{n}.json"));
        let doc = serde_json::json!({"type": "text.count", "args": ["four five six seven"],
            "options": {"queue": "text.count", "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}},
            "ext_agent_token_budget": 2});
        std::fs::write(&file, doc.to_string()).unwrap();
        let args = [
            "job",
            "submit",
            file.to_str().unwrap(),
            "--format",
            "ojs-queue",
        ];
        let out = ok(&cli(
            &url,
            &[&args[..], &["--as", "alice", "-o", "json"]].concat(),
        ));
        let job: serde_json::Value = serde_json::from_str(&out).unwrap();
        let run = job["job"]["run_id"].as_str().unwrap().to_owned();
        ok(&cli(&url, &["approval", "approve", &run, "--as", "bob"]));
        ids.push(job["job"]["job_id"].as_str().unwrap().to_owned());
    }
    let worker = Command::new(&python)
        .env("SWITCHYARD_TOKEN", token(&url, "agents"))
        .arg(repo_root().join("examples/python/worker.py"))
        .arg(&dev.addr)
        .arg(repo_root().join("proto"))
        .args(["--max", "2"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&worker.stdout);
    assert_eq!(said.matches("nacked").count(), 2, "{said}");
    let listed = ok(&cli(&url, &["job", "list", "--dead-letter", "-o", "json"]));
    for id in &ids {
        assert!(listed.contains(id.as_str()), "{listed}");
    }

    // A submitter may not; an operator retries one (it spends, so it waits
    // for approval again) and deletes the other.
    let refused = cli(&url, &["job", "retry", &ids[0], "--as", "alice"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("dead_letter.manage"),
        "{refused:?}"
    );
    let retried = ok(&cli(
        &url,
        &["job", "retry", &ids[0], "--as", "admin", "-o", "json"],
    ));
    let retried: serde_json::Value = serde_json::from_str(&retried).unwrap();
    assert_eq!(retried["state"], "pending", "{retried}");
    ok(&cli(&url, &["job", "delete", &ids[1], "--as", "admin"]));
    let gone = cli(&url, &["job", "get", &ids[1]]);
    assert!(!gone.status.success(), "{gone:?}");
    let listed = ok(&cli(&url, &["job", "list", "--dead-letter", "-o", "json"]));
    assert!(!listed.contains(ids[1].as_str()), "{listed}");

    // Draining a worker is an operator's call too.
    let drained = ok(&cli(
        &url,
        &["worker", "state", "py-counter", "quiet", "--as", "admin"],
    ));
    assert_eq!(drained.trim(), "worker py-counter: quiet");
    let refused = cli(
        &url,
        &["worker", "state", "py-counter", "quiet", "--as", "alice"],
    );
    assert!(!refused.status.success(), "{refused:?}");
    assert_eq!(dev.terminate(), Some(0));
}
