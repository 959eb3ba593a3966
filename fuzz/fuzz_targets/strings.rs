//! Any text through every string parser of ckpt-core: timestamps, the owner annotation,
//! the lock holder record, kubelet versions (see `outside_input.rs`).
#![no_main]

#[path = "../../crates/ckpt-core/tests/support/outside_input.rs"]
mod checks;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        checks::check_strings(text);
    }
});
