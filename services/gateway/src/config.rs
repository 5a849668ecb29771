//! `[gateway]`: which doors are open, where they listen, and their limits.

use serde::{Deserialize, Serialize};

/// Default AITP REST/JSON address.
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:7680";
/// Default RESP address.
pub const DEFAULT_RESP_LISTEN: &str = "127.0.0.1:7679";

/// `[gateway]` configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// The executor, when this process does not host it (`http://host:7600`
    /// or `https://` for mTLS with `[auth.service_tls]`).
    pub executor_url: Option<String>,
    /// The approval service, when this process does not host it: OJS
    /// `POST /ojs/v1/jobs/{id}/activate` approves the job's run there, as
    /// the caller. Unset in a split deployment: activate answers
    /// UNAVAILABLE naming this setting.
    pub approval_url: Option<String>,
    /// The registry, when this process does not host it: the MCP endpoint
    /// lists agents and capabilities there. Unset in a split deployment
    /// (with no registry here): `/mcp` is not served.
    pub registry_url: Option<String>,
    /// The ledger, when this process does not host it: the console's
    /// budget pages read it, as each signed-in person.
    pub ledger_url: Option<String>,
    /// The router, when this process does not host it: the console's
    /// routing preview asks it, as each signed-in person.
    pub router_url: Option<String>,
    /// `[gateway.console]`: the web console at `/ui/` on the HTTP door.
    pub console: ConsoleConfig,
    /// `[gateway.mcp]`: Switchyard as an MCP server at `/mcp` on the HTTP
    /// door (streamable HTTP).
    pub mcp: McpConfig,
    /// `[gateway.http]`: AITP over REST/JSON (seed 002 §8), SSE, OpenAPI.
    pub http: HttpConfig,
    /// `[gateway.resp]`: the AGEniX RESP door (seed 001).
    pub resp: RespConfig,
    /// `[gateway.ojs]`: the OJS HTTP binding on the HTTP door.
    pub ojs: OjsConfig,
    /// `[gateway.a2a]`: the A2A door's Agent Card and its signature.
    pub a2a: A2aDoorConfig,
}

/// `[gateway.a2a]`: how the A2A door's Agent Card is published. With both
/// settings the card is signed (A2A 1.0 signed Agent Cards: EdDSA over the
/// card's canonical JSON) and its key published at
/// `/.well-known/jwks.json`; `switchyard dev` makes a key in its data
/// directory and uses its own HTTP address. Without them the card is
/// unsigned and names the address the client asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct A2aDoorConfig {
    /// The door's public base URL (`https://switchyard.example.com`): the
    /// card's JSON-RPC interface is `{public_url}/a2a`, never taken from the
    /// request's Host header once the card is signed (else anyone could
    /// have a signed card name their host).
    pub public_url: Option<String>,
    /// An Ed25519 private key in PKCS#8 PEM (`openssl genpkey -algorithm
    /// ed25519 -out card-key.pem`) the card is signed with.
    pub signing_key_file: Option<std::path::PathBuf>,
}

impl A2aDoorConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(u) = &self.public_url
            && !(u.starts_with("https://") || u.starts_with("http://"))
        {
            return Err(format!(
                "gateway.a2a.public_url {u:?} must be an http(s) URL"
            ));
        }
        if self.public_url.is_some() != self.signing_key_file.is_some() {
            return Err(
                "gateway.a2a: set both public_url and signing_key_file to sign the Agent Card, or neither".into(),
            );
        }
        Ok(())
    }
}

/// `[gateway.console]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console at `/ui/`.
    pub enabled: bool,
    /// How long a sign-in lasts, seconds: the lifetime of the server-side
    /// session the console starts (`StartSession`; at most a day). It ends
    /// sooner at sign-out, when its key is revoked or its token expires.
    pub session_ttl_secs: u64,
    /// Mark the session cookie `Secure` (sent over HTTPS only): set it when
    /// the console is reached over TLS (an ingress terminating TLS in front
    /// of the gateway).
    pub secure_cookie: bool,
    /// `[gateway.console.oidc]`: signing in through the identity provider
    /// `[auth.oidc]` trusts (authorization code flow with PKCE).
    pub oidc: ConsoleOidcConfig,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            session_ttl_secs: 12 * 3600,
            secure_cookie: false,
            oidc: ConsoleOidcConfig::default(),
        }
    }
}

/// `[gateway.console.oidc]` configuration: the console as an OpenID Connect
/// client of the issuer in `[auth.oidc]`. Unset `client_id`: the console
/// signs in with pasted keys and tokens only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleOidcConfig {
    /// The console's client id at the provider. Tokens it gets must still
    /// pass `[auth.oidc]` (issuer, audience, roles claim).
    pub client_id: String,
    /// Environment variable holding the client secret (confidential
    /// clients); unset with `client_secret_file`: a public client (PKCE).
    pub client_secret_env: Option<String>,
    /// File holding the client secret (a mounted Secret).
    pub client_secret_file: Option<std::path::PathBuf>,
    /// The callback URL registered at the provider; unset: this door's
    /// `Host` + `/ui/oidc/callback` (https when `secure_cookie`).
    pub redirect_url: Option<String>,
    /// Scopes asked for.
    pub scopes: Vec<String>,
    /// The provider's endpoints, when its discovery document
    /// (`ISSUER/.well-known/openid-configuration`) should not be used.
    pub authorization_endpoint: Option<String>,
    /// See `authorization_endpoint`.
    pub token_endpoint: Option<String>,
}

impl Default for ConsoleOidcConfig {
    fn default() -> Self {
        ConsoleOidcConfig {
            client_id: String::new(),
            client_secret_env: None,
            client_secret_file: None,
            redirect_url: None,
            scopes: vec!["openid".into(), "email".into(), "profile".into()],
            authorization_endpoint: None,
            token_endpoint: None,
        }
    }
}

/// `[gateway.mcp]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// Serve `/mcp`.
    pub enabled: bool,
    /// `Host` header values (hostnames, or `host:port`) `/mcp` answers,
    /// against DNS rebinding; a deployment behind a name adds it.
    pub allowed_hosts: Vec<String>,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            enabled: true,
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
        }
    }
}

/// `[gateway.ojs]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OjsConfig {
    /// Job types Switchyard runs itself (an LLM task when the job carries
    /// `ext_agent_*` model fields, else a call to an agent offering the
    /// type as a capability): exact types, or prefixes ending in `.*`.
    /// Every other OJS job is a queue job for pull workers.
    pub run_types: Vec<String>,
    /// How long `POST /ojs/v1/workers/fetch` waits for a job when none is
    /// available and the request gives no `wait_ms`, ms.
    pub fetch_wait_ms: u64,
}

impl Default for OjsConfig {
    fn default() -> Self {
        OjsConfig {
            run_types: vec!["switchyard.*".into()],
            fetch_wait_ms: 500,
        }
    }
}

impl OjsConfig {
    /// Whether Switchyard runs jobs of `job_type` itself.
    pub fn runs(&self, job_type: &str) -> bool {
        self.run_types.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => job_type.starts_with(prefix),
            None => job_type == p,
        })
    }
}

/// `[gateway.http]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Serve this door.
    pub enabled: bool,
    /// `host:port`. Unset: 127.0.0.1:7680, or a free port on the gRPC
    /// listener's host when that one asks for a free port (`--listen
    /// 127.0.0.1:0`), so several processes can start side by side.
    pub listen: Option<String>,
    /// Largest request body, bytes. Unset: `server.max_message_bytes`, the
    /// largest job the executor accepts anyway.
    pub max_body_bytes: Option<usize>,
    /// Time to produce a response's head, ms (an SSE stream then runs on
    /// until its job ends); 0 = none.
    pub request_timeout_ms: u64,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Connections one peer address may hold at once; more are closed.
    pub max_connections_per_ip: usize,
    /// A request's head must arrive within this from its first byte, ms.
    pub header_read_timeout_ms: u64,
    /// A connection with nothing read or written for this long is closed,
    /// ms (event streams write a keep-alive every 15 s).
    pub idle_timeout_ms: u64,
}

impl HttpConfig {
    /// The door's connection limits.
    pub fn limits(&self) -> crate::http::Limits {
        crate::http::Limits {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            header_read: std::time::Duration::from_millis(self.header_read_timeout_ms),
            idle: std::time::Duration::from_millis(self.idle_timeout_ms),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            enabled: true,
            listen: None,
            max_body_bytes: None,
            request_timeout_ms: 30_000,
            max_connections: 1024,
            max_connections_per_ip: 256,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
        }
    }
}

/// `[gateway.resp]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RespConfig {
    /// Serve this door.
    pub enabled: bool,
    /// `host:port`. Unset: 127.0.0.1:7679, or a free port as for
    /// [`HttpConfig::listen`].
    pub listen: Option<String>,
    /// Largest bulk string (a command argument), bytes; a longer one is
    /// refused from its length prefix, before it is read. Unset:
    /// `server.max_message_bytes`.
    pub max_bulk_bytes: Option<usize>,
    /// Most arguments in one command.
    pub max_arguments: usize,
    /// Connections open at once; one more is answered `-ERR max number of
    /// clients reached` and closed, as Redis does.
    pub max_connections: usize,
    /// A connection that sends nothing for this long is closed, seconds;
    /// 0 = never.
    pub idle_timeout_secs: u64,
    /// A connection must `AUTH` (or `HELLO … AUTH`) within this of
    /// connecting, ms; else it is answered an error and closed.
    pub auth_timeout_ms: u64,
    /// Connections not yet authenticated at once; one more is refused, so
    /// clients that never `AUTH` cannot take every slot.
    pub max_unauthenticated: usize,
    /// A frame begun must be complete within this, ms: a command trickled
    /// byte by byte is cut off.
    pub frame_timeout_ms: u64,
}

impl Default for RespConfig {
    fn default() -> Self {
        RespConfig {
            enabled: true,
            listen: None,
            max_bulk_bytes: None,
            max_arguments: 64,
            max_connections: 1024,
            idle_timeout_secs: 300,
            auth_timeout_ms: 10_000,
            max_unauthenticated: 64,
            frame_timeout_ms: 10_000,
        }
    }
}

impl GatewayConfig {
    /// Checks the limits.
    pub fn validate(&self) -> Result<(), String> {
        self.a2a.validate()?;
        if self.http.max_connections_per_ip == 0
            || self.http.header_read_timeout_ms == 0
            || self.http.idle_timeout_ms < 20_000
        {
            return Err(
                "gateway.http.max_connections_per_ip and header_read_timeout_ms must be at least 1, idle_timeout_ms at least 20000 (event streams write every 15 s)"
                    .into(),
            );
        }
        if self.resp.auth_timeout_ms == 0
            || self.resp.max_unauthenticated == 0
            || self.resp.frame_timeout_ms == 0
        {
            return Err(
                "gateway.resp.auth_timeout_ms, max_unauthenticated and frame_timeout_ms must be at least 1"
                    .into(),
            );
        }
        if self.http.max_connections == 0 || self.resp.max_connections == 0 {
            return Err(
                "gateway.http.max_connections and gateway.resp.max_connections must be at least 1"
                    .into(),
            );
        }
        if self.resp.max_arguments < 2 {
            return Err(
                "gateway.resp.max_arguments must be at least 2 (a verb and its argument)".into(),
            );
        }
        for (key, v) in [
            ("gateway.http.max_body_bytes", self.http.max_body_bytes),
            ("gateway.resp.max_bulk_bytes", self.resp.max_bulk_bytes),
        ] {
            if v.is_some_and(|b| b < 1024) {
                return Err(format!("{key} must be at least 1024"));
            }
        }
        if !(60..=86_400).contains(&self.console.session_ttl_secs) {
            return Err(format!(
                "gateway.console.session_ttl_secs must be between 60 (a minute) and 86400 (a day, the longest a session lives), not {}",
                self.console.session_ttl_secs
            ));
        }
        Ok(())
    }

    /// Where the HTTP door listens, given the gRPC listen address.
    pub fn http_listen(&self, grpc_listen: &str) -> String {
        resolve(
            self.http.listen.as_deref(),
            DEFAULT_HTTP_LISTEN,
            grpc_listen,
        )
    }

    /// Where the RESP door listens, given the gRPC listen address.
    pub fn resp_listen(&self, grpc_listen: &str) -> String {
        resolve(
            self.resp.listen.as_deref(),
            DEFAULT_RESP_LISTEN,
            grpc_listen,
        )
    }
}

/// The configured address, else the default — or a free port on the gRPC
/// host when the gRPC listener asks for a free port.
fn resolve(set: Option<&str>, default: &str, grpc_listen: &str) -> String {
    if let Some(a) = set {
        return a.to_owned();
    }
    match grpc_listen.rsplit_once(':') {
        Some((host, "0")) => format!("{host}:0"),
        _ => default.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_addresses_follow_a_free_grpc_port_and_else_take_the_defaults() {
        let c = GatewayConfig::default();
        assert_eq!(c.http_listen("127.0.0.1:7600"), DEFAULT_HTTP_LISTEN);
        assert_eq!(c.resp_listen("127.0.0.1:7600"), DEFAULT_RESP_LISTEN);
        assert_eq!(c.http_listen("127.0.0.1:0"), "127.0.0.1:0");
        assert_eq!(c.resp_listen("[::1]:0"), "[::1]:0");
        let set = GatewayConfig {
            resp: RespConfig {
                listen: Some("0.0.0.0:6379".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(set.resp_listen("127.0.0.1:0"), "0.0.0.0:6379");
        c.validate().unwrap();
        let tiny = GatewayConfig {
            resp: RespConfig {
                max_bulk_bytes: Some(10),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(tiny.validate().unwrap_err().contains("max_bulk_bytes"));
        for (ttl, ok) in [
            (0, false),
            (59, false),
            (60, true),
            (43_200, true),
            (86_400, true),
            (86_401, false),
        ] {
            let c = GatewayConfig {
                console: ConsoleConfig {
                    session_ttl_secs: ttl,
                    ..Default::default()
                },
                ..Default::default()
            };
            assert_eq!(c.validate().is_ok(), ok, "{ttl}");
        }
    }
}
