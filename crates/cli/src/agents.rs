//! Declarative agents in a process: load a manifest directory and host it
//! (`switchyard agents serve`, or `switchyard dev` with `[agents] dir`).

use std::path::Path;

use switchyard_agents::{Hosted, load_dir};

use crate::Config;

/// Loads every manifest under `dir` and builds the host, calling models
/// through `llm`. `own` is this node's URL, the default for the registry,
/// ledger and executor URLs.
pub fn host(
    cfg: &Config,
    dir: &Path,
    own: Option<&str>,
    credential: Option<switchyard_kit::client::Credential>,
    llm: switchyard_llm::Llm,
) -> anyhow::Result<Hosted> {
    let root = cfg
        .agents
        .root
        .clone()
        .or_else(|| dir.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| dir.to_path_buf());
    let loaded = load_dir(dir, &root).map_err(switchyard_agents::AgentsError::Manifests)?;
    for (path, why) in &loaded.skipped {
        tracing::info!(manifest = %path.display(), why, "manifest skipped");
    }
    if loaded.agents.is_empty() {
        anyhow::bail!(
            "{}: no declarative agent to host (every manifest was skipped)",
            dir.display()
        );
    }
    let mut acfg = cfg.agents.clone();
    let or_own = |u: &mut Option<String>| {
        if u.is_none() {
            *u = own.map(str::to_owned);
        }
    };
    or_own(&mut acfg.registry_url);
    or_own(&mut acfg.ledger_url);
    or_own(&mut acfg.executor_url);
    let tls = match &cfg.auth.service_tls {
        Some(t) => Some(t.tonic().map_err(anyhow::Error::msg)?),
        None => None,
    };
    Ok(Hosted::new(
        loaded,
        llm,
        acfg,
        credential,
        tls.as_ref(),
        cfg.server.max_message_bytes,
    )?)
}
