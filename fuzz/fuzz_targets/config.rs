//! Any text as a `--config` file: `check_config_file` (what `run` reads and `check-config`
//! runs) answers within a second and never panics; a refusal names the setting
//! (`--namespaces: …`) or the file (`--config: …`). CI's bounded run of the same checks is
//! `crates/ckpt-bin/tests/config_fuzzed.rs`.
#![no_main]

#[path = "../../crates/ckpt-bin/tests/support/config_check.rs"]
mod checks;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        checks::check_config(text);
    }
});
