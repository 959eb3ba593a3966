//! Activating a checkpoint (its inactive manifest copied into the kubelet's static pod
//! directory) and deactivating it.

use ckpt_core::PodId;
use tracing::{debug, info};

use super::manifest::{Slot, slot};
use super::{MANIFESTS_DIR_MODE, Store};
use crate::error::{Error, Result};
use crate::fsops::Dir;
use crate::layout::Layout;
use crate::names::check_pod_id;

impl Store {
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
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    use ckpt_core::manifest_bytes;

    use super::*;
    use crate::testutil::{checkpoint, id, manifest, mode, store, tree};

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
}
