//! The dev credentials file: `switchyard dev` creates the tenant `default`
//! with an admin and two demo people, alice (submitter) and bob (approver),
//! plus an agent identity for the node's own declarative agents, and keeps
//! their tokens in `<data dir>/credentials.json`, mode 0600. The CLI reads it
//! to pick `--as NAME` when talking to a local dev server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use switchyard_proto::auth::v1::{CreateKeyRequest, PrincipalKind};

use crate::{Auth, AuthError, Creator};

/// File name inside the data directory.
pub const FILE: &str = "credentials.json";

/// Tenant the dev principals belong to.
pub const DEV_TENANT: &str = "default";

/// One principal's credential.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Key id (to revoke it).
    pub key_id: String,
    /// Roles.
    pub roles: Vec<String>,
    /// The bearer token.
    pub token: String,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("key_id", &self.key_id)
            .field("roles", &self.roles)
            .finish_non_exhaustive()
    }
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// Tenant of every principal in the file.
    pub tenant: String,
    /// Principals by name (`admin`, `alice`, `bob`, `agents`).
    pub principals: BTreeMap<String, Entry>,
}

/// The demo principals: name, roles, kind, what for.
const DEV: [(&str, &[&str], PrincipalKind, &str); 4] = [
    (
        "admin",
        &["admin"],
        PrincipalKind::Human,
        "dev admin: budgets, keys, agents",
    ),
    (
        "alice",
        &["submitter"],
        PrincipalKind::Human,
        "demo submitter",
    ),
    ("bob", &["approver"], PrincipalKind::Human, "demo approver"),
    (
        "agents",
        &["agent"],
        PrincipalKind::Agent,
        "the dev node's declarative agents",
    ),
];

impl Credentials {
    /// Reads a credentials file.
    pub fn read(path: &Path) -> Result<Credentials, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
    }

    /// The token of `name`.
    pub fn token(&self, name: &str) -> Option<&str> {
        self.principals.get(name).map(|e| e.token.as_str())
    }

    /// Writes the file with mode 0600 (created so; never world-readable).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        switchyard_kit::fs::write_private(path, text.as_bytes())
    }
}

impl Auth {
    /// Makes sure the dev principals exist and their tokens are in
    /// `<data_dir>/credentials.json`; returns the file's path. A file whose
    /// tokens no longer verify (the key store was reset) is made anew.
    pub async fn bootstrap_dev(&self, data_dir: &Path) -> Result<PathBuf, AuthError> {
        let path = data_dir.join(FILE);
        if let Ok(existing) = Credentials::read(&path) {
            let now = switchyard_kit::time::now_ms();
            let all_valid = DEV.iter().all(|(name, ..)| {
                existing
                    .token(name)
                    .is_some_and(|t| self.inner.set.verify(t, now).is_ok())
            });
            if all_valid {
                return Ok(path);
            }
        }
        let creator = Creator {
            subject: "bootstrap".into(),
            tenant: DEV_TENANT.into(),
        };
        let mut principals = BTreeMap::new();
        for (name, roles, kind, what) in DEV {
            let made = self
                .create(
                    &creator,
                    CreateKeyRequest {
                        subject: name.into(),
                        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
                        kind: kind as i32,
                        description: what.into(),
                        ttl_secs: 0,
                        tenant: String::new(),
                    },
                )
                .await?;
            let key = made.key.unwrap_or_default();
            principals.insert(
                name.to_owned(),
                Entry {
                    key_id: key.key_id,
                    roles: key.roles,
                    token: made.secret,
                },
            );
        }
        Credentials {
            tenant: DEV_TENANT.into(),
            principals,
        }
        .write(&path)
        .map_err(|e| {
            AuthError::Storage(switchyard_store::StoreError::Io(format!(
                "writing {}: {e}",
                path.display()
            )))
        })?;
        Ok(path)
    }
}
