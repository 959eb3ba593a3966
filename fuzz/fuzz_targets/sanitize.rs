//! Any bytes as a pod: what k8s-openapi reads goes through `sanitize` and `admit`, which
//! must keep their invariants (see `outside_input.rs`).
#![no_main]

#[path = "../../crates/ckpt-core/tests/support/outside_input.rs"]
mod checks;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(pod) = serde_json::from_slice::<k8s_openapi::api::core::v1::Pod>(data) {
        checks::check_sanitize(&pod, &checks::api_objects());
        checks::check_admit(&pod);
    }
});
