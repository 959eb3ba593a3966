//! Any text as a duration flag (`--checkpoint-grace-period`, `--handoff-timeout` …): an
//! answer, never a panic (overflow included), and what parses is a sum of its parts: one
//! more part adds its value. CI's bounded run is the property test in
//! `crates/ckpt-bin/src/duration.rs`.
#![no_main]

use std::time::Duration;

use ckpt_bin::duration::parse_duration;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(total) = parse_duration(text) else {
        return;
    };
    assert_eq!(parse_duration(text), Ok(total), "not deterministic");
    if text.trim() != "0" {
        let more = format!("{}1ms", text.trim());
        assert_eq!(
            parse_duration(&more).ok(),
            total.checked_add(Duration::from_millis(1)),
            "{more:?}"
        );
    }
});
