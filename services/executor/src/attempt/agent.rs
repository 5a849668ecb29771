//! Agent attempts: route the capability, then try candidates in order —
//! reserve the call's worst case, `AgentService.Invoke` (relaying progress
//! and output as events), commit what the agent reports or release — until
//! one answers, every candidate refused, or a failure that the next
//! candidate cannot fix. An LLM task calling an agent as a tool runs the
//! same attempt under the tool call's scope.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use switchyard_api::AgentClient;
use switchyard_api::spend::Hold;
use switchyard_core::Reason;
use switchyard_kit::json::{json_to_struct, struct_to_json};
use switchyard_proto::agent::v1::invoke_response::Message;
use switchyard_proto::agent::v1::{
    AgentResponse, InvocationContext, InvokeRequest, Limits as AgentLimits, ResponseStatus,
};
use switchyard_proto::common::v1::UnitPrice;
use switchyard_proto::executor::v1::{AgentTask, TaskStatus};
use switchyard_proto::ledger::v1::Entry;
use switchyard_proto::registry::v1::ReportOutcomeRequest;
use switchyard_proto::router::v1::{Candidate, RouteResponse};

use super::{Attempt, NotHeld, Outcome, Purpose, Spender};
use crate::Executor;
use crate::depend::Service;
use crate::events::{self, JobEvent};
use crate::schedule::{self, Class};

/// How long an outcome report waits for an unreachable registry, ms (it
/// only feeds routing statistics; the task does not wait for it).
const REPORT_PATIENCE_MS: u64 = 5 * 60 * 1000;

/// Why a call produced no response.
#[derive(Debug)]
enum CallError {
    Timeout,
    Unreachable(String),
    Failed(String),
}

fn classify(s: tonic::Status) -> CallError {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unimplemented => {
            CallError::Unreachable(s.message().to_owned())
        }
        tonic::Code::DeadlineExceeded => CallError::Timeout,
        _ => CallError::Failed(s.message().to_owned()),
    }
}

/// Records an agent call's outcome on its `invoke_agent` span.
fn answered(span: &tracing::Span, called: &Result<AgentResponse, CallError>) {
    match called {
        Ok(r) => {
            let status = ResponseStatus::try_from(r.status).unwrap_or(ResponseStatus::Unspecified);
            span.record("switchyard.agent.status", status.as_str_name());
            span.record(
                "switchyard.agent.tokens_used",
                switchyard_kit::telemetry::int(r.tokens_used),
            );
            if let Some(c) = &r.cost {
                span.record("switchyard.cost.micro_usd", c.micro_usd);
            }
            if !r.model_used.is_empty() {
                span.record("gen_ai.response.model", r.model_used.as_str());
            }
            if status != ResponseStatus::Success {
                crate::spans::failed(span, status.as_str_name());
            }
        }
        Err(e) => crate::spans::failed(
            span,
            match e {
                CallError::Timeout => "timeout",
                CallError::Unreachable(_) => "unreachable",
                CallError::Failed(_) => "failed",
            },
        ),
    }
}

/// After one candidate: the attempt's outcome, or try the next one.
enum Next {
    Done(Outcome),
    Try(Outcome),
}

/// The routing decision as an event.
fn routed_event(a: &AgentTask, candidates: &[Candidate], routed: &RouteResponse) -> JobEvent {
    let shown = candidates
        .iter()
        .map(|c| {
            let b = c.breakdown.clone().unwrap_or_default();
            events::Candidate {
                agent_id: c.agent_id.clone(),
                score: c.score,
                endpoint: c.endpoint.clone(),
                price_per_unit_micro_usd: c.price_per_unit_micro_usd,
                unit: c.unit.clone(),
                breakdown: events::Breakdown {
                    capability_match: b.capability_match,
                    trust: b.trust,
                    latency: b.latency,
                    cost: b.cost,
                    preference: b.preference,
                    latency_ms: b.latency_ms,
                    matched_capability: b.matched_capability,
                },
            }
        })
        .collect();
    JobEvent::Routed(events::Routed {
        capability: a.capability.clone(),
        candidates: shown,
        filtered: routed
            .filtered
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
    })
}

impl Attempt<'_> {
    /// One attempt of an agent task (or an agent called as an LLM tool).
    pub(crate) async fn agent(&self, a: &AgentTask, input: Value) -> Outcome {
        self.agent_among(a, input, None).await
    }

    /// Calls agent `only` for `a` (routed on its capability, reserved,
    /// charged): no other agent stands in for it, as none may for the one
    /// holding a conversation.
    pub(crate) async fn agent_only(&self, a: &AgentTask, input: Value, only: &str) -> Outcome {
        self.agent_among(a, input, Some(only)).await
    }

    /// [`Attempt::agent`], among the candidates routing offers (all, or
    /// only `only`).
    async fn agent_among(&self, a: &AgentTask, input: Value, only: Option<&str>) -> Outcome {
        let (x, snap) = (self.x, self.snap);
        let waiter = self.spender().waiter();
        let span = crate::spans::route(snap, &a.capability);
        let routing = waiter.call(Service::Router, || x.route(a));
        let routing = tracing::Instrument::instrument(routing, span.clone()).await;
        if let Err(e) = &routing {
            crate::spans::failed(&span, crate::spans::code(e));
        }
        let routed = match routing {
            Ok(r) => r,
            Err(e) if switchyard_kit::error::is_outage(&e) => {
                let why = format!(
                    "router: {} (the deadline passed while waiting for it)",
                    e.message()
                );
                return Outcome::fail(Class::Other, Reason::DependencyUnavailable, why);
            }
            Err(e) => {
                let why = format!("router: {}", e.message());
                return Outcome::fail(Class::Other, Reason::AgentUnreachable, why);
            }
        };
        let mut candidates = routed.candidates.clone();
        if let Some(only) = only {
            candidates.retain(|c| c.agent_id == only);
        }
        // prefer_agents first, keeping the router's order otherwise.
        candidates.sort_by_key(|c| !a.prefer_agents.contains(&c.agent_id));
        crate::spans::routed(&span, &candidates);
        drop(span);
        let book = &self.x.inner.book;
        book.note(
            &snap.job_id,
            &snap.task.id,
            routed_event(a, &candidates, &routed),
        );
        if candidates.is_empty() {
            let why = format!("no agent offers {:?} right now", a.capability);
            return Outcome::fail(Class::Unavailable, Reason::CapabilityUnavailable, why);
        }
        let mut last = None;
        let mut i = 0;
        while let Some(c) = candidates.get(i) {
            i += 1;
            match self.try_candidate(a, c, &input).await {
                Next::Try(out) => last = Some(out),
                Next::Done(out) => match self.downgrade(a, &candidates[i..], c, &out) {
                    // Past the more expensive ones, to the cheaper one.
                    Some(skip) => i += skip,
                    None => return out,
                },
            }
        }
        last.unwrap_or_else(|| {
            Outcome::fail(
                Class::Other,
                Reason::AgentError,
                "no candidate could be called",
            )
        })
    }

    /// After the budget refused `from`'s price (`out`): how many of the
    /// candidates after it (`rest`) to pass over to reach the first one
    /// that is cheaper, recorded as `route.downgraded`; `None` when `out`
    /// is not a refusal of money, the task forbids downgrades, or none is
    /// cheaper.
    fn downgrade(
        &self,
        a: &AgentTask,
        rest: &[Candidate],
        from: &Candidate,
        out: &Outcome,
    ) -> Option<usize> {
        let refused = out
            .failure
            .as_ref()
            .filter(|f| f.class == Class::Budget && f.reason == Reason::AgentCostBudgetExceeded)?;
        if a.no_downgrade {
            return None;
        }
        let price = from.price_per_unit_micro_usd;
        let skip = rest
            .iter()
            .position(|c| c.price_per_unit_micro_usd < price)?;
        let to = &rest[skip];
        let snap = self.snap;
        let ev = events::Downgraded {
            capability: a.capability.clone(),
            from_agent: from.agent_id.clone(),
            to_agent: to.agent_id.clone(),
            from_price_micro_usd: price,
            to_price_micro_usd: to.price_per_unit_micro_usd,
            reason: refused.error.clone(),
        };
        tracing::info!(job_id = %snap.job_id, task_id = %snap.task.id, from = %from.agent_id, to = %to.agent_id, "budget refused a candidate; trying a cheaper one");
        self.x
            .inner
            .book
            .note(&snap.job_id, &snap.task.id, JobEvent::Downgraded(ev));
        Some(skip)
    }

    /// The tokens to hold for a call of `c`: none for a self-billing agent
    /// (it reserves its own model calls on the budget it is given; holding
    /// tokens here too would halve it); else the configured most, within
    /// the job's token budget and what that budget has left after the
    /// job's use and open holds (the agent is told that figure as its
    /// max_tokens), so a step is not refused for asking the whole budget
    /// again. When open holds leave less than the most, the job's
    /// background releases (a step that used nothing) are waited for
    /// first. Nothing left: the most, and the ledger's refusal says what
    /// remains.
    async fn hold_tokens(&self, c: &Candidate) -> u64 {
        if c.bills_tokens {
            return 0;
        }
        let snap = self.snap;
        let most =
            crate::admission::agent_tokens(self.x.inner.cfg.agent_max_tokens, snap.token_budget);
        let Some(budget) = snap.token_budget else {
            return most;
        };
        let left = || {
            let st = self.x.inner.book.lock();
            st.find(&snap.job_id)
                .map_or(most, |e| e.tokens_left(budget))
        };
        let mut now = left();
        if now < most {
            self.x.settle_now(&snap.job_id).await;
            now = left();
        }
        if now == 0 { most } else { most.min(now) }
    }

    /// Reserves for, calls and settles one candidate.
    async fn try_candidate(&self, a: &AgentTask, c: &Candidate, input: &Value) -> Next {
        let (snap, timeout) = (self.snap, self.timeout);
        let spender = self.spender();
        let tokens = self.hold_tokens(c).await;
        let cost = c.price_per_unit_micro_usd;
        // Reserve the worst case first; a refusal means the call is not made.
        let key = spender.key(&[&c.agent_id]);
        let note = format!("{} via {}", a.capability, c.agent_id);
        let purpose = Purpose::Agent(c.agent_id.clone());
        let hold = match spender.reserve(purpose, tokens, cost, key, note).await {
            Ok(h) => h,
            // Another candidate may be cheaper; the task's own limit
            // stays what it is, so the last refusal fails the task.
            Err(NotHeld::CostLimit(m)) => {
                return Next::Try(Outcome::fail(Class::Permanent, Reason::TaskCostLimit, m));
            }
            Err(NotHeld::Budget(m, reason)) => {
                let why = format!("the budget refused the reservation: {m}");
                return Next::Done(Outcome::fail(Class::Budget, reason, why));
            }
            Err(NotHeld::RateLimited(m)) => {
                return Next::Done(Outcome::fail(Class::Other, Reason::RateLimited, m));
            }
            Err(NotHeld::Unavailable(m)) => {
                return Next::Done(Outcome::fail(Class::Other, Reason::Unavailable, m));
            }
            Err(NotHeld::Unreachable(m)) => {
                let r = Reason::DependencyUnavailable;
                return Next::Done(Outcome::fail(Class::Other, r, m));
            }
        };
        if let Err(e) = self
            .x
            .inner
            .book
            .durable_for(&snap.job_id, snap.start_g, snap.lease)
            .await
        {
            spender.release(&hold, "storage failed").await;
            return Next::Done(Outcome::fail(
                Class::Other,
                Reason::StorageFailure,
                e.to_string(),
            ));
        }
        let started = Instant::now();
        let span = crate::spans::invoke_agent(snap, &c.agent_id, &a.capability);
        let called = self.call_agent(a, c, input, tokens);
        let called = tracing::Instrument::instrument(called, span.clone()).await;
        answered(&span, &called);
        drop(span);
        let call = Called {
            spender: &spender,
            a,
            c,
            hold: &hold,
            cost,
            latency: started.elapsed(),
        };
        call.settle(called, timeout).await
    }

    /// `AgentService.Invoke` on candidate `c`, relaying its progress and
    /// output as events, within `timeout`.
    async fn call_agent(
        &self,
        a: &AgentTask,
        c: &Candidate,
        input: &Value,
        tokens: u64,
    ) -> Result<AgentResponse, CallError> {
        let (snap, timeout) = (self.snap, self.timeout);
        let client = self.x.agent_client(c).map_err(CallError::Unreachable)?;
        let (job_id, task_id) = (snap.job_id.as_str(), snap.task.id.as_str());
        let req = InvokeRequest {
            agent_id: c.agent_id.clone(),
            capability: a.capability.clone(),
            task: snap.task.name.clone(),
            input: json_to_struct(input),
            context: Some(InvocationContext {
                correlation: Some(snap.correlation()),
                attempt: snap.attempt,
                // Stable across retries and restarts: the agent can deduplicate.
                idempotency_key: format!("{job_id}/{task_id}{}", snap.scope),
                budget_id: snap.budget_id.clone(),
                delegation_depth: snap.delegation_depth,
                grant: self.x.grant(snap, &c.agent_id, tokens, timeout),
                user_message: snap.user_message.clone(),
                ..Default::default()
            }),
            limits: Some(AgentLimits {
                max_turns: 0,
                max_tokens: tokens,
                time_budget_ms: timeout.as_millis() as u64,
            }),
        };
        let book = &self.x.inner.book;
        let call = async {
            let mut stream = client.invoke(req).await.map_err(classify)?;
            while let Some(msg) = stream.next().await {
                match msg.map_err(classify)?.message {
                    Some(Message::Progress(p)) => {
                        if !p.output_chunk.is_empty() {
                            let out = events::Output {
                                stream: "agent".into(),
                                chunk: p.output_chunk,
                            };
                            book.note(job_id, task_id, JobEvent::Output(out));
                        }
                        if !p.message.is_empty() || p.percent.is_some() {
                            let progress = events::AgentProgress {
                                agent_id: c.agent_id.clone(),
                                message: p.message,
                                percent: p.percent,
                            };
                            book.note(job_id, task_id, JobEvent::AgentProgress(progress));
                        }
                    }
                    Some(Message::Response(r)) => return Ok(r),
                    None => {}
                }
            }
            Err(CallError::Failed(
                "the agent ended its stream without a response".into(),
            ))
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout),
        }
    }
}

impl Executor {
    /// The client of candidate `c`: the built-ins in this process (every
    /// executor replica hosts the same ones, so whichever registered last,
    /// they are called here), an A2A agent through its adapter, any other
    /// over gRPC; never with this process's credential.
    fn agent_client(&self, c: &Candidate) -> Result<AgentClient, String> {
        let endpoint = c.endpoint.as_str();
        let builtin = self.inner.cfg.builtin_agents && c.agent_id == crate::builtin::AGENT_ID;
        if builtin || endpoint == *crate::lock(&self.inner.local_endpoint) {
            return Ok(AgentClient::local(self.inner.local_agents.clone()));
        }
        // A re-registration may change how an A2A agent is spoken to.
        let key = match &c.a2a {
            Some(b) => format!("a2a {} {} {endpoint}", b.protocol_version, b.streaming),
            None => endpoint.to_owned(),
        };
        let mut agents = crate::lock(&self.inner.agents);
        if let Some(c) = agents.get(&key) {
            return Ok(c.clone());
        }
        // Agents are third parties: they never get this process's credential.
        let client = match &c.a2a {
            Some(binding) => {
                let http = self.inner.a2a_http.as_ref().map_err(Clone::clone)?;
                let agent = switchyard_a2a::A2aAgent::new(http.clone(), endpoint, binding);
                AgentClient::local(std::sync::Arc::new(agent))
            }
            None => {
                let channel =
                    switchyard_kit::client::lazy_channel(endpoint).map_err(|e| e.to_string())?;
                AgentClient::remote(
                    switchyard_kit::client::authed(channel, None),
                    self.inner.max_message_bytes,
                )
            }
        };
        agents.insert(key, client.clone());
        Ok(client)
    }
}

/// A call made on a hold, to settle.
struct Called<'a> {
    spender: &'a Spender<'a>,
    a: &'a AgentTask,
    c: &'a Candidate,
    hold: &'a Hold,
    /// The candidate's price: what a successful call costs at least.
    cost: i64,
    latency: Duration,
}

impl Called<'_> {
    fn event(&self, status: &str, error: &str) {
        let s = self.spender.snap;
        switchyard_kit::metrics::global()
            .agent_calls
            .get_or_create(&switchyard_kit::metrics::AgentCallLabels {
                agent_id: self.c.agent_id.clone(),
                outcome: status.to_owned(),
            })
            .inc();
        let called = events::AgentCalled {
            agent_id: self.c.agent_id.clone(),
            status: status.to_owned(),
            latency_ms: self.latency.as_millis() as u64,
            error: error.to_owned(),
        };
        self.spender
            .x
            .inner
            .book
            .note(&s.job_id, &s.task.id, JobEvent::AgentCalled(called));
    }

    /// Tells the registry how the call went: in-process a quick in-memory
    /// update; over gRPC it must not hold up the task, so it goes on in the
    /// background, in the job's trace and context, waiting a while for a
    /// registry that cannot be reached.
    fn report(&self, success: bool) {
        let x = self.spender.x.clone();
        let registry = x.inner.clients.registry.clone();
        let req = ReportOutcomeRequest {
            agent_id: self.c.agent_id.clone(),
            capability: self.a.capability.clone(),
            success,
            latency: Some(switchyard_kit::time::duration(
                self.latency.as_millis() as u64
            )),
        };
        if registry.is_local() {
            let _ = futures_util::FutureExt::now_or_never(registry.report_outcome(req));
        } else {
            let until = x.inner.book.now() + REPORT_PATIENCE_MS;
            let report = async move {
                let waiter = x.waiter("", "").until(Some(until));
                let sent = waiter
                    .call(Service::Registry, || registry.report_outcome(req.clone()))
                    .await;
                if let Err(e) = sent {
                    tracing::warn!(error = %e.message(), "reporting an agent call's outcome");
                }
            };
            tokio::spawn(switchyard_kit::context::propagate(report));
        }
    }

    /// The agent answered ERROR (or its call failed): the retry policy decides.
    fn agent_error(&self, msg: String) -> Next {
        self.event("error", &msg);
        self.report(false);
        let why = format!("agent {}: {msg}", self.c.agent_id);
        Next::Done(Outcome::fail(Class::Other, Reason::AgentError, why))
    }

    /// Settles the hold and decides what the call means for the attempt.
    async fn settle(self, called: Result<AgentResponse, CallError>, timeout: Duration) -> Next {
        let id = &self.c.agent_id;
        match called {
            Err(CallError::Timeout) => {
                self.spender
                    .release(self.hold, "agent call timed out")
                    .await;
                self.event("timeout", "");
                self.report(false);
                let why = format!("agent {id} did not answer within {} s", timeout.as_secs());
                Next::Done(Outcome::fail(Class::Timeout, Reason::TaskTimeout, why))
            }
            Err(CallError::Unreachable(msg)) => {
                self.spender.release(self.hold, "agent unreachable").await;
                self.event("unreachable", &msg);
                self.report(false);
                let why = format!("agent {id} is unreachable: {msg}");
                let out = Outcome::fail(Class::Other, Reason::AgentUnreachable, why);
                if schedule::next_on_offline(&self.spender.snap.task) {
                    Next::Try(out)
                } else {
                    Next::Done(out)
                }
            }
            Err(CallError::Failed(msg)) => {
                self.spender.release(self.hold, "agent call failed").await;
                self.agent_error(msg)
            }
            Ok(resp) => self.answered(resp).await,
        }
    }

    /// The agent answered: refused (try the next), or charge what it used
    /// and take its output or error.
    async fn answered(self, resp: AgentResponse) -> Next {
        let status = ResponseStatus::try_from(resp.status).unwrap_or(ResponseStatus::Unspecified);
        if status == ResponseStatus::Refused {
            self.spender.release(self.hold, "agent refused").await;
            self.event("refused", &resp.error);
            let why = format!(
                "every candidate refused; last, {}: {}",
                self.c.agent_id, resp.error
            );
            return Next::Try(Outcome::fail(Class::Other, Reason::AgentRefused, why));
        }
        self.charge(&resp, status == ResponseStatus::Success).await;
        if status != ResponseStatus::Success {
            let msg = if resp.error.is_empty() {
                "the agent reported an error".to_owned()
            } else {
                resp.error.clone()
            };
            return self.agent_error(msg);
        }
        self.event("success", "");
        self.report(true);
        if !resp.artifacts.is_empty() {
            let s = self.spender.snap;
            let kept = self
                .spender
                .x
                .keep_artifacts(&s.job_id, &s.task.id, &resp.artifacts);
            if let Err(e) = kept {
                return Next::Done(super::artifact_refused(e));
            }
        }
        let mut output = resp
            .output
            .as_ref()
            .map(struct_to_json)
            .unwrap_or_else(|| json!({}));
        if let Some(o) = output.as_object_mut() {
            for (from, to) in &self.a.output_mapping {
                if let Some(v) = o.remove(from) {
                    o.insert(to.clone(), v);
                }
            }
            if !resp.content.is_empty() {
                o.entry("content")
                    .or_insert(Value::String(resp.content.clone()));
            }
        }
        Next::Done(Outcome::ok(TaskStatus {
            task_id: self.spender.snap.task.id.clone(),
            output: json_to_struct(&output),
            agent_id: self.c.agent_id.clone(),
            ..Default::default()
        }))
    }

    /// Commits what the call used — the agent's report (never the
    /// client's), and at least its price when it succeeded — or releases
    /// the hold. A self-billing agent has committed its own model calls on
    /// the job's budget already: they are recorded, and only its price is
    /// charged here.
    async fn charge(&self, resp: &AgentResponse, success: bool) {
        let snap = self.spender.snap;
        let billed = self.c.bills_tokens && resp.billed;
        let reported_cost = resp.cost.map_or(0, |m| m.micro_usd);
        if billed && (resp.tokens_used > 0 || reported_cost > 0) {
            let by_agent = events::BilledByAgent {
                agent_id: self.c.agent_id.clone(),
                model: resp.model_used.clone(),
                tokens: resp.tokens_used,
                cost_micro_usd: reported_cost,
            };
            let book = &self.spender.x.inner.book;
            book.note(
                &snap.job_id,
                &snap.task.id,
                JobEvent::BilledByAgent(by_agent),
            );
        }
        let (tokens, reported) = if billed {
            (0, 0)
        } else {
            (resp.tokens_used, reported_cost)
        };
        let cost = reported.max(if success { self.cost } else { 0 });
        // Per agent, whoever paid: its own commits (billed) or ours.
        let m = switchyard_kit::metrics::global();
        let agent = switchyard_kit::metrics::AgentLabels {
            agent_id: self.c.agent_id.clone(),
        };
        m.agent_tokens
            .get_or_create(&agent)
            .inc_by(resp.tokens_used);
        m.agent_cost_micro_usd
            .get_or_create(&agent)
            .inc_by(u64::try_from(cost.max(reported_cost)).unwrap_or(0));
        if tokens == 0 && cost == 0 {
            // Nothing to account for: release off the task's path; the
            // job's end waits for it.
            let (x, hold) = (self.spender.x.clone(), self.hold.clone());
            let (job, task) = (snap.job_id.clone(), snap.task.id.clone());
            self.spender.x.settle_later(&snap.job_id, async move {
                super::release(&x, &job, &task, &hold, "nothing used").await;
            });
            return;
        }
        let entry = Entry {
            subtask_id: snap.task.id.clone(),
            agent_id: self.c.agent_id.clone(),
            model: resp.model_used.clone(),
            units: 1,
            price_per_unit: Some(UnitPrice {
                micro_usd_per_million: self.cost.saturating_mul(1_000_000),
            }),
            ..Default::default()
        };
        self.spender.commit(self.hold, tokens, cost, entry).await;
    }
}
