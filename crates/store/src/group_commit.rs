//! Group commit: callers take a ticket and wait until a flush that started
//! after their ticket has succeeded. One flusher thread runs flushes back to
//! back, each covering every ticket issued before it started. Before each
//! flush it runs the registered drains, which write buffered log records to
//! their segment files, so a log pays one write per flush instead of one per
//! record; after the database's flush it syncs what they wrote. A flush
//! asked for by a log's own waiters ([`GroupCommit::sync_wanted`]) syncs
//! only the logs someone waits on; one asked for by [`GroupCommit::sync`]
//! (a database write) syncs them all.
//! Dropping the handle stops and joins the thread, so the database is
//! released at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::StoreError;

#[derive(Debug, Clone, Default)]
struct Progress {
    /// Every ticket up to this one is durable.
    durable_through: u64,
    /// The latest failed flush covered tickets up to this one.
    failed_through: u64,
    failure: Option<String>,
}

#[derive(Default)]
struct Tickets {
    wanted: u64,
    /// The last ticket that wants every log synced (not only the logs
    /// someone waits on).
    all_wanted: u64,
    stop: bool,
    /// The flusher is waiting for a ticket (only then is it worth waking).
    idle: bool,
    /// The flusher is gathering callers and wants waking at this many tickets.
    gather_until: Option<u64>,
}

/// When flushes run back to back (the last one finished this recently),
/// callers kept arriving while it ran, yet each covers only a few callers,
/// the flusher waits up to this long for [`GATHER_AT_LEAST`] callers before
/// flushing again: a sled flush costs about as much CPU as it takes time,
/// and on a small machine that CPU is taken from the callers themselves.
/// Large batches (callers arrive faster than flushes) never wait, and
/// neither does a sequential chain of callers (each waits for the flush
/// before it makes the next ticket, so none arrives during a flush), even
/// when several services share the database and its flushes, nor a chain
/// with one write of its own running beside it (a background release):
/// gathering needs at least two callers arriving during a flush.
const GATHER_WINDOW: Duration = Duration::from_micros(300);
const BUSY: Duration = Duration::from_millis(1);
/// Callers worth one flush under load.
const GATHER_AT_LEAST: u64 = 16;

/// Told how long each flush took (the process's metrics), when set.
static FLUSH_OBSERVER: std::sync::OnceLock<fn(std::time::Duration)> = std::sync::OnceLock::new();

/// Has every store of this process report each flush's duration to
/// `observe` (set once; later calls are ignored). The store knows no
/// metrics library; the binary connects it.
pub fn observe_flushes(observe: fn(std::time::Duration)) {
    let _ = FLUSH_OBSERVER.set(observe);
}

/// Writes buffered records out; runs on the flusher thread before each
/// flush. Returns how to make them durable. Told `all` when the flush must
/// make every buffer's writes durable; otherwise a log nobody waits on
/// keeps its records for a later flush (on a small disk each sync is a
/// tenth of a millisecond on the path of whoever asked for the flush).
pub(crate) type Drain = Arc<dyn Fn(bool) -> Result<Option<Drained>, StoreError> + Send + Sync>;

/// What a drain wrote, to finish once the database has flushed.
pub(crate) struct Drained {
    /// Makes the writes durable. Runs after the database's flush: a crash
    /// between the two leaves the database ahead of the logs, never behind,
    /// as when the logs were sled trees.
    pub(crate) sync: Box<dyn FnOnce() -> Result<(), StoreError> + Send>,
    /// Runs once every part of the flush succeeded (a log marking what it
    /// wrote as durable).
    pub(crate) done: Box<dyn FnOnce() + Send>,
}

struct Shared {
    tickets: Mutex<Tickets>,
    drains: Mutex<Vec<Drain>>,
    wake: Condvar,
    progress: watch::Sender<Progress>,
    flushes: AtomicU64,
}

pub(crate) struct GroupCommit {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl GroupCommit {
    pub(crate) fn start(db: sled::Db) -> Arc<GroupCommit> {
        let shared = Arc::new(Shared {
            tickets: Mutex::new(Tickets::default()),
            drains: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            progress: watch::channel(Progress::default()).0,
            flushes: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("store-flush".into())
            .spawn(move || flusher(&s, db))
            .expect("spawning the store flusher thread");
        Arc::new(GroupCommit {
            shared,
            thread: Some(thread),
        })
    }

    /// Runs `drain` before every flush from now on.
    pub(crate) fn add_drain(&self, drain: Drain) {
        self.shared
            .drains
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(drain);
    }

    /// Drains, flushes `db` and syncs now, blocking (shutdown).
    pub(crate) fn flush_now(&self, db: &sled::Db) -> Result<(), StoreError> {
        flush_once(&self.shared, db, true)
    }

    /// Flushes run so far.
    #[cfg(test)]
    pub(crate) fn flushes(&self) -> u64 {
        self.shared.flushes.load(Ordering::Relaxed)
    }

    /// Waits for a flush that writes and syncs every log's buffer.
    pub(crate) async fn sync(&self) -> Result<(), StoreError> {
        self.ticket(true).await
    }

    /// Waits for a flush that syncs the logs someone waits on (each says so
    /// before it asks).
    pub(crate) async fn sync_wanted(&self) -> Result<(), StoreError> {
        self.ticket(false).await
    }

    async fn ticket(&self, all: bool) -> Result<(), StoreError> {
        let ticket = {
            let mut t = self
                .shared
                .tickets
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            t.wanted += 1;
            if all {
                t.all_wanted = t.wanted;
            }
            let wake = t.idle || t.gather_until.is_some_and(|g| t.wanted >= g);
            (t.wanted, wake)
        };
        let (ticket, wake) = ticket;
        if wake {
            self.shared.wake.notify_one();
        }
        let mut rx = self.shared.progress.subscribe();
        loop {
            {
                let p = rx.borrow_and_update();
                if p.durable_through >= ticket {
                    return Ok(());
                }
                if p.failed_through >= ticket {
                    return Err(StoreError::Io(p.failure.clone().unwrap_or_default()));
                }
            }
            if rx.changed().await.is_err() {
                return Err(StoreError::Closed);
            }
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.shared
            .tickets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn flusher(shared: &Shared, db: sled::Db) {
    let mut done = 0u64;
    let mut last_flush = Instant::now() - BUSY;
    let mut last_batch = 0;
    // Callers that took a ticket while the last flush ran.
    let mut arrived_during = 0;
    loop {
        let (target, all, stop) = {
            let mut t = shared.tickets.lock().unwrap_or_else(|p| p.into_inner());
            while t.wanted == done && !t.stop {
                t.idle = true;
                t = shared.wake.wait(t).unwrap_or_else(|p| p.into_inner());
            }
            t.idle = false;
            let goal = done + GATHER_AT_LEAST;
            let few = (2..GATHER_AT_LEAST).contains(&last_batch) && arrived_during >= 2;
            if !t.stop && few && last_flush.elapsed() < BUSY && t.wanted < goal {
                t.gather_until = Some(goal);
                let deadline = Instant::now() + GATHER_WINDOW;
                while t.wanted < goal && !t.stop {
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        break;
                    };
                    t = shared
                        .wake
                        .wait_timeout(t, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                t.gather_until = None;
            }
            (t.wanted, t.all_wanted > done, t.stop)
        };
        if target > done {
            let started = Instant::now();
            let result = flush_once(shared, &db, all);
            shared.flushes.fetch_add(1, Ordering::Relaxed);
            last_flush = Instant::now();
            if let Some(observe) = FLUSH_OBSERVER.get() {
                observe(last_flush - started);
            }
            last_batch = target - done;
            arrived_during = shared
                .tickets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .wanted
                .saturating_sub(target);
            shared.progress.send_modify(|p| match &result {
                Ok(_) => p.durable_through = target,
                Err(e) => {
                    tracing::error!(error = %e, "store write or flush failed");
                    p.failed_through = target;
                    p.failure = Some(e.to_string());
                }
            });
            done = target;
        }
        if stop {
            if let Err(e) = flush_once(shared, &db, true) {
                tracing::error!(error = %e, "writing buffered records at close failed");
            }
            return;
        }
    }
}

/// One flush: every drain writes (`all`: every log, else the logs someone
/// waits on), the database flushes, what the drains wrote is synced, and
/// only then is any of it marked durable.
fn flush_once(shared: &Shared, db: &sled::Db, all: bool) -> Result<(), StoreError> {
    let drains = shared
        .drains
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut drained = Vec::new();
    for d in &drains {
        drained.extend(d(all)?);
    }
    db.flush()?;
    let mut done = Vec::with_capacity(drained.len());
    for d in drained {
        (d.sync)()?;
        done.push(d.done);
    }
    done.into_iter().for_each(|f| f());
    Ok(())
}
