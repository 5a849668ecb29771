//! A conversation task's attempt: answer each message in order, wait for
//! the next (state `input_required`, holding no budget), end when closed,
//! full or idle (see [`crate::conversation`]).
//!
//! Every decision is taken under the book's lock from the conversation's
//! log, so a restart goes on where the log says: a message without a reply
//! is answered (the turn runs again from its start: what it streamed before
//! the crash was never recorded as the reply), an end recorded is not
//! recorded twice. SendMessage and this attempt meet on the input
//! [`crate::input::Desk`]: the attempt looks for an unanswered message and,
//! finding none, sits on the desk and moves to `input_required` under one
//! lock, so a message either is seen or wakes it.

use serde_json::{Value, json};
use switchyard_core::Reason;
use switchyard_core::lifecycle::TaskState;
use switchyard_proto::executor::v1::{ConversationTask, LlmTask, TaskStatus};

use super::handoff;
use super::llm::{HandoffTo, Turn};
use super::{Attempt, Outcome};
use crate::book::Change;
use crate::conversation::{self as talk, Talk};
use crate::events::{self, JobEvent};
use crate::schedule::Class;

/// What the conversation's log says the attempt has to do.
enum Seen {
    /// It ended (before a restart): the task's output.
    Ended(TaskStatus),
    /// Message `seq` waits for its reply: why the task runs.
    Pending(u32, String),
    /// A participant closed it, or it is full: the output and the record.
    Closing(TaskStatus, events::ConversationEnded),
    /// Nothing to answer: the last activity (ms) and the next message's number.
    Quiet(u64, u32),
}

/// Who answers a message, as it is being decided.
enum Plan {
    /// Answered (a notice): the reply's log position.
    Done(u64),
    /// The orchestrator answers this turn.
    Orchestrator(Turn),
    /// The agent of this handoff answers, sent these messages.
    Agent(events::HandoffStarted, Vec<Value>, String),
    /// The job's budget refused the turn: the message stays unanswered,
    /// the task ends `budget_paused` and the job asks for an extension
    /// (as any task's refusal does); approved, the task runs again and
    /// answers the message then.
    Paused(crate::schedule::Failure),
}

/// How an orchestrator's turn ended other than with a reply.
enum Turned {
    /// It handed the conversation to an agent (its turn spent these
    /// tokens and this money).
    HandOff(HandoffTo, (u64, i64)),
    /// Its budget refused it.
    Paused(crate::schedule::Failure),
}

/// The record of taking the conversation back from handoff `h` at `seq`.
fn reclaimed(h: &talk::Handoff, why: &str, result: Value, seq: u32) -> events::HandoffReclaimed {
    events::HandoffReclaimed {
        agent_id: h.started.agent_id.clone(),
        why: why.to_owned(),
        result,
        seq,
        turns: h.turns,
        tokens: h.tokens,
        cost_micro_usd: h.cost,
    }
}

/// Message `text` as the orchestrator is given it: after a reclaim, with
/// what the agent that held the conversation handed back (not its
/// exchanges with the person).
fn with_note(r: Option<&events::HandoffReclaimed>, text: &str) -> String {
    let Some(r) = r else {
        return text.to_owned();
    };
    let what = if r.why == talk::HANDED_BACK {
        format!("handed it back with the result {}", r.result)
    } else {
        format!("was taken back from it ({}; {})", r.why, r.result)
    };
    format!(
        "[The agent {} held the conversation for {} messages and {what}.]\n\n{text}",
        r.agent_id, r.turns
    )
}

/// What the attempt does next, decided under the lock.
enum Next<'a> {
    /// Answer message `seq`.
    Answer(u32),
    /// The conversation is over: end the task with this output.
    End(Box<TaskStatus>, u64),
    /// Wait for a message (or the idle time) on the desk.
    Wait(crate::input::Waiting<'a>, u64, u64),
}

impl Attempt<'_> {
    /// Runs the conversation until it ends, or parks it (drain).
    pub(crate) async fn conversation(&self, c: &ConversationTask) -> Outcome {
        let orchestrator = c.orchestrator.clone().unwrap_or_default();
        // The last reply's record, made durable with what follows it (the
        // move to waiting, or before the next turn): one flush, not two.
        let mut unflushed = 0;
        loop {
            let next = match self.next(c) {
                Ok(n) => n,
                Err(e) => return Outcome::fail(Class::Other, Reason::Internal, e.to_string()),
            };
            let book = &self.x.inner.book;
            match next {
                Next::Answer(seq) => {
                    // The reply before it is durable before another model
                    // call is made.
                    if let Err(e) = book.durable(unflushed).await {
                        return Outcome::fail(Class::Other, Reason::StorageFailure, e.to_string());
                    }
                    match self.answer(c, &orchestrator, seq).await {
                        Ok(g) => unflushed = g,
                        Err(paused) => {
                            // What it answered before is kept; this
                            // message waits for the extension.
                            if let Err(e) = book.durable(unflushed).await {
                                let why = e.to_string();
                                return Outcome::fail(Class::Other, Reason::StorageFailure, why);
                            }
                            return Outcome::fail(paused.class, paused.reason, paused.error);
                        }
                    }
                }
                Next::End(status, g) => {
                    if let Err(e) = book.durable(g).await {
                        return Outcome::fail(Class::Other, Reason::StorageFailure, e.to_string());
                    }
                    return Outcome::ok(*status);
                }
                Next::Wait(mut waiting, g, deadline_ms) => {
                    if let Err(e) = book.durable(g).await {
                        return Outcome::fail(Class::Other, Reason::StorageFailure, e.to_string());
                    }
                    let left =
                        std::time::Duration::from_millis(deadline_ms.saturating_sub(book.now()));
                    tokio::select! {
                        woken = waiting.answer() => if woken.is_none() {
                            return Outcome::parked();
                        },
                        () = tokio::time::sleep(left) => {
                            if let Some(out) = self.idle(c) {
                                return out;
                            }
                            // A message took the desk first: answer it.
                            if waiting.answer().await.is_none() {
                                return Outcome::parked();
                            }
                        }
                        () = self.x.inner.draining.wait() => return Outcome::parked(),
                    }
                }
            }
        }
    }

    /// What to do next, as the conversation's log says.
    fn next(&self, c: &ConversationTask) -> Result<Next<'_>, crate::error::ExecutorError> {
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        let task_id = s.task.id.as_str();
        let mut st = book.lock();
        let e = st.get(&s.job_id)?;
        let i = e.index[task_id];
        let state = e.task_state(i);
        // What the log says, read in place (the conversation is not copied).
        let seen = {
            let empty = Talk::default();
            let t = e.talks.get(task_id).unwrap_or(&empty);
            let full = t.turns.len() as u32 >= talk::max_messages(c);
            if let Some(end) = &t.ended {
                Seen::Ended(output(t, end))
            } else if let Some(p) = t.pending() {
                let seq = p.message.seq;
                Seen::Pending(seq, format!("message {seq} from {}", p.message.by))
            } else if let Some(by) = t.closed_by().map(str::to_owned).or(full.then(String::new)) {
                let end = events::ConversationEnded {
                    messages: t.turns.len() as u32,
                    why: if full && by.is_empty() {
                        talk::FULL
                    } else {
                        talk::CLOSED
                    }
                    .to_owned(),
                    by,
                };
                Seen::Closing(output(t, &end), end)
            } else {
                let since = t.last_activity_ms().unwrap_or_else(|| {
                    e.job.tasks[i]
                        .started_at
                        .as_ref()
                        .map_or_else(|| book.now(), switchyard_kit::time::timestamp_ms)
                });
                Seen::Quiet(since, t.turns.len() as u32 + 1)
            }
        };
        // A task waiting for a message that has something to do runs again.
        let mut resume = |why: &str| -> Result<(), crate::error::ExecutorError> {
            if state == TaskState::InputRequired {
                let ch = Change::to(TaskState::Running).because(Reason::InputRequired, why);
                book.move_task(&mut st, &s.job_id, i, ch)?;
            }
            Ok(())
        };
        match seen {
            // Ended before a restart, the task's end not yet stored.
            Seen::Ended(status) => {
                resume("ended")?;
                Ok(Next::End(Box::new(status), book.last()))
            }
            // Recorded while the attempt was not on the desk (answering,
            // or resuming).
            Seen::Pending(seq, why) => {
                resume(&why)?;
                Ok(Next::Answer(seq))
            }
            Seen::Closing(status, end) => {
                resume(&end.why)?;
                let g = talk::record_move(
                    book,
                    &mut st,
                    &s.job_id,
                    task_id,
                    JobEvent::ConversationEnded(end),
                )?;
                Ok(Next::End(Box::new(status), g))
            }
            Seen::Quiet(since, next_seq) => {
                let deadline_ms = since.saturating_add(talk::idle_secs(c) * 1000);
                let waiting = x.inner.inputs.wait(&s.job_id, task_id);
                let g = if state == TaskState::InputRequired {
                    book.last()
                } else {
                    let why = format!("waiting for message {next_seq} (SendMessage)");
                    let ch =
                        Change::to(TaskState::InputRequired).because(Reason::InputRequired, &why);
                    book.move_task(&mut st, &s.job_id, i, ch)?
                };
                Ok(Next::Wait(waiting, g, deadline_ms))
            }
        }
    }

    /// Answers message `seq` and records the reply; the record's log
    /// position (not yet durable), or the budget's refusal (the message
    /// stays unanswered). The agent holding the conversation answers, or
    /// the orchestrator — which may hand the conversation off (the agent
    /// then answers this message), or take it back first.
    async fn answer(
        &self,
        c: &ConversationTask,
        orchestrator: &LlmTask,
        seq: u32,
    ) -> Result<u64, crate::schedule::Failure> {
        let mut plan = self.plan(c, seq);
        loop {
            plan = match plan {
                Plan::Done(g) => return Ok(g),
                Plan::Paused(f) => return Err(f),
                Plan::Orchestrator(turn) => {
                    match self.orchestrator_turn(orchestrator, seq, turn).await {
                        Ok(g) => return Ok(g),
                        Err(Turned::HandOff(h, spent)) => self.hand_off(seq, h, spent),
                        Err(Turned::Paused(f)) => return Err(f),
                    }
                }
                Plan::Agent(h, messages, text) => {
                    self.delegated_turn(seq, &h, messages, &text).await
                }
            };
        }
    }

    /// Who answers message `seq`, taking the conversation back first when a
    /// reclaim trigger says so (the person's `/reclaim` is answered with a
    /// notice, no model call).
    fn plan(&self, c: &ConversationTask, seq: u32) -> Plan {
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        let limits = handoff::limits(c);
        let mut st = book.lock();
        let decided = {
            let Ok(e) = st.get(&s.job_id) else {
                return Plan::Done(book.last());
            };
            let empty = Talk::default();
            let t = e.talks.get(&s.task.id).unwrap_or(&empty);
            let Some(m) = (seq as usize).checked_sub(1).and_then(|i| t.turns.get(i)) else {
                return Plan::Done(book.last());
            };
            let text = m.message.text.clone();
            match &t.handoff {
                Some(h) => match handoff::reclaim_before(t, &limits, &text, book.now()) {
                    Some(why) => Err((reclaimed(h, why, Value::Null, seq), t.history(seq), text)),
                    None => Ok(Plan::Agent(h.started.clone(), t.since_handoff(seq), text)),
                },
                None => Ok(Plan::Orchestrator(Turn {
                    history: t.history(seq),
                    text: with_note(t.reclaimed.as_ref(), &text),
                    handoffs: true,
                    seq,
                })),
            }
        };
        match decided {
            Ok(plan) => plan,
            Err((r, history, text)) => {
                let why = r.why.clone();
                let note = with_note(Some(&r), &text);
                let agent = r.agent_id.clone();
                if let Err(failed) =
                    self.move_or_fail(&mut st, seq, JobEvent::HandoffReclaimed(r), "answered")
                {
                    return Plan::Done(failed);
                }
                if why == talk::BY_USER {
                    let text = format!(
                        "You are back with the orchestrator: {agent} no longer holds the conversation (you asked)."
                    );
                    return Plan::Done(self.record_reply(
                        &mut st,
                        seq,
                        talk::ANSWERED,
                        text,
                        None,
                        "",
                    ));
                }
                Plan::Orchestrator(Turn {
                    history,
                    text: note,
                    handoffs: false,
                    seq,
                })
            }
        }
    }

    /// The orchestrator answers message `seq`: the reply's log position, or
    /// the handoff it asked for instead, or its budget's refusal.
    async fn orchestrator_turn(
        &self,
        orchestrator: &LlmTask,
        seq: u32,
        turn: Turn,
    ) -> Result<u64, Turned> {
        // The turn's reservations and calls have keys of their own.
        let snap = super::Snapshot {
            scope: format!("{}/msg/{seq}", self.snap.scope),
            ..self.snap.clone()
        };
        let this_turn = Attempt {
            x: self.x,
            snap: &snap,
            timeout: self.timeout,
            scratch: self.scratch,
        };
        let (report, failure) = match this_turn.run_loop(orchestrator, Some(turn)).await {
            Ok(ran) => {
                if let (Some(h), None) = (ran.handoff, &ran.failure) {
                    let spent = (ran.report.usage.total_tokens, ran.report.cost);
                    return Err(Turned::HandOff(h, spent));
                }
                match ran.failure {
                    Some(f) if f.class == Class::Budget => return Err(Turned::Paused(f)),
                    f => (ran.report, f),
                }
            }
            // The turn could not start (its log not durable, its tools not
            // found): a failed turn, the conversation goes on.
            Err(out) => (
                Default::default(),
                Some(out.failure.unwrap_or(crate::schedule::Failure {
                    class: Class::Other,
                    reason: Reason::Internal,
                    error: "the turn could not start".into(),
                })),
            ),
        };
        let (outcome, text, reason) = self.said(failure, report.content.clone());
        let book = &self.x.inner.book;
        let mut st = book.lock();
        Ok(self.record_reply(&mut st, seq, outcome, text, Some(&report), &reason))
    }

    /// The orchestrator handed the conversation to `h.agent_id` at message
    /// `seq` (its turn spent `tokens` and `cost`): recorded, and the agent
    /// answers that message.
    fn hand_off(&self, seq: u32, h: HandoffTo, (tokens, cost): (u64, i64)) -> Plan {
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        let mut st = book.lock();
        let Ok(e) = st.get(&s.job_id) else {
            return Plan::Done(book.last());
        };
        let text = e
            .talks
            .get(&s.task.id)
            .map(|t| t.turns.as_slice())
            .unwrap_or_default()
            .get(seq as usize - 1)
            .map(|m| m.message.text.clone())
            .unwrap_or_default();
        let started = events::HandoffStarted {
            agent_id: h.agent_id,
            capability: h.capability,
            task: h.task,
            seq,
            at_ms: book.now(),
            orchestrator_tokens: tokens,
            orchestrator_cost_micro_usd: cost,
        };
        let started_ev = JobEvent::HandoffStarted(started.clone());
        if let Err(failed) = self.move_or_fail(&mut st, seq, started_ev, "handed off") {
            return Plan::Done(failed);
        }
        let messages = vec![json!({"role": "user", "text": text})];
        Plan::Agent(started, messages, text)
    }

    /// The agent holding the conversation answers message `seq`; when it
    /// fails or refuses, the orchestrator takes the conversation back and
    /// answers instead.
    async fn delegated_turn(
        &self,
        seq: u32,
        h: &events::HandoffStarted,
        messages: Vec<Value>,
        text: &str,
    ) -> Plan {
        let answered = self.agent_turn(h, seq, text, messages).await;
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        let mut st = book.lock();
        let current = st
            .get(&s.job_id)
            .ok()
            .and_then(|e| e.talks.get(&s.task.id))
            .and_then(|t| t.handoff.clone())
            .unwrap_or_else(|| talk::Handoff {
                started: h.clone(),
                ..Default::default()
            });
        match answered {
            handoff::Answered::Reply { text, handback, .. } => {
                let mut r = self.reply_record(seq, talk::ANSWERED, text, None, "");
                r.agent_id.clone_from(&h.agent_id);
                let mut g = book.record(&mut st, &s.job_id, &s.task.id, JobEvent::Replied(r));
                if let Some(result) = handback {
                    let back = reclaimed(&current, talk::HANDED_BACK, result, seq);
                    let moved = talk::record_move(
                        book,
                        &mut st,
                        &s.job_id,
                        &s.task.id,
                        JobEvent::HandoffReclaimed(back),
                    );
                    match moved {
                        Ok(moved) => g = moved,
                        Err(e) => tracing::warn!(error = %e, "the hand-back was not recorded"),
                    }
                }
                Plan::Done(g)
            }
            // The job's budget refused the agent's turn: the job pauses,
            // and the agent still holds the conversation when it resumes.
            handoff::Answered::Paused(error, reason) => Plan::Paused(crate::schedule::Failure {
                class: Class::Budget,
                reason,
                error,
            }),
            handoff::Answered::Failed { status, error, .. } => {
                let mut back = reclaimed(&current, status, Value::Null, seq);
                back.result = json!({"error": error});
                let note = with_note(Some(&back), text);
                if let Err(failed) =
                    self.move_or_fail(&mut st, seq, JobEvent::HandoffReclaimed(back), "answered")
                {
                    return Plan::Done(failed);
                }
                let history = st
                    .get(&s.job_id)
                    .ok()
                    .and_then(|e| e.talks.get(&s.task.id))
                    .map(|t| t.history(seq))
                    .unwrap_or_default();
                Plan::Orchestrator(Turn {
                    history,
                    text: note,
                    handoffs: false,
                    seq,
                })
            }
        }
    }

    /// How a turn that ended with `failure` (or answered `content`) is
    /// told: (outcome, text, reason).
    fn said(
        &self,
        failure: Option<crate::schedule::Failure>,
        content: String,
    ) -> (&'static str, String, String) {
        match failure {
            None => (talk::ANSWERED, content, String::new()),
            Some(f) => (
                talk::FAILED,
                format!("This message could not be answered: {}", f.error),
                f.reason.as_str().to_owned(),
            ),
        }
    }

    /// The reply to message `seq`, with what the orchestrator's run used.
    fn reply_record(
        &self,
        seq: u32,
        outcome: &str,
        text: String,
        report: Option<&switchyard_llm::agent::Report>,
        reason: &str,
    ) -> events::Replied {
        let empty = switchyard_llm::agent::Report::default();
        let report = report.unwrap_or(&empty);
        events::Replied {
            seq,
            outcome: outcome.to_owned(),
            text,
            model: report.model_used.clone(),
            prompt_tokens: report.usage.prompt_tokens,
            completion_tokens: report.usage.completion_tokens,
            total_tokens: report.usage.total_tokens,
            llm_calls: report.llm_calls,
            reason: reason.to_owned(),
            at_ms: self.x.inner.book.now(),
            agent_id: String::new(),
            cost_micro_usd: report.cost,
        }
    }

    /// Records `ev`, a change of who holds the conversation, through the
    /// holder table; a refused change answers message `seq` as not `what`
    /// instead (`Err`: that reply's log position).
    fn move_or_fail(
        &self,
        st: &mut crate::book::Jobs,
        seq: u32,
        ev: JobEvent,
        what: &str,
    ) -> Result<u64, u64> {
        let s = self.snap;
        talk::record_move(&self.x.inner.book, st, &s.job_id, &s.task.id, ev).map_err(|e| {
            let text = format!("This message could not be {what}: {e}");
            self.record_reply(st, seq, talk::FAILED, text, None, "")
        })
    }

    /// Records the orchestrator's reply to message `seq`; its log position.
    fn record_reply(
        &self,
        st: &mut crate::book::Jobs,
        seq: u32,
        outcome: &str,
        text: String,
        report: Option<&switchyard_llm::agent::Report>,
        reason: &str,
    ) -> u64 {
        let r = self.reply_record(seq, outcome, text, report, reason);
        let s = self.snap;
        self.x
            .inner
            .book
            .record(st, &s.job_id, &s.task.id, JobEvent::Replied(r))
    }

    /// Nobody wrote within the idle time: ends the conversation, unless a
    /// message took the desk first (`None`).
    fn idle(&self, c: &ConversationTask) -> Option<Outcome> {
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        // The driver records the task's end after this, and makes both
        // durable together.
        let mut st = book.lock();
        x.inner.inputs.take(&s.job_id, &s.task.id)?;
        {
            let e = st.get(&s.job_id).ok()?;
            let i = e.index[&s.task.id];
            let t = e.talks.get(&s.task.id).cloned().unwrap_or_default();
            let end = events::ConversationEnded {
                messages: t.turns.len() as u32,
                by: String::new(),
                why: talk::IDLE.to_owned(),
            };
            let status = output(&t, &end);
            let ended = talk::record_move(
                book,
                &mut st,
                &s.job_id,
                &s.task.id,
                JobEvent::ConversationEnded(end),
            );
            if let Err(e) = ended {
                return Some(Outcome::fail(Class::Other, Reason::Internal, e.to_string()));
            }
            let why = format!("nobody wrote within {} s", talk::idle_secs(c));
            let ch = Change::to(TaskState::Running).because(Reason::InputRequired, &why);
            Some(match book.move_task(&mut st, &s.job_id, i, ch) {
                Ok(_) => Outcome::ok(status),
                Err(e) => Outcome::fail(Class::Other, Reason::Internal, e.to_string()),
            })
        }
    }
}

/// The task's output once the conversation ended: how many messages, how
/// it ended and by whom, and the tokens of every turn.
fn output(t: &Talk, end: &events::ConversationEnded) -> TaskStatus {
    let last = t
        .turns
        .iter()
        .rev()
        .find_map(|t| t.reply.as_ref().filter(|r| r.outcome == talk::ANSWERED))
        .map(|r| r.text.clone())
        .unwrap_or_default();
    TaskStatus {
        output: switchyard_kit::json::json_to_struct(&json!({
            "messages": end.messages,
            "ended": end.why,
            "closed_by": end.by,
            "last_reply": last,
        })),
        llm_usage: Some(t.usage()),
        ..Default::default()
    }
}
