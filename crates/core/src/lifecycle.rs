//! The executor's state machines, each one table: jobs (the OJS eight
//! states, seed 000), tasks (ARCHITECTURE.md) and who holds a conversation
//! (seed ADR 003 handoff mode). Every change goes through
//! [`JobState::check`] / [`TaskState::check`] / [`Holder::check`]; a
//! refusal's reason depends only on the `(from, to)` pair.

use std::fmt;

use crate::Reason;

/// Why a job or task transition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} cannot move from {from} to {to}: {}", .reason.as_str().to_lowercase().replace('_', " "))]
pub struct Refused {
    /// `job` or `task`.
    pub what: &'static str,
    /// State it is in.
    pub from: &'static str,
    /// State asked for.
    pub to: &'static str,
    /// `JOB_TERMINAL`, `TASK_TERMINAL` or `TRANSITION_NOT_ALLOWED`.
    pub reason: Reason,
}

macro_rules! machine {
    (
        $(#[$meta:meta])* $name:ident, $what:literal, $terminal_reason:ident,
        states { $($(#[$sm:meta])* $state:ident => $text:literal,)* }
        terminal [$($term:ident),*]
        table { $($from:ident => [$($to:ident),*],)* }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$sm])* $state,)* }

        impl $name {
            /// Every state.
            pub const ALL: &'static [$name] = &[$($name::$state,)*];

            /// Allowed transitions: each state and where it may go.
            pub const TRANSITIONS: &'static [($name, &'static [$name])] =
                &[$(($name::$from, &[$($name::$to),*]),)*];

            /// The wire/display name.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$state => $text,)* }
            }

            /// Parses the display name.
            pub fn parse(s: &str) -> Option<$name> {
                match s { $($text => Some($name::$state),)* _ => None }
            }

            /// States nothing leaves.
            pub const fn is_terminal(self) -> bool {
                matches!(self, $($name::$term)|*)
            }

            /// True when the table allows `self -> to`.
            pub fn allows(self, to: $name) -> bool {
                Self::TRANSITIONS
                    .iter()
                    .any(|(f, tos)| *f == self && tos.contains(&to))
            }

            /// Checks `self -> to` against the table.
            pub fn check(self, to: $name) -> Result<(), Refused> {
                if self.allows(to) {
                    return Ok(());
                }
                let reason = if self.is_terminal() {
                    Reason::$terminal_reason
                } else {
                    Reason::TransitionNotAllowed
                };
                Err(Refused { what: $what, from: self.as_str(), to: to.as_str(), reason })
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

machine! {
    /// Job states: the OJS lifecycle.
    JobState, "job", JobTerminal,
    states {
        /// Approved, waiting for its scheduled time.
        Scheduled => "scheduled",
        /// Approved and due: waiting for a worker.
        Available => "available",
        /// Waiting for approval.
        Pending => "pending",
        /// A worker is running its tasks.
        Active => "active",
        /// Every task succeeded.
        Completed => "completed",
        /// Stopped by the budget by a release before `budget_paused`
        /// existed; none enters it now (kept so stored jobs still read).
        Retryable => "retryable",
        /// Cancelled by a person or rejected at approval.
        Cancelled => "cancelled",
        /// Failed for good, with partial results.
        Discarded => "discarded",
        /// Its budget (or the scope approved for it) ran out: nothing more
        /// is spent, finished tasks stay finished, and an extension request
        /// waits for a person. Approved, it goes on where it stopped.
        BudgetPaused => "budget_paused",
    }
    terminal [Completed, Cancelled, Discarded]
    table {
        Pending => [Scheduled, Available, Cancelled],
        Scheduled => [Available, Cancelled],
        Available => [Active, Cancelled],
        Active => [Completed, Retryable, Discarded, Cancelled, BudgetPaused],
        // budget_paused -> active: the extension was approved; ->
        // discarded: rejected or undecided in time; -> cancelled: by a person.
        BudgetPaused => [Active, Discarded, Cancelled],
        Retryable => [Available, Discarded, Cancelled],
        // Terminal but for one door: an operator retries a dead-lettered
        // job (RetryDeadLetter), which starts a new round at approval.
        Discarded => [Pending],
    }
}

machine! {
    /// Task states.
    TaskState, "task", TaskTerminal,
    states {
        /// Waiting for its dependencies.
        Waiting => "waiting",
        /// Dependencies met; waiting for a slot.
        Ready => "ready",
        /// An attempt is in flight.
        Running => "running",
        /// Backing off before the next attempt.
        Retrying => "retrying",
        /// Done.
        Succeeded => "succeeded",
        /// Failed for good.
        Failed => "failed",
        /// Not run: an upstream task failed (fail-fast).
        Skipped => "skipped",
        /// Cancelled with its job.
        Cancelled => "cancelled",
        /// No agent offers the capability; re-checked later.
        Deferred => "deferred",
        /// Mid-attempt, a tool call waits for a person's decision.
        AwaitingApproval => "awaiting_approval",
        /// An input task waits for a person's answer.
        InputRequired => "input_required",
        /// The budget refused its next reservation: it waits, holding
        /// nothing, for the job's extension to be decided.
        BudgetPaused => "budget_paused",
    }
    terminal [Succeeded, Failed, Skipped, Cancelled]
    table {
        // waiting -> succeeded: a resumed job's task that succeeded in the
        // job it resumes; its outputs are that job's (RerunJob).
        Waiting => [Ready, Skipped, Cancelled, Succeeded],
        // ready -> skipped: fail-fast before it started; ready -> failed: its
        // deadline passed before it could start.
        Ready => [Running, Skipped, Cancelled, Failed],
        // running -> ready: the executor restarted mid-attempt and runs it again.
        // running -> awaiting_approval: the model called a tool that needs a
        // person's approval.
        // running -> input_required: an input task asks its question.
        // running -> budget_paused: the budget refused a reservation.
        Running => [Succeeded, Failed, Retrying, Deferred, Cancelled, Ready, AwaitingApproval, InputRequired, BudgetPaused],
        // budget_paused -> ready: the extension was approved; -> failed:
        // rejected or undecided in time; -> cancelled: with its job, or
        // fail-fast of another task.
        BudgetPaused => [Ready, Failed, Cancelled],
        // input_required -> running: answered, or the wait ended (the attempt
        // then ends with the answer, the default or INPUT_TIMEOUT); ->
        // failed: fail-fast of another task.
        InputRequired => [Running, Failed, Cancelled],
        // awaiting_approval -> running: decided (approved, rejected or timed
        // out: the attempt goes on either way); -> failed: the attempt could
        // not ask (approval refused the proposal for good).
        AwaitingApproval => [Running, Failed, Cancelled],
        Retrying => [Running, Failed, Cancelled],
        Deferred => [Running, Failed, Cancelled],
    }
}

impl TaskState {
    /// True once the task counts as a finished step for progress.
    pub const fn is_done(self) -> bool {
        self.is_terminal()
    }
}

machine! {
    /// Who holds a conversation (seed ADR 003, handoff mode): its
    /// orchestrator, an agent it handed the conversation to (proxied, never
    /// direct), or nobody once it ended. A delegated conversation goes back
    /// to the orchestrator when reclaimed (the agent hands back, a limit, the
    /// person's request, an error or a refusal); an agent holding it cannot
    /// hand it on.
    Holder, "conversation", ConversationClosed,
    states {
        /// The orchestrator answers.
        Orchestrator => "orchestrator",
        /// An agent answers.
        Delegated => "delegated",
        /// It takes no more messages.
        Ended => "ended",
    }
    terminal [Ended]
    table {
        Orchestrator => [Delegated, Ended],
        Delegated => [Orchestrator, Ended],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables written out independently, one row per `from`.
    fn expected_job(from: JobState, to: JobState) -> bool {
        use JobState::*;
        matches!(
            (from, to),
            (Pending, Scheduled | Available | Cancelled)
                | (Scheduled, Available | Cancelled)
                | (Available, Active | Cancelled)
                | (
                    Active,
                    Completed | Retryable | Discarded | Cancelled | BudgetPaused
                )
                | (BudgetPaused, Active | Discarded | Cancelled)
                | (Retryable, Available | Discarded | Cancelled)
                | (Discarded, Pending)
        )
    }

    fn expected_task(from: TaskState, to: TaskState) -> bool {
        use TaskState::*;
        matches!(
            (from, to),
            (Waiting, Ready | Skipped | Cancelled | Succeeded)
                | (Ready, Running | Skipped | Cancelled | Failed)
                | (
                    Running,
                    Succeeded
                        | Failed
                        | Retrying
                        | Deferred
                        | Cancelled
                        | Ready
                        | AwaitingApproval
                        | InputRequired
                        | BudgetPaused
                )
                | (BudgetPaused, Ready | Failed | Cancelled)
                | (AwaitingApproval, Running | Failed | Cancelled)
                | (InputRequired, Running | Failed | Cancelled)
                | (Retrying, Running | Failed | Cancelled)
                | (Deferred, Running | Failed | Cancelled)
        )
    }

    #[test]
    fn every_job_pair_follows_the_table_with_a_reason_fixed_by_the_pair() {
        assert_eq!(JobState::ALL.len(), 9);
        for &from in JobState::ALL {
            for &to in JobState::ALL {
                let got = from.check(to);
                assert_eq!(got.is_ok(), expected_job(from, to), "{from} -> {to}");
                if let Err(e) = got {
                    let want = if matches!(
                        from,
                        JobState::Completed | JobState::Cancelled | JobState::Discarded
                    ) {
                        Reason::JobTerminal
                    } else {
                        Reason::TransitionNotAllowed
                    };
                    assert_eq!(e.reason, want, "{from} -> {to}");
                    assert_eq!(from.check(to), Err(e), "deterministic");
                }
            }
        }
    }

    #[test]
    fn every_task_pair_follows_the_table_with_a_reason_fixed_by_the_pair() {
        assert_eq!(TaskState::ALL.len(), 12);
        for &from in TaskState::ALL {
            for &to in TaskState::ALL {
                let got = from.check(to);
                assert_eq!(got.is_ok(), expected_task(from, to), "{from} -> {to}");
                if let Err(e) = got {
                    let want = if from.is_terminal() {
                        Reason::TaskTerminal
                    } else {
                        Reason::TransitionNotAllowed
                    };
                    assert_eq!(e.reason, want, "{from} -> {to}");
                }
            }
        }
    }

    #[test]
    fn every_holder_pair_follows_the_table_with_a_reason_fixed_by_the_pair() {
        use Holder::*;
        assert_eq!(Holder::ALL.len(), 3);
        for &from in Holder::ALL {
            for &to in Holder::ALL {
                let want = matches!(
                    (from, to),
                    (Orchestrator, Delegated | Ended) | (Delegated, Orchestrator | Ended)
                );
                let got = from.check(to);
                assert_eq!(got.is_ok(), want, "{from} -> {to}");
                if let Err(e) = got {
                    let reason = if from == Ended {
                        Reason::ConversationClosed
                    } else {
                        Reason::TransitionNotAllowed
                    };
                    assert_eq!(e.reason, reason, "{from} -> {to}");
                }
            }
        }
        assert_eq!(
            Delegated.check(Delegated).unwrap_err().to_string(),
            "conversation cannot move from delegated to delegated: transition not allowed"
        );
    }

    #[test]
    fn names_round_trip_and_refusals_read_well() {
        for &s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
        for &s in TaskState::ALL {
            assert_eq!(TaskState::parse(s.as_str()), Some(s));
        }
        assert_eq!(
            JobState::Completed
                .check(JobState::Cancelled)
                .unwrap_err()
                .to_string(),
            "job cannot move from completed to cancelled: job terminal"
        );
        assert_eq!(TaskState::parse("nope"), None);
    }
}
