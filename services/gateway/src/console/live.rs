//! `GET /ui/live?page=…`: what keeps the console's lists live. A
//! Server-Sent Events stream, per open page, that says
//!
//! - `inbox` `{"count": N}`: how many decisions and answers wait in the
//!   person's inbox (the nav badge and the page title), at once and on
//!   every change;
//! - `changed` `{"page": "jobs"}`: what the page lists changed (jobs,
//!   budgets, agents, inbox); the page fetches itself and merges the
//!   changed parts in place, leaving alone what the person is typing.
//!
//! It asks the services as the person, once a second, and sends only what
//! changed: a person learns nothing here the page itself would not show.
//! A stream lasts at most [`LIFETIME`]; the browser reconnects.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use serde::Deserialize;
use serde_json::json;
use switchyard_api::{ApprovalClient, LedgerClient, RegistryClient};
use switchyard_kit::auth::Permission;
use switchyard_proto::approval::v1 as ap;
use switchyard_proto::executor::v1::ListJobsRequest;
use switchyard_proto::ledger::v1 as lg;
use switchyard_proto::registry::v1 as rg;

use super::Console;
use super::pages::{Query, Shared};
use crate::caller::{Caller, as_caller};

/// The pages that listen for changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConsolePage {
    Inbox,
    Jobs,
    Budgets,
    Agents,
    /// Any other: the badge only.
    Other,
}

impl ConsolePage {
    fn parse(s: &str) -> ConsolePage {
        match s {
            "inbox" => ConsolePage::Inbox,
            "jobs" => ConsolePage::Jobs,
            "budgets" => ConsolePage::Budgets,
            "agents" => ConsolePage::Agents,
            _ => ConsolePage::Other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ConsolePage::Inbox => "inbox",
            ConsolePage::Jobs => "jobs",
            ConsolePage::Budgets => "budgets",
            ConsolePage::Agents => "agents",
            ConsolePage::Other => "other",
        }
    }
}

/// How often the services are asked.
const PERIOD: Duration = Duration::from_secs(1);
/// How long one stream lasts before the browser reconnects.
const LIFETIME: Duration = Duration::from_secs(600);
/// The most runs counted (more reads as "500+").
pub(crate) const MAX_COUNTED: u32 = 500;

#[derive(Deserialize)]
pub(crate) struct LiveQuery {
    /// The page that listens: `inbox`, `jobs`, `budgets`, `agents`, or
    /// any other (the badge only).
    #[serde(default)]
    page: String,
}

/// What the stream remembers between polls.
struct Seen {
    count: Option<String>,
    page: Option<u64>,
}

/// The stream (see the module's comment).
pub(crate) async fn live(
    State(c): Shared,
    Extension(caller): Extension<Caller>,
    Query(q): Query<LiveQuery>,
) -> Response {
    let page = ConsolePage::parse(&q.page);
    let shutdown = c.shutdown.clone();
    let seen = Seen {
        count: None,
        page: None,
    };
    let stream = futures_util::stream::unfold(
        (c, caller, seen, true),
        move |(c, caller, mut seen, first)| async move {
            if !first {
                tokio::time::sleep(PERIOD).await;
            }
            let mut events = Vec::new();
            // One read of the inbox a poll: the badge, and the inbox
            // page's list when that is the page listening.
            let inbox = inbox(&c, &caller).await;
            if let Some(count) = inbox.as_ref().map(|i| i.count.clone())
                && seen.count.as_deref() != Some(count.as_str())
            {
                events.push(
                    Event::default()
                        .event("inbox")
                        .json_data(json!({"count": count})),
                );
                seen.count = Some(count);
            }
            let print = match page {
                ConsolePage::Inbox => inbox.map(|i| i.print),
                _ => fingerprint(&c, &caller, page).await,
            };
            if let Some(print) = print {
                if seen.page.is_some_and(|p| p != print) {
                    events.push(
                        Event::default()
                            .event("changed")
                            .json_data(json!({"page": page.name()})),
                    );
                }
                seen.page = Some(print);
            }
            Some((futures_util::stream::iter(events), (c, caller, seen, false)))
        },
    )
    .flatten()
    .take_until(async move {
        tokio::select! {
            () = shutdown.wait() => {}
            () = tokio::time::sleep(LIFETIME) => {}
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// What waits in the person's inbox.
struct Inbox {
    /// How many decisions and answers, as the badge shows it.
    count: String,
    /// A hash of which runs (and who approved them so far) and steps.
    print: u64,
}

/// The badge's words for `n` waiting (`"3"`), `more` when there are more
/// than were counted (`"500+"`).
pub(crate) fn badge(n: usize, more: bool) -> String {
    if more { format!("{n}+") } else { n.to_string() }
}

/// The person's inbox: the runs waiting for a decision (the first
/// [`MAX_COUNTED`]) and the steps waiting for their answer; `None` when
/// they have no inbox or it cannot be read now.
async fn inbox(c: &Console, caller: &Caller) -> Option<Inbox> {
    if !caller.principal.may(Permission::RunRead) {
        return None;
    }
    let approvals = c.services.approval.as_ref()?;
    let req = ap::ListRunsRequest {
        statuses: vec![ap::RunStatus::Proposed as i32],
        page_size: MAX_COUNTED,
        ..Default::default()
    };
    let listed = as_caller!(ApprovalClient, approvals, caller, list_runs, req).ok()?;
    let inputs = if caller.principal.may(Permission::JobAnswer) {
        c.jobs
            .input_requests(caller, "")
            .await
            .map_or_else(|_| Vec::new(), |r| r.requests)
    } else {
        Vec::new()
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for r in &listed.runs {
        (&r.run_id, &r.approved_by).hash(&mut h);
    }
    for r in &inputs {
        (&r.job_id, &r.task_id).hash(&mut h);
    }
    Some(Inbox {
        count: badge(
            listed.runs.len() + inputs.len(),
            !listed.next_page_token.is_empty(),
        ),
        print: h.finish(),
    })
}

/// A hash of what `page` lists, as the person sees it; `None` for a page
/// with no list (the inbox's comes with its count), or when it cannot be
/// read now.
async fn fingerprint(c: &Console, caller: &Caller, page: ConsolePage) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    match page {
        ConsolePage::Jobs => {
            let req = ListJobsRequest {
                page_size: 50,
                ..Default::default()
            };
            let listed = c.jobs.list(caller, req).await.ok()?;
            for j in &listed.jobs {
                let p = j.progress.unwrap_or_default();
                (
                    j.spec.as_ref().map(|s| s.job_id.as_str()),
                    j.state,
                    p.current_step,
                    j.cost_so_far.map(|m| m.micro_usd),
                    j.tokens_used,
                )
                    .hash(&mut h);
            }
        }
        ConsolePage::Budgets => {
            let ledger = c.services.ledger.as_ref()?;
            let req = lg::ListBudgetsRequest {
                page_size: 200,
                ..Default::default()
            };
            let listed = as_caller!(LedgerClient, ledger, caller, list_budgets, req).ok()?;
            for b in &listed.budgets {
                (
                    &b.budget_id,
                    b.tokens_spent,
                    b.tokens_reserved,
                    b.cost_spent.map(|m| m.micro_usd),
                    b.cost_reserved.map(|m| m.micro_usd),
                    b.cost_limit.map(|m| m.micro_usd),
                    b.token_limit,
                    b.closed,
                )
                    .hash(&mut h);
            }
        }
        ConsolePage::Agents => {
            let registry = c.services.registry.as_ref()?;
            let req = rg::ListAgentsRequest {
                page_size: 200,
                ..Default::default()
            };
            let listed = as_caller!(RegistryClient, registry, caller, list_agents, req).ok()?;
            // Not the lease: it moves with every heartbeat.
            for a in &listed.agents {
                let id = a.spec.as_ref().map(|s| (s.id.as_str(), s.trust_score));
                (id, a.status, a.in_flight, a.stats.len()).hash(&mut h);
            }
        }
        ConsolePage::Inbox | ConsolePage::Other => return None,
    }
    Some(h.finish())
}
