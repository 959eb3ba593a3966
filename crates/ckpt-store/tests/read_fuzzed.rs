//! `Store::open` and `read_all` over fuzzed directory contents (issue 18's fuzzing, the
//! bounded part CI runs): random files, directories and symlinks under the store's dirs and
//! the kubelet's, with names and contents from what a node could hold (our manifests under
//! right and wrong names, other static pods, garbage, temporary files, links out of the
//! tree). Whatever is there: no panic; nothing outside the store's dirs changes; no file of
//! the kubelet's dir that is not one of our checkpoints changes; a second read finds what
//! the first did; every pod found has a valid name.

#[path = "../src/testutil.rs"]
mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use ckpt_core::{FileOwner, PodId, is_dns_label, is_dns_subdomain, manifest_bytes};
use ckpt_store::Store;
use proptest::prelude::*;

/// Where an entry is planted, below the test root.
const PLACES: [&str; 6] = [
    "kubernetes/inactive-manifests",
    "kubernetes/manifests",
    "kubernetes",
    "kubernetes/checkpoint-secrets/ns/p",
    "kubernetes/pod-checkpointer",
    "kubernetes/checkpoint-quarantine",
];

const NAMES: [&str; 11] = [
    "ns_p.json",
    "ns-p.json",
    "ns_q.json",
    "Bad_Name.json",
    ".ns_p.json.tmp-1a2b",
    "etcd.yaml",
    "ns_p.json.bak",
    "state.json",
    "x",
    "inactive-manifests",
    "manifests",
];

#[derive(Clone, Debug)]
enum Content {
    /// A checkpoint manifest of `ns/<pod>`.
    Ours(&'static str),
    Bytes(&'static [u8]),
}

#[derive(Clone, Debug)]
enum Kind {
    File(Content),
    Dir,
    Symlink(&'static str),
}

fn arb_entry() -> impl Strategy<Value = (usize, usize, Kind)> {
    // Weighted towards what the store reads (our manifests, in its dirs, under our names),
    // so that many trees hold something for it to find among the rest.
    let content = prop_oneof![
        3 => prop::sample::select(vec!["p", "q"]).prop_map(Content::Ours),
        2 =>
        prop::sample::select(vec![
            &b""[..],
            b"kind: Pod\n",
            b"{",
            b"null",
            b"[]",
            br#"{"apiVersion":"v1","kind":"Pod"}"#,
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"../x","namespace":"ns"}}"#,
            b"\xff\xfe\x00",
        ])
        .prop_map(Content::Bytes),
    ];
    let kind = prop_oneof![
        4 => content.prop_map(Kind::File),
        1 => Just(Kind::Dir),
        2 => prop::sample::select(vec!["../../outside/victim", "/nonexistent", "ns_p.json", "../../outside"])
            .prop_map(Kind::Symlink),
    ];
    let place = prop_oneof![3 => 0..2usize, 1 => 0..PLACES.len()];
    let name = prop_oneof![3 => 0..3usize, 1 => 0..NAMES.len()];
    (place, name, kind)
}

fn plant(root: &Path, entries: &[(usize, usize, Kind)]) {
    let layout = common::layout(root);
    for (place, name, kind) in entries {
        let dir = root.join(PLACES[*place]);
        // A place may have been planted as a file or link already: then it is skipped.
        if fs::create_dir_all(&dir).is_err() || !dir.is_dir() || dir.is_symlink() {
            continue;
        }
        let path = dir.join(NAMES[*name]);
        if fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        match kind {
            Kind::File(Content::Ours(pod)) => {
                let id = PodId::new("ns", pod);
                let checkpoint = common::checkpoint_with(&layout, &id, &[], &[], FileOwner::default());
                fs::write(&path, manifest_bytes(&checkpoint.manifest)).expect("write");
            }
            Kind::File(Content::Bytes(bytes)) => fs::write(&path, bytes).expect("write"),
            Kind::Dir => fs::create_dir(&path).expect("mkdir"),
            Kind::Symlink(target) => symlink(target, &path).expect("symlink"),
        }
    }
}

/// Whether `bytes` is a manifest of ours (what `plant` writes as `Ours`).
fn is_ours(root: &Path, bytes: &[u8]) -> bool {
    let layout = common::layout(root);
    ["p", "q"].iter().any(|pod| {
        let checkpoint =
            common::checkpoint_with(&layout, &PodId::new("ns", pod), &[], &[], FileOwner::default());
        manifest_bytes(&checkpoint.manifest) == bytes
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn reading_any_tree_changes_nothing_it_must_not(entries in prop::collection::vec(arb_entry(), 0..12)) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        fs::create_dir_all(root.join("outside/dir")).expect("outside");
        fs::write(root.join("outside/victim"), "precious").expect("victim");
        plant(root, &entries);
        let outside_before = common::snapshot(&root.join("outside"));
        let manifests = root.join("kubernetes/manifests");
        let foreign_before: Vec<_> = common::snapshot(&manifests)
            .into_iter()
            .filter(|(_, s)| !(s.kind == "file" && is_ours(root, &s.content)))
            .collect();

        let first = Store::open(common::layout(root)).and_then(|store| {
            let first = store.read_all()?;
            let second = store.read_all()?;
            Ok((first, second))
        });
        if let Ok((first, second)) = &first {
            let keys = |m: &std::collections::BTreeMap<PodId, _>| m.keys().cloned().collect::<Vec<_>>();
            prop_assert_eq!(keys(first), keys(second), "a second read finds what the first did");
            for id in first.keys() {
                prop_assert!(is_dns_label(&id.namespace) && is_dns_subdomain(&id.name), "{}", id);
            }
        }
        prop_assert_eq!(common::snapshot(&root.join("outside")), outside_before, "outside changed");
        let after = common::snapshot(&manifests);
        for (path, before) in &foreign_before {
            prop_assert_eq!(after.get(path), Some(before), "{} in the kubelet's dir changed", path.display());
        }
    }
}

/// The property above means something only if the store often finds checkpoints among
/// the planted entries: count the trees where it does.
#[test]
fn many_fuzzed_trees_hold_checkpoints_the_store_finds() {
    use proptest::strategy::ValueTree as _;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = prop::collection::vec(arb_entry(), 0..12);
    let (total, mut found) = (300, 0);
    for _ in 0..total {
        let entries = strategy.new_tree(&mut runner).expect("entries").current();
        let tmp = tempfile::tempdir().expect("tempdir");
        plant(tmp.path(), &entries);
        let read = Store::open(common::layout(tmp.path())).and_then(|s| s.read_all());
        if read.is_ok_and(|all| !all.is_empty()) {
            found += 1;
        }
    }
    eprintln!("{found} of {total} trees hold checkpoints the store finds");
    assert!(
        found * 5 > total,
        "only {found} of {total} trees hold a checkpoint the store finds"
    );
}
