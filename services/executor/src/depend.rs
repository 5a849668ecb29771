//! Calls to the other Switchyard services. One of them being down for a
//! while (a crash, a restart, a rolling deploy) is not the work's failure:
//! a call that meets an outage ([`is_outage`]: UNAVAILABLE, a connection
//! refused or dropped) is repeated with growing pauses, the job records
//! that it waits and for which service (`dependency.waiting`, reason
//! DEPENDENCY_UNAVAILABLE), and only a deadline ends the wait. A task's
//! retry policy is for the agent or command failing, never for this.
//!
//! Every call through here must be safe to repeat: they carry idempotency
//! keys, or are reads, or answer a repeat with "already so".

use std::time::Duration;

use switchyard_kit::error::is_outage;
use tonic::Status;

use crate::Executor;
use crate::events::{self, JobEvent};

/// A Switchyard service the executor depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    Ledger,
    Router,
    Approval,
    Registry,
}

impl Service {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Service::Ledger => "ledger",
            Service::Router => "router",
            Service::Approval => "approval",
            Service::Registry => "registry",
        }
    }
}

/// The pause before call `n + 1` to an unreachable service: 50 ms,
/// doubling, at most `max_ms`, less up to a fifth at random so waiters
/// do not all call at once when it comes back.
pub(crate) fn pause(n: u32, max_ms: u64, unit: f64) -> Duration {
    let ms = 50u64.saturating_mul(1 << n.min(20)).min(max_ms);
    Duration::from_millis(ms - (ms as f64 * 0.2 * unit.clamp(0.0, 1.0)) as u64)
}

/// Waits on behalf of a job (or of nobody), recording the wait in its
/// events, until the service answers, a deadline passes or the process
/// stops.
pub(crate) struct Waiter<'a> {
    x: &'a Executor,
    job_id: &'a str,
    task_id: &'a str,
    until_ms: Option<u64>,
}

impl Executor {
    /// A waiter for job `job_id` (and its task `task_id`, when not empty);
    /// an empty `job_id` records nothing.
    pub(crate) fn waiter<'a>(&'a self, job_id: &'a str, task_id: &'a str) -> Waiter<'a> {
        Waiter {
            x: self,
            job_id,
            task_id,
            until_ms: None,
        }
    }
}

impl Waiter<'_> {
    /// Gives up once the clock reads `deadline_ms` (none: waits for ever).
    pub(crate) fn until(mut self, deadline_ms: Option<u64>) -> Self {
        self.until_ms = deadline_ms;
        self
    }

    /// `op`, repeated while `service` cannot be reached. The error is
    /// returned as is when it is a refusal, or when the deadline passed or
    /// the process is stopping while it was still unreachable.
    pub(crate) async fn call<T, F, Fut>(&self, service: Service, mut op: F) -> Result<T, Status>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let book = &self.x.inner.book;
        let max_ms = self.x.inner.cfg.dependency_retry_max_ms;
        let mut since = None;
        let mut n = 0;
        loop {
            let err = match op().await {
                Err(e) if is_outage(&e) => e,
                answered => {
                    if let Some(since) = since {
                        self.recovered(service, book.now().saturating_sub(since));
                    }
                    return answered;
                }
            };
            let now = book.now();
            let left = self.until_ms.map(|d| d.saturating_sub(now));
            if left == Some(0) || self.x.inner.shutdown.is_shutdown() {
                return Err(err);
            }
            if since.is_none() {
                since = Some(now);
                self.waiting(service, err.message());
            }
            let mut delay = pause(n, max_ms, crate::driver::unit_random());
            if let Some(left) = left {
                delay = delay.min(Duration::from_millis(left));
            }
            n = n.saturating_add(1);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.x.inner.shutdown.wait() => return Err(err),
            }
        }
    }

    fn waiting(&self, service: Service, error: &str) {
        tracing::warn!(
            job_id = self.job_id,
            task_id = self.task_id,
            service = service.as_str(),
            error,
            "waiting for a service that cannot be reached"
        );
        self.note(JobEvent::DependencyWaiting(events::DependencyWaiting {
            service: service.as_str().to_owned(),
            error: error.to_owned(),
        }));
    }

    fn recovered(&self, service: Service, waited_ms: u64) {
        tracing::info!(
            job_id = self.job_id,
            service = service.as_str(),
            waited_ms,
            "service answered again"
        );
        self.note(JobEvent::DependencyRecovered(events::DependencyRecovered {
            service: service.as_str().to_owned(),
            waited_ms,
        }));
    }

    /// Records `ev` on the job waited for (nothing for nobody's waits).
    fn note(&self, ev: JobEvent) {
        if !self.job_id.is_empty() {
            self.x.inner.book.note(self.job_id, self.task_id, ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_from_50ms_up_to_the_ceiling_with_bounded_jitter() {
        let ms = |n, u| pause(n, 2_000, u).as_millis() as u64;
        assert_eq!([ms(0, 0.0), ms(1, 0.0), ms(2, 0.0)], [50, 100, 200]);
        assert_eq!(ms(6, 0.0), 2_000);
        assert_eq!(ms(40, 0.0), 2_000, "no overflow for long waits");
        assert_eq!(ms(6, 1.0), 1_600, "at most a fifth less");
        assert!((1_600..=2_000).contains(&ms(9, 0.5)));
    }
}
