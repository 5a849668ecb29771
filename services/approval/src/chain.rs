//! Each run's audit records as a hash chain (issue 46; `docs/audit.md`).
//!
//! A run's records are stream `run/<run_id>` of the chain in
//! [`switchyard_kit::chain`]: record `n` carries the hash of the run's
//! record `n - 1` (`AuditRecord.chain`), and its own hash covers its
//! protobuf encoding with `sequence` 0 — the log's position is the
//! backend's, not the record's. The run keeps its chain's head
//! (`Run.audit_head`), stored with every record on both backends (on sled
//! the record carries the run; on PostgreSQL the run's row is written in
//! the record's statement), and an ended run keeps its head signed with
//! the service's key (`Run.audit_seal`). One place links and seals —
//! [`link`], called as every record is made — and one checks: [`check_run`].

use prost::Message as _;
use serde_json::json;
use switchyard_kit::chain::{self, Head, Verifier};
use switchyard_kit::receipt::{Receipt, ReceiptKey};
use switchyard_proto::approval::v1::{AuditRecord, Run};

use crate::{runs, status_of};

/// Run `run_id`'s stream.
pub fn stream(run_id: &str) -> String {
    format!("run/{run_id}")
}

/// The bytes a record's hash covers: its encoding with `sequence` 0.
fn hashed(rec: &AuditRecord) -> Vec<u8> {
    if rec.sequence == 0 {
        return rec.encode_to_vec();
    }
    let mut r = rec.clone();
    r.sequence = 0;
    r.encode_to_vec()
}

/// The head of run `run_id`'s chain once `rec` (linked after `head`) is
/// appended: what the service keeps, and what a benchmark recomputes.
pub fn next_head(run_id: &str, head: Head, rec: &AuditRecord) -> Head {
    let n = head.n + 1;
    Head {
        n,
        hash: chain::link(&stream(run_id), n, &head.hash, &hashed(rec)),
    }
}

/// Links `rec` after the head `run` keeps and moves the head to it; an
/// ended run's head is signed with `key` at `now_ms` (its seal), any other
/// run's seal cleared.
pub(crate) fn link(run: &mut Run, rec: &mut AuditRecord, key: &ReceiptKey, now_ms: u64) {
    let head = Head::of_proto(run.audit_head.as_ref());
    rec.chain = Some(head.next_link());
    let next = next_head(&run.run_id, head, rec);
    let stream = stream(&run.run_id);
    run.audit_head = next.to_proto();
    run.audit_seal = if runs::ended(status_of(run)) {
        let summary = json!({
            "run_id": run.run_id,
            "tenant": run.tenant,
            "status": status_of(run).as_str(),
        });
        let seal = chain::checkpoint_with(key, &[(stream, next)], now_ms, summary);
        serde_json::to_string(&seal).unwrap_or_default()
    } else {
        String::new()
    };
}

/// What checking one run found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RunCheck {
    /// Linked records checked.
    pub(crate) records: u64,
    /// Records from before chains.
    pub(crate) unlinked: u64,
    /// Whether its seal verified.
    pub(crate) sealed: bool,
    /// What is wrong, if anything.
    pub(crate) problem: Option<String>,
}

/// Checks `run`'s audit `records` (in the log's order): their chain, that
/// it ends at the head the run keeps, and an ended run's seal under one of
/// `trusted` (base64 public keys).
pub(crate) fn check_run(run: &Run, records: &[AuditRecord], trusted: &[String]) -> RunCheck {
    let mut out = RunCheck::default();
    let stream = stream(&run.run_id);
    let mut v = Verifier::new();
    for rec in records {
        let Some(l) = &rec.chain else {
            out.unlinked += 1;
            continue;
        };
        if let Err(b) = v.check(&stream, l.n, &chain::stored_hash(&l.prev), &hashed(rec)) {
            out.problem = Some(b.to_string());
            return out;
        }
        out.records += 1;
    }
    let reached = v.heads().head(&stream);
    let kept = Head::of_proto(run.audit_head.as_ref());
    if run.audit_head.is_some() && reached != kept {
        out.problem = Some(format!(
            "stream {stream:?}: the log reaches record {} but the run's stored head is record {}{}",
            reached.n,
            kept.n,
            if reached.n < kept.n {
                " (records were cut off)"
            } else if reached.n > kept.n {
                " (records were added)"
            } else {
                " with another hash (the log was rewritten)"
            }
        ));
        return out;
    }
    if !runs::ended(status_of(run)) || (run.audit_head.is_none() && run.audit_seal.is_empty()) {
        // In flight, or ended before runs were chained.
        return out;
    }
    if run.audit_seal.is_empty() {
        out.problem = Some(format!(
            "stream {stream:?}: the run has ended but carries no seal (it was removed)"
        ));
        return out;
    }
    let seal = match serde_json::from_str::<Receipt>(&run.audit_seal) {
        Ok(s) => s,
        Err(e) => {
            out.problem = Some(format!("stream {stream:?}: the seal does not read: {e}"));
            return out;
        }
    };
    let signed = match chain::verify_checkpoint_summary(&seal, trusted) {
        Ok(s) => s,
        Err(e) => {
            out.problem = Some(format!("stream {stream:?}: {e}"));
            return out;
        }
    };
    let summary = &signed.summary;
    if summary["run_id"] != run.run_id.as_str() || summary["tenant"] != run.tenant.as_str() {
        out.problem = Some(format!(
            "stream {stream:?}: the seal is another run's ({} of tenant {})",
            summary["run_id"], summary["tenant"]
        ));
        return out;
    }
    if let Err(b) = v.against(&signed.heads, |_, _| None) {
        out.problem = Some(b.to_string());
        return out;
    }
    out.sealed = true;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::approval::v1::RunStatus;
    use switchyard_proto::common::v1::ChainHead;

    fn key() -> ReceiptKey {
        ReceiptKey::generate().expect("a key").0
    }

    /// A run audited `n` times, ending on the last record.
    fn audited(key: &ReceiptKey, id: &str, n: usize) -> (Run, Vec<AuditRecord>) {
        let mut run = Run {
            run_id: id.into(),
            tenant: "acme".into(),
            status: RunStatus::Proposed as i32,
            ..Default::default()
        };
        let mut recs = Vec::new();
        for i in 0..n {
            if i + 1 == n {
                run.status = RunStatus::Completed as i32;
            }
            let mut rec = AuditRecord {
                sequence: 10 + i as u64,
                run_id: id.into(),
                event_type: format!("e{i}"),
                ..Default::default()
            };
            link(&mut run, &mut rec, key, 1_000 + i as u64);
            recs.push(rec);
        }
        (run, recs)
    }

    fn problem(run: &Run, recs: &[AuditRecord], trusted: &[String]) -> String {
        check_run(run, recs, trusted).problem.unwrap_or_default()
    }

    #[test]
    fn a_runs_untouched_audit_verifies_and_is_sealed_once_it_ends() {
        let k = key();
        let trusted = vec![k.public_key()];
        let (run, recs) = audited(&k, "r1", 4);
        let c = check_run(&run, &recs, &trusted);
        assert_eq!((c.records, c.sealed, c.problem), (4, true, None));
        // Numbered anew by another backend: the chain does not change.
        let renumbered: Vec<AuditRecord> = recs
            .iter()
            .cloned()
            .map(|mut r| {
                r.sequence += 1000;
                r
            })
            .collect();
        assert_eq!(check_run(&run, &renumbered, &trusted).problem, None);
    }

    #[test]
    fn every_tampering_with_a_runs_audit_is_found() {
        let k = key();
        let trusted = vec![k.public_key()];
        let (run, recs) = audited(&k, "r1", 4);
        let mut edited = recs.clone();
        edited[1].actor = "mallory".into();
        assert!(
            problem(&run, &edited, &trusted).contains("record 3"),
            "{}",
            problem(&run, &edited, &trusted)
        );
        let mut deleted = recs.clone();
        deleted.remove(1);
        assert!(!problem(&run, &deleted, &trusted).is_empty());
        let mut swapped = recs.clone();
        swapped.swap(1, 2);
        assert!(!problem(&run, &swapped, &trusted).is_empty());
        let mut inserted = recs.clone();
        inserted.insert(2, recs[1].clone());
        assert!(!problem(&run, &inserted, &trusted).is_empty());
        let cut = &recs[..3];
        assert!(
            problem(&run, cut, &trusted).contains("cut off"),
            "{}",
            problem(&run, cut, &trusted)
        );
        // Cut off with the stored head moved back too: the seal says more.
        let mut back = run.clone();
        back.audit_head = Some(ChainHead {
            n: 3,
            hash: chain::link(
                &stream("r1"),
                3,
                &chain::stored_hash(&recs[2].chain.clone().unwrap_or_default().prev),
                &hashed(&recs[2]),
            )
            .to_vec(),
        });
        assert!(
            problem(&back, cut, &trusted).contains("checkpoint"),
            "{}",
            problem(&back, cut, &trusted)
        );
        // The seal removed, replaced by another key's, or another run's.
        let mut unsealed = run.clone();
        unsealed.audit_seal.clear();
        assert!(problem(&unsealed, &recs, &trusted).contains("no seal"));
        let (forged, _) = audited(&key(), "r1", 4);
        let mut resealed = run.clone();
        resealed.audit_seal = forged.audit_seal;
        assert!(problem(&resealed, &recs, &trusted).contains("not one of the deployment's keys"));
        let (other, other_recs) = audited(&k, "r2", 4);
        assert_eq!(problem(&other, &other_recs, &trusted), "");
        let mut swapped_seal = other.clone();
        swapped_seal.audit_seal = run.audit_seal.clone();
        assert!(
            problem(&swapped_seal, &other_recs, &trusted).contains("another run's"),
            "{}",
            problem(&swapped_seal, &other_recs, &trusted)
        );
    }
}
