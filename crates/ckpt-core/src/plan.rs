//! The planner: a pure function from what the agent observes to what it must do.
//!
//! [`plan`] takes the API view, the local view, the checkpoints on disk, the sanitized
//! content each parent should have, GC verdicts and the persisted state ([`PlanInputs`]),
//! and returns a final [`Plan`]: writes, then stops, starts and removes (each sorted), the
//! journal to save (known-good tracking, [`crate::known_good`], is its last step), and the
//! state of every checkpoint for reporting. [`orphans`] are the checkpoints the GC
//! strategy is asked about first. The inputs are walked as one row per pod id (`rows`);
//! a DaemonSet's revisions are planned together (`lineages`).
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
//!   by a rolled pod of its own DaemonSet, and is removed last, on a self-GC plan only:
//!   the grace period after the first successful read saying its DaemonSet is deleted or
//!   descheduled, never on an unknown one (issue 36: only positive evidence removes).
//! - **Revisions** ([`crate::revisions`]): a DaemonSet's checkpoints on this node are one
//!   lineage; only the revision an activation runs (the newest known-good, else the
//!   newest) is ever active, "the parent runs" means a pod of the lineage runs, the newest
//!   and known-good revisions outlive their GC verdicts, and a parent with unproven content
//!   takes over through the health-gated handoff.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::gc::{GcVerdict, Orphan};
use crate::identity::{NamespaceAllowList, PodId, SelfIdentity};
use crate::journal::PersistentState;
use crate::known_good;
use crate::observation::{ApiView, DiskCheckpoint, OwnerStatus, SelfScheduling};
use crate::revisions::{Handoff, Lineage, Serving, SetAside};
use crate::time::Timestamp;

mod lineages;
mod rows;

pub(crate) use rows::PlanInputs;
use rows::{Aligned, Row, absent_since, due, is_self};

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
pub(crate) struct Plan {
    /// Write (or rewrite) the inactive checkpoint from the desired content.
    pub(crate) writes: Vec<PodId>,
    /// Remove the active manifest (deactivate).
    pub(crate) stops: Vec<PodId>,
    /// Copy the inactive manifest into the manifests directory (activate or refresh).
    pub(crate) starts: Vec<PodId>,
    /// Remove the checkpoint entirely; self last.
    pub(crate) removes: Vec<Removal>,
    /// This is a self-GC plan: once executed, the agent exits.
    pub(crate) self_gc: bool,
    /// When self-GC is due if nothing changes (the grace period after the first read
    /// saying deleted or descheduled): when to look again.
    pub(crate) self_gc_at: Option<Timestamp>,
    /// A self-GC is due but these active checkpoints serve lineages that still target the
    /// node (`self_gc_deferred`): they, and the agent's own, stay; the rest is removed.
    pub(crate) self_gc_deferred: Vec<PodId>,
    /// The persistent state to save after executing.
    pub(crate) state: PersistentState,
    /// Every checkpoint's state after the pass.
    pub(crate) states: BTreeMap<PodId, CheckpointState>,
    /// Something on this node depends on how soon a change of the API server is seen: a
    /// checkpoint (not the agent's own) that losing the API would activate, its parent not
    /// running here or not known to, or one that is active now and waits for the API or
    /// its parent. While nothing is at stake a hung API server changes nothing here, so
    /// the API may be probed rarely.
    pub(crate) at_stake: bool,
    /// Handoff steps taken in this pass: (the known-good checkpoint, the newest revision
    /// its parent runs, the step).
    pub(crate) handoffs: Vec<(PodId, PodId, Handoff)>,
    /// When a handoff under way ends if its parent does not become Ready: look again then.
    pub(crate) handoff_at: Option<Timestamp>,
    /// Active revisions whose static pods' restart counts the next passes need (see
    /// [`LocalView::Known`](crate::LocalView::Known)'s `restarts`): asked of the runtime only while this is not empty.
    pub(crate) watch_restarts: BTreeSet<PodId>,
    /// When a parent Ready with content not proven yet proves it: look again then.
    pub(crate) known_good_at: Option<Timestamp>,
    /// Revisions set aside in this pass because they crash-looped while active.
    pub(crate) set_aside: Vec<SetAside>,
}

// The tests' fixpoint check; a pass looks at the `Decision`'s.
#[cfg(test)]
impl Plan {
    /// Whether the plan changes anything on disk.
    pub(crate) fn is_noop(&self) -> bool {
        self.writes.is_empty() && self.stops.is_empty() && self.starts.is_empty() && self.removes.is_empty()
    }
}

/// The checkpoints on disk whose parents are absent from a synced API view (`api`): ask
/// the GC strategy about each, then pass the verdicts to [`plan`]. Empty unless synced.
pub(crate) fn orphans(
    api: &ApiView,
    disk: &BTreeMap<PodId, DiskCheckpoint>,
    absent_since: &BTreeMap<PodId, Timestamp>,
    me: &SelfIdentity,
    allowed: &NamespaceAllowList,
    now: Timestamp,
) -> Vec<Orphan> {
    let ApiView::Synced { parents } = api else {
        return Vec::new();
    };
    // Only checkpoints on disk whose parents are not listed: one walk over the two, then
    // the journal aligned with those few alone.
    let mut listed = Aligned::new(parents.keys().map(|id| (id, ())));
    let mut previous = Aligned::new(absent_since.iter().map(|(id, t)| (id, *t)));
    let unlisted = (disk.iter()).filter(|(id, _)| listed.at(id).is_none());
    let rows = unlisted.map(|(id, disk)| Row {
        id,
        disk: Some(disk),
        parent: None,
        desired: None,
        verdict: None,
        runs: None,
        previous_absent: previous.at(id),
        is_self: is_self(me, id, None, Some(disk)),
        allowed: allowed.allows(&id.namespace),
    });
    rows.filter(|row| row.allowed || row.is_self)
        .filter_map(|row| {
            let meta = row.disk?.meta();
            Some(Orphan {
                id: row.id.clone(),
                parent_uid: meta.and_then(|m| m.parent_uid.clone()),
                owner: meta.and_then(|m| m.owner.clone()),
                is_self: row.is_self,
                absent_since: rows::absent_since(&row, true, now).unwrap_or(now),
                owner_status: OwnerStatus::Unknown,
                siblings: Vec::new(),
            })
        })
        .collect()
}

/// Plans one pass. Pure: the same inputs and `now` give the same plan, and applying a
/// plan then planning again with the same observations gives no further actions. The
/// plan is final: its state is the journal to save, known-good tracking included.
pub(crate) fn plan(inputs: &PlanInputs<'_>, now: Timestamp) -> Plan {
    let mut out = actions(inputs, now);
    track_known_good(inputs, now, &mut out);
    out
}

/// Known-good tracking over the plan's outcome ([`known_good::track`]): from the proofs the
/// plan leaves (a revision set aside in this pass lost its mark) and the checkpoints it
/// keeps on disk (a removed checkpoint's proof goes with it).
fn track_known_good(inputs: &PlanInputs<'_>, now: Timestamp, out: &mut Plan) {
    let removed: BTreeSet<&PodId> = out.removes.iter().map(|r| &r.id).collect();
    let kept: BTreeSet<PodId> = (inputs.disk.keys())
        .chain(out.writes.iter())
        .filter(|id| !removed.contains(id))
        .cloned()
        .collect();
    let synced = matches!(inputs.api, ApiView::Synced { .. });
    let before = known_good::Proofs {
        // The lineages' outcome: what they set aside.
        known_good: std::mem::take(&mut out.state.known_good),
        ready_since: inputs.state.ready_since.clone(),
        content_seen: inputs.state.content_seen.clone(),
    };
    let tracked = known_good::track(&before, inputs.contents, inputs.ready, &kept, synced, now);
    out.state.known_good = tracked.proofs.known_good;
    out.state.ready_since = tracked.proofs.ready_since;
    out.state.content_seen = tracked.proofs.content_seen;
    out.known_good_at = tracked.next;
}

/// The plan's actions and journal, before known-good tracking.
fn actions(inputs: &PlanInputs<'_>, now: Timestamp) -> Plan {
    let synced = matches!(inputs.api, ApiView::Synced { .. });
    let rows = rows::rows(inputs);
    let mut out = Plan {
        state: PersistentState {
            absent_since: rows
                .iter()
                .filter_map(|row| absent_since(row, synced, now).map(|t| (row.id.clone(), t)))
                .collect(),
            // Tracked once the actions are planned (`track_known_good`).
            known_good: inputs.state.known_good.clone(),
            ready_since: inputs.state.ready_since.clone(),
            content_seen: inputs.state.content_seen.clone(),
            // Set below, per lineage.
            handoffs: BTreeMap::new(),
            rejected: BTreeMap::new(),
            restarts_seen: BTreeMap::new(),
            suspended: BTreeMap::new(),
            self_gc_since: None,
            // Set below, by the lineages.
            marks_unknown: false,
            // Set by a synced pass's self-GC; a pass that reads nothing says what was said.
            self_gc_deferred: if synced {
                Vec::new()
            } else {
                inputs.state.self_gc_deferred.clone()
            },
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

    let lineages::Lineages {
        passes: lineages,
        members,
        handoffs,
        handoff_at,
        set_aside,
    } = lineages::plan(inputs, &rows, &written, now, &mut out.state);
    (out.handoffs, out.handoff_at, out.set_aside) = (handoffs, handoff_at, set_aside);

    // Self-GC: the agent's own pod is gone from a synced view, no rolled pod replaces it,
    // and a successful read says its DaemonSet is deleted or no longer runs it here, for
    // the grace period at least (issue 36: only positive evidence removes).
    let self_parent_present = rows.iter().any(|row| row.is_self && row.parent.is_some());
    out.state.self_gc_since = self_gc_since(inputs, synced && !self_parent_present, now);
    if synced && !self_parent_present {
        let own = rows.iter().filter(|row| row.is_self && row.disk.is_some());
        let since = out.state.self_gc_since;
        let due_at = own.filter_map(|row| self_gc_at(row, inputs, since, now)).min();
        let deferred = if due_at.is_some_and(|at| now >= at) {
            self_gc_deferred(inputs, &rows)
        } else {
            BTreeSet::new()
        };
        if due_at.is_some_and(|at| now >= at) && !deferred.is_empty() {
            // Everything else goes; the serving copies, and the agent's own checkpoint with
            // the process running this plan, stay until they may go too.
            let why = self_gc_reason(inputs.scheduling);
            for row in rows.iter().filter(|row| row.disk.is_some()) {
                let state = if row.is_self {
                    CheckpointState::SelfActive
                } else if deferred.contains(row.id) {
                    CheckpointState::Active
                } else {
                    out.removes.push(Removal {
                        id: row.id.clone(),
                        reason: RemovalReason::SelfGc(why.clone()),
                        is_self: false,
                    });
                    out.state.absent_since.remove(row.id);
                    CheckpointState::Removed
                };
                out.states.insert(row.id.clone(), state);
            }
            // Nothing new is checkpointed on a node the agent leaves.
            out.writes.clear();
            out.at_stake = true;
            out.self_gc_deferred = deferred.into_iter().cloned().collect();
            out.state.self_gc_deferred.clone_from(&out.self_gc_deferred);
            return out;
        }
        if due_at.is_some_and(|at| now >= at) {
            let why = self_gc_reason(inputs.scheduling);
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
            out.state.suspended.clear();
            out.state.self_gc_since = None;
            out.watch_restarts.clear();
            out.set_aside.clear();
            return out;
        }
        out.self_gc_at = due_at;
    }

    // A current pod of the agent's own DaemonSet whose static copy is in the kubelet's
    // manifest directory: it supersedes the agent's older checkpoints. Stored but not yet
    // active (its start failed, or this pass writes it) is no evidence that the node keeps
    // a static copy of the agent, so the older one stays until the next pass sees it.
    let self_successor = rows.iter().find(|row| {
        row.is_self
            && row.parent.is_some()
            && row.has_inactive()
            && row.disk.is_some_and(|d| d.active.is_some())
    });
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
                // is checkpointed and active, otherwise kept (a rollout never triggers self-GC).
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

/// Since when successful reads have said that the agent's own DaemonSet is deleted or no
/// longer targets this node: started by the first such read (a time later than now, the
/// clock gone back, restarts at now), cleared by one saying targeted or by the agent's own
/// pod listed again; a failed read (`Unknown`) or a view that is not synced keeps it.
fn self_gc_since(inputs: &PlanInputs<'_>, own_pod_gone: bool, now: Timestamp) -> Option<Timestamp> {
    let previous = inputs.state.self_gc_since.map(|t| t.min(now));
    match inputs.api {
        ApiView::Synced { .. } if !own_pod_gone => None,
        ApiView::Synced { .. } => match inputs.scheduling {
            SelfScheduling::Deleted | SelfScheduling::Descheduled(_) => previous.or(Some(now)),
            SelfScheduling::Targeted => None,
            SelfScheduling::Unknown(_) => previous,
        },
        ApiView::Unreachable | ApiView::Reachable => previous,
    }
}

/// Why self-GC removes (the DaemonSet's reading); empty for a scheduling that never
/// self-GCs (`self_gc_at`).
fn self_gc_reason(scheduling: &SelfScheduling) -> String {
    match scheduling {
        SelfScheduling::Descheduled(why) => why.clone(),
        SelfScheduling::Deleted => "the agent's DaemonSet is deleted".to_owned(),
        SelfScheduling::Unknown(_) | SelfScheduling::Targeted => String::new(),
    }
}

/// The checkpoints a due self-GC leaves in place (issue 36): each active one that is this
/// node's serving copy of a DaemonSet lineage that still targets the node (or whose
/// DaemonSet cannot be read: `live`), while no pod of that lineage runs here (or the
/// runtime cannot tell). After a failed handoff that copy may be the node's only working
/// API server, so the agent's own checkpoint stays with it. None on a Node marked
/// [`ANNOTATION_DECOMMISSION`](crate::ANNOTATION_DECOMMISSION): the operator retires the
/// node, every checkpoint goes.
fn self_gc_deferred<'a>(inputs: &PlanInputs<'_>, rows: &[Row<'a>]) -> BTreeSet<&'a PodId> {
    if inputs.decommissioned {
        return BTreeSet::new();
    }
    let lineage_of = |row: &Row<'_>| {
        let owner = (row.parent.and_then(|p| p.owner.as_ref())).or_else(|| {
            row.disk
                .and_then(DiskCheckpoint::meta)
                .and_then(|m| m.owner.as_ref())
        });
        Some(Lineage::of(row.id, owner)).filter(|l| matches!(l, Lineage::DaemonSet { .. }))
    };
    let runs_here: BTreeSet<Lineage> = (rows.iter())
        .filter(|row| row.runs == Some(true))
        .filter_map(lineage_of)
        .collect();
    (rows.iter())
        .filter(|row| !row.is_self && row.allowed && row.disk.is_some_and(|d| d.active.is_some()))
        .filter(|row| {
            lineage_of(row)
                .is_some_and(|lineage| inputs.live.contains(&lineage) && !runs_here.contains(&lineage))
        })
        .map(|row| row.id)
        .collect()
}

/// When the agent's own checkpoint `row` (its pod absent from a synced view) makes this
/// a self-GC plan; `None`: not while the scheduling stays as it is. Only a read that
/// succeeded and says deleted or descheduled counts, and never sooner than the grace
/// period after the first such read (`since`), nor after the agent's own pod left. An
/// unknown scheduling keeps everything whatever the strategy says (issue 36's rule: a
/// failed, forbidden or unreadable observation never removes).
fn self_gc_at(
    row: &Row<'_>,
    inputs: &PlanInputs<'_>,
    since: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    match inputs.scheduling {
        SelfScheduling::Targeted | SelfScheduling::Unknown(_) => None,
        SelfScheduling::Deleted | SelfScheduling::Descheduled(_) => {
            let left = absent_since(row, true, now).unwrap_or(now);
            Some(left.max(since.unwrap_or(now)).saturating_add(inputs.grace))
        }
    }
}

#[cfg(test)]
mod tests;
