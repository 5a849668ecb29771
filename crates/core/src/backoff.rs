//! Retry delays (seed 002 §6.1): fixed, linear or exponential from a base,
//! capped, with optional jitter.

use std::time::Duration;

/// How the delay grows between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// `base` every time.
    Fixed,
    /// `base × n` before retry n.
    Linear,
    /// `base × coefficient^(n−1)` before retry n (with the default
    /// coefficient 2, the seed's 1 s, 2 s, 4 s).
    #[default]
    Exponential,
}

/// A retry policy's delay settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Strategy.
    pub strategy: Strategy,
    /// First delay.
    pub base: Duration,
    /// Upper bound on any delay.
    pub max: Duration,
    /// Fraction of the delay (0–1) randomised: the delay is scaled by a
    /// factor in `[1 − jitter, 1]`.
    pub jitter: f64,
    /// Growth factor of [`Strategy::Exponential`] (at least 1).
    pub coefficient: f64,
}

impl Backoff {
    /// Delay before retry `n` (1 = the first retry). `unit` is a random
    /// number in `[0, 1)` supplied by the caller, so this stays pure.
    pub fn delay(&self, n: u32, unit: f64) -> Duration {
        let n = n.max(1);
        let base = self.base.as_millis() as u64;
        let ms = match self.strategy {
            Strategy::Fixed => base,
            Strategy::Linear => base.saturating_mul(u64::from(n)),
            Strategy::Exponential => {
                let factor = self.coefficient.max(1.0).powi((n - 1).min(64) as i32);
                // Saturates (as f64 → u64 casts do) past u64::MAX.
                (base as f64 * factor) as u64
            }
        };
        let capped = Duration::from_millis(ms).min(self.max);
        let jitter = self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        capped.mul_f64(1.0 - jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(strategy: Strategy, n: u32) -> u128 {
        Backoff {
            strategy,
            base: Duration::from_millis(1000),
            max: Duration::from_secs(5),
            jitter: 0.0,
            coefficient: 2.0,
        }
        .delay(n, 0.7)
        .as_millis()
    }

    #[test]
    fn the_seeds_exponential_example_then_the_cap() {
        let got: Vec<u128> = (1..=4).map(|n| ms(Strategy::Exponential, n)).collect();
        assert_eq!(got, vec![1000, 2000, 4000, 5000]);
        assert_eq!(ms(Strategy::Exponential, 200), 5000, "no overflow");
    }

    #[test]
    fn fixed_and_linear_grow_as_named() {
        assert_eq!(
            (1..=3).map(|n| ms(Strategy::Fixed, n)).collect::<Vec<_>>(),
            vec![1000; 3]
        );
        assert_eq!(
            (1..=3).map(|n| ms(Strategy::Linear, n)).collect::<Vec<_>>(),
            vec![1000, 2000, 3000]
        );
    }

    #[test]
    fn jitter_only_shortens_within_its_fraction() {
        let b = Backoff {
            strategy: Strategy::Fixed,
            base: Duration::from_millis(1000),
            max: Duration::from_secs(10),
            jitter: 0.5,
            coefficient: 2.0,
        };
        assert_eq!(b.delay(1, 0.0).as_millis(), 1000);
        assert_eq!(b.delay(1, 0.5).as_millis(), 750);
        assert!(b.delay(1, 0.999).as_millis() >= 500);
    }

    #[test]
    fn exponential_grows_by_its_coefficient_and_stops_at_the_cap() {
        let b = |coefficient| Backoff {
            strategy: Strategy::Exponential,
            base: Duration::from_millis(1000),
            max: Duration::from_secs(2),
            jitter: 0.0,
            coefficient,
        };
        assert_eq!(b(10.0).delay(1, 0.0).as_millis(), 1000);
        assert_eq!(b(10.0).delay(2, 0.0).as_millis(), 2000);
        assert_eq!(b(1.5).delay(2, 0.0).as_millis(), 1500);
        assert_eq!(b(1.0).delay(5, 0.0).as_millis(), 1000);
        assert_eq!(b(10.0).delay(u32::MAX, 0.0).as_millis(), 2000);
    }
}
