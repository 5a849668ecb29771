//! The `switchyard` binary's library half: the layered configuration and the
//! composition of any set of services into one process on one port. `main.rs`
//! parses arguments and calls in here; `switchyard-testkit` uses the same
//! composition to run the stack in-process for tests and benchmarks.

/// mimalloc for every process built on this crate (the binary, the
/// benchmarks, the in-process test stacks). Measured in one session
/// against glibc's malloc and jemalloc (`switchyard-bench executor`, three
/// alternating rounds): W1 +17%, +15%, +23% over glibc, where jemalloc gave
/// +55%, -10%, +18% — as fast on average, steadier, and its C builds in
/// seconds where jemalloc's adds minutes to a clean build on two cores.
/// Built with `no_thp`: on a kernel whose transparent huge pages are
/// `madvise`, mimalloc otherwise asks for them and every touched 2 MiB
/// counts as resident (`switchyard-bench history 20000`: a fresh `dev` 86 →
/// 34 MB, after the jobs 177 → 124 MB, after a restart 123 → 77 MB; jobs/s
/// unchanged).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod agents;
pub mod config;
pub mod node;

pub use config::Config;
pub use node::{Addresses, BindError, Listeners, ServiceKind, run_node, run_node_then};
