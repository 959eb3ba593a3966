//! A volume directory (the hostPath a checkpoint mounts) laid out as the kubelet's
//! AtomicWriter lays out a secret volume: versions, the `..data` link switched by one
//! `rename`, a link per key (ARCHITECTURE.md, Identity and layout).

use std::collections::BTreeMap;
use std::ffi::OsStr;

use ckpt_core::{DataFile, FileOwner};
use tracing::warn;

use super::summary::WriteSummary;
use crate::error::{Error, Result};
use crate::fsops::{Dir, Kind};
use crate::layout::Layout;

/// Volume directories, their versions and the subdirectories in those: enterable by every
/// user of the pod (the kubelet mounts a volume directory itself, so the root-only
/// ancestors do not stand in the pod's way), as the kubelet makes them.
pub(crate) const VOLUME_DIR_MODE: u32 = 0o755;

/// Data file modes are limited to permission bits: never setuid/setgid/sticky.
const DATA_MODE_MASK: u32 = 0o777;

/// A checkpoint's data files as a tree, so nested `items[].path`s become directories.
#[derive(Debug)]
pub(crate) enum Node<'a> {
    File(&'a DataFile),
    Dir(BTreeMap<&'a str, Node<'a>>),
}

/// Removes, in every volume directory below a data root, the hidden entries no reader
/// can reach: versions and temporary links a killed writer left, anything `..data` does
/// not point to. Returns how many.
pub(crate) fn remove_abandoned_versions(root: &Dir) -> Result<usize> {
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
pub(crate) fn sync_volume(
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

    use ckpt_core::DataKind::Secret;

    use super::*;
    use crate::Store;
    use crate::testutil::{checkpoint, id, mode, pairs, store, tree};

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
}
