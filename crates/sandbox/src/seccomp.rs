//! The seccomp filter of a command task. Landlock (ABI 4+) stops TCP bind
//! and connect, but not UDP, raw or Unix sockets, nor io_uring's own socket
//! opcode, nor the user's kernel keyrings. This filter makes `socket(2)` fail
//! with EACCES (unless the command may use the network) and `io_uring_setup`,
//! `keyctl`, `add_key`, `request_key` with EPERM — and `truncate(2)` on
//! kernels whose Landlock cannot restrict it (ABI < 3). Everything else is
//! allowed. A call from a foreign system-call ABI (32-bit `int 0x80`, x32)
//! kills the process, since its numbers would slip past the checks.

use libc::{c_ushort, sock_filter, sock_fprog};

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// x32 system calls carry this bit on x86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The filter program (built before fork; installed by [`install`]).
#[derive(Debug, Clone)]
pub struct Filter(Vec<sock_filter>);

impl Filter {
    /// No io_uring or keyrings; no sockets when `no_network`; no
    /// `truncate(2)` when `no_truncate`.
    pub fn new(no_network: bool, no_truncate: bool) -> Filter {
        let mut denied: Vec<(libc::c_long, i32)> = vec![
            (libc::SYS_io_uring_setup, libc::EPERM),
            (libc::SYS_keyctl, libc::EPERM),
            (libc::SYS_add_key, libc::EPERM),
            (libc::SYS_request_key, libc::EPERM),
        ];
        if no_network {
            denied.push((libc::SYS_socket, libc::EACCES));
        }
        if no_truncate {
            denied.push((libc::SYS_truncate, libc::EACCES));
        }
        let mut p = vec![
            stmt(BPF_LD_W_ABS, ARCH),
            jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
            stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
            stmt(BPF_LD_W_ABS, NR),
        ];
        if cfg!(target_arch = "x86_64") {
            p.push(jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1));
            p.push(stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS));
        }
        for (nr, errno) in denied {
            p.push(jump(BPF_JEQ_K, nr as u32, 0, 1));
            p.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | errno as u32));
        }
        p.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
        Filter(p)
    }

    /// Installs the filter on the calling thread (needs no_new_privs set).
    ///
    /// # Safety
    /// Async-signal-safe: one `prctl`, no allocation.
    #[allow(unsafe_code)]
    pub unsafe fn install(&self) -> std::io::Result<()> {
        let prog = sock_fprog {
            len: self.0.len() as c_ushort,
            filter: self.0.as_ptr() as *mut sock_filter,
        };
        // SAFETY: `prog` points at a filter that outlives the call.
        let r = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                &prog as *const sock_fprog,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_lands_inside_the_program_and_it_ends_in_allow() {
        let Filter(p) = Filter::new(true, true);
        for (i, ins) in p.iter().enumerate() {
            if ins.code == BPF_JEQ_K || ins.code == BPF_JGE_K {
                assert!(i + 1 + (ins.jt.max(ins.jf) as usize) < p.len());
            }
        }
        let last = p.last().unwrap();
        assert_eq!((last.code, last.k), (BPF_RET_K, SECCOMP_RET_ALLOW));
    }
}
