//! The dead letter: jobs that ended `discarded` and whose spec keeps them
//! (`JobSpec.dead_letter`, OJS `on_exhaustion: "dead_letter"`). An operator
//! lists them (ListJobs with `dead_letter`), retries one — a new round of
//! the same job, approved and budgeted anew — or deletes it for good.

use std::time::Duration;

use switchyard_kit::auth::Principal;
use switchyard_proto::executor::v1::Job;

use crate::Executor;
use crate::error::ExecutorError;

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
        book.settle(job_id, SETTLE).await;
        // A child job runs under its parent's run and budget: only while
        // the parent still runs.
        let parent = book
            .record_any(job_id)
            .await?
            .spec
            .and_then(|s| s.delegation)
            .map(|d| d.parent_job_id)
            .filter(|id| !id.is_empty());
        if let Some(parent) = parent {
            let state = crate::job::job_state(book.record_any(&parent).await?.state);
            if state != switchyard_core::lifecycle::JobState::Active {
                return Err(ExecutorError::ParentNotActive {
                    parent,
                    state: state.as_str().to_owned(),
                });
            }
        }
        book.adopt_dead_letter(job_id).await?;
        let g = book.revive(job_id, &p.subject)?;
        book.durable(g).await?;
        tracing::info!(job_id, by = %p.subject, "dead-lettered job retried");
        self.readmit(job_id, book.now()).await?;
        book.job_any(job_id).await
    }

    /// DeleteDeadLetter: job `job_id` is removed for good.
    pub async fn delete_dead_letter(
        &self,
        p: &Principal,
        job_id: &str,
    ) -> Result<(), ExecutorError> {
        let book = &self.inner.book;
        book.visible(p, job_id).await?;
        book.settle(job_id, SETTLE).await;
        book.delete_dead_letter(job_id).await?;
        tracing::info!(job_id, by = %p.subject, "dead-lettered job deleted");
        Ok(())
    }
}
