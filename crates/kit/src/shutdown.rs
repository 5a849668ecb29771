//! Shutdown signalling: one [`Trigger`] fires, every [`Shutdown`] clone sees it.
//! [`on_signals`] wires SIGINT/SIGTERM to a trigger; a second signal exits the
//! process at once.

use tokio::sync::watch;

/// Fires shutdown.
#[derive(Debug, Clone)]
pub struct Trigger(watch::Sender<bool>);

/// Observes shutdown; cheap to clone into every task that must stop.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// A new trigger and its observer.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Shutdown(rx))
}

impl Trigger {
    /// Starts shutdown (idempotent).
    pub fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// Completes once shutdown has started (at once if it already has).
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        // An error means the trigger is gone, which also means shutdown.
        let _ = rx.wait_for(|v| *v).await;
    }

    /// True once shutdown has started.
    pub fn is_shutdown(&self) -> bool {
        *self.0.borrow()
    }
}

impl Shutdown {
    /// Spawns a task that runs `tick` every `period` until shutdown, logging
    /// (as `what`) any error a tick returns; the next tick still runs.
    pub fn spawn_every<F, Fut, E>(
        &self,
        period: std::time::Duration,
        what: &'static str,
        mut tick: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), E>> + Send,
        E: std::fmt::Display,
    {
        let shutdown = self.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = interval.tick() => {
                        if let Err(e) = tick().await {
                            tracing::error!(error = %e, "{what} failed");
                        }
                    }
                    _ = shutdown.wait() => return,
                }
            }
        })
    }
}

/// Fires `trigger` on the first SIGINT or SIGTERM and exits the process with
/// status 130 on the second.
pub fn on_signals(trigger: Trigger) {
    tokio::spawn(async move {
        wait_signal().await;
        tracing::info!("shutdown requested; draining (send the signal again to exit at once)");
        trigger.fire();
        wait_signal().await;
        tracing::warn!("second signal: exiting now");
        std::process::exit(130);
    });
}

async fn wait_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_observer_sees_the_trigger() {
        let (t, s) = channel();
        let s2 = s.clone();
        assert!(!s.is_shutdown());
        let waiter = tokio::spawn(async move { s2.wait().await });
        t.fire();
        waiter.await.unwrap();
        assert!(s.is_shutdown());
        s.wait().await; // already fired: returns at once
    }
}
