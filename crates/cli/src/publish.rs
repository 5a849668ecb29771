//! `switchyard agents publish`: a person publishes an agent a builder agent
//! proposed into the manifest directory an agents host serves.

use switchyard_api::{ExecutorClient, RegistryClient};
use switchyard_cli::agents::{Publish, publish};

use crate::client::{Conn, MAX_MESSAGE};

/// Publishes as the caller of `conn` (the registry at `registry_url`,
/// else at the same address) and says what happened.
pub(crate) async fn run(
    p: Publish<'_>,
    conn: &Conn,
    registry_url: Option<&str>,
) -> anyhow::Result<()> {
    let channel = conn.channel().await?;
    let executor = ExecutorClient::remote(channel.clone(), MAX_MESSAGE);
    let registry = match registry_url {
        Some(u) => switchyard_kit::client::authed(
            switchyard_kit::client::connect(u).await?,
            conn.credential()?,
        ),
        None => channel,
    };
    let registry = RegistryClient::remote(registry, MAX_MESSAGE);
    let waits = !p.wait.is_zero();
    let done = publish(&executor, &registry, p).await?;
    println!(
        "published {} ({}) to {}",
        done.registry_id,
        done.name,
        done.file.display()
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
