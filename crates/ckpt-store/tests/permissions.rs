//! Modes and owners of everything the store writes (ARCHITECTURE.md, Identity and layout): directories 0700,
//! data files at the checkpoint's modes and owned by the pod's uid/gid (so are the
//! volume directories), manifests 0644 or 0600 with secret values, the kubelet's
//! directory 0755 when we create it. Changing owners needs root, which the tests have.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use ckpt_core::{DataKind, FileOwner, PodId};
use ckpt_store::Store;

/// (mode, uid, gid) of a path, not following symlinks.
fn stat(path: &Path) -> (u32, u32, u32) {
    let meta = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.mode() & 0o7777, meta.uid(), meta.gid())
}

#[test]
fn modes_and_owners() {
    if !common::running_as_root() {
        eprintln!("skipped: changing owners needs root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = common::layout(tmp.path());
    let store = Store::open(layout.clone()).expect("open");
    let id = PodId::new("kube-system", "kube-apiserver-x");
    let owner = FileOwner { uid: 1234, gid: 5678 };
    let secret = vec![
        ("tls.key".to_owned(), b"k".to_vec(), 0o400),
        ("tls.crt".to_owned(), b"c".to_vec(), 0o640),
        ("nested/deeper/ca.crt".to_owned(), b"ca".to_vec(), 0o644),
        // setuid/setgid/sticky never make it to disk.
        ("tool".to_owned(), b"#!/bin/sh".to_vec(), 0o7755),
    ];
    let config = vec![("config.yaml".to_owned(), b"a: b".to_vec(), 0o644)];
    let mut cp = common::checkpoint(
        &layout,
        &id,
        &[],
        &[
            (DataKind::Secret, "tls", secret),
            (DataKind::ConfigMap, "cfg", config),
        ],
        owner,
    );
    cp.manifest_holds_secrets = true;
    fs::remove_dir(layout.manifests_dir()).expect("the kubelet's dir is missing");
    store.write_inactive(&cp).expect("write");
    store.activate(&id).expect("activate");

    let secret_dir = layout.pod_data_dir(DataKind::Secret, &id).join("tls");
    let config_dir = layout.pod_data_dir(DataKind::ConfigMap, &id).join("cfg");
    let expected: &[(&Path, (u32, u32, u32))] = &[
        (&layout.inactive_dir(), (0o700, 0, 0)),
        (&layout.quarantine_dir(), (0o700, 0, 0)),
        (&layout.data_root(DataKind::Secret), (0o700, 0, 0)),
        (
            &layout.data_root(DataKind::Secret).join("kube-system"),
            (0o700, 0, 0),
        ),
        (&layout.pod_data_dir(DataKind::Secret, &id), (0o700, 0, 0)),
        (&secret_dir, (0o700, 1234, 5678)),
        (&secret_dir.join("tls.key"), (0o400, 1234, 5678)),
        (&secret_dir.join("tls.crt"), (0o640, 1234, 5678)),
        (&secret_dir.join("tool"), (0o755, 1234, 5678)),
        (&secret_dir.join("nested"), (0o700, 1234, 5678)),
        (&secret_dir.join("nested/deeper"), (0o700, 1234, 5678)),
        (&secret_dir.join("nested/deeper/ca.crt"), (0o644, 1234, 5678)),
        (&config_dir, (0o700, 1234, 5678)),
        (&config_dir.join("config.yaml"), (0o644, 1234, 5678)),
        (&layout.inactive_manifest_path(&id), (0o600, 0, 0)),
        (&layout.active_manifest_path(&id), (0o600, 0, 0)),
        (layout.manifests_dir(), (0o755, 0, 0)),
    ];
    let check = |expected: &[(&Path, (u32, u32, u32))]| {
        for (path, (mode, uid, gid)) in expected {
            let got = stat(path);
            assert_eq!(
                got,
                (*mode, *uid, *gid),
                "{}: got {:o} {}:{}",
                path.display(),
                got.0,
                got.1,
                got.2
            );
        }
    };
    check(expected);

    // Without secret values the manifest is world-readable, like any static pod.
    cp.manifest_holds_secrets = false;
    store.write_inactive(&cp).expect("write");
    store.activate(&id).expect("activate");
    check(&[
        (&layout.inactive_manifest_path(&id), (0o644, 0, 0)),
        (&layout.active_manifest_path(&id), (0o644, 0, 0)),
    ]);

    // A new owner (the pod's runAsUser changed) re-owns files and volume dirs.
    cp.owner = FileOwner { uid: 4321, gid: 8765 };
    let summary = store.write_inactive(&cp).expect("write");
    assert_eq!(
        summary.files_written, 5,
        "every file is rewritten for its new owner"
    );
    check(&[
        (&secret_dir, (0o700, 4321, 8765)),
        (&secret_dir.join("nested"), (0o700, 4321, 8765)),
        (&secret_dir.join("tls.key"), (0o400, 4321, 8765)),
        (&config_dir, (0o700, 4321, 8765)),
    ]);

    // Tampered modes are put right on the next write.
    fs::set_permissions(&secret_dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::set_permissions(secret_dir.join("tls.key"), fs::Permissions::from_mode(0o666)).expect("chmod");
    let summary = store.write_inactive(&cp).expect("write");
    assert_eq!(summary.files_written, 1);
    check(&[
        (&secret_dir, (0o700, 4321, 8765)),
        (&secret_dir.join("tls.key"), (0o400, 4321, 8765)),
    ]);
}

const UNPRIVILEGED_DIR_ENV: &str = "CKPT_STORE_UNPRIVILEGED_DIR";

/// Run by `not_root_chown_is_skipped_when_owners_match` as uid 1234 / gid 5678.
#[test]
fn unprivileged_child() {
    let Ok(dir) = std::env::var(UNPRIVILEGED_DIR_ENV) else {
        return; // only meaningful as the child of the test below
    };
    let layout = common::layout(Path::new(&dir));
    let store = Store::open(layout.clone()).expect("open as a non-root user");
    let id = PodId::new("ns", "p");
    let files = || vec![("key".to_owned(), b"v".to_vec(), 0o600)];
    let own = FileOwner { uid: 1234, gid: 5678 };
    let cp = common::checkpoint(&layout, &id, &[], &[(DataKind::Secret, "s", files())], own);
    store.write_inactive(&cp).expect("our own ids need no chown");
    store.activate(&id).expect("activate");
    let root_owned = FileOwner { uid: 0, gid: 0 };
    let cp = common::checkpoint(&layout, &id, &[], &[(DataKind::Secret, "t", files())], root_owned);
    match store.write_inactive(&cp) {
        Err(ckpt_store::Error::Chown { uid: 0, gid: 0, .. }) => {}
        other => panic!("expected a chown error, got {other:?}"),
    }
    println!("unprivileged-child-ok");
}

#[test]
fn not_root_chown_is_skipped_when_owners_match_and_an_error_otherwise() {
    if !common::running_as_root() {
        eprintln!("skipped: switching to another user needs root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("node");
    fs::create_dir(&dir).expect("dir");
    std::os::unix::fs::chown(&dir, Some(1234), Some(5678)).expect("chown");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let output = std::process::Command::new("setpriv")
        .args(["--reuid=1234", "--regid=5678", "--clear-groups", "--"])
        .arg(std::env::current_exe().expect("test binary"))
        .args(["unprivileged_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(UNPRIVILEGED_DIR_ENV, &dir)
        .output();
    let Ok(output) = output else {
        eprintln!("skipped: setpriv is not available");
        return;
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("unprivileged-child-ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
