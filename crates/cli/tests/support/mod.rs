//! Starting real `switchyard` processes and running CLI commands in tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A running `switchyard` process, killed on drop.
pub struct Proc {
    child: Child,
    pub addr: String,
}

impl Proc {
    /// Starts `switchyard ARGS` with `env` and waits for its `listening grpc=` line.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn switchyard");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("listening grpc=") {
                    let _ = tx.send(a.to_owned());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("switchyard {args:?} did not print its listening line");
            }
        };
        Proc { child, addr }
    }

    /// `switchyard dev` on a free port with its data in a new temporary
    /// directory (returned, so it lives as long as the caller needs it).
    pub fn dev(env: &[(&str, &str)]) -> (Proc, tempfile::TempDir) {
        let data = tempfile::tempdir().unwrap();
        let p = Proc::start(
            &[
                "dev",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                data.path().to_str().unwrap(),
            ],
            env,
        );
        (p, data)
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
pub fn cli(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("SWITCHYARD_URL", url)
        .current_dir(repo_root())
        .output()
        .expect("run switchyard cli")
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
