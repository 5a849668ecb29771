//! The ledger and the approval service each alone in a `switchyard serve`
//! process: the CLI against each, and a `kill -9` of the ledger in the middle
//! of a reserve/commit load after which every acknowledged operation is still
//! there and every balance equals the replay of the journal.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use switchyard_api::LedgerClient;
use switchyard_proto::common::v1::Money;
use switchyard_proto::ledger::v1::*;

fn usd(micro_usd: i64) -> Option<Money> {
    Some(Money { micro_usd })
}

async fn ledger(url: &str) -> LedgerClient {
    // The load acts as a tenant admin that also spends (roles admin, agent),
    // with a key the dev admin makes once per data directory.
    let channel = switchyard_kit::client::authed(
        switchyard_kit::client::connect(url).await.unwrap(),
        Some(switchyard_kit::client::Credential::bearer(&loadgen_key(url)).unwrap()),
    );
    LedgerClient::remote(channel, 4 << 20)
}

/// The load generator's key, made with the CLI on first use and kept in the
/// process's credentials directory.
fn loadgen_key(url: &str) -> String {
    let creds = credentials_for(url).unwrap();
    let kept = creds.with_file_name("loadgen.key");
    if let Ok(k) = std::fs::read_to_string(&kept) {
        return k;
    }
    let secret = create_key(url, "loadgen", "admin,agent");
    std::fs::write(&kept, &secret).unwrap();
    secret
}

fn reserve_req(key: &str) -> ReserveRequest {
    ReserveRequest {
        budget_id: "org/job".into(),
        tokens: 100,
        cost: usd(100),
        idempotency_key: key.into(),
        ..Default::default()
    }
}

/// Replays the journal as a watcher sees it: per budget, (reserved, spent)
/// tokens, rolling every record up the given parent map.
async fn replay_over_watch(
    c: &LedgerClient,
    parents: &HashMap<&str, &str>,
) -> HashMap<String, (i64, i64)> {
    let mut stream = c.watch(WatchRequest::default()).await.unwrap();
    let mut held: HashMap<String, (String, i64)> = HashMap::new();
    let mut out: HashMap<String, (i64, i64)> = HashMap::new();
    let mut apply = |budget: &str, reserved: i64, spent: i64| {
        let mut cur = Some(budget);
        while let Some(b) = cur {
            let e = out.entry(b.to_owned()).or_default();
            e.0 += reserved;
            e.1 += spent;
            cur = parents.get(b).copied();
        }
    };
    use futures_util::StreamExt;
    // A marker written last tells the reader when it has the whole journal.
    c.create_budget(CreateBudgetRequest {
        budget_id: "zz-end-marker".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, stream.next())
            .await
            .expect("journal read in time");
        let rec = ev.unwrap().unwrap().record.unwrap();
        let tokens = rec.tokens as i64;
        match rec.kind() {
            RecordKind::BudgetCreated if rec.budget_id == "zz-end-marker" => break,
            RecordKind::Reserved => {
                held.insert(rec.reservation_id.clone(), (rec.budget_id.clone(), tokens));
                apply(&rec.budget_id, tokens, 0);
            }
            RecordKind::Committed | RecordKind::Released | RecordKind::Expired => {
                let (b, t) = held.remove(&rec.reservation_id).unwrap();
                let spent = if rec.kind() == RecordKind::Committed {
                    tokens
                } else {
                    0
                };
                apply(&b, -t, spent);
            }
            _ => {}
        }
    }
    out
}

#[test]
fn a_ledger_killed_mid_load_keeps_every_acknowledged_operation_and_balances_replay() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_str().unwrap().to_owned();
    let proc = serve("ledger,auth", std::path::Path::new(&dir), &[]);
    let url = proc.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();

    let acked_reserves: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let acked_commits: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let tasks = rt.block_on(async {
        let c = ledger(&url).await;
        for (id, parent, limit) in [("org", "", 10_000_000u64), ("org/job", "org", 5_000_000)] {
            c.create_budget(CreateBudgetRequest {
                budget_id: id.into(),
                parent_id: parent.into(),
                token_limit: Some(limit),
                ..Default::default()
            })
            .await
            .unwrap();
        }
        let mut tasks = Vec::new();
        for t in 0..16 {
            let (c, reserves, commits) = (c.clone(), acked_reserves.clone(), acked_commits.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..100_000 {
                    let key = format!("t{t}-{i}");
                    let Ok(r) = c.reserve(reserve_req(&key)).await else {
                        return;
                    };
                    let rid = r.reservation.unwrap().reservation_id;
                    reserves.lock().unwrap().push((key, rid.clone()));
                    if i % 4 == 3 {
                        continue; // leave some reservations open
                    }
                    let commit = CommitRequest {
                        reservation_id: rid.clone(),
                        tokens: 60,
                        cost: usd(60),
                        ..Default::default()
                    };
                    let Ok(r) = c.commit(commit).await else {
                        return;
                    };
                    commits
                        .lock()
                        .unwrap()
                        .push((rid, r.entry.unwrap().entry_id));
                }
            }));
        }
        tasks
    });
    wait_for(
        "a few hundred acknowledged commits",
        Duration::from_secs(30),
        || acked_commits.lock().unwrap().len() >= 300,
    );
    proc.kill9();
    rt.block_on(async {
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .unwrap()
                .unwrap();
        }
    });
    let reserves = acked_reserves.lock().unwrap().clone();
    let commits = acked_commits.lock().unwrap().clone();

    let proc = serve("ledger,auth", std::path::Path::new(&dir), &[]);
    rt.block_on(async {
        let c = ledger(&proc.url()).await;
        let mut entries = Vec::new();
        let mut page_token = String::new();
        loop {
            let r = c
                .list_entries(ListEntriesRequest {
                    budget_id: "org".into(),
                    page_size: 1000,
                    page_token,
                    ..Default::default()
                })
                .await
                .unwrap();
            entries.extend(r.entries);
            page_token = r.next_page_token;
            if page_token.is_empty() {
                break;
            }
        }
        let entry_ids: HashSet<_> = entries.iter().map(|e| e.entry_id.clone()).collect();
        for (rid, eid) in &commits {
            assert!(entry_ids.contains(eid), "acknowledged commit of {rid} lost");
        }
        let committed: HashSet<_> = entries.iter().map(|e| e.reservation_id.clone()).collect();
        // Every acknowledged reservation survived: a retry returns it, whether
        // it is still open or was committed since.
        let started = Instant::now();
        for (key, rid) in reserves.iter().step_by(7) {
            let again = c
                .reserve(reserve_req(key))
                .await
                .unwrap()
                .reservation
                .unwrap();
            assert_eq!(
                &again.reservation_id, rid,
                "acknowledged reservation {key} lost"
            );
            assert!(started.elapsed() < Duration::from_secs(60));
        }

        let org = c
            .get_budget(GetBudgetRequest {
                budget_id: "org".into(),
            })
            .await
            .unwrap()
            .budget
            .unwrap();
        assert_eq!(
            org.tokens_spent,
            60 * entries.len() as u64,
            "spend equals the journal entries"
        );
        assert_eq!(
            org.tokens_spent,
            entries.iter().map(|e| e.tokens).sum::<u64>()
        );
        let open_acked = reserves
            .iter()
            .filter(|(_, rid)| !committed.contains(rid))
            .count() as u64;
        assert!(
            org.tokens_reserved >= 100 * open_acked,
            "acknowledged open reservations still held"
        );
        assert!(org.tokens_reserved + org.tokens_spent <= 10_000_000);

        let parents = HashMap::from([("org/job", "org")]);
        let replay = replay_over_watch(&c, &parents).await;
        for id in ["org", "org/job"] {
            let b = c
                .get_budget(GetBudgetRequest {
                    budget_id: id.into(),
                })
                .await
                .unwrap()
                .budget
                .unwrap();
            assert_eq!(
                replay[id],
                (b.tokens_reserved as i64, b.tokens_spent as i64),
                "{id}: balances equal the replay of the journal"
            );
        }
    });
    assert_eq!(proc.terminate(), Some(0));
}

#[test]
fn ledger_and_approval_each_serve_alone_and_the_cli_drives_them() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path();
    // The ledger's process also keeps the API keys; the approval process
    // follows its key set, and each calls the other with the service token.
    let ledger_proc = serve("ledger,auth", dir, &[]);
    let approval_proc = serve(
        "approval",
        dir,
        &[("SWITCHYARD_AUTH__KEYS_URL", &ledger_proc.url())],
    );
    let (l, a) = (ledger_proc.url(), approval_proc.url());
    wait_for("ledger SERVING", Duration::from_secs(10), || {
        health(&ledger_proc.addr, "switchyard.ledger.v1.LedgerService") == SERVING
    });
    assert_eq!(
        health(&ledger_proc.addr, "switchyard.approval.v1.ApprovalService"),
        None,
        "not hosted here"
    );

    ok(&cli(
        &l,
        &[
            "budget", "create", "org/acme", "--tokens", "1000", "--usd", "2.50",
        ],
    ));
    ok(&cli(
        &l,
        &[
            "budget",
            "create",
            "org/acme/search",
            "--parent",
            "org/acme",
            "--tokens",
            "5000",
        ],
    ));
    let list = ok(&cli(&l, &["budget", "list"]));
    assert!(list.contains("org/acme/search  org/acme"), "{list}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&cli(&l, &["budget", "get", "org/acme", "-o", "json"]))).unwrap();
    assert_eq!(json["cost_limit_micro_usd"], 2_500_000);
    let bad = cli(&l, &["budget", "create", "org/acme/x", "--parent", "nope"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("BUDGET_NOT_FOUND"));
    let entries = ok(&cli(&l, &["budget", "entries", "--budget", "org/acme"]));
    assert!(entries.contains("total_cost: $0.000000"), "{entries}");

    let out = ok(&cli(
        &a,
        &[
            "approval",
            "propose",
            "-f",
            "examples/runs/draft_docs.json",
            "-f",
            "examples/runs/lint_report.yaml",
            "--as",
            "alice",
        ],
    ));
    assert!(out.contains("approved by policy zero-cost"), "{out}");
    let list = ok(&cli(&a, &["approval", "list"]));
    let first = list.lines().nth(1).unwrap();
    assert!(
        first.contains("proposed") && first.contains("$0.420000"),
        "pending first, with its estimate:\n{list}"
    );
    let runs: serde_json::Value =
        serde_json::from_str(&ok(&cli(&a, &["approval", "list", "-o", "json"]))).unwrap();
    let id = runs["items"][0]["run_id"].as_str().unwrap().to_owned();

    // alice proposed it; she cannot approve (no approver role), and the
    // audit shows who did.
    let own = cli(&a, &["approval", "approve", &id, "--as", "alice"]);
    assert!(!own.status.success());
    assert!(String::from_utf8_lossy(&own.stderr).contains("PERMISSION_DENIED"));
    ok(&cli(
        &a,
        &["approval", "approve", &id, "--as", "bob", "-m", "scope ok"],
    ));
    let b1 = ok(&cli(&a, &["approval", "bundle", &id, "--as", "bob"]));
    let b2 = ok(&cli(&a, &["approval", "bundle", &id, "--as", "bob"]));
    assert_eq!(b1, b2, "deterministic bundle");
    let bundle: serde_json::Value = serde_json::from_str(&b1).unwrap();
    let hash = bundle["context_pack"]["hash"].as_str().unwrap();
    let result = data.path().join("result.md");
    std::fs::write(&result, "Proposed changeset: docs/contracts.md\n").unwrap();
    let result = result.to_str().unwrap();
    let import = |hash: &str| {
        let args = [
            "approval",
            "import",
            &id,
            "-f",
            result,
            "--context-hash",
            hash,
            "--as",
            "bob",
        ];
        cli(&a, &args)
    };
    let wrong = import("sha256:00000000");
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("CONTEXT_HASH_MISMATCH"));
    ok(&import(hash));
    let show: serde_json::Value =
        serde_json::from_str(&ok(&cli(&a, &["approval", "show", &id, "-o", "json"]))).unwrap();
    assert_eq!(show["run"]["status"], "completed");
    let events: Vec<_> = show["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        [
            "proposed",
            "context_pack_built",
            "approved",
            "prompt_bundle_exported",
            "prompt_bundle_exported",
            "claimed",
            "manual_result_imported"
        ]
    );
    assert_eq!(approval_proc.terminate(), Some(0));
    assert_eq!(ledger_proc.terminate(), Some(0));
}
