//! The console's pages: each fetches as the signed-in person, shapes with
//! [`super::views`] and renders a template.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use switchyard_api::{
    ApprovalClient, AuthClient, LedgerClient, NotificationClient, RegistryClient, RouterClient,
    ScheduleClient,
};
use switchyard_core::Reason;
use switchyard_kit::auth::Permission;
use switchyard_proto::approval::v1 as ap;
use switchyard_proto::auth::v1 as au;
use switchyard_proto::executor::v1::{JobState, ListJobsRequest, SubmitJobRequest};
use switchyard_proto::ledger::v1 as lg;
use switchyard_proto::registry::v1 as rg;
use switchyard_proto::router::v1 as rt;
use tonic::{Code, Status};

use super::views::{self, money, when};
use super::{Console, Session, encode, error_page, oidc, render, secured, session};
use crate::caller::{Caller, as_caller, reach};

pub(crate) type Shared = State<Arc<Console>>;

/// A page that could not be made: the reason on an error page, inside the
/// person's layout.
pub(crate) struct PageError(Status, Value);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        error_page(&self.0, Some(self.1))
    }
}

/// What every signed-in page shows around its content: who is signed in,
/// what the navigation offers them, and the token their forms carry.
fn layout(c: &Caller, s: &Session, active: &str) -> Value {
    let p = &c.principal;
    json!({
        "me": {"subject": p.subject, "tenant": p.tenant, "roles": p.roles.names()},
        "csrf": s.csrf,
        "active": active,
        "may": {
            "inbox": p.may(Permission::RunRead),
            "decide": p.may(Permission::RunDecide),
            "jobs": p.may(Permission::JobRead),
            "cancel": p.may(Permission::JobCancel),
            "answer": p.may(Permission::JobAnswer),
            "submit": p.may(Permission::JobSubmit),
            "budgets": p.may(Permission::BudgetRead),
            "agents": p.may(Permission::AgentRead),
            "notifications": p.may(Permission::DeadLetterManage),
            "route": p.may(Permission::Route),
        },
    })
}

/// `data` merged into the layout and rendered.
fn page(template: &str, mut base: Value, data: Value) -> Response {
    if let (Some(b), Value::Object(d)) = (base.as_object_mut(), data) {
        b.extend(d);
    }
    render(template, &base)
}

fn now() -> u64 {
    switchyard_kit::time::now_ms()
}

fn see_other(to: &str) -> Response {
    secured(
        (
            http::StatusCode::SEE_OTHER,
            [(http::header::LOCATION, to.to_owned())],
        )
            .into_response(),
    )
}

/// An invalid query or form value, said as the API would.
fn invalid(field: &str, why: &str) -> Status {
    let mut v = switchyard_core::Violations::new();
    v.add(field, why);
    switchyard_kit::error::invalid_argument(Reason::InvalidArgument, &v)
}

/// A page's query string, decoded into `T`; one that does not decode is
/// an error page saying why (not the framework's plain-text answer).
pub(crate) struct Query<T>(pub(crate) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, Response> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(t)| Query(t))
            .map_err(|e| error_page(&invalid("query", &e.body_text()), None))
    }
}

/// A posted form, decoded into `T`, refused as [`Query`] is.
pub(crate) struct Form<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Form<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        axum::extract::Form::<T>::from_request(req, state)
            .await
            .map(|axum::extract::Form(t)| Form(t))
            .map_err(|e| error_page(&invalid("form", &e.body_text()), None))
    }
}

// --- sign-in -------------------------------------------------------------

#[derive(Deserialize)]
pub(crate) struct NextQuery {
    next: Option<String>,
}

/// `GET /ui/sign-in`: the form, bound to a new pre-session cookie.
pub(crate) async fn sign_in_form(State(c): Shared, Query(q): Query<NextQuery>) -> Response {
    sign_in_page(&c, q.next.as_deref(), None, http::StatusCode::OK)
}

fn sign_in_page(
    c: &Console,
    next: Option<&str>,
    problem: Option<String>,
    code: http::StatusCode,
) -> Response {
    let nonce = match session::nonce() {
        Ok(n) => n,
        Err(e) => {
            return error_page(
                &Status::internal(format!("no randomness for the sign-in form: {e}")),
                None,
            );
        }
    };
    let mut resp = render(
        "sign_in.html",
        &json!({
            "csrf": nonce,
            "next": session::next_path(next),
            "problem": problem,
            "title": "Sign in",
            "oidc": c.services.oidc.is_some(),
            "prefix": switchyard_kit::auth::keys::TOKEN_PREFIX,
            "dev_keys": c.services.dev_keys.as_ref().map(|p| p.display().to_string()),
        }),
    );
    *resp.status_mut() = code;
    if let Ok(v) =
        session::set_cookie(session::SIGN_IN_COOKIE, &nonce, 600, c.cfg.secure_cookie).parse()
    {
        resp.headers_mut().append(http::header::SET_COOKIE, v);
    }
    resp
}

#[derive(Deserialize)]
pub(crate) struct SignInForm {
    #[serde(default)]
    credential: String,
    #[serde(default)]
    next: Option<String>,
}

/// `POST /ui/sign-in`: authenticates the pasted API key (or OIDC token) as
/// every door would, then keeps it in the session cookie.
pub(crate) async fn sign_in(State(c): Shared, Form(f): Form<SignInForm>) -> Response {
    let credential = f.credential.trim();
    let next = f.next.as_deref();
    if !session::cookie_safe(credential) {
        return sign_in_page(
            &c,
            next,
            Some("that is not an API key or token: paste the secret `switchyard auth key create` printed (sy_…), or a token from your identity provider".into()),
            http::StatusCode::BAD_REQUEST,
        );
    }
    let started = match crate::caller::authenticate_token(&c.auth, credential).await {
        Ok(caller) => start_session(&c, &caller).await.map(|s| (caller, s)),
        Err(e) => Err(Status::from(e)),
    };
    match started {
        Ok((caller, (secret, max_age))) => {
            tracing::info!(principal = %caller.principal.subject, "console sign-in");
            // The inbox is the front page of those who may read runs;
            // anyone else starts at the jobs they may see.
            let to = match session::next_path(next) {
                "/ui/" if !caller.principal.may(Permission::RunRead) => "/ui/jobs",
                to => to,
            };
            let mut resp = see_other(to);
            let h = resp.headers_mut();
            for v in [
                session::set_cookie(
                    session::SESSION_COOKIE,
                    &secret,
                    max_age,
                    c.cfg.secure_cookie,
                ),
                session::set_cookie(session::SIGN_IN_COOKIE, "", 0, c.cfg.secure_cookie),
            ] {
                if let Ok(v) = v.parse() {
                    h.append(http::header::SET_COOKIE, v);
                }
            }
            resp
        }
        Err(e) => {
            tracing::debug!(error = %e.message(), "console sign-in refused");
            let code = match e.code() {
                Code::Unavailable => http::StatusCode::SERVICE_UNAVAILABLE,
                _ => http::StatusCode::UNAUTHORIZED,
            };
            sign_in_page(
                &c,
                next,
                Some(format!("not signed in: {}", e.message())),
                code,
            )
        }
    }
}

/// Starts the server-side session the cookie will carry (never the
/// credential itself): its secret and how long the cookie should last.
async fn start_session(c: &Console, caller: &Caller) -> Result<(String, u64), Status> {
    let auth = reach(&c.services.auth, "auth")?;
    let req = au::StartSessionRequest {
        ttl_secs: c.cfg.session_ttl_secs,
        description: "console".into(),
    };
    let started = as_caller!(AuthClient, auth, caller, start_session, req)?;
    // A gateway that follows the key set from another process sees the
    // session a moment later; the next page must not find it unknown.
    settle(c, &started.secret, true).await;
    let now = switchyard_kit::time::now_ms();
    let max_age = started
        .session
        .and_then(|s| s.expires_at)
        .map(|e| switchyard_kit::time::timestamp_ms(&e).saturating_sub(now) / 1000)
        .unwrap_or(c.cfg.session_ttl_secs);
    Ok((started.secret, max_age))
}

/// Waits (up to five seconds) until this gateway's key set verifies
/// `secret` (`valid`) or refuses it: the auth service may be another
/// process, whose changes this one follows through `WatchKeys`.
async fn settle(c: &Console, secret: &str, valid: bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let now = crate::caller::authenticate_token(&c.auth, secret)
            .await
            .is_ok();
        if now == valid || tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `GET /ui/sign-in/oidc`: to the identity provider, with this flow's
/// state, nonce and code challenge remembered in the browser.
pub(crate) async fn oidc_start(
    State(c): Shared,
    Query(q): Query<NextQuery>,
    headers: http::HeaderMap,
) -> Response {
    let next = q.next.as_deref();
    let Some(provider) = &c.services.oidc else {
        let problem = oidc::OidcError::NotConfigured.to_string();
        return sign_in_page(&c, next, Some(problem), http::StatusCode::NOT_FOUND);
    };
    let flow = match oidc::Flow::new(next.unwrap_or("/ui/")) {
        Ok(f) => f,
        Err(e) => {
            return error_page(
                &Status::internal(format!("no randomness for signing in: {e}")),
                None,
            );
        }
    };
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let redirect = provider.redirect_uri(host, c.cfg.secure_cookie);
    match provider.authorize_url(&flow, &redirect).await {
        Ok(url) => {
            let mut resp = see_other(&url);
            let cookie = session::set_lax_cookie(
                oidc::FLOW_COOKIE,
                &flow.encode(),
                600,
                c.cfg.secure_cookie,
            );
            if let Ok(v) = cookie.parse() {
                resp.headers_mut().append(http::header::SET_COOKIE, v);
            }
            resp
        }
        Err(e) => {
            tracing::warn!(error = %e, "console sign-in through the identity provider unavailable");
            sign_in_page(&c, next, Some(e.to_string()), http::StatusCode::BAD_GATEWAY)
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// `GET /ui/oidc/callback`: the provider's answer. The flow must be the one
/// this browser started; the token the code buys must pass the same
/// authentication as every bearer token; it becomes the session.
pub(crate) async fn oidc_callback(
    State(c): Shared,
    Query(q): Query<CallbackQuery>,
    headers: http::HeaderMap,
) -> Response {
    let flow = session::cookie(&headers, oidc::FLOW_COOKIE).and_then(oidc::Flow::decode);
    let refuse = |e: oidc::OidcError, code| {
        tracing::info!(error = %e, "console sign-in through the identity provider refused");
        sign_in_page(
            &c,
            flow.as_ref().map(|f| f.next.as_str()),
            Some(e.to_string()),
            code,
        )
    };
    let (Some(provider), Some(f)) = (&c.services.oidc, &flow) else {
        return refuse(
            oidc::OidcError::StateMismatch,
            http::StatusCode::BAD_REQUEST,
        );
    };
    if !q
        .state
        .as_deref()
        .is_some_and(|s| session::same(s, &f.state))
    {
        return refuse(
            oidc::OidcError::StateMismatch,
            http::StatusCode::BAD_REQUEST,
        );
    }
    if let Some(error) = q.error.as_deref() {
        let said = switchyard_core::validate::clamp(error, 60).to_owned();
        return refuse(
            oidc::OidcError::Refused(said),
            http::StatusCode::UNAUTHORIZED,
        );
    }
    let Some(code) = q.code.as_deref().filter(|c| !c.is_empty()) else {
        return refuse(
            oidc::OidcError::Refused("no code".into()),
            http::StatusCode::BAD_REQUEST,
        );
    };
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let redirect = provider.redirect_uri(host, c.cfg.secure_cookie);
    let tokens = match provider.exchange(f, code, &redirect).await {
        Ok(t) => t,
        Err(e) => return refuse(e, http::StatusCode::BAD_GATEWAY),
    };
    let mut why = Vec::new();
    for (kind, token) in tokens {
        if !session::cookie_safe(&token) {
            why.push(format!("the {kind} is too long to keep in a cookie"));
            continue;
        }
        let caller = match crate::caller::authenticate_token(&c.auth, &token).await {
            Ok(caller) => caller,
            Err(e) => {
                why.push(format!("the {kind}: {e}"));
                continue;
            }
        };
        if kind == "ID token" && oidc::nonce_of(&token).as_deref() != Some(f.nonce.as_str()) {
            why.push("the ID token is not this sign-in's (nonce)".into());
            continue;
        }
        let (secret, max_age) = match start_session(&c, &caller).await {
            Ok(s) => s,
            Err(e) => {
                why.push(format!("no session for the {kind}: {}", e.message()));
                continue;
            }
        };
        tracing::info!(principal = %caller.principal.subject, "console sign-in through the identity provider");
        let mut resp = render(
            "signed_in.html",
            // A page of this site moves on: the provider's redirect was a
            // navigation from another site, on which the new `Strict`
            // session cookie would not yet be sent.
            &json!({"title": "Signed in", "next": f.next, "refresh_to": f.next, "subject": caller.principal.subject}),
        );
        let h = resp.headers_mut();
        for v in [
            session::set_cookie(
                session::SESSION_COOKIE,
                &secret,
                max_age,
                c.cfg.secure_cookie,
            ),
            session::set_lax_cookie(oidc::FLOW_COOKIE, "", 0, c.cfg.secure_cookie),
        ] {
            if let Ok(v) = v.parse() {
                h.append(http::header::SET_COOKIE, v);
            }
        }
        return resp;
    }
    refuse(
        oidc::OidcError::Token(why.join("; ")),
        http::StatusCode::UNAUTHORIZED,
    )
}

/// `POST /ui/sign-out`: ends the session on the server (its token then
/// works nowhere) and forgets the cookie. When the auth service cannot be
/// reached the page says so and the cookie is kept: the person must not
/// believe a session ended that did not.
pub(crate) async fn sign_out(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    headers: http::HeaderMap,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "");
    let auth = reach(&c.services.auth, "auth").map_err(|e| PageError(e, base.clone()))?;
    as_caller!(
        AuthClient,
        auth,
        caller,
        end_session,
        au::EndSessionRequest {}
    )
    .map_err(|e| PageError(e, base))?;
    if let Some(secret) = session::cookie(&headers, session::SESSION_COOKIE) {
        settle(&c, secret, false).await;
    }
    tracing::info!(principal = %caller.principal.subject, "console sign-out");
    let mut resp = see_other("/ui/sign-in");
    if let Ok(v) = session::set_cookie(session::SESSION_COOKIE, "", 0, c.cfg.secure_cookie).parse()
    {
        resp.headers_mut().append(http::header::SET_COOKIE, v);
    }
    Ok(resp)
}

/// `GET /ui/assets/{file}`: the stylesheet and script, compiled in.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.css" => (
            include_str!("../../console/assets/console.css"),
            "text/css; charset=utf-8",
        ),
        "console.js" => (
            include_str!("../../console/assets/console.js"),
            "text/javascript; charset=utf-8",
        ),
        _ => {
            return error_page(
                &switchyard_kit::error::status(
                    Code::NotFound,
                    Reason::RouteNotFound,
                    format!(
                        "no console asset {:?}",
                        switchyard_core::validate::clamp(&file, 80)
                    ),
                ),
                None,
            );
        }
    };
    secured(
        (
            [
                (http::header::CONTENT_TYPE, kind),
                (http::header::CACHE_CONTROL, "public, max-age=300"),
            ],
            body,
        )
            .into_response(),
    )
}

// --- approvals inbox -----------------------------------------------------

#[derive(Deserialize)]
pub(crate) struct InboxQuery {
    done: Option<String>,
    run: Option<String>,
    /// `<job id>/<task id>` just answered.
    answered: Option<String>,
    #[serde(default)]
    page_token: String,
}

/// Runs on one page of the inbox.
const INBOX_PAGE: u32 = 50;

/// `GET /ui/`: the runs waiting for a decision in the person's tenant, each
/// with what it would spend and from which budget, what it may use and
/// produce, the job's plan and where each task would be routed.
pub(crate) async fn inbox(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Query(q): Query<InboxQuery>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "inbox");
    let fail = |e: Status| PageError(e, base.clone());
    let approvals = reach(&c.services.approval, "approval").map_err(fail)?;
    let req = ap::ListRunsRequest {
        statuses: vec![ap::RunStatus::Proposed as i32],
        page_size: INBOX_PAGE,
        page_token: q.page_token.clone(),
        ..Default::default()
    };
    let listed = as_caller!(ApprovalClient, approvals, caller, list_runs, req).map_err(fail)?;
    let seen = Seen::default();
    let cards =
        futures_util::future::join_all(listed.runs.iter().map(|r| run_card(&c, &caller, r, &seen)))
            .await;
    let notice = match (q.done.as_deref(), q.run.as_deref(), q.answered.as_deref()) {
        (Some(d @ ("approved" | "rejected")), Some(run), _) => Some(format!("run {run} {d}")),
        (_, _, Some(answered)) => Some(format!("answered {answered}")),
        _ => None,
    };
    let inputs = input_cards(&c, &caller, "").await;
    let inbox_count = super::live::badge(
        cards.len() + inputs.len(),
        !listed.next_page_token.is_empty(),
    );
    Ok(page(
        "inbox.html",
        base,
        json!({
            "title": "Approvals",
            "live": "inbox",
            "inbox_count": inbox_count,
            "runs": cards,
            "inputs": inputs,
            "notice": notice,
            "more": (!listed.next_page_token.is_empty())
                .then(|| format!("/ui/?page_token={}", encode(&listed.next_page_token))),
        }),
    ))
}

/// What one inbox page has read already: the runs of a project share their
/// ancestors' budgets and usually their capabilities, so each is asked for
/// once per page, not once per run. (Cards are made concurrently: two may
/// both miss and both ask, which is only the old cost.)
#[derive(Default)]
struct Seen {
    routes: std::sync::Mutex<BTreeMap<String, Value>>,
    budgets: std::sync::Mutex<BTreeMap<String, Result<lg::Budget, String>>>,
}

impl Seen {
    fn route(&self, capability: &str) -> Option<Value> {
        lock(&self.routes).get(capability).cloned()
    }

    fn budget(&self, id: &str) -> Option<Result<lg::Budget, String>> {
        lock(&self.budgets).get(id).cloned()
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One run as the inbox shows it.
async fn run_card(c: &Console, caller: &Caller, r: &ap::Run, seen: &Seen) -> Value {
    let now = now();
    let est = r.cost_estimate.unwrap_or_default();
    let created = r
        .created_at
        .as_ref()
        .map_or(0, switchyard_kit::time::timestamp_ms);
    let mut card = json!({
        "run_id": r.run_id,
        "intent": r.intent,
        "created_by": r.created_by,
        "own": r.created_by == caller.principal.subject,
        "created": when(created, now),
        "model": r.model,
        "max_tokens": r.max_tokens,
        "estimate": money(est.estimated_cost.as_ref().map_or(0, |m| m.micro_usd)),
        "estimate_known": est.estimated_cost.is_some(),
        "input_tokens": est.estimated_input_tokens,
        "output_tokens": est.estimated_output_tokens,
        "tools_allowed": r.tools_allowed,
        "outputs_allowed": r.outputs_allowed,
        "context_hash": r.context_pack.as_ref().map_or("", |p| p.hash.as_str()),
        "job_id": r.job_id,
        // A job's run may be approved up to a scope, held at approval.
        "scopable": r.adapter == "switchyard" && !r.job_id.is_empty(),
        "correlation_id": r.correlation_id,
        "approved_by": r.approved_by,
        "tool_call": r.tool_call.as_ref().map(|t| json!({
            "tool": t.tool, "arguments": t.arguments, "task_id": t.task_id,
        })),
        "extension": r.extension.as_ref().map(|x| json!({
            "job_id": x.job_id, "dimension": x.dimension, "refused_by": x.refused_by,
            "message": x.message, "tokens": x.tokens,
            "cost": x.cost.as_ref().map(|m| money(m.micro_usd)),
            "remaining_tasks": x.remaining_tasks, "number": x.number,
        })),
        // Why it waits for a person: the policies' decision at proposal.
        "policy": r.policy.as_ref().map(|p| json!({
            "explanation": p.explanation, "version": p.version, "effect": p.effect,
            "approvals_required": p.approvals_required, "policies": p.policies,
        })),
    });
    // A job's run, or a paused job's extension: the job as the person may
    // read it, with the budget chain it draws on.
    let job_id = match &r.extension {
        Some(x) => x.job_id.as_str(),
        None => r.job_id.as_str(),
    };
    if job_id.is_empty() {
        return card;
    }
    let job = match c.jobs.get(caller, job_id).await {
        Ok(j) => j,
        Err(e) => {
            card["job_problem"] = e.message().into();
            return card;
        }
    };
    let spec = job.spec.clone().unwrap_or_default();
    card["plan_id"] = spec.plan_id.clone().into();
    card["plan_description"] = spec.plan_description.clone().into();
    let mut tasks = views::tasks(&job, now);
    // Where each agent task would go today: the router's first choice.
    if caller.principal.may(Permission::Route)
        && let Some(router) = &c.services.router
    {
        for (t, spec) in tasks.iter_mut().zip(&spec.tasks) {
            if let Some(switchyard_proto::executor::v1::task_spec::Kind::Agent(a)) = &spec.kind {
                if let Some(known) = seen.route(&a.capability) {
                    t["route"] = known;
                    continue;
                }
                let req = rt::RouteRequest {
                    capability: a.capability.clone(),
                    limit: 1,
                    ..Default::default()
                };
                t["route"] = match as_caller!(RouterClient, router, caller, route, req) {
                    Ok(r) => r.candidates.first().map_or_else(
                        || json!({"none": true}),
                        |cand| {
                            json!({
                                "agent": cand.agent_id,
                                "score": format!("{:.2}", cand.score),
                                "price": money(cand.price_per_unit_micro_usd),
                                "unit": cand.unit,
                            })
                        },
                    ),
                    Err(e) => json!({"problem": e.message()}),
                };
                lock(&seen.routes).insert(a.capability.clone(), t["route"].clone());
            }
        }
    }
    card["tasks"] = tasks.into();
    // What approving asks of each budget: the estimate (an extension's
    // amount) against what each level has left, flagged where it does not
    // fit.
    let wanted = match &r.extension {
        Some(x) => Wanted {
            micro_usd: x.cost.as_ref().map(|m| m.micro_usd),
            tokens: x.tokens,
        },
        None => Wanted {
            micro_usd: est.estimated_cost.as_ref().map(|m| m.micro_usd),
            tokens: 0,
        },
    };
    card["budgets"] = budget_chain(c, caller, &job.budget_id, seen, &wanted).await;
    card
}

/// What approving a run asks its budgets for.
struct Wanted {
    /// Money (its estimate, or an extension's amount), when known.
    micro_usd: Option<i64>,
    /// Tokens an extension adds (0: not asked as tokens).
    tokens: u64,
}

impl Wanted {
    /// Why `b` cannot hold what is asked, when it cannot: the money asked
    /// is more than it has left (with a limit), or the tokens are.
    fn short_of(&self, b: &switchyard_proto::ledger::v1::Budget) -> Option<String> {
        if let (Some(want), Some(left)) = (self.micro_usd, b.cost_remaining.as_ref())
            && want > left.micro_usd
        {
            return Some(format!(
                "does not fit: {} asked, {} left",
                money(want)["text"].as_str().unwrap_or_default(),
                money(left.micro_usd)["text"].as_str().unwrap_or_default()
            ));
        }
        if let Some(left) = b.tokens_remaining
            && self.tokens > left
        {
            return Some(format!(
                "does not fit: {} tokens asked, {left} left",
                self.tokens
            ));
        }
        None
    }
}

/// Budget `id` and its ancestors (job → project → tenant), as far as the
/// person may read, each flagged when `wanted` does not fit in it; a
/// problem reading one ends the chain with its reason.
async fn budget_chain(
    c: &Console,
    caller: &Caller,
    id: &str,
    seen: &Seen,
    wanted: &Wanted,
) -> Value {
    let Some(ledger) = &c.services.ledger else {
        return json!([{"problem": "this gateway reaches no ledger (gateway.ledger_url)"}]);
    };
    let mut out = Vec::new();
    let mut next = id.to_owned();
    while !next.is_empty() && out.len() < 6 {
        let read = match seen.budget(&next) {
            Some(known) => known,
            None => {
                let req = lg::GetBudgetRequest {
                    budget_id: next.clone(),
                };
                let read = as_caller!(LedgerClient, ledger, caller, get_budget, req)
                    .map(|r| r.budget.unwrap_or_default())
                    .map_err(|e| e.message().to_owned());
                lock(&seen.budgets).insert(next.clone(), read.clone());
                read
            }
        };
        match read {
            Ok(b) => {
                next = b.parent_id.clone();
                let mut v = views::budget(&b);
                if let Some(short) = wanted.short_of(&b) {
                    v["short"] = short.into();
                }
                out.push(v);
            }
            Err(problem) => {
                out.push(json!({"id": next, "problem": problem}));
                break;
            }
        }
    }
    out.into()
}

#[derive(Deserialize)]
pub(crate) struct DecisionForm {
    #[serde(default)]
    comment: String,
    /// Approve a job up to a scope: hold its estimate now.
    #[serde(default)]
    hold: Option<String>,
    /// The scope's (or an extension's granted) money, in dollars.
    #[serde(default)]
    up_to: String,
    /// The scope's (or an extension's granted) tokens.
    #[serde(default)]
    tokens: String,
    /// A tool call's run: the tool to run instead (the form shows the
    /// model's; unchanged is a plain approval).
    #[serde(default)]
    edit_tool: String,
    /// A tool call's run: the arguments to run it with (JSON object).
    #[serde(default)]
    edit_args: String,
}

impl DecisionForm {
    /// The edit of a tool call the form carries, if any
    /// (`ApproveRequest.edit`; the approval service compares it with the
    /// call and checks it).
    fn edit(&self) -> Option<ap::ToolCallEdit> {
        let (tool, args) = (self.edit_tool.trim(), self.edit_args.trim());
        (!tool.is_empty() || !args.is_empty()).then(|| ap::ToolCallEdit {
            tool: tool.to_owned(),
            arguments: args.to_owned(),
            by: String::new(),
        })
    }

    /// The scope the form asks for, if any (`ApproveRequest.scope`), or
    /// which field is not a number.
    fn scope(&self) -> Result<Option<ap::ApprovalScope>, Status> {
        let (up_to, tokens) = (self.up_to.trim(), self.tokens.trim());
        if self.hold.is_none() && up_to.is_empty() && tokens.is_empty() {
            return Ok(None);
        }
        let bad = |field: &str, why: String| {
            let mut v = switchyard_core::Violations::new();
            v.add(field, why);
            switchyard_kit::error::invalid_argument(Reason::InvalidArgument, &v)
        };
        let cost = match up_to {
            "" => None,
            t => Some(switchyard_core::money::parse_usd(t).map_err(|e| bad("up_to", e))?),
        };
        let tokens = match tokens {
            "" => 0,
            t => t
                .parse::<u64>()
                .map_err(|_| bad("tokens", format!("{t:?} is not a whole number of tokens")))?,
        };
        Ok(Some(ap::ApprovalScope {
            tokens,
            cost: cost.map(|micro_usd| switchyard_proto::common::v1::Money { micro_usd }),
            until: None,
        }))
    }
}

/// `POST /ui/runs/{run_id}/approve` and `…/reject`: decides as the person,
/// with the comment the submitter will read; the approval service decides
/// whether they may (approver role, not the run's creator, the two-person
/// rule).
pub(crate) async fn decide(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Path((run_id, decision)): Path<(String, String)>,
    Form(f): Form<DecisionForm>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "inbox");
    let fail = |e: Status| PageError(e, base.clone());
    let approvals = reach(&c.services.approval, "approval").map_err(fail)?;
    let done = match decision.as_str() {
        "approve" => {
            let scope = f.scope().map_err(fail)?;
            let edit = f.edit();
            let req = ap::ApproveRequest {
                run_id: run_id.clone(),
                comment: f.comment,
                edit,
                scope,
            };
            as_caller!(ApprovalClient, approvals, caller, approve, req).map(|_| "approved")
        }
        "reject" => {
            let req = ap::RejectRequest {
                run_id: run_id.clone(),
                comment: f.comment,
            };
            as_caller!(ApprovalClient, approvals, caller, reject, req).map(|_| "rejected")
        }
        other => Err(switchyard_kit::error::status(
            Code::NotFound,
            Reason::RouteNotFound,
            format!(
                "a run is decided by `approve` or `reject`, not {:?}",
                switchyard_core::validate::clamp(other, 40)
            ),
        )),
    }
    .map_err(fail)?;
    Ok(see_other(&format!(
        "/ui/?done={done}&run={}",
        encode(&run_id)
    )))
}

// --- jobs ----------------------------------------------------------------

#[derive(Deserialize, Default)]
pub(crate) struct JobsQuery {
    #[serde(default)]
    state: String,
    #[serde(default)]
    submitted_by: String,
    #[serde(default)]
    plan_id: String,
    #[serde(default)]
    correlation_id: String,
    #[serde(default)]
    page_token: String,
}

/// The job states a filter may name, in lifecycle order.
const STATES: [JobState; 9] = [
    JobState::Scheduled,
    JobState::Available,
    JobState::Pending,
    JobState::Active,
    JobState::BudgetPaused,
    JobState::Completed,
    JobState::Retryable,
    JobState::Cancelled,
    JobState::Discarded,
];

/// `GET /ui/jobs`: the jobs the person may see, newest first, filtered.
pub(crate) async fn jobs(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Query(q): Query<JobsQuery>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "jobs");
    let fail = |e: Status| PageError(e, base.clone());
    let names: Vec<String> = STATES
        .iter()
        .map(|s| crate::http::job_state_name(*s as i32))
        .collect();
    let states = if q.state.is_empty() {
        vec![]
    } else {
        let found = STATES
            .iter()
            .find(|s| crate::http::job_state_name(**s as i32) == q.state)
            .ok_or_else(|| {
                fail(invalid(
                    "state",
                    &format!("must be one of {}", names.join(", ")),
                ))
            })?;
        vec![*found as i32]
    };
    let req = ListJobsRequest {
        states,
        plan_id: q.plan_id.trim().to_owned(),
        correlation_id: q.correlation_id.trim().to_owned(),
        submitted_by: q.submitted_by.trim().to_owned(),
        page_size: 50,
        page_token: q.page_token.clone(),
        ..Default::default()
    };
    let listed = c.jobs.list(&caller, req).await.map_err(fail)?;
    let now = now();
    let rows: Vec<Value> = listed
        .jobs
        .iter()
        .map(|j| {
            let spec = j.spec.clone().unwrap_or_default();
            let state = crate::http::job_state_name(j.state);
            let p = j.progress.unwrap_or_default();
            json!({
                "id": spec.job_id,
                "plan_id": spec.plan_id,
                "state": state,
                "tone": views::tone(&state),
                "submitted_by": j.submitted_by,
                "correlation_id": spec.correlation_id,
                "created": when(j.created_at.as_ref().map_or(0, switchyard_kit::time::timestamp_ms), now),
                "percent": p.percent_complete,
                "steps": format!("{}/{}", p.current_step, p.total_steps),
                "cost": money(j.cost_so_far.as_ref().map_or(0, |m| m.micro_usd)),
                "tokens": j.tokens_used,
            })
        })
        .collect();
    let more = (!listed.next_page_token.is_empty()).then(|| {
        format!(
            "/ui/jobs?state={}&submitted_by={}&plan_id={}&correlation_id={}&page_token={}",
            encode(&q.state),
            encode(&q.submitted_by),
            encode(&q.plan_id),
            encode(&q.correlation_id),
            encode(&listed.next_page_token)
        )
    });
    Ok(page(
        "jobs.html",
        base,
        json!({
            "title": "Jobs",
            "live": "jobs",
            "jobs": rows,
            "states": names,
            "filter": {"state": q.state, "submitted_by": q.submitted_by, "plan_id": q.plan_id, "correlation_id": q.correlation_id},
            "more": more,
        }),
    ))
}

/// `GET /ui/jobs/{job_id}`: one job — its steps and their states, progress,
/// per-step agent/model/tokens/cost, outputs so far, and the live timeline.
pub(crate) async fn job(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Path(job_id): Path<String>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "jobs");
    let j = c
        .jobs
        .get(&caller, &job_id)
        .await
        .map_err(|e| PageError(e, base.clone()))?;
    let now = now();
    let spec = j.spec.clone().unwrap_or_default();
    let state = crate::http::job_state_name(j.state);
    let p = j.progress.unwrap_or_default();
    let ms = |t: Option<&prost_types::Timestamp>| t.map_or(0, switchyard_kit::time::timestamp_ms);
    let finished =
        crate::http::finished(JobState::try_from(j.state).unwrap_or(JobState::Unspecified));
    let tasks = views::tasks(&j, now);
    // The run's decision: who, when, after how long, and what they wrote.
    let decision = match (&c.services.approval, j.run_id.is_empty()) {
        (Some(approvals), false) if caller.principal.may(Permission::RunRead) => {
            let req = ap::GetRunRequest {
                run_id: j.run_id.clone(),
            };
            as_caller!(ApprovalClient, approvals, caller, get_run, req)
                .ok()
                .and_then(|r| r.run)
                .filter(|r| !r.decided_by.is_empty())
                .map(|r| {
                    let at = ms(r.decided_at.as_ref());
                    let asked = ms(r.created_at.as_ref());
                    json!({
                        "status": views::run_status(r.status),
                        "by": r.decided_by,
                        "comment": r.decision_comment,
                        "at": when(at, now),
                        "waited": (at > 0 && asked > 0).then(|| switchyard_kit::time::human_duration(at.saturating_sub(asked))),
                    })
                })
        }
        _ => None,
    };
    let started = ms(j.started_at.as_ref());
    let ended = ms(j.finished_at.as_ref());
    // The story as the journal tells it when the page loads (the timeline
    // below goes on live).
    let story = c.jobs.explain(&caller, &job_id).await.ok().map(|x| {
        let shares = |v: &[switchyard_proto::executor::v1::CostShare]| {
            v.iter()
                .map(|s| json!({"name": s.name, "cost": money(s.cost_micro_usd), "tokens": s.tokens, "calls": s.calls}))
                .collect::<Vec<_>>()
        };
        json!({
            "lines": x.lines.iter().map(|l| json!({
                "at": switchyard_kit::time::utc(ms(l.time.as_ref())),
                "offset": switchyard_kit::time::human_duration(l.offset_ms),
                "topic": l.topic,
                "task": l.task_id,
                "text": l.text,
            })).collect::<Vec<_>>(),
            "spent": money(x.spent_micro_usd),
            "approved": (x.approved_micro_usd > 0).then(|| money(x.approved_micro_usd)),
            "by_task": shares(&x.by_task),
            "by_agent": shares(&x.by_agent),
            "by_model": shares(&x.by_model),
            "journal": x.journal,
            "verifies": x.journal.starts_with("verifies"),
        })
    });
    Ok(page(
        "job.html",
        base,
        json!({
            "title": format!("Job {}", spec.job_id),
            "job": {
                "id": spec.job_id,
                "plan_id": spec.plan_id,
                "plan_description": spec.plan_description,
                "state": state,
                "tone": views::tone(&state),
                "finished": finished,
                "completed": j.state == JobState::Completed as i32,
                "rerun_of": j.rerun_of,
                "submitted_by": j.submitted_by,
                "correlation_id": spec.correlation_id,
                "run_id": j.run_id,
                "budget_id": j.budget_id,
                "reason": j.reason,
                "error": j.error,
                "percent": p.percent_complete,
                "steps": format!("{}/{}", p.current_step, p.total_steps),
                "cost": money(j.cost_so_far.as_ref().map_or(0, |m| m.micro_usd)),
                "tokens": j.tokens_used,
                "created": when(ms(j.created_at.as_ref()), now),
                "started": when(ms(j.started_at.as_ref()), now),
                "finished_at": when(ms(j.finished_at.as_ref()), now),
                "artifacts": j.artifacts.iter().map(|a| json!({"name": a.name, "id": a.artifact_id, "size": a.size_bytes, "media_type": a.media_type})).collect::<Vec<_>>(),
                "last_sequence": j.last_sequence,
                "pause": j.budget_pause.as_ref().map(|b| json!({
                    "run_id": b.run_id, "dimension": b.dimension, "refused_by": b.refused_by,
                    "tokens": b.tokens, "cost": b.cost.as_ref().map(|m| money(m.micro_usd)),
                    "remaining_tasks": b.remaining_tasks, "decision": b.decision,
                    "decided_by": b.decided_by,
                    "waiting": j.state == JobState::BudgetPaused as i32 && b.decision == "pending",
                })),
            },
            "dag": views::dag(&tasks),
            "waterfall": views::waterfall(&j, &calls_of(&c, &caller, &spec.job_id, j.last_sequence).await, now),
            "decision": decision,
            "duration": switchyard_kit::time::ran_for(started, ended, now),
            "tasks": tasks,
            "inputs": input_cards(&c, &caller, &spec.job_id).await,
            "story": story,
            "events_url": format!("/ui/jobs/{}/events", encode(&spec.job_id)),
        }),
    ))
}

/// `GET /ui/jobs/{job_id}/events`: the job's events as Server-Sent Events
/// for the page's timeline, resumable with `Last-Event-ID`.
pub(crate) async fn job_events(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Path(job_id): Path<String>,
    headers: http::HeaderMap,
) -> Response {
    match crate::http::event_stream(&c.jobs, c.shutdown.clone(), caller, job_id, &headers, false)
        .await
    {
        Ok(r) => r,
        Err(s) => error_page(&s, None),
    }
}

#[derive(Deserialize)]
pub(crate) struct CancelForm {
    #[serde(default)]
    reason: String,
}

/// `POST /ui/jobs/{job_id}/cancel`: cancels as the person.
pub(crate) async fn cancel(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Path(job_id): Path<String>,
    Form(f): Form<CancelForm>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "jobs");
    let reason = if f.reason.trim().is_empty() {
        format!("cancelled in the console by {}", caller.principal.subject)
    } else {
        f.reason.trim().to_owned()
    };
    c.jobs
        .cancel(&caller, &job_id, &reason)
        .await
        .map_err(|e| PageError(e, base))?;
    Ok(see_other(&format!("/ui/jobs/{}", encode(&job_id))))
}

#[derive(Deserialize)]
pub(crate) struct RerunForm {
    /// `resume`: keep the tasks that succeeded; anything else: afresh.
    #[serde(default)]
    mode: String,
}

/// `POST /ui/jobs/{job_id}/rerun`: runs a finished job again as a new job
/// of the person's (afresh, or resumed), and shows it.
pub(crate) async fn rerun(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Path(job_id): Path<String>,
    Form(f): Form<RerunForm>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "jobs");
    let out = c
        .jobs
        .rerun(&caller, &job_id, f.mode == "resume")
        .await
        .map_err(|e| PageError(e, base))?;
    let new = out
        .job
        .and_then(|j| j.spec)
        .map(|s| s.job_id)
        .unwrap_or_default();
    Ok(see_other(&format!("/ui/jobs/{}", encode(&new))))
}

/// Most calls the waterfall draws.
const MAX_CALLS: usize = 500;

/// The model, tool and agent calls of job `id`, for its waterfall: read
/// from its events (as the person) up to `last`, its last sequence, for at
/// most a second; what was read by then when the log is long or slow.
async fn calls_of(c: &Console, caller: &Caller, id: &str, last: u64) -> Vec<views::Call> {
    use futures_util::StreamExt as _;
    let Ok(mut events) = c.jobs.watch(caller, id, 0).await else {
        return Vec::new();
    };
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut out = Vec::new();
    while out.len() < MAX_CALLS {
        let Ok(Some(Ok(w))) = tokio::time::timeout_at(until, events.next()).await else {
            break;
        };
        let Some(e) = w.event else { continue };
        out.extend(views::Call::of(&e));
        if e.sequence >= last {
            break;
        }
    }
    out
}

/// The steps waiting for input that the person may answer (of job
/// `job_id`, or of every job when empty), each with the fields of its
/// answer form: a fresh idempotency key per form shown, so sending the
/// same form twice answers once. Nothing when the person may not answer
/// or the executor cannot say.
async fn input_cards(c: &Console, caller: &Caller, job_id: &str) -> Vec<Value> {
    if !caller.principal.may(Permission::JobAnswer) {
        return Vec::new();
    }
    let Ok(listed) = c.jobs.input_requests(caller, job_id).await else {
        return Vec::new();
    };
    let now = now();
    listed
        .requests
        .iter()
        .map(|r| {
            let schema = r
                .answer_schema
                .as_ref()
                .map(switchyard_kit::json::struct_to_json)
                .and_then(|s| serde_json::to_string_pretty(&s).ok());
            let deadline = r
                .deadline
                .as_ref()
                .map_or(0, switchyard_kit::time::timestamp_ms);
            json!({
                "job_id": r.job_id,
                "task_id": r.task_id,
                "prompt": r.prompt,
                "schema": schema,
                "submitted_by": r.submitted_by,
                "deadline": when(deadline, now),
                "key": oidc::random(16).map(|k| format!("ui-{k}")).unwrap_or_default(),
            })
        })
        .collect()
}

#[derive(Deserialize)]
pub(crate) struct AnswerForm {
    #[serde(default)]
    task_id: String,
    #[serde(default)]
    answer: String,
    #[serde(default)]
    key: String,
}

/// `POST /ui/jobs/{job_id}/input`: SendInput as the person. The answer is
/// JSON, or else taken as text. Back to the inbox, which says what was
/// answered (a person named to answer may not be able to read the job).
pub(crate) async fn answer(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Path(job_id): Path<String>,
    Form(f): Form<AnswerForm>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "inbox");
    let answer =
        (!f.answer.trim().is_empty()).then(|| switchyard_kit::json::json_or_text(&f.answer));
    let req = switchyard_proto::executor::v1::SendInputRequest {
        job_id: job_id.clone(),
        task_id: f.task_id,
        answer: answer.as_ref().map(switchyard_kit::json::json_to_value),
        idempotency_key: f.key,
    };
    let out = c
        .jobs
        .send_input(&caller, req)
        .await
        .map_err(|e| PageError(e, base))?;
    let answered = format!("{job_id}/{}", out.task_id);
    Ok(see_other(&format!("/ui/?answered={}", encode(&answered))))
}

// --- conversations -------------------------------------------------------

/// `GET /ui/jobs/{job_id}/chat`: a conversation — every message with its
/// reply, and a form for the next (with a fresh key, so sending it twice
/// sends once). For the conversation's participants, who need not be able
/// to read the rest of the job. While a reply is being generated the page
/// refreshes itself (no script needed).
pub(crate) async fn chat(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Path(job_id): Path<String>,
    Query(q): Query<ChatQuery>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "jobs");
    let req = switchyard_proto::executor::v1::ListMessagesRequest {
        job_id: job_id.clone(),
        task_id: q.task_id.clone(),
        after_seq: 0,
    };
    let h = c
        .jobs
        .messages(&caller, req)
        .await
        .map_err(|e| PageError(e, base.clone()))?;
    let now = now();
    let ms = |t: Option<&prost_types::Timestamp>| t.map_or(0, switchyard_kit::time::timestamp_ms);
    let turns: Vec<Value> = h
        .turns
        .iter()
        .map(|t| {
            let reply = t.reply.as_ref().map(|r| {
                let outcome = switchyard_proto::executor::v1::ReplyOutcome::try_from(r.outcome)
                    .map(|o| {
                        o.as_str_name()
                            .trim_start_matches("REPLY_OUTCOME_")
                            .to_ascii_lowercase()
                    })
                    .unwrap_or_default();
                json!({
                    "text": r.text,
                    "outcome": outcome,
                    "model": r.model,
                    "tokens": r.usage.as_ref().map_or(0, |u| u.total_tokens),
                    "at": when(ms(r.replied_at.as_ref()), now),
                    "agent": r.agent_id,
                })
            });
            json!({
                "seq": t.seq,
                "text": t.text,
                "by": t.by,
                "close": t.close,
                "at": when(ms(t.sent_at.as_ref()), now),
                "reply": reply,
            })
        })
        .collect();
    let answering = h
        .turns
        .iter()
        .any(|t| t.reply.is_none() && !t.text.is_empty());
    // Who spent what: the orchestrator, then each agent it called or
    // handed the conversation to.
    let spend: Vec<Value> = h
        .agents
        .iter()
        .filter(|a| a.turns > 0 || a.tokens > 0)
        .map(|a| {
            json!({
                "who": if a.agent_id.is_empty() { "orchestrator" } else { a.agent_id.as_str() },
                "turns": a.turns,
                "tokens": a.tokens,
                "cost": views::money(a.cost_micro_usd),
            })
        })
        .collect();
    Ok(page(
        "chat.html",
        base,
        json!({
            "title": format!("Conversation {job_id}"),
            "job_id": job_id,
            "task_id": h.task_id,
            "turns": turns,
            "open": h.open,
            "answering": answering && h.open,
            "active_agent": h.active_agent,
            "spend": spend,
            "key": oidc::random(16).map(|k| format!("ui-{k}")).unwrap_or_default(),
        }),
    ))
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct ChatQuery {
    task_id: String,
}

#[derive(Deserialize)]
pub(crate) struct MessageForm {
    #[serde(default)]
    task_id: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    key: String,
    /// Set by the "End the conversation" button.
    #[serde(default)]
    close: String,
}

/// `POST /ui/jobs/{job_id}/chat`: SendMessage as the person, then back to
/// the conversation.
pub(crate) async fn say(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Path(job_id): Path<String>,
    Form(f): Form<MessageForm>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "jobs");
    let close = !f.close.is_empty();
    let req = switchyard_proto::executor::v1::SendMessageRequest {
        job_id: job_id.clone(),
        task_id: f.task_id.clone(),
        text: if close {
            String::new()
        } else {
            f.text.trim().to_owned()
        },
        close,
        idempotency_key: f.key,
    };
    c.jobs
        .send_message(&caller, req)
        .await
        .map_err(|e| PageError(e, base))?;
    Ok(see_other(&format!(
        "/ui/jobs/{}/chat?task_id={}",
        encode(&job_id),
        encode(&f.task_id)
    )))
}

// --- submit --------------------------------------------------------------

/// `GET /ui/submit`: a form for a job document in any accepted format.
pub(crate) async fn submit_form(
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
) -> Response {
    page(
        "submit.html",
        layout(&caller, &s, "submit"),
        json!({"title": "Submit a job", "document": "", "format": ""}),
    )
}

#[derive(Deserialize)]
pub(crate) struct SubmitForm {
    #[serde(default)]
    document: String,
    #[serde(default)]
    format: String,
}

/// `POST /ui/submit`: SubmitJob as the person, then the job's page; a
/// refused document is shown again with every problem the executor found.
pub(crate) async fn submit(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Form(f): Form<SubmitForm>,
) -> Response {
    let base = layout(&caller, &s, "submit");
    let req = SubmitJobRequest {
        document: f.document.clone(),
        format: f.format.clone(),
        ..Default::default()
    };
    match c.jobs.submit(&caller, req).await {
        Ok(r) => {
            let id = r
                .job
                .as_ref()
                .map(|j| crate::http::job_id(j).to_owned())
                .unwrap_or_default();
            see_other(&format!("/ui/jobs/{}", encode(&id)))
        }
        Err(e) => {
            let (code, body) = switchyard_kit::error::http_error(&e, "");
            let mut resp = page(
                "submit.html",
                base,
                json!({"title": "Submit a job", "document": f.document, "format": f.format, "error": body["error"]}),
            );
            *resp.status_mut() = code;
            resp
        }
    }
}

// --- budgets -------------------------------------------------------------

#[derive(Deserialize)]
pub(crate) struct BudgetsQuery {
    budget: Option<String>,
    /// The report's start: an age (`7d`), a date or a UTC time.
    since: Option<String>,
    /// What the report sums by (`project`, `person`, ...).
    by: Option<String>,
}

/// The report's range choices (the form's), the first the default.
const RANGES: [(&str, &str); 4] = [
    ("7d", "7 days"),
    ("24h", "24 hours"),
    ("1h", "1 hour"),
    ("30d", "30 days"),
];

/// What the report may sum by, as the form names it.
const GROUPINGS: [(&str, lg::GroupBy); 6] = [
    ("project", lg::GroupBy::Project),
    ("person", lg::GroupBy::Person),
    ("agent", lg::GroupBy::Agent),
    ("model", lg::GroupBy::Model),
    ("capability", lg::GroupBy::Capability),
    ("job", lg::GroupBy::Job),
];

/// The most budgets the tree shows (pages of 200).
const MAX_BUDGETS: usize = 1000;

/// `GET /ui/budgets`: the budget tree (tenant → project → job) with limits,
/// reserved, spent and remaining; with `?budget=ID`, that budget's ledger
/// entries and its spend over time.
pub(crate) async fn budgets(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Query(q): Query<BudgetsQuery>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "budgets");
    let fail = |e: Status| PageError(e, base.clone());
    let ledger = reach(&c.services.ledger, "ledger").map_err(fail)?;
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let req = lg::ListBudgetsRequest {
            page_size: 200,
            page_token: token.clone(),
            ..Default::default()
        };
        let r = as_caller!(LedgerClient, ledger, caller, list_budgets, req).map_err(fail)?;
        all.extend(r.budgets);
        if r.next_page_token.is_empty() || all.len() >= MAX_BUDGETS {
            break;
        }
        token = r.next_page_token;
    }
    let now = now();
    let since = q
        .since
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(RANGES[0].0);
    let since_ms = switchyard_kit::time::parse_instant(since, now)
        .map_err(|why| fail(invalid("since", &why)))?;
    let by =
        q.by.as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or("project");
    let Some((_, group_by)) = GROUPINGS.iter().find(|(name, _)| *name == by) else {
        let names: Vec<&str> = GROUPINGS.iter().map(|(n, _)| *n).collect();
        return Err(fail(invalid(
            "by",
            &format!("sum by one of {}; got {by:?}", names.join(", ")),
        )));
    };
    let scope = q
        .budget
        .clone()
        .filter(|b| !b.is_empty())
        .unwrap_or_default();
    let req = lg::ReportRequest {
        budget_id: scope.clone(),
        since: Some(switchyard_kit::time::timestamp(since_ms)),
        group_by: *group_by as i32,
        ..Default::default()
    };
    let report = as_caller!(LedgerClient, ledger, caller, report, req).map_err(fail)?;
    let mut selected = Value::Null;
    if let Some(id) = q.budget.as_deref().filter(|b| !b.is_empty()) {
        let req = lg::ListEntriesRequest {
            budget_id: id.to_owned(),
            page_size: 500,
            ..Default::default()
        };
        let r = as_caller!(LedgerClient, ledger, caller, list_entries, req).map_err(fail)?;
        let budget = r.budget.as_ref().map_or(Value::Null, views::budget);
        selected = json!({
            "id": id,
            "budget": budget,
            "entries": r.entries.iter().map(|e| views::entry(e, now)).collect::<Vec<_>>(),
            "total_cost": money(r.total_cost.as_ref().map_or(0, |m| m.micro_usd)),
            "total_tokens": r.total_tokens,
            "more": !r.next_page_token.is_empty(),
        });
    }
    Ok(page(
        "budgets.html",
        base,
        json!({
            "title": "Budgets",
            "live": "budgets",
            "tree": views::tree(&all),
            "truncated": all.len() >= MAX_BUDGETS,
            "selected": selected,
            "report": views::report(&report, now),
            "query": {"budget": scope, "since": since, "by": by},
            "ranges": RANGES.iter().map(|(v, l)| json!({"value": v, "label": l})).collect::<Vec<_>>(),
            "groupings": GROUPINGS.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        }),
    ))
}

// --- agents --------------------------------------------------------------

#[derive(Deserialize)]
pub(crate) struct AgentsQuery {
    capability: Option<String>,
}

/// `GET /ui/agents`: the registry's agents and tools; with `?capability=`,
/// the router's ranked candidates for it with each factor of their score.
pub(crate) async fn agents(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Query(q): Query<AgentsQuery>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "agents");
    let fail = |e: Status| PageError(e, base.clone());
    let registry = reach(&c.services.registry, "registry").map_err(fail)?;
    let req = rg::ListAgentsRequest {
        page_size: 200,
        ..Default::default()
    };
    let listed = as_caller!(RegistryClient, registry, caller, list_agents, req).map_err(fail)?;
    let tools = as_caller!(
        RegistryClient,
        registry,
        caller,
        list_tools,
        rg::ListToolsRequest::default()
    )
    .map_err(fail)?
    .tools;
    let now = now();
    let agents: Vec<Value> = listed.agents.iter().map(|a| agent(a, now)).collect();
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "mcp_server": t.mcp_server,
                "owner": t.owner,
                "requires_approval": t.requires_approval,
            })
        })
        .collect();
    let capability = q
        .capability
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty());
    let mut route = Value::Null;
    if let Some(cap) = capability {
        if !caller.principal.may(Permission::Route) {
            route = json!({"problem": "your roles do not grant `route`, so the router's ranking is not shown"});
        } else {
            let router = reach(&c.services.router, "router").map_err(fail)?;
            let req = rt::RouteRequest {
                capability: cap.to_owned(),
                limit: 10,
                ..Default::default()
            };
            route = match as_caller!(RouterClient, router, caller, route, req) {
                Ok(r) => json!({
                    "candidates": r.candidates.iter().enumerate().map(|(i, c)| {
                        let b = c.breakdown.clone().unwrap_or_default();
                        json!({
                            "rank": i + 1,
                            "agent": c.agent_id,
                            "score": format!("{:.3}", c.score),
                            "capability_match": format!("{:.2}", b.capability_match),
                            "trust": format!("{:.2}", b.trust),
                            "latency": format!("{:.2}", b.latency),
                            "latency_ms": format!("{:.0}", b.latency_ms),
                            "latency_observed": b.latency_observed,
                            "cost": format!("{:.2}", b.cost),
                            "preference": format!("{:.2}", b.preference),
                            "matched": b.matched_capability,
                            "price": money(c.price_per_unit_micro_usd),
                            "unit": c.unit,
                            "trust_score": c.trust_score,
                        })
                    }).collect::<Vec<_>>(),
                    "filtered": r.filtered.iter().collect::<BTreeMap<_, _>>(),
                }),
                Err(e) => json!({"problem": e.message()}),
            };
        }
    }
    Ok(page(
        "agents.html",
        base,
        json!({
            "title": "Agents and tools",
            "live": "agents",
            "agents": agents,
            "tools": tools,
            "capability": capability,
            "route": route,
        }),
    ))
}

/// An agent as the registry page shows it.
fn agent(a: &rg::Agent, now: u64) -> Value {
    let spec = a.spec.clone().unwrap_or_default();
    let status = rg::AgentStatus::try_from(a.status)
        .unwrap_or(rg::AgentStatus::Unspecified)
        .as_str_name()
        .trim_start_matches("AGENT_STATUS_")
        .to_ascii_lowercase();
    let stats: BTreeMap<&str, &rg::CapabilityStats> =
        a.stats.iter().map(|s| (s.capability.as_str(), s)).collect();
    json!({
        "id": spec.id,
        "name": spec.name,
        "status": status,
        "tone": if status == "available" { "ok" } else { "bad" },
        "trust": spec.trust_score,
        "in_flight": a.in_flight,
        "max_concurrency": spec.max_concurrency,
        "endpoint": spec.endpoint,
        "lease": when(a.lease_expires_at.as_ref().map_or(0, switchyard_kit::time::timestamp_ms), now),
        "capabilities": spec.capabilities.iter().map(|c| {
            let st = stats.get(c.name.as_str());
            json!({
                "name": c.name,
                "price": money(c.price_per_unit_micro_usd),
                "unit": c.unit,
                "latency_ms": st.map(|s| format!("{:.0}", s.ewma_latency_ms)),
                "success_rate": st.filter(|s| s.count > 0).map(|s| format!("{:.0}%", s.success_rate * 100.0)),
                "calls": st.map_or(0, |s| s.count),
            })
        }).collect::<Vec<_>>(),
        "latency_estimate_ms": spec.latency_estimate_ms,
    })
}

/// `GET /ui/schedules`: the schedules the person may see, with their next
/// fire times and recent ticks (each started job linked).
pub(crate) async fn schedules(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "schedules");
    let fail = |e: Status| PageError(e, base.clone());
    let client = reach(&c.services.schedules, "executor").map_err(fail)?;
    let req = switchyard_proto::executor::v1::ListSchedulesRequest {};
    let listed = as_caller!(ScheduleClient, client, caller, list_schedules, req).map_err(fail)?;
    let now = now();
    let schedules: Vec<Value> = listed
        .schedules
        .iter()
        .map(|s| views::schedule(s, now))
        .collect();
    Ok(page(
        "schedules.html",
        base,
        json!({"title": "Schedules", "schedules": schedules}),
    ))
}

#[derive(Deserialize)]
pub(crate) struct PauseForm {
    /// Why (pause only).
    #[serde(default)]
    note: String,
}

/// `POST /ui/schedules/{schedule_id}/{pause|resume}`: pauses or resumes a
/// schedule as the person, and shows the list again.
pub(crate) async fn pause_schedule(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Path((schedule_id, action)): Path<(String, String)>,
    Form(f): Form<PauseForm>,
) -> Result<Response, PageError> {
    use switchyard_proto::executor::v1::{PauseScheduleRequest, ResumeScheduleRequest};
    let base = layout(&caller, &s, "schedules");
    let fail = |e: Status| PageError(e, base.clone());
    let client = reach(&c.services.schedules, "executor").map_err(fail)?;
    match action.as_str() {
        "pause" => {
            let note = if f.note.trim().is_empty() {
                format!("paused in the console by {}", caller.principal.subject)
            } else {
                f.note.trim().to_owned()
            };
            let req = PauseScheduleRequest {
                schedule_id: schedule_id.clone(),
                note,
            };
            as_caller!(ScheduleClient, client, caller, pause_schedule, req).map_err(fail)?;
        }
        "resume" => {
            let req = ResumeScheduleRequest {
                schedule_id: schedule_id.clone(),
            };
            as_caller!(ScheduleClient, client, caller, resume_schedule, req).map_err(fail)?;
        }
        other => {
            return Err(fail(invalid(
                "action",
                &format!("a schedule is paused or resumed; got {other:?}"),
            )));
        }
    }
    Ok(see_other(&format!(
        "/ui/schedules#schedule-{}",
        encode(&schedule_id)
    )))
}

/// `GET /ui/limits`: the provider rate-limit buckets in use, and who waits
/// on them (other tenants' calls counted, not named).
pub(crate) async fn limits(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "limits");
    let fail = |e: Status| PageError(e, base.clone());
    let client = reach(&c.services.ledger, "ledger").map_err(fail)?;
    let req = switchyard_proto::ledger::v1::ListLimitsRequest::default();
    let listed = as_caller!(LedgerClient, client, caller, list_limits, req).map_err(fail)?;
    let now = now();
    let buckets: Vec<Value> = listed
        .buckets
        .iter()
        .map(|b| views::limit_bucket(b, now))
        .collect();
    Ok(page(
        "limits.html",
        base,
        json!({"title": "Rate limits", "buckets": buckets}),
    ))
}

#[derive(Deserialize)]
pub(crate) struct NotificationsQuery {
    /// The delivery just sent again, to say so.
    #[serde(default)]
    retried: String,
}

/// `GET /ui/notifications`: webhook deliveries waiting to be sent again
/// and dead-lettered ones, of the person's tenant.
pub(crate) async fn notifications(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Query(q): Query<NotificationsQuery>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "notifications");
    let fail = |e: Status| PageError(e, base.clone());
    let client = reach(&c.services.notifications, "executor").map_err(fail)?;
    let req = switchyard_proto::executor::v1::ListDeliveriesRequest { dead_only: false };
    let listed =
        as_caller!(NotificationClient, client, caller, list_deliveries, req).map_err(fail)?;
    let now = now();
    let deliveries: Vec<Value> = listed
        .deliveries
        .iter()
        .map(|d| views::delivery(d, now))
        .collect();
    Ok(page(
        "notifications.html",
        base,
        json!({"title": "Notifications", "deliveries": deliveries, "retried": q.retried}),
    ))
}

#[derive(Deserialize)]
pub(crate) struct RetryNotificationForm {
    /// The dead-lettered delivery.
    #[serde(default)]
    delivery_id: String,
}

/// `POST /ui/notifications/retry`: sends a dead-lettered delivery again as
/// the person.
pub(crate) async fn retry_notification(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Extension(s): Extension<Session>,
    Form(f): Form<RetryNotificationForm>,
) -> Result<Response, PageError> {
    let base = layout(&caller, &s, "notifications");
    let fail = |e: Status| PageError(e, base.clone());
    let client = reach(&c.services.notifications, "executor").map_err(fail)?;
    let req = switchyard_proto::executor::v1::RetryDeliveryRequest {
        delivery_id: f.delivery_id.clone(),
    };
    as_caller!(NotificationClient, client, caller, retry_delivery, req).map_err(fail)?;
    Ok(see_other(&format!(
        "/ui/notifications?retried={}",
        encode(&f.delivery_id)
    )))
}
