//! What the observer looks up before a pass is decided, from what it already holds (the
//! pods listed, the checkpoints on disk): the Secrets and ConfigMaps to watch
//! ([`required_by_namespace`]), the owners whose existence the GC strategy may ask about
//! ([`orphan_owners`]), the DaemonSets to fetch with this node ([`daemon_set_lookups`],
//! [`scheduling_lookup`]), and the namespaces outside the allow-list whose running pods the
//! local view reports ([`local_namespaces_outside`]). `ckpt-watch` and the agent call these; [`assess`](crate::assess) reads the
//! answers from the [`Observation`](crate::Observation).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::identity::{ControllerOwner, NamespaceAllowList, PodId, SelfIdentity, has_completed, is_parent};
use crate::observation::{ApiState, DiskCheckpoint, OwnerKey};
use crate::references::{RequiredObjects, over_watch_budget, required_objects};

/// What the objects of every parent in `pods` need, by allowed namespace (each allowed
/// namespace present, possibly empty): what the Secret/ConfigMap watches must cover. A
/// parent past the node's watch budget (refused by [`assess`](crate::assess)) is left out;
/// `me` is the agent, whose own pod comes first in it.
pub fn required_by_namespace(
    pods: &BTreeMap<PodId, Arc<Pod>>,
    allowed: &NamespaceAllowList,
    me: &SelfIdentity,
) -> BTreeMap<String, RequiredObjects> {
    let mut out: BTreeMap<String, RequiredObjects> = (allowed.namespaces())
        .map(|ns| (ns.to_owned(), RequiredObjects::default()))
        .collect();
    // The parents `assess` checkpoints, in its order (a completed one never is).
    let parents = || (pods.iter()).filter(|(_, pod)| is_parent(pod, allowed) && !has_completed(pod));
    // Refused in `assess`: nothing of them is watched.
    let over_budget = over_watch_budget(parents().map(|(id, pod)| (id, &**pod)), me);
    for (id, pod) in parents().filter(|(id, _)| !over_budget.contains_key(*id)) {
        let required = required_objects(pod);
        let ns = out.entry(id.namespace.to_string()).or_default();
        ns.secrets.extend(required.secrets);
        ns.config_maps.extend(required.config_maps);
    }
    out
}

/// The namespaces outside the allow-list where the local view must still say what runs:
/// those of active checkpoints (not the agent's own), each kept until its parent is seen
/// running (ARCHITECTURE.md, Planner rules). A namespace removed from `--namespaces` is
/// no longer watched on the API, and without this its active checkpoints would stay for
/// good. Only whether a parent runs is read there; nothing of it is checkpointed.
pub fn local_namespaces_outside(
    disk: &BTreeMap<PodId, DiskCheckpoint>,
    allowed: &NamespaceAllowList,
    me: &SelfIdentity,
) -> BTreeSet<String> {
    (disk.iter())
        .filter(|(id, d)| d.active.is_some() && !allowed.allows(&id.namespace))
        .filter(|(id, d)| !me.is_self(id, d.meta().and_then(|m| m.owner.as_ref())))
        .map(|(id, _)| id.namespace.to_string())
        .collect()
}

/// The owners to look up before deciding: those of checkpoints on disk whose parents
/// are absent from a synced view (empty unless synced). Orphan candidates are known
/// before deciding; their owners' status is an [`Observation`](crate::Observation) fact.
pub fn orphan_owners(
    api: ApiState,
    pods: &BTreeMap<PodId, Arc<Pod>>,
    disk: &BTreeMap<PodId, DiskCheckpoint>,
    allowed: &NamespaceAllowList,
) -> BTreeSet<OwnerKey> {
    if api != ApiState::Synced {
        return BTreeSet::new();
    }
    disk.iter()
        .filter(|(id, _)| allowed.allows(&id.namespace))
        .filter(|(id, _)| !pods.get(*id).is_some_and(|pod| is_parent(pod, allowed)))
        .filter_map(|(id, d)| Some(OwnerKey::new(&id.namespace, d.meta()?.owner.as_ref()?)))
        .collect()
}

/// The agent's own DaemonSet fetched by name, if its own pod is to be looked for: on a
/// synced view, with the agent's own checkpoint on disk, no own pod listed and its
/// controller known to be a DaemonSet. `ckpt-watch` fetches it (and this node) before
/// deciding.
pub fn scheduling_lookup(
    api: ApiState,
    pods: &BTreeMap<PodId, Arc<Pod>>,
    disk: &BTreeMap<PodId, DiskCheckpoint>,
    me: &SelfIdentity,
) -> Option<OwnerKey> {
    if api != ApiState::Synced {
        return None;
    }
    let owner = own_owner(me, pods, disk)?;
    // One identity with the learned owner, not a clone per pod.
    let me = me.clone().with_owner(Some(owner));
    let owner = me.owner.as_ref()?;
    let own_pod = (pods.iter()).any(|(id, pod)| me.is_self(id, ControllerOwner::of(pod).as_ref()));
    let own_checkpoint = (disk.iter()).any(|(id, d)| me.is_self(id, d.meta().and_then(|m| m.owner.as_ref())));
    (owner.kind == "DaemonSet" && !own_pod && own_checkpoint).then(|| OwnerKey::new(&me.namespace, owner))
}

/// The DaemonSets to fetch by name before deciding (`ckpt-watch` fetches them and this
/// node): the agent's own while its own pod is gone ([`scheduling_lookup`]), and the
/// DaemonSets of checkpoints whose pods are gone from a synced view, whatever the GC
/// strategy: whether such a DaemonSet still targets this node tells a rollout, an eviction
/// or a controller outage from the end of the workload here (ARCHITECTURE.md, a lineage
/// lives while its DaemonSet targets this node).
/// While the agent's own pod is gone, also the DaemonSets of the active checkpoints: a
/// due self-GC spares one that serves a DaemonSet still targeting this node (its pod may
/// be listed, as after a failed handoff). Empty unless synced, and, on a node whose
/// parents all run, empty.
pub fn daemon_set_lookups(
    api: ApiState,
    pods: &BTreeMap<PodId, Arc<Pod>>,
    disk: &BTreeMap<PodId, DiskCheckpoint>,
    me: &SelfIdentity,
    allowed: &NamespaceAllowList,
) -> BTreeSet<OwnerKey> {
    let mut keys = orphan_owners(api, pods, disk, allowed);
    keys.retain(|key| key.kind == "DaemonSet");
    let Some(own) = scheduling_lookup(api, pods, disk, me) else {
        return keys;
    };
    keys.extend(
        (disk.iter())
            .filter(|(id, d)| d.active.is_some() && allowed.allows(&id.namespace))
            .filter_map(|(id, d)| Some(OwnerKey::new(&id.namespace, d.meta()?.owner.as_ref()?)))
            .filter(|key| key.kind == "DaemonSet"),
    );
    keys.insert(own);
    keys
}

/// The agent's controller owner, from its own pod in the API or its own checkpoint: it
/// recognises the agent's rolled pods (same DaemonSet, new name). Once known it stays
/// known (`me.owner`).
pub(crate) fn own_owner(
    me: &SelfIdentity,
    pods: &BTreeMap<PodId, Arc<Pod>>,
    disk: &BTreeMap<PodId, DiskCheckpoint>,
) -> Option<ControllerOwner> {
    let own = me.parent_id();
    (pods.get(&own).and_then(|p| ControllerOwner::of(p)))
        .or_else(|| {
            disk.get(&own)
                .and_then(DiskCheckpoint::meta)
                .and_then(|m| m.owner.clone())
        })
        .or_else(|| me.owner.clone())
}
