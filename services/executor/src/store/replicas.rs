//! One executor replica among many on PostgreSQL: claiming jobs while it
//! has room, dropping the ones another replica took over, acting on cancel
//! requests made on other replicas, taking the messages and answers sent
//! through them (`crate::relay`), and the maintenance (outbox sweep,
//! pruning) that one elected replica does for all.

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::lifecycle::JobState;
use switchyard_kit::auth::OnBehalf;

use super::pg::PgJobs;
use crate::Executor;

/// A cancel request as stored on a job's row.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CancelAsk {
    /// Why.
    #[prost(string, tag = "1")]
    pub(crate) why: String,
    /// Whom the cancel acts for (empty subject: the job's submitter).
    #[prost(string, tag = "2")]
    pub(crate) subject: String,
    #[prost(string, tag = "3")]
    pub(crate) tenant: String,
    #[prost(string, tag = "4")]
    pub(crate) kind: String,
}

impl CancelAsk {
    pub(crate) fn new(why: &str, who: Option<&OnBehalf>) -> CancelAsk {
        CancelAsk {
            why: why.to_owned(),
            subject: who.map(|w| w.subject.clone()).unwrap_or_default(),
            tenant: who.map(|w| w.tenant.clone()).unwrap_or_default(),
            kind: who.map(|w| w.kind.as_str().to_owned()).unwrap_or_default(),
        }
    }

    fn who(&self) -> Option<OnBehalf> {
        (!self.subject.is_empty()).then(|| OnBehalf {
            subject: self.subject.clone(),
            tenant: self.tenant.clone(),
            kind: switchyard_kit::auth::Kind::parse(&self.kind)
                .unwrap_or(switchyard_kit::auth::Kind::Human),
        })
    }
}

impl Executor {
    /// Starts the replica's background work (see the module docs).
    pub(crate) fn start_replica(&self, pg: Arc<PgJobs>) {
        tokio::spawn(pg.clone().run_writer());
        tokio::spawn(pg.clone().run_listener());
        let me = self.clone();
        let claims = pg.clone();
        tokio::spawn(async move { me.claim_in_background(&claims).await });
        // Jobs taken over elsewhere, cancel requests and relayed requests:
        // each acted on as its notification comes.
        self.on_each_woken(
            &pg,
            |p| &p.lost_wake,
            PgJobs::take_lost,
            |me, _, id| async move {
                me.inner.book.drop_job(&id, true);
            },
        );
        self.on_each_woken(
            &pg,
            |p| &p.cancel_wake,
            PgJobs::take_cancels,
            |me, pg, id| async move {
                me.cancel_as_asked(&pg, &id).await;
            },
        );
        self.on_each_woken(
            &pg,
            |p| &p.delivery_wake,
            PgJobs::take_deliveries,
            |me, pg, id| async move { me.deliver_relayed(&pg, &id).await },
        );
    }

    /// Runs until shutdown: each time `wake` of `pg` is notified, `act` on
    /// every job `take` hands over, one after another.
    fn on_each_woken<F, Fut>(
        &self,
        pg: &Arc<PgJobs>,
        wake: fn(&PgJobs) -> &tokio::sync::Notify,
        take: fn(&PgJobs) -> Vec<String>,
        act: F,
    ) where
        F: Fn(Executor, Arc<PgJobs>, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let (me, pg) = (self.clone(), pg.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = wake(&pg).notified() => {}
                    _ = me.inner.shutdown.wait() => return,
                }
                for id in take(&pg) {
                    act(me.clone(), pg.clone(), id).await;
                }
            }
        });
    }

    /// Runs until shutdown: claims jobs while this replica has room, on a
    /// notification, when room frees up, and every fifth of a lease.
    async fn claim_in_background(&self, pg: &PgJobs) {
        let every = Duration::from_millis((self.inner.cfg.job_lease_ms / 5).max(50));
        let mut finishes = self.inner.book.finishes();
        loop {
            let room = self
                .inner
                .cfg
                .max_running_jobs
                .saturating_sub(self.inner.book.lock().drivers.len());
            match pg.claim(room).await {
                Ok(claimed) => {
                    let full = !claimed.is_empty() && claimed.len() == room;
                    for (id, epoch) in claimed {
                        self.take_over(pg, &id, epoch).await;
                    }
                    if full {
                        // More may be waiting: claim again once room frees.
                        tokio::select! {
                            _ = finishes.changed() => {}
                            _ = tokio::time::sleep(every) => {}
                            _ = self.inner.shutdown.wait() => return,
                        }
                        continue;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "claiming jobs"),
            }
            tokio::select! {
                _ = pg.claim_wake.notified() => {}
                _ = tokio::time::sleep(every) => {}
                _ = self.inner.shutdown.wait() => return,
            }
        }
    }

    /// Runs job `id`, just claimed at `epoch`: rebuilt from its events and
    /// driven from where they stop (a task that was running runs again
    /// with the same idempotency key; finished tasks never do).
    async fn take_over(&self, pg: &PgJobs, id: &str, epoch: i64) {
        match self.inner.book.adopt(id, epoch, false).await {
            Ok(state) => {
                tracing::info!(job_id = %id, %state, epoch, "job taken over");
                if matches!(
                    state,
                    JobState::Available | JobState::Active | JobState::BudgetPaused
                ) {
                    self.spawn_driver(id);
                }
                self.cancel_as_asked(pg, id).await;
                // Messages and answers sent through other replicas while
                // no one (or the last holder) ran it.
                pg.deliveries_wanted(id);
            }
            Err(e) => {
                tracing::warn!(job_id = %id, error = %e, "taking over a job; handing it back");
                self.inner.book.drop_job(id, false);
            }
        }
    }

    /// Acts on a cancel request stored for job `id` (made on any replica),
    /// once.
    async fn cancel_as_asked(&self, pg: &PgJobs, id: &str) {
        if pg.holds(id).is_none() || crate::lock(&self.inner.cancels_seen).contains(id) {
            return;
        }
        let ask = match pg.cancel_request(id).await {
            Ok(Some(bytes)) => match <CancelAsk as prost::Message>::decode(bytes.as_slice()) {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(job_id = %id, error = %e, "an unreadable cancel request");
                    return;
                }
            },
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(job_id = %id, error = %e, "reading a cancel request");
                return;
            }
        };
        crate::lock(&self.inner.cancels_seen).insert(id.to_owned());
        let me = self.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            if let Err(e) = me.cancel_here(&id, &ask.why, ask.who()).await {
                tracing::debug!(job_id = %id, error = %e, "cancel request");
            }
            // Acted on: the job has ended (or left this replica), so a
            // later notice finds no lease here; the set stays small.
            crate::lock(&me.inner.cancels_seen).remove(&id);
        });
    }

    /// Whether this member does the maintenance shared by all (always on
    /// one node; among replicas, the holder of the maintenance lease).
    pub(crate) async fn maintains(&self) -> bool {
        let ttl = self
            .inner
            .cfg
            .dependency_retry_max_ms
            .max(self.inner.cfg.job_lease_ms)
            .saturating_mul(3);
        let now = self.inner.book.now();
        self.inner.book.cluster.maintains(now, ttl).await
    }
}
