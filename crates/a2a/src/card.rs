//! Agent Cards (A2A 1.0, `/.well-known/agent-card.json`): what an agent
//! says it is, where its JSON-RPC interface is, and its skills — which
//! become the capabilities the registry routes on.

use std::time::Duration;

use serde::Deserialize;

use crate::A2aError;
use crate::signature::{self, Keys};

/// The A2A protocol version Switchyard speaks.
pub const PROTOCOL_VERSION: &str = "1.0";

/// What Switchyard reads from an Agent Card.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    /// The agent's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its JSON-RPC endpoint.
    pub url: String,
    /// The protocol version of that endpoint.
    pub protocol_version: String,
    /// The tenant that interface names (sent with every request); empty:
    /// none.
    pub tenant: String,
    /// Whether it streams (`SendStreamingMessage`).
    pub streaming: bool,
    /// Its skills.
    pub skills: Vec<Skill>,
}

/// One skill of an agent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Skill {
    /// Stable id.
    pub id: String,
    /// Name for people.
    #[serde(default)]
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    supported_interfaces: Vec<Interface>,
    #[serde(default)]
    capabilities: Capabilities,
    #[serde(default)]
    skills: Vec<Skill>,
    /// A2A 0.3 cards name their one endpoint here.
    #[serde(default)]
    url: String,
    /// A2A 0.3 cards' version.
    #[serde(default)]
    protocol_version: String,
    /// A2A 0.3 cards' binding at `url` (JSON-RPC when absent).
    #[serde(default)]
    preferred_transport: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Interface {
    url: String,
    #[serde(default)]
    protocol_binding: String,
    #[serde(default)]
    protocol_version: String,
    #[serde(default)]
    tenant: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Capabilities {
    #[serde(default)]
    streaming: bool,
}

impl Card {
    /// Reads a card from its JSON; the JSON-RPC interface of protocol
    /// version 1.x is the one used.
    pub fn parse(json: &[u8]) -> Result<Card, String> {
        let w: Wire =
            serde_json::from_slice(json).map_err(|e| format!("not an Agent Card: {e}"))?;
        let jsonrpc = w.supported_interfaces.iter().find(|i| {
            i.protocol_binding.eq_ignore_ascii_case("JSONRPC")
                && (i.protocol_version.is_empty() || i.protocol_version.starts_with("1."))
        });
        if w.supported_interfaces.is_empty()
            && w.protocol_version.starts_with("0.3")
            && (w.preferred_transport.is_empty()
                || w.preferred_transport.eq_ignore_ascii_case("JSONRPC"))
        {
            // A2A 0.3: one JSON-RPC endpoint at `url`, spoken to in 0.3.
            return Card::checked(w.url.clone(), w.protocol_version.clone(), String::new(), w);
        }
        let Some(i) = jsonrpc else {
            let have: Vec<String> = w
                .supported_interfaces
                .iter()
                .map(|i| format!("{} {}", i.protocol_binding, i.protocol_version))
                .collect();
            return Err(if w.supported_interfaces.is_empty() && !w.url.is_empty() {
                format!(
                    "the card is A2A {} (one `url`, no supportedInterfaces); Switchyard speaks A2A {PROTOCOL_VERSION}, and 0.3, over JSON-RPC",
                    if w.protocol_version.is_empty() {
                        "0.x"
                    } else {
                        &w.protocol_version
                    }
                )
            } else {
                format!(
                    "the card offers no JSON-RPC interface of A2A {PROTOCOL_VERSION} (it offers: {})",
                    if have.is_empty() {
                        "none".into()
                    } else {
                        have.join(", ")
                    }
                )
            });
        };
        let version = if i.protocol_version.is_empty() {
            PROTOCOL_VERSION.into()
        } else {
            i.protocol_version.clone()
        };
        Card::checked(i.url.clone(), version, i.tenant.clone(), w)
    }

    /// The card of the JSON-RPC endpoint at `url`, if it is http(s).
    fn checked(
        url: String,
        protocol_version: String,
        tenant: String,
        w: Wire,
    ) -> Result<Card, String> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("the card's JSON-RPC url {url:?} is not http(s)"));
        }
        Ok(Card {
            name: w.name,
            description: w.description,
            url,
            protocol_version,
            tenant,
            streaming: w.capabilities.streaming,
            skills: w.skills,
        })
    }

    /// Fetches and reads the card at `url` within `timeout`: the card, and
    /// its JSON as served (what its signatures sign).
    pub async fn fetch(
        http: &reqwest::Client,
        url: &str,
        timeout: Duration,
    ) -> Result<(Card, serde_json::Value), A2aError> {
        let body = get(http, url, timeout, "the Agent Card").await?;
        let protocol = |e: String| A2aError::Protocol(format!("the Agent Card at {url}: {e}"));
        let card = Card::parse(&body).map_err(protocol)?;
        let json = serde_json::from_slice(&body).map_err(|e| protocol(e.to_string()))?;
        Ok((card, json))
    }

    /// The keys a signed card's signatures name with `jku`, when that is on
    /// the card's own origin (scheme, host and port of `card_url`): a key
    /// set elsewhere could be anyone's. `Ok(None)`: no signature names one
    /// there.
    pub async fn jku_keys(
        http: &reqwest::Client,
        card_url: &str,
        json: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Option<Keys>, A2aError> {
        let Some(jku) = signature::headers(json)
            .into_iter()
            .filter_map(|h| h.jku)
            .find(|jku| same_origin(jku, card_url))
        else {
            return Ok(None);
        };
        let body = get(http, &jku, timeout, "the card's signing keys").await?;
        let text = String::from_utf8_lossy(&body);
        Keys::parse(&text)
            .map(Some)
            .map_err(|e| A2aError::Protocol(format!("the card's signing keys at {jku}: {e}")))
    }
}

/// Whether `a` and `b` are http(s) URLs of one origin.
fn same_origin(a: &str, b: &str) -> bool {
    match (reqwest::Url::parse(a), reqwest::Url::parse(b)) {
        (Ok(a), Ok(b)) => {
            matches!(a.scheme(), "http" | "https")
                && a.scheme() == b.scheme()
                && a.host_str() == b.host_str()
                && a.port_or_known_default() == b.port_or_known_default()
                && a.username().is_empty()
                && a.password().is_none()
        }
        _ => false,
    }
}

/// The body at `url` (a small JSON document: at most 1 MiB).
async fn get(
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
    what: &str,
) -> Result<Vec<u8>, A2aError> {
    const MOST: usize = 1 << 20;
    let unreachable = |e: String| A2aError::Unreachable(format!("reading {what} at {url}: {e}"));
    let resp = http
        .get(url)
        .timeout(timeout)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(unreachable(format!("HTTP {}", resp.status())));
    }
    switchyard_kit::egress::read_bounded(resp, MOST)
        .await
        .map_err(unreachable)
}

/// The capability a skill becomes: its id in lowercase, each dot-separated
/// segment made of `[a-z0-9_]` and starting with a letter (`Text-Shout` →
/// `text_shout`). `Err` when nothing usable is left.
pub fn capability(skill_id: &str) -> Result<String, String> {
    let mut segments = Vec::new();
    for seg in skill_id.split('.') {
        let mut s = String::new();
        for c in seg.chars() {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                s.push(c);
            } else if !s.ends_with('_') && !s.is_empty() {
                s.push('_');
            }
        }
        let s = s.trim_end_matches('_').to_owned();
        if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(format!(
                "skill id {skill_id:?} does not make a capability name (each dot-separated part must start with a letter)"
            ));
        }
        segments.push(s);
    }
    let cap = segments.join(".");
    if cap.len() > 128 {
        return Err(format!(
            "skill id {skill_id:?} is longer than 128 characters"
        ));
    }
    Ok(cap)
}

/// A default agent id from a card's name: snake_case, at most 58
/// characters (so `agent_<id>` is a valid tool name).
pub fn agent_id(name: &str) -> String {
    let mut id = String::new();
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            id.push(c);
        } else if !id.is_empty() && !id.ends_with('_') {
            id.push('_');
        }
    }
    let mut id = id.trim_end_matches('_').to_owned();
    if !id.starts_with(|c: char| c.is_ascii_lowercase()) {
        id.insert_str(0, "a2a_");
    }
    id.truncate(58);
    id.trim_end_matches('_').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: &str = r#"{
        "name": "Text tricks", "description": "Shouts.",
        "supportedInterfaces": [
            {"url": "http://127.0.0.1:9/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
            {"url": "http://127.0.0.1:9/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0", "tenant": "team-blue"}
        ],
        "capabilities": {"streaming": true},
        "skills": [{"id": "text.shout", "name": "shout", "description": "Upper-cases."}]
    }"#;

    #[test]
    fn a_card_gives_its_json_rpc_interface_streaming_and_skills() {
        let c = Card::parse(CARD.as_bytes()).unwrap();
        assert_eq!(c.url, "http://127.0.0.1:9/");
        assert_eq!(c.protocol_version, "1.0");
        assert_eq!(c.tenant, "team-blue");
        assert!(c.streaming);
        assert_eq!(c.skills[0].id, "text.shout");
    }

    #[test]
    fn a_0_3_card_gives_its_one_json_rpc_url_spoken_to_in_0_3() {
        let v03 = r#"{"name": "x", "url": "http://h/rpc", "protocolVersion": "0.3.0",
            "preferredTransport": "JSONRPC", "capabilities": {"streaming": true}, "skills": []}"#;
        let c = Card::parse(v03.as_bytes()).unwrap();
        assert_eq!(
            (c.url.as_str(), c.protocol_version.as_str(), c.streaming),
            ("http://h/rpc", "0.3.0", true)
        );
        let grpc_only = r#"{"name": "x", "url": "http://h/", "protocolVersion": "0.3.0", "preferredTransport": "GRPC"}"#;
        assert!(Card::parse(grpc_only.as_bytes()).is_err());
    }

    #[test]
    fn cards_switchyard_cannot_speak_to_are_refused_with_the_reason() {
        let old = r#"{"name": "x", "url": "http://h/", "protocolVersion": "0.2.5", "skills": []}"#;
        assert!(
            Card::parse(old.as_bytes())
                .unwrap_err()
                .contains("A2A 0.2.5")
        );
        let grpc = r#"{"name": "x", "supportedInterfaces": [{"url": "http://h/", "protocolBinding": "GRPC", "protocolVersion": "1.0"}]}"#;
        assert!(
            Card::parse(grpc.as_bytes())
                .unwrap_err()
                .contains("GRPC 1.0")
        );
        assert!(
            Card::parse(b"<html>")
                .unwrap_err()
                .contains("not an Agent Card")
        );
    }

    #[test]
    fn a_signing_key_set_is_fetched_only_from_the_cards_own_origin() {
        let card = "https://agents.example.com/.well-known/agent-card.json";
        assert!(same_origin("https://agents.example.com/keys.json", card));
        assert!(same_origin("https://agents.example.com:443/k", card));
        for other in [
            "http://agents.example.com/keys.json",
            "https://agents.example.com:8443/keys.json",
            "https://evil.example/keys.json",
            "https://agents.example.com.evil.example/k",
            "https://me@agents.example.com/k",
            "file:///etc/keys.json",
        ] {
            assert!(!same_origin(other, card), "{other}");
        }
    }

    #[test]
    fn skill_ids_become_capability_names() {
        assert_eq!(capability("text.shout").unwrap(), "text.shout");
        assert_eq!(capability("Currency-Convert").unwrap(), "currency_convert");
        assert_eq!(capability("geo.Find Place!").unwrap(), "geo.find_place");
        assert!(capability("1st.skill").is_err());
        assert!(capability("a..b").is_err());
    }

    #[test]
    fn card_names_become_agent_ids() {
        assert_eq!(agent_id("Text tricks"), "text_tricks");
        assert_eq!(agent_id("  42 Agent "), "a2a_42_agent");
        assert_eq!(agent_id(&"x".repeat(80)).len(), 58);
    }
}
