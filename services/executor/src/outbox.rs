//! The outbox: what a job's end must do in other services — end its
//! approval run (complete, fail or cancel it) and close its budget — kept
//! durably beside the job and delivered until the service acknowledges it.
//!
//! A job's end records its intents first, in the same durable step as its
//! final event; each is tried at once, and what an outage kept from being
//! delivered is tried again in the background (and after a restart) until
//! acknowledged. So, once every service is back, every finished job's run
//! has ended and its budget is closed, whatever was down meanwhile. Every
//! effect is safe to repeat: a run already ended and a budget already
//! closed are acknowledgements.

use std::time::Duration;

use switchyard_core::Reason;
use switchyard_kit::auth::{Kind, OnBehalf};
use switchyard_kit::error::{ApiError, is_outage};
use switchyard_proto::approval::v1 as ap;
use switchyard_proto::ledger::v1::{CloseBudgetRequest, ReleaseRequest};

use switchyard_store::StoreError;

use crate::store::{Kept, Space};
use tonic::Status;

use crate::Executor;
use crate::admission::acting_context;
use crate::book::Jobs;
use crate::error::ExecutorError;

/// One effect to deliver, and whom it acts for.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Intent {
    /// The job it is for.
    #[prost(string, tag = "1")]
    pub(crate) job_id: String,
    /// The job's correlation id, carried by the call.
    #[prost(string, tag = "2")]
    pub(crate) correlation_id: String,
    /// The user the call acts for: subject, tenant and kind.
    #[prost(string, tag = "3")]
    pub(crate) subject: String,
    #[prost(string, tag = "4")]
    pub(crate) tenant: String,
    #[prost(string, tag = "5")]
    pub(crate) kind: String,
    /// The effect.
    #[prost(oneof = "Effect", tags = "10, 11, 12")]
    pub(crate) effect: Option<Effect>,
}

/// An effect in another service.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Effect {
    /// Complete or fail the job's approval run.
    #[prost(message, tag = "10")]
    EndRun(EndRun),
    /// Cancel the job's approval run.
    #[prost(message, tag = "11")]
    CancelRun(CancelRun),
    /// Close the job's budget.
    #[prost(message, tag = "12")]
    CloseBudget(CloseBudget),
}

/// Complete (or fail) a run this executor claimed.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EndRun {
    #[prost(string, tag = "1")]
    pub(crate) run_id: String,
    /// True: complete with `summary`; false: fail with `error`.
    #[prost(bool, tag = "2")]
    pub(crate) completed: bool,
    #[prost(string, tag = "3")]
    pub(crate) summary: String,
    #[prost(string, tag = "4")]
    pub(crate) error: String,
}

/// Cancel a run.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CancelRun {
    #[prost(string, tag = "1")]
    pub(crate) run_id: String,
    #[prost(string, tag = "2")]
    pub(crate) why: String,
}

/// Close a budget, after releasing the holds of the job's approved scope
/// (what they still keep goes back to the chain).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CloseBudget {
    #[prost(string, tag = "1")]
    pub(crate) budget_id: String,
    #[prost(string, repeated, tag = "2")]
    pub(crate) holds: Vec<String>,
}

impl Intent {
    /// An effect for job `job_id`, acting for `who`.
    pub(crate) fn new(job_id: &str, correlation_id: &str, who: &OnBehalf, effect: Effect) -> Self {
        Intent {
            job_id: job_id.to_owned(),
            correlation_id: correlation_id.to_owned(),
            subject: who.subject.clone(),
            tenant: who.tenant.clone(),
            kind: who.kind.as_str().to_owned(),
            effect: Some(effect),
        }
    }

    /// Whether it closes a budget (which waits for the job's releases).
    pub(crate) fn closes_budget(&self) -> bool {
        matches!(self.effect, Some(Effect::CloseBudget(_)))
    }

    /// Where it is kept: one run effect and one budget effect per job.
    fn key(&self) -> String {
        let what = match &self.effect {
            Some(Effect::EndRun(_) | Effect::CancelRun(_)) | None => "run",
            Some(Effect::CloseBudget(_)) => "budget",
        };
        format!("{}/{what}", self.job_id)
    }

    fn who(&self) -> OnBehalf {
        OnBehalf {
            subject: self.subject.clone(),
            tenant: self.tenant.clone(),
            kind: Kind::parse(&self.kind).unwrap_or(Kind::Human),
        }
    }
}

/// How a finished job's approval run ends.
#[derive(Debug, Clone)]
pub(crate) enum RunEnd {
    /// Completed, with a summary.
    Complete(String),
    /// Failed, with the error.
    Fail(String),
    /// Cancelled: why, and for whom (none: the submitter).
    Cancel(String, Option<OnBehalf>),
    /// Already ended (rejected or cancelled in the approval service).
    Ended,
}

/// How a delivery went.
enum Delivery {
    /// Done (or already so): forget the intent.
    Done,
    /// The service could not be reached, or is not ready for it yet.
    Later(String),
}

/// The outbox's store.
pub(crate) struct Outbox {
    tree: Kept<Intent>,
    wake: tokio::sync::Notify,
}

impl Outbox {
    /// The outbox kept in `space`.
    pub(crate) fn open(space: Space) -> Result<Outbox, StoreError> {
        Ok(Outbox {
            tree: Kept::open(space)?,
            wake: tokio::sync::Notify::new(),
        })
    }
}

impl Executor {
    /// What job `job_id`'s end must do elsewhere: `run`, and closing its
    /// budget.
    pub(crate) fn intents(
        &self,
        st: &Jobs,
        job_id: &str,
        run: RunEnd,
    ) -> Result<Vec<Intent>, ExecutorError> {
        let e = st.get(job_id)?;
        let corr = e.spec().correlation_id.as_str();
        let submitter = e.submitter();
        let mut intents = Vec::with_capacity(2);
        let run_id = e.job.run_id.clone();
        let end = |completed, summary, error| {
            Effect::EndRun(EndRun {
                run_id: run_id.clone(),
                completed,
                summary,
                error,
            })
        };
        let effect = match run {
            RunEnd::Complete(summary) => Some((end(true, summary, String::new()), None)),
            RunEnd::Fail(error) => Some((end(false, String::new(), error), None)),
            RunEnd::Cancel(why, who) => {
                let cancel = CancelRun {
                    run_id: run_id.clone(),
                    why,
                };
                Some((Effect::CancelRun(cancel), who))
            }
            RunEnd::Ended => None,
        };
        if let Some((effect, who)) = effect.filter(|_| !run_id.is_empty()) {
            // A cancelled run is cancelled for the person who cancelled the job.
            let who = who.unwrap_or_else(|| submitter.clone());
            intents.push(Intent::new(job_id, corr, &who, effect));
        }
        if !e.job.budget_id.is_empty() {
            let close = Effect::CloseBudget(CloseBudget {
                budget_id: e.job.budget_id.clone(),
                holds: e.scope_holds.clone(),
            });
            intents.push(Intent::new(job_id, corr, &submitter, close));
        }
        Ok(intents)
    }

    /// Records what job `job_id`'s end must do elsewhere ([`Executor::intents`]),
    /// under the book's lock right after the job's final event, so the
    /// intents become durable with that event.
    pub(crate) fn intend(
        &self,
        st: &Jobs,
        job_id: &str,
        run: RunEnd,
    ) -> Result<Vec<(String, Intent)>, ExecutorError> {
        let intents = self.intents(st, job_id, run)?;
        Ok(self.keep(intents)?)
    }

    /// Stores intents for delivery until acknowledged.
    fn keep(&self, intents: Vec<Intent>) -> Result<Vec<(String, Intent)>, StoreError> {
        let mut keyed = Vec::with_capacity(intents.len());
        for i in intents {
            let key = i.key();
            self.inner.outbox.tree.put(&key, &i)?;
            keyed.push((key, i));
        }
        Ok(keyed)
    }

    /// Delivers `intents` now, before the job's final event is recorded;
    /// what an outage keeps back is stored (durable with that event) and
    /// retried in the background. A crash before the final event finishes
    /// the job again, so nothing needs storing when all are delivered.
    pub(crate) async fn deliver_first(&self, intents: Vec<Intent>) -> Result<(), StoreError> {
        let done =
            futures_util::future::join_all(intents.iter().map(|i| self.try_deliver(i))).await;
        let left: Vec<Intent> = intents
            .into_iter()
            .zip(done)
            .filter(|(_, done)| !done)
            .map(|(i, _)| i)
            .collect();
        if !left.is_empty() {
            self.keep(left)?;
            self.inner.outbox.wake.notify_one();
        }
        Ok(())
    }

    /// Tries each stored intent once now; the background retries the rest
    /// soon.
    pub(crate) async fn deliver_now(&self, intents: Vec<(String, Intent)>) {
        if self.deliver_stored(&intents).await < intents.len() {
            self.inner.outbox.wake.notify_one();
        }
    }

    /// Tries each stored intent once and forgets the delivered ones;
    /// returns how many were.
    async fn deliver_stored(&self, intents: &[(String, Intent)]) -> usize {
        let tried = intents.iter().map(|(key, i)| async move {
            let done = self.try_deliver(i).await;
            if done && let Err(e) = self.inner.outbox.tree.remove(key) {
                tracing::warn!(key, error = %e, "forgetting a delivered intent");
            }
            done
        });
        futures_util::future::join_all(tried)
            .await
            .into_iter()
            .filter(|d| *d)
            .count()
    }

    /// One delivery, acting for the intent's user; true when it is done with.
    async fn try_deliver(&self, i: &Intent) -> bool {
        let ctx = acting_context(&i.correlation_id, i.who());
        match switchyard_kit::context::scope(ctx, self.deliver(i)).await {
            Delivery::Done => true,
            Delivery::Later(why) => {
                tracing::debug!(job_id = %i.job_id, why, "intent not delivered yet");
                false
            }
        }
    }

    async fn deliver(&self, i: &Intent) -> Delivery {
        let c = &self.inner.clients;
        let answered = match &i.effect {
            None => return Delivery::Done,
            Some(Effect::CloseBudget(b)) => {
                for hold in &b.holds {
                    let released = c
                        .ledger
                        .release(ReleaseRequest {
                            reservation_id: hold.clone(),
                            ..Default::default()
                        })
                        .await;
                    match released {
                        Ok(_) => {}
                        Err(s) if is_outage(&s) => return Delivery::Later(s.message().to_owned()),
                        // Released before, or lapsed: nothing is held. Any
                        // other refusal leaves it to the hold's time limit.
                        Err(s) => {
                            let api = ApiError::from(s);
                            if api.known_reason() != Some(Reason::ReservationNotOpen) {
                                tracing::warn!(job_id = %i.job_id, hold, error = %api, "releasing a finished job's scope hold; its time limit will");
                            }
                        }
                    }
                }
                c.ledger
                    .close_budget(CloseBudgetRequest {
                        budget_id: b.budget_id.clone(),
                    })
                    .await
                    .map(|_| ())
            }
            Some(Effect::CancelRun(r)) => c
                .approval
                .cancel(ap::CancelRequest {
                    run_id: r.run_id.clone(),
                    comment: r.why.clone(),
                })
                .await
                .map(|_| ()),
            Some(Effect::EndRun(r)) => return self.end_run(i, r).await,
        };
        judge(answered)
    }

    /// Completes or fails a run; a claim that lapsed meanwhile (the
    /// approval service was down past the lease) is claimed again first.
    async fn end_run(&self, i: &Intent, r: &EndRun) -> Delivery {
        let approval = &self.inner.clients.approval;
        let worker_id = self.inner.cfg.worker_id.clone();
        let end = || async {
            if r.completed {
                let artifacts = self
                    .inner
                    .book
                    .job(&i.job_id)
                    .await
                    .map(|j| j.artifacts)
                    .unwrap_or_default();
                let result = Some(switchyard_api::artifacts::run_result(
                    &r.summary,
                    String::new(),
                    &artifacts,
                ));
                approval
                    .complete(ap::CompleteRequest {
                        run_id: r.run_id.clone(),
                        worker_id: worker_id.clone(),
                        result,
                    })
                    .await
                    .map(|_| ())
            } else {
                approval
                    .fail(ap::FailRequest {
                        run_id: r.run_id.clone(),
                        worker_id: worker_id.clone(),
                        last_error: r.error.clone(),
                        retryable: false,
                    })
                    .await
                    .map(|_| ())
            }
        };
        let first = end().await;
        let lapsed = first.as_ref().err().is_some_and(|e| {
            ApiError::from(e.clone()).known_reason() == Some(Reason::ClaimNotHeld)
        });
        if !lapsed {
            return judge(first);
        }
        let run = match approval
            .get_run(ap::GetRunRequest {
                run_id: r.run_id.clone(),
            })
            .await
        {
            Ok(got) => got.run.unwrap_or_default(),
            Err(e) => return judge(Err(e)),
        };
        if run.status != ap::RunStatus::Approved as i32 {
            // Ended, or running for someone else: nothing left to do here.
            return judge(first);
        }
        let claimed = approval
            .claim(ap::ClaimRequest {
                run_id: r.run_id.clone(),
                worker_id: worker_id.clone(),
                lease_secs: self.inner.cfg.lease_secs,
            })
            .await;
        match claimed {
            Ok(_) => judge(end().await),
            Err(e) => Delivery::Later(format!("claiming the run again: {}", e.message())),
        }
    }

    /// Runs until shutdown: delivers what is left, pausing between rounds
    /// (sooner when a new intent could not be delivered).
    pub(crate) async fn deliver_in_background(&self) {
        let every = Duration::from_millis(self.inner.cfg.dependency_retry_max_ms);
        loop {
            let pending: Vec<(String, Intent)> = if self.maintains().await {
                self.inner.outbox.tree.list().await.unwrap_or_else(|e| {
                    tracing::error!(error = %e, "reading the outbox");
                    Vec::new()
                })
            } else {
                Vec::new()
            };
            if !pending.is_empty() {
                let done = self.deliver_stored(&pending).await;
                tracing::info!(
                    delivered = done,
                    left = pending.len() - done,
                    "outbox round"
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.inner.outbox.wake.notified() => {
                    tokio::time::sleep(every / 4).await;
                }
                _ = self.inner.shutdown.wait() => return,
            }
        }
    }
}

/// What an answer means for an intent: done (also when it was already
/// so, or was refused for good), or to try again later.
fn judge(answered: Result<(), Status>) -> Delivery {
    match answered {
        Ok(()) => Delivery::Done,
        Err(e) if is_outage(&e) => Delivery::Later(e.message().to_owned()),
        Err(e) => {
            let api = ApiError::from(e);
            match api.known_reason() {
                // The run's retry after a lapsed claim is not due yet.
                Some(Reason::RunNotDue) => Delivery::Later(api.message),
                // Already ended or closed, or in someone else's hands.
                Some(
                    Reason::RunTerminal
                    | Reason::TransitionNotAllowed
                    | Reason::ClaimNotHeld
                    | Reason::BudgetClosed,
                ) => Delivery::Done,
                _ => {
                    tracing::warn!(error = %api, "an effect of a finished job was refused; dropping it");
                    Delivery::Done
                }
            }
        }
    }
}
