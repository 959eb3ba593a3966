//! The planner's inputs ([`PlanInputs`]), gathered into one [`Row`] per pod id: all of
//! them are sorted by id, so a pass walks them together once.

use std::collections::{BTreeMap, BTreeSet};

use crate::gc::{GcDecision, GcVerdict};
use crate::identity::{NamespaceAllowList, PodId, SelfIdentity};
use crate::journal::PersistentState;
use crate::known_good::ParentContent;
use crate::observation::{ApiParent, ApiView, DiskCheckpoint, LocalView, SelfScheduling};
use crate::revisions::{Lineage, RevisionSettings};
use crate::time::Timestamp;

/// Everything [`plan`](super::plan) looks at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanInputs<'a> {
    /// The API view.
    pub(crate) api: &'a ApiView,
    /// The local view.
    pub(crate) local: &'a LocalView,
    /// Checkpoints on disk.
    pub(crate) disk: &'a BTreeMap<PodId, DiskCheckpoint>,
    /// Spec hash of the sanitized API copy of each parent that could be sanitized.
    pub(crate) desired: &'a BTreeMap<PodId, String>,
    /// The same parents' content by part, with what proves it (known-good tracking).
    pub(crate) contents: &'a BTreeMap<PodId, ParentContent>,
    /// GC verdicts for the [`orphans`](super::orphans), computed by the strategy.
    pub(crate) verdicts: &'a BTreeMap<PodId, GcDecision>,
    /// The persisted state from the previous pass.
    pub(crate) state: &'a PersistentState,
    /// Who the agent is.
    pub(crate) me: &'a SelfIdentity,
    /// Whether the agent's own DaemonSet still targets this node (only looked at on a
    /// synced view without the agent's own pod).
    pub(crate) scheduling: &'a SelfScheduling,
    /// `--checkpoint-grace-period`: self-GC never comes sooner after the agent's own pod
    /// left, nor after the first read saying its DaemonSet is deleted or descheduled.
    pub(crate) grace: std::time::Duration,
    /// `--namespaces`: checkpoints outside it are only wound down.
    pub(crate) allowed: &'a NamespaceAllowList,
    /// The parents Ready on a synced view (empty otherwise): what ends a handoff.
    pub(crate) ready: &'a BTreeSet<PodId>,
    /// The parents being deleted on a synced view (empty otherwise): they get no handoff.
    pub(crate) terminating: &'a BTreeSet<PodId>,
    /// `--revisions` and `--handoff-timeout`.
    pub(crate) revisions: &'a RevisionSettings,
    /// DaemonSet lineages whose DaemonSet (same UID) still targets this node and
    /// checkpoints its pods, or cannot be read (issue 36: a failed read keeps the last
    /// safe state), on a synced view: a pod of theirs being absent is a rollout, an
    /// eviction or a controller outage, so the revisions they keep stay whatever the GC
    /// strategy says (as the agent's own checkpoint does while its DaemonSet targets it).
    pub(crate) live: &'a BTreeSet<Lineage>,
    /// This node's Node carries [`ANNOTATION_DECOMMISSION`](crate::ANNOTATION_DECOMMISSION)
    /// (a successful read): self-GC defers to no serving copy.
    pub(crate) decommissioned: bool,
}

/// Everything the planner knows about one pod id. The inputs are all sorted by id, so
/// rows are gathered with merge walks: a pass is linear in the number of checkpoints,
/// not a tree lookup per question (that made 5,000 checkpoints cost ~25 ms).
pub(super) struct Row<'a> {
    pub(super) id: &'a PodId,
    pub(super) disk: Option<&'a DiskCheckpoint>,
    /// Listed by a synced API view (always `None` unless synced).
    pub(super) parent: Option<&'a ApiParent>,
    pub(super) desired: Option<&'a String>,
    pub(super) verdict: Option<&'a GcDecision>,
    pub(super) runs: Option<bool>,
    pub(super) previous_absent: Option<Timestamp>,
    pub(super) is_self: bool,
    /// In an allowed namespace (the agent's own checkpoint always counts as allowed).
    pub(super) allowed: bool,
}

impl Row<'_> {
    pub(super) fn has_inactive(&self) -> bool {
        self.disk.is_some_and(|d| d.inactive.is_some())
    }

    /// Its parent asks for the checkpoint to stay until it is Ready: as the API lists it,
    /// else as its checkpoint recorded it (which holds while the API is down).
    pub(super) fn retires_when_ready(&self) -> bool {
        match self.parent {
            Some(parent) => parent.retires_when_ready,
            None => (self.disk.and_then(DiskCheckpoint::meta)).is_some_and(|m| m.retires_when_ready),
        }
    }
}

/// A sorted map's entries looked up for ids asked in ascending order: one walk over the
/// map for all lookups, and no vector of the answers.
pub(super) struct Aligned<'a, V, I: Iterator<Item = (&'a PodId, V)>> {
    entries: std::iter::Peekable<I>,
}

impl<'a, V: Copy, I: Iterator<Item = (&'a PodId, V)>> Aligned<'a, V, I> {
    pub(super) fn new(entries: I) -> Self {
        Self {
            entries: entries.peekable(),
        }
    }

    /// The value for `id`; ids must come in ascending order.
    pub(super) fn at(&mut self, id: &PodId) -> Option<V> {
        while let Some((key, value)) = self.entries.peek().copied() {
            match key.cmp(id) {
                std::cmp::Ordering::Less => {
                    self.entries.next();
                }
                std::cmp::Ordering::Equal => {
                    self.entries.next();
                    return Some(value);
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
        None
    }
}

/// One id of the sorted union of the checkpoints on disk, the desired copies and the
/// listed parents, with its entry in each.
pub(super) struct Gathered<'a> {
    pub(super) id: &'a PodId,
    pub(super) disk: Option<&'a DiskCheckpoint>,
    pub(super) desired: Option<&'a String>,
    pub(super) parent: Option<&'a ApiParent>,
}

/// The sorted union of three sorted maps' ids, each with its entries, in one walk: at
/// most two id comparisons per id (comparisons dominate a pass, so no separate union and
/// alignment walks).
pub(super) fn gather<'a>(
    disk: &'a BTreeMap<PodId, DiskCheckpoint>,
    desired: &'a BTreeMap<PodId, String>,
    parents: Option<&'a BTreeMap<PodId, ApiParent>>,
) -> impl Iterator<Item = Gathered<'a>> {
    use std::cmp::Ordering;
    let mut disk = disk.iter().peekable();
    let mut desired = desired.iter().peekable();
    let mut parents = parents.into_iter().flatten().peekable();
    std::iter::from_fn(move || {
        let d = disk.peek().map(|e| e.0);
        let w = desired.peek().map(|e| e.0);
        let p = parents.peek().map(|e| e.0);
        // The smallest id of disk and desired, and which of the two hold it.
        let smallest = match (d, w) {
            (Some(d), Some(w)) => Some(match d.cmp(w) {
                Ordering::Less => (d, true, false),
                Ordering::Equal => (d, true, true),
                Ordering::Greater => (w, false, true),
            }),
            (Some(d), None) => Some((d, true, false)),
            (None, Some(w)) => Some((w, false, true)),
            (None, None) => None,
        };
        // Then the listed parents'.
        let (id, in_d, in_w, in_p) = match (smallest, p) {
            (None, None) => return None,
            (None, Some(p)) => (p, false, false, true),
            (Some((id, in_d, in_w)), None) => (id, in_d, in_w, false),
            (Some((id, in_d, in_w)), Some(p)) => match p.cmp(id) {
                Ordering::Less => (p, false, false, true),
                Ordering::Equal => (id, in_d, in_w, true),
                Ordering::Greater => (id, in_d, in_w, false),
            },
        };
        Some(Gathered {
            id,
            disk: if in_d { disk.next().map(|e| e.1) } else { None },
            desired: if in_w { desired.next().map(|e| e.1) } else { None },
            parent: if in_p { parents.next().map(|e| e.1) } else { None },
        })
    })
}

/// One row per pod id on disk, desired or listed, in id order.
pub(super) fn rows<'a>(inputs: &PlanInputs<'a>) -> Vec<Row<'a>> {
    let parents = match inputs.api {
        ApiView::Synced { parents } => Some(parents),
        _ => None,
    };
    let mut verdicts = Aligned::new(inputs.verdicts.iter());
    let mut previous = Aligned::new(inputs.state.absent_since.iter().map(|(id, t)| (id, *t)));
    let mut running = match inputs.local {
        LocalView::Unknown => None,
        LocalView::Known { running, .. } => Some(Aligned::new(running.iter().map(|id| (id, ())))),
    };
    gather(inputs.disk, inputs.desired, parents)
        .map(|g| Row {
            id: g.id,
            disk: g.disk,
            parent: g.parent,
            desired: g.desired,
            verdict: verdicts.at(g.id),
            runs: running.as_mut().map(|r| r.at(g.id).is_some()),
            previous_absent: previous.at(g.id),
            is_self: is_self(inputs.me, g.id, g.parent, g.disk),
            allowed: inputs.allowed.allows(&g.id.namespace),
        })
        .collect()
}

/// Whether `id` is one of the agent's own pods, by name or by its controller (as listed,
/// else as checkpointed).
pub(super) fn is_self(
    me: &SelfIdentity,
    id: &PodId,
    parent: Option<&ApiParent>,
    disk: Option<&DiskCheckpoint>,
) -> bool {
    let owner = parent
        .and_then(|p| p.owner.as_ref())
        .or_else(|| disk.and_then(DiskCheckpoint::meta).and_then(|m| m.owner.as_ref()));
    me.is_self(id, owner)
}

/// Since when each checkpoint's parent has been absent: only a synced view sets or
/// clears it; entries for checkpoints no longer on disk are dropped. Never later than
/// `now`: a time recorded before the clock went back (or a corrupted journal) would
/// otherwise postpone garbage collection to a time that may never come; the grace
/// period restarts instead, which delays removal, never hastens it.
pub(super) fn absent_since(row: &Row<'_>, synced: bool, now: Timestamp) -> Option<Timestamp> {
    row.disk?;
    if !row.allowed && !row.is_self {
        return None;
    }
    let previous = row.previous_absent.map(|t| t.min(now));
    match (synced, row.parent) {
        (true, Some(_)) => None,
        (true, None) => Some(previous.unwrap_or(now)),
        (false, _) => previous,
    }
}

/// The content a row's checkpoint holds once the pass is done.
pub(super) fn content<'a>(row: &Row<'a>, written: bool) -> Option<&'a str> {
    if written {
        row.desired.map(String::as_str)
    } else {
        (row.disk.and_then(|d| d.inactive.as_ref())).and_then(|c| c.meta.spec_hash.as_deref())
    }
}

/// Whether a verdict removes now: now or at a deadline that has come.
pub(super) fn due(verdict: Option<&GcDecision>, now: Timestamp) -> bool {
    match verdict.map(|v| v.verdict) {
        Some(GcVerdict::RemoveNow) => true,
        Some(GcVerdict::RemoveAt(deadline)) => now >= deadline,
        Some(GcVerdict::Keep) | None => false,
    }
}
