//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ckpt_core::ANNOTATION_CHECKPOINT_OF;
use ckpt_core::{Checkpoint, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, PodId};
use ckpt_store::Layout;
use k8s_openapi::api::core::v1::{HostPathVolumeSource, Pod, PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A layout inside `root`, as on a node: `<root>/kubernetes` and its `manifests`.
pub fn layout(root: &Path) -> Layout {
    Layout::new(root.join("kubernetes"), root.join("kubernetes/manifests"))
}

/// One data file: path, content, mode.
pub type FileSpec = (String, Vec<u8>, u32);

/// A checkpoint of `id` whose manifest carries `annotations` and mounts `dirs`.
pub fn checkpoint(
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
    let mut all_annotations = BTreeMap::from([(ANNOTATION_CHECKPOINT_OF.to_owned(), id.name.to_string())]);
    all_annotations.extend(annotations.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
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
    Checkpoint {
        parent: id.clone(),
        manifest: Pod {
            metadata: ObjectMeta {
                name: Some(id.name.to_string()),
                namespace: Some(id.namespace.to_string()),
                annotations: Some(all_annotations),
                ..Default::default()
            },
            spec: Some(PodSpec {
                volumes: Some(volumes),
                ..Default::default()
            }),
            ..Default::default()
        },
        dirs,
        owner,
        manifest_holds_secrets: false,
        spec_hash: "test".into(),
    }
}

/// What one filesystem entry looks like, for before/after comparisons.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub kind: &'static str,
    pub content: Vec<u8>,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Every entry below `root` (never following symlinks), by relative path.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Snapshot> {
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

/// Whether the current process is root (the owner of `/proc/self`).
pub fn running_as_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}
