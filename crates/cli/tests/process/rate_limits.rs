//! Provider rate limits across processes: three replicas, each an executor
//! with its own ledger (`serve --services executor,ledger`), and the other
//! services in a fourth process, all on one PostgreSQL database, calling
//! one counting OpenAI-compatible stand-in. The buckets live in the shared
//! database, so what one replica grants every other sees:
//!
//! - jobs submitted round-robin to the replicas for several windows: the
//!   stand-in never sees more than the limit in any window, refuses none
//!   for rate, and the throughput stays within 10% of the limit;
//! - a 429 answered to one replica makes a call on another wait the same
//!   cooldown;
//! - two tenants, one flooding: the other's calls wait little (p99 of
//!   both reported);
//! - a tenant's cap on running jobs holds across the replicas.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::llm_split::scripted;
use crate::support::*;
use switchyard_kit::client::Intercepted;
use switchyard_llm::scripted::Reply;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{GetJobRequest, JobState, SubmitJobRequest, WatchJobRequest};
use switchyard_testkit::pg::{PgCluster, Unavailable};
use tokio_stream::StreamExt;

type Jobs = JobServiceClient<Intercepted>;

/// The database, the process of the other services, the replicas.
struct Deployment {
    _pg: PgCluster,
    hub: Proc,
    replicas: Vec<Proc>,
    _dir: tempfile::TempDir,
}

/// The configuration every process shares: the stand-in as provider
/// `openai` (upstream key `OPENAI_KEY`, model `m` unpriced, so no person
/// need approve) and `limits` (TOML).
fn config(dir: &Path, llm_url: &str, limits: &str) -> PathBuf {
    let path = dir.join("switchyard.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[llm]
max_rounds = 1
[[llm.providers]]
name = "openai"
base_url = "{llm_url}"
api_key_env = "OPENAI_KEY"
models = [{{ name = "m", input_micro_usd_per_million = 0, output_micro_usd_per_million = 0 }}]

{limits}
"#
        ),
    )
    .unwrap();
    path
}

impl Deployment {
    /// Starts it, or `None` where PostgreSQL is not installed.
    fn start(llm_url: &str, limits: &str) -> Option<Deployment> {
        Deployment::start_with(llm_url, limits, &[])
    }

    /// With `extra` in the replicas' environment.
    fn start_with(llm_url: &str, limits: &str, extra: &[(&str, &str)]) -> Option<Deployment> {
        let pg = match PgCluster::start() {
            Ok(c) => c,
            Err(Unavailable::Skip(why)) => {
                eprintln!("skipped: {why}");
                return None;
            }
        };
        let db = pg.database().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), llm_url, limits);
        let cfg = cfg.to_str().unwrap();
        let storage = [
            ("SWITCHYARD_STORAGE__BACKEND", "postgres"),
            ("SWITCHYARD_STORAGE__POSTGRES__URL", db.as_str()),
            ("SWITCHYARD_STORAGE__POSTGRES__POOL_SIZE", "8"),
            ("OPENAI_KEY", "sk-test"),
        ];
        let data = |n: &str| {
            let p = dir.path().join(n);
            std::fs::create_dir_all(&p).unwrap();
            p.to_str().unwrap().to_owned()
        };
        let hub_dir = data("hub");
        let hub = Proc::start(
            &[
                "serve",
                "--services",
                "auth,registry,router,ledger,approval",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                &hub_dir,
                "--config",
                cfg,
            ],
            &storage,
        );
        let h = hub.url();
        let mut replicas = Vec::new();
        for i in 0..3 {
            let name = format!("r{i}");
            let d = data(&name);
            let mut env = storage.to_vec();
            env.extend([
                ("SWITCHYARD_AUTH__KEYS_URL", h.as_str()),
                ("SWITCHYARD_EXECUTOR__REGISTRY_URL", h.as_str()),
                ("SWITCHYARD_EXECUTOR__ROUTER_URL", h.as_str()),
                ("SWITCHYARD_EXECUTOR__APPROVAL_URL", h.as_str()),
                ("SWITCHYARD_EXECUTOR__APPROVAL_POLL_MS", "50"),
                ("SWITCHYARD_EXECUTOR__REPLICA_ID", name.as_str()),
            ]);
            env.extend_from_slice(extra);
            replicas.push(Proc::start_logged(
                &[
                    "serve",
                    "--services",
                    "executor,ledger",
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    &d,
                    "--config",
                    cfg,
                ],
                &env,
                &dir.path().join(format!("{name}.log")),
            ));
        }
        Some(Deployment {
            _pg: pg,
            hub,
            replicas,
            _dir: dir,
        })
    }

    fn urls(&self) -> Vec<String> {
        self.replicas.iter().map(Proc::url).collect()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn jobs(url: &str, token: &str) -> Jobs {
    let channel = switchyard_kit::client::connect(url).await.unwrap();
    JobServiceClient::new(switchyard_kit::client::authed(
        channel,
        Some(switchyard_kit::client::Credential::bearer(token).unwrap()),
    ))
}

/// One model call of up to 20 tokens, as job `id`.
fn ask(id: &str) -> String {
    serde_json::json!({"job_id": id, "tasks": [{"id": "a", "llm": {"model": "m", "prompt": "Say fine", "max_tokens": 20}}]})
        .to_string()
}

async fn submit(c: &mut Jobs, doc: String) {
    c.submit_job(SubmitJobRequest {
        document: doc,
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Waits (two minutes at most) for job `id` to end; its state.
async fn ended(c: &mut Jobs, id: &str) -> JobState {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let j = c
            .get_job(GetJobRequest { job_id: id.into() })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        let state = JobState::try_from(j.state).unwrap();
        if matches!(
            state,
            JobState::Completed | JobState::Discarded | JobState::Cancelled
        ) {
            return state;
        }
        assert!(Instant::now() < deadline, "job {id} still {state:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long job `id`'s model call waited for rate-limit room, ms (0: it
/// did not wait), and the `llm.rate_limited` events' data.
async fn waited(c: &mut Jobs, id: &str) -> (u64, Vec<serde_json::Value>) {
    let mut stream = c
        .watch_job(WatchJobRequest {
            job_id: id.into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut rate: Vec<serde_json::Value> = Vec::new();
    while let Some(Ok(m)) = stream.next().await {
        if let Some(e) = m.event.filter(|e| e.kind == "llm.rate_limited") {
            rate.push(switchyard_kit::json::struct_to_json(
                &e.data.unwrap_or_default(),
            ));
        }
    }
    let ms = rate
        .iter()
        .filter(|d| d["phase"] != "waiting")
        .filter_map(|d| d["waited_ms"].as_u64())
        .max()
        .unwrap_or(0);
    (ms, rate)
}

/// Waits (10 s at most) until the ledger at `url` holds a cooldown on
/// upstream key `key`.
async fn until_cooling(url: &str, key: &str) {
    let channel = switchyard_kit::client::connect(url).await.unwrap();
    let mut ledger = switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        switchyard_kit::client::authed(
            channel,
            Some(switchyard_kit::client::Credential::bearer(SERVICE_TOKEN).unwrap()),
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let scope = format!("key:{key}");
    loop {
        let l = ledger
            .list_limits(switchyard_proto::ledger::v1::ListLimitsRequest::default())
            .await
            .unwrap()
            .into_inner();
        if l.buckets
            .iter()
            .any(|b| b.scope == scope && b.cooldown_until.is_some())
        {
            return;
        }
        assert!(Instant::now() < deadline, "no cooldown on {key}: {l:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The most requests that arrived within any `window` (sliding).
fn most_in_any_window(at: &mut [Instant], window: Duration) -> usize {
    at.sort();
    let (mut most, mut first) = (0, 0);
    for last in 0..at.len() {
        while at[last].duration_since(at[first]) >= window {
            first += 1;
        }
        most = most.max(last - first + 1);
    }
    most
}

fn p99(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[((v.len() * 99).div_ceil(100)).saturating_sub(1)]
}

#[test]
fn three_replicas_never_send_more_than_the_limit_in_any_window_and_keep_within_ten_percent_of_it() {
    let (script, llm_url, _stop) = scripted();
    script.otherwise(Reply::text("fine", 10, 2));
    let (limit, window_ms) = (6u64, 1_000u64);
    let limits = format!(
        "[[ledger.limits]]\nname = \"openai-rpm\"\nprovider = \"openai\"\nrequests_per_minute = {limit}\nwindow_ms = {window_ms}\n"
    );
    let Some(d) = Deployment::start(&llm_url, &limits) else {
        return;
    };
    let token = token(&d.hub.url(), "alice");
    let urls = d.urls();
    let n = 48;
    runtime().block_on(async {
        let mut clients = Vec::new();
        for u in &urls {
            clients.push(jobs(u, &token).await);
        }
        // Submitted round-robin all at once: every replica has callers
        // waiting for the whole run.
        for i in 0..n {
            submit(&mut clients[i % 3], ask(&format!("rl-{i:03}"))).await;
        }
        for i in 0..n {
            let state = ended(&mut clients[i % 3], &format!("rl-{i:03}")).await;
            assert_eq!(state, JobState::Completed, "rl-{i:03}");
        }
    });
    let received = script.received();
    assert_eq!(
        received.len(),
        n,
        "one request per job: none refused upstream"
    );
    let mut at: Vec<Instant> = received.iter().map(|r| r.at).collect();
    let window = Duration::from_millis(window_ms);
    // The ledger grants room at one instant and the request reaches the
    // model server a moment later, after a trip through another process:
    // two grants a window apart can arrive a little less than a window
    // apart on a loaded machine. Counted over the window less that
    // transit jitter, the limit must hold exactly (a limiter that let one
    // call too many through would still show it: saturated, each window's
    // room is taken in a burst the moment it frees).
    let jitter = Duration::from_millis(100);
    let most = most_in_any_window(&mut at, window - jitter);
    // Saturated from the first request to the last: each request holds
    // its room for a window, so n requests need the span to the last plus
    // that window.
    let span = at[n - 1].duration_since(at[0]) + window;
    let rate = n as f64 / span.as_secs_f64();
    let wanted = limit as f64 / window.as_secs_f64();
    println!(
        "3 replicas, {n} calls: most in any {window_ms} ms window (less {jitter:?} of transit) {most} (limit {limit}); throughput {rate:.2}/s against a limit of {wanted:.2}/s ({:.1}%) over {span:?}",
        100.0 * rate / wanted
    );
    assert!(most as u64 <= limit, "{most} requests within one window");
    assert!(rate >= 0.9 * wanted, "over-throttled: {rate:.2}/s");
}

#[test]
fn a_429_on_one_replica_makes_the_others_wait_the_same_cooldown() {
    let (script, llm_url, _stop) = scripted();
    script.for_model("m", vec![Reply::status(429).retry_after("3")]);
    script.otherwise(Reply::text("fine", 10, 2));
    let limits = "[[ledger.limits]]\nname = \"openai-rpm\"\nprovider = \"openai\"\nrequests_per_minute = 1000\n";
    let Some(d) = Deployment::start(&llm_url, limits) else {
        return;
    };
    let token = token(&d.hub.url(), "alice");
    let urls = d.urls();
    runtime().block_on(async {
        let mut first = jobs(&urls[0], &token).await;
        submit(&mut first, ask("refused")).await;
        assert_eq!(ended(&mut first, "refused").await, JobState::Discarded);
        // The cooldown reaches the ledger on its own (beside the job):
        // wait until another replica's ledger sees it.
        until_cooling(&urls[1], "OPENAI_KEY").await;
        let mut others = [jobs(&urls[1], &token).await, jobs(&urls[2], &token).await];
        for (i, c) in others.iter_mut().enumerate() {
            submit(c, ask(&format!("after-{i}"))).await;
        }
        for (i, c) in others.iter_mut().enumerate() {
            let id = format!("after-{i}");
            assert_eq!(ended(c, &id).await, JobState::Completed, "{id}");
            let (ms, events) = waited(c, &id).await;
            let why = events
                .iter()
                .find(|e| e["phase"] == "waiting")
                .map(|e| e["why"].to_string())
                .unwrap_or_default();
            println!("{id} (replica r{}) waited {ms} ms: {why}", i + 1);
            assert!(why.contains("429"), "{events:?}");
        }
    });
    let received = script.received();
    let refused_at = received[0].at;
    for r in &received[1..] {
        let gap = r.at.duration_since(refused_at);
        assert!(
            gap >= Duration::from_millis(2_900),
            "sent {gap:?} after the 429"
        );
    }
    assert_eq!(received.len(), 3);
}

#[test]
fn a_flooding_tenant_does_not_starve_another_and_both_p99_waits_are_reported() {
    let (script, llm_url, _stop) = scripted();
    script.otherwise(Reply::text("fine", 10, 2));
    let limits = "[[ledger.limits]]\nname = \"openai-rpm\"\nprovider = \"openai\"\nrequests_per_minute = 10\nwindow_ms = 1000\n";
    let Some(d) = Deployment::start(&llm_url, limits) else {
        return;
    };
    let hub = d.hub.url();
    let alice = token(&hub, "alice");
    // A submitter of another tenant, made with the service token.
    let bea = runtime().block_on(async {
        let channel = switchyard_kit::client::connect(&hub).await.unwrap();
        let mut auth = switchyard_proto::auth::v1::auth_service_client::AuthServiceClient::new(
            switchyard_kit::client::authed(
                channel,
                Some(switchyard_kit::client::Credential::bearer(SERVICE_TOKEN).unwrap()),
            ),
        );
        auth.create_key(switchyard_proto::auth::v1::CreateKeyRequest {
            subject: "bea".into(),
            roles: vec!["submitter".into()],
            kind: switchyard_proto::auth::v1::PrincipalKind::Human as i32,
            tenant: "tenant-b".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .secret
    });
    let urls = d.urls();
    let (flood, steady) = (60usize, 8usize);
    let (a_waits, b_waits) = runtime().block_on(async {
        let mut a: Vec<Jobs> = Vec::new();
        let mut b: Vec<Jobs> = Vec::new();
        for u in &urls {
            a.push(jobs(u, &alice).await);
            b.push(jobs(u, &bea).await);
        }
        // Tenant A floods every replica at once…
        for i in 0..flood {
            submit(&mut a[i % 3], ask(&format!("a-{i:03}"))).await;
        }
        // …while tenant B sends a call now and then.
        for i in 0..steady {
            submit(&mut b[i % 3], ask(&format!("b-{i:03}"))).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let mut a_waits = Vec::new();
        for i in 0..flood {
            let id = format!("a-{i:03}");
            assert_eq!(ended(&mut a[i % 3], &id).await, JobState::Completed);
            a_waits.push(waited(&mut a[i % 3], &id).await.0);
        }
        let mut b_waits = Vec::new();
        for i in 0..steady {
            let id = format!("b-{i:03}");
            assert_eq!(ended(&mut b[i % 3], &id).await, JobState::Completed);
            b_waits.push(waited(&mut b[i % 3], &id).await.0);
        }
        (a_waits, b_waits)
    });
    let (pa, pb) = (p99(a_waits.clone()), p99(b_waits.clone()));
    println!(
        "fair share at 10 calls/s: flooding tenant ({flood} calls) p99 wait {pa} ms; other tenant ({steady} calls) p99 wait {pb} ms (waits {b_waits:?})"
    );
    // The flood queues for seconds; the other tenant's calls go at the
    // next room that frees: within a window (1 s) and the polling, however
    // long the flood's queue.
    assert!(pa >= 3_000, "the flood did not queue: {pa} ms");
    assert!(pb <= 2_000, "the steady tenant waited {pb} ms");
}

#[test]
fn a_tenants_running_jobs_cap_holds_across_replicas() {
    let (_script, llm_url, _stop) = scripted();
    let Some(d) = Deployment::start_with(
        &llm_url,
        "",
        &[
            ("SWITCHYARD_EXECUTOR__MAX_RUNNING_JOBS_PER_TENANT", "2"),
            ("SWITCHYARD_EXECUTOR__COMMANDS", "[\"sleep\"]"),
        ],
    ) else {
        return;
    };
    let token = token(&d.hub.url(), "alice");
    let urls = d.urls();
    let n = 6;
    let spans = runtime().block_on(async {
        let mut clients = Vec::new();
        for u in &urls {
            clients.push(jobs(u, &token).await);
        }
        for i in 0..n {
            let doc = serde_json::json!({"job_id": format!("cap-{i}"), "tasks": [{"id": "a", "command": {"command": "sleep", "args": ["0.8"]}}]});
            submit(&mut clients[i % 3], doc.to_string()).await;
        }
        let mut spans = Vec::new();
        for i in 0..n {
            let id = format!("cap-{i}");
            assert_eq!(ended(&mut clients[i % 3], &id).await, JobState::Completed, "{id}");
            let job = clients[i % 3]
                .get_job(GetJobRequest { job_id: id })
                .await
                .unwrap()
                .into_inner()
                .job
                .unwrap();
            let t = &job.tasks[0];
            let ms = |ts: &Option<prost_types::Timestamp>| switchyard_kit::time::timestamp_ms(ts.as_ref().unwrap());
            spans.push((ms(&t.started_at), ms(&t.finished_at)));
        }
        spans
    });
    // The most jobs running at any start.
    let most = spans
        .iter()
        .map(|(s, _)| spans.iter().filter(|(a, b)| a <= s && s < b).count())
        .max()
        .unwrap();
    println!("{n} jobs of one tenant across 3 replicas, cap 2: at most {most} ran at once");
    assert!(most <= 2, "{most} jobs ran at once: {spans:?}");
}
