//! Group commit: callers take a ticket and wait until a flush that started
//! after their ticket has succeeded. One flusher thread runs flushes back to
//! back, each covering every ticket issued before it started. Dropping the
//! handle stops and joins the thread, so the database is released at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

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
    stop: bool,
}

struct Shared {
    tickets: Mutex<Tickets>,
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

    /// Flushes run so far.
    #[cfg(test)]
    pub(crate) fn flushes(&self) -> u64 {
        self.shared.flushes.load(Ordering::Relaxed)
    }

    pub(crate) async fn sync(&self) -> Result<(), StoreError> {
        let ticket = {
            let mut t = self
                .shared
                .tickets
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            t.wanted += 1;
            t.wanted
        };
        self.shared.wake.notify_one();
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
    loop {
        let (target, stop) = {
            let mut t = shared.tickets.lock().unwrap_or_else(|p| p.into_inner());
            while t.wanted == done && !t.stop {
                t = shared.wake.wait(t).unwrap_or_else(|p| p.into_inner());
            }
            (t.wanted, t.stop)
        };
        if target > done {
            let result = db.flush();
            shared.flushes.fetch_add(1, Ordering::Relaxed);
            shared.progress.send_modify(|p| match &result {
                Ok(_) => p.durable_through = target,
                Err(e) => {
                    tracing::error!(error = %e, "store flush failed");
                    p.failed_through = target;
                    p.failure = Some(e.to_string());
                }
            });
            done = target;
        }
        if stop {
            let _ = db.flush();
            return;
        }
    }
}
