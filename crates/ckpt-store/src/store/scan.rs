//! Reading checkpoints back: both manifest directories scanned, every file classified,
//! what is unusable in our own directory quarantined; and the pods that have data.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::PathBuf;

use ckpt_core::{CheckpointMeta, DataKind, PodId, sha256_hex};
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, warn};

use super::manifest::{ManifestFile, ParsedManifest, read_manifest};
use super::{DIR_MODE, Store};
use crate::error::{Error, Result};
use crate::fsops::{Dir, Entry, Kind};
use crate::layout::Layout;
use crate::names::{check_namespace, check_pod_id};

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

impl Store {
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
                quarantine_file(checkpoint_dir, dir, name, reason);
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
    /// or not it has a manifest: a synced pass removes those of no checkpoint
    /// (`ckpt_core::Decision::remove_orphan_data`, [`Store::remove_data`]), `drain` all.
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

/// Moves an unusable file from `dir` to the quarantine dir under a unique name, with a
/// warning; returns where it went. If even that fails the file stays where it is (never
/// deleted), and the warning says so.
pub(crate) fn quarantine_file(
    checkpoint_dir: &Dir,
    dir: &Dir,
    name: &OsStr,
    reason: &str,
) -> Option<PathBuf> {
    let path = dir.child_path(name);
    match move_to_quarantine(checkpoint_dir, dir, name) {
        Ok(to) => {
            warn!(path = %path.display(), reason, quarantined_to = %to.display(), "moved an unusable file to quarantine");
            Some(to)
        }
        Err(error) => {
            warn!(path = %path.display(), reason, %error, "could not quarantine an unusable file; left in place");
            None
        }
    }
}

/// Moves `name` from `dir` to the quarantine dir under a unique name (`<name>.<ms since
/// the epoch>`, then `-1`, `-2`, …), both directories synced; returns its new path.
pub(crate) fn move_to_quarantine(checkpoint_dir: &Dir, dir: &Dir, name: &OsStr) -> Result<PathBuf> {
    let quarantine_dir = checkpoint_dir.ensure_child(Layout::QUARANTINE_DIR_NAME, DIR_MODE, None, false)?;
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
    Ok(quarantine_dir.child_path(&target))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use ckpt_core::DataKind::{ConfigMap, Secret};
    use ckpt_core::manifest_bytes;

    use super::*;
    use crate::error::Error;
    use crate::store::manifest::MAX_MANIFEST_BYTES;
    use crate::testutil::{checkpoint, id, manifest, store};

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

    /// `remove_data` takes a pod's data and nothing else: not its manifests, not a
    /// neighbour's data, not what is not ours in the data roots.
    #[test]
    fn remove_data_takes_the_pods_data_only() {
        let (_tmp, store) = store();
        let layout = store.layout().clone();
        let (orphan, kept) = (id("ns", "orphan"), id("ns", "kept"));
        store
            .write_inactive(&checkpoint(
                &layout,
                &kept,
                "1",
                &[(Secret, "s", &[("k", "v", 0o600)])],
            ))
            .unwrap();
        fs::create_dir_all(layout.pod_data_dir(ConfigMap, &orphan).join("c")).unwrap();
        fs::create_dir_all(layout.pod_data_dir(Secret, &orphan).join("s")).unwrap();
        fs::write(layout.data_root(Secret).join("stray-file"), "x").unwrap();
        assert_eq!(store.remove_data(&orphan).unwrap(), 2);
        assert_eq!(store.remove_data(&orphan).unwrap(), 0, "idempotent");
        assert_eq!(store.data_pods().unwrap(), BTreeSet::from([kept.clone()]));
        assert!(layout.inactive_manifest_path(&kept).exists());
        assert!(layout.data_root(Secret).join("stray-file").exists());
        // The kept pod's data goes only when asked for it, its manifest stays.
        assert_eq!(store.remove_data(&kept).unwrap(), 1);
        assert!(layout.inactive_manifest_path(&kept).exists());
    }
}
