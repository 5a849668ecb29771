//! The job journal's hash chain and its signed heads (issue 46; see
//! `docs/audit.md`).
//!
//! Each job's events are stream `job/<id>` of the chain in
//! [`switchyard_kit::chain`]: event `n` (its `sequence`) carries the hash
//! of event `n - 1` in its `chain` link, and its own hash covers its
//! protobuf encoding with that link. The book links each event as it
//! records it ([`crate::book::JobBook::record_at`]) and a job's head
//! follows every event applied to it ([`next_head`]), on replay too — one
//! place, whatever the backend.
//!
//! When a job makes its final move, the executor signs its head with the
//! deployment's key, with a summary of the job (state, tenant, submitter,
//! tasks, when it finished), and keeps that **seal** beside the jobs (space
//! `sealed_heads`) in the same write as the move, fenced like it — so any
//! replica that sees the job finished finds its seal, and a replica that
//! lost the job writes neither. On the embedded store the job is sealed
//! again when it retires, over whatever was recorded after the move. A seal outlives the job's records when
//! they are pruned, so what was pruned is still vouched for.
//!
//! [`check_job`] verifies one job as stored: its chain, and its seal
//! against the trusted public keys.

use prost::Message as _;
use serde_json::{Value, json};
use switchyard_kit::chain::{self, AuditConfig, Break, Head, Verifier};
use switchyard_kit::receipt::{Receipt, ReceiptKey};
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::Job;

use crate::error::ExecutorError;
use crate::store::Kept;

/// Where the seals are kept, by job id.
pub(crate) const SEALS: &str = "sealed_heads";
/// Where a key the executor made itself is kept (no `audit.key_file`).
pub(crate) const KEYS: &str = "audit_key";
/// Where each running job's latest periodic checkpoint is kept, by job id.
pub(crate) const LIVE: &str = "live_heads";

/// Job `job_id`'s stream.
pub fn stream(job_id: &str) -> String {
    format!("job/{job_id}")
}

/// Where `ev` sits in its job's chain: its stored link, or, for an event
/// written before chains (no link), the place after `head`.
fn link_of(ev: &Event, head: Head) -> (u64, chain::Hash, bool) {
    match &ev.chain {
        Some(l) => {
            // A link of the wrong length links to nothing: it fails the
            // check against the head (never equal to a real hash's bytes).
            let prev = chain::stored_hash(&l.prev);
            (l.n, prev, true)
        }
        None => (ev.sequence, head.hash, false),
    }
}

/// The job's head once `ev` is applied after `head` (what the book keeps
/// for each job; public for the benchmark).
pub fn next_head(head: Head, ev: &Event) -> Head {
    let (n, prev, _) = link_of(ev, head);
    Head {
        n,
        hash: chain::link(&stream(&ev.job_id), n, &prev, &ev.encode_to_vec()),
    }
}

/// The executor's signing key and its seals.
pub(crate) struct Seal {
    key: ReceiptKey,
    trusted: Vec<String>,
    seals: Kept<Vec<u8>>,
    live: Kept<Vec<u8>>,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal").field("key", &self.key).finish()
    }
}

impl Seal {
    /// The seal of `cfg`'s key file, else of the key kept in `keys` (made
    /// and kept there on first start), keeping seals in `seals` and running
    /// jobs' periodic checkpoints in `live`.
    pub(crate) async fn open(
        cfg: &AuditConfig,
        keys: Kept<Vec<u8>>,
        seals: Kept<Vec<u8>>,
        live: Kept<Vec<u8>>,
    ) -> Result<Seal, ExecutorError> {
        let bad = |e: String| ExecutorError::Audit(e);
        let key = match cfg.file_key().map_err(bad)? {
            Some(k) => k,
            None => match keys.get("seed").await? {
                Some(seed) => ReceiptKey::from_seed(&seed).map_err(|e| bad(e.to_string()))?,
                None => {
                    let (made, seed) = ReceiptKey::generate().map_err(|e| bad(e.to_string()))?;
                    // Another replica may have made one meanwhile: the
                    // first kept is everyone's.
                    let kept = keys.put_absent("seed", seed.to_vec()).await?;
                    let key = ReceiptKey::from_seed(&kept).map_err(|e| bad(e.to_string()))?;
                    if key.id() == made.id() {
                        tracing::info!(key_id = key.id(), "made the journal signing key");
                    }
                    key
                }
            },
        };
        let trusted = cfg.trusted(&key);
        Ok(Seal {
            key,
            trusted,
            seals,
            live,
        })
    }

    /// Signs running job `job`'s `head` at `at_ms` (a periodic checkpoint)
    /// and keeps it in place of the last. Only a head whose records are
    /// durable is signed (the caller waits), so no crash leaves a
    /// checkpoint ahead of the journal.
    pub(crate) fn checkpoint(&self, job_id: &str, job: &Job, head: Head, at_ms: u64) {
        let mut summary = summary(job_id, job);
        summary["live"] = Value::Bool(true);
        let r = chain::checkpoint_with(&self.key, &[(stream(job_id), head)], at_ms, summary);
        let bytes = serde_json::to_vec(&r).unwrap_or_default();
        if let Err(e) = self.live.put(job_id, &bytes) {
            tracing::error!(job_id, error = %e, "keeping a journal checkpoint");
        }
    }

    /// Job `job_id`'s latest periodic checkpoint (`None`: none).
    pub(crate) async fn checkpointed(&self, job_id: &str) -> Result<Option<Sealed>, ExecutorError> {
        Ok(self.live.get(job_id).await?.map(|b| Sealed::parse(&b)))
    }

    /// The public keys a seal may carry.
    pub(crate) fn trusted(&self) -> &[String] {
        &self.trusted
    }

    /// The signing key's id.
    pub(crate) fn key_id(&self) -> &str {
        self.key.id()
    }

    /// The seal of finished job `job`'s `head` at `at_ms`, as kept (JSON).
    pub(crate) fn signed(&self, job_id: &str, job: &Job, head: Head, at_ms: u64) -> Vec<u8> {
        let r = seal_of(&self.key, job_id, job, head, at_ms);
        // A receipt is JSON text and numbers: it always serializes.
        serde_json::to_vec(&r).unwrap_or_default()
    }

    /// Signs finished job `job`'s `head` at `at_ms` and keeps the seal.
    pub(crate) fn seal(&self, job_id: &str, job: &Job, head: Head, at_ms: u64) {
        let bytes = self.signed(job_id, job, head, at_ms);
        if let Err(e) = self.seals.put(job_id, &bytes) {
            tracing::error!(job_id, error = %e, "keeping a journal seal");
        }
    }

    /// Job `job_id`'s seal, as kept (`None`: none).
    pub(crate) async fn sealed(&self, job_id: &str) -> Result<Option<Sealed>, ExecutorError> {
        Ok(self.seals.get(job_id).await?.map(|b| Sealed::parse(&b)))
    }

    /// Every seal kept, by job id.
    pub(crate) async fn all(&self) -> Result<Vec<(String, Sealed)>, ExecutorError> {
        Ok(self
            .seals
            .list()
            .await?
            .into_iter()
            .map(|(k, b)| (k, Sealed::parse(&b)))
            .collect())
    }
}

/// The seal of finished job `job` (`job_id`) whose journal's head is
/// `head`, signed with `key` at `at_ms`.
pub fn seal_of(key: &ReceiptKey, job_id: &str, job: &Job, head: Head, at_ms: u64) -> Receipt {
    chain::checkpoint_with(key, &[(stream(job_id), head)], at_ms, summary(job_id, job))
}

/// A seal as kept: the signed checkpoint, or why it cannot be read.
#[derive(Debug, Clone)]
pub(crate) enum Sealed {
    /// The signed checkpoint.
    Receipt(Box<Receipt>),
    /// Not a receipt (its bytes were damaged or replaced).
    Unreadable(String),
}

impl Sealed {
    fn parse(b: &[u8]) -> Sealed {
        match serde_json::from_slice::<Receipt>(b) {
            Ok(r) => Sealed::Receipt(Box::new(r)),
            Err(e) => Sealed::Unreadable(e.to_string()),
        }
    }
}

/// What a seal says of a finished job besides its head.
fn summary(job_id: &str, job: &Job) -> Value {
    let state = switchyard_proto::executor::v1::JobState::try_from(job.state)
        .map(|s| s.as_str_name().to_owned())
        .unwrap_or_default();
    json!({
        "job_id": job_id,
        "tenant": job.tenant,
        "submitted_by": job.submitted_by,
        "state": state,
        "tasks": job.tasks.len() as u64,
        "finished_at_ms": job.finished_at.as_ref().map(switchyard_kit::time::timestamp_ms),
        "budget_id": job.budget_id,
        "run_id": job.run_id,
    })
}

/// What verifying one job found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCheck {
    /// The job.
    pub job_id: String,
    /// Events checked.
    pub records: u64,
    /// Of them, written before chains (no link): checked for order only.
    pub unlinked: u64,
    /// The head reached.
    pub head: Head,
    /// The key id of the seal that vouches for the head (finished jobs).
    pub sealed_by: Option<String>,
    /// The record a periodic checkpoint vouched for (running jobs).
    pub checkpointed: Option<u64>,
    /// The first problem found (`None`: it verifies).
    pub problem: Option<String>,
}

/// Verifies job `job_id`'s `events` (as stored, in order): that they
/// still reach, unchanged, the record its latest periodic checkpoint
/// (`live`) signed, and when it `finished`, its `seal` — each against
/// `trusted` keys.
pub(crate) fn check_job(
    job_id: &str,
    events: &[Event],
    finished: bool,
    seal: Option<&Sealed>,
    live: Option<&Sealed>,
    trusted: &[String],
) -> JobCheck {
    let stream = stream(job_id);
    let mut v = Verifier::new();
    let mut at = std::collections::HashMap::new();
    let mut out = JobCheck {
        job_id: job_id.to_owned(),
        records: 0,
        unlinked: 0,
        head: Head::default(),
        sealed_by: None,
        checkpointed: None,
        problem: None,
    };
    let mut linked_seen = false;
    for ev in events {
        let head = v.heads().head(&stream);
        let (n, prev, linked) = link_of(ev, head);
        if ev.job_id != job_id {
            out.problem = Some(format!(
                "stream {stream:?}, record {n}: it belongs to job {:?} (a record was moved between jobs)",
                ev.job_id
            ));
            return out;
        }
        if linked {
            linked_seen = true;
        } else if linked_seen {
            out.problem = Some(format!(
                "stream {stream:?}, record {n}: its chain link was removed (records after the first linked one all carry one)"
            ));
            return out;
        } else {
            out.unlinked += 1;
        }
        if linked && n != ev.sequence {
            out.problem = Some(
                Break::Sequence {
                    stream: stream.clone(),
                    expected: ev.sequence,
                    found: n,
                }
                .to_string(),
            );
            return out;
        }
        if let Err(b) = v.check(&stream, n, &prev, &ev.encode_to_vec()) {
            out.problem = Some(b.to_string());
            return out;
        }
        at.insert(n, v.heads().head(&stream).hash);
        out.records += 1;
    }
    out.head = v.heads().head(&stream);
    // The journal must still reach, unchanged, the record its latest
    // periodic checkpoint signed (what a rewrite while the executor was
    // stopped, before the job finished, would not).
    if let Some(live) = live {
        let checked = signed_heads(&stream, "checkpoint", live, trusted).and_then(|(head, _)| {
            v.against(&[(stream.clone(), head)], |_, n| at.get(&n).copied())
                .map(|()| head.n)
                .map_err(|b| b.to_string())
        });
        match checked {
            Ok(n) => out.checkpointed = Some(n),
            Err(p) => {
                out.problem = Some(p);
                return out;
            }
        }
    }
    if !finished {
        return out;
    }
    let r = match seal {
        Some(Sealed::Receipt(r)) => r,
        Some(Sealed::Unreadable(why)) => {
            out.problem = Some(format!(
                "stream {stream:?}: its seal cannot be read ({why}): it was damaged or replaced"
            ));
            return out;
        }
        // Finished before journals were chained: none of its events
        // carries a link, and it was never sealed.
        None if !linked_seen => return out,
        None => {
            out.problem = Some(format!(
                "stream {stream:?}: the job finished but no signed seal vouches for its journal (it was removed)"
            ));
            return out;
        }
    };
    match chain::verify_checkpoint_summary(r, trusted) {
        Ok(signed) => {
            let heads = signed.heads;
            if let Some((s, _)) = heads.iter().find(|(s, _)| *s != stream) {
                out.problem = Some(format!(
                    "stream {stream:?}: its seal vouches for stream {s:?} (a seal was moved between jobs)"
                ));
                return out;
            }
            if signed.summary["live"] == true {
                out.problem = Some(format!(
                    "stream {stream:?}: its seal is a checkpoint of the job while it ran, not of its end (a checkpoint was put in the seal's place)"
                ));
                return out;
            }
            if let Err(b) = v.against(&heads, |_, n| at.get(&n).copied()) {
                out.problem = Some(b.to_string());
                return out;
            }
            out.sealed_by = Some(r.key_id.clone());
        }
        Err(e) => out.problem = Some(format!("stream {stream:?}: {e}")),
    }
    out
}

/// The heads `seal` (a job's seal or periodic checkpoint: `what`) signed
/// — its own stream's only — and its summary, once its signature holds
/// under `trusted`; else what is wrong.
fn signed_heads(
    stream: &str,
    what: &str,
    seal: &Sealed,
    trusted: &[String],
) -> Result<(Head, Value), String> {
    let Sealed::Receipt(r) = seal else {
        return Err(format!(
            "stream {stream:?}: its {what} cannot be read: it was damaged or replaced"
        ));
    };
    let signed = chain::verify_checkpoint_summary(r, trusted)
        .map_err(|e| format!("stream {stream:?}: {e}"))?;
    match signed.heads.as_slice() {
        [(s, h)] if s == stream => Ok((*h, signed.summary)),
        _ => Err(format!(
            "stream {stream:?}: its {what} vouches for another stream (a {what} was moved between jobs)"
        )),
    }
}

/// The seal's summary and head, for a pruned job (its records gone):
/// `Ok` when the seal holds under `trusted` and closes the job.
pub(crate) fn check_pruned(
    job_id: &str,
    seal: &Sealed,
    trusted: &[String],
) -> Result<(Head, Value), String> {
    let stream = stream(job_id);
    let (head, summary) = signed_heads(&stream, "seal", seal, trusted)?;
    if summary["live"] == true {
        return Err(format!(
            "stream {stream:?}: its seal is a checkpoint of the job while it ran, not of its end (a checkpoint was put in the seal's place)"
        ));
    }
    Ok((head, summary))
}

/// Whether a stored job has finished (its seal is due).
pub(crate) fn finished(job: &Job) -> bool {
    use switchyard_proto::executor::v1::JobState as S;
    matches!(
        S::try_from(job.state),
        Ok(S::Completed | S::Cancelled | S::Discarded)
    )
}

impl crate::Executor {
    /// Signs the head of each job held here whose journal moved since its
    /// last checkpoint (`[audit] checkpoint_ms`), once the records it
    /// vouches for are durable: a crash never leaves a checkpoint ahead of
    /// the journal. A job that left meanwhile (retired, or taken over by
    /// another replica after its writes were refused) is skipped.
    pub(crate) async fn checkpoint_journals(&self) -> Result<(), ExecutorError> {
        let book = &self.inner.book;
        let moved: Vec<(String, Head)> = book
            .lock()
            .entries()
            .filter(|e| e.chain.n > e.checkpointed && !finished(&e.job))
            .map(|e| (e.id().to_owned(), e.chain))
            .collect();
        if moved.is_empty() {
            return Ok(());
        }
        book.durable(book.last()).await?;
        let held: Vec<(String, Head, Job, bool)> = {
            let st = book.lock();
            moved
                .into_iter()
                .filter_map(|(id, head)| {
                    let e = st.find(&id)?;
                    Some((id, head, e.job.clone(), e.checkpointed == 0))
                })
                .collect()
        };
        let now = book.now();
        let mut signed = Vec::with_capacity(held.len());
        for (id, head, job, first) in held {
            // The first time in this process: the journal as stored must
            // still be what the last checkpoint signed, or signing its head
            // now would vouch for a rewrite made while it was stopped.
            if first && let Some(problem) = self.changed_since_checkpoint(&id).await? {
                tracing::error!(
                    job_id = %id,
                    problem,
                    "a running job's journal no longer matches its last signed checkpoint (changed while the executor was stopped): the checkpoint is kept as it is and no new one is signed over it"
                );
                signed.push((id, u64::MAX));
                continue;
            }
            book.seal.checkpoint(&id, &job, head, now);
            signed.push((id, head.n));
        }
        let mut st = book.lock();
        for (id, n) in signed {
            if let Some(e) = st.find_mut(&id) {
                e.checkpointed = e.checkpointed.max(n);
            }
        }
        Ok(())
    }

    /// What breaks between job `id`'s stored journal and its last periodic
    /// checkpoint (`None`: nothing, or no checkpoint).
    async fn changed_since_checkpoint(&self, id: &str) -> Result<Option<String>, ExecutorError> {
        let seal = &self.inner.book.seal;
        let Some(kept) = seal.checkpointed(id).await? else {
            return Ok(None);
        };
        let events = self.journal_of(id).await?;
        Ok(check_job(id, &events, false, None, Some(&kept), seal.trusted()).problem)
    }

    /// Job `id`'s events as stored, in the journal's order (its positions
    /// from memory when it is held here).
    pub(crate) async fn journal_of(&self, id: &str) -> Result<Vec<Event>, ExecutorError> {
        let book = &self.inner.book;
        let positions = book.lock().find(id).map(|e| e.events.clone());
        book.store
            .events(id, 0, u64::MAX, positions.as_deref().unwrap_or_default())
            .await
    }

    /// Whether job `id`'s journal (`events`, its record `job`) verifies, in
    /// words: `verifies, sealed by key …`, `verifies (…not finished…)`, or
    /// where it breaks.
    pub(crate) async fn check_journal(
        &self,
        id: &str,
        job: &Job,
        events: &[Event],
    ) -> Result<String, ExecutorError> {
        let (due, kept, live) = self.due_seal(id, job).await?;
        let c = check_job(
            id,
            events,
            due,
            kept.as_ref(),
            live.as_ref(),
            self.inner.book.seal.trusted(),
        );
        Ok(match (c.problem, c.sealed_by, c.checkpointed) {
            (Some(p), _, _) => format!("does not verify: {p}"),
            (None, Some(k), _) => format!("verifies ({} events), sealed by key {k}", c.records),
            (None, None, Some(n)) => format!(
                "verifies ({} events; a signed checkpoint vouches for the first {n}; sealed once the job has finished and left memory)",
                c.records
            ),
            (None, None, None) => format!(
                "verifies ({} events; sealed once the job has finished and left memory)",
                c.records
            ),
        })
    }

    /// Whether job `id`'s seal is due — it finished (`job`, its record)
    /// and is no longer in memory here, where its record may be ahead of
    /// the store — the seal kept when it is, and its latest periodic
    /// checkpoint.
    async fn due_seal(
        &self,
        id: &str,
        job: &Job,
    ) -> Result<(bool, Option<Sealed>, Option<Sealed>), ExecutorError> {
        let due = self.inner.book.lock().find(id).is_none() && finished(job);
        let seal = &self.inner.book.seal;
        let kept = if due { seal.sealed(id).await? } else { None };
        Ok((due, kept, seal.checkpointed(id).await?))
    }

    /// Job `id`'s journal as a self-contained copy (ExportJournal).
    pub async fn export_journal(
        &self,
        id: &str,
    ) -> Result<switchyard_proto::executor::v1::ExportJournalResponse, ExecutorError> {
        let job = self.job(id).await?;
        let events = self.journal_of(id).await?;
        let (due, kept, live) = self.due_seal(id, &job).await?;
        // Its seal once it finished, else its latest periodic checkpoint.
        let seal = match if due { kept } else { live } {
            Some(Sealed::Receipt(r)) => serde_json::to_string(&r).unwrap_or_default(),
            _ => String::new(),
        };
        Ok(switchyard_proto::executor::v1::ExportJournalResponse {
            job_id: id.to_owned(),
            events,
            finished: due,
            seal,
            public_keys: self.inner.book.seal.trusted().to_vec(),
            policy_version: self
                .run_policy(&job.run_id)
                .await
                .map(|p| p.version)
                .unwrap_or_default(),
        })
    }
}

/// Checks an exported journal (`switchyard audit verify --bundle`) with no
/// access to the deployment: its chain, and against `trusted` public keys
/// its seal when the job had finished, else its latest checkpoint.
pub fn check_export(
    x: &switchyard_proto::executor::v1::ExportJournalResponse,
    trusted: &[String],
) -> JobCheck {
    let seal = (!x.seal.is_empty()).then(|| Sealed::parse(x.seal.as_bytes()));
    let (end, live) = if x.finished {
        (seal.as_ref(), None)
    } else {
        (None, seal.as_ref())
    };
    check_job(&x.job_id, &x.events, x.finished, end, live, trusted)
}

/// Jobs read per store page while verifying.
const PAGE: usize = 256;

impl crate::Executor {
    /// Verifies the journals of every stored job (of `tenant` when given;
    /// only job `only` when given) and the seals of pruned ones.
    pub async fn verify_journals(
        &self,
        tenant: Option<&str>,
        only: Option<&str>,
    ) -> Result<switchyard_proto::executor::v1::VerifyJournalsResponse, ExecutorError> {
        use switchyard_proto::executor::v1::{JournalProblem, VerifyJournalsResponse};
        let book = &self.inner.book;
        let seal = &book.seal;
        let trusted = seal.trusted();
        let mut out = VerifyJournalsResponse {
            key_id: seal.key_id().to_owned(),
            trusted_key_ids: trusted
                .iter()
                .filter_map(|k| switchyard_kit::receipt::key_id_of(k))
                .collect(),
            ..Default::default()
        };
        let mut seen = std::collections::HashSet::new();
        let check = |out: &mut VerifyJournalsResponse, c: JobCheck| {
            out.jobs += 1;
            out.records += c.records;
            out.unlinked += c.unlinked;
            if c.sealed_by.is_some() {
                out.sealed += 1;
            }
            if c.checkpointed.is_some() {
                out.checkpointed += 1;
            }
            if let Some(problem) = c.problem {
                out.problems.push(JournalProblem {
                    job_id: c.job_id,
                    problem,
                });
            }
        };
        let ids: Vec<(String, Job)> = match only {
            Some(id) => {
                let job = book.record_of(id).await?;
                vec![(id.to_owned(), job)]
            }
            None => {
                let mut all = Vec::new();
                let mut before: Option<(u64, String)> = None;
                loop {
                    let page = book
                        .store
                        .page(before.as_ref().map(|(c, id)| (*c, id.as_str())), PAGE)
                        .await?;
                    let full = page.len() == PAGE;
                    for (id, record) in page {
                        before = Some((crate::book::created_ms(&record), id.clone()));
                        all.push((id, record));
                    }
                    if !full {
                        break;
                    }
                }
                all
            }
        };
        for (id, record) in ids {
            seen.insert(id.clone());
            // In memory here: its positions, and whether it may be sealed
            // yet (a job in memory has not retired).
            let held = book
                .lock()
                .find(&id)
                .map(|e| (e.events.clone(), e.job.tenant.clone()));
            let record = match (&held, record.state) {
                (None, 0) => match book.store.record(&id).await? {
                    Some(r) => r,
                    None => continue,
                },
                _ => record,
            };
            let job_tenant = held
                .as_ref()
                .map_or(record.tenant.as_str(), |(_, t)| t.as_str());
            if tenant.is_some_and(|t| t != job_tenant) {
                if only.is_some() {
                    return Err(ExecutorError::NotFound(id));
                }
                continue;
            }
            let events = match self.journal_of(&id).await {
                Ok(events) => events,
                Err(e) => {
                    check(
                        &mut out,
                        JobCheck {
                            job_id: id.clone(),
                            records: 0,
                            unlinked: 0,
                            head: Head::default(),
                            sealed_by: None,
                            checkpointed: None,
                            problem: Some(format!(
                                "stream {:?}: its events cannot be read ({e}): records were damaged or removed",
                                stream(&id)
                            )),
                        },
                    );
                    continue;
                }
            };
            let (due, kept, live) = self.due_seal(&id, &record).await?;
            check(
                &mut out,
                check_job(&id, &events, due, kept.as_ref(), live.as_ref(), trusted),
            );
        }
        if only.is_some() {
            return Ok(out);
        }
        // Seals of jobs no longer stored: pruned, their summaries signed.
        for (id, s) in seal.all().await? {
            if seen.contains(&id) {
                continue;
            }
            match check_pruned(&id, &s, trusted) {
                Ok((_, summary)) => {
                    if tenant.is_some_and(|t| summary["tenant"].as_str() != Some(t)) {
                        continue;
                    }
                    out.pruned += 1;
                }
                Err(problem) if tenant.is_none() => out.problems.push(JournalProblem {
                    job_id: id,
                    problem,
                }),
                // A damaged seal names no tenant it can be trusted for:
                // the service token sees it.
                Err(_) => {}
            }
        }
        Ok(out)
    }
}

/// A recorded decision a replay decides differently.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Replayed {
    /// The event's sequence in the job's journal.
    pub sequence: u64,
    /// The step it was for ("" for the job's own).
    pub task_id: String,
    /// When it was decided, ms since the epoch.
    pub at_ms: u64,
    /// The action (`submit_job`, `spend`, `call_tool`, ...).
    pub action: String,
    /// What it acted on.
    pub resource: String,
    /// The version of the set that decided it.
    pub version: String,
    /// How it would differ.
    #[serde(flatten)]
    pub difference: switchyard_policy::Difference,
}

/// One job's journal replayed under another policy set.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct JobReplay {
    /// How many recorded decisions it holds.
    pub decisions: u64,
    /// Those the set decides differently, in the journal's order.
    pub differences: Vec<Replayed>,
    /// Recorded decisions whose facts do not read (a journal edited by
    /// hand, or from a later release): sequence and why.
    pub unreadable: Vec<(u64, String)>,
}

/// Decides again, under `set`, every decision `events` (one job's journal,
/// in order) recorded with its facts (`policy.decided`); calls nothing.
pub fn replay_journal(set: &switchyard_policy::PolicySet, events: &[Event]) -> JobReplay {
    let mut out = JobReplay::default();
    for ev in events.iter().filter(|e| e.kind == "policy.decided") {
        out.decisions += 1;
        let recorded = match crate::events::JobEvent::decode(&ev.kind, ev.data.as_ref()) {
            Ok(Some(crate::events::JobEvent::PolicyDecided(r))) => *r,
            Ok(_) => continue,
            Err(e) => {
                out.unreadable.push((ev.sequence, e.to_string()));
                continue;
            }
        };
        if let Some(difference) = switchyard_policy::replay(set, &recorded) {
            out.differences.push(Replayed {
                sequence: ev.sequence,
                task_id: ev.task_id.clone(),
                at_ms: recorded.facts.now_ms,
                action: recorded.facts.action.as_str().to_owned(),
                resource: recorded.facts.resource.clone(),
                version: recorded.version.clone(),
                difference,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::common::v1::ChainLink;

    /// `n` events of job `j`, linked as the book links them (the first
    /// `legacy` written before chains: no link).
    fn events(n: u64, legacy: u64) -> Vec<Event> {
        let mut head = Head::default();
        (1..=n)
            .map(|seq| {
                let mut ev = Event {
                    sequence: seq,
                    job_id: "j".into(),
                    kind: "job.state".into(),
                    ..Default::default()
                };
                if seq > legacy {
                    ev.chain = Some(ChainLink {
                        n: seq,
                        prev: head.hash.to_vec(),
                    });
                }
                head = next_head(head, &ev);
                ev
            })
            .collect()
    }

    #[test]
    fn a_journal_linked_as_written_verifies_and_reaches_the_books_head() {
        let evs = events(5, 0);
        let c = check_job("j", &evs, false, None, None, &[]);
        assert_eq!(c.problem, None);
        assert_eq!((c.records, c.unlinked), (5, 0));
        let head = evs.iter().fold(Head::default(), next_head);
        assert_eq!(c.head, head);
    }

    #[test]
    fn events_from_before_chains_count_as_unlinked_but_a_stripped_link_does_not_pass() {
        // Written before chains, then linked: verifies, said.
        let evs = events(5, 2);
        let c = check_job("j", &evs, false, None, None, &[]);
        assert_eq!(c.problem, None, "{c:?}");
        assert_eq!(c.unlinked, 2);
        // Finished before chains: no link, never sealed — counted, not
        // refused (an upgraded deployment's history).
        let c = check_job("j", &events(3, 3), true, None, None, &[]);
        assert_eq!((c.problem, c.unlinked), (None, 3));
        // A link removed after linked records began.
        let mut stripped = events(5, 0);
        stripped[3].chain = None;
        let p = check_job("j", &stripped, false, None, None, &[])
            .problem
            .unwrap();
        assert!(p.contains("record 4: its chain link was removed"), "{p}");
        // An event of another job put in.
        let mut moved = events(5, 0);
        moved[2].job_id = "k".into();
        let p = check_job("j", &moved, false, None, None, &[])
            .problem
            .unwrap();
        assert!(p.contains("belongs to job \"k\""), "{p}");
    }

    #[test]
    fn a_finished_job_needs_a_seal_over_its_own_head_by_a_trusted_key() {
        let evs = events(4, 0);
        let head = evs.iter().fold(Head::default(), next_head);
        let mid_head = evs[..2].iter().fold(Head::default(), next_head);
        let (key, _) = ReceiptKey::generate().unwrap();
        let trusted = vec![key.public_key()];
        let job = Job::default();
        let seal = |h: Head| {
            Sealed::Receipt(Box::new(chain::checkpoint_with(
                &key,
                &[(stream("j"), h)],
                7,
                summary("j", &job),
            )))
        };
        let ok = check_job("j", &evs, true, Some(&seal(head)), None, &trusted);
        assert_eq!(ok.problem, None);
        assert_eq!(ok.sealed_by.as_deref(), Some(key.id()));
        let p = check_job("j", &evs, true, None, None, &trusted)
            .problem
            .unwrap();
        assert!(p.contains("no signed seal"), "{p}");
        let p = check_job(
            "j",
            &evs,
            true,
            Some(&Sealed::Unreadable("x".into())),
            None,
            &trusted,
        )
        .problem
        .unwrap();
        assert!(p.contains("cannot be read"), "{p}");
        let p = check_job("j", &evs[..3], true, Some(&seal(head)), None, &trusted)
            .problem
            .unwrap();
        assert!(p.contains("truncated"), "{p}");
        let p = check_job("j", &evs, true, Some(&seal(head)), None, &[])
            .problem
            .unwrap();
        assert!(p.contains("not one of the deployment's keys"), "{p}");
        // A checkpoint taken while it ran, put in the seal's place: it
        // vouches for an earlier head, and is refused as an end.
        let mut live = summary("j", &job);
        live["live"] = Value::Bool(true);
        let mid = chain::checkpoint_with(&key, &[(stream("j"), mid_head)], 5, live);
        let mid = Sealed::Receipt(Box::new(mid));
        let p = check_job("j", &evs, true, Some(&mid), None, &trusted)
            .problem
            .unwrap();
        assert!(
            p.contains("a checkpoint was put in the seal's place"),
            "{p}"
        );
        assert!(check_pruned("j", &mid, &trusted).is_err());
        // As the checkpoint it is, it holds, for the job running or ended.
        let c = check_job("j", &evs, false, None, Some(&mid), &trusted);
        assert_eq!((c.problem, c.checkpointed), (None, Some(mid_head.n)));
        let c = check_job("j", &evs, true, Some(&seal(head)), Some(&mid), &trusted);
        assert_eq!((c.problem, c.checkpointed), (None, Some(mid_head.n)));
        // An edit before it is found by the chain; of the record it signed
        // (the last when it was taken), by the checkpoint alone.
        let mut edited = evs.clone();
        edited[mid_head.n as usize - 1].kind = "job.stat3".into();
        let p = check_job(
            "j",
            &edited[..mid_head.n as usize],
            false,
            None,
            Some(&mid),
            &trusted,
        )
        .problem
        .unwrap();
        assert!(
            p.contains("not the one the signed checkpoint vouches for"),
            "{p}"
        );
        // A pruned job: the seal alone, with its summary.
        let (h, s) = check_pruned("j", &seal(head), &trusted).unwrap();
        assert_eq!(h, head);
        assert_eq!(s["job_id"], "j");
        assert!(check_pruned("k", &seal(head), &trusted).is_err());
    }
}
