//! Cancelling a job (`CancelJob`). What the job holds in other services
//! (its approval run and its budget) ends through the outbox.

use std::time::Duration;

use switchyard_core::Reason;
use switchyard_core::lifecycle::{JobState, TaskState};
use switchyard_kit::auth::OnBehalf;
use switchyard_proto::approval::v1 as ap;
use switchyard_proto::executor::v1::Job;

use crate::Executor;
use crate::admission::acting_context;
use crate::book::{Change, JobBook, Jobs};
use crate::error::ExecutorError;
use crate::outbox::RunEnd;
use crate::store::replicas::CancelAsk;

impl Executor {
    /// CancelJob: a running job's driver stops its tasks (SIGTERM, grace,
    /// SIGKILL), releases its reservations and finishes it; a job no driver
    /// runs is cancelled here. Either way its run is cancelled for `who`.
    pub async fn cancel(
        &self,
        job_id: &str,
        why: &str,
        who: Option<OnBehalf>,
    ) -> Result<Job, ExecutorError> {
        let book = &self.inner.book;
        let why = if why.is_empty() {
            "cancelled by request"
        } else {
            why
        };
        // A finished job (perhaps stored only) refuses with its state.
        book.read(job_id, crate::job::JobEntry::state)
            .await?
            .check(JobState::Cancelled)?;
        if book.elsewhere(job_id) {
            // Run by another member (or waiting for one to claim it): the
            // request is stored with the job, and whoever runs it acts.
            let ask = prost::Message::encode_to_vec(&CancelAsk::new(why, who.as_ref()));
            book.cluster.request_cancel(job_id, &ask).await?;
            let limit = self.cancel_limit();
            let _ = tokio::time::timeout(limit, crate::watch::until_finished(book, job_id)).await;
            return book.job(job_id).await;
        }
        self.cancel_here(job_id, why, who).await
    }

    /// How long CancelJob waits for a running job to stop.
    fn cancel_limit(&self) -> Duration {
        Duration::from_millis(self.inner.cfg.kill_grace_ms) + Duration::from_secs(10)
    }

    /// CancelJob of a job in this replica's memory.
    pub(crate) async fn cancel_here(
        &self,
        job_id: &str,
        why: &str,
        who: Option<OnBehalf>,
    ) -> Result<Job, ExecutorError> {
        let book = &self.inner.book;
        let mut finishes = book.finishes();
        let idle = {
            let mut st = book.lock();
            st.get(job_id)?.state().check(JobState::Cancelled)?;
            match st.drivers.get(job_id).cloned() {
                Some(ctl) => {
                    *crate::lock(&ctl.cancel) = Some((why.to_owned(), who.clone()));
                    ctl.wake.notify_one();
                    None
                }
                None => {
                    let g = crate::cancel::cancel_idle(
                        book,
                        &mut st,
                        job_id,
                        Reason::JobCancelled,
                        why,
                    )?;
                    let run = RunEnd::Cancel(why.to_owned(), who);
                    Some((g, self.intend(&st, job_id, run)?))
                }
            }
        };
        let Some((g, intents)) = idle else {
            let limit = self.cancel_limit();
            // Ended: final, and its driver gone (the run and budget settled).
            let ended = async {
                while book.lock().drivers.contains_key(job_id)
                    || !book
                        .job(job_id)
                        .await
                        .is_ok_and(|j| crate::job::job_state(j.state).is_terminal())
                {
                    if finishes.changed().await.is_err() {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(limit, ended).await;
            return book.job(job_id).await;
        };
        book.durable(g).await?;
        self.deliver_now(intents).await;
        book.job(job_id).await
    }

    /// Withdraws approval run `run_id` of a job that was not accepted
    /// (best effort: no job is left to wait for it).
    pub(crate) async fn cancel_run_by_id(&self, run_id: String, why: &str, who: Option<OnBehalf>) {
        if run_id.is_empty() {
            return;
        }
        let call = self.inner.clients.approval.cancel(ap::CancelRequest {
            run_id,
            comment: why.to_owned(),
        });
        // A job driver acts for the submitter; the run is cancelled for the
        // person who cancelled the job.
        let done = match who {
            Some(who) => {
                let corr = switchyard_kit::context::current()
                    .map(|c| c.correlation_id)
                    .unwrap_or_else(switchyard_kit::context::new_correlation_id);
                switchyard_kit::context::scope(acting_context(&corr, who), call).await
            }
            None => call.await,
        };
        if let Err(e) = done
            && !matches!(
                switchyard_kit::error::ApiError::from(e.clone()).known_reason(),
                Some(Reason::RunTerminal)
            )
        {
            tracing::warn!(error = %e.message(), "cancelling approval run");
        }
    }
}

/// Cancels a job that no driver runs: its unfinished tasks, then the job.
pub(crate) fn cancel_idle(
    book: &JobBook,
    st: &mut Jobs,
    job_id: &str,
    reason: Reason,
    why: &str,
) -> Result<u64, ExecutorError> {
    let n = st.get(job_id)?.job.tasks.len();
    for i in 0..n {
        if !st.get(job_id)?.task_state(i).is_terminal() {
            book.move_task(
                st,
                job_id,
                i,
                Change::to(TaskState::Cancelled).because(Reason::JobCancelled, why),
            )?;
        }
    }
    book.move_job(st, job_id, JobState::Cancelled, reason, why)
}
