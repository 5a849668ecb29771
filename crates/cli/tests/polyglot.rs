//! Clients in other languages: a Python client generated from `proto/` with
//! grpcio-tools, and grpcurl through server reflection. `make test` installs
//! both into `.venv` and passes their paths in SWITCHYARD_PYTHON and
//! SWITCHYARD_GRPCURL.

mod support;

use std::process::Command;
use support::*;

fn tool(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the tests with `make test`, which installs the Python tools")
    })
}

#[test]
fn python_client_generated_from_proto_registers_routes_reserves_and_reads_error_info() {
    let python = tool("SWITCHYARD_PYTHON");
    let (dev, _data) = Proc::dev(&[]);
    let root = repo_root();
    let out = Command::new(python)
        .arg(root.join("tests/python/test_client.py"))
        .arg(&dev.addr)
        .arg(root.join("proto"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("7 passed, 0 failed"), "{stdout}");
    assert_eq!(dev.terminate(), Some(0));
}

#[test]
fn grpcurl_lists_describes_and_invokes_through_reflection() {
    let grpcurl = tool("SWITCHYARD_GRPCURL");
    let (dev, _data) = Proc::dev(&[]);
    let run = |args: &[&str]| {
        let mut a = vec!["-plaintext"];
        a.extend_from_slice(args);
        Command::new(&grpcurl).args(&a).output().unwrap()
    };
    let list = ok(&run(&[&dev.addr, "list"]));
    for svc in [
        "switchyard.registry.v1.RegistryService",
        "switchyard.router.v1.RouterService",
        "grpc.health.v1.Health",
    ] {
        assert!(list.contains(svc), "{svc} not in:\n{list}");
    }
    let desc = ok(&run(&[
        &dev.addr,
        "describe",
        "switchyard.router.v1.RouterService.Route",
    ]));
    assert!(desc.contains("rpc Route ( .switchyard.router.v1.RouteRequest ) returns ( .switchyard.router.v1.RouteResponse )"), "{desc}");

    let body = r#"{"agent":{"id":"curl_agent","endpoint":"http://127.0.0.1:9","capabilities":[{"name":"curl.test"}],"trustScore":70}}"#;
    let reg = ok(&run(&[
        "-d",
        body,
        &dev.addr,
        "switchyard.registry.v1.RegistryService/RegisterAgent",
    ]));
    assert!(reg.contains("\"created\": true"), "{reg}");

    let out = run(&[
        "-d",
        r#"{"capability":"nothing_here"}"#,
        &dev.addr,
        "switchyard.router.v1.RouterService/Route",
    ]);
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("NotFound") && text.contains("nothing_here"),
        "{text}"
    );
    assert_eq!(dev.terminate(), Some(0));
}
