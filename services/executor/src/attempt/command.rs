//! Command attempts: an allowlisted program, started without a shell in the
//! job's scratch directory, inside the sandbox, with the task's resource
//! limits, a clean environment and its output streamed as events. LLM tasks'
//! command tools run the same way ([`Executor::prepare_command`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use switchyard_core::Reason;
use switchyard_proto::executor::v1::{CommandTask, ResourceLimits, TaskStatus};

use super::{Attempt, Outcome};
use crate::Executor;
use crate::command::{self, Confinement, Finished};
use crate::events::{self, JobEvent};
use crate::schedule::{Class, Failure};

/// A command ready to start.
pub(crate) struct Prepared {
    /// The program file (resolved at start-up).
    pub(crate) program: PathBuf,
    /// Its resource limits.
    pub(crate) limits: command::limits::ResourceLimits,
    /// What confines it.
    pub(crate) jail: Confinement,
}

impl Attempt<'_> {
    /// One attempt of a command task.
    pub(crate) async fn command(&self, c: &CommandTask) -> Outcome {
        let (x, snap, timeout, scratch) = (self.x, self.snap, self.timeout, self.scratch);
        let mut args = Vec::with_capacity(c.args.len());
        for a in &c.args {
            match snap.resolve_text(a) {
                Ok(s) => args.push(s),
                Err(e) => return Outcome::fail(Class::Permanent, Reason::TemplateUnresolved, e),
            }
        }
        let Prepared {
            program,
            limits: rlimits,
            jail,
        } = match x.prepare_command(&c.command, scratch, c.limits.as_ref()) {
            Ok(r) => r,
            Err(f) => return Outcome::fail(f.class, f.reason, f.error),
        };
        let cfg = &x.inner.cfg;
        let env = x.command_env(&snap.job_id, &snap.task.id, scratch, &c.env);
        let limits = command::Limits {
            timeout,
            grace: Duration::from_millis(cfg.kill_grace_ms),
            cap: cfg.max_output_bytes,
        };
        let book = x.inner.book.clone();
        let (job, task) = (snap.job_id.clone(), snap.task.id.clone());
        let on_chunk = move |stream: &'static str, chunk: &[u8]| {
            let chunk = String::from_utf8_lossy(chunk).into_owned();
            let out = events::Output {
                stream: stream.to_owned(),
                chunk,
            };
            book.note(&job, &task, JobEvent::Output(out));
        };
        if let Err(e) = x
            .inner
            .book
            .durable_for(&snap.job_id, snap.start_g, snap.lease)
            .await
        {
            return Outcome::fail(Class::Other, Reason::StorageFailure, e.to_string());
        }
        let ran = command::run(
            &program,
            &c.command,
            &args,
            &env,
            scratch,
            snap.stdin.clone(),
            &limits,
            jail,
            &on_chunk,
        )
        .await;
        match ran {
            Ok(f) => self.command_outcome(c, &rlimits, &f),
            Err(e) => Outcome::fail(Class::Other, Reason::CommandFailed, e.to_string()),
        }
    }

    /// What a finished command means: its outputs, and a failure for a
    /// limit hit, a timeout or a non-zero exit.
    fn command_outcome(
        &self,
        c: &CommandTask,
        rlimits: &command::limits::ResourceLimits,
        f: &Finished,
    ) -> Outcome {
        let (snap, timeout) = (self.snap, self.timeout);
        let sandbox = &self.x.inner.sandbox;
        let hit = command::limits::hit(f);
        let status = TaskStatus {
            task_id: snap.task.id.clone(),
            stdout: f.stdout.clone(),
            stderr: f.stderr.clone(),
            exit_code: f.exit_code.or(f.signal.map(|s| 128 + s)),
            output_truncated: f.truncated,
            isolation: sandbox.isolation() as i32,
            isolation_detail: sandbox.detail(&c.command),
            resource_limit: hit.map(|l| l.name().to_owned()).unwrap_or_default(),
            ..Default::default()
        };
        let failure = |class, reason, error| {
            Some(Failure {
                class,
                reason,
                error,
            })
        };
        let failure = if let Some(l) = hit {
            let why = command::limits::describe(&c.command, l, rlimits, f);
            failure(Class::Other, Reason::TaskResourceLimit, why)
        } else if f.timed_out {
            let why = format!(
                "{} timed out after {} s and was stopped",
                c.command,
                timeout.as_secs()
            );
            failure(Class::Timeout, Reason::TaskTimeout, why)
        } else if f.exit_code != Some(0) {
            let how = match (f.exit_code, f.signal) {
                (Some(code), _) => format!("exited with code {code}"),
                (None, Some(sig)) => format!("was killed by signal {sig}"),
                _ => "ended abnormally".to_owned(),
            };
            let why = format!("{} {how}{}", c.command, stderr_tail(&f.stderr));
            failure(Class::Other, Reason::CommandFailed, why)
        } else {
            None
        };
        Outcome {
            failure,
            status: Some(status),
            settled: None,
        }
    }
}

impl Executor {
    /// An allowlisted command made ready to start: its program as resolved
    /// at start-up, the task's resource limits, and the sandbox around it.
    pub(crate) fn prepare_command(
        &self,
        command: &str,
        scratch: &Path,
        asked: Option<&ResourceLimits>,
    ) -> Result<Prepared, Failure> {
        let inner = &self.inner;
        let permanent = |reason, e: &dyn std::fmt::Display| Failure {
            class: Class::Permanent,
            reason,
            error: e.to_string(),
        };
        let program = inner.programs.get(command).map_err(|e| {
            let reason = match e {
                command::program::Unrunnable::NotAllowed(_) => Reason::CommandNotAllowed,
                command::program::Unrunnable::Unusable(_) => Reason::CommandFailed,
            };
            permanent(reason, &e)
        })?;
        let limits = inner.cfg.task_limits.for_task(asked);
        let jail = inner
            .sandbox
            .confine(command, program, scratch, &limits)
            .map_err(|e| {
                let reason = match e {
                    command::ConfineError::Unavailable(_) => Reason::SandboxUnavailable,
                    command::ConfineError::Ruleset(_) => Reason::CommandFailed,
                };
                permanent(reason, &e)
            })?;
        Ok(Prepared {
            program: program.path.clone(),
            limits,
            jail,
        })
    }

    /// The whole environment a command sees: the sandbox's base (nothing
    /// inherited), the job and task ids, and the task's own variables.
    pub(crate) fn command_env(
        &self,
        job_id: &str,
        task_id: &str,
        scratch: &Path,
        extra: &std::collections::BTreeMap<String, String>,
    ) -> Vec<(String, String)> {
        let mut env = self.inner.sandbox.base_env(&self.inner.cfg.path, scratch);
        env.extend([
            ("SWITCHYARD_JOB_ID".to_owned(), job_id.to_owned()),
            ("SWITCHYARD_TASK_ID".to_owned(), task_id.to_owned()),
        ]);
        let mut extra: Vec<_> = extra.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        extra.sort();
        env.extend(extra);
        env
    }
}

/// The end of a command's stderr, for its error message.
fn stderr_tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[b.len().saturating_sub(500)..])
        .trim()
        .to_owned();
    if s.is_empty() {
        String::new()
    } else {
        format!(": {s}")
    }
}
