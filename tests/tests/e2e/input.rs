//! Input into running work: an input task asks, waits holding nothing, and
//! takes one answer — from whom the task names, matching its schema,
//! durable before SendInput returns, once across retries and restarts.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use serde_json::{Value, json};
use switchyard_kit::error::ApiError;
use switchyard_kit::json::{json_to_value, struct_to_json};
use switchyard_proto::auth::v1::PrincipalKind;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    CancelJobRequest, JobState, ListInputRequestsRequest, SendInputRequest, SendInputResponse,
    TaskState, WatchJobRequest,
};
use switchyard_testkit::Stack;
use tokio_stream::StreamExt;
use tonic::Code;

use crate::common::{Backend, Jobs, finish, id, job, submit, tenant_key, until_event};

/// A job that asks for a size (an object with an integer `size`), then
/// echoes it.
fn sizing_job(job_id: &str, answerers: Value, wait_secs: u32, default: Option<Value>) -> String {
    let mut input = json!({
        "prompt": "How many replicas for ${parent.input.service}?",
        "schema": {"type": "object", "required": ["size"],
                   "properties": {"size": {"type": "integer", "minimum": 1}}},
        "wait_secs": wait_secs,
    });
    if !answerers.is_null() {
        input["answerers"] = answerers;
    }
    if let Some(d) = default {
        input["default"] = d;
    }
    json!({
        "job_id": job_id,
        "input": {"service": "checkout"},
        "tasks": [
            {"id": "ask", "input": input},
            {"id": "use", "depends_on": ["ask"],
             "agent": {"capability": "builtin.echo",
                       "input": {"text": "size ${ask.output.answer.size} by ${ask.output.answered_by}"}}}
        ]
    })
    .to_string()
}

async fn send(
    c: &mut Jobs,
    job_id: &str,
    answer: Value,
    key: &str,
) -> Result<SendInputResponse, tonic::Status> {
    c.send_input(SendInputRequest {
        job_id: job_id.into(),
        task_id: String::new(),
        answer: Some(json_to_value(&answer)),
        idempotency_key: key.into(),
    })
    .await
    .map(tonic::Response::into_inner)
}

/// The refusal `r` is, checked to carry `code` and `reason`.
fn refused(r: Result<SendInputResponse, tonic::Status>, code: Code, reason: &str) -> tonic::Status {
    let e = r.expect_err("refused");
    let got = ApiError::from(e.clone()).reason.unwrap_or_default();
    assert_eq!((e.code(), got.as_str()), (code, reason), "{e:?}");
    e
}

async fn task_state(c: &mut Jobs, job_id: &str, task: &str) -> TaskState {
    let j = job(c, job_id).await;
    let t = j.tasks.iter().find(|t| t.task_id == task).unwrap();
    TaskState::try_from(t.state).unwrap()
}

/// Every service in one process, on backend `b`.
async fn stack(b: &Backend) -> Stack {
    Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| b.apply(c))
        .await
        .unwrap()
}

async fn as_(s: &Stack, who: &str) -> Jobs {
    JobServiceClient::new(s.channel_as(who).await.unwrap())
}

async fn an_input_task_waits_for_the_answer_and_hands_it_downstream_exactly_once(b: Backend) {
    let s = stack(&b).await;
    let mut alice = as_(&s, "alice").await;
    let j = submit(&mut alice, &sizing_job("size-1", Value::Null, 0, None))
        .await
        .unwrap();
    let asked = until_event(&mut alice, "size-1", "task.input_requested").await;
    assert_eq!(asked["prompt"], "How many replicas for checkout?");
    assert_eq!(asked["wait_secs"], 86_400);
    assert_eq!(
        task_state(&mut alice, "size-1", "ask").await,
        TaskState::InputRequired
    );
    // Listed for whoever may answer, with its schema.
    let listed = alice
        .list_input_requests(ListInputRequestsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .requests;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].job_id.as_str(), listed[0].task_id.as_str()),
        ("size-1", "ask")
    );
    assert_eq!(listed[0].prompt, "How many replicas for checkout?");
    let schema = struct_to_json(listed[0].answer_schema.as_ref().unwrap());
    assert_eq!(schema["required"], json!(["size"]));

    // An answer the schema refuses is refused, and the task still waits.
    let bad = refused(
        send(&mut alice, "size-1", json!({"size": 0}), "k-bad").await,
        Code::InvalidArgument,
        "INVALID_ARGUMENT",
    );
    assert!(bad.message().contains("answer_schema"), "{}", bad.message());
    assert_eq!(
        task_state(&mut alice, "size-1", "ask").await,
        TaskState::InputRequired
    );

    let ok = send(&mut alice, "size-1", json!({"size": 3}), "k-1")
        .await
        .unwrap();
    assert_eq!(
        (ok.task_id.as_str(), ok.answered_by.as_str(), ok.replayed),
        ("ask", "alice", false)
    );
    let r = finish(&mut alice, &id(&j)).await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let out = struct_to_json(
        r.tasks
            .iter()
            .find(|t| t.task_id == "use")
            .unwrap()
            .output
            .as_ref()
            .unwrap(),
    );
    assert_eq!(out["text"], "size 3 by alice");

    // The same key again: the first outcome, nothing taken twice.
    let again = send(&mut alice, "size-1", json!({"size": 9}), "k-1")
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.answered_by, "alice");
    // Another answer: the task no longer waits.
    let late = refused(
        send(&mut alice, "size-1", json!({"size": 9}), "k-2").await,
        Code::FailedPrecondition,
        "INPUT_NOT_WAITING",
    );
    assert!(
        late.message().contains("alice answered it"),
        "{}",
        late.message()
    );
    let ask = job(&mut alice, "size-1").await;
    let ask = ask.tasks.iter().find(|t| t.task_id == "ask").unwrap();
    assert_eq!(
        struct_to_json(ask.output.as_ref().unwrap())["answer"],
        json!({"size": 3})
    );
    assert_eq!(ask.attempts.len(), 1);
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_whom_the_task_names_may_answer_and_others_learn_nothing_of_the_job() {
    let s = Stack::start().await.unwrap();
    let carol = s
        .key("carol", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let dave = s
        .key("dave", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let other_tenant = tenant_key(
        &s,
        "t-other",
        "carol",
        &["submitter", "approver"],
        PrincipalKind::Human,
    )
    .await;
    let mut alice = as_(&s, "alice").await;
    // carol by name, approvers by role; not the submitter.
    let named = json!({"subjects": ["carol"], "roles": ["approver"]});
    submit(&mut alice, &sizing_job("size-2", named, 0, None))
        .await
        .unwrap();
    until_event(&mut alice, "size-2", "task.input_requested").await;

    // The submitter sees the job but is not named.
    let e = refused(
        send(&mut alice, "size-2", json!({"size": 1}), "a").await,
        Code::PermissionDenied,
        "INPUT_NOT_ALLOWED",
    );
    assert!(e.message().contains("\"carol\""), "{}", e.message());
    // Another submitter of the tenant, not named: the job does not exist
    // for it, and it is not listed.
    let mut dave = JobServiceClient::new(s.channel_with(&dave).await.unwrap());
    refused(
        send(&mut dave, "size-2", json!({"size": 1}), "d").await,
        Code::NotFound,
        "JOB_NOT_FOUND",
    );
    let listed = dave
        .list_input_requests(ListInputRequestsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .requests;
    assert!(listed.is_empty(), "{listed:?}");
    // The same name in another tenant is another principal.
    let mut outsider = JobServiceClient::new(s.channel_with(&other_tenant).await.unwrap());
    refused(
        send(&mut outsider, "size-2", json!({"size": 1}), "o").await,
        Code::NotFound,
        "JOB_NOT_FOUND",
    );
    // An agent key may not answer at all.
    let mut agent = as_(&s, "agents").await;
    // An agent key may not answer at all: the permission table refuses it.
    refused(
        send(&mut agent, "size-2", json!({"size": 1}), "g").await,
        Code::PermissionDenied,
        "PERMISSION_DENIED",
    );
    assert_eq!(
        task_state(&mut alice, "size-2", "ask").await,
        TaskState::InputRequired,
        "nothing refused changed the task"
    );

    // carol, named, sees the request though she cannot read the job.
    let mut carol = JobServiceClient::new(s.channel_with(&carol).await.unwrap());
    let listed = carol
        .list_input_requests(ListInputRequestsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .requests;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].submitted_by, "alice");
    let ok = send(&mut carol, "size-2", json!({"size": 2}), "c")
        .await
        .unwrap();
    assert_eq!(ok.answered_by, "carol");
    let r = finish(&mut alice, "size-2").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");

    // By role: bob (approver) answers a task that names approvers.
    submit(
        &mut alice,
        &sizing_job("size-3", json!({"roles": ["approver"]}), 0, None),
    )
    .await
    .unwrap();
    until_event(&mut alice, "size-3", "task.input_requested").await;
    let mut bob = as_(&s, "bob").await;
    let ok = send(&mut bob, "size-3", json!({"size": 5}), "b")
        .await
        .unwrap();
    assert_eq!(ok.answered_by, "bob");
    let r = finish(&mut alice, "size-3").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_to_a_task_that_does_not_wait_is_refused_with_its_state() {
    let s = Stack::start().await.unwrap();
    let mut alice = as_(&s, "alice").await;
    let doc = json!({"job_id": "plain-1", "tasks": [
        {"id": "t", "agent": {"capability": "builtin.echo", "input": {"text": "hi"}}}
    ]})
    .to_string();
    submit(&mut alice, &doc).await.unwrap();
    finish(&mut alice, "plain-1").await;
    let ask = |job_id: &str, task_id: &str, answer: Option<Value>, key: &str| {
        let req = SendInputRequest {
            job_id: job_id.into(),
            task_id: task_id.into(),
            answer: answer.as_ref().map(json_to_value),
            idempotency_key: key.into(),
        };
        let mut c = alice.clone();
        async move { c.send_input(req).await.map(tonic::Response::into_inner) }
    };
    let e = refused(
        ask("plain-1", "t", Some(json!("yes")), "k").await,
        Code::FailedPrecondition,
        "INPUT_NOT_WAITING",
    );
    assert!(e.message().contains("not an input task"), "{}", e.message());
    // Without an answer, or with a key no one could retry with: refused
    // before the job is looked at.
    let e = refused(
        ask("plain-1", "t", None, "k").await,
        Code::InvalidArgument,
        "INVALID_ARGUMENT",
    );
    assert!(
        e.message().contains("answer is required"),
        "{}",
        e.message()
    );
    refused(
        ask("plain-1", "t", Some(json!(1)), "has space").await,
        Code::InvalidArgument,
        "INVALID_ARGUMENT",
    );
    refused(
        ask("nope", "", Some(json!(1)), "k").await,
        Code::NotFound,
        "JOB_NOT_FOUND",
    );
    s.stop().await.unwrap();
}

async fn an_unanswered_task_takes_its_default_or_fails_with_input_timeout(b: Backend) {
    let s = stack(&b).await;
    let mut alice = as_(&s, "alice").await;
    submit(
        &mut alice,
        &sizing_job("late-1", Value::Null, 1, Some(json!({"size": 2}))),
    )
    .await
    .unwrap();
    submit(&mut alice, &sizing_job("late-2", Value::Null, 1, None))
        .await
        .unwrap();
    let r = finish(&mut alice, "late-1").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let ended = until_event(&mut alice, "late-1", "task.input_received").await;
    assert_eq!(ended["outcome"], "default");
    let r = finish(&mut alice, "late-2").await;
    assert_eq!(r.state, JobState::Discarded as i32, "{r:?}");
    let ask = r.tasks.iter().find(|t| t.task_id == "ask").unwrap();
    assert_eq!(ask.reason, "INPUT_TIMEOUT", "{ask:?}");
    let ended = until_event(&mut alice, "late-2", "task.input_received").await;
    assert_eq!(ended["outcome"], "timed_out");
    s.stop().await.unwrap();
}

async fn a_cancelled_job_stops_waiting_and_takes_no_answer(b: Backend) {
    let s = stack(&b).await;
    let mut alice = as_(&s, "alice").await;
    submit(&mut alice, &sizing_job("gone-1", Value::Null, 0, None))
        .await
        .unwrap();
    until_event(&mut alice, "gone-1", "task.input_requested").await;
    alice
        .cancel_job(CancelJobRequest {
            job_id: "gone-1".into(),
            reason: "not needed".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        task_state(&mut alice, "gone-1", "ask").await,
        TaskState::Cancelled
    );
    refused(
        send(&mut alice, "gone-1", json!({"size": 1}), "k").await,
        Code::FailedPrecondition,
        "INPUT_NOT_WAITING",
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_while_a_task_waits_keeps_its_question_and_deadline() {
    let s = Stack::start().await.unwrap();
    let mut alice = as_(&s, "alice").await;
    submit(
        &mut alice,
        &sizing_job("restart-1", Value::Null, 3600, None),
    )
    .await
    .unwrap();
    let asked = until_event(&mut alice, "restart-1", "task.input_requested").await;
    let dir = s.stop().await.unwrap();
    let path = dir.path().to_path_buf();
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.storage.data_dir = path;
    })
    .await
    .unwrap();
    let mut alice = as_(&s, "alice").await;
    assert_eq!(
        task_state(&mut alice, "restart-1", "ask").await,
        TaskState::InputRequired
    );
    // Asked once: the restarted attempt waits on the same question.
    let listed = alice
        .list_input_requests(ListInputRequestsRequest {
            job_id: "restart-1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .requests;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        switchyard_kit::time::timestamp_ms(listed[0].deadline.as_ref().unwrap()),
        asked["deadline_ms"].as_u64().unwrap(),
        "the deadline survives the restart"
    );
    // The resumed attempt may take a moment to sit down again: UNAVAILABLE
    // until then, and the same key is safe to send again.
    let ok = loop {
        match send(&mut alice, "restart-1", json!({"size": 4}), "k-r").await {
            Ok(ok) => break ok,
            Err(e) if e.code() == Code::Unavailable => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert!(!ok.replayed);
    let r = finish(&mut alice, "restart-1").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let ask = r.tasks.iter().find(|t| t.task_id == "ask").unwrap();
    assert_eq!(ask.attempts.len(), 1, "the same attempt went on");
    let mut requested = 0;
    let mut w = alice
        .watch_job(WatchJobRequest {
            job_id: "restart-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while let Some(Ok(m)) = w.next().await {
        requested += usize::from(m.event.unwrap().kind == "task.input_requested");
    }
    assert_eq!(requested, 1, "asked once across the restart");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_task_that_cannot_work_is_refused_at_submission_with_every_problem() {
    let s = Stack::start().await.unwrap();
    let mut alice = as_(&s, "alice").await;
    let doc = json!({"job_id": "bad-input", "tasks": [
        {"id": "a", "input": {"prompt": "", "wait_secs": 9_999_999,
                              "answerers": {"roles": ["agent"], "subjects": [""]}}},
        {"id": "b", "input": {"prompt": "pick", "schema": {"type": "integer"}, "default": "three"}},
        {"id": "c", "input": {"prompt": "pick", "schema": {"type": 12}}}
    ]})
    .to_string();
    let e = submit(&mut alice, &doc).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let fields: Vec<String> = ApiError::from(e.clone())
        .violations
        .iter()
        .map(|v| v.field.clone())
        .collect();
    for want in [
        "tasks[0].input.prompt",
        "tasks[0].input.wait_secs",
        "tasks[0].input.answerers.roles[0]",
        "tasks[0].input.answerers.subjects[0]",
        "tasks[1].input.default_answer",
        "tasks[2].input.answer_schema",
    ] {
        assert!(
            fields.iter().any(|f| f == want),
            "{want} missing in {fields:?}"
        );
    }
    s.stop().await.unwrap();
}

async fn a_retried_answer_finds_the_task_its_key_answered_while_the_next_one_waits(b: Backend) {
    let s = stack(&b).await;
    let mut alice = as_(&s, "alice").await;
    let doc = json!({"job_id": "two-asks", "tasks": [
        {"id": "first", "input": {"prompt": "one?"}},
        {"id": "second", "depends_on": ["first"], "input": {"prompt": "two?"}}
    ]})
    .to_string();
    submit(&mut alice, &doc).await.unwrap();
    until_event(&mut alice, "two-asks", "task.input_requested").await;
    let first = send(&mut alice, "two-asks", json!("a"), "k-first")
        .await
        .unwrap();
    assert_eq!((first.task_id.as_str(), first.replayed), ("first", false));
    // The job runs on, now waiting in `second`: the first call's retry
    // (no task named) is told its own outcome, not given to `second`.
    let again = send(&mut alice, "two-asks", json!("b"), "k-first")
        .await
        .unwrap();
    assert_eq!((again.task_id.as_str(), again.replayed), ("first", true));
    let second = send(&mut alice, "two-asks", json!("c"), "k-second")
        .await
        .unwrap();
    assert_eq!(
        (second.task_id.as_str(), second.replayed),
        ("second", false)
    );
    let r = finish(&mut alice, "two-asks").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let answer = |t: &str| {
        struct_to_json(
            r.tasks
                .iter()
                .find(|x| x.task_id == t)
                .unwrap()
                .output
                .as_ref()
                .unwrap(),
        )["answer"]
            .clone()
    };
    assert_eq!(
        (answer("first"), answer("second")),
        (json!("a"), json!("c"))
    );
    s.stop().await.unwrap();
}

use crate::common::{postgres, sled};

switchyard_testkit::on_both_backends!(
    sled, postgres;
    an_input_task_waits_for_the_answer_and_hands_it_downstream_exactly_once,
    a_retried_answer_finds_the_task_its_key_answered_while_the_next_one_waits,
    a_cancelled_job_stops_waiting_and_takes_no_answer,
    an_unanswered_task_takes_its_default_or_fails_with_input_timeout,
);
