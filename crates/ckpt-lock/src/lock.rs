//! Taking and releasing the `flock(2)`.

use std::fs::{self, DirBuilder, File, TryLockError};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
#[cfg(feature = "tokio")]
use std::time::Duration;
use std::time::Instant;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Error, Result, describe_file_type};
use crate::holder::{LockHolder, read_holder_from, write_holder_to};

/// Default upper bound of the async waiter's poll interval: a standby copy takes over at
/// most this long after the holder exits, at a cost of a few syscalls per second.
#[cfg(feature = "tokio")]
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The async waiter's first poll interval; it doubles up to the configured bound.
#[cfg(feature = "tokio")]
const FIRST_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Shortest allowed poll interval, so a zero interval cannot become a busy loop.
#[cfg(feature = "tokio")]
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);

/// How often we reopen after the file at the path turned out not to be the one we opened
/// (deleted or replaced in between) before giving up.
const MAX_OPEN_ATTEMPTS: u32 = 16;

const LOCK_FILE_MODE: u32 = 0o600;
const LOCK_DIR_MODE: u32 = 0o755;

/// An exclusive `flock(2)` lock on a file path, taken on behalf of an identity.
///
/// Creating a `LockFile` touches nothing; the file (mode 0600, and its parent directory,
/// mode 0755) is created on the first acquire. Every acquire refuses a lock file that
/// another user could hold or replace: a symlink (never followed), a file not owned by
/// this process's effective uid or open to group or others, a directory another user
/// owns or may write without the sticky bit ([`Error::UnsafeLockFile`],
/// [`Error::UnsafeLockDir`]). Put it in a directory only root can write. The lock belongs to the open file, so two
/// `LockFile`s on the same path exclude each other even within one process, and any other
/// `flock(LOCK_EX)` user on the same file (bootkube's checkpointer, `flock(1)`) takes part.
///
/// The file is never deleted: unlinking a lock file lets a waiter that still holds the old
/// file lock it while a newcomer locks a new one.
#[derive(Debug, Clone)]
pub struct LockFile {
    path: PathBuf,
    identity: String,
    #[cfg(feature = "tokio")]
    poll_interval: Duration,
}

/// The outcome of [`LockFile::try_acquire`].
#[derive(Debug)]
#[must_use = "dropping an `Acquired` outcome releases the lock at once"]
pub enum TryAcquire {
    /// We hold the lock until the guard is dropped.
    Acquired(LockGuard),
    /// Another open file holds the lock.
    Busy {
        /// What the holder recorded in the file; `None` if it recorded nothing (bootkube,
        /// `flock(1)`), the record was unreadable, or the holder has not written it yet.
        holder: Option<LockHolder>,
    },
}

impl TryAcquire {
    /// The guard if the lock was acquired.
    pub fn into_guard(self) -> Option<LockGuard> {
        match self {
            Self::Acquired(guard) => Some(guard),
            Self::Busy { .. } => None,
        }
    }
}

/// Proof that this process holds the lock. Dropping it clears the holder record and
/// releases the lock; so does the process exiting or being killed (the kernel closes the
/// file).
#[derive(Debug)]
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    file: File,
    path: PathBuf,
    holder: LockHolder,
}

impl LockGuard {
    /// The locked file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record this process wrote into the lock file.
    pub fn holder(&self) -> &LockHolder {
        &self.holder
    }

    /// Records `status` (one line; `None` clears it) in the holder record, for whoever
    /// reads it (`inspect`, a waiting copy's log). Diagnostics only: not synced to disk,
    /// and written only when it changes.
    ///
    /// # Errors
    ///
    /// If the lock file cannot be written; the lock is held all the same.
    pub fn set_status(&mut self, status: Option<&str>) -> Result<()> {
        if self.holder.status.as_deref() == status {
            return Ok(());
        }
        self.holder.status = status.map(str::to_owned);
        let content = self.holder.to_file_content();
        std::os::unix::fs::FileExt::write_all_at(&self.file, content.as_bytes(), 0)
            .and_then(|()| self.file.set_len(content.len() as u64))
            .map_err(|source| Error::Lock {
                path: self.path.clone(),
                source,
            })
    }
}

/// What [`LockGuard::confirm`] found at the lock's path.
#[derive(Debug)]
pub enum Confirmed {
    /// The path still names the locked file.
    Held,
    /// The locked file had been deleted or replaced; the file now at the path (created
    /// if none was) is locked by this guard instead.
    Retaken,
    /// The locked file had been deleted or replaced, and another holder locks the file
    /// now at the path: two processes each hold "the" lock. Drop this guard and wait for
    /// the lock again.
    Lost {
        /// What the other holder recorded, if anything.
        holder: Option<LockHolder>,
    },
}

impl LockGuard {
    /// Checks that the path still names the locked file. A lock file deleted or replaced
    /// while held (a cleanup of `/run`, an operator's `rm`) is a lock nobody else sees: a
    /// process opening the path next locks another file and holds "the" lock too. So the
    /// holder confirms now and then, takes the file now at the path if it is free, and
    /// gives up if it is not.
    ///
    /// # Errors
    ///
    /// If the path cannot be checked, or the file now at it cannot be created, opened or
    /// locked, or is not safe (see [`LockFile`]); the guard is unchanged.
    pub fn confirm(&mut self) -> Result<Confirmed> {
        let current = is_file_at_path(&self.file, &self.path).map_err(|source| Error::Lock {
            path: self.path.clone(),
            source,
        })?;
        if current {
            return Ok(Confirmed::Held);
        }
        let lock = LockFile::new(&self.path, self.holder.identity.clone());
        match lock.try_acquire()? {
            TryAcquire::Acquired(retaken) => {
                let status = self.holder.status.clone();
                // Dropping the old guard unlocks a file nobody can open any more.
                drop(std::mem::replace(self, retaken));
                if let Err(error) = self.set_status(status.as_deref()) {
                    tracing::debug!(path = %self.path.display(), %error, "cannot write lock holder record");
                }
                tracing::warn!(path = %self.path.display(), "the lock file was deleted or replaced while held; locked the file now at its path");
                Ok(Confirmed::Retaken)
            }
            TryAcquire::Busy { holder } => Ok(Confirmed::Lost { holder }),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Cleared while still locked, so no new holder's record can be wiped: a record in
        // an unlocked file is then known to be left over from a crash.
        if let Err(error) = self.file.set_len(0) {
            tracing::debug!(path = %self.path.display(), %error, "cannot clear lock holder record");
        }
        // Explicit, so the lock goes even if the descriptor was duplicated.
        if let Err(error) = self.file.unlock() {
            tracing::warn!(path = %self.path.display(), %error, "cannot unlock lock file; it is released when the file is closed");
        }
        tracing::info!(path = %self.path.display(), "released lock");
    }
}

impl LockFile {
    /// A lock on `path`, recorded as held by `identity` (free-form, one line, e.g.
    /// `"pod-checkpointer pod=kube-system/pod-checkpointer-abc node=node-1"`).
    pub fn new(path: impl Into<PathBuf>, identity: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            identity: identity.into(),
            #[cfg(feature = "tokio")]
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }

    /// Sets the longest interval between two attempts of [`acquire`](Self::acquire)
    /// (default [`DEFAULT_POLL_INTERVAL`], at least 1 ms).
    #[cfg(feature = "tokio")]
    pub fn with_poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval.max(MIN_POLL_INTERVAL);
        self
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The identity written into the lock file when we hold it.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Takes the lock if it is free, without waiting.
    ///
    /// # Errors
    ///
    /// If the file cannot be created, opened or locked, is not a regular file, or is not
    /// safe (see above). A busy lock is [`TryAcquire::Busy`], not an error.
    pub fn try_acquire(&self) -> Result<TryAcquire> {
        let started = Instant::now();
        for _ in 0..MAX_OPEN_ATTEMPTS {
            let file = open_lock_file(&self.path)?;
            if !self.try_lock(&file)? {
                return Ok(TryAcquire::Busy {
                    holder: self.holder_of(&file),
                });
            }
            if let Some(guard) = self.guard_if_current(file, started)? {
                return Ok(TryAcquire::Acquired(guard));
            }
        }
        Err(self.kept_changing())
    }

    /// Takes the lock, blocking the calling thread until it is free.
    ///
    /// Logs who holds the lock if it has to wait. Do not call it on an async runtime
    /// thread; use [`acquire`](Self::acquire) there.
    ///
    /// # Errors
    ///
    /// If the file cannot be created, opened or locked, is not a regular file, or is not
    /// safe.
    pub fn acquire_blocking(&self) -> Result<LockGuard> {
        let started = Instant::now();
        let mut logged_wait = false;
        for _ in 0..MAX_OPEN_ATTEMPTS {
            let file = open_lock_file(&self.path)?;
            if !self.try_lock(&file)? {
                if !logged_wait {
                    self.log_waiting(self.holder_of(&file).as_ref());
                    logged_wait = true;
                }
                self.lock_blocking(&file)?;
            }
            if let Some(guard) = self.guard_if_current(file, started)? {
                return Ok(guard);
            }
        }
        Err(self.kept_changing())
    }

    /// Takes the lock, waiting without blocking the async runtime.
    ///
    /// Polls with a non-blocking `flock` at a growing interval (10 ms up to the
    /// [poll interval](Self::with_poll_interval)). Logs who holds the lock when it starts
    /// waiting and whenever the recorded holder changes. Cancel-safe: the lock is only
    /// taken inside a poll that then returns the guard, so dropping the future never
    /// leaves the lock held. A blocking `flock` waiter in another process is woken by the
    /// kernel and usually wins a race against this poller.
    ///
    /// # Errors
    ///
    /// If the file cannot be created, opened or locked, is not a regular file, or is not
    /// safe.
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self) -> Result<LockGuard> {
        let started = Instant::now();
        let mut interval = FIRST_POLL_INTERVAL.min(self.poll_interval);
        let mut logged_holder: Option<Option<LockHolder>> = None;
        let mut open_file: Option<File> = None;
        let mut open_attempts = 0;
        loop {
            let file = match open_file.take() {
                Some(file) => file,
                None => open_lock_file(&self.path)?,
            };
            if self.try_lock(&file)? {
                if let Some(guard) = self.guard_if_current(file, started)? {
                    return Ok(guard);
                }
                open_attempts += 1;
                if open_attempts >= MAX_OPEN_ATTEMPTS {
                    return Err(self.kept_changing());
                }
                continue;
            }
            let holder = self.holder_of(&file);
            if logged_holder.as_ref() != Some(&holder) {
                self.log_waiting(holder.as_ref());
                logged_holder = Some(holder);
            }
            // Kept open across polls; if it is replaced meanwhile, the identity check after
            // locking notices and we reopen.
            open_file = Some(file);
            tokio::time::sleep(interval).await;
            // A poll pace, not a retry back-off, so not backon's as the agent's retries are:
            // nothing failed and no server is spared while the other copy holds the lock. The
            // doubling keeps a handover quick (10 ms first) and a long wait cheap, never
            // slower than `poll_interval`, the takeover delay the caller chose; one waiter per
            // node polling a local flock needs no jitter. ckpt-lock also stays a leaf crate.
            interval = (interval * 2).min(self.poll_interval);
        }
    }

    /// `flock(LOCK_EX | LOCK_NB)`: `true` if we got it, `false` if it is busy.
    fn try_lock(&self, file: &File) -> Result<bool> {
        match file.try_lock() {
            Ok(()) => Ok(true),
            Err(TryLockError::WouldBlock) => Ok(false),
            Err(TryLockError::Error(source)) => Err(Error::Lock {
                path: self.path.clone(),
                source,
            }),
        }
    }

    fn lock_blocking(&self, file: &File) -> Result<()> {
        loop {
            match file.lock() {
                Ok(()) => return Ok(()),
                // A signal handler without SA_RESTART interrupts flock; keep waiting.
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(Error::Lock {
                        path: self.path.clone(),
                        source,
                    });
                }
            }
        }
    }

    /// Turns a locked `file` into a guard if it is still the file at our path; otherwise
    /// (it was deleted or replaced after we opened it) drops it, releasing its lock.
    fn guard_if_current(&self, file: File, started: Instant) -> Result<Option<LockGuard>> {
        if !is_file_at_path(&file, &self.path).map_err(|source| Error::Lock {
            path: self.path.clone(),
            source,
        })? {
            tracing::debug!(path = %self.path.display(), "locked a lock file that was replaced meanwhile; reopening");
            return Ok(None);
        }
        let holder = LockHolder::current(self.identity.clone());
        // The record is diagnostics; failing to write it must not cost us the lock.
        if let Err(error) = write_holder_to(&file, &holder) {
            tracing::warn!(path = %self.path.display(), %error, "cannot write lock holder record");
        }
        tracing::info!(
            path = %self.path.display(),
            identity = %self.identity,
            waited_ms = started.elapsed().as_millis() as u64,
            "acquired lock"
        );
        Ok(Some(LockGuard {
            file,
            path: self.path.clone(),
            holder,
        }))
    }

    fn holder_of(&self, file: &File) -> Option<LockHolder> {
        read_holder_from(file).unwrap_or_else(|error| {
            tracing::debug!(path = %self.path.display(), %error, "cannot read lock holder record");
            None
        })
    }

    fn log_waiting(&self, holder: Option<&LockHolder>) {
        match holder {
            Some(holder) => tracing::info!(
                path = %self.path.display(),
                holder.pid = holder.pid,
                holder.identity = %holder.identity,
                holder.held_for_s = holder.held_for().map(|held| held.as_secs()),
                "lock is held by another process; waiting"
            ),
            None => tracing::info!(
                path = %self.path.display(),
                "lock is held by a process that left no holder record (e.g. bootkube's checkpointer); waiting"
            ),
        }
    }

    fn kept_changing(&self) -> Error {
        Error::KeptChanging {
            path: self.path.clone(),
            attempts: MAX_OPEN_ATTEMPTS,
        }
    }
}

/// Opens the lock file read-write without truncating it, creating it (0600) and its parent
/// directory (0755) if missing.
///
/// The final component is opened with `O_NOFOLLOW`: a symlink there is refused, never
/// followed (the holder writes into the file, so a planted link would make a root process
/// overwrite its target, and a dangling one would create a file wherever it points). The
/// file must then be a regular file owned by our effective uid and not writable by group
/// or others (see [`check_lock_file`]), in a directory no other user can rename it out of
/// (see [`check_lock_dir`]); read permission for group or others is taken away.
fn open_lock_file(path: &Path) -> Result<File> {
    let open_error = |source| Error::Open {
        path: path.to_owned(),
        source,
    };
    // NONBLOCK: a FIFO planted at the path must not block the open; fstat rejects it.
    let flags = OFlags::RDWR
        | OFlags::CREATE
        | OFlags::NOFOLLOW
        | OFlags::NONBLOCK
        | OFlags::NOCTTY
        | OFlags::CLOEXEC;
    let mode = Mode::from_bits_truncate(LOCK_FILE_MODE);
    let mut created_parent = false;
    let fd = loop {
        match rustix::fs::open(path, flags, mode) {
            Ok(fd) => break fd,
            Err(Errno::NOENT) if !created_parent => {
                create_parent_dir(path)?;
                created_parent = true;
            }
            // ELOOP is what O_NOFOLLOW answers for a symlink, EISDIR for a directory; with
            // fs.protected_symlinks/protected_regular, a link or file another user
            // planted in a sticky directory gives EACCES first. Whatever the errno, name
            // what is there.
            Err(errno) => {
                return Err(match fs::symlink_metadata(path) {
                    Ok(metadata) if !metadata.file_type().is_file() => Error::NotRegularFile {
                        path: path.to_owned(),
                        file_type: describe_file_type(metadata.file_type()),
                    },
                    Ok(metadata) => check_lock_file(path, &metadata, rustix::process::geteuid().as_raw())
                        .err()
                        .unwrap_or_else(|| open_error(errno.into())),
                    Err(_) => open_error(errno.into()),
                });
            }
        }
    };
    let file = File::from(fd);
    let metadata = file.metadata().map_err(open_error)?;
    if !metadata.file_type().is_file() {
        return Err(Error::NotRegularFile {
            path: path.to_owned(),
            file_type: describe_file_type(metadata.file_type()),
        });
    }
    check_lock_file(path, &metadata, rustix::process::geteuid().as_raw())?;
    check_lock_dir(path, rustix::process::geteuid().as_raw())?;
    make_private(path, &file, &metadata)?;
    Ok(file)
}

/// Refuses a lock file another user could write or may have planted: one not owned by
/// `euid` (someone else created it, e.g. in a world-writable directory before we did), or
/// writable by group or others (they could fake the holder record, and open it to hold
/// the lock). Read permission for group or others is fixed instead, by
/// [`make_private`]: the file is ours, and `flock(1)` creates its files 0644.
fn check_lock_file(path: &Path, metadata: &fs::Metadata, euid: u32) -> Result<()> {
    let unsafe_file = |reason: String| Error::UnsafeLockFile {
        path: path.to_owned(),
        reason,
    };
    if metadata.uid() != euid {
        return Err(unsafe_file(format!(
            "it is owned by uid {}, not by this process (uid {euid}); another user may have created it to hold the lock",
            metadata.uid()
        )));
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(unsafe_file(format!(
            "its mode is {mode:04o}: group or others could write it, or open it to hold the lock"
        )));
    }
    Ok(())
}

/// Takes read permission away from group and others on our own lock file: `flock` needs
/// only an open descriptor, so whoever can open the file can hold the lock forever.
fn make_private(path: &Path, file: &File, metadata: &fs::Metadata) -> Result<()> {
    let mode = metadata.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    tracing::warn!(path = %path.display(), mode = format_args!("{mode:04o}"), "lock file was readable by group or others; making it 0600");
    file.set_permissions(fs::Permissions::from_mode(LOCK_FILE_MODE))
        .map_err(|source| Error::Open {
            path: path.to_owned(),
            source,
        })
}

/// Refuses a directory in which another user could rename or delete our lock file (and
/// put their own in its place): one owned by someone other than root or `euid`, or one
/// writable by others without the sticky bit. A sticky world-writable directory such as
/// `/run/lock` (mode 1777) passes: there only a file's owner can rename or delete it, and
/// a file someone else created first is refused by [`check_lock_file`]. Group-writable
/// directories pass too (Fedora's `/run/lock` is `root:lock` 0775): the group is the
/// administrator's choice.
fn check_lock_dir(path: &Path, euid: u32) -> Result<()> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    // Followed: the configured path may go through a symlink such as /var/run -> /run.
    let metadata = fs::metadata(parent).map_err(|source| Error::Open {
        path: path.to_owned(),
        source,
    })?;
    let unsafe_dir = |reason: String| Error::UnsafeLockDir {
        path: path.to_owned(),
        dir: parent.to_owned(),
        reason,
    };
    if metadata.uid() != 0 && metadata.uid() != euid {
        return Err(unsafe_dir(format!(
            "it is owned by uid {}, who could replace the lock file",
            metadata.uid()
        )));
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(unsafe_dir(format!(
            "its mode is {mode:04o}: anyone can replace the lock file in it (no sticky bit)"
        )));
    }
    Ok(())
}

fn create_parent_dir(path: &Path) -> Result<()> {
    let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) else {
        return Ok(());
    };
    DirBuilder::new()
        .recursive(true)
        .mode(LOCK_DIR_MODE)
        .create(parent)
        .map_err(|source| Error::CreateDir {
            path: parent.to_owned(),
            source,
        })
}

/// Whether the open `file` is the file currently at `path` (not a symlink to it).
fn is_file_at_path(file: &File, path: &Path) -> io::Result<bool> {
    let opened = file.metadata()?;
    match fs::symlink_metadata(path) {
        Ok(at_path) => Ok(at_path.dev() == opened.dev() && at_path.ino() == opened.ino()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn creates_file_0600_and_missing_parents_0755() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/lock/agent.lock");
        let guard = LockFile::new(&path, "me").acquire_blocking().unwrap();
        // The umask may only clear bits.
        assert_eq!(mode(&path) & !LOCK_FILE_MODE, 0);
        assert_eq!(mode(&path) & 0o600, 0o600);
        for parent in [dir.path().join("run"), dir.path().join("run/lock")] {
            assert_eq!(mode(&parent) & !LOCK_DIR_MODE, 0, "{}", parent.display());
            assert_eq!(mode(&parent) & 0o700, 0o700, "{}", parent.display());
        }
        assert_eq!(guard.path(), path);
    }

    #[test]
    fn existing_content_is_not_truncated_by_opening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        fs::write(&path, "pid=1\nidentity=someone\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let _file = open_lock_file(&path).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "pid=1\nidentity=someone\n");
    }

    #[test]
    fn relative_path_without_parent_works() {
        // A bare file name has an empty parent, which must not be "created".
        assert!(create_parent_dir(Path::new("agent.lock")).is_ok());
    }

    #[test]
    fn symlink_is_refused_and_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        fs::write(&target, "keep me").unwrap();
        let path = dir.path().join("lock");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let error = LockFile::new(&path, "me").try_acquire().unwrap_err();
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
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep me");
    }

    #[test]
    fn dangling_symlink_does_not_create_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("would-be-created");
        let path = dir.path().join("lock");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let error = LockFile::new(&path, "me").acquire_blocking().unwrap_err();
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
        assert!(!target.exists());
    }

    #[test]
    fn directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let error = LockFile::new(dir.path(), "me").try_acquire().unwrap_err();
        assert!(
            matches!(
                error,
                Error::NotRegularFile {
                    file_type: "directory",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains(&dir.path().display().to_string()));
    }

    #[test]
    fn parent_that_is_a_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        fs::write(&blocker, "").unwrap();
        let path = blocker.join("sub/lock");
        let error = LockFile::new(&path, "me").try_acquire().unwrap_err();
        assert!(matches!(error, Error::Open { .. }), "{error}");
        let error = create_parent_dir(&path).unwrap_err();
        assert!(
            matches!(&error, Error::CreateDir { path, .. } if *path == blocker.join("sub")),
            "{error}"
        );
    }

    #[test]
    fn file_at_path_check_sees_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let file = open_lock_file(&path).unwrap();
        assert!(is_file_at_path(&file, &path).unwrap());
        fs::remove_file(&path).unwrap();
        assert!(!is_file_at_path(&file, &path).unwrap());
        fs::write(&path, "").unwrap();
        assert!(!is_file_at_path(&file, &path).unwrap());
    }

    /// Whether this test process may chown (root): the owner cases need it; without, it
    /// says they are skipped.
    fn can_chown() -> bool {
        let root = rustix::process::geteuid().is_root();
        if !root {
            eprintln!("skipped: the cases of files owned by another user need root (chown)");
        }
        root
    }

    /// `check_lock_file` on a file with `mode` owned by `uid`, for a process of `euid`.
    fn check_file(mode: u32, uid: u32, euid: u32, expected: Option<&str>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        fs::write(&path, "").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&path, Some(uid), None).unwrap();
        let got = check_lock_file(&path, &fs::metadata(&path).unwrap(), euid).map_err(|e| e.to_string());
        match expected {
            None => assert_eq!(got, Ok(()), "{mode:o} {uid} {euid}"),
            Some(part) => assert!(
                got.as_ref()
                    .is_err_and(|e| e.contains(part) && e.starts_with("refusing lock file")),
                "{mode:o} {uid} {euid}: {got:?}"
            ),
        }
    }

    #[test]
    fn lock_file_owner_and_mode() {
        let me = rustix::process::geteuid().as_raw();
        let cases: &[(u32, u32, u32, Option<&str>)] = &[
            (0o600, me, me, None),
            (0o400, me, me, None),
            // Readable by others: made private by `make_private`, not refused.
            (0o644, me, me, None),
            (0o640, me, me, None),
            (
                0o620,
                me,
                me,
                Some("its mode is 0620: group or others could write it"),
            ),
            (0o602, me, me, Some("its mode is 0602")),
            (0o666, me, me, Some("its mode is 0666")),
        ];
        for (mode, uid, euid, expected) in cases {
            check_file(*mode, *uid, *euid, *expected);
        }
        if can_chown() {
            check_file(
                0o600,
                65534,
                0,
                Some("owned by uid 65534, not by this process (uid 0)"),
            );
            check_file(
                0o600,
                0,
                1000,
                Some("owned by uid 0, not by this process (uid 1000)"),
            );
        }
    }

    #[test]
    fn a_lock_file_readable_by_others_is_made_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        fs::write(&path, "").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let _file = open_lock_file(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn lock_dir_owner_and_mode() {
        let me = rustix::process::geteuid().as_raw();
        let check = |mode: u32, owner: u32, expected: Option<&str>| {
            let dir = tempfile::tempdir().unwrap();
            let locks = dir.path().join("locks");
            fs::create_dir(&locks).unwrap();
            fs::set_permissions(&locks, fs::Permissions::from_mode(mode)).unwrap();
            std::os::unix::fs::chown(&locks, Some(owner), None).unwrap();
            let got = check_lock_dir(&locks.join("x.lock"), me).map_err(|e| e.to_string());
            match expected {
                None => assert_eq!(got, Ok(()), "{mode:o} {owner}"),
                Some(part) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(part)),
                    "{mode:o} {owner}: {got:?}"
                ),
            }
        };
        check(0o755, me, None);
        check(0o700, me, None);
        // /run/lock on Debian and Ubuntu; /tmp.
        check(0o1777, me, None);
        // Fedora's /run/lock is root:lock 0775.
        check(0o775, me, None);
        check(
            0o777,
            me,
            Some("its mode is 0777: anyone can replace the lock file"),
        );
        check(0o757, me, Some("no sticky bit"));
        if can_chown() {
            check(
                0o755,
                65534,
                Some("owned by uid 65534, who could replace the lock file"),
            );
            check(0o1777, 65534, Some("owned by uid 65534"));
        }
    }

    #[cfg(feature = "tokio")]
    #[test]
    fn zero_poll_interval_is_clamped() {
        let lock = LockFile::new("x", "me").with_poll_interval(Duration::ZERO);
        assert_eq!(lock.poll_interval, MIN_POLL_INTERVAL);
    }

    #[cfg(feature = "tokio")]
    #[test]
    fn acquire_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let lock = LockFile::new("x", "me");
        assert_send(&lock.acquire());
    }
}
