//! The facts of an approval run, and the record of a decision as runs and
//! dry runs carry it.

use switchyard_proto::common::v1::PolicyDecision;

use crate::{Action, Decision, Estimate, Facts, JobFacts, Principal, Verdict};

/// The record of `decision` about `facts` (`Run.policy`, a dry run's
/// decision): the people it asks for are 1 unless a requirement says more.
pub fn record(decision: &Decision, facts: &Facts) -> PolicyDecision {
    PolicyDecision {
        effect: decision.verdict.effect().to_owned(),
        policies: decision.verdict.by().to_vec(),
        version: decision.version.clone(),
        approvals_required: match &decision.verdict {
            Verdict::Require { approvers, .. } => *approvers,
            _ => 1,
        },
        explanation: decision.explain(),
        delegation_depth: facts.depth,
        errors: decision.errors.clone(),
        action: facts.action.as_str().to_owned(),
        resource: facts.resource.clone(),
        policy_approvals: decision.verdict.approvers(),
    }
}

/// The facts of a proposed run, as the policies see them: a tool call's
/// run is `call_tool` (the tool, its arguments), a delegated run
/// `delegate`, a publication `publish`, any other run `spend` on its model.
/// The principal is the party the run is for (`created_by`, `tenant`).
pub fn run_facts(
    run: &switchyard_proto::approval::v1::Run,
    kind: crate::PrincipalKind,
    delegated: bool,
    depth: u32,
    now_ms: u64,
) -> Facts {
    let est = run.cost_estimate.unwrap_or_default();
    let cost = est.estimated_cost.map(|m| m.micro_usd);
    let (action, resource, arguments) = if let Some(call) = &run.tool_call {
        let args = serde_json::from_str::<serde_json::Value>(&call.arguments)
            .ok()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default();
        (Action::CallTool, call.tool.clone(), args)
    } else if let Some(p) = &run.publication {
        (Action::Publish, p.destination.clone(), Default::default())
    } else if delegated {
        (Action::Delegate, run.model.clone(), Default::default())
    } else {
        (Action::Spend, run.model.clone(), Default::default())
    };
    Facts {
        principal: Principal {
            kind,
            id: run.created_by.clone(),
            tenant: run.tenant.clone(),
        },
        action,
        resource,
        job: JobFacts {
            id: run.job_id.clone(),
            tenant: run.tenant.clone(),
            submitter: run.created_by.clone(),
            labels: run
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        },
        model: run.model.clone(),
        estimate: Estimate {
            priced: cost.is_some(),
            tokens: run.max_tokens,
            micro_usd: cost.unwrap_or(0),
        },
        tools: run.tools_allowed.clone(),
        outputs: run.outputs_allowed.clone(),
        depth,
        now_ms,
        arguments,
        ..Default::default()
    }
}
