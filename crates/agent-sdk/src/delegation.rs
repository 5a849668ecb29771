//! Delegation for programmatic agents (seed 000 §2.3): create a child job
//! of the job that invoked you. The executor checks the depth limit and
//! that the parent is still active, nests the child's budget under the
//! parent's, and approves it under the parent's run; the child's costs
//! roll up into the parent's budget.

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_api::ExecutorClient;
use switchyard_kit::json::json_to_struct;
use switchyard_kit::json::value_to_json;
use switchyard_proto::executor::v1::{
    AgentTask, Delegation, GetResultRequest, JobSpec, JobState, LlmTask, SubmitJobRequest,
    TaskSpec, task_spec::Kind,
};

use crate::Invocation;

/// The built-in `delegate` tool's name.
pub const TOOL: &str = "delegate";

/// What the model is told the `delegate` tool does.
pub const TOOL_DESCRIPTION: &str = "Hand a subtask to a child job and wait for its result";

/// The `delegate` tool's arguments.
pub fn tool_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "What the delegated job must do, in full"},
            "capability": {"type": "string", "description": "Send the task to an agent with this capability instead of a model"},
            "input": {"type": "object", "description": "Structured input for that agent"}
        },
        "required": ["task"],
        "additionalProperties": false
    })
}

/// The child job a `delegate` call asks for: an agent task on `capability`
/// (with `input` plus the task) when given, else `model_task(task)`.
/// `plan_id` names who delegated. The caller sets the delegation itself.
pub fn child_job(
    args: &Value,
    plan_id: String,
    model_task: impl FnOnce(String) -> LlmTask,
) -> JobSpec {
    let task = args
        .get("task")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let kind = match args.get("capability").and_then(Value::as_str) {
        Some(cap) => {
            let mut input = args.get("input").cloned().unwrap_or_else(|| json!({}));
            if let Some(o) = input.as_object_mut() {
                o.insert("task".into(), json!(task));
            }
            Kind::Agent(AgentTask {
                capability: cap.into(),
                input: json_to_struct(&input),
                ..Default::default()
            })
        }
        None => Kind::Llm(model_task(task.clone())),
    };
    JobSpec {
        plan_id,
        plan_description: task.chars().take(200).collect(),
        tasks: vec![TaskSpec {
            id: "delegated".into(),
            name: task.chars().take(80).collect(),
            kind: Some(kind),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The child job's end.
#[derive(Debug, Clone)]
pub struct ChildResult {
    /// Child job id.
    pub job_id: String,
    /// Its final state (or the state when the wait ran out).
    pub state: JobState,
    /// Outputs of its sink tasks.
    pub result: Value,
    /// Tokens it used.
    pub tokens_used: u64,
    /// Money it spent, micro-USD.
    pub cost_micro_usd: i64,
    /// Why it did not complete, if it did not.
    pub error: String,
}

impl ChildResult {
    /// What the `delegate` tool gives back to the model: the result when
    /// the child completed, else why not.
    pub fn tool_result(&self) -> Result<Value, String> {
        if self.state == JobState::Completed {
            Ok(
                json!({"job_id": self.job_id, "state": "completed", "result": self.result,
                      "tokens_used": self.tokens_used, "cost_micro_usd": self.cost_micro_usd}),
            )
        } else {
            Err(format!(
                "delegated job {} ended {}: {}",
                self.job_id,
                self.state.as_str_name(),
                self.error
            ))
        }
    }
}

/// Submits `spec` as a child of the job that sent `req`, then waits up to
/// `wait` for it to end: the submission itself waits (SubmitJob's `wait`),
/// without polling or following events. Refusals (depth, inactive parent) come back as the executor's
/// status. When the wait runs out the child keeps running: its id is in
/// the result, to look at later or cancel.
pub async fn delegate(
    executor: &ExecutorClient,
    req: &Invocation,
    mut spec: JobSpec,
    wait: Duration,
) -> Result<ChildResult, tonic::Status> {
    let ctx = req.context.clone().unwrap_or_default();
    let corr = ctx.correlation.unwrap_or_default();
    if corr.job_id.is_empty() {
        return Err(tonic::Status::failed_precondition(
            "this invocation carries no job id to delegate from",
        ));
    }
    spec.delegation = Some(Delegation {
        parent_job_id: corr.job_id.clone(),
        ..Default::default()
    });
    if spec.correlation_id.is_empty() {
        spec.correlation_id = corr.correlation_id.clone();
    }
    // SubmitJob with `wait` answers with the result once the child ends; the
    // server cuts each wait to its request limit, so a longer one goes on
    // with GetResult's `wait` until `wait` runs out.
    let deadline = tokio::time::Instant::now() + wait;
    let submit = SubmitJobRequest {
        spec: Some(spec),
        wait: Some(switchyard_kit::time::duration(wait.as_millis() as u64)),
        // Proves this agent was invoked by the parent's running task.
        invocation_grant: ctx.grant.clone(),
        ..Default::default()
    };
    let submitted = executor.submit_job(submit).await?;
    let job_id = submitted
        .job
        .and_then(|j| j.spec)
        .map(|s| s.job_id)
        .unwrap_or_default();
    let mut result = submitted.result;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if result.as_ref().is_some_and(|r| ended(r.state)) || (result.is_some() && left.is_zero()) {
            break;
        }
        // GetResult carries the job's state as it is now, ended or not.
        result = Some(
            executor
                .get_result(GetResultRequest {
                    job_id: job_id.clone(),
                    wait: Some(switchyard_kit::time::duration(left.as_millis() as u64)),
                })
                .await?,
        );
    }
    let r = result.unwrap_or_default();
    let state = JobState::try_from(r.state).unwrap_or(JobState::Unspecified);
    let ended = ended(r.state);
    Ok(ChildResult {
        job_id,
        state,
        result: r.result.as_ref().map(value_to_json).unwrap_or(json!(null)),
        tokens_used: r.tokens_used,
        cost_micro_usd: r.cost.map_or(0, |m| m.micro_usd),
        error: if ended {
            r.error
        } else {
            "the wait ran out; the child job is still running".into()
        },
    })
}

/// Whether a job in `state` has ended.
fn ended(state: i32) -> bool {
    matches!(
        JobState::try_from(state).unwrap_or(JobState::Unspecified),
        JobState::Completed | JobState::Cancelled | JobState::Discarded | JobState::Retryable
    )
}
