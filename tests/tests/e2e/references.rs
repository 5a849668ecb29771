//! Fields that name another object are authorized as references, not
//! trusted because the RPC was allowed: job ids that would be paths,
//! `approved_under`, delegation parents, the budgets an agent key spends
//! on, and figures that would overflow. Each attack is tried as the caller
//! an outside tester used (a plain submitter, another submitter, the dev
//! `agents` key) against the in-process stack over real gRPC.

#![allow(clippy::unwrap_used)]

use crate::common::*;
use switchyard_kit::auth::grant::{self, Grant};
use switchyard_kit::error::ApiError;
use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::approval::v1::{ClaimOnApproval, ProposeRequest, Run};
use switchyard_proto::auth::v1::PrincipalKind;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{JobState, SubmitJobRequest};
use switchyard_proto::ledger::v1::ReserveRequest;
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_testkit::Stack;
use tonic::Code;

fn reason(e: &tonic::Status) -> (Code, String) {
    (
        e.code(),
        ApiError::from(e.clone()).reason.unwrap_or_default(),
    )
}

async fn jobs_as(s: &Stack, token: &str) -> Jobs {
    JobServiceClient::new(s.channel_with(token).await.unwrap())
}

/// A zero-cost job the default policy approves, that stays active for a
/// while (a built-in agent sleeping).
fn long_job(id: &str) -> String {
    format!(
        r#"{{"job_id":"{id}","tasks":[{{"id":"t","agent":{{"capability":"builtin.sleep","input":{{"ms":20000}}}}}}]}}"#
    )
}

/// A child of `parent` (a zero-cost built-in call).
fn child_of(id: &str, parent: &str, requires_approval: bool) -> String {
    format!(
        r#"{{"job_id":"{id}","delegation":{{"parent_job_id":"{parent}"}},
            "approval":{{"requires_approval":{requires_approval}}},
            "tasks":[{{"id":"t","agent":{{"capability":"builtin.echo","input":{{"x":1}}}}}}]}}"#
    )
}

/// A stack where alice's zero-cost job `job_id` is running: a parent to
/// name, a run to cover, a budget to spend on.
async fn with_running_job(job_id: &str) -> (Stack, Jobs) {
    let s = Stack::start().await.unwrap();
    let mut alice = jobs_as(&s, &s.token("alice").unwrap()).await;
    submit(&mut alice, &long_job(job_id)).await.unwrap();
    active(&mut alice, job_id).await;
    (s, alice)
}

/// A grant for task `t` of `job_id` in tenant `default`, as the executor
/// would sign it: on `budget_id`, `max_tokens` per reservation, ending
/// `expires_in` ms from now.
fn grant_for(job_id: &str, budget_id: &str, max_tokens: u64, expires_in: i64) -> Grant {
    Grant {
        job_id: job_id.into(),
        task_id: "t".into(),
        agent_id: "a".into(),
        tenant: "default".into(),
        budget_id: budget_id.into(),
        max_tokens,
        expires_ms: (switchyard_kit::time::now_ms() as i64 + expires_in) as u64,
    }
}

async fn active(c: &mut Jobs, job_id: &str) {
    for _ in 0..200 {
        if job(c, job_id).await.state == JobState::Active as i32 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("job {job_id} never became active");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_id_that_would_be_a_path_is_refused_in_every_format() {
    let s = Stack::start().await.unwrap();
    let mut alice = jobs_as(&s, &s.token("alice").unwrap()).await;
    let bad = "a/../../../../etc";
    let docs = [
        // Native JobSpec.
        format!(r#"{{"job_id":"{bad}","tasks":[{{"id":"t","command":{{"command":"true"}}}}]}}"#),
        // AGEniX envelope (RESP's PLAN.SUBMIT posts this).
        format!(
            r#"{{"job_id":"{bad}","plan_id":"p","tasks":[{{"task_number":1,"command":"true"}}]}}"#
        ),
        // AITP task (REST's POST /aitp/tasks).
        format!(
            r#"{{"task_id":"{bad}","name":"n","subtasks":[{{"subtask_id":"s","agent_capability":"builtin.echo"}}]}}"#
        ),
        // OJS job.
        format!(r#"{{"id":"{bad}","type":"agent.research","ext_agent_model":"m"}}"#),
    ];
    for doc in docs {
        let e = submit(&mut alice, &doc).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{doc}: {e:?}");
        let api = ApiError::from(e);
        // Named as the document names it: AITP's `task_id`.
        let field = if doc.contains("\"subtasks\"") {
            "task_id"
        } else {
            "job_id"
        };
        assert!(
            api.violations
                .iter()
                .any(|v| v.field == field && v.description.contains("'..'")),
            "{doc}: {api:?}"
        );
    }
    for bad in ["x..y", "a/b", "..", "a\u{1}b"] {
        let doc = format!(
            r#"{{"job_id":{bad:?},"tasks":[{{"id":"t","command":{{"command":"true"}}}}]}}"#
        );
        let e = submit(&mut alice, &doc).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}");
    }
    s.stop().await.unwrap();
}

/// Mallory: a person of another tenant, with a submitter's and an
/// agent's roles there.
async fn mallory(s: &Stack) -> String {
    tenant_key(
        s,
        "evil",
        "mallory",
        &["submitter", "agent"],
        PrincipalKind::Human,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_with_a_proposal_is_refused_to_submitters_agent_keys_and_other_tenants() {
    let (s, _alice) = with_running_job("claimed").await;
    let other = mallory(&s).await;
    let free = Run {
        intent: "costs nothing".into(),
        max_tokens: 10,
        cost_estimate: Some(switchyard_proto::approval::v1::CostEstimate {
            estimated_cost: Some(switchyard_proto::common::v1::Money { micro_usd: 0 }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let ask = || ProposeRequest {
        run: Some(free.clone()),
        skip_policies: false,
        approved_under: String::new(),
        claim: Some(ClaimOnApproval {
            worker_id: "executor".into(),
            lease_secs: 30,
        }),
        budget_left: None,
    };
    for who in ["alice", "agents"] {
        let e = approvals_as(&s, who)
            .await
            .propose(ask())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{who}: {}", e.message());
    }
    let e = ApprovalServiceClient::new(s.channel_with(&other).await.unwrap())
        .propose(ask())
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::PermissionDenied,
        "another tenant: {}",
        e.message()
    );
    // Nothing was proposed by any of them: the only runs are the job's.
    let runs = ApprovalServiceClient::new(s.channel_as("admin").await.unwrap())
        .list_runs(switchyard_proto::approval::v1::ListRunsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .runs;
    assert!(
        runs.iter().all(|r| r.intent != "costs nothing"),
        "{:?}",
        runs.iter().map(|r| &r.intent).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_under_is_never_accepted_from_a_client() {
    let (s, _alice) = with_running_job("cover").await;
    // Her own running run, named to cover a $5,000 proposal.
    let run = Run {
        intent: "spend a lot".into(),
        max_tokens: 5_000_000,
        ..Default::default()
    };
    for who in ["alice", "agents"] {
        let e = approvals_as(&s, who)
            .await
            .propose(ProposeRequest {
                run: Some(run.clone()),
                skip_policies: false,
                approved_under: "run-cover".into(),
                claim: None,
                budget_left: None,
            })
            .await
            .unwrap_err();
        if who == "alice" {
            assert_eq!(
                reason(&e),
                (Code::InvalidArgument, "INVALID_ARGUMENT".into())
            );
            assert!(e.message().contains("approved_under"), "{}", e.message());
        } else {
            // An agent key may not propose at all.
            assert_eq!(e.code(), Code::PermissionDenied, "{who}: {e:?}");
        }
    }
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_budget_has_left_is_never_accepted_from_a_client() {
    let (s, _alice) = with_running_job("left").await;
    let other = mallory(&s).await;
    // A proposer claiming a vast budget would choose what the policies'
    // `context.remaining` reads.
    let ask = || ProposeRequest {
        run: Some(Run {
            intent: "spend while the budget looks full".into(),
            max_tokens: 10,
            ..Default::default()
        }),
        budget_left: Some(switchyard_proto::approval::v1::BudgetLeft {
            tokens: Some(u64::MAX / 2),
            cost: Some(switchyard_proto::common::v1::Money {
                micro_usd: i64::MAX / 2,
            }),
        }),
        ..Default::default()
    };
    // (Approvers and admins may not propose at all.)
    let e = approvals_as(&s, "alice")
        .await
        .propose(ask())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "the submitter: {e:?}");
    assert!(e.message().contains("budget_left"), "{}", e.message());
    let e = approvals_as(&s, "agents")
        .await
        .propose(ask())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "an agent key: {e:?}");
    let e = ApprovalServiceClient::new(s.channel_with(&other).await.unwrap())
        .propose(ask())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "another tenant: {e:?}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_parents_submitter_or_its_invoked_agent_may_hang_a_child_under_it() {
    let (s, mut alice) = with_running_job("parent").await;

    // Another submitter of the tenant, and the dev agents key without a
    // grant: alice's job does not exist for them.
    let carol = s
        .key("carol", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    for (who, token) in [("carol", carol), ("agents", s.token("agents").unwrap())] {
        let mut c = jobs_as(&s, &token).await;
        let e = submit(&mut c, &child_of(&format!("c-{who}"), "parent", false))
            .await
            .unwrap_err();
        assert_eq!(
            reason(&e),
            (Code::NotFound, "JOB_NOT_FOUND".into()),
            "{who}: {e:?}"
        );
    }

    // A forged grant, and a real grant for another job.
    let mut agents = jobs_as(&s, &s.token("agents").unwrap()).await;
    let for_job = |job_id: &str| grant_for(job_id, &format!("job-{job_id}"), 1000, 60_000);
    let forged = grant::GrantKey::from_secret(b"not this deployment's").sign(&for_job("parent"));
    let other = grant::key().sign(&for_job("elsewhere"));
    for (what, g) in [("forged", forged), ("other job", other)] {
        let e = agents
            .submit_job(SubmitJobRequest {
                document: child_of("c-granted", "parent", false),
                invocation_grant: g,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            reason(&e),
            (Code::PermissionDenied, "GRANT_REFUSED".into()),
            "{what}"
        );
    }
    // The grant of the parent's invocation: accepted, as alice's child.
    let child = agents
        .submit_job(SubmitJobRequest {
            document: child_of("c-granted", "parent", false),
            invocation_grant: grant::key().sign(&for_job("parent")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(child.submitted_by, "agents");

    // Alice's own child is accepted; when it asks for review it gets
    // review, parent or not.
    let own = submit(&mut alice, &child_of("c-own", "parent", false))
        .await
        .unwrap();
    assert_ne!(own.state, JobState::Pending as i32);
    let gated = submit(&mut alice, &child_of("c-gated", "parent", true))
        .await
        .unwrap();
    assert_eq!(gated.state, JobState::Pending as i32, "{gated:?}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_key_spends_only_on_the_budget_its_grant_names_within_its_ceiling() {
    let (s, _alice) = with_running_job("spender").await;
    let mut ledger = LedgerServiceClient::new(s.channel_as("agents").await.unwrap());
    let grant = |budget: &str, max_tokens: u64, expires_in: i64| {
        grant::key().sign(&grant_for("spender", budget, max_tokens, expires_in))
    };
    let reserve = |tokens: u64, g: String, key: &str| ReserveRequest {
        budget_id: "job-spender".into(),
        tokens,
        idempotency_key: key.into(),
        invocation_grant: g,
        ..Default::default()
    };
    let refused = [
        ("no grant", reserve(10, String::new(), "k1")),
        (
            "another budget",
            reserve(10, grant("org/other", 100, 60_000), "k2"),
        ),
        (
            "over the ceiling",
            reserve(900, grant("job-spender", 100, 60_000), "k3"),
        ),
        ("expired", reserve(10, grant("job-spender", 100, -1), "k4")),
        (
            "forged",
            reserve(
                10,
                grant("job-spender", 100, 60_000).replace('a', "b"),
                "k5",
            ),
        ),
    ];
    for (what, req) in refused {
        let e = ledger.reserve(req).await.unwrap_err();
        assert_eq!(
            reason(&e),
            (Code::PermissionDenied, "GRANT_REFUSED".into()),
            "{what}"
        );
    }
    let ok = ledger
        .reserve(reserve(10, grant("job-spender", 100, 60_000), "k6"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.reservation.unwrap().tokens, 10);
    // Room in a shared rate limit is claimed only as far as the tokens the
    // agent holds, and an agent cannot cool a provider key for everyone.
    let claim = |tokens: u64| switchyard_proto::ledger::v1::RateClaim {
        provider: "openai".into(),
        model: "gpt-4o".into(),
        key: "OPENAI_API_KEY".into(),
        tokens,
    };
    let mut over = reserve(10, grant("job-spender", 100, 60_000), "k7");
    over.rate = Some(claim(5_000));
    let e = ledger.reserve(over).await.unwrap_err();
    assert_eq!(
        reason(&e),
        (Code::InvalidArgument, "INVALID_ARGUMENT".into()),
        "{e:?}"
    );
    assert!(e.message().contains("rate.tokens"), "{e:?}");
    let mut backed = reserve(10, grant("job-spender", 100, 60_000), "k8");
    backed.rate = Some(claim(10));
    ledger.reserve(backed).await.unwrap();
    let e = ledger
        .cool_down(switchyard_proto::ledger::v1::CoolDownRequest {
            rate: Some(claim(0)),
            wait: None,
            why: "no".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_figure_that_would_overflow_is_a_field_violation_not_a_panic() {
    let s = Stack::start().await.unwrap();
    let mut alice = jobs_as(&s, &s.token("alice").unwrap()).await;
    let doc = format!(
        r#"{{"type":"agent.research","ext_agent_model":"m","ext_agent_max_tokens":{}}}"#,
        1u64 << 63
    );
    let e = submit(&mut alice, &doc).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let api = ApiError::from(e);
    assert!(
        api.violations
            .iter()
            .any(|v| v.field.ends_with("llm.max_tokens") && v.description.contains("at most")),
        "{api:?}"
    );
    // The service is still serving.
    submit(&mut alice, &long_job("after")).await.unwrap();
    s.stop().await.unwrap();
}

/// A bounded HTTP responder on 127.0.0.1: answers every request with
/// `response` (a whole HTTP/1.1 response) and counts the requests, for at
/// most 50 connections or until dropped.
struct Canned {
    port: u16,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Canned {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn canned(response: String) -> Canned {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    let task = tokio::spawn(async move {
        for _ in 0..50 {
            let Ok((mut sock, _)) = l.accept().await else {
                return;
            };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = vec![0u8; 16 * 1024];
            let _ = sock.read(&mut buf).await;
            let _ = sock.write_all(response.as_bytes()).await;
            let _ = sock.shutdown().await;
        }
    });
    Canned { port, hits, task }
}

fn http_json(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn mcp_http(name: &str, url: &str) -> switchyard_proto::registry::v1::McpServer {
    use switchyard_proto::registry::v1::{McpHttp, mcp_server::Transport};
    switchyard_proto::registry::v1::McpServer {
        name: name.into(),
        transport: Some(Transport::Http(McpHttp {
            url: url.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

async fn registry_as(
    s: &Stack,
    who: &str,
) -> switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient<
    switchyard_kit::client::Intercepted,
> {
    switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient::new(
        s.channel_as(who).await.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_egress_guard_refuses_userinfo_redirects_and_never_echoes_an_upstream_body() {
    use switchyard_proto::registry::v1::{RegisterA2aAgentRequest, RegisterMcpServerRequest};
    let s = Stack::start().await.unwrap();
    let mut reg = registry_as(&s, "admin").await;
    // A server that answers JSON that is not JSON-RPC, holding a secret.
    let leaky = canned(http_json(r#"{"secret":"s3cr3t-internal-value"}"#)).await;
    let e = reg
        .register_mcp_server(RegisterMcpServerRequest {
            server: Some(mcp_http(
                "leaky",
                &format!("http://127.0.0.1:{}/mcp", leaky.port),
            )),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&e).1, "MCP_SERVER_UNAVAILABLE", "{e:?}");
    assert!(!e.message().contains("s3cr3t"), "{}", e.message());
    assert!(leaky.hits.load(std::sync::atomic::Ordering::SeqCst) > 0);

    // User information in the URL is refused before anything is sent.
    let e = reg
        .register_mcp_server(RegisterMcpServerRequest {
            server: Some(mcp_http(
                "userinfo",
                &format!("http://allowed.example@127.0.0.1:{}/mcp", leaky.port),
            )),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("user information"), "{}", e.message());

    // A redirect from the card's URL is not followed.
    let elsewhere = canned(http_json("{}")).await;
    let redirect = canned(format!(
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{}/card\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        elsewhere.port
    ))
    .await;
    let e = reg
        .register_a2a_agent(RegisterA2aAgentRequest {
            card_url: format!("http://127.0.0.1:{}/card", redirect.port),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_ne!(e.code(), Code::Ok);
    assert_eq!(redirect.hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(
        elsewhere.hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_in_refused_ranges_are_not_registered_by_callers() {
    use switchyard_proto::registry::v1::{RegisterA2aAgentRequest, RegisterAgentRequest};
    // A deployment that does not allow loopback (the default outside dev).
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.registry.egress.allow_loopback = Some(false);
    })
    .await
    .unwrap();
    let mut agents = registry_as(&s, "agents").await;
    let mut spec = agent("probe", "probe.cap", 50, 0);
    spec.endpoint = "http://127.0.0.1:9".into();
    let e = agents
        .register_agent(RegisterAgentRequest { agent: Some(spec) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("allow_loopback"), "{}", e.message());
    let mut admin = registry_as(&s, "admin").await;
    let e = admin
        .register_a2a_agent(RegisterA2aAgentRequest {
            card_url: "http://169.254.169.254/latest/meta-data".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("allow_private"), "{}", e.message());
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_key_neither_vouches_for_itself_nor_reports_on_agents_it_does_not_own() {
    use switchyard_proto::registry::v1::{RegisterAgentRequest, ReportOutcomeRequest};
    let s = Stack::start().await.unwrap();
    let mut agents = registry_as(&s, "agents").await;
    let mut spec = agent("self_made", "probe.cap", 100, 0);
    spec.endpoint = "http://127.0.0.1:9".into();
    let made = agents
        .register_agent(RegisterAgentRequest { agent: Some(spec) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(made.agent.unwrap().spec.unwrap().trust_score, 50);
    let outcome = |agent_id: &str, capability: &str| ReportOutcomeRequest {
        agent_id: agent_id.into(),
        capability: capability.into(),
        success: false,
        latency: Some(prost_types::Duration {
            seconds: 3600,
            nanos: 0,
        }),
    };
    // The platform's built-in agent is not the agent key's to report on.
    let e = agents
        .report_outcome(outcome("builtin", "builtin.echo"))
        .await
        .unwrap_err();
    assert_eq!(
        reason(&e),
        (Code::NotFound, "AGENT_NOT_FOUND".into()),
        "{e:?}"
    );
    // Its own agent, it may.
    agents
        .report_outcome(outcome("self_made", "probe.cap"))
        .await
        .unwrap();
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_nests_only_under_a_budget_shared_with_its_submitter() {
    use switchyard_proto::ledger::v1::CreateBudgetRequest;
    let (s, mut alice) = with_running_job("someone").await;
    let mut admin = LedgerServiceClient::new(s.channel_as("admin").await.unwrap());
    for (id, shared) in [("org/closed", ""), ("org/open", "role:submitter")] {
        let labels = if shared.is_empty() {
            Default::default()
        } else {
            [("shared_with".to_owned(), shared.to_owned())].into()
        };
        admin
            .create_budget(CreateBudgetRequest {
                budget_id: id.into(),
                token_limit: Some(1_000_000),
                labels,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let under = |id: &str, parent: &str| {
        format!(
            r#"{{"job_id":"{id}","budget":{{"parent_budget_id":"{parent}"}},"tasks":[{{"id":"t","agent":{{"capability":"builtin.echo"}}}}]}}"#
        )
    };
    let carol = s
        .key("carol", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let mut carol = jobs_as(&s, &carol).await;
    // Not shared, and another user's job budget: refused, field named.
    for (who, parent) in [
        ("alice", "org/closed"),
        ("carol", "job-someone"),
        ("alice", "no/such/budget"),
    ] {
        let c = if who == "alice" {
            &mut alice
        } else {
            &mut carol
        };
        let e = submit(c, &under(&format!("x-{who}-{}", parent.len()), parent))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{who} {parent}: {e:?}");
        let api = ApiError::from(e);
        assert_eq!(api.reason.as_deref(), Some("BUDGET_NOT_FOUND"));
        assert!(
            api.violations
                .iter()
                .any(|v| v.field == "budget.parent_budget_id")
        );
    }
    // Shared with submitters: accepted.
    submit(&mut carol, &under("shared-ok", "org/open"))
        .await
        .unwrap();
    // Whoever manages budgets may name any of the tenant's.
    let mut tester = jobs_as(&s, &s.token("tester").unwrap()).await;
    submit(&mut tester, &under("admin-ok", "org/closed"))
        .await
        .unwrap();
    s.stop().await.unwrap();
}

/// Who tries a reference in the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// alice, who submitted the job the references name.
    Owner,
    /// carol, another submitter of alice's tenant.
    OtherSubmitter,
    /// mallory, a submitter and agent of another tenant.
    OtherTenant,
    /// the dev `agents` key, presenting no grant.
    AgentNoGrant,
    /// the dev `agents` key, with a valid grant for another job.
    AgentOtherGrant,
}

const CALLERS: [Caller; 5] = [
    Caller::Owner,
    Caller::OtherSubmitter,
    Caller::OtherTenant,
    Caller::AgentNoGrant,
    Caller::AgentOtherGrant,
];

/// The expected answer for each declared reference × caller, written out
/// here independently of the server (true: the call may go through).
/// Columns follow `CALLERS`.
const MATRIX: &[(&str, [bool; 5])] = &[
    // Only alice hangs a child under her job (an agent needs the parent's grant).
    (
        "switchyard.executor.v1.Delegation.parent_job_id",
        [true, false, false, false, false],
    ),
    // A job's own budget is never a client-named parent, not even its owner's.
    (
        "switchyard.executor.v1.JobBudget.parent_budget_id",
        [false, false, false, false, false],
    ),
    // Only an agent with this budget's grant reserves on it.
    (
        "switchyard.ledger.v1.ReserveRequest.budget_id",
        [false, false, false, false, false],
    ),
    // Only the executor names a covering run.
    (
        "switchyard.approval.v1.ProposeRequest.approved_under",
        [false, false, false, false, false],
    ),
    // Only alice (and tenant-wide readers) read her job and its run.
    (
        "switchyard.executor.v1.GetJobRequest.job_id",
        [true, false, false, false, false],
    ),
    (
        "switchyard.approval.v1.GetRunRequest.run_id",
        [true, false, false, false, false],
    ),
    // The platform's agent is nobody's to report on.
    (
        "switchyard.registry.v1.ReportOutcomeRequest.agent_id",
        [false, false, false, false, false],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_matrix_allows_exactly_what_the_table_says_for_every_caller() {
    use switchyard_proto::approval::v1::GetRunRequest;
    use switchyard_proto::executor::v1::GetJobRequest;
    use switchyard_proto::registry::v1::ReportOutcomeRequest;
    let (s, _alice) = with_running_job("owned").await;
    let mallory = mallory(&s).await;
    let carol = s
        .key("carol", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let token = |c: Caller| match c {
        Caller::Owner => s.token("alice").unwrap(),
        Caller::OtherSubmitter => carol.clone(),
        Caller::OtherTenant => mallory.clone(),
        Caller::AgentNoGrant | Caller::AgentOtherGrant => s.token("agents").unwrap(),
    };
    let grant_of = |c: Caller| match c {
        Caller::AgentOtherGrant => {
            grant::key().sign(&grant_for("elsewhere", "job-elsewhere", 1000, 60_000))
        }
        _ => String::new(),
    };
    let (mut tried, mut unauthorized) = (0, Vec::new());
    for (i, (field, expected)) in MATRIX.iter().enumerate() {
        assert!(
            switchyard_kit::auth::references::reference(field).is_some(),
            "{field} is not declared in REFERENCES"
        );
        for (c, allowed) in CALLERS.iter().zip(expected) {
            let ch = s.channel_with(&token(*c)).await.unwrap();
            let g = grant_of(*c);
            let id = format!("m{i}-{c:?}").to_lowercase();
            let went_through = match *field {
                "switchyard.executor.v1.Delegation.parent_job_id" => JobServiceClient::new(ch)
                    .submit_job(SubmitJobRequest {
                        document: child_of(&id, "owned", false),
                        invocation_grant: g,
                        ..Default::default()
                    })
                    .await
                    .is_ok(),
                "switchyard.executor.v1.JobBudget.parent_budget_id" => {
                    let doc = format!(
                        r#"{{"job_id":"{id}","budget":{{"parent_budget_id":"job-owned"}},"tasks":[{{"id":"t","agent":{{"capability":"builtin.echo"}}}}]}}"#
                    );
                    JobServiceClient::new(ch)
                        .submit_job(SubmitJobRequest {
                            document: doc,
                            invocation_grant: g,
                            ..Default::default()
                        })
                        .await
                        .is_ok()
                }
                "switchyard.ledger.v1.ReserveRequest.budget_id" => LedgerServiceClient::new(ch)
                    .reserve(ReserveRequest {
                        budget_id: "job-owned".into(),
                        tokens: 1,
                        idempotency_key: id.clone(),
                        invocation_grant: g,
                        ..Default::default()
                    })
                    .await
                    .is_ok(),
                "switchyard.approval.v1.ProposeRequest.approved_under" => {
                    switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient::new(ch)
                        .propose(ProposeRequest {
                            run: Some(Run {
                                intent: "covered".into(),
                                max_tokens: 10,
                                ..Default::default()
                            }),
                            skip_policies: false,
                            approved_under: "run-owned".into(),
                            claim: None,
                            budget_left: None,
                        })
                        .await
                        .is_ok()
                }
                "switchyard.executor.v1.GetJobRequest.job_id" => JobServiceClient::new(ch)
                    .get_job(GetJobRequest {
                        job_id: "owned".into(),
                    })
                    .await
                    .is_ok(),
                "switchyard.approval.v1.GetRunRequest.run_id" => {
                    switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient::new(ch)
                        .get_run(GetRunRequest {
                            run_id: "run-owned".into(),
                        })
                        .await
                        .is_ok()
                }
                "switchyard.registry.v1.ReportOutcomeRequest.agent_id" => {
                    switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient::new(ch)
                        .report_outcome(ReportOutcomeRequest {
                            agent_id: "builtin".into(),
                            capability: "builtin.echo".into(),
                            success: false,
                            latency: Some(prost_types::Duration::default()),
                        })
                        .await
                        .is_ok()
                }
                other => panic!("no attempt written for {other}"),
            };
            tried += 1;
            if went_through && !allowed {
                unauthorized.push(format!("{field} as {c:?}"));
            }
            assert_eq!(went_through, *allowed, "{field} as {c:?}");
        }
    }
    println!(
        "reference matrix: {tried} pairs tried, {} unauthorized successes",
        unauthorized.len()
    );
    assert!(unauthorized.is_empty(), "{unauthorized:?}");
    s.stop().await.unwrap();
}
