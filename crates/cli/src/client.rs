//! Client commands: talk to a running Switchyard over gRPC.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use switchyard_api::RegistryClient;
use switchyard_api::RouterClient;
use switchyard_auth::credentials::Credentials;
use switchyard_kit::client::{Credential, Intercepted};
use switchyard_kit::error::ApiError;
use switchyard_proto::registry::v1::*;
use switchyard_proto::router::v1::{RouteConstraints, RouteRequest};

use crate::files::{A2aAgentFile, AgentFile, McpServerFile, ToolFile};
use crate::output::{self, Format, agent_json, print_json, route_json, table, tool_json, usd};

/// Where the server is and how to print.
#[derive(Args, Debug)]
pub struct Conn {
    /// Switchyard gRPC address.
    #[arg(
        long,
        env = "SWITCHYARD_URL",
        default_value = "http://127.0.0.1:7600",
        global = true
    )]
    pub(crate) url: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table", global = true)]
    pub(crate) output: Format,
    /// Bearer token (API key or JWT) to call with. Wins over --as.
    #[arg(long, env = "SWITCHYARD_TOKEN", hide_env_values = true, global = true)]
    pub(crate) token: Option<String>,
    /// Call as this principal of the credentials file (`switchyard dev`
    /// writes admin, alice and bob). Default: admin, when the file exists.
    #[arg(long = "as", env = "SWITCHYARD_AS", global = true)]
    pub(crate) as_name: Option<String>,
    /// The credentials file `switchyard dev` wrote.
    #[arg(
        long,
        env = "SWITCHYARD_CREDENTIALS",
        default_value = ".switchyard/credentials.json",
        global = true
    )]
    pub(crate) credentials: PathBuf,
}

pub(crate) const MAX_MESSAGE: usize = 16 * 1024 * 1024;

impl Conn {
    /// A connected channel carrying this invocation's credential.
    pub(crate) async fn channel(&self) -> anyhow::Result<Intercepted> {
        let credential = self.credential()?;
        Ok(switchyard_kit::client::authed(
            switchyard_kit::client::connect(&self.url).await?,
            credential,
        ))
    }

    /// `--token`, else `--as NAME` from the credentials file, else the
    /// file's admin; none when there is no file (calls are then anonymous
    /// and the server answers AUTH_REQUIRED).
    pub(crate) fn credential(&self) -> anyhow::Result<Option<Credential>> {
        if let Some(t) = &self.token {
            return Ok(Some(
                Credential::bearer(t).context("--token / SWITCHYARD_TOKEN")?,
            ));
        }
        let file = &self.credentials;
        let creds = match (file.exists(), &self.as_name) {
            (true, _) => Credentials::read(file).map_err(anyhow::Error::msg)?,
            (false, None) => return Ok(None),
            (false, Some(name)) => anyhow::bail!(
                "--as {name}: no credentials file at {} (switchyard dev writes it into its data directory; pass --credentials, or --token)",
                file.display()
            ),
        };
        let name = self.as_name.as_deref().unwrap_or("admin");
        let token = creds.token(name).with_context(|| {
            let names: Vec<_> = creds.principals.keys().cloned().collect();
            format!(
                "no principal {name:?} in {}; it has: {}",
                file.display(),
                names.join(", ")
            )
        })?;
        Ok(Some(Credential::bearer(token)?))
    }
    async fn registry(&self) -> anyhow::Result<RegistryClient> {
        Ok(RegistryClient::remote(self.channel().await?, MAX_MESSAGE))
    }
    async fn router(&self) -> anyhow::Result<RouterClient> {
        Ok(RouterClient::remote(self.channel().await?, MAX_MESSAGE))
    }
    pub(crate) async fn ledger(&self) -> anyhow::Result<switchyard_api::LedgerClient> {
        Ok(switchyard_api::LedgerClient::remote(
            self.channel().await?,
            MAX_MESSAGE,
        ))
    }
}

/// A failed connection said once, with where the URL came from and the
/// likely fix; other errors pass through.
pub(crate) fn explain(mut e: anyhow::Error, args: &[String]) -> anyhow::Error {
    if let Some(api) = e.downcast_mut::<ApiError>() {
        advise(api, crate::report::url_source(args));
        return e;
    }
    let Some(switchyard_kit::client::ClientError::Connect { url, .. }) =
        e.downcast_ref::<switchyard_kit::client::ClientError>()
    else {
        return e;
    };
    // The innermost cause says what happened (connection refused, no such
    // host); the layers above it only repeat "transport error".
    crate::report::Unreachable {
        url: url.clone(),
        from: crate::report::url_source(args),
        cause: e
            .chain()
            .last()
            .map(ToString::to_string)
            .unwrap_or_default(),
    }
    .into()
}

/// A server's answer as the person at the terminal needs it: what to pass
/// this CLI rather than which header to send, and a server that does not
/// speak gRPC named as such (the CLI pointed at the HTTP or RESP door).
/// `from` says where the URL came from.
fn advise(e: &mut ApiError, from: &str) {
    if e.reason.as_deref() == Some("AUTH_REQUIRED") {
        e.message = "this call needs a credential: pass --token TOKEN (or set SWITCHYARD_TOKEN), or --as NAME to use a principal of the credentials file (--credentials FILE; `switchyard dev` writes .switchyard/credentials.json in the directory it runs in)".into();
        return;
    }
    // What tonic reports when the other end is not a gRPC server: an HTTP
    // answer read as gRPC, an HTTP/2 handshake refused, or the connection
    // closed on it (the RESP door drops a client that opens with HTTP/2).
    const NOT_GRPC: [&str; 5] = [
        "h2 protocol error",
        "invalid compression flag",
        "protocol error",
        "frame with invalid size",
        "operation was canceled",
    ];
    if e.reason.is_none() && NOT_GRPC.iter().any(|m| e.message.contains(m)) {
        e.code = tonic::Code::Unavailable;
        e.message = format!(
            "the server at the URL ({from}) did not answer in gRPC ({}): is it Switchyard's HTTP or RESP door? Point --url or SWITCHYARD_URL at the gRPC port: the one `switchyard dev` prints as `listening grpc=…` (127.0.0.1:7600 by default)",
            e.message
        );
    }
}

pub(crate) fn api(s: tonic::Status) -> anyhow::Error {
    ApiError::from(s).into()
}

pub(crate) fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// Definition files (YAML or JSON) given with `-f`.
#[derive(Args, Debug)]
pub struct Files {
    /// Definition file; repeat for several.
    #[arg(short = 'f', long = "file", required = true)]
    pub(crate) files: Vec<PathBuf>,
}

impl Files {
    /// Parses every file before anything is sent, so one bad file registers nothing.
    pub(crate) fn parse<T>(
        &self,
        read: impl Fn(&std::path::Path) -> anyhow::Result<T>,
    ) -> anyhow::Result<Vec<T>> {
        self.files.iter().map(|f| read(f)).collect()
    }
}

/// `switchyard agent ...`
#[derive(Subcommand, Debug)]
pub enum AgentCmd {
    /// Register (or update) agents from YAML or JSON files.
    Register {
        #[command(flatten)]
        files: Files,
        #[command(flatten)]
        conn: Conn,
    },
    /// Register (or update) A2A agents from their Agent Cards: each file
    /// names a card URL and the price, trust and limits Switchyard gives it.
    RegisterA2a {
        #[command(flatten)]
        files: Files,
        #[command(flatten)]
        conn: Conn,
    },
    /// List agents.
    List {
        /// Only agents serving this capability.
        #[arg(long)]
        capability: Option<String>,
        /// Only agents in this status.
        #[arg(long, value_parser = ["available", "lapsed"])]
        status: Option<String>,
        /// Only agents with this label (KEY=VALUE); repeatable.
        #[arg(long = "label", value_parser = parse_kv)]
        labels: Vec<(String, String)>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show one agent.
    Get {
        /// Agent id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Renew an agent's lease (what an agent process does periodically).
    Heartbeat {
        /// Agent id.
        id: String,
        /// Calls the agent is serving.
        #[arg(long, default_value_t = 0)]
        in_flight: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove an agent.
    Deregister {
        /// Agent id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `switchyard tool ...`
#[derive(Subcommand, Debug)]
pub enum ToolCmd {
    /// Register (or update) tools from YAML or JSON files.
    Register {
        #[command(flatten)]
        files: Files,
        #[command(flatten)]
        conn: Conn,
    },
    /// List tools.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// MCP servers as tool providers: register, list, deregister.
    #[command(subcommand)]
    Mcp(McpCmd),
    /// The capabilities summary a model is given: tools and agents, apart,
    /// and what offering them adds to its prompt, in tokens.
    Summary {
        /// Only these tools (repeatable). With `--tool` or `--agent`, exactly
        /// what they name is listed, as an LLM task listing them is offered;
        /// with neither, everything registered.
        #[arg(long = "tool")]
        tools: Vec<String>,
        /// Only agents with these ids or capabilities (repeatable).
        #[arg(long = "agent")]
        agents: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `switchyard tool mcp ...`
#[derive(Subcommand, Debug)]
pub enum McpCmd {
    /// Register (or update) MCP servers from YAML or JSON files; their tools
    /// are listed and registered as `<server>__<tool>`.
    Register {
        #[command(flatten)]
        files: Files,
        #[command(flatten)]
        conn: Conn,
    },
    /// List MCP servers with their state and tools.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove an MCP server and its tools.
    Deregister {
        /// Server name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `switchyard route ...`
#[derive(Args, Debug)]
pub struct RouteArgs {
    /// Capability to route, e.g. nlp_analysis.
    #[arg(long)]
    capability: String,
    /// Minimum trust score (default: the router's, 50).
    #[arg(long)]
    min_trust: Option<u32>,
    /// Maximum price per unit in USD, e.g. 0.002 (or micro-USD with a
    /// suffix: 2000micro).
    #[arg(long, value_parser = output::parse_money)]
    max_cost: Option<i64>,
    /// Agents to exclude, comma-separated.
    #[arg(long, value_delimiter = ',')]
    exclude: Vec<String>,
    /// Preferred label (KEY=VALUE); repeatable.
    #[arg(long = "prefer", value_parser = parse_kv)]
    prefer: Vec<(String, String)>,
    /// Candidates to return.
    #[arg(long, default_value_t = 0)]
    limit: u32,
    #[command(flatten)]
    conn: Conn,
}

fn agent_rows(agents: &[Agent]) -> Vec<Vec<String>> {
    agents
        .iter()
        .map(|a| {
            let s = a.spec.clone().unwrap_or_default();
            let caps: Vec<_> = s.capabilities.iter().map(|c| c.name.clone()).collect();
            let max = if s.max_concurrency == 0 {
                "-".to_string()
            } else {
                s.max_concurrency.to_string()
            };
            vec![
                s.id,
                output::status_name(a.status).to_string(),
                s.trust_score.to_string(),
                format!("{}/{}", a.in_flight, max),
                caps.join(","),
                s.endpoint,
            ]
        })
        .collect()
}

const AGENT_HEADERS: [&str; 6] = [
    "ID",
    "STATUS",
    "TRUST",
    "IN_FLIGHT",
    "CAPABILITIES",
    "ENDPOINT",
];

/// Runs an agent command.
pub async fn agent(cmd: AgentCmd) -> anyhow::Result<()> {
    match cmd {
        AgentCmd::Register { files, conn } => {
            let specs = files.parse(|f| AgentFile::read(f).and_then(AgentFile::into_spec))?;
            let reg = conn.registry().await?;
            let mut out = Vec::new();
            for spec in specs {
                let r = reg
                    .register_agent(RegisterAgentRequest { agent: Some(spec) })
                    .await
                    .map_err(api)?;
                out.push(r);
            }
            match conn.output {
                Format::Json => print_json(&serde_json::Value::Array(
                    out.iter()
                        .map(|r| serde_json::json!({"created": r.created, "agent": r.agent.as_ref().map(agent_json)}))
                        .collect(),
                )),
                Format::Table => {
                    for r in &out {
                        let id = r.agent.as_ref().and_then(|a| a.spec.as_ref()).map_or("", |s| s.id.as_str());
                        let ttl = r.lease.as_ref().and_then(|l| l.ttl).map_or(0, |d| d.seconds);
                        println!("{} agent {id} (lease {ttl}s)", if r.created { "registered" } else { "updated" });
                    }
                }
            }
        }
        AgentCmd::RegisterA2a { files, conn } => {
            let reqs = files.parse(|f| A2aAgentFile::read(f).map(A2aAgentFile::into_request))?;
            let reg = conn.registry().await?;
            for req in reqs {
                let r = reg.register_a2a_agent(req).await.map_err(api)?;
                let spec = r
                    .agent
                    .as_ref()
                    .and_then(|a| a.spec.clone())
                    .unwrap_or_default();
                match conn.output {
                    Format::Json => print_json(&serde_json::json!({
                        "created": r.created,
                        "agent": r.agent.as_ref().map(agent_json),
                        "skipped": r.skipped,
                    })),
                    Format::Table => {
                        let caps: Vec<&str> =
                            spec.capabilities.iter().map(|c| c.name.as_str()).collect();
                        let signed = match spec.a2a.as_ref().map(|a| a.card_signed_by.as_str()) {
                            Some("") | None => "card unsigned".to_owned(),
                            Some(kid) => format!("card signed by key {kid}"),
                        };
                        println!(
                            "{} A2A agent {} ({}) at {}: {} ({signed})",
                            if r.created { "registered" } else { "updated" },
                            spec.id,
                            spec.name,
                            spec.endpoint,
                            caps.join(", ")
                        );
                        for s in &r.skipped {
                            println!("  skipped skill {s}");
                        }
                    }
                }
            }
        }
        AgentCmd::List {
            capability,
            status,
            labels,
            conn,
        } => {
            let reg = conn.registry().await?;
            let status = match status.as_deref() {
                Some("available") => AgentStatus::Available,
                Some("lapsed") => AgentStatus::Lapsed,
                _ => AgentStatus::Unspecified,
            };
            let labels: std::collections::BTreeMap<String, String> = labels.into_iter().collect();
            let mut agents = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = reg
                    .list_agents(ListAgentsRequest {
                        page_size: 1000,
                        page_token: page_token.clone(),
                        capability: capability.clone().unwrap_or_default(),
                        status: status as i32,
                        labels: labels.clone(),
                    })
                    .await
                    .map_err(api)?;
                agents.extend(r.agents);
                if r.next_page_token.is_empty() {
                    break;
                }
                page_token = r.next_page_token;
            }
            match conn.output {
                Format::Json => output::print_list(agents.iter().map(agent_json).collect(), ""),
                Format::Table => table(&AGENT_HEADERS, &agent_rows(&agents)),
            }
        }
        AgentCmd::Get { id, conn } => {
            let a = conn
                .registry()
                .await?
                .get_agent(GetAgentRequest { agent_id: id })
                .await
                .map_err(api)?
                .agent
                .unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&agent_json(&a)),
                Format::Table => {
                    table(&AGENT_HEADERS, &agent_rows(std::slice::from_ref(&a)));
                    let s = a.spec.clone().unwrap_or_default();
                    if !s.description.is_empty() {
                        println!("\n{}", s.description.trim());
                    }
                    println!();
                    let rows: Vec<Vec<String>> = s
                        .capabilities
                        .iter()
                        .map(|c| {
                            let st = a.stats.iter().find(|x| x.capability == c.name);
                            vec![
                                c.name.clone(),
                                format!("{:.2}", c.proficiency.unwrap_or(1.0)),
                                format!(
                                    "{}/{}",
                                    usd(c.price_per_unit_micro_usd),
                                    if c.unit.is_empty() { "unit" } else { &c.unit }
                                ),
                                st.map_or("0".into(), |x| x.count.to_string()),
                                st.map_or("-".into(), |x| {
                                    format!("{:.0}%", x.success_rate * 100.0)
                                }),
                                st.map_or(format!("{} (est)", s.latency_estimate_ms), |x| {
                                    format!("{:.1}", x.ewma_latency_ms)
                                }),
                            ]
                        })
                        .collect();
                    table(
                        &[
                            "CAPABILITY",
                            "PROFICIENCY",
                            "PRICE",
                            "CALLS",
                            "SUCCESS",
                            "LATENCY_MS",
                        ],
                        &rows,
                    );
                }
            }
        }
        AgentCmd::Heartbeat {
            id,
            in_flight,
            conn,
        } => {
            let r = conn
                .registry()
                .await?
                .heartbeat(HeartbeatRequest {
                    agent_id: id.clone(),
                    in_flight,
                })
                .await
                .map_err(api)?;
            let ttl = r
                .lease
                .as_ref()
                .and_then(|l| l.ttl)
                .map_or(0, |d| d.seconds);
            match conn.output {
                Format::Json => print_json(&serde_json::json!({"agent_id": id, "ttl_secs": ttl})),
                Format::Table => println!("lease of {id} renewed for {ttl}s"),
            }
        }
        AgentCmd::Deregister { id, conn } => {
            conn.registry()
                .await?
                .deregister_agent(DeregisterAgentRequest {
                    agent_id: id.clone(),
                })
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&serde_json::json!({"deregistered": id})),
                Format::Table => println!("deregistered agent {id}"),
            }
        }
    }
    Ok(())
}

/// Runs a tool command.
pub async fn tool(cmd: ToolCmd) -> anyhow::Result<()> {
    match cmd {
        ToolCmd::Register { files, conn } => {
            let tools = files.parse(|f| ToolFile::read(f).and_then(ToolFile::into_tool))?;
            let reg = conn.registry().await?;
            for t in tools {
                let r = reg
                    .register_tool(RegisterToolRequest { tool: Some(t) })
                    .await
                    .map_err(api)?;
                let name = r.tool.as_ref().map_or("", |t| t.name.as_str());
                match conn.output {
                    Format::Json => print_json(
                        &serde_json::json!({"created": r.created, "tool": r.tool.as_ref().map(tool_json)}),
                    ),
                    Format::Table => println!(
                        "{} tool {name}",
                        if r.created { "registered" } else { "updated" }
                    ),
                }
            }
        }
        ToolCmd::Mcp(cmd) => mcp(cmd).await?,
        ToolCmd::Summary {
            tools,
            agents,
            conn,
        } => {
            let r = conn
                .registry()
                .await?
                .get_capabilities_summary(
                    switchyard_proto::registry::v1::GetCapabilitiesSummaryRequest {
                        only_named: !(tools.is_empty() && agents.is_empty()),
                        tools,
                        agents,
                    },
                )
                .await
                .map_err(api)?;
            let item = |i: &switchyard_proto::registry::v1::SummaryItem| serde_json::json!({"name": i.name, "description": i.description, "prompt_tokens": i.prompt_tokens});
            let sum = |is: &[switchyard_proto::registry::v1::SummaryItem]| {
                is.iter().map(|i| i.prompt_tokens).sum::<u64>()
            };
            match conn.output {
                Format::Json => print_json(&serde_json::json!({
                    "tools": r.tools.iter().map(item).collect::<Vec<_>>(),
                    "agents": r.agents.iter().map(item).collect::<Vec<_>>(),
                    "prompt_tokens": r.prompt_tokens,
                })),
                Format::Table => {
                    print!("{}", r.text);
                    let of = |n: usize, what: &str| {
                        format!("{n} {what}{}", if n == 1 { "" } else { "s" })
                    };
                    println!(
                        "\nPrompt size of these offers: at most {} tokens ({}: {}; {}: {})",
                        r.prompt_tokens,
                        of(r.tools.len(), "tool"),
                        sum(&r.tools),
                        of(r.agents.len(), "agent"),
                        sum(&r.agents)
                    );
                }
            }
        }
        ToolCmd::List { conn } => {
            let tools = conn
                .registry()
                .await?
                .list_tools(ListToolsRequest::default())
                .await
                .map_err(api)?
                .tools;
            match conn.output {
                Format::Json => output::print_list(tools.iter().map(tool_json).collect(), ""),
                Format::Table => {
                    let rows: Vec<Vec<String>> = tools
                        .iter()
                        .map(|t| {
                            vec![
                                t.name.clone(),
                                if !t.mcp_server.is_empty() {
                                    format!("mcp:{}", t.mcp_server)
                                } else if t.endpoint.is_empty() {
                                    "-".into()
                                } else {
                                    t.endpoint.clone()
                                },
                                t.description.clone(),
                            ]
                        })
                        .collect();
                    table(&["NAME", "ENDPOINT", "DESCRIPTION"], &rows);
                }
            }
        }
    }
    Ok(())
}

async fn mcp(cmd: McpCmd) -> anyhow::Result<()> {
    use switchyard_proto::registry::v1::{
        DeregisterMcpServerRequest, ListMcpServersRequest, RegisterMcpServerRequest,
    };
    match cmd {
        McpCmd::Register { files, conn } => {
            let servers =
                files.parse(|f| McpServerFile::read(f).and_then(McpServerFile::into_server))?;
            let reg = conn.registry().await?;
            for server in servers {
                let r = reg
                    .register_mcp_server(RegisterMcpServerRequest {
                        server: Some(server),
                    })
                    .await
                    .map_err(api)?;
                let info = r.server.unwrap_or_default();
                match conn.output {
                    Format::Json => print_json(&serde_json::json!({
                        "created": r.created,
                        "server": output::mcp_json(&info),
                        "skipped": r.skipped,
                    })),
                    Format::Table => {
                        let name = info.server.as_ref().map_or("", |s| s.name.as_str());
                        println!(
                            "{} MCP server {name} ({}, protocol {}): {} tools",
                            if r.created { "registered" } else { "updated" },
                            info.server_version,
                            info.protocol_version,
                            info.tools.len()
                        );
                        let width = r.tools.iter().map(|t| t.name.len()).max().unwrap_or(0);
                        for t in &r.tools {
                            println!("  {:<width$}  {}", t.name, one_line(&t.description, 70));
                        }
                        for s in &r.skipped {
                            println!("  skipped {s}");
                        }
                    }
                }
            }
        }
        McpCmd::List { conn } => {
            let servers = conn
                .registry()
                .await?
                .list_mcp_servers(ListMcpServersRequest {})
                .await
                .map_err(api)?
                .servers;
            match conn.output {
                Format::Json => {
                    output::print_list(servers.iter().map(output::mcp_json).collect(), "")
                }
                Format::Table => {
                    let rows: Vec<Vec<String>> = servers.iter().map(output::mcp_row).collect();
                    table(&["NAME", "STATE", "TRANSPORT", "TOOLS", "SERVER"], &rows);
                }
            }
        }
        McpCmd::Deregister { name, conn } => {
            conn.registry()
                .await?
                .deregister_mcp_server(DeregisterMcpServerRequest { name: name.clone() })
                .await
                .map_err(api)?;
            if conn.output == Format::Table {
                println!("deregistered MCP server {name}");
            }
        }
    }
    Ok(())
}

/// The first line of `s`, cut to `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        let cut: String = line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

/// Runs `switchyard route`.
pub async fn route(a: RouteArgs) -> anyhow::Result<()> {
    let req = RouteRequest {
        capability: a.capability,
        constraints: Some(RouteConstraints {
            min_trust: a.min_trust,
            max_cost_micro_usd: a.max_cost,
            exclude_agents: a.exclude,
            prefer_labels: a.prefer.into_iter().collect(),
        }),
        limit: a.limit,
    };
    let r = a.conn.router().await?.route(req).await.map_err(api)?;
    match a.conn.output {
        Format::Json => print_json(&route_json(&r)),
        Format::Table => {
            let rows: Vec<Vec<String>> = r
                .candidates
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let b = c.breakdown.clone().unwrap_or_default();
                    vec![
                        (i + 1).to_string(),
                        c.agent_id.clone(),
                        format!("{:.4}", c.score),
                        format!("{:.2}", b.capability_match),
                        format!("{:.2}", b.trust),
                        format!("{:.2}", b.latency),
                        format!("{:.2}", b.cost),
                        format!("{:.2}", b.preference),
                        usd(c.price_per_unit_micro_usd),
                        c.endpoint.clone(),
                    ]
                })
                .collect();
            table(
                &[
                    "RANK",
                    "AGENT",
                    "SCORE",
                    "CAPABILITY",
                    "TRUST",
                    "LATENCY",
                    "COST",
                    "PREFER",
                    "PRICE",
                    "ENDPOINT",
                ],
                &rows,
            );
            if !r.filtered.is_empty() {
                let mut f: Vec<_> = r.filtered.iter().map(|(k, v)| format!("{k}={v}")).collect();
                f.sort();
                println!("filtered out: {}", f.join(" "));
            }
        }
    }
    Ok(())
}
