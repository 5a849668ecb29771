//! `switchyard llm check`: what each configured provider serves.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;
use switchyard_cli::Config;
use switchyard_llm::{Listing, Llm};

use crate::output::{Format, print_json, table};

/// `switchyard llm ...`
#[derive(Subcommand, Debug)]
pub enum LlmCmd {
    /// List each provider's models (`GET {base_url}/models`) and say, for
    /// every configured model, whether its provider serves it. Exits 1
    /// when a model is not served or a provider's list cannot be read.
    Check {
        /// TOML configuration file (the one the executor runs with).
        #[arg(long, env = "SWITCHYARD_CONFIG")]
        config: Option<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
}

pub async fn run(cmd: LlmCmd) -> anyhow::Result<()> {
    let LlmCmd::Check { config, output } = cmd;
    let cfg: Config = switchyard_kit::config::load(config.as_deref(), std::env::vars())?;
    cfg.llm.validate().map_err(anyhow::Error::msg)?;
    if cfg.llm.providers.is_empty() {
        anyhow::bail!(
            "no LLM provider is configured: add [[llm.providers]] to the configuration (see deploy/switchyard.example.toml)"
        );
    }
    let llm = Llm::new(&cfg.llm).map_err(anyhow::Error::msg)?;
    let checks = llm.check_models().await;
    let mut problems = Vec::new();
    let mut rows = Vec::new();
    let mut out = Vec::new();
    for c in &checks {
        let p = cfg.llm.providers.iter().find(|p| p.name == c.provider);
        let listed = match &c.listing {
            Listing::Served(ids) => ids.iter().cloned().collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        match &c.listing {
            Listing::Failed(e) => problems.push(format!(
                "provider {}: its model list (GET /models) could not be read: {e}",
                c.provider
            )),
            Listing::Unchecked => {}
            Listing::Served(_) => {}
        }
        for (model, found) in &c.models {
            let served = match found {
                Some(true) => "yes",
                Some(false) => "NO",
                None if matches!(c.listing, Listing::Unchecked) => "unchecked",
                None => "unknown",
            };
            if *found == Some(false) {
                problems.push(format!(
                    "provider {} does not serve {model:?}; it serves {}: calls to it are skipped and the fallback chain moves on",
                    c.provider,
                    if listed.is_empty() { "nothing".to_owned() } else { listed.join(", ") }
                ));
            }
            let price = llm.price(model, &c.provider).unwrap_or_default();
            let mode = p
                .map(|p| p.structured_output().as_str())
                .unwrap_or_default();
            let stream = p.is_some_and(|p| p.stream);
            rows.push(vec![
                c.provider.clone(),
                model.clone(),
                served.to_owned(),
                format!(
                    "${:.2} / ${:.2}",
                    price.input as f64 / 1e6,
                    price.output as f64 / 1e6
                ),
                mode.to_owned(),
                if stream { "yes" } else { "no" }.to_owned(),
            ]);
            out.push(json!({
                "provider": c.provider, "model": model,
                "served": found, "listed": listed,
                "input_micro_usd_per_million": price.input,
                "output_micro_usd_per_million": price.output,
                "structured_output": mode, "stream": stream,
            }));
        }
    }
    match output {
        Format::Json => print_json(&json!({"models": out, "problems": problems})),
        Format::Table => {
            table(
                &[
                    "PROVIDER",
                    "MODEL",
                    "SERVED",
                    "PER_M_TOKENS_IN/OUT",
                    "STRUCTURED",
                    "STREAM",
                ],
                &rows,
            );
            for p in &problems {
                eprintln!("{p}");
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!(
            "{} problem(s) with the configured models",
            problems.len()
        ))
    }
}
