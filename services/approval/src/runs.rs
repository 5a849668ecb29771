//! The runs as the service holds them. Runs that can still move (proposed,
//! approved, running) are in memory with where their audit records are;
//! runs that ended (completed, rejected, cancelled, failed) are on disk
//! only and read on demand, so memory and start-up grow with the runs in
//! flight, not with history. A failed run approved again comes back into
//! memory.
//!
//! Every run is stored in the `runs` tree on every change. Start-up loads
//! the runs listed in `live` and replays the audit log from the checkpoint
//! (before the first record of every run in memory); an ended run's audit
//! positions are kept in `ended_audit`.

use std::borrow::Cow;
use std::collections::HashMap;

use switchyard_core::run::RunStatus as S;
use switchyard_proto::approval::v1::{AuditRecord, Run};
use switchyard_store::{Log, Mark, Number, Store, StoreError, Tree};

use crate::status_of;

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

pub(crate) struct Runs {
    live: HashMap<String, Run>,
    /// Audit positions of the runs in memory.
    audit: HashMap<String, Vec<u64>>,
    tree: Tree<Run>,
    live_ids: Tree<Mark>,
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
            ended_audit: store.tree("ended_audit")?,
            meta: store.tree("meta")?,
        };
        let old_layout = runs.meta.get(LAYOUT)?.is_none_or(|m| m.value < 2);
        let first_layout = old_layout && !runs.tree.is_empty();
        if old_layout && !first_layout {
            // A new data directory starts in this layout.
            runs.meta.put(LAYOUT, &Number { value: 2 })?;
        }
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
                    runs.live.insert(id, run);
                }
            }
        }
        let after = if first_layout {
            0
        } else {
            runs.meta.get(CHECKPOINT)?.map_or(0, |m| m.value)
        };
        for r in log.replay_after(after) {
            let (seq, rec) = r?;
            if runs.live.contains_key(&rec.run_id) {
                runs.audit.entry(rec.run_id).or_default().push(seq);
            }
        }
        if first_layout {
            let ids: Vec<String> = runs.live.keys().cloned().collect();
            for id in ids {
                if let Some(run) = runs.live.get(&id).cloned() {
                    // Ended before this layout: their retention starts now.
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    runs.store(run, now)?;
                }
            }
            runs.meta.put(LAYOUT, &Number { value: 2 })?;
        }
        Ok(runs)
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

    /// A run in flight, to change in place (store it after).
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut Run> {
        self.live.get_mut(id)
    }

    /// Stores `run` as it is now: in memory while it can move, on disk only
    /// once it ended.
    pub(crate) fn store(&mut self, run: Run, now_ms: u64) -> Result<(), StoreError> {
        let id = run.run_id.clone();
        self.tree.put(&id, &run)?;
        if ended(status_of(&run)) {
            let positions = self.audit.remove(&id).unwrap_or_default();
            if self.live.remove(&id).is_some() || !positions.is_empty() {
                let ended = Positions {
                    positions,
                    ended_ms: now_ms,
                };
                self.ended_audit.put(&id, &ended)?;
            }
            self.live_ids.remove(&id)?;
        } else {
            if !self.live.contains_key(&id) {
                // New, or an ended run back in flight.
                let back = self.ended_audit.get(&id)?.unwrap_or_default();
                self.audit.insert(id.clone(), back.positions);
                self.ended_audit.remove(&id)?;
                self.live_ids.put(&id, &Mark {})?;
            }
            self.live.insert(id, run);
        }
        Ok(())
    }

    /// Notes that audit record `seq` is about run `id`.
    pub(crate) fn audited(&mut self, id: &str, seq: u64) -> Result<(), StoreError> {
        if self.live.contains_key(id) {
            self.audit.entry(id.to_owned()).or_default().push(seq);
        } else {
            let mut p = self.ended_audit.get(id)?.unwrap_or_default();
            p.positions.push(seq);
            self.ended_audit.put(id, &p)?;
        }
        Ok(())
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

    /// A run in flight, to change in place (store it after).
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut Run> {
        match self {
            RunSet::Sled(r) => r.get_mut(id),
            RunSet::Slice(s) => s.runs.get_mut(id),
        }
    }

    /// Stores `run` as it is now.
    pub(crate) fn store(&mut self, run: Run, now_ms: u64) -> Result<(), StoreError> {
        match self {
            RunSet::Sled(r) => r.store(run, now_ms),
            RunSet::Slice(s) => {
                s.dirty.insert(run.run_id.clone());
                s.runs.insert(run.run_id.clone(), run);
                Ok(())
            }
        }
    }

    /// Notes that audit record `seq` is about run `id` (sled keeps an index;
    /// PostgreSQL's audit table is indexed by run).
    pub(crate) fn audited(&mut self, id: &str, seq: u64) -> Result<(), StoreError> {
        match self {
            RunSet::Sled(r) => r.audited(id, seq),
            RunSet::Slice(_) => Ok(()),
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
