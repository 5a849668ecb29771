//! What schedules and triggers share: the principal their jobs are
//! submitted as (their creator, kept with them), and the job template,
//! checked once at creation as SubmitJob checks a job.

use std::collections::BTreeMap;

use switchyard_kit::auth::{Kind, OnBehalf, Principal, Role};
use switchyard_proto::executor::v1::JobSpec;

use crate::Executor;
use crate::admission::{BudgetRight, acting_context, submitter};
use crate::error::{ExecutorError, Object};

/// The creator of a schedule or trigger: who its jobs are submitted as,
/// and the budgets they may be nested under.
#[derive(Debug, Clone)]
pub(crate) struct Creator {
    pub(crate) who: OnBehalf,
    pub(crate) right: BudgetRight,
}

/// A creator as kept on its object: subject, tenant, kind, roles, and
/// whether it manages budgets.
pub(crate) struct Kept<'a> {
    pub(crate) subject: &'a str,
    pub(crate) tenant: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) roles: &'a [String],
    pub(crate) manages_budgets: bool,
}

impl Creator {
    /// Principal `p` creating a `what` (`schedule`, `trigger`): a
    /// submitter of a tenant (an agent key submits only delegated
    /// children; a service acting for no one has no tenant).
    pub(crate) fn of(p: &Principal, what: Object) -> Result<Creator, ExecutorError> {
        let name = what.name();
        if !p.roles.has(Role::Submitter) && !p.roles.has(Role::Service) {
            return Err(ExecutorError::NotSubmitter(format!(
                "a {name} starts top-level jobs, which only a submitter submits (an agent key submits only delegated child jobs): create it with a submitter's key"
            )));
        }
        let who = submitter(p).ok_or_else(|| {
            ExecutorError::ObjectInvalid(what, format!(
                "a {name} belongs to a tenant and its jobs run as its creator: a service creates one on behalf of a user"
            ))
        })?;
        Ok(Creator {
            who,
            right: BudgetRight::of(p),
        })
    }

    /// The creator kept as `k`.
    pub(crate) fn stored(k: Kept<'_>) -> Creator {
        Creator {
            who: OnBehalf {
                subject: k.subject.to_owned(),
                tenant: k.tenant.to_owned(),
                kind: Kind::parse(k.kind).unwrap_or(Kind::Human),
            },
            right: if k.manages_budgets {
                BudgetRight::Any
            } else {
                BudgetRight::Shared(k.roles.to_vec())
            },
        }
    }

    /// Its roles as kept, and whether it manages budgets.
    pub(crate) fn budget_fields(&self) -> (Vec<String>, bool) {
        match &self.right {
            BudgetRight::Any => (Vec::new(), true),
            BudgetRight::Shared(roles) => (roles.clone(), false),
        }
    }
}

/// Where a template comes from: a spec, or a document in a format.
pub(crate) struct Template<'a> {
    pub(crate) spec: Option<JobSpec>,
    pub(crate) document: &'a str,
    pub(crate) format: &'a str,
}

impl Executor {
    /// A `what`'s job template, checked as SubmitJob checks a job, for
    /// `creator`: no fixed deadline or start, no delegation parent, and a
    /// budget it names one the creator may nest jobs under. Its id and
    /// correlation are cleared (each job gets its own).
    pub(crate) async fn template(
        &self,
        t: Template<'_>,
        creator: &Creator,
        what: Object,
    ) -> Result<JobSpec, ExecutorError> {
        let name = what.name();
        let (mut spec, _dag, _warnings) =
            self.accept(t.spec, t.document, t.format, BTreeMap::new())?;
        let refuse = |why: String| Err(ExecutorError::ObjectInvalid(what, why));
        if spec.deadline.is_some() || spec.scheduled_at.is_some() {
            return refuse(format!(
                "a {name}'s job has no fixed deadline or start time (each job starts when it fires): remove deadline and scheduled_at, and bound the work with task timeouts"
            ));
        }
        if spec
            .delegation
            .as_ref()
            .is_some_and(|d| !d.parent_job_id.is_empty())
        {
            return refuse(format!(
                "a {name}'s job cannot be a delegated child: its parent decides what runs under it"
            ));
        }
        spec.job_id.clear();
        spec.correlation_id.clear();
        let named_budget = spec
            .budget
            .as_ref()
            .map(|b| b.parent_budget_id.clone())
            .unwrap_or_default();
        if !named_budget.is_empty() {
            let correlation = switchyard_kit::context::current()
                .map(|c| c.correlation_id)
                .unwrap_or_default();
            let ctx = acting_context(&correlation, creator.who.clone());
            let check = self.may_nest_under(&named_budget, &creator.who, &creator.right);
            switchyard_kit::context::scope(ctx, check).await?;
        }
        Ok(spec)
    }
}

/// An id of a schedule or trigger: 1 to 64 of `[A-Za-z0-9._-]`, starting
/// with a letter or digit, without `..`.
pub(crate) fn check_id(id: &str, what: Object) -> Result<(), ExecutorError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !id.contains("..");
    if ok {
        Ok(())
    } else {
        Err(ExecutorError::ObjectInvalid(
            what,
            format!(
                "{}_id {id:?} does not fit: 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit, without '..'",
                what.name()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::check_id;
    use crate::error::Object;

    #[test]
    fn ids_are_plain() {
        for ok in ["nightly", "a", "team.report_2", "x-1"] {
            assert!(check_id(ok, Object::Trigger).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a/b", "a..b", "a b", "ä", &"a".repeat(65)] {
            assert!(check_id(bad, Object::Trigger).is_err(), "{bad}");
        }
    }
}
