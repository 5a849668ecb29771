//! Executor errors, mapped to a `tonic::Status` once, here.

use switchyard_core::Reason;
use switchyard_core::lifecycle::Refused;
use switchyard_kit::error::{is_outage, metadata, status, status_with_metadata};
use switchyard_store::StoreError;
use tonic::{Code, Status};

use crate::events::DecodeError;
use crate::formats::FormatError;

/// What a schedule or trigger error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// A schedule (ScheduleService).
    Schedule,
    /// A trigger (TriggerService).
    Trigger,
    /// A webhook delivery (NotificationService).
    Delivery,
}

impl Object {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Object::Schedule => "schedule",
            Object::Trigger => "trigger",
            Object::Delivery => "delivery",
        }
    }

    fn id_field(self) -> &'static str {
        match self {
            Object::Schedule => "schedule_id",
            Object::Trigger => "trigger_id",
            Object::Delivery => "delivery_id",
        }
    }

    /// Its not-found, already-exists and invalid reasons.
    fn reasons(self) -> (Reason, Reason, Reason) {
        match self {
            Object::Schedule => (
                Reason::ScheduleNotFound,
                Reason::ScheduleAlreadyExists,
                Reason::ScheduleInvalid,
            ),
            Object::Trigger => (
                Reason::TriggerNotFound,
                Reason::TriggerAlreadyExists,
                Reason::TriggerInvalid,
            ),
            Object::Delivery => (
                Reason::DeliveryNotFound,
                Reason::InvalidArgument,
                Reason::InvalidArgument,
            ),
        }
    }
}

/// Executor errors; mapped to a status once, in `From<ExecutorError> for Status`.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The job is not valid; see the field violations.
    #[error("{}", .0.violations.0.iter().map(|v| v.description.as_str()).collect::<Vec<_>>().join("; "))]
    Invalid(FormatError),
    /// No such job.
    #[error("job {0:?} not found")]
    NotFound(String),
    /// No such schedule or trigger (or not one the caller may see).
    #[error("{what} {id:?} not found", what = .0.name(), id = .1)]
    ObjectNotFound(Object, String),
    /// The schedule or trigger id is taken by another definition.
    #[error(
        "{what} {id:?} already exists with another definition: delete it first, or choose another id",
        what = .0.name(),
        id = .1
    )]
    ObjectExists(Object, String),
    /// A schedule or trigger does not fit (its cron expression, time
    /// zone, id, job template or mapping).
    #[error("{1}")]
    ObjectInvalid(Object, String),
    /// An event id delivered to a trigger before with another body.
    #[error(
        "event {event:?} was delivered to trigger {trigger:?} before with another body: an event id names one event, so give this one its own id (a repeat of the same event is answered with the job it started)"
    )]
    EventReused { trigger: String, event: String },
    /// The caller may not do this as the kind of principal it is.
    #[error("{0}")]
    NotSubmitter(String),
    /// An agent (no submitter role) submitted a job that is not a delegation.
    #[error(
        "an agent submits only delegated child jobs: set delegation.parent_job_id to the active job it works for"
    )]
    DelegationOnly,
    /// An agent's invocation grant does not cover what it asked.
    #[error("{0}")]
    Grant(#[from] switchyard_kit::auth::grant::GrantError),
    /// A policy forbids the submission: which one and why.
    #[error("{0}")]
    PolicyForbidden(String),
    /// The id is taken by a different spec.
    #[error("job {0:?} already exists with a different spec")]
    Exists(String),
    /// A state change the table refuses.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// Another service refused or failed; its status is passed on.
    #[error("{service}: {}", .status.message())]
    Upstream {
        /// Which service.
        service: &'static str,
        /// What it said.
        status: Status,
    },
    /// The replica running the job refused a request relayed to it; its
    /// status is passed on as it is.
    #[error("{}", .0.message())]
    Relayed(Status),
    /// Storage failed.
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    /// A stored event does not fit its kind (a damaged or foreign log).
    #[error("job event log: {0}")]
    Decode(#[from] DecodeError),
    /// The job's scratch directory could not be prepared.
    #[error("scratch directory: {0}")]
    Scratch(String),
    /// The command sandbox's configuration cannot be honoured.
    #[error("{0}")]
    Sandbox(String),
    /// The journal's signing key cannot be read or made.
    #[error("journal signing key: {0}")]
    Audit(String),
    /// A job that cannot run again as asked (RerunJob).
    #[error("{why}")]
    NotRerunnable {
        /// The job.
        job: String,
        /// Its state.
        state: String,
        /// The status code: FAILED_PRECONDITION or INVALID_ARGUMENT.
        code: Code,
        /// The reason from the catalogue.
        reason: Reason,
        /// What is wrong and what to do instead.
        why: String,
    },
    /// RetryDeadLetter or DeleteDeadLetter of a job not in the dead letter.
    #[error(
        "job {job:?} is not in the dead letter: it is {state}{why}; only a discarded job whose spec sets dead_letter is kept there"
    )]
    NotInDeadLetter {
        /// The job.
        job: String,
        /// Its state.
        state: String,
        /// `""`, or why a discarded job is not there.
        why: &'static str,
    },
    /// No artifact of the job has that id or path.
    #[error(
        "job {job:?} has no artifact {artifact:?}; `switchyard job artifacts {job}` lists them"
    )]
    ArtifactNotFound {
        /// The job.
        job: String,
        /// What was asked for.
        artifact: String,
    },
    /// An artifact a task handed over was refused.
    #[error("{}", .0.message)]
    ArtifactRefused(switchyard_api::artifacts::Refused),
    /// SubmitJob while this executor drains before stopping.
    #[error(
        "this executor is stopping and takes on no new job; send it again (another replica, or this one once restarted, takes it; a job id already accepted is answered, not run twice)"
    )]
    Draining,
    /// SendInput refused (see `input`): the reason says why.
    #[error("{1}")]
    Input(Reason, String),
    /// Delegation from a job that is not running.
    #[error("job {parent:?} is {state}, not active: only a running job can delegate")]
    ParentNotActive {
        /// The parent job.
        parent: String,
        /// Its state.
        state: String,
    },
}

impl From<ExecutorError> for Status {
    fn from(e: ExecutorError) -> Status {
        let msg = e.to_string();
        match e {
            ExecutorError::Invalid(f) => {
                let mut s = switchyard_kit::error::invalid_argument_at(
                    f.reason,
                    &f.violations,
                    &f.positions,
                );
                // Keep the seed's wording as the message (e.g. `Invalid task numbering: …`).
                let details = s.details().to_vec();
                s = Status::with_details(Code::InvalidArgument, msg, details.into());
                s
            }
            ExecutorError::NotFound(id) => status_with_metadata(
                Code::NotFound,
                Reason::JobNotFound,
                msg,
                metadata([("job_id", id)]),
            ),
            ExecutorError::ObjectNotFound(o, id) => status_with_metadata(
                Code::NotFound,
                o.reasons().0,
                msg,
                metadata([(o.id_field(), id)]),
            ),
            ExecutorError::ObjectExists(o, id) => status_with_metadata(
                Code::AlreadyExists,
                o.reasons().1,
                msg,
                metadata([(o.id_field(), id)]),
            ),
            ExecutorError::EventReused { trigger, event } => status_with_metadata(
                Code::AlreadyExists,
                Reason::EventAlreadyDelivered,
                msg,
                metadata([("trigger_id", trigger), ("event_id", event)]),
            ),
            ExecutorError::NotSubmitter(_) => status_with_metadata(
                Code::PermissionDenied,
                Reason::PermissionDenied,
                msg,
                metadata([("role", "submitter".to_owned())]),
            ),
            ExecutorError::ObjectInvalid(o, _) => status(Code::InvalidArgument, o.reasons().2, msg),
            ExecutorError::DelegationOnly => status_with_metadata(
                Code::PermissionDenied,
                Reason::PermissionDenied,
                msg,
                metadata([("permission", "job.submit".to_owned())]),
            ),
            ExecutorError::Grant(_) => status_with_metadata(
                Code::PermissionDenied,
                Reason::GrantRefused,
                msg,
                metadata([]),
            ),
            ExecutorError::ParentNotActive { parent, state } => status_with_metadata(
                Code::FailedPrecondition,
                Reason::ParentNotActive,
                msg,
                metadata([("parent_job_id", parent), ("state", state)]),
            ),
            ExecutorError::NotRerunnable {
                job,
                state,
                code,
                reason,
                ..
            } => status_with_metadata(
                code,
                reason,
                msg,
                metadata([("job_id", job), ("state", state)]),
            ),
            ExecutorError::NotInDeadLetter { job, state, .. } => status_with_metadata(
                Code::FailedPrecondition,
                Reason::NotInDeadLetter,
                msg,
                metadata([("job_id", job), ("state", state)]),
            ),
            ExecutorError::ArtifactNotFound { job, artifact } => status_with_metadata(
                Code::NotFound,
                Reason::ArtifactNotFound,
                msg,
                metadata([("job_id", job), ("artifact", artifact)]),
            ),
            ExecutorError::ArtifactRefused(r) => status_with_metadata(
                Code::FailedPrecondition,
                r.reason,
                msg,
                metadata([("reason", r.reason.as_str().to_owned())]),
            ),
            ExecutorError::Exists(id) => status_with_metadata(
                Code::AlreadyExists,
                Reason::JobAlreadyExists,
                msg,
                metadata([("job_id", id)]),
            ),
            ExecutorError::Refused(r) => status_with_metadata(
                Code::FailedPrecondition,
                r.reason,
                msg,
                metadata([("from", r.from.to_owned()), ("to", r.to.to_owned())]),
            ),
            // Unreachable (no answer to pass on): say which service.
            ExecutorError::Upstream { service, status }
                if is_outage(&status) && status.details().is_empty() =>
            {
                status_with_metadata(
                    Code::Unavailable,
                    Reason::DependencyUnavailable,
                    format!("{msg}; retry the same request once {service} is back"),
                    metadata([("service", service.to_owned())]),
                )
            }
            ExecutorError::Upstream { status, .. } => {
                Status::with_details(status.code(), msg, status.details().to_vec().into())
            }
            ExecutorError::Relayed(status) => status,
            // Damaged data is a bug or a disk problem; anything else (the
            // database restarting, a closed store) is an outage the caller
            // retries, as every other service answers it.
            ExecutorError::Storage(StoreError::Corrupt { .. }) | ExecutorError::Decode(_) => {
                status(Code::Internal, Reason::StorageFailure, msg)
            }
            ExecutorError::Storage(_) => status(
                Code::Unavailable,
                Reason::StorageFailure,
                format!(
                    "{msg}; retry the same request (a job id already stored is answered, not run twice)"
                ),
            ),
            ExecutorError::Draining => status(Code::Unavailable, Reason::Unavailable, msg),
            ExecutorError::PolicyForbidden(_) => {
                status(Code::FailedPrecondition, Reason::PolicyForbidden, msg)
            }
            ExecutorError::Input(reason, _) => {
                let code = match reason {
                    Reason::InputNotAllowed | Reason::ConversationNotAllowed => {
                        Code::PermissionDenied
                    }
                    Reason::InputNotWaiting | Reason::ConversationClosed => {
                        Code::FailedPrecondition
                    }
                    Reason::Unavailable => Code::Unavailable,
                    _ => Code::InvalidArgument,
                };
                status(code, reason, msg)
            }
            ExecutorError::Scratch(_) | ExecutorError::Audit(_) => {
                status(Code::Internal, Reason::Internal, msg)
            }
            ExecutorError::Sandbox(_) => {
                status(Code::FailedPrecondition, Reason::SandboxUnavailable, msg)
            }
        }
    }
}

impl ExecutorError {
    /// The service that could not be reached, and why, when that is what
    /// this error is.
    pub(crate) fn outage(&self) -> Option<(&'static str, String)> {
        match self {
            ExecutorError::Upstream { service, status } if is_outage(status) => {
                Some((service, status.message().to_owned()))
            }
            _ => None,
        }
    }

    /// The catalogued reason its status carries.
    pub(crate) fn into_reason(self) -> Reason {
        switchyard_kit::error::ApiError::from(Status::from(self))
            .known_reason()
            .unwrap_or(Reason::Internal)
    }
}

/// Wraps another service's refusal or failure, naming the service.
pub(crate) fn upstream(service: &'static str) -> impl FnOnce(Status) -> ExecutorError {
    move |status| ExecutorError::Upstream { service, status }
}
