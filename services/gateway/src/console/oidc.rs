//! Signing in to the console through the deployment's identity provider:
//! OpenID Connect's authorization code flow with PKCE (RFC 7636), for the
//! issuer `[auth.oidc]` already trusts.
//!
//! `GET /ui/sign-in/oidc` sends the browser to the provider with a fresh
//! `state`, `nonce` and code challenge, remembered in a short-lived cookie
//! (`SameSite=Lax`: the provider's redirect back is a top-level navigation
//! from another site, which a `Strict` cookie would not survive). The
//! callback checks `state`, exchanges the code with the verifier, and
//! authenticates the token it gets exactly as every door authenticates a
//! bearer token (signature, issuer, audience, expiry, roles from claims) —
//! the access token when the authenticator accepts it, else the ID token
//! (whose `nonce` must then be this sign-in's). That token becomes the
//! session. Nothing here grants anything the token would not.

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::config::ConsoleOidcConfig;

/// The pre-session cookie of a sign-in in flight.
pub const FLOW_COOKIE: &str = "sy_oidc";

/// Why a sign-in through the provider did not happen (shown on the sign-in
/// page; never a secret).
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The console has no provider sign-in configured.
    #[error(
        "this console signs in with API keys only: set [gateway.console.oidc] client_id (and [auth.oidc]) to sign in with your identity provider"
    )]
    NotConfigured,
    /// Discovery failed.
    #[error("the identity provider's configuration could not be read from {url}: {why}")]
    Discovery { url: String, why: String },
    /// An endpoint is not allowed.
    #[error(
        "the identity provider's {what} {url:?} must be https:// (http:// only to a loopback address)"
    )]
    Insecure { what: &'static str, url: String },
    /// The browser came back without the flow this console started.
    #[error("this sign-in was not started here or has expired (10 minutes): sign in again")]
    StateMismatch,
    /// The provider said no.
    #[error("the identity provider refused the sign-in: {0}")]
    Refused(String),
    /// The code exchange failed.
    #[error("the identity provider did not exchange the code: {0}")]
    Exchange(String),
    /// No token the authenticator accepts.
    #[error("the identity provider's tokens are not accepted here: {0}")]
    Token(String),
}

/// The provider's endpoints, from its discovery document.
#[derive(Debug, Clone, Deserialize)]
pub struct Endpoints {
    /// Where the browser signs in.
    pub authorization_endpoint: String,
    /// Where the code is exchanged.
    pub token_endpoint: String,
}

/// The provider sign-in of one console.
pub struct Provider {
    cfg: ConsoleOidcConfig,
    issuer: String,
    client_secret: Option<String>,
    endpoints: OnceCell<Endpoints>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the client secret.
        f.debug_struct("Provider")
            .field("issuer", &self.issuer)
            .field("client_id", &self.cfg.client_id)
            .field("confidential", &self.client_secret.is_some())
            .finish_non_exhaustive()
    }
}

/// A sign-in in flight: what the browser keeps in [`FLOW_COOKIE`].
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// Echoed by the provider; must come back unchanged.
    pub state: String,
    /// The PKCE verifier.
    pub verifier: String,
    /// Must be the ID token's `nonce`.
    pub nonce: String,
    /// Where to go once signed in.
    pub next: String,
}

impl Flow {
    /// A new flow returning to `next`.
    pub fn new(next: &str) -> Result<Flow, getrandom::Error> {
        Ok(Flow {
            state: random(16)?,
            verifier: random(32)?,
            nonce: random(16)?,
            next: super::session::next_path(Some(next)).to_owned(),
        })
    }

    /// The S256 code challenge of the verifier.
    pub fn challenge(&self) -> String {
        b64(&Sha256::digest(self.verifier.as_bytes()))
    }

    /// As a cookie value (`.`-separated, the path base64url-encoded).
    pub fn encode(&self) -> String {
        format!(
            "{}.{}.{}.{}",
            self.state,
            self.verifier,
            self.nonce,
            b64(self.next.as_bytes())
        )
    }

    /// From a cookie value.
    pub fn decode(s: &str) -> Option<Flow> {
        let mut parts = s.split('.');
        let (state, verifier, nonce, next) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let next = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(next)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())?;
        Some(Flow {
            state: state.to_owned(),
            verifier: verifier.to_owned(),
            nonce: nonce.to_owned(),
            next: super::session::next_path(Some(&next)).to_owned(),
        })
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

pub(crate) fn random(n: usize) -> Result<String, getrandom::Error> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b)?;
    Ok(b64(&b))
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    id_token: Option<String>,
}

impl Provider {
    /// The provider sign-in for `issuer` (`[auth.oidc] issuer`), when
    /// `cfg` names a client; its secret read now from where `cfg` says.
    pub fn new(cfg: &ConsoleOidcConfig, issuer: Option<&str>) -> Result<Option<Provider>, String> {
        if cfg.client_id.is_empty() {
            return Ok(None);
        }
        let issuer = issuer.filter(|i| !i.is_empty()).ok_or(
            "gateway.console.oidc needs [auth.oidc] (the issuer whose tokens this deployment trusts)",
        )?;
        let client_secret = match (&cfg.client_secret_env, &cfg.client_secret_file) {
            (Some(var), None) => Some(std::env::var(var).map_err(|_| {
                format!("gateway.console.oidc.client_secret_env names {var}, which is not set")
            })?),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| {
                        format!(
                            "gateway.console.oidc.client_secret_file {}: {e}",
                            path.display()
                        )
                    })?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err(
                    "gateway.console.oidc: set client_secret_env or client_secret_file, not both"
                        .into(),
                );
            }
        };
        switchyard_kit::tls::install_crypto();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("building the identity provider's HTTP client: {e}"))?;
        Ok(Some(Provider {
            cfg: cfg.clone(),
            issuer: issuer.trim_end_matches('/').to_owned(),
            client_secret,
            endpoints: OnceCell::new(),
            http,
        }))
    }

    /// The provider's endpoints: configured, else discovered once.
    async fn endpoints(&self) -> Result<&Endpoints, OidcError> {
        self.endpoints
            .get_or_try_init(|| async {
                let e = match (&self.cfg.authorization_endpoint, &self.cfg.token_endpoint) {
                    (Some(a), Some(t)) => Endpoints {
                        authorization_endpoint: a.clone(),
                        token_endpoint: t.clone(),
                    },
                    _ => self.discover().await?,
                };
                for (what, url) in [
                    ("authorization endpoint", &e.authorization_endpoint),
                    ("token endpoint", &e.token_endpoint),
                ] {
                    if !switchyard_kit::auth::jwt::allowed_url(url) {
                        return Err(OidcError::Insecure {
                            what,
                            url: url.clone(),
                        });
                    }
                }
                Ok(e)
            })
            .await
    }

    async fn discover(&self) -> Result<Endpoints, OidcError> {
        let url = format!("{}/.well-known/openid-configuration", self.issuer);
        if !switchyard_kit::auth::jwt::allowed_url(&url) {
            return Err(OidcError::Insecure {
                what: "issuer",
                url: self.issuer.clone(),
            });
        }
        let fail = |why: String| OidcError::Discovery {
            url: url.clone(),
            why,
        };
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(fail(format!("HTTP {}", resp.status())));
        }
        resp.json::<Endpoints>()
            .await
            .map_err(|e| fail(format!("not a discovery document: {e}")))
    }

    /// Where this console's callback is: configured, else on `host`
    /// (`https` when the console is reached over TLS).
    pub fn redirect_uri(&self, host: &str, tls: bool) -> String {
        self.cfg.redirect_url.clone().unwrap_or_else(|| {
            format!(
                "{}://{host}/ui/oidc/callback",
                if tls { "https" } else { "http" }
            )
        })
    }

    /// The provider's sign-in URL for `flow`.
    pub async fn authorize_url(
        &self,
        flow: &Flow,
        redirect_uri: &str,
    ) -> Result<String, OidcError> {
        let e = self.endpoints().await?;
        let scopes = self.cfg.scopes.join(" ");
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.cfg.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", &scopes)
            .append_pair("state", &flow.state)
            .append_pair("nonce", &flow.nonce)
            .append_pair("code_challenge", &flow.challenge())
            .append_pair("code_challenge_method", "S256")
            .finish();
        let sep = if e.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        Ok(format!("{}{sep}{query}", e.authorization_endpoint))
    }

    /// Exchanges `code` (with the flow's verifier) for the provider's
    /// tokens: the candidates for the session, access token first.
    pub async fn exchange(
        &self,
        flow: &Flow,
        code: &str,
        redirect_uri: &str,
    ) -> Result<Vec<(&'static str, String)>, OidcError> {
        let e = self.endpoints().await?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("client_id", &self.cfg.client_id),
            ("code_verifier", &flow.verifier),
        ];
        if let Some(s) = &self.client_secret {
            form.push(("client_secret", s));
        }
        let body = form
            .iter()
            .fold(
                form_urlencoded::Serializer::new(String::new()),
                |mut s, (k, v)| {
                    s.append_pair(k, v);
                    s
                },
            )
            .finish();
        let resp = self
            .http
            .post(&e.token_endpoint)
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| OidcError::Exchange(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            // The provider's error code (RFC 6749 §5.2), never its body
            // verbatim: it may echo what was sent.
            let code = resp
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|v| {
                    v["error"]
                        .as_str()
                        .map(|s| switchyard_core::validate::clamp(s, 60).to_owned())
                })
                .unwrap_or_default();
            return Err(OidcError::Exchange(format!("HTTP {status} {code}")));
        }
        let t: TokenResponse = resp
            .json()
            .await
            .map_err(|e| OidcError::Exchange(format!("not a token response: {e}")))?;
        let mut out = Vec::new();
        if let Some(a) = t.access_token.filter(|a| a.split('.').count() == 3) {
            out.push(("access token", a));
        }
        if let Some(i) = t.id_token {
            out.push(("ID token", i));
        }
        if out.is_empty() {
            return Err(OidcError::Exchange("the response carries no JWT".into()));
        }
        Ok(out)
    }
}

/// The `nonce` claim of a JWT whose signature was verified already.
pub fn nonce_of(jwt: &str) -> Option<String> {
    let payload = jwt.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v["nonce"].as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_survives_its_cookie_and_its_challenge_is_s256_of_the_verifier() {
        let f = Flow::new("/ui/jobs?state=active").expect("randomness");
        let back = Flow::decode(&f.encode()).expect("decodes");
        assert_eq!(back, f);
        assert_ne!(f.state, Flow::new("/ui/").expect("randomness").state);
        // RFC 7636 appendix B.
        let rfc = Flow {
            verifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".into(),
            ..f.clone()
        };
        assert_eq!(
            rfc.challenge(),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        // Only console paths come back out.
        let evil = format!("a.b.c.{}", b64(b"https://evil.example/"));
        assert_eq!(Flow::decode(&evil).expect("decodes").next, "/ui/");
        assert!(Flow::decode("a.b.c").is_none());
        assert!(Flow::decode("a.b.c.d.e").is_none());
    }

    #[test]
    fn the_nonce_is_read_from_a_tokens_claims() {
        let claims = b64(br#"{"sub":"erin","nonce":"n-123"}"#);
        assert_eq!(nonce_of(&format!("h.{claims}.s")).as_deref(), Some("n-123"));
        assert_eq!(nonce_of("not-a-jwt"), None);
    }

    #[test]
    fn a_console_without_a_client_has_no_provider_sign_in_and_one_needs_an_issuer() {
        let none = ConsoleOidcConfig::default();
        assert!(
            Provider::new(&none, Some("https://idp"))
                .expect("ok")
                .is_none()
        );
        let cfg = ConsoleOidcConfig {
            client_id: "switchyard".into(),
            ..Default::default()
        };
        assert!(
            Provider::new(&cfg, None)
                .unwrap_err()
                .contains("[auth.oidc]")
        );
        let p = Provider::new(&cfg, Some("https://idp.example/"))
            .expect("ok")
            .expect("some");
        assert_eq!(p.issuer, "https://idp.example");
        assert_eq!(
            p.redirect_uri("127.0.0.1:7680", false),
            "http://127.0.0.1:7680/ui/oidc/callback"
        );
        assert!(format!("{p:?}").contains("confidential: false"));
    }
}
