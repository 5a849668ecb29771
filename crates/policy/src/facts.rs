//! The facts of one action, as the schema describes them, and their Cedar
//! request.

use std::collections::BTreeMap;

use cedar_policy as cedar;
use cedar_policy::RestrictedExpression as E;

/// The actions policies decide.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Submitting a job (resource: the job).
    #[default]
    SubmitJob,
    /// Spending on a model: a run's approval (resource: the model).
    Spend,
    /// A model calling a tool (resource: the tool; its arguments are tags).
    CallTool,
    /// A running run delegating to another agent (resource: the agent).
    Delegate,
    /// A conversation handed off to another agent (resource: the agent).
    HandOff,
    /// A budget nested under another (resource: the budget).
    NestBudget,
    /// Publishing an artifact (resource: its kind).
    Publish,
}

impl Action {
    /// Every action.
    pub const ALL: [Action; 7] = [
        Action::SubmitJob,
        Action::Spend,
        Action::CallTool,
        Action::Delegate,
        Action::HandOff,
        Action::NestBudget,
        Action::Publish,
    ];

    /// The action's name in policies (`Action::"spend"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SubmitJob => "submit_job",
            Action::Spend => "spend",
            Action::CallTool => "call_tool",
            Action::Delegate => "delegate",
            Action::HandOff => "hand_off",
            Action::NestBudget => "nest_budget",
            Action::Publish => "publish",
        }
    }

    /// The action named `s`.
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// The entity type of its resource.
    fn resource_type(self) -> &'static str {
        match self {
            Action::SubmitJob => "Job",
            Action::Spend => "Model",
            Action::CallTool => "Tool",
            Action::Delegate | Action::HandOff => "Agent",
            Action::NestBudget => "Budget",
            Action::Publish => "ArtifactKind",
        }
    }
}

/// Who acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrincipalKind {
    /// A person.
    #[default]
    Person,
    /// An agent with its own key.
    Agent,
    /// A service principal.
    Service,
}

impl PrincipalKind {
    /// The kind of a principal by Switchyard's kind names (`human`,
    /// `agent`, `service`); anything else is a person.
    pub fn from_kind(kind: &str) -> PrincipalKind {
        match kind {
            "agent" => PrincipalKind::Agent,
            "service" => PrincipalKind::Service,
            _ => PrincipalKind::Person,
        }
    }

    fn entity_type(self) -> &'static str {
        match self {
            PrincipalKind::Person => "Person",
            PrincipalKind::Agent => "Agent",
            PrincipalKind::Service => "Service",
        }
    }
}

/// The principal: always an authenticated one (the caller, or the job's
/// submitter for what a job does for them).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Principal {
    /// Person, agent or service.
    pub kind: PrincipalKind,
    /// Its subject.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
}

impl Principal {
    /// The principal `id` of `tenant`, of Switchyard's kind `kind`
    /// (`human`, `agent`, `service`).
    pub fn of(kind: &str, id: &str, tenant: &str) -> Principal {
        Principal {
            kind: PrincipalKind::from_kind(kind),
            id: id.to_owned(),
            tenant: tenant.to_owned(),
        }
    }
}

/// The job an action belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct JobFacts {
    /// Its id.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its submitter.
    pub submitter: String,
    /// Its labels (the Job entity's tags).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// What an action may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Estimate {
    /// Whether its cost is known.
    pub priced: bool,
    /// Tokens.
    pub tokens: u64,
    /// Micro-USD (0 when not priced).
    pub micro_usd: i64,
}

/// What the action's budget has left. Recorded as its amounts (`null`:
/// unlimited), so no number past what a JSON reader keeps exactly is
/// written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(into = "RemainingAmounts", from = "RemainingAmounts")]
pub struct Remaining {
    /// Whether it is known.
    pub known: bool,
    /// Tokens left.
    pub tokens: u64,
    /// Micro-USD left.
    pub micro_usd: i64,
}

/// [`Remaining`] as it is recorded.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct RemainingAmounts {
    known: bool,
    tokens: Option<u64>,
    micro_usd: Option<i64>,
}

impl From<Remaining> for RemainingAmounts {
    fn from(r: Remaining) -> Self {
        RemainingAmounts {
            known: r.known,
            tokens: (r.tokens < i64::MAX as u64).then_some(r.tokens),
            micro_usd: (r.micro_usd < i64::MAX).then_some(r.micro_usd),
        }
    }
}

impl From<RemainingAmounts> for Remaining {
    fn from(a: RemainingAmounts) -> Self {
        Remaining {
            known: a.known,
            tokens: a.tokens.unwrap_or(i64::MAX as u64),
            micro_usd: a.micro_usd.unwrap_or(i64::MAX),
        }
    }
}

impl Remaining {
    /// What a budget with these limits left has: known when either is set;
    /// an unlimited one reads as the largest Cedar `Long`, so a policy's
    /// `context.remaining.micro_usd < 100` never holds for it.
    pub fn left(tokens: Option<u64>, micro_usd: Option<i64>) -> Self {
        Remaining {
            known: tokens.is_some() || micro_usd.is_some(),
            tokens: tokens.unwrap_or(i64::MAX as u64),
            micro_usd: micro_usd.unwrap_or(i64::MAX),
        }
    }

    /// The amounts as [`Remaining::left`] took them (`None`: unlimited);
    /// both `None` when unknown.
    pub fn amounts(&self) -> (Option<u64>, Option<i64>) {
        if !self.known {
            return (None, None);
        }
        (
            (self.tokens < i64::MAX as u64).then_some(self.tokens),
            (self.micro_usd < i64::MAX).then_some(self.micro_usd),
        )
    }

    /// The less of the two in each amount: what an action may spend when
    /// its budget and the budget above it both bound it.
    pub fn min(self, other: Remaining) -> Self {
        match (self.known, other.known) {
            (false, _) => other,
            (_, false) => self,
            _ => Remaining {
                known: true,
                tokens: self.tokens.min(other.tokens),
                micro_usd: self.micro_usd.min(other.micro_usd),
            },
        }
    }
}

/// Everything a policy may look at about one action.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Facts {
    /// Who acts.
    pub principal: Principal,
    /// What they do.
    pub action: Action,
    /// What to: the job's id, the model, the tool, the agent, the budget or
    /// the artifact kind, by the action.
    pub resource: String,
    /// The job it belongs to.
    pub job: JobFacts,
    /// The model that spends.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// What it may spend.
    pub estimate: Estimate,
    /// What its budget has left.
    pub remaining: Remaining,
    /// The tools the run may use.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// The outputs the run may propose.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// Delegation depth (0: the job's own run).
    #[serde(skip_serializing_if = "is_zero")]
    pub depth: u32,
    /// The capabilities and models of the job's plan.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<String>,
    /// When, ms since the Unix epoch.
    pub now_ms: u64,
    /// A tool call's arguments (the Tool entity's tags).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// A nested budget's parent (the Budget entity's `parent`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub parent_budget: String,
}

/// Whether a count is zero (left out of a recorded decision).
pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn long(n: u64) -> E {
    E::new_long(i64::try_from(n).unwrap_or(i64::MAX))
}

fn strings(v: &[String]) -> E {
    E::new_set(v.iter().map(|s| E::new_string(s.clone())))
}

/// The schema's entity types, parsed once.
static TYPES: std::sync::LazyLock<Vec<(&'static str, cedar::EntityTypeName)>> =
    std::sync::LazyLock::new(|| {
        [
            "Person",
            "Agent",
            "Service",
            "Job",
            "Model",
            "Tool",
            "Budget",
            "ArtifactKind",
            "Action",
        ]
        .into_iter()
        .filter_map(|t| Some((t, t.parse().ok()?)))
        .collect()
    });

fn uid(ty: &str, id: &str) -> Result<cedar::EntityUid, String> {
    let ty = TYPES
        .iter()
        .find(|(name, _)| *name == ty)
        .map(|(_, t)| t.clone())
        .ok_or_else(|| format!("entity type {ty} is not in the schema"))?;
    Ok(cedar::EntityUid::from_type_name_and_id(
        ty,
        cedar::EntityId::new(id),
    ))
}

fn record(fields: Vec<(&str, E)>) -> Result<E, String> {
    E::new_record(fields.into_iter().map(|(k, v)| (k.to_owned(), v))).map_err(|e| e.to_string())
}

fn entity(
    uid: cedar::EntityUid,
    attrs: Vec<(&str, E)>,
    tags: Vec<(String, E)>,
) -> Result<cedar::Entity, String> {
    cedar::Entity::new_with_tags(
        uid,
        attrs.into_iter().map(|(k, v)| (k.to_owned(), v)),
        [],
        tags,
    )
    .map_err(|e| e.to_string())
}

/// An argument's value as a tag: a string as it is, anything else as JSON.
fn as_tag(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Facts {
    /// Hour of the day (0-23) and day of the week (1 = Monday) of `now_ms`, UTC.
    pub fn clock(&self) -> (u64, u64, u64) {
        let secs = self.now_ms / 1000;
        let days = secs / 86_400;
        (secs, (secs % 86_400) / 3600, (days + 3) % 7 + 1)
    }

    /// The Cedar request and entities of these facts.
    pub(crate) fn to_cedar(&self) -> Result<(cedar::Request, cedar::Entities), String> {
        let (entities, request) = self.parts()?;
        let entities = cedar::Entities::from_entities(entities, None).map_err(|e| e.to_string())?;
        Ok((request, entities))
    }

    /// The same, checked against the schema (tests and `policy check`).
    pub fn validated(&self) -> Result<(), String> {
        let schema = crate::schema().map_err(|e| e.to_string())?;
        let (entities, _) = self.parts()?;
        cedar::Entities::from_entities(entities, Some(schema)).map_err(|e| e.to_string())?;
        let (principal, action, resource, context) = self.request_parts()?;
        let context = cedar::Context::from_pairs(context).map_err(|e| e.to_string())?;
        cedar::Request::new(principal, action, resource, context, Some(schema))
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn request_parts(
        &self,
    ) -> Result<
        (
            cedar::EntityUid,
            cedar::EntityUid,
            cedar::EntityUid,
            Vec<(String, E)>,
        ),
        String,
    > {
        let principal = uid(self.principal.kind.entity_type(), &self.principal.id)?;
        let action = uid("Action", self.action.as_str())?;
        let resource = uid(self.action.resource_type(), &self.resource)?;
        let (unix, hour, weekday) = self.clock();
        let context = vec![
            (
                "job".to_owned(),
                E::new_entity_uid(uid("Job", &self.job.id)?),
            ),
            ("model".to_owned(), E::new_string(self.model.clone())),
            (
                "estimate".to_owned(),
                record(vec![
                    ("priced", E::new_bool(self.estimate.priced)),
                    ("tokens", long(self.estimate.tokens)),
                    ("micro_usd", E::new_long(self.estimate.micro_usd)),
                ])?,
            ),
            (
                "remaining".to_owned(),
                record(vec![
                    ("known", E::new_bool(self.remaining.known)),
                    ("tokens", long(self.remaining.tokens)),
                    ("micro_usd", E::new_long(self.remaining.micro_usd)),
                ])?,
            ),
            ("tools".to_owned(), strings(&self.tools)),
            ("outputs".to_owned(), strings(&self.outputs)),
            ("depth".to_owned(), long(u64::from(self.depth))),
            ("plan".to_owned(), strings(&self.plan)),
            (
                "now".to_owned(),
                record(vec![
                    ("unix", long(unix)),
                    ("hour", long(hour)),
                    ("weekday", long(weekday)),
                ])?,
            ),
        ];
        Ok((principal, action, resource, context))
    }

    fn parts(&self) -> Result<(Vec<cedar::Entity>, cedar::Request), String> {
        let (principal, action, resource, context) = self.request_parts()?;
        let tenant = |t: &str| vec![("tenant", E::new_string(t.to_owned()))];
        let mut entities = vec![entity(
            principal.clone(),
            tenant(&self.principal.tenant),
            vec![],
        )?];
        let job_uid = uid("Job", &self.job.id)?;
        entities.push(entity(
            job_uid.clone(),
            vec![
                ("tenant", E::new_string(self.job.tenant.clone())),
                ("submitter", E::new_string(self.job.submitter.clone())),
            ],
            self.job
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), E::new_string(v.clone())))
                .collect(),
        )?);
        let resource_entity = match self.action {
            Action::SubmitJob => None,
            Action::Spend | Action::Publish => Some(entity(resource.clone(), vec![], vec![])?),
            Action::CallTool => Some(entity(
                resource.clone(),
                vec![],
                self.arguments
                    .iter()
                    .map(|(k, v)| (k.clone(), E::new_string(as_tag(v))))
                    .collect(),
            )?),
            Action::Delegate | Action::HandOff => {
                Some(entity(resource.clone(), tenant(&self.job.tenant), vec![])?)
            }
            Action::NestBudget => Some(entity(
                resource.clone(),
                vec![("parent", E::new_string(self.parent_budget.clone()))],
                vec![],
            )?),
        };
        // A job submitting itself, or an agent delegating to itself, is one
        // entity.
        if let Some(e) = resource_entity
            && resource != principal
            && resource != job_uid
        {
            entities.push(e);
        }
        let context = cedar::Context::from_pairs(context).map_err(|e| e.to_string())?;
        let request = cedar::Request::new(principal, action, resource, context, None)
            .map_err(|e| e.to_string())?;
        Ok((entities, request))
    }
}
