//! Any bytes as a checkpoint manifest on disk, under the store's own name for it
//! (`ns_p.json`), both in its inactive dir and in the kubelet's manifests dir (a torn write,
//! a manifest an older or newer agent wrote, an operator's edit): `Store::open` and two
//! `read_all`s never panic and agree, every pod found has a valid name, and the file in the
//! kubelet's dir is left as it was. CI's bounded run over whole trees is
//! `crates/ckpt-store/tests/read_fuzzed.rs`.
#![no_main]

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;

use ckpt_core::{is_dns_label, is_dns_subdomain};
use ckpt_store::{Layout, Store};
use libfuzzer_sys::fuzz_target;

/// One dir per fuzzing process, emptied for each input.
fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("ckpt-fuzz-stored-manifest-{}", std::process::id()));
        fs::create_dir_all(&root).expect("fuzz dir");
        root
    })
}

fuzz_target!(|data: &[u8]| {
    let checkpoint_dir = root().join("kubernetes");
    let manifests_dir = checkpoint_dir.join("manifests");
    let _ = fs::remove_dir_all(&checkpoint_dir);
    fs::create_dir_all(checkpoint_dir.join("inactive-manifests")).expect("inactive dir");
    fs::create_dir_all(&manifests_dir).expect("manifests dir");
    fs::write(checkpoint_dir.join("inactive-manifests/ns_p.json"), data).expect("inactive");
    fs::write(manifests_dir.join("ns_p.json"), data).expect("active");

    let Ok(store) = Store::open(Layout::new(&checkpoint_dir, &manifests_dir)) else {
        return;
    };
    let first = store.read_all();
    let second = store.read_all();
    match (&first, &second) {
        (Ok(first), Ok(second)) => {
            assert_eq!(
                first.keys().collect::<Vec<_>>(),
                second.keys().collect::<Vec<_>>(),
                "a second read finds what the first did"
            );
            for id in first.keys() {
                assert!(is_dns_label(&id.namespace) && is_dns_subdomain(&id.name), "{id}");
            }
        }
        (Err(_), Err(_)) => {}
        _ => panic!("two reads disagree: {first:?} / {second:?}"),
    }
    assert_eq!(
        fs::read(manifests_dir.join("ns_p.json")).ok().as_deref(),
        Some(data),
        "the file in the kubelet's dir changed"
    );
});
