//! The lock between real processes: a child holding it is SIGKILLed and the waiter takes
//! over, and the lock interoperates with `flock(1)` (util-linux), i.e. with any other
//! `flock(LOCK_EX)` user such as bootkube's checkpointer.
// Some helpers serve only the async waiter's tests (feature `tokio`).
#![cfg_attr(not(feature = "tokio"), allow(unused))]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ckpt_lock::{LockFile, TryAcquire, read_holder};
use tempfile::TempDir;

/// Bound for anything that must happen "soon"; generous for a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// How long a waiter gets to (wrongly) take a held lock before we check it did not.
const CHANCE_TO_MISBEHAVE: Duration = Duration::from_millis(300);

/// Set for the re-executed test binary: the lock path the child should hold.
const CHILD_LOCK_PATH_ENV: &str = "CKPT_LOCK_TEST_CHILD_LOCK_PATH";
const CHILD_IDENTITY: &str = "child-holder pod=test/child node=here";
const READY_LINE: &str = "LOCKED";

/// Kills (SIGKILL) and reaps the child if a test fails before it does so itself.
struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lock_path() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/lock/pod-checkpointer.lock");
    (dir, path)
}

/// Waits until the child prints `line` (it then holds the lock); panics on EOF or timeout.
fn wait_for_line(stdout: ChildStdout, line: &'static str) {
    let (seen_tx, seen_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let seen = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|printed| printed.trim() == line);
        let _ = seen_tx.send(seen);
        // Keep draining, so the child never blocks on a full pipe.
        lines.for_each(drop);
    });
    match seen_rx.recv_timeout(PATIENCE) {
        Ok(true) => {}
        Ok(false) => panic!("the child exited without printing {line:?}"),
        Err(_) => panic!("the child did not print {line:?} within {PATIENCE:?}"),
    }
}

fn wait_with_timeout(child: &mut Child) -> ExitStatus {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child did not exit within {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Not a test on its own: the body of the child process that
/// `sigkilled_holder_hands_over_to_a_waiting_process` starts by re-executing this test
/// binary. Holds the lock until its stdin closes (or it is killed).
#[test]
#[ignore = "helper process, run by sigkilled_holder_hands_over_to_a_waiting_process"]
fn helper_child_holds_lock() {
    let Some(path) = std::env::var_os(CHILD_LOCK_PATH_ENV) else {
        return;
    };
    let _guard = LockFile::new(path, CHILD_IDENTITY).acquire_blocking().unwrap();
    // On a line of its own: libtest has already printed "test helper_child_holds_lock ... ".
    println!("\n{READY_LINE}");
    // Returns when the parent closes our stdin or dies, so no child outlives its test.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

fn spawn_child_holding(path: &Path) -> ChildProcess {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_child_holds_lock",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_LOCK_PATH_ENV, path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_line(child.stdout.take().unwrap(), READY_LINE);
    ChildProcess(child)
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn sigkilled_holder_hands_over_to_a_waiting_process() {
    let (_dir, path) = lock_path();
    let mut child = spawn_child_holding(&path);

    let contender = LockFile::new(&path, "parent").with_poll_interval(Duration::from_millis(20));
    match contender.try_acquire().unwrap() {
        TryAcquire::Busy { holder: Some(holder) } => {
            assert_eq!(holder.pid, child.0.id());
            assert_eq!(holder.identity, CHILD_IDENTITY);
        }
        other => panic!("expected the child to hold the lock with a record, got {other:?}"),
    }

    let waiter = tokio::spawn(async move { contender.acquire().await });
    tokio::time::sleep(CHANCE_TO_MISBEHAVE).await;
    assert!(!waiter.is_finished(), "took the lock while the child held it");

    child.0.kill().unwrap(); // SIGKILL: no destructor runs; the kernel drops the flock
    assert!(!child.0.wait().unwrap().success());

    let guard = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter takes over")
        .unwrap()
        .unwrap();
    let holder = read_holder(&path).unwrap().expect("the new holder's record");
    assert_eq!(
        (holder.pid, holder.identity.as_str()),
        (std::process::id(), "parent")
    );
    drop(guard);
}

#[test]
fn child_releasing_normally_hands_over_to_a_blocking_waiter() {
    let (_dir, path) = lock_path();
    let mut child = spawn_child_holding(&path);

    let (acquired_tx, acquired_rx) = mpsc::channel();
    let waiter_path = path.clone();
    std::thread::spawn(move || {
        let guard = LockFile::new(waiter_path, "blocking waiter").acquire_blocking();
        let _ = acquired_tx.send(guard.map(|guard| guard.holder().clone()));
    });
    assert!(
        acquired_rx.recv_timeout(CHANCE_TO_MISBEHAVE).is_err(),
        "took the lock while the child held it"
    );

    drop(child.0.stdin.take()); // the child drops its guard and exits
    assert!(wait_with_timeout(&mut child.0).success());
    let holder = acquired_rx
        .recv_timeout(PATIENCE)
        .expect("the waiter takes over")
        .unwrap();
    assert_eq!(holder.identity, "blocking waiter");
}

/// `flock(1)` must be installed (util-linux); these tests fail rather than skip without it.
fn flock_command() -> Command {
    let probe = Command::new("flock").arg("--version").output();
    assert!(
        probe.is_ok_and(|output| output.status.success()),
        "flock(1) from util-linux is required for the interoperability tests"
    );
    Command::new("flock")
}

/// `flock(1)` holding an exclusive lock on `path` until its stdin closes or it is killed.
/// `--close` keeps the lock in the `flock` process only, so killing it releases the lock.
fn spawn_flock_holding(path: &Path) -> ChildProcess {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut child = flock_command()
        .args(["--exclusive", "--close"])
        .arg(path)
        .args(["sh", "-c", "echo LOCKED; exec cat >/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_line(child.stdout.take().unwrap(), READY_LINE);
    ChildProcess(child)
}

/// Exit status of `flock(1)` trying the lock without waiting: 0 if it got it, 75 if busy.
fn flock_nonblocking_status(path: &Path) -> i32 {
    let status = flock_command()
        .args(["--exclusive", "--nonblock", "--conflict-exit-code", "75"])
        .arg(path)
        .arg("true")
        .status()
        .unwrap();
    status.code().expect("flock(1) exited normally")
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn external_flock_holder_is_seen_and_handed_over() {
    let (_dir, path) = lock_path();
    let mut flock = spawn_flock_holding(&path);

    let contender = LockFile::new(&path, "ours").with_poll_interval(Duration::from_millis(20));
    // flock(1), like bootkube, leaves the file empty: busy, with no record.
    assert!(matches!(
        contender.try_acquire().unwrap(),
        TryAcquire::Busy { holder: None }
    ));

    let waiter = tokio::spawn(async move { contender.acquire().await });
    tokio::time::sleep(CHANCE_TO_MISBEHAVE).await;
    assert!(!waiter.is_finished(), "took the lock while flock(1) held it");

    drop(flock.0.stdin.take());
    assert!(wait_with_timeout(&mut flock.0).success());
    let guard = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter takes over")
        .unwrap()
        .unwrap();
    assert_eq!(guard.holder().identity, "ours");
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn sigkilled_external_flock_holder_is_taken_over() {
    let (_dir, path) = lock_path();
    let mut flock = spawn_flock_holding(&path);
    let waiter_lock = LockFile::new(&path, "ours").with_poll_interval(Duration::from_millis(20));
    let waiter = tokio::spawn(async move { waiter_lock.acquire().await });
    tokio::time::sleep(CHANCE_TO_MISBEHAVE).await;
    assert!(!waiter.is_finished(), "took the lock while flock(1) held it");

    flock.0.kill().unwrap();
    let _ = flock.0.wait();
    let guard = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter takes over")
        .unwrap()
        .unwrap();
    assert_eq!(guard.holder().identity, "ours");
}

#[test]
fn external_flock_sees_our_lock_and_waits_for_it() {
    let (_dir, path) = lock_path();
    let guard = LockFile::new(&path, "ours").acquire_blocking().unwrap();
    assert_eq!(flock_nonblocking_status(&path), 75, "flock(1) got a lock we hold");

    // flock(1) as a blocking waiter takes over when we release.
    let mut waiting_flock = ChildProcess(
        flock_command()
            .args(["--exclusive", "--timeout", &PATIENCE.as_secs().to_string()])
            .arg(&path)
            .arg("true")
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(CHANCE_TO_MISBEHAVE);
    assert!(
        waiting_flock.0.try_wait().unwrap().is_none(),
        "flock(1) got a lock we hold"
    );
    drop(guard);
    assert!(
        wait_with_timeout(&mut waiting_flock.0).success(),
        "flock(1) did not take over"
    );

    assert_eq!(flock_nonblocking_status(&path), 0);
}
