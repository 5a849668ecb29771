//! End-to-end tests against the in-process stack, one binary (one link) for all:
//! each module is one area.

mod common;

mod a2a;
mod a2a_door;
mod adapters;
mod auth;
mod budget_pause;
mod console;
mod conversation;
mod executor;
mod gateway;
mod handoff;
mod input;
mod journal;
mod ledger_concurrency;
mod llm;
mod mcp;
mod notifications;
mod oidc;
mod platform;
mod policy;
mod rate_limits;
mod references;
mod registry_router;
mod rerun;
mod sandbox;
mod schedules;
mod self_hosting;
mod tool_approval;
mod triggers;
mod workers;
