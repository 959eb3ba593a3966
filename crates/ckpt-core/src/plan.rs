//! The planner: a pure function from what the agent observes to what it must do.
//!
//! [`plan`] takes the API view, the local view, the checkpoints on disk, the sanitized
//! content each parent should have, GC verdicts and the persisted state, and returns a
//! [`Plan`]: writes, then stops, starts and removes (each sorted), the updated
//! persistent state, and the state of every checkpoint for reporting.
//!
//! The rules (ARCHITECTURE.md, Planner rules and Self-checkpoint, lock and self-GC), and where they differ from bootkube on purpose:
//! - **Activate** an inactive checkpoint only when the API server is unreachable and the
//!   parent is not running locally (an unknown runtime counts as not running here:
//!   availability first). bootkube also activated when the API listed a parent that was
//!   merely not started yet, which started duplicate static API servers.
//! - **Stay active** while the parent does not run locally, even once the API is back
//!   (it may be served by this very checkpoint). **Deactivate** when the parent runs.
//! - With the runtime unknown and the API reachable, nothing is started or stopped.
//! - **Remove** only on a synced API view, per the GC strategy's verdict.
//! - **Outside the allow-list** a checkpoint never starts; on a synced view it is removed
//!   unless it is active and its parent is not seen running (it may be serving).
//! - **Completed parents** are not checkpointed; their checkpoints go on a synced view.
//! - **Self** is always active, never stopped, follows its newest parent, is superseded
//!   by a rolled pod of its own DaemonSet, and is removed last, on a self-GC plan only.
//! - **Revisions** ([`crate::revisions`]): a DaemonSet's checkpoints on this node are one
//!   lineage; only the revision an activation runs (the newest known-good, else the
//!   newest) is ever active, "the parent runs" means a pod of the lineage runs, the newest
//!   and known-good revisions outlive their GC verdicts, and a parent with unproven content
//!   takes over through the health-gated handoff.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::checkpoint::CheckpointMeta;
use crate::gc::{GcDecision, GcVerdict, Orphan};
use crate::identity::{ControllerOwner, NamespaceAllowList, PodId, SelfIdentity};
use crate::known_good::SpecSince;
use crate::observation::OwnerStatus;
use crate::revisions::{
    CrashLoopInput, Handoff, HandoffInput, Lineage, LineagePlan, RestartsSeen, Revision, RevisionSettings,
    Serving, SetAside, crash_loop, handoff, plan_lineages,
};
use crate::time::Timestamp;

/// What the API server tells us, in the three states that matter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiView {
    /// The health probe fails: down, refusing or hung. Only this state activates.
    Unreachable,
    /// It answers but we have no complete list since the last outage (a 403 while RBAC
    /// warms up, a relist in progress): neither activates nor garbage-collects.
    Reachable,
    /// A complete, current list of the parents on this node. Only this state removes.
    Synced {
        /// Every parent pod on this node (annotated, in an allowed namespace).
        parents: BTreeMap<PodId, ApiParent>,
    },
}

/// A parent as listed by the API server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiParent {
    /// The pod's UID.
    pub uid: Option<String>,
    /// The pod's controller owner.
    pub owner: Option<ControllerOwner>,
    /// It has completed (phase `Succeeded` or `Failed` with `restartPolicy` `Never` or
    /// `OnFailure`): it will never run again, and a static copy would run its work again.
    pub completed: bool,
    /// It asks for its checkpoint to stay until it is Ready
    /// ([`crate::identity::HANDOFF_WHEN_READY`]).
    pub retires_when_ready: bool,
}

/// What runs on this node, from the container runtime (or the kubelet with CRI off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalView {
    /// The source failed: not "nothing is running".
    Unknown,
    /// The source answered.
    Known {
        /// Parents running locally under their own name (a checkpoint's static pod runs
        /// as `<name>-<node>`, so it never counts as its parent running).
        running: BTreeSet<PodId>,
        /// Parents the kubelet knows about. Informational only: a checkpoint's content
        /// always comes from the API copy, so a stale kubelet never creates one.
        kubelet_parents: BTreeSet<PodId>,
        /// The restart counts of the static pods of the checkpoints a plan asked about
        /// ([`Plan::watch_restarts`]), by checkpoint: the highest attempt among each one's
        /// containers, as the runtime shows it. One not seen (no container yet, no CRI) is
        /// missing.
        restarts: BTreeMap<PodId, u32>,
    },
}

/// One stored copy of a checkpoint (inactive or active).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCopy {
    /// What the manifest says about itself.
    pub meta: CheckpointMeta,
    /// SHA-256 of the file's bytes, to compare the active copy with the inactive one.
    pub digest: String,
}

/// A checkpoint as found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCheckpoint {
    /// In the inactive-manifests directory.
    pub inactive: Option<StoredCopy>,
    /// In the kubelet's manifests directory.
    pub active: Option<StoredCopy>,
}

impl DiskCheckpoint {
    /// What the inactive copy (else the active one) says about itself.
    pub fn meta(&self) -> Option<&CheckpointMeta> {
        self.inactive.as_ref().or(self.active.as_ref()).map(|c| &c.meta)
    }
}

/// State the planner keeps across passes and restarts (the state journal).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistentState {
    /// Since when each checkpoint's parent has been absent from synced API views.
    #[serde(with = "absent_since_map")]
    pub absent_since: BTreeMap<PodId, Timestamp>,
    /// The known-good content of each parent (see [`crate::known_good`]).
    #[serde(default, with = "pod_id_map")]
    pub known_good: BTreeMap<PodId, SpecSince>,
    /// Since when each parent has been Ready with content not proven yet.
    #[serde(default, with = "pod_id_map")]
    pub ready_since: BTreeMap<PodId, SpecSince>,
    /// Handoffs under way from a known-good checkpoint to the newest revision of its
    /// lineage, by the newest revision, since when (see [`crate::revisions::handoff`]).
    #[serde(default, with = "pod_id_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub handoffs: BTreeMap<PodId, SpecSince>,
    /// Newest revisions whose handoff failed, with the content that failed.
    #[serde(default, with = "pod_id_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub rejected: BTreeMap<PodId, SpecSince>,
    /// The restart count of each active revision with a fallback, as first seen in this
    /// outage (see [`crate::revisions::crash_loop`]).
    #[serde(default, with = "pod_id_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub restarts_seen: BTreeMap<PodId, RestartsSeen>,
}

/// Whether the agent's own DaemonSet still targets this node: what decides self-GC
/// (ARCHITECTURE.md, Self-checkpoint, lock and self-GC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SelfScheduling {
    /// It targets this node (or a DaemonSet of the same name that replaced it does): the
    /// agent's own pod being absent is a rollout, an eviction or a controller outage. Keep
    /// everything, whatever the strategy says.
    Targeted,
    /// It exists but no longer targets this node (why attached): self-GC now.
    Descheduled(String),
    /// It is deleted (404) and nothing of the same name took its place: self-GC once the
    /// agent's own pod has been absent for the grace period.
    Deleted,
    /// Not known (why attached: no owner known, not a DaemonSet, no permission, the node
    /// unreadable): the strategy's verdict, never sooner than the grace period.
    Unknown(String),
}

/// Everything [`plan`] looks at.
#[derive(Clone, Copy, Debug)]
pub struct PlanInputs<'a> {
    /// The API view.
    pub api: &'a ApiView,
    /// The local view.
    pub local: &'a LocalView,
    /// Checkpoints on disk.
    pub disk: &'a BTreeMap<PodId, DiskCheckpoint>,
    /// Spec hash of the sanitized API copy of each parent that could be sanitized.
    pub desired: &'a BTreeMap<PodId, String>,
    /// GC verdicts for the [`orphans`], computed by the strategy.
    pub verdicts: &'a BTreeMap<PodId, GcDecision>,
    /// The persisted state from the previous pass.
    pub state: &'a PersistentState,
    /// Who the agent is.
    pub me: &'a SelfIdentity,
    /// Whether the agent's own DaemonSet still targets this node (only looked at on a
    /// synced view without the agent's own pod).
    pub scheduling: &'a SelfScheduling,
    /// `--checkpoint-grace-period`: self-GC never comes sooner after the agent's own pod
    /// left, unless its DaemonSet no longer targets the node.
    pub grace: std::time::Duration,
    /// `--namespaces`: checkpoints outside it are only wound down.
    pub allowed: &'a NamespaceAllowList,
    /// The parents Ready on a synced view (empty otherwise): what ends a handoff.
    pub ready: &'a BTreeSet<PodId>,
    /// The parents being deleted on a synced view (empty otherwise): they get no handoff.
    pub terminating: &'a BTreeSet<PodId>,
    /// `--revisions` and `--handoff-timeout`.
    pub revisions: &'a RevisionSettings,
    /// DaemonSet lineages whose DaemonSet (same UID) still targets this node and
    /// checkpoints its pods, on a synced view: a pod of theirs being absent is a rollout,
    /// an eviction or a controller outage, so the revisions they keep stay whatever the GC
    /// strategy says (as the agent's own checkpoint does while its DaemonSet targets it).
    pub live: &'a BTreeSet<Lineage>,
}

/// Why a checkpoint is removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemovalReason {
    /// The GC strategy decided (its reason attached).
    Gc(String),
    /// An older checkpoint of the agent itself, replaced by a rolled pod of its DaemonSet.
    SupersededSelf(PodId),
    /// Self-GC: the agent's own DaemonSet no longer runs it here (why attached);
    /// everything goes.
    SelfGc(String),
    /// Its namespace is no longer in `--namespaces`.
    NotAllowed,
    /// Its parent has completed and will never run again.
    Completed,
}

impl RemovalReason {
    /// Every [`RemovalReason::code`], in declaration order.
    pub const CODES: [&'static str; 5] = [
        "gc",
        "superseded-self",
        "self-gc",
        "namespace-not-allowed",
        "completed",
    ];

    /// A fixed code for metrics labels and alerts; the pod and owner names stay in the
    /// reason's text (logs and Events), so the label's values stay a small, known set.
    pub fn code(&self) -> &'static str {
        match self {
            RemovalReason::Gc(_) => "gc",
            RemovalReason::SupersededSelf(_) => "superseded-self",
            RemovalReason::SelfGc(_) => "self-gc",
            RemovalReason::NotAllowed => "namespace-not-allowed",
            RemovalReason::Completed => "completed",
        }
    }
}

/// A checkpoint to remove: secrets, configmaps, projected data, inactive, then active.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// Whose checkpoint.
    pub id: PodId,
    /// Why.
    pub reason: RemovalReason,
    /// A checkpoint of the agent itself: in a self-GC plan these come last, and are only
    /// removed once every other removal succeeded.
    pub is_self: bool,
}

/// The state of a checkpoint after a pass (bootkube's states, for reporting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state", content = "deadline")]
pub enum CheckpointState {
    /// Written, not active: the parent runs or the API is reachable.
    Inactive,
    /// Inactive, parent absent, to be removed at the deadline.
    InactiveGrace(Timestamp),
    /// A static pod in the kubelet's manifests directory.
    Active,
    /// Active, parent absent, to be removed at the deadline.
    ActiveGrace(Timestamp),
    /// The agent's own checkpoint: always active.
    SelfActive,
    /// Removed in this pass.
    Removed,
}

impl CheckpointState {
    /// The state's name for metrics (`inactive`, `inactive-grace`, `active`,
    /// `active-grace`, `self`); `None` for a removed checkpoint.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            CheckpointState::Inactive => "inactive",
            CheckpointState::InactiveGrace(_) => "inactive-grace",
            CheckpointState::Active => "active",
            CheckpointState::ActiveGrace(_) => "active-grace",
            CheckpointState::SelfActive => "self",
            CheckpointState::Removed => return None,
        })
    }
}

/// What to do, in execution order: `writes`, `stops`, `starts`, `removes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Write (or rewrite) the inactive checkpoint from the desired content.
    pub writes: Vec<PodId>,
    /// Remove the active manifest (deactivate).
    pub stops: Vec<PodId>,
    /// Copy the inactive manifest into the manifests directory (activate or refresh).
    pub starts: Vec<PodId>,
    /// Remove the checkpoint entirely; self last.
    pub removes: Vec<Removal>,
    /// This is a self-GC plan: once executed, the agent exits.
    pub self_gc: bool,
    /// When self-GC is due if nothing changes (a deleted DaemonSet, or an unknown one
    /// past the strategy's verdict): when to look again.
    pub self_gc_at: Option<Timestamp>,
    /// The persistent state to save after executing.
    pub state: PersistentState,
    /// Every checkpoint's state after the pass.
    pub states: BTreeMap<PodId, CheckpointState>,
    /// Something on this node depends on how soon a change of the API server is seen: a
    /// checkpoint (not the agent's own) that losing the API would activate, its parent not
    /// running here or not known to, or one that is active now and waits for the API or
    /// its parent. While nothing is at stake a hung API server changes nothing here, so
    /// the API may be probed rarely.
    pub at_stake: bool,
    /// Handoff steps taken in this pass: (the known-good checkpoint, the newest revision
    /// its parent runs, the step).
    pub handoffs: Vec<(PodId, PodId, Handoff)>,
    /// When a handoff under way ends if its parent does not become Ready: look again then.
    pub handoff_at: Option<Timestamp>,
    /// Active revisions whose static pods' restart counts the next passes need (see
    /// [`LocalView::Known`]'s `restarts`): asked of the runtime only while this is not empty.
    pub watch_restarts: BTreeSet<PodId>,
    /// Revisions set aside in this pass because they crash-looped while active.
    pub set_aside: Vec<SetAside>,
}

impl Plan {
    /// Whether the plan changes anything on disk.
    pub fn is_noop(&self) -> bool {
        self.writes.is_empty() && self.stops.is_empty() && self.starts.is_empty() && self.removes.is_empty()
    }
}

/// Everything the planner knows about one pod id. The inputs are all sorted by id, so
/// rows are gathered with merge walks: a pass is linear in the number of checkpoints,
/// not a tree lookup per question (that made 5,000 checkpoints cost ~25 ms).
struct Row<'a> {
    id: &'a PodId,
    disk: Option<&'a DiskCheckpoint>,
    /// Listed by a synced API view (always `None` unless synced).
    parent: Option<&'a ApiParent>,
    desired: Option<&'a String>,
    verdict: Option<&'a GcDecision>,
    runs: Option<bool>,
    previous_absent: Option<Timestamp>,
    is_self: bool,
    /// In an allowed namespace (the agent's own checkpoint always counts as allowed).
    allowed: bool,
}

impl Row<'_> {
    fn has_inactive(&self) -> bool {
        self.disk.is_some_and(|d| d.inactive.is_some())
    }

    /// Its parent asks for the checkpoint to stay until it is Ready: as the API lists it,
    /// else as its checkpoint recorded it (which holds while the API is down).
    fn retires_when_ready(&self) -> bool {
        match self.parent {
            Some(parent) => parent.retires_when_ready,
            None => (self.disk.and_then(DiskCheckpoint::meta)).is_some_and(|m| m.retires_when_ready),
        }
    }
}

/// A sorted map's entries looked up for ids asked in ascending order: one walk over the
/// map for all lookups, and no vector of the answers.
struct Aligned<'a, V, I: Iterator<Item = (&'a PodId, V)>> {
    entries: std::iter::Peekable<I>,
}

impl<'a, V: Copy, I: Iterator<Item = (&'a PodId, V)>> Aligned<'a, V, I> {
    fn new(entries: I) -> Self {
        Self {
            entries: entries.peekable(),
        }
    }

    /// The value for `id`; ids must come in ascending order.
    fn at(&mut self, id: &PodId) -> Option<V> {
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
struct Gathered<'a> {
    id: &'a PodId,
    disk: Option<&'a DiskCheckpoint>,
    desired: Option<&'a String>,
    parent: Option<&'a ApiParent>,
}

/// The sorted union of three sorted maps' ids, each with its entries, in one walk: at
/// most two id comparisons per id (comparisons dominate a pass, so no separate union and
/// alignment walks).
fn gather<'a>(
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

fn rows<'a>(inputs: &PlanInputs<'a>) -> Vec<Row<'a>> {
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
            is_self: is_self(inputs, g.id, g.parent, g.disk),
            allowed: inputs.allowed.allows(&g.id.namespace),
        })
        .collect()
}

/// Whether `id` is one of the agent's own pods, by name or by its controller (as listed,
/// else as checkpointed).
fn is_self(
    inputs: &PlanInputs<'_>,
    id: &PodId,
    parent: Option<&ApiParent>,
    disk: Option<&DiskCheckpoint>,
) -> bool {
    let owner = parent
        .and_then(|p| p.owner.as_ref())
        .or_else(|| disk.and_then(DiskCheckpoint::meta).and_then(|m| m.owner.as_ref()));
    inputs.me.is_self(id, owner)
}

/// Since when each checkpoint's parent has been absent: only a synced view sets or
/// clears it; entries for checkpoints no longer on disk are dropped. Never later than
/// `now`: a time recorded before the clock went back (or a corrupted journal) would
/// otherwise postpone garbage collection to a time that may never come; the grace
/// period restarts instead, which delays removal, never hastens it.
fn absent_since(row: &Row<'_>, synced: bool, now: Timestamp) -> Option<Timestamp> {
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

/// The checkpoints on disk whose parents are absent from a synced API view: ask the GC
/// strategy about each, then pass the verdicts to [`plan`]. Empty unless synced.
pub fn orphans(inputs: &PlanInputs<'_>, now: Timestamp) -> Vec<Orphan> {
    let ApiView::Synced { parents } = inputs.api else {
        return Vec::new();
    };
    // Only checkpoints on disk whose parents are not listed: one walk over the two, then
    // the journal aligned with those few alone.
    let mut listed = Aligned::new(parents.keys().map(|id| (id, ())));
    let mut previous = Aligned::new(inputs.state.absent_since.iter().map(|(id, t)| (id, *t)));
    let unlisted = (inputs.disk.iter()).filter(|(id, _)| listed.at(id).is_none());
    let rows = unlisted.map(|(id, disk)| Row {
        id,
        disk: Some(disk),
        parent: None,
        desired: None,
        verdict: None,
        runs: None,
        previous_absent: previous.at(id),
        is_self: is_self(inputs, id, None, Some(disk)),
        allowed: inputs.allowed.allows(&id.namespace),
    });
    rows.filter(|row| row.allowed || row.is_self)
        .filter_map(|row| {
            let meta = row.disk?.meta();
            Some(Orphan {
                id: row.id.clone(),
                parent_uid: meta.and_then(|m| m.parent_uid.clone()),
                owner: meta.and_then(|m| m.owner.clone()),
                is_self: row.is_self,
                absent_since: absent_since(&row, true, now).unwrap_or(now),
                owner_status: OwnerStatus::Unknown,
                siblings: Vec::new(),
            })
        })
        .collect()
}

/// Plans one pass. Pure: the same inputs and `now` give the same plan, and applying a
/// plan then planning again with the same observations gives no further actions.
pub fn plan(inputs: &PlanInputs<'_>, now: Timestamp) -> Plan {
    let synced = matches!(inputs.api, ApiView::Synced { .. });
    let rows = rows(inputs);
    let mut out = Plan {
        state: PersistentState {
            absent_since: rows
                .iter()
                .filter_map(|row| absent_since(row, synced, now).map(|t| (row.id.clone(), t)))
                .collect(),
            // Tracked by `decide` once the plan is made (it needs the pods' readiness).
            known_good: inputs.state.known_good.clone(),
            ready_since: inputs.state.ready_since.clone(),
            // Set below, per lineage.
            handoffs: BTreeMap::new(),
            rejected: BTreeMap::new(),
            restarts_seen: BTreeMap::new(),
        },
        ..Plan::default()
    };

    // Writes: only from a synced view, for parents whose stored content differs.
    let written: Vec<bool> = rows
        .iter()
        .map(|row| {
            let stored = row
                .disk
                .and_then(|d| d.inactive.as_ref())
                .and_then(|c| c.meta.spec_hash.as_ref());
            row.parent.is_some_and(|p| !p.completed) && row.desired.is_some_and(|hash| stored != Some(hash))
        })
        .collect();
    out.writes = rows
        .iter()
        .zip(&written)
        .filter(|(_, w)| **w)
        .map(|(row, _)| row.id.clone())
        .collect();

    let (lineages, members) = lineages(inputs, &rows, &written, now, &mut out);

    // Self-GC: the agent's own pod is gone from a synced view, no rolled pod replaces it,
    // and its DaemonSet no longer runs it here.
    let self_parent_present = rows.iter().any(|row| row.is_self && row.parent.is_some());
    if synced && !self_parent_present {
        let own = rows.iter().filter(|row| row.is_self && row.disk.is_some());
        let due_at = own.filter_map(|row| self_gc_at(row, inputs, now)).min();
        if due_at.is_some_and(|at| now >= at) {
            let why = match inputs.scheduling {
                SelfScheduling::Descheduled(why) => why.clone(),
                SelfScheduling::Deleted => "the agent's DaemonSet is deleted".to_owned(),
                SelfScheduling::Unknown(why) => format!("the GC strategy's verdict ({why})"),
                SelfScheduling::Targeted => String::new(),
            };
            let on_disk = || rows.iter().filter(|row| row.disk.is_some());
            for row in on_disk()
                .filter(|row| !row.is_self)
                .chain(on_disk().filter(|row| row.is_self))
            {
                out.removes.push(Removal {
                    id: row.id.clone(),
                    reason: RemovalReason::SelfGc(why.clone()),
                    is_self: row.is_self,
                });
                out.states.insert(row.id.clone(), CheckpointState::Removed);
            }
            out.writes.clear();
            out.self_gc = true;
            out.state.absent_since.clear();
            out.state.handoffs.clear();
            out.state.rejected.clear();
            out.state.restarts_seen.clear();
            out.watch_restarts.clear();
            out.set_aside.clear();
            return out;
        }
        out.self_gc_at = due_at;
    }

    // A current pod of the agent's own DaemonSet that is already checkpointed: it
    // supersedes the agent's older checkpoints.
    let self_successor = rows
        .iter()
        .find(|row| row.is_self && row.parent.is_some() && row.has_inactive());
    let mut self_removes = Vec::new();
    // Pushed in id order, so building the map at the end is linear.
    let mut states = Vec::new();
    for ((row, written), member) in rows.iter().zip(written).zip(&members) {
        if row.disk.is_none() && !written {
            continue;
        }
        // Of a lineage of several revisions (ARCHITECTURE.md, Revisions).
        let member = member.as_ref();
        let lineage = member.and_then(|l| lineages.get(l));
        let id = row.id;
        let has_inactive = row.has_inactive() || written;
        let has_active = row.disk.is_some_and(|d| d.active.is_some());

        if row.is_self {
            if synced && row.parent.is_none() {
                // An older pod of the agent's own DaemonSet: superseded once a current one
                // is checkpointed, otherwise kept (a rollout never triggers self-GC).
                if let Some(successor) = self_successor {
                    self_removes.push(Removal {
                        id: id.clone(),
                        reason: RemovalReason::SupersededSelf(successor.id.clone()),
                        is_self: true,
                    });
                    states.push((id.clone(), CheckpointState::Removed));
                    continue;
                }
            }
            let stale = match row.disk.and_then(|d| d.inactive.as_ref().zip(d.active.as_ref())) {
                Some((inactive, active)) => inactive.digest != active.digest,
                None => true,
            };
            if has_inactive && (written || !has_active || stale) {
                out.starts.push(id.clone());
            }
            states.push((id.clone(), CheckpointState::SelfActive));
            continue;
        }

        // ARCHITECTURE.md, Planner rules: completed parents and namespaces outside the
        // allow-list.
        if row.parent.is_some_and(|p| p.completed) {
            out.removes.push(Removal {
                id: id.clone(),
                reason: RemovalReason::Completed,
                is_self: false,
            });
            states.push((id.clone(), CheckpointState::Removed));
            continue;
        }
        if !row.allowed {
            // Its parent is no longer observed (neither listed nor seen running), so
            // nothing of it starts; an active copy may be serving right now and stays
            // until its parent is seen running.
            let parent_runs = row.runs == Some(true);
            if synced && (!has_active || parent_runs) {
                out.removes.push(Removal {
                    id: id.clone(),
                    reason: RemovalReason::NotAllowed,
                    is_self: false,
                });
                states.push((id.clone(), CheckpointState::Removed));
                continue;
            }
            if has_active && parent_runs {
                out.stops.push(id.clone());
            }
            // Never activated again; an active copy waits for its parent.
            out.at_stake |= has_active && !parent_runs;
            let state = if has_active && !parent_runs {
                CheckpointState::Active
            } else {
                CheckpointState::Inactive
            };
            states.push((id.clone(), state));
            continue;
        }

        let verdict = if synced && row.parent.is_none() {
            row.verdict
        } else {
            None
        };
        // A revision kept past its verdict: its lineage lives on and it is one the lineage
        // keeps. A lineage lives while its newest revision is not going, or while its
        // DaemonSet targets the node: then even its newest (or only) revision stays, or a
        // rollout that deletes the old pod before creating the new one would take the
        // checkpoint serving the API server along with it.
        let live = member.is_some_and(|m| inputs.live.contains(m));
        let kept_revision = match lineage {
            Some(l) => (live || (!l.newest_due && l.plan.newest != *id)) && l.plan.kept.contains(id),
            None => live,
        };
        if due(verdict, now) && !kept_revision {
            let reason = verdict.map(|v| v.reason.clone()).unwrap_or_default();
            out.removes.push(Removal {
                id: id.clone(),
                reason: RemovalReason::Gc(reason),
                is_self: false,
            });
            states.push((id.clone(), CheckpointState::Removed));
            continue;
        }

        // Only the revision an activation runs is ever active; the others wait, inactive.
        if lineage.is_some_and(|l| l.plan.runs != *id) {
            if has_active {
                out.stops.push(id.clone());
            }
            states.push((id.clone(), CheckpointState::Inactive));
            continue;
        }
        // A parent of the lineage runs (any revision's: the newest after a rollout).
        let runs = lineage.map_or(row.runs, |l| l.runs);
        let serving = lineage.map_or(Serving::AsUsual, |l| l.serving);
        let ready = lineage.map_or_else(|| inputs.ready.contains(id), |l| l.ready);
        let when_ready = lineage.map_or_else(|| row.retires_when_ready(), |l| l.retires_when_ready);
        let active_after = match (serving, runs, inputs.api) {
            // The new parent has the node until its handoff deadline.
            (Serving::Standby, ..) => false,
            // The new parent failed its handoff: the known-good checkpoint serves.
            (Serving::Serve, ..) => has_inactive || has_active,
            // The parent runs: the checkpoint steps aside, or, for a parent that binds
            // beside it (`when-ready`), stays until the parent is Ready.
            (Serving::AsUsual, Some(true), _) => has_active && when_ready && !ready,
            // Not running (or unknown) and no API: availability first.
            (Serving::AsUsual, _, ApiView::Unreachable) => has_inactive || has_active,
            // Not running, API back: an active checkpoint stays; nothing new starts.
            (Serving::AsUsual, Some(false), _) => has_active,
            // Unknown runtime with a reachable API: change nothing.
            (Serving::AsUsual, None, _) => has_active,
        };
        if has_active && !active_after {
            out.stops.push(id.clone());
        }
        out.at_stake |= active_after || runs != Some(true) || serving != Serving::AsUsual;
        if !has_active && active_after && has_inactive {
            out.starts.push(id.clone());
        }
        let deadline = match verdict.map(|v| v.verdict) {
            Some(GcVerdict::RemoveAt(t)) if !kept_revision => Some(t),
            _ => None,
        };
        let state = match (active_after && (has_active || has_inactive), deadline) {
            (true, Some(t)) => CheckpointState::ActiveGrace(t),
            (true, None) => CheckpointState::Active,
            (false, Some(t)) => CheckpointState::InactiveGrace(t),
            (false, None) => CheckpointState::Inactive,
        };
        states.push((id.clone(), state));
    }
    out.watch_restarts = (lineages.values())
        .filter(|l| l.fallback)
        .filter(|l| {
            states
                .binary_search_by(|(id, _)| id.cmp(&l.plan.runs))
                .is_ok_and(|i| {
                    matches!(
                        states[i].1,
                        CheckpointState::Active | CheckpointState::ActiveGrace(_)
                    )
                })
        })
        .map(|l| l.plan.runs.clone())
        .collect();
    // The agent's own old checkpoints go last: removing the active copy may stop the
    // process that runs this very plan.
    out.removes.extend(self_removes);
    out.states = states.into_iter().collect();
    for removal in &out.removes {
        out.state.absent_since.remove(&removal.id);
    }
    out
}

/// A lineage of several revisions, as one pass sees it.
struct LineagePass {
    plan: LineagePlan,
    /// A parent of the lineage runs here (`None`: the runtime is unknown).
    runs: Option<bool>,
    /// The newest revision goes in this pass (its verdict is due and its DaemonSet does
    /// not target the node): the lineage ends and keeps nothing past its verdicts.
    newest_due: bool,
    /// How the revision it runs serves (a handoff under way, or failed).
    serving: Serving,
    /// A parent of the lineage is Ready on a synced view.
    ready: bool,
    /// The newest revision's parent asks for the checkpoint to stay until it is Ready.
    retires_when_ready: bool,
    /// The API is unreachable and another known-good revision could replace the one it
    /// runs: that one's restarts are watched while it is active.
    fallback: bool,
}

/// The lineages of several revisions ([`crate::revisions`]), and each row's lineage if it
/// is one of those. Records the handoffs' steps and journal entries in `out`.
fn lineages(
    inputs: &PlanInputs<'_>,
    rows: &[Row<'_>],
    written: &[bool],
    now: Timestamp,
    out: &mut Plan,
) -> (BTreeMap<Lineage, LineagePass>, Vec<Option<Lineage>>) {
    let synced = matches!(inputs.api, ApiView::Synced { .. });
    // Only a DaemonSet's pods share a lineage; every other pod is one of its own.
    let members: Vec<Option<Lineage>> = (rows.iter().zip(written))
        .map(|(row, written)| {
            let revision = (row.disk.is_some() || *written)
                && !row.is_self
                && row.allowed
                && !row.parent.is_some_and(|p| p.completed);
            let owner = (row.parent.and_then(|p| p.owner.as_ref())).or_else(|| {
                row.disk
                    .and_then(DiskCheckpoint::meta)
                    .and_then(|m| m.owner.as_ref())
            });
            revision
                .then(|| Lineage::of(row.id, owner))
                .filter(|l| matches!(l, Lineage::DaemonSet { .. }))
        })
        .collect();
    let mut groups: BTreeMap<&Lineage, Vec<usize>> = BTreeMap::new();
    for (i, lineage) in members.iter().enumerate() {
        if let Some(lineage) = lineage {
            groups.entry(lineage).or_default().push(i);
        }
    }
    groups.retain(|_, indices| indices.len() >= 2);
    let mut revisions: Vec<(Lineage, Revision<'_>)> = (groups.iter())
        .flat_map(|(lineage, indices)| {
            indices.iter().map(|&i| {
                let (row, written) = (&rows[i], written[i]);
                let checkpointed_at = if written {
                    Some(now)
                } else {
                    row.disk
                        .and_then(DiskCheckpoint::meta)
                        .and_then(|m| m.checkpointed_at)
                };
                let proven = (content(row, written))
                    .zip(inputs.state.known_good.get(row.id))
                    .is_some_and(|(content, proof)| proof.spec_hash == content);
                let revision = Revision {
                    id: row.id,
                    checkpointed_at,
                    proven,
                };
                ((*lineage).clone(), revision)
            })
        })
        .collect();
    let index = |id: &PodId| rows.binary_search_by(|row| row.id.cmp(id)).ok();
    let unreachable = matches!(inputs.api, ApiView::Unreachable);
    let restarts = match inputs.local {
        LocalView::Known { restarts, .. } => Some(restarts),
        LocalView::Unknown => None,
    };
    let mut passes = BTreeMap::new();
    for (lineage, mut plan) in plan_lineages(revisions.iter().cloned(), inputs.revisions) {
        let Some(indices) = groups.get(&lineage) else {
            continue;
        };
        let Some(mut runner) = index(&plan.runs) else {
            continue;
        };
        // The revision it runs crash-loops while the API is unreachable: the previous
        // known-good one replaces it (ARCHITECTURE.md, Revisions).
        let fallback = |revisions: &[(Lineage, Revision<'_>)], runs: &PodId| {
            unreachable && (revisions.iter()).any(|(l, r)| *l == lineage && r.proven && r.id != runs)
        };
        let look = crash_loop(
            &CrashLoopInput {
                unreachable,
                active: rows[runner].disk.is_some_and(|d| d.active.is_some()),
                fallback: fallback(&revisions, &plan.runs),
                restarts: restarts.and_then(|r| r.get(&plan.runs).copied()),
                seen: inputs.state.restarts_seen.get(&plan.runs),
            },
            now,
        );
        if let Some(seen) = look.seen {
            out.state.restarts_seen.insert(plan.runs.clone(), seen);
        }
        if look.set_aside {
            let set_aside = plan.runs.clone();
            let without = (revisions.iter()).filter(|(l, _)| *l == lineage).map(|(l, r)| {
                let proven = r.proven && *r.id != set_aside;
                (l.clone(), Revision { proven, ..r.clone() })
            });
            let replanned = (plan_lineages(without, inputs.revisions).pop_first())
                .and_then(|(_, p)| Some((index(&p.runs)?, p)));
            if let Some((replacement, replanned)) = replanned {
                for (_, r) in revisions.iter_mut().filter(|(l, _)| *l == lineage) {
                    r.proven &= *r.id != set_aside;
                }
                let first = inputs.state.restarts_seen.get(&set_aside).map_or(0, |s| s.first);
                let restarts_now = restarts.and_then(|r| r.get(&set_aside).copied()).unwrap_or(first);
                out.state.known_good.remove(&set_aside);
                out.set_aside.push(SetAside {
                    revision: set_aside,
                    replacement: replanned.runs.clone(),
                    restarts: restarts_now.saturating_sub(first),
                });
                (plan, runner) = (replanned, replacement);
            }
        }
        let Some(newest) = index(&plan.newest) else {
            continue;
        };
        let runs = if indices.iter().any(|&i| rows[i].runs == Some(true)) {
            Some(true)
        } else {
            rows[newest].runs
        };
        let newest_row = &rows[newest];
        let newest_due = synced
            && newest_row.parent.is_none()
            && due(newest_row.verdict, now)
            && !inputs.live.contains(&lineage);
        let mut serving = Serving::AsUsual;
        if newest != runner
            && let Some(hash) = content(newest_row, written[newest])
        {
            let input = HandoffInput {
                newest_hash: hash,
                newest_runs: newest_row.runs,
                newest_ready: inputs.ready.contains(newest_row.id),
                newest_terminating: inputs.terminating.contains(newest_row.id),
                retires_when_ready: newest_row.retires_when_ready(),
                active: rows[runner].disk.is_some_and(|d| d.active.is_some()),
                handoff: inputs.state.handoffs.get(newest_row.id),
                rejected: inputs.state.rejected.get(newest_row.id),
                timeout: inputs.revisions.handoff_timeout,
            };
            let outcome = handoff(&input, now);
            serving = outcome.serving;
            if let Some(step) = outcome.step {
                out.handoffs.push((plan.runs.clone(), plan.newest.clone(), step));
            }
            if let Some(h) = outcome.handoff {
                out.state.handoffs.insert(plan.newest.clone(), h);
            }
            if let Some(r) = outcome.rejected {
                out.state.rejected.insert(plan.newest.clone(), r);
            }
            out.handoff_at = outcome.deadline.into_iter().chain(out.handoff_at).min();
        }
        let pass = LineagePass {
            fallback: fallback(&revisions, &plan.runs),
            plan,
            runs,
            newest_due,
            serving,
            ready: indices.iter().any(|&i| inputs.ready.contains(rows[i].id)),
            retires_when_ready: newest_row.retires_when_ready(),
        };
        passes.insert(lineage, pass);
    }
    (passes, members)
}

/// The content a row's checkpoint holds once the pass is done.
fn content<'a>(row: &Row<'a>, written: bool) -> Option<&'a str> {
    if written {
        row.desired.map(String::as_str)
    } else {
        (row.disk.and_then(|d| d.inactive.as_ref())).and_then(|c| c.meta.spec_hash.as_deref())
    }
}

/// When the agent's own checkpoint `row` (its pod absent from a synced view) makes this
/// a self-GC plan; `None`: not while the scheduling stays as it is.
fn self_gc_at(row: &Row<'_>, inputs: &PlanInputs<'_>, now: Timestamp) -> Option<Timestamp> {
    let after_grace = absent_since(row, true, now)
        .unwrap_or(now)
        .saturating_add(inputs.grace);
    match inputs.scheduling {
        SelfScheduling::Targeted => None,
        SelfScheduling::Descheduled(_) => Some(now),
        SelfScheduling::Deleted => Some(after_grace),
        SelfScheduling::Unknown(_) => match row.verdict.map(|v| v.verdict) {
            Some(GcVerdict::RemoveNow) => Some(after_grace),
            Some(GcVerdict::RemoveAt(at)) => Some(at.max(after_grace)),
            Some(GcVerdict::Keep) | None => None,
        },
    }
}

fn due(verdict: Option<&GcDecision>, now: Timestamp) -> bool {
    match verdict.map(|v| v.verdict) {
        Some(GcVerdict::RemoveNow) => true,
        Some(GcVerdict::RemoveAt(deadline)) => now >= deadline,
        Some(GcVerdict::Keep) | None => false,
    }
}

/// JSON object keys must be strings: a map by pod is stored as a list of entries, each the
/// pod's `namespace` and `name` beside the fields of its value.
mod pod_id_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::identity::PodId;

    #[derive(Serialize)]
    struct EntryRef<'a, V> {
        namespace: &'a str,
        name: &'a str,
        #[serde(flatten)]
        value: &'a V,
    }

    #[derive(Deserialize)]
    struct Entry<V> {
        namespace: String,
        name: String,
        #[serde(flatten)]
        value: V,
    }

    pub(super) fn serialize<S: Serializer, V: Serialize>(
        map: &BTreeMap<PodId, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let entries: Vec<EntryRef<'_, V>> = (map.iter())
            .map(|(id, value)| EntryRef {
                namespace: &id.namespace,
                name: &id.name,
                value,
            })
            .collect();
        entries.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
        d: D,
    ) -> Result<BTreeMap<PodId, V>, D::Error> {
        let entries = Vec::<Entry<V>>::deserialize(d)?;
        Ok((entries.into_iter())
            .map(|e| (PodId::new(e.namespace, e.name), e.value))
            .collect())
    }
}

/// `absent_since` through [`pod_id_map`]: each entry's time is its `since` field.
mod absent_since_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::identity::PodId;
    use crate::time::Timestamp;

    #[derive(Serialize, Deserialize)]
    struct Since {
        since: Timestamp,
    }

    pub(super) fn serialize<S: Serializer>(
        map: &BTreeMap<PodId, Timestamp>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let wrapped: BTreeMap<PodId, Since> = (map.iter())
            .map(|(id, since)| (id.clone(), Since { since: *since }))
            .collect();
        super::pod_id_map::serialize(&wrapped, s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<PodId, Timestamp>, D::Error> {
        let wrapped: BTreeMap<PodId, Since> = super::pod_id_map::deserialize(d)?;
        Ok(wrapped.into_iter().map(|(id, s)| (id, s.since)).collect())
    }
}

#[cfg(test)]
mod tests;
