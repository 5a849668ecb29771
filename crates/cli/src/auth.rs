//! `switchyard auth ...`: API keys and who-am-i.

use clap::Subcommand;
use serde_json::json;
use switchyard_api::AuthClient;
use switchyard_proto::auth::v1::*;

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json, print_list, table};

/// `switchyard auth ...`
#[derive(Subcommand, Debug)]
pub enum AuthCmd {
    /// API keys of your tenant (needs the admin role).
    #[command(subcommand)]
    Key(KeyCmd),
    /// Who the server takes you to be.
    Whoami {
        #[command(flatten)]
        conn: Conn,
    },
}

/// `switchyard auth key ...`
#[derive(Subcommand, Debug)]
pub enum KeyCmd {
    /// Create a key; its secret is printed once.
    Create {
        /// Who the key authenticates as.
        #[arg(long)]
        subject: String,
        /// Roles, comma-separated: submitter, approver, operator, agent,
        /// viewer, admin.
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<String>,
        /// The holder: a person, or an agent process.
        #[arg(long, value_parser = ["human", "agent"], default_value = "human")]
        kind: String,
        /// Lifetime in seconds (0: no expiry).
        #[arg(long, default_value_t = 0)]
        ttl_secs: u64,
        /// What the key is for.
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List keys (never their secrets).
    List {
        /// Include revoked and expired keys.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print a new random key token without contacting a server: for
    /// auth.bootstrap_admin_env (put it in a Secret).
    Generate,
    /// Revoke a key: the next request made with it is refused.
    Revoke {
        /// Key id (key-…).
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

async fn client(conn: &Conn) -> anyhow::Result<AuthClient> {
    Ok(AuthClient::remote(conn.channel().await?, MAX_MESSAGE))
}

fn key_json(k: &ApiKey) -> serde_json::Value {
    let ms =
        |t: &Option<prost_types::Timestamp>| t.as_ref().map(switchyard_kit::time::timestamp_ms);
    json!({
        "key_id": k.key_id, "subject": k.subject, "tenant": k.tenant, "roles": k.roles,
        "kind": kind_name(k.kind), "description": k.description,
        "created_at_ms": ms(&k.created_at), "expires_at_ms": ms(&k.expires_at),
        "revoked_at_ms": ms(&k.revoked_at), "created_by": k.created_by, "revoked_by": k.revoked_by,
    })
}

fn kind_name(k: i32) -> String {
    crate::output::short_name(
        PrincipalKind::try_from(k).ok().map(|k| k.as_str_name()),
        "PRINCIPAL_KIND_",
    )
}

/// Runs an auth command.
pub async fn run(cmd: AuthCmd) -> anyhow::Result<()> {
    match cmd {
        AuthCmd::Whoami { conn } => {
            let me = client(&conn)
                .await?
                .who_am_i(WhoAmIRequest {})
                .await
                .map_err(api)?;
            match conn.output {
                Format::Json => print_json(&json!({
                    "subject": me.subject, "tenant": me.tenant, "roles": me.roles,
                    "kind": kind_name(me.kind), "method": me.method, "on_behalf_of": me.on_behalf_of,
                })),
                Format::Table => table(
                    &["SUBJECT", "TENANT", "ROLES", "KIND", "METHOD"],
                    &[vec![
                        me.subject,
                        me.tenant,
                        me.roles.join(","),
                        kind_name(me.kind),
                        me.method,
                    ]],
                ),
            }
        }
        AuthCmd::Key(KeyCmd::Create {
            subject,
            roles,
            kind,
            ttl_secs,
            description,
            conn,
        }) => {
            let kind = match kind.as_str() {
                "agent" => PrincipalKind::Agent,
                _ => PrincipalKind::Human,
            };
            let made = client(&conn)
                .await?
                .create_key(CreateKeyRequest {
                    subject,
                    roles,
                    kind: kind as i32,
                    description,
                    ttl_secs,
                    tenant: String::new(),
                })
                .await
                .map_err(api)?;
            let key = made.key.unwrap_or_default();
            match conn.output {
                Format::Json => {
                    let mut v = key_json(&key);
                    v["secret"] = json!(made.secret);
                    print_json(&v);
                }
                Format::Table => {
                    println!(
                        "created {} for {} in tenant {} ({})",
                        key.key_id,
                        key.subject,
                        key.tenant,
                        key.roles.join(",")
                    );
                    println!("secret (shown once; store it now): {}", made.secret);
                }
            }
        }
        AuthCmd::Key(KeyCmd::List { all, conn }) => {
            let keys = client(&conn)
                .await?
                .list_keys(ListKeysRequest {
                    include_inactive: all,
                })
                .await
                .map_err(api)?
                .keys;
            match conn.output {
                Format::Json => print_list(keys.iter().map(key_json).collect(), ""),
                Format::Table => {
                    let rows: Vec<Vec<String>> = keys
                        .iter()
                        .map(|k| {
                            let state = if k.revoked_at.is_some() {
                                "revoked"
                            } else if k.expires_at.as_ref().is_some_and(|e| {
                                switchyard_kit::time::timestamp_ms(e)
                                    <= switchyard_kit::time::now_ms()
                            }) {
                                "expired"
                            } else {
                                "active"
                            };
                            vec![
                                k.key_id.clone(),
                                k.subject.clone(),
                                k.roles.join(","),
                                kind_name(k.kind),
                                state.into(),
                                k.description.clone(),
                            ]
                        })
                        .collect();
                    table(
                        &["KEY", "SUBJECT", "ROLES", "KIND", "STATE", "DESCRIPTION"],
                        &rows,
                    );
                }
            }
        }
        AuthCmd::Key(KeyCmd::Generate) => {
            println!("{}", switchyard_kit::auth::keys::generate()?.token);
        }
        AuthCmd::Key(KeyCmd::Revoke { id, conn }) => {
            let key = client(&conn)
                .await?
                .revoke_key(RevokeKeyRequest { key_id: id })
                .await
                .map_err(api)?
                .key
                .unwrap_or_default();
            match conn.output {
                Format::Json => print_json(&key_json(&key)),
                Format::Table => println!("revoked {} ({})", key.key_id, key.subject),
            }
        }
    }
    Ok(())
}
