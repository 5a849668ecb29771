//! Where the registry's records are kept: sled trees in one process, or
//! PostgreSQL tables shared by every replica.
//!
//! Writes are staged under the registry's lock (`put_*`, `remove_*`) and
//! made durable by [`Durable::sync`], which callers await before they
//! answer — on sled the trees are written at once and `sync` flushes; on
//! PostgreSQL the staged writes of everyone waiting go into one transaction
//! (group commit), each with a row in `registry_changes` that the other
//! replicas tail to update their own views.
//!
//! Heartbeats never write a row each: leases, in-flight counts and routing
//! statistics live in memory and are written in batches
//! ([`Durable::persist_leases`]: one statement for every agent whose lease
//! changed since the last batch). Replicas read what changed since their
//! last look ([`PgRegistry::leases_since`]) before deciding which leases
//! lapsed, so every replica lapses an agent from the same lease.

use std::sync::Mutex;

use prost::Message;
use switchyard_proto::registry::v1::{Agent, McpServer, Tool};
use switchyard_store::pg::{Migration, Pg, ms};
use switchyard_store::{Store, StoreError, Tree};

/// The schema, in order. Never edit a released migration: add one.
pub(crate) const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "agents, tools, MCP servers and the change log",
    sql: "
        CREATE TABLE registry_agents (
            id TEXT PRIMARY KEY,
            data BYTEA NOT NULL,
            stats BYTEA NOT NULL,
            lease_expires_ms BIGINT NOT NULL,
            in_flight INT NOT NULL,
            touched_ms BIGINT NOT NULL);
        CREATE INDEX registry_agents_touched ON registry_agents (touched_ms);
        CREATE TABLE registry_tools (name TEXT PRIMARY KEY, data BYTEA NOT NULL);
        CREATE TABLE registry_mcp_servers (name TEXT PRIMARY KEY, data BYTEA NOT NULL);
        CREATE SEQUENCE registry_changes_seq;
        CREATE TABLE registry_changes (
            seq BIGINT PRIMARY KEY,
            replica TEXT NOT NULL,
            kind TEXT NOT NULL,
            key TEXT NOT NULL);
    ",
}];

/// Every stored agent, tool and MCP server.
pub(crate) type Loaded = (Vec<Agent>, Vec<Tool>, Vec<McpServer>);

/// One staged write.
#[derive(Debug, Clone)]
enum Write {
    Agent(Box<Agent>),
    AgentGone(String),
    Tool(Box<Tool>),
    ToolGone(String),
    Mcp(Box<McpServer>),
    McpGone(String),
}

/// A change another replica made: what to read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Agent `id` was registered, changed or removed.
    Agent(String),
    /// Tool `name` was registered, changed or removed.
    Tool(String),
    /// MCP server `name` was registered, changed or removed.
    Mcp(String),
}

/// The durable records.
pub(crate) enum Durable {
    /// Sled trees of this process.
    Sled {
        store: Store,
        agents: Tree<Agent>,
        tools: Tree<Tool>,
        mcp: Tree<McpServer>,
    },
    /// PostgreSQL, shared by every replica.
    Pg(PgRegistry),
}

impl Durable {
    /// Opens the sled trees.
    pub(crate) fn sled(store: Store) -> Result<Durable, StoreError> {
        Ok(Durable::Sled {
            agents: store.tree("agents")?,
            tools: store.tree("tools")?,
            mcp: store.tree("mcp_servers")?,
            store,
        })
    }

    fn stage(&self, w: Write) -> Result<(), StoreError> {
        match self {
            Durable::Sled {
                agents, tools, mcp, ..
            } => match w {
                Write::Agent(a) => {
                    let id = a.spec.as_ref().map(|s| s.id.clone()).unwrap_or_default();
                    agents.put(&id, &a)
                }
                Write::AgentGone(id) => agents.remove(&id).map(drop),
                Write::Tool(t) => tools.put(&t.name, &t),
                Write::ToolGone(name) => tools.remove(&name).map(drop),
                Write::Mcp(s) => mcp.put(&s.name, &s),
                Write::McpGone(name) => mcp.remove(&name).map(drop),
            },
            Durable::Pg(pg) => {
                pg.staged.lock().unwrap_or_else(|p| p.into_inner()).push(w);
                Ok(())
            }
        }
    }

    pub(crate) fn put_agent(&self, agent: &Agent) -> Result<(), StoreError> {
        self.stage(Write::Agent(Box::new(agent.clone())))
    }

    pub(crate) fn remove_agent(&self, id: &str) -> Result<(), StoreError> {
        self.stage(Write::AgentGone(id.to_owned()))
    }

    pub(crate) fn put_tool(&self, tool: &Tool) -> Result<(), StoreError> {
        self.stage(Write::Tool(Box::new(tool.clone())))
    }

    pub(crate) fn remove_tool(&self, name: &str) -> Result<(), StoreError> {
        self.stage(Write::ToolGone(name.to_owned()))
    }

    pub(crate) fn put_mcp(&self, server: &McpServer) -> Result<(), StoreError> {
        self.stage(Write::Mcp(Box::new(server.clone())))
    }

    pub(crate) fn remove_mcp(&self, name: &str) -> Result<(), StoreError> {
        self.stage(Write::McpGone(name.to_owned()))
    }

    /// Makes everything staged so far durable.
    pub(crate) async fn sync(&self) -> Result<(), StoreError> {
        match self {
            Durable::Sled { store, .. } => store.sync().await,
            Durable::Pg(pg) => pg.flush().await,
        }
    }

    /// Writes the leases, in-flight counts and statistics of `agents` (sled:
    /// the whole records; PostgreSQL: those columns only, one statement).
    pub(crate) async fn persist_leases(
        &self,
        agents: &[Agent],
        now: u64,
    ) -> Result<(), StoreError> {
        match self {
            Durable::Sled { agents: tree, .. } => put_agents(tree, agents),
            Durable::Pg(pg) => pg.persist_leases(agents, now).await,
        }
    }

    /// Every stored agent, tool and MCP server.
    pub(crate) async fn load(&self) -> Result<Loaded, StoreError> {
        match self {
            Durable::Sled { .. } => self.load_sled(),
            Durable::Pg(pg) => pg.load().await,
        }
    }

    /// Every record in the sled trees (nothing on PostgreSQL: see `load`).
    pub(crate) fn load_sled(&self) -> Result<Loaded, StoreError> {
        fn all<V: Message + Default>(t: &Tree<V>) -> Result<Vec<V>, StoreError> {
            t.iter().map(|r| r.map(|(_, v)| v)).collect()
        }
        match self {
            Durable::Sled {
                agents, tools, mcp, ..
            } => Ok((all(agents)?, all(tools)?, all(mcp)?)),
            Durable::Pg(_) => Ok(Loaded::default()),
        }
    }

    /// Flushes to disk at shutdown (sled: with the leases of the agents
    /// `dirty` names; on PostgreSQL the last lease batch is written by the
    /// background task, and leases are renewed by heartbeats anyway).
    pub(crate) fn flush_blocking(
        &self,
        dirty: impl FnOnce() -> Vec<Agent>,
    ) -> Result<(), StoreError> {
        match self {
            Durable::Sled { store, agents, .. } => {
                put_agents(agents, &dirty())?;
                store.flush_blocking()
            }
            Durable::Pg(_) => Ok(()),
        }
    }

    /// Changes other replicas made after `after`, as they commit (none
    /// where this process is the only writer).
    pub(crate) fn changes(
        &self,
        after: u64,
    ) -> futures_util::stream::BoxStream<'static, Result<Change, StoreError>> {
        use futures_util::StreamExt;
        match self {
            Durable::Sled { .. } => futures_util::stream::empty().boxed(),
            Durable::Pg(pg) => pg.changes(after),
        }
    }

    /// Agent `id` as stored.
    pub(crate) async fn agent(&self, id: &str) -> Result<Option<Agent>, StoreError> {
        match self {
            Durable::Sled { agents, .. } => agents.get(id),
            Durable::Pg(pg) => pg.agent(id).await,
        }
    }

    /// Tool `name` as stored.
    pub(crate) async fn tool(&self, name: &str) -> Result<Option<Tool>, StoreError> {
        match self {
            Durable::Sled { tools, .. } => tools.get(name),
            Durable::Pg(pg) => pg.tool(name).await,
        }
    }

    /// MCP server `name` as stored.
    pub(crate) async fn mcp(&self, name: &str) -> Result<Option<McpServer>, StoreError> {
        match self {
            Durable::Sled { mcp, .. } => mcp.get(name),
            Durable::Pg(pg) => pg.mcp(name).await,
        }
    }

    /// Agents whose leases, in-flight counts or statistics other replicas
    /// wrote since `since_ms` (none where this process is the only writer).
    pub(crate) async fn leases_since(&self, since_ms: u64) -> Result<Vec<Agent>, StoreError> {
        match self {
            Durable::Sled { .. } => Ok(Vec::new()),
            Durable::Pg(pg) => pg.leases_since(since_ms).await,
        }
    }
}

/// Writes whole agent records to the sled tree (sled's lease batch).
pub(crate) fn put_agents(tree: &Tree<Agent>, agents: &[Agent]) -> Result<(), StoreError> {
    for a in agents {
        if let Some(s) = &a.spec {
            tree.put(&s.id, a)?;
        }
    }
    Ok(())
}

/// The registry's tables.
pub(crate) struct PgRegistry {
    pub(crate) db: Pg,
    /// Names this replica in the change log (it skips its own changes).
    pub(crate) replica: String,
    staged: Mutex<Vec<Write>>,
    /// One flush at a time; a caller finding its writes taken by another's
    /// flush waits for that one.
    flushing: tokio::sync::Mutex<()>,
}

fn decode<M: Message + Default>(what: &str, data: &[u8]) -> Result<M, StoreError> {
    M::decode(data).map_err(|e| StoreError::Io(format!("a stored {what} does not decode: {e}")))
}

/// An agent as stored: the record, and its statistics apart (written by
/// the lease batches of whichever replica served the calls).
fn split(agent: &Agent) -> (Vec<u8>, Vec<u8>) {
    let mut record = agent.clone();
    let stats = Agent {
        stats: std::mem::take(&mut record.stats),
        ..Default::default()
    };
    record.lease_expires_at = None;
    record.in_flight = 0;
    (record.encode_to_vec(), stats.encode_to_vec())
}

/// The agent of a row: (data, stats, lease ms, in flight).
fn join(data: &[u8], stats: &[u8], lease_ms: i64, in_flight: i32) -> Result<Agent, StoreError> {
    let mut a: Agent = decode("agent", data)?;
    a.stats = decode::<Agent>("agent's statistics", stats)?.stats;
    a.lease_expires_at = Some(switchyard_kit::time::timestamp(lease_ms.max(0) as u64));
    a.in_flight = u32::try_from(in_flight).unwrap_or(0);
    Ok(a)
}

impl PgRegistry {
    /// Migrates the schema.
    pub(crate) async fn open(db: Pg) -> Result<PgRegistry, StoreError> {
        db.migrate_service("registry", MIGRATIONS).await?;
        Ok(PgRegistry {
            db,
            replica: format!("registry-{}", uuid::Uuid::new_v4().simple()),
            staged: Mutex::new(Vec::new()),
            flushing: tokio::sync::Mutex::new(()),
        })
    }

    /// Writes what is staged, with its change rows, in one transaction.
    async fn flush(&self) -> Result<(), StoreError> {
        // Whoever holds the flush lock writes everything staged until it
        // took it, including ours: once we hold it, ours is written.
        let _one = self.flushing.lock().await;
        let writes = std::mem::take(&mut *self.staged.lock().unwrap_or_else(|p| p.into_inner()));
        if writes.is_empty() {
            return Ok(());
        }
        let db = &self.db;
        let err = |e: tokio_postgres::Error| db.error("writing the registry", &e);
        let mut c = db.client().await?;
        let tx = c.transaction().await.map_err(err)?;
        let mut changes: Vec<(&str, String)> = Vec::new();
        for w in &writes {
            match w {
                Write::Agent(a) => {
                    let id = a.spec.as_ref().map(|s| s.id.clone()).unwrap_or_default();
                    let (data, stats) = split(a);
                    let lease = a
                        .lease_expires_at
                        .as_ref()
                        .map_or(0, |t| ms(switchyard_kit::time::timestamp_ms(t)));
                    tx.execute(
                        "INSERT INTO registry_agents (id, data, stats, lease_expires_ms, in_flight, touched_ms)
                         VALUES ($1, $2, $3, $4, $5, $4)
                         ON CONFLICT (id) DO UPDATE SET data = EXCLUDED.data, stats = EXCLUDED.stats,
                             lease_expires_ms = EXCLUDED.lease_expires_ms, in_flight = EXCLUDED.in_flight,
                             touched_ms = EXCLUDED.touched_ms",
                        &[
                            &id as &(dyn tokio_postgres::types::ToSql + Sync),
                            &data,
                            &stats,
                            &lease,
                            &(a.in_flight as i32),
                        ],
                    )
                    .await
                    .map_err(err)?;
                    changes.push(("agent", id));
                }
                Write::AgentGone(id) => {
                    tx.execute("DELETE FROM registry_agents WHERE id = $1", &[id])
                        .await
                        .map_err(err)?;
                    changes.push(("agent", id.clone()));
                }
                Write::Tool(t) => {
                    tx.execute(
                        "INSERT INTO registry_tools (name, data) VALUES ($1, $2)
                         ON CONFLICT (name) DO UPDATE SET data = EXCLUDED.data",
                        &[
                            &t.name as &(dyn tokio_postgres::types::ToSql + Sync),
                            &t.encode_to_vec(),
                        ],
                    )
                    .await
                    .map_err(err)?;
                    changes.push(("tool", t.name.clone()));
                }
                Write::ToolGone(name) => {
                    tx.execute("DELETE FROM registry_tools WHERE name = $1", &[name])
                        .await
                        .map_err(err)?;
                    changes.push(("tool", name.clone()));
                }
                Write::Mcp(s) => {
                    tx.execute(
                        "INSERT INTO registry_mcp_servers (name, data) VALUES ($1, $2)
                         ON CONFLICT (name) DO UPDATE SET data = EXCLUDED.data",
                        &[
                            &s.name as &(dyn tokio_postgres::types::ToSql + Sync),
                            &s.encode_to_vec(),
                        ],
                    )
                    .await
                    .map_err(err)?;
                    changes.push(("mcp", s.name.clone()));
                }
                Write::McpGone(name) => {
                    tx.execute("DELETE FROM registry_mcp_servers WHERE name = $1", &[name])
                        .await
                        .map_err(err)?;
                    changes.push(("mcp", name.clone()));
                }
            }
        }
        let kinds: Vec<&str> = changes.iter().map(|(k, _)| *k).collect();
        let keys: Vec<&str> = changes.iter().map(|(_, k)| k.as_str()).collect();
        tx.execute(
            "INSERT INTO registry_changes (seq, replica, kind, key)
             SELECT nextval('registry_changes_seq'), $1, k.kind, k.key
             FROM unnest($2::TEXT[], $3::TEXT[]) AS k(kind, key)",
            &[
                &self.replica as &(dyn tokio_postgres::types::ToSql + Sync),
                &kinds,
                &keys,
            ],
        )
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)
    }

    /// One statement for every agent whose lease, in-flight count or
    /// statistics changed; a lease only ever moves forward.
    async fn persist_leases(&self, agents: &[Agent], now: u64) -> Result<(), StoreError> {
        if agents.is_empty() {
            return Ok(());
        }
        let (mut ids, mut leases, mut in_flight, mut stats) = (vec![], vec![], vec![], vec![]);
        for a in agents {
            let Some(s) = &a.spec else { continue };
            ids.push(s.id.clone());
            leases.push(
                a.lease_expires_at
                    .as_ref()
                    .map_or(0, |t| ms(switchyard_kit::time::timestamp_ms(t))),
            );
            in_flight.push(a.in_flight as i32);
            stats.push(split(a).1);
        }
        self.db
            .client()
            .await?
            .execute(
                "UPDATE registry_agents a SET
                     lease_expires_ms = GREATEST(a.lease_expires_ms, v.lease),
                     in_flight = v.in_flight, stats = v.stats, touched_ms = $5
                 FROM unnest($1::TEXT[], $2::BIGINT[], $3::INT[], $4::BYTEA[])
                     AS v(id, lease, in_flight, stats)
                 WHERE a.id = v.id",
                &[&ids, &leases, &in_flight, &stats, &ms(now)],
            )
            .await
            .map_err(|e| self.db.error("writing leases", &e))?;
        Ok(())
    }

    /// Agents whose lease, in-flight count or statistics were written at or
    /// after `since_ms` (by any replica).
    pub(crate) async fn leases_since(&self, since_ms: u64) -> Result<Vec<Agent>, StoreError> {
        let rows = self
            .db
            .client()
            .await?
            .query(
                "SELECT data, stats, lease_expires_ms, in_flight FROM registry_agents
                 WHERE touched_ms >= $1",
                &[&ms(since_ms)],
            )
            .await
            .map_err(|e| self.db.error("reading leases", &e))?;
        rows.iter()
            .map(|r| join(r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    }

    async fn load(&self) -> Result<Loaded, StoreError> {
        let c = self.db.client().await?;
        let err = |e: tokio_postgres::Error| self.db.error("loading the registry", &e);
        let agents = c
            .query(
                "SELECT data, stats, lease_expires_ms, in_flight FROM registry_agents",
                &[],
            )
            .await
            .map_err(err)?
            .iter()
            .map(|r| join(r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect::<Result<_, _>>()?;
        let tools = c
            .query("SELECT data FROM registry_tools", &[])
            .await
            .map_err(err)?
            .iter()
            .map(|r| decode("tool", r.get(0)))
            .collect::<Result<_, _>>()?;
        let mcp = c
            .query("SELECT data FROM registry_mcp_servers", &[])
            .await
            .map_err(err)?
            .iter()
            .map(|r| decode("MCP server", r.get(0)))
            .collect::<Result<_, _>>()?;
        Ok((agents, tools, mcp))
    }

    /// The stored agent `id`, if any.
    pub(crate) async fn agent(&self, id: &str) -> Result<Option<Agent>, StoreError> {
        let row = self
            .db
            .client()
            .await?
            .query_opt(
                "SELECT data, stats, lease_expires_ms, in_flight FROM registry_agents WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(|e| self.db.error("reading an agent", &e))?;
        row.map(|r| join(r.get(0), r.get(1), r.get(2), r.get(3)))
            .transpose()
    }

    /// The stored tool `name`, if any.
    pub(crate) async fn tool(&self, name: &str) -> Result<Option<Tool>, StoreError> {
        let row = self
            .db
            .client()
            .await?
            .query_opt("SELECT data FROM registry_tools WHERE name = $1", &[&name])
            .await
            .map_err(|e| self.db.error("reading a tool", &e))?;
        row.map(|r| decode("tool", r.get(0))).transpose()
    }

    /// The stored MCP server `name`, if any.
    pub(crate) async fn mcp(&self, name: &str) -> Result<Option<McpServer>, StoreError> {
        let row = self
            .db
            .client()
            .await?
            .query_opt(
                "SELECT data FROM registry_mcp_servers WHERE name = $1",
                &[&name],
            )
            .await
            .map_err(|e| self.db.error("reading an MCP server", &e))?;
        row.map(|r| decode("MCP server", r.get(0))).transpose()
    }

    /// Other replicas' changes after `after`, as they commit.
    pub(crate) fn changes(
        &self,
        after: u64,
    ) -> futures_util::stream::BoxStream<'static, Result<Change, StoreError>> {
        use futures_util::StreamExt;
        let me = self.replica.clone();
        // The row's own encoding: replica, kind and key, NUL-separated.
        switchyard_store::pg::tail(
            self.db.clone(),
            "SELECT seq, convert_to(replica || chr(1) || kind || chr(1) || key, 'UTF8')
             FROM registry_changes WHERE seq > $1 ORDER BY seq LIMIT 1000",
            after,
        )
        .filter_map(move |r| {
            let out = match r {
                Err(e) => Some(Err(e)),
                Ok((_, bytes)) => {
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    let mut parts = text.splitn(3, '\u{1}');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(replica), _, _) if replica == me => None,
                        (_, Some("agent"), Some(key)) => Some(Ok(Change::Agent(key.to_owned()))),
                        (_, Some("tool"), Some(key)) => Some(Ok(Change::Tool(key.to_owned()))),
                        (_, Some("mcp"), Some(key)) => Some(Ok(Change::Mcp(key.to_owned()))),
                        _ => None,
                    }
                }
            };
            std::future::ready(out)
        })
        .boxed()
    }

    /// The last change number (where a replica starting now tails from).
    pub(crate) async fn last_change(&self) -> Result<u64, StoreError> {
        let row = self
            .db
            .client()
            .await?
            .query_one("SELECT coalesce(max(seq), 0) FROM registry_changes", &[])
            .await
            .map_err(|e| self.db.error("reading the change log", &e))?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }
}
