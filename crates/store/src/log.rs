//! Append-only logs: a sequence of prost records numbered from 1, with a
//! durable watermark that readers tail. Ledger journals and approval audit
//! logs are such logs.
//!
//! Appends only encode the record into an in-memory buffer; the group-commit
//! flusher moves the buffer into sled as chunks (one key per chunk, the key
//! being the chunk's first sequence, big-endian so key order is sequence
//! order) right before it flushes. One sled write per flush instead of one
//! per record is what lets a log take over 100k durable appends a second.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use futures_util::Stream;
use tokio::sync::watch;

use crate::{Store, StoreError};

/// Most records written under one key, so chunks stay small sled values.
const CHUNK_RECORDS: usize = 256;

#[derive(Default)]
struct Pending {
    /// The last sequence handed out.
    last: u64,
    /// Encoded records not yet written to sled, in sequence order.
    records: Vec<(u64, Vec<u8>)>,
}

struct Inner {
    name: String,
    tree: sled::Tree,
    pending: Mutex<Pending>,
    /// Every record up to this sequence is durable.
    durable: watch::Sender<u64>,
    store: Store,
}

impl Inner {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes buffered records as chunks (called by the flusher thread);
    /// returns the last sequence written, durable once the flush after it
    /// succeeds.
    fn drain(&self) -> Result<u64, StoreError> {
        let (records, upto) = {
            let mut p = self.pending();
            (std::mem::take(&mut p.records), p.last)
        };
        for chunk in records.chunks(CHUNK_RECORDS) {
            let mut value = Vec::with_capacity(chunk.iter().map(|(_, r)| r.len() + 12).sum());
            for (seq, r) in chunk {
                value.extend_from_slice(&seq.to_be_bytes());
                value.extend_from_slice(&(r.len() as u32).to_be_bytes());
                value.extend_from_slice(r);
            }
            self.tree.insert(key(chunk[0].0), value)?;
        }
        Ok(upto)
    }

    /// Every record up to `seq` is on disk: tails may see them.
    fn durable_upto(&self, seq: u64) {
        self.durable.send_if_modified(|d| {
            let moved = seq > *d;
            *d = (*d).max(seq);
            moved
        });
    }

    /// The records of one chunk value.
    fn decode_chunk<'v>(&self, value: &'v [u8]) -> Result<Vec<(u64, &'v [u8])>, StoreError> {
        let corrupt = |at: usize| {
            StoreError::Io(format!(
                "log {} has a damaged chunk at byte {at}",
                self.name
            ))
        };
        let mut out = Vec::new();
        let mut rest = value;
        while !rest.is_empty() {
            let at = value.len() - rest.len();
            let (seq, tail) = rest.split_at_checked(8).ok_or_else(|| corrupt(at))?;
            let (len, tail) = tail.split_at_checked(4).ok_or_else(|| corrupt(at))?;
            let seq = u64::from_be_bytes(seq.try_into().map_err(|_| corrupt(at))?);
            let len = u32::from_be_bytes(len.try_into().map_err(|_| corrupt(at))?) as usize;
            let (record, tail) = tail.split_at_checked(len).ok_or_else(|| corrupt(at))?;
            out.push((seq, record));
            rest = tail;
        }
        Ok(out)
    }
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
            .finish_non_exhaustive()
    }
}

fn key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

impl Store {
    /// Opens (creating if needed) the log `name`. Everything found on disk
    /// counts as durable. Open each log once per store and share the handle
    /// (it is cheap to clone): two handles would number records separately.
    pub fn log<V: prost::Message + Default>(&self, name: &str) -> Result<Log<V>, StoreError> {
        let tree = self.db.open_tree(self.full_name(name))?;
        let inner = Arc::new(Inner {
            name: name.to_owned(),
            tree,
            pending: Mutex::default(),
            durable: watch::channel(0).0,
            store: self.clone(),
        });
        let last = match inner.tree.last()? {
            Some((_, v)) => inner.decode_chunk(&v)?.last().map_or(0, |(seq, _)| *seq),
            None => 0,
        };
        inner.pending().last = last;
        inner.durable.send_replace(last);
        let weak = Arc::downgrade(&inner);
        self.commit.add_drain(Arc::new(move || {
            let Some(inner) = weak.upgrade() else {
                return Ok(None);
            };
            let upto = inner.drain()?;
            // Held weakly across the flush, as the drain itself is.
            let weak = Arc::downgrade(&inner);
            let flushed: Box<dyn FnOnce() + Send> = Box::new(move || {
                if let Some(inner) = weak.upgrade() {
                    inner.durable_upto(upto);
                }
            });
            Ok(Some(flushed))
        }));
        Ok(Log {
            inner,
            _v: PhantomData,
        })
    }
}

impl<V: prost::Message + Default> Log<V> {
    /// Appends the record `make(sequence)` and returns it with its sequence.
    /// Callers that need records in the order of their own state changes
    /// append while holding their state lock. Not durable until
    /// [`Log::make_durable`].
    pub fn append(&self, make: impl FnOnce(u64) -> V) -> (u64, V) {
        let mut p = self.inner.pending();
        let seq = p.last + 1;
        let record = make(seq);
        p.records.push((seq, record.encode_to_vec()));
        p.last = seq;
        (seq, record)
    }

    /// The last sequence appended (0 when empty).
    pub fn last(&self) -> u64 {
        self.inner.pending().last
    }

    /// The highest sequence known durable; tails stop there.
    pub fn durable(&self) -> u64 {
        *self.inner.durable.borrow()
    }

    /// Waits until every record up to `seq` is on disk (sharing flushes with
    /// concurrent callers), then lets tails see them.
    pub async fn make_durable(&self, seq: u64) -> Result<(), StoreError> {
        if self.durable() >= seq {
            // Another caller's flush (of this store or a namespace sharing
            // its database) already carried it.
            return Ok(());
        }
        self.inner.store.sync().await?;
        self.inner.durable_upto(seq);
        Ok(())
    }

    /// Up to `limit` written records after `after` and at most `upto`, in order.
    pub fn read(&self, after: u64, upto: u64, limit: usize) -> Result<Vec<(u64, V)>, StoreError> {
        let mut out = Vec::new();
        if upto <= after || limit == 0 {
            return Ok(out);
        }
        // Start at the chunk holding `after + 1`: the last one starting at or before it.
        let start = match self.inner.tree.range(..=key(after + 1)).next_back() {
            Some(r) => r?.0.to_vec(),
            None => key(after + 1).to_vec(),
        };
        for r in self.inner.tree.range(start..) {
            let (_, value) = r?;
            for (seq, bytes) in self.inner.decode_chunk(&value)? {
                if seq <= after {
                    continue;
                }
                if seq > upto || out.len() == limit {
                    return Ok(out);
                }
                out.push((seq, self.decode(seq, bytes)?));
            }
        }
        Ok(out)
    }

    fn decode(&self, seq: u64, bytes: &[u8]) -> Result<V, StoreError> {
        V::decode(bytes).map_err(|source| StoreError::Corrupt {
            tree: self.inner.name.clone(),
            key: seq.to_string(),
            source,
        })
    }

    /// The written records at `seqs` (ascending), in order, decoding each
    /// chunk that holds some of them once. Records no longer in the log
    /// (pruned) are left out.
    pub fn read_each(&self, seqs: &[u64]) -> Result<Vec<(u64, V)>, StoreError> {
        let mut out = Vec::with_capacity(seqs.len());
        let mut i = 0;
        while let Some(&want) = seqs.get(i) {
            // The chunk holding `want`: the last one starting at or before it.
            let Some(found) = self.inner.tree.range(..=key(want)).next_back() else {
                i += 1;
                continue;
            };
            let (_, value) = found?;
            let before = i;
            for (seq, bytes) in self.inner.decode_chunk(&value)? {
                while seqs.get(i).is_some_and(|&s| s < seq) {
                    i += 1;
                }
                if seqs.get(i) == Some(&seq) {
                    out.push((seq, self.decode(seq, bytes)?));
                    i += 1;
                }
            }
            if i == before {
                // Not in the log any more.
                i += 1;
            }
        }
        Ok(out)
    }

    /// Every written record in order (replay at start-up).
    pub fn replay(&self) -> impl Iterator<Item = Result<(u64, V), StoreError>> + '_ {
        self.replay_after(0)
    }

    /// Every written record after `after`, in order (replay from a
    /// checkpoint).
    pub fn replay_after(
        &self,
        mut after: u64,
    ) -> impl Iterator<Item = Result<(u64, V), StoreError>> + '_ {
        const CHUNK: usize = 4096;
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

    /// Removes the written records before `seq`, a whole chunk at a time
    /// (so some may stay), never the last chunk (it numbers what comes
    /// next). Returns how many records were removed. Not durable until the
    /// store syncs.
    pub fn prune_before(&self, seq: u64) -> Result<u64, StoreError> {
        let mut removed = 0;
        let mut keys = self.inner.tree.iter().keys();
        let Some(first) = keys.next() else {
            return Ok(0);
        };
        let mut start = first?;
        for next in keys {
            let next = next?;
            let next_seq = u64::from_be_bytes(next.as_ref().try_into().map_err(|_| {
                StoreError::Io(format!("log {} has a malformed chunk key", self.inner.name))
            })?);
            // This chunk holds [start, next_seq).
            if next_seq > seq {
                break;
            }
            let start_seq = u64::from_be_bytes(start.as_ref().try_into().unwrap_or([0; 8]));
            self.inner.tree.remove(&start)?;
            removed += next_seq - start_seq;
            start = next;
        }
        Ok(removed)
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
                log.append(|_| tool(n));
            }
            log.make_durable(3).await.unwrap();
        }
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10)).unwrap();
        let log = store.log::<Tool>("log").unwrap();
        assert_eq!((log.last(), log.durable()), (3, 3));
        let (seq, _) = log.append(|s| tool(&format!("t{s}")));
        assert_eq!(seq, 4);
        log.make_durable(4).await.unwrap();
        let names: Vec<_> = log.replay().map(|r| r.unwrap().1.name).collect();
        assert_eq!(names, ["a", "b", "c", "t4"]);
        assert_eq!(log.read(1, 3, 10).unwrap().len(), 2);
    }

    #[tokio::test]
    async fn records_buffered_at_close_are_written_by_the_final_flush() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let log = store.log::<Tool>("log").unwrap();
            log.append(|_| tool("a"));
            store.flush_blocking().unwrap();
        }
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10)).unwrap();
        assert_eq!(store.log::<Tool>("log").unwrap().last(), 1);
    }

    #[tokio::test]
    async fn reads_cross_chunk_boundaries_at_any_start() {
        let store = Store::temporary().unwrap();
        let log = store.log::<Tool>("log").unwrap();
        // Three flushes of uneven size make chunks [1..=300] split at 256, then 301.., 401..
        for batch in [300, 100, 7] {
            for _ in 0..batch {
                log.append(|s| tool(&format!("t{s}")));
            }
            log.make_durable(log.last()).await.unwrap();
        }
        for after in [0, 1, 255, 256, 299, 300, 399, 406] {
            let got = log.read(after, 407, 1_000).unwrap();
            assert_eq!(got.len() as u64, 407 - after, "after {after}");
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, (s, t))| *s == after + 1 + i as u64 && t.name == format!("t{s}"))
            );
        }
        assert_eq!(
            log.read(250, 260, 3)
                .unwrap()
                .iter()
                .map(|r| r.0)
                .collect::<Vec<_>>(),
            [251, 252, 253]
        );
        assert_eq!(log.replay().count(), 407);
        let picked: Vec<u64> = log
            .read_each(&[1, 2, 256, 257, 300, 301, 407, 500])
            .unwrap()
            .iter()
            .map(|(s, t)| {
                assert_eq!(t.name, format!("t{s}"));
                *s
            })
            .collect();
        assert_eq!(picked, [1, 2, 256, 257, 300, 301, 407]);
        log.prune_before(300).unwrap();
        let after_prune: Vec<u64> = log
            .read_each(&[1, 256, 257, 301])
            .unwrap()
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(after_prune, [257, 301], "pruned records are left out");
    }

    #[tokio::test]
    async fn pruning_drops_whole_chunks_before_the_position_never_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let log = store.log::<Tool>("log").unwrap();
            // Chunks start at 1, 257, 301, 401.
            for batch in [300, 100, 7] {
                for _ in 0..batch {
                    log.append(|s| tool(&format!("t{s}")));
                }
                log.make_durable(log.last()).await.unwrap();
            }
            assert_eq!(
                log.prune_before(300).unwrap(),
                256,
                "only [1, 257) lies wholly before 300"
            );
            assert_eq!(log.read(0, 407, 1_000).unwrap()[0].0, 257);
            assert_eq!(log.replay_after(300).next().unwrap().unwrap().0, 301);
            assert_eq!(log.prune_before(u64::MAX).unwrap(), 144);
            store.sync().await.unwrap();
        }
        // The last chunk stays: numbering goes on after a restart.
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10)).unwrap();
        let log = store.log::<Tool>("log").unwrap();
        assert_eq!(log.last(), 407);
        assert_eq!(
            log.replay().map(|r| r.unwrap().0).collect::<Vec<_>>(),
            (401..=407).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn tail_sees_only_durable_records_then_follows() {
        let store = Store::temporary().unwrap();
        let log = store.log::<Tool>("log").unwrap();
        log.append(|_| tool("a"));
        log.make_durable(1).await.unwrap();
        log.append(|_| tool("b"));
        let mut tail = Box::pin(log.tail(0));
        assert_eq!(tail.next().await.unwrap().unwrap().1.name, "a");
        let pending = tokio::time::timeout(std::time::Duration::from_millis(50), tail.next()).await;
        assert!(pending.is_err(), "b is not durable yet");
        log.make_durable(2).await.unwrap();
        let (seq, t) = tail.next().await.unwrap().unwrap();
        assert_eq!((seq, t.name.as_str()), (2, "b"));
    }
}
