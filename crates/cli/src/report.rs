//! How the CLI ends: one exit-code rule for every command, and errors stated
//! once — as text, or as JSON under `-o json` — with the likely fix.
//!
//! Exit codes (also in `switchyard --help`):
//! 0 success (a followed job completed); 1 an error; 2 bad usage;
//! 3 a followed job ended without completing (discarded or cancelled);
//! 130 interrupted (Ctrl-C); 141 the reader of stdout went away.

use serde_json::{Value, json};
use switchyard_kit::error::ApiError;

/// The exit-code rule, for `--help`.
pub const EXIT_CODES: &str = "Exit codes: 0 success (a followed job completed), 1 error, 2 bad usage, \
3 a followed job ended without completing (discarded or cancelled), 4 the job was still running \
when the wait ran out (`job run`, `job result --wait`), 130 interrupted, \
141 stdout closed (e.g. `| head`). With -o json, errors are a JSON document on stderr.";

/// Exit status when a followed job ended discarded or cancelled.
pub const JOB_DID_NOT_COMPLETE: u8 = 3;
/// Exit status when a job was still running when the wait for it ran out.
pub const JOB_STILL_RUNNING: u8 = 4;
/// Exit status after Ctrl-C (128 + SIGINT, as shells report it).
pub const INTERRUPTED: u8 = 130;

/// The server could not be reached: said once, with where its URL came
/// from and the likely fix.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot reach Switchyard at {url} ({from}): {cause}; is it running? Start one with `make run` (or `switchyard dev`), or point --url at it"
)]
pub struct Unreachable {
    /// The URL tried.
    pub url: String,
    /// Where it came from (flag, environment or default).
    pub from: &'static str,
    /// The innermost cause (connection refused, no such host).
    pub cause: String,
}

/// Ends of a command that are not failures of the CLI itself.
#[derive(Debug, thiserror::Error)]
pub enum Stop {
    /// A followed job ended, but not completed.
    #[error("job {job_id} ended {state}{}", detail(reason, error))]
    JobEnded {
        /// Job id.
        job_id: String,
        /// Final state (`discarded`, `cancelled`).
        state: String,
        /// Reason code, when the job has one.
        reason: String,
        /// Its error text.
        error: String,
    },
    /// Ctrl-C while following a job: the job goes on on the server.
    #[error(
        "interrupted: job {job_id} continues on the server; follow it again with `switchyard job watch {job_id}`, or stop it with `switchyard job cancel {job_id}`"
    )]
    Interrupted {
        /// Job id.
        job_id: String,
    },
    /// `job run` / `job result --wait`: the wait ran out first.
    #[error(
        "job {job_id} is still {state} after waiting {waited_secs} s; it goes on on the server: follow it with `switchyard job watch {job_id}`, or wait longer with `switchyard job result {job_id} --wait SECS`"
    )]
    StillRunning {
        /// Job id.
        job_id: String,
        /// Its state when the wait ran out.
        state: String,
        /// How long the CLI waited.
        waited_secs: u64,
    },
}

fn detail(reason: &str, error: &str) -> String {
    match (reason.is_empty(), error.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(" ({reason})"),
        (true, false) => format!(": {error}"),
        (false, false) => format!(" ({reason}): {error}"),
    }
}

/// The process exit status for an error.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<Stop>() {
        Some(Stop::JobEnded { .. }) => JOB_DID_NOT_COMPLETE,
        Some(Stop::Interrupted { .. }) => INTERRUPTED,
        Some(Stop::StillRunning { .. }) => JOB_STILL_RUNNING,
        None => 1,
    }
}

/// An error's text with its causes, each said once: a cause whose text the
/// message already carries (`binding …: Address in use` over `Address in
/// use`, tonic's nested `transport error`s) is not repeated.
pub fn text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let t = cause.to_string();
        if t.is_empty() || out.contains(&t) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&t);
    }
    out
}

/// An error as one JSON document: `reason`, `message`, and the `fields` a
/// server named (`{"error": {...}}`).
pub fn json(e: &anyhow::Error) -> Value {
    let body = match (e.downcast_ref::<ApiError>(), e.downcast_ref::<Stop>()) {
        // The HTTP door's envelope, field for field.
        (Some(api), _) => {
            let (_, mut v) = switchyard_kit::error::envelope(api, &api.request_id);
            // A hint the CLI added around the server's error leads.
            if e.to_string() != api.to_string() {
                v["error"]["message"] = text(e).into();
            }
            v["error"].take()
        }
        (
            None,
            Some(Stop::JobEnded {
                job_id,
                state,
                reason,
                error,
            }),
        ) => json!({
            "reason": "JOB_DID_NOT_COMPLETE",
            "message": text(e),
            "job_id": job_id, "state": state, "job_reason": reason, "job_error": error,
            "fields": [],
        }),
        (None, Some(Stop::Interrupted { job_id })) => json!({
            "reason": "INTERRUPTED", "message": text(e), "job_id": job_id, "fields": [],
        }),
        (None, Some(Stop::StillRunning { job_id, state, .. })) => json!({
            "reason": "JOB_STILL_RUNNING", "message": text(e), "job_id": job_id, "state": state, "fields": [],
        }),
        (None, None) if e.downcast_ref::<Unreachable>().is_some() => {
            json!({"code": "Unavailable", "reason": "UNAVAILABLE", "message": text(e), "fields": []})
        }
        (None, None) => json!({"reason": "CLIENT_ERROR", "message": text(e), "fields": []}),
    };
    json!({ "error": body })
}

/// True when the command line asks for JSON output (`-o json`,
/// `--output json`, `-ojson`, `--output=json`), read before clap so that an
/// error in any command — even one clap never reached — can honour it.
pub fn wants_json(args: &[String]) -> bool {
    args.iter().enumerate().any(|(i, a)| {
        let next = args.get(i + 1).map(String::as_str);
        matches!(a.as_str(), "-ojson" | "--output=json")
            || (matches!(a.as_str(), "-o" | "--output") && next == Some("json"))
    })
}

/// Where the server URL came from, for "cannot reach" errors.
pub fn url_source(args: &[String]) -> &'static str {
    if args.iter().any(|a| a == "--url" || a.starts_with("--url=")) {
        "from --url"
    } else if std::env::var_os("SWITCHYARD_URL").is_some() {
        "from SWITCHYARD_URL"
    } else {
        "the default; set --url or SWITCHYARD_URL"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        #[derive(Debug, thiserror::Error)]
        #[error("binding 127.0.0.1:7600: {source}")]
        struct Bind {
            source: std::io::Error,
        }
        let e = anyhow::Error::new(Bind { source: io });
        assert_eq!(text(&e), "binding 127.0.0.1:7600: Address already in use");
        let e = anyhow::anyhow!("transport error")
            .context("transport error")
            .context("cannot connect");
        assert_eq!(text(&e), "cannot connect: transport error");
    }

    #[test]
    fn json_is_asked_for_in_every_spelling() {
        let v = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert!(wants_json(&v(&["job", "get", "x", "-o", "json"])));
        assert!(wants_json(&v(&["--output=json"])));
        assert!(wants_json(&v(&["-ojson"])));
        assert!(!wants_json(&v(&["-o", "table"])));
        assert!(!wants_json(&v(&["json"])));
    }

    #[test]
    fn a_job_that_did_not_complete_exits_3_and_says_so_in_json() {
        let e = anyhow::Error::new(Stop::JobEnded {
            job_id: "j1".into(),
            state: "discarded".into(),
            reason: "TASK_FAILED".into(),
            error: "exit 1".into(),
        });
        assert_eq!(exit_code(&e), 3);
        assert_eq!(text(&e), "job j1 ended discarded (TASK_FAILED): exit 1");
        assert_eq!(json(&e)["error"]["reason"], "JOB_DID_NOT_COMPLETE");
        assert_eq!(exit_code(&anyhow::anyhow!("x")), 1);
    }
}
