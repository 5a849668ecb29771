//! The registry and the router as separate `switchyard serve` processes, the
//! CLI talking to each: register, route, fallback by exclusion, lapse and
//! heartbeat, crash durability and graceful shutdown.

use crate::support::*;
use std::time::Duration;

/// `switchyard serve --services router` on a free port, watching `registry_url`.
fn start_router(registry_url: &str) -> Proc {
    Proc::start(
        &[
            "serve",
            "--services",
            "router",
            "--listen",
            "127.0.0.1:0",
            "--registry-url",
            registry_url,
        ],
        // The registry's process keeps the API keys; the router follows them.
        &[("SWITCHYARD_AUTH__KEYS_URL", registry_url)],
    )
}

#[test]
fn split_mode_registers_routes_lapses_and_survives_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap();
    let fast_leases = [
        ("SWITCHYARD_REGISTRY__LEASE_TTL_SECS", "2"),
        ("SWITCHYARD_REGISTRY__SWEEP_INTERVAL_MS", "100"),
    ];
    let registry_args = [
        "serve",
        "--services",
        "registry,auth",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir,
    ];
    let registry = Proc::start(&registry_args, &fast_leases);
    let router = start_router(&registry.url());
    let (reg, rt) = (registry.url(), router.url());
    // the router is ready (for a readiness probe) once it has the registry's snapshot
    wait_for("router SERVING", Duration::from_secs(10), || {
        health(&router.addr, "switchyard.router.v1.RouterService") == SERVING
            && health(&router.addr, "") == SERVING
    });

    ok(&cli(
        &reg,
        &[
            "tool",
            "register",
            "-f",
            "examples/tools/web_search.yaml",
            "-f",
            "examples/tools/kv.yaml",
            "-f",
            "examples/tools/file_manager.yaml",
        ],
    ));
    let out = ok(&cli(
        &reg,
        &[
            "agent",
            "register",
            "-f",
            "examples/agents/nlp_analyst.yaml",
            "-f",
            "examples/agents/nlp_budget.yaml",
            "-f",
            "examples/agents/pdf_extractor.yaml",
        ],
    ));
    assert!(out.contains("registered agent nlp_analyst"), "{out}");

    // the router process learns about them through the registry watch
    wait_for(
        "router sees both nlp agents",
        Duration::from_secs(10),
        || routed(&rt, &["--capability", "nlp_analysis"]).is_some_and(|v| v.len() == 2),
    );
    // cheaper, faster nlp_budget outranks nlp_analyst: 0.69 vs 0.495 (see README)
    assert_eq!(
        routed(&rt, &["--capability", "nlp_analysis"]).unwrap(),
        ["nlp_budget", "nlp_analyst"]
    );
    assert_eq!(
        routed(
            &rt,
            &["--capability", "nlp_analysis", "--exclude", "nlp_budget"]
        )
        .unwrap(),
        ["nlp_analyst"]
    );
    let table = ok(&cli(&rt, &["route", "--capability", "nlp_analysis"]));
    assert!(table.starts_with("RANK  AGENT"), "{table}");

    // no heartbeats: every lease (2 s) lapses and routing refuses
    wait_for("all agents lapse", Duration::from_secs(10), || {
        routed(&rt, &["--capability", "nlp_analysis"]).is_none()
    });
    let out = cli(&rt, &["route", "--capability", "nlp_analysis"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CAPABILITY_UNAVAILABLE"));
    wait_for(
        "all three listed as lapsed",
        Duration::from_secs(10),
        || {
            ok(&cli(&reg, &["agent", "list", "--status", "lapsed"]))
                .lines()
                .count()
                == 4 // header + 3
        },
    );

    // a heartbeat brings one back
    ok(&cli(&reg, &["agent", "heartbeat", "nlp_analyst"]));
    wait_for("nlp_analyst back", Duration::from_secs(10), || {
        routed(&rt, &["--capability", "nlp_analysis"]).is_some_and(|v| v == ["nlp_analyst"])
    });

    // kill -9 the registry: every acknowledged registration is on disk
    registry.kill9();
    let registry = Proc::start(&registry_args, &[]);
    let got = ok(&cli(
        &registry.url(),
        &["agent", "get", "pdf_extractor", "-o", "json"],
    ));
    let v: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(v["trust_score"], 88);
    assert_eq!(
        ok(&cli(&registry.url(), &["tool", "list", "-o", "json"]))
            .matches("\"name\"")
            .count(),
        3
    );

    assert_eq!(
        router.terminate(),
        Some(0),
        "router exits cleanly on SIGTERM"
    );
    assert_eq!(
        registry.terminate(),
        Some(0),
        "registry exits cleanly on SIGTERM"
    );
}

#[test]
fn router_without_a_reachable_registry_is_not_serving_and_refuses_routes() {
    let router = start_router("http://127.0.0.1:1");
    assert_eq!(
        health(&router.addr, "switchyard.router.v1.RouterService"),
        NOT_SERVING
    );
    assert_eq!(health(&router.addr, ""), NOT_SERVING);
    assert_eq!(
        health(&router.addr, "liveness"),
        SERVING,
        "alive, so a liveness probe must not restart it"
    );
    // Nor can it verify keys: its key source is the same unreachable
    // process, so a keyed call is UNAVAILABLE, not "invalid".
    let out = cli(
        &router.url(),
        &[
            "route",
            "--capability",
            "x",
            "--token",
            &format!("syk_0_{}", "0".repeat(64)),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("SERVICE_UNAVAILABLE"),
        "{out:?}"
    );
    assert_eq!(
        router.terminate(),
        Some(0),
        "shuts down cleanly while still waiting for the registry"
    );
}

#[test]
fn a_follower_is_not_ready_on_any_service_until_it_can_authenticate() {
    let data = tempfile::tempdir().unwrap();
    let ledger =
        |keys_url: &str| serve_ledger(data.path(), &[("SWITCHYARD_AUTH__KEYS_URL", keys_url)]);
    // Its key source is unreachable: it can verify no one, so a readiness
    // probe naming its service must not send users to it.
    let cut_off = ledger("http://127.0.0.1:1");
    let service = "switchyard.ledger.v1.LedgerService";
    assert_eq!(health(&cut_off.addr, service), NOT_SERVING);
    assert_eq!(health(&cut_off.addr, ""), NOT_SERVING);
    assert_eq!(health(&cut_off.addr, "liveness"), SERVING);
    assert_eq!(cut_off.terminate(), Some(0));
    // Following a live auth service, it becomes ready once the key set
    // arrives, and then a key works.
    let (dev, _dev_data) = Proc::dev(&[]);
    let following = ledger(&dev.url());
    let ready = (0..200).any(|_| {
        let ok = health(&following.addr, service) == SERVING;
        if !ok {
            std::thread::sleep(Duration::from_millis(50));
        }
        ok
    });
    assert!(ready, "the follower never became ready");
    let out = cli(
        &following.url(),
        &["budget", "list", "--token", &token(&dev.url(), "admin")],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(following.terminate(), Some(0));
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn cli_errors_print_reason_and_fields_and_exit_nonzero() {
    let (dev, data) = Proc::dev(&[]);
    let bad = data.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "id: Bad\nendpoint: nope\ncapabilities: [{name: x}]\ntrust_score: 101\n",
    )
    .unwrap();
    let out = cli(
        &dev.url(),
        &["agent", "register", "-f", bad.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("INVALID_ARGUMENT"), "{err}");
    for field in ["agent.id", "agent.endpoint", "agent.trust_score"] {
        assert!(err.contains(field), "{field} missing from: {err}");
    }

    let out = cli(&dev.url(), &["agent", "get", "nobody"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("AGENT_NOT_FOUND"));

    // nothing listening: a clear error, not a hang
    let out = cli("http://127.0.0.1:1", &["agent", "list"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("cannot reach Switchyard at http://127.0.0.1:1")
    );
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn dump_config_shows_layered_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "[registry]\nlease_ttl_secs = 45\n[router.scoring.weights]\ntrust = 0.4\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "dev",
            "--dump-config",
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:9999",
        ])
        .env("SWITCHYARD_ROUTER__DEFAULT_MIN_TRUST", "60")
        .output()
        .unwrap();
    let text = ok(&out);
    let v: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(
        v["registry"]["lease_ttl_secs"].as_integer(),
        Some(45),
        "file"
    );
    assert_eq!(
        v["router"]["default_min_trust"].as_integer(),
        Some(60),
        "env"
    );
    assert_eq!(
        v["server"]["listen"].as_str(),
        Some("127.0.0.1:9999"),
        "flag"
    );
    assert_eq!(
        v["router"]["scoring"]["weights"]["trust"].as_float(),
        Some(0.4)
    );

    std::fs::write(&file, "[registry]\nlease_tll_secs = 45\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["dev", "--dump-config", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("lease_tll_secs"));
}
