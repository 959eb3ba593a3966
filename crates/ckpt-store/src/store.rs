//! The [`Store`] itself: opening it, its directories, and the cleanup after a killed
//! writer. What it does with checkpoints is in its submodules, one concern each:
//!
//! - `scan`: reading checkpoints back, quarantining what is unusable, listing data;
//! - `manifest`: one manifest file, read and classified;
//! - `validate`: checking a checkpoint before anything of it is written;
//! - `write`: writing a checkpoint as inactive, and removing one;
//! - `activation`: activating and deactivating a checkpoint;
//! - `volume`: a volume directory in the kubelet's AtomicWriter layout;
//! - `summary`: what a write or a removal changed.

mod activation;
mod manifest;
pub(crate) mod scan;
pub(crate) mod summary;
mod validate;
mod volume;
mod write;

use std::ffi::OsStr;

use ckpt_core::DataKind;
use tracing::info;

use crate::error::{Error, Result};
use crate::fsops::Dir;
use crate::layout::Layout;
use volume::remove_abandoned_versions;

/// Our own directories, the data roots and the namespace and pod directories below them:
/// root-only. A data root is the ancestor that keeps host users away from the data.
const DIR_MODE: u32 = 0o700;

/// The agent's own dir: root only (the journal and a bearer token).
const AGENT_DIR_MODE: u32 = 0o700;

/// The kubelet's static pod directory, when we have to create it.
const MANIFESTS_DIR_MODE: u32 = 0o755;

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
        remove_files(self.existing_checkpoint_dir()?, names)
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
        remove_files(self.existing_agent_dir()?, names)
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
}

/// Removes these files from `dir`, if it exists; returns whether any of them was there.
fn remove_files(dir: Option<Dir>, names: &[&str]) -> Result<bool> {
    let Some(dir) = dir else {
        return Ok(false);
    };
    let mut removed = false;
    for name in names {
        removed |= dir.remove_file(name)?;
    }
    if removed {
        dir.sync()?;
    }
    Ok(removed)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;
    use std::os::unix::fs::symlink;

    use ckpt_core::DataKind::Secret;

    use super::*;
    use crate::testutil::{checkpoint, id, pairs, store, tree};

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
