//! RerunJob: a finished job run again as a new job (issue 47) — afresh,
//! or resumed from where it stopped with the tasks that succeeded kept.
//!
//! The new job is submitted like any other, as the caller: the policies in
//! force approve it (a resumed job's remaining spend is approved again),
//! it gets a budget of its own, and its journal's `job.submitted` names
//! the job it runs again and the tasks it keeps. A kept task's outputs
//! are copied into the new job's record with its first events, so nothing
//! later reads the old job (which may be pruned meanwhile), and the task
//! moves `waiting → succeeded` as the job starts: it is never run again,
//! whatever restarts in between.

use switchyard_core::Reason;
use switchyard_core::lifecycle::TaskState;
use switchyard_kit::auth::Principal;
use switchyard_kit::time::{timestamp, timestamp_ms};
use switchyard_proto::executor::v1::{RerunJobRequest, RerunJobResponse, SubmitJobRequest};
use tonic::Code;

use crate::Executor;
use crate::admission::{BudgetRight, Rerun, Submission, submitter};
use crate::error::ExecutorError;
use crate::job::{job_state, proto_task_state};

impl Executor {
    /// RerunJob for principal `p`, in the request's correlation and trace.
    pub(crate) async fn rerun_job(
        &self,
        p: &Principal,
        req: RerunJobRequest,
        correlation_id: String,
        traceparent: Option<String>,
    ) -> Result<RerunJobResponse, ExecutorError> {
        let book = &self.inner.book;
        let id = req.job_id.as_str();
        // One read: the record, and whether `p` may see it (JobBook::visible's rule).
        let record = match book.record_of(id).await? {
            r if p.may_see(&r.tenant, &r.submitted_by) => r,
            _ => return Err(ExecutorError::NotFound(id.to_owned())),
        };
        let state = job_state(record.state);
        let refuse = |code: Code, reason: Reason, why: String| ExecutorError::NotRerunnable {
            job: id.to_owned(),
            state: state.as_str().to_owned(),
            code,
            reason,
            why,
        };
        if !state.is_terminal() {
            return Err(refuse(
                Code::FailedPrecondition,
                Reason::JobNotFinished,
                format!(
                    "job {id:?} is {}: only a finished job runs again; wait for it, or cancel it first",
                    state.as_str()
                ),
            ));
        }
        let Some(mut spec) = record.spec.clone() else {
            return Err(ExecutorError::NotFound(id.to_owned()));
        };
        if let Some(parent) = spec
            .delegation
            .as_ref()
            .map(|d| d.parent_job_id.clone())
            .filter(|p| !p.is_empty())
        {
            return Err(refuse(
                Code::InvalidArgument,
                Reason::InvalidArgument,
                format!(
                    "job {id:?} is a delegated child of job {parent:?}: it runs again only when its parent does; re-run job {parent:?}"
                ),
            ));
        }
        if req.resume && req.input.is_some() {
            return Err(refuse(
                Code::InvalidArgument,
                Reason::InvalidArgument,
                format!(
                    "a resumed job keeps job {id:?}'s input (the outputs it keeps were made from it): leave the input out, or re-run afresh with the new input"
                ),
            ));
        }
        let kept = if req.resume {
            let done = book.result(id).await?;
            let kept: Vec<_> = done
                .tasks
                .into_iter()
                .filter(|t| t.state == proto_task_state(TaskState::Succeeded) as i32)
                .collect();
            if kept.len() == spec.tasks.len() {
                return Err(refuse(
                    Code::FailedPrecondition,
                    Reason::NothingToResume,
                    format!(
                        "job {id:?} completed: every task succeeded, so a resume would run none; re-run it afresh (without resume)"
                    ),
                ));
            }
            kept
        } else {
            Vec::new()
        };
        // The new job: the same plan, its own id, correlation and clock.
        spec.job_id = req.new_job_id;
        spec.correlation_id.clear();
        if let Some(input) = req.input {
            spec.input = Some(input);
        }
        let now = book.now();
        // It runs now; a deadline keeps the time the job had to finish.
        spec.scheduled_at = None;
        if let (Some(deadline), Some(created)) = (&spec.deadline, &record.created_at) {
            let allowed = timestamp_ms(deadline).saturating_sub(timestamp_ms(created));
            spec.deadline = Some(timestamp(now + allowed));
        }
        let reused_tasks: Vec<String> = kept.iter().map(|t| t.task_id.clone()).collect();
        let how = Submission {
            who: submitter(p),
            delegation_only: false,
            grant: None,
            budgets: BudgetRight::of(p),
            correlation_id,
            traceparent,
            rerun: Some(Rerun {
                of: id.to_owned(),
                kept,
            }),
            fired: None,
        };
        let req = SubmitJobRequest {
            spec: Some(spec),
            ..Default::default()
        };
        let out = self.submit_as(req, how).await?;
        let job = out.job.as_ref();
        tracing::info!(
            rerun_of = id,
            job_id = job
                .and_then(|j| j.spec.as_ref())
                .map_or("", |s| s.job_id.as_str()),
            resumed = !reused_tasks.is_empty(),
            kept = reused_tasks.len(),
            "job run again"
        );
        Ok(RerunJobResponse {
            job: out.job,
            created: out.created,
            reused_tasks,
        })
    }
}
