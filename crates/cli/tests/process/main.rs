//! Tests of real `switchyard` processes (dev, serve, split), one binary for all:
//! each module is one area.

mod support;

mod budget_pause;
mod conversation;
mod deploy;
mod executor_replicas;
mod executor_split;
mod first_hour;
mod gateway;
mod history;
mod input;
mod ledger_approval;
mod ledger_replicas;
mod llm_split;
mod mcp_server;
mod mtls;
mod outage;
mod polyglot;
mod postgres_split;
mod rate_limits;
mod real_llm;
mod rerun;
mod sandbox;
mod schedules;
mod self_hosting;
mod split;
mod telemetry;
mod tool_approval;
mod upgrade;
