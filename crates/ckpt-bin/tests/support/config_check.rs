//! The check every fuzzed `--config` file must pass, shared by the bounded property run
//! (`tests/config_fuzzed.rs`) and the coverage-guided target (`fuzz/fuzz_targets/config.rs`).

use std::time::{Duration, Instant};

use ckpt_bin::config::check_config_file;

/// Checks one file: an answer within a second; a refusal names a setting or the file.
pub(crate) fn check_config(text: &str) {
    let started = Instant::now();
    let answer = check_config_file(text);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?} on {text:?}",
        started.elapsed()
    );
    if let Err(e) = answer {
        let message = ckpt_core::error_chain(&e);
        assert!(message.starts_with("--"), "{message} (for {text:?})");
    }
}
