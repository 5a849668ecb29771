//! `switchyard-bench metrics`: what the Prometheus metrics cost. Every RPC
//! is counted once (its method's series looked up, a counter and a
//! histogram updated) and every scrape renders the registry; both are
//! measured here, next to a bare atomic increment timed in the same run, so
//! the figure reads as a ratio on a noisy machine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use switchyard_kit::metrics::global;

const CALLS: u32 = 2_000_000;

/// Nanoseconds per call of `f`, over `CALLS` calls.
fn per_call(mut f: impl FnMut(u32)) -> f64 {
    let start = Instant::now();
    for i in 0..CALLS {
        f(i);
    }
    start.elapsed().as_nanos() as f64 / f64::from(CALLS)
}

pub fn run() {
    println!("Metrics: the cost of counting an RPC and of a scrape (1 thread):");
    let bare = AtomicU64::new(0);
    let atomic = per_call(|_| {
        bare.fetch_add(1, Ordering::Relaxed);
    });
    // 40 methods, as a process hosting every service has about that many.
    let methods: Vec<String> = (0..40).map(|i| format!("Method{i}")).collect();
    let m = global();
    let ok = per_call(|i| {
        let method = &methods[i as usize % methods.len()];
        m.rpc("bench", method, tonic::Code::Ok, Duration::from_micros(250));
    });
    let refused = per_call(|i| {
        let method = &methods[i as usize % methods.len()];
        m.rpc(
            "bench",
            method,
            tonic::Code::NotFound,
            Duration::from_micros(250),
        );
    });
    println!("  bare atomic increment      {atomic:>8.1} ns/call  (reference)");
    println!(
        "  an OK RPC counted          {ok:>8.1} ns/call  ({:.2} us of a 200 us loopback round trip: {:.2}%)",
        ok / 1000.0,
        ok / 200_000.0 * 100.0
    );
    println!(
        "  a refused RPC counted      {refused:>8.1} ns/call  (its code's series through the family)"
    );
    let start = Instant::now();
    let scrapes = 200;
    let mut bytes = 0;
    for _ in 0..scrapes {
        bytes = m.render().len();
    }
    println!(
        "  a scrape ({} series lines, {bytes} bytes)  {:>8.1} us",
        m.render().lines().filter(|l| !l.starts_with('#')).count(),
        start.elapsed().as_secs_f64() * 1e6 / f64::from(scrapes)
    );
}
