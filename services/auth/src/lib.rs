//! The auth service: Switchyard API keys.
//!
//! Keys are random 256-bit secrets shown once; only their SHA-256 is stored
//! (sled tree `keys`, one `KeyRecord` per key id), bound to a subject, a
//! tenant, roles and a kind, optionally expiring, revocable. The service keeps
//! the shared [`KeySet`] the server layer verifies against up to date in its
//! own process (a revocation applies to the very next request), and streams
//! it to other processes through `WatchKeys` ([`spawn_follow`]).
//!
//! `switchyard dev` calls [`Auth::bootstrap_dev`] to create the tenant
//! `default` with an admin and the demo people alice and bob
//! ([`credentials`]).

pub mod credentials;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use switchyard_core::Reason;
use switchyard_kit::auth::keys::{self, Binding, KeySet};
use switchyard_kit::auth::{Kind, Method, Principal, Role, Roles, valid_subject};
use switchyard_kit::error::{invalid_argument, status, status_with_metadata};
use switchyard_kit::shutdown::Shutdown;
use switchyard_kit::time::{now_ms, timestamp, timestamp_ms};
use switchyard_proto::auth::v1::auth_service_server::{AuthService, AuthServiceServer};
use switchyard_proto::auth::v1::*;
use switchyard_store::{Store, StoreError, Tree};
use tokio::sync::watch;
use tonic::{Code, Request, Response, Status};

/// Errors of the auth service.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Invalid request fields.
    #[error("invalid request: {0}")]
    Invalid(switchyard_core::Violations),
    /// No such key in the caller's tenant.
    #[error("no key {0:?} in your tenant")]
    KeyNotFound(String),
    /// Refused by authentication or authorization.
    #[error(transparent)]
    Auth(#[from] switchyard_kit::auth::AuthError),
    /// Storage failed.
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    /// The random source failed.
    #[error("making a secret: {0}")]
    Random(std::io::Error),
    /// A session asked of a credential that cannot start one.
    #[error("{0}")]
    NoSession(&'static str),
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Status {
        let msg = e.to_string();
        match e {
            AuthError::Invalid(v) => invalid_argument(Reason::InvalidArgument, &v),
            AuthError::KeyNotFound(id) => status_with_metadata(
                Code::NotFound,
                Reason::KeyNotFound,
                msg,
                switchyard_kit::error::metadata([("key_id", id)]),
            ),
            AuthError::Auth(a) => a.into(),
            AuthError::NoSession(_) => {
                status(Code::FailedPrecondition, Reason::SessionRefused, msg)
            }
            AuthError::Storage(_) | AuthError::Random(_) => {
                status(Code::Unavailable, Reason::StorageFailure, msg)
            }
        }
    }
}

fn invalid(field: &str, description: impl Into<String>) -> AuthError {
    let mut v = switchyard_core::Violations::default();
    v.add(field, description);
    AuthError::Invalid(v)
}

/// Who creates a key: a tenant admin, or the dev bootstrap.
#[derive(Debug, Clone)]
pub struct Creator {
    /// Subject recorded as `created_by`.
    pub subject: String,
    /// Tenant the key is created in.
    pub tenant: String,
}

struct Inner {
    tree: Tree<KeyRecord>,
    store: Store,
    records: Mutex<BTreeMap<String, KeyRecord>>,
    set: KeySet,
    changed: watch::Sender<u64>,
}

/// The auth service.
#[derive(Clone)]
pub struct Auth {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").finish_non_exhaustive()
    }
}

fn binding(rec: &KeyRecord) -> Option<([u8; 32], Binding)> {
    let key = rec.key.as_ref()?;
    let hash: [u8; 32] = rec.token_sha256.as_slice().try_into().ok()?;
    let roles = Roles::parse(&key.roles).ok()?;
    let kind = match PrincipalKind::try_from(key.kind).ok()? {
        PrincipalKind::Agent => Kind::Agent,
        PrincipalKind::Service => Kind::Service,
        _ => Kind::Human,
    };
    Some((
        hash,
        Binding {
            key_id: key.key_id.clone(),
            subject: key.subject.clone(),
            tenant: key.tenant.clone(),
            roles,
            kind,
            expires_at_ms: key.expires_at.as_ref().map(timestamp_ms),
            revoked: key.revoked_at.is_some(),
            session: !key.session_of.is_empty(),
        },
    ))
}

/// Fills `set` from records; a record that does not parse is skipped with
/// a warning (it then verifies as unknown).
fn load(set: &KeySet, records: &[KeyRecord]) {
    let mut all = std::collections::HashMap::new();
    for rec in records {
        match binding(rec) {
            Some((h, b)) => {
                all.insert(h, b);
            }
            None => tracing::warn!("skipping an unreadable key record"),
        }
    }
    set.replace(all);
}

impl Auth {
    /// Opens the key store and loads it into `set` (shared with this
    /// process's server layer).
    pub fn open(store: Store, set: KeySet) -> Result<Auth, AuthError> {
        let tree = store.tree::<KeyRecord>("keys")?;
        let mut records = BTreeMap::new();
        for item in tree.iter() {
            let (id, rec) = item?;
            records.insert(id, rec);
        }
        load(&set, &records.values().cloned().collect::<Vec<_>>());
        let (changed, _) = watch::channel(0);
        Ok(Auth {
            inner: Arc::new(Inner {
                tree,
                store,
                records: Mutex::new(records),
                set,
                changed,
            }),
        })
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, KeyRecord>> {
        self.inner.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `rec` durably, then makes it count for verification and tells
    /// followers.
    async fn save(&self, rec: KeyRecord) -> Result<(), AuthError> {
        let id = rec
            .key
            .as_ref()
            .map(|k| k.key_id.clone())
            .unwrap_or_default();
        self.inner.tree.put(&id, &rec)?;
        self.inner.store.sync().await?;
        if let Some((h, b)) = binding(&rec) {
            self.inner.set.upsert(h, b);
        }
        self.records().insert(id, rec);
        self.inner.changed.send_modify(|v| *v += 1);
        Ok(())
    }

    /// Creates a key for `creator`'s tenant.
    pub async fn create(
        &self,
        creator: &Creator,
        req: CreateKeyRequest,
    ) -> Result<CreateKeyResponse, AuthError> {
        if !req.tenant.is_empty() && req.tenant != creator.tenant {
            return Err(invalid(
                "tenant",
                format!(
                    "keys are created in your own tenant ({:?}); leave tenant empty",
                    creator.tenant
                ),
            ));
        }
        let subject = req.subject.trim();
        if !valid_subject(subject) {
            return Err(invalid(
                "subject",
                "subject must be 1-128 visible ASCII characters",
            ));
        }
        let roles = Roles::parse(&req.roles).map_err(|unknown| {
            invalid(
                "roles",
                format!("unknown roles {unknown:?}; expected some of submitter, approver, operator, agent, viewer, admin"),
            )
        })?;
        if roles == Roles::default() {
            return Err(invalid("roles", "a key needs at least one role"));
        }
        if roles.iter().any(|r| !r.grantable()) {
            return Err(invalid(
                "roles",
                "roles service and impersonate come only from a service certificate or the service token",
            ));
        }
        let kind = match PrincipalKind::try_from(req.kind) {
            Ok(PrincipalKind::Unspecified) | Ok(PrincipalKind::Human) => PrincipalKind::Human,
            Ok(PrincipalKind::Agent) => PrincipalKind::Agent,
            Ok(PrincipalKind::Service) | Err(_) => {
                return Err(invalid("kind", "kind must be human or agent"));
            }
        };
        let token = keys::generate().map_err(AuthError::Random)?;
        let now = now_ms();
        let ttl_ms = req
            .ttl_secs
            .checked_mul(1000)
            .ok_or_else(|| invalid("ttl_secs", "ttl_secs is too large"))?;
        let key = ApiKey {
            key_id: token.key_id.clone(),
            subject: subject.to_owned(),
            tenant: creator.tenant.clone(),
            roles: roles.names(),
            kind: kind as i32,
            description: req.description,
            created_at: Some(timestamp(now)),
            expires_at: (req.ttl_secs > 0).then(|| timestamp(now.saturating_add(ttl_ms))),
            revoked_at: None,
            created_by: creator.subject.clone(),
            revoked_by: String::new(),
            session_of: String::new(),
        };
        self.save(KeyRecord {
            key: Some(key.clone()),
            token_sha256: keys::hash(&token.token).to_vec(),
        })
        .await?;
        tracing::info!(key_id = %key.key_id, subject = %key.subject, tenant = %key.tenant, by = %creator.subject, "api key created");
        Ok(CreateKeyResponse {
            key: Some(key),
            secret: token.token,
        })
    }

    /// Makes `token` an admin key of `tenant` (subject `bootstrap-admin`)
    /// unless a key with that token exists; returns whether it was created.
    /// The token must look like a Switchyard key (`syk_…`, 32+ secret
    /// characters): generate one with `switchyard auth key generate`.
    pub async fn ensure_admin(&self, token: &str, tenant: &str) -> Result<bool, AuthError> {
        let token = token.trim();
        let secret_ok = token
            .strip_prefix(keys::TOKEN_PREFIX)
            .is_some_and(|rest| rest.len() >= 32 && rest.bytes().all(|b| b.is_ascii_graphic()));
        if !secret_ok {
            return Err(invalid(
                "auth.bootstrap_admin_env",
                "the bootstrap admin token must start with syk_ and carry 32+ visible characters; make one with `switchyard auth key generate`",
            ));
        }
        if !switchyard_kit::auth::valid_tenant(tenant) {
            return Err(invalid(
                "auth.bootstrap_tenant",
                "tenant must be 1-63 of a-z 0-9 - _",
            ));
        }
        let hash = keys::hash(token).to_vec();
        if self.records().values().any(|r| r.token_sha256 == hash) {
            return Ok(false);
        }
        let now = now_ms();
        let key = ApiKey {
            key_id: format!("key-bootstrap-{}", &hex_prefix(&hash)),
            subject: "bootstrap-admin".into(),
            tenant: tenant.to_owned(),
            roles: vec![Role::Admin.as_str().to_owned()],
            kind: PrincipalKind::Human as i32,
            description: "bootstrap admin (auth.bootstrap_admin_env)".into(),
            created_at: Some(timestamp(now)),
            created_by: "bootstrap".into(),
            ..Default::default()
        };
        self.save(KeyRecord {
            key: Some(key),
            token_sha256: hash,
        })
        .await?;
        Ok(true)
    }

    /// The keys of `tenant`, oldest first.
    pub fn list(&self, tenant: &str, include_inactive: bool) -> Vec<ApiKey> {
        let now = now_ms();
        let mut keys: Vec<ApiKey> = self
            .records()
            .values()
            .filter_map(|r| r.key.clone())
            .filter(|k| k.tenant == tenant)
            .filter(|k| include_inactive || active(k, now))
            .collect();
        keys.sort_by_key(|k| k.created_at.as_ref().map(timestamp_ms));
        keys
    }

    /// Revokes a key of `tenant`; the next request with it is refused.
    pub async fn revoke(&self, tenant: &str, by: &str, key_id: &str) -> Result<ApiKey, AuthError> {
        let rec = self
            .records()
            .get(key_id)
            .filter(|r| r.key.as_ref().is_some_and(|k| k.tenant == tenant))
            .cloned()
            .ok_or_else(|| AuthError::KeyNotFound(key_id.to_owned()))?;
        let mut key = rec.key.clone().unwrap_or_default();
        if key.revoked_at.is_some() {
            return Ok(key);
        }
        key.revoked_at = Some(timestamp(now_ms()));
        key.revoked_by = by.to_owned();
        self.save(KeyRecord {
            key: Some(key.clone()),
            token_sha256: rec.token_sha256,
        })
        .await?;
        tracing::info!(key_id = %key_id, by = %by, "api key revoked");
        // The sessions started with it end with it.
        let sessions: Vec<String> = self
            .records()
            .values()
            .filter_map(|r| r.key.as_ref())
            .filter(|k| k.session_of == key_id && k.revoked_at.is_none())
            .map(|k| k.key_id.clone())
            .collect();
        for id in sessions {
            Box::pin(self.revoke(tenant, by, &id)).await?;
        }
        Ok(key)
    }

    /// Starts a session for `p` (see `StartSession`): a new token bound to
    /// `p`'s own subject, tenant, roles and kind, expiring after `ttl_secs`
    /// (0: [`SESSION_MAX_SECS`]), never later than that maximum or `p`'s
    /// own credential. Sessions of the same subject past
    /// [`SESSIONS_PER_SUBJECT`] end, oldest first; ended sessions are
    /// forgotten a day after they stop working.
    pub async fn start_session(
        &self,
        p: &Principal,
        req: StartSessionRequest,
    ) -> Result<StartSessionResponse, AuthError> {
        let session_of = match (p.method, &p.credential_id) {
            (Method::ApiKey, Some(id)) if p.on_behalf_of.is_none() => id.clone(),
            (Method::Jwt, _) if p.on_behalf_of.is_none() => "jwt".to_owned(),
            (Method::Session, _) => {
                return Err(AuthError::NoSession(
                    "a session cannot start another session: sign in with your API key or identity provider's token",
                ));
            }
            _ => {
                return Err(AuthError::NoSession(
                    "only a person's or agent's own API key or identity provider's token starts a session",
                ));
            }
        };
        let now = now_ms();
        let asked = match req.ttl_secs {
            0 => SESSION_MAX_SECS,
            t => t.min(SESSION_MAX_SECS),
        };
        let mut expires = now.saturating_add(asked * 1000);
        if let Some(e) = p.expires_at_ms {
            expires = expires.min(e);
        }
        if expires <= now {
            return Err(AuthError::Auth(switchyard_kit::auth::AuthError::Expired));
        }
        self.forget_ended_sessions(now).await?;
        let token = keys::generate().map_err(AuthError::Random)?;
        let session = ApiKey {
            key_id: token.key_id.clone(),
            subject: p.subject.clone(),
            tenant: p.tenant.clone(),
            roles: p.roles.names(),
            kind: kind_proto(p.kind) as i32,
            description: switchyard_core::validate::clamp(&req.description, 200).to_owned(),
            created_at: Some(timestamp(now)),
            expires_at: Some(timestamp(expires)),
            revoked_at: None,
            created_by: p.subject.clone(),
            revoked_by: String::new(),
            session_of,
        };
        self.save(KeyRecord {
            key: Some(session.clone()),
            token_sha256: keys::hash(&token.token).to_vec(),
        })
        .await?;
        // Beyond the cap, the oldest live sessions of this subject end.
        let live: Vec<String> = {
            let records = self.records();
            let mut live: Vec<&ApiKey> = records
                .values()
                .filter_map(|r| r.key.as_ref())
                .filter(|k| {
                    !k.session_of.is_empty()
                        && k.tenant == p.tenant
                        && k.subject == p.subject
                        && active(k, now)
                })
                .collect::<Vec<_>>();
            // Oldest first; the one just started (maybe in the same
            // millisecond as others) last, so it is never the one ended.
            live.sort_by_key(|k| {
                (
                    k.key_id == session.key_id,
                    k.created_at.as_ref().map(timestamp_ms),
                )
            });
            let over = live.len().saturating_sub(SESSIONS_PER_SUBJECT);
            live.iter().take(over).map(|k| k.key_id.clone()).collect()
        };
        for id in live {
            self.revoke(&p.tenant, "session limit", &id).await?;
        }
        tracing::info!(key_id = %session.key_id, subject = %session.subject, tenant = %session.tenant, from = %session.session_of, "session started");
        Ok(StartSessionResponse {
            session: Some(session),
            secret: token.token,
        })
    }

    /// Ends the session `p` is authenticated with.
    pub async fn end_session(&self, p: &Principal) -> Result<ApiKey, AuthError> {
        let (Method::Session, Some(id)) = (p.method, &p.credential_id) else {
            return Err(AuthError::NoSession(
                "this call did not come with a session: EndSession ends the session it is made with (revoke a key with RevokeKey)",
            ));
        };
        let key = self.revoke(&p.tenant, &p.subject, id).await?;
        tracing::info!(key_id = %id, subject = %p.subject, "session ended");
        Ok(key)
    }

    /// Deletes session records that stopped working more than a day ago
    /// (they verify as unknown then, as they would revoked).
    async fn forget_ended_sessions(&self, now: u64) -> Result<(), AuthError> {
        let horizon = now.saturating_sub(24 * 3600 * 1000);
        let stale: Vec<String> = self
            .records()
            .values()
            .filter_map(|r| r.key.as_ref())
            .filter(|k| {
                !k.session_of.is_empty()
                    && k.revoked_at
                        .as_ref()
                        .or(k.expires_at.as_ref())
                        .is_some_and(|t| timestamp_ms(t) < horizon)
            })
            .map(|k| k.key_id.clone())
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        for id in &stale {
            self.inner.tree.remove(id)?;
        }
        self.inner.store.sync().await?;
        let mut records = self.records();
        for id in &stale {
            records.remove(id);
        }
        load(
            &self.inner.set,
            &records.values().cloned().collect::<Vec<_>>(),
        );
        drop(records);
        self.inner.changed.send_modify(|v| *v += 1);
        Ok(())
    }

    /// Every record (the `WatchKeys` snapshot).
    fn snapshot(&self) -> WatchKeysResponse {
        WatchKeysResponse {
            keys: self.records().values().cloned().collect(),
        }
    }

    /// Flushes the store (shutdown).
    pub fn flush(&self) -> Result<(), AuthError> {
        Ok(self.inner.store.flush_blocking()?)
    }

    /// The tonic server.
    pub fn server(&self, max_message_bytes: usize) -> AuthServiceServer<Auth> {
        AuthServiceServer::new(self.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }
}

/// The longest a session lives: 24 hours.
pub const SESSION_MAX_SECS: u64 = 24 * 3600;
/// Live sessions one subject may hold; starting one more ends the oldest.
pub const SESSIONS_PER_SUBJECT: usize = 32;

/// Whether `k` works at `now`: not revoked, not expired.
fn active(k: &ApiKey, now: u64) -> bool {
    k.revoked_at.is_none() && k.expires_at.as_ref().is_none_or(|e| timestamp_ms(e) > now)
}

fn hex_prefix(hash: &[u8]) -> String {
    hash.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// The creator an admin principal stands for: its own tenant.
fn creator(p: &Principal) -> Creator {
    Creator {
        subject: p.acting_subject().to_owned(),
        tenant: p.tenant_or("").to_owned(),
    }
}

fn kind_proto(k: Kind) -> PrincipalKind {
    match k {
        Kind::Human => PrincipalKind::Human,
        Kind::Agent => PrincipalKind::Agent,
        Kind::Service => PrincipalKind::Service,
    }
}

#[tonic::async_trait]
impl AuthService for Auth {
    async fn create_key(
        &self,
        req: Request<CreateKeyRequest>,
    ) -> Result<Response<CreateKeyResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let mut r = req.into_inner();
        let creator = match p.tenant_scope() {
            Some(_) => creator(&p),
            // The cluster operator (service credential) creates keys in the
            // tenant it names: how a new tenant gets its first admin.
            None => {
                let tenant = std::mem::take(&mut r.tenant);
                if !switchyard_kit::auth::valid_tenant(&tenant) {
                    return Err(invalid(
                        "tenant",
                        "name the tenant (1-63 of a-z 0-9 - _): a service principal belongs to none",
                    )
                    .into());
                }
                Creator {
                    subject: p.subject.clone(),
                    tenant,
                }
            }
        };
        Ok(Response::new(self.create(&creator, r).await?))
    }

    async fn list_keys(
        &self,
        req: Request<ListKeysRequest>,
    ) -> Result<Response<ListKeysResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let keys = self.list(p.tenant_or(""), req.get_ref().include_inactive);
        Ok(Response::new(ListKeysResponse { keys }))
    }

    async fn revoke_key(
        &self,
        req: Request<RevokeKeyRequest>,
    ) -> Result<Response<RevokeKeyResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let key = self
            .revoke(p.tenant_or(""), p.acting_subject(), &req.get_ref().key_id)
            .await?;
        Ok(Response::new(RevokeKeyResponse { key: Some(key) }))
    }

    async fn who_am_i(
        &self,
        req: Request<WhoAmIRequest>,
    ) -> Result<Response<WhoAmIResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(who_am_i(&p)))
    }

    async fn start_session(
        &self,
        req: Request<StartSessionRequest>,
    ) -> Result<Response<StartSessionResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        Ok(Response::new(
            self.start_session(&p, req.into_inner()).await?,
        ))
    }

    async fn end_session(
        &self,
        req: Request<EndSessionRequest>,
    ) -> Result<Response<EndSessionResponse>, Status> {
        let p = switchyard_kit::auth::principal(&req)?;
        let session = self.end_session(&p).await?;
        Ok(Response::new(EndSessionResponse {
            session: Some(session),
        }))
    }

    type WatchKeysStream = switchyard_kit::BoxStream<WatchKeysResponse>;

    async fn watch_keys(
        &self,
        _req: Request<WatchKeysRequest>,
    ) -> Result<Response<Self::WatchKeysStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let me = self.clone();
        let mut changed = self.inner.changed.subscribe();
        tokio::spawn(async move {
            loop {
                changed.mark_unchanged();
                if tx.send(Ok(me.snapshot())).await.is_err() {
                    return;
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// WhoAmI's answer for `p`.
pub fn who_am_i(p: &Principal) -> WhoAmIResponse {
    WhoAmIResponse {
        subject: p.subject.clone(),
        tenant: p.tenant.clone(),
        roles: p.roles.names(),
        kind: kind_proto(p.kind) as i32,
        method: p.method.as_str().to_owned(),
        on_behalf_of: p
            .on_behalf_of
            .as_ref()
            .map(|o| o.subject.clone())
            .unwrap_or_default(),
    }
}

/// Keeps `set` equal to the auth service's key set, reconnecting with
/// backoff until `shutdown`; the first snapshot opens `ready`. While the
/// stream is down the last snapshot stays in force.
pub fn spawn_follow(
    client: switchyard_api::AuthClient,
    set: KeySet,
    shutdown: Shutdown,
) -> tokio::sync::watch::Receiver<bool> {
    let (ready_tx, ready_rx) = watch::channel(false);
    tokio::spawn(async move {
        use futures_util::StreamExt;
        let mut backoff = Duration::from_millis(100);
        loop {
            let follow = async {
                let mut stream = client.watch_keys(WatchKeysRequest {}).await?;
                while let Some(snapshot) = stream.next().await {
                    let snapshot = snapshot?;
                    load(&set, &snapshot.keys);
                    let _ = ready_tx.send(true);
                    backoff = Duration::from_millis(100);
                }
                Ok::<_, Status>(())
            };
            tokio::select! {
                r = follow => {
                    if let Err(e) = r {
                        tracing::warn!(error = %e.message(), "following the key set failed; retrying");
                    }
                }
                _ = shutdown.wait() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.wait() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    });
    ready_rx
}

#[cfg(test)]
mod tests;
