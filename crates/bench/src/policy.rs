//! Policy decisions: one Cedar decision in-process with 100 policies in
//! force (a mix of spend permits, tool-call forbids on arguments, two-
//! approver requirements on labels, submission freezes), against the empty
//! set measured in the same run.

use std::hint::black_box;
use std::time::Instant;

use hdrhistogram::Histogram;
use switchyard_policy::{
    Action, Estimate, Facts, JobFacts, PolicySet, Principal, PrincipalKind, Source,
};

use crate::verdict;

/// Decisions timed per set.
const DECISIONS: usize = 200_000;

/// 100 policies as one source: 40 spend permits by model and amount, 30
/// tool-call forbids on an argument, 20 two-approver requirements on a
/// label and the estimate, 10 submission freezes by label and hour.
pub(crate) fn hundred() -> Vec<Source> {
    let mut text = String::new();
    for i in 0..40 {
        text.push_str(&format!(
            "@id(\"spend-{i}\") permit(principal, action == Action::\"spend\", resource == Model::\"model-{i}\") when {{ context.estimate.priced && context.estimate.micro_usd <= {} }};\n",
            1_000 * (i + 1)
        ));
    }
    for i in 0..30 {
        text.push_str(&format!(
            "@id(\"no-path-{i}\") forbid(principal, action == Action::\"call_tool\", resource == Tool::\"tool-{i}\") when {{ resource.hasTag(\"path\") && resource.getTag(\"path\") like \"/secret-{i}/*\" }};\n"
        ));
    }
    for i in 0..20 {
        text.push_str(&format!(
            "@id(\"team-{i}\") @approvers(\"2\") permit(principal, action == Action::\"call_tool\", resource) when {{ context.job.hasTag(\"team\") && context.job.getTag(\"team\") == \"team-{i}\" && context.estimate.micro_usd > {} }};\n",
            i * 100
        ));
    }
    for i in 0..10 {
        text.push_str(&format!(
            "@id(\"freeze-{i}\") forbid(principal, action == Action::\"submit_job\", resource) when {{ resource.hasTag(\"freeze-{i}\") && context.now.hour < {i} }};\n"
        ));
    }
    vec![Source {
        name: "bench.cedar".into(),
        text,
    }]
}

/// The facts decided, in turn: a spend, a tool call with arguments, a
/// submission.
fn facts() -> Vec<Facts> {
    let base = Facts {
        principal: Principal {
            kind: PrincipalKind::Person,
            id: "alice".into(),
            tenant: "acme".into(),
        },
        job: JobFacts {
            id: "job-1".into(),
            tenant: "acme".into(),
            submitter: "alice".into(),
            labels: [
                ("team".to_owned(), "team-7".to_owned()),
                ("env".to_owned(), "prod".to_owned()),
            ]
            .into(),
        },
        model: "model-7".into(),
        estimate: Estimate {
            priced: true,
            tokens: 2_000,
            micro_usd: 3_000,
        },
        tools: vec!["tool-3".into()],
        now_ms: 1_795_789_800_000,
        ..Default::default()
    };
    vec![
        Facts {
            action: Action::Spend,
            resource: "model-7".into(),
            ..base.clone()
        },
        Facts {
            action: Action::CallTool,
            resource: "tool-3".into(),
            arguments: serde_json::json!({"path": "/secret-3/keys", "mode": "read"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            ..base.clone()
        },
        Facts {
            action: Action::SubmitJob,
            resource: "job-1".into(),
            ..base
        },
    ]
}

fn time(set: &PolicySet, facts: &[Facts]) -> anyhow::Result<Histogram<u64>> {
    let mut h = Histogram::<u64>::new(3)?;
    for f in facts.iter().cycle().take(DECISIONS / 10) {
        black_box(set.decide(f));
    }
    for f in facts.iter().cycle().take(DECISIONS) {
        let t = Instant::now();
        black_box(set.decide(black_box(f)));
        h.record(t.elapsed().as_nanos() as u64).ok();
    }
    Ok(h)
}

pub async fn run() -> anyhow::Result<()> {
    let set = PolicySet::load(&hundred())?;
    let empty = PolicySet::load(&[Source {
        name: "one.cedar".into(),
        text: "@id(\"one\") permit(principal, action == Action::\"publish\", resource);".into(),
    }])?;
    let facts = facts();
    // The decisions are what the policies say they are.
    let said: Vec<&str> = facts
        .iter()
        .map(|f| set.decide(f).verdict.effect())
        .collect();
    anyhow::ensure!(
        said == ["permit", "forbid", "default"],
        "the bench policies decided {said:?}"
    );
    let one = time(&empty, &facts)?;
    let hundred = time(&set, &facts)?;
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!("\nPolicy decisions (Cedar, in-process, one thread):");
    println!(
        "  1 policy:     p50 {:>6.2} µs  p99 {:>6.2} µs",
        us(&one, 0.5),
        us(&one, 0.99)
    );
    println!(
        "  100 policies: p50 {:>6.2} µs  p99 {:>6.2} µs  ({:.1}x the one-policy p50)  [{}: p99 <= 50 µs]",
        us(&hundred, 0.5),
        us(&hundred, 0.99),
        us(&hundred, 0.5) / us(&one, 0.5).max(0.001),
        verdict(us(&hundred, 0.99) <= 50.0)
    );
    Ok(())
}
