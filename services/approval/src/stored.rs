//! The policy store: Cedar policy files kept by the approval service (on
//! sled, or in PostgreSQL for every replica), decided with together with
//! the `[policy]` directory and the `[[approval.policies]]` rules. A file
//! is stored only when the whole set loads with it; every process reads
//! the store again at each reload tick (`Approval::policy_feed`, or
//! ListPolicies over gRPC in a process without this service).

use std::sync::Arc;

use switchyard_core::Violations;
use switchyard_kit::time::timestamp;
use switchyard_policy::{Feed, Source, stored_source};
use switchyard_proto::approval::v1::StoredPolicy;

use crate::{Approval, ApprovalError, invalid};

/// Longest stored policy file, bytes.
const MAX_TEXT: usize = 256 * 1024;

/// `name` as a stored policy's name, or why not.
fn check_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err("a name of 1 to 64 letters, digits, - and _ (like prod-tools)".into())
    }
}

impl Approval {
    /// The stored policy files as policy sources, by name.
    pub async fn stored_sources(&self) -> Result<Vec<Source>, ApprovalError> {
        Ok(self
            .inner
            .backend
            .stored_policies()
            .await?
            .iter()
            .map(|p| stored_source(&p.name, &p.text))
            .collect())
    }

    /// The stored policy files.
    pub async fn stored_policies(&self) -> Result<Vec<StoredPolicy>, ApprovalError> {
        self.inner.backend.stored_policies().await
    }

    /// Reads the policy store for an engine in this process. The feed
    /// holds the service weakly: the engine is the service's too, and a
    /// strong link would keep both (and the store's files) alive forever.
    pub fn policy_feed(&self) -> Feed {
        let weak = Arc::downgrade(&self.inner);
        Arc::new(move || {
            let weak = weak.clone();
            Box::pin(async move {
                let inner = weak
                    .upgrade()
                    .ok_or_else(|| "the approval service has stopped".to_owned())?;
                Approval { inner }
                    .stored_sources()
                    .await
                    .map_err(|e| e.to_string())
            })
        })
    }

    /// Stores policy file `name` (replacing one of that name) as `actor`,
    /// once the whole set loads with it; returns it and the version now in
    /// force here.
    pub async fn put_policy(
        &self,
        name: &str,
        text: &str,
        actor: &str,
    ) -> Result<(StoredPolicy, String), ApprovalError> {
        let mut v = Violations::new();
        v.check("name", check_name(name));
        if text.len() > MAX_TEXT {
            v.add("text", format!("must be at most {MAX_TEXT} bytes"));
        }
        v.into_result().map_err(ApprovalError::Invalid)?;
        let mut stored = self.stored_sources().await?;
        let source = stored_source(name, text);
        match stored.iter_mut().find(|s| s.name == source.name) {
            Some(s) => *s = source,
            None => stored.push(source),
        }
        stored.sort_by(|a, b| a.name.cmp(&b.name));
        let version = self.take_stored(&stored)?;
        let p = StoredPolicy {
            name: name.to_owned(),
            text: text.to_owned(),
            updated_by: actor.to_owned(),
            updated_at: Some(timestamp(self.now())),
        };
        self.inner.backend.put_policy(&p).await?;
        tracing::info!(name, actor, %version, "stored policy file put");
        self.use_stored(stored);
        Ok((p, version))
    }

    /// Removes stored policy file `name` as `actor`, once the set loads
    /// without it; returns the version now in force here.
    pub async fn delete_policy(&self, name: &str, actor: &str) -> Result<String, ApprovalError> {
        let mut stored = self.stored_sources().await?;
        let before = stored.len();
        stored.retain(|s| s.name != stored_source(name, "").name);
        if stored.len() == before {
            return Err(ApprovalError::PolicyNotFound(name.to_owned()));
        }
        let version = self.take_stored(&stored)?;
        self.inner.backend.delete_policy(name).await?;
        tracing::info!(name, actor, %version, "stored policy file deleted");
        self.use_stored(stored);
        Ok(version)
    }

    /// The version the set would have with `stored` as the store's files,
    /// or the Cedar error that refuses it.
    fn take_stored(&self, stored: &[Source]) -> Result<String, ApprovalError> {
        let engine = self.inner.policies.get();
        let set = engine
            .try_stored(stored)
            .map_err(|e| invalid("text", e.to_string()))?;
        Ok(set.version().to_owned())
    }

    /// Decides here with `stored`, just written, as the store's files
    /// (other processes read them at their next reload tick).
    fn use_stored(&self, stored: Vec<Source>) {
        let engine = self.inner.policies.get();
        engine.set_stored(stored);
        if let Err(e) = engine.reload() {
            tracing::warn!(error = %e, "the policy set with the store's files was refused; the set in force stays");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn stored_policy_names_are_short_plain_words() {
        for ok in ["prod-tools", "a", "small_spends2"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "../x", "a b", "x.cedar", &"n".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
