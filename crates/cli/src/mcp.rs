//! `switchyard mcp`: Switchyard as an MCP server on stdin/stdout, for an MCP
//! host (an IDE, a desktop assistant, another agent) that starts it as a
//! subprocess. It calls Switchyard as the principal whose credential it is
//! given (`--token`, or `--as NAME` from the credentials file), so it can do
//! exactly what that principal may — and never approve: no tool does.

use anyhow::Context as _;
use clap::Args;
use switchyard_mcp::server::{Endpoints, Identity, SwitchyardMcp};

use crate::client::{Conn, MAX_MESSAGE};

/// `switchyard mcp`.
#[derive(Args, Debug)]
pub struct McpArgs {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio, for a
    /// host on this machine (a loopback address only: whoever reaches it
    /// acts with this command's credential). Port 0 picks a free port; the
    /// line `listening mcp=http://…/mcp` says which.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    conn: Conn,
}

/// Serves MCP on stdio until the host closes it (nothing but MCP goes to
/// stdout), or on `--listen` until SIGINT/SIGTERM.
pub async fn run(a: McpArgs) -> anyhow::Result<()> {
    let credential = a.conn.credential()?.context(
        "switchyard mcp calls Switchyard as someone: pass --token (or SWITCHYARD_TOKEN), or --as NAME with the credentials file",
    )?;
    let server = SwitchyardMcp::new(
        &Endpoints::single(&a.conn.url),
        Identity::Fixed(credential),
        MAX_MESSAGE,
    )
    .map_err(anyhow::Error::msg)?;
    if let Some(addr) = a.listen {
        return serve_http(server, addr).await;
    }
    let running = rmcp::ServiceExt::serve(server, rmcp::transport::io::stdio())
        .await
        .context("starting the MCP session on stdio")?;
    running.waiting().await.context("the MCP session")?;
    Ok(())
}

/// Streamable HTTP on a loopback address, one session per client.
async fn serve_http(server: SwitchyardMcp, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    if !addr.ip().is_loopback() {
        anyhow::bail!(
            "--listen {addr}: only a loopback address (127.0.0.1, [::1]): anyone who reaches it acts with this command's credential; for a shared endpoint use the gateway's /mcp, which authenticates each request"
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let config = StreamableHttpServerConfig::default();
    let stateless = std::sync::Arc::new(switchyard_mcp::stateless::Stateless {
        server: server.clone(),
        max_body: MAX_MESSAGE,
        allowed_hosts: config.allowed_hosts.clone(),
    });
    let svc = StreamableHttpService::new(
        move || Ok(server.clone()),
        std::sync::Arc::new(LocalSessionManager::default()),
        config,
    );
    // 2026-07-28 (stateless) here, the session revisions through rmcp.
    let app = axum::Router::new().route_service("/mcp", svc).route_layer(
        axum::middleware::from_fn_with_state(stateless, switchyard_mcp::stateless::layer),
    );
    println!("listening mcp=http://{bound}/mcp");
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    switchyard_kit::shutdown::on_signals(trigger);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.wait().await })
        .await
        .context("serving MCP over HTTP")
}
