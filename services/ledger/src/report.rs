//! Spend reports: the committed charges of a time range summed by a key
//! (project, person, agent, model, capability, job) and per bucket of time.
//! Pure: the ledger hands in the charges and the budgets they name.

use std::collections::HashMap;

use switchyard_core::Violations;
use switchyard_kit::time::{timestamp, timestamp_ms};
use switchyard_proto::ledger::v1::{
    Budget, Entry, GroupBy, Interval, ReportRequest, ReportResponse, SpendBucket, SpendGroup,
};

use crate::books::{micro, money};

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;
/// The range when `since` is not given.
const DEFAULT_RANGE_MS: u64 = 7 * DAY_MS;
/// Most buckets one report draws.
pub(crate) const MAX_BUCKETS: u64 = 2000;

/// A report's time range and bucket length, as used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub since_ms: u64,
    pub until_ms: u64,
    pub interval: Interval,
}

impl Range {
    /// The range a request asks for, defaults filled in (until: `now_ms`;
    /// since: a week before until; interval: from the length). Every
    /// problem at once.
    pub(crate) fn of(req: &ReportRequest, now_ms: u64) -> Result<Range, Violations> {
        let mut v = Violations::new();
        // Unset: up to and including this millisecond.
        let until_ms = req.until.as_ref().map_or(now_ms + 1, timestamp_ms);
        let since_ms = req
            .since
            .as_ref()
            .map_or(until_ms.saturating_sub(DEFAULT_RANGE_MS), timestamp_ms);
        if since_ms >= until_ms {
            v.add("since", "the range's start must be before its end (until)");
        }
        let length = until_ms.saturating_sub(since_ms);
        let interval = match req.interval() {
            Interval::Unspecified if length <= 2 * HOUR_MS => Interval::Minute,
            Interval::Unspecified if length <= 5 * DAY_MS => Interval::Hour,
            Interval::Unspecified => Interval::Day,
            i => i,
        };
        let r = Range {
            since_ms,
            until_ms,
            interval,
        };
        if since_ms < until_ms && r.buckets() > MAX_BUCKETS {
            v.add(
                "interval",
                format!(
                    "the range would need {} buckets of a {}, more than {MAX_BUCKETS}: choose a longer interval or a shorter range",
                    r.buckets(),
                    name(interval)
                ),
            );
        }
        v.into_result().map(|()| r)
    }

    fn step_ms(&self) -> u64 {
        match self.interval {
            Interval::Minute => MINUTE_MS,
            Interval::Hour => HOUR_MS,
            _ => DAY_MS,
        }
    }

    /// Start of the bucket holding `ms` (buckets align to UTC minutes,
    /// hours and days).
    fn floor(&self, ms: u64) -> u64 {
        ms - ms % self.step_ms()
    }

    /// How many buckets the range spans.
    fn buckets(&self) -> u64 {
        (self.until_ms.saturating_sub(1) - self.floor(self.since_ms)) / self.step_ms() + 1
    }

    fn contains(&self, ms: u64) -> bool {
        (self.since_ms..self.until_ms).contains(&ms)
    }
}

/// What an interval is called, for messages.
pub(crate) fn name(i: Interval) -> &'static str {
    match i {
        Interval::Minute => "minute",
        Interval::Hour => "hour",
        Interval::Day => "day",
        Interval::Unspecified => "chosen interval",
    }
}

/// What a report knows of the budgets its charges name: each one's parent
/// and creator.
pub(crate) struct Tree<'a> {
    budgets: HashMap<&'a str, &'a Budget>,
    /// The report's scope; `None`: the tenant's top-level budgets.
    scope: Option<&'a str>,
}

impl<'a> Tree<'a> {
    pub(crate) fn new(budgets: &'a [Budget], scope: Option<&'a str>) -> Tree<'a> {
        Tree {
            budgets: budgets.iter().map(|b| (b.budget_id.as_str(), b)).collect(),
            scope,
        }
    }

    /// The budget one level under the scope that `id` rolls up through
    /// (the top-level budget without a scope); `id` itself when it is the
    /// scope or its parent is unknown.
    fn project(&self, id: &'a str) -> &'a str {
        let mut cur = id;
        // Bounded: a parent chain is never longer than the budgets known.
        for _ in 0..=self.budgets.len() {
            if Some(cur) == self.scope {
                return cur;
            }
            let Some(parent) = self
                .budgets
                .get(cur)
                .map(|b| b.parent_id.as_str())
                .filter(|p| !p.is_empty() && self.budgets.contains_key(p))
            else {
                return cur;
            };
            if Some(parent) == self.scope {
                return cur;
            }
            cur = parent;
        }
        cur
    }

    fn key(&self, by: GroupBy, e: &'a Entry) -> &'a str {
        match by {
            GroupBy::Unspecified => "",
            GroupBy::Project => self.project(&e.budget_id),
            GroupBy::Person => self
                .budgets
                .get(e.budget_id.as_str())
                .map_or("", |b| b.created_by.as_str()),
            GroupBy::Agent => &e.agent_id,
            GroupBy::Model => &e.model,
            GroupBy::Capability => &e.capability,
            GroupBy::Job => e.context.as_ref().map_or("", |c| c.job_id.as_str()),
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Sum {
    cost: i64,
    tokens: u64,
    entries: u64,
}

impl Sum {
    fn add(&mut self, e: &Entry) {
        self.cost = self.cost.saturating_add(micro(e.total.as_ref()));
        self.tokens = self.tokens.saturating_add(e.tokens);
        self.entries += 1;
    }
}

/// Sums `entries` (any order) that fall in `range` by `by` and per bucket.
pub(crate) fn report<'a>(
    range: Range,
    by: GroupBy,
    tree: &Tree<'a>,
    entries: impl IntoIterator<Item = &'a Entry>,
) -> ReportResponse {
    let step = range.step_ms();
    let first = range.floor(range.since_ms);
    let mut buckets = vec![Sum::default(); usize::try_from(range.buckets()).unwrap_or(0)];
    let mut groups: HashMap<&str, Sum> = HashMap::new();
    let mut total = Sum::default();
    for e in entries {
        let at = e.time.as_ref().map_or(0, timestamp_ms);
        if !range.contains(at) {
            continue;
        }
        total.add(e);
        if let Some(b) = usize::try_from((at - first) / step)
            .ok()
            .and_then(|i| buckets.get_mut(i))
        {
            b.add(e);
        }
        if by != GroupBy::Unspecified {
            groups.entry(tree.key(by, e)).or_default().add(e);
        }
    }
    let mut groups: Vec<(&str, Sum)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.cost.cmp(&a.1.cost).then(a.0.cmp(b.0)));
    ReportResponse {
        since: Some(timestamp(range.since_ms)),
        until: Some(timestamp(range.until_ms)),
        group_by: by as i32,
        interval: range.interval as i32,
        groups: groups
            .into_iter()
            .map(|(key, s)| SpendGroup {
                key: key.to_owned(),
                cost: Some(money(s.cost)),
                tokens: s.tokens,
                entries: s.entries,
            })
            .collect(),
        buckets: buckets
            .into_iter()
            .zip(0u64..)
            .map(|(s, i)| SpendBucket {
                start: Some(timestamp(first + i * step)),
                cost: Some(money(s.cost)),
                tokens: s.tokens,
                entries: s.entries,
            })
            .collect(),
        total_cost: Some(money(total.cost)),
        total_tokens: total.tokens,
        entries: total.entries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::common::v1::{CorrelationContext, Money};

    const T0: u64 = 1_700_000_000_000 - 1_700_000_000_000 % DAY_MS;

    fn budget(id: &str, parent: &str, by: &str) -> Budget {
        Budget {
            budget_id: id.into(),
            parent_id: parent.into(),
            created_by: by.into(),
            ..Default::default()
        }
    }

    fn entry(budget: &str, at: u64, cost: i64, model: &str, job: &str) -> Entry {
        Entry {
            budget_id: budget.into(),
            model: model.into(),
            agent_id: format!("agent-{model}"),
            capability: "text.summarize".into(),
            total: Some(Money { micro_usd: cost }),
            tokens: 10,
            time: Some(timestamp(at)),
            context: Some(CorrelationContext {
                job_id: job.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn budgets() -> Vec<Budget> {
        vec![
            budget("acme", "", "admin"),
            budget("acme/docs", "acme", "admin"),
            budget("acme/web", "acme", "admin"),
            budget("job-1", "acme/docs", "alice"),
            budget("job-2", "acme/web", "bob"),
        ]
    }

    fn range(since: u64, until: u64, i: Interval) -> Range {
        Range::of(
            &ReportRequest {
                since: Some(timestamp(since)),
                until: Some(timestamp(until)),
                interval: i as i32,
                ..Default::default()
            },
            until,
        )
        .expect("valid range")
    }

    fn keys(r: &ReportResponse) -> Vec<(String, i64)> {
        r.groups
            .iter()
            .map(|g| (g.key.clone(), g.cost.map_or(0, |m| m.micro_usd)))
            .collect()
    }

    #[test]
    fn project_groups_roll_jobs_up_to_the_level_under_the_scope() {
        let all = budgets();
        let es = [
            entry("job-1", T0 + 1, 20, "m1", "j1"),
            entry("job-1", T0 + 2, 30, "m2", "j1"),
            entry("job-2", T0 + 3, 5, "m1", "j2"),
            entry("acme", T0 + 4, 7, "m1", ""),
        ];
        let r = range(T0, T0 + HOUR_MS, Interval::Unspecified);
        let scoped = report(r, GroupBy::Project, &Tree::new(&all, Some("acme")), &es);
        assert_eq!(
            keys(&scoped),
            [
                ("acme/docs".into(), 50),
                ("acme".into(), 7),
                ("acme/web".into(), 5)
            ]
        );
        let top = report(r, GroupBy::Project, &Tree::new(&all, None), &es);
        assert_eq!(keys(&top), [("acme".into(), 62)]);
        let person = report(r, GroupBy::Person, &Tree::new(&all, None), &es);
        assert_eq!(
            keys(&person),
            [("alice".into(), 50), ("admin".into(), 7), ("bob".into(), 5)]
        );
        let model = report(r, GroupBy::Model, &Tree::new(&all, None), &es);
        assert_eq!(keys(&model), [("m1".into(), 32), ("m2".into(), 30)]);
        let job = report(r, GroupBy::Job, &Tree::new(&all, None), &es);
        assert_eq!(
            keys(&job),
            [("j1".into(), 50), ("".into(), 7), ("j2".into(), 5)]
        );
        assert_eq!(scoped.total_cost.map(|m| m.micro_usd), Some(62));
        assert_eq!((scoped.entries, scoped.total_tokens), (4, 40));
    }

    #[test]
    fn buckets_cover_the_whole_range_and_charges_outside_it_are_left_out() {
        let all = budgets();
        let es = [
            entry("job-1", T0 - 1, 1000, "m1", "j1"),
            entry("job-1", T0, 1, "m1", "j1"),
            entry("job-1", T0 + HOUR_MS + 5, 2, "m1", "j1"),
            entry("job-1", T0 + HOUR_MS + 6, 3, "m1", "j1"),
            entry("job-1", T0 + 3 * HOUR_MS, 1000, "m1", "j1"),
        ];
        let r = range(T0, T0 + 3 * HOUR_MS, Interval::Hour);
        let out = report(r, GroupBy::Unspecified, &Tree::new(&all, None), &es);
        let costs: Vec<i64> = out
            .buckets
            .iter()
            .map(|b| b.cost.map_or(0, |m| m.micro_usd))
            .collect();
        assert_eq!(costs, [1, 5, 0]);
        assert_eq!(
            out.buckets
                .iter()
                .map(|b| b.start.as_ref().map_or(0, timestamp_ms))
                .collect::<Vec<_>>(),
            [T0, T0 + HOUR_MS, T0 + 2 * HOUR_MS]
        );
        assert!(out.groups.is_empty());
        assert_eq!(out.total_cost.map(|m| m.micro_usd), Some(6));
    }

    #[test]
    fn the_interval_is_chosen_from_the_range_and_too_many_buckets_are_refused() {
        let chosen = |len: u64| range(T0, T0 + len, Interval::Unspecified).interval;
        assert_eq!(chosen(HOUR_MS), Interval::Minute);
        assert_eq!(chosen(2 * DAY_MS), Interval::Hour);
        assert_eq!(chosen(30 * DAY_MS), Interval::Day);
        let too_many = Range::of(
            &ReportRequest {
                since: Some(timestamp(T0)),
                until: Some(timestamp(T0 + 30 * DAY_MS)),
                interval: Interval::Minute as i32,
                ..Default::default()
            },
            T0,
        )
        .expect_err("43200 minutes");
        assert!(format!("{too_many:?}").contains("choose a longer interval"));
        let backwards = Range::of(
            &ReportRequest {
                since: Some(timestamp(T0 + 1)),
                until: Some(timestamp(T0)),
                ..Default::default()
            },
            T0,
        )
        .expect_err("since after until");
        assert!(format!("{backwards:?}").contains("before its end"));
        let default = Range::of(&ReportRequest::default(), T0 + DAY_MS).expect("defaults");
        assert_eq!(
            (default.since_ms, default.until_ms),
            (T0 + DAY_MS + 1 - DEFAULT_RANGE_MS, T0 + DAY_MS + 1)
        );
    }
}
