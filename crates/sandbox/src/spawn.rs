//! Starting a confined child the way `posix_spawn` does: `clone` with
//! `CLONE_VM | CLONE_VFORK`, so the kernel copies no page tables (a `fork`
//! of an executor holding a few hundred MB costs milliseconds per task), and
//! the child — running on its own small stack in the parent's memory while
//! the parent thread waits — makes only raw system calls on data prepared
//! here: stdio, session, working directory, signal dispositions, the
//! [`Confinement`], then `execve`. A failure before `execve` comes back as
//! an errno over a close-on-exec pipe.
//!
//! The child is cloned into a new PID namespace (`CLONE_NEWPID`) when the
//! executor may create one (root, or `CAP_SYS_ADMIN`): the program is PID 1
//! there, and when it exits the kernel kills everything it started — a
//! `setsid` or double-forked child cannot outlive its task. Where the
//! kernel refuses, the child starts without one (a warning, once) and its
//! process group is all that holds its descendants.
//!
//! The child is then waited for through a pidfd (Linux 5.3+; a blocking
//! `wait4` on older kernels; `wait4` reaps it either way, for its resource usage), and its pipes are Tokio pipes.

use std::ffi::{CString, c_void};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::process::{Pid, WaitOptions};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use crate::Confinement;

/// Stack of the child between clone and exec.
const CHILD_STACK: usize = 256 * 1024;

/// What to start.
pub(crate) struct Spec<'a> {
    pub(crate) program: &'a Path,
    pub(crate) arg0: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a [(String, String)],
    pub(crate) cwd: &'a Path,
    pub(crate) stdin: bool,
    pub(crate) jail: &'a Confinement,
}

/// How a child ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exit {
    pub(crate) code: Option<i32>,
    pub(crate) signal: Option<i32>,
    /// CPU time it used (user + system), from its resource usage.
    pub(crate) cpu: std::time::Duration,
}

/// A started child: its pipes and how to wait for it. Dropping it before it
/// was waited for kills and reaps it.
pub(crate) struct Child {
    pid: Pid,
    /// Whether it is PID 1 of its own PID namespace.
    namespaced: bool,
    pidfd: Option<AsyncFd<OwnedFd>>,
    reaped: bool,
    pub(crate) stdin: Option<pipe::Sender>,
    pub(crate) stdout: Option<pipe::Receiver>,
    pub(crate) stderr: Option<pipe::Receiver>,
}

/// Everything the child reads, laid out before the clone.
struct Prepared<'a> {
    program: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    report: RawFd,
    jail: &'a Confinement,
}

fn cstring(b: &[u8], what: &str) -> io::Result<CString> {
    CString::new(b).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// Starts the child; returns once it has called `execve` (or failed to).
pub(crate) fn spawn(spec: &Spec<'_>) -> io::Result<Child> {
    let program = cstring(spec.program.as_os_str().as_bytes(), "the program path")?;
    let mut strings = vec![cstring(spec.arg0.as_bytes(), "arg0")?];
    for a in spec.args {
        strings.push(cstring(a.as_bytes(), "an argument")?);
    }
    let argc = strings.len();
    for (k, v) in spec.env {
        strings.push(cstring(format!("{k}={v}").as_bytes(), "the environment")?);
    }
    let pointers = |s: &[CString]| {
        let mut p: Vec<*const libc::c_char> = s.iter().map(|c| c.as_ptr()).collect();
        p.push(std::ptr::null());
        p
    };
    let cwd = cstring(spec.cwd.as_os_str().as_bytes(), "the working directory")?;
    let (stdin_r, stdin_w) = if spec.stdin {
        let (r, w) = pipe_pair()?;
        (r, Some(w))
    } else {
        let null = std::fs::File::open("/dev/null")?;
        (OwnedFd::from(null), None)
    };
    let (stdout_r, stdout_w) = pipe_pair()?;
    let (stderr_r, stderr_w) = pipe_pair()?;
    let (report_r, report_w) = pipe_pair()?;
    let prepared = Prepared {
        program,
        argv: pointers(&strings[..argc]),
        envp: pointers(&strings[argc..]),
        cwd,
        stdin: stdin_r.as_raw_fd(),
        stdout: stdout_w.as_raw_fd(),
        stderr: stderr_w.as_raw_fd(),
        report: report_w.as_raw_fd(),
        jail: spec.jail,
    };
    let (pid, namespaced) = clone_child(&prepared)?;
    // The child has exec'd or exited: its ends and the report's write end
    // are ours alone now.
    drop((stdin_r, stdout_w, stderr_w, report_w));
    let mut errno = [0u8; 4];
    let n = rustix::io::read(&report_r, &mut errno).unwrap_or(0);
    if n == errno.len() {
        let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
        return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)));
    }
    // From here on a failure drops `child`, which kills and reaps it.
    let mut child = Child {
        pid,
        namespaced,
        // Without a pidfd (Linux < 5.3) `wait` falls back to waitpid.
        pidfd: rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .ok()
            .and_then(|fd| watch_pidfd(fd).ok()),
        reaped: false,
        stdin: None,
        stdout: None,
        stderr: None,
    };
    child.stdin = stdin_w.map(pipe::Sender::from_owned_fd).transpose()?;
    child.stdout = Some(pipe::Receiver::from_owned_fd(stdout_r)?);
    child.stderr = Some(pipe::Receiver::from_owned_fd(stderr_r)?);
    Ok(child)
}

/// Registers a pidfd (readable once the process has exited) with Tokio.
#[allow(unsafe_code)]
fn watch_pidfd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and
    // the same until the AsyncFd is dropped.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(io::Error::from)
}

impl Child {
    /// The child's pid (its process group id too).
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Whether the child is PID 1 of its own PID namespace.
    pub(crate) fn namespaced(&self) -> bool {
        self.namespaced
    }

    /// Waits for the child to end and reaps it.
    pub(crate) async fn wait(&mut self) -> io::Result<Exit> {
        let status = match &self.pidfd {
            Some(fd) => loop {
                let mut ready = fd.readable().await?;
                match reap(self.pid, false)? {
                    Some(exit) => break exit,
                    None => ready.clear_ready(),
                }
            },
            None => {
                let pid = self.pid;
                tokio::task::spawn_blocking(move || reap(pid, true))
                    .await
                    .map_err(io::Error::other)??
                    .ok_or_else(|| io::Error::other("wait4 returned no status"))?
            }
        };
        self.reaped = true;
        Ok(status)
    }
}

/// Reaps `pid` with its resource usage (`wait4`): `None` while it still
/// runs (unless `block`).
#[allow(unsafe_code)]
fn reap(pid: Pid, block: bool) -> io::Result<Option<Exit>> {
    let mut status: libc::c_int = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: pointers to locals that outlive the call.
        let r = unsafe { libc::wait4(pid.as_raw_nonzero().get(), &mut status, flags, &mut ru) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Ok(None);
        }
        break;
    }
    let time = |t: libc::timeval| {
        std::time::Duration::from_secs(t.tv_sec.max(0) as u64)
            + std::time::Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Ok(Some(Exit {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        cpu: time(ru.ru_utime) + time(ru.ru_stime),
    }))
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        let _ = rustix::process::kill_process(self.pid, rustix::process::Signal::KILL);
        // SIGKILL is prompt; reap in the background so no zombie is left.
        let pid = self.pid;
        let reap = move || {
            let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(reap);
            }
            Err(_) => reap(),
        }
    }
}

/// Whether creating PID namespaces failed once already (then every later
/// child starts without one, and the warning is not repeated).
static NO_PID_NAMESPACES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Clones the child (see the module docs): in a new PID namespace when the
/// kernel allows, else without; `(pid, namespaced)`.
fn clone_child(p: &Prepared<'_>) -> io::Result<(Pid, bool)> {
    use std::sync::atomic::Ordering;
    if !NO_PID_NAMESPACES.load(Ordering::Relaxed) {
        match clone_with(p, libc::CLONE_NEWPID) {
            Ok(pid) => return Ok((pid, true)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EINVAL)) => {
                if !NO_PID_NAMESPACES.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "command tasks run without their own PID namespace (the executor lacks CAP_SYS_ADMIN): a program that detaches a child (setsid) can leave it running after the task");
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok((clone_with(p, 0)?, false))
}

/// Clones the child with `CLONE_VM | CLONE_VFORK | extra`, all signals
/// blocked in this thread meanwhile so no handler of the parent runs on the
/// child's stack.
#[allow(unsafe_code)]
fn clone_with(p: &Prepared<'_>, extra: libc::c_int) -> io::Result<Pid> {
    let mut stack = vec![0u8; CHILD_STACK];
    // SAFETY: the top of our own allocation, aligned down to 16 bytes.
    let top = unsafe { stack.as_mut_ptr().add(CHILD_STACK) };
    let top = ((top as usize) & !15) as *mut c_void;
    // SAFETY: sigset manipulation on local values.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        // SAFETY: `child` only makes raw system calls on `p`, which outlives
        // the call: with CLONE_VFORK this thread resumes only after the
        // child has exec'd or exited.
        let pid = libc::clone(
            child,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD | extra,
            p as *const Prepared<'_> as *mut c_void,
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        pid
    };
    drop(stack);
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Pid::from_raw(pid).ok_or_else(|| io::Error::other("clone returned pid 0"))
}

/// Whether process `pid` catches or ignores `sig` (its `SigCgt`/`SigIgn`
/// in `/proc`): a PID namespace's init gets only the signals it handles,
/// so one that does neither would have died of it anywhere else.
pub(crate) fn handles(pid: Pid, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", pid.as_raw_nonzero()))
    else {
        return false;
    };
    let bit = 1u64 << (sig - 1);
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("SigCgt:")
                .or_else(|| l.strip_prefix("SigIgn:"))
        })
        .filter_map(|v| u64::from_str_radix(v.trim(), 16).ok())
        .any(|mask| mask & bit != 0)
}

/// The child, between clone and exec. Raw system calls only: it shares the
/// parent's memory, and glibc wrappers that keep process-wide state (the
/// set*id family signals every thread it believes it has) must not run.
#[allow(unsafe_code)]
extern "C" fn child(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Prepared` that `clone_child` passed; it stays
    // alive and unchanged until this function execs or exits.
    let p = unsafe { &*(arg as *const Prepared<'_>) };
    // SAFETY (whole block): system calls on valid descriptors and pointers
    // prepared before the clone.
    unsafe {
        let fail = |report: RawFd| -> ! {
            let e = *libc::__errno_location();
            let bytes = e.to_ne_bytes();
            libc::write(report, bytes.as_ptr() as *const c_void, bytes.len());
            libc::_exit(127)
        };
        for (from, to) in [(p.stdin, 0), (p.stdout, 1), (p.stderr, 2)] {
            if libc::dup2(from, to) < 0 {
                fail(p.report);
            }
        }
        // Its own session, hence its own process group (pgid = pid) and no
        // controlling terminal.
        if libc::setsid() < 0 || libc::chdir(p.cwd.as_ptr()) != 0 {
            fail(p.report);
        }
        // Default dispositions for every signal (the parent's handlers are
        // not for this program; Rust ignores SIGPIPE), then an empty mask.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        if p.jail.apply().is_err() {
            fail(p.report);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            std::mem::size_of::<libc::c_ulong>(),
        );
        libc::execve(p.program.as_ptr(), p.argv.as_ptr(), p.envp.as_ptr());
        fail(p.report)
    }
}
