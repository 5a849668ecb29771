//! Notifications out (issue 47): signed CloudEvents webhooks for
//! "approval needed", "job completed / failed / cancelled" and "budget at
//! 80% / 100%".
//!
//! What happened is seen where it is recorded ([`Notifier::observe`], from
//! the one place job events are recorded, and [`Notifier::approval_needed`]
//! from admission) and kept as one *delivery* per matching webhook in the
//! `notifications` space, durable with the job's events. The maintaining
//! replica posts each ([`Executor::deliver_notifications`]): the CloudEvent
//! as JSON, signed (`X-Switchyard-Signature`, [`switchyard_kit::webhook`]);
//! a 2xx answer ends it, anything else is tried again after a doubling
//! wait until `max_attempts`, then it is dead-lettered (ListDeliveries,
//! RetryDelivery). At least once: an event's id is stable across repeats.
//!
//! Payloads are built here only, from ids, states and amounts: never a
//! job's input or outputs, a prompt, an error text from a model, or a
//! secret.

use std::time::Duration;

use serde_json::{Value, json};
use switchyard_core::lifecycle::JobState;
use switchyard_kit::time::{timestamp, timestamp_ms};
use switchyard_proto::executor::v1::{Delivery, RetryDeliveryRequest};

use crate::Executor;
use crate::config::NotificationsConfig;
use crate::error::ExecutorError;
use crate::events::JobEvent;
use crate::job::JobEntry;
use crate::store::{Kept, Space};

/// Where events come from, in CloudEvents' `source`.
const SOURCE: &str = "switchyard/executor";
/// The prefix of every event type.
const TYPE_PREFIX: &str = "dev.switchyard.";
/// How many deliveries one round posts at most.
const ROUND: usize = 64;
/// How long an error text kept on a delivery may be.
const MAX_ERROR: usize = 300;

/// One configured webhook, its secret read.
struct Hook {
    name: String,
    url: String,
    secret: Vec<u8>,
    events: Vec<String>,
    tenant: String,
}

/// What happened, to tell the webhooks that want it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Notice {
    /// `job.failed`, ...
    pub(crate) kind: &'static str,
    /// Stable across repeats of the same happening.
    pub(crate) id: String,
    pub(crate) tenant: String,
    /// The job.
    pub(crate) subject: String,
    pub(crate) data: Value,
}

/// The webhooks and their deliveries.
pub(crate) struct Notifier {
    hooks: Vec<Hook>,
    deliveries: Kept<Delivery>,
    cfg: NotificationsConfig,
    http: reqwest::Client,
    wake: tokio::sync::Notify,
}

impl Notifier {
    /// The webhooks of `cfg` (their secrets read now), with deliveries kept
    /// in `space`.
    pub(crate) fn open(cfg: &NotificationsConfig, space: Space) -> Result<Notifier, ExecutorError> {
        let mut hooks = Vec::new();
        for w in &cfg.webhooks {
            let secret = std::fs::read(&w.secret_file).map_err(|e| {
                ExecutorError::Audit(format!(
                    "executor.notifications.webhooks {:?}: secret_file {}: {e}",
                    w.name,
                    w.secret_file.display()
                ))
            })?;
            let secret = secret.trim_ascii().to_vec();
            if secret.len() < 16 {
                return Err(ExecutorError::Audit(format!(
                    "executor.notifications.webhooks {:?}: the secret in {} is shorter than 16 bytes; write a long random one (openssl rand -hex 32)",
                    w.name,
                    w.secret_file.display()
                )));
            }
            hooks.push(Hook {
                name: w.name.clone(),
                url: w.url.clone(),
                secret,
                events: w.events.clone(),
                tenant: w.tenant.clone(),
            });
        }
        switchyard_kit::tls::install_crypto();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(cfg.timeout_ms))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ExecutorError::Audit(format!("the webhook client: {e}")))?;
        Ok(Notifier {
            hooks,
            deliveries: Kept::open(space)?,
            cfg: cfg.clone(),
            http,
            wake: tokio::sync::Notify::new(),
        })
    }

    /// Whether any webhook is configured.
    pub(crate) fn active(&self) -> bool {
        !self.hooks.is_empty()
    }

    /// Keeps a delivery of `n` for each webhook that wants it.
    pub(crate) fn tell(&self, n: &Notice, now_ms: u64) {
        for h in &self.hooks {
            let wants = h.events.is_empty() || h.events.iter().any(|e| e == n.kind);
            if !wants || !(h.tenant.is_empty() || h.tenant == n.tenant) {
                continue;
            }
            let body = json!({
                "specversion": "1.0",
                "id": n.id,
                "source": SOURCE,
                "type": format!("{TYPE_PREFIX}{}", n.kind),
                "subject": n.subject,
                "time": switchyard_kit::time::utc(now_ms),
                "datacontenttype": "application/json",
                "data": n.data,
            });
            let d = Delivery {
                delivery_id: format!("{}/{}", h.name, n.id),
                webhook: h.name.clone(),
                event_type: format!("{TYPE_PREFIX}{}", n.kind),
                event_id: n.id.clone(),
                tenant: n.tenant.clone(),
                subject: n.subject.clone(),
                dead: false,
                attempts: 0,
                next_attempt_at: Some(timestamp(now_ms)),
                last_error: String::new(),
                created_at: Some(timestamp(now_ms)),
                body: body.to_string(),
            };
            if let Err(e) = self.deliveries.put(&d.delivery_id, &d) {
                tracing::error!(delivery = %d.delivery_id, error = %e, "keeping a notification");
            }
        }
        self.wake.notify_one();
    }

    /// What job event `ev` (just applied to `e`, whose spend was
    /// `spent_before`) has to tell, if anything.
    pub(crate) fn observe(&self, e: &JobEntry, ev: &JobEvent, spent_before: i64, now_ms: u64) {
        if !self.active() {
            return;
        }
        for n in notices(e, ev, spent_before) {
            self.tell(&n, now_ms);
        }
    }

    /// Job `e` waits for a person to approve run `run_id`.
    pub(crate) fn approval_needed(
        &self,
        e: &JobEntry,
        run_id: &str,
        estimate: Option<i64>,
        now_ms: u64,
    ) {
        if !self.active() {
            return;
        }
        let spec = e.spec();
        let n = Notice {
            kind: "approval.needed",
            id: format!("{}/approval/{run_id}", spec.job_id),
            tenant: e.job.tenant.clone(),
            subject: spec.job_id.clone(),
            data: json!({
                "job_id": spec.job_id,
                "plan_id": spec.plan_id,
                "run_id": run_id,
                "submitted_by": e.job.submitted_by,
                "tenant": e.job.tenant,
                "estimated_cost_micro_usd": estimate,
                "correlation_id": spec.correlation_id,
            }),
        };
        self.tell(&n, now_ms);
    }

    /// The wait before attempt `attempts + 1`: the retry policies'
    /// exponential backoff from `retry_base_ms`, doubling, capped at
    /// `retry_max_ms`.
    fn backoff(&self, attempts: u32) -> u64 {
        let b = switchyard_core::backoff::Backoff {
            strategy: switchyard_core::backoff::Strategy::Exponential,
            base: Duration::from_millis(self.cfg.retry_base_ms),
            max: Duration::from_millis(self.cfg.retry_max_ms.max(self.cfg.retry_base_ms)),
            jitter: 0.0,
            coefficient: 2.0,
        };
        b.delay(attempts, 0.0).as_millis() as u64
    }

    /// Posts `d` once; the error text when it was not accepted.
    async fn post(&self, d: &Delivery) -> Result<(), String> {
        let Some(h) = self.hooks.iter().find(|h| h.name == d.webhook) else {
            return Err(format!(
                "no webhook is named {:?} any more (executor.notifications.webhooks)",
                d.webhook
            ));
        };
        let now_secs = switchyard_kit::time::now_ms() / 1000;
        let signature = switchyard_kit::webhook::sign(&h.secret, now_secs, d.body.as_bytes());
        let sent = self
            .http
            .post(&h.url)
            .header("content-type", "application/cloudevents+json")
            .header(switchyard_kit::webhook::SIGNATURE_HEADER, signature)
            .header("x-switchyard-webhook", &h.name)
            .body(d.body.clone())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("the webhook answered HTTP {}", r.status().as_u16())),
            Err(e) => Err(format!(
                "the webhook could not be reached: {}",
                without_url(&e)
            )),
        }
    }
}

/// A reqwest error's text without its URL (a webhook URL may carry a
/// token in its path or query).
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    kind.to_owned()
}

/// The notices job event `ev` gives, `e` being the job after it.
pub(crate) fn notices(e: &JobEntry, ev: &JobEvent, spent_before: i64) -> Vec<Notice> {
    let spec = e.spec();
    let job_id = spec.job_id.as_str();
    let round = e.job.round;
    let mut out = Vec::new();
    let base = |kind: &'static str, id: String, data: Value| Notice {
        kind,
        id,
        tenant: e.job.tenant.clone(),
        subject: job_id.to_owned(),
        data,
    };
    if let JobEvent::JobMoved(m) = ev {
        let state = e.state();
        let kind = match state {
            JobState::Completed => Some("job.completed"),
            JobState::Cancelled => Some("job.cancelled"),
            JobState::Discarded | JobState::Retryable => Some("job.failed"),
            _ => None,
        };
        if let Some(kind) = kind
            && state.is_terminal()
        {
            let cost = e.job.cost_so_far.map_or(0, |c| c.micro_usd);
            out.push(base(
                kind,
                format!("{job_id}/{}/r{round}", state.as_str()),
                json!({
                    "job_id": job_id,
                    "plan_id": spec.plan_id,
                    "state": state.as_str(),
                    "reason": m.reason,
                    "submitted_by": e.job.submitted_by,
                    "tenant": e.job.tenant,
                    "cost_micro_usd": cost,
                    "tokens_used": e.job.tokens_used,
                    "run_id": e.job.run_id,
                    "round": round,
                    "correlation_id": spec.correlation_id,
                }),
            ));
        }
    }
    let limit = spec
        .budget
        .as_ref()
        .and_then(|b| b.cost_limit)
        .map_or(0, |m| m.micro_usd);
    let spent = e.job.cost_so_far.map_or(0, |c| c.micro_usd);
    if limit > 0 && spent > spent_before {
        for percent in [80i64, 100] {
            let at = limit.saturating_mul(percent) / 100;
            if spent_before < at && spent >= at {
                out.push(base(
                    "budget.threshold",
                    format!("{job_id}/budget-{percent}/r{round}"),
                    json!({
                        "job_id": job_id,
                        "budget_id": e.job.budget_id,
                        "percent": percent,
                        "spent_micro_usd": spent,
                        "limit_micro_usd": limit,
                        "submitted_by": e.job.submitted_by,
                        "tenant": e.job.tenant,
                        "correlation_id": spec.correlation_id,
                    }),
                ));
            }
        }
    }
    out
}

impl Executor {
    /// One round of webhook deliveries: each due one posted once.
    pub(crate) async fn deliver_notifications(&self) -> Result<(), ExecutorError> {
        let n = &self.inner.book.notifier;
        if !n.active() || !self.maintains().await {
            return Ok(());
        }
        let now = self.inner.book.now();
        let mut due: Vec<Delivery> = n
            .deliveries
            .list()
            .await?
            .into_iter()
            .map(|(_, d)| d)
            .filter(|d| !d.dead && d.next_attempt_at.as_ref().map_or(0, timestamp_ms) <= now)
            .collect();
        due.sort_by_key(|d| d.created_at.as_ref().map_or(0, timestamp_ms));
        due.truncate(ROUND);
        let posted = futures_util::future::join_all(due.iter().map(|d| n.post(d))).await;
        for (mut d, result) in due.into_iter().zip(posted) {
            d.attempts += 1;
            match result {
                Ok(()) => {
                    n.deliveries.remove(&d.delivery_id)?;
                    tracing::info!(delivery = %d.delivery_id, attempts = d.attempts, "notification delivered");
                }
                Err(why) => {
                    d.last_error = why.chars().take(MAX_ERROR).collect();
                    if d.attempts >= n.cfg.max_attempts {
                        d.dead = true;
                        d.next_attempt_at = None;
                        tracing::warn!(delivery = %d.delivery_id, attempts = d.attempts, error = %d.last_error, "notification dead-lettered");
                    } else {
                        d.next_attempt_at = Some(timestamp(now + n.backoff(d.attempts)));
                    }
                    n.deliveries.put(&d.delivery_id, &d)?;
                }
            }
        }
        Ok(())
    }

    /// Waits for a delivery to be kept, or `every`.
    pub(crate) async fn notification_wake(&self, every: Duration) {
        let _ = tokio::time::timeout(every, self.inner.book.notifier.wake.notified()).await;
    }

    /// ListDeliveries for principal `p`.
    pub(crate) async fn list_deliveries(
        &self,
        p: &switchyard_kit::auth::Principal,
        dead_only: bool,
    ) -> Result<Vec<Delivery>, ExecutorError> {
        let mut out: Vec<Delivery> = self
            .inner
            .book
            .notifier
            .deliveries
            .list()
            .await?
            .into_iter()
            .map(|(_, d)| d)
            .filter(|d| p.sees_tenant(&d.tenant) && (d.dead || !dead_only))
            .collect();
        out.sort_by_key(|d| d.created_at.as_ref().map_or(0, timestamp_ms));
        Ok(out)
    }

    /// RetryDelivery for principal `p`.
    pub(crate) async fn retry_delivery(
        &self,
        p: &switchyard_kit::auth::Principal,
        req: RetryDeliveryRequest,
    ) -> Result<Delivery, ExecutorError> {
        let n = &self.inner.book.notifier;
        let id = req.delivery_id;
        let mut d = match n.deliveries.get(&id).await? {
            Some(d) if p.sees_tenant(&d.tenant) => d,
            _ => {
                return Err(ExecutorError::ObjectNotFound(
                    crate::error::Object::Delivery,
                    id,
                ));
            }
        };
        if d.dead {
            d.dead = false;
            d.attempts = 0;
            d.next_attempt_at = Some(timestamp(self.inner.book.now()));
            n.deliveries.put(&id, &d)?;
            n.deliveries.sync().await?;
            n.wake.notify_one();
        }
        Ok(d)
    }
}
