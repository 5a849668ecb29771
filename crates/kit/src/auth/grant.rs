//! Invocation grants: the short-lived, signed capability the executor
//! issues for each agent invocation (and each task a pull worker leases),
//! naming the job, task and agent, the budget the agent may spend on and the
//! most one reservation may hold, until an expiry.
//!
//! A grant is how facts the platform establishes reach the services that
//! must trust them without trusting the agent's claims: the ledger lets an
//! agent key reserve only on the budget its grant names, within its ceiling
//! and before it expires; the executor hangs a child job under a parent only
//! for the parent's submitter or for an agent holding a grant of the
//! parent's running task. The token is `hex(json).hex(hmac-sha256)`, signed
//! with a key every process of one deployment derives from the cluster's
//! service token (or, in one process, makes at random at start-up).

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What an invocation may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The job whose task invoked the agent.
    pub job_id: String,
    /// The task.
    pub task_id: String,
    /// The agent invoked (or the worker that leased the task).
    pub agent_id: String,
    /// The job's tenant.
    pub tenant: String,
    /// The budget the agent may reserve and commit on; empty: none.
    pub budget_id: String,
    /// The most tokens one reservation under this grant may hold.
    pub max_tokens: u64,
    /// When the grant ends, ms since the epoch.
    pub expires_ms: u64,
}

/// Why a grant was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// None was presented.
    #[error(
        "no invocation grant was presented: an agent acts on a job only with the grant its invocation carries (InvocationContext.grant)"
    )]
    Missing,
    /// Not one of ours, or altered.
    #[error(
        "the invocation grant is not valid: it was altered, or issued by another deployment (the processes must share auth.service_token)"
    )]
    Invalid,
    /// Past its expiry.
    #[error("the invocation grant expired; it lasts as long as the invocation it was issued for")]
    Expired,
    /// Valid, but for something else.
    #[error("the invocation grant does not cover this: {0}")]
    Outside(String),
}

/// The key grants are signed with.
#[derive(Clone)]
pub struct GrantKey([u8; 32]);

impl std::fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrantKey(…)")
    }
}

const CONTEXT: &[u8] = b"switchyard invocation grant v1\0";

impl GrantKey {
    /// The key every process holding `secret` (the service token) derives.
    pub fn from_secret(secret: &[u8]) -> Self {
        GrantKey(
            Sha256::new()
                .chain_update(CONTEXT)
                .chain_update(secret)
                .finalize()
                .into(),
        )
    }

    /// A key of this process alone (one process hosts every service).
    pub fn random() -> Self {
        let mut k = [0u8; 32];
        // getrandom fails only without an OS source of randomness, where
        // nothing else here could run either.
        getrandom::fill(&mut k).unwrap_or_else(|e| panic!("no OS randomness: {e}"));
        GrantKey(k)
    }

    /// The signed token of `grant`.
    pub fn sign(&self, grant: &Grant) -> String {
        let body = hex(&serde_json::to_vec(grant).unwrap_or_default());
        let tag = hex(&self.mac(body.as_bytes()));
        format!("{body}.{tag}")
    }

    /// The grant `token` carries, when this key signed it and it has not
    /// expired at `now_ms`.
    pub fn verify(&self, token: &str, now_ms: u64) -> Result<Grant, GrantError> {
        let grant = self.open(token)?;
        if grant.expires_ms <= now_ms {
            return Err(GrantError::Expired);
        }
        Ok(grant)
    }

    /// The grant `token` carries, when this key signed it, expired or not
    /// (settling what was reserved in time stays possible after).
    pub fn open(&self, token: &str) -> Result<Grant, GrantError> {
        if token.is_empty() {
            return Err(GrantError::Missing);
        }
        let (body, tag) = token.split_once('.').ok_or(GrantError::Invalid)?;
        let tag = unhex(tag).ok_or(GrantError::Invalid)?;
        if !same(&tag, &self.mac(body.as_bytes())) {
            return Err(GrantError::Invalid);
        }
        let json = unhex(body).ok_or(GrantError::Invalid)?;
        serde_json::from_slice(&json).map_err(|_| GrantError::Invalid)
    }

    /// HMAC-SHA256 (RFC 2104) of `msg`.
    fn mac(&self, msg: &[u8]) -> [u8; 32] {
        crate::webhook::hmac_sha256(&self.0, msg)
    }
}

static KEY: OnceLock<GrantKey> = OnceLock::new();

/// Sets this process's grant key (once, at start-up; later calls keep the
/// first). Processes of one deployment must install the same key.
pub fn install(key: GrantKey) {
    let _ = KEY.set(key);
}

/// This process's grant key: the installed one, else one made at random
/// for this process (every service in it then shares it).
pub fn key() -> &'static GrantKey {
    KEY.get_or_init(GrantKey::random)
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    crate::hex::encode(bytes)
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    crate::hex::decode(s, 16_384)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            job_id: "j1".into(),
            task_id: "t".into(),
            agent_id: "a".into(),
            tenant: "acme".into(),
            budget_id: "job-j1".into(),
            max_tokens: 500,
            expires_ms: 2_000,
        }
    }

    #[test]
    fn a_signed_grant_verifies_until_it_expires() {
        let k = GrantKey::from_secret(b"token");
        let t = k.sign(&grant());
        assert_eq!(k.verify(&t, 1_999), Ok(grant()));
        assert_eq!(k.verify(&t, 2_000), Err(GrantError::Expired));
        assert_eq!(k.verify("", 0), Err(GrantError::Missing));
    }

    #[test]
    fn an_altered_or_foreign_grant_is_refused() {
        let k = GrantKey::from_secret(b"token");
        let t = k.sign(&grant());
        // Another deployment's key.
        assert_eq!(
            GrantKey::from_secret(b"other").verify(&t, 0),
            Err(GrantError::Invalid)
        );
        // The body changed to name another budget, with the old tag.
        let (_, tag) = t.split_once('.').unwrap();
        let mut other = grant();
        other.budget_id = "org/acme".into();
        let forged = format!("{}.{tag}", hex(&serde_json::to_vec(&other).unwrap()));
        assert_eq!(k.verify(&forged, 0), Err(GrantError::Invalid));
        for junk in ["x", "zz.zz", "00.", ".00", "0.0"] {
            assert_eq!(k.verify(junk, 0), Err(GrantError::Invalid), "{junk}");
        }
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        // RFC 4231 test case 2 uses a 4-byte key; ours pads to 64 bytes the
        // same way, so the 32-byte zero-extended key gives the same MAC.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let mac = GrantKey(key).mac(b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
