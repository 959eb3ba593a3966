//! A checkpoint as a value: the static-pod manifest plus the files it needs on disk.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::identity::{
    ANNOTATION_CHECKPOINT_OF, ANNOTATION_CHECKPOINTED_AT, ANNOTATION_OWNER, ANNOTATION_PARENT_UID,
    ANNOTATION_SPEC_HASH, ControllerOwner, PodId, retires_when_ready, template_generation,
};
use crate::time::Timestamp;

/// What a materialized data directory holds; each kind has its own root under the
/// checkpoint directory (bootkube's two, plus one for projected volumes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DataKind {
    /// A Secret volume: `checkpoint-secrets/`.
    Secret,
    /// A ConfigMap volume: `checkpoint-configmaps/`.
    ConfigMap,
    /// A projected volume (secret, configMap and downwardAPI sources): `checkpoint-projected/`.
    Projected,
}

impl DataKind {
    /// All kinds, in the order a removal deletes them.
    pub const ALL: [DataKind; 3] = [DataKind::Secret, DataKind::ConfigMap, DataKind::Projected];

    /// The directory under `--checkpoint-dir` that holds this kind.
    pub const fn root_dir_name(self) -> &'static str {
        match self {
            DataKind::Secret => "checkpoint-secrets",
            DataKind::ConfigMap => "checkpoint-configmaps",
            DataKind::Projected => "checkpoint-projected",
        }
    }
}

/// One materialized volume directory:
/// `<checkpoint-dir>/<kind root>/<namespace>/<pod>/<name>/`.
///
/// `name` is the Secret or ConfigMap name (bootkube's layout) or, for projected
/// volumes, the volume name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DataDir {
    /// Which root it lives under.
    pub kind: DataKind,
    /// The parent pod's namespace.
    pub namespace: String,
    /// The parent pod's name.
    pub pod: String,
    /// The Secret/ConfigMap name, or the projected volume's name.
    pub name: String,
}

impl DataDir {
    /// The path relative to `--checkpoint-dir`.
    pub fn relative_path(&self) -> PathBuf {
        [self.kind.root_dir_name(), &self.namespace, &self.pod, &self.name]
            .iter()
            .collect()
    }
}

/// One file inside a [`DataDir`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DataFile {
    /// Path relative to the directory; `items[].path` may contain `/` (never `..`).
    pub path: String,
    /// The content.
    pub bytes: Vec<u8>,
    /// Permission bits, as the kubelet would set them (`defaultMode`/`items[].mode`).
    pub mode: u32,
}

/// A directory and its complete content: keys not listed here are stale and removed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MaterializedDir {
    /// Where it goes.
    pub dir: DataDir,
    /// What it holds, sorted by path.
    pub files: Vec<DataFile>,
}

/// Owner of the materialized files and directories (the pod's `runAsUser`/`fsGroup`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileOwner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// A sanitized checkpoint, ready to be written: made by [`sanitize`](crate::sanitize()).
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The parent it was made from.
    pub parent: PodId,
    /// The static-pod manifest, with our annotations.
    pub manifest: Pod,
    /// The volume data it mounts, sorted.
    pub dirs: Vec<MaterializedDir>,
    /// Owner of `dirs` and their files.
    pub owner: FileOwner,
    /// The manifest itself holds secret values (resolved env), so it must be mode 0600.
    pub manifest_holds_secrets: bool,
    /// Hash of everything above except the checkpoint time: equal hashes, nothing to write.
    pub spec_hash: String,
}

impl Checkpoint {
    /// The manifest as bootkube wrote it: compact JSON of a `v1` Pod and a newline.
    /// Deterministic: the same checkpoint gives the same bytes.
    pub fn manifest_bytes(&self) -> Vec<u8> {
        manifest_bytes(&self.manifest)
    }

    /// Permission bits for the manifest file.
    pub fn manifest_mode(&self) -> u32 {
        if self.manifest_holds_secrets { 0o600 } else { 0o644 }
    }
}

/// Serializes a pod the way checkpoints are stored: compact JSON ending in a newline,
/// `kind`/`apiVersion` first. k8s-openapi serializes struct fields in a fixed order and
/// maps as `BTreeMap`s, so the bytes are a function of the value.
pub fn manifest_bytes(pod: &Pod) -> Vec<u8> {
    // Serializing a Pod to a Vec cannot fail: it has only string keys and no custom
    // serializers that error, so the fallback is unreachable in practice.
    let mut bytes = serde_json::to_vec(pod).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// A lowercase hex SHA-256 digest of some bytes (content digests and spec hashes).
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// What a checkpoint manifest on disk says about itself, from its annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMeta {
    /// The parent's id (the manifest's namespace and name).
    pub parent: PodId,
    /// The parent's UID, if recorded (bootkube's checkpoints only have it in the owner ref).
    pub parent_uid: Option<String>,
    /// The parent's controller owner, if recorded.
    pub owner: Option<ControllerOwner>,
    /// The spec hash, if written by us.
    pub spec_hash: Option<String>,
    /// The parent's `pod-template-generation` label (a DaemonSet's pods carry it): what
    /// orders a lineage's revisions, before the checkpoint time.
    pub template_generation: Option<i64>,
    /// When the content was checkpointed, if written by us.
    pub checkpointed_at: Option<Timestamp>,
    /// Its parent asked for the checkpoint to stay until it is Ready
    /// (`checkpointer.alpha.coreos.com/handoff: when-ready`).
    pub retires_when_ready: bool,
}

impl CheckpointMeta {
    /// Reads the metadata of a checkpoint manifest; `None` if the pod is not a checkpoint.
    pub fn from_manifest(pod: &Pod) -> Option<Self> {
        let annotations = pod.metadata.annotations.as_ref()?;
        annotations.get(ANNOTATION_CHECKPOINT_OF)?;
        let parent = PodId::of(pod)?;
        let get = |k: &str| annotations.get(k).filter(|v| !v.is_empty()).cloned();
        let parent_uid = get(ANNOTATION_PARENT_UID).or_else(|| {
            // bootkube recorded the parent only as the single owner reference.
            let refs = pod.metadata.owner_references.as_ref()?;
            refs.iter().find(|r| r.kind == "Pod").map(|r| r.uid.clone())
        });
        Some(Self {
            parent,
            parent_uid,
            owner: get(ANNOTATION_OWNER).and_then(|v| ControllerOwner::from_annotation(&v)),
            spec_hash: get(ANNOTATION_SPEC_HASH),
            template_generation: template_generation(pod),
            checkpointed_at: get(ANNOTATION_CHECKPOINTED_AT).and_then(|v| Timestamp::parse_rfc3339(&v)),
            retires_when_ready: retires_when_ready(pod),
        })
    }
}
