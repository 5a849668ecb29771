//! The RESP door (seed 001 "RESP Protocol Submission"): AGEniX clients —
//! `redis-cli`, any Redis client library — submit job envelopes with
//! `PLAN.SUBMIT <json>` / `JOB.SUBMIT <json>` and follow them with
//! `JOB.STATUS`, `JOB.RESULT` and `JOB.CANCEL`.
//!
//! A connection starts unauthenticated and may only `PING`, `HELLO`,
//! `AUTH` and `QUIT`; `AUTH <token>` (or `AUTH <user> <token>`, or `HELLO 3
//! AUTH <user> <token>`) takes the same API keys and tokens as every gRPC
//! port. Each command then needs the permission its gRPC call needs
//! ([`switchyard_kit::auth::resp_access`]), and runs as the caller
//! ([`crate::caller`]). Commands are answered in order (pipelining), in
//! RESP2 or — after `HELLO 3` — RESP3.

mod commands;
pub mod frame;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use switchyard_kit::auth::authn::Authenticator;
use switchyard_kit::shutdown::Shutdown;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::caller::{Caller, Jobs};
use crate::config::RespConfig;
use frame::{Limits, Reply};

/// What every connection shares.
pub struct Door {
    jobs: Jobs,
    auth: Arc<Authenticator>,
    limits: Limits,
    idle: Option<Duration>,
    max_connections: usize,
    /// Slots for connections that have not authenticated yet.
    unauthenticated: Arc<tokio::sync::Semaphore>,
    auth_timeout: Duration,
    frame_timeout: Duration,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("resp::Door")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Door {
    /// The RESP door over `jobs`.
    pub fn new(
        cfg: &RespConfig,
        max_message_bytes: usize,
        jobs: Jobs,
        auth: Arc<Authenticator>,
    ) -> Door {
        Door {
            jobs,
            auth,
            limits: Limits {
                max_bulk: cfg.max_bulk_bytes.unwrap_or(max_message_bytes),
                max_arguments: cfg.max_arguments,
            },
            idle: (cfg.idle_timeout_secs > 0).then(|| Duration::from_secs(cfg.idle_timeout_secs)),
            max_connections: cfg.max_connections,
            unauthenticated: Arc::new(tokio::sync::Semaphore::new(cfg.max_unauthenticated)),
            auth_timeout: Duration::from_millis(cfg.auth_timeout_ms),
            frame_timeout: Duration::from_millis(cfg.frame_timeout_ms),
            next_id: AtomicU64::new(1),
        }
    }
}

/// Serves connections on `listener` until `shutdown`; then every
/// connection ends after the command it is running, within `drain`.
pub async fn serve(door: Arc<Door>, listener: TcpListener, shutdown: Shutdown, drain: Duration) {
    let permits = Arc::new(tokio::sync::Semaphore::new(door.max_connections));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (sock, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "resp accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.wait() => break,
        };
        let _ = sock.set_nodelay(true);
        // Reap finished connections so the set does not grow.
        while conns.try_join_next().is_some() {}
        let unauthenticated = door.unauthenticated.clone().try_acquire_owned();
        match (permits.clone().try_acquire_owned(), unauthenticated) {
            (Ok(permit), Ok(preauth)) => {
                let door = door.clone();
                let stop = shutdown.clone();
                conns.spawn(async move {
                    let _permit = permit;
                    Conn::new(door, sock, preauth).run(stop).await;
                });
            }
            (Ok(_), Err(_)) => {
                tracing::warn!(%peer, "resp connection refused: too many not yet authenticated");
                conns.spawn(refuse(sock));
            }
            (Err(_), _) => {
                tracing::warn!(%peer, limit = door.max_connections, "resp connection refused: too many");
                conns.spawn(refuse(sock));
            }
        }
    }
    if tokio::time::timeout(drain, async { while conns.join_next().await.is_some() {} })
        .await
        .is_err()
    {
        tracing::warn!("resp drain timed out; closing remaining connections");
        conns.abort_all();
    }
}

/// Answers a connection over the limit as Redis does, and closes it.
async fn refuse(mut sock: TcpStream) {
    let _ = sock
        .write_all(b"-ERR max number of clients reached\r\n")
        .await;
    let _ = sock.shutdown().await;
}

/// One client connection.
pub(crate) struct Conn {
    door: Arc<Door>,
    sock: TcpStream,
    id: u64,
    /// 2 until `HELLO 3`.
    proto: u8,
    caller: Option<Caller>,
    name: Option<String>,
    /// Held until the connection authenticates.
    preauth: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// What to do after a command's reply.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum After {
    Continue,
    Close,
}

impl Conn {
    fn new(door: Arc<Door>, sock: TcpStream, preauth: tokio::sync::OwnedSemaphorePermit) -> Conn {
        let id = door.next_id.fetch_add(1, Ordering::Relaxed);
        Conn {
            door,
            sock,
            id,
            proto: 2,
            caller: None,
            name: None,
            preauth: Some(preauth),
        }
    }

    /// When the next read must have brought something, and what to say if
    /// it did not: the idle limit, the AUTH deadline of a connection not
    /// yet authenticated, and the deadline of a frame begun.
    fn read_deadline(
        &self,
        connected: tokio::time::Instant,
        partial_since: Option<tokio::time::Instant>,
    ) -> Option<(tokio::time::Instant, &'static str)> {
        let now = tokio::time::Instant::now();
        let idle = self.door.idle.map(|d| (now + d, ""));
        let auth = self.caller.is_none().then(|| {
            (
                connected + self.door.auth_timeout,
                "authenticate with AUTH first",
            )
        });
        let frame = partial_since.map(|t| {
            (
                t + self.door.frame_timeout,
                "the command was not completed in time",
            )
        });
        [idle, auth, frame]
            .into_iter()
            .flatten()
            .min_by_key(|(t, _)| *t)
    }

    /// Reads, runs and answers commands until the client leaves, sends
    /// `QUIT` or a malformed frame, idles past the limit, or shutdown.
    async fn run(mut self, shutdown: Shutdown) {
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut out = BytesMut::with_capacity(16 * 1024);
        let connected = tokio::time::Instant::now();
        let mut partial_since = None;
        loop {
            // Every complete command buffered (pipelining), answered in order.
            loop {
                match frame::next(&mut input, self.door.limits) {
                    Ok(Some(args)) if args.is_empty() => {}
                    Ok(Some(args)) => {
                        let (reply, after) = self.command(args).await;
                        reply.encode(self.proto, &mut out);
                        if after == After::Close {
                            let _ = self.sock.write_all(&out).await;
                            let _ = self.sock.shutdown().await;
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, conn = self.id, "resp protocol error");
                        Reply::error("ERR", &format!("Protocol error: {e}"))
                            .encode(self.proto, &mut out);
                        let _ = self.sock.write_all(&out).await;
                        let _ = self.sock.shutdown().await;
                        return;
                    }
                }
            }
            if !out.is_empty() {
                if self.sock.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
            }
            if self.caller.is_some() {
                self.preauth = None;
            }
            // Whatever is left in the buffer is a frame begun.
            partial_since = match (input.is_empty(), partial_since) {
                (true, _) => None,
                (false, since) => Some(since.unwrap_or_else(tokio::time::Instant::now)),
            };
            input.reserve(16 * 1024);
            let deadline = self.read_deadline(connected, partial_since);
            let sock = &mut self.sock;
            let read = async {
                match deadline {
                    Some((at, _)) => tokio::time::timeout_at(at, sock.read_buf(&mut input))
                        .await
                        .ok(),
                    None => Some(sock.read_buf(&mut input).await),
                }
            };
            let read = tokio::select! {
                r = read => r,
                _ = shutdown.wait() => return,
            };
            match read {
                Some(Ok(n)) if n > 0 => {}
                // Past a deadline: say which, when it is not plain idleness.
                None => {
                    if let Some((_, why)) = deadline.filter(|(_, why)| !why.is_empty()) {
                        Reply::error("ERR", &format!("timed out: {why}"))
                            .encode(self.proto, &mut out);
                        let _ = self.sock.write_all(&out).await;
                    }
                    let _ = self.sock.shutdown().await;
                    return;
                }
                // Closed or failed.
                _ => return,
            }
        }
    }
}
