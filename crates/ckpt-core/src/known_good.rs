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
//! health-gated handoff.
//!
//! ```
//! use std::collections::{BTreeMap, BTreeSet};
//! use std::time::Duration;
//!
//! use ckpt_core::known_good::{KNOWN_GOOD_AFTER, track};
//! use ckpt_core::{PodId, Timestamp};
//!
//! let id = PodId::new("kube-system", "kube-apiserver-x7k2p");
//! let desired = BTreeMap::from([(id.clone(), "h1".to_owned())]);
//! let ready = BTreeSet::from([id.clone()]);
//! let kept = BTreeSet::from([id.clone()]);
//! let t0 = Timestamp(0);
//! let first = track(&BTreeMap::new(), &BTreeMap::new(), &desired, &ready, &kept, true, t0);
//! assert!(first.known_good.is_empty());
//! assert_eq!(first.next, Some(t0.saturating_add(KNOWN_GOOD_AFTER)));
//! let later = t0.saturating_add(KNOWN_GOOD_AFTER);
//! let second = track(&first.known_good, &first.ready_since, &desired, &ready, &kept, true, later);
//! assert_eq!(second.known_good[&id].spec_hash, "h1");
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::identity::PodId;
use crate::time::Timestamp;

/// How long a parent must be Ready with a content for it to become known-good.
pub const KNOWN_GOOD_AFTER: Duration = Duration::from_secs(60);

/// A content (spec hash) and a time: when it became known-good, or since when its parent
/// has been Ready with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecSince {
    /// The checkpoint's spec hash.
    pub spec_hash: String,
    /// When.
    pub since: Timestamp,
}

/// The outcome of [`track`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tracked {
    /// The known-good content of each parent.
    pub known_good: BTreeMap<PodId, SpecSince>,
    /// The parents Ready with a content not proven yet, since when.
    pub ready_since: BTreeMap<PodId, SpecSince>,
    /// When the next of those becomes known-good: look again then.
    pub next: Option<Timestamp>,
}

/// One pass of tracking. `desired` is each sanitized parent's content; `ready` the parents
/// whose API pod is Ready; `kept` the checkpoints on disk after the pass (a removed
/// checkpoint's proof goes with it); `synced` whether the view is synced.
pub fn track(
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
pub fn is_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && (status.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests;
