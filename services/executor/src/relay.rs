//! Messages and answers for a job another replica runs (PostgreSQL
//! replicas). A waiting task and a conversation live in the memory of the
//! replica that holds the job, so SendMessage or SendInput arriving at
//! another replica is relayed: the request, with who sent it, is stored
//! beside the job (`exec_deliveries`, keyed by the idempotency key) and the
//! holder is notified; the holder runs it as that sender through exactly
//! the checks a direct call meets, and stores the outcome, which the
//! receiving replica answers with. A holder that stops first leaves the
//! request stored for the replica that takes the job over, so nothing sent
//! is lost and the key makes it count once.

use std::time::Duration;

use switchyard_kit::auth::{Kind, Method, OnBehalf, Principal, Roles};
use switchyard_proto::executor::v1::{
    SendInputRequest, SendInputResponse, SendMessageRequest, SendMessageResponse,
};
use tonic::Status;

use crate::Executor;
use crate::error::ExecutorError;
use crate::store::pg::PgJobs;

/// How long the receiving replica waits for the holder's outcome before
/// telling the caller to send again (the request stays stored and counts
/// once).
const RELAY_WAIT: Duration = Duration::from_secs(10);

/// What was sent.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Asked {
    /// A conversation message.
    #[prost(message, tag = "1")]
    Message(SendMessageRequest),
    /// An answer to a task waiting for input.
    #[prost(message, tag = "2")]
    Input(SendInputRequest),
}

/// A request stored for the holder: what, and who sent it as authenticated
/// by the replica it reached.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Ask {
    #[prost(oneof = "Asked", tags = "1, 2")]
    pub(crate) asked: Option<Asked>,
    #[prost(string, tag = "3")]
    subject: String,
    #[prost(string, tag = "4")]
    tenant: String,
    #[prost(string, repeated, tag = "5")]
    roles: Vec<String>,
    #[prost(string, tag = "6")]
    kind: String,
    #[prost(string, tag = "7")]
    method: String,
    /// The user a service acted for (`OnBehalf::encode`), or empty.
    #[prost(string, tag = "8")]
    on_behalf_of: String,
    #[prost(string, tag = "9")]
    credential_id: String,
}

impl Ask {
    fn new(p: &Principal, asked: Asked) -> Ask {
        Ask {
            asked: Some(asked),
            subject: p.subject.clone(),
            tenant: p.tenant.clone(),
            roles: p.roles.names(),
            kind: p.kind.as_str().to_owned(),
            method: p.method.as_str().to_owned(),
            on_behalf_of: p
                .on_behalf_of
                .as_ref()
                .map(OnBehalf::encode)
                .unwrap_or_default(),
            credential_id: p.credential_id.clone().unwrap_or_default(),
        }
    }

    /// The sender, as the replica it reached authenticated it.
    fn principal(&self) -> Result<Principal, String> {
        let unreadable = |what: &str| format!("a relayed request with an unreadable {what}");
        Ok(Principal {
            subject: self.subject.clone(),
            tenant: self.tenant.clone(),
            roles: Roles::parse(&self.roles).map_err(|_| unreadable("role"))?,
            kind: Kind::parse(&self.kind).ok_or_else(|| unreadable("kind"))?,
            method: Method::parse(&self.method).ok_or_else(|| unreadable("method"))?,
            on_behalf_of: match self.on_behalf_of.as_str() {
                "" => None,
                s => Some(OnBehalf::decode(s).ok_or_else(|| unreadable("on-behalf-of"))?),
            },
            credential_id: (!self.credential_id.is_empty()).then(|| self.credential_id.clone()),
            expires_at_ms: None,
        })
    }
}

/// What the holder answered.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Answer {
    /// SendMessage's response.
    #[prost(message, tag = "1")]
    Message(SendMessageResponse),
    /// SendInput's response (with the job: boxed).
    #[prost(message, boxed, tag = "2")]
    Input(Box<SendInputResponse>),
}

/// The outcome stored for the receiving replica.
#[derive(Clone, PartialEq, prost::Message)]
struct Outcome {
    #[prost(oneof = "Answer", tags = "1, 2")]
    answer: Option<Answer>,
    /// The refusal, as a status (code, message, details).
    #[prost(int32, tag = "3")]
    code: i32,
    #[prost(string, tag = "4")]
    message: String,
    #[prost(bytes = "vec", tag = "5")]
    details: Vec<u8>,
}

impl Outcome {
    fn refused(s: &Status) -> Outcome {
        Outcome {
            answer: None,
            code: s.code() as i32,
            message: s.message().to_owned(),
            details: s.details().to_vec(),
        }
    }

    fn into_result(self) -> Result<Answer, ExecutorError> {
        match self.answer {
            Some(a) => Ok(a),
            None => Err(ExecutorError::Relayed(Status::with_details(
                tonic::Code::from_i32(self.code),
                self.message,
                self.details.into(),
            ))),
        }
    }
}

/// An outcome of the other kind than was asked (a damaged row).
pub(crate) fn mismatched(job_id: &str) -> ExecutorError {
    ExecutorError::Input(
        switchyard_core::Reason::Internal,
        format!("job {job_id:?}: the replica running it answered a different request"),
    )
}

fn unavailable(why: String) -> ExecutorError {
    ExecutorError::Input(switchyard_core::Reason::Unavailable, why)
}

impl Executor {
    /// Relays `asked` (from `p`, idempotency key `key`) to the replica
    /// running job `job_id` and answers with its outcome.
    pub(crate) async fn relay(
        &self,
        job_id: &str,
        key: &str,
        p: &Principal,
        asked: Asked,
    ) -> Result<Answer, ExecutorError> {
        let cluster = &self.inner.book.cluster;
        if !cluster.shared() {
            // One node: a job not in memory here has finished (caught by
            // the checks before), or is being loaded.
            return Err(unavailable(format!(
                "job {job_id:?} is not running here yet; send it again (same idempotency_key)"
            )));
        }
        // Without a key the request is still delivered once: this call's
        // own key.
        let key = if key.is_empty() {
            format!("relay-{}", uuid::Uuid::now_v7())
        } else {
            key.to_owned()
        };
        let ask = prost::Message::encode_to_vec(&Ask::new(p, asked));
        let book = &self.inner.book;
        let mut wake = book.store.subscribe(job_id);
        cluster.request_delivery(job_id, &key, &ask).await?;
        let waited = tokio::time::timeout(RELAY_WAIT, async {
            loop {
                match cluster.take_delivery(job_id, &key).await? {
                    Some(Some(bytes)) => {
                        let out = <Outcome as prost::Message>::decode(bytes.as_slice())
                            .map_err(|_| mismatched(job_id))?;
                        return out.into_result();
                    }
                    Some(None) => {}
                    // Taken by a concurrent sender of the same key: its
                    // record tells a retry the outcome.
                    None => {
                        return Err(unavailable(format!(
                            "job {job_id:?}: another call with the same idempotency_key took this outcome; send it again to read it"
                        )));
                    }
                }
                tokio::select! {
                    _ = wake.changed() => {}
                    () = tokio::time::sleep(crate::store::pg::WATCH_POLL) => {}
                    () = book.shutdown.wait() => {
                        return Err(unavailable("this executor is stopping; send it again (same idempotency_key)".into()));
                    }
                }
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            Err(unavailable(format!(
                "job {job_id:?} runs on another executor replica, which has not taken this yet; it is stored and counts once: send it again with the same idempotency_key to learn its outcome"
            )))
        })
    }

    /// Runs the requests relayed to job `id` (held here) as their senders,
    /// and stores each outcome. A job not in memory here leaves them for
    /// the replica that runs it.
    pub(crate) async fn deliver_relayed(&self, pg: &PgJobs, id: &str) {
        use switchyard_proto::executor::v1::task_spec::Kind;
        // Only a job in memory here that asks or talks can have anything
        // relayed to it: no query for the others a takeover brings.
        let talks = self.inner.book.lock().find(id).is_some_and(|e| {
            e.spec()
                .tasks
                .iter()
                .any(|t| matches!(t.kind, Some(Kind::Input(_) | Kind::Conversation(_))))
        });
        if pg.holds(id).is_none() || !talks {
            return;
        }
        let pending = match pg.pending_deliveries(id).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(job_id = %id, error = %e, "reading relayed requests");
                return;
            }
        };
        for (key, bytes) in pending {
            let ask = <Ask as prost::Message>::decode(bytes.as_slice());
            let outcome = match ask.as_ref().map_err(|e| e.to_string()).and_then(|a| {
                let p = a.principal()?;
                a.asked
                    .clone()
                    .map(|q| (p, q))
                    .ok_or_else(|| "an empty relayed request".into())
            }) {
                Err(why) => {
                    tracing::warn!(job_id = %id, key, why, "an unreadable relayed request");
                    let s = Status::from(mismatched(id));
                    Outcome::refused(&s)
                }
                Ok((p, Asked::Message(req))) => match self.send_message_here(&p, &req).await {
                    Ok(Some(r)) => Outcome {
                        answer: Some(Answer::Message(r)),
                        ..Outcome::default()
                    },
                    Ok(None) => return,
                    Err(e) => Outcome::refused(&Status::from(e)),
                },
                Ok((p, Asked::Input(req))) => match self.send_input_here(&p, &req).await {
                    Ok(Some(r)) => Outcome {
                        answer: Some(Answer::Input(Box::new(r))),
                        ..Outcome::default()
                    },
                    Ok(None) => return,
                    Err(e) => Outcome::refused(&Status::from(e)),
                },
            };
            let bytes = prost::Message::encode_to_vec(&outcome);
            if let Err(e) = pg.answer_delivery(id, &key, &bytes).await {
                tracing::warn!(job_id = %id, key, error = %e, "storing a relayed request's outcome");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_kit::auth::Role;

    #[test]
    fn a_relayed_sender_is_the_principal_that_sent_it() {
        let mut p = Principal::user(
            "carol",
            "acme",
            &[Role::Submitter, Role::Approver],
            Kind::Human,
            Method::Jwt,
        );
        p.credential_id = Some("key-1".into());
        let ask = Ask::new(&p, Asked::Message(SendMessageRequest::default()));
        let bytes = prost::Message::encode_to_vec(&ask);
        let back = <Ask as prost::Message>::decode(bytes.as_slice()).unwrap();
        let q = back.principal().unwrap();
        assert_eq!(
            (q.subject.as_str(), q.tenant.as_str(), q.kind, q.method),
            ("carol", "acme", Kind::Human, Method::Jwt)
        );
        assert_eq!(q.roles.names(), p.roles.names());
        assert_eq!(q.credential_id.as_deref(), Some("key-1"));
        assert!(q.on_behalf_of.is_none());

        let mut svc = Principal::service("service:gateway", Method::ServiceToken);
        svc.on_behalf_of = Some(OnBehalf {
            subject: "dave".into(),
            tenant: "acme".into(),
            kind: Kind::Human,
        });
        let back = Ask::new(&svc, Asked::Input(SendInputRequest::default()));
        let q = back.principal().unwrap();
        assert_eq!(q.acting_subject(), "dave");
        assert_eq!(q.roles.names(), svc.roles.names());
    }

    #[test]
    fn a_refusal_comes_back_with_its_code_message_and_reason() {
        let e = ExecutorError::NotFound("j".into());
        let s = Status::from(e);
        let out = Outcome::refused(&s);
        let bytes = prost::Message::encode_to_vec(&out);
        let back = <Outcome as prost::Message>::decode(bytes.as_slice()).unwrap();
        let Err(ExecutorError::Relayed(r)) = back.into_result() else {
            panic!("a refusal");
        };
        assert_eq!(
            (r.code(), r.message(), r.details()),
            (s.code(), s.message(), s.details())
        );
    }
}
