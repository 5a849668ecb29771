//! The PostgreSQL backend's plumbing against a real throwaway cluster:
//! migrations applied once even when several replicas start together, and
//! lease rows that change hands only when lapsed, fencing the old holder.

#![allow(clippy::unwrap_used)] // a failed call is a failed test

use switchyard_store::pg::{COMMON_MIGRATIONS, Migration, Pg, PgConfig};
use switchyard_testkit::pg::{Unavailable, shared};

/// A pool on a fresh database of the shared cluster, or `None` (printed)
/// when the run skips PostgreSQL.
async fn pg() -> Option<Pg> {
    let cluster = match shared() {
        Ok(c) => c,
        Err(Unavailable::Skip(why)) => {
            eprintln!("skipped: {why}");
            return None;
        }
    };
    let url = cluster.database().unwrap();
    let cfg = PgConfig {
        url,
        pool_size: 8,
        ..Default::default()
    };
    Some(Pg::connect(&cfg).await.unwrap())
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "widgets",
        sql: "CREATE TABLE widgets (id TEXT PRIMARY KEY)",
    },
    Migration {
        version: 2,
        name: "widget sizes",
        sql: "ALTER TABLE widgets ADD COLUMN size INT NOT NULL DEFAULT 0",
    },
];

#[tokio::test]
async fn migrations_apply_once_when_replicas_start_together() {
    let Some(pg) = pg().await else { return };
    // Eight "replicas" migrate at once: each version runs exactly once (a
    // second run of either statement would fail).
    let runs = (0..8).map(|_| {
        let pg = pg.clone();
        tokio::spawn(async move { pg.migrate("widgets", MIGRATIONS).await })
    });
    let mut applied = 0;
    for r in runs {
        applied += r.await.unwrap().unwrap();
    }
    assert_eq!(applied, 2, "each version applied by exactly one replica");
    // And again later: nothing to do.
    assert_eq!(pg.migrate("widgets", MIGRATIONS).await.unwrap(), 0);
    let c = pg.client().await.unwrap();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM switchyard_migrations WHERE service = 'widgets'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
}

#[tokio::test]
async fn a_failed_migration_leaves_nothing_recorded_and_says_which() {
    let Some(pg) = pg().await else { return };
    let broken = [Migration {
        version: 1,
        name: "broken",
        sql: "CREATE TABLE ok_part (id INT); SELECT * FROM no_such_table",
    }];
    let e = pg.migrate("broken", &broken).await.unwrap_err().to_string();
    assert!(
        e.contains("migration broken 1 (broken)") && e.contains("no_such_table"),
        "{e}"
    );
    // Rolled back whole: neither the version row nor the first table.
    let c = pg.client().await.unwrap();
    let tables: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'ok_part'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0);
    assert_eq!(pg.migrate("broken", &[]).await.unwrap(), 0);
}

#[tokio::test]
async fn a_lease_changes_hands_only_when_lapsed_and_fences_the_old_holder() {
    let Some(pg) = pg().await else { return };
    pg.migrate("switchyard", COMMON_MIGRATIONS).await.unwrap();
    let t1 = pg.lease("sweeper", "a", 1_000, 500).await.unwrap().unwrap();
    // Held: b is refused; a renews with the same token.
    assert_eq!(pg.lease("sweeper", "b", 1_200, 500).await.unwrap(), None);
    assert_eq!(
        pg.lease("sweeper", "a", 1_400, 500).await.unwrap(),
        Some(t1)
    );
    // Lapsed (a's renewal ran to 1 900): b takes it with a newer token.
    let t2 = pg.lease("sweeper", "b", 2_000, 500).await.unwrap().unwrap();
    assert!(t2 > t1);
    // a's fenced work is refused, b's is not.
    let mut c = pg.client().await.unwrap();
    let tx = c.transaction().await.unwrap();
    assert!(!pg.holds(&tx, "sweeper", "a", t1).await.unwrap());
    assert!(pg.holds(&tx, "sweeper", "b", t2).await.unwrap());
}

#[tokio::test]
async fn an_unreachable_database_is_a_clear_error_naming_it_without_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = PgConfig {
        url: format!("postgres://app:hunter2@127.0.0.1:{port}/db"),
        connect_timeout_ms: 2_000,
        ..Default::default()
    };
    let e = Pg::connect(&cfg).await.unwrap_err().to_string();
    assert!(
        e.contains("unreachable") && e.contains("app:***@127.0.0.1"),
        "{e}"
    );
    assert!(!e.contains("hunter2"), "{e}");
}

const TAIL: &str = "SELECT seq, data FROM tlog WHERE seq > $1 ORDER BY seq LIMIT 100";

async fn tail_table(db: &Pg) {
    db.client()
        .await
        .unwrap()
        .batch_execute("CREATE TABLE tlog (seq BIGSERIAL PRIMARY KEY, data BYTEA)")
        .await
        .unwrap();
}

async fn append(db: &Pg, data: &[u8]) {
    db.client()
        .await
        .unwrap()
        .execute("INSERT INTO tlog (data) VALUES ($1)", &[&data])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_rolled_back_number_is_passed_once_no_transaction_could_fill_it_not_after_the_grace() {
    use futures_util::StreamExt;
    let Some(db) = pg().await else { return };
    tail_table(&db).await;
    append(&db, b"one").await;
    // A transaction takes number 2 and rolls back: it never fills.
    let mut c = db.client().await.unwrap();
    let tx = c.transaction().await.unwrap();
    tx.execute("INSERT INTO tlog (data) VALUES ('lost')", &[])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    drop(c);
    append(&db, b"three").await;
    let started = std::time::Instant::now();
    let got: Vec<(u64, Vec<u8>)> = switchyard_store::pg::tail(db.clone(), TAIL, 0)
        .take(2)
        .map(|r| r.unwrap())
        .collect()
        .await;
    assert_eq!(got, vec![(1, b"one".to_vec()), (3, b"three".to_vec())]);
    let took = started.elapsed();
    assert!(
        took < switchyard_store::pg::GAP_GRACE / 2,
        "the gap cost {took:?}: it waited for the fallback grace, not for the transactions"
    );
}

#[tokio::test]
async fn a_number_held_by_a_running_transaction_is_waited_for_and_never_skipped() {
    use futures_util::StreamExt;
    let Some(db) = pg().await else { return };
    tail_table(&db).await;
    append(&db, b"one").await;
    // Number 2 is taken by a transaction still running when 3 commits.
    let mut c = db.client().await.unwrap();
    let tx = c.transaction().await.unwrap();
    tx.execute("INSERT INTO tlog (data) VALUES ('two')", &[])
        .await
        .unwrap();
    append(&db, b"three").await;
    let stream = switchyard_store::pg::tail(db.clone(), TAIL, 0);
    // Bounded: a reader that skipped 2 would wait for a third row forever.
    let reader = tokio::spawn(async move {
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            stream.take(3).map(|r| r.unwrap().1).collect::<Vec<_>>(),
        )
        .await
        .expect("2 was skipped: the reader never saw three rows")
    });
    // Longer than the least wait at a gap: a reader going by time alone
    // would have moved past 2 by now.
    tokio::time::sleep(switchyard_store::pg::GAP_MIN * 3).await;
    tx.commit().await.unwrap();
    let got = reader.await.unwrap();
    assert_eq!(
        got,
        vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()],
        "in order, none skipped"
    );
}
