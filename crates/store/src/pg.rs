//! The PostgreSQL backend: a connection pool, versioned migrations and
//! lease rows, for services that run as several replicas on one database.
//!
//! Only PostgreSQL-compatible SQL is used, so CockroachDB stays possible:
//! row locks (`FOR UPDATE`), conditional `UPDATE … RETURNING`, lease rows
//! with fencing tokens instead of advisory locks, sequences, and a retry of
//! whole transactions on serialization failures and deadlocks
//! ([`retryable`]).
//!
//! The client is tokio-postgres with a deadpool pool: statements are
//! prepared once per pooled connection and cached, and independent queries
//! of one transaction are pipelined. (sqlx measured more overhead per query
//! on hot paths, and its checked queries need a database at build time.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::StoreError;

/// `[storage]` settings of the PostgreSQL backend.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgConfig {
    /// `postgres://user@host:port/db?…` (a password here is accepted, and
    /// shown as `***` by `--dump-config`; prefer `url_env` or `url_file`).
    #[serde(serialize_with = "redacted_url")]
    pub url: String,
    /// Environment variable holding the URL (wins over `url`).
    pub url_env: Option<String>,
    /// File holding the URL, e.g. a mounted Secret (wins over `url`).
    pub url_file: Option<PathBuf>,
    /// Connections in the pool of each service.
    pub pool_size: usize,
    /// `disable`, or `verify`: TLS with the server's certificate checked
    /// against `ca_file`.
    pub tls: TlsMode,
    /// PEM file of the certificate authority that signed the server's
    /// certificate (with `tls = "verify"`).
    pub ca_file: Option<PathBuf>,
    /// Time to wait for a connection (new or from the pool), ms.
    pub connect_timeout_ms: u64,
    /// Longest a statement may run, ms: a transaction holding row locks
    /// cannot stall every other replica for longer.
    pub statement_timeout_ms: u64,
}

impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &redact(&self.url))
            .field("url_env", &self.url_env)
            .field("url_file", &self.url_file)
            .field("pool_size", &self.pool_size)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            url_env: None,
            url_file: None,
            pool_size: 16,
            tls: TlsMode::Disable,
            ca_file: None,
            connect_timeout_ms: 5_000,
            statement_timeout_ms: 10_000,
        }
    }
}

/// TLS to the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plain TCP (or a unix socket).
    #[default]
    Disable,
    /// TLS, the server's certificate verified against `ca_file`.
    Verify,
}

/// `url` with any password replaced by `***`.
pub fn redact(url: &str) -> String {
    // postgres://user:password@host/… — the password runs from the first
    // ':' after the scheme to the last '@' of the authority.
    let Some(rest_at) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[rest_at..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &url[..rest_at],
            &authority[..colon],
            &rest[at..]
        ),
        _ => url.to_owned(),
    }
}

fn redacted_url<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&redact(url))
}

impl PgConfig {
    /// The URL from `url_env`, `url_file` or `url`, in that order.
    pub fn resolved_url(&self) -> Result<String, String> {
        if let Some(var) = &self.url_env {
            return std::env::var(var)
                .map_err(|_| format!("storage.postgres.url_env: ${var} is not set"));
        }
        if let Some(path) = &self.url_file {
            return std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .map_err(|e| format!("storage.postgres.url_file {}: {e}", path.display()));
        }
        if self.url.is_empty() {
            return Err("storage.postgres: set url, url_env or url_file".into());
        }
        Ok(self.url.clone())
    }

    /// Checks the settings without connecting.
    pub fn validate(&self) -> Result<(), String> {
        if self.pool_size == 0 || self.pool_size > 1024 {
            return Err("storage.postgres.pool_size must be 1-1024".into());
        }
        if self.tls == TlsMode::Verify && self.ca_file.is_none() {
            return Err("storage.postgres.tls = \"verify\" needs ca_file".into());
        }
        // The URL of url_env or url_file is read when connecting (it is a
        // secret the process may only have at run time).
        if self.url_env.is_none() && self.url_file.is_none() {
            if self.url.is_empty() {
                return Err("storage.postgres: set url, url_env or url_file".into());
            }
            self.url
                .parse::<tokio_postgres::Config>()
                .map_err(|e| format!("storage.postgres.url {}: {e}", redact(&self.url)))?;
        }
        Ok(())
    }
}

/// A pool of connections to one PostgreSQL database.
#[derive(Clone)]
pub struct Pg {
    pool: deadpool_postgres::Pool,
    /// Where the pool connects, password hidden (for errors and logs).
    target: Arc<str>,
    /// How to open a connection of its own (LISTEN needs one).
    direct: Arc<Direct>,
}

/// A connection's settings, for connections outside the pool.
struct Direct {
    config: tokio_postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pg").field("target", &self.target).finish()
    }
}

/// A pooled connection.
pub type Client = deadpool_postgres::Object;

impl Pg {
    /// Builds the pool and checks that the database answers.
    pub async fn connect(cfg: &PgConfig) -> Result<Pg, StoreError> {
        cfg.validate().map_err(StoreError::Io)?;
        let url = cfg.resolved_url().map_err(StoreError::Io)?;
        let target: Arc<str> = redact(&url).into();
        let mut pc: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Io(format!("storage.postgres.url {target}: {e}")))?;
        pc.connect_timeout(Duration::from_millis(cfg.connect_timeout_ms));
        pc.options(format!(
            "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            cfg.statement_timeout_ms,
            cfg.statement_timeout_ms.saturating_mul(3)
        ));
        if pc.get_application_name().is_none() {
            pc.application_name("switchyard");
        }
        let manager_cfg = deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        };
        let (manager, tls) = match cfg.tls {
            TlsMode::Disable => (
                deadpool_postgres::Manager::from_config(
                    pc.clone(),
                    tokio_postgres::NoTls,
                    manager_cfg,
                ),
                None,
            ),
            TlsMode::Verify => {
                let tls = tls_connector(cfg.ca_file.as_deref())?;
                (
                    deadpool_postgres::Manager::from_config(pc.clone(), tls.clone(), manager_cfg),
                    Some(tls),
                )
            }
        };
        let direct = Arc::new(Direct { config: pc, tls });
        let timeout = Some(Duration::from_millis(cfg.connect_timeout_ms));
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(cfg.pool_size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(timeout)
            .create_timeout(timeout)
            .recycle_timeout(timeout)
            .build()
            .map_err(|e| StoreError::Io(format!("postgres pool for {target}: {e}")))?;
        let pg = Pg {
            pool,
            target,
            direct,
        };
        pg.client()
            .await?
            .simple_query("SELECT 1")
            .await
            .map_err(|e| pg.error("connecting", &e))?;
        Ok(pg)
    }

    /// Where the pool connects, password hidden.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Starts a read-only repeatable-read transaction on `c`: one
    /// snapshot of the database for a reader that checks several tables
    /// against each other (a row committed meanwhile is in all or none).
    pub async fn snapshot<'c>(
        &self,
        c: &'c mut Client,
    ) -> Result<deadpool_postgres::Transaction<'c>, tokio_postgres::Error> {
        c.build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
    }

    /// A connection from the pool.
    pub async fn client(&self) -> Result<Client, StoreError> {
        self.pool.get().await.map_err(|e| {
            StoreError::Io(format!(
                "postgres at {} is unreachable ({e}); check storage.postgres.url and that the database is up",
                self.target
            ))
        })
    }

    /// A storage error for a failed statement, naming what was being done.
    pub fn error(&self, doing: &str, e: &tokio_postgres::Error) -> StoreError {
        let detail = match e.as_db_error() {
            Some(db) => format!("{} ({})", db.message(), db.code().code()),
            None => e.to_string(),
        };
        StoreError::Io(format!("postgres at {}: {doing}: {detail}", self.target))
    }

    /// How a statement of a transaction failed: worth running the whole
    /// transaction again ([`retryable`]), or not.
    pub fn tx_error(&self, doing: &str, e: &tokio_postgres::Error) -> TxError {
        let err = self.error(doing, e);
        if retryable(e) {
            TxError::Retry(err)
        } else {
            TxError::Fatal(err)
        }
    }

    /// Applies `migrations` of `service` that this database has not seen,
    /// in order, each in its own transaction with its version row. Safe to
    /// run from several replicas at once: the second to insert a version
    /// row waits for the first's transaction and then skips that version.
    /// Returns how many this call applied.
    pub async fn migrate(
        &self,
        service: &str,
        migrations: &[Migration],
    ) -> Result<usize, StoreError> {
        let mut c = self.client().await?;
        // Two replicas creating the table at once can collide in the
        // catalogue; the loser finds it there on the next try.
        for attempt in 0.. {
            match c
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS switchyard_migrations (
                        service TEXT NOT NULL,
                        version INT NOT NULL,
                        name TEXT NOT NULL,
                        applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                        PRIMARY KEY (service, version))",
                )
                .await
            {
                Ok(()) => break,
                Err(e) if attempt < 3 => {
                    tracing::debug!(error = %e, "creating switchyard_migrations again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(self.error("creating switchyard_migrations", &e)),
            }
        }
        let mut applied = 0;
        for m in migrations {
            let tx = c
                .transaction()
                .await
                .map_err(|e| self.error("starting a migration", &e))?;
            let fresh = tx
                .query(
                    "INSERT INTO switchyard_migrations (service, version, name) VALUES ($1, $2, $3)
                     ON CONFLICT (service, version) DO NOTHING RETURNING version",
                    &[&service, &m.version, &m.name],
                )
                .await
                .map_err(|e| self.error("recording a migration", &e))?;
            if fresh.is_empty() {
                continue;
            }
            tx.batch_execute(m.sql).await.map_err(|e| {
                self.error(
                    &format!("migration {service} {} ({})", m.version, m.name),
                    &e,
                )
            })?;
            tx.commit()
                .await
                .map_err(|e| self.error("committing a migration", &e))?;
            tracing::info!(
                service,
                version = m.version,
                name = m.name,
                "migration applied"
            );
            applied += 1;
        }
        Ok(applied)
    }

    /// Applies the tables every service relies on ([`COMMON_MIGRATIONS`]),
    /// then `service`'s own; returns how many this call applied.
    pub async fn migrate_service(
        &self,
        service: &str,
        migrations: &[Migration],
    ) -> Result<usize, StoreError> {
        Ok(self.migrate("switchyard", COMMON_MIGRATIONS).await?
            + self.migrate(service, migrations).await?)
    }

    /// Takes or renews lease `name` for `holder` until `now_ms + ttl_ms`,
    /// if it is free, lapsed, or already `holder`'s. Returns the fencing
    /// token: it grows every time the lease changes hands, so work fenced on
    /// it (see [`Pg::holds`]) is refused once another holder took over.
    pub async fn lease(
        &self,
        name: &str,
        holder: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Option<i64>, StoreError> {
        let (now, until) = (ms(now_ms), ms(now_ms.saturating_add(ttl_ms)));
        // One statement: the first holder creates the row; later takers
        // update it only when it is theirs or lapsed (no row back: held).
        let row = self
            .client()
            .await?
            .query_opt(
                "INSERT INTO switchyard_leases AS l (name, holder, token, expires_ms)
                 VALUES ($1, $2, 1, $4)
                 ON CONFLICT (name) DO UPDATE
                 SET token = CASE WHEN l.holder = $2 THEN l.token ELSE l.token + 1 END,
                     holder = $2, expires_ms = $4
                 WHERE l.holder = $2 OR l.expires_ms < $3
                 RETURNING token",
                &[&name, &holder, &now, &until],
            )
            .await
            .map_err(|e| self.error("taking a lease", &e))?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Inside `tx`: true while `holder` still holds lease `name` with
    /// `token` (the row is locked until `tx` ends, so it cannot change hands
    /// before the fenced work commits).
    pub async fn holds(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        name: &str,
        holder: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        let row = tx
            .query_opt(
                "SELECT 1 FROM switchyard_leases WHERE name = $1 AND holder = $2 AND token = $3 FOR UPDATE",
                &[&name, &holder, &token],
            )
            .await
            .map_err(|e| self.error("checking a lease", &e))?;
        Ok(row.is_some())
    }
}

impl Pg {
    /// Notifications on `channels` (their payloads), from a connection of
    /// its own, reconnecting after a failure; after each (re)connect it
    /// sends [`RESYNC`] (notifications may have been missed meanwhile, so
    /// listeners look again). Ends when the receiver is dropped. Listeners
    /// must still poll now and then: a database without LISTEN (CockroachDB)
    /// never notifies, and that is not an error here.
    pub fn listen(&self, channels: &[&str]) -> tokio::sync::mpsc::Receiver<String> {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let sql: String = channels
            .iter()
            .map(|c| format!("LISTEN {c};"))
            .collect::<Vec<_>>()
            .join(" ");
        let db = self.clone();
        tokio::spawn(async move {
            while !tx.is_closed() {
                match db.listen_once(&sql, &tx).await {
                    Ok(()) => return,
                    Err(e) => tracing::debug!(error = %e, "postgres notifications interrupted"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        rx
    }

    /// One connection's worth of [`Pg::listen`]: `Ok` once the receiver is gone.
    async fn listen_once(
        &self,
        sql: &str,
        tx: &tokio::sync::mpsc::Sender<String>,
    ) -> Result<(), StoreError> {
        let (msgs_tx, mut msgs) = tokio::sync::mpsc::unbounded_channel();
        let fail = |e: tokio_postgres::Error| self.error("listening for notifications", &e);
        let config = &self.direct.config;
        let client = match &self.direct.tls {
            None => open_direct(config, tokio_postgres::NoTls, msgs_tx).await,
            Some(tls) => open_direct(config, tls.clone(), msgs_tx).await,
        }
        .map_err(fail)?;
        client.batch_execute(sql).await.map_err(fail)?;
        if tx.send(RESYNC.to_owned()).await.is_err() {
            return Ok(());
        }
        loop {
            tokio::select! {
                m = msgs.recv() => match m {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                        if tx.send(n.payload().to_owned()).await.is_err() {
                            return Ok(());
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(fail(e)),
                    None => return Err(StoreError::Io("the notification connection closed".into())),
                },
                _ = tx.closed() => return Ok(()),
            }
        }
    }
}

/// A connection outside the pool whose messages (notifications) go to `out`.
async fn open_direct<T>(
    config: &tokio_postgres::Config,
    tls: T,
    out: tokio::sync::mpsc::UnboundedSender<
        Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>,
    >,
) -> Result<tokio_postgres::Client, tokio_postgres::Error>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    use futures_util::StreamExt;
    let (client, mut conn) = config.connect(tls).await?;
    tokio::spawn(async move {
        let mut s = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(m) = s.next().await {
            if out.send(m).is_err() {
                return;
            }
        }
    });
    Ok(client)
}

/// What [`Pg::listen`] sends after (re)connecting: look at everything again.
pub const RESYNC: &str = "*";

/// The longest a tailing reader waits at a gap in a log's numbers before
/// taking it for a rolled-back transaction's and moving on, when the
/// database cannot say sooner (no `pg_current_snapshot`, e.g. CockroachDB).
pub const GAP_GRACE: Duration = Duration::from_secs(5);
/// The least a tailing reader waits at a gap even when every transaction
/// that was running when it met the gap has ended: a transaction takes its
/// number a moment before it has an id the snapshot can show.
pub const GAP_MIN: Duration = Duration::from_millis(200);
/// How often a tailing reader looks for new rows.
pub const TAIL_POLL: Duration = Duration::from_millis(50);

/// A log table's rows after `after`, in order, as they commit, forever (drop
/// the stream to stop). `query` takes the last sequence seen as `$1` and
/// returns up to a page of `(seq BIGINT, data BYTEA)` rows in sequence
/// order, `data` NULL for a number that was taken but holds nothing.
///
/// Numbers come from a sequence and are taken before commit, so a reader
/// meets a gap while a transaction is in flight: it waits there (polling)
/// until the gap fills, or until every transaction that was running when it
/// met the gap has ended (the database's snapshot, taken [`GAP_MIN`] after
/// it met the gap, says so; then the number belongs to a rolled-back or
/// crashed transaction and never fills); only a database without snapshots
/// moves on by time ([`GAP_GRACE`]). It never skips a number a transaction
/// still running may fill. Polling, not LISTEN: CockroachDB has none.
pub fn tail(
    db: Pg,
    query: &'static str,
    after: u64,
) -> futures_util::stream::BoxStream<'static, Result<(u64, Vec<u8>), StoreError>> {
    use futures_util::StreamExt;
    let state = (
        i64::try_from(after).unwrap_or(i64::MAX),
        None::<(tokio::time::Instant, Option<Option<String>>)>,
        std::collections::VecDeque::<(u64, Vec<u8>)>::new(),
    );
    futures_util::stream::unfold(state, move |(mut after, mut gap_since, mut ready)| {
        let db = db.clone();
        async move {
            loop {
                if let Some(row) = ready.pop_front() {
                    return Some((Ok(row), (after, gap_since, ready)));
                }
                let rows = match db.client().await {
                    Ok(c) => c
                        .query(query, &[&after])
                        .await
                        .map_err(|e| db.error("tailing a log", &e)),
                    Err(e) => Err(e),
                };
                let rows = match rows {
                    Ok(rows) => rows,
                    Err(e) => {
                        // The caller sees the error; the next poll tries again.
                        tokio::time::sleep(TAIL_POLL).await;
                        return Some((Err(e), (after, gap_since, ready)));
                    }
                };
                for row in rows {
                    let seq: i64 = row.get(0);
                    if seq != after + 1 {
                        let (since, xmax) = gap_since
                            .clone()
                            .unwrap_or((tokio::time::Instant::now(), None));
                        let waited = since.elapsed();
                        // The snapshot's xmax is taken once GAP_MIN has
                        // passed (by then whatever took a number in the gap
                        // has an id below it); from then on the gap passes
                        // only when every transaction below it has ended —
                        // never on time alone where the database can say.
                        let (xmax, settled) = match xmax {
                            _ if waited < GAP_MIN => (None, false),
                            None => (Some(snapshot_xmax(&db).await), false),
                            Some(Some(x)) => {
                                let ended = all_ended_before(&db, &x).await;
                                (Some(Some(x)), ended)
                            }
                            Some(None) => (Some(None), waited >= GAP_GRACE),
                        };
                        gap_since = Some((since, xmax));
                        if !settled {
                            break;
                        }
                        tracing::warn!(
                            from = after + 1,
                            to = seq - 1,
                            waited_ms = waited.as_millis() as u64,
                            "log numbers never committed; moving on"
                        );
                    }
                    gap_since = None;
                    after = seq;
                    if let Some(data) = row.get::<_, Option<Vec<u8>>>(1) {
                        ready.push_back((seq as u64, data));
                    }
                }
                if ready.is_empty() {
                    tokio::time::sleep(TAIL_POLL).await;
                }
            }
        }
    })
    .boxed()
}

/// The first transaction id not yet given out (`pg_current_snapshot`'s
/// xmax), as text; `None` where the database has no snapshots to ask.
async fn snapshot_xmax(db: &Pg) -> Option<String> {
    let c = db.client().await.ok()?;
    let row = c
        .query_one("SELECT pg_snapshot_xmax(pg_current_snapshot())::text", &[])
        .await
        .ok()?;
    row.try_get::<_, String>(0).ok()
}

/// Whether every transaction with an id below `xmax` has ended (the oldest
/// one still running is at or past it).
async fn all_ended_before(db: &Pg, xmax: &str) -> bool {
    let Ok(c) = db.client().await else {
        return false;
    };
    c.query_one(
        "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::text::xid8",
        &[&xmax],
    )
    .await
    .ok()
    .and_then(|r| r.try_get::<_, bool>(0).ok())
    .unwrap_or(false)
}

/// A millisecond count as a BIGINT.
pub fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One schema change of one service.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Order of application, from 1.
    pub version: i32,
    /// What it does, for the log and the table.
    pub name: &'static str,
    /// The statements.
    pub sql: &'static str,
}

/// Tables every service's migrations may rely on (applied as service
/// `switchyard`).
pub const COMMON_MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "lease rows",
    sql: "CREATE TABLE IF NOT EXISTS switchyard_leases (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            token BIGINT NOT NULL,
            expires_ms BIGINT NOT NULL)",
}];

/// How a transaction failed.
#[derive(Debug)]
pub enum TxError {
    /// Running it again whole may succeed (serialization failure,
    /// deadlock, a key another replica inserted first).
    Retry(StoreError),
    /// It will not.
    Fatal(StoreError),
}

/// Whether a failed transaction may simply be run again: a serialization
/// failure, a deadlock, or a unique key another transaction inserted first
/// (the retry then sees that row).
pub fn retryable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE
            || *c == SqlState::T_R_DEADLOCK_DETECTED
            || *c == SqlState::UNIQUE_VIOLATION
    })
}

fn tls_connector(
    ca_file: Option<&std::path::Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    let path = ca_file.ok_or_else(|| StoreError::Io("tls = \"verify\" needs ca_file".into()))?;
    let pem = std::fs::read(path)
        .map_err(|e| StoreError::Io(format!("storage.postgres.ca_file {}: {e}", path.display())))?;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| {
            StoreError::Io(format!("storage.postgres.ca_file {}: {e}", path.display()))
        })?;
        roots.add(cert).map_err(|e| {
            StoreError::Io(format!("storage.postgres.ca_file {}: {e}", path.display()))
        })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Io(format!("tls to postgres: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_the_url_never_reaches_the_dump_or_debug() {
        let cfg = PgConfig {
            url: "postgres://app:s3cret@db.internal:5432/switchyard?sslmode=disable".into(),
            ..Default::default()
        };
        assert_eq!(
            redact(&cfg.url),
            "postgres://app:***@db.internal:5432/switchyard?sslmode=disable"
        );
        assert!(!format!("{cfg:?}").contains("s3cret"));
        let dumped = serde_json::to_string(&cfg).unwrap_or_default();
        assert!(dumped.contains("app:***@db.internal") && !dumped.contains("s3cret"));
        // Nothing to hide: unchanged.
        assert_eq!(redact("postgres://app@h/db"), "postgres://app@h/db");
        assert_eq!(redact("host=/tmp port=5"), "host=/tmp port=5");
    }

    #[test]
    fn settings_are_checked_before_connecting() {
        let bad = |c: PgConfig| c.validate().unwrap_err();
        assert!(bad(PgConfig::default()).contains("set url"));
        let url = "postgres://u@localhost/db".to_owned();
        assert!(
            bad(PgConfig {
                url: url.clone(),
                pool_size: 0,
                ..Default::default()
            })
            .contains("pool_size")
        );
        assert!(
            bad(PgConfig {
                url: url.clone(),
                tls: TlsMode::Verify,
                ..Default::default()
            })
            .contains("ca_file")
        );
        assert!(
            PgConfig {
                url,
                ..Default::default()
            }
            .validate()
            .is_ok()
        );
    }
}
