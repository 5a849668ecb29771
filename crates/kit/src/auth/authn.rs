//! Authentication: request headers → [`Principal`], once per request, by the
//! server layer. Sources, in order: the cluster's service token, a Switchyard
//! API key. A service principal may name the user it acts for in
//! [`ON_BEHALF_HEADER`](super::ON_BEHALF_HEADER); anyone else naming one is
//! refused, never silently ignored.

use std::sync::Arc;

use http::HeaderMap;
use serde::{Deserialize, Serialize};

use super::keys::{self, KeySet};
use super::{AuthError, Method, OnBehalf, Permission, Principal};

/// `[auth]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Name of the environment variable holding the cluster's service token:
    /// the credential Switchyard services present to each other in split mode
    /// (the value itself never appears in config). Unset: no service token.
    pub service_token_env: Option<String>,
    /// A file holding the service token instead (a mounted Secret); used when
    /// `service_token_env` is unset.
    pub service_token_file: Option<std::path::PathBuf>,
    /// Subject of principals authenticated by the service token.
    pub service_subject: String,
    /// URL of the process hosting the auth service (API keys), for processes
    /// that do not host it; they follow its key set through `WatchKeys`.
    pub keys_url: Option<String>,
    /// Create the tenant `default`, an admin key and the demo people alice
    /// (submitter) and bob (approver) on first start, in a 0600 credentials
    /// file in the data directory. Unset: on for `switchyard dev`, off for
    /// `switchyard serve`. Refused on a non-loopback listen address.
    pub dev_credentials: Option<bool>,
    /// Name of an environment variable holding an admin API key to create on
    /// start if it does not exist yet (tenant [`AuthConfig::bootstrap_tenant`],
    /// subject `bootstrap-admin`): how a fresh deployment gets its first
    /// admin, from a Secret. The value never appears in config.
    pub bootstrap_admin_env: Option<String>,
    /// Tenant of the bootstrap admin.
    pub bootstrap_tenant: String,
    /// `[auth.oidc]`: accept JWTs from an identity provider.
    pub oidc: Option<super::jwt::OidcConfig>,
    /// `[auth.service_tls]`: this process's certificate and the CA of the
    /// others, for calls to services at `https://` URLs (mTLS).
    pub service_tls: Option<crate::tls::ClientTls>,
    /// Service identities (certificate SANs) accepted as service principals,
    /// by prefix (e.g. `spiffe://cluster.local/ns/switchyard/`). Empty: any
    /// certificate the server's client CA signed.
    pub service_identities: Vec<String>,
    /// `[auth.forwarded_cert]`: trust a client identity forwarded by a mesh
    /// sidecar. Off unless set.
    pub forwarded_cert: Option<ForwardedCert>,
    /// Name of an environment variable holding the secret invocation
    /// grants are signed with (32+ characters, the same in every process of
    /// the deployment). Unset: derived from the service token; with
    /// neither (an mTLS-only split deployment), each process makes its own
    /// and grants signed in one are refused in another. The value never
    /// appears in config.
    pub grant_key_env: Option<String>,
}

/// Identity forwarded by a service-mesh proxy in `x-forwarded-client-cert`
/// (Envoy/Istio: `By=…;Hash=…;URI=spiffe://…`), trusted only from the
/// configured proxy addresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ForwardedCert {
    /// Peer addresses of the proxy (usually the sidecar on 127.0.0.1).
    pub trusted_proxies: Vec<std::net::IpAddr>,
}

/// Header a mesh proxy forwards the client certificate's identity in.
pub const XFCC_HEADER: &str = "x-forwarded-client-cert";

/// The `URI=` of the last element of an XFCC header (the hop closest to us).
fn xfcc_uri(v: &str) -> Option<String> {
    let last = v.rsplit(',').next()?;
    last.split(';')
        .find_map(|kv| {
            let (k, val) = kv.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("uri")
                .then(|| val.trim().trim_matches('"').to_owned())
        })
        .filter(|u| !u.is_empty())
}

impl AuthConfig {
    /// The cluster's service token, from `service_token_env` or else
    /// `service_token_file`; `None` when neither is set. A missing or short
    /// (< 32 characters) token is a config error naming its source.
    pub fn service_token(&self) -> Result<Option<String>, String> {
        let (token, source) = match (&self.service_token_env, &self.service_token_file) {
            (Some(var), _) => (
                std::env::var(var).map_err(|_| {
                    format!("auth.service_token_env names {var}, which is not set; set it to the cluster's service token (32+ characters)")
                })?,
                var.clone(),
            ),
            (None, Some(path)) => (
                std::fs::read_to_string(path)
                    .map_err(|e| format!("auth.service_token_file {}: {e}", path.display()))?,
                path.display().to_string(),
            ),
            (None, None) => return Ok(None),
        };
        let token = token.trim().to_owned();
        if token.len() < 32 {
            return Err(format!(
                "the service token in {source} is shorter than 32 characters; use a random secret (openssl rand -hex 32)"
            ));
        }
        Ok(Some(token))
    }

    /// The secret invocation grants are signed with
    /// ([`AuthConfig::grant_key_env`]), else the service token's.
    pub fn grant_secret(&self) -> Result<Option<String>, String> {
        self.grant_secret_in(|v| std::env::var(v).ok())
    }

    fn grant_secret_in(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<String>, String> {
        let Some(var) = &self.grant_key_env else {
            return self.service_token();
        };
        let secret = env(var)
            .ok_or_else(|| {
                format!("auth.grant_key_env names {var}, which is not set; set it to a random secret shared by every process (openssl rand -hex 32)")
            })?
            .trim()
            .to_owned();
        if secret.len() < 32 {
            return Err(format!(
                "the grant key in {var} is shorter than 32 characters; use a random secret (openssl rand -hex 32)"
            ));
        }
        Ok(Some(secret))
    }

    /// Whether the dev credentials are on.
    pub fn dev_credentials(&self) -> bool {
        self.dev_credentials.unwrap_or(false)
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            service_token_env: None,
            service_token_file: None,
            service_subject: "service:switchyard".into(),
            keys_url: None,
            dev_credentials: None,
            bootstrap_admin_env: None,
            bootstrap_tenant: "default".into(),
            oidc: None,
            service_tls: None,
            service_identities: Vec::new(),
            forwarded_cert: None,
            grant_key_env: None,
        }
    }
}

/// What a request presents, taken from its headers before any await.
#[derive(Clone, Default)]
pub struct Presented {
    /// The bearer token, if any.
    bearer: Option<String>,
    /// `x-switchyard-on-behalf-of`, if any.
    on_behalf: Option<String>,
    /// The verified client certificate's service identity (mTLS), if any.
    certificate: Option<String>,
    /// The identity a trusted mesh proxy forwarded, if any.
    forwarded: Option<String>,
}

impl std::fmt::Debug for Presented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presented")
            .field("bearer", &self.bearer.as_ref().map(|_| "[redacted]"))
            .field("on_behalf", &self.on_behalf)
            .field("certificate", &self.certificate)
            .field("forwarded", &self.forwarded)
            .finish()
    }
}

impl Presented {
    /// Reads the credential headers; a malformed `authorization` is invalid.
    pub fn from_headers(headers: &HeaderMap) -> Result<Presented, AuthError> {
        let bearer = match headers.get(http::header::AUTHORIZATION) {
            None => None,
            Some(v) => {
                let v = v.to_str().map_err(|_| AuthError::Invalid)?.trim();
                let (scheme, token) = v.split_once(' ').ok_or(AuthError::Invalid)?;
                if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
                    return Err(AuthError::Invalid);
                }
                Some(token.trim().to_owned())
            }
        };
        let on_behalf = match headers.get(super::ON_BEHALF_HEADER) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| AuthError::Invalid)?.to_owned()),
        };
        Ok(Presented {
            bearer,
            on_behalf,
            certificate: None,
            forwarded: None,
        })
    }

    /// Adds what the connection proves: the verified client certificate's
    /// identity, and an XFCC identity when the peer is a trusted proxy.
    pub fn with_connection(
        mut self,
        certificate: Option<String>,
        peer: Option<std::net::IpAddr>,
        headers: &HeaderMap,
        cfg: Option<&ForwardedCert>,
    ) -> Presented {
        self.certificate = certificate;
        if let (Some(cfg), Some(peer)) = (cfg, peer)
            && cfg.trusted_proxies.contains(&peer)
        {
            self.forwarded = headers
                .get(XFCC_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(xfcc_uri);
        }
        self
    }
}

/// Verifies credentials against the key set and the service token.
#[derive(Debug, Clone)]
pub struct Authenticator {
    keys: KeySet,
    service_token: Option<[u8; 32]>,
    service_subject: String,
    jwt: Option<std::sync::Arc<super::jwt::JwtVerifier>>,
    service_identities: Vec<String>,
    forwarded_cert: Option<ForwardedCert>,
}

impl Authenticator {
    /// An authenticator over `keys`, with the service token read now
    /// ([`AuthConfig::service_token`]).
    pub fn new(cfg: &AuthConfig, keys: KeySet) -> Result<Authenticator, String> {
        Self::with_service_token(cfg, keys, cfg.service_token()?.as_deref())
    }

    /// [`Authenticator::new`] with the service token already read (a process
    /// also presents it to others, and reads it once).
    pub fn with_service_token(
        cfg: &AuthConfig,
        keys: KeySet,
        service_token: Option<&str>,
    ) -> Result<Authenticator, String> {
        if let Some(ip) = cfg
            .forwarded_cert
            .iter()
            .flat_map(|f| &f.trusted_proxies)
            .find(|ip| ip.is_loopback() || ip.is_unspecified())
        {
            return Err(format!(
                "auth.forwarded_cert.trusted_proxies names {ip}: any process on this host could forge a service identity from there. Name the proxy's own (non-loopback) address, or use mTLS (auth.service_tls)"
            ));
        }
        let service_token = service_token.map(keys::hash);
        let jwt = match &cfg.oidc {
            Some(o) => Some(super::jwt::JwtVerifier::new(o.clone())?),
            None => None,
        };
        Ok(Authenticator {
            keys,
            service_token,
            service_subject: cfg.service_subject.clone(),
            jwt,
            service_identities: cfg.service_identities.clone(),
            forwarded_cert: cfg.forwarded_cert.clone(),
        })
    }

    /// Whether a mesh proxy's forwarded identity is trusted, and from where.
    pub fn forwarded_cert(&self) -> Option<&ForwardedCert> {
        self.forwarded_cert.as_ref()
    }

    fn service_identity_allowed(&self, id: &str) -> bool {
        self.service_identities.is_empty()
            || self
                .service_identities
                .iter()
                .any(|p| id.starts_with(p.as_str()))
    }

    /// The key set this authenticator verifies against.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }

    /// The principal of a request presenting `presented`, at `now_ms`:
    /// the service token, a Switchyard API key (`syk_…`) or, when OIDC is
    /// configured, a JWT.
    pub async fn authenticate(
        &self,
        presented: &Presented,
        now_ms: u64,
    ) -> Result<Arc<Principal>, AuthError> {
        let Some(token) = presented.bearer.as_deref() else {
            // No bearer token: a verified client certificate (mTLS) or an
            // identity forwarded by a trusted mesh proxy.
            let (id, method) = match (&presented.certificate, &presented.forwarded) {
                (Some(c), _) => (c, Method::Certificate),
                (None, Some(f)) => (f, Method::ForwardedCertificate),
                (None, None) => return Err(AuthError::Required),
            };
            if !self.service_identity_allowed(id) {
                return Err(AuthError::Invalid);
            }
            return on_behalf(
                Arc::new(Principal::service(id, method)),
                presented.on_behalf.as_deref(),
            );
        };
        // A JWT has dots, a key or the service token has none: JWTs never pay
        // for a SHA-256, and keys hash once.
        let principal = if let Some(jwt) = &self.jwt
            && super::jwt::JwtVerifier::looks_like_jwt(token)
        {
            jwt.verify(token, now_ms).await?
        } else {
            let hash = keys::hash(token);
            if self
                .service_token
                .is_some_and(|h| constant_time_eq(&h, &hash))
            {
                Arc::new(Principal::service(
                    &self.service_subject,
                    Method::ServiceToken,
                ))
            } else if token.starts_with(keys::TOKEN_PREFIX) {
                self.keys.verify_hash(&hash, now_ms)?
            } else {
                return Err(AuthError::Invalid);
            }
        };
        on_behalf(principal, presented.on_behalf.as_deref())
    }
}

/// Applies [`ON_BEHALF_HEADER`](super::ON_BEHALF_HEADER): only a principal
/// allowed to impersonate may name someone, and the name must parse.
fn on_behalf(p: Arc<Principal>, header: Option<&str>) -> Result<Arc<Principal>, AuthError> {
    let Some(v) = header else {
        return Ok(p);
    };
    p.require(Permission::Impersonate)?;
    let user = OnBehalf::decode(v).ok_or(AuthError::Invalid)?;
    let mut p = Arc::unwrap_or_clone(p);
    p.on_behalf_of = Some(user);
    Ok(Arc::new(p))
}

/// Whether `a` and `b` are equal, in time that depends only on their
/// lengths (secrets and digests are compared so).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::keys::Binding;
    use crate::auth::{Kind, Role, Roles};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn authn() -> Authenticator {
        let keys = KeySet::default();
        keys.upsert(
            keys::hash("syk_alice"),
            Binding {
                key_id: "key-a".into(),
                subject: "alice".into(),
                tenant: "acme".into(),
                roles: Roles::of(&[Role::Submitter]),
                kind: Kind::Human,
                expires_at_ms: None,
                revoked: false,
                session: false,
            },
        );
        Authenticator {
            keys,
            service_token: Some(keys::hash("s3rvice-token-that-is-long-enough!!")),
            service_subject: "service:test".into(),
            jwt: None,
            service_identities: vec!["spiffe://sy.test/".into()],
            forwarded_cert: None,
        }
    }

    async fn auth(a: &Authenticator, h: HeaderMap) -> Result<Principal, AuthError> {
        a.authenticate(&Presented::from_headers(&h)?, 0)
            .await
            .map(Arc::unwrap_or_clone)
    }

    #[tokio::test]
    async fn no_credential_is_required_and_malformed_ones_invalid() {
        let a = authn();
        assert_eq!(auth(&a, headers(&[])).await, Err(AuthError::Required));
        for bad in [
            "syk_alice",
            "Basic syk_alice",
            "Bearer ",
            "Bearer nope",
            "Bearer syk_bob",
            "Bearer a.b.c",
        ] {
            assert_eq!(
                auth(&a, headers(&[("authorization", bad)])).await,
                Err(AuthError::Invalid),
                "{bad:?}"
            );
        }
        let p = auth(&a, headers(&[("authorization", "bearer syk_alice")]))
            .await
            .unwrap();
        assert_eq!((p.subject.as_str(), p.method), ("alice", Method::ApiKey));
    }

    #[tokio::test]
    async fn only_a_service_may_act_on_behalf_of_someone() {
        let a = authn();
        let spoof = headers(&[
            ("authorization", "Bearer syk_alice"),
            ("x-switchyard-on-behalf-of", "human:acme:bob"),
        ]);
        assert_eq!(
            auth(&a, spoof).await,
            Err(AuthError::Denied(Permission::Impersonate))
        );
        let svc = headers(&[
            (
                "authorization",
                "Bearer s3rvice-token-that-is-long-enough!!",
            ),
            ("x-switchyard-on-behalf-of", "human:acme:bob"),
        ]);
        let p = auth(&a, svc).await.unwrap();
        assert_eq!(p.acting_subject(), "bob");
        assert_eq!(p.via(), Some("service:test"));
        let garbled = headers(&[
            (
                "authorization",
                "Bearer s3rvice-token-that-is-long-enough!!",
            ),
            ("x-switchyard-on-behalf-of", "bob"),
        ]);
        assert_eq!(auth(&a, garbled).await, Err(AuthError::Invalid));
    }

    #[tokio::test]
    async fn certificates_and_forwarded_identities_are_services_only_when_trusted() {
        let a = authn();
        let xfcc = headers(&[(
            "x-forwarded-client-cert",
            "By=spiffe://sy.test/sa/x;Hash=ab;URI=spiffe://sy.test/ns/sy/sa/executor",
        )]);
        let proxy: std::net::IpAddr = "10.0.0.5".parse().unwrap();
        let trust = ForwardedCert {
            trusted_proxies: vec![proxy],
        };
        let from = |peer: &str, cfg: Option<&ForwardedCert>| {
            Presented::from_headers(&xfcc).unwrap().with_connection(
                None,
                Some(peer.parse().unwrap()),
                &xfcc,
                cfg,
            )
        };
        // From the trusted proxy: a service principal.
        let p = a
            .authenticate(&from("10.0.0.5", Some(&trust)), 0)
            .await
            .unwrap();
        // Believed as a service, never to act for a user or mint keys.
        assert!(p.may(Permission::JobRead));
        assert!(!p.may(Permission::Impersonate) && !p.may(Permission::KeyManage));
        let mut h = xfcc.clone();
        h.insert(
            crate::auth::ON_BEHALF_HEADER,
            "human:default:alice".parse().unwrap(),
        );
        let acting = Presented::from_headers(&h).unwrap().with_connection(
            None,
            Some(proxy),
            &h,
            Some(&trust),
        );
        assert!(a.authenticate(&acting, 0).await.is_err());
        assert_eq!(
            (p.subject.as_str(), p.method),
            (
                "spiffe://sy.test/ns/sy/sa/executor",
                Method::ForwardedCertificate
            )
        );
        // From anyone else, or when not configured: ignored.
        for (peer, cfg) in [("10.0.0.9", Some(&trust)), ("10.0.0.5", None)] {
            assert_eq!(
                a.authenticate(&from(peer, cfg), 0).await,
                Err(AuthError::Required)
            );
        }
        // A certificate outside the allowed identities is refused.
        let cert = |id: &str| {
            Presented::default().with_connection(Some(id.into()), None, &HeaderMap::new(), None)
        };
        assert!(
            a.authenticate(&cert("spiffe://sy.test/ns/a/sa/b"), 0)
                .await
                .is_ok()
        );
        assert_eq!(
            a.authenticate(&cert("spiffe://evil.test/sa/b"), 0).await,
            Err(AuthError::Invalid)
        );
    }

    #[test]
    fn a_loopback_proxy_is_never_trusted_to_forward_identities() {
        for ip in ["127.0.0.1", "::1", "0.0.0.0"] {
            let cfg = AuthConfig {
                forwarded_cert: Some(ForwardedCert {
                    trusted_proxies: vec![ip.parse().unwrap()],
                }),
                ..AuthConfig::default()
            };
            let e = Authenticator::new(&cfg, KeySet::default()).unwrap_err();
            assert!(e.contains("trusted_proxies"), "{ip}: {e}");
        }
    }

    #[test]
    fn a_short_or_missing_service_token_is_a_config_error() {
        let cfg = AuthConfig {
            service_token_env: Some("SWITCHYARD_TEST_NO_SUCH_VAR_FOR_AUTHN".into()),
            ..AuthConfig::default()
        };
        let e = Authenticator::new(&cfg, KeySet::default()).unwrap_err();
        assert!(e.contains("not set"), "{e}");
    }

    #[test]
    fn the_grant_key_comes_from_its_own_variable_else_the_service_token() {
        let env = |v: &str| match v {
            "OK" => Some("g".repeat(40)),
            "SHORT" => Some("short-secret".into()),
            _ => None,
        };
        let cfg = |grant: Option<&str>| AuthConfig {
            grant_key_env: grant.map(str::to_owned),
            ..Default::default()
        };
        assert_eq!(
            cfg(Some("OK")).grant_secret_in(env),
            Ok(Some("g".repeat(40)))
        );
        // Without it, the service token's (none here).
        assert_eq!(cfg(None).grant_secret_in(env), Ok(None));
        let short = cfg(Some("SHORT")).grant_secret_in(env).unwrap_err();
        assert!(short.contains("shorter than 32"), "{short}");
        assert!(!short.contains("short-secret"), "never echoed: {short}");
        let unset = cfg(Some("UNSET")).grant_secret_in(env).unwrap_err();
        assert!(unset.contains("UNSET"), "{unset}");
    }
}
