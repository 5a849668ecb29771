//! Content-addressed blobs: bytes stored under `sha256:<hex>` of
//! themselves, so storing the same content twice keeps one copy and a
//! reader can check what it got. Who may read which blob is the owner's
//! business (an artifact belongs to a job or a run); this only stores.

use sha2::{Digest, Sha256};

use crate::{Store, StoreError, Tree};

/// A tree of blobs keyed by their content address.
#[derive(Debug, Clone)]
pub struct Blobs {
    tree: Tree<Vec<u8>>,
}

/// The content address of `bytes`: `sha256:<hex>`.
pub fn address(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut id = String::with_capacity(7 + 64);
    id.push_str("sha256:");
    for b in digest {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

impl Blobs {
    /// Opens the blob tree `name` of `store`.
    pub fn open(store: &Store, name: &str) -> Result<Blobs, StoreError> {
        Ok(Blobs {
            tree: store.tree(name)?,
        })
    }

    /// Stores `bytes` (not yet durable: see [`Store::sync`]); returns their
    /// address. Storing the same bytes again changes nothing.
    pub fn put(&self, bytes: &[u8]) -> Result<String, StoreError> {
        let id = address(bytes);
        if self.tree.get(&id)?.is_none() {
            self.tree.put(&id, &bytes.to_vec())?;
        }
        Ok(id)
    }

    /// The bytes at `id`, when stored.
    pub fn get(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.tree.get(id)
    }

    /// Removes the bytes at `id` (the caller knows nothing else refers to them).
    pub fn remove(&self, id: &str) -> Result<bool, StoreError> {
        self.tree.remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_content_has_one_address_and_reads_back_byte_identical() {
        let store = Store::temporary().unwrap();
        let blobs = Blobs::open(&store, "blobs").unwrap();
        let bytes = b"\x00binary\xffcontent".to_vec();
        let a = blobs.put(&bytes).unwrap();
        assert_eq!(blobs.put(&bytes).unwrap(), a);
        assert!(a.starts_with("sha256:") && a.len() == 71, "{a}");
        assert_eq!(blobs.get(&a).unwrap().unwrap(), bytes);
        assert_ne!(blobs.put(b"other").unwrap(), a);
        assert_eq!(blobs.get(&address(b"missing")).unwrap(), None);
    }
}
