//! `ckpt-core`: the pure domain model of pod-checkpointer. No I/O, no async. Everything
//! public is at the crate's root, except the revisions' settings and steps
//! ([`revisions`]).
//!
//! One pass of the agent, in the order it runs (ARCHITECTURE.md, The pass):
//! - **What was observed**: an [`Observation`] (`ckpt-watch` makes it: the [`ApiState`],
//!   the pods, the Secrets and ConfigMaps they mount, the [`LocalView`], owner facts), the
//!   checkpoints on disk ([`DiskCheckpoint`], from `ckpt-store`) and the journal
//!   ([`PersistentState`]). Before deciding, the observer asks what to look up:
//!   [`required_by_namespace`], [`orphan_owners`], [`daemon_set_lookups`], and where the
//!   local view must look beyond the allow-list, [`local_namespaces_outside`].
//! - **Deciding**: [`assess`] finds the parents, sanitizes them into [`Checkpoint`]s
//!   ([`sanitize`], then [`admit`]: would this node's kubelet run it, for its
//!   [`KubeletVersion`]) and finds the [`Orphan`]s; the GC strategy's verdicts
//!   ([`GcDecision`]) go into [`Assessment::decide`], which plans the pass and returns a
//!   [`Decision`]: what to write, stop, start and remove ([`Removal`]), the journal to save
//!   (known-good content, [`KNOWN_GOOD_AFTER`], included) and a [`Report`]. A parent's
//!   `Ready` counts only on evidence ([`READY_SETTLE`]). [`decide`] does
//!   both steps for verdicts known in advance.
//! - **Who is who**: [`PodId`], [`is_parent`], the agent itself ([`SelfIdentity`],
//!   [`LockIdentity`] as the lock holder), a [`ControllerOwner`], what a Kubernetes name
//!   may be ([`is_dns_label`], [`is_dns_subdomain`]).
//! - [`Timestamp`], the planner's clock; [`error_chain`], an error and its causes on one
//!   line, as every crate here logs them.
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use ckpt_core::{
//!     DecideConfig, LocalView, NamespaceAllowList, Observation, PersistentState, PodId, SelfIdentity,
//!     Timestamp, decide,
//! };
//!
//! let id = PodId::new("kube-system", "kube-apiserver-abc");
//! assert_eq!(id.manifest_file_name(), "kube-system_kube-apiserver-abc.json");
//!
//! // Offline, with nothing on disk: nothing to do.
//! let observation = Observation::offline(LocalView::Unknown);
//! let config = DecideConfig {
//!     allowed: NamespaceAllowList::new(["kube-system"]),
//!     me: SelfIdentity::new("kube-system", "pod-checkpointer-x7k2p", "node-1"),
//!     checkpoint_dir: "/etc/kubernetes".into(),
//!     grace: std::time::Duration::from_secs(60),
//!     revisions: Default::default(),
//! };
//! let decision = decide(
//!     &observation,
//!     &BTreeMap::new(),
//!     &PersistentState::default(),
//!     &BTreeMap::new(),
//!     &config,
//!     Timestamp::now(),
//! );
//! assert!(decision.is_noop());
//! ```

mod admission;
pub mod backoff;
mod checkpoint;
mod decide;
mod error;
mod gc;
mod identity;
mod journal;
mod known_good;
mod lookups;
mod observation;
mod plan;
mod readiness;
mod references;
pub mod revisions;
mod sanitize;
mod scheduling;
mod time;

pub use admission::{Inadmissible, KubeletVersion, admit, dropped_fields};
pub use checkpoint::{
    Checkpoint, CheckpointMeta, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, manifest_bytes,
    sha256_hex,
};
pub use decide::{Assessment, DecideConfig, Decision, Refusal, Report, assess, decide};
pub use error::{Error, Result, error_chain};
pub use gc::{GcDecision, GcVerdict, Orphan, Sibling};
pub use identity::{
    ANNOTATION_CHECKPOINT, ANNOTATION_CHECKPOINT_OF, ANNOTATION_DECOMMISSION, ControllerOwner, LockIdentity,
    NamespaceAllowList, PodId, SelfCheckpointing, SelfIdentity, is_dns_label, is_dns_subdomain, is_parent,
    self_checkpointing,
};
pub use journal::{ContentSeen, HandoffRecord, PersistentState, RestartsSeen, SpecSince, Suspension};
pub use known_good::{KNOWN_GOOD_AFTER, KUBELET_SYNC_ALLOWANCE};
pub use lookups::{
    daemon_set_lookups, local_namespaces_outside, orphan_owners, required_by_namespace, scheduling_lookup,
};
pub use observation::{
    ApiState, DiskCheckpoint, Fetched, LocalView, ObjectKind, ObjectRef, ObjectsView, Observation, OwnerKey,
    OwnerStatus, SelfScheduling, StoredCopy,
};
pub use plan::{CheckpointState, Removal, RemovalReason};
pub use readiness::{READY_SETTLE, runtime_id};
pub use references::{RequiredObjects, references_api_objects};
pub use sanitize::{ApiObjects, ContentParts, SanitizeOptions, Sanitized, sanitize};
pub use scheduling::daemon_pod_continues_running;
pub use time::Timestamp;

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
