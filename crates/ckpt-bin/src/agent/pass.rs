//! One pass (ARCHITECTURE.md, The pass): observe → decide (with the strategy's verdicts)
//! → apply → report, each a method of [`Agent`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ckpt_core::{
    ApiState, Decision, DiskCheckpoint, GcDecision, LocalView, Observation, PodId, Timestamp, error_chain,
};
use ckpt_watch::jitter::equal_jitter;
use tracing::{info, warn};

use super::{Agent, PassResult, SCHEDULING_RECHECK};
use crate::blocking_pool::on_disk;
use crate::error::Result;
use crate::executor::{Outcome, Reporting, execute};
use crate::health::Phase;

/// What a pass saw.
struct Seen {
    /// The checkpoints on disk.
    disk: BTreeMap<PodId, DiskCheckpoint>,
    /// Checkpoint files that could not be read, and why: their checkpoints are left alone.
    unreadable: Vec<(PathBuf, String)>,
    /// Every pod with data directories on disk, with a checkpoint or not.
    with_data: BTreeSet<PodId>,
    observation: Observation,
}

impl Agent {
    /// One pass: observe, decide (with the strategy's verdicts), apply, report.
    pub(super) async fn pass(&mut self, local: LocalView) -> Result<PassResult> {
        if !self.confirm_lock() {
            return Ok(PassResult::LockLost);
        }
        let started = Instant::now();
        let now = Timestamp::now();
        let Some(seen) = self.observe(local).await else {
            return Ok(PassResult::Failed);
        };
        let handover_at = self.credentials_rejected(seen.observation.api, now);
        let decision = self.decide(&seen, now).await;
        self.announce(&decision);
        let outcome = self.apply(&decision, seen.observation.api).await;
        self.save_state(&decision).await;
        self.report(&decision, handover_at, now, started.elapsed());
        self.last_local = Some(seen.observation.local.clone());
        Ok(self.conclude(&seen, &decision, &outcome, handover_at, now).await)
    }

    /// Reads the checkpoints on disk, then observes the API and the node. `None` when the
    /// store cannot be read (said, counted; the pass is retried).
    async fn observe(&mut self, local: LocalView) -> Option<Seen> {
        let read = on_disk(&self.store, |s| {
            let read = s.read_back()?;
            let disk = (read.checkpoints.iter())
                .map(|(id, s)| (id.clone(), s.disk_checkpoint()))
                .collect::<BTreeMap<PodId, DiskCheckpoint>>();
            Ok::<_, ckpt_store::Error>((disk, read.unreadable, s.data_pods()))
        });
        let (disk, unreadable, with_data) = match read.await {
            Ok((disk, unreadable, with_data)) => {
                // Without the list, no data is removed: nothing else depends on it.
                let with_data = with_data.unwrap_or_else(|e| {
                    warn!(error = %error_chain(&e), "cannot list the checkpoint data directories");
                    BTreeSet::new()
                });
                (disk, unreadable, with_data)
            }
            Err(e) => {
                warn!(error = %error_chain(&e), "cannot read the checkpoints; retrying");
                self.health.write_error();
                self.last_local = Some(local);
                return None;
            }
        };
        // Active checkpoints of namespaces removed from `--namespaces` are retired once
        // their parents run: the next local looks cover those namespaces too.
        (self.local).observe_outside(ckpt_core::local_namespaces_outside(
            &disk,
            &self.config.allowed,
            &self.config.me,
        ));
        // Files under other names in the kubelet's dir are not ours to read.
        let unreadable: Vec<_> = (unreadable.into_iter())
            .filter(|(path, _)| checkpoint_of(path).is_some())
            .collect();
        if let Some((path, error)) = unreadable.first() {
            // Nothing replaces, activates or removes their checkpoints this pass; the
            // pass counts as failed, so it is retried soon.
            warn!(
                files = unreadable.len(),
                path = %path.display(),
                %error,
                "cannot read checkpoint files; leaving their checkpoints alone and retrying"
            );
            self.health.write_error();
        }
        let observation = match &self.link {
            Some(link) => {
                (link.observer)
                    .observe(local, &disk, self.policy.needs_owner_status(), &self.config.me)
                    .await
            }
            None => {
                let mut observation = Observation::offline(local);
                if let Some(probe) = &self.anonymous {
                    // Pods are unknown, so an answer is "reachable, not synced": nothing is
                    // activated, nothing removed.
                    let snapshot = probe.snapshot();
                    observation.api = snapshot.state;
                    observation.api_error = Some(match snapshot.last_error {
                        Some(problem) => format!("no API credentials; the anonymous probe fails: {problem}"),
                        None => "no API credentials; the API server answers an anonymous probe".to_owned(),
                    });
                }
                observation
            }
        };
        self.reporter.observed(&observation);
        Some(Seen {
            disk,
            unreadable,
            with_data,
            observation,
        })
    }

    /// The decision on what was seen, with the strategy's verdict on each orphan; the
    /// checkpoints of unreadable files are left alone.
    async fn decide(&mut self, seen: &Seen, now: Timestamp) -> Arc<Decision> {
        let assessment = ckpt_core::assess(&seen.observation, &seen.disk, &self.state, &self.config, now);
        let mut verdicts: BTreeMap<PodId, GcDecision> = BTreeMap::new();
        for orphan in assessment.orphans() {
            verdicts.insert(orphan.id.clone(), self.policy.decide(orphan, now).await);
        }
        let mut decision = assessment.decide(&verdicts);
        decision.leave_alone(&unreadable_checkpoints(&seen.unreadable));
        decision.remove_orphan_data(&seen.with_data, &seen.disk, seen.unreadable.is_empty());
        let report = &decision.report;
        if report.own_owner.is_some() && report.own_owner != self.config.me.owner {
            info!(owner = ?report.own_owner, "recognised the agent's own controller");
            self.config.me.owner.clone_from(&report.own_owner);
        }
        Arc::new(decision)
    }

    /// Says what the decision changes before it is applied (log lines, Events), and tells
    /// the observers what to watch: the API probe's pace, the restart counts to follow.
    fn announce(&mut self, decision: &Decision) {
        let report = &decision.report;
        let events = self.link.as_ref().map(|l| &l.events);
        self.reporter.checkpointing(report, &self.health, events);
        self.reporter.scheduling(report, &self.health);
        self.reporter.self_gc_deferred(report, &self.health, events);
        (self.reporter).self_checkpointing(report, &self.config.me, &self.health);
        // Probe the API often only while seeing an outage late would cost the node.
        if let Some(link) = &self.link {
            link.observer.set_at_stake(report.at_stake);
        } else if let Some(probe) = &self.anonymous {
            probe.set_at_stake(report.at_stake);
        }
        // Restart counts only of the active revisions that could be replaced.
        let node = &self.settings.node_name;
        (self.local)
            .watch_restarts((report.watch_restarts.iter()).map(|id| (id.clone(), id.static_pod_name(node))));
    }

    /// Writes, stops, starts and removes what the decision says (the executor).
    async fn apply(&self, decision: &Arc<Decision>, api: ApiState) -> Outcome {
        if decision.is_noop() {
            return Outcome::default();
        }
        info!(
            writes = decision.writes.len(),
            stops = decision.stops.len(),
            starts = decision.starts.len(),
            removes = decision.removes.len(),
            orphan_data = decision.remove_data.len(),
            self_gc = decision.self_gc,
            api = api.as_str(),
            "executing plan"
        );
        let reporting = Reporting {
            health: &self.health,
            events: self.link.as_ref().map(|l| &l.events),
            api,
            strategy: &self.settings.gc_strategy,
            parent_uids: &decision.report.parent_uids,
        };
        execute(&self.store, decision, &reporting).await
    }

    /// Saves the decision's state (the GC timers) in the journal when it changed, or when
    /// the last save failed.
    async fn save_state(&mut self, decision: &Decision) {
        if decision.state == self.state && !self.journal_behind {
            return;
        }
        self.state = decision.state.clone();
        if self.journal_in_place {
            // The unusable journal is kept for a human, never written over.
            match on_disk(&self.store, |s| s.set_journal_aside()).await {
                Ok(moved) => {
                    if let Some(to) = moved {
                        warn!(quarantined_to = %to.display(), "moved the unusable state journal to quarantine");
                    }
                    self.journal_in_place = false;
                }
                Err(e) => {
                    if !self.journal_behind {
                        warn!(error = %error_chain(&e), "cannot move the unusable state journal aside; not saving over it, GC timers go on in memory");
                    }
                    self.journal_behind = true;
                    self.health.write_error();
                    return;
                }
            }
        }
        let state = self.state.clone();
        match on_disk(&self.store, move |s| s.write_journal(&state)).await {
            Ok(_) => {
                if self.journal_behind {
                    info!("the state journal is saved again");
                }
                self.journal_behind = false;
            }
            Err(e) => {
                // Once per failure streak: the GC timers run on in memory meanwhile.
                if !self.journal_behind {
                    warn!(error = %error_chain(&e), "cannot save the state journal; GC timers go on in memory");
                }
                self.journal_behind = true;
                self.health.write_error();
            }
        }
    }

    /// The next deadline (the decision's, a scheduling recheck, the credentials'
    /// `handover_at`), the metrics, and Ready after the first pass.
    fn report(
        &mut self,
        decision: &Decision,
        handover_at: Option<Timestamp>,
        now: Timestamp,
        elapsed: Duration,
    ) {
        let report = &decision.report;
        // While the agent's own pod is gone, nothing but a timer says that its DaemonSet
        // stopped targeting this node (the DaemonSet is read, not watched).
        let recheck = report
            .scheduling
            .is_some()
            .then(|| now.saturating_add(equal_jitter(SCHEDULING_RECHECK)));
        self.next_deadline = (report.next_deadline.into_iter())
            .chain(recheck)
            .chain(handover_at)
            .min();
        self.reporter.metrics(&self.health, report, now, elapsed);
        let marks_unknown = decision.state.marks_unknown;
        if self.health.set_marks_unknown(marks_unknown) && !marks_unknown {
            info!("the known-good and rejected marks lost with the state journal count as known again");
        }
        self.health
            .record_cri_answers_too_large(self.local.cri_answers_too_large());
        if self.health.phase() == Phase::Starting {
            self.health.set_phase(Phase::Ready);
            info!(checkpoints = report.on_disk, "first pass complete: ready");
        }
    }

    /// What the loop does next: exit after self-GC, hand the lock over, or wait (a synced
    /// view first keeps the static copy's credentials), retrying soon after a failure and
    /// at once after a change.
    async fn conclude(
        &mut self,
        seen: &Seen,
        decision: &Decision,
        outcome: &Outcome,
        handover_at: Option<Timestamp>,
        now: Timestamp,
    ) -> PassResult {
        if outcome.self_gc_complete {
            return PassResult::SelfGcComplete;
        }
        if handover_at.is_some_and(|at| at <= now) {
            return PassResult::HandOver;
        }
        if seen.observation.api == ApiState::Synced
            && let Some(link) = &mut self.link
        {
            link.keep_credentials().await;
        }
        if outcome.failures > 0 || !seen.unreadable.is_empty() {
            PassResult::Failed
        } else if !decision.is_noop() {
            PassResult::Changed
        } else {
            PassResult::Settled
        }
    }
}

/// The checkpoints of files that could not be read, by their file names.
fn unreadable_checkpoints(unreadable: &[(PathBuf, String)]) -> BTreeSet<PodId> {
    unreadable
        .iter()
        .filter_map(|(path, _)| checkpoint_of(path))
        .collect()
}

/// The pod whose checkpoint a manifest file is, by its name.
fn checkpoint_of(path: &Path) -> Option<PodId> {
    PodId::from_manifest_file_name(path.file_name()?.to_str()?)
}
