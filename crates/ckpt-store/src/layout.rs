//! Where everything lives on disk (ARCHITECTURE.md, Identity and layout; the defaults are bootkube's).

use std::path::{Path, PathBuf};

use ckpt_core::{DataDir, DataKind, PodId};

/// The on-disk layout, from `--checkpoint-dir` and `--manifests-dir`:
///
/// ```text
/// <manifests-dir>/<ns>_<pod>.json                     active checkpoints (kubelet static pods)
/// <checkpoint-dir>/inactive-manifests/<ns>_<pod>.json inactive checkpoints
/// <checkpoint-dir>/checkpoint-secrets/<ns>/<pod>/<secret>/<key>         data (see below)
/// <checkpoint-dir>/checkpoint-configmaps/<ns>/<pod>/<configmap>/<key>
/// <checkpoint-dir>/checkpoint-projected/<ns>/<pod>/<volume>/<path>
/// <checkpoint-dir>/pod-checkpointer/state.json       the state journal (dir 0700)
/// <checkpoint-dir>/pod-checkpointer/kubeconfig       API credentials for the agent's static copy
/// <checkpoint-dir>/pod-checkpointer/token            … and the token that kubeconfig reads
/// <checkpoint-dir>/checkpoint-quarantine/             files we could not read, kept for a human
/// ```
///
/// Each data root (`checkpoint-*`) and the namespace and pod directories below it are
/// root-only (0700): host users cannot reach the data. A volume directory (the hostPath
/// a checkpoint mounts, read-only) is 0755 and laid out as the kubelet lays out a secret
/// volume, one version at a time:
///
/// ```text
/// <volume>/..<timestamp>.<unique>/<key>   the files, with the pod's modes and owner
/// <volume>/..data -> ..<timestamp>.<unique>
/// <volume>/<key> -> ..data/<key>          one link per top-level name
/// ```
///
/// The two configured directories are trusted as given (either may be a symlink an
/// operator set up); nothing below them is ever followed through a symlink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    checkpoint_dir: PathBuf,
    manifests_dir: PathBuf,
}

impl Default for Layout {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CHECKPOINT_DIR, Self::DEFAULT_MANIFESTS_DIR)
    }
}

impl Layout {
    /// Default `--checkpoint-dir`.
    pub const DEFAULT_CHECKPOINT_DIR: &'static str = "/etc/kubernetes";
    /// Default `--manifests-dir` (the kubelet's static pod directory).
    pub const DEFAULT_MANIFESTS_DIR: &'static str = "/etc/kubernetes/manifests";
    /// Inactive checkpoints, under the checkpoint dir.
    pub const INACTIVE_DIR_NAME: &'static str = "inactive-manifests";
    /// Below each data root, where the previous layout staged data files; removed by
    /// [`crate::Store::open`].
    pub(crate) const STAGING_DIR_NAME: &'static str = ".staging";
    /// In each volume directory, the link to its current version (the kubelet's name).
    pub const DATA_LINK_NAME: &'static str = "..data";
    /// Unreadable files moved aside, under the checkpoint dir.
    pub const QUARANTINE_DIR_NAME: &'static str = "checkpoint-quarantine";
    /// The agent's own files (the journal, the kept credentials), under the checkpoint dir:
    /// a directory, so a pod can mount it without all of the checkpoint dir (root-only,
    /// 0700).
    pub const AGENT_DIR_NAME: &'static str = "pod-checkpointer";
    /// The state journal, in the agent's dir.
    pub const JOURNAL_FILE_NAME: &'static str = "state.json";
    /// The kubeconfig the agent keeps for its own static copy, in the agent's dir.
    pub const CREDENTIALS_FILE_NAME: &'static str = "kubeconfig";
    /// The bearer token that kubeconfig names as its `tokenFile`, in the agent's dir.
    pub const CREDENTIALS_TOKEN_FILE_NAME: &'static str = "token";
    /// Where earlier versions kept the journal and the credentials: directly in the
    /// checkpoint dir. Read (journal) and removed (all) on the way to the agent's dir.
    pub(crate) const LEGACY_FILE_NAMES: [&'static str; 3] = [
        "pod-checkpointer-state.json",
        "pod-checkpointer-kubeconfig",
        "pod-checkpointer-token",
    ];

    /// A layout from the two configured directories.
    pub fn new(checkpoint_dir: impl Into<PathBuf>, manifests_dir: impl Into<PathBuf>) -> Self {
        Self {
            checkpoint_dir: checkpoint_dir.into(),
            manifests_dir: manifests_dir.into(),
        }
    }

    /// `--checkpoint-dir`.
    pub fn checkpoint_dir(&self) -> &Path {
        &self.checkpoint_dir
    }

    /// `--manifests-dir`: where active checkpoints go.
    pub fn manifests_dir(&self) -> &Path {
        &self.manifests_dir
    }

    /// Where inactive checkpoints go.
    pub fn inactive_dir(&self) -> PathBuf {
        self.checkpoint_dir.join(Self::INACTIVE_DIR_NAME)
    }

    /// Where unreadable files are moved.
    pub fn quarantine_dir(&self) -> PathBuf {
        self.checkpoint_dir.join(Self::QUARANTINE_DIR_NAME)
    }

    /// The agent's own dir (journal, kept credentials).
    pub fn agent_dir(&self) -> PathBuf {
        self.checkpoint_dir.join(Self::AGENT_DIR_NAME)
    }

    /// The state journal.
    pub fn journal_path(&self) -> PathBuf {
        self.agent_dir().join(Self::JOURNAL_FILE_NAME)
    }

    /// The kubeconfig kept for the agent's static copy (see [`crate::Store::write_credentials`]).
    pub fn credentials_path(&self) -> PathBuf {
        self.agent_dir().join(Self::CREDENTIALS_FILE_NAME)
    }

    /// The token file the kept kubeconfig reads (kube clients re-read it every minute, so
    /// a running static copy picks up every refresh).
    pub fn credentials_token_path(&self) -> PathBuf {
        self.agent_dir().join(Self::CREDENTIALS_TOKEN_FILE_NAME)
    }

    /// The root directory of one kind of materialized data.
    pub fn data_root(&self, kind: DataKind) -> PathBuf {
        self.checkpoint_dir.join(kind.root_dir_name())
    }

    /// All data of one kind for one pod: `<kind root>/<ns>/<pod>`.
    pub fn pod_data_dir(&self, kind: DataKind, id: &PodId) -> PathBuf {
        self.data_root(kind).join(&*id.namespace).join(&*id.name)
    }

    /// One materialized volume directory: the `hostPath` a sanitized manifest mounts.
    pub fn data_dir(&self, dir: &DataDir) -> PathBuf {
        self.checkpoint_dir.join(dir.relative_path())
    }

    /// The inactive checkpoint file of a pod, under our (collision-free) name.
    pub fn inactive_manifest_path(&self, id: &PodId) -> PathBuf {
        self.inactive_dir().join(id.manifest_file_name())
    }

    /// The active checkpoint file of a pod, under our name. A checkpoint adopted from
    /// bootkube may be active under its legacy name instead; see
    /// [`crate::StoredManifest::path`].
    pub fn active_manifest_path(&self, id: &PodId) -> PathBuf {
        self.manifests_dir.join(id.manifest_file_name())
    }

    /// Every directory the store owns outright (created 0700, nothing foreign inside).
    pub(crate) fn owned_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.inactive_dir(), self.quarantine_dir()];
        dirs.extend(DataKind::ALL.iter().map(|kind| self.data_root(*kind)));
        dirs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_paths_are_bootkubes() {
        let layout = Layout::default();
        let id = PodId::new("kube-system", "kube-apiserver-x");
        let dir = DataDir {
            kind: DataKind::Secret,
            namespace: id.namespace.to_string(),
            pod: id.name.to_string(),
            name: "tls".into(),
        };
        let cases: &[(PathBuf, &str)] = &[
            (layout.inactive_dir(), "/etc/kubernetes/inactive-manifests"),
            (layout.manifests_dir().to_path_buf(), "/etc/kubernetes/manifests"),
            (
                layout.journal_path(),
                "/etc/kubernetes/pod-checkpointer/state.json",
            ),
            (layout.quarantine_dir(), "/etc/kubernetes/checkpoint-quarantine"),
            (
                layout.data_root(DataKind::ConfigMap),
                "/etc/kubernetes/checkpoint-configmaps",
            ),
            (
                layout.pod_data_dir(DataKind::Projected, &id),
                "/etc/kubernetes/checkpoint-projected/kube-system/kube-apiserver-x",
            ),
            (
                layout.data_dir(&dir),
                "/etc/kubernetes/checkpoint-secrets/kube-system/kube-apiserver-x/tls",
            ),
            (
                layout.inactive_manifest_path(&id),
                "/etc/kubernetes/inactive-manifests/kube-system_kube-apiserver-x.json",
            ),
            (
                layout.active_manifest_path(&id),
                "/etc/kubernetes/manifests/kube-system_kube-apiserver-x.json",
            ),
        ];
        for (got, expected) in cases {
            assert_eq!(got, Path::new(expected));
        }
        assert_eq!(layout.owned_dirs().len(), 5);
    }
}
