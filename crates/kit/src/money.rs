//! Money as people read it: micro-USD as dollars.

/// Micro-USD as dollars, to the micro-dollar (`$0.150000`), for tables.
pub fn usd(micro: i64) -> String {
    let sign = if micro < 0 { "-" } else { "" };
    let m = micro.unsigned_abs();
    format!("{sign}${}.{:06}", m / 1_000_000, m % 1_000_000)
}

/// Micro-USD as dollars without trailing zeros (`$3`, `$0.15`,
/// `$0.000001`), for prices and sentences.
pub fn usd_compact(micro: i64) -> String {
    let full = usd(micro);
    full.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_are_exact_to_the_micro_dollar_and_compact_drops_trailing_zeros() {
        assert_eq!(usd(150_000), "$0.150000");
        assert_eq!(usd(-1), "-$0.000001");
        assert_eq!(usd_compact(3_000_000), "$3");
        assert_eq!(usd_compact(150_000), "$0.15");
        assert_eq!(usd_compact(0), "$0");
    }
}
