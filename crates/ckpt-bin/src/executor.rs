//! Applies a [`Decision`] to the [`Store`], in the order writes → stops → starts →
//! data of no checkpoint → removes, each step idempotent and crash-safe (the store writes
//! atomically).

use std::collections::BTreeMap;
use std::sync::Arc;

use ckpt_core::revisions::Handoff;
use ckpt_core::{Decision, PodId, RemovalReason};
use ckpt_store::Store;
use tracing::{info, warn};

use crate::blocking_pool::on_disk;
use crate::events::{EventKind, EventSink};
use crate::health::Health;

/// What happened while executing a plan.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Steps that failed (logged, counted); the next pass retries them.
    pub(crate) failures: usize,
    /// Every removal of a self-GC plan succeeded: the agent may exit.
    pub(crate) self_gc_complete: bool,
}

/// Where the executor reports to.
pub(crate) struct Reporting<'a> {
    pub(crate) health: &'a Health,
    pub(crate) events: Option<&'a EventSink>,
    pub(crate) api: ckpt_core::ApiState,
    pub(crate) strategy: &'a str,
    pub(crate) parent_uids: &'a BTreeMap<PodId, String>,
}

impl Reporting<'_> {
    fn event(&self, id: &PodId, kind: EventKind, note: String) {
        if let Some(events) = self.events {
            events.publish(
                self.api,
                id,
                self.parent_uids.get(id).map(String::as_str),
                kind,
                note,
            );
        }
    }
}

/// Why a pass stops `id`'s active checkpoint, in the words of its log line and Event: a
/// set-aside or a handoff says so, anything else is its parent running again.
fn stop_reason(id: &PodId, report: &ckpt_core::Report) -> String {
    if let Some(set_aside) = report.set_aside.iter().find(|s| &s.revision == id) {
        return if set_aside.failed_alike {
            format!(
                "it crash-looped like the revision it replaced: the restarts are the environment's, and {} runs again",
                set_aside.replacement
            )
        } else {
            format!(
                "set aside: it crash-looped while active with the API server unreachable, and {} runs instead",
                set_aside.replacement
            )
        };
    }
    let handoff = (report.handoffs.iter()).find(|(known_good, _, _)| known_good == id);
    match handoff {
        Some((_, newest, Handoff::Ready)) => format!("retired: {newest} is Ready"),
        Some((_, newest, _)) => format!("handed over to {newest}, which runs"),
        None => "the parent runs again".to_owned(),
    }
}

/// Runs the decision's actions in order, each on the blocking pool ([`on_disk`](crate::blocking_pool::on_disk)): a pass
/// that writes hundreds of checkpoints, or a disk that takes seconds per fsync, never
/// starves the health endpoints or the API probe.
pub(crate) async fn execute(store: &Arc<Store>, plan: &Arc<Decision>, report: &Reporting<'_>) -> Outcome {
    let mut outcome = Outcome::default();
    let mut fail = |what: &str, id: &PodId, e: &dyn std::error::Error| {
        warn!(pod = %id, error = %ckpt_core::error_chain(e), "{what} failed");
        report.health.write_error();
        outcome.failures += 1;
    };
    for (index, checkpoint) in plan.writes.iter().enumerate() {
        let id = &checkpoint.parent;
        let decision = Arc::clone(plan);
        match on_disk(store, move |s| s.write_inactive(&decision.writes[index])).await {
            Ok(summary) if summary.changed() => info!(
                pod = %id,
                spec_hash = %checkpoint.spec_hash,
                files_written = summary.files_written,
                stale_removed = summary.entries_removed,
                "checkpoint written"
            ),
            Ok(_) => {}
            Err(e) => fail("writing the checkpoint", id, &e),
        }
    }
    for id in &plan.stops {
        let target = id.clone();
        match on_disk(store, move |s| s.deactivate(&target)).await {
            Ok(true) => {
                let why = stop_reason(id, &plan.report);
                info!(pod = %id, "checkpoint deactivated: {why}");
                report.health.deactivation();
                report.event(
                    id,
                    EventKind::Deactivated,
                    format!("{why}; static checkpoint removed"),
                );
            }
            Ok(false) => {}
            Err(e) => fail("deactivating", id, &e),
        }
    }
    for id in &plan.starts {
        let target = id.clone();
        match on_disk(store, move |s| s.activate(&target)).await {
            Ok(true) => {
                info!(pod = %id, "checkpoint activated");
                report.health.activation();
                report.event(
                    id,
                    EventKind::Activated,
                    "the parent pod is not running; started its checkpoint as a static pod".into(),
                );
            }
            Ok(false) => {}
            Err(e) => fail("activating", id, &e),
        }
    }
    for id in &plan.remove_data {
        let target = id.clone();
        match on_disk(store, move |s| s.remove_data(&target)).await {
            Ok(dirs) => {
                info!(pod = %id, data_dirs = dirs, "removed data directories that belong to no checkpoint")
            }
            Err(e) => fail("removing data of no checkpoint", id, &e),
        }
    }
    let mut removes_ok = true;
    for removal in &plan.removes {
        let id = &removal.id;
        if plan.self_gc && removal.is_self && !removes_ok {
            // Self goes last, and only once everything else is gone: never remove the
            // agent while something it should have cleaned up is still there. The
            // next pass retries what failed.
            continue;
        }
        let (strategy, reason) = match &removal.reason {
            RemovalReason::Gc(reason) => (report.strategy.to_owned(), reason.clone()),
            RemovalReason::SupersededSelf(by) => ("self".to_owned(), format!("superseded by {by}")),
            RemovalReason::SelfGc(why) => (
                "self-gc".to_owned(),
                format!("the agent is no longer scheduled to this node: {why}"),
            ),
            RemovalReason::NotAllowed => (
                "namespaces".to_owned(),
                format!("namespace {} is not in --namespaces", id.namespace),
            ),
            RemovalReason::Completed => ("completed".to_owned(), "the parent has completed".to_owned()),
        };
        let (target, is_self) = (id.clone(), removal.is_self);
        let removed = on_disk(store, move |s| {
            if is_self {
                s.remove_self(&target)
            } else {
                s.remove(&target)
            }
        })
        .await;
        match removed {
            Ok(summary) => {
                info!(pod = %id, %strategy, %reason, data_dirs = summary.data_dirs_removed, "checkpoint removed");
                report.health.removal(report.strategy, removal.reason.code());
                report.event(
                    id,
                    EventKind::Removed,
                    format!("checkpoint removed ({strategy}): {reason}"),
                );
            }
            Err(e) => {
                // The other removals still run: one checkpoint that cannot be removed
                // right now must not keep the rest of the node's from going.
                fail("removing", id, &e);
                removes_ok = false;
            }
        }
    }
    outcome.self_gc_complete = plan.self_gc && removes_ok;
    outcome
}

#[cfg(test)]
mod tests {
    use ckpt_core::revisions::{Handoff, SetAside};
    use ckpt_core::{PodId, Report};

    use super::stop_reason;

    fn id(name: &str) -> PodId {
        PodId::new("kube-system", name)
    }

    fn check(stopped: &str, report: &Report, expected: &str) {
        assert_eq!(stop_reason(&id(stopped), report), expected, "{stopped}");
    }

    #[test]
    fn the_stop_says_why() {
        let set_aside = |failed_alike| SetAside {
            revision: id("new"),
            replacement: id("old"),
            restarts: 3,
            failed_alike,
        };
        let report = |set_aside: Vec<SetAside>, handoffs: Vec<(PodId, PodId, Handoff)>| Report {
            set_aside,
            handoffs,
            ..Report::default()
        };
        let cases = [
            (report(vec![], vec![]), "new", "the parent runs again"),
            (
                report(vec![set_aside(false)], vec![]),
                "new",
                "set aside: it crash-looped while active with the API server unreachable, and kube-system/old runs instead",
            ),
            (
                report(vec![set_aside(true)], vec![]),
                "new",
                "it crash-looped like the revision it replaced: the restarts are the environment's, and kube-system/old runs again",
            ),
            // Another checkpoint's set-aside says nothing of this one.
            (
                report(vec![set_aside(false)], vec![]),
                "other",
                "the parent runs again",
            ),
            (
                report(vec![], vec![(id("old"), id("new"), Handoff::Started)]),
                "old",
                "handed over to kube-system/new, which runs",
            ),
            (
                report(vec![], vec![(id("old"), id("new"), Handoff::Ready)]),
                "old",
                "retired: kube-system/new is Ready",
            ),
        ];
        for (report, stopped, expected) in cases {
            check(stopped, &report, expected);
        }
    }
}
