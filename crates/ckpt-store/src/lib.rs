//! `ckpt-store`: crash-safe on-disk storage of pod checkpoints.
//!
//! The store keeps, under a [`Layout`] (`--checkpoint-dir`, `--manifests-dir`):
//! inactive checkpoint manifests, active ones (in the kubelet's static pod directory),
//! the Secret/ConfigMap/projected data they mount, and a state journal. Main types:
//!
//! - [`Layout`]: where everything lives (bootkube's paths by default).
//! - [`Store`]: [`Store::read_all`] → [`StoredCheckpoint`]s, [`Store::write_inactive`],
//!   [`Store::activate`], [`Store::deactivate`], [`Store::remove`],
//!   [`Store::read_journal`]/[`Store::write_journal`].
//! - [`Store::write_credentials`]: the kubeconfig kept for the agent's static copy.
//! - [`Error`]: one error type; a full disk or read-only filesystem is
//!   [`Error::NoSpace`]/[`Error::ReadOnlyFilesystem`] and leaves the previous file intact.
//!
//! Guarantees:
//!
//! - Every file is written atomically: a dot-prefixed temp file in the same directory
//!   (the kubelet ignores dotfiles) → write → chmod/chown → fsync → rename → fsync the
//!   directory. A file already holding the same bytes, mode and owner is not rewritten.
//! - Nothing below the two configured directories is ever followed through a symlink:
//!   all operations are relative to directory handles opened with `O_NOFOLLOW`
//!   (volume directories of the previous layout belong to the pod's uid, which could
//!   otherwise race us).
//! - A pod sees one version of a volume at a time: volume directories are laid out as
//!   the kubelet's AtomicWriter lays them out (a version directory, a `..data` link
//!   switched by one `rename`, keys as links `<key> -> ..data/<key>`; see [`Layout`]).
//!   Plain files of the previous layout and of bootkube are replaced in place.
//! - Names that become paths are validated as Kubernetes names; data paths cannot
//!   escape their directory.
//! - Files in the manifests dir that are not our checkpoints are never touched; an
//!   unreadable file in our own inactive dir is moved to a quarantine dir, never
//!   deleted silently. Checkpoints left by bootkube (`<ns>-<name>.json`) are adopted.
//! - Our directories are 0700, and so are the data roots and the namespace and pod
//!   directories below them (the root-only ancestors that keep host users out); volume
//!   directories and everything directory-like in them are 0755 and ours; data files
//!   have the checkpoint's modes and owner; manifests are 0644 (0600 when they hold
//!   secret values).
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use ckpt_core::ANNOTATION_CHECKPOINT_OF;
//! use ckpt_core::{Checkpoint, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, PodId};
//! use ckpt_store::{Layout, Store};
//! use k8s_openapi::api::core::v1::Pod;
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tmp = tempfile::tempdir()?;
//! let layout = Layout::new(tmp.path().join("kubernetes"), tmp.path().join("kubernetes/manifests"));
//! let store = Store::open(layout)?;
//!
//! // A checkpoint as ckpt-core's sanitizer makes it.
//! let id = PodId::new("kube-system", "kube-apiserver-x7k2p");
//! let manifest = Pod {
//!     metadata: ObjectMeta {
//!         name: Some(id.name.to_string()),
//!         namespace: Some(id.namespace.to_string()),
//!         annotations: Some(BTreeMap::from([(ANNOTATION_CHECKPOINT_OF.into(), id.name.to_string())])),
//!         ..Default::default()
//!     },
//!     ..Default::default()
//! };
//! let tls = MaterializedDir {
//!     dir: DataDir { kind: DataKind::Secret, namespace: id.namespace.to_string(), pod: id.name.to_string(), name: "tls".into() },
//!     files: vec![DataFile { path: "tls.key".into(), bytes: b"secret".to_vec(), mode: 0o600 }],
//! };
//! let checkpoint = Checkpoint {
//!     parent: id.clone(),
//!     manifest,
//!     dirs: vec![tls],
//!     owner: FileOwner::default(),
//!     manifest_holds_secrets: false,
//!     spec_hash: "example".into(),
//! };
//!
//! assert!(store.write_inactive(&checkpoint)?.changed());
//! assert!(!store.write_inactive(&checkpoint)?.changed(), "unchanged: nothing written");
//! assert!(store.activate(&id)?);
//!
//! let on_disk = store.read_all()?;
//! assert!(on_disk[&id].active_matches_inactive());
//! let key = store.layout().data_dir(&checkpoint.dirs[0].dir).join("tls.key");
//! assert_eq!(std::fs::read(key)?, b"secret");
//!
//! store.remove(&id)?; // data, inactive, then active last
//! assert!(store.read_all()?.is_empty());
//! # Ok(())
//! # }
//! ```

mod credentials;
mod error;
pub mod failpoint;
mod fsops;
mod journal;
mod layout;
mod names;
mod store;
#[cfg(test)]
mod testutil;
// The fixtures in `testutil` name the crate as the integration tests that share them do.
#[cfg(test)]
extern crate self as ckpt_store;

pub use credentials::KeptCredentials;
pub use error::{Error, Result};
pub use journal::{JOURNAL_FORMAT_VERSION, LoadedJournal};
pub use layout::Layout;
pub use store::Store;
pub use store::scan::{ReadBack, StoredCheckpoint, StoredManifest};
pub use store::summary::{RemoveSummary, WriteSummary};

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
