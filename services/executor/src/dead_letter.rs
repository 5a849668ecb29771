//! The dead letter: jobs that ended `discarded` and whose spec keeps them
//! (`JobSpec.dead_letter`, OJS `on_exhaustion: "dead_letter"`). An operator
//! lists them (ListJobs with `dead_letter`), retries one — a new round of
//! the same job, approved and budgeted anew — or deletes it for good.

use std::time::Duration;

use switchyard_core::Reason;
use switchyard_core::lifecycle::JobState;
use switchyard_kit::auth::Principal;
use switchyard_proto::executor::v1::Job;

use crate::Executor;
use crate::book::{JobBook, dead_lettered};
use crate::error::ExecutorError;
use crate::events::{self, JobEvent};

/// How long a retry or delete waits for a job that has just ended to be
/// wound up (its run and budget settled, its record retired).
const SETTLE: Duration = Duration::from_secs(5);

impl Executor {
    /// RetryDeadLetter: job `job_id` starts a new round, as `p`. Answers
    /// with the job once its new round is admitted (or waits in `pending`
    /// for a service that is down, or for a person to approve it).
    pub async fn retry_dead_letter(
        &self,
        p: &Principal,
        job_id: &str,
    ) -> Result<Job, ExecutorError> {
        let book = &self.inner.book;
        book.visible(p, job_id).await?;
        settle(book, job_id, SETTLE).await;
        // A child job runs under its parent's run and budget: only while
        // the parent still runs.
        let parent = book
            .record_of(job_id)
            .await?
            .spec
            .and_then(|s| s.delegation)
            .map(|d| d.parent_job_id)
            .filter(|id| !id.is_empty());
        if let Some(parent) = parent {
            let state = crate::job::job_state(book.record_of(&parent).await?.state);
            if state != switchyard_core::lifecycle::JobState::Active {
                return Err(ExecutorError::ParentNotActive {
                    parent,
                    state: state.as_str().to_owned(),
                });
            }
        }
        let g = revive(book, job_id, &p.subject).await?;
        book.durable(g).await?;
        tracing::info!(job_id, by = %p.subject, "dead-lettered job retried");
        self.readmit(job_id, book.now()).await?;
        book.job(job_id).await
    }

    /// DeleteDeadLetter: job `job_id` is removed for good.
    pub async fn delete_dead_letter(
        &self,
        p: &Principal,
        job_id: &str,
    ) -> Result<(), ExecutorError> {
        let book = &self.inner.book;
        book.visible(p, job_id).await?;
        settle(book, job_id, SETTLE).await;
        delete(book, job_id).await?;
        tracing::info!(job_id, by = %p.subject, "dead-lettered job deleted");
        Ok(())
    }
}

/// Waits (up to `within`) until no driver runs job `id` and it is
/// retired if it is final: a job that has just ended is still being
/// wound up for a moment (its run and budget settled).
async fn settle(book: &JobBook, id: &str, within: Duration) {
    let mut finishes = book.finishes();
    let until = tokio::time::Instant::now() + within;
    loop {
        book.retire(&[id.to_owned()]);
        let busy = {
            let st = book.lock();
            st.drivers.contains_key(id) || st.find(id).is_some_and(|e| e.state().is_terminal())
        };
        if !busy {
            return;
        }
        if tokio::time::timeout_at(until, finishes.changed())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Job `id` as the dead letter holds it, or why it is not there.
async fn dead_letter(book: &JobBook, id: &str) -> Result<Job, ExecutorError> {
    let job = book.record_of(id).await?;
    if dead_lettered(&job) {
        return Ok(job);
    }
    Err(not_in_dead_letter(id, &job))
}

/// Starts round `round` of dead-lettered job `id`, for `by`: taken back
/// into memory (claimed anew where jobs are shared), its tasks reset and
/// the job `pending` (admission follows). Returns the last event
/// recorded.
async fn revive(book: &JobBook, id: &str, by: &str) -> Result<u64, ExecutorError> {
    if book.lock().find(id).is_none() {
        dead_letter(book, id).await?;
        match book.cluster.adopt_finished(id).await? {
            Some(epoch) => {
                book.adopt(id, epoch, false).await?;
            }
            // Retried by another member meanwhile.
            None => return Err(not_in_dead_letter(id, &book.record_of(id).await?)),
        }
    }
    let mut st = book.lock();
    let e = st.get(id)?;
    if !dead_lettered(&e.job) {
        // Not in the dead letter, or retried by someone else meanwhile.
        return Err(not_in_dead_letter(id, &e.job));
    }
    if st.drivers.contains_key(id) {
        return Err(winding_up(id));
    }
    let round = e.job.round + 1;
    book.store.reopen(id, st.first_event())?;
    let ev = JobEvent::Revived(events::Revived {
        round,
        by: by.to_owned(),
    });
    book.record(&mut st, id, "", ev);
    book.move_job(&mut st, id, JobState::Pending, Reason::InvalidArgument, "")
}

/// Removes dead-lettered job `id` for good.
async fn delete(book: &JobBook, id: &str) -> Result<(), ExecutorError> {
    let job = dead_letter(book, id).await?;
    {
        let mut st = book.lock();
        if st.drivers.contains_key(id) {
            return Err(winding_up(id));
        }
        st.forget(id);
    }
    book.store.delete(id, &job).await
}

/// Why job `j` (`id`) is not in the dead letter.
fn not_in_dead_letter(id: &str, j: &Job) -> ExecutorError {
    let state = crate::job::job_state(j.state);
    let why = match state {
        JobState::Discarded => " without dead_letter in its spec",
        JobState::BudgetPaused => {
            " — paused by its budget, not failed: `switchyard job resume` approves the extension it asks for (an approver other than its submitter), and it goes on where it stopped; `switchyard job cancel` ends it"
        }
        _ => "",
    };
    ExecutorError::NotInDeadLetter {
        job: id.to_owned(),
        state: state.as_str().to_owned(),
        why,
    }
}

/// A dead-lettered job that has only just ended: its driver still settles
/// its run and budget.
fn winding_up(id: &str) -> ExecutorError {
    ExecutorError::NotInDeadLetter {
        job: id.to_owned(),
        state: JobState::Discarded.as_str().to_owned(),
        why: " and still being wound up (its run and budget settled); ask again in a moment",
    }
}
