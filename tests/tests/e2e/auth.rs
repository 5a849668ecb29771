//! Identity and access against the in-process stack, over real gRPC with
//! real keys: the authorization matrix over the descriptor set, the spoofing
//! attacks that used to work, separation of duties, revocation, tenants.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use crate::common::*;
use prost::Message as _;
use switchyard_kit::client::Intercepted;
use switchyard_kit::error::ApiError;
use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::approval::v1::{ApproveRequest, ProposeRequest, Run};
use switchyard_proto::auth::v1::auth_service_client::AuthServiceClient;
use switchyard_proto::auth::v1::{
    CreateKeyRequest, PrincipalKind, RevokeKeyRequest, WhoAmIRequest,
};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{GetJobRequest, ListJobsRequest, SubmitJobRequest};
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_proto::ledger::v1::{CreateBudgetRequest, GetBudgetRequest, ListBudgetsRequest};
use switchyard_testkit::Stack;
use tonic::Code;

/// Every method of every Switchyard service in the descriptor set:
/// (`/pkg.Service/Method`, server-streaming).
fn methods() -> Vec<(String, bool)> {
    let fds =
        prost_types::FileDescriptorSet::decode(switchyard_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut out = Vec::new();
    for f in &fds.file {
        for s in &f.service {
            for m in &s.method {
                out.push((
                    format!("/{}.{}/{}", f.package(), s.name(), m.name()),
                    m.server_streaming(),
                ));
            }
        }
    }
    out
}

/// Calls `path` with an empty message (valid for every request type) and
/// returns the status (OK when the call went through).
async fn call(ch: Intercepted, path: &str, streaming: bool) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(ch);
    if let Err(e) = grpc.ready().await {
        return tonic::Status::unavailable(e.to_string());
    }
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let path = http::uri::PathAndQuery::from_str(path).unwrap();
    let req = tonic::Request::new(());
    let answer = async {
        if streaming {
            grpc.server_streaming(req, path, codec).await.map(|_| ())
        } else {
            grpc.unary(req, path, codec).await.map(|_| ())
        }
    };
    match tokio::time::timeout(Duration::from_secs(5), answer).await {
        Ok(Ok(())) => tonic::Status::ok(""),
        Ok(Err(s)) => s,
        Err(_) => tonic::Status::deadline_exceeded("no answer in 5 s"),
    }
}

fn denied(s: &tonic::Status) -> bool {
    s.code() == Code::PermissionDenied
        && ApiError::from(s.clone()).reason.as_deref() == Some("PERMISSION_DENIED")
}

/// Every role a key can hold, for the authorization matrices.
pub(crate) const ROLES: [&str; 6] = [
    "submitter",
    "approver",
    "operator",
    "agent",
    "viewer",
    "admin",
];

/// A new key of tenant `default` holding only `role`, for subject
/// `PREFIX-ROLE` (an agent principal for `agent`, else a person).
pub(crate) async fn role_key(s: &Stack, prefix: &str, role: &str) -> String {
    let kind = if role == "agent" {
        PrincipalKind::Agent
    } else {
        PrincipalKind::Human
    };
    s.key(&format!("{prefix}-{role}"), &[role], kind)
        .await
        .unwrap()
}

/// What each role may call, written out here independently of the server's
/// table (`Service/Method`, without the package).
pub(crate) fn allowed(role: &str) -> BTreeSet<&'static str> {
    const READ_AGENTS: &[&str] = &[
        "RegistryService/GetAgent",
        "RegistryService/ListAgents",
        "RegistryService/FindByCapability",
        "RegistryService/ListTools",
        "RegistryService/GetCapabilitiesSummary",
        "RegistryService/ListMcpServers",
    ];
    const READ_RUNS: &[&str] = &[
        "ApprovalService/GetRun",
        "ApprovalService/ListRuns",
        "ApprovalService/Watch",
        "ApprovalService/ListRunArtifacts",
        "ApprovalService/GetRunArtifact",
        "ApprovalService/GetReceipt",
    ];
    const READ_JOBS: &[&str] = &[
        "JobService/GetJob",
        "JobService/ListJobs",
        "JobService/WatchJob",
        "JobService/GetResult",
        "JobService/ListArtifacts",
        "JobService/GetArtifact",
        "JobService/ExplainJob",
        "ScheduleService/GetSchedule",
        "ScheduleService/ListSchedules",
        "TriggerService/GetTrigger",
        "TriggerService/ListTriggers",
    ];
    // Who may answer a given input task is the task's to say; the RPCs
    // are open to the people who could be named.
    const ANSWER: &[&str] = &[
        "JobService/SendInput",
        "JobService/ListInputRequests",
        "JobService/SendMessage",
        "JobService/ListMessages",
    ];
    const READ_BUDGETS: &[&str] = &[
        "LedgerService/GetBudget",
        "LedgerService/ListBudgets",
        "LedgerService/ListEntries",
        "LedgerService/Report",
        "LedgerService/EstimateCost",
        "LedgerService/Watch",
        "LedgerService/ListLimits",
    ];
    let mut set: BTreeSet<&'static str> = [
        "AuthService/WhoAmI",
        "AuthService/StartSession",
        "AuthService/EndSession",
    ]
    .into();
    let mut add = |xs: &[&'static str]| set.extend(xs.iter().copied());
    match role {
        "submitter" => {
            add(READ_AGENTS);
            add(READ_RUNS);
            add(READ_JOBS);
            add(ANSWER);
            add(&[
                "JobService/SubmitJob",
                "JobService/ValidateJob",
                "JobService/RerunJob",
                "JobService/CancelJob",
                "ScheduleService/CreateSchedule",
                "ScheduleService/PauseSchedule",
                "ScheduleService/ResumeSchedule",
                "ScheduleService/DeleteSchedule",
                "TriggerService/CreateTrigger",
                "TriggerService/DeleteTrigger",
                "TriggerService/FireTrigger",
                "ApprovalService/Propose",
                "ApprovalService/Cancel",
                "RouterService/Route",
            ]);
        }
        "approver" => {
            add(READ_AGENTS);
            add(READ_RUNS);
            add(READ_JOBS);
            add(ANSWER);
            add(READ_BUDGETS);
            add(&[
                "ApprovalService/Approve",
                "ApprovalService/Reject",
                "ApprovalService/ListAudit",
                "ApprovalService/VerifyAudit",
                "JobService/VerifyJournals",
                "JobService/ExportJournal",
                "LedgerService/VerifyJournal",
                "ApprovalService/ExportPromptBundle",
                "ApprovalService/ImportManualResult",
                // Where a run's tasks would go is part of deciding it.
                "RouterService/Route",
            ]);
        }
        "viewer" => {
            add(READ_AGENTS);
            add(READ_RUNS);
            add(READ_JOBS);
            add(READ_BUDGETS);
            add(&[
                "ApprovalService/ListAudit",
                "ApprovalService/VerifyAudit",
                "JobService/VerifyJournals",
                "JobService/ExportJournal",
                "LedgerService/VerifyJournal",
                "RouterService/Route",
            ]);
        }
        "operator" | "admin" => {
            // `GET /metrics` on every port (the HTTP door's matrix).
            add(&["metrics.read"]);
            add(READ_AGENTS);
            add(READ_RUNS);
            add(READ_JOBS);
            add(ANSWER);
            add(READ_BUDGETS);
            add(&[
                "ApprovalService/ListAudit",
                "ApprovalService/VerifyAudit",
                "JobService/VerifyJournals",
                "JobService/ExportJournal",
                "LedgerService/VerifyJournal",
                "ApprovalService/Cancel",
                "JobService/CancelJob",
                "ScheduleService/PauseSchedule",
                "ScheduleService/ResumeSchedule",
                "ScheduleService/DeleteSchedule",
                "TriggerService/DeleteTrigger",
                "RouterService/Route",
                "RegistryService/RegisterAgent",
                "RegistryService/Heartbeat",
                "RegistryService/DeregisterAgent",
                "RegistryService/RegisterA2aAgent",
                "RegistryService/RegisterTool",
                "RegistryService/DeregisterTool",
                "RegistryService/RegisterMcpServer",
                "RegistryService/DeregisterMcpServer",
                "WorkerService/SetWorkerState",
                "JobService/RetryDeadLetter",
                "JobService/DeleteDeadLetter",
                "NotificationService/ListDeliveries",
                "NotificationService/RetryDelivery",
            ]);
            if role == "admin" {
                add(&[
                    "LedgerService/CreateBudget",
                    "LedgerService/UpdateLimits",
                    "LedgerService/CloseBudget",
                    "AuthService/CreateKey",
                    "AuthService/ListKeys",
                    "AuthService/RevokeKey",
                    "ApprovalService/BreakGlassApprove",
                    "JobService/PruneJobs",
                ]);
            }
        }
        "agent" => {
            add(READ_AGENTS);
            add(&[
                "RegistryService/RegisterAgent",
                "RegistryService/Heartbeat",
                "RegistryService/DeregisterAgent",
                "RegistryService/RegisterA2aAgent",
                "RegistryService/RegisterTool",
                "RegistryService/DeregisterTool",
                "RegistryService/RegisterMcpServer",
                "RegistryService/DeregisterMcpServer",
                "RegistryService/CallMcpTool",
                "RegistryService/ReportOutcome",
                "LedgerService/Reserve",
                "LedgerService/Commit",
                "LedgerService/Release",
                "JobService/SubmitJob",
                "JobService/ValidateJob",
                "JobService/RerunJob",
                // Only as a sender a trigger names (its jobs are the
                // creator's): anyone else finds no trigger.
                "TriggerService/FireTrigger",
                "WorkerService/Fetch",
                "WorkerService/Ack",
                "WorkerService/Nack",
                "WorkerService/Heartbeat",
            ]);
            add(READ_BUDGETS);
            add(READ_JOBS);
        }
        other => panic!("unknown role {other}"),
    }
    set
}

#[tokio::test]
async fn every_rpc_in_the_descriptor_set_is_in_the_authorization_table() {
    let all = methods();
    assert!(all.len() > 50, "the descriptor set lists the services");
    let unlisted: Vec<_> = all
        .iter()
        .filter(|(p, _)| switchyard_kit::auth::access(p) == switchyard_kit::auth::Access::Unknown)
        .collect();
    assert!(
        unlisted.is_empty(),
        "RPCs missing from the table: {unlisted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorization_matrix_holds_for_every_role_and_rpc() {
    let s = Stack::start().await.unwrap();
    let roles = ROLES;
    let all = methods();
    let (mut tried, mut unauthorized_successes, mut wrong_denials) = (0, Vec::new(), Vec::new());
    for role in roles {
        let token = role_key(&s, "m", role).await;
        let expected = allowed(role);
        for (path, streaming) in &all {
            let short = path.rsplit_once('.').map_or(path.as_str(), |(_, m)| m);
            // Agent and tool endpoints the stack hosts are for its own
            // built-in agents; ToolService is not hosted at all.
            let hosted = !path.contains("switchyard.agent.v1.ToolService");
            if !hosted {
                continue;
            }
            let status = call(s.channel_with(&token).await.unwrap(), path, *streaming).await;
            tried += 1;
            let want = expected.contains(short);
            match (want, denied(&status)) {
                (false, false) => unauthorized_successes.push(format!("{role} {path}: {status:?}")),
                (true, true) => wrong_denials.push(format!("{role} {path}")),
                _ => {}
            }
        }
    }
    println!(
        "authorization matrix: {tried} (role x RPC) pairs tried, {} unauthorized successes, {} wrong denials",
        unauthorized_successes.len(),
        wrong_denials.len()
    );
    assert!(
        unauthorized_successes.is_empty(),
        "unauthorized successes:\n{}",
        unauthorized_successes.join("\n")
    );
    assert!(
        wrong_denials.is_empty(),
        "wrongly denied:\n{}",
        wrong_denials.join("\n")
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_valid_credential_only_health_and_reflection_answer() {
    let s = Stack::start().await.unwrap();
    let forged = format!("syk_000000000000_{}", "0".repeat(64));
    for (token, reason) in [
        (None, "AUTH_REQUIRED"),
        (Some(forged.as_str()), "AUTH_INVALID"),
    ] {
        for (path, streaming) in methods() {
            let ch = match token {
                Some(t) => s.channel_with(t).await.unwrap(),
                None => switchyard_kit::client::authed(s.raw_channel().await.unwrap(), None),
            };
            let st = call(ch, &path, streaming).await;
            if path.starts_with("/switchyard.agent.v1.ToolService") {
                continue;
            }
            assert_eq!(st.code(), Code::Unauthenticated, "{path}: {st:?}");
            assert_eq!(ApiError::from(st).reason.as_deref(), Some(reason), "{path}");
        }
    }
    let health = call(
        switchyard_kit::client::authed(s.raw_channel().await.unwrap(), None),
        "/grpc.health.v1.Health/Check",
        false,
    )
    .await;
    assert_eq!(health.code(), Code::Ok, "probes need no credential");
    s.stop().await.unwrap();
}

fn reason(e: tonic::Status) -> (Code, String) {
    let code = e.code();
    (code, ApiError::from(e).reason.unwrap_or_default())
}

const GATED: &str = r#"{"job_id":"JOB","approval":{"intent":"echo","requires_approval":true},
    "tasks":[{"id":"t","agent":{"capability":"builtin.echo","input":{"text":"hi"}}}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_spoofing_attacks_fail() {
    let s = Stack::start().await.unwrap();
    let mut alice = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    let job = submit(&mut alice, &GATED.replace("JOB", "spoof"))
        .await
        .unwrap();
    assert_eq!(job.submitted_by, "alice");

    // 1. Header spoofing: alice, refused, re-sends as "bob-anything".
    let mut as_alice = ApprovalServiceClient::new(s.channel_as("alice").await.unwrap());
    let approve = |who: &str| {
        let mut r = tonic::Request::new(ApproveRequest {
            run_id: job.run_id.clone(),
            comment: String::new(),
            edit: None,
            scope: None,
        });
        r.metadata_mut()
            .insert("x-switchyard-actor", who.parse().unwrap());
        r
    };
    for who in ["alice", "bob-anything", "bob"] {
        let e = as_alice.approve(approve(who)).await.unwrap_err();
        assert_eq!(
            reason(e),
            (Code::PermissionDenied, "PERMISSION_DENIED".into())
        );
    }
    // ... or claims to be a service acting for bob.
    let mut r = approve("bob");
    r.metadata_mut().insert(
        "x-switchyard-on-behalf-of",
        "human:default:bob".parse().unwrap(),
    );
    let e = as_alice.approve(r).await.unwrap_err();
    assert_eq!(ApiError::from(e).metadata["permission"], "impersonate");

    // 2. Body created_by: alice proposes a run "created by bob".
    let run = Run {
        created_by: "bob".into(),
        intent: "x".into(),
        ..serde_run()
    };
    let e = as_alice
        .propose(ProposeRequest {
            run: Some(run),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let api = ApiError::from(e);
    assert_eq!(api.code, Code::InvalidArgument);
    assert!(
        api.violations.iter().any(|v| v.field == "run.created_by"),
        "{api:?}"
    );

    // 3. An anonymous job is not accepted at all.
    let mut anon = JobServiceClient::new(switchyard_kit::client::authed(
        s.raw_channel().await.unwrap(),
        None,
    ));
    let e = anon
        .submit_job(SubmitJobRequest {
            document: GATED.replace("JOB", "anon"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(e), (Code::Unauthenticated, "AUTH_REQUIRED".into()));

    // The job is still pending: nothing ran; bob's approval runs it.
    approve_as(&s, "bob", &job.run_id).await.unwrap();
    let r = finish(&mut alice, "spoof").await;
    assert_eq!(
        r.state,
        switchyard_proto::executor::v1::JobState::Completed as i32
    );
    s.stop().await.unwrap();
}

/// A minimal valid run for Propose.
fn serde_run() -> Run {
    Run {
        intent: "do a thing".into(),
        max_tokens: 100,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_who_is_also_an_approver_cannot_approve_their_own_job() {
    let s = Stack::start().await.unwrap();
    let carol = s
        .key("carol", &["submitter", "approver"], PrincipalKind::Human)
        .await
        .unwrap();
    let mut jobs = JobServiceClient::new(s.channel_with(&carol).await.unwrap());
    let job = submit(&mut jobs, &GATED.replace("JOB", "own"))
        .await
        .unwrap();
    let mut carol_approves = ApprovalServiceClient::new(s.channel_with(&carol).await.unwrap());
    let mut r = tonic::Request::new(ApproveRequest {
        run_id: job.run_id.clone(),
        comment: String::new(),
        edit: None,
        scope: None,
    });
    // A header naming someone else changes nothing.
    r.metadata_mut()
        .insert("x-switchyard-actor", "dave".parse().unwrap());
    let e = carol_approves.approve(r).await.unwrap_err();
    assert_eq!(
        reason(e),
        (Code::PermissionDenied, "SEPARATION_OF_DUTIES".into())
    );
    let run = approve_as(&s, "bob", &job.run_id).await.unwrap();
    assert_eq!(run.created_by, "carol");
    let audit = audit_of(&s, "admin", &job.run_id).await;
    let proposed = audit.iter().find(|a| a.event_type == "proposed").unwrap();
    assert_eq!(
        proposed.actor, "carol (via service:switchyard)",
        "both identities are recorded"
    );
    let approved = audit.iter().find(|a| a.event_type == "approved").unwrap();
    assert_eq!(approved.actor, "bob");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_refused_on_the_very_next_call() {
    let s = Stack::start().await.unwrap();
    let mut admin = AuthServiceClient::new(s.channel_as("admin").await.unwrap());
    let made = admin
        .create_key(CreateKeyRequest {
            subject: "ci".into(),
            roles: vec!["viewer".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut ci = AuthServiceClient::new(s.channel_with(&made.secret).await.unwrap());
    let me = ci.who_am_i(WhoAmIRequest {}).await.unwrap().into_inner();
    assert_eq!((me.subject.as_str(), me.tenant.as_str()), ("ci", "default"));
    assert_eq!(me.roles, ["viewer"]);
    admin
        .revoke_key(RevokeKeyRequest {
            key_id: made.key.unwrap().key_id,
        })
        .await
        .unwrap();
    let e = ci.who_am_i(WhoAmIRequest {}).await.unwrap_err();
    assert_eq!(reason(e), (Code::Unauthenticated, "AUTH_INVALID".into()));

    // Keys expire too.
    let short = admin
        .create_key(CreateKeyRequest {
            subject: "short".into(),
            roles: vec!["viewer".into()],
            ttl_secs: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .secret;
    let mut short = AuthServiceClient::new(s.channel_with(&short).await.unwrap());
    short.who_am_i(WhoAmIRequest {}).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let e = loop {
        match short.who_am_i(WhoAmIRequest {}).await {
            Err(e) => break e,
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Ok(_) => panic!("the key never expired"),
        }
    };
    assert_eq!(reason(e), (Code::Unauthenticated, "AUTH_EXPIRED".into()));
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tenants_objects_are_not_found_and_never_listed() {
    let s = Stack::start().await.unwrap();
    // The cluster operator (service token) makes an admin for tenant globex.
    let globex_admin = tenant_key(
        &s,
        "globex",
        "g-admin",
        &["admin", "submitter", "viewer"],
        PrincipalKind::Human,
    )
    .await;
    let g = s.channel_with(&globex_admin).await.unwrap();

    // default's objects: a job (alice), its run, a budget.
    let mut alice = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    let job = submit(&mut alice, &GATED.replace("JOB", "secret-job"))
        .await
        .unwrap();
    LedgerServiceClient::new(s.channel_as("admin").await.unwrap())
        .create_budget(CreateBudgetRequest {
            budget_id: "org/default".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let mut gj = JobServiceClient::new(g.clone());
    let e = gj
        .get_job(GetJobRequest {
            job_id: "secret-job".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(e), (Code::NotFound, "JOB_NOT_FOUND".into()));
    let listed = gj
        .list_jobs(ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert!(listed.is_empty(), "{listed:?}");
    let mut ga = ApprovalServiceClient::new(g.clone());
    let e = ga
        .get_run(switchyard_proto::approval::v1::GetRunRequest {
            run_id: job.run_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(e), (Code::NotFound, "RUN_NOT_FOUND".into()));
    let runs = ga
        .list_runs(switchyard_proto::approval::v1::ListRunsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .runs;
    assert!(runs.is_empty());
    let mut gl = LedgerServiceClient::new(g.clone());
    let e = gl
        .get_budget(GetBudgetRequest {
            budget_id: "org/default".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(e), (Code::NotFound, "BUDGET_NOT_FOUND".into()));
    let e = gl
        .create_budget(CreateBudgetRequest {
            budget_id: "org/globex/x".into(),
            parent_id: "org/default".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        reason(e),
        (Code::NotFound, "BUDGET_NOT_FOUND".into()),
        "no parent across tenants"
    );
    let budgets = gl
        .list_budgets(ListBudgetsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .budgets;
    assert!(budgets.iter().all(|b| b.tenant == "globex"), "{budgets:?}");

    // A submitter sees only their own jobs, even in their tenant.
    let other = s
        .key("dan", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let mut dan = JobServiceClient::new(s.channel_with(&other).await.unwrap());
    let e = dan
        .get_job(GetJobRequest {
            job_id: "secret-job".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(e), (Code::NotFound, "JOB_NOT_FOUND".into()));
    // An approver of the tenant sees it (to decide on it).
    let mut bob = JobServiceClient::new(s.channel_as("bob").await.unwrap());
    bob.get_job(GetJobRequest {
        job_id: "secret-job".into(),
    })
    .await
    .unwrap();
    s.stop().await.unwrap();
}

/// A run as alice proposes it, estimated at `micro_usd`.
fn priced_run(micro_usd: i64) -> Run {
    use switchyard_proto::approval::v1::{ContextPack, CostEstimate, Target};
    Run {
        schema_version: "agent_run_spec/v1".into(),
        requires_approval: true,
        target: Some(Target {
            org: "acme".into(),
            repo: "docs".into(),
            work_item_ids: vec!["feat:x".into()],
        }),
        intent: "Draft the contracts pages".into(),
        context_pack: Some(ContextPack {
            pack_id: "cp_1".into(),
            hash: format!("sha256:{}", "ab".repeat(32)),
            version: "context_pack/v1".into(),
            inputs: vec!["feat:x".into()],
        }),
        model: "gpt-5".into(),
        max_tokens: 1_000,
        cost_estimate: Some(CostEstimate {
            estimated_input_tokens: 500,
            estimated_output_tokens: 500,
            estimated_cost: Some(switchyard_proto::common::v1::Money { micro_usd }),
        }),
        tools_allowed: vec!["none".into()],
        outputs_allowed: vec!["propose_changeset_bundle".into()],
        ..Default::default()
    }
}

async fn propose_as_alice(s: &Stack, micro_usd: i64) -> Run {
    ApprovalServiceClient::new(s.channel_as("alice").await.unwrap())
        .propose(ProposeRequest {
            run: Some(priced_run(micro_usd)),
            skip_policies: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
}

fn status(r: &Run) -> switchyard_proto::approval::v1::RunStatus {
    switchyard_proto::approval::v1::RunStatus::try_from(r.status).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_threshold_two_distinct_approvers_are_needed() {
    use switchyard_proto::approval::v1::RunStatus;
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.approval.two_person_above_micro_usd = Some(100_000)
    })
    .await
    .unwrap();
    let dave = s
        .key("dave", &["approver"], PrincipalKind::Human)
        .await
        .unwrap();

    // Below the threshold one approval does.
    let small = propose_as_alice(&s, 50_000).await;
    let r = approve_as(&s, "bob", &small.run_id).await.unwrap();
    assert_eq!(status(&r), RunStatus::Approved);

    let big = propose_as_alice(&s, 250_000).await;
    let r = approve_as(&s, "bob", &big.run_id).await.unwrap();
    assert_eq!(
        status(&r),
        RunStatus::Proposed,
        "waits for a second approver"
    );
    assert_eq!(r.approved_by, ["bob"]);
    let e = approve_as(&s, "bob", &big.run_id).await.unwrap_err();
    assert_eq!(
        reason(e),
        (Code::FailedPrecondition, "SECOND_APPROVAL_REQUIRED".into())
    );
    let r = ApprovalServiceClient::new(s.channel_with(&dave).await.unwrap())
        .approve(ApproveRequest {
            run_id: big.run_id.clone(),
            comment: "second".into(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(status(&r), RunStatus::Approved);
    assert_eq!(r.approved_by, ["bob", "dave"]);
    let events: Vec<String> = audit_of(&s, "admin", &big.run_id)
        .await
        .into_iter()
        .map(|a| format!("{}:{}", a.event_type, a.actor))
        .collect();
    assert_eq!(
        events[events.len() - 2..],
        ["approval_recorded:bob", "approved:dave"]
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_is_admin_only_needs_a_reason_and_is_audited() {
    use switchyard_proto::approval::v1::{BreakGlassApproveRequest, RunStatus};
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.approval.two_person_above_micro_usd = Some(0)
    })
    .await
    .unwrap();
    let run = propose_as_alice(&s, 900_000).await;
    let mut admin = ApprovalServiceClient::new(s.channel_as("admin").await.unwrap());
    // Admin is not an approver.
    let e = admin
        .approve(ApproveRequest {
            run_id: run.run_id.clone(),
            comment: String::new(),
            edit: None,
            scope: None,
        })
        .await
        .unwrap_err();
    assert_eq!(
        reason(e),
        (Code::PermissionDenied, "PERMISSION_DENIED".into())
    );
    // An approver cannot break glass.
    let glass = |reason: &str| BreakGlassApproveRequest {
        run_id: run.run_id.clone(),
        reason: reason.into(),
    };
    let e = approvals_as(&s, "bob")
        .await
        .break_glass_approve(glass("production is down, approving"))
        .await
        .unwrap_err();
    assert_eq!(ApiError::from(e).metadata["permission"], "run.break_glass");
    // A reason is required.
    let e = admin
        .break_glass_approve(glass("because"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let r = admin
        .break_glass_approve(glass("incident 4711: on-call lead unreachable"))
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(status(&r), RunStatus::Approved, "no second approver needed");
    let audit = audit_of(&s, "admin", &run.run_id).await;
    let glass = audit
        .iter()
        .find(|a| a.event_type == "break_glass_approved")
        .unwrap();
    assert_eq!(glass.actor, "admin");
    assert_eq!(glass.reason, "incident 4711: on-call lead unreachable");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_change_only_their_own_registrations_and_route_only_in_their_tenant() {
    use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
    use switchyard_proto::registry::v1::{
        DeregisterAgentRequest, HeartbeatRequest, ListAgentsRequest, RegisterAgentRequest,
    };
    use switchyard_proto::router::v1::RouteRequest;
    use switchyard_proto::router::v1::router_service_client::RouterServiceClient;
    let s = Stack::start().await.unwrap();
    let reg = |token: String| {
        let s = &s;
        async move { RegistryServiceClient::new(s.channel_with(&token).await.unwrap()) }
    };
    let a = s
        .key("agent-a", &["agent"], PrincipalKind::Agent)
        .await
        .unwrap();
    let b = s
        .key("agent-b", &["agent"], PrincipalKind::Agent)
        .await
        .unwrap();
    let mut ra = reg(a).await;
    let mut rb = reg(b).await;
    ra.register_agent(RegisterAgentRequest {
        agent: Some(agent("alpha", "cap.t", 80, 0)),
    })
    .await
    .unwrap();
    let hb = HeartbeatRequest {
        agent_id: "alpha".into(),
        in_flight: 0,
    };
    let not_owner = |e: tonic::Status| {
        let api = ApiError::from(e);
        assert_eq!(api.code, Code::PermissionDenied, "{api:?}");
        assert_eq!(api.metadata["permission"], "agent.owner");
    };
    not_owner(rb.heartbeat(hb.clone()).await.unwrap_err());
    not_owner(
        rb.deregister_agent(DeregisterAgentRequest {
            agent_id: "alpha".into(),
        })
        .await
        .unwrap_err(),
    );
    not_owner(
        rb.register_agent(RegisterAgentRequest {
            agent: Some(agent("alpha", "cap.evil", 99, 0)),
        })
        .await
        .unwrap_err(),
    );
    // The platform's built-in agents are not a tenant agent's to change.
    let e = rb
        .heartbeat(HeartbeatRequest {
            agent_id: "builtin".into(),
            in_flight: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(ApiError::from(e).metadata["owner"], "platform");
    // Its owner and the tenant's operators may.
    ra.heartbeat(hb.clone()).await.unwrap();
    RegistryServiceClient::new(s.channel().await.unwrap())
        .heartbeat(hb)
        .await
        .unwrap();

    // Another tenant's agent with the same capability is not routed here.
    let globex_agent = tenant_key(&s, "globex", "g-agent", &["agent"], PrincipalKind::Agent).await;
    reg(globex_agent)
        .await
        .register_agent(RegisterAgentRequest {
            agent: Some(agent("beta", "cap.t", 99, 0)),
        })
        .await
        .unwrap();
    let route = |who: &'static str| {
        let s = &s;
        async move {
            RouterServiceClient::new(s.channel_as(who).await.unwrap())
                .route(RouteRequest {
                    capability: "cap.t".into(),
                    constraints: None,
                    limit: 10,
                })
                .await
                .map(|r| {
                    let mut ids: Vec<String> = r
                        .into_inner()
                        .candidates
                        .into_iter()
                        .map(|c| c.agent_id)
                        .collect();
                    ids.sort();
                    ids
                })
                .unwrap_or_default()
        }
    };
    // The router learns of both through its watch (the cluster operator
    // sees every tenant's) ...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while route("operator").await != ["alpha", "beta"] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the router never indexed both"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and routes only its own tenant's (and shared) agents for alice.
    assert_eq!(route("alice").await, ["alpha"]);
    let listed: Vec<String> = RegistryServiceClient::new(s.channel_as("alice").await.unwrap())
        .list_agents(ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .agents
        .into_iter()
        .filter_map(|a| a.spec.map(|s| s.id))
        .collect();
    assert!(
        listed.contains(&"alpha".into()) && !listed.contains(&"beta".into()),
        "{listed:?}"
    );
    s.stop().await.unwrap();
}

/// Sends raw bytes as the request message; decodes the answer as nothing.
#[derive(Clone, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawCodec;
    type Decoder = tonic_prost::ProstDecoder<()>;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<(), ()>::default().decoder()
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut as _;
        dst.put_slice(&item);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_argument_with_a_reason() {
    let s = Stack::start().await.unwrap();
    let cases: [(&str, Vec<u8>); 2] = [
        // GetJobRequest.job_id (field 1, a string) holding invalid UTF-8.
        (
            "/switchyard.executor.v1.JobService/GetJob",
            vec![0x0a, 0x02, 0xff, 0xfe],
        ),
        // Not protobuf at all: a field header claiming more bytes than follow.
        (
            "/switchyard.registry.v1.RegistryService/ListAgents",
            vec![0x0a, 0x7f, 0x01],
        ),
    ];
    for (path, bytes) in cases {
        let mut grpc = tonic::client::Grpc::new(s.channel().await.unwrap());
        grpc.ready().await.unwrap();
        let e = grpc
            .unary(
                tonic::Request::new(bytes),
                http::uri::PathAndQuery::from_static(path),
                RawCodec,
            )
            .await
            .unwrap_err();
        assert_eq!(
            reason(e),
            (Code::InvalidArgument, "MALFORMED_REQUEST".into()),
            "{path}"
        );
    }
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_submits_only_delegated_child_jobs() {
    let s = Stack::start().await.unwrap();
    let agent = s
        .key("worker-agent", &["agent"], PrincipalKind::Agent)
        .await
        .unwrap();
    let mut jobs = JobServiceClient::new(s.channel_with(&agent).await.unwrap());
    let e = submit(&mut jobs, &GATED.replace("JOB", "from-agent"))
        .await
        .unwrap_err();
    let api = ApiError::from(e);
    assert_eq!(api.code, Code::PermissionDenied, "{api:?}");
    assert!(
        api.message.contains("delegated child jobs"),
        "{}",
        api.message
    );
    // A delegation naming no existing job is refused as such, not run.
    let doc = r#"{"job_id":"child","delegation":{"parent_job_id":"nope"},
        "tasks":[{"id":"t","agent":{"capability":"builtin.echo","input":{"text":"hi"}}}]}"#;
    let e = submit(&mut jobs, doc).await.unwrap_err();
    assert_eq!(reason(e), (Code::InvalidArgument, "JOB_NOT_FOUND".into()));
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_service_does_for_a_user_is_audited_under_both_names() {
    let s = Stack::start().await.unwrap();
    let mut alice = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    let job = submit(&mut alice, &GATED.replace("JOB", "to-cancel"))
        .await
        .unwrap();
    alice
        .cancel_job(switchyard_proto::executor::v1::CancelJobRequest {
            job_id: "to-cancel".into(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap();
    let audit = audit_of(&s, "bob", &job.run_id).await;
    let actors: Vec<(String, String)> =
        audit.into_iter().map(|a| (a.event_type, a.actor)).collect();
    for event in ["proposed", "cancelled"] {
        assert!(
            actors.contains(&(event.into(), "alice (via service:switchyard)".into())),
            "{event}: {actors:?}"
        );
    }
    s.stop().await.unwrap();
}
