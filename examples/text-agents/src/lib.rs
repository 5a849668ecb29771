//! Two example agents written with `switchyard-agent-sdk`, doing real work
//! without an LLM: [`TextStats`] (line, word and character counts, top terms)
//! and [`Extract`] (e-mail addresses, URLs, dates, numbers and the sentences
//! that mention chosen keywords). Each binary in `src/bin` serves one and
//! registers it with a Switchyard registry.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use switchyard_agent_sdk::{Agent, Invocation, Progress, input_json, respond};
use switchyard_proto::agent::v1::AgentResponse;
use switchyard_proto::registry::v1::{AgentSpec, Capability};

const STOPWORDS: &[&str] = &[
    "the", "a", "an", "and", "or", "of", "to", "in", "on", "for", "is", "are", "was", "were", "be",
    "by", "with", "as", "at", "it", "this", "that", "from", "we", "our", "not", "no", "but", "its",
    "their", "which", "these", "those", "has", "have", "had", "into", "than", "then", "can",
];

/// The text an invocation works on: `input.text`, else every string argument.
fn text_of(req: &Invocation) -> String {
    let input = input_json(req);
    match input.get("text") {
        Some(Value::String(s)) => s.clone(),
        _ => input
            .get("args")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default(),
    }
}

/// Counts and top terms of a text.
pub fn stats(text: &str, top: usize) -> Value {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut words = 0u64;
    for w in text.split(|c: char| !c.is_alphanumeric() && c != '\'') {
        let w = w.trim_matches('\'').to_lowercase();
        if w.is_empty() {
            continue;
        }
        words += 1;
        if w.len() > 2 && !STOPWORDS.contains(&w.as_str()) && !w.chars().all(|c| c.is_ascii_digit())
        {
            *counts.entry(w).or_default() += 1;
        }
    }
    let mut terms: Vec<(String, u64)> = counts.into_iter().collect();
    terms.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    json!({
        "lines": text.lines().count(),
        "words": words,
        "chars": text.chars().count(),
        "top_terms": terms.into_iter().take(top).map(|(term, count)| json!({"term": term, "count": count})).collect::<Vec<_>>(),
    })
}

fn token_is_email(t: &str) -> bool {
    let Some((user, domain)) = t.split_once('@') else {
        return false;
    };
    !user.is_empty() && domain.contains('.') && !domain.starts_with('.') && !domain.ends_with('.')
}

fn token_is_date(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && t.chars()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

/// Entities and keyword sentences of a text.
pub fn extract(text: &str, keywords: &[String]) -> Value {
    let trim = |t: &str| {
        t.trim_matches(|c: char| "()[]{}<>,;:\"'.!?".contains(c))
            .to_owned()
    };
    let mut emails = Vec::new();
    let mut urls = Vec::new();
    let mut dates = Vec::new();
    let mut numbers = Vec::new();
    for raw in text.split_whitespace() {
        let t = trim(raw);
        if t.starts_with("http://") || t.starts_with("https://") {
            urls.push(t);
        } else if token_is_email(&t) {
            emails.push(t);
        } else if token_is_date(&t) {
            dates.push(t);
        } else if !t.is_empty() && t.parse::<f64>().is_ok() {
            numbers.push(t);
        }
    }
    for v in [&mut emails, &mut urls, &mut dates] {
        v.dedup();
    }
    // A sentence ends at a newline or at . ! ? followed by whitespace (so
    // URLs and decimals stay whole).
    let mut sentences: Vec<&str> = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (k, &(i, c)) in chars.iter().enumerate() {
        let next_space = chars.get(k + 1).is_none_or(|&(_, n)| n.is_whitespace());
        if c == '\n' || ("!?.".contains(c) && next_space) {
            sentences.push(text[start..i].trim());
            start = i + c.len_utf8();
        }
    }
    sentences.push(text[start..].trim());
    sentences.retain(|s| !s.is_empty());
    let mut by_keyword = serde_json::Map::new();
    for k in keywords {
        let k_low = k.to_lowercase();
        let hits: Vec<&str> = sentences
            .iter()
            .copied()
            .filter(|s| s.to_lowercase().contains(&k_low))
            .collect();
        by_keyword.insert(k.clone(), json!(hits));
    }
    json!({
        "raw_text": text.trim(),
        "emails": emails, "urls": urls, "dates": dates, "numbers": numbers,
        "sentences": sentences.len(),
        "keyword_sentences": by_keyword,
    })
}

/// The text-statistics agent (`text.stats`).
#[derive(Debug, Default, Clone, Copy)]
pub struct TextStats;

#[tonic::async_trait]
impl Agent for TextStats {
    async fn invoke(&self, req: Invocation, progress: Progress) -> AgentResponse {
        let text = text_of(&req);
        if text.is_empty() {
            return respond::refused("text.stats needs input.text");
        }
        progress.send("counting", Some(50)).await;
        let top = input_json(&req)
            .get("top")
            .and_then(Value::as_u64)
            .unwrap_or(10) as usize;
        let out = stats(&text, top);
        let summary = format!("{} lines, {} words", out["lines"], out["words"]);
        respond::success(summary, Some(out))
    }
}

/// The extraction agent (`text.extract`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Extract;

#[tonic::async_trait]
impl Agent for Extract {
    async fn invoke(&self, req: Invocation, progress: Progress) -> AgentResponse {
        let text = text_of(&req);
        if text.is_empty() {
            return respond::refused("text.extract needs input.text");
        }
        let keywords: Vec<String> = input_json(&req)
            .get("keywords")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        progress.send("extracting", Some(50)).await;
        let out = extract(&text, &keywords);
        let summary = format!(
            "{} urls, {} emails, {} dates",
            out["urls"].as_array().map_or(0, Vec::len),
            out["emails"].as_array().map_or(0, Vec::len),
            out["dates"].as_array().map_or(0, Vec::len)
        );
        respond::success(summary, Some(out))
    }
}

/// A registry entry for an example agent.
pub fn spec(
    id: &str,
    name: &str,
    description: &str,
    capability: &str,
    price_micro_usd: i64,
) -> AgentSpec {
    AgentSpec {
        id: id.into(),
        name: name.into(),
        description: description.into(),
        capabilities: vec![Capability {
            name: capability.into(),
            proficiency: Some(0.9),
            price_per_unit_micro_usd: price_micro_usd,
            unit: "call".into(),
        }],
        trust_score: 80,
        latency_estimate_ms: 5,
        ..Default::default()
    }
}

/// Parses the command line, then serves `agent` as `spec` until a signal.
pub async fn main_with<A: Agent>(agent: A, mut spec: AgentSpec) -> anyhow::Result<()> {
    use clap::Parser as _;
    let o = Opts::parse();
    if let Some(id) = o.id {
        spec.id = id;
    }
    let credential = o
        .token
        .as_deref()
        .map(switchyard_kit::client::Credential::bearer)
        .transpose()?;
    let opts = switchyard_agent_sdk::ServeOptions {
        listen: o.listen,
        registry_url: o.registry,
        credential,
        ..Default::default()
    };
    switchyard_agent_sdk::serve(agent, spec, opts).await?;
    Ok(())
}

/// Command-line options shared by the example binaries.
#[derive(Debug, clap::Parser)]
pub struct Opts {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Registry (or `switchyard dev`) URL.
    #[arg(long, env = "SWITCHYARD_URL", default_value = "http://127.0.0.1:7600")]
    pub registry: String,
    /// The agent's API key (role agent).
    #[arg(long, env = "SWITCHYARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Agent id to register as.
    #[arg(long)]
    pub id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_lines_words_and_rank_terms() {
        let s = stats(
            "Graph routing beats random routing.\nRouting wins; graphs help.",
            2,
        );
        assert_eq!(
            (s["lines"].as_u64(), s["words"].as_u64()),
            (Some(2), Some(9))
        );
        assert_eq!(s["top_terms"][0], json!({"term": "routing", "count": 3}));
    }

    #[test]
    fn extraction_finds_entities_and_keyword_sentences() {
        let e = extract(
            "Contact ana@example.org. See https://example.org/paper (2025-11-21). Results: 42.5 runs. No limitation found.",
            &["result".into(), "limitation".into()],
        );
        assert_eq!(e["emails"], json!(["ana@example.org"]));
        assert_eq!(e["urls"], json!(["https://example.org/paper"]));
        assert_eq!(e["dates"], json!(["2025-11-21"]));
        assert_eq!(e["numbers"], json!(["42.5"]));
        assert_eq!(e["sentences"], 4, "URLs and decimals do not end sentences");
        assert_eq!(
            e["keyword_sentences"]["limitation"],
            json!(["No limitation found"])
        );
    }
}
