//! Throwaway PostgreSQL clusters for tests and benchmarks, from the
//! machine's own PostgreSQL binaries (Debian's `postgresql-15`: the
//! directory `pg_config --bindir` prints). Nothing is downloaded.
//!
//! [`PgCluster::start`] runs `initdb` into a temporary directory (as the
//! `postgres` user when this process is root: `initdb` refuses root), then
//! `pg_ctl start` listening on 127.0.0.1 at a free port with its unix socket
//! in the same directory. [`PgCluster::database`] hands each test a database
//! of its own. The cluster stops when dropped, and a watchdog stops it if
//! the test process dies first, so no server outlives its tests.
//!
//! Where PostgreSQL is not installed, [`PgCluster::start`] fails with a
//! message saying how to install it, unless `SWITCHYARD_PG=skip` asks the
//! suites to skip (`make test` sets it, and says so, when it cannot install
//! PostgreSQL): a missing database is never a silent pass.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, bail};

/// A running throwaway cluster.
pub struct PgCluster {
    dir: Option<tempfile::TempDir>,
    bindir: PathBuf,
    port: u16,
    as_postgres: bool,
    watchdog: Option<std::process::Child>,
}

impl std::fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCluster")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// Why there is no cluster to test against.
#[derive(Debug)]
pub enum Unavailable {
    /// `SWITCHYARD_PG=skip`: the caller should skip, saying so.
    Skip(String),
}

/// The directory of PostgreSQL's server binaries, if installed:
/// `SWITCHYARD_PG_BINDIR`, else what `pg_config --bindir` prints (when it
/// holds `initdb`), else the newest `/usr/lib/postgresql/*/bin`.
pub fn bindir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("SWITCHYARD_PG_BINDIR") {
        return Some(PathBuf::from(d));
    }
    let has_initdb = |d: &Path| d.join("initdb").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_initdb(&d) {
            return Some(d);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| has_initdb(d))
        .collect();
    found.sort();
    found.pop()
}

/// `Err(Unavailable::Skip)` when PostgreSQL is absent and the run asked to
/// skip the suites that need it; panics with how to install it when absent
/// and not asked to skip.
pub fn require() -> Result<PathBuf, Unavailable> {
    match bindir() {
        Some(d) => Ok(d),
        None if std::env::var("SWITCHYARD_PG").as_deref() == Ok("skip") => Err(Unavailable::Skip(
            "PostgreSQL is not installed (SWITCHYARD_PG=skip)".into(),
        )),
        None => panic!(
            "PostgreSQL's server binaries are not installed: `apt-get install postgresql` \
             (or set SWITCHYARD_PG_BINDIR); SWITCHYARD_PG=skip skips these suites"
        ),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

static DATABASES: AtomicU32 = AtomicU32::new(0);

impl PgCluster {
    /// Starts a fresh cluster (see the module docs), or says why not.
    pub fn start() -> Result<PgCluster, Unavailable> {
        let bindir = require()?;
        match Self::start_in(bindir) {
            Ok(c) => Ok(c),
            Err(e) => panic!("starting a throwaway PostgreSQL cluster: {e:#}"),
        }
    }

    fn start_in(bindir: PathBuf) -> anyhow::Result<PgCluster> {
        let dir = tempfile::Builder::new()
            .prefix("switchyard-pg-")
            .tempdir()?;
        let as_postgres = is_root();
        if as_postgres {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()?
                .success();
            if !ok {
                bail!("chown of {} to postgres failed", dir.path().display());
            }
        }
        let mut c = PgCluster {
            dir: Some(dir),
            bindir,
            port: free_port()?,
            as_postgres,
            watchdog: None,
        };
        let data = c.data_dir();
        c.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        )?;
        c.start_server()?;
        // Stops the server if this process dies without dropping us.
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop}; rm -rf {root}",
            pid = std::process::id(),
            stop = c.stop_command(),
            root = c.socket_dir(),
        );
        c.watchdog = Some(Command::new("sh").args(["-c", &script]).spawn()?);
        Ok(c)
    }

    fn data_dir(&self) -> String {
        let root = self
            .dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default();
        root.join("data").display().to_string()
    }

    fn socket_dir(&self) -> String {
        let root = self
            .dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default();
        root.display().to_string()
    }

    fn stop_command(&self) -> String {
        let pg_ctl = self.bindir.join("pg_ctl").display().to_string();
        let cmd = format!("{pg_ctl} -D {} stop -m immediate -w", self.data_dir());
        if self.as_postgres {
            format!("runuser -u postgres -- {cmd} >/dev/null 2>&1")
        } else {
            format!("{cmd} >/dev/null 2>&1")
        }
    }

    /// Runs one of PostgreSQL's binaries, as `postgres` when root.
    fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let exe = self.bindir.join(tool);
        let out = if self.as_postgres {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&exe)
                .args(args)
                .output()
        } else {
            Command::new(&exe).args(args).output()
        }
        .with_context(|| format!("running {}", exe.display()))?;
        if !out.status.success() {
            bail!(
                "{tool} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn start_server(&self) -> anyhow::Result<()> {
        let mut opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=300 -c shared_buffers=64MB",
            self.port,
            self.socket_dir()
        );
        // Statement counts for the benchmarks, where the module is installed.
        if self.bindir.join("../lib/pg_stat_statements.so").exists() {
            opts.push_str(" -c shared_preload_libraries=pg_stat_statements");
        }
        let log = format!("{}/server.log", self.socket_dir());
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data_dir(),
                "-l",
                &log,
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
    }

    /// Stops the server at once (like a crash: no checkpoint).
    pub fn kill(&self) -> anyhow::Result<()> {
        self.run(
            "pg_ctl",
            &["-D", &self.data_dir(), "stop", "-m", "immediate", "-w"],
        )
    }

    /// Starts the server again after [`PgCluster::kill`] (crash recovery
    /// runs), on the same port.
    pub fn restart(&self) -> anyhow::Result<()> {
        self.start_server()
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// URL of database `name` as the `postgres` superuser.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates a new empty database and returns its URL.
    pub fn database(&self) -> anyhow::Result<String> {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::Relaxed)
        );
        let psql = self.bindir.join("psql");
        let out = Command::new(&psql)
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.url("postgres"))
            .args(["-c", &format!("CREATE DATABASE {name}")])
            .output()
            .with_context(|| format!("running {}", psql.display()))?;
        if !out.status.success() {
            bail!(
                "CREATE DATABASE failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(self.url(&name))
    }

    /// Runs `sql` in database `url` with psql; returns its unaligned output.
    pub fn psql(&self, url: &str, sql: &str) -> anyhow::Result<String> {
        let out = Command::new(self.bindir.join("psql"))
            .args([
                "-X",
                "-A",
                "-t",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                url,
                "-c",
                sql,
            ])
            .output()?;
        if !out.status.success() {
            bail!("psql failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .args(["-c", &self.stop_command()])
            .status();
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// One cluster shared by every test of this process (each takes its own
/// [`PgCluster::database`]): starting a cluster costs about a second.
pub fn shared() -> Result<&'static PgCluster, Unavailable> {
    static SHARED: std::sync::OnceLock<Result<PgCluster, String>> = std::sync::OnceLock::new();
    match SHARED.get_or_init(|| match PgCluster::start() {
        Ok(c) => Ok(c),
        Err(Unavailable::Skip(why)) => Err(why),
    }) {
        Ok(c) => Ok(c),
        Err(why) => Err(Unavailable::Skip(why.clone())),
    }
}

/// A new empty database on the [`shared`] cluster, or `None` (said on
/// stderr) when the run skips PostgreSQL.
pub fn fresh_database() -> Option<String> {
    match shared() {
        Ok(c) => match c.database() {
            Ok(url) => Some(url),
            Err(e) => panic!("creating a test database: {e:#}"),
        },
        Err(Unavailable::Skip(why)) => {
            eprintln!("skipped on PostgreSQL: {why}");
            None
        }
    }
}

/// Runs each behaviour test `async fn NAME(f: Fixture)` of a service on
/// both backends, as `on_sled::NAME` (with `sled()`, a fixture) and
/// `on_postgres::NAME` (with `pg().await`, an `Option` of one: `None` when
/// the run skips PostgreSQL): one set of tests, two backends.
#[macro_export]
macro_rules! on_both_backends {
    ($sled:ident, $pg:ident; $($name:ident),* $(,)?) => {
        mod on_sled {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::$sled()).await
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(f) = super::$pg().await {
                        super::$name(f).await
                    }
                }
            )*
        }
    };
}
