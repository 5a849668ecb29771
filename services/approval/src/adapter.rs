//! Seed 004's adapter contract: an approved run is executed by the adapter
//! it names, through exactly four operations — `submit`, `poll`,
//! `fetch_artifacts`, `cancel` — whose failures map to the shared,
//! deterministic adapter reason codes of the catalogue (the same failure
//! always gives the same code).
//!
//! - `manual` (the default): the deterministic prompt bundle goes out, a
//!   person runs it elsewhere and pastes the result back
//!   (ImportManualResult); both are the run's artifacts.
//! - `switchyard`: the run of a Switchyard job. The executor proposed it
//!   with the job and claims it once approved; the adapter reads and
//!   cancels the job and fetches its artifacts over the executor's API.
//! - `ojs`: the run goes to an OJS server (any implementation of the Open
//!   Job Spec HTTP binding, `POST /ojs/v1/jobs`): a team's existing job
//!   system runs the work; its result comes back as an artifact.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use switchyard_core::Reason;
use switchyard_proto::approval::v1::Run;
use switchyard_proto::common::v1::ArtifactKind;
use switchyard_proto::executor::v1 as ex;

/// What an adapter reports about a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not finished.
    Running,
    /// Finished; artifacts can be fetched.
    Completed,
    /// Failed there (reason code given).
    Failed,
    /// Cancelled there.
    Cancelled,
}

impl State {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }
}

/// `submit(run) -> {job_id, state}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The adapter's handle of the submission.
    pub job_id: String,
    /// Its state there, in the outside system's words.
    pub state: String,
}

/// `poll(run)` and `cancel(run)`: `{state, reason_code?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Polled {
    /// Normalised state.
    pub state: State,
    /// The outside system's own word for it.
    pub detail: String,
    /// Why it failed or was cancelled.
    pub reason_code: Option<Reason>,
}

/// One artifact `fetch_artifacts(run)` returns: its path and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Path, unique within the run.
    pub path: String,
    /// Kind.
    pub kind: ArtifactKind,
    /// Media type.
    pub media_type: String,
    /// Content.
    pub content: Vec<u8>,
}

/// A failure, with its deterministic reason code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct AdapterError {
    /// One of the `ADAPTER_*` codes.
    pub reason: Reason,
    /// What happened.
    pub message: String,
}

fn err(reason: Reason, message: impl Into<String>) -> AdapterError {
    AdapterError {
        reason,
        message: message.into(),
    }
}

/// A boxed future.
pub type Fut<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// The adapter interface of seed 004.
pub trait Adapter: Send + Sync {
    /// Its name, as runs name it.
    fn name(&self) -> &'static str;
    /// Hands an approved run to the outside system.
    fn submit<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Submitted, AdapterError>>;
    /// Where the submission is.
    fn poll<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Polled, AdapterError>>;
    /// What it produced.
    fn fetch_artifacts<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Vec<Fetched>, AdapterError>>;
    /// Stops it.
    fn cancel<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Polled, AdapterError>>;
}

/// `[approval.adapters]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdaptersConfig {
    /// The adapter of a run that names none (seed 004: `manual`).
    pub default: String,
    /// How often runs handed to an adapter are polled, ms.
    pub poll_ms: u64,
    /// The OJS server runs naming `ojs` go to; unset: such runs are
    /// refused with ADAPTER_NOT_CONFIGURED.
    pub ojs: Option<OjsConfig>,
    /// The executor's URL when it runs in another process (the
    /// `switchyard` adapter reads jobs there).
    pub executor_url: Option<String>,
}

impl Default for AdaptersConfig {
    fn default() -> Self {
        AdaptersConfig {
            default: "manual".into(),
            poll_ms: 1000,
            ojs: None,
            executor_url: None,
        }
    }
}

/// `[approval.adapters.ojs]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OjsConfig {
    /// Base URL of the OJS server, e.g. `http://jobs.internal:8080`.
    pub url: String,
    /// File holding the bearer token sent to it (a mounted secret); unset:
    /// no Authorization header. The token is read at start-up and never
    /// logged or shown by `--dump-config`.
    pub token_file: Option<std::path::PathBuf>,
    /// Job type the run is enqueued as (the OJS server's workers for that
    /// type run it).
    pub job_type: String,
    /// Queue it is enqueued on.
    pub queue: String,
    /// Timeout of one HTTP request, ms.
    pub timeout_ms: u64,
}

impl Default for OjsConfig {
    fn default() -> Self {
        OjsConfig {
            url: String::new(),
            token_file: None,
            job_type: "agent_run".into(),
            queue: "default".into(),
            timeout_ms: 10_000,
        }
    }
}

/// The names runs may give.
pub const NAMES: &[&str] = &["manual", "switchyard", "ojs"];

// ---- manual ----

/// The default adapter: the prompt bundle out, the pasted result in.
#[derive(Debug, Clone, Default)]
pub struct Manual {
    /// Reads a stored artifact's content by id (the pasted result).
    pub(crate) blobs: Option<crate::content::Content>,
}

impl Adapter for Manual {
    fn name(&self) -> &'static str {
        "manual"
    }

    fn submit<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Submitted, AdapterError>> {
        Box::pin(async move {
            Ok(Submitted {
                job_id: format!("manual:{}", run.run_id),
                state: "awaiting_result".into(),
            })
        })
    }

    fn poll<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Polled, AdapterError>> {
        Box::pin(async move {
            let imported = run.result.as_ref().is_some_and(|r| !r.content.is_empty());
            Ok(Polled {
                state: if imported {
                    State::Completed
                } else {
                    State::Running
                },
                detail: if imported {
                    "result_imported"
                } else {
                    "awaiting_result"
                }
                .into(),
                reason_code: None,
            })
        })
    }

    fn fetch_artifacts<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Vec<Fetched>, AdapterError>> {
        Box::pin(async move {
            let mut out = vec![Fetched {
                path: "prompt-bundle.json".into(),
                kind: ArtifactKind::File,
                media_type: crate::bundle::CONTENT_TYPE.into(),
                content: crate::bundle::render(run),
            }];
            let stored = run
                .result
                .as_ref()
                .map(|r| r.artifacts.as_slice())
                .unwrap_or_default();
            for a in stored.iter().filter(|a| a.path != "prompt-bundle.json") {
                let content = match &self.blobs {
                    Some(b) => b
                        .get(&a.artifact_id)
                        .await
                        .map_err(|e| err(Reason::AdapterBadResponse, e.to_string()))?,
                    None => None,
                };
                let Some(content) = content else {
                    return Err(err(
                        Reason::AdapterJobNotFound,
                        format!("the content of {} is not stored", a.path),
                    ));
                };
                out.push(Fetched {
                    path: a.path.clone(),
                    kind: ArtifactKind::try_from(a.kind).unwrap_or_default(),
                    media_type: a.media_type.clone(),
                    content,
                });
            }
            Ok(out)
        })
    }

    fn cancel<'a>(&'a self, _run: &'a Run) -> Fut<'a, Result<Polled, AdapterError>> {
        Box::pin(async move {
            Ok(Polled {
                state: State::Cancelled,
                detail: "cancelled".into(),
                reason_code: None,
            })
        })
    }
}

// ---- switchyard ----

/// The run of a Switchyard job, read and cancelled over the executor's API.
#[derive(Debug, Clone, Default)]
pub struct Switchyard {
    /// The executor, once the process has one (set after start-up: the
    /// executor is built after approval; cleared at shutdown, as an
    /// in-process executor holds this service in turn).
    pub executor: Arc<RwLock<Option<switchyard_api::ExecutorClient>>>,
}

impl Switchyard {
    fn client(&self) -> Result<switchyard_api::ExecutorClient, AdapterError> {
        let slot = self
            .executor
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.clone().ok_or_else(|| {
            err(
                Reason::AdapterNotConfigured,
                "no executor here: run it in this process or set approval.adapters.executor_url",
            )
        })
    }

    fn job_id(run: &Run) -> Result<&str, AdapterError> {
        if run.job_id.is_empty() {
            return Err(err(
                Reason::AdapterSubmissionRejected,
                "a switchyard run is the run of a job: submit the job (`switchyard job submit`), which proposes its run",
            ));
        }
        Ok(&run.job_id)
    }

    async fn job(&self, run: &Run) -> Result<ex::Job, AdapterError> {
        let id = Self::job_id(run)?;
        let got = self
            .client()?
            .get_job(ex::GetJobRequest { job_id: id.into() })
            .await
            .map_err(status_error)?;
        got.job
            .ok_or_else(|| err(Reason::AdapterBadResponse, "GetJob answered no job"))
    }
}

/// A gRPC failure of the executor as an adapter code.
fn status_error(s: tonic::Status) -> AdapterError {
    let reason = match s.code() {
        tonic::Code::NotFound => Reason::AdapterJobNotFound,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => Reason::AdapterUnreachable,
        tonic::Code::InvalidArgument
        | tonic::Code::FailedPrecondition
        | tonic::Code::AlreadyExists
        | tonic::Code::PermissionDenied
        | tonic::Code::Unauthenticated => Reason::AdapterSubmissionRejected,
        _ => Reason::AdapterBadResponse,
    };
    err(reason, s.message().to_owned())
}

/// An executor job state as an adapter state (its eight states are OJS's).
fn job_state(j: &ex::Job) -> Result<Polled, AdapterError> {
    let name = ex::JobState::try_from(j.state)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("JOB_STATE_")
        .to_lowercase();
    state_named(&name)
}

impl Adapter for Switchyard {
    fn name(&self) -> &'static str {
        "switchyard"
    }

    fn submit<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Submitted, AdapterError>> {
        // The job exists already (it proposed this run) and waits for the
        // approval: submitting is finding it.
        Box::pin(async move {
            let j = self.job(run).await?;
            Ok(Submitted {
                job_id: run.job_id.clone(),
                state: job_state(&j)?.detail,
            })
        })
    }

    fn poll<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Polled, AdapterError>> {
        Box::pin(async move { job_state(&self.job(run).await?) })
    }

    fn fetch_artifacts<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Vec<Fetched>, AdapterError>> {
        Box::pin(async move {
            let id = Self::job_id(run)?;
            let c = self.client()?;
            let listed = c
                .list_artifacts(ex::ListArtifactsRequest { job_id: id.into() })
                .await
                .map_err(status_error)?;
            let mut out = Vec::with_capacity(listed.artifacts.len());
            for a in listed.artifacts {
                let got = c
                    .get_artifact(ex::GetArtifactRequest {
                        job_id: id.into(),
                        artifact: a.artifact_id.clone(),
                    })
                    .await
                    .map_err(status_error)?;
                out.push(Fetched {
                    path: a.path,
                    kind: ArtifactKind::try_from(a.kind).unwrap_or_default(),
                    media_type: a.media_type,
                    content: got.content,
                });
            }
            Ok(out)
        })
    }

    fn cancel<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Polled, AdapterError>> {
        Box::pin(async move {
            let id = Self::job_id(run)?;
            let answered = self
                .client()?
                .cancel_job(ex::CancelJobRequest {
                    job_id: id.into(),
                    reason: format!("approval run {} was cancelled", run.run_id),
                })
                .await
                .map_err(status_error)?;
            let j = answered.job.unwrap_or_default();
            job_state(&j)
        })
    }
}

// ---- ojs ----

/// An OJS server (the Open Job Spec HTTP binding).
#[derive(Clone)]
pub struct Ojs {
    cfg: OjsConfig,
    http: reqwest::Client,
    token: Option<String>,
}

impl std::fmt::Debug for Ojs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ojs")
            .field("url", &self.cfg.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl Ojs {
    /// The adapter for `cfg`.
    pub fn new(cfg: OjsConfig) -> Result<Ojs, String> {
        if !(cfg.url.starts_with("http://") || cfg.url.starts_with("https://")) {
            return Err(format!(
                "approval.adapters.ojs.url must be an http(s) URL, got {:?}",
                cfg.url
            ));
        }
        switchyard_kit::tls::install_crypto();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(cfg.timeout_ms.min(10_000)))
            .timeout(Duration::from_millis(cfg.timeout_ms))
            .build()
            .map_err(|e| format!("building the OJS adapter's HTTP client: {e}"))?;
        let token = match &cfg.token_file {
            Some(path) => {
                let t = std::fs::read_to_string(path).map_err(|e| {
                    format!("approval.adapters.ojs.token_file {}: {e}", path.display())
                })?;
                Some(t.trim().to_owned()).filter(|t| !t.is_empty())
            }
            None => None,
        };
        Ok(Ojs { cfg, http, token })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.cfg.url.trim_end_matches('/'))
    }

    /// Sends a request; the answer's JSON, or the failure's code.
    async fn call(&self, req: reqwest::RequestBuilder) -> Result<Value, AdapterError> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req
            .header("content-type", "application/openjobspec+json")
            .send()
            .await
            .map_err(|e| err(Reason::AdapterUnreachable, format!("the OJS server: {e}")))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let said = || {
            body.pointer("/error/message")
                .and_then(Value::as_str)
                .map_or_else(|| body.to_string(), str::to_owned)
        };
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(err(Reason::AdapterJobNotFound, said()));
        }
        if status.is_client_error() {
            return Err(err(
                Reason::AdapterSubmissionRejected,
                format!("the OJS server answered {status}: {}", said()),
            ));
        }
        if !status.is_success() {
            return Err(err(
                Reason::AdapterBadResponse,
                format!("the OJS server answered {status}: {}", said()),
            ));
        }
        Ok(body)
    }

    fn job_id(run: &Run) -> Result<&str, AdapterError> {
        if run.job_id.is_empty() {
            return Err(err(Reason::AdapterJobNotFound, "the run was not submitted"));
        }
        Ok(&run.job_id)
    }

    async fn job(&self, run: &Run) -> Result<Value, AdapterError> {
        let id = Self::job_id(run)?;
        let body = self
            .call(self.http.get(self.url(&format!("/ojs/v1/jobs/{id}"))))
            .await?;
        Ok(body.get("job").cloned().unwrap_or(body))
    }
}

/// An OJS job's state as an adapter state.
fn ojs_state(job: &Value) -> Result<Polled, AdapterError> {
    let Some(s) = job.get("state").and_then(Value::as_str) else {
        return Err(err(Reason::AdapterBadResponse, "the OJS job has no state"));
    };
    state_named(s)
}

/// One of the OJS lifecycle's eight states as an adapter state.
fn state_named(s: &str) -> Result<Polled, AdapterError> {
    let (state, reason_code) = match s {
        "completed" => (State::Completed, None),
        "discarded" => (State::Failed, Some(Reason::AdapterJobFailed)),
        "cancelled" => (State::Cancelled, Some(Reason::AdapterJobCancelled)),
        "scheduled" | "available" | "pending" | "active" | "retryable" => (State::Running, None),
        other => {
            return Err(err(
                Reason::AdapterBadResponse,
                format!("unknown job state {other:?}"),
            ));
        }
    };
    Ok(Polled {
        state,
        detail: s.to_owned(),
        reason_code,
    })
}

impl Adapter for Ojs {
    fn name(&self) -> &'static str {
        "ojs"
    }

    fn submit<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Submitted, AdapterError>> {
        Box::pin(async move {
            let bundle: Value =
                serde_json::from_slice(&crate::bundle::render(run)).unwrap_or(Value::Null);
            // The run id as the job id makes a repeated submit the same job.
            let body = json!({
                "id": ojs_id(run),
                "type": self.cfg.job_type,
                "args": [bundle],
                "options": {"queue": self.cfg.queue},
                "meta": {"switchyard_run_id": run.run_id, "correlation_id": run.correlation_id},
            });
            let answered = self
                .call(
                    self.http
                        .post(self.url("/ojs/v1/jobs"))
                        .body(body.to_string()),
                )
                .await;
            let job = match answered {
                Ok(b) => b.get("job").cloned().unwrap_or(b),
                // Submitted before (a retried submit): that job is it.
                Err(e)
                    if e.reason == Reason::AdapterSubmissionRejected
                        && e.message.contains("409") =>
                {
                    let mut probe = run.clone();
                    probe.job_id = ojs_id(run);
                    self.job(&probe).await?
                }
                Err(e) => return Err(e),
            };
            let Some(id) = job.get("id").and_then(Value::as_str) else {
                return Err(err(
                    Reason::AdapterBadResponse,
                    "the OJS server answered no job id",
                ));
            };
            Ok(Submitted {
                job_id: id.to_owned(),
                state: job
                    .get("state")
                    .and_then(Value::as_str)
                    .unwrap_or("available")
                    .to_owned(),
            })
        })
    }

    fn poll<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Polled, AdapterError>> {
        Box::pin(async move { ojs_state(&self.job(run).await?) })
    }

    fn fetch_artifacts<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Vec<Fetched>, AdapterError>> {
        Box::pin(async move {
            let job = self.job(run).await?;
            let result = job.get("result").cloned().unwrap_or(Value::Null);
            if result.is_null() {
                return Ok(Vec::new());
            }
            Ok(vec![Fetched {
                path: "result.json".into(),
                kind: ArtifactKind::File,
                media_type: "application/json".into(),
                content: serde_json::to_vec_pretty(&result).unwrap_or_default(),
            }])
        })
    }

    fn cancel<'a>(&'a self, run: &'a Run) -> Fut<'a, Result<Polled, AdapterError>> {
        Box::pin(async move {
            let id = Self::job_id(run)?;
            let body = self
                .call(self.http.delete(self.url(&format!("/ojs/v1/jobs/{id}"))))
                .await?;
            ojs_state(&body.get("job").cloned().unwrap_or(body))
        })
    }
}

/// The OJS job id of a run: a UUIDv7 (as OJS servers require) whose time
/// is the run's creation and whose random bits come from its id, so every
/// submit of the run names the same job.
fn ojs_id(run: &Run) -> String {
    use sha2::Digest as _;
    let ms = run
        .created_at
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms);
    let d = sha2::Sha256::digest(run.run_id.as_bytes());
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    b[6..].copy_from_slice(&d[..10]);
    b[6] = (b[6] & 0x0f) | 0x70;
    b[8] = (b[8] & 0x3f) | 0x80;
    uuid::Uuid::from_bytes(b).to_string()
}

/// The adapters of this server, by name.
#[derive(Clone)]
pub struct Adapters {
    /// `manual`.
    pub manual: Manual,
    /// `switchyard`.
    pub switchyard: Switchyard,
    /// `ojs`, when configured.
    pub ojs: Option<Ojs>,
}

impl std::fmt::Debug for Adapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapters")
            .field("ojs", &self.ojs.is_some())
            .finish_non_exhaustive()
    }
}

impl Adapters {
    /// The adapter named `name`.
    pub fn get(&self, name: &str) -> Result<&dyn Adapter, AdapterError> {
        match name {
            "manual" => Ok(&self.manual),
            "switchyard" => Ok(&self.switchyard),
            "ojs" => self.ojs.as_ref().map(|o| o as &dyn Adapter).ok_or_else(|| {
                err(
                    Reason::AdapterNotConfigured,
                    "no OJS server is configured: set [approval.adapters.ojs] url",
                )
            }),
            other => Err(err(
                Reason::AdapterNotConfigured,
                format!("unknown adapter {other:?} (manual, switchyard, ojs)"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ojs_id_of_a_run_is_a_stable_uuid_v7() {
        let run = |id: &str| Run {
            run_id: id.into(),
            created_at: Some(switchyard_kit::time::timestamp(1_700_000_000_123)),
            ..Default::default()
        };
        let a = ojs_id(&run("run-1"));
        assert_eq!(a, ojs_id(&run("run-1")));
        assert_ne!(a, ojs_id(&run("run-2")));
        let u = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(u.get_version_num(), 7, "{a}");
        let (secs, nanos) = u.get_timestamp().unwrap().to_unix();
        assert_eq!((secs, nanos / 1_000_000), (1_700_000_000, 123));
    }

    #[test]
    fn every_ojs_state_maps_to_one_adapter_state_and_code() {
        let s = |v: &str| ojs_state(&json!({"state": v}));
        assert_eq!(s("completed").unwrap().state, State::Completed);
        let failed = s("discarded").unwrap();
        assert_eq!(
            (failed.state, failed.reason_code),
            (State::Failed, Some(Reason::AdapterJobFailed))
        );
        let cancelled = s("cancelled").unwrap();
        assert_eq!(cancelled.reason_code, Some(Reason::AdapterJobCancelled));
        for running in ["scheduled", "available", "pending", "active", "retryable"] {
            assert_eq!(s(running).unwrap().state, State::Running, "{running}");
        }
        assert_eq!(
            s("exploded").unwrap_err().reason,
            Reason::AdapterBadResponse
        );
        assert_eq!(
            ojs_state(&json!({})).unwrap_err().reason,
            Reason::AdapterBadResponse
        );
    }

    #[test]
    fn executor_failures_map_to_adapter_codes() {
        use tonic::{Code, Status};
        for (code, reason) in [
            (Code::NotFound, Reason::AdapterJobNotFound),
            (Code::Unavailable, Reason::AdapterUnreachable),
            (Code::FailedPrecondition, Reason::AdapterSubmissionRejected),
            (Code::Internal, Reason::AdapterBadResponse),
        ] {
            assert_eq!(
                status_error(Status::new(code, "x")).reason,
                reason,
                "{code:?}"
            );
        }
    }

    #[tokio::test]
    async fn an_unreachable_ojs_server_is_adapter_unreachable_on_every_operation() {
        // A port nothing listens on: bind, learn it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let ojs = Ojs::new(OjsConfig {
            url: format!("http://127.0.0.1:{port}"),
            timeout_ms: 2000,
            ..Default::default()
        })
        .unwrap();
        let run = Run {
            run_id: "r".into(),
            job_id: "j".into(),
            ..Default::default()
        };
        assert_eq!(
            ojs.submit(&run).await.unwrap_err().reason,
            Reason::AdapterUnreachable
        );
        assert_eq!(
            ojs.poll(&run).await.unwrap_err().reason,
            Reason::AdapterUnreachable
        );
        assert_eq!(
            ojs.fetch_artifacts(&run).await.unwrap_err().reason,
            Reason::AdapterUnreachable
        );
        assert_eq!(
            ojs.cancel(&run).await.unwrap_err().reason,
            Reason::AdapterUnreachable
        );
        assert!(Ojs::new(OjsConfig::default()).is_err());
    }

    #[tokio::test]
    async fn a_switchyard_run_without_a_job_or_executor_maps_to_codes() {
        let s = Switchyard::default();
        let run = Run::default();
        assert_eq!(
            s.submit(&run).await.unwrap_err().reason,
            Reason::AdapterSubmissionRejected
        );
        let with_job = Run {
            job_id: "j".into(),
            ..Default::default()
        };
        assert_eq!(
            s.poll(&with_job).await.unwrap_err().reason,
            Reason::AdapterNotConfigured
        );
    }

    #[tokio::test]
    async fn the_manual_adapter_waits_for_the_pasted_result() {
        let m = Manual::default();
        let mut run = Run {
            run_id: "r1".into(),
            ..Default::default()
        };
        let s = m.submit(&run).await.unwrap();
        assert_eq!(
            (s.job_id.as_str(), s.state.as_str()),
            ("manual:r1", "awaiting_result")
        );
        assert_eq!(m.poll(&run).await.unwrap().state, State::Running);
        let arts = m.fetch_artifacts(&run).await.unwrap();
        assert_eq!(arts[0].path, "prompt-bundle.json");
        assert_eq!(arts[0].content, crate::bundle::render(&run));
        run.result = Some(switchyard_proto::approval::v1::RunResult {
            content: "done".into(),
            ..Default::default()
        });
        assert_eq!(m.poll(&run).await.unwrap().state, State::Completed);
        assert_eq!(m.cancel(&run).await.unwrap().state, State::Cancelled);
    }
}
