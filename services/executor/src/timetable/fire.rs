//! The timetable's loop: every `schedule_poll_ms` each replica decides the
//! due ticks of every schedule ([`plan::decide`]) and acts on them.
//!
//! Exactly one job per tick, whatever the number of replicas: a decision
//! is written as the tick's claim (`schedule_ticks`, first writer wins, at
//! once on PostgreSQL) before anything is done; a replica that finds the
//! claim another's takes that decision as made. A job is then submitted
//! under the id the tick names (`<schedule>-<UTC time>`), so a replica
//! that claimed a tick and died before its job was stored is replaced: once
//! the claim is older than [`TAKEOVER_MS`] and no such job exists, the next
//! replica to look submits it under the same id.

use std::collections::BTreeMap;
use std::time::Duration;

use switchyard_kit::time::{timestamp, timestamp_ms};
use switchyard_proto::executor::v1::{
    Schedule, ScheduleHistory, ScheduleTick, SubmitJobRequest, TickOutcome,
};

use super::plan::{self, Decision, Outcome, Previous};
use super::{HISTORY, cron_of, job_id_of, owner_of, policy_of, tick_key};
use crate::Executor;
use crate::admission::{Fired, Submission};
use crate::error::ExecutorError;
use crate::job::job_state;

/// A claim older than this whose job does not exist is taken over.
pub(crate) const TAKEOVER_MS: u64 = 30_000;

/// At most this many ticks of one schedule are decided per pass.
const DECISIONS_PER_PASS: usize = 100;

/// How long a tick's submission may take before the pass moves on (its
/// claim then waits for the takeover).
const SUBMIT_LIMIT: Duration = Duration::from_secs(30);

impl Executor {
    /// One pass over every schedule at the executor's clock.
    pub(crate) async fn fire_due(&self) -> Result<(), ExecutorError> {
        if self.draining() {
            return Ok(());
        }
        let t = &self.inner.timetable;
        let schedules = t.schedules.list().await?;
        if schedules.is_empty() {
            return Ok(());
        }
        let mut history: BTreeMap<String, ScheduleHistory> =
            t.history.list().await?.into_iter().collect();
        for (id, s) in schedules {
            if s.paused {
                continue;
            }
            let h = history.remove(&id).unwrap_or_default();
            if let Err(e) = self.fire_schedule(&s, h).await {
                tracing::warn!(schedule_id = %id, error = %e, "a schedule's tick is not decided yet; the next pass tries again");
            }
        }
        Ok(())
    }

    /// Decides schedule `s`'s due ticks, with `h` its history.
    async fn fire_schedule(
        &self,
        s: &Schedule,
        mut h: ScheduleHistory,
    ) -> Result<(), ExecutorError> {
        let t = &self.inner.timetable;
        let id = s.schedule_id.as_str();
        let cron = cron_of(s)?;
        let policy = policy_of(s);
        let since = s.since.as_ref().map_or(0, timestamp_ms);
        for _ in 0..DECISIONS_PER_PASS {
            let now = self.inner.book.now();
            let from = h
                .ticks
                .first()
                .and_then(|t| t.at.as_ref())
                .map_or(0, timestamp_ms)
                .max(since);
            if cron.next_after(from).is_none_or(|t| t > now) {
                return Ok(());
            }
            let (last_job, previous) = self.previous_of(&h).await?;
            let Decision::Tick {
                tick,
                outcome,
                skipped_before,
            } = plan::decide(&cron, from, policy, previous, now)
            else {
                return Ok(());
            };
            let job_id = job_id_of(id, tick);
            let (tick_outcome, cancel) = match outcome {
                Outcome::Start { cancel } => (TickOutcome::Started, cancel),
                Outcome::SkipOverlap => (TickOutcome::SkippedOverlap, false),
                Outcome::SkipMissed => (TickOutcome::SkippedMissed, false),
            };
            let starts = tick_outcome == TickOutcome::Started;
            let mine = ScheduleTick {
                at: Some(timestamp(tick)),
                outcome: tick_outcome as i32,
                job_id: if starts {
                    job_id.clone()
                } else {
                    String::new()
                },
                skipped_before: u32::try_from(skipped_before).unwrap_or(u32::MAX),
                error: String::new(),
                decided_at: Some(timestamp(now)),
                decided_by: t.me.clone(),
                cancelled_job_id: if cancel {
                    last_job.clone()
                } else {
                    String::new()
                },
            };
            // Deleted or paused since the pass read it: nothing more.
            match t.schedules.get(id).await? {
                Some(current) if !current.paused && current.since == s.since => {}
                _ => return Ok(()),
            }
            let key = tick_key(id, tick);
            let kept = t.ticks.put_absent(&key, mine.clone()).await?;
            let mut decided = if kept == mine {
                if cancel && !last_job.is_empty() {
                    self.cancel_for_schedule(s, &last_job, &job_id);
                }
                mine
            } else {
                // Another replica decided this tick: its decision stands;
                // its job is submitted here only when it never was.
                let stale = now.saturating_sub(kept.decided_at.as_ref().map_or(0, timestamp_ms))
                    > TAKEOVER_MS;
                let gone = kept.outcome == TickOutcome::Started as i32
                    && matches!(
                        self.inner.book.record_of(&kept.job_id).await,
                        Err(ExecutorError::NotFound(_))
                    );
                if !gone {
                    adopt(t, id, &mut h, kept)?;
                    continue;
                }
                if !stale {
                    // Its replica is submitting it now.
                    return Ok(());
                }
                tracing::warn!(schedule_id = %id, job_id = %kept.job_id, decided_by = %kept.decided_by, "taking over a schedule tick whose job was never stored");
                kept
            };
            if decided.outcome == TickOutcome::Started as i32
                && let Err(e) = self.submit_tick(s, &decided.job_id, tick).await
            {
                tracing::warn!(schedule_id = %id, job_id = %decided.job_id, error = %e, "a schedule's tick could not start its job");
                decided.outcome = TickOutcome::Failed as i32;
                decided.error = e.to_string();
                t.ticks.put(&key, &decided)?;
            }
            adopt(t, id, &mut h, decided)?;
        }
        Ok(())
    }

    /// The job the latest started tick of `h` submitted, and its state
    /// (`None`: no such tick, or its job is gone).
    async fn previous_of(
        &self,
        h: &ScheduleHistory,
    ) -> Result<(String, Option<Previous>), ExecutorError> {
        let Some(last) = h
            .ticks
            .iter()
            .find(|t| t.outcome == TickOutcome::Started as i32)
        else {
            return Ok((String::new(), None));
        };
        let job = match self.inner.book.record_of(&last.job_id).await {
            Ok(job) => job,
            Err(ExecutorError::NotFound(_)) => return Ok((last.job_id.clone(), None)),
            Err(e) => return Err(e),
        };
        let previous = if job_state(job.state).is_terminal() {
            Previous::Finished(job.finished_at.as_ref().map_or(0, timestamp_ms))
        } else {
            Previous::Running
        };
        Ok((last.job_id.clone(), Some(previous)))
    }

    /// Submits tick `tick`'s job `job_id` as schedule `s`'s creator.
    async fn submit_tick(
        &self,
        s: &Schedule,
        job_id: &str,
        tick: u64,
    ) -> Result<(), ExecutorError> {
        let creator = owner_of(s);
        let mut spec = s.job.clone().unwrap_or_default();
        spec.job_id = job_id.to_owned();
        let correlation_id = switchyard_kit::context::new_correlation_id();
        let how = Submission {
            who: Some(creator.who),
            delegation_only: false,
            grant: None,
            budgets: creator.right,
            correlation_id: correlation_id.clone(),
            traceparent: None,
            rerun: None,
            fired: Some(Fired::Tick {
                schedule_id: s.schedule_id.clone(),
                tick_ms: tick,
            }),
        };
        let req = SubmitJobRequest {
            spec: Some(spec),
            ..Default::default()
        };
        let out = tokio::time::timeout(SUBMIT_LIMIT, self.submit_as(req, how))
            .await
            .map_err(|_| ExecutorError::Upstream {
                service: "executor",
                status: tonic::Status::deadline_exceeded("the submission did not finish in time"),
            })??;
        tracing::info!(
            schedule_id = %s.schedule_id,
            job_id,
            correlation_id = %correlation_id,
            created = out.created,
            "schedule tick started a job"
        );
        Ok(())
    }

    /// Cancels `previous` for schedule `s`, whose tick starts `next`
    /// (overlap CANCEL_PREVIOUS), in the background.
    fn cancel_for_schedule(&self, s: &Schedule, previous: &str, next: &str) {
        let who = owner_of(s).who;
        let me = self.clone();
        let previous = previous.to_owned();
        let why = format!(
            "cancelled by schedule {:?}: its next tick started job {next:?} (overlap cancel_previous)",
            s.schedule_id
        );
        tokio::spawn(async move {
            match me.cancel(&previous, &why, Some(who)).await {
                Ok(_) | Err(ExecutorError::Refused(_)) => {}
                Err(e) => {
                    tracing::warn!(job_id = %previous, error = %e, "cancelling a schedule's previous job")
                }
            }
        });
    }
}

/// Puts decided tick `tick` first in schedule `id`'s history `h` (once),
/// drops the oldest beyond [`HISTORY`] with their claims, and keeps it.
fn adopt(
    t: &super::Timetable,
    id: &str,
    h: &mut ScheduleHistory,
    tick: ScheduleTick,
) -> Result<(), ExecutorError> {
    if h.ticks.iter().any(|k| k.at == tick.at) {
        return Ok(());
    }
    h.ticks.insert(0, tick);
    h.ticks
        .sort_by_key(|k| std::cmp::Reverse(k.at.as_ref().map_or(0, timestamp_ms)));
    for old in h.ticks.drain(HISTORY.min(h.ticks.len())..) {
        t.ticks
            .remove(&tick_key(id, old.at.as_ref().map_or(0, timestamp_ms)))?;
    }
    t.history.put(id, h)?;
    Ok(())
}
