//! One `WatchJob` stream: a job's durable events after the watcher's
//! position, then each new one as it becomes durable, ending after the
//! job's final event. While the job is in memory here its events come from
//! there (the ones not cached read from the store by position) as the book
//! says they are durable; otherwise (finished, or run by another member)
//! as stored, read again on each wake-up. Either way the watcher sees one
//! gapless sequence wherever the job runs, across takeovers and restarts.

use std::sync::Arc;

use switchyard_core::lifecycle::JobState;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::WatchDetail;
use tonic::Status;

use crate::book::{JobBook, finished};
use crate::error::ExecutorError;
use crate::events::JobEvent;

/// Events read per query when watching a job as stored.
const STORED_PAGE: u64 = 1000;

/// A watcher's stream.
pub(crate) struct Watch {
    book: Arc<JobBook>,
    id: String,
    /// The last sequence sent (or skipped at this detail).
    sent: u64,
    wanted: fn(&str) -> bool,
    tx: tokio::sync::mpsc::Sender<Result<Event, Status>>,
}

/// What a phase of watching ended with.
enum Then {
    /// The stream is done: the job ended, or the watcher or executor stopped.
    Done,
    /// The job left memory here (retired, handed over) or came into it.
    Moved,
}

impl Watch {
    /// Starts watching job `job_id` after sequence `after`, at `detail`.
    pub(crate) fn start(
        book: Arc<JobBook>,
        job_id: &str,
        after: u64,
        detail: WatchDetail,
    ) -> tokio::sync::mpsc::Receiver<Result<Event, Status>> {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let mut w = Watch {
            book,
            id: job_id.to_owned(),
            sent: after,
            wanted: watched(detail),
            tx,
        };
        tokio::spawn(async move {
            loop {
                let step = match w.held().await {
                    Ok(Then::Moved) => w.stored().await,
                    done => done,
                };
                match step {
                    Ok(Then::Done) => return,
                    Ok(Then::Moved) => {}
                    Err(e) => {
                        let _ = w.tx.send(Err(Status::from(e))).await;
                        return;
                    }
                }
            }
        });
        rx
    }

    /// While the job is in memory here: its durable events.
    async fn held(&mut self) -> Result<Then, ExecutorError> {
        let durable = self
            .book
            .lock()
            .find(&self.id)
            .map(|e| e.durable_to.subscribe());
        let Some(mut durable) = durable else {
            return Ok(Then::Moved);
        };
        loop {
            let upto = *durable.borrow_and_update();
            let Some((batch, upto_read, end)) = self.held_events(upto).await? else {
                return Ok(Then::Moved);
            };
            for ev in batch {
                if self.tx.send(Ok(ev)).await.is_err() {
                    return Ok(Then::Done);
                }
            }
            // Events skipped at this detail count as sent.
            self.sent = self.sent.max(upto_read);
            if end {
                return Ok(Then::Done);
            }
            tokio::select! {
                changed = durable.changed() => if changed.is_err() {
                    // Retired or handed over: read the rest as stored.
                    return Ok(Then::Moved);
                },
                _ = self.tx.closed() => return Ok(Then::Done),
                _ = self.book.shutdown.wait() => return Ok(Then::Done),
            }
        }
    }

    /// The job as stored: its events, read again on each wake-up until it
    /// ends or comes into memory here.
    async fn stored(&mut self) -> Result<Then, ExecutorError> {
        let store = self.book.store.clone();
        let mut wake = store.subscribe(&self.id);
        loop {
            if self.book.lock().find(&self.id).is_some() {
                return Ok(Then::Moved);
            }
            wake.borrow_and_update();
            let page = store
                .events(&self.id, self.sent, self.sent + STORED_PAGE, &[])
                .await?;
            let full = page.len() == STORED_PAGE as usize;
            let mut ending = page.is_empty();
            for ev in page {
                self.sent = ev.sequence;
                // A job's end is its last event unless it is retried (a
                // dead letter's next round): the stored record says.
                ending = ends_watch(&ev);
                if (self.wanted)(&ev.kind) && self.tx.send(Ok(ev)).await.is_err() {
                    return Ok(Then::Done);
                }
            }
            if full {
                continue;
            }
            if ending
                && self.sent > 0
                && let Some(j) = store.record(&self.id).await?
                && finished(crate::job::job_state(j.state))
                && j.last_sequence <= self.sent
            {
                return Ok(Then::Done);
            }
            tokio::select! {
                _ = wake.changed() => {}
                _ = poll(store.poll()) => {}
                _ = self.tx.closed() => return Ok(Then::Done),
                _ = self.book.shutdown.wait() => return Ok(Then::Done),
            }
        }
    }

    /// The job's durable events of the wanted kinds after the last sent,
    /// up to `upto`, in order, while it is in memory here (`None`: it is
    /// not); the last sequence read (events up to it are durable); and
    /// whether they include its final one.
    async fn held_events(
        &self,
        upto: u64,
    ) -> Result<Option<(Vec<Event>, u64, bool)>, ExecutorError> {
        let (after, wanted) = (self.sent, self.wanted);
        // Cached events, and where the rest are: the cache holds the events
        // from its first on (a job resumed or taken over caches only what
        // it records from then).
        let held = self.book.lock().find(&self.id).map(|e| {
            let upto = upto.min(*e.durable_to.borrow()).max(after);
            let first_cached = e.cache.first().map_or(u64::MAX, |c| c.sequence);
            let stored_to = upto.min(first_cached.saturating_sub(1)).max(after);
            let cached: Vec<Event> = e
                .cache
                .iter()
                .filter(|ev| ev.sequence > after && ev.sequence <= upto && wanted(&ev.kind))
                .cloned()
                .collect();
            let positions = e
                .events
                .get(after as usize..stored_to as usize)
                .unwrap_or_default()
                .to_vec();
            // The final state is a job's last event.
            let end = finished(e.state()) && upto >= e.job.last_sequence;
            (cached, positions, stored_to, upto, end)
        });
        let Some((cached, positions, stored_to, upto, end)) = held else {
            return Ok(None);
        };
        let mut batch: Vec<Event> = if stored_to > after {
            self.book
                .store
                .events(&self.id, after, stored_to, &positions)
                .await?
                .into_iter()
                .filter(|ev| wanted(&ev.kind))
                .collect()
        } else {
            Vec::new()
        };
        batch.extend(cached);
        Ok(Some((batch, upto, end)))
    }
}

/// Waits, without polling where the job runs here, until `job_id` has
/// finished and its final event is durable (the point where WatchJob
/// ends). `None` when the executor shuts down first.
pub(crate) async fn until_finished(
    book: &JobBook,
    job_id: &str,
) -> Result<Option<JobState>, ExecutorError> {
    let local = book.lock().find(job_id).map(|e| e.durable_to.subscribe());
    if let Some(mut durable) = local {
        loop {
            let state = book
                .read(job_id, |e| {
                    let state = e.state();
                    (finished(state) && *durable.borrow_and_update() >= e.job.last_sequence)
                        .then_some(state)
                })
                .await?;
            if state.is_some() {
                return Ok(state);
            }
            tokio::select! {
                // Retired (or handed over) meanwhile: where it is
                // stored says how it stands.
                changed = durable.changed() => if changed.is_err() { break },
                _ = book.shutdown.wait() => return Ok(None),
            }
        }
    }
    // Stored (finished, or run by another member): its stored record,
    // looked at on each wake-up. The record's state moves with the
    // final event, in one commit.
    let mut wake = book.store.subscribe(job_id);
    loop {
        let record = book
            .store
            .record(job_id)
            .await?
            .ok_or_else(|| ExecutorError::NotFound(job_id.into()))?;
        let state = crate::job::job_state(record.state);
        if finished(state) {
            return Ok(Some(state));
        }
        tokio::select! {
            _ = wake.changed() => {}
            _ = poll(book.store.poll()) => {}
            _ = book.shutdown.wait() => return Ok(None),
        }
    }
}

/// Waits `every`, or for ever when `None`.
async fn poll(every: Option<std::time::Duration>) {
    match every {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Whether `ev` is a job's move to a state where watching ends.
fn ends_watch(ev: &Event) -> bool {
    matches!(
        JobEvent::decode(&ev.kind, ev.data.as_ref()),
        Ok(Some(JobEvent::JobMoved(m))) if JobState::parse(&m.to).is_some_and(finished)
    )
}

/// Which event kinds WatchJob streams at `detail`.
fn watched(detail: WatchDetail) -> fn(&str) -> bool {
    match detail {
        WatchDetail::Job => |kind| kind == "job.state",
        WatchDetail::Tasks => |kind| kind == "job.state" || kind == "task.state",
        WatchDetail::Unspecified | WatchDetail::All => |_| true,
    }
}
