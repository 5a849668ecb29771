//! `switchyard`: run services (`dev`, `serve`) and talk to them (`agent`,
//! `tool`, `route`, `budget`, `approval`, `job`). Argument parsing only; the work is in the library.

mod admin;
mod approval;
mod audit;
mod auth;
mod budget;
mod chat;
mod client;
mod files;
mod job;
mod limits;
mod llm;
mod mcp;
mod notify;
mod output;
mod policy;
mod publish;
mod report;
mod schedule;
mod trigger;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use switchyard_cli::{Config, ServiceKind, run_node_then};
use switchyard_kit::telemetry::LogFormat;

#[derive(Parser)]
#[command(
    name = "switchyard",
    version = VERSION,
    about = "Switchyard: a control plane for AI-agent work",
    after_help = report::EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every implemented service in one process on the embedded store.
    Dev(RunArgs),
    /// Run a chosen set of services (`--services registry,router`).
    Serve {
        /// Services to run in this process, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        services: Vec<ServiceKind>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// The registry's agents: register, list, get, heartbeat, deregister
    /// (hosting agents from manifest files is `switchyard agents`).
    #[command(
        subcommand,
        after_help = "Agents written as manifest.yaml + prompt files are checked, hosted and published with `switchyard agents` (check, serve, publish); once served they are registered and listed here."
    )]
    Agent(client::AgentCmd),
    /// Register and list tools.
    #[command(subcommand)]
    Tool(client::ToolCmd),
    /// Rank agents for a capability.
    Route(client::RouteArgs),
    /// Budgets and the cost journal.
    #[command(subcommand)]
    Budget(budget::BudgetCmd),
    /// Review, approve and run AgentRunSpec runs.
    #[command(subcommand)]
    Approval(approval::ApprovalCmd),
    /// Submit, follow, inspect and cancel jobs.
    #[command(subcommand)]
    Job(job::JobCmd),
    /// Run a job on a cron timetable: create, list, show, pause, resume and
    /// delete schedules.
    #[command(subcommand)]
    Schedule(schedule::ScheduleCmd),
    /// Start a job from an incoming event: create, list, show and delete
    /// triggers, and deliver events to them.
    #[command(subcommand)]
    Trigger(trigger::TriggerCmd),
    /// Webhook notifications: the deliveries waiting to be sent again and
    /// the dead-lettered ones; send one again.
    #[command(subcommand)]
    Notify(notify::NotifyCmd),
    /// Provider rate limits: each bucket in use, what it holds, the
    /// cooldowns providers asked for, and who is waiting.
    Limits(limits::LimitsArgs),
    /// Cedar policies: check a directory, print the schema, explain what
    /// the policies in force decide about a job document, job or run.
    #[command(subcommand)]
    Policy(policy::PolicyCmd),
    /// Talk with a conversation job: each line is a message, each reply
    /// streams as it is generated.
    Chat(chat::ChatArgs),
    /// Operate pull workers: drain (quiet) or stop (terminate) one.
    #[command(subcommand)]
    Worker(worker::WorkerCmd),
    /// Host declarative agents from manifest.yaml + prompt files: check,
    /// serve, publish (the registry's agents are `switchyard agent`).
    #[command(
        subcommand,
        after_help = "To list, inspect or remove the agents the registry holds (these once served, and every other), use `switchyard agent list|get|deregister`."
    )]
    Agents(AgentsCmd),
    /// API keys and who-am-i.
    #[command(subcommand)]
    Auth(auth::AuthCmd),
    /// Operating a deployment: prune finished jobs.
    #[command(subcommand)]
    Admin(admin::AdminCmd),
    /// The record: verify the jobs' hash-chained journals and their signed
    /// seals; make a signing key.
    #[command(subcommand)]
    Audit(audit::AuditCmd),
    /// LLM providers: which configured models each serves.
    #[command(subcommand)]
    Llm(llm::LlmCmd),
    /// Serve Switchyard to an MCP host on stdio: tools to validate, submit
    /// and follow jobs, read results and cost, list agents and pending
    /// approvals, as the caller's principal (never approving).
    Mcp(mcp::McpArgs),
    /// Apply the database schema migrations of the services on PostgreSQL
    /// (`[storage] backend = "postgres"`) and exit; idempotent, and safe
    /// while replicas run or start (they migrate at start-up too).
    Migrate(RunArgs),
    /// Print the version and the git commit it was built from.
    Version,
    /// Print a shell completion script: `source <(switchyard completions bash)`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `0.1.0 (commit abc1234)`: the crate version and the commit built.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SWITCHYARD_GIT_COMMIT"),
    ")"
);

#[derive(Subcommand)]
enum AgentsCmd {
    /// Host every manifest under DIR: register each as agent_<id>,
    /// heartbeat, and answer Invoke until SIGINT/SIGTERM.
    Serve {
        /// Directory of manifests (DIR/manifest.yaml and DIR/*/manifest.yaml).
        #[arg(long)]
        dir: PathBuf,
        /// Switchyard (registry, ledger and executor) URL, unless each is set
        /// in [agents].
        #[arg(long, env = "SWITCHYARD_URL", default_value = "http://127.0.0.1:7600")]
        url: String,
        /// The agents' API key (role agent), for the registry, ledger and
        /// executor.
        #[arg(long, env = "SWITCHYARD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Publish an agent a builder agent proposed (an agent_manifest artifact
    /// of a job) into DIR, after checking it again and once a person
    /// approved it (the approval run this proposes); the agents host
    /// serving DIR loads it without a restart.
    Publish {
        /// The job that holds the proposal.
        #[arg(long)]
        job: String,
        /// The artifact's path (`<task>/manifest.yaml`) or id.
        #[arg(long)]
        artifact: String,
        /// The manifest directory the agents host serves.
        #[arg(long)]
        dir: PathBuf,
        /// A tool the published agent may use (repeatable); a proposal whose
        /// uses_tools lists any other is refused.
        #[arg(long = "allow-tool")]
        allow_tools: Vec<String>,
        /// Seconds to wait for a person to approve publishing (the approval
        /// run this proposes), then for the registry to list the agent (0:
        /// do not wait).
        #[arg(long, default_value_t = 30)]
        wait_secs: u64,
        /// The registry's URL when it is not at --url (services split).
        #[arg(long, env = "SWITCHYARD_REGISTRY_URL")]
        registry_url: Option<String>,
        /// The approval service's URL when it is not at --url (services
        /// split).
        #[arg(long, env = "SWITCHYARD_APPROVAL_URL")]
        approval_url: Option<String>,
        #[command(flatten)]
        conn: client::Conn,
    },
    /// Load and validate every manifest under DIR; print what would be hosted.
    Check {
        /// Directory of manifests.
        #[arg(long)]
        dir: PathBuf,
        /// Project root for instruction files (default: DIR's parent).
        #[arg(long)]
        root: Option<PathBuf>,
    },
}

#[derive(Args)]
struct RunArgs {
    /// TOML configuration file.
    #[arg(long, env = "SWITCHYARD_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long)]
    listen: Option<String>,
    /// Directory for the embedded databases.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Registry to use when it is not in this process.
    #[arg(long)]
    registry_url: Option<String>,
    /// Log format.
    #[arg(long, value_parser = ["human", "json"])]
    log_format: Option<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    dump_config: bool,
}

impl RunArgs {
    /// The layered configuration; `dev` turns the dev credentials on unless
    /// the configuration says otherwise (`switchyard dev` is zero-config;
    /// `serve` never makes demo identities by itself).
    fn config(&self, dev: bool) -> anyhow::Result<Config> {
        let mut cfg: Config =
            switchyard_kit::config::load(self.config.as_deref(), std::env::vars())?;
        cfg.auth.dev_credentials.get_or_insert(dev);
        // `switchyard dev` runs its agents and tool servers on this machine.
        cfg.registry.egress.allow_loopback.get_or_insert(dev);
        if let Some(l) = &self.listen {
            cfg.server.listen.clone_from(l);
        }
        if let Some(d) = &self.data_dir {
            cfg.storage.data_dir.clone_from(d);
        }
        if let Some(u) = &self.registry_url {
            cfg.router.registry_url = Some(u.clone());
        }
        match self.log_format.as_deref() {
            Some("json") => cfg.telemetry.log_format = LogFormat::Json,
            Some("human") => cfg.telemetry.log_format = LogFormat::Human,
            _ => {}
        }
        cfg.resolve();
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(cfg)
    }
}

async fn run_services(args: RunArgs, services: &[ServiceKind], dev: bool) -> anyhow::Result<()> {
    let cfg = args.config(dev)?;
    if args.dump_config {
        print!("{}", switchyard_kit::config::dump(&cfg)?);
        return Ok(());
    }
    // What a server writes (its data directories, databases, scratch
    // directories, credential files) is its own: 0700 directories and 0600
    // files, whatever umask it was started with.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let names: Vec<&str> = services.iter().map(|s| s.name()).collect();
    let service_name = switchyard_kit::telemetry::service_name(&cfg.telemetry, &names, dev);
    let telemetry =
        switchyard_kit::telemetry::init_as(&cfg.telemetry, &service_name, &names.join(","))?;
    let listeners = switchyard_cli::Listeners::bind(&cfg, services).await?;
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    switchyard_kit::shutdown::on_signals(trigger);
    // One machine-readable line once the stores are replayed and the
    // services serve, for scripts and tests that start us on port 0.
    // `listening grpc=ADDR [http=ADDR] [resp=ADDR]`.
    // For a person at `switchyard dev`: where the console is and where the
    // keys to sign in with are.
    let console =
        (cfg.gateway.console.enabled && cfg.auth.dev_credentials == Some(true)).then(|| {
            cfg.storage
                .data_dir
                .join(switchyard_auth::credentials::FILE)
        });
    let ready = move |addrs: switchyard_cli::Addresses| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening {addrs}");
        if let (Some(keys), Some(http)) = (&console, addrs.http) {
            let _ = writeln!(
                out,
                "console http://{http}/ui/  (sign in with a key of {}: admin, alice or bob)",
                keys.display()
            );
        }
        let _ = out.flush();
    };
    let result = run_node_then(cfg, services, listeners, shutdown, ready).await;
    telemetry.shutdown();
    result
}

async fn migrate(args: RunArgs) -> anyhow::Result<()> {
    let cfg = args.config(false)?;
    if cfg.storage.backend != switchyard_cli::config::StorageBackend::Postgres {
        anyhow::bail!(
            "nothing to migrate: storage.backend is \"sled\" (its stores need no migrations); set [storage] backend = \"postgres\" and [storage.postgres] url"
        );
    }
    let db = switchyard_store::pg::Pg::connect(&cfg.storage.postgres).await?;
    let applied = switchyard_ledger::Ledger::migrate(&db).await?
        + switchyard_approval::Approval::migrate(&db).await?
        + switchyard_registry::Registry::migrate(&db).await?
        + switchyard_executor::Executor::migrate(&db).await?;
    println!(
        "{}: {applied} migration(s) applied; the schema is up to date",
        db.target()
    );
    Ok(())
}

async fn agents(cmd: AgentsCmd) -> anyhow::Result<()> {
    match cmd {
        AgentsCmd::Publish {
            job,
            artifact,
            dir,
            allow_tools,
            wait_secs,
            registry_url,
            approval_url,
            conn,
        } => {
            let p = switchyard_cli::agents::Publish {
                job: &job,
                artifact: &artifact,
                dir: &dir,
                allow_tools: &allow_tools,
                wait: std::time::Duration::from_secs(wait_secs),
            };
            publish::run(p, &conn, registry_url.as_deref(), approval_url.as_deref()).await
        }
        AgentsCmd::Check { dir, root } => {
            let root = root
                .or_else(|| dir.parent().map(std::path::Path::to_path_buf))
                .unwrap_or_else(|| dir.clone());
            let loaded = switchyard_agents::load_dir(&dir, &root)
                .map_err(switchyard_agents::AgentsError::Manifests)?;
            for a in &loaded.agents {
                println!(
                    "ok      {} ({}) model {} tools [{}] capabilities [{}]",
                    a.registry_id,
                    a.name,
                    a.models.join(" > "),
                    a.uses_tools.join(", "),
                    a.capabilities
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            for (path, why) in &loaded.skipped {
                println!("skipped {}: {why}", path.display());
            }
            Ok(())
        }
        AgentsCmd::Serve {
            dir,
            url,
            token,
            run,
        } => {
            let mut cfg = run.config(false)?;
            if let Some(l) = &run.listen {
                cfg.agents.listen.clone_from(l);
            }
            cfg.agents.dir = Some(dir.clone());
            for u in [
                &mut cfg.agents.registry_url,
                &mut cfg.agents.ledger_url,
                &mut cfg.agents.executor_url,
            ] {
                u.get_or_insert_with(|| url.clone());
            }
            if run.dump_config {
                print!("{}", switchyard_kit::config::dump(&cfg)?);
                return Ok(());
            }
            let telemetry =
                switchyard_kit::telemetry::init_as(&cfg.telemetry, "switchyard-agents", "agents")?;
            let credential = token
                .as_deref()
                .map(switchyard_kit::client::Credential::bearer)
                .transpose()
                .context("--token / SWITCHYARD_TOKEN")?;
            let llm = switchyard_llm::Llm::new(&cfg.llm).map_err(anyhow::Error::msg)?;
            llm.spawn_model_checks();
            let hosted = switchyard_cli::agents::host(&cfg, &dir, None, credential, llm)?;
            let (trigger, shutdown) = switchyard_kit::shutdown::channel();
            switchyard_kit::shutdown::on_signals(trigger);
            let ids = hosted.ids();
            let result = switchyard_agents::serve_until(hosted, shutdown, |addr| {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "listening grpc={addr}");
                let _ = writeln!(out, "agents {}", ids.join(","));
                let _ = out.flush();
            })
            .await;
            telemetry.shutdown();
            Ok(result?)
        }
    }
}

/// Writes `bytes` to stdout; a reader that went away ends the process as
/// [`quiet_on_closed_pipe`] does.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        r => Ok(r?),
    }
}

/// `switchyard job watch … | head` ends as a shell expects when the reader
/// goes away (status 141, like SIGPIPE), instead of with a panic message.
fn quiet_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload_as_str().unwrap_or_default();
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

#[tokio::main]
async fn main() -> ExitCode {
    quiet_on_closed_pipe();
    let args: Vec<String> = std::env::args().collect();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `agents` hosts manifests; `agent` is the registry. A registry
            // verb given to the wrong one says which command has it.
            let verb = args.get(2).map(String::as_str);
            if e.kind() == clap::error::ErrorKind::InvalidSubcommand
                && args.get(1).map(String::as_str) == Some("agents")
                && let Some(v @ ("list" | "get" | "register" | "deregister" | "heartbeat")) = verb
            {
                eprintln!(
                    "error: `switchyard agents` hosts declarative agents (check, serve, publish); the registry's agents are `switchyard agent {v}`"
                );
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    let result = match cli.command {
        Command::Dev(args) => run_services(args, ServiceKind::ALL, true).await,
        Command::Serve { services, run } => run_services(run, &services, false).await,
        Command::Agent(cmd) => client::agent(cmd).await,
        Command::Tool(cmd) => client::tool(cmd).await,
        Command::Mcp(args) => mcp::run(args).await,
        Command::Route(args) => client::route(args).await,
        Command::Budget(cmd) => budget::run(cmd).await,
        Command::Approval(cmd) => approval::run(cmd).await,
        Command::Job(cmd) => job::run(cmd).await,
        Command::Schedule(cmd) => schedule::run(cmd).await,
        Command::Trigger(cmd) => trigger::run(cmd).await,
        Command::Notify(cmd) => notify::run(cmd).await,
        Command::Limits(args) => limits::run(args).await,
        Command::Policy(cmd) => policy::run(cmd).await,
        Command::Chat(args) => chat::run(args).await,
        Command::Worker(cmd) => worker::run(cmd).await,
        Command::Agents(cmd) => agents(cmd).await,
        Command::Auth(cmd) => auth::run(cmd).await,
        Command::Admin(cmd) => admin::run(cmd).await,
        Command::Audit(cmd) => audit::run(cmd).await,
        Command::Llm(cmd) => llm::run(cmd).await,
        Command::Migrate(args) => migrate(args).await,
        Command::Version => {
            println!("switchyard {VERSION}");
            Ok(())
        }
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "switchyard", &mut script);
            write_stdout(&script)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = client::explain(e, &args);
            if report::wants_json(&args[1..]) {
                eprintln!("{}", report::json(&e));
            } else {
                eprintln!("error: {}", report::text(&e));
            }
            ExitCode::from(report::exit_code(&e))
        }
    }
}
