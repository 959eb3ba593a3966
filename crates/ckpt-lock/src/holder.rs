//! Who holds the lock: the diagnostic record the holder writes into the lock file.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result, describe_file_type};

/// At most this much of a lock file is read: the record is a few lines, and a huge file
/// of garbage must not cost memory.
const MAX_HOLDER_FILE_BYTES: u64 = 4096;

/// Longer identities are cut (on a character boundary) before being written.
const MAX_IDENTITY_BYTES: usize = 1024;

/// The first line of the file we write, for an operator who `cat`s it.
const HEADER: &str = "# ckpt-lock holder record (diagnostics only: the flock(2) on this file is the lock)";

/// The process that holds (or, if it crashed, last held) the lock, as recorded in the lock
/// file.
///
/// The record is diagnostics only: the lock is the `flock(2)`, and a holder that was
/// SIGKILLed leaves its record behind. Other `flock` users (bootkube's checkpointer,
/// `flock(1)`) write nothing, so [`read_holder`] returns `None` for them.
///
/// The file format is `key=value` lines (`pid`, `identity`, `acquired_at` in Unix seconds,
/// and an optional `status` the holder updates, see [`LockGuard::set_status`]); a file
/// holding only a decimal pid, as classic pid files do, is also understood.
///
/// [`LockGuard::set_status`]: crate::LockGuard::set_status
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// Process id of the holder, as seen in the holder's own pid namespace (two containers
    /// without `hostPID` can see the same pid).
    pub pid: u32,
    /// Free-form text the holder chose to identify itself, e.g.
    /// `pod-checkpointer pod=kube-system/pod-checkpointer-abc node=node-1`. Empty if the
    /// record had none.
    pub identity: String,
    /// When the holder took the lock, if recorded.
    pub acquired_at: Option<SystemTime>,
    /// What the holder last said about itself (one line), e.g. `api=unauthorized since …`.
    pub status: Option<String>,
}

impl LockHolder {
    /// A record for the calling process with `identity`, acquired now (to the second, as
    /// the file records it).
    pub fn current(identity: impl Into<String>) -> Self {
        let now_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|since| since.as_secs())
            .ok();
        Self {
            pid: std::process::id(),
            identity: identity.into(),
            acquired_at: now_secs.map(|secs| UNIX_EPOCH + Duration::from_secs(secs)),
            status: None,
        }
    }

    /// How long ago the lock was taken, if the record says when (zero if the clock went
    /// backwards).
    pub fn held_for(&self) -> Option<Duration> {
        let acquired_at = self.acquired_at?;
        Some(SystemTime::now().duration_since(acquired_at).unwrap_or_default())
    }

    /// Renders the record as the lock file content (the identity and status made one
    /// line each).
    pub fn to_file_content(&self) -> String {
        let mut content = format!(
            "{HEADER}\npid={}\nidentity={}\n",
            self.pid,
            one_line(&self.identity)
        );
        if let Some(secs) = self.acquired_at.and_then(|at| at.duration_since(UNIX_EPOCH).ok()) {
            content.push_str(&format!("acquired_at={}\n", secs.as_secs()));
        }
        if let Some(status) = &self.status {
            content.push_str(&format!("status={}\n", one_line(status)));
        }
        content
    }

    /// Parses lock file content; `None` for an empty file, garbage, or a record without a
    /// valid (non-zero) pid. Never panics. [`read_holder`] reads a lock file with it.
    pub fn parse(content: &str) -> Option<Self> {
        let trimmed = content.trim();
        if let Ok(pid) = trimmed.parse::<u32>() {
            return (pid != 0).then(|| Self {
                pid,
                identity: String::new(),
                acquired_at: None,
                status: None,
            });
        }
        let (mut pid, mut identity, mut acquired_at, mut status) = (None, None, None, None);
        for line in trimmed
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with('#'))
        {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.trim();
            // The first occurrence wins, so text appended to a valid record cannot override it.
            match key.trim() {
                "pid" if pid.is_none() => pid = value.parse::<u32>().ok(),
                "identity" if identity.is_none() => identity = Some(value.to_owned()),
                "status" if status.is_none() => status = Some(value.to_owned()),
                "acquired_at" if acquired_at.is_none() => {
                    acquired_at = value
                        .parse::<u64>()
                        .ok()
                        .and_then(|secs| UNIX_EPOCH.checked_add(Duration::from_secs(secs)));
                }
                _ => {}
            }
        }
        Some(Self {
            pid: pid.filter(|&pid| pid != 0)?,
            identity: identity.unwrap_or_default(),
            acquired_at,
            status,
        })
    }
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.pid)?;
        if !self.identity.is_empty() {
            write!(f, " ({})", self.identity)?;
        }
        if let Some(held_for) = self.held_for() {
            write!(f, ", held for {}s", held_for.as_secs())?;
        }
        if let Some(status) = &self.status {
            write!(f, "; {status}")?;
        }
        Ok(())
    }
}

/// Reads the holder record of the lock file at `path`.
///
/// Returns `Ok(None)` when the file does not exist, is empty (bootkube's and `flock(1)`'s
/// lock files are), or holds something that is not a record. The record can be stale: it
/// does not say whether the lock is held right now — [`LockFile::try_acquire`] does.
/// Does not take the lock, so it never disturbs the holder or a waiter.
///
/// [`LockFile::try_acquire`]: crate::LockFile::try_acquire
///
/// # Errors
///
/// [`Error::NotRegularFile`] if the path is a directory, FIFO, …, and
/// [`Error::ReadHolder`] if it cannot be read (e.g. permission denied: the file is 0600).
pub fn read_holder(path: impl AsRef<Path>) -> Result<Option<LockHolder>> {
    let path = path.as_ref();
    let read_error = |source| Error::ReadHolder {
        path: path.to_owned(),
        source,
    };
    // Checked before opening: opening a FIFO for reading would block. A symlink is not
    // followed, as the lock does not follow one.
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_file() => {}
        Ok(metadata) => {
            return Err(Error::NotRegularFile {
                path: path.to_owned(),
                file_type: describe_file_type(metadata.file_type()),
            });
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(read_error(error)),
    }
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(read_error(error)),
    };
    let mut content = Vec::new();
    file.take(MAX_HOLDER_FILE_BYTES)
        .read_to_end(&mut content)
        .map_err(read_error)?;
    Ok(LockHolder::parse(&String::from_utf8_lossy(&content)))
}

/// Reads the holder record through an already open lock file descriptor (so it is the file
/// we tried to lock, even if the path was replaced since).
pub(crate) fn read_holder_from(file: &File) -> io::Result<Option<LockHolder>> {
    let mut content = vec![0; MAX_HOLDER_FILE_BYTES as usize];
    let mut filled = 0;
    while filled < content.len() {
        match file.read_at(&mut content[filled..], filled as u64) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    content.truncate(filled);
    Ok(LockHolder::parse(&String::from_utf8_lossy(&content)))
}

/// Writes `holder` as the lock file content through the locked descriptor and syncs it.
pub(crate) fn write_holder_to(file: &File, holder: &LockHolder) -> io::Result<()> {
    file.set_len(0)?;
    file.write_all_at(holder.to_file_content().as_bytes(), 0)?;
    file.sync_all()
}

/// Makes `identity` a single bounded line, so it cannot inject other keys into the record.
fn one_line(identity: &str) -> String {
    let mut end = identity.len().min(MAX_IDENTITY_BYTES);
    while !identity.is_char_boundary(end) {
        end -= 1;
    }
    identity[..end]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, identity: &str, acquired_at_secs: Option<u64>) -> LockHolder {
        LockHolder {
            pid,
            identity: identity.to_owned(),
            acquired_at: acquired_at_secs.map(|secs| UNIX_EPOCH + Duration::from_secs(secs)),
            status: None,
        }
    }

    #[test]
    fn status_round_trips_on_one_line() {
        let mut original = holder(9, "me", Some(1_700_000_000));
        original.status = Some("api=unauthorized since 2026-12-03T12:00:00Z".to_owned());
        assert_eq!(
            LockHolder::parse(&original.to_file_content()),
            Some(original.clone())
        );
        original.status = Some("a\npid=1".to_owned());
        let parsed = LockHolder::parse(&original.to_file_content()).expect("a record");
        assert_eq!((parsed.pid, parsed.status.as_deref()), (9, Some("a pid=1")));
    }

    #[test]
    fn record_round_trips() {
        let original = holder(
            4242,
            "pod-checkpointer pod=kube-system/pc-abc node=node-1",
            Some(1_700_000_000),
        );
        assert_eq!(LockHolder::parse(&original.to_file_content()), Some(original));
    }

    #[test]
    fn record_without_time_round_trips() {
        let original = holder(7, "x=y=z", None);
        assert_eq!(LockHolder::parse(&original.to_file_content()), Some(original));
    }

    #[test]
    fn current_is_this_process_now() {
        let current = LockHolder::current("me");
        assert_eq!(current.pid, std::process::id());
        assert_eq!(current.identity, "me");
        assert!(
            current
                .held_for()
                .is_some_and(|held| held < Duration::from_secs(60))
        );
        assert_eq!(LockHolder::parse(&current.to_file_content()), Some(current));
    }

    #[test]
    fn identity_cannot_inject_lines() {
        let original = holder(1, "evil\npid=99\r\nidentity=other", None);
        let parsed = LockHolder::parse(&original.to_file_content()).unwrap();
        assert_eq!(parsed.pid, 1);
        assert_eq!(parsed.identity, "evil pid=99  identity=other");
    }

    #[test]
    fn long_identity_is_cut_on_a_char_boundary() {
        let original = holder(1, &"é".repeat(MAX_IDENTITY_BYTES), None);
        let parsed = LockHolder::parse(&original.to_file_content()).unwrap();
        assert_eq!(parsed.identity, "é".repeat(MAX_IDENTITY_BYTES / 2));
    }

    #[test]
    fn bare_pid_file_is_understood() {
        assert_eq!(LockHolder::parse("1234\n"), Some(holder(1234, "", None)));
    }

    #[test]
    fn garbage_and_empty_content_is_no_holder() {
        for content in [
            "",
            "\n\n",
            "   ",
            "0",
            "-5",
            "pid=0\nidentity=x",
            "pid=-1",
            "pid=99999999999999999999",
            "identity=no pid",
            "hello world",
            "{\"pid\": 3}",
            "\u{0}\u{1}\u{2}",
            "=\n==\n=pid",
        ] {
            assert_eq!(LockHolder::parse(content), None, "{content:?}");
        }
    }

    #[test]
    fn partial_record_keeps_what_is_valid() {
        let parsed = LockHolder::parse("garbage\npid= 12 \nacquired_at=not-a-number\nfoo=bar").unwrap();
        assert_eq!(parsed, holder(12, "", None));
    }

    #[test]
    fn first_occurrence_of_a_key_wins() {
        assert_eq!(
            LockHolder::parse("pid=5\nidentity=a\npid=6\nidentity=b"),
            Some(holder(5, "a", None))
        );
    }

    #[test]
    fn time_overflow_is_not_a_panic() {
        let parsed = LockHolder::parse(&format!("pid=3\nacquired_at={}", u64::MAX)).unwrap();
        assert_eq!(parsed.acquired_at, None);
    }

    #[test]
    fn invalid_utf8_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        fs::write(&path, b"pid=8\nidentity=caf\xff\xfe\n").unwrap();
        let parsed = read_holder(&path).unwrap().unwrap();
        assert_eq!(parsed.pid, 8);
        assert!(parsed.identity.starts_with("caf"));
    }

    #[test]
    fn display_names_pid_and_identity() {
        assert_eq!(
            holder(9, "agent node=n1", None).to_string(),
            "pid 9 (agent node=n1)"
        );
        assert_eq!(holder(9, "", None).to_string(), "pid 9");
        assert!(
            LockHolder::current("a")
                .to_string()
                .starts_with(&format!("pid {} (a), held for ", std::process::id()))
        );
    }

    #[test]
    fn missing_file_is_no_holder() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_holder(dir.path().join("absent")).unwrap(), None);
    }

    #[test]
    fn huge_file_is_read_only_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let mut content = holder(77, "big", None).to_file_content();
        content.push_str(&"x".repeat(10 * MAX_HOLDER_FILE_BYTES as usize));
        fs::write(&path, content).unwrap();
        assert_eq!(read_holder(&path).unwrap(), Some(holder(77, "big", None)));
        let file = File::open(&path).unwrap();
        assert_eq!(read_holder_from(&file).unwrap(), Some(holder(77, "big", None)));
    }

    #[test]
    fn directory_is_not_a_lock_file() {
        let dir = tempfile::tempdir().unwrap();
        let error = read_holder(dir.path()).unwrap_err();
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
    }

    #[test]
    fn write_replaces_previous_longer_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        fs::write(&path, "x".repeat(5000)).unwrap();
        let file = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let record = holder(31, "short", Some(5));
        write_holder_to(&file, &record).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), record.to_file_content());
        assert_eq!(read_holder_from(&file).unwrap(), Some(record));
    }

    proptest::proptest! {
        /// Any lock file content (another tool's, garbage, a record with text appended):
        /// no panic; a record that parses, written back, reads as itself (its text made
        /// one line, as writing does).
        #[test]
        fn any_content_parses_or_not_and_records_read_back(content in proptest::prop_oneof![
            "\\PC{0,60}",
            "(pid=[0-9]{0,11}|identity=[ -~]{0,20}|acquired_at=[0-9]{0,21}|status=[ -~\\t\\r]{0,12}|#[ -~]{0,8}|[a-z=]{0,8})(\n(pid=[0-9]{0,11}|identity=[ -~]{0,20}|acquired_at=[0-9]{0,21}|status=.{0,12})){0,4}",
        ]) {
            if let Some(holder) = LockHolder::parse(&content) {
                let again = LockHolder::parse(&holder.to_file_content());
                let expected = LockHolder {
                    identity: one_line(&holder.identity).trim().to_owned(),
                    status: holder.status.as_deref().map(|s| one_line(s).trim().to_owned()),
                    ..holder.clone()
                };
                proptest::prop_assert_eq!(again, Some(expected), "{:?}", content);
            }
        }

        /// Whatever a holder is, its own record reads back with its pid and time.
        #[test]
        fn every_record_reads_back(
            pid in 1u32..,
            identity in "\\PC{0,80}",
            secs in proptest::option::of(0u64..4_000_000_000),
            status in proptest::option::of("\\PC{0,20}"),
        ) {
            let holder = LockHolder {
                pid,
                identity,
                acquired_at: secs.map(|secs| UNIX_EPOCH + Duration::from_secs(secs)),
                status,
            };
            let read = LockHolder::parse(&holder.to_file_content());
            proptest::prop_assert_eq!(read.as_ref().map(|h| (h.pid, h.acquired_at)), Some((pid, holder.acquired_at)));
        }
    }
}
