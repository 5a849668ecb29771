//! The whole configuration: one section per concern, layered by
//! [`switchyard_kit::config::load`] (defaults → TOML → `SWITCHYARD_*` env)
//! and then command-line flags.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use switchyard_approval::ApprovalConfig;
use switchyard_kit::server::ServerConfig;
use switchyard_kit::telemetry::TelemetryConfig;
use switchyard_ledger::LedgerConfig;
use switchyard_registry::RegistryConfig;
use switchyard_router::RouterConfig;

/// `[storage]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// `sled` (embedded, the default: nothing to install) or `postgres`
    /// (the services that support it keep their state in the database
    /// `[storage.postgres]` names, and run as several replicas on it).
    pub backend: StorageBackend,
    /// Directory holding one sled database per service.
    pub data_dir: PathBuf,
    /// `[storage.postgres]`: url (or url_env / url_file), pool_size, tls.
    pub postgres: switchyard_store::pg::PgConfig,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            backend: StorageBackend::Sled,
            data_dir: PathBuf::from(".switchyard"),
            postgres: switchyard_store::pg::PgConfig::default(),
        }
    }
}

/// Where services keep their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageBackend {
    /// Embedded sled databases under `data_dir`.
    #[default]
    Sled,
    /// One PostgreSQL database shared by every replica.
    Postgres,
}

/// Everything a Switchyard process can be configured with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// gRPC server.
    pub server: ServerConfig,
    /// Embedded storage.
    pub storage: StorageConfig,
    /// Logs and traces.
    pub telemetry: TelemetryConfig,
    /// Registry service.
    pub registry: RegistryConfig,
    /// Router service.
    pub router: RouterConfig,
    /// Ledger service: reservation TTLs and the price catalogue.
    pub ledger: LedgerConfig,
    /// Approval service: claims, retries and auto-approve policies.
    pub approval: ApprovalConfig,
    /// `[executor]`.
    pub executor: switchyard_executor::ExecutorConfig,
    /// `[audit]`: the key that signs the journals' seals (and the public
    /// keys of earlier ones).
    pub audit: switchyard_kit::chain::AuditConfig,
    /// `[llm]`: providers and the models they serve, with prices.
    pub llm: switchyard_llm::LlmConfig,
    /// `[agents]`: declarative agents hosted by `switchyard dev` or
    /// `switchyard agents serve`.
    pub agents: switchyard_agents::AgentsConfig,
    /// `[auth]`: the service token, where the key set comes from, dev
    /// credentials.
    pub auth: switchyard_kit::auth::authn::AuthConfig,
    /// `[gateway]`: the AITP REST and AGEniX RESP doors.
    pub gateway: switchyard_gateway::GatewayConfig,
    /// `[policy]`: the Cedar policy directory every service decides with.
    pub policy: switchyard_policy::PolicyConfig,
}

impl Config {
    /// Checks cross-field rules after layering.
    pub fn validate(&self) -> Result<(), String> {
        if self.storage.backend == StorageBackend::Postgres {
            self.storage.postgres.validate()?;
        }
        self.registry.validate()?;
        self.router.validate()?;
        self.ledger.validate()?;
        self.approval.validate()?;
        self.executor.validate()?;
        self.llm.validate()?;
        self.gateway.validate()?;
        self.policy.validate()?;
        self.audit.validate()?;
        self.price_catalogue()?;
        if let Some(o) = &self.auth.oidc {
            o.validate()?;
        }
        let listens = [
            self.server.listen.clone(),
            self.gateway.http_listen(&self.server.listen),
            self.gateway.resp_listen(&self.server.listen),
        ];
        if let Some(open) = listens.iter().find(|l| !is_loopback(l))
            && self.auth.dev_credentials()
        {
            return Err(format!(
                "refusing to listen on {open} with auth.dev_credentials on: the generated demo credentials (admin, alice, bob) would be reachable from the network. Listen on 127.0.0.1, or set auth.dev_credentials = false (SWITCHYARD_AUTH__DEV_CREDENTIALS=false) and give the first admin key through auth.bootstrap_admin_env"
            ));
        }
        if self.server.max_message_bytes < 1024 {
            return Err("server.max_message_bytes must be at least 1024".into());
        }
        Ok(())
    }
}

impl Config {
    /// The policy engine of this configuration: the `[[approval.policies]]`
    /// rules and the `[policy]` directory, loaded and validated (a broken
    /// set is an error: the process does not start on it).
    pub fn policies(&self) -> Result<std::sync::Arc<switchyard_policy::Engine>, String> {
        switchyard_policy::Engine::new(
            switchyard_approval::policy_sources(&self.approval.policies),
            self.policy.dir.clone(),
        )
        .map_err(|e| e.to_string())
    }
}

impl Config {
    /// Fills in what the gateway leaves unset from the gRPC server's
    /// settings (its listen addresses, its size limits), so `--dump-config`
    /// shows what the process will use.
    pub fn resolve(&mut self) {
        let listen = self.server.listen.clone();
        let max = self.server.max_message_bytes;
        let g = &mut self.gateway;
        g.http.listen = Some(g.http_listen(&listen));
        g.resp.listen = Some(g.resp_listen(&listen));
        g.http.max_body_bytes.get_or_insert(max);
        g.resp.max_bulk_bytes.get_or_insert(max);
    }
}

impl Config {
    /// The one price catalogue: every `[llm]` model's price (what LLM tasks
    /// are estimated and charged at) and the `[ledger.prices]` of models no
    /// provider serves here. `EstimateCost` answers from it. A model priced
    /// differently in both places is refused: an estimate would disagree
    /// with the charge.
    pub fn price_catalogue(
        &self,
    ) -> Result<std::collections::BTreeMap<String, switchyard_ledger::PriceConfig>, String> {
        let mut prices = self.ledger.prices.clone();
        for p in &self.llm.providers {
            for m in &p.models {
                let (Some(input), Some(output)) = (
                    m.input_micro_usd_per_million,
                    m.output_micro_usd_per_million,
                ) else {
                    continue;
                };
                let price = switchyard_ledger::PriceConfig {
                    input_micro_usd_per_million: input,
                    output_micro_usd_per_million: output,
                };
                match self.ledger.prices.get(&m.name) {
                    Some(other) if *other != price => {
                        return Err(format!(
                            "model {:?} is priced in [llm] (provider {:?}: {input}/{output} micro-USD per million tokens) and differently in [ledger.prices] ({}/{}): keep one price; LLM tasks are charged the [llm] one",
                            m.name,
                            p.name,
                            other.input_micro_usd_per_million,
                            other.output_micro_usd_per_million
                        ));
                    }
                    _ => {
                        prices.entry(m.name.clone()).or_insert(price);
                    }
                }
            }
        }
        Ok(prices)
    }
}

/// Whether `listen` (`host:port`) binds only loopback.
fn is_loopback(listen: &str) -> bool {
    let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_env_reaches_nested_sections() {
        Config::default().validate().unwrap();
        let c: Config = switchyard_kit::config::load(
            None,
            [
                (
                    "SWITCHYARD_ROUTER__SCORING__WEIGHTS__TRUST".to_string(),
                    "0.5".to_string(),
                ),
                (
                    "SWITCHYARD_REGISTRY__LEASE_TTL_SECS".to_string(),
                    "7".to_string(),
                ),
                (
                    "SWITCHYARD_STORAGE__DATA_DIR".to_string(),
                    "/tmp/x".to_string(),
                ),
                (
                    "SWITCHYARD_ROUTER__REGISTRY_URL".to_string(),
                    "http://127.0.0.1:1".to_string(),
                ),
            ],
        )
        .unwrap();
        assert_eq!(c.router.scoring.weights.trust, 0.5);
        assert_eq!(c.registry.lease_ttl_secs, 7);
        assert_eq!(c.storage.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.router.registry_url.as_deref(), Some("http://127.0.0.1:1"));
    }

    #[test]
    fn llm_prices_are_the_price_catalogue_and_a_second_price_is_refused() {
        let mut c = Config::default();
        c.llm.providers.push(switchyard_llm::ProviderConfig {
            name: "openai".into(),
            base_url: "http://127.0.0.1:8089/v1".into(),
            models: vec![switchyard_llm::ModelConfig::priced(
                "gpt-4o-mini",
                150_000,
                600_000,
            )],
            ..Default::default()
        });
        let prices = c.price_catalogue().unwrap();
        assert_eq!(prices["gpt-4o-mini"].output_micro_usd_per_million, 600_000);
        c.ledger.prices.insert(
            "gpt-4o-mini".into(),
            switchyard_ledger::PriceConfig {
                input_micro_usd_per_million: 150_000,
                output_micro_usd_per_million: 700_000,
            },
        );
        let e = c.validate().unwrap_err();
        assert!(e.contains("keep one price"), "{e}");
    }

    #[test]
    fn example_config_in_deploy_parses_and_validates() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/switchyard.example.toml"
        );
        let c: Config = switchyard_kit::config::load(Some(std::path::Path::new(path)), []).unwrap();
        c.validate().unwrap();
        assert_eq!(c.llm.providers[0].models.len(), 2);
        assert_eq!(c.approval.two_person_above_micro_usd, Some(5_000_000));
        c.auth.oidc.as_ref().unwrap().validate().unwrap();
        assert_eq!(
            c.llm.providers[1].kind,
            switchyard_llm::ProviderKind::Anthropic
        );
        // Every configuration shipped beside the LLM examples loads.
        let llm = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/llm"));
        let mut loaded = Vec::new();
        for f in std::fs::read_dir(llm).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let c: Config = switchyard_kit::config::load(Some(&path), [])
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                c.validate()
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                loaded.push((name, c.agents.dir.clone()));
            }
        }
        loaded.sort();
        assert_eq!(
            loaded,
            [
                ("llama.toml".to_owned(), None),
                ("self-hosting.toml".to_owned(), Some("agents".into())),
                ("switchyard.toml".to_owned(), Some("examples/agents".into())),
            ]
        );
        let mcp = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/mcp/switchyard.toml"
        );
        let c: Config = switchyard_kit::config::load(Some(std::path::Path::new(mcp)), []).unwrap();
        c.validate().unwrap();
        assert_eq!(c.registry.mcp.commands, ["node"]);
        let oidc = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/k8s/oidc.example.toml"
        );
        let c: Config = switchyard_kit::config::load(Some(std::path::Path::new(oidc)), []).unwrap();
        c.validate().unwrap();
        assert_eq!(c.auth.oidc.unwrap().role_prefix, "switchyard-");
    }
}
