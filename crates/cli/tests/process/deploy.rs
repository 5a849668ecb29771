//! The deployment files stay true to the binary: every container's arguments
//! are accepted by `switchyard` (checked with `--dump-config`), ports, probes
//! and Service targets agree, probes ask for the services the container
//! hosts, and the router's registry URL names the registry's Service.

#![allow(clippy::unwrap_used)] // test helpers: a failed read is a failed test

use crate::support::*;
use serde_json::Value;

/// The base layout's resources, read from its files.
fn base_files() -> Vec<Value> {
    let dir = repo_root().join("deploy/k8s/base");
    let kustomization: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap())
            .unwrap();
    kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            serde_saphyr::from_str(&std::fs::read_to_string(dir.join(f.as_str().unwrap())).unwrap())
                .unwrap()
        })
        .collect()
}

/// The layout in `deploy/k8s/{dir}` as `kubectl kustomize` renders it, or
/// `None` (said on stderr) when kubectl is not installed.
fn rendered(dir: &str) -> Option<Vec<Value>> {
    let path = repo_root().join("deploy/k8s").join(dir);
    let Ok(out) = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
    else {
        eprintln!("skipped rendering {dir}: kubectl is not installed");
        return None;
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some(
        text.split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| serde_saphyr::from_str(d).unwrap())
            .collect(),
    )
}

/// The effective configuration for `args`, as the binary computes it.
fn dump_config(args: &[String], env: &[(String, String)]) -> toml::Table {
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    a.push("--dump-config");
    let out = std::process::Command::new(BIN)
        .args(&a)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "switchyard {a:?} refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap()
}

fn proto_service(role: &str) -> String {
    if role == "executor" {
        return "switchyard.executor.v1.JobService".into();
    }
    format!(
        "switchyard.{role}.v1.{}Service",
        role[..1].to_uppercase() + &role[1..]
    )
}

#[test]
fn kubernetes_workloads_match_the_binary_and_each_other() {
    // As Kustomize renders it (what `kubectl apply -k deploy/k8s` sends),
    // else from the base's files.
    let all = rendered(".").unwrap_or_else(base_files);
    let workloads = check(&all);
    assert_eq!(
        workloads.len(),
        7,
        "registry, router, ledger, approval, executor, gateway, agents"
    );
    for w in workloads {
        let (_, cfg) = container_config(w);
        assert_eq!(cfg["storage"]["backend"].as_str(), Some("sled"));
    }
}

#[test]
fn the_postgres_overlay_runs_every_stateful_service_as_replicas_on_the_database() {
    let Some(all) = rendered("overlays/postgres") else {
        return;
    };
    let workloads = check(&all);
    assert_eq!(workloads.len(), 8, "the base's seven and auth on its own");
    let secret = all
        .iter()
        .find(|m| m["kind"] == "Secret" && m["metadata"]["name"] == "switchyard-postgres")
        .expect("a Secret for the database URL");
    assert!(secret["stringData"]["url"].as_str().is_some());
    for (name, replicas) in [
        ("switchyard-ledger", 3),
        ("switchyard-approval", 2),
        ("switchyard-registry", 2),
        ("switchyard-executor", 3),
    ] {
        let w = workloads
            .iter()
            .find(|w| w["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(w["kind"], "Deployment", "{name}");
        assert_eq!(w["spec"]["replicas"].as_i64(), Some(replicas), "{name}");
        let (c, cfg) = container_config(w);
        assert_eq!(
            cfg["storage"]["backend"].as_str(),
            Some("postgres"),
            "{name}"
        );
        // The URL comes from the Secret, mounted where the config reads it.
        let file = cfg["storage"]["postgres"]["url_file"].as_str().unwrap();
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| file.starts_with(m["mountPath"].as_str().unwrap()) && m["name"] == "postgres")
            .unwrap_or_else(|| panic!("{name}: {file} is not mounted"));
        let volume = w["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert_eq!(
            volume["secret"]["secretName"], "switchyard-postgres",
            "{name}"
        );
        // A disruption budget keeps some of them serving.
        let pdb = all
            .iter()
            .find(|m| {
                m["kind"] == "PodDisruptionBudget"
                    && m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
                        == w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
            })
            .unwrap_or_else(|| panic!("{name}: no PodDisruptionBudget"));
        let min = pdb["spec"]["minAvailable"].as_i64().unwrap();
        assert!(
            (1..replicas).contains(&min),
            "{name}: minAvailable {min} of {replicas}"
        );
    }
    // Everything lands in the namespace, labelled as Switchyard's.
    for m in &all {
        if m["kind"] != "Namespace" {
            assert_eq!(
                m["metadata"]["namespace"], "switchyard",
                "{}",
                m["metadata"]["name"]
            );
        }
        assert_eq!(
            m["metadata"]["labels"]["app.kubernetes.io/part-of"],
            "switchyard"
        );
    }
    // The executor replicas are named by their pods, and stop gracefully
    // (handing their jobs back) within the pod's grace period.
    let x = workloads
        .iter()
        .find(|w| w["metadata"]["name"] == "switchyard-executor")
        .unwrap();
    let env = x["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let replica_id = env
        .iter()
        .find(|e| e["name"] == "SWITCHYARD_EXECUTOR__REPLICA_ID")
        .expect("executor replicas named");
    assert_eq!(
        replica_id["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert!(
        x["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .is_some_and(|s| s >= 30)
    );
    // No StatefulSet of the four is left from the base.
    for name in [
        "switchyard-ledger",
        "switchyard-approval",
        "switchyard-registry",
        "switchyard-executor",
    ] {
        assert!(
            !all.iter()
                .any(|m| m["kind"] == "StatefulSet" && m["metadata"]["name"] == name),
            "{name} is still a StatefulSet"
        );
    }
}

/// The Service selecting workload `w`'s pods.
fn service_of<'a>(services: &[&'a Value], w: &Value) -> Option<&'a Value> {
    let labels = &w["spec"]["template"]["metadata"]["labels"];
    services.iter().copied().find(|s| {
        s["spec"]["selector"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| &labels[k] == v)
    })
}

/// A container's arguments.
fn args_of(c: &Value) -> Vec<String> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The first container of workload `w` and its effective configuration.
fn container_config(w: &Value) -> (&Value, toml::Table) {
    let c = &w["spec"]["template"]["spec"]["containers"][0];
    (c, dump_config(&args_of(c), &env_of(c)))
}

/// A container's plain environment (values from Secrets come out empty).
fn env_of(c: &Value) -> Vec<(String, String)> {
    c["env"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|v| {
                    let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
                    (s("name"), s("value"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Checks every workload of `all` against the binary and the Services; the
/// workloads.
fn check(all: &[Value]) -> Vec<&Value> {
    let services: Vec<&Value> = all.iter().filter(|m| m["kind"] == "Service").collect();
    let workloads: Vec<&Value> = all
        .iter()
        .filter(|m| m["kind"] == "Deployment" || m["kind"] == "StatefulSet")
        .collect();
    // Where the API keys live: the Service of the workload hosting auth.
    let keys_host = workloads
        .iter()
        .find(|w| {
            let args = &w["spec"]["template"]["spec"]["containers"][0]["args"];
            args.as_array().unwrap().windows(2).any(|p| {
                p[0] == "--services" && p[1].as_str().unwrap().split(',').any(|r| r == "auth")
            })
        })
        .map(|w| {
            let svc = service_of(&services, w).expect("a Service for the auth workload");
            format!("https://{}:7600", svc["metadata"]["name"].as_str().unwrap())
        })
        .expect("a workload hosts the auth service");

    for w in &workloads {
        let name = w["metadata"]["name"].as_str().unwrap();
        let (c, cfg) = container_config(w);
        let args = args_of(c);

        let port = c["ports"][0]["containerPort"].as_i64().unwrap();
        let listen = cfg["server"]["listen"].as_str().unwrap();
        assert_eq!(
            listen,
            format!("0.0.0.0:{port}"),
            "{name}: listens on its container port"
        );
        // kubelet probes speak neither TLS nor credentials: a TLS workload's
        // probes go to its plaintext health-only port.
        let probe_port = match cfg["server"].get("health_listen").and_then(|h| h.as_str()) {
            Some(h) => {
                let health = c["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == "health")
                    .unwrap_or_else(|| panic!("{name}: no health port"));
                let hp = health["containerPort"].as_i64().unwrap();
                assert_eq!(h, format!("0.0.0.0:{hp}"), "{name}: health port");
                hp
            }
            None => port,
        };
        assert_eq!(
            c["readinessProbe"]["grpc"]["port"].as_i64(),
            Some(probe_port),
            "{name}"
        );
        assert_eq!(
            c["livenessProbe"]["grpc"]["port"].as_i64(),
            Some(probe_port),
            "{name}"
        );
        if cfg["server"].get("tls").is_some() {
            assert_ne!(probe_port, port, "{name}: probes must not hit the TLS port");
        }
        assert_eq!(
            c["livenessProbe"]["grpc"]["service"], "liveness",
            "{name}: liveness must not depend on readiness"
        );

        // `serve --services a,b` hosts services; `agents serve` hosts agents.
        let roles = match args.iter().position(|a| a == "--services") {
            Some(i) => args[i + 1].clone(),
            None => {
                assert_eq!(args[..2], ["agents", "serve"], "{name}");
                "agent".to_owned()
            }
        };
        let listen = if roles == "agent" {
            cfg["agents"]["listen"].as_str().unwrap()
        } else {
            listen
        };
        assert_eq!(
            listen,
            format!("0.0.0.0:{port}"),
            "{name}: serves on its container port"
        );
        let ready_on = c["readinessProbe"]["grpc"]["service"].as_str().unwrap();
        // The gateway hosts no gRPC service: it is ready when the server as
        // a whole is ("", once its key set has arrived).
        assert!(
            roles.split(',').any(|r| proto_service(r) == ready_on)
                || (roles == "gateway" && ready_on.is_empty()),
            "{name}: readiness probes {ready_on}, hosts {roles}"
        );
        // The gateway's doors listen on the container ports named for them.
        if roles == "gateway" {
            for door in ["http", "resp"] {
                let p = c["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == door)
                    .unwrap_or_else(|| panic!("{name}: no {door} port"));
                let want = format!("0.0.0.0:{}", p["containerPort"]);
                assert_eq!(
                    cfg["gateway"][door]["listen"].as_str(),
                    Some(want.as_str()),
                    "{name}"
                );
            }
        }

        // a Service selects this workload and targets its port
        let svc = service_of(&services, w).unwrap_or_else(|| panic!("no Service selects {name}"));
        assert_eq!(
            svc["spec"]["ports"][0]["targetPort"], c["ports"][0]["name"],
            "{name}"
        );

        // Every URL a workload calls names a Service and its port.
        let urls = [
            cfg["router"].get("registry_url"),
            cfg["executor"].get("registry_url"),
            cfg["executor"].get("router_url"),
            cfg["executor"].get("ledger_url"),
            cfg["executor"].get("approval_url"),
            cfg["executor"].get("advertise_url"),
            cfg["agents"].get("registry_url"),
            cfg["agents"].get("ledger_url"),
            cfg["agents"].get("executor_url"),
            cfg["agents"].get("advertise_url"),
            cfg["gateway"].get("executor_url"),
            cfg["gateway"].get("approval_url"),
            cfg["gateway"].get("registry_url"),
            cfg["gateway"].get("ledger_url"),
            cfg["gateway"].get("router_url"),
        ];
        let calls: Vec<&str> = if roles == "agent"
            || roles.contains("router")
            || roles.contains("executor")
            || roles.contains("gateway")
        {
            urls.iter()
                .flatten()
                .filter_map(|u| u.as_str())
                .filter(|u| !u.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        if roles == "agent" {
            assert_eq!(
                calls.len(),
                4,
                "{name}: the agents reach the registry, ledger and executor, and advertise their Service"
            );
        }
        if roles == "executor" {
            assert_eq!(
                calls.len(),
                5,
                "{name}: the executor reaches all four services and advertises its own"
            );
            assert!(
                !cfg["llm"]["providers"].as_array().unwrap().is_empty(),
                "{name}: LLM providers are configured"
            );
        }
        // Every service workload is authenticated: mTLS with a mounted
        // certificate, and either hosts the API keys or follows them.
        if roles != "agent" {
            let tls = cfg["server"]
                .get("tls")
                .unwrap_or_else(|| panic!("{name}: no server.tls"));
            let mount = c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == "tls")
                .unwrap_or_else(|| panic!("{name}: no tls volume"));
            assert!(
                tls["cert_file"]
                    .as_str()
                    .unwrap()
                    .starts_with(mount["mountPath"].as_str().unwrap()),
                "{name}: the certificate comes from the mounted Secret"
            );
            assert!(
                cfg["auth"].get("service_tls").is_some(),
                "{name}: mTLS client"
            );
            let keeps_keys = roles.split(',').any(|r| r == "auth");
            let follows = cfg["auth"]
                .get("keys_url")
                .and_then(|u| u.as_str())
                .is_some_and(|u| u == keys_host);
            assert!(
                keeps_keys ^ follows,
                "{name}: hosts the auth service or follows it"
            );
            assert_eq!(
                cfg["auth"]["dev_credentials"].as_bool(),
                Some(false),
                "{name}"
            );
        }
        for url in calls {
            let hostport = url
                .trim_start_matches("https://")
                .trim_start_matches("http://");
            let (host, port) = hostport.split_once(':').unwrap();
            let reg = services
                .iter()
                .find(|s| s["metadata"]["name"] == host)
                .unwrap_or_else(|| panic!("{name}: no Service {host}"));
            assert_eq!(
                reg["spec"]["ports"][0]["port"]
                    .as_i64()
                    .unwrap()
                    .to_string(),
                port
            );
        }
    }
    workloads
}

#[test]
fn container_image_default_command_is_accepted() {
    let dockerfile = std::fs::read_to_string(repo_root().join("deploy/Dockerfile")).unwrap();
    let cmd = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .expect("a CMD line");
    let args: Vec<String> = serde_json::from_str(cmd).unwrap();
    // The image's ENV, as the container gets it.
    let env: Vec<(String, String)> = dockerfile
        .split("ENV ")
        .skip(1)
        .flat_map(|block| {
            block
                .lines()
                .take_while(|l| !l.trim().is_empty() && !l.starts_with("ENTRYPOINT"))
                .flat_map(|l| l.trim().trim_end_matches('\\').split_whitespace())
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect::<Vec<_>>()
        })
        .collect();
    let cfg = dump_config(&args, &env);
    assert_eq!(cfg["server"]["listen"].as_str(), Some("0.0.0.0:7600"));
    assert_eq!(
        cfg["auth"]["dev_credentials"].as_bool(),
        Some(false),
        "no demo identities on a network address"
    );
    assert_eq!(
        cfg["auth"]["bootstrap_admin_env"].as_str(),
        Some("SWITCHYARD_BOOTSTRAP_ADMIN_TOKEN"),
        "the first admin comes from the environment"
    );
    assert_eq!(
        cfg["storage"]["data_dir"].as_str(),
        Some("/var/lib/switchyard")
    );
}
