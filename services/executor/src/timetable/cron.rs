//! Cron expressions read in an IANA time zone: when a schedule fires.
//!
//! Five fields (minute hour day-of-month month day-of-week) or six (a
//! seconds field first); each `*` (or `?` in a day field), a value, a range
//! `a-b`, a step `*/n`, `a/n` or `a-b/n`, or a comma list of these. Months
//! and days may be named (`jan`, `mon`); day-of-week 7 is Sunday too. When
//! both day fields are restricted a day matching either fires (Vixie cron's
//! rule). The macros `@yearly` (`@annually`), `@monthly`, `@weekly`,
//! `@daily` (`@midnight`) and `@hourly` stand for their five fields.
//!
//! Times are matched on the zone's wall clock: a wall time a
//! daylight-saving change skips fires as the clock moves on (02:30 on a
//! spring-forward night at 03:30), one it repeats fires once, at its first
//! occurrence ([`Cron::next_after`] only ever moves forward in real time).

use jiff::Timestamp;
use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;

/// A cron expression that does not parse, or a zone that is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CronError {
    /// The expression does not fit the grammar.
    #[error("cron expression {expr:?}: {why}")]
    Syntax { expr: String, why: String },
    /// The time zone is not an IANA zone name this host knows.
    #[error(
        "time zone {0:?} is unknown: name an IANA zone such as \"Europe/Berlin\" or \"America/New_York\", or leave it empty for UTC"
    )]
    Zone(String),
}

/// One field's allowed values, as a bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Field {
    bits: u64,
    /// Written as `*` (or `?`): unrestricted, which matters for the day
    /// fields' either-or rule.
    any: bool,
}

impl Field {
    fn has(self, v: i64) -> bool {
        (0..64).contains(&v) && self.bits & (1 << v) != 0
    }
}

/// What each field is called and allows.
struct Spec {
    name: &'static str,
    min: i64,
    max: i64,
    names: &'static [&'static str],
}

const SECOND: Spec = Spec {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
};
const MINUTE: Spec = Spec {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Spec = Spec {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY: Spec = Spec {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Spec = Spec {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const WEEKDAY: Spec = Spec {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

/// A parsed cron expression with its time zone.
#[derive(Debug, Clone)]
pub(crate) struct Cron {
    seconds: Field,
    minutes: Field,
    hours: Field,
    days: Field,
    months: Field,
    weekdays: Field,
    zone: TimeZone,
}

/// How far ahead [`Cron::next_after`] looks before it says "never" (a
/// 29 February on a Monday recurs within 28 years).
const HORIZON_YEARS: i16 = 30;

impl Cron {
    /// Parses `expr`, read in zone `zone` (empty: UTC).
    pub(crate) fn parse(expr: &str, zone: &str) -> Result<Cron, CronError> {
        let tz = match zone.trim() {
            "" | "UTC" | "Etc/UTC" => TimeZone::UTC,
            name => TimeZone::get(name).map_err(|_| CronError::Zone(name.to_owned()))?,
        };
        let syntax = |why: String| CronError::Syntax {
            expr: expr.to_owned(),
            why,
        };
        let text = expr.trim();
        let expanded = match text.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *".to_owned(),
            "@monthly" => "0 0 1 * *".to_owned(),
            "@weekly" => "0 0 * * 0".to_owned(),
            "@daily" | "@midnight" => "0 0 * * *".to_owned(),
            "@hourly" => "0 * * * *".to_owned(),
            m if m.starts_with('@') => {
                return Err(syntax(format!(
                    "{m:?} is not a macro: use @yearly, @monthly, @weekly, @daily or @hourly"
                )));
            }
            _ => text.to_owned(),
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (seconds, rest) = match fields.len() {
            5 => (
                Field {
                    bits: 1,
                    any: false,
                },
                &fields[..],
            ),
            6 => (field(fields[0], &SECOND).map_err(syntax)?, &fields[1..]),
            n => {
                return Err(syntax(format!(
                    "it has {n} fields; a cron expression has 5 (minute hour day-of-month month day-of-week) or 6 (seconds first)"
                )));
            }
        };
        let mut weekdays = field(rest[4], &WEEKDAY).map_err(syntax)?;
        // 7 is Sunday too.
        if weekdays.has(7) {
            weekdays.bits = (weekdays.bits | 1) & !(1 << 7);
        }
        let cron = Cron {
            seconds,
            minutes: field(rest[0], &MINUTE).map_err(syntax)?,
            hours: field(rest[1], &HOUR).map_err(syntax)?,
            days: field(rest[2], &DAY).map_err(syntax)?,
            months: field(rest[3], &MONTH).map_err(syntax)?,
            weekdays,
            zone: tz,
        };
        // A day that no month has (30 February) never fires.
        if cron.next_after(0).is_none() {
            return Err(syntax(
                "it never fires: no month in it has that day; check the day-of-month and month fields"
                    .to_owned(),
            ));
        }
        Ok(cron)
    }

    /// Whether `date` is a day it fires on.
    fn day_matches(&self, date: Date) -> bool {
        let dom = self.days.has(i64::from(date.day()));
        let dow = self
            .weekdays
            .has(i64::from(date.weekday().to_sunday_zero_offset()));
        match (self.days.any, self.weekdays.any) {
            (true, true) => true,
            (true, false) => dow,
            (false, true) => dom,
            (false, false) => dom || dow,
        }
    }

    /// The first time it fires strictly after `after_ms` (ms since the
    /// epoch), or `None` within the horizon.
    pub(crate) fn next_after(&self, after_ms: u64) -> Option<u64> {
        let after = Timestamp::from_millisecond(i64::try_from(after_ms).ok()?).ok()?;
        // The wall-clock second after `after`, whole.
        let start = self
            .zone
            .to_datetime(after)
            .checked_add(jiff::SignedDuration::from_secs(1))
            .ok()?;
        let (mut y, mut mo, mut d) = (start.year(), start.month(), start.day());
        let (mut h, mut mi, mut s) = (start.hour(), start.minute(), start.second());
        let end = y.saturating_add(HORIZON_YEARS);
        while y <= end {
            if !self.months.has(i64::from(mo)) {
                (d, h, mi, s) = (1, 0, 0, 0);
                (y, mo) = if mo == 12 { (y + 1, 1) } else { (y, mo + 1) };
                continue;
            }
            let date = Date::new(y, mo, d).ok()?;
            if !self.day_matches(date) {
                (h, mi, s) = (0, 0, 0);
                if d >= date.days_in_month() {
                    d = 1;
                    (y, mo) = if mo == 12 { (y + 1, 1) } else { (y, mo + 1) };
                } else {
                    d += 1;
                }
                continue;
            }
            if !self.hours.has(i64::from(h)) {
                (mi, s) = (0, 0);
                if h == 23 {
                    h = 0;
                    (y, mo, d) = next_day(date)?;
                } else {
                    h += 1;
                }
                continue;
            }
            if !self.minutes.has(i64::from(mi)) {
                s = 0;
                if mi == 59 {
                    mi = 0;
                    (y, mo, d, h) = next_hour(date, h)?;
                } else {
                    mi += 1;
                }
                continue;
            }
            if !self.seconds.has(i64::from(s)) {
                if s == 59 {
                    s = 0;
                    (y, mo, d, h, mi) = next_minute(date, h, mi)?;
                } else {
                    s += 1;
                }
                continue;
            }
            let wall = DateTime::new(y, mo, d, h, mi, s, 0).ok()?;
            let at = self.zone.to_ambiguous_timestamp(wall).compatible().ok()?;
            if at > after {
                return u64::try_from(at.as_millisecond()).ok();
            }
            // A repeated wall time's second occurrence (its first fired):
            // on to the next second.
            if s == 59 {
                s = 0;
                (y, mo, d, h, mi) = next_minute(date, h, mi)?;
            } else {
                s += 1;
            }
        }
        None
    }

    /// Up to `n` fire times after `after_ms`.
    pub(crate) fn upcoming(&self, after_ms: u64, n: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(n);
        let mut at = after_ms;
        while out.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    out.push(next);
                    at = next;
                }
                None => break,
            }
        }
        out
    }
}

fn next_day(date: Date) -> Option<(i16, i8, i8)> {
    let n = date.tomorrow().ok()?;
    Some((n.year(), n.month(), n.day()))
}

fn next_hour(date: Date, h: i8) -> Option<(i16, i8, i8, i8)> {
    if h == 23 {
        let (y, mo, d) = next_day(date)?;
        Some((y, mo, d, 0))
    } else {
        Some((date.year(), date.month(), date.day(), h + 1))
    }
}

fn next_minute(date: Date, h: i8, mi: i8) -> Option<(i16, i8, i8, i8, i8)> {
    if mi == 59 {
        let (y, mo, d, h) = next_hour(date, h)?;
        Some((y, mo, d, h, 0))
    } else {
        Some((date.year(), date.month(), date.day(), h, mi + 1))
    }
}

/// Parses one field.
fn field(text: &str, spec: &Spec) -> Result<Field, String> {
    let name = spec.name;
    let mut bits = 0u64;
    let mut any = false;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: i64 = s.parse().map_err(|_| {
                    format!("{name} field {text:?}: step {s:?} is not a positive number")
                })?;
                if step < 1 || step > spec.max {
                    return Err(format!(
                        "{name} field {text:?}: step {step} is out of range 1-{}",
                        spec.max
                    ));
                }
                (r, Some(step))
            }
            None => (part, None),
        };
        let (lo, hi) = if range == "*" || (range == "?" && spec.name.starts_with("day")) {
            if step.is_none() && !text.contains(',') {
                any = true;
            }
            (spec.min, spec.max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a, text, spec)?, value(b, text, spec)?);
            if a > b {
                return Err(format!(
                    "{name} field {text:?}: range {range:?} runs backwards; write the smaller value first"
                ));
            }
            (a, b)
        } else {
            let v = value(range, text, spec)?;
            // `a/n`: from a to the end in steps of n.
            (v, if step.is_some() { spec.max } else { v })
        };
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step.unwrap_or(1);
        }
    }
    Ok(Field { bits, any })
}

/// Parses one value of a field: a number in range or a name.
fn value(text: &str, whole: &str, spec: &Spec) -> Result<i64, String> {
    let name = spec.name;
    if text.is_empty() {
        return Err(format!(
            "{name} field {whole:?} has an empty value; check the commas and dashes"
        ));
    }
    let lower = text.to_ascii_lowercase();
    if let Some(i) = spec.names.iter().position(|n| *n == lower) {
        // Months count from 1, days from 0 (Sunday): from the field's minimum.
        return Ok(i as i64 + spec.min);
    }
    let v: i64 = text.parse().map_err(|_| {
        let names = if spec.names.is_empty() {
            String::new()
        } else {
            format!(" or a name ({})", spec.names.join(", "))
        };
        format!("{name} field {whole:?}: {text:?} is not a number{names}")
    })?;
    if v < spec.min || v > spec.max {
        return Err(format!(
            "{name} field {whole:?}: {v} is out of range {}-{}",
            spec.min, spec.max
        ));
    }
    Ok(v)
}

#[cfg(test)]
#[path = "cron_tests.rs"]
mod tests;
