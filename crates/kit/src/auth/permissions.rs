//! The one authorization table: every RPC → the permission it needs, and
//! every role → the permissions it grants. Default deny: a method not listed
//! here is refused, and a test walks the descriptor set so a new RPC cannot
//! ship unguarded.
//!
//! Object-level rules (tenant, ownership, separation of duties) sit on top,
//! in the handlers, reading the same [`super::Principal`].

use super::Role;

/// What a caller may be allowed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Submit or validate a job (a submitter sees only its own jobs).
    JobSubmit,
    /// Read jobs, their events and results.
    JobRead,
    /// Cancel a job.
    JobCancel,
    /// Answer a task waiting for input (SendInput) and list such requests,
    /// and talk in conversations (SendMessage, ListMessages); the task
    /// itself says who of those holding it may answer or take part.
    JobAnswer,
    /// Propose an approval run (services, for their users).
    RunPropose,
    /// Read runs.
    RunRead,
    /// Approve or reject a run: its own permission; admin does not imply it.
    RunDecide,
    /// Cancel a run.
    RunCancel,
    /// Claim, renew, complete or fail a run (executor workers).
    RunWork,
    /// Read the audit log.
    AuditRead,
    /// Manual mode: export a prompt bundle, import a result.
    RunManual,
    /// Read budgets, entries and estimates.
    BudgetRead,
    /// Create, change and close budgets.
    BudgetManage,
    /// Reserve, commit and release on a budget.
    LedgerSpend,
    /// Report that a provider refused for rate (`CoolDown`): every
    /// tenant's calls through the key wait, so the service token's holder
    /// only.
    RateReport,
    /// Store, remove and list the deployment's stored policies: the
    /// service token's holder only (a policy decides for every tenant).
    PolicyManage,
    /// Read agents and tools.
    AgentRead,
    /// Register, heartbeat and deregister agents (agents: only their own).
    AgentRegister,
    /// Register and deregister tools (agents: only their own).
    ToolRegister,
    /// Report a call's outcome (feeds trust and latency).
    OutcomeReport,
    /// Ask the router for candidates.
    Route,
    /// Follow the registry's change stream (routers).
    RegistryWatch,
    /// Create, list and revoke API keys of the tenant.
    KeyManage,
    /// Follow the key verification set (other Switchyard servers).
    KeyWatch,
    /// Call an agent or tool endpoint hosted by a Switchyard server.
    AgentInvoke,
    /// Act on behalf of another principal (`x-switchyard-on-behalf-of`).
    Impersonate,
    /// The audited override: approve without approver, separation of duties
    /// or second approver (admins only).
    RunBreakGlass,
    /// Remove finished jobs past an age (admins: their tenant's).
    JobPrune,
    /// Scrape `/metrics`.
    MetricsRead,
    /// Fetch, ack, nack and heartbeat queue tasks (pull workers).
    TaskWork,
    /// Set a pull worker's state (drain or stop it).
    WorkerManage,
    /// Retry or delete dead-lettered jobs.
    DeadLetterManage,
    /// Run a registered MCP tool through the registry (`CallMcpTool`):
    /// the executor and agent hosts, after their own allowlist and schema
    /// checks. People run tools only inside jobs.
    ToolCall,
}

impl Permission {
    /// Every permission.
    pub const ALL: [Permission; 33] = [
        Permission::JobSubmit,
        Permission::JobRead,
        Permission::JobCancel,
        Permission::JobAnswer,
        Permission::RunPropose,
        Permission::RunRead,
        Permission::RunDecide,
        Permission::RunCancel,
        Permission::RunWork,
        Permission::AuditRead,
        Permission::RunManual,
        Permission::BudgetRead,
        Permission::BudgetManage,
        Permission::LedgerSpend,
        Permission::RateReport,
        Permission::PolicyManage,
        Permission::AgentRead,
        Permission::AgentRegister,
        Permission::ToolRegister,
        Permission::OutcomeReport,
        Permission::Route,
        Permission::RegistryWatch,
        Permission::KeyManage,
        Permission::KeyWatch,
        Permission::AgentInvoke,
        Permission::Impersonate,
        Permission::RunBreakGlass,
        Permission::JobPrune,
        Permission::MetricsRead,
        Permission::TaskWork,
        Permission::WorkerManage,
        Permission::DeadLetterManage,
        Permission::ToolCall,
    ];

    /// The name in errors (ErrorInfo metadata `permission`) and docs.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::JobSubmit => "job.submit",
            Permission::JobRead => "job.read",
            Permission::JobCancel => "job.cancel",
            Permission::JobAnswer => "job.answer",
            Permission::RunPropose => "run.propose",
            Permission::RunRead => "run.read",
            Permission::RunDecide => "run.decide",
            Permission::RunCancel => "run.cancel",
            Permission::RunWork => "run.work",
            Permission::AuditRead => "audit.read",
            Permission::RunManual => "run.manual",
            Permission::BudgetRead => "budget.read",
            Permission::BudgetManage => "budget.manage",
            Permission::LedgerSpend => "ledger.spend",
            Permission::RateReport => "ledger.rate_report",
            Permission::PolicyManage => "policy.manage",
            Permission::AgentRead => "agent.read",
            Permission::AgentRegister => "agent.register",
            Permission::ToolRegister => "tool.register",
            Permission::OutcomeReport => "outcome.report",
            Permission::Route => "route",
            Permission::RegistryWatch => "registry.watch",
            Permission::KeyManage => "key.manage",
            Permission::KeyWatch => "key.watch",
            Permission::AgentInvoke => "agent.invoke",
            Permission::Impersonate => "impersonate",
            Permission::RunBreakGlass => "run.break_glass",
            Permission::JobPrune => "job.prune",
            Permission::MetricsRead => "metrics.read",
            Permission::TaskWork => "task.work",
            Permission::WorkerManage => "worker.manage",
            Permission::DeadLetterManage => "dead_letter.manage",
            Permission::ToolCall => "tool.call",
        }
    }
}

/// What a method needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, with or without a credential (health, reflection).
    Open,
    /// Any authenticated principal.
    Authenticated,
    /// A principal holding the permission.
    Needs(Permission),
    /// Not in the table: refused.
    Unknown,
}

/// The access rule of a gRPC method path (`/pkg.Service/Method`).
pub fn access(path: &str) -> Access {
    use Permission as P;
    let path = path.strip_prefix('/').unwrap_or(path);
    // The one HTTP route beside the gRPC services.
    if path == "metrics" {
        return Access::Needs(P::MetricsRead);
    }
    let Some((service, method)) = path.split_once('/') else {
        return Access::Unknown;
    };
    let needs = Access::Needs;
    match (service, method) {
        ("grpc.health.v1.Health", _)
        | ("grpc.reflection.v1.ServerReflection", _)
        | ("grpc.reflection.v1alpha.ServerReflection", _) => Access::Open,

        ("switchyard.auth.v1.AuthService", m) => match m {
            "CreateKey" | "ListKeys" | "RevokeKey" => needs(P::KeyManage),
            "WhoAmI" | "StartSession" | "EndSession" => Access::Authenticated,
            "WatchKeys" => needs(P::KeyWatch),
            _ => Access::Unknown,
        },
        ("switchyard.registry.v1.RegistryService", m) => match m {
            "RegisterAgent" | "Heartbeat" | "DeregisterAgent" | "RegisterA2aAgent" => {
                needs(P::AgentRegister)
            }
            "GetAgent"
            | "ListAgents"
            | "FindByCapability"
            | "ListTools"
            | "GetCapabilitiesSummary" => needs(P::AgentRead),
            "RegisterTool" | "DeregisterTool" | "RegisterMcpServer" | "DeregisterMcpServer" => {
                needs(P::ToolRegister)
            }
            "ListMcpServers" => needs(P::AgentRead),
            "CallMcpTool" => needs(P::ToolCall),
            "ReportOutcome" => needs(P::OutcomeReport),
            "Watch" => needs(P::RegistryWatch),
            _ => Access::Unknown,
        },
        ("switchyard.router.v1.RouterService", "Route") => needs(P::Route),
        ("switchyard.ledger.v1.LedgerService", m) => match m {
            "CreateBudget" | "UpdateLimits" | "CloseBudget" => needs(P::BudgetManage),
            "GetBudget" | "ListBudgets" | "ListEntries" | "EstimateCost" | "Watch" | "Report"
            | "ListLimits" => needs(P::BudgetRead),
            "Reserve" | "Commit" | "Release" => needs(P::LedgerSpend),
            "CoolDown" => needs(P::RateReport),
            "VerifyJournal" => needs(P::AuditRead),
            _ => Access::Unknown,
        },
        ("switchyard.approval.v1.ApprovalService", m) => match m {
            "Propose" => needs(P::RunPropose),
            "Approve" | "Reject" => needs(P::RunDecide),
            "BreakGlassApprove" => needs(P::RunBreakGlass),
            "Cancel" => needs(P::RunCancel),
            "GetRun" | "ListRuns" | "Watch" | "ListRunArtifacts" | "GetRunArtifact"
            | "GetReceipt" => needs(P::RunRead),
            "Claim" | "RenewClaim" | "Complete" | "Fail" => needs(P::RunWork),
            "ListAudit" | "VerifyAudit" => needs(P::AuditRead),
            "ExportPromptBundle" | "ImportManualResult" => needs(P::RunManual),
            "PutPolicy" | "DeletePolicy" | "ListPolicies" => needs(P::PolicyManage),
            _ => Access::Unknown,
        },
        ("switchyard.executor.v1.JobService", m) => match m {
            "SubmitJob" | "ValidateJob" | "RerunJob" => needs(P::JobSubmit),
            "GetJob" | "ListJobs" | "WatchJob" | "GetResult" | "ListArtifacts" | "GetArtifact" => {
                needs(P::JobRead)
            }
            "CancelJob" => needs(P::JobCancel),
            "SendInput" | "ListInputRequests" | "SendMessage" | "ListMessages" => {
                needs(P::JobAnswer)
            }
            "PruneJobs" => needs(P::JobPrune),
            "VerifyJournals" => needs(P::AuditRead),
            "ExplainJob" => needs(P::JobRead),
            "ExportJournal" => needs(P::AuditRead),
            "RetryDeadLetter" | "DeleteDeadLetter" => needs(P::DeadLetterManage),
            _ => Access::Unknown,
        },
        ("switchyard.executor.v1.ScheduleService", m) => match m {
            "CreateSchedule" => needs(P::JobSubmit),
            // Stopping or starting a timetable is managed like cancelling
            // jobs: the creator, and operators and admins of its tenant.
            "PauseSchedule" | "ResumeSchedule" | "DeleteSchedule" => needs(P::JobCancel),
            "GetSchedule" | "ListSchedules" => needs(P::JobRead),
            _ => Access::Unknown,
        },
        ("switchyard.executor.v1.TriggerService", m) => match m {
            // Delivering an event submits a job (as the trigger's creator,
            // for its creator and the senders it names).
            "CreateTrigger" | "FireTrigger" => needs(P::JobSubmit),
            "GetTrigger" | "ListTriggers" => needs(P::JobRead),
            "DeleteTrigger" => needs(P::JobCancel),
            _ => Access::Unknown,
        },
        // The dead-letter view of webhook deliveries, like jobs' own.
        ("switchyard.executor.v1.NotificationService", "ListDeliveries" | "RetryDelivery") => {
            needs(P::DeadLetterManage)
        }
        ("switchyard.executor.v1.WorkerService", m) => match m {
            "Fetch" | "Ack" | "Nack" | "Heartbeat" => needs(P::TaskWork),
            "SetWorkerState" => needs(P::WorkerManage),
            _ => Access::Unknown,
        },
        ("switchyard.agent.v1.AgentService", "Describe" | "Invoke")
        | ("switchyard.agent.v1.ToolService", "CallTool") => needs(P::AgentInvoke),
        _ => Access::Unknown,
    }
}

/// Every gateway HTTP route — its method, its route template as the router
/// and the OpenAPI document name it (`/aitp/tasks/{task_id}`) — and what it
/// needs. Tests check this list against both the router and the document.
pub const HTTP_ROUTES: &[(&str, &str, Access)] = {
    use Permission as P;
    &[
        // What the API is and whether it is up: open, like reflection and
        // health on the gRPC port.
        ("GET", "/openapi.json", Access::Open),
        ("GET", "/healthz", Access::Open),
        // This process's Prometheus metrics, as on every gRPC port.
        ("GET", "/metrics", Access::Needs(P::MetricsRead)),
        ("POST", "/aitp/tasks", Access::Needs(P::JobSubmit)),
        ("GET", "/aitp/tasks/{task_id}", Access::Needs(P::JobRead)),
        (
            "DELETE",
            "/aitp/tasks/{task_id}",
            Access::Needs(P::JobCancel),
        ),
        (
            "GET",
            "/aitp/tasks/{task_id}/result",
            Access::Needs(P::JobRead),
        ),
        (
            "GET",
            "/aitp/tasks/{task_id}/events",
            Access::Needs(P::JobRead),
        ),
        (
            "GET",
            "/aitp/tasks/{task_id}/input",
            Access::Needs(P::JobAnswer),
        ),
        (
            "POST",
            "/aitp/tasks/{task_id}/input",
            Access::Needs(P::JobAnswer),
        ),
        (
            "GET",
            "/aitp/tasks/{task_id}/messages",
            Access::Needs(P::JobAnswer),
        ),
        (
            "POST",
            "/aitp/tasks/{task_id}/messages",
            Access::Needs(P::JobAnswer),
        ),
        // The A2A door: its card is public (what it offers, not what it
        // holds); each JSON-RPC method is checked by the executor as the
        // caller (SendMessage as SendInput or SendMessage, GetTask as
        // GetJob, CancelTask as CancelJob).
        ("GET", "/.well-known/agent-card.json", Access::Open),
        // The public key the card is signed with (when it is).
        ("GET", "/.well-known/jwks.json", Access::Open),
        ("POST", "/a2a", Access::Authenticated),
        // Its HTTP+JSON binding: the same three operations, checked alike.
        ("POST", "/a2a/message:send", Access::Authenticated),
        ("GET", "/a2a/tasks/{task_id}", Access::Authenticated),
        ("POST", "/a2a/tasks/{task_id}", Access::Authenticated),
        // The OJS binding: producers (submitters), workers (agents and
        // anyone with task.work), operators.
        // A webhook: the sender's key must be the trigger's creator's or
        // one of the senders it names (the executor checks).
        (
            "POST",
            "/v1/triggers/{trigger_id}/events",
            Access::Needs(P::JobSubmit),
        ),
        ("GET", "/ojs/manifest", Access::Open),
        ("GET", "/ojs/v1/health", Access::Open),
        ("POST", "/ojs/v1/jobs", Access::Needs(P::JobSubmit)),
        ("POST", "/ojs/v1/jobs/batch", Access::Needs(P::JobSubmit)),
        ("GET", "/ojs/v1/jobs/{id}", Access::Needs(P::JobRead)),
        ("DELETE", "/ojs/v1/jobs/{id}", Access::Needs(P::JobCancel)),
        // Activating a pending job approves its run.
        (
            "POST",
            "/ojs/v1/jobs/{id}/activate",
            Access::Needs(P::RunDecide),
        ),
        ("POST", "/ojs/v1/workers/fetch", Access::Needs(P::TaskWork)),
        ("POST", "/ojs/v1/workers/ack", Access::Needs(P::TaskWork)),
        ("POST", "/ojs/v1/workers/nack", Access::Needs(P::TaskWork)),
        (
            "POST",
            "/ojs/v1/workers/heartbeat",
            Access::Needs(P::TaskWork),
        ),
        ("GET", "/ojs/v1/events", Access::Needs(P::JobRead)),
        ("GET", "/ojs/v1/dead-letter", Access::Needs(P::JobRead)),
        (
            "POST",
            "/ojs/v1/dead-letter/{id}/retry",
            Access::Needs(P::DeadLetterManage),
        ),
        (
            "DELETE",
            "/ojs/v1/dead-letter/{id}",
            Access::Needs(P::DeadLetterManage),
        ),
        // The web console (`/ui/`): the same permissions as the calls each
        // page makes. Signing in and the embedded assets are open (the form
        // authenticates what is pasted); every other page needs a session.
        ("GET", "/ui", Access::Open),
        // The door's root sends a person to the console.
        ("GET", "/", Access::Open),
        ("GET", "/ui/sign-in", Access::Open),
        ("POST", "/ui/sign-in", Access::Open),
        // Signing in through the identity provider: the callback is bound
        // to the flow's cookie and authenticates the token it gets.
        ("GET", "/ui/sign-in/oidc", Access::Open),
        ("GET", "/ui/oidc/callback", Access::Open),
        ("GET", "/ui/assets/{file}", Access::Open),
        ("POST", "/ui/sign-out", Access::Authenticated),
        ("GET", "/ui/", Access::Needs(P::RunRead)),
        // `{decision}`: approve or reject.
        (
            "POST",
            "/ui/runs/{run_id}/{decision}",
            Access::Needs(P::RunDecide),
        ),
        ("GET", "/ui/jobs", Access::Needs(P::JobRead)),
        ("GET", "/ui/jobs/{job_id}", Access::Needs(P::JobRead)),
        ("GET", "/ui/jobs/{job_id}/events", Access::Needs(P::JobRead)),
        (
            "POST",
            "/ui/jobs/{job_id}/cancel",
            Access::Needs(P::JobCancel),
        ),
        (
            "POST",
            "/ui/jobs/{job_id}/input",
            Access::Needs(P::JobAnswer),
        ),
        (
            "POST",
            "/ui/jobs/{job_id}/rerun",
            Access::Needs(P::JobSubmit),
        ),
        ("GET", "/ui/jobs/{job_id}/chat", Access::Needs(P::JobAnswer)),
        (
            "POST",
            "/ui/jobs/{job_id}/chat",
            Access::Needs(P::JobAnswer),
        ),
        ("GET", "/ui/submit", Access::Needs(P::JobSubmit)),
        ("POST", "/ui/submit", Access::Needs(P::JobSubmit)),
        ("GET", "/ui/budgets", Access::Needs(P::BudgetRead)),
        ("GET", "/ui/limits", Access::Needs(P::BudgetRead)),
        ("GET", "/ui/agents", Access::Needs(P::AgentRead)),
        ("GET", "/ui/schedules", Access::Needs(P::JobRead)),
        (
            "GET",
            "/ui/notifications",
            Access::Needs(P::DeadLetterManage),
        ),
        (
            "POST",
            "/ui/notifications/retry",
            Access::Needs(P::DeadLetterManage),
        ),
        (
            "POST",
            "/ui/schedules/{schedule_id}/{action}",
            Access::Needs(P::JobCancel),
        ),
        // What keeps the lists live: each page's list asked as the person
        // (so the same permissions apply to what it says), the inbox
        // count only to one who may read runs.
        ("GET", "/ui/live", Access::Authenticated),
        // Switchyard as an MCP server: any principal may open a session;
        // each tool call then needs what its gRPC call needs.
        ("POST", "/mcp", Access::Authenticated),
        ("GET", "/mcp", Access::Authenticated),
        ("DELETE", "/mcp", Access::Authenticated),
    ]
};

/// The access rule of a gateway HTTP route ([`HTTP_ROUTES`]). Same
/// default deny as [`access`]: a route not listed is refused for everyone.
pub fn http_access(method: &str, route: &str) -> Access {
    HTTP_ROUTES
        .iter()
        .find(|(m, r, _)| *m == method && *r == route)
        .map_or(Access::Unknown, |(_, _, a)| *a)
}

/// The access rule of a RESP command (its verb, upper case). The
/// connection handshake is open (a client must be able to authenticate);
/// everything else needs what the same gRPC call needs. Not listed:
/// refused, as an unknown command.
pub fn resp_access(verb: &str) -> Access {
    use Permission as P;
    let needs = Access::Needs;
    match verb {
        "PING" | "HELLO" | "AUTH" | "QUIT" => Access::Open,
        // Connection bookkeeping client libraries send after connecting.
        "CLIENT" => Access::Authenticated,
        "PLAN.SUBMIT" | "JOB.SUBMIT" => needs(P::JobSubmit),
        "JOB.STATUS" | "JOB.RESULT" => needs(P::JobRead),
        "JOB.CANCEL" => needs(P::JobCancel),
        _ => Access::Unknown,
    }
}

/// Whether `role` grants `perm`.
pub fn grants(role: Role, perm: Permission) -> bool {
    use Permission::*;
    match role {
        // Own jobs and runs only: the services check ownership. Proposing a
        // run (AgentRunSpec) is like submitting: someone else approves it.
        // Reading agents and routes previews where a job would go.
        // Answering an input task: its own jobs' by default, others' where
        // the task names it.
        Role::Submitter => matches!(
            perm,
            JobSubmit
                | JobRead
                | JobCancel
                | JobAnswer
                | RunPropose
                | RunRead
                | RunCancel
                | AgentRead
                | Route
        ),
        // Approvers see what they are asked to approve: the jobs, runs, audit
        // and budgets of their tenant, and where the run's tasks would be
        // routed (the console's inbox shows it beside each run).
        Role::Approver => matches!(
            perm,
            RunDecide
                | RunRead
                | AuditRead
                | RunManual
                | JobRead
                | JobAnswer
                | BudgetRead
                | AgentRead
                | Route
        ),
        Role::Operator => matches!(
            perm,
            JobRead
                | JobCancel
                | JobAnswer
                | RunRead
                | RunCancel
                | AuditRead
                | BudgetRead
                | AgentRead
                | AgentRegister
                | ToolRegister
                | Route
                | MetricsRead
                | WorkerManage
                | DeadLetterManage
        ),
        // Its own agents and tools only (the registry checks ownership);
        // spends on the job budgets it is handed; delegates child jobs;
        // runs the MCP tools its declarative agents list.
        Role::Agent => matches!(
            perm,
            ToolCall
                | AgentRegister
                | ToolRegister
                | OutcomeReport
                | AgentRead
                | LedgerSpend
                | BudgetRead
                | JobSubmit
                | JobRead
                | TaskWork
        ),
        Role::Viewer => matches!(
            perm,
            JobRead | RunRead | AuditRead | BudgetRead | AgentRead | Route
        ),
        // Everything an operator may, plus budgets, keys and the audited
        // break-glass override; never RunDecide.
        Role::Admin => {
            grants(Role::Operator, perm)
                || matches!(perm, BudgetManage | KeyManage | RunBreakGlass | JobPrune)
        }
        // Switchyard's own services and the cluster operator holding the
        // service token (who makes each tenant's first admin key). Never
        // RunDecide: a service cannot approve spend.
        Role::Service => !matches!(perm, RunDecide | RunManual | Impersonate | RunBreakGlass),
        // The right to act for a user, checked by the authenticator.
        Role::Impersonate => perm == Impersonate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_admins_may_break_glass() {
        for role in Role::ALL {
            assert_eq!(
                grants(role, Permission::RunBreakGlass),
                role == Role::Admin,
                "{role:?}"
            );
        }
    }

    #[test]
    fn nobody_but_approvers_may_decide_runs() {
        for role in Role::ALL {
            assert_eq!(
                grants(role, Permission::RunDecide),
                role == Role::Approver,
                "{role:?}"
            );
        }
    }

    #[test]
    fn permission_names_are_unique() {
        let names: std::collections::HashSet<_> =
            Permission::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(names.len(), Permission::ALL.len());
    }

    #[test]
    fn gateway_routes_and_resp_verbs_need_what_the_same_grpc_call_needs() {
        let rpc = |m: &str| access(&format!("/switchyard.executor.v1.JobService/{m}"));
        assert_eq!(http_access("POST", "/aitp/tasks"), rpc("SubmitJob"));
        assert_eq!(http_access("GET", "/aitp/tasks/{task_id}"), rpc("GetJob"));
        assert_eq!(
            http_access("GET", "/aitp/tasks/{task_id}/result"),
            rpc("GetResult")
        );
        assert_eq!(
            http_access("GET", "/aitp/tasks/{task_id}/events"),
            rpc("WatchJob")
        );
        assert_eq!(
            http_access("DELETE", "/aitp/tasks/{task_id}"),
            rpc("CancelJob")
        );
        assert_eq!(resp_access("PLAN.SUBMIT"), rpc("SubmitJob"));
        assert_eq!(resp_access("JOB.SUBMIT"), rpc("SubmitJob"));
        assert_eq!(resp_access("JOB.STATUS"), rpc("GetJob"));
        assert_eq!(resp_access("JOB.RESULT"), rpc("GetResult"));
        assert_eq!(resp_access("JOB.CANCEL"), rpc("CancelJob"));
        // Default deny: other methods, routes and verbs.
        assert_eq!(http_access("PUT", "/aitp/tasks/{task_id}"), Access::Unknown);
        assert_eq!(http_access("GET", "/aitp/tasks/x"), Access::Unknown);
        assert_eq!(resp_access("FLUSHALL"), Access::Unknown);
        assert_eq!(
            resp_access("job.submit"),
            Access::Unknown,
            "verbs are matched upper case"
        );
    }

    #[test]
    fn unknown_methods_and_services_are_refused() {
        assert_eq!(
            access("/switchyard.ledger.v1.LedgerService/DropAll"),
            Access::Unknown
        );
        assert_eq!(access("/switchyard.nope.v1.Nope/Get"), Access::Unknown);
        assert_eq!(access("garbage"), Access::Unknown);
        assert_eq!(access("/grpc.health.v1.Health/Check"), Access::Open);
    }
}
