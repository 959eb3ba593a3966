//! A lock file another local user planted is refused with a clear error, never waited on
//! or written through. The other user is real: `setpriv` runs the planting shell as uid
//! 65534 (nobody) in a sticky world-writable directory such as `/run/lock`. Needs root
//! (as the agent does) and `setpriv` (util-linux); skipped with a message otherwise.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use ckpt_lock::{Error, LockFile, TryAcquire};

const NOBODY: u32 = 65534;

/// A directory like `/run/lock` (mode 1777) inside a temp dir others can enter.
struct SharedLockDir {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl SharedLockDir {
    fn new() -> Option<Self> {
        if !running_as_root() {
            eprintln!("skipped: planting as another user needs root");
            return None;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let dir = tmp.path().join("lock");
        fs::create_dir(&dir).expect("dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).expect("chmod");
        Some(Self { _tmp: tmp, dir })
    }

    /// Runs `script` with `sh` as uid/gid 65534 in the shared directory.
    fn as_nobody(&self, script: &str) -> Option<Child> {
        let child = Command::new("setpriv")
            .args([
                &format!("--reuid={NOBODY}"),
                &format!("--regid={NOBODY}"),
                "--clear-groups",
                "--",
                "sh",
                "-c",
                script,
            ])
            .current_dir(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        match child {
            Ok(child) => Some(child),
            Err(error) => {
                eprintln!("skipped: setpriv is not available: {error}");
                None
            }
        }
    }

    /// Runs `script` as nobody to completion; `false` if it could not run.
    fn plant(&self, script: &str) -> bool {
        let Some(child) = self.as_nobody(script) else {
            return false;
        };
        let output = child.wait_with_output().expect("wait");
        assert!(output.status.success(), "planting failed: {script}");
        true
    }
}

/// Whether this process runs as root (the owner of `/proc/self`).
fn running_as_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn unsafe_reason(error: &Error) -> String {
    match error {
        Error::UnsafeLockFile { reason, .. } => reason.clone(),
        other => panic!("expected UnsafeLockFile, got {other:?}: {other}"),
    }
}

#[test]
fn a_file_another_user_created_is_refused_even_while_they_hold_it() {
    let Some(shared) = SharedLockDir::new() else {
        return;
    };
    let path = shared.dir.join("agent.lock");
    // nobody creates the file (0600, so only nobody can open it) and holds a flock on it
    // until its stdin closes: the agent used to wait for it forever.
    let Some(mut holder) = shared.as_nobody("umask 077; exec flock agent.lock -c 'echo locked; cat'") else {
        return;
    };
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert_eq!(line.trim(), "locked");
    assert_eq!(fs::metadata(&path).expect("planted").uid(), NOBODY);

    let error = LockFile::new(&path, "me").try_acquire().expect_err("refused");
    let reason = unsafe_reason(&error);
    assert!(
        reason.contains("owned by uid 65534, not by this process (uid 0)"),
        "{reason}"
    );
    assert_eq!(
        error.to_string(),
        format!("refusing lock file {}: {reason}", path.display())
    );
    // The async acquire fails at once too, instead of waiting on nobody's flock.
    #[cfg(feature = "tokio")]
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let waited = runtime.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                LockFile::new(&path, "me").acquire(),
            )
            .await
        });
        assert!(
            matches!(waited, Ok(Err(Error::UnsafeLockFile { .. }))),
            "{waited:?}"
        );
    }
    drop(holder.stdin.take());
    holder.wait().expect("wait");
}

#[test]
fn a_world_writable_file_is_refused_and_a_readable_one_made_private() {
    let Some(shared) = SharedLockDir::new() else {
        return;
    };
    let path = shared.dir.join("agent.lock");
    // Ours, but 0666: nobody can write a fake holder record into it.
    fs::write(&path, "").expect("create");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).expect("chmod");
    if !shared.plant("echo 'pid=1' > agent.lock") {
        return;
    }
    let error = LockFile::new(&path, "me").try_acquire().expect_err("refused");
    assert!(unsafe_reason(&error).contains("its mode is 0666"), "{error}");

    // Ours and 0644 (as flock(1) creates it): uid 65534 can open it and hold a flock, so
    // it is made 0600 when we open it, after which uid 65534 cannot open it any more.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
    assert!(shared.plant("flock --nonblock --shared agent.lock true"));
    let guard = LockFile::new(&path, "me").try_acquire().expect("safe now");
    assert!(matches!(guard, TryAcquire::Acquired(_)));
    assert_eq!(fs::metadata(&path).expect("stat").mode() & 0o777, 0o600);
    drop(guard);
    let child = shared
        .as_nobody("flock --nonblock agent.lock true 2>/dev/null; echo $?")
        .expect("setpriv ran before");
    let output = child.wait_with_output().expect("wait");
    assert_ne!(String::from_utf8_lossy(&output.stdout).trim(), "0");
}

#[test]
fn a_symlink_another_user_planted_is_refused_and_its_target_untouched() {
    let Some(shared) = SharedLockDir::new() else {
        return;
    };
    let victim = shared.dir.parent().expect("parent").join("victim");
    fs::write(&victim, "precious").expect("victim");
    let missing = shared.dir.parent().expect("parent").join("would-be-created");
    let dangling = shared.dir.join("dangling.lock");
    let script = format!(
        "ln -s {} agent.lock && ln -s {} dangling.lock",
        victim.display(),
        missing.display()
    );
    if !shared.plant(&script) {
        return;
    }
    for path in [shared.dir.join("agent.lock"), dangling] {
        let error = LockFile::new(&path, "me")
            .acquire_blocking()
            .expect_err("refused");
        assert!(
            matches!(
                error,
                Error::NotRegularFile {
                    file_type: "symlink",
                    ..
                }
            ),
            "{error}"
        );
    }
    assert_eq!(fs::read_to_string(&victim).expect("victim"), "precious");
    assert!(!missing.exists(), "a dangling link's target is not created");
}

#[test]
fn a_directory_anyone_may_write_without_the_sticky_bit_is_refused() {
    let Some(shared) = SharedLockDir::new() else {
        return;
    };
    fs::set_permissions(&shared.dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    let path = shared.dir.join("agent.lock");
    // nobody could rename our file away and put their own in its place.
    let error = LockFile::new(&path, "me").try_acquire().expect_err("refused");
    assert!(
        matches!(&error, Error::UnsafeLockDir { dir, .. } if dir == &shared.dir),
        "{error}"
    );
    assert!(error.to_string().contains("no sticky bit"), "{error}");
    // With the sticky bit (as /run/lock has it) the same directory is fine.
    fs::set_permissions(&shared.dir, fs::Permissions::from_mode(0o1777)).expect("chmod");
    assert!(
        LockFile::new(&path, "me")
            .try_acquire()
            .expect("ok")
            .into_guard()
            .is_some()
    );
}
