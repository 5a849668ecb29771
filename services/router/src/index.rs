//! The router's capability index: every agent the registry reported, grouped
//! by declared capability, kept current from the registry watch. Routing reads
//! it under a read lock and never calls the registry.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use switchyard_core::routing::{self, ScoreInput, ScoringConfig};
use switchyard_core::validate::capability_lineage;
use switchyard_proto::registry::v1::{Agent, AgentStatus};
use switchyard_proto::router::v1::{Candidate, RouteConstraints, ScoreBreakdown};

/// What routing needs to know about one agent.
#[derive(Debug)]
pub(crate) struct AgentInfo {
    pub id: String,
    pub endpoint: String,
    pub trust: u32,
    pub available: bool,
    pub saturated: bool,
    pub labels: HashMap<String, String>,
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
            endpoint: spec.endpoint.clone(),
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

/// One (agent, declared capability) pair in the index.
#[derive(Debug, Clone)]
struct Slot {
    agent: Arc<AgentInfo>,
    cap: usize,
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

impl Index {
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    pub fn upsert(&mut self, info: AgentInfo) {
        self.remove(&info.id);
        let info = Arc::new(info);
        for (i, c) in info.capabilities.iter().enumerate() {
            self.by_cap.entry(c.name.clone()).or_default().push(Slot {
                agent: info.clone(),
                cap: i,
            });
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

    /// Ranks the agents for `capability` under `constraints`, best first.
    pub fn route(
        &self,
        cfg: &ScoringConfig,
        capability: &str,
        c: &RouteConstraints,
        min_trust: u32,
        limit: usize,
    ) -> Routed {
        let mut out = Routed::default();
        let exclude: HashSet<&str> = c.exclude_agents.iter().map(String::as_str).collect();
        // (slot, levels_up) of the eligible; an agent offering both a capability
        // and its parent counts once, on its most specific match.
        let mut eligible: Vec<(&Slot, u32)> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for (level, cap) in capability_lineage(capability).enumerate() {
            let Some(slots) = self.by_cap.get(cap) else {
                continue;
            };
            for slot in slots {
                let a = &slot.agent;
                if level > 0 && !seen.insert(a.id.as_str()) {
                    continue;
                } else if level == 0 {
                    seen.insert(a.id.as_str());
                }
                out.offered += 1;
                let price = a.capabilities[slot.cap].price;
                let reason = if exclude.contains(a.id.as_str()) {
                    Some(0)
                } else if !a.available {
                    Some(1)
                } else if a.saturated {
                    Some(2)
                } else if a.trust < min_trust {
                    Some(3)
                } else if c.max_cost_micro_usd.is_some_and(|m| price > m) {
                    Some(4)
                } else {
                    None
                };
                match reason {
                    Some(r) => out.filtered[r] += 1,
                    None => eligible.push((slot, level as u32)),
                }
            }
        }
        if eligible.is_empty() {
            return out;
        }
        let max_cost = c.max_cost_micro_usd.unwrap_or_else(|| {
            eligible
                .iter()
                .map(|(s, _)| s.agent.capabilities[s.cap].price)
                .max()
                .unwrap_or(0)
        });
        let mut scored: Vec<(f64, &Slot, u32, routing::Breakdown, f64, bool)> = eligible
            .into_iter()
            .map(|(slot, levels_up)| {
                let a = &slot.agent;
                let cap = &a.capabilities[slot.cap];
                let observed = a
                    .observed
                    .get(capability)
                    .or_else(|| a.observed.get(&cap.name))
                    .copied();
                let latency_ms = observed.unwrap_or(a.latency_estimate_ms);
                let preferred_matched = c
                    .prefer_labels
                    .iter()
                    .filter(|(k, v)| a.labels.get(*k) == Some(*v))
                    .count();
                let b = routing::score(
                    cfg,
                    &ScoreInput {
                        proficiency: cap.proficiency,
                        levels_up,
                        trust_score: a.trust,
                        latency_ms,
                        price: cap.price,
                        max_cost,
                        preferred_matched,
                        preferred_total: c.prefer_labels.len(),
                    },
                );
                (b.total, slot, levels_up, b, latency_ms, observed.is_some())
            })
            .collect();
        let cmp = |x: &(f64, &Slot, u32, routing::Breakdown, f64, bool),
                   y: &(f64, &Slot, u32, routing::Breakdown, f64, bool)| {
            routing::rank((x.0, x.1.agent.id.as_str()), (y.0, y.1.agent.id.as_str()))
        };
        if scored.len() > limit {
            scored.select_nth_unstable_by(limit - 1, cmp);
            scored.truncate(limit);
        }
        scored.sort_by(cmp);
        out.candidates = scored
            .into_iter()
            .map(|(total, slot, _, b, latency_ms, latency_observed)| {
                let a = &slot.agent;
                let cap = &a.capabilities[slot.cap];
                Candidate {
                    agent_id: a.id.clone(),
                    endpoint: a.endpoint.clone(),
                    score: total,
                    breakdown: Some(ScoreBreakdown {
                        capability_match: b.capability_match,
                        trust: b.trust,
                        latency: b.latency,
                        cost: b.cost,
                        preference: b.preference,
                        latency_ms,
                        latency_observed,
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
