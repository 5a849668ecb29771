//! The sandbox against the escapes and resource abuse a job could attempt,
//! with real tools: each test runs a command the way the executor does and
//! checks the host from outside. Files the sandbox must protect are made
//! readable and writable for everyone, so only the sandbox (not file
//! permissions) can be what stops the task.
#![allow(clippy::unwrap_used)] // a failed setup step is a failed test

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use switchyard_sandbox::limits::{self, Limit, ResourceLimits};
use switchyard_sandbox::program::Programs;
use switchyard_sandbox::{Finished, Limits, Policy, Sandbox, SandboxMode, run};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
const TOOLS: &[&str] = &["awk", "sed", "cat", "bash", "true", "truncate"];

/// A host with a data directory, another job's scratch directory and a home
/// directory holding a key, all world-readable; and this job's scratch.
struct Host {
    _root: tempfile::TempDir,
    root: PathBuf,
    scratch: PathBuf,
    sandbox: Sandbox,
    programs: Programs,
}

fn open(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
}

fn secret(path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, "secret\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

impl Host {
    fn new(mode: SandboxMode) -> Host {
        let root_dir = tempfile::tempdir().unwrap();
        let root = root_dir.path().to_path_buf();
        open(&root);
        for f in [
            "data/registry/db",
            "data/credentials.json",
            "data/scratch/other-job/result.txt",
            "home/.ssh/id_ed25519",
            "outside/existing",
        ] {
            secret(&root.join(f));
        }
        for d in [
            "data",
            "data/scratch",
            "data/scratch/other-job",
            "home",
            "home/.ssh",
            "outside",
        ] {
            open(&root.join(d));
        }
        let scratch = root.join("data/scratch/this-job");
        std::fs::create_dir_all(&scratch).unwrap();
        let tools: Vec<String> = TOOLS.iter().map(|s| s.to_string()).collect();
        let sandbox = Sandbox::detect(&Policy {
            mode,
            read_paths: &switchyard_sandbox::policy::default_read_paths(),
            ids_when_root: (65534, 65534),
            network_commands: &[],
            scratch_root: &root.join("data/scratch"),
        })
        .unwrap();
        sandbox.hand_over(&scratch).unwrap();
        Host {
            _root: root_dir,
            root,
            scratch,
            sandbox,
            programs: Programs::resolve(&tools, PATH),
        }
    }

    fn sandboxed() -> Host {
        let h = Host::new(SandboxMode::On);
        assert!(
            h.sandbox.unavailable().is_none(),
            "these tests need Landlock: {}",
            h.sandbox.describe()
        );
        h
    }

    async fn run_limited(
        &self,
        cmd: &str,
        args: &[&str],
        stdin: Option<&str>,
        l: &ResourceLimits,
    ) -> Finished {
        self.run_for(cmd, args, stdin, l, Duration::from_secs(20))
            .await
    }

    async fn run_for(
        &self,
        cmd: &str,
        args: &[&str],
        stdin: Option<&str>,
        l: &ResourceLimits,
        timeout: Duration,
    ) -> Finished {
        let p = self.programs.get(cmd).unwrap();
        let jail = self.sandbox.confine(cmd, p, &self.scratch, l).unwrap();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env = [
            ("PATH".to_owned(), PATH.to_owned()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ];
        let limits = Limits {
            timeout,
            grace: Duration::from_millis(200),
            cap: 64 * 1024,
        };
        run(
            &p.path,
            cmd,
            &args,
            &env,
            &self.scratch,
            stdin.map(|s| s.as_bytes().to_vec()),
            &limits,
            jail,
            &|_, _| {},
        )
        .await
        .unwrap()
    }

    async fn run(&self, cmd: &str, args: &[&str]) -> Finished {
        self.run_limited(cmd, args, None, &ResourceLimits::default())
            .await
    }

    fn path(&self, rel: &str) -> String {
        self.root.join(rel).display().to_string()
    }
}

fn show(f: &Finished) -> String {
    format!(
        "exit {:?} signal {:?} timed out {}; stdout {:?}; stderr {:?}",
        f.exit_code,
        f.signal,
        f.timed_out,
        text(&f.stdout).chars().take(300).collect::<String>(),
        text(&f.stderr).chars().take(300).collect::<String>()
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn awk_system_and_sed_e_cannot_start_a_shell() {
    let h = Host::sandboxed();
    let marker = h.path("outside/awk-ran");
    let f = h
        .run(
            "awk",
            &[&format!(
                "BEGIN {{ r = system(\"touch {marker}; touch escaped\"); print \"status\", r }}"
            )],
        )
        .await;
    assert!(!Path::new(&marker).exists(), "awk's system() ran a shell");
    assert!(
        !h.scratch.join("escaped").exists(),
        "awk's system() ran a shell"
    );
    assert!(
        text(&f.stdout).contains("status"),
        "awk itself ran: {}",
        show(&f)
    );

    let f = h
        .run_limited(
            "sed",
            &["1e touch escaped-sed", "-"],
            Some("line\n"),
            &ResourceLimits::default(),
        )
        .await;
    assert!(
        !h.scratch.join("escaped-sed").exists(),
        "sed's e command ran a shell: {}",
        show(&f)
    );
}

#[tokio::test]
async fn a_binary_put_in_scratch_cannot_be_executed() {
    let h = Host::sandboxed();
    let copy = h.scratch.join("mytrue");
    std::fs::copy("/usr/bin/true", &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o777)).unwrap();
    h.sandbox.hand_over(&copy).unwrap();
    let f = h.run("bash", &["-c", "./mytrue; echo rc=$?"]).await;
    assert!(text(&f.stdout).contains("rc=126"), "{}", show(&f));
    assert!(
        text(&f.stderr).contains("Permission denied"),
        "{}",
        show(&f)
    );
    // bash cannot start another allowlisted program either: only its own binary.
    let f = h
        .run("bash", &["-c", "/usr/bin/cat /dev/null; echo rc=$?"])
        .await;
    assert!(text(&f.stdout).contains("rc=126"), "{}", show(&f));
}

#[tokio::test]
async fn reading_outside_the_allowed_paths_fails() {
    let h = Host::sandboxed();
    for target in [
        h.path("data/registry/db"),
        h.path("data/credentials.json"),
        h.path("data/scratch/other-job/result.txt"),
        h.path("home/.ssh/id_ed25519"),
        "/etc/hostname".to_owned(),
        "/etc/shadow".to_owned(),
    ] {
        let f = h.run("cat", &[&target]).await;
        assert_ne!(f.exit_code, Some(0), "{target} was readable: {}", show(&f));
        assert!(!text(&f.stdout).contains("secret"), "{target}");
        assert!(
            text(&f.stderr).contains("Permission denied"),
            "{target}: {}",
            show(&f)
        );
    }
    // What a tool needs still works: libraries, its own /proc, /dev/null,
    // the files of its own job.
    std::fs::write(h.scratch.join("in.txt"), "mine\n").unwrap();
    h.sandbox.hand_over(&h.scratch.join("in.txt")).unwrap();
    let f = h
        .run(
            "cat",
            &["in.txt", "/proc/self/status", "/dev/null", "/etc/passwd"],
        )
        .await;
    assert_eq!(f.exit_code, Some(0), "{}", show(&f));
    assert!(text(&f.stdout).starts_with("mine\n"));
    assert!(text(&f.stdout).contains("NoNewPrivs:\t1"), "{}", show(&f));
    assert!(text(&f.stdout).contains("Seccomp:\t2"), "{}", show(&f));
}

#[tokio::test]
async fn writing_outside_scratch_fails_and_inside_works() {
    let h = Host::sandboxed();
    let out = h.path("outside/new");
    let existing = h.path("outside/existing");
    let f = h
        .run(
            "awk",
            &[&format!(
                "BEGIN {{ print \"x\" > \"{out}\"; print \"x\" > \"{existing}\"; print \"ok\" > \"mine.txt\" }}"
            )],
        )
        .await;
    assert_ne!(f.exit_code, Some(0), "{}", show(&f));
    assert!(!Path::new(&out).exists());
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "secret\n");
    let f = h
        .run("awk", &["BEGIN { print \"ok\" > \"mine.txt\" }"])
        .await;
    assert_eq!(f.exit_code, Some(0), "{}", show(&f));
    assert_eq!(
        std::fs::read_to_string(h.scratch.join("mine.txt")).unwrap(),
        "ok\n"
    );
}

#[tokio::test]
async fn no_tcp_or_udp_connection_leaves_the_task() {
    let h = Host::sandboxed();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let f = h
        .run(
            "bash",
            &[
                "-c",
                &format!(
                    "echo hi > /dev/tcp/127.0.0.1/{port}; echo tcp=$?; echo hi > /dev/udp/127.0.0.1/{udp_port}; echo udp=$?"
                ),
            ],
        )
        .await;
    let out = text(&f.stdout);
    assert!(
        out.contains("tcp=1") && out.contains("udp=1"),
        "{}",
        show(&f)
    );
    // A loopback connect completes before connect() returns, so had one been
    // made, it would be waiting in the accept queue now.
    listener.set_nonblocking(true).unwrap();
    assert_eq!(
        listener.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the task connected"
    );
    udp.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        udp.recv(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the task sent a datagram"
    );
}

#[tokio::test]
async fn on_an_older_landlock_tcp_and_writes_outside_scratch_stay_blocked() {
    let mut h = Host::sandboxed();
    if h.sandbox.abi() < 4 {
        // This kernel is the older one; the other tests cover it as it is.
        return;
    }
    h.sandbox = h.sandbox.clone().limited_to_abi(2);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let f = h
        .run(
            "bash",
            &[
                "-c",
                &format!("echo hi > /dev/tcp/127.0.0.1/{port}; echo tcp=$?"),
            ],
        )
        .await;
    assert!(text(&f.stdout).contains("tcp=1"), "{}", show(&f));
    listener.set_nonblocking(true).unwrap();
    assert_eq!(
        listener.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    let existing = h.path("outside/existing");
    let f = h.run("truncate", &["-s", "0", &existing]).await;
    assert_ne!(f.exit_code, Some(0), "{}", show(&f));
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "secret\n");
}

fn only(l: Limit, value: u64) -> ResourceLimits {
    ResourceLimits::default().with(l, value)
}

#[tokio::test]
async fn each_resource_limit_stops_the_task_and_names_itself() {
    let h = Host::sandboxed();
    // A fork bomb whose leader stays never ends by itself: its timeout
    // stops the whole tree, and what it hit is still named. (When the
    // leader exits, its PID namespace takes the bomb with it.)
    let f = h
        .run_for(
            "bash",
            &["-c", ":(){ :|:& };:; while :; do :; done"],
            None,
            &only(Limit::Processes, 24),
            Duration::from_secs(2),
        )
        .await;
    assert_eq!(limits::hit(&f), Some(Limit::Processes), "{}", show(&f));

    let awk = [
        (
            Limit::Memory,
            64 << 20,
            "BEGIN { s = \"x\"; while (1) s = s s }",
        ),
        (Limit::Cpu, 1, "BEGIN { while (1) n++ }"),
        (
            Limit::FileSize,
            1 << 20,
            "BEGIN { while (1) print \"0123456789abcdef0123456789abcdef\" > \"big\" }",
        ),
        (
            Limit::OpenFiles,
            32,
            "BEGIN { for (i = 0; i < 200; i++) print i > (\"f\" i) }",
        ),
    ];
    for (limit, value, program) in awk {
        let f = h
            .run_limited("awk", &[program], None, &only(limit, value))
            .await;
        assert_eq!(limits::hit(&f), Some(limit), "{}", show(&f));
    }
    assert!(std::fs::metadata(h.scratch.join("big")).unwrap().len() <= 1 << 20);

    // Nothing lingers: the same sandbox runs the next task normally.
    let f = h.run("true", &[]).await;
    assert_eq!(f.exit_code, Some(0), "{}", show(&f));
}

#[tokio::test]
async fn with_the_sandbox_off_commands_run_unconfined_but_within_rlimits() {
    let h = Host::new(SandboxMode::Off);
    let f = h.run("cat", &[&h.path("home/.ssh/id_ed25519")]).await;
    assert_eq!(
        text(&f.stdout),
        "secret\n",
        "off is really off: {}",
        show(&f)
    );
    assert!(h.sandbox.detail("cat").starts_with("sandbox off"));
    let f = h
        .run_limited(
            "awk",
            &["BEGIN { while (1) n++ }"],
            None,
            &only(Limit::Cpu, 1),
        )
        .await;
    assert_eq!(limits::hit(&f), Some(Limit::Cpu), "{}", show(&f));
}
