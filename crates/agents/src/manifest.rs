//! Agent manifests (seed ADR 003 §4 and §9): `manifest.yaml` files, their
//! validation rules, instruction resolution and Jinja rendering.
//!
//! A manifest with an `agent` section and no `entrypoint` is a declarative
//! agent: it needs `agent.model` and `agent.instructions` (a file path, inline
//! text, or `""` for none). Manifests with an `entrypoint` are programmatic
//! (code, served with the SDK) and manifests without `agent` are plain
//! extensions; both are skipped here, not refused. A builder agent's
//! proposals (`agent_manifest` artifacts) are checked by [`check_proposed`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};
use switchyard_core::artifact::ArtifactKind;

/// A declared capability: a name, or a name with a price.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
enum CapabilityDecl {
    Name(String),
    Priced {
        name: String,
        #[serde(default)]
        price_per_unit_micro_usd: i64,
        #[serde(default)]
        unit: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    id: Option<String>,
    name: Option<String>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    entrypoint: Option<String>,
    #[serde(default)]
    setup_instructions: String,
    #[serde(default)]
    depends_on: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    config: Map<String, Value>,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    agent: Option<RawAgent>,
    /// Switchyard: what the agent registers as able to do (default: its id).
    #[serde(default)]
    capabilities: Vec<CapabilityDecl>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    #[serde(default)]
    integration_mode: Option<String>,
    #[serde(default)]
    model: Option<String>,
    /// Switchyard: models tried in order when the model is unavailable.
    #[serde(default)]
    fallback_models: Vec<String>,
    /// Switchyard: preferred provider.
    #[serde(default)]
    provider: String,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    parameters: Map<String, Value>,
    #[serde(default)]
    uses_tools: Vec<String>,
    #[serde(default)]
    limits: RawLimits,
    /// Switchyard: keep the final answer as an artifact of the calling job.
    #[serde(default)]
    artifact: Option<RawArtifact>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawArtifact {
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    grants: Vec<String>,
}

/// What an agent keeps of its answer (`agent.artifact`): the calling job
/// stores it as an artifact of this kind, when its `outputs_allowed`
/// allows the kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Keep {
    /// Kind.
    pub kind: ArtifactKind,
    /// File name.
    pub name: String,
    /// `agent_manifest` only: the tools the agents it proposes may use (a
    /// proposal listing any other is refused).
    pub grants: Vec<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_turns: Option<u32>,
    max_tokens_per_invocation: Option<u64>,
    time_budget_ms: Option<u64>,
}

/// Guardrails of one invocation (seed ADR 003 `AgentLimits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most agent-loop iterations (default 10).
    pub max_turns: u32,
    /// Most tokens over the invocation (default 50000).
    pub max_tokens_per_invocation: u64,
    /// Wall-clock budget, milliseconds (default 120000).
    pub time_budget_ms: u64,
}

/// A capability the agent registers.
#[derive(Debug, Clone, PartialEq)]
pub struct Capability {
    /// Name.
    pub name: String,
    /// Price per unit, micro-USD (on top of the model calls it bills).
    pub price_per_unit_micro_usd: i64,
    /// Unit.
    pub unit: String,
}

/// A loaded, validated declarative agent.
#[derive(Debug, Clone)]
pub struct Declared {
    /// The manifest's id.
    pub id: String,
    /// Registry id and tool name: `agent_<id>`.
    pub registry_id: String,
    /// Display name.
    pub name: String,
    /// Description written for LLM routing.
    pub description: String,
    /// Version.
    pub version: String,
    /// Model, then fallbacks.
    pub models: Vec<String>,
    /// Preferred provider.
    pub provider: String,
    /// The rendered system prompt ("" for none).
    pub instructions: String,
    /// `parameters.temperature`.
    pub temperature: Option<f64>,
    /// `parameters.max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// `parameters.timeout_ms`: per-call ceiling on the time budget.
    pub timeout_ms: Option<u64>,
    /// `parameters.tool_choice`.
    pub tool_choice: String,
    /// `parameters.output_format`.
    pub output_format: String,
    /// `parameters.output_schema`.
    pub output_schema: Option<Value>,
    /// `parameters.tool_timeout_ms`.
    pub tool_timeout_ms: Option<u64>,
    /// The only tools it may call (`delegate` is the built-in child job).
    pub uses_tools: Vec<String>,
    /// Limits.
    pub limits: Limits,
    /// Capabilities it registers.
    pub capabilities: Vec<Capability>,
    /// Where its manifest lives.
    pub dir: PathBuf,
    /// `integration_mode: handoff`: it takes conversations over (answering
    /// the person, with a `hand_back` tool) instead of running a task.
    pub handoff: bool,
    /// Its answer, kept as an artifact (`agent.artifact`).
    pub artifact: Option<Keep>,
}

/// What a directory held.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Declarative agents, by id.
    pub agents: Vec<Declared>,
    /// Manifests not hosted here, with why (programmatic, not an agent,
    /// disabled).
    pub skipped: Vec<(PathBuf, String)>,
}

const PARAMETERS: &[&str] = &[
    "temperature",
    "max_output_tokens",
    "timeout_ms",
    "tool_choice",
    "output_format",
    "output_schema",
    "tool_timeout_ms",
];

/// Every manifest under `dir`: `dir/manifest.yaml` and
/// `dir/*/manifest.yaml`. `root` is the project root instruction files
/// are also looked up in. All problems are reported at once.
pub fn load_dir(dir: &Path, root: &Path) -> Result<Loaded, Vec<String>> {
    let mut files = Vec::new();
    if dir.join("manifest.yaml").is_file() {
        files.push(dir.join("manifest.yaml"));
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|e| vec![format!("{}: cannot read the directory: {e}", dir.display())])?;
    let mut subdirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("manifest.yaml").is_file())
        .collect();
    subdirs.sort();
    files.extend(subdirs.into_iter().map(|d| d.join("manifest.yaml")));
    if files.is_empty() {
        return Err(vec![format!(
            "{}: no manifest.yaml here or in its subdirectories",
            dir.display()
        )]);
    }
    let mut loaded = Loaded::default();
    let mut errors = Vec::new();
    let mut ids: HashMap<String, PathBuf> = HashMap::new();
    let mut names: HashMap<String, PathBuf> = HashMap::new();
    for f in files {
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            Err(e) => {
                errors.push(format!("{}: {e}", f.display()));
                continue;
            }
        };
        let ext_dir = f.parent().unwrap_or(dir).to_path_buf();
        match parse(&text, &ext_dir, root) {
            Ok(Parsed::Agent(a)) => {
                if let Some(other) = ids.insert(a.id.clone(), f.clone()) {
                    errors.push(format!(
                        "{}: agent id {:?} is already defined by {}",
                        f.display(),
                        a.id,
                        other.display()
                    ));
                    continue;
                }
                if let Some(other) = names.insert(a.name.clone(), f.clone()) {
                    errors.push(format!(
                        "{}: agent name {:?} is already used by {}",
                        f.display(),
                        a.name,
                        other.display()
                    ));
                    continue;
                }
                loaded.agents.push(*a);
            }
            Ok(Parsed::Skipped(why)) => loaded.skipped.push((f, why)),
            Err(es) => errors.extend(es.into_iter().map(|e| format!("{}: {e}", f.display()))),
        }
    }
    if errors.is_empty() {
        Ok(loaded)
    } else {
        Err(errors)
    }
}

/// One manifest's outcome.
#[derive(Debug)]
pub enum Parsed {
    /// A declarative agent to host.
    Agent(Box<Declared>),
    /// Valid, but not hosted here (why).
    Skipped(String),
}

impl Parsed {
    /// The agent, if it is one.
    pub fn agent(self) -> Option<Declared> {
        match self {
            Parsed::Agent(a) => Some(*a),
            Parsed::Skipped(_) => None,
        }
    }
}

/// Parses and validates one manifest; `ext_dir` holds it.
pub fn parse(text: &str, ext_dir: &Path, root: &Path) -> Result<Parsed, Vec<String>> {
    validated(read(text)?, ext_dir, root)
}

/// A manifest's text as written, not yet checked.
fn read(text: &str) -> Result<RawManifest, Vec<String>> {
    // PyYAML, which the reference loader uses, keeps the last of repeated
    // keys; seed 003's own example repeats `description`.
    let options = serde_saphyr::options! {
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::LastWins,
    };
    serde_saphyr::from_str_with_options(text, options)
        .map_err(|e| vec![format!("not a valid manifest: {e}")])
}

/// Validates a read manifest; `ext_dir` holds it.
fn validated(raw: RawManifest, ext_dir: &Path, root: &Path) -> Result<Parsed, Vec<String>> {
    let mut errors = Vec::new();
    let id = raw.id.clone().unwrap_or_default();
    if id.is_empty() {
        errors.push("id is required".to_owned());
    } else if !valid_id(&id) {
        errors.push(format!(
            "id {id:?} must match ^[a-z][a-z0-9_]{{0,51}}$ (it becomes the tool name agent_{id})"
        ));
    }
    let name = raw.name.clone().unwrap_or_default();
    if name.trim().is_empty() {
        errors.push("name is required".to_owned());
    }
    if !raw.enabled {
        return if errors.is_empty() {
            Ok(Parsed::Skipped("enabled: false".into()))
        } else {
            Err(errors)
        };
    }
    let Some(agent) = raw.agent else {
        if raw.entrypoint.as_deref().unwrap_or("").is_empty() {
            errors.push("a manifest without an agent section needs an entrypoint".into());
            return Err(errors);
        }
        return if errors.is_empty() {
            Ok(Parsed::Skipped("not an agent (no agent section)".into()))
        } else {
            Err(errors)
        };
    };
    let mode = agent.integration_mode.as_deref().unwrap_or("tool");
    match mode {
        "tool" | "handoff" => {}
        other => errors.push(format!(
            "agent.integration_mode must be tool or handoff, got {other:?}"
        )),
    }
    let model = agent.model.clone().unwrap_or_default();
    if model.trim().is_empty() {
        errors.push("agent.model is required".into());
    }
    if let Some(ep) = raw.entrypoint.as_deref().filter(|e| !e.is_empty()) {
        return if errors.is_empty() {
            Ok(Parsed::Skipped(format!(
                "programmatic agent (entrypoint {ep}): serve it with its own code and the SDK"
            )))
        } else {
            Err(errors)
        };
    }
    let Some(instructions) = agent.instructions.clone() else {
        errors.push(
            "agent.instructions is required for a declarative agent (a file path, inline text, or \"\" for no system prompt)".into(),
        );
        return Err(errors);
    };
    let mut vars = raw.config.clone();
    vars.entry("agent")
        .or_insert(serde_json::json!({"id": id, "name": name, "model": model}));
    let instructions = match resolve_instructions(&instructions, ext_dir, root, &vars) {
        Ok(s) => s,
        Err(e) => {
            errors.push(e);
            String::new()
        }
    };
    let p = &agent.parameters;
    for k in p.keys() {
        if !PARAMETERS.contains(&k.as_str()) {
            errors.push(format!(
                "agent.parameters.{k} is not a known parameter (known: {})",
                PARAMETERS.join(", ")
            ));
        }
    }
    let temperature = match p.get("temperature") {
        None => None,
        Some(t) => match t.as_f64() {
            Some(t) if (0.0..=2.0).contains(&t) => Some(t),
            _ => {
                errors.push(format!(
                    "agent.parameters.temperature must be between 0.0 and 2.0, got {t}"
                ));
                None
            }
        },
    };
    let mut positive = |k: &str| match p.get(k) {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Some(n),
            _ => {
                errors.push(format!(
                    "agent.parameters.{k} must be a positive integer, got {v}"
                ));
                None
            }
        },
    };
    let max_output_tokens = positive("max_output_tokens");
    let timeout_ms = positive("timeout_ms");
    let tool_timeout_ms = positive("tool_timeout_ms");
    let text = |k: &str| {
        p.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let tool_choice = text("tool_choice");
    if !matches!(tool_choice.as_str(), "" | "auto" | "required" | "none") {
        errors.push(format!(
            "agent.parameters.tool_choice must be auto, required or none, got {tool_choice:?}"
        ));
    }
    let output_format = text("output_format");
    if !matches!(output_format.as_str(), "" | "json" | "text" | "markdown") {
        errors.push(format!(
            "agent.parameters.output_format must be json, text or markdown, got {output_format:?}"
        ));
    }
    let output_schema = match p.get("output_schema") {
        None => None,
        Some(s @ Value::Object(_)) => {
            if let Err(e) = jsonschema::validator_for(s) {
                errors.push(format!(
                    "agent.parameters.output_schema is not a valid JSON Schema: {e}"
                ));
            }
            Some(s.clone())
        }
        Some(_) => {
            errors.push("agent.parameters.output_schema must be a JSON Schema object".into());
            None
        }
    };
    let mut seen = std::collections::HashSet::new();
    for t in &agent.uses_tools {
        if switchyard_core::validate::tool_name(t).is_err() {
            errors.push(format!("agent.uses_tools: {t:?} is not a tool name"));
        } else if !seen.insert(t) {
            errors.push(format!("agent.uses_tools: {t:?} is listed twice"));
        }
    }
    let l = &agent.limits;
    let limits = Limits {
        max_turns: l.max_turns.unwrap_or(10),
        max_tokens_per_invocation: l.max_tokens_per_invocation.unwrap_or(50_000),
        time_budget_ms: l.time_budget_ms.unwrap_or(120_000),
    };
    if limits.max_turns == 0 || limits.max_tokens_per_invocation == 0 || limits.time_budget_ms == 0
    {
        errors.push("agent.limits must be positive".into());
    }
    let mut capabilities = Vec::new();
    for c in &raw.capabilities {
        let (name, price, unit) = match c {
            CapabilityDecl::Name(n) => (n.clone(), 0, String::new()),
            CapabilityDecl::Priced {
                name,
                price_per_unit_micro_usd,
                unit,
            } => (name.clone(), *price_per_unit_micro_usd, unit.clone()),
        };
        if let Err(e) = switchyard_core::validate::capability(&name) {
            errors.push(format!("capabilities: {e}"));
        }
        if price < 0 {
            errors.push(format!(
                "capabilities.{name}: the price must not be negative"
            ));
        }
        capabilities.push(Capability {
            name,
            price_per_unit_micro_usd: price,
            unit: if unit.is_empty() { "task".into() } else { unit },
        });
    }
    if capabilities.is_empty() && valid_id(&id) {
        capabilities.push(Capability {
            name: id.clone(),
            price_per_unit_micro_usd: 0,
            unit: "task".into(),
        });
    }
    if raw.description.trim().is_empty() {
        errors.push(
            "description is required: it is what a model reads to decide when to use this agent"
                .into(),
        );
    }
    let _ = (&raw.setup_instructions, &raw.depends_on, &raw.secrets);
    if mode == "handoff" && (output_format == "json" || output_schema.is_some()) {
        errors.push(
            "a handoff agent talks with a person: remove parameters.output_format json and output_schema (it hands its result back with hand_back)".into(),
        );
    }
    let artifact = agent
        .artifact
        .as_ref()
        .and_then(|a| keep(a, &id, mode, &mut errors));
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut models = vec![model];
    models.extend(agent.fallback_models);
    Ok(Parsed::Agent(Box::new(Declared {
        registry_id: format!("agent_{id}"),
        id,
        name,
        description: raw.description.trim().to_owned(),
        version: raw.version.unwrap_or_else(|| "1.0.0".into()),
        models,
        provider: agent.provider,
        instructions,
        temperature,
        max_output_tokens,
        timeout_ms,
        tool_choice,
        output_format,
        output_schema,
        tool_timeout_ms,
        uses_tools: agent.uses_tools,
        limits,
        capabilities,
        dir: ext_dir.to_path_buf(),
        handoff: mode == "handoff",
        artifact,
    })))
}

/// Checks `agent.artifact`; `None` (and the problems in `errors`) when it
/// is wrong.
fn keep(a: &RawArtifact, id: &str, mode: &str, errors: &mut Vec<String>) -> Option<Keep> {
    let before = errors.len();
    let kind = ArtifactKind::parse(&a.kind);
    if kind.is_none() {
        errors.push(format!(
            "agent.artifact.kind must be one of {}, got {:?}",
            ArtifactKind::ALL
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            a.kind
        ));
    }
    let name = match (a.name.is_empty(), kind) {
        (false, _) => a.name.clone(),
        (true, Some(ArtifactKind::AgentManifest)) => "manifest.yaml".to_owned(),
        (true, _) => format!("{id}.md"),
    };
    if let Err(e) = switchyard_core::artifact::check_name(&name) {
        errors.push(format!("agent.artifact.name: {e}"));
    }
    if mode == "handoff" {
        errors.push(
            "agent.artifact: a handoff agent hands its result back with hand_back; keep artifacts from tool-mode agents".into(),
        );
    }
    if !a.grants.is_empty() && kind != Some(ArtifactKind::AgentManifest) {
        errors.push("agent.artifact.grants is for agent_manifest artifacts only".into());
    }
    for t in &a.grants {
        if t != switchyard_agent_sdk::delegation::TOOL
            && switchyard_core::validate::tool_name(t).is_err()
        {
            errors.push(format!("agent.artifact.grants: {t:?} is not a tool name"));
        }
    }
    (errors.len() == before).then(|| Keep {
        kind: kind.unwrap_or(ArtifactKind::File),
        name,
        grants: a.grants.clone(),
    })
}

/// A proposal's text without the code fence a model may wrap it in.
pub fn unfenced(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let body = rest.split_once('\n').map_or("", |(_, b)| b);
    body.trim_end().strip_suffix("```").unwrap_or(body).trim()
}

/// A manifest a builder agent proposed (an `agent_manifest` artifact),
/// checked where it is written (the builder's host) and again where it is
/// published (`switchyard agents publish`): one file, a valid declarative
/// agent with its instructions inline, that proposes no agents itself and
/// uses only tools in `grants` (`granter` says whose list that is: "the
/// builder may grant", "--allow-tool allows"). Every problem at once.
pub fn check_proposed(
    text: &str,
    grants: &[String],
    granter: &str,
) -> Result<Declared, Vec<String>> {
    let raw = read(unfenced(text))?;
    let mut errors = Vec::new();
    if let Some(i) = raw.agent.as_ref().and_then(|a| a.instructions.as_deref())
        && names_a_file(i)
    {
        errors.push(format!(
            "agent.instructions: {:?} names a file; a proposed agent is one manifest with its instructions inline",
            i.trim()
        ));
    }
    if raw.agent.as_ref().is_some_and(|a| a.artifact.is_some()) {
        errors.push(
            "agent.artifact: a proposed agent may not keep artifacts (only a builder a person installed proposes agents)".into(),
        );
    }
    // From the text, so a proposal wrong in other ways is told this too.
    let ungranted: Vec<String> = raw
        .agent
        .as_ref()
        .map_or(&[][..], |a| a.uses_tools.as_slice())
        .iter()
        .filter(|t| !grants.contains(t))
        .map(|t| {
            format!(
                "agent.uses_tools: {t:?} may not be granted ({granter}: {})",
                if grants.is_empty() {
                    "no tools".to_owned()
                } else {
                    grants.join(", ")
                }
            )
        })
        .collect();
    // A file name was refused above; resolving nothing from disk.
    let none = Path::new("");
    let declared = match validated(raw, none, none) {
        Ok(Parsed::Agent(a)) => Some(*a),
        Ok(Parsed::Skipped(why)) => {
            errors.push(format!(
                "not a declarative agent to host ({why}): a proposal needs an agent section with a model and instructions, and enabled: true"
            ));
            None
        }
        Err(es) => {
            errors.extend(
                es.into_iter()
                    .filter(|e| !e.starts_with("agent.instructions: file")),
            );
            None
        }
    };
    errors.extend(ungranted);
    match declared {
        Some(d) if errors.is_empty() => Ok(d),
        _ => Err(errors),
    }
}

/// Whether `agent.instructions` names a prompt file rather than holding
/// the text.
fn names_a_file(raw: &str) -> bool {
    let t = raw.trim();
    !t.contains('\n')
        && [".jinja2", ".j2", ".md", ".txt"]
            .iter()
            .any(|ext| t.ends_with(ext))
}

fn valid_id(id: &str) -> bool {
    let mut c = id.chars();
    c.next().is_some_and(|f| f.is_ascii_lowercase())
        && id.len() <= 52
        && id
            .chars()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_')
}

/// Seed ADR 003: a file path (looked up in the extension's directory, then
/// the project root; `.jinja2`/`.j2` files are rendered with the manifest's
/// `config`), inline text (rendered too), or empty for no system prompt.
pub fn resolve_instructions(
    raw: &str,
    ext_dir: &Path,
    root: &Path,
    vars: &Map<String, Value>,
) -> Result<String, String> {
    let t = raw.trim();
    if t.is_empty() {
        return Ok(String::new());
    }
    if !names_a_file(t) {
        return render(raw, vars).map_err(|e| format!("agent.instructions: {e}"));
    }
    for base in [ext_dir, root] {
        let candidate = base.join(t);
        if !candidate.is_file() {
            continue;
        }
        // A prompt file must stay inside the directory it is looked up in.
        let (Ok(c), Ok(b)) = (candidate.canonicalize(), base.canonicalize()) else {
            continue;
        };
        if !c.starts_with(&b) {
            return Err(format!(
                "agent.instructions: {t:?} points outside {}",
                base.display()
            ));
        }
        let text = std::fs::read_to_string(&c)
            .map_err(|e| format!("agent.instructions: {}: {e}", c.display()))?;
        return if t.ends_with(".jinja2") || t.ends_with(".j2") {
            render(&text, vars).map_err(|e| format!("agent.instructions ({t}): {e}"))
        } else {
            Ok(text)
        };
    }
    Err(format!(
        "agent.instructions: file {t:?} not found in {} or {}",
        ext_dir.display(),
        root.display()
    ))
}

fn render(template: &str, vars: &Map<String, Value>) -> Result<String, String> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    let ctx: BTreeMap<&str, minijinja::Value> = vars
        .iter()
        .map(|(k, v)| {
            (
                k.as_str(),
                minijinja::Value::from(minijinja::value::Serde(v)),
            )
        })
        .collect();
    env.render_str(
        template,
        minijinja::Value::from(minijinja::value::Serde(ctx)),
    )
    .map_err(|e| {
        let mut s = e.to_string();
        if let Some(d) = e.detail() {
            s = format!("{s} ({d})");
        }
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    const SEED_EXAMPLE: &str = r#"
id: code_reviewer
name: Code Review Agent
version: "1.0.0"
description: >
  AI agent specialized in code review: analyzes diffs, finds bugs,
  suggests improvements, checks style compliance.

description: |
  Use this agent when the user asks to review code, analyze a diff,
  or check code quality.
  DO NOT use for writing new code — use the Builder Agent instead.

agent:
  integration_mode: tool
  model: gpt-4o-mini
  instructions: prompts/code_reviewer.jinja2

  parameters:
    temperature: 0.2
    max_output_tokens: 4000

  uses_tools:
    - kv
    - file_manager

  limits:
    max_turns: 10
    max_tokens_per_invocation: 20000

depends_on:
  - kv

config:
  style_guide: PEP 8

enabled: true
"#;

    #[test]
    fn the_seed_example_loads_with_its_prompt_rendered_and_the_last_description() {
        let d = dir();
        std::fs::create_dir(d.path().join("prompts")).unwrap();
        std::fs::write(
            d.path().join("prompts/code_reviewer.jinja2"),
            "You are {{ agent.name }}. Follow {{ style_guide }}.",
        )
        .unwrap();
        let a = parse(SEED_EXAMPLE, d.path(), d.path())
            .unwrap()
            .agent()
            .unwrap();
        assert_eq!(a.registry_id, "agent_code_reviewer");
        assert_eq!(a.instructions, "You are Code Review Agent. Follow PEP 8.");
        assert!(a.description.starts_with("Use this agent when"));
        assert_eq!(a.uses_tools, vec!["kv", "file_manager"]);
        assert_eq!(a.limits.max_turns, 10);
        assert_eq!(a.limits.max_tokens_per_invocation, 20_000);
        assert_eq!(a.limits.time_budget_ms, 120_000);
        assert_eq!(a.max_output_tokens, Some(4000));
        assert_eq!(a.temperature, Some(0.2));
        assert_eq!(a.capabilities[0].name, "code_reviewer");
    }

    #[test]
    fn instructions_come_from_the_extension_dir_then_the_root_inline_or_empty() {
        let root = dir();
        let ext = root.path().join("ext");
        std::fs::create_dir(&ext).unwrap();
        std::fs::write(
            root.path().join("shared.md"),
            "from the root {{ not rendered }}",
        )
        .unwrap();
        let vars = Map::new();
        assert_eq!(
            resolve_instructions("shared.md", &ext, root.path(), &vars).unwrap(),
            "from the root {{ not rendered }}"
        );
        std::fs::write(ext.join("shared.md"), "from the extension").unwrap();
        assert_eq!(
            resolve_instructions("shared.md", &ext, root.path(), &vars).unwrap(),
            "from the extension"
        );
        assert_eq!(
            resolve_instructions("", &ext, root.path(), &vars).unwrap(),
            ""
        );
        assert_eq!(
            resolve_instructions("Be kind.\nBe brief.", &ext, root.path(), &vars).unwrap(),
            "Be kind.\nBe brief."
        );
        let missing = resolve_instructions("nope.jinja2", &ext, root.path(), &vars).unwrap_err();
        assert!(missing.contains("not found"), "{missing}");
        let undefined = resolve_instructions("Hi {{ who }}", &ext, root.path(), &vars).unwrap_err();
        assert!(undefined.contains("undefined"), "{undefined}");
        std::fs::write(root.path().join("secret.md"), "x").unwrap();
        let escape = resolve_instructions("../secret.md", &ext, &ext, &vars).unwrap_err();
        assert!(escape.contains("outside"), "{escape}");
    }

    fn errors(yaml: &str) -> String {
        let d = dir();
        parse(yaml, d.path(), d.path()).unwrap_err().join("\n")
    }

    #[test]
    fn every_invalid_case_is_named() {
        let base = "id: a\nname: A\ndescription: d\n";
        let cases = [
            (
                "name: A\ndescription: d\nagent: {model: m, instructions: ''}",
                "id is required",
            ),
            (
                "id: Bad-Id\nname: A\ndescription: d\nagent: {model: m, instructions: ''}",
                "must match",
            ),
            (
                "id: a\ndescription: d\nagent: {model: m, instructions: ''}",
                "name is required",
            ),
            (
                &format!("{base}agent: {{instructions: ''}}"),
                "agent.model is required",
            ),
            (
                &format!("{base}agent: {{model: m}}"),
                "agent.instructions is required",
            ),
            (
                &format!(
                    "{base}agent: {{model: m, instructions: '', integration_mode: handoff, parameters: {{output_format: json}}}}"
                ),
                "a handoff agent talks with a person",
            ),
            (
                &format!("{base}agent: {{model: m, instructions: '', integration_mode: solo}}"),
                "tool or handoff",
            ),
            (
                &format!(
                    "{base}agent: {{model: m, instructions: '', parameters: {{temperature: 3}}}}"
                ),
                "between 0.0 and 2.0",
            ),
            (
                &format!(
                    "{base}agent: {{model: m, instructions: '', parameters: {{temprature: 1}}}}"
                ),
                "not a known parameter",
            ),
            (
                &format!(
                    "{base}agent: {{model: m, instructions: '', parameters: {{max_output_tokens: 0}}}}"
                ),
                "positive integer",
            ),
            (
                &format!("{base}agent: {{model: m, instructions: '', uses_tools: [kv, kv]}}"),
                "listed twice",
            ),
            (
                &format!("{base}agent: {{model: m, instructions: '', limits: {{max_turns: 0}}}}"),
                "must be positive",
            ),
            (
                &format!("{base}agent: {{model: m, instructions: '', limits: {{max_turnz: 3}}}}"),
                "unknown field",
            ),
            (
                &format!(
                    "{base}agent: {{model: m, instructions: '', parameters: {{output_schema: {{type: 12}}}}}}"
                ),
                "not a valid JSON Schema",
            ),
            ("id: a\nname: A\ndescription: d\n", "needs an entrypoint"),
            (
                "id: a\nname: A\nagent: {model: m, instructions: ''}",
                "description is required",
            ),
            (
                "id: a\nname: A\ndescription: d\nagent: {model: m, instructions: ''}\ncapabilities: [Bad]",
                "capabilities",
            ),
            ("id: a\nname: [oops", "not a valid manifest"),
        ];
        for (yaml, want) in cases {
            let e = errors(yaml);
            assert!(e.contains(want), "{yaml}\n=> {e}\n(wanted {want:?})");
        }
    }

    #[test]
    fn programmatic_plain_and_disabled_manifests_are_skipped_not_refused() {
        let d = dir();
        let skip = |y: &str| match parse(y, d.path(), d.path()).unwrap() {
            Parsed::Skipped(why) => why,
            Parsed::Agent(_) => panic!("{y} loaded as an agent"),
        };
        assert!(
            skip("id: b\nname: B\nentrypoint: main:B\nagent: {model: m}").contains("programmatic")
        );
        assert!(skip("id: k\nname: K\nentrypoint: main:Kv").contains("not an agent"));
        assert!(
            skip("id: o\nname: O\nenabled: false\nagent: {model: m}").contains("enabled: false")
        );
    }

    #[test]
    fn a_directory_refuses_colliding_ids_and_names_and_reports_every_problem() {
        let d = dir();
        let write = |sub: &str, y: &str| {
            std::fs::create_dir_all(d.path().join(sub)).unwrap();
            std::fs::write(d.path().join(sub).join("manifest.yaml"), y).unwrap();
        };
        write(
            "one",
            "id: sum\nname: Summarizer\ndescription: d\nagent: {model: m, instructions: hi}",
        );
        write(
            "two",
            "id: sum\nname: Other\ndescription: d\nagent: {model: m, instructions: hi}",
        );
        write(
            "three",
            "id: third\nname: Summarizer\ndescription: d\nagent: {model: m, instructions: hi}",
        );
        write(
            "four",
            "id: four\nname: Four\nagent: {model: m, instructions: hi}",
        );
        let e = load_dir(d.path(), d.path()).unwrap_err().join("\n");
        assert!(e.contains("agent id \"sum\" is already defined"), "{e}");
        assert!(
            e.contains("agent name \"Summarizer\" is already used"),
            "{e}"
        );
        assert!(e.contains("description is required"), "{e}");
        let empty = dir();
        assert!(load_dir(empty.path(), empty.path()).unwrap_err()[0].contains("no manifest.yaml"));
    }

    const PROPOSED: &str = "id: poet\nname: Poet\ndescription: Writes short poems.\ncapabilities: [built.poet]\nagent:\n  model: gpt-4o-mini\n  instructions: |\n    Write a four-line poem.\n  uses_tools: [web_search]\n";

    #[test]
    fn a_proposed_agent_is_checked_from_its_text_alone_fenced_or_not() {
        let grants = ["web_search".to_owned()];
        let a = check_proposed(PROPOSED, &grants, "the builder may grant").unwrap();
        assert_eq!(
            (a.registry_id.as_str(), a.instructions.trim()),
            ("agent_poet", "Write a four-line poem.")
        );
        let fenced = format!("```yaml\n{PROPOSED}```\n");
        assert_eq!(
            check_proposed(&fenced, &grants, "the builder may grant")
                .unwrap()
                .id,
            "poet"
        );
        assert_eq!(unfenced(&fenced), PROPOSED.trim());
    }

    #[test]
    fn a_proposal_is_refused_with_every_problem_at_once() {
        let bad = "id: Poet\nname: Poet\ndescription: ''\nagent:\n  model: gpt-4o-mini\n  instructions: prompts/poet.md\n  uses_tools: [web_search, kv]\n  artifact: {kind: agent_manifest}\n";
        let es = check_proposed(bad, &[], "the builder may grant").unwrap_err();
        for want in [
            "names a file",
            "may not keep artifacts",
            "id \"Poet\" must match",
            "description is required",
            "\"web_search\" may not be granted (the builder may grant: no tools)",
            "\"kv\" may not be granted",
        ] {
            assert!(
                es.iter().any(|e| e.contains(want)),
                "{want:?} not in {es:?}"
            );
        }
        let skipped = "id: x\nname: X\nentrypoint: x.py\nagent:\n  model: m\n";
        let es = check_proposed(skipped, &[], "the builder may grant").unwrap_err();
        assert!(es[0].contains("not a declarative agent to host"), "{es:?}");
        assert!(check_proposed("[not, a, manifest]", &[], "the builder may grant").is_err());
    }

    #[test]
    fn an_artifact_block_names_a_kind_and_grants_only_for_agent_manifests() {
        let d = dir();
        let with = |artifact: &str| {
            format!(
                "id: b\nname: B\ndescription: Builds.\nagent:\n  model: m\n  instructions: ''\n  artifact: {artifact}\n"
            )
        };
        let a = parse(
            &with("{kind: agent_manifest, grants: [kv]}"),
            d.path(),
            d.path(),
        )
        .unwrap()
        .agent()
        .unwrap();
        let keep = a.artifact.unwrap();
        assert_eq!(
            (keep.kind, keep.name.as_str()),
            (ArtifactKind::AgentManifest, "manifest.yaml")
        );
        assert_eq!(keep.grants, ["kv"]);
        let es = parse(&with("{kind: pr, grants: [kv]}"), d.path(), d.path()).unwrap_err();
        assert!(
            es.iter()
                .any(|e| e.contains("agent.artifact.kind must be one of")),
            "{es:?}"
        );
        let es = parse(&with("{kind: test_plan, grants: [kv]}"), d.path(), d.path()).unwrap_err();
        assert!(
            es.iter()
                .any(|e| e.contains("grants is for agent_manifest")),
            "{es:?}"
        );
        let es = parse(&with("{kind: file, name: ../x}"), d.path(), d.path()).unwrap_err();
        assert!(
            es.iter().any(|e| e.contains("agent.artifact.name")),
            "{es:?}"
        );
    }
}
