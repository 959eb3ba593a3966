//! What the planner needs from a garbage-collection strategy, and what it tells one.
//!
//! Strategies themselves live in `ckpt-gc`; the planner only consumes their verdicts,
//! so it stays a pure function.

use serde::{Deserialize, Serialize};

use crate::identity::{ControllerOwner, PodId};
use crate::observation::OwnerStatus;
use crate::time::Timestamp;

/// A checkpoint whose parent is absent from a successful, synced API view: the question
/// a GC strategy answers, with every fact it may decide on (gathered before deciding:
/// a strategy never calls back into the agent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    /// The (absent) parent's id.
    pub id: PodId,
    /// The parent's UID, if recorded in the checkpoint.
    pub parent_uid: Option<String>,
    /// The parent's controller owner, if recorded in the checkpoint.
    pub owner: Option<ControllerOwner>,
    /// Whether this is the agent's own checkpoint (removing it is self-GC).
    pub is_self: bool,
    /// Since when the parent has been continuously absent from synced views (persisted
    /// in the state journal, so restarts do not reset it).
    pub absent_since: Timestamp,
    /// Whether `owner` exists, when the strategy asked for it
    /// ([`OwnerStatus::Unknown`] when not looked up, the lookup failed, or no owner).
    pub owner_status: OwnerStatus,
    /// The parents on this node in the synced view whose controller is `owner` (by
    /// [`ControllerOwner::same_controller`]), sorted, the orphan itself left out. Only pods
    /// the agent will checkpoint count (annotated, allowed namespace, representable);
    /// otherwise a pod that can never be checkpointed would hold an old checkpoint forever.
    pub siblings: Vec<Sibling>,
}

impl Orphan {
    /// An orphan with no owner facts (no siblings, owner status unknown).
    pub fn new(id: PodId, absent_since: Timestamp) -> Self {
        Self {
            id,
            parent_uid: None,
            owner: None,
            is_self: false,
            absent_since,
            owner_status: OwnerStatus::Unknown,
            siblings: Vec::new(),
        }
    }
}

/// A pod on this node with the same controller as an orphan's parent.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sibling {
    /// The pod.
    pub id: PodId,
    /// Whether its current content is checkpointed on disk.
    pub checkpointed: bool,
}

/// A strategy's verdict on an [`Orphan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GcVerdict {
    /// Keep the checkpoint.
    Keep,
    /// Remove it in this pass.
    RemoveNow,
    /// Remove it once the clock reaches this time (`now >= deadline`).
    RemoveAt(Timestamp),
}

/// A verdict with the reason, for logs, metrics and Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcDecision {
    /// What to do.
    pub verdict: GcVerdict,
    /// Why, in a few words (`"parent deleted"`, `"superseded by kube-system/x"`).
    pub reason: String,
}

impl GcDecision {
    /// A decision with its reason.
    pub fn new(verdict: GcVerdict, reason: impl Into<String>) -> Self {
        Self {
            verdict,
            reason: reason.into(),
        }
    }
}
