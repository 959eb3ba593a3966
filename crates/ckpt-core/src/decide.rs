//! One pass's decision, as a pure function: [`Observation`] + disk + persisted state +
//! GC verdicts + clock → [`Decision`] (what to write, stop, start and remove, and what to
//! report). See ARCHITECTURE.md, "The pass".
//!
//! GC strategies may do I/O (they are async plugins), so the decision comes in two pure
//! steps with the strategy in between:
//!
//! 1. [`assess`]: filters the parents, selects the objects each one needs, sanitizes them,
//!    and finds the [`Orphan`]s (checkpoints whose parent is absent from a synced view),
//!    each with the facts a strategy needs (siblings, owner status);
//! 2. the agent asks its strategy about each orphan;
//! 3. [`Assessment::decide`]: plans with the verdicts (the planner, `plan`).
//!
//! [`decide`](decide()) does 1 and 3 in one call, for verdicts known in advance.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::admission::{Inadmissible, KubeletVersion, admit, dropped_fields};
use crate::checkpoint::Checkpoint;
use crate::gc::{GcDecision, GcVerdict, Orphan, Sibling};
use crate::identity::{
    ANNOTATION_CHECKPOINT, ANNOTATION_DECOMMISSION, ControllerOwner, NamespaceAllowList, PodId,
    SelfCheckpointing, SelfIdentity, has_completed, is_parent, retires_when_ready, self_checkpointing,
    template_generation,
};
use crate::journal::PersistentState;
use crate::known_good::{self, ParentContent};
use crate::lookups::own_owner;
use crate::observation::{
    ApiParent, ApiState, ApiView, DiskCheckpoint, Fetched, LocalView, Observation, OwnerKey, SelfScheduling,
};
use crate::plan::{CheckpointState, PlanInputs, Removal, orphans, plan};
use crate::readiness::{Readiness, readiness};
use crate::references::{over_watch_budget, required_objects};
use crate::revisions::{Handoff, Lineage, RevisionSettings, SetAside};
use crate::sanitize::{ContentParts, SanitizeOptions, sanitize};
use crate::scheduling::daemon_pod_continues_running;
use crate::time::Timestamp;

/// The agent's settings that decisions depend on.
#[derive(Clone, Debug)]
pub struct DecideConfig {
    /// `--namespaces`: only pods here are parents.
    pub allowed: NamespaceAllowList,
    /// Who the agent is. Its controller owner, when not set, is learned each pass from its
    /// own pod or checkpoint ([`Report::own_owner`]).
    pub me: SelfIdentity,
    /// `--checkpoint-dir`: the hostPath volumes of checkpoints point below it.
    pub checkpoint_dir: String,
    /// `--checkpoint-grace-period`: self-GC never comes sooner after the agent's own pod
    /// left, nor after the first read saying its DaemonSet is deleted or no longer targets
    /// this node.
    pub grace: Duration,
    /// `--revisions` and `--handoff-timeout`.
    pub revisions: RevisionSettings,
}

/// What one pass does, in execution order (writes → stops → starts → orphan data →
/// removes), with the
/// state to persist and what to report.
#[derive(Clone, Debug, Default)]
pub struct Decision {
    /// Write (or rewrite) these inactive checkpoints, sorted by parent.
    pub writes: Vec<Checkpoint>,
    /// Remove the active manifest (deactivate).
    pub stops: Vec<PodId>,
    /// Copy the inactive manifest into the manifests directory (activate or refresh).
    pub starts: Vec<PodId>,
    /// Remove the checkpoint entirely; the agent's own last.
    pub removes: Vec<Removal>,
    /// Remove the data directories of these pods, which belong to no checkpoint (set by
    /// [`Decision::remove_orphan_data`]); before the removals.
    pub remove_data: Vec<PodId>,
    /// A self-GC decision: once executed, the agent exits.
    pub self_gc: bool,
    /// The persistent state to save after executing.
    pub state: PersistentState,
    /// What to log, count and publish.
    pub report: Report,
}

impl Decision {
    /// Whether the decision changes anything on disk.
    pub fn is_noop(&self) -> bool {
        self.writes.is_empty()
            && self.stops.is_empty()
            && self.starts.is_empty()
            && self.removes.is_empty()
            && self.remove_data.is_empty()
    }

    /// Also removes the data directories, of `with_data` (every pod with data on disk),
    /// that belong to no checkpoint: a crash between a checkpoint's data and its manifest,
    /// or in the middle of its removal, leaves them, and only `drain` removed them. Only
    /// on a synced pass that read every checkpoint file (`everything_read`): otherwise a
    /// checkpoint missing from `disk` may be one whose file could not be read, or whose
    /// parent the view does not show yet. Never the data of a checkpoint on disk, nor of
    /// one this pass writes.
    pub fn remove_orphan_data(
        &mut self,
        with_data: &BTreeSet<PodId>,
        disk: &BTreeMap<PodId, DiskCheckpoint>,
        everything_read: bool,
    ) {
        if !everything_read || self.report.api != Some(ApiState::Synced) {
            return;
        }
        let written: BTreeSet<&PodId> = self.writes.iter().map(|c| &c.parent).collect();
        self.remove_data = (with_data.iter())
            .filter(|id| !disk.contains_key(*id) && !written.contains(id))
            .cloned()
            .collect();
    }

    /// Drops every step on these checkpoints, whose files could not be read this pass (a
    /// failing disk): what is on disk for them is unknown, so nothing may replace,
    /// activate or remove it. A self-GC waits until everything reads again (it removes
    /// every checkpoint and then the agent exits). The state and the report stay.
    pub fn leave_alone(&mut self, unreadable: &BTreeSet<PodId>) {
        if unreadable.is_empty() {
            return;
        }
        self.writes.retain(|c| !unreadable.contains(&c.parent));
        self.stops.retain(|id| !unreadable.contains(id));
        self.starts.retain(|id| !unreadable.contains(id));
        if self.self_gc {
            self.removes.clear();
            self.self_gc = false;
        } else {
            self.removes.retain(|r| !unreadable.contains(&r.id));
        }
    }
}

/// A parent that cannot be represented as a static pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why, naming the field.
    pub message: String,
    /// The parent's UID (the Event's subject).
    pub uid: Option<String>,
}

/// What a pass found worth logging, counting and publishing.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The API state the decision was made in.
    pub api: Option<ApiState>,
    /// Every checkpoint's state after the pass.
    pub states: BTreeMap<PodId, CheckpointState>,
    /// Parents that cannot be checkpointed, with why.
    pub refusals: BTreeMap<PodId, Refusal>,
    /// Parents not checkpointed because the agent may not read what they mount (RBAC):
    /// a wait, not a refusal.
    pub waiting_for_access: BTreeMap<PodId, String>,
    /// Parents whose Secrets/ConfigMaps are still loading, with what is missing.
    pub loading: BTreeMap<PodId, Vec<String>>,
    /// Deliberate differences between a parent and its checkpoint (a dropped token, …).
    pub warnings: BTreeMap<PodId, Vec<String>>,
    /// The parent UID of each checkpoint or parent: the subject of its Events.
    pub parent_uids: BTreeMap<PodId, String>,
    /// The earliest future GC deadline: when to look again.
    pub next_deadline: Option<Timestamp>,
    /// The agent's controller owner, from its own pod in the API or its own checkpoint.
    pub own_owner: Option<ControllerOwner>,
    /// How many checkpoints are on disk before the pass.
    pub on_disk: usize,
    /// Whether the agent's own DaemonSet still targets this node, when it mattered (a
    /// synced view without the agent's own pod).
    pub scheduling: Option<SelfScheduling>,
    /// Whether a change of the API server matters now: a checkpoint (not the agent's own)
    /// that losing the API would activate, or one active now that waits for the API or its
    /// parent. The agent probes it often only then.
    pub at_stake: bool,
    /// Handoff steps in this pass: (the known-good checkpoint, the newest revision whose
    /// parent took or failed to take over, the step).
    pub handoffs: Vec<(PodId, PodId, Handoff)>,
    /// Active revisions whose static pods' restart counts the next passes need.
    pub watch_restarts: BTreeSet<PodId>,
    /// Revisions set aside in this pass because they crash-looped while active.
    pub set_aside: Vec<SetAside>,
    /// A self-GC is due but these active checkpoints serve DaemonSets that still target
    /// this node: they and the agent's own checkpoint stay, everything else was removed.
    /// Each goes when its pod runs here, when its DaemonSet stops targeting the node, on
    /// `drain --force`, or once the Node is marked [`ANNOTATION_DECOMMISSION`].
    pub self_gc_deferred: Vec<PodId>,
    /// Whether the agent's own pod is checkpointed (its static copy after a reboot);
    /// `None` while that cannot be told (see [`self_checkpointing`]).
    pub self_checkpointing: Option<SelfCheckpointing>,
}

impl Report {
    /// Checkpoints by state name (`inactive`, `active-grace`, `self`, …), removed ones
    /// left out: the metric.
    pub fn counts_by_state(&self) -> BTreeMap<&'static str, u64> {
        let mut counts = BTreeMap::new();
        for state in self.states.values() {
            if let Some(name) = state.name() {
                *counts.entry(name).or_default() += 1;
            }
        }
        counts
    }
}

/// The first step of a pass: everything but the GC verdicts. Made by [`assess`].
#[derive(Clone, Debug)]
pub struct Assessment<'a> {
    disk: &'a BTreeMap<PodId, DiskCheckpoint>,
    state: &'a PersistentState,
    now: Timestamp,
    me: SelfIdentity,
    scheduling: SelfScheduling,
    grace: Duration,
    revisions: RevisionSettings,
    allowed: NamespaceAllowList,
    api: ApiView,
    local: &'a LocalView,
    checkpoints: BTreeMap<PodId, Checkpoint>,
    desired: BTreeMap<PodId, String>,
    /// The same parents' content by part, with what proves it.
    contents: BTreeMap<PodId, ParentContent>,
    /// The parents Ready on evidence (synced views only, [`crate::readiness`]).
    ready: BTreeSet<PodId>,
    /// When the next parent's readiness settles: look again then.
    ready_at: Option<Timestamp>,
    /// The parents being deleted (synced views only).
    terminating: BTreeSet<PodId>,
    /// DaemonSet lineages whose DaemonSet still targets this node, or cannot be read
    /// (synced views only).
    live: BTreeSet<Lineage>,
    /// This node's Node, as read in this pass, is marked for decommissioning.
    decommissioned: bool,
    orphans: Vec<Orphan>,
    report: Report,
}

impl Assessment<'_> {
    /// The checkpoints whose parents are absent from a synced view, with the facts a GC
    /// strategy decides on. Empty unless the API is synced.
    pub fn orphans(&self) -> &[Orphan] {
        &self.orphans
    }

    /// The agent's identity as this pass knows it (its controller owner learned).
    pub fn me(&self) -> &SelfIdentity {
        &self.me
    }

    /// Plans the pass with a verdict for each orphan (a missing verdict keeps the
    /// checkpoint).
    pub fn decide(mut self, verdicts: &BTreeMap<PodId, GcDecision>) -> Decision {
        let inputs = PlanInputs {
            api: &self.api,
            local: self.local,
            disk: self.disk,
            desired: &self.desired,
            contents: &self.contents,
            verdicts,
            state: self.state,
            me: &self.me,
            scheduling: &self.scheduling,
            grace: self.grace,
            allowed: &self.allowed,
            ready: &self.ready,
            terminating: &self.terminating,
            revisions: &self.revisions,
            live: &self.live,
            decommissioned: self.decommissioned,
        };
        let planned = plan(&inputs, self.now);
        let now = self.now;
        self.report.next_deadline = (verdicts.values())
            .filter_map(|v| match v.verdict {
                GcVerdict::RemoveAt(t) => Some(t),
                _ => None,
            })
            .chain(planned.self_gc_at)
            .chain(planned.handoff_at)
            .chain(planned.known_good_at)
            .chain(self.ready_at)
            .filter(|t| *t > now)
            .min();
        for (id, state) in &planned.states {
            if *state == CheckpointState::Active && !self.allowed.allows(&id.namespace) {
                self.report.warnings.entry(id.clone()).or_default().push(format!(
                    "namespace {} is not in --namespaces: this active checkpoint is kept (it may be serving) \
                     until its parent is seen running, then removed; it is never activated again",
                    id.namespace
                ));
            }
        }
        self.report.states = planned.states;
        self.report.at_stake = planned.at_stake;
        self.report.handoffs = planned.handoffs;
        self.report.watch_restarts = planned.watch_restarts;
        self.report.set_aside = planned.set_aside;
        self.report.self_gc_deferred = planned.self_gc_deferred;
        let writes = (planned.writes.iter())
            .filter_map(|id| self.checkpoints.remove(id))
            .collect();
        Decision {
            writes,
            stops: planned.stops,
            starts: planned.starts,
            removes: planned.removes,
            remove_data: Vec::new(),
            self_gc: planned.self_gc,
            state: planned.state,
            report: self.report,
        }
    }
}

/// Decides a pass whose GC verdicts are known in advance: [`assess`], then
/// [`Assessment::decide`].
pub fn decide(
    observation: &Observation,
    disk: &BTreeMap<PodId, DiskCheckpoint>,
    state: &PersistentState,
    verdicts: &BTreeMap<PodId, GcDecision>,
    config: &DecideConfig,
    now: Timestamp,
) -> Decision {
    assess(observation, disk, state, config, now).decide(verdicts)
}

/// The first step of a pass: parents, their sanitized checkpoints, the orphans and
/// their facts.
pub fn assess<'a>(
    observation: &'a Observation,
    disk: &'a BTreeMap<PodId, DiskCheckpoint>,
    state: &'a PersistentState,
    config: &DecideConfig,
    now: Timestamp,
) -> Assessment<'a> {
    let synced = observation.api == ApiState::Synced;
    let parents: BTreeMap<&PodId, &Pod> = (observation.pods.iter())
        .filter(|(_, pod)| is_parent(pod, &config.allowed))
        .map(|(id, pod)| (id, pod.as_ref()))
        .collect();
    let mut me = config.me.clone();
    let mut own_owner = own_owner(&me, &observation.pods, disk);
    me.owner.clone_from(&own_owner);
    let own_pod_present = (parents.iter()).any(|(id, pod)| me.is_self(id, ControllerOwner::of(pod).as_ref()));
    let scheduling = if synced && !own_pod_present {
        let (scheduling, replacement) = self_scheduling(observation, &me.namespace, own_owner.as_ref());
        // A DaemonSet of the same name that targets this node took the place of ours
        // (deleted and re-created, `replace --force`): its pods are the agent's own now.
        own_owner = replacement.or(own_owner);
        scheduling
    } else {
        SelfScheduling::Targeted
    };
    // `own_owner` falls back to the known owner: it is `None` only when none was known.
    me.owner.clone_from(&own_owner);
    let mut report = Report {
        api: Some(observation.api),
        own_owner,
        on_disk: disk.len(),
        scheduling: (synced && !own_pod_present).then(|| scheduling.clone()),
        self_checkpointing: self_checkpointing(
            &me,
            &config.allowed,
            synced.then(|| (observation.pods.iter()).map(|(id, pod)| (id, pod.as_ref()))),
        ),
        ..Report::default()
    };
    let checkpoints = if synced {
        // A completed parent is never checkpointed (ARCHITECTURE.md, Planner rules).
        let running: BTreeMap<&PodId, &Pod> = (parents.iter())
            .filter(|(_, pod)| !has_completed(pod))
            .map(|(id, pod)| (*id, *pod))
            .collect();
        sanitize_parents(observation, &running, config, now, &mut report)
    } else {
        BTreeMap::new()
    };
    let (checkpoints, parts): (BTreeMap<PodId, Checkpoint>, BTreeMap<PodId, ContentParts>) = (checkpoints
        .into_iter())
    .map(|(id, (checkpoint, parts))| ((id.clone(), checkpoint), (id, parts)))
    .unzip();
    let desired: BTreeMap<PodId, String> = (checkpoints.iter())
        .map(|(id, c)| (id.clone(), c.spec_hash.clone()))
        .collect();
    let contents: BTreeMap<PodId, ParentContent> = (checkpoints.iter().zip(parts))
        .filter_map(|((id, c), (_, parts))| {
            let pod = parents.get(id)?;
            let content = ParentContent {
                spec_hash: c.spec_hash.clone(),
                parts,
                uid: pod.metadata.uid.clone(),
                started: known_good::containers_started(pod),
            };
            Some((id.clone(), content))
        })
        .collect();
    // Ready on evidence only (crate::readiness): a current status of containers that run
    // now, held for READY_SETTLE unless its content is known to work (its own known-good
    // mark, not suspended, the marks known; or its own checkpoint active with that very
    // content, as after a power cut); one not settled yet is looked at again then.
    let mut ready = BTreeSet::new();
    let mut ready_at: Option<Timestamp> = None;
    for (id, pod) in parents.iter().filter(|_| synced) {
        let containers = match &observation.local {
            LocalView::Known {
                running, containers, ..
            } if running.contains(*id) => containers.get(*id),
            _ => None,
        };
        let proven = !state.marks_unknown
            && !state.suspended.contains_key(*id)
            && (contents.get(*id).zip(state.known_good.get(*id)))
                .is_some_and(|(content, proof)| content.spec_hash == proof.spec_hash);
        let its_own_serves = (disk.get(*id))
            .and_then(|d| d.active.as_ref())
            .and_then(|active| active.meta.spec_hash.as_ref())
            .zip(desired.get(*id))
            .is_some_and(|(active, current)| active == current);
        match readiness(pod, containers, proven || its_own_serves, now) {
            Readiness::Ready => {
                ready.insert((*id).clone());
            }
            Readiness::SettlesAt(t) => ready_at = Some(ready_at.map_or(t, |r| r.min(t))),
            Readiness::NotReady => {}
        }
    }
    let terminating: BTreeSet<PodId> = (parents.iter())
        .filter(|(_, pod)| synced && pod.metadata.deletion_timestamp.is_some())
        .map(|(id, _)| (*id).clone())
        .collect();
    report.parent_uids = (disk.iter())
        .filter_map(|(id, d)| Some((id.clone(), d.meta()?.parent_uid.clone()?)))
        .chain(
            parents
                .iter()
                .filter_map(|(id, p)| Some(((*id).clone(), p.metadata.uid.clone()?))),
        )
        .collect();
    let api = match observation.api {
        ApiState::Unreachable => ApiView::Unreachable,
        // Rejected credentials say nothing about the pods: neither activate nor remove.
        ApiState::Reachable | ApiState::Unauthorized => ApiView::Reachable,
        ApiState::Synced => ApiView::Synced {
            parents: (parents.iter())
                .map(|(id, pod)| {
                    let parent = ApiParent {
                        uid: pod.metadata.uid.clone(),
                        owner: ControllerOwner::of(pod),
                        completed: has_completed(pod),
                        retires_when_ready: retires_when_ready(pod),
                        template_generation: template_generation(pod),
                    };
                    ((*id).clone(), parent)
                })
                .collect(),
        },
    };
    let mut found = orphans(&api, disk, &state.absent_since, &me, &config.allowed, now);
    // Only parents the agent can checkpoint count (`desired` holds the sanitizable ones): a
    // pod that can never be checkpointed must not supersede anything. Grouped by controller
    // once, so a pass stays linear however many orphans share a controller.
    let mut by_controller: BTreeMap<(&str, String), Vec<&PodId>> = BTreeMap::new();
    if !found.is_empty() {
        for (id, pod) in &parents {
            if let Some(owner) = ControllerOwner::of(pod)
                && desired.contains_key(*id)
            {
                (by_controller.entry((&*id.namespace, owner.uid)).or_default()).push(*id);
            }
        }
    }
    for orphan in &mut found {
        let Some(owner) = &orphan.owner else { continue };
        let namespace = &*orphan.id.namespace;
        orphan.owner_status = observation.owner_status(namespace, owner);
        let same_controller = by_controller.get(&(namespace, owner.uid.clone()));
        orphan.siblings = (same_controller.into_iter().flatten())
            .filter(|id| ***id != orphan.id)
            .map(|id| {
                let stored = (disk.get(*id))
                    .and_then(|d| d.inactive.as_ref())
                    .and_then(|c| c.meta.spec_hash.as_ref());
                Sibling {
                    id: (*id).clone(),
                    checkpointed: stored.is_some() && stored == desired.get(*id),
                }
            })
            .collect();
    }
    Assessment {
        disk,
        state,
        now,
        me,
        scheduling,
        grace: config.grace,
        revisions: config.revisions,
        allowed: config.allowed.clone(),
        api,
        local: &observation.local,
        checkpoints,
        desired,
        contents,
        ready,
        ready_at,
        terminating,
        live: if synced {
            live_lineages(observation, disk)
        } else {
            BTreeSet::new()
        },
        decommissioned: synced && decommissioned(&observation.node),
        orphans: found,
        report,
    }
}

/// The DaemonSet lineages ([`Lineage::DaemonSet`]) of the checkpoints on disk whose
/// DaemonSet, as fetched in this pass, still targets this node (the DaemonSet controller's
/// rules, [`daemon_pod_continues_running`]) and still asks for its pods to be checkpointed,
/// or cannot be read. A pod of theirs absent from a synced view is a rollout, an eviction
/// or a controller-manager outage, not the end of the workload here: the planner keeps
/// their revisions whatever the GC strategy says, as it never self-GCs for the agent's own
/// pod being gone.
///
/// Matched by UID: a DaemonSet deleted and re-created under the same name is a new
/// lineage, and the old one's checkpoints are left to the strategy. Only a read that
/// succeeded lets a lineage go (issue 36: a failed, timed-out or forbidden read keeps the
/// last safe state): a DaemonSet whose GET failed, or one that asks for checkpoints while
/// this node's Node cannot be read (or is not registered), keeps its lineage protected. A
/// DaemonSet not looked up is no read at all: the observer looks up every orphan's, so
/// that is never an orphan's, and its lineage is left to the strategy.
fn live_lineages(observation: &Observation, disk: &BTreeMap<PodId, DiskCheckpoint>) -> BTreeSet<Lineage> {
    if observation.daemon_sets.is_empty() {
        return BTreeSet::new();
    }
    let mut owners: BTreeMap<Lineage, &ControllerOwner> = BTreeMap::new();
    for (id, checkpoint) in disk {
        if let Some(owner) = checkpoint.meta().and_then(|m| m.owner.as_ref()) {
            let lineage = Lineage::of(id, Some(owner));
            if matches!(lineage, Lineage::DaemonSet { .. }) {
                owners.entry(lineage).or_insert(owner);
            }
        }
    }
    (owners.into_iter())
        .filter(|(lineage, owner)| {
            let Lineage::DaemonSet { namespace, uid } = lineage else {
                return false;
            };
            match observation.daemon_set(&OwnerKey::new(namespace, owner)) {
                Fetched::Found(ds) => daemon_set_keeps(ds, uid, &observation.node),
                Fetched::Failed(_) => true,
                Fetched::NotFound | Fetched::NotFetched => false,
            }
        })
        .map(|(lineage, _)| lineage)
        .collect()
}

/// Whether this node's Node, read successfully, carries [`ANNOTATION_DECOMMISSION`] `"true"`.
fn decommissioned(node: &Fetched<Node>) -> bool {
    let Fetched::Found(node) = node else {
        return false;
    };
    (node.metadata.annotations.as_ref())
        .and_then(|a| a.get(ANNOTATION_DECOMMISSION))
        .is_some_and(|v| v == "true")
}

/// Whether a DaemonSet read as `ds` keeps the lineage of UID `uid` on this node (`node`, as
/// fetched): the same DaemonSet, asking for checkpoints, and targeting the node or the node
/// unknown.
fn daemon_set_keeps(ds: &DaemonSet, uid: &str, node: &Fetched<Node>) -> bool {
    let template = &ds.spec.template;
    let annotated = (template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(ANNOTATION_CHECKPOINT))
        .is_some_and(|v| v == "true");
    if ds.metadata.uid.as_deref() != Some(uid) || !annotated {
        return false;
    }
    match (node, template.spec.as_ref()) {
        (Fetched::Found(node), Some(spec)) => daemon_pod_continues_running(spec, node).is_ok(),
        (Fetched::Found(_), None) => false,
        // A node that cannot be read (or is not registered) is never a descheduling.
        (Fetched::Failed(_) | Fetched::NotFound | Fetched::NotFetched, _) => true,
    }
}

/// Whether the agent's own DaemonSet targets this node, from the observation; and a
/// same-named DaemonSet that replaced it and targets the node (its owner reference).
fn self_scheduling(
    observation: &Observation,
    namespace: &str,
    owner: Option<&ControllerOwner>,
) -> (SelfScheduling, Option<ControllerOwner>) {
    let unknown = |why: &str| (SelfScheduling::Unknown(why.to_owned()), None);
    let Some(owner) = owner else {
        return unknown("the agent's own controller is not known (no pod and no checkpoint of it)");
    };
    if owner.kind != "DaemonSet" {
        return unknown(&format!(
            "the agent's controller is a {}, not a DaemonSet",
            owner.kind
        ));
    }
    let daemon_set = match observation.daemon_set(&OwnerKey::new(namespace, owner)) {
        Fetched::NotFound => return (SelfScheduling::Deleted, None),
        Fetched::Found(ds) => ds,
        Fetched::NotFetched => return unknown("the agent's DaemonSet was not looked up"),
        Fetched::Failed(why) => return unknown(&format!("cannot read the agent's DaemonSet: {why}")),
    };
    let uid = daemon_set.metadata.uid.as_deref().unwrap_or_default();
    let replacement = (uid != owner.uid).then(|| ControllerOwner {
        uid: uid.to_owned(),
        ..owner.clone()
    });
    let node = match &observation.node {
        Fetched::Found(node) => node,
        // A node that cannot be read means "unknown", never "descheduled".
        Fetched::NotFound => return unknown("this node's Node object does not exist"),
        Fetched::NotFetched => return unknown("this node was not looked up"),
        Fetched::Failed(why) => return unknown(&format!("cannot read this node: {why}")),
    };
    let template = daemon_set.spec.template.spec.as_ref();
    let Some(template) = template else {
        return unknown("the agent's DaemonSet has no pod template");
    };
    match daemon_pod_continues_running(template, node) {
        Ok(()) => (SelfScheduling::Targeted, replacement),
        Err(why) if replacement.is_some() => (
            SelfScheduling::Descheduled(format!(
                "its DaemonSet was replaced by one that does not target this node: {why}"
            )),
            None,
        ),
        Err(why) => (
            SelfScheduling::Descheduled(format!("its DaemonSet no longer targets this node: {why}")),
            None,
        ),
    }
}

/// Sanitizes every parent whose Secrets and ConfigMaps are all known; the others are
/// waits (still loading, or forbidden) or refusals, in the report.
fn sanitize_parents(
    observation: &Observation,
    parents: &BTreeMap<&PodId, &Pod>,
    config: &DecideConfig,
    now: Timestamp,
    report: &mut Report,
) -> BTreeMap<PodId, (Checkpoint, ContentParts)> {
    let options = SanitizeOptions {
        checkpoint_dir: config.checkpoint_dir.clone(),
        checkpointed_at: now,
    };
    let none = Default::default();
    let mut out = BTreeMap::new();
    let mut over_budget = over_watch_budget(parents.iter().map(|(&id, &pod)| (id, pod)), &config.me);
    for (&id, &pod) in parents {
        if let Some(message) = over_budget.remove(id) {
            let refusal = Refusal {
                message,
                uid: pod.metadata.uid.clone(),
            };
            report.refusals.insert(id.clone(), refusal);
            continue;
        }
        // What the model dropped would be missing from the checkpoint: a silent change of
        // what the node runs. The checkpoint on disk, if any, stays.
        if let Some(fields) = observation.unknown_fields.get(id).filter(|f| !f.is_empty()) {
            let refusal = Refusal {
                message: unknown_fields_message(fields),
                uid: pod.metadata.uid.clone(),
            };
            report.refusals.insert(id.clone(), refusal);
            continue;
        }
        let required = required_objects(pod);
        let view = observation.objects.get(&*id.namespace).unwrap_or(&none);
        let unresolved = view.unresolved(&required);
        let loading: Vec<String> = (unresolved.iter())
            .filter(|(r, _)| !view.failed.contains_key(r))
            .map(|(r, why)| format!("{r} ({why})"))
            .collect();
        if !loading.is_empty() {
            report.loading.insert(id.clone(), loading);
            continue;
        }
        // A Secret/ConfigMap we may not read (RBAC) is not a pod that cannot be
        // represented: wait for the permission (the watch retries) and keep whatever
        // checkpoint exists.
        if !unresolved.is_empty() {
            let forbidden: Vec<String> = unresolved.iter().map(|(r, why)| format!("{r}: {why}")).collect();
            let message = format!("cannot read what the pod mounts: {}", forbidden.join("; "));
            report.waiting_for_access.insert(id.clone(), message);
            continue;
        }
        let sanitized = sanitize(pod, &view.select(&required), &options).map_err(|e| e.to_string());
        // Never write what the kubelet would not run: the checkpoint on disk, if any, stays.
        let admitted = sanitized.and_then(|sanitized| {
            admit(
                &sanitized.checkpoint.manifest,
                &config.me.node,
                observation.kubelet,
            )
            .map(|()| sanitized)
            .map_err(|problems| inadmissible_message(&config.me.node, observation.kubelet, &problems))
        });
        match admitted {
            Ok(mut sanitized) => {
                // Dropped from the parent by the same kubelet too: worth a line, no more.
                for dropped in dropped_fields(&sanitized.checkpoint.manifest, observation.kubelet) {
                    sanitized
                        .warnings
                        .push(format!("{dropped} (from the parent too)"));
                }
                if !sanitized.warnings.is_empty() {
                    report.warnings.insert(id.clone(), sanitized.warnings);
                }
                out.insert(id.clone(), (sanitized.checkpoint, sanitized.parts));
            }
            Err(message) => {
                let refusal = Refusal {
                    message,
                    uid: pod.metadata.uid.clone(),
                };
                report.refusals.insert(id.clone(), refusal);
            }
        }
    }
    out
}

/// A refusal's message for a pod with fields the agent's model does not know.
fn unknown_fields_message(fields: &[String]) -> String {
    format!(
        "the pod has fields this agent does not know (the API server is newer than its \
         Kubernetes model), which a checkpoint would lose: {}; upgrade pod-checkpointer to \
         checkpoint it",
        fields.join(", ")
    )
}

/// A refusal's message for a checkpoint the kubelet would not run, naming every field.
fn inadmissible_message(node: &str, kubelet: Option<KubeletVersion>, problems: &[Inadmissible]) -> String {
    let kubelet = kubelet.map_or_else(
        || "version not read yet: the strictest rules".to_owned(),
        |v| v.to_string(),
    );
    let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
    format!(
        "the kubelet of {node} ({kubelet}) would not run the checkpoint as a static pod: {}",
        problems.join("; ")
    )
}

#[cfg(test)]
mod tests;
