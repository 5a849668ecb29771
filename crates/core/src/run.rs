//! The AgentRunSpec state machine (seed 004), in one table.
//!
//! Every change of a run's status anywhere in Switchyard goes through
//! [`check`]; a refusal carries a reason code that depends only on the
//! `(from, to)` pair, so the same attempt always yields the same code.

use std::fmt;

use crate::Reason;

/// Run statuses, in the seed's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunStatus {
    /// Waiting for a decision.
    Proposed,
    /// May run.
    Approved,
    /// Refused (terminal).
    Rejected,
    /// Claimed by a worker.
    Running,
    /// Finished (terminal).
    Completed,
    /// Failed (terminal unless re-approved).
    Failed,
    /// Cancelled (terminal).
    Cancelled,
}

use RunStatus::*;

impl RunStatus {
    /// Every status.
    pub const ALL: [RunStatus; 7] = [
        Proposed, Approved, Rejected, Running, Completed, Failed, Cancelled,
    ];

    /// The seed's name (`proposed`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            Proposed => "proposed",
            Approved => "approved",
            Rejected => "rejected",
            Running => "running",
            Completed => "completed",
            Failed => "failed",
            Cancelled => "cancelled",
        }
    }

    /// Statuses nothing leaves. `failed` is not one: it can be re-approved.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Rejected | Completed | Cancelled)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The seed's table of allowed transitions, verbatim:
/// `proposed -> approved | rejected | cancelled`, `approved -> running |
/// cancelled`, `running -> completed | failed | cancelled | approved` (retry
/// scheduling), `failed -> approved | cancelled`.
pub const TRANSITIONS: &[(RunStatus, &[RunStatus])] = &[
    (Proposed, &[Approved, Rejected, Cancelled]),
    (Approved, &[Running, Cancelled]),
    (Running, &[Completed, Failed, Cancelled, Approved]),
    (Failed, &[Approved, Cancelled]),
];

/// Why a transition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("run cannot move from {from} to {to}: {}", .reason.as_str().to_lowercase().replace('_', " "))]
pub struct Refused {
    /// Status the run is in.
    pub from: RunStatus,
    /// Status asked for.
    pub to: RunStatus,
    /// `RUN_TERMINAL`, `RUN_ALREADY_IN_STATUS` or `TRANSITION_NOT_ALLOWED`.
    pub reason: Reason,
}

/// True when the table allows `from -> to`.
pub fn allowed(from: RunStatus, to: RunStatus) -> bool {
    TRANSITIONS
        .iter()
        .any(|(f, tos)| *f == from && tos.contains(&to))
}

/// Checks `from -> to` against the table.
pub fn check(from: RunStatus, to: RunStatus) -> Result<(), Refused> {
    if allowed(from, to) {
        return Ok(());
    }
    let reason = if from.is_terminal() {
        Reason::RunTerminal
    } else if from == to {
        Reason::RunAlreadyInStatus
    } else {
        Reason::TransitionNotAllowed
    };
    Err(Refused { from, to, reason })
}

/// Checks a move a person asks for (approve, reject, cancel). Retry
/// scheduling (`running -> approved`) belongs to the worker holding the
/// claim and to the lease sweeper, so a person cannot trigger it.
pub fn check_by_person(from: RunStatus, to: RunStatus) -> Result<(), Refused> {
    if (from, to) == (Running, Approved) {
        return Err(Refused {
            from,
            to,
            reason: Reason::TransitionNotAllowed,
        });
    }
    check(from, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's table written out as the full 7×7 matrix, row = from.
    /// Independent of `TRANSITIONS` so that a slip in either shows up.
    const MATRIX: [[bool; 7]; 7] = {
        const X: bool = true;
        const O: bool = false;
        [
            //  prop appr rej  run  comp fail canc
            [O, X, X, O, O, O, X], // proposed
            [O, O, O, X, O, O, X], // approved
            [O, O, O, O, O, O, O], // rejected
            [O, X, O, O, X, X, X], // running
            [O, O, O, O, O, O, O], // completed
            [O, X, O, O, O, O, X], // failed
            [O, O, O, O, O, O, O], // cancelled
        ]
    };

    #[test]
    fn every_from_to_pair_matches_the_seed_table() {
        for (i, from) in RunStatus::ALL.iter().enumerate() {
            for (j, to) in RunStatus::ALL.iter().enumerate() {
                assert_eq!(check(*from, *to).is_ok(), MATRIX[i][j], "{from} -> {to}");
            }
        }
    }

    #[test]
    fn refusals_carry_a_reason_that_depends_only_on_the_pair() {
        for from in RunStatus::ALL {
            for to in RunStatus::ALL {
                let Err(e) = check(from, to) else { continue };
                let expected = if matches!(from, Rejected | Completed | Cancelled) {
                    Reason::RunTerminal
                } else if from == to {
                    Reason::RunAlreadyInStatus
                } else {
                    Reason::TransitionNotAllowed
                };
                assert_eq!(e.reason, expected, "{from} -> {to}");
                assert_eq!(check(from, to), Err(e.clone()), "deterministic");
                assert!(e.to_string().contains(from.as_str()));
            }
        }
        assert_eq!(
            check(Completed, Running).unwrap_err().to_string(),
            "run cannot move from completed to running: run terminal"
        );
    }

    #[test]
    fn people_cannot_schedule_retries_but_otherwise_follow_the_table() {
        for from in RunStatus::ALL {
            for to in RunStatus::ALL {
                let expected = check(from, to).is_ok() && (from, to) != (Running, Approved);
                assert_eq!(
                    check_by_person(from, to).is_ok(),
                    expected,
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn failed_is_not_terminal_but_can_only_be_reapproved_or_cancelled() {
        assert!(!Failed.is_terminal());
        assert!(check(Failed, Approved).is_ok());
        assert_eq!(
            check(Failed, Running).unwrap_err().reason,
            Reason::TransitionNotAllowed
        );
    }
}
