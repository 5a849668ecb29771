//! Budget pauses: a job whose budget refused a task's reservation stops
//! spending and asks a person for more, instead of failing.
//!
//! Once the refused task is `budget_paused` and no attempt runs (the
//! scheduler starts nothing new meanwhile), the driver records
//! `budget.paused` — what ran out, the extension asked for, the tasks left
//! and an extension run id — and moves the job to `budget_paused`, durably.
//! It then proposes the extension run (for the job's submitter, so the
//! submitter cannot approve it; no policy approves it) and waits for its
//! decision, still renewing its claim on the job's run, and still
//! cancellable. The decision is recorded as `budget.extension_decided`:
//!
//! - **approved**: the job's budget limits are raised by the amounts (the
//!   new limits are in the event, so a restart sets the same ones again),
//!   the paused tasks are `ready` and the job `active`: it goes on where it
//!   stopped, and no finished task runs again;
//! - **rejected, withdrawn or undecided** by the deadline
//!   (`executor.budget_extension_timeout_secs`): the paused tasks fail with
//!   `BUDGET_EXTENSION_REJECTED` or `BUDGET_EXTENSION_TIMEOUT`, and the job
//!   ends `discarded` with what it finished.
//!
//! A restart while paused resumes the driver here: the run id is in the
//! log, its proposal is repeated idempotently, and a decision taken
//! before or after the restart is applied exactly once.

use std::pin::pin;

use switchyard_proto::common::v1::Money;
use switchyard_proto::ledger::v1 as lg;

use super::*;
use crate::attempt::gate::{Decided, decided, propose_for_person};
use crate::schedule::PauseEnd;

/// How the wait for an extension ended.
pub(super) enum Waited {
    /// Decided, and the decision is applied: step again.
    Decided,
    /// The job is being cancelled: the loop finishes it.
    Cancelled,
    /// Shutting down or draining: the pause goes on after the restart (or
    /// on the replica that takes the job over).
    Stopping,
}

/// What the last refusal of a paused task says about the extension to ask.
struct Ask {
    dimension: &'static str,
    tokens: u64,
    cost_micro_usd: i64,
}

impl Ask {
    /// The refused hold's shortfall, plus as much again as the hold asked
    /// for each task still to start after it; without the ledger's numbers
    /// (a model call that overran its hold), as much again as the job's
    /// own limit on what ran out.
    fn of(e: &crate::job::JobEntry, task_id: &str, reason: &str, later: u64, most: u64) -> Ask {
        let r = e.refusals.get(task_id).cloned().unwrap_or_default();
        let money = r.dimension == "cost" || reason == Reason::AgentCostBudgetExceeded.as_str();
        let spec = e.spec().budget.clone().unwrap_or_default();
        if money {
            let each = r.cost_micro_usd.unwrap_or(0).max(0);
            let mut cost = r
                .short_micro_usd
                .saturating_add(each.saturating_mul(later as i64));
            if cost <= 0 {
                cost = spec.cost_limit.map_or(each, |m| m.micro_usd).max(1);
            }
            return Ask {
                dimension: "cost",
                tokens: 0,
                cost_micro_usd: cost,
            };
        }
        let each = r.tokens.unwrap_or(0);
        let mut tokens = r.short_tokens.saturating_add(each.saturating_mul(later));
        if tokens == 0 {
            tokens = spec.token_budget.unwrap_or(most).max(1);
        }
        Ask {
            dimension: "tokens",
            tokens,
            cost_micro_usd: 0,
        }
    }
}

/// What pause `p` asks for, in words: `80 more tokens`, `40 micro-USD more`.
fn asked(p: &events::BudgetPaused) -> String {
    if p.dimension == "cost" {
        format!("{} micro-USD more", p.cost_micro_usd)
    } else {
        format!("{} more tokens", p.tokens)
    }
}

impl Driver {
    /// The job is paused (or pausing) for its budget: records the pause
    /// if it is new, asks for the extension, waits for the decision and
    /// applies it.
    pub(super) async fn budget_pause(
        &self,
        run_id: &str,
        renew: &mut tokio::time::Interval,
    ) -> Result<Waited, ExecutorError> {
        let Some((pause, decision)) = self.pause_recorded().await? else {
            return Ok(Waited::Decided);
        };
        if let Some(d) = decision {
            // Decided before a restart: applied again (idempotent).
            self.apply(&pause, &d).await?;
            return Ok(Waited::Decided);
        }
        let proposed = self.propose(&pause).await;
        // Waiting for a person runs nothing: the tenant's running-job slot
        // goes back meanwhile, and is taken again if the job goes on.
        if let Err(e) = self.x.inner.book.cluster.free_slot(&self.job_id).await {
            tracing::warn!(job_id = %self.job_id, error = %e, "giving the paused job's slot back");
        }
        let decided = match proposed {
            Err(why) => Decided {
                decision: "cancelled",
                by: String::new(),
                comment: format!("the approval service refused the extension run: {why}"),
            },
            Ok(()) => {
                let mut decision = pin!(decided(&self.x, &pause.run_id, pause.decide_by_ms));
                loop {
                    tokio::select! {
                        d = &mut decision => break match d {
                            Some(d) => d,
                            None => self.time_out(&pause.run_id).await,
                        },
                        _ = renew.tick() => {
                            if let Err(e) = self.renew(run_id).await {
                                tracing::warn!(job_id = %self.job_id, error = %e.message(), "renewing approval claim");
                            }
                        }
                        _ = self.ctl.wake.notified() => {
                            if crate::lock(&self.ctl.cancel).is_some() {
                                return Ok(Waited::Cancelled);
                            }
                        }
                        _ = self.x.inner.draining.wait(), if !self.x.draining() => {}
                        _ = self.x.inner.shutdown.wait() => return Ok(Waited::Stopping),
                    }
                    if self.x.draining() {
                        return Ok(Waited::Stopping);
                    }
                }
            }
        };
        let d = self.record_decision(&pause, &decided).await?;
        self.apply(&pause, &d).await?;
        if d.decision != "approved" {
            return Ok(Waited::Decided);
        }
        Ok(match self.take_slot().await? {
            Claimed::Yes => Waited::Decided,
            Claimed::Gone(..) => Waited::Cancelled,
            Claimed::Stopping => Waited::Stopping,
        })
    }

    /// The job's pause: the one recorded (after a restart), else a new one
    /// recorded now with the job's move to `budget_paused`, durably.
    /// `None` when no task is paused any more.
    async fn pause_recorded(
        &self,
    ) -> Result<Option<(events::BudgetPaused, Option<events::ExtensionDecided>)>, ExecutorError>
    {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let cfg = &self.x.inner.cfg;
        let (g, pause) = {
            let mut st = book.lock();
            let e = st.get(job_id)?;
            if e.state() == JobState::BudgetPaused
                && let Some((p, d)) = &e.pause
            {
                return Ok(Some((p.clone(), d.clone())));
            }
            let n = e.job.tasks.len();
            let Some(i) = (0..n).find(|&i| e.task_state(i) == TaskState::BudgetPaused) else {
                return Ok(None);
            };
            let t = &e.job.tasks[i];
            let remaining: Vec<String> = (0..n)
                .filter(|&k| !e.task_state(k).is_terminal())
                .map(|k| e.job.tasks[k].task_id.clone())
                .collect();
            let later = remaining.len().saturating_sub(1) as u64;
            let ask = Ask::of(e, &t.task_id, &t.reason, later, cfg.agent_max_tokens);
            let refusal = e.refusals.get(&t.task_id).cloned().unwrap_or_default();
            let reason = Reason::parse(&t.reason).unwrap_or(Reason::AgentTokenBudgetExceeded);
            let number = e.pause.as_ref().map_or(0, |(p, _)| p.number) + 1;
            let pause = events::BudgetPaused {
                run_id: format!("extend-{}", uuid::Uuid::now_v7()),
                number,
                dimension: ask.dimension.to_owned(),
                refused_by: refusal.refused_by,
                message: t.error.clone(),
                tokens: ask.tokens,
                cost_micro_usd: ask.cost_micro_usd,
                remaining_tasks: remaining,
                decide_by_ms: book
                    .now()
                    .saturating_add(cfg.budget_extension_timeout_secs.saturating_mul(1000)),
            };
            let error = format!(
                "task {} stopped: {}; extension run {} asks for {} (switchyard job resume {job_id})",
                t.task_id,
                t.error,
                pause.run_id,
                asked(&pause)
            );
            book.record(&mut st, job_id, "", JobEvent::BudgetPaused(pause.clone()));
            let g = book.move_job(&mut st, job_id, JobState::BudgetPaused, reason, &error)?;
            (g, pause)
        };
        book.durable(g).await?;
        tracing::info!(job_id, run_id = %pause.run_id, "job paused by its budget; extension asked");
        Ok(Some((pause, None)))
    }

    /// Proposes the extension run for the job's submitter (idempotent: the
    /// same run after a restart). A refusal is returned; an unreachable
    /// approval service is waited for.
    async fn propose(&self, p: &events::BudgetPaused) -> Result<(), String> {
        let job_id = self.job_id.as_str();
        let x = &self.x;
        let (org, job_run, hash, budget_id, correlation_id) = {
            let st = x.inner.book.lock();
            let e = st.get(job_id).map_err(|e| e.to_string())?;
            (
                e.spec().labels.get("org").cloned(),
                e.job.run_id.clone(),
                e.context_hash.clone(),
                e.job.budget_id.clone(),
                e.spec().correlation_id.clone(),
            )
        };
        let cost = (p.cost_micro_usd > 0).then_some(Money {
            micro_usd: p.cost_micro_usd,
        });
        let run = ap::Run {
            schema_version: "agent_run_spec/v1".into(),
            run_id: p.run_id.clone(),
            target: Some(ap::Target {
                org: org.unwrap_or_else(|| x.inner.cfg.default_org.clone()),
                repo: String::new(),
                work_item_ids: vec![job_id.to_owned()],
            }),
            intent: format!(
                "extend the budget of job {job_id} by {} to finish {}",
                asked(p),
                p.remaining_tasks.join(", ")
            ),
            context_pack: Some(ap::ContextPack {
                pack_id: job_id.to_owned(),
                hash,
                version: "budget_extension/v1".into(),
                inputs: p.remaining_tasks.clone(),
            }),
            model: "none".into(),
            max_tokens: p.tokens.max(1),
            cost_estimate: Some(ap::CostEstimate {
                estimated_output_tokens: p.tokens,
                estimated_cost: cost,
                ..Default::default()
            }),
            tools_allowed: vec!["none".into()],
            outputs_allowed: vec!["budget_extension".into()],
            correlation_id,
            extension: Some(ap::BudgetExtension {
                job_id: job_id.to_owned(),
                budget_id,
                dimension: p.dimension.clone(),
                refused_by: p.refused_by.clone(),
                message: p.message.clone(),
                tokens: p.tokens,
                cost,
                remaining_tasks: p.remaining_tasks.clone(),
                job_run_id: job_run,
                number: p.number,
            }),
            ..Default::default()
        };
        // A person decides: no policy extends a budget.
        propose_for_person(x, &x.waiter(job_id, ""), run).await
    }

    /// Nobody decided in time: the run is withdrawn.
    async fn time_out(&self, run_id: &str) -> Decided {
        let secs = self.x.inner.cfg.budget_extension_timeout_secs;
        let comment =
            format!("no decision within {secs} s (executor.budget_extension_timeout_secs)");
        self.x
            .cancel_run_by_id(run_id.to_owned(), &comment, None)
            .await;
        Decided {
            decision: "timed_out",
            by: String::new(),
            comment,
        }
    }

    /// Records the decision, durably. Approved: with the job budget's
    /// limits raised by the amounts, read from the ledger now and kept in
    /// the event, so applying it again sets the same limits.
    async fn record_decision(
        &self,
        p: &events::BudgetPaused,
        d: &Decided,
    ) -> Result<events::ExtensionDecided, ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let mut ev = events::ExtensionDecided {
            run_id: p.run_id.clone(),
            decision: d.decision.to_owned(),
            by: d.by.clone(),
            comment: d.comment.clone(),
            token_limit: None,
            cost_limit_micro_usd: None,
            granted_tokens: None,
            granted_cost_micro_usd: None,
        };
        if d.decision == "approved" {
            // The approver may have granted other amounts than asked.
            let (tokens, cost) = self.granted(p).await?;
            ev.granted_tokens = Some(tokens);
            ev.granted_cost_micro_usd = Some(cost);
            let budget_id = book.lock().get(job_id)?.job.budget_id.clone();
            let ledger = &self.x.inner.clients.ledger;
            let get = lg::GetBudgetRequest { budget_id };
            let b = self
                .x
                .waiter(job_id, "")
                .call(Service::Ledger, || ledger.get_budget(get.clone()))
                .await
                .map_err(|status| ExecutorError::Upstream {
                    service: "ledger",
                    status,
                })?
                .budget
                .unwrap_or_default();
            // A limit the budget does not have is not raised (nothing ran
            // out there: an enclosing budget did).
            if tokens > 0 {
                ev.token_limit = b.token_limit.map(|l| l.saturating_add(tokens));
            }
            if cost > 0 {
                ev.cost_limit_micro_usd = b.cost_limit.map(|l| l.micro_usd.saturating_add(cost));
            }
        }
        let g = {
            let mut st = book.lock();
            book.record(&mut st, job_id, "", JobEvent::ExtensionDecided(ev.clone()))
        };
        book.durable(g).await?;
        tracing::info!(job_id, run_id = %p.run_id, decision = %d.decision, by = %d.by, "budget extension decided");
        Ok(ev)
    }

    /// What the approved extension run `p.run_id` grants: the approver's
    /// scope (`Run.scope`), else what `p` asked.
    async fn granted(&self, p: &events::BudgetPaused) -> Result<(u64, i64), ExecutorError> {
        let approval = &self.x.inner.clients.approval;
        let get = ap::GetRunRequest {
            run_id: p.run_id.clone(),
        };
        let run = self
            .x
            .waiter(&self.job_id, "")
            .call(Service::Approval, || approval.get_run(get.clone()))
            .await
            .map_err(|status| ExecutorError::Upstream {
                service: "approval",
                status,
            })?
            .run
            .unwrap_or_default();
        Ok(match run.scope {
            Some(s) => (s.tokens, s.cost.map_or(0, |m| m.micro_usd)),
            None => (p.tokens, p.cost_micro_usd),
        })
    }

    /// A job approved up to a scope draws from a hold: an approved
    /// extension is a new hold of its amounts (the scope's own for the
    /// dimension it does not raise), placed before the old one is released,
    /// so what the job was approved for is never up for grabs. Repeating it
    /// (after a restart) finds the same hold.
    async fn extend_scope(
        &self,
        p: &events::BudgetPaused,
        (more_tokens, more_cost): (u64, i64),
    ) -> Result<(), ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let (old, (tokens, cost)) = {
            let st = book.lock();
            let e = st.get(job_id)?;
            (e.scope_hold.clone(), e.scope_amounts)
        };
        if old.is_empty() {
            return Ok(());
        }
        let scope = ap::ApprovalScope {
            tokens: if more_tokens > 0 { more_tokens } else { tokens },
            cost: Some(Money {
                micro_usd: if more_cost > 0 { more_cost } else { cost },
            }),
            // As long as a hold stands.
            until: None,
        };
        let held = self.x.hold_scope(job_id, &p.run_id, &scope).await?;
        let placed = !held.reservation_id.is_empty() && held.reservation_id != old;
        let g = {
            let mut st = book.lock();
            book.record(&mut st, job_id, "", JobEvent::ScopeHeld(held))
        };
        book.durable(g).await?;
        if placed {
            let hold = switchyard_api::spend::Hold::resume(&self.x.inner.clients.ledger, &old);
            crate::attempt::release(
                &self.x,
                job_id,
                "",
                &hold,
                "replaced by the extension's hold",
            )
            .await;
        }
        Ok(())
    }

    /// Applies a recorded decision: approved, the budget is raised and the
    /// job goes on; else its paused tasks fail (and the job ends).
    async fn apply(
        &self,
        p: &events::BudgetPaused,
        d: &events::ExtensionDecided,
    ) -> Result<(), ExecutorError> {
        let job_id = self.job_id.as_str();
        let book = &self.x.inner.book;
        let approved = d.decision == "approved";
        if approved && (d.token_limit.is_some() || d.cost_limit_micro_usd.is_some()) {
            let budget_id = book.lock().get(job_id)?.job.budget_id.clone();
            let req = lg::UpdateLimitsRequest {
                budget_id,
                token_limit: d.token_limit,
                cost_limit: d.cost_limit_micro_usd.map(|micro_usd| Money { micro_usd }),
                remove_token_limit: false,
                remove_cost_limit: false,
            };
            let ledger = &self.x.inner.clients.ledger;
            if let Err(e) = self
                .x
                .waiter(job_id, "")
                .call(Service::Ledger, || ledger.update_limits(req.clone()))
                .await
            {
                // The job goes on; its next reservation pauses it again,
                // with the ledger's numbers.
                tracing::warn!(job_id, error = %e.message(), "raising the job's budget after its extension");
            }
        }
        if approved {
            self.extend_scope(p, d.granted(p)).await?;
        }
        let by = if d.by.is_empty() {
            String::new()
        } else {
            format!(" by {}", d.by)
        };
        let comment = if d.comment.is_empty() {
            String::new()
        } else {
            format!(": {}", d.comment)
        };
        let why = format!(
            "the budget extension run {} was {}{by}{comment}",
            p.run_id,
            d.decision.replace('_', " ")
        );
        let end = match d.decision.as_str() {
            "approved" => PauseEnd::Approved,
            "timed_out" => PauseEnd::Refused(Reason::BudgetExtensionTimeout, &why),
            _ => PauseEnd::Refused(Reason::BudgetExtensionRejected, &why),
        };
        let g = {
            let mut st = book.lock();
            let mut g = book.last();
            for m in schedule::end_pause(st.get(job_id)?, end) {
                g = book.move_task(&mut st, job_id, m.task, m.change())?;
            }
            if approved && st.get(job_id)?.state() == JobState::BudgetPaused {
                g = book.move_job(
                    &mut st,
                    job_id,
                    JobState::Active,
                    Reason::InvalidArgument,
                    "",
                )?;
            }
            g
        };
        book.durable(g).await
    }
}
