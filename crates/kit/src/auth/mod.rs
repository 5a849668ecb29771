//! Identity and access, in one place for every surface.
//!
//! - [`Principal`]: who is calling — subject, tenant, roles, kind — built once
//!   per request by the server layer ([`authn::Authenticator`]) and put in the
//!   request extensions and the request context. Handlers read only that
//!   ([`principal`]), never a header or a body field.
//! - [`permissions`]: the one table from every RPC to the permission it needs
//!   (default deny), and from every role to the permissions it grants.
//! - [`keys`]: Switchyard API keys (hashed, revocable) as the verifier sees them.
//!
//! In-process calls carry the same principal a remote call would produce: the
//! calling service's own identity acting on behalf of the user it serves
//! ([`Principal::for_outgoing_call`]).

pub mod authn;
pub mod grant;
pub mod jwt;
pub mod keys;
pub mod permissions;
pub mod references;

use std::fmt;
use std::sync::Arc;

use switchyard_core::Reason;
use tonic::{Code, Status};

pub use permissions::{Access, HTTP_ROUTES, Permission, access, http_access, resp_access};

/// The kind of party a principal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A person.
    Human,
    /// An agent process.
    Agent,
    /// A Switchyard service or other automation.
    Service,
}

impl Kind {
    /// The wire and file form.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Human => "human",
            Kind::Agent => "agent",
            Kind::Service => "service",
        }
    }

    /// Parses the wire form.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "human" => Some(Kind::Human),
            "agent" => Some(Kind::Agent),
            "service" => Some(Kind::Service),
            _ => None,
        }
    }
}

/// A role: a named set of permissions ([`permissions::grants`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Submit and validate jobs; read and cancel its own.
    Submitter,
    /// List and decide the tenant's pending runs.
    Approver,
    /// Read everything in the tenant, cancel any job, manage agents and tools.
    Operator,
    /// Register, heartbeat and deregister its own agents; report outcomes;
    /// spend on the job budgets it is given; delegate.
    Agent,
    /// Read-only.
    Viewer,
    /// Budgets, keys and policies. Does not imply approving.
    Admin,
    /// A Switchyard service: proposes runs, works claims, reserves budgets,
    /// watches the registry and the key set, across tenants.
    Service,
    /// May act on behalf of the user it serves (both identities are recorded).
    /// Only ever held by service principals.
    Impersonate,
}

impl Role {
    /// Every role, in order.
    pub const ALL: [Role; 8] = [
        Role::Submitter,
        Role::Approver,
        Role::Operator,
        Role::Agent,
        Role::Viewer,
        Role::Admin,
        Role::Service,
        Role::Impersonate,
    ];

    /// Whether an admin may put the role on an API key or an identity
    /// provider may map it: everything but the service roles, which come
    /// only from a service certificate or the service token.
    pub fn grantable(self) -> bool {
        !matches!(self, Role::Service | Role::Impersonate)
    }

    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Submitter => "submitter",
            Role::Approver => "approver",
            Role::Operator => "operator",
            Role::Agent => "agent",
            Role::Viewer => "viewer",
            Role::Admin => "admin",
            Role::Service => "service",
            Role::Impersonate => "impersonate",
        }
    }

    /// Parses the wire form.
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// A set of roles.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Roles(u16);

impl Roles {
    /// The set of `roles`.
    pub fn of(roles: &[Role]) -> Roles {
        Roles(roles.iter().fold(0, |acc, r| acc | r.bit()))
    }

    /// Whether `role` is in the set.
    pub fn has(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }

    /// The roles, in [`Role::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.has(*r))
    }

    /// Wire names, in order.
    pub fn names(self) -> Vec<String> {
        self.iter().map(|r| r.as_str().to_owned()).collect()
    }

    /// Parses wire names; the unknown ones are returned as the error.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Roles, Vec<String>> {
        let mut unknown = Vec::new();
        let mut set = Roles::default();
        for n in names {
            match Role::parse(n.as_ref().trim()) {
                Some(r) => set.0 |= r.bit(),
                None => unknown.push(n.as_ref().to_owned()),
            }
        }
        if unknown.is_empty() {
            Ok(set)
        } else {
            Err(unknown)
        }
    }

    /// Whether any role in the set grants `perm`.
    pub fn grant(self, perm: Permission) -> bool {
        self.iter().any(|r| permissions::grants(r, perm))
    }
}

impl fmt::Debug for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(Role::as_str))
            .finish()
    }
}

/// How a principal was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A Switchyard API key.
    ApiKey,
    /// An OIDC / JWT bearer token.
    Jwt,
    /// The cluster's service token.
    ServiceToken,
    /// A verified client certificate (mTLS).
    Certificate,
    /// A client certificate forwarded by a trusted mesh proxy.
    ForwardedCertificate,
    /// A call inside this process.
    InProcess,
    /// A session started from a key or token (`StartSession`): what the
    /// web console keeps in its cookie.
    Session,
}

impl Method {
    /// The wire form (WhoAmI).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::ApiKey => "api_key",
            Method::Jwt => "jwt",
            Method::ServiceToken => "service_token",
            Method::Certificate => "certificate",
            Method::ForwardedCertificate => "forwarded_certificate",
            Method::InProcess => "in_process",
            Method::Session => "session",
        }
    }

    /// The method named `s` (its wire form).
    pub fn parse(s: &str) -> Option<Method> {
        [
            Method::ApiKey,
            Method::Jwt,
            Method::ServiceToken,
            Method::Certificate,
            Method::ForwardedCertificate,
            Method::InProcess,
            Method::Session,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
    }
}

/// The user a service acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnBehalf {
    /// The user's subject.
    pub subject: String,
    /// The user's tenant.
    pub tenant: String,
    /// The user's kind.
    pub kind: Kind,
}

/// Metadata key a service uses to name the user it acts for; honoured only
/// from principals holding [`Role::Impersonate`].
pub const ON_BEHALF_HEADER: &str = "x-switchyard-on-behalf-of";

impl OnBehalf {
    /// `kind:tenant:subject` (the tenant has no colon; the subject may).
    pub fn encode(&self) -> String {
        format!("{}:{}:{}", self.kind.as_str(), self.tenant, self.subject)
    }

    /// Parses [`OnBehalf::encode`]'s form.
    pub fn decode(s: &str) -> Option<OnBehalf> {
        let (kind, rest) = s.split_once(':')?;
        let (tenant, subject) = rest.split_once(':')?;
        let kind = Kind::parse(kind)?;
        (valid_tenant(tenant) && valid_subject(subject)).then(|| OnBehalf {
            subject: subject.to_owned(),
            tenant: tenant.to_owned(),
            kind,
        })
    }
}

/// Who is calling.
#[derive(Clone, PartialEq, Eq)]
pub struct Principal {
    /// Authenticated subject (key subject, JWT subject claim, certificate SAN).
    pub subject: String,
    /// Tenant; empty only for a service principal, which spans tenants.
    pub tenant: String,
    /// Roles held.
    pub roles: Roles,
    /// Kind of party.
    pub kind: Kind,
    /// How it was authenticated.
    pub method: Method,
    /// For a service acting for a user: the user.
    pub on_behalf_of: Option<OnBehalf>,
    /// The credential it presented, when it has an id: the API key's or
    /// session's `key-…` (who acted, and on whose credential).
    pub credential_id: Option<String>,
    /// When that credential stops working (a key's or token's expiry), ms
    /// since the epoch; `None`: never, or not known.
    pub expires_at_ms: Option<u64>,
}

impl fmt::Debug for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Principal")
            .field("subject", &self.subject)
            .field("tenant", &self.tenant)
            .field("roles", &self.roles)
            .field("kind", &self.kind)
            .field("on_behalf_of", &self.on_behalf_of)
            .field("credential_id", &self.credential_id)
            .finish()
    }
}

impl Principal {
    /// A user principal.
    pub fn user(subject: &str, tenant: &str, roles: &[Role], kind: Kind, method: Method) -> Self {
        Principal {
            subject: subject.to_owned(),
            tenant: tenant.to_owned(),
            roles: Roles::of(roles),
            kind,
            method,
            on_behalf_of: None,
            credential_id: None,
            expires_at_ms: None,
        }
    }

    /// A Switchyard service (`subject` such as `service:executor`): the
    /// service role plus the right to act for users, across tenants.
    pub fn service(subject: &str, method: Method) -> Self {
        Principal {
            subject: subject.to_owned(),
            tenant: String::new(),
            roles: Roles::of(&[Role::Service, Role::Impersonate]),
            kind: Kind::Service,
            method,
            on_behalf_of: None,
            credential_id: None,
            expires_at_ms: None,
        }
    }

    /// The identity services in this process use for calls among
    /// themselves.
    pub fn in_process() -> Self {
        Principal::service("service:switchyard", Method::InProcess)
    }

    /// The subject on whose behalf the call is made: the user a service acts
    /// for, else the principal itself. `submitted_by`/`created_by` are this.
    pub fn acting_subject(&self) -> &str {
        self.on_behalf_of
            .as_ref()
            .map_or(self.subject.as_str(), |o| o.subject.as_str())
    }

    /// The party the call acts for: the user a service acts for, else the
    /// principal itself.
    pub fn acting_party(&self) -> OnBehalf {
        self.on_behalf_of.clone().unwrap_or_else(|| OnBehalf {
            subject: self.subject.clone(),
            tenant: self.tenant.clone(),
            kind: self.kind,
        })
    }

    /// The tenant whose objects the call may touch; `None` for a service
    /// acting for no one (it spans tenants).
    pub fn tenant_scope(&self) -> Option<&str> {
        match &self.on_behalf_of {
            Some(o) => Some(&o.tenant),
            None if self.tenant.is_empty() && self.roles.has(Role::Service) => None,
            None => Some(&self.tenant),
        }
    }

    /// Whether an object of `tenant` is visible to this principal.
    pub fn sees_tenant(&self, tenant: &str) -> bool {
        self.tenant_scope().is_none_or(|t| t == tenant)
    }

    /// The tenant new objects are created in: the scope, or `fallback` for a
    /// cross-tenant service acting for no one.
    pub fn tenant_or<'a>(&'a self, fallback: &'a str) -> &'a str {
        self.tenant_scope().unwrap_or(fallback)
    }

    /// The service identity in the audit log: `Some(service)` when it acts
    /// for someone else.
    pub fn via(&self) -> Option<&str> {
        self.on_behalf_of.as_ref().map(|_| self.subject.as_str())
    }

    /// Whether the principal holds `perm`. An identity a mesh proxy
    /// forwarded (`x-forwarded-client-cert`) is believed only as far as the
    /// proxy's word goes: it never acts for a user nor manages API keys,
    /// whatever its roles, so a process that can reach the proxy's port
    /// cannot turn a forged header into credentials.
    pub fn may(&self, perm: Permission) -> bool {
        if self.method == Method::ForwardedCertificate
            && matches!(perm, Permission::Impersonate | Permission::KeyManage)
        {
            return false;
        }
        self.roles.grant(perm)
    }

    /// Refuses with PERMISSION_DENIED unless the principal holds `perm`.
    pub fn require(&self, perm: Permission) -> Result<(), AuthError> {
        if self.may(perm) {
            Ok(())
        } else {
            Err(AuthError::Denied(perm))
        }
    }

    /// Whether the principal may make a call whose rule is `access` (the
    /// RPC, route or verb named `what`): every surface checks the one
    /// table's answer through this.
    pub fn allowed(&self, access: Access, what: &str) -> Result<(), AuthError> {
        match access {
            Access::Needs(perm) => self.require(perm),
            Access::Unknown => Err(AuthError::Unlisted(what.to_owned())),
            Access::Open | Access::Authenticated => Ok(()),
        }
    }

    /// Whether the acting subject is the owner `owner` (in a visible tenant).
    pub fn owns(&self, owner: &str) -> bool {
        self.acting_subject() == owner
    }

    /// Whether the principal reads every object of its tenant (approvers,
    /// operators, viewers, admins, services) rather than only its own
    /// (submitters, agents).
    pub fn reads_whole_tenant(&self) -> bool {
        self.may(Permission::AuditRead)
    }

    /// Whether an object of `tenant` owned by `owner` is visible: the same
    /// tenant, and either a tenant-wide reader or the owner. What is not
    /// visible is answered NOT_FOUND, never "forbidden".
    pub fn may_see(&self, tenant: &str, owner: &str) -> bool {
        self.sees_tenant(tenant) && (self.reads_whole_tenant() || self.owns(owner))
    }

    /// The principal a call made by this process, while serving `self`,
    /// carries: `service` acting for the user `self` stands for (or for
    /// whoever `self` already acts for). A service calling for itself stays
    /// itself.
    pub fn for_outgoing_call(&self, service: &Principal) -> Principal {
        Principal {
            on_behalf_of: self.user_for_calls(),
            ..service.clone()
        }
    }

    /// The user calls made while serving `self` act for: whoever `self`
    /// already acts for, else `self` — unless it is a service acting for no
    /// one.
    pub fn user_for_calls(&self) -> Option<OnBehalf> {
        match &self.on_behalf_of {
            Some(o) => Some(o.clone()),
            None if self.kind == Kind::Service && self.tenant.is_empty() => None,
            None => Some(OnBehalf {
                subject: self.subject.clone(),
                tenant: self.tenant.clone(),
                kind: self.kind,
            }),
        }
    }

    /// This service acting for `user`.
    pub fn acting_for(&self, user: OnBehalf) -> Principal {
        Principal {
            on_behalf_of: Some(user),
            ..self.clone()
        }
    }
}

/// A subject: 1–128 visible ASCII characters.
pub fn valid_subject(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic())
}

/// A tenant: 1–63 of `a-z 0-9 - _`.
pub fn valid_tenant(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// The principal of a request: set by the server layer for remote calls and
/// by the in-process client for local ones. A request with none (a handler
/// called directly, outside both) is refused.
pub fn principal<T>(req: &tonic::Request<T>) -> Result<Arc<Principal>, Status> {
    req.extensions()
        .get::<Arc<Principal>>()
        .cloned()
        .ok_or_else(|| Status::from(AuthError::Required))
}

/// Why a request was refused by authentication or authorization.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential was sent.
    #[error(
        "this call needs a credential: send `authorization: Bearer <api key or token>` (switchyard auth key create; SWITCHYARD_TOKEN)"
    )]
    Required,
    /// The credential is unknown, revoked or malformed; deliberately vague.
    #[error("the credential is not valid")]
    Invalid,
    /// The credential expired.
    #[error("the credential has expired; get a new one")]
    Expired,
    /// The principal lacks a permission.
    #[error("permission {} is needed for this call and none of your roles grants it", .0.as_str())]
    Denied(Permission),
    /// This server has not loaded the key set yet (it follows another
    /// process's, which it cannot reach).
    #[error("this server has not loaded its key set yet (auth.keys_url); try again shortly")]
    KeysUnavailable,
    /// The method is not in the authorization table: refused for everyone.
    #[error("method {0} is not in the authorization table, so no one may call it")]
    Unlisted(String),
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Status {
        let msg = e.to_string();
        // (code, reason, the permission that was missing)
        let (code, reason, permission) = match &e {
            AuthError::Required => (Code::Unauthenticated, Reason::AuthRequired, None),
            AuthError::Invalid => (Code::Unauthenticated, Reason::AuthInvalid, None),
            AuthError::Expired => (Code::Unauthenticated, Reason::AuthExpired, None),
            AuthError::KeysUnavailable => (Code::Unavailable, Reason::Unavailable, None),
            AuthError::Denied(p) => (
                Code::PermissionDenied,
                Reason::PermissionDenied,
                Some(p.as_str()),
            ),
            AuthError::Unlisted(_) => (
                Code::PermissionDenied,
                Reason::PermissionDenied,
                Some("unlisted"),
            ),
        };
        match permission {
            Some(p) => crate::error::status_with_metadata(
                code,
                reason,
                msg,
                crate::error::metadata([("permission", p.to_owned())]),
            ),
            None => crate::error::status(code, reason, msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_behalf_round_trips_and_refuses_bad_forms() {
        let o = OnBehalf {
            subject: "alice@example.com:x".into(),
            tenant: "acme".into(),
            kind: Kind::Human,
        };
        assert_eq!(OnBehalf::decode(&o.encode()), Some(o));
        for bad in [
            "",
            "human",
            "human:acme",
            "robot:acme:x",
            "human:ACME:x",
            "human:acme:",
        ] {
            assert_eq!(OnBehalf::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_service_acts_for_the_user_it_serves_and_only_then_is_scoped() {
        let svc = Principal::in_process();
        assert_eq!(svc.tenant_scope(), None, "a service spans tenants");
        let alice = Principal::user(
            "alice",
            "acme",
            &[Role::Submitter],
            Kind::Human,
            Method::ApiKey,
        );
        let call = alice.for_outgoing_call(&svc);
        assert_eq!(call.acting_subject(), "alice");
        assert_eq!(call.tenant_scope(), Some("acme"));
        assert_eq!(call.via(), Some("service:switchyard"));
        assert!(
            call.may(Permission::RunPropose),
            "the service's roles apply"
        );
        // Forwarded again, it still acts for alice.
        assert_eq!(call.for_outgoing_call(&svc).acting_subject(), "alice");
        // A service calling for itself stays itself.
        assert_eq!(svc.for_outgoing_call(&svc).on_behalf_of, None);
    }

    #[test]
    fn a_user_without_a_tenant_is_not_unscoped() {
        let mut p = Principal::user("x", "", &[Role::Admin], Kind::Human, Method::ApiKey);
        assert_eq!(p.tenant_scope(), Some(""));
        assert!(!p.sees_tenant("acme"));
        p.roles = Roles::of(&[Role::Service]);
        p.kind = Kind::Service;
        assert!(p.sees_tenant("acme"));
    }

    #[test]
    fn roles_parse_and_report_unknown_names() {
        assert_eq!(
            Roles::parse(&["submitter", "approver"]).unwrap(),
            Roles::of(&[Role::Approver, Role::Submitter])
        );
        assert_eq!(
            Roles::parse(&["root", "viewer"]).unwrap_err(),
            vec!["root".to_owned()]
        );
    }

    #[test]
    fn auth_errors_carry_their_reasons() {
        let e =
            crate::error::ApiError::from(Status::from(AuthError::Denied(Permission::RunDecide)));
        assert_eq!(e.code, Code::PermissionDenied);
        assert_eq!(e.reason.as_deref(), Some("PERMISSION_DENIED"));
        assert_eq!(e.metadata["permission"], "run.decide");
        for (err, reason) in [
            (AuthError::Required, "AUTH_REQUIRED"),
            (AuthError::Invalid, "AUTH_INVALID"),
            (AuthError::Expired, "AUTH_EXPIRED"),
        ] {
            let e = crate::error::ApiError::from(Status::from(err));
            assert_eq!(
                (e.code, e.reason.as_deref()),
                (Code::Unauthenticated, Some(reason))
            );
        }
    }
}
