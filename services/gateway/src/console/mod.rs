//! The web console at `/ui/`: the approvals inbox, jobs with their live
//! event timeline, budgets with their ledger entries, agents and a routing
//! preview — for the people Switchyard asks before money is spent.
//!
//! It is part of the HTTP door, not a separate server: the same listener,
//! the same gate (correlation id, span, time limit) and the same
//! default-deny table ([`switchyard_kit::auth::HTTP_ROUTES`]). What differs
//! is where the credential comes from — the session cookie ([`session`]) —
//! and that every state-changing form must carry the session's
//! anti-forgery token, checked in the gate before any handler runs, so no
//! page can forget it. Each page then calls the services *as the person*
//! (the [`crate::caller`] rules), so what it shows and what its buttons do
//! are exactly what that person's gRPC calls would be allowed: the buttons
//! are a convenience, the services are the control.
//!
//! Pages are HTML rendered on the server (minijinja, auto-escaped) with a
//! little hand-written JavaScript for the live timeline; templates, styles
//! and script are compiled into the binary, so no CDN is needed.

mod live;
pub mod oidc;
mod pages;
pub mod session;
pub mod views;

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use switchyard_api::{
    ApprovalClient, AuthClient, LedgerClient, NotificationClient, RegistryClient, RouterClient,
    ScheduleClient,
};
use switchyard_core::Reason;
use switchyard_kit::auth::authn::Authenticator;
use tonic::{Code, Status};

use crate::caller::Jobs;
use crate::config::ConsoleConfig;
use session::{CSRF_FIELD, SESSION_COOKIE, SIGN_IN_COOKIE};

/// The services the console reads and acts on besides the executor, each
/// in-process or remote (called with each person's own credential). One
/// left out makes its pages say which `gateway.*_url` to set.
#[derive(Debug, Clone, Default)]
pub struct ConsoleServices {
    /// Sessions (`StartSession` at sign-in, `EndSession` at sign-out).
    pub auth: Option<AuthClient>,
    /// Runs to approve: the inbox.
    pub approval: Option<ApprovalClient>,
    /// Budgets and their entries.
    pub ledger: Option<LedgerClient>,
    /// Agents and tools.
    pub registry: Option<RegistryClient>,
    /// The routing preview.
    pub router: Option<RouterClient>,
    /// Schedules (the executor's ScheduleService).
    pub schedules: Option<ScheduleClient>,
    /// Webhook deliveries (the executor's NotificationService).
    pub notifications: Option<NotificationClient>,
    /// Signing in through the identity provider (`[gateway.console.oidc]`).
    pub oidc: Option<Arc<oidc::Provider>>,
    /// Where this process wrote its dev principals' keys (`switchyard dev`):
    /// the sign-in page says so. Unset: it wrote none.
    pub dev_keys: Option<std::path::PathBuf>,
}

/// What the console's handlers share.
pub(crate) struct Console {
    jobs: Jobs,
    services: ConsoleServices,
    auth: Arc<Authenticator>,
    cfg: ConsoleConfig,
    shutdown: switchyard_kit::shutdown::Shutdown,
}

/// The session a console request came with: what its forms must carry.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The anti-forgery token of this session.
    pub(crate) csrf: String,
}

/// The console's routes, served under the HTTP door's gate.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(
    jobs: Jobs,
    services: ConsoleServices,
    auth: Arc<Authenticator>,
    cfg: ConsoleConfig,
    shutdown: switchyard_kit::shutdown::Shutdown,
) -> Router<S> {
    let console = Arc::new(Console {
        jobs,
        services,
        auth,
        cfg,
        shutdown,
    });
    Router::new()
        .route("/ui/sign-in", get(pages::sign_in_form).post(pages::sign_in))
        .route("/ui/sign-in/oidc", get(pages::oidc_start))
        .route("/ui/oidc/callback", get(pages::oidc_callback))
        .route("/ui/sign-out", post(pages::sign_out))
        .route("/ui/assets/{file}", get(pages::asset))
        .route("/ui/", get(pages::inbox))
        .route("/ui/runs/{run_id}/{decision}", post(pages::decide))
        .route("/ui/jobs", get(pages::jobs))
        .route("/ui/jobs/{job_id}", get(pages::job))
        .route("/ui/jobs/{job_id}/events", get(pages::job_events))
        .route("/ui/jobs/{job_id}/cancel", post(pages::cancel))
        .route("/ui/jobs/{job_id}/rerun", post(pages::rerun))
        .route("/ui/jobs/{job_id}/input", post(pages::answer))
        .route("/ui/jobs/{job_id}/chat", get(pages::chat).post(pages::say))
        .route("/ui/submit", get(pages::submit_form).post(pages::submit))
        .route("/ui/budgets", get(pages::budgets))
        .route("/ui/limits", get(pages::limits))
        .route("/ui/agents", get(pages::agents))
        .route("/ui/schedules", get(pages::schedules))
        .route(
            "/ui/schedules/{schedule_id}/{action}",
            post(pages::pause_schedule),
        )
        .route("/ui/notifications", get(pages::notifications))
        .route("/ui/notifications/retry", post(pages::retry_notification))
        .route("/ui/live", get(live::live))
        .with_state(console)
}

/// Whether `route` (a matched route template) is the console's.
pub(crate) fn is_console(route: &str) -> bool {
    route.starts_with("/ui/")
}

/// The headers to authenticate a console request with: its session
/// cookie as a bearer token, and nothing else a page could set (no
/// on-behalf-of: the console never acts for someone else).
pub(crate) fn credential_headers(headers: &http::HeaderMap) -> http::HeaderMap {
    let mut out = http::HeaderMap::new();
    if let Some(v) = session::cookie(headers, SESSION_COOKIE)
        .filter(|c| session::cookie_safe(c))
        .and_then(|c| http::HeaderValue::from_str(&format!("Bearer {c}")).ok())
    {
        out.insert(http::header::AUTHORIZATION, v);
    }
    out
}

/// The session of a console request (its anti-forgery token), once its
/// cookie authenticated.
pub(crate) fn session_of(headers: &http::HeaderMap) -> Session {
    Session {
        csrf: session::cookie(headers, SESSION_COOKIE)
            .map(session::csrf_token)
            .unwrap_or_default(),
    }
}

/// Checks a console form post before anything acts on it: it must not come
/// from another site, and its `csrf` field must be the session's token
/// (for signing in: the pre-session cookie's). The body is read (up to
/// `max_body`) and handed on unchanged.
pub(crate) async fn check_form(
    req: Request,
    route: &str,
    max_body: usize,
) -> Result<Request, Response> {
    let forged = |why: &str| {
        refusal(
            "POST",
            route,
            "",
            switchyard_kit::error::status(
                Code::PermissionDenied,
                Reason::FormForged,
                format!("{why}: nothing was done; reload the page and try again"),
            ),
        )
    };
    if session::cross_site(req.headers()) {
        return Err(forged("the form was sent from another site"));
    }
    let expected = if route == "/ui/sign-in" {
        session::cookie(req.headers(), SIGN_IN_COOKIE).map(str::to_owned)
    } else {
        session::cookie(req.headers(), SESSION_COOKIE).map(session::csrf_token)
    };
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, max_body).await.map_err(|_| {
        refusal(
            "POST",
            route,
            "",
            switchyard_kit::error::status(
                Code::InvalidArgument,
                Reason::InvalidArgument,
                format!("the form is larger than the gateway's {max_body} bytes (gateway.http.max_body_bytes)"),
            ),
        )
    })?;
    let presented = form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == CSRF_FIELD)
        .map(|(_, v)| v.into_owned());
    match (presented, expected) {
        (Some(p), Some(e)) if session::same(&p, &e) => {
            Ok(Request::from_parts(parts, Body::from(bytes)))
        }
        (None, _) => Err(forged("the form carries no anti-forgery token")),
        _ => Err(forged(
            "the form's anti-forgery token is not this session's (it expired, or the form came from elsewhere)",
        )),
    }
}

/// A refusal of a console route as a page: a page asked for without a
/// session goes to sign-in (and back after); anything else shows the
/// reason on an error page with the status's HTTP code.
pub(crate) fn refusal(method: &str, route: &str, path_and_query: &str, s: Status) -> Response {
    if method == "GET" && s.code() == Code::Unauthenticated && route != "/ui/jobs/{job_id}/events" {
        let next = session::next_path(Some(path_and_query));
        let to = format!("/ui/sign-in?next={}", encode(next));
        return (http::StatusCode::SEE_OTHER, [(http::header::LOCATION, to)]).into_response();
    }
    error_page(&s, None)
}

/// `s` as an error page; with `who` (a signed-in person's layout) when
/// known.
pub(crate) fn error_page(s: &Status, layout: Option<serde_json::Value>) -> Response {
    let request_id = switchyard_kit::context::current()
        .map(|c| c.correlation_id)
        .unwrap_or_default();
    let (code, body) = switchyard_kit::error::http_error(s, &request_id);
    let mut ctx = layout.unwrap_or_else(|| serde_json::json!({}));
    ctx["error"] = body["error"].clone();
    ctx["title"] = code.canonical_reason().unwrap_or("Error").into();
    let mut resp = render("error.html", &ctx);
    *resp.status_mut() = code;
    resp
}

/// Percent-encodes `s` as one path segment or query value: every byte but
/// the unreserved ones (RFC 3986).
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The templates, compiled in: auto-escaped as HTML.
static TEMPLATES: LazyLock<minijinja::Environment<'static>> = LazyLock::new(|| {
    let mut env = minijinja::Environment::new();
    env.add_filter("urlencode", |s: String| encode(&s));
    for (name, src) in TEMPLATE_FILES {
        if let Err(e) = env.add_template(name, src) {
            // A template that does not parse is a build defect; the test
            // below renders each one.
            tracing::error!(template = name, error = %e, "console template does not parse");
        }
    }
    env
});

const TEMPLATE_FILES: &[(&str, &str)] = &[
    (
        "base.html",
        include_str!("../../console/templates/base.html"),
    ),
    (
        "sign_in.html",
        include_str!("../../console/templates/sign_in.html"),
    ),
    (
        "signed_in.html",
        include_str!("../../console/templates/signed_in.html"),
    ),
    (
        "error.html",
        include_str!("../../console/templates/error.html"),
    ),
    (
        "inbox.html",
        include_str!("../../console/templates/inbox.html"),
    ),
    (
        "jobs.html",
        include_str!("../../console/templates/jobs.html"),
    ),
    ("job.html", include_str!("../../console/templates/job.html")),
    (
        "chat.html",
        include_str!("../../console/templates/chat.html"),
    ),
    (
        "inputs.html",
        include_str!("../../console/templates/inputs.html"),
    ),
    (
        "submit.html",
        include_str!("../../console/templates/submit.html"),
    ),
    (
        "budgets.html",
        include_str!("../../console/templates/budgets.html"),
    ),
    (
        "limits.html",
        include_str!("../../console/templates/limits.html"),
    ),
    (
        "agents.html",
        include_str!("../../console/templates/agents.html"),
    ),
    (
        "schedules.html",
        include_str!("../../console/templates/schedules.html"),
    ),
    (
        "notifications.html",
        include_str!("../../console/templates/notifications.html"),
    ),
];

/// Renders template `name` with `ctx` as a page, with the headers every
/// console page carries: no caching (pages hold a person's data), no
/// framing, scripts and styles only from this origin.
pub(crate) fn render(name: &str, ctx: &serde_json::Value) -> Response {
    let html = TEMPLATES
        .get_template(name)
        .and_then(|t| t.render(minijinja::Value::from(minijinja::value::Serde(ctx))));
    match html {
        Ok(html) => secured(Html(html).into_response()),
        Err(e) => {
            tracing::error!(template = name, error = %e, "console page did not render");
            secured(
                (
                    http::StatusCode::INTERNAL_SERVER_ERROR,
                    Html("<!doctype html><title>Error</title><p>This page could not be rendered; the gateway's log says why.</p>"),
                )
                    .into_response(),
            )
        }
    }
}

/// The security headers of every console response.
pub(crate) fn secured(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    let set = |h: &mut http::HeaderMap, k: &'static str, v: &'static str| {
        h.insert(k, http::HeaderValue::from_static(v));
    };
    set(
        h,
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "same-origin");
    set(h, "x-frame-options", "DENY");
    if !h.contains_key(http::header::CACHE_CONTROL) {
        set(h, "cache-control", "no-store");
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_template_parses_and_escapes_what_it_shows() {
        for (name, _) in TEMPLATE_FILES {
            TEMPLATES
                .get_template(name)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        // Every template on disk is compiled in.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/console/templates");
        for f in std::fs::read_dir(dir).expect("templates") {
            let name = f.expect("entry").file_name().to_string_lossy().into_owned();
            assert!(
                TEMPLATE_FILES.iter().any(|(n, _)| *n == name),
                "{name} is not in TEMPLATE_FILES"
            );
        }
        let s = switchyard_kit::error::status(
            Code::PermissionDenied,
            Reason::PermissionDenied,
            "<script>alert(1)</script>",
        );
        let resp = error_page(&s, None);
        assert_eq!(resp.status(), http::StatusCode::FORBIDDEN);
        let csp = resp.headers()["content-security-policy"]
            .to_str()
            .unwrap_or("");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert_eq!(resp.headers()["cache-control"], "no-store");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let html = String::from_utf8_lossy(&body);
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
            "{html}"
        );
    }

    #[test]
    fn a_page_without_a_session_goes_to_sign_in_and_back() {
        let s = Status::unauthenticated("no credential");
        let resp = refusal("GET", "/ui/jobs", "/ui/jobs?state=active", s.clone());
        assert_eq!(resp.status(), http::StatusCode::SEE_OTHER);
        assert_eq!(
            resp.headers()[http::header::LOCATION],
            "/ui/sign-in?next=%2Fui%2Fjobs%3Fstate%3Dactive"
        );
        // A form post or an event stream is refused, not redirected.
        assert_eq!(
            refusal("POST", "/ui/submit", "/ui/submit", s.clone()).status(),
            401
        );
        assert_eq!(
            refusal("GET", "/ui/jobs/{job_id}/events", "/ui/jobs/j/events", s).status(),
            401
        );
    }

    #[test]
    fn only_the_session_cookie_becomes_the_credential() {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::COOKIE,
            "sy_session=sy_abc".parse().expect("value"),
        );
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer other".parse().expect("value"),
        );
        h.insert(
            switchyard_kit::auth::ON_BEHALF_HEADER,
            "mallory".parse().expect("value"),
        );
        let c = credential_headers(&h);
        assert_eq!(c.len(), 1);
        assert_eq!(c[http::header::AUTHORIZATION], "Bearer sy_abc");
        h.insert(
            http::header::COOKIE,
            "sy_session=a;b".parse().expect("value"),
        );
        assert!(credential_headers(&http::HeaderMap::new()).is_empty());
    }
}
