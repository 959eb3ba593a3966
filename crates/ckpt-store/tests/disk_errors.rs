//! A full disk (ENOSPC) and a read-only filesystem (EROFS) are typed errors and leave
//! the previous checkpoint intact. Uses a small tmpfs mounted for the test (needs root,
//! as the agent itself does); skipped with a message where mounting is not permitted.

#[path = "../src/testutil.rs"]
mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use ckpt_core::{Checkpoint, DataKind, FileOwner, PodId};
use ckpt_store::{Error, Layout, Store};

/// A tmpfs mounted on a temp dir, unmounted on drop (also when a test fails).
struct Tmpfs {
    _tmp: tempfile::TempDir,
    mountpoint: PathBuf,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        if !common::running_as_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let mountpoint = tmp.path().join("mnt");
        fs::create_dir(&mountpoint).expect("mountpoint");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"])
            .arg(&mountpoint)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: mounting a tmpfs is not permitted here");
            return None;
        }
        Some(Self {
            _tmp: tmp,
            mountpoint,
        })
    }

    fn remount(&self, option: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,{option}")])
            .arg(&self.mountpoint)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "remount {option}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
    }
}

fn checkpoint(layout: &Layout, id: &PodId, version: &str, secret_size: usize) -> Checkpoint {
    let secret = vec![
        ("small".to_owned(), version.as_bytes().to_vec(), 0o600),
        ("big".to_owned(), vec![b'x'; secret_size], 0o600),
    ];
    common::checkpoint_with(
        layout,
        id,
        &[("test/version", version.to_owned())],
        &[(DataKind::Secret, "s", secret)],
        FileOwner::default(),
    )
}

/// Fills the filesystem up; returns the filler's path.
fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let mut file = fs::File::create(&filler).expect("filler");
    let chunk = vec![0u8; 4096];
    while file.write_all(&chunk).is_ok() {}
    filler
}

/// Frees the space the filler took. Truncated first: a child process another test is
/// forking at that moment holds a copy of every descriptor until its exec closes it, and
/// an unlinked file's blocks stay in use while any descriptor is open (a flake under load).
fn free(filler: &Path) {
    fs::OpenOptions::new()
        .write(true)
        .open(filler)
        .and_then(|f| f.set_len(0))
        .expect("truncate the filler");
    fs::remove_file(filler).expect("free space");
}

fn no_temp_files(root: &Path) -> bool {
    common::snapshot(root).keys().all(|p| {
        !p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(".pod-checkpointer-"))
    })
}

#[test]
fn full_disk_is_a_typed_error_and_keeps_the_previous_checkpoint() {
    let Some(tmpfs) = Tmpfs::mount("1m") else { return };
    let layout = common::layout(&tmpfs.mountpoint);
    let store = Store::open(layout.clone()).expect("open");
    let id = PodId::new("kube-system", "api");
    let v1 = checkpoint(&layout, &id, "v1", 10);
    store.write_inactive(&v1).expect("write v1");
    store.activate(&id).expect("activate v1");
    let before = common::snapshot(&tmpfs.mountpoint);

    let filler = fill(&tmpfs.mountpoint);
    // Only the big file changes, and it does not fit.
    let v2 = checkpoint(&layout, &id, "v1", 64 << 10);
    let error = store.write_inactive(&v2).expect_err("disk full");
    assert!(matches!(error, Error::NoSpace { .. }), "{error:?}");
    assert!(error.is_disk_unwritable());
    assert!(
        error
            .to_string()
            .starts_with("no space left on device while writing"),
        "{error}"
    );
    free(&filler);
    assert_eq!(
        common::snapshot(&tmpfs.mountpoint),
        before,
        "the previous checkpoint is intact"
    );

    // A manifest that does not fit either.
    let mut v3 = checkpoint(&layout, &id, "v3", 10);
    v3.manifest
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("test/payload".into(), "y".repeat(64 << 10));
    store
        .write_inactive(&checkpoint(&layout, &id, "v3", 10))
        .expect("data fits");
    let before = common::snapshot(&tmpfs.mountpoint);
    let filler = fill(&tmpfs.mountpoint);
    let error = store.write_inactive(&v3).expect_err("disk full");
    assert!(matches!(error, Error::NoSpace { .. }), "{error:?}");
    free(&filler);
    assert_eq!(common::snapshot(&tmpfs.mountpoint), before);
    assert!(no_temp_files(&tmpfs.mountpoint));

    // With space again, it just works.
    store.write_inactive(&v3).expect("write v3");
    store.activate(&id).expect("activate v3");
    assert!(store.read_all().expect("read")[&id].active_matches_inactive());
}

#[test]
fn read_only_filesystem_is_a_typed_error_and_reads_still_work() {
    let Some(tmpfs) = Tmpfs::mount("4m") else { return };
    let layout = common::layout(&tmpfs.mountpoint);
    let store = Store::open(layout.clone()).expect("open");
    let id = PodId::new("kube-system", "api");
    store
        .write_inactive(&checkpoint(&layout, &id, "v1", 10))
        .expect("write");
    store.activate(&id).expect("activate");
    fs::write(layout.inactive_dir().join("garbage.json"), "x").expect("garbage");
    fs::write(
        layout
            .manifests_dir()
            .join(".pod-checkpointer-0000000000000000-1.tmp"),
        "x",
    )
    .expect("temp");
    tmpfs.remount("ro");
    let before = common::snapshot(&tmpfs.mountpoint);

    let error = store
        .write_inactive(&checkpoint(&layout, &id, "v2", 10))
        .expect_err("read-only");
    assert!(matches!(error, Error::ReadOnlyFilesystem { .. }), "{error:?}");
    assert!(matches!(
        store.deactivate(&id),
        Err(Error::ReadOnlyFilesystem { .. })
    ));
    assert!(matches!(store.remove(&id), Err(Error::ReadOnlyFilesystem { .. })));
    assert!(matches!(
        store.write_journal(&1),
        Err(Error::ReadOnlyFilesystem { .. })
    ));
    // Reading works; what cannot be quarantined or cleaned stays, with a warning.
    let all = store.read_all().expect("read_all on a read-only filesystem");
    assert!(all[&id].active_matches_inactive());
    assert!(!store.activate(&id).expect("already active: nothing to write"));
    assert_eq!(common::snapshot(&tmpfs.mountpoint), before);

    tmpfs.remount("rw");
    store
        .write_inactive(&checkpoint(&layout, &id, "v2", 10))
        .expect("writable again");
}

/// One version of a volume at a time: an update whose second file does not fit leaves
/// the pod seeing the whole previous version, never a new first file beside an old second
/// one (a new certificate with the old key).
#[test]
fn a_volume_update_that_does_not_fit_leaves_the_whole_previous_version() {
    let Some(tmpfs) = Tmpfs::mount("1m") else { return };
    let layout = common::layout(&tmpfs.mountpoint);
    let store = Store::open(layout.clone()).expect("open");
    let id = PodId::new("kube-system", "api");
    let volume = |v: &str, big: usize| {
        // Written in name order: `a.crt` first, then `b.key`.
        let secret = vec![
            ("a.crt".to_owned(), format!("cert {v}").into_bytes(), 0o600),
            ("b.key".to_owned(), vec![v.as_bytes()[0]; big], 0o600),
        ];
        common::checkpoint_with(
            &layout,
            &id,
            &[],
            &[(DataKind::Secret, "tls", secret)],
            FileOwner::default(),
        )
    };
    store.write_inactive(&volume("1", 10)).expect("write v1");
    let dir = layout.pod_data_dir(DataKind::Secret, &id).join("tls");
    // Leave room for the small certificate but not for the key.
    let filler = tmpfs.mountpoint.join("filler");
    let room = free_bytes(&tmpfs.mountpoint).saturating_sub(16 << 10);
    fs::write(&filler, vec![0u8; room]).expect("fill all but 16 KiB");
    let error = store
        .write_inactive(&volume("2", 256 << 10))
        .expect_err("disk full");
    assert!(matches!(error, Error::NoSpace { .. }), "{error:?}");
    assert_eq!(fs::read(dir.join("a.crt")).expect("cert"), b"cert 1");
    assert_eq!(fs::read(dir.join("b.key")).expect("key"), vec![b'1'; 10]);
    free(&filler);
    assert!(no_temp_files(&tmpfs.mountpoint));
    let leftovers: Vec<_> = fs::read_dir(&dir)
        .expect("volume")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("..") && n != "..data")
        .collect();
    assert_eq!(leftovers.len(), 1, "only the current version: {leftovers:?}");

    store.write_inactive(&volume("2", 256 << 10)).expect("fits now");
    assert_eq!(fs::read(dir.join("a.crt")).expect("cert"), b"cert 2");
    assert_eq!(fs::read(dir.join("b.key")).expect("key"), vec![b'2'; 256 << 10]);
}

/// Free bytes on the filesystem of `path`, from `df`.
fn free_bytes(path: &Path) -> usize {
    let output = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .expect("df");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df output")
}

/// The checkpoint dir as a pod sees it: the container's read-only root, with each of the
/// store's dirs a writable mount of its own (the rendered DaemonSet's hostPath volumes).
struct PodView {
    root: Tmpfs,
    mounts: Vec<PathBuf>,
}

impl PodView {
    const MOUNTED: [&str; 7] = [
        "manifests",
        "inactive-manifests",
        "checkpoint-secrets",
        "checkpoint-configmaps",
        "checkpoint-projected",
        "checkpoint-quarantine",
        "pod-checkpointer",
    ];

    fn mount() -> Option<(Self, Layout)> {
        let root = Tmpfs::mount("4m")?;
        let layout = common::layout(&root.mountpoint);
        let mut mounts = Vec::new();
        for name in Self::MOUNTED {
            let dir = layout.checkpoint_dir().join(name);
            fs::create_dir_all(&dir).expect("mountpoint");
            let ok = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "mount {}", dir.display());
            mounts.push(dir);
        }
        root.remount("ro");
        Some((Self { root, mounts }, layout))
    }
}

impl Drop for PodView {
    fn drop(&mut self) {
        for dir in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(dir).status();
        }
        let _ = &self.root;
    }
}

/// Self-GC in a pod: the kept credentials and the journal go (the read-only root refuses
/// even to unlink the earlier versions' names that are not there), and the store's dirs,
/// mount points the pod cannot remove, are left empty without an error.
#[test]
fn an_uninstall_from_a_pod_removes_the_agents_files_around_its_mounts() {
    let Some((_view, layout)) = PodView::mount() else {
        return;
    };
    let store = Store::open(layout.clone()).expect("open");
    store
        .write_credentials(b"kubeconfig", b"token")
        .expect("credentials");
    store.write_journal(&1).expect("journal");
    let id = PodId::new("kube-system", "api");
    store
        .write_inactive(&checkpoint(&layout, &id, "v1", 10))
        .expect("write");

    store.remove(&id).expect("remove");
    assert!(store.remove_credentials().expect("credentials removed"));
    assert!(store.remove_journal().expect("journal removed"));
    assert_eq!(
        store.remove_empty_dirs().expect("mount points are kept"),
        Vec::<String>::new()
    );
    for name in PodView::MOUNTED {
        let dir = layout.checkpoint_dir().join(name);
        let left: Vec<_> = fs::read_dir(&dir).expect("still there").collect();
        assert!(left.is_empty(), "{} holds {left:?}", dir.display());
    }
}
