//! A real model server for tests and benchmarks: llama-cpp-python's
//! OpenAI-compatible server (`python -m llama_cpp.server`) on a free
//! loopback port, with the GGUF model and Python named by
//! `SWITCHYARD_LLAMA_MODEL` and `SWITCHYARD_LLAMA_PYTHON` (`make llm-venv`
//! installs both). Stopped on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The alias the server serves the model under.
pub const MODEL: &str = "gemma3-270m";

/// One running server.
#[derive(Debug)]
pub struct Server {
    child: Child,
    url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Whether the environment names a server to run.
    pub fn available() -> bool {
        std::env::var_os("SWITCHYARD_LLAMA_PYTHON").is_some()
            && std::env::var_os("SWITCHYARD_LLAMA_MODEL").is_some()
    }

    /// Starts the server with `chat_format` (`gemma` for plain chat,
    /// `chatml-function-calling` for tools), two threads, a 2,048-token
    /// context, requests served one after another (never interrupted), and
    /// waits (up to 90 s) until it listens.
    pub fn start(chat_format: &str) -> Result<Server, String> {
        let var = |k: &str| {
            std::env::var(k).map_err(|_| format!("{k} is not set: run through make test-real-llm"))
        };
        let (python, model) = (
            var("SWITCHYARD_LLAMA_PYTHON")?,
            var("SWITCHYARD_LLAMA_MODEL")?,
        );
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log = dir.path().join("server.log");
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let out = file.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(python)
            .args(["-m", "llama_cpp.server", "--model", &model])
            .args(["--model_alias", MODEL, "--host", "127.0.0.1", "--port", "0"])
            .args([
                "--n_threads",
                "2",
                "--n_ctx",
                "2048",
                "--chat_format",
                chat_format,
                // Requests wait their turn: by default the server cuts the
                // stream it is generating when another request arrives.
                "--interrupt_requests",
                "False",
            ])
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(file))
            .spawn()
            .map_err(|e| format!("start llama_cpp.server: {e}"))?;
        let mut s = Server {
            child,
            url: String::new(),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(u) = s
                .log_text()
                .lines()
                .find_map(|l| l.split("Uvicorn running on ").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
            {
                s.url = format!("{u}/v1");
                return Ok(s);
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                return Err(format!("the model server exited ({st}):\n{}", s.log_text()));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the model server did not listen within 90 s:\n{}",
                    s.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Everything the server logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Chat requests that reached the server (its access log).
    pub fn requests(&self) -> usize {
        self.log_text()
            .matches("\"POST /v1/chat/completions HTTP/1.1\"")
            .count()
    }

    /// Chat requests it answered with a status other than 200.
    pub fn failures(&self) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains("POST /v1/chat/completions") && !l.ends_with("200 OK"))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
