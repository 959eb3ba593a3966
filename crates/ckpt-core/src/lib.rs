//! `ckpt-core`: the pure domain model of pod-checkpointer. No I/O, no async.
//!
//! - [`identity`]: [`PodId`], the annotations, what is a parent, a checkpoint, the agent
//!   itself ([`SelfIdentity`], and [`LockIdentity`] as the lock holder) and a controller
//!   owner ([`ControllerOwner`]); what a Kubernetes name may be ([`is_dns_label`],
//!   [`is_dns_subdomain`]).
//! - [`admission`](mod@admission): whether the node's kubelet would run a checkpoint as a
//!   static pod ([`admit`], for a [`KubeletVersion`]), checked before it is written, and
//!   the fields that kubelet drops ([`dropped_fields`]).
//! - [`known_good`](mod@known_good): which content each parent has proven (Ready for a
//!   minute with it), kept in the journal.
//! - [`revisions`]: a DaemonSet's checkpoints on this node as revisions of one lineage,
//!   which one an activation runs, which ones are kept, and the health-gated handoff from a
//!   known-good checkpoint to a parent with unproven content.
//! - [`checkpoint`]: a [`Checkpoint`] as a value: the static-pod manifest and the
//!   [`MaterializedDir`]s it mounts.
//! - [`observation`]: what the agent observed for a pass ([`Observation`]), produced by
//!   `ckpt-watch`.
//! - [`decide`](mod@decide): one pass's decision as a pure function: [`assess`] finds the
//!   parents, sanitizes them and finds the [`Orphan`]s; the GC strategy's verdicts go into
//!   [`Assessment::decide`], which returns a [`Decision`] (what to write, stop, start and
//!   remove, the state to persist, a [`Report`]). [`plan`](mod@plan) is the planner under it.
//! - [`gc`]: what a GC strategy is asked ([`Orphan`], with its facts) and answers
//!   ([`GcDecision`]).
//! - [`time`]: [`Timestamp`], the planner's clock.
//! - [`error_chain`]: an error and its causes on one line, as every crate here logs them.
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

pub mod admission;
pub mod checkpoint;
pub mod decide;
mod error;
pub mod gc;
pub mod identity;
pub mod known_good;
pub mod observation;
pub mod plan;
pub mod references;
pub mod revisions;
pub mod sanitize;
pub mod scheduling;
pub mod time;

#[doc(inline)]
pub use admission::{Inadmissible, KubeletVersion, admit, dropped_fields};
#[doc(inline)]
pub use checkpoint::{
    Checkpoint, CheckpointMeta, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, manifest_bytes,
    sha256_hex,
};
#[doc(inline)]
pub use decide::{
    Assessment, DecideConfig, Decision, Refusal, Report, assess, daemon_set_lookups, decide, has_completed,
    orphan_owners, required_by_namespace, scheduling_lookup,
};
#[doc(inline)]
pub use error::{Error, Result, error_chain};
#[doc(inline)]
pub use gc::{GcDecision, GcVerdict, Orphan, Sibling};
#[doc(inline)]
pub use identity::{
    ControllerOwner, LockIdentity, NamespaceAllowList, PodId, SelfIdentity, is_checkpoint, is_dns_label,
    is_dns_subdomain, is_parent,
};
#[doc(inline)]
pub use observation::{
    ApiState, Fetched, ObjectKind, ObjectRef, ObjectsView, Observation, OwnerKey, OwnerStatus,
};
#[doc(inline)]
pub use plan::{
    ApiParent, ApiView, CheckpointState, DiskCheckpoint, LocalView, PersistentState, Plan, PlanInputs,
    Removal, RemovalReason, SelfScheduling, StoredCopy, orphans, plan,
};
#[doc(inline)]
pub use references::{
    MAX_OBJECTS_PER_POD, MAX_WATCHED_OBJECTS, RequiredObjects, over_watch_budget, references_api_objects,
    required_objects,
};
#[doc(inline)]
pub use sanitize::{ApiObjects, SanitizeOptions, Sanitized, sanitize};
#[doc(inline)]
pub use scheduling::daemon_pod_continues_running;
#[doc(inline)]
pub use time::Timestamp;

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
