//! Decision receipts: each approval, signed with the deployment's Ed25519
//! key over what was approved — the run, the hashes it binds, the scope
//! granted, who decided and when — so anyone holding the deployment's
//! public key can check it offline, and any change to it shows.
//!
//! The signed bytes are the receipt body in RFC 8785 canonical JSON
//! ([`canonical`]): object keys sorted by their UTF-16 code units, no
//! insignificant whitespace, strings escaped as ECMAScript does, and only
//! integers (a receipt holds no floats, which RFC 8785 would format its
//! own way). The same body always gives the same bytes, whatever order a
//! tool wrote its keys in.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Why a key or a receipt is not good.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReceiptError {
    /// The key material could not be read.
    #[error("receipt key: {0}")]
    Key(String),
    /// The receipt is not well formed.
    #[error("malformed receipt: {0}")]
    Malformed(String),
    /// The signature does not match the body under the key.
    #[error(
        "the signature does not match: the receipt was changed after it was signed, or signed by another key"
    )]
    BadSignature,
    /// Signed by a key other than the one expected.
    #[error("signed by key {got}, not by the expected key {want}")]
    OtherKey {
        /// The receipt's key id.
        got: String,
        /// The expected key's id.
        want: String,
    },
}

/// A signed decision: the body, and the signature over its canonical form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// What was decided (see the approval service for its fields).
    pub receipt: Value,
    /// The signing key's id ([`key_id`] of `public_key`).
    pub key_id: String,
    /// The signing key's Ed25519 public key, base64.
    pub public_key: String,
    /// The Ed25519 signature over `canonical(receipt)`, base64.
    pub signature: String,
}

/// The deployment's signing key.
pub struct ReceiptKey {
    pair: Ed25519KeyPair,
    id: String,
}

impl std::fmt::Debug for ReceiptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private half never reaches a log.
        f.debug_struct("ReceiptKey").field("id", &self.id).finish()
    }
}

impl ReceiptKey {
    /// The key of a 32-byte Ed25519 seed.
    pub fn from_seed(seed: &[u8]) -> Result<ReceiptKey, ReceiptError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed)
            .map_err(|_| ReceiptError::Key("an Ed25519 seed is 32 bytes".into()))?;
        let id = key_id(pair.public_key().as_ref());
        Ok(ReceiptKey { pair, id })
    }

    /// A new random key, with its seed (to keep).
    pub fn generate() -> Result<(ReceiptKey, [u8; 32]), ReceiptError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| ReceiptError::Key(e.to_string()))?;
        Ok((ReceiptKey::from_seed(&seed)?, seed))
    }

    /// The key in `text`: its 32-byte seed in base64 (what `switchyard
    /// approval receipt-key --new` prints, and a Kubernetes Secret holds).
    pub fn parse(text: &str) -> Result<ReceiptKey, ReceiptError> {
        let seed = B64
            .decode(text.trim())
            .map_err(|e| ReceiptError::Key(format!("not base64: {e}")))?;
        ReceiptKey::from_seed(&seed)
    }

    /// `seed` as the text a key file holds (base64; [`ReceiptKey::parse`]
    /// reads it).
    pub fn seed_text(seed: &[u8; 32]) -> String {
        B64.encode(seed)
    }

    /// The key's id: the first 16 hex digits of the public key's SHA-256.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The public key, base64.
    pub fn public_key(&self) -> String {
        B64.encode(self.pair.public_key().as_ref())
    }

    /// Signs `body` (a JSON object of text, integers, flags, lists and
    /// objects).
    pub fn sign(&self, body: Value) -> Receipt {
        let sig = self.pair.sign(canonical(&body).as_bytes());
        Receipt {
            receipt: body,
            key_id: self.id.clone(),
            public_key: self.public_key(),
            signature: B64.encode(sig.as_ref()),
        }
    }
}

/// A public key's id: the first 16 hex digits of its SHA-256.
pub fn key_id(public_key: &[u8]) -> String {
    crate::hex::encode(&Sha256::digest(public_key)[..8])
}

/// The id of `public_key` (base64), when it is base64.
pub fn key_id_of(public_key: &str) -> Option<String> {
    public_key_bytes(public_key).map(|b| key_id(&b))
}

/// Whether `public_key` is an Ed25519 public key in base64 (what
/// `switchyard audit key --new` prints as the public key).
pub fn is_public_key(public_key: &str) -> bool {
    public_key_bytes(public_key).is_some_and(|b| b.len() == 32)
}

/// The bytes of `public_key` (base64), when it is base64.
pub fn public_key_bytes(public_key: &str) -> Option<Vec<u8>> {
    B64.decode(public_key.trim()).ok()
}

/// Checks `r`'s signature under its own public key and, when `expect`
/// (a base64 public key, the deployment's) is given, that it is that key.
pub fn verify(r: &Receipt, expect: Option<&str>) -> Result<(), ReceiptError> {
    let public = B64
        .decode(r.public_key.trim())
        .map_err(|e| ReceiptError::Malformed(format!("public_key is not base64: {e}")))?;
    if key_id(&public) != r.key_id {
        return Err(ReceiptError::Malformed(
            "key_id is not the id of public_key".into(),
        ));
    }
    if let Some(want) = expect {
        let want = B64
            .decode(want.trim())
            .map_err(|e| ReceiptError::Key(format!("the expected key is not base64: {e}")))?;
        if want != public {
            return Err(ReceiptError::OtherKey {
                got: r.key_id.clone(),
                want: key_id(&want),
            });
        }
    }
    let sig = B64
        .decode(r.signature.trim())
        .map_err(|e| ReceiptError::Malformed(format!("signature is not base64: {e}")))?;
    UnparsedPublicKey::new(&ED25519, &public)
        .verify(canonical(&r.receipt).as_bytes(), &sig)
        .map_err(|_| ReceiptError::BadSignature)
}

/// `v` in RFC 8785 canonical form ([`crate::jcs`]). A receipt nests a few
/// levels; one past the limit has no form and verifies against nothing.
pub fn canonical(v: &Value) -> String {
    crate::jcs::canonical(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn canonical_form_sorts_keys_by_utf16_and_drops_whitespace() {
        let a = json!({"b": [1, {"z": true, "a": null}], "a": "x\ny", "\u{20ac}": 1, "\r": 2});
        // RFC 8785's example order: "\r" < "a" < "b" < "€".
        assert_eq!(
            canonical(&a),
            r#"{"\r":2,"a":"x\ny","b":[1,{"a":null,"z":true}],"€":1}"#
        );
        let b: Value =
            serde_json::from_str(r#"{ "€":1, "b":[1,{"a":null, "z":true}], "\r":2, "a":"x\ny" }"#)
                .unwrap_or_default();
        assert_eq!(canonical(&a), canonical(&b), "key order does not matter");
        assert_eq!(canonical(&json!("\u{1f}")), r#""\u001f""#);
    }

    #[test]
    fn a_receipt_verifies_and_any_change_to_it_fails() {
        let (key, seed) = ReceiptKey::generate().expect("a key");
        let r = key.sign(json!({"run_id": "run-1", "approved_by": ["bob"], "decided_at_ms": 7}));
        assert_eq!(verify(&r, None), Ok(()));
        assert_eq!(verify(&r, Some(&key.public_key())), Ok(()));
        // The same seed is the same key: a restart signs the same way.
        let again = ReceiptKey::parse(&B64.encode(seed)).expect("the seed");
        assert_eq!(again.id(), key.id());
        assert_eq!(again.sign(r.receipt.clone()), r, "Ed25519 is deterministic");
        let mut changed = r.clone();
        changed.receipt["approved_by"] = json!(["mallory"]);
        assert_eq!(verify(&changed, None), Err(ReceiptError::BadSignature));
        let mut resigned = r.clone();
        let (other, _) = ReceiptKey::generate().expect("another key");
        resigned = Receipt {
            key_id: other.id().to_owned(),
            public_key: other.public_key(),
            ..other.sign(std::mem::take(&mut resigned.receipt))
        };
        assert_eq!(verify(&resigned, None), Ok(()), "valid under its own key");
        assert!(matches!(
            verify(&resigned, Some(&key.public_key())),
            Err(ReceiptError::OtherKey { .. })
        ));
        let mut swapped = r.clone();
        swapped.public_key = other.public_key();
        assert!(matches!(
            verify(&swapped, None),
            Err(ReceiptError::Malformed(_))
        ));
        swapped.key_id = other.id().to_owned();
        assert_eq!(verify(&swapped, None), Err(ReceiptError::BadSignature));
    }

    #[test]
    fn a_bad_key_is_refused_and_never_printed() {
        assert!(ReceiptKey::parse("not base64!").is_err());
        assert!(ReceiptKey::parse(&B64.encode([1u8; 5])).is_err());
        let key = ReceiptKey::parse(&B64.encode([7u8; 32])).expect("a seed");
        let shown = format!("{key:?}");
        assert!(shown.contains(key.id()) && !shown.contains(&B64.encode([7u8; 32])));
    }
}
