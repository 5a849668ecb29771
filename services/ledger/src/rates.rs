//! Provider rate limits as ledger buckets.
//!
//! An operator declares limits (`[[ledger.limits]]`): requests and tokens
//! per window (a minute unless `window_ms` says otherwise), tokens per day
//! and calls in flight, for a provider, a model, an upstream API key, or
//! any of them, shared or split per tenant, project or person. A model
//! call's Reserve names what it will use upstream (a [`Claim`]); it is
//! granted one request and its worst-case tokens in every bucket that
//! applies, in the same atomic step as its money, or it is told how long
//! to wait ([`Wait`]) and nothing is taken. Its Commit or Release says
//! what the call used upstream (a failed call: nothing) and the rest comes
//! back; the request stays counted (it was made, or may have been). A
//! later call of the same chain (a fallback, a second round) takes room of
//! its own with a Reserve of no money.
//!
//! **Windows.** Each window is cut into [`SLOTS`] slots; a grant counts in
//! the slot it was made in until that slot is [`SLOTS`] + 1 slots old. So a
//! grant counts for at least one whole window: in *any* sliding window, no
//! more than the limit is ever granted. It counts for at most a window and
//! one slot, so a saturated bucket still grants at least
//! `SLOTS / (SLOTS + 1)` (95%) of its limit.
//!
//! **Fair share.** A bucket remembers the calls waiting on it (refused and
//! still asking) and each tenant's *pass*: the units it was granted,
//! divided by its weight, never behind the bucket's virtual time (a tenant
//! back from idle starts level, not with credit). While calls of another
//! tenant with a smaller pass are waiting, a call is told to wait: capacity
//! freed goes to the tenant served least for its weight, so one tenant's
//! burst cannot starve another.
//!
//! **The provider's word.** A 429 (its `Retry-After`) or rate-limit
//! headers saying nothing is left set a cooldown on the upstream key's
//! bucket (`k/<key>`), which every call through that key checks: one
//! replica's 429 makes every replica wait.
//!
//! Everything here is pure: a bucket and a clock in, a decision out. The
//! backends load the buckets a write touches (sled: in memory; PostgreSQL:
//! rows locked in the write's transaction) and store them back.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::LedgerError;
use crate::books::Books;
use crate::desk::{Desk, Done, Op, Sink};

/// Slots per window.
pub(crate) const SLOTS: u64 = 20;
/// A day, ms.
const DAY_MS: u64 = 86_400_000;
/// How soon a call refused for a reason that frees without a known time
/// (calls in flight, another tenant's turn) asks again, ms.
pub(crate) const POLL_MS: u64 = 50;
/// A waiting call that has not asked again for this long is gone (its job
/// was cancelled, its replica died), ms.
pub(crate) const WAITER_TTL_MS: u64 = 3_000;
/// Longest cooldown a provider can impose, ms.
pub(crate) const MAX_COOLDOWN_MS: u64 = 600_000;

/// How a limit's buckets are split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    /// One bucket for every caller.
    #[default]
    Shared,
    /// One bucket per tenant.
    Tenant,
    /// One bucket per project: the outermost budget of the call's chain.
    Project,
    /// One bucket per person: the subject the call is made for.
    Person,
}

impl Per {
    fn as_str(self) -> &'static str {
        match self {
            Per::Shared => "shared",
            Per::Tenant => "tenant",
            Per::Project => "project",
            Per::Person => "person",
        }
    }
}

/// One declared limit (`[[ledger.limits]]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitConfig {
    /// Unique name, shown in `switchyard limits` and metrics.
    pub name: String,
    /// Applies to calls to this provider (`[llm]` provider name); empty:
    /// any.
    pub provider: String,
    /// Applies to calls of this model; empty: any.
    pub model: String,
    /// Applies to calls with this upstream API key: the provider's
    /// `api_key_env` (the variable's name, never the key), or the
    /// provider's name when it has none; empty: any.
    pub key: String,
    /// One bucket for all (`shared`), or one per `tenant`, `project` or
    /// `person`.
    pub per: Per,
    /// Requests per window.
    pub requests_per_minute: Option<u64>,
    /// Input plus output tokens per window.
    pub tokens_per_minute: Option<u64>,
    /// Input plus output tokens per day (a sliding 24 hours).
    pub tokens_per_day: Option<u64>,
    /// Calls in flight at once.
    pub concurrent: Option<u64>,
    /// The window "per minute" means, ms: 60000 (shorter only to test).
    pub window_ms: u64,
}

impl LimitConfig {
    /// Whether calls to `provider`'s `model` with upstream `key` count here.
    fn applies(&self, provider: &str, model: &str, key: &str) -> bool {
        (self.provider.is_empty() || self.provider == provider)
            && (self.model.is_empty() || self.model == model)
            && (self.key.is_empty() || self.key == key)
    }

    fn window(&self) -> u64 {
        if self.window_ms == 0 {
            60_000
        } else {
            self.window_ms
        }
    }

    /// What a grant costs in fair-share units: its tokens where tokens are
    /// limited, else the request.
    fn units(&self, tokens: u64) -> u64 {
        if self.tokens_per_minute.is_some() || self.tokens_per_day.is_some() {
            tokens.max(1)
        } else {
            1
        }
    }
}

/// The rate-limit settings of the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RatesConfig {
    /// The limits.
    pub limits: Vec<LimitConfig>,
    /// Fair-share weight per tenant (default 1).
    pub tenant_weights: BTreeMap<String, u32>,
    /// Cooldown after a 429 that names no Retry-After, ms.
    pub cooldown_ms: u64,
}

impl RatesConfig {
    /// Whether any limit is declared (without one, calls take no bucket).
    pub fn on(&self) -> bool {
        !self.limits.is_empty()
    }

    /// The configuration's problems, each with its fix.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut names = BTreeSet::new();
        for (i, l) in self.limits.iter().enumerate() {
            let at = format!("ledger.limits[{i}]");
            if switchyard_core::validate::key(&l.name, "limit name").is_err() {
                out.push(format!(
                    "{at}.name must be 1-128 characters of letters, digits, '-', '_', '.' or ':'"
                ));
            }
            if !names.insert(l.name.as_str()) {
                out.push(format!("{at}.name {:?} is declared twice", l.name));
            }
            if l.requests_per_minute.is_none()
                && l.tokens_per_minute.is_none()
                && l.tokens_per_day.is_none()
                && l.concurrent.is_none()
            {
                out.push(format!("{at} ({}) limits nothing: set requests_per_minute, tokens_per_minute, tokens_per_day or concurrent", l.name));
            }
            for (field, v) in [
                ("requests_per_minute", l.requests_per_minute),
                ("tokens_per_minute", l.tokens_per_minute),
                ("tokens_per_day", l.tokens_per_day),
                ("concurrent", l.concurrent),
            ] {
                if v == Some(0) {
                    out.push(format!(
                        "{at}.{field} must be at least 1 (leave it out for no limit)"
                    ));
                }
            }
            if l.window_ms != 0 && l.window_ms < SLOTS {
                out.push(format!("{at}.window_ms must be at least {SLOTS}"));
            }
        }
        for (t, w) in &self.tenant_weights {
            if *w == 0 {
                out.push(format!("ledger.tenant_weights.{t} must be at least 1"));
            }
        }
        out
    }

    fn weight(&self, tenant: &str) -> u64 {
        u64::from(self.tenant_weights.get(tenant).copied().unwrap_or(1).max(1))
    }

    /// The limit a bucket key belongs to (`None`: a key's cooldown bucket).
    pub(crate) fn limit_of(&self, bucket: &str) -> Option<&LimitConfig> {
        let name = bucket.strip_prefix("l/")?.split('/').next()?;
        self.limits.iter().find(|l| l.name == name)
    }

    /// The buckets a claim takes from, in key order (the order rows are
    /// locked in); none when no limit is declared.
    pub(crate) fn buckets(&self, c: &Claim) -> Vec<String> {
        if !self.on() {
            return Vec::new();
        }
        let mut keys = BTreeSet::new();
        for l in self
            .limits
            .iter()
            .filter(|l| l.applies(&c.provider, &c.model, &c.key))
        {
            keys.insert(match l.per {
                Per::Shared => format!("l/{}", l.name),
                Per::Tenant => format!("l/{}/tenant/{}", l.name, c.tenant),
                Per::Project => format!("l/{}/project/{}", l.name, c.project),
                // A subject is unique within its tenant only.
                Per::Person => format!("l/{}/person/{}:{}", l.name, c.tenant, c.person),
            });
        }
        if !c.key.is_empty() {
            keys.insert(cooldown_bucket(&c.key));
        }
        keys.into_iter().collect()
    }
}

/// The bucket holding the cooldown of upstream key `key`.
pub(crate) fn cooldown_bucket(key: &str) -> String {
    format!("k/{key}")
}

/// What a model call will use upstream, and for whom.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    /// Provider name.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Upstream key name.
    pub key: String,
    /// Worst-case tokens (a Reserve), or the tokens used (a Commit).
    pub tokens: u64,
    /// Tenant of the budget.
    pub tenant: String,
    /// Outermost budget of the chain.
    pub project: String,
    /// Subject the call is made for.
    pub person: String,
    /// The reservation's idempotency key: names its grant.
    pub grant: String,
}

/// Why a call must wait, and for how long at least.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    /// The bucket that refused.
    pub bucket: String,
    /// Ask again after this long, ms; `None`: the call can never fit.
    pub after_ms: Option<u64>,
    /// The cause, with the numbers.
    pub why: String,
}

/// Requests and tokens granted in one slot.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Slot {
    #[prost(uint64, tag = "1")]
    pub(crate) index: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) requests: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) tokens: u64,
}

/// One open grant: a call granted and not yet settled.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Grant {
    /// Its slot in the window and in the day.
    #[prost(uint64, tag = "1")]
    pub(crate) slot: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) day: u64,
    /// Tokens counted for it.
    #[prost(uint64, tag = "3")]
    pub(crate) tokens: u64,
    /// When it stops counting as in flight (its reservation's TTL), ms.
    #[prost(uint64, tag = "4")]
    pub(crate) expires_ms: u64,
    #[prost(string, tag = "5")]
    pub(crate) tenant: String,
}

/// One call waiting.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Waiter {
    #[prost(string, tag = "1")]
    pub(crate) tenant: String,
    /// When it first waited, ms.
    #[prost(uint64, tag = "2")]
    pub(crate) since_ms: u64,
    /// When it last asked, ms.
    #[prost(uint64, tag = "3")]
    pub(crate) seen_ms: u64,
    /// Why it waits.
    #[prost(string, tag = "4")]
    pub(crate) why: String,
}

/// One bucket's state.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Bucket {
    /// Grants per slot of the window, oldest first.
    #[prost(message, repeated, tag = "1")]
    pub(crate) slots: Vec<Slot>,
    /// Grants per slot of the day, oldest first.
    #[prost(message, repeated, tag = "2")]
    pub(crate) days: Vec<Slot>,
    /// Open grants by reservation key.
    #[prost(btree_map = "string, message", tag = "3")]
    pub(crate) grants: BTreeMap<String, Grant>,
    /// Waiting calls by reservation key.
    #[prost(btree_map = "string, message", tag = "4")]
    pub(crate) waiting: BTreeMap<String, Waiter>,
    /// Each tenant's pass (units granted × 1000 / weight).
    #[prost(btree_map = "string, uint64", tag = "5")]
    pub(crate) pass: BTreeMap<String, u64>,
    /// The virtual time: where the last grant made while calls waited
    /// started; no tenant starts behind it.
    #[prost(uint64, tag = "6")]
    pub(crate) vtime: u64,
    /// No call before this, ms (the provider asked).
    #[prost(uint64, tag = "7")]
    pub(crate) cooldown_until_ms: u64,
    /// Why.
    #[prost(string, tag = "8")]
    pub(crate) cooldown_why: String,
    /// Calls granted, ever.
    #[prost(uint64, tag = "9")]
    pub(crate) granted: u64,
    /// Times a call was told to wait, ever.
    #[prost(uint64, tag = "10")]
    pub(crate) waits: u64,
    /// Calls refused for good (larger than the limit), ever.
    #[prost(uint64, tag = "11")]
    pub(crate) refused: u64,
    /// When a call last waited or was granted while others waited, ms.
    #[prost(uint64, tag = "12")]
    pub(crate) contended_ms: u64,
    /// The tenant a bucket of one tenant (per tenant, project or person)
    /// belongs to; empty for a shared one.
    #[prost(string, tag = "13")]
    pub(crate) tenant: String,
}

/// One dimension's window: its slot width and limit.
struct Window {
    width: u64,
    limit: u64,
}

impl Window {
    fn slot(&self, now: u64) -> u64 {
        now / self.width
    }
    /// Whether slot `index` still counts at `now`.
    fn counts(&self, index: u64, now: u64) -> bool {
        index + SLOTS >= self.slot(now)
    }
}

fn minute(l: &LimitConfig, limit: u64) -> Window {
    Window {
        width: (l.window() / SLOTS).max(1),
        limit,
    }
}

fn day(limit: u64) -> Window {
    Window {
        width: DAY_MS / SLOTS,
        limit,
    }
}

/// How long until `want` more fits under `w` in `slots` (what each slot
/// holds picked by `of`), ms; `Some(0)` if it fits now, `None` never.
fn fits_after(
    slots: &[Slot],
    w: &Window,
    want: u64,
    now: u64,
    of: fn(&Slot) -> u64,
) -> Option<u64> {
    if want > w.limit {
        return None;
    }
    let live: Vec<&Slot> = slots.iter().filter(|s| w.counts(s.index, now)).collect();
    let mut used: u64 = live.iter().map(|s| of(s)).sum();
    if used + want <= w.limit {
        return Some(0);
    }
    for s in live {
        used -= of(s);
        if used + want <= w.limit {
            let free_at = (s.index + SLOTS + 1) * w.width;
            return Some(free_at.saturating_sub(now).max(1));
        }
    }
    Some(1)
}

fn add(slots: &mut Vec<Slot>, index: u64, requests: u64, tokens: u64) {
    match slots.last_mut() {
        Some(s) if s.index == index => {
            s.requests += requests;
            s.tokens = s.tokens.saturating_add(tokens);
        }
        _ => slots.push(Slot {
            index,
            requests,
            tokens,
        }),
    }
}

/// Gives back `back` tokens to slot `index` (if it still counts), or
/// charges `more` to it.
fn adjust(slots: &mut [Slot], index: u64, back: u64, more: u64) {
    if let Some(s) = slots.iter_mut().find(|s| s.index == index) {
        s.tokens = s.tokens.saturating_sub(back).saturating_add(more);
    }
}

impl Bucket {
    /// Forgets what no longer counts at `now`.
    pub(crate) fn prune(&mut self, limit: Option<&LimitConfig>, now: u64) {
        let (m, d) = match limit {
            Some(l) => (minute(l, 0), day(0)),
            None => (
                Window {
                    width: 60_000 / SLOTS,
                    limit: 0,
                },
                day(0),
            ),
        };
        self.slots.retain(|s| m.counts(s.index, now));
        self.days.retain(|s| d.counts(s.index, now));
        self.grants.retain(|_, g| g.expires_ms > now);
        self.waiting.retain(|_, w| w.seen_ms + WAITER_TTL_MS > now);
        if self.cooldown_until_ms <= now {
            self.cooldown_until_ms = 0;
            self.cooldown_why.clear();
        }
        // A tenant at or behind the virtual time and not waiting would be
        // lifted to it anyway.
        let (vt, waiting) = (
            self.vtime,
            self.waiting
                .values()
                .map(|w| w.tenant.as_str())
                .collect::<BTreeSet<_>>(),
        );
        self.pass
            .retain(|t, p| *p > vt || waiting.contains(t.as_str()));
    }

    fn start(&self, tenant: &str) -> u64 {
        self.pass.get(tenant).copied().unwrap_or(0).max(self.vtime)
    }

    /// Why `c` cannot be granted now, if it cannot.
    fn wait(&self, key: &str, limit: Option<&LimitConfig>, c: &Claim, now: u64) -> Option<Wait> {
        let wait = |after_ms: Option<u64>, why: String| {
            Some(Wait {
                bucket: key.to_owned(),
                after_ms,
                why,
            })
        };
        if self.cooldown_until_ms > now {
            return wait(
                Some(self.cooldown_until_ms - now),
                format!("the provider asked to wait: {}", self.cooldown_why),
            );
        }
        let l = limit?;
        if let Some(n) = l.concurrent
            && self.grants.len() as u64 >= n
        {
            return wait(
                Some(POLL_MS),
                format!("{n} calls are in flight, the most limit {} allows", l.name),
            );
        }
        let checks = [
            (
                l.requests_per_minute.map(|n| minute(l, n)),
                1,
                "requests",
                false,
            ),
            (
                l.tokens_per_minute.map(|n| minute(l, n)),
                c.tokens,
                "tokens",
                false,
            ),
            (l.tokens_per_day.map(day), c.tokens, "tokens", true),
        ];
        for (w, want, what, daily) in checks {
            let Some(w) = w else { continue };
            let slots = if daily { &self.days } else { &self.slots };
            let of: fn(&Slot) -> u64 = if what == "requests" {
                |s| s.requests
            } else {
                |s| s.tokens
            };
            let per = match (daily, l.window()) {
                (true, _) => "day".to_owned(),
                (false, 60_000) => "minute".to_owned(),
                (false, ms) => format!("{ms} ms"),
            };
            match fits_after(slots, &w, want, now, of) {
                Some(0) => {}
                Some(ms) => {
                    return wait(
                        Some(ms),
                        format!(
                            "limit {} allows {} {what} per {per} and they are taken; room frees in {ms} ms",
                            l.name, w.limit
                        ),
                    );
                }
                None => {
                    return wait(
                        None,
                        format!(
                            "the call may use {want} {what}, more than limit {} allows in a whole {per} ({}); lower the task's max_tokens or raise the limit",
                            l.name, w.limit
                        ),
                    );
                }
            }
        }
        // Fair share: a tenant served less for its weight goes first.
        let mine = self.start(&c.tenant);
        let ahead = self
            .waiting
            .iter()
            .filter(|(k, w)| w.tenant != c.tenant && k.as_str() != c.grant)
            .map(|(_, w)| (self.start(&w.tenant), w.tenant.as_str()))
            .filter(|(s, _)| *s < mine)
            .min();
        if let Some((_, other)) = ahead {
            return wait(
                Some(POLL_MS),
                format!(
                    "limit {} is full and tenant {other}'s waiting calls go first (fair share)",
                    l.name
                ),
            );
        }
        None
    }

    /// Records that `c` waits here.
    fn note_wait(&mut self, c: &Claim, why: &str, window: u64, now: u64) {
        self.waits += 1;
        // Contention begins after a window without: every tenant starts
        // level from here (what a tenant used while the bucket had room
        // buys no priority now).
        if self.waiting.is_empty() && (self.contended_ms == 0 || self.contended_ms + window <= now)
        {
            let top = self.pass.values().copied().max().unwrap_or(0);
            self.vtime = self.vtime.max(top);
        }
        self.contended_ms = now;
        let since = self.waiting.get(&c.grant).map_or(now, |w| w.since_ms);
        self.waiting.insert(
            c.grant.clone(),
            Waiter {
                tenant: c.tenant.clone(),
                since_ms: since,
                seen_ms: now,
                why: why.to_owned(),
            },
        );
        let start = self.start(&c.tenant);
        self.pass.insert(c.tenant.clone(), start);
    }

    /// Grants `c`.
    fn grant(
        &mut self,
        limit: Option<&LimitConfig>,
        c: &Claim,
        weight: u64,
        now: u64,
        expires_ms: u64,
    ) {
        self.granted += 1;
        // Granted while calls wait: the bucket is contended, and its
        // virtual time moves to where this grant started (the smallest
        // start among those waiting, as the least served go first).
        let contended = !self.waiting.is_empty();
        if contended {
            self.contended_ms = now;
        }
        self.waiting.remove(&c.grant);
        let Some(l) = limit else { return };
        let (m, d) = (minute(l, 0), day(0));
        add(&mut self.slots, m.slot(now), 1, c.tokens);
        add(&mut self.days, d.slot(now), 1, c.tokens);
        let start = self.start(&c.tenant);
        if contended {
            self.vtime = self.vtime.max(start);
        }
        self.pass.insert(
            c.tenant.clone(),
            start.saturating_add(l.units(c.tokens).saturating_mul(1000) / weight),
        );
        self.grants.insert(
            c.grant.clone(),
            Grant {
                slot: m.slot(now),
                day: d.slot(now),
                tokens: c.tokens,
                expires_ms,
                tenant: c.tenant.clone(),
            },
        );
    }

    /// Settles grant `grant`: the call used `used` tokens upstream.
    /// Settling twice changes nothing.
    fn settle(&mut self, grant: &str, used: u64) {
        let Some(g) = self.grants.remove(grant) else {
            return;
        };
        let (back, more) = (g.tokens.saturating_sub(used), used.saturating_sub(g.tokens));
        adjust(&mut self.slots, g.slot, back, more);
        adjust(&mut self.days, g.day, back, more);
    }
}

/// The buckets one decision sees: all of them (sled), or those a
/// transaction locked (PostgreSQL). Keeps which it changed.
#[derive(Debug, Default)]
pub(crate) struct Table {
    pub(crate) buckets: BTreeMap<String, Bucket>,
    pub(crate) changed: BTreeSet<String>,
}

/// What [`Table::admit`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Granted before under the same key (a retried Reserve): nothing more
    /// to take.
    Again,
    /// Fits: take it with [`Table::grant`] once the money is reserved.
    Fits,
}

impl Table {
    /// Bucket `key` as claim `c` finds it, marked with `c`'s tenant when it
    /// is a bucket of one tenant.
    fn bucket_for(&mut self, cfg: &RatesConfig, key: &str, c: &Claim) -> &mut Bucket {
        let own = cfg.limit_of(key).is_some_and(|l| l.per != Per::Shared);
        let b = self.buckets.entry(key.to_owned()).or_default();
        if own && b.tenant.is_empty() {
            b.tenant.clone_from(&c.tenant);
        }
        b
    }

    /// Whether `c` fits every bucket in `keys` now; if not, the longest
    /// wait (the call is noted as waiting in each bucket that refused).
    /// Each bucket first forgets what no longer counts at `now`.
    pub(crate) fn admit(
        &mut self,
        cfg: &RatesConfig,
        keys: &[String],
        c: &Claim,
        now: u64,
    ) -> Result<Admit, Wait> {
        if keys.iter().any(|k| {
            self.buckets
                .get(k)
                .is_some_and(|b| b.grants.contains_key(&c.grant))
        }) {
            return Ok(Admit::Again);
        }
        let mut worst: Option<Wait> = None;
        for key in keys {
            let limit = cfg.limit_of(key);
            let b = self.bucket_for(cfg, key, c);
            b.prune(limit, now);
            let Some(w) = b.wait(key, limit, c, now) else {
                continue;
            };
            if w.after_ms.is_none() {
                b.refused += 1;
                self.changed.insert(key.clone());
                return Err(w);
            }
            let window = limit.map_or(60_000, LimitConfig::window);
            b.note_wait(c, &w.why, window, now);
            self.changed.insert(key.clone());
            if worst.as_ref().is_none_or(|x| x.after_ms < w.after_ms) {
                worst = Some(w);
            }
        }
        match worst {
            Some(w) => Err(w),
            None => Ok(Admit::Fits),
        }
    }

    /// Takes `c` from every bucket in `keys` (just admitted, so pruned at
    /// `now`); the grant stops counting as in flight at `expires_ms`.
    pub(crate) fn grant(
        &mut self,
        cfg: &RatesConfig,
        keys: &[String],
        c: &Claim,
        now: u64,
        expires_ms: u64,
    ) {
        let weight = cfg.weight(&c.tenant);
        for key in keys {
            let limit = cfg.limit_of(key);
            self.bucket_for(cfg, key, c)
                .grant(limit, c, weight, now, expires_ms);
            self.changed.insert(key.clone());
        }
    }

    /// Settles `c.grant` in every bucket in `keys` that holds it: the call
    /// used `c.tokens` upstream (what a Commit or Release says; the rest of
    /// what was held comes back, the request stays counted).
    pub(crate) fn settle(&mut self, keys: &[String], c: &Claim) {
        for key in keys {
            if let Some(b) = self.buckets.get_mut(key)
                && b.grants.contains_key(&c.grant)
            {
                b.settle(&c.grant, c.tokens);
                self.changed.insert(key.clone());
            }
        }
    }

    /// Sets a cooldown on bucket `key` until `until_ms` (never shortens
    /// one).
    pub(crate) fn cool(&mut self, key: &str, until_ms: u64, why: &str) {
        let b = self.buckets.entry(key.to_owned()).or_default();
        if until_ms > b.cooldown_until_ms {
            b.cooldown_until_ms = until_ms;
            b.cooldown_why = why.to_owned();
            self.changed.insert(key.to_owned());
        }
    }
}

/// What one dimension of a bucket holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Use {
    /// `requests_per_minute`, `tokens_per_minute`, `tokens_per_day`,
    /// `concurrent`.
    pub dimension: &'static str,
    pub used: u64,
    pub limit: u64,
}

/// What a bucket holds now, for views and metrics.
pub(crate) fn usage(cfg: &RatesConfig, key: &str, b: &Bucket, now: u64) -> Vec<Use> {
    let Some(l) = cfg.limit_of(key) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let sum = |slots: &[Slot], w: &Window, of: fn(&Slot) -> u64| -> u64 {
        slots
            .iter()
            .filter(|s| w.counts(s.index, now))
            .map(of)
            .sum()
    };
    if let Some(n) = l.requests_per_minute {
        out.push(Use {
            dimension: "requests_per_minute",
            used: sum(&b.slots, &minute(l, n), |s| s.requests),
            limit: n,
        });
    }
    if let Some(n) = l.tokens_per_minute {
        out.push(Use {
            dimension: "tokens_per_minute",
            used: sum(&b.slots, &minute(l, n), |s| s.tokens),
            limit: n,
        });
    }
    if let Some(n) = l.tokens_per_day {
        out.push(Use {
            dimension: "tokens_per_day",
            used: sum(&b.days, &day(n), |s| s.tokens),
            limit: n,
        });
    }
    if let Some(n) = l.concurrent {
        out.push(Use {
            dimension: "concurrent",
            used: b.grants.values().filter(|g| g.expires_ms > now).count() as u64,
            limit: n,
        });
    }
    out
}

/// The scope a bucket key names: `shared`, or `tenant:<t>` and the like.
pub(crate) fn scope(key: &str) -> (String, String) {
    let mut parts = key.splitn(4, '/');
    let (kind, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if kind == "k" {
        return (String::new(), format!("key:{name}"));
    }
    match (parts.next(), parts.next()) {
        (Some(per), Some(v)) => (name.to_owned(), format!("{per}:{v}")),
        _ => (name.to_owned(), Per::Shared.as_str().to_owned()),
    }
}

/// A write's rate-limit part: the claim a Reserve, Commit or Release
/// carries, or a cooldown to set ([`crate::desk::Op::Cool`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct RateWork {
    /// The claim: provider, model, key, tokens and person (tenant, project
    /// and grant are filled in from the books).
    pub claim: Claim,
    /// A cooldown: until when (ms) and why.
    pub cool: Option<(u64, String)>,
}

/// Budget `id`'s tenant and project (its outermost ancestor), from
/// `facts` (tenant and parent of a budget).
pub(crate) fn place(
    facts: impl Fn(&str) -> Option<(String, String)>,
    id: &str,
) -> Option<(String, String)> {
    let (tenant, mut parent) = facts(id)?;
    let mut root = id.to_owned();
    // A chain is at most a few budgets deep; the bound only guards a cycle.
    for _ in 0..64 {
        if parent.is_empty() {
            return Some((tenant, root));
        }
        root = parent.clone();
        parent = facts(&parent)?.1;
    }
    None
}

/// The budget `op` reserves on or settles a reservation of (through
/// `home`: a reservation's budget).
pub(crate) fn budget_of(op: &Op, home: impl Fn(&str) -> Option<String>) -> Option<String> {
    match op {
        Op::Reserve { req, .. } => Some(req.budget_id.clone()),
        Op::Commit { req, .. } => home(&req.reservation_id),
        Op::Release { reservation_id, .. } => home(reservation_id),
        _ => None,
    }
}

/// `work`'s claim placed on the budget `op` reserves on (or whose
/// reservation it settles, through `home`): its tenant and project from
/// `facts`; `None` when a fact is missing.
pub(crate) fn placed(
    op: &Op,
    work: &RateWork,
    facts: impl Fn(&str) -> Option<(String, String)>,
    home: impl Fn(&str) -> Option<String>,
) -> Option<Claim> {
    let (tenant, project) = place(facts, &budget_of(op, home)?)?;
    Some(Claim {
        tenant,
        project,
        ..work.claim.clone()
    })
}

/// The buckets `work` takes from, settles or cools, given budget facts and
/// reservation homes; `None` when a fact is missing.
pub(crate) fn keys_of(
    cfg: &RatesConfig,
    op: &Op,
    work: &RateWork,
    facts: impl Fn(&str) -> Option<(String, String)>,
    home: impl Fn(&str) -> Option<String>,
) -> Option<Vec<String>> {
    if work.cool.is_some() {
        return Some(vec![cooldown_bucket(&work.claim.key)]);
    }
    Some(cfg.buckets(&placed(op, work, facts, home)?))
}

/// Budget facts (tenant, parent) from `books`.
pub(crate) fn books_facts(books: &Books) -> impl Fn(&str) -> Option<(String, String)> + '_ {
    |id| {
        books
            .budgets
            .get(id)
            .map(|b| (b.tenant.clone(), b.parent.clone().unwrap_or_default()))
    }
}

/// Decides `op` with its rate-limit part: a Reserve's claim must fit every
/// bucket before its money is reserved, and is taken once it is; a Commit
/// or Release settles its grant after the money; a cooldown is set. `op`
/// alone when there is no rate work, or no limit applies.
pub(crate) fn decide<S: Sink>(
    desk: &mut Desk<'_, S>,
    table: &mut Table,
    cfg: &RatesConfig,
    op: Op,
    work: Option<&RateWork>,
) -> Result<Done, LedgerError> {
    let Some(work) = work else {
        return desk.decide(op);
    };
    let now = desk.now;
    if let Some((until, why)) = &work.cool {
        table.cool(&cooldown_bucket(&work.claim.key), *until, why);
        return desk.decide(op);
    }
    let books: &Books = desk.books;
    let home = |rid: &str| books.reservations.get(rid).map(|r| r.budget_id.clone());
    let Some(mut claim) = placed(&op, work, books_facts(books), home) else {
        // The budget or reservation does not exist: the desk says so.
        return desk.decide(op);
    };
    let keys = cfg.buckets(&claim);
    if let Op::Reserve {
        ref req, ttl_ms, ..
    } = op
    {
        claim.grant = req.idempotency_key.clone();
        let admit = table
            .admit(cfg, &keys, &claim, now)
            .map_err(LedgerError::RateLimited)?;
        let done = desk.decide(op)?;
        if admit == Admit::Fits {
            table.grant(cfg, &keys, &claim, now, now.saturating_add(ttl_ms));
        }
        return Ok(done);
    }
    // A Commit or Release: its grant is named by its reservation's key.
    claim.grant = op
        .reservation()
        .and_then(|rid| books.reservations.get(rid))
        .map(|r| r.key.clone())
        .unwrap_or_default();
    let done = desk.decide(op)?;
    table.settle(&keys, &claim);
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(limit: LimitConfig) -> RatesConfig {
        RatesConfig {
            limits: vec![limit],
            ..Default::default()
        }
    }

    fn rpm(n: u64, window_ms: u64) -> LimitConfig {
        LimitConfig {
            name: "rpm".into(),
            requests_per_minute: Some(n),
            window_ms,
            ..Default::default()
        }
    }

    fn claim(tenant: &str, grant: &str, tokens: u64) -> Claim {
        Claim {
            provider: "p".into(),
            model: "m".into(),
            key: "K".into(),
            tokens,
            tenant: tenant.into(),
            project: "proj".into(),
            person: "alice".into(),
            grant: grant.into(),
        }
    }

    /// Admits and grants `c` at `now` if it fits.
    fn take(t: &mut Table, cfg: &RatesConfig, c: &Claim, now: u64) -> Result<(), Wait> {
        let keys = cfg.buckets(c);
        if t.admit(cfg, &keys, c, now)? == Admit::Fits {
            t.grant(cfg, &keys, c, now, now + 60_000);
        }
        Ok(())
    }

    #[test]
    fn buckets_apply_by_provider_model_and_key_and_split_per_scope() {
        let c = RatesConfig {
            limits: vec![
                LimitConfig {
                    name: "a".into(),
                    provider: "p".into(),
                    requests_per_minute: Some(1),
                    ..Default::default()
                },
                LimitConfig {
                    name: "b".into(),
                    model: "other".into(),
                    requests_per_minute: Some(1),
                    ..Default::default()
                },
                LimitConfig {
                    name: "c".into(),
                    key: "K".into(),
                    per: Per::Tenant,
                    concurrent: Some(1),
                    ..Default::default()
                },
                LimitConfig {
                    name: "d".into(),
                    per: Per::Person,
                    concurrent: Some(1),
                    ..Default::default()
                },
                LimitConfig {
                    name: "e".into(),
                    per: Per::Project,
                    concurrent: Some(1),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            c.buckets(&claim("acme", "g", 1)),
            vec![
                "k/K",
                "l/a",
                "l/c/tenant/acme",
                "l/d/person/acme:alice",
                "l/e/project/proj"
            ]
        );
        assert!(
            RatesConfig::default()
                .buckets(&claim("acme", "g", 1))
                .is_empty()
        );
        assert_eq!(scope("l/c/tenant/acme"), ("c".into(), "tenant:acme".into()));
        assert_eq!(scope("l/a"), ("a".into(), "shared".into()));
        assert_eq!(scope("k/K"), ("".into(), "key:K".into()));
    }

    #[test]
    fn no_sliding_window_ever_sees_more_than_the_limit_and_a_saturated_bucket_grants_at_least_95_percent()
     {
        // Callers ask every millisecond for 10 windows; every grant is
        // recorded, then every window position is checked.
        let (limit, window) = (7u64, 1_000u64);
        let cfg = cfg(rpm(limit, window));
        let mut t = Table::default();
        let mut granted = Vec::new();
        // Each caller asks again with the same call until it is granted.
        let mut next = [0u64; 3];
        for now in 0..10 * window {
            for (caller, n) in next.iter_mut().enumerate() {
                let c = claim("acme", &format!("g{caller}-{n}"), 1);
                if take(&mut t, &cfg, &c, now).is_ok() {
                    granted.push(now);
                    *n += 1;
                }
            }
        }
        // Grants are in time order: the most within any window, by two
        // pointers.
        let (mut most, mut first) = (0, 0);
        for last in 0..granted.len() {
            while granted[last] - granted[first] >= window {
                first += 1;
            }
            most = most.max(last - first + 1);
        }
        assert_eq!(most as u64, limit, "most granted in any window");
        let rate = granted.len() as f64 / 10.0;
        assert!(
            rate >= limit as f64 * 0.9,
            "{rate} per window against {limit}"
        );
    }

    #[test]
    fn a_wait_names_when_room_frees_and_the_call_then_fits() {
        let cfg = cfg(rpm(2, 1_000));
        let mut t = Table::default();
        take(&mut t, &cfg, &claim("a", "1", 1), 10).unwrap();
        take(&mut t, &cfg, &claim("a", "2", 1), 20).unwrap();
        let w = take(&mut t, &cfg, &claim("a", "3", 1), 30).unwrap_err();
        let after = w.after_ms.unwrap();
        assert_eq!(w.bucket, "l/rpm");
        assert!(w.why.contains("allows 2 requests"), "{}", w.why);
        assert!(take(&mut t, &cfg, &claim("a", "3", 1), 30 + after - 1).is_err());
        take(&mut t, &cfg, &claim("a", "3", 1), 30 + after).unwrap();
    }

    #[test]
    fn tokens_are_reserved_worst_case_and_given_back_on_commit_and_release() {
        let cfg = cfg(LimitConfig {
            name: "tpm".into(),
            tokens_per_minute: Some(1_000),
            ..Default::default()
        });
        let mut t = Table::default();
        let a = claim("a", "1", 600);
        take(&mut t, &cfg, &a, 0).unwrap();
        assert!(take(&mut t, &cfg, &claim("a", "2", 600), 1).is_err());
        // The call used 100: 500 come back.
        let keys = cfg.buckets(&a);
        t.settle(
            &keys,
            &Claim {
                tokens: 100,
                ..a.clone()
            },
        );
        take(&mut t, &cfg, &claim("a", "2", 600), 3).unwrap();
        // A second settle changes nothing.
        t.settle(&keys, &Claim { tokens: 0, ..a });
        assert!(take(&mut t, &cfg, &claim("a", "3", 301), 5).is_err());
        // A call that failed (it used nothing) gives back all its tokens.
        let b = claim("a", "2", 0);
        t.settle(&keys, &b);
        take(&mut t, &cfg, &claim("a", "3", 800), 7).unwrap();
        let w = take(&mut t, &cfg, &claim("a", "4", 1_001), 8).unwrap_err();
        assert_eq!(w.after_ms, None, "larger than the limit never fits");
        assert!(w.why.contains("lower the task's max_tokens"), "{}", w.why);
    }

    #[test]
    fn a_retried_reserve_is_not_granted_twice() {
        let cfg = cfg(rpm(1, 1_000));
        let mut t = Table::default();
        let c = claim("a", "same", 1);
        take(&mut t, &cfg, &c, 0).unwrap();
        assert_eq!(t.admit(&cfg, &cfg.buckets(&c), &c, 1), Ok(Admit::Again));
    }

    #[test]
    fn concurrency_counts_calls_in_flight_until_settled_or_expired() {
        let cfg = cfg(LimitConfig {
            name: "conc".into(),
            concurrent: Some(1),
            ..Default::default()
        });
        let mut t = Table::default();
        let a = claim("a", "1", 1);
        let keys = cfg.buckets(&a);
        t.admit(&cfg, &keys, &a, 0).unwrap();
        t.grant(&cfg, &keys, &a, 0, 500);
        let w = take(&mut t, &cfg, &claim("a", "2", 1), 1).unwrap_err();
        assert!(w.why.contains("in flight"), "{}", w.why);
        // Its reservation expired (its replica died): the slot is free.
        take(&mut t, &cfg, &claim("a", "2", 1), 500).unwrap();
        t.settle(&keys, &claim("a", "2", 1));
        take(&mut t, &cfg, &claim("a", "3", 1), 502).unwrap();
    }

    #[test]
    fn a_cooldown_holds_every_call_through_the_key_until_it_passes() {
        let cfg = cfg(rpm(100, 1_000));
        let mut t = Table::default();
        t.cool(&cooldown_bucket("K"), 2_000, "429 Retry-After 2s");
        let w = take(&mut t, &cfg, &claim("a", "1", 1), 500).unwrap_err();
        assert_eq!((w.bucket.as_str(), w.after_ms), ("k/K", Some(1_500)));
        assert!(w.why.contains("Retry-After"), "{}", w.why);
        // A shorter cooldown does not shorten it.
        t.cool(&cooldown_bucket("K"), 1_000, "x");
        assert!(take(&mut t, &cfg, &claim("a", "1", 1), 1_999).is_err());
        take(&mut t, &cfg, &claim("a", "1", 1), 2_000).unwrap();
    }

    #[test]
    fn a_waiting_tenant_served_less_goes_before_a_flooding_one() {
        let cfg = cfg(rpm(4, 1_000));
        let mut t = Table::default();
        // Tenant a floods: it takes the window, waits, takes the next.
        let mut now = 0;
        for i in 0..8 {
            let c = claim("a", &format!("a{i}"), 1);
            while let Err(w) = take(&mut t, &cfg, &c, now) {
                now += w.after_ms.unwrap();
            }
        }
        // Both wait; b has been served less since the bucket filled.
        let wa = take(&mut t, &cfg, &claim("a", "a9", 1), now).unwrap_err();
        take(&mut t, &cfg, &claim("b", "b1", 1), now + 1).unwrap_err();
        let free = now + wa.after_ms.unwrap();
        // Room frees: a asks first but b's call goes first.
        let w = take(&mut t, &cfg, &claim("a", "a9", 1), free).unwrap_err();
        assert!(
            w.why.contains("tenant b's waiting calls go first"),
            "{}",
            w.why
        );
        take(&mut t, &cfg, &claim("b", "b1", 1), free + 1).unwrap();
        // With b served and not waiting, a goes on.
        take(&mut t, &cfg, &claim("a", "a9", 1), free + 2).unwrap();
    }

    #[test]
    fn a_tenant_arriving_during_contention_starts_level_with_no_saved_credit() {
        let cfg = cfg(rpm(10, 1_000));
        let mut t = Table::default();
        // a uses the bucket alone, then floods it.
        for i in 0..10 {
            take(&mut t, &cfg, &claim("a", &format!("a{i}"), 1), i).unwrap();
        }
        take(&mut t, &cfg, &claim("a", "a10", 1), 20).unwrap_err();
        // b arrives: it starts level with a, not ten calls ahead.
        take(&mut t, &cfg, &claim("b", "b0", 1), 21).unwrap_err();
        let b = &t.buckets["l/rpm"];
        assert_eq!((b.pass["b"], b.vtime), (10_000, 10_000), "{b:?}");
    }

    #[test]
    fn a_heavier_weight_gets_more_of_a_full_bucket_and_the_lighter_is_not_starved() {
        let mut cfg = cfg(rpm(10, 1_000));
        cfg.tenant_weights.insert("heavy".into(), 3);
        let mut t = Table::default();
        let mut got: BTreeMap<&str, u64> = BTreeMap::new();
        // Five callers per tenant, each asking again every millisecond
        // until granted, then with its next call.
        let mut next: BTreeMap<String, u64> = BTreeMap::new();
        for now in 0..20_000u64 {
            for caller in 0..5 {
                for tenant in ["heavy", "light"] {
                    let id = format!("{tenant}-{caller}");
                    let n = next.get(&id).copied().unwrap_or(0);
                    let c = claim(tenant, &format!("{id}-{n}"), 1);
                    if take(&mut t, &cfg, &c, now).is_ok() {
                        *got.entry(tenant).or_default() += 1;
                        next.insert(id, n + 1);
                    }
                }
            }
        }
        // Weight 3 against 1; capacity freed while none of the heavy
        // tenant's calls waits goes to the light one (no capacity idles).
        let ratio = got["heavy"] as f64 / got["light"] as f64;
        assert!((2.0..=3.5).contains(&ratio), "{got:?}");
    }

    #[test]
    fn config_problems_name_the_field_and_the_fix() {
        let bad = RatesConfig {
            limits: vec![
                LimitConfig {
                    name: "x".into(),
                    ..Default::default()
                },
                LimitConfig {
                    name: "x".into(),
                    requests_per_minute: Some(0),
                    ..Default::default()
                },
            ],
            tenant_weights: [("t".to_owned(), 0)].into(),
            cooldown_ms: 0,
        };
        let p = bad.problems().join("\n");
        assert!(p.contains("limits nothing"), "{p}");
        assert!(p.contains("declared twice"), "{p}");
        assert!(p.contains("requests_per_minute must be at least 1"), "{p}");
        assert!(p.contains("tenant_weights.t"), "{p}");
    }
}
