#![allow(clippy::unwrap_used)]

use jiff::Timestamp;

use super::{Cron, CronError};

/// Ms of an RFC 3339 instant.
fn at(s: &str) -> u64 {
    s.parse::<Timestamp>().unwrap().as_millisecond() as u64
}

/// The next `n` fire times after `from`, as UTC RFC 3339 text.
fn next(expr: &str, zone: &str, from: &str, n: usize) -> Vec<String> {
    Cron::parse(expr, zone)
        .unwrap()
        .upcoming(at(from), n)
        .into_iter()
        .map(|ms| Timestamp::from_millisecond(ms as i64).unwrap().to_string())
        .collect()
}

#[test]
fn five_fields_fire_on_the_minute_and_six_on_the_second() {
    assert_eq!(
        next("*/15 * * * *", "", "2026-11-30T10:07:30Z", 3),
        [
            "2026-11-30T10:15:00Z",
            "2026-11-30T10:30:00Z",
            "2026-11-30T10:45:00Z"
        ]
    );
    assert_eq!(
        next("*/20 * * * * *", "", "2026-11-30T10:07:30Z", 3),
        [
            "2026-11-30T10:07:40Z",
            "2026-11-30T10:08:00Z",
            "2026-11-30T10:08:20Z"
        ]
    );
    // Strictly after: a tick exactly at `from` is not the next one.
    assert_eq!(
        next("0 * * * *", "", "2026-11-30T10:00:00Z", 1),
        ["2026-11-30T11:00:00Z"]
    );
}

#[test]
fn lists_ranges_steps_and_names_combine() {
    // 09:00 and 17:30 on weekdays.
    let got = next("0,30 9-17/8 * * mon-fri", "", "2026-11-27T16:00:00Z", 4);
    assert_eq!(
        got,
        [
            "2026-11-27T17:00:00Z",
            "2026-11-27T17:30:00Z",
            "2026-11-30T09:00:00Z",
            "2026-11-30T09:30:00Z"
        ],
        "Friday evening, then Monday: the weekend is skipped"
    );
    assert_eq!(
        next("0 0 1 jan,JUL *", "", "2026-02-01T00:00:00Z", 2),
        ["2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z"]
    );
    // 7 is Sunday, like 0.
    assert_eq!(
        next("0 12 * * 7", "", "2026-11-30T00:00:00Z", 1),
        ["2026-12-06T12:00:00Z"]
    );
    assert_eq!(
        next("@daily", "", "2026-11-30T00:00:00Z", 1),
        ["2026-12-01T00:00:00Z"]
    );
}

#[test]
fn both_day_fields_restricted_fire_on_either() {
    // The 1st of the month, and every Monday (Vixie cron's rule).
    let got = next("0 8 1 * mon", "", "2026-11-28T00:00:00Z", 3);
    assert_eq!(
        got,
        [
            "2026-11-30T08:00:00Z",
            "2026-12-01T08:00:00Z",
            "2026-12-07T08:00:00Z"
        ]
    );
}

#[test]
fn a_time_zone_moves_the_wall_clock_and_follows_daylight_saving() {
    // 09:00 in Berlin is 08:00 UTC in winter and 07:00 in summer.
    assert_eq!(
        next("0 9 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 2),
        ["2026-03-29T07:00:00Z", "2026-03-30T07:00:00Z"],
        "the spring-forward day already runs on summer time"
    );
    assert_eq!(
        next("0 9 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 2),
        ["2026-10-25T08:00:00Z", "2026-10-26T08:00:00Z"]
    );
}

#[test]
fn a_skipped_wall_time_fires_as_the_clock_moves_on_and_a_repeated_one_fires_once() {
    // 2026-03-08 in New York: 02:00 jumps to 03:00; 02:30 does not exist.
    assert_eq!(
        next("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 2),
        ["2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z"],
        "fired at 03:30 EDT (07:30 UTC) that night, 02:30 EST... EDT after"
    );
    // 2026-11-01: 01:00-01:59 happens twice; 01:30 fires once, the first time.
    assert_eq!(
        next("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2),
        ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    );
}

#[test]
fn a_day_no_month_has_never_fires_and_is_refused() {
    let e = Cron::parse("0 0 30 2 *", "").unwrap_err();
    assert!(e.to_string().contains("never fires"), "{e}");
    // 29 February exists, every four years.
    assert_eq!(
        next("0 0 29 2 *", "", "2026-11-30T00:00:00Z", 1),
        ["2028-02-29T00:00:00Z"]
    );
}

#[test]
fn bad_expressions_name_the_field_and_the_fix() {
    let cases = [
        ("* * * *", "it has 4 fields"),
        ("61 * * * *", "minute field \"61\": 61 is out of range 0-59"),
        ("* 24 * * *", "hour field \"24\": 24 is out of range 0-23"),
        (
            "* * 0 * *",
            "day-of-month field \"0\": 0 is out of range 1-31",
        ),
        ("* * * 13 *", "month field \"13\": 13 is out of range 1-12"),
        (
            "* * * * 8",
            "day-of-week field \"8\": 8 is out of range 0-7",
        ),
        ("* * * foo *", "\"foo\" is not a number or a name (jan, feb"),
        ("*/0 * * * *", "step 0 is out of range"),
        ("5-1 * * * *", "runs backwards"),
        ("1,,2 * * * *", "has an empty value"),
        ("@sometimes", "is not a macro"),
    ];
    for (expr, want) in cases {
        match Cron::parse(expr, "") {
            Err(CronError::Syntax { why, .. }) => assert!(why.contains(want), "{expr}: {why}"),
            other => panic!("{expr}: {other:?}"),
        }
    }
    let e = Cron::parse("* * * * *", "Mars/Olympus").unwrap_err();
    assert_eq!(e, CronError::Zone("Mars/Olympus".into()));
}
