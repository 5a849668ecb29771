//! What the executor keeps beside its jobs — the outbox's intents, waiting
//! tool calls' checkpoints, artifacts' content — on either backend: sled
//! trees in the data directory, or shared tables on PostgreSQL (written
//! with the replica's next batch, so they become durable with the job
//! events recorded alongside them, as on sled).

use std::sync::Arc;

use switchyard_store::{Blobs, Store, StoreError, Tree};

use super::pg::PgJobs;

/// Where a space of kept values lives, as the job store names it.
pub(crate) enum Space {
    /// A sled tree of that name.
    Sled(Store, &'static str),
    /// A space of the `exec_kv` table.
    Pg(Arc<PgJobs>, &'static str),
}

/// Keyed values of one kind.
pub(crate) enum Kept<V> {
    /// A sled tree (and its store, to sync).
    Sled(Tree<V>, Store),
    /// A space of the `exec_kv` table.
    Pg(Arc<PgJobs>, &'static str),
}

impl<V: prost::Message + Default> Kept<V> {
    /// The values kept in `space`.
    pub(crate) fn open(space: Space) -> Result<Kept<V>, StoreError> {
        Ok(match space {
            Space::Sled(store, name) => Kept::Sled(store.tree(name)?, store),
            Space::Pg(pg, name) => Kept::Pg(pg, name),
        })
    }

    /// Stores `value` under `key` (durable with the next flush or batch).
    pub(crate) fn put(&self, key: &str, value: &V) -> Result<(), StoreError> {
        match self {
            Kept::Sled(t, _) => t.put(key, value),
            Kept::Pg(pg, space) => {
                pg.kv(space, key, Some(value.encode_to_vec()));
                Ok(())
            }
        }
    }

    /// Stores `value` under `key` unless a value is there already (on PostgreSQL at
    /// once); returns the value kept (what another writer kept first).
    pub(crate) async fn put_absent(&self, key: &str, value: V) -> Result<V, StoreError> {
        match self {
            Kept::Sled(t, _) => match t.get(key)? {
                Some(v) => Ok(v),
                None => {
                    // Durable with the store's next flush: before any
                    // job's retirement signs with it (one node writes
                    // here).
                    t.put(key, &value)?;
                    Ok(value)
                }
            },
            Kept::Pg(pg, space) => {
                let b = pg.kv_put_absent(space, key, value.encode_to_vec()).await?;
                decode(space, key, &b)
            }
        }
    }

    /// Removes `key`.
    pub(crate) fn remove(&self, key: &str) -> Result<(), StoreError> {
        match self {
            Kept::Sled(t, _) => t.remove(key).map(|_| ()),
            Kept::Pg(pg, space) => {
                pg.kv(space, key, None);
                Ok(())
            }
        }
    }

    /// The value under `key`.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        match self {
            Kept::Sled(t, _) => t.get(key),
            Kept::Pg(pg, space) => pg
                .kv_get(space, key)
                .await?
                .map(|b| decode(space, key, &b))
                .transpose(),
        }
    }

    /// Waits until every write made here before the call is durable.
    pub(crate) async fn sync(&self) -> Result<(), StoreError> {
        match self {
            Kept::Sled(_, store) => store.sync().await,
            Kept::Pg(pg, _) => pg.kv_sync().await,
        }
    }

    /// Every value, by key (what cannot be read is logged and skipped).
    pub(crate) async fn list(&self) -> Result<Vec<(String, V)>, StoreError> {
        match self {
            Kept::Sled(t, _) => Ok(t
                .iter()
                .filter_map(|r| match r {
                    Ok(kv) => Some(kv),
                    Err(e) => {
                        tracing::error!(error = %e, "reading kept executor state");
                        None
                    }
                })
                .collect()),
            Kept::Pg(pg, space) => Ok(pg
                .kv_list(space)
                .await?
                .into_iter()
                .filter_map(|(k, b)| match decode(space, &k, &b) {
                    Ok(v) => Some((k, v)),
                    Err(e) => {
                        tracing::error!(error = %e, "reading kept executor state");
                        None
                    }
                })
                .collect()),
        }
    }
}

fn decode<V: prost::Message + Default>(space: &str, key: &str, b: &[u8]) -> Result<V, StoreError> {
    V::decode(b).map_err(|e| StoreError::Io(format!("exec_kv {space}/{key} does not decode: {e}")))
}

/// Artifacts' content, stored under its `sha256:` address.
pub(crate) enum Content {
    /// The sled blob tree.
    Sled(Blobs),
    /// The `exec_blobs` table.
    Pg(Arc<PgJobs>),
}

impl Content {
    /// Stores `bytes` (once per content); returns their address.
    pub(crate) fn put(&self, bytes: &[u8]) -> Result<String, StoreError> {
        match self {
            Content::Sled(b) => b.put(bytes),
            Content::Pg(pg) => Ok(pg.blob(bytes)),
        }
    }

    /// The bytes at `address`, when stored.
    pub(crate) async fn get(&self, address: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Content::Sled(b) => b.get(address),
            Content::Pg(pg) => pg.blob_get(address).await,
        }
    }
}
