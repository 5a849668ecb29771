//! Who calls through a door, and calling the executor as that caller.
//!
//! A door authenticates the credential it is shown with the same
//! [`Authenticator`] every gRPC port uses, checks the route's or verb's
//! permission in the one table, and then calls the executor *as the
//! caller*: in-process with the caller's own principal, over the network
//! with the caller's own credential. The executor therefore applies exactly
//! the rules a direct gRPC call gets (tenant, ownership, delegation), and
//! records the same `submitted_by` — never the gateway's identity acting
//! for someone, which would read the whole tenant.

use std::sync::Arc;

use switchyard_api::{ApprovalClient, ExecutorClient, TriggerClient, WorkerClient};
use switchyard_kit::auth::authn::{Authenticator, Presented};
use switchyard_kit::auth::{Access, AuthError, Principal};
use switchyard_kit::client::Credential;
use switchyard_proto::executor::v1::*;
use tonic::Status;

/// An authenticated caller of a door.
#[derive(Clone)]
pub struct Caller {
    /// Who it is.
    pub principal: Arc<Principal>,
    /// The credential it presented, forwarded to a remote executor.
    credential: Credential,
    /// `x-switchyard-on-behalf-of` as presented (honoured only for
    /// principals allowed to impersonate), forwarded with the credential.
    on_behalf: Option<String>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

/// Authenticates what a request presents in `headers` (`authorization:
/// Bearer …`) and checks `access`: `Ok(None)` for open routes.
pub async fn admit(
    auth: &Authenticator,
    headers: &http::HeaderMap,
    access: Access,
    what: &str,
) -> Result<Option<Caller>, AuthError> {
    if access == Access::Open {
        return Ok(None);
    }
    let presented = Presented::from_headers(headers)?;
    let principal = auth
        .authenticate(&presented, switchyard_kit::time::now_ms())
        .await?;
    principal.allowed(access, what)?;
    // `from_headers` accepted the header, so it is a bearer token.
    let token = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .map(|(_, t)| t.trim())
        .ok_or(AuthError::Required)?;
    let credential = Credential::bearer(token).map_err(|_| AuthError::Invalid)?;
    let on_behalf = headers
        .get(switchyard_kit::auth::ON_BEHALF_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok(Some(Caller {
        principal,
        credential,
        on_behalf,
    }))
}

/// Authenticates a bare token (RESP `AUTH`), as [`admit`] would a bearer
/// header, with no permission checked yet.
pub async fn authenticate_token(auth: &Authenticator, token: &str) -> Result<Caller, AuthError> {
    let value = format!("Bearer {token}")
        .parse::<http::HeaderValue>()
        .map_err(|_| AuthError::Invalid)?;
    let headers = http::HeaderMap::from_iter([(http::header::AUTHORIZATION, value)]);
    admit(auth, &headers, Access::Authenticated, "AUTH")
        .await?
        .ok_or(AuthError::Required)
}

impl Caller {
    /// `msg` as a request from this caller, with the correlation id and
    /// trace context of the request being served: over the network
    /// (`remote`) carrying its credential (and on-behalf header) for the
    /// executor to authenticate; in-process carrying its principal, as the
    /// server layer would after authenticating it — and no secret.
    pub(crate) fn request<T>(&self, msg: T, remote: bool) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        switchyard_kit::context::inject(&mut req);
        if remote {
            self.credential.authorize(&mut req);
            if let Some(v) = self.on_behalf.as_deref().and_then(|v| v.parse().ok()) {
                req.metadata_mut()
                    .insert(switchyard_kit::auth::ON_BEHALF_HEADER, v);
            }
        } else {
            req.extensions_mut().insert(self.principal.clone());
        }
        req
    }
}

/// The executor (its `JobService` and `WorkerService`), called as a door's
/// caller (see the module docs).
#[derive(Debug, Clone)]
pub struct Jobs(
    ExecutorClient,
    WorkerClient,
    Option<ApprovalClient>,
    Option<TriggerClient>,
);

/// One unary call of `client` as `caller`, in-process or remote alike.
macro_rules! as_caller {
    ($kind:ident, $client:expr, $caller:expr, $method:ident, $msg:expr) => {{
        match &$client {
            $kind::Local(svc) => svc.$method($caller.request($msg, false)).await,
            $kind::Remote(c) => c.clone().$method($caller.request($msg, true)).await,
        }
        .map(tonic::Response::into_inner)
    }};
}
pub(crate) use as_caller;

/// `client`, or UNAVAILABLE naming the setting that would give this
/// gateway the `service` it lacks.
pub(crate) fn reach<'a, C>(client: &'a Option<C>, service: &str) -> Result<&'a C, Status> {
    client.as_ref().ok_or_else(|| {
        switchyard_kit::error::status(
            tonic::Code::Unavailable,
            switchyard_core::Reason::DependencyUnavailable,
            format!(
                "this gateway reaches no {service} service: run it in one process with the {service} or set gateway.{service}_url"
            ),
        )
    })
}

impl Jobs {
    /// Calls through `client`. A remote client must carry no credential of
    /// its own ([`switchyard_kit::client::authed`] with none): each call
    /// carries its caller's.
    pub fn new(client: ExecutorClient, workers: WorkerClient) -> Jobs {
        Jobs(client, workers, None, None)
    }

    /// With the executor's triggers (`POST /v1/triggers/{id}/events`),
    /// called as each caller.
    pub fn with_triggers(mut self, triggers: TriggerClient) -> Jobs {
        self.3 = Some(triggers);
        self
    }

    /// FireTrigger as the caller.
    pub async fn fire_trigger(
        &self,
        c: &Caller,
        req: FireTriggerRequest,
    ) -> Result<FireTriggerResponse, Status> {
        let triggers = reach(&self.3, "executor")?;
        as_caller!(TriggerClient, triggers, c, fire_trigger, req)
    }

    /// With the approval service (OJS activate approves through it), called
    /// the same way: as each caller.
    pub fn with_approvals(mut self, approvals: ApprovalClient) -> Jobs {
        self.2 = Some(approvals);
        self
    }

    /// Approves run `run_id` as the caller (the approval service checks the
    /// caller may decide, and is not the run's creator).
    pub async fn approve(
        &self,
        c: &Caller,
        run_id: &str,
        comment: &str,
    ) -> Result<switchyard_proto::approval::v1::Run, Status> {
        let approvals = reach(&self.2, "approval")?;
        let req = switchyard_proto::approval::v1::ApproveRequest {
            run_id: run_id.to_owned(),
            comment: comment.to_owned(),
            edit: None,
            scope: None,
        };
        let run = as_caller!(ApprovalClient, approvals, c, approve, req)?.run;
        run.ok_or_else(|| Status::internal("Approve answered without a run"))
    }

    /// SubmitJob.
    pub async fn submit(
        &self,
        c: &Caller,
        req: SubmitJobRequest,
    ) -> Result<SubmitJobResponse, Status> {
        as_caller!(ExecutorClient, self.0, c, submit_job, req)
    }

    /// GetJob.
    pub async fn get(&self, c: &Caller, job_id: &str) -> Result<Job, Status> {
        let req = GetJobRequest {
            job_id: job_id.to_owned(),
        };
        let job = as_caller!(ExecutorClient, self.0, c, get_job, req)?.job;
        job.ok_or_else(|| Status::internal("GetJob answered without a job"))
    }

    /// ExplainJob.
    pub async fn explain(
        &self,
        c: &Caller,
        job_id: &str,
    ) -> Result<switchyard_proto::executor::v1::ExplainJobResponse, Status> {
        let req = switchyard_proto::executor::v1::ExplainJobRequest {
            job_id: job_id.to_owned(),
        };
        as_caller!(ExecutorClient, self.0, c, explain_job, req)
    }

    /// GetResult.
    pub async fn result(&self, c: &Caller, job_id: &str) -> Result<GetResultResponse, Status> {
        let req = GetResultRequest {
            job_id: job_id.to_owned(),
            ..Default::default()
        };
        as_caller!(ExecutorClient, self.0, c, get_result, req)
    }

    /// CancelJob.
    pub async fn cancel(&self, c: &Caller, job_id: &str, reason: &str) -> Result<Job, Status> {
        let req = CancelJobRequest {
            job_id: job_id.to_owned(),
            reason: reason.to_owned(),
        };
        let job = as_caller!(ExecutorClient, self.0, c, cancel_job, req)?.job;
        job.ok_or_else(|| Status::internal("CancelJob answered without a job"))
    }

    /// RerunJob: job `job_id` run again (resumed, or afresh) as `c`.
    pub async fn rerun(
        &self,
        c: &Caller,
        job_id: &str,
        resume: bool,
    ) -> Result<RerunJobResponse, Status> {
        let req = RerunJobRequest {
            job_id: job_id.to_owned(),
            resume,
            ..Default::default()
        };
        as_caller!(ExecutorClient, self.0, c, rerun_job, req)
    }

    /// SendInput.
    pub async fn send_input(
        &self,
        c: &Caller,
        req: SendInputRequest,
    ) -> Result<SendInputResponse, Status> {
        as_caller!(ExecutorClient, self.0, c, send_input, req)
    }

    /// ListInputRequests.
    pub async fn input_requests(
        &self,
        c: &Caller,
        job_id: &str,
    ) -> Result<ListInputRequestsResponse, Status> {
        let req = ListInputRequestsRequest {
            job_id: job_id.to_owned(),
        };
        as_caller!(ExecutorClient, self.0, c, list_input_requests, req)
    }

    /// SendMessage.
    pub async fn send_message(
        &self,
        c: &Caller,
        req: SendMessageRequest,
    ) -> Result<SendMessageResponse, Status> {
        as_caller!(ExecutorClient, self.0, c, send_message, req)
    }

    /// ListMessages.
    pub async fn messages(
        &self,
        c: &Caller,
        req: ListMessagesRequest,
    ) -> Result<ListMessagesResponse, Status> {
        as_caller!(ExecutorClient, self.0, c, list_messages, req)
    }

    /// RetryDeadLetter.
    pub async fn retry_dead_letter(&self, c: &Caller, job_id: &str) -> Result<Job, Status> {
        let req = RetryDeadLetterRequest {
            job_id: job_id.to_owned(),
        };
        let job = as_caller!(ExecutorClient, self.0, c, retry_dead_letter, req)?.job;
        job.ok_or_else(|| Status::internal("RetryDeadLetter answered without a job"))
    }

    /// DeleteDeadLetter.
    pub async fn delete_dead_letter(&self, c: &Caller, job_id: &str) -> Result<(), Status> {
        let req = DeleteDeadLetterRequest {
            job_id: job_id.to_owned(),
        };
        as_caller!(ExecutorClient, self.0, c, delete_dead_letter, req).map(|_| ())
    }

    /// WorkerService.Fetch.
    pub async fn fetch(&self, c: &Caller, req: FetchRequest) -> Result<FetchResponse, Status> {
        as_caller!(WorkerClient, self.1, c, fetch, req)
    }

    /// WorkerService.Ack.
    pub async fn ack(&self, c: &Caller, req: AckRequest) -> Result<AckResponse, Status> {
        as_caller!(WorkerClient, self.1, c, ack, req)
    }

    /// WorkerService.Nack.
    pub async fn nack(&self, c: &Caller, req: NackRequest) -> Result<NackResponse, Status> {
        as_caller!(WorkerClient, self.1, c, nack, req)
    }

    /// WorkerService.Heartbeat.
    pub async fn heartbeat(
        &self,
        c: &Caller,
        req: HeartbeatRequest,
    ) -> Result<HeartbeatResponse, Status> {
        as_caller!(WorkerClient, self.1, c, heartbeat, req)
    }

    /// ListJobs.
    pub async fn list(&self, c: &Caller, req: ListJobsRequest) -> Result<ListJobsResponse, Status> {
        as_caller!(ExecutorClient, self.0, c, list_jobs, req)
    }

    /// WatchJob, after `after`.
    pub async fn watch(
        &self,
        c: &Caller,
        job_id: &str,
        after: u64,
    ) -> Result<switchyard_kit::BoxStream<WatchJobResponse>, Status> {
        let req = WatchJobRequest {
            job_id: job_id.to_owned(),
            after_sequence: after,
            ..Default::default()
        };
        match &self.0 {
            ExecutorClient::Local(svc) => svc.watch_job(c.request(req, false)).await,
            ExecutorClient::Remote(cl) => {
                let stream = cl.clone().watch_job(c.request(req, true)).await?;
                Ok(Box::pin(stream.into_inner()))
            }
        }
    }
}
