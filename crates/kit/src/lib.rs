//! Service plumbing shared by every Switchyard service and the CLI.
//!
//! - [`server`]: one gRPC port with health, reflection (v1 and v1alpha),
//!   message-size and time limits, correlation and trace extraction, and
//!   graceful shutdown.
//! - [`client`]: channels whose calls carry `x-correlation-id` and `traceparent`,
//!   and [`service_client!`] for clients that are the same in-process or remote.
//! - [`auth`]: principals, authentication (API keys, service token) and the
//!   one authorization table.
//! - [`context`]: the per-request correlation context and principal.
//! - [`error`]: `tonic::Status` with `ErrorInfo` reasons and `BadRequest`
//!   violations, and their client-side reading ([`error::ApiError`]).
//! - [`config`]: defaults → TOML file → `SWITCHYARD_*` env layering.
//! - [`telemetry`]: logs (human or JSON) and OTLP trace export.
//! - [`shutdown`]: SIGINT/SIGTERM handling shared by every binary.
//! - [`tls`]: the process's rustls crypto provider.
//! - [`sse`]: server-sent events split off a byte stream.
//! - [`json`], [`time`]: protobuf `Struct`/`Timestamp`/`Duration` conversions.

pub mod auth;
pub mod chain;
pub mod client;
pub mod config;
pub mod context;
pub mod egress;
pub mod error;
pub mod fs;
pub mod hex;
pub mod jcs;
pub mod json;
mod layer;
pub mod metrics;
pub mod money;
pub mod receipt;
pub mod server;
pub mod shutdown;
pub mod sse;
pub mod telemetry;
pub mod time;
pub mod tls;
pub mod webhook;

/// A boxed stream of messages or statuses, as returned by streaming client calls.
pub type BoxStream<T> =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;
