//! The router's capability index: every agent the registry reported, grouped
//! by declared capability, kept current from the registry watch. Routing reads
//! it under a read lock and never calls the registry.

use std::collections::HashMap;
use std::sync::Arc;

use switchyard_core::routing::{self, ScoreInput, ScoringConfig};
use switchyard_core::validate::capability_lineage;
use switchyard_proto::registry::v1::{A2aBinding, Agent, AgentStatus};
use switchyard_proto::router::v1::{Candidate, RouteConstraints, ScoreBreakdown};

/// What routing needs to know about one agent.
#[derive(Debug)]
pub(crate) struct AgentInfo {
    pub id: String,
    /// Tenant; empty for a shared platform agent.
    pub tenant: String,
    pub endpoint: String,
    pub bills_tokens: bool,
    /// Set when the agent speaks A2A.
    pub a2a: Option<A2aBinding>,
    pub trust: u32,
    pub available: bool,
    pub saturated: bool,
    pub labels: std::collections::BTreeMap<String, String>,
    pub latency_estimate_ms: f64,
    /// Observed EWMA latency per capability (only capabilities with outcomes).
    pub observed: HashMap<String, f64>,
    pub capabilities: Vec<CapInfo>,
}

#[derive(Debug, Clone)]
pub(crate) struct CapInfo {
    pub name: String,
    pub proficiency: f64,
    pub price: i64,
    pub unit: String,
}

impl AgentInfo {
    pub fn from_agent(a: &Agent) -> Option<AgentInfo> {
        let spec = a.spec.as_ref()?;
        let in_flight = a.in_flight;
        Some(AgentInfo {
            id: spec.id.clone(),
            tenant: a.tenant.clone(),
            endpoint: spec.endpoint.clone(),
            bills_tokens: spec.bills_tokens,
            a2a: spec.a2a.clone(),
            trust: spec.trust_score,
            available: a.status == AgentStatus::Available as i32,
            saturated: spec.max_concurrency > 0 && in_flight >= spec.max_concurrency,
            labels: spec.labels.clone(),
            latency_estimate_ms: f64::from(spec.latency_estimate_ms),
            observed: a
                .stats
                .iter()
                .filter(|s| s.count > 0)
                .map(|s| (s.capability.clone(), s.ewma_latency_ms))
                .collect(),
            capabilities: spec
                .capabilities
                .iter()
                .map(|c| CapInfo {
                    name: c.name.clone(),
                    proficiency: c.proficiency.unwrap_or(1.0),
                    price: c.price_per_unit_micro_usd,
                    unit: c.unit.clone(),
                })
                .collect(),
        })
    }
}

/// One (agent, declared capability) pair in the index, with the numbers
/// routing needs stored inline so a route scans one contiguous vector and
/// touches the agent record only when a request needs it (exclusions, label
/// preferences, latency observed under a child capability).
#[derive(Debug, Clone)]
struct Slot {
    agent: Arc<AgentInfo>,
    cap: usize,
    trust: u32,
    routable: bool,
    saturated: bool,
    price: i64,
    proficiency: f64,
    /// Observed EWMA for this declared capability, else the estimate.
    latency_ms: f64,
    observed: bool,
}

/// Agents by id and by declared capability.
#[derive(Debug, Default)]
pub(crate) struct Index {
    agents: HashMap<String, Arc<AgentInfo>>,
    by_cap: HashMap<String, Vec<Slot>>,
}

/// Why an agent that offers the capability was not returned.
pub(crate) const FILTER_REASONS: [&str; 5] =
    ["excluded", "unavailable", "saturated", "trust", "cost"];

/// A route's outcome before it is turned into a response.
#[derive(Debug, Default)]
pub(crate) struct Routed {
    pub candidates: Vec<Candidate>,
    pub filtered: [u32; 5],
    /// Agents that offer the capability at all (before filters).
    pub offered: usize,
}

/// An eligible slot during a route.
struct Eligible<'a> {
    slot: &'a Slot,
    levels_up: u32,
    latency_ms: f64,
    observed: bool,
    score: f64,
}

impl Index {
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    pub fn upsert(&mut self, info: AgentInfo) {
        self.remove(&info.id);
        let info = Arc::new(info);
        for (i, c) in info.capabilities.iter().enumerate() {
            let observed = info.observed.get(&c.name).copied();
            let slot = Slot {
                agent: info.clone(),
                cap: i,
                trust: info.trust,
                routable: info.available,
                saturated: info.saturated,
                price: c.price,
                proficiency: c.proficiency,
                latency_ms: observed.unwrap_or(info.latency_estimate_ms),
                observed: observed.is_some(),
            };
            self.by_cap.entry(c.name.clone()).or_default().push(slot);
        }
        self.agents.insert(info.id.clone(), info);
    }

    pub fn remove(&mut self, id: &str) {
        let Some(old) = self.agents.remove(id) else {
            return;
        };
        for c in &old.capabilities {
            if let Some(slots) = self.by_cap.get_mut(&c.name) {
                if let Some(pos) = slots.iter().position(|s| s.agent.id == id) {
                    slots.swap_remove(pos);
                }
                if slots.is_empty() {
                    self.by_cap.remove(&c.name);
                }
            }
        }
    }

    /// Ranks the agents for `capability` under `constraints`, best first,
    /// among those visible to `tenant` (its own and the shared ones; `None`:
    /// every agent).
    pub fn route(
        &self,
        cfg: &ScoringConfig,
        capability: &str,
        c: &RouteConstraints,
        min_trust: u32,
        limit: usize,
        tenant: Option<&str>,
    ) -> Routed {
        let mut out = Routed::default();
        let lineage: Vec<&str> = capability_lineage(capability).collect();
        let mut eligible: Vec<Eligible<'_>> = Vec::new();
        for (level, cap) in lineage.iter().enumerate() {
            let Some(slots) = self.by_cap.get(*cap) else {
                continue;
            };
            for slot in slots {
                // Another tenant's agents do not exist for this route.
                if !slot.agent.tenant.is_empty() && tenant.is_some_and(|t| t != slot.agent.tenant) {
                    continue;
                }
                // An agent declaring both a capability and its parent counts
                // once, on its most specific match (checked only for parents).
                if level > 0
                    && slot
                        .agent
                        .capabilities
                        .iter()
                        .any(|k| lineage[..level].contains(&k.name.as_str()))
                {
                    continue;
                }
                out.offered += 1;
                let reason = if !c.exclude_agents.is_empty()
                    && c.exclude_agents.iter().any(|x| *x == slot.agent.id)
                {
                    Some(0)
                } else if !slot.routable {
                    Some(1)
                } else if slot.saturated {
                    Some(2)
                } else if slot.trust < min_trust {
                    Some(3)
                } else if c.max_cost_micro_usd.is_some_and(|m| slot.price > m) {
                    Some(4)
                } else {
                    None
                };
                match reason {
                    Some(r) => out.filtered[r] += 1,
                    None => {
                        // Outcomes reported under the requested (child)
                        // capability beat those of the declared parent.
                        let (latency_ms, observed) =
                            match (level, slot.agent.observed.get(capability)) {
                                (1.., Some(ms)) => (*ms, true),
                                _ => (slot.latency_ms, slot.observed),
                            };
                        eligible.push(Eligible {
                            slot,
                            levels_up: level as u32,
                            latency_ms,
                            observed,
                            score: 0.0,
                        });
                    }
                }
            }
        }
        if eligible.is_empty() {
            return out;
        }
        let max_cost = c
            .max_cost_micro_usd
            .unwrap_or_else(|| eligible.iter().map(|e| e.slot.price).max().unwrap_or(0));
        let input = |e: &Eligible<'_>| ScoreInput {
            proficiency: e.slot.proficiency,
            levels_up: e.levels_up,
            trust_score: e.slot.trust,
            latency_ms: e.latency_ms,
            price: e.slot.price,
            max_cost,
            preferred_matched: if c.prefer_labels.is_empty() {
                0
            } else {
                c.prefer_labels
                    .iter()
                    .filter(|(k, v)| e.slot.agent.labels.get(*k) == Some(*v))
                    .count()
            },
            preferred_total: c.prefer_labels.len(),
        };
        for e in &mut eligible {
            e.score = routing::score(cfg, &input(e)).total;
        }
        let cmp = |x: &Eligible<'_>, y: &Eligible<'_>| {
            routing::rank(
                (x.score, x.slot.agent.id.as_str()),
                (y.score, y.slot.agent.id.as_str()),
            )
        };
        if eligible.len() > limit {
            eligible.select_nth_unstable_by(limit - 1, cmp);
            eligible.truncate(limit);
        }
        eligible.sort_by(cmp);
        out.candidates = eligible
            .iter()
            .map(|e| {
                let b = routing::score(cfg, &input(e));
                let a = &e.slot.agent;
                let cap = &a.capabilities[e.slot.cap];
                Candidate {
                    agent_id: a.id.clone(),
                    endpoint: a.endpoint.clone(),
                    bills_tokens: a.bills_tokens,
                    a2a: a.a2a.clone(),
                    score: b.total,
                    breakdown: Some(ScoreBreakdown {
                        capability_match: b.capability_match,
                        trust: b.trust,
                        latency: b.latency,
                        cost: b.cost,
                        preference: b.preference,
                        latency_ms: e.latency_ms,
                        latency_observed: e.observed,
                        matched_capability: cap.name.clone(),
                    }),
                    price_per_unit_micro_usd: cap.price,
                    unit: cap.unit.clone(),
                    trust_score: a.trust,
                }
            })
            .collect();
        out
    }
}
