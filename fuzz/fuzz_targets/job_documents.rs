//! Any bytes, as a job document of every format: parse, convert and
//! validate must never panic (what every door does with a submission).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    switchyard_executor::formats::exercise(&String::from_utf8_lossy(data));
});
