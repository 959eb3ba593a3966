//! The strategy interface: what a policy is asked, and what it may look up while deciding.

use std::fmt;

use async_trait::async_trait;
use ckpt_core::{ControllerOwner, GcDecision, Orphan, PodId, Timestamp};

/// A garbage-collection strategy: decides what happens to a checkpoint whose parent is
/// absent from a successful, synced API view.
///
/// The agent asks again on every pass for as long as the parent stays absent, and stops
/// asking once it is back; it persists [`Orphan::absent_since`] in its state journal, so a
/// deadline computed from it survives restarts. The planner, not the policy, compares a
/// [`RemoveAt`](ckpt_core::GcVerdict::RemoveAt) deadline with the clock
/// (`now >= deadline` removes).
///
/// The agent's own checkpoint ([`Orphan::is_self`]) goes through the same policy: the
/// strategy decides when self-GC happens. A rolling update of the agent's own DaemonSet
/// never reaches a policy; the agent follows it by rewriting its static copy.
///
/// Deciding is infallible on purpose: the planner needs exactly one verdict per orphan, and
/// a lookup that failed must never remove anything. [`GcContext`] already reports a failed
/// lookup as [`OwnerStatus::Unknown`]; a policy that hits a failure of its own answers
/// [`Keep`](ckpt_core::GcVerdict::Keep) (or a deadline it would also have set without the
/// failing lookup), with the failure in the reason. There is no error branch for a caller
/// to get wrong.
///
/// `Debug` is required so the agent can log which policy (and settings) it runs.
#[async_trait]
pub trait GcPolicy: fmt::Debug + Send + Sync {
    /// The verdict on one orphaned checkpoint, with a short reason for logs and Events.
    async fn decide(&self, orphan: &Orphan, ctx: &dyn GcContext) -> GcDecision;
}

/// What a policy may look up while deciding; the agent implements it over its synced API
/// view, the API client and the checkpoint store. [`StaticContext`](crate::StaticContext)
/// is an in-memory implementation for tests.
///
/// Configuration (the grace period, a strategy's settings) is not here: a policy receives it
/// once, when it is built (see [`StrategyConfig`](crate::StrategyConfig)). The context only
/// answers questions about the world.
#[async_trait]
pub trait GcContext: Send + Sync {
    /// The time of this pass (the same for every orphan of a pass).
    fn now(&self) -> Timestamp;

    /// Whether the controller `owner` exists in `namespace`, matched by kind and name as in
    /// [`ControllerOwner::same_controller`] (a controller re-created under the same name
    /// manages the same workload). A definite "not found" is [`OwnerStatus::Absent`]; any
    /// other failure (timeout, 403, 5xx, a kind the agent cannot look up) is
    /// [`OwnerStatus::Unknown`]. Implementations bound the request with a timeout.
    async fn owner_status(&self, namespace: &str, owner: &ControllerOwner) -> OwnerStatus;

    /// The parents scheduled to this node in the current synced API view whose controller is
    /// `owner` (by [`ControllerOwner::same_controller`]), each with whether its checkpoint is
    /// already written. Only pods the agent will checkpoint count (annotated, in an allowed
    /// namespace, representable as a static pod); otherwise a pod that can never be
    /// checkpointed would hold an old checkpoint forever.
    async fn siblings(&self, namespace: &str, owner: &ControllerOwner) -> Vec<Sibling>;
}

/// The outcome of looking up a controller owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OwnerStatus {
    /// The owner exists.
    Present,
    /// The API server said it does not exist (404).
    Absent,
    /// The lookup failed; nothing is known. Never a reason to remove anything early.
    Unknown,
}

/// A pod on this node with the same controller as an orphan's parent.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sibling {
    /// The pod.
    pub id: PodId,
    /// Whether its checkpoint has been written to disk.
    pub checkpointed: bool,
}

impl Sibling {
    /// A sibling pod and whether it is checkpointed.
    pub fn new(id: PodId, checkpointed: bool) -> Self {
        Self { id, checkpointed }
    }
}
