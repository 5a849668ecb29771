//! Per-call approval: a model's call of a risky tool waits for a person.
//!
//! The task does not run the tool. It keeps the loop's checkpoint beside
//! the log, records `task.awaiting_approval` and moves to
//! `awaiting_approval` (durable before anything else happens), proposes an
//! approval run for that one call — tool, arguments, what the model said,
//! the job and task — and waits for the decision, holding no budget (the
//! loop reserves per model call, and no call is in flight). Approved, the
//! run is claimed and completed and the tool runs; rejected, cancelled or
//! undecided past `[executor.tool_approval] timeout_secs`, the model is
//! told the call was refused and why, and goes on. Either way
//! `task.approval_decided` records who decided and the task is `running`
//! again.
//!
//! A restart while the call waits keeps it waiting: the driver resumes the
//! same attempt from the checkpoint, the run (its id kept in the log) is
//! proposed again idempotently, and its decision —
//! taken before or after the restart — releases the call exactly once.

use std::time::Duration;

use futures_util::StreamExt as _;
use switchyard_core::Reason;
use switchyard_core::lifecycle::TaskState;
use switchyard_kit::json::struct_to_json;
use switchyard_llm::agent::{Checkpoint, Gate};
use switchyard_proto::approval::v1 as ap;

use crate::Executor;
use crate::book::Change;
use crate::depend::Service;
use crate::error::ExecutorError;
use crate::events::{self, JobEvent};

/// A person's decision about a run.
pub(crate) struct Decided {
    /// `approved`, `rejected`, `cancelled` or `timed_out`.
    pub(crate) decision: &'static str,
    /// Who decided.
    pub(crate) by: String,
    /// Their comment.
    pub(crate) comment: String,
}

/// Proposes `run` for a person to decide: no policy approves it, and
/// nobody claims it (the decision is all). Idempotent by run id; an
/// unreachable approval service is waited for (`waiter`); a refusal is
/// returned.
pub(crate) async fn propose_for_person(
    x: &Executor,
    waiter: &crate::depend::Waiter<'_>,
    run: ap::Run,
) -> Result<(), String> {
    let left = x.job_remaining(&run.job_id);
    let req = ap::ProposeRequest {
        run: Some(run),
        skip_policies: true,
        approved_under: String::new(),
        claim: None,
        budget_left: crate::admission::budget_left(left),
    };
    let approval = &x.inner.clients.approval;
    waiter
        .call(Service::Approval, || approval.propose(req.clone()))
        .await
        .map(|_| ())
        .map_err(|e| e.message().to_owned())
}

/// Waits for run `run_id`'s decision until `deadline_ms`; `None` when
/// nobody decided by then. The run's watch replays its past events, so a
/// decision taken while nobody watched is seen; an approval service that
/// is away is watched again after a pause growing to the configured most.
pub(crate) async fn decided(x: &Executor, run_id: &str, deadline_ms: u64) -> Option<Decided> {
    let book = &x.inner.book;
    let approval = &x.inner.clients.approval;
    let mut pause = Duration::from_millis(50);
    loop {
        let left = Duration::from_millis(deadline_ms.saturating_sub(book.now()));
        if left.is_zero() {
            return None;
        }
        let watch = async {
            let req = ap::WatchRequest {
                run_id: run_id.to_owned(),
                after_sequence: 0,
            };
            let mut stream = approval.watch(req).await.ok()?;
            // Replayed events carry the run as it is now: the decision is
            // the last deciding event once the run shows it.
            let mut last: Option<(&'static str, String, String)> = None;
            while let Some(Ok(w)) = stream.next().await {
                let Some(e) = w.event else { continue };
                let data = e.data.as_ref().map(struct_to_json).unwrap_or_default();
                let field = |k: &str| data[k].as_str().unwrap_or_default().to_owned();
                let kind = match e.kind.as_str() {
                    "run.approved" | "run.break_glass_approved" => Some("approved"),
                    "run.rejected" => Some("rejected"),
                    "run.cancelled" => Some("cancelled"),
                    "run.failed" => Some("cancelled"),
                    _ => None,
                };
                if let Some(k) = kind {
                    last = Some((k, field("actor"), field("reason")));
                }
                let status = w.run.map(|r| r.status).unwrap_or_default();
                let shown = match ap::RunStatus::try_from(status) {
                    Ok(
                        ap::RunStatus::Approved | ap::RunStatus::Running | ap::RunStatus::Completed,
                    ) => "approved",
                    Ok(ap::RunStatus::Rejected) => "rejected",
                    Ok(ap::RunStatus::Cancelled | ap::RunStatus::Failed) => "cancelled",
                    _ => continue,
                };
                if let Some((k, by, comment)) = &last
                    && *k == shown
                {
                    return Some(Decided {
                        decision: shown,
                        by: by.clone(),
                        comment: comment.clone(),
                    });
                }
            }
            None
        };
        match tokio::time::timeout(left, watch).await {
            Ok(Some(d)) => return Some(d),
            Ok(None) => {
                // The approval service is away: watch again shortly.
                tokio::time::sleep(pause.min(left)).await;
                pause = (pause * 2).min(Duration::from_millis(x.inner.cfg.dependency_retry_max_ms));
            }
            Err(_) => return None,
        }
    }
}

/// Where the checkpoint of task `task_id`'s waiting call is kept.
fn checkpoint_key(job_id: &str, task_id: &str) -> String {
    format!("{job_id}/{task_id}")
}

impl Executor {
    /// The checkpoint of task `task_id`'s waiting call, if any.
    pub(crate) async fn checkpoint(
        &self,
        job_id: &str,
        task_id: &str,
    ) -> Result<Option<Checkpoint>, ExecutorError> {
        let Some(bytes) = self
            .inner
            .checkpoints
            .get(&checkpoint_key(job_id, task_id))
            .await?
        else {
            return Ok(None);
        };
        Ok(serde_json::from_slice(&bytes).ok())
    }
}

/// What one gated call needs from its task.
pub(crate) struct CallGate<'a> {
    pub(crate) x: &'a Executor,
    pub(crate) snap: &'a super::Snapshot,
    pub(crate) model: &'a str,
    pub(crate) waiter: crate::depend::Waiter<'a>,
    /// The call's price when known (shown to the approver; unknown counts
    /// as above any two-person threshold).
    pub(crate) price: Option<i64>,
}

impl CallGate<'_> {
    /// Asks for and waits for the decision about the first pending call
    /// of `at`.
    pub(crate) async fn ask(&self, at: &Checkpoint) -> Gate {
        let Some(call) = at.pending.first() else {
            return Gate::Run;
        };
        let (job_id, task_id) = (self.snap.job_id.as_str(), self.snap.task.id.as_str());
        // What the model said alongside its calls: the text of its message.
        let said = at
            .messages
            .iter()
            .rev()
            .find(|m| m.tool_calls.iter().any(|c| c.id == call.id))
            .map(|m| m.content.trim().chars().take(2000).collect::<String>())
            .unwrap_or_default();
        let timeout = self.x.inner.cfg.tool_approval.timeout_secs;
        let paused = match self.pause(at, &said, timeout).await {
            Ok(p) => p,
            Err(e) => {
                return refused(
                    Reason::StorageFailure,
                    format!("the call could not be put to a person: {e}"),
                );
            }
        };
        // If this wait is abandoned (the job is cancelled), the run is
        // withdrawn too; a shutdown leaves it for the restarted attempt.
        let run_id = paused.run_id.clone();
        let mut withdraw = Withdraw {
            x: self.x.clone(),
            run_id: Some(run_id.clone()),
            checkpoint: checkpoint_key(job_id, task_id),
        };
        let decided = match self.propose(at, &run_id, &said, &paused.edited_by).await {
            Ok(()) => self.decision(&run_id, paused.deadline_ms).await,
            Err(e) => Decided {
                decision: "cancelled",
                by: String::new(),
                comment: format!("the approval service refused the call's run: {e}"),
            },
        };
        withdraw.run_id = None;
        let mut decided = decided;
        let mut edit = None;
        if decided.decision == "approved" {
            match self.edit_of(&run_id).await {
                Ok(e) => edit = e,
                // The approval cannot be read back, so how it was approved
                // (perhaps with an edit) is unknown: the call does not run.
                Err(why) => {
                    decided = Decided {
                        decision: "cancelled",
                        by: decided.by,
                        comment: format!("the approved call could not be read back: {why}"),
                    };
                }
            }
            self.release_run(&run_id).await;
        }
        let edited = edit
            .as_ref()
            .map(|e| format!("{}({})", e.tool, e.arguments))
            .unwrap_or_default();
        if let Err(e) = self
            .resume_task(&run_id, &call.id, &call.name, &decided, edited)
            .await
        {
            tracing::error!(job_id, task_id, error = %e, "recording a tool call's decision");
        }
        match decided.decision {
            "approved" => match edit {
                Some(e) => Gate::Edited {
                    tool: e.tool,
                    arguments: e.arguments,
                    by: e.by,
                },
                None => Gate::Run,
            },
            "timed_out" => refused(
                Reason::ToolApprovalTimeout,
                format!(
                    "nobody approved this call of {:?} within {timeout} s, so it did not run; do without it or explain why it is needed",
                    call.name
                ),
            ),
            d => {
                let by = if decided.by.is_empty() {
                    String::new()
                } else {
                    format!(" by {}", decided.by)
                };
                let comment = if decided.comment.is_empty() {
                    String::new()
                } else {
                    format!(": {}", decided.comment)
                };
                refused(
                    Reason::ToolCallRejected,
                    format!(
                        "this call of {:?} was {d}{by}{comment}; it did not run",
                        call.name
                    ),
                )
            }
        }
    }

    /// Keeps the checkpoint, records `task.awaiting_approval` under a new
    /// run id and moves the task there, durably — unless it already waits
    /// for this call (an attempt resumed after a restart: the same run).
    /// The run id is random, so nobody can propose the run first.
    async fn pause(
        &self,
        at: &Checkpoint,
        said: &str,
        timeout: u64,
    ) -> Result<Paused, ExecutorError> {
        let (x, snap) = (self.x, self.snap);
        let book = &x.inner.book;
        let call = &at.pending[0];
        let g = {
            let mut st = book.lock();
            let e = st.get(&snap.job_id)?;
            if let Some(a) = e
                .awaiting
                .get(&snap.task.id)
                .filter(|a| a.call_id == call.id && a.attempt == snap.attempt)
            {
                return Ok(Paused {
                    run_id: a.run_id.clone(),
                    deadline_ms: a.deadline_ms,
                    edited_by: a.edited_by.clone(),
                });
            }
            let run_id = format!("call-{}", uuid::Uuid::now_v7());
            let i = e.index.get(&snap.task.id).copied().unwrap_or_default();
            let bytes = serde_json::to_vec(at).unwrap_or_default();
            x.inner
                .checkpoints
                .put(&checkpoint_key(&snap.job_id, &snap.task.id), &bytes)?;
            let deadline_ms = book.now() + timeout.saturating_mul(1000);
            let ev = events::AwaitingApproval {
                run_id: run_id.clone(),
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: call.arguments.clone(),
                reason: said.to_owned(),
                attempt: snap.attempt,
                timeout_secs: timeout,
                deadline_ms,
                edited_by: at.edited_by.clone(),
            };
            book.record(
                &mut st,
                &snap.job_id,
                &snap.task.id,
                JobEvent::AwaitingApproval(ev),
            );
            let why = format!("tool call {:?} awaits approval run {run_id}", call.name);
            let c = Change::to(TaskState::AwaitingApproval).because(Reason::ApprovalRequired, &why);
            let g = book.move_task(&mut st, &snap.job_id, i, c)?;
            (
                g,
                Paused {
                    run_id,
                    deadline_ms,
                    edited_by: at.edited_by.clone(),
                },
            )
        };
        book.durable(g.0).await?;
        Ok(g.1)
    }

    /// Proposes the call's run (idempotent: the same run after a restart).
    async fn propose(
        &self,
        at: &Checkpoint,
        run_id: &str,
        said: &str,
        edited_by: &str,
    ) -> Result<(), String> {
        let (x, snap) = (self.x, self.snap);
        let call = &at.pending[0];
        let (org, job_run, hash, labels) = {
            let st = x.inner.book.lock();
            let e = st.get(&snap.job_id).map_err(|e| e.to_string())?;
            let org = e.spec().labels.get("org").cloned();
            let labels = e.spec().labels.clone();
            (org, e.job.run_id.clone(), e.context_hash.clone(), labels)
        };
        let run = ap::Run {
            schema_version: "agent_run_spec/v1".into(),
            run_id: run_id.to_owned(),
            target: Some(ap::Target {
                org: org.unwrap_or_else(|| x.inner.cfg.default_org.clone()),
                repo: String::new(),
                work_item_ids: vec![snap.job_id.clone()],
            }),
            intent: format!(
                "call tool {} in job {} (task {})",
                call.name, snap.job_id, snap.task.id
            ),
            context_pack: Some(ap::ContextPack {
                pack_id: snap.job_id.clone(),
                hash,
                version: "tool_call/v1".into(),
                inputs: vec![snap.task.id.clone()],
            }),
            model: if self.model.is_empty() {
                "none".into()
            } else {
                self.model.to_owned()
            },
            max_tokens: 1,
            cost_estimate: self.price.map(|micro_usd| ap::CostEstimate {
                estimated_cost: Some(switchyard_proto::common::v1::Money { micro_usd }),
                ..Default::default()
            }),
            tools_allowed: vec![call.name.clone()],
            outputs_allowed: vec!["tool_call".into()],
            correlation_id: snap.correlation_id.clone(),
            labels,
            tool_call: Some(ap::ToolCall {
                job_id: snap.job_id.clone(),
                task_id: snap.task.id.clone(),
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: call.arguments.clone(),
                reason: said.to_owned(),
                attempt: snap.attempt,
                job_run_id: job_run,
                edited_by: edited_by.to_owned(),
            }),
            ..Default::default()
        };
        // A per-call run is never claimed: approving it lets the call run.
        propose_for_person(x, &self.waiter, run).await
    }

    /// Waits for the run's decision, until `deadline_ms` (then withdraws
    /// the run: the call counts as rejected).
    async fn decision(&self, run_id: &str, deadline_ms: u64) -> Decided {
        match decided(self.x, run_id, deadline_ms).await {
            Some(d) => d,
            None => self.time_out(run_id).await,
        }
    }

    /// Nobody decided in time: the run is withdrawn and the call refused.
    async fn time_out(&self, run_id: &str) -> Decided {
        let timeout = self.x.inner.cfg.tool_approval.timeout_secs;
        let comment =
            format!("no decision within {timeout} s (executor.tool_approval.timeout_secs)");
        let req = ap::CancelRequest {
            run_id: run_id.to_owned(),
            comment: comment.clone(),
        };
        let approval = &self.x.inner.clients.approval;
        if let Err(e) = self
            .waiter
            .call(Service::Approval, || approval.cancel(req.clone()))
            .await
        {
            // Decided at the last moment, perhaps; the call stays refused.
            tracing::warn!(run_id, error = %e.message(), "withdrawing a tool call's run after its timeout");
        }
        Decided {
            decision: "timed_out",
            by: String::new(),
            comment,
        }
    }

    /// The approver's edit of an approved call, if it was approved with
    /// one, read from the run (an unreachable approval service is waited
    /// for, within the task's deadline).
    async fn edit_of(&self, run_id: &str) -> Result<Option<ap::ToolCallEdit>, String> {
        let approval = &self.x.inner.clients.approval;
        let req = ap::GetRunRequest {
            run_id: run_id.to_owned(),
        };
        let run = self
            .waiter
            .call(Service::Approval, || approval.get_run(req.clone()))
            .await
            .map_err(|e| e.message().to_owned())?
            .run
            .unwrap_or_default();
        Ok(run.edit)
    }

    /// An approved call's run is claimed and completed: the call is
    /// released to the task (best effort: the decision is what counts).
    async fn release_run(&self, run_id: &str) {
        let x = self.x;
        let approval = &x.inner.clients.approval;
        let worker_id = x.inner.cfg.worker_id.clone();
        let claim = ap::ClaimRequest {
            run_id: run_id.to_owned(),
            worker_id: worker_id.clone(),
            lease_secs: x.inner.cfg.lease_secs,
        };
        let _ = approval.claim(claim).await;
        let done = ap::CompleteRequest {
            run_id: run_id.to_owned(),
            worker_id,
            result: Some(ap::RunResult {
                summary: format!(
                    "the approved call was released to job {} task {}",
                    self.snap.job_id, self.snap.task.id
                ),
                ..Default::default()
            }),
        };
        if let Err(e) = approval.complete(done).await {
            tracing::debug!(run_id, error = %e.message(), "completing an approved call's run");
        }
    }

    /// Records the decision and moves the task back to `running`, durably.
    async fn resume_task(
        &self,
        run_id: &str,
        call_id: &str,
        tool: &str,
        d: &Decided,
        edited: String,
    ) -> Result<(), ExecutorError> {
        let (x, snap) = (self.x, self.snap);
        let book = &x.inner.book;
        let g = {
            let mut st = book.lock();
            let e = st.get(&snap.job_id)?;
            let i = e.index.get(&snap.task.id).copied().unwrap_or_default();
            let waiting = e.task_state(i) == TaskState::AwaitingApproval;
            let ev = events::CallDecided {
                run_id: run_id.to_owned(),
                call_id: call_id.to_owned(),
                tool: tool.to_owned(),
                decision: d.decision.to_owned(),
                by: d.by.clone(),
                comment: d.comment.clone(),
                edited,
            };
            let mut g = book.record(
                &mut st,
                &snap.job_id,
                &snap.task.id,
                JobEvent::CallDecided(ev),
            );
            if waiting {
                g = book.move_task(&mut st, &snap.job_id, i, Change::to(TaskState::Running))?;
            }
            x.inner
                .checkpoints
                .remove(&checkpoint_key(&snap.job_id, &snap.task.id))?;
            g
        };
        book.durable(g).await
    }
}

/// The call's run, and when the wait for its decision ends.
struct Paused {
    run_id: String,
    deadline_ms: u64,
    /// The approver whose edit this call is, if it is one.
    edited_by: String,
}

fn refused(reason: Reason, message: String) -> Gate {
    Gate::Refused { reason, message }
}

/// Withdraws a call's run when its wait is dropped unfinished, unless the
/// executor is shutting down (the restarted attempt waits on).
struct Withdraw {
    x: Executor,
    run_id: Option<String>,
    /// The call's checkpoint, which nothing will resume.
    checkpoint: String,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some(run_id) = self.run_id.take() else {
            return;
        };
        if self.x.inner.shutdown.is_shutdown() {
            return;
        }
        if let Err(e) = self.x.inner.checkpoints.remove(&self.checkpoint) {
            tracing::warn!(error = %e, "removing an abandoned call's checkpoint");
        }
        let approval = self.x.inner.clients.approval.clone();
        tokio::spawn(switchyard_kit::context::propagate(async move {
            let req = ap::CancelRequest {
                run_id,
                comment: "the task stopped waiting for this call (its job was cancelled)".into(),
            };
            let _ = approval.cancel(req).await;
        }));
    }
}
