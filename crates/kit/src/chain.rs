//! Hash chains over durable logs, and signed checkpoints of their heads.
//!
//! A log that carries decisions (a job's journal, a tenant's approval
//! audit, a tenant's ledger journal) is split into **streams**, each a
//! sequence of records numbered from 1. Record `n` of a stream carries the
//! hash of record `n - 1` (`prev`; [`GENESIS`] for the first), and its own
//! hash is [`link`] of the stream's name, `n`, `prev` and the record's
//! bytes exactly as stored — so editing, deleting, inserting or reordering
//! a record anywhere changes a hash that a later record (or a checkpoint)
//! vouches for, and [`Verifier`] says where.
//!
//! A chain alone does not catch a log cut short, or a log rewritten whole
//! by someone who recomputed every hash. A **checkpoint** does: the
//! deployment signs the heads of its streams (`n` and hash) with its
//! Ed25519 key ([`checkpoint`], a [`Receipt`] of canonical JSON), and
//! [`Verifier::against`] checks a log against a checkpoint: every stream
//! it names must reach that record with that hash. Keys rotate: a
//! checkpoint is checked against every public key the deployment ever
//! used ([`verify_checkpoint`]).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use switchyard_proto::common::v1::{ChainHead, ChainLink};

use crate::receipt::{Receipt, ReceiptError, ReceiptKey};

/// A record's hash.
pub type Hash = [u8; 32];

/// The `prev` of a stream's first record.
pub const GENESIS: Hash = [0; 32];

/// What the hashes are of, so a chain's hash is never another structure's.
const DOMAIN: &[u8] = b"switchyard.chain.v1\0";

/// The `kind` of a checkpoint's signed body.
const CHECKPOINT: &str = "chain_checkpoint";

/// The hash of record `n` of `stream`, after `prev`, whose stored bytes
/// are `record`. Every part is length-prefixed: no two different inputs
/// hash alike by moving bytes between them.
pub fn link(stream: &str, n: u64, prev: &Hash, record: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    h.update((stream.len() as u64).to_be_bytes());
    h.update(stream.as_bytes());
    h.update(n.to_be_bytes());
    h.update(prev);
    h.update((record.len() as u64).to_be_bytes());
    h.update(record);
    h.finalize().into()
}

/// The hash in `s` (64 hex digits).
pub fn parse_hex(s: &str) -> Option<Hash> {
    crate::hex::decode(s, 64)?.try_into().ok()
}

/// Where a record sits in its stream: its number, the hash before it and
/// its own. A writer stores `n` and `prev` with the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// The record's number in its stream, from 1.
    pub n: u64,
    /// The hash of the record before it ([`GENESIS`] for the first).
    pub prev: Hash,
    /// This record's hash.
    pub hash: Hash,
}

/// A stream's head: its last record's number and hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The last record's number (0: no record yet).
    pub n: u64,
    /// The last record's hash ([`GENESIS`] before the first).
    pub hash: Hash,
}

impl Default for Head {
    fn default() -> Head {
        Head {
            n: 0,
            hash: GENESIS,
        }
    }
}

impl Head {
    /// The head a proto keeps (`Run.audit_head`, `Budget.journal_head`);
    /// none: the genesis.
    pub fn of_proto(h: Option<&ChainHead>) -> Head {
        h.map_or_else(Head::default, |h| Head {
            n: h.n,
            hash: stored_hash(&h.hash),
        })
    }

    /// This head as a proto keeps it; none before the first record.
    pub fn to_proto(self) -> Option<ChainHead> {
        (self.n > 0).then(|| ChainHead {
            n: self.n,
            hash: self.hash.to_vec(),
        })
    }

    /// The link of the record that follows this head.
    pub fn next_link(self) -> ChainLink {
        ChainLink {
            n: self.n + 1,
            prev: self.hash.to_vec(),
        }
    }
}

/// A hash as a proto stores it (`ChainLink.prev`, `ChainHead.hash`); one
/// of the wrong length matches no real hash.
pub fn stored_hash(bytes: &[u8]) -> Hash {
    bytes.try_into().unwrap_or([0xff; 32])
}

/// A writer's heads, one per stream: what the next record links to.
#[derive(Debug, Default, Clone)]
pub struct Heads {
    heads: BTreeMap<String, Head>,
}

impl Heads {
    /// Links the next record of `stream` (its stored bytes `record`) and
    /// moves the stream's head to it.
    pub fn append(&mut self, stream: &str, record: &[u8]) -> Link {
        let head = self.heads.entry(stream.to_owned()).or_default();
        let n = head.n + 1;
        let hash = link(stream, n, &head.hash, record);
        let l = Link {
            n,
            prev: head.hash,
            hash,
        };
        *head = Head { n, hash };
        l
    }

    /// Sets `stream`'s head (from a log replayed at start-up).
    pub fn restore(&mut self, stream: &str, head: Head) {
        self.heads.insert(stream.to_owned(), head);
    }

    /// `stream`'s head ([`Head::default`] for a stream with no record).
    pub fn head(&self, stream: &str) -> Head {
        self.heads.get(stream).copied().unwrap_or_default()
    }

    /// Every stream's head, in stream order.
    pub fn all(&self) -> impl Iterator<Item = (&str, Head)> {
        self.heads.iter().map(|(s, h)| (s.as_str(), *h))
    }
}

/// Where a chain breaks, and how.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Break {
    /// Record `n` was not written after the record now before it: that
    /// record was edited or replaced, or records were removed and the
    /// rest renumbered.
    #[error(
        "stream {stream:?}, record {n}: it was not written after the record now before it (record {} was edited or replaced, or records were removed and renumbered)",
        n - 1
    )]
    Unlinked {
        /// The stream.
        stream: String,
        /// The record whose `prev` does not match (the first found).
        n: u64,
    },
    /// A record's number is not the one after its predecessor's: records
    /// were deleted (`found > expected`) or repeated (`found < expected`).
    #[error(
        "stream {stream:?}: expected record {expected}, found record {found} ({})",
        if found > expected { "records were deleted" } else { "a record was inserted or repeated" }
    )]
    Sequence {
        /// The stream.
        stream: String,
        /// The number the chain expected next.
        expected: u64,
        /// The number found.
        found: u64,
    },
    /// The stream ends before a record a checkpoint vouches for: it was
    /// cut short.
    #[error(
        "stream {stream:?} ends at record {ends_at}, but a signed checkpoint vouches for record {checkpoint} (the log was truncated)"
    )]
    Truncated {
        /// The stream.
        stream: String,
        /// Its last record.
        ends_at: u64,
        /// The record the checkpoint names.
        checkpoint: u64,
    },
    /// The chain through record `n` is not the one a signed checkpoint
    /// vouches for: the log was rewritten (its hashes recomputed), or its
    /// last records edited.
    #[error(
        "stream {stream:?}, record {n}: the chain up to it is not the one the signed checkpoint vouches for (the log was rewritten)"
    )]
    Unsigned {
        /// The stream.
        stream: String,
        /// The record the checkpoint names.
        n: u64,
    },
}

/// Checks streams record by record, in each stream's order (streams may
/// interleave, as they do in a shared log).
#[derive(Debug, Default)]
pub struct Verifier {
    heads: Heads,
    checked: u64,
}

impl Verifier {
    /// A verifier that starts every stream at its genesis.
    pub fn new() -> Verifier {
        Verifier::default()
    }

    /// A verifier that takes `stream` as already checked up to `head` (a
    /// pruned log whose remaining records continue from a kept summary).
    pub fn resume(&mut self, stream: &str, head: Head) {
        self.heads.restore(stream, head);
    }

    /// Checks the next record of `stream`: stored as number `n`, after
    /// `prev`, with bytes `record`. A record after a break is not checked
    /// further: the first break is the one reported.
    pub fn check(&mut self, stream: &str, n: u64, prev: &Hash, record: &[u8]) -> Result<(), Break> {
        let head = self.heads.head(stream);
        if n != head.n + 1 {
            return Err(Break::Sequence {
                stream: stream.to_owned(),
                expected: head.n + 1,
                found: n,
            });
        }
        if *prev != head.hash {
            // The predecessor's bytes no longer hash to what this record
            // recorded.
            return Err(Break::Unlinked {
                stream: stream.to_owned(),
                n,
            });
        }
        let hash = link(stream, n, prev, record);
        self.heads.restore(stream, Head { n, hash });
        self.checked += 1;
        Ok(())
    }

    /// How many records were checked.
    pub fn checked(&self) -> u64 {
        self.checked
    }

    /// The heads reached.
    pub fn heads(&self) -> &Heads {
        &self.heads
    }

    /// Checks the heads reached against a checkpoint's: each stream it
    /// names must have reached at least its record, and the chain through
    /// that record must be the one it signed. `at` gives the hash the
    /// verifier saw at record `n` of a stream (for a stream that went on
    /// after the checkpoint).
    pub fn against(
        &self,
        signed: &[(String, Head)],
        at: impl Fn(&str, u64) -> Option<Hash>,
    ) -> Result<(), Break> {
        for (stream, cp) in signed {
            let reached = self.heads.head(stream);
            if reached.n < cp.n {
                return Err(Break::Truncated {
                    stream: stream.clone(),
                    ends_at: reached.n,
                    checkpoint: cp.n,
                });
            }
            let seen = if reached.n == cp.n {
                Some(reached.hash)
            } else {
                at(stream, cp.n)
            };
            if seen != Some(cp.hash) {
                return Err(Break::Unsigned {
                    stream: stream.clone(),
                    n: cp.n,
                });
            }
        }
        Ok(())
    }
}

/// Signs the heads of `streams` at `at_ms` with the deployment's key.
pub fn checkpoint(key: &ReceiptKey, streams: &[(String, Head)], at_ms: u64) -> Receipt {
    checkpoint_with(key, streams, at_ms, Value::Null)
}

/// [`checkpoint`], with `summary` (what the heads close: a finished job's
/// state and totals, kept signed once its records are pruned) signed
/// alongside when it is not null.
pub fn checkpoint_with(
    key: &ReceiptKey,
    streams: &[(String, Head)],
    at_ms: u64,
    summary: Value,
) -> Receipt {
    let heads: Vec<Value> = streams
        .iter()
        .map(|(s, h)| json!({"stream": s, "n": h.n, "hash": crate::hex::encode(&h.hash)}))
        .collect();
    let mut body = json!({"kind": CHECKPOINT, "at_ms": at_ms, "heads": heads});
    if !summary.is_null() {
        body["summary"] = summary;
    }
    key.sign(body)
}

/// `[audit]`: the deployment's key for signed checkpoints.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// The Ed25519 key that signs checkpoints: a file holding its 32-byte
    /// seed in base64 (`switchyard audit key --new` prints one; mount it
    /// from a Secret). Unset: a key the service keeps in its own store,
    /// made on first start — which anyone who can rewrite that store can
    /// also read, so give a file to make rewrites evident to a verifier
    /// who trusts only its public key.
    pub key_file: Option<std::path::PathBuf>,
    /// Public keys (base64) of keys used before the current one: the
    /// checkpoints they signed still verify after a rotation.
    pub previous_public_keys: Vec<String>,
    /// How often the head of each running job's journal that moved is
    /// signed (a periodic checkpoint), ms; 0: only when jobs finish.
    pub checkpoint_ms: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            key_file: None,
            previous_public_keys: Vec::new(),
            checkpoint_ms: 60_000,
        }
    }
}

impl AuditConfig {
    /// The key in `key_file`, when one is set.
    pub fn file_key(&self) -> Result<Option<ReceiptKey>, String> {
        let Some(path) = &self.key_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading audit.key_file {}: {e}", path.display()))?;
        ReceiptKey::parse(&text)
            .map(Some)
            .map_err(|e| format!("audit.key_file {}: {e}", path.display()))
    }

    /// Checks the key file reads as a key and every previous public key is
    /// an Ed25519 public key.
    pub fn validate(&self) -> Result<(), String> {
        self.file_key()?;
        for k in &self.previous_public_keys {
            if !crate::receipt::is_public_key(k) {
                return Err(format!(
                    "audit.previous_public_keys: {k:?} is not an Ed25519 public key in base64 (what `switchyard audit key --new` printed as the public key)"
                ));
            }
        }
        Ok(())
    }

    /// The public keys a checkpoint may be signed with: `current`'s and
    /// every previous one.
    pub fn trusted(&self, current: &ReceiptKey) -> Vec<String> {
        let mut keys = vec![current.public_key()];
        keys.extend(
            self.previous_public_keys
                .iter()
                .map(|k| k.trim().to_owned()),
        );
        keys
    }
}

/// Why a checkpoint cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Its signature, or its form, is wrong.
    #[error("the checkpoint's signature does not hold: {0}")]
    Signature(#[from] ReceiptError),
    /// It was signed by a key the deployment never used.
    #[error(
        "the checkpoint was signed by key {0}, which is not one of the deployment's keys (current or retired)"
    )]
    UnknownKey(String),
    /// Its body is not a checkpoint.
    #[error("not a chain checkpoint: {0}")]
    Malformed(String),
}

/// The heads a checkpoint signed, once its signature holds under one of
/// `trusted` (base64 Ed25519 public keys: the deployment's current key and
/// every retired one).
pub fn verify_checkpoint(
    r: &Receipt,
    trusted: &[String],
) -> Result<(u64, Vec<(String, Head)>), CheckpointError> {
    verify_checkpoint_summary(r, trusted).map(|s| (s.at_ms, s.heads))
}

/// What a checkpoint whose signature holds says.
#[derive(Debug, Clone, PartialEq)]
pub struct Signed {
    /// When it was signed.
    pub at_ms: u64,
    /// The heads it vouches for.
    pub heads: Vec<(String, Head)>,
    /// The summary signed alongside (null when none was).
    pub summary: Value,
}

/// [`verify_checkpoint`], with the summary signed alongside.
pub fn verify_checkpoint_summary(
    r: &Receipt,
    trusted: &[String],
) -> Result<Signed, CheckpointError> {
    crate::receipt::verify(r, None)?;
    if !trusted.iter().any(|k| k.trim() == r.public_key.trim()) {
        return Err(CheckpointError::UnknownKey(r.key_id.clone()));
    }
    let bad = |why: &str| CheckpointError::Malformed(why.to_owned());
    let body = &r.receipt;
    if body["kind"] != CHECKPOINT {
        return Err(bad("its kind is not chain_checkpoint"));
    }
    let at_ms = body["at_ms"].as_u64().ok_or_else(|| bad("no at_ms"))?;
    let mut heads = Vec::new();
    for h in body["heads"].as_array().ok_or_else(|| bad("no heads"))? {
        let stream = h["stream"]
            .as_str()
            .ok_or_else(|| bad("a head without a stream"))?;
        let n = h["n"].as_u64().ok_or_else(|| bad("a head without n"))?;
        let hash = h["hash"]
            .as_str()
            .and_then(parse_hex)
            .ok_or_else(|| bad("a head without a 64-digit hash"))?;
        heads.push((stream.to_owned(), Head { n, hash }));
    }
    Ok(Signed {
        at_ms,
        heads,
        summary: body["summary"].clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log of two interleaved streams, as stored: (stream, n, prev, bytes).
    fn log() -> Vec<(String, u64, Hash, Vec<u8>)> {
        let mut heads = Heads::default();
        let mut out = Vec::new();
        for (i, s) in ["job-a", "job-b", "job-a", "job-a", "job-b", "job-a"]
            .iter()
            .enumerate()
        {
            let bytes = format!("record {i} of {s}").into_bytes();
            let l = heads.append(s, &bytes);
            out.push((s.to_string(), l.n, l.prev, bytes));
        }
        out
    }

    fn verify(log: &[(String, u64, Hash, Vec<u8>)]) -> Result<Verifier, Break> {
        let mut v = Verifier::new();
        for (s, n, prev, bytes) in log {
            v.check(s, *n, prev, bytes)?;
        }
        Ok(v)
    }

    /// What `v` saw at record `n` of `stream`, recomputed from `log` (a
    /// verifier over a stored log reads it back the same way).
    fn at(log: &[(String, u64, Hash, Vec<u8>)]) -> impl Fn(&str, u64) -> Option<Hash> + '_ {
        move |stream, n| {
            log.iter()
                .find(|(s, k, ..)| s == stream && *k == n)
                .map(|(s, k, prev, bytes)| link(s, *k, prev, bytes))
        }
    }

    #[test]
    fn a_clean_log_verifies_and_reaches_the_writers_heads() {
        let l = log();
        let v = verify(&l).unwrap();
        assert_eq!(v.checked(), 6);
        let mut w = Heads::default();
        for (s, _, _, bytes) in &l {
            w.append(s, bytes);
        }
        assert_eq!(v.heads().head("job-a"), w.head("job-a"));
        assert_eq!(v.heads().head("job-b").n, 2);
    }

    #[test]
    fn an_edited_record_is_found_by_the_record_after_it() {
        let mut l = log();
        l[2].3 = b"record 2 of job-a, rewritten".to_vec();
        // Record 2 of job-a (the third in the log) changed: record 3 says so.
        assert_eq!(
            verify(&l).unwrap_err(),
            Break::Unlinked {
                stream: "job-a".into(),
                n: 3
            }
        );
        let e = verify(&l).unwrap_err().to_string();
        assert!(e.contains("record 2 was edited or replaced"), "{e}");
    }

    #[test]
    fn a_deleted_inserted_or_reordered_record_breaks_the_sequence() {
        // (expected, found) where the sequence breaks.
        let sequence = |l: &[(String, u64, Hash, Vec<u8>)]| match verify(l).unwrap_err() {
            Break::Sequence {
                expected, found, ..
            } => (expected, found),
            other => panic!("{other:?}"),
        };
        let mut deleted = log();
        deleted.remove(2);
        assert_eq!(sequence(&deleted), (2, 3));
        let mut inserted = log();
        let copy = inserted[2].clone();
        inserted.insert(3, copy);
        assert_eq!(sequence(&inserted), (3, 2));
        let mut reordered = log();
        reordered.swap(2, 3);
        assert_eq!(sequence(&reordered), (2, 3));
        // Renumbering the rest after a deletion leaves the prev hashes
        // pointing at the deleted record.
        let mut renumbered = log();
        renumbered.remove(2);
        for r in renumbered.iter_mut().filter(|r| r.0 == "job-a" && r.1 > 2) {
            r.1 -= 1;
        }
        assert!(matches!(
            verify(&renumbered).unwrap_err(),
            Break::Unlinked { n: 2, .. }
        ));
    }

    #[test]
    fn a_checkpoint_catches_truncation_and_a_log_rewritten_whole() {
        let key = ReceiptKey::from_seed(&[7; 32]).unwrap();
        let l = log();
        let v = verify(&l).unwrap();
        let heads: Vec<(String, Head)> = v.heads().all().map(|(s, h)| (s.to_owned(), h)).collect();
        let cp = checkpoint(&key, &heads, 1_800_000_000_000);
        let (at_ms, signed) = verify_checkpoint(&cp, &[key.public_key()]).unwrap();
        assert_eq!(at_ms, 1_800_000_000_000);
        v.against(&signed, at(&l)).unwrap();

        // Cut short: the last record of job-a is gone; the chain alone holds.
        let mut cut = l.clone();
        cut.pop();
        let v = verify(&cut).unwrap();
        assert_eq!(
            v.against(&signed, at(&cut)).unwrap_err(),
            Break::Truncated {
                stream: "job-a".into(),
                ends_at: 3,
                checkpoint: 4
            }
        );

        // Rewritten whole, every hash recomputed: the chain holds, the
        // checkpoint does not.
        let mut heads2 = Heads::default();
        let forged: Vec<_> = l
            .iter()
            .map(|(s, _, _, bytes)| {
                let bytes = [bytes.as_slice(), b"!"].concat();
                let k = heads2.append(s, &bytes);
                (s.clone(), k.n, k.prev, bytes)
            })
            .collect();
        let v = verify(&forged).unwrap();
        assert!(matches!(
            v.against(&signed, at(&forged)).unwrap_err(),
            Break::Unsigned { .. }
        ));
        // The last record edited: no record after it to notice; the
        // checkpoint does.
        let mut last = l.clone();
        last[5].3 = b"the last word, changed".to_vec();
        let v = verify(&last).unwrap();
        assert_eq!(
            v.against(&signed, at(&last)).unwrap_err(),
            Break::Unsigned {
                stream: "job-a".into(),
                n: 4
            }
        );

        // A log that went on after the checkpoint still verifies against it.
        let mut longer = l.clone();
        let mut w = Heads::default();
        for (s, _, _, bytes) in &l {
            w.append(s, bytes);
        }
        let next = w.append("job-b", b"later");
        longer.push(("job-b".into(), next.n, next.prev, b"later".to_vec()));
        let v = verify(&longer).unwrap();
        v.against(&signed, at(&longer)).unwrap();
    }

    #[test]
    fn a_replaced_checkpoint_or_a_swapped_key_is_refused_and_a_retired_key_still_verifies() {
        let old = ReceiptKey::from_seed(&[1; 32]).unwrap();
        let new = ReceiptKey::from_seed(&[2; 32]).unwrap();
        let stranger = ReceiptKey::from_seed(&[3; 32]).unwrap();
        let heads = vec![(
            "tenant-default".to_owned(),
            Head {
                n: 3,
                hash: [9; 32],
            },
        )];
        let cp = checkpoint(&old, &heads, 5);
        // Rotated: the old key is retired but still trusted for old checkpoints.
        let trusted = [new.public_key(), old.public_key()];
        assert_eq!(verify_checkpoint(&cp, &trusted).unwrap().1, heads);

        // Its heads edited after signing.
        let mut edited = cp.clone();
        edited.receipt["heads"][0]["n"] = json!(2);
        assert!(matches!(
            verify_checkpoint(&edited, &trusted),
            Err(CheckpointError::Signature(_))
        ));
        // Re-signed by a key the deployment never had.
        let swapped = checkpoint(&stranger, &heads, 5);
        assert!(matches!(
            verify_checkpoint(&swapped, &trusted),
            Err(CheckpointError::UnknownKey(id)) if id == stranger.id()
        ));
        // Another signed body passed off as a checkpoint.
        let other = new.sign(json!({"kind": "approval", "at_ms": 5, "heads": []}));
        assert!(matches!(
            verify_checkpoint(&other, &trusted),
            Err(CheckpointError::Malformed(_))
        ));
    }

    #[test]
    fn hashes_read_back_from_hex_and_parts_cannot_trade_bytes() {
        let h = link("s", 1, &GENESIS, b"x");
        assert_eq!(parse_hex(&crate::hex::encode(&h)), Some(h));
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_hex(&"é".repeat(32)), None);
        assert_ne!(link("ab", 1, &GENESIS, b"c"), link("a", 1, &GENESIS, b"bc"));
    }

    #[test]
    fn the_audit_key_comes_from_its_file_and_previous_keys_must_be_public_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (key, seed) = ReceiptKey::generate().unwrap();
        let path = dir.path().join("audit.key");
        std::fs::write(&path, ReceiptKey::seed_text(&seed)).unwrap();
        let mut cfg = AuditConfig {
            key_file: Some(path.clone()),
            previous_public_keys: vec![key.public_key()],
            ..Default::default()
        };
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.file_key().unwrap().unwrap().id(), key.id());
        assert_eq!(cfg.trusted(&key).len(), 2);
        cfg.previous_public_keys = vec!["not a key".into()];
        assert!(
            cfg.validate()
                .unwrap_err()
                .contains("not an Ed25519 public key")
        );
        cfg.previous_public_keys.clear();
        std::fs::write(&path, "short").unwrap();
        let e = cfg.validate().unwrap_err();
        assert!(e.contains("audit.key_file"), "{e}");
        assert!(
            !e.contains(&ReceiptKey::seed_text(&seed)),
            "never the secret"
        );
        cfg.key_file = Some(dir.path().join("missing"));
        assert!(
            cfg.validate()
                .unwrap_err()
                .contains("reading audit.key_file")
        );
    }

    #[test]
    fn a_summary_is_signed_with_the_heads_and_read_back() {
        let (key, _) = ReceiptKey::generate().unwrap();
        let heads = vec![(
            "job/a".to_owned(),
            Head {
                n: 3,
                hash: [7; 32],
            },
        )];
        let r = checkpoint_with(&key, &heads, 9, json!({"state": "COMPLETED"}));
        let s = verify_checkpoint_summary(&r, &[key.public_key()]).unwrap();
        assert_eq!((s.at_ms, s.heads.clone()), (9, heads));
        assert_eq!(s.summary["state"], "COMPLETED");
        let mut edited = r.clone();
        edited.receipt["summary"]["state"] = json!("CANCELLED");
        assert!(matches!(
            verify_checkpoint_summary(&edited, &[key.public_key()]),
            Err(CheckpointError::Signature(_))
        ));
    }
}
