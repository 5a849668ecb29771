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
    TaskSpec, WatchJobRequest, task_spec::Kind,
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
/// `wait` for it to end, following its events (WatchJob) rather than
/// polling. Refusals (depth, inactive parent) come back as the executor's
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
    let submit = SubmitJobRequest {
        spec: Some(spec),
        ..Default::default()
    };
    let job = executor.submit_job(submit).await?.job;
    let job_id = job
        .and_then(|j| j.spec)
        .map(|s| s.job_id)
        .unwrap_or_default();
    // WatchJob ends after the child's final event; `wait` bounds it. The
    // state is read afterwards, so a stream cut short is not taken for an end.
    let watch = async {
        use futures_util::StreamExt as _;
        let mut events = executor
            .watch_job(WatchJobRequest {
                job_id: job_id.clone(),
                after_sequence: 0,
            })
            .await?;
        while let Some(e) = events.next().await {
            e?;
        }
        Ok::<_, tonic::Status>(())
    };
    if let Ok(watched) = tokio::time::timeout(wait, watch).await {
        watched?;
    }
    // GetResult carries the job's state as it is now, ended or not.
    let r = executor
        .get_result(GetResultRequest {
            job_id: job_id.clone(),
        })
        .await?;
    let state = JobState::try_from(r.state).unwrap_or(JobState::Unspecified);
    let ended = matches!(
        state,
        JobState::Completed | JobState::Cancelled | JobState::Discarded | JobState::Retryable
    );
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
