//! The console's session: the credential a person pasted once, kept in an
//! `HttpOnly`, `SameSite=Strict` cookie, and the anti-forgery token every
//! state-changing form carries.
//!
//! Nothing is stored on the server: the cookie holds the credential and
//! every request authenticates it as a bearer token would be, so any
//! gateway replica serves any session, and revoking the key (or the OIDC
//! token expiring) ends the session at once. The anti-forgery token is a
//! one-way digest of the credential: a page of the session shows it, a
//! page elsewhere cannot compute it, and it reveals nothing of the key.
//! Signing in has no session yet, so its form is bound to a random
//! pre-session cookie instead (a forged sign-in would otherwise log a
//! person into someone else's account).

use sha2::{Digest, Sha256};

/// The session cookie: the pasted credential.
pub const SESSION_COOKIE: &str = "sy_session";
/// The pre-session cookie binding the sign-in form.
pub const SIGN_IN_COOKIE: &str = "sy_sign_in";
/// The form field (and `x-csrf-token` header) of the anti-forgery token.
pub const CSRF_FIELD: &str = "csrf";

/// The value of cookie `name` in `headers` (every `Cookie` header, each
/// `a=b; c=d`), if present and non-empty.
pub fn cookie<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The anti-forgery token of a session holding `credential`.
pub fn csrf_token(credential: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"switchyard console csrf v1\0");
    h.update(credential.as_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `presented` is `expected`, compared in constant time.
pub fn same(presented: &str, expected: &str) -> bool {
    presented.len() == expected.len()
        && presented
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// A new random pre-session value.
pub fn nonce() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    Ok(b.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether a credential can be kept in a cookie: a bearer token's
/// characters (API keys and JWTs), nothing that would end or split the
/// cookie, bounded so the browser keeps it.
pub fn cookie_safe(credential: &str) -> bool {
    !credential.is_empty()
        && credential.len() <= 3800
        && credential
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
}

/// A `Set-Cookie` value: `name=value` for the console's paths, never
/// readable by scripts, never sent by another site; `secure` adds `Secure`
/// (deployments behind TLS). `max_age_secs` 0 deletes it.
pub fn set_cookie(name: &str, value: &str, max_age_secs: u64, secure: bool) -> String {
    cookie_with(name, value, max_age_secs, secure, "Strict")
}

/// [`set_cookie`] sent on a top-level navigation from another site too
/// (`SameSite=Lax`): only for the identity provider's redirect back.
pub fn set_lax_cookie(name: &str, value: &str, max_age_secs: u64, secure: bool) -> String {
    cookie_with(name, value, max_age_secs, secure, "Lax")
}

fn cookie_with(
    name: &str,
    value: &str,
    max_age_secs: u64,
    secure: bool,
    same_site: &str,
) -> String {
    format!(
        "{name}={value}; Path=/ui; HttpOnly; SameSite={same_site}; Max-Age={max_age_secs}{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Whether the browser says the request comes from another origin. A
/// browser that sends `Sec-Fetch-Site` is believed (`same-origin`, or
/// `none` for what the person typed, is ours; `same-site` and `cross-site`
/// are not); without it, an `Origin` whose host is not the request's
/// `Host` (or an opaque `null` one) is. Requests with neither (curl, old
/// browsers) leave the anti-forgery token as the check.
pub fn cross_site(headers: &http::HeaderMap) -> bool {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    match (get("origin"), get("host")) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => {
            let origin_host = origin
                .split_once("://")
                .map_or(origin, |(_, rest)| rest)
                .trim_end_matches('/');
            !origin_host.eq_ignore_ascii_case(host)
        }
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// A `next` path to return to after signing in: only a console path of
/// this site (never `//elsewhere` or a scheme), else the front page.
pub fn next_path(next: Option<&str>) -> &str {
    match next {
        Some(p)
            if p.starts_with("/ui/")
                && !p.starts_with("/ui//")
                && !p.contains(['\\', '\r', '\n'])
                && p.len() <= 1024 =>
        {
            p
        }
        _ => "/ui/",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    http::HeaderValue::from_str(v).expect("value"),
                )
            })
            .collect()
    }

    #[test]
    fn cookies_are_found_by_exact_name_across_headers() {
        let mut h = headers(&[("cookie", "a=1; sy_session_x=2")]);
        h.append(
            http::header::COOKIE,
            http::HeaderValue::from_static("sy_session=tok; b=3"),
        );
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("tok"));
        assert_eq!(cookie(&h, "a"), Some("1"));
        assert_eq!(cookie(&h, "missing"), None);
        assert_eq!(
            cookie(&headers(&[("cookie", "sy_session=")]), SESSION_COOKIE),
            None
        );
    }

    #[test]
    fn the_csrf_token_is_bound_to_the_credential_and_reveals_nothing_of_it() {
        let a = csrf_token("sy_key_alice_secret");
        assert_eq!(a, csrf_token("sy_key_alice_secret"));
        assert_ne!(a, csrf_token("sy_key_bob_secret"));
        assert_eq!(a.len(), 32);
        assert!(!a.contains("alice"));
        assert!(same(&a, &a.clone()));
        assert!(!same(&a, &csrf_token("other")));
        assert!(!same(&a, &a[..31]));
        assert!(!same("", &a));
    }

    #[test]
    fn only_bearer_token_characters_can_be_kept_in_the_cookie() {
        assert!(cookie_safe("sy_live_0123.abc-_~+/="));
        for bad in ["", "a;b", "a b", "a\r\nSet-Cookie: x", "a,b", "\"q\""] {
            assert!(!cookie_safe(bad), "{bad:?}");
        }
        assert!(!cookie_safe(&"a".repeat(4000)));
    }

    #[test]
    fn session_cookies_are_http_only_strict_and_scoped_to_the_console() {
        let c = set_cookie(SESSION_COOKIE, "tok", 3600, false);
        assert_eq!(
            c,
            "sy_session=tok; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=3600"
        );
        assert!(set_cookie(SESSION_COOKIE, "", 0, true).ends_with("Max-Age=0; Secure"));
    }

    #[test]
    fn a_post_from_another_site_is_recognised() {
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(cross_site(&headers(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:7680")
        ])));
        assert!(cross_site(&headers(&[("origin", "null"), ("host", "h")])));
        assert!(!cross_site(&headers(&[
            ("origin", "http://127.0.0.1:7680"),
            ("host", "127.0.0.1:7680")
        ])));
        // The browser's own word wins over an opaque origin (a page with
        // `Referrer-Policy: no-referrer` posts with `Origin: null`).
        assert!(!cross_site(&headers(&[
            ("origin", "null"),
            ("host", "h"),
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!cross_site(&headers(&[("host", "h")])));
    }

    #[test]
    fn sign_in_returns_only_to_console_paths_of_this_site() {
        assert_eq!(
            next_path(Some("/ui/jobs?state=active")),
            "/ui/jobs?state=active"
        );
        for bad in [
            None,
            Some("https://evil.example/ui/"),
            Some("//evil.example/ui/"),
            Some("/ui//evil.example"),
            Some("/uix"),
            Some("/ui/\r\nx"),
        ] {
            assert_eq!(next_path(bad), "/ui/", "{bad:?}");
        }
    }
}
