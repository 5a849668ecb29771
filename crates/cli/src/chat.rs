//! `switchyard chat`: talk with a conversation job in the terminal. Each
//! line is a message (SendMessage); the reply is printed as it is
//! generated (the job's `llm.delta` events) and ends with its record
//! (`conversation.replied`). `/close` ends the conversation; end of input
//! or `/quit` leaves it open, to come back to with `--job`. A reply from an
//! agent the orchestrator handed the conversation to is shown as
//! `[agent] …`; `/reclaim` (sent as a message) takes it back.

use anyhow::Context as _;
use clap::Args;
use serde_json::{Value, json};
use switchyard_api::ExecutorClient;
use switchyard_kit::json::struct_to_json;
use switchyard_proto::executor::v1::{
    JobState, ListMessagesRequest, ReplyOutcome, SendMessageRequest, SubmitJobRequest,
    WatchJobRequest,
};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio_stream::StreamExt as _;

use crate::client::{Conn, MAX_MESSAGE, api};

/// `switchyard chat`
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Go on with this conversation job (its history is shown first);
    /// without it a new conversation job is started.
    #[arg(long = "job")]
    job: Option<String>,
    /// The conversation task, when the job has several.
    #[arg(long = "task", default_value = "")]
    task: String,
    /// A new conversation's model.
    #[arg(long, default_value = "gpt-4o-mini")]
    model: String,
    /// A new conversation's standing instructions (its system prompt).
    #[arg(long, default_value = "")]
    instructions: String,
    /// A new conversation's token budget (its ceiling: when it is used up
    /// the conversation pauses).
    #[arg(long = "budget-tokens")]
    budget_tokens: Option<u64>,
    /// A new conversation's cap on each reply, tokens.
    #[arg(long = "max-tokens", default_value_t = 256)]
    max_tokens: u64,
    /// A new conversation ends after this many seconds without a message.
    #[arg(long = "idle", default_value_t = 0)]
    idle_secs: u32,
    #[command(flatten)]
    conn: Conn,
}

/// Runs `switchyard chat`.
pub async fn run(a: ChatArgs) -> anyhow::Result<()> {
    let c = ExecutorClient::remote(a.conn.channel().await?, MAX_MESSAGE);
    let job_id = match &a.job {
        Some(id) => {
            let h = c
                .list_messages(ListMessagesRequest {
                    job_id: id.clone(),
                    task_id: a.task.clone(),
                    after_seq: 0,
                })
                .await
                .map_err(api)?;
            for t in &h.turns {
                if t.text.is_empty() {
                    println!("({} closed the conversation)", t.by);
                    continue;
                }
                println!("you ({}) › {}", t.by, t.text);
                if let Some(r) = &t.reply {
                    println!("{}{}", by_agent(&r.agent_id), shown(r.outcome, &r.text));
                }
            }
            if !h.open {
                anyhow::bail!(
                    "conversation {id} has ended; start a new one with `switchyard chat`"
                );
            }
            id.clone()
        }
        None => {
            let (id, waits) = start(&c, &a).await?;
            println!(
                "conversation {id} with {}: type a message; /close ends it, /quit (or end of input) leaves it open",
                a.model
            );
            if let Some(run) = waits {
                println!(
                    "(its run {run} waits for approval, priced at every message it may take; what you send now is answered once it is approved)"
                );
            }
            id
        }
    };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.context("reading standard input")? {
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if text == "/quit" {
            break;
        }
        let close = text == "/close";
        let sent = c
            .send_message(SendMessageRequest {
                job_id: job_id.clone(),
                task_id: a.task.clone(),
                text: if close {
                    String::new()
                } else {
                    text.to_owned()
                },
                close,
                idempotency_key: format!("cli-{}", uuid::Uuid::now_v7()),
            })
            .await
            .map_err(api)?;
        if close {
            println!("closed conversation {job_id}");
            return Ok(());
        }
        stream_reply(&c, &job_id, &sent.task_id, sent.seq, sent.event_sequence).await?;
    }
    println!("left conversation {job_id} open: `switchyard chat --job {job_id}` goes on with it");
    Ok(())
}

/// Starts a conversation job: its id, and its run when that waits for a
/// person's approval.
async fn start(c: &ExecutorClient, a: &ChatArgs) -> anyhow::Result<(String, Option<String>)> {
    let mut orchestrator = json!({"model": a.model, "max_tokens": a.max_tokens});
    if !a.instructions.is_empty() {
        orchestrator["instructions"] = json!(a.instructions);
    }
    let mut doc = json!({
        "plan_description": "a conversation (switchyard chat)",
        "tasks": [{"id": "chat", "conversation": {
            "orchestrator": orchestrator,
            "idle_secs": a.idle_secs,
        }}],
    });
    if let Some(t) = a.budget_tokens {
        doc["budget"] = json!({"token_budget": t});
    }
    let out = c
        .submit_job(SubmitJobRequest {
            document: doc.to_string(),
            format: "native".into(),
            ..Default::default()
        })
        .await
        .map_err(api)?;
    let job = out.job.context("the executor answered without the job")?;
    let id = job
        .spec
        .as_ref()
        .map(|s| s.job_id.clone())
        .context("the executor answered without the job's spec")?;
    let waits = job.state == JobState::Pending as i32 && !job.run_id.is_empty();
    Ok((id, waits.then_some(job.run_id)))
}

/// The prefix of a reply an agent holding the conversation gave.
fn by_agent(agent_id: &str) -> String {
    if agent_id.is_empty() {
        String::new()
    } else {
        format!("[{agent_id}] ")
    }
}

/// How a recorded reply is shown.
fn shown(outcome: i32, text: &str) -> String {
    match ReplyOutcome::try_from(outcome) {
        Ok(ReplyOutcome::Answered) => text.to_owned(),
        Ok(ReplyOutcome::Paused) => format!("[paused] {text}"),
        _ => format!("[not answered] {text}"),
    }
}

/// What the person talking is told of job `job_id`'s budget pause
/// (`budget.paused`) and of its extension's decision.
fn pause_notice(job_id: &str, kind: &str, data: &Value) -> Option<String> {
    match kind {
        "budget.paused" => {
            let asked = if data["dimension"] == "cost" {
                // The same words as `job get` and `job watch`.
                format!(
                    "{} more",
                    crate::output::usd(data["cost_micro_usd"].as_i64().unwrap_or(0))
                )
            } else {
                format!("{} more tokens", data["tokens"])
            };
            Some(format!(
                "[paused] the conversation's budget is used up; extension run {} asks for {asked}. This message is answered once an approver resumes it (switchyard job resume {job_id}); switchyard job cancel {job_id} ends it.\n",
                data["run_id"].as_str().unwrap_or_default()
            ))
        }
        "budget.extension_decided" if data["decision"] == "approved" => Some(format!(
            "[resumed] {} approved the extension\n",
            data["by"].as_str().unwrap_or_default()
        )),
        "budget.extension_decided" => Some(format!(
            "[ended] the extension was {}: the conversation ends\n",
            data["decision"].as_str().unwrap_or_default()
        )),
        _ => None,
    }
}

/// Prints the reply to message `seq` as it is generated, until recorded.
async fn stream_reply(
    c: &ExecutorClient,
    job_id: &str,
    task_id: &str,
    seq: u32,
    after: u64,
) -> anyhow::Result<()> {
    let mut events = c
        .watch_job(WatchJobRequest {
            job_id: job_id.to_owned(),
            after_sequence: after,
            ..Default::default()
        })
        .await
        .map_err(api)?;
    let mut out = tokio::io::stdout();
    let mut streamed = String::new();
    while let Some(m) = events.next().await {
        let Some(e) = m.map_err(api)?.event else {
            continue;
        };
        let data = e.data.as_ref().map(struct_to_json).unwrap_or(Value::Null);
        // The job's budget pause is the job's event: the message waits for
        // the extension, and is answered once it is approved.
        if let Some(notice) = pause_notice(job_id, &e.kind, &data) {
            out.write_all(notice.as_bytes()).await?;
            out.flush().await?;
            continue;
        }
        if e.task_id != task_id {
            continue;
        }
        match e.kind.as_str() {
            "llm.delta" => {
                if let Some(t) = data["text"].as_str() {
                    streamed.push_str(t);
                    out.write_all(t.as_bytes()).await?;
                    out.flush().await?;
                }
            }
            // A turn that failed and ran again streams anew.
            "llm.call" if data["outcome"] != "ok" && !streamed.is_empty() => {
                out.write_all(b"\n").await?;
                streamed.clear();
            }
            "conversation.replied" if data["seq"] == seq => {
                let text = data["text"].as_str().unwrap_or_default();
                let outcome = match data["outcome"].as_str() {
                    Some("answered") => ReplyOutcome::Answered,
                    Some("paused") => ReplyOutcome::Paused,
                    _ => ReplyOutcome::Failed,
                } as i32;
                if streamed.is_empty() || outcome != ReplyOutcome::Answered as i32 {
                    if !streamed.is_empty() {
                        out.write_all(b"\n").await?;
                    }
                    let agent = by_agent(data["agent_id"].as_str().unwrap_or_default());
                    out.write_all(format!("{agent}{}\n", shown(outcome, text)).as_bytes())
                        .await?;
                    out.flush().await?;
                } else {
                    out.write_all(b"\n").await?;
                    out.flush().await?;
                }
                return Ok(());
            }
            _ => {}
        }
    }
    anyhow::bail!("job {job_id} ended before message {seq} was answered")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::pause_notice;

    #[test]
    fn a_budget_pause_and_its_decision_are_told_to_the_person_talking() {
        let paused = json!({"run_id": "extend-1", "dimension": "tokens", "tokens": 80});
        let told = pause_notice("talk", "budget.paused", &paused).unwrap_or_default();
        assert!(told.starts_with("[paused]"), "{told}");
        assert!(told.contains("extend-1 asks for 80 more tokens"), "{told}");
        assert!(told.contains("switchyard job resume talk"), "{told}");
        let money = json!({"run_id": "x", "dimension": "cost", "cost_micro_usd": 40});
        let told = pause_notice("talk", "budget.paused", &money).unwrap_or_default();
        assert!(told.contains("$0.000040 more"), "{told}");
        let yes = json!({"decision": "approved", "by": "bob"});
        assert_eq!(
            pause_notice("talk", "budget.extension_decided", &yes).as_deref(),
            Some("[resumed] bob approved the extension\n")
        );
        let no = json!({"decision": "rejected", "by": "bob"});
        let told = pause_notice("talk", "budget.extension_decided", &no).unwrap_or_default();
        assert!(
            told.starts_with("[ended] the extension was rejected"),
            "{told}"
        );
        assert_eq!(pause_notice("talk", "llm.delta", &yes), None);
    }
}
