//! An input task's attempt: ask, then wait for SendInput's answer or the
//! end of the wait (see [`crate::input`]).
//!
//! The question is recorded (`task.input_requested`) and the task moves to
//! `input_required` durably before anyone can answer; the attempt then
//! waits on the [`crate::input::Desk`], holding no budget. Whoever takes
//! the attempt's place on the desk — SendInput with an answer, or this
//! attempt when the wait runs out — records how the wait ended under the
//! book's lock, so exactly one of them does. A restart keeps the deadline
//! (it is in the first record) and asks nobody twice: an answer recorded
//! before the restart is taken as it is.

use serde_json::{Value, json};
use switchyard_core::Reason;
use switchyard_core::lifecycle::TaskState;
use switchyard_proto::executor::v1::{InputTask, TaskStatus};

use super::{Attempt, Outcome};
use crate::book::Change;
use crate::events::{self, JobEvent};
use crate::input::{self, Delivery};
use crate::schedule::Class;

/// How the wait ended, as `task.input_received` records it.
pub(crate) const ANSWERED: &str = "answered";
/// The wait ran out and the task's default answer was taken.
pub(crate) const DEFAULTED: &str = "default";
/// The wait ran out with no default: the task fails.
pub(crate) const TIMED_OUT: &str = "timed_out";

/// The task's output for an answer: `{"answer": …, "answered_by": …}`.
pub(crate) fn output(answer: &Value, by: &str) -> TaskStatus {
    TaskStatus {
        output: switchyard_kit::json::json_to_struct(&json!({
            "answer": answer,
            "answered_by": by,
        })),
        ..Default::default()
    }
}

impl Attempt<'_> {
    /// Asks (unless already asked), then waits for the answer, the end of
    /// the wait or the executor's drain.
    pub(crate) async fn input(&self, t: &InputTask) -> Outcome {
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        let wait_secs = input::wait_secs(t);
        let asked = {
            let mut st = book.lock();
            let e = match st.get(&s.job_id) {
                Ok(e) => e,
                Err(e) => return Outcome::fail(Class::Permanent, Reason::Internal, e.to_string()),
            };
            let i = e.index.get(&s.task.id).copied().unwrap_or_default();
            // Answered before a restart, the task's end not yet stored.
            if let Some(r) = e.answered.get(&s.task.id).cloned() {
                if e.task_state(i) == TaskState::InputRequired {
                    // The answer's record was stored without the move after it.
                    let c =
                        Change::to(TaskState::Running).because(Reason::InputRequired, "answered");
                    if let Err(e) = book.move_task(&mut st, &s.job_id, i, c) {
                        return Outcome::fail(Class::Other, Reason::Internal, e.to_string());
                    }
                }
                return ended(&r, wait_secs);
            }
            let earlier = e.asked.get(&s.task.id).map(|r| r.deadline_ms);
            let state = e.task_state(i);
            let prompt = match s.resolve_text(&t.prompt) {
                Ok(p) => p,
                Err(why) => {
                    return Outcome::fail(Class::Permanent, Reason::TemplateUnresolved, why);
                }
            };
            let deadline_ms =
                earlier.unwrap_or_else(|| book.now().saturating_add(wait_secs * 1000));
            // On the desk before anyone can see the task waiting.
            let waiting = x.inner.inputs.wait(&s.job_id, &s.task.id);
            let g = if state == TaskState::InputRequired {
                // Resumed after a restart: already asked, and durable.
                book.last()
            } else {
                let ev = events::InputRequested {
                    prompt,
                    attempt: s.attempt,
                    wait_secs,
                    deadline_ms,
                };
                book.record(&mut st, &s.job_id, &s.task.id, JobEvent::InputRequested(ev));
                let why = format!("waiting up to {wait_secs} s for an answer (SendInput)");
                let c = Change::to(TaskState::InputRequired).because(Reason::InputRequired, &why);
                match book.move_task(&mut st, &s.job_id, i, c) {
                    Ok(g) => g,
                    Err(e) => {
                        return Outcome::fail(Class::Other, Reason::Internal, e.to_string());
                    }
                }
            };
            (waiting, deadline_ms, g)
        };
        let (mut waiting, deadline_ms, g) = asked;
        if let Err(e) = book.durable(g).await {
            return Outcome::fail(Class::Other, Reason::StorageFailure, e.to_string());
        }
        let left = std::time::Duration::from_millis(deadline_ms.saturating_sub(book.now()));
        tokio::select! {
            delivered = waiting.answer() => delivered.map_or_else(Outcome::parked, answered),
            () = tokio::time::sleep(left) => match self.time_out(t, wait_secs) {
                Some(out) => out,
                // SendInput took the desk first: its answer is on the way.
                None => waiting.answer().await.map_or_else(Outcome::parked, answered),
            },
            // Handed back with the job (also when the drain began before
            // this attempt did): the task stays input_required and waits
            // again wherever the job runs next.
            () = x.inner.draining.wait() => Outcome::parked(),
        }
    }

    /// The wait ran out: records it and ends with the default answer or
    /// INPUT_TIMEOUT — unless SendInput took the desk first (`None`).
    fn time_out(&self, t: &InputTask, wait_secs: u64) -> Option<Outcome> {
        let (x, s) = (self.x, self.snap);
        let book = &x.inner.book;
        let mut st = book.lock();
        x.inner.inputs.take(&s.job_id, &s.task.id)?;
        let i = st.get(&s.job_id).ok()?.index.get(&s.task.id).copied()?;
        let default = t
            .default_answer
            .as_ref()
            .map(switchyard_kit::json::value_to_json);
        let r = events::InputReceived {
            outcome: if default.is_some() {
                DEFAULTED
            } else {
                TIMED_OUT
            }
            .to_owned(),
            by: String::new(),
            idempotency_key: String::new(),
            answer: default.clone().unwrap_or(Value::Null),
        };
        let why = format!("nobody answered within {wait_secs} s");
        if let Err(e) = input::end_wait(book, &mut st, &s.job_id, &s.task.id, i, r.clone(), &why) {
            return Some(Outcome::fail(Class::Other, Reason::Internal, e.to_string()));
        }
        Some(ended(&r, wait_secs))
    }
}

/// The outcome of an answer SendInput handed over: the task's output, and
/// SendInput told once it is durable. (`None` from the desk — taken off
/// without an answer — only happens as the executor stops: parked.)
fn answered(d: Delivery) -> Outcome {
    let mut out = Outcome::ok(output(&d.answer, &d.by));
    out.settled = Some(d.settled);
    out
}

/// The outcome of a wait that ended as `r` records.
fn ended(r: &events::InputReceived, wait_secs: u64) -> Outcome {
    if r.outcome == TIMED_OUT {
        Outcome::fail(
            Class::Permanent,
            Reason::InputTimeout,
            format!(
                "nobody answered within {wait_secs} s and the task has no default_answer; answer sooner (SendInput) or give it a default"
            ),
        )
    } else {
        Outcome::ok(output(&r.answer, &r.by))
    }
}
