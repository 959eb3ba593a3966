//! Writing a checkpoint as inactive (its data, then its manifest), and removing one.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::PathBuf;

use ckpt_core::{Checkpoint, DataKind, FileOwner, MaterializedDir, PodId};
use tracing::{debug, info, warn};

use super::manifest::{Slot, slot};
use super::summary::{RemoveSummary, WriteSummary};
use super::validate::validate;
use super::volume::{Node, VOLUME_DIR_MODE, sync_volume};
use super::{DIR_MODE, Store};
use crate::error::{Error, Result};
use crate::fsops::Dir;
use crate::layout::Layout;
use crate::names::check_pod_id;

impl Store {
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

    /// Removes a pod's data directories, and nothing else (no manifest): data a crash
    /// left without its checkpoint. Returns how many went.
    pub fn remove_data(&self, id: &PodId) -> Result<usize> {
        self.require_writable()?;
        check_pod_id(id)?;
        let Some(checkpoint_dir) = self.existing_checkpoint_dir()? else {
            return Ok(0);
        };
        let mut removed = 0;
        for kind in DataKind::ALL {
            removed += self.remove_pod_data(&checkpoint_dir, kind, id, &BTreeSet::new())?;
        }
        if removed > 0 {
            info!(pod = %id, data_dirs = removed, "removed data that belongs to no checkpoint");
        }
        Ok(removed)
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

/// The owner of the directories we create: this process (root on a node).
fn agent_owner() -> FileOwner {
    FileOwner {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use ckpt_core::DataKind::{ConfigMap, Projected, Secret};

    use super::*;
    use crate::error::Error;
    use crate::testutil::{Immutable, checkpoint, id, mode, pairs, running_as_root, store, tree};

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
        let failed_first = running_as_root();
        if failed_first {
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
        } else {
            eprintln!("skipped: the removal that fails (chattr +i) needs root");
        }

        let summary = store.remove(&pod).unwrap();
        assert_eq!(
            summary,
            RemoveSummary {
                // The secrets went in the failed attempt.
                data_dirs_removed: if failed_first { 2 } else { 3 },
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
}
