//! Auto-approve policies (`[[approval.policies]]`): rules over a run's
//! estimated cost, token limit, model, tools and outputs. The first rule
//! that matches approves the run in the policy's name; no match leaves the
//! run for a person.

use serde::{Deserialize, Serialize};
use switchyard_proto::approval::v1::Run;

/// One auto-approve rule. Every condition given must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Name recorded as the approver (`policy:<name>`).
    pub name: String,
    /// The run's estimated cost must be known and at most this (or, with
    /// `allow_unpriced`, unknown).
    pub max_estimated_cost_micro_usd: Option<i64>,
    /// The run's `max_tokens` must be at most this.
    pub max_tokens: Option<u64>,
    /// The run's model must be one of these (any when unset).
    pub models: Option<Vec<String>>,
    /// Every tool the run may use must be one of these (any when unset).
    pub tools_allowed: Option<Vec<String>>,
    /// Every output the run may propose must be one of these (any when unset).
    pub outputs_allowed: Option<Vec<String>>,
    /// Also approve runs whose cost cannot be estimated (a pull worker's
    /// spending under a token budget with no cost limit, unpriced models)
    /// when every other condition holds. Pair it with `max_tokens`: then
    /// the tokens approved are bounded though the money is not.
    pub allow_unpriced: bool,
}

impl Policy {
    /// The default rule: runs estimated to cost nothing.
    pub fn zero_cost() -> Policy {
        Policy {
            name: "zero-cost".into(),
            max_estimated_cost_micro_usd: Some(0),
            ..Default::default()
        }
    }

    /// True when every condition holds for `run`.
    pub fn matches(&self, run: &Run) -> bool {
        let subset = |allowed: &Option<Vec<String>>, wanted: &[String]| {
            allowed
                .as_ref()
                .is_none_or(|a| wanted.iter().all(|w| a.contains(w)))
        };
        let cost = run
            .cost_estimate
            .as_ref()
            .and_then(|e| e.estimated_cost.as_ref())
            .map(|m| m.micro_usd);
        let priced =
            matches!((cost, self.max_estimated_cost_micro_usd), (Some(c), Some(max)) if c <= max);
        let unpriced = self.allow_unpriced && cost.is_none() && run.max_tokens > 0;
        (priced || unpriced)
            && self.max_tokens.is_none_or(|m| run.max_tokens <= m)
            && self.models.as_ref().is_none_or(|m| m.contains(&run.model))
            && subset(&self.tools_allowed, &run.tools_allowed)
            && subset(&self.outputs_allowed, &run.outputs_allowed)
    }
}

/// The first policy that approves `run`.
pub fn first_match<'a>(policies: &'a [Policy], run: &Run) -> Option<&'a Policy> {
    policies.iter().find(|p| p.matches(run))
}

/// Checks a policy list: named, unique, each capping the cost.
pub fn validate_all(policies: &[Policy]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (i, p) in policies.iter().enumerate() {
        if p.name.is_empty() {
            return Err(format!("approval.policies[{i}].name is required"));
        }
        if !seen.insert(&p.name) {
            return Err(format!("approval.policies: {:?} is defined twice", p.name));
        }
        match p.max_estimated_cost_micro_usd {
            None => {
                return Err(format!(
                    "approval.policies {:?}: max_estimated_cost_micro_usd is required (a policy must cap the cost it approves)",
                    p.name
                ));
            }
            Some(c) if c < 0 => {
                return Err(format!(
                    "approval.policies {:?}: max_estimated_cost_micro_usd must not be negative",
                    p.name
                ));
            }
            Some(_) => {}
        }
        if p.allow_unpriced && p.max_tokens.is_none() {
            return Err(format!(
                "approval.policies {:?}: allow_unpriced needs max_tokens (the tokens it may approve without a price)",
                p.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::approval::v1::CostEstimate;
    use switchyard_proto::common::v1::Money;

    fn run(cost: Option<i64>) -> Run {
        Run {
            model: "gpt-4o-mini".into(),
            max_tokens: 1_000,
            tools_allowed: vec!["filesystem_read".into()],
            outputs_allowed: vec!["propose_pr".into()],
            cost_estimate: cost.map(|c| CostEstimate {
                estimated_cost: Some(Money { micro_usd: c }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_default_approves_only_a_known_zero_cost() {
        let p = Policy::zero_cost();
        assert!(p.matches(&run(Some(0))));
        assert!(!p.matches(&run(Some(1))));
        assert!(!p.matches(&run(None)), "an unknown cost is not zero");
    }

    #[test]
    fn allow_unpriced_approves_an_unknown_cost_only_within_its_tokens() {
        let p = Policy {
            name: "budgets".into(),
            max_estimated_cost_micro_usd: Some(0),
            max_tokens: Some(10_000),
            allow_unpriced: true,
            ..Default::default()
        };
        let mut r = run(None);
        r.max_tokens = 10_000;
        assert!(p.matches(&r));
        r.max_tokens = 10_001;
        assert!(!p.matches(&r), "more tokens than the policy allows");
        let strict = Policy {
            allow_unpriced: false,
            ..p.clone()
        };
        r.max_tokens = 1;
        assert!(
            !strict.matches(&r),
            "an unknown cost is not approved without allow_unpriced"
        );
        let unbounded = Policy {
            max_tokens: None,
            ..p
        };
        assert!(
            validate_all(&[unbounded]).is_err(),
            "allow_unpriced needs max_tokens"
        );
    }

    #[test]
    fn every_condition_must_hold() {
        let p = Policy {
            name: "cheap-readonly".into(),
            max_estimated_cost_micro_usd: Some(50_000),
            max_tokens: Some(2_000),
            models: Some(vec!["gpt-4o-mini".into()]),
            tools_allowed: Some(vec!["none".into(), "filesystem_read".into()]),
            outputs_allowed: Some(vec!["propose_pr".into(), "propose_test_plan".into()]),
            allow_unpriced: false,
        };
        assert!(p.matches(&run(Some(50_000))));
        assert!(!p.matches(&run(Some(50_001))));
        let mut r = run(Some(1));
        r.tools_allowed.push("git_write_propose".into());
        assert!(!p.matches(&r), "a tool outside the policy");
        let mut r = run(Some(1));
        r.model = "gpt-5".into();
        assert!(!p.matches(&r));
        let mut r = run(Some(1));
        r.max_tokens = 2_001;
        assert!(!p.matches(&r));
        let mut r = run(Some(1));
        r.outputs_allowed = vec!["propose_changeset_bundle".into()];
        assert!(!p.matches(&r));
    }

    #[test]
    fn policies_need_a_unique_name_and_a_cost_cap() {
        assert!(validate_all(&[Policy::zero_cost()]).is_ok());
        let uncapped = Policy {
            name: "all".into(),
            ..Default::default()
        };
        assert!(validate_all(&[uncapped]).unwrap_err().contains("cap"));
        let e = validate_all(&[Policy::zero_cost(), Policy::zero_cost()]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }
}
