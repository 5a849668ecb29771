//! OIDC / JWT bearer tokens from the team's identity provider.
//!
//! RS256 and ES256 only (never `none` or a shared secret), verified against a
//! JWKS read from a file or fetched from an `https` URL. The key set is
//! cached; a token naming an unknown `kid` triggers one refetch, at most once
//! per `refetch_interval_ms`, so a rotated key is picked up and a flood of
//! forged `kid`s cannot hammer the provider. `iss`, `aud`, `exp` and `nbf`
//! are checked; the principal comes from configurable claims. Verified
//! tokens are cached until they expire, so a busy client pays for one
//! signature check, not one per call.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{AuthError, Kind, Method, Principal, Role, Roles, valid_subject, valid_tenant};

/// `[auth.oidc]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OidcConfig {
    /// Expected `iss`.
    pub issuer: String,
    /// Expected `aud` (one of the token's audiences).
    pub audience: String,
    /// JWKS file (e.g. a mounted ConfigMap).
    pub jwks_file: Option<PathBuf>,
    /// JWKS URL: `https://…`; `http://` only for loopback (tests, sidecars).
    pub jwks_url: Option<String>,
    /// Claim holding the subject.
    pub subject_claim: String,
    /// Claim holding the tenant; when absent from a token, `default_tenant`.
    pub tenant_claim: String,
    /// Tenant of tokens without the tenant claim; unset: such tokens are
    /// refused.
    pub default_tenant: Option<String>,
    /// Claim holding the roles: an array of strings, or one string separated
    /// by spaces or commas (e.g. `switchyard_roles`, `groups`). Names that
    /// are not Switchyard roles are ignored; service roles never come from a
    /// token.
    pub roles_claim: String,
    /// Prefix stripped from role names (e.g. `switchyard-` for groups
    /// `switchyard-approver`); names without it are ignored. Empty: none.
    pub role_prefix: String,
    /// Claim that, when `true`, makes the principal an agent rather than a
    /// person (e.g. for workload identities). Empty: everyone is human.
    pub agent_claim: String,
    /// Clock skew allowed on `exp`/`nbf`, seconds.
    pub leeway_secs: u64,
    /// Shortest time between two JWKS fetches, ms.
    pub refetch_interval_ms: u64,
    /// Largest number of verified tokens kept.
    pub cache_entries: usize,
}

impl Default for OidcConfig {
    fn default() -> Self {
        OidcConfig {
            issuer: String::new(),
            audience: String::new(),
            jwks_file: None,
            jwks_url: None,
            subject_claim: "sub".into(),
            tenant_claim: "tenant".into(),
            default_tenant: None,
            roles_claim: "switchyard_roles".into(),
            role_prefix: String::new(),
            agent_claim: String::new(),
            leeway_secs: 30,
            refetch_interval_ms: 30_000,
            cache_entries: 10_000,
        }
    }
}

impl OidcConfig {
    /// Checks the settings that do not need the network.
    pub fn validate(&self) -> Result<(), String> {
        if self.issuer.is_empty() || self.audience.is_empty() {
            return Err("auth.oidc needs issuer and audience".into());
        }
        match (&self.jwks_file, &self.jwks_url) {
            (None, None) | (Some(_), Some(_)) => {
                return Err("auth.oidc needs exactly one of jwks_file or jwks_url".into());
            }
            (None, Some(url)) if !allowed_url(url) => {
                return Err(format!(
                    "auth.oidc.jwks_url {url:?} must be https:// (http:// only to a loopback address)"
                ));
            }
            _ => {}
        }
        if let Some(t) = &self.default_tenant
            && !valid_tenant(t)
        {
            return Err("auth.oidc.default_tenant must be 1-63 of a-z 0-9 - _".into());
        }
        Ok(())
    }
}

/// Whether `url` may be fetched: `https://`, or `http://` to a loopback
/// address only (tests, sidecars).
pub fn allowed_url(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', ':']).next().unwrap_or("");
    host == "localhost" || host == "127.0.0.1" || rest.starts_with("[::1]")
}

struct Keys {
    by_kid: HashMap<String, (DecodingKey, Algorithm)>,
    fetched: Option<Instant>,
}

/// Verifies JWTs; shared by every request of a process.
pub struct JwtVerifier {
    cfg: OidcConfig,
    keys: tokio::sync::RwLock<Keys>,
    /// Serialises refetches.
    fetching: tokio::sync::Mutex<()>,
    cache: RwLock<HashMap<String, (Arc<Principal>, u64)>>,
    http: reqwest::Client,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("issuer", &self.cfg.issuer)
            .finish_non_exhaustive()
    }
}

/// Why the key set could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// Reading the file or fetching the URL failed.
    #[error("reading the JWKS from {source_name}: {reason}")]
    Read {
        /// File or URL.
        source_name: String,
        /// Cause.
        reason: String,
    },
}

impl JwtVerifier {
    /// A verifier for `cfg` (validated); the key set is loaded on first use.
    pub fn new(cfg: OidcConfig) -> Result<Arc<JwtVerifier>, String> {
        cfg.validate()?;
        crate::tls::install_crypto();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("building the JWKS HTTP client: {e}"))?;
        Ok(Arc::new(JwtVerifier {
            cfg,
            keys: tokio::sync::RwLock::new(Keys {
                by_kid: HashMap::new(),
                fetched: None,
            }),
            fetching: tokio::sync::Mutex::new(()),
            cache: RwLock::new(HashMap::new()),
            http,
        }))
    }

    /// Whether `token` looks like a JWT (three dot-separated parts).
    pub fn looks_like_jwt(token: &str) -> bool {
        token.split('.').count() == 3
    }

    /// The principal of `token` at `now_ms`.
    pub async fn verify(&self, token: &str, now_ms: u64) -> Result<Arc<Principal>, AuthError> {
        if let Some(p) = self.cached(token, now_ms) {
            return Ok(p);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Invalid)?;
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
            return Err(AuthError::Invalid);
        }
        let kid = header.kid.ok_or(AuthError::Invalid)?;
        let (key, alg) = match self.key(&kid).await {
            Some(k) => k,
            None => {
                self.refetch().await;
                self.key(&kid).await.ok_or(AuthError::Invalid)?
            }
        };
        if alg != header.alg {
            return Err(AuthError::Invalid);
        }
        let mut v = Validation::new(alg);
        v.set_issuer(&[&self.cfg.issuer]);
        v.set_audience(&[&self.cfg.audience]);
        v.leeway = self.cfg.leeway_secs;
        v.validate_nbf = true;
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Value>(token, &key, &v).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => AuthError::Expired,
            _ => AuthError::Invalid,
        })?;
        let principal = Arc::new(self.principal(&data.claims)?);
        let exp_ms = data.claims["exp"]
            .as_u64()
            .unwrap_or(0)
            .saturating_mul(1000);
        self.remember(token, &principal, exp_ms);
        Ok(principal)
    }

    fn cached(&self, token: &str, now_ms: u64) -> Option<Arc<Principal>> {
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        cache
            .get(token)
            .filter(|(_, exp)| now_ms < *exp + self.cfg.leeway_secs * 1000)
            .map(|(p, _)| p.clone())
    }

    fn remember(&self, token: &str, p: &Arc<Principal>, exp_ms: u64) {
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= self.cfg.cache_entries {
            // Crude but bounded: start over rather than grow.
            cache.clear();
        }
        cache.insert(token.to_owned(), (p.clone(), exp_ms));
    }

    async fn key(&self, kid: &str) -> Option<(DecodingKey, Algorithm)> {
        let keys = self.keys.read().await;
        keys.by_kid.get(kid).cloned()
    }

    /// Reloads the key set unless it was loaded within the refetch
    /// interval (then an unknown `kid` stays unknown).
    async fn refetch(&self) {
        let _one = self.fetching.lock().await;
        let min = Duration::from_millis(self.cfg.refetch_interval_ms);
        if self
            .keys
            .read()
            .await
            .fetched
            .is_some_and(|t| t.elapsed() < min)
        {
            return;
        }
        let loaded = self.load().await;
        let mut keys = self.keys.write().await;
        keys.fetched = Some(Instant::now());
        match loaded {
            Ok(by_kid) => keys.by_kid = by_kid,
            Err(e) => tracing::warn!(error = %e, "JWKS not refreshed; keeping the keys held"),
        }
    }

    async fn load(&self) -> Result<HashMap<String, (DecodingKey, Algorithm)>, JwksError> {
        let (text, source_name) = match (&self.cfg.jwks_file, &self.cfg.jwks_url) {
            (Some(path), _) => (
                // A small file, read at start-up and on rotation: a blocking
                // read is fine here.
                std::fs::read_to_string(path).map_err(|e| JwksError::Read {
                    source_name: path.display().to_string(),
                    reason: e.to_string(),
                })?,
                path.display().to_string(),
            ),
            (None, Some(url)) => {
                let read = |e: reqwest::Error| JwksError::Read {
                    source_name: url.clone(),
                    reason: e.to_string(),
                };
                let resp = self.http.get(url).send().await.map_err(read)?;
                let resp = resp.error_for_status().map_err(read)?;
                (resp.text().await.map_err(read)?, url.clone())
            }
            (None, None) => return Ok(HashMap::new()),
        };
        let set: JwkSet = serde_json::from_str(&text).map_err(|e| JwksError::Read {
            source_name: source_name.clone(),
            reason: format!("not a JWKS: {e}"),
        })?;
        let mut out = HashMap::new();
        for jwk in &set.keys {
            let Some(kid) = jwk.common.key_id.clone() else {
                continue;
            };
            let alg = match &jwk.algorithm {
                jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => Algorithm::RS256,
                jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_) => Algorithm::ES256,
                _ => continue,
            };
            match DecodingKey::from_jwk(jwk) {
                Ok(k) => {
                    out.insert(kid, (k, alg));
                }
                Err(e) => tracing::warn!(kid, error = %e, "skipping a JWKS key"),
            }
        }
        Ok(out)
    }

    /// Maps verified claims to a principal.
    fn principal(&self, claims: &Value) -> Result<Principal, AuthError> {
        let subject = claims[&self.cfg.subject_claim]
            .as_str()
            .filter(|s| valid_subject(s))
            .ok_or(AuthError::Invalid)?;
        let tenant = match claims[&self.cfg.tenant_claim].as_str() {
            Some(t) if valid_tenant(t) => t.to_owned(),
            Some(_) => return Err(AuthError::Invalid),
            None => self.cfg.default_tenant.clone().ok_or(AuthError::Invalid)?,
        };
        let names: Vec<String> = match &claims[&self.cfg.roles_claim] {
            Value::Array(a) => a
                .iter()
                .filter_map(|v| v.as_str())
                .map(str::to_owned)
                .collect(),
            Value::String(s) => s
                .split([' ', ','])
                .filter(|x| !x.is_empty())
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        let roles: Vec<Role> = names
            .iter()
            .filter_map(|n| n.strip_prefix(self.cfg.role_prefix.as_str()))
            .filter_map(Role::parse)
            .filter(|r| r.grantable())
            .collect();
        let agent = !self.cfg.agent_claim.is_empty()
            && claims[&self.cfg.agent_claim].as_bool() == Some(true);
        Ok(Principal {
            subject: subject.to_owned(),
            tenant,
            roles: Roles::of(&roles),
            kind: if agent { Kind::Agent } else { Kind::Human },
            method: Method::Jwt,
            on_behalf_of: None,
            credential_id: None,
            expires_at_ms: claims["exp"].as_u64().map(|s| s.saturating_mul(1000)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_needs_issuer_audience_and_one_safe_jwks_source() {
        let ok = OidcConfig {
            issuer: "https://idp".into(),
            audience: "switchyard".into(),
            jwks_url: Some("https://idp/jwks".into()),
            ..Default::default()
        };
        ok.validate().unwrap();
        for bad in [
            OidcConfig {
                jwks_url: Some("http://idp.example/jwks".into()),
                ..ok.clone()
            },
            OidcConfig {
                jwks_file: Some("x".into()),
                ..ok.clone()
            },
            OidcConfig {
                audience: String::new(),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert!(allowed_url("http://127.0.0.1:9/jwks"));
    }
}
