//! Any bytes, as RESP input: framing must never panic, and a frame is
//! either taken whole, waited for, or refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_gateway::resp::frame::{Limits, next};

fuzz_target!(|data: &[u8]| {
    let mut buf = bytes::BytesMut::from(data);
    let limits = Limits {
        max_bulk: 1 << 16,
        max_arguments: 64,
    };
    for _ in 0..64 {
        match next(&mut buf, limits) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
});
