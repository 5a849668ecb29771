//! A job's artifacts: what its tasks produce for a person to act on (an
//! agent's response, a pull worker's ack, an LLM task's answer). Each is
//! checked against the job's `approval.outputs_allowed` — all of a task's
//! artifacts are kept, or none and the task fails — then stored by content
//! address and recorded as an `artifact.stored` event; refusals are
//! recorded as `artifact.refused`. Reads check the job's tenant like every
//! other read of the job.

use switchyard_api::artifacts::{self, Refused};
use switchyard_proto::common::v1::{Artifact, NewArtifact};

use crate::Executor;
use crate::error::ExecutorError;
use crate::events::{self, JobEvent};

impl Executor {
    /// Checks and stores the artifacts task `task_id` of `job_id`
    /// produced: all of them, or none (the first refusal is returned and
    /// every refusal is recorded). Returns the log position to wait for.
    pub(crate) fn keep_artifacts(
        &self,
        job_id: &str,
        task_id: &str,
        news: &[NewArtifact],
    ) -> Result<u64, ExecutorError> {
        let book = &self.inner.book;
        let mut st = book.lock();
        let outputs = st
            .get(job_id)?
            .spec()
            .approval
            .as_ref()
            .map(|a| a.outputs_allowed.clone())
            .unwrap_or_default();
        let max = self.inner.cfg.artifact_max_bytes;
        let mut admitted = Vec::with_capacity(news.len());
        let mut refused: Vec<(&NewArtifact, Refused)> = Vec::new();
        for n in news {
            match artifacts::admit(n, &outputs, max) {
                Ok(a) => admitted.push((a, n)),
                Err(r) => refused.push((n, r)),
            }
        }
        if let Some((_, first)) = refused.first().cloned() {
            for (n, r) in refused {
                let ev = events::ArtifactRefused {
                    name: n.name.clone(),
                    kind: artifacts::kind_of(n.kind).as_str().to_owned(),
                    reason: r.reason.as_str().to_owned(),
                    message: r.message,
                };
                book.record(&mut st, job_id, task_id, JobEvent::ArtifactRefused(ev));
            }
            return Err(ExecutorError::ArtifactRefused(first));
        }
        let mut g = book.last();
        for (a, n) in admitted {
            let id = self.inner.artifacts.put(&n.content)?;
            let stored = events::ArtifactStored {
                artifact_id: id,
                kind: artifacts::kind_of(a.kind).as_str().to_owned(),
                path: format!("{task_id}/{}", a.name),
                name: a.name,
                media_type: a.media_type,
                size_bytes: a.size_bytes,
            };
            g = book.record(&mut st, job_id, task_id, JobEvent::ArtifactStored(stored));
        }
        Ok(g)
    }

    /// One artifact of a job with its content, by id or path.
    pub(crate) async fn artifact(
        &self,
        job_id: &str,
        wanted: &str,
    ) -> Result<(Artifact, Vec<u8>), ExecutorError> {
        let job = self.inner.book.job(job_id).await?;
        let not_found = || ExecutorError::ArtifactNotFound {
            job: job_id.to_owned(),
            artifact: wanted.to_owned(),
        };
        // The latest with that path or id (a retried task's replaces).
        let a = job
            .artifacts
            .iter()
            .rev()
            .find(|a| a.artifact_id == wanted || a.path == wanted)
            .cloned()
            .ok_or_else(not_found)?;
        let content = self
            .inner
            .artifacts
            .get(&a.artifact_id)
            .await?
            .ok_or_else(not_found)?;
        Ok((a, content))
    }
}
