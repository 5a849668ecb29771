//! Policy as code: Cedar policies over who acts, what they do (submit a
//! job, spend on a model, call a tool with its arguments, delegate, hand
//! off, nest a budget, publish) and the facts around it (the estimate, the
//! budget's remaining, the job's labels and plan, the delegation depth,
//! the time).
//!
//! A [`PolicySet`] is loaded from sources (files, the store, the config's
//! rules compiled to Cedar), validated against [`SCHEMA`] and named by its
//! content hash (its version). [`PolicySet::decide`] evaluates one action
//! in-process and returns a [`Decision`]: auto-approved, needs people,
//! forbidden, or no policy decided. [`Engine`] holds the set in force and
//! replaces it only with a set that loads; [`watch`] reloads a directory.

mod engine;
mod facts;
mod replay;
mod run;

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr as _;
use std::sync::{Arc, LazyLock};

use cedar_policy as cedar;
use sha2::{Digest as _, Sha256};

pub use engine::{Engine, Feed, Reload, Slot, stored_source, watch};
pub use facts::{Action, Estimate, Facts, JobFacts, Principal, PrincipalKind, Remaining};
pub use replay::{Change, Difference, Outcome, Recorded, replay};
pub use run::{record, run_facts};

/// The schema every policy is validated against (Cedar schema syntax).
pub const SCHEMA: &str = include_str!("schema.cedarschema");

/// Most approvers a policy may require.
pub const MAX_APPROVERS: u32 = 5;

static PARSED: LazyLock<Result<cedar::Schema, String>> = LazyLock::new(|| {
    cedar::Schema::from_cedarschema_str(SCHEMA)
        .map(|(s, _warnings)| s)
        .map_err(|e| e.to_string())
});

/// The parsed schema. It is compiled into the binary and tested, so a
/// failure here is a build defect, reported as such.
fn schema() -> Result<&'static cedar::Schema, PolicyError> {
    PARSED.as_ref().map_err(|e| PolicyError::Schema(e.clone()))
}

/// Why a policy set did not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The built-in schema does not parse (a defect of this build).
    #[error("the built-in policy schema does not parse: {0}")]
    Schema(String),
    /// A source does not parse as Cedar.
    #[error("{source_name}: not a Cedar policy: {message}")]
    Parse {
        /// The file (or rule) it came from.
        source_name: String,
        /// Cedar's error.
        message: String,
    },
    /// Two policies have one id.
    #[error("policy id {id:?} is used twice ({first} and {second}): give each policy its own @id")]
    Duplicate {
        /// The id.
        id: String,
        /// Where it was first.
        first: String,
        /// Where again.
        second: String,
    },
    /// A policy does not type-check against the schema.
    #[error("policy {id:?} ({source_name}) does not fit the schema: {message}")]
    Invalid {
        /// The policy's id.
        id: String,
        /// The file it came from.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// An annotation Switchyard reads has a value it cannot use.
    #[error("policy {id:?} ({source_name}): {message}")]
    Annotation {
        /// The policy's id.
        id: String,
        /// The file it came from.
        source_name: String,
        /// What is wrong and what would be right.
        message: String,
    },
    /// The sources could not be read.
    #[error("cannot read policies from {path}: {message}")]
    Read {
        /// The directory or file.
        path: String,
        /// The I/O error.
        message: String,
    },
}

/// One policy source: a file's text and the name it is reported by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// A file name (`spend.cedar`) or where the text came from.
    pub name: String,
    /// Cedar policies.
    pub text: String,
}

/// A loaded, validated policy set.
#[derive(Clone)]
pub struct PolicySet {
    set: cedar::PolicySet,
    version: String,
    /// Where each policy came from, by id.
    origin: std::collections::HashMap<String, String>,
    /// Policies whose effect is `forbid`.
    forbids: BTreeSet<String>,
    /// What each policy's annotations say, by id (read once at load: a
    /// lookup by Cedar's API parses the key every time).
    notes: std::collections::HashMap<String, Notes>,
    /// The policies each decision evaluates, by action and resource: Cedar
    /// evaluates every policy of the set it is given, so a decision is
    /// given only those whose scope can match.
    index: std::collections::HashMap<Action, Slice>,
}

/// The annotations a decision reads.
#[derive(Clone, Debug, Default)]
struct Notes {
    /// People a requiring permit asks for (`@approval` / `@approvers`).
    approvers: Option<u32>,
    /// `@message`.
    message: Option<String>,
}

/// The policies of one action: those whose scope names a resource, by
/// that resource, each with those that name none; and those that name
/// none alone.
#[derive(Clone, Default)]
struct Slice {
    any: cedar::PolicySet,
    by_resource: std::collections::HashMap<cedar::EntityUid, cedar::PolicySet>,
}

/// Splits `set` by action and resource scope (see [`Slice`]).
fn index(set: &cedar::PolicySet) -> Result<std::collections::HashMap<Action, Slice>, String> {
    let mut out: std::collections::HashMap<Action, Slice> =
        Action::ALL.iter().map(|a| (*a, Slice::default())).collect();
    let mut named: Vec<(Action, cedar::EntityUid, cedar::Policy)> = Vec::new();
    for p in set.policies() {
        let actions: Vec<Action> = match p.action_constraint() {
            cedar::ActionConstraint::Any => Action::ALL.to_vec(),
            cedar::ActionConstraint::Eq(uid) => {
                Action::parse(uid.id().as_ref()).into_iter().collect()
            }
            cedar::ActionConstraint::In(uids) => uids
                .iter()
                .filter_map(|u| Action::parse(u.id().as_ref()))
                .collect(),
        };
        // Entities here have no parents: `resource in X` is `resource == X`.
        let resource = match p.resource_constraint() {
            cedar::ResourceConstraint::Eq(uid) | cedar::ResourceConstraint::In(uid) => Some(uid),
            _ => None,
        };
        for a in actions {
            match &resource {
                Some(uid) => named.push((a, uid.clone(), p.clone())),
                None => {
                    let slice = out.entry(a).or_default();
                    slice.any.add(p.clone()).map_err(|e| e.to_string())?;
                }
            }
        }
    }
    for (a, uid, p) in named {
        let slice = out.entry(a).or_default();
        let any = slice.any.clone();
        let set = slice.by_resource.entry(uid).or_insert(any);
        set.add(p).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

impl fmt::Debug for PolicySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicySet")
            .field("version", &self.version)
            .field("policies", &self.origin.len())
            .finish()
    }
}

impl PolicySet {
    /// The empty set: no policy decides anything.
    pub fn empty() -> PolicySet {
        PolicySet {
            set: cedar::PolicySet::new(),
            version: version_of(&[]),
            origin: Default::default(),
            forbids: Default::default(),
            notes: Default::default(),
            index: Default::default(),
        }
    }

    /// Parses, names and validates `sources`. A policy's id is its
    /// `@id("...")` annotation, or `<source>#<n>` (its position there).
    /// Any error refuses the whole set.
    pub fn load(sources: &[Source]) -> Result<PolicySet, PolicyError> {
        let schema = schema()?;
        let mut set = cedar::PolicySet::new();
        let mut origin = std::collections::HashMap::new();
        let mut forbids = BTreeSet::new();
        let mut notes = std::collections::HashMap::new();
        for src in sources {
            let parsed = cedar::PolicySet::from_str(&src.text).map_err(|e| PolicyError::Parse {
                source_name: src.name.clone(),
                message: one_line(&e),
            })?;
            if parsed.templates().next().is_some() {
                return Err(PolicyError::Parse {
                    source_name: src.name.clone(),
                    message:
                        "templates (?principal, ?resource) are not used here: write static policies"
                            .into(),
                });
            }
            // Cedar numbers a file's policies policy0, policy1, … in order.
            let mut policies: Vec<&cedar::Policy> = parsed.policies().collect();
            policies.sort_by_key(|p| {
                p.id()
                    .to_string()
                    .trim_start_matches("policy")
                    .parse::<usize>()
                    .unwrap_or(usize::MAX)
            });
            for (n, p) in policies.into_iter().enumerate() {
                let id = p
                    .annotation("id")
                    .map_or_else(|| format!("{}#{n}", src.name), str::to_owned);
                check_annotations(p, &id, &src.name)?;
                if let Some(first) = origin.get(&id) {
                    return Err(PolicyError::Duplicate {
                        id,
                        first: String::clone(first),
                        second: src.name.clone(),
                    });
                }
                if p.effect() == cedar::Effect::Forbid {
                    forbids.insert(id.clone());
                }
                let approvers = p.annotation("approvers").and_then(|n| n.parse().ok());
                notes.insert(
                    id.clone(),
                    Notes {
                        approvers: approvers.or(p.annotation("approval").map(|_| 1)),
                        message: p.annotation("message").map(str::to_owned),
                    },
                );
                set.add(p.new_id(cedar::PolicyId::new(&id)))
                    .map_err(|e| PolicyError::Parse {
                        source_name: src.name.clone(),
                        message: one_line(&e),
                    })?;
                origin.insert(id, src.name.clone());
            }
        }
        let validated =
            cedar::Validator::new(schema.clone()).validate(&set, cedar::ValidationMode::Strict);
        if let Some(e) = validated.validation_errors().next() {
            let id = e.policy_id().to_string();
            return Err(PolicyError::Invalid {
                source_name: origin.get(&id).cloned().unwrap_or_default(),
                id,
                message: one_line(e),
            });
        }
        let index = index(&set).map_err(|message| PolicyError::Parse {
            source_name: "(index)".into(),
            message,
        })?;
        Ok(PolicySet {
            set,
            version: version_of(sources),
            origin,
            forbids,
            notes,
            index,
        })
    }

    /// The set's version: `sha256:` and the hash of its sources, in order.
    /// The same policies give the same version on every replica.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// How many policies it holds.
    pub fn len(&self) -> usize {
        self.origin.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.origin.is_empty()
    }

    /// The policies' ids, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.origin.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Decides `facts`: one evaluation of every policy whose scope can
    /// match (the same decision as evaluating them all).
    pub fn decide(&self, facts: &Facts) -> Decision {
        // Cedar refuses to go on with less than 100 KiB of stack left, and
        // converting the facts and evaluating recurse on their own; with
        // less than 1 MiB left (a decision made deep in in-process calls:
        // an LLM tool delegating through admission into approval, a
        // schedule's tick on PostgreSQL) it runs on a fresh 4 MiB segment
        // rather than failing and sending the run to a person for no reason
        // of its own.
        stacker::maybe_grow(1024 * 1024, 4 * 1024 * 1024, || self.decide_in(facts, true))
    }

    /// [`PolicySet::decide`], evaluating only the policies `facts`' action
    /// and resource can match when `indexed`, else every policy.
    fn decide_in(&self, facts: &Facts, indexed: bool) -> Decision {
        let mut decision = Decision {
            verdict: Verdict::Default,
            version: self.version.clone(),
            errors: Vec::new(),
        };
        if self.is_empty() {
            return decision;
        }
        let (request, entities) = match facts.to_cedar() {
            Ok(r) => r,
            Err(e) => {
                // Our own facts did not convert: never approve on that.
                decision.errors.push(e);
                decision.verdict = Verdict::Require {
                    by: Vec::new(),
                    approvers: 1,
                    message: "the policy facts could not be built, so a person decides".into(),
                };
                return decision;
            }
        };
        let slice = self.index.get(&facts.action).filter(|_| indexed);
        let set = slice.map_or(&self.set, |slice| {
            request
                .resource()
                .and_then(|r| slice.by_resource.get(r))
                .unwrap_or(&slice.any)
        });
        let response = cedar::Authorizer::new().is_authorized(&request, set, &entities);
        let mut errored_forbid = Vec::new();
        for e in response.diagnostics().errors() {
            let cedar::AuthorizationError::PolicyEvaluationError(inner) = e;
            let id = inner.policy_id().to_string();
            if self.forbids.contains(&id) {
                errored_forbid.push(id.clone());
            }
            decision.errors.push(format!("{id}: {}", one_line(e)));
        }
        let mut reasons: Vec<String> = response
            .diagnostics()
            .reason()
            .map(ToString::to_string)
            .collect();
        reasons.sort();
        decision.verdict = match response.decision() {
            cedar::Decision::Deny if !reasons.is_empty() => {
                let message = reasons
                    .iter()
                    .find_map(|id| self.message(id))
                    .unwrap_or("the action is forbidden by policy")
                    .to_owned();
                Verdict::Forbid {
                    by: reasons,
                    message,
                }
            }
            // A forbid that failed to evaluate fails closed.
            _ if !errored_forbid.is_empty() => Verdict::Forbid {
                message: format!(
                    "policy {} could not be evaluated for this action, so it is refused",
                    errored_forbid.join(", ")
                ),
                by: errored_forbid,
            },
            cedar::Decision::Deny => Verdict::Default,
            cedar::Decision::Allow => {
                let requiring: Vec<String> = reasons
                    .iter()
                    .filter(|id| self.approvers(id).is_some())
                    .cloned()
                    .collect();
                if requiring.is_empty() && decision.errors.is_empty() {
                    Verdict::Permit { by: reasons }
                } else if requiring.is_empty() {
                    // A policy that erred may have been a requirement:
                    // never auto-approve past it.
                    Verdict::Require {
                        by: reasons,
                        approvers: 1,
                        message: "a policy could not be evaluated, so a person decides".into(),
                    }
                } else {
                    let approvers = requiring
                        .iter()
                        .filter_map(|id| self.approvers(id))
                        .max()
                        .unwrap_or(1);
                    let message = requiring
                        .iter()
                        .find_map(|id| self.message(id))
                        .map_or_else(
                            || format!("required by policy {}", requiring.join(", ")),
                            str::to_owned,
                        );
                    Verdict::Require {
                        by: requiring,
                        approvers,
                        message,
                    }
                }
            }
        };
        decision
    }

    /// Policy `id`'s `@message`.
    fn message(&self, id: &str) -> Option<&str> {
        self.notes.get(id).and_then(|n| n.message.as_deref())
    }

    /// The people policy `id` requires, when it is a requirement.
    fn approvers(&self, id: &str) -> Option<u32> {
        self.notes.get(id).and_then(|n| n.approvers)
    }
}

/// Checks the annotations Switchyard reads.
fn check_annotations(p: &cedar::Policy, id: &str, source: &str) -> Result<(), PolicyError> {
    let bad = |message: String| PolicyError::Annotation {
        id: id.to_owned(),
        source_name: source.to_owned(),
        message,
    };
    if id.is_empty() || id.len() > 128 || id.chars().any(char::is_control) {
        return Err(bad("@id must be 1 to 128 printable characters".into()));
    }
    let forbid = p.effect() == cedar::Effect::Forbid;
    if let Some(v) = p.annotation("approval") {
        if v != "required" {
            return Err(bad(format!(
                "@approval({v:?}) is not understood: the one value is @approval(\"required\")"
            )));
        }
        if forbid {
            return Err(bad(
                "@approval applies to permit policies; a forbid already refuses".into(),
            ));
        }
    }
    if let Some(v) = p.annotation("approvers") {
        if forbid {
            return Err(bad("@approvers applies to permit policies".into()));
        }
        match v.parse::<u32>() {
            Ok(n) if (1..=MAX_APPROVERS).contains(&n) => {}
            _ => {
                return Err(bad(format!(
                    "@approvers({v:?}) must be a number of people from 1 to {MAX_APPROVERS}"
                )));
            }
        }
    }
    Ok(())
}

/// The version of `sources`: a hash of each name and text, in order.
fn version_of(sources: &[Source]) -> String {
    let mut h = Sha256::new();
    for s in sources {
        h.update((s.name.len() as u64).to_be_bytes());
        h.update(s.name.as_bytes());
        h.update((s.text.len() as u64).to_be_bytes());
        h.update(s.text.as_bytes());
    }
    let mut v = String::from("sha256:");
    for b in h.finalize() {
        v.push_str(&format!("{b:02x}"));
    }
    v
}

/// An error's text on one line (Cedar's can span several).
fn one_line(e: &dyn fmt::Display) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the policies decided about one action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The outcome.
    pub verdict: Verdict,
    /// The policy set's version that decided.
    pub version: String,
    /// Policies that failed to evaluate (`id: error`); such a failure never
    /// approves.
    pub errors: Vec<String>,
}

/// The outcome of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No policy matched: the action's default applies.
    Default,
    /// Approved at once by these policies.
    Permit {
        /// The permitting policies' ids.
        by: Vec<String>,
    },
    /// Needs people: `approvers` distinct ones.
    Require {
        /// The requiring policies' ids.
        by: Vec<String>,
        /// How many distinct people approve.
        approvers: u32,
        /// Why (the policy's `@message`, or which policy).
        message: String,
    },
    /// Refused.
    Forbid {
        /// The forbidding policies' ids.
        by: Vec<String>,
        /// Why (the first forbid's `@message`).
        message: String,
    },
}

impl Verdict {
    /// `default`, `permit`, `require` or `forbid`.
    pub fn effect(&self) -> &'static str {
        match self {
            Verdict::Default => "default",
            Verdict::Permit { .. } => "permit",
            Verdict::Require { .. } => "require",
            Verdict::Forbid { .. } => "forbid",
        }
    }

    /// How many distinct people it asks for: 0 unless it requires people.
    pub fn approvers(&self) -> u32 {
        match self {
            Verdict::Require { approvers, .. } => *approvers,
            _ => 0,
        }
    }

    /// The deciding policies' ids.
    pub fn by(&self) -> &[String] {
        match self {
            Verdict::Default => &[],
            Verdict::Permit { by } | Verdict::Require { by, .. } | Verdict::Forbid { by, .. } => by,
        }
    }
}

impl Decision {
    /// One sentence a person reads: "auto-approved by small-spend",
    /// "needs 2 approvers because …", "forbidden by … : …".
    pub fn explain(&self) -> String {
        match &self.verdict {
            Verdict::Default => "no policy decides it: the default applies".into(),
            Verdict::Permit { by } => format!("auto-approved by {}", by.join(", ")),
            Verdict::Require {
                by,
                approvers,
                message,
            } => {
                let who = if *approvers == 1 {
                    "a person's approval".to_owned()
                } else {
                    format!("{approvers} distinct approvers")
                };
                if by.is_empty() {
                    format!("needs {who}: {message}")
                } else {
                    format!("needs {who} because of {}: {message}", by.join(", "))
                }
            }
            Verdict::Forbid { by, message } => {
                format!("forbidden by {}: {message}", by.join(", "))
            }
        }
    }
}

/// Reads every `*.cedar` file of `dir`, sorted by name.
pub fn read_dir(dir: &std::path::Path) -> Result<Vec<Source>, PolicyError> {
    let read = |e: std::io::Error| PolicyError::Read {
        path: dir.display().to_string(),
        message: e.to_string(),
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let path = entry.map_err(read)?.path();
        if path.extension().is_some_and(|e| e == "cedar") && path.is_file() {
            names.push(path);
        }
    }
    names.sort();
    names
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(|e| PolicyError::Read {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok(Source { name, text })
        })
        .collect()
}

/// The shared pointer a decision reads (cheap to clone).
pub type Shared = Arc<PolicySet>;

#[cfg(test)]
mod tests;

/// `[policy]` configuration: where Cedar policies are read from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// A directory of `*.cedar` policy files, validated against the schema
    /// at start (a broken set stops the start) and read again every
    /// `reload_ms` (a broken change is refused and the set in force
    /// stays). On Kubernetes, a ConfigMap mounted as a directory. Unset:
    /// only the `[[approval.policies]]` rules.
    pub dir: Option<std::path::PathBuf>,
    /// How often `dir` and the policy store are read again for changes, ms.
    pub reload_ms: u64,
    /// Where a process without the approval service reads the policy
    /// store (the approval service's gRPC URL; an executor defaults to
    /// `executor.approval_url`). Unset there: only the rules and `dir`.
    pub approval_url: Option<String>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            dir: None,
            reload_ms: 2_000,
            approval_url: None,
        }
    }
}

impl PolicyConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        if self.reload_ms == 0 {
            return Err("policy.reload_ms must be > 0".into());
        }
        Ok(())
    }
}
