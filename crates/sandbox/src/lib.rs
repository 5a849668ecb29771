//! Command tasks (seed 001): no shell — the program is resolved once at
//! start-up ([`program`]) and started with its arguments; a scrubbed
//! environment; the job's scratch directory as working directory; confined
//! by the sandbox ([`policy`]) within resource limits ([`limits`]);
//! stdout/stderr captured up to a cap and streamed; on timeout SIGTERM to the
//! whole process group, then SIGKILL after a grace period. Dropping a run
//! (cancellation) kills the group at once. Each program is PID 1 of its own
//! PID namespace where the executor may create one ([`spawn`]), so nothing
//! it starts outlives it.

pub mod limits;
pub mod policy;
pub mod program;
pub mod scratch;
mod seccomp;
mod spawn;

use std::path::Path;
use std::time::Duration;

pub use policy::{ConfineError, Confinement, Policy, Sandbox, SandboxMode};

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// Environment variables a confined program may not be given: they change
/// what runs, or make the C library load code from a path the caller chose
/// (a scratch directory is readable, and mapping a readable library is not
/// something Landlock's execute right controls). Every `LD_*` name is
/// refused too.
pub const DENIED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "TMPDIR",
    "IFS",
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RESOLV_HOST_CONF",
    "MALLOC_TRACE",
];

/// Whether `name` may not be set for a confined program (command tasks,
/// stdio MCP servers).
pub fn denied_env(name: &str) -> bool {
    name.starts_with("LD_") || DENIED_ENV.contains(&name)
}

/// What one run produced.
#[derive(Debug, Default)]
pub struct Finished {
    /// Exit code; `None` when killed by a signal.
    pub exit_code: Option<i32>,
    /// Signal that ended it, if any.
    pub signal: Option<i32>,
    /// Captured stdout (capped).
    pub stdout: Vec<u8>,
    /// Captured stderr (capped).
    pub stderr: Vec<u8>,
    /// True when either stream hit the cap.
    pub truncated: bool,
    /// True when the timeout fired.
    pub timed_out: bool,
}

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Not found on the configured PATH.
    #[error("command {0:?} was not found on the executor's PATH")]
    NotFound(String),
    /// The OS refused.
    #[error("starting {0:?}: {1}")]
    Spawn(String, std::io::Error),
}

/// How to run.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Attempt timeout.
    pub timeout: Duration,
    /// Wait between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Bytes kept per stream.
    pub cap: usize,
}

/// Kills the process group when dropped.
struct GroupGuard {
    pid: Option<Pid>,
    /// The leader is PID 1 of its own PID namespace.
    namespaced: bool,
}

impl GroupGuard {
    fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid {
            // ESRCH (already gone) is fine.
            let _ = kill_process_group(pid, sig);
        }
    }

    /// SIGTERM to the whole group. A namespace's PID 1 receives only the
    /// signals it handles: a leader that neither catches nor ignores
    /// SIGTERM would have died of it anywhere else, so it is killed now
    /// (and, as PID 1, takes what it started with it). Returns whether
    /// that stood in for the SIGTERM.
    fn terminate(&self) -> bool {
        self.signal(Signal::TERM);
        match self.pid {
            Some(pid) if self.namespaced && !spawn::handles(pid, libc::SIGTERM) => {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
                true
            }
            _ => false,
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(Signal::KILL);
    }
}

async fn capture(
    mut r: impl AsyncRead + Unpin,
    cap: usize,
    stream: &'static str,
    on_chunk: &(dyn Fn(&'static str, &[u8]) + Send + Sync),
) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                let take = n.min(room);
                if take > 0 {
                    kept.extend_from_slice(&buf[..take]);
                    on_chunk(stream, &buf[..take]);
                }
                // Keep draining past the cap so the child never blocks on a full pipe.
                truncated |= take < n;
            }
        }
    }
    (kept, truncated)
}

/// A confined child that stays up while its owner talks to it over its
/// pipes (an MCP server on stdio).
#[derive(Debug)]
pub struct Service {
    /// Its standard input.
    pub stdin: tokio::net::unix::pipe::Sender,
    /// Its standard output.
    pub stdout: tokio::net::unix::pipe::Receiver,
    /// Its standard error, to be drained by the owner.
    pub stderr: tokio::net::unix::pipe::Receiver,
    /// The process; dropping it kills its whole process group.
    pub process: Process,
}

/// A running confined child. Dropping it kills its whole process group.
pub struct Process {
    child: spawn::Child,
    _guard: GroupGuard,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.child.pid().as_raw_nonzero())
            .finish_non_exhaustive()
    }
}

impl Process {
    /// Waits for it to end; `(exit code, signal)`.
    pub async fn wait(&mut self) -> std::io::Result<(Option<i32>, Option<i32>)> {
        let e = self.child.wait().await?;
        Ok((e.code, e.signal))
    }
}

/// Starts `program args…` confined by `jail` like [`run`], in its own
/// process group, with all three pipes handed to the caller and no timeout:
/// it runs until the [`Service`] is dropped.
pub fn serve(
    program: &Path,
    arg0: &str,
    args: &[String],
    env: &[(String, String)],
    cwd: &Path,
    jail: Confinement,
) -> Result<Service, StartError> {
    let name = program.display().to_string();
    let (mut child, guard) = start(program, arg0, args, env, cwd, true, jail)?;
    let missing = || StartError::Spawn(name.clone(), std::io::Error::other("a pipe is missing"));
    let stdin = child.stdin.take().ok_or_else(missing)?;
    let stdout = child.stdout.take().ok_or_else(missing)?;
    let stderr = child.stderr.take().ok_or_else(missing)?;
    Ok(Service {
        stdin,
        stdout,
        stderr,
        process: Process {
            child,
            _guard: guard,
        },
    })
}

/// Starts `program` confined by `jail`, in its own session and process
/// group (the child's pid), so signals reach everything it starts.
fn start(
    program: &Path,
    arg0: &str,
    args: &[String],
    env: &[(String, String)],
    cwd: &Path,
    stdin: bool,
    jail: Confinement,
) -> Result<(spawn::Child, GroupGuard), StartError> {
    let spec = spawn::Spec {
        program,
        arg0,
        args,
        env,
        cwd,
        stdin,
        jail: &jail,
    };
    let child = spawn::spawn(&spec).map_err(|e| {
        let name = program.display().to_string();
        match e.kind() {
            std::io::ErrorKind::NotFound => StartError::NotFound(name),
            _ => StartError::Spawn(name, e),
        }
    })?;
    // Closes the Landlock ruleset now that the child has it.
    drop(jail);
    let guard = GroupGuard {
        pid: Some(child.pid()),
        namespaced: child.namespaced(),
    };
    Ok((child, guard))
}

/// Runs `program args…` (as `arg0`, the name it was asked for) in `cwd`
/// with exactly `env`, feeding `stdin`, confined by `jail` from the moment
/// it starts.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    program: &Path,
    arg0: &str,
    args: &[String],
    env: &[(String, String)],
    cwd: &Path,
    stdin: Option<Vec<u8>>,
    limits: &Limits,
    jail: Confinement,
    on_chunk: &(dyn Fn(&'static str, &[u8]) + Send + Sync),
) -> Result<Finished, StartError> {
    let cpu_limit = jail.cpu_seconds();
    let (mut child, guard) = start(program, arg0, args, env, cwd, stdin.is_some(), jail)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::spawn(async move {
            // A child that exits without reading its input is not an error.
            let _ = pipe.write_all(&input).await;
        });
    }
    let out = child.stdout.take();
    let err = child.stderr.take();
    let io = async {
        let o = async {
            match out {
                Some(o) => capture(o, limits.cap, "stdout", on_chunk).await,
                None => (Vec::new(), false),
            }
        };
        let e = async {
            match err {
                Some(e) => capture(e, limits.cap, "stderr", on_chunk).await,
                None => (Vec::new(), false),
            }
        };
        tokio::join!(o, e)
    };
    let waited = child.wait();
    let both = async { tokio::join!(waited, io) };
    tokio::pin!(both);
    let mut timed_out = false;
    let mut term_stood_in = false;
    let (status, ((stdout, t1), (stderr, t2))) = tokio::select! {
        r = &mut both => r,
        _ = tokio::time::sleep(limits.timeout) => {
            timed_out = true;
            term_stood_in = guard.terminate();
            match tokio::time::timeout(limits.grace, &mut both).await {
                Ok(r) => r,
                Err(_) => {
                    guard.signal(Signal::KILL);
                    both.await
                }
            }
        }
    };
    // The leader has exited; make sure nothing it started lingers.
    let namespaced = guard.namespaced;
    drop(guard);
    let status = status.map_err(|e| StartError::Spawn(program.display().to_string(), e))?;
    Ok(Finished {
        exit_code: status.code,
        // What it would have died of outside a namespace: a PID 1 ignores
        // SIGTERM and the CPU limit's SIGXCPU unless it handles them, so
        // the SIGKILL that followed stood in for them.
        signal: match status.signal {
            Some(libc::SIGKILL) if term_stood_in => Some(libc::SIGTERM),
            Some(libc::SIGKILL)
                if namespaced
                    && !timed_out
                    && cpu_limit.is_some_and(|l| status.cpu.as_secs() >= l) =>
            {
                Some(libc::SIGXCPU)
            }
            s => s,
        },
        stdout,
        stderr,
        truncated: t1 || t2,
        timed_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

    fn limits(timeout_ms: u64) -> Limits {
        Limits {
            timeout: Duration::from_millis(timeout_ms),
            grace: Duration::from_millis(300),
            cap: 1024,
        }
    }

    /// The runner's own behaviour, with the sandbox off (the sandbox has
    /// its own tests in `tests/confinement.rs`).
    fn unconfined() -> Confinement {
        let dir = std::env::temp_dir();
        let s = Sandbox::detect(&Policy {
            mode: SandboxMode::Off,
            read_paths: &[],
            ids_when_root: (65534, 65534),
            network_commands: &[],
            scratch_root: &dir,
        })
        .unwrap();
        let p = program::Programs::resolve(&["true".into()], PATH);
        s.confine("true", p.get("true").unwrap(), &dir, &Default::default())
            .unwrap()
    }

    async fn go(cmd: &str, args: &[&str], stdin: Option<&str>, l: &Limits) -> Finished {
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        run(
            &program::find(cmd, PATH).unwrap(),
            cmd,
            &args,
            &[("PATH".into(), PATH.into())],
            dir.path(),
            stdin.map(|s| s.as_bytes().to_vec()),
            l,
            unconfined(),
            &|_, _| {},
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn stdin_is_piped_and_stdout_captured_without_a_shell() {
        let f = go("sort", &["-r"], Some("a\nc\nb\n"), &limits(5000)).await;
        assert_eq!(
            (f.exit_code, f.stdout.as_slice()),
            (Some(0), &b"c\nb\na\n"[..])
        );
        // No shell: metacharacters are plain arguments.
        let f = go("echo", &["$HOME", ";", "rm"], None, &limits(5000)).await;
        assert_eq!(f.stdout, b"$HOME ; rm\n");
    }

    #[tokio::test]
    async fn the_environment_is_only_what_was_given() {
        let f = go("env", &[], None, &limits(5000)).await;
        assert_eq!(String::from_utf8_lossy(&f.stdout), format!("PATH={PATH}\n"));
    }

    #[tokio::test]
    async fn output_is_capped_and_streamed_in_chunks() {
        let seen = Mutex::new(0usize);
        let dir = tempfile::tempdir().unwrap();
        let f = run(
            &program::find("seq", PATH).unwrap(),
            "seq",
            &["1".into(), "100000".into()],
            &[],
            dir.path(),
            None,
            &limits(5000),
            unconfined(),
            &|stream, chunk| {
                assert_eq!(stream, "stdout");
                *seen.lock().unwrap() += chunk.len();
            },
        )
        .await
        .unwrap();
        assert_eq!(f.exit_code, Some(0), "the child was drained, not blocked");
        assert!(f.truncated);
        assert_eq!(f.stdout.len(), 1024);
        assert_eq!(*seen.lock().unwrap(), 1024);
    }

    #[tokio::test]
    async fn a_program_that_cannot_start_is_an_error_not_an_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let start = |program: std::path::PathBuf| {
            let cwd = dir.path().to_path_buf();
            async move {
                run(
                    &program,
                    "x",
                    &[],
                    &[],
                    &cwd,
                    None,
                    &limits(5000),
                    unconfined(),
                    &|_, _| {},
                )
                .await
                .unwrap_err()
            }
        };
        let e = start(dir.path().join("missing")).await;
        assert!(matches!(e, StartError::NotFound(_)), "{e:?}");
        let e = start("/etc/passwd".into()).await;
        assert!(e.to_string().contains("Permission denied"), "{e}");
    }

    #[tokio::test]
    async fn the_program_leads_its_own_session_and_process_group() {
        let f = go("cat", &["/proc/self/stat"], None, &limits(5000)).await;
        let stat = String::from_utf8_lossy(&f.stdout).into_owned();
        // pid (comm) state ppid pgrp session ...
        let after = stat.rsplit_once(") ").unwrap().1;
        let fields: Vec<&str> = after.split(' ').collect();
        let pid = stat.split(' ').next().unwrap();
        assert_eq!((fields[2], fields[3]), (pid, pid), "{stat}");
    }

    /// Processes whose command line contains `marker`.
    fn running_with(marker: &str) -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(marker))
            .collect()
    }

    #[tokio::test]
    async fn nothing_a_program_started_outlives_it_not_even_a_new_session() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: PID namespaces need root (CAP_SYS_ADMIN)");
            return;
        }
        // The program is PID 1 of its own namespace.
        let f = go("sh", &["-c", "echo $$"], None, &limits(5000)).await;
        assert_eq!(f.stdout, b"1\n");
        // A detached child in a new session, holding stdout open, used to
        // keep the task waiting and then outlive it.
        let marker = format!("{}.{}", 300 + std::process::id() % 100, std::process::id());
        let script = format!("setsid sleep {marker} & echo started");
        let f = go("sh", &["-c", &script], None, &limits(20_000)).await;
        assert!(!f.timed_out, "the task ended when its program did");
        assert_eq!(
            (f.exit_code, f.stdout.as_slice()),
            (Some(0), &b"started\n"[..])
        );
        // Killed by the kernel with the namespace; reaped by init.
        for _ in 0..200 {
            if running_with(&marker).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("outlived its task: {:?}", running_with(&marker));
    }

    #[tokio::test]
    async fn a_timeout_sends_sigterm_to_the_group() {
        let f = go("sleep", &["30"], None, &limits(200)).await;
        assert!(f.timed_out);
        assert_eq!(f.signal, Some(15));
    }

    #[tokio::test]
    async fn a_process_ignoring_sigterm_is_killed_after_the_grace_period() {
        let started = std::time::Instant::now();
        let f = go(
            "sh",
            &["-c", "trap '' TERM; sleep 30 & wait; sleep 30"],
            None,
            &limits(200),
        )
        .await;
        assert!(f.timed_out);
        assert_eq!(f.signal, Some(9), "SIGKILL after the grace period");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
