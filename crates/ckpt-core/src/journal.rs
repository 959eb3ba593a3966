//! The state journal's schema: what the planner keeps across passes and restarts
//! ([`PersistentState`]) and the entries it holds. `ckpt-store` writes it as JSON; an
//! older journal (without the newer maps) still reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::identity::PodId;
use crate::time::Timestamp;

/// State the planner keeps across passes and restarts (the state journal).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistentState {
    /// Since when each checkpoint's parent has been absent from synced API views.
    #[serde(with = "absent_since_map")]
    pub absent_since: BTreeMap<PodId, Timestamp>,
    /// The known-good content of each parent: proven by a minute Ready with it on synced
    /// views ([`KNOWN_GOOD_AFTER`](crate::KNOWN_GOOD_AFTER)).
    #[serde(default, with = "pod_id_map")]
    pub known_good: BTreeMap<PodId, SpecSince>,
    /// Since when each parent has been Ready with content not proven yet.
    #[serde(default, with = "pod_id_map")]
    pub ready_since: BTreeMap<PodId, SpecSince>,
    /// When each parent's current content was first seen, per part: what a proof counts
    /// from (issue 36: a rotated Secret is not proven by a pod that never read it).
    #[serde(default, with = "pod_id_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub content_seen: BTreeMap<PodId, ContentSeen>,
    /// Handoffs under way from a known-good checkpoint to the newest revision of its
    /// lineage, by the newest revision, since when (ARCHITECTURE.md, the handoff).
    #[serde(default, with = "pod_id_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub handoffs: BTreeMap<PodId, HandoffRecord>,
    /// Newest revisions whose handoff failed, with the content that failed, since when,
    /// and how many of their handoffs failed (the retry's back-off).
    #[serde(default, with = "pod_id_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub rejected: BTreeMap<PodId, HandoffRecord>,
    /// The restart count of each active revision with a fallback, as first seen in this
    /// outage (ARCHITECTURE.md, a known-good revision that crash-loops).
    #[serde(default, with = "pod_id_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub restarts_seen: BTreeMap<PodId, RestartsSeen>,
    /// When a successful read first said that the agent's own DaemonSet is deleted or no
    /// longer targets this node: self-GC comes no sooner than the grace period after it
    /// (issue 36: one mistaken edit must not wipe the node in a pass). Cleared by a read
    /// saying targeted; a failed read neither starts nor clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_gc_since: Option<Timestamp>,
    /// The journal was lost (unreadable at start, set aside): which contents were
    /// known-good and which handoffs were rejected is not known, so a missing mark proves
    /// nothing. While set, an older revision that is active serves on until the lineage's
    /// newest parent is Ready on a synced view (no handoff), and no revision is set aside;
    /// cleared by a synced pass in which no revision is held so (ARCHITECTURE.md,
    /// Known-good content).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub marks_unknown: bool,
    /// A self-GC is due but held back for these active checkpoints, each serving a
    /// DaemonSet that still targets this node (the agent's own checkpoint stays with them):
    /// for `inspect`, which reads no API. Rewritten by every pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub self_gc_deferred: Vec<PodId>,
    /// Known-good revisions set aside because they crash-looped while active, their marks
    /// suspended, not dropped (issue 36: restarts alone never take a mark for good). While
    /// the API stays unreachable the lineage runs an older known-good revision, on trial:
    /// if it crash-loops too, the restarts are the environment's (etcd without quorum after
    /// a multi-master power cut), so the suspended one runs again and nothing more is set
    /// aside. The first pass that reaches the API ends the trial: a suspended mark goes for
    /// good (the older revision brought the API back), one restored stays. ARCHITECTURE.md,
    /// a known-good revision that crash-loops.
    #[serde(default, with = "pod_id_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub suspended: BTreeMap<PodId, Suspension>,
}

/// A known-good revision's mark suspended because it crash-looped while active.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspension {
    /// When it was set aside.
    pub since: Timestamp,
    /// The older revision run instead crash-looped too: the mark holds again, and the
    /// lineage sets nothing more aside until the API is reached.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed_alike: bool,
}

/// A handoff to a newest revision's pod: under way since, or rejected since, with its
/// content, and how many handoffs of that pod failed before (under way) or in all
/// (rejected; journals from before retries say 0, read as 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffRecord {
    /// The newest revision's spec hash.
    pub spec_hash: String,
    /// When the handoff started, or failed.
    pub since: Timestamp,
    /// Failed handoffs of the pod.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
}

// serde's `skip_serializing_if` passes a reference.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A content (spec hash) and a time: when it became known-good, or since when its parent
/// has been Ready with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecSince {
    /// The checkpoint's spec hash.
    pub spec_hash: String,
    /// When.
    pub since: Timestamp,
}

/// A parent's content parts ([`ContentParts`](crate::ContentParts)) and when each was
/// first seen on a synced view. A part that was the pod's content when the agent first saw
/// the pod has no time: it counts as read at start, as every container started with it as
/// far as the agent can tell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentSeen {
    /// The pod's UID: a pod of the same name with another one is a first sighting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The hash of the part read at start.
    pub read_at_start: String,
    /// When it changed under the running pod: only containers started since prove it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at_start_since: Option<Timestamp>,
    /// The hash of the part the kubelet updates in place.
    pub updated_in_place: String,
    /// When it changed under the running pod: readiness proves it only once the kubelet
    /// could have synced it ([`KUBELET_SYNC_ALLOWANCE`](crate::KUBELET_SYNC_ALLOWANCE)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_in_place_since: Option<Timestamp>,
}

/// An active revision's restart count when the agent first saw it in this outage (the
/// journal's `restarts_seen`): what the crash-loop count starts from. The CRI count itself may
/// start anywhere: a checkpoint activated again with the same content is the same static
/// pod to the kubelet, whose dead containers from the last outage carry their count on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartsSeen {
    /// The count first seen.
    pub first: u32,
    /// When.
    pub since: Timestamp,
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
