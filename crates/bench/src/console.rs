//! The web console's pages against the same reads over gRPC, in one run
//! (`switchyard-bench console`): an approver's inbox of 50 waiting runs —
//! each with its job, the budget chain it draws on and the route of each
//! task — a job page, and the budgets page (the tree of every budget and
//! the spend report of the last hour), by 4 concurrent browsers for 3 s
//! each, interleaved with a gRPC client making the same calls (concurrently
//! per run, as the console does) from outside the process.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use switchyard_cli::ServiceKind;
use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
use switchyard_proto::approval::v1::{ListRunsRequest, RunStatus};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{GetJobRequest, SubmitJobRequest, task_spec};
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_proto::ledger::v1::{GetBudgetRequest, GroupBy, ListBudgetsRequest, ReportRequest};
use switchyard_proto::router::v1::RouteRequest;
use switchyard_proto::router::v1::router_service_client::RouterServiceClient;
use switchyard_testkit::Stack;

use crate::us;

const RUNS: usize = 50;
const BROWSERS: usize = 4;
const PHASE: Duration = Duration::from_secs(3);

/// A three-task job a person must approve.
fn job(i: usize) -> String {
    format!(
        "plan_id: inbox-{i}
approval: {{intent: bench run {i}, requires_approval: true}}
tasks:
  - {{id: a, agent: {{capability: builtin.echo, input: {{text: a}}}}}}
  - {{id: b, depends_on: [a], agent: {{capability: builtin.echo, input: {{text: b}}}}}}
  - {{id: c, depends_on: [b], agent: {{capability: builtin.echo, input: {{text: c}}}}}}
"
    )
}

/// `BROWSERS` loops of `op` for `PHASE`: (latency histogram in ns, done).
async fn measure<F, Fut>(op: F) -> anyhow::Result<(Histogram<u64>, u64)>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..BROWSERS {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            let mut n = 0u64;
            while start.elapsed() < PHASE {
                let t = Instant::now();
                op().await?;
                h.record(t.elapsed().as_nanos() as u64).ok();
                n += 1;
            }
            anyhow::Ok((h, n))
        }));
    }
    let mut all = Histogram::<u64>::new(3)?;
    let mut done = 0;
    for t in tasks {
        let (h, n) = t.await??;
        all.add(h).ok();
        done += n;
    }
    Ok((all, done))
}

/// The inbox's reads over gRPC, as bob: ListRuns, then per run (all runs
/// at once) GetJob, the budget chain and a Route per agent task.
async fn inbox_over_grpc(ch: switchyard_kit::client::Intercepted) -> anyhow::Result<()> {
    let runs = ApprovalServiceClient::new(ch.clone())
        .list_runs(ListRunsRequest {
            statuses: vec![RunStatus::Proposed as i32],
            page_size: RUNS as u32,
            ..Default::default()
        })
        .await?
        .into_inner()
        .runs;
    let cards = runs.into_iter().map(|r| {
        let ch = ch.clone();
        async move {
            let job = JobServiceClient::new(ch.clone())
                .get_job(GetJobRequest { job_id: r.job_id })
                .await?
                .into_inner()
                .job
                .unwrap_or_default();
            let mut next = job.budget_id.clone();
            while !next.is_empty() {
                let b = LedgerServiceClient::new(ch.clone())
                    .get_budget(GetBudgetRequest {
                        budget_id: next.clone(),
                    })
                    .await?
                    .into_inner()
                    .budget
                    .unwrap_or_default();
                next = b.parent_id;
            }
            for t in job.spec.unwrap_or_default().tasks {
                if let Some(task_spec::Kind::Agent(a)) = t.kind {
                    RouterServiceClient::new(ch.clone())
                        .route(RouteRequest {
                            capability: a.capability,
                            limit: 1,
                            ..Default::default()
                        })
                        .await?;
                }
            }
            anyhow::Ok(())
        }
    });
    for r in futures_util::future::join_all(cards).await {
        r?;
    }
    Ok(())
}

/// One line: the page's p50, p99 and rate, the gRPC side's p50 and rate,
/// and the ratio of their medians.
fn report(what: &str, grpc: &str, page: &(Histogram<u64>, u64), calls: &(Histogram<u64>, u64)) {
    let ms = |h: &Histogram<u64>, q: f64| us(h, q) / 1000.0;
    let rate = |n: u64| n as f64 / PHASE.as_secs_f64();
    println!(
        "  {what:<52} page p50 {:>7.2} ms  p99 {:>7.2} ms  {:>7.1} pages/s;  {grpc} p50 {:>7.2} ms  {:>7.1}/s;  page/gRPC {:.2}x",
        ms(&page.0, 0.5),
        ms(&page.0, 0.99),
        rate(page.1),
        ms(&calls.0, 0.5),
        rate(calls.1),
        ms(&page.0, 0.5) / ms(&calls.0, 0.5),
    );
}

pub(crate) async fn run() -> anyhow::Result<()> {
    let s = Stack::start_with(ServiceKind::ALL, |c| {
        c.server.request_timeout_ms = 60_000;
    })
    .await?;
    let mut alice = JobServiceClient::new(s.channel_as("alice").await?);
    let mut last = String::new();
    for i in 0..RUNS {
        let j = alice
            .submit_job(SubmitJobRequest {
                document: job(i),
                ..Default::default()
            })
            .await?
            .into_inner()
            .job
            .unwrap_or_default();
        last = j.spec.unwrap_or_default().job_id;
    }
    let base = format!(
        "http://{}",
        s.http.ok_or_else(|| anyhow::anyhow!("no HTTP door"))?
    );
    let cookie = format!("sy_session={}", s.session(&s.token("bob")?).await?);
    let http = reqwest::Client::new();
    let page = |path: String| {
        let (http, cookie, url) = (http.clone(), cookie.clone(), format!("{base}{path}"));
        move || {
            let (http, cookie, url) = (http.clone(), cookie.clone(), url.clone());
            async move {
                let resp = http.get(&url).header("cookie", &cookie).send().await?;
                anyhow::ensure!(resp.status() == 200, "{url}: {}", resp.status());
                let body = resp.text().await?;
                anyhow::ensure!(body.len() > 1000, "{url}: a short page");
                Ok(())
            }
        }
    };
    let inbox = page("/ui/".into());
    let first = reqwest::Client::new()
        .get(format!("{base}/ui/"))
        .header("cookie", &cookie)
        .send()
        .await?
        .text()
        .await?;
    anyhow::ensure!(
        first.matches("class=\"card run\"").count() == RUNS,
        "the inbox should show all {RUNS} runs"
    );
    let bob = s.channel_as("bob").await?;
    let grpc = move || inbox_over_grpc(bob.clone());
    let job_page = page(format!("/ui/jobs/{last}"));
    let bob_jobs = JobServiceClient::new(s.channel_as("bob").await?);
    let get_job = move || {
        let (mut c, id) = (bob_jobs.clone(), last.clone());
        async move {
            c.get_job(GetJobRequest { job_id: id }).await?;
            anyhow::Ok(())
        }
    };
    println!(
        "\nWeb console (`/ui/`) against the same reads over gRPC, {BROWSERS} concurrent clients, {} s per figure:",
        PHASE.as_secs()
    );
    let (c, g) = (measure(inbox).await?, measure(grpc).await?);
    report(
        &format!("inbox, {RUNS} runs x (job + budget chain + 3 routes):"),
        "gRPC",
        &c,
        &g,
    );
    let (c, g) = (measure(job_page).await?, measure(get_job).await?);
    report("job page (3 tasks):", "GetJob", &c, &g);
    // The budgets page: the budgets bob may read (a page of 200), then the
    // report.
    let bob_ledger = LedgerServiceClient::new(s.channel_as("bob").await?);
    let list = || ListBudgetsRequest {
        page_size: 200,
        ..Default::default()
    };
    let listed = bob_ledger
        .clone()
        .list_budgets(list())
        .await?
        .into_inner()
        .budgets
        .len();
    let budgets_page = page("/ui/budgets".into());
    let budgets_grpc = move || {
        let mut c = bob_ledger.clone();
        async move {
            c.list_budgets(list()).await?;
            let since = switchyard_kit::time::now_ms().saturating_sub(3_600_000);
            c.report(ReportRequest {
                since: Some(switchyard_kit::time::timestamp(since)),
                group_by: GroupBy::Project as i32,
                ..Default::default()
            })
            .await?;
            anyhow::Ok(())
        }
    };
    let (c, g) = (measure(budgets_page).await?, measure(budgets_grpc).await?);
    report(
        &format!("budgets page ({listed} budgets, last hour's report):"),
        "gRPC",
        &c,
        &g,
    );
    s.stop().await?;
    Ok(())
}
