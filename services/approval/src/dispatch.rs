//! Approved runs go to their adapters ([`crate::adapter`]): every
//! `adapters.poll_ms` the dispatcher hands each approved `manual` or `ojs`
//! run to its adapter (`submit`, under a claim held by `adapter-<name>`),
//! polls the runs it handed over, and settles them: completed with the
//! artifacts `fetch_artifacts` returns (stored here, content-addressed),
//! failed or cancelled with the adapter's reason code. `switchyard` runs
//! are the executor's to claim; the adapter reads, cancels and fetches
//! their jobs.

use std::time::Duration;

use switchyard_api::artifacts;
use switchyard_core::Reason;
use switchyard_core::run::RunStatus as S;
use switchyard_kit::time::{timestamp, timestamp_ms};
use switchyard_proto::approval::v1::{ImportManualResultRequest, Run, RunResult};
use switchyard_proto::common::v1::{Artifact, ArtifactKind, NewArtifact};

use crate::adapter::{AdapterError, Fetched, State};
use crate::{Approval, ApprovalError, Note, invalid, status_of};

/// The worker id under which adapter `name` holds the runs it was handed.
pub(crate) fn worker(name: &str) -> String {
    format!("adapter-{name}")
}

/// Adapters the dispatcher drives itself.
fn dispatched(adapter: &str) -> bool {
    matches!(adapter, "manual" | "ojs")
}

impl Approval {
    /// Lets the `switchyard` adapter reach the executor (built after this
    /// service in one process, or remote).
    pub fn set_executor(&self, client: switchyard_api::ExecutorClient) {
        let slot = self.inner.adapters.switchyard.executor.clone();
        *slot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(client);
        // An in-process executor holds this service: let go of it at
        // shutdown so both close their stores.
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            shutdown.wait().await;
            slot.write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
        });
    }

    /// Sets a proposal's adapter: none for a per-call run, a publication
    /// or a budget extension (a decision, nothing to execute), `switchyard` for a
    /// job's run, else the run's choice or the configured default.
    pub(crate) fn bind_adapter(&self, run: &mut Run) -> Result<(), ApprovalError> {
        if run.tool_call.is_some() || run.publication.is_some() || run.extension.is_some() {
            run.adapter.clear();
            return Ok(());
        }
        if run.adapter.is_empty() {
            run.adapter = if run.job_id.is_empty() {
                self.inner.cfg.adapters.default.clone()
            } else {
                "switchyard".into()
            };
        }
        if !crate::adapter::NAMES.contains(&run.adapter.as_str()) {
            return Err(invalid(
                "run.adapter",
                format!(
                    "unknown adapter {:?} (manual, switchyard, ojs)",
                    run.adapter
                ),
            ));
        }
        if run.adapter == "switchyard" && run.job_id.is_empty() {
            return Err(invalid(
                "run.adapter",
                "a switchyard run is the run of a job: submit the job (`switchyard job submit`), which proposes its run",
            ));
        }
        Ok(())
    }

    /// Runs the dispatcher every `adapters.poll_ms` until shutdown.
    pub fn spawn_dispatcher(&self) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        let period = Duration::from_millis(self.inner.cfg.adapters.poll_ms);
        self.inner
            .shutdown
            .spawn_every(period, "dispatching runs to adapters", move || {
                let me = me.clone();
                async move { me.dispatch().await.map(|_| ()) }
            })
    }

    /// One round: hand approved runs over, poll those handed over. Returns
    /// how many runs changed.
    pub async fn dispatch(&self) -> Result<usize, ApprovalError> {
        let now = self.now();
        // Among replicas, one dispatches (any takes over when it stops);
        // claims are decided under the run's row lock regardless.
        let ttl = self.inner.cfg.adapters.poll_ms.saturating_mul(3).max(1_000);
        if !self
            .inner
            .backend
            .elected("approval.dispatcher", now, ttl)
            .await?
        {
            return Ok(0);
        }
        let live = self.inner.backend.in_flight().await?;
        let (due, handed): (Vec<Run>, Vec<Run>) = {
            let live: Vec<Run> = live
                .into_iter()
                .filter(|r| r.tool_call.is_none() && dispatched(&r.adapter))
                .collect();
            live.into_iter()
                .filter(|r| match status_of(r) {
                    S::Approved => r.next_attempt_at.as_ref().map_or(0, timestamp_ms) <= now,
                    S::Running => r.claimed_by == worker(&r.adapter),
                    _ => false,
                })
                .partition(|r| status_of(r) == S::Approved)
        };
        let mut changed = 0;
        for run in due {
            changed += usize::from(self.hand_over(run).await?);
        }
        for run in handed {
            changed += usize::from(self.follow(run).await?);
        }
        Ok(changed)
    }

    /// Claims an approved run for its adapter and submits it.
    async fn hand_over(&self, run: Run) -> Result<bool, ApprovalError> {
        let who = worker(&run.adapter);
        let lease = self.inner.cfg.max_lease_secs;
        let claim = switchyard_proto::approval::v1::ClaimRequest {
            run_id: run.run_id.clone(),
            worker_id: who.clone(),
            lease_secs: lease,
        };
        let run = match self.claim(claim).await {
            Ok(r) => r,
            // Someone else was first, or it is not due: next round.
            Err(ApprovalError::Transition { .. } | ApprovalError::NotDue { .. }) => {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let submitted = match self.inner.adapters.get(&run.adapter) {
            Ok(a) => a.submit(&run).await,
            Err(e) => Err(e),
        };
        match submitted {
            Ok(s) => {
                self.note_adapter(&run.run_id, &who, "submitted", |r| {
                    r.job_id = s.job_id.clone();
                    r.adapter_state = s.state.clone();
                    r.reason_code.clear();
                    true
                })
                .await?;
            }
            Err(e) => self.adapter_failed(&run, &who, &e, None).await?,
        }
        Ok(true)
    }

    /// Polls a handed-over run; settles it when it ended there.
    async fn follow(&self, run: Run) -> Result<bool, ApprovalError> {
        let who = worker(&run.adapter);
        let adapter = match self.inner.adapters.get(&run.adapter) {
            Ok(a) => a,
            Err(e) => {
                self.adapter_failed(&run, &who, &e, None).await?;
                return Ok(true);
            }
        };
        let polled = match adapter.poll(&run).await {
            Ok(p) => p,
            // Unreachable now: try again next round (the claim is kept).
            Err(e) if e.reason == Reason::AdapterUnreachable => {
                self.keep_claim(&run, &who).await?;
                return Ok(false);
            }
            Err(e) => {
                self.adapter_failed(&run, &who, &e, None).await?;
                return Ok(true);
            }
        };
        match polled.state {
            State::Running => {
                if polled.detail != run.adapter_state {
                    let detail = polled.detail.clone();
                    // Only over the state this poll started from: a cancel
                    // recorded meanwhile is not undone by a stale answer.
                    self.note_adapter(&run.run_id, &who, "adapter_state", |r| {
                        let unchanged = r.adapter_state == run.adapter_state;
                        if unchanged {
                            r.adapter_state.clone_from(&detail);
                        }
                        unchanged
                    })
                    .await?;
                }
                self.keep_claim(&run, &who).await?;
                Ok(false)
            }
            State::Completed => {
                let fetched = match adapter.fetch_artifacts(&run).await {
                    Ok(f) => f,
                    Err(e) => {
                        self.adapter_failed(&run, &who, &e, None).await?;
                        return Ok(true);
                    }
                };
                let result = match self.keep_fetched(&run, &fetched).await {
                    Ok(r) => r,
                    Err(ApprovalError::ArtifactRefused(r)) => {
                        let e = AdapterError {
                            reason: r.reason,
                            message: r.message,
                        };
                        self.adapter_failed(&run, &who, &e, None).await?;
                        return Ok(true);
                    }
                    Err(e) => return Err(e),
                };
                let done = switchyard_proto::approval::v1::CompleteRequest {
                    run_id: run.run_id.clone(),
                    worker_id: who,
                    result: Some(result),
                };
                self.complete(done).await?;
                Ok(true)
            }
            State::Failed | State::Cancelled => {
                let e = AdapterError {
                    reason: polled.reason_code.unwrap_or(Reason::AdapterJobFailed),
                    message: format!("the {} job is {}", run.adapter, polled.detail),
                };
                // The state it ended in is kept with the code, whoever
                // records the end first (a cancel here races this poll).
                self.adapter_failed(&run, &who, &e, Some(&polled.detail))
                    .await?;
                Ok(true)
            }
        }
    }

    /// Renews an adapter's claim once half of it has passed.
    async fn keep_claim(&self, run: &Run, who: &str) -> Result<(), ApprovalError> {
        let lease_ms = u64::from(self.inner.cfg.max_lease_secs) * 1000;
        let left = run
            .claim_expires_at
            .as_ref()
            .map_or(0, timestamp_ms)
            .saturating_sub(self.now());
        if left < lease_ms / 2 {
            let req = switchyard_proto::approval::v1::RenewClaimRequest {
                run_id: run.run_id.clone(),
                worker_id: who.to_owned(),
                lease_secs: self.inner.cfg.max_lease_secs,
            };
            self.renew(req).await?;
        }
        Ok(())
    }

    /// Records an adapter's failure: the run fails with the code (not
    /// retried: the same failure would give the same code), and the state
    /// the adapter reported, when it reported one.
    async fn adapter_failed(
        &self,
        run: &Run,
        who: &str,
        e: &AdapterError,
        state: Option<&str>,
    ) -> Result<(), ApprovalError> {
        tracing::warn!(run_id = %run.run_id, adapter = %run.adapter, reason = %e.reason, error = %e.message, "adapter failed");
        let code = e.reason.as_str().to_owned();
        self.note_adapter(&run.run_id, who, "adapter_failed", |r| {
            r.reason_code.clone_from(&code);
            if let Some(s) = state {
                s.clone_into(&mut r.adapter_state);
            }
            true
        })
        .await?;
        let req = switchyard_proto::approval::v1::FailRequest {
            run_id: run.run_id.clone(),
            worker_id: who.to_owned(),
            last_error: e.to_string(),
            retryable: false,
        };
        match self.fail(req).await {
            Ok(_) | Err(ApprovalError::Transition { .. } | ApprovalError::ClaimNotHeld { .. }) => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Changes adapter fields of a run (job id, state, reason code), audited
    /// — only while the adapter's worker `who` holds it running, and only
    /// when `change` says it changed something.
    async fn note_adapter(
        &self,
        run_id: &str,
        who: &str,
        event: &str,
        change: impl Fn(&mut Run) -> bool + Send + Sync,
    ) -> Result<(), ApprovalError> {
        self.mutate(&[run_id], |st| {
            let Some(run) = st.runs.get_mut(run_id) else {
                return Err(ApprovalError::RunNotFound(run_id.to_owned()));
            };
            // Only while the adapter holds the run; and only when `change`
            // changed something.
            let held = status_of(run) == S::Running && run.claimed_by == who;
            if !held || !change(run) {
                return Ok(((), 0));
            }
            let mut run = run.clone();
            let note = Note::new(who, event, run.reason_code.clone())
                .detail("adapter", &run.adapter)
                .detail("job_id", &run.job_id)
                .detail("adapter_state", &run.adapter_state);
            let seq = self.audit_in_place(st, &mut run, note)?;
            Ok(((), seq))
        })
        .await
    }

    /// Stores what an adapter fetched; the run's result binding.
    pub(crate) async fn keep_fetched(
        &self,
        run: &Run,
        fetched: &[Fetched],
    ) -> Result<RunResult, ApprovalError> {
        let news: Vec<NewArtifact> = fetched
            .iter()
            .map(|f| NewArtifact {
                name: f.path.clone(),
                kind: f.kind as i32,
                media_type: f.media_type.clone(),
                content: f.content.clone(),
            })
            .collect();
        self.keep(run, &news, String::new()).await
    }

    /// Checks and stores a run's artifacts (all or none).
    async fn keep(
        &self,
        run: &Run,
        news: &[NewArtifact],
        content: String,
    ) -> Result<RunResult, ApprovalError> {
        let max = self.inner.cfg.artifact_max_bytes;
        // All are checked before any is stored.
        let mut kept = Vec::with_capacity(news.len());
        for n in news {
            let a = artifacts::admit(n, &run.outputs_allowed, max)
                .map_err(ApprovalError::ArtifactRefused)?;
            kept.push((a, n));
        }
        let now = timestamp(self.now());
        let mut out: Vec<Artifact> = Vec::with_capacity(kept.len());
        for (mut a, n) in kept {
            a.artifact_id = self.inner.content.put(&n.content).await?;
            a.path.clone_from(&n.name);
            a.created_at = Some(now);
            out.push(a);
        }
        Ok(artifacts::run_result("", content, &out))
    }

    /// The result of a pasted manual result: the prompt bundle and the
    /// result, both stored as the run's artifacts.
    pub(crate) async fn manual_result(
        &self,
        run: &Run,
        req: &ImportManualResultRequest,
    ) -> Result<RunResult, ApprovalError> {
        let name = if req.name.is_empty() {
            "result.md".to_owned()
        } else {
            req.name.clone()
        };
        if name == "prompt-bundle.json" {
            return Err(invalid(
                "name",
                "prompt-bundle.json is the run's bundle; name the result otherwise",
            ));
        }
        let news = [
            NewArtifact {
                name: "prompt-bundle.json".into(),
                kind: ArtifactKind::File as i32,
                media_type: crate::bundle::CONTENT_TYPE.into(),
                content: crate::bundle::render(run),
            },
            NewArtifact {
                name,
                kind: req.kind,
                media_type: if req.media_type.is_empty() {
                    "text/markdown".into()
                } else {
                    req.media_type.clone()
                },
                content: req.content.clone().into_bytes(),
            },
        ];
        self.keep(run, &news, req.content.clone()).await
    }

    /// One artifact of a run with its content: stored here, or (a job's
    /// run) fetched from the executor.
    pub(crate) async fn run_artifact(
        &self,
        run: &Run,
        path: &str,
    ) -> Result<(Artifact, Vec<u8>), ApprovalError> {
        let not_found = || ApprovalError::ArtifactNotFound {
            run_id: run.run_id.clone(),
            path: path.to_owned(),
        };
        let listed = run
            .result
            .as_ref()
            .map(|r| r.artifacts.as_slice())
            .unwrap_or_default();
        let a = listed
            .iter()
            .find(|a| a.path == path)
            .cloned()
            .ok_or_else(not_found)?;
        if let Some(content) = self.inner.content.get(&a.artifact_id).await? {
            return Ok((a, content));
        }
        let fetched = self
            .inner
            .adapters
            .get(&run.adapter)?
            .fetch_artifacts(run)
            .await?;
        let f = fetched
            .into_iter()
            .find(|f| f.path == path)
            .ok_or_else(not_found)?;
        Ok((a, f.content))
    }

    /// Before a cancel: a run its adapter is running is cancelled there
    /// (best effort: the adapter's answer, or its failure's code, is kept
    /// on the run).
    pub(crate) async fn cancel_at_adapter(&self, run: &Run) {
        let handed = status_of(run) == S::Running && run.claimed_by == worker(&run.adapter);
        if !handed || run.adapter == "manual" {
            return;
        }
        let cancelled = match self.inner.adapters.get(&run.adapter) {
            Ok(a) => a.cancel(run).await,
            Err(e) => Err(e),
        };
        let (state, code) = match cancelled {
            Ok(p) => (p.detail, String::new()),
            Err(e) => (run.adapter_state.clone(), e.reason.as_str().to_owned()),
        };
        let who = worker(&run.adapter);
        let noted = self
            .note_adapter(&run.run_id, &who, "adapter_cancelled", |r| {
                r.adapter_state.clone_from(&state);
                r.reason_code.clone_from(&code);
                true
            })
            .await;
        if let Err(e) = noted {
            tracing::warn!(run_id = %run.run_id, error = %e, "recording an adapter's cancel");
        }
    }
}
