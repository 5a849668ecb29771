//! Embedded storage for Switchyard services.
//!
//! Each service opens its own [`Store`] (a sled database under the data
//! directory) and keeps typed [`Tree`]s of prost-encoded values in it; no sled
//! type appears in this crate's public API, so a Postgres implementation can
//! take its place later. Writes become durable only through [`Store::sync`],
//! which group-commits: every caller waiting at the same time shares one flush,
//! so throughput does not collapse to one fsync per request. A [`Log`] is an
//! append-only, sequence-numbered file log beside the database (same flush),
//! with a durable watermark readers tail.

pub mod blobs;
mod group_commit;
pub mod pg;
pub use group_commit::observe_flushes;
mod log;

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use blobs::Blobs;
use group_commit::GroupCommit;
pub use log::Log;

/// Whether this process has opened a database at `path` (noting it when
/// `now`).
fn opened_here(path: &Path, now: bool) -> bool {
    static OPENED: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    let seen = opened.contains(&path);
    if now && !seen {
        opened.push(path);
    }
    seen
}

/// Page cache of one database, bytes.
const CACHE_BYTES: u64 = 4 << 20;

/// Storage errors. The operation they come from was not applied (or, for
/// [`Store::sync`], not made durable).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or written.
    #[error("storage i/o failed: {0}")]
    Io(String),
    /// A stored value did not decode: the data on disk is damaged or from an
    /// incompatible version.
    #[error("stored value under {key:?} in {tree} does not decode: {source}")]
    Corrupt {
        /// Tree name.
        tree: String,
        /// Key of the value.
        key: String,
        /// Decoder error.
        source: prost::DecodeError,
    },
    /// The store was closed.
    #[error("store is closed")]
    Closed,
    /// Another process holds the database's lock.
    #[error(
        "{path} is in use by another process (is another switchyard running on this data directory?); stop it, or give this one its own --data-dir"
    )]
    Locked {
        /// The database directory.
        path: String,
    },
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Io(e.to_string())
    }
}

/// A key-only entry: the key is the fact (an index, a set member).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Mark {}

/// A single number kept under a key (a layout version, a checkpoint).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Number {
    /// The number.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// One service's database.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    commit: Arc<GroupCommit>,
    /// Put before every tree's and log's name: several services' stores
    /// share one database (and so one group commit) under their own names.
    namespace: Arc<str>,
    /// Where files beside the database (log segments) live.
    files: Arc<Files>,
}

/// The directory of a store's files beside its database; a temporary
/// store's is removed when the last handle goes.
struct Files {
    dir: PathBuf,
    temporary: bool,
}

impl Drop for Files {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let path = path.as_ref();
        std::fs::create_dir_all(path)
            .map_err(|e| StoreError::Io(format!("create {}: {e}", path.display())))?;
        let db = sled::Config::new()
            .path(path)
            // sled caches pages up to this (its default is 1 GiB per
            // database); services keep their hot state in their own
            // structures, so a small cache keeps memory flat with history.
            .cache_capacity(CACHE_BYTES)
            // sled's own background flush: what is written without `sync`
            // (e.g. heartbeats) reaches disk within this interval.
            .flush_every_ms(Some(1_000))
            .open()
            .map_err(|e| match StoreError::from(e) {
                StoreError::Io(m) if m.contains("could not acquire lock") => StoreError::Locked {
                    path: path.display().to_string(),
                },
                other => other,
            })?;
        opened_here(path, true);
        Ok(Self::from_db(
            db,
            Files {
                dir: path.to_owned(),
                temporary: false,
            },
        ))
    }

    /// Opens a database, waiting up to `wait` for its lock when this
    /// process opened it before (a restart inside one process, as tests
    /// do): the lock goes when the last handle of the earlier opening
    /// drops, which may be a task of the stopped node still winding down
    /// on this same runtime — so the wait yields to the runtime rather than
    /// blocking its thread (on a one-thread runtime a blocking wait would
    /// keep that task from ever dropping its handle). A lock held at a path
    /// this process never opened is another process's: refused at once.
    /// Other errors return at once.
    pub async fn reopen(
        path: impl AsRef<Path>,
        wait: std::time::Duration,
    ) -> Result<Store, StoreError> {
        let path = path.as_ref();
        let ours = opened_here(path, false);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match Store::open(path) {
                Err(StoreError::Locked { .. })
                    if ours && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                r => return r,
            }
        }
    }

    /// A database that lives in memory and vanishes on drop (tests, benches).
    pub fn temporary() -> Result<Store, StoreError> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "switchyard-store-{}-{n}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| StoreError::Io(format!("create {}: {e}", dir.display())))?;
        let files = Files {
            dir,
            temporary: true,
        };
        Ok(Self::from_db(
            sled::Config::new().temporary(true).open()?,
            files,
        ))
    }

    fn from_db(db: sled::Db, files: Files) -> Store {
        let commit = GroupCommit::start(db.clone());
        Store {
            db,
            commit,
            namespace: Arc::from(""),
            files: Arc::new(files),
        }
    }

    /// Where files beside the database live.
    fn files_dir(&self) -> &Path {
        &self.files.dir
    }

    /// This database under `namespace`: its trees and logs are apart from
    /// every other namespace's, and one flush makes all of them durable, so
    /// services that share a process share each commit instead of paying a
    /// flush (and an fsync) apiece.
    pub fn within(&self, namespace: &str) -> Store {
        Store {
            db: self.db.clone(),
            commit: self.commit.clone(),
            namespace: Arc::from(format!("{}{namespace}/", self.namespace)),
            files: self.files.clone(),
        }
    }

    /// The database's own name of tree `name` in this namespace.
    fn full_name(&self, name: &str) -> String {
        format!("{}{name}", self.namespace)
    }

    /// Opens a typed tree.
    pub fn tree<V: prost::Message + Default>(&self, name: &str) -> Result<Tree<V>, StoreError> {
        Ok(Tree {
            name: name.to_owned(),
            tree: self.db.open_tree(self.full_name(name))?,
            _v: PhantomData,
        })
    }

    /// Waits until every write made before this call is durable on disk.
    /// Concurrent callers share flushes.
    pub async fn sync(&self) -> Result<(), StoreError> {
        self.commit.sync().await
    }

    /// Flushes everything now, blocking (for shutdown).
    pub fn flush_blocking(&self) -> Result<(), StoreError> {
        self.commit.flush_now(&self.db)
    }
}

/// A tree of prost messages keyed by strings, iterated in key order.
pub struct Tree<V> {
    name: String,
    tree: sled::Tree,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for Tree<V> {
    fn clone(&self) -> Self {
        Tree {
            name: self.name.clone(),
            tree: self.tree.clone(),
            _v: PhantomData,
        }
    }
}

impl<V> std::fmt::Debug for Tree<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<V: prost::Message + Default> Tree<V> {
    fn decode(&self, key: &[u8], bytes: &[u8]) -> Result<V, StoreError> {
        V::decode(bytes).map_err(|source| StoreError::Corrupt {
            tree: self.name.clone(),
            key: String::from_utf8_lossy(key).into_owned(),
            source,
        })
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        match self.tree.get(key.as_bytes())? {
            Some(b) => Ok(Some(self.decode(key.as_bytes(), &b)?)),
            None => Ok(None),
        }
    }

    /// Stores `value` under `key` (not yet durable: see [`Store::sync`]).
    pub fn put(&self, key: &str, value: &V) -> Result<(), StoreError> {
        self.tree.insert(key.as_bytes(), value.encode_to_vec())?;
        Ok(())
    }

    /// Removes `key`; true when it existed.
    pub fn remove(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.tree.remove(key.as_bytes())?.is_some())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    /// Every entry in key order.
    pub fn iter(&self) -> impl Iterator<Item = Result<(String, V), StoreError>> + '_ {
        self.entries(self.tree.iter())
    }

    /// The entries whose keys start with `prefix`, in key order.
    pub fn scan_prefix(
        &self,
        prefix: &str,
    ) -> impl Iterator<Item = Result<(String, V), StoreError>> + '_ {
        self.entries(self.tree.scan_prefix(prefix.as_bytes()))
    }

    /// The entries with keys before `key` (all, when `None`), last first.
    pub fn iter_rev_before(
        &self,
        key: Option<&str>,
    ) -> impl Iterator<Item = Result<(String, V), StoreError>> + '_ {
        let range = match key {
            Some(k) => self.tree.range(..k.as_bytes()),
            None => self.tree.range::<&[u8], _>(..),
        };
        self.entries(range.rev())
    }

    /// The entries with keys after `key`, in key order.
    pub fn iter_after(
        &self,
        key: &str,
    ) -> impl Iterator<Item = Result<(String, V), StoreError>> + '_ {
        let range = self.tree.range::<&[u8], _>((
            std::ops::Bound::Excluded(key.as_bytes()),
            std::ops::Bound::Unbounded,
        ));
        self.entries(range)
    }

    /// Removes every entry whose key starts with `prefix`; returns how many.
    pub fn remove_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        let mut n = 0;
        for k in self.tree.scan_prefix(prefix.as_bytes()).keys() {
            self.tree.remove(k?)?;
            n += 1;
        }
        Ok(n)
    }

    fn entries<'a>(
        &'a self,
        it: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> + 'a,
    ) -> impl Iterator<Item = Result<(String, V), StoreError>> + 'a {
        it.map(move |r| {
            let (k, v) = r?;
            let value = self.decode(&k, &v)?;
            Ok((String::from_utf8_lossy(&k).into_owned(), value))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::registry::v1::Tool;

    fn tool(name: &str) -> Tool {
        Tool {
            name: name.into(),
            description: "d".into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_lock_held_where_this_process_never_opened_a_store_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        // Another holder of the lock (as another process would be).
        let _other = sled::Config::new().path(dir.path()).open().unwrap();
        let asked = std::time::Instant::now();
        let r = Store::reopen(dir.path(), std::time::Duration::from_secs(30)).await;
        assert!(matches!(r, Err(StoreError::Locked { .. })), "{:?}", r.err());
        // Not the 30 s a restart in this process may wait.
        assert!(asked.elapsed() < std::time::Duration::from_secs(10));
    }

    /// One runtime thread, as a `#[tokio::test]` has: the earlier opening's
    /// last handle belongs to a task that runs only when the reopening
    /// yields. A wait that blocked the thread would hold the lock for it.
    #[tokio::test]
    async fn reopening_lets_a_task_of_the_same_runtime_drop_the_earlier_handle() {
        let dir = tempfile::tempdir().unwrap();
        let first = Store::open(dir.path()).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = tx.send(());
            tokio::task::yield_now().await;
            drop(first);
        });
        rx.await.unwrap();
        let again = Store::reopen(dir.path(), std::time::Duration::from_secs(5)).await;
        assert!(again.is_ok(), "{:?}", again.err());
    }

    #[tokio::test]
    async fn values_survive_reopen_after_sync() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let t = store.tree::<Tool>("tools").unwrap();
            t.put("b", &tool("b")).unwrap();
            t.put("a", &tool("a")).unwrap();
            assert!(t.remove("b").unwrap());
            assert!(!t.remove("b").unwrap());
            store.sync().await.unwrap();
        }
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10))
            .await
            .unwrap();
        let t = store.tree::<Tool>("tools").unwrap();
        assert_eq!(t.get("a").unwrap().unwrap().name, "a");
        assert!(t.get("b").unwrap().is_none());
        assert_eq!(t.len(), 1);
    }

    #[tokio::test]
    async fn namespaces_share_one_database_and_its_commits_but_not_their_trees() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let (a, b) = (store.within("ledger"), store.within("approval"));
            a.tree::<Tool>("meta")
                .unwrap()
                .put("k", &tool("of a"))
                .unwrap();
            b.tree::<Tool>("meta")
                .unwrap()
                .put("k", &tool("of b"))
                .unwrap();
            let log = b.log::<Tool>("audit").unwrap();
            log.append(|_| tool("logged"));
            // One sync, through either namespace, makes both durable.
            a.sync().await.unwrap();
            assert_eq!(store.commit.flushes(), 1);
        }
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10))
            .await
            .unwrap();
        let read = |ns: &str| {
            store
                .within(ns)
                .tree::<Tool>("meta")
                .unwrap()
                .get("k")
                .unwrap()
                .map(|t| t.name)
        };
        assert_eq!(read("ledger").as_deref(), Some("of a"));
        assert_eq!(read("approval").as_deref(), Some("of b"));
        assert_eq!(store.tree::<Tool>("meta").unwrap().get("k").unwrap(), None);
        assert_eq!(
            store
                .within("approval")
                .log::<Tool>("audit")
                .unwrap()
                .last(),
            1
        );
    }

    #[tokio::test]
    async fn a_flush_one_caller_asked_for_makes_every_log_drained_into_it_durable() {
        let store = Store::temporary().unwrap();
        let (a, b) = (store.within("executor"), store.within("ledger"));
        let log = a.log::<Tool>("events").unwrap();
        let (seq, _) = log.append(|_| tool("event"));
        assert_eq!(log.durable(), 0);
        // The ledger's own sync carries the executor's buffered record.
        b.tree::<Tool>("budgets")
            .unwrap()
            .put("k", &tool("b"))
            .unwrap();
        b.sync().await.unwrap();
        assert_eq!(log.durable(), seq);
        // So waiting for it costs no further flush.
        let before = store.commit.flushes();
        log.make_durable(seq).await.unwrap();
        assert_eq!(store.commit.flushes(), before);
    }

    #[tokio::test]
    async fn iteration_is_in_key_order() {
        let store = Store::temporary().unwrap();
        let t = store.tree::<Tool>("tools").unwrap();
        for n in ["c", "a", "b"] {
            t.put(n, &tool(n)).unwrap();
        }
        let keys: Vec<_> = t.iter().map(|r| r.unwrap().0).collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn prefixes_scan_and_remove_and_reverse_ranges_stop_before_the_key() {
        let store = Store::temporary().unwrap();
        let t = store.tree::<Tool>("tools").unwrap();
        for n in ["a/1", "a/2", "ab", "b/1", "c"] {
            t.put(n, &tool(n)).unwrap();
        }
        let keys = |it: &mut dyn Iterator<Item = Result<(String, Tool), StoreError>>| {
            it.map(|r| r.unwrap().0).collect::<Vec<_>>()
        };
        assert_eq!(keys(&mut t.scan_prefix("a/")), ["a/1", "a/2"]);
        assert_eq!(
            keys(&mut t.iter_rev_before(Some("b/1"))),
            ["ab", "a/2", "a/1"]
        );
        assert_eq!(keys(&mut t.iter_rev_before(None)).len(), 5);
        assert_eq!(t.remove_prefix("a/").unwrap(), 2);
        assert_eq!(keys(&mut t.iter()), ["ab", "b/1", "c"]);
    }

    #[tokio::test]
    async fn corrupt_value_is_an_error_naming_tree_and_key() {
        let store = Store::temporary().unwrap();
        store
            .db
            .open_tree("tools")
            .unwrap()
            .insert("bad", &[0xff, 0xff, 0xff][..])
            .unwrap();
        let t = store.tree::<Tool>("tools").unwrap();
        let err = t.get("bad").unwrap_err().to_string();
        assert!(err.contains("tools") && err.contains("bad"), "{err}");
        assert!(t.iter().next().unwrap().is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_syncs_all_complete_with_every_write_visible() {
        let store = Store::temporary().unwrap();
        let t = store.tree::<Tool>("tools").unwrap();
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (store, t) = (store.clone(), t.clone());
            tasks.push(tokio::spawn(async move {
                t.put(&format!("k{i}"), &tool("x")).unwrap();
                store.sync().await
            }));
        }
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert_eq!(t.len(), 64);
        assert!(store.commit.flushes() >= 1, "a sync must have flushed");
    }
}
