//! Resource limits of a command task: the deployment's defaults and caps,
//! a task's own request within the caps, the rlimits they become, and which
//! limit a failed run hit.

use serde::{Deserialize, Serialize};
use switchyard_proto::executor::v1 as pb;

use crate::Finished;

/// Limits in configuration (`[executor.task_limits]`, the defaults, and
/// `[executor.task_limit_caps]`, the most a task may ask for). Zero means no
/// limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceLimits {
    /// Address space of each process, bytes (RLIMIT_AS).
    pub memory_bytes: u64,
    /// CPU seconds of each process (RLIMIT_CPU).
    pub cpu_seconds: u64,
    /// Processes and threads of the task's user (RLIMIT_NPROC).
    pub processes: u64,
    /// Open file descriptors of each process (RLIMIT_NOFILE).
    pub open_files: u64,
    /// Largest file written, bytes (RLIMIT_FSIZE).
    pub file_size_bytes: u64,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            memory_bytes: 2 << 30,
            cpu_seconds: 300,
            processes: 512,
            open_files: 1024,
            file_size_bytes: 1 << 30,
        }
    }
}

/// One limit, named as its `ResourceLimits` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// RLIMIT_AS.
    Memory,
    /// RLIMIT_CPU.
    Cpu,
    /// RLIMIT_NPROC.
    Processes,
    /// RLIMIT_NOFILE.
    OpenFiles,
    /// RLIMIT_FSIZE.
    FileSize,
}

impl Limit {
    /// Every limit.
    pub const ALL: [Limit; 5] = [
        Limit::Memory,
        Limit::Cpu,
        Limit::Processes,
        Limit::OpenFiles,
        Limit::FileSize,
    ];

    /// The field name (`TaskStatus.resource_limit`).
    pub fn name(self) -> &'static str {
        match self {
            Limit::Memory => "memory_bytes",
            Limit::Cpu => "cpu_seconds",
            Limit::Processes => "processes",
            Limit::OpenFiles => "open_files",
            Limit::FileSize => "file_size_bytes",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Limit::Memory => "memory limit",
            Limit::Cpu => "CPU time limit",
            Limit::Processes => "process limit",
            Limit::OpenFiles => "open-file limit",
            Limit::FileSize => "file size limit",
        }
    }

    fn resource(self) -> libc::__rlimit_resource_t {
        match self {
            Limit::Memory => libc::RLIMIT_AS,
            Limit::Cpu => libc::RLIMIT_CPU,
            Limit::Processes => libc::RLIMIT_NPROC,
            Limit::OpenFiles => libc::RLIMIT_NOFILE,
            Limit::FileSize => libc::RLIMIT_FSIZE,
        }
    }
}

impl ResourceLimits {
    /// The value of one limit (0 = none).
    pub fn get(&self, l: Limit) -> u64 {
        match l {
            Limit::Memory => self.memory_bytes,
            Limit::Cpu => self.cpu_seconds,
            Limit::Processes => self.processes,
            Limit::OpenFiles => self.open_files,
            Limit::FileSize => self.file_size_bytes,
        }
    }

    /// These limits with `l` set to `v`.
    pub fn with(mut self, l: Limit, v: u64) -> ResourceLimits {
        self.set(l, v);
        self
    }

    fn set(&mut self, l: Limit, v: u64) {
        match l {
            Limit::Memory => self.memory_bytes = v,
            Limit::Cpu => self.cpu_seconds = v,
            Limit::Processes => self.processes = v,
            Limit::OpenFiles => self.open_files = v,
            Limit::FileSize => self.file_size_bytes = v,
        }
    }

    /// Checks that defaults stay within caps (config validation).
    pub fn check_within(&self, caps: &ResourceLimits) -> Result<(), String> {
        for l in Limit::ALL {
            let (v, cap) = (self.get(l), caps.get(l));
            if cap != 0 && (v == 0 || v > cap) {
                return Err(format!(
                    "executor.task_limits.{0} ({1}) must be set and at most executor.task_limit_caps.{0} ({cap})",
                    l.name(),
                    if v == 0 {
                        "no limit".to_owned()
                    } else {
                        v.to_string()
                    }
                ));
            }
        }
        Ok(())
    }

    /// What a task asks for, field by field above its cap (for validation).
    pub fn above_caps(asked: &pb::ResourceLimits, caps: &ResourceLimits) -> Vec<(Limit, u64, u64)> {
        let asked = ResourceLimits::from_proto(asked);
        Limit::ALL
            .into_iter()
            .filter_map(|l| {
                let (v, cap) = (asked.get(l), caps.get(l));
                (cap != 0 && v > cap).then_some((l, v, cap))
            })
            .collect()
    }

    fn from_proto(p: &pb::ResourceLimits) -> ResourceLimits {
        ResourceLimits {
            memory_bytes: p.memory_bytes,
            cpu_seconds: p.cpu_seconds,
            processes: p.processes,
            open_files: p.open_files,
            file_size_bytes: p.file_size_bytes,
        }
    }

    /// The limits a task runs with: its own values where set, else the
    /// defaults (validation already kept its values within the caps).
    pub fn for_task(&self, asked: Option<&pb::ResourceLimits>) -> ResourceLimits {
        let mut out = *self;
        if let Some(a) = asked.map(ResourceLimits::from_proto) {
            for l in Limit::ALL {
                if a.get(l) != 0 {
                    out.set(l, a.get(l));
                }
            }
        }
        out
    }

    /// The rlimits to set in the child, with core dumps off.
    pub fn rlimits(&self) -> Rlimits {
        let mut v = [(libc::RLIMIT_CORE, 0, 0); 6];
        for (i, l) in Limit::ALL.into_iter().enumerate() {
            let value = match self.get(l) {
                0 => libc::RLIM_INFINITY,
                n => n,
            };
            // The hard CPU limit one second later, so the kernel first sends
            // SIGXCPU (which names the limit) rather than SIGKILL.
            let hard = if l == Limit::Cpu && value != libc::RLIM_INFINITY {
                value.saturating_add(1)
            } else {
                value
            };
            v[i + 1] = (l.resource(), value, hard);
        }
        Rlimits(v)
    }
}

/// Resource, soft, hard — ready for `setrlimit` between fork and exec.
#[derive(Debug, Clone, Copy)]
pub struct Rlimits([(libc::__rlimit_resource_t, u64, u64); 6]);

impl Rlimits {
    /// The CPU soft limit, seconds, if any (`RLIM_INFINITY`: none).
    pub fn cpu_seconds(&self) -> Option<u64> {
        self.0
            .iter()
            .find(|(r, _, _)| *r == libc::RLIMIT_CPU)
            .map(|&(_, cur, _)| cur)
            .filter(|&c| c != libc::RLIM_INFINITY)
    }

    /// Sets every limit on the calling process.
    ///
    /// # Safety
    /// Async-signal-safe: only `setrlimit` calls, no allocation.
    #[allow(unsafe_code)]
    pub unsafe fn apply(&self) -> std::io::Result<()> {
        for &(resource, cur, max) in &self.0 {
            let r = libc::rlimit {
                rlim_cur: cur,
                rlim_max: max,
            };
            // SAFETY: a valid pointer to a local struct.
            if unsafe { libc::setrlimit(resource, &r) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Which limit a failed run hit, if any. The kernel tells only the process:
/// by a signal for CPU time (SIGXCPU) and file size (SIGXFSZ), and by the
/// error a system call returns for the others (ENOMEM, EAGAIN from fork or
/// thread creation, EMFILE, EFBIG when SIGXFSZ is ignored), which a tool
/// reports on stderr in the C library's wording.
pub fn hit(f: &Finished) -> Option<Limit> {
    // A leader that exited 0 can still leave a process group that had to be
    // stopped (a fork bomb's children): that run failed too.
    if f.exit_code == Some(0) && !f.timed_out {
        return None;
    }
    match f.signal {
        Some(libc::SIGXCPU) => return Some(Limit::Cpu),
        Some(libc::SIGXFSZ) => return Some(Limit::FileSize),
        _ => {}
    }
    let err = String::from_utf8_lossy(&f.stderr).to_ascii_lowercase();
    let said = |needles: &[&str]| needles.iter().any(|n| err.contains(n));
    if said(&["file too large"]) {
        Some(Limit::FileSize)
    } else if said(&["too many open files"]) {
        Some(Limit::OpenFiles)
    } else if said(&["resource temporarily unavailable"]) {
        Some(Limit::Processes)
    } else if said(&[
        "cannot allocate memory",
        "out of memory",
        "memory exhausted",
        "bad_alloc",
    ]) {
        Some(Limit::Memory)
    } else {
        None
    }
}

/// The failure message for a run that hit `l`.
pub fn describe(command: &str, l: Limit, limits: &ResourceLimits, f: &Finished) -> String {
    let value = match (l, limits.get(l)) {
        (_, 0) => "none".to_owned(),
        (Limit::Memory | Limit::FileSize, n) => bytes(n),
        (_, n) => n.to_string(),
    };
    let how = match f.signal {
        Some(libc::SIGXCPU) => " (stopped by SIGXCPU)".to_owned(),
        Some(libc::SIGXFSZ) => " (stopped by SIGXFSZ)".to_owned(),
        _ => {
            let err = String::from_utf8_lossy(&f.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            let last: String = last.trim().chars().take(200).collect();
            if last.is_empty() {
                String::new()
            } else {
                format!(": {last}")
            }
        }
    };
    format!(
        "{command} hit its {} ({} = {value}){how}; raise it for this task with command.limits.{} (up to executor.task_limit_caps.{})",
        l.what(),
        l.name(),
        l.name(),
        l.name()
    )
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(signal: Option<i32>, stderr: &str) -> Finished {
        Finished {
            exit_code: signal.is_none().then_some(2),
            signal,
            stderr: stderr.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn the_limit_is_named_from_the_signal_or_the_reported_errno() {
        assert_eq!(hit(&failed(Some(libc::SIGXCPU), "")), Some(Limit::Cpu));
        assert_eq!(hit(&failed(Some(libc::SIGXFSZ), "")), Some(Limit::FileSize));
        assert_eq!(
            hit(&failed(
                None,
                "bash: fork: retry: Resource temporarily unavailable"
            )),
            Some(Limit::Processes)
        );
        assert_eq!(
            hit(&failed(None, "mawk: out of memory")),
            Some(Limit::Memory)
        );
        assert_eq!(
            hit(&failed(None, "cat: f: Too many open files")),
            Some(Limit::OpenFiles)
        );
        assert_eq!(hit(&failed(None, "grep: no such file")), None);
        assert_eq!(hit(&failed(Some(libc::SIGKILL), "")), None);
        // A successful run hit nothing, whatever it printed.
        let mut ok = failed(None, "out of memory");
        ok.exit_code = Some(0);
        assert_eq!(hit(&ok), None);
    }

    #[test]
    fn a_task_takes_its_own_values_and_the_defaults_for_the_rest() {
        let d = ResourceLimits::default();
        let asked = pb::ResourceLimits {
            cpu_seconds: 2,
            ..Default::default()
        };
        let t = d.for_task(Some(&asked));
        assert_eq!(t.cpu_seconds, 2);
        assert_eq!(t.memory_bytes, d.memory_bytes);
        assert_eq!(d.for_task(None), d);
    }

    #[test]
    fn values_above_a_cap_are_reported_and_zero_caps_allow_anything() {
        let caps = ResourceLimits {
            memory_bytes: 1 << 30,
            cpu_seconds: 0,
            ..Default::default()
        };
        let asked = pb::ResourceLimits {
            memory_bytes: 2 << 30,
            cpu_seconds: 1_000_000,
            ..Default::default()
        };
        let over = ResourceLimits::above_caps(&asked, &caps);
        assert_eq!(over, vec![(Limit::Memory, 2 << 30, 1 << 30)]);
        assert!(ResourceLimits::default().check_within(&caps).is_err());
    }

    #[test]
    fn the_cpu_hard_limit_leaves_a_second_for_sigxcpu_and_core_dumps_are_off() {
        let r = ResourceLimits {
            cpu_seconds: 3,
            memory_bytes: 0,
            ..Default::default()
        }
        .rlimits();
        assert!(r.0.contains(&(libc::RLIMIT_CPU, 3, 4)));
        assert!(r.0.contains(&(libc::RLIMIT_CORE, 0, 0)));
        assert!(r.0.contains(&(libc::RLIMIT_AS, libc::RLIM_INFINITY, libc::RLIM_INFINITY)));
    }

    #[test]
    fn the_message_names_the_limit_its_value_and_how_to_raise_it() {
        let l = ResourceLimits {
            memory_bytes: 64 << 20,
            ..Default::default()
        };
        let m = describe(
            "awk",
            Limit::Memory,
            &l,
            &failed(None, "mawk: out of memory\n"),
        );
        assert_eq!(
            m,
            "awk hit its memory limit (memory_bytes = 64 MiB): mawk: out of memory; raise it for this task with command.limits.memory_bytes (up to executor.task_limit_caps.memory_bytes)"
        );
    }
}
