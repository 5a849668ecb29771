//! Helpers shared by the end-to-end tests.
#![allow(dead_code, clippy::unwrap_used)]

use switchyard_kit::client::Intercepted;
use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
use switchyard_proto::registry::v1::{AgentSpec, Capability, RegisterAgentRequest};
use switchyard_proto::router::v1::router_service_client::RouterServiceClient;
use switchyard_proto::router::v1::{RouteConstraints, RouteRequest, RouteResponse};

use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    GetJobRequest, GetResultRequest, GetResultResponse, Job, JobState, SubmitJobRequest,
};
use switchyard_testkit::Stack;

/// A JobService client.
pub type Jobs = JobServiceClient<Intercepted>;

/// Submits `doc` (any accepted format) and returns the job.
pub async fn submit(c: &mut Jobs, doc: &str) -> Result<Job, tonic::Status> {
    c.submit_job(SubmitJobRequest {
        document: doc.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().job.unwrap())
}

/// A job's id.
pub fn id(j: &Job) -> String {
    j.spec.as_ref().unwrap().job_id.clone()
}

/// The job as GetJob answers.
pub async fn job(c: &mut Jobs, job_id: &str) -> Job {
    c.get_job(GetJobRequest {
        job_id: job_id.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .job
    .unwrap()
}

/// The job's artifacts, as ListArtifacts answers.
pub async fn artifacts(c: &mut Jobs, job_id: &str) -> Vec<switchyard_proto::common::v1::Artifact> {
    c.list_artifacts(switchyard_proto::executor::v1::ListArtifactsRequest {
        job_id: job_id.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .artifacts
}

/// Waits (bounded: 60 s) until the job is in a final state; returns its result.
/// (Generous: the suite runs its PostgreSQL stacks beside the sled ones on
/// two cores, and an A2A agent's first calls meet a cold Python process.)
pub async fn finish(c: &mut Jobs, job_id: &str) -> GetResultResponse {
    for _ in 0..2400 {
        let j = job(c, job_id).await;
        let s = JobState::try_from(j.state).unwrap();
        if matches!(
            s,
            JobState::Completed | JobState::Cancelled | JobState::Discarded | JobState::Retryable
        ) {
            return c
                .get_result(GetResultRequest {
                    job_id: job_id.into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("job {job_id} did not finish in 60 s");
}

/// Waits (bounded: 30 s) until the job is paused by its budget; the job.
pub async fn until_paused(c: &mut Jobs, job_id: &str) -> Job {
    for _ in 0..1200 {
        let j = job(c, job_id).await;
        if j.state == JobState::BudgetPaused as i32 {
            return j;
        }
        assert!(
            !matches!(
                JobState::try_from(j.state).unwrap(),
                JobState::Completed | JobState::Cancelled | JobState::Discarded
            ),
            "job {job_id} ended instead of pausing: {j:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("job {job_id} did not pause in 30 s");
}

/// A budget as the ledger reports it.
pub async fn budget(
    c: &mut switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient<Intercepted>,
    id: &str,
) -> switchyard_proto::ledger::v1::Budget {
    c.get_budget(switchyard_proto::ledger::v1::GetBudgetRequest {
        budget_id: id.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .budget
    .unwrap()
}

/// An approval client on the stack.
pub async fn approvals(s: &Stack) -> ApprovalServiceClient<Intercepted> {
    ApprovalServiceClient::new(s.channel().await.unwrap())
}

/// An approval client authenticated as the named principal.
pub async fn approvals_as(s: &Stack, who: &str) -> ApprovalServiceClient<Intercepted> {
    ApprovalServiceClient::new(s.channel_as(who).await.unwrap())
}

/// A new principal `who` with the approver role only, and an approval
/// client authenticated as them.
pub async fn new_approver(s: &Stack, who: &str) -> ApprovalServiceClient<Intercepted> {
    let key = s
        .key(
            who,
            &["approver"],
            switchyard_proto::auth::v1::PrincipalKind::Human,
        )
        .await
        .expect("an approver key");
    ApprovalServiceClient::new(s.channel_with(&key).await.expect("a channel"))
}

/// Approves run `run_id` as `who` (comment "ok"); the run as it is then.
pub async fn approve_as(
    s: &Stack,
    who: &str,
    run_id: &str,
) -> Result<switchyard_proto::approval::v1::Run, tonic::Status> {
    approvals_as(s, who)
        .await
        .approve(switchyard_proto::approval::v1::ApproveRequest {
            run_id: run_id.into(),
            comment: "ok".into(),
            edit: None,
            scope: None,
        })
        .await
        .map(|r| r.into_inner().run.expect("the run"))
}

/// A run as bob, the stack's approver, reads it.
pub async fn run_of(s: &Stack, run_id: &str) -> switchyard_proto::approval::v1::Run {
    approvals_as(s, "bob")
        .await
        .get_run(switchyard_proto::approval::v1::GetRunRequest {
            run_id: run_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
}

/// Run `run_id` once it exists (bounded: 10 s): a budget pause is recorded
/// before its extension run is proposed.
pub async fn proposed_run(s: &Stack, run_id: &str) -> switchyard_proto::approval::v1::Run {
    let mut bob = approvals_as(s, "bob").await;
    for _ in 0..200 {
        let got = bob
            .get_run(switchyard_proto::approval::v1::GetRunRequest {
                run_id: run_id.into(),
            })
            .await;
        match got {
            Ok(r) => return r.into_inner().run.unwrap(),
            Err(e) if e.code() == tonic::Code::NotFound => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("reading run {run_id}: {e:?}"),
        }
    }
    panic!("run {run_id} was not proposed within 10 s");
}

/// The `task.awaiting_approval` event of `job_id`, once its call's run is
/// proposed: the wait is recorded durably before the run is proposed, so the
/// event alone does not mean a person can decide yet.
pub async fn awaiting_call(c: &mut Jobs, s: &Stack, job_id: &str) -> serde_json::Value {
    let waiting = until_event(c, job_id, "task.awaiting_approval").await;
    proposed_run(s, waiting["run_id"].as_str().unwrap_or_default()).await;
    waiting
}

/// Approves a run as bob, the stack's approver.
pub async fn approve(s: &Stack, run_id: &str) {
    let req = switchyard_proto::approval::v1::ApproveRequest {
        run_id: run_id.into(),
        comment: "ok".into(),
        edit: None,
        scope: None,
    };
    approvals_as(s, "bob").await.approve(req).await.unwrap();
}

pub fn agent(id: &str, cap: &str, trust: u32, price: i64) -> AgentSpec {
    AgentSpec {
        id: id.into(),
        name: id.into(),
        endpoint: format!("http://127.0.0.1:9/{id}"),
        capabilities: vec![Capability {
            name: cap.into(),
            proficiency: None,
            price_per_unit_micro_usd: price,
            unit: "task".into(),
        }],
        trust_score: trust,
        max_concurrency: 2,
        latency_estimate_ms: 100,
        ..Default::default()
    }
}

pub async fn register(reg: &mut RegistryServiceClient<Intercepted>, spec: AgentSpec) {
    reg.register_agent(RegisterAgentRequest { agent: Some(spec) })
        .await
        .expect("register");
}

pub async fn route(
    router: &mut RouterServiceClient<Intercepted>,
    cap: &str,
    exclude: &[&str],
) -> Result<RouteResponse, tonic::Status> {
    router
        .route(RouteRequest {
            capability: cap.into(),
            constraints: Some(RouteConstraints {
                exclude_agents: exclude.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            limit: 0,
        })
        .await
        .map(|r| r.into_inner())
}

pub fn ids(r: &RouteResponse) -> Vec<String> {
    r.candidates.iter().map(|c| c.agent_id.clone()).collect()
}

/// Polls `f` until it returns `want` (bounded: 5 s).
pub async fn eventually<F, Fut>(what: &str, want: Vec<String>, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let mut last = Vec::new();
    for _ in 0..250 {
        last = f().await;
        if last == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{what}: wanted {want:?}, last saw {last:?}");
}

/// Polls the router until `cap` routes to exactly `want`, in order (bounded: 5 s).
pub async fn eventually_routed(
    router: &RouterServiceClient<Intercepted>,
    cap: &str,
    want: &[&str],
) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    eventually(&format!("route {cap}"), want, || {
        let mut r = router.clone();
        let cap = cap.to_owned();
        async move {
            route(&mut r, &cap, &[])
                .await
                .map(|x| ids(&x))
                .unwrap_or_default()
        }
    })
    .await;
}

/// Waits (bounded: 10 s) until the router routes `cap` to some agent.
pub async fn wait_routed(s: &Stack, cap: &str) {
    let mut router = RouterServiceClient::new(s.channel().await.unwrap());
    for _ in 0..400 {
        if route(&mut router, cap, &[])
            .await
            .is_ok_and(|r| !r.candidates.is_empty())
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("nothing routes {cap} within 10 s");
}

/// Where a test stack keeps its state: suites that run on both use
/// `switchyard_testkit::on_both_backends!(sled, postgres; ...)`.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded default.
    Sled,
    /// A fresh database of the test cluster: every stateful service in it.
    Postgres(String),
}

impl Backend {
    pub fn apply(&self, c: &mut switchyard_cli::Config) {
        if let Backend::Postgres(url) = self {
            c.storage.backend = switchyard_cli::config::StorageBackend::Postgres;
            c.storage.postgres.url = url.clone();
        }
    }
}

pub fn sled() -> Backend {
    Backend::Sled
}

pub async fn postgres() -> Option<Backend> {
    switchyard_testkit::pg::fresh_database().map(Backend::Postgres)
}

/// A run's audit log, read as `who`.
pub async fn audit_of(
    s: &Stack,
    who: &str,
    run_id: &str,
) -> Vec<switchyard_proto::approval::v1::AuditRecord> {
    approvals_as(s, who)
        .await
        .list_audit(switchyard_proto::approval::v1::ListAuditRequest {
            run_id: run_id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .records
}

/// A key of tenant `tenant`, made by the cluster operator (service token):
/// how a new tenant gets its first principals.
pub async fn tenant_key(
    s: &Stack,
    tenant: &str,
    subject: &str,
    roles: &[&str],
    kind: switchyard_proto::auth::v1::PrincipalKind,
) -> String {
    switchyard_proto::auth::v1::auth_service_client::AuthServiceClient::new(
        s.channel_as("operator").await.unwrap(),
    )
    .create_key(switchyard_proto::auth::v1::CreateKeyRequest {
        subject: subject.into(),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        kind: kind as i32,
        tenant: tenant.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .secret
}

/// Follows the job's events until one of `kind` arrives; its data.
pub async fn until_event(c: &mut Jobs, job_id: &str, kind: &str) -> serde_json::Value {
    let mut s = watch_from_start(c, job_id).await;
    let wait = async {
        while let Some(Ok(m)) = tokio_stream::StreamExt::next(&mut s).await {
            let e = m.event.unwrap();
            if e.kind == kind {
                return e
                    .data
                    .as_ref()
                    .map(switchyard_kit::json::struct_to_json)
                    .unwrap();
            }
        }
        panic!("the stream of {job_id} ended without {kind}");
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), wait)
        .await
        .unwrap_or_else(|_| panic!("no {kind} for {job_id} within 20 s"))
}

/// Keys of those who must not reach another submitter's job: another
/// submitter (carol), an admin of another tenant (mallory of tenant-b) and
/// an agent key (robot).
pub async fn outsiders(s: &Stack) -> [String; 3] {
    use switchyard_proto::auth::v1::PrincipalKind;
    [
        s.key("carol", &["submitter"], PrincipalKind::Human)
            .await
            .unwrap(),
        tenant_key(s, "tenant-b", "mallory", &["admin"], PrincipalKind::Human).await,
        s.key("robot", &["agent"], PrincipalKind::Agent)
            .await
            .unwrap(),
    ]
}

/// Serves `agent` (written with the SDK) as `id` offering `capability`,
/// registered with the stack's registry; fire the trigger to stop it.
pub fn serve_sdk_agent<A: switchyard_agent_sdk::Agent + Clone + 'static>(
    s: &Stack,
    id: &str,
    capability: &str,
    agent: A,
) -> (
    switchyard_kit::shutdown::Trigger,
    tokio::task::JoinHandle<Result<(), switchyard_agent_sdk::SdkError>>,
) {
    serve_priced_agent(s, id, capability, 0, agent)
}

/// [`serve_sdk_agent`], its capability priced at `price` micro-USD a task.
pub fn serve_priced_agent<A: switchyard_agent_sdk::Agent + Clone + 'static>(
    s: &Stack,
    id: &str,
    capability: &str,
    price: i64,
    agent: A,
) -> (
    switchyard_kit::shutdown::Trigger,
    tokio::task::JoinHandle<Result<(), switchyard_agent_sdk::SdkError>>,
) {
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let mut spec = switchyard_proto::registry::v1::AgentSpec {
        id: id.into(),
        capabilities: vec![switchyard_proto::registry::v1::Capability {
            name: capability.into(),
            price_per_unit_micro_usd: price,
            unit: "task".into(),
            ..Default::default()
        }],
        trust_score: 90,
        ..Default::default()
    };
    let opts = switchyard_agent_sdk::ServeOptions {
        registry_url: s.url.clone(),
        credential: switchyard_kit::client::Credential::bearer(&s.token("agents").unwrap()).ok(),
        ..Default::default()
    };
    let served = tokio::spawn(async move {
        switchyard_agent_sdk::serve_until(agent, &mut spec, opts, shutdown).await
    });
    (trigger, served)
}

/// An agent that echoes its text and reports the tokens it used.
#[derive(Clone)]
pub struct Counting(pub u64);

#[tonic::async_trait]
impl switchyard_agent_sdk::Agent for Counting {
    async fn invoke(
        &self,
        req: switchyard_agent_sdk::Invocation,
        _progress: switchyard_agent_sdk::Progress,
    ) -> switchyard_proto::agent::v1::AgentResponse {
        let mut r = switchyard_agent_sdk::respond::success(
            switchyard_agent_sdk::input_text(&req, "text"),
            None,
        );
        r.tokens_used = self.0;
        r
    }
}

/// Job `job_id`'s event stream from its first event.
async fn watch_from_start(
    c: &mut Jobs,
    job_id: &str,
) -> tonic::Streaming<switchyard_proto::executor::v1::WatchJobResponse> {
    c.watch_job(switchyard_proto::executor::v1::WatchJobRequest {
        job_id: job_id.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// Every event of `kind` a finished job `job_id` recorded, in order (its
/// stream ends with the job).
pub async fn events_of(c: &mut Jobs, job_id: &str, kind: &str) -> Vec<serde_json::Value> {
    let mut stream = watch_from_start(c, job_id).await;
    let all = async {
        let mut out = Vec::new();
        while let Some(Ok(m)) = tokio_stream::StreamExt::next(&mut stream).await {
            let e = m.event.unwrap();
            if e.kind == kind {
                out.push(
                    e.data
                        .as_ref()
                        .map(switchyard_kit::json::struct_to_json)
                        .unwrap(),
                );
            }
        }
        out
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), all)
        .await
        .expect("a finished job's stream ends")
}

/// Job `job_id`'s story (ExplainJob), and a test of whether a line says
/// `what`.
pub async fn explain(
    c: &mut Jobs,
    job_id: &str,
) -> switchyard_proto::executor::v1::ExplainJobResponse {
    c.explain_job(switchyard_proto::executor::v1::ExplainJobRequest {
        job_id: job_id.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// Whether a line of `x` says `what` (panics with the story when not, so a
/// failed assertion shows what was said).
pub fn story_says(x: &switchyard_proto::executor::v1::ExplainJobResponse, what: &str) {
    assert!(
        x.lines.iter().any(|l| l.text.contains(what)),
        "no line says {what:?}:\n{}",
        x.lines
            .iter()
            .map(|l| format!("  {} {}", l.topic, l.text))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
