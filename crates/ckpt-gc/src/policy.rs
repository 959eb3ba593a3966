//! The strategy interface: what a policy is asked, and the facts it decides on.

use std::fmt;

use async_trait::async_trait;
use ckpt_core::{GcDecision, Orphan, Timestamp};

/// A garbage-collection strategy: decides what happens to a checkpoint whose parent is
/// absent from a successful, synced API view.
///
/// The agent asks again on every pass for as long as the parent stays absent, and stops
/// asking once it is back; it persists [`Orphan::absent_since`] in its state journal, so a
/// deadline computed from it survives restarts. The planner, not the policy, compares a
/// [`RemoveAt`](ckpt_core::GcVerdict::RemoveAt) deadline with the clock
/// (`now >= deadline` removes).
///
/// The agent's own checkpoint ([`Orphan::is_self`]) is asked about too, but its verdict does
/// not decide self-GC: only a successful read saying the agent's own DaemonSet is deleted or
/// no longer targets the node does, the grace period after the first such read, whatever
/// the strategy (issue 36: only positive evidence removes). A rolling update of the agent's
/// own DaemonSet never reaches a policy; the agent follows it by rewriting its static copy.
///
/// Deciding is infallible on purpose: the planner needs exactly one verdict per orphan, and
/// a lookup that failed must never remove anything. The agent reports a failed owner
/// lookup as [`OwnerStatus::Unknown`](ckpt_core::OwnerStatus::Unknown); a policy that hits a failure of its own answers
/// [`Keep`](ckpt_core::GcVerdict::Keep) (or a deadline it would also have set without the
/// failing lookup), with the failure in the reason. There is no error branch for a caller
/// to get wrong.
///
/// `Debug` is required so the agent can log which policy (and settings) it runs.
#[async_trait]
pub trait GcPolicy: fmt::Debug + Send + Sync {
    /// The verdict on one orphaned checkpoint at `now` (the same for every orphan of a
    /// pass), with a short reason for logs and Events. Everything known about the orphan
    /// is in it: its owner, siblings on this node, and — if [`GcPolicy::needs_owner_status`]
    /// — whether its owner exists, all gathered before the agent asks.
    async fn decide(&self, orphan: &Orphan, now: Timestamp) -> GcDecision;

    /// Whether the agent must look up the orphans' controller owners before deciding
    /// (one `GET` per owner per pass while orphans exist), filling
    /// [`Orphan::owner_status`]. Without it the status is
    /// [`OwnerStatus::Unknown`](ckpt_core::OwnerStatus::Unknown).
    fn needs_owner_status(&self) -> bool {
        false
    }
}
