//! Write a Switchyard agent in Rust in a few lines.
//!
//! Implement [`Agent`] (a descriptor and `invoke`), then call [`serve`]: it
//! binds the address, serves `switchyard.agent.v1.AgentService` (with health
//! and reflection), registers the agent with the registry at its real
//! endpoint, heartbeats to keep the lease, and deregisters on SIGINT/SIGTERM.
//! The executor hosts its built-in agents with the same [`AgentServer`].
//!
//! ```ignore
//! struct Upper;
//! #[tonic::async_trait]
//! impl Agent for Upper {
//!     async fn invoke(&self, req: Invocation, _p: Progress) -> AgentResponse {
//!         respond::success(req.text("text").to_uppercase(), None)
//!     }
//! }
//! serve(Upper, spec, ServeOptions::default()).await?;
//! ```

use std::sync::Arc;
use std::time::Duration;

use switchyard_api::RegistryClient;
use switchyard_kit::server::{Server, ServerConfig};
use switchyard_kit::shutdown::{self, Shutdown};
use switchyard_proto::agent::v1::agent_service_server::{AgentService, AgentServiceServer};
use switchyard_proto::agent::v1::invoke_response::Message;
use switchyard_proto::agent::v1::{
    AgentResponse, DescribeRequest, DescribeResponse, InvokeRequest, InvokeResponse,
    Progress as ProgressMsg, ResponseStatus,
};
use switchyard_proto::registry::v1::{
    AgentSpec, DeregisterAgentRequest, HeartbeatRequest, RegisterAgentRequest,
    RegisterAgentResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The input of one invocation, with helpers to read its fields.
pub type Invocation = InvokeRequest;

/// What an agent does.
#[tonic::async_trait]
pub trait Agent: Send + Sync + 'static {
    /// Handles one task. Send progress through `progress`; return exactly one
    /// final response (see [`respond`]).
    async fn invoke(&self, req: Invocation, progress: Progress) -> AgentResponse;
}

/// Sends progress messages of one invocation to the caller.
#[derive(Debug, Clone)]
pub struct Progress(mpsc::Sender<Result<InvokeResponse, Status>>);

impl Progress {
    /// Reports progress; a caller that went away is ignored.
    pub async fn send(&self, message: impl Into<String>, percent: Option<u32>) {
        self.emit(message.into(), percent, String::new()).await;
    }

    /// Streams a chunk of output.
    pub async fn chunk(&self, text: impl Into<String>) {
        self.emit(String::new(), None, text.into()).await;
    }

    /// Reports progress without waiting: dropped if the caller is slow.
    pub fn note(&self, message: impl Into<String>) {
        let _ = self.0.try_send(Ok(InvokeResponse {
            message: Some(Message::Progress(ProgressMsg {
                message: message.into(),
                percent: None,
                output_chunk: String::new(),
            })),
        }));
    }

    async fn emit(&self, message: String, percent: Option<u32>, output_chunk: String) {
        let msg = InvokeResponse {
            message: Some(Message::Progress(ProgressMsg {
                message,
                percent,
                output_chunk,
            })),
        };
        let _ = self.0.send(Ok(msg)).await;
    }
}

/// Builders for the final response.
pub mod respond {
    use super::*;

    /// Done, with text and optional structured output.
    pub fn success(content: impl Into<String>, output: Option<serde_json::Value>) -> AgentResponse {
        AgentResponse {
            status: ResponseStatus::Success as i32,
            content: content.into(),
            output: output
                .as_ref()
                .and_then(switchyard_kit::json::json_to_struct),
            ..Default::default()
        }
    }

    /// Failed; the caller may retry.
    pub fn error(error: impl Into<String>) -> AgentResponse {
        AgentResponse {
            status: ResponseStatus::Error as i32,
            error: error.into(),
            ..Default::default()
        }
    }

    /// Cannot handle this task; the caller should route elsewhere.
    pub fn refused(why: impl Into<String>) -> AgentResponse {
        AgentResponse {
            status: ResponseStatus::Refused as i32,
            error: why.into(),
            ..Default::default()
        }
    }
}

/// Reads a string field of the invocation input (empty when absent).
pub fn input_text(req: &Invocation, field: &str) -> String {
    input_json(req)
        .get(field)
        .map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}

/// The invocation input as JSON (an empty object when absent).
pub fn input_json(req: &Invocation) -> serde_json::Value {
    req.input
        .as_ref()
        .map(switchyard_kit::json::struct_to_json)
        .unwrap_or_else(|| serde_json::json!({}))
}

/// Adapts an [`Agent`] to the generated `AgentService`.
pub struct AgentServer<A> {
    agent: Arc<A>,
    describe: DescribeResponse,
}

impl<A> std::fmt::Debug for AgentServer<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentServer")
            .field("name", &self.describe.name)
            .finish()
    }
}

impl<A: Agent> AgentServer<A> {
    /// Serves `agent`, describing it as `spec` says.
    pub fn new(agent: A, spec: &AgentSpec) -> Self {
        AgentServer {
            agent: Arc::new(agent),
            describe: DescribeResponse {
                name: spec.name.clone(),
                description: spec.description.clone(),
                integration_mode: spec.integration_mode,
                capabilities: spec.capabilities.iter().map(|c| c.name.clone()).collect(),
            },
        }
    }

    /// The tonic service to mount on a server.
    pub fn into_service(self, max_message_bytes: usize) -> AgentServiceServer<Self> {
        AgentServiceServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

#[tonic::async_trait]
impl<A: Agent> AgentService for AgentServer<A> {
    async fn describe(
        &self,
        _req: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(self.describe.clone()))
    }

    type InvokeStream = ReceiverStream<Result<InvokeResponse, Status>>;

    async fn invoke(
        &self,
        req: Request<InvokeRequest>,
    ) -> Result<Response<Self::InvokeStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        let agent = self.agent.clone();
        let req = req.into_inner();
        tokio::spawn(async move {
            let progress = Progress(tx.clone());
            let response = agent.invoke(req, progress).await;
            let _ = tx
                .send(Ok(InvokeResponse {
                    message: Some(Message::Response(response)),
                }))
                .await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

pub mod delegation;
pub mod tools;
pub mod worker;

/// Errors serving or registering.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// Binding or serving failed.
    #[error("serving: {0}")]
    Serve(#[from] switchyard_kit::server::ServerError),
    /// The registry URL is invalid or unreachable.
    #[error("registry: {0}")]
    Client(#[from] switchyard_kit::client::ClientError),
    /// The registry refused the registration.
    #[error("registering: {0}")]
    Register(Status),
    /// The listener's address could not be read.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

/// Where to listen and register.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to bind (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// Endpoint to register; empty = `http://<bound address>`.
    pub advertise: String,
    /// Registry (or `switchyard dev`) URL.
    pub registry_url: String,
    /// The agent's API key (role `agent`), sent as a bearer token to the
    /// registry. Binaries usually take it from `SWITCHYARD_TOKEN`.
    pub credential: Option<switchyard_kit::client::Credential>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: "127.0.0.1:0".into(),
            advertise: String::new(),
            registry_url: "http://127.0.0.1:7600".into(),
            credential: None,
        }
    }
}

/// Keeps `spec` registered until `shutdown`, then deregisters it. Heartbeats
/// at a third of the lease; re-registers if the registry lost the agent.
/// Every agent host uses this: SDK agents, declarative agents and the
/// executor's built-ins.
pub async fn keep_registered(
    registry: RegistryClient,
    spec: AgentSpec,
    shutdown: Shutdown,
) -> Result<(), SdkError> {
    keep_registered_updating(registry, spec, shutdown, |_| std::future::ready(None)).await
}

/// Registers `spec`, retrying while the registry is unreachable (it may
/// start after its agents); a refusal (bad credential, invalid spec) is
/// returned at once. `None` when shutdown came first.
async fn register_first(
    registry: &RegistryClient,
    spec: &AgentSpec,
    shutdown: &Shutdown,
) -> Result<Option<RegisterAgentResponse>, SdkError> {
    let mut backoff = Duration::from_millis(100);
    loop {
        let req = RegisterAgentRequest {
            agent: Some(spec.clone()),
        };
        match registry.register_agent(req).await {
            Ok(r) => return Ok(Some(r)),
            Err(s) if s.code() == tonic::Code::Unavailable => {
                tracing::debug!(agent_id = %spec.id, error = %s.message(), "registry unreachable; will retry");
            }
            Err(s) => return Err(SdkError::Register(s)),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.wait() => return Ok(None),
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// [`keep_registered`], asking `update` at each heartbeat whether the
/// registration should change: `Some(spec)` registers that spec instead
/// (which renews the lease too), `None` heartbeats as usual.
pub async fn keep_registered_updating<F, Fut>(
    registry: RegistryClient,
    mut spec: AgentSpec,
    shutdown: Shutdown,
    mut update: F,
) -> Result<(), SdkError>
where
    F: FnMut(&AgentSpec) -> Fut,
    Fut: std::future::Future<Output = Option<AgentSpec>>,
{
    let register = |spec: AgentSpec| {
        let registry = registry.clone();
        async move {
            registry
                .register_agent(RegisterAgentRequest { agent: Some(spec) })
                .await
        }
    };
    let Some(lease) = register_first(&registry, &spec, &shutdown).await? else {
        return Ok(());
    };
    let ttl = lease
        .lease
        .and_then(|l| l.ttl)
        .map(|d| Duration::from_secs(d.seconds.max(1) as u64))
        .unwrap_or(Duration::from_secs(10));
    tracing::info!(agent_id = %spec.id, endpoint = %spec.endpoint, "agent registered");
    let mut tick = tokio::time::interval(ttl / 3);
    loop {
        tokio::select! {
            _ = shutdown.wait() => break,
            _ = tick.tick() => {}
        }
        if let Some(next) = update(&spec).await {
            match register(next.clone()).await {
                Ok(_) => {
                    tracing::info!(agent_id = %next.id, "agent registration updated");
                    spec = next;
                    continue;
                }
                Err(status) => {
                    tracing::warn!(agent_id = %spec.id, error = %status.message(), "updating the registration failed")
                }
            }
        }
        let hb = HeartbeatRequest {
            agent_id: spec.id.clone(),
            in_flight: 0,
        };
        if let Err(status) = registry.heartbeat(hb).await {
            // Lost (the lease lapsed, the registry restarted empty): again.
            if status.code() == tonic::Code::NotFound {
                let _ = register(spec.clone()).await;
            } else {
                tracing::warn!(agent_id = %spec.id, error = %status.message(), "heartbeat failed");
            }
        }
    }
    let _ = registry
        .deregister_agent(DeregisterAgentRequest {
            agent_id: spec.id.clone(),
        })
        .await;
    tracing::info!(agent_id = %spec.id, "agent deregistered");
    Ok(())
}

/// Serves `agent` and keeps it registered as `spec` until SIGINT/SIGTERM.
/// Prints `listening grpc=<addr>` once bound.
pub async fn serve<A: Agent>(
    agent: A,
    mut spec: AgentSpec,
    opts: ServeOptions,
) -> Result<(), SdkError> {
    let (trigger, shutdown) = shutdown::channel();
    shutdown::on_signals(trigger);
    serve_until(agent, &mut spec, opts, shutdown).await
}

/// [`serve`] with an explicit shutdown signal (for tests and embedding).
pub async fn serve_until<A: Agent>(
    agent: A,
    spec: &mut AgentSpec,
    opts: ServeOptions,
    shutdown: Shutdown,
) -> Result<(), SdkError> {
    let cfg = ServerConfig {
        listen: opts.listen.clone(),
        ..Default::default()
    };
    let listener = switchyard_kit::server::bind(&cfg).await?;
    let addr = listener.local_addr()?;
    println!("listening grpc={addr}");
    spec.endpoint = if opts.advertise.is_empty() {
        format!("http://{addr}")
    } else {
        opts.advertise.clone()
    };
    let server = Server::new(cfg.clone())
        .add_service(AgentServer::new(agent, spec).into_service(cfg.max_message_bytes));
    let serving = tokio::spawn(server.run(listener, shutdown.clone()));
    let channel = switchyard_kit::client::authed(
        switchyard_kit::client::lazy_channel(&opts.registry_url)?,
        opts.credential.clone(),
    );
    let registry = RegistryClient::remote(channel, cfg.max_message_bytes);
    keep_registered(registry, spec.clone(), shutdown).await?;
    serving
        .await
        .map_err(|e| SdkError::Io(std::io::Error::other(e)))??;
    Ok(())
}
