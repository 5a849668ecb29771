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
