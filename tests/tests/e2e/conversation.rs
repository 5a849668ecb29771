//! Conversations: a job whose orchestrator answers each message, with the
//! conversation so far, once each; messages are durable before SendMessage
//! returns, taken once by key, refused once it ended or from whom it does
//! not name; a used-up budget pauses it instead of failing it.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_kit::error::ApiError;
use switchyard_kit::json::struct_to_json;
use switchyard_llm::scripted::Reply;
use switchyard_proto::auth::v1::PrincipalKind;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    JobState, ListMessagesRequest, ListMessagesResponse, ReplyOutcome, SendMessageRequest,
    SendMessageResponse, TaskState, WatchJobRequest,
};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::common::{Backend, Jobs, finish, job, submit, tenant_key, until_event};
use crate::llm::{Env, env};

/// A conversation job with the scripted model `m-chat`.
fn chat_job(job_id: &str, extra: Value, budget: Option<u64>) -> String {
    let mut conversation = json!({
        "orchestrator": {"model": "m-chat", "instructions": "You are terse.", "max_tokens": 40},
    });
    if let (Some(o), Some(e)) = (conversation.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    let mut doc = json!({
        "job_id": job_id,
        "tasks": [{"id": "chat", "conversation": conversation}],
    });
    if let Some(tokens) = budget {
        doc["budget"] = json!({"token_budget": tokens});
    }
    doc.to_string()
}

async fn say(
    c: &mut Jobs,
    job_id: &str,
    text: &str,
    key: &str,
) -> Result<SendMessageResponse, tonic::Status> {
    c.send_message(SendMessageRequest {
        job_id: job_id.into(),
        text: text.into(),
        idempotency_key: key.into(),
        ..Default::default()
    })
    .await
    .map(tonic::Response::into_inner)
}

async fn close(c: &mut Jobs, job_id: &str) -> Result<SendMessageResponse, tonic::Status> {
    c.send_message(SendMessageRequest {
        job_id: job_id.into(),
        close: true,
        ..Default::default()
    })
    .await
    .map(tonic::Response::into_inner)
}

pub(crate) async fn history(c: &mut Jobs, job_id: &str) -> ListMessagesResponse {
    c.list_messages(ListMessagesRequest {
        job_id: job_id.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// The refusal `r` is, checked to carry `code` and `reason`.
fn refused<T: std::fmt::Debug>(
    r: Result<T, tonic::Status>,
    code: Code,
    reason: &str,
) -> tonic::Status {
    let e = r.expect_err("refused");
    let got = ApiError::from(e.clone()).reason.unwrap_or_default();
    assert_eq!((e.code(), got.as_str()), (code, reason), "{e:?}");
    e
}

/// Follows the job's log from `after` until the reply to message `seq`.
pub(crate) async fn reply_to(c: &mut Jobs, job_id: &str, seq: u32, after: u64) -> Value {
    let mut s = c
        .watch_job(WatchJobRequest {
            job_id: job_id.into(),
            after_sequence: after,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let wait = async {
        while let Some(Ok(m)) = s.next().await {
            let e = m.event.unwrap();
            let data = e.data.as_ref().map(struct_to_json).unwrap_or(Value::Null);
            if e.kind == "conversation.replied" && data["seq"] == seq {
                return data;
            }
        }
        panic!("the stream of {job_id} ended without the reply to {seq}");
    };
    tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .unwrap_or_else(|_| panic!("no reply to {seq} in {job_id} within 20 s"))
}

async fn task_state(c: &mut Jobs, job_id: &str) -> TaskState {
    let j = job(c, job_id).await;
    TaskState::try_from(j.tasks[0].state).unwrap()
}

async fn chat_env(b: &Backend) -> Env {
    let b = b.clone();
    env(true, move |c| b.apply(c)).await
}

async fn as_(e: &Env, who: &str) -> Jobs {
    JobServiceClient::new(e.stack.channel_as(who).await.unwrap())
}

async fn a_conversation_answers_each_message_with_what_was_said_before_and_ends_when_closed(
    b: Backend,
) {
    let e = chat_env(&b).await;
    e.script.for_model(
        "m-chat",
        vec![
            Reply::text("Hello, Alice.", 20, 4),
            Reply::text("You said hi.", 30, 5),
        ],
    );
    let mut alice = as_(&e, "alice").await;
    submit(&mut alice, &chat_job("talk-1", json!({}), None))
        .await
        .unwrap();
    until_event(&mut alice, "talk-1", "job.state").await;
    let first = say(&mut alice, "talk-1", "hi", "m1").await.unwrap();
    assert_eq!((first.task_id.as_str(), first.seq), ("chat", 1));
    let r1 = reply_to(&mut alice, "talk-1", 1, 0).await;
    assert_eq!(
        (r1["outcome"].as_str(), r1["text"].as_str()),
        (Some("answered"), Some("Hello, Alice."))
    );
    assert_eq!(r1["total_tokens"], 24);
    // Waiting for the next message, holding nothing.
    let waiting = history(&mut alice, "talk-1").await;
    assert!(waiting.open && waiting.waiting, "{waiting:?}");
    assert_eq!(
        task_state(&mut alice, "talk-1").await,
        TaskState::InputRequired
    );

    let second = say(&mut alice, "talk-1", "what did I say? ${input.x}", "m2")
        .await
        .unwrap();
    assert_eq!(second.seq, 2);
    let r2 = reply_to(&mut alice, "talk-1", 2, first.event_sequence).await;
    assert_eq!(r2["text"], "You said hi.");
    // The model saw the instructions, the first exchange and the new
    // message, taken as written (no template resolved in it).
    let sent = e.script.received();
    assert_eq!(sent.len(), 2);
    let said: Vec<(String, String)> = sent[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("system", "You are terse."),
        ("user", "hi"),
        ("assistant", "Hello, Alice."),
        ("user", "what did I say? ${input.x}"),
    ]
    .iter()
    .map(|(r, c)| ((*r).to_owned(), (*c).to_owned()))
    .collect();
    assert_eq!(said, want);

    let h = history(&mut alice, "talk-1").await;
    assert_eq!(h.turns.len(), 2);
    assert_eq!(h.turns[0].by, "alice");
    let reply = h.turns[1].reply.as_ref().unwrap();
    assert_eq!(reply.outcome, ReplyOutcome::Answered as i32);
    assert_eq!(reply.model, "m-chat");
    assert_eq!(reply.usage.as_ref().unwrap().total_tokens, 35);

    let closed = close(&mut alice, "talk-1").await.unwrap();
    assert_eq!(closed.seq, 3);
    let r = finish(&mut alice, "talk-1").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let out = struct_to_json(r.tasks[0].output.as_ref().unwrap());
    assert_eq!(
        (
            &out["messages"],
            &out["ended"],
            &out["closed_by"],
            &out["last_reply"]
        ),
        (
            &json!(3),
            &json!("closed"),
            &json!("alice"),
            &json!("You said hi.")
        )
    );
    assert_eq!(r.tasks[0].llm_usage.as_ref().unwrap().total_tokens, 59);
    // Ended: no more messages, and the history is still there to read.
    refused(
        say(&mut alice, "talk-1", "hello?", "m4").await,
        Code::FailedPrecondition,
        "CONVERSATION_CLOSED",
    );
    assert_eq!(history(&mut alice, "talk-1").await.turns.len(), 3);
    assert_eq!(e.script.count(), 2, "nothing was answered twice");
    e.stack.stop().await.unwrap();
}

async fn a_message_is_taken_once_by_key_and_messages_sent_during_a_turn_wait_their_turn(
    b: Backend,
) {
    let e = chat_env(&b).await;
    e.script.for_model(
        "m-chat",
        vec![
            Reply::text("one", 10, 2).delay(Duration::from_millis(400)),
            Reply::text("two", 12, 2),
        ],
    );
    let mut alice = as_(&e, "alice").await;
    submit(&mut alice, &chat_job("talk-2", json!({}), None))
        .await
        .unwrap();
    let a = say(&mut alice, "talk-2", "first", "k-1").await.unwrap();
    // Sent while the first is being answered: it waits its turn.
    let b2 = say(&mut alice, "talk-2", "second", "k-2").await.unwrap();
    // A retry of the first: the first message, not a third.
    let again = say(&mut alice, "talk-2", "first", "k-1").await.unwrap();
    assert_eq!((a.seq, b2.seq, again.seq), (1, 2, 1));
    assert!(again.replayed && !a.replayed);
    assert_eq!(
        again.event_sequence, a.event_sequence,
        "the first message's record"
    );
    let r2 = reply_to(&mut alice, "talk-2", 2, 0).await;
    assert_eq!(r2["text"], "two");
    let h = history(&mut alice, "talk-2").await;
    let texts: Vec<(&str, &str)> = h
        .turns
        .iter()
        .map(|t| (t.text.as_str(), t.reply.as_ref().unwrap().text.as_str()))
        .collect();
    assert_eq!(texts, vec![("first", "one"), ("second", "two")]);
    assert_eq!(e.script.count(), 2);
    // Bad messages are refused and change nothing.
    refused(
        say(&mut alice, "talk-2", "", "k-3").await,
        Code::InvalidArgument,
        "INVALID_ARGUMENT",
    );
    refused(
        say(&mut alice, "talk-2", &"x".repeat(16_001), "k-3").await,
        Code::InvalidArgument,
        "INVALID_ARGUMENT",
    );
    refused(
        say(&mut alice, "talk-2", "hi", "bad key!").await,
        Code::InvalidArgument,
        "INVALID_ARGUMENT",
    );
    assert_eq!(history(&mut alice, "talk-2").await.turns.len(), 2);
    e.stack.stop().await.unwrap();
}

async fn a_used_up_budget_pauses_the_conversation_and_an_approved_extension_answers_what_waited(
    b: Backend,
) {
    let e = chat_env(&b).await;
    // What one turn reserves, measured on a twin job with room to spare.
    e.script.for_model(
        "m-chat",
        vec![
            Reply::text("ok", 10, 2),
            Reply::text("ok", 10, 2),
            Reply::text("again", 10, 2),
            Reply::text("third", 10, 2),
        ],
    );
    let mut alice = as_(&e, "alice").await;
    submit(&mut alice, &chat_job("probe", json!({}), Some(1_000_000)))
        .await
        .unwrap();
    say(&mut alice, "probe", "hi", "p").await.unwrap();
    let held = until_event(&mut alice, "probe", "budget.reserved").await;
    let one_turn = held["tokens"].as_u64().unwrap();
    reply_to(&mut alice, "probe", 1, 0).await;
    // Room for the first turn (it uses 12 tokens) but not the second,
    // whose prompt holds the first exchange.
    submit(
        &mut alice,
        &chat_job("talk-3", json!({}), Some(one_turn + 5)),
    )
    .await
    .unwrap();
    say(&mut alice, "talk-3", "hi", "a").await.unwrap();
    let r1 = reply_to(&mut alice, "talk-3", 1, 0).await;
    assert_eq!(r1["outcome"], "answered");
    let before = e.script.count();
    let m2 = say(&mut alice, "talk-3", "hi again", "b").await.unwrap();
    // The budget refuses the second turn: the job pauses and asks a person
    // for more, the message unanswered (not failed, not answered "no").
    let paused = until_event(&mut alice, "talk-3", "budget.paused").await;
    assert_eq!(paused["dimension"], "tokens", "{paused}");
    let run_id = paused["run_id"].as_str().unwrap().to_owned();
    let j = job(&mut alice, "talk-3").await;
    assert_eq!(j.state, JobState::BudgetPaused as i32, "{j:?}");
    assert_eq!(j.reason, "AGENT_TOKEN_BUDGET_EXCEEDED", "{}", j.error);
    assert_eq!(
        task_state(&mut alice, "talk-3").await,
        TaskState::BudgetPaused
    );
    assert_eq!(e.script.count(), before, "a refused turn calls no model");
    // A message sent meanwhile is taken and waits its turn.
    say(&mut alice, "talk-3", "and now?", "c").await.unwrap();
    let h = history(&mut alice, "talk-3").await;
    assert!(h.open && !h.waiting, "{h:?}");
    assert_eq!(h.turns.len(), 3);
    assert!(
        h.turns[1].reply.is_none() && h.turns[2].reply.is_none(),
        "{h:?}"
    );
    crate::common::proposed_run(&e.stack, &run_id).await;
    // alice may not approve her own conversation's extension; bob grants
    // more than the one turn it asked for, so the next message fits too.
    let mine = crate::common::approve_as(&e.stack, "alice", &run_id)
        .await
        .unwrap_err();
    assert_eq!(mine.code(), Code::PermissionDenied, "{mine:?}");
    crate::common::approvals_as(&e.stack, "bob")
        .await
        .approve(switchyard_proto::approval::v1::ApproveRequest {
            run_id: run_id.clone(),
            comment: "keep talking".into(),
            scope: Some(switchyard_proto::approval::v1::ApprovalScope {
                tokens: 10_000,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("bob approves the extension");
    // Where it paused: message 2 is answered, then message 3; message 1 is
    // not answered again.
    let r2 = reply_to(&mut alice, "talk-3", 2, m2.event_sequence).await;
    assert_eq!(
        (&r2["outcome"], &r2["text"]),
        (&json!("answered"), &json!("again"))
    );
    let r3 = reply_to(&mut alice, "talk-3", 3, m2.event_sequence).await;
    assert_eq!(
        (&r3["outcome"], &r3["text"]),
        (&json!("answered"), &json!("third"))
    );
    let h = history(&mut alice, "talk-3").await;
    assert_eq!(
        h.turns
            .iter()
            .map(|t| t.reply.as_ref().map(|r| r.text.as_str()))
            .collect::<Vec<_>>(),
        vec![Some("ok"), Some("again"), Some("third")]
    );
    assert!(h.open && h.waiting, "{h:?}");
    let j = job(&mut alice, "talk-3").await;
    let p = j.budget_pause.clone().unwrap();
    assert_eq!(
        (p.decision.as_str(), p.granted_tokens),
        ("approved", 10_000)
    );
    close(&mut alice, "talk-3").await.unwrap();
    let r = finish(&mut alice, "talk-3").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    assert_eq!(
        e.script.count(),
        before + 2,
        "each message had one model call"
    );
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_participants_may_talk_and_others_learn_nothing_of_the_job() {
    let e = env(true, |_| {}).await;
    e.script
        .for_model("m-chat", vec![Reply::text("hi carol", 5, 2)]);
    let s = &e.stack;
    let carol = s
        .key("carol", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let dave = s
        .key("dave", &["submitter"], PrincipalKind::Human)
        .await
        .unwrap();
    let other_tenant =
        tenant_key(s, "t-other", "carol", &["submitter"], PrincipalKind::Human).await;
    let mut alice = as_(&e, "alice").await;
    let named = json!({"participants": {"subjects": ["carol"]}});
    submit(&mut alice, &chat_job("talk-4", named, None))
        .await
        .unwrap();
    // The submitter sees the job but is not named.
    let no = refused(
        say(&mut alice, "talk-4", "hi", "a").await,
        Code::PermissionDenied,
        "CONVERSATION_NOT_ALLOWED",
    );
    assert!(no.message().contains("\"carol\""), "{}", no.message());
    // Another submitter of the tenant: no such job, not even its history.
    let mut dave = JobServiceClient::new(s.channel_with(&dave).await.unwrap());
    refused(
        say(&mut dave, "talk-4", "hi", "d").await,
        Code::NotFound,
        "JOB_NOT_FOUND",
    );
    refused(
        dave.list_messages(ListMessagesRequest {
            job_id: "talk-4".into(),
            ..Default::default()
        })
        .await,
        Code::NotFound,
        "JOB_NOT_FOUND",
    );
    // The same name in another tenant is another principal.
    let mut outsider = JobServiceClient::new(s.channel_with(&other_tenant).await.unwrap());
    refused(
        say(&mut outsider, "talk-4", "hi", "o").await,
        Code::NotFound,
        "JOB_NOT_FOUND",
    );
    // An agent key may not talk at all.
    let mut agent = as_(&e, "agents").await;
    refused(
        say(&mut agent, "talk-4", "hi", "g").await,
        Code::PermissionDenied,
        "PERMISSION_DENIED",
    );
    assert!(history(&mut alice, "talk-4").await.turns.is_empty());
    // carol, named, talks and reads the history without reading the job.
    let mut carol = JobServiceClient::new(s.channel_with(&carol).await.unwrap());
    let sent = say(&mut carol, "talk-4", "hello", "c").await.unwrap();
    assert_eq!(sent.seq, 1);
    let r = reply_to(&mut alice, "talk-4", 1, 0).await;
    assert_eq!(r["text"], "hi carol");
    let h = carol
        .list_messages(ListMessagesRequest {
            job_id: "talk-4".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.turns[0].by, "carol");
    // A task that is not a conversation is named as such.
    refused(
        carol
            .send_message(SendMessageRequest {
                job_id: "talk-4".into(),
                task_id: "nope".into(),
                text: "hi".into(),
                ..Default::default()
            })
            .await,
        Code::FailedPrecondition,
        "CONVERSATION_CLOSED",
    );
    close(&mut carol, "talk-4").await.unwrap();
    let r = finish(&mut alice, "talk-4").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_conversation_ends_after_its_idle_time_and_a_full_one_after_its_last_message() {
    let e = env(true, |_| {}).await;
    e.script
        .for_model("m-chat", vec![Reply::text("only", 5, 2)]);
    let mut alice = as_(&e, "alice").await;
    submit(
        &mut alice,
        &chat_job("talk-5", json!({"idle_secs": 1}), None),
    )
    .await
    .unwrap();
    let r = finish(&mut alice, "talk-5").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let out = struct_to_json(r.tasks[0].output.as_ref().unwrap());
    assert_eq!(
        (&out["ended"], &out["messages"]),
        (&json!("idle"), &json!(0))
    );

    submit(
        &mut alice,
        &chat_job("talk-6", json!({"max_messages": 1}), None),
    )
    .await
    .unwrap();
    say(&mut alice, "talk-6", "the one", "x").await.unwrap();
    refused(
        say(&mut alice, "talk-6", "one more", "y").await,
        Code::FailedPrecondition,
        "CONVERSATION_CLOSED",
    );
    let r = finish(&mut alice, "talk-6").await;
    assert_eq!(r.state, JobState::Completed as i32, "{r:?}");
    let out = struct_to_json(r.tasks[0].output.as_ref().unwrap());
    assert_eq!(
        (&out["ended"], &out["last_reply"]),
        (&json!("max_messages"), &json!("only"))
    );
    e.stack.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_that_cannot_work_is_refused_with_every_problem() {
    let e = env(true, |_| {}).await;
    let mut alice = as_(&e, "alice").await;
    let doc = json!({"job_id": "bad", "tasks": [{"id": "chat", "conversation": {
        "orchestrator": {"model": "m-chat", "prompt": "hi", "output_format": "json"},
        "idle_secs": 9_999_999,
        "max_messages": 5000,
        "participants": {"roles": ["agent"]},
        "handoff": {"max_cost_micro_usd": -1},
    }}]})
    .to_string();
    let err = ApiError::from(submit(&mut alice, &doc).await.unwrap_err());
    let fields: Vec<&str> = err.violations.iter().map(|v| v.field.as_str()).collect();
    for field in [
        "conversation.orchestrator.prompt",
        "conversation.orchestrator.output_format",
        "conversation.idle_secs",
        "conversation.max_messages",
        "conversation.participants.roles[0]",
        "conversation.handoff.max_cost_micro_usd",
    ] {
        assert!(
            fields.iter().any(|f| f.ends_with(field)),
            "{field} missing from {fields:?}"
        );
    }
    let bare = json!({"job_id": "bare", "tasks": [{"id": "chat", "conversation": {}}]});
    let err = ApiError::from(submit(&mut alice, &bare.to_string()).await.unwrap_err());
    assert!(
        err.violations
            .iter()
            .any(|v| v.field.ends_with("conversation.orchestrator")),
        "{err:?}"
    );
    e.stack.stop().await.unwrap();
}

use crate::common::{postgres, sled};

switchyard_testkit::on_both_backends!(
    sled, postgres;
    a_conversation_answers_each_message_with_what_was_said_before_and_ends_when_closed,
    a_message_is_taken_once_by_key_and_messages_sent_during_a_turn_wait_their_turn,
    a_used_up_budget_pauses_the_conversation_and_an_approved_extension_answers_what_waited,
);
