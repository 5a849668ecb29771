//! Triggers (issue 47): an event delivered to the HTTP door's webhook (or
//! FireTrigger) starts one job per event id, as the trigger's creator,
//! with the event mapped into its input; senders the trigger does not
//! name, unauthenticated and malformed deliveries are refused.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use serde_json::{Value, json};
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::trigger_service_client::TriggerServiceClient;
use switchyard_proto::executor::v1::{
    CreateTriggerRequest, DeleteTriggerRequest, FireTriggerRequest, JobState, Trigger,
};
use switchyard_testkit::Stack;

use crate::common::*;

const TEMPLATE: &str = r#"{"plan_id": "on-pr", "input": {"repo": "web", "number": 0}, "tasks": [
  {"id": "say", "agent": {"capability": "builtin.echo",
   "input": {"text": "PR ${parent.input.number} on ${parent.input.repo}"}}}]}"#;

async fn start(b: &Backend) -> Stack {
    Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| b.apply(c))
        .await
        .expect("the stack starts")
}

/// POSTs `body` to trigger `id`'s webhook with `token` (none: no
/// credential) and `event_id` in the Idempotency-Key header (if any).
async fn deliver(
    s: &Stack,
    id: &str,
    token: Option<&str>,
    event_id: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let url = format!("http://{}/v1/triggers/{id}/events", s.http.unwrap());
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(e) = event_id {
        req = req.header("idempotency-key", e);
    }
    let r = req.send().await.unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

fn reason(v: &Value) -> &str {
    v["error"]["reason"].as_str().unwrap_or_default()
}

async fn an_event_starts_one_job_per_event_id_as_the_triggers_creator(b: Backend) {
    let s = start(&b).await;
    let hook = s
        .key(
            "hook",
            &["agent"],
            switchyard_proto::auth::v1::PrincipalKind::Agent,
        )
        .await
        .unwrap();
    let mut alice = TriggerServiceClient::new(s.channel_as("alice").await.unwrap());
    let made = alice
        .create_trigger(CreateTriggerRequest {
            trigger: Some(Trigger {
                trigger_id: "pr-opened".into(),
                input_map: [("number".to_owned(), "/pull_request/number".to_owned())].into(),
                senders: vec!["hook".into()],
                ..Default::default()
            }),
            document: TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(made.created);
    let event = json!({"action": "opened", "pull_request": {"number": 42}}).to_string();

    // The webhook sender's key (an agent key the trigger names) delivers:
    // the job is alice's, with the event in its input.
    let (code, first) = deliver(&s, "pr-opened", Some(&hook), Some("d-1"), &event).await;
    assert_eq!(code, 201, "{first}");
    assert_eq!(first["created"], true);
    let job_id = first["job_id"].as_str().unwrap().to_owned();
    let mut jobs = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    let done = finish(&mut jobs, &job_id).await;
    let j = job(&mut jobs, &job_id).await;
    assert_eq!(JobState::try_from(j.state).unwrap(), JobState::Completed);
    assert_eq!(j.submitted_by, "alice", "the trigger's creator's job");
    assert_eq!(
        (j.trigger_id.as_str(), j.event_id.as_str()),
        ("pr-opened", "d-1")
    );
    let out = done
        .result
        .as_ref()
        .map(|v| switchyard_kit::json::value_to_json(v).to_string())
        .unwrap_or_default();
    assert!(out.contains("PR 42 on web"), "{out}");
    let input =
        switchyard_kit::json::struct_to_json(j.spec.as_ref().unwrap().input.as_ref().unwrap());
    assert_eq!(
        input["event"]["action"], "opened",
        "the whole event under `event`"
    );

    // The same event again: the same job, nothing new.
    let (code, again) = deliver(&s, "pr-opened", Some(&hook), Some("d-1"), &event).await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(
        (again["job_id"].as_str(), again["created"].as_bool()),
        (Some(job_id.as_str()), Some(false))
    );
    let listed = jobs
        .list_jobs(switchyard_proto::executor::v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let started = listed
        .iter()
        .filter(|j| j.trigger_id == "pr-opened")
        .count();
    assert_eq!(started, 1, "duplicate deliveries start one job");
    // The same id with another body is refused.
    let other = json!({"action": "closed", "pull_request": {"number": 42}}).to_string();
    let (code, reused) = deliver(&s, "pr-opened", Some(&hook), Some("d-1"), &other).await;
    assert_eq!(
        (code, reason(&reused)),
        (409, "EVENT_ALREADY_DELIVERED"),
        "{reused}"
    );
    // A CloudEvent carries its own id.
    let ce = json!({"specversion": "1.0", "id": "ce-7", "type": "pr", "source": "/gh",
                    "pull_request": {"number": 7}})
    .to_string();
    let (code, cloud) = deliver(&s, "pr-opened", Some(&hook), None, &ce).await;
    assert_eq!(code, 201, "{cloud}");
    assert_eq!(
        job(&mut jobs, cloud["job_id"].as_str().unwrap())
            .await
            .event_id,
        "ce-7"
    );

    // Refused: no credential, no event id, not JSON, not an object, an
    // event the mapping cannot read.
    let (code, none) = deliver(&s, "pr-opened", None, Some("d-2"), &event).await;
    assert_eq!((code, reason(&none)), (401, "AUTH_REQUIRED"), "{none}");
    let (code, no_id) = deliver(&s, "pr-opened", Some(&hook), None, &event).await;
    assert_eq!(code, 400, "{no_id}");
    assert!(no_id.to_string().contains("Idempotency-Key"), "{no_id}");
    let (code, bad) = deliver(&s, "pr-opened", Some(&hook), Some("d-3"), "{\"action\": ").await;
    assert_eq!((code, reason(&bad)), (400, "MALFORMED_REQUEST"), "{bad}");
    let (code, list) = deliver(&s, "pr-opened", Some(&hook), Some("d-4"), "[1, 2]").await;
    assert_eq!(code, 400, "{list}");
    let (code, lacks) = deliver(
        &s,
        "pr-opened",
        Some(&hook),
        Some("d-5"),
        "{\"action\": \"x\"}",
    )
    .await;
    assert_eq!((code, reason(&lacks)), (400, "TRIGGER_INVALID"), "{lacks}");
    assert!(
        lacks.to_string().contains("/pull_request/number"),
        "{lacks}"
    );

    // Outsiders: another submitter, another tenant's admin, an agent key
    // the trigger does not name.
    let [carol, mallory, robot] = outsiders(&s).await;
    for (who, token, want) in [
        ("carol", &carol, 404),
        ("mallory", &mallory, 403),
        ("robot", &robot, 404),
    ] {
        let (code, v) = deliver(&s, "pr-opened", Some(token), Some("d-9"), &event).await;
        assert_eq!(code, want, "{who}: {v}");
    }
    let mut robot_c = TriggerServiceClient::new(s.channel_with(&robot).await.unwrap());
    let e = robot_c
        .create_trigger(CreateTriggerRequest {
            trigger: Some(Trigger {
                trigger_id: "robots".into(),
                ..Default::default()
            }),
            document: TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // Nothing an outsider or a refused delivery sent started a job.
    let listed = jobs
        .list_jobs(switchyard_proto::executor::v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(
        listed
            .iter()
            .filter(|j| j.trigger_id == "pr-opened")
            .count(),
        2
    );

    // The creator fires over gRPC too; once deleted, the trigger is gone.
    let fired = alice
        .fire_trigger(FireTriggerRequest {
            trigger_id: "pr-opened".into(),
            event: switchyard_kit::json::json_to_struct(&json!({"pull_request": {"number": 9}})),
            event_id: "grpc-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(fired.created);
    alice
        .delete_trigger(DeleteTriggerRequest {
            trigger_id: "pr-opened".into(),
        })
        .await
        .unwrap();
    let (code, gone) = deliver(&s, "pr-opened", Some(&hook), Some("d-10"), &event).await;
    assert_eq!((code, reason(&gone)), (404, "TRIGGER_NOT_FOUND"), "{gone}");
    s.stop().await.unwrap();
}

switchyard_testkit::on_both_backends!(
    sled, postgres;
    an_event_starts_one_job_per_event_id_as_the_triggers_creator,
);
