//! The egress guard: every outbound URL the server calls because a caller
//! named it (an agent's endpoint, an MCP server, an A2A card) passes here.
//!
//! URLs are parsed once (`url`), never compared as strings: userinfo is
//! refused (`http://allowed@evil/` is not `allowed`), an allowlist entry
//! matches the exact scheme, host and port and its path at segment
//! boundaries (`/api` covers `/api/x`, not `/apix`), and the addresses a
//! host resolves to are checked against loopback, private, link-local
//! (cloud metadata at 169.254.169.254), unique-local and unspecified ranges,
//! refused unless the operator allows them (`switchyard dev` allows
//! loopback). Redirects are not followed by the clients that use this
//! guard, and what an upstream answered is never echoed: [`summary`] keeps
//! a bounded, sanitized head of an error, without a body.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// `[registry.egress]`: which destinations callers may name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// Loopback addresses (127.0.0.0/8, ::1). Unset: allowed by
    /// `switchyard dev` only.
    pub allow_loopback: Option<bool>,
    /// Private, link-local (cloud metadata), unique-local and shared
    /// ranges. Off unless set.
    pub allow_private: bool,
}

impl EgressConfig {
    /// Whether loopback is allowed.
    pub fn loopback(&self) -> bool {
        self.allow_loopback.unwrap_or(false)
    }
}

/// Why a destination was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// Not a URL the guard accepts.
    #[error("{0}")]
    Url(String),
    /// Outside the allowlist.
    #[error("{url} is not under {setting}")]
    NotAllowed {
        /// The URL, without userinfo.
        url: String,
        /// The allowlist's setting name.
        setting: String,
    },
    /// It resolves to an address of a refused range.
    #[error(
        "{host} resolves to {addr} ({range}), which the server does not call for callers: allow it with registry.egress.{setting} if it is meant"
    )]
    Range {
        /// Host as named.
        host: String,
        /// The refused address.
        addr: IpAddr,
        /// The range's name.
        range: &'static str,
        /// The setting that allows it.
        setting: &'static str,
    },
}

/// A parsed `http(s)` URL with a host and no userinfo.
pub fn parse(raw: &str) -> Result<url::Url, EgressError> {
    let u = url::Url::parse(raw)
        .map_err(|e| EgressError::Url(format!("{:?} is not a URL: {e}", cut(raw))))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(EgressError::Url(format!(
            "{:?} is not an http:// or https:// URL",
            cut(raw)
        )));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(EgressError::Url(
            "a URL with user information (user@host) is refused: put credentials in a configured secret"
                .into(),
        ));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(EgressError::Url(format!("{:?} has no host", cut(raw))));
    }
    Ok(u)
}

/// Whether `url` is under allowlist entry `entry`: same scheme, host and
/// port, and the entry's path a prefix at a segment boundary.
pub fn under(url: &url::Url, entry: &str) -> bool {
    let Ok(e) = parse(entry) else {
        return false;
    };
    let origin = url.scheme() == e.scheme()
        && url.host_str() == e.host_str()
        && url.port_or_known_default() == e.port_or_known_default();
    let base = e.path().trim_end_matches('/');
    let path = url.path();
    origin
        && (base.is_empty()
            || path == base
            || path.strip_prefix(base).is_some_and(|r| r.starts_with('/')))
}

/// `url` when it is acceptable and, with a non-empty `allowed`, under one
/// of its entries (`setting` names the allowlist in the refusal).
pub fn check(raw: &str, allowed: &[String], setting: &str) -> Result<url::Url, EgressError> {
    let u = parse(raw)?;
    if !allowed.is_empty() && !allowed.iter().any(|a| under(&u, a)) {
        return Err(EgressError::NotAllowed {
            url: u.to_string(),
            setting: setting.to_owned(),
        });
    }
    Ok(u)
}

/// The refused range `ip` falls in under `cfg`, and the setting allowing it.
pub fn refused_range(ip: IpAddr, cfg: &EgressConfig) -> Option<(&'static str, &'static str)> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    if ip.is_loopback() {
        return (!cfg.loopback()).then_some(("loopback", "allow_loopback"));
    }
    let private = match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            let shared = a == 100 && (64..128).contains(&b); // 100.64.0.0/10
            (v4.is_private()
                || v4.is_link_local()
                || shared
                || v4.is_unspecified()
                || v4.is_broadcast())
            .then_some("private or link-local")
        }
        IpAddr::V6(v6) => {
            let seg = v6.segments()[0];
            let unique_local = (seg & 0xfe00) == 0xfc00;
            let link_local = (seg & 0xffc0) == 0xfe80;
            (unique_local || link_local || v6.is_unspecified()).then_some("private or link-local")
        }
    };
    match private {
        Some(range) if !cfg.allow_private => Some((range, "allow_private")),
        _ => None,
    }
}

/// Resolves `url`'s host and refuses it when any address is in a refused
/// range (a name resolving to both public and private addresses is
/// refused: the client might connect to either).
pub async fn resolve_check(url: &url::Url, cfg: &EgressConfig) -> Result<(), EgressError> {
    let host = url.host_str().unwrap_or_default().to_owned();
    let port = url.port_or_known_default().unwrap_or(80);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<IpAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| EgressError::Url(format!("{host} does not resolve: {e}")))?
            .map(|a| a.ip())
            .collect(),
    };
    for addr in addrs {
        if let Some((range, setting)) = refused_range(addr, cfg) {
            return Err(EgressError::Range {
                host,
                addr,
                range,
                setting,
            });
        }
    }
    Ok(())
}

/// A bounded, sanitized summary of what went wrong upstream: the head of
/// `error` up to where an answer's body would start (`{`, `[`, `<`), with
/// control characters dropped, at most 160 characters. An upstream's body
/// is never echoed to the caller.
pub fn summary(error: &str) -> String {
    let head = error.split(['{', '[', '<']).next().unwrap_or_default();
    let clean: String = head.chars().filter(|c| !c.is_control()).take(160).collect();
    let clean = clean.trim().trim_end_matches(':').trim_end();
    if clean.len() < error.trim().len() {
        format!("{clean} (upstream answer not shown)")
    } else {
        clean.to_owned()
    }
}

/// An upstream answer's body, at most `max` bytes of it (a larger one is
/// an error, never read to its end). The error never carries the URL.
pub async fn read_bounded(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(c) = resp
        .chunk()
        .await
        .map_err(|e| e.without_url().to_string())?
    {
        if body.len() + c.len() > max {
            return Err(format!("the answer is larger than {max} bytes"));
        }
        body.extend_from_slice(&c);
    }
    Ok(body)
}

fn cut(s: &str) -> String {
    s.chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_and_non_http_urls_are_refused() {
        for bad in [
            "http://allowed.example@evil.example/",
            "http://u:p@allowed.example/",
            "ftp://x/",
            "file:///etc/passwd",
            "http://",
            "not a url",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("https://mcp.example.com:8443/mcp").is_ok());
    }

    #[test]
    fn allowlists_match_origins_exactly_and_paths_at_segments() {
        let allowed = vec!["https://mcp.example.com/api".to_owned()];
        let ok = |u: &str| check(u, &allowed, "registry.mcp.allowed_urls").is_ok();
        assert!(ok("https://mcp.example.com/api"));
        assert!(ok("https://mcp.example.com/api/v1"));
        for bad in [
            "https://mcp.example.com/apix",
            "https://mcp.example.com.evil.example/api",
            "https://mcp.example.com@evil.example/api",
            "http://mcp.example.com/api",
            "https://mcp.example.com:444/api",
            "https://evil.example/https://mcp.example.com/api",
        ] {
            assert!(!ok(bad), "{bad}");
        }
        // The default port is the same port.
        assert!(ok("https://mcp.example.com:443/api/x"));
        // Empty: anywhere the ranges allow.
        assert!(check("https://x.example/", &[], "s").is_ok());
    }

    #[test]
    fn private_link_local_and_loopback_ranges_are_refused_unless_allowed() {
        let strict = EgressConfig::default();
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(
                refused_range(ip.parse().unwrap(), &strict).is_some(),
                "{ip}"
            );
        }
        assert!(refused_range("93.184.216.34".parse().unwrap(), &strict).is_none());
        let dev = EgressConfig {
            allow_loopback: Some(true),
            allow_private: false,
        };
        assert!(refused_range("127.0.0.1".parse().unwrap(), &dev).is_none());
        assert!(refused_range("10.0.0.1".parse().unwrap(), &dev).is_some());
    }

    #[tokio::test]
    async fn a_resolved_literal_in_a_refused_range_is_refused_with_the_setting() {
        let u = parse("http://169.254.169.254/latest/meta-data").unwrap();
        let e = resolve_check(&u, &EgressConfig::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("allow_private"), "{e}");
        let u = parse("http://[::1]:9/").unwrap();
        assert!(resolve_check(&u, &EgressConfig::default()).await.is_err());
    }

    #[test]
    fn summaries_never_carry_a_body() {
        let s = summary("unexpected response: {\"secret\":\"s3cr3t\",\"rows\":[1,2]}");
        assert!(!s.contains("s3cr3t") && s.contains("not shown"), "{s}");
        let s = summary("HTTP 500 <html><body>internal page</body></html>");
        assert!(!s.contains("internal page"), "{s}");
        assert_eq!(summary("connection refused"), "connection refused");
        assert!(summary(&"x".repeat(500)).chars().count() < 200);
    }
}
