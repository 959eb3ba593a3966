//! Known-good content (issue 21, last-known-good revisions, its first part): which
//! checkpoint content each parent has proven to work. A parent's content (its sanitized
//! spec hash) becomes known-good once the parent ran with exactly that content and was
//! Ready for [`KNOWN_GOOD_AFTER`], as seen on synced API views (the pod's `Ready`
//! condition); it stays known-good when the parent moves to new content, until the new one
//! proves itself in turn. The journal keeps both maps, so a restart or a reboot loses no
//! proof.
//!
//! Only a synced view proves anything or breaks a streak of readiness; while the API is
//! not synced, nothing changes. [`crate::revisions`] uses the proof: an activation runs the
//! newest known-good revision, and a parent with unproven content takes over through the
//! health-gated handoff. The planner tracks proofs as its last step, over what the pass
//! keeps on disk.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::identity::PodId;
use crate::journal::SpecSince;
use crate::time::Timestamp;

/// How long a parent must be Ready with a content for it to become known-good.
pub const KNOWN_GOOD_AFTER: Duration = Duration::from_secs(60);

/// The outcome of [`track`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tracked {
    /// The known-good content of each parent.
    pub(crate) known_good: BTreeMap<PodId, SpecSince>,
    /// The parents Ready with a content not proven yet, since when.
    pub(crate) ready_since: BTreeMap<PodId, SpecSince>,
    /// When the next of those becomes known-good: look again then.
    pub(crate) next: Option<Timestamp>,
}

/// One pass of tracking. `desired` is each sanitized parent's content; `ready` the parents
/// whose API pod is Ready; `kept` the checkpoints on disk after the pass (a removed
/// checkpoint's proof goes with it); `synced` whether the view is synced.
pub(crate) fn track(
    known_good: &BTreeMap<PodId, SpecSince>,
    ready_since: &BTreeMap<PodId, SpecSince>,
    desired: &BTreeMap<PodId, String>,
    ready: &BTreeSet<PodId>,
    kept: &BTreeSet<PodId>,
    synced: bool,
    now: Timestamp,
) -> Tracked {
    let mut out = Tracked {
        known_good: (known_good.iter())
            .filter(|(id, _)| kept.contains(*id))
            .map(|(id, k)| (id.clone(), k.clone()))
            .collect(),
        ready_since: BTreeMap::new(),
        next: None,
    };
    if !synced {
        out.ready_since = (ready_since.iter())
            .filter(|(id, _)| kept.contains(*id))
            .map(|(id, r)| (id.clone(), r.clone()))
            .collect();
        return out;
    }
    for (id, hash) in desired.iter().filter(|(id, _)| kept.contains(*id)) {
        let proven = out.known_good.get(id).is_some_and(|k| &k.spec_hash == hash);
        if proven || !ready.contains(id) {
            continue;
        }
        let since = (ready_since.get(id))
            .filter(|r| &r.spec_hash == hash)
            .map_or(now, |r| r.since.min(now));
        let due = since.saturating_add(KNOWN_GOOD_AFTER);
        if now >= due {
            let proof = SpecSince {
                spec_hash: hash.clone(),
                since: now,
            };
            out.known_good.insert(id.clone(), proof);
        } else {
            let streak = SpecSince {
                spec_hash: hash.clone(),
                since,
            };
            out.ready_since.insert(id.clone(), streak);
            out.next = Some(out.next.map_or(due, |next| next.min(due)));
        }
    }
    out
}

/// Whether an API pod is running and Ready (its `Ready` condition is `True`).
pub(crate) fn is_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && (status.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests;
