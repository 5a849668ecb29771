//! The Switchyard stack in-process, for tests and benchmarks.
//!
//! [`Stack::start`] binds `127.0.0.1:0` first and hands the listener to the
//! same composition `switchyard dev` uses, with storage in a temporary
//! directory; [`Stack::stop`] shuts it down and waits for it. No fixed ports,
//! no sleeps: readiness is polled through `grpc.health.v1`.
//!
//! Every call is authenticated like a real client's: the stack bootstraps the
//! dev credentials (admin, alice, bob, agents), and [`Stack::channel`]
//! carries a `tester` key holding every role but approver, so tests approve
//! as `bob` ([`Stack::channel_as`]), like people.
//!
//! [`pg`] starts throwaway PostgreSQL clusters for the suites that run on
//! the PostgreSQL backend; it is all that is built without the `stack`
//! feature.

pub mod pg;
#[cfg(feature = "stack")]
mod stack;
#[cfg(feature = "stack")]
pub use stack::*;
