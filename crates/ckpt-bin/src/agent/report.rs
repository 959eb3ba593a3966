//! Reporting a decision: log lines once per change (never every pass), refusal Events
//! (and the API server's reachability, which releases the Events queued during an outage),
//! and the health endpoint's metrics.

use std::collections::BTreeMap;
use std::time::Duration;

use ckpt_core::{
    ApiState, LocalView, Observation, PodId, Refusal, Report, SelfCheckpointing, SelfIdentity,
    SelfScheduling, Timestamp,
};
use tracing::{debug, info, warn};

use crate::events::{EventKind, EventSink};
use crate::health::Health;

/// What was last said, so each line is logged once per change.
#[derive(Debug, Default)]
pub(super) struct Reporter {
    api: Option<ApiState>,
    local_unknown: bool,
    refusals: BTreeMap<PodId, Refusal>,
    waiting_for_access: BTreeMap<PodId, String>,
    warnings: BTreeMap<PodId, Vec<String>>,
    scheduling: Option<SelfScheduling>,
    self_gc_deferred: Vec<PodId>,
    self_checkpointing: Option<SelfCheckpointing>,
}

impl Reporter {
    /// Logs a change of the API state, with the current problem.
    pub(super) fn observed(&mut self, observation: &Observation) {
        if self.api != Some(observation.api) {
            info!(
                api = observation.api.as_str(),
                error = observation.api_error.as_deref().unwrap_or(""),
                "API server view changed"
            );
            self.api = Some(observation.api);
        }
        let unknown = observation.local == LocalView::Unknown;
        if unknown && !self.local_unknown {
            warn!("the local runtime is unavailable: treating what runs here as unknown");
        }
        self.local_unknown = unknown;
    }

    /// Logs what kept parents from being checkpointed, and what their checkpoints leave
    /// out; a new refusal is also counted and published as an Event.
    pub(super) fn checkpointing(&mut self, report: &Report, health: &Health, events: Option<&EventSink>) {
        if let Some(events) = events {
            // Events queued during an outage go out once the view is synced again.
            events.api_state(report.api.unwrap_or(ApiState::Unreachable));
        }
        for (id, missing) in &report.loading {
            debug!(pod = %id, waiting = ?missing, "waiting for Secrets/ConfigMaps before checkpointing");
        }
        for (id, message) in &report.waiting_for_access {
            if self.waiting_for_access.get(id) != Some(message) {
                warn!(pod = %id, reason = %message, "not checkpointing until the agent may read it");
            }
        }
        for (id, refusal) in &report.refusals {
            if self.refusals.get(id) == Some(refusal) {
                continue;
            }
            warn!(pod = %id, reason = %refusal.message, "refusing to checkpoint");
            health.refused();
            if let Some(events) = events {
                let (uid, note) = (refusal.uid.as_deref(), refusal.message.clone());
                events.publish(ApiState::Synced, id, uid, EventKind::Refused, note);
            }
        }
        for (id, warnings) in &report.warnings {
            if self.warnings.get(id) != Some(warnings) {
                for warning in warnings {
                    info!(pod = %id, "{warning}");
                }
            }
        }
        for (known_good, newest, step) in &report.handoffs {
            use ckpt_core::revisions::Handoff;
            health.handoff(*step);
            let (kind, note) = match step {
                Handoff::Started => {
                    let note = format!(
                        "{newest} runs with content never proven here: the known-good checkpoint of {known_good} \
                         stepped aside for it; it must become Ready in time or that checkpoint returns"
                    );
                    info!(pod = %newest, known_good = %known_good, "handoff started: {note}");
                    (EventKind::HandoffStarted, note)
                }
                Handoff::Ready => {
                    let note = format!("{newest} became Ready: it keeps the node");
                    info!(pod = %newest, known_good = %known_good, "handoff done: {note}");
                    (EventKind::HandoffReady, note)
                }
                Handoff::Failed => {
                    let note = format!(
                        "{newest} did not become Ready in time: the known-good checkpoint of {known_good} is back, \
                         and stays while {newest} exists, unless it is seen Ready"
                    );
                    warn!(pod = %newest, known_good = %known_good, "handoff failed: {note}");
                    (EventKind::HandoffFailed, note)
                }
            };
            if let Some(events) = events {
                let api = report.api.unwrap_or(ApiState::Unreachable);
                let uid = report.parent_uids.get(newest).map(String::as_str);
                events.publish(api, newest, uid, kind, note);
            }
        }
        for set_aside in &report.set_aside {
            health.set_aside();
            let (revision, replacement) = (&set_aside.revision, &set_aside.replacement);
            let note = if set_aside.failed_alike {
                format!(
                    "the checkpoint of {revision}, run in place of {replacement}, restarted {} times too: the \
                     restarts are the environment's (etcd without quorum, say), so the checkpoint of \
                     {replacement} runs again, still known-good, and nothing more is set aside until the API \
                     server is back",
                    set_aside.restarts
                )
            } else {
                format!(
                    "the checkpoint of {revision} restarted {} times while active with the API server \
                     unreachable: its known-good mark is suspended, and the known-good checkpoint of \
                     {replacement} runs instead, on trial: if it brings the API server back, the mark \
                     goes; if it crash-loops too, {revision} runs again",
                    set_aside.restarts
                )
            };
            warn!(pod = %revision, known_good = %replacement, restarts = set_aside.restarts, "revision crash-loops: {note}");
            if let Some(events) = events {
                let api = report.api.unwrap_or(ApiState::Unreachable);
                let uid = report.parent_uids.get(revision).map(String::as_str);
                events.publish(api, revision, uid, EventKind::SetAside, note);
            }
        }
        // Only a synced pass sanitizes: in the others, what was said still holds.
        if report.api == Some(ApiState::Synced) {
            self.refusals.clone_from(&report.refusals);
            self.waiting_for_access.clone_from(&report.waiting_for_access);
            self.warnings.clone_from(&report.warnings);
        }
    }

    /// Says at start and once per change whether the agent's own pod is checkpointed (a
    /// warning while it is not: after a reboot nothing would restart the agent), and sets
    /// the metric; a pass that cannot tell keeps what was said.
    pub(super) fn self_checkpointing(&mut self, report: &Report, me: &SelfIdentity, health: &Health) {
        let Some(now) = report.self_checkpointing else {
            return;
        };
        health.record_self_checkpointed(now == SelfCheckpointing::Checkpointed);
        if self.self_checkpointing.replace(now) == Some(now) {
            return;
        }
        match now.problem(me) {
            Some(problem) => warn!(
                namespace = %me.namespace,
                "the agent's own pod is not checkpointed ({problem}): after a reboot no static copy \
                 restarts the agent, and no checkpoint of this node is activated"
            ),
            None => info!("the agent's own pod is checkpointed"),
        }
    }

    /// Says once per change which checkpoints hold a due self-GC back (each serves a
    /// DaemonSet that still targets the node), with an Event on each newly held one; the
    /// count is a metric (and an alert).
    pub(super) fn self_gc_deferred(&mut self, report: &Report, health: &Health, events: Option<&EventSink>) {
        // Only a synced pass decides it; the others keep what was said.
        if report.api != Some(ApiState::Synced) {
            return;
        }
        health.record_self_gc_deferred(report.self_gc_deferred.len());
        if self.self_gc_deferred == report.self_gc_deferred {
            return;
        }
        if report.self_gc_deferred.is_empty() {
            info!("no checkpoint holds self-GC back any more");
        }
        for id in &report.self_gc_deferred {
            if self.self_gc_deferred.contains(id) {
                continue;
            }
            let note = format!(
                "the agent no longer runs on this node, but the checkpoint of {id} serves a DaemonSet that \
                 still targets it: it and the agent stay until its pod runs here, its DaemonSet stops \
                 targeting the node, `drain --force`, or the Node is annotated {}=true",
                ckpt_core::ANNOTATION_DECOMMISSION
            );
            warn!(pod = %id, "self-GC held back: {note}");
            if let Some(events) = events {
                let uid = report.parent_uids.get(id).map(String::as_str);
                events.publish(ApiState::Synced, id, uid, EventKind::SelfGcDeferred, note);
            }
        }
        self.self_gc_deferred.clone_from(&report.self_gc_deferred);
    }

    /// Says once per change why the agent's own pod is absent and what that means; an
    /// unknown scheduling once per streak, however its reason changes (one timeout after
    /// another says nothing new), and it is a metric too.
    pub(super) fn scheduling(&mut self, report: &Report, health: &Health) {
        health.record_self_scheduling(report.scheduling.as_ref().map(SelfScheduling::as_str));
        let same = match (&self.scheduling, &report.scheduling) {
            (Some(SelfScheduling::Unknown(_)), Some(SelfScheduling::Unknown(_))) => true,
            (before, now) => before == now,
        };
        if same {
            return;
        }
        match &report.scheduling {
            Some(SelfScheduling::Targeted) => info!(
                "the agent's own pod is absent but its DaemonSet still targets this node \
                 (a rollout, an eviction or a controller outage): keeping every checkpoint"
            ),
            Some(SelfScheduling::Deleted) => warn!(
                "the agent's DaemonSet is deleted: every checkpoint goes once the grace period has passed \
                 since this was first read, unless a DaemonSet of the same name takes its place"
            ),
            Some(SelfScheduling::Descheduled(why)) => warn!(
                %why,
                "the agent is descheduled from this node: self-GC once the grace period has passed since \
                 this was first read, unless the DaemonSet targets the node again"
            ),
            Some(SelfScheduling::Unknown(why)) => warn!(
                %why,
                "cannot tell whether the agent's DaemonSet still targets this node: self-GC is held back \
                 and every checkpoint kept until a read succeeds"
            ),
            None => {}
        }
        self.scheduling.clone_from(&report.scheduling);
    }

    /// The pass's metrics.
    pub(super) fn metrics(&self, health: &Health, report: &Report, now: Timestamp, elapsed: Duration) {
        let api = report.api.unwrap_or(ApiState::Unreachable);
        let synced_now = (api == ApiState::Synced).then_some(now);
        health.record_views(api.as_str(), !self.local_unknown, synced_now);
        health.record_pass(elapsed, report.counts_by_state());
    }
}
