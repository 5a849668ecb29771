//! Admission: a request's job is converted and checked ([`Executor::accept`]),
//! its worst case estimated ([`estimate`], pure, from the routes and prices
//! gathered first), its approval run proposed ([`proposal`], pure) and its
//! budget created ([`Executor::admit`]); then it waits for approval
//! ([`Executor::poll_approvals`]) or starts at once.

use std::collections::HashMap;
use std::time::Duration;

use switchyard_core::lifecycle::JobState;
use switchyard_core::{Reason, Violations};
use switchyard_kit::auth::grant::GrantError;
use switchyard_kit::auth::{OnBehalf, Principal};
use switchyard_kit::error::is_outage;
use switchyard_proto::approval::v1 as ap;
use switchyard_proto::common::v1::{Money, PolicyDecision};
use switchyard_proto::executor::v1::{
    AgentTask, FallbackStrategy, JobBudget, JobSpec, LlmTask, RoutePreview, SubmitJobRequest,
    SubmitJobResponse, TaskStatus, ValidateJobRequest, ValidateJobResponse, task_spec::Kind,
};
use switchyard_proto::ledger::v1::CreateBudgetRequest;
use switchyard_proto::router::v1::{RouteConstraints, RouteRequest, RouteResponse};
use tonic::Status;

use crate::book::Jobs;
use crate::depend::{Service, Waiter};
use crate::error::{ExecutorError, upstream};
use crate::events::{self, JobEvent};
use crate::formats::{self, FormatError};
use crate::job::JobEntry;
use crate::outbox::RunEnd;
use crate::{Executor, spec};

/// The job a delegated job comes from.
#[derive(Debug, Clone)]
pub(crate) struct Parent {
    run_id: String,
    budget_id: String,
    submitter: OnBehalf,
}

impl Parent {
    fn of(p: &JobEntry) -> Parent {
        Parent {
            run_id: p.job.run_id.clone(),
            budget_id: p.job.budget_id.clone(),
            submitter: p.submitter(),
        }
    }
}

/// The worst case of a job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Estimate {
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    /// `None` when some part cannot be priced (unknown model, no agent yet,
    /// or spending decided later: agents as tools, delegation).
    pub(crate) cost: Option<i64>,
    pub(crate) routes: Vec<RoutePreview>,
    /// Part of the job spends amounts decided later — agents (which may
    /// bill their own calls or delegate child jobs whose budgets nest under
    /// the job's), agents called as tools, delegation: its tokens are not
    /// bounded by this estimate.
    pub(crate) open_ended: bool,
}

impl Estimate {
    /// The tokens a person approves as the job's cap (`max_tokens` of its
    /// run), when the estimate bounds them: then the job's budget holds no
    /// more, so what is approved bounds what can be reserved.
    pub(crate) fn token_cap(&self) -> Option<u64> {
        let tokens = self.input_tokens.saturating_add(self.output_tokens);
        (!self.open_ended && tokens > 0).then_some(tokens)
    }
}

/// What the estimate needs from outside the spec.
pub(crate) struct Known<'a> {
    /// Candidates of each agent task, by task id.
    pub(crate) routes: &'a HashMap<String, RouteResponse>,
    /// The one price catalogue (`[llm]`).
    pub(crate) llm: &'a switchyard_llm::Llm,
    /// Tokens reserved for one agent call.
    pub(crate) agent_max_tokens: u64,
    /// Output tokens assumed for an LLM task without max_tokens.
    pub(crate) llm_default_max_tokens: u64,
    /// Model calls of an LLM task attempt without max_turns.
    pub(crate) llm_max_turns: u32,
}

/// Tokens reserved for one agent call: the configured amount within the
/// job's token budget.
pub(crate) fn agent_tokens(configured: u64, token_cap: Option<u64>) -> u64 {
    token_cap.map_or(configured, |cap| configured.min(cap))
}

/// Attempts a task may make: its retries and one timeout extension.
fn attempts(t: &switchyard_proto::executor::v1::TaskSpec) -> u64 {
    let retry = t.retry.as_ref().map_or(0, |r| r.max_retries);
    let extension = t
        .fallback
        .as_ref()
        .is_some_and(|f| f.on_timeout == FallbackStrategy::RetryWithTimeoutExtension as i32);
    1 + u64::from(retry) + u64::from(extension)
}

// The estimate saturates instead of overflowing: every figure a client
// names is bounded by validation (`money::MAX_TOKENS`), yet products of
// turns, attempts and tasks are still computed so that an absurd job
// shows the approver an absurd worst case, never a wrapped small one.

/// Worst-case tokens and cost of `spec`, with a routing preview.
pub(crate) fn estimate(spec: &JobSpec, known: &Known<'_>) -> Estimate {
    let mut est = Estimate {
        cost: Some(0),
        ..Default::default()
    };
    let token_cap = spec.budget.as_ref().and_then(|b| b.token_budget);
    for t in &spec.tasks {
        let n = attempts(t);
        match &t.kind {
            Some(Kind::Agent(_)) => {
                let routed = known.routes.get(&t.id).cloned().unwrap_or_default();
                // An agent that bills its own model calls can spend more
                // than its price: its worst case is unknown, so a person
                // (not a cost policy) approves.
                est.open_ended = true;
                let worst = if routed.candidates.iter().any(|c| c.bills_tokens) {
                    None
                } else {
                    routed
                        .candidates
                        .iter()
                        .map(|c| c.price_per_unit_micro_usd)
                        .max()
                };
                let tokens = agent_tokens(known.agent_max_tokens, token_cap).saturating_mul(n);
                est.output_tokens = est.output_tokens.saturating_add(tokens);
                est.cost = est
                    .cost
                    .zip(worst)
                    .map(|(c, p)| c.saturating_add(p.saturating_mul(n as i64)));
                let best = routed.candidates.first();
                est.routes.push(RoutePreview {
                    task_id: t.id.clone(),
                    agent_id: best.map(|b| b.agent_id.clone()).unwrap_or_default(),
                    score: best.map_or(0.0, |b| b.score),
                });
            }
            Some(Kind::Llm(l)) => estimate_llm(&mut est, l, n, token_cap, known),
            // Each message is one run of the loop: the estimate is every
            // message it may take, at the first one's size, within the
            // job's budget (the conversation's ceiling).
            Some(Kind::Conversation(c)) => {
                let l = c.orchestrator.clone().unwrap_or_default();
                let turns = u64::from(crate::conversation::max_messages(c));
                estimate_llm(&mut est, &l, n.saturating_mul(turns), token_cap, known);
            }
            // A pull worker spends only through the job's budget, and only
            // when the job declares one: then its token budget bounds the
            // tokens and its cost limit (if any) the money; unpriced
            // without one, so a person approves unless a policy takes it.
            Some(Kind::Queue(_)) => {
                if let Some(b) = &spec.budget
                    && (b.token_budget.is_some() || b.cost_limit.is_some())
                {
                    est.output_tokens = est
                        .output_tokens
                        .saturating_add(b.token_budget.unwrap_or(0));
                    est.cost = est
                        .cost
                        .zip(b.cost_limit.as_ref().map(|m| m.micro_usd))
                        .map(|(c, l)| c.saturating_add(l));
                }
            }
            _ => {}
        }
    }
    est
}

/// What cannot succeed as submitted, said before anything is proposed
/// (ValidateJob's warnings): an agent task whose capability no agent
/// offers now, an LLM task naming a model no provider serves, and a worst
/// case above the job's own budget (it would pause for an extension).
pub(crate) fn foreseen(spec: &JobSpec, est: &Estimate, llm: &switchyard_llm::Llm) -> Vec<String> {
    let mut out = Vec::new();
    for (i, t) in spec.tasks.iter().enumerate() {
        let at = format!("tasks[{i}] ({})", t.id);
        let chain: Vec<&String> = match &t.kind {
            Some(Kind::Agent(a)) => {
                let routed = est
                    .routes
                    .iter()
                    .any(|r| r.task_id == t.id && !r.agent_id.is_empty());
                if !routed {
                    out.push(format!(
                        "{at}: no agent offers capability {:?} right now: the task would wait (DEFER) or fail with CAPABILITY_UNAVAILABLE",
                        a.capability
                    ));
                }
                continue;
            }
            Some(Kind::Llm(l)) => std::iter::once(&l.model)
                .chain(&l.fallback_models)
                .collect(),
            Some(Kind::Conversation(c)) => c
                .orchestrator
                .as_ref()
                .map(|l| {
                    std::iter::once(&l.model)
                        .chain(&l.fallback_models)
                        .collect()
                })
                .unwrap_or_default(),
            _ => continue,
        };
        let hint = match &t.kind {
            Some(Kind::Llm(l)) => l.provider.as_str(),
            _ => "",
        };
        for m in chain.into_iter().filter(|m| llm.price(m, hint).is_none()) {
            out.push(format!(
                "{at}: no provider here serves model {m:?}: a call of it would fail with LLM_PROVIDER_NOT_CONFIGURED ([llm.providers] lists the models served)"
            ));
        }
    }
    let budget = spec.budget.clone().unwrap_or_default();
    let tokens = est.input_tokens.saturating_add(est.output_tokens);
    // Agent steps' tokens are what each may hold, not what it uses: only
    // an estimate that bounds the job's tokens says it would not fit.
    if let Some(limit) = budget.token_budget
        && !est.open_ended
        && tokens > limit
    {
        out.push(format!(
            "budget.token_budget: the worst case is {tokens} tokens, above the job's {limit}: the job would pause for an extension before it finishes"
        ));
    }
    if let (Some(limit), Some(cost)) = (budget.cost_limit.map(|m| m.micro_usd), est.cost)
        && cost > limit
    {
        out.push(format!(
            "budget.cost_limit: the worst case is {cost} micro-USD, above the job's {limit}: the job would pause for an extension before it finishes"
        ));
    }
    out
}

/// An LLM task's worst case: every turn of every attempt sends its first
/// prompt, estimated by the same bound the loop reserves before each call
/// ([`switchyard_llm::agent::prompt_bound`] over the same messages and
/// declared tools, with the providers' overheads), and spends its full
/// completion cap, within the token budget.
fn estimate_llm(
    est: &mut Estimate,
    l: &LlmTask,
    attempts: u64,
    cap: Option<u64>,
    known: &Known<'_>,
) {
    use switchyard_llm::agent::{first_turn, prompt_bound};
    // The tools as offered (none for tool_choice none), without what the
    // registry adds at run time.
    let registered = HashMap::new();
    let tools: Vec<switchyard_llm::ToolSpec> = l
        .tools
        .iter()
        .filter(|_| {
            switchyard_llm::ToolChoice::parse(&l.tool_choice)
                != Some(switchyard_llm::ToolChoice::None)
        })
        .map(|t| crate::attempt::llm::declared_tool(t, &registered).0)
        .collect();
    let mut chain = vec![l.model.clone()];
    chain.extend(l.fallback_models.iter().cloned());
    let messages = first_turn(&l.instructions, &l.prompt);
    let input = prompt_bound(known.llm, &chain, &l.provider, &messages, &tools);
    let output = l.max_tokens.unwrap_or(known.llm_default_max_tokens);
    let turns = u64::from(if l.max_turns == 0 {
        known.llm_max_turns
    } else {
        l.max_turns
    });
    let times = turns.saturating_mul(attempts);
    let (mut i, mut o) = (input.saturating_mul(times), output.saturating_mul(times));
    if let Some(cap) = l.token_budget.or(cap)
        && i.saturating_add(o) > cap
    {
        // `o / (i + o)` of the cap, in u128: the sum cannot overflow there.
        let share = u128::from(cap) * u128::from(o) / (u128::from(i) + u128::from(o));
        o = u64::try_from(share).unwrap_or(cap);
        i = cap - o;
    }
    est.input_tokens = est.input_tokens.saturating_add(i);
    est.output_tokens = est.output_tokens.saturating_add(o);
    let price = known.llm.chain_price(&chain, &l.provider);
    // Agents called as tools and delegated jobs spend inside the job's
    // budget too, by amounts not known now: a person approves.
    let open_ended = !l.agents.is_empty()
        || l.tools
            .iter()
            .any(|t| t.name == switchyard_agent_sdk::delegation::TOOL && t.command.is_empty());
    let usage = switchyard_llm::Usage {
        prompt_tokens: i,
        completion_tokens: o,
        total_tokens: i.saturating_add(o),
    };
    est.open_ended |= open_ended;
    est.cost = match (est.cost, price) {
        (Some(c), Some(p)) if !open_ended => Some(c.saturating_add(p.cost(&usage))),
        _ => None,
    };
}

/// The approval run proposed for `spec` (seed 004's AgentRunSpec).
pub(crate) fn proposal(
    spec: &JobSpec,
    est: &Estimate,
    hash: &str,
    submitted_by: &str,
    default_org: &str,
) -> ap::Run {
    let first_llm = spec
        .tasks
        .iter()
        .find_map(|t| crate::spec::model_task(t.kind.as_ref()));
    let approval = spec.approval.clone().unwrap_or_default();
    let mut tools: Vec<String> = approval.tools_allowed.clone();
    if tools.is_empty() {
        tools = spec
            .tasks
            .iter()
            .filter_map(|t| crate::spec::model_task(t.kind.as_ref()))
            .flat_map(|l| l.tools.iter().map(|t| t.name.clone()))
            .collect();
    }
    if tools.is_empty() {
        tools.push("none".into());
    }
    let outputs = if approval.outputs_allowed.is_empty() {
        vec!["job_result".into()]
    } else {
        approval.outputs_allowed.clone()
    };
    let intent: String = [approval.intent.as_str(), spec.plan_description.as_str()]
        .into_iter()
        .find(|s| !s.trim().is_empty())
        .map_or_else(
            || format!("run job of plan {}", spec.plan_id),
            str::to_owned,
        )
        .chars()
        .take(400)
        .collect();
    let label = |k: &str| spec.labels.get(k).cloned();
    ap::Run {
        schema_version: "agent_run_spec/v1".into(),
        run_id: round_ids(&spec.job_id, 0).0,
        created_by: submitted_by.to_owned(),
        target: Some(ap::Target {
            org: label("org").unwrap_or_else(|| default_org.to_owned()),
            repo: label("repo").unwrap_or_default(),
            work_item_ids: vec![spec.job_id.clone()],
        }),
        intent,
        context_pack: Some(ap::ContextPack {
            pack_id: spec.job_id.clone(),
            hash: hash.to_owned(),
            version: "jobspec/v1".into(),
            inputs: spec.tasks.iter().map(|t| t.id.clone()).collect(),
        }),
        model: first_llm.map_or_else(|| "none".into(), |l| l.model.clone()),
        // Seed 004 requires a positive cap; jobs that spend no tokens say 1.
        max_tokens: est.input_tokens.saturating_add(est.output_tokens).max(1),
        temperature: first_llm.and_then(|l| l.temperature),
        cost_estimate: Some(ap::CostEstimate {
            estimated_input_tokens: est.input_tokens,
            estimated_output_tokens: est.output_tokens,
            estimated_cost: est.cost.map(|micro_usd| Money { micro_usd }),
        }),
        tools_allowed: tools,
        outputs_allowed: outputs,
        job_id: spec.job_id.clone(),
        correlation_id: spec.correlation_id.clone(),
        labels: spec.labels.clone(),
        ..Default::default()
    }
}

/// What a job budget with `b`'s limits has left before it spends: its
/// limits (`known` when it has any).
pub(crate) fn remaining_of(b: &JobBudget) -> switchyard_policy::Remaining {
    switchyard_policy::Remaining::left(b.token_budget, b.cost_limit.map(|m| m.micro_usd))
}

/// `left` as a proposal carries it to the approval service's policies
/// (`ProposeRequest.budget_left`): unset when unknown.
pub(crate) fn budget_left(left: switchyard_policy::Remaining) -> Option<ap::BudgetLeft> {
    left.known.then(|| {
        let (tokens, cost) = left.amounts();
        ap::BudgetLeft {
            tokens,
            cost: cost.map(|micro_usd| Money { micro_usd }),
        }
    })
}

/// The facts of submitting `spec` for `submitter`, as the policies see
/// them: the job (its labels), its plan (capabilities and models), its
/// estimate, and whether it is a delegated child.
pub(crate) fn submission_facts(
    spec: &JobSpec,
    submitter: &OnBehalf,
    est: &Estimate,
    now_ms: u64,
) -> switchyard_policy::Facts {
    use switchyard_policy::{Action, Facts};
    let mut plan: Vec<String> = spec
        .tasks
        .iter()
        .filter_map(|t| match &t.kind {
            Some(Kind::Agent(a)) => Some(a.capability.clone()),
            k => crate::spec::model_task(k.as_ref()).map(|l| l.model.clone()),
        })
        .collect();
    plan.sort();
    plan.dedup();
    let delegated = spec
        .delegation
        .as_ref()
        .is_some_and(|d| !d.parent_job_id.is_empty());
    Facts {
        principal: switchyard_policy::Principal::of(
            submitter.kind.as_str(),
            &submitter.subject,
            &submitter.tenant,
        ),
        action: Action::SubmitJob,
        resource: spec.job_id.clone(),
        job: switchyard_policy::JobFacts {
            id: spec.job_id.clone(),
            tenant: submitter.tenant.clone(),
            submitter: submitter.subject.clone(),
            labels: spec
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        },
        model: spec
            .tasks
            .iter()
            .find_map(|t| crate::spec::model_task(t.kind.as_ref()))
            .map(|l| l.model.clone())
            .unwrap_or_default(),
        estimate: switchyard_policy::Estimate {
            priced: est.cost.is_some(),
            tokens: est.input_tokens.saturating_add(est.output_tokens),
            micro_usd: est.cost.unwrap_or(0),
        },
        plan,
        depth: u32::from(delegated),
        now_ms,
        ..Default::default()
    }
}

/// The approval run and budget ids of a job's round: `run-{id}` and
/// `job-{id}` for the first, suffixed `-r{round}` for each retry from the
/// dead letter (a finished round's run and budget are closed for good).
pub(crate) fn round_ids(job_id: &str, round: u32) -> (String, String) {
    let suffix = if round == 0 {
        String::new()
    } else {
        format!("-r{round}")
    };
    (
        format!("run-{job_id}{suffix}"),
        format!("job-{job_id}{suffix}"),
    )
}

/// Whether a job starts programs: command tasks, or LLM tasks offering a
/// command tool.
fn runs_commands(spec: &JobSpec) -> bool {
    spec.tasks.iter().any(|t| match &t.kind {
        Some(Kind::Command(_)) => true,
        kind => crate::spec::model_task(kind.as_ref())
            .is_some_and(|l| l.tools.iter().any(|tool| !tool.command.is_empty())),
    })
}

/// Where an approved job goes: scheduled (not due yet) or available.
pub(crate) fn after_approval(spec: &JobSpec, now: u64) -> JobState {
    let due = spec
        .scheduled_at
        .as_ref()
        .is_none_or(|t| switchyard_kit::time::timestamp_ms(t) <= now);
    if due {
        JobState::Available
    } else {
        JobState::Scheduled
    }
}

/// Who approved an accepted proposal, if it is approved already.
fn approved_by(out: &ap::ProposeResponse) -> Option<String> {
    let run = out.run.as_ref()?;
    let approved = matches!(
        ap::RunStatus::try_from(run.status),
        Ok(ap::RunStatus::Approved | ap::RunStatus::Running)
    );
    if out.auto_approved_by.starts_with("delegation:") {
        Some(out.auto_approved_by.clone())
    } else if !out.auto_approved_by.is_empty() {
        Some(format!("policy:{}", out.auto_approved_by))
    } else {
        approved.then(|| "approval".to_owned())
    }
}

/// A router request for an agent task.
pub(crate) fn route_request(a: &AgentTask, limit: u32) -> RouteRequest {
    RouteRequest {
        capability: a.capability.clone(),
        constraints: Some(RouteConstraints {
            min_trust: a.min_trust,
            max_cost_micro_usd: a.max_cost_micro_usd,
            exclude_agents: a.exclude_agents.clone(),
            prefer_labels: Default::default(),
        }),
        limit,
    }
}

/// A request context in which this process's calls act for `user`, keeping
/// the current trace context.
pub(crate) fn acting_context(
    correlation_id: &str,
    user: OnBehalf,
) -> switchyard_kit::context::RequestContext {
    let current = switchyard_kit::context::current();
    switchyard_kit::context::RequestContext {
        correlation_id: correlation_id.to_owned(),
        traceparent: current.and_then(|c| c.traceparent),
        principal: Some(std::sync::Arc::new(
            Principal::in_process().acting_for(user),
        )),
    }
}

/// The user a request acts for: the authenticated principal's acting
/// subject and tenant (none for a service acting for no one).
pub(crate) fn submitter(p: &Principal) -> Option<OnBehalf> {
    let tenant = p.tenant_scope()?;
    Some(match &p.on_behalf_of {
        Some(o) => o.clone(),
        None => OnBehalf {
            subject: p.subject.clone(),
            tenant: tenant.to_owned(),
            kind: p.kind,
        },
    })
}

/// How a submission is made.
pub(crate) struct Submission {
    /// The user it is for (none: a service delegating for the parent's).
    pub(crate) who: Option<OnBehalf>,
    /// Only a child of an active job is accepted (an agent without the
    /// submitter role), so it spends within the parent's approved budget.
    pub(crate) delegation_only: bool,
    /// The verified invocation grant an agent presented: its job is the
    /// only parent the child may name, and the child is then the parent's
    /// submitter's.
    pub(crate) grant: Option<switchyard_kit::auth::grant::Grant>,
    /// What the caller may nest its job's budget under: any budget of its
    /// tenant (it manages budgets), or those shared with it.
    pub(crate) budgets: BudgetRight,
    /// The request's correlation id, used when the spec has none.
    pub(crate) correlation_id: String,
    /// The trace context the job's work joins.
    pub(crate) traceparent: Option<String>,
    /// Set when the job runs another again (RerunJob).
    pub(crate) rerun: Option<Rerun>,
    /// Set when a schedule's tick starts the job.
    pub(crate) fired: Option<Fired>,
}

/// What started a job that no one submitted by hand.
#[derive(Debug, Clone)]
pub(crate) enum Fired {
    /// A schedule's tick (ms).
    Tick { schedule_id: String, tick_ms: u64 },
    /// An event delivered to a trigger.
    Event {
        trigger_id: String,
        event_id: String,
    },
}

/// Which round of a job is admitted (0 first, then one per dead-letter
/// retry), and the tasks it keeps from the job it resumes: those are
/// neither routed nor priced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round<'a> {
    pub(crate) number: u32,
    pub(crate) kept: &'a [String],
}

/// Where a submitted job comes from, when not from a plain submission.
#[derive(Debug, Clone, Copy)]
struct Origin<'a> {
    rerun: Option<&'a Rerun>,
    fired: Option<&'a Fired>,
}

/// A job that runs another again (RerunJob).
#[derive(Debug, Clone, Default)]
pub(crate) struct Rerun {
    /// The job it runs again.
    pub(crate) of: String,
    /// Resume: the tasks kept from it, with their outputs.
    pub(crate) kept: Vec<TaskStatus>,
}

impl Executor {
    /// Converts and checks a request's job; returns the normalized spec,
    /// its DAG and warnings. Every problem is reported at once (fields that
    /// do not fit and the rules the rest breaks), each with its line and
    /// column in the document.
    pub(crate) fn accept(
        &self,
        spec: Option<JobSpec>,
        document: &str,
        format: &str,
        files: std::collections::BTreeMap<String, Vec<u8>>,
    ) -> Result<(JobSpec, switchyard_core::dag::Dag, Vec<String>), ExecutorError> {
        self.check(spec, document, format, files).map_err(|mut e| {
            if let ExecutorError::Invalid(f) = &mut e
                && !document.trim().is_empty()
            {
                f.positions = crate::locate::Positions::of(document).of_fields(&f.violations);
            }
            e
        })
    }

    fn check(
        &self,
        spec: Option<JobSpec>,
        document: &str,
        format: &str,
        files: std::collections::BTreeMap<String, Vec<u8>>,
    ) -> Result<(JobSpec, switchyard_core::dag::Dag, Vec<String>), ExecutorError> {
        let cfg = &self.inner.cfg;
        let (mut spec, found, warnings) = match spec {
            Some(mut s) => {
                s.source_format = formats::NATIVE.into();
                (s, Violations::new(), Vec::new())
            }
            None if !document.trim().is_empty() => {
                let p = formats::parse_document(document, format, cfg.limits())
                    .map_err(ExecutorError::Invalid)?;
                (p.spec, p.found, p.warnings)
            }
            None => {
                return Err(ExecutorError::Invalid(FormatError::one(
                    Reason::InvalidArgument,
                    "spec",
                    "a job is required: send spec or document",
                )));
            }
        };
        spec.files.extend(files);
        let rules = cfg.rules();
        spec::normalize(&mut spec, &rules);
        let dag = match (spec::validate(&spec, &rules), found.is_empty()) {
            (Ok(dag), true) => dag,
            (Ok(_), false) => {
                return Err(ExecutorError::Invalid(FormatError::new(
                    Reason::InvalidArgument,
                    found,
                )));
            }
            (Err(mut e), _) => {
                // Named as the submitter wrote them (AITP's fields for an
                // AITP document), the reading problems first.
                for v in &mut e.violations.0 {
                    v.field = formats::source_field(&spec.source_format, &v.field);
                }
                return Err(ExecutorError::Invalid(e.after(found)));
            }
        };
        if let Some(why) = self.inner.sandbox.unavailable()
            && runs_commands(&spec)
        {
            return Err(ExecutorError::Sandbox(why));
        }
        Ok((spec, dag, warnings))
    }

    /// Gathers what the estimate needs (each agent task's candidates), then
    /// estimates.
    async fn estimate(
        &self,
        spec: &JobSpec,
        kept: &[String],
        waiter: &Waiter<'_>,
    ) -> Result<Estimate, ExecutorError> {
        // A resume's kept tasks will not run: they are neither routed nor
        // priced.
        let remaining;
        let spec = if kept.is_empty() {
            spec
        } else {
            let mut s = spec.clone();
            s.tasks.retain(|t| !kept.contains(&t.id));
            remaining = s;
            &remaining
        };
        let mut routes = HashMap::new();
        for t in &spec.tasks {
            if let Some(Kind::Agent(a)) = &t.kind {
                let routed = waiter
                    .call(Service::Router, || self.route(a))
                    .await
                    .map_err(upstream("router"))?;
                routes.insert(t.id.clone(), routed);
            }
        }
        let cfg = &self.inner.cfg;
        Ok(estimate(
            spec,
            &Known {
                routes: &routes,
                llm: &self.inner.clients.llm,
                agent_max_tokens: cfg.agent_max_tokens,
                llm_default_max_tokens: cfg.llm_default_max_tokens,
                llm_max_turns: cfg.llm_max_turns,
            },
        ))
    }

    /// Candidates for an agent task; none (rather than an error) when no
    /// agent offers the capability right now.
    pub(crate) async fn route(&self, a: &AgentTask) -> Result<RouteResponse, Status> {
        match self.inner.clients.router.route(route_request(a, 5)).await {
            Err(e)
                if switchyard_kit::error::ApiError::from(e.clone()).known_reason()
                    == Some(Reason::CapabilityUnavailable) =>
            {
                Ok(Default::default())
            }
            r => r,
        }
    }

    /// What the policies decide about `spec` submitted by `who`: its
    /// submission and its approval run's spend (the run as it would be
    /// proposed).
    fn dry_run(
        &self,
        spec: &JobSpec,
        est: &Estimate,
        who: &OnBehalf,
        remaining: switchyard_policy::Remaining,
        now: u64,
    ) -> Vec<PolicyDecision> {
        let check = |f: &switchyard_policy::Facts| switchyard_policy::record(&self.decide(f), f);
        let mut submit = submission_facts(spec, who, est, now);
        submit.remaining = remaining;
        let mut out = vec![check(&submit)];
        let mut run = proposal(spec, est, "", &who.subject, &self.inner.cfg.default_org);
        run.tenant.clone_from(&who.tenant);
        let kind = switchyard_policy::PrincipalKind::from_kind(who.kind.as_str());
        let delegated = submit.depth > 0;
        let mut spend = switchyard_policy::run_facts(&run, kind, delegated, submit.depth, now);
        spend.remaining = remaining;
        out.push(check(&spend));
        out
    }

    /// ValidateJob: everything SubmitJob checks and estimates; creates
    /// nothing. With `submitter` (who may draw on budgets as `right` says),
    /// the policies' decisions too (a dry run) and what the budget the job
    /// names has left.
    pub(crate) async fn validate_job(
        &self,
        req: ValidateJobRequest,
        submitter: Option<OnBehalf>,
        right: BudgetRight,
    ) -> Result<ValidateJobResponse, ExecutorError> {
        let (spec, dag, mut warnings) =
            self.accept(req.spec, &req.document, &req.format, Default::default())?;
        let now = self.inner.book.now();
        let waiter = self
            .waiter("", "")
            .until(Some(now + self.inner.cfg.submit_wait_ms));
        let est = self.estimate(&spec, &[], &waiter).await?;
        warnings.extend(foreseen(&spec, &est, &self.inner.clients.llm));
        let policies = match submitter {
            Some(who) => {
                let (more, above) = self.parent_warnings(&spec, &est, &who, &right).await;
                warnings.extend(more);
                let own = remaining_of(&spec.budget.clone().unwrap_or_default());
                self.dry_run(&spec, &est, &who, own.min(above), now)
            }
            None => Vec::new(),
        };
        Ok(ValidateJobResponse {
            order: dag
                .order()
                .iter()
                .map(|&i| spec.tasks[i].id.clone())
                .collect(),
            estimated_cost: est.cost.map(|micro_usd| Money { micro_usd }),
            estimated_tokens: est.input_tokens.saturating_add(est.output_tokens),
            routes: est.routes,
            context_hash: spec::context_hash(&spec),
            source_format: spec.source_format.clone(),
            spec: Some(spec),
            warnings,
            policies,
        })
    }

    /// SubmitJob for a user (the CLI, a job's `delegate` tool).
    pub async fn submit(
        &self,
        req: SubmitJobRequest,
        who: Option<OnBehalf>,
        correlation_id: String,
        traceparent: Option<String>,
    ) -> Result<SubmitJobResponse, ExecutorError> {
        let how = Submission {
            who,
            delegation_only: false,
            grant: None,
            budgets: BudgetRight::Shared(Vec::new()),
            correlation_id,
            traceparent,
            rerun: None,
            fired: None,
        };
        self.submit_as(req, how).await
    }

    /// SubmitJob: accept, claim the id (or answer for the job that has it),
    /// admit (budget and approval run), record, and start if approved.
    pub(crate) async fn submit_as(
        &self,
        req: SubmitJobRequest,
        how: Submission,
    ) -> Result<SubmitJobResponse, ExecutorError> {
        let (mut spec, dag, _warnings) =
            self.accept(req.spec, &req.document, &req.format, req.files)?;
        let delegated = spec
            .delegation
            .as_ref()
            .is_some_and(|d| !d.parent_job_id.is_empty());
        if how.delegation_only && !delegated {
            return Err(ExecutorError::DelegationOnly);
        }
        // Stopping: no job is taken on (a job accepted now would hold a
        // lease its hand-back may no longer release, and wait one out on
        // another replica). A child of a job still running here is, so
        // its parent's attempt can finish within the grace.
        if self.draining() && !delegated {
            return Err(ExecutorError::Draining);
        }
        if spec.correlation_id.is_empty() {
            spec.correlation_id = how.correlation_id;
        }
        // An id made here is new everywhere; only a client's is looked up
        // among the jobs other replicas hold.
        let client_id = !spec.job_id.is_empty();
        if !client_id {
            spec.job_id = uuid::Uuid::now_v7().to_string();
        }
        let named_budget = spec
            .budget
            .as_ref()
            .map(|b| b.parent_budget_id.clone())
            .unwrap_or_default();
        let parent = self.adopt(&mut spec).await?;
        let submitter = match (&how.grant, how.who) {
            (None, who) => for_whom(who, parent.as_ref(), &spec)?,
            // The agent the parent's running task invoked submits the child
            // as itself (it reads its child's result), inside the parent's
            // approval and budget.
            (Some(g), Some(agent)) if parent.is_some() && parent_id(&spec) == g.job_id => agent,
            (Some(g), _) => {
                return Err(ExecutorError::Grant(GrantError::Outside(format!(
                    "it was issued for job {:?}; a child job names that job as delegation.parent_job_id",
                    g.job_id
                ))));
            }
        };
        if parent.is_none() && !named_budget.is_empty() {
            // Read as the service acting for the submitter: the budget's
            // tenant and labels, whatever the submitter may read itself.
            let ctx = acting_context(&spec.correlation_id, submitter.clone());
            let check = self.may_nest_under(&named_budget, &submitter, &how.budgets);
            switchyard_kit::context::scope(ctx, check).await?;
        }
        let hash = spec::context_hash(&spec);
        let now = self.inner.book.now();
        if client_id
            && let Some(existing) = self
                .stored_elsewhere(&spec.job_id, &hash, &submitter)
                .await?
        {
            return Ok(existing);
        }
        if let Some(existing) = self.claim_id(&spec, dag, &hash, &submitter, now)? {
            return Ok(existing);
        }
        // The budget and the run are made for the submitter, whatever context
        // the caller runs in (a gRPC request, a job driver, an LLM tool).
        let ctx = acting_context(&spec.correlation_id, submitter.clone());
        let until = now + self.inner.cfg.submit_wait_ms;
        let kept: Vec<String> = how
            .rerun
            .as_ref()
            .map(|r| r.kept.iter().map(|t| t.task_id.clone()).collect())
            .unwrap_or_default();
        let first = Round {
            number: 0,
            kept: &kept,
        };
        let admitted = self.admit(&spec, &hash, &submitter, parent.as_ref(), until, first);
        let traceparent = how.traceparent.unwrap_or_default();
        let origin = Origin {
            rerun: how.rerun.as_ref(),
            fired: how.fired.as_ref(),
        };
        let admitted = switchyard_kit::context::scope(ctx, admitted).await;
        let (g, start) = match admitted {
            Ok(a) => {
                let mut st = self.inner.book.lock();
                self.record_submitted(&mut st, &spec, &submitter, traceparent, origin)?;
                self.record_admitted(&mut st, &spec, a, now)?
            }
            // A service it needs is down: the job is accepted and waits in
            // `pending`; the approval poller admits it once they are back.
            Err(e) if e.outage().is_some() => {
                let (service, error) = e.outage().unwrap_or_default();
                tracing::warn!(job_id = %spec.job_id, service, error, "job accepted to wait for a service");
                let mut st = self.inner.book.lock();
                self.record_submitted(&mut st, &spec, &submitter, traceparent, origin)?;
                let waiting = events::DependencyWaiting {
                    service: service.to_owned(),
                    error,
                };
                let ev = JobEvent::DependencyWaiting(waiting);
                (self.inner.book.record(&mut st, &spec.job_id, "", ev), false)
            }
            Err(e) => {
                self.inner.book.lock().unclaim(&spec.job_id);
                return Err(e);
            }
        };
        // The driver starts while the job's first events are flushed: its
        // claim on the approval run (for a run the proposal made, so nothing
        // a crash here could leave behind that the proposal did not) shares
        // or overlaps this flush, and every task waits for it before it
        // touches anything outside the job.
        if start {
            self.spawn_driver(&spec.job_id);
        }
        self.inner.book.durable(g).await?;
        if self.inner.book.elsewhere(&spec.job_id)
            && self.inner.book.cluster.holds(&spec.job_id).is_none()
        {
            // Another member stored a job with this id first (a race of
            // two submissions): answer as for a repeated submission.
            return match self
                .stored_elsewhere(&spec.job_id, &hash, &submitter)
                .await?
            {
                Some(existing) => Ok(existing),
                None => Err(ExecutorError::Exists(spec.job_id.clone())),
            };
        }
        if start
            && crate::queue::queue_job(&spec)
            && self.inner.book.lock().find(&spec.job_id).is_some()
        {
            // Run here: answered "available" only once a worker's fetch can
            // take it (where jobs are shared, a job of queue tasks waits,
            // unowned, for the member a worker fetches from).
            let roots: Vec<String> = spec
                .tasks
                .iter()
                .filter(|t| t.depends_on.is_empty())
                .map(|t| t.id.clone())
                .collect();
            self.inner
                .board
                .wait_offered(&spec.job_id, &roots, std::time::Duration::from_secs(2))
                .await;
        }
        let job = self.inner.book.job(&spec.job_id).await?;
        let state = switchyard_proto::executor::v1::JobState::try_from(job.state)
            .map_or("unknown", |s| s.as_str_name());
        tracing::info!(job_id = %spec.job_id, state, "job submitted");
        Ok(SubmitJobResponse {
            job: Some(job),
            created: true,
            result: None,
        })
    }

    /// For a job id stored but not in memory here (finished, or held by
    /// another member): the answer for a retried submission of the same
    /// job, else JOB_ALREADY_EXISTS; `None` when no job has the id.
    async fn stored_elsewhere(
        &self,
        job_id: &str,
        hash: &str,
        submitter: &OnBehalf,
    ) -> Result<Option<SubmitJobResponse>, ExecutorError> {
        let book = &self.inner.book;
        if book.lock().find(job_id).is_some() {
            // Answered from memory by `claim_id`.
            return Ok(None);
        }
        let Some((h, tenant)) = book.store.identity(job_id).await? else {
            return Ok(None);
        };
        if h == hash && tenant == submitter.tenant {
            Ok(Some(SubmitJobResponse {
                job: Some(book.job(job_id).await?),
                created: false,
                result: None,
            }))
        } else {
            Err(ExecutorError::Exists(job_id.to_owned()))
        }
    }

    /// Claims the job id; when a job in memory has it already, the answer
    /// for a retried submission of the same job, else JOB_ALREADY_EXISTS
    /// (a stored one is found by `stored_elsewhere` first: only a client
    /// names an id that may exist).
    fn claim_id(
        &self,
        spec: &JobSpec,
        dag: switchyard_core::dag::Dag,
        hash: &str,
        submitter: &OnBehalf,
        now: u64,
    ) -> Result<Option<SubmitJobResponse>, ExecutorError> {
        let mut st = self.inner.book.lock();
        if let Some(existing) = st.find(&spec.job_id) {
            return if existing.context_hash == hash && existing.job.tenant == submitter.tenant {
                Ok(Some(SubmitJobResponse {
                    job: Some(existing.job.clone()),
                    created: false,
                    result: None,
                }))
            } else {
                Err(ExecutorError::Exists(spec.job_id.clone()))
            };
        }
        let mut entry = JobEntry::new(spec.clone(), dag, now);
        entry.context_hash = hash.to_owned();
        entry.job.tenant.clone_from(&submitter.tenant);
        entry.job.submitted_by.clone_from(&submitter.subject);
        entry.submitter_kind = submitter.kind.as_str().to_owned();
        st.claim(entry);
        Ok(None)
    }

    /// Stores an accepted job and records its submission.
    fn record_submitted(
        &self,
        st: &mut Jobs,
        spec: &JobSpec,
        submitter: &OnBehalf,
        traceparent: String,
        origin: Origin<'_>,
    ) -> Result<u64, ExecutorError> {
        let book = &self.inner.book;
        let Origin { rerun, fired } = origin;
        book.accept(st, &spec.job_id)?;
        let submitted = events::Submitted {
            format: spec.source_format.clone(),
            tasks: spec.tasks.len() as u64,
            submitted_by: submitter.subject.clone(),
            tenant: submitter.tenant.clone(),
            submitter_kind: submitter.kind.as_str().to_owned(),
            traceparent,
            rerun_of: rerun.map(|r| r.of.clone()).unwrap_or_default(),
            reused: rerun
                .map(|r| r.kept.iter().map(|t| t.task_id.clone()).collect())
                .unwrap_or_default(),
            ..Default::default()
        };
        let submitted = match fired {
            Some(Fired::Tick {
                schedule_id,
                tick_ms,
            }) => events::Submitted {
                schedule_id: schedule_id.clone(),
                schedule_tick_ms: *tick_ms,
                ..submitted
            },
            Some(Fired::Event {
                trigger_id,
                event_id,
            }) => events::Submitted {
                trigger_id: trigger_id.clone(),
                event_id: event_id.clone(),
                ..submitted
            },
            None => submitted,
        };
        let mut g = book.record(st, &spec.job_id, "", JobEvent::Submitted(submitted));
        // A resume's kept outputs are the new job's from its first events:
        // nothing later needs the job it resumes.
        for kept in rerun.map_or(&[][..], |r| &r.kept) {
            g = book.keep_result(st, &spec.job_id, kept);
        }
        Ok(g)
    }

    /// Records a job's budget and approval run; returns the last event and
    /// whether it may start now.
    fn record_admitted(
        &self,
        st: &mut Jobs,
        spec: &JobSpec,
        a: Admitted,
        now: u64,
    ) -> Result<(u64, bool), ExecutorError> {
        let book = &self.inner.book;
        let job_id = spec.job_id.as_str();
        let budget = events::BudgetCreated {
            budget_id: a.budget_id,
            parent_id: self.parent_budget(spec),
        };
        book.record(st, job_id, "", JobEvent::BudgetCreated(budget));
        for decided in a.decided {
            book.record(st, job_id, "", JobEvent::PolicyDecided(Box::new(decided)));
        }
        let est = a.run.cost_estimate.unwrap_or_default();
        let requested = events::ApprovalRequested {
            run_id: a.run.run_id.clone(),
            context_hash: a.hash,
            estimated_input_tokens: est.estimated_input_tokens,
            estimated_output_tokens: est.estimated_output_tokens,
            estimated_cost_micro_usd: est.estimated_cost.map(|m| m.micro_usd),
            max_tokens: a.run.max_tokens,
            skip_policies: spec.approval.as_ref().is_some_and(|a| a.requires_approval),
        };
        let g = book.record(st, job_id, "", JobEvent::ApprovalRequested(requested));
        let claimed = a.run.status == ap::RunStatus::Running as i32
            && a.run.claimed_by == self.inner.cfg.worker_id;
        if claimed && let Some(e) = st.find_mut(job_id) {
            e.run_claimed = true;
        }
        match a.auto {
            Some(by) => self.approved(st, job_id, &by, now),
            None => {
                // Waiting for a person: the webhooks that want it hear so.
                if a.run.status == ap::RunStatus::Proposed as i32
                    && let Some(e) = st.find(job_id)
                {
                    let estimate = est.estimated_cost.map(|m| m.micro_usd);
                    book.notifier
                        .approval_needed(e, &a.run.run_id, estimate, now);
                }
                Ok((g, false))
            }
        }
    }

    /// Admits a job that was accepted while a service it needs was down, or
    /// a dead-lettered job retried: one try; still down, it goes on waiting
    /// (and `Ok(false)` tells the poller to leave the others for the next
    /// round).
    pub(crate) async fn readmit(&self, job_id: &str, now: u64) -> Result<bool, ExecutorError> {
        let book = &self.inner.book;
        let (spec, hash, submitter, parent_id, round, waited, kept) = {
            let st = book.lock();
            let e = st.get(job_id)?;
            let round = e.job.round;
            let waited = e.job.reason == Reason::DependencyUnavailable.as_str();
            let parent_id = e
                .spec()
                .delegation
                .as_ref()
                .map(|d| d.parent_job_id.clone())
                .unwrap_or_default();
            // A job another replica accepted and this one took over has no
            // hash in memory (it is not in the job's records): the spec's
            // own, as at submission, rather than an empty one the approval
            // service refuses.
            let hash = if e.context_hash.is_empty() {
                spec::context_hash(e.spec())
            } else {
                e.context_hash.clone()
            };
            (
                e.spec().clone(),
                hash,
                e.submitter(),
                parent_id,
                round,
                waited,
                e.reused.clone(),
            )
        };
        let parent = if parent_id.is_empty() {
            None
        } else {
            let st = book.lock();
            match st.find(&parent_id) {
                Some(p) if p.state() == JobState::Active => Some(Parent::of(p)),
                _ => None,
            }
        };
        let admitted = if !parent_id.is_empty() && parent.is_none() {
            Err(ExecutorError::ParentNotActive {
                parent: parent_id,
                state: "finished".into(),
            })
        } else {
            let ctx = acting_context(&spec.correlation_id, submitter.clone());
            let this = Round {
                number: round,
                kept: &kept,
            };
            let admit = self.admit(&spec, &hash, &submitter, parent.as_ref(), now, this);
            switchyard_kit::context::scope(ctx, admit).await
        };
        let (g, start) = {
            let mut st = book.lock();
            if st
                .find(job_id)
                .is_none_or(|e| e.state() != JobState::Pending)
            {
                // Cancelled meanwhile.
                return Ok(true);
            }
            match admitted {
                Ok(a) => {
                    if waited {
                        let waited_ms = now.saturating_sub(
                            st.get(job_id)?
                                .job
                                .created_at
                                .as_ref()
                                .map_or(now, switchyard_kit::time::timestamp_ms),
                        );
                        let recovered = events::DependencyRecovered {
                            service: String::new(),
                            waited_ms,
                        };
                        let ev = JobEvent::DependencyRecovered(recovered);
                        book.record(&mut st, job_id, "", ev);
                    }
                    self.record_admitted(&mut st, &spec, a, now)?
                }
                Err(e) if e.outage().is_some() => return Ok(false),
                Err(e) => {
                    let why = format!("the job could not be admitted: {e}");
                    tracing::warn!(job_id, error = %e, "admitting a waiting job failed");
                    let reason = e.into_reason();
                    (
                        crate::cancel::cancel_idle(book, &mut st, job_id, reason, &why)?,
                        false,
                    )
                }
            }
        };
        book.durable(g).await?;
        if start {
            self.spawn_driver(job_id);
        }
        Ok(true)
    }

    /// Delegation (seed 000 §2.3): a job naming a parent is accepted only
    /// while the parent is active and below its maximum depth; it gets the
    /// parent's depth + 1, and its budget nests under the parent's.
    async fn adopt(&self, spec: &mut JobSpec) -> Result<Option<Parent>, ExecutorError> {
        let Some(d) = spec
            .delegation
            .as_mut()
            .filter(|d| !d.parent_job_id.is_empty())
        else {
            return Ok(None);
        };
        let book = &self.inner.book;
        if book.lock().find(&d.parent_job_id).is_none() {
            // Finished parents are stored only (and a child runs under its
            // parent's run and budget, so only where the parent runs).
            return Err(match book.read(&d.parent_job_id, |e| e.state()).await {
                Ok(state) => ExecutorError::ParentNotActive {
                    parent: d.parent_job_id.clone(),
                    state: state.as_str().to_owned(),
                },
                Err(_) => ExecutorError::Invalid(FormatError::one(
                    Reason::JobNotFound,
                    "delegation.parent_job_id",
                    format!("parent job {:?} does not exist", d.parent_job_id),
                )),
            });
        }
        let st = book.lock();
        let p = st.get(&d.parent_job_id)?;
        if p.state() != JobState::Active {
            return Err(ExecutorError::ParentNotActive {
                parent: d.parent_job_id.clone(),
                state: p.state().as_str().to_owned(),
            });
        }
        let pd = p.spec().delegation.clone().unwrap_or_default();
        let cap = self.inner.cfg.max_delegation_depth;
        let max = if pd.max_depth == 0 {
            cap
        } else {
            pd.max_depth.min(cap)
        };
        let depth = pd.depth + 1;
        // Seed 000: refused only when the child's depth exceeds the maximum.
        if depth > max {
            return Err(ExecutorError::Invalid(FormatError::one(
                Reason::AgentMaxDelegationDepth,
                "delegation.depth",
                format!(
                    "delegation depth {depth} exceeds the maximum of {max}: job {:?} may not delegate further",
                    d.parent_job_id
                ),
            )));
        }
        d.depth = depth;
        d.max_depth = max;
        // The chain's time to live: never past the parent's deadline, and
        // the first delegation starts the clock.
        let now = book.now();
        let ms = |t: &prost_types::Timestamp| switchyard_kit::time::timestamp_ms(t);
        let ttl = self.inner.cfg.delegation_ttl_secs;
        let chain_end = [
            p.spec().deadline.as_ref().map(ms),
            (ttl > 0).then(|| now.saturating_add(ttl.saturating_mul(1000))),
        ]
        .into_iter()
        .flatten()
        .min();
        if let Some(end) = chain_end {
            if end <= now {
                return Err(ExecutorError::Invalid(FormatError::one(
                    Reason::DeadlineExceeded,
                    "deadline",
                    format!(
                        "job {:?} may not delegate: its delegation chain's time ran out {} ms ago (its deadline, or [executor] delegation_ttl_secs after the chain's first delegation)",
                        d.parent_job_id,
                        now - end
                    ),
                )));
            }
            let own = spec.deadline.as_ref().map(ms);
            if own.is_none_or(|o| o > end) {
                spec.deadline = Some(switchyard_kit::time::timestamp(end));
            }
        }
        let parent = Parent::of(p);
        spec.budget.get_or_insert_default().parent_budget_id = parent.budget_id.clone();
        Ok(Some(parent))
    }

    /// Refuses a client-named `budget.parent_budget_id` the submitter may
    /// not draw on: a job's own budget (only delegation nests under one,
    /// and the platform sets it), or a budget not shared with them. An
    /// admin shares a budget by its `shared_with` label: comma-separated
    /// subjects, `role:<role>`, or `*` for the whole tenant.
    pub(crate) async fn may_nest_under(
        &self,
        budget_id: &str,
        submitter: &OnBehalf,
        right: &BudgetRight,
    ) -> Result<(), ExecutorError> {
        if self
            .named_budget(budget_id, submitter, right)
            .await?
            .is_some()
        {
            return Ok(());
        }
        Err(ExecutorError::Invalid(FormatError::one(
            Reason::BudgetNotFound,
            "budget.parent_budget_id",
            format!(
                "budget {budget_id:?} is not one you may draw on: an admin shares a budget by labelling it shared_with=<subject, role:NAME or *>; a job's own budget is never a parent"
            ),
        )))
    }

    /// Budget `budget_id` as `submitter` may draw on it (read by this
    /// service for them): `None` when it does not exist, is another
    /// tenant's, is a job's own, or is not shared with them.
    async fn named_budget(
        &self,
        budget_id: &str,
        submitter: &OnBehalf,
        right: &BudgetRight,
    ) -> Result<Option<switchyard_proto::ledger::v1::Budget>, ExecutorError> {
        let get = switchyard_proto::ledger::v1::GetBudgetRequest {
            budget_id: budget_id.to_owned(),
        };
        let ledger = &self.inner.clients.ledger;
        let found = match ledger.get_budget(get).await {
            Ok(r) => r.budget.filter(|b| b.tenant == submitter.tenant),
            Err(e) if is_outage(&e) => return Err(upstream("ledger")(e)),
            Err(_) => None,
        };
        Ok(found.filter(|b| {
            !b.labels.contains_key("job_id") && right.covers(&b.labels, &submitter.subject)
        }))
    }

    /// Warnings about the budget `spec` names as its parent, as `who` may
    /// draw on it: not one they may draw on, or too little left for the
    /// worst case (the job would pause for an extension); and what it has
    /// left (unknown when none is named or it cannot be read).
    async fn parent_warnings(
        &self,
        spec: &JobSpec,
        est: &Estimate,
        who: &OnBehalf,
        right: &BudgetRight,
    ) -> (Vec<String>, switchyard_policy::Remaining) {
        let unknown = switchyard_policy::Remaining::default();
        let named = spec
            .budget
            .as_ref()
            .map(|b| b.parent_budget_id.clone())
            .unwrap_or_default();
        if named.is_empty() {
            return (Vec::new(), unknown);
        }
        let ctx = acting_context(&spec.correlation_id, who.clone());
        let read = switchyard_kit::context::scope(ctx, self.named_budget(&named, who, right)).await;
        let b = match read {
            Ok(Some(b)) => b,
            Ok(None) => {
                let w = format!(
                    "budget.parent_budget_id: budget {named:?} is not one you may draw on: the submission would be refused"
                );
                return (vec![w], unknown);
            }
            Err(_) => return (Vec::new(), unknown),
        };
        let left = switchyard_policy::Remaining::left(
            b.tokens_remaining,
            b.cost_remaining.map(|m| m.micro_usd),
        );
        let mut out = Vec::new();
        if let (Some(cost), Some(left)) = (est.cost, b.cost_remaining.as_ref())
            && cost > left.micro_usd
        {
            out.push(format!(
                "budget {named:?} has {} micro-USD left, less than the worst case of {cost}: the job would pause for an extension when it runs out",
                left.micro_usd
            ));
        }
        let tokens = est.input_tokens.saturating_add(est.output_tokens);
        if let Some(left) = b.tokens_remaining
            && !est.open_ended
            && tokens > left
        {
            out.push(format!(
                "budget {named:?} has {left} tokens left, less than the worst case of {tokens}: the job would pause for an extension when it runs out"
            ));
        }
        (out, left)
    }

    fn parent_budget(&self, spec: &JobSpec) -> String {
        spec.budget
            .as_ref()
            .map(|b| b.parent_budget_id.clone())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| self.inner.cfg.default_parent_budget.clone())
    }

    /// Records the approval of a pending job and moves it on; returns the
    /// last event and whether it may start now.
    fn approved(
        &self,
        st: &mut Jobs,
        job_id: &str,
        by: &str,
        now: u64,
    ) -> Result<(u64, bool), ExecutorError> {
        let book = &self.inner.book;
        let to = after_approval(st.get(job_id)?.spec(), now);
        let decided = events::ApprovalDecided {
            status: "approved".into(),
            by: by.to_owned(),
        };
        book.record(st, job_id, "", JobEvent::ApprovalDecided(decided));
        let g = book.move_job(st, job_id, to, Reason::InvalidArgument, "")?;
        Ok((g, to == JobState::Available))
    }

    /// Creates the job's budget and proposes its approval run, both at once,
    /// waiting for an unreachable service until `until_ms`. Both are
    /// idempotent, so a client retrying the same job id (or a job admitted
    /// after waiting) repeats them safely.
    async fn admit(
        &self,
        spec: &JobSpec,
        hash: &str,
        submitter: &OnBehalf,
        parent: Option<&Parent>,
        until_ms: u64,
        round: Round<'_>,
    ) -> Result<Admitted, ExecutorError> {
        let waiter = self.waiter("", "").until(Some(until_ms));
        let est = self.estimate(spec, round.kept, &waiter).await?;
        // The policies decide the submission first: a forbidden job is
        // refused before anything is made for it; one they say needs a
        // person is proposed for review (no policy approves its spend).
        let (mut limits, remaining) = self.budget_limits(spec, parent, &waiter).await?;
        let mut facts = submission_facts(spec, submitter, &est, self.inner.book.now());
        facts.remaining = remaining;
        let decision = self.decide(&facts);
        if let switchyard_policy::Verdict::Forbid { .. } = decision.verdict {
            return Err(ExecutorError::PolicyForbidden(decision.explain()));
        }
        let needs_person = matches!(decision.verdict, switchyard_policy::Verdict::Require { .. });
        let submitted = switchyard_policy::Recorded::of(&decision, facts);
        let submitted_by = submitter.subject.as_str();
        let (run_id, budget_id) = round_ids(&spec.job_id, round.number);
        if let Some(cap) = est.token_cap() {
            limits.token_budget = Some(limits.token_budget.map_or(cap, |t| t.min(cap)));
        }
        let mut run = proposal(spec, &est, hash, submitted_by, &self.inner.cfg.default_org);
        run.run_id = run_id;
        let clients = &self.inner.clients;
        let create = CreateBudgetRequest {
            budget_id: budget_id.clone(),
            parent_id: self.parent_budget(spec),
            token_limit: limits.token_budget,
            cost_limit: limits.cost_limit,
            labels: std::collections::BTreeMap::from([("job_id".to_owned(), spec.job_id.clone())]),
        };
        let budget = waiter.call(Service::Ledger, || {
            clients.ledger.create_budget(create.clone())
        });
        let approval = spec.approval.clone().unwrap_or_default();
        // A job its driver starts the moment it is approved has its run
        // claimed in the proposal when a policy (or the parent) approves it
        // at once: one call and one durable write less than Claim after.
        // Jobs that wait (a later start, queue tasks for workers) claim
        // when they start.
        let cfg = &self.inner.cfg;
        let starts_at_once = after_approval(spec, self.inner.book.now()) == JobState::Available
            && !crate::queue::queue_job(spec);
        let propose = ap::ProposeRequest {
            run: Some(run),
            skip_policies: approval.requires_approval || needs_person,
            approved_under: parent.map(|p| p.run_id.clone()).unwrap_or_default(),
            claim: starts_at_once.then(|| ap::ClaimOnApproval {
                worker_id: cfg.worker_id.clone(),
                lease_secs: cfg.lease_secs,
            }),
            budget_left: budget_left(remaining),
        };
        let span = crate::spans::propose(
            &spec.correlation_id,
            propose.run.as_ref().unwrap_or(&ap::Run::default()),
        );
        let proposing = waiter.call(Service::Approval, || {
            clients.approval.propose(propose.clone())
        });
        let proposing = tracing::Instrument::instrument(proposing, span.clone());
        let (budget, out) = tokio::join!(budget, proposing);
        match (budget, out) {
            (Ok(_), Ok(out)) => {
                let auto = approved_by(&out);
                crate::spans::proposed(&span, auto.as_deref());
                let run = out.run.unwrap_or_default();
                let kind = switchyard_policy::PrincipalKind::from_kind(submitter.kind.as_str());
                let spent = spend_decided(&run, kind, parent.is_some(), remaining);
                Ok(Admitted {
                    budget_id,
                    run,
                    auto,
                    hash: hash.to_owned(),
                    decided: std::iter::once(submitted).chain(spent).collect(),
                })
            }
            // Down: the job waits, and both are made again when it is back.
            (Err(e), _) if is_outage(&e) => Err(upstream("ledger")(e)),
            (_, Err(e)) if is_outage(&e) => Err(upstream("approval")(e)),
            (Err(e), out) => {
                // Refused: no job, so the proposal made alongside is withdrawn.
                if let Ok(p) = out {
                    let run_id = p.run.map(|r| r.run_id).unwrap_or_default();
                    let why = "the job was not accepted: its budget could not be created";
                    self.cancel_run_by_id(run_id, why, None).await;
                }
                Err(upstream("ledger")(e))
            }
            (Ok(_), Err(e)) => Err(upstream("approval")(e)),
        }
    }

    /// The job budget's limits — the job's own, and for a child job no more
    /// than its parent has left (its spending rolls up, and every
    /// reservation must also fit the parent's) — and what the job may spend
    /// as the policies see it (`context.remaining`): the lesser of its
    /// limits and what the budget it nests under has left. A top-level
    /// job's parent that cannot be read leaves the remaining its own limits
    /// (creating the budget under it says why).
    async fn budget_limits(
        &self,
        spec: &JobSpec,
        parent: Option<&Parent>,
        waiter: &Waiter<'_>,
    ) -> Result<(JobBudget, switchyard_policy::Remaining), ExecutorError> {
        let mut b = spec.budget.clone().unwrap_or_default();
        let above = parent.map_or_else(|| self.parent_budget(spec), |p| p.budget_id.clone());
        let ledger = &self.inner.clients.ledger;
        let get = switchyard_proto::ledger::v1::GetBudgetRequest { budget_id: above };
        let read = async {
            if get.budget_id.is_empty() {
                return Ok(None);
            }
            let r = waiter.call(Service::Ledger, || ledger.get_budget(get.clone()));
            r.await.map(|r| r.budget)
        };
        let left = match (read.await, parent) {
            (Ok(left), _) => left,
            (Err(e), Some(_)) => return Err(upstream("ledger")(e)),
            (Err(e), None) if is_outage(&e) => return Err(upstream("ledger")(e)),
            (Err(_), None) => None,
        };
        let own = remaining_of(&b);
        let Some(left) = left else {
            return Ok((b, own));
        };
        let above = switchyard_policy::Remaining::left(
            left.tokens_remaining,
            left.cost_remaining.map(|m| m.micro_usd),
        );
        if parent.is_some() {
            let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            b.token_budget = min(b.token_budget, left.tokens_remaining);
            let micro = |m: Option<Money>| m.map(|m| m.micro_usd.max(0) as u64);
            b.cost_limit = min(micro(b.cost_limit), micro(left.cost_remaining)).map(|c| Money {
                micro_usd: c as i64,
            });
        }
        Ok((b, own.min(above)))
    }

    /// Checks pending jobs' runs and starts scheduled jobs that are due.
    pub(crate) async fn poll_approvals(&self) -> Result<(), ExecutorError> {
        let now = self.inner.book.now();
        let (pending, due, unadmitted) = {
            let st = self.inner.book.lock();
            let (mut pending, mut due, mut unadmitted) = (Vec::new(), Vec::new(), Vec::new());
            for e in st.waiting.iter().filter_map(|id| st.find(id)) {
                match e.state() {
                    JobState::Pending if !e.job.run_id.is_empty() => {
                        pending.push((e.id().to_owned(), e.job.run_id.clone()))
                    }
                    JobState::Pending => unadmitted.push(e.id().to_owned()),
                    JobState::Scheduled if after_approval(e.spec(), now) == JobState::Available => {
                        due.push(e.id().to_owned())
                    }
                    _ => {}
                }
            }
            (pending, due, unadmitted)
        };
        for id in due {
            self.start_scheduled(&id).await?;
        }
        for id in unadmitted {
            if !self.readmit(&id, now).await? {
                // Still down: the others wait for the next round.
                break;
            }
        }
        for (job_id, run_id) in pending {
            self.check_run(&job_id, run_id, now).await?;
        }
        Ok(())
    }

    /// A scheduled job whose time has come starts.
    async fn start_scheduled(&self, job_id: &str) -> Result<(), ExecutorError> {
        let book = &self.inner.book;
        let g = {
            let mut st = book.lock();
            book.move_job(
                &mut st,
                job_id,
                JobState::Available,
                Reason::InvalidArgument,
                "",
            )
        };
        if let Ok(g) = g {
            book.durable(g).await?;
            self.spawn_driver(job_id);
        }
        Ok(())
    }

    /// Follows a pending job's approval run: approved starts it, rejected or
    /// cancelled cancels it.
    async fn check_run(&self, job_id: &str, run_id: String, now: u64) -> Result<(), ExecutorError> {
        let book = &self.inner.book;
        let run = match self
            .inner
            .clients
            .approval
            .get_run(ap::GetRunRequest { run_id })
            .await
        {
            Ok(r) => r.run.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(job_id, error = %e.message(), "cannot read approval run");
                return Ok(());
            }
        };
        let status = ap::RunStatus::try_from(run.status).unwrap_or(ap::RunStatus::Unspecified);
        let word = status
            .as_str_name()
            .trim_start_matches("RUN_STATUS_")
            .to_lowercase();
        let still_pending = |st: &Jobs| {
            st.find(job_id)
                .is_some_and(|e| e.state() == JobState::Pending)
        };
        match status {
            ap::RunStatus::Approved | ap::RunStatus::Running => {
                let by = self.decider(&run).await;
                let held = match &run.scope {
                    Some(scope) => Some(self.hold_scope(job_id, &run.run_id, scope).await?),
                    None => None,
                };
                let (g, go) = {
                    let mut st = book.lock();
                    if !still_pending(&st) {
                        return Ok(());
                    }
                    if let Some(h) = held {
                        book.record(&mut st, job_id, "", JobEvent::ScopeHeld(h));
                    }
                    self.approved(&mut st, job_id, &by, now)?
                };
                book.durable(g).await?;
                if go {
                    self.spawn_driver(job_id);
                }
            }
            ap::RunStatus::Rejected | ap::RunStatus::Cancelled => {
                let by = self.decider(&run).await;
                // A run a policy forbade says so, with the policy's words.
                let forbidden = run.reason_code == Reason::PolicyForbidden.as_str();
                let (reason, why) = if forbidden {
                    (Reason::PolicyForbidden, run.last_error.clone())
                } else {
                    (
                        Reason::ApprovalRejected,
                        format!("approval run {} was {word}", run.run_id),
                    )
                };
                let (g, intents) = {
                    let mut st = book.lock();
                    if !still_pending(&st) {
                        return Ok(());
                    }
                    let decided = events::ApprovalDecided { status: word, by };
                    book.record(&mut st, job_id, "", JobEvent::ApprovalDecided(decided));
                    let g = crate::cancel::cancel_idle(book, &mut st, job_id, reason, &why)?;
                    (g, self.intend(&st, job_id, RunEnd::Ended)?)
                };
                book.durable(g).await?;
                self.deliver_now(intents).await;
            }
            _ => {}
        }
        Ok(())
    }

    /// Places approval `run_id`'s scope as a hold on job `job_id`'s budget
    /// chain, acting for the submitter (the same key gives the same hold,
    /// so a repeat after a restart finds it). A chain without room for it
    /// is said in the event; the job then reserves step by step.
    pub(crate) async fn hold_scope(
        &self,
        job_id: &str,
        run_id: &str,
        scope: &ap::ApprovalScope,
    ) -> Result<events::ScopeHeld, ExecutorError> {
        let (budget_id, corr, who) = {
            let st = self.inner.book.lock();
            let e = st.get(job_id)?;
            (
                e.job.budget_id.clone(),
                e.spec().correlation_id.clone(),
                e.submitter(),
            )
        };
        let now = self.inner.book.now();
        let until_ms = scope.until.as_ref().map_or(
            now + switchyard_core::money::MAX_HOLD_MS,
            switchyard_kit::time::timestamp_ms,
        );
        let mut held = events::ScopeHeld {
            run_id: run_id.to_owned(),
            reservation_id: String::new(),
            tokens: scope.tokens,
            cost_micro_usd: scope.cost.map_or(0, |m| m.micro_usd),
            until_ms,
            refused: String::new(),
        };
        if budget_id.is_empty() {
            held.refused = "the job has no budget to hold on".into();
            return Ok(held);
        }
        let req = switchyard_proto::ledger::v1::ReserveRequest {
            budget_id,
            tokens: held.tokens,
            cost: Some(Money {
                micro_usd: held.cost_micro_usd,
            }),
            idempotency_key: switchyard_api::spend::key(&["scope", job_id, run_id]),
            ttl: Some(switchyard_kit::time::duration(
                until_ms.saturating_sub(now).max(1),
            )),
            context: Some(switchyard_proto::common::v1::CorrelationContext {
                correlation_id: corr.clone(),
                job_id: job_id.to_owned(),
                ..Default::default()
            }),
            note: format!("the scope approved by run {run_id}"),
            hold: true,
            ..Default::default()
        };
        let ledger = &self.inner.clients.ledger;
        let ctx = acting_context(&corr, who);
        let placed = switchyard_kit::context::scope(
            ctx,
            self.waiter(job_id, "")
                .call(Service::Ledger, || ledger.reserve(req.clone())),
        )
        .await;
        match placed {
            Ok(r) => {
                held.reservation_id = r.reservation.unwrap_or_default().reservation_id;
            }
            Err(status) if is_outage(&status) => {
                return Err(ExecutorError::Upstream {
                    service: "ledger",
                    status,
                });
            }
            Err(status) => {
                tracing::info!(job_id, run_id, error = %status.message(), "the approved scope was not held");
                held.refused = status.message().to_owned();
            }
        }
        Ok(held)
    }

    /// Who decided a run: the run says so itself. Only a run decided by an
    /// approval service of an earlier release (a rolling upgrade) leaves it
    /// empty; then its audit log is followed (best effort, bounded).
    async fn decider(&self, run: &ap::Run) -> String {
        use futures_util::StreamExt as _;
        if !run.decided_by.is_empty() {
            return run.decided_by.clone();
        }
        let find = async {
            let req = ap::WatchRequest {
                run_id: run.run_id.clone(),
                after_sequence: 0,
            };
            let mut events = self.inner.clients.approval.watch(req).await.ok()?;
            while let Some(Ok(w)) = events.next().await {
                let Some(e) = w.event else { continue };
                let decided = matches!(
                    e.kind.as_str(),
                    "run.approved" | "run.auto_approved" | "run.rejected" | "run.cancelled"
                );
                if decided {
                    let data = e.data.as_ref().map(switchyard_kit::json::struct_to_json);
                    return data.and_then(|d| d["actor"].as_str().map(str::to_owned));
                }
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(5), find)
            .await
            .ok()
            .flatten()
            .unwrap_or_default()
    }
}

/// What admission made for a job.
struct Admitted {
    budget_id: String,
    run: ap::Run,
    /// Who approved it already, if anyone.
    auto: Option<String>,
    hash: String,
    /// The policy decisions it was admitted on (its submission, its run's
    /// spend), with their facts, for the journal.
    decided: Vec<switchyard_policy::Recorded>,
}

/// The approval service's decision about `run` (as it recorded it on the
/// run) with the facts it was taken on, rebuilt as that service builds
/// them: the run, its proposer's kind, whether it is delegated, its depth,
/// the budget's remaining and the run's creation time. `None` for a run
/// no policy decided (an extension).
fn spend_decided(
    run: &ap::Run,
    kind: switchyard_policy::PrincipalKind,
    delegated: bool,
    remaining: switchyard_policy::Remaining,
) -> Option<switchyard_policy::Recorded> {
    let policy = run.policy.as_ref().filter(|p| !p.action.is_empty())?;
    let at = run
        .created_at
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms);
    let mut facts = switchyard_policy::run_facts(run, kind, delegated, policy.delegation_depth, at);
    // As the service read it: what `budget_left` sent.
    facts.remaining = budget_left(remaining)
        .map(|b| switchyard_policy::Remaining::left(b.tokens, b.cost.map(|m| m.micro_usd)))
        .unwrap_or_default();
    Some(switchyard_policy::Recorded::of_record(policy, facts))
}

/// The submitter: the caller, else (a service delegating) the parent's.
/// What budgets a submitter may nest a job's budget under.
#[derive(Debug, Clone)]
pub(crate) enum BudgetRight {
    /// Any budget of its tenant but jobs' own (it manages budgets).
    Any,
    /// Those whose `shared_with` label names the submitter, one of these
    /// roles (`role:<name>`), or `*`.
    Shared(Vec<String>),
}

impl BudgetRight {
    /// The right of principal `p` (a service acting for someone holds
    /// only what is shared: its own roles are not the user's).
    pub(crate) fn of(p: &Principal) -> BudgetRight {
        if p.on_behalf_of.is_none() && p.may(switchyard_kit::auth::Permission::BudgetManage) {
            BudgetRight::Any
        } else if p.on_behalf_of.is_none() {
            BudgetRight::Shared(p.roles.names())
        } else {
            BudgetRight::Shared(Vec::new())
        }
    }

    fn covers(&self, labels: &std::collections::BTreeMap<String, String>, subject: &str) -> bool {
        let roles = match self {
            BudgetRight::Any => return true,
            BudgetRight::Shared(roles) => roles,
        };
        labels.get("shared_with").is_some_and(|list| {
            list.split(',').map(str::trim).any(|who| {
                who == "*"
                    || who == subject
                    || who
                        .strip_prefix("role:")
                        .is_some_and(|r| roles.iter().any(|mine| mine == r))
            })
        })
    }
}

/// The parent a spec names, or "".
fn parent_id(spec: &JobSpec) -> &str {
    spec.delegation
        .as_ref()
        .map_or("", |d| d.parent_job_id.as_str())
}

fn for_whom(
    who: Option<OnBehalf>,
    parent: Option<&Parent>,
    spec: &JobSpec,
) -> Result<OnBehalf, ExecutorError> {
    match (who, parent) {
        // A child is hung under a parent only by the parent's submitter
        // (or, with an invocation grant for the parent, by the agent its
        // running task invoked — checked before this): anyone else's
        // parent job, in this tenant or another, does not exist for them.
        (Some(w), Some(p))
            if w.tenant != p.submitter.tenant || w.subject != p.submitter.subject =>
        {
            let id = spec
                .delegation
                .as_ref()
                .map(|d| d.parent_job_id.clone())
                .unwrap_or_default();
            Err(ExecutorError::NotFound(id))
        }
        (Some(w), _) => Ok(w),
        (None, Some(p)) => Ok(p.submitter.clone()),
        (None, None) => Err(ExecutorError::Invalid(FormatError::one(
            Reason::InvalidArgument,
            "job",
            "a job belongs to a tenant: a service submits on behalf of a user",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use switchyard_llm::agent::{estimate_prompt_tokens, first_turn};
    use switchyard_llm::{LlmConfig, ModelConfig, ProviderConfig};
    use switchyard_proto::executor::v1::{LlmTask, TaskSpec, ToolDefinition};
    use switchyard_proto::router::v1::Candidate;

    use super::*;

    fn llm() -> switchyard_llm::Llm {
        let cfg = LlmConfig {
            providers: vec![ProviderConfig {
                name: "p".into(),
                base_url: "http://127.0.0.1:9/v1".into(),
                models: vec![ModelConfig::priced("m", 1_000_000, 2_000_000)],
                ..Default::default()
            }],
            ..Default::default()
        };
        switchyard_llm::Llm::new(&cfg).expect("a valid [llm]")
    }

    fn job(kind: Kind) -> JobSpec {
        JobSpec {
            tasks: vec![TaskSpec {
                id: "t".into(),
                kind: Some(kind),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn known<'a>(
        routes: &'a HashMap<String, RouteResponse>,
        llm: &'a switchyard_llm::Llm,
    ) -> Known<'a> {
        Known {
            routes,
            llm,
            agent_max_tokens: 4096,
            llm_default_max_tokens: 100,
            llm_max_turns: 3,
        }
    }

    #[test]
    fn an_llm_estimate_bounds_prompts_as_the_loop_reserves_them_and_caps_the_budget() {
        let (routes, llm) = (HashMap::new(), llm());
        let task = LlmTask {
            model: "m".into(),
            instructions: "Be brief.".into(),
            prompt: "Say something about the weather in three words.".into(),
            ..Default::default()
        };
        let est = estimate(&job(Kind::Llm(task.clone())), &known(&routes, &llm));
        let per_turn = estimate_prompt_tokens(&first_turn(&task.instructions, &task.prompt), &[]);
        assert_eq!(
            est.input_tokens,
            per_turn * 3,
            "the loop's own bound, every turn"
        );
        assert_eq!(est.output_tokens, 100 * 3);
        assert_eq!(est.token_cap(), Some(per_turn * 3 + 300));
        assert!(est.cost.is_some_and(|c| c > 0));
    }

    #[test]
    fn spending_decided_later_is_not_capped_by_the_estimate() {
        let (routes, llm) = (HashMap::new(), llm());
        let delegating = LlmTask {
            model: "m".into(),
            prompt: "p".into(),
            tools: vec![ToolDefinition {
                name: "delegate".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let est = estimate(&job(Kind::Llm(delegating)), &known(&routes, &llm));
        assert_eq!((est.cost, est.token_cap()), (None, None));
        let routes = HashMap::from([(
            "t".to_owned(),
            RouteResponse {
                candidates: vec![Candidate {
                    agent_id: "a".into(),
                    bills_tokens: true,
                    ..Default::default()
                }],
                ..Default::default()
            },
        )]);
        let agent = switchyard_proto::executor::v1::AgentTask {
            capability: "c".into(),
            ..Default::default()
        };
        let est = estimate(&job(Kind::Agent(agent.clone())), &known(&routes, &llm));
        assert_eq!((est.cost, est.token_cap()), (None, None));
        // Any agent may delegate within the job's budget: priced, not capped.
        let priced = HashMap::from([(
            "t".to_owned(),
            RouteResponse {
                candidates: vec![Candidate {
                    agent_id: "a".into(),
                    price_per_unit_micro_usd: 7,
                    ..Default::default()
                }],
                ..Default::default()
            },
        )]);
        let est = estimate(&job(Kind::Agent(agent)), &known(&priced, &llm));
        assert_eq!((est.cost, est.token_cap()), (Some(7), None));
    }

    #[test]
    fn jobs_that_spend_no_tokens_get_no_token_cap() {
        let (routes, llm) = (HashMap::new(), llm());
        let cmd = switchyard_proto::executor::v1::CommandTask {
            command: "true".into(),
            ..Default::default()
        };
        let est = estimate(&job(Kind::Command(cmd)), &known(&routes, &llm));
        assert_eq!((est.cost, est.token_cap()), (Some(0), None));
    }
}
