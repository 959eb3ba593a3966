//! A racer swapping the lock file in a loop against two holders (issue 18's local
//! attacker): the file deleted, replaced by a fresh one, by one the racer locks itself, by
//! a symlink out of the tree or a FIFO, every few hundred microseconds, while two holders
//! (the DaemonSet and static copies) each take the lock when it is free and confirm it
//! when they hold it, as the agent does every second.
//!
//! What must hold, every round the path did not change during (the racer bumps an epoch
//! around each swap): a holder told it holds the lock (`Acquired`, `Held`, `Retaken`)
//! finds its own record in the file at the path, so no two holders are ever told so about
//! one file; a holder told it lost or that the lock is busy does not; only a symlink or a
//! FIFO at the path is an error; no call blocks. Once the racer stops, exactly one holder
//! holds the lock.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ckpt_lock::{Confirmed, LockFile, LockGuard, TryAcquire, read_holder};

/// How long the racer runs.
const RACE: Duration = Duration::from_secs(3);

/// What the racer leaves at the path (`Path` states the holders may change themselves).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum AtPath {
    /// Nothing, or a regular file (the holders create one where there is none).
    File = 0,
    /// A symlink out of the tree.
    Symlink = 1,
    /// A FIFO.
    Fifo = 2,
}

struct Race {
    path: PathBuf,
    /// Odd while the racer swaps what is at the path.
    epoch: AtomicU64,
    at_path: AtomicU8,
    stop: AtomicBool,
}

#[derive(Default, Debug)]
struct Counts {
    acquired: u64,
    held: u64,
    retaken: u64,
    lost: u64,
    busy: u64,
    errors: u64,
    checked: u64,
    slowest: Duration,
}

enum Outcome {
    Mine,
    NotMine,
    Error(ckpt_lock::Error),
}

/// One holder: takes the lock when it has none, confirms it when it has, and checks what
/// it was told against the record at the path whenever the racer left the path alone.
fn holder(race: &Race, identity: &str) -> (Option<LockGuard>, Counts) {
    let lock = LockFile::new(&race.path, identity);
    let mut guard: Option<LockGuard> = None;
    let mut counts = Counts::default();
    while !race.stop.load(Ordering::SeqCst) {
        let before = race.epoch.load(Ordering::SeqCst);
        let at_path = race.at_path.load(Ordering::SeqCst);
        let started = Instant::now();
        let outcome = match guard.as_mut() {
            Some(held) => match held.confirm() {
                Ok(Confirmed::Held) => {
                    counts.held += 1;
                    Outcome::Mine
                }
                Ok(Confirmed::Retaken) => {
                    counts.retaken += 1;
                    Outcome::Mine
                }
                Ok(Confirmed::Lost { .. }) => {
                    counts.lost += 1;
                    guard = None;
                    Outcome::NotMine
                }
                // The agent goes on as the holder when the path cannot be checked.
                Err(error) => Outcome::Error(error),
            },
            None => match lock.try_acquire() {
                Ok(TryAcquire::Acquired(new)) => {
                    counts.acquired += 1;
                    guard = Some(new);
                    Outcome::Mine
                }
                Ok(TryAcquire::Busy { .. }) => {
                    counts.busy += 1;
                    Outcome::NotMine
                }
                Err(error) => Outcome::Error(error),
            },
        };
        counts.slowest = counts.slowest.max(started.elapsed());
        let record = read_holder(&race.path);
        let after = race.epoch.load(Ordering::SeqCst);
        thread::sleep(Duration::from_micros(200));
        if matches!(outcome, Outcome::Error(_)) {
            counts.errors += 1;
        }
        if before != after || before % 2 == 1 {
            continue;
        }
        counts.checked += 1;
        let recorded = record.ok().flatten().map(|h| h.identity);
        match outcome {
            Outcome::Mine => assert_eq!(
                recorded.as_deref(),
                Some(identity),
                "{identity} was told it holds the lock, but the file at the path records another holder"
            ),
            Outcome::NotMine => assert_ne!(
                recorded.as_deref(),
                Some(identity),
                "{identity} was told it does not hold the lock, but the file at the path records it"
            ),
            Outcome::Error(error) => {
                assert_ne!(
                    at_path,
                    AtPath::File as u8,
                    "{identity}: an error with a regular file (or none) at the path: {error}"
                );
            }
        }
    }
    (guard, counts)
}

/// A small xorshift, seeded and printed, so a failing run can be read back.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Swaps what is at the path until the race is over; returns how many swaps of each kind.
fn racer(race: &Race, seed: u64) -> [u64; 5] {
    let mut rng = Rng(seed | 1);
    let dir = race.path.parent().unwrap();
    let outside = dir.parent().unwrap().join("outside");
    fs::write(&outside, "not a lock file").unwrap();
    let tmp = dir.join("racer.tmp");
    let mut swaps = [0; 5];
    let mut own: Option<LockGuard> = None;
    let started = Instant::now();
    while started.elapsed() < RACE {
        race.epoch.fetch_add(1, Ordering::SeqCst);
        drop(own.take());
        let _ = fs::remove_file(&tmp);
        let kind = rng.below(5) as usize;
        let at_path = match kind {
            0 => {
                let _ = fs::remove_file(&race.path);
                AtPath::File
            }
            1 => {
                fs::write(&tmp, "").unwrap();
                private(&tmp);
                fs::rename(&tmp, &race.path).unwrap();
                AtPath::File
            }
            2 => {
                let guard = LockFile::new(&tmp, "racer")
                    .try_acquire()
                    .unwrap()
                    .into_guard()
                    .expect("the racer's own new file");
                fs::rename(&tmp, &race.path).unwrap();
                own = Some(guard);
                AtPath::File
            }
            3 => {
                std::os::unix::fs::symlink(&outside, &tmp).unwrap();
                fs::rename(&tmp, &race.path).unwrap();
                AtPath::Symlink
            }
            _ => {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &tmp,
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_bits_truncate(0o600),
                    0,
                )
                .unwrap();
                fs::rename(&tmp, &race.path).unwrap();
                AtPath::Fifo
            }
        };
        swaps[kind] += 1;
        race.at_path.store(at_path as u8, Ordering::SeqCst);
        race.epoch.fetch_add(1, Ordering::SeqCst);
        thread::sleep(Duration::from_micros(100 + rng.below(900)));
    }
    // Left with nothing at the path, the holders settle who holds the lock.
    race.epoch.fetch_add(1, Ordering::SeqCst);
    drop(own);
    let _ = fs::remove_file(&race.path);
    race.at_path.store(AtPath::File as u8, Ordering::SeqCst);
    race.epoch.fetch_add(1, Ordering::SeqCst);
    assert_eq!(
        fs::read_to_string(&outside).unwrap(),
        "not a lock file",
        "the symlink's target was written"
    );
    swaps
}

fn private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn a_racer_swapping_the_lock_file_never_leaves_two_holders_told_they_hold_it() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("lock")).unwrap();
    let race = Arc::new(Race {
        path: dir.path().join("lock/agent.lock"),
        epoch: AtomicU64::new(0),
        at_path: AtomicU8::new(AtPath::File as u8),
        stop: AtomicBool::new(false),
    });
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("racer seed {seed}");
    let holders: Vec<_> = ["daemonset-copy", "static-copy"]
        .into_iter()
        .map(|identity| {
            let race = Arc::clone(&race);
            thread::spawn(move || holder(&race, identity))
        })
        .collect();
    let swaps = racer(&race, seed);
    // Rounds enough for a holder with a lost lock to notice it, and the other to take it.
    thread::sleep(Duration::from_millis(300));
    race.stop.store(true, Ordering::SeqCst);
    let mut guards = Vec::new();
    let mut total = Counts::default();
    for handle in holders {
        let (guard, counts) = handle.join().expect("a holder panicked");
        eprintln!("{counts:?}");
        guards.extend(guard);
        total.acquired += counts.acquired;
        total.held += counts.held;
        total.retaken += counts.retaken;
        total.lost += counts.lost;
        total.busy += counts.busy;
        total.errors += counts.errors;
        total.checked += counts.checked;
        total.slowest = total.slowest.max(counts.slowest);
    }
    eprintln!("swaps (deleted, replaced, replaced and locked, symlink, fifo): {swaps:?}");
    assert!(
        total.slowest < Duration::from_secs(5),
        "a lock call blocked for {:?}",
        total.slowest
    );
    // The race reached every outcome, so the checks above were made on each.
    assert!(swaps.iter().all(|&n| n > 0), "{swaps:?}");
    for (name, n) in [
        ("acquired", total.acquired),
        ("held", total.held),
        ("retaken", total.retaken),
        ("lost", total.lost),
        ("busy", total.busy),
        ("errors", total.errors),
    ] {
        assert!(n > 0, "no holder was ever {name}: {total:?}");
    }
    assert_eq!(guards.len(), 1, "once the racer stops, one holder holds the lock");
    let mut guard = guards.pop().unwrap();
    assert!(matches!(guard.confirm().unwrap(), Confirmed::Held));
    assert_eq!(
        read_holder(&race.path).unwrap().map(|h| h.identity).as_deref(),
        Some(guard.holder().identity.as_str())
    );
}
