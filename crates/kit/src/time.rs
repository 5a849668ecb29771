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

#[cfg(test)]
mod tests {
    use super::*;

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
