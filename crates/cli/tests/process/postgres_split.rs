//! The services split into processes with the ledger, approval and the
//! registry as replicas on one PostgreSQL database: three `switchyard serve
//! --services ledger`, two `approval` and two `registry` processes, the
//! executor talking to one replica of each, the router and people to the
//! others. The executor's built-in agents register through one registry
//! replica and the router, watching the other, routes to them; a job that
//! needs a person is approved through the approval replica the executor
//! does not use, and its budget is read through a ledger replica it never
//! called. A policy file stored through one approval replica (as the
//! service token's holder) then decides in the executor's process, which
//! reads the policy store through the other replica.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::*;

#[test]
fn a_job_runs_through_ledger_and_approval_replicas_on_one_database() {
    let Some(db) = switchyard_testkit::pg::fresh_database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| {
        let p = dir.path().join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let pg_env = [
        ("SWITCHYARD_STORAGE__BACKEND", "postgres"),
        ("SWITCHYARD_STORAGE__POSTGRES__URL", db.as_str()),
        ("SWITCHYARD_STORAGE__POSTGRES__POOL_SIZE", "4"),
    ];
    // The key service stays on its own store; the registry beside it is a
    // replica on the database.
    let registry = serve("registry,auth", &d("registry"), &pg_env);
    let keys = follow_keys(&registry.url());
    let keys = (keys.0, keys.1.as_str());
    let on_pg = [keys, pg_env[0], pg_env[1], pg_env[2]];
    let registry2 = serve("registry", &d("registry2"), &on_pg);
    let router = serve(
        "router",
        &d("router"),
        &[("SWITCHYARD_ROUTER__REGISTRY_URL", &registry.url()), keys],
    );
    let ledgers: Vec<Proc> = (0..3)
        .map(|i| serve("ledger", &d(&format!("ledger{i}")), &on_pg))
        .collect();
    let approvals: Vec<Proc> = (0..2)
        .map(|i| serve("approval", &d(&format!("approval{i}")), &on_pg))
        .collect();
    // The executor registers its agents through the second registry
    // replica; the router watches the first.
    let (r, ro) = (registry2.url(), router.url());
    let (l0, a0) = (ledgers[0].url(), approvals[0].url());
    let to = Remotes {
        keys: keys.1,
        registry: &r,
        router: &ro,
        ledger: &l0,
        approval: &a0,
    };
    let x = serve_executor(&d("executor"), &to, &[]);
    let url = x.url();
    wait_for("built-in agents routable", Duration::from_secs(20), || {
        routed(&ro, &["--capability", "builtin.echo"]).is_some_and(|ids| ids == ["builtin"])
    });

    // A job needing a person, proposed through approval replica 0 ...
    let submitted = submit_as(&url, "examples/jobs/needs_approval.yaml", "alice");
    let (job, run) = (
        submitted["job_id"].as_str().unwrap().to_owned(),
        submitted["run_id"].as_str().unwrap().to_owned(),
    );
    assert_eq!(submitted["state"], "pending");
    // ... is pending on replica 1 too, and approved there by bob.
    let a1 = approvals[1].url();
    let pending = ok(&cli(&a1, &["approval", "list", "--as", "bob"]));
    assert!(pending.contains(&run), "{pending}");
    let own = cli(&a1, &["approval", "approve", &run, "--as", "alice"]);
    assert!(
        String::from_utf8_lossy(&own.stderr).contains("PERMISSION_DENIED"),
        "a submitter cannot approve on any replica: {own:?}"
    );
    ok(&cli(
        &a1,
        &["approval", "approve", &run, "--as", "bob", "-m", "ok"],
    ));
    // The executor, polling replica 0, sees it and runs the job.
    let watched = ok(&cli(&url, &["job", "watch", &job]));
    assert!(watched.contains("job -> completed"), "{watched}");
    let shown = ok(&cli(&a0, &["approval", "show", &run, "--as", "bob"]));
    assert!(
        shown.contains("bob"),
        "the approval, made on replica 1, on replica 0: {shown}"
    );

    // The job's budget, made through ledger replica 0, read through 2.
    let l2 = ledgers[2].url();
    let budgets = ok(&cli(&l2, &["budget", "list"]));
    assert!(budgets.contains(&job), "{budgets}");

    // The policy store: a person (even an admin) may not write it; the
    // service token's holder stores a forbid through replica 1, and the
    // executor's process refuses the same job within its reload.
    let denied = cli(&a1, &["policy", "list", "--as", "admin"]);
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("PERMISSION_DENIED"),
        "{denied:?}"
    );
    let policy = dir.path().join("freeze.cedar");
    std::fs::write(
        &policy,
        r#"@id("freeze") @message("echo jobs are frozen this week")
forbid(principal, action == Action::"submit_job", resource)
  when { context.plan.contains("builtin.echo") };"#,
    )
    .unwrap();
    let as_service = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("SWITCHYARD_URL", &a1)
            .env("SWITCHYARD_TOKEN", SERVICE_TOKEN)
            .current_dir(repo_root())
            .output()
            .unwrap()
    };
    let put = ok(&as_service(&["policy", "put", policy.to_str().unwrap()]));
    assert!(put.contains("stored policy file freeze"), "{put}");
    let listed = ok(&as_service(&["policy", "list"]));
    assert!(listed.contains("freeze"), "{listed}");
    wait_for(
        "the executor's process to decide with the stored policy",
        Duration::from_secs(20),
        || {
            let out = cli(
                &url,
                &[
                    "job",
                    "submit",
                    "examples/jobs/needs_approval.yaml",
                    "--as",
                    "alice",
                ],
            );
            String::from_utf8_lossy(&out.stderr).contains("echo jobs are frozen this week")
        },
    );
    ok(&as_service(&["policy", "delete", "freeze"]));

    assert_eq!(x.terminate(), Some(0));
    for p in approvals.into_iter().chain(ledgers) {
        assert_eq!(p.terminate(), Some(0));
    }
    for p in [router, registry2, registry] {
        assert_eq!(p.terminate(), Some(0));
    }
}
