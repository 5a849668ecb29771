//! The gateway's doors against the same submissions over gRPC, in one run
//! (`switchyard-bench gateway`), 64 concurrent clients each, rounds
//! interleaved so drift on a noisy machine hits both sides alike:
//!
//! - AITP round trip: `POST /aitp/tasks`, follow `/events` (SSE) to the
//!   end, `GET …/result` — against SubmitJob, WatchJob to the end and
//!   GetResult with the same document over gRPC;
//! - RESP `PLAN.SUBMIT` throughput — against SubmitJob with the same AGEniX
//!   envelope over gRPC.
//!
//! The goal (issue 17) is a ratio of at least 0.8 for each.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use switchyard_api::ExecutorClient;
use switchyard_cli::ServiceKind;
use switchyard_proto::executor::v1::{GetResultRequest, SubmitJobRequest, WatchJobRequest};
use switchyard_testkit::Stack;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

use crate::{CALLERS, us, verdict};

pub(crate) const ROUNDS: usize = 3;
pub(crate) const PHASE: Duration = Duration::from_secs(3);

/// A one-subtask AITP task on the built-in no-op agent, with a fresh id.
fn aitp(id: &str) -> String {
    format!(
        r#"{{"task_id":"{id}","name":"bench","subtasks":[{{"subtask_id":"s1","agent_capability":"builtin.noop","input":{{}}}}]}}"#
    )
}

/// A one-task AGEniX envelope (`true`), with a fresh id.
fn envelope(id: &str) -> String {
    format!(
        r#"{{"job_id":"{id}","plan_id":"bench","tasks":[{{"task_number":1,"command":"true"}}]}}"#
    )
}

/// What one phase measured.
#[derive(Default)]
pub(crate) struct Phase {
    pub(crate) done: u64,
    pub(crate) errors: u64,
    pub(crate) took: Duration,
    pub(crate) latency: Option<Histogram<u64>>,
}

impl Phase {
    pub(crate) fn rate(&self) -> f64 {
        self.done as f64 / self.took.as_secs_f64()
    }
}

/// `CALLERS` clients, each made by `client(i)`, run `op` in a loop for
/// `PHASE`; `op` takes its client and hands it back with the outcome.
pub(crate) async fn phase<C, Mk, MkFut, Op, OpFut>(client: Mk, op: Op) -> anyhow::Result<Phase>
where
    C: Send + 'static,
    Mk: Fn(usize) -> MkFut,
    MkFut: std::future::Future<Output = anyhow::Result<C>>,
    Op: Fn(C, u64) -> OpFut + Clone + Send + Sync + 'static,
    OpFut: std::future::Future<Output = (C, anyhow::Result<()>)> + Send,
{
    static SEQ: AtomicU64 = AtomicU64::new(1);
    let mut clients = Vec::new();
    for i in 0..CALLERS {
        clients.push(client(i).await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut c in clients {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            let (mut n, mut e) = (0u64, 0u64);
            let deadline = start + PHASE;
            while Instant::now() < deadline {
                let t = Instant::now();
                let (back, r) = op(c, SEQ.fetch_add(1, Ordering::Relaxed)).await;
                c = back;
                match r {
                    Ok(()) => n += 1,
                    Err(_) => e += 1,
                }
                h.record(t.elapsed().as_nanos() as u64).ok();
            }
            (h, n, e)
        }));
    }
    let mut out = Phase::default();
    let mut all = Histogram::<u64>::new(3)?;
    for t in tasks {
        let (h, n, e) = t.await?;
        all.add(h).ok();
        out.done += n;
        out.errors += e;
    }
    out.took = start.elapsed();
    out.latency = Some(all);
    Ok(out)
}

/// One RESP connection, authenticated.
struct RespConn {
    sock: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl RespConn {
    async fn open(addr: std::net::SocketAddr, token: &str) -> anyhow::Result<RespConn> {
        let mut c = RespConn {
            sock: tokio::net::TcpStream::connect(addr).await?,
            buf: Vec::with_capacity(4096),
        };
        c.sock.set_nodelay(true)?;
        let line = c.call(&["AUTH", token]).await?;
        anyhow::ensure!(line == "+OK", "AUTH: {line}");
        Ok(c)
    }

    /// Sends a command; returns its one-line reply.
    async fn call(&mut self, args: &[&str]) -> anyhow::Result<String> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.sock.write_all(&out).await?;
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return Ok(line);
            }
            let mut chunk = [0u8; 4096];
            let n = self.sock.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "connection closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// SubmitJob + WatchJob to the end + GetResult, over gRPC.
async fn grpc_round_trip(c: &ExecutorClient, doc: String) -> anyhow::Result<()> {
    let job = c
        .submit_job(SubmitJobRequest {
            document: doc,
            format: "aitp".into(),
            ..Default::default()
        })
        .await?
        .job
        .unwrap_or_default();
    let id = job.spec.map(|s| s.job_id).unwrap_or_default();
    let mut events = c
        .watch_job(WatchJobRequest {
            job_id: id.clone(),
            after_sequence: 0,
            ..Default::default()
        })
        .await?;
    while let Some(e) = events.next().await {
        e?;
    }
    let r = c
        .get_result(GetResultRequest {
            job_id: id,
            ..Default::default()
        })
        .await?;
    anyhow::ensure!(r.state == 5, "not completed: {}", r.state);
    Ok(())
}

/// POST, SSE to the end, GET result, over the REST door.
async fn rest_round_trip(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    doc: String,
) -> anyhow::Result<()> {
    let posted = http
        .post(format!("{base}/aitp/tasks"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(doc)
        .send()
        .await?;
    anyhow::ensure!(posted.status().as_u16() == 201, "POST: {}", posted.status());
    let v: serde_json::Value = posted.json().await?;
    let id = v["task_id"].as_str().unwrap_or_default().to_owned();
    let events = http
        .get(format!("{base}/aitp/tasks/{id}/events"))
        .bearer_auth(token)
        .send()
        .await?;
    events.bytes().await?;
    let r = http
        .get(format!("{base}/aitp/tasks/{id}/result"))
        .bearer_auth(token)
        .send()
        .await?;
    anyhow::ensure!(r.status().as_u16() == 200, "result: {}", r.status());
    Ok(())
}

/// Waits until no job is waiting or running, so one phase's jobs do not
/// run on in the next one's time.
async fn quiet(c: &ExecutorClient) -> anyhow::Result<()> {
    use switchyard_proto::executor::v1::{JobState, ListJobsRequest};
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let busy = c
            .list_jobs(ListJobsRequest {
                states: vec![
                    JobState::Pending as i32,
                    JobState::Available as i32,
                    JobState::Active as i32,
                ],
                page_size: 1,
                ..Default::default()
            })
            .await?;
        if busy.jobs.is_empty() || Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn line(name: &str, p: &Phase) {
    let h = p.latency.as_ref();
    println!(
        "  {name:<44} {:>8.0}/s  p50 {:>8.2} ms  p99 {:>8.2} ms  errors {}",
        p.rate(),
        h.map_or(0.0, |h| us(h, 0.5) / 1000.0),
        h.map_or(0.0, |h| us(h, 0.99) / 1000.0),
        p.errors
    );
}

/// The whole stack with its doors; the `tester` key (every role but
/// approver); the HTTP door's base URL.
pub(crate) async fn stack_with_doors() -> anyhow::Result<(Stack, Arc<String>, Arc<String>)> {
    switchyard_kit::tls::install_crypto();
    let stack = Stack::start_with(ServiceKind::ALL, |c| {
        c.server.request_timeout_ms = 60_000;
    })
    .await?;
    let token = Arc::new(stack.token("tester")?);
    let base = Arc::new(format!(
        "http://{}",
        stack.http.ok_or_else(|| anyhow::anyhow!("no http door"))?
    ));
    Ok((stack, token, base))
}

/// `switchyard-bench gateway`.
pub async fn run() -> anyhow::Result<()> {
    let (stack, token, base) = stack_with_doors().await?;
    let resp = stack.resp.ok_or_else(|| anyhow::anyhow!("no resp door"))?;
    let grpc = ExecutorClient::remote(stack.channel().await?, 4 * 1024 * 1024);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CALLERS)
        .build()?;

    println!(
        "Gateway doors vs gRPC, {CALLERS} concurrent clients, {ROUNDS} interleaved rounds of {PHASE:?}:"
    );
    let (mut g_rt, mut h_rt, mut g_sub, mut r_sub) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let grpc_client = |_| async { Ok(grpc.clone()) };
        let r = format!("g{round}");
        g_rt.push(
            phase(grpc_client, move |c: ExecutorClient, n| {
                let doc = aitp(&format!("{r}-{n}"));
                async move {
                    let out = grpc_round_trip(&c, doc).await;
                    (c, out)
                }
            })
            .await?,
        );
        quiet(&grpc).await?;
        let (b, t, r) = (base.clone(), token.clone(), format!("h{round}"));
        h_rt.push(
            phase(
                |_| async { Ok(http.clone()) },
                move |h: reqwest::Client, n| {
                    let (b, t, doc) = (b.clone(), t.clone(), aitp(&format!("{r}-{n}")));
                    async move {
                        let out = rest_round_trip(&h, &b, &t, doc).await;
                        (h, out)
                    }
                },
            )
            .await?,
        );
        quiet(&grpc).await?;
        let r = format!("gs{round}");
        g_sub.push(
            phase(grpc_client, move |c: ExecutorClient, n| {
                let doc = envelope(&format!("{r}-{n}"));
                async move {
                    let req = SubmitJobRequest {
                        document: doc,
                        format: "agenix".into(),
                        ..Default::default()
                    };
                    let out = c
                        .submit_job(req)
                        .await
                        .map(|_| ())
                        .map_err(anyhow::Error::from);
                    (c, out)
                }
            })
            .await?,
        );
        quiet(&grpc).await?;
        let (t, r) = (token.clone(), format!("rs{round}"));
        r_sub.push(
            phase(
                |_| RespConn::open(resp, &t),
                move |mut c: RespConn, n| {
                    let doc = envelope(&format!("{r}-{n}"));
                    async move {
                        let out = match c.call(&["PLAN.SUBMIT", &doc]).await {
                            Ok(l) if l.starts_with("+OK job_id=") => Ok(()),
                            Ok(l) => Err(anyhow::anyhow!("PLAN.SUBMIT: {l}")),
                            Err(e) => Err(e),
                        };
                        (c, out)
                    }
                },
            )
            .await?,
        );
        quiet(&grpc).await?;
    }
    let sum = |v: &[Phase]| Phase {
        done: v.iter().map(|p| p.done).sum(),
        errors: v.iter().map(|p| p.errors).sum(),
        took: v.iter().map(|p| p.took).sum(),
        latency: v
            .iter()
            .filter_map(|p| p.latency.clone())
            .reduce(|mut a, b| {
                a.add(b).ok();
                a
            }),
    };
    let (g_rt, h_rt, g_sub, r_sub) = (sum(&g_rt), sum(&h_rt), sum(&g_sub), sum(&r_sub));
    println!(" AITP submit + follow to the end + result (a one-subtask task on builtin.noop):");
    line("gRPC: SubmitJob + WatchJob + GetResult", &g_rt);
    line("REST: POST + GET events (SSE) + GET result", &h_rt);
    let rt = h_rt.rate() / g_rt.rate();
    println!(
        "  ratio REST/gRPC {rt:.2}  [{}: >= 0.8]",
        verdict(rt >= 0.8)
    );
    println!(" AGEniX submission (a one-task envelope, accepted and recorded durably):");
    line("gRPC: SubmitJob", &g_sub);
    line("RESP: PLAN.SUBMIT", &r_sub);
    let sub = r_sub.rate() / g_sub.rate();
    println!(
        "  ratio RESP/gRPC {sub:.2}  [{}: >= 0.8]",
        verdict(sub >= 0.8)
    );
    stack.stop().await?;
    Ok(())
}
