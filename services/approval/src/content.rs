//! Run artifacts' content, stored under its `sha256:` address: a sled tree
//! on the embedded backend, a table on PostgreSQL (so every replica reads
//! what any stored).

use switchyard_store::StoreError;
use switchyard_store::pg::Pg;

/// Where artifact content lives.
#[derive(Clone, Debug)]
pub(crate) enum Content {
    /// The sled blob tree.
    Sled(switchyard_store::Blobs),
    /// The `approval_blobs` table.
    Pg(Pg),
}

impl Content {
    /// Stores `bytes` (once per content); returns their address.
    pub(crate) async fn put(&self, bytes: &[u8]) -> Result<String, StoreError> {
        match self {
            Content::Sled(b) => b.put(bytes),
            Content::Pg(db) => {
                let id = switchyard_store::blobs::address(bytes);
                db.client()
                    .await?
                    .execute(
                        "INSERT INTO approval_blobs (address, data) VALUES ($1, $2)
                         ON CONFLICT (address) DO NOTHING",
                        &[&id, &bytes],
                    )
                    .await
                    .map_err(|e| db.error("storing an artifact", &e))?;
                Ok(id)
            }
        }
    }

    /// The bytes at `id`, when stored.
    pub(crate) async fn get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Content::Sled(b) => b.get(id),
            Content::Pg(db) => Ok(db
                .client()
                .await?
                .query_opt("SELECT data FROM approval_blobs WHERE address = $1", &[&id])
                .await
                .map_err(|e| db.error("reading an artifact", &e))?
                .map(|r| r.get(0))),
        }
    }
}
