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

/// Waits (bounded: 30 s) until `n` finished jobs are sealed (a job is
/// sealed once it retires, just after it finishes).
async fn until_sealed(s: &Stack, n: u64) -> VerifyJournalsResponse {
    for _ in 0..1200 {
        let v = verify(s, "admin").await.unwrap();
        if v.sealed >= n {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!(
        "{n} jobs were not sealed within 30 s: {:?}",
        verify(s, "admin").await
    );
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

/// The segment files of the executor's event log in `data`.
fn segments(data: &Path) -> Vec<PathBuf> {
    let dir = data.join("services/logs/executor/events");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    out.sort();
    out
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
    /// Job `job`'s stored event records, in order: (key, bytes), where the
    /// key is the global log position (sled) or the row's seq (PostgreSQL).
    fn records(&self, job: &str) -> Vec<(u64, Vec<u8>)> {
        match self {
            Raw::Sled(data) => {
                let index = self.index(job);
                let mut all = std::collections::HashMap::new();
                for seg in segments(data) {
                    for (seq, rec) in frames(&std::fs::read(seg).unwrap()) {
                        all.insert(seq, rec);
                    }
                }
                index.iter().map(|p| (*p, all[p].clone())).collect()
            }
            Raw::Pg(url) => psql(
                url,
                &format!(
                    "SELECT seq || ':' || encode(data, 'hex') FROM exec_events WHERE job_id = '{job}' ORDER BY seq"
                ),
            )
            .lines()
            .map(|l| {
                let (seq, data) = l.split_once(':').unwrap();
                (seq.parse().unwrap(), unhex(data))
            })
            .collect(),
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
        for seg in segments(data) {
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
        match self {
            Raw::Sled(data) => Raw::store(data)
                .tree::<Vec<u8>>("sealed_heads")
                .unwrap()
                .get(job)
                .unwrap(),
            Raw::Pg(url) => {
                let h = psql(
                    url,
                    &format!(
                        "SELECT encode(value, 'hex') FROM exec_kv WHERE space = 'sealed_heads' AND key = '{job}'"
                    ),
                );
                (!h.is_empty()).then(|| Vec::<u8>::decode(unhex(&h).as_slice()).unwrap())
            }
        }
    }

    /// Keeps `seal` as job `job`'s (`None`: removes it).
    fn set_seal(&self, job: &str, seal: Option<&[u8]>) {
        match self {
            Raw::Sled(data) => {
                let store = Raw::store(data);
                let t = store.tree::<Vec<u8>>("sealed_heads").unwrap();
                match seal {
                    Some(s) => t.put(job, &s.to_vec()).unwrap(),
                    None => {
                        t.remove(job).unwrap();
                    }
                }
                store.flush_blocking().unwrap();
            }
            Raw::Pg(url) => {
                let sql = match seal {
                    Some(s) => format!(
                        "UPDATE exec_kv SET value = decode('{}', 'hex') WHERE space = 'sealed_heads' AND key = '{job}'",
                        hex(&s.to_vec().encode_to_vec())
                    ),
                    None => format!(
                        "DELETE FROM exec_kv WHERE space = 'sealed_heads' AND key = '{job}'"
                    ),
                };
                psql(url, &sql);
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

async fn every_tampering_with_a_finished_jobs_journal_is_found_where_it_breaks(b: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let (key_path, key) = key_file(keys.path(), "audit.key");
    let kp = key_path.clone();
    let s = start(&b, None, move |c| c.audit.key_file = Some(kp)).await;
    let mut c = JobServiceClient::new(s.channel().await.unwrap());
    for j in JOBS {
        submit(
            &mut c,
            &format!(
                r#"{{"job_id":"{j}","tasks":[{{"id":"a","command":{{"command":"sh","args":["-c","echo {j}"]}}}}]}}"#
            ),
        )
        .await
        .unwrap();
    }
    for j in JOBS {
        assert_eq!(finish(&mut c, j).await.state, JobState::Completed as i32);
    }
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
    let raw = match &b {
        Backend::Sled => Raw::Sled(dir.path().to_path_buf()),
        Backend::Postgres(url) => Raw::Pg(url.clone()),
    };
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
    })
    .await;
    let mut c = JobServiceClient::new(s.channel().await.unwrap());
    submit(&mut c, &run("after")).await.unwrap();
    finish(&mut c, "after").await;
    let v = until_sealed(&s, 2).await;
    assert!(v.problems.is_empty(), "{v:?}");
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

switchyard_testkit::on_both_backends!(
    sled, postgres;
    every_tampering_with_a_finished_jobs_journal_is_found_where_it_breaks,
    a_clean_history_verifies_after_a_key_rotation_and_after_pruning,
    a_client_recomputes_a_jobs_chain_from_its_events,
);
