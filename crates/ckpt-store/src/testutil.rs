//! Test fixtures, one file for the unit tests (`mod testutil` in lib.rs) and the
//! integration tests (each includes it with `#[path]` as `mod common`): checkpoints as
//! ckpt-core's sanitizer would make them, stores in temp dirs, and ways to look at what
//! the store wrote.
// Each test binary uses a different subset.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ckpt_core::ANNOTATION_CHECKPOINT_OF;
use ckpt_core::{Checkpoint, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, PodId};
// The crate's own name also inside it (lib.rs: `extern crate self as ckpt_store` in test
// builds), so this file compiles in both kinds of test.
use ckpt_store::{Layout, Store};
use k8s_openapi::api::core::v1::{HostPathVolumeSource, Pod, PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A layout inside `root`, as on a node: `<root>/kubernetes` and its `manifests`.
pub(crate) fn layout(root: &Path) -> Layout {
    Layout::new(root.join("kubernetes"), root.join("kubernetes/manifests"))
}

/// A writable store in a fresh temp dir.
pub(crate) fn store() -> (tempfile::TempDir, Store) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(tmp.path().join("k8s"), tmp.path().join("k8s/manifests"));
    let store = Store::open(layout).expect("open");
    (tmp, store)
}

pub(crate) fn id(ns: &str, name: &str) -> PodId {
    PodId::new(ns, name)
}

/// A checkpoint manifest of `id` carrying `annotations` besides checkpoint-of.
fn pod(id: &PodId, annotations: &[(&str, String)]) -> Pod {
    let mut all_annotations = BTreeMap::from([(ANNOTATION_CHECKPOINT_OF.to_owned(), id.name.to_string())]);
    all_annotations.extend(annotations.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    Pod {
        metadata: ObjectMeta {
            name: Some(id.name.to_string()),
            namespace: Some(id.namespace.to_string()),
            annotations: Some(all_annotations),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        ..Default::default()
    }
}

/// A checkpoint manifest of `id` (with `version` in an annotation so content can change).
pub(crate) fn manifest(id: &PodId, version: &str) -> Pod {
    pod(id, &[("test/version", version.to_owned())])
}

/// One data file: path, content, mode.
pub(crate) type FileSpec = (String, Vec<u8>, u32);

/// A checkpoint of `id` whose manifest carries `annotations` and mounts each of `dirs`
/// (kind, name, files) as a hostPath.
pub(crate) fn checkpoint_with(
    layout: &Layout,
    id: &PodId,
    annotations: &[(&str, String)],
    dirs: &[(DataKind, &str, Vec<FileSpec>)],
    owner: FileOwner,
) -> Checkpoint {
    let dirs: Vec<MaterializedDir> = dirs
        .iter()
        .map(|(kind, name, files)| MaterializedDir {
            dir: DataDir {
                kind: *kind,
                namespace: id.namespace.to_string(),
                pod: id.name.to_string(),
                name: (*name).to_owned(),
            },
            files: files
                .iter()
                .map(|(path, bytes, mode)| DataFile {
                    path: path.clone(),
                    bytes: bytes.clone(),
                    mode: *mode,
                })
                .collect(),
        })
        .collect();
    let volumes = dirs
        .iter()
        .map(|d| Volume {
            name: format!("{}-{}", d.dir.kind.root_dir_name(), d.dir.name),
            host_path: Some(HostPathVolumeSource {
                path: layout.data_dir(&d.dir).display().to_string(),
                type_: None,
            }),
            ..Default::default()
        })
        .collect();
    let mut manifest = pod(id, annotations);
    if let Some(spec) = manifest.spec.as_mut() {
        spec.volumes = Some(volumes);
    }
    Checkpoint {
        parent: id.clone(),
        manifest,
        dirs,
        owner,
        manifest_holds_secrets: false,
        spec_hash: "test".into(),
    }
}

/// One data directory: kind, name, files as (path, content, mode).
pub(crate) type DirSpec<'a> = (DataKind, &'a str, &'a [(&'a str, &'a str, u32)]);

/// [`checkpoint_with`] in short: `version` in an annotation (and the spec hash), files
/// as text, owned by this process (root, as on a node, where the tests run as root; any
/// other user may run them too: it cannot give files to root).
pub(crate) fn checkpoint(layout: &Layout, id: &PodId, version: &str, dirs: &[DirSpec<'_>]) -> Checkpoint {
    let dirs: Vec<(DataKind, &str, Vec<FileSpec>)> = dirs
        .iter()
        .map(|(kind, name, files)| {
            let files = files
                .iter()
                .map(|(path, text, mode)| ((*path).to_owned(), text.as_bytes().to_vec(), *mode))
                .collect();
            (*kind, *name, files)
        })
        .collect();
    let annotations = [("test/version", version.to_owned())];
    Checkpoint {
        spec_hash: format!("hash-{version}"),
        ..checkpoint_with(layout, id, &annotations, &dirs, own_files())
    }
}

/// Every file below `dir` as the pod sees it, relative, with its content: the
/// hidden `..` entries of a volume are skipped and its key links (`-> ..data/…`)
/// followed; any other symlink shows as `-> target`.
pub(crate) fn tree(dir: &Path) -> Vec<(String, String)> {
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

/// The permission bits of `path` (not following a symlink).
pub(crate) fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

pub(crate) fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// What one filesystem entry looks like, for before/after comparisons.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) kind: &'static str,
    pub(crate) content: Vec<u8>,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// Every entry below `root` (never following symlinks), by relative path.
pub(crate) fn snapshot(root: &Path) -> BTreeMap<PathBuf, Snapshot> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Snapshot>) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        for entry in entries {
            let path = entry.expect("entry").path();
            let meta = fs::symlink_metadata(&path).expect("lstat");
            let (kind, content) = if meta.is_dir() {
                walk(base, &path, out);
                ("dir", Vec::new())
            } else if meta.is_symlink() {
                let target = fs::read_link(&path).expect("readlink");
                ("symlink", target.into_os_string().into_encoded_bytes())
            } else {
                ("file", fs::read(&path).expect("read"))
            };
            let rel = path.strip_prefix(base).expect("below base").to_path_buf();
            out.insert(
                rel,
                Snapshot {
                    kind,
                    content,
                    mode: meta.mode() & 0o7777,
                    uid: meta.uid(),
                    gid: meta.gid(),
                },
            );
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Files owned by this process.
pub(crate) fn own_files() -> FileOwner {
    FileOwner {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
    }
}

/// Whether the current process is root (the owner of `/proc/self`).
pub(crate) fn running_as_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The immutable attribute (`chattr +i`) on a path while this lives: even root can then
/// neither remove the entry nor change what is in it, which is how tests make a removal
/// fail for real.
pub(crate) struct Immutable(PathBuf);

impl Immutable {
    pub(crate) fn set(path: &Path) -> Immutable {
        chattr("+i", path);
        Immutable(path.to_owned())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        chattr("-i", &self.0);
    }
}

fn chattr(flag: &str, path: &Path) {
    let status = std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .expect("chattr (e2fsprogs) runs");
    assert!(status.success(), "chattr {flag} {}: {status}", path.display());
}
