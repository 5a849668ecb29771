//! The `switchyard` binary's library half: the layered configuration and the
//! composition of any set of services into one process on one port. `main.rs`
//! parses arguments and calls in here; `switchyard-testkit` uses the same
//! composition to run the stack in-process for tests and benchmarks.

pub mod agents;
pub mod config;
pub mod node;

pub use config::Config;
pub use node::{Addresses, BindError, Listeners, ServiceKind, run_node, run_node_then};
