//! The command sandbox, built from the kernel's own mechanisms:
//!
//! - **Landlock** (per task, built before fork): read-only system paths, the
//!   task's scratch directory read-write, execute only the task's own binary
//!   and its ELF loader, no TCP bind or connect (ABI 4+), no signals or
//!   abstract Unix sockets outside the task (ABI 6+). `/proc/self` is added
//!   in the child, where it names the task and not the executor.
//! - **seccomp**: no sockets of any kind, io_uring or kernel keyrings
//!   ([`crate::seccomp`]); on kernels whose Landlock cannot restrict
//!   `truncate(2)` (ABI < 3), that too.
//! - **no_new_privs**, **rlimits** ([`crate::limits`]), and, when the
//!   executor runs as root, an unprivileged user and group for the task.
//!
//! Everything the child does between fork and exec is a raw system call on
//! memory prepared before the fork ([`Confinement::apply`]).

use std::collections::HashSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, RulesetAttr, RulesetCreatedAttr, Scope,
    path_beneath_rules,
};
use serde::{Deserialize, Serialize};
use switchyard_proto::executor::v1::Isolation;

use crate::limits::{ResourceLimits, Rlimits};
use crate::program::Program;
use crate::seccomp::Filter;

/// `executor.sandbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// Isolate every command task; refuse them when the kernel cannot.
    #[default]
    On,
    /// Run command tasks unconfined (rlimits and no_new_privs only). Logged
    /// at start-up and shown on every command task.
    Off,
}

/// Lowers the Landlock ABI the executor uses, to see how it behaves on an
/// older kernel (`0`: as if the kernel had no Landlock). It can only take
/// protection away from command tasks by refusing them; it never raises the
/// ABI above what the kernel has.
pub const MAX_ABI_ENV: &str = "SWITCHYARD_SANDBOX_MAX_ABI";

/// The newest ABI this code asks for.
const TARGET_ABI: i32 = 6;

/// Landlock access bits used raw in the child (stable kernel ABI).
const LANDLOCK_ACCESS_FS_READ_FILE: u64 = 1 << 2;
const LANDLOCK_ACCESS_FS_READ_DIR: u64 = 1 << 3;
const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// Device files every task may use.
const DEVICES_RW: &[&str] = &["/dev/null"];
const DEVICES_RO: &[&str] = &["/dev/zero", "/dev/random", "/dev/urandom"];

/// The sandbox policy of one executor, fixed at start-up.
#[derive(Debug, Clone)]
pub struct Sandbox {
    mode: SandboxMode,
    /// Landlock ABI in use (kernel's, capped); 0 = none.
    abi: i32,
    /// Why there is no Landlock, when `abi` is 0.
    missing: String,
    read_paths: Vec<PathBuf>,
    devices_rw: Vec<PathBuf>,
    devices_ro: Vec<PathBuf>,
    /// User and group tasks run as (the executor runs as root).
    ids: Option<(u32, u32)>,
    network: HashSet<String>,
    /// Whether the task's user can reach its scratch directory by its
    /// absolute path (else HOME and TMPDIR are `.`, its working directory).
    scratch_reachable: bool,
}

/// What the executor's host looks like to the sandbox.
#[derive(Debug, Clone)]
pub struct Policy<'a> {
    /// `executor.sandbox`.
    pub mode: SandboxMode,
    /// Paths every task may read (and not write or execute).
    pub read_paths: &'a [PathBuf],
    /// `(uid, gid)` for tasks when the executor runs as root.
    pub ids_when_root: (u32, u32),
    /// Commands allowed to use the network.
    pub network_commands: &'a [String],
    /// Where job scratch directories live.
    pub scratch_root: &'a Path,
}

impl Sandbox {
    /// Probes the kernel and fixes the policy.
    pub fn detect(p: &Policy<'_>) -> Result<Sandbox, String> {
        let (kernel, missing) = kernel_abi();
        let abi = kernel.clamp(0, TARGET_ABI);
        let root = rustix::process::geteuid().is_root();
        let ids = (root && p.mode == SandboxMode::On).then_some(p.ids_when_root);
        if ids.is_some_and(|(u, g)| u == 0 || g == 0) {
            return Err(
                "executor.sandbox_uid and executor.sandbox_gid must not be 0: tasks would run as root"
                    .into(),
            );
        }
        let scratch = canonical_ancestor(p.scratch_root).ok();
        for r in p.read_paths {
            if !r.is_absolute() {
                return Err(format!(
                    "executor.sandbox_read_paths: {} is not an absolute path",
                    r.display()
                ));
            }
            let Ok(real) = r.canonicalize() else {
                continue;
            };
            if real.parent().is_none() {
                return Err(format!(
                    "executor.sandbox_read_paths: {} is the root directory, which would let tasks read everything",
                    r.display()
                ));
            }
            if let Some(scratch) = &scratch
                && (scratch.starts_with(&real) || real.starts_with(scratch))
            {
                return Err(format!(
                    "executor.sandbox_read_paths: {} overlaps the scratch directory {}; tasks would read other jobs' files",
                    r.display(),
                    p.scratch_root.display()
                ));
            }
        }
        let scratch_reachable = match ids {
            Some((uid, gid)) => searchable(p.scratch_root, uid, gid),
            None => true,
        };
        let sandbox = Sandbox {
            mode: p.mode,
            abi,
            missing,
            read_paths: existing(p.read_paths.iter().cloned()),
            devices_rw: existing(DEVICES_RW.iter().map(PathBuf::from)),
            devices_ro: existing(DEVICES_RO.iter().map(PathBuf::from)),
            ids,
            network: p.network_commands.iter().cloned().collect(),
            scratch_reachable,
        };
        Ok(match std::env::var(MAX_ABI_ENV) {
            Ok(v) => {
                let cap = v.trim().parse::<i32>().map_err(|_| {
                    format!("{MAX_ABI_ENV}={v:?} is not a Landlock ABI number (0-{TARGET_ABI})")
                })?;
                sandbox.limited_to_abi(cap)
            }
            Err(_) => sandbox,
        })
    }

    /// The same policy using at most Landlock ABI `max` (0: as if the kernel
    /// had none), to see how the executor behaves on an older kernel. It
    /// never raises the ABI above the kernel's.
    pub fn limited_to_abi(mut self, max: i32) -> Sandbox {
        let kernel = self.abi;
        self.abi = self.abi.min(max).max(0);
        if self.abi == 0 && kernel > 0 {
            self.missing =
                format!("{MAX_ABI_ENV}={max} hides the kernel's Landlock (ABI {kernel})");
        }
        self
    }

    /// The Landlock ABI in use (0: none).
    pub fn abi(&self) -> i32 {
        self.abi
    }

    /// The mode in force.
    pub fn mode(&self) -> SandboxMode {
        self.mode
    }

    /// Why command tasks are refused, when they are.
    pub fn unavailable(&self) -> Option<String> {
        (self.mode == SandboxMode::On && self.abi == 0).then(|| {
            format!(
                "this executor cannot isolate command tasks: {}. Run it on a kernel with Landlock (Linux 5.13+, `landlock` in the lsm= boot list) or set executor.sandbox = \"off\" to run commands unconfined",
                self.missing
            )
        })
    }

    /// `TaskStatus.isolation`.
    pub fn isolation(&self) -> Isolation {
        match self.mode {
            SandboxMode::On => Isolation::Sandboxed,
            SandboxMode::Off => Isolation::Off,
        }
    }

    /// Owner of scratch directories and the files put in them: the task's
    /// user when it differs from the executor's.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.ids
    }

    /// Gives a job's scratch directory (mode 0700) or a file put in it to
    /// the task's user, when tasks run as another user.
    pub fn hand_over(&self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let Some((uid, gid)) = self.ids else {
            return Ok(());
        };
        std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
        if path.is_dir() {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }

    /// Whether tasks see their scratch directory by its absolute path.
    pub fn scratch_reachable(&self) -> bool {
        self.scratch_reachable
    }

    /// The environment every confined program starts from: nothing
    /// inherited; PATH is `path`, LANG C.UTF-8, and HOME and TMPDIR the
    /// scratch directory (`.` when the program's user cannot reach it by
    /// its absolute path; it starts there either way).
    pub fn base_env(&self, path: &str, scratch: &Path) -> Vec<(String, String)> {
        let home = if self.scratch_reachable {
            scratch.display().to_string()
        } else {
            ".".to_owned()
        };
        vec![
            ("PATH".to_owned(), path.to_owned()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            ("HOME".to_owned(), home.clone()),
            ("TMPDIR".to_owned(), home),
        ]
    }

    /// What a task of `command` gets on this kernel (`TaskStatus.isolation_detail`).
    pub fn detail(&self, command: &str) -> String {
        if self.mode == SandboxMode::Off {
            return "sandbox off (executor.sandbox = \"off\"): the executor's user and filesystem; rlimits and no_new_privs only".into();
        }
        if self.abi == 0 {
            return "refused: no Landlock".into();
        }
        let network = self.network.contains(command);
        let mut landlock = vec!["read-only system paths, read-write scratch, execute own binary"];
        if self.abi < 3 {
            landlock.push("truncate via seccomp");
        }
        if !network {
            landlock.push(if self.abi >= 4 {
                "no tcp"
            } else {
                "tcp via seccomp"
            });
        }
        if self.abi >= 6 {
            landlock.push("signals and abstract sockets within the task");
        }
        let seccomp = if network {
            "seccomp: no io_uring or keyrings; network allowed (executor.network_commands)"
        } else {
            "seccomp: no sockets, io_uring or keyrings"
        };
        let user = match self.ids {
            Some((u, g)) => format!("; uid {u} gid {g}"),
            None => String::new(),
        };
        format!(
            "landlock abi {} ({}); {seccomp}; rlimits; no_new_privs{user}",
            self.abi,
            landlock.join(", ")
        )
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        match (self.mode, self.unavailable()) {
            (SandboxMode::Off, _) => format!(
                "command sandbox OFF (executor.sandbox = \"off\"): command tasks run unconfined as this executor's user (uid {})",
                rustix::process::geteuid().as_raw()
            ),
            (SandboxMode::On, Some(why)) => format!("command tasks are REFUSED: {why}"),
            (SandboxMode::On, None) => {
                let mut gaps = Vec::new();
                if self.abi < 4 {
                    gaps.push("TCP is blocked by seccomp only (Landlock ABI 4, Linux 6.7)");
                }
                if self.abi < 6 {
                    gaps.push("tasks can signal other processes of their user (Landlock ABI 6, Linux 6.12)");
                }
                let gaps = if gaps.is_empty() {
                    String::new()
                } else {
                    format!("; not enforced on this kernel: {}", gaps.join("; "))
                };
                format!("command sandbox: {}{gaps}", self.detail(""))
            }
        }
    }

    /// Logs [`Sandbox::describe`] once at start-up, prefixed with `whom`
    /// (what it confines) when given: info when it confines, error when it
    /// refuses (no kernel support), warn when an operator turned it off.
    pub fn log(&self, whom: Option<&str>) {
        let line = match whom {
            Some(w) => format!("{w}: {}", self.describe()),
            None => self.describe(),
        };
        match (self.mode, self.unavailable()) {
            (SandboxMode::On, None) => tracing::info!("{line}"),
            (SandboxMode::On, Some(_)) => tracing::error!("{line}"),
            (SandboxMode::Off, _) => tracing::warn!("{line}"),
        }
    }

    /// Everything a run of `program` needs applied between fork and exec.
    pub fn confine(
        &self,
        command: &str,
        program: &Program,
        scratch: &Path,
        limits: &ResourceLimits,
    ) -> Result<Confinement, ConfineError> {
        let rlimits = limits.rlimits();
        if self.mode == SandboxMode::Off {
            return Ok(Confinement {
                ruleset: None,
                ids: None,
                seccomp: None,
                rlimits,
            });
        }
        if let Some(why) = self.unavailable() {
            return Err(ConfineError::Unavailable(why));
        }
        let network = self.network.contains(command);
        let ruleset = self
            .ruleset(program, scratch, network)
            .map_err(|e| ConfineError::Ruleset(e.to_string()))?
            // With an ABI above 0 the crate always creates a ruleset.
            .ok_or_else(|| ConfineError::Ruleset("the kernel created no ruleset".into()))?;
        Ok(Confinement {
            ruleset: Some(ruleset),
            ids: self.ids,
            seccomp: Some(Filter::new(!network, self.abi < 3)),
            rlimits,
        })
    }

    fn ruleset(
        &self,
        program: &Program,
        scratch: &Path,
        network: bool,
    ) -> Result<Option<OwnedFd>, landlock::RulesetError> {
        let abi = ABI::from(self.abi);
        let all = AccessFs::from_all(abi);
        let read: BitFlags<AccessFs> = AccessFs::from_read(abi) & !AccessFs::Execute;
        let exec = AccessFs::Execute | AccessFs::ReadFile;
        let rw = all & !AccessFs::Execute;
        let mut rs = landlock::Ruleset::default().handle_access(all)?;
        if !network && self.abi >= 4 {
            rs = rs.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?;
        }
        if self.abi >= 6 {
            rs = rs.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
        }
        let executables = std::iter::once(&program.path).chain(program.loader.as_ref());
        let rs = rs
            .create()?
            .add_rules(path_beneath_rules(&self.read_paths, read))?
            .add_rules(path_beneath_rules(&self.devices_ro, read))?
            .add_rules(path_beneath_rules(&self.devices_rw, rw))?
            .add_rules(path_beneath_rules(executables, exec))?
            .add_rules(path_beneath_rules([scratch], rw))?;
        Ok(rs.into())
    }
}

/// Why a command task cannot be confined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfineError {
    /// This executor cannot isolate command tasks (no Landlock) and the
    /// sandbox is on.
    #[error("{0}")]
    Unavailable(String),
    /// The kernel refused the task's ruleset.
    #[error("building the Landlock ruleset: {0}")]
    Ruleset(String),
}

/// What the child applies to itself before exec.
#[derive(Debug)]
pub struct Confinement {
    ruleset: Option<OwnedFd>,
    ids: Option<(u32, u32)>,
    seccomp: Option<Filter>,
    rlimits: Rlimits,
}

impl Confinement {
    /// Its CPU soft limit, seconds, if any.
    pub(crate) fn cpu_seconds(&self) -> Option<u64> {
        self.rlimits.cpu_seconds()
    }

    /// Applies it to the calling process, in this order: drop to the task's
    /// user, no_new_privs, Landlock (with `/proc/self`), seccomp, rlimits.
    ///
    /// # Safety
    /// Runs between fork and exec: only raw system calls on memory prepared
    /// before the fork; no allocation, no locks.
    #[allow(unsafe_code)]
    pub unsafe fn apply(&self) -> std::io::Result<()> {
        let check = |r: libc::c_long| {
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY (whole block): plain system calls with valid arguments.
        unsafe {
            // Raw calls: glibc's set*id wrappers would try to change every
            // thread of the process they believe they run in, and the child
            // shares the executor's memory until it execs.
            if let Some((uid, gid)) = self.ids {
                check(libc::syscall(
                    libc::SYS_setgroups,
                    0,
                    std::ptr::null::<libc::gid_t>(),
                ))?;
                check(libc::syscall(libc::SYS_setgid, gid))?;
                check(libc::syscall(libc::SYS_setuid, uid))?;
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long)?;
            if let Some(rs) = &self.ruleset {
                let fd = rs.as_raw_fd();
                let proc_self = libc::open(
                    c"/proc/self".as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                if proc_self >= 0 {
                    let attr = PathBeneathAttr {
                        allowed_access: LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR,
                        parent_fd: proc_self,
                    };
                    let r = libc::syscall(
                        libc::SYS_landlock_add_rule,
                        fd,
                        LANDLOCK_RULE_PATH_BENEATH,
                        &attr as *const PathBeneathAttr,
                        0,
                    );
                    libc::close(proc_self);
                    check(r)?;
                }
                check(libc::syscall(libc::SYS_landlock_restrict_self, fd, 0))?;
            }
            if let Some(f) = &self.seccomp {
                f.install()?;
            }
            self.rlimits.apply()
        }
    }
}

/// The kernel's Landlock ABI (0 when it has none) and, if none, why.
#[allow(unsafe_code)]
fn kernel_abi() -> (i32, String) {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented version query: no attribute, size 0.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v > 0 {
        return (v as i32, String::new());
    }
    let why = match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            "the kernel has Landlock but it is not enabled (add landlock to the lsm= boot parameter)"
        }
        Some(libc::ENOSYS) => {
            "the kernel has no Landlock (Linux 5.13+ with CONFIG_SECURITY_LANDLOCK)"
        }
        _ => {
            "the Landlock version query failed (a seccomp policy of the container runtime may block it)"
        }
    };
    (0, why.to_owned())
}

/// The paths that exist (rules need an open file).
fn existing(paths: impl Iterator<Item = PathBuf>) -> Vec<PathBuf> {
    paths.filter(|p| p.exists()).collect()
}

/// `path` or its nearest existing ancestor, canonical.
fn canonical_ancestor(path: &Path) -> std::io::Result<PathBuf> {
    let mut p = path;
    loop {
        match p.canonicalize() {
            Ok(c) => return Ok(c),
            Err(e) => match p.parent() {
                Some(parent) => p = parent,
                None => return Err(e),
            },
        }
    }
}

/// Whether `uid`/`gid` may search every existing directory from `/` down to
/// `path` (DAC only).
fn searchable(path: &Path, uid: u32, gid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(real) = canonical_ancestor(path) else {
        return false;
    };
    real.ancestors().all(|dir| match std::fs::metadata(dir) {
        Ok(m) => {
            let bit = if m.uid() == uid {
                0o100
            } else if m.gid() == gid {
                0o010
            } else {
                0o001
            };
            m.mode() & bit != 0
        }
        Err(_) => false,
    })
}

/// The default read-only paths: programs, libraries, and the few files in
/// `/etc` that the C library and text tools read. `/etc` as a whole is not
/// among them: it holds secrets (shadow, ssh host keys, TLS private keys).
pub fn default_read_paths() -> Vec<PathBuf> {
    [
        "/usr",
        "/lib",
        "/lib64",
        "/lib32",
        "/bin",
        "/sbin",
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/localtime",
        "/etc/timezone",
        "/etc/passwd",
        "/etc/group",
        "/etc/nsswitch.conf",
        "/etc/locale.alias",
    ]
    .map(PathBuf::from)
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy<'a>(mode: SandboxMode, read: &'a [PathBuf], scratch: &'a Path) -> Policy<'a> {
        Policy {
            mode,
            read_paths: read,
            ids_when_root: (65534, 65534),
            network_commands: &[],
            scratch_root: scratch,
        }
    }

    #[test]
    fn read_paths_may_not_be_the_root_or_overlap_the_scratch_directory() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("scratch");
        for bad in [
            PathBuf::from("/"),
            dir.path().to_path_buf(),
            PathBuf::from("usr"),
        ] {
            let read = [bad.clone()];
            let e = Sandbox::detect(&policy(SandboxMode::On, &read, &scratch)).unwrap_err();
            assert!(e.contains("sandbox_read_paths"), "{bad:?}: {e}");
        }
        let read = default_read_paths();
        assert!(Sandbox::detect(&policy(SandboxMode::On, &read, &scratch)).is_ok());
    }

    #[test]
    fn an_older_abi_says_what_it_cannot_enforce_and_what_seccomp_covers() {
        let dir = tempfile::tempdir().unwrap();
        let read = default_read_paths();
        let s = Sandbox::detect(&policy(SandboxMode::On, &read, dir.path()))
            .unwrap()
            .limited_to_abi(2);
        assert_eq!(s.abi(), 2);
        let d = s.describe();
        assert!(d.contains("landlock abi 2"), "{d}");
        assert!(
            d.contains("truncate via seccomp") && d.contains("tcp via seccomp"),
            "{d}"
        );
        assert!(d.contains("not enforced on this kernel"), "{d}");
        // Lowering never raises.
        assert_eq!(s.limited_to_abi(99).abi(), 2);
    }

    #[test]
    fn off_is_explicit_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let read = default_read_paths();
        let s = Sandbox::detect(&policy(SandboxMode::Off, &read, dir.path())).unwrap();
        assert_eq!(s.isolation(), Isolation::Off);
        assert!(s.describe().contains("sandbox OFF"));
        assert!(s.detail("cat").starts_with("sandbox off"));
        assert!(s.unavailable().is_none());
        assert!(s.owner().is_none(), "off keeps the executor's user");
    }

    #[test]
    fn without_landlock_command_tasks_are_refused_with_the_way_out() {
        let dir = tempfile::tempdir().unwrap();
        let read = default_read_paths();
        let s = Sandbox::detect(&policy(SandboxMode::On, &read, dir.path()))
            .unwrap()
            .limited_to_abi(0);
        let why = s.unavailable().unwrap();
        assert!(why.contains("hides the kernel's Landlock"), "{why}");
        assert!(why.contains("executor.sandbox = \"off\""), "{why}");
        assert!(s.describe().contains("REFUSED"));
        let program = Program {
            path: "/usr/bin/true".into(),
            loader: None,
        };
        let e = s
            .confine("true", &program, dir.path(), &ResourceLimits::default())
            .unwrap_err();
        assert_eq!(e.to_string(), why);
    }
}
