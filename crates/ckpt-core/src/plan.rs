//! The planner: a pure function from what the agent observes to what it must do.
//!
//! [`plan`] takes the API view, the local view, the checkpoints on disk, the sanitized
//! content each parent should have, GC verdicts and the persisted state, and returns a
//! [`Plan`]: writes, then stops, starts and removes (each sorted), the updated
//! persistent state, and the state of every checkpoint for reporting.
//!
//! The rules (DESIGN §3.3, §3.5), and where they differ from bootkube on purpose:
//! - **Activate** an inactive checkpoint only when the API server is unreachable and the
//!   parent is not running locally (an unknown runtime counts as not running here:
//!   availability first). bootkube also activated when the API listed a parent that was
//!   merely not started yet, which started duplicate static API servers.
//! - **Stay active** while the parent does not run locally, even once the API is back
//!   (it may be served by this very checkpoint). **Deactivate** when the parent runs.
//! - With the runtime unknown and the API reachable, nothing is started or stopped.
//! - **Remove** only on a synced API view, per the GC strategy's verdict.
//! - **Self** is always active, never stopped, follows its newest parent, is superseded
//!   by a rolled pod of its own DaemonSet, and is removed last, on a self-GC plan only.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::checkpoint::CheckpointMeta;
use crate::gc::{GcDecision, GcVerdict, Orphan};
use crate::identity::{ControllerOwner, PodId, SelfIdentity};
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
    },
}

impl LocalView {
    fn runs(&self, id: &PodId) -> Option<bool> {
        match self {
            LocalView::Unknown => None,
            LocalView::Known { running, .. } => Some(running.contains(id)),
        }
    }
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
    fn meta(&self) -> Option<&CheckpointMeta> {
        self.inactive.as_ref().or(self.active.as_ref()).map(|c| &c.meta)
    }
}

/// State the planner keeps across passes and restarts (the state journal).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistentState {
    /// Since when each checkpoint's parent has been absent from synced API views.
    #[serde(with = "pod_id_map")]
    pub absent_since: BTreeMap<PodId, Timestamp>,
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
}

/// Why a checkpoint is removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemovalReason {
    /// The GC strategy decided (its reason attached).
    Gc(String),
    /// An older checkpoint of the agent itself, replaced by a rolled pod of its DaemonSet.
    SupersededSelf(PodId),
    /// Self-GC: the agent's own pod is no longer scheduled here; everything goes.
    SelfGc,
}

/// A checkpoint to remove: secrets, configmaps, projected data, inactive, then active.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    /// Whose checkpoint.
    pub id: PodId,
    /// Why.
    pub reason: RemovalReason,
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
    /// The persistent state to save after executing.
    pub state: PersistentState,
    /// Every checkpoint's state after the pass.
    pub states: BTreeMap<PodId, CheckpointState>,
}

impl Plan {
    /// Whether the plan changes anything on disk.
    pub fn is_noop(&self) -> bool {
        self.writes.is_empty() && self.stops.is_empty() && self.starts.is_empty() && self.removes.is_empty()
    }
}

/// The checkpoints on disk whose parents are absent from a synced API view: ask the GC
/// strategy about each, then pass the verdicts to [`plan`]. Empty unless synced.
pub fn orphans(inputs: &PlanInputs<'_>, now: Timestamp) -> Vec<Orphan> {
    let ApiView::Synced { parents } = inputs.api else {
        return Vec::new();
    };
    let absent_since = absent_since(inputs, now);
    inputs
        .disk
        .iter()
        .filter(|(id, _)| !parents.contains_key(*id))
        .map(|(id, disk)| {
            let meta = disk.meta();
            Orphan {
                id: id.clone(),
                parent_uid: meta.and_then(|m| m.parent_uid.clone()),
                owner: meta.and_then(|m| m.owner.clone()),
                is_self: is_self(inputs, id),
                absent_since: absent_since.get(id).copied().unwrap_or(now),
            }
        })
        .collect()
}

/// The persisted "absent since" times, updated: only a synced view sets or clears them;
/// entries for checkpoints no longer on disk are dropped.
fn absent_since(inputs: &PlanInputs<'_>, now: Timestamp) -> BTreeMap<PodId, Timestamp> {
    let previous = &inputs.state.absent_since;
    inputs
        .disk
        .keys()
        .filter_map(|id| match inputs.api {
            ApiView::Synced { parents } if parents.contains_key(id) => None,
            ApiView::Synced { .. } => Some((id.clone(), previous.get(id).copied().unwrap_or(now))),
            _ => previous.get(id).map(|t| (id.clone(), *t)),
        })
        .collect()
}

fn owner_of<'a>(inputs: &PlanInputs<'a>, id: &PodId) -> Option<&'a ControllerOwner> {
    let from_api = match inputs.api {
        ApiView::Synced { parents } => parents.get(id).and_then(|p| p.owner.as_ref()),
        _ => None,
    };
    from_api.or_else(|| {
        inputs
            .disk
            .get(id)
            .and_then(DiskCheckpoint::meta)
            .and_then(|m| m.owner.as_ref())
    })
}

fn is_self(inputs: &PlanInputs<'_>, id: &PodId) -> bool {
    inputs.me.is_self(id, owner_of(inputs, id))
}

/// Plans one pass. Pure: the same inputs and `now` give the same plan, and applying a
/// plan then planning again with the same observations gives no further actions.
pub fn plan(inputs: &PlanInputs<'_>, now: Timestamp) -> Plan {
    let mut out = Plan {
        state: PersistentState {
            absent_since: absent_since(inputs, now),
        },
        ..Plan::default()
    };
    let synced_parents = match inputs.api {
        ApiView::Synced { parents } => Some(parents),
        _ => None,
    };
    let present = |id: &PodId| synced_parents.is_some_and(|p| p.contains_key(id));

    // Writes: only from a synced view, for parents whose stored content differs.
    if let Some(parents) = synced_parents {
        for (id, hash) in inputs.desired {
            let stored = inputs
                .disk
                .get(id)
                .and_then(|d| d.inactive.as_ref())
                .and_then(|c| c.meta.spec_hash.as_ref());
            if parents.contains_key(id) && stored != Some(hash) {
                out.writes.push(id.clone());
            }
        }
    }
    let written_set: BTreeSet<PodId> = out.writes.iter().cloned().collect();
    let written = |id: &PodId| written_set.contains(id);

    let self_ids: BTreeSet<&PodId> = inputs.disk.keys().filter(|id| is_self(inputs, id)).collect();
    let self_parent_present = synced_parents.is_some_and(|p| p.keys().any(|id| is_self(inputs, id)));

    // Self-GC: the agent's own pod is gone from a synced view, no rolled pod replaces it,
    // and the strategy says its time has come.
    if synced_parents.is_some() && !self_parent_present {
        let due = self_ids.iter().any(|id| due(inputs.verdicts.get(*id), now));
        if due {
            let (own, others): (Vec<&PodId>, Vec<&PodId>) =
                inputs.disk.keys().partition(|id| self_ids.contains(id));
            for id in others.into_iter().chain(own) {
                out.removes.push(Removal {
                    id: id.clone(),
                    reason: RemovalReason::SelfGc,
                });
                out.states.insert(id.clone(), CheckpointState::Removed);
            }
            out.writes.clear();
            out.self_gc = true;
            out.state.absent_since.clear();
            return out;
        }
    }

    // A current pod of the agent's own DaemonSet that is already checkpointed: it
    // supersedes the agent's older checkpoints.
    let self_successor = self_ids
        .iter()
        .find(|id| present(id) && inputs.disk.get(**id).is_some_and(|d| d.inactive.is_some()));
    let mut self_removes = Vec::new();
    let ids: BTreeSet<&PodId> = inputs.disk.keys().chain(out.writes.iter()).collect();
    for id in ids {
        let disk = inputs.disk.get(id);
        let has_inactive = disk.is_some_and(|d| d.inactive.is_some()) || written(id);
        let has_active = disk.is_some_and(|d| d.active.is_some());
        let deadline = |verdict: Option<&GcDecision>| match verdict.map(|v| v.verdict) {
            Some(GcVerdict::RemoveAt(t)) => Some(t),
            _ => None,
        };

        if self_ids.contains(id) || (written(id) && is_self(inputs, id)) {
            if synced_parents.is_some() && !present(id) {
                // An older pod of the agent's own DaemonSet: superseded once a current one
                // is checkpointed, otherwise kept (a rollout never triggers self-GC).
                if let Some(successor) = self_successor {
                    self_removes.push(Removal {
                        id: id.clone(),
                        reason: RemovalReason::SupersededSelf((*successor).clone()),
                    });
                    out.states.insert(id.clone(), CheckpointState::Removed);
                    continue;
                }
            }
            let stale = match disk.and_then(|d| d.inactive.as_ref().zip(d.active.as_ref())) {
                Some((inactive, active)) => inactive.digest != active.digest,
                None => true,
            };
            if has_inactive && (written(id) || !has_active || stale) {
                out.starts.push(id.clone());
            }
            out.states.insert(id.clone(), CheckpointState::SelfActive);
            continue;
        }

        let verdict = if synced_parents.is_some() && !present(id) {
            inputs.verdicts.get(id)
        } else {
            None
        };
        if due(verdict, now) {
            let reason = verdict.map(|v| v.reason.clone()).unwrap_or_default();
            out.removes.push(Removal {
                id: id.clone(),
                reason: RemovalReason::Gc(reason),
            });
            out.states.insert(id.clone(), CheckpointState::Removed);
            continue;
        }

        let runs = inputs.local.runs(id);
        let active_after = match (runs, inputs.api) {
            // The parent runs: the checkpoint steps aside.
            (Some(true), _) => false,
            // Not running (or unknown) and no API: availability first.
            (_, ApiView::Unreachable) => has_inactive || has_active,
            // Not running, API back: an active checkpoint stays; nothing new starts.
            (Some(false), _) => has_active,
            // Unknown runtime with a reachable API: change nothing.
            (None, _) => has_active,
        };
        if has_active && !active_after {
            out.stops.push(id.clone());
        }
        if !has_active && active_after && has_inactive {
            out.starts.push(id.clone());
        }
        let state = match (active_after && (has_active || has_inactive), deadline(verdict)) {
            (true, Some(t)) => CheckpointState::ActiveGrace(t),
            (true, None) => CheckpointState::Active,
            (false, Some(t)) => CheckpointState::InactiveGrace(t),
            (false, None) => CheckpointState::Inactive,
        };
        out.states.insert(id.clone(), state);
    }
    // The agent's own old checkpoints go last: removing the active copy may stop the
    // process that runs this very plan.
    out.removes.extend(self_removes);
    for removal in &out.removes {
        out.state.absent_since.remove(&removal.id);
    }
    out
}

fn due(verdict: Option<&GcDecision>, now: Timestamp) -> bool {
    match verdict.map(|v| v.verdict) {
        Some(GcVerdict::RemoveNow) => true,
        Some(GcVerdict::RemoveAt(deadline)) => now >= deadline,
        Some(GcVerdict::Keep) | None => false,
    }
}

/// JSON object keys must be strings: store the map as a list of entries.
mod pod_id_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::identity::PodId;
    use crate::time::Timestamp;

    #[derive(Serialize, Deserialize)]
    struct Entry {
        namespace: String,
        name: String,
        since: Timestamp,
    }

    pub(super) fn serialize<S: Serializer>(
        map: &BTreeMap<PodId, Timestamp>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let entries: Vec<Entry> = map
            .iter()
            .map(|(id, since)| Entry {
                namespace: id.namespace.clone(),
                name: id.name.clone(),
                since: *since,
            })
            .collect();
        entries.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<PodId, Timestamp>, D::Error> {
        let entries = Vec::<Entry>::deserialize(d)?;
        Ok(entries
            .into_iter()
            .map(|e| (PodId::new(e.namespace, e.name), e.since))
            .collect())
    }
}

#[cfg(test)]
mod tests;
