//! Budgets that pause and ask instead of failing (issue 44, §3): a job
//! whose budget refuses a step stops spending and goes to
//! `budget_paused`; its extension run waits for a person other than the
//! submitter; approved, the job's budget grows by the amount and the job
//! goes on where it stopped (no finished task runs again); rejected, it
//! ends with what it finished. What ran out — tokens or money — is the
//! reason, with the numbers.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use serde_json::{Value, json};
use switchyard_kit::error::ApiError;
use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::approval::v1::{
    ApproveRequest, GetReceiptRequest, RejectRequest, Run, RunStatus,
};
use switchyard_proto::auth::v1::PrincipalKind;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{CancelJobRequest, Job, JobState, TaskState};
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_testkit::Stack;
use tonic::Code;

use crate::common::{
    Counting, Jobs, approvals_as, approve, budget, events_of, explain, finish, job, outsiders,
    run_of, serve_priced_agent, story_says, submit, tenant_key, until_event, wait_routed,
};

/// Every service in one process; `dana` submits and may approve (so
/// separation of duties, not a missing role, is what stops her approving
/// her own job's extension).
async fn stack() -> (Stack, Jobs, String) {
    stack_with(|_| {}).await
}

/// [`stack`] with `tweak` applied to the configuration.
async fn stack_with(tweak: impl FnOnce(&mut switchyard_cli::Config)) -> (Stack, Jobs, String) {
    switchyard_kit::tls::install_crypto();
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.approval_poll_ms = 20;
        tweak(c);
    })
    .await
    .unwrap();
    let dana = s
        .key("dana", &["submitter", "approver"], PrincipalKind::Human)
        .await
        .unwrap();
    let c = JobServiceClient::new(s.channel_with(&dana).await.unwrap());
    (s, c, dana)
}

/// Three steps, each using 40 tokens (at `price` micro-USD a call), one
/// after the other, under `budget`.
fn chain(job_id: &str, budget: Value) -> String {
    let step = |id: &str, after: &[&str]| {
        json!({"id": id, "depends_on": after,
               "agent": {"capability": "text.count", "input": {"text": id}}})
    };
    json!({"job_id": job_id, "budget": budget,
           "tasks": [step("a", &[]), step("b", &["a"]), step("c", &["b"])]})
    .to_string()
}

/// Submits `doc` and approves its run (as bob) when it waits for one.
async fn started(s: &Stack, c: &mut Jobs, doc: &str) -> Job {
    let j = submit(c, doc).await.unwrap();
    if j.state == JobState::Pending as i32 && !j.run_id.is_empty() {
        approve(s, &j.run_id).await;
    }
    j
}

fn states(j: &Job) -> Vec<TaskState> {
    j.tasks
        .iter()
        .map(|t| TaskState::try_from(t.state).unwrap())
        .collect()
}

fn attempts(j: &Job) -> Vec<usize> {
    j.tasks.iter().map(|t| t.attempts.len()).collect()
}

fn reason_of(e: &tonic::Status) -> String {
    ApiError::from(e.clone()).reason.unwrap_or_default()
}

#[tokio::test]
async fn a_budget_that_runs_out_pauses_the_job_and_an_approved_extension_resumes_it_where_it_stopped()
 {
    let (s, mut c, dana) = stack().await;
    let (trigger, agent) = serve_priced_agent(&s, "counting", "text.count", 0, Counting(40));
    wait_routed(&s, "text.count").await;
    // Two steps fit in 80 tokens; the third does not.
    started(&s, &mut c, &chain("tight", json!({"token_budget": 80}))).await;
    let paused = until_event(&mut c, "tight", "budget.paused").await;
    assert_eq!(paused["dimension"], "tokens", "{paused}");
    assert_eq!(
        paused["tokens"], 80,
        "the refused hold's shortfall: {paused}"
    );
    assert_eq!(paused["remaining_tasks"], json!(["c"]));
    let run_id = paused["run_id"].as_str().unwrap().to_owned();
    let j = job(&mut c, "tight").await;
    assert_eq!(j.state, JobState::BudgetPaused as i32, "{j:?}");
    assert_eq!(j.reason, "AGENT_TOKEN_BUDGET_EXCEEDED", "{}", j.error);
    assert!(j.error.contains(&run_id), "{}", j.error);
    assert_eq!(
        states(&j),
        vec![
            TaskState::Succeeded,
            TaskState::Succeeded,
            TaskState::BudgetPaused
        ]
    );
    let p = j.budget_pause.clone().unwrap();
    assert_eq!(
        (p.run_id.as_str(), p.decision.as_str(), p.number),
        (run_id.as_str(), "pending", 1)
    );
    assert_eq!(j.tokens_used, 80);

    // The extension is an approval run of its own, proposed for dana and
    // left for a person.
    let run = run_of(&s, &run_id).await;
    assert_eq!(run.status, RunStatus::Proposed as i32);
    assert_eq!(run.created_by, "dana");
    let x = run.extension.clone().unwrap();
    assert_eq!((x.job_id.as_str(), x.tokens), ("tight", 80));
    assert_eq!(x.budget_id, j.budget_id);

    // dana may not approve her own job's extension; another submitter, an
    // admin of another tenant and an agent key may not either.
    let ask = ApproveRequest {
        run_id: run_id.clone(),
        comment: "mine".into(),
        edit: None,
        scope: None,
    };
    let mine = ApprovalServiceClient::new(s.channel_with(&dana).await.unwrap())
        .approve(ask.clone())
        .await
        .unwrap_err();
    assert_eq!(
        (mine.code(), reason_of(&mine).as_str()),
        (Code::PermissionDenied, "SEPARATION_OF_DUTIES"),
        "{mine:?}"
    );
    let [carol, mallory, robot] = outsiders(&s).await;
    let tenant_b_approver =
        tenant_key(&s, "tenant-b", "erin", &["approver"], PrincipalKind::Human).await;
    for (who, key, code) in [
        ("carol", carol, Code::PermissionDenied),
        (
            "mallory, admin of tenant-b",
            mallory,
            Code::PermissionDenied,
        ),
        (
            "erin, approver of tenant-b",
            tenant_b_approver,
            Code::NotFound,
        ),
        ("an agent key", robot, Code::PermissionDenied),
    ] {
        let e = ApprovalServiceClient::new(s.channel_with(&key).await.unwrap())
            .approve(ask.clone())
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{who}: {e:?}");
    }
    let j = job(&mut c, "tight").await;
    assert_eq!(
        j.state,
        JobState::BudgetPaused as i32,
        "nobody's refusal moved it"
    );

    // bob approves: the budget grows by 80 and only c runs again.
    approve(&s, &run_id).await;
    let r = finish(&mut c, "tight").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(r.tokens_used, 120);
    let j = job(&mut c, "tight").await;
    assert_eq!(attempts(&j), vec![1, 1, 2], "no finished task ran again");
    let p = j.budget_pause.unwrap();
    assert_eq!(
        (p.decision.as_str(), p.decided_by.as_str()),
        ("approved", "bob")
    );
    // bob's decision has a signed receipt binding the extension's amount;
    // it verifies offline, and a changed one does not.
    let (receipt, key) = verified_receipt(&s, &run_id).await;
    let body = &receipt.receipt;
    assert_eq!(
        (body["run_id"].as_str(), body["decided_by"].as_str()),
        (Some(run_id.as_str()), Some("bob"))
    );
    assert_eq!(body["scope"]["extension"]["tokens"], 80, "{body}");
    assert_eq!(body["created_by"], "dana");
    let mut forged = receipt.clone();
    forged.receipt["scope"]["extension"]["tokens"] = json!(80_000);
    assert!(switchyard_kit::receipt::verify(&forged, Some(&key)).is_err());
    // The job's own run, approved by the zero-cost policy, has one too.
    let (policy, _) = verified_receipt(&s, &j.run_id).await;
    assert_eq!(
        policy.receipt["decided_by"], "policy:zero-cost",
        "{}",
        policy.receipt
    );
    // The journal and the balance agree: 120 spent of a limit of 160.
    let mut ledger = LedgerServiceClient::new(s.channel().await.unwrap());
    let b = budget(&mut ledger, &j.budget_id).await;
    assert_eq!(
        (b.token_limit, b.tokens_spent, b.tokens_reserved),
        (Some(160), 120, 0)
    );
    // The story: the pause, who extended it, and only c's second attempt.
    let x = explain(&mut c, "tight").await;
    story_says(&x, "Paused: tokens ran out at");
    story_says(&x, "The extension was approved by bob");
    story_says(&x, "Step c: attempt 2 started");
    assert_eq!(
        x.by_task.iter().map(|t| t.tokens).sum::<u64>(),
        120,
        "the steps' charges add up to the budget's: {x:?}"
    );
    trigger.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_paused_job_gives_its_tenants_running_slot_back_and_takes_it_again_when_extended() {
    // One running job per tenant.
    let (s, mut c, _dana) = stack_with(|c| c.executor.max_running_jobs_per_tenant = 1).await;
    let (trigger, agent) = serve_priced_agent(&s, "counting", "text.count", 0, Counting(40));
    wait_routed(&s, "text.count").await;
    started(&s, &mut c, &chain("tight", json!({"token_budget": 80}))).await;
    let paused = until_event(&mut c, "tight", "budget.paused").await;
    let run_id = paused["run_id"].as_str().unwrap().to_owned();
    // While tight waits for a person, another of the tenant's jobs runs.
    started(
        &s,
        &mut c,
        &chain("meanwhile", json!({"token_budget": 1000})),
    )
    .await;
    let r = finish(&mut c, "meanwhile").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(
        job(&mut c, "tight").await.state,
        JobState::BudgetPaused as i32
    );
    // Extended, tight takes a slot again and ends.
    approve(&s, &run_id).await;
    let r = finish(&mut c, "tight").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    trigger.fire();
    agent.await.unwrap().unwrap();
    s.stop().await.unwrap();
}

#[tokio::test]
async fn money_that_runs_out_pauses_with_the_cost_reason_and_a_rejected_extension_ends_the_job() {
    let (s, mut c, _) = stack().await;
    // 30 micro-USD a call under a 50 micro-USD limit: b does not fit.
    let (trigger, agent) = serve_priced_agent(&s, "priced", "text.count", 30, Counting(1));
    wait_routed(&s, "text.count").await;
    let doc = chain("broke", json!({"cost_limit_micro_usd": 50}));
    started(&s, &mut c, &doc).await;
    let paused = until_event(&mut c, "broke", "budget.paused").await;
    assert_eq!(paused["dimension"], "cost", "{paused}");
    // b's shortfall (30 - 20) and c's call after it.
    assert_eq!(paused["cost_micro_usd"], 10 + 30, "{paused}");
    let j = job(&mut c, "broke").await;
    assert_eq!(j.reason, "AGENT_COST_BUDGET_EXCEEDED", "{}", j.error);
    let t = &j.tasks[1];
    assert_eq!(t.reason, "AGENT_COST_BUDGET_EXCEEDED");
    assert!(t.error.contains("budget"), "{}", t.error);
    assert_eq!(
        states(&j)[..2],
        [TaskState::Succeeded, TaskState::BudgetPaused]
    );
    let run_id = paused["run_id"].as_str().unwrap().to_owned();
    approvals_as(&s, "bob")
        .await
        .reject(RejectRequest {
            run_id: run_id.clone(),
            comment: "not worth it".into(),
        })
        .await
        .unwrap();
    let r = finish(&mut c, "broke").await;
    assert_eq!(r.state, JobState::Discarded as i32);
    let j = job(&mut c, "broke").await;
    assert_eq!(j.reason, "BUDGET_EXTENSION_REJECTED", "{}", j.error);
    assert!(
        j.error.contains("rejected by bob: not worth it"),
        "{}",
        j.error
    );
    assert_eq!(
        states(&j),
        vec![TaskState::Succeeded, TaskState::Failed, TaskState::Skipped]
    );
    assert_eq!(j.budget_pause.as_ref().unwrap().decision, "rejected");
    assert_eq!(attempts(&j), vec![1, 1, 0]);
    trigger.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn cancelling_a_paused_job_withdraws_its_extension_request() {
    let (s, mut c, _) = stack().await;
    let (trigger, agent) = serve_priced_agent(&s, "counting", "text.count", 0, Counting(40));
    wait_routed(&s, "text.count").await;
    started(&s, &mut c, &chain("stop", json!({"token_budget": 40}))).await;
    let paused = until_event(&mut c, "stop", "budget.paused").await;
    assert_eq!(paused["remaining_tasks"], json!(["b", "c"]));
    // b's shortfall (40) and as much again for c.
    assert_eq!(paused["tokens"], 80, "{paused}");
    let run_id = paused["run_id"].as_str().unwrap().to_owned();
    let j = c
        .cancel_job(CancelJobRequest {
            job_id: "stop".into(),
            reason: "enough".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(j.state, JobState::Cancelled as i32, "{j:?}");
    assert_eq!(
        run_of(&s, &run_id).await.status,
        RunStatus::Cancelled as i32
    );
    // Never approved: no receipt; another tenant's approver does not learn
    // the run exists.
    let none = approvals_as(&s, "bob")
        .await
        .get_receipt(GetReceiptRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (none.code(), reason_of(&none).as_str()),
        (Code::NotFound, "RECEIPT_NOT_FOUND")
    );
    let erin = tenant_key(&s, "tenant-b", "erin", &["approver"], PrincipalKind::Human).await;
    let hidden = ApprovalServiceClient::new(s.channel_with(&erin).await.unwrap())
        .get_receipt(GetReceiptRequest {
            run_id: run_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (hidden.code(), reason_of(&hidden).as_str()),
        (Code::NotFound, "RUN_NOT_FOUND")
    );
    // Approving the withdrawn request does nothing.
    let late = approvals_as(&s, "bob")
        .await
        .approve(ApproveRequest {
            run_id,
            comment: "too late".into(),
            edit: None,
            scope: None,
        })
        .await;
    assert!(late.is_err(), "{late:?}");
    assert_eq!(job(&mut c, "stop").await.state, JobState::Cancelled as i32);
    trigger.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}

/// Only the executor proposes extension runs: a person proposing one (to
/// have it approved and mistaken for a job's request) is refused, as a
/// submitter who may approve and as a principal with every other role.
#[tokio::test]
async fn nobody_but_the_executor_may_propose_a_budget_extension_run() {
    let (s, _, dana) = stack().await;
    let run = Run {
        schema_version: "agent_run_spec/v1".into(),
        run_id: "extend-forged".into(),
        target: Some(switchyard_proto::approval::v1::Target {
            org: "default".into(),
            repo: String::new(),
            work_item_ids: vec!["someone-elses".into()],
        }),
        intent: "more money please".into(),
        context_pack: Some(switchyard_proto::approval::v1::ContextPack {
            pack_id: "p".into(),
            hash: format!("sha256:{}", "0".repeat(64)),
            version: "v1".into(),
            inputs: vec![],
        }),
        model: "none".into(),
        max_tokens: 1,
        tools_allowed: vec!["none".into()],
        outputs_allowed: vec!["budget_extension".into()],
        extension: Some(switchyard_proto::approval::v1::BudgetExtension {
            job_id: "someone-elses".into(),
            budget_id: "job-someone-elses".into(),
            tokens: 1_000_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    for key in [dana, s.token("tester").unwrap()] {
        let e = ApprovalServiceClient::new(s.channel_with(&key).await.unwrap())
            .propose(switchyard_proto::approval::v1::ProposeRequest {
                run: Some(run.clone()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("extension"), "{}", e.message());
    }
    s.stop().await.unwrap();
}

/// Before pausing, a cheaper candidate routing offered is tried, and the
/// log says so with both prices; a task that forbids it pauses instead.
#[tokio::test]
async fn a_refused_price_downgrades_to_a_cheaper_agent_unless_the_task_forbids_it() {
    let (s, mut c, _) = stack().await;
    let (t1, premium) = serve_priced_agent(&s, "premium", "text.count", 30, Counting(1));
    let (t2, basic) = serve_priced_agent(&s, "basic", "text.count", 10, Counting(1));
    // Both routable before the jobs start (bounded: 10 s).
    let mut router = switchyard_proto::router::v1::router_service_client::RouterServiceClient::new(
        s.channel().await.unwrap(),
    );
    let mut both = false;
    for _ in 0..400 {
        let ids: Vec<String> = crate::common::route(&mut router, "text.count", &[])
            .await
            .map(|r| r.candidates.into_iter().map(|c| c.agent_id).collect())
            .unwrap_or_default();
        if ids.iter().any(|i| i == "premium") && ids.iter().any(|i| i == "basic") {
            both = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(both, "premium and basic do not both route");
    let doc = |job_id: &str, no_downgrade: bool| {
        json!({"job_id": job_id, "budget": {"cost_limit_micro_usd": 25},
               "tasks": [{"id": "count",
                          "agent": {"capability": "text.count", "input": {"text": "x"},
                                    "prefer_agents": ["premium"], "no_downgrade": no_downgrade}}]})
        .to_string()
    };
    started(&s, &mut c, &doc("cheaper", false)).await;
    let down = until_event(&mut c, "cheaper", "route.downgraded").await;
    assert_eq!(
        (
            down["from_agent"].as_str(),
            down["to_agent"].as_str(),
            down["from_price_micro_usd"].as_i64(),
            down["to_price_micro_usd"].as_i64()
        ),
        (Some("premium"), Some("basic"), Some(30), Some(10)),
        "{down}"
    );
    assert!(
        down["reason"].as_str().unwrap().contains("budget"),
        "{down}"
    );
    let r = finish(&mut c, "cheaper").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(r.tasks[0].agent_id, "basic");
    assert_eq!(r.cost.unwrap().micro_usd, 10);

    started(&s, &mut c, &doc("premium-only", true)).await;
    let j = crate::common::until_paused(&mut c, "premium-only").await;
    assert_eq!(j.reason, "AGENT_COST_BUDGET_EXCEEDED", "{}", j.error);
    let p = j.budget_pause.unwrap();
    assert_eq!(
        (p.dimension.as_str(), p.cost.unwrap().micro_usd),
        ("cost", 5),
        "30 asked, 25 left"
    );
    t1.fire();
    t2.fire();
    let _ = (premium.await, basic.await);
    s.stop().await.unwrap();
}

/// ValidateJob's warnings about `doc`.
async fn warnings(c: &mut Jobs, doc: &Value) -> Vec<String> {
    c.validate_job(switchyard_proto::executor::v1::ValidateJobRequest {
        document: doc.to_string(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .warnings
}

/// ValidateJob says before anything is proposed what cannot succeed as
/// submitted: a capability no agent offers, a model no provider serves,
/// and a worst case above the job's own budget (it would pause).
#[tokio::test]
async fn validation_warns_of_what_cannot_succeed_before_anything_is_proposed() {
    let (s, mut c, _) = stack().await;
    let (trigger, agent) = serve_priced_agent(&s, "priced", "text.count", 30, Counting(1));
    wait_routed(&s, "text.count").await;
    let doc = json!({"job_id": "doomed", "budget": {"cost_limit_micro_usd": 50},
        "tasks": [
            {"id": "a", "agent": {"capability": "text.count", "input": {"text": "a"}}},
            {"id": "b", "depends_on": ["a"], "agent": {"capability": "text.count", "input": {"text": "b"}}},
            {"id": "ghost", "agent": {"capability": "no.such.capability"}},
            {"id": "ask", "llm": {"model": "gpt-nowhere", "prompt": "hi"}}]});
    let warned = warnings(&mut c, &doc).await;
    let said = warned.join("\n");
    assert!(
        said.contains("tasks[2] (ghost): no agent offers capability \"no.such.capability\""),
        "{said}"
    );
    assert!(
        said.contains("tasks[3] (ask): no provider here serves model \"gpt-nowhere\""),
        "{said}"
    );
    // (Its cost is unknown, so no budget warning here; one whose worst case
    // is known and above its budget gets one.)
    let over = json!({"job_id": "over", "budget": {"cost_limit_micro_usd": 50},
        "tasks": [
            {"id": "a", "agent": {"capability": "text.count", "input": {"text": "a"}}},
            {"id": "b", "depends_on": ["a"], "agent": {"capability": "text.count", "input": {"text": "b"}}}]});
    let warned = warnings(&mut c, &over).await;
    assert_eq!(
        warned,
        [
            "budget.cost_limit: the worst case is 60 micro-USD, above the job's 50: the job would pause for an extension before it finishes"
        ]
    );
    // Nothing was made: no job, no run.
    let e = c
        .get_job(switchyard_proto::executor::v1::GetJobRequest {
            job_id: "doomed".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // A job that fits says nothing of the kind.
    let fine = json!({"job_id": "fine", "budget": {"cost_limit_micro_usd": 100},
        "tasks": [{"id": "a", "agent": {"capability": "text.count", "input": {"text": "a"}}}]});
    let warned = warnings(&mut c, &fine).await;
    assert!(warned.is_empty(), "{warned:?}");
    // The budget a job names as its parent: too little left is said; one
    // the caller may not draw on is said too (the submission would be
    // refused), without telling what it holds.
    let mut ledger = switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        s.channel_as("admin").await.unwrap(),
    );
    for (id, shared) in [("team", "role:submitter"), ("private", "nobody")] {
        ledger
            .create_budget(switchyard_proto::ledger::v1::CreateBudgetRequest {
                budget_id: id.into(),
                cost_limit: Some(switchyard_proto::common::v1::Money { micro_usd: 45 }),
                labels: [("shared_with".to_owned(), shared.to_owned())].into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let under = |parent: &str| {
        json!({"job_id": "under", "budget": {"parent_budget_id": parent},
            "tasks": [
                {"id": "a", "agent": {"capability": "text.count", "input": {"text": "a"}}},
                {"id": "b", "depends_on": ["a"], "agent": {"capability": "text.count", "input": {"text": "b"}}}]})
    };
    let warned = warnings(&mut c, &under("team")).await;
    assert_eq!(
        warned,
        [
            "budget \"team\" has 45 micro-USD left, less than the worst case of 60: the job would pause for an extension when it runs out"
        ]
    );
    let warned = warnings(&mut c, &under("private")).await;
    assert_eq!(
        warned,
        [
            "budget.parent_budget_id: budget \"private\" is not one you may draw on: the submission would be refused"
        ]
    );
    trigger.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}

/// Run `run_id`'s decision receipt, read as bob, once it verifies with
/// the key the server gives; and that key.
async fn verified_receipt(s: &Stack, run_id: &str) -> (switchyard_kit::receipt::Receipt, String) {
    let r = approvals_as(s, "bob")
        .await
        .get_receipt(GetReceiptRequest {
            run_id: run_id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    let receipt: switchyard_kit::receipt::Receipt = serde_json::from_str(&r.receipt_json).unwrap();
    assert_eq!(
        switchyard_kit::receipt::verify(&receipt, Some(&r.public_key)),
        Ok(())
    );
    (receipt, r.public_key)
}

/// Approves job `job_id`'s run as bob up to `micro_usd` (the rest of the
/// scope from the estimate).
async fn approve_up_to(s: &Stack, c: &mut Jobs, job_id: &str, micro_usd: i64) -> Run {
    let run_id = job(c, job_id).await.run_id;
    approvals_as(s, "bob")
        .await
        .approve(ApproveRequest {
            run_id,
            comment: "up to a scope".into(),
            edit: None,
            scope: Some(switchyard_proto::approval::v1::ApprovalScope {
                tokens: 100_000,
                cost: Some(switchyard_proto::common::v1::Money { micro_usd }),
                until: None,
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
}

/// A team budget of 200 micro-USD that dana's jobs may nest under.
async fn team(s: &Stack) {
    let mut ledger = LedgerServiceClient::new(s.channel_as("admin").await.unwrap());
    ledger
        .create_budget(switchyard_proto::ledger::v1::CreateBudgetRequest {
            budget_id: "team".into(),
            cost_limit: Some(switchyard_proto::common::v1::Money { micro_usd: 200 }),
            labels: [("shared_with".to_owned(), "dana".to_owned())].into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Waits until budget `id` holds `reserved` micro-USD (a job's end releases
/// its holds through its outbox, just after the job ends).
async fn until_reserved(
    s: &Stack,
    id: &str,
    reserved: i64,
) -> switchyard_proto::ledger::v1::Budget {
    let mut ledger = LedgerServiceClient::new(s.channel_as("admin").await.unwrap());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let b = budget(&mut ledger, id).await;
        if b.cost_reserved.map_or(0, |m| m.micro_usd) == reserved {
            return b;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "budget {id} never held {reserved}: {b:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_approval_up_to_a_scope_holds_the_money_so_nothing_else_can_take_it() {
    let (s, mut c, _) = stack().await;
    team(&s).await;
    // 30 micro-USD a call, three calls: 90 in all.
    let (trigger, agent) = serve_priced_agent(&s, "priced", "text.count", 30, Counting(1));
    wait_routed(&s, "text.count").await;
    let doc = chain("held", json!({"parent_budget_id": "team"}));
    let j = submit(&mut c, &doc).await.unwrap();
    assert_eq!(j.state, JobState::Pending as i32, "a person decides: {j:?}");
    // Approving places the hold before any step runs: 100, of which the
    // job will spend 90.
    let run = approve_up_to(&s, &mut c, "held", 100).await;
    let scope = run.scope.unwrap();
    assert_eq!(
        (scope.tokens, scope.cost.unwrap().micro_usd),
        (100_000, 100),
        "{run:?}"
    );
    assert!(scope.until.is_some(), "a scope always has an end: {run:?}");
    let held = until_event(&mut c, "held", "budget.scope_held").await;
    assert_eq!(held["cost_micro_usd"], 100, "{held}");
    let hold = held["reservation_id"].as_str().unwrap().to_owned();
    assert!(!hold.is_empty(), "{held}");
    // Someone else takes everything else the team has, at once: the held
    // 100 is not theirs to take.
    let mut ledger = LedgerServiceClient::new(s.channel().await.unwrap());
    let reserve = |micro_usd: i64, key: &str| switchyard_proto::ledger::v1::ReserveRequest {
        budget_id: "team".into(),
        cost: Some(switchyard_proto::common::v1::Money { micro_usd }),
        idempotency_key: key.into(),
        ..Default::default()
    };
    let greedy = ledger.reserve(reserve(101, "greedy")).await.unwrap_err();
    assert_eq!(reason_of(&greedy), "BUDGET_EXCEEDED", "{greedy:?}");
    ledger.reserve(reserve(100, "the-rest")).await.unwrap();
    // The approved job still does all it was approved for: every step
    // draws from its hold.
    let r = finish(&mut c, "held").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let j = job(&mut c, "held").await;
    assert_eq!(attempts(&j), vec![1, 1, 1]);
    // Spent 90; the hold's other 10 is released at the job's end, so the
    // team holds only the other reservation.
    let b = until_reserved(&s, "team", 100).await;
    assert_eq!(b.cost_spent.map(|m| m.micro_usd), Some(90), "{b:?}");
    // bob's receipt binds the hold he granted.
    let (receipt, key) = verified_receipt(&s, &run.run_id).await;
    assert_eq!(receipt.receipt["scope"]["hold"]["cost_micro_usd"], 100);
    let mut forged = receipt.clone();
    forged.receipt["scope"]["hold"]["cost_micro_usd"] = json!(9_000);
    assert!(switchyard_kit::receipt::verify(&forged, Some(&key)).is_err());
    trigger.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_job_that_spends_its_scope_pauses_and_an_approved_extension_holds_more_and_resumes_it() {
    let (s, mut c, _) = stack().await;
    team(&s).await;
    let (trigger, agent) = serve_priced_agent(&s, "priced", "text.count", 30, Counting(1));
    wait_routed(&s, "text.count").await;
    submit(
        &mut c,
        &chain("scoped", json!({"parent_budget_id": "team"})),
    )
    .await
    .unwrap();
    // Approved for two of its three steps.
    approve_up_to(&s, &mut c, "scoped", 60).await;
    let paused = until_event(&mut c, "scoped", "budget.paused").await;
    assert_eq!(paused["dimension"], "cost", "{paused}");
    let j = job(&mut c, "scoped").await;
    assert_eq!(j.state, JobState::BudgetPaused as i32, "{j:?}");
    assert!(j.error.contains("approved scope"), "{}", j.error);
    assert_eq!(
        states(&j),
        vec![
            TaskState::Succeeded,
            TaskState::Succeeded,
            TaskState::BudgetPaused
        ]
    );
    assert_eq!(paused["cost_micro_usd"], 30, "the refused step: {paused}");
    // bob grants more than asked (45 instead of 30): a new hold of 45, and
    // only c runs again. An extension's scope has no end of its own.
    let extension = paused["run_id"].as_str().unwrap().to_owned();
    let grant = |until: Option<prost_types::Timestamp>| ApproveRequest {
        run_id: extension.clone(),
        comment: "take a little more".into(),
        edit: None,
        scope: Some(switchyard_proto::approval::v1::ApprovalScope {
            tokens: 0,
            cost: Some(switchyard_proto::common::v1::Money { micro_usd: 45 }),
            until,
        }),
    };
    let bob = approvals_as(&s, "bob").await;
    let e = bob
        .clone()
        .approve(grant(Some(prost_types::Timestamp {
            seconds: 4_000_000_000,
            nanos: 0,
        })))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    bob.clone().approve(grant(None)).await.unwrap();
    let r = finish(&mut c, "scoped").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let j = job(&mut c, "scoped").await;
    assert_eq!(attempts(&j), vec![1, 1, 2], "no finished task ran again");
    let p = j.budget_pause.clone().unwrap();
    assert_eq!(
        (p.decision.as_str(), p.granted_cost.map(|m| m.micro_usd)),
        ("approved", Some(45)),
        "{p:?}"
    );
    let held: Vec<Value> = events_of(&mut c, "scoped", "budget.scope_held")
        .await
        .iter()
        .map(|h| h["cost_micro_usd"].clone())
        .collect();
    assert_eq!(
        held,
        vec![json!(60), json!(45)],
        "the approval's, then the extension's"
    );
    // Both holds are gone once the job ends (the second's unspent 15
    // too): the team holds nothing.
    let b = until_reserved(&s, "team", 0).await;
    assert_eq!(b.cost_spent.map(|m| m.micro_usd), Some(90), "{b:?}");
    // A scope is for a job's run: an extension's or a bad amount is refused.
    let e = approvals_as(&s, "bob")
        .await
        .approve(ApproveRequest {
            run_id: j.run_id.clone(),
            comment: String::new(),
            edit: None,
            scope: Some(switchyard_proto::approval::v1::ApprovalScope {
                tokens: 0,
                cost: Some(switchyard_proto::common::v1::Money { micro_usd: -1 }),
                until: None,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    trigger.fire();
    let _ = agent.await;
    s.stop().await.unwrap();
}
