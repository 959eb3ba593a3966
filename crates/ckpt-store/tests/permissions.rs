//! Modes and owners of everything the store writes (ARCHITECTURE.md, Identity and layout):
//! our directories and the data roots with the namespace and pod directories below them
//! 0700 (the root-only ancestors that keep host users out), volume directories and
//! everything directory-like inside them 0755 and ours, data files at the checkpoint's
//! modes and owned by the pod's uid/gid, manifests 0644 or 0600 with secret values, the
//! kubelet's directory 0755 when we create it. Then, with real second uids, that the pod's
//! users read their files through a read-only bind mount of a volume directory (as in the
//! container), and that host users other than root reach nothing. Changing owners and
//! mounting need root, which the tests have.

#[path = "../src/testutil.rs"]
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
    let mut cp = common::checkpoint_with(
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
    let secret = secret_dir.join("..data");
    let expected: &[(&Path, (u32, u32, u32))] = &[
        (&layout.inactive_dir(), (0o700, 0, 0)),
        (&layout.quarantine_dir(), (0o700, 0, 0)),
        (&layout.data_root(DataKind::Secret), (0o700, 0, 0)),
        (
            &layout.data_root(DataKind::Secret).join("kube-system"),
            (0o700, 0, 0),
        ),
        (&layout.pod_data_dir(DataKind::Secret, &id), (0o700, 0, 0)),
        (&secret_dir, (0o755, 0, 0)),
        (&secret.join("tls.key"), (0o400, 1234, 5678)),
        (&secret.join("tls.crt"), (0o640, 1234, 5678)),
        (&secret.join("tool"), (0o755, 1234, 5678)),
        (&secret.join("nested"), (0o755, 0, 0)),
        (&secret.join("nested/deeper"), (0o755, 0, 0)),
        (&secret.join("nested/deeper/ca.crt"), (0o644, 1234, 5678)),
        (&config_dir, (0o755, 0, 0)),
        (&config_dir.join("..data/config.yaml"), (0o644, 1234, 5678)),
        (&layout.inactive_manifest_path(&id), (0o600, 0, 0)),
        (&layout.active_manifest_path(&id), (0o600, 0, 0)),
        (layout.manifests_dir(), (0o755, 0, 0)),
    ];
    for (key, target) in [("tls.key", "..data/tls.key"), ("nested", "..data/nested")] {
        assert_eq!(
            fs::read_link(secret_dir.join(key)).expect("a key is a link"),
            Path::new(target)
        );
    }
    let version = fs::read_link(&secret).expect("..data is a link");
    assert_eq!(stat(&secret_dir.join(version)), (0o755, 0, 0));
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

    // A new owner (the pod's runAsUser changed) re-owns the files, in new versions;
    // the directories stay ours.
    cp.owner = FileOwner { uid: 4321, gid: 8765 };
    let summary = store.write_inactive(&cp).expect("write");
    assert_eq!(
        summary.files_written, 5,
        "every file is rewritten for its new owner"
    );
    check(&[
        (&secret_dir, (0o755, 0, 0)),
        (&secret.join("nested"), (0o755, 0, 0)),
        (&secret.join("tls.key"), (0o400, 4321, 8765)),
        (&config_dir, (0o755, 0, 0)),
        (&config_dir.join("..data/config.yaml"), (0o644, 4321, 8765)),
    ]);

    // Tampered modes are put right on the next write (a file's by a new version).
    fs::set_permissions(&secret_dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    fs::set_permissions(secret_dir.join("tls.key"), fs::Permissions::from_mode(0o666)).expect("chmod");
    let summary = store.write_inactive(&cp).expect("write");
    assert_eq!(summary.files_written, 4, "a new version of the secret volume");
    check(&[
        (&secret_dir, (0o755, 0, 0)),
        (&secret.join("tls.key"), (0o400, 4321, 8765)),
    ]);
}

/// A bind mount of `source` at `target`, read-only, as the kubelet mounts a hostPath
/// volume with `readOnly: true`; unmounted on drop.
struct ReadOnlyBind(std::path::PathBuf);

impl ReadOnlyBind {
    fn mount(source: &Path, target: &Path) -> Option<Self> {
        fs::create_dir_all(target).expect("mountpoint");
        let run = |args: &[&str]| {
            std::process::Command::new("mount")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        let (source, target_str) = (source.display().to_string(), target.display().to_string());
        if !run(&["--bind", &source, &target_str]) {
            eprintln!("skipped: bind mounts are not permitted here");
            return None;
        }
        let bind = Self(target.to_path_buf());
        assert!(run(&["-o", "remount,bind,ro", &target_str]), "remount read-only");
        Some(bind)
    }
}

impl Drop for ReadOnlyBind {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Runs `cat` on `paths` as `uid` with the supplementary `groups` (`setpriv`); the output
/// if every file was readable, `None` if one was not.
fn cat_as(uid: u32, groups: &[u32], paths: &[&Path]) -> Option<String> {
    let groups = if groups.is_empty() {
        "--clear-groups".to_owned()
    } else {
        format!(
            "--groups={}",
            groups.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        )
    };
    let output = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            &groups,
            "--",
            "cat",
        ])
        .args(paths)
        .output()
        .expect("setpriv runs");
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn the_pods_users_read_their_files_through_the_mount_and_host_users_reach_nothing() {
    if !common::running_as_root() {
        eprintln!("skipped: other users and mounts need root");
        return;
    }
    if std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: setpriv is not available");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    // A node's /etc is open to everyone; so is the temp dir, to see that what keeps host
    // users out is our own root-only ancestor.
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let layout = common::layout(tmp.path());
    let store = Store::open(layout.clone()).expect("open");
    fs::set_permissions(layout.checkpoint_dir(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let id = PodId::new("kube-system", "kube-apiserver-x");
    // runAsUser 1234, fsGroup 5678: the sanitizer gave the files group read, as the
    // kubelet does. `image.txt` is 0644, as for an image whose USER is not root.
    let secret = vec![
        ("tls.key".to_owned(), b"KEY".to_vec(), 0o400),
        ("ca.crt".to_owned(), b"CA".to_vec(), 0o440),
        ("nested/image.txt".to_owned(), b"IMG".to_vec(), 0o644),
    ];
    let cp = common::checkpoint_with(
        &layout,
        &id,
        &[],
        &[(DataKind::Secret, "tls", secret)],
        FileOwner { uid: 1234, gid: 5678 },
    );
    store.write_inactive(&cp).expect("write");
    let volume = layout.pod_data_dir(DataKind::Secret, &id).join("tls");
    let Some(mount) = ReadOnlyBind::mount(&volume, &tmp.path().join("container/etc/tls")) else {
        return;
    };
    let seen = |name: &str| mount.0.join(name);

    // The pod's runAsUser (with fsGroup as a supplementary group, as the runtime adds it).
    assert_eq!(
        cat_as(
            1234,
            &[5678],
            &[&seen("tls.key"), &seen("ca.crt"), &seen("nested/image.txt")]
        )
        .as_deref(),
        Some("KEYCAIMG")
    );
    // Another uid of the same pod: group read through fsGroup, not the owner-only key.
    assert_eq!(cat_as(4000, &[5678], &[&seen("ca.crt")]).as_deref(), Some("CA"));
    assert_eq!(cat_as(4000, &[5678], &[&seen("tls.key")]), None);
    // An image USER without runAsUser or fsGroup reads what is world-readable.
    assert_eq!(
        cat_as(4000, &[], &[&seen("nested/image.txt")]).as_deref(),
        Some("IMG")
    );

    // Host users, even with the pod's uid and group, are stopped at the data root.
    for uid in [65534, 1234, 4000] {
        for path in [
            volume.join("ca.crt"),
            volume.join("nested/image.txt"),
            volume.join("..data/ca.crt"),
        ] {
            assert_eq!(
                cat_as(uid, &[5678], &[&path]),
                None,
                "uid {uid}: {}",
                path.display()
            );
        }
    }
    let listing = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "ls"])
        .arg(layout.data_root(DataKind::Secret))
        .output()
        .expect("ls");
    assert!(!listing.status.success(), "a host user lists the data root");
    drop(mount);
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
    let cp = common::checkpoint_with(&layout, &id, &[], &[(DataKind::Secret, "s", files())], own);
    store.write_inactive(&cp).expect("our own ids need no chown");
    store.activate(&id).expect("activate");
    let root_owned = FileOwner { uid: 0, gid: 0 };
    let cp = common::checkpoint_with(&layout, &id, &[], &[(DataKind::Secret, "t", files())], root_owned);
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
