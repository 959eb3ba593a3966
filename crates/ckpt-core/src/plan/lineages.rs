//! The lineages of several revisions ([`crate::revisions`]) as one pass sees them: which
//! revision each runs and keeps, whether the one it runs crash-loops (then the previous
//! known-good one replaces it), and the handoff to a parent with unproven content.

use std::collections::BTreeMap;

use super::rows::{PlanInputs, Row, content, due};
use crate::identity::PodId;
use crate::journal::{PersistentState, Suspension};
use crate::observation::{ApiView, DiskCheckpoint, LocalView};
use crate::revisions::{
    CrashLoopInput, Handoff, HandoffInput, Lineage, LineagePlan, Revision, Serving, SetAside, crash_loop,
    handoff, plan_lineages,
};
use crate::time::Timestamp;

/// A lineage of several revisions, as one pass sees it.
pub(super) struct LineagePass {
    pub(super) plan: LineagePlan,
    /// A parent of the lineage runs here (`None`: the runtime is unknown).
    pub(super) runs: Option<bool>,
    /// The newest revision goes in this pass (its verdict is due and its DaemonSet does
    /// not target the node): the lineage ends and keeps nothing past its verdicts.
    pub(super) newest_due: bool,
    /// How the revision it runs serves (a handoff under way, or failed).
    pub(super) serving: Serving,
    /// A parent of the lineage is Ready on a synced view.
    pub(super) ready: bool,
    /// The newest revision's parent asks for the checkpoint to stay until it is Ready.
    pub(super) retires_when_ready: bool,
    /// The API is unreachable and another known-good revision could replace the one it
    /// runs: that one's restarts are watched while it is active.
    pub(super) fallback: bool,
}

/// What [`plan`] found: the lineages of several revisions, each row's lineage if it is
/// one of those, and the handoffs' and set-asides' steps.
pub(super) struct Lineages {
    /// The lineages of several revisions.
    pub(super) passes: BTreeMap<Lineage, LineagePass>,
    /// Each row's lineage, if it is one of `passes`.
    pub(super) members: Vec<Option<Lineage>>,
    /// Handoff steps: (the known-good checkpoint, the newest revision, the step).
    pub(super) handoffs: Vec<(PodId, PodId, Handoff)>,
    /// When a handoff under way ends.
    pub(super) handoff_at: Option<Timestamp>,
    /// Revisions set aside because they crash-looped while active.
    pub(super) set_aside: Vec<SetAside>,
}

/// The lineage's suspended revision whose replacement is on trial (if any), and whether
/// one failed alike (`PersistentState::suspended`), for the ids `in_lineage`.
fn suspensions(state: &PersistentState, in_lineage: impl Fn(&PodId) -> bool) -> (Option<PodId>, bool) {
    (state.suspended.iter()).filter(|(id, _)| in_lineage(id)).fold(
        (None, false),
        |(trial, alike), (id, s)| {
            (
                trial.or_else(|| (!s.failed_alike).then(|| id.clone())),
                alike || s.failed_alike,
            )
        },
    )
}

/// Plans the lineages of several revisions ([`crate::revisions`]) of `rows`, and records
/// the handoffs' and crash loops' journal entries in `state`.
pub(super) fn plan(
    inputs: &PlanInputs<'_>,
    rows: &[Row<'_>],
    written: &[bool],
    now: Timestamp,
    state: &mut PersistentState,
) -> Lineages {
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
    // Marks suspended by a crash loop (`PersistentState::suspended`) are on trial only while
    // the API is unreachable. The first pass that reaches it ends the trial: the API came
    // back with the older revision serving, so that one did better and the set-aside holds
    // (the suspended mark goes for good, as an unproven revision's parent can still earn it
    // back); or the older one had failed alike and the suspended one runs again, its mark
    // holding (the environment came back).
    let unreachable = matches!(inputs.api, ApiView::Unreachable);
    for (id, suspension) in &inputs.state.suspended {
        if unreachable {
            state.suspended.insert(id.clone(), suspension.clone());
        } else if !suspension.failed_alike {
            state.known_good.remove(id);
        }
    }
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
                // A suspended mark counts as none, unless its replacement failed alike.
                let proven = (content(row, written))
                    .zip(state.known_good.get(row.id))
                    .is_some_and(|(content, proof)| proof.spec_hash == content)
                    && state.suspended.get(row.id).is_none_or(|s| s.failed_alike);
                // What the written checkpoint records: the listed pod's label.
                let generation = if written {
                    row.parent.and_then(|p| p.template_generation)
                } else {
                    (row.disk.and_then(DiskCheckpoint::meta)).and_then(|m| m.template_generation)
                };
                let revision = Revision {
                    id: row.id,
                    generation,
                    checkpointed_at,
                    proven,
                };
                ((*lineage).clone(), revision)
            })
        })
        .collect();
    let index = |id: &PodId| rows.binary_search_by(|row| row.id.cmp(id)).ok();
    let restarts = match inputs.local {
        LocalView::Known { restarts, .. } => Some(restarts),
        LocalView::Unknown => None,
    };
    let marks_unknown = inputs.state.marks_unknown;
    let mut held_any = false;
    let mut passes = BTreeMap::new();
    let (mut handoffs, mut handoff_at, mut set_asides) = (Vec::new(), None, Vec::new());
    for (lineage, mut plan) in plan_lineages(revisions.iter().cloned(), inputs.revisions) {
        let Some(indices) = groups.get(&lineage) else {
            continue;
        };
        // The journal was lost: an older revision that is active is what the node chose
        // with the marks it had (the known-good one serving through a handoff that failed,
        // say), so it serves on and is kept until the newest parent proves itself Ready;
        // with no marks the newest would run and the older one stop.
        let held = (marks_unknown && !inputs.ready.contains(&plan.newest))
            .then(|| {
                (indices.iter().map(|&i| &rows[i]))
                    .find(|row| *row.id != plan.newest && row.disk.is_some_and(|d| d.active.is_some()))
            })
            .flatten();
        if let Some(held) = held {
            held_any = true;
            plan.runs = held.id.clone();
            plan.kept.insert(held.id.clone());
        }
        let Some(mut runner) = index(&plan.runs) else {
            continue;
        };
        // The revision it runs crash-loops while the API is unreachable: the previous
        // known-good one replaces it (ARCHITECTURE.md, Revisions). Not while the marks are
        // unknown: nothing says which revision the node could fall back to. While one is
        // suspended, the one run instead is watched too: if it crash-loops as well, the
        // restarts are the environment's, and the suspended one runs again; after that
        // nothing more is set aside.
        let in_lineage = |id: &PodId| indices.iter().any(|&i| rows[i].id == id);
        let fallback = |revisions: &[(Lineage, Revision<'_>)], runs: &PodId, state: &PersistentState| {
            let (trial, failed_alike) = suspensions(state, in_lineage);
            unreachable
                && !marks_unknown
                && !failed_alike
                && (trial.is_some()
                    || (revisions.iter()).any(|(l, r)| *l == lineage && r.proven && r.id != runs))
        };
        let (trial, _) = suspensions(state, in_lineage);
        let look = crash_loop(
            &CrashLoopInput {
                unreachable,
                active: rows[runner].disk.is_some_and(|d| d.active.is_some()),
                fallback: fallback(&revisions, &plan.runs, state),
                restarts: restarts.and_then(|r| r.get(&plan.runs).copied()),
                seen: inputs.state.restarts_seen.get(&plan.runs),
            },
            now,
        );
        if let Some(seen) = look.seen {
            state.restarts_seen.insert(plan.runs.clone(), seen);
        }
        if look.set_aside
            && let Some(restored) = &trial
        {
            // The revision run in place of the suspended one crash-loops too: the restarts
            // are the environment's. The suspended one runs again, its mark holding.
            let crashing = plan.runs.clone();
            let first = inputs.state.restarts_seen.get(&crashing).map_or(0, |s| s.first);
            let restarts_now = restarts.and_then(|r| r.get(&crashing).copied()).unwrap_or(first);
            if let Some(s) = state.suspended.get_mut(restored) {
                s.failed_alike = true;
            }
            let proven = index(restored).is_some_and(|i| {
                (content(&rows[i], written[i]))
                    .zip(state.known_good.get(restored))
                    .is_some_and(|(content, proof)| proof.spec_hash == content)
            });
            for (_, r) in revisions
                .iter_mut()
                .filter(|(l, r)| *l == lineage && r.id == restored)
            {
                r.proven = proven;
            }
            state.restarts_seen.remove(&crashing);
            let lineage_revisions = (revisions.iter()).filter(|(l, _)| *l == lineage).cloned();
            if let Some((replacement, replanned)) = (plan_lineages(lineage_revisions, inputs.revisions)
                .pop_first())
            .and_then(|(_, p)| Some((index(&p.runs)?, p)))
            {
                set_asides.push(SetAside {
                    revision: crashing,
                    replacement: replanned.runs.clone(),
                    restarts: restarts_now.saturating_sub(first),
                    failed_alike: true,
                });
                (plan, runner) = (replanned, replacement);
            }
        } else if look.set_aside {
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
                // Suspended, not dropped: restarts alone never take a mark for good.
                let suspension = Suspension {
                    since: now,
                    failed_alike: false,
                };
                state.suspended.insert(set_aside.clone(), suspension);
                set_asides.push(SetAside {
                    revision: set_aside,
                    replacement: replanned.runs.clone(),
                    restarts: restarts_now.saturating_sub(first),
                    failed_alike: false,
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
        if held.is_some() {
            // No handoff while the marks are unknown: the newest parent may be one
            // already rejected.
            serving = Serving::Serve;
        } else if newest != runner
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
                handoffs.push((plan.runs.clone(), plan.newest.clone(), step));
            }
            if let Some(h) = outcome.handoff {
                state.handoffs.insert(plan.newest.clone(), h);
            }
            if let Some(r) = outcome.rejected {
                state.rejected.insert(plan.newest.clone(), r);
            }
            handoff_at = outcome.deadline.into_iter().chain(handoff_at).min();
        }
        let pass = LineagePass {
            fallback: fallback(&revisions, &plan.runs, state),
            plan,
            runs,
            newest_due,
            serving,
            ready: indices.iter().any(|&i| inputs.ready.contains(rows[i].id)),
            retires_when_ready: newest_row.retires_when_ready(),
        };
        passes.insert(lineage, pass);
    }
    // Known again once a synced pass holds nothing: every lineage then runs what the
    // marks proven since say.
    state.marks_unknown = marks_unknown && (held_any || !synced);
    Lineages {
        passes,
        members,
        handoffs,
        handoff_at,
        set_aside: set_asides,
    }
}
