//! The policy set in force, replaced only by a set that loads.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::{Decision, Facts, PolicyError, PolicySet, Source};

/// The outcome of the latest load.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reload {
    /// Loads tried that found the sources changed (the first load counts).
    pub attempts: u64,
    /// The version in force.
    pub version: String,
    /// Policies in force.
    pub policies: usize,
    /// Why the latest changed sources were refused (the set in force stayed);
    /// empty when they loaded.
    pub refused: String,
    /// The version of the sources refused (so they are not tried again
    /// until they change).
    pub refused_version: String,
}

/// Holds the policy set in force: the configured rules plus a directory's
/// `*.cedar` files (and, on PostgreSQL, the store's). Decisions read it
/// without waiting on a reload.
pub struct Engine {
    dir: Option<PathBuf>,
    fixed: Vec<Source>,
    /// The policy store's files, as last read (named `store:<name>`).
    stored: RwLock<Vec<Source>>,
    /// Reads the policy store again (each reload tick), once set.
    feed: RwLock<Option<Feed>>,
    current: RwLock<Arc<PolicySet>>,
    status: tokio::sync::watch::Sender<Reload>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.dir)
            .field("version", &self.current().version())
            .finish_non_exhaustive()
    }
}

/// Reads the policy store's files: the approval service's, in this
/// process or over gRPC.
pub type Feed = Arc<
    dyn Fn() -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Vec<Source>, String>> + Send>,
        > + Send
        + Sync,
>;

/// A stored file as a source: `store:<name>`, so its policies never take a
/// file's name.
pub fn stored_source(name: &str, text: &str) -> Source {
    Source {
        name: format!("store:{name}"),
        text: text.to_owned(),
    }
}

impl Engine {
    /// Loads `fixed` (rules compiled from the config) and `dir`'s files.
    /// A set that does not load is an error here: a process does not start
    /// on broken policies.
    pub fn new(fixed: Vec<Source>, dir: Option<PathBuf>) -> Result<Arc<Engine>, PolicyError> {
        let mut sources = fixed.clone();
        if let Some(d) = &dir {
            sources.extend(crate::read_dir(d)?);
        }
        let set = PolicySet::load(&sources)?;
        Ok(Engine::holding(set, fixed, dir))
    }

    /// An engine holding `set` and nothing to reload.
    pub fn fixed(set: PolicySet) -> Arc<Engine> {
        Engine::holding(set, Vec::new(), None)
    }

    /// An engine holding `set`, loaded from `fixed` and `dir`.
    fn holding(set: PolicySet, fixed: Vec<Source>, dir: Option<PathBuf>) -> Arc<Engine> {
        let (status, _) = tokio::sync::watch::channel(Reload {
            attempts: 1,
            version: set.version().to_owned(),
            policies: set.len(),
            ..Default::default()
        });
        Arc::new(Engine {
            dir,
            fixed,
            stored: RwLock::new(Vec::new()),
            feed: RwLock::new(None),
            current: RwLock::new(Arc::new(set)),
            status,
        })
    }

    /// Reads the policy store through `feed` from now on (each reload).
    pub fn set_feed(&self, feed: Feed) {
        *self
            .feed
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(feed);
    }

    /// Reads the policy store now (when a feed is set) and reloads.
    pub async fn refresh(&self) -> Result<bool, PolicyError> {
        let feed = self
            .feed
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(feed) = feed {
            match feed().await {
                Ok(stored) => self.set_stored(stored),
                Err(e) => {
                    tracing::debug!(error = %e, "the policy store could not be read; the set in force stays")
                }
            }
        }
        self.reload()
    }

    /// Takes `stored` as the policy store's files (see [`stored_source`]).
    /// The next reload decides whether they load.
    pub fn set_stored(&self, stored: Vec<Source>) {
        *self
            .stored
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = stored;
    }

    /// The set the sources would make with `stored` as the policy store's
    /// files, or why they do not load (nothing changes either way).
    pub fn try_stored(&self, stored: &[Source]) -> Result<PolicySet, PolicyError> {
        PolicySet::load(&self.sources(stored)?)
    }

    /// Every source of the set: the rules, the directory's files as they
    /// are now, and `stored`.
    fn sources(&self, stored: &[Source]) -> Result<Vec<Source>, PolicyError> {
        let mut sources = self.fixed.clone();
        if let Some(d) = &self.dir {
            sources.extend(crate::read_dir(d)?);
        }
        sources.extend(stored.iter().cloned());
        Ok(sources)
    }

    /// The set in force.
    pub fn current(&self) -> Arc<PolicySet> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Decides `facts` with the set in force.
    pub fn decide(&self, facts: &Facts) -> Decision {
        self.current().decide(facts)
    }

    /// The directory reloaded, if any.
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }

    /// Reads the sources again and, when they changed, loads them. A set
    /// that does not load is refused and the set in force stays; the
    /// refusal is reported in [`Engine::status`] and returned the first
    /// time (the same sources are not tried again until they change).
    /// Returns whether the set in force changed.
    pub fn reload(&self) -> Result<bool, PolicyError> {
        let stored = self
            .stored
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let sources = match self.sources(&stored) {
            Ok(s) => s,
            Err(e) => return self.refuse(e, "unreadable"),
        };
        let version = crate::version_of(&sources);
        if version == self.current().version() {
            // Back to the set in force: a refusal reported earlier is over
            // (nothing new to load, so nobody is told).
            self.status.send_if_modified(|s| {
                s.refused.clear();
                s.refused_version.clear();
                false
            });
            return Ok(false);
        }
        if version == self.status.borrow().refused_version {
            return Ok(false);
        }
        match PolicySet::load(&sources) {
            Ok(set) => {
                let (v, n) = (set.version().to_owned(), set.len());
                match self.current.write() {
                    Ok(mut g) => *g = Arc::new(set),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(set),
                }
                self.status.send_modify(|s| {
                    s.attempts += 1;
                    s.version = v;
                    s.policies = n;
                    s.refused.clear();
                    s.refused_version.clear();
                });
                Ok(true)
            }
            Err(e) => self.refuse(e, &version),
        }
    }

    /// Records a refusal of the sources of `version`; an error only when it
    /// is news.
    fn refuse(&self, e: PolicyError, version: &str) -> Result<bool, PolicyError> {
        let news = self.status.send_if_modified(|s| {
            let text = e.to_string();
            if s.refused == text && s.refused_version == version {
                return false;
            }
            s.attempts += 1;
            s.refused = text;
            s.refused_version = version.to_owned();
            true
        });
        if news { Err(e) } else { Ok(false) }
    }

    /// Follows loads: each change of the set in force, and each refusal.
    pub fn status(&self) -> tokio::sync::watch::Receiver<Reload> {
        self.status.subscribe()
    }
}

/// Where a service keeps the engine it decides with: set whole by the
/// process that builds it, read by each decision.
#[derive(Debug)]
pub struct Slot(RwLock<Arc<Engine>>);

impl Default for Slot {
    /// The empty set: no policy decides anything.
    fn default() -> Slot {
        Slot::new(Engine::fixed(PolicySet::empty()))
    }
}

impl Slot {
    /// A slot holding `engine`.
    pub fn new(engine: Arc<Engine>) -> Slot {
        Slot(RwLock::new(engine))
    }

    /// Decides with `engine` from now on.
    pub fn set(&self, engine: Arc<Engine>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = engine;
    }

    /// The engine in force.
    pub fn get(&self) -> Arc<Engine> {
        Arc::clone(
            &self
                .0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// What the set in force decides about `facts`.
    pub fn decide(&self, facts: &Facts) -> Decision {
        self.get().decide(facts)
    }
}

/// Reloads `engine`'s directory and policy store every `every` until
/// `stop` completes; a refused set is logged once per change of the files.
pub fn watch(
    engine: Arc<Engine>,
    every: Duration,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = &mut stop => return,
            }
            match engine.refresh().await {
                Ok(true) => {
                    let s = engine.status.borrow().clone();
                    tracing::info!(version = %s.version, policies = s.policies, "policy set reloaded");
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, version = %engine.current().version(), "policy set refused; the set in force stays");
                }
            }
        }
    })
}
