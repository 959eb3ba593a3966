//! Annotation keys: every key added from now on lives under the project's own domain,
//! `pod-checkpointer.github.io/`. The keys under bootkube's domain are frozen at the set
//! below: the original's two, and the ones this project added under it before the rule
//! (renaming those would rewrite every active manifest, and the kubelet restarts a static
//! pod whose manifest changes). The test reads every Rust source of the workspace's crates
//! and fails on a `checkpointer.alpha.coreos.com/` key that is not in the set.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const LEGACY_DOMAIN: &str = "checkpointer.alpha.coreos.com/";
const PROJECT_DOMAIN: &str = "pod-checkpointer.github.io/";

/// The keys under bootkube's domain that exist, and no other ever will.
const FROZEN_LEGACY_KEYS: [&str; 8] = [
    // The original's.
    "checkpoint",
    "checkpoint-of",
    // Added by this project before the rule.
    "handoff",
    "parent-uid",
    "owner",
    "spec-hash",
    "checkpointed-at",
    "config-hash",
];

#[test]
fn new_annotation_keys_live_under_the_projects_domain() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources = Vec::new();
    rust_files(&crates, &mut sources);
    assert!(
        sources.len() > 50,
        "read only {} sources under {}",
        sources.len(),
        crates.display()
    );
    let frozen: BTreeSet<&str> = FROZEN_LEGACY_KEYS.into_iter().collect();
    let mut found = BTreeSet::new();
    let mut unknown = Vec::new();
    for path in &sources {
        let text = fs::read_to_string(path).unwrap();
        for key in legacy_keys(&text) {
            if !frozen.contains(key.as_str()) {
                unknown.push(format!("{}: {LEGACY_DOMAIN}{key}", path.display()));
            }
            found.insert(key);
        }
    }
    assert!(
        unknown.is_empty(),
        "new annotation keys go under {PROJECT_DOMAIN}, not {LEGACY_DOMAIN}:\n{}",
        unknown.join("\n")
    );
    // The scan sees the keys it must (else it would pass on anything).
    for key in ["checkpoint-of", "spec-hash", "config-hash"] {
        assert!(
            found.contains(key),
            "the scan found no {LEGACY_DOMAIN}{key}: {found:?}"
        );
    }
}

#[test]
fn the_scan_reads_keys_as_written_in_code_and_docs() {
    // Built from the domain, so that this file holds no key for the scan above to find.
    let d = LEGACY_DOMAIN;
    let text = format!(
        "const A: &str = \"{d}checkpoint\";\n// `{d}new-key: true` in a comment counts too\n\
         \"{d}\"; format!(\"{d}{{x}}\")"
    );
    assert_eq!(legacy_keys(&text), ["checkpoint", "new-key"]);
}

/// The key names after each occurrence of the legacy domain (lowercase, digits, `-`, `.`),
/// skipping a bare domain (a prefix being built).
fn legacy_keys(text: &str) -> Vec<String> {
    text.match_indices(LEGACY_DOMAIN)
        .filter_map(|(at, _)| {
            let rest = &text[at + LEGACY_DOMAIN.len()..];
            let key: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.')
                .collect();
            (!key.is_empty()).then_some(key)
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
