//! The AITP routing score (seed 002 §4.2), with the intended weighting.
//!
//! The seed's pseudo-code reads `(1 - latency/1000 * 0.2)`, which by operator
//! precedence weights the constant 1 instead of the latency term. We implement
//! the intent — every factor in `[0, 1]`, weighted:
//!
//! ```text
//! score = w_capability · capability_match
//!       + w_trust      · trust_score / 100
//!       + w_latency    · (1 − min(latency, L) / L)
//!       + w_cost       · (1 − price / max_cost)
//!       + w_preference · preferred_labels_matched / preferred_labels_asked
//! ```
//!
//! with defaults 0.3 / 0.3 / 0.2 / 0.2 and L = 1000 ms as in the seed. The
//! preference term is Switchyard's addition for `prefer_labels` (default weight
//! 0.1; it is 0 when no labels are asked, so the seed's formula is unchanged).
//! A capability matched through a parent (`nlp` serving `nlp.analysis`) has its
//! proficiency multiplied by `parent_match_discount` per level.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// Factor weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Weights {
    /// Weight of capability match.
    pub capability: f64,
    /// Weight of trust.
    pub trust: f64,
    /// Weight of latency.
    pub latency: f64,
    /// Weight of cost.
    pub cost: f64,
    /// Weight of label preference.
    pub preference: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            capability: 0.3,
            trust: 0.3,
            latency: 0.2,
            cost: 0.2,
            preference: 0.1,
        }
    }
}

/// Everything the score depends on besides the candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScoringConfig {
    /// Factor weights.
    pub weights: Weights,
    /// L: latency at or above which the latency factor is 0, milliseconds.
    pub latency_ceiling_ms: f64,
    /// Proficiency multiplier per level when matched through a parent capability.
    pub parent_match_discount: f64,
}

impl Default for ScoringConfig {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            latency_ceiling_ms: 1000.0,
            parent_match_discount: 0.8,
        }
    }
}

impl ScoringConfig {
    /// Checks the configuration, naming the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let w = &self.weights;
        for (name, v) in [
            ("capability", w.capability),
            ("trust", w.trust),
            ("latency", w.latency),
            ("cost", w.cost),
            ("preference", w.preference),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "weights.{name} must be a finite number >= 0, got {v}"
                ));
            }
        }
        if !(self.latency_ceiling_ms.is_finite() && self.latency_ceiling_ms > 0.0) {
            return Err(format!(
                "latency_ceiling_ms must be > 0, got {}",
                self.latency_ceiling_ms
            ));
        }
        if !(0.0..=1.0).contains(&self.parent_match_discount) {
            return Err(format!(
                "parent_match_discount must be between 0 and 1, got {}",
                self.parent_match_discount
            ));
        }
        Ok(())
    }
}

/// One candidate's facts, as the score sees them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreInput {
    /// Proficiency for the matched capability, 0–1.
    pub proficiency: f64,
    /// 0 for an exact match, n when matched through the n-th ancestor.
    pub levels_up: u32,
    /// Trust score 0–100.
    pub trust_score: u32,
    /// Latency in milliseconds (observed EWMA or registered estimate).
    pub latency_ms: f64,
    /// Price per unit, micro-USD.
    pub price: i64,
    /// Cost denominator: the constraint, else the highest candidate price.
    pub max_cost: i64,
    /// Preferred labels the agent carries.
    pub preferred_matched: usize,
    /// Preferred labels asked for.
    pub preferred_total: usize,
}

/// Each factor in `[0, 1]` and the weighted total.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Breakdown {
    /// Capability match.
    pub capability_match: f64,
    /// Trust / 100.
    pub trust: f64,
    /// Latency factor.
    pub latency: f64,
    /// Cost factor.
    pub cost: f64,
    /// Preference factor.
    pub preference: f64,
    /// Weighted sum.
    pub total: f64,
}

/// Scores one candidate.
pub fn score(cfg: &ScoringConfig, i: &ScoreInput) -> Breakdown {
    let capability_match =
        i.proficiency.clamp(0.0, 1.0) * cfg.parent_match_discount.powi(i.levels_up as i32);
    let trust = f64::from(i.trust_score.min(100)) / 100.0;
    let l = cfg.latency_ceiling_ms;
    let latency = 1.0 - i.latency_ms.max(0.0).min(l) / l;
    let cost = if i.max_cost <= 0 {
        1.0
    } else {
        1.0 - (i.price.max(0).min(i.max_cost) as f64) / (i.max_cost as f64)
    };
    let preference = if i.preferred_total == 0 {
        0.0
    } else {
        i.preferred_matched as f64 / i.preferred_total as f64
    };
    let w = &cfg.weights;
    let total = w.capability * capability_match
        + w.trust * trust
        + w.latency * latency
        + w.cost * cost
        + w.preference * preference;
    Breakdown {
        capability_match,
        trust,
        latency,
        cost,
        preference,
        total,
    }
}

/// Ranking order: higher score first, ties by agent id ascending, so the same
/// inputs always give the same order.
pub fn rank(a: (f64, &str), b: (f64, &str)) -> Ordering {
    b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> ScoreInput {
        ScoreInput {
            proficiency: 0.9,
            levels_up: 0,
            trust_score: 80,
            latency_ms: 250.0,
            price: 1_000,
            max_cost: 4_000,
            preferred_matched: 0,
            preferred_total: 0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn score_matches_hand_computed_seed_formula() {
        // 0.3*0.9 + 0.3*0.8 + 0.2*(1-250/1000) + 0.2*(1-1000/4000)
        // = 0.27 + 0.24 + 0.15 + 0.15 = 0.81
        let b = score(&ScoringConfig::default(), &input());
        assert!(close(b.capability_match, 0.9));
        assert!(close(b.trust, 0.8));
        assert!(close(b.latency, 0.75));
        assert!(close(b.cost, 0.75));
        assert!(close(b.preference, 0.0));
        assert!(close(b.total, 0.81), "{}", b.total);
    }

    #[test]
    fn latency_at_or_beyond_ceiling_scores_zero_not_negative() {
        let mut i = input();
        i.latency_ms = 5_000.0;
        let b = score(&ScoringConfig::default(), &i);
        assert!(close(b.latency, 0.0));
        // 0.27 + 0.24 + 0 + 0.15
        assert!(close(b.total, 0.66));
    }

    #[test]
    fn free_agents_and_zero_max_cost_get_full_cost_factor() {
        let mut i = input();
        i.max_cost = 0;
        assert!(close(score(&ScoringConfig::default(), &i).cost, 1.0));
        i.max_cost = 4_000;
        i.price = 0;
        assert!(close(score(&ScoringConfig::default(), &i).cost, 1.0));
        i.price = 4_000;
        assert!(close(score(&ScoringConfig::default(), &i).cost, 0.0));
    }

    #[test]
    fn parent_capability_match_is_discounted_per_level() {
        let mut i = input();
        i.proficiency = 1.0;
        i.levels_up = 2;
        let b = score(&ScoringConfig::default(), &i);
        assert!(close(b.capability_match, 0.64));
    }

    #[test]
    fn preference_adds_weighted_fraction_of_labels_matched() {
        let mut i = input();
        i.preferred_matched = 1;
        i.preferred_total = 2;
        let b = score(&ScoringConfig::default(), &i);
        assert!(close(b.preference, 0.5));
        assert!(close(b.total, 0.81 + 0.05));
    }

    #[test]
    fn custom_weights_and_ceiling_are_used() {
        let cfg = ScoringConfig {
            weights: Weights {
                capability: 0.0,
                trust: 0.0,
                latency: 1.0,
                cost: 0.0,
                preference: 0.0,
            },
            latency_ceiling_ms: 500.0,
            parent_match_discount: 0.5,
        };
        let b = score(&cfg, &input());
        assert!(close(b.total, 0.5));
    }

    #[test]
    fn rank_orders_by_score_then_id() {
        let mut v = [(0.5, "b"), (0.9, "z"), (0.5, "a"), (0.7, "c")];
        v.sort_by(|x, y| rank(*x, *y));
        assert_eq!(
            v.iter().map(|x| x.1).collect::<Vec<_>>(),
            ["z", "c", "a", "b"]
        );
    }

    #[test]
    fn config_validation_names_the_bad_key() {
        assert!(ScoringConfig::default().validate().is_ok());
        let mut c = ScoringConfig::default();
        c.weights.trust = -1.0;
        assert!(c.validate().unwrap_err().contains("weights.trust"));
        let c = ScoringConfig {
            latency_ceiling_ms: 0.0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("latency_ceiling_ms"));
    }
}
