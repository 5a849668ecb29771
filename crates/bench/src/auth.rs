//! What authentication costs per RPC. The same in-process router (10k agents)
//! and ledger (1,000 budgets) are served three ways in one run:
//!
//! - by the Switchyard server (kit) with authentication and the
//!   authorization table, called with an API key and with an RS256 JWT
//!   (verified against a JWKS file);
//! - by the same kit server without authentication, every request running as
//!   a fixed principal: the baseline, identical but for authentication;
//! - by a bare tonic server whose only layer puts that principal in the
//!   request: what the kit server's span, correlation and limits cost, for
//!   reference.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use switchyard_core::SystemClock;
use switchyard_kit::auth::authn::{AuthConfig, Authenticator};
use switchyard_kit::auth::jwt::OidcConfig;
use switchyard_kit::auth::keys::{self, Binding, KeySet};
use switchyard_kit::auth::{Kind, Method, Principal, Role, Roles};
use switchyard_kit::client::{Credential, authed};
use switchyard_ledger::{Ledger, LedgerConfig};
use switchyard_proto::ledger::v1::CreateBudgetRequest;
use switchyard_proto::ledger::v1::ledger_service_client::LedgerServiceClient;
use switchyard_proto::router::v1::RouteRequest;
use switchyard_proto::router::v1::router_service_client::RouterServiceClient;
use tonic::body::Body;

use crate::{CAPABILITIES, CONNECTIONS, Channel, Load, load, reserve_commit, router_with, verdict};

const TENANT: &str = "bench";
const BUDGETS: u64 = 1_000;

/// Puts one principal in every request: the "no authentication" server.
#[derive(Clone)]
struct Fixed<S> {
    inner: S,
    principal: Arc<Principal>,
}

#[derive(Clone)]
struct FixedLayer(Arc<Principal>);

impl<S> tower::Layer<S> for FixedLayer {
    type Service = Fixed<S>;
    fn layer(&self, inner: S) -> Fixed<S> {
        Fixed {
            inner,
            principal: self.0.clone(),
        }
    }
}

impl<S> tower::Service<http::Request<Body>> for Fixed<S>
where
    S: tower::Service<http::Request<Body>> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        req.extensions_mut().insert(self.principal.clone());
        Box::pin(self.inner.call(req))
    }
}

/// The caller of every round: a person holding the agent role, as the
/// JWT's claims make it too. (An agent-kind principal would need an
/// invocation grant per budget to reserve, which is not what this
/// measures: every reservation would be refused.)
fn principal() -> Principal {
    Principal::user(
        "bench",
        TENANT,
        &[Role::Viewer, Role::Agent],
        Kind::Human,
        Method::ApiKey,
    )
}

/// A JWKS file with one RS256 key, and a token it verifies.
fn jwt(dir: &std::path::Path) -> anyhow::Result<(OidcConfig, String)> {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256)?;
    let key = EncodingKey::from_rsa_pem(kp.serialize_pem().as_bytes())?;
    let mut jwk = Jwk::from_encoding_key(&key, Algorithm::RS256)?;
    jwk.common.key_id = Some("bench-1".into());
    let path = dir.join("jwks.json");
    std::fs::write(&path, serde_json::to_vec(&JwkSet { keys: vec![jwk] })?)?;
    let now = switchyard_kit::time::now_ms() / 1000;
    let claims = serde_json::json!({
        "iss": "https://idp.bench", "aud": "switchyard", "sub": "bench", "tenant": TENANT,
        "switchyard_roles": ["viewer", "agent"], "exp": now + 3600, "iat": now,
    });
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("bench-1".into());
    let token = jsonwebtoken::encode(&header, &claims, &key)?;
    let cfg = OidcConfig {
        issuer: "https://idp.bench".into(),
        audience: "switchyard".into(),
        jwks_file: Some(path),
        ..Default::default()
    };
    Ok((cfg, token))
}

/// Route and Reserve+Commit with each credential, and their ratios to the
/// server without authentication, measured in the same run.
pub async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();

    let router = router_with(10_000, 7);
    let ledger = Ledger::open(
        LedgerConfig::default(),
        switchyard_store::Store::open(dir.path().join("ledger"))?,
        Arc::new(SystemClock),
        shutdown.clone(),
    )?;
    for b in 0..=BUDGETS {
        let (id, parent) = match b {
            0 => ("org".to_owned(), String::new()),
            b => (format!("org/b{:04}", b - 1), "org".to_owned()),
        };
        ledger
            .create_budget_in(
                CreateBudgetRequest {
                    budget_id: id,
                    parent_id: parent,
                    token_limit: (b == 0).then_some(switchyard_ledger::MAX_AMOUNT),
                    ..Default::default()
                },
                TENANT,
                "bench",
            )
            .await?;
    }

    // The credentials.
    let api_key = keys::generate()?.token;
    let set = KeySet::default();
    set.upsert(
        keys::hash(&api_key),
        Binding {
            key_id: "key-bench".into(),
            subject: "bench".into(),
            tenant: TENANT.into(),
            roles: Roles::of(&[Role::Viewer, Role::Agent]),
            kind: Kind::Human,
            expires_at_ms: None,
            revoked: false,
            session: false,
        },
    );
    let (oidc, token) = jwt(dir.path())?;
    let authenticator = Authenticator::new(
        &AuthConfig {
            oidc: Some(oidc),
            ..Default::default()
        },
        set,
    )
    .map_err(anyhow::Error::msg)?;

    let max = 4 << 20;
    let cfg = switchyard_kit::server::ServerConfig {
        listen: "127.0.0.1:0".into(),
        ..Default::default()
    };
    let with_auth = switchyard_kit::server::bind(&cfg).await?;
    let with_auth_url = format!("http://{}", with_auth.local_addr()?);
    let server = switchyard_kit::server::Server::new(cfg.clone())
        .with_auth(Arc::new(authenticator))
        .add_service(router.server(max))
        .add_service(ledger.server(max));
    let kit = tokio::spawn(server.run(with_auth, shutdown.clone()));

    let unauthenticated = switchyard_kit::server::bind(&cfg).await?;
    let unauthenticated_url = format!("http://{}", unauthenticated.local_addr()?);
    let server = switchyard_kit::server::Server::new(cfg.clone())
        .with_fixed_principal_insecure(principal())
        .add_service(router.server(max))
        .add_service(ledger.server(max));
    let fixed = tokio::spawn(server.run(unauthenticated, shutdown.clone()));

    let bare = switchyard_kit::server::bind(&cfg).await?;
    let bare_url = format!("http://{}", bare.local_addr()?);
    let stop = shutdown.clone();
    let plain = tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .layer(FixedLayer(Arc::new(principal())))
            .add_service(router.server(max))
            .add_service(ledger.server(max))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(bare).with_nodelay(Some(true)),
                async move { stop.wait().await },
            ),
    );

    let channels = |url: String, cred: Option<String>| async move {
        let mut out = Vec::new();
        for _ in 0..CONNECTIONS {
            let c = cred.as_deref().map(Credential::bearer).transpose()?;
            out.push(authed(switchyard_kit::client::connect(&url).await?, c));
        }
        anyhow::Ok(out)
    };
    let setups = [
        ("kit, no auth", channels(unauthenticated_url, None).await?),
        (
            "kit, API key",
            channels(with_auth_url.clone(), Some(api_key)).await?,
        ),
        (
            "kit, JWT (RS256)",
            channels(with_auth_url, Some(token)).await?,
        ),
        ("bare tonic, no auth", channels(bare_url, None).await?),
    ];
    println!(
        "\nAuthentication per RPC: the same router (10k agents) and ledger (1,000 budgets), {} callers, median of 3 interleaved rounds:",
        crate::CALLERS
    );
    // Rounds interleave the setups, so drift in the machine's speed hits
    // them alike; each figure is the median of its rounds.
    const ROUNDS: usize = 3;
    let mut route = vec![Vec::new(); setups.len()];
    let mut pairs = vec![Vec::new(); setups.len()];
    let mut errors = vec![0u64; setups.len()];
    for round in 0..ROUNDS {
        for (i, (_, chans)) in setups.iter().enumerate() {
            let r = route_load(chans).await;
            // Each setup and round reserves under its own idempotency keys.
            let offset = (round * setups.len() + i) as u64 * 1_000_000_000_000;
            let p = pair_load(chans, offset).await;
            route[i].push(r.rate);
            pairs[i].push(p.rate);
            errors[i] += r.errors + p.errors;
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = (median(&mut route[0]), median(&mut pairs[0]));
    for (i, (name, _)) in setups.iter().enumerate() {
        let (r, p) = (median(&mut route[i]), median(&mut pairs[i]));
        let (rr, pr) = (r / base.0, p / base.1);
        let goal = match i {
            // A round whose calls failed measured failures, not work.
            _ if errors[i] > 0 => "[INVALID: calls failed]".to_owned(),
            0 => "(baseline)".to_owned(),
            3 => "(reference: no span, correlation or limits)".to_owned(),
            _ => format!(
                "[{}: Route >= 0.9] [{}: pairs >= 0.9]",
                verdict(rr >= 0.9),
                verdict(pr >= 0.9)
            ),
        };
        println!(
            "  {name:<20} Route {r:>8.0}/s (x{rr:.2})  Reserve+Commit {p:>7.0} pairs/s (x{pr:.2})  errors {}  {goal}",
            errors[i]
        );
    }
    trigger.fire();
    let _ = kit.await;
    let _ = fixed.await;
    let _ = plain.await;
    Ok(())
}

async fn route_load(chans: &[Channel]) -> Load {
    load(chans, |ch, seq| async move {
        RouterServiceClient::new(ch)
            .route(RouteRequest {
                capability: format!("cap_{:03}", seq % CAPABILITIES as u64),
                constraints: None,
                limit: 5,
            })
            .await
            .map(|_| None)
    })
    .await
}

async fn pair_load(chans: &[Channel], offset: u64) -> Load {
    load(chans, move |ch, seq| async move {
        let mut l = LedgerServiceClient::new(ch);
        let budget = format!("org/b{:04}", seq % BUDGETS);
        reserve_commit(&mut l, budget, seq + offset).await?;
        Ok(None)
    })
    .await
}
