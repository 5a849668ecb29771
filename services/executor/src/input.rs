//! Input into running work: SendInput answers a task waiting for a person
//! (an `InputTask`), ListInputRequests shows who may answer what.
//!
//! Who may answer is the task's to say ([`may_answer`]): by default the
//! job's submitter; the task may name subjects and roles of the job's
//! tenant. A caller who may neither answer nor see the job is told the job
//! does not exist; one who sees it but is not named is refused with
//! INPUT_NOT_ALLOWED.
//!
//! Delivery is exactly once. The waiting attempt sits on the [`Desk`];
//! SendInput takes it off, records the answer (`task.input_received`, with
//! the caller's idempotency key) and moves the task back to running, all
//! under the book's lock, then hands the answer over and returns once the
//! task's end is durable. A second answer finds the task running (refused
//! as not waiting, or, with the first call's key, told the first outcome);
//! a crash before the end is durable leaves the answer in the log, and the
//! resumed attempt takes it from there instead of asking again.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;
use switchyard_core::Reason;
use switchyard_core::lifecycle::TaskState;
use switchyard_kit::auth::{Principal, Role};
use switchyard_proto::executor::v1::task_spec::Kind;
use switchyard_proto::executor::v1::{
    InputAnswerers, InputRequest, InputTask, Job, ListInputRequestsRequest,
    ListInputRequestsResponse, SendInputRequest, SendInputResponse,
};
use tokio::sync::oneshot;

use crate::Executor;
use crate::attempt::input::ANSWERED;
use crate::book::{Change, JobBook, Jobs};
use crate::error::ExecutorError;
use crate::events::{self, JobEvent};
use crate::job::JobEntry;

/// How long an input task waits when its spec says 0, seconds.
pub(crate) const DEFAULT_WAIT_SECS: u64 = 86_400;
/// The longest wait a task may ask for, seconds (30 days).
pub(crate) const MAX_WAIT_SECS: u64 = 2_592_000;
/// Roles an input task may name as answerers.
pub(crate) const ANSWERING_ROLES: [Role; 4] =
    [Role::Submitter, Role::Approver, Role::Operator, Role::Admin];

/// The task's wait, seconds.
pub(crate) fn wait_secs(t: &InputTask) -> u64 {
    match u64::from(t.wait_secs) {
        0 => DEFAULT_WAIT_SECS,
        s => s.min(MAX_WAIT_SECS),
    }
}

/// An answer handed to the waiting attempt.
pub(crate) struct Delivery {
    /// The answer (already checked against the task's schema).
    pub(crate) answer: Value,
    /// Who answered.
    pub(crate) by: String,
    /// Answered once the task's end is durable.
    pub(crate) settled: oneshot::Sender<()>,
}

/// A waiting attempt's place: which registration it is, and where its
/// answer goes.
type Place = (u64, oneshot::Sender<Delivery>);

/// The attempts waiting for an answer, by `(job, task)`. Taking an entry
/// off is what decides who ends the wait.
#[derive(Default)]
pub(crate) struct Desk {
    waiting: Mutex<HashMap<(String, String), Place>>,
    next: std::sync::atomic::AtomicU64,
}

/// An attempt's place on the desk; leaving it (dropped: the attempt ended
/// or was aborted) takes it off unless someone already did.
pub(crate) struct Waiting<'a> {
    desk: &'a Desk,
    key: (String, String),
    id: u64,
    rx: oneshot::Receiver<Delivery>,
}

impl Waiting<'_> {
    /// The answer, or `None` when the place was taken without one.
    pub(crate) async fn answer(&mut self) -> Option<Delivery> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut w = crate::lock(&self.desk.waiting);
        if w.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            w.remove(&self.key);
        }
    }
}

impl Desk {
    /// Puts the attempt of `task_id` of `job_id` on the desk.
    pub(crate) fn wait(&self, job_id: &str, task_id: &str) -> Waiting<'_> {
        let (tx, rx) = oneshot::channel();
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = (job_id.to_owned(), task_id.to_owned());
        crate::lock(&self.waiting).insert(key.clone(), (id, tx));
        Waiting {
            desk: self,
            key,
            id,
            rx,
        }
    }

    /// Takes the waiting attempt of `task_id` off the desk.
    pub(crate) fn take(&self, job_id: &str, task_id: &str) -> Option<oneshot::Sender<Delivery>> {
        crate::lock(&self.waiting)
            .remove(&(job_id.to_owned(), task_id.to_owned()))
            .map(|(_, tx)| tx)
    }
}

/// The input task `task_id` of `e`, if it is one.
fn input_task<'a>(e: &'a JobEntry, task_id: &str) -> Option<&'a InputTask> {
    let i = *e.index.get(task_id)?;
    match &e.spec().tasks[i].kind {
        Some(Kind::Input(t)) => Some(t),
        _ => None,
    }
}

/// Whether `p` may answer an input task that names `answerers`, of a job
/// of `tenant` submitted by `submitted_by`. A cross-tenant service acting
/// for no one never answers; roles count only for the caller's own
/// credential (a service acting for a user carries no roles of the user's).
pub(crate) fn may_answer(
    p: &Principal,
    tenant: &str,
    submitted_by: &str,
    answerers: Option<&InputAnswerers>,
) -> bool {
    if p.tenant_scope().is_none_or(|t| t != tenant) {
        return false;
    }
    let subject = p.acting_subject();
    let named = answerers.filter(|a| !a.subjects.is_empty() || !a.roles.is_empty());
    let Some(a) = named else {
        return subject == submitted_by;
    };
    (a.submitter && subject == submitted_by)
        || a.subjects.iter().any(|s| s == subject)
        || (p.on_behalf_of.is_none()
            && a.roles
                .iter()
                .filter_map(|r| Role::parse(r))
                .filter(|r| ANSWERING_ROLES.contains(r))
                .any(|r| p.roles.has(r)))
}

/// What SendInput decided under the lock.
enum Taken {
    /// The answer went to the attempt; wait for `settled`.
    Delivered(String, oneshot::Receiver<()>),
    /// This key's answer was taken before: the first outcome.
    Replayed(String, String),
}

impl Executor {
    /// SendInput.
    pub(crate) async fn send_input(
        &self,
        p: &Principal,
        req: SendInputRequest,
    ) -> Result<SendInputResponse, ExecutorError> {
        match self.send_input_here(p, &req).await? {
            Some(r) => Ok(r),
            None => self.send_input_stored(p, &req).await,
        }
    }

    /// SendInput to a job in memory here; `None` when it is not.
    pub(crate) async fn send_input_here(
        &self,
        p: &Principal,
        req: &SendInputRequest,
    ) -> Result<Option<SendInputResponse>, ExecutorError> {
        switchyard_core::validate::optional_key(&req.idempotency_key, "idempotency_key")
            .map_err(|why| ExecutorError::Input(Reason::InvalidArgument, why))?;
        let Some(answer) = req.answer.as_ref() else {
            return Err(ExecutorError::Input(
                Reason::InvalidArgument,
                "answer is required: the JSON value the task asks for".into(),
            ));
        };
        let answer = switchyard_kit::json::value_to_json(answer);
        let book = &self.inner.book;
        let job_id = req.job_id.as_str();
        let taken = {
            let mut st = book.lock();
            match st.find(job_id) {
                Some(e) => {
                    let (task_id, t) = answerable(p, e, req)?;
                    if let Some(by) = replayed(e, &task_id, &req.idempotency_key) {
                        Some(Taken::Replayed(task_id, by))
                    } else {
                        let i = e.index[&task_id];
                        if e.task_state(i) != TaskState::InputRequired {
                            return Err(not_waiting(e, &task_id));
                        }
                        if let Some(schema) = t.answer_schema.as_ref() {
                            let schema = switchyard_kit::json::struct_to_json(schema);
                            switchyard_llm::agent::check_schema(&schema, &answer).map_err(
                                |why| {
                                    ExecutorError::Input(
                                        Reason::InvalidArgument,
                                        format!(
                                            "the answer does not match task {task_id:?}'s answer_schema: {why}"
                                        ),
                                    )
                                },
                            )?;
                        }
                        let Some(tx) = self.inner.inputs.take(job_id, &task_id) else {
                            return Err(ExecutorError::Input(
                                Reason::Unavailable,
                                format!(
                                    "task {task_id:?} is resuming after a restart and not waiting yet; send the same answer (same idempotency_key) again in a moment"
                                ),
                            ));
                        };
                        let by = p.acting_subject().to_owned();
                        let r = events::InputReceived {
                            outcome: ANSWERED.to_owned(),
                            by: by.clone(),
                            idempotency_key: req.idempotency_key.clone(),
                            answer: answer.clone(),
                        };
                        let why = format!("answered by {by}");
                        end_wait(book, &mut st, job_id, &task_id, i, r, &why)?;
                        let (settled, done) = oneshot::channel();
                        // The attempt holds its receiver until it ends, and
                        // it cannot end without the book's lock, held here.
                        let _ = tx.send(Delivery {
                            answer,
                            by,
                            settled,
                        });
                        Some(Taken::Delivered(task_id, done))
                    }
                }
                None => None,
            }
        };
        let Some(taken) = taken else {
            return Ok(None);
        };
        let (task_id, by, replayed) = match taken {
            Taken::Delivered(task_id, done) => {
                if done.await.is_err() {
                    return Err(ExecutorError::Input(
                        Reason::Unavailable,
                        format!(
                            "job {job_id:?} stopped before the answer to task {task_id:?} was stored; send it again with the same idempotency_key"
                        ),
                    ));
                }
                (task_id, p.acting_subject().to_owned(), false)
            }
            Taken::Replayed(task_id, by) => {
                // The first call's record may still be on its way to disk.
                book.durable(book.last()).await?;
                (task_id, by, true)
            }
        };
        Ok(Some(SendInputResponse {
            task_id,
            answered_by: by,
            replayed,
            job: Some(self.job(job_id).await?),
        }))
    }

    /// SendInput for a job not in memory here: a retry of an answer
    /// already taken gets its first outcome; a task waiting on another
    /// replica gets the answer through it (PostgreSQL replicas).
    async fn send_input_stored(
        &self,
        p: &Principal,
        req: &SendInputRequest,
    ) -> Result<SendInputResponse, ExecutorError> {
        let job_id = req.job_id.as_str();
        // A finished job's record keeps no answers: its log does.
        let answers = |ev: &JobEvent| matches!(ev, JobEvent::InputReceived(_));
        let Some(e) = self.inner.book.stored_with(job_id, answers).await? else {
            return Err(ExecutorError::NotFound(job_id.into()));
        };
        let Some((task_id, answered_by, job)) = replay_stored(p, &e, req)? else {
            let key = &req.idempotency_key;
            let asked = crate::relay::Asked::Input(req.clone());
            return match self.relay(job_id, key, p, asked).await? {
                crate::relay::Answer::Input(r) => Ok(*r),
                crate::relay::Answer::Message(_) => Err(crate::relay::mismatched(job_id)),
            };
        };
        Ok(SendInputResponse {
            task_id,
            answered_by,
            replayed: true,
            job: Some(job),
        })
    }

    /// ListInputRequests: the waiting input tasks `p` may answer, oldest
    /// first — of the jobs in memory here and (PostgreSQL replicas) of the
    /// ones another replica runs.
    pub(crate) async fn list_input_requests(
        &self,
        p: &Principal,
        req: &ListInputRequestsRequest,
    ) -> Result<ListInputRequestsResponse, ExecutorError> {
        let book = &self.inner.book;
        let mut requests: Vec<(u64, InputRequest)> = Vec::new();
        {
            let st = book.lock();
            for e in st.entries() {
                if req.job_id.is_empty() || e.id() == req.job_id {
                    waiting_in(p, e, &mut requests);
                }
            }
        }
        if book.cluster.shared() {
            let tenant = p.tenant_scope();
            for (id, job) in book.store.open_records(tenant, ELSEWHERE_LISTED).await? {
                let waits = job
                    .tasks
                    .iter()
                    .any(|t| crate::job::task_state(t.state) == TaskState::InputRequired);
                if !waits
                    || (!req.job_id.is_empty() && id != req.job_id)
                    || book.lock().find(&id).is_some()
                {
                    continue;
                }
                let asks = |ev: &JobEvent| {
                    matches!(ev, JobEvent::InputRequested(_) | JobEvent::InputReceived(_))
                };
                if let Some(e) = book.stored_with(&id, asks).await? {
                    waiting_in(p, &e, &mut requests);
                }
            }
        }
        requests.sort_by(|a, b| (a.0, &a.1.job_id).cmp(&(b.0, &b.1.job_id)));
        requests.dedup_by(|a, b| a.1.job_id == b.1.job_id && a.1.task_id == b.1.task_id);
        Ok(ListInputRequestsResponse {
            requests: requests.into_iter().map(|(_, r)| r).collect(),
        })
    }
}

/// How many unfinished jobs run by other replicas ListInputRequests looks
/// through.
const ELSEWHERE_LISTED: usize = 1000;

/// Adds the tasks of `e` waiting for an answer `p` may give to `requests`
/// (with when each was asked).
fn waiting_in(p: &Principal, e: &JobEntry, requests: &mut Vec<(u64, InputRequest)>) {
    for (task_id, asked) in &e.asked {
        let Some(t) = input_task(e, task_id) else {
            continue;
        };
        let i = e.index[task_id];
        if e.task_state(i) != TaskState::InputRequired
            || !may_answer(p, &e.job.tenant, &e.job.submitted_by, t.answerers.as_ref())
        {
            continue;
        }
        let asked_ms = asked
            .deadline_ms
            .saturating_sub(asked.wait_secs.saturating_mul(1000));
        requests.push((
            asked_ms,
            InputRequest {
                job_id: e.id().to_owned(),
                task_id: task_id.clone(),
                prompt: asked.prompt.clone(),
                answer_schema: t.answer_schema.clone(),
                asked_at: Some(switchyard_kit::time::timestamp(asked_ms)),
                deadline: Some(switchyard_kit::time::timestamp(asked.deadline_ms)),
                submitted_by: e.job.submitted_by.clone(),
                correlation_id: e.spec().correlation_id.clone(),
            },
        ));
    }
}

/// Ends task `task_id` (index `i`) of `job_id`'s wait as `r` says: records
/// it (`task.input_received`) and moves the task back to running, under the
/// book's lock. SendInput and the wait's deadline both end a wait here, each
/// after taking the task off the desk, so only one of them does.
pub(crate) fn end_wait(
    book: &JobBook,
    st: &mut Jobs,
    job_id: &str,
    task_id: &str,
    i: usize,
    r: events::InputReceived,
    why: &str,
) -> Result<u64, ExecutorError> {
    let reason = if r.outcome == ANSWERED {
        Reason::InputRequired
    } else {
        Reason::InputTimeout
    };
    book.record(st, job_id, task_id, JobEvent::InputReceived(r));
    book.move_task(
        st,
        job_id,
        i,
        Change::to(TaskState::Running).because(reason, why),
    )
}

/// The id of the job's only input task, if it has exactly one.
fn only_input_task(e: &JobEntry) -> Option<String> {
    let mut inputs = e
        .spec()
        .tasks
        .iter()
        .filter(|t| matches!(t.kind, Some(Kind::Input(_))));
    match (inputs.next(), inputs.next()) {
        (Some(t), None) => Some(t.id.clone()),
        _ => None,
    }
}

/// The input task SendInput means in job `e`, once `p` may reach the job
/// and answer the task: NOT_FOUND, INPUT_NOT_ALLOWED or INPUT_NOT_WAITING
/// otherwise, in that order, so nothing is told to whom may not see it.
fn answerable<'e>(
    p: &Principal,
    e: &'e JobEntry,
    req: &SendInputRequest,
) -> Result<(String, &'e InputTask), ExecutorError> {
    reachable(p, e)?;
    let task_id = waiting_task(e, &req.task_id, &req.idempotency_key)?;
    let t = input_task(e, &task_id).ok_or_else(|| not_waiting(e, &task_id))?;
    authorize(p, e, t)?;
    Ok((task_id, t))
}

/// SendInput's answer for a job not in memory here: the first outcome
/// when this key's answer was taken; `None` when the task waits (on
/// another replica, which takes the answer); else why it does not wait.
fn replay_stored(
    p: &Principal,
    e: &JobEntry,
    req: &SendInputRequest,
) -> Result<Option<(String, String, Job)>, ExecutorError> {
    let (task_id, _) = answerable(p, e, req)?;
    if let Some(by) = replayed(e, &task_id, &req.idempotency_key) {
        return Ok(Some((task_id, by, e.job.clone())));
    }
    if e.task_state(e.index[&task_id]) == TaskState::InputRequired {
        return Ok(None);
    }
    Err(not_waiting(e, &task_id))
}

/// The task SendInput names; else the one this key already answered, the
/// job's one task waiting for input, or its only input task.
fn waiting_task(e: &JobEntry, task_id: &str, key: &str) -> Result<String, ExecutorError> {
    if !task_id.is_empty() {
        return Ok(task_id.to_owned());
    }
    if let Some(t) = e.answered.keys().find(|t| replayed(e, t, key).is_some()) {
        return Ok(t.clone());
    }
    let mut waiting: Vec<&String> = e.asked.keys().collect();
    waiting.sort();
    match (waiting.as_slice(), only_input_task(e)) {
        ([one], _) => Ok((*one).clone()),
        ([], Some(only)) => Ok(only),
        ([], None) => Err(ExecutorError::Input(
            Reason::InputNotWaiting,
            format!(
                "no task of job {:?} waits for input; name the task (task_id) to check its state",
                e.id()
            ),
        )),
        (many, _) => Err(ExecutorError::Input(
            Reason::InvalidArgument,
            format!(
                "{} tasks of job {:?} wait for input ({}); name one in task_id",
                many.len(),
                e.id(),
                many.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Refuses `p` with NOT_FOUND unless it can see the job, answer one of its
/// input tasks or take part in one of its conversations: nothing about the
/// job is told before this.
pub(crate) fn reachable(p: &Principal, e: &JobEntry) -> Result<(), ExecutorError> {
    let (tenant, owner) = (&e.job.tenant, &e.job.submitted_by);
    let answers = e.spec().tasks.iter().any(|t| match &t.kind {
        Some(Kind::Input(t)) => may_answer(p, tenant, owner, t.answerers.as_ref()),
        Some(Kind::Conversation(c)) => may_answer(p, tenant, owner, c.participants.as_ref()),
        _ => false,
    });
    if answers || p.may_see(tenant, owner) {
        Ok(())
    } else {
        Err(ExecutorError::NotFound(e.id().into()))
    }
}

/// Refuses `p` unless the task lets it answer: NOT_FOUND when it cannot
/// see the job either, INPUT_NOT_ALLOWED when it can.
fn authorize(p: &Principal, e: &JobEntry, t: &InputTask) -> Result<(), ExecutorError> {
    let (tenant, owner) = (&e.job.tenant, &e.job.submitted_by);
    if may_answer(p, tenant, owner, t.answerers.as_ref()) {
        return Ok(());
    }
    if p.may_see(tenant, owner) {
        return Err(ExecutorError::Input(
            Reason::InputNotAllowed,
            format!(
                "{:?} may not answer this task: it takes answers from {}",
                p.acting_subject(),
                describe(t.answerers.as_ref())
            ),
        ));
    }
    Err(ExecutorError::NotFound(e.id().into()))
}

/// Who an input task takes answers from, in words.
pub(crate) fn describe(a: Option<&InputAnswerers>) -> String {
    let Some(a) = a.filter(|a| !a.subjects.is_empty() || !a.roles.is_empty()) else {
        return "the job's submitter".into();
    };
    let mut parts = Vec::new();
    if a.submitter {
        parts.push("the job's submitter".to_owned());
    }
    parts.extend(a.subjects.iter().map(|s| format!("{s:?}")));
    parts.extend(a.roles.iter().map(|r| format!("holders of role {r}")));
    parts.join(", ")
}

/// Who answered task `task_id` with `key`, when that answer was taken.
fn replayed(e: &JobEntry, task_id: &str, key: &str) -> Option<String> {
    if key.is_empty() {
        return None;
    }
    e.answered
        .get(task_id)
        .filter(|r| r.outcome == ANSWERED && r.idempotency_key == key)
        .map(|r| r.by.clone())
}

/// INPUT_NOT_WAITING for task `task_id` of `e`, with its state.
fn not_waiting(e: &JobEntry, task_id: &str) -> ExecutorError {
    let Some(&i) = e.index.get(task_id) else {
        return ExecutorError::Input(
            Reason::InputNotWaiting,
            format!("job {:?} has no task {task_id:?}", e.id()),
        );
    };
    let state = e.task_state(i);
    let why = match (input_task(e, task_id), e.answered.get(task_id)) {
        (None, _) => "it is not an input task".to_owned(),
        (Some(_), Some(r)) if r.outcome == ANSWERED => format!("{} answered it", r.by),
        (Some(_), Some(_)) => "its wait ran out".to_owned(),
        (Some(_), None) => format!("it is {state}"),
    };
    ExecutorError::Input(
        Reason::InputNotWaiting,
        format!(
            "task {task_id:?} of job {:?} does not wait for input: {why}",
            e.id()
        ),
    )
}

#[cfg(test)]
mod tests {
    use switchyard_kit::auth::{Kind as PKind, Method, OnBehalf};

    use super::*;

    fn person(subject: &str, tenant: &str, roles: &[Role]) -> Principal {
        Principal::user(subject, tenant, roles, PKind::Human, Method::ApiKey)
    }

    fn named(submitter: bool, subjects: &[&str], roles: &[&str]) -> InputAnswerers {
        InputAnswerers {
            submitter,
            subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
            roles: roles.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn who_may_answer_is_what_the_task_names_within_the_jobs_tenant() {
        let alice = person("alice", "t1", &[Role::Submitter]);
        let carol = person("carol", "t1", &[Role::Submitter]);
        let bob = person("bob", "t1", &[Role::Approver]);
        let carol_elsewhere = person("carol", "t2", &[Role::Submitter, Role::Approver]);
        let may = |p: &Principal, a: Option<&InputAnswerers>| may_answer(p, "t1", "alice", a);
        // Nobody named: the submitter alone (an empty list is no list).
        for a in [None, Some(&named(false, &[], &[]))] {
            assert!(may(&alice, a));
            assert!(!may(&carol, a));
            assert!(!may(&bob, a));
        }
        // Named subjects, not the submitter unless said.
        let carol_only = named(false, &["carol"], &[]);
        assert!(may(&carol, Some(&carol_only)));
        assert!(!may(&alice, Some(&carol_only)));
        assert!(
            !may(&carol_elsewhere, Some(&carol_only)),
            "another tenant's carol"
        );
        let both = named(true, &["carol"], &[]);
        assert!(may(&alice, Some(&both)) && may(&carol, Some(&both)));
        // Roles: held by the caller's own credential; unknown or unfit roles
        // grant nothing.
        let approvers = named(false, &[], &["approver", "agent", "nonsense"]);
        assert!(may(&bob, Some(&approvers)));
        assert!(!may(&alice, Some(&approvers)));
        assert!(!may(&carol_elsewhere, Some(&approvers)));
        let agent = Principal::user("carol", "t1", &[Role::Agent], PKind::Agent, Method::ApiKey);
        assert!(!may(&agent, Some(&named(false, &[], &["agent"]))));
        // A service acting for bob answers as bob, without bob's roles; one
        // acting for no one never answers.
        let service = Principal::in_process();
        let for_bob = service.acting_for(OnBehalf {
            subject: "bob".into(),
            tenant: "t1".into(),
            kind: PKind::Human,
        });
        assert!(!may(&for_bob, Some(&approvers)));
        assert!(may(&for_bob, Some(&named(false, &["bob"], &[]))));
        assert!(!may(&service, Some(&named(true, &["alice"], &["admin"]))));
    }
}
