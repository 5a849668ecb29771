//! Tamper-evident job journals (issue 46 §1): every way of rewriting a
//! finished job's stored history — editing, deleting, inserting,
//! reordering or cutting off its events, replacing, re-signing or removing
//! its seal — is found by VerifyJournals with where the chain breaks, on
//! sled (the data directory edited offline, CRCs fixed as a careful
//! attacker would) and on PostgreSQL (rows edited with psql); a clean
//! history verifies, after a key rotation and after pruning too.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use std::path::{Path, PathBuf};

use prost::Message as _;
use switchyard_kit::chain::{self, Head};
use switchyard_kit::hex::encode as hex;
use switchyard_kit::receipt::ReceiptKey;
use switchyard_proto::common::v1::Event;
use switchyard_proto::executor::v1::job_service_client::JobServiceClient;
use switchyard_proto::executor::v1::{
    ExportJournalRequest, JobState, PruneJobsRequest, VerifyJournalsRequest, VerifyJournalsResponse,
};
use switchyard_testkit::Stack;

use crate::common::*;

/// The jobs, by what is done to each.
const JOBS: [&str; 10] = [
    "j-clean",
    "j-edit",
    "j-edit-last",
    "j-delete",
    "j-insert",
    "j-reorder",
    "j-truncate",
    "j-seal-moved",
    "j-seal-rekeyed",
    "j-seal-removed",
];

/// A deployment key in a file (what `switchyard audit key --new` prints).
fn key_file(dir: &Path, name: &str) -> (PathBuf, ReceiptKey) {
    let (key, seed) = ReceiptKey::generate().unwrap();
    let path = dir.join(name);
    std::fs::write(&path, ReceiptKey::seed_text(&seed)).unwrap();
    (path, key)
}

async fn start(
    b: &Backend,
    data: Option<&Path>,
    tweak: impl FnOnce(&mut switchyard_cli::Config),
) -> Stack {
    let data = data.map(Path::to_path_buf);
    Stack::start_with(switchyard_cli::ServiceKind::ALL, |c| {
        c.executor.commands.push("sh".into());
        c.executor.approval_poll_ms = 20;
        if let Some(d) = data {
            c.storage.data_dir = d;
        }
        b.apply(c);
        tweak(c);
    })
    .await
    .unwrap()
}

async fn verify(s: &Stack, who: &str) -> Result<VerifyJournalsResponse, tonic::Status> {
    let mut c = JobServiceClient::new(s.channel_as(who).await.unwrap());
    c.verify_journals(VerifyJournalsRequest::default())
        .await
        .map(|r| r.into_inner())
}

/// Waits (bounded: 30 s) until VerifyJournals, as admin, answers as
/// `done` says (`what` names it in a failure).
async fn verified_until(
    s: &Stack,
    what: &str,
    done: impl Fn(&VerifyJournalsResponse) -> bool,
) -> VerifyJournalsResponse {
    for _ in 0..1200 {
        let v = verify(s, "admin").await.unwrap();
        if done(&v) {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("not {what} within 30 s: {:?}", verify(s, "admin").await);
}

/// Waits until `n` finished jobs are sealed (a job is sealed once it
/// retires, just after it finishes).
async fn until_sealed(s: &Stack, n: u64) -> VerifyJournalsResponse {
    verified_until(s, &format!("{n} jobs sealed"), |v| v.sealed >= n).await
}

/// How a test reaches a stopped deployment's stored journal.
enum Raw {
    /// The data directory (sled), opened offline.
    Sled(PathBuf),
    /// The database, through psql.
    Pg(String),
}

/// A retired job's event positions (the executor's `index` tree value).
#[derive(Clone, PartialEq, prost::Message)]
struct Positions {
    #[prost(uint64, repeated, tag = "1")]
    positions: Vec<u64>,
}

fn psql(url: &str, sql: &str) -> String {
    switchyard_testkit::pg::shared()
        .ok()
        .unwrap()
        .psql(url, sql)
        .unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
    switchyard_kit::hex::decode(s, s.len()).unwrap()
}

/// Frames of a segment: (sequence, record bytes).
fn frames(bytes: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= bytes.len() {
        let seq = u64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
        let len = u32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push((seq, bytes[at + 16..at + 16 + len].to_vec()));
        at += 16 + len;
    }
    out
}

/// A frame, its CRC recomputed (as the log's own writer does).
fn frame(seq: u64, record: &[u8]) -> Vec<u8> {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_be_bytes());
    h.update(&(record.len() as u32).to_be_bytes());
    h.update(record);
    let mut out = seq.to_be_bytes().to_vec();
    out.extend_from_slice(&(record.len() as u32).to_be_bytes());
    out.extend_from_slice(&h.finalize().to_be_bytes());
    out.extend_from_slice(record);
    out
}

/// Replaces `from` with `to` (same length) in the bytes of `to_edit`, a
/// stored record of the job's journal chosen by `pick` from its events.
fn replace_in(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{:?} not in the record", String::from_utf8_lossy(from)));
    bytes[at..at + to.len()].copy_from_slice(to);
}

impl Raw {
    /// The stored history of a stopped stack on backend `b` whose data
    /// directory was `dir`.
    /// The stored records of a stopped stack whose data is in `dir`. On
    /// sled, once the stopped node's last tasks have let go of its store
    /// (its lock goes with their handles, which may take a moment on a
    /// loaded machine): the edits below open it directly.
    async fn of(b: &Backend, dir: &Path) -> Raw {
        match b {
            Backend::Sled => {
                let free = switchyard_store::Store::reopen(
                    dir.join("services"),
                    std::time::Duration::from_secs(10),
                )
                .await
                .unwrap();
                drop(free);
                Raw::Sled(dir.to_path_buf())
            }
            Backend::Postgres(url) => Raw::Pg(url.clone()),
        }
    }

    /// Job `job`'s stored event records, in order: (key, bytes), where the
    /// key is the global log position (sled) or the row's seq (PostgreSQL).
    fn records(&self, job: &str) -> Vec<(u64, Vec<u8>)> {
        match self {
            Raw::Sled(data) => stored_frames(data, "executor/events", &self.index(job)),
            Raw::Pg(url) => keyed_rows(
                url,
                &format!(
                    "SELECT seq || ':' || encode(data, 'hex') FROM exec_events WHERE job_id = '{job}' ORDER BY seq"
                ),
            ),
        }
    }

    fn store(data: &Path) -> switchyard_store::Store {
        switchyard_store::Store::open(data.join("services"))
            .unwrap()
            .within("executor")
    }

    fn index(&self, job: &str) -> Vec<u64> {
        let Raw::Sled(data) = self else {
            unreachable!()
        };
        let store = Raw::store(data);
        let t = store.tree::<Positions>("index").unwrap();
        t.get(job).unwrap().unwrap().positions
    }

    fn set_index(&self, job: &str, positions: Vec<u64>) {
        let Raw::Sled(data) = self else {
            unreachable!()
        };
        let store = Raw::store(data);
        store
            .tree::<Positions>("index")
            .unwrap()
            .put(job, &Positions { positions })
            .unwrap();
        store.flush_blocking().unwrap();
    }

    /// Rewrites the log record at `key` (sled), its frame's CRC
    /// recomputed.
    fn rewrite(&self, key: u64, record: &[u8]) {
        let Raw::Sled(data) = self else {
            unreachable!()
        };
        rewrite_frame(data, "executor/events", key, record);
    }

    /// Edits job `job`'s record number `n` (from 1): `from` becomes `to`.
    fn edit(&self, job: &str, n: usize, from: &str, to: &str) {
        let recs = self.records(job);
        let (key, mut bytes) = recs[n - 1].clone();
        replace_in(&mut bytes, from.as_bytes(), to.as_bytes());
        match self {
            Raw::Sled(_) => self.rewrite(key, &bytes),
            Raw::Pg(url) => {
                psql(
                    url,
                    &format!(
                        "UPDATE exec_events SET data = decode('{}', 'hex') WHERE job_id = '{job}' AND seq = {key}",
                        hex(&bytes)
                    ),
                );
            }
        }
    }

    /// Removes job `job`'s record number `n`.
    fn delete(&self, job: &str, n: usize) {
        match self {
            Raw::Sled(_) => {
                let mut p = self.index(job);
                p.remove(n - 1);
                self.set_index(job, p);
            }
            Raw::Pg(url) => {
                psql(
                    url,
                    &format!("DELETE FROM exec_events WHERE job_id = '{job}' AND seq = {n}"),
                );
            }
        }
    }

    /// Inserts a copy of job `job`'s record `n` right after it.
    fn insert_copy(&self, job: &str, n: usize) {
        match self {
            Raw::Sled(_) => {
                let mut p = self.index(job);
                p.insert(n, p[n - 1]);
                self.set_index(job, p);
            }
            Raw::Pg(url) => {
                psql(
                    url,
                    &format!(
                        "UPDATE exec_events SET seq = seq + 1000 WHERE job_id = '{job}' AND seq > {n};
                         UPDATE exec_events SET seq = seq - 999 WHERE job_id = '{job}' AND seq > 1000;
                         INSERT INTO exec_events (job_id, seq, epoch, owner, data)
                           SELECT job_id, seq + 1, epoch, owner, data FROM exec_events WHERE job_id = '{job}' AND seq = {n};"
                    ),
                );
            }
        }
    }

    /// Swaps job `job`'s records `n` and `n + 1`.
    fn swap(&self, job: &str, n: usize) {
        match self {
            Raw::Sled(_) => {
                let mut p = self.index(job);
                p.swap(n - 1, n);
                self.set_index(job, p);
            }
            Raw::Pg(url) => {
                let m = n + 1;
                psql(
                    url,
                    &format!(
                        "UPDATE exec_events SET seq = CASE seq WHEN {n} THEN {m} ELSE {n} END + 1000 WHERE job_id = '{job}' AND seq IN ({n}, {m});
                         UPDATE exec_events SET seq = seq - 1000 WHERE job_id = '{job}' AND seq > 1000;"
                    ),
                );
            }
        }
    }

    /// Cuts job `job`'s journal after its record `keep`.
    fn truncate(&self, job: &str, keep: usize) {
        match self {
            Raw::Sled(_) => {
                let mut p = self.index(job);
                p.truncate(keep);
                self.set_index(job, p);
            }
            Raw::Pg(url) => {
                psql(
                    url,
                    &format!("DELETE FROM exec_events WHERE job_id = '{job}' AND seq > {keep}"),
                );
            }
        }
    }

    /// Job `job`'s seal as kept (the receipt's JSON), if any.
    fn seal(&self, job: &str) -> Option<Vec<u8>> {
        self.kv("sealed_heads", job)
    }

    /// Keeps `seal` as job `job`'s (`None`: removes it).
    fn set_seal(&self, job: &str, seal: Option<&[u8]>) {
        self.set_kv("sealed_heads", job, seal)
    }

    /// Job `job`'s value in the executor's space `space` (seals, periodic
    /// checkpoints).
    fn kv(&self, space: &str, job: &str) -> Option<Vec<u8>> {
        match self {
            Raw::Sled(data) => Raw::store(data)
                .tree::<Vec<u8>>(space)
                .unwrap()
                .get(job)
                .unwrap(),
            Raw::Pg(url) => {
                let h = psql(
                    url,
                    &format!(
                        "SELECT encode(value, 'hex') FROM exec_kv WHERE space = '{space}' AND key = '{job}'"
                    ),
                );
                (!h.is_empty()).then(|| Vec::<u8>::decode(unhex(&h).as_slice()).unwrap())
            }
        }
    }

    /// Keeps `value` as job `job`'s in space `space` (`None`: removes it).
    fn set_kv(&self, space: &str, job: &str, value: Option<&[u8]>) {
        match self {
            Raw::Sled(data) => {
                let store = Raw::store(data);
                let t = store.tree::<Vec<u8>>(space).unwrap();
                match value {
                    Some(s) => t.put(job, &s.to_vec()).unwrap(),
                    None => {
                        t.remove(job).unwrap();
                    }
                }
                store.flush_blocking().unwrap();
            }
            Raw::Pg(url) => {
                let sql = match value {
                    Some(s) => format!(
                        "UPDATE exec_kv SET value = decode('{}', 'hex') WHERE space = '{space}' AND key = '{job}'",
                        hex(&s.to_vec().encode_to_vec())
                    ),
                    None => {
                        format!("DELETE FROM exec_kv WHERE space = '{space}' AND key = '{job}'")
                    }
                };
                psql(url, &sql);
            }
        }
    }

    /// A job's stored event records while it runs (sled: the frames that
    /// name it; no index is written before it retires).
    fn running_records(&self, job: &str) -> Vec<(u64, Vec<u8>)> {
        match self {
            Raw::Sled(data) => {
                let mut out = Vec::new();
                for seg in log_segments(data, "executor/events") {
                    for (seq, rec) in frames(&std::fs::read(seg).unwrap()) {
                        let e = Event::decode(rec.as_slice()).unwrap();
                        if e.job_id == job {
                            out.push((seq, rec));
                        }
                    }
                }
                out
            }
            Raw::Pg(_) => self.records(job),
        }
    }

    /// Rewrites a running job's stored record `key` as `bytes`.
    fn rewrite_running(&self, job: &str, key: u64, bytes: &[u8]) {
        match self {
            Raw::Sled(data) => rewrite_frame(data, "executor/events", key, bytes),
            Raw::Pg(url) => {
                psql(
                    url,
                    &format!(
                        "UPDATE exec_events SET data = decode('{}', 'hex') WHERE job_id = '{job}' AND seq = {key}",
                        hex(bytes)
                    ),
                );
            }
        }
    }
}

/// The number of the first record of `recs` whose bytes hold `what`,
/// after record `after`.
fn first_with(recs: &[(u64, Vec<u8>)], what: &str, after: usize) -> usize {
    recs.iter()
        .enumerate()
        .skip(after)
        .find(|(_, (_, b))| b.windows(what.len()).any(|w| w == what.as_bytes()))
        .map(|(i, _)| i + 1)
        .unwrap_or_else(|| panic!("no record holds {what:?}"))
}

fn problem<'a>(v: &'a VerifyJournalsResponse, job: &str) -> &'a str {
    v.problems
        .iter()
        .find(|p| p.job_id == job)
        .map(|p| p.problem.as_str())
        .unwrap_or_else(|| panic!("{job} was not found broken: {v:?}"))
}

/// Runs one echo job by each id, to completion.
async fn echo_jobs(s: &Stack, ids: &[&str]) {
    let mut c = JobServiceClient::new(s.channel().await.unwrap());
    for j in ids {
        submit(
            &mut c,
            &format!(
                r#"{{"job_id":"{j}","tasks":[{{"id":"a","command":{{"command":"sh","args":["-c","echo {j}"]}}}}]}}"#
            ),
        )
        .await
        .unwrap();
    }
    for j in ids {
        assert_eq!(finish(&mut c, j).await.state, JobState::Completed as i32);
    }
}

async fn every_tampering_with_a_finished_jobs_journal_is_found_where_it_breaks(b: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let (key_path, key) = key_file(keys.path(), "audit.key");
    let kp = key_path.clone();
    let s = start(&b, None, move |c| c.audit.key_file = Some(kp)).await;
    echo_jobs(&s, &JOBS).await;
    let clean = until_sealed(&s, JOBS.len() as u64).await;
    assert!(clean.problems.is_empty(), "{clean:?}");
    assert_eq!(clean.jobs, JOBS.len() as u64);
    assert_eq!(clean.unlinked, 0, "every event is linked");
    assert_eq!(clean.key_id, key.id(), "the key file's key seals");
    assert!(clean.records >= 5 * JOBS.len() as u64, "{clean:?}");
    // A person without audit.read is refused; an approver may verify.
    let denied = verify(&s, "alice").await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(verify(&s, "bob").await.unwrap().problems.is_empty());
    // Another submitter and an agent key lack audit.read; another tenant's
    // admin sees none of these jobs, and naming one finds nothing.
    let [carol, mallory, robot] = outsiders(&s).await;
    for (who, token) in [("carol", &carol), ("robot", &robot)] {
        let mut c = JobServiceClient::new(s.channel_with(token).await.unwrap());
        let e = c
            .verify_journals(VerifyJournalsRequest {
                job_id: "j-clean".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{who}: {e:?}");
    }
    let mut c = JobServiceClient::new(s.channel_with(&mallory).await.unwrap());
    let theirs = c
        .verify_journals(VerifyJournalsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!((theirs.jobs, theirs.sealed), (0, 0), "{theirs:?}");
    let e = c
        .verify_journals(VerifyJournalsRequest {
            job_id: "j-clean".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    // Exported, a journal checks out against the deployment's public key
    // alone; re-signed by anyone else, it does not. Outsiders get nothing.
    let mut admin = JobServiceClient::new(s.channel_as("admin").await.unwrap());
    let x = admin
        .export_journal(ExportJournalRequest {
            job_id: "j-clean".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(x.finished && !x.seal.is_empty(), "{x:?}");
    assert_eq!(x.public_keys, [key.public_key()]);
    let checked = switchyard_executor::audit::check_export(&x, &[key.public_key()]);
    assert_eq!(
        (checked.problem, checked.records),
        (None, x.events.len() as u64)
    );
    let real: switchyard_kit::receipt::Receipt = serde_json::from_str(&x.seal).unwrap();
    let (_, heads) = chain::verify_checkpoint(&real, &[key.public_key()]).unwrap();
    let (forger, _) = ReceiptKey::generate().unwrap();
    let mut forged = x.clone();
    forged.seal = serde_json::to_string(&chain::checkpoint(&forger, &heads, 1)).unwrap();
    let p = switchyard_executor::audit::check_export(&forged, &[key.public_key()])
        .problem
        .unwrap();
    assert!(p.contains("not one of the deployment's keys"), "{p}");
    let mut edited = x.clone();
    edited.events[2].kind = "job.state".into();
    let p = switchyard_executor::audit::check_export(&edited, &[key.public_key()])
        .problem
        .unwrap();
    assert!(p.contains("record 4: it was not written after"), "{p}");
    for (who, token, code) in [
        ("carol", &carol, tonic::Code::PermissionDenied),
        ("robot", &robot, tonic::Code::PermissionDenied),
        ("mallory", &mallory, tonic::Code::NotFound),
    ] {
        let mut c = JobServiceClient::new(s.channel_with(token).await.unwrap());
        let e = c
            .export_journal(ExportJournalRequest {
                job_id: "j-clean".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{who}: {e:?}");
    }
    // A name that would be a path names no job (as for GetJob).
    let e = c
        .verify_journals(VerifyJournalsRequest {
            job_id: "../j-clean".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    let dir = s.stop().await.unwrap();
    let raw = Raw::of(&b, dir.path()).await;
    let recs = raw.records("j-edit");
    let n = recs.len();
    // The task's move to succeeded, in the middle: the job's own move
    // after it no longer links to it.
    let task_done = first_with(&recs, "succeeded", 0);
    assert!(task_done < n, "the task succeeds before the job completes");
    raw.edit("j-edit", task_done, "succeeded", "cancelled");
    // The last record (the job completed): only the seal vouches for it.
    let last = raw.records("j-edit-last").len();
    raw.edit("j-edit-last", last, "completed", "cancelled");
    raw.delete("j-delete", 3);
    raw.insert_copy("j-insert", 3);
    raw.swap("j-reorder", 3);
    let cut = raw.records("j-truncate").len() - 1;
    raw.truncate("j-truncate", cut);
    // Another job's seal (a valid signature, over another stream).
    raw.set_seal("j-seal-moved", Some(&raw.seal("j-clean").unwrap()));
    // The right head, signed by a key the deployment never had.
    let (forger, _) = ReceiptKey::generate().unwrap();
    let real: switchyard_kit::receipt::Receipt =
        serde_json::from_slice(&raw.seal("j-seal-rekeyed").unwrap()).unwrap();
    let (_, heads) = chain::verify_checkpoint(&real, &[key.public_key()]).unwrap();
    let forged = chain::checkpoint(&forger, &heads, 1);
    raw.set_seal(
        "j-seal-rekeyed",
        Some(&serde_json::to_vec(&forged).unwrap()),
    );
    raw.set_seal("j-seal-removed", None);

    let kp = key_path.clone();
    let s = start(&b, Some(dir.path()), move |c| c.audit.key_file = Some(kp)).await;
    let v = verify(&s, "admin").await.unwrap();
    let broken: std::collections::BTreeSet<&str> =
        v.problems.iter().map(|p| p.job_id.as_str()).collect();
    let want: std::collections::BTreeSet<&str> = JOBS[1..].iter().copied().collect();
    assert_eq!(broken, want, "every tampered job, and only those: {v:?}");
    let says = |job: &str, what: &str| {
        let p = problem(&v, job);
        assert!(p.contains(what), "{job}: {p}");
    };
    says(
        "j-edit",
        &format!(
            "record {}: it was not written after the record now before it (record {task_done} was edited",
            task_done + 1
        ),
    );
    says(
        "j-edit-last",
        &format!(
            "record {last}: the chain up to it is not the one the signed checkpoint vouches for"
        ),
    );
    says(
        "j-delete",
        "expected record 3, found record 4 (records were deleted)",
    );
    says(
        "j-insert",
        "expected record 4, found record 3 (a record was inserted or repeated)",
    );
    says("j-reorder", "expected record 3, found record 4");
    says(
        "j-truncate",
        &format!(
            "ends at record {cut}, but a signed checkpoint vouches for record {}",
            cut + 1
        ),
    );
    says("j-seal-moved", "vouches for stream \"job/j-clean\"");
    says(
        "j-seal-rekeyed",
        &format!(
            "signed by key {}, which is not one of the deployment's keys",
            forger.id()
        ),
    );
    says("j-seal-removed", "no signed seal vouches for its journal");
    // One job, as its tenant's viewer asks: the same answer.
    let mut c = JobServiceClient::new(s.channel_as("admin").await.unwrap());
    let one = c
        .verify_journals(VerifyJournalsRequest {
            job_id: "j-delete".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.jobs, 1);
    assert_eq!(one.problems.len(), 1, "{one:?}");
    s.stop().await.unwrap();
    drop(dir);
}

async fn a_clean_history_verifies_after_a_key_rotation_and_after_pruning(b: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let (old_path, old) = key_file(keys.path(), "old.key");
    let (new_path, new) = key_file(keys.path(), "new.key");
    let p = old_path.clone();
    let s = start(&b, None, move |c| c.audit.key_file = Some(p)).await;
    let mut c = JobServiceClient::new(s.channel().await.unwrap());
    let run = |id: &str| {
        format!(
            r#"{{"job_id":"{id}","tasks":[{{"id":"a","command":{{"command":"sh","args":["-c","echo {id}"]}}}}]}}"#
        )
    };
    submit(&mut c, &run("before")).await.unwrap();
    finish(&mut c, "before").await;
    until_sealed(&s, 1).await;
    let dir = s.stop().await.unwrap();

    // Rotated without keeping the old public key: the old seal is not
    // trusted (a key swapped in by someone else looks the same).
    let p = new_path.clone();
    let s = start(&b, Some(dir.path()), move |c| c.audit.key_file = Some(p)).await;
    let v = verify(&s, "admin").await.unwrap();
    let p = problem(&v, "before");
    assert!(
        p.contains(&format!("signed by key {}, which is not one", old.id())),
        "{p}"
    );
    // (The stack started on `dir` hands back a directory of its own.)
    s.stop().await.unwrap();

    // Rotated as documented: the old public key kept.
    let (p, old_pub) = (new_path.clone(), old.public_key());
    let s = start(&b, Some(dir.path()), move |c| {
        c.audit.key_file = Some(p);
        c.audit.previous_public_keys = vec![old_pub];
        c.audit.checkpoint_ms = 20;
    })
    .await;
    let mut c = JobServiceClient::new(s.channel().await.unwrap());
    // Long enough to be checkpointed while it runs.
    submit(
        &mut c,
        r#"{"job_id":"after","tasks":[{"id":"a","agent":{"capability":"builtin.sleep","input":{"ms":500}}}]}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        finish(&mut c, "after").await.state,
        JobState::Completed as i32
    );
    let v = until_sealed(&s, 2).await;
    assert!(v.problems.is_empty(), "{v:?}");
    assert_eq!(v.checkpointed, 1, "its checkpoint still holds: {v:?}");
    assert_eq!(v.key_id, new.id());
    assert_eq!(
        v.trusted_key_ids,
        [new.id().to_owned(), old.id().to_owned()]
    );

    // Pruned: the records go, the seals stay and still hold.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let mut admin = JobServiceClient::new(s.channel_as("admin").await.unwrap());
    let pruned = admin
        .prune_jobs(PruneJobsRequest {
            older_than: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pruned.jobs, 2);
    let v = verify(&s, "admin").await.unwrap();
    assert!(v.problems.is_empty(), "{v:?}");
    assert_eq!((v.jobs, v.pruned), (0, 2), "{v:?}");
    s.stop().await.unwrap();
    // The checkpoint went with the records; the seal stayed.
    let raw = Raw::of(&b, dir.path()).await;
    assert_eq!(raw.kv("live_heads", "after"), None);
    assert!(raw.seal("after").is_some());
    drop(dir);
}

/// A job's events as WatchJob sends them carry their links: a client
/// recomputes the chain itself and reaches the head the seal signed.
async fn a_client_recomputes_a_jobs_chain_from_its_events(b: Backend) {
    let s = start(&b, None, |_| {}).await;
    let mut c = JobServiceClient::new(s.channel().await.unwrap());
    submit(
        &mut c,
        r#"{"job_id":"mine","tasks":[{"id":"a","command":{"command":"sh","args":["-c","echo hi"]}}]}"#,
    )
    .await
    .unwrap();
    finish(&mut c, "mine").await;
    let evs: Vec<Event> = {
        use tokio_stream::StreamExt as _;
        let mut w = c
            .watch_job(switchyard_proto::executor::v1::WatchJobRequest {
                job_id: "mine".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let mut out = Vec::new();
        while let Some(m) = w.next().await {
            if let Some(e) = m.unwrap().event {
                out.push(e);
            }
        }
        out
    };
    let mut head = Head::default();
    for e in &evs {
        let l = e.chain.as_ref().expect("every event carries its link");
        assert_eq!(l.n, e.sequence);
        assert_eq!(
            l.prev,
            head.hash.to_vec(),
            "event {} links to the one before",
            e.sequence
        );
        head = Head {
            n: l.n,
            hash: chain::link("job/mine", l.n, &head.hash, &e.encode_to_vec()),
        };
    }
    assert!(head.n >= 5);
    s.stop().await.unwrap();
}

/// The runs, by what is done to each (`run-<job>`: each job's run).
const RUN_JOBS: [&str; 6] = [
    "r-clean",
    "r-edit",
    "r-delete",
    "r-reorder",
    "r-truncate",
    "r-unsealed",
];

/// A run's stored audit records, in order: (key, bytes) — the log position
/// (sled) or the row's seq (PostgreSQL).
fn run_records(raw: &Raw, run: &str) -> Vec<(u64, Vec<u8>)> {
    match raw {
        Raw::Sled(data) => stored_frames(data, "approval/audit", &ended_audit(data, run).positions),
        Raw::Pg(url) => keyed_rows(
            url,
            &format!(
                "SELECT seq || ':' || encode(record, 'hex') FROM approval_audit WHERE run_id = '{run}' ORDER BY seq"
            ),
        ),
    }
}

/// The records at `positions` of log `name` (sled), in that order.
fn stored_frames(data: &Path, name: &str, positions: &[u64]) -> Vec<(u64, Vec<u8>)> {
    let mut all = std::collections::HashMap::new();
    for seg in log_segments(data, name) {
        for (seq, rec) in frames(&std::fs::read(seg).unwrap()) {
            all.insert(seq, rec);
        }
    }
    positions.iter().map(|p| (*p, all[p].clone())).collect()
}

/// Rows `sql` selects as `key:hex`.
fn keyed_rows(url: &str, sql: &str) -> Vec<(u64, Vec<u8>)> {
    psql(url, sql)
        .lines()
        .map(|l| {
            let (seq, data) = l.split_once(':').unwrap();
            (seq.parse().unwrap(), unhex(data))
        })
        .collect()
}

/// An ended run's audit positions (the approval store's `ended_audit`).
#[derive(Clone, PartialEq, prost::Message)]
struct RunPositions {
    #[prost(uint64, repeated, tag = "1")]
    positions: Vec<u64>,
    #[prost(uint64, tag = "2")]
    ended_ms: u64,
}

fn approval_store(data: &Path) -> switchyard_store::Store {
    switchyard_store::Store::open(data.join("services"))
        .unwrap()
        .within("approval")
}

fn ended_audit(data: &Path, run: &str) -> RunPositions {
    let store = approval_store(data);
    let t = store.tree::<RunPositions>("ended_audit").unwrap();
    t.get(run).unwrap().unwrap()
}

fn set_ended_audit(data: &Path, run: &str, p: &RunPositions) {
    let store = approval_store(data);
    store
        .tree::<RunPositions>("ended_audit")
        .unwrap()
        .put(run, p)
        .unwrap();
    store.flush_blocking().unwrap();
}

/// The segment files of log `name` (`approval/audit`) in `data`.
fn log_segments(data: &Path, name: &str) -> Vec<PathBuf> {
    let dir = data.join("services/logs").join(name);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    out.sort();
    out
}

/// Rewrites frame `key` of log `name`, its CRC recomputed.
fn rewrite_frame(data: &Path, name: &str, key: u64, record: &[u8]) {
    for seg in log_segments(data, name) {
        let fs = frames(&std::fs::read(&seg).unwrap());
        if !fs.iter().any(|(s, _)| *s == key) {
            continue;
        }
        let mut out = Vec::new();
        for (s, r) in fs {
            out.extend(frame(s, if s == key { record } else { &r }));
        }
        std::fs::write(&seg, out).unwrap();
    }
}

impl Raw {
    /// Edits run `run`'s audit record `n` (from 1): `from` becomes `to`.
    fn edit_run(&self, run: &str, n: usize, from: &str, to: &str) {
        let (key, mut bytes) = run_records(self, run)[n - 1].clone();
        replace_in(&mut bytes, from.as_bytes(), to.as_bytes());
        match self {
            Raw::Sled(data) => rewrite_frame(data, "approval/audit", key, &bytes),
            Raw::Pg(url) => {
                psql(
                    url,
                    &format!(
                        "UPDATE approval_audit SET record = decode('{}', 'hex') WHERE seq = {key}",
                        hex(&bytes)
                    ),
                );
            }
        }
    }

    /// Applies `change` to run `run`'s audit positions (sled) or rows
    /// (PostgreSQL: `change` gets the seqs, and rows are renumbered to
    /// what it returns, those it drops deleted).
    fn reorder_run(&self, run: &str, change: impl Fn(&mut Vec<u64>)) {
        match self {
            Raw::Sled(data) => {
                let mut p = ended_audit(data, run);
                change(&mut p.positions);
                set_ended_audit(data, run, &p);
            }
            Raw::Pg(url) => {
                let seqs: Vec<u64> = run_records(self, run).iter().map(|(k, _)| *k).collect();
                let mut order = seqs.clone();
                change(&mut order);
                // Row `order[i]` takes the place of `seqs[i]`.
                let mut sql = format!(
                    "DELETE FROM approval_audit WHERE run_id = '{run}' AND seq NOT IN ({});",
                    order
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                );
                for (i, from) in order.iter().enumerate() {
                    sql.push_str(&format!(
                        "UPDATE approval_audit SET seq = {} WHERE seq = {from};",
                        seqs[i] + 1_000_000
                    ));
                }
                sql.push_str(&format!(
                    "UPDATE approval_audit SET seq = seq - 1000000 WHERE run_id = '{run}' AND seq > 1000000;"
                ));
                psql(url, &sql);
            }
        }
    }

    /// Changes stored run `run` (an ended one) by `change`.
    fn change_run(&self, run: &str, change: impl Fn(&mut switchyard_proto::approval::v1::Run)) {
        use switchyard_proto::approval::v1::Run;
        match self {
            Raw::Sled(data) => {
                let store = approval_store(data);
                let t = store.tree::<Run>("runs").unwrap();
                let mut r = t.get(run).unwrap().unwrap();
                change(&mut r);
                t.put(run, &r).unwrap();
                store.flush_blocking().unwrap();
            }
            Raw::Pg(url) => {
                let data = psql(
                    url,
                    &format!("SELECT encode(data, 'hex') FROM approval_runs WHERE id = '{run}'"),
                );
                let mut r = Run::decode(unhex(data.trim()).as_slice()).unwrap();
                change(&mut r);
                psql(
                    url,
                    &format!(
                        "UPDATE approval_runs SET data = decode('{}', 'hex') WHERE id = '{run}'",
                        hex(&r.encode_to_vec())
                    ),
                );
            }
        }
    }
}

async fn verify_runs(
    s: &Stack,
    who: &str,
    run_id: &str,
) -> Result<switchyard_proto::approval::v1::VerifyAuditResponse, tonic::Status> {
    approvals_as(s, who)
        .await
        .verify_audit(switchyard_proto::approval::v1::VerifyAuditRequest {
            run_id: run_id.into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// Asserts that the objects `found` names as broken (id, problem) are
/// exactly those `want` lists (in id order), each with a problem saying
/// what `want` has for it; `v` is the whole answer, for a failure.
fn found_exactly<'a>(
    found: impl Iterator<Item = (&'a str, &'a str)>,
    want: &[(&str, &str)],
    v: &dyn std::fmt::Debug,
) {
    let broken: std::collections::BTreeMap<&str, &str> = found.collect();
    let ids: Vec<&str> = want.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        broken.keys().copied().collect::<Vec<_>>(),
        ids,
        "every tampered one, and only those: {v:?}"
    );
    for (id, what) in want {
        assert!(broken[id].contains(what), "{id}: {}", broken[id]);
    }
}

/// VerifyAudit as admin once `n` ended runs are sealed (a run is sealed
/// as its job ends; bounded: 30 s), or as it is then.
async fn runs_sealed(s: &Stack, n: u64) -> switchyard_proto::approval::v1::VerifyAuditResponse {
    let mut v = verify_runs(s, "admin", "").await.unwrap();
    for _ in 0..1200 {
        if v.sealed >= n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        v = verify_runs(s, "admin", "").await.unwrap();
    }
    v
}

async fn every_tampering_with_a_runs_approval_audit_is_found(b: Backend) {
    let s = start(&b, None, |_| {}).await;
    echo_jobs(&s, &RUN_JOBS).await;
    // Each job's run ends with it, sealed.
    let clean = runs_sealed(&s, RUN_JOBS.len() as u64).await;
    assert_eq!(clean.sealed, RUN_JOBS.len() as u64, "{clean:?}");
    assert!(clean.problems.is_empty(), "{clean:?}");
    assert_eq!(clean.unlinked, 0, "{clean:?}");
    assert!(clean.records >= 3 * RUN_JOBS.len() as u64, "{clean:?}");
    // The records carry their links, as ListAudit gives them.
    let recs = audit_of(&s, "admin", "run-r-clean").await;
    let ns: Vec<u64> = recs.iter().map(|r| r.chain.clone().unwrap().n).collect();
    assert_eq!(ns, (1..=recs.len() as u64).collect::<Vec<_>>());
    // A submitter and an agent key lack audit.read; another tenant's admin
    // sees none of these runs, and naming one finds nothing.
    let denied = verify_runs(&s, "alice", "").await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let [carol, mallory, robot] = outsiders(&s).await;
    for (who, token) in [("carol", &carol), ("robot", &robot)] {
        let mut a =
            switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient::new(
                s.channel_with(token).await.unwrap(),
            );
        let e = a
            .verify_audit(switchyard_proto::approval::v1::VerifyAuditRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{who}: {e:?}");
    }
    let mut a = switchyard_proto::approval::v1::approval_service_client::ApprovalServiceClient::new(
        s.channel_with(&mallory).await.unwrap(),
    );
    let theirs = a
        .verify_audit(switchyard_proto::approval::v1::VerifyAuditRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(theirs.runs, 0, "{theirs:?}");
    let e = a
        .verify_audit(switchyard_proto::approval::v1::VerifyAuditRequest {
            run_id: "run-r-clean".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    let dir = s.stop().await.unwrap();
    let raw = Raw::of(&b, dir.path()).await;
    raw.edit_run("run-r-edit", 2, "context pack bound", "context pack BOUND");
    raw.reorder_run("run-r-delete", |p| {
        p.remove(1);
    });
    raw.reorder_run("run-r-reorder", |p| p.swap(1, 2));
    raw.reorder_run("run-r-truncate", |p| {
        p.pop();
    });
    raw.change_run("run-r-unsealed", |r| r.audit_seal.clear());

    let s = start(&b, Some(dir.path()), |_| {}).await;
    let v = verify_runs(&s, "admin", "").await.unwrap();
    found_exactly(
        v.problems
            .iter()
            .map(|p| (p.run_id.as_str(), p.problem.as_str())),
        &[
            (
                "run-r-delete",
                "expected record 2, found record 3 (records were deleted)",
            ),
            (
                "run-r-edit",
                "record 3: it was not written after the record now before it (record 2 was edited",
            ),
            ("run-r-reorder", "expected record 2, found record 3"),
            ("run-r-truncate", "(records were cut off)"),
            ("run-r-unsealed", "carries no seal"),
        ],
        &v,
    );
    s.stop().await.unwrap();
    drop(dir);
}

async fn a_running_jobs_checkpoint_finds_its_last_event_edited_while_the_executor_was_stopped(
    b: Backend,
) {
    let keys = tempfile::tempdir().unwrap();
    let (key_path, key) = key_file(keys.path(), "audit.key");
    let kp = key_path.clone();
    let tweak = move |c: &mut switchyard_cli::Config| {
        c.audit.key_file = Some(kp.clone());
        c.audit.checkpoint_ms = 50;
    };
    let s = start(&b, None, tweak.clone()).await;
    // A job that waits for a person: its journal stops at the approval it
    // asks for, and no seal will come while it waits.
    let mut c = JobServiceClient::new(s.channel().await.unwrap());
    submit(
        &mut c,
        r#"{"job_id":"waits","approval":{"requires_approval":true},"tasks":[{"id":"a","command":{"command":"sh","args":["-c","echo hi"]}}]}"#,
    )
    .await
    .unwrap();
    let v = verified_until(&s, "1 running job checkpointed", |v| v.checkpointed >= 1).await;
    assert!(v.problems.is_empty(), "{v:?}");
    assert_eq!(v.sealed, 0, "it has not finished: {v:?}");
    // Exported while it waits, the bundle carries the checkpoint, and it
    // checks out offline.
    let mut admin = JobServiceClient::new(s.channel_as("admin").await.unwrap());
    let x = admin
        .export_journal(ExportJournalRequest {
            job_id: "waits".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!x.finished && !x.seal.is_empty(), "{x:?}");
    let checked = switchyard_executor::audit::check_export(&x, &[key.public_key()]);
    assert_eq!(checked.problem, None);
    assert_eq!(checked.checkpointed, Some(x.events.len() as u64));
    let dir = s.stop().await.unwrap();
    let raw = Raw::of(&b, dir.path()).await;
    // Its last event (the approval it asks for) edited: no later record
    // links to it, so only the checkpoint can tell.
    let recs = raw.running_records("waits");
    let (last, mut bytes) = recs.last().cloned().unwrap();
    let at = bytes
        .windows(7)
        .position(|w| w == b"sha256:")
        .expect("the approval's context hash");
    bytes[at + 7] = if bytes[at + 7] == b'0' { b'1' } else { b'0' };
    raw.rewrite_running("waits", last, &bytes);
    let checkpoint = raw
        .kv("live_heads", "waits")
        .expect("its checkpoint is kept");

    let s = start(&b, Some(dir.path()), tweak.clone()).await;
    // The executor, running it again, does not sign over what it finds
    // changed: the checkpoint stays as it was, and verification says where.
    let v = verify(&s, "admin").await.unwrap();
    let p = problem(&v, "waits");
    assert!(
        p.contains(&format!(
            "record {}: the chain up to it is not the one the signed checkpoint vouches for",
            recs.len()
        )),
        "{p}"
    );
    let dir2 = s.stop().await.unwrap();
    drop(dir2);
    assert_eq!(raw.kv("live_heads", "waits"), Some(checkpoint));
    drop(dir);
}

async fn a_runs_seal_verifies_after_the_approval_key_is_rotated_with_the_old_public_key_kept(
    b: Backend,
) {
    let keys = tempfile::tempdir().unwrap();
    let (old_path, old) = key_file(keys.path(), "old.key");
    let (new_path, new) = key_file(keys.path(), "new.key");
    let s = start(&b, None, |c| c.approval.receipt_key_file = Some(old_path)).await;
    echo_jobs(&s, &["rot-1", "rot-2"]).await;
    let sealed = runs_sealed(&s, 2).await;
    assert_eq!((sealed.sealed, sealed.problems.len()), (2, 0), "{sealed:?}");
    assert_eq!(sealed.key_id, old.id());
    let dir = s.stop().await.unwrap();

    // Rotated, the old public key kept: the old seals still verify.
    let (np, op) = (new_path.clone(), old.public_key());
    let s = start(&b, Some(dir.path()), move |c| {
        c.approval.receipt_key_file = Some(np);
        c.approval.previous_receipt_public_keys = vec![op];
    })
    .await;
    let v = verify_runs(&s, "admin", "").await.unwrap();
    assert_eq!((v.sealed, v.problems.len()), (2, 0), "{v:?}");
    assert_eq!(v.key_id, new.id());
    assert_eq!(v.trusted_key_ids, [new.id(), old.id()]);
    // (A stack started on a data directory hands back its own empty one.)
    drop(s.stop().await.unwrap());

    // Rotated, the old key forgotten: every old seal is named.
    let s = start(&b, Some(dir.path()), move |c| {
        c.approval.receipt_key_file = Some(new_path);
    })
    .await;
    let v = verify_runs(&s, "admin", "").await.unwrap();
    assert_eq!(v.problems.len(), 2, "{v:?}");
    for p in &v.problems {
        assert!(
            p.problem.contains("not one of the deployment's keys"),
            "{p:?}"
        );
    }
    s.stop().await.unwrap();
    drop(dir);
}

/// The budgets of the ledger test, by what is done to each journal.
const BUDGETS: [&str; 6] = [
    "led-clean",
    "led-edit",
    "led-delete",
    "led-reorder",
    "led-truncate",
    "led-insert",
];

async fn ledger_as(
    s: &Stack,
    who: &str,
) -> switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient<
    switchyard_kit::client::Intercepted,
> {
    switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        s.channel_as(who).await.unwrap(),
    )
}

async fn verify_budgets(
    s: &Stack,
    who: &str,
    budget_id: &str,
) -> Result<switchyard_proto::ledger::v1::VerifyJournalResponse, tonic::Status> {
    ledger_as(s, who)
        .await
        .verify_journal(switchyard_proto::ledger::v1::VerifyJournalRequest {
            budget_id: budget_id.into(),
        })
        .await
        .map(|r| r.into_inner())
}

impl Raw {
    /// The ledger journal's records in order: (sequence, bytes).
    fn ledger(&self) -> Vec<(u64, Vec<u8>)> {
        match self {
            Raw::Sled(data) => log_segments(data, "ledger/journal")
                .iter()
                .flat_map(|seg| frames(&std::fs::read(seg).unwrap()))
                .collect(),
            Raw::Pg(url) => keyed_rows(
                url,
                "SELECT seq || ':' || encode(record, 'hex') FROM ledger_journal WHERE kind <> 0 ORDER BY seq",
            ),
        }
    }

    /// Replaces the ledger journal by `records` in order, numbered on from
    /// the first (what a forger who rewrites the log itself would do).
    fn set_ledger(&self, records: &[Vec<u8>]) {
        use switchyard_proto::ledger::v1::JournalRecord;
        let first = self.ledger()[0].0;
        match self {
            Raw::Sled(data) => {
                let segs = log_segments(data, "ledger/journal");
                let mut out = Vec::new();
                for (i, r) in records.iter().enumerate() {
                    out.extend(frame(first + i as u64, r));
                }
                std::fs::write(&segs[0], out).unwrap();
                for seg in &segs[1..] {
                    std::fs::remove_file(seg).unwrap();
                }
            }
            Raw::Pg(url) => {
                let mut sql = "DELETE FROM ledger_journal;".to_owned();
                for (i, r) in records.iter().enumerate() {
                    let rec = JournalRecord::decode(r.as_slice()).unwrap();
                    let ctx = rec.context.clone().unwrap_or_default();
                    sql.push_str(&format!(
                        "INSERT INTO ledger_journal (seq, kind, budget_id, job_id, correlation_id, record) VALUES ({}, {}, '{}', '{}', '{}', decode('{}', 'hex'));",
                        first + i as u64,
                        rec.kind,
                        rec.budget_id,
                        ctx.job_id,
                        ctx.correlation_id,
                        hex(r)
                    ));
                }
                psql(url, &sql);
            }
        }
    }
}

/// Where record `n` (from 1) of budget `b`'s chain is in `records`.
fn nth_of(records: &[Vec<u8>], b: &str, n: u64) -> usize {
    use switchyard_proto::ledger::v1::JournalRecord;
    records
        .iter()
        .position(|r| {
            let rec = JournalRecord::decode(r.as_slice()).unwrap();
            rec.budget_id == b && rec.chain.is_some_and(|l| l.n == n)
        })
        .unwrap_or_else(|| panic!("{b} has no record {n}"))
}

async fn every_tampering_with_a_budgets_journal_is_found(b: Backend) {
    use switchyard_proto::common::v1::Money;
    use switchyard_proto::ledger::v1::{
        CommitRequest, CreateBudgetRequest, JournalRecord, ReleaseRequest, ReserveRequest,
    };
    let s = start(&b, None, |_| {}).await;
    // The services' own key spends (people do not).
    let mut l = switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
        s.channel().await.unwrap(),
    );
    // Each budget: created, reserved, committed, reserved, released.
    for id in BUDGETS {
        l.create_budget(CreateBudgetRequest {
            budget_id: id.into(),
            token_limit: Some(10_000),
            ..Default::default()
        })
        .await
        .unwrap();
        for (i, commit) in [(1, true), (2, false)] {
            let rid = l
                .reserve(ReserveRequest {
                    budget_id: id.into(),
                    tokens: 100,
                    cost: Some(Money { micro_usd: 10 }),
                    idempotency_key: format!("{id}-{i}"),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .reservation
                .unwrap()
                .reservation_id;
            if commit {
                l.commit(CommitRequest {
                    reservation_id: rid,
                    tokens: 77,
                    cost: Some(Money { micro_usd: 7 }),
                    ..Default::default()
                })
                .await
                .unwrap();
            } else {
                l.release(ReleaseRequest {
                    reservation_id: rid,
                    ..Default::default()
                })
                .await
                .unwrap();
            }
        }
    }
    let clean = verify_budgets(&s, "admin", "").await.unwrap();
    assert!(clean.problems.is_empty(), "{clean:?}");
    assert_eq!(clean.budgets, BUDGETS.len() as u64, "{clean:?}");
    assert_eq!(clean.records, 5 * BUDGETS.len() as u64, "{clean:?}");
    assert_eq!(clean.unlinked, 0, "{clean:?}");
    // The budget shows its head.
    let head = budget(&mut l, "led-clean").await.journal_head.unwrap();
    assert_eq!(head.n, 5);
    // A submitter and an agent key lack audit.read; another tenant's admin
    // sees none of these budgets, and naming one finds nothing.
    let denied = verify_budgets(&s, "alice", "").await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let [carol, mallory, robot] = outsiders(&s).await;
    let as_key = |token: String| {
        let s = &s;
        async move {
            switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient::new(
                s.channel_with(&token).await.unwrap(),
            )
        }
    };
    for (who, token) in [("carol", carol), ("robot", robot)] {
        let e = as_key(token)
            .await
            .verify_journal(switchyard_proto::ledger::v1::VerifyJournalRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{who}: {e:?}");
    }
    let mut theirs = as_key(mallory).await;
    let none = theirs
        .verify_journal(switchyard_proto::ledger::v1::VerifyJournalRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(none.budgets, 0, "{none:?}");
    let e = theirs
        .verify_journal(switchyard_proto::ledger::v1::VerifyJournalRequest {
            budget_id: "led-clean".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

    let dir = s.stop().await.unwrap();
    let raw = Raw::of(&b, dir.path()).await;
    let mut recs: Vec<Vec<u8>> = raw.ledger().into_iter().map(|(_, r)| r).collect();
    // Edit: the first charge's reservation asks for more tokens.
    let at = nth_of(&recs, "led-edit", 2);
    let mut rec = JournalRecord::decode(recs[at].as_slice()).unwrap();
    rec.tokens = 5;
    recs[at] = rec.encode_to_vec();
    // Delete, reorder, truncate.
    let at = nth_of(&recs, "led-delete", 2);
    recs.remove(at);
    let (x, y) = (
        nth_of(&recs, "led-reorder", 2),
        nth_of(&recs, "led-reorder", 3),
    );
    recs.swap(x, y);
    let at = nth_of(&recs, "led-truncate", 5);
    recs.remove(at);
    // Insert: a charge someone adds, outside the chain (they cannot link it).
    let at = nth_of(&recs, "led-insert", 3);
    let mut forged = JournalRecord::decode(recs[at].as_slice()).unwrap();
    forged.chain = None;
    forged.reservation_id = "forged".into();
    recs.insert(at + 1, forged.encode_to_vec());
    raw.set_ledger(&recs);

    let s = start(&b, Some(dir.path()), |_| {}).await;
    let v = verify_budgets(&s, "admin", "").await.unwrap();
    found_exactly(
        v.problems
            .iter()
            .map(|p| (p.budget_id.as_str(), p.problem.as_str())),
        &[
            (
                "led-delete",
                "expected record 2, found record 3 (records were deleted)",
            ),
            (
                "led-edit",
                "record 3: it was not written after the record now before it (record 2 was edited",
            ),
            ("led-insert", "is in no chain"),
            ("led-reorder", "expected record 2, found record 3"),
            ("led-truncate", "(records were deleted or cut off)"),
        ],
        &v,
    );
    // One budget alone, by name.
    let one = verify_budgets(&s, "admin", "led-clean").await.unwrap();
    assert_eq!((one.budgets, one.problems.len()), (1, 0), "{one:?}");
    s.stop().await.unwrap();
    drop(dir);
}

switchyard_testkit::on_both_backends!(
    sled, postgres;
    every_tampering_with_a_budgets_journal_is_found,
    a_runs_seal_verifies_after_the_approval_key_is_rotated_with_the_old_public_key_kept,
    a_running_jobs_checkpoint_finds_its_last_event_edited_while_the_executor_was_stopped,
    every_tampering_with_a_runs_approval_audit_is_found,
    every_tampering_with_a_finished_jobs_journal_is_found_where_it_breaks,
    a_clean_history_verifies_after_a_key_rotation_and_after_pruning,
    a_client_recomputes_a_jobs_chain_from_its_events,
);
