//! mTLS between services in split mode, with certificates made here (rcgen):
//! the registry (also keeping the API keys) serves TLS and requires client
//! certificates; the router reaches it over mTLS with its own certificate
//! and no service token, so its identity is the certificate's SPIFFE SAN;
//! the CLI's key, verified by the router against the key set it follows
//! over mTLS, routes. Clients without a certificate, or with one from
//! another CA, are refused by the inter-service port.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use crate::support::*;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca() -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A certificate signed by `ca` for `sans` (DNS names, IPs or URIs);
/// written as `<name>.crt` / `<name>.key` in `dir`.
fn issue(ca: &Ca, dir: &Path, name: &str, sans: &[&str]) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    for s in sans {
        params.subject_alt_names.push(if s.contains("://") {
            SanType::URI((*s).try_into().unwrap())
        } else if let Ok(ip) = s.parse() {
            SanType::IpAddress(ip)
        } else {
            SanType::DnsName((*s).try_into().unwrap())
        });
    }
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
}

fn p(dir: &Path, f: &str) -> String {
    dir.join(f).to_str().unwrap().to_owned()
}

/// A TLS client of `url` trusting `ca`, presenting `identity` (if any);
/// returns whether a health check got through.
async fn reaches(url: &str, ca: &str, identity: Option<(&str, &str)>) -> bool {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .domain_name("localhost");
    if let Some((c, k)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(c).unwrap(),
            std::fs::read(k).unwrap(),
        ));
    }
    switchyard_kit::tls::install_crypto();
    let Ok(ep) = Endpoint::from_shared(url.to_owned())
        .unwrap()
        .tls_config(tls)
    else {
        return false;
    };
    let ep = ep.connect_timeout(Duration::from_secs(5));
    let Ok(ch) = ep.connect().await else {
        return false;
    };
    tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .is_ok()
}

#[test]
fn services_authenticate_each_other_with_certificates_and_refuse_clients_without_one() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = ca();
    std::fs::write(d.join("ca.crt"), &ca.pem).unwrap();
    issue(&ca, d, "registry", &["localhost", "127.0.0.1"]);
    issue(
        &ca,
        d,
        "router",
        &["spiffe://switchyard.test/ns/sy/sa/router"],
    );
    let rogue = self::ca();
    std::fs::write(d.join("rogue-ca.crt"), &rogue.pem).unwrap();
    issue(
        &rogue,
        d,
        "rogue",
        &["spiffe://switchyard.test/ns/sy/sa/router"],
    );

    let registry_cfg = d.join("registry.toml");
    std::fs::write(
        &registry_cfg,
        format!(
            "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\nclient_auth = \"required\"\n\
             [auth]\nservice_identities = [\"spiffe://switchyard.test/ns/sy/\"]\n",
            p(d, "registry.crt"),
            p(d, "registry.key"),
            p(d, "ca.crt"),
        ),
    )
    .unwrap();
    let data = d.join("data");
    let registry = Proc::start_plain(
        &[
            "serve",
            "--services",
            "registry,auth",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            registry_cfg.to_str().unwrap(),
        ],
        &[("SWITCHYARD_AUTH__DEV_CREDENTIALS", "true")],
    );
    let port = registry.addr.rsplit_once(':').unwrap().1.to_owned();
    let registry_url = format!("https://localhost:{port}");

    // No client certificate, a rogue CA's, or plaintext: refused.
    let ca_pem = p(d, "ca.crt");
    assert!(
        !rt.block_on(reaches(&registry_url, &ca_pem, None)),
        "no client certificate"
    );
    assert!(
        !rt.block_on(reaches(
            &registry_url,
            &ca_pem,
            Some((&p(d, "rogue.crt"), &p(d, "rogue.key")))
        )),
        "a certificate from another CA"
    );
    assert_eq!(health(&registry.addr, ""), None, "plaintext is not served");
    assert!(rt.block_on(reaches(
        &registry_url,
        &ca_pem,
        Some((&p(d, "router.crt"), &p(d, "router.key")))
    )));

    // The router: mTLS to the registry with its certificate, no token.
    let router_cfg = d.join("router.toml");
    std::fs::write(
        &router_cfg,
        format!(
            "[auth]\nkeys_url = {registry_url:?}\n[auth.service_tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
            p(d, "ca.crt"),
            p(d, "router.crt"),
            p(d, "router.key"),
        ),
    )
    .unwrap();
    let router = Proc::start_plain(
        &[
            "serve",
            "--services",
            "router",
            "--listen",
            "127.0.0.1:0",
            "--registry-url",
            &registry_url,
            "--config",
            router_cfg.to_str().unwrap(),
        ],
        &[],
    );
    wait_for("router SERVING over mTLS", Duration::from_secs(20), || {
        health(&router.addr, "") == SERVING
    });
    // The CLI's admin key (from the registry's credentials file) is verified
    // by the router against the key set it follows over mTLS.
    let creds = data.join("credentials.json");
    let out = Command::new(BIN)
        .args([
            "route",
            "--capability",
            "nothing.here",
            "--url",
            &router.url(),
        ])
        .env("SWITCHYARD_CREDENTIALS", &creds)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CAPABILITY_UNAVAILABLE"),
        "authenticated, routed: {err}"
    );
    let anon = Command::new(BIN)
        .args(["route", "--capability", "x", "--url", &router.url()])
        .env("SWITCHYARD_CREDENTIALS", d.join("none.json"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&anon.stderr).contains("AUTH_REQUIRED"));
    assert_eq!(router.terminate(), Some(0));
    assert_eq!(registry.terminate(), Some(0));
}

use std::process::Command;
