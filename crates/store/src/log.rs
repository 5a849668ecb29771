//! Append-only logs: a sequence of prost records under big-endian `u64` keys
//! (so sled's key order is sequence order), with a durable watermark that
//! readers tail. Ledger journals and approval audit logs are such logs.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::Stream;
use tokio::sync::watch;

use crate::{Store, StoreError};

struct Inner {
    name: String,
    tree: sled::Tree,
    store: Store,
    /// The last sequence handed out.
    last: AtomicU64,
    /// Every record up to this sequence is durable.
    durable: watch::Sender<u64>,
}

/// An append-only log of `V` records numbered from 1. Cheap to clone.
pub struct Log<V> {
    inner: Arc<Inner>,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for Log<V> {
    fn clone(&self) -> Self {
        Log {
            inner: self.inner.clone(),
            _v: PhantomData,
        }
    }
}

impl<V> std::fmt::Debug for Log<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("name", &self.inner.name)
            .field("last", &self.inner.last.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

impl Store {
    /// Opens (creating if needed) the log `name`. Everything found on disk
    /// counts as durable.
    pub fn log<V: prost::Message + Default>(&self, name: &str) -> Result<Log<V>, StoreError> {
        let tree = self.db.open_tree(name)?;
        let last = match tree.last()? {
            Some((k, _)) => <[u8; 8]>::try_from(k.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| {
                    StoreError::Io(format!("log {name} has a key that is not a sequence"))
                })?,
            None => 0,
        };
        Ok(Log {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                tree,
                store: self.clone(),
                last: AtomicU64::new(last),
                durable: watch::channel(last).0,
            }),
            _v: PhantomData,
        })
    }
}

impl<V: prost::Message + Default> Log<V> {
    /// Appends the record `make(sequence)` and returns it with its sequence.
    /// Callers that need records in the order of their own state changes
    /// append while holding their state lock. Not durable until
    /// [`Log::make_durable`].
    pub fn append(&self, make: impl FnOnce(u64) -> V) -> Result<(u64, V), StoreError> {
        let seq = self.inner.last.fetch_add(1, Ordering::SeqCst) + 1;
        let record = make(seq);
        self.inner.tree.insert(key(seq), record.encode_to_vec())?;
        Ok((seq, record))
    }

    /// The last sequence appended (0 when empty).
    pub fn last(&self) -> u64 {
        self.inner.last.load(Ordering::SeqCst)
    }

    /// The highest sequence known durable; tails stop there.
    pub fn durable(&self) -> u64 {
        *self.inner.durable.borrow()
    }

    /// Waits until every record up to `seq` is on disk (sharing flushes with
    /// concurrent callers), then lets tails see them.
    pub async fn make_durable(&self, seq: u64) -> Result<(), StoreError> {
        self.inner.store.sync().await?;
        self.inner.durable.send_if_modified(|d| {
            let moved = seq > *d;
            *d = (*d).max(seq);
            moved
        });
        Ok(())
    }

    /// Up to `limit` records after `after` and at most `upto`, in order.
    pub fn read(&self, after: u64, upto: u64, limit: usize) -> Result<Vec<(u64, V)>, StoreError> {
        if upto <= after {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for r in self
            .inner
            .tree
            .range(key(after + 1)..=key(upto))
            .take(limit)
        {
            let (k, v) = r?;
            let seq = <[u8; 8]>::try_from(k.as_ref())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            let record = V::decode(v.as_ref()).map_err(|source| StoreError::Corrupt {
                tree: self.inner.name.clone(),
                key: seq.to_string(),
                source,
            })?;
            out.push((seq, record));
        }
        Ok(out)
    }

    /// Every record in order (replay at start-up).
    pub fn replay(&self) -> impl Iterator<Item = Result<(u64, V), StoreError>> + '_ {
        const CHUNK: usize = 4096;
        let mut after = 0;
        let mut buf = VecDeque::new();
        let mut failed = false;
        std::iter::from_fn(move || {
            if failed {
                return None;
            }
            if buf.is_empty() {
                match self.read(after, u64::MAX, CHUNK) {
                    Ok(chunk) => buf.extend(chunk),
                    Err(e) => {
                        failed = true;
                        return Some(Err(e));
                    }
                }
            }
            let (seq, v) = buf.pop_front()?;
            after = seq;
            Some(Ok((seq, v)))
        })
    }
}

impl<V: prost::Message + Default + Send + 'static> Log<V> {
    /// The durable records after `after`, then each new one as it becomes
    /// durable. Ends when the log is dropped or on a read error (yielded).
    pub fn tail(
        &self,
        after: u64,
    ) -> impl Stream<Item = Result<(u64, V), StoreError>> + Send + 'static {
        struct Tail<V> {
            log: Log<V>,
            after: u64,
            buf: VecDeque<(u64, V)>,
            rx: watch::Receiver<u64>,
            failed: bool,
        }
        let start = Tail {
            log: self.clone(),
            after,
            buf: VecDeque::new(),
            rx: self.inner.durable.subscribe(),
            failed: false,
        };
        futures_util::stream::unfold(start, |mut t| async move {
            if t.failed {
                return None;
            }
            loop {
                if let Some((seq, v)) = t.buf.pop_front() {
                    t.after = seq;
                    return Some((Ok((seq, v)), t));
                }
                let head = *t.rx.borrow_and_update();
                if head > t.after {
                    match t.log.read(t.after, head, 512) {
                        Ok(chunk) if chunk.is_empty() => t.after = head,
                        Ok(chunk) => t.buf.extend(chunk),
                        Err(e) => {
                            t.failed = true;
                            return Some((Err(e), t));
                        }
                    }
                    continue;
                }
                if t.rx.changed().await.is_err() {
                    return None;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use switchyard_proto::registry::v1::Tool;

    fn tool(name: &str) -> Tool {
        Tool {
            name: name.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn sequences_continue_after_reopen_and_replay_in_order() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let log = store.log::<Tool>("log").unwrap();
            for n in ["a", "b", "c"] {
                log.append(|_| tool(n)).unwrap();
            }
            log.make_durable(3).await.unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let log = store.log::<Tool>("log").unwrap();
        assert_eq!((log.last(), log.durable()), (3, 3));
        let (seq, _) = log.append(|s| tool(&format!("t{s}"))).unwrap();
        assert_eq!(seq, 4);
        let names: Vec<_> = log.replay().map(|r| r.unwrap().1.name).collect();
        assert_eq!(names, ["a", "b", "c", "t4"]);
        assert_eq!(log.read(1, 3, 10).unwrap().len(), 2);
    }

    #[tokio::test]
    async fn tail_sees_only_durable_records_then_follows() {
        let store = Store::temporary().unwrap();
        let log = store.log::<Tool>("log").unwrap();
        log.append(|_| tool("a")).unwrap();
        log.make_durable(1).await.unwrap();
        log.append(|_| tool("b")).unwrap();
        let mut tail = Box::pin(log.tail(0));
        assert_eq!(tail.next().await.unwrap().unwrap().1.name, "a");
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), tail.next()).await;
        assert!(pending.is_err(), "b is not durable yet");
        log.make_durable(2).await.unwrap();
        let (seq, t) = tail.next().await.unwrap().unwrap();
        assert_eq!((seq, t.name.as_str()), (2, "b"));
    }
}
