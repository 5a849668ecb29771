//! Milliseconds since the epoch ⇄ protobuf timestamps and durations.

/// A timestamp from epoch milliseconds.
pub fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// Epoch milliseconds of a timestamp (0 for times before the epoch).
pub fn timestamp_ms(t: &prost_types::Timestamp) -> u64 {
    if t.seconds < 0 {
        return 0;
    }
    (t.seconds as u64).saturating_mul(1000) + (t.nanos.max(0) as u64) / 1_000_000
}

/// A duration from milliseconds.
pub fn duration(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// Milliseconds of a duration, as a float (negative durations give 0).
pub fn duration_ms(d: &prost_types::Duration) -> f64 {
    if d.seconds < 0 || d.nanos < 0 {
        return 0.0;
    }
    d.seconds as f64 * 1000.0 + f64::from(d.nanos) / 1e6
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
pub fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// (year, month, day) → days since 1970-01-01 (`days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Epoch milliseconds as UTC, ISO 8601 to the millisecond:
/// `2026-11-29T14:03:22.123Z`.
pub fn utc(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// A span of milliseconds as people read it: `850 ms`, `12.3 s`,
/// `4 min 05 s`, `2 h 03 min`, `3 d 04 h`.
pub fn human_duration(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{}.{} s", s, (ms % 1000) / 100),
        60_000..3_600_000 => format!("{} min {:02} s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {:02} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// How long something that started at `start_ms` ran: to `end_ms`, or,
/// while it runs (`end_ms` 0), to `now_ms` as `running 3.2 s`; `None`
/// before it starts (`start_ms` 0).
pub fn ran_for(start_ms: u64, end_ms: u64, now_ms: u64) -> Option<String> {
    match (start_ms, end_ms) {
        (0, _) => None,
        (s, 0) => Some(format!(
            "running {}",
            human_duration(now_ms.saturating_sub(s))
        )),
        (s, e) => Some(human_duration(e.saturating_sub(s))),
    }
}

/// Units of a span a person types, longest first, with their milliseconds.
const SPAN_UNITS: [(char, u64); 5] = [
    ('w', 7 * 86_400_000),
    ('d', 86_400_000),
    ('h', 3_600_000),
    ('m', 60_000),
    ('s', 1000),
];

/// A span a person types — a number and a unit: `90s`, `30m`, `12h`, `7d`,
/// `2w` — in milliseconds.
pub fn parse_span(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().map_err(|_| {
        format!("{t:?} is not a length of time: write a number and a unit, like 30m, 7d or 2w")
    })?;
    let per = SPAN_UNITS
        .iter()
        .find(|(u, _)| unit.len() == 1 && unit.starts_with(*u))
        .map(|(_, ms)| *ms)
        .ok_or_else(|| format!("unknown unit {unit:?} in {t:?}: use w, d, h, m or s"))?;
    n.checked_mul(per)
        .ok_or_else(|| format!("{t:?} is too long a span"))
}

/// A span in its largest whole unit, as a person would type it: `30d`,
/// `2w`, `90s`.
pub fn span_words(ms: u64) -> String {
    SPAN_UNITS
        .iter()
        .find(|(_, per)| ms > 0 && ms.is_multiple_of(*per))
        .map_or_else(|| format!("{ms}ms"), |(u, per)| format!("{}{u}", ms / per))
}

/// A time a person types, as epoch milliseconds: `now`; an age, that long
/// before `now_ms` (`90s`, `30m`, `12h`, `7d`, `2w`); a UTC date
/// (`2026-11-29`, its midnight); or a UTC time (`2026-11-29T14:00:00Z`,
/// seconds and fractions optional, `T` or a space).
pub fn parse_instant(s: &str, now_ms: u64) -> Result<u64, String> {
    let t = s.trim();
    let bad = || {
        format!(
            "expected a time: an age like 30m, 7d or 2w (that long ago), a date like 2026-11-29, or a UTC time like 2026-11-29T14:00:00Z; got {t:?}"
        )
    };
    if t.eq_ignore_ascii_case("now") {
        return Ok(now_ms);
    }
    // An age: digits and one unit letter (a UTC time ends in a letter too).
    let (digits, last) = t.split_at(t.len().saturating_sub(1));
    if !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && last.bytes().all(|b| b.is_ascii_alphabetic())
    {
        return parse_span(t)
            .map(|ms| now_ms.saturating_sub(ms))
            .map_err(|_| bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<u32, String> {
        t.get(r)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse().ok())
            .ok_or_else(bad)
    };
    if t.len() < 10 || t.as_bytes()[4] != b'-' || t.as_bytes()[7] != b'-' {
        return Err(bad());
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || y < 1970 {
        return Err(bad());
    }
    let day_ms = days_from_civil(i64::from(y), mo, d) as u64 * 86_400_000;
    let rest = &t[10..];
    if rest.is_empty() {
        return Ok(day_ms);
    }
    let rest = rest
        .strip_prefix(['T', ' '])
        .and_then(|r| r.strip_suffix('Z'))
        .ok_or_else(bad)?;
    let mut parts = rest.splitn(3, ':');
    let field = |p: Option<&str>, max: u32| -> Result<u32, String> {
        p.filter(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse().ok())
            .filter(|v| *v <= max)
            .ok_or_else(bad)
    };
    let h = field(parts.next(), 23)?;
    let mi = field(parts.next(), 59)?;
    let (sec, frac_ms) = match parts.next() {
        None => (0, 0),
        Some(sf) => {
            let (sec, frac) = sf.split_once('.').unwrap_or((sf, ""));
            if !frac.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let ms = format!("{frac:0<3}")[..3]
                .parse::<u64>()
                .map_err(|_| bad())?;
            (field(Some(sec), 59)?, ms)
        }
    };
    Ok(
        day_ms
            + u64::from(h) * 3_600_000
            + u64::from(mi) * 60_000
            + u64::from(sec) * 1000
            + frac_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_take_one_unit_and_read_back_in_their_largest() {
        assert_eq!(parse_span("90s"), Ok(90_000));
        assert_eq!(parse_span("2w"), Ok(14 * 86_400_000));
        assert!(parse_span("3y").unwrap_err().contains("unknown unit"));
        assert!(parse_span("5ms").unwrap_err().contains("unknown unit"));
        assert!(
            parse_span("soon")
                .unwrap_err()
                .contains("not a length of time")
        );
        assert!(parse_span("99999999999999999w").is_err());
        assert_eq!(span_words(30 * 86_400_000), "30d");
        assert_eq!(span_words(14 * 86_400_000), "2w");
        assert_eq!(span_words(90_000), "90s");
        assert_eq!(span_words(3_600_000), "1h");
        assert_eq!(span_words(1500), "1500ms");
    }

    #[test]
    fn typed_times_read_as_ages_dates_and_utc_times() {
        let now = 1_780_000_000_000;
        assert_eq!(parse_instant("now", now), Ok(now));
        assert_eq!(parse_instant("7d", now), Ok(now - 7 * 86_400_000));
        assert_eq!(parse_instant("30m", now), Ok(now - 1_800_000));
        assert_eq!(parse_instant("2026-11-29", now), Ok(1_795_910_400_000));
        assert_eq!(
            parse_instant("2026-11-29T14:03:22.5Z", now),
            Ok(1_795_910_400_000 + (14 * 3600 + 3 * 60 + 22) * 1000 + 500)
        );
        assert_eq!(
            parse_instant("2026-11-29 14:03Z", now),
            Ok(1_795_910_400_000 + (14 * 3600 + 3 * 60) * 1000)
        );
        assert_eq!(
            utc(1_795_910_400_000 + 50_402_123),
            "2026-11-29T14:00:02.123Z"
        );
        let spans = [850, 12_345, 245_000, 7_380_000, 273_600_000].map(human_duration);
        assert_eq!(
            spans,
            ["850 ms", "12.3 s", "4 min 05 s", "2 h 03 min", "3 d 04 h"]
        );
        for bad in [
            "soon",
            "7y",
            "2026-13-01",
            "2026-11-29T25:00Z",
            "d",
            "2026-11-29T14:00",
        ] {
            let e = parse_instant(bad, now).expect_err(bad);
            assert!(e.contains("expected a time") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn conversions_round_trip() {
        assert_eq!(
            timestamp_ms(&timestamp(1_700_000_123_456)),
            1_700_000_123_456
        );
        assert_eq!(duration_ms(&duration(1_250)), 1_250.0);
        assert_eq!(
            duration_ms(&prost_types::Duration {
                seconds: -1,
                nanos: 0
            }),
            0.0
        );
    }
}
