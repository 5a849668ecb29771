//! Switchyard's domain, with no I/O and no async runtime.
//!
//! Every service and the CLI call into this crate for the rules that must be the
//! same everywhere: the error-reason catalogue clients branch on ([`reason`]),
//! input validation with field violations ([`validate`]), the AITP routing score
//! ([`routing`]), the AgentRunSpec state machine ([`run`]), the job and task state machines
//! ([`lifecycle`]), job DAGs ([`dag`]), `${...}` templates ([`template`]),
//! what offering a tool to a model costs a prompt ([`offer`]),
//! retry backoff ([`backoff`]) and time as an injectable clock ([`clock`]).

pub mod artifact;
pub mod backoff;
pub mod clock;
pub mod dag;
pub mod lifecycle;
pub mod money;
pub mod offer;
pub mod reason;
pub mod routing;
pub mod run;
pub mod template;
pub mod validate;
pub mod worker_error;

pub use clock::{Clock, ManualClock, SystemClock};
pub use reason::Reason;
pub use validate::{FieldViolation, Violations};
