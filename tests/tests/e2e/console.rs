//! The web console (`/ui/`) against the in-process stack: in a real browser
//! (Debian's Chromium driven by Playwright for Python: tests/console), and
//! its guarantees checked directly over HTTP — every route of the
//! authorization matrix with a session cookie, forged forms refused before
//! anything acts, the live timeline resuming after `Last-Event-ID`.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::Duration;

use serde_json::Value;
use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::approval::v1::{GetRunRequest, RunStatus};
use switchyard_proto::auth::v1::PrincipalKind;
use switchyard_proto::common::v1::Money;
use switchyard_proto::executor::v1::JobState;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_proto::ledger::v1::{CreateBudgetRequest, ListEntriesRequest};
use switchyard_testkit::Stack;

use crate::common::{finish, id, job, submit};
use crate::gateway::DOOR_RPCS;
use switchyard_proto::executor::v1::schedule_service_client::ScheduleServiceClient;
use switchyard_proto::executor::v1::{CreateScheduleRequest, GetScheduleRequest, Schedule};

/// The stack, the budgets the test job draws on (acme → acme/docs), and two
/// priced example agents serving text.stats and text.extract.
struct Env {
    s: Stack,
    stop: switchyard_kit::shutdown::Trigger,
    agents: Vec<tokio::task::JoinHandle<Result<(), switchyard_agent_sdk::SdkError>>>,
}

impl Env {
    async fn start() -> Env {
        let s = stack().await;
        let mut ledger = LedgerServiceClient::new(s.channel_as("admin").await.unwrap());
        for (id, parent, usd) in [("acme", "", 20_000_000), ("acme/docs", "acme", 5_000_000)] {
            ledger
                .create_budget(CreateBudgetRequest {
                    budget_id: id.into(),
                    parent_id: parent.into(),
                    cost_limit: Some(Money { micro_usd: usd }),
                    // Submitters may draw on the project's budget.
                    labels: [("shared_with".to_owned(), "role:submitter".to_owned())].into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let (stop, shutdown) = switchyard_kit::shutdown::channel();
        let opts = switchyard_agent_sdk::ServeOptions {
            registry_url: s.url.clone(),
            credential: switchyard_kit::client::Credential::bearer(&s.token("agents").unwrap())
                .ok(),
            ..Default::default()
        };
        let mut stats = switchyard_example_agents::spec(
            "text_stats",
            "Text statistics",
            "Counts lines, words and the most frequent terms of a text.",
            "text.stats",
            25_000,
        );
        let mut extract = switchyard_example_agents::spec(
            "text_extract",
            "Text extraction",
            "Finds the URLs, e-mail addresses and dates in a text.",
            "text.extract",
            50_000,
        );
        let (o1, o2, sd1, sd2) = (opts.clone(), opts, shutdown.clone(), shutdown);
        let agents = vec![
            tokio::spawn(async move {
                switchyard_agent_sdk::serve_until(
                    switchyard_example_agents::TextStats,
                    &mut stats,
                    o1,
                    sd1,
                )
                .await
            }),
            tokio::spawn(async move {
                switchyard_agent_sdk::serve_until(
                    switchyard_example_agents::Extract,
                    &mut extract,
                    o2,
                    sd2,
                )
                .await
            }),
        ];
        for cap in ["text.stats", "text.extract"] {
            crate::common::wait_routed(&s, cap).await;
        }
        Env { s, stop, agents }
    }

    fn base(&self) -> String {
        format!("http://{}", self.s.http.unwrap())
    }

    async fn stop(self) {
        self.stop.fire();
        for a in self.agents {
            let _ = a.await;
        }
        self.s.stop().await.unwrap();
    }
}

/// Every service in one process, approvals noticed within 20 ms.
async fn stack() -> Stack {
    switchyard_kit::tls::install_crypto();
    // A webhook nothing answers, tried once: each completed job's
    // notification is dead-lettered at once, for the notifications page.
    let secret = std::env::temp_dir().join(format!("sy-console-{}.secret", std::process::id()));
    std::fs::write(&secret, "console-test-webhook-secret-0123456789").unwrap();
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.approval_poll_ms = 20;
        // A provider limit for the limits page.
        c.ledger.limits.push(switchyard_ledger::rates::LimitConfig {
            name: "openai".into(),
            provider: "openai".into(),
            requests_per_minute: Some(500),
            tokens_per_minute: Some(200_000),
            ..Default::default()
        });
        c.executor.notifications.max_attempts = 1;
        c.executor.notifications.webhooks = vec![switchyard_executor::config::WebhookConfig {
            name: "pager".into(),
            url: format!("http://{gone}/hook"),
            secret_file: secret.clone(),
            events: vec!["job.completed".into()],
            tenant: String::new(),
        }];
    })
    .await
    .unwrap()
}

/// [`stack`], its HTTP door's base URL, and alice's JobService client.
async fn stack_as_alice() -> (Stack, String, crate::common::Jobs) {
    let s = stack().await;
    let base = format!("http://{}", s.http.unwrap());
    let alice = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    (s, base, alice)
}

/// A client that shows redirects instead of following them.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The Chromium the browser test drives: Debian's, installed by `make test`.
fn chromium() -> String {
    std::env::var("SWITCHYARD_CHROMIUM").unwrap_or_else(|_| {
        panic!("SWITCHYARD_CHROMIUM is not set: run the tests with `make test`, which installs Debian's chromium")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_real_browser_a_job_goes_from_submission_through_bobs_approval_to_its_ledger_entries()
{
    let env = Env::start().await;
    let s = &env.s;
    let viewer = s
        .key("vera", &["viewer"], PrincipalKind::Human)
        .await
        .unwrap();
    let carol = s
        .key("carol", &["approver", "submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    // A schedule of alice's for the schedules page (its first tick is
    // hours away).
    let mut sched = ScheduleServiceClient::new(s.channel_as("alice").await.unwrap());
    sched
        .create_schedule(CreateScheduleRequest {
            schedule: Some(Schedule {
                schedule_id: "nightly-notes".into(),
                cron: "0 2 * * *".into(),
                time_zone: "Europe/Berlin".into(),
                description: "release notes every night".into(),
                ..Default::default()
            }),
            document: std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../tests/console/release_notes.yaml"),
            )
            .unwrap(),
            ..Default::default()
        })
        .await
        .unwrap();
    // A model call's room in the openai limit, and a 429's cooldown on its
    // key, for the limits page.
    let mut ledger = LedgerServiceClient::new(s.channel_as("operator").await.unwrap());
    let claim = switchyard_proto::ledger::v1::RateClaim {
        provider: "openai".into(),
        model: "gpt-4o".into(),
        key: "OPENAI_API_KEY".into(),
        tokens: 1_000,
    };
    ledger
        .reserve(switchyard_proto::ledger::v1::ReserveRequest {
            budget_id: "acme".into(),
            tokens: 1_000,
            idempotency_key: "console-limits".into(),
            rate: Some(claim.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    ledger
        .cool_down(switchyard_proto::ledger::v1::CoolDownRequest {
            rate: Some(claim),
            wait: Some(switchyard_kit::time::duration(600_000)),
            why: "openai answered 429 for gpt-4o, Retry-After 600000 ms".into(),
        })
        .await
        .unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // `make screenshots` keeps them for the docs; otherwise a scratch dir.
    let scratch = tempfile::tempdir().unwrap();
    let shots = std::env::var("SWITCHYARD_CONSOLE_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| scratch.path().to_path_buf());
    let script = root.join("tests/console/console_test.py");
    let job_file = root.join("tests/console/release_notes.yaml");
    let mut cmd = tokio::process::Command::new(crate::mcp::python());
    cmd.arg(&script)
        .env("SY_BASE", env.base())
        .env("SY_ALICE", s.token("alice").unwrap())
        .env("SY_BOB", s.token("bob").unwrap())
        .env("SY_CAROL", &carol)
        .env("SY_VIEWER", &viewer)
        .env("SY_ADMIN", s.token("admin").unwrap())
        .env("SY_JOB", &job_file)
        .env("SY_CHROMIUM", chromium())
        .env("SY_SHOTS", &shots)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(240), cmd.output())
        .await
        .expect("the browser test did not finish in 240 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser test failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let summary: Value = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("the script's summary line");
    assert_eq!(summary["signed_out_session_refused"], true, "{stdout}");
    assert_eq!(summary["limits_granted"], 1, "{stdout}");
    // The schedule was paused with alice's note and resumed in the browser.
    assert_eq!(
        summary["schedule_paused_note"], "release freeze",
        "{stdout}"
    );
    let after = sched
        .get_schedule(GetScheduleRequest {
            schedule_id: "nightly-notes".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    assert!(!after.paused && after.pause_note.is_empty(), "{after:?}");
    assert_eq!(after.next_fire_times.len(), 5);

    // What the browser showed is what the services hold.
    let mut jobs = JobServiceClient::new(s.channel_as("bob").await.unwrap());
    let job_id = summary["job_id"].as_str().unwrap();
    let j = job(&mut jobs, job_id).await;
    assert_eq!(j.state, JobState::Completed as i32);
    assert_eq!(j.submitted_by, "alice");
    let mut runs = ApprovalServiceClient::new(s.channel_as("bob").await.unwrap());
    let run = runs
        .get_run(GetRunRequest {
            run_id: j.run_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(run.approved_by, ["bob"]);
    assert_eq!(run.decision_comment, "fine for the release");
    // The waterfall's bar for the stats step says where it ran.
    let bar = summary["waterfall_title"].as_str().unwrap_or_default();
    assert!(bar.starts_with("stats attempt 1 on text_stats: "), "{bar}");
    let call = summary["call_title"].as_str().unwrap_or_default();
    assert!(call.starts_with("agent text_stats in stats: "), "{call}");
    assert!(call.ends_with(", success"), "{call}");
    let estimate = run.cost_estimate.unwrap().estimated_cost.unwrap().micro_usd;
    assert!(estimate > 0, "priced agents: a non-zero estimate");
    assert_eq!(
        summary["estimate_title"],
        format!(
            "{} micro-USD",
            switchyard_gateway::console::views::group(estimate)
        )
    );
    let mut ledger = LedgerServiceClient::new(s.channel_as("bob").await.unwrap());
    let entries = ledger
        .list_entries(ListEntriesRequest {
            budget_id: j.budget_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(summary["entries"], entries.entries.len());
    let mut agents: Vec<String> = entries.entries.iter().map(|e| e.agent_id.clone()).collect();
    agents.sort();
    assert_eq!(agents, ["text_extract", "text_stats"]);
    assert_eq!(summary["entry_agents"], serde_json::json!(agents));
    // acme, two levels up, shows the job's entries and the same money, and
    // the report by person puts it on alice (the job's submitter).
    assert_eq!(summary["acme_entries"], entries.entries.len());
    let spent = format!(
        "{} micro-USD",
        switchyard_gateway::console::views::group(entries.total_cost.map_or(0, |m| m.micro_usd))
    );
    assert_eq!(summary["alice_spent_title"], spent.as_str(), "{summary}");
    assert_eq!(summary["acme_spent_title"], spent.as_str(), "{summary}");
    // The refused approvals changed nothing: the viewer's and carol's runs
    // still wait.
    for key in ["second_job_id", "third_job_id"] {
        let other = job(&mut jobs, summary[key].as_str().unwrap()).await;
        assert_eq!(other.state, JobState::Pending as i32, "{key}");
        let r = runs
            .get_run(GetRunRequest {
                run_id: other.run_id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .run
            .unwrap();
        assert_eq!(r.status, RunStatus::Proposed as i32, "{key}");
        assert!(r.approved_by.is_empty(), "{key}");
    }
    assert!(
        summary["separation_of_duties"]
            .as_str()
            .unwrap()
            .contains("carol"),
        "{summary}"
    );
    // The step that asked bob was answered by bob in the browser (the
    // refused answer took nothing: the first answer recorded is his 3).
    let asked = job(&mut jobs, summary["asks_bob_job_id"].as_str().unwrap()).await;
    assert_eq!(asked.state, JobState::Completed as i32);
    let id = asked.spec.unwrap().job_id;
    let answer = crate::common::until_event(&mut jobs, &id, "task.input_received").await;
    assert_eq!(answer["by"], "bob", "{answer}");
    assert_eq!(answer["answer"], serde_json::json!({"size": 3}), "{answer}");
    // Run again from its page: alice's new job, naming the one it re-runs.
    let rerun = job(&mut jobs, summary["rerun_job_id"].as_str().unwrap()).await;
    assert_eq!(rerun.rerun_of, id);
    assert_eq!(rerun.submitted_by, "alice");
    for name in [
        "console-inbox.png",
        "console-job.png",
        "console-budgets.png",
        "console-live-jobs.png",
        "console-input.png",
    ] {
        let len = std::fs::metadata(shots.join(name)).unwrap().len();
        assert!(len > 10_000, "{name}: {len} bytes");
    }
    env.stop().await;
}

/// `GET`/`POST` a console path as the holder of `token` (its session
/// cookie and, for a post, the session's anti-forgery token): the status
/// and the page (nothing of an event stream, which does not end).
pub(crate) async fn as_session(
    c: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    token: &str,
    form: &[(&str, &str)],
) -> (u16, String) {
    let url = format!("{base}{path}");
    let req = if method == "POST" {
        let csrf = switchyard_gateway::console::session::csrf_token(token);
        let mut fields: Vec<(&str, &str)> = vec![("csrf", &csrf)];
        fields.extend_from_slice(form);
        let body: String = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", switchyard_gateway::console::encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        c.post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
    } else {
        c.get(url)
    };
    let resp = req
        .header("cookie", format!("sy_session={token}"))
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    let stream = resp
        .headers()
        .get("content-type")
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    if stream {
        return (code, String::new());
    }
    (code, resp.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_route_allows_exactly_the_roles_its_call_allows() {
    let s = stack().await;
    let base = format!("http://{}", s.http.unwrap());
    let c = client();
    let mut wrong = Vec::new();
    let mut tried = 0;
    for role in crate::auth::ROLES {
        let key = crate::auth::role_key(&s, "ui", role).await;
        let allowed = crate::auth::allowed(role);
        for (door, rpc) in DOOR_RPCS.iter().filter(|(d, _)| d.contains(" /ui/")) {
            // A session per route: signing out ends the one it is made with.
            let token = s.session(&key).await.unwrap();
            let (method, route) = door.split_once(' ').unwrap();
            let path = route
                .replace("{run_id}", "no-such-run")
                .replace("{decision}", "approve")
                .replace("{job_id}", "no-such-job")
                .replace("{schedule_id}", "no-such-schedule")
                .replace("{action}", "pause");
            let form: &[(&str, &str)] = if route == "/ui/submit" {
                &[(
                    "document",
                    "plan_id: p\ntasks: [{id: a, command: {command: echo}}]",
                )]
            } else {
                &[]
            };
            // The live stream watches a page.
            let path = if route == "/ui/live" {
                format!("{path}?page=jobs")
            } else {
                path
            };
            let (code, page) = as_session(&c, &base, method, &path, &token, form).await;
            tried += 1;
            assert_ne!(code, 401, "{role} {door}: {page}");
            assert!(!page.contains("FORM_FORGED"), "{role} {door}: {page}");
            if role == "agent" && *rpc == "JobService/SubmitJob" && method == "POST" {
                // The executor's own rule, as over gRPC: an agent submits
                // only child jobs of the job it works for.
                assert!(page.contains("delegated"), "{page}");
                continue;
            }
            let denied = code == 403;
            if denied == allowed.contains(*rpc) {
                wrong.push(format!("{role} {door} -> {code}"));
            }
        }
    }
    let routes = DOOR_RPCS
        .iter()
        .filter(|(d, _)| d.contains(" /ui/"))
        .count();
    assert_eq!(tried, routes * crate::auth::ROLES.len());
    assert!(routes >= 11, "{routes}");
    assert!(wrong.is_empty(), "{wrong:#?}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_cross_site_console_form_is_refused_and_changes_nothing() {
    let (s, base, mut alice) = stack_as_alice().await;
    let j = submit(&mut alice, &crate::executor::example("needs_approval.yaml"))
        .await
        .unwrap();
    let bob = s.session(&s.token("bob").unwrap()).await.unwrap();
    let path = format!("/ui/runs/{}/approve", j.run_id);
    let c = client();
    let post = |headers: Vec<(&'static str, String)>, body: String| {
        let mut req = c
            .post(format!("{base}{path}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", format!("sy_session={bob}"))
            .body(body);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        req.send()
    };
    let good = switchyard_gateway::console::session::csrf_token(&bob);
    let alices = switchyard_gateway::console::session::csrf_token(
        &s.session(&s.token("alice").unwrap()).await.unwrap(),
    );
    for (what, headers, body) in [
        ("no token", vec![], "comment=x".to_owned()),
        ("another session's token", vec![], format!("csrf={alices}")),
        (
            "another site's origin",
            vec![("origin", "http://evil.example".to_owned())],
            format!("csrf={good}"),
        ),
        (
            "a cross-site fetch",
            vec![("sec-fetch-site", "cross-site".to_owned())],
            format!("csrf={good}"),
        ),
    ] {
        let resp = post(headers, body).await.unwrap();
        assert_eq!(resp.status().as_u16(), 403, "{what}");
        let page = resp.text().await.unwrap();
        assert!(
            page.contains("FORM_FORGED") && page.contains("nothing was done"),
            "{what}: {page}"
        );
    }
    // Nothing happened: the run still waits, approved by no one.
    let mut runs = ApprovalServiceClient::new(s.channel_as("bob").await.unwrap());
    let get = || GetRunRequest {
        run_id: j.run_id.clone(),
    };
    let run = runs.get_run(get()).await.unwrap().into_inner().run.unwrap();
    assert_eq!(run.status, RunStatus::Proposed as i32);
    assert!(run.approved_by.is_empty());
    // The same form with the session's own token, from the same origin, works.
    let host = s.http.unwrap().to_string();
    let resp = post(
        vec![("origin", format!("http://{host}"))],
        format!("csrf={good}&comment=ok"),
    )
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 303);
    let run = runs.get_run(get()).await.unwrap().into_inner().run.unwrap();
    assert_eq!(run.approved_by, ["bob"]);
    // A pasted secret never reaches a URL: sign-in is a form post, and a
    // refused sign-in answers without echoing it.
    let form = c.get(format!("{base}/ui/sign-in")).send().await.unwrap();
    let nonce = form.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("sy_sign_in=")
        .to_owned();
    let resp = c
        .post(format!("{base}/ui/sign-in"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", format!("sy_sign_in={nonce}"))
        .body(format!(
            "csrf={nonce}&credential=syk_000000000000_guessed-secret"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let page = resp.text().await.unwrap();
    assert!(!page.contains("guessed-secret"), "{page}");
    // Signed in, a person lands on the inbox if they may read runs, else
    // on the jobs they may see.
    let agent = crate::auth::role_key(&s, "ui-landing", "agent").await;
    let bob_key = s.token("bob").unwrap();
    for (who, token, to) in [
        ("bob", bob_key.as_str(), "/ui/"),
        ("an agent", agent.as_str(), "/ui/jobs"),
    ] {
        let resp = c
            .post(format!("{base}/ui/sign-in"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", format!("sy_sign_in={nonce}"))
            .body(format!("csrf={nonce}&next=%2Fui%2F&credential={token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 303, "{who}");
        assert_eq!(resp.headers()["location"], to, "{who}");
    }
    // A session is not a credential to sign in with (it would outlive
    // its own sign-out), and a key put in the cookie by hand is no session.
    let resp = c
        .post(format!("{base}/ui/sign-in"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", format!("sy_sign_in={nonce}"))
        .body(format!("csrf={nonce}&credential={bob}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("cannot start another session")
    );
    let (code, _) = as_session(&c, &base, "GET", "/ui/jobs", &bob_key, &[]).await;
    assert_eq!(code, 303, "a raw key in the cookie");
    // A forged sign-in (no pre-session cookie) is refused before the key is
    // even looked at.
    let resp = c
        .post(format!("{base}/ui/sign-in"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={nonce}&credential={bob_key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    assert!(resp.headers().get("set-cookie").is_none());
    finish(&mut alice, &id(&j)).await;
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_timeline_resumes_after_the_last_event_it_received() {
    let (s, base, mut alice) = stack_as_alice().await;
    let j = submit(&mut alice, &crate::executor::example("echo_chain.yaml"))
        .await
        .unwrap();
    let job_id = id(&j);
    finish(&mut alice, &job_id).await;
    let token = s.session(&s.token("alice").unwrap()).await.unwrap();
    let read = |after: Option<u64>| {
        let mut req = client()
            .get(format!("{base}/ui/jobs/{job_id}/events"))
            .header("cookie", format!("sy_session={token}"));
        if let Some(a) = after {
            req = req.header("last-event-id", a.to_string());
        }
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 200);
            assert_eq!(resp.headers()["content-type"], "text/event-stream");
            tokio::time::timeout(Duration::from_secs(20), resp.text())
                .await
                .expect("the stream ends with the job")
                .unwrap()
        }
    };
    let ids = |body: &str| -> Vec<u64> {
        body.lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .map(|v| v.parse().unwrap())
            .collect()
    };
    let all = read(None).await;
    let seqs = ids(&all);
    assert!(seqs.len() > 5, "{all}");
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "gapless");
    // Unnamed events (one handler follows them all), then the named end.
    assert!(!all.contains("event: job.state"), "{all}");
    assert!(all.contains("event: end"), "{all}");
    let resumed = read(Some(4)).await;
    assert_eq!(ids(&resumed), seqs[4..].to_vec());
    // Another person's session does not see alice's job.
    let bob_stream = client()
        .get(format!("{base}/ui/jobs/{job_id}/events"))
        .header(
            "cookie",
            format!(
                "sy_session={}",
                s.session(
                    &s.key("other-submitter", &["submitter"], PrincipalKind::Human)
                        .await
                        .unwrap()
                )
                .await
                .unwrap()
            ),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(bob_stream.status().as_u16(), 404);
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_pages_through_more_waiting_runs_than_fit_and_a_bad_query_gets_an_error_page() {
    let (s, base, mut alice) = stack_as_alice().await;
    let doc = crate::executor::example("needs_approval.yaml");
    for _ in 0..51 {
        submit(&mut alice, &doc).await.unwrap();
    }
    let c = client();
    let bob = s.session(&s.token("bob").unwrap()).await.unwrap();
    let (code, first) = as_session(&c, &base, "GET", "/ui/", &bob, &[]).await;
    assert_eq!(code, 200);
    assert_eq!(first.matches("class=\"card run\"").count(), 50);
    let at = first.find("rel=\"next\"").expect("a link to the next page");
    let href = first[..at].rsplit("href=\"").next().unwrap();
    // As the browser reads the attribute.
    let next = href[..href.find('"').unwrap()]
        .replace("&#x2f;", "/")
        .replace("&amp;", "&");
    let (code, second) = as_session(&c, &base, "GET", &next, &bob, &[]).await;
    assert_eq!(code, 200, "{next}");
    assert_eq!(second.matches("class=\"card run\"").count(), 1, "{next}");
    assert!(!second.contains("rel=\"next\""));
    // A query the page cannot read is its error page, with the reason.
    let (code, page) = as_session(&c, &base, "GET", "/ui/jobs?state=a&state=b", &bob, &[]).await;
    assert_eq!(code, 400);
    assert!(
        page.contains("INVALID_ARGUMENT") && page.contains("duplicate field"),
        "{page}"
    );
    s.stop().await.unwrap();
}

/// The value of the form field `name` in `page` (the first one).
fn form_field(page: &str, name: &str) -> String {
    let at = page
        .find(&format!("name=\"{name}\" value=\""))
        .unwrap_or_else(|| panic!("no field {name} in {page}"));
    let rest = &page[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_named_by_an_input_step_answers_it_in_the_console_once() {
    let (s, base, mut alice) = stack_as_alice().await;
    let c = client();
    let carol = s
        .key("carol", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let carol = s.session(&carol).await.unwrap();
    let bob = s.session(&s.token("bob").unwrap()).await.unwrap();
    let doc = serde_json::json!({"job_id": "ui-ask", "tasks": [
        {"id": "ask", "input": {"prompt": "Which region for the rollout?",
          "schema": {"type": "string", "enum": ["eu", "us"]},
          "answerers": {"subjects": ["carol"]}}},
        {"id": "use", "depends_on": ["ask"],
         "agent": {"capability": "builtin.echo", "input": {"text": "region ${ask.output.answer}"}}}
    ]})
    .to_string();
    submit(&mut alice, &doc).await.unwrap();
    crate::common::until_event(&mut alice, "ui-ask", "task.input_requested").await;

    // bob (an approver, not named) is not asked; carol is, on her inbox,
    // though she cannot open the job itself.
    let (code, page) = as_session(&c, &base, "GET", "/ui/", &bob, &[]).await;
    assert_eq!(code, 200);
    assert!(!page.contains("Which region"), "{page}");
    let (code, page) = as_session(&c, &base, "GET", "/ui/", &carol, &[]).await;
    assert_eq!(code, 200);
    assert!(page.contains("Which region for the rollout?"), "{page}");
    assert!(page.contains("Waiting for your input"), "{page}");
    let key = form_field(&page, "key");
    let path = "/ui/jobs/ui-ask/input";
    // An answer the schema refuses: an error page, and the step still waits.
    let (code, page) = as_session(
        &c,
        &base,
        "POST",
        path,
        &carol,
        &[("task_id", "ask"), ("key", &key), ("answer", "mars")],
    )
    .await;
    assert_eq!(code, 400, "{page}");
    assert!(page.contains("answer_schema"), "{page}");
    // bob may not answer it: the step takes carol's answer only.
    let (code, page) = as_session(
        &c,
        &base,
        "POST",
        path,
        &bob,
        &[("task_id", "ask"), ("key", "b"), ("answer", "eu")],
    )
    .await;
    assert_eq!(code, 403, "{page}");
    assert!(page.contains("INPUT_NOT_ALLOWED"), "{page}");
    let form = [("task_id", "ask"), ("key", key.as_str()), ("answer", "eu")];
    let (code, page) = as_session(&c, &base, "POST", path, &carol, &form).await;
    assert_eq!(code, 303, "{page}");
    let r = finish(&mut alice, "ui-ask").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let out = r.tasks.iter().find(|t| t.task_id == "use").unwrap();
    let out = switchyard_kit::json::struct_to_json(out.output.as_ref().unwrap());
    assert_eq!(out["text"], "region eu");
    // The same form sent again (a double click, a reload): answered once.
    let (code, page) = as_session(&c, &base, "POST", path, &carol, &form).await;
    assert_eq!(code, 303, "{page}");
    let ask = job(&mut alice, "ui-ask").await;
    let ask = ask.tasks.iter().find(|t| t.task_id == "ask").unwrap();
    let ask = switchyard_kit::json::struct_to_json(ask.output.as_ref().unwrap());
    assert_eq!(
        (ask["answer"].as_str(), ask["answered_by"].as_str()),
        (Some("eu"), Some("carol"))
    );
    let (_, page) = as_session(&c, &base, "GET", "/ui/", &carol, &[]).await;
    assert!(!page.contains("Which region"), "answered: no longer asked");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_talks_with_a_conversation_in_the_console_and_a_double_send_sends_once() {
    let e = crate::llm::env(true, |_| {}).await;
    e.script.for_model(
        "m-chat",
        vec![switchyard_llm::scripted::Reply::text(
            "Ship it on Tuesday.",
            9,
            5,
        )],
    );
    let s = &e.stack;
    let base = format!("http://{}", s.http.as_ref().unwrap());
    let c = client();
    let carol = s
        .key("carol", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let carol = s.session(&carol).await.unwrap();
    let bob = s.session(&s.token("bob").unwrap()).await.unwrap();
    let mut alice = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    let doc = serde_json::json!({"job_id": "ui-chat", "tasks": [{"id": "talk", "conversation": {
        "orchestrator": {"model": "m-chat", "max_tokens": 20},
        "participants": {"subjects": ["carol"]}}}]})
    .to_string();
    submit(&mut alice, &doc).await.unwrap();
    let path = "/ui/jobs/ui-chat/chat";
    // carol, named, sees the conversation though she cannot open the job.
    let (code, page) = as_session(&c, &base, "GET", path, &carol, &[]).await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("No messages yet."), "{page}");
    let key = form_field(&page, "key");
    let form = [
        ("task_id", "talk"),
        ("key", key.as_str()),
        ("text", "When do we ship?"),
    ];
    let (code, page) = as_session(&c, &base, "POST", path, &carol, &form).await;
    assert_eq!(code, 303, "{page}");
    // The same form again (a double click): one message.
    let (code, _) = as_session(&c, &base, "POST", path, &carol, &form).await;
    assert_eq!(code, 303);
    crate::common::until_event(&mut alice, "ui-chat", "conversation.replied").await;
    let (_, page) = as_session(&c, &base, "GET", path, &carol, &[]).await;
    assert!(page.contains("When do we ship?"), "{page}");
    assert!(page.contains("Ship it on Tuesday."), "{page}");
    assert_eq!(page.matches("When do we ship?").count(), 1, "{page}");
    // Who spent what: the orchestrator's one turn, with its tokens.
    assert!(
        page.contains("Who spent what")
            && page.contains("<tr><td><code>orchestrator</code></td><td>1</td>"),
        "{page}"
    );
    assert!(
        !page.contains("http-equiv=\"refresh\" content=\"2\""),
        "answered: no refresh"
    );
    // bob (an approver) may read the job but is not in the conversation.
    let (code, page) = as_session(&c, &base, "POST", path, &bob, &[("text", "hi")]).await;
    assert_eq!(code, 403, "{page}");
    assert!(page.contains("CONVERSATION_NOT_ALLOWED"), "{page}");
    // Ending it from the console completes the job.
    let end = [("task_id", "talk"), ("key", "ui-end"), ("close", "1")];
    let (code, page) = as_session(&c, &base, "POST", path, &carol, &end).await;
    assert_eq!(code, 303, "{page}");
    let r = finish(&mut alice, "ui-chat").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let (_, page) = as_session(&c, &base, "GET", path, &carol, &[]).await;
    assert!(
        page.contains("ended the conversation") && !page.contains("name=\"text\""),
        "{page}"
    );
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_approves_a_job_up_to_a_scope_in_the_console_and_a_bad_amount_changes_nothing()
{
    let (s, base, mut alice) = stack_as_alice().await;
    let j = submit(&mut alice, &crate::executor::example("needs_approval.yaml"))
        .await
        .unwrap();
    let bob = s.session(&s.token("bob").unwrap()).await.unwrap();
    let c = client();
    // The inbox offers the scope on a job's run.
    let (_, inbox) = as_session(&c, &base, "GET", "/ui/", &bob, &[]).await;
    assert!(
        inbox.contains("Approve up to a scope, held now") && inbox.contains("name=\"up_to\""),
        "{inbox}"
    );
    let path = format!("/ui/runs/{}/approve", j.run_id);
    let post = |form: &'static [(&'static str, &'static str)]| {
        as_session(&c, &base, "POST", &path, &bob, form)
    };
    let mut runs = ApprovalServiceClient::new(s.channel_as("bob").await.unwrap());
    let get = || GetRunRequest {
        run_id: j.run_id.clone(),
    };
    // An amount that is not one is said, and nothing is approved.
    let (code, page) = post(&[("up_to", "lots")]).await;
    assert_eq!(code, 400);
    assert!(
        page.contains("up_to") && page.contains("dollar amount"),
        "{page}"
    );
    let run = runs.get_run(get()).await.unwrap().into_inner().run.unwrap();
    assert_eq!(run.status, RunStatus::Proposed as i32);
    // Up to $0.50 (the tokens: the estimate's): the run keeps the scope,
    // the job holds it and draws from it.
    let (code, _) = post(&[("comment", "ok"), ("up_to", "0.50"), ("tokens", "")]).await;
    assert_eq!(code, 303);
    let run = runs.get_run(get()).await.unwrap().into_inner().run.unwrap();
    let scope = run.scope.unwrap();
    let est = run.cost_estimate.unwrap();
    assert_eq!(
        (scope.tokens, scope.cost),
        (
            est.estimated_input_tokens + est.estimated_output_tokens,
            Some(Money { micro_usd: 500_000 })
        )
    );
    assert!(scope.tokens > 0, "{est:?}");
    let job_id = j.spec.as_ref().unwrap().job_id.clone();
    let held = crate::common::until_event(&mut alice, &job_id, "budget.scope_held").await;
    assert_eq!(held["cost_micro_usd"], 500_000, "{held}");
    assert_eq!(
        finish(&mut alice, &job_id).await.state,
        JobState::Completed as i32
    );
    s.stop().await.unwrap();
}
