use super::*;
use crate::adapter::Adapter as _;
use switchyard_core::ManualClock;
use switchyard_kit::error::ApiError;
use switchyard_proto::common::v1::Money;

struct Fixture {
    svc: Approval,
    clock: ManualClock,
    _trigger: switchyard_kit::shutdown::Trigger,
}

/// The store at `path`, opened again after a drop in this process.
async fn reopen(path: &std::path::Path) -> Store {
    Store::reopen(path, std::time::Duration::from_secs(5))
        .await
        .unwrap()
}

fn fixture_on(store: Store, clock: ManualClock) -> Fixture {
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let svc = Approval::open(
        ApprovalConfig::default(),
        store,
        Arc::new(clock.clone()),
        shutdown,
    )
    .unwrap();
    Fixture {
        svc,
        clock,
        _trigger: trigger,
    }
}

fn fixture() -> Fixture {
    fixture_on(
        Store::temporary().unwrap(),
        ManualClock::new(1_700_000_000_000),
    )
}

/// An approval service on a fresh database of the shared throwaway
/// PostgreSQL cluster, or `None` (said on stderr) when the run skips
/// PostgreSQL.
async fn pg_fixture() -> Option<Fixture> {
    let url = switchyard_testkit::pg::fresh_database()?;
    Some(pg_replica(&url, &ManualClock::new(1_700_000_000_000)).await)
}

/// An approval replica on database `url` with `clock`.
async fn pg_replica(url: &str, clock: &ManualClock) -> Fixture {
    let db = switchyard_store::pg::Pg::connect(&switchyard_store::pg::PgConfig {
        url: url.to_owned(),
        pool_size: 4,
        ..Default::default()
    })
    .await
    .unwrap();
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let svc = Approval::open_pg(
        ApprovalConfig::default(),
        db,
        Arc::new(clock.clone()),
        shutdown,
    )
    .await
    .unwrap();
    Fixture {
        svc,
        clock: clock.clone(),
        _trigger: trigger,
    }
}

switchyard_testkit::on_both_backends!(
    fixture, pg_fixture;
    every_status_and_action_follows_the_seed_table_with_deterministic_reasons,
    the_creator_cannot_approve_and_decisions_need_an_actor,
    the_default_policy_approves_only_zero_cost_runs,
    skip_policies_leaves_even_a_zero_cost_run_for_a_person,
    an_expired_claim_schedules_a_retry_with_backoff_until_retries_run_out,
    renewing_extends_the_lease_of_the_holder_only,
    the_prompt_bundle_is_deterministic_and_imports_check_the_context_hash,
    the_audit_log_records_every_action_in_order,
    proposals_are_validated_field_by_field,
    a_client_chosen_run_id_is_idempotent_for_the_same_spec_only,
    lists_put_pending_runs_first_filter_and_paginate,
    watch_streams_run_events_of_one_run,
    pruning_removes_runs_that_ended_past_retention_and_keeps_runs_in_flight,
    a_run_gets_its_adapter_manual_by_default_switchyard_for_a_job_and_none_for_a_call,
    a_publication_run_is_a_decision_bound_to_its_bytes_that_no_adapter_runs,
    the_manual_round_trip_keeps_the_pasted_result_as_an_artifact_fetched_byte_identical,
    a_pasted_result_of_a_kind_outside_outputs_allowed_is_refused_and_nothing_changes,
    a_pasted_result_named_like_a_path_is_refused_and_nothing_changes,
    an_ojs_run_without_an_ojs_server_fails_with_adapter_not_configured,
    a_proposal_approved_at_once_is_claimed_in_the_same_change_when_asked,
    cedar_policies_permit_require_people_or_forbid_a_run_and_say_which_and_why,
    a_policy_decides_delegations_by_their_depth,
    stored_policies_decide_once_the_whole_set_loads_and_stop_when_removed,
);

async fn stored_policies_decide_once_the_whole_set_loads_and_stop_when_removed(f: Fixture) {
    let engine =
        switchyard_policy::Engine::new(policy::sources(&ApprovalConfig::default().policies), None)
            .unwrap();
    f.svc.set_policies(engine.clone());
    engine.set_feed(f.svc.policy_feed());
    let before = engine.current().version().to_owned();
    let mut o1 = spec(Some(0));
    o1.model = "o1".into();
    // Free o1 runs are approved by the default rule.
    assert_eq!(
        status_of(&propose_run(&f.svc, o1.clone()).await.unwrap()),
        S::Approved
    );
    // A stored forbid decides at once, here.
    let (stored, version) = f
        .svc
        .put_policy(
            "no-o1",
            r#"@id("no-o1") @message("o1 is retired") forbid(principal, action == Action::"spend", resource == Model::"o1");"#,
            "service:ops",
        )
        .await
        .unwrap();
    assert_eq!(
        (stored.name.as_str(), stored.updated_by.as_str()),
        ("no-o1", "service:ops")
    );
    assert_ne!(version, before);
    assert_eq!(engine.current().version(), version);
    let run = propose_run(&f.svc, o1.clone()).await.unwrap();
    assert_eq!(
        (status_of(&run), run.decided_by.as_str()),
        (S::Rejected, "policy:no-o1")
    );
    assert_eq!(run.policy.unwrap().version, version);
    // A file that does not load with the rest is refused whole: not
    // stored, and the set in force stays.
    for broken in [
        "permit(principal, action == Action::\"fly\", resource);",
        r#"@id("no-o1") permit(principal, action == Action::"spend", resource);"#,
    ] {
        let e = api(f
            .svc
            .put_policy("broken", broken, "service:ops")
            .await
            .unwrap_err());
        assert_eq!(
            e.reason.as_deref(),
            Some("INVALID_ARGUMENT"),
            "{broken}: {e:?}"
        );
    }
    let bad_name = api(f
        .svc
        .put_policy("../etc", "", "service:ops")
        .await
        .unwrap_err());
    assert_eq!(bad_name.reason.as_deref(), Some("INVALID_ARGUMENT"));
    let listed = f.svc.stored_policies().await.unwrap();
    assert_eq!(
        listed.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["no-o1"]
    );
    assert_eq!(engine.current().version(), version);
    // Read again by another engine (another process: the same store), it
    // decides the same, under the same version.
    let other =
        switchyard_policy::Engine::new(policy::sources(&ApprovalConfig::default().policies), None)
            .unwrap();
    other.set_feed(f.svc.policy_feed());
    assert!(other.refresh().await.unwrap());
    assert_eq!(other.current().version(), version);
    // Removed, it decides nothing any more.
    let after = f.svc.delete_policy("no-o1", "service:ops").await.unwrap();
    assert_eq!(after, before);
    assert_eq!(
        status_of(&propose_run(&f.svc, o1).await.unwrap()),
        S::Approved
    );
    let gone = api(f
        .svc
        .delete_policy("no-o1", "service:ops")
        .await
        .unwrap_err());
    assert_eq!(gone.reason.as_deref(), Some("POLICY_NOT_FOUND"));
}

/// Policies in force on `f`: the default rule's, and `text`.
fn with_policies(f: &Fixture, text: &str) -> String {
    let mut sources = policy::sources(&ApprovalConfig::default().policies);
    sources.push(switchyard_policy::Source {
        name: "test.cedar".into(),
        text: text.into(),
    });
    let set = switchyard_policy::PolicySet::load(&sources).unwrap();
    let version = set.version().to_owned();
    f.svc.set_policies(switchyard_policy::Engine::fixed(set));
    version
}

async fn cedar_policies_permit_require_people_or_forbid_a_run_and_say_which_and_why(f: Fixture) {
    let version = with_policies(
        &f,
        r#"
@id("small-spend") permit(principal, action == Action::"spend", resource)
  when { context.estimate.priced && context.estimate.micro_usd <= 1000 };
@id("three-for-gpt5") @approvers("3") @message("gpt-5 spends above $0.01 need three people")
permit(principal, action == Action::"spend", resource == Model::"gpt-5")
  when { !context.estimate.priced || context.estimate.micro_usd > 10000 };
@id("no-prod-o1") @message("o1 is not used in production")
forbid(principal, action == Action::"spend", resource == Model::"o1")
  when { context.job.hasTag("env") && context.job.getTag("env") == "prod" };
"#,
    );
    // Permit: approved at once, in the policy's name, with the version.
    let run = propose(&f.svc, Some(500)).await;
    assert_eq!(status_of(&run), S::Approved);
    assert_eq!(run.decided_by, "policy:small-spend");
    let p = run.policy.clone().unwrap();
    assert_eq!(
        (p.effect.as_str(), p.version.as_str()),
        ("permit", version.as_str())
    );
    assert_eq!(p.explanation, "auto-approved by small-spend");

    // Require: three distinct people; the proposer is none of them.
    let run = propose(&f.svc, Some(50_000)).await;
    let p = run.policy.clone().unwrap();
    assert_eq!(
        (status_of(&run), p.effect.as_str(), p.approvals_required),
        (S::Proposed, "require", 3)
    );
    assert_eq!(
        p.explanation,
        "needs 3 distinct approvers because of three-for-gpt5: gpt-5 spends above $0.01 need three people"
    );
    for (n, who) in [REVIEWER, Some("@carol")].into_iter().enumerate() {
        let r = f
            .svc
            .decide(Action::Approve, &run.run_id, "", who)
            .await
            .unwrap();
        assert_eq!((status_of(&r), r.approved_by.len()), (S::Proposed, n + 1));
    }
    let again = api(f
        .svc
        .decide(Action::Approve, &run.run_id, "", Some("@carol"))
        .await
        .unwrap_err());
    assert_eq!(again.reason.as_deref(), Some("SECOND_APPROVAL_REQUIRED"));
    let r = f
        .svc
        .decide(Action::Approve, &run.run_id, "", Some("@dave"))
        .await
        .unwrap();
    assert_eq!(status_of(&r), S::Approved);
    assert_eq!(r.approved_by, ["@reviewer", "@carol", "@dave"]);

    // Forbid: rejected at once, with the reason and the policy's message.
    let mut o1 = spec(Some(1));
    o1.model = "o1".into();
    o1.labels = [("env".to_owned(), "prod".to_owned())].into();
    let run = propose_run(&f.svc, o1.clone()).await.unwrap();
    assert_eq!(status_of(&run), S::Rejected);
    assert_eq!(run.reason_code, "POLICY_FORBIDDEN");
    assert_eq!(run.decided_by, "policy:no-prod-o1");
    assert_eq!(
        run.last_error,
        "forbidden by no-prod-o1: o1 is not used in production"
    );
    let audit = audit_of(&f.svc, &run.run_id).await;
    let forbidden = audit
        .iter()
        .find(|a| a.event_type == "policy_forbidden")
        .unwrap();
    assert_eq!(forbidden.details["policy_version"], version);
    // The same run elsewhere is not forbidden (the label decides).
    o1.labels.clear();
    let run = propose_run(&f.svc, o1).await.unwrap();
    assert_eq!(status_of(&run), S::Approved);
}

async fn a_policy_decides_delegations_by_their_depth(f: Fixture) {
    with_policies(
        &f,
        r#"
@id("deep-delegation") @approval("required") @message("delegations deeper than 2 need a person")
permit(principal, action == Action::"delegate", resource) when { context.depth > 2 };
"#,
    );
    let mut parent = approved(&f.svc).await;
    let mut depths = Vec::new();
    for n in 1..=3 {
        f.svc.claim(claim_req(&parent, "worker", 60)).await.unwrap();
        let mut child = spec(Some(5));
        child.run_id = format!("child-{n}");
        let req = ProposeRequest {
            run: Some(child),
            approved_under: parent.clone(),
            ..Default::default()
        };
        let out = f.svc.propose(req, Some("@you".into())).await.unwrap();
        let run = out.run.unwrap();
        let p = run.policy.clone().unwrap();
        depths.push((p.delegation_depth, status_of(&run), p.effect));
        if status_of(&run) == S::Proposed {
            f.svc
                .decide(Action::Approve, &run.run_id, "", REVIEWER)
                .await
                .unwrap();
        }
        parent = run.run_id;
    }
    assert_eq!(
        depths,
        [
            (1, S::Approved, "default".to_owned()),
            (2, S::Approved, "default".to_owned()),
            (3, S::Proposed, "require".to_owned()),
        ]
    );
}

const HASH: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// The seed's example run, with a cost estimate.
fn spec(cost: Option<i64>) -> Run {
    Run {
        schema_version: "agent_run_spec/v1".into(),
        created_by: "@you".into(),
        target: Some(Target {
            org: "phys-sims".into(),
            repo: "pm-bot".into(),
            work_item_ids: vec!["feat:contracts".into()],
        }),
        intent: "Draft docs/contracts pages and examples".into(),
        context_pack: Some(ContextPack {
            pack_id: "cp_0009".into(),
            hash: HASH.into(),
            version: "context_pack/v1".into(),
            inputs: vec!["feat:contracts".into()],
        }),
        model: "gpt-5".into(),
        max_tokens: 12_000,
        temperature: Some(0.2),
        cost_estimate: cost.map(|c| CostEstimate {
            estimated_input_tokens: 8_000,
            estimated_output_tokens: 4_000,
            estimated_cost: Some(Money { micro_usd: c }),
        }),
        tools_allowed: vec!["filesystem_read".into()],
        outputs_allowed: vec!["propose_changeset_bundle".into(), "propose_pr".into()],
        correlation_id: "corr-7".into(),
        ..Default::default()
    }
}

async fn propose(svc: &Approval, cost: Option<i64>) -> Run {
    propose_run(svc, spec(cost)).await.unwrap()
}

/// A run proposed as `@you` and approved by the reviewer; its id.
async fn approved(svc: &Approval) -> String {
    let id = propose(svc, Some(100)).await.run_id;
    svc.decide(Action::Approve, &id, "ok", REVIEWER)
        .await
        .unwrap();
    id
}

/// Proposes `run` as `@you`; the stored run.
async fn propose_run(svc: &Approval, run: Run) -> Result<Run, ApprovalError> {
    let req = ProposeRequest {
        run: Some(run),
        ..Default::default()
    };
    Ok(svc
        .propose(req, Some("@you".into()))
        .await?
        .run
        .unwrap_or_default())
}

/// The audit records of run `id`, in order.
async fn audit_of(svc: &Approval, id: &str) -> Vec<AuditRecord> {
    svc.list_audit(&ListAuditRequest {
        run_id: id.to_owned(),
        ..Default::default()
    })
    .await
    .unwrap()
    .records
}

impl Approval {
    /// How many runs the sled backend holds in memory.
    fn sled_runs_in_memory(&self) -> usize {
        match &self.inner.backend {
            Backend::Sled(s) => s.lock().runs.sled().map_or(0, Runs::in_memory),
            Backend::Pg(_) => panic!("not a sled approval service"),
        }
    }
}

fn api(e: ApprovalError) -> ApiError {
    ApiError::from(Status::from(e))
}

const REVIEWER: Option<&str> = Some("@reviewer");

fn claim_req(id: &str, worker: &str, lease_secs: u32) -> ClaimRequest {
    ClaimRequest {
        run_id: id.into(),
        worker_id: worker.into(),
        lease_secs,
    }
}

/// Drives a new run into `status` through the public operations.
async fn run_in(svc: &Approval, status: S) -> String {
    let id = propose(svc, Some(1_000)).await.run_id;
    let approve = async || {
        svc.decide(Action::Approve, &id, "ok", REVIEWER)
            .await
            .unwrap()
    };
    let claim = async || svc.claim(claim_req(&id, "w1", 60)).await.unwrap();
    match status {
        S::Proposed => {}
        S::Approved => {
            approve().await;
        }
        S::Rejected => {
            svc.decide(Action::Reject, &id, "no", REVIEWER)
                .await
                .unwrap();
        }
        S::Cancelled => {
            svc.decide(Action::Cancel, &id, "stop", REVIEWER)
                .await
                .unwrap();
        }
        S::Running | S::Completed | S::Failed => {
            approve().await;
            claim().await;
            if status == S::Completed {
                svc.complete(CompleteRequest {
                    run_id: id.clone(),
                    worker_id: "w1".into(),
                    result: None,
                })
                .await
                .unwrap();
            } else if status == S::Failed {
                svc.fail(FailRequest {
                    run_id: id.clone(),
                    worker_id: "w1".into(),
                    last_error: "boom".into(),
                    retryable: false,
                })
                .await
                .unwrap();
            }
        }
    }
    assert_eq!(status_of(&svc.get(&id).await.unwrap()), status);
    id
}

async fn every_status_and_action_follows_the_seed_table_with_deterministic_reasons(f: Fixture) {
    let svc = &f.svc;
    let actions = [
        (Action::Approve, S::Approved),
        (Action::Reject, S::Rejected),
        (Action::Cancel, S::Cancelled),
    ];
    for from in S::ALL {
        for (action, to) in actions {
            let id = run_in(svc, from).await;
            let got = svc.decide(action, &id, "c", REVIEWER).await;
            match table::check_by_person(from, to) {
                Ok(()) => {
                    assert_eq!(status_of(&got.unwrap()), to, "{from} -{action:?}-> {to}");
                    // The stored run names its decider: no audit read needed.
                    let stored = svc.get(&id).await.unwrap();
                    assert_eq!(stored.decided_by, "@reviewer", "{from} -{action:?}-> {to}");
                }
                Err(refused) => {
                    let err = api(got.unwrap_err());
                    assert_eq!(err.code, Code::FailedPrecondition, "{from} -> {to}");
                    assert_eq!(
                        err.reason.as_deref(),
                        Some(refused.reason.as_str()),
                        "{from} -> {to}"
                    );
                    assert_eq!(err.metadata["from"], from.as_str());
                    assert_eq!(err.metadata["to"], to.as_str());
                    assert_eq!(
                        status_of(&svc.get(&id).await.unwrap()),
                        from,
                        "a refusal changes nothing"
                    );
                }
            }
        }
        // Claim: approved -> running is the only way in.
        let id = run_in(svc, from).await;
        let got = svc.claim(claim_req(&id, "w2", 60)).await;
        match table::check(from, S::Running) {
            Ok(()) => assert_eq!(status_of(&got.unwrap()), S::Running),
            Err(refused) => {
                assert_eq!(
                    api(got.unwrap_err()).reason.as_deref(),
                    Some(refused.reason.as_str()),
                    "{from}"
                )
            }
        }
        // Complete and Fail need the claim, which only a running run has.
        let id = run_in(svc, from).await;
        let got = svc
            .complete(CompleteRequest {
                run_id: id.clone(),
                worker_id: "w1".into(),
                result: None,
            })
            .await;
        if from == S::Running {
            assert_eq!(status_of(&got.unwrap()), S::Completed);
        } else {
            assert_eq!(
                api(got.unwrap_err()).known_reason(),
                Some(Reason::ClaimNotHeld),
                "{from}"
            );
        }
    }
}

async fn the_creator_cannot_approve_and_decisions_need_an_actor(f: Fixture) {
    let id = propose(&f.svc, Some(5)).await.run_id;
    let err = api(f
        .svc
        .decide(Action::Approve, &id, "mine", Some("@you"))
        .await
        .unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::PermissionDenied, Some(Reason::SeparationOfDuties))
    );
    let err = api(f
        .svc
        .decide(Action::Approve, &id, "", None)
        .await
        .unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::Unauthenticated, Some(Reason::ActorRequired))
    );
    assert_eq!(status_of(&f.svc.get(&id).await.unwrap()), S::Proposed);
    // The creator may still withdraw it; someone else may approve.
    let run = f
        .svc
        .decide(Action::Approve, &id, "lgtm", REVIEWER)
        .await
        .unwrap();
    assert_eq!(status_of(&run), S::Approved);
}

async fn the_default_policy_approves_only_zero_cost_runs(f: Fixture) {
    let out = f
        .svc
        .propose(
            ProposeRequest {
                run: Some(spec(Some(0))),
                ..Default::default()
            },
            Some("@you".into()),
        )
        .await
        .unwrap();
    assert_eq!(out.auto_approved_by, "zero-cost");
    assert_eq!(out.run.as_ref().map(status_of), Some(S::Approved));
    assert_eq!(
        out.run.as_ref().map(|r| r.decided_by.as_str()),
        Some("policy:zero-cost")
    );
    let audit = f
        .svc
        .list_audit(&ListAuditRequest {
            run_id: out.run.unwrap().run_id,
            ..Default::default()
        })
        .await
        .unwrap();
    let last = audit.records.last().unwrap();
    assert_eq!(
        (last.actor.as_str(), last.event_type.as_str()),
        ("policy:zero-cost", "auto_approved")
    );
    for cost in [Some(1), None] {
        let out = f
            .svc
            .propose(
                ProposeRequest {
                    run: Some(spec(cost)),
                    ..Default::default()
                },
                Some("@you".into()),
            )
            .await
            .unwrap();
        assert_eq!(
            (
                out.auto_approved_by.as_str(),
                out.run.as_ref().map(status_of)
            ),
            ("", Some(S::Proposed))
        );
    }
}

async fn a_proposal_approved_at_once_is_claimed_in_the_same_change_when_asked(f: Fixture) {
    let with_claim = |cost: Option<i64>, id: &str, lease_secs: u32| {
        let mut run = spec(cost);
        run.run_id = id.into();
        ProposeRequest {
            run: Some(run),
            claim: Some(ClaimOnApproval {
                worker_id: "executor".into(),
                lease_secs,
            }),
            ..Default::default()
        }
    };
    // Approved by the zero-cost policy: running, held by the claimant, and
    // audited as the two steps it stands for.
    let out = f
        .svc
        .propose(with_claim(Some(0), "run-free", 30), Some("@you".into()))
        .await
        .unwrap();
    let run = out.run.unwrap();
    assert_eq!(status_of(&run), S::Running);
    assert_eq!(run.claimed_by, "executor");
    assert_eq!(run.decided_by, "policy:zero-cost");
    let lease_ms = run.claim_expires_at.as_ref().map(timestamp_ms);
    assert_eq!(lease_ms, Some(f.clock.now_ms() + 30_000));
    let audit = audit_of(&f.svc, "run-free").await;
    let kinds: Vec<&str> = audit.iter().map(|r| r.event_type.as_str()).collect();
    assert_eq!(
        kinds,
        ["proposed", "context_pack_built", "auto_approved", "claimed"]
    );
    let claimed = &audit[3];
    assert_eq!(claimed.actor, "executor");
    assert_eq!(claimed.details["with_proposal"], "true");
    assert_eq!(claimed.details["lease_ms"], "30000");
    // A repeated proposal claims nothing more: the run is as it was.
    let again = f
        .svc
        .propose(with_claim(Some(0), "run-free", 30), Some("@you".into()))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(audit_of(&f.svc, "run-free").await.len(), 4);
    // Left for a person: proposed and unclaimed; Claim it once approved.
    let out = f
        .svc
        .propose(with_claim(Some(500), "run-paid", 30), Some("@you".into()))
        .await
        .unwrap();
    let run = out.run.unwrap();
    assert_eq!(
        (status_of(&run), run.claimed_by.as_str()),
        (S::Proposed, "")
    );
    // A lease the claim would refuse is refused with the proposal, which
    // then stores nothing.
    let e = api(f
        .svc
        .propose(
            with_claim(Some(0), "run-bad", u32::MAX),
            Some("@you".into()),
        )
        .await
        .unwrap_err());
    assert_eq!(e.code, Code::InvalidArgument, "{e:?}");
    let fields: Vec<_> = e.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, ["claim.lease_secs"], "{e:?}");
    assert!(f.svc.get("run-bad").await.is_err());
}

#[tokio::test]
async fn claiming_with_a_proposal_needs_the_permission_claiming_needs() {
    use switchyard_kit::auth::{Kind, Method, Principal, Role};
    use switchyard_proto::approval::v1::approval_service_server::ApprovalService;
    let f = fixture();
    let ask = |roles: &[Role]| {
        let mut run = spec(Some(0));
        run.created_by.clear();
        let mut req = tonic::Request::new(ProposeRequest {
            run: Some(run),
            claim: Some(ClaimOnApproval {
                worker_id: "w".into(),
                lease_secs: 30,
            }),
            ..Default::default()
        });
        req.extensions_mut().insert(Arc::new(Principal::user(
            "@you",
            "default",
            roles,
            Kind::Human,
            Method::ApiKey,
        )));
        req
    };
    // A submitter proposes, but does not work runs.
    let e = ApiError::from(
        ApprovalService::propose(&f.svc, ask(&[Role::Submitter]))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    assert_eq!(
        f.svc
            .list_audit(&ListAuditRequest::default())
            .await
            .unwrap()
            .records
            .len(),
        0
    );
    // An agent key works its own tasks, not approval runs.
    let e = ApiError::from(
        ApprovalService::propose(&f.svc, ask(&[Role::Agent, Role::Submitter]))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
    // What holds run.work (the services) may.
    let out = ApprovalService::propose(&f.svc, ask(&[Role::Submitter, Role::Service]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.run.map(|r| status_of(&r)), Some(S::Running));
}

async fn skip_policies_leaves_even_a_zero_cost_run_for_a_person(f: Fixture) {
    let out = f
        .svc
        .propose(
            ProposeRequest {
                run: Some(spec(Some(0))),
                skip_policies: true,
                ..Default::default()
            },
            Some("@you".into()),
        )
        .await
        .unwrap();
    assert_eq!(out.auto_approved_by, "");
    assert_eq!(out.run.as_ref().map(status_of), Some(S::Proposed));
}

#[tokio::test]
async fn a_delegated_run_is_approved_only_under_a_running_parent() {
    for status in [
        S::Proposed,
        S::Approved,
        S::Running,
        S::Completed,
        S::Failed,
        S::Rejected,
        S::Cancelled,
    ] {
        let f = fixture();
        let parent = run_in(&f.svc, status).await;
        let mut child = spec(Some(5_000));
        child.run_id = "run-child".into();
        child.job_id = "child-job".into();
        let out = f
            .svc
            .propose(
                ProposeRequest {
                    run: Some(child),
                    approved_under: parent.clone(),
                    ..Default::default()
                },
                Some("@you".into()),
            )
            .await;
        if status == S::Running {
            let out = out.unwrap();
            assert_eq!(out.auto_approved_by, format!("delegation:{parent}"));
            assert_eq!(out.run.as_ref().map(status_of), Some(S::Approved));
            assert_eq!(
                out.run.as_ref().map(|r| r.decided_by.clone()),
                Some(format!("delegation:{parent}"))
            );
            let audit = f
                .svc
                .list_audit(&ListAuditRequest {
                    run_id: "run-child".into(),
                    ..Default::default()
                })
                .await
                .unwrap();
            let last = audit.records.last().unwrap();
            assert_eq!(
                (last.actor.clone(), last.event_type.as_str()),
                (format!("delegation:{parent}"), "auto_approved")
            );
        } else {
            let e = api(out.unwrap_err());
            assert_eq!(e.reason.as_deref(), Some("RUN_NOT_RUNNING"), "{status:?}");
            assert!(
                f.svc.get("run-child").await.is_err(),
                "no child run is created"
            );
        }
    }
    let f = fixture();
    let e = f
        .svc
        .propose(
            ProposeRequest {
                run: Some(spec(Some(1))),
                approved_under: "run-nope".into(),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(api(e).reason.as_deref(), Some("RUN_NOT_FOUND"));
}

async fn an_expired_claim_schedules_a_retry_with_backoff_until_retries_run_out(f: Fixture) {
    let mut r = spec(Some(9));
    r.max_retries = Some(2);
    let id = f
        .svc
        .propose(
            ProposeRequest {
                run: Some(r),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap()
        .run
        .unwrap()
        .run_id;
    f.svc
        .decide(Action::Approve, &id, "", REVIEWER)
        .await
        .unwrap();
    f.svc.claim(claim_req(&id, "w1", 10)).await.unwrap();
    f.clock.advance_ms(9_999);
    assert_eq!(f.svc.sweep().await.unwrap(), 0);
    f.clock.advance_ms(1);
    assert_eq!(f.svc.sweep().await.unwrap(), 1);
    let run = f.svc.get(&id).await.unwrap();
    assert_eq!(
        (status_of(&run), run.retry_count, run.claimed_by.as_str()),
        (S::Approved, 1, "")
    );
    assert!(run.last_error.contains("w1"), "{}", run.last_error);
    let due = timestamp_ms(run.next_attempt_at.as_ref().unwrap());
    assert_eq!(
        due,
        f.clock.now_ms() + 1_000,
        "first retry after the base delay"
    );

    // Too early: the same refusal every time.
    for _ in 0..2 {
        let err = api(f.svc.claim(claim_req(&id, "w2", 10)).await.unwrap_err());
        assert_eq!(err.known_reason(), Some(Reason::RunNotDue));
    }
    f.clock.advance_ms(1_000);
    f.svc.claim(claim_req(&id, "w2", 10)).await.unwrap();
    let err = api(f
        .svc
        .renew(RenewClaimRequest {
            run_id: id.clone(),
            worker_id: "w1".into(),
            lease_secs: 10,
        })
        .await
        .unwrap_err());
    assert_eq!(
        err.known_reason(),
        Some(Reason::ClaimNotHeld),
        "the old worker lost it"
    );
    let fail = |worker: &str| FailRequest {
        run_id: id.clone(),
        worker_id: worker.into(),
        last_error: "tool crashed".into(),
        retryable: true,
    };
    let run = f.svc.fail(fail("w2")).await.unwrap();
    assert_eq!((status_of(&run), run.retry_count), (S::Approved, 2));
    assert_eq!(
        timestamp_ms(run.next_attempt_at.as_ref().unwrap()),
        f.clock.now_ms() + 2_000,
        "doubles"
    );
    f.clock.advance_ms(2_000);
    f.svc.claim(claim_req(&id, "w3", 10)).await.unwrap();
    let run = f.svc.fail(fail("w3")).await.unwrap();
    assert_eq!(
        (status_of(&run), run.last_error.as_str()),
        (S::Failed, "tool crashed")
    );
    // A person can give it another go.
    let run = f
        .svc
        .decide(Action::Approve, &id, "try again", REVIEWER)
        .await
        .unwrap();
    assert_eq!(status_of(&run), S::Approved);
}

async fn renewing_extends_the_lease_of_the_holder_only(f: Fixture) {
    let id = run_in(&f.svc, S::Approved).await;
    f.svc.claim(claim_req(&id, "w1", 10)).await.unwrap();
    f.clock.advance_ms(8_000);
    let run = f
        .svc
        .renew(RenewClaimRequest {
            run_id: id.clone(),
            worker_id: "w1".into(),
            lease_secs: 10,
        })
        .await
        .unwrap();
    assert_eq!(
        timestamp_ms(run.claim_expires_at.as_ref().unwrap()),
        f.clock.now_ms() + 10_000
    );
    f.clock.advance_ms(8_000);
    assert_eq!(f.svc.sweep().await.unwrap(), 0, "renewed lease still holds");
    let err = api(f.svc.claim(claim_req(&id, "w9", 0)).await.unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::RunAlreadyInStatus));
}

async fn the_prompt_bundle_is_deterministic_and_imports_check_the_context_hash(f: Fixture) {
    let id = run_in(&f.svc, S::Proposed).await;
    let err = api(f.svc.export(&id, REVIEWER).await.unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::ApprovalRequired));
    f.svc
        .decide(Action::Approve, &id, "", REVIEWER)
        .await
        .unwrap();
    let a = f.svc.export(&id, REVIEWER).await.unwrap();
    f.clock.advance_ms(60_000);
    let b = f.svc.export(&id, Some("@someone-else")).await.unwrap();
    assert_eq!(a.bundle, b.bundle, "byte-identical for the same run");
    assert_eq!(a.content_type, "application/json");
    let doc: serde_json::Value = serde_json::from_slice(&a.bundle).unwrap();
    assert_eq!(doc["context_pack"]["hash"], HASH);
    assert!(
        doc["instructions"]
            .as_str()
            .unwrap()
            .contains(&format!("approval import {id}"))
    );

    let import = |hash: &str| ImportManualResultRequest {
        run_id: id.clone(),
        content: "Proposed changeset: docs/contracts.md".into(),
        context_hash: hash.into(),
        ..Default::default()
    };
    let err = api(f
        .svc
        .import(import("sha256:00000000"), REVIEWER)
        .await
        .unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::FailedPrecondition, Some(Reason::ContextHashMismatch))
    );
    let run = f.svc.import(import(HASH), REVIEWER).await.unwrap();
    assert_eq!(status_of(&run), S::Completed);
    assert_eq!(
        run.result.unwrap().content,
        "Proposed changeset: docs/contracts.md"
    );
    let err = api(f.svc.import(import(HASH), REVIEWER).await.unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::FailedPrecondition, Some(Reason::RunTerminal)),
        "already imported"
    );
}

async fn the_audit_log_records_every_action_in_order(f: Fixture) {
    let id = propose(&f.svc, Some(100)).await.run_id;
    f.svc
        .decide(Action::Approve, &id, "lgtm", REVIEWER)
        .await
        .unwrap();
    f.svc.claim(claim_req(&id, "worker-1", 30)).await.unwrap();
    f.svc
        .complete(CompleteRequest {
            run_id: id.clone(),
            worker_id: "worker-1".into(),
            result: Some(RunResult {
                draft_pr_url: "https://example.test/pr/1".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let recs = audit_of(&f.svc, &id).await;
    let summary: Vec<_> = recs
        .iter()
        .map(|r| {
            (
                r.event_type.as_str(),
                r.actor.as_str(),
                r.from_status,
                r.to_status,
            )
        })
        .collect();
    use RunStatus as P;
    assert_eq!(
        summary,
        [
            (
                "proposed",
                "@you",
                P::Unspecified as i32,
                P::Proposed as i32
            ),
            (
                "context_pack_built",
                "@you",
                P::Unspecified as i32,
                P::Proposed as i32
            ),
            (
                "approved",
                "@reviewer",
                P::Proposed as i32,
                P::Approved as i32
            ),
            ("claimed", "worker-1", P::Approved as i32, P::Running as i32),
            (
                "completed",
                "worker-1",
                P::Running as i32,
                P::Completed as i32
            ),
        ]
    );
    assert!(
        recs.iter()
            .all(|r| r.correlation_id == "corr-7" && r.run_id == id)
    );
    assert_eq!(recs[2].reason, "lgtm");
    let built = &recs[1].details;
    assert_eq!(built["context_hash"], HASH);
    assert_eq!(built["requested_by"], "@you");
    assert_eq!(built["estimated_cost_micro_usd"], "100");
    assert_eq!(built["max_tokens"], "12000");
    let seqs: Vec<_> = recs.iter().map(|r| r.sequence).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    let after = f
        .svc
        .list_audit(&ListAuditRequest {
            run_id: id,
            after_sequence: seqs[2],
            page_size: 1,
        })
        .await
        .unwrap();
    assert_eq!(after.records[0].event_type, "claimed");
}

async fn proposals_are_validated_field_by_field(f: Fixture) {
    let mut bad = spec(Some(-1));
    bad.schema_version = "agent_run_spec/v0".into();
    bad.created_by.clear();
    bad.target = Some(Target::default());
    bad.intent.clear();
    bad.context_pack = Some(ContextPack {
        hash: "abcd".into(),
        ..Default::default()
    });
    bad.model.clear();
    bad.max_tokens = 0;
    bad.temperature = Some(2.5);
    bad.tools_allowed.clear();
    bad.outputs_allowed = vec!["Propose PR".into()];
    let err = api(f
        .svc
        .propose(
            ProposeRequest {
                run: Some(bad),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap_err());
    let fields: Vec<_> = err.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "schema_version",
            "created_by",
            "target.org",
            "target.work_item_ids",
            "intent",
            "context_pack.pack_id",
            "context_pack.hash",
            "context_pack.version",
            "model",
            "max_tokens",
            "temperature",
            "cost_estimate.estimated_cost",
            "tools_allowed",
            "outputs_allowed[0]",
        ]
    );
    let err = api(f
        .svc
        .propose(ProposeRequest::default(), None)
        .await
        .unwrap_err());
    assert_eq!(err.violations[0].field, "run");
    assert_eq!(
        f.svc
            .list(&ListRunsRequest::default())
            .await
            .unwrap()
            .runs
            .len(),
        0,
        "nothing stored"
    );
}

async fn a_client_chosen_run_id_is_idempotent_for_the_same_spec_only(f: Fixture) {
    let mut r = spec(Some(3));
    r.run_id = "agent_run_2026-02-22_0003".into();
    let first = f
        .svc
        .propose(
            ProposeRequest {
                run: Some(r.clone()),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    let again = f
        .svc
        .propose(
            ProposeRequest {
                run: Some(r.clone()),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    assert!(first.created && !again.created);
    assert_eq!(first.run, again.run);
    r.intent = "something else".into();
    let err = api(f
        .svc
        .propose(
            ProposeRequest {
                run: Some(r),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap_err());
    assert_eq!(
        (err.code, err.known_reason()),
        (Code::AlreadyExists, Some(Reason::RunAlreadyExists))
    );
}

async fn lists_put_pending_runs_first_filter_and_paginate(f: Fixture) {
    let approved = run_in(&f.svc, S::Approved).await;
    f.clock.advance_ms(10);
    let p1 = run_in(&f.svc, S::Proposed).await;
    f.clock.advance_ms(10);
    let mut other = spec(Some(5));
    other.target.as_mut().unwrap().org = "acme".into();
    other.created_by = "@bot".into();
    let p2 = f
        .svc
        .propose(
            ProposeRequest {
                run: Some(other),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap()
        .run
        .unwrap()
        .run_id;
    let page1 = f
        .svc
        .list(&ListRunsRequest {
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<_> = page1.runs.iter().map(|r| r.run_id.clone()).collect();
    assert_eq!(ids, [p1.clone(), p2.clone()]);
    let page2 = f
        .svc
        .list(&ListRunsRequest {
            page_size: 2,
            page_token: page1.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (page2.runs[0].run_id.clone(), page2.next_page_token),
        (approved, String::new())
    );
    let acme = f
        .svc
        .list(&ListRunsRequest {
            target_org: "acme".into(),
            created_by: "@bot".into(),
            statuses: vec![RunStatus::Proposed as i32],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(acme.runs.len(), 1);
    let err = api(f
        .svc
        .list(&ListRunsRequest {
            statuses: vec![42],
            ..Default::default()
        })
        .await
        .unwrap_err());
    assert_eq!(err.violations[0].field, "statuses[0]");
}

#[tokio::test]
async fn runs_and_audit_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let id = {
        let f = fixture_on(reopen(dir.path()).await, clock.clone());
        run_in(&f.svc, S::Running).await
    };
    let f = fixture_on(reopen(dir.path()).await, clock);
    let run = f.svc.get(&id).await.unwrap();
    assert_eq!(
        (status_of(&run), run.claimed_by.as_str()),
        (S::Running, "w1")
    );
    let recs = audit_of(&f.svc, &id).await;
    assert_eq!(recs.len(), 4);
    f.svc
        .complete(CompleteRequest {
            run_id: id,
            worker_id: "w1".into(),
            result: None,
        })
        .await
        .unwrap();
}

async fn watch_streams_run_events_of_one_run(f: Fixture) {
    let other = run_in(&f.svc, S::Proposed).await;
    let id = run_in(&f.svc, S::Proposed).await;
    let mut w = f
        .svc
        .watch_stream(
            WatchRequest {
                run_id: id.clone(),
                after_sequence: 0,
            },
            std::sync::Arc::new(Principal::in_process()),
        )
        .await
        .unwrap();
    f.svc
        .decide(Action::Reject, &other, "", REVIEWER)
        .await
        .unwrap();
    f.svc
        .decide(Action::Approve, &id, "", REVIEWER)
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 3 {
        let ev = tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(ev.run.unwrap().run_id, id);
        kinds.push(ev.event.unwrap().kind);
    }
    assert_eq!(
        kinds,
        ["run.proposed", "run.context_pack_built", "run.approved"]
    );
}

#[test]
fn backoff_doubles_from_the_base_and_is_capped() {
    let cfg = ApprovalConfig::default();
    assert_eq!([1, 2, 3].map(|n| cfg.backoff_ms(n)), [1_000, 2_000, 4_000]);
    assert_eq!(cfg.backoff_ms(40), 300_000);
    assert_eq!(cfg.backoff_ms(200), 300_000);
}

#[tokio::test]
async fn ended_runs_leave_memory_and_a_restart_loads_only_runs_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let (done, running, failed) = {
        let f = fixture_on(reopen(dir.path()).await, clock.clone());
        let done = run_in(&f.svc, S::Completed).await;
        let running = run_in(&f.svc, S::Running).await;
        let failed = run_in(&f.svc, S::Failed).await;
        assert_eq!(f.svc.sled_runs_in_memory(), 1, "only the running run");
        // Ended runs read back from disk, with their audit trail.
        assert_eq!(status_of(&f.svc.get(&done).await.unwrap()), S::Completed);
        let audit = f
            .svc
            .list_audit(&ListAuditRequest {
                run_id: done.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            audit.records.last().unwrap().to_status,
            RunStatus::Completed as i32
        );
        assert_eq!(
            f.svc
                .list(&ListRunsRequest::default())
                .await
                .unwrap()
                .runs
                .len(),
            3
        );
        f.svc.flush().unwrap();
        (done, running, failed)
    };
    let f = fixture_on(reopen(dir.path()).await, clock);
    assert_eq!(f.svc.sled_runs_in_memory(), 1);
    assert_eq!(status_of(&f.svc.get(&running).await.unwrap()), S::Running);
    assert_eq!(status_of(&f.svc.get(&done).await.unwrap()), S::Completed);
    let in_flight = ListRunsRequest {
        statuses: vec![RunStatus::Running as i32],
        ..Default::default()
    };
    assert_eq!(f.svc.list(&in_flight).await.unwrap().runs.len(), 1);
    // A failed run approved again is back in flight, its audit trail whole.
    f.svc
        .decide(Action::Approve, &failed, "again", REVIEWER)
        .await
        .unwrap();
    assert_eq!(f.svc.sled_runs_in_memory(), 2);
    let audit = f
        .svc
        .list_audit(&ListAuditRequest {
            run_id: failed.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(audit.records.first().unwrap().event_type, "proposed");
    assert_eq!(
        audit.records.last().unwrap().to_status,
        RunStatus::Approved as i32
    );
    // Back in flight across another restart (no flush: what the answer
    // rested on), its records from both lives still its own.
    let before = audit.records.len();
    drop(f);
    let f = fixture_on(
        reopen(dir.path()).await,
        ManualClock::new(1_700_000_000_000),
    );
    assert_eq!(f.svc.sled_runs_in_memory(), 2);
    assert_eq!(status_of(&f.svc.get(&failed).await.unwrap()), S::Approved);
    let again = audit_of(&f.svc, &failed).await;
    assert_eq!(again.len(), before);
    assert_eq!(again.first().unwrap().event_type, "proposed");
}

#[tokio::test]
async fn a_run_in_flight_is_written_only_in_its_audit_records_and_stored_once_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let id = {
        let store = reopen(dir.path()).await;
        let runs = store.tree::<Run>("runs").unwrap();
        let f = fixture_on(store, clock.clone());
        let id = run_in(&f.svc, S::Running).await;
        assert!(
            runs.get(&id).unwrap().is_none(),
            "a run in flight is in its audit records only"
        );
        id
    };
    // No flush: the restart finds what the answers rested on.
    let store = reopen(dir.path()).await;
    let runs = store.tree::<Run>("runs").unwrap();
    let f = fixture_on(store, clock);
    let run = f.svc.get(&id).await.unwrap();
    assert_eq!(
        (status_of(&run), run.claimed_by.as_str()),
        (S::Running, "w1")
    );
    f.svc
        .complete(CompleteRequest {
            run_id: id.clone(),
            worker_id: "w1".into(),
            result: None,
        })
        .await
        .unwrap();
    let stored = runs.get(&id).unwrap().expect("an ended run is stored");
    assert_eq!(status_of(&stored), S::Completed);
    assert_eq!(f.svc.sled_runs_in_memory(), 0);
}

#[tokio::test]
async fn runs_in_flight_of_the_earlier_layout_load_move_and_leave_its_list_when_they_end() {
    let clock = ManualClock::new(1_700_000_000_000);
    // A proposed run and its records, as this release makes them.
    let (run, records) = {
        let f = fixture_on(Store::temporary().unwrap(), clock.clone());
        let id = run_in(&f.svc, S::Proposed).await;
        (f.svc.get(&id).await.unwrap(), audit_of(&f.svc, &id).await)
    };
    let id = run.run_id.clone();
    // The data directory the earlier layout left: the run in `runs`,
    // listed in `live`, its records carrying no run.
    let dir = tempfile::tempdir().unwrap();
    {
        let store = reopen(dir.path()).await;
        store.tree::<Run>("runs").unwrap().put(&id, &run).unwrap();
        store
            .tree::<switchyard_store::Mark>("live")
            .unwrap()
            .put(&id, &switchyard_store::Mark {})
            .unwrap();
        store
            .tree::<switchyard_store::Number>("meta")
            .unwrap()
            .put("layout", &switchyard_store::Number { value: 2 })
            .unwrap();
        let log = store.log::<AuditRecord>("audit").unwrap();
        for r in &records {
            log.append(|sequence| AuditRecord {
                sequence,
                ..r.clone()
            });
        }
        log.make_durable(log.last()).await.unwrap();
    }
    let live = |store: &Store| {
        store
            .tree::<switchyard_store::Mark>("live")
            .unwrap()
            .get(&id)
            .unwrap()
    };
    {
        let f = fixture_on(reopen(dir.path()).await, clock.clone());
        assert_eq!(f.svc.sled_runs_in_memory(), 1);
        assert_eq!(audit_of(&f.svc, &id).await.len(), records.len());
        f.svc
            .decide(Action::Approve, &id, "ok", REVIEWER)
            .await
            .unwrap();
    }
    {
        let store = reopen(dir.path()).await;
        let f = fixture_on(store.clone(), clock.clone());
        // Loaded from the list as proposed, then moved by its new record.
        assert_eq!(status_of(&f.svc.get(&id).await.unwrap()), S::Approved);
        assert_eq!(audit_of(&f.svc, &id).await.len(), records.len() + 1);
        f.svc
            .decide(Action::Cancel, &id, "stop", REVIEWER)
            .await
            .unwrap();
        assert!(live(&store).is_none(), "an ended run leaves the list");
    }
    let f = fixture_on(reopen(dir.path()).await, clock);
    assert_eq!(f.svc.sled_runs_in_memory(), 0);
    assert_eq!(status_of(&f.svc.get(&id).await.unwrap()), S::Cancelled);
}

async fn pruning_removes_runs_that_ended_past_retention_and_keeps_runs_in_flight(f: Fixture) {
    let done = run_in(&f.svc, S::Completed).await;
    let running = run_in(&f.svc, S::Running).await;
    f.clock.advance_ms(3_600_000);
    let recent = run_in(&f.svc, S::Cancelled).await;
    let (runs, _) = f.svc.prune(1_800_000).await.unwrap();
    assert_eq!(runs, 1, "only the run that ended an hour ago");
    assert_eq!(
        api(f.svc.get(&done).await.unwrap_err()).known_reason(),
        Some(Reason::RunNotFound)
    );
    for kept in [&running, &recent] {
        let audit = f
            .svc
            .list_audit(&ListAuditRequest {
                run_id: kept.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            audit.records.first().unwrap().event_type,
            "proposed",
            "{kept}"
        );
    }
    assert_eq!(status_of(&f.svc.get(&running).await.unwrap()), S::Running);
}

async fn a_run_gets_its_adapter_manual_by_default_switchyard_for_a_job_and_none_for_a_call(
    f: Fixture,
) {
    let run = propose(&f.svc, Some(100)).await;
    assert_eq!(run.adapter, "manual");
    let mut job_run = spec(Some(100));
    job_run.job_id = "job-1".into();
    let out = propose_run(&f.svc, job_run).await.unwrap();
    assert_eq!(out.adapter, "switchyard");
    let mut call = spec(Some(100));
    call.adapter = "ojs".into();
    call.tool_call = Some(ToolCall {
        job_id: "job-1".into(),
        tool: "deploy".into(),
        ..Default::default()
    });
    let out = propose_run(&f.svc, call).await.unwrap();
    assert_eq!(out.adapter, "", "a per-call run is executed by its task");
    for (adapter, job) in [("nope", ""), ("switchyard", "")] {
        let mut bad = spec(Some(100));
        bad.adapter = adapter.into();
        bad.job_id = job.into();
        let err = api(propose_run(&f.svc, bad).await.unwrap_err());
        assert_eq!(err.code, Code::InvalidArgument, "{adapter}");
        assert!(err.message.contains("adapter"), "{}", err.message);
    }
}

async fn a_publication_run_is_a_decision_bound_to_its_bytes_that_no_adapter_runs(f: Fixture) {
    let publication = |artifact_id: &str| {
        let mut run = spec(None);
        run.publication = Some(ArtifactPublication {
            job_id: "self-host".into(),
            artifact_path: "chat/manifest.yaml".into(),
            artifact_id: artifact_id.into(),
            destination: "agents".into(),
        });
        run
    };
    // Bound to other bytes than its context pack's: refused.
    let err = api(propose_run(&f.svc, publication("sha256:0ther"))
        .await
        .unwrap_err());
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("context_pack.hash"), "{}", err.message);
    let run = propose_run(&f.svc, publication(HASH)).await.unwrap();
    assert_eq!(run.adapter, "", "a publication is a decision, not work");
    f.svc
        .decide(Action::Approve, &run.run_id, "ok", REVIEWER)
        .await
        .unwrap();
    // No adapter takes it: it stays approved, the record of who allowed it.
    assert_eq!(f.svc.dispatch().await.unwrap(), 0);
    let run = f.svc.get(&run.run_id).await.unwrap();
    assert_eq!(status_of(&run), S::Approved);
    assert_eq!(Some(run.decided_by.as_str()), REVIEWER);
}

async fn the_manual_round_trip_keeps_the_pasted_result_as_an_artifact_fetched_byte_identical(
    f: Fixture,
) {
    let id = approved(&f.svc).await;
    // The dispatcher hands it to the manual adapter: running, awaiting the result.
    assert_eq!(f.svc.dispatch().await.unwrap(), 1);
    let run = f.svc.get(&id).await.unwrap();
    assert_eq!(status_of(&run), S::Running);
    assert_eq!(
        (run.job_id.as_str(), run.adapter_state.as_str()),
        (format!("manual:{id}").as_str(), "awaiting_result")
    );
    assert_eq!(run.claimed_by, "adapter-manual");
    // Nothing imported yet: polling changes nothing.
    assert_eq!(f.svc.dispatch().await.unwrap(), 0);
    let pasted = "diff --git a/x b/x\n+ü\u{1F600}\n";
    let req = ImportManualResultRequest {
        run_id: id.clone(),
        content: pasted.into(),
        context_hash: HASH.into(),
        kind: switchyard_proto::common::v1::ArtifactKind::ChangesetBundle as i32,
        name: "bundle.diff".into(),
        media_type: "text/x-diff".into(),
    };
    let run = f.svc.import(req, REVIEWER).await.unwrap();
    assert_eq!(status_of(&run), S::Completed);
    let result = run.result.clone().unwrap();
    assert_eq!(
        result.artifact_paths,
        vec!["prompt-bundle.json", "bundle.diff"]
    );
    assert!(result.changeset_bundle_id.starts_with("sha256:"));
    let fetched = f
        .svc
        .inner
        .adapters
        .manual
        .fetch_artifacts(&run)
        .await
        .unwrap();
    let bundle = fetched.iter().find(|a| a.path == "bundle.diff").unwrap();
    assert_eq!(bundle.content, pasted.as_bytes(), "byte-identical");
    assert_eq!(
        bundle.kind,
        switchyard_proto::common::v1::ArtifactKind::ChangesetBundle
    );
    let exported = f.svc.export(&id, REVIEWER).await.unwrap().bundle;
    let (_, content) = f
        .svc
        .run_artifact(&run, "prompt-bundle.json")
        .await
        .unwrap();
    assert_eq!(content, exported);
    let err = api(f.svc.run_artifact(&run, "nope").await.unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::ArtifactNotFound));
}

async fn a_pasted_result_of_a_kind_outside_outputs_allowed_is_refused_and_nothing_changes(
    f: Fixture,
) {
    let id = approved(&f.svc).await;
    let req = ImportManualResultRequest {
        run_id: id.clone(),
        content: "post this".into(),
        context_hash: HASH.into(),
        kind: switchyard_proto::common::v1::ArtifactKind::IssueComment as i32,
        ..Default::default()
    };
    let err = api(f.svc.import(req, REVIEWER).await.unwrap_err());
    assert_eq!(err.known_reason(), Some(Reason::ArtifactKindNotAllowed));
    assert!(
        err.message.contains("propose_issue_comment"),
        "{}",
        err.message
    );
    assert_eq!(
        status_of(&f.svc.get(&id).await.unwrap()),
        S::Approved,
        "still importable"
    );
    let audit = audit_of(&f.svc, &id).await;
    let refused = audit.last().unwrap();
    assert_eq!(
        (refused.event_type.as_str(), refused.reason.as_str()),
        ("artifact_refused", "ARTIFACT_KIND_NOT_ALLOWED")
    );
}

async fn a_pasted_result_named_like_a_path_is_refused_and_nothing_changes(f: Fixture) {
    let id = approved(&f.svc).await;
    // The CLI names a pasted file after itself; a name is one plain file
    // name whoever sends it, never a path out of the run's artifacts.
    for name in ["../escape.md", "a/b.md", ".hidden", "notes (1).md"] {
        let req = ImportManualResultRequest {
            run_id: id.clone(),
            content: "result".into(),
            context_hash: HASH.into(),
            name: name.into(),
            ..Default::default()
        };
        let err = api(f.svc.import(req, REVIEWER).await.unwrap_err());
        assert_eq!(
            err.known_reason(),
            Some(Reason::ArtifactInvalid),
            "{name}: {err:?}"
        );
        assert!(
            err.message.contains("artifact name"),
            "{name}: {}",
            err.message
        );
    }
    let run = f.svc.get(&id).await.unwrap();
    assert_eq!(status_of(&run), S::Approved, "still importable");
    assert!(run.result.is_none(), "nothing kept");
}

async fn an_ojs_run_without_an_ojs_server_fails_with_adapter_not_configured(f: Fixture) {
    let mut run = spec(Some(100));
    run.adapter = "ojs".into();
    let id = propose_run(&f.svc, run).await.unwrap().run_id;
    f.svc
        .decide(Action::Approve, &id, "ok", REVIEWER)
        .await
        .unwrap();
    f.svc.dispatch().await.unwrap();
    let run = f.svc.get(&id).await.unwrap();
    assert_eq!(status_of(&run), S::Failed);
    assert_eq!(run.reason_code, "ADAPTER_NOT_CONFIGURED");
    assert!(
        run.last_error.contains("ADAPTER_NOT_CONFIGURED"),
        "{}",
        run.last_error
    );
}

/// Two approval replicas (each its own service and pool) on one fresh
/// database of the shared cluster, sharing a manual clock.
async fn two_replicas() -> Option<(Fixture, Fixture)> {
    let url = switchyard_testkit::pg::fresh_database()?;
    let clock = ManualClock::new(1_700_000_000_000);
    Some((
        pg_replica(&url, &clock).await,
        pg_replica(&url, &clock).await,
    ))
}

#[tokio::test]
async fn two_replicas_approving_and_cancelling_one_run_at_once_agree_on_exactly_one_winner() {
    let Some((fa, fb)) = two_replicas().await else {
        return;
    };
    let (a, b) = (&fa.svc, &fb.svc);
    for round in 0..20 {
        let id = propose(a, Some(100)).await.run_id;
        let (approved, cancelled) = tokio::join!(
            a.decide(Action::Approve, &id, "ok", REVIEWER),
            b.decide(Action::Cancel, &id, "stop", REVIEWER),
        );
        // Proposed → approved and proposed → cancelled are both allowed;
        // approved → cancelled is too, cancelled → approved is not. So
        // either both succeed in that order, or the approval loses with
        // the table's reason: never two answers the table forbids.
        let last = b.get(&id).await.unwrap();
        match (&approved, &cancelled) {
            (Ok(_), Ok(_)) | (Err(_), Ok(_)) => {
                assert_eq!(status_of(&last), S::Cancelled, "round {round}")
            }
            (Ok(_), Err(e)) => panic!("round {round}: the cancel lost to an approval: {e}"),
            (Err(e1), Err(e2)) => panic!("round {round}: both refused: {e1} / {e2}"),
        }
        let approved = approved.map(|_| ());
        if let Err(e) = approved.as_ref().map_err(ToString::to_string) {
            assert!(e.contains("cancelled"), "round {round}: {e}");
        }
        // The audit log holds exactly the moves that were answered yes.
        let moves: Vec<String> = audit_of(a, &id)
            .await
            .into_iter()
            .map(|r| r.event_type)
            .filter(|e| e == "approved" || e == "cancelled")
            .collect();
        let expected = if approved.is_ok() {
            vec!["approved", "cancelled"]
        } else {
            vec!["cancelled"]
        };
        assert_eq!(moves, expected, "round {round}");
    }
    // Two replicas approving one run at once: one approval, one refusal.
    for round in 0..20 {
        let id = propose(a, Some(100)).await.run_id;
        let (x, y) = tokio::join!(
            a.decide(Action::Approve, &id, "ok", REVIEWER),
            b.decide(Action::Approve, &id, "ok", REVIEWER),
        );
        assert!(
            x.is_ok() != y.is_ok(),
            "round {round}: exactly one approval wins: {x:?} / {y:?}"
        );
        let refused = x.err().or(y.err()).unwrap();
        assert_eq!(
            api(refused).known_reason(),
            Some(Reason::RunAlreadyInStatus),
            "round {round}"
        );
    }
}

/// `worker` completing run `id` with no result.
fn done_by(id: &str, worker: &str) -> CompleteRequest {
    CompleteRequest {
        run_id: id.to_owned(),
        worker_id: worker.into(),
        result: None,
    }
}

#[tokio::test]
async fn a_claim_taken_over_on_another_replica_fences_the_first_worker() {
    let Some((fa, fb)) = two_replicas().await else {
        return;
    };
    let (a, b, clock) = (&fa.svc, &fb.svc, &fa.clock);
    let id = approved(a).await;
    a.claim(claim_req(&id, "w1", 5)).await.unwrap();
    // w1's lease lapses; a sweep on either replica returns the run to
    // approved (a retry), and w2 claims it through the other replica.
    clock.advance_ms(6_000);
    assert_eq!(
        b.sweep().await.unwrap() + a.sweep().await.unwrap(),
        1,
        "swept once"
    );
    clock.advance_ms(60_000);
    b.claim(claim_req(&id, "w2", 30)).await.unwrap();
    // w1, late, cannot renew, complete or fail on either replica.
    for svc in [a, b] {
        let renew = RenewClaimRequest {
            run_id: id.clone(),
            worker_id: "w1".into(),
            lease_secs: 30,
        };
        let e = svc.renew(renew).await.unwrap_err();
        assert_eq!(api(e).known_reason(), Some(Reason::ClaimNotHeld));
        let e = svc.complete(done_by(&id, "w1")).await.unwrap_err();
        assert_eq!(api(e).known_reason(), Some(Reason::ClaimNotHeld));
    }
    let run = a.complete(done_by(&id, "w2")).await.unwrap();
    assert_eq!(status_of(&run), S::Completed);
}

#[tokio::test]
async fn a_workers_completion_cannot_name_artifacts_the_service_did_not_store() {
    let f = fixture();
    let id = propose(&f.svc, Some(100)).await.run_id;
    f.svc
        .decide(Action::Approve, &id, "lgtm", REVIEWER)
        .await
        .unwrap();
    f.svc.claim(claim_req(&id, "worker-1", 30)).await.unwrap();
    // Another run's artifact, named by its content address.
    let stolen = switchyard_proto::common::v1::Artifact {
        artifact_id: "sha256:0123456789abcdef".into(),
        path: "report.md".into(),
        ..Default::default()
    };
    let mut req = tonic::Request::new(CompleteRequest {
        run_id: id.clone(),
        worker_id: "worker-1".into(),
        result: Some(RunResult {
            draft_pr_url: "https://example.test/pr/1".into(),
            artifacts: vec![stolen],
            ..Default::default()
        }),
    });
    // The worker is the run's proposer's agent key, as over gRPC.
    req.extensions_mut()
        .insert(Arc::new(switchyard_kit::auth::Principal::user(
            "@you",
            "",
            &[switchyard_kit::auth::Role::Agent],
            switchyard_kit::auth::Kind::Agent,
            switchyard_kit::auth::Method::ApiKey,
        )));
    use switchyard_proto::approval::v1::approval_service_server::ApprovalService;
    let run = ApprovalService::complete(&f.svc, req)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    let result = run.result.unwrap();
    assert_eq!(result.draft_pr_url, "https://example.test/pr/1");
    assert!(result.artifacts.is_empty(), "{:?}", result.artifacts);
}

#[tokio::test]
async fn audit_rows_of_the_earlier_layout_read_with_the_same_numbers_on_postgres() {
    use prost::Message as _;
    let Some(url) = switchyard_testkit::pg::fresh_database() else {
        return;
    };
    let f = pg_replica(&url, &ManualClock::new(1_700_000_000_000)).await;
    let id = propose(&f.svc, Some(100)).await.run_id;
    let written = audit_of(&f.svc, &id).await;
    let Backend::Pg(pg) = &f.svc.inner.backend else {
        panic!("a PostgreSQL fixture")
    };
    let c = pg.db().client().await.unwrap();
    // Rows written now carry their number in `seq` only.
    let rows = c
        .query(
            "SELECT seq, record FROM approval_audit WHERE run_id = $1 ORDER BY seq",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), written.len());
    for (row, rec) in rows.iter().zip(&written) {
        let inside = AuditRecord::decode(row.get::<_, Vec<u8>>(1).as_slice()).unwrap();
        assert_eq!(inside.sequence, 0);
        assert_eq!(row.get::<_, i64>(0) as u64, rec.sequence);
    }
    // A row as the earlier release wrote it: numbered first, the number
    // inside the record too. It reads back like any other, in order.
    let next: i64 = c
        .query_one("SELECT nextval('approval_audit_seq')", &[])
        .await
        .unwrap()
        .get(0);
    let old = AuditRecord {
        sequence: next as u64,
        run_id: id.clone(),
        event_type: "approval_recorded".into(),
        actor: "@earlier".into(),
        ..Default::default()
    };
    c.execute(
        "INSERT INTO approval_audit (seq, run_id, record) VALUES ($1, $2, $3)",
        &[&next, &id, &old.encode_to_vec()],
    )
    .await
    .unwrap();
    let read = audit_of(&f.svc, &id).await;
    let seqs: Vec<u64> = read.iter().map(|r| r.sequence).collect();
    let mut want: Vec<u64> = written.iter().map(|r| r.sequence).collect();
    want.push(next as u64);
    assert_eq!(seqs, want);
    assert_eq!(read.last().map(|r| r.actor.as_str()), Some("@earlier"));
    // The watch (the table's tail) numbers it the same.
    use futures_util::StreamExt as _;
    let tailed: Vec<u64> = pg
        .tail(0)
        .take(want.len())
        .map(|r| r.unwrap().sequence)
        .collect()
        .await;
    assert_eq!(tailed, want);
}

#[tokio::test]
async fn a_proposal_cannot_name_its_own_approvers_or_decider() {
    let (_trigger, shutdown) = switchyard_kit::shutdown::channel();
    let svc = Approval::open(
        ApprovalConfig {
            two_person_above_micro_usd: Some(0),
            ..Default::default()
        },
        Store::temporary().unwrap(),
        Arc::new(ManualClock::new(1_700_000_000_000)),
        shutdown,
    )
    .unwrap();
    let mut run = spec(Some(500));
    run.approved_by = vec!["@carol".into()];
    run.decided_by = "@carol".into();
    let run = propose_run(&svc, run).await.unwrap();
    assert_eq!(
        (run.approved_by.len(), run.decided_by.as_str()),
        (0, ""),
        "{run:?}"
    );
    // Two people are needed: one real approval leaves it proposed.
    let after = svc
        .decide(Action::Approve, &run.run_id, "ok", REVIEWER)
        .await
        .unwrap();
    assert_eq!(status_of(&after), S::Proposed);
    assert_eq!(after.approved_by, ["@reviewer"]);
}

#[test]
fn a_retired_receipt_key_is_named_by_its_ed25519_public_key_or_refused() {
    let (key, _) = switchyard_kit::receipt::ReceiptKey::generate().unwrap();
    let mut cfg = ApprovalConfig {
        previous_receipt_public_keys: vec![key.public_key()],
        ..Default::default()
    };
    assert_eq!(cfg.validate(), Ok(()));
    cfg.previous_receipt_public_keys = vec!["not a key".into()];
    let e = cfg.validate().unwrap_err();
    assert!(
        e.contains("approval.previous_receipt_public_keys: \"not a key\""),
        "{e}"
    );
}
