//! Every Switchyard service's client, declared next to the proto types: one
//! enum per service that calls it in-process (`switchyard dev`, through the
//! same generated trait the gRPC server calls) or over gRPC (split mode),
//! with the correlation id, trace context, credential and on-behalf-of user
//! propagated either way. Services, the SDK, declarative agents, the CLI and
//! the bench all use these; no crate needs another service's implementation
//! to call it.
//!
//! [`spend`] is the one way to spend on a budget: reserve, then commit or
//! release, with one idempotency-key builder.

pub mod artifacts;
pub mod spend;

/// The registry (AINS): agents, tools, leases, outcomes.
pub mod registry {
    use switchyard_proto::registry::v1::registry_service_client::RegistryServiceClient;
    use switchyard_proto::registry::v1::registry_service_server::RegistryService;
    use switchyard_proto::registry::v1::*;

    switchyard_kit::service_client! {
        /// A registry client: in-process in `switchyard dev`, over gRPC when split.
        pub RegistryClient(LocalRegistry) {
            service: RegistryService,
            remote: RegistryServiceClient,
            unary {
                /// Registers or updates an agent.
                register_agent(RegisterAgentRequest) -> RegisterAgentResponse;
                /// Renews a lease.
                heartbeat(HeartbeatRequest) -> HeartbeatResponse;
                /// Removes an agent.
                deregister_agent(DeregisterAgentRequest) -> DeregisterAgentResponse;
                /// Returns one agent.
                get_agent(GetAgentRequest) -> GetAgentResponse;
                /// Lists agents.
                list_agents(ListAgentsRequest) -> ListAgentsResponse;
                /// Agents offering a capability.
                find_by_capability(FindByCapabilityRequest) -> FindByCapabilityResponse;
                /// Registers a tool.
                register_tool(RegisterToolRequest) -> RegisterToolResponse;
                /// Removes a tool.
                deregister_tool(DeregisterToolRequest) -> DeregisterToolResponse;
                /// Lists tools.
                list_tools(ListToolsRequest) -> ListToolsResponse;
                /// Tools and agents for a prompt.
                get_capabilities_summary(GetCapabilitiesSummaryRequest) -> GetCapabilitiesSummaryResponse;
                /// Records a call outcome.
                report_outcome(ReportOutcomeRequest) -> ReportOutcomeResponse;
                /// Registers an MCP server and its tools.
                register_mcp_server(RegisterMcpServerRequest) -> RegisterMcpServerResponse;
                /// Removes an MCP server and its tools.
                deregister_mcp_server(DeregisterMcpServerRequest) -> DeregisterMcpServerResponse;
                /// Lists MCP servers.
                list_mcp_servers(ListMcpServersRequest) -> ListMcpServersResponse;
                /// Registers an A2A agent from its Agent Card.
                register_a2a_agent(RegisterA2aAgentRequest) -> RegisterA2aAgentResponse;
            }
            streaming {
                /// Streams changes.
                watch(WatchRequest) -> WatchResponse;
                /// Runs one MCP tool call: progress, then the result.
                call_mcp_tool(CallMcpToolRequest) -> CallMcpToolResponse;
            }
        }
    }
}

/// The router: ranked candidates for a capability.
pub mod router {
    use switchyard_proto::router::v1::router_service_client::RouterServiceClient;
    use switchyard_proto::router::v1::router_service_server::RouterService;
    use switchyard_proto::router::v1::*;

    switchyard_kit::service_client! {
        /// A router client: in-process in `switchyard dev`, over gRPC when split.
        pub RouterClient(LocalRouter) {
            service: RouterService,
            remote: RouterServiceClient,
            unary {
                /// Ranks agents for a capability.
                route(RouteRequest) -> RouteResponse;
            }
            streaming {}
        }
    }
}

/// The ledger: budgets, reservations, the cost journal.
pub mod ledger {
    use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
    use switchyard_proto::ledger::v1::ledger_service_server::LedgerService;
    use switchyard_proto::ledger::v1::*;

    switchyard_kit::service_client! {
        /// A ledger client: in-process in `switchyard dev`, over gRPC when split.
        pub LedgerClient(LocalLedger) {
            service: LedgerService,
            remote: LedgerServiceClient,
            unary {
                /// Creates a budget.
                create_budget(CreateBudgetRequest) -> CreateBudgetResponse;
                /// Returns a budget.
                get_budget(GetBudgetRequest) -> GetBudgetResponse;
                /// Lists budgets.
                list_budgets(ListBudgetsRequest) -> ListBudgetsResponse;
                /// Changes limits.
                update_limits(UpdateLimitsRequest) -> UpdateLimitsResponse;
                /// Closes a budget.
                close_budget(CloseBudgetRequest) -> CloseBudgetResponse;
                /// Reserves on a budget chain.
                reserve(ReserveRequest) -> ReserveResponse;
                /// Commits usage.
                commit(CommitRequest) -> CommitResponse;
                /// Releases a reservation.
                release(ReleaseRequest) -> ReleaseResponse;
                /// Lists journal entries.
                list_entries(ListEntriesRequest) -> ListEntriesResponse;
                /// Estimates a model call's cost.
                estimate_cost(EstimateCostRequest) -> EstimateCostResponse;
                /// Sums spend over a time range.
                report(ReportRequest) -> ReportResponse;
                /// Checks the journal's hash chains.
                verify_journal(VerifyJournalRequest) -> VerifyJournalResponse;
                /// Sets a cooldown on an upstream key.
                cool_down(CoolDownRequest) -> CoolDownResponse;
                /// Lists the rate-limit buckets.
                list_limits(ListLimitsRequest) -> ListLimitsResponse;
            }
            streaming {
                /// Streams ledger events.
                watch(WatchRequest) -> WatchResponse;
            }
        }
    }
}

/// The approval gate: runs, decisions, claims.
pub mod approval {
    use switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient;
    use switchyard_proto::approval::v1::approval_service_server::ApprovalService;
    use switchyard_proto::approval::v1::*;

    switchyard_kit::service_client! {
        /// An approval client: in-process in `switchyard dev`, over gRPC when split.
        pub ApprovalClient(LocalApproval) {
            service: ApprovalService,
            remote: ApprovalServiceClient,
            unary {
                /// Proposes a run.
                propose(ProposeRequest) -> ProposeResponse;
                /// Approves a run.
                approve(ApproveRequest) -> ApproveResponse;
                /// Approves a run as an audited override.
                break_glass_approve(BreakGlassApproveRequest) -> BreakGlassApproveResponse;
                /// Rejects a run.
                reject(RejectRequest) -> RejectResponse;
                /// Cancels a run.
                cancel(CancelRequest) -> CancelResponse;
                /// Returns a run.
                get_run(GetRunRequest) -> GetRunResponse;
                /// Lists runs.
                list_runs(ListRunsRequest) -> ListRunsResponse;
                /// Claims a run.
                claim(ClaimRequest) -> ClaimResponse;
                /// Renews a claim.
                renew_claim(RenewClaimRequest) -> RenewClaimResponse;
                /// Completes a run.
                complete(CompleteRequest) -> CompleteResponse;
                /// Fails a run.
                fail(FailRequest) -> FailResponse;
                /// Lists the audit log.
                list_audit(ListAuditRequest) -> ListAuditResponse;
                /// VerifyAudit.
                verify_audit(VerifyAuditRequest) -> VerifyAuditResponse;
                /// Returns the signed receipt of a run's approval.
                get_receipt(GetReceiptRequest) -> GetReceiptResponse;
                /// Exports the prompt bundle.
                export_prompt_bundle(ExportPromptBundleRequest) -> ExportPromptBundleResponse;
                /// Imports a manual result.
                import_manual_result(ImportManualResultRequest) -> ImportManualResultResponse;
                /// Lists a run's artifacts.
                list_run_artifacts(ListRunArtifactsRequest) -> ListRunArtifactsResponse;
                /// Returns one of a run's artifacts.
                get_run_artifact(GetRunArtifactRequest) -> GetRunArtifactResponse;
                /// Stores a policy file in the policy store.
                put_policy(PutPolicyRequest) -> PutPolicyResponse;
                /// Removes a stored policy file.
                delete_policy(DeletePolicyRequest) -> DeletePolicyResponse;
                /// Lists the stored policy files.
                list_policies(ListPoliciesRequest) -> ListPoliciesResponse;
            }
            streaming {
                /// Streams run events.
                watch(WatchRequest) -> WatchResponse;
            }
        }
    }
}

/// Identity: API keys and who a caller is.
pub mod auth {
    use switchyard_proto::auth::v1::auth_service_client::AuthServiceClient;
    use switchyard_proto::auth::v1::auth_service_server::AuthService;
    use switchyard_proto::auth::v1::*;

    switchyard_kit::service_client! {
        /// Calls the auth service in-process or over gRPC.
        pub AuthClient(LocalAuth) {
            service: AuthService,
            remote: AuthServiceClient,
            unary {
                /// CreateKey.
                create_key(CreateKeyRequest) -> CreateKeyResponse;
                /// ListKeys.
                list_keys(ListKeysRequest) -> ListKeysResponse;
                /// RevokeKey.
                revoke_key(RevokeKeyRequest) -> RevokeKeyResponse;
                /// WhoAmI.
                who_am_i(WhoAmIRequest) -> WhoAmIResponse;
                /// StartSession.
                start_session(StartSessionRequest) -> StartSessionResponse;
                /// EndSession.
                end_session(EndSessionRequest) -> EndSessionResponse;
            }
            streaming {
                /// WatchKeys.
                watch_keys(WatchKeysRequest) -> WatchKeysResponse;
            }
        }
    }
}

/// The executor: jobs.
pub mod executor {
    use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
    use switchyard_proto::executor::v1::job_service_server::JobService;
    use switchyard_proto::executor::v1::*;

    switchyard_kit::service_client! {
        /// Executor client, in-process or remote.
        pub ExecutorClient(LocalExecutor) {
            service: JobService,
            remote: JobServiceClient,
            unary {
                /// SubmitJob.
                submit_job(SubmitJobRequest) -> SubmitJobResponse;
                /// ValidateJob.
                validate_job(ValidateJobRequest) -> ValidateJobResponse;
                /// GetJob.
                get_job(GetJobRequest) -> GetJobResponse;
                /// ListJobs.
                list_jobs(ListJobsRequest) -> ListJobsResponse;
                /// CancelJob.
                cancel_job(CancelJobRequest) -> CancelJobResponse;
                /// GetResult.
                get_result(GetResultRequest) -> GetResultResponse;
                /// PruneJobs.
                prune_jobs(PruneJobsRequest) -> PruneJobsResponse;
                /// VerifyJournals.
                verify_journals(VerifyJournalsRequest) -> VerifyJournalsResponse;
                /// Runs a finished job again, afresh or resumed.
                rerun_job(RerunJobRequest) -> RerunJobResponse;
                /// ExplainJob.
                explain_job(ExplainJobRequest) -> ExplainJobResponse;
                /// ExportJournal.
                export_journal(ExportJournalRequest) -> ExportJournalResponse;
                /// RetryDeadLetter.
                retry_dead_letter(RetryDeadLetterRequest) -> RetryDeadLetterResponse;
                /// DeleteDeadLetter.
                delete_dead_letter(DeleteDeadLetterRequest) -> DeleteDeadLetterResponse;
                /// ListArtifacts.
                list_artifacts(ListArtifactsRequest) -> ListArtifactsResponse;
                /// GetArtifact.
                get_artifact(GetArtifactRequest) -> GetArtifactResponse;
                /// SendInput.
                send_input(SendInputRequest) -> SendInputResponse;
                /// ListInputRequests.
                list_input_requests(ListInputRequestsRequest) -> ListInputRequestsResponse;
                /// SendMessage.
                send_message(SendMessageRequest) -> SendMessageResponse;
                /// ListMessages.
                list_messages(ListMessagesRequest) -> ListMessagesResponse;
            }
            streaming {
                /// WatchJob.
                watch_job(WatchJobRequest) -> WatchJobResponse;
            }
        }
    }
}

/// The executor's schedules (`ScheduleService`).
pub mod schedule {
    use switchyard_proto::executor::v1::schedule_service_client::ScheduleServiceClient;
    use switchyard_proto::executor::v1::schedule_service_server::ScheduleService;
    use switchyard_proto::executor::v1::*;

    switchyard_kit::service_client! {
        /// ScheduleService client, in-process or remote.
        pub ScheduleClient(LocalSchedules) {
            service: ScheduleService,
            remote: ScheduleServiceClient,
            unary {
                /// CreateSchedule.
                create_schedule(CreateScheduleRequest) -> CreateScheduleResponse;
                /// GetSchedule.
                get_schedule(GetScheduleRequest) -> GetScheduleResponse;
                /// ListSchedules.
                list_schedules(ListSchedulesRequest) -> ListSchedulesResponse;
                /// PauseSchedule.
                pause_schedule(PauseScheduleRequest) -> PauseScheduleResponse;
                /// ResumeSchedule.
                resume_schedule(ResumeScheduleRequest) -> ResumeScheduleResponse;
                /// DeleteSchedule.
                delete_schedule(DeleteScheduleRequest) -> DeleteScheduleResponse;
            }
            streaming {}
        }
    }
}

/// The executor's triggers (`TriggerService`).
pub mod trigger {
    use switchyard_proto::executor::v1::trigger_service_client::TriggerServiceClient;
    use switchyard_proto::executor::v1::trigger_service_server::TriggerService;
    use switchyard_proto::executor::v1::*;

    switchyard_kit::service_client! {
        /// TriggerService client, in-process or remote.
        pub TriggerClient(LocalTriggers) {
            service: TriggerService,
            remote: TriggerServiceClient,
            unary {
                /// CreateTrigger.
                create_trigger(CreateTriggerRequest) -> CreateTriggerResponse;
                /// GetTrigger.
                get_trigger(GetTriggerRequest) -> GetTriggerResponse;
                /// ListTriggers.
                list_triggers(ListTriggersRequest) -> ListTriggersResponse;
                /// DeleteTrigger.
                delete_trigger(DeleteTriggerRequest) -> DeleteTriggerResponse;
                /// FireTrigger.
                fire_trigger(FireTriggerRequest) -> FireTriggerResponse;
            }
            streaming {}
        }
    }
}

/// The executor's webhook deliveries (`NotificationService`).
pub mod notification {
    use switchyard_proto::executor::v1::notification_service_client::NotificationServiceClient;
    use switchyard_proto::executor::v1::notification_service_server::NotificationService;
    use switchyard_proto::executor::v1::*;

    switchyard_kit::service_client! {
        /// NotificationService client, in-process or remote.
        pub NotificationClient(LocalNotifications) {
            service: NotificationService,
            remote: NotificationServiceClient,
            unary {
                /// ListDeliveries.
                list_deliveries(ListDeliveriesRequest) -> ListDeliveriesResponse;
                /// RetryDelivery.
                retry_delivery(RetryDeliveryRequest) -> RetryDeliveryResponse;
            }
            streaming {}
        }
    }
}

/// The executor's pull workers' service (`WorkerService`).
pub mod worker {
    use switchyard_proto::executor::v1::worker_service_client::WorkerServiceClient;
    use switchyard_proto::executor::v1::worker_service_server::WorkerService;
    use switchyard_proto::executor::v1::*;

    switchyard_kit::service_client! {
        /// WorkerService client, in-process or remote.
        pub WorkerClient(LocalWorkers) {
            service: WorkerService,
            remote: WorkerServiceClient,
            unary {
                /// Fetch.
                fetch(FetchRequest) -> FetchResponse;
                /// Ack.
                ack(AckRequest) -> AckResponse;
                /// Nack.
                nack(NackRequest) -> NackResponse;
                /// Heartbeat.
                heartbeat(HeartbeatRequest) -> HeartbeatResponse;
                /// SetWorkerState.
                set_worker_state(SetWorkerStateRequest) -> SetWorkerStateResponse;
            }
            streaming {}
        }
    }
}

/// An agent (`AgentService`): the executor's built-ins in-process, any other over gRPC.
pub mod agent {
    use switchyard_proto::agent::v1::agent_service_client::AgentServiceClient;
    use switchyard_proto::agent::v1::agent_service_server::AgentService;
    use switchyard_proto::agent::v1::*;

    switchyard_kit::service_client! {
        /// An agent, called in-process (the built-in agents of this executor) or
        /// over gRPC.
        pub AgentClient(LocalAgent) {
            service: AgentService,
            remote: AgentServiceClient,
            unary {
                /// The agent's descriptor.
                describe(DescribeRequest) -> DescribeResponse;
            }
            streaming {
                /// Runs a task.
                invoke(InvokeRequest) -> InvokeResponse;
            }
        }
    }
}

/// A tool provider (`ToolService`), called for an LLM task or an agent.
pub mod tool {
    use switchyard_proto::agent::v1::tool_service_client::ToolServiceClient;
    use switchyard_proto::agent::v1::tool_service_server::ToolService;
    use switchyard_proto::agent::v1::*;

    switchyard_kit::service_client! {
        /// A tool provider's client.
        pub ToolClient(LocalTool) {
            service: ToolService,
            remote: ToolServiceClient,
            unary {
                /// Runs a tool.
                call_tool(CallToolRequest) -> CallToolResponse;
            }
            streaming {}
        }
    }
}

pub use agent::AgentClient;
pub use approval::ApprovalClient;
pub use auth::AuthClient;
pub use executor::ExecutorClient;
pub use ledger::LedgerClient;
pub use notification::NotificationClient;
pub use registry::RegistryClient;
pub use router::RouterClient;
pub use schedule::ScheduleClient;
pub use tool::ToolClient;
pub use trigger::TriggerClient;
pub use worker::WorkerClient;
