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

use serde_json::json;
use switchyard_core::Reason;
use switchyard_core::lifecycle::TaskState;
use switchyard_proto::executor::v1::{ConversationTask, TaskStatus};

use super::llm::Turn;
use super::{Attempt, Outcome};
use crate::book::Change;
use crate::conversation::{self as talk, Talk};
use crate::events::{self, JobEvent};
use crate::schedule::Class;

/// What the conversation's log says the attempt has to do.
enum Seen {
    /// It ended (before a restart): the task's output.
    Ended(TaskStatus),
    /// Message `seq` waits for its reply: why the task runs, the turn.
    Pending(u32, String, Turn),
    /// A participant closed it, or it is full: the output and the record.
    Closing(TaskStatus, events::ConversationEnded),
    /// Nothing to answer: the last activity (ms) and the next message's number.
    Quiet(u64, u32),
}

/// What the attempt does next, decided under the lock.
enum Next<'a> {
    /// Answer message `seq`.
    Answer(u32, Turn),
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
                Next::Answer(seq, turn) => {
                    // The reply before it is durable before another model
                    // call is made.
                    if let Err(e) = book.durable(unflushed).await {
                        return Outcome::fail(Class::Other, Reason::StorageFailure, e.to_string());
                    }
                    unflushed = self.answer(&orchestrator, seq, turn).await;
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
                let turn = Turn {
                    history: t.history(seq),
                    text: p.message.text.clone(),
                };
                Seen::Pending(seq, format!("message {seq} from {}", p.message.by), turn)
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
            Seen::Pending(seq, why, turn) => {
                resume(&why)?;
                Ok(Next::Answer(seq, turn))
            }
            Seen::Closing(status, end) => {
                resume(&end.why)?;
                let g = book.record(
                    &mut st,
                    &s.job_id,
                    task_id,
                    JobEvent::ConversationEnded(end),
                );
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

    /// Runs the turn for message `seq` and records its reply; the record's
    /// log position (not yet durable).
    async fn answer(
        &self,
        orchestrator: &switchyard_proto::executor::v1::LlmTask,
        seq: u32,
        turn: Turn,
    ) -> u64 {
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
            Ok((report, failure, _children)) => (report, failure),
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
        let (outcome, text, reason) = match failure {
            None => (talk::ANSWERED, report.content.clone(), String::new()),
            Some(f) if f.class == Class::Budget => (
                talk::PAUSED,
                format!(
                    "This conversation is paused: its budget is used up ({}). Nothing more was spent on this message; someone who manages budgets can raise it (`switchyard budget update {} --tokens N`), and the next message tries again; or close the conversation.",
                    f.error, self.snap.budget_id
                ),
                f.reason.as_str().to_owned(),
            ),
            Some(f) => (
                talk::FAILED,
                format!("This message could not be answered: {}", f.error),
                f.reason.as_str().to_owned(),
            ),
        };
        let book = &self.x.inner.book;
        let r = events::Replied {
            seq,
            outcome: outcome.to_owned(),
            text,
            model: report.model_used.clone(),
            prompt_tokens: report.usage.prompt_tokens,
            completion_tokens: report.usage.completion_tokens,
            total_tokens: report.usage.total_tokens,
            llm_calls: report.llm_calls,
            reason,
            at_ms: book.now(),
        };
        let mut st = book.lock();
        book.record(
            &mut st,
            &self.snap.job_id,
            &self.snap.task.id,
            JobEvent::Replied(r),
        )
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
            book.record(
                &mut st,
                &s.job_id,
                &s.task.id,
                JobEvent::ConversationEnded(end),
            );
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
