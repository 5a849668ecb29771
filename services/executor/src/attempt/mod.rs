//! One attempt of one task, by kind: [`command`] (an allowlisted program in
//! the sandbox), [`agent`] (routed, reserved, `AgentService.Invoke`) and
//! [`llm`] (the agent loop with the job's budget and the task's tools).
//! An attempt reads a [`Snapshot`] taken when it started and ends in an
//! [`Outcome`]; the driver records it and the scheduler decides what next.
//!
//! Spending goes through [`Spender`]: the ledger's spend protocol
//! ([`switchyard_api::spend`]) with the job's events and the task's cost
//! limit, the same for agent calls and model calls.

pub(crate) mod agent;
pub(crate) mod command;
pub(crate) mod conversation;
pub(crate) mod gate;
pub(crate) mod handoff;
pub(crate) mod input;
pub(crate) mod llm;
pub(crate) mod queue;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_api::spend::{self, Hold, HoldRequest, Refusal};
use switchyard_core::Reason;
use switchyard_core::template;
use switchyard_proto::common::v1::CorrelationContext;
use switchyard_proto::executor::v1::{TaskSpec, TaskStatus, task_spec::Kind};
use switchyard_proto::ledger::v1::Entry;

use crate::Executor;
use crate::depend::{Service, Waiter};
use crate::events::{self, JobEvent};
use crate::schedule::{Class, Failure};

/// The end of one attempt.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) failure: Option<Failure>,
    /// Outputs to keep (also for failed attempts: partial results).
    pub(crate) status: Option<TaskStatus>,
    /// Answered once the outcome is durable (a pull worker's Ack or Nack
    /// waits for it).
    pub(crate) settled: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Outcome {
    pub(crate) fn ok(status: TaskStatus) -> Self {
        Outcome {
            failure: None,
            status: Some(status),
            settled: None,
        }
    }

    /// An attempt that stopped without an end, its task left as it is
    /// (an input task still waiting when the job is handed back): the
    /// driver records nothing, and whoever runs the job next resumes it.
    pub(crate) fn parked() -> Self {
        Outcome {
            failure: None,
            status: None,
            settled: None,
        }
    }

    pub(crate) fn fail(class: Class, reason: Reason, error: impl Into<String>) -> Self {
        Outcome {
            failure: Some(Failure {
                class,
                reason,
                error: error.into(),
            }),
            status: None,
            settled: None,
        }
    }
}

/// The outcome of an attempt whose artifacts were refused: the task fails
/// for good (trying again would produce the same kinds).
pub(crate) fn artifact_refused(e: crate::error::ExecutorError) -> Outcome {
    match e {
        crate::error::ExecutorError::ArtifactRefused(r) => {
            Outcome::fail(Class::Permanent, r.reason, r.message)
        }
        other => Outcome::fail(Class::Other, Reason::StorageFailure, other.to_string()),
    }
}

/// What an attempt needs from the job, read once under the lock.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) job_id: String,
    pub(crate) task: TaskSpec,
    pub(crate) job_input: Value,
    pub(crate) outputs: HashMap<String, Value>,
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) budget_id: String,
    /// The ledger hold (an approval's scope) the job's reservations draw
    /// from; empty: they reserve on the budget chain.
    pub(crate) scope_hold: String,
    pub(crate) token_budget: Option<u64>,
    pub(crate) correlation_id: String,
    pub(crate) delegation_depth: u32,
    pub(crate) attempt: u32,
    /// The earlier of the task's and the job's deadline, ms: waiting for
    /// an unreachable service ends there.
    pub(crate) deadline_ms: Option<u64>,
    /// Log position of the attempt's start: nothing with an effect outside
    /// the executor happens before it is durable.
    pub(crate) start_g: u64,
    /// The epoch of this replica's lease on the job when the attempt
    /// started (PostgreSQL; 0 on sled): the attempt acts only if its start
    /// was stored under that lease.
    pub(crate) lease: i64,
    /// Empty for the task itself; `/tool/<call id>` for a call an LLM task
    /// makes to an agent, so its idempotency keys are its own.
    pub(crate) scope: String,
    /// An LLM attempt going on after a restart from the tool call that
    /// waits for a person: the loop's state at that call.
    pub(crate) resume: Option<Box<switchyard_llm::agent::Checkpoint>>,
    /// The person's message an agent holding a conversation is sent
    /// (`InvocationContext.user_message`); empty otherwise.
    pub(crate) user_message: String,
}

impl Snapshot {
    /// The snapshot of an agent call made as LLM tool call `call_id`.
    pub(crate) fn clone_for_call(&self, call_id: &str) -> Snapshot {
        Snapshot {
            scope: format!("{}/tool/{call_id}", self.scope),
            ..self.clone()
        }
    }

    /// A template's value: `${parent.…}` from the job's input, `${id.…}`
    /// from an upstream task's output.
    pub(crate) fn resolve(&self, v: &Value) -> Result<Value, String> {
        template::resolve(v, &|t: Option<&str>| match t {
            None => Some(&self.job_input),
            Some(id) => self.outputs.get(id),
        })
    }

    /// A template resolved to text.
    pub(crate) fn resolve_text(&self, s: &str) -> Result<String, String> {
        match self.resolve(&Value::String(s.to_owned()))? {
            Value::String(s) => Ok(s),
            other => Ok(other.to_string()),
        }
    }

    /// Where this attempt's spending comes from.
    pub(crate) fn correlation(&self) -> CorrelationContext {
        CorrelationContext {
            correlation_id: self.correlation_id.clone(),
            traceparent: switchyard_kit::context::outgoing_traceparent().unwrap_or_default(),
            job_id: self.job_id.clone(),
            task_id: self.task.id.clone(),
        }
    }
}

/// One attempt of one task: what it runs as, and with what.
pub(crate) struct Attempt<'a> {
    /// The executor's services (clients, sandbox, the book).
    pub(crate) x: &'a Executor,
    /// What the attempt reads of its job.
    pub(crate) snap: &'a Snapshot,
    /// How long it may take.
    pub(crate) timeout: Duration,
    /// The job's scratch directory.
    pub(crate) scratch: &'a std::path::Path,
}

impl Attempt<'_> {
    /// Runs the attempt by its task's kind, in its own span.
    pub(crate) async fn run(&self) -> Outcome {
        let kind = crate::book::kind_name(self.snap.task.kind.as_ref());
        let span = crate::spans::task(self.snap, kind);
        tracing::Instrument::instrument(self.run_kind(), span).await
    }

    async fn run_kind(&self) -> Outcome {
        match self.snap.task.kind.clone() {
            Some(Kind::Command(c)) => self.command(&c).await,
            Some(Kind::Agent(a)) => {
                let input = a
                    .input
                    .as_ref()
                    .map(switchyard_kit::json::struct_to_json)
                    .unwrap_or_else(|| json!({}));
                match self.snap.resolve(&input) {
                    Ok(input) => self.agent(&a, input).await,
                    Err(e) => Outcome::fail(Class::Permanent, Reason::TemplateUnresolved, e),
                }
            }
            Some(Kind::Llm(l)) => self.llm(&l).await,
            Some(Kind::Queue(q)) => self.queue(&q).await,
            Some(Kind::Input(t)) => self.input(&t).await,
            Some(Kind::Conversation(c)) => self.conversation(&c).await,
            None => Outcome::fail(
                Class::Permanent,
                Reason::InvalidArgument,
                "task has no kind",
            ),
        }
    }

    /// This attempt's spending.
    pub(crate) fn spender(&self) -> Spender<'_> {
        Spender {
            x: self.x,
            snap: self.snap,
        }
    }
}

/// What a hold is for, as its events say.
#[derive(Debug, Clone)]
pub(crate) enum Purpose {
    /// A call to this agent.
    Agent(String),
    /// Model call `n` of an LLM task, with its provider rate-limit claim.
    ModelCall(u32, Option<switchyard_proto::ledger::v1::RateClaim>),
}

/// Why the spender did not reserve.
#[derive(Debug, Clone)]
pub(crate) enum NotHeld {
    /// The task's cost limit (the sum of what it spends) would be passed.
    CostLimit(String),
    /// The budget refused (the ledger's words), and what ran out:
    /// `AGENT_TOKEN_BUDGET_EXCEEDED` or `AGENT_COST_BUDGET_EXCEEDED`.
    Budget(String, Reason),
    /// A provider rate limit had no room within the wait allowed, or can
    /// never hold the call.
    RateLimited(String),
    /// The ledger refused for another reason.
    Unavailable(String),
    /// The ledger stayed unreachable until the deadline.
    Unreachable(String),
}

/// One task's spending through the spend protocol: every hold, commit,
/// release and refusal is a job event, and the task's cost limit bounds
/// the sum of everything the task spends, across attempts and calls.
pub(crate) struct Spender<'a> {
    pub(crate) x: &'a Executor,
    pub(crate) snap: &'a Snapshot,
}

impl<'a> Spender<'a> {
    fn note(&self, ev: JobEvent) {
        self.x
            .inner
            .book
            .note(&self.snap.job_id, &self.snap.task.id, ev);
    }

    /// The idempotency key of a hold of this attempt: job, task, attempt
    /// (with the tool-call scope), then `rest`.
    pub(crate) fn key(&self, rest: &[&str]) -> String {
        let s = self.snap;
        let attempt = format!("{}{}", s.attempt, s.scope);
        let mut parts = vec![s.job_id.as_str(), s.task.id.as_str(), attempt.as_str()];
        parts.extend_from_slice(rest);
        spend::key(&parts)
    }

    /// Holds `tokens` and `cost` on the job's budget for `purpose`, after
    /// checking the task's cost limit (span `switchyard.budget.reserve`).
    pub(crate) async fn reserve(
        &self,
        purpose: Purpose,
        tokens: u64,
        cost: i64,
        key: String,
        note: String,
    ) -> Result<Hold, NotHeld> {
        let span = crate::spans::budget(self.snap, "reserve", tokens, cost);
        let held = tracing::Instrument::instrument(
            self.hold(purpose, tokens, cost, key, note),
            span.clone(),
        )
        .await;
        crate::spans::reserved(&span, &held);
        held
    }

    #[rustfmt::skip]
    async fn hold(&self, purpose: Purpose, tokens: u64, cost: i64, key: String, note: String) -> Result<Hold, NotHeld> {
        let (job_id, task_id) = (&self.snap.job_id, &self.snap.task.id);
        let limit = self.snap.task.cost_limit.map(|m| m.micro_usd);
        if let Some(limit) = limit {
            self.claim_within_limit(limit, cost)?;
        }
        let req = HoldRequest {
            budget_id: self.snap.budget_id.clone(),
            tokens,
            cost_micro_usd: cost,
            key,
            context: self.snap.correlation(),
            note,
            grant: String::new(),
            from_hold: self.snap.scope_hold.clone(),
            rate: match &purpose {
                Purpose::ModelCall(_, rate) => rate.clone(),
                Purpose::Agent(_) => None,
            },
        };
        // The key makes the repeats one hold; a rate limit without room
        // makes the call wait (asking again as the ledger says) until it
        // fits, the task's deadline or the executor's longest wait.
        let started = std::time::Instant::now();
        let most = std::time::Duration::from_millis(self.x.inner.cfg.llm_rate_max_wait_ms);
        // The model call a wait is recorded for (0: an agent call).
        let call = match &purpose {
            Purpose::ModelCall(n, _) => *n,
            Purpose::Agent(_) => 0,
        };
        let mut waited: Option<(String, String)> = None;
        let held = loop {
            let held = self
                .waiter()
                .call(Service::Ledger, || async {
                    match spend::reserve(&self.x.inner.clients.ledger, req.clone()).await {
                        Err(Refusal::Unreachable(s)) => Err(s),
                        r => Ok(r),
                    }
                })
                .await
                .unwrap_or_else(|s| Err(Refusal::Unreachable(s)));
            let Err(Refusal::RateLimited {
                retry_after_ms: Some(ms),
                message,
                limit,
                scope,
            }) = &held
            else {
                break held;
            };
            let pause = spend::rate_pause(*ms);
            let past_deadline = self
                .snap
                .deadline_ms
                .is_some_and(|d| switchyard_kit::time::now_ms() + pause.as_millis() as u64 > d);
            if started.elapsed() + pause > most || past_deadline {
                break held;
            }
            if waited.as_ref() != Some(&(limit.clone(), scope.clone())) {
                self.note(JobEvent::RateLimited(events::RateLimited {
                    call,
                    phase: "waiting".into(),
                    limit: limit.clone(),
                    scope: scope.clone(),
                    why: message.clone(),
                    waited_ms: started.elapsed().as_millis() as u64,
                }));
                waited = Some((limit.clone(), scope.clone()));
            }
            tokio::time::sleep(pause).await;
        };
        if waited.is_some() {
            let ms = started.elapsed().as_millis() as u64;
            switchyard_kit::metrics::global()
                .rate_limit_wait_seconds
                .observe(ms as f64 / 1000.0);
            let (phase, why) = match &held {
                Ok(_) => ("granted", String::new()),
                Err(e) => ("deferred", e.to_string()),
            };
            self.note(JobEvent::RateLimited(events::RateLimited {
                call,
                phase: phase.into(),
                why,
                waited_ms: ms,
                ..Default::default()
            }));
        }
        let book = &self.x.inner.book;
        let reserved = |hold: &Hold| {
            let (agent_id, call) = match &purpose {
                Purpose::Agent(a) => (a.clone(), None),
                Purpose::ModelCall(n, _) => (String::new(), Some(*n)),
            };
            JobEvent::Reserved(events::Reserved {
                reservation_id: hold.id().to_owned(),
                tokens,
                cost_micro_usd: cost,
                agent_id,
                call,
            })
        };
        {
            // The claim becomes a hold (or nothing) in one step.
            let mut st = book.lock();
            if limit.is_some() {
                st.unreserve(job_id, task_id, cost);
            }
            if let Ok(h) = &held {
                book.record(&mut st, job_id, task_id, reserved(h));
            }
        }
        match held {
            Ok(h) => Ok(h),
            Err(Refusal::Budget {
                refused_by,
                message,
                short,
            }) => {
                self.note(JobEvent::Refused(events::Refused {
                    refused_by,
                    message: message.clone(),
                    tokens: Some(tokens),
                    cost_micro_usd: Some(cost),
                    dimension: if short.money { "cost" } else { "tokens" }.into(),
                    short_tokens: short.tokens,
                    short_micro_usd: short.micro_usd,
                }));
                Err(NotHeld::Budget(message, short.reason()))
            }
            Err(Refusal::RateLimited {
                message,
                retry_after_ms,
                ..
            }) => Err(NotHeld::RateLimited(match retry_after_ms {
                Some(_) => format!(
                    "{message} (deferred: no room within the task's deadline or executor.llm_rate_max_wait_ms)"
                ),
                None => message,
            })),
            Err(Refusal::Unavailable(m)) => Err(NotHeld::Unavailable(format!("ledger: {m}"))),
            Err(Refusal::Unreachable(s)) => Err(NotHeld::Unreachable(format!(
                "ledger: {} (the deadline passed while waiting for it)",
                s.message()
            ))),
        }
    }

    /// Counts `cost` as being reserved for the task, unless that would pass
    /// its cost limit, `limit` (only tasks with one keep the count).
    fn claim_within_limit(&self, limit: i64, cost: i64) -> Result<(), NotHeld> {
        let (job_id, task_id) = (&self.snap.job_id, &self.snap.task.id);
        let mut st = self.x.inner.book.lock();
        let exposure = st.find(job_id).map_or(0, |e| e.task_exposure(task_id));
        if exposure.saturating_add(cost) > limit {
            drop(st);
            let msg = format!(
                "this call may cost up to {cost} micro-USD; with {exposure} spent or held by task {task_id:?} that is above its cost_limit of {limit}"
            );
            self.note(JobEvent::Refused(events::Refused {
                refused_by: "task.cost_limit".into(),
                message: msg.clone(),
                tokens: None,
                cost_micro_usd: None,
                ..Default::default()
            }));
            return Err(NotHeld::CostLimit(msg));
        }
        st.reserving(job_id, task_id, cost);
        Ok(())
    }

    /// Waits for unreachable services on behalf of this task, until its
    /// deadline.
    pub(crate) fn waiter(&self) -> Waiter<'a> {
        self.x
            .waiter(&self.snap.job_id, &self.snap.task.id)
            .until(self.snap.deadline_ms)
    }

    /// Commits what `hold` used, with its journal entry (the task's
    /// capability added, for spend reports; the ledger makes repeats one
    /// commit).
    pub(crate) async fn commit(&self, hold: &Hold, tokens: u64, cost: i64, mut entry: Entry) {
        if let Some(switchyard_proto::executor::v1::task_spec::Kind::Agent(a)) =
            &self.snap.task.kind
        {
            entry.capability.clone_from(&a.capability);
        }
        let span = crate::spans::budget(self.snap, "commit", tokens, cost);
        span.record("switchyard.budget.reservation_id", hold.id());
        let waiter = self.waiter();
        let committed = waiter.call(Service::Ledger, || hold.commit(tokens, cost, entry.clone()));
        let committed = tracing::Instrument::instrument(committed, span.clone()).await;
        match committed {
            Ok(c) => {
                span.record("switchyard.budget.outcome", "committed");
                span.record("switchyard.budget.overrun", c.overrun);
                self.note(JobEvent::Committed(events::Committed {
                    reservation_id: hold.id().to_owned(),
                    tokens,
                    cost_micro_usd: cost,
                    overrun: c.overrun,
                }))
            }
            Err(e) => {
                crate::spans::failed(&span, crate::spans::code(&e));
                tracing::warn!(job_id = %self.snap.job_id, reservation_id = hold.id(), error = %e.message(), "commit failed; the reservation's TTL bounds the hold")
            }
        }
    }

    /// Releases `hold` unused and records why (span
    /// `switchyard.budget.release`).
    pub(crate) async fn release(&self, hold: &Hold, why: &str) {
        let span = crate::spans::budget(self.snap, "release", 0, 0);
        span.record("switchyard.budget.reservation_id", hold.id());
        span.record("switchyard.budget.why", why);
        let released = release(self.x, &self.snap.job_id, &self.snap.task.id, hold, why);
        tracing::Instrument::instrument(released, span).await;
    }
}

/// Releases `hold` (of job `job_id`'s task `task_id`) and records it,
/// waiting for the ledger if it cannot be reached (a release is idempotent).
pub(crate) async fn release(x: &Executor, job_id: &str, task_id: &str, hold: &Hold, why: &str) {
    let released = x
        .waiter(job_id, task_id)
        .call(Service::Ledger, || hold.release())
        .await;
    match released {
        Ok(()) => x.inner.book.note(
            job_id,
            task_id,
            JobEvent::Released(events::Released {
                reservation_id: hold.id().to_owned(),
                why: why.to_owned(),
            }),
        ),
        Err(e) => {
            tracing::warn!(job_id, reservation_id = hold.id(), error = %e.message(), "releasing reservation; its TTL will free it")
        }
    }
}

impl Executor {
    /// The invocation grant of a call to `agent_id` for `snap`'s task: its
    /// job, task and budget, `max_tokens` per reservation, valid for the
    /// call's `timeout` and a minute's grace (an agent commits after its
    /// work). Signed with this deployment's grant key.
    pub(crate) fn grant(
        &self,
        snap: &Snapshot,
        agent_id: &str,
        max_tokens: u64,
        timeout: std::time::Duration,
    ) -> String {
        // An agent that bills its own calls is handed no tokens by the
        // executor: the job's token budget bounds what it may hold.
        let ceiling = match max_tokens {
            0 => snap
                .token_budget
                .unwrap_or(switchyard_core::money::MAX_TOKENS),
            n => n,
        };
        let lasts = timeout.as_millis() as u64;
        let (job, task, budget) = (&snap.job_id, &snap.task.id, &snap.budget_id);
        self.sign_grant(job, task, agent_id, budget, ceiling, lasts)
    }

    /// Signs the grant of task `task_id` of job `job_id` (in its
    /// submitter's tenant) on `budget_id`, valid for `lasts_ms` and a
    /// minute's grace: the one place the executor issues grants.
    pub(crate) fn sign_grant(
        &self,
        job_id: &str,
        task_id: &str,
        agent_id: &str,
        budget_id: &str,
        max_tokens: u64,
        lasts_ms: u64,
    ) -> String {
        let tenant = self
            .inner
            .book
            .lock()
            .find(job_id)
            .map(|e| e.submitter().tenant)
            .unwrap_or_default();
        let grant = switchyard_kit::auth::grant::Grant {
            job_id: job_id.to_owned(),
            task_id: task_id.to_owned(),
            agent_id: agent_id.to_owned(),
            tenant,
            budget_id: budget_id.to_owned(),
            max_tokens,
            // Wall time: the ledger checks it against its own clock.
            expires_ms: switchyard_kit::time::now_ms().saturating_add(lasts_ms + 60_000),
        };
        switchyard_kit::auth::grant::key().sign(&grant)
    }
}
