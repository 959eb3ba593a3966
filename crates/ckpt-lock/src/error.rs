//! The crate's error type.

use std::fs::FileType;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

/// Everything that can go wrong while taking the lock or reading its holder.
///
/// A busy lock is not an error: [`LockFile::try_acquire`](crate::LockFile::try_acquire)
/// reports it as [`TryAcquire::Busy`](crate::TryAcquire::Busy). Failing to write the
/// diagnostic holder info is not an error either (it is logged), because the flock, not the
/// file content, is the lock.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The directory that should contain the lock file could not be created.
    #[error("cannot create lock directory {}", path.display())]
    CreateDir {
        /// The directory we tried to create.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// The lock file could not be opened or created.
    #[error("cannot open lock file {}", path.display())]
    Open {
        /// The lock file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// The lock path exists but is not a regular file (a symlink, a directory, a FIFO …).
    ///
    /// Symlinks are refused on purpose: the holder writes into the lock file, and a planted
    /// symlink must not make a root process overwrite another file.
    #[error("lock file {} is a {file_type}, not a regular file", path.display())]
    NotRegularFile {
        /// The lock file.
        path: PathBuf,
        /// What was found instead, e.g. `symlink` or `directory`.
        file_type: &'static str,
    },

    /// The lock file is not safe to lock: another user created it, or could open it (and
    /// so hold the lock forever) or write it.
    #[error("refusing lock file {}: {reason}", path.display())]
    UnsafeLockFile {
        /// The lock file.
        path: PathBuf,
        /// What is wrong with it, and why that matters.
        reason: String,
    },

    /// The lock file's directory lets another user replace the lock file.
    #[error("refusing lock file {}: its directory {} is unsafe: {reason}", path.display(), dir.display())]
    UnsafeLockDir {
        /// The lock file.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// `flock(2)` itself failed (not merely "busy").
    #[error("cannot flock lock file {}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// The lock file was deleted or replaced again and again while we opened and locked it,
    /// so we never held a lock on the file that is at the path.
    #[error("lock file {} kept being replaced while locking it ({attempts} attempts)", path.display())]
    KeptChanging {
        /// The lock file.
        path: PathBuf,
        /// How many times we opened and locked it.
        attempts: u32,
    },

    /// The holder info could not be read from the lock file.
    #[error("cannot read lock holder from {}", path.display())]
    ReadHolder {
        /// The lock file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
}

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of file is at a lock path, for [`Error::NotRegularFile`].
pub(crate) fn describe_file_type(file_type: FileType) -> &'static str {
    if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_fifo() {
        "fifo"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "device"
    } else if file_type.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn every_variant() -> Vec<Error> {
        let path = || PathBuf::from("/run/lock/x.lock");
        let io = || io::Error::from(io::ErrorKind::PermissionDenied);
        vec![
            Error::CreateDir {
                path: path(),
                source: io(),
            },
            Error::Open {
                path: path(),
                source: io(),
            },
            Error::NotRegularFile {
                path: path(),
                file_type: "symlink",
            },
            Error::UnsafeLockFile {
                path: path(),
                reason: "it is owned by uid 65534".into(),
            },
            Error::UnsafeLockDir {
                path: path(),
                dir: "/run/lock".into(),
                reason: "its mode is 0777".into(),
            },
            Error::Lock {
                path: path(),
                source: io(),
            },
            Error::KeptChanging {
                path: path(),
                attempts: 16,
            },
            Error::ReadHolder {
                path: path(),
                source: io(),
            },
        ]
    }

    #[test]
    fn messages_name_the_path_and_have_no_trailing_period() {
        for error in every_variant() {
            let message = error.to_string();
            assert!(message.contains("/run/lock/x.lock"), "{message}");
            assert!(!message.ends_with('.'), "{message}");
        }
    }

    #[test]
    fn io_causes_are_sources_not_part_of_the_message() {
        for error in every_variant() {
            if let Some(source) = error.source() {
                assert!(!error.to_string().contains(&source.to_string()), "{error}");
            }
        }
    }
}
