//! TLS plumbing shared by every HTTP and gRPC client and server: one rustls
//! crypto provider (ring) per process.

/// Installs the ring crypto provider for rustls once per process; every
/// rustls user here (LLM providers, JWKS fetches, mTLS) calls this first.
pub fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider is installed already: that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Whether a TLS server asks for client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// Clients may present a certificate (services) or not (people and
    /// tools with bearer tokens).
    #[default]
    Optional,
    /// Every client must present a certificate from the client CA: an
    /// inter-service port.
    Required,
}

/// `[server.tls]`: serve gRPC over TLS, optionally verifying client
/// certificates (mTLS between services).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ServerTls {
    /// PEM certificate chain of this server.
    pub cert_file: PathBuf,
    /// PEM private key of this server.
    pub key_file: PathBuf,
    /// PEM CA that signs service (client) certificates; unset: clients are
    /// not asked for certificates.
    pub client_ca_file: Option<PathBuf>,
    /// Whether a client certificate is optional or required.
    pub client_auth: ClientAuth,
}

/// `[auth.service_tls]`: how this process reaches other Switchyard services
/// over TLS (`https://` URLs), presenting its own certificate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ClientTls {
    /// PEM CA that signs the servers' certificates.
    pub ca_file: PathBuf,
    /// PEM certificate of this process (its service identity).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of this process.
    pub key_file: Option<PathBuf>,
    /// Name to verify the servers' certificates against, when it is not the
    /// URL's host.
    pub domain: Option<String>,
}

fn read(what: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {what} {}: {e}", path.display()))
}

impl ServerTls {
    /// The tonic server TLS settings (files read now).
    pub fn tonic(&self) -> Result<tonic::transport::ServerTlsConfig, String> {
        install_crypto();
        let identity = tonic::transport::Identity::from_pem(
            read("server.tls.cert_file", &self.cert_file)?,
            read("server.tls.key_file", &self.key_file)?,
        );
        let mut cfg = tonic::transport::ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca_file {
            cfg = cfg
                .client_ca_root(tonic::transport::Certificate::from_pem(read(
                    "server.tls.client_ca_file",
                    ca,
                )?))
                .client_auth_optional(self.client_auth == ClientAuth::Optional);
        } else if self.client_auth == ClientAuth::Required {
            return Err("server.tls.client_auth = required needs server.tls.client_ca_file".into());
        }
        Ok(cfg)
    }
}

impl ClientTls {
    /// The tonic client TLS settings (files read now).
    pub fn tonic(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        install_crypto();
        let mut cfg = tonic::transport::ClientTlsConfig::new().ca_certificate(
            tonic::transport::Certificate::from_pem(read(
                "auth.service_tls.ca_file",
                &self.ca_file,
            )?),
        );
        match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => {
                cfg = cfg.identity(tonic::transport::Identity::from_pem(
                    read("auth.service_tls.cert_file", c)?,
                    read("auth.service_tls.key_file", k)?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(
                    "auth.service_tls needs both cert_file and key_file, or neither".into(),
                );
            }
        }
        if let Some(d) = &self.domain {
            cfg = cfg.domain_name(d.clone());
        }
        Ok(cfg)
    }
}

/// The service identity a verified client certificate names: its first URI
/// SAN (SPIFFE-style `spiffe://domain/ns/x/sa/y`), else its first DNS SAN.
pub fn certificate_subject(der: &[u8]) -> Option<String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let names = &san.value.general_names;
    names
        .iter()
        .find_map(|n| match n {
            GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .or_else(|| {
            names.iter().find_map(|n| match n {
                GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
        })
}
