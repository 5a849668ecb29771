//! Switchyard API keys as a verifier holds them: SHA-256 of the token →
//! binding (subject, tenant, roles, kind, expiry, revocation). The secret is
//! 256 random bits, so one SHA-256 is enough (no password stretching), and
//! verification is one hash and one map lookup. The set is shared: the auth
//! service updates it in place in its own process, and other processes
//! replace it from `WatchKeys`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

use super::{AuthError, Kind, Method, Principal, Roles};
use crate::hex::encode as hex;

/// Prefix of every API key token.
pub const TOKEN_PREFIX: &str = "syk_";

/// What a key authenticates as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Key id (`key-…`).
    pub key_id: String,
    /// Subject.
    pub subject: String,
    /// Tenant.
    pub tenant: String,
    /// Roles.
    pub roles: Roles,
    /// Kind.
    pub kind: Kind,
    /// Expiry, ms since the epoch; `None`: never.
    pub expires_at_ms: Option<u64>,
    /// Revoked.
    pub revoked: bool,
    /// A session (`StartSession`), not a key.
    pub session: bool,
}

/// A new key's token and its id: `syk_<12 hex id>_<64 hex secret>`.
#[derive(Clone)]
pub struct NewToken {
    /// `key-<12 hex>`.
    pub key_id: String,
    /// The bearer token; shown once.
    pub token: String,
}

impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewToken")
            .field("key_id", &self.key_id)
            .field("token", &"[redacted]")
            .finish()
    }
}

/// Makes a token from the operating system's random source.
pub fn generate() -> Result<NewToken, std::io::Error> {
    let mut id = [0u8; 6];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id).map_err(std::io::Error::other)?;
    getrandom::fill(&mut secret).map_err(std::io::Error::other)?;
    let id = hex(&id);
    Ok(NewToken {
        key_id: format!("key-{id}"),
        token: format!("{TOKEN_PREFIX}{id}_{}", hex(&secret)),
    })
}

/// SHA-256 of a token: the only form stored.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The shared verification set.
#[derive(Debug, Clone)]
pub struct KeySet(Arc<RwLock<Loaded>>);

#[derive(Debug)]
struct Loaded {
    /// Each binding with the principal it authenticates as, built once.
    keys: HashMap<[u8; 32], (Binding, Arc<Principal>)>,
    /// False until a follower has its first snapshot: keys then answer
    /// UNAVAILABLE rather than "invalid".
    ready: bool,
}

impl Default for KeySet {
    fn default() -> Self {
        KeySet::with_readiness(true)
    }
}

impl KeySet {
    /// An empty set that is not ready until its first [`KeySet::replace`]
    /// (a process following another's key set).
    pub fn pending() -> KeySet {
        KeySet::with_readiness(false)
    }

    fn with_readiness(ready: bool) -> KeySet {
        KeySet(Arc::new(RwLock::new(Loaded {
            keys: HashMap::new(),
            ready,
        })))
    }

    /// Adds or replaces one key.
    pub fn upsert(&self, token_sha256: [u8; 32], binding: Binding) {
        let p = principal_of(&binding);
        self.write().keys.insert(token_sha256, (binding, p));
    }

    /// Replaces the whole set (a `WatchKeys` snapshot) and marks it ready.
    pub fn replace(&self, all: HashMap<[u8; 32], Binding>) {
        let keys = all
            .into_iter()
            .map(|(h, b)| {
                let p = principal_of(&b);
                (h, (b, p))
            })
            .collect();
        let mut w = self.write();
        w.keys = keys;
        w.ready = true;
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|p| p.into_inner()).keys.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Loaded> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The principal of `token` at `now_ms`: unknown and revoked keys are
    /// [`AuthError::Invalid`] alike (nothing that helps guessing), expired
    /// ones [`AuthError::Expired`].
    pub fn verify(&self, token: &str, now_ms: u64) -> Result<Arc<Principal>, AuthError> {
        self.verify_hash(&hash(token), now_ms)
    }

    /// [`KeySet::verify`] for a token already hashed.
    pub fn verify_hash(&self, h: &[u8; 32], now_ms: u64) -> Result<Arc<Principal>, AuthError> {
        let set = self.0.read().unwrap_or_else(|p| p.into_inner());
        if !set.ready {
            return Err(AuthError::KeysUnavailable);
        }
        let (b, p) = set.keys.get(h).ok_or(AuthError::Invalid)?;
        if b.revoked {
            return Err(AuthError::Invalid);
        }
        if b.expires_at_ms.is_some_and(|e| now_ms >= e) {
            return Err(AuthError::Expired);
        }
        Ok(p.clone())
    }
}

fn principal_of(b: &Binding) -> Arc<Principal> {
    Arc::new(Principal {
        subject: b.subject.clone(),
        tenant: b.tenant.clone(),
        roles: b.roles,
        kind: b.kind,
        method: if b.session {
            Method::Session
        } else {
            Method::ApiKey
        },
        on_behalf_of: None,
        credential_id: Some(b.key_id.clone()),
        expires_at_ms: b.expires_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    fn binding(revoked: bool, expires_at_ms: Option<u64>) -> Binding {
        Binding {
            key_id: "key-1".into(),
            subject: "alice".into(),
            tenant: "acme".into(),
            roles: Roles::of(&[Role::Submitter]),
            kind: Kind::Human,
            expires_at_ms,
            revoked,
            session: false,
        }
    }

    #[test]
    fn tokens_are_random_and_verify_only_by_their_hash() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a.token, b.token);
        assert!(a.token.starts_with("syk_") && a.token.len() == 4 + 12 + 1 + 64);
        assert!(
            !format!("{a:?}").contains(&a.token[20..]),
            "Debug hides the secret"
        );
        let set = KeySet::default();
        set.upsert(hash(&a.token), binding(false, None));
        assert_eq!(set.verify(&a.token, 0).unwrap().subject, "alice");
        assert_eq!(set.verify(&b.token, 0), Err(AuthError::Invalid));
        let mut tampered = a.token.clone();
        tampered.pop();
        tampered.push('x');
        assert_eq!(set.verify(&tampered, 0), Err(AuthError::Invalid));
    }

    #[test]
    fn a_follower_without_its_first_snapshot_is_unavailable_not_invalid() {
        let set = KeySet::pending();
        assert_eq!(set.verify("syk_x", 0), Err(AuthError::KeysUnavailable));
        set.replace(HashMap::new());
        assert_eq!(set.verify("syk_x", 0), Err(AuthError::Invalid));
    }

    #[test]
    fn revoked_keys_are_invalid_and_expired_keys_expired() {
        let set = KeySet::default();
        set.upsert(hash("r"), binding(true, None));
        set.upsert(hash("e"), binding(false, Some(1_000)));
        assert_eq!(set.verify("r", 0), Err(AuthError::Invalid));
        assert!(set.verify("e", 999).is_ok());
        assert_eq!(set.verify("e", 1_000), Err(AuthError::Expired));
    }
}
