//! Known-good content (issue 21, last-known-good revisions, its first part): which
//! checkpoint content each parent has proven to work. A parent's content (its sanitized
//! spec hash) becomes known-good once the parent ran with exactly that content and was
//! Ready for [`KNOWN_GOOD_AFTER`], as seen on synced API views (the pod's `Ready`
//! condition); it stays known-good when the parent moves to new content, until the new one
//! proves itself in turn. The journal keeps both maps, so a restart or a reboot loses no
//! proof.
//!
//! "Ran with that content" depends on how the containers read it (issue 36,
//! [`ContentParts`]): a change to what is read at start (the spec, env, `subPath` mounts)
//! under a running pod is proven only by readiness after every container started since the
//! change; a change the kubelet makes in place (Secret/ConfigMap volumes) only by readiness
//! after [`KUBELET_SYNC_ALLOWANCE`]. The content a pod had when the agent first saw it
//! counts as read at start by its containers.
//!
//! Only a synced view proves anything or breaks a streak of readiness; while the API is
//! not synced, nothing changes. [`crate::revisions`] uses the proof: an activation runs the
//! newest known-good revision, and a parent with unproven content takes over through the
//! health-gated handoff. The planner tracks proofs as its last step, over what the pass
//! keeps on disk.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};

use crate::identity::PodId;
use crate::journal::{ContentSeen, SpecSince};
use crate::sanitize::ContentParts;
use crate::time::Timestamp;

/// How long a parent must be Ready with a content for it to become known-good.
pub const KNOWN_GOOD_AFTER: Duration = Duration::from_secs(60);

/// How long after a Secret/ConfigMap volume's new content is first seen the kubelet may
/// take to write it into the running pod: its pod workers resync every `syncFrequency`
/// (default 1 min) with up to 50 % jitter (90 s), and with the `Cache` change-detection
/// strategy its copy of the object lives up to a TTL (default 1 min) more. A kubelet set up
/// slower than its defaults may prove content it has not written yet.
pub const KUBELET_SYNC_ALLOWANCE: Duration = Duration::from_secs(150);

/// A parent's content as one synced pass sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParentContent {
    /// The checkpoint's spec hash: what a proof is of.
    pub(crate) spec_hash: String,
    /// The same content by how its containers read it.
    pub(crate) parts: ContentParts,
    /// The pod's UID.
    pub(crate) uid: Option<String>,
    /// When its containers started ([`containers_started`]).
    pub(crate) started: Option<Started>,
}

/// When a pod's containers started, as the kubelet reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Started {
    /// The first of every container, init containers included.
    pub(crate) earliest: Timestamp,
    /// The last of the (non-init) containers: from then on all of them run.
    pub(crate) latest: Timestamp,
}

/// The journal's part that [`track`] reads and rewrites.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Proofs {
    /// The known-good content of each parent.
    pub(crate) known_good: BTreeMap<PodId, SpecSince>,
    /// The parents Ready with a content not proven yet, since when.
    pub(crate) ready_since: BTreeMap<PodId, SpecSince>,
    /// When each parent's current content parts were first seen.
    pub(crate) content_seen: BTreeMap<PodId, ContentSeen>,
}

/// The outcome of [`track`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tracked {
    /// The journal's proofs after the pass.
    pub(crate) proofs: Proofs,
    /// When the next streak becomes known-good: look again then.
    pub(crate) next: Option<Timestamp>,
}

/// One pass of tracking. `contents` is each sanitized parent's content; `ready` the parents
/// whose API pod is Ready; `kept` the checkpoints on disk after the pass (a removed
/// checkpoint's proof goes with it); `synced` whether the view is synced.
pub(crate) fn track(
    before: &Proofs,
    contents: &BTreeMap<PodId, ParentContent>,
    ready: &BTreeSet<PodId>,
    kept: &BTreeSet<PodId>,
    synced: bool,
    now: Timestamp,
) -> Tracked {
    fn of_kept<V: Clone>(map: &BTreeMap<PodId, V>, kept: &BTreeSet<PodId>) -> BTreeMap<PodId, V> {
        (map.iter())
            .filter(|(id, _)| kept.contains(*id))
            .map(|(id, v)| (id.clone(), v.clone()))
            .collect()
    }
    let mut out = Tracked {
        proofs: Proofs {
            known_good: of_kept(&before.known_good, kept),
            ready_since: BTreeMap::new(),
            // A parent not sanitized in this pass keeps its record: seeing it again must not
            // count as a first sighting.
            content_seen: of_kept(&before.content_seen, kept),
        },
        next: None,
    };
    if !synced {
        out.proofs.ready_since = of_kept(&before.ready_since, kept);
        return out;
    }
    for (id, content) in contents.iter().filter(|(id, _)| kept.contains(*id)) {
        let seen = sighting(before.content_seen.get(id), content, now);
        let proving_from = proving_from(&seen, content.started);
        out.proofs.content_seen.insert(id.clone(), seen);
        let hash = &content.spec_hash;
        let proven = (out.proofs.known_good.get(id)).is_some_and(|k| &k.spec_hash == hash);
        if proven || !ready.contains(id) {
            continue;
        }
        let since = (before.ready_since.get(id))
            .filter(|r| &r.spec_hash == hash)
            .map_or(now, |r| r.since.min(now));
        let streak = SpecSince {
            spec_hash: hash.clone(),
            since,
        };
        // Not provable yet (no container started since a change read at start): the
        // streak is kept, nothing is due.
        let Some(from) = proving_from else {
            out.proofs.ready_since.insert(id.clone(), streak);
            continue;
        };
        let due = since.max(from).saturating_add(KNOWN_GOOD_AFTER);
        if now >= due {
            let proof = SpecSince {
                spec_hash: hash.clone(),
                since: now,
            };
            out.proofs.known_good.insert(id.clone(), proof);
        } else {
            out.proofs.ready_since.insert(id.clone(), streak);
            out.next = Some(out.next.map_or(due, |next| next.min(due)));
        }
    }
    out
}

/// The record of a parent's content after this pass: a part that changed is stamped with
/// `now`; a pod seen for the first time (or another pod of the same name) is stamped
/// nowhere.
fn sighting(before: Option<&ContentSeen>, content: &ParentContent, now: Timestamp) -> ContentSeen {
    let parts = &content.parts;
    let Some(before) = before.filter(|b| b.uid == content.uid) else {
        return ContentSeen {
            uid: content.uid.clone(),
            read_at_start: parts.read_at_start.clone(),
            read_at_start_since: None,
            updated_in_place: parts.updated_in_place.clone(),
            updated_in_place_since: None,
        };
    };
    let since = |old: &str, new: &str, old_since: Option<Timestamp>| {
        if old == new { old_since } else { Some(now) }
    };
    ContentSeen {
        uid: content.uid.clone(),
        read_at_start: parts.read_at_start.clone(),
        read_at_start_since: since(
            &before.read_at_start,
            &parts.read_at_start,
            before.read_at_start_since,
        ),
        updated_in_place: parts.updated_in_place.clone(),
        updated_in_place_since: since(
            &before.updated_in_place,
            &parts.updated_in_place,
            before.updated_in_place_since,
        ),
    }
}

/// From when readiness proves a parent's content: after every container started since
/// the part read at start changed, and after the kubelet could have synced the part it
/// updates in place. `None`: some container still runs what it read before the change.
fn proving_from(seen: &ContentSeen, started: Option<Started>) -> Option<Timestamp> {
    let after_start = match seen.read_at_start_since {
        None => Timestamp::MIN,
        Some(changed) => {
            let started = started.filter(|s| s.earliest >= changed)?;
            started.latest
        }
    };
    let after_sync = (seen.updated_in_place_since).map_or(Timestamp::MIN, |changed| {
        changed.saturating_add(KUBELET_SYNC_ALLOWANCE)
    });
    Some(after_start.max(after_sync))
}

/// When an API pod's containers started: `None` unless every container runs and every
/// init container started (running or terminated), each with a start time reported.
pub(crate) fn containers_started(pod: &Pod) -> Option<Started> {
    let (spec, status) = (pod.spec.as_ref()?, pod.status.as_ref()?);
    let init = start_times(
        spec.init_containers.iter().flatten(),
        status.init_container_statuses.as_deref(),
        true,
    )?;
    let main = start_times(&spec.containers, status.container_statuses.as_deref(), false)?;
    Some(Started {
        earliest: init.iter().chain(&main).copied().min()?,
        latest: main.iter().copied().max()?,
    })
}

/// Each container's start time, or `None` if one has none (an init container's may be
/// that of its finished run).
fn start_times<'a>(
    containers: impl IntoIterator<Item = &'a Container>,
    statuses: Option<&[ContainerStatus]>,
    init: bool,
) -> Option<Vec<Timestamp>> {
    (containers.into_iter())
        .map(|c| {
            let status = statuses?.iter().find(|s| s.name == c.name)?;
            let state = status.state.as_ref()?;
            let running = state.running.as_ref().and_then(|r| r.started_at.as_ref());
            let finished = (state.terminated.as_ref())
                .filter(|_| init)
                .and_then(|t| t.started_at.as_ref());
            running.or(finished).map(|t| Timestamp(t.0.as_millisecond()))
        })
        .collect()
}

#[cfg(test)]
mod tests;
