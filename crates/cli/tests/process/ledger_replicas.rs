//! Three ledger replicas (`switchyard serve --services ledger`, each its own
//! process) on one PostgreSQL database, under 128 concurrent callers that
//! reserve on one replica and settle on another. A monitor reads every
//! budget from every replica while the load runs; one replica is killed
//! with `kill -9` mid-run and PostgreSQL itself crashes and restarts
//! mid-run. No budget is ever seen over its limit, every acknowledged
//! reservation and commit is in the database, and the balances equal the
//! replay of the journal. A quarter of the callers work as approved jobs:
//! each places a hold (an approval's scope) and draws its reservations from
//! it through the other replicas; no draw that fits its hold is ever
//! refused, however hard the others compete for the same budgets.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use switchyard_api::LedgerClient;
use switchyard_proto::ledger::v1::*;
use switchyard_testkit::pg::{PgCluster, Unavailable};

const CALLERS: usize = 128;

fn replica(db: &str, keys_url: &str, data: &std::path::Path) -> Proc {
    serve_ledger(
        data,
        &[
            ("SWITCHYARD_AUTH__KEYS_URL", keys_url),
            ("SWITCHYARD_STORAGE__BACKEND", "postgres"),
            ("SWITCHYARD_STORAGE__POSTGRES__URL", db),
            ("SWITCHYARD_STORAGE__POSTGRES__POOL_SIZE", "12"),
        ],
    )
}

async fn client(url: &str, secret: &str) -> LedgerClient {
    let channel = switchyard_kit::client::authed(
        switchyard_kit::client::connect(url).await.unwrap(),
        Some(switchyard_kit::client::Credential::bearer(secret).unwrap()),
    );
    LedgerClient::remote(channel, 4 << 20)
}

/// The budget tree: (id, parent, token limit).
const TREE: &[(&str, &str, u64)] = &[
    ("org", "", 300_000),
    ("org/a", "org", 180_000),
    ("org/b", "org", 180_000),
    ("org/a/j1", "org/a", 70_000),
    ("org/a/j2", "org/a", 70_000),
    ("org/a/j3", "org/a", 70_000),
    ("org/b/j1", "org/b", 70_000),
    ("org/b/j2", "org/b", 70_000),
    ("org/b/j3", "org/b", 70_000),
];

#[test]
fn three_ledger_replicas_never_overspend_through_a_replica_crash_and_a_database_restart() {
    let cluster = match PgCluster::start() {
        Ok(c) => c,
        Err(Unavailable::Skip(why)) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let db = cluster.database().unwrap();
    let auth_dir = tempfile::tempdir().unwrap();
    let auth = Proc::start(
        &[
            "serve",
            "--services",
            "auth",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            auth_dir.path().to_str().unwrap(),
        ],
        &[],
    );
    let secret = create_key(&auth.url(), "loadgen", "admin,agent");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut replicas: Vec<Option<Proc>> = dirs
        .iter()
        .map(|d| Some(replica(&db, &auth.url(), d.path())))
        .collect();
    let urls: Vec<String> = replicas.iter().map(|p| p.as_ref().unwrap().url()).collect();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let clients: Vec<LedgerClient> = rt.block_on(async {
        let mut cs = Vec::new();
        for u in &urls {
            cs.push(client(u, &secret).await);
        }
        for (i, (id, parent, limit)) in TREE.iter().enumerate() {
            // Budgets created through different replicas.
            cs[i % 3]
                .create_budget(CreateBudgetRequest {
                    budget_id: (*id).into(),
                    parent_id: (*parent).into(),
                    token_limit: Some(*limit),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        cs
    });

    let stop = Arc::new(AtomicBool::new(false));
    let reserved: Arc<Mutex<Vec<String>>> = Arc::default();
    let committed: Arc<Mutex<Vec<String>>> = Arc::default();
    let (refused, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    // Holds placed, draws granted, and draws refused although they fit.
    let (holds, draws) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let draws_refused: Arc<Mutex<Vec<String>>> = Arc::default();
    let leaves: Vec<&str> = TREE
        .iter()
        .map(|t| t.0)
        .filter(|b| b.matches('/').count() == 2)
        .collect();
    let callers: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (on, settle_on) = (clients[i % 3].clone(), clients[(i + 1) % 3].clone());
            let (stop, reserved, committed) = (stop.clone(), reserved.clone(), committed.clone());
            let (refused, failed) = (refused.clone(), failed.clone());
            let (holds, draws, draws_refused) =
                (holds.clone(), draws.clone(), draws_refused.clone());
            let third = clients[(i + 2) % 3].clone();
            let leaf = leaves[i % leaves.len()].to_owned();
            rt.spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    if i.is_multiple_of(4) {
                        let scope = ScopeRun {
                            i,
                            n,
                            leaf: &leaf,
                            replicas: [&on, &settle_on, &third],
                        };
                        match scope.run(&draws, &draws_refused).await {
                            Scope::Held => {
                                holds.fetch_add(1, Ordering::Relaxed);
                            }
                            Scope::Refused => {
                                refused.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Scope::Failed => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                        continue;
                    }
                    let tokens = 50 + (i as u64 * 37 + n * 11) % 450;
                    let req = ReserveRequest {
                        budget_id: leaf.clone(),
                        tokens,
                        idempotency_key: format!("c{i}-{n}"),
                        ..Default::default()
                    };
                    let rid = match on.reserve(req).await {
                        Ok(r) => r.reservation.unwrap().reservation_id,
                        Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            // Spent out for now: others' releases make room.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                    reserved.lock().unwrap().push(rid.clone());
                    // Settled through the next replica: commit most (using
                    // at most what was reserved), release the rest.
                    let settled = if n.is_multiple_of(5) {
                        settle_on
                            .release(ReleaseRequest {
                                reservation_id: rid.clone(),
                                ..Default::default()
                            })
                            .await
                            .map(|_| false)
                    } else {
                        settle_on
                            .commit(CommitRequest {
                                reservation_id: rid.clone(),
                                tokens: tokens / 2 + 1,
                                ..Default::default()
                            })
                            .await
                            .map(|_| true)
                    };
                    match settled {
                        Ok(true) => committed.lock().unwrap().push(rid),
                        Ok(false) => {}
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();

    // The monitor: every budget, from every live replica, never over.
    let checks = Arc::new(AtomicU64::new(0));
    let live: Arc<Mutex<Vec<usize>>> = Arc::new(Mutex::new(vec![0, 1, 2]));
    let monitor = {
        let (clients, stop, checks, live) =
            (clients.clone(), stop.clone(), checks.clone(), live.clone());
        rt.spawn(async move {
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let on = {
                    let live = live.lock().unwrap();
                    live[round % live.len()]
                };
                for (id, _, limit) in TREE {
                    let Ok(b) = clients[on]
                        .get_budget(GetBudgetRequest {
                            budget_id: (*id).into(),
                        })
                        .await
                    else {
                        continue; // a crashed replica or database: errors, never wrong answers
                    };
                    let b = b.budget.unwrap();
                    assert!(
                        b.tokens_reserved + b.tokens_spent <= *limit,
                        "{id} over its limit on replica {on}: {} reserved + {} spent > {limit}",
                        b.tokens_reserved,
                        b.tokens_spent
                    );
                    checks.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    // Progress: calls the ledger answered, granted or refused (the budgets
    // run out during the run: the limits are meant to bind).
    let acked = || reserved.lock().unwrap().len() + refused.load(Ordering::Relaxed) as usize;
    wait_for(
        "1,000 answers across the replicas",
        Duration::from_secs(60),
        || acked() >= 1_000,
    );
    // A replica crashes: its callers see errors, the others carry on.
    live.lock().unwrap().retain(|r| *r != 2);
    replicas[2].take().unwrap().kill9();
    let before = acked();
    wait_for(
        "1,000 more answers after the crash",
        Duration::from_secs(60),
        || acked() >= before + 1_000,
    );
    // The database crashes and comes back: calls fail meanwhile, then work.
    cluster.kill().unwrap();
    let failed_before = failed.load(Ordering::Relaxed);
    wait_for(
        "callers to see the database gone",
        Duration::from_secs(30),
        || failed.load(Ordering::Relaxed) > failed_before + 20,
    );
    cluster.restart().unwrap();
    let before = acked();
    wait_for(
        "1,000 answers after the database restart",
        Duration::from_secs(60),
        || acked() >= before + 1_000,
    );
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for c in callers {
            tokio::time::timeout(Duration::from_secs(30), c)
                .await
                .unwrap()
                .unwrap();
        }
        monitor.await.unwrap();
    });
    assert!(
        checks.load(Ordering::Relaxed) > 100,
        "the monitor read budgets while the load ran"
    );

    // Every acknowledged reservation and commit is in the database.
    let rows = cluster
        .psql(&db, "SELECT id FROM ledger_reservations")
        .unwrap();
    let stored: HashSet<&str> = rows.lines().collect();
    let rows = cluster
        .psql(
            &db,
            "SELECT id FROM ledger_reservations WHERE entry IS NOT NULL",
        )
        .unwrap();
    let stored_commits: HashSet<&str> = rows.lines().collect();
    let reserved = reserved.lock().unwrap().clone();
    let committed = committed.lock().unwrap().clone();
    for r in &reserved {
        assert!(
            stored.contains(r.as_str()),
            "acknowledged reservation {r} is missing"
        );
    }
    for r in &committed {
        assert!(
            stored_commits.contains(r.as_str()),
            "acknowledged commit of {r} is missing"
        );
    }

    // Balances (read by a fresh replica) equal the replay of the journal,
    // and none is over its limit.
    rt.block_on(async {
        let (_trigger, shutdown) = switchyard_kit::shutdown::channel();
        let pg = switchyard_store::pg::Pg::connect(&switchyard_store::pg::PgConfig {
            url: db.clone(),
            pool_size: 2,
            ..Default::default()
        })
        .await
        .unwrap();
        let l = switchyard_ledger::Ledger::open_pg(
            Default::default(),
            pg,
            Arc::new(switchyard_core::SystemClock),
            shutdown,
        )
        .await
        .unwrap();
        let live = l.budgets().await.unwrap();
        assert_eq!(
            live,
            l.replayed_budgets().await.unwrap(),
            "balances differ from the journal replay"
        );
        for b in &live {
            assert!(b.tokens_reserved + b.tokens_spent <= b.token_limit.unwrap());
        }
    });
    let draws_refused = draws_refused.lock().unwrap().clone();
    assert!(
        draws_refused.is_empty(),
        "draws that fit their hold were refused: {draws_refused:?}"
    );
    assert!(
        holds.load(Ordering::Relaxed) > 20 && draws.load(Ordering::Relaxed) > 60,
        "the approved callers worked: {} holds, {} draws",
        holds.load(Ordering::Relaxed),
        draws.load(Ordering::Relaxed)
    );
    eprintln!(
        "{} reservations, {} commits, {} holds with {} draws, {} refused, {} failed calls (crash and restart), {} monitor reads",
        reserved.len(),
        committed.len(),
        holds.load(Ordering::Relaxed),
        draws.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        checks.load(Ordering::Relaxed)
    );
}

/// How one approved job's round went.
enum Scope {
    /// The hold was placed (and its draws made, or failed through a crash).
    Held,
    /// The budget had no room for the hold.
    Refused,
    /// A replica or the database was down.
    Failed,
}

/// One approved job: a hold on its leaf, three draws from it through the
/// other replicas (each a third of it, committed or released there), then
/// the hold released through the third replica.
struct ScopeRun<'a> {
    i: usize,
    n: u64,
    leaf: &'a str,
    replicas: [&'a LedgerClient; 3],
}

impl ScopeRun<'_> {
    async fn run(&self, draws: &AtomicU64, draws_refused: &Mutex<Vec<String>>) -> Scope {
        let (i, n) = (self.i, self.n);
        let [on, settle_on, third] = self.replicas;
        let tokens = 600 + (i as u64 * 31 + n * 7) % 900;
        let hold = match on
            .reserve(ReserveRequest {
                budget_id: self.leaf.to_owned(),
                tokens,
                hold: true,
                idempotency_key: format!("h{i}-{n}"),
                ..Default::default()
            })
            .await
        {
            Ok(r) => r.reservation.unwrap().reservation_id,
            Err(e) if e.code() == tonic::Code::ResourceExhausted => return Scope::Refused,
            Err(_) => return Scope::Failed,
        };
        for d in 0..3u64 {
            let via = [settle_on, third, on][d as usize];
            let drawn = via
                .reserve(ReserveRequest {
                    budget_id: self.leaf.to_owned(),
                    tokens: tokens / 3,
                    hold_id: hold.clone(),
                    idempotency_key: format!("h{i}-{n}-d{d}"),
                    ..Default::default()
                })
                .await;
            let rid = match drawn {
                Ok(r) => r.reservation.unwrap().reservation_id,
                Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                    draws_refused
                        .lock()
                        .unwrap()
                        .push(format!("{hold} draw {d}: {}", e.message()));
                    continue;
                }
                Err(_) => continue,
            };
            draws.fetch_add(1, Ordering::Relaxed);
            let settle = [third, on, settle_on][d as usize];
            // Most draws spend part of what they took (the rest goes back
            // to the hold), some are released whole.
            let _ = if d == 1 {
                settle
                    .release(ReleaseRequest {
                        reservation_id: rid,
                        ..Default::default()
                    })
                    .await
                    .map(|_| ())
            } else {
                settle
                    .commit(CommitRequest {
                        reservation_id: rid,
                        tokens: tokens / 5,
                        ..Default::default()
                    })
                    .await
                    .map(|_| ())
            };
        }
        let _ = third
            .release(ReleaseRequest {
                reservation_id: hold,
                ..Default::default()
            })
            .await;
        Scope::Held
    }
}
