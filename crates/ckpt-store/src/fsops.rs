//! File operations relative to directory handles that never follow a symlink.
//!
//! Why handles and `*at` calls (`openat(O_NOFOLLOW)`, `renameat`, `unlinkat`, `mkdirat`)
//! instead of paths checked with `symlink_metadata`: volume directories of the previous
//! layout (and of bootkube) are owned by the pod's uid, and a checkpoint that mounted them
//! writable let any process of that uid swap entries inside them at any moment. A
//! check-then-use on paths loses that race; an operation relative to a directory handle
//! we opened with `O_NOFOLLOW` does not, because the kernel never re-resolves the path
//! above it. (A hand-written `O_NOFOLLOW` constant would also be wrong on some targets:
//! it is `0o400000` on x86 but `0o100000` on arm64; rustix gets it from the kernel
//! headers and wraps the calls safely, and is already in the dependency tree through
//! `tempfile`.)

use std::collections::hash_map::RandomState;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{File, Permissions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use ckpt_core::FileOwner;
use rustix::fs::{AtFlags, CWD, Mode, OFlags};
use rustix::io::Errno;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::failpoint;

/// Every temporary file we create starts with this (a dotfile: the kubelet ignores it).
pub(crate) const TEMP_PREFIX: &str = ".pod-checkpointer-";
/// … and ends with this.
pub(crate) const TEMP_SUFFIX: &str = ".tmp";
/// Deepest directory nesting we descend into when removing a tree (each level holds one
/// open file descriptor). `items[].path` nests a few levels at most; an attacker's deeper
/// tree is still removed, by moving its deep parts up (see [`Dir::remove_tree`]).
const MAX_TREE_DEPTH: usize = 64;
/// How many names of one directory a removal reads at once.
const REMOVAL_BATCH: usize = 1024;
/// How often an operation is retried when an entry changes type under it (a racing
/// process of the pod's uid swapping a directory for a symlink, say).
const RACE_RETRIES: usize = 4;

/// A random tag per process, so a cleanup never removes a temp file this process is
/// still writing, while one left by a killed predecessor (same pid, in a container,
/// is likely) is recognised as stale.
static PROCESS_TAG: LazyLock<String> = LazyLock::new(|| {
    // RandomState is seeded from the OS's randomness: no extra dependency needed.
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
});
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Whether a file name is one of our temporary files (of any process).
pub(crate) fn is_temp_name(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    bytes.starts_with(TEMP_PREFIX.as_bytes()) && bytes.ends_with(TEMP_SUFFIX.as_bytes())
}

/// Whether a temporary file name was made by this very process.
fn is_own_temp_name(name: &OsStr) -> bool {
    let own = format!("{TEMP_PREFIX}{}-", *PROCESS_TAG);
    name.as_bytes().starts_with(own.as_bytes())
}

/// A name part no other call (in this process or another) returns.
pub(crate) fn unique_suffix() -> String {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n}", *PROCESS_TAG)
}

fn temp_name() -> String {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{TEMP_PREFIX}{}-{n}{TEMP_SUFFIX}", *PROCESS_TAG)
}

/// What kind of entry a name refers to (never following a symlink).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    fn of(file_type: std::fs::FileType) -> Self {
        if file_type.is_file() {
            Kind::File
        } else if file_type.is_dir() {
            Kind::Dir
        } else if file_type.is_symlink() {
            Kind::Symlink
        } else {
            Kind::Other
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::File => "regular file",
            Kind::Dir => "directory",
            Kind::Symlink => "symlink",
            Kind::Other => "special file",
        })
    }
}

/// One directory entry.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) name: OsString,
    pub(crate) kind: Kind,
}

/// A regular file's content and metadata.
#[derive(Clone, Debug)]
pub(crate) struct Contents {
    pub(crate) bytes: Vec<u8>,
    /// Permission bits (`& 0o7777`).
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) links: u64,
}

/// What reading a name found.
#[derive(Debug)]
pub(crate) enum ReadOutcome {
    Missing,
    NotRegular(Kind),
    TooLarge(u64),
    Read(Contents),
}

/// An open directory. Every operation on a name inside it is relative to this handle.
#[derive(Debug)]
pub(crate) struct Dir {
    file: File,
    path: PathBuf,
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC
}

fn mode_bits(mode: u32) -> Mode {
    Mode::from_bits_truncate(mode)
}

/// Changes the owner of an open file or directory unless it already has it: as a
/// non-root user, a `chown` to our own ids would be the only one that can succeed, and
/// skipping it keeps that case working.
fn chown_if_needed(file: &File, path: &Path, owner: FileOwner) -> Result<()> {
    let meta = file.metadata().map_err(|e| Error::io("inspecting", path, e))?;
    if meta.uid() == owner.uid && meta.gid() == owner.gid {
        return Ok(());
    }
    std::os::unix::fs::fchown(file, Some(owner.uid), Some(owner.gid)).map_err(|source| Error::Chown {
        path: path.to_path_buf(),
        uid: owner.uid,
        gid: owner.gid,
        source,
    })
}

impl Dir {
    /// The directory's path (for messages; operations use the handle).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of an entry (for messages and results).
    pub(crate) fn child_path(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// Opens a configured directory. Symlinks in the configured path are followed: the
    /// operator chose it. `None` if it does not exist.
    pub(crate) fn open_trusted(path: &Path) -> Result<Option<Dir>> {
        match rustix::fs::openat(CWD, path, dir_flags(), Mode::empty()) {
            Ok(fd) => Ok(Some(Dir {
                file: File::from(fd),
                path: path.to_path_buf(),
            })),
            Err(Errno::NOENT) => Ok(None),
            Err(Errno::NOTDIR) => Err(Error::NotADirectory {
                path: path.to_path_buf(),
            }),
            Err(e) => Err(Error::io("opening directory", path, e)),
        }
    }

    /// Opens a configured directory, creating it (and its parents) with `mode` if
    /// missing.
    pub(crate) fn open_or_create_trusted(path: &Path, mode: u32) -> Result<Dir> {
        if let Some(dir) = Self::open_trusted(path)? {
            return Ok(dir);
        }
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)
            .map_err(|e| Error::io("creating directory", path, e))?;
        let dir = Self::open_trusted(path)?.ok_or_else(|| {
            Error::io(
                "opening directory",
                path,
                io::Error::from(io::ErrorKind::NotFound),
            )
        })?;
        // The umask may have narrowed the mode.
        dir.file
            .set_permissions(Permissions::from_mode(mode))
            .map_err(|e| Error::io("setting the mode of", path, e))?;
        debug!(path = %path.display(), mode = format_args!("{mode:o}"), "created directory");
        Ok(dir)
    }

    fn open_dir_at(&self, name: &OsStr) -> rustix::io::Result<Dir> {
        let fd = rustix::fs::openat(&self.file, name, dir_flags() | OFlags::NOFOLLOW, Mode::empty())?;
        Ok(Dir {
            file: File::from(fd),
            path: self.child_path(name),
        })
    }

    /// The kind of the entry `name`, without following it; `None` if it does not exist.
    pub(crate) fn kind_of(&self, name: impl AsRef<OsStr>) -> Result<Option<Kind>> {
        let name = name.as_ref();
        // O_PATH opens the entry itself (a symlink too, with O_NOFOLLOW) without any
        // side effect on devices or FIFOs; fstat then tells what it is.
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(&self.file, name, flags, Mode::empty()) {
            Ok(fd) => {
                let meta = File::from(fd)
                    .metadata()
                    .map_err(|e| Error::io("inspecting", &self.child_path(name), e))?;
                Ok(Some(Kind::of(meta.file_type())))
            }
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(Error::io("inspecting", &self.child_path(name), e)),
        }
    }

    fn wrong_type_error(&self, name: &OsStr) -> Result<Error> {
        let path = self.child_path(name);
        Ok(match self.kind_of(name)? {
            Some(Kind::Symlink) => Error::Symlink { path },
            _ => Error::NotADirectory { path },
        })
    }

    /// Opens the subdirectory `name`; `None` if missing. A symlink or a non-directory
    /// there is an error ([`Error::Symlink`], [`Error::NotADirectory`]).
    pub(crate) fn open_child(&self, name: impl AsRef<OsStr>) -> Result<Option<Dir>> {
        let name = name.as_ref();
        match self.open_dir_at(name) {
            Ok(dir) => Ok(Some(dir)),
            Err(Errno::NOENT) => Ok(None),
            Err(Errno::LOOP | Errno::NOTDIR) => Err(self.wrong_type_error(name)?),
            Err(e) => Err(Error::io("opening directory", &self.child_path(name), e)),
        }
    }

    /// Opens the subdirectory `name`, creating it if missing, and gives it `mode` and
    /// (if given) `owner`. Something else in the way is an error, or, with
    /// `replace_wrong_type`, removed (a symlink is unlinked, never followed).
    pub(crate) fn ensure_child(
        &self,
        name: impl AsRef<OsStr>,
        mode: u32,
        owner: Option<FileOwner>,
        replace_wrong_type: bool,
    ) -> Result<Dir> {
        let name = name.as_ref();
        let mut created = false;
        for _ in 0..RACE_RETRIES {
            match self.open_dir_at(name) {
                Ok(dir) => {
                    dir.set_mode_and_owner(mode, owner)?;
                    if created {
                        // Make the new entry durable before anything inside relies on it.
                        self.sync()?;
                    }
                    return Ok(dir);
                }
                Err(Errno::NOENT) => match rustix::fs::mkdirat(&self.file, name, mode_bits(mode)) {
                    Ok(()) => created = true,
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(Error::io("creating directory", &self.child_path(name), e)),
                },
                Err(Errno::LOOP | Errno::NOTDIR) => {
                    let error = self.wrong_type_error(name)?;
                    if !replace_wrong_type {
                        return Err(error);
                    }
                    warn!(
                        path = %self.child_path(name).display(),
                        found = %error,
                        "removing what sits where our directory belongs (a symlink is not followed)"
                    );
                    self.remove_tree(name)?;
                }
                Err(e) => return Err(Error::io("opening directory", &self.child_path(name), e)),
            }
        }
        Err(Error::io(
            "creating directory",
            &self.child_path(name),
            io::Error::other("the entry kept changing while being created"),
        ))
    }

    /// Gives this directory exactly `mode` and, if given, `owner`.
    pub(crate) fn set_mode_and_owner(&self, mode: u32, owner: Option<FileOwner>) -> Result<()> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| Error::io("inspecting", &self.path, e))?;
        if meta.mode() & 0o7777 != mode {
            self.file
                .set_permissions(Permissions::from_mode(mode))
                .map_err(|e| Error::io("setting the mode of", &self.path, e))?;
        }
        if let Some(owner) = owner {
            chown_if_needed(&self.file, &self.path, owner)?;
        }
        Ok(())
    }

    /// The entries of this directory (without `.` and `..`), sorted by name.
    pub(crate) fn entries(&self) -> Result<Vec<Entry>> {
        let listing_error = |e: Errno| Error::io("listing", &self.path, e);
        let mut entries = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.file).map_err(listing_error)? {
            let entry = entry.map_err(listing_error)?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            use rustix::fs::FileType;
            let kind = match entry.file_type() {
                FileType::RegularFile => Kind::File,
                FileType::Directory => Kind::Dir,
                FileType::Symlink => Kind::Symlink,
                // Some filesystems do not fill in d_type.
                FileType::Unknown => match self.kind_of(name)? {
                    Some(kind) => kind,
                    None => continue,
                },
                _ => Kind::Other,
            };
            entries.push(Entry {
                name: name.to_os_string(),
                kind,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// Reads a regular file, at most `limit` bytes. Never follows a symlink, never opens
    /// a FIFO or device (an attacker's FIFO would block us forever).
    pub(crate) fn read_file(&self, name: impl AsRef<OsStr>, limit: u64) -> Result<ReadOutcome> {
        let name = name.as_ref();
        let path = || self.child_path(name);
        match self.kind_of(name)? {
            None => return Ok(ReadOutcome::Missing),
            Some(Kind::File) => {}
            Some(other) => return Ok(ReadOutcome::NotRegular(other)),
        }
        failpoint::hit("fsops.read", &path()).map_err(|e| Error::io("reading", &path(), e))?;
        // NONBLOCK: should the entry have been swapped for a FIFO since, opening it
        // does not wait for a writer; fstat below then rejects it.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let file = match rustix::fs::openat(&self.file, name, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::NOENT) => return Ok(ReadOutcome::Missing),
            Err(Errno::LOOP) => return Ok(ReadOutcome::NotRegular(Kind::Symlink)),
            Err(Errno::NXIO) => return Ok(ReadOutcome::NotRegular(Kind::Other)),
            Err(e) => return Err(Error::io("reading", &path(), e)),
        };
        let meta = file.metadata().map_err(|e| Error::io("inspecting", &path(), e))?;
        let kind = Kind::of(meta.file_type());
        if kind != Kind::File {
            return Ok(ReadOutcome::NotRegular(kind));
        }
        if meta.len() > limit {
            return Ok(ReadOutcome::TooLarge(meta.len()));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        // `take` guards against a file growing after the fstat.
        file.take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io("reading", &path(), e))?;
        if bytes.len() as u64 > limit {
            return Ok(ReadOutcome::TooLarge(bytes.len() as u64));
        }
        Ok(ReadOutcome::Read(Contents {
            bytes,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            links: meta.nlink(),
        }))
    }

    /// Whether `name` is a regular file with exactly these bytes, mode and (if given)
    /// owner, and no other hard link (a link elsewhere would share our writes).
    pub(crate) fn file_matches(
        &self,
        name: &OsStr,
        bytes: &[u8],
        mode: u32,
        owner: Option<FileOwner>,
    ) -> Result<bool> {
        let contents = match self.read_file(name, bytes.len() as u64)? {
            ReadOutcome::Read(contents) => contents,
            ReadOutcome::Missing | ReadOutcome::NotRegular(_) | ReadOutcome::TooLarge(_) => return Ok(false),
        };
        let owner_matches = owner.is_none_or(|o| o.uid == contents.uid && o.gid == contents.gid);
        Ok(contents.bytes == bytes && contents.mode == mode && contents.links == 1 && owner_matches)
    }

    /// Writes `name` atomically unless it already holds exactly this: a temporary
    /// dotfile in this directory → write → chmod/chown → fsync → rename over `name`.
    /// Returns whether it wrote. The caller fsyncs the directory ([`Dir::sync`]) once
    /// after a batch of writes.
    ///
    /// chmod/chown happen before the fsync so the metadata is as durable as the data,
    /// and before the rename so the file is never visible with the wrong permissions.
    pub(crate) fn write_file(
        &self,
        name: impl AsRef<OsStr>,
        bytes: &[u8],
        mode: u32,
        owner: Option<FileOwner>,
    ) -> Result<bool> {
        let name = name.as_ref();
        if self.file_matches(name, bytes, mode, owner)? {
            return Ok(false);
        }
        let target = self.child_path(name);
        let (temp, mut file) = self.create_temp(&target)?;
        let result = (|| {
            file.write_all(bytes)
                .map_err(|e| Error::io("writing", &target, e))?;
            file.set_permissions(Permissions::from_mode(mode))
                .map_err(|e| Error::io("setting the mode of", &target, e))?;
            if let Some(owner) = owner {
                chown_if_needed(&file, &target, owner)?;
            }
            failpoint::hit("fsops.fsync", &target).map_err(|e| Error::io("syncing", &target, e))?;
            file.sync_all().map_err(|e| Error::io("syncing", &target, e))?;
            drop(file);
            failpoint::hit("fsops.rename", &target)
                .map_err(|e| Error::io("renaming into place", &target, e))?;
            rustix::fs::renameat(&self.file, temp.as_str(), &self.file, name)
                .map_err(|e| Error::io("renaming into place", &target, e))
        })();
        if let Err(error) = result {
            // Best effort: a leftover temp file is removed by the next cleanup anyway.
            let _ = rustix::fs::unlinkat(&self.file, temp.as_str(), AtFlags::empty());
            return Err(error);
        }
        debug!(path = %target.display(), bytes = bytes.len(), mode = format_args!("{mode:o}"), "wrote file");
        Ok(true)
    }

    fn create_temp(&self, target: &Path) -> Result<(String, File)> {
        // O_EXCL never opens an existing entry, so a planted symlink or file under the
        // temp name cannot redirect the write; we just pick another name.
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        for _ in 0..RACE_RETRIES {
            let name = temp_name();
            match rustix::fs::openat(&self.file, name.as_str(), flags, mode_bits(0o600)) {
                Ok(fd) => return Ok((name, File::from(fd))),
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(Error::io("creating a temporary file for", target, e)),
            }
        }
        Err(Error::io(
            "creating a temporary file for",
            target,
            io::Error::from(io::ErrorKind::AlreadyExists),
        ))
    }

    /// fsyncs the directory, making renames and removals in it durable.
    pub(crate) fn sync(&self) -> Result<()> {
        failpoint::hit("fsops.dirsync", &self.path)
            .map_err(|e| Error::io("syncing directory", &self.path, e))?;
        self.file
            .sync_all()
            .map_err(|e| Error::io("syncing directory", &self.path, e))
    }

    /// Removes the non-directory entry `name` (a symlink itself, never its target).
    /// Returns whether it existed.
    pub(crate) fn remove_file(&self, name: impl AsRef<OsStr>) -> Result<bool> {
        let name = name.as_ref();
        failpoint::hit("fsops.unlink", &self.child_path(name))
            .map_err(|e| Error::io("removing", &self.child_path(name), e))?;
        match rustix::fs::unlinkat(&self.file, name, AtFlags::empty()) {
            Ok(()) => {
                debug!(path = %self.child_path(name).display(), "removed file");
                Ok(true)
            }
            Err(Errno::NOENT) => Ok(false),
            // A read-only file system refuses an unlink before it looks the name up: a
            // name that is not there is removed all the same (the pod's read-only root
            // around its mounts, where earlier versions' files may have been).
            Err(Errno::ROFS) if self.kind_of(name)?.is_none() => Ok(false),
            Err(e) => Err(Error::io("removing", &self.child_path(name), e)),
        }
    }

    /// Removes the directory `name` if it is empty; `false` if it is missing, not empty, or
    /// in use as a mount point (in a pod, each of the store's dirs is a mount of its own).
    pub(crate) fn remove_empty_dir(&self, name: impl AsRef<OsStr>) -> Result<bool> {
        let name = name.as_ref();
        match rustix::fs::unlinkat(&self.file, name, AtFlags::REMOVEDIR) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT | Errno::NOTEMPTY | Errno::EXIST | Errno::BUSY) => Ok(false),
            // As for a file: the read-only root around a pod's mounts refuses first.
            Err(Errno::ROFS) if self.kind_of(name)?.is_none_or(|kind| kind == Kind::Dir) => Ok(false),
            Err(e) => Err(Error::io("removing", &self.child_path(name), e)),
        }
    }

    /// Removes whatever `name` is, recursively, without following any symlink (a
    /// symlink is unlinked itself). Returns whether it existed.
    ///
    /// Removal always finishes, however deep the tree (an attacker's tree is as deep as
    /// they like): at most [`MAX_TREE_DEPTH`] directories are open at once, and a
    /// directory found below that depth is moved up to the top of the tree being removed
    /// and emptied from there. Memory is bounded too: a directory is read
    /// [`REMOVAL_BATCH`] names at a time.
    pub(crate) fn remove_tree(&self, name: impl AsRef<OsStr>) -> Result<bool> {
        let name = name.as_ref();
        let path = || self.child_path(name);
        for _ in 0..RACE_RETRIES {
            failpoint::hit("fsops.unlink", &path()).map_err(|e| Error::io("removing", &path(), e))?;
            let unlinked = rustix::fs::unlinkat(&self.file, name, AtFlags::empty());
            match unlinked {
                Ok(()) => return Ok(true),
                Err(Errno::NOENT) => return Ok(false),
                // A directory (Linux says EISDIR, POSIX allows EPERM): empty it below.
                Err(Errno::ISDIR | Errno::PERM) => {}
                Err(e) => return Err(Error::io("removing", &path(), e)),
            }
            let top = match self.open_dir_at(name) {
                Ok(top) => top,
                Err(Errno::NOENT) => return Ok(false),
                // EPERM on a non-directory: immutable or append-only, retrying cannot help.
                Err(Errno::LOOP | Errno::NOTDIR) if unlinked == Err(Errno::PERM) => {
                    return Err(Error::io("removing", &path(), Errno::PERM));
                }
                // Swapped for a non-directory meanwhile: unlink again.
                Err(Errno::LOOP | Errno::NOTDIR) => continue,
                Err(e) => return Err(Error::io("removing", &path(), e)),
            };
            top.empty_out(&top, 0)?;
            match rustix::fs::unlinkat(&self.file, name, AtFlags::REMOVEDIR) {
                Ok(()) => {
                    debug!(path = %path().display(), "removed directory");
                    return Ok(true);
                }
                Err(Errno::NOENT) => return Ok(true),
                // Refilled meanwhile: go again.
                Err(Errno::NOTEMPTY | Errno::EXIST) => continue,
                Err(e) => return Err(Error::io("removing", &path(), e)),
            }
        }
        Err(Error::io(
            "removing",
            &path(),
            io::Error::other("the entry kept changing while being removed"),
        ))
    }

    /// Removes everything in this directory, which lies `depth` levels below `top`.
    /// Subdirectories deeper than [`MAX_TREE_DEPTH`] are moved up into `top` (a rename
    /// within the tree being removed, so nothing ever leaves it) and emptied later from
    /// there: the recursion, and the descriptors held open, stay bounded.
    fn empty_out(&self, top: &Dir, depth: usize) -> Result<()> {
        let mut fruitless = 0;
        loop {
            let batch = self.some_names(REMOVAL_BATCH)?;
            if batch.is_empty() {
                return Ok(());
            }
            let mut progress = false;
            for name in &batch {
                progress |= self.remove_entry(name, top, depth)?;
            }
            // A racer refilling the directory as fast as we empty it: give up for now
            // (the caller reports it; the next pass retries).
            fruitless = if progress { 0 } else { fruitless + 1 };
            if fruitless >= RACE_RETRIES {
                return Err(Error::io(
                    "removing",
                    &self.path,
                    io::Error::other("the directory kept changing while being emptied"),
                ));
            }
        }
    }

    /// Removes (or, too deep, moves up into `top`) the entry `name` of this directory;
    /// whether anything changed.
    fn remove_entry(&self, name: &OsStr, top: &Dir, depth: usize) -> Result<bool> {
        let path = || self.child_path(name);
        failpoint::hit("fsops.unlink", &path()).map_err(|e| Error::io("removing", &path(), e))?;
        let unlinked = rustix::fs::unlinkat(&self.file, name, AtFlags::empty());
        match unlinked {
            Ok(()) => return Ok(true),
            Err(Errno::NOENT) => return Ok(true),
            Err(Errno::ISDIR | Errno::PERM) => {}
            Err(e) => return Err(Error::io("removing", &path(), e)),
        }
        if depth + 1 >= MAX_TREE_DEPTH {
            let hoisted = format!(".deep-{}", unique_suffix());
            return match rustix::fs::renameat(&self.file, name, &top.file, hoisted.as_str()) {
                Ok(()) => Ok(true),
                Err(Errno::NOENT) => Ok(true),
                Err(e) => Err(Error::io("moving up", &path(), e)),
            };
        }
        let child = match self.open_dir_at(name) {
            Ok(child) => child,
            Err(Errno::NOENT) => return Ok(true),
            // EPERM on a non-directory: immutable or append-only, retrying cannot help.
            Err(Errno::LOOP | Errno::NOTDIR) if unlinked == Err(Errno::PERM) => {
                return Err(Error::io("removing", &path(), Errno::PERM));
            }
            // Swapped for a non-directory since: the next batch unlinks it.
            Err(Errno::LOOP | Errno::NOTDIR) => return Ok(false),
            Err(e) => return Err(Error::io("removing", &path(), e)),
        };
        child.empty_out(top, depth + 1)?;
        match rustix::fs::unlinkat(&self.file, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(true),
            // Refilled meanwhile: the next batch sees it again.
            Err(Errno::NOTEMPTY | Errno::EXIST) => Ok(false),
            Err(e) => Err(Error::io("removing", &path(), e)),
        }
    }

    /// Up to `limit` names of this directory (without `.` and `..`), in directory order.
    fn some_names(&self, limit: usize) -> Result<Vec<OsString>> {
        let listing_error = |e: Errno| Error::io("listing", &self.path, e);
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.file).map_err(listing_error)? {
            let entry = entry.map_err(listing_error)?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            names.push(name.to_os_string());
            if names.len() == limit {
                break;
            }
        }
        Ok(names)
    }

    /// Renames `name` to `to_name` in `to` (moving the entry itself, never a target).
    pub(crate) fn rename(&self, name: impl AsRef<OsStr>, to: &Dir, to_name: impl AsRef<OsStr>) -> Result<()> {
        let name = name.as_ref();
        rustix::fs::renameat(&self.file, name, &to.file, to_name.as_ref())
            .map_err(|e| Error::io("moving", &self.child_path(name), e))
    }

    /// This directory's permission bits.
    pub(crate) fn mode(&self) -> Result<u32> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| Error::io("inspecting", &self.path, e))?;
        Ok(meta.mode() & 0o7777)
    }

    /// The target of the symlink `name`; `None` if `name` is missing or not a symlink.
    pub(crate) fn read_link(&self, name: impl AsRef<OsStr>) -> Result<Option<OsString>> {
        let name = name.as_ref();
        match rustix::fs::readlinkat(&self.file, name, Vec::new()) {
            Ok(target) => Ok(Some(OsStr::from_bytes(target.as_bytes()).to_os_string())),
            Err(Errno::NOENT | Errno::INVAL) => Ok(None),
            Err(e) => Err(Error::io("reading the link", &self.child_path(name), e)),
        }
    }

    /// Creates the symlink `name` pointing to `target` (which is never resolved here).
    pub(crate) fn symlink(&self, target: impl AsRef<OsStr>, name: impl AsRef<OsStr>) -> Result<()> {
        let name = name.as_ref();
        rustix::fs::symlinkat(target.as_ref(), &self.file, name)
            .map_err(|e| Error::io("creating the link", &self.child_path(name), e))
    }

    /// Swaps the entries `a` and `b` of this directory in one step (`RENAME_EXCHANGE`),
    /// whatever their types: how a directory is replaced by a symlink without a moment in
    /// which neither is there.
    pub(crate) fn exchange(&self, a: impl AsRef<OsStr>, b: impl AsRef<OsStr>) -> Result<()> {
        let b = b.as_ref();
        rustix::fs::renameat_with(
            &self.file,
            a.as_ref(),
            &self.file,
            b,
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .map_err(|e| Error::io("replacing", &self.child_path(b), e))
    }

    /// Creates the new directory `name` with exactly `mode` (the umask aside) and opens
    /// it; `None` if the name is taken.
    pub(crate) fn create_child(&self, name: impl AsRef<OsStr>, mode: u32) -> Result<Option<Dir>> {
        let name = name.as_ref();
        match rustix::fs::mkdirat(&self.file, name, mode_bits(mode)) {
            Ok(()) => {}
            Err(Errno::EXIST) => return Ok(None),
            Err(e) => return Err(Error::io("creating directory", &self.child_path(name), e)),
        }
        let dir = self
            .open_dir_at(name)
            .map_err(|e| Error::io("opening directory", &self.child_path(name), e))?;
        dir.set_mode_and_owner(mode, None)?;
        Ok(Some(dir))
    }

    /// Creates the new regular file `name` (never opening an existing entry) holding
    /// `bytes`, with `mode` and `owner`, and fsyncs it. For directories nobody else sees
    /// yet (a new version of a volume): elsewhere, [`Dir::write_file`] replaces atomically.
    pub(crate) fn create_file(
        &self,
        name: impl AsRef<OsStr>,
        bytes: &[u8],
        mode: u32,
        owner: Option<FileOwner>,
    ) -> Result<()> {
        let name = name.as_ref();
        let path = self.child_path(name);
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut file = rustix::fs::openat(&self.file, name, flags, mode_bits(0o600))
            .map(File::from)
            .map_err(|e| Error::io("creating", &path, e))?;
        file.write_all(bytes)
            .map_err(|e| Error::io("writing", &path, e))?;
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(|e| Error::io("setting the mode of", &path, e))?;
        if let Some(owner) = owner {
            chown_if_needed(&file, &path, owner)?;
        }
        file.sync_all().map_err(|e| Error::io("syncing", &path, e))
    }

    /// Removes temporary files left by a killed writer (ours only: the prefix and suffix
    /// we use, another process's tag), descending `depth` levels of subdirectories.
    /// Returns how many it removed. Only for directories where no name is someone
    /// else's (never a data directory: a key may be spelled like a temp file).
    pub(crate) fn remove_stale_temp_files(&self, depth: usize) -> Result<usize> {
        let mut removed = 0;
        for entry in self.entries()? {
            match entry.kind {
                Kind::File if is_temp_name(&entry.name) && !is_own_temp_name(&entry.name) => {
                    removed += usize::from(self.remove_file(&entry.name)?);
                }
                Kind::Dir if depth > 0 => match self.open_dir_at(&entry.name) {
                    Ok(child) => removed += child.remove_stale_temp_files(depth - 1)?,
                    // Gone or swapped meanwhile: nothing of ours to clean below.
                    Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => {}
                    Err(e) => return Err(Error::io("opening directory", &self.child_path(&entry.name), e)),
                },
                _ => {}
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn tempdir() -> (tempfile::TempDir, Dir) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = Dir::open_trusted(tmp.path()).expect("open").expect("exists");
        (tmp, dir)
    }

    #[test]
    fn temp_names() {
        let name = temp_name();
        assert!(name.starts_with('.'), "the kubelet ignores dotfiles");
        assert!(is_temp_name(OsStr::new(&name)));
        assert!(is_own_temp_name(OsStr::new(&name)));
        let foreign = format!("{TEMP_PREFIX}0000000000000000-7{TEMP_SUFFIX}");
        assert!(is_temp_name(OsStr::new(&foreign)));
        assert!(!is_own_temp_name(OsStr::new(&foreign)));
        for not_ours in [".12345", ".pod-checkpointer-x", "a.tmp", ".dockerconfigjson"] {
            assert!(!is_temp_name(OsStr::new(not_ours)), "{not_ours}");
        }
    }

    #[test]
    fn write_file_is_skipped_when_identical() {
        let (_tmp, dir) = tempdir();
        let name = OsStr::new("f");
        assert!(dir.write_file(name, b"one", 0o644, None).unwrap());
        assert!(
            !dir.write_file(name, b"one", 0o644, None).unwrap(),
            "same bytes and mode"
        );
        assert!(dir.write_file(name, b"one", 0o600, None).unwrap(), "mode differs");
        assert!(dir.write_file(name, b"two", 0o600, None).unwrap(), "bytes differ");
        let meta = std::fs::metadata(dir.child_path(name)).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(std::fs::read(dir.child_path(name)).unwrap(), b"two");
        // A hard link elsewhere means the file is shared: rewrite to break the link.
        std::fs::hard_link(dir.child_path(name), dir.path().join("other")).unwrap();
        assert!(dir.write_file(name, b"two", 0o600, None).unwrap());
        assert_eq!(std::fs::read(dir.path().join("other")).unwrap(), b"two");
        let names: Vec<_> = dir.entries().unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["f", "other"], "no temp file left behind");
    }

    #[test]
    fn write_file_replaces_a_symlink_without_following_it() {
        let (tmp, dir) = tempdir();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"precious").unwrap();
        symlink(&outside, dir.child_path("f")).unwrap();
        assert!(dir.write_file(OsStr::new("f"), b"new", 0o600, None).unwrap());
        assert_eq!(std::fs::read(&outside).unwrap(), b"precious");
        assert!(std::fs::symlink_metadata(dir.child_path("f")).unwrap().is_file());
    }

    #[test]
    fn read_file_outcomes() {
        let (tmp, dir) = tempdir();
        std::fs::write(dir.child_path("small"), b"abc").unwrap();
        std::fs::write(dir.child_path("big"), vec![0u8; 100]).unwrap();
        std::fs::create_dir(dir.child_path("sub")).unwrap();
        symlink(tmp.path().join("small"), dir.child_path("link")).unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(dir.child_path("fifo"))
            .status()
            .is_ok_and(|s| s.success());
        let check = |name: &str, expected: &str| {
            let got = match dir.read_file(name, 10).unwrap() {
                ReadOutcome::Missing => "missing".to_owned(),
                ReadOutcome::NotRegular(kind) => kind.to_string(),
                ReadOutcome::TooLarge(n) => format!("too large {n}"),
                ReadOutcome::Read(c) => String::from_utf8_lossy(&c.bytes).into_owned(),
            };
            assert_eq!(got, expected, "{name}");
        };
        check("small", "abc");
        check("big", "too large 100");
        check("sub", "directory");
        check("link", "symlink");
        check("nothing", "missing");
        if fifo {
            check("fifo", "special file");
        }
    }

    #[test]
    fn ensure_child_modes_and_wrong_types() {
        let (tmp, dir) = tempdir();
        let sub = dir.ensure_child("a", 0o700, None, false).unwrap();
        assert_eq!(std::fs::metadata(sub.path()).unwrap().mode() & 0o7777, 0o700);
        std::fs::set_permissions(sub.path(), Permissions::from_mode(0o755)).unwrap();
        dir.ensure_child("a", 0o700, None, false).unwrap();
        assert_eq!(
            std::fs::metadata(sub.path()).unwrap().mode() & 0o7777,
            0o700,
            "a wrong mode is fixed"
        );

        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        symlink(&outside, dir.child_path("link")).unwrap();
        assert!(matches!(
            dir.ensure_child("link", 0o700, None, false),
            Err(Error::Symlink { .. })
        ));
        assert!(matches!(dir.open_child("link"), Err(Error::Symlink { .. })));
        let replaced = dir.ensure_child("link", 0o700, None, true).unwrap();
        assert!(std::fs::symlink_metadata(replaced.path()).unwrap().is_dir());
        assert!(outside.is_dir(), "the symlink's target is untouched");

        std::fs::write(dir.child_path("file"), b"x").unwrap();
        assert!(matches!(dir.open_child("file"), Err(Error::NotADirectory { .. })));
        assert!(dir.open_child("missing").unwrap().is_none());
    }

    #[test]
    fn remove_tree_never_follows_symlinks() {
        let (tmp, dir) = tempdir();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let victim = dir.child_path("victim");
        std::fs::create_dir_all(victim.join("a/b/c")).unwrap();
        std::fs::write(victim.join("a/b/c/f"), b"x").unwrap();
        symlink(&outside, victim.join("a/escape")).unwrap();
        symlink(outside.join("keep"), victim.join("a/b/file-link")).unwrap();
        assert!(dir.remove_tree("victim").unwrap());
        assert!(!victim.exists());
        assert!(outside.join("keep").is_file());
        assert!(!dir.remove_tree("victim").unwrap(), "idempotent");
        symlink(&outside, dir.child_path("top-link")).unwrap();
        assert!(dir.remove_tree("top-link").unwrap());
        assert!(outside.join("keep").is_file());
    }

    #[test]
    fn remove_tree_removes_trees_deeper_than_its_bound() {
        let (_tmp, dir) = tempdir();
        // Deeper than the bound several times over, with files and wide levels on the way.
        let mut path = dir.path().join("top");
        for level in 0..(MAX_TREE_DEPTH * 5 + 3) {
            path.push(format!("d{level}"));
            std::fs::create_dir_all(&path).unwrap();
            std::fs::write(path.join("f"), b"x").unwrap();
            if level % 50 == 0 {
                for i in 0..(REMOVAL_BATCH + 5) {
                    std::fs::write(path.join(format!("w{i}")), b"").unwrap();
                }
            }
        }
        assert!(dir.remove_tree("top").unwrap());
        assert!(!dir.path().join("top").exists());
        assert!(
            dir.entries().unwrap().is_empty(),
            "nothing was moved outside the tree"
        );
    }

    #[test]
    fn stale_temp_files_of_other_processes_are_removed() {
        let (_tmp, dir) = tempdir();
        let foreign = format!("{TEMP_PREFIX}0000000000000000-1{TEMP_SUFFIX}");
        let own = temp_name();
        for name in [foreign.as_str(), own.as_str(), ".12345", "keep.json"] {
            std::fs::write(dir.child_path(name), b"x").unwrap();
        }
        std::fs::create_dir(dir.child_path("sub")).unwrap();
        std::fs::write(dir.child_path("sub").join(&foreign), b"x").unwrap();
        assert_eq!(dir.remove_stale_temp_files(0).unwrap(), 1);
        assert_eq!(dir.remove_stale_temp_files(1).unwrap(), 1);
        let names: Vec<_> = dir.entries().unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, [".12345", own.as_str(), "keep.json", "sub"]);
    }
}
