//! The [`Store`]: reading checkpoints back, writing, activating, deactivating and
//! removing them.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::PathBuf;

use ckpt_core::{
    Checkpoint, CheckpointMeta, DataFile, DataKind, FileOwner, MaterializedDir, PodId, sha256_hex,
};
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::fsops::{Contents, Dir, Entry, Kind, ReadOutcome};
use crate::layout::Layout;
use crate::names::{check_namespace, check_pod_id, check_subdomain, data_path_components};

/// Largest manifest we read. etcd refuses objects above 1.5 MiB, so anything larger
/// cannot be a checkpoint of a real pod.
const MAX_MANIFEST_BYTES: u64 = 16 << 20;
/// Our own directories, the data roots and the namespace and pod directories below them:
/// root-only. A data root is the ancestor that keeps host users away from the data.
const DIR_MODE: u32 = 0o700;
/// The agent's own dir: root only (the journal and a bearer token).
const AGENT_DIR_MODE: u32 = 0o700;
/// Volume directories, their versions and the subdirectories in those: enterable by every
/// user of the pod (the kubelet mounts a volume directory itself, so the root-only
/// ancestors do not stand in the pod's way), as the kubelet makes them.
const VOLUME_DIR_MODE: u32 = 0o755;
/// The kubelet's static pod directory, when we have to create it.
const MANIFESTS_DIR_MODE: u32 = 0o755;
/// Data file modes are limited to permission bits: never setuid/setgid/sticky.
const DATA_MODE_MASK: u32 = 0o777;

/// One checkpoint manifest file found on disk.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredManifest {
    /// What the manifest says about itself (parent id, UID, owner, spec hash, time).
    pub meta: CheckpointMeta,
    /// The parsed manifest.
    pub pod: Pod,
    /// Where the file is.
    pub path: PathBuf,
    /// The file's name: ours (`<ns>_<name>.json`) or bootkube's (`<ns>-<name>.json`).
    pub file_name: String,
    /// Whether `file_name` is bootkube's legacy name (an adopted checkpoint).
    pub legacy_name: bool,
    /// SHA-256 of the file's bytes, lowercase hex: equal digests, equal content.
    pub digest: String,
    /// The file's permission bits.
    pub mode: u32,
}

/// What [`Store::read_back`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadBack {
    /// Every checkpoint read, by pod id (sorted).
    pub checkpoints: BTreeMap<PodId, StoredCheckpoint>,
    /// Files that may be checkpoints but could not be read (an I/O error: a failing
    /// disk), each with the error. Their checkpoints are missing from `checkpoints`: a
    /// caller must not take them for absent for good, and should read again soon.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// Everything on disk for one checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredCheckpoint {
    /// The inactive manifest, if any.
    pub inactive: Option<StoredManifest>,
    /// The active manifest (in the kubelet's static pod dir), if any.
    pub active: Option<StoredManifest>,
    /// Further files holding the same checkpoint that were left in place: a second
    /// active copy under the other name (both are ours; [`Store::deactivate`] and
    /// [`Store::remove`] remove both), or, in a read-only store, a second inactive one.
    pub duplicates: Vec<PathBuf>,
}

impl StoredCheckpoint {
    /// What the planner needs to know of it: each copy's self-description and digest.
    pub fn disk_checkpoint(&self) -> ckpt_core::DiskCheckpoint {
        let copy = |m: &StoredManifest| ckpt_core::StoredCopy {
            meta: m.meta.clone(),
            digest: m.digest.clone(),
        };
        ckpt_core::DiskCheckpoint {
            inactive: self.inactive.as_ref().map(copy),
            active: self.active.as_ref().map(copy),
        }
    }

    /// Whether the active manifest has the same content as the inactive one.
    pub fn active_matches_inactive(&self) -> bool {
        match (&self.inactive, &self.active) {
            (Some(inactive), Some(active)) => inactive.digest == active.digest,
            _ => false,
        }
    }

    /// The checkpoint's metadata, from the inactive manifest if there is one.
    pub fn meta(&self) -> Option<&CheckpointMeta> {
        self.inactive.as_ref().or(self.active.as_ref()).map(|m| &m.meta)
    }
}

/// What [`Store::write_inactive`] changed; all zero when the checkpoint was on disk
/// already (steady state writes nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// The inactive manifest was (re)written.
    pub manifest_written: bool,
    /// Data files written: every file of each volume that got a new version.
    pub files_written: usize,
    /// Key links (`<key> -> ..data/<key>`) created or replaced.
    pub links_written: usize,
    /// Stale data entries removed (previous versions, keys, volume directories).
    pub entries_removed: usize,
    /// An adopted bootkube inactive manifest was replaced by ours.
    pub legacy_removed: bool,
}

impl WriteSummary {
    /// Whether anything on disk changed.
    pub fn changed(&self) -> bool {
        self.manifest_written
            || self.files_written > 0
            || self.links_written > 0
            || self.entries_removed > 0
            || self.legacy_removed
    }
}

/// What [`Store::remove`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoveSummary {
    /// Per-pod data directories removed (secrets, configmaps, projected).
    pub data_dirs_removed: usize,
    /// An inactive manifest was removed.
    pub inactive_removed: bool,
    /// An active manifest was removed (the static pod stops).
    pub active_removed: bool,
}

impl RemoveSummary {
    /// Whether anything existed.
    pub fn removed_anything(&self) -> bool {
        self.data_dirs_removed > 0 || self.inactive_removed || self.active_removed
    }
}

/// Which of the two manifest directories.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Inactive,
    Active,
}

/// What a manifest-dir file turned out to be.
enum Loaded {
    Checkpoint(Box<StoredManifest>),
    /// Not usable; `checkpoint` says whether it at least parsed as a checkpoint.
    Invalid {
        reason: String,
        checkpoint: bool,
    },
    /// Vanished: skipped.
    Skipped,
    /// Could not be read (an I/O error): skipped this time, with the error.
    Unreadable(String),
}

/// One manifest directory read back.
struct Scanned {
    found: BTreeMap<PodId, StoredManifest>,
    /// Second copies left in place.
    duplicates: Vec<(PodId, PathBuf)>,
    /// Files that could not be read, with the error.
    unreadable: Vec<(PathBuf, String)>,
}

/// What sits at one of the two names a checkpoint file can have.
enum Slot {
    Empty,
    /// A checkpoint of the pod asked about.
    Ours(Box<ParsedManifest>),
    /// Anything else: never touched.
    Foreign,
}

/// A checkpoint's data files as a tree, so nested `items[].path`s become directories.
#[derive(Debug)]
enum Node<'a> {
    File(&'a DataFile),
    Dir(BTreeMap<&'a str, Node<'a>>),
}

/// Crash-safe storage of checkpoints under a [`Layout`].
///
/// The store keeps no state between calls: every operation reads the disk, so a crash
/// at any point leaves nothing to reconcile but what is on disk. A writable store (from
/// [`Store::open`]) must be used by one process at a time: the lock holder.
#[derive(Clone, Debug)]
pub struct Store {
    layout: Layout,
    writable: bool,
}

impl Store {
    /// Opens the store for writing: creates the checkpoint and manifests dirs if missing
    /// (0755: the kubelet's dir; bootkube crashed instead), our own dirs (0700), and
    /// removes temporary files a killed writer left behind. Call it while holding the
    /// agent's lock: another writer's in-flight temp files would be removed.
    pub fn open(layout: Layout) -> Result<Self> {
        check_layout(&layout)?;
        let store = Self {
            layout,
            writable: true,
        };
        let checkpoint_dir = store.checkpoint_dir()?;
        Dir::open_or_create_trusted(store.layout.manifests_dir(), MANIFESTS_DIR_MODE)?;
        checkpoint_dir.ensure_child(Layout::INACTIVE_DIR_NAME, DIR_MODE, None, false)?;
        checkpoint_dir.ensure_child(Layout::QUARANTINE_DIR_NAME, DIR_MODE, None, false)?;
        let removed = store.clean_stale_temp_files()?;
        if removed > 0 {
            info!(
                count = removed,
                "removed temporary files left by an interrupted write"
            );
        }
        Ok(store)
    }

    /// A writable store without the checks and the cleanup of [`Store::open`], for
    /// [`crate::KeptCredentials`] (the layout is checked by its caller).
    pub(crate) fn unchecked(layout: Layout) -> Self {
        Self {
            layout,
            writable: true,
        }
    }

    /// Opens the store for reading only (`inspect`): creates, moves and removes nothing;
    /// files [`Store::open`] would quarantine are skipped with a warning instead.
    pub fn open_read_only(layout: Layout) -> Result<Self> {
        check_layout(&layout)?;
        Ok(Self {
            layout,
            writable: false,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub(crate) fn is_writable(&self) -> bool {
        self.writable
    }

    pub(crate) fn require_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(Error::ReadOnlyStore {
                checkpoint_dir: self.layout.checkpoint_dir().to_path_buf(),
            })
        }
    }

    /// The checkpoint dir, created if missing (writable store).
    pub(crate) fn checkpoint_dir(&self) -> Result<Dir> {
        Dir::open_or_create_trusted(self.layout.checkpoint_dir(), MANIFESTS_DIR_MODE)
    }

    fn existing_checkpoint_dir(&self) -> Result<Option<Dir>> {
        Dir::open_trusted(self.layout.checkpoint_dir())
    }

    /// Removes these files from the top of the checkpoint dir (the journal, the kept
    /// credentials); returns whether any of them was there.
    pub(crate) fn remove_checkpoint_dir_files(&self, names: &[&str]) -> Result<bool> {
        self.require_writable()?;
        let Some(checkpoint_dir) = self.existing_checkpoint_dir()? else {
            return Ok(false);
        };
        let mut removed = false;
        for name in names {
            removed |= checkpoint_dir.remove_file(name)?;
        }
        if removed {
            checkpoint_dir.sync()?;
        }
        Ok(removed)
    }

    /// The agent's own dir (journal, kept credentials), created root-only if missing.
    pub(crate) fn agent_dir(&self) -> Result<Dir> {
        self.checkpoint_dir()?
            .ensure_child(Layout::AGENT_DIR_NAME, AGENT_DIR_MODE, None, false)
    }

    /// The agent's own dir if it exists.
    pub(crate) fn existing_agent_dir(&self) -> Result<Option<Dir>> {
        match self.existing_checkpoint_dir()? {
            Some(dir) => dir.open_child(Layout::AGENT_DIR_NAME),
            None => Ok(None),
        }
    }

    /// After self-GC, once the journal and the kept credentials are gone: removes the
    /// store's directories that are now empty (the agent's own, the inactive checkpoints',
    /// the data roots, the quarantine), so an uninstalled node keeps no trace of the agent.
    /// A directory with anything left in it (a quarantined file) is kept. Returns the
    /// names removed.
    pub fn remove_empty_dirs(&self) -> Result<Vec<String>> {
        self.require_writable()?;
        let Some(checkpoint_dir) = self.existing_checkpoint_dir()? else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        let owned = self.layout.owned_dirs();
        let names = owned
            .iter()
            .filter_map(|dir| dir.file_name())
            .chain([OsStr::new(Layout::AGENT_DIR_NAME)]);
        for name in names {
            if checkpoint_dir.remove_empty_dir(name)? {
                removed.push(name.to_string_lossy().into_owned());
            }
        }
        if !removed.is_empty() {
            checkpoint_dir.sync()?;
        }
        Ok(removed)
    }

    /// Removes these files from the agent's dir; returns whether any of them was there.
    pub(crate) fn remove_agent_dir_files(&self, names: &[&str]) -> Result<bool> {
        self.require_writable()?;
        let Some(agent_dir) = self.existing_agent_dir()? else {
            return Ok(false);
        };
        let mut removed = false;
        for name in names {
            removed |= agent_dir.remove_file(name)?;
        }
        if removed {
            agent_dir.sync()?;
        }
        Ok(removed)
    }

    fn existing_manifests_dir(&self) -> Result<Option<Dir>> {
        Dir::open_trusted(self.layout.manifests_dir())
    }

    /// Removes temporary files left by a killed writer: ours only (our prefix, another
    /// process's tag), in the manifests dir, the checkpoint dir, the inactive and the
    /// agent's dirs, and abandoned data versions. Returns how many. [`Store::open`] and [`Store::read_all`] call it.
    pub fn clean_stale_temp_files(&self) -> Result<usize> {
        self.require_writable()?;
        let mut removed = 0;
        if let Some(manifests) = self.existing_manifests_dir()? {
            removed += manifests.remove_stale_temp_files(0)?;
        }
        let Some(checkpoint_dir) = self.existing_checkpoint_dir()? else {
            return Ok(removed);
        };
        removed += checkpoint_dir.remove_stale_temp_files(0)?;
        // Data directories are not searched for temp files: their names are the pod's
        // (keys, item paths), any of which may be spelled like one; a stray file there
        // is not in the checkpoint's tree, so the next write of that checkpoint removes
        // it. Only the hidden `..` names, which can never be the pod's, are cleaned:
        // versions a killed writer left unpublished.
        // Not ours to descend into (a symlink, a file): write_inactive reports it.
        let ours = |found: Result<Option<Dir>>| match found {
            Err(Error::Symlink { .. } | Error::NotADirectory { .. }) => Ok(None),
            other => other,
        };
        if let Some(inactive) = ours(checkpoint_dir.open_child(Layout::INACTIVE_DIR_NAME))? {
            removed += inactive.remove_stale_temp_files(0)?;
        }
        // The journal's and the kept credentials' (a crash while saving the journal left
        // one per crash there before, found by the crash test).
        if let Some(agent) = ours(checkpoint_dir.open_child(Layout::AGENT_DIR_NAME))? {
            removed += agent.remove_stale_temp_files(0)?;
        }
        for kind in DataKind::ALL {
            let Some(root) = ours(checkpoint_dir.open_child(kind.root_dir_name()))? else {
                continue;
            };
            // The previous layout staged data files here; nothing else ever lived in it.
            removed += usize::from(root.remove_tree(Layout::STAGING_DIR_NAME)?);
            removed += remove_abandoned_versions(&root)?;
        }
        Ok(removed)
    }

    /// Every checkpoint on disk, inactive and active, by pod id (sorted).
    ///
    /// - Identity comes from the file's content; a file counts only under our name or
    ///   bootkube's legacy name for that content (adoption).
    /// - In the inactive dir (ours alone), anything unusable is moved to the
    ///   quarantine dir with a warning: an unparseable file, a non-checkpoint, a
    ///   symlink, a file under a name not matching its content, and the legacy-named
    ///   copy when both names hold the same pod.
    /// - In the manifests dir, files that are not our checkpoints are someone else's
    ///   static pods: skipped, never touched. Two active files of one pod are both
    ///   ours: the one under our name is reported, the other in `duplicates`.
    /// - Our stale temporary files are removed (writable store).
    /// - A file that cannot be read (an I/O error) is skipped; [`Store::read_back`]
    ///   says which.
    pub fn read_all(&self) -> Result<BTreeMap<PodId, StoredCheckpoint>> {
        self.read_back().map(|read| read.checkpoints)
    }

    /// [`Store::read_all`], and the files it could not read.
    pub fn read_back(&self) -> Result<ReadBack> {
        let mut all: BTreeMap<PodId, StoredCheckpoint> = BTreeMap::new();
        let mut unreadable = Vec::new();
        let checkpoint_dir = self.existing_checkpoint_dir()?;
        let inactive_dir = match &checkpoint_dir {
            Some(dir) => dir.open_child(Layout::INACTIVE_DIR_NAME)?,
            None => None,
        };
        if let (Some(checkpoint_dir), Some(inactive_dir)) = (&checkpoint_dir, &inactive_dir) {
            let Scanned {
                found,
                duplicates,
                unreadable: failed,
            } = self.scan(Some(checkpoint_dir), inactive_dir, Place::Inactive)?;
            unreadable.extend(failed);
            for (id, manifest) in found {
                all.entry(id).or_default().inactive = Some(manifest);
            }
            for (id, path) in duplicates {
                all.entry(id).or_default().duplicates.push(path);
            }
        }
        if let Some(manifests_dir) = self.existing_manifests_dir()? {
            // No quarantine there: files in the kubelet's dir that are not ours stay.
            let Scanned {
                found,
                duplicates,
                unreadable: failed,
            } = self.scan(None, &manifests_dir, Place::Active)?;
            unreadable.extend(failed);
            for (id, manifest) in found {
                all.entry(id).or_default().active = Some(manifest);
            }
            for (id, path) in duplicates {
                all.entry(id).or_default().duplicates.push(path);
            }
        }
        Ok(ReadBack {
            checkpoints: all,
            unreadable,
        })
    }

    /// Reads one manifest directory. Returns the checkpoints found and the duplicates
    /// left in place.
    fn scan(&self, checkpoint_dir: Option<&Dir>, dir: &Dir, place: Place) -> Result<Scanned> {
        let mut found: BTreeMap<PodId, StoredManifest> = BTreeMap::new();
        let mut duplicates = Vec::new();
        let mut unreadable = Vec::new();
        if self.writable {
            // Only our own stale temp files; bootkube deleted every dotfile, even
            // foreign ones in the kubelet's dir. Best effort: reading must work on a
            // read-only filesystem too, and dotfiles are invisible to the kubelet.
            if let Err(error) = dir.remove_stale_temp_files(0) {
                warn!(dir = %dir.path().display(), %error, "could not remove stale temporary files");
            }
        }
        for Entry { name, kind } in dir.entries()? {
            let path = dir.child_path(&name);
            if name.as_encoded_bytes().starts_with(b".") {
                // Dotfiles are invisible to the kubelet: temp files, ours or not.
                continue;
            }
            let Some(name_str) = name.to_str() else {
                self.reject(
                    checkpoint_dir,
                    dir,
                    place,
                    &name,
                    "the file name is not UTF-8",
                    false,
                );
                continue;
            };
            if place == Place::Active && (kind != Kind::File || !name_str.ends_with(".json")) {
                debug!(path = %path.display(), "not a checkpoint file; leaving it alone");
                continue;
            }
            let manifest = match load(dir, name_str) {
                Loaded::Checkpoint(manifest) => *manifest,
                Loaded::Invalid { reason, checkpoint } => {
                    self.reject(checkpoint_dir, dir, place, &name, &reason, checkpoint);
                    continue;
                }
                Loaded::Skipped => continue,
                Loaded::Unreadable(error) => {
                    unreadable.push((path, error));
                    continue;
                }
            };
            let id = manifest.meta.parent.clone();
            let (keep, other) = match found.remove(&id) {
                None => (manifest, None),
                // Our name wins over the legacy name (the only two possible).
                Some(previous) if previous.legacy_name => (manifest, Some(previous)),
                Some(previous) => (previous, Some(manifest)),
            };
            if let Some(other) = other {
                let reason = format!("a second copy of the checkpoint in {}", keep.path.display());
                if place == Place::Inactive && self.writable {
                    self.reject(
                        checkpoint_dir,
                        dir,
                        place,
                        OsStr::new(&other.file_name),
                        &reason,
                        true,
                    );
                } else {
                    warn!(path = %other.path.display(), %reason, "duplicate checkpoint file");
                    duplicates.push((id.clone(), other.path));
                }
            }
            found.insert(id, keep);
        }
        Ok(Scanned {
            found,
            duplicates,
            unreadable,
        })
    }

    /// Deals with an unusable file: in the inactive dir it is quarantined (writable
    /// store) or skipped with a warning; in the manifests dir it is not ours and left
    /// alone (a warning if it claims to be a checkpoint).
    fn reject(
        &self,
        checkpoint_dir: Option<&Dir>,
        dir: &Dir,
        place: Place,
        name: &OsStr,
        reason: &str,
        checkpoint: bool,
    ) {
        let path = dir.child_path(name);
        match (place, checkpoint_dir) {
            (Place::Inactive, Some(checkpoint_dir)) if self.writable => {
                quarantine_file(checkpoint_dir, dir, name, reason)
            }
            (Place::Inactive, _) => {
                warn!(path = %path.display(), reason, "skipping an unusable inactive checkpoint")
            }
            (Place::Active, _) if checkpoint => {
                warn!(path = %path.display(), reason, "a checkpoint we do not manage; leaving it alone")
            }
            (Place::Active, _) => {
                debug!(path = %path.display(), reason, "not one of our checkpoints; leaving it alone")
            }
        }
    }

    /// Every pod that has data directories (`<kind root>/<ns>/<pod>`) on disk, whether
    /// or not it has a manifest: the executor removes the orphans.
    pub fn data_pods(&self) -> Result<BTreeSet<PodId>> {
        let mut pods = BTreeSet::new();
        let Some(checkpoint_dir) = self.existing_checkpoint_dir()? else {
            return Ok(pods);
        };
        for kind in DataKind::ALL {
            let root = match checkpoint_dir.open_child(kind.root_dir_name()) {
                Ok(Some(root)) => root,
                Ok(None) | Err(Error::Symlink { .. } | Error::NotADirectory { .. }) => continue,
                Err(e) => return Err(e),
            };
            for ns in root.entries()? {
                let Some(namespace) = ns.name.to_str() else {
                    continue;
                };
                if ns.kind != Kind::Dir || check_namespace(namespace).is_err() {
                    continue;
                }
                let Some(ns_dir) = root.open_child(&ns.name).ok().flatten() else {
                    continue;
                };
                for pod in ns_dir.entries()? {
                    let Some(name) = pod.name.to_str() else { continue };
                    let id = PodId::new(namespace, name);
                    if pod.kind == Kind::Dir && check_pod_id(&id).is_ok() {
                        pods.insert(id);
                    }
                }
            }
        }
        Ok(pods)
    }

    /// Writes a checkpoint as inactive: first every data directory (stale keys, item
    /// subdirectories and volume directories removed), then the manifest, so a manifest
    /// on disk never mounts a directory that is not there yet. Files whose bytes, mode
    /// and owner are already right are not rewritten.
    ///
    /// A volume directory the currently *active* manifest still mounts is kept even when
    /// the new version no longer has it (the running static pod needs it); it goes with
    /// the next write after deactivation, or with [`Store::remove`].
    ///
    /// An adopted bootkube file (`<ns>-<name>.json`) holding this pod is removed once
    /// ours is durable.
    pub fn write_inactive(&self, checkpoint: &Checkpoint) -> Result<WriteSummary> {
        self.require_writable()?;
        let trees = validate(checkpoint)?;
        let id = &checkpoint.parent;
        let checkpoint_dir = self.checkpoint_dir()?;
        let mounted = self.active_host_paths(id)?;
        let mut summary = WriteSummary::default();
        for kind in DataKind::ALL {
            let wanted: Vec<(&MaterializedDir, &Node<'_>)> = checkpoint
                .dirs
                .iter()
                .zip(&trees)
                .filter(|(dir, _)| dir.dir.kind == kind)
                .collect();
            if wanted.is_empty() {
                summary.entries_removed += self.remove_pod_data(&checkpoint_dir, kind, id, &mounted)?;
                continue;
            }
            let root = checkpoint_dir.ensure_child(kind.root_dir_name(), DIR_MODE, None, false)?;
            let ns_dir = root.ensure_child(&*id.namespace, DIR_MODE, None, true)?;
            let pod_dir = ns_dir.ensure_child(&*id.name, DIR_MODE, None, true)?;
            let mut pod_dir_changed = false;
            for (dir, tree) in &wanted {
                // Ours, not the pod's (the previous layout gave it to the pod's uid): the
                // pod reads it, only we change it.
                let volume =
                    pod_dir.ensure_child(&dir.dir.name, VOLUME_DIR_MODE, Some(agent_owner()), true)?;
                let Node::Dir(tree) = tree else { continue };
                sync_volume(&volume, tree, checkpoint.owner, &mut summary)?;
            }
            for entry in pod_dir.entries()? {
                if wanted
                    .iter()
                    .any(|(dir, _)| OsStr::new(&dir.dir.name) == entry.name)
                {
                    continue;
                }
                let mounted_path = self.layout.pod_data_dir(kind, id).join(&entry.name);
                if mounted.contains(&mounted_path) {
                    debug!(path = %mounted_path.display(), "kept: the active checkpoint still mounts it");
                    continue;
                }
                pod_dir.remove_tree(&entry.name)?;
                summary.entries_removed += 1;
                pod_dir_changed = true;
            }
            if pod_dir_changed {
                pod_dir.sync()?;
            }
        }

        let inactive_dir = checkpoint_dir.ensure_child(Layout::INACTIVE_DIR_NAME, DIR_MODE, None, false)?;
        let file_name = id.manifest_file_name();
        summary.manifest_written = inactive_dir.write_file(
            &file_name,
            &checkpoint.manifest_bytes(),
            checkpoint.manifest_mode(),
            None,
        )?;
        if summary.manifest_written {
            inactive_dir.sync()?;
        }
        let legacy = id.legacy_manifest_file_name();
        if let Slot::Ours(_) = slot(&inactive_dir, &legacy, id)? {
            // Ours is durable (synced above, or unchanged); the bootkube copy can go.
            inactive_dir.remove_file(&legacy)?;
            inactive_dir.sync()?;
            summary.legacy_removed = true;
            info!(pod = %id, from = legacy, to = file_name, "adopted a bootkube checkpoint");
        }
        if summary.changed() {
            debug!(pod = %id, ?summary, "wrote inactive checkpoint");
        }
        Ok(summary)
    }

    /// The `hostPath`s the pod's active manifest(s) mount.
    fn active_host_paths(&self, id: &PodId) -> Result<BTreeSet<PathBuf>> {
        let mut paths = BTreeSet::new();
        let Some(manifests_dir) = self.existing_manifests_dir()? else {
            return Ok(paths);
        };
        for name in [id.manifest_file_name(), id.legacy_manifest_file_name()] {
            if let Slot::Ours(found) = slot(&manifests_dir, &name, id)? {
                let volumes = found.pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
                paths.extend(
                    volumes
                        .filter_map(|v| v.host_path.as_ref())
                        .map(|h| PathBuf::from(&h.path)),
                );
            }
        }
        Ok(paths)
    }

    /// Removes one kind of data of a pod, except the volume directories in `keep`.
    /// A symlink on the way means nothing of ours is below: skipped, not followed.
    /// Returns how many entries went.
    fn remove_pod_data(
        &self,
        checkpoint_dir: &Dir,
        kind: DataKind,
        id: &PodId,
        keep: &BTreeSet<PathBuf>,
    ) -> Result<usize> {
        let skip_wrong_type = |result: Result<Option<Dir>>| match result {
            Err(Error::Symlink { path } | Error::NotADirectory { path }) => {
                warn!(path = %path.display(), "not a directory of ours; nothing removed below it");
                Ok(None)
            }
            other => other,
        };
        let Some(root) = skip_wrong_type(checkpoint_dir.open_child(kind.root_dir_name()))? else {
            return Ok(0);
        };
        let Some(ns_dir) = skip_wrong_type(root.open_child(&*id.namespace))? else {
            return Ok(0);
        };
        let pod_path = self.layout.pod_data_dir(kind, id);
        let removed = if keep.iter().any(|p| p.starts_with(&pod_path)) {
            let Some(pod_dir) = skip_wrong_type(ns_dir.open_child(&*id.name))? else {
                return Ok(0);
            };
            let mut removed = 0;
            for entry in pod_dir.entries()? {
                if !keep.contains(&pod_path.join(&entry.name)) && pod_dir.remove_tree(&entry.name)? {
                    removed += 1;
                }
            }
            if removed > 0 {
                pod_dir.sync()?;
            }
            removed
        } else {
            let removed = usize::from(ns_dir.remove_tree(&*id.name)?);
            if removed > 0 {
                ns_dir.sync()?;
                // Tidy: the namespace dir goes with its last pod.
                if root.remove_empty_dir(&*id.namespace)? {
                    root.sync()?;
                }
            }
            removed
        };
        Ok(removed)
    }

    /// Activates a checkpoint: copies the inactive manifest's bytes into the manifests
    /// dir (created 0755 if missing), keeping 0600 for a manifest holding secrets.
    /// Nothing is written when the active copy is identical. An active copy under
    /// bootkube's name keeps that name (renaming a static manifest restarts the pod).
    /// Returns whether it wrote.
    pub fn activate(&self, id: &PodId) -> Result<bool> {
        self.require_writable()?;
        check_pod_id(id)?;
        let no_inactive = || Error::NoInactiveCheckpoint {
            id: id.clone(),
            dir: self.layout.inactive_dir(),
        };
        let checkpoint_dir = self.existing_checkpoint_dir()?.ok_or_else(no_inactive)?;
        let inactive_dir = checkpoint_dir
            .open_child(Layout::INACTIVE_DIR_NAME)?
            .ok_or_else(no_inactive)?;
        let mut source = None;
        for name in [id.manifest_file_name(), id.legacy_manifest_file_name()] {
            if let Slot::Ours(found) = slot(&inactive_dir, &name, id)? {
                source = Some(found.contents);
                break;
            }
        }
        let source = source.ok_or_else(no_inactive)?;

        let manifests_dir = Dir::open_or_create_trusted(self.layout.manifests_dir(), MANIFESTS_DIR_MODE)?;
        let ours = id.manifest_file_name();
        let legacy = id.legacy_manifest_file_name();
        let target = match slot(&manifests_dir, &ours, id)? {
            Slot::Foreign => {
                return Err(Error::NotOurs {
                    id: id.clone(),
                    path: manifests_dir.child_path(&ours),
                });
            }
            Slot::Ours(_) => ours,
            Slot::Empty => match slot(&manifests_dir, &legacy, id)? {
                Slot::Ours(_) => legacy,
                Slot::Empty | Slot::Foreign => ours,
            },
        };
        // Group/other readable or not decides; anything else on the inactive file
        // (a stray chmod) is not copied into the kubelet's dir.
        let mode = if source.mode & 0o044 == 0 { 0o600 } else { 0o644 };
        let written = manifests_dir.write_file(&target, &source.bytes, mode, None)?;
        if written {
            manifests_dir.sync()?;
            info!(pod = %id, path = %manifests_dir.child_path(&target).display(), "activated checkpoint");
        }
        Ok(written)
    }

    /// Deactivates a checkpoint: removes its active manifest (under either name; a file
    /// there that is not a checkpoint of this pod is left alone). Missing is fine.
    /// Returns whether a file was removed.
    pub fn deactivate(&self, id: &PodId) -> Result<bool> {
        self.require_writable()?;
        check_pod_id(id)?;
        let Some(manifests_dir) = self.existing_manifests_dir()? else {
            return Ok(false);
        };
        let mut removed = false;
        for name in [id.manifest_file_name(), id.legacy_manifest_file_name()] {
            match slot(&manifests_dir, &name, id)? {
                Slot::Ours(_) => removed |= manifests_dir.remove_file(&name)?,
                Slot::Foreign => {
                    debug!(path = %manifests_dir.child_path(&name).display(), "not our checkpoint; left alone")
                }
                Slot::Empty => {}
            }
        }
        if removed {
            manifests_dir.sync()?;
            info!(pod = %id, "deactivated checkpoint");
        }
        Ok(removed)
    }

    /// Removes a checkpoint completely: the active manifest first, so the kubelet stops
    /// the static pod before its data goes from under it, then secrets, configmaps,
    /// projected data and the inactive manifest. The first failure stops the sequence; a
    /// retry continues where it stopped (a checkpoint left inactive is never started
    /// again by a removal). Idempotent.
    pub fn remove(&self, id: &PodId) -> Result<RemoveSummary> {
        self.require_writable()?;
        check_pod_id(id)?;
        let mut summary = RemoveSummary {
            active_removed: self.deactivate(id)?,
            ..RemoveSummary::default()
        };
        self.remove_data_and_inactive(id, &mut summary)?;
        if summary.removed_anything() {
            info!(pod = %id, ?summary, "removed checkpoint");
        }
        Ok(summary)
    }

    /// Removes the agent's own checkpoint: its data and inactive manifest, then the
    /// active manifest last. The process doing this may be that very static pod: once its
    /// manifest goes the kubelet stops it, so nothing may be left to do by then. The first
    /// failure stops the sequence, and the static pod keeps running for a retry.
    pub fn remove_self(&self, id: &PodId) -> Result<RemoveSummary> {
        self.require_writable()?;
        check_pod_id(id)?;
        let mut summary = RemoveSummary::default();
        self.remove_data_and_inactive(id, &mut summary)?;
        summary.active_removed = self.deactivate(id)?;
        if summary.removed_anything() {
            info!(pod = %id, ?summary, "removed the agent's own checkpoint");
        }
        Ok(summary)
    }

    fn remove_data_and_inactive(&self, id: &PodId, summary: &mut RemoveSummary) -> Result<()> {
        let Some(checkpoint_dir) = self.existing_checkpoint_dir()? else {
            return Ok(());
        };
        for kind in DataKind::ALL {
            summary.data_dirs_removed += self.remove_pod_data(&checkpoint_dir, kind, id, &BTreeSet::new())?;
        }
        if let Some(inactive_dir) = checkpoint_dir.open_child(Layout::INACTIVE_DIR_NAME)? {
            // Our name is ours alone, whatever it holds; the legacy name only if it
            // holds this pod (`a-b/c` and `a/b-c` share it).
            summary.inactive_removed |= inactive_dir.remove_tree(id.manifest_file_name())?;
            let legacy = id.legacy_manifest_file_name();
            if let Slot::Ours(_) = slot(&inactive_dir, &legacy, id)? {
                summary.inactive_removed |= inactive_dir.remove_file(&legacy)?;
            }
            if summary.inactive_removed {
                inactive_dir.sync()?;
            }
        }
        Ok(())
    }
}

pub(crate) fn check_layout(layout: &Layout) -> Result<()> {
    let manifests_dir = layout.manifests_dir();
    let mut ours = layout.owned_dirs();
    ours.push(layout.checkpoint_dir().to_path_buf());
    match ours.into_iter().find(|dir| dir == manifests_dir) {
        Some(ours) => Err(Error::LayoutConflict {
            manifests_dir: manifests_dir.to_path_buf(),
            ours,
        }),
        None => Ok(()),
    }
}

/// What one file in a manifest directory holds, read and parsed once for both
/// [`load`] (reading every file back) and [`slot`] (looking at one pod's names).
enum ManifestFile {
    Missing,
    /// Not a checkpoint, and why: not a regular file, too large, not a JSON Pod, or a
    /// pod without the checkpoint-of annotation.
    NotCheckpoint(String),
    /// A checkpoint manifest.
    Checkpoint(Box<ParsedManifest>),
}

struct ParsedManifest {
    contents: Contents,
    pod: Pod,
    meta: CheckpointMeta,
}

/// Reads and classifies the file at `name` (a read error is the caller's to handle).
fn read_manifest(dir: &Dir, name: &str) -> Result<ManifestFile> {
    let contents = match dir.read_file(name, MAX_MANIFEST_BYTES)? {
        ReadOutcome::Read(contents) => contents,
        ReadOutcome::Missing => return Ok(ManifestFile::Missing),
        ReadOutcome::NotRegular(kind) => {
            return Ok(ManifestFile::NotCheckpoint(format!(
                "a {kind}, not a regular file"
            )));
        }
        ReadOutcome::TooLarge(len) => {
            return Ok(ManifestFile::NotCheckpoint(format!(
                "{len} bytes, too large for a checkpoint"
            )));
        }
    };
    let pod: Pod = match serde_json::from_slice(&contents.bytes) {
        Ok(pod) => pod,
        Err(e) => return Ok(ManifestFile::NotCheckpoint(format!("not a JSON Pod: {e}"))),
    };
    let Some(meta) = CheckpointMeta::from_manifest(&pod) else {
        return Ok(ManifestFile::NotCheckpoint(
            "not a checkpoint (no checkpoint-of annotation)".into(),
        ));
    };
    Ok(ManifestFile::Checkpoint(Box::new(ParsedManifest {
        contents,
        pod,
        meta,
    })))
}

/// Parses and validates one manifest file.
fn load(dir: &Dir, name: &str) -> Loaded {
    let parsed = match read_manifest(dir, name) {
        Ok(ManifestFile::Checkpoint(parsed)) => *parsed,
        Ok(ManifestFile::Missing) => return Loaded::Skipped,
        Ok(ManifestFile::NotCheckpoint(reason)) => {
            return Loaded::Invalid {
                reason,
                checkpoint: false,
            };
        }
        Err(error) => {
            debug!(path = %dir.child_path(name).display(), %error, "skipping an unreadable file");
            return Loaded::Unreadable(error.to_string());
        }
    };
    let ParsedManifest { contents, pod, meta } = parsed;
    let id = &meta.parent;
    let invalid_checkpoint = |reason: String| Loaded::Invalid {
        reason,
        checkpoint: true,
    };
    if let Err(e) = check_pod_id(id) {
        return invalid_checkpoint(e.to_string());
    }
    let legacy_name = if name == id.manifest_file_name() {
        false
    } else if name == id.legacy_manifest_file_name() {
        true
    } else {
        return invalid_checkpoint(format!(
            "holds a checkpoint of {id}, which belongs in {}",
            id.manifest_file_name()
        ));
    };
    Loaded::Checkpoint(Box::new(StoredManifest {
        meta,
        pod,
        path: dir.child_path(name),
        file_name: name.to_owned(),
        legacy_name,
        digest: sha256_hex(&contents.bytes),
        mode: contents.mode,
    }))
}

/// What is at `name`: nothing, a checkpoint of `id` (regular file, parses, right id),
/// or something foreign.
fn slot(dir: &Dir, name: &str, id: &PodId) -> Result<Slot> {
    Ok(match read_manifest(dir, name)? {
        ManifestFile::Missing => Slot::Empty,
        ManifestFile::Checkpoint(parsed) if &parsed.meta.parent == id => Slot::Ours(parsed),
        ManifestFile::Checkpoint(_) | ManifestFile::NotCheckpoint(_) => Slot::Foreign,
    })
}

/// Moves an unusable file from `dir` to the quarantine dir under a unique name, with a
/// warning. If even that fails the file stays where it is (never deleted).
pub(crate) fn quarantine_file(checkpoint_dir: &Dir, dir: &Dir, name: &OsStr, reason: &str) {
    let path = dir.child_path(name);
    let moved = (|| {
        let quarantine_dir =
            checkpoint_dir.ensure_child(Layout::QUARANTINE_DIR_NAME, DIR_MODE, None, false)?;
        let mut base = name.to_string_lossy().into_owned();
        // Leave room for the suffix within the 255-byte name limit.
        while base.len() > 200 {
            base.pop();
        }
        let base = format!("{base}.{}", ckpt_core::Timestamp::now().0);
        let mut target = base.clone();
        let mut n = 0;
        while quarantine_dir.kind_of(&target)?.is_some() {
            n += 1;
            target = format!("{base}-{n}");
        }
        dir.rename(name, &quarantine_dir, &target)?;
        dir.sync()?;
        quarantine_dir.sync()?;
        Ok::<_, Error>(quarantine_dir.child_path(&target))
    })();
    match moved {
        Ok(to) => {
            warn!(path = %path.display(), reason, quarantined_to = %to.display(), "moved an unusable file to quarantine")
        }
        Err(error) => {
            warn!(path = %path.display(), reason, %error, "could not quarantine an unusable file; left in place")
        }
    }
}

/// Checks everything that becomes a path and builds each directory's file tree.
fn validate(checkpoint: &Checkpoint) -> Result<Vec<Node<'_>>> {
    let id = &checkpoint.parent;
    let invalid = |reason: String| Error::InvalidCheckpoint {
        id: id.clone(),
        reason,
    };
    check_pod_id(id)?;
    match CheckpointMeta::from_manifest(&checkpoint.manifest) {
        Some(meta) if &meta.parent == id => {}
        Some(meta) => {
            return Err(invalid(format!(
                "the manifest is a checkpoint of {}",
                meta.parent
            )));
        }
        None => return Err(invalid("the manifest has no checkpoint-of annotation".into())),
    }
    let mut seen = BTreeSet::new();
    let mut trees = Vec::with_capacity(checkpoint.dirs.len());
    for dir in &checkpoint.dirs {
        let d = &dir.dir;
        if *d.namespace != *id.namespace || *d.pod != *id.name {
            return Err(invalid(format!(
                "data directory {} belongs to {}/{}",
                d.name, d.namespace, d.pod
            )));
        }
        check_subdomain("data directory name", &d.name)?;
        if !seen.insert((d.kind, d.name.as_str())) {
            return Err(invalid(format!("data directory {} appears twice", d.name)));
        }
        let mut tree = Node::Dir(BTreeMap::new());
        for file in &dir.files {
            insert(&mut tree, &data_path_components(&file.path)?, file)
                .map_err(|()| invalid(format!("data path {:?} clashes with another", file.path)))?;
        }
        trees.push(tree);
    }
    Ok(trees)
}

/// Inserts a file into a tree; `Err` if the path is taken, or one of its parents is a file.
fn insert<'a>(tree: &mut Node<'a>, components: &[&'a str], file: &'a DataFile) -> Result<(), ()> {
    let Node::Dir(children) = tree else { return Err(()) };
    match components {
        [] => Err(()),
        [last] => match children.insert(last, Node::File(file)) {
            None => Ok(()),
            Some(_) => Err(()),
        },
        [first, rest @ ..] => insert(
            children
                .entry(first)
                .or_insert_with(|| Node::Dir(BTreeMap::new())),
            rest,
            file,
        ),
    }
}

/// Removes, in every volume directory below a data root, the hidden entries no reader
/// can reach: versions and temporary links a killed writer left, anything `..data` does
/// not point to. Returns how many.
fn remove_abandoned_versions(root: &Dir) -> Result<usize> {
    let mut removed = 0;
    let dirs = |dir: &Dir| -> Result<Vec<Dir>> {
        let mut found = Vec::new();
        for entry in dir.entries()? {
            if entry.kind == Kind::Dir && !is_hidden_volume_entry(&entry.name) {
                // Gone or swapped for something else meanwhile: nothing of ours below.
                if let Ok(Some(child)) = dir.open_child(&entry.name) {
                    found.push(child);
                }
            }
        }
        Ok(found)
    };
    for ns_dir in dirs(root)? {
        for pod_dir in dirs(&ns_dir)? {
            for volume in dirs(&pod_dir)? {
                let current = current_version(&volume)?.map(|(name, _)| name);
                let mut changed = false;
                for entry in volume.entries()? {
                    let abandoned = is_hidden_volume_entry(&entry.name)
                        && entry.name != Layout::DATA_LINK_NAME
                        && current.as_ref() != Some(&entry.name);
                    if abandoned && volume.remove_tree(&entry.name)? {
                        removed += 1;
                        changed = true;
                    }
                }
                if changed {
                    volume.sync()?;
                }
            }
        }
    }
    Ok(removed)
}

/// The owner of the directories we create: this process (root on a node).
fn agent_owner() -> FileOwner {
    FileOwner {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
    }
}

/// Makes the volume directory `volume` show exactly `tree`, one version at a time, the
/// way the kubelet's AtomicWriter does:
///
/// ```text
/// <volume>/..2025_01_02T03_04_05_678Z.<unique>/   one complete version (files, subdirs)
/// <volume>/..data -> ..2025_01_02T03_04_05_678Z.<unique>
/// <volume>/<key> -> ..data/<key>                   one link per top-level name
/// ```
///
/// A new version is written completely (and fsynced) in a directory nobody looks at, then
/// `..data` is switched to it with one `rename`, so a reader sees the old version or the
/// new one, never a new certificate with the old key. Then missing links are added, and
/// whatever else is there goes: the old version, stale keys, versions a killed writer
/// left, and the plain files and directories of the previous layout (or of bootkube,
/// whose checkpoints held plain files: those keep working until replaced, in one step
/// each, by their links). Nothing is written when the current version already holds
/// exactly `tree` with the right modes and owner.
fn sync_volume(
    volume: &Dir,
    tree: &BTreeMap<&str, Node<'_>>,
    owner: FileOwner,
    summary: &mut WriteSummary,
) -> Result<()> {
    let current = current_version(volume)?;
    let up_to_date = match &current {
        Some((_, dir)) => version_matches(dir, tree, owner)?,
        None => false,
    };
    let mut changed = false;
    let version = match current {
        Some((name, _)) if up_to_date => name,
        _ => {
            let (name, dir) = new_version_dir(volume)?;
            if let Err(error) = write_version(&dir, tree, owner, summary) {
                // Best effort (a full disk still lets us remove): what is left is removed
                // by the next write or `Store::open` anyway, and nobody reads it.
                let _ = volume.remove_tree(&name);
                return Err(error);
            }
            // The new version is durable before anything points at it.
            volume.sync()?;
            if volume.kind_of(Layout::DATA_LINK_NAME)? == Some(Kind::Dir) {
                volume.remove_tree(Layout::DATA_LINK_NAME)?;
            }
            volume.remove_tree(DATA_LINK_TEMP_NAME)?;
            volume.symlink(&name, DATA_LINK_TEMP_NAME)?;
            volume.rename(DATA_LINK_TEMP_NAME, volume, Layout::DATA_LINK_NAME)?;
            changed = true;
            name
        }
    };
    for name in tree.keys() {
        let target = format!("{}/{name}", Layout::DATA_LINK_NAME);
        if volume.read_link(name)?.is_some_and(|t| t == OsStr::new(&target)) {
            continue;
        }
        match volume.kind_of(name)? {
            None => volume.symlink(&target, name)?,
            found => {
                // Replaced in one step: a plain file by rename, a directory (the previous
                // layout's nested item paths) by exchange, then removed.
                volume.remove_tree(LINK_TEMP_NAME)?;
                volume.symlink(&target, LINK_TEMP_NAME)?;
                if found == Some(Kind::Dir) {
                    volume.exchange(LINK_TEMP_NAME, name)?;
                    volume.remove_tree(LINK_TEMP_NAME)?;
                } else {
                    volume.rename(LINK_TEMP_NAME, volume, name)?;
                }
            }
        }
        summary.links_written += 1;
        changed = true;
    }
    for entry in volume.entries()? {
        let keep = entry.name == Layout::DATA_LINK_NAME
            || entry.name == version
            || entry.name.to_str().is_some_and(|name| tree.contains_key(name));
        if !keep && volume.remove_tree(&entry.name)? {
            summary.entries_removed += 1;
            changed = true;
        }
    }
    if changed {
        volume.sync()?;
    }
    Ok(())
}

/// The temporary name of the new `..data` link before it is renamed over the old one.
const DATA_LINK_TEMP_NAME: &str = "..data_tmp";
/// The temporary name of a key link that replaces a plain file or directory.
const LINK_TEMP_NAME: &str = "..link_tmp";

/// Whether a volume directory entry is one of the hidden names of the versioned layout
/// (`..data`, versions, temporary links). Keys and item paths never start with `..`
/// (the API server refuses them, and so does the store), so these cannot be the pod's.
pub(crate) fn is_hidden_volume_entry(name: &OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b"..")
}

/// The version `..data` points to, opened; `None` if there is none, or `..data` is not a
/// link to a version directory right here (it is then replaced, never followed).
fn current_version(volume: &Dir) -> Result<Option<(std::ffi::OsString, Dir)>> {
    let Some(target) = volume.read_link(Layout::DATA_LINK_NAME)? else {
        return Ok(None);
    };
    let is_version = is_hidden_volume_entry(&target)
        && !target.as_encoded_bytes().contains(&b'/')
        && ![Layout::DATA_LINK_NAME, DATA_LINK_TEMP_NAME, LINK_TEMP_NAME]
            .iter()
            .any(|name| target == *name);
    if !is_version {
        warn!(path = %volume.child_path(Layout::DATA_LINK_NAME).display(), target = %target.to_string_lossy(), "not a link to a version of this volume; replacing it");
        return Ok(None);
    }
    match volume.open_child(&target) {
        Ok(Some(dir)) => Ok(Some((target, dir))),
        Ok(None) | Err(Error::Symlink { .. } | Error::NotADirectory { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the version directory `dir` holds exactly `tree`: the same names, files with
/// these bytes, modes and owner (and no other hard link), directories with our mode.
fn version_matches(dir: &Dir, tree: &BTreeMap<&str, Node<'_>>, owner: FileOwner) -> Result<bool> {
    if dir.mode()? != VOLUME_DIR_MODE {
        return Ok(false);
    }
    let entries = dir.entries()?;
    if entries.len() != tree.len() {
        return Ok(false);
    }
    for entry in entries {
        let Some(node) = entry.name.to_str().and_then(|name| tree.get(name)) else {
            return Ok(false);
        };
        let matches = match node {
            Node::File(file) => {
                entry.kind == Kind::File
                    && dir.file_matches(&entry.name, &file.bytes, file.mode & DATA_MODE_MASK, Some(owner))?
            }
            Node::Dir(children) => match dir.open_child(&entry.name) {
                Ok(Some(child)) => version_matches(&child, children, owner)?,
                Ok(None) | Err(Error::Symlink { .. } | Error::NotADirectory { .. }) => false,
                Err(e) => return Err(e),
            },
        };
        if !matches {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Creates an empty, uniquely named version directory in `volume`.
fn new_version_dir(volume: &Dir) -> Result<(std::ffi::OsString, Dir)> {
    let stamp: String = ckpt_core::Timestamp::now()
        .to_rfc3339()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    loop {
        let name = format!("..{stamp}.{}", crate::fsops::unique_suffix());
        if let Some(dir) = volume.create_child(&name, VOLUME_DIR_MODE)? {
            return Ok((name.into(), dir));
        }
    }
}

/// Writes `tree` into the new, empty version directory `dir`.
fn write_version(
    dir: &Dir,
    tree: &BTreeMap<&str, Node<'_>>,
    owner: FileOwner,
    summary: &mut WriteSummary,
) -> Result<()> {
    for (name, node) in tree {
        match node {
            Node::File(file) => {
                dir.create_file(name, &file.bytes, file.mode & DATA_MODE_MASK, Some(owner))?;
                summary.files_written += 1;
            }
            Node::Dir(children) => {
                let child = dir.create_child(name, VOLUME_DIR_MODE)?.ok_or_else(|| {
                    Error::io(
                        "creating directory",
                        &dir.child_path(name),
                        std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                    )
                })?;
                write_version(&child, children, owner, summary)?;
            }
        }
    }
    dir.sync()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
    use std::path::Path;

    use ckpt_core::DataKind::{ConfigMap, Projected, Secret};
    use ckpt_core::manifest_bytes;

    use super::*;
    use crate::testutil::{Immutable, checkpoint, manifest, store};

    fn id(ns: &str, name: &str) -> PodId {
        PodId::new(ns, name)
    }

    /// Every file below `dir` as the pod sees it, relative, with its content: the
    /// hidden `..` entries of a volume are skipped and its key links (`-> ..data/…`)
    /// followed; any other symlink shows as `-> target`.
    fn tree(dir: &Path) -> Vec<(String, String)> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
            let Ok(entries) = fs::read_dir(dir) else { return };
            for entry in entries {
                let path = entry.unwrap().path();
                if path.file_name().unwrap().as_encoded_bytes().starts_with(b"..") {
                    continue;
                }
                let rel = path.strip_prefix(base).unwrap().display().to_string();
                let mut meta = fs::symlink_metadata(&path).unwrap();
                if meta.is_symlink() && fs::read_link(&path).unwrap().starts_with(Layout::DATA_LINK_NAME) {
                    meta = fs::metadata(&path).unwrap();
                }
                if meta.is_dir() {
                    walk(base, &path, out);
                } else if meta.is_symlink() {
                    out.push((rel, format!("-> {}", fs::read_link(&path).unwrap().display())));
                } else {
                    out.push((
                        rel,
                        String::from_utf8_lossy(&fs::read(&path).unwrap()).into_owned(),
                    ));
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn write_inactive_writes_data_then_manifest_and_skips_unchanged() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("kube-system", "api");
        let v1 = checkpoint(
            &layout,
            &pod,
            "1",
            &[
                (
                    Secret,
                    "tls",
                    &[("tls.key", "k1", 0o600), ("tls.crt", "c1", 0o644)],
                ),
                (
                    ConfigMap,
                    "cfg",
                    &[("a/b/c.yaml", "nested", 0o644), ("top", "t", 0o400)],
                ),
            ],
        );
        let summary = store.write_inactive(&v1).unwrap();
        assert_eq!(
            summary,
            WriteSummary {
                manifest_written: true,
                files_written: 4,
                links_written: 4,
                entries_removed: 0,
                legacy_removed: false
            }
        );
        let inactive = layout.inactive_manifest_path(&pod);
        assert_eq!(fs::read(&inactive).unwrap(), v1.manifest_bytes());
        assert_eq!(mode(&inactive), 0o644);
        assert_eq!(
            tree(&layout.checkpoint_dir().join("checkpoint-secrets")),
            pairs(&[
                ("kube-system/api/tls/tls.crt", "c1"),
                ("kube-system/api/tls/tls.key", "k1")
            ])
        );
        assert_eq!(
            tree(&layout.data_root(ConfigMap)),
            pairs(&[
                ("kube-system/api/cfg/a/b/c.yaml", "nested"),
                ("kube-system/api/cfg/top", "t")
            ])
        );
        let cfg = layout.data_dir(&v1.dirs[1].dir);
        let modes = [
            (cfg.join("..data/top"), 0o400),
            (cfg.join("..data/a/b/c.yaml"), 0o644),
            (cfg.join("..data/a"), 0o755),
            (cfg.join("..data/a/b"), 0o755),
            (cfg.clone(), 0o755),
            (layout.data_root(ConfigMap).join("kube-system/api"), 0o700),
            (layout.data_root(ConfigMap).join("kube-system"), 0o700),
            (layout.data_root(ConfigMap), 0o700),
            (layout.inactive_dir(), 0o700),
        ];
        for (path, expected) in modes {
            assert_eq!(mode(&path), expected, "{}", path.display());
        }

        assert_eq!(
            store.write_inactive(&v1).unwrap(),
            WriteSummary::default(),
            "steady state"
        );

        // A changed key, a removed key, a removed nested path, a removed volume.
        let v2 = checkpoint(
            &layout,
            &pod,
            "2",
            &[
                (Secret, "tls", &[("tls.key", "k2", 0o600)]),
                (Projected, "token", &[("ca.crt", "ca", 0o644)]),
            ],
        );
        let summary = store.write_inactive(&v2).unwrap();
        assert!(summary.manifest_written);
        assert_eq!(
            summary.files_written, 2,
            "tls.key and ca.crt; tls.crt only removed"
        );
        assert_eq!(
            summary.entries_removed, 3,
            "the previous tls version, the tls.crt link and the configmap pod dir"
        );
        assert_eq!(
            tree(&layout.checkpoint_dir().join("checkpoint-secrets")),
            pairs(&[("kube-system/api/tls/tls.key", "k2")])
        );
        assert!(
            !layout.data_root(ConfigMap).join("kube-system").exists(),
            "the namespace dir goes with its last pod"
        );
        assert_eq!(
            tree(&layout.data_root(Projected)),
            pairs(&[("kube-system/api/token/ca.crt", "ca")])
        );
        assert_eq!(fs::read(&inactive).unwrap(), v2.manifest_bytes());
    }

    #[test]
    fn plain_files_of_the_previous_layout_and_of_bootkube_become_versions_in_place() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("kube-system", "api");
        // What the previous layout (and bootkube) left: plain files and directories in
        // a 0700 volume directory; a running static pod mounts that directory.
        let dir = layout.pod_data_dir(Secret, &pod).join("tls");
        fs::create_dir_all(dir.join("nested")).unwrap();
        fs::write(dir.join("tls.key"), "old key").unwrap();
        fs::write(dir.join("nested/ca.crt"), "old ca").unwrap();
        fs::write(dir.join("stale"), "gone").unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let mounted = fs::metadata(&dir).unwrap().ino();
        assert_eq!(
            tree(&dir),
            pairs(&[
                ("nested/ca.crt", "old ca"),
                ("stale", "gone"),
                ("tls.key", "old key")
            ]),
            "read as they are until the first write"
        );

        let v1 = checkpoint(
            &layout,
            &pod,
            "1",
            &[(
                Secret,
                "tls",
                &[("tls.key", "new key", 0o600), ("nested/ca.crt", "new ca", 0o644)],
            )],
        );
        let summary = store.write_inactive(&v1).unwrap();
        assert_eq!(
            (
                summary.files_written,
                summary.links_written,
                summary.entries_removed
            ),
            (2, 2, 1),
            "a version of two files, their two links replacing a file and a directory, the stale key"
        );
        assert_eq!(
            tree(&dir),
            pairs(&[("nested/ca.crt", "new ca"), ("tls.key", "new key")])
        );
        assert_eq!(
            fs::metadata(&dir).unwrap().ino(),
            mounted,
            "the same directory: the running pod's mount sees the new files"
        );
        for key in ["tls.key", "nested"] {
            assert_eq!(
                fs::read_link(dir.join(key)).unwrap(),
                Path::new("..data").join(key)
            );
        }
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(
            store.write_inactive(&v1).unwrap(),
            WriteSummary::default(),
            "steady state"
        );

        // A version a killed writer never published goes with the next open; the current
        // one stays.
        let current = fs::read_link(dir.join("..data")).unwrap();
        fs::create_dir(dir.join("..2000_01_01T00_00_00_000Z.dead-1")).unwrap();
        fs::write(dir.join("..2000_01_01T00_00_00_000Z.dead-1/tls.key"), "half").unwrap();
        symlink("..2000_01_01T00_00_00_000Z.dead-1", dir.join("..data_tmp")).unwrap();
        Store::open(layout.clone()).unwrap();
        let hidden: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.as_encoded_bytes().starts_with(b".."))
            .collect();
        assert_eq!(hidden.len(), 2, "..data and {}: {hidden:?}", current.display());
        assert_eq!(fs::read_link(dir.join("..data")).unwrap(), current);
        assert_eq!(
            tree(&dir),
            pairs(&[("nested/ca.crt", "new ca"), ("tls.key", "new key")])
        );
    }

    #[test]
    fn data_entries_of_the_wrong_type_are_replaced() {
        let (tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "p");
        let v1 = checkpoint(
            &layout,
            &pod,
            "1",
            &[(Secret, "s", &[("a", "file", 0o600), ("d/x", "x", 0o600)])],
        );
        store.write_inactive(&v1).unwrap();
        // Now `a` becomes a directory and `d` a file.
        let v2 = checkpoint(
            &layout,
            &pod,
            "2",
            &[(Secret, "s", &[("a/y", "y", 0o600), ("d", "file", 0o600)])],
        );
        store.write_inactive(&v2).unwrap();
        let dir = layout.data_dir(&v2.dirs[0].dir);
        assert_eq!(tree(&dir), pairs(&[("a/y", "y"), ("d", "file")]));
        // Planted junk of every kind goes; symlink targets stay.
        let outside = tmp.path().join("outside");
        fs::write(&outside, "precious").unwrap();
        symlink(&outside, dir.join("a/y")).unwrap_err();
        fs::remove_file(dir.join("a/y")).unwrap();
        symlink(&outside, dir.join("a/y")).unwrap();
        symlink(&outside, dir.join("junk-link")).unwrap();
        fs::create_dir_all(dir.join("junk-dir/deeper")).unwrap();
        let summary = store.write_inactive(&v2).unwrap();
        // A new version (its a/y was replaced): both files; the tampered version and
        // the two junk entries go.
        assert_eq!((summary.files_written, summary.entries_removed), (2, 3));
        assert_eq!(tree(&dir), pairs(&[("a/y", "y"), ("d", "file")]));
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
    }

    #[test]
    fn manifest_mode_follows_secret_content() {
        let (_tmp, store) = store();
        let pod = id("ns", "p");
        let mut cp = checkpoint(store.layout(), &pod, "1", &[]);
        cp.manifest_holds_secrets = true;
        store.write_inactive(&cp).unwrap();
        assert_eq!(mode(&store.layout().inactive_manifest_path(&pod)), 0o600);
        store.activate(&pod).unwrap();
        assert_eq!(mode(&store.layout().active_manifest_path(&pod)), 0o600);
        cp.manifest_holds_secrets = false;
        assert!(
            store.write_inactive(&cp).unwrap().manifest_written,
            "mode change rewrites"
        );
        assert!(store.activate(&pod).unwrap());
        assert_eq!(mode(&store.layout().active_manifest_path(&pod)), 0o644);
    }

    #[test]
    fn invalid_checkpoints_are_refused_before_anything_is_written() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let check = |cp: Checkpoint, expected: &str| {
            let error = store.write_inactive(&cp).expect_err(expected).to_string();
            assert!(error.contains(expected), "{error:?} should contain {expected:?}");
            assert!(
                tree(layout.checkpoint_dir()).is_empty(),
                "{expected}: nothing written"
            );
        };
        let ok = id("ns", "p");
        let with =
            |version: &str, dirs: &[crate::testutil::DirSpec<'_>]| checkpoint(&layout, &ok, version, dirs);
        check(
            checkpoint(&layout, &id("Bad", "p"), "1", &[]),
            "invalid namespace \"Bad\"",
        );
        check(
            checkpoint(&layout, &id("ns", "../x"), "1", &[]),
            "invalid pod name \"../x\"",
        );
        check(
            checkpoint(&layout, &id("ns", ""), "1", &[]),
            "invalid pod name \"\"",
        );
        check(
            with("1", &[(Secret, "../../etc", &[])]),
            "invalid data directory name",
        );
        check(
            with("1", &[(Secret, "s", &[("../../x", "", 0o600)])]),
            "invalid data file path",
        );
        check(
            with("1", &[(Secret, "s", &[("/etc/passwd", "", 0o600)])]),
            "absolute",
        );
        check(
            with("1", &[(Secret, "s", &[("a//b", "", 0o600)])]),
            "empty or '.' component",
        );
        check(
            with("1", &[(Secret, "s", &[("a", "", 0o600), ("a/b", "", 0o600)])]),
            "clashes",
        );
        check(
            with("1", &[(Secret, "s", &[("a/b", "", 0o600), ("a", "", 0o600)])]),
            "clashes",
        );
        check(
            with("1", &[(Secret, "s", &[("a", "", 0o600), ("a", "", 0o600)])]),
            "clashes",
        );
        check(
            with("1", &[(Secret, "s", &[]), (Secret, "s", &[])]),
            "appears twice",
        );
        let mut other_pod = with("1", &[(Secret, "s", &[])]);
        other_pod.dirs[0].dir.pod = "q".into();
        check(other_pod, "belongs to ns/q");
        let mut not_a_checkpoint = with("1", &[]);
        not_a_checkpoint.manifest.metadata.annotations = None;
        check(not_a_checkpoint, "no checkpoint-of annotation");
        let mut mismatch = with("1", &[]);
        mismatch.manifest.metadata.name = Some("other".into());
        check(mismatch, "the manifest is a checkpoint of ns/other");
    }

    /// What `read_all` made of one file.
    #[derive(Debug, PartialEq)]
    enum Outcome {
        Inactive { legacy: bool },
        Active { legacy: bool },
        Quarantined,
        LeftAlone,
    }

    #[test]
    fn read_all_classifies_every_file() {
        use Outcome::*;
        let pod = id("kube-system", "api");
        let checkpoint_json = String::from_utf8(manifest_bytes(&manifest(&pod, "1"))).unwrap();
        let mut plain = manifest(&pod, "1");
        plain.metadata.annotations = None;
        let plain_json = String::from_utf8(manifest_bytes(&plain)).unwrap();
        let invalid_id_json = checkpoint_json.replace("\"kube-system\"", "\"Kube_System\"");
        let cases: &[(Place, &str, &str, Outcome)] = &[
            (
                Place::Inactive,
                "kube-system_api.json",
                &checkpoint_json,
                Inactive { legacy: false },
            ),
            (
                Place::Inactive,
                "kube-system-api.json",
                &checkpoint_json,
                Inactive { legacy: true },
            ),
            (Place::Inactive, "other.json", &checkpoint_json, Quarantined),
            (Place::Inactive, "kube-system_api.json", "{not json", Quarantined),
            (Place::Inactive, "kube-system_api.json", "", Quarantined),
            (Place::Inactive, "kube-system_api.json", &plain_json, Quarantined),
            (
                Place::Inactive,
                "Kube_System_api.json",
                &invalid_id_json,
                Quarantined,
            ),
            (Place::Inactive, "notes.txt", "hello", Quarantined),
            (Place::Inactive, ".12345", "bootkube temp, a dotfile", LeftAlone),
            (
                Place::Active,
                "kube-system_api.json",
                &checkpoint_json,
                Active { legacy: false },
            ),
            (
                Place::Active,
                "kube-system-api.json",
                &checkpoint_json,
                Active { legacy: true },
            ),
            (Place::Active, "other.json", &checkpoint_json, LeftAlone),
            (Place::Active, "kube-system_api.json", "{not json", LeftAlone),
            (Place::Active, "kube-system_api.json", &plain_json, LeftAlone),
            (
                Place::Active,
                "kube-apiserver.yaml",
                "apiVersion: v1\nkind: Pod\n",
                LeftAlone,
            ),
            (Place::Active, ".hidden", "x", LeftAlone),
        ];
        for (place, name, content, expected) in cases {
            let (_tmp, store) = store();
            let dir = match place {
                Place::Inactive => store.layout().inactive_dir(),
                Place::Active => store.layout().manifests_dir().to_path_buf(),
            };
            fs::write(dir.join(name), content).unwrap();
            let all = store.read_all().unwrap();
            let quarantined = fs::read_dir(store.layout().quarantine_dir()).unwrap().count();
            let got = match all.get(&pod) {
                Some(StoredCheckpoint {
                    inactive: Some(m),
                    active: None,
                    ..
                }) => Inactive {
                    legacy: m.legacy_name,
                },
                Some(StoredCheckpoint {
                    inactive: None,
                    active: Some(m),
                    ..
                }) => Active {
                    legacy: m.legacy_name,
                },
                None if quarantined == 1 && !dir.join(name).exists() => Quarantined,
                None if quarantined == 0 && dir.join(name).exists() => LeftAlone,
                other => panic!("{name}: unexpected {other:?}, {quarantined} quarantined"),
            };
            assert_eq!(&got, expected, "{place:?} {name} {content:.30}");
            if let Some(m) = all
                .get(&pod)
                .and_then(|c| c.inactive.as_ref().or(c.active.as_ref()))
            {
                assert_eq!(m.path, dir.join(name));
                assert_eq!(m.file_name, *name);
                assert_eq!(m.digest, sha256_hex(content.as_bytes()));
                assert_eq!(m.meta.parent, pod);
            }
        }
    }

    #[test]
    fn read_all_quarantines_odd_entries_in_the_inactive_dir() {
        use std::os::unix::ffi::OsStrExt;
        let (tmp, store) = store();
        let inactive = store.layout().inactive_dir();
        let outside = tmp.path().join("outside.json");
        let pod = id("ns", "p");
        fs::write(&outside, manifest_bytes(&manifest(&pod, "1"))).unwrap();
        symlink(&outside, inactive.join("ns_p.json")).unwrap();
        fs::create_dir(inactive.join("a-dir")).unwrap();
        fs::write(inactive.join(OsStr::from_bytes(b"bad-\xff.json")), b"x").unwrap();
        fs::write(
            inactive.join("big.json"),
            vec![b' '; (MAX_MANIFEST_BYTES + 1) as usize],
        )
        .unwrap();
        assert!(
            store.read_all().unwrap().is_empty(),
            "a symlink is never read through"
        );
        assert!(
            fs::read_dir(&inactive).unwrap().next().is_none(),
            "everything moved"
        );
        let quarantined: Vec<_> = fs::read_dir(store.layout().quarantine_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(quarantined.len(), 4, "{quarantined:?}");
        assert!(outside.is_file(), "the symlink's target stays");
        // A read-only store only looks.
        fs::write(inactive.join("junk"), b"x").unwrap();
        let read_only = Store::open_read_only(store.layout().clone()).unwrap();
        assert!(read_only.read_all().unwrap().is_empty());
        assert!(inactive.join("junk").exists());
    }

    #[test]
    fn duplicates_in_one_dir() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "p");
        let bytes = manifest_bytes(&manifest(&pod, "1"));
        let older = manifest_bytes(&manifest(&pod, "0"));
        fs::write(layout.inactive_dir().join("ns_p.json"), &bytes).unwrap();
        fs::write(layout.inactive_dir().join("ns-p.json"), &older).unwrap();
        fs::write(layout.manifests_dir().join("ns-p.json"), &older).unwrap();
        fs::write(layout.manifests_dir().join("ns_p.json"), &bytes).unwrap();
        let all = store.read_all().unwrap();
        let found = &all[&pod];
        assert!(!found.inactive.as_ref().unwrap().legacy_name, "our name wins");
        assert!(!found.active.as_ref().unwrap().legacy_name, "our name wins");
        assert!(found.active_matches_inactive());
        assert_eq!(found.duplicates, [layout.manifests_dir().join("ns-p.json")]);
        assert!(!layout.inactive_dir().join("ns-p.json").exists(), "quarantined");
        assert_eq!(fs::read_dir(layout.quarantine_dir()).unwrap().count(), 1);
        assert!(
            layout.manifests_dir().join("ns-p.json").exists(),
            "active files are not moved"
        );
        assert!(store.deactivate(&pod).unwrap());
        assert!(
            fs::read_dir(layout.manifests_dir()).unwrap().next().is_none(),
            "both active copies go"
        );
    }

    #[test]
    fn bootkube_checkpoints_are_adopted() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("kube-system", "api");
        let legacy_bytes = manifest_bytes(&manifest(&pod, "bootkube"));
        fs::write(layout.inactive_dir().join("kube-system-api.json"), &legacy_bytes).unwrap();
        fs::write(layout.manifests_dir().join("kube-system-api.json"), &legacy_bytes).unwrap();
        let all = store.read_all().unwrap();
        assert!(all[&pod].inactive.as_ref().unwrap().legacy_name);
        assert!(all[&pod].active.as_ref().unwrap().legacy_name);
        assert!(all[&pod].active_matches_inactive());

        // Activating the adopted inactive file is a no-op: same bytes, same (legacy) name.
        assert!(!store.activate(&pod).unwrap());
        // The next write renames the inactive file to ours.
        let ours = checkpoint(&layout, &pod, "ours", &[]);
        let summary = store.write_inactive(&ours).unwrap();
        assert!(summary.manifest_written && summary.legacy_removed);
        assert!(!layout.inactive_dir().join("kube-system-api.json").exists());
        // The active one keeps its name: renaming it would restart the static pod.
        assert!(store.activate(&pod).unwrap());
        assert_eq!(
            fs::read(layout.manifests_dir().join("kube-system-api.json")).unwrap(),
            ours.manifest_bytes()
        );
        assert!(!layout.active_manifest_path(&pod).exists());
        // Until it is deactivated; the next activation uses our name.
        assert!(store.deactivate(&pod).unwrap());
        assert!(store.activate(&pod).unwrap());
        assert!(layout.active_manifest_path(&pod).exists());
        assert!(!layout.manifests_dir().join("kube-system-api.json").exists());
    }

    #[test]
    fn legacy_names_that_collide_belong_to_their_content() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        // bootkube gave `a-b/c` and `a/b-c` the same name; the content says which it is.
        let owner = id("a-b", "c");
        let other = id("a", "b-c");
        let bytes = manifest_bytes(&manifest(&owner, "1"));
        fs::write(layout.inactive_dir().join("a-b-c.json"), &bytes).unwrap();
        fs::write(layout.manifests_dir().join("a-b-c.json"), &bytes).unwrap();
        assert!(matches!(
            store.activate(&other),
            Err(Error::NoInactiveCheckpoint { .. })
        ));
        assert!(!store.remove(&other).unwrap().removed_anything());
        assert!(!store.deactivate(&other).unwrap());
        assert!(layout.inactive_dir().join("a-b-c.json").exists());
        assert!(layout.manifests_dir().join("a-b-c.json").exists());
        let all = store.read_all().unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), [&owner]);
        let summary = store.remove(&owner).unwrap();
        assert!(summary.inactive_removed && summary.active_removed);
        assert!(store.read_all().unwrap().is_empty());
    }

    #[test]
    fn activate_and_deactivate() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "p");
        assert!(matches!(
            store.activate(&pod),
            Err(Error::NoInactiveCheckpoint { .. })
        ));
        assert!(!store.deactivate(&pod).unwrap(), "missing is fine");
        store
            .write_inactive(&checkpoint(&layout, &pod, "1", &[]))
            .unwrap();
        // The kubelet's dir went missing: it is created (bootkube crashed).
        fs::remove_dir(layout.manifests_dir()).unwrap();
        assert!(store.activate(&pod).unwrap());
        assert_eq!(mode(layout.manifests_dir()), 0o755);
        assert_eq!(mode(&layout.active_manifest_path(&pod)), 0o644);
        assert!(!store.activate(&pod).unwrap(), "identical: not rewritten");
        assert!(store.read_all().unwrap()[&pod].active_matches_inactive());
        store
            .write_inactive(&checkpoint(&layout, &pod, "2", &[]))
            .unwrap();
        assert!(!store.read_all().unwrap()[&pod].active_matches_inactive());
        assert!(store.activate(&pod).unwrap());
        assert!(store.deactivate(&pod).unwrap());
        assert!(!store.deactivate(&pod).unwrap());
        assert!(
            layout.inactive_manifest_path(&pod).exists(),
            "deactivation keeps the inactive copy"
        );
        assert!(matches!(
            store.activate(&id("Bad", "p")),
            Err(Error::InvalidName { .. })
        ));
    }

    #[test]
    fn foreign_files_in_the_manifests_dir_are_never_touched() {
        let (tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "p");
        store
            .write_inactive(&checkpoint(&layout, &pod, "1", &[]))
            .unwrap();
        let ours = layout.active_manifest_path(&pod);
        let foreign_pod = manifest_bytes(&{
            let mut p = manifest(&pod, "1");
            p.metadata.annotations = None;
            p
        });
        let outside = tmp.path().join("outside");
        fs::write(&outside, "precious").unwrap();
        type Plant<'a> = (&'a str, &'a dyn Fn(&Path));
        let plant: &[Plant<'_>] = &[
            ("a static pod that is not a checkpoint", &|p| {
                fs::write(p, &foreign_pod).unwrap()
            }),
            ("a checkpoint of another pod", &|p| {
                fs::write(p, manifest_bytes(&manifest(&id("ns", "q"), "1"))).unwrap()
            }),
            ("garbage", &|p| fs::write(p, "garbage").unwrap()),
            ("a symlink", &|p| symlink(&outside, p).unwrap()),
            ("a directory", &|p| fs::create_dir(p).unwrap()),
        ];
        for (what, plant) in plant {
            plant(&ours);
            let before = tree(layout.manifests_dir());
            assert!(
                matches!(store.activate(&pod), Err(Error::NotOurs { .. })),
                "{what}"
            );
            assert!(!store.deactivate(&pod).unwrap(), "{what}");
            assert!(!store.remove(&id("ns", "p")).unwrap().active_removed, "{what}");
            assert_eq!(tree(layout.manifests_dir()), before, "{what}");
            assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
            let _ = fs::remove_file(&ours).or_else(|_| fs::remove_dir(&ours));
            store
                .write_inactive(&checkpoint(&layout, &pod, "1", &[]))
                .unwrap();
        }
    }

    #[test]
    fn remove_goes_in_order_and_is_idempotent() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "p");
        let neighbour = id("ns", "q");
        let dirs: &[crate::testutil::DirSpec<'_>] = &[
            (Secret, "s", &[("k", "v", 0o600)]),
            (ConfigMap, "c", &[("k", "v", 0o644)]),
            (Projected, "t", &[("k", "v", 0o644)]),
        ];
        store
            .write_inactive(&checkpoint(&layout, &pod, "1", dirs))
            .unwrap();
        store
            .write_inactive(&checkpoint(&layout, &neighbour, "1", dirs))
            .unwrap();
        store.activate(&pod).unwrap();
        assert_eq!(
            store.data_pods().unwrap(),
            BTreeSet::from([neighbour.clone(), pod.clone()])
        );

        // A tree far deeper than any bound (an attacker's) is removed all the same.
        let deep: PathBuf = std::iter::repeat_n("d", 300).collect();
        fs::create_dir_all(layout.pod_data_dir(Secret, &pod).join("s").join(deep)).unwrap();
        // A step that fails: the static pod is stopped first all the same (its data must
        // not vanish from under it), the inactive checkpoint stays for a retry.
        let stuck = layout.pod_data_dir(ConfigMap, &pod).join("c");
        let _immutable = Immutable::set(&stuck);
        let err = store
            .remove(&pod)
            .expect_err("an immutable directory cannot be removed");
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(!layout.active_manifest_path(&pod).exists(), "stopped first");
        assert!(layout.inactive_manifest_path(&pod).exists());
        drop(_immutable);
        store.activate(&pod).unwrap();

        let summary = store.remove(&pod).unwrap();
        assert_eq!(
            summary,
            RemoveSummary {
                // The secrets went in the failed attempt.
                data_dirs_removed: 2,
                inactive_removed: true,
                active_removed: true
            }
        );
        assert_eq!(
            store.remove(&pod).unwrap(),
            RemoveSummary::default(),
            "idempotent"
        );
        assert_eq!(store.data_pods().unwrap(), BTreeSet::from([neighbour.clone()]));
        assert_eq!(store.read_all().unwrap().keys().collect::<Vec<_>>(), [&neighbour]);
        assert!(layout.pod_data_dir(Secret, &neighbour).join("s/k").exists());
        store.remove(&neighbour).unwrap();
        assert!(store.data_pods().unwrap().is_empty());
        assert!(!layout.data_root(Secret).join("ns").exists());
    }

    #[test]
    fn an_uninstalled_node_keeps_no_empty_dir_of_ours() {
        let (tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "p");
        let dirs: &[crate::testutil::DirSpec<'_>] = &[(Secret, "s", &[("k", "v", 0o600)])];
        store
            .write_inactive(&checkpoint(&layout, &pod, "1", dirs))
            .unwrap();
        store.write_credentials(b"kubeconfig", b"token").unwrap();
        store.write_journal(&BTreeMap::from([("k", 1)])).unwrap();
        // Not ours, beside ours: kept.
        fs::write(layout.checkpoint_dir().join("admin.conf"), "x").unwrap();
        // A quarantined file is kept, and so is its directory.
        fs::create_dir_all(layout.quarantine_dir()).unwrap();
        fs::write(layout.quarantine_dir().join("bad.json"), "{").unwrap();

        // While anything is in them, they stay.
        assert!(store.remove_empty_dirs().unwrap().is_empty());
        assert!(layout.inactive_dir().exists() && layout.agent_dir().exists());

        store.remove(&pod).unwrap();
        store.remove_credentials().unwrap();
        store.remove_journal().unwrap();
        let mut removed = store.remove_empty_dirs().unwrap();
        removed.sort();
        assert_eq!(
            removed,
            ["checkpoint-secrets", "inactive-manifests", "pod-checkpointer"]
        );
        let mut left: Vec<String> = fs::read_dir(tmp.path().join("k8s"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["admin.conf", "checkpoint-quarantine", "manifests"]);
        assert!(store.remove_empty_dirs().unwrap().is_empty(), "idempotent");
    }

    #[test]
    fn orphaned_data_is_listed_and_removed() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "orphan");
        fs::create_dir_all(layout.pod_data_dir(ConfigMap, &pod).join("c")).unwrap();
        fs::create_dir_all(layout.data_root(Secret).join("Not_A_Namespace/x")).unwrap();
        fs::write(layout.data_root(Secret).join("stray-file"), "x").unwrap();
        assert_eq!(store.data_pods().unwrap(), BTreeSet::from([pod.clone()]));
        assert_eq!(store.remove(&pod).unwrap().data_dirs_removed, 1);
        assert!(store.data_pods().unwrap().is_empty());
    }

    #[test]
    fn data_the_active_manifest_mounts_is_kept_until_deactivation() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "p");
        let v1 = checkpoint(&layout, &pod, "1", &[(Secret, "old", &[("k", "v", 0o600)])]);
        store.write_inactive(&v1).unwrap();
        store.activate(&pod).unwrap();
        let v2 = checkpoint(&layout, &pod, "2", &[(ConfigMap, "new", &[("k", "v", 0o600)])]);
        store.write_inactive(&v2).unwrap();
        let old = layout.data_dir(&v1.dirs[0].dir);
        assert!(old.join("k").exists(), "the running static pod still mounts it");
        store.deactivate(&pod).unwrap();
        assert_eq!(store.write_inactive(&v2).unwrap().entries_removed, 1);
        assert!(!old.exists());
    }

    #[test]
    fn open_cleans_only_our_stale_temp_files() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let stale = ".pod-checkpointer-00000000deadbeef-3.tmp";
        let pod = id("ns", "p");
        store
            .write_inactive(&checkpoint(
                &layout,
                &pod,
                "1",
                &[(Secret, "s", &[("k", "v", 0o600)])],
            ))
            .unwrap();
        let secret_dir = layout.pod_data_dir(Secret, &pod).join("s");
        // The previous layout staged data files below each data root: that dir goes.
        let staging = layout.data_root(Secret).join(".staging");
        fs::create_dir(&staging).unwrap();
        fs::write(staging.join(stale), "partial").unwrap();
        let dirs = [
            layout.manifests_dir().to_path_buf(),
            layout.inactive_dir(),
            layout.checkpoint_dir().to_path_buf(),
        ];
        for dir in dirs.iter().chain([&secret_dir]) {
            fs::write(dir.join(stale), "partial").unwrap();
            fs::write(dir.join(".12345"), "bootkube's").unwrap();
            fs::write(dir.join(".swp"), "an editor's").unwrap();
        }
        let reopened = Store::open(layout.clone()).unwrap();
        assert!(!staging.exists());
        for dir in &dirs {
            assert!(!dir.join(stale).exists(), "{}", dir.display());
            assert!(
                dir.join(".12345").exists() && dir.join(".swp").exists(),
                "{}",
                dir.display()
            );
        }
        // A data directory is never searched by name (a key may be spelled like that):
        // the old-style temp file there goes with the next write of the checkpoint,
        // as every entry the checkpoint does not have.
        assert!(secret_dir.join(stale).exists());
        reopened
            .write_inactive(&checkpoint(
                &layout,
                &pod,
                "2",
                &[(Secret, "s", &[("k", "v", 0o600)])],
            ))
            .unwrap();
        assert_eq!(tree(&secret_dir), pairs(&[("k", "v")]));
        // read_all cleans too (an interrupted write since the last pass).
        fs::write(layout.manifests_dir().join(stale), "partial").unwrap();
        reopened.read_all().unwrap();
        assert!(!layout.manifests_dir().join(stale).exists());
    }

    /// Secret/ConfigMap keys (`[-._a-zA-Z0-9]+`) and `items[].path`s may look exactly like
    /// our temp files; a restart must never delete them.
    #[test]
    fn data_keys_shaped_like_temp_files_survive_a_restart() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let pod = id("ns", "p");
        let keys = [
            ".pod-checkpointer-00000000deadbeef-3.tmp",
            "sub/.pod-checkpointer-00000000deadbeef-4.tmp",
        ];
        let files: Vec<(&str, &str, u32)> = keys.iter().map(|k| (*k, "data", 0o600)).collect();
        store
            .write_inactive(&checkpoint(&layout, &pod, "1", &[(Secret, "s", &files)]))
            .unwrap();
        let secret_dir = layout.pod_data_dir(Secret, &pod).join("s");
        for reopen in [0, 1] {
            let store = Store::open(layout.clone()).unwrap();
            store.read_all().unwrap();
            for key in keys {
                assert!(secret_dir.join(key).exists(), "reopen {reopen}: {key}");
            }
        }
    }

    #[test]
    fn read_only_store_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path().join("missing"), tmp.path().join("missing/manifests"));
        let store = Store::open_read_only(layout.clone()).unwrap();
        assert!(store.read_all().unwrap().is_empty());
        assert!(store.data_pods().unwrap().is_empty());
        assert!(!layout.checkpoint_dir().exists(), "nothing created");
        let pod = id("ns", "p");
        let refused = [
            store
                .write_inactive(&checkpoint(&layout, &pod, "1", &[]))
                .map(|_| ()),
            store.activate(&pod).map(|_| ()),
            store.deactivate(&pod).map(|_| ()),
            store.remove(&pod).map(|_| ()),
            store.clean_stale_temp_files().map(|_| ()),
        ];
        for result in refused {
            assert!(matches!(result, Err(Error::ReadOnlyStore { .. })), "{result:?}");
        }
    }

    #[test]
    fn store_can_be_shared_between_threads() {
        // The executor runs store calls on blocking threads.
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Store>();
        assert_send_sync::<Error>();
    }

    #[test]
    fn layouts_that_overlap_are_refused() {
        let check = |checkpoint_dir: &str, manifests_dir: &str, ok: bool| {
            let layout = Layout::new(checkpoint_dir, manifests_dir);
            assert_eq!(
                Store::open_read_only(layout).is_ok(),
                ok,
                "{checkpoint_dir} {manifests_dir}"
            );
        };
        check("/etc/kubernetes", "/etc/kubernetes/manifests", true);
        check("/etc/kubernetes", "/etc/kubernetes", false);
        check("/etc/kubernetes", "/etc/kubernetes/inactive-manifests", false);
        check("/etc/kubernetes", "/etc/kubernetes/checkpoint-secrets/", false);
        check("/etc/kubernetes", "/etc/kubernetes/checkpoint-quarantine", false);
    }

    #[test]
    fn symlinked_roots_are_refused_not_followed() {
        let (tmp, store) = store();
        let layout = store.layout().clone();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::remove_dir(layout.inactive_dir()).unwrap();
        symlink(&outside, layout.inactive_dir()).unwrap();
        let pod = id("ns", "p");
        assert!(matches!(
            store.write_inactive(&checkpoint(&layout, &pod, "1", &[])),
            Err(Error::Symlink { .. })
        ));
        assert!(matches!(store.read_all(), Err(Error::Symlink { .. })));
        assert!(matches!(Store::open(layout.clone()), Err(Error::Symlink { .. })));
        assert!(fs::read_dir(&outside).unwrap().next().is_none());
    }
}
