//! `ckpt-core`: the pure domain model of pod-checkpointer. No I/O, no async.
//!
//! - [`identity`]: [`PodId`], the annotations, what is a parent, a checkpoint, the agent
//!   itself ([`SelfIdentity`], and [`LockIdentity`] as the lock holder) and a controller
//!   owner ([`ControllerOwner`]); what a Kubernetes name may be ([`is_dns_label`],
//!   [`is_dns_subdomain`]).
//! - [`checkpoint`]: a [`Checkpoint`] as a value: the static-pod manifest and the
//!   [`MaterializedDir`]s it mounts.
//! - [`gc`]: what a GC strategy is asked ([`Orphan`]) and answers ([`GcDecision`]).
//! - [`time`]: [`Timestamp`], the planner's clock.
//! - [`error_chain`]: an error and its causes on one line, as every crate here logs them.
//!
//! ```
//! use ckpt_core::PodId;
//!
//! let id = PodId::new("kube-system", "kube-apiserver-abc");
//! assert_eq!(id.manifest_file_name(), "kube-system_kube-apiserver-abc.json");
//! ```

pub mod checkpoint;
mod error;
pub mod gc;
pub mod identity;
pub mod plan;
pub mod references;
pub mod sanitize;
pub mod time;

#[doc(inline)]
pub use checkpoint::{
    Checkpoint, CheckpointMeta, DataDir, DataFile, DataKind, FileOwner, MaterializedDir, manifest_bytes,
    sha256_hex,
};
#[doc(inline)]
pub use error::{Error, Result, error_chain};
#[doc(inline)]
pub use gc::{GcDecision, GcVerdict, Orphan};
#[doc(inline)]
pub use identity::{
    ControllerOwner, LockIdentity, NamespaceAllowList, PodId, SelfIdentity, is_checkpoint, is_dns_label,
    is_dns_subdomain, is_parent,
};
#[doc(inline)]
pub use plan::{
    ApiParent, ApiView, CheckpointState, DiskCheckpoint, LocalView, PersistentState, Plan, PlanInputs,
    Removal, RemovalReason, StoredCopy, orphans, plan,
};
#[doc(inline)]
pub use references::{RequiredObjects, references_api_objects, required_objects};
#[doc(inline)]
pub use sanitize::{ApiObjects, SanitizeOptions, Sanitized, sanitize};
#[doc(inline)]
pub use time::Timestamp;

/// The README's example, compiled and run with the doctests so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExample;
