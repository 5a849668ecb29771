//! Money arithmetic shared by the ledger and the LLM providers: integers
//! only, micro-USD, prices per million units.

/// The most tokens any one figure a client sends may name (a task's
/// `max_tokens`, a token budget): 10^12, far above any real job and far
/// below where products of turns, attempts and tasks could overflow a u64.
/// A larger figure is a field violation, never a panic or a wrap.
pub const MAX_TOKENS: u64 = 1_000_000_000_000;

/// The most money any one figure a client sends may name: 10^15 micro-USD
/// ($1 billion).
pub const MAX_MICRO_USD: i64 = 1_000_000_000_000_000;

/// The longest an approval's scope — a ledger hold — stands, ms: 24 hours,
/// the ledger's longest reservation by default.
pub const MAX_HOLD_MS: u64 = 24 * 3_600_000;

/// `Err` with the rule when `tokens` is above [`MAX_TOKENS`].
pub fn check_tokens(tokens: u64, what: &str) -> Result<(), String> {
    if tokens <= MAX_TOKENS {
        Ok(())
    } else {
        Err(format!("{what} must be at most {MAX_TOKENS}, got {tokens}"))
    }
}

/// `Err` with the rule when `micro_usd` is negative or above [`MAX_MICRO_USD`].
pub fn check_micro_usd(micro_usd: i64, what: &str) -> Result<(), String> {
    if (0..=MAX_MICRO_USD).contains(&micro_usd) {
        Ok(())
    } else {
        Err(format!(
            "{what} must be between 0 and {MAX_MICRO_USD} micro-USD, got {micro_usd}"
        ))
    }
}

/// A dollar amount (`12`, `0.42`, `$1.000001`) as micro-USD, exactly: the
/// digits are read as a decimal, never through a float.
pub fn parse_usd(s: &str) -> Result<i64, String> {
    let t = s.trim().trim_start_matches('$');
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (!frac.is_empty() && !digits(frac)) || t.ends_with('.') {
        return Err(format!("{s:?} is not a dollar amount like 12.50"));
    }
    if frac.len() > 6 {
        return Err(format!(
            "{s:?} has more than 6 decimals (micro-USD is the smallest unit)"
        ));
    }
    let whole: i64 = whole.parse().map_err(|_| format!("{s:?} is too large"))?;
    let frac: i64 = format!("{frac:0<6}").parse().unwrap_or(0);
    whole
        .checked_mul(1_000_000)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `units × price per million`, rounded up to a whole micro-USD, so a
/// charge is never under-counted. Negative prices count as zero.
pub fn charge(units: u64, micro_usd_per_million: i64) -> i64 {
    let p = i128::from(micro_usd_per_million.max(0));
    let total = (i128::from(units) * p + 999_999) / 1_000_000;
    i64::try_from(total).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::charge;

    #[test]
    fn charges_round_up_and_never_overflow() {
        assert_eq!(charge(1_000_000, 2_500_000), 2_500_000);
        assert_eq!(charge(1, 2_500_000), 3);
        assert_eq!(charge(0, 2_500_000), 0);
        assert_eq!(charge(10, -5), 0);
        assert_eq!(charge(u64::MAX, i64::MAX), i64::MAX);
    }
}
