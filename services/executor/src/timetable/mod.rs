//! Schedules (issue 47): jobs started on a cron timetable, in a time zone.
//!
//! - [`cron`] reads the expressions; [`plan`] decides, pure, what a
//!   schedule's next tick does (overlap and catch-up policies);
//! - this module keeps the schedules (the ScheduleService RPCs: create,
//!   read, pause, resume, delete) and [`fire`] runs the timetable.
//!
//! Three spaces beside the jobs, on either backend: `schedules` (the
//! definitions, written only by the RPCs), `schedule_ticks` (one claim per
//! decided tick, `<schedule>/<tick ms>`, written once — the first writer
//! across every replica decides the tick) and `schedule_history` (each
//! schedule's recent ticks, written by whoever decided the latest).

use std::collections::BTreeMap;

use switchyard_kit::auth::Principal;
use switchyard_kit::time::{timestamp, timestamp_ms};
use switchyard_proto::executor::v1::{
    CatchUpPolicy, CreateScheduleRequest, CreateScheduleResponse, OverlapPolicy, Schedule,
    ScheduleHistory, ScheduleTick,
};

use crate::Executor;
use crate::creator::{Creator, Template, check_id};
use crate::error::{ExecutorError, Object};
use crate::store::{Kept, Space};

pub(crate) mod cron;
pub(crate) mod fire;
pub(crate) mod plan;

/// How many fire times a read shows.
const UPCOMING: usize = 5;
/// How many decided ticks each schedule keeps.
const HISTORY: usize = 20;
/// The catch-up window when none is set.
const DEFAULT_WINDOW_MS: u64 = 3_600_000;

/// The schedules and their ticks, as kept beside the jobs.
pub(crate) struct Timetable {
    pub(crate) schedules: Kept<Schedule>,
    pub(crate) history: Kept<ScheduleHistory>,
    pub(crate) ticks: Kept<ScheduleTick>,
    /// This replica's name, recorded with the ticks it decides.
    pub(crate) me: String,
}

impl Timetable {
    /// The spaces on the job store.
    pub(crate) fn open(
        space: impl Fn(&'static str) -> Space,
        me: String,
    ) -> Result<Timetable, ExecutorError> {
        Ok(Timetable {
            schedules: Kept::open(space("schedules"))?,
            history: Kept::open(space("schedule_history"))?,
            ticks: Kept::open(space("schedule_ticks"))?,
            me,
        })
    }
}

/// A tick's claim key: the schedule and the tick, sortable.
pub(crate) fn tick_key(schedule_id: &str, tick_ms: u64) -> String {
    format!("{schedule_id}/{tick_ms:016}")
}

/// The id of the job a schedule's tick starts: `<schedule>-<UTC time>`.
pub(crate) fn job_id_of(schedule_id: &str, tick_ms: u64) -> String {
    let at = i64::try_from(tick_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{schedule_id}-{}", at.strftime("%Y%m%dT%H%M%SZ"))
}

/// The policies of schedule `s`.
pub(crate) fn policy_of(s: &Schedule) -> plan::Policy {
    plan::Policy {
        overlap: match s.overlap() {
            OverlapPolicy::Queue => plan::Overlap::Queue,
            OverlapPolicy::CancelPrevious => plan::Overlap::CancelPrevious,
            OverlapPolicy::Skip | OverlapPolicy::Unspecified => plan::Overlap::Skip,
        },
        catch_up: match s.catch_up() {
            CatchUpPolicy::Skip => plan::CatchUp::Skip,
            CatchUpPolicy::All => plan::CatchUp::All,
            CatchUpPolicy::Latest | CatchUpPolicy::Unspecified => plan::CatchUp::Latest,
        },
        window_ms: s.catch_up_window.as_ref().map_or(DEFAULT_WINDOW_MS, |d| {
            (d.seconds.max(0) as u64).saturating_mul(1000)
        }),
    }
}

/// Schedule `s`'s timetable.
pub(crate) fn cron_of(s: &Schedule) -> Result<cron::Cron, ExecutorError> {
    cron::Cron::parse(&s.cron, &s.time_zone)
        .map_err(|e| ExecutorError::ObjectInvalid(Object::Schedule, e.to_string()))
}

/// The creator schedule `s`'s jobs are submitted as.
pub(crate) fn owner_of(s: &Schedule) -> Creator {
    Creator::stored(crate::creator::Kept {
        subject: &s.created_by,
        tenant: &s.tenant,
        kind: &s.creator_kind,
        roles: &s.creator_roles,
        manages_budgets: s.creator_manages_budgets,
    })
}

/// What a creator may set, compared for an idempotent repeat.
fn definition(s: &Schedule) -> Schedule {
    Schedule {
        schedule_id: s.schedule_id.clone(),
        cron: s.cron.clone(),
        time_zone: s.time_zone.clone(),
        job: s.job.clone(),
        overlap: s.overlap,
        catch_up: s.catch_up,
        catch_up_window: s.catch_up_window,
        description: s.description.clone(),
        tenant: s.tenant.clone(),
        created_by: s.created_by.clone(),
        ..Default::default()
    }
}

impl Executor {
    fn timetable(&self) -> &Timetable {
        &self.inner.timetable
    }

    /// Schedule `id` as kept, if `p` may see it (NOT_FOUND otherwise, as
    /// for one that does not exist).
    async fn visible_schedule(&self, p: &Principal, id: &str) -> Result<Schedule, ExecutorError> {
        match self.timetable().schedules.get(id).await? {
            Some(s) if p.may_see(&s.tenant, &s.created_by) => Ok(s),
            _ => Err(ExecutorError::ObjectNotFound(
                Object::Schedule,
                id.to_owned(),
            )),
        }
    }

    /// `s` as answered: with its next fire times and recent ticks.
    async fn shown(&self, mut s: Schedule) -> Result<Schedule, ExecutorError> {
        let history = self
            .timetable()
            .history
            .get(&s.schedule_id)
            .await?
            .unwrap_or_default();
        self.show_with(&mut s, history);
        Ok(s)
    }

    fn show_with(&self, s: &mut Schedule, history: ScheduleHistory) {
        s.recent_ticks = history.ticks;
        s.next_fire_times = if s.paused {
            Vec::new()
        } else {
            let now = self.inner.book.now();
            cron_of(s)
                .map(|c| c.upcoming(now, UPCOMING))
                .unwrap_or_default()
                .into_iter()
                .map(timestamp)
                .collect()
        };
    }

    /// CreateSchedule for principal `p`.
    pub(crate) async fn create_schedule(
        &self,
        p: &Principal,
        req: CreateScheduleRequest,
    ) -> Result<CreateScheduleResponse, ExecutorError> {
        let creator = Creator::of(p, Object::Schedule)?;
        let mut s = req.schedule.unwrap_or_default();
        if s.schedule_id.is_empty() {
            s.schedule_id = format!("sched-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
        }
        check_id(&s.schedule_id, Object::Schedule)?;
        let cron = cron_of(&s)?;
        let template = Template {
            spec: s.job.take(),
            document: &req.document,
            format: &req.format,
        };
        let mut spec = self.template(template, &creator, Object::Schedule).await?;
        if let Some(input) = req.input {
            spec.input = Some(input);
        }
        let refuse = |why: &str| {
            Err(ExecutorError::ObjectInvalid(
                Object::Schedule,
                why.to_owned(),
            ))
        };
        let now = self.inner.book.now();
        s.job = Some(spec);
        s.tenant = creator.who.tenant.clone();
        s.created_by = creator.who.subject.clone();
        s.creator_kind = creator.who.kind.as_str().to_owned();
        (s.creator_roles, s.creator_manages_budgets) = creator.budget_fields();
        s.created_at = Some(timestamp(now));
        s.since = Some(timestamp(now));
        if !s.paused {
            s.pause_note.clear();
        }
        s.next_fire_times.clear();
        s.recent_ticks.clear();
        if cron.next_after(now).is_none() {
            return refuse("the schedule never fires again: check the cron expression's fields");
        }
        let kept = self
            .timetable()
            .schedules
            .put_absent(&s.schedule_id, s.clone())
            .await?;
        self.timetable().schedules.sync().await?;
        let created = kept.created_at == s.created_at && kept.created_by == s.created_by;
        if !created && definition(&kept) != definition(&s) {
            return Err(ExecutorError::ObjectExists(Object::Schedule, s.schedule_id));
        }
        tracing::info!(
            schedule_id = %kept.schedule_id,
            cron = %kept.cron,
            time_zone = %kept.time_zone,
            created,
            "schedule created"
        );
        Ok(CreateScheduleResponse {
            schedule: Some(self.shown(kept).await?),
            created,
        })
    }

    /// GetSchedule for principal `p`.
    pub(crate) async fn get_schedule(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<Schedule, ExecutorError> {
        let s = self.visible_schedule(p, id).await?;
        self.shown(s).await
    }

    /// ListSchedules for principal `p`: those it may see, by id.
    pub(crate) async fn list_schedules(
        &self,
        p: &Principal,
    ) -> Result<Vec<Schedule>, ExecutorError> {
        let t = self.timetable();
        let mut history: BTreeMap<String, ScheduleHistory> =
            t.history.list().await?.into_iter().collect();
        let mut out = Vec::new();
        for (_, mut s) in t.schedules.list().await? {
            if p.may_see(&s.tenant, &s.created_by) {
                let h = history.remove(&s.schedule_id).unwrap_or_default();
                self.show_with(&mut s, h);
                out.push(s);
            }
        }
        out.sort_by(|a, b| a.schedule_id.cmp(&b.schedule_id));
        Ok(out)
    }

    /// PauseSchedule (`pause`) or ResumeSchedule for principal `p`.
    pub(crate) async fn pause_schedule(
        &self,
        p: &Principal,
        id: &str,
        pause: Option<String>,
    ) -> Result<Schedule, ExecutorError> {
        let mut s = self.visible_schedule(p, id).await?;
        match pause {
            Some(note) if !s.paused || s.pause_note != note => {
                s.paused = true;
                s.pause_note = note;
                self.timetable().schedules.put(id, &s)?;
            }
            Some(_) => {}
            None if s.paused => {
                s.paused = false;
                s.pause_note.clear();
                // Ticks count from now: those passed while paused never fire.
                s.since = Some(timestamp(self.inner.book.now()));
                self.timetable().schedules.put(id, &s)?;
            }
            None => {}
        }
        self.timetable().schedules.sync().await?;
        tracing::info!(schedule_id = %id, paused = s.paused, by = %p.subject, "schedule paused or resumed");
        self.shown(s).await
    }

    /// DeleteSchedule for principal `p`.
    pub(crate) async fn delete_schedule(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<(), ExecutorError> {
        self.visible_schedule(p, id).await?;
        let t = self.timetable();
        t.schedules.remove(id)?;
        if let Some(h) = t.history.get(id).await? {
            for tick in &h.ticks {
                t.ticks
                    .remove(&tick_key(id, tick.at.as_ref().map_or(0, timestamp_ms)))?;
            }
        }
        t.history.remove(id)?;
        self.timetable().schedules.sync().await?;
        tracing::info!(schedule_id = %id, by = %p.subject, "schedule deleted");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticks_job_id_names_the_schedule_and_the_utc_time() {
        let ms = "2026-11-30T02:00:00Z"
            .parse::<jiff::Timestamp>()
            .map(|t| t.as_millisecond() as u64)
            .unwrap_or_default();
        assert_eq!(job_id_of("nightly", ms), "nightly-20261130T020000Z");
        assert!(
            switchyard_core::validate::object_id(&job_id_of(&"a".repeat(64), ms), "job_id").is_ok()
        );
    }
}
