//! Conversations: a task (`ConversationTask`) whose orchestrator answers
//! each message people send with SendMessage, until it is closed, has had
//! its messages, or nobody writes for its idle time.
//!
//! A message is recorded (`conversation.message`, numbered in order, with
//! the caller's idempotency key) and durable before SendMessage returns;
//! the task's attempt answers the messages in order, one reply
//! (`conversation.replied`) per message. Both live in the job's log, which
//! is the conversation: [`Talk`] is rebuilt from it, so after a crash the
//! attempt answers the first message without a reply, and nothing is
//! answered twice or lost. Who may send is the task's `participants`, with
//! the rules of an input task's answerers ([`crate::input::may_answer`]).

use switchyard_core::Reason;
use switchyard_core::lifecycle::{Holder, TaskState};
use switchyard_kit::auth::Principal;
use switchyard_llm::{Message, Role};
use switchyard_proto::executor::v1::task_spec::Kind;
use switchyard_proto::executor::v1::{
    ConversationReply, ConversationSpend, ConversationTask, ConversationTurn, ListMessagesRequest,
    ListMessagesResponse, LlmUsage, ReplyOutcome, SendMessageRequest, SendMessageResponse,
};

use crate::Executor;
use crate::book::{Change, finished};
use crate::error::ExecutorError;
use crate::events::{self, JobEvent};
use crate::input::{Delivery, may_answer};
use crate::job::JobEntry;

/// How long a conversation waits for a message when its spec says 0.
pub(crate) const DEFAULT_IDLE_SECS: u64 = 86_400;
/// The most messages a conversation may be given.
pub(crate) const MAX_MESSAGES: u32 = 1_000;
/// Messages when the spec says 0.
pub(crate) const DEFAULT_MESSAGES: u32 = 100;
/// The longest message, characters.
pub(crate) const MAX_TEXT_CHARS: usize = 16_000;

/// `conversation.replied` outcomes.
pub(crate) const ANSWERED: &str = "answered";
/// The budget is used up; the conversation stays open.
pub(crate) const PAUSED: &str = "paused";
/// The turn failed; the conversation stays open.
pub(crate) const FAILED: &str = "failed";

/// `conversation.ended` reasons.
pub(crate) const CLOSED: &str = "closed";
/// Nobody wrote for the idle time.
pub(crate) const IDLE: &str = "idle";
/// The last message it takes was answered.
pub(crate) const FULL: &str = "max_messages";

/// `handoff.reclaimed` reasons: the agent handed the conversation back.
pub(crate) const HANDED_BACK: &str = "handed_back";
/// The person asked (`/reclaim`).
pub(crate) const BY_USER: &str = "user";
/// The handoff's time limit passed.
pub(crate) const TIMED_OUT: &str = "timeout";
/// The agent answered its most messages.
pub(crate) const MAX_TURNS: &str = "max_turns";
/// The agent spent the handoff's tokens or money.
pub(crate) const OVER_BUDGET: &str = "budget";

/// A conversation task's idle time, seconds.
pub(crate) fn idle_secs(c: &ConversationTask) -> u64 {
    match u64::from(c.idle_secs) {
        0 => DEFAULT_IDLE_SECS,
        s => s.min(crate::input::MAX_WAIT_SECS),
    }
}

/// The most messages a conversation takes.
pub(crate) fn max_messages(c: &ConversationTask) -> u32 {
    match c.max_messages {
        0 => DEFAULT_MESSAGES,
        n => n.min(MAX_MESSAGES),
    }
}

/// One message and its reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Turn {
    /// The message.
    pub message: events::MessageReceived,
    /// Its reply, once recorded.
    pub reply: Option<events::Replied>,
    /// The message record's sequence in the job's log.
    pub sequence: u64,
}

/// An agent holding the conversation, and what it did since.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Handoff {
    /// How it began.
    pub started: events::HandoffStarted,
    /// Messages the agent answered.
    pub turns: u32,
    /// Tokens it spent.
    pub tokens: u64,
    /// Money it spent, micro-USD.
    pub cost: i64,
}

/// A conversation as its log says: every message with its reply, who
/// holds it, and its end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Talk {
    /// Messages in order (message `seq` is `turns[seq - 1]`).
    pub turns: Vec<Turn>,
    /// How it ended, once it did.
    pub ended: Option<events::ConversationEnded>,
    /// The agent holding it (handoff mode), if one does.
    pub handoff: Option<Handoff>,
    /// The last reclaim, until the orchestrator has answered after it (it
    /// is told what the agent handed back).
    pub reclaimed: Option<events::HandoffReclaimed>,
    /// What each agent spent over the conversation: (turns, tokens, cost).
    pub agents: std::collections::BTreeMap<String, (u32, u64, i64)>,
    /// Tokens of the orchestrator's turns that handed off.
    pub handing_off_tokens: u64,
    /// What those turns cost, micro-USD.
    pub handing_off_cost: i64,
}

impl Talk {
    /// Applies one of the conversation's records, at `sequence` of the
    /// job's log.
    pub(crate) fn apply(&mut self, ev: &JobEvent, sequence: u64) {
        match ev {
            JobEvent::MessageReceived(m) => self.turns.push(Turn {
                message: m.clone(),
                reply: None,
                sequence,
            }),
            JobEvent::Replied(r) => {
                let at = (r.seq as usize).checked_sub(1);
                if let Some(t) = at.and_then(|i| self.turns.get_mut(i)) {
                    t.reply = Some(r.clone());
                }
                if r.agent_id.is_empty() && r.outcome == ANSWERED {
                    self.reclaimed = None;
                }
            }
            JobEvent::ConversationEnded(e) => self.ended = Some(e.clone()),
            JobEvent::HandoffStarted(h) => {
                self.handing_off_tokens += h.orchestrator_tokens;
                self.handing_off_cost += h.orchestrator_cost_micro_usd;
                self.handoff = Some(Handoff {
                    started: h.clone(),
                    ..Default::default()
                });
            }
            JobEvent::AgentResult(r) => {
                if let Some(h) = self.handoff.as_mut() {
                    h.turns += 1;
                    h.tokens += r.tokens;
                    h.cost += r.cost_micro_usd;
                }
                let a = self.agents.entry(r.agent_id.clone()).or_default();
                a.0 += 1;
                a.1 += r.tokens;
                a.2 += r.cost_micro_usd;
            }
            // A failed call spent too: its agent's totals carry it.
            JobEvent::AgentError(f) => {
                let a = self.agents.entry(f.agent_id.clone()).or_default();
                a.0 += 1;
                a.1 += f.tokens;
                a.2 += f.cost_micro_usd;
            }
            JobEvent::HandoffReclaimed(r) => {
                self.handoff = None;
                self.reclaimed = Some(r.clone());
            }
            _ => {}
        }
    }

    /// The first message still to be answered (a bare close needs none).
    pub(crate) fn pending(&self) -> Option<&Turn> {
        self.turns
            .iter()
            .find(|t| t.reply.is_none() && !t.message.text.is_empty())
    }

    /// Who asked to close it, if someone did.
    pub(crate) fn closed_by(&self) -> Option<&str> {
        self.turns
            .iter()
            .find(|t| t.message.close)
            .map(|t| t.message.by.as_str())
    }

    /// Who holds it.
    pub(crate) fn holder(&self) -> Holder {
        match (&self.ended, &self.handoff) {
            (Some(_), _) => Holder::Ended,
            (None, Some(_)) => Holder::Delegated,
            (None, None) => Holder::Orchestrator,
        }
    }

    /// What the agent holding the conversation is sent for message `seq`:
    /// the messages since the handoff (the person's, and its own replies),
    /// nothing from before it.
    pub(crate) fn since_handoff(&self, seq: u32) -> Vec<serde_json::Value> {
        let Some(h) = &self.handoff else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for t in self
            .turns
            .iter()
            .filter(|t| t.message.seq >= h.started.seq && t.message.seq <= seq)
        {
            out.push(serde_json::json!({"role": "user", "text": t.message.text}));
            if let Some(r) = t.reply.as_ref().filter(|r| {
                r.outcome == ANSWERED && r.agent_id == h.started.agent_id && t.message.seq < seq
            }) {
                out.push(serde_json::json!({"role": "assistant", "text": r.text}));
            }
        }
        out
    }

    /// What the model is shown before message `seq`: each earlier message
    /// the orchestrator answered, with its answer. Unanswered ones (paused
    /// or failed turns) are left out, so the model sees a conversation that
    /// alternates as it expects; so are those an agent answered while it
    /// held the conversation (the orchestrator is told what it handed back).
    pub(crate) fn history(&self, seq: u32) -> Vec<Message> {
        let mut out = Vec::new();
        for t in self.turns.iter().take_while(|t| t.message.seq < seq) {
            if let Some(r) = t
                .reply
                .as_ref()
                .filter(|r| r.outcome == ANSWERED && r.agent_id.is_empty())
            {
                out.push(Message::text(Role::User, t.message.text.clone()));
                out.push(Message::text(Role::Assistant, r.text.clone()));
            }
        }
        out
    }

    /// The last time someone wrote or was answered, ms since the epoch.
    pub(crate) fn last_activity_ms(&self) -> Option<u64> {
        self.turns
            .iter()
            .flat_map(|t| [Some(t.message.at_ms), t.reply.as_ref().map(|r| r.at_ms)])
            .flatten()
            .max()
    }

    /// Tokens and model calls over every turn.
    pub(crate) fn usage(&self) -> LlmUsage {
        let mut u = LlmUsage::default();
        for r in self.turns.iter().filter_map(|t| t.reply.as_ref()) {
            u.prompt_tokens += r.prompt_tokens;
            u.completion_tokens += r.completion_tokens;
            u.total_tokens += r.total_tokens;
            u.llm_calls += r.llm_calls;
            u.turns += 1;
        }
        u
    }

    /// The message sent with `key`, if one was.
    fn sent_with(&self, key: &str) -> Option<&Turn> {
        if key.is_empty() {
            return None;
        }
        self.turns.iter().find(|t| t.message.idempotency_key == key)
    }
}

/// Records `ev` for conversation `task_id` of `job_id`: an event that
/// moves who holds the conversation (`handoff.started`,
/// `handoff.reclaimed`, `conversation.ended`) only once the holder table
/// allows the move — a refused move records nothing.
pub(crate) fn record_move(
    book: &crate::book::JobBook,
    st: &mut crate::book::Jobs,
    job_id: &str,
    task_id: &str,
    ev: JobEvent,
) -> Result<u64, ExecutorError> {
    let to = match &ev {
        JobEvent::HandoffStarted(_) => Some(Holder::Delegated),
        JobEvent::HandoffReclaimed(_) => Some(Holder::Orchestrator),
        JobEvent::ConversationEnded(_) => Some(Holder::Ended),
        _ => None,
    };
    if let Some(to) = to {
        let from = st
            .get(job_id)?
            .talks
            .get(task_id)
            .map_or(Holder::Orchestrator, Talk::holder);
        from.check(to)?;
    }
    Ok(book.record(st, job_id, task_id, ev))
}

/// The conversation task `task_id` of `e`, if it is one.
pub(crate) fn conversation_task<'a>(
    e: &'a JobEntry,
    task_id: &str,
) -> Option<&'a ConversationTask> {
    let i = *e.index.get(task_id)?;
    match &e.spec().tasks[i].kind {
        Some(Kind::Conversation(c)) => Some(c),
        _ => None,
    }
}

/// The conversation a request means: the task it names, else the job's
/// only conversation. Refused as closed when it names something else.
fn which<'e>(
    e: &'e JobEntry,
    task_id: &str,
) -> Result<(String, &'e ConversationTask), ExecutorError> {
    if !task_id.is_empty() {
        return match conversation_task(e, task_id) {
            Some(c) => Ok((task_id.to_owned(), c)),
            None => Err(closed(format!(
                "task {task_id:?} of job {:?} is not a conversation (or does not exist)",
                e.id()
            ))),
        };
    }
    let mut all = e.spec().tasks.iter().filter_map(|t| match &t.kind {
        Some(Kind::Conversation(c)) => Some((t.id.clone(), c)),
        _ => None,
    });
    match (all.next(), all.next()) {
        (Some(one), None) => Ok(one),
        (None, _) => Err(closed(format!("job {:?} has no conversation task", e.id()))),
        (Some(_), Some(_)) => Err(ExecutorError::Input(
            Reason::InvalidArgument,
            format!(
                "job {:?} has several conversations; name one in task_id",
                e.id()
            ),
        )),
    }
}

fn closed(why: String) -> ExecutorError {
    ExecutorError::Input(Reason::ConversationClosed, why)
}

/// Refuses `p` unless it takes part in conversation `c`: NOT_FOUND when it
/// cannot see the job either, CONVERSATION_NOT_ALLOWED when it can.
fn authorize(p: &Principal, e: &JobEntry, c: &ConversationTask) -> Result<(), ExecutorError> {
    let (tenant, owner) = (&e.job.tenant, &e.job.submitted_by);
    if may_answer(p, tenant, owner, c.participants.as_ref()) {
        return Ok(());
    }
    if p.may_see(tenant, owner) {
        return Err(ExecutorError::Input(
            Reason::ConversationNotAllowed,
            format!(
                "{:?} does not take part in this conversation: it takes messages from {}",
                p.acting_subject(),
                crate::input::describe(c.participants.as_ref())
            ),
        ));
    }
    Err(ExecutorError::NotFound(e.id().into()))
}

/// Why conversation `task_id` of `e` takes no message, if it does not.
fn refusal(e: &JobEntry, task_id: &str, c: &ConversationTask, talk: &Talk) -> Option<String> {
    let state = e.task_state(e.index[task_id]);
    let job = e.id();
    if let Some(end) = &talk.ended {
        let how = match end.why.as_str() {
            CLOSED => format!("{} closed it", end.by),
            IDLE => "nobody wrote within its idle time".to_owned(),
            _ => format!("it had its {} messages", end.messages),
        };
        return Some(format!(
            "the conversation {task_id:?} of job {job:?} has ended: {how}; start a new one"
        ));
    }
    if let Some(by) = talk.closed_by() {
        return Some(format!(
            "the conversation {task_id:?} of job {job:?} is closing: {by} closed it"
        ));
    }
    let max = max_messages(c);
    if talk.turns.len() as u32 >= max {
        return Some(format!(
            "the conversation {task_id:?} of job {job:?} has had its {max} messages (max_messages); start a new one"
        ));
    }
    if finished(e.state()) || state.is_terminal() {
        return Some(format!(
            "the conversation {task_id:?} of job {job:?} has ended: the task is {state} and the job {}",
            e.state()
        ));
    }
    None
}

/// A conversation's turns as the API shows them, from message `after` on.
fn turns(talk: &Talk, after: u32) -> Vec<ConversationTurn> {
    talk.turns
        .iter()
        .filter(|t| t.message.seq > after)
        .map(|t| ConversationTurn {
            seq: t.message.seq,
            text: t.message.text.clone(),
            by: t.message.by.clone(),
            sent_at: Some(switchyard_kit::time::timestamp(t.message.at_ms)),
            close: t.message.close,
            reply: t.reply.as_ref().map(|r| ConversationReply {
                outcome: match r.outcome.as_str() {
                    ANSWERED => ReplyOutcome::Answered,
                    PAUSED => ReplyOutcome::Paused,
                    _ => ReplyOutcome::Failed,
                } as i32,
                text: r.text.clone(),
                model: r.model.clone(),
                usage: Some(LlmUsage {
                    prompt_tokens: r.prompt_tokens,
                    completion_tokens: r.completion_tokens,
                    total_tokens: r.total_tokens,
                    llm_calls: r.llm_calls,
                    turns: 1,
                }),
                reason: r.reason.clone(),
                replied_at: Some(switchyard_kit::time::timestamp(r.at_ms)),
                agent_id: r.agent_id.clone(),
            }),
        })
        .collect()
}

/// What each participant spent: the orchestrator (its replies' tokens),
/// then each agent.
fn spend(t: &Talk) -> Vec<ConversationSpend> {
    let (mut turns, mut tokens, mut cost) = (0, t.handing_off_tokens, t.handing_off_cost);
    for r in t
        .turns
        .iter()
        .filter_map(|t| t.reply.as_ref())
        .filter(|r| r.agent_id.is_empty() && r.llm_calls > 0)
    {
        turns += 1;
        tokens += r.total_tokens;
        cost += r.cost_micro_usd;
    }
    let mut out = vec![ConversationSpend {
        agent_id: String::new(),
        turns,
        tokens,
        cost_micro_usd: cost,
    }];
    out.extend(
        t.agents
            .iter()
            .map(|(id, &(turns, tokens, cost))| ConversationSpend {
                agent_id: id.clone(),
                turns,
                tokens,
                cost_micro_usd: cost,
            }),
    );
    out
}

/// Whether `ev` is one of the records a conversation is made of.
pub(crate) fn is_talk(ev: &JobEvent) -> bool {
    matches!(
        ev,
        JobEvent::MessageReceived(_)
            | JobEvent::Replied(_)
            | JobEvent::ConversationEnded(_)
            | JobEvent::HandoffStarted(_)
            | JobEvent::HandoffReclaimed(_)
            | JobEvent::AgentResult(_)
            | JobEvent::AgentError(_)
    )
}

/// A stored job (not held here: finished, or running on another replica)
/// with its conversations as its log says.
async fn stored_talks(x: &Executor, job_id: &str) -> Result<Option<JobEntry>, ExecutorError> {
    x.inner.book.stored_with(job_id, is_talk).await
}

impl Executor {
    /// SendMessage.
    pub(crate) async fn send_message(
        &self,
        p: &Principal,
        req: SendMessageRequest,
    ) -> Result<SendMessageResponse, ExecutorError> {
        match self.send_message_here(p, &req).await? {
            Some(r) => Ok(r),
            None => self.send_message_stored(p, &req).await,
        }
    }

    /// SendMessage to a job in memory here; `None` when it is not.
    pub(crate) async fn send_message_here(
        &self,
        p: &Principal,
        req: &SendMessageRequest,
    ) -> Result<Option<SendMessageResponse>, ExecutorError> {
        switchyard_core::validate::optional_key(&req.idempotency_key, "idempotency_key")
            .map_err(|why| ExecutorError::Input(Reason::InvalidArgument, why))?;
        let chars = req.text.chars().count();
        if (chars == 0 && !req.close) || chars > MAX_TEXT_CHARS {
            return Err(ExecutorError::Input(
                Reason::InvalidArgument,
                format!(
                    "text must be 1 to {MAX_TEXT_CHARS} characters (empty only with close), got {chars}"
                ),
            ));
        }
        let book = &self.inner.book;
        let job_id = req.job_id.as_str();
        let sent = {
            let mut st = book.lock();
            match st.find(job_id) {
                None => None,
                Some(e) => {
                    crate::input::reachable(p, e)?;
                    let (task_id, c) = which(e, &req.task_id)?;
                    authorize(p, e, c)?;
                    let empty = Talk::default();
                    let talk = e.talks.get(&task_id).unwrap_or(&empty);
                    if let Some(t) = talk.sent_with(&req.idempotency_key) {
                        Some((task_id, t.message.seq, true, t.sequence))
                    } else {
                        if let Some(why) = refusal(e, &task_id, c, talk) {
                            return Err(closed(why));
                        }
                        let seq = talk.turns.len() as u32 + 1;
                        let i = e.index[&task_id];
                        let waiting = e.task_state(i) == TaskState::InputRequired;
                        let by = p.acting_subject().to_owned();
                        let m = events::MessageReceived {
                            seq,
                            text: req.text.clone(),
                            by: by.clone(),
                            close: req.close,
                            idempotency_key: req.idempotency_key.clone(),
                            at_ms: book.now(),
                        };
                        book.record(&mut st, job_id, &task_id, JobEvent::MessageReceived(m));
                        let sequence = st.get(job_id)?.job.last_sequence;
                        // The attempt waiting for a message wakes; one that
                        // is answering (or resuming) finds it when it looks.
                        if waiting && let Some(tx) = self.inner.inputs.take(job_id, &task_id) {
                            let why = format!("message {seq} from {by}");
                            let change =
                                Change::to(TaskState::Running).because(Reason::InputRequired, &why);
                            book.move_task(&mut st, job_id, i, change)?;
                            let (settled, _) = tokio::sync::oneshot::channel();
                            let _ = tx.send(Delivery {
                                answer: serde_json::Value::Null,
                                by,
                                settled,
                            });
                        }
                        Some((task_id, seq, false, sequence))
                    }
                }
            }
        };
        let Some((task_id, seq, replayed, event_sequence)) = sent else {
            return Ok(None);
        };
        // Durable before it is acknowledged (a replay: the first call's
        // record may still be on its way to disk).
        book.durable(book.last()).await?;
        Ok(Some(SendMessageResponse {
            task_id,
            seq,
            replayed,
            event_sequence,
        }))
    }

    /// SendMessage for a job not in memory here: a retry of a message
    /// already recorded gets its first outcome; an open conversation run
    /// by another replica gets the message through it (PostgreSQL
    /// replicas).
    async fn send_message_stored(
        &self,
        p: &Principal,
        req: &SendMessageRequest,
    ) -> Result<SendMessageResponse, ExecutorError> {
        let job_id = req.job_id.as_str();
        let Some(e) = stored_talks(self, job_id).await? else {
            return Err(ExecutorError::NotFound(job_id.into()));
        };
        crate::input::reachable(p, &e)?;
        let (task_id, c) = which(&e, &req.task_id)?;
        authorize(p, &e, c)?;
        let empty = Talk::default();
        let talk = e.talks.get(&task_id).unwrap_or(&empty);
        if let Some(t) = talk.sent_with(&req.idempotency_key) {
            return Ok(SendMessageResponse {
                task_id,
                seq: t.message.seq,
                replayed: true,
                event_sequence: t.sequence,
            });
        }
        if let Some(why) = refusal(&e, &task_id, c, talk) {
            return Err(closed(why));
        }
        let asked = crate::relay::Asked::Message(req.clone());
        match self.relay(job_id, &req.idempotency_key, p, asked).await? {
            crate::relay::Answer::Message(r) => Ok(r),
            crate::relay::Answer::Input(_) => Err(crate::relay::mismatched(job_id)),
        }
    }

    /// ListMessages.
    pub(crate) async fn list_messages(
        &self,
        p: &Principal,
        req: &ListMessagesRequest,
    ) -> Result<ListMessagesResponse, ExecutorError> {
        let job_id = req.job_id.as_str();
        let read = |e: &JobEntry| -> Result<ListMessagesResponse, ExecutorError> {
            crate::input::reachable(p, e)?;
            let (task_id, c) = which(e, &req.task_id)?;
            let (tenant, owner) = (&e.job.tenant, &e.job.submitted_by);
            if !p.may_see(tenant, owner) {
                authorize(p, e, c)?;
            }
            let empty = Talk::default();
            let talk = e.talks.get(&task_id).unwrap_or(&empty);
            let open = refusal(e, &task_id, c, talk).is_none();
            let state = e.task_state(e.index[&task_id]);
            Ok(ListMessagesResponse {
                turns: turns(talk, req.after_seq),
                open,
                waiting: open && state == TaskState::InputRequired && talk.pending().is_none(),
                active_agent: talk
                    .handoff
                    .as_ref()
                    .map(|h| h.started.agent_id.clone())
                    .unwrap_or_default(),
                agents: spend(talk),
                task_id,
            })
        };
        {
            let st = self.inner.book.lock();
            if let Some(e) = st.find(job_id) {
                return read(e);
            }
        }
        match stored_talks(self, job_id).await? {
            Some(e) => read(&e),
            None => Err(ExecutorError::NotFound(job_id.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u32, text: &str, close: bool) -> JobEvent {
        JobEvent::MessageReceived(events::MessageReceived {
            seq,
            text: text.into(),
            by: "ann".into(),
            close,
            idempotency_key: format!("k{seq}"),
            at_ms: u64::from(seq) * 10,
        })
    }

    fn reply(seq: u32, outcome: &str, text: &str) -> JobEvent {
        JobEvent::Replied(events::Replied {
            seq,
            outcome: outcome.into(),
            text: text.into(),
            total_tokens: 7,
            llm_calls: 1,
            at_ms: u64::from(seq) * 10 + 5,
            ..Default::default()
        })
    }

    #[test]
    fn history_holds_only_answered_turns_before_the_message_in_order() {
        let mut t = Talk::default();
        for ev in [
            message(1, "hi", false),
            reply(1, ANSWERED, "hello"),
            message(2, "spend", false),
            reply(2, PAUSED, "budget used up"),
            message(3, "again", false),
            reply(3, ANSWERED, "done"),
            message(4, "more", false),
        ] {
            t.apply(&ev, 0);
        }
        let h = t.history(4);
        let said: Vec<(Role, &str)> = h.iter().map(|m| (m.role, m.content.as_str())).collect();
        assert_eq!(
            said,
            vec![
                (Role::User, "hi"),
                (Role::Assistant, "hello"),
                (Role::User, "again"),
                (Role::Assistant, "done"),
            ]
        );
        assert_eq!(t.history(1), Vec::new());
        assert_eq!(t.pending().map(|p| p.message.seq), Some(4));
        assert_eq!(t.last_activity_ms(), Some(40));
        assert_eq!(t.usage().total_tokens, 21);
        assert_eq!(t.usage().turns, 3);
    }

    #[test]
    fn a_close_is_remembered_and_a_bare_close_needs_no_reply() {
        let mut t = Talk::default();
        t.apply(&message(1, "hi", false), 1);
        assert_eq!(t.closed_by(), None);
        t.apply(&message(2, "", true), 2);
        assert_eq!(t.closed_by(), Some("ann"));
        assert_eq!(t.pending().map(|p| p.message.seq), Some(1));
        t.apply(&reply(1, ANSWERED, "hello"), 3);
        assert!(
            t.pending().is_none(),
            "a close without text has nothing to answer"
        );
        assert_eq!(t.sent_with("k2").map(|t| t.message.seq), Some(2));
        assert!(t.sent_with("").is_none(), "no key, no replay");
    }

    #[test]
    fn a_reply_to_an_unknown_message_changes_nothing() {
        let mut t = Talk::default();
        t.apply(&message(1, "hi", false), 1);
        t.apply(&reply(0, ANSWERED, "x"), 2);
        t.apply(&reply(9, ANSWERED, "x"), 3);
        assert_eq!(t.pending().map(|p| p.message.seq), Some(1));
    }
}
