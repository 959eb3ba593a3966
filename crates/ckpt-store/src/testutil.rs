//! Test fixtures: checkpoints as ckpt-core's sanitizer would make them.

use std::collections::BTreeMap;

use ckpt_core::ANNOTATION_CHECKPOINT_OF;
use ckpt_core::{Checkpoint, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, PodId};
use k8s_openapi::api::core::v1::{Pod, PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{Layout, Store};

/// A writable store in a fresh temp dir.
pub(crate) fn store() -> (tempfile::TempDir, Store) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(tmp.path().join("k8s"), tmp.path().join("k8s/manifests"));
    let store = Store::open(layout).expect("open");
    (tmp, store)
}

/// A checkpoint manifest of `id` (with `version` in an annotation so content can change).
pub(crate) fn manifest(id: &PodId, version: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(id.name.to_string()),
            namespace: Some(id.namespace.to_string()),
            annotations: Some(BTreeMap::from([
                (ANNOTATION_CHECKPOINT_OF.to_owned(), id.name.to_string()),
                ("test/version".to_owned(), version.to_owned()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        ..Default::default()
    }
}

/// One data directory: kind, name, files as (path, content, mode).
pub(crate) type DirSpec<'a> = (DataKind, &'a str, &'a [(&'a str, &'a str, u32)]);

/// A checkpoint of `id` with these data dirs; the manifest mounts each as a hostPath.
pub(crate) fn checkpoint(layout: &Layout, id: &PodId, version: &str, dirs: &[DirSpec<'_>]) -> Checkpoint {
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
                    path: (*path).to_owned(),
                    bytes: bytes.as_bytes().to_vec(),
                    mode: *mode,
                })
                .collect(),
        })
        .collect();
    let mut manifest = manifest(id, version);
    let volumes = dirs
        .iter()
        .map(|d| Volume {
            name: format!("{}-{}", d.dir.kind.root_dir_name(), d.dir.name),
            host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                path: layout.data_dir(&d.dir).display().to_string(),
                type_: None,
            }),
            ..Default::default()
        })
        .collect();
    if let Some(spec) = manifest.spec.as_mut() {
        spec.volumes = Some(volumes);
    }
    Checkpoint {
        parent: id.clone(),
        manifest,
        dirs,
        owner: FileOwner::default(),
        manifest_holds_secrets: false,
        spec_hash: format!("hash-{version}"),
    }
}

/// The immutable attribute (`chattr +i`) on a path while this lives: even root can then
/// neither remove the entry nor change what is in it, which is how tests make a removal
/// fail for real.
pub(crate) struct Immutable(std::path::PathBuf);

impl Immutable {
    pub(crate) fn set(path: &std::path::Path) -> Immutable {
        chattr("+i", path);
        Immutable(path.to_owned())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        chattr("-i", &self.0);
    }
}

fn chattr(flag: &str, path: &std::path::Path) {
    let status = std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .expect("chattr (e2fsprogs) runs");
    assert!(status.success(), "chattr {flag} {}: {status}", path.display());
}
