//! The registry's in-memory state: agents, tools, the capability index and
//! the watch log. Durable records live in sled (see `lib.rs`); this is the
//! view served and watched.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use switchyard_core::validate::capability_lineage;
use switchyard_proto::registry::v1::{
    Agent, AgentStatus, CapabilityStats, Tool, WatchEventType, WatchResponse,
};

/// One agent with its volatile lease state.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Stored record (spec, timestamps, stats; status and lease as last persisted).
    pub agent: Agent,
    /// Lease expiry, epoch ms.
    pub lease_expires_ms: u64,
    /// Heartbeat or stats changes not yet written to disk.
    pub dirty: bool,
}

impl Entry {
    pub fn status(&self) -> AgentStatus {
        AgentStatus::try_from(self.agent.status).unwrap_or(AgentStatus::Unspecified)
    }

    /// Whether `in_flight` has reached max concurrency (0 = unlimited).
    pub fn saturated(&self) -> bool {
        let max = self.agent.spec.as_ref().map_or(0, |s| s.max_concurrency);
        max > 0 && self.agent.in_flight >= max
    }

    /// The agent as clients see it.
    pub fn view(&self) -> Agent {
        let mut a = self.agent.clone();
        a.lease_expires_at = Some(switchyard_kit::time::timestamp(self.lease_expires_ms));
        a
    }

    /// Stats for a capability, created on first use.
    pub fn stats_mut(&mut self, capability: &str) -> &mut CapabilityStats {
        let stats = &mut self.agent.stats;
        // Kept sorted by capability, so one search finds or places it.
        let i = match stats.binary_search_by(|s| s.capability.as_str().cmp(capability)) {
            Ok(i) => i,
            Err(i) => {
                let fresh = CapabilityStats {
                    capability: capability.to_owned(),
                    ..Default::default()
                };
                stats.insert(i, fresh);
                i
            }
        };
        &mut stats[i]
    }

    pub fn capabilities(&self) -> impl Iterator<Item = &str> {
        self.agent
            .spec
            .iter()
            .flat_map(|s| s.capabilities.iter().map(|c| c.name.as_str()))
    }
}

/// What a watcher must do next.
pub(crate) enum Catchup {
    /// Send these events, in order.
    Events(Vec<Arc<WatchResponse>>),
    /// The position is unknown here: send a snapshot.
    Snapshot(Vec<WatchResponse>),
}

/// What a change is about: `a/<agent id>` or `t/<tool name>`.
fn change_key(ev: &WatchResponse) -> String {
    let t = WatchEventType::try_from(ev.r#type).unwrap_or(WatchEventType::Unspecified);
    match t {
        WatchEventType::AgentUpserted => format!(
            "a/{}",
            ev.agent
                .as_ref()
                .and_then(|a| a.spec.as_ref())
                .map_or("", |s| s.id.as_str())
        ),
        WatchEventType::AgentRemoved => format!("a/{}", ev.removed_id),
        WatchEventType::ToolUpserted => {
            format!("t/{}", ev.tool.as_ref().map_or("", |t| t.name.as_str()))
        }
        _ => format!("t/{}", ev.removed_id),
    }
}

#[derive(Debug)]
pub(crate) struct State {
    pub epoch: String,
    pub agents: BTreeMap<String, Entry>,
    pub tools: BTreeMap<String, Tool>,
    /// capability name → ids of agents declaring exactly it.
    pub by_capability: HashMap<String, BTreeSet<String>>,
    /// The change log for watchers that resume, one slot per revision from
    /// `first`. A change superseded by a later one about the same agent or
    /// tool is dropped (`None`): a watcher resuming gets the later state, and
    /// frequent outcome reports do not fill memory with agent copies.
    log: VecDeque<Option<Arc<WatchResponse>>>,
    /// Revision of the log's first slot.
    first: u64,
    /// The revision of the latest change about each agent (`a/…`) and tool (`t/…`).
    latest: HashMap<String, u64>,
    log_capacity: usize,
    head: u64,
}

impl State {
    pub fn new(epoch: String, log_capacity: usize) -> Self {
        State {
            epoch,
            agents: BTreeMap::new(),
            tools: BTreeMap::new(),
            by_capability: HashMap::new(),
            log: VecDeque::new(),
            first: 1,
            latest: HashMap::new(),
            log_capacity: log_capacity.max(1),
            head: 0,
        }
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    fn push(&mut self, mut ev: WatchResponse) {
        self.head += 1;
        ev.revision = self.head;
        ev.epoch = self.epoch.clone();
        let key = change_key(&ev);
        if self.log.len() == self.log_capacity {
            if let Some(Some(gone)) = self.log.pop_front() {
                let k = change_key(&gone);
                if self.latest.get(&k) == Some(&gone.revision) {
                    self.latest.remove(&k);
                }
            }
            self.first += 1;
        }
        if let Some(old) = self.latest.insert(key, self.head)
            && old >= self.first
            && let Some(slot) = self.log.get_mut((old - self.first) as usize)
        {
            *slot = None;
        }
        self.log.push_back(Some(Arc::new(ev)));
    }

    pub fn emit_agent(&mut self, id: &str) {
        if let Some(e) = self.agents.get(id) {
            let agent = e.view();
            self.push(WatchResponse {
                r#type: WatchEventType::AgentUpserted as i32,
                agent: Some(agent),
                ..Default::default()
            });
        }
    }

    pub fn emit_agent_removed(&mut self, id: &str) {
        self.push(WatchResponse {
            r#type: WatchEventType::AgentRemoved as i32,
            removed_id: id.to_owned(),
            ..Default::default()
        });
    }

    pub fn emit_tool(&mut self, tool: Tool) {
        self.push(WatchResponse {
            r#type: WatchEventType::ToolUpserted as i32,
            tool: Some(tool),
            ..Default::default()
        });
    }

    pub fn emit_tool_removed(&mut self, name: &str) {
        self.push(WatchResponse {
            r#type: WatchEventType::ToolRemoved as i32,
            removed_id: name.to_owned(),
            ..Default::default()
        });
    }

    /// Inserts or replaces an agent, keeping the capability index right.
    pub fn put_agent(&mut self, entry: Entry) {
        let id = entry
            .agent
            .spec
            .as_ref()
            .map(|s| s.id.clone())
            .unwrap_or_default();
        self.unindex(&id);
        for c in entry.capabilities() {
            self.by_capability
                .entry(c.to_owned())
                .or_default()
                .insert(id.clone());
        }
        self.agents.insert(id, entry);
    }

    pub fn remove_agent(&mut self, id: &str) -> Option<Entry> {
        self.unindex(id);
        self.agents.remove(id)
    }

    fn unindex(&mut self, id: &str) {
        let Some(old) = self.agents.get(id) else {
            return;
        };
        let caps: Vec<String> = old.capabilities().map(str::to_owned).collect();
        for c in caps {
            if let Some(set) = self.by_capability.get_mut(&c) {
                set.remove(id);
                if set.is_empty() {
                    self.by_capability.remove(&c);
                }
            }
        }
    }

    /// Ids of agents offering `capability` exactly or through an ancestor,
    /// in id order.
    pub fn offering(&self, capability: &str) -> BTreeSet<String> {
        let mut ids = BTreeSet::new();
        for c in capability_lineage(capability) {
            if let Some(set) = self.by_capability.get(c) {
                ids.extend(set.iter().cloned());
            }
        }
        ids
    }

    /// Agents that list `tool` in `uses_tools`.
    pub fn tool_users(&self, tool: &str) -> Vec<String> {
        self.agents
            .iter()
            .filter(|(_, e)| {
                e.agent
                    .spec
                    .as_ref()
                    .is_some_and(|s| s.uses_tools.iter().any(|t| t == tool))
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// What a watcher positioned after `after` in `epoch` needs next.
    pub fn catch_up(&self, epoch: &str, after: u64) -> Catchup {
        let oldest = if self.log.is_empty() {
            self.head + 1
        } else {
            self.first
        };
        // A client that saw the snapshot of an empty registry resumes at revision 0.
        let known = epoch == self.epoch && after <= self.head && after + 1 >= oldest;
        if !known {
            return Catchup::Snapshot(self.snapshot());
        }
        let skip = (after + 1 - oldest) as usize;
        Catchup::Events(self.log.iter().skip(skip).flatten().cloned().collect())
    }

    fn snapshot(&self) -> Vec<WatchResponse> {
        let mk = |t: WatchEventType| WatchResponse {
            epoch: self.epoch.clone(),
            revision: self.head,
            r#type: t as i32,
            ..Default::default()
        };
        let mut out = Vec::with_capacity(self.agents.len() + self.tools.len() + 2);
        out.push(mk(WatchEventType::Reset));
        for e in self.agents.values() {
            out.push(WatchResponse {
                agent: Some(e.view()),
                ..mk(WatchEventType::AgentUpserted)
            });
        }
        for t in self.tools.values() {
            out.push(WatchResponse {
                tool: Some(t.clone()),
                ..mk(WatchEventType::ToolUpserted)
            });
        }
        out.push(mk(WatchEventType::SnapshotComplete));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::registry::v1::AgentSpec;

    fn put(st: &mut State, id: &str, note: &str) {
        let agent = Agent {
            spec: Some(AgentSpec {
                id: id.into(),
                description: note.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        st.put_agent(Entry {
            agent,
            lease_expires_ms: 0,
            dirty: false,
        });
        st.emit_agent(id);
    }

    fn described(events: &[Arc<WatchResponse>]) -> Vec<(u64, String)> {
        events
            .iter()
            .map(|e| {
                let spec = e
                    .agent
                    .as_ref()
                    .and_then(|a| a.spec.clone())
                    .unwrap_or_default();
                (e.revision, format!("{}:{}", spec.id, spec.description))
            })
            .collect()
    }

    #[test]
    fn superseded_changes_leave_the_watch_log_and_resuming_watchers_get_the_latest() {
        let mut st = State::new("e".into(), 1_000);
        for n in 0..500 {
            put(&mut st, "a", &format!("report {n}"));
        }
        put(&mut st, "b", "once");
        put(&mut st, "a", "last");
        assert_eq!(
            st.log.iter().flatten().count(),
            2,
            "one change per agent is kept"
        );
        let Catchup::Events(from_start) = st.catch_up("e", 0) else {
            panic!("position known");
        };
        assert_eq!(
            described(&from_start),
            [(501, "b:once".to_owned()), (502, "a:last".to_owned())]
        );
        let Catchup::Events(after_b) = st.catch_up("e", 501) else {
            panic!("position known");
        };
        assert_eq!(described(&after_b), [(502, "a:last".to_owned())]);
        // Past the capacity the oldest slots go; resuming before them needs a snapshot.
        let mut small = State::new("e".into(), 3);
        for n in 0..5 {
            put(&mut small, &format!("x{n}"), "");
        }
        assert!(matches!(small.catch_up("e", 1), Catchup::Snapshot(_)));
        let Catchup::Events(tail) = small.catch_up("e", 3) else {
            panic!("position known");
        };
        assert_eq!(tail.len(), 2);
    }
}
