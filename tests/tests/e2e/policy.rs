//! Policy as code end to end: a `[policy] dir` of Cedar files decides
//! submissions, spends and each tool call in-process, and a broken change
//! of the files is refused while the set in force stays.

use serde_json::{Value, json};
use switchyard_llm::scripted::Reply;
use switchyard_proto::approval::v1::{ApproveRequest, RunStatus};
use switchyard_proto::executor::v1::{GetJobRequest, JobState, ValidateJobRequest};
use tonic::Code;

use crate::common::{approve_as, awaiting_call, finish, id, new_approver, run_of, submit};
use crate::llm::{Provider, env, provide, task};
use crate::tool_approval::pending_calls;

const POLICIES: &str = r#"
@id("freeze") @message("releases are frozen: submit after the freeze")
forbid(principal, action == Action::"submit_job", resource)
  when { resource.hasTag("freeze") && resource.getTag("freeze") == "yes" };

@id("no-secrets") @message("searching for secrets is not allowed")
forbid(principal, action == Action::"call_tool", resource == Tool::"search")
  when { resource.hasTag("q") && resource.getTag("q") like "*secret*" };

@id("prod-repos-two-approvers") @approvers("2") @message("production repositories need two people")
permit(principal, action == Action::"call_tool", resource == Tool::"delete_repo")
  when { resource.hasTag("repo") && resource.getTag("repo") like "prod-*" };
"#;

/// A job whose model may call search, delete_repo and notes, none gated by
/// the job itself: what waits for people is the policies' doing.
fn ungated_job(job_id: &str, model: &str, labels: Value) -> String {
    json!({
        "job_id": job_id,
        "labels": labels,
        "tasks": [{"id": "fix", "llm": {
            "model": model, "prompt": "tidy the repos", "max_tokens": 50,
            "tools": [{"name": "search"}, {"name": "delete_repo"}, {"name": "notes"}]
        }}]
    })
    .to_string()
}

fn policy_dir(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("team.cedar"), text).expect("the policy file written");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_forbid_a_submission_a_tool_call_by_its_arguments_and_ask_two_people_for_another()
{
    let dir = policy_dir(POLICIES);
    let path = dir.path().to_owned();
    let mut e = env(true, move |c| c.policy.dir = Some(path)).await;
    let provider = Provider::default();
    let _stop = provide(
        &e.stack,
        provider.clone(),
        &["search", "delete_repo", "notes"],
    )
    .await;

    // A submission the policies forbid: refused, nothing made, and the dry
    // run says the same before anyone submits.
    let frozen = ungated_job("frozen", "m-policy", json!({"freeze": "yes"}));
    let v = e
        .jobs
        .validate_job(ValidateJobRequest {
            document: frozen.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (v.policies[0].action.as_str(), v.policies[0].effect.as_str()),
        ("submit_job", "forbid")
    );
    assert_eq!(
        v.policies[0].explanation,
        "forbidden by freeze: releases are frozen: submit after the freeze"
    );
    assert_eq!(
        v.policies[1].explanation,
        "auto-approved by up-to-10-dollars"
    );
    let refused = submit(&mut e.jobs, &frozen).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("forbidden by freeze"),
        "{}",
        refused.message()
    );
    let info = switchyard_kit::error::ApiError::from(refused);
    assert_eq!(info.reason.as_deref(), Some("POLICY_FORBIDDEN"));
    let gone = e
        .jobs
        .get_job(GetJobRequest {
            job_id: "frozen".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        gone.code(),
        Code::NotFound,
        "a forbidden job leaves nothing"
    );

    // The model searches for secrets (forbidden: it never runs and nobody
    // is asked) and deletes a production repository (two people decide).
    e.script.for_model(
        "m-policy",
        vec![
            Reply::tools(
                &[
                    ("search", json!({"q": "the secret plans"})),
                    ("delete_repo", json!({"repo": "prod-api"})),
                ],
                40,
                10,
            ),
            Reply::text("done", 80, 20),
        ],
    );
    let job = submit(
        &mut e.jobs,
        &ungated_job("tidy", "m-policy", json!({"env": "prod"})),
    )
    .await
    .unwrap();
    let waiting = awaiting_call(&mut e.jobs, &e.stack, "tidy").await;
    let run_id = waiting["run_id"].as_str().unwrap().to_owned();
    let run = pending_calls(&e.stack, "bob")
        .await
        .into_iter()
        .find(|r| r.run_id == run_id)
        .expect("the call's run is in bob's list");
    let call = run.tool_call.clone().unwrap();
    assert_eq!(call.tool, "delete_repo");
    let p = run.policy.clone().unwrap();
    assert_eq!(
        (p.effect.as_str(), p.approvals_required, p.policies.clone()),
        ("require", 2, vec!["prod-repos-two-approvers".to_owned()])
    );
    assert_eq!(run.labels.get("env").map(String::as_str), Some("prod"));
    assert!(provider.calls().is_empty(), "nothing ran yet");
    assert_eq!(pending_calls(&e.stack, "bob").await.len(), 1);

    // One approval is not enough; a second person's is.
    let bob = approve_as(&e.stack, "bob", &run_id).await.unwrap();
    assert_eq!(bob.status, RunStatus::Proposed as i32);
    assert!(
        provider.calls().is_empty(),
        "one approval of two runs nothing"
    );
    new_approver(&e.stack, "dave")
        .await
        .approve(ApproveRequest {
            run_id: run_id.clone(),
            comment: "second".into(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap();
    let r = finish(&mut e.jobs, &id(&job)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let t = task(&r, "fix");
    let results: Vec<(&str, &str)> = t
        .tool_results
        .iter()
        .map(|t| (t.name.as_str(), t.reason.as_str()))
        .collect();
    assert_eq!(
        results,
        [("search", "POLICY_FORBIDDEN"), ("delete_repo", "")]
    );
    assert!(
        t.tool_results[0]
            .error
            .contains("forbidden by no-secrets: searching for secrets is not allowed"),
        "{:?}",
        t.tool_results[0]
    );
    assert_eq!(
        provider.calls(),
        ["delete_repo"],
        "the forbidden search never reached its provider"
    );
    e.stack.stop().await.unwrap();
}

/// The process's count of policy loads ending `outcome` (other tests'
/// stacks may add to it, never take away).
fn loads(outcome: &str) -> u64 {
    let text = switchyard_kit::metrics::global().render();
    let series = format!("switchyard_policy_loads_total{{outcome=\"{outcome}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// Waits (bounded, on the count itself) until loads ending `outcome` pass
/// `before`.
async fn until_loads(outcome: &str, before: u64) {
    for _ in 0..500 {
        if loads(outcome) > before {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("no policy load ended {outcome} within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_policy_change_is_refused_and_the_set_in_force_keeps_deciding() {
    let dir = policy_dir(POLICIES);
    let path = dir.path().to_owned();
    let mut e = env(true, move |c| {
        c.policy.dir = Some(path);
        c.policy.reload_ms = 20;
    })
    .await;
    let frozen = ungated_job("frozen-2", "m-policy", json!({"freeze": "yes"}));

    // A change that does not type-check: refused and counted; the set in
    // force (with the freeze) keeps deciding.
    let refused = loads("refused");
    std::fs::write(
        dir.path().join("broken.cedar"),
        r#"forbid(principal, action == Action::"spend", resource) when { context.estimate.dollars > 1 };"#,
    )
    .unwrap();
    until_loads("refused", refused).await;
    let still = submit(&mut e.jobs, &frozen).await.unwrap_err();
    assert!(still.message().contains("forbidden by freeze"), "{still:?}");

    // Fixed: the new set replaces it (here, without the freeze).
    let loaded = loads("loaded");
    std::fs::remove_file(dir.path().join("broken.cedar")).unwrap();
    std::fs::write(dir.path().join("team.cedar"), "").unwrap();
    until_loads("loaded", loaded).await;
    let job = submit(&mut e.jobs, &frozen).await.unwrap();
    assert_eq!(id(&job), "frozen-2");
    e.stack.stop().await.unwrap();
}

/// The inbox says why a run waits (the policy and its words, the set's
/// version) and flags each budget its estimate does not fit in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_says_why_a_run_waits_and_flags_the_budget_its_estimate_does_not_fit() {
    let dir = policy_dir(
        r#"@id("gpt4o-two") @approvers("2") @message("gpt-4o spends need two people")
permit(principal, action == Action::"spend", resource == Model::"gpt-4o");"#,
    );
    let path = dir.path().to_owned();
    let mut e = env(false, move |c| c.policy.dir = Some(path)).await;
    let mut ledger = switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        e.stack.channel_as("admin").await.expect("a channel"),
    );
    ledger
        .create_budget(switchyard_proto::ledger::v1::CreateBudgetRequest {
            budget_id: "tight".into(),
            cost_limit: Some(switchyard_proto::common::v1::Money { micro_usd: 20 }),
            labels: [("shared_with".to_owned(), "role:submitter".to_owned())].into(),
            ..Default::default()
        })
        .await
        .expect("a budget");
    let doc = json!({
        "job_id": "why-1",
        "budget": {"parent_budget_id": "tight"},
        "tasks": [{"id": "ask", "llm": {"model": "gpt-4o", "prompt": "hello", "max_tokens": 20}}]
    })
    .to_string();
    submit(&mut e.jobs, &doc).await.expect("submitted");
    let run = run_of(&e.stack, "run-why-1").await;
    assert_eq!(run.policy.as_ref().map(|p| p.approvals_required), Some(2));

    let base = format!("http://{}", e.stack.http.expect("the gateway's HTTP door"));
    let bob = e
        .stack
        .session(&e.stack.token("bob").expect("bob's token"))
        .await
        .expect("bob's console session");
    let (code, page) =
        crate::console::as_session(&crate::console::client(), &base, "GET", "/ui/", &bob, &[])
            .await;
    assert_eq!(code, 200);
    assert!(page.contains("Why it waits"), "{page}");
    assert!(
        page.contains(
            "needs 2 distinct approvers because of gpt4o-two: gpt-4o spends need two people"
        ),
        "{page}"
    );
    // "tight" ($0.000020) cannot hold the estimate ($0.002425): said on
    // its line of the budget chain (the card's lead names it too).
    let tight = page
        .find("<code>tight</code></a>")
        .expect("the tight budget is in the chain");
    let line = &page[tight..tight + page[tight..].find("</p>").unwrap_or(0)];
    assert!(
        line.contains("does not fit: $0.002425 asked, $0.00002 left"),
        "{line}"
    );
    e.stack.stop().await.expect("stopped");
}

/// `context.remaining` is what the budget a job draws on has left, read
/// by the platform: a spend small beside it is approved at once, the same
/// spend against a slimmer budget waits for a person, and a budget nearly
/// spent refuses the submission. The ValidateJob dry run says the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_decide_on_what_the_budget_has_left() {
    let dir = policy_dir(
        r#"@id("small-share") permit(principal, action == Action::"spend", resource)
  when { context.remaining.known && context.estimate.micro_usd * 10 <= context.remaining.micro_usd };
@id("nearly-spent") @message("the team budget is nearly spent")
forbid(principal, action == Action::"submit_job", resource)
  when { context.remaining.known && context.remaining.micro_usd < 1000 };"#,
    );
    let path = dir.path().to_owned();
    let mut e = env(false, move |c| c.policy.dir = Some(path)).await;
    let mut ledger = switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        e.stack.channel_as("admin").await.expect("a channel"),
    );
    for (id, micro_usd) in [("roomy", 1_000_000), ("slim", 20_000), ("spent", 500)] {
        ledger
            .create_budget(switchyard_proto::ledger::v1::CreateBudgetRequest {
                budget_id: id.into(),
                cost_limit: Some(switchyard_proto::common::v1::Money { micro_usd }),
                labels: [("shared_with".to_owned(), "role:submitter".to_owned())].into(),
                ..Default::default()
            })
            .await
            .expect("a budget");
    }
    // Each estimated at $0.002425 (gpt-4o, 20 tokens out).
    let doc = |job: &str, budget: &str| {
        json!({
            "job_id": job,
            "budget": {"parent_budget_id": budget},
            "tasks": [{"id": "ask", "llm": {"model": "gpt-4o", "prompt": "hello", "max_tokens": 20}}]
        })
        .to_string()
    };
    let v = e
        .jobs
        .validate_job(ValidateJobRequest {
            document: doc("left-roomy", "roomy"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.policies[1].explanation, "auto-approved by small-share");
    submit(&mut e.jobs, &doc("left-roomy", "roomy"))
        .await
        .expect("submitted");
    let run = run_of(&e.stack, "run-left-roomy").await;
    assert_eq!(run.decided_by, "policy:small-share");

    submit(&mut e.jobs, &doc("left-slim", "slim"))
        .await
        .expect("submitted");
    let run = run_of(&e.stack, "run-left-slim").await;
    assert_eq!(run.status, RunStatus::Proposed as i32, "{run:?}");
    assert_eq!(run.policy.map(|p| p.effect).as_deref(), Some("default"));

    let refused = submit(&mut e.jobs, &doc("left-spent", "spent"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.message(),
        "forbidden by nearly-spent: the team budget is nearly spent"
    );
    e.stack.stop().await.expect("stopped");
}

/// Nesting a budget is an action too: a policy forbids nesting under
/// `acme` without a money limit, whoever asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_forbids_nesting_a_budget_without_a_money_limit() {
    use switchyard_proto::ledger::v1::CreateBudgetRequest;
    let dir = policy_dir(
        r#"@id("acme-money-limits") @message("budgets under acme need a money limit")
forbid(principal, action == Action::"nest_budget", resource)
  when { resource.parent == "acme" && !context.estimate.priced };"#,
    );
    let path = dir.path().to_owned();
    let e = env(true, move |c| c.policy.dir = Some(path)).await;
    let mut ledger = switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        e.stack.channel_as("admin").await.expect("a channel"),
    );
    let create = |id: &str, parent: &str, usd: Option<i64>| CreateBudgetRequest {
        budget_id: id.into(),
        parent_id: parent.into(),
        cost_limit: usd.map(|micro_usd| switchyard_proto::common::v1::Money { micro_usd }),
        token_limit: Some(1_000),
        ..Default::default()
    };
    ledger
        .create_budget(create("acme", "", None))
        .await
        .expect("a root is not nested");
    let refused = ledger
        .create_budget(create("acme/free", "acme", None))
        .await
        .expect_err("forbidden");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(
        refused.message(),
        "forbidden by acme-money-limits: budgets under acme need a money limit"
    );
    let info = switchyard_kit::error::ApiError::from(refused);
    assert_eq!(info.reason.as_deref(), Some("POLICY_FORBIDDEN"));
    ledger
        .create_budget(create("acme/capped", "acme", Some(1_000_000)))
        .await
        .expect("a money limit may nest");
    let gone = ledger
        .get_budget(switchyard_proto::ledger::v1::GetBudgetRequest {
            budget_id: "acme/free".into(),
        })
        .await
        .expect_err("never made");
    assert_eq!(gone.code(), Code::NotFound);
    e.stack.stop().await.expect("stopped");
}

/// The set jobs ran under in the replay test: spends and tool calls go
/// ahead.
const OPEN: &str = r#"
@id("spend-ok") permit(principal, action == Action::"spend", resource);
@id("tools-ok") permit(principal, action == Action::"call_tool", resource);
"#;

/// A stricter set: the web team's spend needs a person, deleting a
/// production repository two, and notes are forbidden.
const STRICTER: &str = r#"
@id("spend-ok") permit(principal, action == Action::"spend", resource);
@id("tools-ok") permit(principal, action == Action::"call_tool", resource);
@id("web-spend-needs-a-person") @approval("required")
permit(principal, action == Action::"spend", resource)
  when { context.job.hasTag("team") && context.job.getTag("team") == "web" };
@id("prod-two") @approvers("2")
permit(principal, action == Action::"call_tool", resource == Tool::"delete_repo")
  when { resource.hasTag("repo") && resource.getTag("repo") like "prod-*" };
@id("no-notes") @message("notes are kept elsewhere now")
forbid(principal, action == Action::"call_tool", resource == Tool::"notes");
"#;

/// Each job's replay under `set`, from the journals `ExportJournal` gives.
async fn replays(
    s: &switchyard_testkit::Stack,
    set: &switchyard_policy::PolicySet,
    jobs: &[&str],
) -> Vec<(String, String)> {
    let mut c = switchyard_proto::executor::v1::job_service_client::JobServiceClient::new(
        s.channel_as("admin").await.expect("an admin's channel"),
    );
    let mut out = Vec::new();
    for job in jobs {
        let x = c
            .export_journal(switchyard_proto::executor::v1::ExportJournalRequest {
                job_id: (*job).into(),
            })
            .await
            .expect("the job's journal exported")
            .into_inner();
        let r = switchyard_executor::audit::replay_journal(set, &x.events);
        let text = serde_json::to_string(&r).expect("a replay encodes");
        out.push(((*job).to_owned(), text));
    }
    out
}

fn load(text: &str) -> switchyard_policy::PolicySet {
    switchyard_policy::PolicySet::load(&[switchyard_policy::Source {
        name: "team.cedar".into(),
        text: text.into(),
    }])
    .expect("the test's policies load")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_recorded_jobs_under_a_stricter_set_names_each_difference_and_the_same_set_none()
{
    let policies = policy_dir(OPEN);
    let data = tempfile::tempdir().unwrap();
    let (p, d) = (policies.path().to_owned(), data.path().to_owned());
    let mut e = env(false, move |c| {
        c.policy.dir = Some(p);
        c.storage.data_dir = d;
    })
    .await;
    let provider = Provider::default();
    let _stop = provide(
        &e.stack,
        provider.clone(),
        &["search", "delete_repo", "notes"],
    )
    .await;
    e.script.for_model(
        "m-web",
        vec![
            Reply::tools(
                &[
                    ("delete_repo", json!({"repo": "prod-api"})),
                    ("notes", json!({"q": "what was removed"})),
                ],
                40,
                10,
            ),
            Reply::text("done", 80, 20),
        ],
    );
    e.script.for_model(
        "m-data",
        vec![
            Reply::tools(&[("delete_repo", json!({"repo": "scratch"}))], 40, 10),
            Reply::text("done", 80, 20),
        ],
    );
    for (job, model, team) in [("web-1", "m-web", "web"), ("data-1", "m-data", "data")] {
        submit(&mut e.jobs, &ungated_job(job, model, json!({"team": team})))
            .await
            .unwrap();
        let r = finish(&mut e.jobs, job).await;
        assert_eq!(r.state, JobState::Completed as i32, "{job}: {r:?}");
    }
    assert_eq!(provider.calls(), ["delete_repo", "notes", "delete_repo"]);
    let jobs = ["web-1", "data-1"];

    // Under the set they ran under: every recorded decision again as it
    // was (submission, spend, each tool call).
    let open = load(OPEN);
    for (job, r) in replays(&e.stack, &open, &jobs).await {
        let r: Value = serde_json::from_str(&r).unwrap();
        assert_eq!(r["differences"], json!([]), "{job}: {r}");
        assert!(r["unreadable"].as_array().unwrap().is_empty(), "{job}: {r}");
        let n = r["decisions"].as_u64().unwrap();
        assert_eq!(n, if job == "web-1" { 4 } else { 3 }, "{job}: {r}");
    }

    // Under the stricter one: the web job's spend would need a person, its
    // production delete two, its notes would be refused; the data team's
    // job (a scratch repository) would fare as it did.
    let strict = load(STRICTER);
    let first = replays(&e.stack, &strict, &jobs).await;
    let web: Value = serde_json::from_str(&first[0].1).unwrap();
    let seen: Vec<(&str, &str, &str, Value)> = web["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["action"].as_str().unwrap(),
                d["resource"].as_str().unwrap(),
                d["change"].as_str().unwrap(),
                d["now"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "spend",
                "m-web",
                "now_needs_approval",
                json!({"outcome": "needs_people", "approvers": 1})
            ),
            (
                "call_tool",
                "delete_repo",
                "now_needs_approval",
                json!({"outcome": "needs_people", "approvers": 2})
            ),
            (
                "call_tool",
                "notes",
                "now_forbidden",
                json!({"outcome": "forbidden"})
            ),
        ],
        "{web}"
    );
    assert_eq!(web["differences"][2]["now_by"], json!(["no-notes"]));
    assert_eq!(web["differences"][1]["task_id"], "fix");
    let data_job: Value = serde_json::from_str(&first[1].1).unwrap();
    assert_eq!(data_job["differences"], json!([]), "{data_job}");

    // Deterministic: again, and over a restored copy of the data.
    assert_eq!(replays(&e.stack, &strict, &jobs).await, first);
    e.stack.stop().await.unwrap();
    let copy = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", data.path().display()))
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(status.success());
    let (p, d) = (policies.path().to_owned(), copy.path().to_owned());
    let restored = env(false, move |c| {
        c.policy.dir = Some(p);
        c.storage.data_dir = d;
    })
    .await;
    assert_eq!(replays(&restored.stack, &strict, &jobs).await, first);
    restored.stack.stop().await.unwrap();
}
