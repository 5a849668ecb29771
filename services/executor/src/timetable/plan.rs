//! What a schedule's next tick does, pure: a function of the timetable,
//! where the last decided tick left it, the previous job and the time
//! (passed in, so every rule is tested on a manual clock). The firing loop
//! ([`super::fire`]) records the decision and acts on it.
//!
//! The rules:
//! - **Due** ticks are those after the last decided one (or the schedule's
//!   `since`) up to now. Those *on time* (due for at most [`GRACE_MS`])
//!   fire one by one, oldest first.
//! - **Overlap** — while the previous job runs: SKIP records the tick as
//!   skipped; QUEUE leaves it due until the job ends, and the ticks that
//!   *waited* then fire once (their latest) or, with catch-up ALL, each in
//!   turn; CANCEL_PREVIOUS starts it and cancels the previous job.
//! - **Catch-up** — a tick is *missed* when it is due for longer than
//!   [`GRACE_MS`] and did not wait for the previous job: no executor ran at
//!   its time. SKIP: missed ticks never fire (the latest is recorded as
//!   skipped for them all). LATEST: the latest fires for all of them, if
//!   inside the window. ALL: each inside the window fires in turn, oldest
//!   first, at most [`MAX_CATCH_UP`].

use std::collections::VecDeque;

use super::cron::Cron;

/// How long a tick may be due and still count as on time.
pub(crate) const GRACE_MS: u64 = 60_000;

/// At most this many missed ticks fire (catch-up ALL).
pub(crate) const MAX_CATCH_UP: usize = 100;

/// How many ticks are counted before counting stops (a fine-grained
/// timetable after a long outage).
const COUNT_CAP: u64 = 100_000;

/// What a tick does while the previous job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    Skip,
    Queue,
    CancelPrevious,
}

/// What happens to missed ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CatchUp {
    Skip,
    Latest,
    All,
}

/// A schedule's policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub(crate) overlap: Overlap,
    pub(crate) catch_up: CatchUp,
    /// How far back a missed tick may still fire (LATEST, ALL).
    pub(crate) window_ms: u64,
}

/// The job the last started tick submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Previous {
    /// It has not finished.
    Running,
    /// It finished at this time (ms).
    Finished(u64),
}

/// What one tick does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Its job starts (after the previous one is cancelled, when `cancel`).
    Start { cancel: bool },
    /// Skipped: the previous job still runs.
    SkipOverlap,
    /// Skipped: missed (catch-up SKIP, or outside the window).
    SkipMissed,
}

/// The decision for a schedule now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// No tick is due.
    Nothing,
    /// A tick is due and waits for the previous job (QUEUE).
    Wait,
    /// Tick `tick` is decided: `outcome`, standing for `skipped_before`
    /// earlier due ticks that never fire themselves.
    Tick {
        tick: u64,
        outcome: Outcome,
        skipped_before: u64,
    },
}

/// Decides the next tick of `cron` after `from` (the last decided tick, or
/// the schedule's `since`), under `policy`, with the previous job's state
/// (`None`: no job yet, or it is gone), at `now`.
///
/// Due ticks fall in three groups, oldest first: those *waited* (due while
/// the previous job ran, overlap QUEUE), those *missed* (due longer than
/// [`GRACE_MS`] ago, not waited) and those *on time*. On-time ticks fire
/// one by one; a group of waited ticks fires once (its latest) unless
/// catch-up is ALL; missed ticks follow the catch-up policy.
pub(crate) fn decide(
    cron: &Cron,
    from: u64,
    policy: Policy,
    previous: Option<Previous>,
    now: u64,
) -> Decision {
    let running = previous == Some(Previous::Running);
    if running && policy.overlap == Overlap::Queue {
        return match cron.next_after(from) {
            Some(t) if t <= now => Decision::Wait,
            _ => Decision::Nothing,
        };
    }
    let waited_until = match (policy.overlap, previous) {
        (Overlap::Queue, Some(Previous::Finished(at))) => at,
        _ => 0,
    };
    let waited = |t: u64| t <= waited_until;
    let late = |t: u64| !waited(t) && now.saturating_sub(t) > GRACE_MS;
    let in_window = |t: u64| now.saturating_sub(t) <= policy.window_ms;
    // Ticks at or before `lo` are missed and outside the window: counted,
    // never fired.
    let lo = if waited_until > from {
        from
    } else {
        let keep = match policy.catch_up {
            CatchUp::Skip => GRACE_MS,
            CatchUp::Latest | CatchUp::All => policy.window_ms.max(GRACE_MS),
        };
        from.max(now.saturating_sub(keep + 1))
    };
    let (before, last_before) = due(cron, from, lo, 1, COUNT_CAP);
    let (after, recent) = due(
        cron,
        lo,
        now,
        MAX_CATCH_UP,
        COUNT_CAP.saturating_sub(before),
    );
    let total = before + after;
    let Some(&oldest) = recent.front().or(last_before.back()) else {
        return Decision::Nothing;
    };
    // Earlier due ticks than `tick` (all of them, counted or kept).
    let before_tick = |tick: u64| total - recent.iter().filter(|t| **t >= tick).count() as u64;
    let Some(&first) = recent.front() else {
        // Only ticks outside the window: the latest is recorded for them.
        return Decision::Tick {
            tick: oldest,
            outcome: Outcome::SkipMissed,
            skipped_before: total - 1,
        };
    };
    let tick = if waited(first) {
        let mut group = recent.iter().copied().filter(|t| waited(*t));
        match policy.catch_up {
            CatchUp::All => first,
            CatchUp::Skip | CatchUp::Latest => group.next_back().unwrap_or(first),
        }
    } else if late(first) {
        let missed: Vec<u64> = recent.iter().copied().filter(|t| late(*t)).collect();
        let latest = missed.last().copied().unwrap_or(first);
        let fires = match policy.catch_up {
            CatchUp::Skip => None,
            CatchUp::Latest => Some(latest).filter(|t| in_window(*t)),
            CatchUp::All => missed.iter().copied().find(|t| in_window(*t)),
        };
        match fires {
            Some(t) => t,
            None => {
                return Decision::Tick {
                    tick: latest,
                    outcome: Outcome::SkipMissed,
                    skipped_before: before_tick(latest),
                };
            }
        }
    } else {
        first
    };
    let outcome = match (running, policy.overlap) {
        (false, _) => Outcome::Start { cancel: false },
        (true, Overlap::CancelPrevious) => Outcome::Start { cancel: true },
        (true, _) => Outcome::SkipOverlap,
    };
    Decision::Tick {
        tick,
        outcome,
        skipped_before: before_tick(tick),
    }
}

/// How many ticks fall in `(from, to]` — counting stops once `cap` are
/// (at least one is counted) — and the last `keep` of them, oldest first.
fn due(cron: &Cron, from: u64, to: u64, keep: usize, cap: u64) -> (u64, VecDeque<u64>) {
    let (mut n, mut last, mut at) = (0, VecDeque::with_capacity(keep), from);
    while let Some(t) = cron.next_after(at).filter(|t| *t <= to) {
        n += 1;
        if last.len() == keep {
            last.pop_front();
        }
        last.push_back(t);
        at = t;
        if n >= cap {
            break;
        }
    }
    (n, last)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
