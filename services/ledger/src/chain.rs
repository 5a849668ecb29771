//! Each budget's journal records as a hash chain (issue 46; `docs/audit.md`).
//!
//! A budget's records are stream `budget/<budget_id>` of the chain in
//! [`switchyard_kit::chain`]: record `n` carries the hash of the budget's
//! record `n - 1` (`JournalRecord.chain`), and its own hash covers its
//! encoding as stored. The budget keeps its chain's head
//! (`Budget.journal_head`), moved by [`Books::apply`](crate::books::Books::apply)
//! — the one place balances change — so the head is in every place the
//! budget is: the sled snapshot and the journal after it, a retired
//! budget's record, a PostgreSQL row written in the record's transaction.
//! One place links ([`link`], as the desk makes each record) and one
//! checks ([`Check`]).
//!
//! Pruning the sled journal past retention keeps, for each budget whose
//! first records go, the head at its last pruned record (its *base*): the
//! records left must continue from it.

use std::collections::{BTreeMap, HashSet};

use prost::Message as _;
use switchyard_kit::chain::{self, Head, Verifier};
use switchyard_proto::ledger::v1::{
    JournalBreak, JournalRecord, RecordKind, VerifyJournalResponse,
};

/// Budget `budget_id`'s stream.
pub fn stream(budget_id: &str) -> String {
    format!("budget/{budget_id}")
}

/// Links `rec` after `head`, its budget's head before it.
pub(crate) fn link(rec: &mut JournalRecord, head: Head) {
    rec.chain = Some(head.next_link());
}

/// The head of `rec`'s budget once it is appended (`None`: not chained).
pub fn head_after(rec: &JournalRecord) -> Option<Head> {
    let l = rec.chain.as_ref()?;
    Some(Head {
        n: l.n,
        hash: chain::link(
            &stream(&rec.budget_id),
            l.n,
            &chain::stored_hash(&l.prev),
            &rec.encode_to_vec(),
        ),
    })
}

/// What a budget keeps of its chain.
#[derive(Debug, Clone, Default)]
pub(crate) struct Kept {
    /// Its head (`Budget.journal_head`).
    pub(crate) head: Head,
    /// The head at its last record pruned, if any was.
    pub(crate) base: Option<Head>,
}

/// Checks the journal's chains record by record, in the journal's order
/// (budgets interleave), against what each budget keeps.
#[derive(Debug, Default)]
pub(crate) struct Check {
    budgets: BTreeMap<String, Kept>,
    verifier: Verifier,
    /// Streams whose first record has been seen.
    started: HashSet<String>,
    broken: BTreeMap<String, String>,
    unlinked: u64,
    resumed: u64,
}

impl Check {
    /// A check of `budgets` (by id); records of other budgets are skipped.
    pub(crate) fn new(budgets: BTreeMap<String, Kept>) -> Check {
        Check {
            budgets,
            ..Check::default()
        }
    }

    /// Checks the journal's next record.
    pub(crate) fn record(&mut self, rec: &JournalRecord) {
        let Some(kept) = self.budgets.get(&rec.budget_id) else {
            return;
        };
        if self.broken.contains_key(&rec.budget_id) {
            return;
        }
        let stream = stream(&rec.budget_id);
        let Some(l) = &rec.chain else {
            // Before chains, or a refusal of a retired budget: outside
            // every chain. Anything else unlinked once the chain began was
            // put there.
            if self.started.contains(&stream) && rec.kind() != RecordKind::Refused {
                self.broken.insert(
                    rec.budget_id.clone(),
                    format!(
                        "stream {stream:?}: journal record {} ({}) is in no chain although the budget's chain had begun (it was inserted, or its link removed)",
                        rec.sequence,
                        rec.kind().as_str_name()
                    ),
                );
            } else {
                self.unlinked += 1;
            }
            return;
        };
        if self.started.insert(stream.clone()) && l.n > 1 {
            // The records before it were pruned: they must have ended at
            // the base kept then.
            match kept.base {
                Some(base) if base.n + 1 == l.n => {
                    self.verifier.resume(&stream, base);
                    self.resumed += 1;
                }
                _ => {}
            }
        }
        if let Err(b) = self.verifier.check(
            &stream,
            l.n,
            &chain::stored_hash(&l.prev),
            &rec.encode_to_vec(),
        ) {
            self.broken.insert(
                rec.budget_id.clone(),
                format!("{b} — journal record {}", rec.sequence),
            );
        }
    }

    /// What was found.
    pub(crate) fn finish(mut self) -> VerifyJournalResponse {
        for (id, kept) in &self.budgets {
            if self.broken.contains_key(id) {
                continue;
            }
            let stream = stream(id);
            let reached = self.verifier.heads().head(&stream);
            if reached != kept.head {
                let how = if reached.n < kept.head.n {
                    "records were deleted or cut off"
                } else if reached.n > kept.head.n {
                    "records were added"
                } else {
                    "the last record was edited, or the log rewritten"
                };
                self.broken.insert(
                    id.clone(),
                    format!(
                        "stream {stream:?}: the journal reaches record {} but the budget keeps record {} as its head ({how})",
                        reached.n, kept.head.n
                    ),
                );
            }
        }
        VerifyJournalResponse {
            budgets: self.budgets.len() as u64,
            records: self.verifier.checked(),
            unlinked: self.unlinked,
            pruned: self.resumed,
            problems: self
                .broken
                .into_iter()
                .map(|(budget_id, problem)| JournalBreak { budget_id, problem })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Budget `b`'s `n` records, linked, and the head they reach.
    fn records(b: &str, n: usize) -> (Vec<JournalRecord>, Head) {
        let mut head = Head::default();
        let mut out = Vec::new();
        for i in 0..n {
            let mut rec = JournalRecord {
                sequence: i as u64 + 1,
                budget_id: b.into(),
                kind: if i == 0 {
                    RecordKind::BudgetCreated
                } else {
                    RecordKind::Reserved
                } as i32,
                tokens: i as u64,
                ..Default::default()
            };
            link(&mut rec, head);
            head = head_after(&rec).expect("linked");
            out.push(rec);
        }
        (out, head)
    }

    fn check(
        recs: &[JournalRecord],
        head: Head,
        base: Option<Head>,
    ) -> (VerifyJournalResponse, Option<String>) {
        let mut c = Check::new(BTreeMap::from([("b".to_owned(), Kept { head, base })]));
        for r in recs {
            c.record(r);
        }
        let f = c.finish();
        let p = f.problems.first().map(|p| p.problem.clone());
        (f, p)
    }

    #[test]
    fn a_clean_chain_verifies_to_the_head_the_budget_keeps() {
        let (recs, head) = records("b", 5);
        let (f, p) = check(&recs, head, None);
        assert_eq!(p, None);
        assert_eq!((f.budgets, f.records), (1, 5));
    }

    #[test]
    fn every_kind_of_tampering_is_found() {
        let (recs, head) = records("b", 5);
        let mut edited = recs.clone();
        edited[1].tokens = 99;
        assert!(
            check(&edited, head, None)
                .1
                .expect("edit")
                .contains("record 3")
        );
        let mut deleted = recs.clone();
        deleted.remove(2);
        assert!(
            check(&deleted, head, None)
                .1
                .expect("delete")
                .contains("deleted")
        );
        let mut moved = recs.clone();
        moved.swap(1, 2);
        assert!(check(&moved, head, None).1.is_some());
        let mut inserted = recs.clone();
        inserted.insert(
            3,
            JournalRecord {
                budget_id: "b".into(),
                kind: RecordKind::Committed as i32,
                ..Default::default()
            },
        );
        assert!(
            check(&inserted, head, None)
                .1
                .expect("insert")
                .contains("in no chain")
        );
        let cut = &recs[..4];
        assert!(
            check(cut, head, None)
                .1
                .expect("truncate")
                .contains("cut off")
        );
        let mut last = recs.clone();
        last[4].tokens = 7;
        assert!(check(&last, head, None).1.expect("last").contains("edited"));
    }

    #[test]
    fn a_pruned_prefix_verifies_only_from_the_base_kept_at_pruning() {
        let (recs, head) = records("b", 5);
        let base = head_after(&recs[1]);
        let (f, p) = check(&recs[2..], head, base);
        assert_eq!(p, None);
        assert_eq!(f.pruned, 1);
        // Without the base, or past it, the missing records are deletions.
        assert!(check(&recs[2..], head, None).1.is_some());
        assert!(check(&recs[3..], head, base).1.is_some());
        // Records still there from before the base verify from the start.
        assert_eq!(check(&recs, head, base).1, None);
    }

    #[test]
    fn unlinked_records_before_the_chain_began_are_counted_not_refused() {
        let (mut recs, _) = records("b", 3);
        let old = JournalRecord {
            budget_id: "b".into(),
            kind: RecordKind::Reserved as i32,
            ..Default::default()
        };
        recs.insert(0, old);
        let head = head_after(&recs[3]).expect("linked");
        let (f, p) = check(&recs, head, None);
        assert_eq!(p, None);
        assert_eq!(f.unlinked, 1);
    }
}
