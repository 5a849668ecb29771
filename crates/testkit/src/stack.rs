//! The in-process stack.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use switchyard_auth::credentials::Credentials;
use switchyard_cli::{Config, ServiceKind, run_node};
use switchyard_kit::client::{Credential, Intercepted, authed};
use switchyard_kit::shutdown::Trigger;
use switchyard_proto::auth::v1::auth_service_client::AuthServiceClient;
use switchyard_proto::auth::v1::{CreateKeyRequest, PrincipalKind, StartSessionRequest};
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
    /// The gateway's AITP REST door, when the stack hosts the gateway.
    pub http: Option<SocketAddr>,
    /// The gateway's RESP door, when the stack hosts the gateway.
    pub resp: Option<SocketAddr>,
    trigger: Trigger,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    dir: tempfile::TempDir,
    tokens: std::collections::BTreeMap<String, String>,
    /// How long stopping may take: what the configuration lets the drain
    /// take (running attempts' grace, then the doors' drain), plus the
    /// flush.
    stop_within: Duration,
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
        // The `switchyard dev` composition, dev credentials included, plus a
        // cluster service token tests can act as (`operator`).
        cfg.auth.dev_credentials = Some(true);
        // Agents, MCP servers and A2A agents of tests listen on 127.0.0.1.
        cfg.registry.egress.allow_loopback = Some(true);
        // Stopping waits at most this long for running attempts.
        cfg.executor.drain_grace_ms = 2_000;
        // 256 random bits, as an API key's secret.
        let service_token = switchyard_kit::auth::keys::generate()?.token;
        let token_file = dir.path().join("service-token");
        std::fs::write(&token_file, &service_token)?;
        cfg.auth.service_token_file = Some(token_file);
        tweak(&mut cfg);
        // Every listener (the gRPC port, the gateway's doors) on a free
        // port, bound here and handed over.
        let listeners = switchyard_cli::Listeners::bind(&cfg, services).await?;
        let addresses = listeners.addresses()?;
        let addr = addresses.grpc;
        let (trigger, shutdown) = switchyard_kit::shutdown::channel();
        // Every deployment has an identity source: a stack of any services
        // also hosts the auth service.
        let mut services = services.to_vec();
        if !services.contains(&ServiceKind::Auth) {
            services.insert(0, ServiceKind::Auth);
        }
        let data_dir = cfg.storage.data_dir.clone();
        let stop_within =
            Duration::from_millis(cfg.executor.drain_grace_ms + cfg.server.drain_timeout_ms)
                + Duration::from_secs(10);
        let handle =
            tokio::spawn(async move { run_node(cfg, &services, listeners, shutdown).await });
        let mut stack = Stack {
            addr,
            url: format!("http://{addr}"),
            http: addresses.http,
            resp: addresses.resp,
            trigger,
            handle,
            dir,
            tokens: Default::default(),
            stop_within,
        };
        if let Err(waited) = stack.wait_serving(Duration::from_secs(10)).await {
            // A node that ended while starting says why.
            if stack.handle.is_finished() {
                return Err(match (&mut stack.handle).await {
                    Ok(Err(e)) => e.context("the stack stopped while starting"),
                    Ok(Ok(())) => anyhow::anyhow!("the stack stopped before it served"),
                    Err(e) => anyhow::Error::new(e).context("the stack's task panicked"),
                });
            }
            return Err(waited);
        }
        let creds = data_dir.join(switchyard_auth::credentials::FILE);
        if creds.exists() {
            let creds = Credentials::read(&creds).map_err(anyhow::Error::msg)?;
            for (name, e) in &creds.principals {
                stack.tokens.insert(name.clone(), e.token.clone());
            }
            let tester = stack
                .key(
                    "tester",
                    &["submitter", "operator", "admin", "agent", "viewer"],
                    PrincipalKind::Human,
                )
                .await?;
            stack.tokens.insert("tester".into(), tester);
        }
        stack.tokens.insert("operator".into(), service_token);
        Ok(stack)
    }

    /// The token of a named principal: `admin`, `alice` (submitter), `bob`
    /// (approver), `agents` (agent), `tester` (every role but approver), and
    /// `operator`: the cluster's service token (a service principal across
    /// tenants, as the services present to each other).
    pub fn token(&self, name: &str) -> anyhow::Result<String> {
        self.tokens
            .get(name)
            .cloned()
            .with_context(|| format!("the stack has no principal {name:?}"))
    }

    /// Creates an API key in tenant `default` (as admin) and returns its token.
    pub async fn key(
        &self,
        subject: &str,
        roles: &[&str],
        kind: PrincipalKind,
    ) -> anyhow::Result<String> {
        let admin = authed(
            self.raw_channel().await?,
            Some(Credential::bearer(&self.token("admin")?)?),
        );
        let made = AuthServiceClient::new(admin)
            .create_key(CreateKeyRequest {
                subject: subject.into(),
                roles: roles.iter().map(|r| (*r).to_owned()).collect(),
                kind: kind as i32,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(made.secret)
    }

    /// A channel authenticated with `token`.
    pub async fn channel_with(&self, token: &str) -> anyhow::Result<Intercepted> {
        Ok(authed(
            self.raw_channel().await?,
            Some(Credential::bearer(token)?),
        ))
    }

    /// A session started with `token` (what the console's sign-in keeps in
    /// its cookie): its bearer secret.
    pub async fn session(&self, token: &str) -> anyhow::Result<String> {
        let mut auth = AuthServiceClient::new(self.channel_with(token).await?);
        Ok(auth
            .start_session(StartSessionRequest {
                ttl_secs: 3600,
                description: "test".into(),
            })
            .await?
            .into_inner()
            .secret)
    }

    /// A channel authenticated as the named principal (see [`Stack::token`]).
    pub async fn channel_as(&self, name: &str) -> anyhow::Result<Intercepted> {
        self.channel_with(&self.token(name)?).await
    }

    /// The data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// A connected channel carrying no credential.
    pub async fn raw_channel(&self) -> anyhow::Result<Channel> {
        Ok(switchyard_kit::client::connect(&self.url).await?)
    }

    /// A connected channel authenticated as `tester` (every role but
    /// approver); anonymous on a stack without the auth service.
    pub async fn channel(&self) -> anyhow::Result<Intercepted> {
        match self.tokens.get("tester") {
            Some(t) => self.channel_with(t).await,
            None => Ok(authed(self.raw_channel().await?, None)),
        }
    }

    /// Polls the overall health status until SERVING.
    pub async fn wait_serving(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Ok(ch) = self.raw_channel().await {
                let resp = HealthClient::new(ch)
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await;
                if resp.is_ok_and(|r| r.get_ref().status == ServingStatus::Serving as i32) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline || self.handle.is_finished() {
                anyhow::bail!("stack at {} not serving within {limit:?}", self.url);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Shuts down and waits for the drain and storage flush.
    pub async fn stop(self) -> anyhow::Result<tempfile::TempDir> {
        self.trigger.fire();
        let within = self.stop_within;
        tokio::time::timeout(within, self.handle)
            .await
            .with_context(|| {
                format!(
                    "the stack did not stop within {within:?} (its drain budget, \
                     executor.drain_grace_ms + server.drain_timeout_ms, and 10 s to flush)"
                )
            })?
            .context("stack task panicked")??;
        Ok(self.dir)
    }
}
