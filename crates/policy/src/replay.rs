//! What-if replay: a decision a job's journal recorded, with the facts it
//! was taken on, decided again under another policy set, and what would
//! then differ for the action. Nothing is called: the facts are as
//! recorded (the estimate, the budget's remaining, the arguments, the
//! time), so the same facts and set always give the same answer.

use serde::{Deserialize, Serialize};
use switchyard_proto::common::v1::PolicyDecision;

use crate::{Action, Decision, Facts, PolicySet, Verdict};

/// One policy decision as a job's journal records it (`policy.decided`):
/// the facts, and what the set in force made of them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Recorded {
    /// Everything the policies looked at.
    pub facts: Facts,
    /// `permit`, `require`, `forbid` or `default`.
    pub effect: String,
    /// The deciding policies' ids.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    /// The set's version.
    pub version: String,
    /// People the policies asked for (0 unless `require`).
    #[serde(skip_serializing_if = "crate::facts::is_zero")]
    pub approvals: u32,
}

impl Recorded {
    /// The record of `decision`, taken on `facts`.
    pub fn of(decision: &Decision, facts: Facts) -> Recorded {
        Recorded {
            facts,
            effect: decision.verdict.effect().to_owned(),
            policies: decision.verdict.by().to_vec(),
            version: decision.version.clone(),
            approvals: decision.verdict.approvers(),
        }
    }

    /// The record of a decision another service took and recorded as
    /// `record` (a run's `policy`), on `facts`.
    pub fn of_record(record: &PolicyDecision, facts: Facts) -> Recorded {
        Recorded {
            facts,
            effect: record.effect.clone(),
            policies: record.policies.clone(),
            version: record.version.clone(),
            approvals: record.policy_approvals,
        }
    }

    /// What the recorded decision meant for the action.
    pub fn outcome(&self) -> Outcome {
        Outcome::of(self.facts.action, &self.effect, self.approvals)
    }
}

/// What a decision means for its action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "approvers")]
pub enum Outcome {
    /// It goes ahead without a person.
    Allowed,
    /// It waits for this many distinct people.
    NeedsPeople(u32),
    /// It is refused.
    Forbidden,
}

impl Outcome {
    /// The outcome of `effect` on `action`: a requirement asks for its
    /// people; where no policy decides, a spend, a delegated run and a
    /// publication wait for one person and everything else goes ahead
    /// (the defaults `docs/policies.md` describes).
    pub fn of(action: Action, effect: &str, approvals: u32) -> Outcome {
        match effect {
            "forbid" => Outcome::Forbidden,
            "require" => Outcome::NeedsPeople(approvals.max(1)),
            "permit" => Outcome::Allowed,
            _ => match action {
                Action::Spend | Action::Delegate | Action::Publish => Outcome::NeedsPeople(1),
                _ => Outcome::Allowed,
            },
        }
    }

    /// The outcome in words: "allowed", "needs 2 approvers", "forbidden".
    pub fn words(self) -> String {
        match self {
            Outcome::Allowed => "allowed".into(),
            Outcome::NeedsPeople(1) => "needs an approver".into(),
            Outcome::NeedsPeople(n) => format!("needs {n} approvers"),
            Outcome::Forbidden => "forbidden".into(),
        }
    }
}

/// How a decision would change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Allowed or waiting then, refused now.
    NowForbidden,
    /// Went ahead then, would wait for people now.
    NowNeedsApproval,
    /// Would wait for more people than it did.
    MoreApprovers,
    /// Would wait for fewer people (but some).
    FewerApprovers,
    /// Waited for people then, would go ahead now.
    NoLongerNeedsApproval,
    /// Refused then, not now.
    NoLongerForbidden,
}

impl Change {
    /// Every kind, in the order a summary lists them.
    pub const ALL: [Change; 6] = [
        Change::NowForbidden,
        Change::NowNeedsApproval,
        Change::MoreApprovers,
        Change::FewerApprovers,
        Change::NoLongerNeedsApproval,
        Change::NoLongerForbidden,
    ];

    /// The change between two outcomes; `None` when they are the same.
    pub fn between(was: Outcome, now: Outcome) -> Option<Change> {
        use Outcome::*;
        Some(match (was, now) {
            (a, b) if a == b => return None,
            (_, Forbidden) => Change::NowForbidden,
            (Forbidden, _) => Change::NoLongerForbidden,
            (Allowed, NeedsPeople(_)) => Change::NowNeedsApproval,
            (NeedsPeople(_), Allowed) => Change::NoLongerNeedsApproval,
            (NeedsPeople(a), NeedsPeople(b)) if b > a => Change::MoreApprovers,
            _ => Change::FewerApprovers,
        })
    }

    /// Its name in summaries: "would be forbidden", "would need approval".
    pub fn words(self) -> &'static str {
        match self {
            Change::NowForbidden => "would be forbidden",
            Change::NowNeedsApproval => "would need approval",
            Change::MoreApprovers => "would need more approvers",
            Change::FewerApprovers => "would need fewer approvers",
            Change::NoLongerNeedsApproval => "would go ahead without approval",
            Change::NoLongerForbidden => "would no longer be forbidden",
        }
    }
}

/// A recorded decision the other set decides differently.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// How it changes.
    pub change: Change,
    /// What it meant when recorded.
    pub was: Outcome,
    /// What it would mean under the other set.
    pub now: Outcome,
    /// The policies that decided then.
    pub was_by: Vec<String>,
    /// The policies that would decide now.
    pub now_by: Vec<String>,
    /// The other set's sentence about it.
    pub explanation: String,
}

/// Decides `recorded`'s facts under `set`: the difference its outcome
/// would make, or `None` when the action would fare as it did.
pub fn replay(set: &PolicySet, recorded: &Recorded) -> Option<Difference> {
    let decision = set.decide(&recorded.facts);
    let was = recorded.outcome();
    let now = Outcome::of(
        recorded.facts.action,
        decision.verdict.effect(),
        decision.verdict.approvers(),
    );
    let change = Change::between(was, now)?;
    Some(Difference {
        change,
        was,
        now,
        was_by: recorded.policies.clone(),
        now_by: match &decision.verdict {
            Verdict::Default => Vec::new(),
            v => v.by().to_vec(),
        },
        explanation: decision.explain(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Estimate, JobFacts, Principal, PrincipalKind, Source};

    fn set(text: &str) -> PolicySet {
        PolicySet::load(&[Source {
            name: "p.cedar".into(),
            text: text.into(),
        }])
        .expect("loads")
    }

    fn call(tool: &str, cost: i64) -> Facts {
        Facts {
            principal: Principal {
                kind: PrincipalKind::Person,
                id: "alice".into(),
                tenant: "acme".into(),
            },
            action: Action::CallTool,
            resource: tool.into(),
            job: JobFacts {
                id: "j1".into(),
                tenant: "acme".into(),
                submitter: "alice".into(),
                labels: [("team".to_owned(), "web".to_owned())].into(),
            },
            estimate: Estimate {
                priced: true,
                tokens: 100,
                micro_usd: cost,
            },
            now_ms: 1_700_000_000_000,
            arguments: serde_json::json!({"path": "/etc/passwd"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    const OPEN: &str =
        r#"@id("tools-ok") permit(principal, action == Action::"call_tool", resource);"#;
    const STRICT: &str = r#"
        @id("tools-ok") permit(principal, action == Action::"call_tool", resource);
        @id("two-for-shell") @approvers("2")
        permit(principal, action == Action::"call_tool", resource == Tool::"shell");
        @id("no-passwd") @message("not that file")
        forbid(principal, action == Action::"call_tool", resource == Tool::"read_file")
        when { resource.hasTag("path") && resource.getTag("path") == "/etc/passwd" };
    "#;

    #[test]
    fn the_same_set_changes_nothing_and_a_stricter_one_names_each_change() {
        let open = set(OPEN);
        let strict = set(STRICT);
        for tool in ["shell", "read_file", "search"] {
            let facts = call(tool, 10);
            let rec = Recorded::of(&open.decide(&facts), facts);
            assert_eq!(replay(&open, &rec), None, "{tool}");
        }
        let shell = call("shell", 10);
        let rec = Recorded::of(&open.decide(&shell), shell);
        let d = replay(&strict, &rec).expect("differs");
        assert_eq!(d.change, Change::NowNeedsApproval);
        assert_eq!((d.was, d.now), (Outcome::Allowed, Outcome::NeedsPeople(2)));
        assert_eq!(d.now_by, vec!["two-for-shell".to_owned()]);
        let read = call("read_file", 10);
        let rec = Recorded::of(&open.decide(&read), read);
        let d = replay(&strict, &rec).expect("differs");
        assert_eq!(d.change, Change::NowForbidden);
        assert!(d.explanation.contains("not that file"), "{}", d.explanation);
        assert_eq!(
            replay(
                &strict,
                &Recorded::of(&open.decide(&call("search", 1)), call("search", 1))
            ),
            None
        );
    }

    #[test]
    fn a_record_read_back_from_the_journal_decides_as_it_did_twice_over() {
        let strict = set(STRICT);
        let facts = call("shell", 10);
        let rec = Recorded::of(&set(OPEN).decide(&facts), facts);
        let text = serde_json::to_string(&rec).expect("encodes");
        let back: Recorded = serde_json::from_str(&text).expect("decodes");
        assert_eq!(back, rec);
        assert_eq!(replay(&strict, &back), replay(&strict, &rec));
        assert!(replay(&strict, &back).is_some());
    }

    #[test]
    fn outcomes_follow_each_actions_default_and_changes_read_both_ways() {
        assert_eq!(
            Outcome::of(Action::Spend, "default", 0),
            Outcome::NeedsPeople(1)
        );
        assert_eq!(
            Outcome::of(Action::CallTool, "default", 0),
            Outcome::Allowed
        );
        assert_eq!(
            Outcome::of(Action::SubmitJob, "require", 3),
            Outcome::NeedsPeople(3)
        );
        use Outcome::*;
        let all = [Allowed, NeedsPeople(1), NeedsPeople(2), Forbidden];
        for was in all {
            for now in all {
                let c = Change::between(was, now);
                assert_eq!(c.is_none(), was == now, "{was:?} -> {now:?}");
                let expected = match (was, now) {
                    _ if was == now => None,
                    (_, Forbidden) => Some(Change::NowForbidden),
                    (Forbidden, _) => Some(Change::NoLongerForbidden),
                    (Allowed, _) => Some(Change::NowNeedsApproval),
                    (_, Allowed) => Some(Change::NoLongerNeedsApproval),
                    (NeedsPeople(1), NeedsPeople(2)) => Some(Change::MoreApprovers),
                    _ => Some(Change::FewerApprovers),
                };
                assert_eq!(c, expected, "{was:?} -> {now:?}");
            }
        }
    }
}
