//! Append-only logs: a sequence of prost records numbered from 1, with a
//! durable watermark that readers tail. Ledger journals, approval audit
//! logs and the executor's job events are such logs.
//!
//! A log lives in segment files of its own beside the database
//! (`logs/<name>/<first sequence>.seg`), not in sled: sled rewrote the pages
//! of a log tree many times over (a job's ~3 KB of events cost ~10× that
//! in writes), while a segment costs each record its own bytes once.
//! Appends encode each record into one in-memory buffer; the group-commit
//! flusher writes the buffer to the active segment with one write before
//! the database's flush and `fdatasync`s it after, so one flush makes the
//! trees and every log durable together. Each frame is
//! `sequence u64 | length u32 | crc32 u32 | record` (big-endian; the CRC
//! covers the sequence, the length and the record). A torn frame at the end
//! of the last segment (a crash mid-write) is cut off at open; a damaged
//! frame anywhere else is an error naming the file and byte. A log an
//! earlier release kept in sled (as chunks of records) is copied into
//! segments once, at open.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures_util::Stream;
use tokio::sync::watch;

use crate::group_commit::Drained;
use crate::{Store, StoreError};

/// A segment is closed and a new one started once it holds this many bytes
/// (pruning drops whole segments).
const SEGMENT_BYTES: u64 = 8 << 20;
/// Records whose sequence is a multiple of this are indexed (their byte
/// offset kept in memory), so a read seeks to within this many records.
const INDEX_EVERY: u64 = 32;
/// Bytes of a frame before its record.
const HEADER: usize = 16;
/// Bytes read at once when scanning a segment from start to end.
const SCAN_BYTES: usize = 256 << 10;
/// Bytes read at once when looking up single records.
const SEEK_BYTES: usize = 16 << 10;

/// One segment file: the records from `first` on, in order.
struct Segment {
    first: u64,
    path: PathBuf,
    file: File,
    /// Bytes of whole frames written.
    len: AtomicU64,
    /// The last sequence written here (`first - 1` while empty).
    last: AtomicU64,
    /// `(sequence, byte offset)` of the indexed records; `None` until a
    /// read needs it (segments found at open are indexed lazily).
    index: Mutex<Option<Vec<(u64, u64)>>>,
}

impl Segment {
    /// A new, empty segment in `dir` for the records from `first` on, its
    /// name durable.
    fn create(dir: &Path, first: u64) -> Result<Arc<Segment>, StoreError> {
        let path = segment_path(dir, first);
        let seg = Segment {
            first,
            file: open_file(&path, true)?,
            path,
            len: AtomicU64::new(0),
            last: AtomicU64::new(first - 1),
            index: Mutex::new(Some(Vec::new())),
        };
        sync_dir(dir)?;
        Ok(Arc::new(seg))
    }

    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn last(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }
}

/// Records appended and not yet written, as frames.
#[derive(Default)]
struct Pending {
    /// The last sequence handed out.
    last: u64,
    /// Encoded frames not yet written, in sequence order.
    frames: Vec<u8>,
    /// `(sequence, offset in frames)` of the indexed records among them.
    marks: Vec<(u64, usize)>,
}

impl Pending {
    /// Buffers record `seq` (the next one), its bytes written by `encode`.
    fn put(&mut self, seq: u64, encode: impl FnOnce(&mut Vec<u8>)) {
        if seq.is_multiple_of(INDEX_EVERY) {
            self.marks.push((seq, self.frames.len()));
        }
        put_frame(&mut self.frames, seq, encode);
        self.last = seq;
    }
}

struct Inner {
    name: String,
    dir: PathBuf,
    segment_bytes: u64,
    /// Every segment by its first sequence; the last one takes appends.
    segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    pending: Mutex<Pending>,
    /// One writer at a time (the flusher, a shutdown flush).
    writing: Mutex<()>,
    /// Every record up to this sequence is durable.
    durable: watch::Sender<u64>,
    /// The highest sequence a caller of [`Log::make_durable`] waits for: a
    /// flush asked for elsewhere leaves this log alone unless it is past
    /// `durable`.
    wanted: std::sync::atomic::AtomicU64,
    store: Store,
}

/// What one frame at the front of some bytes is.
enum Frame<'b> {
    /// A whole, intact frame of `size` bytes.
    Whole {
        seq: u64,
        record: &'b [u8],
        size: usize,
    },
    /// The bytes end before the frame does (it needs `need` bytes).
    Short { need: usize },
    /// The frame's check does not match its bytes.
    Damaged,
}

fn frame(bytes: &[u8]) -> Frame<'_> {
    let Some(header) = bytes.get(..HEADER) else {
        return Frame::Short { need: HEADER };
    };
    let num =
        |r: std::ops::Range<usize>| header[r].iter().fold(0u64, |n, b| n << 8 | u64::from(*b));
    let (seq, len, crc) = (num(0..8), num(8..12) as usize, num(12..16) as u32);
    let Some(record) = bytes.get(HEADER..HEADER + len) else {
        return Frame::Short { need: HEADER + len };
    };
    if checksum(seq, record) != crc {
        return Frame::Damaged;
    }
    Frame::Whole {
        seq,
        record,
        size: HEADER + len,
    }
}

fn checksum(seq: u64, record: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_be_bytes());
    h.update(&(record.len() as u32).to_be_bytes());
    h.update(record);
    h.finalize()
}

/// Appends to `out` the frame of record `seq`, whose bytes `encode` writes.
fn put_frame(out: &mut Vec<u8>, seq: u64, encode: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    encode(out);
    let len = (out.len() - at - HEADER) as u32;
    out[at + 8..at + 12].copy_from_slice(&len.to_be_bytes());
    let crc = checksum(seq, &out[at + HEADER..]);
    out[at + 12..at + 16].copy_from_slice(&crc.to_be_bytes());
}

/// Encodes `m` at the end of `out` (into a Vec it cannot run out of room).
fn encode_into(m: &impl prost::Message, out: &mut Vec<u8>) {
    out.reserve(m.encoded_len());
    let _ = m.encode(out);
}

/// Frames `record` as record `seq` with `with`'s fields after its own.
fn put_beside<V: prost::Message, W: prost::Message>(
    p: &mut Pending,
    seq: u64,
    record: &V,
    with: Option<&W>,
) {
    p.put(seq, |out| {
        encode_into(record, out);
        if let Some(w) = with {
            encode_into(w, out);
        }
    });
}

fn io(what: impl std::fmt::Display, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.seg"))
}

/// Makes entries created or removed in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("sync directory", dir, e))
}

fn open_file(path: &Path, create: bool) -> Result<File, StoreError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)
        .map_err(|e| io("open log segment", path, e))
}

/// Scans the frames of `seg` from byte `from` to `end`, reading `chunk`
/// bytes at a time, and hands each to `each(seq, offset, record)` until it
/// returns false. A damaged or cut frame is an error (`torn_ok`: the end).
/// Returns the offset after the last whole frame read.
fn scan(
    name: &str,
    seg: &Segment,
    from: u64,
    end: u64,
    chunk: usize,
    torn_ok: bool,
    mut each: impl FnMut(u64, u64, &[u8]) -> Result<bool, StoreError>,
) -> Result<u64, StoreError> {
    let damaged = |at: u64| {
        StoreError::Io(format!(
            "log {name} has a damaged record at byte {at} of {}; restore the data directory from a backup",
            seg.path.display()
        ))
    };
    let mut buf: Vec<u8> = Vec::new();
    // The file offset of buf[0].
    let mut base = from;
    let mut want = chunk;
    loop {
        let at = base + buf.len() as u64;
        if at < end {
            let n = (want.max(chunk) as u64).min(end - at) as usize;
            let old = buf.len();
            buf.resize(old + n, 0);
            seg.file
                .read_exact_at(&mut buf[old..], at)
                .map_err(|e| io("read log segment", &seg.path, e))?;
        }
        let mut used = 0;
        loop {
            match frame(&buf[used..]) {
                Frame::Whole { seq, record, size } => {
                    if !each(seq, base + used as u64, record)? {
                        return Ok(base + used as u64);
                    }
                    used += size;
                }
                Frame::Short { need } => {
                    want = need;
                    break;
                }
                Frame::Damaged if torn_ok => return Ok(base + used as u64),
                Frame::Damaged => return Err(damaged(base + used as u64)),
            }
        }
        buf.drain(..used);
        base += used as u64;
        if base + buf.len() as u64 >= end {
            if buf.is_empty() || torn_ok {
                return Ok(base);
            }
            return Err(damaged(base));
        }
    }
}

impl Inner {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn segments(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Arc<Segment>>> {
        self.segments.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes buffered frames to the active segment (the flusher, before
    /// the database's flush); returns what makes them durable. On failure
    /// the frames go back to the front of the buffer, so the next flush
    /// writes them: a failed write loses no record and leaves no gap.
    fn drain(&self) -> Result<Option<(u64, Arc<Segment>)>, StoreError> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let (frames, marks, upto) = {
            let mut p = self.pending();
            if p.frames.is_empty() {
                // Written by a flush that failed later: sync it again.
                let durable = *self.durable.borrow();
                let active = self.segments().values().next_back().cloned();
                return Ok(active
                    .filter(|seg| seg.last() > durable)
                    .map(|seg| (seg.last(), seg)));
            }
            (
                std::mem::take(&mut p.frames),
                std::mem::take(&mut p.marks),
                p.last,
            )
        };
        match self.write(&frames, &marks, upto) {
            Ok(seg) => Ok(Some((upto, seg))),
            Err(e) => {
                let mut p = self.pending();
                let later = std::mem::replace(&mut p.frames, frames);
                let shift = p.frames.len();
                let later_marks = std::mem::replace(&mut p.marks, marks);
                p.frames.extend_from_slice(&later);
                p.marks
                    .extend(later_marks.into_iter().map(|(s, o)| (s, o + shift)));
                Err(e)
            }
        }
    }

    fn write(
        &self,
        frames: &[u8],
        marks: &[(u64, usize)],
        upto: u64,
    ) -> Result<Arc<Segment>, StoreError> {
        // The first frame's sequence (the buffer was framed here).
        let first = frames
            .first_chunk::<8>()
            .map(|b| u64::from_be_bytes(*b))
            .ok_or_else(|| StoreError::Io(format!("log {}: an empty write", self.name)))?;
        let active = self.segments().values().next_back().cloned();
        let seg = match active {
            Some(s) if s.len() < self.segment_bytes || s.last() < s.first => s,
            full => {
                if let Some(s) = full {
                    // Closed: its records are durable before the next
                    // segment's can be.
                    s.file
                        .sync_data()
                        .map_err(|e| io("sync log segment", &s.path, e))?;
                }
                let seg = Segment::create(&self.dir, first)?;
                self.segments
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(first, seg.clone());
                seg
            }
        };
        let at = seg.len();
        seg.file
            .write_all_at(frames, at)
            .map_err(|e| io("write log segment", &seg.path, e))?;
        if let Some(index) = seg.index.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            index.extend(marks.iter().map(|&(s, o)| (s, at + o as u64)));
        }
        seg.len.store(at + frames.len() as u64, Ordering::Release);
        seg.last.store(upto, Ordering::Release);
        Ok(seg)
    }

    /// Every record up to `seq` is on disk: tails may see them.
    fn durable_upto(&self, seq: u64) {
        self.durable.send_if_modified(|d| {
            let moved = seq > *d;
            *d = (*d).max(seq);
            moved
        });
    }

    /// The byte offset in `seg` to scan from for record `seq`: its own or
    /// an earlier indexed record's (indexing the segment first if needed).
    fn offset_of(&self, seg: &Segment, seq: u64) -> Result<u64, StoreError> {
        let mut index = seg.index.lock().unwrap_or_else(|p| p.into_inner());
        if index.is_none() {
            let mut built = Vec::new();
            scan(
                &self.name,
                seg,
                0,
                seg.len(),
                SCAN_BYTES,
                false,
                |s, off, _| {
                    if s.is_multiple_of(INDEX_EVERY) {
                        built.push((s, off));
                    }
                    Ok(true)
                },
            )?;
            *index = Some(built);
        }
        let index = index.as_deref().unwrap_or_default();
        let i = index.partition_point(|&(s, _)| s <= seq);
        Ok(if i == 0 { 0 } else { index[i - 1].1 })
    }

    /// The segments that may hold records from `seq` on, in order.
    fn holding_from(&self, seq: u64) -> Vec<Arc<Segment>> {
        let segs = self.segments();
        let start = segs.range(..=seq).next_back().map_or(0, |(f, _)| *f);
        segs.range(start..).map(|(_, s)| s.clone()).collect()
    }

    /// Opens the segments in `dir`, cutting a torn frame off the last one;
    /// returns them and the last sequence.
    fn open_segments(
        name: &str,
        dir: &Path,
    ) -> Result<(BTreeMap<u64, Arc<Segment>>, u64), StoreError> {
        let mut firsts = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| io("read log directory", dir, e))? {
            let entry = entry.map_err(|e| io("read log directory", dir, e))?;
            let file = entry.file_name();
            let Some(first) = file
                .to_str()
                .and_then(|f| f.strip_suffix(".seg"))
                .and_then(|f| f.parse::<u64>().ok())
            else {
                continue;
            };
            firsts.push(first);
        }
        firsts.sort_unstable();
        let mut segs = BTreeMap::new();
        let mut last = 0;
        for (i, &first) in firsts.iter().enumerate() {
            let path = segment_path(dir, first);
            let file = open_file(&path, false)?;
            let size = file
                .metadata()
                .map_err(|e| io("read log segment", &path, e))?
                .len();
            let seg = Segment {
                first,
                file,
                path,
                len: AtomicU64::new(size),
                last: AtomicU64::new(first.saturating_sub(1)),
                index: Mutex::new(None),
            };
            if let Some(&next) = firsts.get(i + 1) {
                seg.last.store(next - 1, Ordering::Release);
            } else {
                let mut index = Vec::new();
                let mut seen = first.saturating_sub(1);
                let end = scan(name, &seg, 0, size, SCAN_BYTES, true, |s, off, _| {
                    if s.is_multiple_of(INDEX_EVERY) {
                        index.push((s, off));
                    }
                    seen = s;
                    Ok(true)
                })?;
                if end < size {
                    tracing::warn!(
                        log = name,
                        segment = %seg.path.display(),
                        at = end,
                        cut = size - end,
                        "cutting a record torn by a crash off the log's end"
                    );
                    seg.file
                        .set_len(end)
                        .and_then(|()| seg.file.sync_all())
                        .map_err(|e| io("truncate log segment", &seg.path, e))?;
                }
                seg.len.store(end, Ordering::Release);
                seg.last.store(seen, Ordering::Release);
                *seg.index.lock().unwrap_or_else(|p| p.into_inner()) = Some(index);
                last = seen;
            }
            segs.insert(first, Arc::new(seg));
        }
        Ok((segs, last))
    }
}

/// The records of one chunk value of a log an earlier release kept in sled.
fn decode_chunk<'v>(name: &str, value: &'v [u8]) -> Result<Vec<(u64, &'v [u8])>, StoreError> {
    let corrupt =
        |at: usize| StoreError::Io(format!("log {name} has a damaged chunk at byte {at}"));
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

/// Copies a log an earlier release kept in sled tree `tree` into segments
/// at `dir`, then drops the tree. The segments are written beside `dir`
/// and renamed into place whole, so a crash part way leaves the tree to
/// copy again; a crash after the rename finds `dir` and only drops the tree.
fn import_from_sled(
    name: &str,
    db: &sled::Db,
    tree_name: &str,
    dir: &Path,
    segment_bytes: u64,
) -> Result<(), StoreError> {
    if !db
        .tree_names()
        .iter()
        .any(|n| n.as_ref() == tree_name.as_bytes())
    {
        return Ok(());
    }
    let tree = db.open_tree(tree_name)?;
    if !dir.exists() {
        let staging = dir.with_extension("import");
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(|e| io("remove", &staging, e))?;
        }
        std::fs::create_dir_all(&staging).map_err(|e| io("create", &staging, e))?;
        let mut records = 0u64;
        let mut out: Option<(File, PathBuf, u64)> = None;
        let mut buf = Vec::new();
        for r in tree.iter() {
            let (_, value) = r?;
            for (seq, record) in decode_chunk(name, &value)? {
                if out.as_ref().is_none_or(|(_, _, len)| *len >= segment_bytes) {
                    if let Some((f, p, _)) = out.take() {
                        f.sync_all().map_err(|e| io("sync", &p, e))?;
                    }
                    let path = segment_path(&staging, seq);
                    out = Some((open_file(&path, true)?, path, 0));
                }
                let Some((file, path, len)) = out.as_mut() else {
                    continue;
                };
                buf.clear();
                put_frame(&mut buf, seq, |out| out.extend_from_slice(record));
                file.write_all_at(&buf, *len)
                    .map_err(|e| io("write", path, e))?;
                *len += buf.len() as u64;
                records += 1;
            }
        }
        if let Some((f, p, _)) = out.take() {
            f.sync_all().map_err(|e| io("sync", &p, e))?;
        }
        sync_dir(&staging)?;
        std::fs::rename(&staging, dir).map_err(|e| io("rename into place", dir, e))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        tracing::info!(
            log = name,
            records,
            "log moved from the database into segment files"
        );
    }
    db.drop_tree(tree_name)?;
    db.flush()?;
    Ok(())
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

impl Store {
    /// Opens (creating if needed) the log `name`. Everything found on disk
    /// counts as durable. Open each log once per store and share the handle
    /// (it is cheap to clone): two handles would number records separately.
    pub fn log<V: prost::Message + Default>(&self, name: &str) -> Result<Log<V>, StoreError> {
        self.log_with(name, SEGMENT_BYTES)
    }

    fn log_with<V: prost::Message + Default>(
        &self,
        name: &str,
        segment_bytes: u64,
    ) -> Result<Log<V>, StoreError> {
        let full = self.full_name(name);
        let dir = self.files_dir().join("logs").join(&full);
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io("create", parent, e))?;
        }
        import_from_sled(name, &self.db, &full, &dir, segment_bytes)?;
        std::fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
        let (segments, last) = Inner::open_segments(name, &dir)?;
        let inner = Arc::new(Inner {
            name: name.to_owned(),
            dir,
            segment_bytes,
            segments: RwLock::new(segments),
            pending: Mutex::new(Pending {
                last,
                ..Pending::default()
            }),
            writing: Mutex::new(()),
            durable: watch::channel(last).0,
            wanted: std::sync::atomic::AtomicU64::new(last),
            store: self.clone(),
        });
        let weak = Arc::downgrade(&inner);
        self.commit.add_drain(Arc::new(move |all| {
            let Some(inner) = weak.upgrade() else {
                return Ok(None);
            };
            // Nobody waits on this log: its records wait for a flush that
            // someone needs them in (or a database write's, or shutdown's).
            if !all
                && inner.wanted.load(std::sync::atomic::Ordering::Acquire)
                    <= *inner.durable.borrow()
            {
                return Ok(None);
            }
            let Some((upto, seg)) = inner.drain()? else {
                return Ok(None);
            };
            // Held weakly across the flush, as the drain itself is.
            let weak = Arc::downgrade(&inner);
            Ok(Some(Drained {
                sync: Box::new(move || {
                    seg.file
                        .sync_data()
                        .map_err(|e| io("sync log segment", &seg.path, e))
                }),
                done: Box::new(move || {
                    if let Some(inner) = weak.upgrade() {
                        inner.durable_upto(upto);
                    }
                }),
            }))
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
        self.append_beside::<V>(make, None)
    }

    /// Appends the record `make(sequence)` with `with` kept beside it (as
    /// [`Log::append_ref`] keeps it). `make` runs with the log's buffer
    /// held: whatever it writes to the database is flushed no later than
    /// the record is synced, so a durable record never refers to a write
    /// that was lost.
    pub fn append_beside<W: prost::Message>(
        &self,
        make: impl FnOnce(u64) -> V,
        with: Option<&W>,
    ) -> (u64, V) {
        let mut p = self.inner.pending();
        let seq = p.last + 1;
        let record = make(seq);
        put_beside(&mut p, seq, &record, with);
        (seq, record)
    }

    /// Appends `record` (borrowed: nothing is cloned) and returns its
    /// sequence. `with`, when given, is stored in the same record after it:
    /// a reader of `V` skips its fields (protobuf skips unknown fields) and
    /// [`Log::read_each_as`] reads them, so something kept beside a record
    /// is durable exactly when the record is. `W`'s field numbers must be
    /// ones `V` never uses.
    pub fn append_ref<W: prost::Message>(&self, record: &V, with: Option<&W>) -> u64 {
        let mut p = self.inner.pending();
        let seq = p.last + 1;
        put_beside(&mut p, seq, record, with);
        seq
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
        // Said before the ticket is taken, so the flush that covers the
        // ticket sees it.
        self.inner
            .wanted
            .fetch_max(seq, std::sync::atomic::Ordering::AcqRel);
        self.inner.store.commit.sync_wanted().await?;
        self.inner.durable_upto(seq);
        Ok(())
    }

    /// Up to `limit` written records after `after` and at most `upto`, in order.
    pub fn read(&self, after: u64, upto: u64, limit: usize) -> Result<Vec<(u64, V)>, StoreError> {
        self.read_as(after, upto, limit)
    }

    /// [`Log::read`], decoding each record as `W` (e.g. what
    /// [`Log::append_beside`] kept beside it).
    pub fn read_as<W: prost::Message + Default>(
        &self,
        after: u64,
        upto: u64,
        limit: usize,
    ) -> Result<Vec<(u64, W)>, StoreError> {
        let mut out = Vec::new();
        if upto <= after || limit == 0 {
            return Ok(out);
        }
        for seg in self.inner.holding_from(after + 1) {
            if seg.last() <= after {
                continue;
            }
            if seg.first > upto {
                break;
            }
            let from = self.inner.offset_of(&seg, after + 1)?;
            let mut full = false;
            scan(
                &self.inner.name,
                &seg,
                from,
                seg.len(),
                SCAN_BYTES,
                false,
                |seq, _, bytes| {
                    if seq <= after {
                        return Ok(true);
                    }
                    if seq > upto || out.len() == limit {
                        full = true;
                        return Ok(false);
                    }
                    out.push((seq, self.decode_as(seq, bytes)?));
                    Ok(true)
                },
            )?;
            if full {
                break;
            }
        }
        Ok(out)
    }

    fn decode_as<W: prost::Message + Default>(
        &self,
        seq: u64,
        bytes: &[u8],
    ) -> Result<W, StoreError> {
        W::decode(bytes).map_err(|source| StoreError::Corrupt {
            tree: self.inner.name.clone(),
            key: seq.to_string(),
            source,
        })
    }

    /// The written records at `seqs` (ascending), in order. Records no
    /// longer in the log (pruned) are left out; so are repeated or
    /// out-of-order ones (a caller holding an index it does not trust
    /// sorts it first, as the executor's reads do).
    pub fn read_each(&self, seqs: &[u64]) -> Result<Vec<(u64, V)>, StoreError> {
        self.read_each_as(seqs)
    }

    /// [`Log::read_each`], decoding each record as `W` (e.g. what
    /// [`Log::append_ref`] kept beside it).
    pub fn read_each_as<W: prost::Message + Default>(
        &self,
        seqs: &[u64],
    ) -> Result<Vec<(u64, W)>, StoreError> {
        let mut out = Vec::with_capacity(seqs.len());
        let Some(&lowest) = seqs.first() else {
            return Ok(out);
        };
        let segs = self.inner.holding_from(lowest);
        let mut i = 0;
        for (k, seg) in segs.iter().enumerate() {
            let end_seq = segs.get(k + 1).map_or(u64::MAX, |n| n.first);
            while let Some(&want) = seqs.get(i) {
                if want >= end_seq {
                    break;
                }
                if want < seg.first || want > seg.last() {
                    // Pruned, or not written yet.
                    i += 1;
                    continue;
                }
                let from = self.inner.offset_of(seg, want)?;
                let before = i;
                // Scan on while the next wanted records follow closely.
                let near = |n: u64, seq: u64| n < end_seq && n >= seq && n - seq < INDEX_EVERY;
                scan(
                    &self.inner.name,
                    seg,
                    from,
                    seg.len(),
                    SEEK_BYTES,
                    false,
                    |seq, _, bytes| {
                        while seqs.get(i).is_some_and(|&s| s < seq) {
                            i += 1;
                        }
                        match seqs.get(i) {
                            Some(&s) if s == seq => {
                                out.push((seq, self.decode_as(seq, bytes)?));
                                i += 1;
                                Ok(seqs.get(i).is_some_and(|&n| near(n, seq)))
                            }
                            Some(&s) => Ok(near(s, seq)),
                            None => Ok(false),
                        }
                    },
                )?;
                if i == before {
                    // Not in the segment after all: go on with the next.
                    i += 1;
                }
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
        after: u64,
    ) -> impl Iterator<Item = Result<(u64, V), StoreError>> + '_ {
        self.replay_after_as(after)
    }

    /// [`Log::replay_after`], decoding each record as `W`.
    pub fn replay_after_as<'a, W: prost::Message + Default + 'a>(
        &'a self,
        mut after: u64,
    ) -> impl Iterator<Item = Result<(u64, W), StoreError>> + 'a {
        const CHUNK: usize = 4096;
        let mut buf = VecDeque::new();
        let mut failed = false;
        std::iter::from_fn(move || {
            if failed {
                return None;
            }
            if buf.is_empty() {
                match self.read_as(after, u64::MAX, CHUNK) {
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

    /// Removes the written records before `seq`, a whole segment at a time
    /// (so some may stay). When every record of the last segment is before
    /// `seq`, a new empty segment named after the next sequence takes its
    /// place, so numbering goes on. Returns how many records were removed.
    pub fn prune_before(&self, seq: u64) -> Result<u64, StoreError> {
        let _writing = self.inner.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut segs = self
            .inner
            .segments
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let firsts: Vec<u64> = segs.keys().copied().collect();
        let mut removed = 0;
        for pair in firsts.windows(2) {
            let (first, next) = (pair[0], pair[1]);
            // This segment holds [first, next).
            if next > seq {
                break;
            }
            if let Some(s) = segs.remove(&first) {
                std::fs::remove_file(&s.path).map_err(|e| io("remove log segment", &s.path, e))?;
                removed += next - first;
            }
        }
        let whole = segs
            .values()
            .next_back()
            .filter(|s| s.last() >= s.first && s.last() < seq && s.first < seq)
            .cloned();
        if let Some(old) = whole {
            // Written writes (under `writing`) all went to `old`; what is
            // appended next starts the new segment.
            let next = old.last() + 1;
            // The new name is durable before the old file goes: a crash
            // between leaves both, and the numbering either way.
            let fresh = Segment::create(&self.inner.dir, next)?;
            segs.insert(next, fresh);
            segs.remove(&old.first);
            std::fs::remove_file(&old.path).map_err(|e| io("remove log segment", &old.path, e))?;
            removed += next - old.first;
        }
        if removed > 0 {
            sync_dir(&self.inner.dir)?;
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
    use prost::Message;
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
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10))
            .await
            .unwrap();
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
    async fn a_log_nobody_waits_on_is_not_synced_by_another_logs_flush() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let quiet = store.log::<Tool>("quiet").unwrap();
        let busy = store.log::<Tool>("busy").unwrap();
        quiet.append(|_| tool("a"));
        busy.append(|_| tool("b"));
        busy.make_durable(1).await.unwrap();
        assert_eq!(busy.durable(), 1);
        assert_eq!(
            quiet.durable(),
            0,
            "another log's waiter does not pay for this log's sync"
        );
        assert!(
            quiet.read(0, 1, 10).unwrap().is_empty(),
            "tails stop at durable"
        );
        // A database write's flush (and shutdown's) takes every log.
        store.sync().await.unwrap();
        assert_eq!(quiet.durable(), 1);
        quiet.append(|_| tool("c"));
        quiet.make_durable(2).await.unwrap();
        assert_eq!(quiet.read(0, 2, 10).unwrap().len(), 2);
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
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(store.log::<Tool>("log").unwrap().last(), 1);
    }

    /// Segments roll at flushes past this size (a few dozen small records).
    const SMALL: u64 = 1_000;

    /// Appends batches of `t{seq}` records, one flush each: with
    /// [`SMALL`] segments, each batch after the first starts a segment.
    async fn batches(log: &Log<Tool>, sizes: &[usize]) {
        for &batch in sizes {
            for _ in 0..batch {
                log.append(|s| tool(&format!("t{s}")));
            }
            log.make_durable(log.last()).await.unwrap();
        }
    }

    fn segment_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("logs/log"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn reads_cross_segment_boundaries_at_any_start() {
        let store = Store::temporary().unwrap();
        let log = store.log_with::<Tool>("log", SMALL).unwrap();
        // Segments [1..=300], [301..=400], [401..=407].
        batches(&log, &[300, 100, 7]).await;
        for after in [0, 1, 31, 32, 255, 299, 300, 301, 399, 406] {
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
        let want = [1, 2, 63, 64, 65, 200, 300, 301, 333, 400, 407, 500];
        let picked: Vec<u64> = log
            .read_each(&want)
            .unwrap()
            .iter()
            .map(|(s, t)| {
                assert_eq!(t.name, format!("t{s}"));
                *s
            })
            .collect();
        assert_eq!(
            picked,
            want[..11],
            "every written record, none past the end"
        );
        assert_eq!(log.prune_before(301).unwrap(), 300);
        let after_prune: Vec<u64> = log
            .read_each(&[1, 256, 300, 301])
            .unwrap()
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(after_prune, [301], "pruned records are left out");
    }

    #[tokio::test]
    async fn pruning_drops_whole_segments_before_the_position_and_numbering_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let log = store.log_with::<Tool>("log", SMALL).unwrap();
            batches(&log, &[300, 100, 7]).await;
            assert_eq!(
                log.prune_before(400).unwrap(),
                300,
                "only [1, 301) lies wholly before 400"
            );
            assert_eq!(log.read(0, 407, 1_000).unwrap()[0].0, 301);
            assert_eq!(log.replay_after(300).next().unwrap().unwrap().0, 301);
            assert_eq!(
                log.prune_before(405).unwrap(),
                100,
                "[401, 408) holds 405 on"
            );
            assert_eq!(
                log.prune_before(u64::MAX).unwrap(),
                7,
                "all of it, the last segment too"
            );
            assert!(log.read(0, 407, 10).unwrap().is_empty());
            store.sync().await.unwrap();
        }
        // An empty segment named after the next sequence: numbering goes on
        // after a restart.
        assert_eq!(segment_files(dir.path()), ["00000000000000000408.seg"]);
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10))
            .await
            .unwrap();
        let log = store.log::<Tool>("log").unwrap();
        assert_eq!((log.last(), log.durable()), (407, 407));
        assert_eq!(log.replay().count(), 0);
        batches(&log, &[2]).await;
        assert_eq!(
            log.replay().map(|r| r.unwrap().0).collect::<Vec<_>>(),
            [408, 409]
        );
    }

    #[tokio::test]
    async fn a_record_torn_by_a_crash_is_cut_off_and_numbering_goes_on_after_the_last_whole_one() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let log = store.log::<Tool>("log").unwrap();
            batches(&log, &[40]).await;
        }
        let seg = dir.path().join("logs/log/00000000000000000001.seg");
        let whole = std::fs::metadata(&seg).unwrap().len();
        // A crash mid-write: the next frame's header and half its record.
        let mut torn = Vec::new();
        put_frame(&mut torn, 41, |out| {
            encode_into(&tool("a record cut short"), out)
        });
        torn.truncate(HEADER + 5);
        let f = OpenOptions::new().append(true).open(&seg).unwrap();
        std::io::Write::write_all(&mut &f, &torn).unwrap();
        drop(f);
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10))
            .await
            .unwrap();
        let log = store.log::<Tool>("log").unwrap();
        assert_eq!((log.last(), log.durable()), (40, 40));
        assert_eq!(
            std::fs::metadata(&seg).unwrap().len(),
            whole,
            "the torn bytes are gone"
        );
        batches(&log, &[2]).await;
        let names: Vec<String> = log.replay_after(38).map(|r| r.unwrap().1.name).collect();
        assert_eq!(names, ["t39", "t40", "t41", "t42"]);
    }

    #[tokio::test]
    async fn a_damaged_record_before_the_end_is_an_error_naming_its_file_and_byte() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let log = store.log_with::<Tool>("log", SMALL).unwrap();
        batches(&log, &[60, 10]).await;
        // Flip one byte of record 2's name in the closed first segment.
        let seg = dir.path().join("logs/log/00000000000000000001.seg");
        let mut bytes = std::fs::read(&seg).unwrap();
        let second = HEADER + tool("t1").encoded_len();
        bytes[second + HEADER + 2] ^= 0xff;
        std::fs::write(&seg, &bytes).unwrap();
        let err = log.read(0, 70, 100).unwrap_err().to_string();
        assert!(
            err.contains(&format!("damaged record at byte {second} of")) && err.contains(".seg"),
            "{err}"
        );
        // Records elsewhere still read.
        assert_eq!(log.read(60, 70, 100).unwrap().len(), 10);
    }

    #[tokio::test]
    async fn a_log_an_earlier_release_kept_in_the_database_moves_to_segments_once() {
        let dir = tempfile::tempdir().unwrap();
        {
            // The earlier layout: chunks of `seq u64 | len u32 | record`
            // under the chunk's first sequence.
            let store = Store::open(dir.path()).unwrap();
            let tree = store.db.open_tree("ns/log").unwrap();
            for (first, last) in [(1u64, 256u64), (257, 300)] {
                let mut value = Vec::new();
                for seq in first..=last {
                    let r = tool(&format!("t{seq}")).encode_to_vec();
                    value.extend_from_slice(&seq.to_be_bytes());
                    value.extend_from_slice(&(r.len() as u32).to_be_bytes());
                    value.extend_from_slice(&r);
                }
                tree.insert(first.to_be_bytes(), value).unwrap();
            }
            store.db.flush().unwrap();
        }
        for round in 0..2 {
            let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10))
                .await
                .unwrap();
            let log = store.within("ns").log::<Tool>("log").unwrap();
            assert!(
                !store
                    .db
                    .tree_names()
                    .iter()
                    .any(|n| n.as_ref() == b"ns/log")
            );
            assert_eq!(log.last(), 300 + round, "round {round}");
            let all: Vec<(u64, String)> = log
                .replay()
                .map(|r| r.map(|(s, t)| (s, t.name)).unwrap())
                .collect();
            assert_eq!(all.len() as u64, 300 + round);
            assert!(all.iter().all(|(s, n)| *n == format!("t{s}")));
            log.append(|s| tool(&format!("t{s}")));
            log.make_durable(log.last()).await.unwrap();
        }
    }

    /// Kept beside a [`Tool`] record, under a field number `Tool` never uses.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Beside {
        #[prost(string, tag = "1000")]
        note: String,
    }

    #[tokio::test]
    async fn what_is_kept_beside_a_record_is_read_only_by_who_asks_for_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let log = store.log::<Tool>("log").unwrap();
            log.append(|_| tool("plain"));
            let beside = Beside {
                note: "kept".into(),
            };
            assert_eq!(log.append_ref(&tool("with"), Some(&beside)), 2);
            assert_eq!(log.append_ref(&tool("without"), None::<&Beside>), 3);
            log.make_durable(3).await.unwrap();
        }
        let store = Store::reopen(dir.path(), std::time::Duration::from_secs(10))
            .await
            .unwrap();
        let log = store.log::<Tool>("log").unwrap();
        let names: Vec<String> = log.replay().map(|r| r.unwrap().1.name).collect();
        assert_eq!(names, ["plain", "with", "without"]);
        assert_eq!(
            log.read_each(&[2]).unwrap()[0].1,
            tool("with"),
            "no trace of it in the record"
        );
        let notes: Vec<(u64, String)> = log
            .read_each_as::<Beside>(&[1, 2, 3])
            .unwrap()
            .into_iter()
            .map(|(s, b)| (s, b.note))
            .collect();
        assert_eq!(
            notes,
            [(1, String::new()), (2, "kept".into()), (3, String::new())]
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
