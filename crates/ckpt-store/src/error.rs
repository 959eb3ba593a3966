//! The one error type of this crate.

use std::io;
use std::path::{Path, PathBuf};

use ckpt_core::PodId;

/// Everything that can go wrong in the store. Every variant names the path it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The filesystem is full (`ENOSPC`, or out of quota). The previous content of the
    /// file is intact: new content goes to a temporary file that is only renamed into
    /// place once complete.
    #[error("no space left on device while {op} {}", path.display())]
    NoSpace {
        /// What we were doing, e.g. `writing`.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The filesystem is mounted read-only (`EROFS`); nothing was changed.
    #[error("read-only file system while {op} {}", path.display())]
    ReadOnlyFilesystem {
        /// What we were doing.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Any other I/O error.
    #[error("{op} {}", path.display())]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A symlink sits where one of our own directories belongs. We never follow it (it
    /// could point anywhere) and never replace it at this level (it could be an
    /// operator's choice); point `--checkpoint-dir` elsewhere instead.
    #[error("refusing to follow the symlink at {}", path.display())]
    Symlink {
        /// Where the symlink is.
        path: PathBuf,
    },
    /// Something other than a directory sits where one of our directories belongs.
    #[error("{} is not a directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// A file we would write or remove in the manifests dir is not one of ours (not a
    /// checkpoint of that pod); we never touch such files.
    #[error("{} exists and is not a checkpoint of {id}; leaving it alone", path.display())]
    NotOurs {
        /// The pod whose checkpoint we wanted to put there.
        id: PodId,
        /// The foreign file.
        path: PathBuf,
    },
    /// A name that would become a path component is not a valid Kubernetes name.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// Which kind of name (`namespace`, `pod name`, `data file path`, …).
        what: &'static str,
        /// The offending value.
        value: String,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// A checkpoint handed to the store is inconsistent with itself.
    #[error("checkpoint of {id} is invalid: {reason}")]
    InvalidCheckpoint {
        /// The parent pod.
        id: PodId,
        /// What is wrong.
        reason: String,
    },
    /// `activate` was asked for a pod that has no inactive checkpoint.
    #[error("no inactive checkpoint of {id} in {}", dir.display())]
    NoInactiveCheckpoint {
        /// The pod.
        id: PodId,
        /// The inactive manifests directory.
        dir: PathBuf,
    },
    /// Changing the owner of a file or directory failed (typically `EPERM` when not
    /// running as root and the owner differs from ours).
    #[error("changing the owner of {} to {uid}:{gid}", path.display())]
    Chown {
        /// The file or directory.
        path: PathBuf,
        /// The wanted user id.
        uid: u32,
        /// The wanted group id.
        gid: u32,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The state journal could not be serialized.
    #[error("serializing the state journal {}", path.display())]
    Serialize {
        /// The journal path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// The layout puts two of our directories at the same place.
    #[error("the manifests dir {} overlaps the checkpoint store's own {}", manifests_dir.display(), ours.display())]
    LayoutConflict {
        /// The configured manifests dir.
        manifests_dir: PathBuf,
        /// Our directory it coincides with.
        ours: PathBuf,
    },
    /// A write was attempted on a store opened with [`crate::Store::open_read_only`].
    #[error("the store at {} was opened read-only", checkpoint_dir.display())]
    ReadOnlyStore {
        /// The checkpoint dir.
        checkpoint_dir: PathBuf,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error while doing `op` on `path`, sorted into [`Error::NoSpace`],
    /// [`Error::ReadOnlyFilesystem`] or [`Error::Io`].
    pub(crate) fn io(op: &'static str, path: &Path, source: impl Into<io::Error>) -> Self {
        let source = source.into();
        let path = path.to_path_buf();
        match source.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Error::NoSpace { op, path, source },
            io::ErrorKind::ReadOnlyFilesystem => Error::ReadOnlyFilesystem { op, path, source },
            _ => Error::Io { op, path, source },
        }
    }

    /// Whether the error is the disk being full or read-only: the previous content is
    /// intact and retrying later (after an operator frees space) is the right reaction.
    pub fn is_disk_unwritable(&self) -> bool {
        matches!(self, Error::NoSpace { .. } | Error::ReadOnlyFilesystem { .. })
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn io_errors_are_sorted_by_kind() {
        let check = |kind: io::ErrorKind, expected: &str, unwritable: bool| {
            let e = Error::io("writing", Path::new("/x/y"), io::Error::from(kind));
            assert_eq!(e.to_string(), expected, "{kind:?}");
            assert_eq!(e.is_disk_unwritable(), unwritable, "{kind:?}");
            assert!(e.source().is_some(), "the cause is kept");
        };
        check(
            io::ErrorKind::StorageFull,
            "no space left on device while writing /x/y",
            true,
        );
        check(
            io::ErrorKind::QuotaExceeded,
            "no space left on device while writing /x/y",
            true,
        );
        check(
            io::ErrorKind::ReadOnlyFilesystem,
            "read-only file system while writing /x/y",
            true,
        );
        check(io::ErrorKind::PermissionDenied, "writing /x/y", false);
    }

    #[test]
    fn messages_have_no_trailing_period() {
        let errors = [
            Error::Symlink { path: "/a".into() },
            Error::NotOurs {
                id: PodId::new("ns", "p"),
                path: "/m/ns_p.json".into(),
            },
            Error::InvalidName {
                what: "namespace",
                value: "A".into(),
                reason: "must be a DNS label",
            },
        ];
        for e in errors {
            let text = e.to_string();
            assert!(!text.ends_with('.'), "{text}");
        }
    }
}
