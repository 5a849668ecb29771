//! `switchyard agents publish`: a person publishes an agent a builder agent
//! proposed into the manifest directory an agents host serves.

use switchyard_api::{ApprovalClient, ExecutorClient, RegistryClient};
use switchyard_cli::agents::{Publish, publish};

use crate::client::{Conn, MAX_MESSAGE};

/// Publishes as the caller of `conn` (the registry and the approval
/// service at their URLs when given, else at the same address) and says
/// what happened.
pub(crate) async fn run(
    p: Publish<'_>,
    conn: &Conn,
    registry_url: Option<&str>,
    approval_url: Option<&str>,
) -> anyhow::Result<()> {
    let channel = conn.channel().await?;
    let executor = ExecutorClient::remote(channel.clone(), MAX_MESSAGE);
    let registry = at(conn, &channel, registry_url).await?;
    let approval = at(conn, &channel, approval_url).await?;
    let registry = RegistryClient::remote(registry, MAX_MESSAGE);
    let approval = ApprovalClient::remote(approval, MAX_MESSAGE);
    let waits = !p.wait.is_zero();
    let done = publish(&executor, &registry, &approval, p).await?;
    println!(
        "published {} ({}) to {}, approved by {} (approval run {})",
        done.registry_id,
        done.name,
        done.file.display(),
        done.approved_by,
        done.run_id
    );
    if waits {
        println!(
            "{} is registered and routable: capabilities [{}]",
            done.registry_id,
            done.capabilities.join(", ")
        );
    }
    Ok(())
}

/// A channel to the service at `url`, or `channel` (the same address).
pub(crate) async fn at(
    conn: &Conn,
    channel: &switchyard_kit::client::Intercepted,
    url: Option<&str>,
) -> anyhow::Result<switchyard_kit::client::Intercepted> {
    Ok(match url {
        Some(u) => switchyard_kit::client::authed(
            switchyard_kit::client::connect(u).await?,
            conn.credential()?,
        ),
        None => channel.clone(),
    })
}
