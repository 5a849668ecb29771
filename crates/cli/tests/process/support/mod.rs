//! Starting real `switchyard` processes and running CLI commands in tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

/// The cluster service token every process of a test presents to the
/// others (split mode), as a deployment would set it from a Secret.
pub const SERVICE_TOKEN: &str = "test-cluster-service-token-0123456789abcdef";

/// Credentials file of each started process, by its `http://addr` URL: its
/// own (when it hosts the auth service) or that of the process whose key
/// set it follows (`SWITCHYARD_AUTH__KEYS_URL`).
static CREDENTIALS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());

/// The credentials file the CLI should use against `url`, once it exists
/// (a process writes it while starting; bounded wait).
pub fn credentials_for(url: &str) -> Option<PathBuf> {
    let path = CREDENTIALS
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(u, _)| u == url)
        .map(|(_, p)| p.clone())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(path)
}

/// A token from the credentials file used against `url` (`admin`, `alice`,
/// `bob`, `agents`).
pub fn token(url: &str, name: &str) -> String {
    let path = credentials_for(url).expect("no credentials registered for this url");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["principals"][name]["token"].as_str().unwrap().to_owned()
}

/// Env for a process that does not host the auth service: follow the key
/// set of the process at `auth_url`.
pub fn follow_keys(auth_url: &str) -> (&'static str, String) {
    ("SWITCHYARD_AUTH__KEYS_URL", auth_url.to_owned())
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// `switchyard dev` on a free loopback port with its data in `data`.
fn dev_args(data: &std::path::Path) -> [&str; 5] {
    [
        "dev",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ]
}

/// A running `switchyard` process, killed on drop.
pub struct Proc {
    child: Child,
    /// The gRPC address.
    pub addr: String,
    /// The gateway's AITP REST door, when it hosts one.
    pub http: Option<String>,
    /// The gateway's RESP door, when it hosts one.
    pub resp: Option<String>,
}

/// The addresses of a `listening grpc=A [http=B] [resp=C]` line.
fn listening(line: &str) -> Option<(String, Option<String>, Option<String>)> {
    let rest = line.strip_prefix("listening ")?;
    let field = |name: &str| {
        rest.split_whitespace()
            .find_map(|f| f.strip_prefix(name).map(str::to_owned))
    };
    Some((field("grpc=")?, field("http="), field("resp=")))
}

impl Proc {
    /// Starts `switchyard ARGS` with `env` and waits for its `listening grpc=` line.
    /// Services get the test cluster's service token and dev credentials.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Proc {
        Self::spawn(args, env, true)
    }

    /// Like [`Proc::start`] without the service token and dev credentials:
    /// the test's own configuration only.
    pub fn start_plain(args: &[&str], env: &[(&str, &str)]) -> Proc {
        Self::spawn(args, env, false)
    }

    fn spawn(args: &[&str], env: &[(&str, &str)], defaults: bool) -> Proc {
        Self::spawn_logging(args, env, defaults, Stdio::null())
    }

    fn spawn_logging(args: &[&str], env: &[(&str, &str)], defaults: bool, log: Stdio) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(log)
            .env("RUST_LOG", "warn");
        // `agents serve` is an agent, not a service: it gets a key instead.
        if defaults && args.first() != Some(&"agents") {
            // Processes hosting the auth service write the dev credentials
            // file the CLI then reads.
            cmd.env("SWITCHYARD_SERVICE_TOKEN", SERVICE_TOKEN)
                .env(
                    "SWITCHYARD_AUTH__SERVICE_TOKEN_ENV",
                    "SWITCHYARD_SERVICE_TOKEN",
                )
                .env("SWITCHYARD_AUTH__DEV_CREDENTIALS", "true")
                // The tests' agents and servers listen on 127.0.0.1.
                .env("SWITCHYARD_REGISTRY__EGRESS__ALLOW_LOOPBACK", "true")
                // SIGTERM waits at most this long for running attempts.
                .env("SWITCHYARD_EXECUTOR__DRAIN_GRACE_MS", "2000");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let data_dir = args
            .iter()
            .position(|a| *a == "--data-dir")
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from);
        let keys_url = env
            .iter()
            .find(|(k, _)| *k == "SWITCHYARD_AUTH__KEYS_URL")
            .map(|(_, v)| v.to_string());
        let mut child = cmd.spawn().expect("spawn switchyard");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(a) = listening(&line) {
                    let _ = tx.send(a);
                }
            }
        });
        let (addr, http, resp) = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("switchyard {args:?} did not print its listening line");
            }
        };
        let url = format!("http://{addr}");
        let creds = match (keys_url, data_dir) {
            (Some(k), _) => credentials_for(&k),
            (None, Some(d)) => Some(d.join("credentials.json")),
            (None, None) => None,
        };
        if let Some(c) = creds {
            CREDENTIALS.lock().unwrap().push((url, c));
        }
        Proc {
            child,
            addr,
            http,
            resp,
        }
    }

    /// `switchyard dev` on a free port with its data in a new temporary
    /// directory (returned, so it lives as long as the caller needs it).
    pub fn dev(env: &[(&str, &str)]) -> (Proc, tempfile::TempDir) {
        let data = tempfile::tempdir().unwrap();
        let p = Proc::start(&dev_args(data.path()), env);
        (p, data)
    }

    /// Like [`Proc::dev`], with its log (warnings and errors) in the
    /// returned file.
    pub fn dev_logged(env: &[(&str, &str)]) -> (Proc, tempfile::TempDir, PathBuf) {
        let data = tempfile::tempdir().unwrap();
        let log = data.path().join("stderr.log");
        let file = std::fs::File::create(&log).unwrap();
        let p = Proc::spawn_logging(&dev_args(data.path()), env, true, Stdio::from(file));
        (p, data, log)
    }

    /// Like [`Proc::start`], its log (warnings and errors) appended to `log`.
    pub fn start_logged(args: &[&str], env: &[(&str, &str)], log: &std::path::Path) -> Proc {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Proc::spawn_logging(args, env, true, Stdio::from(file))
    }

    /// `switchyard dev` on a free port with its data in `data` (which may
    /// hold a previous run's), its log (at `RUST_LOG`, in `env`) appended to `log`.
    pub fn dev_at(data: &std::path::Path, env: &[(&str, &str)], log: &std::path::Path) -> Proc {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Proc::spawn_logging(&dev_args(data), env, true, Stdio::from(file))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGTERM, then waits (bounded) for a clean exit; returns the status code.
    pub fn terminate(mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            assert!(
                Instant::now() < deadline,
                "process did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL (a crash).
    /// The process id (for signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a CLI command against `url`.
/// Runs a CLI command against `url`, with the credentials file of the
/// process there (the CLI picks `--as NAME` from it; admin by default).
pub fn cli(url: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("SWITCHYARD_URL", url)
        .current_dir(repo_root());
    if let Some(c) = credentials_for(url) {
        cmd.env("SWITCHYARD_CREDENTIALS", c);
    }
    cmd.output().expect("run switchyard cli")
}

/// Runs the CLI against `url` with `stdin` as its standard input.
pub fn cli_stdin(url: &str, args: &[&str], stdin: &str) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("SWITCHYARD_URL", url)
        .current_dir(repo_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(c) = credentials_for(url) {
        cmd.env("SWITCHYARD_CREDENTIALS", c);
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The path of an outside tool the tests drive, from `var` (`make test`
/// installs the tools and sets the variables).
pub fn tool(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the tests with `make test`, which installs the tools")
    })
}

/// A new API key of tenant `default` (made with the CLI as admin) against
/// `url`: its secret.
pub fn create_key(url: &str, subject: &str, roles: &str) -> String {
    let out = ok(&cli(
        url,
        &[
            "auth",
            "key",
            "create",
            "--subject",
            subject,
            "--roles",
            roles,
            "-o",
            "json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["secret"].as_str().unwrap().to_owned()
}

/// `switchyard job submit FILE --as WHO -o json` against `url`: the job
/// submitted, as JSON.
/// `switchyard dev` with its data and log in `dir` (started again on the
/// same data after a crash), once its built-in agents route.
pub fn dev_in(dir: &std::path::Path) -> Proc {
    let dev = Proc::dev_at(&dir.join("data"), &[], &dir.join("dev.log"));
    let url = dev.url();
    wait_for(
        "built-in agents routable",
        std::time::Duration::from_secs(20),
        || routed(&url, &["--capability", "builtin.echo"]).is_some_and(|ids| !ids.is_empty()),
    );
    dev
}

pub fn submit_as(url: &str, file: &str, who: &str) -> serde_json::Value {
    let out = ok(&cli(
        url,
        &["job", "submit", file, "--as", who, "-o", "json"],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["job"].clone()
}

pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "command failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `f` every 50 ms until it returns true (bounded by `limit`).
/// Waits (bounded) until routing `capability` at `url` ranks exactly `ids`.
pub fn wait_routed(url: &str, capability: &str, ids: &[&str]) {
    wait_for(
        &format!("{capability} routes to {ids:?}"),
        Duration::from_secs(20),
        || routed(url, &["--capability", capability]).is_some_and(|got| got == ids),
    );
}

pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Route candidates' agent ids as JSON via the CLI, or None when the route failed.
pub fn routed(url: &str, extra: &[&str]) -> Option<Vec<String>> {
    let mut args = vec!["route", "-o", "json"];
    args.extend_from_slice(extra);
    let out = cli(url, &args);
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Some(
        v["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["agent_id"].as_str().unwrap().to_owned())
            .collect(),
    )
}

/// `switchyard serve --services ledger` on a free port with its data in
/// `data`, with `env` (its key source, its storage).
pub fn serve_ledger(data: &Path, env: &[(&str, &str)]) -> Proc {
    Proc::start(
        &[
            "serve",
            "--services",
            "ledger",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        env,
    )
}

/// The `grpc.health.v1` status of `service` ("" for the whole server), as
/// the Kubernetes gRPC probe sees it; `None` when the check itself fails.
pub fn health(addr: &str, service: &str) -> Option<i32> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .ok()?
            .connect()
            .await
            .ok()?;
        let mut c = HealthClient::new(ch);
        let r = c
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .ok()?;
        Some(r.into_inner().status)
    })
}

pub const SERVING: Option<i32> = Some(1);
pub const NOT_SERVING: Option<i32> = Some(2);

/// The per-call approval runs waiting for a decision at `url`, as bob lists
/// them (`approval list --status proposed -o json`), of job `job` if given.
pub fn pending_calls(url: &str, job: Option<&str>) -> Vec<serde_json::Value> {
    let out = ok(&cli(
        url,
        &[
            "approval", "list", "--status", "proposed", "--as", "bob", "-o", "json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["tool_call"].is_null())
        .filter(|r| job.is_none_or(|j| r["tool_call"]["job_id"] == j))
        .cloned()
        .collect()
}

/// `switchyard serve --services SERVICES` on a free loopback port with its
/// data in `data_dir`, and `env`.
pub fn serve(services: &str, data_dir: &std::path::Path, env: &[(&str, &str)]) -> Proc {
    Proc::start(
        &[
            "serve",
            "--services",
            services,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir.to_str().unwrap(),
        ],
        env,
    )
}

/// Where a split executor finds the key set and the other services.
pub struct Remotes<'a> {
    pub keys: &'a str,
    pub registry: &'a str,
    pub router: &'a str,
    pub ledger: &'a str,
    pub approval: &'a str,
}

/// The executor alone in a `switchyard serve` process in `data_dir`,
/// following the key set and calling the services `to` names, with
/// `extra` settings.
pub fn serve_executor(
    data_dir: &std::path::Path,
    to: &Remotes<'_>,
    extra: &[(&str, &str)],
) -> Proc {
    let env = executor_env(to, extra);
    serve("executor", data_dir, &env)
}

/// The settings of [`serve_executor`].
pub fn executor_env<'a>(to: &Remotes<'a>, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("SWITCHYARD_AUTH__KEYS_URL", to.keys),
        ("SWITCHYARD_EXECUTOR__REGISTRY_URL", to.registry),
        ("SWITCHYARD_EXECUTOR__ROUTER_URL", to.router),
        ("SWITCHYARD_EXECUTOR__LEDGER_URL", to.ledger),
        ("SWITCHYARD_EXECUTOR__APPROVAL_URL", to.approval),
        ("SWITCHYARD_EXECUTOR__APPROVAL_POLL_MS", "50"),
    ];
    env.extend_from_slice(extra);
    env
}

/// [`serve_executor`] with its log appended to `log`.
pub fn serve_executor_logged(
    data_dir: &std::path::Path,
    to: &Remotes<'_>,
    extra: &[(&str, &str)],
    log: &std::path::Path,
) -> Proc {
    let env = executor_env(to, extra);
    Proc::start_logged(
        &[
            "serve",
            "--services",
            "executor",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir.to_str().unwrap(),
        ],
        &env,
        log,
    )
}

/// Field `k` of event `e`'s data, as text (a string as is, anything else as JSON).
pub fn field(e: &switchyard_proto::common::v1::Event, k: &str) -> String {
    let v = e
        .data
        .as_ref()
        .and_then(|d| d.fields.get(k))
        .cloned()
        .unwrap_or_default();
    match switchyard_kit::json::value_to_json(&v) {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    }
}

/// The kinds of job `id`'s events so far as the executor at `url` serves
/// them to `token`'s holder, waiting (30 s at most) until `kind` is among
/// them.
pub async fn kinds_until(url: &str, token: &str, id: &str, kind: &str) -> Vec<String> {
    use futures_util::StreamExt as _;
    use switchyard_kit::client::{Credential, authed, connect};
    use switchyard_proto::executor::v1::WatchJobRequest;
    use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
    let channel = connect(url).await.unwrap();
    let mut c = JobServiceClient::new(authed(channel, Some(Credential::bearer(token).unwrap())));
    let mut w = c
        .watch_job(WatchJobRequest {
            job_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut kinds = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, w.next()).await {
        let Some(e) = m.unwrap().event else { continue };
        kinds.push(e.kind.clone());
        if e.kind == kind {
            return kinds;
        }
    }
    panic!("job {id}: no {kind} within 30 s: {kinds:?}");
}
