//! Money arithmetic shared by the ledger and the LLM providers: integers
//! only, micro-USD, prices per million units.

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
