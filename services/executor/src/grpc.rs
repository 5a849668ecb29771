//! The gRPC adapters: `JobService`, `WorkerService` and `ScheduleService` over the executor. Authentication is the
//! server layer's; here each call learns its principal, checks the job is
//! visible to it, and maps errors to a status once (`ExecutorError`).

use futures_util::StreamExt;
use switchyard_proto::executor::v1::job_service_server::JobService;
use switchyard_proto::executor::v1::worker_service_server::WorkerService;
use switchyard_proto::executor::v1::{
    AckRequest, AckResponse, FetchRequest, FetchResponse, HeartbeatRequest, HeartbeatResponse,
    NackRequest, NackResponse, SetWorkerStateRequest, SetWorkerStateResponse,
};
use switchyard_proto::executor::v1::{
    CancelJobRequest, CancelJobResponse, DeleteDeadLetterRequest, DeleteDeadLetterResponse,
    ExplainJobRequest, ExplainJobResponse, ExportJournalRequest, ExportJournalResponse,
    GetArtifactRequest, GetArtifactResponse, GetJobRequest, GetJobResponse, GetResultRequest,
    GetResultResponse, ListArtifactsRequest, ListArtifactsResponse, ListInputRequestsRequest,
    ListInputRequestsResponse, ListJobsRequest, ListJobsResponse, ListMessagesRequest,
    ListMessagesResponse, PruneJobsRequest, PruneJobsResponse, RerunJobRequest, RerunJobResponse,
    RetryDeadLetterRequest, RetryDeadLetterResponse, SendInputRequest, SendInputResponse,
    SendMessageRequest, SendMessageResponse, SubmitJobRequest, SubmitJobResponse,
    ValidateJobRequest, ValidateJobResponse, VerifyJournalsRequest, VerifyJournalsResponse,
    WatchJobRequest, WatchJobResponse,
};
use switchyard_proto::executor::v1::{
    CreateScheduleRequest, CreateScheduleResponse, DeleteScheduleRequest, DeleteScheduleResponse,
    GetScheduleRequest, GetScheduleResponse, ListSchedulesRequest, ListSchedulesResponse,
    PauseScheduleRequest, PauseScheduleResponse, ResumeScheduleRequest, ResumeScheduleResponse,
};
use switchyard_proto::executor::v1::{
    CreateTriggerRequest, CreateTriggerResponse, DeleteTriggerRequest, DeleteTriggerResponse,
    FireTriggerRequest, FireTriggerResponse, GetTriggerRequest, GetTriggerResponse,
    ListTriggersRequest, ListTriggersResponse,
};
use tonic::{Request, Response, Status};

use switchyard_kit::auth::grant::GrantError;

use crate::Executor;
use crate::admission::{Submission, submitter};

#[tonic::async_trait]
impl JobService for Executor {
    async fn submit_job(
        &self,
        req: Request<SubmitJobRequest>,
    ) -> Result<Response<SubmitJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let who = submitter(&p);
        let delegation_only = !p.roles.has(switchyard_kit::auth::Role::Submitter)
            && !p.roles.has(switchyard_kit::auth::Role::Service);
        let ctx = switchyard_kit::context::current();
        let correlation = ctx
            .as_ref()
            .map(|c| c.correlation_id.clone())
            .unwrap_or_else(switchyard_kit::context::new_correlation_id);
        let traceparent = switchyard_kit::context::outgoing_traceparent();
        let how = Submission {
            who,
            delegation_only,
            grant: None,
            budgets: crate::admission::BudgetRight::of(&p),
            correlation_id: correlation,
            traceparent,
            rerun: None,
            fired: None,
        };
        let req = req.into_inner();
        let grant = match req.invocation_grant.as_str() {
            "" => None,
            token => Some(
                switchyard_kit::auth::grant::key()
                    .verify(token, switchyard_kit::time::now_ms())
                    .map_err(crate::error::ExecutorError::from)?,
            ),
        };
        if let Some(g) = &grant
            && p.tenant_scope().is_some_and(|t| t != g.tenant)
        {
            let outside = GrantError::Outside("it belongs to another tenant".into());
            return Err(crate::error::ExecutorError::from(outside).into());
        }
        let how = Submission { grant, ..how };
        let wait = wait_of(req.wait.as_ref())?;
        let mut resp = self.submit_as(req, how).await?;
        if !wait.is_zero() {
            let id = resp
                .job
                .as_ref()
                .and_then(|j| j.spec.as_ref())
                .map(|s| s.job_id.clone());
            if let Some(id) = id
                && let Some(result) = self.result_within(&id, wait).await?
            {
                resp.job = Some(self.job(&id).await?);
                resp.result = Some(result);
            }
        }
        Ok(Response::new(resp))
    }

    async fn validate_job(
        &self,
        req: Request<ValidateJobRequest>,
    ) -> Result<Response<ValidateJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let who = crate::admission::submitter(&p);
        let right = crate::admission::BudgetRight::of(&p);
        Ok(Response::new(
            Executor::validate_job(self, req.into_inner(), who, right).await?,
        ))
    }

    async fn get_job(
        &self,
        req: Request<GetJobRequest>,
    ) -> Result<Response<GetJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.inner.book.visible(&p, &req.get_ref().job_id).await?;
        let job = self.job(&req.get_ref().job_id).await?;
        Ok(Response::new(GetJobResponse { job: Some(job) }))
    }

    async fn list_jobs(
        &self,
        req: Request<ListJobsRequest>,
    ) -> Result<Response<ListJobsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            self.inner.book.list_for(req.get_ref(), &p).await?,
        ))
    }

    type WatchJobStream =
        futures_util::stream::BoxStream<'static, Result<WatchJobResponse, Status>>;

    async fn watch_job(
        &self,
        req: Request<WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.inner.book.visible(&p, &req.get_ref().job_id).await?;
        let r = req.into_inner();
        let events = self.watch(&r.job_id, r.after_sequence, r.detail());
        Ok(Response::new(Box::pin(events.map(|e| {
            e.map(|event| WatchJobResponse { event: Some(event) })
        }))))
    }

    async fn send_input(
        &self,
        req: Request<SendInputRequest>,
    ) -> Result<Response<SendInputResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::send_input(self, &p, req.into_inner()).await?,
        ))
    }

    async fn list_input_requests(
        &self,
        req: Request<ListInputRequestsRequest>,
    ) -> Result<Response<ListInputRequestsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::list_input_requests(self, &p, req.get_ref()).await?,
        ))
    }

    async fn send_message(
        &self,
        req: Request<SendMessageRequest>,
    ) -> Result<Response<SendMessageResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::send_message(self, &p, req.into_inner()).await?,
        ))
    }

    async fn list_messages(
        &self,
        req: Request<ListMessagesRequest>,
    ) -> Result<Response<ListMessagesResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::list_messages(self, &p, req.get_ref()).await?,
        ))
    }

    async fn cancel_job(
        &self,
        req: Request<CancelJobRequest>,
    ) -> Result<Response<CancelJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.inner.book.visible(&p, &req.get_ref().job_id).await?;
        let who = submitter(&p);
        let r = req.into_inner();
        let job = self.cancel(&r.job_id, &r.reason, who).await?;
        Ok(Response::new(CancelJobResponse { job: Some(job) }))
    }

    async fn prune_jobs(
        &self,
        req: Request<PruneJobsRequest>,
    ) -> Result<Response<PruneJobsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let older = req.get_ref().older_than.as_ref();
        let ms = older.map_or(0, |d| {
            (d.seconds.max(0) as u64).saturating_mul(1000) + (d.nanos.max(0) as u64) / 1_000_000
        });
        if ms < 1000 || older.is_some_and(|d| d.seconds < 0 || d.nanos < 0) {
            let mut v = switchyard_core::Violations::new();
            v.add(
                "older_than",
                "must be at least 1s: jobs that finished longer ago than this are removed",
            );
            return Err(switchyard_kit::error::invalid_argument(
                switchyard_core::Reason::InvalidArgument,
                &v,
            ));
        }
        // A tenant's admin prunes that tenant's jobs; the service token, all.
        let tenant = p.tenant_scope().map(str::to_owned);
        let (jobs, records) = self.prune(ms, tenant.as_deref()).await?;
        Ok(Response::new(PruneJobsResponse { jobs, records }))
    }

    async fn explain_job(
        &self,
        req: Request<ExplainJobRequest>,
    ) -> Result<Response<ExplainJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let id = &req.get_ref().job_id;
        self.inner.book.visible(&p, id).await?;
        Ok(Response::new(self.explain(id).await?))
    }

    async fn export_journal(
        &self,
        req: Request<ExportJournalRequest>,
    ) -> Result<Response<ExportJournalResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let id = &req.get_ref().job_id;
        self.inner.book.visible(&p, id).await?;
        Ok(Response::new(self.export_journal(id).await?))
    }

    async fn verify_journals(
        &self,
        req: Request<VerifyJournalsRequest>,
    ) -> Result<Response<VerifyJournalsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        // A tenant's admin verifies that tenant's jobs; the service token, all.
        let tenant = p.tenant_scope().map(str::to_owned);
        let job = &req.get_ref().job_id;
        if !job.is_empty() {
            self.inner.book.visible(&p, job).await?;
        }
        let only = (!job.is_empty()).then_some(job.as_str());
        Ok(Response::new(
            self.verify_journals(tenant.as_deref(), only).await?,
        ))
    }

    async fn retry_dead_letter(
        &self,
        req: Request<RetryDeadLetterRequest>,
    ) -> Result<Response<RetryDeadLetterResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let job = Executor::retry_dead_letter(self, &p, &req.get_ref().job_id).await?;
        Ok(Response::new(RetryDeadLetterResponse { job: Some(job) }))
    }

    async fn rerun_job(
        &self,
        req: Request<RerunJobRequest>,
    ) -> Result<Response<RerunJobResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let correlation = switchyard_kit::context::current()
            .map(|c| c.correlation_id)
            .unwrap_or_else(switchyard_kit::context::new_correlation_id);
        let traceparent = switchyard_kit::context::outgoing_traceparent();
        let out = self
            .rerun_job(&p, req.into_inner(), correlation, traceparent)
            .await?;
        Ok(Response::new(out))
    }

    async fn delete_dead_letter(
        &self,
        req: Request<DeleteDeadLetterRequest>,
    ) -> Result<Response<DeleteDeadLetterResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let job_id = req.into_inner().job_id;
        Executor::delete_dead_letter(self, &p, &job_id).await?;
        Ok(Response::new(DeleteDeadLetterResponse { job_id }))
    }

    async fn get_result(
        &self,
        req: Request<GetResultRequest>,
    ) -> Result<Response<GetResultResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        self.inner.book.visible(&p, &req.get_ref().job_id).await?;
        let wait = wait_of(req.get_ref().wait.as_ref())?;
        let id = &req.get_ref().job_id;
        let result = match self.result_within(id, wait).await? {
            Some(r) => r,
            None => self.inner.book.result(id).await?,
        };
        Ok(Response::new(result))
    }

    async fn list_artifacts(
        &self,
        req: Request<ListArtifactsRequest>,
    ) -> Result<Response<ListArtifactsResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let id = &req.get_ref().job_id;
        self.inner.book.visible(&p, id).await?;
        let job = self.inner.book.job(id).await?;
        Ok(Response::new(ListArtifactsResponse {
            artifacts: switchyard_api::artifacts::latest_per_path(&job.artifacts),
        }))
    }

    async fn get_artifact(
        &self,
        req: Request<GetArtifactRequest>,
    ) -> Result<Response<GetArtifactResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let r = req.get_ref();
        self.inner.book.visible(&p, &r.job_id).await?;
        let (artifact, content) = self.artifact(&r.job_id, &r.artifact).await?;
        Ok(Response::new(GetArtifactResponse {
            artifact: Some(artifact),
            content,
        }))
    }
}

#[tonic::async_trait]
impl WorkerService for Executor {
    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<FetchResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::fetch(self, &p, req.into_inner()).await?,
        ))
    }

    async fn ack(&self, req: Request<AckRequest>) -> Result<Response<AckResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::ack(self, &p, req.into_inner()).await?,
        ))
    }

    async fn nack(&self, req: Request<NackRequest>) -> Result<Response<NackResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::nack(self, &p, req.into_inner()).await?,
        ))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::heartbeat(self, &p, req.into_inner()).await?,
        ))
    }

    async fn set_worker_state(
        &self,
        req: Request<SetWorkerStateRequest>,
    ) -> Result<Response<SetWorkerStateResponse>, Status> {
        Ok(Response::new(Executor::set_worker_state(
            self,
            req.into_inner(),
        )?))
    }
}

/// A request's `wait`; zero when unset. A negative one is refused. (It is
/// cut to the caller's deadline when the wait begins: see
/// [`Executor::result_within`].)
fn wait_of(wait: Option<&prost_types::Duration>) -> Result<std::time::Duration, Status> {
    let Some(d) = wait else {
        return Ok(std::time::Duration::ZERO);
    };
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        let mut v = switchyard_core::Violations::new();
        v.add(
            "wait",
            "must be a non-negative duration: how long to wait for the job to end (unset: do not wait)",
        );
        return Err(switchyard_kit::error::invalid_argument(
            switchyard_core::Reason::InvalidArgument,
            &v,
        ));
    }
    Ok(std::time::Duration::new(d.seconds as u64, d.nanos as u32))
}

#[tonic::async_trait]
impl switchyard_proto::executor::v1::schedule_service_server::ScheduleService for Executor {
    async fn create_schedule(
        &self,
        req: Request<CreateScheduleRequest>,
    ) -> Result<Response<CreateScheduleResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::create_schedule(self, &p, req.into_inner()).await?,
        ))
    }

    async fn get_schedule(
        &self,
        req: Request<GetScheduleRequest>,
    ) -> Result<Response<GetScheduleResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let s = Executor::get_schedule(self, &p, &req.get_ref().schedule_id).await?;
        Ok(Response::new(GetScheduleResponse { schedule: Some(s) }))
    }

    async fn list_schedules(
        &self,
        req: Request<ListSchedulesRequest>,
    ) -> Result<Response<ListSchedulesResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let schedules = Executor::list_schedules(self, &p).await?;
        Ok(Response::new(ListSchedulesResponse { schedules }))
    }

    async fn pause_schedule(
        &self,
        req: Request<PauseScheduleRequest>,
    ) -> Result<Response<PauseScheduleResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let r = req.into_inner();
        let s = Executor::pause_schedule(self, &p, &r.schedule_id, Some(r.note)).await?;
        Ok(Response::new(PauseScheduleResponse { schedule: Some(s) }))
    }

    async fn resume_schedule(
        &self,
        req: Request<ResumeScheduleRequest>,
    ) -> Result<Response<ResumeScheduleResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let s = Executor::pause_schedule(self, &p, &req.get_ref().schedule_id, None).await?;
        Ok(Response::new(ResumeScheduleResponse { schedule: Some(s) }))
    }

    async fn delete_schedule(
        &self,
        req: Request<DeleteScheduleRequest>,
    ) -> Result<Response<DeleteScheduleResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Executor::delete_schedule(self, &p, &req.get_ref().schedule_id).await?;
        Ok(Response::new(DeleteScheduleResponse {}))
    }
}

#[tonic::async_trait]
impl switchyard_proto::executor::v1::trigger_service_server::TriggerService for Executor {
    async fn create_trigger(
        &self,
        req: Request<CreateTriggerRequest>,
    ) -> Result<Response<CreateTriggerResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::create_trigger(self, &p, req.into_inner()).await?,
        ))
    }

    async fn get_trigger(
        &self,
        req: Request<GetTriggerRequest>,
    ) -> Result<Response<GetTriggerResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let t = Executor::get_trigger(self, &p, &req.get_ref().trigger_id).await?;
        Ok(Response::new(GetTriggerResponse { trigger: Some(t) }))
    }

    async fn list_triggers(
        &self,
        req: Request<ListTriggersRequest>,
    ) -> Result<Response<ListTriggersResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let triggers = Executor::list_triggers(self, &p).await?;
        Ok(Response::new(ListTriggersResponse { triggers }))
    }

    async fn delete_trigger(
        &self,
        req: Request<DeleteTriggerRequest>,
    ) -> Result<Response<DeleteTriggerResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Executor::delete_trigger(self, &p, &req.get_ref().trigger_id).await?;
        Ok(Response::new(DeleteTriggerResponse {}))
    }

    async fn fire_trigger(
        &self,
        req: Request<FireTriggerRequest>,
    ) -> Result<Response<FireTriggerResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            Executor::fire_trigger(self, &p, req.into_inner()).await?,
        ))
    }
}

#[tonic::async_trait]
impl switchyard_proto::executor::v1::notification_service_server::NotificationService for Executor {
    async fn list_deliveries(
        &self,
        req: Request<switchyard_proto::executor::v1::ListDeliveriesRequest>,
    ) -> Result<Response<switchyard_proto::executor::v1::ListDeliveriesResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let deliveries = Executor::list_deliveries(self, &p, req.get_ref().dead_only).await?;
        Ok(Response::new(
            switchyard_proto::executor::v1::ListDeliveriesResponse { deliveries },
        ))
    }

    async fn retry_delivery(
        &self,
        req: Request<switchyard_proto::executor::v1::RetryDeliveryRequest>,
    ) -> Result<Response<switchyard_proto::executor::v1::RetryDeliveryResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let d = Executor::retry_delivery(self, &p, req.into_inner()).await?;
        Ok(Response::new(
            switchyard_proto::executor::v1::RetryDeliveryResponse { delivery: Some(d) },
        ))
    }
}
