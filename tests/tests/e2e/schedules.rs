//! Schedules (issue 47): a job started at each tick of a cron timetable,
//! as its creator, with overlap policies — through the generated client
//! against a whole stack, on both backends.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::time::Duration;

use switchyard_kit::client::Intercepted;
use switchyard_kit::time::timestamp_ms;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::schedule_service_client::ScheduleServiceClient;
use switchyard_proto::executor::v1::{
    CreateScheduleRequest, DeleteScheduleRequest, GetScheduleRequest, JobState,
    ListSchedulesRequest, OverlapPolicy, PauseScheduleRequest, ResumeScheduleRequest, Schedule,
    TickOutcome,
};
use switchyard_testkit::Stack;

use crate::common::*;

type Schedules = ScheduleServiceClient<Intercepted>;

async fn start(b: &Backend) -> Stack {
    Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.schedule_poll_ms = 100;
        c.executor.commands.push("sleep".into());
        b.apply(c);
    })
    .await
    .expect("the stack starts")
}

async fn schedules(s: &Stack, who: &str) -> Schedules {
    ScheduleServiceClient::new(s.channel_as(who).await.unwrap())
}

/// One builtin echo step: no approval, no spend.
fn echo_job() -> String {
    serde_json::json!({"plan_id": "tick", "tasks": [
        {"id": "say", "agent": {"capability": "builtin.echo", "input": {"text": "tick"}}}
    ]})
    .to_string()
}

/// One step that sleeps `secs` seconds.
fn sleep_job(secs: u32) -> String {
    serde_json::json!({"plan_id": "slow", "tasks": [
        {"id": "nap", "command": {"command": "sleep", "args": [secs.to_string()]}}
    ]})
    .to_string()
}

async fn create(
    c: &mut Schedules,
    id: &str,
    cron: &str,
    doc: &str,
    overlap: OverlapPolicy,
) -> Result<(Schedule, bool), tonic::Status> {
    c.create_schedule(CreateScheduleRequest {
        schedule: Some(Schedule {
            schedule_id: id.into(),
            cron: cron.into(),
            overlap: overlap as i32,
            ..Default::default()
        }),
        document: doc.into(),
        ..Default::default()
    })
    .await
    .map(|r| {
        let r = r.into_inner();
        (r.schedule.unwrap(), r.created)
    })
}

async fn get(c: &mut Schedules, id: &str) -> Result<Schedule, tonic::Status> {
    c.get_schedule(GetScheduleRequest {
        schedule_id: id.into(),
    })
    .await
    .map(|r| r.into_inner().schedule.unwrap())
}

/// Polls the schedule (bounded: 30 s) until `done` holds for it.
async fn until(
    c: &mut Schedules,
    id: &str,
    what: &str,
    done: impl Fn(&Schedule) -> bool,
) -> Schedule {
    for _ in 0..300 {
        let s = get(c, id).await.unwrap();
        if done(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("schedule {id}: {what} within 30 s");
}

fn started(s: &Schedule) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = s
        .recent_ticks
        .iter()
        .filter(|t| t.outcome == TickOutcome::Started as i32)
        .map(|t| (timestamp_ms(t.at.as_ref().unwrap()), t.job_id.clone()))
        .collect();
    v.sort();
    v
}

fn reason(e: &tonic::Status) -> Option<String> {
    switchyard_kit::error::ApiError::from(e.clone()).reason
}

async fn a_schedule_starts_one_job_per_tick_as_its_creator_until_paused(b: Backend) {
    let s = start(&b).await;
    let mut alice = schedules(&s, "alice").await;
    let (made, created) = create(
        &mut alice,
        "every-second",
        "* * * * * *",
        &echo_job(),
        OverlapPolicy::Unspecified,
    )
    .await
    .unwrap();
    assert!(created);
    assert_eq!(made.created_by, "alice");
    assert_eq!(
        made.next_fire_times.len(),
        5,
        "its next fire times are shown"
    );
    // The same definition again is the same schedule; another is refused.
    let (_, again) = create(
        &mut alice,
        "every-second",
        "* * * * * *",
        &echo_job(),
        OverlapPolicy::Unspecified,
    )
    .await
    .unwrap();
    assert!(!again, "a repeat answers with the schedule made");
    let e = create(
        &mut alice,
        "every-second",
        "*/2 * * * * *",
        &echo_job(),
        OverlapPolicy::Unspecified,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists);
    assert_eq!(reason(&e).as_deref(), Some("SCHEDULE_ALREADY_EXISTS"));

    let sched = until(&mut alice, "every-second", "three jobs started", |s| {
        started(s).len() >= 3
    })
    .await;
    let ticks = started(&sched);
    // One job per tick, one second apart, each named by its tick, each
    // alice's and linked to the schedule.
    let mut jobs = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    for pair in ticks.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, 1000, "consecutive ticks: {ticks:?}");
    }
    for (tick, job_id) in &ticks {
        // `2026-11-30T04:53:33.000Z` → `20261130T045333Z`.
        let utc = switchyard_kit::time::utc(*tick).replace(['-', ':'], "");
        let want = format!("every-second-{}Z", &utc[..15]);
        assert_eq!(job_id, &want);
        finish(&mut jobs, job_id).await;
        let j = job(&mut jobs, job_id).await;
        assert_eq!(JobState::try_from(j.state).unwrap(), JobState::Completed);
        assert_eq!(j.schedule_id, "every-second");
        assert_eq!(timestamp_ms(j.schedule_tick.as_ref().unwrap()), *tick);
        assert_eq!(j.submitted_by, "alice", "the job is its creator's");
    }

    // Outsiders: another submitter, another tenant's admin, an agent key.
    let [carol, mallory, robot] = outsiders(&s).await;
    for (who, token, pause_code) in [
        ("carol", &carol, tonic::Code::NotFound),
        ("mallory", &mallory, tonic::Code::NotFound),
        ("robot", &robot, tonic::Code::PermissionDenied),
    ] {
        let mut c = ScheduleServiceClient::new(s.channel_with(token).await.unwrap());
        let e = get(&mut c, "every-second").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{who}: {e:?}");
        assert_eq!(reason(&e).as_deref(), Some("SCHEDULE_NOT_FOUND"), "{who}");
        let listed = c.list_schedules(ListSchedulesRequest {}).await;
        assert!(
            listed
                .map(|l| l.into_inner().schedules.is_empty())
                .unwrap_or(true),
            "{who} lists none of alice's schedules"
        );
        let e = c
            .pause_schedule(PauseScheduleRequest {
                schedule_id: "every-second".into(),
                note: "mine now".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), pause_code, "{who} pausing: {e:?}");
        let e = c
            .delete_schedule(DeleteScheduleRequest {
                schedule_id: "every-second".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), pause_code, "{who} deleting: {e:?}");
    }
    // An agent key submits only delegated children: it creates no schedule.
    let mut robot_c = ScheduleServiceClient::new(s.channel_with(&robot).await.unwrap());
    let e = create(
        &mut robot_c,
        "robots",
        "* * * * * *",
        &echo_job(),
        OverlapPolicy::Unspecified,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

    // The tenant's admin pauses it; no tick after the pause fires. A
    // second schedule is the clock that shows time passed.
    let mut admin = schedules(&s, "admin").await;
    let paused = admin
        .pause_schedule(PauseScheduleRequest {
            schedule_id: "every-second".into(),
            note: "maintenance".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    let paused_at = s_now();
    assert!(paused.paused && paused.next_fire_times.is_empty());
    assert_eq!(paused.pause_note, "maintenance");
    create(
        &mut alice,
        "clock",
        "* * * * * *",
        &echo_job(),
        OverlapPolicy::Unspecified,
    )
    .await
    .unwrap();
    until(&mut alice, "clock", "three ticks", |s| {
        started(s).len() >= 3
    })
    .await;
    let during = get(&mut alice, "every-second").await.unwrap();
    assert!(
        started(&during).iter().all(|(t, _)| *t <= paused_at),
        "no tick after the pause: {:?} (paused at {paused_at})",
        started(&during)
    );
    // Resumed by alice: ticks fire again, from now (the paused ones never).
    alice
        .resume_schedule(ResumeScheduleRequest {
            schedule_id: "every-second".into(),
        })
        .await
        .unwrap();
    let resumed_at = s_now();
    let after = until(&mut alice, "every-second", "a tick after the resume", |s| {
        started(s).iter().any(|(t, _)| *t > resumed_at)
    })
    .await;
    assert!(
        started(&after)
            .iter()
            .all(|(t, _)| *t <= paused_at || *t > resumed_at - 1000),
        "the ticks passed while paused never fire: {:?}",
        started(&after)
    );
    // Deleted: gone for everyone, its jobs stay.
    for id in ["every-second", "clock"] {
        alice
            .delete_schedule(DeleteScheduleRequest {
                schedule_id: id.into(),
            })
            .await
            .unwrap();
    }
    let e = get(&mut alice, "every-second").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let listed = alice
        .list_schedules(ListSchedulesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(listed.schedules.is_empty());
    let kept = job(&mut jobs, &ticks[0].1).await;
    assert_eq!(kept.schedule_id, "every-second", "its jobs stay, naming it");
    s.stop().await.unwrap();
}

/// The wall clock now, in ms (the stack runs on the system clock).
fn s_now() -> u64 {
    switchyard_kit::time::now_ms()
}

async fn overlapping_ticks_are_skipped_or_cancel_the_previous_job(b: Backend) {
    let s = start(&b).await;
    let mut alice = schedules(&s, "alice").await;
    let mut jobs = JobServiceClient::new(s.channel_as("alice").await.unwrap());
    // SKIP: a 3-second job every second; ticks while it runs are skipped.
    create(
        &mut alice,
        "skipper",
        "* * * * * *",
        &sleep_job(3),
        OverlapPolicy::Skip,
    )
    .await
    .unwrap();
    let sk = until(&mut alice, "skipper", "a skip and two jobs", |s| {
        started(s).len() >= 2
            && s.recent_ticks
                .iter()
                .any(|t| t.outcome == TickOutcome::SkippedOverlap as i32)
    })
    .await;
    alice
        .pause_schedule(PauseScheduleRequest {
            schedule_id: "skipper".into(),
            note: String::new(),
        })
        .await
        .unwrap();
    // The jobs it started never ran at the same time.
    let mut spans = Vec::new();
    for (_, id) in started(&sk) {
        finish(&mut jobs, &id).await;
        let j = job(&mut jobs, &id).await;
        spans.push((
            timestamp_ms(j.created_at.as_ref().unwrap()),
            timestamp_ms(j.finished_at.as_ref().unwrap()),
        ));
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlapping jobs: {spans:?}");
    }

    // CANCEL_PREVIOUS: a 30-second job every two seconds; each tick
    // cancels the one before.
    create(
        &mut alice,
        "canceller",
        "*/2 * * * * *",
        &sleep_job(30),
        OverlapPolicy::CancelPrevious,
    )
    .await
    .unwrap();
    let cs = until(&mut alice, "canceller", "a tick that cancelled", |s| {
        s.recent_ticks
            .iter()
            .any(|t| !t.cancelled_job_id.is_empty())
    })
    .await;
    alice
        .pause_schedule(PauseScheduleRequest {
            schedule_id: "canceller".into(),
            note: String::new(),
        })
        .await
        .unwrap();
    let tick = cs
        .recent_ticks
        .iter()
        .find(|t| !t.cancelled_job_id.is_empty())
        .unwrap();
    finish(&mut jobs, &tick.cancelled_job_id).await;
    let cancelled = job(&mut jobs, &tick.cancelled_job_id).await;
    assert_eq!(
        JobState::try_from(cancelled.state).unwrap(),
        JobState::Cancelled,
        "the previous job was cancelled"
    );
    assert!(cancelled.error.contains("canceller"), "{}", cancelled.error);
    // The last one started is cancelled here, so the stack stops quickly.
    for (_, id) in started(&get(&mut alice, "canceller").await.unwrap()) {
        let _ = jobs
            .cancel_job(switchyard_proto::executor::v1::CancelJobRequest {
                job_id: id,
                reason: "test over".into(),
            })
            .await;
    }
    s.stop().await.unwrap();
}

async fn creating_a_schedule_refuses_what_would_not_run(b: Backend) {
    let s = start(&b).await;
    let mut alice = schedules(&s, "alice").await;
    let cases = [
        (
            "bad-cron",
            "61 * * * *",
            echo_job(),
            "minute field \"61\": 61 is out of range 0-59",
        ),
        ("never", "0 0 30 2 *", echo_job(), "never fires"),
        (
            "deadline",
            "@daily",
            serde_json::json!({"deadline": 1_900_000_000_u64, "tasks": [
                {"id": "say", "agent": {"capability": "builtin.echo", "input": {"text": "x"}}}]})
            .to_string(),
            "no fixed deadline",
        ),
        (
            "a/b",
            "@daily",
            echo_job(),
            "schedule_id \"a/b\" does not fit",
        ),
    ];
    for (id, cron, doc, want) in cases {
        let e = create(&mut alice, id, cron, &doc, OverlapPolicy::Unspecified)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{id}: {e:?}");
        assert_eq!(
            reason(&e).as_deref(),
            Some("SCHEDULE_INVALID"),
            "{id}: {}",
            e.message()
        );
        assert!(e.message().contains(want), "{id}: {}", e.message());
    }
    let e = alice
        .create_schedule(CreateScheduleRequest {
            schedule: Some(Schedule {
                schedule_id: "mars".into(),
                cron: "@daily".into(),
                time_zone: "Mars/Olympus_Mons".into(),
                ..Default::default()
            }),
            document: echo_job(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        e.message()
            .contains("time zone \"Mars/Olympus_Mons\" is unknown"),
        "{e:?}"
    );
    // A template that is not a job is refused as SubmitJob refuses it.
    let e = create(
        &mut alice,
        "empty",
        "@daily",
        r#"{"tasks": []}"#,
        OverlapPolicy::Unspecified,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // A budget not shared with alice cannot carry its jobs.
    let mut ledger = switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        s.channel_as("admin").await.unwrap(),
    );
    ledger
        .create_budget(switchyard_proto::ledger::v1::CreateBudgetRequest {
            budget_id: "ops-only".into(),
            cost_limit: Some(switchyard_proto::common::v1::Money {
                micro_usd: 1_000_000,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let doc = serde_json::json!({"budget": {"parent_budget_id": "ops-only"}, "tasks": [
        {"id": "say", "agent": {"capability": "builtin.echo", "input": {"text": "x"}}}]})
    .to_string();
    let e = create(
        &mut alice,
        "on-ops",
        "@daily",
        &doc,
        OverlapPolicy::Unspecified,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(
        reason(&e).as_deref(),
        Some("BUDGET_NOT_FOUND"),
        "as SubmitJob says it"
    );
    // A service acting for no user has no tenant for the jobs.
    let mut operator = schedules(&s, "operator").await;
    let e = create(
        &mut operator,
        "svc",
        "@daily",
        &echo_job(),
        OverlapPolicy::Unspecified,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Nothing refused was kept.
    let listed = alice
        .list_schedules(ListSchedulesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(listed.schedules.is_empty(), "{:?}", listed.schedules);
    s.stop().await.unwrap();
}

switchyard_testkit::on_both_backends!(
    sled, postgres;
    a_schedule_starts_one_job_per_tick_as_its_creator_until_paused,
    overlapping_ticks_are_skipped_or_cancel_the_previous_job,
);

#[tokio::test]
async fn creating_a_schedule_refuses_what_would_not_run_on_sled() {
    creating_a_schedule_refuses_what_would_not_run(sled()).await
}
