//! The lock between open files of one process: `flock(2)` locks belong to the open file,
//! so two `LockFile`s on one path exclude each other here just as two processes do.

use std::fs;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use ckpt_lock::{Confirmed, LockFile, LockGuard, LockHolder, TryAcquire, read_holder};
use tempfile::TempDir;

/// Bound for anything that must happen "soon"; generous for a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// How long a waiter gets to (wrongly) take a held lock before we check it did not.
const CHANCE_TO_MISBEHAVE: Duration = Duration::from_millis(200);

fn lock_path() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lock/agent.lock");
    (dir, path)
}

/// Mode 0600, as the lock creates its file: a lock file open to others is refused.
fn private(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

/// The lock on `path`, taken as `identity`; `free` says why it must be free.
fn take(path: &std::path::Path, identity: &str, free: &str) -> LockGuard {
    LockFile::new(path, identity)
        .try_acquire()
        .unwrap()
        .into_guard()
        .expect(free)
}

fn busy_holder(outcome: TryAcquire) -> Option<LockHolder> {
    match outcome {
        TryAcquire::Busy { holder } => holder,
        TryAcquire::Acquired(guard) => panic!("expected the lock to be busy, but got {guard:?}"),
    }
}

#[test]
fn two_open_files_in_one_process_exclude_each_other() {
    let (_dir, path) = lock_path();
    let first = LockFile::new(&path, "first");
    let second = LockFile::new(&path, "second");

    let guard = first
        .try_acquire()
        .unwrap()
        .into_guard()
        .expect("a fresh lock is free");
    assert!(second.try_acquire().unwrap().into_guard().is_none());
    // The same LockFile opens a new file each time, so it is excluded as well.
    assert!(first.try_acquire().unwrap().into_guard().is_none());
    drop(guard);
}

#[test]
fn try_while_held_reports_the_holder() {
    let (_dir, path) = lock_path();
    let _guard = LockFile::new(&path, "agent pod=kube-system/pc-1 node=n1")
        .acquire_blocking()
        .unwrap();

    let holder = busy_holder(LockFile::new(&path, "other").try_acquire().unwrap()).expect("a holder record");
    assert_eq!(holder.pid, std::process::id());
    assert_eq!(holder.identity, "agent pod=kube-system/pc-1 node=n1");
    assert!(holder.held_for().is_some());
    assert_eq!(read_holder(&path).unwrap(), Some(holder));
}

#[test]
fn guard_holds_its_record() {
    let (_dir, path) = lock_path();
    let guard = LockFile::new(&path, "me").acquire_blocking().unwrap();
    assert_eq!(guard.path(), path);
    assert_eq!(guard.holder().identity, "me");
    assert_eq!(read_holder(&path).unwrap().as_ref(), Some(guard.holder()));
}

#[test]
fn the_holder_updates_its_status_in_the_record() {
    let (_dir, path) = lock_path();
    let mut guard = LockFile::new(&path, "me").acquire_blocking().unwrap();
    guard.set_status(Some("api=unauthorized since 12:00")).unwrap();
    let read = read_holder(&path).unwrap().expect("a record");
    assert_eq!(read.status.as_deref(), Some("api=unauthorized since 12:00"));
    assert_eq!(read.identity, "me");
    assert!(
        read.to_string().ends_with("; api=unauthorized since 12:00"),
        "{read}"
    );
    // A shorter status leaves nothing of the longer one behind.
    guard.set_status(Some("api=synced")).unwrap();
    assert_eq!(
        read_holder(&path).unwrap().and_then(|h| h.status).as_deref(),
        Some("api=synced")
    );
    guard.set_status(None).unwrap();
    assert_eq!(read_holder(&path).unwrap().as_ref(), Some(guard.holder()));
    assert_eq!(guard.holder().status, None);
}

#[test]
fn dropping_the_guard_releases_the_lock_and_clears_the_record() {
    let (_dir, path) = lock_path();
    let lock = LockFile::new(&path, "me");
    let guard = lock.acquire_blocking().unwrap();
    drop(guard);

    assert_eq!(read_holder(&path).unwrap(), None);
    assert!(path.exists(), "the lock file is never deleted");
    let other = take(&path, "other", "released");
    assert_eq!(other.holder().identity, "other");
}

#[test]
fn stale_record_of_a_crashed_holder_is_replaced() {
    let (_dir, path) = lock_path();
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, "pid=999999\nidentity=crashed\nacquired_at=1\n").unwrap();
    private(&path);

    let guard = take(&path, "new", "nobody holds it");
    let holder = read_holder(&path).unwrap().unwrap();
    assert_eq!(
        (holder.pid, holder.identity.as_str()),
        (std::process::id(), "new")
    );
    drop(guard);
}

#[test]
fn garbage_in_the_lock_file_is_no_holder() {
    let (_dir, path) = lock_path();
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, b"\xff\xfe garbage\n=\npid=abc\n").unwrap();
    private(&path);
    assert_eq!(read_holder(&path).unwrap(), None);

    // A holder that writes no record (bootkube) holds the lock on the garbage file.
    let foreign = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    foreign.lock().unwrap();
    assert_eq!(
        busy_holder(LockFile::new(&path, "me").try_acquire().unwrap()),
        None
    );
}

#[test]
fn blocking_acquire_waits_until_released() {
    let (_dir, path) = lock_path();
    let guard = LockFile::new(&path, "first").acquire_blocking().unwrap();

    let (acquired_tx, acquired_rx) = mpsc::channel();
    let waiter_path = path.clone();
    let waiter = std::thread::spawn(move || {
        let guard = LockFile::new(waiter_path, "waiter").acquire_blocking().unwrap();
        acquired_tx.send(guard.holder().clone()).unwrap();
        drop(guard);
    });

    assert!(
        acquired_rx.recv_timeout(CHANCE_TO_MISBEHAVE).is_err(),
        "took a held lock"
    );
    drop(guard);
    let holder = acquired_rx.recv_timeout(PATIENCE).expect("the waiter takes over");
    assert_eq!(holder.identity, "waiter");
    waiter.join().unwrap();
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn async_acquire_waits_then_succeeds_when_released() {
    let (_dir, path) = lock_path();
    let guard = LockFile::new(&path, "first").acquire().await.unwrap();

    let waiter_lock = LockFile::new(&path, "waiter").with_poll_interval(Duration::from_millis(20));
    let waiter = tokio::spawn(async move { waiter_lock.acquire().await });

    tokio::time::sleep(CHANCE_TO_MISBEHAVE).await;
    assert!(!waiter.is_finished(), "took a held lock");
    // The runtime was not blocked: this task ran while the waiter waited.
    drop(guard);

    let guard = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter takes over")
        .unwrap()
        .unwrap();
    assert_eq!(guard.holder().identity, "waiter");
    assert_eq!(read_holder(&path).unwrap().unwrap().identity, "waiter");
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn async_acquire_on_current_thread_runtime_does_not_block_it() {
    // A single-threaded runtime: if the waiter blocked, the releasing task would never run.
    let (_dir, path) = lock_path();
    let guard = LockFile::new(&path, "first").acquire_blocking().unwrap();
    let release = async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(guard);
    };
    let waiter = LockFile::new(&path, "waiter");
    let (guard, ()) = tokio::time::timeout(PATIENCE, async { tokio::join!(waiter.acquire(), release) })
        .await
        .expect("released and taken over");
    assert_eq!(guard.unwrap().holder().identity, "waiter");
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn dropped_async_acquire_does_not_take_the_lock() {
    let (_dir, path) = lock_path();
    let guard = LockFile::new(&path, "first").acquire().await.unwrap();

    let cancelled = LockFile::new(&path, "cancelled").with_poll_interval(Duration::from_millis(5));
    let timed_out = tokio::time::timeout(CHANCE_TO_MISBEHAVE, cancelled.acquire()).await;
    assert!(timed_out.is_err(), "took a held lock");

    let aborted_lock = cancelled.clone();
    let aborted = tokio::spawn(async move { aborted_lock.acquire().await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    aborted.abort();
    assert!(aborted.await.unwrap_err().is_cancelled());

    drop(guard);
    // Nothing left behind by the two cancelled waiters holds the lock.
    let third = LockFile::new(&path, "third").try_acquire().unwrap().into_guard();
    assert_eq!(third.expect("the lock is free").holder().identity, "third");
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn waiter_relocks_when_the_lock_file_is_replaced_while_it_waits() {
    let (_dir, path) = lock_path();
    let old_holder = LockFile::new(&path, "old").acquire().await.unwrap();

    let waiter_lock = LockFile::new(&path, "waiter").with_poll_interval(Duration::from_millis(10));
    let waiter = tokio::spawn(async move { waiter_lock.acquire().await });
    tokio::time::sleep(CHANCE_TO_MISBEHAVE).await;

    // Someone deletes the lock file and a newcomer locks the new file at the path.
    fs::remove_file(&path).unwrap();
    let newcomer = take(&path, "newcomer", "new file");
    // The waiter, still polling the deleted file, gets that one once the old holder goes,
    // but must notice it is no longer the lock file and not report success.
    drop(old_holder);
    tokio::time::sleep(CHANCE_TO_MISBEHAVE).await;
    assert!(!waiter.is_finished(), "two holders of one lock path");

    drop(newcomer);
    let guard = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter takes over")
        .unwrap()
        .unwrap();
    assert_eq!(read_holder(&path).unwrap().as_ref(), Some(guard.holder()));
}

#[test]
fn a_holder_confirms_its_lock_file_and_retakes_a_deleted_one() {
    let (_dir, path) = lock_path();
    let mut guard = take(&path, "holder", "a fresh lock is free");
    guard.set_status(Some("busy")).unwrap();
    assert!(matches!(guard.confirm().unwrap(), Confirmed::Held));

    // Deleted while held: nobody else sees that lock any more, so the holder locks the
    // file now at the path (created again) and keeps its record.
    fs::remove_file(&path).unwrap();
    assert!(matches!(guard.confirm().unwrap(), Confirmed::Retaken));
    assert!(matches!(guard.confirm().unwrap(), Confirmed::Held));
    assert_eq!(read_holder(&path).unwrap().as_ref(), Some(guard.holder()));
    assert_eq!(guard.holder().status.as_deref(), Some("busy"));
    let newcomer = LockFile::new(&path, "newcomer").try_acquire().unwrap();
    assert_eq!(
        busy_holder(newcomer).map(|h| h.identity),
        Some("holder".to_owned()),
        "a newcomer finds the lock held"
    );
}

#[test]
fn a_holder_whose_lock_file_was_replaced_and_taken_loses_it() {
    let (_dir, path) = lock_path();
    let mut guard = take(&path, "holder", "a fresh lock is free");
    fs::remove_file(&path).unwrap();
    let newcomer = take(&path, "newcomer", "the new file");
    match guard.confirm().unwrap() {
        Confirmed::Lost { holder } => assert_eq!(holder.map(|h| h.identity), Some("newcomer".to_owned())),
        other => panic!("two holders: {other:?}"),
    }
    drop(guard);
    assert_eq!(
        read_holder(&path).unwrap().as_ref(),
        Some(newcomer.holder()),
        "the newcomer's record stays"
    );
}
