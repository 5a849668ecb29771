//! The runs as the service holds them. Runs that can still move (proposed,
//! approved, running) are in memory with where their audit records are;
//! runs that ended (completed, rejected, cancelled, failed) are on disk
//! only and read on demand, so memory and start-up grow with the runs in
//! flight, not with history. A failed run approved again comes back into
//! memory.
//!
//! The audit log is the runs' journal: every change of a run is audited,
//! and its audit record carries the run as the change left it ([`KeptRun`],
//! beside the record's own fields). A run in flight is written nowhere
//! else; once it ended it is stored in the `runs` tree with its audit
//! positions in `ended_audit`, written before its last record (so that
//! record is never durable without them). Start-up replays the audit log
//! from the checkpoint (before the first record of every run in memory):
//! the last run each record carries is the run. Data directories of the
//! earlier layout also list their runs in flight in `live` (still read).

use std::borrow::Cow;
use std::collections::HashMap;

use switchyard_core::run::RunStatus as S;
use switchyard_proto::approval::v1::{AuditRecord, Run};
use switchyard_store::{Log, Mark, Number, Store, StoreError, Tree};

use crate::status_of;

/// What the embedded service keeps in an audit record beyond the record's
/// fields: the run as the audited change left it (field 1000 is reserved
/// in `AuditRecord` for it; readers of records skip it). Decoding a record
/// as this type reads its run id too.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeptRun {
    /// The record's run id (`AuditRecord.run_id`).
    #[prost(string, tag = "4")]
    pub(crate) run_id: String,
    /// The run after the change.
    #[prost(message, optional, tag = "1000")]
    pub(crate) run: Option<Run>,
}

/// Statuses whose runs leave memory.
pub(crate) fn ended(s: S) -> bool {
    matches!(s, S::Completed | S::Rejected | S::Cancelled | S::Failed)
}

/// An ended run's audit positions, and when it ended.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Positions {
    #[prost(uint64, repeated, tag = "1")]
    pub(crate) positions: Vec<u64>,
    /// When the run ended, ms.
    #[prost(uint64, tag = "2")]
    pub(crate) ended_ms: u64,
}

const LAYOUT: &str = "layout";
const CHECKPOINT: &str = "checkpoint";
/// The layout this release writes: runs in flight only in the audit log.
const CURRENT_LAYOUT: u64 = 3;

pub(crate) struct Runs {
    live: HashMap<String, Run>,
    /// Audit positions of the runs in memory.
    audit: HashMap<String, Vec<u64>>,
    /// Ended runs.
    tree: Tree<Run>,
    /// Runs in flight as the earlier layout listed them.
    live_ids: Tree<Mark>,
    /// The runs in memory listed in `live_ids` (their mark goes when they end).
    listed: std::collections::HashSet<String>,
    ended_audit: Tree<Positions>,
    meta: Tree<Number>,
}

impl Runs {
    /// Loads the runs in flight and their audit positions.
    pub(crate) fn open(store: &Store, log: &Log<AuditRecord>) -> Result<Runs, StoreError> {
        let mut runs = Runs {
            live: HashMap::new(),
            audit: HashMap::new(),
            tree: store.tree("runs")?,
            live_ids: store.tree("live")?,
            listed: std::collections::HashSet::new(),
            ended_audit: store.tree("ended_audit")?,
            meta: store.tree("meta")?,
        };
        let layout = runs.meta.get(LAYOUT)?.map_or(1, |m| m.value);
        let first_layout = layout < 2 && !runs.tree.is_empty();
        if first_layout {
            // Every run in memory once, then the ended ones leave.
            for r in runs.tree.iter() {
                let (id, run) = r?;
                runs.live.insert(id, run);
            }
        } else {
            let ids: Vec<String> = runs
                .live_ids
                .iter()
                .map(|r| r.map(|(id, _)| id))
                .collect::<Result<_, _>>()?;
            for id in ids {
                if let Some(run) = runs.tree.get(&id)? {
                    runs.live.insert(id.clone(), run);
                    runs.listed.insert(id);
                }
            }
        }
        let after = if first_layout {
            0
        } else {
            runs.meta.get(CHECKPOINT)?.map_or(0, |m| m.value)
        };
        for r in log.replay_after_as::<KeptRun>(after) {
            let (seq, kept) = r?;
            if let Some(run) = kept.run {
                runs.replayed(run, seq)?;
            }
            if let Some(p) = runs.audit.get_mut(&kept.run_id) {
                p.push(seq);
            } else if runs.live.contains_key(&kept.run_id) {
                runs.audit.insert(kept.run_id, vec![seq]);
            }
        }
        if first_layout {
            let ids: Vec<String> = runs.live.keys().cloned().collect();
            // Ended before this layout: their retention starts now.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            for id in ids {
                let Some(run) = runs.live.get(&id) else {
                    continue;
                };
                if ended(status_of(run)) {
                    let run = run.clone();
                    let positions = runs.leave_memory(&id)?.unwrap_or_default();
                    runs.store_ended(&run, positions, now)?;
                } else {
                    // Listed as the earlier layout did: its records carry
                    // no run.
                    runs.live_ids.put(&id, &Mark {})?;
                    runs.listed.insert(id);
                }
            }
        }
        if layout < CURRENT_LAYOUT {
            runs.meta.put(
                LAYOUT,
                &Number {
                    value: CURRENT_LAYOUT,
                },
            )?;
        }
        Ok(runs)
    }

    /// Start-up: `run` as audit record `seq` left it.
    fn replayed(&mut self, run: Run, seq: u64) -> Result<(), StoreError> {
        let id = run.run_id.clone();
        if ended(status_of(&run)) {
            // On disk, stored before this record.
            self.leave_memory(&id)?;
        } else {
            if !self.live.contains_key(&id) {
                // New, or an ended run back in flight: its records up to
                // here are the ones kept when it ended (a later ending
                // whose record was lost may have kept more).
                let back = self.ended_audit.get(&id)?.unwrap_or_default();
                let earlier = back.positions.into_iter().filter(|&p| p < seq);
                self.audit.insert(id.clone(), earlier.collect());
            }
            self.live.insert(id, run);
        }
        Ok(())
    }

    /// Run `id`, from memory or disk.
    pub(crate) fn get(&self, id: &str) -> Option<Cow<'_, Run>> {
        if let Some(r) = self.live.get(id) {
            return Some(Cow::Borrowed(r));
        }
        match self.tree.get(id) {
            Ok(r) => r.map(Cow::Owned),
            Err(e) => {
                tracing::error!(run_id = id, error = %e, "reading an ended run");
                None
            }
        }
    }

    /// True when run `id` exists.
    pub(crate) fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// A run in flight, to change in place (audit it after: that keeps it).
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut Run> {
        self.live.get_mut(id)
    }

    /// Keeps `run` as audit record `seq` leaves it (called with the log's
    /// buffer held, before the record is framed): in memory while it can
    /// move — the record carries it — and once it ended, in the tree with
    /// its audit positions, so the record is never durable without them.
    pub(crate) fn keep(&mut self, run: &Run, seq: u64, now_ms: u64) -> Result<(), StoreError> {
        let id = &run.run_id;
        if ended(status_of(run)) {
            let (mut positions, ended_ms) = match self.leave_memory(id)? {
                Some(p) => (p, now_ms),
                // Audited again after it ended: its retention runs on.
                None => match self.ended_audit.get(id)? {
                    Some(p) => (p.positions, p.ended_ms),
                    None => (Vec::new(), now_ms),
                },
            };
            positions.push(seq);
            self.store_ended(run, positions, ended_ms)?;
        } else {
            match self.live.get_mut(id) {
                Some(r) => run.clone_into(r),
                None => {
                    // New, or an ended run back in flight (its earlier
                    // records stay its).
                    let back = self.ended_audit.get(id)?.unwrap_or_default();
                    self.audit.insert(id.clone(), back.positions);
                    self.live.insert(id.clone(), run.clone());
                }
            }
            self.audit.entry(id.clone()).or_default().push(seq);
        }
        Ok(())
    }

    /// Run `id` leaves memory (and the earlier layout's list); its audit
    /// positions, when it was in memory.
    fn leave_memory(&mut self, id: &str) -> Result<Option<Vec<u64>>, StoreError> {
        self.live.remove(id);
        if self.listed.remove(id) {
            self.live_ids.remove(id)?;
        }
        Ok(self.audit.remove(id))
    }

    /// Stores ended `run` with its audit `positions`, ended at `ended_ms`.
    fn store_ended(
        &mut self,
        run: &Run,
        positions: Vec<u64>,
        ended_ms: u64,
    ) -> Result<(), StoreError> {
        self.tree.put(&run.run_id, run)?;
        self.ended_audit.put(
            &run.run_id,
            &Positions {
                positions,
                ended_ms,
            },
        )
    }

    /// Where run `id`'s audit records are (`None`: no such run).
    pub(crate) fn positions(&self, id: &str) -> Option<Vec<u64>> {
        if self.live.contains_key(id) {
            return Some(self.audit.get(id).cloned().unwrap_or_default());
        }
        match self.ended_audit.get(id) {
            Ok(Some(p)) => Some(p.positions),
            Ok(None) => self.contains_key(id).then(Vec::new),
            Err(e) => {
                tracing::error!(run_id = id, error = %e, "reading an ended run's audit positions");
                None
            }
        }
    }

    /// The ids of every run, read without holding the books for long: those
    /// in flight now, and the tree of ended ones to read them from after
    /// (a run that ends meanwhile is in both).
    pub(crate) fn ids(&self) -> (Vec<String>, Tree<Run>) {
        (self.live.keys().cloned().collect(), self.tree.clone())
    }

    /// The runs in flight.
    pub(crate) fn live(&self) -> impl Iterator<Item = &Run> {
        self.live.values()
    }

    /// Every run: those in flight, then the ended ones from disk.
    pub(crate) fn all(&self) -> impl Iterator<Item = Cow<'_, Run>> {
        let ended = self.tree.iter().filter_map(|r| match r {
            Ok((id, run)) if !self.live.contains_key(&id) => Some(Cow::Owned(run)),
            Ok(_) => None,
            Err(e) => {
                tracing::error!(error = %e, "reading ended runs");
                None
            }
        });
        self.live.values().map(Cow::Borrowed).chain(ended)
    }

    /// Removes the runs that ended before `cutoff_ms` and the audit records
    /// no run kept still has (a whole chunk at a time); returns how many
    /// runs and records went.
    pub(crate) fn prune(
        &mut self,
        cutoff_ms: u64,
        log: &Log<AuditRecord>,
    ) -> Result<(usize, u64), StoreError> {
        let mut keep_from = self.first_audit().unwrap_or(log.last() + 1);
        let mut gone = Vec::new();
        for r in self.ended_audit.iter() {
            let (id, p) = r?;
            if self.live.contains_key(&id) {
                // Ended once, in flight again: its records are kept.
                continue;
            }
            if p.ended_ms < cutoff_ms {
                gone.push(id);
            } else if let Some(&f) = p.positions.first() {
                keep_from = keep_from.min(f);
            }
        }
        for id in &gone {
            self.tree.remove(id)?;
            self.ended_audit.remove(id)?;
        }
        let records = log.prune_before(keep_from)?;
        Ok((gone.len(), records))
    }

    /// The first audit record of any run in memory.
    fn first_audit(&self) -> Option<u64> {
        self.audit.values().filter_map(|p| p.first()).min().copied()
    }

    /// How many runs are in memory.
    pub(crate) fn in_memory(&self) -> usize {
        self.live.len()
    }

    /// Records where the next start-up replays the audit log from: before
    /// the first record of every run in memory, and never past `durable`.
    pub(crate) fn checkpoint(&self, durable: u64) -> Result<u64, StoreError> {
        let at = self.first_audit().map_or(durable, |f| f - 1).min(durable);
        self.meta.put(CHECKPOINT, &Number { value: at })?;
        Ok(at)
    }
}

/// The runs one PostgreSQL transaction locked: what a mutation reads and
/// changes; the changed ones are written back when it commits.
#[derive(Default)]
pub(crate) struct Slice {
    pub(crate) runs: HashMap<String, Run>,
    pub(crate) dirty: std::collections::BTreeSet<String>,
}

/// The runs a mutation works on: the sled replica's own, or a slice.
pub(crate) enum RunSet {
    Sled(Runs),
    Slice(Slice),
}

impl RunSet {
    /// Run `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Cow<'_, Run>> {
        match self {
            RunSet::Sled(r) => r.get(id),
            RunSet::Slice(s) => s.runs.get(id).map(Cow::Borrowed),
        }
    }

    /// True when run `id` exists.
    pub(crate) fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// A run in flight, to change in place (audit it after: that keeps it).
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut Run> {
        match self {
            RunSet::Sled(r) => r.get_mut(id),
            RunSet::Slice(s) => s.runs.get_mut(id),
        }
    }

    /// The sled runs (`None` on PostgreSQL).
    pub(crate) fn sled(&self) -> Option<&Runs> {
        match self {
            RunSet::Sled(r) => Some(r),
            RunSet::Slice(_) => None,
        }
    }

    /// The sled runs, to change (`None` on PostgreSQL).
    pub(crate) fn sled_mut(&mut self) -> Option<&mut Runs> {
        match self {
            RunSet::Sled(r) => Some(r),
            RunSet::Slice(_) => None,
        }
    }
}
