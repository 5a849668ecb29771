//! OIDC / JWT bearer tokens against the in-process stack: a JWKS served over
//! HTTP on loopback (counting its fetches), RS256 and ES256 keys generated
//! per test, and every way a token can be wrong.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use switchyard_kit::auth::jwt::OidcConfig;
use switchyard_kit::error::ApiError;
use switchyard_proto::auth::v1::WhoAmIRequest;
use switchyard_proto::auth::v1::auth_service_client::AuthServiceClient;
use switchyard_testkit::Stack;
use tonic::Code;

/// A signing key with its JWK.
struct Signer {
    kid: String,
    alg: Algorithm,
    key: EncodingKey,
    jwk: Jwk,
}

fn signer(kid: &str, alg: Algorithm) -> Signer {
    let kp = match alg {
        Algorithm::RS256 => rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap(),
        _ => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap(),
    };
    let pem = kp.serialize_pem();
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap(),
        _ => EncodingKey::from_ec_pem(pem.as_bytes()).unwrap(),
    };
    let mut jwk = Jwk::from_encoding_key(&key, alg).unwrap();
    jwk.common.key_id = Some(kid.into());
    Signer {
        kid: kid.into(),
        alg,
        key,
        jwk,
    }
}

const ISS: &str = "https://idp.example.test";
const AUD: &str = "switchyard";

fn now() -> u64 {
    switchyard_kit::time::now_ms() / 1000
}

fn claims(extra: Value) -> Value {
    let mut c = json!({
        "iss": ISS, "aud": AUD, "sub": "erin@example.test", "tenant": "acme",
        "groups": ["switchyard-approver", "staff"], "exp": now() + 600, "iat": now(),
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn token(s: &Signer, claims: &Value) -> String {
    let mut h = Header::new(s.alg);
    h.kid = Some(s.kid.clone());
    jsonwebtoken::encode(&h, claims, &s.key).unwrap()
}

/// A JWKS endpoint on 127.0.0.1:0 whose key set the test can change.
struct Idp {
    url: String,
    keys: Arc<Mutex<Vec<Jwk>>>,
    fetches: Arc<AtomicUsize>,
    _server: tokio::task::JoinHandle<()>,
}

async fn idp(keys: Vec<Jwk>) -> Idp {
    let shared = Arc::new(Mutex::new(keys));
    let fetches = Arc::new(AtomicUsize::new(0));
    let (k, f) = (shared.clone(), fetches.clone());
    let app = axum::Router::new().route(
        "/jwks",
        axum::routing::get(move || {
            let (k, f) = (k.clone(), f.clone());
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                axum::Json(JwkSet {
                    keys: k.lock().unwrap().clone(),
                })
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Idp {
        url,
        keys: shared,
        fetches,
        _server: server,
    }
}

async fn stack(jwks_url: &str, refetch_ms: u64) -> Stack {
    let oidc = OidcConfig {
        issuer: ISS.into(),
        audience: AUD.into(),
        jwks_url: Some(jwks_url.into()),
        roles_claim: "groups".into(),
        role_prefix: "switchyard-".into(),
        refetch_interval_ms: refetch_ms,
        ..Default::default()
    };
    Stack::start_with(switchyard_cli::ServiceKind::ALL, move |c| {
        c.auth.oidc = Some(oidc)
    })
    .await
    .unwrap()
}

async fn who(
    s: &Stack,
    token: &str,
) -> Result<switchyard_proto::auth::v1::WhoAmIResponse, (Code, String)> {
    AuthServiceClient::new(s.channel_with(token).await.unwrap())
        .who_am_i(WhoAmIRequest {})
        .await
        .map(|r| r.into_inner())
        .map_err(|e| {
            let code = e.code();
            (code, ApiError::from(e).reason.unwrap_or_default())
        })
}

const INVALID: (Code, &str) = (Code::Unauthenticated, "AUTH_INVALID");

fn is(r: Result<switchyard_proto::auth::v1::WhoAmIResponse, (Code, String)>, want: (Code, &str)) {
    match r {
        Err((code, reason)) => assert_eq!((code, reason.as_str()), want),
        Ok(w) => panic!("accepted: {w:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_rs256_and_es256_tokens_map_claims_to_a_principal() {
    let rsa = signer("rsa-1", Algorithm::RS256);
    let ec = signer("ec-1", Algorithm::ES256);
    let idp = idp(vec![rsa.jwk.clone(), ec.jwk.clone()]).await;
    let s = stack(&idp.url, 60_000).await;
    for signer in [&rsa, &ec] {
        let me = who(&s, &token(signer, &claims(json!({})))).await.unwrap();
        assert_eq!(me.subject, "erin@example.test");
        assert_eq!(me.tenant, "acme");
        assert_eq!(
            me.roles,
            ["approver"],
            "prefix stripped, other groups ignored"
        );
        assert_eq!(me.method, "jwt");
    }
    // A token cannot grant itself service roles.
    let t = token(
        &rsa,
        &claims(json!({"groups": ["switchyard-service", "switchyard-impersonate"]})),
    );
    assert!(who(&s, &t).await.unwrap().roles.is_empty());
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_wrong_audience_wrong_issuer_early_tampered_and_unsigned_tokens_are_refused() {
    let rsa = signer("rsa-1", Algorithm::RS256);
    let idp = idp(vec![rsa.jwk.clone()]).await;
    let s = stack(&idp.url, 60_000).await;
    let expired = token(
        &rsa,
        &claims(json!({"exp": now() - 3600, "iat": now() - 7200})),
    );
    is(
        who(&s, &expired).await,
        (Code::Unauthenticated, "AUTH_EXPIRED"),
    );
    is(
        who(&s, &token(&rsa, &claims(json!({"aud": "someone-else"})))).await,
        INVALID,
    );
    is(
        who(
            &s,
            &token(&rsa, &claims(json!({"iss": "https://evil.test"}))),
        )
        .await,
        INVALID,
    );
    is(
        who(&s, &token(&rsa, &claims(json!({"nbf": now() + 3600})))).await,
        INVALID,
    );
    is(
        who(&s, &token(&rsa, &claims(json!({"tenant": "Not A Tenant"})))).await,
        INVALID,
    );

    // Tampered: the payload changed after signing (a different subject).
    let good = token(&rsa, &claims(json!({})));
    let parts: Vec<&str> = good.split('.').collect();
    let evil_payload = {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&claims(json!({"sub": "mallory"}))).unwrap())
    };
    is(
        who(&s, &format!("{}.{evil_payload}.{}", parts[0], parts[2])).await,
        INVALID,
    );
    // A flipped signature byte.
    let mut sig = parts[2].to_owned();
    let flip = if sig.ends_with('A') { 'B' } else { 'A' };
    sig.pop();
    sig.push(flip);
    is(
        who(&s, &format!("{}.{}.{sig}", parts[0], parts[1])).await,
        INVALID,
    );
    // alg: none, unsigned.
    let none_header = {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"alg":"none","typ":"JWT","kid":"rsa-1"}"#)
    };
    is(
        who(&s, &format!("{none_header}.{}.", parts[1])).await,
        INVALID,
    );
    // HS256 signed with the public modulus as a secret (key confusion).
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some("rsa-1".into());
    let hs = jsonwebtoken::encode(&h, &claims(json!({})), &EncodingKey::from_secret(b"n")).unwrap();
    is(who(&s, &hs).await, INVALID);
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_kid_refetches_the_jwks_at_most_once_per_interval() {
    let old = signer("k-old", Algorithm::RS256);
    let idp = idp(vec![old.jwk.clone()]).await;
    let s = stack(&idp.url, 60_000).await;
    who(&s, &token(&old, &claims(json!({})))).await.unwrap();
    let fetched = idp.fetches.load(Ordering::SeqCst);
    assert_eq!(fetched, 1, "one fetch on first use");
    // Verified tokens are cached: no fetch, no re-verification per call.
    who(&s, &token(&old, &claims(json!({})))).await.unwrap();
    assert_eq!(idp.fetches.load(Ordering::SeqCst), 1);
    s.stop().await.unwrap();

    // Key rotation: a fresh stack whose refetch interval has passed.
    let s = stack(&idp.url, 0).await;
    who(&s, &token(&old, &claims(json!({})))).await.unwrap();
    let new = signer("k-new", Algorithm::ES256);
    idp.keys.lock().unwrap().push(new.jwk.clone());
    let before = idp.fetches.load(Ordering::SeqCst);
    let me = who(&s, &token(&new, &claims(json!({"sub": "rotated"}))))
        .await
        .unwrap();
    assert_eq!(me.subject, "rotated");
    assert_eq!(
        idp.fetches.load(Ordering::SeqCst),
        before + 1,
        "refetched for the new kid"
    );
    s.stop().await.unwrap();

    // Within the interval, a flood of unknown kids costs no fetch.
    let s = stack(&idp.url, 60_000).await;
    who(&s, &token(&old, &claims(json!({})))).await.unwrap();
    let before = idp.fetches.load(Ordering::SeqCst);
    for i in 0..20 {
        let forged = signer(&format!("forged-{i}"), Algorithm::ES256);
        is(who(&s, &token(&forged, &claims(json!({})))).await, INVALID);
    }
    assert_eq!(idp.fetches.load(Ordering::SeqCst), before, "rate-limited");
    s.stop().await.unwrap();
}

/// A stand-in OpenID provider on 127.0.0.1:0 for the console's sign-in: a
/// discovery document, an authorization endpoint that signs erin in at
/// once, a token endpoint that checks the code, the redirect URI, the
/// client and the PKCE verifier (S256) as RFC 7636 says, and the JWKS.
struct Provider {
    issuer: String,
    /// Make the next ID tokens carry another sign-in's nonce.
    wrong_nonce: Arc<std::sync::atomic::AtomicBool>,
    _server: tokio::task::JoinHandle<()>,
}

/// An authorization the stand-in handed out: (client, redirect, challenge, nonce).
type Grants = Arc<Mutex<std::collections::HashMap<String, (String, String, String, String)>>>;

async fn provider(signer: Signer) -> Provider {
    let signer = Arc::new(signer);
    use axum::extract::{Form, Query};
    use base64::Engine as _;
    use sha2::Digest as _;
    use std::collections::HashMap;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let grants: Grants = Arc::default();
    let wrong_nonce = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (g1, g2, iss, wrong) = (grants.clone(), grants, issuer.clone(), wrong_nonce.clone());
    let jwks = JwkSet {
        keys: vec![signer.jwk.clone()],
    };
    let discovery = json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/authorize"),
        "token_endpoint": format!("{issuer}/token"),
        "jwks_uri": format!("{issuer}/jwks"),
    });
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || {
                let d = discovery.clone();
                async move { axum::Json(d) }
            }),
        )
        .route(
            "/jwks",
            axum::routing::get(move || {
                let k = jwks.clone();
                async move { axum::Json(k) }
            }),
        )
        .route(
            "/authorize",
            axum::routing::get(move |Query(q): Query<HashMap<String, String>>| {
                let g1 = g1.clone();
                async move {
                assert_eq!(q["response_type"], "code");
                assert_eq!(q["code_challenge_method"], "S256");
                assert!(q["scope"].split(' ').any(|s| s == "openid"), "{q:?}");
                let code = format!("code-{}", g1.lock().unwrap().len());
                g1.lock().unwrap().insert(
                    code.clone(),
                    (
                        q["client_id"].clone(),
                        q["redirect_uri"].clone(),
                        q["code_challenge"].clone(),
                        q["nonce"].clone(),
                    ),
                );
                let to = format!("{}?code={code}&state={}", q["redirect_uri"], q["state"]);
                (http::StatusCode::FOUND, [(http::header::LOCATION, to)])
                }
            }),
        )
        .route(
            "/token",
            axum::routing::post(move |Form(f): Form<HashMap<String, String>>| {
                let (g2, wrong, iss, signer) = (g2.clone(), wrong.clone(), iss.clone(), signer.clone());
                async move {
                let bad = |e: &str| {
                    (
                        http::StatusCode::BAD_REQUEST,
                        axum::Json(json!({"error": e})),
                    )
                };
                // A code is good once.
                let Some((client, redirect, challenge, nonce)) =
                    g2.lock().unwrap().remove(&f["code"])
                else {
                    return bad("invalid_grant");
                };
                let verifier = f.get("code_verifier").cloned().unwrap_or_default();
                let s256 = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(sha2::Sha256::digest(verifier.as_bytes()));
                if f["grant_type"] != "authorization_code"
                    || f["client_id"] != client
                    || f["redirect_uri"] != redirect
                    || s256 != challenge
                {
                    return bad("invalid_request");
                }
                let nonce = if wrong.load(Ordering::SeqCst) {
                    "another-sign-in".to_owned()
                } else {
                    nonce
                };
                let id = token(
                    &signer,
                    &claims(json!({"iss": iss, "aud": client, "nonce": nonce})),
                );
                (
                    http::StatusCode::OK,
                    axum::Json(json!({"access_token": "opaque-at", "token_type": "Bearer", "id_token": id})),
                )
                }
            }),
        );
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Provider {
        issuer,
        wrong_nonce,
        _server: server,
    }
}

/// A response's `Set-Cookie` value for `name`, if it sets one.
fn set_cookie(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(str::to_owned)
}

/// `GET url` sending `cookie`.
async fn get_with(c: &reqwest::Client, url: &str, cookie: &str) -> reqwest::Response {
    c.get(url).header("cookie", cookie).send().await.unwrap()
}

/// `name=value` of a `Set-Cookie` header.
fn pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_to_the_console_through_the_identity_provider_with_pkce() {
    switchyard_kit::tls::install_crypto();
    let p = provider(signer("rsa-c", Algorithm::RS256)).await;
    let oidc = OidcConfig {
        issuer: p.issuer.clone(),
        audience: AUD.into(),
        jwks_url: Some(format!("{}/jwks", p.issuer)),
        roles_claim: "groups".into(),
        role_prefix: "switchyard-".into(),
        ..Default::default()
    };
    let s = Stack::start_with(switchyard_cli::ServiceKind::ALL, move |c| {
        c.auth.oidc = Some(oidc);
        c.gateway.console.oidc.client_id = AUD.into();
    })
    .await
    .unwrap();
    let base = format!("http://{}", s.http.unwrap());
    let c = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = c.get(format!("{base}/ui/sign-in")).send().await.unwrap();
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("Sign in with your identity provider")
    );

    // One sign-in: console → provider → callback, the browser's part by hand.
    let start = |next: &'static str| {
        let c = c.clone();
        let base = base.clone();
        async move {
            let resp = c
                .get(format!("{base}/ui/sign-in/oidc?next={next}"))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 303);
            let flow = set_cookie(&resp, "sy_oidc").expect("the flow's cookie");
            assert!(
                flow.contains("SameSite=Lax") && flow.contains("HttpOnly"),
                "{flow}"
            );
            let to = resp.headers()["location"].to_str().unwrap().to_owned();
            let back = c.get(&to).send().await.unwrap();
            assert_eq!(back.status().as_u16(), 302, "{to}");
            let callback = back.headers()["location"].to_str().unwrap().to_owned();
            (pair(&flow), callback)
        }
    };
    let (flow, callback) = start("%2Fui%2Fjobs").await;
    assert!(
        callback.starts_with(&format!("{base}/ui/oidc/callback?code=")),
        "{callback}"
    );
    let done = get_with(&c, &callback, &flow).await;
    assert_eq!(done.status().as_u16(), 200);
    let session = set_cookie(&done, "sy_session").expect("a session");
    assert!(
        session.contains("SameSite=Strict") && session.contains("HttpOnly"),
        "{session}"
    );
    let page = done.text().await.unwrap();
    assert!(
        page.contains("Signed in as <strong>erin@example.test</strong>"),
        "{page}"
    );
    // On to the page asked for (HTML-escaped: `&#x2f;` is `/`).
    assert!(
        page.contains(r#"content="0; url=&#x2f;ui&#x2f;jobs""#),
        "{page}"
    );
    let jobs = get_with(&c, &format!("{base}/ui/jobs"), &pair(&session)).await;
    assert_eq!(jobs.status().as_u16(), 200);
    let jobs = jobs.text().await.unwrap();
    assert!(
        jobs.contains("erin@example.test <span class=\"muted\">(approver · acme)"),
        "{jobs}"
    );
    // The cookie carries a server-side session, not the provider's token,
    // and signing out ends it on the server.
    let cookie = pair(&session);
    let secret = cookie.trim_start_matches("sy_session=").to_owned();
    assert!(
        secret.starts_with("syk_") && !secret.contains('.'),
        "{cookie}"
    );
    let out = c
        .post(format!("{base}/ui/sign-out"))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "csrf={}",
            switchyard_gateway::console::session::csrf_token(&secret)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(out.status().as_u16(), 303);
    let after = get_with(&c, &format!("{base}/ui/jobs"), &cookie).await;
    assert_eq!(
        after.status().as_u16(),
        303,
        "an ended session reads nothing"
    );

    // The same code again: the provider refuses it, no session.
    let again = get_with(&c, &callback, &flow).await;
    assert_eq!(again.status().as_u16(), 502);
    assert!(set_cookie(&again, "sy_session").is_none());
    assert!(again.text().await.unwrap().contains("invalid_grant"));

    // A callback this browser did not start (another state, or no flow
    // cookie: a link an attacker sent) signs no one in.
    let (flow, callback) = start("%2Fui%2F").await;
    let forged = callback.replace("state=", "state=x");
    for (url, cookie) in [(&forged, flow.as_str()), (&callback, "")] {
        let resp = get_with(&c, url, cookie).await;
        assert_eq!(resp.status().as_u16(), 400, "{url}");
        assert!(set_cookie(&resp, "sy_session").is_none());
        assert!(resp.text().await.unwrap().contains("was not started here"));
    }

    // An ID token minted for another sign-in (its nonce) is not accepted.
    p.wrong_nonce.store(true, Ordering::SeqCst);
    let (flow, callback) = start("%2Fui%2F").await;
    let resp = get_with(&c, &callback, &flow).await;
    assert_eq!(resp.status().as_u16(), 401);
    assert!(set_cookie(&resp, "sy_session").is_none());
    assert!(resp.text().await.unwrap().contains("nonce"));
    s.stop().await.unwrap();
}
