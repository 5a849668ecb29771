//! Scratch directories: the one mapper from an id (a job's, an MCP
//! server's) to the directory its programs work in, and the one way files
//! are put there.
//!
//! An id becomes a path only here, and only when it is one plain segment
//! (no `/`, no `..`, no NUL): the directory is always directly under the
//! root. Everything is then done relative to descriptors, never by path,
//! and without following links: a task owns its directory and may plant a
//! symlink under any name, so after a restart the executor (often root)
//! must not follow what the task left there. Files are created with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` (a name already present — file or link — is
//! unlinked first, which removes a link itself, never its target) and given
//! to the task's user by `fchown` on the open descriptor.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, fchmod, fchown, mkdirat, openat, unlinkat};
use rustix::io::Errno;
use rustix::process::{Gid, Uid};

/// A root under which each id has its own directory.
#[derive(Debug, Clone)]
pub struct ScratchRoot {
    root: PathBuf,
}

impl ScratchRoot {
    /// The root (created on first use, mode 0700).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The directory of `id`: `<root>/<id>`, when `id` is one plain
    /// segment; anything else (a separator, `.`/`..`, NUL, empty) is an
    /// `InvalidInput` error, never a path outside the root.
    pub fn dir(&self, id: &str) -> io::Result<PathBuf> {
        segment(id)?;
        Ok(self.root.join(id))
    }

    /// Makes (or, after a restart, reopens) the directory of `id` and puts
    /// `files` in it, each created afresh (mode 0600) and, with `owner`,
    /// given to that user by descriptor, as is the directory (mode 0700).
    /// The directory itself must be a real directory: a link in its place
    /// is refused.
    pub fn prepare<'a>(
        &self,
        id: &str,
        files: impl IntoIterator<Item = (&'a str, &'a [u8])>,
        owner: Option<(u32, u32)>,
    ) -> io::Result<PathBuf> {
        let dir_path = self.dir(id)?;
        create_private_dir_all(&self.root)?;
        let root = open_dir(&self.root, None)?;
        match mkdirat(&root, id, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let dir = open_dir(Path::new(id), Some(&root)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{} is not a directory of ours: {e}", dir_path.display()),
            )
        })?;
        for (name, bytes) in files {
            put_file(&dir, name, bytes, owner)?;
        }
        give(&dir, owner)?;
        fchmod(&dir, Mode::from_raw_mode(0o700))?;
        Ok(dir_path)
    }

    /// Removes the directory of `id` and all it holds (links are removed,
    /// never followed). Gone already is fine.
    pub fn remove(&self, id: &str) -> io::Result<()> {
        match std::fs::remove_dir_all(self.dir(id)?) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// `Ok` when `name` is exactly one normal path segment.
pub fn segment(name: &str) -> io::Result<()> {
    let mut parts = Path::new(name).components();
    let one = matches!(parts.next(), Some(Component::Normal(_))) && parts.next().is_none();
    if one && !name.contains(['/', '\\', '\0']) && name.len() <= 255 {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{:?} is not a plain name: ids and file names never become paths with separators or '..'",
                name.chars().take(64).collect::<String>()
            ),
        ))
    }
}

/// Creates `path` and its missing parents with mode 0700 (a data or
/// scratch directory is nobody else's business).
pub fn create_private_dir_all(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

fn give(fd: &OwnedFd, owner: Option<(u32, u32)>) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
    }
    Ok(())
}

fn open_dir(path: &Path, at: Option<&OwnedFd>) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(match at {
        // Under a root: the last component must not be a link.
        Some(root) => openat(root, path, flags | OFlags::NOFOLLOW, Mode::empty())?,
        None => openat(rustix::fs::CWD, path, flags, Mode::empty())?,
    })
}

/// Creates `name` in `dir` afresh: whatever had the name (a file, a link
/// a task planted) is unlinked first, never followed or written through.
fn put_file(dir: &OwnedFd, name: &str, bytes: &[u8], owner: Option<(u32, u32)>) -> io::Result<()> {
    segment(name)?;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode(0o600);
    let fd = match openat(dir, name, flags, mode) {
        Ok(fd) => fd,
        Err(Errno::EXIST) => {
            unlinkat(dir, name, AtFlags::empty()).map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("{name:?} is in the way of a job file and cannot be replaced: {e}"),
                )
            })?;
            openat(dir, name, flags, mode)?
        }
        Err(e) => return Err(e.into()),
    };
    give(&fd, owner)?;
    std::fs::File::from(fd).write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_segments_map_to_directories_under_the_root() {
        let root = ScratchRoot::new("/srv/scratch");
        assert_eq!(
            root.dir("job-1").unwrap(),
            PathBuf::from("/srv/scratch/job-1")
        );
        for bad in ["", ".", "..", "a/b", "a/../../x", "/abs", "a\0b", "a\\b"] {
            let e = root.dir(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn files_replace_a_planted_link_instead_of_writing_through_it() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside.txt");
        std::fs::write(&outside, "precious").unwrap();
        let root = ScratchRoot::new(t.path().join("scratch"));
        let dir = root.prepare("j1", [], None).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("input.txt")).unwrap();
        // A restart prepares the directory again.
        root.prepare("j1", [("input.txt", &b"attachment"[..])], None)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(dir.join("input.txt")).unwrap(),
            "attachment"
        );
        assert!(
            !std::fs::symlink_metadata(dir.join("input.txt"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn a_link_in_place_of_the_directory_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let root = ScratchRoot::new(t.path().join("scratch"));
        create_private_dir_all(root.path()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.path().join("j2")).unwrap();
        assert!(root.prepare("j2", [("f", &b"x"[..])], None).is_err());
        assert!(!elsewhere.join("f").exists());
    }

    #[test]
    fn directories_and_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let root = ScratchRoot::new(t.path().join("a/b"));
        let dir = root.prepare("j3", [("f", &b"x"[..])], None).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(root.path()), 0o700);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("f")), 0o600);
        root.remove("j3").unwrap();
        root.remove("j3").unwrap();
        assert!(!dir.exists());
    }
}
