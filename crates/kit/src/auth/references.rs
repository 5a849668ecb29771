//! Every request field that names another object or resource, declared
//! once with the rule that authorizes it — the companion of the RPC table
//! in [`super::permissions`]. Allowing an RPC never implies allowing every
//! object it names: the field is resolved by the rule below, in the place
//! named, before a handler uses it.
//!
//! A test walks the descriptor set and fails when a field that looks like a
//! reference (`*_id`, `*_ids`, `*_url(s)`, `endpoint`, `parent*`,
//! `approved_under`, the `files` maps) of any message an RPC accepts is not
//! declared here, so the next such field cannot ship unguarded.

/// How a reference is authorized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// An existing object, resolved through its service's visibility check:
    /// another tenant's object, and (for submitters and agents) another
    /// principal's, is `NOT_FOUND`.
    Visible,
    /// The id of a new object the caller creates: one charset
    /// (`core::validate::object_id` or `key`), and a repeat with the same
    /// content is the same object, another content `ALREADY_EXISTS`.
    NewId,
    /// A fact the platform establishes: set by a service (or the executor
    /// for an invocation), refused or overwritten when a client sends it.
    Platform,
    /// An agent key acts on it only with an invocation grant naming it
    /// (`auth::grant`); people and services by [`Rule::Visible`].
    Grant,
    /// A budget to draw on: one the caller manages, or one an admin shared
    /// with it (`shared_with`); never a job's own budget.
    Shared,
    /// A destination the server will call: the egress guard (`egress`).
    Egress,
    /// A name that becomes a file: one plain path segment, created under
    /// its root only through `sandbox::scratch`.
    PlainName,
    /// Looks like a reference but names nothing the server resolves (a
    /// correlation id, a client's own label or handle): free text within
    /// its charset.
    Opaque,
}

/// One declared reference field.
#[derive(Debug, Clone, Copy)]
pub struct Reference {
    /// `package.Message.field`.
    pub field: &'static str,
    /// The rule.
    pub rule: Rule,
    /// Where the rule is enforced.
    pub by: &'static str,
}

const fn r(field: &'static str, rule: Rule, by: &'static str) -> Reference {
    Reference { field, rule, by }
}

use Rule::*;

/// Every reference field of every message an RPC accepts.
pub const REFERENCES: &[Reference] = &[
    // --- agent (requests Switchyard sends to agents) ---
    r(
        "switchyard.agent.v1.InvokeRequest.agent_id",
        Platform,
        "executor attempt::agent (the routed candidate)",
    ),
    r(
        "switchyard.agent.v1.InvocationContext.budget_id",
        Platform,
        "executor attempt::agent; spending on it needs InvocationContext.grant",
    ),
    r(
        "switchyard.agent.v1.CallToolRequest.call_id",
        Opaque,
        "the calling loop's own handle",
    ),
    // --- approval ---
    r(
        "switchyard.approval.v1.Run.run_id",
        NewId,
        "approval validate::run (key charset), propose (same spec or RUN_EXISTS)",
    ),
    r(
        "switchyard.approval.v1.Run.job_id",
        Platform,
        "the executor's proposal; a person's run names no job",
    ),
    r(
        "switchyard.approval.v1.Run.correlation_id",
        Opaque,
        "tracing only",
    ),
    r(
        "switchyard.approval.v1.Target.work_item_ids",
        Opaque,
        "seed 004's labels of the work a run is about",
    ),
    r(
        "switchyard.approval.v1.ContextPack.pack_id",
        Opaque,
        "bound by the context hash, not resolved",
    ),
    r(
        "switchyard.approval.v1.ArtifactPublication.job_id",
        Opaque,
        "what a publication run says it is about, resolved nowhere by the approval service: `agents publish` reads the artifact from the job as the publisher and publishes only under that reader's approved run whose id and context hash are derived from the job and the bytes read",
    ),
    r(
        "switchyard.approval.v1.ArtifactPublication.artifact_id",
        Opaque,
        "a content address: approval validate requires it to equal context_pack.hash, and `agents publish` compares it with the bytes it read",
    ),
    r(
        "switchyard.approval.v1.BudgetExtension.job_id",
        Platform,
        "approval bind_proposal: extension only from the executor acting for the submitter; the executor follows only the run id it recorded in the job's log",
    ),
    r(
        "switchyard.approval.v1.BudgetExtension.budget_id",
        Platform,
        "as BudgetExtension.job_id (the executor raises the budget its job recorded, never this field)",
    ),
    r(
        "switchyard.approval.v1.BudgetExtension.job_run_id",
        Platform,
        "as BudgetExtension.job_id",
    ),
    r(
        "switchyard.approval.v1.ToolCall.job_id",
        Platform,
        "approval bind_proposal: tool_call only from the executor acting for the submitter",
    ),
    r(
        "switchyard.approval.v1.ToolCall.task_id",
        Platform,
        "as ToolCall.job_id",
    ),
    r(
        "switchyard.approval.v1.ToolCall.call_id",
        Platform,
        "as ToolCall.job_id",
    ),
    r(
        "switchyard.approval.v1.ToolCall.job_run_id",
        Platform,
        "as ToolCall.job_id",
    ),
    r(
        "switchyard.common.v1.Artifact.artifact_id",
        Platform,
        "approval complete (gRPC): a non-service worker's RunResult.artifacts are dropped; a run's artifacts are only those the platform stored for it",
    ),
    r(
        "switchyard.common.v1.Artifact.task_id",
        Platform,
        "as Artifact.artifact_id",
    ),
    r(
        "switchyard.approval.v1.RunResult.changeset_bundle_id",
        Opaque,
        "a result the adapter reports; displayed, never fetched",
    ),
    r(
        "switchyard.approval.v1.RunResult.draft_pr_url",
        Opaque,
        "a result the adapter reports; displayed, never fetched",
    ),
    r(
        "switchyard.approval.v1.ProposeRequest.approved_under",
        Platform,
        "approval bind_proposal (service acting for a user only) + propose (same tenant, not the run's own job)",
    ),
    r(
        "switchyard.approval.v1.ClaimOnApproval.worker_id",
        Opaque,
        "the claimant's own handle (key charset); the claim needs RunWork (approval propose)",
    ),
    r(
        "switchyard.approval.v1.ApproveRequest.run_id",
        Visible,
        "approval check_visible + separation of duties",
    ),
    r(
        "switchyard.approval.v1.BreakGlassApproveRequest.run_id",
        Visible,
        "approval check_visible",
    ),
    r(
        "switchyard.approval.v1.RejectRequest.run_id",
        Visible,
        "approval check_visible",
    ),
    r(
        "switchyard.approval.v1.CancelRequest.run_id",
        Visible,
        "approval check_visible (owner or operator)",
    ),
    r(
        "switchyard.approval.v1.GetRunRequest.run_id",
        Visible,
        "approval visible_run",
    ),
    r(
        "switchyard.approval.v1.ListRunsRequest.work_item_id",
        Opaque,
        "a filter over visible runs",
    ),
    r(
        "switchyard.approval.v1.ClaimRequest.run_id",
        Visible,
        "approval worker_check",
    ),
    r(
        "switchyard.approval.v1.ClaimRequest.worker_id",
        Opaque,
        "the claimant's own handle (key charset)",
    ),
    r(
        "switchyard.approval.v1.RenewClaimRequest.run_id",
        Visible,
        "approval worker_check",
    ),
    r(
        "switchyard.approval.v1.RenewClaimRequest.worker_id",
        Opaque,
        "must equal the claim's holder",
    ),
    r(
        "switchyard.approval.v1.CompleteRequest.run_id",
        Visible,
        "approval worker_check",
    ),
    r(
        "switchyard.approval.v1.CompleteRequest.worker_id",
        Opaque,
        "must equal the claim's holder",
    ),
    r(
        "switchyard.approval.v1.FailRequest.run_id",
        Visible,
        "approval worker_check",
    ),
    r(
        "switchyard.approval.v1.FailRequest.worker_id",
        Opaque,
        "must equal the claim's holder",
    ),
    r(
        "switchyard.approval.v1.ListAuditRequest.run_id",
        Visible,
        "approval check_visible",
    ),
    r(
        "switchyard.approval.v1.VerifyAuditRequest.run_id",
        Visible,
        "approval check_visible",
    ),
    r(
        "switchyard.approval.v1.ExportPromptBundleRequest.run_id",
        Visible,
        "approval check_visible",
    ),
    r(
        "switchyard.approval.v1.ImportManualResultRequest.run_id",
        Visible,
        "approval check_visible",
    ),
    r(
        "switchyard.approval.v1.ListRunArtifactsRequest.run_id",
        Visible,
        "approval check_visible",
    ),
    r(
        "switchyard.approval.v1.GetRunArtifactRequest.run_id",
        Visible,
        "approval check_visible",
    ),
    r(
        "switchyard.approval.v1.GetReceiptRequest.run_id",
        Visible,
        "approval check_visible (e2e budget_pause: another tenant's approver gets RUN_NOT_FOUND)",
    ),
    r(
        "switchyard.approval.v1.WatchRequest.run_id",
        Visible,
        "approval watch_stream (get, then visibility per record)",
    ),
    // --- auth ---
    r(
        "switchyard.auth.v1.RevokeKeyRequest.key_id",
        Visible,
        "auth: keys of the caller's tenant (KEY_NOT_FOUND otherwise)",
    ),
    // --- common ---
    r(
        "switchyard.common.v1.CorrelationContext.correlation_id",
        Opaque,
        "tracing only",
    ),
    r(
        "switchyard.common.v1.CorrelationContext.job_id",
        Opaque,
        "journal context of a spend; the budget, not this, is authorized",
    ),
    r(
        "switchyard.common.v1.CorrelationContext.task_id",
        Opaque,
        "as CorrelationContext.job_id",
    ),
    // --- executor ---
    r(
        "switchyard.executor.v1.SubmitJobRequest.files",
        PlainName,
        "executor spec::check_files + sandbox::scratch::ScratchRoot::prepare",
    ),
    r(
        "switchyard.executor.v1.JobSpec.files",
        PlainName,
        "as SubmitJobRequest.files",
    ),
    r(
        "switchyard.executor.v1.JobSpec.job_id",
        NewId,
        "executor spec::validate (object_id: one path segment) + claim_id",
    ),
    r(
        "switchyard.executor.v1.JobSpec.plan_id",
        Opaque,
        "a label (key charset)",
    ),
    r(
        "switchyard.executor.v1.JobSpec.correlation_id",
        Opaque,
        "tracing only",
    ),
    r(
        "switchyard.executor.v1.JobBudget.parent_budget_id",
        Shared,
        "executor admission::may_nest_under",
    ),
    r(
        "switchyard.executor.v1.Delegation.parent_job_id",
        Grant,
        "executor admission::adopt + for_whom (the parent's submitter, or an agent with the parent's invocation grant)",
    ),
    r(
        "switchyard.executor.v1.GetJobRequest.job_id",
        Visible,
        "executor grpc visibility (Jobs::get)",
    ),
    r(
        "switchyard.executor.v1.ListJobsRequest.plan_id",
        Opaque,
        "a filter over visible jobs",
    ),
    r(
        "switchyard.executor.v1.ListJobsRequest.correlation_id",
        Opaque,
        "a filter over visible jobs",
    ),
    r(
        "switchyard.executor.v1.WatchJobRequest.job_id",
        Visible,
        "executor grpc visibility",
    ),
    r(
        "switchyard.executor.v1.CancelJobRequest.job_id",
        Visible,
        "executor grpc visibility (owner or operator)",
    ),
    r(
        "switchyard.executor.v1.GetResultRequest.job_id",
        Visible,
        "executor grpc visibility",
    ),
    r(
        "switchyard.executor.v1.ListArtifactsRequest.job_id",
        Visible,
        "executor grpc visibility",
    ),
    r(
        "switchyard.executor.v1.GetArtifactRequest.job_id",
        Visible,
        "executor grpc visibility",
    ),
    r(
        "switchyard.executor.v1.ExportJournalRequest.job_id",
        Visible,
        "executor grpc visibility (Jobs::get)",
    ),
    r(
        "switchyard.executor.v1.RerunJobRequest.job_id",
        Visible,
        "executor grpc visibility (JobBook::visible)",
    ),
    r(
        "switchyard.executor.v1.RerunJobRequest.new_job_id",
        NewId,
        "becomes the new spec's job_id: executor spec::validate + claim_id, as SubmitJob",
    ),
    r(
        "switchyard.executor.v1.Schedule.schedule_id",
        NewId,
        "executor timetable::check_id, put_absent: a repeat with the same definition is the same schedule, another ALREADY_EXISTS",
    ),
    r(
        "switchyard.executor.v1.ScheduleTick.job_id",
        Platform,
        "server-set (timetable::fire); CreateSchedule ignores recent_ticks",
    ),
    r(
        "switchyard.executor.v1.ScheduleTick.cancelled_job_id",
        Platform,
        "server-set (timetable::fire); CreateSchedule ignores recent_ticks",
    ),
    r(
        "switchyard.executor.v1.GetScheduleRequest.schedule_id",
        Visible,
        "executor timetable visible_schedule (Principal::may_see)",
    ),
    r(
        "switchyard.executor.v1.PauseScheduleRequest.schedule_id",
        Visible,
        "executor timetable visible_schedule (Principal::may_see)",
    ),
    r(
        "switchyard.executor.v1.ResumeScheduleRequest.schedule_id",
        Visible,
        "executor timetable visible_schedule (Principal::may_see)",
    ),
    r(
        "switchyard.executor.v1.DeleteScheduleRequest.schedule_id",
        Visible,
        "executor timetable visible_schedule (Principal::may_see)",
    ),
    r(
        "switchyard.executor.v1.Trigger.trigger_id",
        NewId,
        "executor creator::check_id, put_absent: a repeat with the same definition is the same trigger, another ALREADY_EXISTS",
    ),
    r(
        "switchyard.executor.v1.GetTriggerRequest.trigger_id",
        Visible,
        "executor triggers visible_trigger (Principal::may_see)",
    ),
    r(
        "switchyard.executor.v1.DeleteTriggerRequest.trigger_id",
        Visible,
        "executor triggers visible_trigger (Principal::may_see)",
    ),
    r(
        "switchyard.executor.v1.FireTriggerRequest.trigger_id",
        Visible,
        "executor triggers fire_trigger: the creator and the senders it names (same tenant); anyone else NOT_FOUND",
    ),
    r(
        "switchyard.executor.v1.FireTriggerRequest.event_id",
        Opaque,
        "the source's own id of the event: hashed into the job id (triggers::job_id_of), never resolved",
    ),
    r(
        "switchyard.executor.v1.RetryDeliveryRequest.delivery_id",
        Visible,
        "executor notify retry_delivery (Principal::sees_tenant)",
    ),
    r(
        "switchyard.executor.v1.ExplainJobRequest.job_id",
        Visible,
        "executor grpc visibility (Jobs::get)",
    ),
    r(
        "switchyard.executor.v1.VerifyJournalsRequest.job_id",
        Visible,
        "executor grpc visibility, then the caller's tenant scope",
    ),
    r(
        "switchyard.executor.v1.RetryDeadLetterRequest.job_id",
        Visible,
        "executor grpc visibility",
    ),
    r(
        "switchyard.executor.v1.DeleteDeadLetterRequest.job_id",
        Visible,
        "executor grpc visibility",
    ),
    r(
        "switchyard.executor.v1.SendInputRequest.job_id",
        Visible,
        "executor input::send_input (visible, or a tenant member the input task names; else NOT_FOUND)",
    ),
    r(
        "switchyard.executor.v1.SendInputRequest.task_id",
        Visible,
        "executor input::send_input: a task of that job waiting for input",
    ),
    r(
        "switchyard.executor.v1.ListInputRequestsRequest.job_id",
        Opaque,
        "a filter over the requests the caller may answer",
    ),
    r(
        "switchyard.executor.v1.SendMessageRequest.job_id",
        Visible,
        "executor conversation::send_message (visible, or a tenant member the conversation names; else NOT_FOUND)",
    ),
    r(
        "switchyard.executor.v1.SendMessageRequest.task_id",
        Visible,
        "executor conversation::send_message: a conversation task of that job",
    ),
    r(
        "switchyard.executor.v1.ListMessagesRequest.job_id",
        Visible,
        "executor conversation::list_messages (visible, or a participant; else NOT_FOUND)",
    ),
    r(
        "switchyard.executor.v1.ListMessagesRequest.task_id",
        Visible,
        "executor conversation::list_messages: a conversation task of that job",
    ),
    r(
        "switchyard.executor.v1.TaskRef.job_id",
        Visible,
        "executor queue: the lease's job, held by this worker",
    ),
    r(
        "switchyard.executor.v1.TaskRef.task_id",
        Visible,
        "executor queue: the leased task",
    ),
    r(
        "switchyard.executor.v1.FetchRequest.worker_id",
        Opaque,
        "the worker's own handle (key charset); leases are fenced by it",
    ),
    r(
        "switchyard.executor.v1.AckRequest.worker_id",
        Opaque,
        "must equal the lease's holder",
    ),
    r(
        "switchyard.executor.v1.NackRequest.worker_id",
        Opaque,
        "must equal the lease's holder",
    ),
    r(
        "switchyard.executor.v1.HeartbeatRequest.worker_id",
        Opaque,
        "the worker's own leases only",
    ),
    r(
        "switchyard.executor.v1.SetWorkerStateRequest.worker_id",
        Opaque,
        "operators only (permission table)",
    ),
    // --- ledger ---
    r(
        "switchyard.ledger.v1.CreateBudgetRequest.budget_id",
        NewId,
        "ledger create_budget_in (key charset, same settings or BUDGET_EXISTS)",
    ),
    r(
        "switchyard.ledger.v1.CreateBudgetRequest.parent_id",
        Visible,
        "ledger: a parent of the caller's tenant (budget.manage)",
    ),
    r(
        "switchyard.ledger.v1.GetBudgetRequest.budget_id",
        Visible,
        "ledger visible",
    ),
    r(
        "switchyard.ledger.v1.ListBudgetsRequest.parent_id",
        Visible,
        "ledger: a filter over the tenant's budgets",
    ),
    r(
        "switchyard.ledger.v1.UpdateLimitsRequest.budget_id",
        Visible,
        "ledger visible (budget.manage)",
    ),
    r(
        "switchyard.ledger.v1.CloseBudgetRequest.budget_id",
        Visible,
        "ledger visible (budget.manage)",
    ),
    r(
        "switchyard.ledger.v1.ReserveRequest.budget_id",
        Grant,
        "ledger visible + within_grant",
    ),
    r(
        "switchyard.ledger.v1.ReserveRequest.hold_id",
        Grant,
        "ledger visible_reservation (and the desk: a hold on the budget reserved on) + within_grant",
    ),
    r(
        "switchyard.ledger.v1.CommitRequest.reservation_id",
        Grant,
        "ledger visible_reservation + within_grant",
    ),
    r(
        "switchyard.ledger.v1.ReleaseRequest.reservation_id",
        Grant,
        "ledger visible_reservation + within_grant",
    ),
    r(
        "switchyard.ledger.v1.Entry.entry_id",
        Opaque,
        "the journal's own record id, set by the ledger",
    ),
    r(
        "switchyard.ledger.v1.Entry.budget_id",
        Platform,
        "set by the ledger from the reservation",
    ),
    r(
        "switchyard.ledger.v1.Entry.reservation_id",
        Platform,
        "set by the ledger from the commit",
    ),
    r(
        "switchyard.ledger.v1.Entry.subtask_id",
        Opaque,
        "seed 002's cost-ledger label",
    ),
    r(
        "switchyard.ledger.v1.Entry.agent_id",
        Opaque,
        "seed 002's cost-ledger label",
    ),
    r(
        "switchyard.ledger.v1.ListEntriesRequest.budget_id",
        Visible,
        "ledger visible",
    ),
    r(
        "switchyard.ledger.v1.ListEntriesRequest.job_id",
        Opaque,
        "a filter over visible entries",
    ),
    r(
        "switchyard.ledger.v1.ListEntriesRequest.correlation_id",
        Opaque,
        "a filter over visible entries",
    ),
    r(
        "switchyard.ledger.v1.ReportRequest.budget_id",
        Visible,
        "ledger report (NOT_FOUND unless in the caller's tenant)",
    ),
    r(
        "switchyard.ledger.v1.VerifyJournalRequest.budget_id",
        Visible,
        "ledger visible, then the caller's tenant scope",
    ),
    r(
        "switchyard.ledger.v1.WatchRequest.budget_id",
        Visible,
        "ledger visible",
    ),
    // --- registry ---
    r(
        "switchyard.registry.v1.AgentSpec.endpoint",
        Egress,
        "registry reachable (ranges) + core::validate::endpoint",
    ),
    r(
        "switchyard.registry.v1.A2aBinding.card_url",
        Platform,
        "set by the registry from RegisterA2aAgentRequest.card_url",
    ),
    r(
        "switchyard.registry.v1.Tool.endpoint",
        Egress,
        "registry validate::tool (http(s) URL)",
    ),
    r(
        "switchyard.registry.v1.McpHttp.url",
        Egress,
        "registry mcp Hub::check (egress::check, allowed_urls, secrets' urls) + reachable",
    ),
    r(
        "switchyard.registry.v1.RegisterA2aAgentRequest.card_url",
        Egress,
        "registry a2a allows (egress::check) + reachable; redirects not followed",
    ),
    r(
        "switchyard.registry.v1.CallMcpToolRequest.call_id",
        Opaque,
        "the caller's own handle for progress",
    ),
    r(
        "switchyard.registry.v1.HeartbeatRequest.agent_id",
        Visible,
        "registry heartbeat (the tenant's agents; may_change on re-registration)",
    ),
    r(
        "switchyard.registry.v1.DeregisterAgentRequest.agent_id",
        Visible,
        "registry may_change (owner or operator)",
    ),
    r(
        "switchyard.registry.v1.GetAgentRequest.agent_id",
        Visible,
        "registry sees",
    ),
    r(
        "switchyard.registry.v1.ReportOutcomeRequest.agent_id",
        Visible,
        "registry report_outcome_impl (services, or the agent's own registrant)",
    ),
];

/// The declaration of `field` (`package.Message.field`).
pub fn reference(field: &str) -> Option<&'static Reference> {
    REFERENCES.iter().find(|r| r.field == field)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use prost::Message as _;
    use prost_types::field_descriptor_proto::Type;

    use super::*;

    fn looks_like_a_reference(name: &str) -> bool {
        name.ends_with("_id")
            || name.ends_with("_ids")
            || name.ends_with("_url")
            || name.ends_with("_urls")
            || name == "url"
            || name == "endpoint"
            || name.starts_with("parent")
            || name == "approved_under"
            || name == "files"
    }

    /// Every reference-like field of every message reachable from an RPC's
    /// input, as `package.Message.field` (nested messages by their own
    /// name, as in `REFERENCES`).
    fn request_references() -> BTreeSet<String> {
        let fds = prost_types::FileDescriptorSet::decode(switchyard_proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set decodes");
        let mut messages: HashMap<String, &prost_types::DescriptorProto> = HashMap::new();
        fn index<'a>(
            prefix: &str,
            ms: &'a [prost_types::DescriptorProto],
            out: &mut HashMap<String, &'a prost_types::DescriptorProto>,
        ) {
            for m in ms {
                let name = format!("{prefix}.{}", m.name());
                index(&name, &m.nested_type, out);
                out.insert(name, m);
            }
        }
        let mut roots = Vec::new();
        for f in &fds.file {
            index(&format!(".{}", f.package()), &f.message_type, &mut messages);
            for s in &f.service {
                roots.extend(s.method.iter().map(|m| m.input_type().to_owned()));
            }
        }
        let mut seen = BTreeSet::new();
        let mut found = BTreeSet::new();
        while let Some(t) = roots.pop() {
            if !t.starts_with(".switchyard.") || !seen.insert(t.clone()) {
                continue;
            }
            let Some(m) = messages.get(&t) else { continue };
            // Declared by package and the message's own name.
            let pkg_and_name = {
                let parts: Vec<&str> = t.trim_start_matches('.').split('.').collect();
                format!("{}.{}", parts[..3].join("."), parts[parts.len() - 1])
            };
            for f in &m.field {
                if looks_like_a_reference(f.name()) {
                    found.insert(format!("{pkg_and_name}.{}", f.name()));
                }
                if f.r#type() == Type::Message {
                    roots.push(f.type_name().to_owned());
                }
            }
        }
        found
    }

    #[test]
    fn every_reference_field_a_request_carries_is_declared_with_its_rule() {
        let found = request_references();
        let undeclared: Vec<&String> = found.iter().filter(|f| reference(f).is_none()).collect();
        assert!(
            undeclared.is_empty(),
            "declare these in auth::references::REFERENCES with the rule that authorizes them: {undeclared:#?}"
        );
        // And nothing declared that no request carries any more.
        let stale: Vec<&str> = REFERENCES
            .iter()
            .map(|r| r.field)
            .filter(|f| !found.contains(*f))
            .collect();
        assert!(
            stale.is_empty(),
            "declared but not in any request: {stale:#?}"
        );
        let mut names = BTreeSet::new();
        assert!(
            REFERENCES.iter().all(|r| names.insert(r.field)),
            "declared twice"
        );
    }
}
