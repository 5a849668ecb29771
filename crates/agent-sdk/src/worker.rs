//! A pull worker: fetch queue tasks from the executor's `WorkerService`, run
//! each with a [`Handler`], ack or nack it, and heartbeat while it runs.
//!
//! The loop keeps up to `concurrency` tasks in hand. One heartbeat call
//! every third of the visibility timeout extends every lease it holds; a
//! lease the executor reports lost (the job was cancelled, or the lease
//! lapsed and went to another worker) stops that task's handler, since its
//! ack would be refused anyway. An operator's `QUIET` stops fetching;
//! `TERMINATE` hands every task back (`Nack` with `requeue`) and ends the
//! loop. On shutdown (SIGTERM in a binary) the worker drains: it fetches no
//! more and lets the tasks in hand finish, up to `drain`, then hands back
//! what is left.
//!
//! Budget: a task of a job with a budget comes with its `budget_id`; a
//! handler that spends tokens reserves and commits on it through
//! `LedgerService` and reports the tokens in [`Done::tokens_used`]. The job's
//! count is the ledger's, never this report.
//!
//! ```ignore
//! struct Upper;
//! #[tonic::async_trait]
//! impl Handler for Upper {
//!     async fn handle(&self, task: &LeasedTask) -> Result<Done, Failure> {
//!         let text = payload(task).to_string();
//!         Ok(Done::new(serde_json::json!({"upper": text.to_uppercase()})))
//!     }
//! }
//! run(Upper, options, shutdown).await?;
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchyard_api::WorkerClient;
use switchyard_kit::json::{json_to_value, value_to_json};
use switchyard_kit::shutdown::Shutdown;
use switchyard_proto::executor::v1::{
    AckRequest, FetchRequest, HeartbeatRequest, LeasedTask, NackRequest, TaskRef, WorkerError,
    WorkerState,
};
use tokio::task::JoinSet;
use tonic::Status;

/// A task finished: its result (the job's output) and the tokens it used.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// The result, any JSON.
    pub result: serde_json::Value,
    /// Tokens it spent (committed on the job's budget by the handler).
    pub tokens_used: u64,
    /// Artifacts it produced; each kind must be allowed by the job's
    /// outputs_allowed.
    pub artifacts: Vec<switchyard_proto::common::v1::NewArtifact>,
}

impl Done {
    /// A result that spent no tokens.
    pub fn new(result: serde_json::Value) -> Done {
        Done {
            result,
            tokens_used: 0,
            artifacts: Vec::new(),
        }
    }

    /// The same result with an artifact.
    pub fn with_artifact(mut self, a: switchyard_proto::common::v1::NewArtifact) -> Done {
        self.artifacts.push(a);
        self
    }
}

/// A task failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// Machine-readable code (matched against the task's
    /// `non_retryable_errors`).
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// `Some(false)`: do not retry. `None`: retry per the task's policy.
    pub retryable: Option<bool>,
}

impl Failure {
    /// A failure the task's retry policy decides about.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            code: code.into(),
            message: message.into(),
            retryable: None,
        }
    }

    /// A failure no retry can fix.
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            retryable: Some(false),
            ..Failure::new(code, message)
        }
    }
}

/// What a worker does with one task.
#[tonic::async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Runs one leased task. Dropped (cancelled) when the lease is lost.
    async fn handle(&self, task: &LeasedTask) -> Result<Done, Failure>;
}

/// The payload of a leased task as JSON (`null` when it has none).
pub fn payload(task: &LeasedTask) -> serde_json::Value {
    task.payload
        .as_ref()
        .map_or(serde_json::Value::Null, value_to_json)
}

/// Where and how to work.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// This worker's id (stable across restarts is best: operators drain
    /// it by name).
    pub worker_id: String,
    /// Queues to take tasks from, in order of preference.
    pub queues: Vec<String>,
    /// Tasks in hand at once.
    pub concurrency: usize,
    /// Lease length asked for; heartbeats renew it at a third of it.
    pub visibility_timeout: Duration,
    /// How long one fetch waits for a task (long poll).
    pub poll_wait: Duration,
    /// On shutdown, how long tasks in hand may take to finish before they
    /// are handed back.
    pub drain: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            worker_id: format!("worker-{}", std::process::id()),
            queues: vec!["default".into()],
            concurrency: 4,
            visibility_timeout: Duration::from_secs(30),
            poll_wait: Duration::from_secs(5),
            drain: Duration::from_secs(30),
        }
    }
}

/// What a worker did, when its loop ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Tasks acked.
    pub acked: u64,
    /// Tasks nacked (failed).
    pub failed: u64,
    /// Tasks handed back untried or unfinished (drain, terminate).
    pub handed_back: u64,
    /// Tasks whose lease was lost before they were settled.
    pub lost: u64,
}

/// The tasks in hand, by job id.
type InHand = Arc<Mutex<HashMap<String, (TaskRef, tokio::task::AbortHandle)>>>;

/// How one task ended.
enum Settled {
    Acked,
    Failed,
    Lost,
}

/// Runs the worker loop until shutdown (drained), `TERMINATE`, or an error
/// fetching that is not a passing outage (a refused credential, say).
pub async fn run<H: Handler>(
    handler: H,
    workers: WorkerClient,
    opts: WorkerOptions,
    shutdown: Shutdown,
) -> Result<Summary, Status> {
    let handler = Arc::new(handler);
    let in_hand: InHand = Arc::default();
    let mut running: JoinSet<Settled> = JoinSet::new();
    let mut summary = Summary::default();
    let mut state = WorkerState::Running;
    let period = (opts.visibility_timeout / 3).max(Duration::from_millis(100));
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let mut backoff = Duration::from_millis(100);
    loop {
        if shutdown.is_shutdown() || state == WorkerState::Terminate {
            break;
        }
        let free = opts.concurrency.saturating_sub(running.len());
        let fetching = free > 0 && state == WorkerState::Running;
        let fetch = async {
            if !fetching {
                return std::future::pending().await;
            }
            workers
                .fetch(FetchRequest {
                    queues: opts.queues.clone(),
                    count: free as u32,
                    worker_id: opts.worker_id.clone(),
                    visibility_timeout: Some(switchyard_kit::time::duration(
                        opts.visibility_timeout.as_millis() as u64,
                    )),
                    wait: Some(switchyard_kit::time::duration(
                        opts.poll_wait.as_millis() as u64
                    )),
                })
                .await
        };
        tokio::select! {
            got = fetch => match got {
                Ok(out) => {
                    backoff = Duration::from_millis(100);
                    state = WorkerState::try_from(out.state).unwrap_or(WorkerState::Running);
                    for task in out.tasks {
                        start(&mut running, &in_hand, handler.clone(), workers.clone(), &opts, task);
                    }
                }
                Err(s) if passing(&s) => {
                    tracing::warn!(error = %s.message(), "fetching tasks; will retry");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.wait() => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(s) => {
                    hand_back(&workers, &opts, &in_hand, &mut running, "the worker stopped").await;
                    return Err(s);
                }
            },
            Some(done) = running.join_next() => count(&mut summary, done),
            _ = beat.tick() => {
                if let Some(s) = heartbeat(&workers, &opts, &in_hand, &mut summary).await {
                    state = s;
                }
            }
            _ = shutdown.wait() => {}
        }
    }
    if state != WorkerState::Terminate {
        // Drain: no more fetches; what is in hand finishes (heartbeats go
        // on) until the drain time is up.
        let until = tokio::time::Instant::now() + opts.drain;
        while !running.is_empty() {
            tokio::select! {
                Some(done) = running.join_next() => count(&mut summary, done),
                _ = beat.tick() => {
                    if heartbeat(&workers, &opts, &in_hand, &mut summary).await == Some(WorkerState::Terminate) {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(until) => break,
            }
        }
    }
    summary.handed_back += hand_back(
        &workers,
        &opts,
        &in_hand,
        &mut running,
        "the worker is stopping",
    )
    .await;
    tracing::info!(worker_id = %opts.worker_id, ?summary, "worker stopped");
    Ok(summary)
}

/// Whether a fetch error passes (the executor restarting, a network blip).
fn passing(s: &Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::ResourceExhausted
    )
}

fn count(summary: &mut Summary, done: Result<Settled, tokio::task::JoinError>) {
    match done {
        Ok(Settled::Acked) => summary.acked += 1,
        Ok(Settled::Failed) => summary.failed += 1,
        Ok(Settled::Lost) => summary.lost += 1,
        // Aborted: its lease was lost (counted by the heartbeat) or it was
        // handed back (counted there).
        Err(_) => {}
    }
}

/// Runs `task` and settles it: ack on success, nack on failure.
fn start<H: Handler>(
    running: &mut JoinSet<Settled>,
    in_hand: &InHand,
    handler: Arc<H>,
    workers: WorkerClient,
    opts: &WorkerOptions,
    task: LeasedTask,
) {
    let Some(r) = task.task.clone() else {
        return;
    };
    let worker_id = opts.worker_id.clone();
    let hand = in_hand.clone();
    let held = r.clone();
    // The slot is taken before the task can end, so it is freed once.
    let mut slots = lock(in_hand);
    let abort = running.spawn(async move {
        let outcome = handler.handle(&task).await;
        let settled = settle(&workers, &worker_id, &r, outcome).await;
        lock(&hand).remove(&r.job_id);
        settled
    });
    slots.insert(held.job_id.clone(), (held, abort));
}

async fn settle(
    workers: &WorkerClient,
    worker_id: &str,
    r: &TaskRef,
    outcome: Result<Done, Failure>,
) -> Settled {
    let (sent, ok) = match outcome {
        Ok(done) => {
            let req = AckRequest {
                task: Some(r.clone()),
                worker_id: worker_id.to_owned(),
                result: Some(json_to_value(&done.result)),
                tokens_used: done.tokens_used,
                artifacts: done.artifacts,
            };
            (workers.ack(req).await.map(|_| ()), Settled::Acked)
        }
        Err(f) => {
            let req = NackRequest {
                task: Some(r.clone()),
                worker_id: worker_id.to_owned(),
                error: Some(WorkerError {
                    code: f.code,
                    message: f.message,
                    retryable: f.retryable,
                    ..Default::default()
                }),
                requeue: false,
            };
            (workers.nack(req).await.map(|_| ()), Settled::Failed)
        }
    };
    match sent {
        Ok(()) => ok,
        Err(s) => {
            // LEASE_LOST, a finished job, or the executor gone: the task is
            // the executor's again either way.
            tracing::warn!(job_id = %r.job_id, attempt = r.attempt, error = %s.message(), "settling a task was refused");
            Settled::Lost
        }
    }
}

/// One heartbeat for every task in hand; stops the handlers of leases the
/// executor reports lost. Returns the worker state it was told.
async fn heartbeat(
    workers: &WorkerClient,
    opts: &WorkerOptions,
    in_hand: &InHand,
    summary: &mut Summary,
) -> Option<WorkerState> {
    let active: Vec<TaskRef> = lock(in_hand).values().map(|(r, _)| r.clone()).collect();
    let req = HeartbeatRequest {
        worker_id: opts.worker_id.clone(),
        active,
        visibility_timeout: Some(switchyard_kit::time::duration(
            opts.visibility_timeout.as_millis() as u64,
        )),
    };
    match workers.heartbeat(req).await {
        Ok(out) => {
            let mut hand = lock(in_hand);
            for lost in &out.lost {
                if let Some((_, abort)) = hand.remove(&lost.job_id) {
                    tracing::warn!(job_id = %lost.job_id, "lease lost (cancelled or re-leased); stopping its task");
                    abort.abort();
                    summary.lost += 1;
                }
            }
            WorkerState::try_from(out.state).ok()
        }
        Err(s) => {
            tracing::warn!(error = %s.message(), "heartbeat failed; will retry");
            None
        }
    }
}

/// Stops every task in hand and hands it back untried; returns how many.
async fn hand_back(
    workers: &WorkerClient,
    opts: &WorkerOptions,
    in_hand: &InHand,
    running: &mut JoinSet<Settled>,
    why: &str,
) -> u64 {
    let left: Vec<TaskRef> = lock(in_hand)
        .drain()
        .map(|(_, (r, abort))| {
            abort.abort();
            r
        })
        .collect();
    running.abort_all();
    while running.join_next().await.is_some() {}
    let mut n = 0;
    for r in left {
        let req = NackRequest {
            task: Some(r.clone()),
            worker_id: opts.worker_id.clone(),
            error: Some(WorkerError {
                code: "worker_stopping".into(),
                message: why.to_owned(),
                ..Default::default()
            }),
            requeue: true,
        };
        match workers.nack(req).await {
            Ok(_) => n += 1,
            Err(s) => {
                tracing::warn!(job_id = %r.job_id, error = %s.message(), "handing a task back was refused")
            }
        }
    }
    n
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
