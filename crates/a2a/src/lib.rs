//! Agent2Agent (A2A 1.0) in Switchyard: reading Agent Cards ([`card`]) and
//! checking or making their signatures ([`signature`]), a JSON-RPC client
//! that follows a task's streamed updates and cancels it ([`client`]; A2A
//! 0.3's shapes in [`v03`]), and
//! [`A2aAgent`], an A2A agent behind the `AgentService` contract. The registry reads cards (RegisterA2aAgent, and to keep an A2A
//! agent's lease); the executor invokes A2A agents through [`A2aAgent`].

pub mod agent;
pub mod card;
pub mod client;
pub mod signature;
pub mod v03;

pub use agent::A2aAgent;
pub use card::Card;

/// The HTTP client for Agent Cards and A2A agents (rustls on ring, as
/// every client of this process).
pub fn http_client() -> Result<reqwest::Client, String> {
    switchyard_kit::tls::install_crypto();
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        // A redirect could lead anywhere the egress guard did not check.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("building the HTTP client for A2A agents: {e}"))
}

/// What went wrong talking to an A2A agent.
#[derive(Debug, Clone, thiserror::Error)]
pub enum A2aError {
    /// It could not be reached, or the connection broke.
    #[error("{0}")]
    Unreachable(String),
    /// It answered something that is not A2A.
    #[error("the A2A agent's answer is not A2A: {0}")]
    Protocol(String),
    /// It answered a JSON-RPC error.
    #[error("the A2A agent answered error {code}: {message}")]
    Rpc {
        /// JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
}

impl From<A2aError> for tonic::Status {
    /// Unreachable agents are UNAVAILABLE (the executor tries the next one);
    /// a broken conversation is an error of the call.
    fn from(e: A2aError) -> tonic::Status {
        match e {
            A2aError::Unreachable(m) => tonic::Status::unavailable(m),
            other => tonic::Status::internal(other.to_string()),
        }
    }
}
