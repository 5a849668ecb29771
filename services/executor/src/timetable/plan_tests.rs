#![allow(clippy::unwrap_used)]

//! Every rule on a manual clock: times are passed in.

use jiff::Timestamp;

use super::super::cron::Cron;
use super::{CatchUp, Decision, Outcome, Overlap, Policy, Previous, decide};

fn at(s: &str) -> u64 {
    format!("2026-11-30T{s}Z")
        .parse::<Timestamp>()
        .unwrap()
        .as_millisecond() as u64
}

const HOUR: u64 = 3_600_000;

fn policy(overlap: Overlap, catch_up: CatchUp, window_ms: u64) -> Policy {
    Policy {
        overlap,
        catch_up,
        window_ms,
    }
}

fn start(t: &str, skipped_before: u64) -> Decision {
    Decision::Tick {
        tick: at(t),
        outcome: Outcome::Start { cancel: false },
        skipped_before,
    }
}

fn tick(t: &str, outcome: Outcome, skipped_before: u64) -> Decision {
    Decision::Tick {
        tick: at(t),
        outcome,
        skipped_before,
    }
}

#[test]
fn a_tick_on_time_starts_and_nothing_is_due_before_it() {
    let every_minute = Cron::parse("0 * * * * *", "").unwrap();
    let p = policy(Overlap::Skip, CatchUp::Latest, HOUR);
    let from = at("10:00:00");
    assert_eq!(
        decide(&every_minute, from, p, None, at("10:00:59")),
        Decision::Nothing
    );
    assert_eq!(
        decide(&every_minute, from, p, None, at("10:01:00")),
        start("10:01:00", 0)
    );
    // Late by less than the grace: still on time, under every policy.
    for catch_up in [CatchUp::Skip, CatchUp::Latest, CatchUp::All] {
        let p = policy(Overlap::Skip, catch_up, HOUR);
        assert_eq!(
            decide(&every_minute, from, p, None, at("10:01:59")),
            start("10:01:00", 0),
            "{catch_up:?}"
        );
    }
}

#[test]
fn catch_up_skip_fires_no_missed_tick_and_records_the_latest_for_them() {
    let every_5 = Cron::parse("0 */5 * * * *", "").unwrap();
    let p = policy(Overlap::Skip, CatchUp::Skip, HOUR);
    // Down from 10:01 to 10:17: 10:05, 10:10 and 10:15 were missed.
    assert_eq!(
        decide(&every_5, at("10:00:00"), p, None, at("10:17:00")),
        tick("10:15:00", Outcome::SkipMissed, 2)
    );
    // The next one on time fires.
    assert_eq!(
        decide(&every_5, at("10:15:00"), p, None, at("10:20:01")),
        start("10:20:00", 0)
    );
    // Back just in time for one: it fires, for the two before it.
    assert_eq!(
        decide(&every_5, at("10:00:00"), p, None, at("10:15:30")),
        start("10:15:00", 2)
    );
}

#[test]
fn catch_up_latest_fires_once_for_the_missed_ticks_inside_the_window() {
    let every_5 = Cron::parse("0 */5 * * * *", "").unwrap();
    let p = policy(Overlap::Skip, CatchUp::Latest, HOUR);
    assert_eq!(
        decide(&every_5, at("10:00:00"), p, None, at("10:17:00")),
        start("10:15:00", 2)
    );
    // Outside a one-minute window it is skipped.
    let p = policy(Overlap::Skip, CatchUp::Latest, 60_000);
    assert_eq!(
        decide(&every_5, at("10:00:00"), p, None, at("10:17:00")),
        tick("10:15:00", Outcome::SkipMissed, 2)
    );
}

#[test]
fn catch_up_all_fires_each_missed_tick_in_turn_inside_the_window() {
    let every_5 = Cron::parse("0 */5 * * * *", "").unwrap();
    let p = policy(Overlap::Skip, CatchUp::All, HOUR);
    let now = at("10:17:00");
    let mut from = at("10:00:00");
    let mut fired = Vec::new();
    while let Decision::Tick { tick, outcome, .. } = decide(&every_5, from, p, None, now) {
        assert_eq!(outcome, Outcome::Start { cancel: false });
        fired.push(tick);
        from = tick;
    }
    assert_eq!(fired, [at("10:05:00"), at("10:10:00"), at("10:15:00")]);
    // A six-minute window keeps only 10:15 (10:05 and 10:10 are dropped).
    let p = policy(Overlap::Skip, CatchUp::All, 6 * 60_000);
    assert_eq!(
        decide(&every_5, at("10:00:00"), p, None, now),
        start("10:15:00", 2)
    );
}

#[test]
fn catch_up_all_fires_at_most_the_latest_hundred() {
    let every_second = Cron::parse("* * * * * *", "").unwrap();
    let p = policy(Overlap::Skip, CatchUp::All, HOUR);
    // 600 ticks missed: the last 100 fire, from 10:08:21.
    assert_eq!(
        decide(&every_second, at("10:00:00"), p, None, at("10:10:00")),
        start("10:08:21", 500)
    );
}

#[test]
fn overlap_skip_records_the_tick_while_the_previous_job_runs() {
    let every_minute = Cron::parse("0 * * * * *", "").unwrap();
    let p = policy(Overlap::Skip, CatchUp::Latest, HOUR);
    assert_eq!(
        decide(
            &every_minute,
            at("10:00:00"),
            p,
            Some(Previous::Running),
            at("10:01:00")
        ),
        tick("10:01:00", Outcome::SkipOverlap, 0)
    );
    // Once it finished, the next tick starts.
    let done = Some(Previous::Finished(at("10:01:30")));
    assert_eq!(
        decide(&every_minute, at("10:01:00"), p, done, at("10:02:00")),
        start("10:02:00", 0)
    );
}

#[test]
fn overlap_cancel_previous_starts_the_tick_and_cancels() {
    let every_minute = Cron::parse("0 * * * * *", "").unwrap();
    let p = policy(Overlap::CancelPrevious, CatchUp::Latest, HOUR);
    assert_eq!(
        decide(
            &every_minute,
            at("10:00:00"),
            p,
            Some(Previous::Running),
            at("10:01:00")
        ),
        tick("10:01:00", Outcome::Start { cancel: true }, 0)
    );
}

#[test]
fn overlap_queue_waits_and_the_waited_ticks_are_not_missed() {
    let every_minute = Cron::parse("0 * * * * *", "").unwrap();
    let from = at("10:00:00");
    for catch_up in [CatchUp::Skip, CatchUp::Latest, CatchUp::All] {
        let p = policy(Overlap::Queue, catch_up, HOUR);
        assert_eq!(
            decide(
                &every_minute,
                from,
                p,
                Some(Previous::Running),
                at("10:00:30")
            ),
            Decision::Nothing,
            "nothing due yet"
        );
        assert_eq!(
            decide(
                &every_minute,
                from,
                p,
                Some(Previous::Running),
                at("10:03:10")
            ),
            Decision::Wait,
            "{catch_up:?}: due, and waiting"
        );
        // It ends at 10:03:30: 10:01 is 2.5 minutes old but waited, not
        // missed.
        let done = Some(Previous::Finished(at("10:03:30")));
        let want = match catch_up {
            CatchUp::All => start("10:01:00", 0),
            CatchUp::Skip | CatchUp::Latest => start("10:03:00", 2),
        };
        assert_eq!(
            decide(&every_minute, from, p, done, at("10:03:31")),
            want,
            "{catch_up:?}"
        );
    }
}

#[test]
fn overlap_queue_after_an_outage_follows_the_catch_up_policy() {
    let every_5 = Cron::parse("0 */5 * * * *", "").unwrap();
    // The previous job ended long before the outage.
    let done = Some(Previous::Finished(at("09:00:00")));
    let p = policy(Overlap::Queue, CatchUp::Skip, HOUR);
    assert_eq!(
        decide(&every_5, at("10:00:00"), p, done, at("10:17:00")),
        tick("10:15:00", Outcome::SkipMissed, 2)
    );
    let p = policy(Overlap::Queue, CatchUp::All, HOUR);
    assert_eq!(
        decide(&every_5, at("10:00:00"), p, done, at("10:17:00")),
        start("10:05:00", 0)
    );
}

#[test]
fn a_time_zone_schedule_decides_on_its_wall_clock() {
    // 09:00 in Berlin is 08:00 UTC on 30 November.
    let nine = Cron::parse("0 9 * * *", "Europe/Berlin").unwrap();
    let p = policy(Overlap::Skip, CatchUp::Latest, HOUR);
    assert_eq!(
        decide(&nine, at("00:00:00"), p, None, at("07:59:59")),
        Decision::Nothing
    );
    assert_eq!(
        decide(&nine, at("00:00:00"), p, None, at("08:00:00")),
        start("08:00:00", 0)
    );
}

#[test]
fn ticks_on_time_fire_one_by_one_even_when_a_pass_comes_late() {
    let every_second = Cron::parse("* * * * * *", "").unwrap();
    for catch_up in [CatchUp::Skip, CatchUp::Latest, CatchUp::All] {
        let p = policy(Overlap::Skip, catch_up, HOUR);
        assert_eq!(
            decide(&every_second, at("10:00:00"), p, None, at("10:00:02.500")),
            start("10:00:01", 0),
            "{catch_up:?}: the older of two on-time ticks first"
        );
    }
}
