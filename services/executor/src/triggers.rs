//! Triggers (issue 47): a job started by an incoming event, as the
//! trigger's creator, once per event id.
//!
//! An event is mapped into the job's input (the whole event under
//! `event_field`, and `input_map`'s keys from JSON pointers into it) and
//! submitted like any job under the id `<trigger>-<digest of the event
//! id>`: a repeat of the event finds the job it started (SubmitJob's rule
//! for a client's id), the same id with another body is refused.

use sha2::Digest as _;
use switchyard_kit::auth::Principal;
use switchyard_kit::time::timestamp;
use switchyard_proto::executor::v1::{
    CreateTriggerRequest, CreateTriggerResponse, FireTriggerRequest, FireTriggerResponse,
    SubmitJobRequest, Trigger,
};

use crate::Executor;
use crate::admission::{Fired, Submission, submitter};
use crate::creator::{Creator, Template, check_id};
use crate::error::{ExecutorError, Object};

/// The input key the whole event goes under unless the trigger says.
const EVENT_FIELD: &str = "event";

/// The longest event id.
const MAX_EVENT_ID: usize = 256;

fn invalid(why: String) -> ExecutorError {
    ExecutorError::ObjectInvalid(Object::Trigger, why)
}

/// The creator trigger `t`'s jobs are submitted as.
fn creator_of(t: &Trigger) -> Creator {
    Creator::stored(crate::creator::Kept {
        subject: &t.created_by,
        tenant: &t.tenant,
        kind: &t.creator_kind,
        roles: &t.creator_roles,
        manages_budgets: t.creator_manages_budgets,
    })
}

/// The id of the job event `event_id` starts through trigger `trigger_id`.
pub(crate) fn job_id_of(trigger_id: &str, event_id: &str) -> String {
    let digest = sha2::Sha256::digest(event_id.as_bytes());
    format!("{trigger_id}-{}", switchyard_kit::hex::encode(&digest[..8]))
}

/// The job input event `event` gives under trigger `t`: the template's
/// input, the whole event under `event_field`, then `input_map`'s keys.
fn input_of(
    t: &Trigger,
    template: Option<&prost_types::Struct>,
    event: &prost_types::Struct,
) -> Result<prost_types::Struct, ExecutorError> {
    let mut input = template.cloned().unwrap_or_default();
    let field = match t.event_field.as_str() {
        "" => EVENT_FIELD,
        f => f,
    };
    if field != "-" {
        input.fields.insert(
            field.to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StructValue(event.clone())),
            },
        );
    }
    let json = switchyard_kit::json::struct_to_json(event);
    for (key, pointer) in &t.input_map {
        let Some(v) = json.pointer(pointer) else {
            return Err(invalid(format!(
                "the event has nothing at {pointer:?} (input {key:?} of trigger {:?} is read from there): send an event with that field, or change the trigger's input_map",
                t.trigger_id
            )));
        };
        input
            .fields
            .insert(key.clone(), switchyard_kit::json::json_to_value(v));
    }
    Ok(input)
}

impl Executor {
    /// Trigger `id` as kept, if `p` may see it (NOT_FOUND otherwise).
    async fn visible_trigger(&self, p: &Principal, id: &str) -> Result<Trigger, ExecutorError> {
        match self.inner.triggers.get(id).await? {
            Some(t) if p.may_see(&t.tenant, &t.created_by) => Ok(t),
            _ => Err(ExecutorError::ObjectNotFound(
                Object::Trigger,
                id.to_owned(),
            )),
        }
    }

    /// CreateTrigger for principal `p`.
    pub(crate) async fn create_trigger(
        &self,
        p: &Principal,
        req: CreateTriggerRequest,
    ) -> Result<CreateTriggerResponse, ExecutorError> {
        let creator = Creator::of(p, Object::Trigger)?;
        let mut t = req.trigger.unwrap_or_default();
        if t.trigger_id.is_empty() {
            t.trigger_id = format!("trig-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
        }
        check_id(&t.trigger_id, Object::Trigger)?;
        for (key, pointer) in &t.input_map {
            if key.is_empty() || !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(invalid(format!(
                    "input_map {key:?}: {pointer:?} is not a JSON pointer; write one like \"/pull_request/number\" (RFC 6901), or \"\" for the whole event"
                )));
            }
        }
        if let Some(bad) = t
            .senders
            .iter()
            .find(|s| !switchyard_kit::auth::valid_subject(s))
        {
            return Err(invalid(format!(
                "senders: {bad:?} is not a subject; name the principals (their subjects) that may deliver events"
            )));
        }
        let template = Template {
            spec: t.job.take(),
            document: &req.document,
            format: &req.format,
        };
        t.job = Some(self.template(template, &creator, Object::Trigger).await?);
        t.tenant = creator.who.tenant.clone();
        t.created_by = creator.who.subject.clone();
        t.creator_kind = creator.who.kind.as_str().to_owned();
        (t.creator_roles, t.creator_manages_budgets) = creator.budget_fields();
        t.created_at = Some(timestamp(self.inner.book.now()));
        t.senders.sort();
        t.senders.dedup();
        let kept = self
            .inner
            .triggers
            .put_absent(&t.trigger_id, t.clone())
            .await?;
        self.inner.triggers.sync().await?;
        let created = kept.created_at == t.created_at && kept.created_by == t.created_by;
        let same = |x: &Trigger| Trigger {
            created_at: None,
            creator_roles: Vec::new(),
            creator_manages_budgets: false,
            creator_kind: String::new(),
            ..x.clone()
        };
        if !created && same(&kept) != same(&t) {
            return Err(ExecutorError::ObjectExists(Object::Trigger, t.trigger_id));
        }
        tracing::info!(trigger_id = %kept.trigger_id, created, "trigger created");
        Ok(CreateTriggerResponse {
            trigger: Some(kept),
            created,
        })
    }

    /// GetTrigger for principal `p`.
    pub(crate) async fn get_trigger(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<Trigger, ExecutorError> {
        self.visible_trigger(p, id).await
    }

    /// ListTriggers for principal `p`: those it may see, by id.
    pub(crate) async fn list_triggers(&self, p: &Principal) -> Result<Vec<Trigger>, ExecutorError> {
        let mut out: Vec<Trigger> = self
            .inner
            .triggers
            .list()
            .await?
            .into_iter()
            .map(|(_, t)| t)
            .filter(|t| p.may_see(&t.tenant, &t.created_by))
            .collect();
        out.sort_by(|a, b| a.trigger_id.cmp(&b.trigger_id));
        Ok(out)
    }

    /// DeleteTrigger for principal `p`.
    pub(crate) async fn delete_trigger(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<(), ExecutorError> {
        self.visible_trigger(p, id).await?;
        self.inner.triggers.remove(id)?;
        self.inner.triggers.sync().await?;
        tracing::info!(trigger_id = %id, by = %p.subject, "trigger deleted");
        Ok(())
    }

    /// FireTrigger for principal `p`: the event's job, started once.
    pub(crate) async fn fire_trigger(
        &self,
        p: &Principal,
        req: FireTriggerRequest,
    ) -> Result<FireTriggerResponse, ExecutorError> {
        let id = req.trigger_id.as_str();
        // Only the creator and the senders it named may deliver; to anyone
        // else the trigger does not exist.
        let t = match (self.inner.triggers.get(id).await?, submitter(p)) {
            (Some(t), Some(who))
                if who.tenant == t.tenant
                    && (who.subject == t.created_by || t.senders.contains(&who.subject)) =>
            {
                t
            }
            _ => {
                return Err(ExecutorError::ObjectNotFound(
                    Object::Trigger,
                    id.to_owned(),
                ));
            }
        };
        let event_id = req.event_id.trim();
        if event_id.is_empty() || event_id.len() > MAX_EVENT_ID {
            return Err(invalid(format!(
                "event_id must be 1 to {MAX_EVENT_ID} characters: the id the source gives the event (a delivery id, a CloudEvents id), so a repeat starts nothing"
            )));
        }
        let Some(event) = req.event else {
            return Err(invalid(
                "the event is missing: deliver a JSON object".to_owned(),
            ));
        };
        let mut spec = t.job.clone().unwrap_or_default();
        spec.input = Some(input_of(&t, spec.input.as_ref(), &event)?);
        spec.job_id = job_id_of(&t.trigger_id, event_id);
        let job_id = spec.job_id.clone();
        let creator = creator_of(&t);
        let correlation_id = switchyard_kit::context::current()
            .map(|c| c.correlation_id)
            .unwrap_or_else(switchyard_kit::context::new_correlation_id);
        let how = Submission {
            who: Some(creator.who),
            delegation_only: false,
            grant: None,
            budgets: creator.right,
            correlation_id,
            traceparent: switchyard_kit::context::outgoing_traceparent(),
            rerun: None,
            fired: Some(Fired::Event {
                trigger_id: t.trigger_id.clone(),
                event_id: event_id.to_owned(),
            }),
        };
        let req = SubmitJobRequest {
            spec: Some(spec),
            ..Default::default()
        };
        let out = match self.submit_as(req, how).await {
            Ok(out) => out,
            Err(ExecutorError::Exists(_)) => {
                return Err(ExecutorError::EventReused {
                    trigger: t.trigger_id,
                    event: event_id.to_owned(),
                });
            }
            Err(e) => return Err(e),
        };
        tracing::info!(trigger_id = %t.trigger_id, job_id, by = %p.subject, created = out.created, "trigger fired");
        Ok(FireTriggerResponse {
            job: out.job,
            created: out.created,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn event(v: serde_json::Value) -> prost_types::Struct {
        switchyard_kit::json::json_to_struct(&v).unwrap()
    }

    #[test]
    fn an_event_fills_the_input_under_its_field_and_from_its_pointers() {
        let t = Trigger {
            trigger_id: "pr".into(),
            input_map: [("number".to_owned(), "/pull_request/number".to_owned())].into(),
            ..Default::default()
        };
        let template = event(json!({"repo": "web", "number": 0}));
        let e = event(json!({"action": "opened", "pull_request": {"number": 42}}));
        let input = input_of(&t, Some(&template), &e).unwrap();
        assert_eq!(
            switchyard_kit::json::struct_to_json(&input),
            json!({"repo": "web", "number": 42,
                   "event": {"action": "opened", "pull_request": {"number": 42}}})
        );
        // `-`: the event itself is not kept.
        let t = Trigger {
            event_field: "-".into(),
            ..t
        };
        let input = input_of(&t, None, &e).unwrap();
        assert_eq!(
            switchyard_kit::json::struct_to_json(&input),
            json!({"number": 42})
        );
    }

    #[test]
    fn a_pointer_the_event_lacks_is_named() {
        let t = Trigger {
            trigger_id: "pr".into(),
            input_map: [("number".to_owned(), "/pull_request/number".to_owned())].into(),
            ..Default::default()
        };
        let e = invalid_text(input_of(&t, None, &event(json!({"action": "closed"}))));
        assert!(
            e.contains("the event has nothing at \"/pull_request/number\""),
            "{e}"
        );
    }

    fn invalid_text(r: Result<prost_types::Struct, ExecutorError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn an_event_id_names_one_job_per_trigger() {
        assert_eq!(job_id_of("pr", "d-1"), job_id_of("pr", "d-1"));
        assert_ne!(job_id_of("pr", "d-1"), job_id_of("pr", "d-2"));
        assert_ne!(job_id_of("pr", "d-1"), job_id_of("push", "d-1"));
        let id = job_id_of(&"t".repeat(64), &"x".repeat(256));
        assert!(
            switchyard_core::validate::object_id(&id, "job_id").is_ok(),
            "{id}"
        );
    }
}
