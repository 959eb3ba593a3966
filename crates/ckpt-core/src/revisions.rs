//! Last-known-good revisions and the health-gated handoff (issue 21), as pure functions
//! the planner calls.
//!
//! **Revisions.** A DaemonSet has one pod per node, and a rollout replaces it with a pod of
//! a new name: the checkpoints of a DaemonSet's pods on this node are the *revisions* of one
//! `Lineage`, each with its own manifest and the data it mounted when its pod was last
//! listed. Any other pod is a lineage of its own. `plan_lineages` chooses, per lineage:
//! - the **newest** revision (the current pod's: the highest `pod-template-generation`,
//!   then the one checkpointed last);
//! - the one an activation **runs**: the newest *known-good* revision (its parent was Ready
//!   for a minute with exactly that content, [`KNOWN_GOOD_AFTER`](crate::KNOWN_GOOD_AFTER)), else the newest (what
//!   the original always ran);
//! - the ones **kept** past the GC strategy's verdicts while the lineage lives: the newest,
//!   then known-good ones, newest first, `keep` in all.
//!
//! An older revision keeps the data it had when its pod was last listed: what was proven is
//! a spec together with its data, and restoring an old spec with newer data (a certificate
//! issued for new flags, a CA the old spec does not name) is a combination nothing ever ran.
//! A renewed certificate is issued well before the old one expires, so the known-good
//! revision's older one still serves for the time a bad upgrade waits for a reboot.
//!
//! **Handoff.** When the newest revision is not proven and the known-good one is active,
//! `handoff` decides, pass by pass, per the table in its docs: the new parent gets the
//! node (the checkpoint stops) once it runs, and a bounded time to become Ready on a synced
//! view; if it does not, the known-good checkpoint returns and stays while that pod
//! exists (or until it is seen Ready). Readiness is the API's: while the API is unreachable nothing proves
//! a parent Ready, so a parent that cannot bring the API back is rejected at the deadline.
//!
//! **A known-good revision that crash-loops.** While the API is unreachable, `crash_loop`
//! counts the restarts of the active revision's static pod (from the container runtime)
//! when another known-good revision could replace it; after `CRASH_LOOP_RESTARTS` (3) it is
//! set aside: its known-good mark is suspended and the previous known-good revision runs,
//! on trial until the API is reached (the planner, `PersistentState::suspended`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::identity::{ControllerOwner, PodId};
use crate::journal::{HandoffRecord, RestartsSeen, SpecSince};
use crate::observation::DiskCheckpoint;
use crate::time::Timestamp;

/// Revisions kept per lineage by default: the newest and one known-good.
pub const DEFAULT_KEEP: usize = 2;
/// How long a parent with unproven content has to become Ready once it took over.
pub const DEFAULT_HANDOFF_TIMEOUT: Duration = Duration::from_secs(120);

/// `--revisions` and `--handoff-timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevisionSettings {
    /// Revisions kept per lineage (≥ 1). 1 turns revisions off: the newest checkpoint is
    /// the only one, activated and retired as the original did.
    pub keep: usize,
    /// How long a parent with unproven content has to become Ready once it took over.
    pub handoff_timeout: Duration,
}

impl Default for RevisionSettings {
    fn default() -> Self {
        Self {
            keep: DEFAULT_KEEP,
            handoff_timeout: DEFAULT_HANDOFF_TIMEOUT,
        }
    }
}

impl RevisionSettings {
    /// Revisions are on: older known-good revisions are kept and preferred.
    pub fn enabled(&self) -> bool {
        self.keep >= 2
    }
}

/// The checkpoints that are revisions of one another.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Lineage {
    /// The pods of one DaemonSet on this node (one at a time, a new name per rollout).
    DaemonSet {
        /// The namespace.
        namespace: String,
        /// The DaemonSet's UID (kept across rollouts, new when it is re-created).
        uid: String,
    },
    /// Any other pod: a lineage of its own.
    Pod(PodId),
}

impl Lineage {
    /// The lineage of a pod with this controller owner.
    pub(crate) fn of(id: &PodId, owner: Option<&ControllerOwner>) -> Self {
        match owner {
            Some(owner) if owner.kind == "DaemonSet" && !owner.uid.is_empty() => Lineage::DaemonSet {
                namespace: id.namespace.to_string(),
                uid: owner.uid.clone(),
            },
            _ => Lineage::Pod(id.clone()),
        }
    }
}

/// One revision, as [`plan_lineages`] weighs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Revision<'a> {
    /// Its checkpoint.
    pub(crate) id: &'a PodId,
    /// Its pod's `pod-template-generation` (`None`: not recorded, e.g. its labels lost).
    pub(crate) generation: Option<i64>,
    /// When its content was checkpointed (`None`: not recorded, a bootkube file: oldest).
    pub(crate) checkpointed_at: Option<Timestamp>,
    /// Its parent proved exactly this content (known-good).
    pub(crate) proven: bool,
}

impl Revision<'_> {
    /// What orders revisions, oldest first.
    fn age_key(&self) -> (Option<i64>, Option<Timestamp>, &PodId) {
        (self.generation, self.checkpointed_at, self.id)
    }
}

/// What [`plan_lineages`] chose for one lineage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LineagePlan {
    /// The revision checkpointed last.
    pub(crate) newest: PodId,
    /// The revision an activation runs.
    pub(crate) runs: PodId,
    /// The revisions kept past GC verdicts while the newest is kept.
    pub(crate) kept: BTreeSet<PodId>,
}

/// Chooses, per lineage, the newest revision, the one to run and the ones to keep.
pub(crate) fn plan_lineages<'a>(
    revisions: impl IntoIterator<Item = (Lineage, Revision<'a>)>,
    settings: &RevisionSettings,
) -> BTreeMap<Lineage, LineagePlan> {
    let mut grouped: BTreeMap<Lineage, Vec<Revision<'a>>> = BTreeMap::new();
    for (lineage, revision) in revisions {
        grouped.entry(lineage).or_default().push(revision);
    }
    (grouped.into_iter())
        .filter_map(|(lineage, mut revisions)| {
            // Newest first: the highest template generation (a write time alone lets a
            // rewrite of an old pod's checkpoint, a Secret rotated while a rollout's pods
            // overlap, outrank the new pod's for good), then the last written, then by name,
            // so the choice never depends on input order. A revision without a generation
            // (`None` sorts first) is older than any with one.
            revisions.sort_by(|a, b| b.age_key().cmp(&a.age_key()));
            let newest = revisions.first()?.id.clone();
            let runs = if settings.enabled() {
                revisions
                    .iter()
                    .find(|r| r.proven)
                    .map_or(&newest, |r| r.id)
                    .clone()
            } else {
                newest.clone()
            };
            let kept: BTreeSet<PodId> = std::iter::once(newest.clone())
                .chain(
                    (revisions.iter().skip(1))
                        .filter(|r| r.proven)
                        .map(|r| r.id.clone()),
                )
                .take(settings.keep.max(1))
                .collect();
            Some((lineage, LineagePlan { newest, runs, kept }))
        })
        .collect()
}

/// A checkpoint's place among its lineage's revisions, from the disk and the journal alone
/// (`inspect`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionRole {
    /// How many revisions its lineage has on disk.
    pub of: usize,
    /// It is the newest (its parent's current content).
    pub newest: bool,
    /// Its content is known-good.
    pub known_good: bool,
    /// An activation (the API lost, no parent of the lineage running) runs this one.
    pub runs: bool,
}

/// The roles of the checkpoints on disk that share a lineage with another one; a
/// checkpoint alone in its lineage has none (it is what any activation of it runs).
pub fn roles(
    disk: &BTreeMap<PodId, DiskCheckpoint>,
    known_good: &BTreeMap<PodId, SpecSince>,
    settings: &RevisionSettings,
) -> BTreeMap<PodId, RevisionRole> {
    let proven = |id: &PodId, d: &DiskCheckpoint| {
        let content = d.inactive.as_ref().and_then(|c| c.meta.spec_hash.as_deref());
        (content.zip(known_good.get(id))).is_some_and(|(content, proof)| proof.spec_hash == content)
    };
    let revisions = (disk.iter()).filter_map(|(id, d)| {
        let meta = d.meta()?;
        let lineage = Lineage::of(id, meta.owner.as_ref());
        let revision = Revision {
            id,
            generation: meta.template_generation,
            checkpointed_at: meta.checkpointed_at,
            proven: proven(id, d),
        };
        Some((lineage, revision))
    });
    let revisions: Vec<(Lineage, Revision<'_>)> = revisions.collect();
    let mut counts: BTreeMap<&Lineage, usize> = BTreeMap::new();
    for (lineage, _) in &revisions {
        *counts.entry(lineage).or_default() += 1;
    }
    let counts: BTreeMap<Lineage, usize> = counts.into_iter().map(|(l, n)| (l.clone(), n)).collect();
    let proven_ids: BTreeSet<&PodId> = revisions
        .iter()
        .filter(|(_, r)| r.proven)
        .map(|(_, r)| r.id)
        .collect();
    let mut out = BTreeMap::new();
    for (lineage, plan) in plan_lineages(revisions.iter().cloned(), settings) {
        let of = counts.get(&lineage).copied().unwrap_or(0);
        if of < 2 {
            continue;
        }
        let members = (revisions.iter())
            .filter(|(l, _)| *l == lineage)
            .map(|(_, r)| r.id);
        for id in members {
            let role = RevisionRole {
                of,
                newest: *id == plan.newest,
                known_good: proven_ids.contains(id),
                runs: *id == plan.runs,
            };
            out.insert(id.clone(), role);
        }
    }
    out
}

/// How the known-good revision serves while the newest revision is unproven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Serving {
    /// As any checkpoint: activated when the API is unreachable and no parent of the
    /// lineage runs, retired once one runs.
    AsUsual,
    /// Stopped and not started: the new parent has the node until its deadline.
    Standby,
    /// Active whatever the API and the parent do: the new parent failed its handoff.
    Serve,
}

/// A handoff's step, reported once (an Event and a metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handoff {
    /// The new parent runs: the known-good checkpoint stopped for it.
    Started,
    /// The new parent became Ready: it keeps the node.
    Ready,
    /// The new parent did not become Ready in time: the known-good checkpoint is back.
    Failed,
}

impl Handoff {
    /// Every step, in the order a handoff takes them (the metric's order).
    pub const ALL: [Handoff; 3] = [Handoff::Started, Handoff::Ready, Handoff::Failed];

    /// The metric label.
    pub fn code(self) -> &'static str {
        match self {
            Handoff::Started => "started",
            Handoff::Ready => "ready",
            Handoff::Failed => "failed",
        }
    }
}

/// What [`handoff`] looks at, for one lineage whose newest revision is not the known-good
/// one it runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HandoffInput<'a> {
    /// The newest revision's content hash.
    pub(crate) newest_hash: &'a str,
    /// Its parent runs here (`None`: the runtime is unknown).
    pub(crate) newest_runs: Option<bool>,
    /// Its parent is Ready on a synced view.
    pub(crate) newest_ready: bool,
    /// Its parent is being deleted, on a synced view (a rollout or rollback replacing it).
    pub(crate) newest_terminating: bool,
    /// Its parent binds beside the checkpoint and asks for it to stay until it is Ready
    /// ([`crate::identity::HANDOFF_WHEN_READY`]).
    pub(crate) retires_when_ready: bool,
    /// The known-good checkpoint is active.
    pub(crate) active: bool,
    /// The handoff in progress to the newest revision, from the journal.
    pub(crate) handoff: Option<&'a HandoffRecord>,
    /// The newest revision's failed handoff, from the journal.
    pub(crate) rejected: Option<&'a HandoffRecord>,
    /// `--handoff-timeout`.
    pub(crate) timeout: Duration,
}

/// What [`handoff`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HandoffOutcome {
    /// How the known-good checkpoint serves.
    pub(crate) serving: Serving,
    /// The handoff in progress, to journal.
    pub(crate) handoff: Option<HandoffRecord>,
    /// The failed handoff, to journal.
    pub(crate) rejected: Option<HandoffRecord>,
    /// What happened in this pass.
    pub(crate) step: Option<Handoff>,
    /// When to look again.
    pub(crate) deadline: Option<Timestamp>,
}

/// One pass of the handoff from the known-good checkpoint to a parent with unproven
/// content. In order, the first row that applies:
///
/// | the new parent | journal (this pod) | serving | journal after | step |
/// |---|---|---|---|---|
/// | Ready (synced view) | any | as usual | nothing | `Ready` if a handoff was under way |
/// | binds beside the checkpoint (`when-ready`) | any | serve if active, else as usual | nothing | — |
/// | runs, checkpoint active, not being deleted | rejected, its back-off passed | standby | handoff (now) | `Started` |
/// | any | rejected | serve | rejected | — |
/// | any | handoff, deadline passed | serve | rejected (now, one more failure) | `Failed` |
/// | any | handoff | standby | handoff | — |
/// | being deleted, checkpoint active | nothing | serve | nothing | — |
/// | runs, checkpoint active | nothing | standby | handoff (now) | `Started` |
/// | otherwise | — | as usual | nothing | — |
///
/// A rejected parent gets the node again once its back-off has passed
/// ([`handoff_retry_after`]: 5 minutes after the first failure, doubling to an hour), as a
/// new pod (a rollback or a fix of the spec is one), or once it is seen Ready (with
/// `--permit-port-sharing` it can bind and prove itself beside the checkpoint). A parent
/// only slow to start (it cannot bind while the checkpoint holds its port) so gets its
/// turn again, at the cost of at most a handoff timeout without a server per retry for a
/// parent that is bad. A pod being deleted (its DaemonSet replacing it, a
/// rollback) gets no handoff: the node would go without a server for a pod that is going
/// anyway; the known-good checkpoint serves until the replacement runs.
pub(crate) fn handoff(input: &HandoffInput<'_>, now: Timestamp) -> HandoffOutcome {
    // The journal is keyed by the newest revision's pod: its entries hold for that pod
    // whatever its content became since (a Secret it mounts rewritten; a real-node run saw
    // the checkpoint of a rejected pod rewritten with another hash after a reboot). Keyed
    // by content, such a change would hand the node again to a pod already rejected: a
    // second outage of a whole handoff timeout.
    let (handoff, rejected) = (input.handoff.cloned(), input.rejected.cloned());
    let outcome = |serving, handoff, rejected, step, deadline| HandoffOutcome {
        serving,
        handoff,
        rejected,
        step,
        deadline,
    };
    // The new parent gets the node until the deadline; `failures` of its earlier handoffs
    // carry on, for the next retry's back-off.
    let start = |failures| {
        let started = HandoffRecord {
            spec_hash: input.newest_hash.to_owned(),
            since: now,
            failures,
        };
        let deadline = now.saturating_add(input.timeout);
        outcome(
            Serving::Standby,
            Some(started),
            None,
            Some(Handoff::Started),
            Some(deadline),
        )
    };
    if input.newest_ready {
        let step = handoff.is_some().then_some(Handoff::Ready);
        return outcome(Serving::AsUsual, None, None, step, None);
    }
    if input.retires_when_ready {
        // No step aside and no deadline: the parent binds beside the running checkpoint,
        // which stays until the parent is Ready (the row above), however long it takes.
        let serving = if input.active {
            Serving::Serve
        } else {
            Serving::AsUsual
        };
        return outcome(serving, None, None, None, None);
    }
    if let Some(rejected) = rejected {
        let since = rejected.since.min(now);
        let failures = rejected.failures.max(1);
        let retry_at = since.saturating_add(handoff_retry_after(failures));
        let may_retry = input.newest_runs == Some(true) && input.active && !input.newest_terminating;
        if may_retry && now >= retry_at {
            return start(failures);
        }
        let kept = HandoffRecord { since, ..rejected };
        return outcome(
            Serving::Serve,
            None,
            Some(kept),
            None,
            may_retry.then_some(retry_at),
        );
    }
    if let Some(started) = handoff {
        // A time recorded before the clock went back counts from now: the deadline moves
        // later, never earlier.
        let since = started.since.min(now);
        let deadline = since.saturating_add(input.timeout);
        if now >= deadline {
            let failed = HandoffRecord {
                spec_hash: input.newest_hash.to_owned(),
                since: now,
                failures: started.failures.saturating_add(1),
            };
            return outcome(Serving::Serve, None, Some(failed), Some(Handoff::Failed), None);
        }
        let kept = HandoffRecord { since, ..started };
        return outcome(Serving::Standby, Some(kept), None, None, Some(deadline));
    }
    if input.newest_terminating && input.active {
        return outcome(Serving::Serve, None, None, None, None);
    }
    if input.newest_runs == Some(true) && input.active {
        return start(0);
    }
    outcome(Serving::AsUsual, None, None, None, None)
}

/// How long after its `failures`-th failed handoff (≥ 1) a pod gets the node again: 5
/// minutes, doubling with each failure, at most an hour. Each retry of a bad parent costs
/// the node at most a handoff timeout without a server; a good but slow one (it could
/// not bind its port beside the checkpoint) gets through on a retry.
pub(crate) fn handoff_retry_after(failures: u32) -> Duration {
    const FIRST: Duration = Duration::from_secs(5 * 60);
    const MOST: Duration = Duration::from_secs(60 * 60);
    crate::backoff::nth_delay(FIRST, MOST, failures.saturating_sub(1))
}

/// Restarts of an active revision's static pod, counted from the first look in an outage,
/// that make it crash-looping: the kubelet's back-off between them (from 10 s, doubling) made
/// that about 45 s after activation on the real node, past a kube-apiserver's few restarts
/// while etcd comes up at boot.
pub(crate) const CRASH_LOOP_RESTARTS: u32 = 3;

/// What [`crash_loop`] looks at, for the revision a lineage runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CrashLoopInput<'a> {
    /// The API server is unreachable.
    pub(crate) unreachable: bool,
    /// The revision is active (its manifest is in the kubelet's directory).
    pub(crate) active: bool,
    /// Another known-good revision of its lineage is on disk to replace it.
    pub(crate) fallback: bool,
    /// Its static pod's restart count now, as the CRI shows it (the highest attempt among
    /// its containers); `None`: not seen (no container yet, the runtime unknown, or no CRI).
    pub(crate) restarts: Option<u32>,
    /// The count first seen in this outage, from the journal.
    pub(crate) seen: Option<&'a RestartsSeen>,
}

/// What [`crash_loop`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CrashLoopOutcome {
    /// The count first seen, to journal.
    pub(crate) seen: Option<RestartsSeen>,
    /// It crash-loops: its known-good mark goes, and the lineage runs the fallback.
    pub(crate) set_aside: bool,
}

/// Whether the active revision a lineage runs crash-loops while the API is unreachable, so
/// that the previous known-good revision replaces it. In order, the first row that applies:
///
/// | API unreachable, active, a fallback | restarts now | journal | journal after | set aside |
/// |---|---|---|---|---|
/// | not all three | any | any | nothing | no |
/// | yes | not seen | any | as it was | no |
/// | yes | `n` | nothing, or more than `n` (the pod was re-created) | `n`, now | no |
/// | yes | at least first + [`CRASH_LOOP_RESTARTS`] | first | nothing | **yes** |
/// | yes | fewer | first | first | no |
///
/// Setting aside suspends the revision's known-good mark while the one run instead is on
/// trial (it is watched by this same table); the mark goes for good once that one brought
/// the API back, and a parent with its content then takes over through the handoff, which
/// gives it back its mark once it is Ready for [`crate::KNOWN_GOOD_AFTER`]. A
/// revision without a fallback is never set aside: it is the best the node has. Readiness
/// is not looked at: the CRI has none, and the kubelet's `/pods` has none of its own for a
/// static pod; a revision that runs without serving is not caught.
pub(crate) fn crash_loop(input: &CrashLoopInput<'_>, now: Timestamp) -> CrashLoopOutcome {
    let quiet = CrashLoopOutcome {
        seen: None,
        set_aside: false,
    };
    if !(input.unreachable && input.active && input.fallback) {
        return quiet;
    }
    let watched = |seen: Option<RestartsSeen>| CrashLoopOutcome {
        seen,
        set_aside: false,
    };
    let Some(restarts) = input.restarts else {
        return watched(input.seen.cloned());
    };
    match input.seen {
        Some(seen) if seen.first <= restarts => {
            if restarts - seen.first >= CRASH_LOOP_RESTARTS {
                CrashLoopOutcome {
                    set_aside: true,
                    ..quiet
                }
            } else {
                watched(Some(seen.clone()))
            }
        }
        _ => watched(Some(RestartsSeen {
            first: restarts,
            since: now,
        })),
    }
}

/// A revision set aside because it crash-looped while active, and the one that replaced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAside {
    /// The crash-looping revision (its known-good mark suspended).
    pub revision: PodId,
    /// The known-good revision the lineage runs instead.
    pub replacement: PodId,
    /// The restarts counted (since the first look).
    pub restarts: u32,
    /// `revision` is the older one run in place of a suspended `replacement`, and it
    /// crash-looped too: the restarts are the environment's, so `replacement` runs again,
    /// its mark holds, and nothing more is set aside.
    pub failed_alike: bool,
}

#[cfg(test)]
mod tests;
