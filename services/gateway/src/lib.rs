//! The gateway: Switchyard's other front doors, for clients that do not
//! speak gRPC.
//!
//! - [`http`]: AITP over REST/JSON (seed 002 §8) — submit a task, read its
//!   status, progress and result, cancel it, follow its events as
//!   Server-Sent Events — and the OpenAPI 3.1 document of those routes.
//! - [`console`]: the web console at `/ui/` — approvals inbox, live jobs,
//!   budgets, agents — on the HTTP door's listener.
//! - [`resp`]: the AGEniX RESP door (seed 001): `PLAN.SUBMIT <json>`,
//!   `JOB.STATUS`, `JOB.RESULT`, `JOB.CANCEL` for `redis-cli` and any
//!   Redis client library.
//!
//! Each door only translates: the executor stays the one place jobs are
//! validated, admitted and run, reached in-process when this process hosts
//! it and over gRPC otherwise. Callers authenticate with the same
//! credentials as on the gRPC ports, each route and verb is in the same
//! default-deny table, and the executor sees the caller itself
//! ([`caller`]), so tenancy, ownership and `submitted_by` are what a
//! direct gRPC call gets. Nothing is stored here: run any number.
//!
//! `switchyard dev` and `switchyard serve --services gateway` host it
//! ([`Gateway::run`]).

pub mod caller;
pub mod config;
pub mod console;
pub mod http;
pub mod resp;

use std::sync::Arc;
use std::time::Duration;

use switchyard_kit::auth::authn::Authenticator;
use switchyard_kit::shutdown::Shutdown;
use tokio::net::TcpListener;

pub use caller::Jobs;
pub use config::GatewayConfig;
pub use console::ConsoleServices;

/// The doors of one process.
#[derive(Debug)]
pub struct Gateway {
    cfg: GatewayConfig,
    max_message_bytes: usize,
    jobs: Jobs,
    auth: Arc<Authenticator>,
    mcp: Option<switchyard_mcp::server::SwitchyardMcp>,
    console: ConsoleServices,
    grpc: Option<String>,
    card: Option<Arc<http::a2a::CardSigner>>,
}

impl Gateway {
    /// Doors over `jobs`, authenticating with `auth`; bodies and bulk
    /// strings default to `max_message_bytes` (the gRPC limit).
    pub fn new(
        cfg: GatewayConfig,
        max_message_bytes: usize,
        jobs: Jobs,
        auth: Arc<Authenticator>,
    ) -> Gateway {
        Gateway {
            cfg,
            max_message_bytes,
            jobs,
            auth,
            mcp: None,
            console: ConsoleServices::default(),
            grpc: None,
            card: None,
        }
    }

    /// Signs the A2A door's Agent Card with `key`, its interface at
    /// `{public_url}/a2a` and the key published at
    /// `{public_url}/.well-known/jwks.json`.
    pub fn with_signed_card(
        mut self,
        key: switchyard_a2a::signature::SigningKey,
        public_url: &str,
    ) -> Gateway {
        self.card = Some(Arc::new(http::a2a::CardSigner {
            key,
            public_url: public_url.trim_end_matches('/').to_owned(),
        }));
        self
    }

    /// Names `addr` as this process's gRPC port to a gRPC client that
    /// reached the HTTP door instead (a CLI pointed at the wrong port).
    pub fn with_grpc_address(mut self, addr: String) -> Gateway {
        self.grpc = Some(addr);
        self
    }

    /// Serves the web console at `/ui/` (unless `gateway.console.enabled`
    /// is off), reading and acting through `services` as each person.
    pub fn with_console(mut self, services: ConsoleServices) -> Gateway {
        self.console = services;
        self
    }

    /// Serves Switchyard as an MCP server at `/mcp` (streamable HTTP), each
    /// request's calls made with its own bearer token through `server`.
    pub fn with_mcp(mut self, server: switchyard_mcp::server::SwitchyardMcp) -> Gateway {
        self.mcp = Some(server);
        self
    }

    /// Serves the HTTP door on `http` and the RESP door on `resp` (each
    /// when given) until `shutdown`, then drains each for up to `drain`.
    pub async fn run(
        self,
        http: Option<TcpListener>,
        resp: Option<TcpListener>,
        shutdown: Shutdown,
        drain: Duration,
    ) -> std::io::Result<()> {
        let resp_task = resp.map(|listener| {
            let door = Arc::new(resp::Door::new(
                &self.cfg.resp,
                self.max_message_bytes,
                self.jobs.clone(),
                self.auth.clone(),
            ));
            tokio::spawn(resp::serve(door, listener, shutdown.clone(), drain))
        });
        let served = match http {
            Some(listener) => {
                let mut router = http::router(
                    &self.cfg.http,
                    http::Settings {
                        ojs: self.cfg.ojs.clone(),
                        card: self.card.clone(),
                    },
                    self.max_message_bytes,
                    self.jobs.clone(),
                    self.auth.clone(),
                    shutdown.clone(),
                    self.cfg
                        .console
                        .enabled
                        .then(|| (self.cfg.console.clone(), self.console.clone())),
                );
                if let Some(server) = self.mcp.clone().filter(|_| self.cfg.mcp.enabled) {
                    let max = self
                        .cfg
                        .http
                        .max_body_bytes
                        .unwrap_or(self.max_message_bytes);
                    router = http::with_mcp(router, server, &self.cfg.mcp, self.auth.clone(), max);
                }
                let router = http::grpc_elsewhere(router, self.grpc.clone());
                http::serve(router, listener, self.cfg.http.limits(), shutdown, drain).await
            }
            None => Ok(()),
        };
        if let Some(t) = resp_task {
            let _ = t.await;
        }
        served
    }
}
