//! The Switchyard stack in-process, for tests and benchmarks.
//!
//! [`Stack::start`] binds `127.0.0.1:0` first and hands the listener to the
//! same composition `switchyard dev` uses, with storage in a temporary
//! directory; [`Stack::stop`] shuts it down and waits for it. No fixed ports,
//! no sleeps: readiness is polled through `grpc.health.v1`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use switchyard_cli::{Config, ServiceKind, run_node};
use switchyard_kit::shutdown::Trigger;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A running in-process stack.
pub struct Stack {
    /// The bound address.
    pub addr: SocketAddr,
    /// `http://` URL of the bound address.
    pub url: String,
    trigger: Trigger,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Stack {
    /// Every service with default configuration.
    pub async fn start() -> anyhow::Result<Stack> {
        Self::start_with(ServiceKind::ALL, |_| {}).await
    }

    /// The given services, with `tweak` applied to the configuration.
    pub async fn start_with(
        services: &[ServiceKind],
        tweak: impl FnOnce(&mut Config),
    ) -> anyhow::Result<Stack> {
        let dir = tempfile::tempdir()?;
        let mut cfg = Config::default();
        cfg.storage.data_dir = dir.path().to_path_buf();
        cfg.server.listen = "127.0.0.1:0".into();
        tweak(&mut cfg);
        let listener = switchyard_kit::server::bind(&cfg.server).await?;
        let addr = listener.local_addr()?;
        let (trigger, shutdown) = switchyard_kit::shutdown::channel();
        let services = services.to_vec();
        let handle =
            tokio::spawn(async move { run_node(cfg, &services, listener, shutdown).await });
        let stack = Stack {
            addr,
            url: format!("http://{addr}"),
            trigger,
            handle,
            dir,
        };
        stack.wait_serving(Duration::from_secs(10)).await?;
        Ok(stack)
    }

    /// The data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// A connected channel.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        Ok(switchyard_kit::client::connect(&self.url).await?)
    }

    /// Polls the overall health status until SERVING.
    pub async fn wait_serving(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Ok(ch) = self.channel().await {
                let resp = HealthClient::new(ch)
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await;
                if resp.is_ok_and(|r| r.get_ref().status == ServingStatus::Serving as i32) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("stack at {} not serving within {limit:?}", self.url);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Shuts down and waits for the drain and storage flush.
    pub async fn stop(self) -> anyhow::Result<tempfile::TempDir> {
        self.trigger.fire();
        tokio::time::timeout(Duration::from_secs(15), self.handle)
            .await
            .context("stack did not stop within 15s")?
            .context("stack task panicked")??;
        Ok(self.dir)
    }
}
