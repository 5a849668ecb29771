//! Artifacts: what a run produces for a person to act on (seed 004). Each
//! has a kind; a run may produce a kind only when its `outputs_allowed`
//! lists the output that kind proposes. Switchyard stores artifacts and
//! never publishes them.

use std::fmt;

/// Kinds of artifact, after seed 004's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArtifactKind {
    /// A plain file (a report, a log): proposes nothing.
    File,
    /// A proposed changeset bundle.
    ChangesetBundle,
    /// A draft pull request description.
    DraftPr,
    /// A proposed issue comment.
    IssueComment,
    /// A proposed test plan.
    TestPlan,
    /// A proposed declarative agent manifest.
    AgentManifest,
}

impl ArtifactKind {
    /// Every kind.
    pub const ALL: &'static [ArtifactKind] = &[
        ArtifactKind::File,
        ArtifactKind::ChangesetBundle,
        ArtifactKind::DraftPr,
        ArtifactKind::IssueComment,
        ArtifactKind::TestPlan,
        ArtifactKind::AgentManifest,
    ];

    /// The name used in files, events and the CLI.
    pub const fn as_str(self) -> &'static str {
        match self {
            ArtifactKind::File => "file",
            ArtifactKind::ChangesetBundle => "changeset_bundle",
            ArtifactKind::DraftPr => "draft_pr",
            ArtifactKind::IssueComment => "issue_comment",
            ArtifactKind::TestPlan => "test_plan",
            ArtifactKind::AgentManifest => "agent_manifest",
        }
    }

    /// Parses [`ArtifactKind::as_str`].
    pub fn parse(s: &str) -> Option<ArtifactKind> {
        Self::ALL.iter().copied().find(|k| k.as_str() == s)
    }

    /// The seed 004 output a run must allow to produce this kind; `None`
    /// for a plain file.
    pub const fn required_output(self) -> Option<&'static str> {
        match self {
            ArtifactKind::File => None,
            ArtifactKind::ChangesetBundle => Some("propose_changeset_bundle"),
            ArtifactKind::DraftPr => Some("propose_pr"),
            ArtifactKind::IssueComment => Some("propose_issue_comment"),
            ArtifactKind::TestPlan => Some("propose_test_plan"),
            ArtifactKind::AgentManifest => Some("propose_agent"),
        }
    }

    /// Whether a run allowing `outputs` may produce this kind; the refusal
    /// names the output to add.
    pub fn allowed_by(self, outputs: &[String]) -> Result<(), String> {
        match self.required_output() {
            Some(out) if !outputs.iter().any(|o| o == out) => Err(format!(
                "{} artifacts need {out:?} in the run's outputs_allowed (it allows: {})",
                self.as_str(),
                if outputs.is_empty() {
                    "nothing".to_owned()
                } else {
                    outputs.join(", ")
                }
            )),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for ArtifactKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks an artifact's file name: 1-128 of letters, digits, `.`, `_`,
/// `-`, not starting with `.` (no paths, no hidden files).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "artifact name {name:?} must be 1-128 letters, digits, '.', '_' or '-', not starting with '.'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_needs_exactly_its_seed_output_and_files_need_none() {
        let all: Vec<String> = [
            "propose_changeset_bundle",
            "propose_pr",
            "propose_issue_comment",
            "propose_test_plan",
            "propose_agent",
        ]
        .map(String::from)
        .to_vec();
        for &k in ArtifactKind::ALL {
            assert_eq!(ArtifactKind::parse(k.as_str()), Some(k));
            assert!(k.allowed_by(&all).is_ok());
            match k.required_output() {
                None => assert!(k.allowed_by(&[]).is_ok()),
                Some(out) => {
                    let others: Vec<String> = all.iter().filter(|o| *o != out).cloned().collect();
                    let err = k.allowed_by(&others).unwrap_err();
                    assert!(err.contains(out), "{err}");
                }
            }
        }
        assert_eq!(ArtifactKind::parse("pr"), None);
    }

    #[test]
    fn names_are_plain_file_names() {
        for good in ["bundle.json", "draft-pr.md", "a_b.1"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "../x", "a/b", ".hidden", "x y", &"a".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
