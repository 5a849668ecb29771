//! A queue task's attempt: offered on the board until a pull worker leases
//! it, then the lease holder's Ack or Nack, a lapsed lease or the task's
//! timeout ends it (see [`crate::queue`]).

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_core::Reason;
use switchyard_proto::executor::v1::{QueueTask, TaskStatus, WorkerError};
use tokio::sync::mpsc;

use super::{Attempt, Outcome};
use crate::events::{self, JobEvent};
use crate::queue::{Report, Signal};
use crate::schedule::Class;

impl Attempt<'_> {
    /// Offers the task, waits for a lease, then for its end.
    pub(crate) async fn queue(&self, q: &QueueTask) -> Outcome {
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        let (priority, tenant) = {
            let st = book.lock();
            match st.get(&s.job_id) {
                Ok(e) => (e.spec().priority, e.job.tenant.clone()),
                Err(e) => return Outcome::fail(Class::Permanent, Reason::Internal, e.to_string()),
            }
        };
        let visibility = if q.visibility_timeout_ms > 0 {
            q.visibility_timeout_ms
        } else {
            x.inner.cfg.queue_visibility_timeout_ms
        };
        let board = &x.inner.board;
        let (tx, mut rx) = mpsc::unbounded_channel();
        // Withdrawn from the board when this attempt ends or is aborted.
        let _offered = board.offer(
            &q.queue, priority, &tenant, &s.job_id, &s.task.id, s.attempt, visibility, tx,
        );
        match rx.recv().await {
            Some(Signal::Leased) => {}
            // Only a lease holder reports, and it cannot hold one unleased.
            Some(Signal::Reported(r, settled)) => return self.settle(r, settled).await,
            None => return Outcome::fail(Class::Other, Reason::Internal, "the board closed"),
        }
        let timeout_at = book.now() + self.timeout.as_millis() as u64;
        loop {
            let now = book.now();
            let wake = match board.lease_of(&s.job_id, &s.task.id) {
                Some((_, attempt, expires)) if attempt == s.attempt => expires.min(timeout_at),
                // Reported: the report is on its way.
                _ => u64::MAX,
            };
            let sleep = Duration::from_millis(wake.saturating_sub(now).min(3_600_000));
            tokio::select! {
                sig = rx.recv() => match sig {
                    Some(Signal::Reported(r, settled)) => return self.settle(r, settled).await,
                    Some(Signal::Leased) => {}
                    None => return Outcome::fail(Class::Other, Reason::Internal, "the board closed"),
                },
                _ = tokio::time::sleep(sleep) => {
                    let now = book.now();
                    let Some((worker, _, expires)) = board.lease_of(&s.job_id, &s.task.id) else {
                        continue;
                    };
                    if now >= timeout_at && board.end_lease(&s.job_id, &s.task.id, s.attempt) {
                        let why = format!(
                            "worker {worker:?} did not finish within the task's timeout of {} ms",
                            self.timeout.as_millis()
                        );
                        return Outcome::fail(Class::Timeout, Reason::TaskTimeout, why);
                    }
                    if now >= expires && board.end_lease(&s.job_id, &s.task.id, s.attempt) {
                        let why = format!(
                            "the lease of worker {worker:?} lapsed: no ack, nack or heartbeat within {visibility} ms; offered again"
                        );
                        return Outcome::fail(Class::Requeue, Reason::LeaseLost, why);
                    }
                }
            }
        }
    }

    /// The lease holder's report as the attempt's outcome, once what its
    /// worker spent is counted.
    async fn settle(&self, r: Report, settled: tokio::sync::oneshot::Sender<()>) -> Outcome {
        self.follow_ledger().await;
        self.reported(r, settled)
    }

    /// A worker spends on the job's budget through the ledger, so the job's
    /// count follows the ledger: what the budget shows spent beyond what the
    /// job has counted is recorded as the worker's (`budget.billed_by_agent`,
    /// under the book's lock, so two reports count it once). The worker's
    /// own figure is never used.
    async fn follow_ledger(&self) {
        let (x, s) = (self.x, self.snap);
        let (budget_id, worker) = {
            let st = x.inner.book.lock();
            let Some(e) = st
                .find(&s.job_id)
                .filter(|e| crate::queue::may_spend(e.spec()))
            else {
                return;
            };
            (e.job.budget_id.clone(), lease_holder(e, &s.task.id))
        };
        if budget_id.is_empty() {
            return;
        }
        let req = switchyard_proto::ledger::v1::GetBudgetRequest { budget_id };
        let budget = match x.inner.clients.ledger.get_budget(req).await {
            Ok(b) => b.budget.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(job_id = %s.job_id, error = %e.message(), "reading the job's budget; its count catches up at the next report");
                return;
            }
        };
        let mut st = x.inner.book.lock();
        let Some(e) = st.find(&s.job_id) else {
            return;
        };
        let tokens = budget.tokens_spent.saturating_sub(e.job.tokens_used);
        let counted = e.job.cost_so_far.map_or(0, |m| m.micro_usd);
        let cost = budget
            .cost_spent
            .map_or(0, |m| m.micro_usd)
            .saturating_sub(counted)
            .max(0);
        if tokens > 0 || cost > 0 {
            let billed = events::BilledByAgent {
                agent_id: worker,
                model: String::new(),
                tokens,
                cost_micro_usd: cost,
            };
            x.inner.book.record(
                &mut st,
                &s.job_id,
                &s.task.id,
                JobEvent::BilledByAgent(billed),
            );
        }
    }

    /// The lease holder's report as the attempt's outcome.
    fn reported(&self, r: Report, settled: tokio::sync::oneshot::Sender<()>) -> Outcome {
        let s = self.snap;
        let mut out = match r {
            Report::Ack(result) => {
                let output = match result {
                    Value::Object(_) => result,
                    Value::Null => json!({}),
                    other => json!({ "value": other }),
                };
                Outcome::ok(TaskStatus {
                    output: switchyard_kit::json::json_to_struct(&output),
                    ..Default::default()
                })
            }
            Report::Nack(e, requeue) => {
                let worker = self
                    .x
                    .inner
                    .book
                    .lock()
                    .find(&s.job_id)
                    .map(|j| lease_holder(j, &s.task.id))
                    .unwrap_or_default();
                let kind = if e.r#type.is_empty() {
                    switchyard_core::worker_error::classify(&e.code, &e.message).to_owned()
                } else {
                    e.r#type.clone()
                };
                self.x.inner.book.note(
                    &s.job_id,
                    &s.task.id,
                    JobEvent::WorkerFailed(events::WorkerFailed {
                        attempt: s.attempt,
                        worker_id: worker.clone(),
                        code: e.code.clone(),
                        kind,
                        message: e.message.clone(),
                        requeue,
                    }),
                );
                let class = if requeue {
                    Class::Requeue
                } else if e.retryable == Some(false) || not_retryable(s, &e) {
                    Class::Permanent
                } else {
                    Class::Other
                };
                let code = if e.code.is_empty() { "error" } else { &e.code };
                let why = if requeue {
                    format!(
                        "worker {worker:?} handed the task back ({code}: {})",
                        e.message
                    )
                } else {
                    format!("worker {worker:?} failed the task ({code}): {}", e.message)
                };
                Outcome::fail(class, Reason::AgentError, why)
            }
        };
        out.settled = Some(settled);
        out
    }
}

/// The worker whose lease started task `task_id`'s latest attempt.
fn lease_holder(e: &crate::job::JobEntry, task_id: &str) -> String {
    e.index
        .get(task_id)
        .and_then(|&i| e.job.tasks[i].attempts.last())
        .map(|a| a.worker_id.clone())
        .unwrap_or_default()
}

/// Whether the task's retry policy lists the error's code or type: exactly,
/// or by a prefix ending in `.*`.
fn not_retryable(s: &super::Snapshot, e: &WorkerError) -> bool {
    let listed = s
        .task
        .retry
        .as_ref()
        .map(|r| r.non_retryable_errors.as_slice())
        .unwrap_or_default();
    let matches = |pattern: &str, v: &str| {
        !v.is_empty()
            && match pattern.strip_suffix('*') {
                Some(prefix) => v.starts_with(prefix),
                None => v == pattern,
            }
    };
    let class = e
        .details
        .as_ref()
        .and_then(|d| d.fields.get("error_class"))
        .and_then(|v| match &v.kind {
            Some(prost_types::value::Kind::StringValue(s)) => Some(s.as_str()),
            _ => None,
        })
        .unwrap_or_default();
    listed
        .iter()
        .any(|p| matches(p, &e.code) || matches(p, &e.r#type) || matches(p, class))
}
