//! The gateway's doors on real processes, with real third-party clients:
//! `redis-cli` (Debian's redis-tools) and Python's `redis`, `requests`,
//! `httpx` and `openapi-spec-validator` (installed by `make test`), against
//! `switchyard dev` and against a gateway in a process of its own.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// `redis-cli -p PORT ARGS…` (with `--user/--pass` when `auth` is given).
fn redis_cli(resp: &str, auth: Option<(&str, &str)>, args: &[&str]) -> String {
    let (host, port) = resp.rsplit_once(':').unwrap();
    let mut cmd = Command::new(tool("SWITCHYARD_REDIS_CLI"));
    cmd.args(["-h", host, "-p", port]);
    if let Some((user, token)) = auth {
        cmd.args(["--user", user, "--pass", token, "--no-auth-warning"]);
    }
    let out = cmd.args(args).output().expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn python_clients_drive_both_doors_of_switchyard_dev() {
    let python = tool("SWITCHYARD_PYTHON");
    let (dev, _data) = Proc::dev(&[]);
    let url = dev.url();
    let alice = token(&url, "alice");
    let carol = create_key(&url, "carol", "submitter");
    let viewer = create_key(&url, "vera", "viewer");
    let out = Command::new(python)
        .arg(repo_root().join("tests/python/test_gateway.py"))
        .arg(format!("http://{}", dev.http.as_deref().unwrap()))
        .arg(dev.resp.as_deref().unwrap())
        .args([&alice, &carol, &viewer])
        .args([
            token(&url, "bob"),
            token(&url, "agents"),
            token(&url, "admin"),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python clients failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("15 passed, 0 failed"), "{stdout}");
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn redis_cli_submits_the_seed_example_with_the_seeds_answers() {
    let (dev, _data) = Proc::dev(&[]);
    let resp = dev.resp.clone().unwrap();
    let alice = token(&dev.url(), "alice");
    let example =
        std::fs::read_to_string(repo_root().join("examples/jobs/log_analysis.json")).unwrap();
    // The README's command, first without credentials.
    assert_eq!(redis_cli(&resp, None, &["PING"]), "PONG");
    assert_eq!(
        redis_cli(&resp, None, &["PLAN.SUBMIT", &example]),
        "NOAUTH Authentication required."
    );
    let ok = redis_cli(&resp, Some(("alice", &alice)), &["PLAN.SUBMIT", &example]);
    let id = ok
        .strip_prefix("OK job_id=")
        .unwrap_or_else(|| panic!("{ok:?}"));
    // The job is alice's, as the CLI over gRPC sees it.
    let job: serde_json::Value = serde_json::from_str(&ok_as(
        &dev.url(),
        &["job", "get", id, "-o", "json"],
        "alice",
    ))
    .unwrap();
    assert_eq!(job["submitted_by"], "alice", "{job}");
    assert_eq!(job["source_format"], "agenix", "{job}");
    // The seed's error example, word for word.
    let gap = r#"{"plan_id":"p","tasks":[{"task_number":1,"command":"sort"},{"task_number":2,"command":"uniq"},{"task_number":4,"command":"wc"}]}"#;
    assert_eq!(
        redis_cli(&resp, Some(("alice", &alice)), &["JOB.SUBMIT", gap]),
        "ERR Invalid task numbering: gap between task 2 and 4"
    );
    // RESP3 (`-3`: HELLO 3), and a status in it.
    let status = redis_cli(&resp, Some(("alice", &alice)), &["-3", "JOB.STATUS", id]);
    assert!(status.contains("job_id") && status.contains(id), "{status}");
    assert!(
        redis_cli(&resp, Some(("alice", &alice)), &["FLUSHALL"])
            .starts_with("ERR unknown command 'FLUSHALL'")
    );
    assert_eq!(dev.terminate(), Some(0));
}

/// An MCP session at `url` with bearer `token` (initialize, then the
/// initialized notification, with curl); returns a function posting one
/// more JSON-RPC message in it and answering the response body.
fn mcp_session(url: &str, token: &str) -> impl Fn(&str) -> String + use<> {
    let post = {
        let (url, token) = (url.to_owned(), token.to_owned());
        move |session: Option<&str>, body: &str| {
            let mut c = Command::new("curl");
            c.args(["-s", "-D", "-", "-X", "POST", &url])
                .args(["-H", "content-type: application/json"])
                .args(["-H", "accept: application/json, text/event-stream"])
                .arg("-H")
                .arg(format!("authorization: Bearer {token}"));
            if let Some(s) = session {
                c.arg("-H").arg(format!("mcp-session-id: {s}"));
            }
            String::from_utf8_lossy(&c.arg("--data-binary").arg(body).output().unwrap().stdout)
                .into_owned()
        }
    };
    let init = post(
        None,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#,
    );
    assert!(init.contains(r#""name":"switchyard""#), "{init}");
    let session = init
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("mcp-session-id")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session id: {init}"));
    post(
        Some(&session),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    move |body: &str| post(Some(&session), body)
}

/// `switchyard serve --services gateway` storing nothing in `data`,
/// following the key set of the process at `url` and reaching the services
/// named in `remotes` (`EXECUTOR`, `LEDGER`, …) there.
pub(crate) fn gateway_for(url: &str, data: &std::path::Path, remotes: &[&str]) -> Proc {
    let (keys_var, keys_url) = follow_keys(url);
    let vars: Vec<String> = remotes
        .iter()
        .map(|r| format!("SWITCHYARD_GATEWAY__{r}_URL"))
        .collect();
    let mut env = vec![
        (keys_var, keys_url.as_str()),
        ("SWITCHYARD_AUTH__DEV_CREDENTIALS", "false"),
    ];
    env.extend(vars.iter().map(|v| (v.as_str(), url)));
    Proc::start(&gateway_args(data), &env)
}

/// `switchyard serve` of the gateway alone, its data in `data`.
fn gateway_args(data: &std::path::Path) -> [&str; 7] {
    [
        "serve",
        "--services",
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ]
}

/// `switchyard job … --as WHO` against `url`, which must succeed.
fn ok_as(url: &str, args: &[&str], who: &str) -> String {
    let mut all = args.to_vec();
    all.extend(["--as", who]);
    ok(&cli(url, &all))
}

#[test]
fn a_gateway_in_its_own_process_serves_both_doors_for_a_remote_executor() {
    let (dev, _data) = Proc::dev(&[]);
    let url = dev.url();
    let data = tempfile::tempdir().unwrap();
    // No stores: the gateway follows dev's key set and calls its executor.
    let gw = gateway_for(&url, data.path(), &["EXECUTOR", "REGISTRY", "APPROVAL"]);
    assert!(
        std::fs::read_dir(data.path()).unwrap().next().is_none(),
        "the gateway stores nothing"
    );
    let alice = token(&url, "alice");
    let carol = create_key(&url, "carol", "submitter");
    let example =
        std::fs::read_to_string(repo_root().join("examples/jobs/log_analysis.json")).unwrap();
    let resp = gw.resp.clone().unwrap();
    let ok = redis_cli(&resp, Some(("alice", &alice)), &["PLAN.SUBMIT", &example]);
    let id = ok
        .strip_prefix("OK job_id=")
        .unwrap_or_else(|| panic!("{ok:?}"))
        .to_owned();
    let job: serde_json::Value =
        serde_json::from_str(&ok_as(&url, &["job", "get", &id, "-o", "json"], "alice")).unwrap();
    assert_eq!(
        job["submitted_by"], "alice",
        "the executor saw alice, not the gateway: {job}"
    );
    // Over HTTP: alice reads it; carol, another submitter, does not see it.
    let http = format!("http://{}", gw.http.as_deref().unwrap());
    let get = |token: &str| {
        Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("authorization: Bearer {token}"))
            .arg(format!("{http}/aitp/tasks/{id}"))
            .output()
            .unwrap()
    };
    assert_eq!(String::from_utf8_lossy(&get(&alice).stdout), "200");
    assert_eq!(String::from_utf8_lossy(&get(&carol).stdout), "404");
    assert_eq!(String::from_utf8_lossy(&get("syk_nope").stdout), "401");
    // Its MCP endpoint reaches the remote services with alice's own token.
    let mcp = mcp_session(&format!("{http}/mcp"), &alice);
    let called = mcp(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_job","arguments":{"job_id":"ID"}}}"#.replace("ID", &id).as_str());
    assert!(called.contains(r#"\"submitted_by\":\"alice\""#), "{called}");
    // A trigger's webhook on the gateway starts the remote executor's job
    // once per event id.
    let job_file = data.path().join("hook-job.json");
    std::fs::write(
        &job_file,
        r#"{"tasks": [{"id": "a", "agent": {"capability": "builtin.echo", "input": {"text": "hook"}}}]}"#,
    )
    .unwrap();
    ok_as(
        &url,
        &[
            "trigger",
            "create",
            job_file.to_str().unwrap(),
            "--id",
            "gw-hook",
        ],
        "alice",
    );
    let deliver = || {
        let out = Command::new("curl")
            .args(["-s", "-w", " %{http_code}", "-X", "POST", "-H"])
            .arg(format!("authorization: Bearer {alice}"))
            .args([
                "-H",
                "idempotency-key: ev-1",
                "-H",
                "content-type: application/json",
            ])
            .args(["-d", r#"{"action": "opened"}"#])
            .arg(format!("{http}/v1/triggers/gw-hook/events"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = deliver();
    assert!(
        first.ends_with(" 201") && first.contains(r#""created":true"#),
        "{first}"
    );
    let again = deliver();
    assert!(
        again.ends_with(" 200") && again.contains(r#""created":false"#),
        "{again}"
    );
    assert_eq!(gw.terminate(), Some(0));
    assert_eq!(dev.terminate(), Some(0));
}

/// A browser-like session against the console at `http` with curl: a
/// cookie jar, signing in through the form (pre-session cookie, token),
/// then pages and form posts carrying the session's anti-forgery token.
struct ConsoleSession {
    http: String,
    jar: std::path::PathBuf,
}

impl ConsoleSession {
    fn sign_in(http: &str, dir: &std::path::Path, who: &str, secret: &str) -> ConsoleSession {
        let s = ConsoleSession {
            http: http.to_owned(),
            jar: dir.join(format!("{who}.jar")),
        };
        let form = s.curl(&["/ui/sign-in"]);
        let nonce = field(&form, "csrf");
        let signed = s.curl(&[
            "/ui/sign-in",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
            "--data-urlencode",
            &format!("csrf={nonce}"),
            "--data-urlencode",
            &format!("credential={secret}"),
        ]);
        assert!(
            signed.starts_with("303 "),
            "{who} did not sign in: {signed}"
        );
        s
    }

    /// The session cookie's value, from the jar.
    fn session(&self) -> String {
        std::fs::read_to_string(&self.jar)
            .unwrap()
            .lines()
            .find_map(|l| {
                let fields: Vec<&str> = l.split('\t').collect();
                (fields.len() == 7 && fields[5] == "sy_session").then(|| fields[6].to_owned())
            })
            .expect("a session cookie in the jar")
    }

    /// curl PATH ARGS… with the jar; stdout.
    fn curl(&self, args: &[&str]) -> String {
        let (path, rest) = args.split_first().unwrap();
        let out = Command::new("curl")
            .args(["-s", "-b"])
            .arg(&self.jar)
            .arg("-c")
            .arg(&self.jar)
            .arg(format!("{}{path}", self.http))
            .args(rest)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// POSTs `fields` (and the page's token) to PATH: the status code.
    fn post(&self, path: &str, fields: &[&str]) -> String {
        let page = self.curl(&["/ui/jobs"]);
        let mut args = vec![
            path.to_owned(),
            "-o".into(),
            "/dev/null".into(),
            "-w".into(),
            "%{http_code}".into(),
            "--data-urlencode".into(),
            format!("csrf={}", field(&page, "csrf")),
        ];
        for f in fields {
            args.extend(["--data-urlencode".to_owned(), (*f).to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.curl(&args)
    }
}

/// The value of the first `<input name=NAME value=…>` of `page`.
fn field(page: &str, name: &str) -> String {
    let at = page
        .find(&format!("name=\"{name}\" value=\""))
        .unwrap_or_else(|| panic!("no {name} field in {page}"));
    let rest = &page[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_owned()
}

#[test]
fn the_console_of_a_gateway_in_its_own_process_acts_on_every_remote_service_as_the_person() {
    let (dev, _data) = Proc::dev(&[]);
    let url = dev.url();
    let data = tempfile::tempdir().unwrap();
    let gw = gateway_for(
        &url,
        data.path(),
        &["EXECUTOR", "REGISTRY", "APPROVAL", "LEDGER", "ROUTER"],
    );
    let http = format!("http://{}", gw.http.as_deref().unwrap());
    let jars = tempfile::tempdir().unwrap();
    let bob = ConsoleSession::sign_in(&http, jars.path(), "bob", &token(&url, "bob"));
    let alice = ConsoleSession::sign_in(&http, jars.path(), "alice", &token(&url, "alice"));
    let job = submit_as(&url, "examples/jobs/needs_approval.yaml", "alice");
    let (id, run) = (
        job["job_id"].as_str().unwrap().to_owned(),
        job["run_id"].as_str().unwrap().to_owned(),
    );
    // Bob's inbox, built from the remote approval service, executor,
    // ledger and router, each called with bob's own key.
    let inbox = bob.curl(&["/ui/"]);
    assert!(inbox.contains(&format!("id=\"run-{run}\"")), "{inbox}");
    // `switchyard dev` serves the same console on its own HTTP door.
    let on_dev = format!("http://{}", dev.http.as_deref().unwrap());
    let dev_bob = ConsoleSession::sign_in(&on_dev, jars.path(), "dev-bob", &token(&url, "bob"));
    let dev_inbox = dev_bob.curl(&["/ui/"]);
    assert!(
        dev_inbox.contains(&format!("id=\"run-{run}\"")),
        "{dev_inbox}"
    );
    assert!(
        dev_inbox.contains("<code>builtin</code> (score"),
        "{dev_inbox}"
    );
    assert!(inbox.contains("echo a message after review"), "{inbox}");
    assert!(inbox.contains(&format!("job-{id}")), "the budget: {inbox}");
    assert!(
        inbox.contains("<code>builtin</code> (score"),
        "the route: {inbox}"
    );
    assert!(bob.curl(&["/ui/agents"]).contains("builtin.echo"));
    // Alice may not decide; bob may, and the job runs.
    assert_eq!(alice.post(&format!("/ui/runs/{run}/approve"), &[]), "403");
    assert_eq!(
        bob.post(
            &format!("/ui/runs/{run}/approve"),
            &["comment=from the console"]
        ),
        "303"
    );
    let result = ok_as(&url, &["job", "result", &id, "--wait", "30"], "alice");
    assert!(result.contains("approved and done"), "{result}");
    let budgets = bob.curl(&[
        "/ui/budgets",
        "-G",
        "--data-urlencode",
        &format!("budget=job-{id}"),
    ]);
    assert!(
        budgets.contains("Cost-ledger entries of this budget and every budget under it"),
        "{budgets}"
    );
    let page = alice.curl(&[&format!("/ui/jobs/{id}")]);
    assert!(page.contains("data-state=\"succeeded\""), "{page}");
    // The jobs list filters by submitter (ListJobsRequest.submitted_by)
    // and by state; a state that does not exist is a clear refusal.
    let mine = bob.curl(&["/ui/jobs?submitted_by=alice&state=completed"]);
    assert!(mine.contains(&format!("/ui/jobs/{id}")), "{mine}");
    let none = bob.curl(&["/ui/jobs?submitted_by=nobody"]);
    assert!(none.contains("No jobs match."), "{none}");
    let bad = bob.curl(&["/ui/jobs?state=finished", "-w", "%{http_code}"]);
    assert!(
        bad.ends_with("400") && bad.contains("must be one of scheduled, available"),
        "{bad}"
    );
    // Alice cancels a waiting job of hers from its page.
    let waiting = submit_as(&url, "examples/jobs/needs_approval.yaml", "alice");
    let other = waiting["job_id"].as_str().unwrap();
    assert_eq!(
        alice.post(
            &format!("/ui/jobs/{other}/cancel"),
            &["reason=not needed any more"]
        ),
        "303"
    );
    let page = alice.curl(&[&format!("/ui/jobs/{other}")]);
    assert!(page.contains("data-state=\"cancelled\""), "{page}");
    // The cookie holds a session the auth service (in the other process)
    // started, not alice's key; signing out on this gateway ends it there,
    // so no process accepts it any more.
    let session = alice.session();
    assert!(session.starts_with("syk_") && session != token(&url, "alice"));
    let rest = |http: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("authorization: Bearer {session}"))
            .arg(format!("http://{http}/aitp/tasks/no-such-task"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(rest(dev.http.as_deref().unwrap()), "404", "a live session");
    assert_eq!(alice.post("/ui/sign-out", &[]), "303");
    assert_eq!(rest(dev.http.as_deref().unwrap()), "401");
    assert_eq!(rest(gw.http.as_deref().unwrap()), "401");
    let after = alice.curl(&["/ui/jobs", "-o", "/dev/null", "-w", "%{http_code}"]);
    assert_eq!(after, "303", "signed out: back to sign-in");
    assert_eq!(gw.terminate(), Some(0));

    // Without the ledger's URL the budget page says which setting is missing.
    let gw = gateway_for(&url, data.path(), &["EXECUTOR"]);
    let http = format!("http://{}", gw.http.as_deref().unwrap());
    let bob = ConsoleSession::sign_in(&http, jars.path(), "bob2", &token(&url, "bob"));
    let page = bob.curl(&["/ui/budgets", "-w", "%{http_code}"]);
    assert!(page.ends_with("503"), "{page}");
    assert!(page.contains("gateway.ledger_url"), "{page}");
    assert_eq!(gw.terminate(), Some(0));
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn a_gateway_in_its_own_process_lists_and_answers_input_for_a_remote_executor() {
    let (dev, data) = Proc::dev(&[]);
    let url = dev.url();
    let gw_data = tempfile::tempdir().unwrap();
    let gw = gateway_for(&url, gw_data.path(), &["EXECUTOR", "REGISTRY", "APPROVAL"]);
    let job = data.path().join("ask.yaml");
    std::fs::write(
        &job,
        "job_id: split-ask\ntasks:\n  - id: ask\n    input: {prompt: \"Proceed?\", schema: {type: boolean}}\n",
    )
    .unwrap();
    ok_as(&url, &["job", "submit", job.to_str().unwrap()], "alice");
    let (alice, bob) = (token(&url, "alice"), token(&url, "bob"));
    let input = format!(
        "http://{}/aitp/tasks/split-ask/input",
        gw.http.as_deref().unwrap()
    );
    let curl = |token: &str, body: Option<&str>| {
        let mut c = Command::new("curl");
        c.args(["-s", "-w", "\n%{http_code}", &input])
            .arg("-H")
            .arg(format!("authorization: Bearer {token}"));
        if let Some(b) = body {
            c.args(["-H", "content-type: application/json", "--data", b]);
        }
        let out = String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned();
        let (body, code) = out.rsplit_once('\n').unwrap();
        (code.to_owned(), body.to_owned())
    };
    // The step asks moments after submission: the remote executor lists it
    // for alice through the gateway, as alice.
    wait_for("the step asks", Duration::from_secs(20), || {
        curl(&alice, None).1.contains("Proceed?")
    });
    let (code, body) = curl(&bob, Some(r#"{"answer": true}"#));
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("INPUT_NOT_ALLOWED"), "{body}");
    let (code, body) = curl(
        &alice,
        Some(r#"{"answer": true, "idempotency_key": "s-1"}"#),
    );
    assert_eq!(code, "200", "{body}");
    assert!(body.contains(r#""answered_by":"alice""#), "{body}");
    let got = ok_as(
        &url,
        &["job", "result", "split-ask", "--wait", "20", "-o", "json"],
        "alice",
    );
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got["state"], "completed", "{got}");
    assert!(
        got.to_string().contains(r#""answered_by":"alice""#),
        "{got}"
    );
    assert_eq!(gw.terminate(), Some(0));
    assert_eq!(dev.terminate(), Some(0));
}

/// A gateway in its own process signs the A2A door's Agent Card with the
/// key `gateway.a2a.signing_key_file` names (made with the documented
/// `openssl genpkey -algorithm ed25519`), naming its configured public URL;
/// the reference SDK's verifier accepts it. A half configuration (a URL and
/// no key) is refused at start.
#[test]
fn a_split_gateway_signs_its_agent_card_with_the_configured_key() {
    let (dev, _data) = Proc::dev(&[]);
    let url = dev.url();
    let data = tempfile::tempdir().unwrap();
    let key = data.path().join("card-key.pem");
    ok(&Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&key)
        .output()
        .unwrap());
    let (keys_var, keys_url) = follow_keys(&url);
    let store = data.path().join("gw");
    let args = gateway_args(&store);
    let mut env = vec![
        (keys_var, keys_url.as_str()),
        ("SWITCHYARD_AUTH__DEV_CREDENTIALS", "false"),
        ("SWITCHYARD_GATEWAY__EXECUTOR_URL", url.as_str()),
        (
            "SWITCHYARD_GATEWAY__A2A__PUBLIC_URL",
            "https://switchyard.example.com",
        ),
    ];
    let half = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .envs(env.clone())
        .output()
        .unwrap();
    assert!(!half.status.success());
    assert!(
        String::from_utf8_lossy(&half.stderr).contains("set both public_url and signing_key_file"),
        "{}",
        String::from_utf8_lossy(&half.stderr)
    );
    env.push((
        "SWITCHYARD_GATEWAY__A2A__SIGNING_KEY_FILE",
        key.to_str().unwrap(),
    ));
    let gw = Proc::start(&args, &env);
    let http = format!("http://{}", gw.http.as_deref().unwrap());
    // The card names the public URL; its key is served here too. The
    // reference SDK verifies it with that key.
    let out = ok(&Command::new(tool("SWITCHYARD_PYTHON"))
        .arg(repo_root().join("tests/a2a/verify_card.py"))
        .arg(format!("{http}/.well-known/agent-card.json"))
        .arg(format!("{http}/.well-known/jwks.json"))
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["tampered_refused"], true, "{v}");
    assert_eq!(
        v["jku"],
        "https://switchyard.example.com/.well-known/jwks.json"
    );
    assert_eq!(v["url"], "https://switchyard.example.com/a2a");
}
