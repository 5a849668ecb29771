//! A2A agents: registered from their Agent Card (one capability per
//! skill, the card's JSON-RPC endpoint, `AgentSpec.a2a` set), priced and
//! trusted like any agent. An A2A agent does not heartbeat, so the registry
//! reads its card again every third of the lease TTL and renews the lease
//! when the card answers: an agent whose card cannot be read lapses and is
//! not routed to.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_a2a::card::{self, Card};
use switchyard_a2a::signature::{self, Keys, Verdict};
use switchyard_core::Violations;
use switchyard_kit::auth::Principal;
use switchyard_proto::registry::v1::{
    A2aBinding, AgentSpec, Capability, RegisterA2aAgentRequest, RegisterA2aAgentResponse,
};

use crate::{Registry, RegistryError};

/// `[registry.a2a]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct A2aConfig {
    /// URL prefixes Agent Cards (and so the agents) may have; empty: any
    /// http(s) URL. A shared deployment should set it: the registry and
    /// the executor connect to what is registered.
    pub allowed_urls: Vec<String>,
    /// How long reading a card may take, ms.
    pub card_timeout_ms: u64,
    /// Unsigned Agent Cards: `if_signed` (the default) registers them and
    /// checks the signature of every signed card; `required` refuses a card
    /// with no signature a trusted key verifies.
    pub card_signatures: CardSignatures,
}

/// Which Agent Cards must be signed (`registry.a2a.card_signatures`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CardSignatures {
    /// A signed card must verify; an unsigned one is registered as such.
    #[default]
    IfSigned,
    /// Every card must carry a signature a trusted key verifies.
    Required,
}

impl Default for A2aConfig {
    fn default() -> Self {
        A2aConfig {
            allowed_urls: Vec::new(),
            card_timeout_ms: 5_000,
            card_signatures: CardSignatures::IfSigned,
        }
    }
}

impl A2aConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        if self.card_timeout_ms == 0 {
            return Err("registry.a2a.card_timeout_ms must be > 0".into());
        }
        Ok(())
    }

    fn allows(&self, url: &str) -> Result<(), String> {
        switchyard_kit::egress::check(url, &self.allowed_urls, "registry.a2a.allowed_urls")
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// The agent a card describes, with the request's price, trust and limits;
/// and the skills that could not become capabilities.
fn spec_of(
    req: &RegisterA2aAgentRequest,
    card: &Card,
    signed_by: String,
) -> (AgentSpec, Vec<String>) {
    let mut skipped = Vec::new();
    let mut capabilities: Vec<Capability> = Vec::new();
    for s in &card.skills {
        match card::capability(&s.id) {
            Ok(name) if capabilities.iter().any(|c| c.name == name) => {
                skipped.push(format!(
                    "{}: capability {name:?} is already a skill's",
                    s.id
                ));
            }
            Ok(name) => capabilities.push(Capability {
                name,
                price_per_unit_micro_usd: req.price_per_unit_micro_usd,
                unit: if req.unit.is_empty() {
                    "call".into()
                } else {
                    req.unit.clone()
                },
                ..Default::default()
            }),
            Err(e) => skipped.push(format!("{}: {e}", s.id)),
        }
    }
    let skills: Vec<String> = card
        .skills
        .iter()
        .map(|s| format!("- {}: {}", s.id, s.description))
        .collect();
    let description = if skills.is_empty() {
        card.description.clone()
    } else {
        format!("{}\nSkills:\n{}", card.description, skills.join("\n"))
    };
    let spec = AgentSpec {
        id: if req.id.is_empty() {
            card::agent_id(&card.name)
        } else {
            req.id.clone()
        },
        name: card.name.clone(),
        description,
        endpoint: card.url.clone(),
        capabilities,
        trust_score: req.trust_score,
        max_concurrency: req.max_concurrency,
        labels: req.labels.clone(),
        latency_estimate_ms: req.latency_estimate_ms,
        a2a: Some(A2aBinding {
            card_url: req.card_url.clone(),
            protocol_version: card.protocol_version.clone(),
            streaming: card.streaming,
            card_keys: req.card_keys.clone(),
            card_signed_by: signed_by,
            tenant: card.tenant.clone(),
        }),
        ..Default::default()
    };
    (spec, skipped)
}

impl Registry {
    fn a2a_http(&self) -> Result<&reqwest::Client, String> {
        self.inner.http.as_ref().map_err(Clone::clone)
    }

    fn card_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.cfg.a2a.card_timeout_ms)
    }

    pub(crate) async fn register_a2a_impl(
        &self,
        req: RegisterA2aAgentRequest,
        p: &Principal,
    ) -> Result<RegisterA2aAgentResponse, RegistryError> {
        if let Err(e) = self.inner.cfg.a2a.allows(&req.card_url) {
            let mut v = Violations::new();
            v.add("card_url", e);
            return Err(RegistryError::Invalid(v));
        }
        self.reachable(p, "card_url", &req.card_url).await?;
        let pinned = match req.card_keys.as_str() {
            "" => None,
            jwks => Some(Keys::parse(jwks).map_err(|e| crate::invalid("card_keys", e))?),
        };
        let unavailable = |message: String| RegistryError::A2aUnavailable {
            url: req.card_url.clone(),
            message,
        };
        let http = self.a2a_http().map_err(unavailable)?;
        // What the card's host answered is never echoed.
        let (card, json) = Card::fetch(http, &req.card_url, self.card_timeout())
            .await
            .map_err(|e| unavailable(switchyard_kit::egress::summary(&e.to_string())))?;
        let signed_by = self
            .check_card(&req.card_url, &json, pinned.as_ref(), false)
            .await?;
        // The endpoint the card names is reached too: it obeys the same rule.
        if let Err(e) = self.inner.cfg.a2a.allows(&card.url) {
            return Err(unavailable(format!("its JSON-RPC endpoint: {e}")));
        }
        let (spec, skipped) = spec_of(&req, &card, signed_by);
        if spec.capabilities.is_empty() {
            return Err(unavailable(format!(
                "it offers no skill that can be routed to ({})",
                if skipped.is_empty() {
                    "no skills".to_owned()
                } else {
                    skipped.join("; ")
                }
            )));
        }
        let r = self.register_agent_impl(Some(spec), p).await?;
        Ok(RegisterA2aAgentResponse {
            agent: r.agent,
            lease: r.lease,
            created: r.created,
            skipped,
        })
    }

    /// Checks a card's signatures: the id of the trusted key that verified
    /// one (empty: the card is unsigned, which `registry.a2a.card_signatures`
    /// and `signed` — the card was registered signed — may refuse). The
    /// keys are `pinned` ones, else those a signature's `jku` names on the
    /// card's own origin.
    async fn check_card(
        &self,
        url: &str,
        json: &serde_json::Value,
        pinned: Option<&Keys>,
        signed: bool,
    ) -> Result<String, RegistryError> {
        let unverified = |message: String| RegistryError::A2aUnverified {
            url: url.to_owned(),
            message,
        };
        let keys = match pinned {
            Some(k) => Some(k.clone()),
            None => {
                let http = self.a2a_http().map_err(unverified)?;
                Card::jku_keys(http, url, json, self.card_timeout())
                    .await
                    .map_err(|e| unverified(switchyard_kit::egress::summary(&e.to_string())))?
            }
        };
        let verdict = signature::verify(json, keys.as_ref().unwrap_or(&Keys::default()));
        let required = self.inner.cfg.a2a.card_signatures == CardSignatures::Required;
        match verdict {
            Verdict::Verified { kid } => Ok(kid),
            Verdict::Unsigned if pinned.is_some() || required || signed => {
                Err(unverified(if signed {
                    "the card was registered signed and is no longer signed".into()
                } else {
                    "the card is unsigned, and a signature is required (card_keys given, or registry.a2a.card_signatures = \"required\"): ask its owner to sign it".into()
                }))
            }
            Verdict::Unsigned => Ok(String::new()),
            Verdict::Invalid(why) if keys.is_none() => Err(unverified(format!(
                "the card is signed, but no key to check it is trusted: give the signer's public keys as card_keys (or publish them at a jku on the card's origin) ({why})"
            ))),
            Verdict::Invalid(why) => Err(unverified(format!(
                "its signature does not verify, so the card is not what its signer published: {why}"
            ))),
        }
    }

    /// Reads every A2A agent's card every third of the lease TTL and
    /// renews the lease of those that answer, until shutdown.
    pub(crate) fn spawn_a2a_leases(&self) {
        let every = Duration::from_millis((self.inner.cfg.lease_ttl_secs * 1000 / 3).max(200));
        let me = self.clone();
        self.inner
            .shutdown
            .spawn_every(every, "keeping A2A agents' leases", move || {
                let me = me.clone();
                async move {
                    me.renew_a2a().await;
                    Ok::<_, RegistryError>(())
                }
            });
    }

    /// One round of [`Registry::spawn_a2a_leases`]; how many answered.
    pub async fn renew_a2a(&self) -> usize {
        let agents: Vec<(String, A2aBinding)> = self
            .lock()
            .agents
            .values()
            .filter_map(|e| {
                let s = e.agent.spec.as_ref()?;
                Some((s.id.clone(), s.a2a.clone()?))
            })
            .collect();
        let Ok(http) = self.a2a_http() else {
            return 0;
        };
        let checks = agents.iter().map(|(id, a2a)| async move {
            let url = &a2a.card_url;
            let read = match Card::fetch(http, url, self.card_timeout()).await {
                Ok((_, json)) => {
                    // The card is checked as at registration: a card
                    // registered signed must stay signed by a trusted key.
                    let pinned = Keys::parse(&a2a.card_keys).ok();
                    let signed = !a2a.card_signed_by.is_empty();
                    let checked = self.check_card(url, &json, pinned.as_ref(), signed).await;
                    if let Err(e) = &checked {
                        tracing::warn!(agent_id = %id, error = %e, "an A2A agent's card no longer verifies; its lease runs out");
                    }
                    checked.is_ok()
                }
                Err(e) => {
                    tracing::debug!(agent_id = %id, error = %e, "an A2A agent's card did not answer; its lease runs out");
                    false
                }
            };
            (id, read)
        });
        let answered: Vec<&String> = futures_util::future::join_all(checks)
            .await
            .into_iter()
            .filter_map(|(id, ok)| ok.then_some(id))
            .collect();
        let expires = self.inner.clock.now_ms() + self.inner.cfg.lease_ttl_secs * 1000;
        let changed = {
            let mut st = self.lock();
            // Every answered lease is renewed: no short circuit.
            let renewed: Vec<bool> = answered
                .iter()
                .map(|id| Self::renew(&mut st, id, 0, expires))
                .collect();
            renewed.contains(&true)
        };
        if changed {
            self.notify();
        }
        answered.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(skills: &[&str]) -> Card {
        Card {
            name: "Text tricks".into(),
            description: "Shouts.".into(),
            url: "http://127.0.0.1:9/".into(),
            protocol_version: "1.0".into(),
            tenant: String::new(),
            streaming: true,
            skills: skills
                .iter()
                .map(|id| card::Skill {
                    id: (*id).into(),
                    name: String::new(),
                    description: format!("does {id}"),
                })
                .collect(),
        }
    }

    #[test]
    fn a_card_becomes_an_agent_with_a_capability_per_skill_at_the_asked_price() {
        let req = RegisterA2aAgentRequest {
            card_url: "http://127.0.0.1:9/.well-known/agent-card.json".into(),
            trust_score: 70,
            price_per_unit_micro_usd: 2_000,
            ..Default::default()
        };
        let (spec, skipped) = spec_of(
            &req,
            &card(&["text.shout", "Text.Shout", "9lives"]),
            String::new(),
        );
        assert_eq!(spec.id, "text_tricks");
        assert_eq!(spec.endpoint, "http://127.0.0.1:9/");
        let caps: Vec<(&str, i64, &str)> = spec
            .capabilities
            .iter()
            .map(|c| (c.name.as_str(), c.price_per_unit_micro_usd, c.unit.as_str()))
            .collect();
        assert_eq!(caps, [("text.shout", 2_000, "call")]);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(spec.description.contains("- text.shout: does text.shout"));
        let a2a = spec.a2a.unwrap();
        assert!(a2a.streaming);
        assert_eq!(a2a.card_url, req.card_url);
    }

    #[test]
    fn card_urls_must_be_http_and_under_the_allowed_prefixes() {
        let open = A2aConfig::default();
        assert!(open.allows("https://agents.example.com/card").is_ok());
        assert!(open.allows("file:///etc/passwd").is_err());
        let closed = A2aConfig {
            allowed_urls: vec!["https://agents.example.com/".into()],
            ..Default::default()
        };
        assert!(closed.allows("https://agents.example.com/a").is_ok());
        assert!(
            closed
                .allows("http://169.254.169.254/")
                .unwrap_err()
                .contains("allowed_urls")
        );
        // Userinfo and prefixes that are not path segments do not pass.
        for bad in [
            "https://agents.example.com@evil.example/",
            "https://agents.example.com.evil.example/",
        ] {
            assert!(closed.allows(bad).is_err(), "{bad}");
        }
    }
}
