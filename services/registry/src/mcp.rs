//! MCP servers as tool providers. The registry holds one session per
//! registered server — a stdio server it starts from `registry.mcp.commands`
//! under the command sandbox, in the server's own scratch directory, or a
//! streamable HTTP endpoint with an operator-configured bearer secret — and:
//!
//! - lists the server's tools at registration, checks every input schema
//!   and registers each as `<server>__<tool>` (a registration that cannot
//!   connect stores nothing);
//! - re-lists them on `notifications/tools/list_changed` and after every
//!   reconnection, so the tool table follows the server;
//! - runs calls for the executor and agent hosts (`CallMcpTool`), relaying
//!   progress, and cancels a call on the server when its caller goes away.
//!
//! A server that exits is marked disconnected; the next call starts (or
//! reaches) it again.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::Violations;
use switchyard_kit::auth::Principal;
use switchyard_kit::egress;
use switchyard_kit::json::{json_to_struct, json_to_value, struct_to_json};
use switchyard_mcp::{Session, Transport, names};
use switchyard_proto::registry::v1::call_mcp_tool_response::Event;
use switchyard_proto::registry::v1::mcp_server::Transport as Wire;
use switchyard_proto::registry::v1::*;
use switchyard_sandbox::limits::ResourceLimits;
use switchyard_sandbox::program::Programs;
use switchyard_sandbox::{Policy, Sandbox, SandboxMode};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::{Registry, RegistryError, invalid, may_change, sees};

/// `[registry.mcp]`: what MCP servers the registry may start or reach.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// Programs a stdio MCP server may be started as (looked up on `path`
    /// once, at start-up). Empty: no stdio servers.
    pub commands: Vec<String>,
    /// The only PATH stdio servers see and are looked up on.
    pub path: String,
    /// `"on"`: stdio servers run in the command sandbox (Landlock, seccomp,
    /// no_new_privs, rlimits) and are refused without kernel support;
    /// `"off"`: unconfined (rlimits only).
    pub sandbox: SandboxMode,
    /// User id stdio servers run as when the registry runs as root.
    pub sandbox_uid: u32,
    /// Group id stdio servers run as when the registry runs as root.
    pub sandbox_gid: u32,
    /// Paths every stdio server may read (its code lives here: a global
    /// npm or pip prefix is under /usr). Keep secrets out.
    pub read_paths: Vec<PathBuf>,
    /// Allowlisted commands whose servers may open network connections.
    pub network_commands: Vec<String>,
    /// Resource limits of every stdio server.
    pub limits: ResourceLimits,
    /// Where each stdio server's scratch directory (its working directory,
    /// HOME and only writable place) is made; empty: `<data_dir>/mcp`.
    pub scratch_dir: PathBuf,
    /// How long connecting and listing tools may take, ms.
    pub connect_timeout_ms: u64,
    /// URL prefixes HTTP servers may have (empty: any http(s) URL). A
    /// shared deployment should set it: the registry connects to what is
    /// registered.
    pub allowed_urls: Vec<String>,
    /// Bearer secrets HTTP servers may name, by name.
    pub secrets: BTreeMap<String, McpSecret>,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            commands: vec!["node".into()],
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            sandbox: SandboxMode::On,
            sandbox_uid: 65534,
            sandbox_gid: 65534,
            read_paths: default_read_paths(),
            network_commands: Vec::new(),
            // A server runs for as long as it is registered: no CPU-time cap.
            limits: ResourceLimits {
                cpu_seconds: 0,
                ..ResourceLimits::default()
            },
            scratch_dir: PathBuf::new(),
            connect_timeout_ms: 15_000,
            allowed_urls: Vec::new(),
            secrets: BTreeMap::new(),
        }
    }
}

/// The command sandbox's system paths, and OpenSSL's configuration file,
/// which Node.js and Python read at start-up (not /etc/ssl: private keys
/// live there).
pub fn default_read_paths() -> Vec<PathBuf> {
    let mut paths = switchyard_sandbox::policy::default_read_paths();
    paths.push(PathBuf::from("/etc/ssl/openssl.cnf"));
    paths
}

/// A bearer token an HTTP MCP server registration may name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSecret {
    /// Environment variable of the registry holding the token (read at
    /// each connection; never stored, logged or shown).
    pub env: String,
    /// URL prefixes the token may be sent to; required, so a registrant
    /// cannot send it to a server of their own.
    pub urls: Vec<String>,
}

impl McpConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        for (name, s) in &self.secrets {
            if s.env.is_empty() || s.urls.is_empty() {
                return Err(format!(
                    "registry.mcp.secrets.{name}: env and at least one url prefix are required"
                ));
            }
        }
        if self.connect_timeout_ms == 0 {
            return Err("registry.mcp.connect_timeout_ms must be > 0".into());
        }
        Ok(())
    }
}

/// One registered server: its registration and its live session.
struct Slot {
    server: McpServer,
    session: Option<Arc<Session>>,
    /// Why it is disconnected, when it is.
    down: String,
    server_version: String,
    protocol_version: String,
    /// Wakes the list-changed follower of the current session.
    changed: Arc<Notify>,
}

/// The registry's MCP sessions.
pub(crate) struct Hub {
    cfg: McpConfig,
    sandbox: Result<Sandbox, String>,
    programs: Programs,
    http: Result<reqwest::Client, String>,
    /// Registered servers by name. The async mutex of each serialises its
    /// connection, registration and tool listing.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
}

impl Hub {
    pub(crate) fn new(cfg: McpConfig, http: Result<reqwest::Client, String>) -> Hub {
        let sandbox = Sandbox::detect(&Policy {
            mode: cfg.sandbox,
            read_paths: &cfg.read_paths,
            ids_when_root: (cfg.sandbox_uid, cfg.sandbox_gid),
            network_commands: &cfg.network_commands,
            scratch_root: &cfg.scratch_dir,
        });
        match &sandbox {
            Ok(s) if !cfg.commands.is_empty() => s.log(Some("stdio MCP servers")),
            Ok(_) => {}
            Err(e) => tracing::error!("stdio MCP servers are refused: {e}"),
        }
        let programs = Programs::resolve(&cfg.commands, &cfg.path);
        for (name, why) in programs.unusable() {
            tracing::warn!(
                command = name,
                "allowlisted MCP server command cannot run: {why}"
            );
        }
        Hub {
            cfg,
            sandbox,
            programs,
            http,
            slots: Mutex::default(),
        }
    }

    fn slot(&self, name: &str) -> Option<Arc<tokio::sync::Mutex<Slot>>> {
        self.slots.lock().ok()?.get(name).cloned()
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.connect_timeout_ms)
    }

    /// Checks a registration against the rules and this deployment.
    fn check(&self, s: &McpServer) -> Violations {
        let mut v = Violations::new();
        v.check("server.name", names::check_server(&s.name));
        if s.description.len() > 1024 {
            v.add(
                "server.description",
                "description must be at most 1024 characters",
            );
        }
        match &s.transport {
            None => v.add("server.transport", "stdio or http is required"),
            Some(Wire::Stdio(st)) => {
                if let Err(e) = self.programs.get(&st.command) {
                    v.add(
                        "server.stdio.command",
                        format!(
                            "{e} (registry.mcp.commands: {})",
                            self.cfg.commands.join(", ")
                        ),
                    );
                }
                for k in st.env.keys() {
                    if switchyard_sandbox::denied_env(k) {
                        v.add(
                            format!("server.stdio.env.{k}"),
                            format!("{k} may not be set for a confined program"),
                        );
                    }
                }
            }
            Some(Wire::Http(h)) => {
                let url =
                    egress::check(&h.url, &self.cfg.allowed_urls, "registry.mcp.allowed_urls");
                if let Err(e) = &url {
                    v.add("server.http.url", e.to_string());
                }
                if !h.bearer_secret.is_empty() {
                    match self.cfg.secrets.get(&h.bearer_secret) {
                        None => v.add(
                            "server.http.bearer_secret",
                            format!(
                                "no secret {:?} in registry.mcp.secrets (name a configured secret, never a token)",
                                h.bearer_secret
                            ),
                        ),
                        Some(sec)
                            if !url
                                .as_ref()
                                .is_ok_and(|u| sec.urls.iter().any(|p| egress::under(u, p))) =>
                        {
                            v.add(
                                "server.http.bearer_secret",
                                format!(
                                    "secret {:?} may not be sent to {:?}",
                                    h.bearer_secret, h.url
                                ),
                            )
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        v
    }

    /// Starts or reaches `s`.
    async fn connect(&self, s: &McpServer, changed: Arc<Notify>) -> Result<Session, String> {
        let transport = match &s.transport {
            Some(Wire::Stdio(st)) => Transport::Stdio(Box::new(self.start(&s.name, st)?)),
            Some(Wire::Http(h)) => {
                let bearer = match self.cfg.secrets.get(&h.bearer_secret) {
                    _ if h.bearer_secret.is_empty() => None,
                    None => return Err(format!("secret {:?} is not configured", h.bearer_secret)),
                    Some(sec) => Some(std::env::var(&sec.env).map_err(|_| {
                        format!(
                            "secret {:?} reads environment variable {}, which the registry does not have",
                            h.bearer_secret, sec.env
                        )
                    })?),
                };
                Transport::Http {
                    url: h.url.clone(),
                    bearer,
                    client: self.http.clone()?,
                }
            }
            None => return Err("no transport".into()),
        };
        Session::connect(&s.name, transport, changed, self.timeout())
            .await
            .map_err(|e| e.to_string())
    }

    /// Starts a stdio server in its scratch directory, confined.
    fn start(&self, name: &str, st: &McpStdio) -> Result<switchyard_sandbox::Service, String> {
        let sandbox = self.sandbox.as_ref().map_err(Clone::clone)?;
        let program = self.programs.get(&st.command).map_err(|e| e.to_string())?;
        let scratch = switchyard_sandbox::scratch::ScratchRoot::new(&self.cfg.scratch_dir)
            .prepare(name, [], sandbox.owner())
            .map_err(|e| format!("preparing the scratch directory of {name:?}: {e}"))?;
        let jail = sandbox
            .confine(&st.command, program, &scratch, &self.cfg.limits)
            .map_err(|e| e.to_string())?;
        let mut env = sandbox.base_env(&self.cfg.path, &scratch);
        env.extend(st.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        switchyard_sandbox::serve(&program.path, &st.command, &st.args, &env, &scratch, jail)
            .map_err(|e| e.to_string())
    }
}

impl Registry {
    /// Connects to every stored MCP server in the background (start-up).
    pub(crate) fn spawn_mcp_connections(&self) {
        let names: Vec<String> = match self.inner.hub.slots.lock() {
            Ok(s) => s.keys().cloned().collect(),
            Err(_) => return,
        };
        for name in names {
            let me = self.clone();
            tokio::spawn(async move {
                if let Err(e) = me.session(&name).await {
                    tracing::warn!(server = %name, error = %e, "MCP server not connected at start-up; the next call tries again");
                }
            });
        }
    }

    /// Forgets a server another replica removed.
    pub(crate) fn unload_mcp_server(&self, name: &str) {
        if let Ok(mut s) = self.inner.hub.slots.lock() {
            s.remove(name);
        }
    }

    /// Loads a stored server (start-up); it connects later.
    pub(crate) fn load_mcp_server(&self, server: McpServer) {
        let slot = Slot {
            server,
            session: None,
            down: "not connected since the registry started".into(),
            server_version: String::new(),
            protocol_version: String::new(),
            changed: Arc::new(Notify::new()),
        };
        if let Ok(mut s) = self.inner.hub.slots.lock() {
            s.insert(
                slot.server.name.clone(),
                Arc::new(tokio::sync::Mutex::new(slot)),
            );
        }
    }

    pub(crate) async fn register_mcp_impl(
        &self,
        server: Option<McpServer>,
        p: &Principal,
    ) -> Result<RegisterMcpServerResponse, RegistryError> {
        let Some(mut server) = server else {
            return Err(invalid("server", "server is required"));
        };
        let v = self.inner.hub.check(&server);
        if !v.is_empty() {
            return Err(RegistryError::Invalid(v));
        }
        if let Some(Wire::Http(h)) = &server.transport {
            self.reachable(p, "server.http.url", &h.url).await?;
        }
        let existing = self.inner.hub.slot(&server.name);
        let prev = match &existing {
            Some(slot) => Some(slot.lock().await.server.clone()),
            None => None,
        };
        if let Some(prev) = &prev {
            may_change(p, "mcp server", &prev.name, &prev.tenant, &prev.owner)?;
        }
        server.tenant = prev.as_ref().map_or_else(
            || p.tenant_scope().unwrap_or_default().to_owned(),
            |s| s.tenant.clone(),
        );
        server.owner = prev
            .as_ref()
            .map_or_else(|| p.acting_subject().to_owned(), |s| s.owner.clone());
        // Connect and list before storing anything: a server that cannot be
        // reached, or whose tools would clash, is refused whole.
        let changed = Arc::new(Notify::new());
        let session = self
            .inner
            .hub
            .connect(&server, changed.clone())
            .await
            .map_err(|message| RegistryError::McpUnavailable {
                server: server.name.clone(),
                // What the server answered is never echoed.
                message: egress::summary(&message),
            })?;
        let session = Arc::new(session);
        let (tools, skipped) = self.listed_tools(&server, &session).await?;
        let slot = existing.unwrap_or_else(|| {
            Arc::new(tokio::sync::Mutex::new(Slot {
                server: server.clone(),
                session: None,
                down: String::new(),
                server_version: String::new(),
                protocol_version: String::new(),
                changed: changed.clone(),
            }))
        });
        let mut guard = slot.lock().await;
        let stored = self.store_tools(&server, &tools, true)?;
        self.inner.durable.put_mcp(&server)?;
        self.inner.durable.sync().await?;
        guard.server = server.clone();
        self.attach(&mut guard, session, changed);
        let info = info_of(&guard, &stored);
        drop(guard);
        let created = prev.is_none();
        if let Ok(mut s) = self.inner.hub.slots.lock() {
            s.insert(server.name.clone(), slot);
        }
        tracing::info!(server = %server.name, tools = stored.len(), skipped = skipped.len(), created, "MCP server registered");
        Ok(RegisterMcpServerResponse {
            server: Some(info),
            tools,
            created,
            skipped,
        })
    }

    /// Makes `session` the slot's live session and follows its tool list.
    fn attach(&self, slot: &mut Slot, session: Arc<Session>, changed: Arc<Notify>) {
        slot.server_version = session.server_version().to_owned();
        slot.protocol_version = session.protocol_version().to_owned();
        slot.down.clear();
        // The old follower wakes, sees it is no longer current, and ends.
        slot.changed.notify_one();
        slot.changed = changed.clone();
        slot.session = Some(session.clone());
        let me = self.clone();
        let name = slot.server.name.clone();
        let weak = Arc::downgrade(&session);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = changed.notified() => {}
                    () = me.inner.shutdown.wait() => return,
                }
                let Some(session) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = me.refresh(&name, &session).await {
                    tracing::warn!(server = %name, error = %e, "refreshing an MCP server's tools failed");
                }
                if session.is_closed() {
                    return;
                }
            }
        });
    }

    /// Re-lists `name`'s tools after `notifications/tools/list_changed`.
    async fn refresh(&self, name: &str, session: &Arc<Session>) -> Result<(), RegistryError> {
        let Some(slot) = self.inner.hub.slot(name) else {
            return Ok(());
        };
        let guard = slot.lock().await;
        let current = guard
            .session
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, session));
        if !current {
            return Ok(());
        }
        let server = guard.server.clone();
        let (tools, skipped) = self.listed_tools(&server, session).await?;
        let stored = self.store_tools(&server, &tools, false)?;
        self.inner.durable.sync().await?;
        tracing::info!(server = %name, tools = stored.len(), skipped = skipped.len(), "MCP server's tool list changed");
        Ok(())
    }

    /// The server's tools as registry tools, and the ones that cannot be.
    async fn listed_tools(
        &self,
        server: &McpServer,
        session: &Session,
    ) -> Result<(Vec<Tool>, Vec<String>), RegistryError> {
        let listed = session
            .list_tools(self.inner.hub.timeout())
            .await
            .map_err(|e| RegistryError::McpUnavailable {
                server: server.name.clone(),
                message: egress::summary(&e.to_string()),
            })?;
        let mut tools: Vec<Tool> = Vec::new();
        let mut skipped = Vec::new();
        for t in listed {
            let name = match names::tool(&server.name, &t.name) {
                Ok(n) => n,
                Err(e) => {
                    skipped.push(format!("{}: {e}", t.name));
                    continue;
                }
            };
            // A tool whose header parameters are declared wrongly could
            // only be called with headers that misstate it (SEP-2243).
            if let Err(e) = switchyard_mcp::header_params(&t.input_schema) {
                skipped.push(format!("{}: {e}", t.name));
                continue;
            }
            if let Some(other) = tools.iter().find(|x| x.name == name) {
                skipped.push(format!(
                    "{}: its name {name:?} is taken by {:?} of the same server",
                    t.name, other.mcp_tool
                ));
                continue;
            }
            let mut description = t.description;
            if description.len() > crate::validate::MAX_DESCRIPTION {
                let mut end = crate::validate::MAX_DESCRIPTION;
                while !description.is_char_boundary(end) {
                    end -= 1;
                }
                description.truncate(end);
            }
            let tool = Tool {
                name,
                description,
                parameters: json_to_struct(&t.input_schema),
                endpoint: String::new(),
                tenant: server.tenant.clone(),
                owner: server.owner.clone(),
                mcp_server: server.name.clone(),
                mcp_tool: t.name.clone(),
                requires_approval: false,
            };
            let (v, _) = crate::validate::tool(&tool);
            if v.is_empty() {
                tools.push(tool);
            } else {
                skipped.push(format!("{}: {v}", t.name));
            }
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((tools, skipped))
    }

    /// Replaces `server`'s tools with `tools` (durably, not yet synced).
    /// A name held by a tool of another provider is refused when
    /// `strict` (a registration), skipped otherwise (a refresh).
    fn store_tools(
        &self,
        server: &McpServer,
        tools: &[Tool],
        strict: bool,
    ) -> Result<Vec<String>, RegistryError> {
        let mut st = self.lock();
        let mut keep = Vec::new();
        for t in tools {
            match st.tools.get(&t.name) {
                Some(other) if other.mcp_server != server.name => {
                    if strict {
                        return Err(RegistryError::Taken {
                            what: "tool",
                            id: t.name.clone(),
                        });
                    }
                    tracing::warn!(tool = %t.name, server = %server.name, "an MCP tool's name is taken by another tool; not registered");
                }
                _ => keep.push(t),
            }
        }
        let gone: Vec<String> = st
            .tools
            .values()
            .filter(|t| t.mcp_server == server.name && !keep.iter().any(|k| k.name == t.name))
            .map(|t| t.name.clone())
            .collect();
        for name in &gone {
            self.inner.durable.remove_tool(name)?;
            st.tools.remove(name);
            st.emit_tool_removed(name);
        }
        for t in &keep {
            if st.tools.get(&t.name) != Some(*t) {
                self.inner.durable.put_tool(t)?;
                st.tools.insert(t.name.clone(), (*t).clone());
                st.emit_tool((*t).clone());
            }
        }
        drop(st);
        self.notify();
        Ok(keep.iter().map(|t| t.name.clone()).collect())
    }

    pub(crate) async fn deregister_mcp_impl(
        &self,
        name: String,
        p: &Principal,
    ) -> Result<(), RegistryError> {
        let Some(slot) = self.inner.hub.slot(&name) else {
            return Err(RegistryError::McpServerNotFound(name));
        };
        let mut guard = slot.lock().await;
        if !sees(p, &guard.server.tenant) {
            return Err(RegistryError::McpServerNotFound(name));
        }
        may_change(
            p,
            "mcp server",
            &name,
            &guard.server.tenant,
            &guard.server.owner,
        )?;
        {
            let mut st = self.lock();
            let tools: Vec<String> = st
                .tools
                .values()
                .filter(|t| t.mcp_server == name)
                .map(|t| t.name.clone())
                .collect();
            for t in &tools {
                let users = st.tool_users(t);
                if !users.is_empty() {
                    return Err(RegistryError::ToolInUse {
                        tool: t.clone(),
                        agents: users,
                    });
                }
            }
            for t in &tools {
                self.inner.durable.remove_tool(t)?;
                st.tools.remove(t);
                st.emit_tool_removed(t);
            }
            self.inner.durable.remove_mcp(&name)?;
        }
        self.notify();
        self.inner.durable.sync().await?;
        if let Ok(mut s) = self.inner.hub.slots.lock() {
            s.remove(&name);
        }
        guard.changed.notify_one();
        // Calls in flight hold the session; the last one to end closes it
        // (and stops a stdio server).
        guard.session = None;
        tracing::info!(server = %name, "MCP server deregistered");
        Ok(())
    }

    pub(crate) async fn list_mcp_impl(&self, p: &Principal) -> ListMcpServersResponse {
        let slots: Vec<_> = match self.inner.hub.slots.lock() {
            Ok(s) => s.values().cloned().collect(),
            Err(_) => Vec::new(),
        };
        let mut servers = Vec::new();
        for slot in slots {
            let guard = slot.lock().await;
            if !sees(p, &guard.server.tenant) {
                continue;
            }
            let tools: Vec<String> = self
                .lock()
                .tools
                .values()
                .filter(|t| t.mcp_server == guard.server.name)
                .map(|t| t.name.clone())
                .collect();
            servers.push(info_of(&guard, &tools));
        }
        servers.sort_by(|a, b| {
            let name = |i: &McpServerInfo| i.server.as_ref().map(|s| s.name.clone());
            name(a).cmp(&name(b))
        });
        ListMcpServersResponse { servers }
    }

    /// The live session of `name`, connecting (and re-listing its tools)
    /// when there is none.
    async fn session(&self, name: &str) -> Result<Arc<Session>, String> {
        let slot = self
            .inner
            .hub
            .slot(name)
            .ok_or_else(|| format!("MCP server {name:?} is not registered"))?;
        let mut guard = slot.lock().await;
        if let Some(s) = guard.session.as_ref().filter(|s| !s.is_closed()) {
            return Ok(s.clone());
        }
        let changed = Arc::new(Notify::new());
        let server = guard.server.clone();
        let connected = self.inner.hub.connect(&server, changed.clone()).await;
        let session = match connected {
            Ok(s) => Arc::new(s),
            Err(e) => {
                guard.session = None;
                guard.down.clone_from(&e);
                return Err(e);
            }
        };
        self.attach(&mut guard, session.clone(), changed);
        drop(guard);
        // What it offers may have changed while it was away.
        match self.listed_tools(&server, &session).await {
            Ok((tools, _)) => {
                self.store_tools(&server, &tools, false)
                    .map_err(|e| e.to_string())?;
            }
            Err(e) => {
                tracing::warn!(server = %name, error = %e, "re-listing tools after reconnecting failed")
            }
        }
        Ok(session)
    }

    /// Marks `name` disconnected when `session` is still its session.
    async fn lost(&self, name: &str, session: &Arc<Session>, why: &str) {
        if let Some(slot) = self.inner.hub.slot(name) {
            let mut guard = slot.lock().await;
            if guard
                .session
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, session))
            {
                guard.session = None;
                guard.down = why.to_owned();
                guard.changed.notify_one();
                tracing::warn!(server = %name, why, "MCP server disconnected");
            }
        }
    }

    pub(crate) fn call_mcp_impl(
        &self,
        req: CallMcpToolRequest,
        p: &Principal,
    ) -> Result<ReceiverStream<Result<CallMcpToolResponse, Status>>, RegistryError> {
        let tool = {
            let st = self.lock();
            st.tools
                .get(&req.name)
                .filter(|t| sees(p, &t.tenant) && !t.mcp_server.is_empty())
                .cloned()
        };
        let Some(tool) = tool else {
            return Err(RegistryError::ToolNotFound(req.name));
        };
        let args = match req.arguments.as_ref().map(struct_to_json) {
            Some(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        let (tx, rx) = mpsc::channel(64);
        let me = self.clone();
        let correlation = req.correlation.unwrap_or_default();
        tokio::spawn(async move {
            let result = me.run_call(&tool, args, &tx).await;
            tracing::debug!(
                tool = %tool.name,
                server = %tool.mcp_server,
                correlation_id = %correlation.correlation_id,
                job_id = %correlation.job_id,
                ok = result.is_ok(),
                "MCP tool call ended"
            );
            let r = match result {
                Ok(v) => McpToolResult {
                    result: Some(json_to_value(&v)),
                    error: String::new(),
                },
                Err(e) => McpToolResult {
                    result: None,
                    error: e,
                },
            };
            let _ = tx
                .send(Ok(CallMcpToolResponse {
                    event: Some(Event::Result(r)),
                }))
                .await;
        });
        Ok(ReceiverStream::new(rx))
    }

    /// Runs one call, relaying progress; `Err` is what the model is told.
    /// Ends early (cancelling the call on the server) when the caller left.
    async fn run_call(
        &self,
        tool: &Tool,
        args: serde_json::Map<String, serde_json::Value>,
        tx: &mpsc::Sender<Result<CallMcpToolResponse, Status>>,
    ) -> Result<serde_json::Value, String> {
        let session = self
            .session(&tool.mcp_server)
            .await
            .map_err(|e| format!("MCP server {:?} is unavailable: {e}", tool.mcp_server))?;
        let (ptx, mut prx) = mpsc::unbounded_channel();
        let call = session.call(&tool.mcp_tool, args, ptx);
        tokio::pin!(call);
        let ended = loop {
            // Progress first: what the server sent before its answer is
            // relayed before the result.
            tokio::select! {
                biased;
                Some(pg) = prx.recv() => {
                    if !relay(tx, pg).await {
                        return Err("the caller went away".into());
                    }
                }
                r = &mut call => break r,
                () = tx.closed() => return Err("the caller went away".into()),
                () = self.inner.shutdown.wait() => return Err("the registry is shutting down".into()),
            }
        };
        while let Ok(pg) = prx.try_recv() {
            if !relay(tx, pg).await {
                return Err("the caller went away".into());
            }
        }
        match ended {
            Ok(r) => switchyard_mcp::result_value(&r),
            Err(e) => {
                if session.is_closed() || matches!(e, switchyard_mcp::McpError::Closed { .. }) {
                    self.lost(&tool.mcp_server, &session, &e.to_string()).await;
                }
                Err(e.to_string())
            }
        }
    }
}

/// Sends one progress update to the caller; false when it went away.
async fn relay(
    tx: &mpsc::Sender<Result<CallMcpToolResponse, Status>>,
    pg: switchyard_mcp::Progress,
) -> bool {
    let ev = CallMcpToolResponse {
        event: Some(Event::Progress(McpProgress {
            progress: pg.progress,
            total: pg.total.unwrap_or(0.0),
            message: pg.message.unwrap_or_default(),
        })),
    };
    tx.send(Ok(ev)).await.is_ok()
}

fn info_of(slot: &Slot, tools: &[String]) -> McpServerInfo {
    let connected = slot.session.as_ref().is_some_and(|s| !s.is_closed());
    let mut tools = tools.to_vec();
    tools.sort();
    McpServerInfo {
        server: Some(slot.server.clone()),
        state: if connected {
            McpServerState::Connected
        } else {
            McpServerState::Disconnected
        } as i32,
        state_message: if connected {
            String::new()
        } else if slot.down.is_empty() {
            "the session ended".into()
        } else {
            slot.down.clone()
        },
        tools,
        server_version: slot.server_version.clone(),
        protocol_version: slot.protocol_version.clone(),
    }
}
