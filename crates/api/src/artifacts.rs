//! Artifacts as a producer hands them over ([`NewArtifact`]) and as they
//! are stored ([`Artifact`]): the one check of name, size and kind against
//! the run's `outputs_allowed` that the executor (agent responses, pull
//! worker acks, LLM answers) and approval (manual results, adapters) share.

use switchyard_core::Reason;
use switchyard_core::artifact::{self, ArtifactKind};
use switchyard_proto::common::v1::{self as common, Artifact, NewArtifact};

/// Why an artifact was refused: a reason code and what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// `ARTIFACT_KIND_NOT_ALLOWED` or `ARTIFACT_INVALID`.
    pub reason: Reason,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// The core kind of a proto kind (unset reads as a plain file).
pub fn kind_of(k: i32) -> ArtifactKind {
    match common::ArtifactKind::try_from(k).unwrap_or_default() {
        common::ArtifactKind::Unspecified | common::ArtifactKind::File => ArtifactKind::File,
        common::ArtifactKind::ChangesetBundle => ArtifactKind::ChangesetBundle,
        common::ArtifactKind::DraftPr => ArtifactKind::DraftPr,
        common::ArtifactKind::IssueComment => ArtifactKind::IssueComment,
        common::ArtifactKind::TestPlan => ArtifactKind::TestPlan,
        common::ArtifactKind::AgentManifest => ArtifactKind::AgentManifest,
    }
}

/// The proto kind of a core kind.
pub fn proto_kind(k: ArtifactKind) -> common::ArtifactKind {
    match k {
        ArtifactKind::File => common::ArtifactKind::File,
        ArtifactKind::ChangesetBundle => common::ArtifactKind::ChangesetBundle,
        ArtifactKind::DraftPr => common::ArtifactKind::DraftPr,
        ArtifactKind::IssueComment => common::ArtifactKind::IssueComment,
        ArtifactKind::TestPlan => common::ArtifactKind::TestPlan,
        ArtifactKind::AgentManifest => common::ArtifactKind::AgentManifest,
    }
}

/// Checks `new` for a run allowing `outputs`, at most `max_bytes` long;
/// the metadata to store it under (id, path and time set by the caller
/// once the content is stored).
pub fn admit(new: &NewArtifact, outputs: &[String], max_bytes: usize) -> Result<Artifact, Refused> {
    let invalid = |message: String| Refused {
        reason: Reason::ArtifactInvalid,
        message,
    };
    artifact::check_name(&new.name).map_err(invalid)?;
    if new.content.len() > max_bytes {
        return Err(invalid(format!(
            "artifact {:?} is {} bytes, over the {max_bytes}-byte limit (artifact_max_bytes)",
            new.name,
            new.content.len()
        )));
    }
    let kind = kind_of(new.kind);
    kind.allowed_by(outputs).map_err(|m| Refused {
        reason: Reason::ArtifactKindNotAllowed,
        message: format!("artifact {:?} refused: {m}", new.name),
    })?;
    let media_type = if new.media_type.trim().is_empty() {
        "application/octet-stream".to_owned()
    } else {
        new.media_type.trim().to_owned()
    };
    Ok(Artifact {
        name: new.name.clone(),
        kind: proto_kind(kind) as i32,
        media_type,
        size_bytes: new.content.len() as u64,
        ..Default::default()
    })
}

/// Artifacts as listed: the latest per path (a retried task's replaces
/// its earlier one), in the order their paths were first stored.
pub fn latest_per_path(all: &[Artifact]) -> Vec<Artifact> {
    let mut listed: Vec<Artifact> = Vec::with_capacity(all.len());
    for a in all {
        match listed.iter_mut().find(|o| o.path == a.path) {
            Some(o) => *o = a.clone(),
            None => listed.push(a.clone()),
        }
    }
    listed
}

/// A run's result as seed 004 binds it, from its artifacts (the latest
/// per path): the first changeset bundle's id, the draft PR's reference
/// (Switchyard publishes nothing: `artifact:<id>` names the stored
/// description a person acts on), every path, and the artifacts.
pub fn run_result(
    summary: &str,
    content: String,
    all: &[Artifact],
) -> switchyard_proto::approval::v1::RunResult {
    let listed = latest_per_path(all);
    let of = |k: ArtifactKind| {
        listed
            .iter()
            .find(|a| kind_of(a.kind) == k)
            .map(|a| a.artifact_id.clone())
            .unwrap_or_default()
    };
    let draft = of(ArtifactKind::DraftPr);
    switchyard_proto::approval::v1::RunResult {
        changeset_bundle_id: of(ArtifactKind::ChangesetBundle),
        draft_pr_url: if draft.is_empty() {
            String::new()
        } else {
            format!("artifact:{draft}")
        },
        artifact_paths: listed.iter().map(|a| a.path.clone()).collect(),
        summary: summary.to_owned(),
        content,
        artifacts: listed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(kind: common::ArtifactKind, name: &str, len: usize) -> NewArtifact {
        NewArtifact {
            name: name.into(),
            kind: kind as i32,
            media_type: String::new(),
            content: vec![b'x'; len],
        }
    }

    #[test]
    fn a_kind_outside_outputs_allowed_is_refused_with_its_reason() {
        let outputs = vec!["propose_changeset_bundle".to_owned()];
        let ok = admit(
            &new(common::ArtifactKind::ChangesetBundle, "b.json", 3),
            &outputs,
            10,
        )
        .unwrap();
        assert_eq!(ok.size_bytes, 3);
        assert_eq!(ok.media_type, "application/octet-stream");
        let pr = admit(
            &new(common::ArtifactKind::DraftPr, "pr.md", 3),
            &outputs,
            10,
        )
        .unwrap_err();
        assert_eq!(pr.reason, Reason::ArtifactKindNotAllowed);
        assert!(pr.message.contains("propose_pr"), "{}", pr.message);
        let file = admit(
            &new(common::ArtifactKind::Unspecified, "log.txt", 3),
            &[],
            10,
        )
        .unwrap();
        assert_eq!(file.kind, common::ArtifactKind::File as i32);
    }

    #[test]
    fn a_run_result_binds_the_latest_artifact_per_path_and_names_the_bundle_and_draft() {
        let a = |id: &str, path: &str, kind: common::ArtifactKind| Artifact {
            artifact_id: id.into(),
            path: path.into(),
            kind: kind as i32,
            ..Default::default()
        };
        let r = run_result(
            "done",
            String::new(),
            &[
                a(
                    "sha256:1",
                    "t/b.json",
                    common::ArtifactKind::ChangesetBundle,
                ),
                a("sha256:2", "t/pr.md", common::ArtifactKind::DraftPr),
                a(
                    "sha256:3",
                    "t/b.json",
                    common::ArtifactKind::ChangesetBundle,
                ),
            ],
        );
        assert_eq!(r.artifact_paths, ["t/b.json", "t/pr.md"]);
        assert_eq!(r.changeset_bundle_id, "sha256:3");
        assert_eq!(r.draft_pr_url, "artifact:sha256:2");
        assert_eq!(r.summary, "done");
    }

    #[test]
    fn oversized_or_path_named_artifacts_are_invalid() {
        let big = admit(&new(common::ArtifactKind::File, "a.txt", 11), &[], 10).unwrap_err();
        assert_eq!(big.reason, Reason::ArtifactInvalid);
        let path = admit(&new(common::ArtifactKind::File, "../a", 1), &[], 10).unwrap_err();
        assert_eq!(path.reason, Reason::ArtifactInvalid);
    }
}
