//! `[executor]` configuration: every knob, its default, and the checks that
//! refuse values the executor could not honour.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::command::SandboxMode;
use crate::command::limits::ResourceLimits;
use crate::formats::Limits;
use crate::spec::Rules;

/// `[executor]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutorConfig {
    /// Worker id used to claim approval runs; keep it stable across restarts.
    pub worker_id: String,
    /// The deployment's `[audit]` key for the journal's seals (set from the
    /// top-level section, not configured here).
    #[serde(skip)]
    pub audit: switchyard_kit::chain::AuditConfig,
    /// Registry URL when it runs in another process.
    pub registry_url: Option<String>,
    /// Router URL when it runs in another process.
    pub router_url: Option<String>,
    /// Ledger URL when it runs in another process.
    pub ledger_url: Option<String>,
    /// Approval URL when it runs in another process.
    pub approval_url: Option<String>,
    /// URL at which this process's built-in agents are reachable; empty =
    /// `http://<listen address>`.
    pub advertise_url: String,
    /// Host and register the built-in agents.
    pub builtin_agents: bool,
    /// Most tasks in one job (seed 001's limit).
    pub max_tasks: usize,
    /// Tasks of one job running at once when the job sets no limit.
    pub max_parallel: u32,
    /// Task timeout when a task sets none, seconds (seed 001: 300).
    pub default_timeout_secs: u32,
    /// Wait between SIGTERM and SIGKILL, ms.
    pub kill_grace_ms: u64,
    /// Bytes of stdout and of stderr kept per task.
    pub max_output_bytes: usize,
    /// Bytes of `files` a job may carry.
    pub max_file_bytes: usize,
    /// Commands a task may run (names looked up on `path` once, at start-up).
    /// Tools that can start other programs (awk's `system()`, sed's `e`) are
    /// safe here because the sandbox lets a task execute only its own
    /// binary: such a call fails with EACCES. See docs/sandbox.md.
    pub commands: Vec<String>,
    /// The only PATH commands see and are looked up on.
    pub path: String,
    /// `"on"`: every command task runs in the sandbox (Landlock, seccomp,
    /// no_new_privs, rlimits), and command tasks are refused when the kernel
    /// has no Landlock. `"off"`: they run unconfined as the executor's user
    /// (rlimits only) — logged at start-up and shown on every command task.
    pub sandbox: SandboxMode,
    /// User id command tasks run as when the executor runs as root.
    pub sandbox_uid: u32,
    /// Group id command tasks run as when the executor runs as root.
    pub sandbox_gid: u32,
    /// Paths every command task may read (not write or execute). Keep
    /// secrets out: the default names single files of /etc, not /etc.
    pub sandbox_read_paths: Vec<PathBuf>,
    /// Allowlisted commands that may open network connections (all others
    /// cannot create a socket). No host allowlist: a command here reaches
    /// whatever the executor's host reaches.
    pub network_commands: Vec<String>,
    /// Resource limits of every command task unless it asks for others.
    pub task_limits: ResourceLimits,
    /// The most a task may ask for (0: no cap).
    pub task_limit_caps: ResourceLimits,
    /// Budget that job budgets nest under when the job names none (empty:
    /// job budgets are top-level).
    pub default_parent_budget: String,
    /// Tokens reserved for one agent call (capped by the job's token budget).
    pub agent_max_tokens: u64,
    /// Longest a model call waits for room in a provider rate limit
    /// (`[[ledger.limits]]`) before its task fails with `RATE_LIMITED`
    /// (the task's deadline also ends the wait), ms.
    pub llm_rate_max_wait_ms: u64,
    /// Output tokens assumed for an LLM task without max_tokens.
    pub llm_default_max_tokens: u64,
    /// Most model calls of one LLM task attempt when the task says none.
    pub llm_max_turns: u32,
    /// Timeout of one tool call when the task says none, ms (seed 000
    /// `ext_agent_tool_timeout_ms`).
    pub tool_timeout_ms: u64,
    /// Approval claim lease, seconds (renewed at a third of it).
    pub lease_secs: u32,
    /// On shutdown (SIGTERM), how long running attempts get to end before
    /// what is left is handed back, ms. Meanwhile no attempt starts and no
    /// job is taken on; a job with nothing running is handed back at once
    /// (on PostgreSQL to another replica, on sled to the next start). Keep
    /// it under the orchestrator's grace period minus
    /// `server.drain_timeout_ms`. 0: hand everything back at once.
    pub drain_grace_ms: u64,
    /// How long a pull worker's lease on a queue task lasts without a
    /// heartbeat, ms, when neither the task nor the Fetch says.
    pub queue_visibility_timeout_ms: u64,
    /// Answer a pull worker's heartbeat with `quiet` or `terminate` when a
    /// job it holds says so in its OJS envelope's
    /// `options.metadata.test_directive` (the OJS worker protocol's
    /// directives, as its conformance suite drives them). Only a job of
    /// the worker's own tenant signals, only a worker scoped to that
    /// tenant, and only while it holds the job — a producer reaches no
    /// other tenant's worker and no cross-tenant service worker. On by
    /// default; `false` where producers must not signal workers at all.
    pub queue_test_directives: bool,
    /// How often pending jobs check their approval run, ms.
    pub approval_poll_ms: u64,
    /// How often each replica looks for schedules' due ticks, ms.
    pub schedule_poll_ms: u64,
    /// Webhooks told about approvals needed, jobs ending and budgets
    /// running low (`[executor.notifications]`).
    pub notifications: NotificationsConfig,
    /// DEFER re-check interval when the task gives none, seconds (seed 002: 5 minutes).
    pub defer_interval_secs: u32,
    /// Longest a task may stay deferred when it has no deadline, seconds.
    pub max_defer_secs: u64,
    /// Seed 000's delegation cap.
    pub max_delegation_depth: u32,
    /// Time to live of a delegation chain, seconds: a child job's deadline
    /// is at most this long after the chain's first delegation (and never
    /// after its parent's), so a chain of agent-triggered work ends even
    /// when it never gets deeper. 0: no limit beyond the parents' deadlines.
    pub delegation_ttl_secs: u64,
    /// Organisation recorded on approval runs when the job has no `org` label.
    pub default_org: String,
    /// Cancel a job's running tasks when another fails for good (else they finish).
    pub cancel_running_on_failure: bool,
    /// Where per-job scratch directories live; empty = `<data_dir>/scratch`.
    pub scratch_dir: PathBuf,
    /// Longest pause between calls to a Switchyard service that cannot be
    /// reached (the pauses grow from 50 ms to this), ms. Work waits for
    /// such a service; only its deadline ends the wait.
    pub dependency_retry_max_ms: u64,
    /// How long SubmitJob waits for an unreachable ledger, router or
    /// approval service before accepting the job to wait (`pending`, reason
    /// DEPENDENCY_UNAVAILABLE) and admitting it once they are back, ms.
    pub submit_wait_ms: u64,
    /// Finished jobs (their record, events and outputs) are kept this long
    /// after they finish, seconds; 0 keeps them forever.
    pub retention_secs: u64,
    /// How often finished jobs past their retention are pruned, seconds.
    pub prune_interval_secs: u64,
    /// On PostgreSQL: how long a replica's claim on a job lasts without
    /// renewal, ms. A replica renews its leases every third of this; when
    /// it dies, its jobs are taken over this long after its last renewal
    /// (at once when it shuts down cleanly: it hands them back).
    pub job_lease_ms: u64,
    /// On PostgreSQL: most jobs one replica runs at once. A replica claims
    /// jobs only while it has room and hands back what it accepted beyond
    /// it, so work spreads across replicas.
    pub max_running_jobs: usize,
    /// Most jobs of one tenant running at once, across every replica (0:
    /// no cap): a job holds one of its tenant's slots from its first task
    /// until it ends (a job waiting for approval holds none); one that
    /// finds them all taken waits, with a `job.waiting_for_slot` event.
    pub max_running_jobs_per_tenant: u32,
    /// The same per tenant, overriding it (`[executor.running_jobs_per_tenant]`,
    /// `acme = 4`; 0: no cap for that tenant).
    pub running_jobs_per_tenant: std::collections::BTreeMap<String, u32>,
    /// On PostgreSQL: this replica's name in the job table's `owner` column;
    /// empty = host name, process id and a random suffix (unique per start,
    /// so a restarted replica never mistakes its predecessor's leases for
    /// its own).
    pub replica_id: String,
    /// Per-call approval of risky tools, beyond what jobs and the registry
    /// mark (`[executor.tool_approval]`).
    pub tool_approval: ToolApproval,
    /// A budget-paused job whose extension nobody decides within this many
    /// seconds ends (`BUDGET_EXTENSION_TIMEOUT`): `[executor]
    /// budget_extension_timeout_secs`.
    pub budget_extension_timeout_secs: u64,
    /// Largest artifact a task may produce, bytes.
    pub artifact_max_bytes: usize,
}

/// `[executor.tool_approval]`: which tool calls wait for a person, and for
/// how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolApproval {
    /// Tool names whose every call needs approval, in any job: exact names
    /// or patterns with `*` (e.g. `"github__*"`, `"*__write_file"`,
    /// `"agent_*"`).
    pub tools: Vec<String>,
    /// Every call of an agent offered as a tool (`agent_<id>`) whose
    /// worst-case price is above this needs approval, micro-USD; unset:
    /// no price rule.
    pub above_micro_usd: Option<i64>,
    /// A call nobody decides within this many seconds counts as rejected.
    pub timeout_secs: u64,
}

impl Default for ToolApproval {
    fn default() -> Self {
        ToolApproval {
            tools: Vec::new(),
            above_micro_usd: None,
            timeout_secs: 3600,
        }
    }
}

impl ToolApproval {
    /// Whether the policy names tool `name`.
    pub fn names(&self, name: &str) -> bool {
        self.tools.iter().any(|p| glob(p, name))
    }
}

/// `*` matches any run of characters; everything else matches itself.
fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            worker_id: "executor".into(),
            audit: Default::default(),
            registry_url: None,
            router_url: None,
            ledger_url: None,
            approval_url: None,
            advertise_url: String::new(),
            builtin_agents: true,
            max_tasks: 100,
            max_parallel: 4,
            default_timeout_secs: 300,
            kill_grace_ms: 2000,
            max_output_bytes: 1024 * 1024,
            max_file_bytes: 2 * 1024 * 1024,
            commands: [
                "cat",
                "echo",
                "grep",
                "sort",
                "uniq",
                "wc",
                "head",
                "tail",
                "cut",
                "tr",
                "sed",
                "awk",
                "jq",
                "tac",
                "rev",
                "nl",
                "fold",
                "paste",
                "seq",
                "printf",
                "true",
                "false",
                "sleep",
                "date",
                "base64",
                "sha256sum",
                "md5sum",
                "comm",
                "join",
                "expand",
                "fmt",
            ]
            .map(String::from)
            .to_vec(),
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            sandbox: SandboxMode::On,
            sandbox_uid: 65534,
            sandbox_gid: 65534,
            sandbox_read_paths: crate::command::policy::default_read_paths(),
            network_commands: Vec::new(),
            task_limits: ResourceLimits::default(),
            task_limit_caps: ResourceLimits {
                memory_bytes: 16 << 30,
                cpu_seconds: 3600,
                processes: 4096,
                open_files: 65536,
                file_size_bytes: 16 << 30,
            },
            default_parent_budget: String::new(),
            agent_max_tokens: 4096,
            llm_rate_max_wait_ms: 300_000,
            llm_default_max_tokens: 4096,
            llm_max_turns: 10,
            tool_timeout_ms: 30_000,
            lease_secs: 60,
            drain_grace_ms: 10_000,
            queue_visibility_timeout_ms: 30_000,
            queue_test_directives: true,
            approval_poll_ms: 250,
            schedule_poll_ms: 1_000,
            notifications: NotificationsConfig::default(),
            defer_interval_secs: 300,
            max_defer_secs: 3600,
            max_delegation_depth: 10,
            delegation_ttl_secs: 3600,
            default_org: "default".into(),
            cancel_running_on_failure: false,
            scratch_dir: PathBuf::new(),
            dependency_retry_max_ms: 2_000,
            submit_wait_ms: 3_000,
            retention_secs: 7 * 24 * 3600,
            prune_interval_secs: 3600,
            job_lease_ms: 5000,
            max_running_jobs: 256,
            max_running_jobs_per_tenant: 0,
            running_jobs_per_tenant: std::collections::BTreeMap::new(),
            replica_id: String::new(),
            tool_approval: ToolApproval::default(),
            budget_extension_timeout_secs: 24 * 3600,
            artifact_max_bytes: 1 << 20,
        }
    }
}

impl ExecutorConfig {
    /// Checks values that would make the executor misbehave.
    pub fn validate(&self) -> Result<(), String> {
        if self.worker_id.trim().is_empty() {
            return Err("executor.worker_id must not be empty".into());
        }
        if self.max_tasks == 0 || self.max_parallel == 0 {
            return Err("executor.max_tasks and executor.max_parallel must be at least 1".into());
        }
        if self.drain_grace_ms > 600_000 {
            return Err(format!(
                "executor.drain_grace_ms is at most 600000 (10 minutes), not {}",
                self.drain_grace_ms
            ));
        }
        if self.queue_visibility_timeout_ms < 100 {
            return Err("executor.queue_visibility_timeout_ms must be at least 100".into());
        }
        if self.lease_secs < 3 {
            return Err("executor.lease_secs must be at least 3".into());
        }
        if self.llm_max_turns == 0 || self.tool_timeout_ms == 0 {
            return Err(
                "executor.llm_max_turns and executor.tool_timeout_ms must be at least 1".into(),
            );
        }
        if self.dependency_retry_max_ms < 50 || self.prune_interval_secs == 0 {
            return Err(
                "executor.dependency_retry_max_ms must be at least 50 and executor.prune_interval_secs at least 1"
                    .into(),
            );
        }
        if self.budget_extension_timeout_secs == 0 {
            return Err("executor.budget_extension_timeout_secs must be at least 1".into());
        }
        if self.tool_approval.timeout_secs == 0 {
            return Err("executor.tool_approval.timeout_secs must be at least 1".into());
        }
        if self.artifact_max_bytes == 0 {
            return Err("executor.artifact_max_bytes must be at least 1".into());
        }
        if self.job_lease_ms < 300 || self.max_running_jobs == 0 {
            return Err(
                "executor.job_lease_ms must be at least 300 and executor.max_running_jobs at least 1"
                    .into(),
            );
        }
        if self.approval_poll_ms == 0 {
            return Err("executor.approval_poll_ms must be at least 1".into());
        }
        if self.schedule_poll_ms == 0 {
            return Err("executor.schedule_poll_ms must be at least 1".into());
        }
        self.notifications.validate()?;
        for c in &self.commands {
            if c.is_empty() || c.contains(char::is_whitespace) {
                return Err(format!("executor.commands: {c:?} is not a command name"));
            }
        }
        if let Some(c) = self
            .network_commands
            .iter()
            .find(|c| !self.commands.contains(c))
        {
            return Err(format!(
                "executor.network_commands: {c:?} is not in executor.commands"
            ));
        }
        self.task_limits.check_within(&self.task_limit_caps)?;
        Ok(())
    }

    pub(crate) fn rules(&self) -> Rules<'_> {
        Rules {
            max_tasks: self.max_tasks,
            commands: &self.commands,
            default_timeout_secs: self.default_timeout_secs,
            default_max_parallel: self.max_parallel,
            max_delegation_depth: self.max_delegation_depth,
            max_file_bytes: self.max_file_bytes,
            limit_caps: &self.task_limit_caps,
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_tasks: self.max_tasks,
            max_delegation_depth: self.max_delegation_depth,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_approval_patterns_match_whole_names_with_stars() {
        let p = ToolApproval {
            tools: vec![
                "github__*".into(),
                "*__write_file".into(),
                "rm".into(),
                "a*b*c".into(),
            ],
            ..Default::default()
        };
        for yes in [
            "github__merge",
            "fs__write_file",
            "rm",
            "abc",
            "a_b_c",
            "axxbyyc",
        ] {
            assert!(p.names(yes), "{yes}");
        }
        for no in [
            "gitlab__merge",
            "fs__write_file2",
            "rmdir",
            "xrm",
            "ab",
            "acb",
            "",
        ] {
            assert!(!p.names(no), "{no}");
        }
        assert!(!ToolApproval::default().names("anything"));
    }
}

/// `[executor.notifications]`: signed CloudEvents webhooks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotificationsConfig {
    /// Where to post events (`[[executor.notifications.webhooks]]`).
    pub webhooks: Vec<WebhookConfig>,
    /// Attempts per delivery before it is dead-lettered.
    pub max_attempts: u32,
    /// The wait before the second attempt, ms; it doubles after each
    /// failed attempt up to `retry_max_ms`.
    pub retry_base_ms: u64,
    /// The longest wait between attempts, ms.
    pub retry_max_ms: u64,
    /// How long one attempt may take, ms.
    pub timeout_ms: u64,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        NotificationsConfig {
            webhooks: Vec::new(),
            max_attempts: 8,
            retry_base_ms: 1_000,
            retry_max_ms: 300_000,
            timeout_ms: 10_000,
        }
    }
}

/// The event types a webhook may ask for.
pub const NOTIFICATION_EVENTS: [&str; 5] = [
    "approval.needed",
    "job.completed",
    "job.failed",
    "job.cancelled",
    "budget.threshold",
];

/// One webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Its name, in deliveries and logs.
    pub name: String,
    /// Where events are posted (http or https).
    pub url: String,
    /// A file holding the HMAC secret deliveries are signed with (never
    /// shown: `--dump-config` prints the path).
    pub secret_file: PathBuf,
    /// The event types it wants (empty: all of them).
    #[serde(default)]
    pub events: Vec<String>,
    /// The tenant whose events it gets (empty: every tenant's).
    #[serde(default)]
    pub tenant: String,
}

impl NotificationsConfig {
    fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 || self.retry_base_ms == 0 || self.timeout_ms == 0 {
            return Err(
                "executor.notifications: max_attempts, retry_base_ms and timeout_ms must be at least 1"
                    .into(),
            );
        }
        let mut names = std::collections::HashSet::new();
        for w in &self.webhooks {
            let name = &w.name;
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(format!(
                    "executor.notifications.webhooks: name {name:?} must be letters, digits, '-', '_' or '.'"
                ));
            }
            if !names.insert(name) {
                return Err(format!(
                    "executor.notifications.webhooks: two webhooks are named {name:?}"
                ));
            }
            if !(w.url.starts_with("http://") || w.url.starts_with("https://")) {
                return Err(format!(
                    "executor.notifications.webhooks {name:?}: url {:?} is not an http(s) URL",
                    w.url
                ));
            }
            if let Some(bad) = w
                .events
                .iter()
                .find(|e| !NOTIFICATION_EVENTS.contains(&e.as_str()))
            {
                return Err(format!(
                    "executor.notifications.webhooks {name:?}: event {bad:?} is not one of {}",
                    NOTIFICATION_EVENTS.join(", ")
                ));
            }
        }
        Ok(())
    }
}
