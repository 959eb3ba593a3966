//! Any text as a `--config` file: `check_config_file` (what `run` reads and `check-config`
//! runs) answers within a second and never panics; a refusal names the setting
//! (`--namespaces: …`) or the file (`--config: …`). CI's bounded run of the same checks is
//! `crates/ckpt-bin/tests/config_fuzzed.rs`.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let started = Instant::now();
    let answer = ckpt_bin::config::check_config_file(text);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    if let Err(e) = answer {
        let message = ckpt_core::error_chain(&e);
        assert!(message.starts_with("--"), "{message}");
    }
});
