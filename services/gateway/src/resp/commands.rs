//! The RESP commands: the handshake (`PING`, `HELLO`, `AUTH`, `QUIT`,
//! `CLIENT`) and AGEniX's job verbs, each answered as seed 001 shows
//! (`+OK job_id=<id>`, `-ERR <the validation message>`).

use bytes::Bytes;
use switchyard_kit::auth::{Access, AuthError};
use switchyard_kit::context::RequestContext;
use switchyard_proto::executor::v1::{Job, JobState, SubmitJobRequest};
use tonic::{Code, Status};
use tracing::Instrument as _;

use super::frame::Reply;
use super::{After, Conn};
use crate::caller::authenticate_token;
use crate::http::{job_state_name, task_state_name};

/// Redis's answer to a command before `AUTH`.
const NOAUTH: &str = "Authentication required.";

impl Conn {
    /// Runs one command (`args[0]` is the verb).
    pub(crate) async fn command(&mut self, args: Vec<Bytes>) -> (Reply, After) {
        let verb = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let access = switchyard_kit::auth::resp_access(&verb);
        let correlation_id = switchyard_kit::context::new_correlation_id();
        let span = tracing::info_span!(
            "resp",
            otel.name = %format_args!("gateway.resp {}", if access == Access::Unknown { "unknown" } else { verb.as_str() }),
            otel.kind = "server",
            correlation_id = %correlation_id,
            conn = self.id,
            principal = tracing::field::Empty,
        );
        if let Some(c) = &self.caller {
            span.record("principal", tracing::field::display(&c.principal.subject));
        }
        let ctx = RequestContext {
            correlation_id,
            traceparent: None,
            principal: self.caller.as_ref().map(|c| c.principal.clone()),
        };
        let run = self.dispatch(&verb, access, &args[1..]);
        switchyard_kit::context::scope(ctx, run)
            .instrument(span)
            .await
    }

    async fn dispatch(&mut self, verb: &str, access: Access, args: &[Bytes]) -> (Reply, After) {
        match verb {
            "PING" => return (ping(args), After::Continue),
            "QUIT" => return (Reply::Simple("OK".into()), After::Close),
            "AUTH" => return (self.auth(args).await, After::Continue),
            "HELLO" => return (self.hello(args).await, After::Continue),
            _ => {}
        }
        let Some(caller) = self.caller.clone() else {
            return (Reply::error("NOAUTH", NOAUTH), After::Continue);
        };
        if access == Access::Unknown {
            return (unknown(verb, args), After::Continue);
        }
        if let Err(e) = caller.principal.allowed(access, verb) {
            return (auth_error(&e), After::Continue);
        }
        let reply = match (verb, args) {
            ("CLIENT", _) => self.client(args),
            ("PLAN.SUBMIT" | "JOB.SUBMIT", [doc]) => self.submit(&caller, doc).await,
            ("JOB.STATUS", [id]) => match self.door.jobs.get(&caller, &text(id)).await {
                Ok(job) => status(&job),
                Err(s) => status_error(&s),
            },
            ("JOB.RESULT", [id]) => self.result(&caller, &text(id)).await,
            ("JOB.CANCEL", [id, reason @ ..]) if reason.len() <= 1 => {
                let why = reason
                    .first()
                    .map_or_else(|| "cancelled through the RESP door".to_owned(), text);
                match self.door.jobs.cancel(&caller, &text(id), &why).await {
                    Ok(_) => Reply::Simple("OK".into()),
                    Err(s) => status_error(&s),
                }
            }
            _ => Reply::error(
                "ERR",
                &format!(
                    "wrong number of arguments for '{}' command",
                    verb.to_ascii_lowercase()
                ),
            ),
        };
        (reply, After::Continue)
    }

    /// `AUTH <token>` or `AUTH <user> <token>` (the user, when not
    /// `default`, must be the token's subject).
    async fn auth(&mut self, args: &[Bytes]) -> Reply {
        let (user, token) = match args {
            [token] => (None, token),
            [user, token] => (Some(text(user)), token),
            _ => return Reply::error("ERR", "wrong number of arguments for 'auth' command"),
        };
        match self.login(user.as_deref(), &text(token)).await {
            Ok(()) => Reply::Simple("OK".into()),
            Err(e) => e,
        }
    }

    async fn login(&mut self, user: Option<&str>, token: &str) -> Result<(), Reply> {
        let caller = authenticate_token(&self.door.auth, token)
            .await
            .map_err(|e| match e {
                AuthError::Invalid | AuthError::Expired | AuthError::Required => Reply::error(
                    "WRONGPASS",
                    "invalid username-password pair or user is disabled.",
                ),
                other => auth_error(&other),
            })?;
        if let Some(u) = user
            && u != "default"
            && u != caller.principal.subject
        {
            return Err(Reply::error(
                "WRONGPASS",
                "invalid username-password pair or user is disabled.",
            ));
        }
        tracing::debug!(subject = %caller.principal.subject, conn = self.id, "resp connection authenticated");
        self.caller = Some(caller);
        Ok(())
    }

    /// `HELLO [protover [AUTH user token] [SETNAME name]]`.
    async fn hello(&mut self, args: &[Bytes]) -> Reply {
        let mut proto = self.proto;
        let mut rest = args;
        if let [v, tail @ ..] = rest {
            match text(v).parse::<u8>() {
                Ok(p @ 2..=3) => proto = p,
                _ => return Reply::error("NOPROTO", "unsupported protocol version"),
            }
            rest = tail;
        }
        let mut name = None;
        while !rest.is_empty() {
            match (text(&rest[0]).to_ascii_uppercase().as_str(), rest) {
                ("AUTH", [_, user, token, tail @ ..]) => {
                    if let Err(e) = self.login(Some(&text(user)), &text(token)).await {
                        return e;
                    }
                    rest = tail;
                }
                ("SETNAME", [_, n, tail @ ..]) => {
                    name = Some(text(n));
                    rest = tail;
                }
                (opt, _) => {
                    return Reply::error(
                        "ERR",
                        &format!(
                            "syntax error in HELLO option '{}'",
                            opt.to_ascii_lowercase()
                        ),
                    );
                }
            }
        }
        self.proto = proto;
        if name.is_some() {
            self.name = name;
        }
        Reply::Map(vec![
            ("server", Reply::text("switchyard")),
            ("version", Reply::text(env!("CARGO_PKG_VERSION"))),
            ("proto", Reply::Int(i64::from(proto))),
            ("id", Reply::Int(self.id as i64)),
            ("mode", Reply::text("standalone")),
            ("role", Reply::text("master")),
            ("modules", Reply::Array(Vec::new())),
        ])
    }

    /// `CLIENT SETNAME|GETNAME|ID|SETINFO`: what client libraries send
    /// after connecting.
    fn client(&mut self, args: &[Bytes]) -> Reply {
        let sub = args
            .first()
            .map(|a| text(a).to_ascii_uppercase())
            .unwrap_or_default();
        match (sub.as_str(), args) {
            ("SETNAME", [_, n]) => {
                self.name = Some(text(n));
                Reply::Simple("OK".into())
            }
            ("GETNAME", [_]) => self.name.clone().map_or(Reply::Null, Reply::text),
            ("ID", [_]) => Reply::Int(self.id as i64),
            ("SETINFO", [_, _, _]) => Reply::Simple("OK".into()),
            _ => Reply::error(
                "ERR",
                &format!(
                    "unknown subcommand or wrong number of arguments for 'client|{}'",
                    sub.to_ascii_lowercase()
                ),
            ),
        }
    }

    /// `PLAN.SUBMIT <json>`: `+OK job_id=<id>`, or `-ERR <why>` with the
    /// seed's validation text.
    async fn submit(&mut self, caller: &crate::caller::Caller, doc: &Bytes) -> Reply {
        let Ok(document) = String::from_utf8(doc.to_vec()) else {
            return Reply::error("ERR", "Invalid job: the envelope is not valid UTF-8 JSON");
        };
        let req = SubmitJobRequest {
            document,
            format: "agenix".into(),
            ..Default::default()
        };
        match self.door.jobs.submit(caller, req).await {
            Ok(out) => {
                let id = out
                    .job
                    .and_then(|j| j.spec)
                    .map(|s| s.job_id)
                    .unwrap_or_default();
                Reply::Simple(format!("OK job_id={id}"))
            }
            Err(s) => status_error(&s),
        }
    }

    /// `JOB.RESULT <id>`: every task's outcome once the job has finished.
    async fn result(&mut self, caller: &crate::caller::Caller, id: &str) -> Reply {
        let r = match self.door.jobs.result(caller, id).await {
            Ok(r) => r,
            Err(s) => return status_error(&s),
        };
        let state = JobState::try_from(r.state).unwrap_or(JobState::Unspecified);
        if !crate::http::finished(state) {
            return status_error(&crate::http::not_finished(id, state));
        }
        let tasks = r
            .tasks
            .iter()
            .map(|t| {
                let mut m = vec![("task_id", Reply::text(t.task_id.clone()))];
                if let Some(n) = t
                    .task_id
                    .strip_prefix("task_")
                    .and_then(|n| n.parse::<i64>().ok())
                {
                    m.push(("task_number", Reply::Int(n)));
                }
                m.extend([
                    ("state", Reply::text(task_state_name(t.state))),
                    (
                        "exit_code",
                        t.exit_code
                            .map_or(Reply::Null, |c| Reply::Int(i64::from(c))),
                    ),
                    ("stdout", Reply::Bulk(Bytes::from(t.stdout.clone()))),
                    ("stderr", Reply::Bulk(Bytes::from(t.stderr.clone()))),
                    ("reason", Reply::text(t.reason.clone())),
                    ("error", Reply::text(t.error.clone())),
                ]);
                Reply::Map(m)
            })
            .collect();
        Reply::Map(vec![
            ("job_id", Reply::text(r.job_id.clone())),
            ("state", Reply::text(job_state_name(r.state))),
            ("reason", Reply::text(r.reason.clone())),
            ("error", Reply::text(r.error.clone())),
            ("execution_time_ms", Reply::Int(r.execution_time_ms as i64)),
            ("tasks", Reply::Array(tasks)),
        ])
    }
}

/// `JOB.STATUS`: state and progress.
fn status(job: &Job) -> Reply {
    let progress = job.progress.unwrap_or_default();
    let tasks = job
        .tasks
        .iter()
        .map(|t| {
            Reply::Map(vec![
                ("task_id", Reply::text(t.task_id.clone())),
                ("state", Reply::text(task_state_name(t.state))),
            ])
        })
        .collect();
    Reply::Map(vec![
        ("job_id", Reply::text(crate::http::job_id(job))),
        ("state", Reply::text(job_state_name(job.state))),
        ("reason", Reply::text(job.reason.clone())),
        ("error", Reply::text(job.error.clone())),
        ("tasks_done", Reply::Int(i64::from(progress.current_step))),
        ("tasks_total", Reply::Int(i64::from(progress.total_steps))),
        (
            "percent_complete",
            Reply::Int(i64::from(progress.percent_complete)),
        ),
        (
            "cost_micro_usd",
            Reply::Int(job.cost_so_far.map_or(0, |m| m.micro_usd)),
        ),
        ("tokens_used", Reply::Int(job.tokens_used as i64)),
        ("run_id", Reply::text(job.run_id.clone())),
        ("tasks", Reply::Array(tasks)),
    ])
}

fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ping(args: &[Bytes]) -> Reply {
    match args {
        [] => Reply::Simple("PONG".into()),
        [msg] => Reply::Bulk(msg.clone()),
        _ => Reply::error("ERR", "wrong number of arguments for 'ping' command"),
    }
}

/// Redis's answer to a command it does not know.
fn unknown(verb: &str, args: &[Bytes]) -> Reply {
    let shown: Vec<String> = args
        .iter()
        .take(3)
        .map(|a| format!("'{}'", switchyard_core::validate::clamp(&text(a), 40)))
        .collect();
    Reply::error(
        "ERR",
        &format!(
            "unknown command '{}', with args beginning with: {}",
            switchyard_core::validate::clamp(verb, 40),
            shown.join(" ")
        ),
    )
}

/// A refusal by authentication or authorization, as Redis names them.
fn auth_error(e: &AuthError) -> Reply {
    match e {
        AuthError::Denied(_) | AuthError::Unlisted(_) => Reply::error("NOPERM", &e.to_string()),
        AuthError::Required => Reply::error("NOAUTH", NOAUTH),
        _ => Reply::error("WRONGPASS", &e.to_string()),
    }
}

/// An executor's refusal as an error line: the status's message (the
/// seed's text for validation), `NOAUTH`/`NOPERM` for identity ones.
fn status_error(s: &Status) -> Reply {
    let code = match s.code() {
        Code::Unauthenticated => "NOAUTH",
        Code::PermissionDenied => "NOPERM",
        _ => "ERR",
    };
    Reply::error(code, s.message())
}
