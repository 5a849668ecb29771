//! Pull workers over gRPC (`WorkerService`), against the whole stack in one
//! process: leases are handed out once, fenced by attempt and owner, lapse
//! and are offered again, and only principals with `task.work` may pull.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use switchyard_agent_sdk::worker::{Done, Failure, Handler, WorkerOptions, payload};
use switchyard_core::Reason;
use switchyard_kit::client::Intercepted;
use switchyard_kit::error::ApiError;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::worker_service_client::WorkerServiceClient;
use switchyard_proto::executor::v1::{
    AckRequest, DeleteDeadLetterRequest, FetchRequest, GetJobRequest, HeartbeatRequest, Job,
    JobState, LeasedTask, ListJobsRequest, NackRequest, RetryDeadLetterRequest, SubmitJobRequest,
    TaskRef, TaskState, WatchJobRequest, WorkerError, WorkerState,
};
use switchyard_testkit::Stack;

use crate::common::*;

type Workers = WorkerServiceClient<Intercepted>;

async fn stack(b: &Backend) -> (Stack, Jobs, Workers) {
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.approval_poll_ms = 20;
        b.apply(c);
    })
    .await
    .unwrap();
    let jobs = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    let workers = WorkerServiceClient::new(s.channel_as("agents").await.unwrap());
    (s, jobs, workers)
}

/// Enqueues an OJS queue job on `queue`; returns its id.
async fn enqueue(c: &mut Jobs, queue: &str, extra: &str) -> String {
    enqueue_args(c, queue, r#"[1, "two"]"#, extra).await
}

/// Enqueues an OJS queue job with `args` (JSON) on `queue`; returns its id.
async fn enqueue_args(c: &mut Jobs, queue: &str, args: &str, extra: &str) -> String {
    let doc = format!(
        r#"{{"type": "test.work", "args": {args}, "options": {{"queue": "{queue}"{extra}}}}}"#
    );
    let out = c
        .submit_job(SubmitJobRequest {
            document: doc,
            format: "ojs-queue".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let job = out.job.unwrap();
    // Available, or already leased by a worker waiting on the queue.
    assert!(
        [JobState::Available as i32, JobState::Active as i32].contains(&job.state),
        "a job that cannot spend is approved at once: {job:?}"
    );
    job.spec.unwrap().job_id
}

/// Fetches from `queue` as `worker`, waiting up to `wait_ms` for a task.
async fn fetch(w: &mut Workers, queue: &str, worker: &str, wait_ms: u64) -> Vec<LeasedTask> {
    w.fetch(FetchRequest {
        queues: vec![queue.into()],
        count: 1,
        worker_id: worker.into(),
        wait: Some(switchyard_kit::time::duration(wait_ms)),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .tasks
}

fn ack(job_id: &str, attempt: u32, worker: &str) -> AckRequest {
    AckRequest {
        task: Some(TaskRef {
            job_id: job_id.into(),
            attempt,
            ..Default::default()
        }),
        worker_id: worker.into(),
        result: Some(switchyard_kit::json::json_to_value(
            &serde_json::json!({"done": true}),
        )),
        tokens_used: 0,
        artifacts: Vec::new(),
    }
}

/// Asserts `s` carries `want` as its reason.
fn assert_reason(s: &tonic::Status, want: Reason) {
    assert_eq!(
        ApiError::from(s.clone()).reason.as_deref(),
        Some(want.as_str()),
        "{s:?}"
    );
}

/// Acks as `worker`; the job as the ack left it.
async fn acked(w: &mut Workers, job_id: &str, attempt: u32, worker: &str) -> Job {
    w.ack(ack(job_id, attempt, worker))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
}

async fn a_task_is_leased_to_one_worker_and_only_its_holder_completes_it(b: Backend) {
    let (_s, mut jobs, mut workers) = stack(&b).await;
    let id = enqueue(&mut jobs, "work", "").await;
    let got = fetch(&mut workers, "work", "w1", 5_000).await;
    assert_eq!(got.len(), 1);
    let lease = got[0].task.clone().unwrap();
    assert_eq!((lease.job_id.as_str(), lease.attempt), (id.as_str(), 1));
    assert_eq!(
        switchyard_kit::json::value_to_json(got[0].payload.as_ref().unwrap()),
        serde_json::json!([1, "two"])
    );
    assert!(
        got[0].budget_id.is_empty(),
        "a job with no budget may not spend"
    );
    // Nobody else gets it.
    assert!(fetch(&mut workers, "work", "w2", 0).await.is_empty());
    // Another worker's ack is fenced out and changes nothing.
    let refused = workers.ack(ack(&id, 1, "w2")).await.unwrap_err();
    assert_reason(&refused, Reason::LeaseLost);
    // The holder's ack completes the job with its result, durably.
    let done = acked(&mut workers, &id, 1, "w1").await;
    assert_eq!(done.state, JobState::Completed as i32);
    let out = switchyard_kit::json::struct_to_json(done.tasks[0].output.as_ref().unwrap());
    assert_eq!(out, serde_json::json!({"done": true}));
    // A second ack finds the job finished.
    let again = workers.ack(ack(&id, 1, "w1")).await.unwrap_err();
    assert_reason(&again, Reason::JobTerminal);
}

async fn a_lapsed_lease_is_offered_again_and_its_old_holder_is_fenced_out(b: Backend) {
    let (_s, mut jobs, mut workers) = stack(&b).await;
    let id = enqueue(&mut jobs, "lapse", r#", "visibility_timeout_ms": 300"#).await;
    let first = fetch(&mut workers, "lapse", "slow", 5_000).await;
    assert_eq!(first[0].task.as_ref().unwrap().attempt, 1);
    // No heartbeat: the lease lapses and the task is offered again (the
    // long poll returns when it is).
    let second = fetch(&mut workers, "lapse", "fast", 10_000).await;
    assert_eq!(second.len(), 1, "offered again after the lapse");
    assert_eq!(
        second[0].task.as_ref().unwrap().attempt,
        2,
        "the lapse counted an attempt"
    );
    // The first holder's heartbeat and ack are refused.
    let hb = workers
        .heartbeat(HeartbeatRequest {
            worker_id: "slow".into(),
            active: vec![TaskRef {
                job_id: id.clone(),
                ..Default::default()
            }],
            visibility_timeout: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((hb.extended, hb.lost.len()), (0, 1));
    let refused = workers.ack(ack(&id, 1, "slow")).await.unwrap_err();
    assert_reason(&refused, Reason::LeaseLost);
    let done = acked(&mut workers, &id, 2, "fast").await;
    assert_eq!(done.state, JobState::Completed as i32);
    assert_eq!(done.tasks[0].attempts.len(), 2);
    assert!(done.tasks[0].attempts[0].reason == Reason::LeaseLost.as_str());
}

async fn only_principals_with_task_work_pull_tasks(b: Backend) {
    let (s, mut jobs, _workers) = stack(&b).await;
    enqueue(&mut jobs, "guarded", "").await;
    let mut alice = WorkerServiceClient::new(s.channel_as("alice").await.unwrap());
    let refused = alice
        .fetch(FetchRequest {
            queues: vec!["guarded".into()],
            worker_id: "alice-laptop".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
}

/// Fetches one task of `queue` as `worker` and nacks it as retryable; the
/// job as the nack left it and the delay before its retry.
async fn fetched_and_nacked(w: &mut Workers, queue: &str, worker: &str) -> (Job, u64) {
    let got = fetch(w, queue, worker, 5_000).await;
    let lease = got[0].task.clone().unwrap();
    let out = w
        .nack(NackRequest {
            task: Some(lease),
            worker_id: worker.into(),
            error: Some(WorkerError {
                code: "handler_error".into(),
                message: "it broke".into(),
                retryable: Some(true),
                ..Default::default()
            }),
            requeue: false,
        })
        .await
        .unwrap()
        .into_inner();
    (out.job.unwrap(), out.retry_delay_ms)
}

async fn a_nack_reports_a_retry_delay_never_shorter_than_the_backoff(b: Backend) {
    let (_s, mut jobs, mut workers) = stack(&b).await;
    // No jitter: every retry waits exactly the 2 s backoff, counted from
    // the nack. A delay measured after the retry was scheduled would come
    // out short by however long the nack took to record.
    let retry = r#", "retry": {"max_attempts": 3, "initial_interval": "PT2S", "jitter": false}"#;
    for n in 0..5 {
        let q = format!("backoff-{n}");
        enqueue(&mut jobs, &q, retry).await;
        let (job, delay) = fetched_and_nacked(&mut workers, &q, "w1").await;
        assert_eq!(job.tasks[0].state, TaskState::Retrying as i32);
        assert!((2_000..3_000).contains(&delay), "nack {n}: {delay} ms");
    }
}

async fn a_queue_job_answered_available_is_taken_by_the_very_next_fetch(b: Backend) {
    let (_s, mut jobs, mut workers) = stack(&b).await;
    // No long poll: the fetch right after the 201 must find the job, in
    // the order the queues are named.
    for n in 0..50 {
        let (low, high) = (format!("low-{n}"), format!("high-{n}"));
        enqueue(&mut jobs, &low, "").await;
        let id = enqueue(&mut jobs, &high, "").await;
        let got = workers
            .fetch(FetchRequest {
                queues: vec![high.clone(), low.clone()],
                count: 1,
                worker_id: "eager".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .tasks;
        assert_eq!(got.len(), 1, "round {n}: nothing to fetch");
        assert_eq!(
            got[0].task.as_ref().unwrap().job_id,
            id,
            "round {n}: the high queue first"
        );
    }
}

/// The ids of the dead-lettered jobs `c` sees.
async fn dead_letter_ids(c: &mut Jobs) -> Vec<String> {
    let page = c
        .list_jobs(ListJobsRequest {
            dead_letter: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    page.jobs
        .into_iter()
        .map(|j| j.spec.unwrap().job_id)
        .collect()
}

async fn a_dead_lettered_job_is_retried_as_a_new_round_or_deleted_by_an_operator_only(b: Backend) {
    let (s, mut jobs, mut workers) = stack(&b).await;
    let dlq = r#", "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}"#;
    let id = enqueue(&mut jobs, "dlq", dlq).await;
    let plain = enqueue(&mut jobs, "dlq-plain", r#", "retry": {"max_attempts": 1}"#).await;
    for q in ["dlq", "dlq-plain"] {
        let (job, _) = fetched_and_nacked(&mut workers, q, "w1").await;
        assert_eq!(job.state, JobState::Discarded as i32, "{q}");
    }
    // Only the job whose spec keeps it is in the dead letter.
    assert_eq!(dead_letter_ids(&mut jobs).await, vec![id.clone()]);

    // The submitter may not retry or delete it: operators do.
    let retry = |id: &str| RetryDeadLetterRequest { job_id: id.into() };
    let refused = jobs.retry_dead_letter(retry(&id)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let delete = |id: &str| DeleteDeadLetterRequest { job_id: id.into() };
    let refused = jobs.delete_dead_letter(delete(&id)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let mut ops = JobServiceClient::new(s.channel_as("admin").await.unwrap());
    let not_there = ops.retry_dead_letter(retry(&plain)).await.unwrap_err();
    assert_reason(&not_there, Reason::NotInDeadLetter);
    let not_there = ops.delete_dead_letter(delete(&plain)).await.unwrap_err();
    assert_reason(&not_there, Reason::NotInDeadLetter);

    // Retried: the same job, no attempts, its own run and budget, at work.
    let job = ops
        .retry_dead_letter(retry(&id))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(job.state, JobState::Available as i32);
    assert_eq!(job.round, 1);
    assert!(job.tasks[0].attempts.is_empty());
    assert_eq!(job.run_id, format!("run-{id}-r1"));
    assert_eq!(job.budget_id, format!("job-{id}-r1"));
    assert!(dead_letter_ids(&mut jobs).await.is_empty());
    let again = ops.retry_dead_letter(retry(&id)).await.unwrap_err();
    assert_reason(&again, Reason::NotInDeadLetter);
    let got = fetch(&mut workers, "dlq", "w2", 5_000).await;
    assert_eq!(got[0].task.as_ref().unwrap().attempt, 1);
    let done = acked(&mut workers, &id, 1, "w2").await;
    assert_eq!(done.state, JobState::Completed as i32);

    // Its log reads as one numbering from the first event, both rounds.
    let mut events = jobs
        .watch_job(WatchJobRequest {
            job_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    while let Some(ev) = events.message().await.unwrap() {
        let ev = ev.event.unwrap();
        seen.push((ev.sequence, ev.kind));
    }
    let numbers: Vec<u64> = seen.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, (1..=numbers.len() as u64).collect::<Vec<_>>());
    assert_eq!(seen.iter().filter(|(_, k)| k == "job.revived").count(), 1);

    // Deleted: gone from the dead letter and from GetJob.
    let third = enqueue(&mut jobs, "dlq", dlq).await;
    fetched_and_nacked(&mut workers, "dlq", "w1").await;
    ops.delete_dead_letter(delete(&third)).await.unwrap();
    assert!(dead_letter_ids(&mut jobs).await.is_empty());
    let gone = jobs
        .get_job(GetJobRequest { job_id: third })
        .await
        .unwrap_err();
    assert_reason(&gone, Reason::JobNotFound);
}

/// Upper-cases its payload's first word; fails on "fail"; on "slow" says it
/// started and waits to be released.
struct Upper {
    started: std::sync::Arc<tokio::sync::Notify>,
    release: std::sync::Arc<tokio::sync::Notify>,
}

#[tonic::async_trait]
impl Handler for Upper {
    async fn handle(&self, task: &LeasedTask) -> Result<Done, Failure> {
        let word = payload(task)[0].as_str().unwrap_or_default().to_owned();
        match word.as_str() {
            "fail" => Err(Failure::permanent("bad_input", "cannot shout that")),
            "slow" => {
                self.started.notify_one();
                self.release.notified().await;
                Ok(Done::new(serde_json::json!({"upper": "SLOW"})))
            }
            w => Ok(Done::new(serde_json::json!({"upper": w.to_uppercase()}))),
        }
    }
}

async fn the_sdk_worker_acks_results_nacks_failures_and_drains_its_work_on_shutdown(b: Backend) {
    let (s, mut jobs, _workers) = stack(&b).await;
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let handler = Upper {
        started: started.clone(),
        release: release.clone(),
    };
    let client =
        switchyard_api::WorkerClient::remote(s.channel_as("agents").await.unwrap(), 1 << 20);
    let opts = WorkerOptions {
        worker_id: "sdk-1".into(),
        queues: vec!["sdk".into()],
        concurrency: 2,
        visibility_timeout: std::time::Duration::from_secs(2),
        poll_wait: std::time::Duration::from_millis(200),
        drain: std::time::Duration::from_secs(30),
    };
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let worker = tokio::spawn(switchyard_agent_sdk::worker::run(
        handler, client, opts, shutdown,
    ));

    let hello = enqueue_args(&mut jobs, "sdk", r#"["hello"]"#, "").await;
    let bad = enqueue_args(&mut jobs, "sdk", r#"["fail"]"#, "").await;
    let done = crate::common::finish(&mut jobs, &hello).await;
    assert_eq!(done.state, JobState::Completed as i32, "{done:?}");
    let out = switchyard_kit::json::value_to_json(done.result.as_ref().unwrap());
    assert_eq!(out["job"]["upper"], "HELLO", "{out}");
    let failed = crate::common::finish(&mut jobs, &bad).await;
    assert_eq!(
        failed.state,
        JobState::Discarded as i32,
        "a permanent failure is not retried"
    );

    // Shutdown while a task is in hand: it finishes and is acked, then the
    // loop ends.
    let slow = enqueue_args(&mut jobs, "sdk", r#"["slow"]"#, "").await;
    started.notified().await;
    trigger.fire();
    release.notify_one();
    let summary = worker.await.unwrap().unwrap();
    assert_eq!(
        (summary.acked, summary.failed, summary.handed_back),
        (2, 1, 0),
        "{summary:?}"
    );
    let drained = crate::common::finish(&mut jobs, &slow).await;
    assert_eq!(drained.state, JobState::Completed as i32, "{drained:?}");
}

/// A new artifact of `kind`.
fn artifact(
    name: &str,
    kind: switchyard_proto::common::v1::ArtifactKind,
    content: &[u8],
) -> switchyard_proto::common::v1::NewArtifact {
    switchyard_proto::common::v1::NewArtifact {
        name: name.into(),
        kind: kind as i32,
        media_type: "text/plain".into(),
        content: content.to_vec(),
    }
}

async fn a_worker_hands_over_artifacts_with_its_ack_and_a_kind_the_job_does_not_allow_fails_it(
    b: Backend,
) {
    use switchyard_proto::common::v1::ArtifactKind;
    use switchyard_proto::executor::v1::GetArtifactRequest;
    let (_s, mut jobs, mut workers) = stack(&b).await;
    // A plain file proposes nothing: any job may keep one.
    let id = enqueue(&mut jobs, "art", "").await;
    fetch(&mut workers, "art", "w1", 5_000).await;
    let report = b"\x00binary report\xff".to_vec();
    let mut req = ack(&id, 1, "w1");
    req.artifacts = vec![artifact("report.bin", ArtifactKind::File, &report)];
    let done = workers.ack(req).await.unwrap().into_inner().job.unwrap();
    assert_eq!(done.state, JobState::Completed as i32);
    let listed = crate::common::artifacts(&mut jobs, &id).await;
    assert_eq!(listed.len(), 1);
    let got = jobs
        .get_artifact(GetArtifactRequest {
            job_id: id.clone(),
            artifact: listed[0].path.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.content, report, "byte for byte");
    // A changeset bundle needs propose_changeset_bundle, which a queue job
    // does not allow: the ack is refused and the task fails for good.
    let id = enqueue(&mut jobs, "art", "").await;
    fetch(&mut workers, "art", "w1", 5_000).await;
    let mut req = ack(&id, 1, "w1");
    req.artifacts = vec![
        artifact("notes.txt", ArtifactKind::File, b"fine"),
        artifact("bundle.json", ArtifactKind::ChangesetBundle, b"{}"),
    ];
    let refused = workers.ack(req).await.unwrap_err();
    assert_reason(&refused, Reason::ArtifactKindNotAllowed);
    assert!(
        refused.message().contains("propose_changeset_bundle"),
        "{refused:?}"
    );
    let j = finish(&mut jobs, &id).await;
    assert_eq!(j.state, JobState::Discarded as i32, "{j:?}");
    let listed = crate::common::artifacts(&mut jobs, &id).await;
    assert!(listed.is_empty(), "all or nothing: {listed:?}");
}

/// A heartbeat of `worker` holding `job`: the state it is told.
async fn told(w: &mut Workers, worker: &str, job: Option<&str>) -> i32 {
    let hb = w
        .heartbeat(HeartbeatRequest {
            worker_id: worker.into(),
            active: job
                .map(|j| TaskRef {
                    job_id: j.into(),
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            visibility_timeout: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.extended, u32::from(job.is_some()), "{hb:?}");
    hb.state
}

/// The OJS worker directives a job carries (`options.metadata.test_directive`,
/// on by default): told to the worker of the job's tenant while it holds
/// the job, and never to a cross-tenant service worker.
async fn a_job_signals_only_its_own_tenants_worker_and_only_while_it_is_held(b: Backend) {
    let (s, mut jobs, mut workers) = stack(&b).await;
    let meta = |d: &str| format!(r#", "metadata": {{"test_directive": "{d}"}}"#);
    let quiet = enqueue(&mut jobs, "signals", &meta("quiet")).await;
    fetch(&mut workers, "signals", "w1", 5_000).await;
    assert_eq!(
        told(&mut workers, "w1", Some(&quiet)).await,
        WorkerState::Quiet as i32
    );
    acked(&mut workers, &quiet, 1, "w1").await;
    assert_eq!(
        told(&mut workers, "w1", None).await,
        WorkerState::Running as i32,
        "the signal ends with the job"
    );

    // The cluster's service token works across tenants: no producer's job
    // signals it.
    let term = enqueue(&mut jobs, "signals", &meta("terminate")).await;
    let mut service = WorkerServiceClient::new(s.channel_as("operator").await.unwrap());
    fetch(&mut service, "signals", "svc", 5_000).await;
    assert_eq!(
        told(&mut service, "svc", Some(&term)).await,
        WorkerState::Running as i32
    );
    acked(&mut service, &term, 1, "svc").await;

    // Another tenant's worker cannot hold the job at all.
    let other = enqueue(&mut jobs, "signals", &meta("terminate")).await;
    let b_key = tenant_key(
        &s,
        "tenant-b",
        "b-worker",
        &["agent"],
        switchyard_proto::auth::v1::PrincipalKind::Agent,
    )
    .await;
    let mut mallory = WorkerServiceClient::new(s.channel_with(&b_key).await.unwrap());
    let none = fetch(&mut mallory, "signals", "b1", 100).await;
    assert!(none.is_empty(), "{none:?}");
    fetch(&mut workers, "signals", "w2", 5_000).await;
    assert_eq!(
        told(&mut workers, "w2", Some(&other)).await,
        WorkerState::Terminate as i32
    );
}

switchyard_testkit::on_both_backends!(
    sled, postgres;
    a_task_is_leased_to_one_worker_and_only_its_holder_completes_it,
    a_lapsed_lease_is_offered_again_and_its_old_holder_is_fenced_out,
    only_principals_with_task_work_pull_tasks,
    a_nack_reports_a_retry_delay_never_shorter_than_the_backoff,
    a_queue_job_answered_available_is_taken_by_the_very_next_fetch,
    a_dead_lettered_job_is_retried_as_a_new_round_or_deleted_by_an_operator_only,
    the_sdk_worker_acks_results_nacks_failures_and_drains_its_work_on_shutdown,
    a_worker_hands_over_artifacts_with_its_ack_and_a_kind_the_job_does_not_allow_fails_it,
    a_job_signals_only_its_own_tenants_worker_and_only_while_it_is_held,
);
