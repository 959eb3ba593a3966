//! Symlink (and hard link) attacks: whatever is planted under our directories, nothing
//! outside them is written, re-owned, re-moded or deleted.
//!
//! Every case plants something, runs every store operation over it, and then compares
//! a snapshot of the "outside" tree with the one taken before.

#[path = "../src/testutil.rs"]
mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use ckpt_core::{DataKind, FileOwner, PodId, manifest_bytes};
use ckpt_store::{Error, Layout, Store};

struct Fixture {
    _tmp: tempfile::TempDir,
    layout: Layout,
    store: Store,
    outside: PathBuf,
    id: PodId,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("dir")).expect("outside");
        fs::write(outside.join("victim"), "precious").expect("victim");
        fs::write(outside.join("dir/victim"), "precious too").expect("victim");
        let id = PodId::new("ns", "p");
        // A checkpoint of the pod outside: following a symlink to it would "find" it.
        fs::write(
            outside.join("ns_p.json"),
            manifest_bytes(
                &common::checkpoint_with(&common::layout(tmp.path()), &id, &[], &[], FileOwner::default())
                    .manifest,
            ),
        )
        .expect("outside checkpoint");
        let layout = common::layout(tmp.path());
        let store = Store::open(layout.clone()).expect("open");
        Self {
            _tmp: tmp,
            layout,
            store,
            outside,
            id,
        }
    }

    fn checkpoint(&self, version: &str) -> ckpt_core::Checkpoint {
        let secret = vec![
            ("key".to_owned(), version.as_bytes().to_vec(), 0o600),
            ("sub/nested".to_owned(), version.as_bytes().to_vec(), 0o600),
        ];
        let config = vec![("config".to_owned(), version.as_bytes().to_vec(), 0o644)];
        common::checkpoint_with(
            &self.layout,
            &self.id,
            &[("test/version", version.to_owned())],
            &[
                (DataKind::Secret, "tls", secret),
                (DataKind::ConfigMap, "cfg", config),
            ],
            FileOwner { uid: 1234, gid: 5678 },
        )
    }

    fn link(&self, at: &Path, to: &Path) {
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent).expect("parent");
        }
        let _ = fs::remove_dir_all(at).or_else(|_| fs::remove_file(at));
        symlink(to, at).expect("symlink");
    }

    /// Runs every operation; they may fail, but must not touch the outside.
    fn run_everything(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let mut note = |what: &str, result: Result<(), Error>| {
            if let Err(e) = result {
                errors.push(format!("{what}: {e}"));
            }
        };
        note("read_all", self.store.read_all().map(|_| ()));
        note(
            "write v1",
            self.store.write_inactive(&self.checkpoint("v1")).map(|_| ()),
        );
        note("activate", self.store.activate(&self.id).map(|_| ()));
        note(
            "write v2",
            self.store.write_inactive(&self.checkpoint("v2")).map(|_| ()),
        );
        note("read_all", self.store.read_all().map(|_| ()));
        note("data_pods", self.store.data_pods().map(|_| ()));
        note("journal", self.store.write_journal(&1).map(|_| ()));
        note("journal", self.store.read_journal::<u32>().map(|_| ()));
        note("deactivate", self.store.deactivate(&self.id).map(|_| ()));
        note("remove", self.store.remove(&self.id).map(|_| ()));
        note("reopen", Store::open(self.layout.clone()).map(|_| ()));
        errors
    }
}

#[test]
fn nothing_outside_is_touched_whatever_is_planted() {
    type Plant = fn(&Fixture);
    let cases: &[(&str, Plant)] = &[
        ("data root", |f| {
            f.link(&f.layout.data_root(DataKind::Secret), &f.outside)
        }),
        ("namespace dir", |f| {
            f.link(&f.layout.data_root(DataKind::Secret).join("ns"), &f.outside)
        }),
        ("pod dir", |f| {
            f.link(&f.layout.pod_data_dir(DataKind::ConfigMap, &f.id), &f.outside)
        }),
        ("volume dir", |f| {
            f.link(
                &f.layout.pod_data_dir(DataKind::Secret, &f.id).join("tls"),
                &f.outside,
            )
        }),
        ("key file", |f| {
            f.store.write_inactive(&f.checkpoint("v0")).expect("write");
            let dir = f.layout.pod_data_dir(DataKind::Secret, &f.id).join("tls");
            f.link(&dir.join("key"), &f.outside.join("victim"));
            f.link(&dir.join("sub"), &f.outside.join("dir"));
            f.link(&dir.join("stale-dir"), &f.outside.join("dir"));
            f.link(&dir.join("stale-file"), &f.outside.join("victim"));
        }),
        ("hard link as a key file", |f| {
            f.store.write_inactive(&f.checkpoint("v0")).expect("write");
            let key = f.layout.pod_data_dir(DataKind::Secret, &f.id).join("tls/key");
            fs::remove_file(&key).expect("rm");
            fs::hard_link(f.outside.join("victim"), &key).expect("hard link");
        }),
        ("data link", |f| {
            f.store.write_inactive(&f.checkpoint("v0")).expect("write");
            let dir = f.layout.pod_data_dir(DataKind::Secret, &f.id).join("tls");
            f.link(&dir.join("..data"), &f.outside.join("dir"));
        }),
        ("data link to a version elsewhere", |f| {
            f.store.write_inactive(&f.checkpoint("v0")).expect("write");
            let dir = f.layout.pod_data_dir(DataKind::Secret, &f.id).join("tls");
            f.link(&dir.join("..data"), Path::new("../../../../../outside/dir"));
            f.link(&dir.join("..2000_01_01"), &f.outside);
        }),
        ("hard link in the current version", |f| {
            f.store.write_inactive(&f.checkpoint("v0")).expect("write");
            let key = f
                .layout
                .pod_data_dir(DataKind::Secret, &f.id)
                .join("tls/..data/key");
            fs::remove_file(&key).expect("rm");
            fs::hard_link(f.outside.join("victim"), &key).expect("hard link");
        }),
        ("symlink in the current version", |f| {
            f.store.write_inactive(&f.checkpoint("v0")).expect("write");
            let version = f.layout.pod_data_dir(DataKind::Secret, &f.id).join("tls/..data");
            f.link(&version.join("key"), &f.outside.join("victim"));
            f.link(&version.join("sub"), &f.outside.join("dir"));
        }),
        ("inactive manifest", |f| {
            f.link(
                &f.layout.inactive_manifest_path(&f.id),
                &f.outside.join("ns_p.json"),
            )
        }),
        ("legacy inactive manifest", |f| {
            f.link(
                &f.layout.inactive_dir().join("ns-p.json"),
                &f.outside.join("ns_p.json"),
            )
        }),
        ("active manifest", |f| {
            f.link(
                &f.layout.active_manifest_path(&f.id),
                &f.outside.join("ns_p.json"),
            )
        }),
        ("legacy active manifest", |f| {
            f.link(
                &f.layout.manifests_dir().join("ns-p.json"),
                &f.outside.join("ns_p.json"),
            )
        }),
        ("inactive dir", |f| f.link(&f.layout.inactive_dir(), &f.outside)),
        ("quarantine dir", |f| {
            f.link(&f.layout.quarantine_dir(), &f.outside);
            fs::write(f.layout.inactive_dir().join("garbage.json"), "x").expect("garbage");
        }),
        ("journal", |f| {
            f.link(&f.layout.journal_path(), &f.outside.join("victim"))
        }),
        ("everything at once", |f| {
            f.link(&f.layout.data_root(DataKind::Projected), &f.outside);
            f.link(&f.layout.data_root(DataKind::Secret).join("ns"), &f.outside);
            f.link(
                &f.layout.pod_data_dir(DataKind::ConfigMap, &f.id),
                &f.outside.join("dir"),
            );
            f.link(
                &f.layout.active_manifest_path(&f.id),
                &f.outside.join("ns_p.json"),
            );
            f.link(&f.layout.journal_path(), &f.outside.join("victim"));
        }),
    ];
    for (what, plant) in cases {
        let fixture = Fixture::new();
        let before = common::snapshot(&fixture.outside);
        plant(&fixture);
        let errors = fixture.run_everything();
        assert_eq!(
            common::snapshot(&fixture.outside),
            before,
            "{what}: the outside changed (errors: {errors:?})"
        );
        eprintln!("{what}: {errors:?}");
    }
}

#[test]
fn planted_symlinks_below_the_roots_are_replaced_with_real_directories() {
    let fixture = Fixture::new();
    let f = &fixture;
    f.link(&f.layout.data_root(DataKind::Secret).join("ns"), &f.outside);
    f.link(&f.layout.pod_data_dir(DataKind::ConfigMap, &f.id), &f.outside);
    f.store
        .write_inactive(&f.checkpoint("v1"))
        .expect("write replaces the links");
    for dir in [
        f.layout.data_root(DataKind::Secret).join("ns"),
        f.layout.pod_data_dir(DataKind::ConfigMap, &f.id),
    ] {
        assert!(
            fs::symlink_metadata(&dir).expect("lstat").is_dir(),
            "{}",
            dir.display()
        );
    }
    let key = f.layout.pod_data_dir(DataKind::Secret, &f.id).join("tls/key");
    assert_eq!(fs::read(key).expect("key"), b"v1");
}

#[test]
fn symlinked_roots_are_refused_with_a_clear_error() {
    let fixture = Fixture::new();
    let f = &fixture;
    f.link(&f.layout.data_root(DataKind::Secret), &f.outside);
    let error = f.store.write_inactive(&f.checkpoint("v1")).expect_err("refused");
    assert!(matches!(error, Error::Symlink { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        format!(
            "refusing to follow the symlink at {}",
            f.layout.data_root(DataKind::Secret).display()
        )
    );
    // Removal does not descend into it either, and still completes.
    f.store.remove(&f.id).expect("remove skips what is not ours");
}

#[test]
fn symlinked_manifests_are_never_read_through() {
    let fixture = Fixture::new();
    let f = &fixture;
    f.link(
        &f.layout.active_manifest_path(&f.id),
        &f.outside.join("ns_p.json"),
    );
    f.link(
        &f.layout.inactive_manifest_path(&f.id),
        &f.outside.join("ns_p.json"),
    );
    let all = f.store.read_all().expect("read_all");
    assert!(all.is_empty(), "a symlink is not a checkpoint: {all:?}");
    assert!(matches!(
        f.store.activate(&f.id),
        Err(Error::NoInactiveCheckpoint { .. })
    ));
    assert!(
        !f.store.deactivate(&f.id).expect("deactivate"),
        "not ours: left alone"
    );
    assert!(fs::symlink_metadata(f.layout.active_manifest_path(&f.id)).is_ok());
}

/// A local attacker racing the store: while every operation runs again and again, another
/// thread keeps swapping what is under the store's dirs (a volume dir, its `..data` link, a
/// file of the current version, the pod dir, a manifest) for symlinks out of the tree, FIFOs
/// and back. Whatever the interleaving: nothing outside changes, and no operation waits
/// forever (a FIFO opened for reading would block without `O_NONBLOCK`).
#[test]
fn a_racer_swapping_links_and_fifos_touches_nothing_outside_and_blocks_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    const ROUNDS: usize = 500;
    let fixture = Arc::new(Fixture::new());
    let before = common::snapshot(&fixture.outside);
    let tls = fixture
        .layout
        .pod_data_dir(DataKind::Secret, &fixture.id)
        .join("tls");
    let targets = [
        tls.clone(),
        tls.join("..data"),
        tls.join("..data/key"),
        tls.join("key"),
        fixture.layout.pod_data_dir(DataKind::ConfigMap, &fixture.id),
        fixture.layout.inactive_manifest_path(&fixture.id),
        fixture.layout.active_manifest_path(&fixture.id),
        fixture.layout.journal_path(),
    ];
    let swaps = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let (fixture, swaps, stop) = (fixture.clone(), swaps.clone(), stop.clone());
        std::thread::spawn(move || {
            // What a plant leaves is all that matters; one that fails (a parent just
            // removed) is simply a round without it.
            let plants: [&dyn Fn(&Path); 4] = [
                &|at| {
                    let _ = symlink(&fixture.outside, at);
                },
                &|at| {
                    let _ = symlink(fixture.outside.join("victim"), at);
                },
                &|at| {
                    let mode = rustix::fs::Mode::from_raw_mode(0o600);
                    let _ = rustix::fs::mknodat(rustix::fs::CWD, at, rustix::fs::FileType::Fifo, mode, 0);
                },
                &|_| {},
            ];
            let root = fixture.outside.parent().expect("a root").to_owned();
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let at = &targets[n % targets.len()];
                let plant = plants[(n / targets.len()) % plants.len()];
                n += 1;
                // The racer itself must not reach outside through a link it planted before.
                if !reached_without_links(at, &root) {
                    continue;
                }
                // Removes the link, the FIFO or the tree at `at`, never following a link.
                let _ = fs::remove_file(at).or_else(|_| fs::remove_dir_all(at));
                plant(at);
                swaps.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let worker = {
        let fixture = fixture.clone();
        std::thread::spawn(move || {
            let mut failed = 0;
            for _ in 0..ROUNDS {
                failed += fixture.run_everything().len();
            }
            failed
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !worker.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "an operation blocked: {ROUNDS} rounds did not finish in 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let failed = worker.join().expect("the worker did not panic");
    racer.join().expect("the racer did not panic");
    eprintln!(
        "{ROUNDS} rounds of every operation, {failed} failed steps, {} swaps",
        swaps.load(Ordering::Relaxed)
    );
    assert!(swaps.load(Ordering::Relaxed) > 1000, "the racer hardly ran");
    assert_eq!(common::snapshot(&fixture.outside), before, "the outside changed");
}

/// Whether every directory between `root` and `at` is a real directory, or a link to a
/// sibling (the store's `..data`): then `at` names a place inside the tree.
fn reached_without_links(at: &Path, root: &Path) -> bool {
    at.ancestors()
        .skip(1)
        .take_while(|dir| *dir != root)
        .all(|dir| match fs::symlink_metadata(dir) {
            Ok(meta) if meta.is_dir() => true,
            Ok(meta) if meta.is_symlink() => fs::read_link(dir)
                .is_ok_and(|target| target.components().count() == 1 && target.is_relative()),
            _ => false,
        })
}
