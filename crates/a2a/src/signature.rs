//! Signed Agent Cards (A2A 1.0). A card's `signatures` are JSON Web
//! Signatures (RFC 7515) with a detached payload: the card itself, without
//! `signatures` and with empty strings, lists and objects left out,
//! serialized by the JSON Canonicalization Scheme (RFC 8785). Each entry is
//! `{protected, signature, header?}`: the base64url protected header (`alg`,
//! `kid`, `jku`, `typ`) and signature of `protected.base64url(payload)`.
//! This is what the `a2a-sdk` signs and checks, and the tests check that
//! both sides agree.
//!
//! [`verify`] says whether a card is unsigned, signed by one of the keys
//! trusted for it, or neither (tampered, or signed by a key not trusted).
//! Only asymmetric algorithms are accepted: a card is public, so an HMAC key
//! that could check it could forge it.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use serde_json::{Map, Value, json};

/// Algorithms a card signature may use.
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::EdDSA,
];

/// What a card's signatures say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It has none.
    Unsigned,
    /// A signature verifies with the trusted key `kid` (empty: the key has
    /// no id).
    Verified {
        /// The verifying key's id.
        kid: String,
    },
    /// It is signed, but no signature verifies with a trusted key: why.
    Invalid(String),
}

/// The card's canonical form: what its signatures sign.
pub fn canonical(card: &Value) -> Result<String, String> {
    let mut card = card.clone();
    if let Some(o) = card.as_object_mut() {
        o.remove("signatures");
    }
    let cleaned = clean(&card, 1)?.unwrap_or(Value::Object(Map::new()));
    switchyard_kit::jcs::canonical(&cleaned)
}

/// `v` without empty strings, lists and objects (recursively; a list or
/// object left empty goes too). `None`: nothing is left.
fn clean(v: &Value, depth: usize) -> Result<Option<Value>, String> {
    if depth > switchyard_kit::jcs::MAX_DEPTH && (v.is_object() || v.is_array()) {
        return Err(format!(
            "the card nests deeper than {} levels",
            switchyard_kit::jcs::MAX_DEPTH
        ));
    }
    Ok(match v {
        Value::String(s) if s.is_empty() => None,
        Value::Array(a) => {
            let mut kept = Vec::with_capacity(a.len());
            for x in a {
                kept.extend(clean(x, depth + 1)?);
            }
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        Value::Object(o) => {
            let mut kept = Map::new();
            for (k, x) in o {
                if let Some(x) = clean(x, depth + 1)? {
                    kept.insert(k.clone(), x);
                }
            }
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        other => Some(other.clone()),
    })
}

/// Keys trusted to sign a card: a JWKS document.
#[derive(Debug, Clone, Default)]
pub struct Keys(Vec<Jwk>);

impl Keys {
    /// Reads a JWKS document (`{"keys": [...]}`); every key must be an
    /// asymmetric public key.
    pub fn parse(jwks: &str) -> Result<Keys, String> {
        let set: JwkSet = serde_json::from_str(jwks).map_err(|e| format!("not a JWKS: {e}"))?;
        if set.keys.is_empty() {
            return Err("the JWKS has no keys".into());
        }
        for k in &set.keys {
            if matches!(
                k.algorithm,
                jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)
            ) {
                return Err(
                    "a symmetric key (kty \"oct\") cannot check a public card: give public keys"
                        .into(),
                );
            }
            DecodingKey::from_jwk(k).map_err(|e| {
                format!(
                    "key {:?}: {e}",
                    k.common.key_id.as_deref().unwrap_or_default()
                )
            })?;
        }
        Ok(Keys(set.keys))
    }

    /// The keys a signature naming `kid` may be checked with.
    fn candidates<'a>(&'a self, kid: Option<&'a str>) -> impl Iterator<Item = &'a Jwk> + 'a {
        self.0
            .iter()
            .filter(move |k| kid.is_none_or(|kid| k.common.key_id.as_deref() == Some(kid)))
    }
}

/// One signature's protected header, as far as Switchyard reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// `alg`.
    pub alg: String,
    /// `kid`, if any.
    pub kid: Option<String>,
    /// `jku`: where the signer's JWKS is, if it says.
    pub jku: Option<String>,
}

/// The protected headers of a card's signatures (unreadable ones left out).
pub fn headers(card: &Value) -> Vec<Header> {
    entries(card)
        .iter()
        .filter_map(|(protected, _)| header(protected).ok())
        .collect()
}

/// `(protected, signature)` of each entry of the card's `signatures`.
fn entries(card: &Value) -> Vec<(String, String)> {
    card.get("signatures")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|s| {
                    let f = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                    (f("protected"), f("signature"))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn header(protected: &str) -> Result<Header, String> {
    let bytes = B64
        .decode(protected.trim_end_matches('='))
        .map_err(|_| "its protected header is not base64url".to_owned())?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|_| "its protected header is not JSON".to_owned())?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    Ok(Header {
        alg: s("alg").ok_or("its protected header names no alg")?,
        kid: s("kid"),
        jku: s("jku"),
    })
}

/// Checks `card`'s signatures against `keys`: verified when at least one
/// signature verifies with a trusted key of a matching type.
pub fn verify(card: &Value, keys: &Keys) -> Verdict {
    let sigs = entries(card);
    if sigs.is_empty() {
        return Verdict::Unsigned;
    }
    let payload = match canonical(card) {
        Ok(p) => B64.encode(p.as_bytes()),
        Err(e) => return Verdict::Invalid(format!("the card has no canonical form: {e}")),
    };
    let mut why = Vec::new();
    for (n, (protected, signature)) in sigs.iter().enumerate() {
        let h = match header(protected) {
            Ok(h) => h,
            Err(e) => {
                why.push(format!("signature {}: {e}", n + 1));
                continue;
            }
        };
        let Some(alg) = ALGORITHMS
            .iter()
            .find(|a| format!("{a:?}") == h.alg)
            .copied()
        else {
            why.push(format!(
                "signature {}: algorithm {:?} is not accepted (use ES256, RS256, PS256, EdDSA or their larger sizes)",
                n + 1,
                h.alg
            ));
            continue;
        };
        let message = format!("{protected}.{payload}");
        let mut tried = false;
        for k in keys.candidates(h.kid.as_deref()) {
            if k.common
                .key_algorithm
                .is_some_and(|ka| format!("{ka:?}") != h.alg)
            {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(k) else {
                continue;
            };
            tried = true;
            if jsonwebtoken::crypto::verify(signature, message.as_bytes(), &key, alg)
                .unwrap_or(false)
            {
                return Verdict::Verified {
                    kid: k.common.key_id.clone().unwrap_or_default(),
                };
            }
        }
        why.push(match (tried, &h.kid) {
            (true, _) => format!(
                "signature {} does not verify: the card was changed after it was signed, or signed by another key",
                n + 1
            ),
            (false, Some(kid)) => format!(
                "signature {} is by key {kid:?}, which is not trusted for this card",
                n + 1
            ),
            (false, None) => format!("signature {}: no trusted key of its kind", n + 1),
        });
    }
    Verdict::Invalid(why.join("; "))
}

/// A key that signs cards: Ed25519 (`EdDSA`), kept as PKCS#8.
pub struct SigningKey {
    encoding: EncodingKey,
    /// The public key, raw (32 bytes).
    public: Vec<u8>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new key, as the PKCS#8 PEM to keep it in.
    pub fn generate_pem() -> Result<String, String> {
        let rng = ring::rand::SystemRandom::new();
        let der = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| "generating an Ed25519 key failed".to_owned())?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .filter_map(|c| std::str::from_utf8(c).ok())
            .collect();
        Ok(format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            lines.join("\n")
        ))
    }

    /// The key in a PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`, Ed25519).
    pub fn from_pem(pem: &str) -> Result<SigningKey, String> {
        let body: String = pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect::<Vec<_>>()
            .concat();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body.trim())
            .map_err(|_| "not a PEM file".to_owned())?;
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(
            |_| "not an Ed25519 private key in PKCS#8 (make one with `openssl genpkey -algorithm ed25519`)"
                .to_owned(),
        )?;
        use ring::signature::KeyPair as _;
        Ok(SigningKey {
            encoding: EncodingKey::from_ed_der(&der),
            public: pair.public_key().as_ref().to_vec(),
        })
    }

    /// The key's id: its RFC 7638 JWK thumbprint.
    pub fn kid(&self) -> String {
        let x = B64.encode(&self.public);
        let members = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
        B64.encode(ring::digest::digest(&ring::digest::SHA256, members.as_bytes()).as_ref())
    }

    /// The JWKS of the public key, to publish.
    pub fn jwks(&self) -> Value {
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": B64.encode(&self.public),
                         "kid": self.kid(), "alg": "EdDSA", "use": "sig"}]})
    }

    /// `card` with its signature (any it had replaced), the protected
    /// header naming this key and `jku`, where its JWKS is published.
    pub fn sign(&self, card: &Value, jku: &str) -> Result<Value, String> {
        let mut card = card.clone();
        let payload = B64.encode(canonical(&card)?.as_bytes());
        let header = json!({"alg": "EdDSA", "typ": "JOSE", "kid": self.kid(), "jku": jku});
        let protected = B64.encode(header.to_string().as_bytes());
        let message = format!("{protected}.{payload}");
        let signature =
            jsonwebtoken::crypto::sign(message.as_bytes(), &self.encoding, Algorithm::EdDSA)
                .map_err(|e| format!("signing the card: {e}"))?;
        if let Some(o) = card.as_object_mut() {
            o.insert(
                "signatures".into(),
                json!([{"protected": protected, "signature": signature}]),
            );
        }
        Ok(card)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::from_pem(&SigningKey::generate_pem().unwrap()).unwrap()
    }

    const CARD: &str = r#"{"name": "Text tricks", "description": "", "version": "1.0.0",
        "capabilities": {"streaming": true, "extensions": []},
        "skills": [{"id": "text.shout", "tags": []}], "iconUrl": ""}"#;

    #[test]
    fn the_canonical_form_drops_signatures_and_empty_values_and_sorts_keys() {
        let mut card: Value = serde_json::from_str(CARD).unwrap();
        card["signatures"] = json!([{"protected": "x", "signature": "y"}]);
        assert_eq!(
            canonical(&card).unwrap(),
            r#"{"capabilities":{"streaming":true},"name":"Text tricks","skills":[{"id":"text.shout"}],"version":"1.0.0"}"#
        );
    }

    #[test]
    fn a_card_signed_here_verifies_with_its_key_and_not_after_a_change_or_with_another_key() {
        let k = key();
        let card: Value = serde_json::from_str(CARD).unwrap();
        let signed = k.sign(&card, "http://h/.well-known/jwks.json").unwrap();
        let keys = Keys::parse(&k.jwks().to_string()).unwrap();
        assert_eq!(verify(&signed, &keys), Verdict::Verified { kid: k.kid() });
        assert_eq!(
            headers(&signed),
            [Header {
                alg: "EdDSA".into(),
                kid: Some(k.kid()),
                jku: Some("http://h/.well-known/jwks.json".into())
            }]
        );
        // Empty values do not change what is signed.
        let mut same = signed.clone();
        same["documentationUrl"] = json!("");
        assert!(matches!(verify(&same, &keys), Verdict::Verified { .. }));

        let mut tampered = signed.clone();
        tampered["skills"][0]["id"] = json!("text.steal");
        let Verdict::Invalid(why) = verify(&tampered, &keys) else {
            panic!("a changed card verified")
        };
        assert!(why.contains("changed after it was signed"), "{why}");

        let other = key();
        let mut theirs = Keys::parse(&other.jwks().to_string()).unwrap();
        let Verdict::Invalid(why) = verify(&signed, &theirs) else {
            panic!("verified by a key that did not sign it")
        };
        assert!(why.contains("not trusted"), "{why}");
        // A key without an id is tried, and does not verify another's
        // signature either.
        theirs.0[0].common.key_id = None;
        assert!(matches!(verify(&signed, &theirs), Verdict::Invalid(_)));
        assert_eq!(verify(&card, &keys), Verdict::Unsigned);
    }

    #[test]
    fn symmetric_keys_and_unaccepted_algorithms_are_refused() {
        let oct = r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}"#;
        assert!(Keys::parse(oct).unwrap_err().contains("symmetric"));
        assert!(Keys::parse(r#"{"keys": []}"#).is_err());
        let k = key();
        let keys = Keys::parse(&k.jwks().to_string()).unwrap();
        let card: Value = serde_json::from_str(CARD).unwrap();
        let mut signed = k.sign(&card, "").unwrap();
        let hs = B64.encode(br#"{"alg":"HS256","kid":"x"}"#);
        signed["signatures"][0]["protected"] = json!(hs);
        let Verdict::Invalid(why) = verify(&signed, &keys) else {
            panic!("an HS256 signature was taken")
        };
        assert!(why.contains("\"HS256\" is not accepted"), "{why}");
        signed["signatures"][0]["protected"] = json!("%%%");
        assert!(matches!(verify(&signed, &keys), Verdict::Invalid(w) if w.contains("base64url")));
    }

    #[test]
    fn a_card_nested_past_the_limit_has_no_canonical_form() {
        let mut v = json!("x");
        for _ in 0..200 {
            v = json!([v]);
        }
        assert!(
            canonical(&json!({"deep": v}))
                .unwrap_err()
                .contains("deeper")
        );
    }
}
