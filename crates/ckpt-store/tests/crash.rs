//! Crash safety: a writer SIGKILLed at random points never leaves a manifest the kubelet
//! (or we) cannot parse, never a truncated data file, never a volume whose files come from
//! two versions, and its leftovers (temp files, unpublished versions of a volume) are
//! invisible to the kubelet and the pod (dotfiles, `..` names) and removed by the next
//! `Store::open`.
//!
//! The writer is this test binary re-executed with `CKPT_STORE_CRASH_DIR` set, running
//! only `crash_child_writer`, which loops forever over random writes, activations,
//! deactivations, removals and journal writes with changing content.

#[path = "../src/testutil.rs"]
mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ckpt_core::ANNOTATION_CHECKPOINT_OF;
use ckpt_core::{DataKind, PodId};
use ckpt_store::{Error, Layout, Store};
use k8s_openapi::api::core::v1::Pod;

const CHILD_DIR_ENV: &str = "CKPT_STORE_CRASH_DIR";
const CHILD_SEED_ENV: &str = "CKPT_STORE_CRASH_SEED";
const KILLS: usize = 220;
const TEMP_PREFIX: &str = ".pod-checkpointer-";
const READY: &str = "crash-writer-ready";

/// xorshift64*: reproducible from the printed seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn pods() -> Vec<PodId> {
    vec![
        PodId::new("kube-system", "kube-apiserver-a"),
        PodId::new("kube-system", "pod-checkpointer-b"),
        // bootkube's names for these two would collide; ours must not.
        PodId::new("a-b", "c"),
        PodId::new("a", "b-c"),
    ]
}

/// Content that proves it is complete: its own length in the first 9 bytes.
fn self_checking(len: usize, fill: u8) -> Vec<u8> {
    // At least one fill byte: it tells which version the file belongs to.
    let len = len.max(10);
    let mut bytes = format!("{len:08}:").into_bytes();
    bytes.resize(len, fill);
    bytes
}

fn is_complete(bytes: &[u8]) -> bool {
    let declared = std::str::from_utf8(bytes.get(..8).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse::<usize>().ok());
    declared == Some(bytes.len()) && bytes.get(8) == Some(&b':')
}

/// The writer: loops until killed.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return; // only meaningful as the child of the test below
    };
    let seed = std::env::var(CHILD_SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let layout = common::layout(Path::new(&dir));
    let store = Store::open(layout.clone()).expect("open");
    let mut rng = Rng(seed | 1);
    // libtest prints "test crash_child_writer ... " without a newline first.
    println!("\n{READY}");
    std::io::stdout().flush().expect("flush");
    let pods = pods();
    for version in 0u64.. {
        let id = &pods[rng.below(pods.len() as u64) as usize];
        match rng.below(10) {
            0..=4 => {
                let fill = b'a' + (version % 26) as u8;
                let mut secret = Vec::new();
                for key in 0..1 + rng.below(4) {
                    let len = rng.below(128 << 10) as usize;
                    let path = if rng.below(3) == 0 {
                        format!("nested/dir/key-{key}")
                    } else {
                        format!("key-{key}")
                    };
                    let mode = [0o600, 0o644, 0o400][rng.below(3) as usize];
                    secret.push((path, self_checking(len, fill), mode));
                }
                let mut dirs = vec![(DataKind::Secret, "tls", secret)];
                if rng.below(2) == 0 {
                    let config = vec![("config.yaml".to_owned(), self_checking(100, fill), 0o644)];
                    dirs.push((DataKind::ConfigMap, "config", config));
                }
                // A large annotation widens the window in which the manifest is half-written.
                let payload = "x".repeat(rng.below(64 << 10) as usize);
                let annotations = [("test/version", version.to_string()), ("test/payload", payload)];
                let cp = common::checkpoint_with(&layout, id, &annotations, &dirs, common::own_files());
                store.write_inactive(&cp).expect("write");
            }
            5..=6 => match store.activate(id) {
                Ok(_) | Err(Error::NoInactiveCheckpoint { .. }) => {}
                Err(e) => panic!("activate: {e}"),
            },
            7 => {
                store.deactivate(id).expect("deactivate");
            }
            8 => {
                store.remove(id).expect("remove");
            }
            _ => {
                let state: BTreeMap<String, u64> = pods.iter().map(|p| (p.to_string(), version)).collect();
                store.write_journal(&state).expect("journal");
            }
        }
    }
}

/// Every manifest in `dir` (dotfiles aside) is a complete checkpoint under a right name.
fn check_manifests(dir: &Path, round: usize) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let bytes = fs::read(entry.path()).expect("read manifest");
        let pod: Pod = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("round {round}: {} does not parse: {e}", entry.path().display()));
        let id = PodId::of(&pod).expect("named");
        assert!(
            pod.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(ANNOTATION_CHECKPOINT_OF)),
            "round {round}: {name} is a checkpoint"
        );
        assert_eq!(name, id.manifest_file_name(), "round {round}");
        assert!(bytes.ends_with(b"\n"), "round {round}: {name} is complete");
    }
}

/// What the pod sees in every volume directory below a data root (`<ns>/<pod>/<volume>`)
/// is complete and one version: every file reached through its key link is complete, and
/// all of a volume's files carry the same fill byte (the writer's version). Returns how
/// many leftovers of a killed writer there are: our temp files anywhere, and hidden `..`
/// entries of a volume that `..data` does not point to (unpublished versions, temporary
/// links), which no reader can reach.
fn check_data(root: &Path, round: usize) -> usize {
    let mut leftovers = 0;
    for ns in subdirs(root, &mut leftovers) {
        for pod in subdirs(&ns, &mut leftovers) {
            for volume in subdirs(&pod, &mut leftovers) {
                leftovers += check_volume(&volume, round);
            }
        }
    }
    leftovers
}

/// The subdirectories of `dir`; counts our temp files met on the way.
fn subdirs(dir: &Path, leftovers: &mut usize) -> Vec<std::path::PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.expect("entry");
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            *leftovers += 1;
        } else if entry.file_type().expect("type").is_dir() {
            dirs.push(entry.path());
        }
    }
    dirs
}

fn check_volume(volume: &Path, round: usize) -> usize {
    let current = fs::read_link(volume.join("..data")).ok();
    let mut leftovers = 0;
    let mut fills = BTreeMap::new();
    for entry in fs::read_dir(volume).expect("volume") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(TEMP_PREFIX) {
            leftovers += 1;
        } else if name.starts_with("..") {
            if name != "..data" && current.as_deref() != Some(Path::new(&name)) {
                leftovers += 1;
            }
        } else {
            read_visible(&entry.path(), round, &mut fills);
        }
    }
    assert!(
        fills.len() <= 1,
        "round {round}: {} mixes versions: {fills:?}",
        volume.display()
    );
    leftovers
}

/// Reads a user-visible entry as the pod would (following links). A key link of a key
/// the new version dropped dangles until the writer removes it, as with the kubelet.
fn read_visible(path: &Path, round: usize, fills: &mut BTreeMap<u8, String>) {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => panic!("round {round}: {}: {e}", path.display()),
    };
    if meta.is_dir() {
        for entry in fs::read_dir(path).expect("dir") {
            read_visible(&entry.expect("entry").path(), round, fills);
        }
        return;
    }
    let bytes = fs::read(path).expect("read data");
    assert!(
        is_complete(&bytes),
        "round {round}: {} is truncated",
        path.display()
    );
    fills.insert(bytes[bytes.len() - 1], path.display().to_string());
}

fn count_temps(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(TEMP_PREFIX))
            })
            .count()
    })
}

fn all_temps(layout: &Layout, round: usize) -> usize {
    let mut temps = count_temps(layout.manifests_dir())
        + count_temps(&layout.inactive_dir())
        + count_temps(layout.checkpoint_dir())
        + count_temps(&layout.agent_dir());
    for kind in DataKind::ALL {
        temps += check_data(&layout.data_root(kind), round);
    }
    temps
}

#[test]
fn sigkill_at_random_points_never_leaves_a_broken_checkpoint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = common::layout(tmp.path());
    let exe = std::env::current_exe().expect("test binary");
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    eprintln!("crash test seed {seed}");
    let mut rng = Rng(seed | 1);
    let started = Instant::now();
    let mut rounds_with_temp_files = 0;
    for round in 0..KILLS {
        let mut child = Command::new(&exe)
            .args(["crash_child_writer", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, tmp.path())
            .env(CHILD_SEED_ENV, rng.next().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn writer");
        let stdout = child.stdout.take().expect("stdout");
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let ready = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .any(|line| line.contains(READY));
            let _ = ready_tx.send(ready);
        });
        if ready_rx.recv_timeout(Duration::from_secs(60)) != Ok(true) {
            let _ = child.kill();
            panic!("round {round}: the writer did not start");
        }
        // Kill within the first few operations; now and then at once.
        let delay = if rng.below(8) == 0 { 0 } else { rng.below(25_000) };
        std::thread::sleep(Duration::from_micros(delay));
        child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
        let status = child.wait().expect("wait");
        assert!(
            status.code().is_none(),
            "round {round}: the writer died by itself: {status}"
        );

        // What the kubelet would see right now, before anyone cleans up.
        check_manifests(layout.manifests_dir(), round);
        check_manifests(&layout.inactive_dir(), round);
        if all_temps(&layout, round) > 0 {
            rounds_with_temp_files += 1;
        }
        if let Ok(journal) = fs::read(layout.journal_path()) {
            serde_json::from_slice::<serde_json::Value>(&journal)
                .unwrap_or_else(|e| panic!("round {round}: the journal does not parse: {e}"));
        }

        // The next writer cleans up after the dead one, and finds nothing to quarantine.
        let store = Store::open(layout.clone()).expect("reopen");
        assert_eq!(all_temps(&layout, round), 0, "round {round}: temp files left");
        store.read_all().expect("read_all");
        let quarantined = fs::read_dir(layout.quarantine_dir()).map_or(0, Iterator::count);
        assert_eq!(quarantined, 0, "round {round}: something was unreadable");
    }
    eprintln!(
        "{KILLS} kills in {:.1?}; {rounds_with_temp_files} landed while a temp file existed",
        started.elapsed()
    );
    assert!(
        rounds_with_temp_files > 0,
        "no kill landed mid-write: the test did not exercise what it should"
    );
}
