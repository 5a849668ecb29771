//! Declarative agents in a process: load a manifest directory and host it
//! (`switchyard agents serve`, or `switchyard dev` with `[agents] dir`), and
//! publish a proposed agent into it (`switchyard agents publish`).

use std::path::{Path, PathBuf};
use std::time::Duration;

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
    // What a reload reads again.
    acfg.dir = Some(dir.to_path_buf());
    acfg.root = Some(root);
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

/// The approval run that stands for publishing artifact `artifact_id` of
/// job `job`: one per job and content, so approving it approves exactly
/// those bytes.
pub fn publish_run_id(job: &str, artifact_id: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{job}\n{artifact_id}").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("publish-agent-{hex}")
}

/// What to publish, and where (`switchyard agents publish`).
pub struct Publish<'a> {
    /// The job that holds the proposal.
    pub job: &'a str,
    /// The artifact's id or path (`<task>/manifest.yaml`).
    pub artifact: &'a str,
    /// The manifest directory the agents host serves.
    pub dir: &'a Path,
    /// The tools the published agent may use (its `uses_tools` must be
    /// among them).
    pub allow_tools: &'a [String],
    /// How long to wait for a person's approval and then for the registry
    /// to list the agent; zero: not.
    pub wait: Duration,
}

/// A published agent.
#[derive(Debug)]
pub struct Published {
    /// Its registry id, `agent_<id>`.
    pub registry_id: String,
    /// Its display name.
    pub name: String,
    /// The manifest written.
    pub file: PathBuf,
    /// Its capabilities as registered (empty when not waited for).
    pub capabilities: Vec<String>,
    /// The approval run a person approved it in.
    pub run_id: String,
    /// Who approved it.
    pub approved_by: String,
}

/// Publishes an agent a builder agent proposed (an `agent_manifest`
/// artifact of a job, read as the caller: only someone who may read the
/// job can publish from it): checks it again (every problem at once, with
/// `allow_tools` as the tools it may use), refuses an id that is taken,
/// and asks a person: the approval run [`publish_run_id`] is proposed (as
/// the caller, never approved by a policy) and must be approved — by an
/// approver, in the console's inbox or with `switchyard approval approve`
/// — for these very bytes before anything is written. Then it writes
/// `DIR/<id>/manifest.yaml` atomically, naming the run and its approver,
/// and waits for the agents host serving DIR to load and register it.
pub async fn publish(
    executor: &switchyard_api::ExecutorClient,
    registry: &switchyard_api::RegistryClient,
    approval: &switchyard_api::ApprovalClient,
    p: Publish<'_>,
) -> anyhow::Result<Published> {
    use switchyard_proto::common::v1::ArtifactKind;
    use switchyard_proto::executor::v1::GetArtifactRequest;
    use switchyard_proto::registry::v1::{AgentStatus, GetAgentRequest};
    let status = |s: tonic::Status| anyhow::Error::new(switchyard_kit::error::ApiError::from(s));
    let got = executor
        .get_artifact(GetArtifactRequest {
            job_id: p.job.to_owned(),
            artifact: p.artifact.to_owned(),
        })
        .await
        .map_err(status)?;
    let meta = got.artifact.unwrap_or_default();
    if meta.kind != ArtifactKind::AgentManifest as i32 {
        anyhow::bail!(
            "artifact {} of job {} is a {} artifact: only proposed agents (agent_manifest) are published",
            meta.path,
            p.job,
            switchyard_api::artifacts::kind_of(meta.kind)
        );
    }
    let text = String::from_utf8(got.content).map_err(|_| {
        anyhow::anyhow!("the proposed manifest is not UTF-8 text: it cannot be published")
    })?;
    let agent = switchyard_agents::check_proposed(&text, p.allow_tools, "--allow-tool allows")
        .map_err(|es| {
            anyhow::anyhow!(
                "artifact {} of job {} cannot be published:\n  {}",
                meta.path,
                p.job,
                es.join("\n  ")
            )
        })?;
    let target = p.dir.join(&agent.id);
    if target.exists() {
        anyhow::bail!(
            "{} exists: an agent with id {:?} is published there already (remove it to replace it)",
            target.display(),
            agent.id
        );
    }
    let by_id = GetAgentRequest {
        agent_id: agent.registry_id.clone(),
    };
    if registry.get_agent(by_id.clone()).await.is_ok() {
        anyhow::bail!(
            "{} is registered already: the proposal must use another id",
            agent.registry_id
        );
    }
    let deadline = std::time::Instant::now() + p.wait;
    let run = approved(approval, &p, &meta, &agent, deadline).await?;
    let approved_by = if run.approved_by.is_empty() {
        run.decided_by.clone()
    } else {
        run.approved_by.join(", ")
    };
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
    };
    std::fs::create_dir_all(&target)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", target.display()))?;
    let file = target.join("manifest.yaml");
    let partial = target.join("manifest.yaml.partial");
    write(
        &partial,
        &format!(
            "# Published with `switchyard agents publish` from job {}, artifact {} ({}),\n# approved by {approved_by} in approval run {}.\n{}\n",
            p.job,
            meta.path,
            meta.artifact_id,
            run.run_id,
            switchyard_agents::manifest::unfenced(&text)
        ),
    )?;
    // A reload sees the whole manifest or none of it.
    std::fs::rename(&partial, &file)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", file.display()))?;
    let mut published = Published {
        registry_id: agent.registry_id.clone(),
        name: agent.name.clone(),
        file,
        capabilities: Vec::new(),
        run_id: run.run_id,
        approved_by,
    };
    if p.wait.is_zero() {
        return Ok(published);
    }
    let deadline = std::time::Instant::now() + p.wait;
    loop {
        let found = registry
            .get_agent(by_id.clone())
            .await
            .ok()
            .and_then(|r| r.agent)
            .filter(|a| a.status == AgentStatus::Available as i32);
        if let Some(a) = found {
            published.capabilities = a
                .spec
                .map(|s| s.capabilities.into_iter().map(|c| c.name).collect())
                .unwrap_or_default();
            return Ok(published);
        }
        if std::time::Instant::now() >= deadline {
            anyhow::bail!(
                "{} is written to {} but not registered after {}s: is an agents host serving {} with reload_ms > 0 ([agents] reload_ms)? Its log says why a reload was refused (a manifest it cannot host, such as a model no provider serves, keeps the directory as it was)",
                agent.registry_id,
                published.file.display(),
                p.wait.as_secs(),
                p.dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The approved run that lets the caller publish `meta` (checked as
/// `agent`): proposed now if there is none, then waited for until
/// `deadline`; refused while it waits, and when it was rejected.
async fn approved(
    approval: &switchyard_api::ApprovalClient,
    p: &Publish<'_>,
    meta: &switchyard_proto::common::v1::Artifact,
    agent: &switchyard_agents::Declared,
    deadline: std::time::Instant,
) -> anyhow::Result<switchyard_proto::approval::v1::Run> {
    use switchyard_proto::approval::v1::{
        ArtifactPublication, ContextPack, GetRunRequest, ProposeRequest, Run, RunStatus, Target,
    };
    let api = |s: tonic::Status| anyhow::Error::new(switchyard_kit::error::ApiError::from(s));
    let run_id = publish_run_id(p.job, &meta.artifact_id);
    let read = || async {
        approval
            .get_run(GetRunRequest {
                run_id: run_id.clone(),
            })
            .await
            .map(|r| r.run.unwrap_or_default())
    };
    let mut run = match read().await {
        Ok(r) => r,
        Err(s) if s.code() == tonic::Code::NotFound => {
            let proposal = Run {
                schema_version: "agent_run_spec/v1".into(),
                run_id: run_id.clone(),
                target: Some(Target {
                    org: "agents".into(),
                    repo: p.dir.display().to_string(),
                    work_item_ids: vec![p.job.to_owned()],
                }),
                intent: format!(
                    "publish agent {} ({}) proposed in job {} ({}) to {}",
                    agent.registry_id,
                    agent.name,
                    p.job,
                    meta.path,
                    p.dir.display()
                ),
                context_pack: Some(ContextPack {
                    pack_id: format!("{}/{}", p.job, meta.path),
                    hash: meta.artifact_id.clone(),
                    version: "agent_manifest/v1".into(),
                    inputs: vec![p.job.to_owned()],
                }),
                model: agent
                    .models
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "none".into()),
                max_tokens: agent.max_output_tokens.unwrap_or(1).max(1),
                tools_allowed: if agent.uses_tools.is_empty() {
                    vec!["none".into()]
                } else {
                    agent.uses_tools.clone()
                },
                outputs_allowed: vec!["propose_agent".into()],
                publication: Some(ArtifactPublication {
                    job_id: p.job.to_owned(),
                    artifact_path: meta.path.clone(),
                    artifact_id: meta.artifact_id.clone(),
                    destination: p.dir.display().to_string(),
                }),
                ..Default::default()
            };
            approval
                .propose(ProposeRequest {
                    run: Some(proposal),
                    // Publishing is a person's act (seed 004): no policy
                    // approves it.
                    skip_policies: true,
                    ..Default::default()
                })
                .await
                .map_err(api)?
                .run
                .unwrap_or_default()
        }
        Err(s) => return Err(api(s)),
    };
    loop {
        let bound = run
            .context_pack
            .as_ref()
            .is_some_and(|c| c.hash == meta.artifact_id);
        if !bound {
            anyhow::bail!(
                "approval run {run_id} is not bound to artifact {} ({}): not published",
                meta.path,
                meta.artifact_id
            );
        }
        let status = RunStatus::try_from(run.status).unwrap_or(RunStatus::Unspecified);
        match status {
            RunStatus::Approved | RunStatus::Running | RunStatus::Completed => return Ok(run),
            RunStatus::Proposed => {}
            _ => anyhow::bail!(
                "publishing {} was not approved: approval run {run_id} is {} (by {}); nothing was written",
                agent.registry_id,
                status
                    .as_str_name()
                    .trim_start_matches("RUN_STATUS_")
                    .to_ascii_lowercase(),
                if run.decided_by.is_empty() {
                    "nobody recorded"
                } else {
                    run.decided_by.as_str()
                }
            ),
        }
        if std::time::Instant::now() >= deadline {
            anyhow::bail!(
                "publishing {} waits for a person: approval run {run_id} is proposed; an approver approves it in the console's inbox or with `switchyard approval approve {run_id}`, then run this again (or with --wait-secs to wait); nothing was written",
                agent.registry_id
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        run = read().await.map_err(api)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_run_stands_for_one_job_and_one_content() {
        let a = publish_run_id("self-host", "sha256:aa");
        assert_eq!(a, publish_run_id("self-host", "sha256:aa"));
        assert_ne!(a, publish_run_id("self-host", "sha256:ab"), "other bytes");
        assert_ne!(a, publish_run_id("other-job", "sha256:aa"), "another job");
        // A valid run id: a key of at most 128 characters.
        assert!(switchyard_core::validate::key(&a, "run id").is_ok(), "{a}");
    }
}
