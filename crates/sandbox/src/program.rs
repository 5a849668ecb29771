//! The allowlist, resolved once at start-up against the executor's fixed
//! search path: each command becomes the real (canonical) file the sandbox
//! lets that task execute, plus the ELF interpreter the kernel must open to
//! start it. Nothing a task sets (its PATH, a later file on the search path)
//! changes what a name means until the executor restarts.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// One runnable command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The file, symlinks resolved: what the task may execute.
    pub path: PathBuf,
    /// Its ELF interpreter (`PT_INTERP`, symlinks resolved), which the
    /// kernel opens for execution too; `None` for a static binary.
    pub loader: Option<PathBuf>,
}

/// Why a command cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unrunnable {
    /// The name is not on the allowlist.
    #[error("command {0:?} is not on the executor's allowlist")]
    NotAllowed(String),
    /// Allowlisted, but it could not be resolved to a program it may run.
    #[error("{0}")]
    Unusable(String),
}

/// The allowlist as resolved at start-up: every name maps to its program or
/// to why it cannot run.
#[derive(Debug, Clone, Default)]
pub struct Programs {
    by_name: HashMap<String, Result<Program, String>>,
}

impl Programs {
    /// Resolves every name on `search` (a `:`-separated list).
    pub fn resolve(names: &[String], search: &str) -> Programs {
        let by_name = names
            .iter()
            .map(|n| (n.clone(), resolve_one(n, search)))
            .collect();
        Programs { by_name }
    }

    /// The program for `name`, or why it cannot run.
    pub fn get(&self, name: &str) -> Result<&Program, Unrunnable> {
        match self.by_name.get(name) {
            Some(Ok(p)) => Ok(p),
            Some(Err(e)) => Err(Unrunnable::Unusable(e.clone())),
            None => Err(Unrunnable::NotAllowed(name.to_owned())),
        }
    }

    /// Names that cannot run, with the reason (for the start-up log).
    pub fn unusable(&self) -> Vec<(&str, &str)> {
        let mut v: Vec<_> = self
            .by_name
            .iter()
            .filter_map(|(n, r)| r.as_ref().err().map(|e| (n.as_str(), e.as_str())))
            .collect();
        v.sort();
        v
    }
}

fn resolve_one(name: &str, search: &str) -> Result<Program, String> {
    let found = find(name, search).ok_or_else(|| {
        format!("command {name:?} was not found on the executor's PATH ({search})")
    })?;
    let path = found
        .canonicalize()
        .map_err(|e| format!("command {name:?}: {}: {e}", found.display()))?;
    let loader = interpreter(&path).map_err(|e| format!("command {name:?}: {e}"))?;
    let loader = match loader {
        Some(l) => Some(
            l.canonicalize()
                .map_err(|e| format!("command {name:?}: its loader {}: {e}", l.display()))?,
        ),
        None => None,
    };
    Ok(Program { path, loader })
}

/// Finds `command` on `path`. Absolute paths are used as given (only
/// reachable when the allowlist names them).
pub fn find(command: &str, path: &str) -> Option<PathBuf> {
    if command.contains('/') {
        let p = PathBuf::from(command);
        return p.is_file().then_some(p);
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(command))
        .find(|p| p.is_file())
}

const PT_INTERP: u32 = 3;

/// The `PT_INTERP` of a 64- or 32-bit little-endian ELF file. A script
/// (`#!`) is refused: the kernel would execute its interpreter, which the
/// sandbox does not allow, and allowing it would let the task run any script.
fn interpreter(path: &Path) -> Result<Option<PathBuf>, String> {
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut head = [0u8; 64];
    let n = read_up_to(&mut f, &mut head).map_err(io)?;
    let head = &head[..n];
    if head.starts_with(b"#!") {
        let line = head[2..].split(|b| *b == b'\n').next().unwrap_or_default();
        return Err(format!(
            "{} is a script run by {}; the sandbox lets a task execute only its own binary, so allowlist a compiled program instead",
            path.display(),
            String::from_utf8_lossy(line).trim()
        ));
    }
    if n < 52 || &head[..4] != b"\x7fELF" {
        return Err(format!("{} is not an ELF executable", path.display()));
    }
    if head[5] != 1 {
        return Err(format!(
            "{} is a big-endian ELF file, which this executor does not run",
            path.display()
        ));
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as u64;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64_at = |b: &[u8], o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let wide = match head[4] {
        2 => true,
        1 => false,
        _ => return Err(format!("{} has an unknown ELF class", path.display())),
    };
    if wide && n < 64 {
        return Err(format!("{} is a truncated ELF file", path.display()));
    }
    let (phoff, phentsize, phnum) = if wide {
        (u64_at(head, 32), u16_at(head, 54), u16_at(head, 56))
    } else {
        (u32_at(head, 28) as u64, u16_at(head, 42), u16_at(head, 44))
    };
    let min_entry = if wide { 56 } else { 32 };
    if phentsize < min_entry || phnum > 4096 {
        return Err(format!("{} has malformed program headers", path.display()));
    }
    let mut table = vec![0u8; (phentsize * phnum) as usize];
    read_at(&mut f, phoff, &mut table).map_err(io)?;
    for h in table.chunks_exact(phentsize as usize) {
        if u32_at(h, 0) != PT_INTERP {
            continue;
        }
        let (off, size) = if wide {
            (u64_at(h, 8), u64_at(h, 32))
        } else {
            (u32_at(h, 4) as u64, u32_at(h, 16) as u64)
        };
        if size == 0 || size > 4096 {
            return Err(format!("{} has a malformed PT_INTERP", path.display()));
        }
        let mut name = vec![0u8; size as usize];
        read_at(&mut f, off, &mut name).map_err(io)?;
        let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
        use std::os::unix::ffi::OsStrExt;
        return Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(
            &name[..end],
        ))));
    }
    Ok(None)
}

fn read_up_to(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn read_at(f: &mut std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(buf, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

    #[test]
    fn programs_resolve_only_on_the_given_path() {
        assert!(find("sort", PATH).is_some());
        assert!(find("sort", "/nonexistent").is_none());
        assert!(find("no-such-tool-xyz", PATH).is_none());
    }

    #[test]
    fn a_dynamic_binary_resolves_to_its_real_file_and_loader() {
        let p = Programs::resolve(&["sort".into()], PATH);
        let sort = p.get("sort").unwrap();
        assert_eq!(sort.path, sort.path.canonicalize().unwrap());
        let loader = sort.loader.as_ref().expect("sort is dynamically linked");
        assert!(
            loader
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("ld-"),
            "{loader:?}"
        );
    }

    #[test]
    fn scripts_missing_names_and_other_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tool"), "#!/bin/sh\necho hi\n").unwrap();
        std::fs::write(dir.path().join("data"), "not a program").unwrap();
        let path = dir.path().display().to_string();
        let p = Programs::resolve(&["tool".into(), "data".into(), "nope".into()], &path);
        let why = |name: &str| p.get(name).unwrap_err().to_string();
        assert!(why("tool").contains("script run by /bin/sh"));
        assert!(why("data").contains("not an ELF"));
        assert!(why("nope").contains("not found"));
        assert!(why("cat").contains("not on the executor's allowlist"));
        assert_eq!(p.unusable().len(), 3);
    }
}
