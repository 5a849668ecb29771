//! Records the git commit the binary is built from, for `switchyard version`.

fn main() {
    println!("cargo:rerun-if-env-changed=SWITCHYARD_GIT_COMMIT");
    // A build without the repository (a container build) is told the commit.
    if let Ok(c) = std::env::var("SWITCHYARD_GIT_COMMIT")
        && !c.is_empty()
    {
        println!("cargo:rustc-env=SWITCHYARD_GIT_COMMIT={c}");
        return;
    }
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=SWITCHYARD_GIT_COMMIT={commit}{suffix}");
    // A new commit or a change of branch moves HEAD; re-run then.
    let head_ref = std::fs::read_to_string("../../.git/HEAD")
        .ok()
        .and_then(|h| {
            h.strip_prefix("ref: ")
                .map(|r| format!("../../.git/{}", r.trim()))
        });
    for f in ["../../.git/HEAD".to_owned(), "../../.git/index".to_owned()]
        .into_iter()
        .chain(head_ref)
    {
        if std::path::Path::new(&f).exists() {
            println!("cargo:rerun-if-changed={f}");
        }
    }
}
